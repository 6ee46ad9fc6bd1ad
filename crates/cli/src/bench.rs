//! `ironclaim bench scheduling`: decision throughput on the benchmark shapes.

use crate::exit::Failure;
use crate::output::{self, OutputArg};
use crate::render;
use ironclaim_core::{Outcome, Provisioning, ffd, provision, shapes};
use serde::Serialize;
use std::time::Instant;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
}

#[derive(clap::Subcommand)]
enum What {
    /// Scheduling throughput: pods decided per second.
    Scheduling(SchedulingArgs),
}

#[derive(clap::Args)]
struct SchedulingArgs {
    /// The cluster the pending pods land on.
    #[arg(long, value_enum, default_value_t = Shape::Reference)]
    shape: Shape,
    /// Pending pods; a comma-separated list gives one row per size.
    #[arg(long, value_name = "N,...", value_delimiter = ',', default_values_t = vec![1usize, 100, 1000, 5000, 20000])]
    pods: Vec<usize>,
    /// Runs per size; the fastest is reported (the least disturbed by
    /// anything else on the machine).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    runs: u32,
    #[command(flatten)]
    output: OutputArg,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Shape {
    /// Karpenter's scheduling benchmark: cloud instance types, no servers.
    Reference,
    /// A bare-metal rack of Servers, as ironclaim sees it.
    BareMetal,
}

impl Shape {
    fn name(self) -> &'static str {
        match self {
            Shape::Reference => "reference",
            Shape::BareMetal => "bare-metal",
        }
    }
}

/// What `bench scheduling -o json|yaml` prints: one document of this
/// shape whatever the flags, one row per `--pods` size (docs/plan.md).
#[derive(Serialize)]
struct Report {
    shape: Shape,
    runs: u32,
    rows: Vec<Row>,
}

#[derive(Serialize)]
struct Row {
    pods: usize,
    pods_per_sec: f64,
    decision_ms: f64,
    servers_opened: usize,
    ffd_servers_opened: usize,
    unschedulable: usize,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let What::Scheduling(args) = args.what;
    let report = Report { shape: args.shape, runs: args.runs, rows: args.pods.iter().map(|&pods| measure(args.shape, pods, args.runs)).collect() };
    output::print(args.output.output, &report, table)
}

/// The fastest of `runs` decisions for `pods` pending pods on `shape`.
fn measure(shape: Shape, pods: usize, runs: u32) -> Row {
    let snapshot = match shape {
        Shape::Reference => shapes::reference(pods),
        Shape::BareMetal => shapes::bare_metal(pods),
    };
    let mut best = f64::INFINITY;
    let mut plan = Provisioning::default();
    for _ in 0..runs.max(1) {
        let start = Instant::now();
        plan = provision(&snapshot, 0);
        best = best.min(start.elapsed().as_secs_f64());
    }
    Row {
        pods,
        pods_per_sec: pods as f64 / best,
        decision_ms: best * 1000.0,
        servers_opened: plan.claims.len(),
        ffd_servers_opened: ffd::servers_opened(&snapshot),
        unschedulable: plan.pods.iter().filter(|d| matches!(d.outcome, Outcome::Unschedulable { .. })).count(),
    }
}

fn table(report: &Report) -> String {
    let mut t = render::table(&["shape", "pods", "pods/s", "decision", "servers opened", "FFD opened", "unschedulable"]);
    for r in &report.rows {
        t.add_row(vec![
            report.shape.name().to_string(),
            r.pods.to_string(),
            format!("{:.0}", r.pods_per_sec),
            format!("{:.1} ms", r.decision_ms),
            r.servers_opened.to_string(),
            r.ffd_servers_opened.to_string(),
            r.unschedulable.to_string(),
        ]);
    }
    format!("{t}\n")
}
