//! Scale-down: which idle servers to power off, which nodes to drain, and
//! which warm spares to power on, within warm-spare floors, disruption
//! budgets and PodDisruptionBudgets.
//!
//! # Power off only when it pays
//! Powering a server off and on again costs its boot energy. An idle server
//! becomes a candidate once it has idled longer than its break-even time:
//! boot energy (boot watts over the measured power-on and boot stages)
//! divided by what it saves per second off (idle minus standby watts). A
//! NodePool's `consolidateAfter` can only lengthen that.
//!
//! # Guarantees
//! - No node with a pod that must not be disrupted (do-not-disrupt, or a
//!   pod no controller would recreate) is drained.
//! - Across the whole plan, no PodDisruptionBudget allows fewer evictions
//!   than the plan makes.
//! - Per class, the idle powered-on servers (warm spares and empty nodes)
//!   left on are at least the floor, or all there were.
//! - Per NodePool and reason, nodes being disrupted never exceed the most
//!   restrictive active budget.
//! - Only servers with no node are powered off directly; a node's server is
//!   powered off after its drain.
//! - Per NodePool with a headroom, no power-off or drain takes the pool's
//!   free capacity (on its nodes and warm spares) below it; when it is
//!   already below, spares are powered on.
//! - The floor of a class is its static floor, raised by the adaptive
//!   floor ([`crate::warm`]) where the pool enables it.

use crate::model::*;
use crate::provision::provision;
use crate::outcome::Outcome;
use crate::warm::{class_of, pool_of};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};

/// Nodes whose pods all fit elsewhere are consolidated below this share of
/// their allocatable cpu and memory (the larger of the two).
pub const UNDERUTILIZED_BELOW: f64 = 0.5;
/// At most this many underutilized nodes are re-simulated per decision.
pub const MAX_CONSOLIDATION_CANDIDATES: usize = 32;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum Action {
    /// An idle powered-on server with no node: power it off.
    PowerOff { server: String, class: String, idle_s: Seconds, break_even_s: Seconds, saves_watts: f64 },
    /// Cordon and drain the node (DaemonSet pods last), then power its
    /// server off and release it.
    Drain {
        node: String,
        server: Option<String>,
        pool: String,
        reason: DisruptionReason,
        evict: Vec<String>,
        daemonset_pods: Vec<String>,
        saves_watts: f64,
    },
    /// Power a spare on to restore the warm floor of its class.
    PowerOn { server: String, class: String, floor: u32, on: u32 },
    /// Power a spare on because the pool's free capacity is short of its
    /// headroom (`short` says by what).
    PowerOnForHeadroom { server: String, pool: String, short: String },
}

/// Something the plan could have done and did not, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Held {
    pub subject: String,
    pub why: String,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Disruption {
    pub actions: Vec<Action>,
    pub held: Vec<Held>,
}

/// Seconds of idling that cost as much energy as one power cycle.
pub fn break_even_s(server: &Server) -> Seconds {
    let p = &server.power;
    let saved_per_s = (p.idle_watts - p.off_watts).max(1.0);
    let boot_joules = p.boot_watts * (server.durations.power_on_s + server.durations.boot_s) as f64;
    (boot_joules / saved_per_s).ceil() as Seconds
}

/// How many more nodes of the pool may be disrupted now for this reason.
fn budget_left(pool: &NodePool, reason: DisruptionReason, nodes: u32, disrupting: u32, now_s: Seconds) -> u32 {
    let allowed = |b: &BudgetNodes| match b {
        BudgetNodes::Count(n) => *n,
        BudgetNodes::Percent(p) => (u64::from(*p) * u64::from(nodes)).div_ceil(100) as u32,
    };
    let limit = if pool.disruption.budgets.is_empty() {
        allowed(&BudgetNodes::Percent(10))
    } else {
        pool.disruption
            .budgets
            .iter()
            .filter(|b| b.reasons.is_empty() || b.reasons.contains(&reason))
            .filter(|b| b.window.as_ref().is_none_or(|w| w.is_active(now_s)))
            .map(|b| allowed(&b.nodes))
            .min()
            .unwrap_or(u32::MAX)
    };
    limit.saturating_sub(disrupting)
}

/// Free capacity beyond each pool's headroom: what scale-down may still take.
struct Headroom {
    left: BTreeMap<String, crate::Resources>,
    wanted: BTreeMap<String, crate::Resources>,
}

impl Headroom {
    fn short(&self, pool: &str) -> Option<String> {
        let (left, want) = (self.left.get(pool)?, self.wanted.get(pool)?);
        let mut parts = Vec::new();
        if want.cpu_milli > 0 && left.cpu_milli < 0 {
            parts.push(format!("cpu {}", crate::quantity::format_cpu_milli(-left.cpu_milli)));
        }
        if want.memory_bytes > 0 && left.memory_bytes < 0 {
            parts.push(format!("memory {}", crate::quantity::format_bytes(-left.memory_bytes)));
        }
        if want.gpus() > 0 && left.gpus() < 0 {
            parts.push(format!("{} GPUs", -left.gpus()));
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// Takes `capacity` away from the pool's free capacity if the headroom
    /// still holds afterwards.
    fn take(&mut self, pool: &str, capacity: &crate::Resources) -> bool {
        let Some(left) = self.left.get_mut(pool) else { return true };
        left.sub(capacity);
        if self.short(pool).is_some() {
            if let Some(l) = self.left.get_mut(pool) {
                l.add(capacity);
            }
            return false;
        }
        true
    }

    fn give(&mut self, pool: &str, capacity: &crate::Resources) {
        if let Some(left) = self.left.get_mut(pool) {
            left.add(capacity);
        }
    }
}

struct Candidate<'s> {
    node: &'s Node,
    server: Option<&'s Server>,
    pool: &'s NodePool,
    pods: Vec<&'s Pod>,
    daemonset_pods: Vec<&'s Pod>,
}

/// Decides the scale-down half of a plan. Pure: same inputs, same output.
pub fn disrupt(snapshot: &Snapshot, now_s: Seconds) -> Disruption {
    let mut out = Disruption::default();
    let pools = &snapshot.pools;
    let servers: HashMap<&str, &Server> = snapshot.servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let mut pods_on: HashMap<&str, Vec<&Pod>> = HashMap::new();
    for p in snapshot.pods.iter().filter(|p| p.occupies_node() && !p.terminating) {
        pods_on.entry(p.node_name.as_deref().unwrap_or_default()).or_default().push(p);
    }

    // Nodes ironclaim manages (backed by an inventory server) by pool.
    let mut candidates: Vec<Candidate<'_>> = Vec::new();
    let mut pool_nodes: BTreeMap<&str, (u32, u32)> = BTreeMap::new(); // (nodes, disrupting)
    for node in &snapshot.nodes {
        let server = node.server.as_deref().and_then(|s| servers.get(s).copied());
        let Some(pool) = server.and_then(|s| pool_of(pools, s, Some(node))) else { continue };
        let e = pool_nodes.entry(pool.name.as_str()).or_default();
        e.0 += 1;
        if node.disrupting {
            e.1 += 1;
            continue;
        }
        let all = pods_on.get(node.name.as_str()).cloned().unwrap_or_default();
        let (daemonset_pods, pods): (Vec<&Pod>, Vec<&Pod>) = all.into_iter().partition(|p| p.is_daemonset_pod());
        candidates.push(Candidate { node, server, pool, pods, daemonset_pods });
    }

    // Idle capacity per (pool, class): warm spares with no node, and empty nodes.
    #[derive(Default)]
    struct ClassState<'s> {
        spares: Vec<&'s Server>,
        empty_nodes: Vec<usize>,
        cold: Vec<&'s Server>,
    }
    let mut classes: BTreeMap<(String, String), ClassState<'_>> = BTreeMap::new();
    for s in &snapshot.servers {
        let pool = pool_of(pools, s, None);
        let key = (pool.map(|p| p.name.clone()).unwrap_or_default(), class_of(s, pool));
        if s.is_available() {
            let st = classes.entry(key).or_default();
            if s.power_state == PowerState::On {
                st.spares.push(s);
            } else {
                st.cold.push(s);
            }
        }
    }
    for (i, c) in candidates.iter().enumerate() {
        if c.pods.is_empty()
            && let Some(s) = c.server
        {
            let key = (c.pool.name.clone(), class_of(s, Some(c.pool)));
            classes.entry(key).or_default().empty_nodes.push(i);
        }
    }
    let floors = crate::warm::floors(snapshot, now_s);

    let mut headroom = Headroom { left: BTreeMap::new(), wanted: BTreeMap::new() };
    for pool in pools {
        let Some(want) = &pool.warm.headroom else { continue };
        let mut free = crate::Resources::default();
        for c in candidates.iter().filter(|c| c.pool.name == pool.name) {
            free.add(&c.node.allocatable);
            for p in c.pods.iter().chain(&c.daemonset_pods) {
                free.sub(&p.requests);
            }
        }
        for s in snapshot.servers.iter().filter(|s| s.is_available() && s.is_warm()) {
            if pool_of(pools, s, None).is_some_and(|p| p.name == pool.name) {
                free.add(&s.capacity);
            }
        }
        headroom.left.insert(pool.name.clone(), free.minus(want));
        headroom.wanted.insert(pool.name.clone(), want.clone());
    }

    let mut pdb_left: Vec<i64> = snapshot.pdbs.iter().map(|p| p.disruptions_allowed).collect();
    let mut drained: Vec<usize> = Vec::new();
    let mut drains_by_pool: BTreeMap<String, u32> = BTreeMap::new();
    let idle_for = |s: &Server| s.idle_since_s.map_or(0, |t| now_s.saturating_sub(t));
    let mut fleet_on_peak: f64 = snapshot
        .servers
        .iter()
        .filter(|s| s.power_state == PowerState::On || s.node.is_some() || s.claim.is_some())
        .map(|s| s.power.peak_watts)
        .sum();

    for ((pool_name, class), st) in &classes {
        let floor = floors.get(&(pool_name.clone(), class.clone())).copied().unwrap_or(0);
        let on = (st.spares.len() + st.empty_nodes.len()) as u32;
        if on < floor {
            // Restore the floor from cold spares, most efficient first.
            let mut cold = st.cold.clone();
            cold.sort_by(|a, b| a.power.idle_watts.total_cmp(&b.power.idle_watts).then(a.failures.cmp(&b.failures)).then(a.name.cmp(&b.name)));
            for s in cold.into_iter().take((floor - on) as usize) {
                if snapshot.power_budget_watts.is_some_and(|b| fleet_on_peak + s.power.peak_watts > b) {
                    out.held.push(Held { subject: s.name.clone(), why: format!("warm floor {floor} for {class}, but the power budget is reached") });
                    break;
                }
                fleet_on_peak += s.power.peak_watts;
                out.actions.push(Action::PowerOn { server: s.name.clone(), class: class.clone(), floor, on });
            }
            continue;
        }
        let mut excess = on - floor;
        // Warm spares go first (no drain needed), longest idle first.
        let mut spares = st.spares.clone();
        spares.sort_by(|a, b| idle_for(b).cmp(&idle_for(a)).then(a.name.cmp(&b.name)));
        for s in spares {
            if excess == 0 {
                out.held.push(Held { subject: s.name.clone(), why: format!("kept as a warm spare: floor {floor} for {class}") });
                continue;
            }
            let (idle, threshold) = (idle_for(s), break_even_s(s));
            if idle < threshold {
                out.held.push(Held {
                    subject: s.name.clone(),
                    why: format!("idle {}s of its {}s break-even: powering off would cost more than it saves", idle, threshold),
                });
                continue;
            }
            if !headroom.take(pool_name, &s.capacity) {
                out.held.push(Held { subject: s.name.clone(), why: format!("kept for the headroom of NodePool {pool_name}") });
                continue;
            }
            excess -= 1;
            out.actions.push(Action::PowerOff {
                server: s.name.clone(),
                class: class.clone(),
                idle_s: idle,
                break_even_s: threshold,
                saves_watts: s.power.idle_watts - s.power.off_watts,
            });
        }
        let mut empties = st.empty_nodes.clone();
        empties.sort_by(|&a, &b| {
            let (x, y) = (candidates[a].server.map_or(0, idle_for), candidates[b].server.map_or(0, idle_for));
            y.cmp(&x).then(candidates[a].node.name.cmp(&candidates[b].node.name))
        });
        for i in empties {
            let c = &candidates[i];
            let Some(s) = c.server else { continue };
            if excess == 0 {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("empty, kept as warm capacity: floor {floor} for {class}") });
                continue;
            }
            if c.pool.disruption.never {
                out.held.push(Held { subject: c.node.name.clone(), why: "its NodePool never consolidates".into() });
                continue;
            }
            let threshold = break_even_s(s).max(c.pool.disruption.consolidate_after_s.unwrap_or(0));
            let idle = idle_for(s);
            if idle < threshold {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("empty for {idle}s of the {threshold}s it must idle first") });
                continue;
            }
            let (nodes, disrupting) = pool_nodes.get(c.pool.name.as_str()).copied().unwrap_or_default();
            let used = drains_by_pool.get(&c.pool.name).copied().unwrap_or(0);
            if budget_left(c.pool, DisruptionReason::Empty, nodes, disrupting, now_s) <= used {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("disruption budget of NodePool {} is used up", c.pool.name) });
                continue;
            }
            if !headroom.take(&c.pool.name, &c.node.allocatable) {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("kept for the headroom of NodePool {}", c.pool.name) });
                continue;
            }
            excess -= 1;
            *drains_by_pool.entry(c.pool.name.clone()).or_default() += 1;
            drained.push(i);
            out.actions.push(Action::Drain {
                node: c.node.name.clone(),
                server: Some(s.name.clone()),
                pool: c.pool.name.clone(),
                reason: DisruptionReason::Empty,
                evict: Vec::new(),
                daemonset_pods: c.daemonset_pods.iter().map(|p| p.key()).collect(),
                saves_watts: s.power.idle_watts - s.power.off_watts,
            });
        }
    }

    // Underutilized nodes whose pods all fit on the nodes that stay.
    let mut under: Vec<(f64, usize)> = candidates
        .iter()
        .enumerate()
        .filter(|(i, c)| !c.pods.is_empty() && !drained.contains(i) && !c.pool.disruption.never)
        .map(|(i, c)| {
            let mut used = crate::Resources::default();
            for p in &c.pods {
                used.add(&p.requests);
            }
            let a = &c.node.allocatable;
            let share = |u: i64, t: i64| if t > 0 { u as f64 / t as f64 } else { 1.0 };
            (share(used.cpu_milli, a.cpu_milli).max(share(used.memory_bytes, a.memory_bytes)), i)
        })
        .filter(|(u, _)| *u < UNDERUTILIZED_BELOW)
        .collect();
    under.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut removed: Vec<&str> = drained.iter().map(|&i| candidates[i].node.name.as_str()).collect();
    for &(_, i) in under.iter().take(MAX_CONSOLIDATION_CANDIDATES) {
        let c = &candidates[i];
        if let Some(p) = c.pods.iter().find(|p| p.do_not_disrupt) {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("pod {} must not be disrupted", p.key()) });
            continue;
        }
        if let Some(p) = c.pods.iter().find(|p| p.owner.is_none()) {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("pod {} has no controller to recreate it", p.key()) });
            continue;
        }
        let (nodes, disrupting) = pool_nodes.get(c.pool.name.as_str()).copied().unwrap_or_default();
        let used = drains_by_pool.get(&c.pool.name).copied().unwrap_or(0);
        if budget_left(c.pool, DisruptionReason::Underutilized, nodes, disrupting, now_s) <= used {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("disruption budget of NodePool {} is used up", c.pool.name) });
            continue;
        }
        // PodDisruptionBudgets must allow every eviction of the drain now.
        let mut needed = vec![0i64; snapshot.pdbs.len()];
        for p in &c.pods {
            for (k, pdb) in snapshot.pdbs.iter().enumerate() {
                if pdb.namespace == p.namespace && pdb.selector.matches(&p.labels) {
                    needed[k] += 1;
                }
            }
        }
        if let Some(k) = (0..needed.len()).find(|&k| needed[k] > pdb_left[k]) {
            let pdb = &snapshot.pdbs[k];
            out.held.push(Held {
                subject: c.node.name.clone(),
                why: format!("PodDisruptionBudget {}/{} allows {} more evictions, the drain needs {}", pdb.namespace, pdb.name, pdb_left[k], needed[k]),
            });
            continue;
        }
        // Its pods move onto the others' free capacity: the pool loses the
        // node's whole allocatable.
        if !headroom.take(&c.pool.name, &c.node.allocatable) {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("kept for the headroom of NodePool {}", c.pool.name) });
            continue;
        }
        // Re-simulate: the node gone, its pods pending, no new servers.
        let mut trial = snapshot.clone();
        removed.push(c.node.name.as_str());
        trial.nodes.retain(|n| !removed.contains(&n.name.as_str()));
        trial.servers.clear();
        trial.claims.clear();
        let moved: Vec<String> = c.pods.iter().map(|p| p.key()).collect();
        for p in trial.pods.iter_mut() {
            if p.node_name.as_deref().is_some_and(|n| removed.contains(&n)) {
                p.node_name = None;
                p.phase = PodPhase::Pending;
            } else if p.node_name.is_none() {
                // Pods already pending are scale-up's business.
                p.phase = PodPhase::Succeeded;
            }
        }
        let plan = provision(&trial, now_s);
        let all_fit = plan.pods.iter().all(|d| matches!(d.outcome, Outcome::Existing { .. }));
        if !all_fit {
            removed.pop();
            headroom.give(&c.pool.name, &c.node.allocatable);
            out.held.push(Held { subject: c.node.name.clone(), why: "its pods do not all fit on the other nodes".into() });
            continue;
        }
        for (k, n) in needed.iter().enumerate() {
            pdb_left[k] -= n;
        }
        *drains_by_pool.entry(c.pool.name.clone()).or_default() += 1;
        out.actions.push(Action::Drain {
            node: c.node.name.clone(),
            server: c.server.map(|s| s.name.clone()),
            pool: c.pool.name.clone(),
            reason: DisruptionReason::Underutilized,
            evict: moved,
            daemonset_pods: c.daemonset_pods.iter().map(|p| p.key()).collect(),
            saves_watts: c.server.map_or(0.0, |s| s.power.idle_watts - s.power.off_watts),
        });
    }

    // Pools short of their headroom power spares on, largest first.
    let powering: Vec<String> = out
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::PowerOn { server, .. } => Some(server.clone()),
            _ => None,
        })
        .collect();
    for pool in pools.iter().filter(|p| p.warm.headroom.is_some()) {
        for s in &powering {
            if let Some(server) = servers.get(s.as_str())
                && pool_of(pools, server, None).is_some_and(|p| p.name == pool.name)
            {
                headroom.give(&pool.name, &server.capacity);
            }
        }
        let mut cold: Vec<&Server> = snapshot
            .servers
            .iter()
            .filter(|s| s.is_available() && !s.is_warm() && !powering.contains(&s.name))
            .filter(|s| pool_of(pools, s, None).is_some_and(|p| p.name == pool.name))
            .collect();
        cold.sort_by(|a, b| {
            b.capacity.cpu_milli.cmp(&a.capacity.cpu_milli).then(a.power.idle_watts.total_cmp(&b.power.idle_watts)).then(a.name.cmp(&b.name))
        });
        for s in cold {
            let Some(short) = headroom.short(&pool.name) else { break };
            if snapshot.power_budget_watts.is_some_and(|b| fleet_on_peak + s.power.peak_watts > b) {
                out.held.push(Held { subject: s.name.clone(), why: format!("NodePool {} is short of its headroom by {short}, but the power budget is reached", pool.name) });
                break;
            }
            fleet_on_peak += s.power.peak_watts;
            headroom.give(&pool.name, &s.capacity);
            out.actions.push(Action::PowerOnForHeadroom { server: s.name.clone(), pool: pool.name.clone(), short });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    #[test]
    fn break_even_is_boot_energy_over_idle_savings() {
        let mut s = Server::new("s", Resources::new(1000, 1));
        s.power = PowerProfile { idle_watts: 210.0, peak_watts: 400.0, boot_watts: 300.0, off_watts: 10.0 };
        s.durations.power_on_s = 60;
        s.durations.boot_s = 540;
        // 300 W x 600 s / 200 W = 900 s.
        assert_eq!(break_even_s(&s), 900);
    }
}
