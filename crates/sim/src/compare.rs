//! Runs every policy on one workload with one seed and builds the report.

use crate::config::SimConfig;
use crate::engine::{Prepared, RunStats, run_policy, sample_times};
use crate::oracle::oracle_bound;
use crate::pareto::{Axis, Costs, Sweep, dominated_by, grid};
use crate::policy::PolicyKind;
use crate::report::*;
use crate::sample::peak_demand;
use crate::workload::Workload;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// How long a policy's run takes, roughly, next to the others: the more
/// it scales down, the more passes it makes.
fn cost(kind: PolicyKind) -> u8 {
    match kind {
        PolicyKind::AlwaysOn => 0,
        PolicyKind::Reactive => 1,
        PolicyKind::WarmSpares => 2,
        PolicyKind::Ironclaim => 3,
    }
}

/// Runs each job on a pool of threads, one per core, and returns the
/// statistics in the jobs' order.
fn run_all(w: &Workload, prep: &Prepared, jobs: &[(PolicyKind, SimConfig, String)], progress: &(dyn Fn(&str, f64) + Sync)) -> Vec<RunStats> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len()).max(1);
    // The longest first, so that no long run starts last.
    let mut order: Vec<usize> = (0..jobs.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(cost(jobs[i].0)));
    let next = AtomicUsize::new(0);
    let done: Mutex<Vec<Option<RunStats>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let (kind, cfg, label) = &jobs[i];
                    let stats = run_policy(w, prep, cfg, *kind, &mut |f| progress(label, f));
                    done.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(stats);
                }
            });
        }
    });
    done.into_inner().unwrap_or_else(|e| e.into_inner()).into_iter().flatten().collect()
}

/// Runs `policies` (and, when ironclaim is among them, ironclaim again
/// under the other scheduler scoring) and compares them. The runs are
/// independent, each with its own seeded streams, and go on as many
/// threads as the machine has cores: the report is the same on any.
///
/// `progress` receives a run's label and its completed fraction, from the
/// thread that runs it.
pub fn compare(w: &Workload, cfg: &SimConfig, policies: &[PolicyKind], progress: &(dyn Fn(&str, f64) + Sync)) -> Report {
    compare_sweep(w, cfg, policies, &[], progress)
}

/// [`compare`], and the ironclaim policy once more for every combination
/// of the sweep's axes (none: no sweep), its frontier in
/// [`Report::sweep`]. The sweep's runs go on the same threads.
pub fn compare_sweep(w: &Workload, cfg: &SimConfig, policies: &[PolicyKind], axes: &[Axis], progress: &(dyn Fn(&str, f64) + Sync)) -> Report {
    let prep = Prepared::new(w, cfg.duration_s);
    let mut jobs: Vec<(PolicyKind, SimConfig, String)> = policies.iter().map(|&k| (k, cfg.clone(), k.name().to_string())).collect();
    let scored = policies.contains(&PolicyKind::Ironclaim);
    if scored {
        let mut other = cfg.clone();
        other.scoring = cfg.scoring.other();
        let label = format!("ironclaim ({})", other.scoring);
        jobs.push((PolicyKind::Ironclaim, other, label));
    }
    let settings = if axes.is_empty() { Vec::new() } else { grid(axes) };
    for point in &settings {
        let mut c = cfg.clone();
        for &(knob, value) in point {
            knob.set(&mut c.policy, value);
        }
        let label = point.iter().map(|(k, v)| format!("{}={}", k.name(), k.show(*v))).collect::<Vec<_>>().join(" ");
        jobs.push((PolicyKind::Ironclaim, c, format!("ironclaim {label}")));
    }
    // The oracle needs only the sample times: it runs beside the policies.
    let at_s = sample_times(&prep, cfg);
    let (mut runs, oracle) = std::thread::scope(|scope| {
        let oracle = scope.spawn(|| oracle_bound(w, &prep, &at_s));
        let runs = run_all(w, &prep, &jobs, progress);
        (runs, oracle.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
    });
    debug_assert!(runs.iter().all(|r| r.timeline.at_s == at_s));
    let swept = runs.split_off(runs.len() - settings.len());
    let sweep = (!axes.is_empty()).then(|| {
        let costs = swept.iter().map(|r| {
            let p = crate::report::percentiles(&r.pending_s);
            Costs { energy_kwh: r.energy_kwh, deadline_misses: r.deadline_misses, pending_p99_s: p.p99 }
        });
        Sweep::new(axes.to_vec(), settings.iter().cloned().zip(costs).collect())
    });
    let alt = if scored { runs.pop() } else { None };
    let scoring = alt.map(|alt| {
        let base = runs.iter().find(|r| r.policy == PolicyKind::Ironclaim);
        let (mut least, mut most) = (alt.clone(), alt);
        if let Some(b) = base {
            if b.scoring == crate::config::Scoring::LeastAllocated {
                least = b.clone();
            } else {
                most = b.clone();
            }
        }
        ScoringComparison {
            policy: "ironclaim",
            least_allocated_kwh: least.energy_kwh,
            most_allocated_kwh: most.energy_kwh,
            least_allocated_base_kwh: least.energy_kwh - least.dynamic_kwh,
            most_allocated_base_kwh: most.energy_kwh - most.dynamic_kwh,
            least_allocated_powered_mean: least.powered_mean,
            most_allocated_powered_mean: most.powered_mean,
            most_allocated_saves: if least.energy_kwh > 0.0 { 1.0 - most.energy_kwh / least.energy_kwh } else { 0.0 },
        }
    });
    let unplaceable_count = prep.unplaceable.iter().filter(|u| u.is_some()).count();
    let mut reports: Vec<PolicyReport> = runs.iter().map(|r| PolicyReport::from_stats(r, oracle.energy_kwh, unplaceable_count as u64)).collect();
    if let Some(base) = reports.iter().find(|p| p.policy == PolicyKind::AlwaysOn.name()).map(|p| p.energy_kwh) {
        for p in &mut reports {
            p.saved_vs_always_on = Some(if base > 0.0 { 1.0 - p.energy_kwh / base } else { 0.0 });
        }
    }
    let costs: Vec<Costs> = reports.iter().map(PolicyReport::costs).collect();
    for (p, d) in reports.iter_mut().zip(dominated_by(&costs)) {
        p.dominated_by = d.map(|i| runs[i].policy.name());
    }
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, u) in prep.unplaceable.iter().enumerate() {
        if let Some(reason) = u {
            groups.entry(reason.as_str()).or_default().push(i);
        }
    }
    let mut unplaceable: Vec<UnplaceableGroup> = groups
        .into_iter()
        .map(|(reason, pods)| UnplaceableGroup {
            reason: reason.to_string(),
            pods: pods.len(),
            examples: pods.iter().take(3).map(|&i| prep.pods[i].key()).collect(),
        })
        .collect();
    unplaceable.sort_by(|a, b| b.pods.cmp(&a.pods).then(a.reason.cmp(&b.reason)));
    let timeline = TimelineReport {
        at_s,
        demand_servers: oracle.servers_at.clone(),
        policies: runs
            .iter()
            .map(|r| PolicySeries {
                policy: r.policy.name(),
                powered: r.timeline.powered.clone(),
                watts: r.timeline.watts.clone(),
                pending: r.timeline.pending.clone(),
                pending_cdf: pending_cdf(&r.pending_s),
            })
            .collect(),
    };
    let (classes, class_of) = w.hardware_classes();
    let replayed = runs.iter().find(|r| r.policy == PolicyKind::Ironclaim).or(runs.first());
    let replay = replayed.filter(|r| !r.timeline.states.is_empty()).map(|r| crate::report::Replay {
        policy: r.policy.name(),
        servers: w.servers.iter().map(|s| s.name.clone()).collect(),
        classes: class_of.iter().map(|&c| classes[c].name.clone()).collect(),
        states: r.timeline.states.clone(),
    });
    Report {
        seed: cfg.seed,
        workload: WorkloadSummary {
            name: w.name.clone(),
            servers: w.servers.len(),
            hardware_classes: classes.len(),
            pods: w.pods.iter().filter(|p| p.arrival_s <= prep.end_s).count(),
            pods_unplaceable: unplaceable_count,
            duration_s: prep.end_s,
            peak: peak_demand(&w.pods),
        },
        settings: cfg.clone(),
        oracle: OracleSummary::from(&oracle),
        policies: reports,
        scoring,
        unplaceable,
        timeline,
        sweep,
        replay,
    }
}
