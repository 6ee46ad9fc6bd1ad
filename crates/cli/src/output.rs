//! What every command prints on stdout, and how: `-o/--output
//! table|json|yaml` spelled one way by all of them, JSON and YAML made from
//! the same value, and a reader that stops reading (`| head`) ending the
//! command quietly instead of with a panic.

use std::fmt;
use std::io::{ErrorKind, Write};

use anyhow::anyhow;
use serde::Serialize;

use crate::exit::Failure;

/// How a command prints what it found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// A table that fits the terminal.
    #[default]
    Table,
    /// One JSON document.
    Json,
    /// The same document as YAML.
    Yaml,
}

/// `-o/--output`, for a command to flatten into its arguments.
#[derive(clap::Args, Clone, Copy, Debug, Default)]
pub struct OutputArg {
    /// How to print: table, json or yaml (json and yaml are the same document).
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
}

/// Prints `value` as `output` asks: `table` renders the table (a string
/// ending in a newline, or empty); JSON and YAML are `value` serialized.
///
/// # Errors
/// [`Failure::OutputClosed`] when nobody reads stdout any more; the world
/// when stdout cannot be written or the value cannot be serialized.
pub fn print<T: Serialize + ?Sized>(output: Output, value: &T, table: impl FnOnce(&T) -> String) -> Result<(), Failure> {
    let text = match output {
        Output::Table => table(value),
        Output::Json => serde_json::to_string_pretty(value)
            .map(|mut s| {
                s.push('\n');
                s
            })
            .map_err(|e| Failure::world(anyhow!("cannot write the output as JSON: {e}")))?,
        Output::Yaml => serde_saphyr::to_string(&value).map_err(|e| Failure::world(anyhow!("cannot write the output as YAML: {e}")))?,
    };
    write(&text)
}

/// Writes `text` to stdout as it is.
///
/// # Errors
/// [`Failure::OutputClosed`] when the reader has gone (a broken pipe);
/// the world on any other error of stdout.
pub fn write(text: &str) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).map_err(closed_or_world)
}

/// Writes one line to stdout: what `println!` does, without its panic on a
/// closed stdout. Used through [`outln!`](crate::outln).
pub fn write_line(args: fmt::Arguments<'_>) -> Result<(), Failure> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(args).and_then(|()| out.write_all(b"\n")).and_then(|()| out.flush()).map_err(closed_or_world)
}

fn closed_or_world(err: std::io::Error) -> Failure {
    if err.kind() == ErrorKind::BrokenPipe { Failure::OutputClosed } else { Failure::world(anyhow!("cannot write to stdout: {err}")) }
}

/// `println!` for command output: a `Result<(), Failure>` instead of a
/// panic when stdout is closed.
#[macro_export]
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}
