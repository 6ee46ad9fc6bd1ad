//! `ironclaim swarm`: many seeds of small racks under random faults, every
//! policy under the simulator's checkers, in parallel over the cores.
//! Each failing seed is printed with its settings and the command that
//! replays it; `--seed S` replays one with every violation, and `--trace`
//! adds every effect, answer and crash of one policy.

use crate::exit::Failure;
use crate::render::count;
use anyhow::anyhow;
use ironclaim_sim::engine::Prepared;
use ironclaim_sim::swarm::{self, SeedResult};
use ironclaim_sim::{PolicyKind, run_policy};
use std::io::IsTerminal;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::time::Instant;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Replay this one seed and print everything it found.
    #[arg(long, conflicts_with_all = ["seeds", "from"])]
    seed: Option<u64>,
    /// With --seed: print every effect, answer and crash of this policy.
    #[arg(long, requires = "seed", value_name = "POLICY")]
    trace: Option<String>,
    /// Threads; default: one per core.
    #[arg(long)]
    jobs: Option<usize>,
    /// Policies to run on each seed, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "always-on,reactive,warm-spares,ironclaim")]
    policies: Vec<String>,
    #[command(flatten)]
    output: crate::output::OutputArg,
}

/// What a swarm run found, as `-o json|yaml` prints it.
#[derive(serde::Serialize)]
struct Summary {
    seeds: u64,
    from: u64,
    threads: usize,
    elapsed_s: f64,
    failing: Vec<Failing>,
}

#[derive(serde::Serialize)]
struct Failing {
    seed: u64,
    replay: String,
    runs: Vec<FailingRun>,
}

#[derive(serde::Serialize)]
struct FailingRun {
    policy: &'static str,
    violations: Vec<FailingViolation>,
}

#[derive(serde::Serialize)]
struct FailingViolation {
    at_s: u64,
    checker: &'static str,
    message: String,
}

impl Summary {
    fn text(&self) -> String {
        let done = self.seeds;
        let mut text = format!(
            "{} in {:.1} s ({:.1} seeds/s on {}): {} failing\n",
            count(done, "seed", "seeds"),
            self.elapsed_s,
            done as f64 / self.elapsed_s.max(1e-9),
            count(self.threads as u64, "thread", "threads"),
            self.failing.len()
        );
        for f in &self.failing {
            for run in &f.runs {
                let first = &run.violations[0];
                text.push_str(&format!(
                    "  seed {} {}: {}, first at {} s: {}: {}\n",
                    f.seed,
                    run.policy,
                    count(run.violations.len() as u64, "violation", "violations"),
                    first.at_s,
                    first.checker,
                    first.message
                ));
            }
            text.push_str(&format!("    replay: {}\n", f.replay));
        }
        text
    }
}

pub fn run(args: Args) -> Result<(), Failure> {
    let policies = crate::simulate::parse_policies(&args.policies).map_err(Failure::bad_input)?;
    if let Some(seed) = args.seed {
        return replay(seed, &policies, args.trace.as_deref());
    }
    if args.seeds == 0 {
        return Err(Failure::bad_input(anyhow!("--seeds must be at least 1")));
    }
    let jobs = args.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())).max(1);
    if args.jobs == Some(0) {
        return Err(Failure::bad_input(anyhow!("--jobs must be at least 1")));
    }
    let last = args.from.checked_add(args.seeds - 1).ok_or_else(|| Failure::bad_input(anyhow!("--from plus --seeds overflows")))?;
    eprintln!(
        "swarm: seeds {}..={last} on {}, policies {}; each seed draws its rack, load and faults (faults stop at {} s)",
        args.from,
        count(jobs as u64, "thread", "threads"),
        policies.iter().map(|p| p.name()).collect::<Vec<_>>().join(","),
        swarm::FAULTS_FOR_S
    );
    let bar = std::io::stderr().is_terminal().then(|| {
        let bar = indicatif::ProgressBar::new(args.seeds);
        bar.set_style(
            indicatif::ProgressStyle::with_template("[{bar:40}] {pos}/{len} seeds {per_sec} {elapsed} (eta {eta}) {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        bar
    });
    let started = Instant::now();
    let next = AtomicU64::new(args.from);
    let (tx, rx) = mpsc::channel::<SeedResult>();
    let mut failing: Vec<SeedResult> = Vec::new();
    let mut done = 0u64;
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            let (tx, next, policies) = (tx.clone(), &next, &policies);
            scope.spawn(move || {
                loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    if seed > last || tx.send(swarm::run_seed(seed, policies)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        for result in rx {
            done += 1;
            if result.failed() {
                if let Some(bar) = &bar {
                    bar.println(format!("seed {} broke a checker; replay: {}", result.seed, swarm::replay_command(result.seed)));
                } else {
                    eprintln!("seed {} broke a checker; replay: {}", result.seed, swarm::replay_command(result.seed));
                }
                failing.push(result);
            }
            if let Some(bar) = &bar {
                bar.set_position(done);
                bar.set_message(format!("{} failing", failing.len()));
            }
        }
    });
    if let Some(bar) = &bar {
        bar.finish_and_clear();
    }
    failing.sort_by_key(|r| r.seed);
    let summary = Summary {
        seeds: done,
        from: args.from,
        threads: jobs,
        elapsed_s: started.elapsed().as_secs_f64(),
        failing: failing
            .iter()
            .map(|r| Failing {
                seed: r.seed,
                replay: swarm::replay_command(r.seed),
                runs: r
                    .runs
                    .iter()
                    .filter(|run| !run.violations.is_empty())
                    .map(|run| FailingRun {
                        policy: run.policy.name(),
                        violations: run
                            .violations
                            .iter()
                            .map(|v| FailingViolation { at_s: v.at_s, checker: v.checker, message: v.message.clone() })
                            .collect(),
                    })
                    .collect(),
            })
            .collect(),
    };
    crate::output::print(args.output.output, &summary, Summary::text)?;
    if failing.is_empty() { Ok(()) } else { Err(Failure::world(anyhow!("{} of {} broke a checker", failing.len(), count(done, "seed", "seeds")))) }
}

/// Runs one seed and prints its case, what each policy did and every violation.
fn replay(seed: u64, policies: &[PolicyKind], trace: Option<&str>) -> Result<(), Failure> {
    let traced = match trace {
        Some(name) => Some(PolicyKind::parse(name).ok_or_else(|| Failure::bad_input(anyhow!("--trace: unknown policy `{name}`")))?),
        None => None,
    };
    let c = swarm::case(seed);
    crate::outln!("{}", swarm::describe(&c))?;
    let prep = Prepared::new(&c.workload, None);
    // The trace's lines, until a reader closes stdout.
    let mut closed: Result<(), Failure> = Ok(());
    let mut broken = 0;
    for &policy in policies {
        let stats = if traced == Some(policy) {
            ironclaim_sim::engine::run_policy_traced(&c.workload, &prep, &c.config, policy, &mut |at, what| {
                if closed.is_ok() {
                    closed = crate::outln!("  {at:>6} s  {what}");
                }
            })
        } else {
            run_policy(&c.workload, &prep, &c.config, policy, &mut |_| {})
        };
        std::mem::replace(&mut closed, Ok(()))?;
        crate::outln!(
            "{}: {} placed, {} pending at the end, {}, {}, {}, {}, {} lost, {} refused, {}",
            policy.name(),
            stats.pods_placed,
            stats.pods_pending_at_end,
            count(stats.provision_calls, "decision", "decisions"),
            count(stats.scale_down_passes, "scale-down pass", "scale-down passes"),
            count(stats.crashes, "crash", "crashes"),
            count(stats.takeovers, "lease takeover", "lease takeovers"),
            count(stats.nodes_lost, "node", "nodes"),
            count(stats.power_offs_refused, "power-off", "power-offs"),
            count(stats.violations.len() as u64, "violation", "violations")
        )?;
        for v in &stats.violations {
            crate::outln!("  {} s {}: {}", v.at_s, v.checker, v.message)?;
        }
        if !stats.violations.is_empty() {
            broken += 1;
        }
    }
    if broken == 0 { Ok(()) } else { Err(Failure::world(anyhow!("seed {seed}: {} broke a checker", count(broken, "policy run", "policy runs")))) }
}
