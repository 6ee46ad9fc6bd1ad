//! `ironclaim simulate`: replays a day on an embedded rack, the openb
//! production trace, or your own trace against every power policy, and
//! prints the comparison (table or JSON) and an HTML report.

use crate::duration::whole_seconds;
use crate::exit::Failure;
use crate::output::{self, OutputArg};
use crate::render;
use anyhow::{Context, anyhow};
use clap::ValueEnum;
use ironclaim_sim::compare::compare_sweep;
use ironclaim_sim::packing::compare_packing;
use ironclaim_sim::pareto::{Axis, Knob};
use ironclaim_sim::sample::{AutoSample, auto_sample, stratified_sample};
use ironclaim_sim::trace::{is_yaml, read_pod_list, read_servers, workload_from_rows};
use ironclaim_sim::{Faults, PolicyKind, PolicySettings, Scoring, SimConfig, Workload, embedded};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum ScoringArg {
    /// Prefer the emptiest node (kube-scheduler's default).
    LeastAllocated,
    /// Prefer the fullest node (bin packing).
    MostAllocated,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Pods to replay: an openb_pod_list_*.csv, or the user CSV or YAML
    /// format (docs/simulate.md). Without it: the embedded day.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Servers: an openb_node_list_*.csv, or the user CSV or YAML format.
    #[arg(long, value_name = "FILE")]
    servers: Option<PathBuf>,
    /// Replay on a seeded stratified sample of N servers that keeps the
    /// hardware mix; `auto` picks the smallest sample whose capacity covers
    /// the trace's peak.
    #[arg(long, value_name = "N|auto")]
    servers_sample: Option<String>,
    /// The seed that drives the whole run.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Days of the embedded workload to run in a row, each drawn from a
    /// seed of its own: from the second day on, the warm floors have the
    /// days before as their daily profile.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=366))]
    days: u32,
    /// Policies to compare, comma-separated.
    #[arg(long, value_name = "POLICY,...", value_delimiter = ',', default_value = "always-on,reactive,warm-spares,ironclaim")]
    policies: Vec<String>,
    #[command(flatten)]
    output: OutputArg,
    /// Write a self-contained HTML report with plots to this file.
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// How kube-scheduler scores nodes (the other one is run too for the
    /// ironclaim policy, to show the difference).
    #[arg(long, value_enum, default_value = "least-allocated")]
    scoring: ScoringArg,
    /// Simulated time: a duration (`6h`, `48h`, `90m`) or a number of
    /// seconds. Default: the whole trace.
    #[arg(long, value_name = "DURATION", value_parser = crate::duration::go_or_seconds)]
    duration: Option<Duration>,
    /// Probability that a BMC refuses or drops a power-on.
    #[arg(long, default_value_t = Faults::default().bmc_error_probability)]
    bmc_error_probability: f64,
    /// Probability that a boot fails.
    #[arg(long, default_value_t = Faults::default().boot_failure_probability)]
    boot_failure_probability: f64,
    /// Probability that a booted server never joins.
    #[arg(long, default_value_t = Faults::default().never_joins_probability)]
    never_joins_probability: f64,
    /// Probability that a GPU server fails its driver gate.
    #[arg(long, default_value_t = Faults::default().gpu_gate_failure_probability)]
    gpu_gate_failure_probability: f64,
    /// Probability that a boot lands in the slow tail.
    #[arg(long, default_value_t = Faults::default().slow_boot_probability)]
    slow_boot_probability: f64,
    /// How much slower a slow boot is.
    #[arg(long, default_value_t = Faults::default().slow_boot_factor)]
    slow_boot_factor: f64,
    /// Turn every fault off.
    #[arg(long)]
    no_faults: bool,
    /// With nothing changing, scale-down looks again at the next idle
    /// threshold, and at the latest after this long: a duration or a
    /// number of seconds.
    #[arg(long, value_name = "DURATION", default_value = QUIET_MAX, value_parser = crate::duration::go_or_seconds)]
    quiet_max: Duration,
    /// A scale-up batch closes after this long without a new pod (a
    /// duration or a number of seconds)...
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::duration::go_or_seconds)]
    batch_idle: Duration,
    /// ...or after this long in all.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration::go_or_seconds)]
    batch_max: Duration,
    /// Idle timeout of the reactive and warm-spares policies: a duration
    /// (`10m`) or a number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = crate::duration::go_or_seconds)]
    idle_timeout: Duration,
    /// Idle servers the warm-spares policy keeps on.
    #[arg(long, default_value_t = 2)]
    warm_spares: u32,
    /// Past days the ironclaim policy's warm floors learn their daily
    /// profile from, where its pools set no adaptive floor of their own
    /// (0: none, only the recent rate).
    #[arg(long, value_name = "DAYS", default_value_t = 7)]
    history_days: u32,
    /// The ironclaim policy's daily profile tells weekdays from weekend
    /// days (a ServerPool's `warmSpares.adaptive.weekly`).
    #[arg(long)]
    weekly_profile: bool,
    /// The ironclaim policy's adaptive floor, where its pools set none:
    /// standard deviations of margin above the demand expected during one
    /// cold boot (a ServerPool's `warmSpares.adaptive.z`).
    #[arg(long, value_name = "Z", default_value_t = PolicySettings::default().floor_z)]
    floor_z: f64,
    /// ...and how far back its arrivals count (`warmSpares.adaptive.window`):
    /// a duration or a number of seconds.
    #[arg(long, value_name = "DURATION", default_value = RATE_WINDOW, value_parser = crate::duration::go_or_seconds)]
    rate_window: Duration,
    /// Who made the pods that have no owner in the trace: `none` (bare
    /// pods: no drain evicts them, so a node running one is never
    /// consolidated) or `replicaset` (a drain may evict them; their
    /// controller makes each again, a new pod that waits again).
    #[arg(long, value_name = "none|replicaset", default_value = "none", value_parser = ["none", "replicaset"])]
    owners: String,
    /// Run the ironclaim policy once more for each value of a knob and
    /// print its frontier of energy against deadline misses and p99
    /// pending: `z=0,0.5,1,2` or `window=1h,4h,8h`. Twice for a grid of both.
    #[arg(long, value_name = "KNOB=V,...", value_parser = sweep_axis)]
    sweep: Vec<Axis>,
    /// At most N power changes per minute in each group: `fleet=N`,
    /// `pool=N`, or `LABEL=N` per value of a server label (a rack, a PDU).
    /// Repeat for several; every policy keeps them.
    #[arg(long, value_name = "SCOPE=N", value_parser = transition_rate)]
    transition_rate: Vec<ironclaim_core::transitions::TransitionRate>,
    /// A server powered off this many times in the last 24 hours stays on.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_cycles_per_day: Option<u32>,
}

/// `--transition-rate`, parsed as the core reads it.
pub fn transition_rate(text: &str) -> Result<ironclaim_core::transitions::TransitionRate, String> {
    ironclaim_core::transitions::parse_rate(text)
}

/// `--sweep`: a knob and its values.
pub fn sweep_axis(text: &str) -> Result<Axis, String> {
    let (knob, values) = text.split_once('=').ok_or_else(|| format!("`{text}` is not KNOB=V,...: try z=0,1,2 or window=1h,4h"))?;
    let knob = match knob.trim() {
        "z" => Knob::Z,
        "window" => Knob::Window,
        other => return Err(format!("unknown knob `{other}` (choose from z, window)")),
    };
    let mut out = Vec::new();
    for v in values.split(',').map(str::trim) {
        let value = match knob {
            Knob::Z => {
                v.parse::<f64>().ok().filter(|z| z.is_finite() && *z >= 0.0).ok_or_else(|| format!("z takes numbers of 0 or more, got `{v}`"))?
            }
            Knob::Window => {
                let d = crate::duration::go_or_seconds(v)?;
                if d < Duration::from_secs(60) {
                    return Err(format!("a window is at least 1m, got `{v}`"));
                }
                whole_seconds(d) as f64
            }
        };
        if !out.contains(&value) {
            out.push(value);
        }
    }
    Ok(Axis { knob, values: out })
}

/// The most runs a sweep may ask for.
const MAX_SWEEP_RUNS: usize = 64;

/// `--rate-window`'s default: a ServerPool's (a test keeps the two equal).
const RATE_WINDOW: &str = "4h";

/// `--quiet-max`'s default: the simulator's (a test keeps the two equal).
const QUIET_MAX: &str = "1h";

fn probability(name: &str, p: f64) -> anyhow::Result<f64> {
    if (0.0..=1.0).contains(&p) { Ok(p) } else { Err(anyhow!("--{name} must be between 0 and 1, got {p}")) }
}

fn config(args: &Args) -> anyhow::Result<SimConfig> {
    let mut cfg = SimConfig { seed: args.seed, ..Default::default() };
    cfg.scoring = match args.scoring {
        ScoringArg::LeastAllocated => Scoring::LeastAllocated,
        ScoringArg::MostAllocated => Scoring::MostAllocated,
    };
    cfg.faults = if args.no_faults {
        Faults::none()
    } else {
        Faults {
            bmc_error_probability: probability("bmc-error-probability", args.bmc_error_probability)?,
            boot_failure_probability: probability("boot-failure-probability", args.boot_failure_probability)?,
            never_joins_probability: probability("never-joins-probability", args.never_joins_probability)?,
            gpu_gate_failure_probability: probability("gpu-gate-failure-probability", args.gpu_gate_failure_probability)?,
            slow_boot_probability: probability("slow-boot-probability", args.slow_boot_probability)?,
            slow_boot_factor: if args.slow_boot_factor >= 1.0 && args.slow_boot_factor <= 100.0 {
                args.slow_boot_factor
            } else {
                return Err(anyhow!("--slow-boot-factor must be between 1 and 100"));
            },
            ..Faults::default()
        }
    };
    if args.quiet_max.is_zero() {
        return Err(anyhow!("--quiet-max must be longer than 0s"));
    }
    cfg.quiet_max_s = whole_seconds(args.quiet_max);
    if args.batch_max < args.batch_idle {
        return Err(anyhow!(
            "--batch-max ({}) must be at least --batch-idle ({})",
            render::duration(whole_seconds(args.batch_max)),
            render::duration(whole_seconds(args.batch_idle))
        ));
    }
    cfg.batch_idle_s = whole_seconds(args.batch_idle);
    cfg.batch_max_s = whole_seconds(args.batch_max);
    cfg.duration_s = args.duration.map(whole_seconds);
    cfg.policy.idle_timeout_s = whole_seconds(args.idle_timeout);
    cfg.policy.warm_spares = args.warm_spares;
    cfg.policy.history_days = args.history_days;
    cfg.policy.weekly = args.weekly_profile;
    if !args.floor_z.is_finite() || args.floor_z < 0.0 {
        return Err(anyhow!("--floor-z must be a number of 0 or more, got {}", args.floor_z));
    }
    cfg.policy.floor_z = args.floor_z;
    if args.rate_window < Duration::from_secs(60) {
        return Err(anyhow!("--rate-window must be at least 1m"));
    }
    cfg.policy.rate_window_s = whole_seconds(args.rate_window);
    cfg.transition_limits.rates = args.transition_rate.clone();
    cfg.transition_limits.max_cycles_per_day = args.max_cycles_per_day;
    Ok(cfg)
}

/// The sweep's axes, each knob once, within [`MAX_SWEEP_RUNS`].
fn sweep(args: &Args) -> anyhow::Result<Vec<Axis>> {
    for (i, a) in args.sweep.iter().enumerate() {
        if args.sweep[..i].iter().any(|b| b.knob == a.knob) {
            return Err(anyhow!("--sweep names {} twice: give its values once, comma-separated", a.knob.name()));
        }
    }
    let runs: usize = args.sweep.iter().map(|a| a.values.len()).product();
    if !args.sweep.is_empty() && runs > MAX_SWEEP_RUNS {
        return Err(anyhow!("--sweep asks for {runs} runs; at most {MAX_SWEEP_RUNS}"));
    }
    Ok(args.sweep.clone())
}

fn policies(args: &Args) -> anyhow::Result<Vec<PolicyKind>> {
    parse_policies(&args.policies)
}

/// Policy names, as `--policies` takes them, without repeats.
pub fn parse_policies(names: &[String]) -> anyhow::Result<Vec<PolicyKind>> {
    let mut out = Vec::new();
    for p in names {
        let kind = PolicyKind::parse(p).ok_or_else(|| anyhow!("unknown policy `{p}` (choose from always-on, reactive, warm-spares, ironclaim)"))?;
        if !out.contains(&kind) {
            out.push(kind);
        }
    }
    if out.is_empty() {
        return Err(anyhow!("--policies names no policy"));
    }
    Ok(out)
}

/// The workload to replay, and whether its pods carry times (a static
/// trace is packed in arrival order instead, see `ironclaim_sim::packing`).
struct Loaded {
    workload: Workload,
    timed: bool,
}

fn workload(args: &Args) -> anyhow::Result<Loaded> {
    let mut timed = true;
    if args.days > 1 && args.trace.is_some() {
        return Err(anyhow!("--days repeats the embedded workload; a trace replays its own days"));
    }
    let mut w = match (&args.trace, &args.servers) {
        (None, None) => embedded::days(args.seed, args.days),
        (Some(trace), servers) => {
            let list = read_pod_list(trace).context("--trace takes the pods to replay")?;
            timed = list.timed;
            let pods = list.rows;
            // Only the YAML user document holds servers beside its pods; a
            // pod CSV read as servers would make a server of every pod.
            let server_path = match servers {
                Some(path) => path,
                None if is_yaml(trace) => trace,
                None => {
                    return Err(anyhow!(
                        "--trace needs --servers FILE (the node list the pods run on, such as openb_node_list_all_node.csv); \
                         only a YAML trace can list its servers itself"
                    ));
                }
            };
            let servers = read_servers(server_path).with_context(|| {
                if args.servers.is_none() {
                    "--trace without --servers needs a YAML trace that lists servers".to_string()
                } else {
                    "--servers takes the node list".to_string()
                }
            })?;
            let name = trace.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            workload_from_rows(&name, &servers, &pods)
        }
        (None, Some(_)) => return Err(anyhow!("--servers needs --trace (the pods to replay)")),
    };
    if let Some(n) = &args.servers_sample {
        if n == "auto" {
            let sample = auto_sample(&w, 1.0, args.seed);
            eprintln!("{}", describe_auto_sample(&sample));
            w.servers = sample.servers;
        } else {
            let size =
                n.parse::<usize>().ok().filter(|&n| n > 0).ok_or_else(|| anyhow!("--servers-sample takes a positive number or `auto`, got `{n}`"))?;
            w.servers = stratified_sample(&w.servers, size, args.seed);
        }
        w.name = format!("{} on {}", w.name, render::count(w.servers.len() as u64, "sampled server", "sampled servers"));
    }
    if args.owners == "replicaset" {
        w.give_owners();
    }
    Ok(Loaded { workload: w, timed })
}

/// A static trace: every policy under both scorings, pods packed in the
/// file's order.
fn run_static(args: &Args, cfg: &SimConfig, kinds: &[PolicyKind], w: &Workload) -> Result<(), Failure> {
    if args.report.is_some() || args.duration.is_some() {
        return Err(Failure::bad_input(anyhow!(
            "--report and --duration belong to the timed replay; {} has no creation or deletion times (a static trace, packed in arrival order)",
            w.name
        )));
    }
    eprintln!(
        "packing the static trace {} ({}, {}) in arrival order: warm_spares={}",
        w.name,
        render::count(w.servers.len() as u64, "server", "servers"),
        render::count(w.pods.len() as u64, "pod", "pods"),
        cfg.policy.warm_spares
    );
    let report = compare_packing(w, kinds, cfg.scoring, cfg.policy.warm_spares);
    output::print(args.output.output, &report, |r| r.to_table())
}

/// One line on how the auto sample was sized: the stratified part, the
/// servers the constraint classes added, the classes even the whole
/// inventory cannot carry at their peak.
fn describe_auto_sample(s: &AutoSample) -> String {
    let mut line = format!(
        "servers-sample auto: {} ({} stratified for the aggregate peak",
        render::count(s.servers.len() as u64, "server", "servers"),
        s.stratified.min(s.servers.len())
    );
    for (class, n) in &s.added {
        line.push_str(&format!(", +{n} {class}"));
    }
    line.push_str(&format!("; {} constraint classes", s.classes.len()));
    if !s.short.is_empty() {
        let names: Vec<String> = s.short.iter().map(|c| c.hardware.join("|")).collect();
        line.push_str(&format!("; the inventory cannot carry the peak of the pods that fit only {}", names.join(", ")));
    }
    line.push(')');
    line
}

pub fn run(args: Args) -> Result<(), Failure> {
    let cfg = config(&args).map_err(Failure::bad_input)?;
    let kinds = policies(&args).map_err(Failure::bad_input)?;
    let axes = sweep(&args).map_err(Failure::bad_input)?;
    let Loaded { workload: w, timed } = workload(&args).map_err(Failure::bad_input)?;
    if !timed && !axes.is_empty() {
        return Err(Failure::bad_input(anyhow!("--sweep belongs to the timed replay; {} is a static trace, packed in arrival order", w.name)));
    }
    if !timed {
        return run_static(&args, &cfg, &kinds, &w);
    }
    eprintln!(
        "simulating {} ({}, {}): seed={} scoring={} quiet_max_s={} batch_idle_s={} batch_max_s={}",
        w.name,
        render::count(w.servers.len() as u64, "server", "servers"),
        render::count(w.pods.len() as u64, "pod", "pods"),
        cfg.seed,
        cfg.scoring,
        cfg.quiet_max_s,
        cfg.batch_idle_s,
        cfg.batch_max_s
    );
    eprintln!("faults: {} quarantine_after_failures={}", cfg.faults, cfg.quarantine_after_failures);
    // The report replays the rack: each server's state at each sample.
    let mut cfg = cfg;
    cfg.record_states = args.report.is_some();
    // One bar per run, as the runs go on side by side.
    let bars = std::io::stderr().is_terminal().then(indicatif::MultiProgress::new);
    let style = indicatif::ProgressStyle::with_template("{prefix:>24} [{bar:40}] {percent:>3}% {elapsed}")
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
    let shown: std::sync::Mutex<std::collections::BTreeMap<String, indicatif::ProgressBar>> = Default::default();
    let report = compare_sweep(&w, &cfg, &kinds, &axes, &|label, fraction| {
        let Some(bars) = &bars else { return };
        let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
        let bar = shown.entry(label.to_string()).or_insert_with(|| {
            let bar = bars.add(indicatif::ProgressBar::new(1000).with_style(style.clone()));
            bar.set_prefix(label.to_string());
            bar
        });
        bar.set_position((fraction * 1000.0) as u64);
    });
    if let Some(bars) = &bars {
        let _ = bars.clear();
    }
    if let Some(path) = &args.report {
        std::fs::write(path, ironclaim_sim::html::render(&report))
            .with_context(|| format!("cannot write the report to {}", path.display()))
            .map_err(Failure::world)?;
        eprintln!("report written to {}", path.display());
    }
    output::print(args.output.output, &report, |r| r.to_table(render::width()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct TestCli {
        #[command(flatten)]
        args: Args,
    }

    fn args(argv: &[&str]) -> Args {
        let mut full = vec!["simulate"];
        full.extend_from_slice(argv);
        TestCli::try_parse_from(full).expect("arguments parse").args
    }

    fn temp_file(name: &str, text: &str) -> (ironclaim_testenv::TempDir, PathBuf) {
        let dir = ironclaim_testenv::TempDir::new("simulate-test");
        let path = dir.join(name);
        std::fs::write(&path, text).expect("temp file");
        (dir, path)
    }

    #[test]
    fn a_bad_trace_row_is_bad_input_naming_file_line_and_column() {
        let (_pods_dir, pods) = temp_file("bad-pods.csv", "name,cpu_milli,memory_mib,creation_time\nok,1000,1024,0\nbad,1000,lots,5\n");
        let (_servers_dir, servers) = temp_file("servers.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,0,\n");
        let a = args(&["--trace", pods.to_str().unwrap(), "--servers", servers.to_str().unwrap()]);
        match run(a) {
            Err(Failure::BadInput(e)) => {
                let text = format!("{e:#}");
                assert!(text.contains("bad-pods.csv:3:3"), "{text}");
            }
            other => panic!("expected bad input, got {other:?}"),
        }
    }

    #[test]
    fn a_csv_trace_without_servers_is_bad_input_naming_the_flag() {
        let (_pods_dir, pods) = temp_file("pods-only.csv", "name,cpu_milli,memory_mib,creation_time\nok,1000,1024,0\n");
        match run(args(&["--trace", pods.to_str().unwrap()])) {
            Err(Failure::BadInput(e)) => {
                let text = format!("{e:#}");
                assert!(text.contains("--trace needs --servers FILE"), "{text}");
            }
            other => panic!("expected bad input, got {other:?}"),
        }
    }

    #[test]
    fn a_pod_list_given_as_servers_is_bad_input_naming_file_and_column() {
        let (_pods_dir, pods) = temp_file("pods.csv", "name,cpu_milli,memory_mib,creation_time\nok,1000,1024,0\n");
        match run(args(&["--trace", pods.to_str().unwrap(), "--servers", pods.to_str().unwrap()])) {
            Err(Failure::BadInput(e)) => {
                let text = format!("{e:#}");
                assert!(text.contains("pods.csv") && text.contains("`creation_time`") && text.contains("not a server list"), "{text}");
            }
            other => panic!("expected bad input, got {other:?}"),
        }
    }

    #[test]
    fn an_unreadable_trace_and_an_unknown_policy_are_bad_input() {
        let a = args(&["--trace", "/nonexistent/pods.csv", "--servers", "/nonexistent/nodes.csv"]);
        assert!(matches!(run(a), Err(Failure::BadInput(_))));
        let a = args(&["--policies", "always-on,sometimes"]);
        assert!(matches!(run(a), Err(Failure::BadInput(_))));
        let a = args(&["--bmc-error-probability", "1.5"]);
        assert!(matches!(run(a), Err(Failure::BadInput(_))));
    }

    /// 40 eight-GPU G2 hosts, 20 CPU servers and 2 one-GPU A10 hosts; two
    /// big pods fit anywhere with GPUs, two small ones need an A10 each.
    fn a10_trace() -> (ironclaim_testenv::TempDir, ironclaim_testenv::TempDir, PathBuf, PathBuf) {
        let (servers_dir, servers) = temp_file(
            "a10-servers.csv",
            "name,count,cpu_milli,memory_mib,gpu,model\ng2,40,96000,393216,8,G2\ncpu,20,32000,131072,0,\na10,2,32000,131072,1,A10\n",
        );
        let (pods_dir, pods) = temp_file(
            "a10-pods.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_spec,arrival_s\nbig-0,90000,65536,8,,0\nbig-1,90000,65536,8,,0\n\
             a10-0,4000,8192,1,A10,10\na10-1,4000,8192,1,A10,10\n",
        );
        (pods_dir, servers_dir, pods, servers)
    }

    #[test]
    fn the_auto_sample_holds_the_gpu_model_its_pods_require() {
        let (_pods_dir, _servers_dir, pods, servers) = a10_trace();
        for seed in ["1", "2", "3"] {
            let a = args(&["--trace", pods.to_str().unwrap(), "--servers", servers.to_str().unwrap(), "--servers-sample", "auto", "--seed", seed]);
            let w = workload(&a).unwrap().workload;
            let a10 = w.servers.iter().filter(|s| s.name.starts_with("a10")).count();
            assert_eq!(a10, 2, "seed {seed}: both A10 pods need an A10 host of their own; sample: {}", w.name);
            let prep = ironclaim_sim::Prepared::new(&w, None);
            assert!(prep.unplaceable.iter().all(Option::is_none), "seed {seed}: {:?}", prep.unplaceable);
        }
    }

    #[test]
    fn a_trace_without_times_is_packed_and_one_with_a_partial_time_column_is_bad_input() {
        let (_servers_dir, servers) = temp_file("static-servers.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\n");
        let (_pods_dir, pods) = temp_file("static-pods.csv", "name,cpu_milli,memory_mib,num_gpu,gpu_milli\na,1000,1024,1,1000\nb,1000,1024,1,500\n");
        let a = args(&["--trace", pods.to_str().unwrap(), "--servers", servers.to_str().unwrap()]);
        let loaded = workload(&a).unwrap();
        assert!(!loaded.timed);
        assert_eq!(loaded.workload.pods.len(), 2);
        assert!(run(a).is_ok());
        let a = args(&["--trace", pods.to_str().unwrap(), "--servers", servers.to_str().unwrap(), "--report", "/tmp/x.html"]);
        assert!(matches!(run(a), Err(Failure::BadInput(_))));
        let (_partial_dir, partial) = temp_file("partial.csv", "name,cpu_milli,memory_mib,creation_time\na,1000,1024,0\nb,1000,1024,\n");
        match run(args(&["--trace", partial.to_str().unwrap(), "--servers", servers.to_str().unwrap()])) {
            Err(Failure::BadInput(e)) => {
                let text = format!("{e:#}");
                assert!(text.contains("partial.csv:3:4: creation_time is empty"), "{text}");
            }
            other => panic!("expected bad input, got {other:?}"),
        }
    }

    #[test]
    fn durations_are_go_durations_or_seconds_in_whole_seconds() {
        let cfg = config(&args(&["--duration", "1h30m", "--idle-timeout", "90", "--batch-idle", "500ms", "--batch-max", "2s"])).unwrap();
        assert_eq!(cfg.duration_s, Some(5400));
        assert_eq!(cfg.policy.idle_timeout_s, 90);
        assert_eq!((cfg.batch_idle_s, cfg.batch_max_s), (1, 2));
        for bad in [["--duration", "soon"], ["--idle-timeout", "5w"], ["--quiet-max", "2d"]] {
            let mut full = vec!["simulate"];
            full.extend_from_slice(&bad);
            let err = TestCli::try_parse_from(full).err().expect("refused");
            assert!(err.to_string().contains(bad[0]), "{err}");
        }
    }

    #[test]
    fn the_quiet_max_default_is_the_simulators() {
        assert_eq!(config(&args(&[])).unwrap().quiet_max_s, SimConfig::default().quiet_max_s);
        assert_eq!(config(&args(&[])).unwrap().policy, PolicySettings::default(), "and so are the floor's knobs");
        assert_eq!(PolicySettings::default().rate_window_s, ironclaim_core::AdaptiveFloor::DEFAULT_WINDOW_S, "a ServerPool's window");
    }

    #[test]
    fn a_sweep_names_its_knobs_and_values_or_is_bad_input() {
        assert_eq!(sweep_axis("z=0, 1,1,2.5"), Ok(Axis { knob: Knob::Z, values: vec![0.0, 1.0, 2.5] }));
        assert_eq!(sweep_axis("window=1h,90m,7200"), Ok(Axis { knob: Knob::Window, values: vec![3600.0, 5400.0, 7200.0] }));
        for (bad, says) in
            [("z", "KNOB=V"), ("speed=1", "unknown knob `speed`"), ("z=-1", "got `-1`"), ("z=NaN", "got `NaN`"), ("window=30s", "at least 1m")]
        {
            let e = sweep_axis(bad).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
        let twice = args(&["--sweep", "z=0,1", "--sweep", "z=2"]);
        assert!(format!("{:#}", sweep(&twice).unwrap_err()).contains("names z twice"));
        let many = args(&["--sweep", "z=0,1,2,3,4,5,6,7,8", "--sweep", "window=1h,2h,3h,4h,5h,6h,7h,8h"]);
        assert!(format!("{:#}", sweep(&many).unwrap_err()).contains("72 runs; at most 64"));
        for bad in [&["--floor-z=-0.5"][..], &["--rate-window", "10s"]] {
            assert!(config(&args(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_sweep_runs_ironclaim_once_per_point_and_marks_its_frontier() {
        let a = args(&["--duration", "2h", "--policies", "reactive", "--sweep", "z=0,3", "--sweep", "window=1h,12h"]);
        let cfg = config(&a).unwrap();
        let w = embedded::default_day(1);
        let report = compare_sweep(&w, &cfg, &[PolicyKind::Reactive], &sweep(&a).unwrap(), &|_, _| {});
        let sweep = report.sweep.as_ref().expect("a sweep was asked for");
        let labels: Vec<String> = sweep.points.iter().map(|p| p.label()).collect();
        assert_eq!(labels, ["z=0 window=1h", "z=0 window=12h", "z=3 window=1h", "z=3 window=12h"]);
        assert!(sweep.points.iter().any(|p| p.frontier));
        let text = report.to_table(Some(100));
        assert!(text.contains("frontier of energy, deadline misses and p99 pending: reactive"), "{text}");
        assert!(text.contains("z=3 window=12h"), "{text}");
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["sweep"]["points"].as_array().map(Vec::len), Some(4));
    }
}
