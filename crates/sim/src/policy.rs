//! The power policies the simulator compares. Each is a configuration of
//! the one autoscaler that ships ([`ironclaim_driver::Autoscaler`]): the
//! same batching, claims, drains and scale-down decision, under ServerPool
//! settings a user could write. Nothing here decides anything at run time.

use crate::config::PolicySettings;
use crate::engine::Prepared;
use crate::workload::{HARDWARE_LABEL, Workload};
use ironclaim_core::AdaptiveFloor;
use ironclaim_core::model::{ServerPool, WarmPolicy};
use ironclaim_core::warm::class_of;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    AlwaysOn,
    Reactive,
    WarmSpares,
    Ironclaim,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [PolicyKind::AlwaysOn, PolicyKind::Reactive, PolicyKind::WarmSpares, PolicyKind::Ironclaim];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::AlwaysOn => "always-on",
            PolicyKind::Reactive => "reactive",
            PolicyKind::WarmSpares => "warm-spares",
            PolicyKind::Ironclaim => "ironclaim",
        }
    }

    pub fn parse(s: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|k| k.name() == s.trim())
    }
}

/// A floor the setup declares, for the checkers to hold the run to: at
/// least `count` idle powered-on servers of the hardware class (an index
/// into [`Prepared::classes`]) stay on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Floor {
    pub class: Option<usize>,
    pub count: u32,
}

/// What one policy runs: the ServerPools the autoscaler sees, whether every
/// server starts as a Ready node, whether scale-down runs at all.
#[derive(Clone, Debug, PartialEq)]
pub struct Setup {
    pub pools: Vec<ServerPool>,
    pub all_on_at_start: bool,
    pub scale_down: bool,
    /// Static floors the pools set, for the checkers.
    pub floors: Vec<Floor>,
}

/// The ServerPools and switches of a policy on a workload.
///
/// - `always-on`: every server starts as a node, and scale-down is off.
/// - `reactive`: no warm floors; an empty node is drained after
///   `consolidateAfter` = the idle timeout (or its break-even, if longer).
/// - `warm-spares`: reactive, plus a static floor of `warm_spares` idle
///   servers in the most numerous hardware class.
/// - `ironclaim`: the workload's pools as written; where a pool sets no
///   adaptive floor, the default one (`rate_window_s`, `floor_z`).
pub fn setup(kind: PolicyKind, w: &Workload, prep: &Prepared, s: &PolicySettings) -> Setup {
    // Classes are named by the simulator's hardware label where a pool
    // names none: the same grouping as the hardware itself, and no
    // capacity written out on every look.
    let mut base = w.pools.clone();
    for p in &mut base {
        if p.warm.class_label.is_none() {
            p.warm.class_label = Some(HARDWARE_LABEL.to_string());
        }
    }
    pools_for(kind, &base, w, prep, s)
}

fn pools_for(kind: PolicyKind, base: &[ServerPool], w: &Workload, prep: &Prepared, s: &PolicySettings) -> Setup {
    let reactive = || {
        base.iter()
            .map(|p| {
                let mut p = p.clone();
                p.warm = WarmPolicy { class_label: p.warm.class_label.take(), ..WarmPolicy::default() };
                p.disruption.consolidate_after_s = Some(s.idle_timeout_s);
                p.disruption.never = false;
                p
            })
            .collect::<Vec<_>>()
    };
    match kind {
        PolicyKind::AlwaysOn => Setup { pools: base.to_vec(), all_on_at_start: true, scale_down: false, floors: Vec::new() },
        PolicyKind::Reactive => Setup { pools: reactive(), all_on_at_start: false, scale_down: true, floors: Vec::new() },
        PolicyKind::WarmSpares => {
            let mut pools = reactive();
            let mut floors = Vec::new();
            // The most numerous class that a pool admits, ties to the first.
            let class = (0..prep.classes.len())
                .filter(|&c| prep.classes[c].members.iter().any(|&m| prep.pool_of[m].is_some()))
                .max_by(|&a, &b| prep.classes[a].members.len().cmp(&prep.classes[b].members.len()).then(b.cmp(&a)));
            if let Some(c) = class
                && s.warm_spares > 0
            {
                let first = prep.classes[c].members[0];
                if let Some(p) = prep.pool_of[first] {
                    let key = class_of(&w.servers[first], Some(&pools[p]));
                    pools[p].warm.floor.insert(key, s.warm_spares);
                    floors.push(Floor { class: Some(c), count: s.warm_spares });
                }
            }
            Setup { pools, all_on_at_start: false, scale_down: true, floors }
        }
        PolicyKind::Ironclaim => {
            let mut pools = base.to_vec();
            for p in &mut pools {
                if p.warm.adaptive.is_none() {
                    p.warm.adaptive = Some(AdaptiveFloor {
                        window_s: s.rate_window_s,
                        z: s.floor_z,
                        history_days: s.history_days,
                        weekly: s.weekly,
                        ..AdaptiveFloor::new(s.rate_window_s)
                    });
                }
            }
            Setup { pools, all_on_at_start: false, scale_down: true, floors: Vec::new() }
        }
    }
}
