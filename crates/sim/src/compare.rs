//! Runs every policy on one workload with one seed and builds the report.

use crate::config::SimConfig;
use crate::engine::{Prepared, RunStats, run_policy};
use crate::oracle::oracle_bound;
use crate::policy::PolicyKind;
use crate::report::*;
use crate::sample::peak_demand;
use crate::workload::Workload;
use std::collections::BTreeMap;

/// Runs `policies` (and, when ironclaim is among them, ironclaim again
/// under the other scheduler scoring) and compares them.
///
/// `progress` receives the run's label and its completed fraction.
pub fn compare(w: &Workload, cfg: &SimConfig, policies: &[PolicyKind], progress: &mut dyn FnMut(&str, f64)) -> Report {
    let prep = Prepared::new(w, cfg.duration_s);
    let mut runs: Vec<RunStats> = Vec::new();
    for &kind in policies {
        runs.push(run_policy(w, &prep, cfg, kind, &mut |f| progress(kind.name(), f)));
    }
    let at_s: Vec<u64> = runs.first().map(|r| r.timeline.at_s.clone()).unwrap_or_default();
    let oracle = oracle_bound(w, &prep, &at_s);
    let scoring = policies.contains(&PolicyKind::Ironclaim).then(|| {
        let mut other = cfg.clone();
        other.scoring = cfg.scoring.other();
        let label = format!("ironclaim ({})", other.scoring);
        let alt = run_policy(w, &prep, &other, PolicyKind::Ironclaim, &mut |f| progress(&label, f));
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
    let (classes, _) = w.hardware_classes();
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
    }
}
