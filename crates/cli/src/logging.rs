//! Logs fit for a pod: plain text without colour unless the output is a
//! terminal, or one JSON object a line; the level from `IRONCLAIM_LOG`
//! (`RUST_LOG` is read when it is unset).

use std::io::IsTerminal;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The log filter: `IRONCLAIM_LOG`, else `RUST_LOG`, else `default`.
pub fn filter(default: &str) -> tracing_subscriber::EnvFilter {
    let from = |var: &str| std::env::var(var).ok().filter(|v| !v.trim().is_empty());
    match from("IRONCLAIM_LOG").or_else(|| from("RUST_LOG")) {
        Some(spec) => tracing_subscriber::EnvFilter::try_new(&spec).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default)),
        None => tracing_subscriber::EnvFilter::new(default),
    }
}

/// Installs the process's logger (to standard error). A second call is a
/// no-op.
pub fn init(format: LogFormat, default: &str) {
    let builder = tracing_subscriber::fmt().with_env_filter(filter(default)).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(false).try_init(),
    };
}
