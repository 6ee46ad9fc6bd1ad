//! `ironclaim bench scheduling`: decision throughput on the benchmark shapes.

use crate::exit::Failure;
use crate::render;
use ironclaim_core::{Outcome, ffd, provision, shapes};
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
    #[arg(long, value_enum, default_value_t = Shape::Reference)]
    shape: Shape,
    /// Pending pods; a comma-separated list gives one row per size.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 100, 1000, 5000, 20000])]
    pods: Vec<usize>,
    /// Runs per size; the fastest is reported (the least disturbed by
    /// anything else on the machine).
    #[arg(long, default_value_t = 3)]
    runs: u32,
    #[arg(short, long, value_enum, default_value_t = crate::plan::Output::Table)]
    output: crate::plan::Output,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Shape {
    Reference,
    BareMetal,
}

#[derive(Serialize)]
struct Row {
    shape: Shape,
    pods: usize,
    pods_per_sec: f64,
    decision_ms: f64,
    servers_opened: usize,
    ffd_servers_opened: usize,
    unschedulable: usize,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let What::Scheduling(args) = args.what;
    let mut rows = Vec::new();
    for &pods in &args.pods {
        let snapshot = match args.shape {
            Shape::Reference => shapes::reference(pods),
            Shape::BareMetal => shapes::bare_metal(pods),
        };
        let mut best = f64::INFINITY;
        let mut plan = None;
        for _ in 0..args.runs.max(1) {
            let start = Instant::now();
            let p = provision(&snapshot, 0);
            best = best.min(start.elapsed().as_secs_f64());
            plan = Some(p);
        }
        let Some(plan) = plan else { continue };
        rows.push(Row {
            shape: args.shape,
            pods,
            pods_per_sec: pods as f64 / best,
            decision_ms: best * 1000.0,
            servers_opened: plan.claims.len(),
            ffd_servers_opened: ffd::servers_opened(&snapshot),
            unschedulable: plan.pods.iter().filter(|d| matches!(d.outcome, Outcome::Unschedulable { .. })).count(),
        });
    }
    match args.output {
        crate::plan::Output::Json => {
            let json = if rows.len() == 1 { serde_json::to_string_pretty(&rows[0]) } else { serde_json::to_string_pretty(&rows) };
            println!("{}", json.map_err(Failure::world)?);
        }
        crate::plan::Output::Table => {
            let mut t = render::table(&["shape", "pods", "pods/s", "decision", "servers opened", "FFD opened", "unschedulable"]);
            for r in &rows {
                t.add_row(vec![
                    serde_json::to_value(r.shape).ok().and_then(|v| v.as_str().map(String::from)).unwrap_or_default(),
                    r.pods.to_string(),
                    format!("{:.0}", r.pods_per_sec),
                    format!("{:.1} ms", r.decision_ms),
                    r.servers_opened.to_string(),
                    r.ffd_servers_opened.to_string(),
                    r.unschedulable.to_string(),
                ]);
            }
            println!("{t}");
        }
    }
    Ok(())
}
