//! The agreement check: does ironclaim's decision core agree with the real
//! kube-scheduler?
//!
//! Seeded scenarios ([`generate`]) are given to both sides: to ironclaim
//! through the controller's conversions and the core's plan ([`decide`]),
//! and to kube-scheduler v1.37 on the test control plane ([`cluster`]).
//!
//! - **Single**: one pending pod; for every node, a probe copy of the pod
//!   that only that node can take. Both sides must give the same set of
//!   nodes the pod fits.
//! - **Batch**: several pending pods at once. kube-scheduler binds them in
//!   its order and picks among feasible nodes by score; ironclaim plans them
//!   together, largest first, and may count a different number onto
//!   existing nodes (an order effect, counted, not a disagreement: the
//!   controller decides once kube-scheduler has had its batch window). Once
//!   kube-scheduler has settled, ironclaim plans the same cluster again and
//!   must place none of the pods left pending on an existing node: it would
//!   never open a claim for them.
//!
//! A disagreement is written out as the scenario's manifest with both
//! answers, to replay with `kubectl apply` or `ironclaim plan -f`.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod decide;
pub mod generate;

use anyhow::Result;
use generate::{Mode, Scenario};
use serde_json::json;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Both answers to a scenario where they differ.
#[derive(Clone, Debug)]
pub struct Disagreement {
    pub seed: u64,
    pub mode: Mode,
    pub what: String,
    pub scenario: Scenario,
}

impl Disagreement {
    /// Writes the scenario and both answers to `dir/<mode>-<seed>.yaml`.
    pub fn write(&self, dir: &Path) -> Result<PathBuf> {
        std::fs::create_dir_all(dir)?;
        let tag = match self.mode {
            Mode::Single => "single",
            Mode::Batch => "batch",
        };
        let path = dir.join(format!("{tag}-{}.yaml", self.seed));
        let header: String = self.what.lines().map(|l| format!("# {l}\n")).collect();
        std::fs::write(&path, format!("# seed {} ({tag})\n{header}{}", self.seed, self.scenario.manifest()))?;
        Ok(path)
    }
}

fn names(set: &BTreeSet<String>) -> String {
    if set.is_empty() { "no node".to_string() } else { set.iter().cloned().collect::<Vec<_>>().join(", ") }
}

/// What one scenario showed.
#[derive(Clone, Debug, Default)]
pub struct Checked {
    pub disagreement: Option<Disagreement>,
    /// Batch: ironclaim, planning every pending pod at once, placed this
    /// many on existing nodes where kube-scheduler bound the second number.
    pub order_effect: Option<(usize, usize)>,
}

/// Runs scenario `seed` of `mode` on both sides.
pub async fn check(cluster: &cluster::Cluster, seed: u64, mode: Mode) -> Result<Checked> {
    let mut order_effect = None;
    let scenario = generate::scenario(seed, mode);
    cluster.set_up(&scenario).await?;
    let what = match mode {
        Mode::Single => {
            let ours = decide::feasible(&scenario, 0)?;
            let theirs = cluster.feasible(&scenario, 0).await?;
            (ours != theirs).then(|| {
                let only_ours: BTreeSet<_> = ours.difference(&theirs).cloned().collect();
                let only_theirs: BTreeSet<_> = theirs.difference(&ours).cloned().collect();
                format!(
                    "the pending pod fits\n  kube-scheduler: {}\n  ironclaim:      {}\nironclaim alone: {}\nkube-scheduler alone: {}",
                    names(&theirs),
                    names(&ours),
                    names(&only_ours),
                    names(&only_theirs)
                )
            })
        }
        Mode::Batch => {
            let ours = decide::placed(&scenario)?;
            let bound = cluster.bind_all(&scenario).await?;
            let theirs = bound.iter().flatten().count();
            let settled = settle(&scenario, &bound);
            let still_fit = decide::placed(&settled)?;
            let mut problems = Vec::new();
            if ours != theirs {
                order_effect = Some((ours, theirs));
            }
            if still_fit > 0 {
                problems.push(format!(
                    "once kube-scheduler settled ({} bound, {} pending), ironclaim still places {still_fit} of the pending pods on existing nodes (it would open no claim for them)",
                    theirs,
                    scenario.pending.len() - theirs
                ));
            }
            let binds: Vec<String> = scenario
                .pending
                .iter()
                .zip(&bound)
                .map(|(p, n)| format!("  {} -> {}", p["metadata"]["name"].as_str().unwrap_or_default(), n.as_deref().unwrap_or("unschedulable")))
                .collect();
            (!problems.is_empty()).then(|| format!("{}\nkube-scheduler bound:\n{}", problems.join("\n"), binds.join("\n")))
        }
    };
    Ok(Checked { disagreement: what.map(|what| Disagreement { seed, mode, what, scenario }), order_effect })
}

/// The scenario as kube-scheduler left it: the pods it bound are bound,
/// the others still pending.
pub fn settle(scenario: &Scenario, bound: &[Option<String>]) -> Scenario {
    let mut out = scenario.clone();
    out.pending.clear();
    for (pod, node) in scenario.pending.iter().zip(bound) {
        match node {
            Some(node) => {
                let mut p = pod.clone();
                p["spec"]["nodeName"] = json!(node);
                out.bound.push(p);
            }
            None => out.pending.push(pod.clone()),
        }
    }
    out
}
