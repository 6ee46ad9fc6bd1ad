//! `ironclaim-agree`: seeded scenarios given to ironclaim's decision core
//! and to the real kube-scheduler on the test control plane; prints the
//! disagreements and writes each as a manifest.
//!
//!     cargo run --release -p ironclaim-agree -- --single 5000 --batch 500
//!
//! Exit 0: they agree on every scenario. Exit 1: a disagreement, or the
//! control plane failed. Exit 2: bad arguments.

use anyhow::Result;
use clap::Parser;
use indicatif::{ProgressBar, ProgressStyle};
use ironclaim_agree::cluster::Cluster;
use ironclaim_agree::generate::Mode;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(about = "Compare ironclaim's scheduling decisions with the real kube-scheduler on seeded scenarios")]
struct Args {
    /// Single-pod scenarios: one pending pod probed against every node.
    #[arg(long, default_value_t = 5000)]
    single: u64,
    /// Batch scenarios: several pending pods at once.
    #[arg(long, default_value_t = 500)]
    batch: u64,
    /// The first seed; scenarios use seeds from here on.
    #[arg(long, default_value_t = 0)]
    first_seed: u64,
    /// Where disagreements are written, one manifest each.
    #[arg(long, default_value = "target/agree")]
    out: PathBuf,
    /// Also print where the time went, phase by phase.
    #[arg(long)]
    timings: bool,
}

fn main() -> std::process::ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return std::process::ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(0) => std::process::ExitCode::SUCCESS,
        Ok(_) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}

async fn run(args: Args) -> Result<usize> {
    let start = Instant::now();
    let cluster = Cluster::start().await?;
    let mut disagreements = 0usize;
    for (mode, count) in [(Mode::Single, args.single), (Mode::Batch, args.batch)] {
        if count == 0 {
            continue;
        }
        let bar = if std::io::stderr().is_terminal() { ProgressBar::new(count) } else { ProgressBar::hidden() };
        bar.set_style(
            ProgressStyle::with_template("{prefix:>6} [{bar:40}] {pos}/{len} scenarios {per_sec} {elapsed} (eta {eta}) {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{mode:?}").to_lowercase());
        let phase = Instant::now();
        let mut found = 0usize;
        let mut order_effects = 0usize;
        for seed in args.first_seed..args.first_seed + count {
            let checked = ironclaim_agree::check(&cluster, seed, mode).await?;
            if checked.order_effect.is_some() {
                order_effects += 1;
            }
            if let Some(d) = checked.disagreement {
                found += 1;
                let path = d.write(&args.out)?;
                bar.suspend(|| println!("disagreement: {}\n{}\n", path.display(), d.what));
                bar.set_message(format!("{found} disagreeing"));
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        println!(
            "{mode:?}: {count} scenarios, {found} disagreements, {:.1} s ({:.1} scenarios/s)",
            phase.elapsed().as_secs_f64(),
            count as f64 / phase.elapsed().as_secs_f64()
        );
        if mode == Mode::Batch {
            println!(
                "  order effects: in {order_effects} scenarios ironclaim, planning every pod at once, counted another number onto existing nodes than kube-scheduler bound"
            );
        }
        disagreements += found;
    }
    cluster.clear().await?;
    if args.timings {
        print_timings(&cluster, start.elapsed());
    }
    println!("total: {disagreements} disagreements in {:.1} s", start.elapsed().as_secs_f64());
    Ok(disagreements)
}

/// Where the time went, phase by phase (`--timings`); a phase's share is
/// of the whole run (phases nest: a probe's verdict is reads of its pod).
fn print_timings(cluster: &Cluster, run: std::time::Duration) {
    println!("{:<40} {:>7} {:>9} {:>9} {:>9} {:>6}", "phase", "count", "mean ms", "max ms", "total s", "share");
    for (name, p) in cluster.timings().phases() {
        let total = p.total.as_secs_f64();
        println!(
            "{name:<40} {:>7} {:>9.2} {:>9.1} {:>9.1} {:>5.1}%",
            p.count,
            total * 1000.0 / p.count.max(1) as f64,
            p.max.as_secs_f64() * 1000.0,
            total,
            100.0 * total / run.as_secs_f64().max(f64::MIN_POSITIVE)
        );
    }
}
