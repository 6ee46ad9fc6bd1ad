//! Scale-down: which idle servers to power off, which nodes to drain, and
//! which warm spares to power on, within warm-spare floors, disruption
//! budgets and PodDisruptionBudgets.
//!
//! # Replace underutilized nodes by one server that draws less
//! Underutilized nodes whose pods fit on no other node may still fit, all
//! together, on one idle server of their pool that draws clearly fewer
//! watts than they do with those pods: its idle watts, plus what their
//! GPUs draw where the servers state it ([`PowerProfile::compared_watts`]).
//! Several nodes onto one larger server, or one node onto a server of
//! another kind, as a hungry GPU server onto one whose GPUs draw less.
//! That server is powered on (or, already on, kept on); nothing is drained
//! until it is a Ready node, when the underutilized consolidation finds
//! room for their pods on it and drains them one by one, each under the
//! budgets and PodDisruptionBudgets.
//!
//! # Power off only when it pays
//! Powering a server off and on again costs its boot energy. An idle server
//! becomes a candidate once it has idled longer than its break-even time:
//! boot energy (boot watts over the measured power-on and boot stages)
//! divided by what it saves per second off (idle minus standby watts). A
//! ServerPool's `consolidateAfter` can only lengthen that.
//!
//! # Guarantees
//! - No node with a pod that must not be disrupted (do-not-disrupt, a
//!   do-not-disrupt duration not yet run out, or a pod no controller would
//!   recreate) is drained, nor a Node that says do-not-disrupt itself.
//! - Across the whole plan, no PodDisruptionBudget allows fewer evictions
//!   than the plan makes.
//! - Per class, the idle powered-on servers (warm spares and empty nodes)
//!   left on are at least the floor, or all there were. A node whose
//!   claim is still in flight is not idle: its room is its pods'.
//! - Per ServerPool and reason, nodes being disrupted never exceed the most
//!   restrictive active budget.
//! - Only servers with no node are powered off directly; a node's server is
//!   powered off after its drain.
//! - Per ServerPool with a headroom, no power-off or drain takes the pool's
//!   free capacity (on its nodes and warm spares) below it; when it is
//!   already below, spares are powered on.
//! - The floor of a class is its static floor, raised by the adaptive
//!   floor and its daily profile ([`crate::warm`]) where the pool enables
//!   it; a floor the profile raised says so where it keeps a spare.
//! - An underutilized node is one below [`UNDERUTILIZED_BELOW`] of every
//!   resource its node offers, GPUs and other extended resources included.
//!   Its pods move only onto nodes already running pods, after the pods
//!   already pending have taken the room they fit: an empty node is warm
//!   capacity, not room (except a server kept on as a replacement).
//! - No underutilized node is drained and no replacement is powered on in
//!   a ServerPool that powered a server on for pods (a recorded arrival)
//!   less than its `consolidateAfter` ago, [`GROWTH_QUIET_S`] when unset:
//!   a pool still growing would power the freed server on again.
//! - A replacement replaces nodes with no pod that must stay, whose
//!   evictions their PodDisruptionBudgets allow now, while the pool's
//!   budget allows a drain and no drain of the pool is under way; a node
//!   alone only if its pods fit on no node that stays; all their pods fit
//!   on it, as the scheduler would place them; with their pods it draws at
//!   most [`REPLACEMENT_MAX_SHARE`] of their watts; it stays within the
//!   fleet's power budget. A server kept on as a replacement is neither
//!   powered off nor counted as a warm spare.
//! - Every power-on and power-off it plans (a drain's power-off counted
//!   when the drain is planned) keeps within the transition rates, and no
//!   server at its cap of power cycles a day is powered off or drained
//!   ([`crate::transitions`]); with that cap set, a spare to restore a
//!   floor is the least worn of the most efficient.

use crate::model::*;
use crate::outcome::Outcome;
use crate::provision::provision;
use crate::warm::{Membership, class_name, pool_of};
use foldhash::{HashMap, HashMapExt};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Power a spare on to restore the warm floor of its class; `prewarm`
    /// names the recurring ramp when the daily profile raised the floor.
    /// With `join`, the floor is kept as Ready nodes ([`crate::warm::Floor::nodes`]):
    /// the spare is opened a claim of no pods, so it joins and passes its
    /// gates now, not when a pod comes (a server already on only joins).
    PowerOn {
        server: String,
        pool: String,
        class: String,
        floor: u32,
        on: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        prewarm: Option<String>,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        join: bool,
    },
    /// Power a spare on because the pool's free capacity is short of its
    /// headroom (`short` says by what).
    PowerOnForHeadroom { server: String, pool: String, short: String },
    /// Power a server on to take over the pods of underutilized nodes that
    /// fit nowhere else and together draw more watts with them. Nothing
    /// is drained yet: once the server is a Ready node, the underutilized
    /// consolidation moves their pods onto it, each drain under the usual
    /// budgets and PodDisruptionBudgets.
    PowerOnForReplacement { server: String, pool: String, replaces: Vec<String>, watts_saved: f64 },
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
    /// The nodes that are to carry [`EMPTYING_TAINT`], with why: new pods
    /// avoid them so they empty by attrition. A node not named here is to
    /// carry none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub emptying: BTreeMap<String, String>,
    /// [`next_candidate_s`] of the same snapshot, reckoned with what the
    /// pass already worked out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_candidate_s: Option<Seconds>,
}

/// Seconds of idling that cost as much energy as one power cycle.
pub fn break_even_s(server: &Server) -> Seconds {
    let p = &server.power;
    let saved_per_s = (p.idle_watts - p.off_watts).max(1.0);
    let boot_joules = p.boot_watts * (server.durations.power_on_s + server.durations.boot_s) as f64;
    (boot_joules / saved_per_s).ceil() as Seconds
}

/// How long an empty node of `pool` on `server` must idle before it is
/// drained: its break-even time, lengthened by the pool's `consolidateAfter`.
pub fn empty_node_threshold_s(server: &Server, pool: &ServerPool) -> Seconds {
    break_even_s(server).max(pool.disruption.consolidate_after_s.unwrap_or(0))
}

/// The earliest time after `now_s` at which an idle server of the snapshot
/// (a warm spare, or an empty node) idles past its threshold, a pod's
/// do-not-disrupt duration runs out, or a pool's quiet time after growth
/// ends. Until then, with nothing else changed, the plan stays the same: a
/// runner that asks [`disrupt`] only when something changed asks again by
/// then.
pub fn next_candidate_s(snapshot: &Snapshot, now_s: Seconds) -> Option<Seconds> {
    let m = Membership::of(snapshot);
    next_candidate_with(snapshot, now_s, &last_growth_by_pool(snapshot, &m))
}

/// [`next_candidate_s`], given each pool's last growth.
fn next_candidate_with(snapshot: &Snapshot, now_s: Seconds, last_growth: &HashMap<&str, Seconds>) -> Option<Seconds> {
    let nodes: HashMap<&str, &Node> = snapshot.nodes.iter().filter_map(|n| Some((n.server.as_deref()?, n))).collect();
    snapshot
        .servers
        .iter()
        .filter_map(|s| {
            let since = s.idle_since_s?;
            let threshold = match nodes.get(s.name.as_str()) {
                Some(n) => empty_node_threshold_s(s, pool_of(&snapshot.pools, s, Some(n))?),
                None => break_even_s(s),
            };
            let at = since.saturating_add(threshold);
            (at > now_s).then_some(at)
        })
        .chain(snapshot.pods.iter().filter_map(|p| p.do_not_disrupt_until_s.filter(|&t| t > now_s)))
        .chain(
            // When each pool's quiet time after its last growth ends.
            snapshot
                .pools
                .iter()
                .filter_map(|p| last_growth.get(p.name.as_str()).map(|&t| t.saturating_add(growth_quiet_s(p))))
                .filter(|&t| t > now_s),
        )
        .min()
}

/// How many more nodes of the pool may be disrupted now for this reason.
fn budget_left(pool: &ServerPool, reason: DisruptionReason, nodes: u32, disrupting: u32, now_s: Seconds) -> u32 {
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
    /// Of `left`, the capacity of spares still powering on: counted when
    /// powering more on, not when giving confirmed capacity up.
    coming: BTreeMap<String, crate::Resources>,
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
        let coming = self.coming.get(pool).cloned().unwrap_or_default();
        let Some(left) = self.left.get_mut(pool) else { return true };
        left.sub(capacity);
        left.sub(&coming);
        let short = self.short(pool).is_some();
        if let Some(l) = self.left.get_mut(pool) {
            l.add(&coming);
            if short {
                l.add(capacity);
            }
        }
        !short
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
    pool: &'s ServerPool,
    pods: Vec<&'s Pod>,
    daemonset_pods: Vec<&'s Pod>,
}

impl Candidate<'_> {
    /// What its workload pods request together.
    fn requested(&self) -> crate::Resources {
        let mut used = crate::Resources::default();
        for p in &self.pods {
            used.add(&p.requests);
        }
        used
    }

    /// Its allocatable less what every pod on it requests, DaemonSet pods
    /// included: below zero where it is overcommitted.
    fn free(&self) -> crate::Resources {
        let mut free = self.node.allocatable.clone();
        for p in self.pods.iter().chain(&self.daemonset_pods) {
            free.sub(&p.requests);
        }
        free
    }

    /// The larger of the cpu and memory shares its workload pods request.
    fn utilization(&self) -> f64 {
        let used = self.requested();
        let a = &self.node.allocatable;
        let share = |u: i64, t: i64| if t > 0 { u as f64 / t as f64 } else { 1.0 };
        // Extended resources (GPUs) count as cpu and memory do: a node whose
        // GPUs are taken is not underutilized because its cpu is idle.
        let extended = a.extended.iter().filter(|(_, t)| *t > 0).map(|(name, t)| share(used.extended(name), *t)).fold(0.0, f64::max);
        share(used.cpu_milli, a.cpu_milli).max(share(used.memory_bytes, a.memory_bytes)).max(extended)
    }

    /// What its server draws idle above standby: what powering it off saves.
    fn saves_watts(&self) -> f64 {
        self.server.map_or(0.0, |s| s.power.idle_watts - s.power.off_watts)
    }
}

/// A pool that had to power a server on for pods less than this long ago
/// is still growing: moving pods together there would free a server the
/// next arrival powers on again, a boot and a wait for nothing.
pub const GROWTH_QUIET_S: Seconds = 4 * 3600;

/// How long after powering a server on for pods `pool` waits before it
/// consolidates: its `consolidateAfter`, else [`GROWTH_QUIET_S`]. A
/// runner must record the arrivals of at least that long.
pub fn growth_quiet_s(pool: &ServerPool) -> Seconds {
    pool.disruption.consolidate_after_s.unwrap_or(GROWTH_QUIET_S)
}

/// The last time each ServerPool opened a server for pods, from the
/// recorded arrivals.
fn last_growth_by_pool<'s>(snapshot: &'s Snapshot, m: &Membership<'s>) -> HashMap<&'s str, Seconds> {
    let mut last: HashMap<&str, Seconds> = HashMap::new();
    for a in &snapshot.arrivals {
        if let Some(pool) = m.index(&a.server).and_then(|i| m.pool(i)) {
            let t = last.entry(pool.name.as_str()).or_insert(a.at_s);
            *t = (*t).max(a.at_s);
        }
    }
    last
}

/// Why the underutilized nodes of `pool` are not consolidated yet: the
/// pool powered a server on for pods less than its `consolidateAfter` ago
/// (unset: [`GROWTH_QUIET_S`]).
fn still_growing(pool: &ServerPool, last: Option<Seconds>, now_s: Seconds) -> Option<String> {
    let quiet = growth_quiet_s(pool);
    let ago = now_s.saturating_sub(last?);
    (ago < quiet).then(|| format!("ServerPool {} powered a server on for pods {ago}s ago; it consolidates {quiet}s after that", pool.name))
}

/// Evictions a drain of the node makes, per PodDisruptionBudget.
fn evictions_by_pdb(snapshot: &Snapshot, c: &Candidate<'_>) -> Vec<i64> {
    let mut needed = vec![0i64; snapshot.pdbs.len()];
    for p in &c.pods {
        for (k, pdb) in snapshot.pdbs.iter().enumerate() {
            if pdb.namespace == p.namespace && pdb.selector.matches(&p.labels) {
                needed[k] += 1;
            }
        }
    }
    needed
}

/// Why the node's pods cannot be evicted now, if they cannot: a pod that
/// must not be disrupted, one no controller would recreate, or a
/// PodDisruptionBudget with too few disruptions left.
fn drain_blocker(snapshot: &Snapshot, c: &Candidate<'_>, pdb_left: &[i64], now_s: Seconds) -> Option<String> {
    if c.node.do_not_disrupt {
        return Some(NODE_SAYS_DO_NOT_DISRUPT.to_string());
    }
    if let Some(p) = c.pods.iter().find(|p| p.do_not_disrupt) {
        return Some(format!("pod {} must not be disrupted", p.key()));
    }
    if let Some(p) = c.pods.iter().find(|p| p.protected_at(now_s)) {
        let until = p.do_not_disrupt_until_s.unwrap_or(now_s);
        return Some(format!("pod {} must not be disrupted for {}s more (karpenter.sh/do-not-disrupt)", p.key(), until - now_s));
    }
    if let Some(p) = c.pods.iter().find(|p| p.owner.is_none()) {
        return Some(format!("pod {} has no controller to recreate it", p.key()));
    }
    let needed = evictions_by_pdb(snapshot, c);
    let k = (0..needed.len()).find(|&k| needed[k] > pdb_left[k])?;
    let pdb = &snapshot.pdbs[k];
    Some(format!("PodDisruptionBudget {}/{} allows {} more evictions, the drain needs {}", pdb.namespace, pdb.name, pdb_left[k], needed[k]))
}

/// The soft taint (`PreferNoSchedule`) on a node chosen to empty by
/// attrition: kube-scheduler puts new pods there only when no other node
/// has room, so an underutilized node's pods finish or move on their own
/// and it empties with no eviction.
pub const EMPTYING_TAINT: &str = "ironclaim.dev/emptying";

/// The nodes to carry [`EMPTYING_TAINT`], with why, by node name: per
/// ServerPool that consolidates and has not grown for its quiet time
/// ([`growth_quiet_s`]), one underutilized node with pods (the one already
/// marked, else the emptiest), if the pool's other nodes with pods have
/// room for all its pods together. A marked node that has emptied keeps
/// its mark until it is powered off, kept as a spare or is room a pending
/// pod waits for. Never a node that says do-not-disrupt, a node not
/// Ready, nor one whose claim is in flight. One at a time: each node that
/// empties is a server powered off, and the room the next burst finds on
/// running nodes is that much smaller.
fn emptying(candidates: &[Candidate<'_>], in_flight: &[&str], awaited: &BTreeMap<String, String>, growing: &[&str]) -> BTreeMap<String, String> {
    let marked = |c: &Candidate<'_>| c.node.taints.iter().any(|t| t.key == EMPTYING_TAINT);
    let steady = |c: &Candidate<'_>| {
        c.node.ready
            && !c.node.do_not_disrupt
            && !c.pool.disruption.never
            && c.pool.disruption.empty_by_attrition
            && c.server.is_some_and(|s| !in_flight.contains(&s.name.as_str()))
            && !awaited.contains_key(&c.node.name)
    };
    let mut out = BTreeMap::new();
    let mut pools: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, c) in candidates.iter().enumerate().filter(|(_, c)| steady(c)) {
        if c.pods.is_empty() {
            if marked(c) {
                out.insert(c.node.name.clone(), "empty, on its way to being powered off".to_string());
            }
            continue;
        }
        pools.entry(c.pool.name.as_str()).or_default().push(i);
    }
    for (pool, nodes) in pools {
        if growing.contains(&pool) {
            continue;
        }
        let mut under: Vec<(bool, f64, usize)> =
            nodes.iter().map(|&i| (!marked(&candidates[i]), candidates[i].utilization(), i)).filter(|&(_, u, _)| u < UNDERUTILIZED_BELOW).collect();
        under.sort_by(|a, b| a.0.cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.cmp(&b.2)));
        let free_of = |c: &Candidate<'_>| c.free().max_with(&crate::Resources::default());
        let mut free = crate::Resources::default();
        for &i in &nodes {
            free.add(&free_of(&candidates[i]));
        }
        // The first whose pods fit in the room of the others.
        let fits = |c: &Candidate<'_>| c.requested().fits(&free.minus(&free_of(c)));
        if let Some(&(_, u, i)) = under.iter().find(|&&(_, _, i)| fits(&candidates[i])) {
            let why = format!("{:.0} % used; its pods fit on the other nodes of ServerPool {pool}", u * 100.0);
            out.insert(candidates[i].node.name.clone(), why);
        }
    }
    out
}

/// Why a Node that says do-not-disrupt is held.
const NODE_SAYS_DO_NOT_DISRUPT: &str =
    "the Node says do-not-disrupt (karpenter.sh/do-not-disrupt or cluster-autoscaler.kubernetes.io/scale-down-disabled)";

/// A replacement pays only when the server, with their pods, draws at most
/// this share of what the nodes it replaces draw together
/// ([`PowerProfile::compared_watts`]: idle watts, and the GPUs' stated
/// draw).
pub const REPLACEMENT_MAX_SHARE: f64 = 0.8;
/// Distinct servers tried as a replacement, per pool and decision.
pub const MAX_REPLACEMENT_TARGETS: usize = 8;

/// A server that could take over the pods of underutilized nodes.
#[derive(Clone, Copy)]
struct Target<'s> {
    server: &'s Server,
    /// Already an empty node.
    node: Option<&'s Node>,
    daemonset_pods: &'s [&'s Pod],
}

struct Replacement<'s> {
    target: Target<'s>,
    /// Candidates, by index.
    replaces: Vec<usize>,
    watts_saved: f64,
}

/// Whether every pod of `nodes` would run on the target alone, as the
/// core's scheduler places them there (DaemonSets, taints, affinity and
/// spread among themselves included).
fn all_fit_on(snapshot: &Snapshot, candidates: &[Candidate<'_>], nodes: &[usize], target: Target<'_>, now_s: Seconds) -> bool {
    let mut trial = Snapshot { pools: snapshot.pools.clone(), daemonsets: snapshot.daemonsets.clone(), ..Default::default() };
    match target.node {
        Some(node) => {
            // A node still on its way to Ready is the capacity it will be.
            trial.nodes.push(Node { ready: true, ..node.clone() });
            trial.pods.extend(target.daemonset_pods.iter().map(|p| (*p).clone()));
        }
        None => trial.servers.push(target.server.clone()),
    }
    for &i in nodes {
        for p in &candidates[i].pods {
            let mut moved = (*p).clone();
            moved.node_name = None;
            moved.phase = PodPhase::Pending;
            trial.pods.push(moved);
        }
    }
    let plan = provision(&trial, now_s);
    plan.pods.iter().all(|d| matches!(d.outcome, Outcome::Existing { .. } | Outcome::NewClaim { .. }))
}

/// Whether the pods of the `removed` nodes all fit on the nodes that stay,
/// as the scheduler would place them, after the pods already pending have
/// taken the room they fit: no new server. `ready` names a node to take
/// as Ready.
fn fit_on_the_rest(snapshot: &Snapshot, removed: &[&str], ready: Option<&str>, now_s: Seconds) -> bool {
    let mut trial = snapshot.clone();
    trial.nodes.retain(|n| !removed.contains(&n.name.as_str()));
    if let Some(n) = trial.nodes.iter_mut().find(|n| Some(n.name.as_str()) == ready) {
        n.ready = true;
    }
    trial.servers.clear();
    trial.claims.clear();
    // The moved pods are made again, after every pod already pending: those
    // take the room they fit first, as the scheduler's queue gives it them.
    let mut moved: Vec<String> = Vec::new();
    let last = trial.pods.iter().map(|p| p.created_s).max().unwrap_or(0).max(now_s);
    for p in trial.pods.iter_mut_where(|p| p.node_name.as_deref().is_some_and(|n| removed.contains(&n))) {
        p.node_name = None;
        p.phase = PodPhase::Pending;
        p.created_s = last;
        moved.push(p.key());
    }
    let plan = provision(&trial, now_s);
    plan.pods.iter().filter(|d| moved.contains(&d.pod)).all(|d| matches!(d.outcome, Outcome::Existing { .. }))
}

/// The replacement that saves the most watts: for each target (cheapest
/// idle first, one per kind of hardware), the underutilized nodes taken in
/// order while all their pods still fit on it; one node only if `alone`
/// says so, and the target drawing, with their pods, at most
/// [`REPLACEMENT_MAX_SHARE`] of what they draw.
fn best_replacement<'s>(
    snapshot: &Snapshot,
    candidates: &[Candidate<'s>],
    eligible: &[usize],
    mut targets: Vec<Target<'s>>,
    alone: &dyn Fn(usize) -> bool,
    now_s: Seconds,
) -> Option<Replacement<'s>> {
    let eligible: Vec<usize> = eligible.iter().copied().filter(|&i| candidates[i].server.is_some()).collect();
    if eligible.is_empty() {
        return None;
    }
    targets.sort_by(|a, b| {
        a.server
            .power
            .idle_watts
            .total_cmp(&b.server.power.idle_watts)
            .then(a.server.failures.cmp(&b.server.failures))
            .then(a.server.name.cmp(&b.server.name))
    });
    // Identical cold servers give identical answers: try one of each.
    let mut kinds: Vec<String> = Vec::new();
    targets.retain(|t| {
        let kind =
            format!("{:?}|{:?}|{:?}|{:?}|{:?}", t.node.map(|n| &n.name), t.server.capacity, t.server.power, t.server.labels, t.server.power_state);
        if kinds.contains(&kind) {
            return false;
        }
        kinds.push(kind);
        true
    });
    let mut best: Option<Replacement<'s>> = None;
    for target in targets.into_iter().take(MAX_REPLACEMENT_TARGETS) {
        let mut replaces: Vec<usize> = Vec::new();
        for &i in &eligible {
            replaces.push(i);
            if !all_fit_on(snapshot, candidates, &replaces, target, now_s) {
                replaces.pop();
            }
        }
        if replaces.is_empty() || (replaces.len() == 1 && !alone(replaces[0])) {
            continue;
        }
        // An empty node is kept on only if the consolidation will drain
        // onto it: the same re-simulation, with every other node there.
        if let Some(node) = target.node {
            let removed: Vec<&str> = replaces.iter().map(|&i| candidates[i].node.name.as_str()).collect();
            if !fit_on_the_rest(snapshot, &removed, Some(node.name.as_str()), now_s) {
                continue;
            }
        }
        // Each replaced server with the GPUs its pods take, as the core
        // compares servers ([`PowerProfile::compared_watts`]).
        let replaced: Vec<(&Server, i64)> =
            replaces.iter().filter_map(|&i| candidates[i].server.map(|s| (s, candidates[i].requested().gpu_milli()))).collect();
        let before: f64 = replaced.iter().map(|(s, gpu_milli)| s.power.compared_watts(&s.capacity, *gpu_milli)).sum();
        let off: f64 = replaced.iter().map(|(s, _)| s.power.off_watts).sum();
        let (p, cap) = (&target.server.power, &target.server.capacity);
        let after = p.compared_watts(cap, replaced.iter().map(|(_, gpu_milli)| gpu_milli).sum());
        let watts_saved = (before - off) - (after - p.off_watts);
        if after > REPLACEMENT_MAX_SHARE * before || watts_saved <= 0.0 {
            continue;
        }
        if best.as_ref().is_none_or(|b| watts_saved > b.watts_saved) {
            best = Some(Replacement { target, replaces, watts_saved });
        }
    }
    best
}

fn pending_room(pod: &str) -> String {
    format!("the room pending pod {pod} fits in, until the scheduler binds it")
}

/// The empty nodes (no workload pod on them) some pending pod fits on, each
/// with one such pod: a plan of the pending pods over those nodes alone.
/// Cheap at any fleet size (the busy nodes and their pods stay out), and
/// on the side of keeping: a pod that would rather land on a busy node
/// holds an empty one it fits all the same. A Ready node still carrying
/// the node lifecycle controller's `not-ready` or `unreachable` taint
/// counts without it: a node just registered keeps it some seconds after
/// it is Ready (longer on a busy control plane), and the pod lands there
/// once it clears.
fn empty_nodes_pending_pods_fit(snapshot: &Snapshot, now_s: Seconds) -> Vec<(String, String)> {
    let working: std::collections::HashSet<&str> =
        snapshot.pods.iter().filter(|p| p.occupies_node() && !p.is_daemonset_pod()).filter_map(|p| p.node_name.as_deref()).collect();
    let empty: std::collections::HashSet<&str> = snapshot.nodes.iter().map(|n| n.name.as_str()).filter(|n| !working.contains(n)).collect();
    if empty.is_empty() {
        return Vec::new();
    }
    let reduced = Snapshot {
        nodes: snapshot
            .nodes
            .iter()
            .filter(|n| empty.contains(n.name.as_str()))
            .map(|n| {
                let mut n = n.clone();
                if n.ready {
                    n.taints.retain(|t| !crate::predicates::LIFECYCLE_TAINTS.contains(&t.key.as_str()));
                }
                n
            })
            .collect(),
        servers: snapshot.servers.iter().filter(|s| s.node.as_deref().is_some_and(|n| empty.contains(n))).cloned().collect(),
        pods: snapshot.pods.iter().filter(|p| p.is_pending_demand() || p.node_name.as_deref().is_some_and(|n| empty.contains(n))).cloned().collect(),
        namespaces: snapshot.namespaces.clone(),
        daemonsets: snapshot.daemonsets.clone(),
        pools: snapshot.pools.clone(),
        ..Snapshot::default()
    };
    provision(&reduced, now_s)
        .pods
        .into_iter()
        .filter_map(|d| match d.outcome {
            Outcome::Existing { node } => Some((node, d.pod)),
            _ => None,
        })
        .collect()
}

/// Decides the scale-down half of a plan. Pure: same inputs, same output.
/// Pods waiting for an in-place resize count as demand for room at their
/// new size, as pending pods do ([`crate::resize`]).
/// An empty node such a pod would land on is the room it waits for (it
/// moves once VPA, or whoever asked, evicts or recreates it): not idle. So
/// is one a gang's pending pod would land on ([`crate::gang`]): the room
/// is booked for the gang's pods, on their way; and one any pending pod
/// would land on, until the scheduler binds it.
pub fn disrupt(snapshot: &Snapshot, now_s: Seconds) -> Disruption {
    let expanded = crate::resize::with_demand(snapshot);
    let mut awaited: BTreeMap<String, String> = BTreeMap::new();
    let gangs: BTreeMap<String, &str> =
        snapshot.pods.iter().filter(|p| p.is_demand()).filter_map(|p| p.gang.as_deref().map(|g| (p.key(), g))).collect();
    let pending = snapshot.pods.iter().any(Pod::is_pending_demand);
    if matches!(expanded, std::borrow::Cow::Owned(_)) || !gangs.is_empty() {
        for d in provision(snapshot, now_s).pods {
            match (&d.resize, d.outcome, gangs.get(&d.pod)) {
                (Some(wait), Outcome::Existing { node }, _) => {
                    awaited.entry(node).or_insert_with(|| format!("the room pod {} waits for: {wait}", d.pod));
                }
                // A gang's room, booked: its pods are on their way.
                (None, Outcome::Existing { node }, Some(gang)) => {
                    awaited.entry(node).or_insert_with(|| format!("the room booked for {gang}"));
                }
                (None, Outcome::Existing { node }, None) => {
                    awaited.entry(node).or_insert_with(|| pending_room(&d.pod));
                }
                _ => {}
            }
        }
    } else if pending {
        for (node, pod) in empty_nodes_pending_pods_fit(snapshot, now_s) {
            awaited.entry(node).or_insert_with(|| pending_room(&pod));
        }
    }
    disrupt_expanded(&expanded, &awaited, now_s)
}

fn disrupt_expanded(snapshot: &Snapshot, awaited: &BTreeMap<String, String>, now_s: Seconds) -> Disruption {
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
    let m = Membership::of(snapshot);
    let mut classes: BTreeMap<(&str, std::borrow::Cow<'_, str>), ClassState<'_>> = BTreeMap::new();
    for (i, s) in snapshot.servers.iter().enumerate() {
        if s.is_available() {
            let key = (m.pool(i).map_or("", |p| p.name.as_str()), std::borrow::Cow::Borrowed(m.class(i)));
            let st = classes.entry(key).or_default();
            if s.power_state == PowerState::On {
                st.spares.push(s);
            } else {
                st.cold.push(s);
            }
        }
    }
    // A node whose claim is still in flight is room its claim's pods are
    // waiting for, not idle capacity.
    let in_flight: Vec<&str> = snapshot.claims.iter().map(|c| c.server.as_str()).collect();
    for (i, c) in candidates.iter().enumerate() {
        if c.pods.is_empty()
            && let Some(why) = awaited.get(&c.node.name)
        {
            out.held.push(Held { subject: c.node.name.clone(), why: why.clone() });
            continue;
        }
        if c.pods.is_empty()
            && let Some(s) = c.server
            && !in_flight.contains(&s.name.as_str())
        {
            let key = (c.pool.name.as_str(), class_name(s, Some(c.pool)));
            classes.entry(key).or_default().empty_nodes.push(i);
        }
    }
    let floors = crate::warm::floors_of(snapshot, &m, now_s);

    let mut headroom = Headroom { left: BTreeMap::new(), wanted: BTreeMap::new(), coming: BTreeMap::new() };
    // The pods claims in flight wait for, by key: only where a headroom
    // needs them.
    let unbound: std::collections::HashMap<String, &Pod> = if pools.iter().any(|p| p.warm.headroom.is_some()) && !snapshot.claims.is_empty() {
        snapshot.pods.iter().filter(|p| p.node_name.is_none()).map(|p| (p.key(), p)).collect()
    } else {
        Default::default()
    };
    for pool in pools {
        let Some(want) = &pool.warm.headroom else { continue };
        let mut free = crate::Resources::default();
        for c in candidates.iter().filter(|c| c.pool.name == pool.name && c.node.ready) {
            free.add(&c.free());
        }
        let mut coming = crate::Resources::default();
        for (i, s) in snapshot.servers.iter().enumerate().filter(|(_, s)| s.is_available() && s.is_warm()) {
            if m.in_pool(i, pool) {
                free.add(&s.capacity);
                if s.powering_on {
                    coming.add(&s.capacity);
                }
            }
        }
        // A server on its way to being a node for a claim in flight (a
        // spare claimed to be a node, or a server opened for pods): the
        // room its claim's pods leave is coming, counted like a spare
        // powering on, so the same room is not powered on twice.
        for claim in snapshot.claims.iter().filter(|c| c.pool == pool.name) {
            let Some(i) = m.index(&claim.server) else { continue };
            let server = &snapshot.servers[i];
            let mut room = server.capacity.clone();
            if let Some(c) = candidates.iter().find(|c| c.server.is_some_and(|s| s.name == server.name)) {
                if c.node.ready {
                    continue; // counted above
                }
                room = c.free();
            }
            for p in claim.pods.iter().filter_map(|k| unbound.get(k.as_str())) {
                room.sub(&p.requests);
            }
            let room = room.max_with(&crate::Resources::default());
            free.add(&room);
            coming.add(&room);
        }
        headroom.coming.insert(pool.name.clone(), coming);
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
    let mut gate = crate::transitions::Gate::new(snapshot, now_s);
    let wear_counts = snapshot.transition_limits.max_cycles_per_day.is_some();
    let underutilized_budget_left = |pool: &ServerPool, drains_by_pool: &BTreeMap<String, u32>| {
        let (nodes, disrupting) = pool_nodes.get(pool.name.as_str()).copied().unwrap_or_default();
        let used = drains_by_pool.get(&pool.name).copied().unwrap_or(0);
        budget_left(pool, DisruptionReason::Underutilized, nodes, disrupting, now_s).saturating_sub(used)
    };

    // Underutilized nodes, emptiest first.
    let mut under: Vec<(f64, usize)> = candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.pods.is_empty() && !c.pool.disruption.never)
        .map(|(i, c)| (c.utilization(), i))
        .filter(|(u, _)| *u < UNDERUTILIZED_BELOW)
        .collect();
    under.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    under.truncate(MAX_CONSOLIDATION_CANDIDATES);
    // Underutilized nodes of a pool that could be drained now, were there room.
    let replaceable = |pool: &ServerPool, pdb_left: &[i64], skip: &[usize]| -> Vec<usize> {
        under
            .iter()
            .map(|&(_, i)| i)
            .filter(|i| candidates[*i].pool.name == pool.name && !skip.contains(i))
            .filter(|&i| drain_blocker(snapshot, &candidates[i], pdb_left, now_s).is_none())
            .collect()
    };

    // A node is replaced on its own only when its pods fit on no node that
    // stays (an empty node is warm capacity, not room): else draining it
    // frees its server with no other on.
    let empty_nodes: Vec<&str> = candidates.iter().filter(|c| c.pods.is_empty()).map(|c| c.node.name.as_str()).collect();
    let stuck = std::cell::RefCell::new(BTreeMap::<usize, bool>::new());
    let alone = |i: usize| {
        *stuck.borrow_mut().entry(i).or_insert_with(|| {
            let mut removed = empty_nodes.clone();
            removed.push(candidates[i].node.name.as_str());
            !fit_on_the_rest(snapshot, &removed, None, now_s)
        })
    };

    // An idle server already on that could take over underutilized nodes
    // stays on, not counted as a spare, until they are drained onto it.
    let mut kept_for_replacement: BTreeMap<&str, String> = BTreeMap::new();
    let mut replacing_pools: Vec<&str> = Vec::new();
    let last_growth = last_growth_by_pool(snapshot, &m);
    let growing = |pool: &ServerPool| still_growing(pool, last_growth.get(pool.name.as_str()).copied(), now_s).is_some();
    let growing_pools: Vec<&str> = pools.iter().filter(|p| growing(p)).map(|p| p.name.as_str()).collect();
    out.emptying = emptying(&candidates, &in_flight, awaited, &growing_pools);
    for pool in pools.iter().filter(|p| !p.disruption.never && !growing(p)) {
        if underutilized_budget_left(pool, &drains_by_pool) == 0 {
            continue;
        }
        let eligible = replaceable(pool, &pdb_left, &[]);
        let mut on: Vec<Target<'_>> = candidates
            .iter()
            .filter(|c| c.pods.is_empty() && c.pool.name == pool.name && !c.node.unschedulable)
            .filter_map(|c| c.server.map(|server| Target { server, node: Some(c.node), daemonset_pods: &c.daemonset_pods }))
            .collect();
        on.extend(
            snapshot
                .servers
                .iter()
                .enumerate()
                .filter(|&(i, s)| s.is_available() && s.is_warm() && !s.unlimited && m.in_pool(i, pool))
                .map(|(_, server)| Target { server, node: None, daemonset_pods: &[] }),
        );
        if let Some(r) = best_replacement(snapshot, &candidates, &eligible, on, &alone, now_s) {
            let names: Vec<&str> = r.replaces.iter().map(|&i| candidates[i].node.name.as_str()).collect();
            let why = format!("kept on to take over {} (saves {:.0} W)", names.join(", "), r.watts_saved);
            kept_for_replacement.insert(r.target.server.name.as_str(), why);
            if let Some(node) = r.target.node {
                kept_for_replacement.insert(node.name.as_str(), format!("empty, {}", kept_for_replacement[r.target.server.name.as_str()]));
            }
            replacing_pools.push(pool.name.as_str());
        }
    }

    // Claims of no pods in flight: spares on their way to being Ready
    // nodes, counted toward their class's floor.
    let mut spare_claims: BTreeMap<(&str, std::borrow::Cow<'_, str>), u32> = BTreeMap::new();
    for c in snapshot.claims.iter().filter(|c| c.pods.is_empty()) {
        if let (Some(s), Some(pool)) = (servers.get(c.server.as_str()), pools.iter().find(|p| p.name == c.pool)) {
            *spare_claims.entry((pool.name.as_str(), class_name(s, Some(pool)))).or_default() += 1;
        }
    }
    for (key, n) in &spare_claims {
        if *n > 0 {
            classes.entry(key.clone()).or_default();
        }
    }

    for ((pool_name, class), st) in &classes {
        let (floor, prewarm) = floors
            .get(&(*pool_name, class.as_ref()))
            .map_or((0, String::new()), |f| (f.count, f.prewarm.as_ref().map(|p| format!(", {p}")).unwrap_or_default()));
        // Spares kept as Ready nodes: a server that is only on counts for
        // nothing, and is the first to join when the floor is short.
        let nodes = floors.get(&(*pool_name, class.as_ref())).is_some_and(|f| f.nodes);
        let joining = spare_claims.get(&(*pool_name, class.clone())).copied().unwrap_or(0);
        let mut spares: Vec<&Server> = Vec::new();
        for s in &st.spares {
            match kept_for_replacement.get(s.name.as_str()) {
                Some(why) => out.held.push(Held { subject: s.name.clone(), why: why.clone() }),
                None => spares.push(s),
            }
        }
        let mut empties: Vec<usize> = Vec::new();
        for &i in &st.empty_nodes {
            match kept_for_replacement.get(candidates[i].node.name.as_str()) {
                Some(why) => out.held.push(Held { subject: candidates[i].node.name.clone(), why: why.clone() }),
                None => empties.push(i),
            }
        }
        // A NotReady node can host nothing: it is no warm capacity.
        let ready_empties = empties.iter().filter(|&&i| candidates[i].node.ready).count() as u32;
        let bare = if nodes { 0 } else { spares.len() as u32 };
        let on = bare + ready_empties + joining;
        // A spare still powering on or joining counts toward the floor, so
        // that no second one is powered on for it, but no confirmed one is
        // given up for it: its power-on may yet fail.
        let coming = joining + if nodes { 0 } else { spares.iter().filter(|s| s.powering_on).count() as u32 };
        let restore = |server: &Server, join: bool| Action::PowerOn {
            server: server.name.clone(),
            pool: pool_name.to_string(),
            class: class.to_string(),
            floor,
            on,
            prewarm: floors.get(&(*pool_name, class.as_ref())).and_then(|f| f.prewarm.as_ref()).map(|p| p.to_string()),
            join,
        };
        let mut joined = 0u32;
        if on < floor && nodes {
            // Servers already on join first: no power change, no boot.
            let mut bare_on: Vec<&&Server> = spares.iter().filter(|s| !s.powering_on).collect();
            bare_on.sort_by(|a, b| a.power.idle_watts.total_cmp(&b.power.idle_watts).then(a.name.cmp(&b.name)));
            for s in bare_on.into_iter().take((floor - on) as usize) {
                joined += 1;
                out.actions.push(restore(s, true));
            }
        }
        if on + joined < floor {
            // Restore the floor from cold spares, most efficient first.
            let mut cold = st.cold.clone();
            cold.sort_by(|a, b| {
                a.power
                    .idle_watts
                    .total_cmp(&b.power.idle_watts)
                    .then(a.failures.cmp(&b.failures))
                    .then(if wear_counts {
                        crate::transitions::wear(a, now_s).cmp(&crate::transitions::wear(b, now_s))
                    } else {
                        std::cmp::Ordering::Equal
                    })
                    .then(a.name.cmp(&b.name))
            });
            for s in cold.into_iter().take((floor - on - joined) as usize) {
                if snapshot.power_budget_watts.is_some_and(|b| fleet_on_peak + s.power.peak_watts > b) {
                    out.held.push(Held {
                        subject: s.name.clone(),
                        why: format!("warm floor {floor} for {class}{prewarm}, but the power budget is reached"),
                    });
                    break;
                }
                if let Some(refused) = gate.refusal(s, true) {
                    out.held.push(Held { subject: s.name.clone(), why: format!("warm floor {floor} for {class}{prewarm}, but the {refused}") });
                    break;
                }
                gate.take(s);
                fleet_on_peak += s.power.peak_watts;
                out.actions.push(restore(s, nodes));
            }
            continue;
        }
        if joined > 0 {
            // The floor is met with the servers that were only on.
            continue;
        }
        let mut excess = (on - coming).saturating_sub(floor);
        // Spares that are only on are all beyond a floor kept as nodes.
        let mut bare_excess = if nodes { u32::MAX } else { excess };
        // Warm spares go first (no drain needed), longest idle first.
        spares.sort_by(|a, b| idle_for(b).cmp(&idle_for(a)).then(a.name.cmp(&b.name)));
        for s in spares {
            if s.powering_on {
                out.held.push(Held { subject: s.name.clone(), why: "still powering on".into() });
                continue;
            }
            if bare_excess == 0 {
                out.held.push(Held { subject: s.name.clone(), why: format!("kept as a warm spare: floor {floor} for {class}{prewarm}") });
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
            if let Some(refused) = gate.refusal(s, false) {
                out.held.push(Held { subject: s.name.clone(), why: refused.to_string() });
                continue;
            }
            if !headroom.take(pool_name, &s.capacity) {
                out.held.push(Held { subject: s.name.clone(), why: format!("kept for the headroom of ServerPool {pool_name}") });
                continue;
            }
            gate.take(s);
            bare_excess -= 1;
            out.actions.push(Action::PowerOff {
                server: s.name.clone(),
                class: class.to_string(),
                idle_s: idle,
                break_even_s: threshold,
                saves_watts: s.power.idle_watts - s.power.off_watts,
            });
        }
        if !nodes {
            excess = bare_excess;
        }
        empties.sort_by(|&a, &b| {
            let (x, y) = (candidates[a].server.map_or(0, idle_for), candidates[b].server.map_or(0, idle_for));
            y.cmp(&x).then(candidates[a].node.name.cmp(&candidates[b].node.name))
        });
        for i in empties {
            let c = &candidates[i];
            let Some(s) = c.server else { continue };
            if !c.node.ready {
                out.held.push(Held { subject: c.node.name.clone(), why: "not Ready: no warm capacity, and not drained".into() });
                continue;
            }
            if excess == 0 {
                out.held
                    .push(Held { subject: c.node.name.clone(), why: format!("empty, kept as warm capacity: floor {floor} for {class}{prewarm}") });
                continue;
            }
            if c.pool.disruption.never {
                out.held.push(Held { subject: c.node.name.clone(), why: "its ServerPool never consolidates".into() });
                continue;
            }
            if c.node.do_not_disrupt {
                out.held.push(Held { subject: c.node.name.clone(), why: NODE_SAYS_DO_NOT_DISRUPT.into() });
                continue;
            }
            let threshold = empty_node_threshold_s(s, c.pool);
            let idle = idle_for(s);
            if idle < threshold {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("empty for {idle}s of the {threshold}s it must idle first") });
                continue;
            }
            let (nodes, disrupting) = pool_nodes.get(c.pool.name.as_str()).copied().unwrap_or_default();
            let used = drains_by_pool.get(&c.pool.name).copied().unwrap_or(0);
            if budget_left(c.pool, DisruptionReason::Empty, nodes, disrupting, now_s) <= used {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("disruption budget of ServerPool {} is used up", c.pool.name) });
                continue;
            }
            if let Some(refused) = gate.refusal(s, false) {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("empty, but its server's {refused}") });
                continue;
            }
            if !headroom.take(&c.pool.name, &c.node.allocatable) {
                out.held.push(Held { subject: c.node.name.clone(), why: format!("kept for the headroom of ServerPool {}", c.pool.name) });
                continue;
            }
            gate.take(s);
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
    let mut removed: Vec<&str> = drained.iter().map(|&i| candidates[i].node.name.as_str()).collect();
    // An empty node is warm capacity, not room to consolidate into: pods
    // moved onto it free no server, only a boot for the next spare. The
    // one exception is a server kept on as a replacement.
    for c in candidates.iter().filter(|c| c.pods.is_empty() && !kept_for_replacement.contains_key(c.node.name.as_str())) {
        if !removed.contains(&c.node.name.as_str()) {
            removed.push(c.node.name.as_str());
        }
    }
    let mut drained_under: Vec<usize> = Vec::new();
    for &(_, i) in &under {
        let c = &candidates[i];
        if let Some(why) = drain_blocker(snapshot, c, &pdb_left, now_s) {
            out.held.push(Held { subject: c.node.name.clone(), why });
            continue;
        }
        if let Some(why) = still_growing(c.pool, last_growth.get(c.pool.name.as_str()).copied(), now_s) {
            out.held.push(Held { subject: c.node.name.clone(), why });
            continue;
        }
        if underutilized_budget_left(c.pool, &drains_by_pool) == 0 {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("disruption budget of ServerPool {} is used up", c.pool.name) });
            continue;
        }
        if let Some(refused) = c.server.and_then(|s| gate.refusal(s, false)) {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("underutilized, but its server's {refused}") });
            continue;
        }
        // Its pods move onto the others' free capacity: the pool loses the
        // node's whole allocatable.
        if !headroom.take(&c.pool.name, &c.node.allocatable) {
            out.held.push(Held { subject: c.node.name.clone(), why: format!("kept for the headroom of ServerPool {}", c.pool.name) });
            continue;
        }
        // Re-simulate: the node gone, its pods pending, no new servers.
        removed.push(c.node.name.as_str());
        let moved: Vec<String> = c.pods.iter().map(|p| p.key()).collect();
        if !fit_on_the_rest(snapshot, &removed, None, now_s) {
            removed.pop();
            headroom.give(&c.pool.name, &c.node.allocatable);
            out.held.push(Held { subject: c.node.name.clone(), why: "its pods do not all fit on the other nodes".into() });
            continue;
        }
        for (k, n) in evictions_by_pdb(snapshot, c).iter().enumerate() {
            pdb_left[k] -= n;
        }
        if let Some(s) = c.server {
            gate.take(s);
        }
        *drains_by_pool.entry(c.pool.name.clone()).or_default() += 1;
        drained_under.push(i);
        out.actions.push(Action::Drain {
            node: c.node.name.clone(),
            server: c.server.map(|s| s.name.clone()),
            pool: c.pool.name.clone(),
            reason: DisruptionReason::Underutilized,
            evict: moved,
            daemonset_pods: c.daemonset_pods.iter().map(|p| p.key()).collect(),
            saves_watts: c.saves_watts(),
        });
    }

    let powering: Vec<String> = out
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::PowerOn { server, .. } => Some(server.clone()),
            _ => None,
        })
        .collect();

    // Underutilized nodes whose pods fit nowhere else, but together on one
    // cold server that draws clearly fewer watts: power it on. They are
    // drained onto it by the pass above once it is a Ready node.
    for pool in pools.iter().filter(|p| !p.disruption.never && !replacing_pools.contains(&p.name.as_str()) && !growing(p)) {
        // While pods of the pool move (drains under way or just planned),
        // which nodes end up underutilized is not known yet.
        let (_, disrupting) = pool_nodes.get(pool.name.as_str()).copied().unwrap_or_default();
        if disrupting > 0 || drains_by_pool.get(&pool.name).is_some_and(|&n| n > 0) {
            continue;
        }
        if underutilized_budget_left(pool, &drains_by_pool) == 0 {
            continue;
        }
        let eligible = replaceable(pool, &pdb_left, &drained_under);
        if eligible.is_empty() {
            continue;
        }
        let cold: Vec<Target<'_>> = snapshot
            .servers
            .iter()
            // A machine template is not one server to power on.
            .enumerate()
            .filter(|(_, s)| s.is_available() && !s.is_warm() && !s.unlimited && !powering.contains(&s.name))
            .filter(|&(i, _)| m.in_pool(i, pool))
            .filter(|(_, s)| snapshot.power_budget_watts.is_none_or(|b| fleet_on_peak + s.power.peak_watts <= b))
            .filter(|(_, s)| gate.refusal(s, true).is_none())
            .map(|(_, server)| Target { server, node: None, daemonset_pods: &[] })
            .collect();
        let Some(r) = best_replacement(snapshot, &candidates, &eligible, cold, &alone, now_s) else { continue };
        gate.take(r.target.server);
        fleet_on_peak += r.target.server.power.peak_watts;
        out.actions.push(Action::PowerOnForReplacement {
            server: r.target.server.name.clone(),
            pool: pool.name.clone(),
            replaces: r.replaces.iter().map(|&i| candidates[i].node.name.clone()).collect(),
            watts_saved: r.watts_saved,
        });
    }

    // Pools short of their headroom power spares on, largest first.
    let powering: Vec<String> = out
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::PowerOn { server, .. } | Action::PowerOnForReplacement { server, .. } => Some(server.clone()),
            _ => None,
        })
        .collect();
    for pool in pools.iter().filter(|p| p.warm.headroom.is_some()) {
        for s in &powering {
            if let Some(i) = m.index(s)
                && m.in_pool(i, pool)
            {
                headroom.give(&pool.name, &snapshot.servers[i].capacity);
            }
        }
        let mut cold: Vec<&Server> = snapshot
            .servers
            .iter()
            .enumerate()
            .filter(|&(i, s)| s.is_available() && !s.is_warm() && !powering.contains(&s.name) && m.in_pool(i, pool))
            .map(|(_, s)| s)
            .collect();
        cold.sort_by(|a, b| {
            b.capacity.cpu_milli.cmp(&a.capacity.cpu_milli).then(a.power.idle_watts.total_cmp(&b.power.idle_watts)).then(a.name.cmp(&b.name))
        });
        for s in cold {
            let Some(short) = headroom.short(&pool.name) else { break };
            if snapshot.power_budget_watts.is_some_and(|b| fleet_on_peak + s.power.peak_watts > b) {
                out.held.push(Held {
                    subject: s.name.clone(),
                    why: format!("ServerPool {} is short of its headroom by {short}, but the power budget is reached", pool.name),
                });
                break;
            }
            if let Some(refused) = gate.refusal(s, true) {
                out.held.push(Held {
                    subject: s.name.clone(),
                    why: format!("ServerPool {} is short of its headroom by {short}, but the {refused}", pool.name),
                });
                break;
            }
            gate.take(s);
            fleet_on_peak += s.power.peak_watts;
            headroom.give(&pool.name, &s.capacity);
            out.actions.push(Action::PowerOnForHeadroom { server: s.name.clone(), pool: pool.name.clone(), short });
        }
    }
    out.next_candidate_s = next_candidate_with(snapshot, now_s, &last_growth);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    #[test]
    fn break_even_is_boot_energy_over_idle_savings() {
        let mut s = Server::new("s", Resources::new(1000, 1));
        s.power = PowerProfile::new(210.0, 400.0, 300.0, 10.0);
        s.durations.power_on_s = 60;
        s.durations.boot_s = 540;
        // 300 W x 600 s / 200 W = 900 s.
        assert_eq!(break_even_s(&s), 900);
    }

    #[test]
    fn the_next_candidate_is_the_first_idle_server_past_its_threshold_and_agrees_with_disrupt() {
        let mut spare = Server::new("spare", Resources::new(1000, 1 << 30)).warm();
        spare.power = PowerProfile::new(210.0, 400.0, 300.0, 10.0);
        spare.durations.power_on_s = 60;
        spare.durations.boot_s = 540;
        spare.idle_since_s = Some(1_000);
        let mut node_server = Server::new("busy-until-100", Resources::new(1000, 1 << 30)).warm();
        node_server.power = spare.power;
        node_server.durations = spare.durations;
        node_server.node = Some("n".into());
        node_server.idle_since_s = Some(100);
        let mut pool = ServerPool::new("p");
        pool.disruption.consolidate_after_s = Some(3_600);
        let mut node = Node::new("n", Resources::new(1000, 1 << 30));
        node.server = Some("busy-until-100".into());
        let snap = Snapshot { pools: vec![pool], nodes: vec![node], servers: vec![spare, node_server], ..Default::default() };
        // The spare passes its 900 s break-even at 1900; the empty node's
        // consolidateAfter of an hour runs out at 3700.
        assert_eq!(next_candidate_s(&snap, 1_000), Some(1_900));
        assert_eq!(next_candidate_s(&snap, 1_900), Some(3_700));
        for now in [1_000, 1_900, 3_700] {
            assert_eq!(disrupt(&snap, now).next_candidate_s, next_candidate_s(&snap, now), "a pass says the same at {now}");
        }
        assert_eq!(next_candidate_s(&snap, 3_700), None);
        // Just before each time disrupt holds; at it, disrupt acts.
        let acts = |t| disrupt(&snap, t).actions.len();
        assert_eq!((acts(1_899), acts(1_900)), (0, 1));
        assert_eq!((acts(3_699), acts(3_700)), (1, 2));
    }
}
