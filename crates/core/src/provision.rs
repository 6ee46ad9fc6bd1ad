//! Scale-up: pending pods to Ready nodes, claims in flight, or new claims on
//! individual servers from a finite inventory.
//!
//! # The order of placement
//! Pods are grouped by shape (identical scheduling constraints), groups are
//! sorted by cpu then memory, largest first (first-fit decreasing, as
//! Karpenter orders them), then each pod tries, in order: Ready nodes, claims
//! in flight and claims opened earlier in this plan, and last a new claim.
//!
//! # Choosing servers
//! A new claim starts on the largest free server class that fits its first
//! pod, so that later pods can join it; every class that would also have
//! fitted stays a candidate. Once every pod is placed, each claim is
//! right-sized: it takes the candidate that meets its pods' deadline, then
//! adds the fewest watts (its idle watts, none for a warm server already
//! on, plus what the GPUs its pods take draw where the server states it:
//! [`PowerProfile::gpu_watts`]), then wastes the least capacity.
//!
//! # Guarantees
//! - No server is claimed twice, and no server that is in use, failed,
//!   quarantined or in maintenance is claimed.
//! - Every placement passes the filters of kube-scheduler that the model
//!   covers (see [`crate::predicates`] and [`crate::topology`]).
//! - ServerPool limits, the fleet power budget and the transition rates
//!   ([`crate::transitions`]) hold after right-sizing; with a cap on power
//!   cycles set, the least worn of identical free servers is taken first.
//! - Same snapshot, same plan: no randomness, no hash-order dependence.

use crate::labels::TaintEffect;
use crate::labels::{HOSTNAME, Labels, Taint};
use crate::model::*;
use crate::outcome::*;
use crate::predicates::{NOT_READY_TAINT, NodeMismatch, check_node_affinity, check_taints, node_affinity_matches, taints_tolerated};
use crate::resources::Resources;
use crate::topology::{DomainId, PodTerms, SpreadCounts, TopologyIndex, TopologyMismatch};
use foldhash::{HashMap, HashMapExt};
use std::cmp::Reverse;
use std::collections::BTreeMap;
use std::rc::Rc;

/// The label ironclaim puts on every node it creates, naming its ServerPool.
pub const SERVERPOOL_LABEL: &str = "ironclaim.dev/serverpool";
/// The label naming the inventory server behind a node.
pub const SERVER_LABEL: &str = "ironclaim.dev/server";
/// The soft taint (`PreferNoSchedule`) on a node kept as a warm spare:
/// kube-scheduler puts pods there only when no other node has room, so a
/// spare stays whole for the burst it is kept for. Taken off once the node
/// runs work.
pub const SPARE_TAINT: &str = "ironclaim.dev/spare";

/// Decides where every pending pod goes, and every pod waiting for an
/// in-place resize its node did not apply ([`crate::resize`]). Pure: same
/// inputs, same output.
pub fn provision(snapshot: &Snapshot, now_s: Seconds) -> Provisioning {
    let plan = decide(snapshot, now_s);
    let mut refused = crate::gang::unplaced(&plan, &snapshot.pods);
    if refused.is_empty() {
        return plan;
    }
    // A gang that cannot be placed whole takes no room from the rest: the
    // plan is made again without it (and without any gang that then fails).
    let mut rest = snapshot.clone();
    let mut plan = plan;
    for _ in 0..refused.len() + rest.pods.len() {
        rest.pods.retain(|p| p.gang.as_ref().is_none_or(|g| !refused.contains_key(g)));
        plan = decide(&rest, now_s);
        let more = crate::gang::unplaced(&plan, &rest.pods);
        if more.is_empty() {
            break;
        }
        refused.extend(more);
    }
    crate::gang::refuse(&mut plan, &snapshot.pods, &refused);
    plan
}

/// From this many pods in the snapshot, a decision groups the pending pods
/// on a second thread while it builds the inventory; from this many pending
/// pods, it also names them for the report there while it places them.
/// Each pair reads the snapshot alone; below this, a thread would cost more
/// than it saves.
const ASIDE_FROM: usize = 4096;

/// The plan for `snap`, on two threads where `parallel`.
fn plan_of(snap: &Snapshot, now_s: Seconds, parallel: bool) -> Provisioning {
    let (grouping, (scheduler, anti_in_use)) = beside(
        parallel,
        || Grouping::of(snap),
        || {
            let mut scheduler = Scheduler::new(snap, now_s);
            let anti_in_use = scheduler.anti_terms_in_use();
            (scheduler, anti_in_use)
        },
    );
    scheduler.run(grouping, &anti_in_use, parallel)
}

/// Runs `aside` on a second thread while `here` runs on this one, when
/// `parallel` and a thread can be had; otherwise one after the other. The
/// answer is the same either way.
fn beside<A: Send, B>(parallel: bool, aside: impl FnOnce() -> A + Send, here: impl FnOnce() -> B) -> (A, B) {
    if !parallel {
        return (aside(), here());
    }
    // Should no thread be had, the work is still here to do.
    let work = std::sync::Mutex::new(Some(aside));
    let take = || work.lock().ok().and_then(|mut w| w.take());
    std::thread::scope(|scope| {
        let spawned = std::thread::Builder::new().spawn_scoped(scope, || take().map(|f| f()));
        let b = here();
        let a = spawned.ok().and_then(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
        match a.or_else(|| take().map(|f| f())) {
            Some(a) => (a, b),
            None => unreachable!("the work runs on one thread or the other"),
        }
    })
}

/// One plan for `snapshot`, gangs aside.
fn decide(snapshot: &Snapshot, now_s: Seconds) -> Provisioning {
    let expanded = crate::resize::with_demand(snapshot);
    let snap: &Snapshot = &expanded;
    let mut plan = plan_of(snap, now_s, snap.pods.len() >= ASIDE_FROM);
    if matches!(expanded, std::borrow::Cow::Owned(_)) {
        let waits: HashMap<String, crate::resize::ResizeWait> =
            snapshot.pods.iter().filter_map(|p| crate::resize::wait_of(p).map(|w| (p.key(), w))).collect();
        for d in plan.pods.iter_mut() {
            d.resize = waits.get(&d.pod).cloned();
        }
    }
    plan
}

/// What one ServerPool holds, counted as its limits count it: servers that
/// are nodes or held by claims, attributed to the pool their claim names,
/// else to the first pool (by weight, then name) that admits them.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct PoolUsage {
    pub pool: String,
    pub servers: i64,
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    /// Peak watts of the servers held.
    pub watts: f64,
    /// The first limit used up, e.g. `servers 4 of 4`.
    pub limit_reached: Option<String>,
}

/// The usage of every ServerPool of the snapshot, in the order of the
/// snapshot's pools (a pool named `default` when it has none).
pub fn pool_usage(snapshot: &Snapshot) -> Vec<PoolUsage> {
    let s = Scheduler::new(snapshot, 0);
    s.pools
        .iter()
        .zip(&s.usage)
        .map(|(pool, u)| {
            let l = &pool.limits;
            let at = |limit: Option<i64>, used: i64| limit.is_some_and(|m| used >= m);
            let limit_reached = if at(l.servers, u.servers) {
                Some(format!("servers {} of {}", u.servers, l.servers.unwrap_or(0)))
            } else if at(l.cpu_milli, u.cpu_milli) {
                Some(format!(
                    "cpu {} of {}",
                    crate::quantity::format_cpu_milli(u.cpu_milli),
                    crate::quantity::format_cpu_milli(l.cpu_milli.unwrap_or(0))
                ))
            } else if at(l.memory_bytes, u.memory_bytes) {
                Some(format!(
                    "memory {} of {}",
                    crate::quantity::format_bytes(u.memory_bytes),
                    crate::quantity::format_bytes(l.memory_bytes.unwrap_or(0))
                ))
            } else if at(l.gpus, u.gpus) {
                Some(format!("gpus {} of {}", u.gpus, l.gpus.unwrap_or(0)))
            } else if l.watts.is_some_and(|w| u.watts >= w) {
                Some(format!("watts {:.0} of {:.0}", u.watts, l.watts.unwrap_or(0.0)))
            } else {
                None
            };
            PoolUsage {
                pool: pool.name.clone(),
                servers: u.servers,
                cpu_milli: u.cpu_milli,
                memory_bytes: u.memory_bytes,
                gpus: u.gpus,
                watts: u.watts,
                limit_reached,
            }
        })
        .collect()
}

/// Identical servers: same hardware, labels, power, durations, state.
struct Class {
    /// Every server of the class, whatever its state (for reasons).
    members: Vec<usize>,
    /// Free servers, the next one to take last.
    free: Vec<usize>,
    /// A machine template with no count (a VM pool, a MachineDeployment).
    unlimited: bool,
    /// Machines minted from an unlimited template, for unique names.
    minted: u32,
    sample: usize,
}

impl Class {
    /// Whether a server can still be taken from it.
    fn has_free(&self) -> bool {
        self.unlimited || !self.free.is_empty()
    }
}

/// A class as a given ServerPool would make it into a node.
struct Offering {
    class: usize,
    pool: usize,
    labels: Labels,
    taints: Vec<Taint>,
    /// Capacity left for pods once the DaemonSets that would land are counted.
    alloc: Resources,
    /// Index of `alloc` in `Scheduler::allocs`: offerings of equal `alloc`
    /// share it, so what fits one is checked once for all.
    alloc_id: usize,
    capacity: Resources,
    domains: Vec<Option<DomainId>>,
    /// Index into `Scheduler::peers`: the offerings a claim that starts on
    /// this one may be right-sized to.
    peers: usize,
    warm: bool,
    eta_s: Seconds,
    power: PowerProfile,
    failures: u32,
}

enum SlotKind {
    Existing,
    InFlight { claim: String, eta_s: Seconds },
    New(NewSlot),
}

struct NewSlot {
    pool: usize,
    /// The offering whose server is reserved now.
    offering: usize,
    server: usize,
    /// The offerings it may be right-sized to when it was opened; of
    /// these, those that still take its pods are the ones
    /// [`NewSlot::admits`].
    candidates: Vec<usize>,
    /// The node selections of its pods (per offering, as in
    /// `Group::selection_ok`), each once.
    selections: Vec<Rc<Vec<bool>>>,
    /// What its pods request, without DaemonSet overhead.
    requested: Resources,
    /// Smallest remaining deadline of its pods, in seconds from now.
    deadline_s: Option<i64>,
}

impl NewSlot {
    /// Whether offering `c` still takes every pod placed so far: their
    /// node selections admit it and their requests fit it. Checked when a
    /// candidate is used rather than after every pod, since a claim takes
    /// many pods and its candidates are read only for a deadline and when
    /// right-sizing.
    fn admits(&self, offerings: &[Offering], c: usize) -> bool {
        self.selections.iter().all(|s| s[c]) && self.requested.fits(&offerings[c].alloc)
    }
}

struct Slot {
    name: String,
    kind: SlotKind,
    labels: Labels,
    taints: Vec<Taint>,
    cordoned: bool,
    free: Resources,
    /// Of `free`, what the waiting pods a claim in flight was opened for
    /// still need: other pods may only use the rest.
    reserved: Resources,
    ports: Vec<HostPort>,
    domains: Vec<Option<DomainId>>,
    pods: Vec<usize>,
}

/// Why a slot turned a pod down, by how long the answer holds.
enum Refusal {
    /// For every pod of the shape, whatever else is placed: room, node
    /// affinity, taints.
    Shape,
    /// For the pods of this group, whatever else is placed: an inter-pod
    /// term adding pods cannot undo, a host port.
    Group,
    /// For now: other placements may change the answer.
    ForNow,
}

/// Ready nodes and claims still worth trying, in first-fit order. A slot
/// leaves a list once it fails for a reason adding pods cannot undo
/// (resources, node affinity, taints, ports, anti-affinity), so each pod only
/// looks at slots that might still take it. Pods without inter-pod terms or
/// host ports fail only for reasons their shape decides, so groups of the
/// same shape share one list, and every other group of that shape can
/// start from it.
#[derive(Default)]
struct Live {
    existing: Vec<usize>,
    claims: Vec<usize>,
    /// How many of `Scheduler::claims` were already added to `claims`.
    claims_seen: usize,
    /// The inventory epoch `claims` was built in: what counts as permanent
    /// for spread depends on the inventory, so a spread group's list is
    /// rebuilt when that changes (no other failure depends on it).
    epoch: u64,
}

struct Group {
    pods: Vec<usize>,
    terms: PodTerms,
    /// Index into `Scheduler::lives`: its own for pods with inter-pod terms
    /// or host ports, shared by pod shape otherwise (and by a group of one
    /// pod, which drops from it only what the whole shape cannot take).
    live: usize,
    /// No inter-pod term and no host port: the pods' shape alone decides
    /// which slots take them.
    independent: bool,
    /// Index into `Scheduler::lives`: the list shared by the group's pod
    /// shape. It drops only slots that no pod of the shape can take, so a
    /// group's own list starts from it, and a spread group's is rebuilt
    /// from it.
    shape_live: usize,
    /// Per spread term: the domains that free inventory offers, and whether
    /// a fresh host is on offer, valid while `inventory_epoch` is unchanged.
    offered_domains: Vec<Option<(u64, Vec<DomainId>, bool)>>,
    /// Per offering: does the pod fit an empty server of it, by resources,
    /// node affinity and taints. Shared by groups that differ only in labels
    /// or inter-pod terms.
    static_ok: Rc<Vec<bool>>,
    /// Per offering: do the pod's node affinity and tolerations admit it,
    /// whatever its resources. Shared by groups of the same selection.
    selection_ok: Rc<Vec<bool>>,
    /// The pod's node selection reads neither the hostname label nor the
    /// node's name: then `selection_ok` answers for a claim of the offering
    /// too, whatever its host.
    hostless: bool,
    /// Per spread term, the domains of the Ready nodes it counts. Shared by
    /// groups of the same selection and spread keys and policies.
    eligible_existing_domains: Rc<Vec<Vec<DomainId>>>,
    /// Per spread term, the matching pods per domain over the slots that
    /// term counts (see `Scheduler::spread_counts_slot`).
    spread_counts: SpreadCounts,
    /// The same over Ready nodes alone: what kube-scheduler counts for a
    /// pod that binds now, before any claim's node joins.
    spread_counts_now: SpreadCounts,
    blocked: Option<Unschedulable>,
}

#[derive(Clone, Default)]
struct Usage {
    cpu_milli: i64,
    memory_bytes: i64,
    gpus: i64,
    servers: i64,
    watts: f64,
}

/// The minimum counts of a group's spread terms over the domains that count:
/// Ready nodes, counting only the pods they hold (`now`), and those plus the
/// claims in flight and opened so far and what the free inventory could add
/// (`planned`); `pinned` as in `Scheduler::spread_minimums`.
#[derive(Default)]
struct Minimums {
    now: Vec<u32>,
    planned: Vec<u32>,
    pinned: Vec<bool>,
}

/// How a right-sizing candidate ranks: deadline missed, failures, added
/// watts, waste, ETA, then the offering for a stable order.
type Score = (bool, u32, f64, f64, Seconds, usize);

struct Scheduler<'s> {
    snap: &'s Snapshot,
    now_s: Seconds,
    pools: Vec<ServerPool>,
    pool_order: Vec<usize>,
    topo: TopologyIndex,
    hostname_key: usize,
    classes: Vec<Class>,
    offerings: Vec<Offering>,
    offerings_by_pool: Vec<Vec<usize>>,
    /// Offerings of one pool in the same topology domains but the hostname,
    /// in the order of `offerings_by_pool`, each with its class: a new
    /// claim filters them without reading the offerings.
    peers: Vec<Vec<(usize, usize)>>,
    slots: Vec<Slot>,
    existing: Vec<usize>,
    claims: Vec<usize>,
    usage: Vec<Usage>,
    fleet_peak_watts: f64,
    placement: Vec<Option<usize>>,
    /// Pending pods named by a claim in flight, and that claim's slot.
    reserved_for: HashMap<usize, usize>,
    /// Bumped whenever a server class runs out of free servers or gets one
    /// back, so that per-group caches of what the inventory offers stay valid.
    inventory_epoch: u64,
    /// Per topology key: the domains of claims (in flight and new).
    claim_domains: Vec<std::collections::BTreeSet<DomainId>>,
    /// `Group::static_ok` by what it depends on.
    static_cache: HashMap<StaticKey<'s>, Rc<Vec<bool>>>,
    /// `Group::selection_ok` by what it depends on.
    selection_cache: HashMap<SelectionKey<'s>, Rc<Vec<bool>>>,
    /// `Group::eligible_existing_domains` by what it depends on: the
    /// selection, and each spread term's key and policies.
    eligible_cache: HashMap<EligibleKey<'s>, Rc<Vec<Vec<DomainId>>>>,
    lives: Vec<Live>,
    shared_lives: HashMap<StaticKey<'s>, usize>,
    /// Per topology key: how many distinct domains the offerings have, so
    /// that a scan for the domains free servers offer can stop once it has
    /// seen them all.
    offering_domains_per_key: Vec<usize>,
    /// The distinct `Offering::alloc`s.
    allocs: Vec<Resources>,
    /// Power changes of the last minute and those this plan opens.
    gate: crate::transitions::Gate<'s>,
}

/// What decides whether a pod fits an empty server: requests, node
/// selection and tolerations.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct StaticKey<'p> {
    requests: &'p Resources,
    selection: SelectionKey<'p>,
}

/// What decides which Ready nodes a group's spread terms count: the node
/// selection, and per term its topology key and inclusion policies.
type EligibleKey<'p> = (SelectionKey<'p>, Vec<(usize, InclusionPolicy, InclusionPolicy)>);

/// What decides whether a node's labels and taints admit a pod: node
/// selection and tolerations.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct SelectionKey<'p> {
    node_selector: &'p Labels,
    node_affinity: &'p [crate::labels::NodeSelectorTerm],
    tolerations: &'p [crate::labels::Toleration],
}

/// What makes two servers interchangeable as hardware: capacity, labels
/// (but the hostname), power profile and measured durations.
pub fn hardware_key(s: &Server) -> String {
    let mut labels = s.labels.clone();
    labels.remove(HOSTNAME);
    format!("{:?}|{:?}|{:?}|{:?}", s.capacity, labels, power_bits(&s.power), s.durations)
}

/// A power profile as the bits of its watts, for equality and hashing.
fn power_bits(p: &PowerProfile) -> ([u64; 4], Option<u64>) {
    ([p.idle_watts.to_bits(), p.peak_watts.to_bits(), p.boot_watts.to_bits(), p.off_watts.to_bits()], p.gpu_watts.map(f64::to_bits))
}

/// Whether two servers are the same hardware in the sense of
/// [`hardware_key`], compared field by field rather than by building keys.
pub fn same_hardware(a: &Server, b: &Server) -> bool {
    let not_host = |(k, _): &(&String, &String)| k.as_str() != HOSTNAME;
    a.capacity == b.capacity
        && power_bits(&a.power) == power_bits(&b.power)
        && a.durations == b.durations
        && a.labels.iter().filter(not_host).eq(b.labels.iter().filter(not_host))
}

/// Interchangeable for a decision: the same hardware in the same state.
fn same_class(a: &Server, b: &Server) -> bool {
    a.power_state == b.power_state && a.failures == b.failures && a.unlimited == b.unlimited && same_hardware(a, b)
}

/// A cheap hash of what [`same_class`] compares: servers of one class share
/// it; servers that share it are compared in full.
fn class_hash(s: &Server) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut mix = |x: u64| {
        h ^= x;
        h = h.wrapping_mul(0x0100_0000_01b3).rotate_left(29);
    };
    let c = &s.capacity;
    for x in [c.cpu_milli, c.memory_bytes, c.ephemeral_bytes, c.pods] {
        mix(x as u64);
    }
    for (name, x) in &c.extended {
        mix(name.len() as u64);
        mix(*x as u64);
    }
    let (watts, gpu_watts) = power_bits(&s.power);
    for w in watts {
        mix(w);
    }
    mix(gpu_watts.unwrap_or(u64::MAX));
    let d = &s.durations;
    for x in [d.power_on_s, d.boot_s, d.join_s, d.ready_s, u64::from(d.tail_percent)] {
        mix(x);
    }
    mix(s.power_state as u64);
    mix(u64::from(s.failures));
    mix(u64::from(s.unlimited));
    mix(s.labels.len() as u64);
    for (k, v) in &s.labels {
        if k != HOSTNAME {
            mix(hash_str(k));
            mix(hash_str(v));
        }
    }
    h
}

fn hash_str(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The offerings a new claim may still be right-sized to, and the node
/// selection they were filtered by.
struct Candidates {
    offerings: Vec<usize>,
    selection: Rc<Vec<bool>>,
}

fn daemonset_overhead(snap: &Snapshot, labels: &Labels, taints: &[Taint], name: &str) -> Resources {
    let mut overhead = Resources::default();
    for ds in &snap.daemonsets {
        let t = &ds.template;
        if node_affinity_matches(t, labels, name) && taints_tolerated(t, taints, false) {
            overhead.add(&Resources { pods: 1, ..t.requests.clone() });
        }
    }
    overhead
}

fn node_labels_for(server: &Server, pool: &ServerPool) -> Labels {
    let mut labels = server.labels.clone();
    labels.extend(pool.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    labels.insert(SERVERPOOL_LABEL.to_string(), pool.name.clone());
    labels.insert(SERVER_LABEL.to_string(), server.name.clone());
    labels.insert(HOSTNAME.to_string(), server.name.clone());
    labels
}

fn remaining_eta(server: &Server, claim: &ClaimInFlight, now_s: Seconds) -> Seconds {
    let d = &server.durations;
    let left_from_stage = match claim.stage {
        Stage::Selected | Stage::PoweringOn => d.cold_s(),
        Stage::Booting => d.boot_s + d.join_s + d.ready_s,
        Stage::Joined => d.ready_s,
        Stage::Ready => 0,
    };
    left_from_stage.saturating_sub(now_s.saturating_sub(claim.stage_started_s))
}

impl<'s> Scheduler<'s> {
    fn new(snap: &'s Snapshot, now_s: Seconds) -> Self {
        let pools = if snap.pools.is_empty() { vec![ServerPool::new("default")] } else { snap.pools.clone() };
        let mut pool_order: Vec<usize> = (0..pools.len()).collect();
        pool_order.sort_by(|&a, &b| pools[b].weight.cmp(&pools[a].weight).then(pools[a].name.cmp(&pools[b].name)));

        let mut topo = TopologyIndex::default();
        topo.set_namespaces(&snap.namespaces);
        for pod in &snap.pods {
            topo.register(pod);
        }
        let hostname_key = topo.key_id(HOSTNAME);

        let mut s = Scheduler {
            snap,
            now_s,
            usage: vec![Usage::default(); pools.len()],
            pools,
            pool_order,
            topo,
            hostname_key,
            classes: Vec::new(),
            offerings: Vec::new(),
            offerings_by_pool: Vec::new(),
            peers: Vec::new(),
            slots: Vec::new(),
            existing: Vec::new(),
            claims: Vec::new(),
            fleet_peak_watts: 0.0,
            placement: vec![None; snap.pods.len()],
            reserved_for: HashMap::new(),
            inventory_epoch: 0,
            claim_domains: Vec::new(),
            static_cache: HashMap::new(),
            selection_cache: HashMap::new(),
            eligible_cache: HashMap::new(),
            lives: Vec::new(),
            shared_lives: HashMap::new(),
            offering_domains_per_key: Vec::new(),
            allocs: Vec::new(),
            gate: crate::transitions::Gate::new(snap, now_s),
        };
        s.build_inventory();
        s.build_slots();
        s
    }

    fn pool_index(&self, name: &str) -> Option<usize> {
        self.pools.iter().position(|p| p.name == name)
    }

    fn build_inventory(&mut self) {
        let snap = self.snap;
        let mut by_hash: HashMap<u64, Vec<usize>> = HashMap::new();
        let mut order: Vec<usize> = (0..snap.servers.len()).collect();
        order.sort_by(|&a, &b| snap.servers[a].name.cmp(&snap.servers[b].name));
        for &i in &order {
            let server = &snap.servers[i];
            let bucket = by_hash.entry(class_hash(server)).or_default();
            let c = match bucket.iter().copied().find(|&c| same_class(&snap.servers[self.classes[c].sample], server)) {
                Some(c) => c,
                None => {
                    let c = self.classes.len();
                    bucket.push(c);
                    self.classes.push(Class { members: Vec::new(), free: Vec::new(), unlimited: server.unlimited, minted: 0, sample: i });
                    c
                }
            };
            self.classes[c].members.push(i);
            if server.is_available() {
                self.classes[c].free.push(i);
            }
            // Limits and the power budget count what is already on or held.
            if server.power_state == PowerState::On || server.claim.is_some() || server.node.is_some() {
                self.fleet_peak_watts += server.power.peak_watts;
            }
        }
        // The next one to take last: by name, or, with a cap on power
        // cycles set, the least worn first (see crate::transitions).
        for class in &mut self.classes {
            class.free.reverse();
            if snap.transition_limits.max_cycles_per_day.is_some() {
                let now_s = self.now_s;
                class.free.sort_by_key(|&i| Reverse(crate::transitions::wear(&snap.servers[i], now_s)));
            }
        }
        // Pool usage: servers that are nodes or held by claims, attributed to
        // the pool their claim names, else the first pool that admits them.
        let claim_pool: HashMap<&str, &str> = snap.claims.iter().map(|c| (c.server.as_str(), c.pool.as_str())).collect();
        for server in &snap.servers {
            if server.claim.is_none() && server.node.is_none() {
                continue;
            }
            let pool = claim_pool
                .get(server.name.as_str())
                .and_then(|p| self.pool_index(p))
                .or_else(|| self.pool_order.iter().copied().find(|&p| self.pools[p].admits(server)));
            if let Some(p) = pool {
                self.charge(p, &server.capacity, server.power.peak_watts, 1.0);
            }
        }

        self.offerings_by_pool = vec![Vec::new(); self.pools.len()];
        for (c, class) in self.classes.iter().enumerate() {
            let server = &snap.servers[class.sample];
            for &p in &self.pool_order {
                let pool = &self.pools[p];
                if !pool.admits(server) {
                    continue;
                }
                let mut labels = node_labels_for(server, pool);
                labels.remove(HOSTNAME);
                let overhead = daemonset_overhead(snap, &labels, &pool.taints, &server.name);
                let alloc = server.capacity.with_default_pods().minus(&overhead);
                let domains = self.topo.domains_of(&labels);
                self.offerings.push(Offering {
                    class: c,
                    pool: p,
                    labels,
                    taints: pool.taints.clone(),
                    alloc,
                    alloc_id: usize::MAX,
                    capacity: server.capacity.clone(),
                    domains,
                    peers: usize::MAX,
                    warm: server.is_warm(),
                    eta_s: server.eta_s(),
                    power: server.power,
                    failures: server.failures,
                });
                self.offerings_by_pool[p].push(self.offerings.len() - 1);
            }
        }
        // Largest first, so that a new claim can absorb the pods after it.
        for list in &mut self.offerings_by_pool {
            let offerings = &self.offerings;
            list.sort_by(|&a, &b| {
                let (x, y) = (&offerings[a], &offerings[b]);
                y.alloc
                    .gpus()
                    .cmp(&x.alloc.gpus())
                    .then(y.alloc.cpu_milli.cmp(&x.alloc.cpu_milli))
                    .then(y.alloc.memory_bytes.cmp(&x.alloc.memory_bytes))
                    .then(x.power.idle_watts.total_cmp(&y.power.idle_watts))
                    .then(y.warm.cmp(&x.warm))
                    .then(a.cmp(&b))
            });
        }
        let mut alloc_ids: HashMap<&Resources, usize> = HashMap::new();
        for o in &mut self.offerings {
            let next = self.allocs.len();
            o.alloc_id = *alloc_ids.entry(&o.alloc).or_insert(next);
            if o.alloc_id == next {
                self.allocs.push(o.alloc.clone());
            }
        }
        let keys = self.offerings.iter().map(|o| o.domains.len()).max().unwrap_or(0);
        self.offering_domains_per_key = vec![0; keys];
        let mut seen = vec![false; self.topo.domain_count()];
        for k in 0..keys {
            seen.fill(false);
            for d in self.offerings.iter().filter_map(|o| o.domains.get(k).copied().flatten()) {
                if !std::mem::replace(&mut seen[d as usize], true) {
                    self.offering_domains_per_key[k] += 1;
                }
            }
        }
        let mut peers_of: HashMap<(usize, Vec<Option<DomainId>>), usize> = HashMap::new();
        for (pool, list) in self.offerings_by_pool.iter().enumerate() {
            for &o in list {
                let mut domains = self.offerings[o].domains.clone();
                domains[self.hostname_key] = None;
                let next = self.peers.len();
                let peers = *peers_of.entry((pool, domains)).or_insert(next);
                if peers == next {
                    self.peers.push(Vec::new());
                }
                self.peers[peers].push((o, self.offerings[o].class));
                self.offerings[o].peers = peers;
            }
        }
    }

    fn charge(&mut self, pool: usize, capacity: &Resources, peak_watts: f64, sign: f64) {
        let u = &mut self.usage[pool];
        let k = sign as i64;
        u.cpu_milli += k * capacity.cpu_milli;
        u.memory_bytes += k * capacity.memory_bytes;
        u.gpus += k * capacity.gpus();
        u.servers += k;
        u.watts += sign * peak_watts;
    }

    fn build_slots(&mut self) {
        let snap = self.snap;
        let mut node_slot: HashMap<&str, usize> = HashMap::new();
        for node in &snap.nodes {
            let domains = self.topo.domains_of(&node.labels);
            node_slot.insert(node.name.as_str(), self.slots.len());
            self.existing.push(self.slots.len());
            // kube-scheduler reads no Ready condition: a NotReady node is
            // kept off by the taint the node lifecycle controller gives it,
            // and takes the pods that tolerate it. Its pods count, and it is
            // a spread domain.
            let mut taints = node.taints.clone();
            if !node.ready && !taints.iter().any(|t| t.key == NOT_READY_TAINT && t.effect == TaintEffect::NoSchedule) {
                taints.push(Taint::new(NOT_READY_TAINT, "", TaintEffect::NoSchedule));
            }
            self.slots.push(Slot {
                name: node.name.clone(),
                kind: SlotKind::Existing,
                labels: node.labels.clone(),
                taints,
                cordoned: node.unschedulable,
                // A node's slots are what it reports: none reported, none
                // free (kube-scheduler's NodeResourcesFit).
                free: node.allocatable.clone(),
                reserved: Resources::default(),
                ports: Vec::new(),
                domains,
                pods: Vec::new(),
            });
        }
        let servers: HashMap<&str, &Server> = snap.servers.iter().map(|s| (s.name.as_str(), s)).collect();
        for claim in &snap.claims {
            let (Some(server), Some(pool)) = (servers.get(claim.server.as_str()), self.pool_index(&claim.pool)) else {
                continue;
            };
            if claim.stage == Stage::Ready {
                continue;
            }
            let pool_taints = self.pools[pool].taints.clone();
            let labels = node_labels_for(server, &self.pools[pool]);
            let overhead = daemonset_overhead(snap, &labels, &pool_taints, &server.name);
            let domains = self.topo.domains_of(&labels);
            self.note_claim_domains(&domains);
            self.claims.push(self.slots.len());
            self.slots.push(Slot {
                name: server.name.clone(),
                kind: SlotKind::InFlight { claim: claim.name.clone(), eta_s: remaining_eta(server, claim, self.now_s) },
                labels,
                taints: pool_taints,
                cordoned: false,
                free: server.capacity.with_default_pods().minus(&overhead),
                reserved: Resources::default(),
                ports: Vec::new(),
                domains,
                pods: Vec::new(),
            });
        }
        // A claim's own waiting pods keep their room on it.
        let pending: HashMap<String, usize> = if self.claims.is_empty() {
            HashMap::new()
        } else {
            snap.pods.iter().enumerate().filter(|(_, p)| p.is_pending_demand()).map(|(i, p)| (p.key(), i)).collect()
        };
        for &slot in &self.claims {
            let SlotKind::InFlight { claim, .. } = &self.slots[slot].kind else { continue };
            let Some(c) = snap.claims.iter().find(|c| &c.name == claim) else { continue };
            for key in &c.pods {
                if let Some(&pod) = pending.get(key)
                    && !self.reserved_for.contains_key(&pod)
                {
                    self.reserved_for.insert(pod, slot);
                    self.slots[slot].reserved.add(&snap.pods[pod].requests);
                }
            }
        }
        // Bound pods hold resources and ports, and count for topology.
        let anti_in_use: Vec<usize> = Vec::new();
        for pod in &snap.pods {
            if !pod.occupies_node() {
                continue;
            }
            let Some(&slot) = pod.node_name.as_deref().and_then(|n| node_slot.get(n)) else {
                continue;
            };
            let terms = self.topo.resolve(pod, &anti_in_use);
            let s = &mut self.slots[slot];
            s.free.sub(&pod.requests);
            s.ports.extend(pod.host_ports.iter().cloned());
            self.topo.place(&terms, &s.domains, slot, pod.terminating);
        }
    }

    /// Whether spread term `i` of a pod counts the pods of `slot`, and the
    /// slot is one of its domains (PodTopologySpread's PreFilter): the
    /// slot has every key of the pod's constraints, and passes the pod's
    /// node affinity and taints where the constraint honours them. A
    /// cordoned node carries the taint Kubernetes gives it.
    fn spread_counts_slot(&self, pod: &Pod, terms: &PodTerms, i: usize, slot: usize) -> bool {
        let s = &self.slots[slot];
        let spread = &terms.spread[i];
        terms.spread.iter().all(|o| s.domains[self.topo.key_of_term(o.term)].is_some())
            && (spread.node_affinity_policy == InclusionPolicy::Ignore || node_affinity_matches(pod, &s.labels, &s.name))
            && (spread.node_taints_policy == InclusionPolicy::Ignore || taints_tolerated(pod, &s.taints, s.cordoned))
    }

    /// Per spread term, the domains of the Ready nodes it counts, each
    /// once, in the order of the nodes.
    fn eligible_existing_domains(&self, pod: &Pod, terms: &PodTerms) -> Vec<Vec<DomainId>> {
        let mut seen = vec![false; self.topo.domain_count()];
        (0..terms.spread.len())
            .map(|i| {
                let key = self.topo.key_of_term(terms.spread[i].term);
                seen.fill(false);
                self.existing
                    .iter()
                    .filter(|&&slot| self.spread_counts_slot(pod, terms, i, slot))
                    .filter_map(|&slot| self.slots[slot].domains[key])
                    .filter(|&d| !std::mem::replace(&mut seen[d as usize], true))
                    .collect()
            })
            .collect()
    }

    /// The group's spread counts, from every slot each term counts among
    /// `slots`.
    fn count_spread(&self, pod: &Pod, terms: &PodTerms, slots: impl Iterator<Item = usize> + Clone) -> SpreadCounts {
        let mut out = vec![Vec::new(); terms.spread.len()];
        for (i, st) in terms.spread.iter().enumerate() {
            let key = self.topo.key_of_term(st.term);
            let counts = &mut out[i];
            for slot in slots.clone() {
                let n = self.topo.slot_count(st.term, slot);
                if n == 0 || !self.spread_counts_slot(pod, terms, i, slot) {
                    continue;
                }
                if let Some(d) = self.slots[slot].domains[key] {
                    let d = d as usize;
                    if counts.len() <= d {
                        counts.resize(d + 1, 0);
                    }
                    counts[d] += n;
                }
            }
        }
        out
    }

    fn anti_terms_in_use(&mut self) -> Vec<usize> {
        let mut terms: Vec<usize> = Vec::new();
        for pod in &self.snap.pods {
            if pod.occupies_node() || pod.is_pending_demand() {
                terms.extend(self.topo.anti_terms_owned_by(pod));
            }
        }
        terms.sort();
        terms.dedup();
        terms
    }

    fn deadline_of(&self, pod: &Pod, pool: usize) -> Option<i64> {
        let deadline = pod.deadline_s.or(self.pools[pool].deadline_s)?;
        Some((pod.created_s + deadline) as i64 - self.now_s as i64)
    }

    /// `anti_in_use`: the anti-affinity terms of the pods that occupy a node
    /// or want one ([`Scheduler::anti_terms_in_use`]).
    fn run(mut self, grouping: Grouping<'s>, anti_in_use: &[usize], parallel: bool) -> Provisioning {
        let snap = self.snap;
        let Grouping { pending, group_of, members, created, size } = grouping;
        let mut groups: Vec<Group> = Vec::with_capacity(members.len());
        for pods in members {
            // In order of first appearance, as the pods were grouped.
            let terms = self.topo.resolve(&snap.pods[pods[0]], anti_in_use);
            groups.push(Group {
                pods,
                terms,
                live: usize::MAX,
                shape_live: usize::MAX,
                offered_domains: Vec::new(),
                static_ok: Rc::default(),
                selection_ok: Rc::default(),
                hostless: false,
                independent: false,
                eligible_existing_domains: Rc::default(),
                spread_counts: Vec::new(),
                spread_counts_now: Vec::new(),
                blocked: None,
            });
        }
        // Pods a claim in flight was opened for go first: placed elsewhere
        // (a Ready node), they free the room kept for them before the
        // others look; otherwise largest first.
        let mut order: Vec<_> = groups
            .iter()
            .enumerate()
            .map(|(g, group)| {
                let keeps_room = group.pods.iter().any(|p| self.reserved_for.contains_key(p));
                let first = group.pods[0];
                (!keeps_room, Reverse(size[g].0), Reverse(size[g].1), created[first], first, g)
            })
            .collect();
        order.sort_unstable();
        let order: Vec<usize> = order.into_iter().map(|(.., g)| g).collect();

        // The pending pods' names, for the report: on a second thread while
        // the pods are placed, when there are many.
        let names = |pending: &[usize]| {
            let mut keys: Vec<Option<String>> = vec![None; snap.pods.len()];
            for &p in pending {
                keys[p] = Some(snap.pods[p].key());
            }
            keys
        };
        let place_all = |this: &mut Self, groups: &mut [Group]| {
            for &g in &order {
                this.prepare_group(&mut groups[g]);
                for k in 0..groups[g].pods.len() {
                    let pod = groups[g].pods[k];
                    this.place(pod, &mut groups[g]);
                }
            }
            this.right_size();
        };
        let (keys, ()) = beside(parallel && pending.len() >= ASIDE_FROM, || names(&pending), || place_all(&mut self, &mut groups));
        self.report(&pending, &groups, &group_of, keys)
    }

    fn prepare_group(&mut self, group: &mut Group) {
        let snap = self.snap;
        let pod = &snap.pods[group.pods[0]];
        group.offered_domains = vec![None; group.terms.spread.len()];
        let selection = SelectionKey { node_selector: &pod.node_selector, node_affinity: &pod.node_affinity, tolerations: &pod.tolerations };
        let key = StaticKey { requests: &pod.requests, selection };
        group.independent = group.terms.affinity.is_empty()
            && group.terms.anti_affinity.is_empty()
            && group.terms.spread.is_empty()
            && group.terms.repelled_by.is_empty()
            && pod.host_ports.is_empty();
        let (lives, existing) = (&mut self.lives, &self.existing);
        group.shape_live = *self.shared_lives.entry(key).or_insert_with(|| {
            lives.push(Live { existing: existing.clone(), ..Default::default() });
            lives.len() - 1
        });
        // A group of one pod looks through its shape's list once: a copy to
        // drop its own refusals from would serve no second pod.
        group.live = if group.independent || group.pods.len() == 1 {
            group.shape_live
        } else {
            let shape = &self.lives[group.shape_live];
            let own =
                Live { existing: shape.existing.clone(), claims: shape.claims.clone(), claims_seen: shape.claims_seen, epoch: self.inventory_epoch };
            self.lives.push(own);
            self.lives.len() - 1
        };
        group.hostless = !pod.node_selector.contains_key(HOSTNAME)
            && pod.node_affinity.iter().all(|t| t.match_fields.is_empty() && t.match_expressions.iter().all(|r| r.key != HOSTNAME));
        let offerings = &self.offerings;
        group.selection_ok = self
            .selection_cache
            .entry(selection)
            .or_insert_with(|| {
                Rc::new(offerings.iter().map(|o| node_affinity_matches(pod, &o.labels, "") && taints_tolerated(pod, &o.taints, false)).collect())
            })
            .clone();
        let (selection_ok, allocs) = (&group.selection_ok, &self.allocs);
        group.static_ok = self
            .static_cache
            .entry(key)
            .or_insert_with(|| {
                let fits: Vec<bool> = allocs.iter().map(|a| pod.requests.fits(a)).collect();
                Rc::new(offerings.iter().zip(selection_ok.iter()).map(|(o, &ok)| ok && fits[o.alloc_id]).collect())
            })
            .clone();
        let spread_keys = group.terms.spread.iter().map(|s| (self.topo.key_of_term(s.term), s.node_affinity_policy, s.node_taints_policy)).collect();
        let eligible_key = (selection, spread_keys);
        group.eligible_existing_domains = match self.eligible_cache.get(&eligible_key) {
            Some(eligible) => eligible.clone(),
            None => {
                let eligible = Rc::new(self.eligible_existing_domains(pod, &group.terms));
                self.eligible_cache.insert(eligible_key, eligible.clone());
                eligible
            }
        };
        group.spread_counts = self.count_spread(pod, &group.terms, 0..self.slots.len());
        group.spread_counts_now = self.count_spread(pod, &group.terms, self.existing.iter().copied());
    }

    /// Minimum counts for the group's spread terms, as kube-scheduler would
    /// see them now (existing nodes only) and once the plan's claims and the
    /// free inventory are counted as domains too.
    /// Also returns, per spread term, whether its planned minimum is pinned
    /// at zero by a fresh host on offer: then a host over the skew stays over
    /// it until the inventory changes.
    fn spread_minimums(&self, group: &mut Group) -> Minimums {
        let pod = &self.snap.pods[group.pods[0]];
        // Then a claim is a domain of a term when it has the term's key.
        let unconstrained = pod.node_selector.is_empty()
            && pod.node_affinity.is_empty()
            && group.terms.spread.len() == 1
            && group.terms.spread[0].node_taints_policy == InclusionPolicy::Ignore;
        let mut now = Vec::new();
        let mut planned = Vec::new();
        let mut pinned = Vec::new();
        for (i, s) in group.terms.spread.iter().enumerate() {
            let existing = &group.eligible_existing_domains[i];
            // A pod bound now is weighed against the pods Ready nodes hold,
            // not those still waiting for a claim in the same domain.
            now.push(TopologyIndex::spread_min(s, &group.spread_counts_now[i], existing.iter().copied()));
            let key = self.topo.key_of_term(s.term);
            let cached = group.offered_domains[i].as_ref().filter(|(epoch, _, _)| *epoch == self.inventory_epoch);
            let (offered, fresh_host) = match cached {
                Some((_, d, f)) => (d.clone(), *f),
                None => {
                    let mut offered = Vec::new();
                    let mut seen = vec![false; self.topo.domain_count()];
                    let mut fresh_host = false;
                    for (o, off) in self.offerings.iter().enumerate() {
                        let class = &self.classes[off.class];
                        if !class.has_free() || !group.static_ok[o] {
                            continue;
                        }
                        if key == self.hostname_key {
                            fresh_host = true;
                            break;
                        }
                        if let Some(d) = off.domains[key]
                            && !std::mem::replace(&mut seen[d as usize], true)
                        {
                            offered.push(d);
                            if offered.len() == self.offering_domains_per_key[key] {
                                break;
                            }
                        }
                    }
                    group.offered_domains[i] = Some((self.inventory_epoch, offered.clone(), fresh_host));
                    (offered, fresh_host)
                }
            };
            pinned.push(fresh_host);
            if fresh_host {
                // A new host is a domain of its own with no pods yet.
                planned.push(0);
                continue;
            }
            let mut domains = existing.clone();
            if unconstrained {
                domains.extend(self.claim_domains.get(key).into_iter().flatten().copied());
            } else {
                for &c in &self.claims {
                    if self.spread_counts_slot(pod, &group.terms, i, c)
                        && let Some(d) = self.slots[c].domains[key]
                    {
                        domains.push(d);
                    }
                }
            }
            domains.extend(offered);
            // A domain twice does not change the least count; only
            // minDomains counts the domains, and then each once.
            if s.min_domains > 1 {
                domains.sort_unstable();
                domains.dedup();
            }
            planned.push(TopologyIndex::spread_min(s, &group.spread_counts[i], domains.into_iter()));
        }
        Minimums { now, planned, pinned }
    }

    fn place(&mut self, pod_index: usize, group: &mut Group) {
        let pod = &self.snap.pods[pod_index];
        let Minimums { now: min_now, planned: min_planned, pinned } =
            if group.terms.spread.is_empty() { Minimums::default() } else { self.spread_minimums(group) };
        let mut live = std::mem::take(&mut self.lives[group.live]);
        if !group.terms.spread.is_empty() && group.live != group.shape_live && live.epoch != self.inventory_epoch {
            let shape = &self.lives[group.shape_live];
            live.epoch = self.inventory_epoch;
            live.claims.clone_from(&shape.claims);
            live.claims_seen = shape.claims_seen;
        }
        // 1. Ready nodes: as they are, then as they will be once the claims
        // are nodes. With minDomains, a node refused now for want of domains
        // takes the pod once a claim adds one: it waits for that claim
        // without a server of its own. Weighed against the planned minimum,
        // over every domain the plan may yet add: a claim opened later in a
        // domain of its own lowers the minimum the pod binds under.
        let mut found = self.first_fit(pod_index, pod, group, &mut live.existing, &min_now, &[]);
        if found.is_none() && !group.terms.spread.is_empty() && min_planned != min_now {
            found = self.first_fit(pod_index, pod, group, &mut live.existing, &min_planned, &[]);
        }
        // 2. Claims in flight, then claims this plan opened.
        if found.is_none() {
            live.claims.extend_from_slice(&self.claims[live.claims_seen..]);
            live.claims_seen = self.claims.len();
            found = self.first_fit(pod_index, pod, group, &mut live.claims, &min_planned, &pinned);
        }
        self.lives[group.live] = live;
        if let Some(slot) = found {
            self.commit(pod_index, group, slot);
            return;
        }
        // 3. A new claim.
        if let Some(slot) = self.open_claim(pod_index, group, &min_planned) {
            self.commit(pod_index, group, slot);
        }
    }

    /// The first slot of `live` the pod fits; slots that can never take a
    /// pod of this shape again are dropped from `live` on the way.
    fn first_fit(
        &self,
        pod_index: usize,
        pod: &Pod,
        group: &Group,
        live: &mut Vec<usize>,
        spread_min: &[u32],
        spread_pinned: &[bool],
    ) -> Option<usize> {
        let mut found = None;
        let mut dropped = 0;
        // A list the group borrows from its shape loses only the slots no
        // pod of the shape can take.
        let borrowed = group.live == group.shape_live && !group.independent;
        for slot in live.iter_mut() {
            match self.fits_slot(pod_index, pod, group, *slot, spread_min, spread_pinned) {
                Ok(()) => {
                    found = Some(*slot);
                    break;
                }
                Err(Refusal::Shape) => {
                    *slot = usize::MAX;
                    dropped += 1;
                }
                Err(Refusal::Group) if !borrowed => {
                    *slot = usize::MAX;
                    dropped += 1;
                }
                Err(_) => {}
            }
        }
        if dropped > 0 {
            live.retain(|&s| s != usize::MAX);
        }
        found
    }

    /// Whether the pod fits the slot now; if not, for how long and for whom.
    fn fits_slot(&self, pod_index: usize, pod: &Pod, group: &Group, slot: usize, spread_min: &[u32], spread_pinned: &[bool]) -> Result<(), Refusal> {
        let s = &self.slots[slot];
        // Inter-pod terms first: over a plan's many claims they are what
        // fails most often for the pods that have them, and cheap to check.
        // A failure adding pods can undo keeps the slot, to be checked in
        // full once they pass.
        let t = &group.terms;
        let inter_pod = !(t.affinity.is_empty() && t.anti_affinity.is_empty() && t.spread.is_empty() && t.repelled_by.is_empty());
        if inter_pod && let Err(m) = self.topo.check(t, &s.domains, &group.spread_counts, spread_min) {
            let permanent = match m {
                TopologyMismatch::Spread { index, .. } => spread_pinned.get(index).copied().unwrap_or(false),
                other => other.is_permanent(),
            };
            return Err(if permanent { Refusal::Group } else { Refusal::ForNow });
        }
        // Then room: for every other pod, the reason most slots turn it
        // down, and a lasting one.
        if self.short_of_room(pod, s) {
            return Err(Refusal::Shape);
        }
        match &s.kind {
            SlotKind::New(n) => {
                if let Some(d) = self.deadline_of(pod, n.pool) {
                    let claim_meets = n.candidates.iter().any(|&c| self.offerings[c].eta_s as i64 <= d && n.admits(&self.offerings, c));
                    if !claim_meets && self.any_offering_meets(n.pool, d) {
                        // A faster server is free for this pod: do not slow it down.
                        return Err(Refusal::ForNow);
                    }
                }
            }
            _ => {
                // Room kept for a claim's own pods is not this pod's, unless
                // it is one of them; kept room comes free, so not for good.
                if s.reserved != Resources::default()
                    && self.reserved_for.get(&pod_index) != Some(&slot)
                    && !pod.requests.fits(&s.free.minus(&s.reserved))
                {
                    return Err(Refusal::ForNow);
                }
            }
        }
        if pod.host_ports.iter().any(|want| s.ports.iter().any(|used| used.conflicts(want))) {
            return Err(Refusal::Group);
        }
        let admitted = match &s.kind {
            // A claim's node has its offering's labels and taints, and a
            // hostname of its own.
            SlotKind::New(n) if group.hostless => group.selection_ok[n.offering],
            _ => node_affinity_matches(pod, &s.labels, &s.name) && taints_tolerated(pod, &s.taints, s.cordoned),
        };
        if !admitted {
            return Err(Refusal::Shape);
        }
        Ok(())
    }

    /// Whether the pod asks for more of a resource than the slot has left:
    /// the reason most slots turn a pod down, and a lasting one. A claim
    /// never holds more than its offering's allocatable (each pod it took
    /// fitted), so only what the pod asks for needs a look.
    fn short_of_room(&self, pod: &Pod, s: &Slot) -> bool {
        let want = &pod.requests;
        let over = |w: i64, left: i64| w > 0 && w > left;
        match &s.kind {
            SlotKind::New(n) => {
                let (cap, used) = (&self.offerings[n.offering].alloc, &n.requested);
                over(want.cpu_milli, cap.cpu_milli - used.cpu_milli)
                    || over(want.memory_bytes, cap.memory_bytes - used.memory_bytes)
                    || over(want.pods, cap.pods - used.pods)
                    || over(want.ephemeral_bytes, cap.ephemeral_bytes - used.ephemeral_bytes)
                    || want.extended.iter().any(|(name, w)| over(*w, cap.extended(name) - used.extended(name)))
            }
            _ => !want.fits(&s.free),
        }
    }

    fn any_offering_meets(&self, pool: usize, deadline_s: i64) -> bool {
        self.offerings_by_pool[pool].iter().any(|&o| {
            let off = &self.offerings[o];
            let class = &self.classes[off.class];
            class.has_free() && off.eta_s as i64 <= deadline_s
        })
    }

    fn limit_breach(&self, pool: usize, off: &Offering) -> Option<String> {
        let l = &self.pools[pool].limits;
        if *l == Limits::default() {
            return None;
        }
        let u = &self.usage[pool];
        let over = |limit: Option<i64>, used: i64, add: i64| limit.is_some_and(|m| add > 0 && used + add > m);
        if over(l.servers, u.servers, 1) {
            return Some(format!("servers {} of {}", u.servers, l.servers.unwrap_or(0)));
        }
        if over(l.cpu_milli, u.cpu_milli, off.capacity.cpu_milli) {
            return Some(format!(
                "cpu {} + {} > {}",
                crate::quantity::format_cpu_milli(u.cpu_milli),
                crate::quantity::format_cpu_milli(off.capacity.cpu_milli),
                crate::quantity::format_cpu_milli(l.cpu_milli.unwrap_or(0))
            ));
        }
        if over(l.memory_bytes, u.memory_bytes, off.capacity.memory_bytes) {
            return Some(format!(
                "memory {} + {} > {}",
                crate::quantity::format_bytes(u.memory_bytes),
                crate::quantity::format_bytes(off.capacity.memory_bytes),
                crate::quantity::format_bytes(l.memory_bytes.unwrap_or(0))
            ));
        }
        if over(l.gpus, u.gpus, off.capacity.gpus()) {
            return Some(format!("gpus {} + {} > {}", u.gpus, off.capacity.gpus(), l.gpus.unwrap_or(0)));
        }
        if let Some(w) = l.watts
            && u.watts + off.power.peak_watts > w
        {
            return Some(format!("watts {:.0} + {:.0} > {:.0}", u.watts, off.power.peak_watts, w));
        }
        None
    }

    fn power_breach(&self, off: &Offering) -> Option<Unschedulable> {
        let budget = self.snap.power_budget_watts?;
        if off.warm || self.fleet_peak_watts + off.power.peak_watts <= budget {
            return None;
        }
        Some(Unschedulable::PowerBudget { budget_watts: budget, needed_watts: self.fleet_peak_watts + off.power.peak_watts - budget })
    }

    /// Why powering on a server of the offering must wait for the
    /// transition rate of its group; a warm one needs no power change.
    fn rate_breach(&self, off: &Offering) -> Option<Unschedulable> {
        if off.warm || !self.gate.limits() {
            return None;
        }
        let refusal = self.gate.refusal(&self.snap.servers[self.classes[off.class].sample], true)?;
        Some(Unschedulable::TransitionRate { refusal })
    }

    fn open_claim(&mut self, pod_index: usize, group: &mut Group, spread_min: &[u32]) -> Option<usize> {
        let pod = &self.snap.pods[pod_index];
        let mut blocked: Option<Unschedulable> = None;
        for pi in 0..self.pool_order.len() {
            let pool = self.pool_order[pi];
            let mut anchor: Option<usize> = None;
            for &o in &self.offerings_by_pool[pool] {
                if !group.static_ok[o] {
                    continue;
                }
                let off = &self.offerings[o];
                let class = &self.classes[off.class];
                if !class.unlimited && class.free.is_empty() {
                    continue;
                }
                if let Some(limit) = self.limit_breach(pool, off) {
                    blocked.get_or_insert(Unschedulable::PoolLimit { pool: self.pools[pool].name.clone(), limit });
                    continue;
                }
                if let Some(reason) = self.power_breach(off).or_else(|| self.rate_breach(off)) {
                    blocked.get_or_insert(reason);
                    continue;
                }
                let mut domains = off.domains.clone();
                domains[self.hostname_key] = Some(u32::MAX); // a new host: no pods yet
                if let Err(m) = self.topo.check(&group.terms, &domains, &group.spread_counts, spread_min) {
                    blocked.get_or_insert(Unschedulable::Topology { constraint: self.topo.describe(&m) });
                    continue;
                }
                anchor = Some(o);
                break;
            }
            let Some(anchor) = anchor else { continue };
            // The pool's limits, the fleet's budget and the transition rates
            // are checked only where one is set.
            let bounded = self.pools[pool].limits != Limits::default() || self.snap.power_budget_watts.is_some() || self.gate.limits();
            let peers = &self.peers[self.offerings[anchor].peers];
            let static_ok = group.static_ok.as_slice();
            let mut candidates: Vec<usize> = Vec::new();
            for &(o, class) in peers {
                if static_ok[o] && self.classes[class].has_free() {
                    candidates.push(o);
                }
            }
            if bounded {
                candidates.retain(|&o| {
                    let off = &self.offerings[o];
                    self.limit_breach(pool, off).is_none() && self.power_breach(off).is_none() && self.rate_breach(off).is_none()
                });
            }
            let (server, name) = self.take(anchor);
            let deadline_s = self.deadline_of(pod, pool);
            let candidates = Candidates { offerings: candidates, selection: group.selection_ok.clone() };
            return Some(self.push_new_slot(pool, anchor, server, name, candidates, deadline_s));
        }
        group.blocked = blocked;
        None
    }

    /// Reserves a server of the offering's class: its index and node name.
    fn take(&mut self, offering: usize) -> (usize, String) {
        let off = &self.offerings[offering];
        let (pool, capacity, peak, warm) = (off.pool, off.capacity.clone(), off.power.peak_watts, off.warm);
        let class = &mut self.classes[off.class];
        let (server, name) = if class.unlimited {
            class.minted += 1;
            (class.sample, format!("{}-{}", self.snap.servers[class.sample].name, class.minted))
        } else {
            // Callers only take from offerings whose class has a free server.
            let server = class.free.pop().unwrap_or(class.sample);
            if class.free.is_empty() {
                self.inventory_epoch += 1;
            }
            (server, self.snap.servers[server].name.clone())
        };
        self.charge(pool, &capacity, peak, 1.0);
        if !warm {
            self.fleet_peak_watts += peak;
            self.gate.take(&self.snap.servers[server]);
        }
        (server, name)
    }

    fn release(&mut self, offering: usize, server: usize) {
        let off = &self.offerings[offering];
        let (pool, capacity, peak, warm) = (off.pool, off.capacity.clone(), off.power.peak_watts, off.warm);
        let class = &mut self.classes[off.class];
        if !class.unlimited {
            class.free.push(server);
            if class.free.len() == 1 {
                self.inventory_epoch += 1;
            }
        }
        self.charge(pool, &capacity, peak, -1.0);
        if !warm {
            self.fleet_peak_watts -= peak;
            self.gate.give(&self.snap.servers[server]);
        }
    }

    fn push_new_slot(&mut self, pool: usize, offering: usize, server: usize, name: String, candidates: Candidates, deadline_s: Option<i64>) -> usize {
        let mut labels = self.offerings[offering].labels.clone();
        labels.insert(HOSTNAME.to_string(), name.clone());
        let domains = self.topo.domains_of(&labels);
        self.note_claim_domains(&domains);
        self.claims.push(self.slots.len());
        self.slots.push(Slot {
            name,
            kind: SlotKind::New(NewSlot {
                pool,
                offering,
                server,
                candidates: candidates.offerings,
                selections: vec![candidates.selection],
                requested: Resources::default(),
                deadline_s,
            }),
            labels,
            taints: self.offerings[offering].taints.clone(),
            cordoned: false,
            free: Resources::default(),
            reserved: Resources::default(),
            ports: Vec::new(),
            domains,
            pods: Vec::new(),
        });
        self.slots.len() - 1
    }

    fn note_claim_domains(&mut self, domains: &[Option<DomainId>]) {
        if self.claim_domains.len() < domains.len() {
            self.claim_domains.resize(domains.len(), Default::default());
        }
        for (k, d) in domains.iter().enumerate() {
            if let Some(d) = d {
                self.claim_domains[k].insert(*d);
            }
        }
    }

    fn commit(&mut self, pod_index: usize, group: &mut Group, slot: usize) {
        let pod = &self.snap.pods[pod_index];
        for i in 0..group.terms.spread.len() {
            let st = group.terms.spread[i];
            if st.counts_self
                && self.spread_counts_slot(pod, &group.terms, i, slot)
                && let Some(d) = self.slots[slot].domains[self.topo.key_of_term(st.term)]
            {
                let on_node = matches!(self.slots[slot].kind, SlotKind::Existing);
                for counts in [Some(&mut group.spread_counts[i]), on_node.then_some(&mut group.spread_counts_now[i])].into_iter().flatten() {
                    if counts.len() <= d as usize {
                        counts.resize(d as usize + 1, 0);
                    }
                    counts[d as usize] += 1;
                }
            }
        }
        let terms = &group.terms;
        if let Some(kept) = self.reserved_for.remove(&pod_index) {
            self.slots[kept].reserved.sub(&pod.requests);
        }
        let deadline = match &self.slots[slot].kind {
            SlotKind::New(n) => self.deadline_of(pod, n.pool),
            _ => None,
        };
        let s = &mut self.slots[slot];
        match &mut s.kind {
            SlotKind::New(n) => {
                n.requested.add(&pod.requests);
                if !n.selections.iter().any(|sel| Rc::ptr_eq(sel, &group.selection_ok)) {
                    n.selections.push(group.selection_ok.clone());
                }
                if let Some(d) = deadline {
                    n.deadline_s = Some(n.deadline_s.map_or(d, |cur| cur.min(d)));
                }
            }
            _ => s.free.sub(&pod.requests),
        }
        s.ports.extend(pod.host_ports.iter().cloned());
        s.pods.push(pod_index);
        self.topo.place(terms, &self.slots[slot].domains, slot, false);
        self.placement[pod_index] = Some(slot);
    }

    /// Swaps each new claim's server for the best candidate that still fits
    /// its pods: deadline met, fewest added watts, least waste.
    fn right_size(&mut self) {
        let claim_slots: Vec<usize> = self.claims.iter().copied().filter(|&c| matches!(self.slots[c].kind, SlotKind::New(_))).collect();
        for slot in claim_slots {
            let SlotKind::New(n) = &self.slots[slot].kind else { continue };
            let (pool, offering, server, requested, deadline) = (n.pool, n.offering, n.server, n.requested.clone(), n.deadline_s);
            let pod_requests = requested;
            let candidates: Vec<usize> = n.candidates.iter().copied().filter(|&c| n.admits(&self.offerings, c)).collect();
            self.release(offering, server);
            let score = |s: &Self, o: usize| {
                let off = &s.offerings[o];
                let missed = deadline.is_some_and(|d| off.eta_s as i64 > d);
                // What the server draws more with the claim's pods (and the
                // DaemonSets that land with them) on it than without
                // (`PowerProfile::compared_watts`): no idle watts on a
                // server already on.
                let (cap, alloc) = (&off.capacity, &off.alloc);
                let gpu_milli = pod_requests.gpu_milli() + cap.gpu_milli() - alloc.gpu_milli();
                let idle = if off.warm { 0.0 } else { off.power.idle_watts };
                let added = idle + off.power.stated_gpu_watts(cap, gpu_milli);
                let waste = {
                    let frac = |f: i64, t: i64| if t > 0 { f as f64 / t as f64 } else { 0.0 };
                    let a = &off.alloc;
                    frac(a.cpu_milli - pod_requests.cpu_milli, a.cpu_milli)
                        + frac(a.memory_bytes - pod_requests.memory_bytes, a.memory_bytes)
                        + 10.0 * (a.gpus() - pod_requests.gpus()) as f64
                };
                (missed, off.failures, added, waste, off.eta_s, o)
            };
            let mut best: Option<(usize, Score)> = None;
            for &c in &candidates {
                let off = &self.offerings[c];
                let class = &self.classes[off.class];
                if !class.has_free() || self.limit_breach(pool, off).is_some() || self.power_breach(off).is_some() || self.rate_breach(off).is_some()
                {
                    continue;
                }
                let sc = score(self, c);
                let better = match &best {
                    None => true,
                    Some((_, b)) => (sc.0, sc.1)
                        .cmp(&(b.0, b.1))
                        .then(sc.2.total_cmp(&b.2))
                        .then(sc.3.total_cmp(&b.3))
                        .then((sc.4, sc.5).cmp(&(b.4, b.5)))
                        .is_lt(),
                };
                if better {
                    best = Some((c, sc));
                }
            }
            // The original reservation is always a candidate, so `best` exists;
            // fall back to it all the same rather than lose the claim.
            let chosen = best.map(|(c, _)| c).unwrap_or(offering);
            let (new_server, name) = self.take(chosen);
            let s = &mut self.slots[slot];
            s.name = name.clone();
            s.labels.insert(HOSTNAME.to_string(), name);
            if let SlotKind::New(n) = &mut s.kind {
                n.offering = chosen;
                n.server = new_server;
            }
        }
    }

    /// `keys` holds the name of every pending pod, by index in the snapshot.
    fn report(&self, pending: &[usize], groups: &[Group], group_of: &HashMap<GroupKey<'_>, usize>, mut keys: Vec<Option<String>>) -> Provisioning {
        let snap = self.snap;
        let mut claims = Vec::new();
        let mut claim_of_slot: HashMap<usize, usize> = HashMap::new();
        for &slot in &self.claims {
            let s = &self.slots[slot];
            let SlotKind::New(n) = &s.kind else { continue };
            let off = &self.offerings[n.offering];
            claim_of_slot.insert(slot, claims.len());
            claims.push(NewClaim {
                name: format!("{}-{}", self.pools[n.pool].name, s.name),
                server: s.name.clone(),
                pool: self.pools[n.pool].name.clone(),
                pods: s.pods.iter().map(|&p| keys[p].clone().unwrap_or_else(|| snap.pods[p].key())).collect(),
                path: if off.warm { SupplyPath::Warm } else { SupplyPath::Cold },
                eta_s: off.eta_s,
                requested: n.requested.plus(&off.capacity.minus(&off.alloc)),
                capacity: off.capacity.clone(),
                added_idle_watts: if off.warm { 0.0 } else { off.power.idle_watts },
                deadline_missed: n.deadline_s.is_some_and(|d| off.eta_s as i64 > d),
            });
        }
        let mut decisions = Vec::with_capacity(pending.len());
        // Pods of one group are told the same reason: diagnosed once.
        let mut diagnosed: HashMap<usize, Unschedulable> = HashMap::default();
        for &p in pending {
            let pod = &snap.pods[p];
            let outcome = match self.placement[p] {
                Some(slot) => {
                    let s = &self.slots[slot];
                    match &s.kind {
                        SlotKind::Existing => Outcome::Existing { node: s.name.clone() },
                        SlotKind::InFlight { claim, eta_s } => Outcome::InFlight { claim: claim.clone(), server: s.name.clone(), eta_s: *eta_s },
                        SlotKind::New(_) => {
                            let c = &claims[claim_of_slot[&slot]];
                            Outcome::NewClaim {
                                claim: c.name.clone(),
                                server: c.server.clone(),
                                path: c.path,
                                eta_s: c.eta_s,
                                deadline_missed: c.deadline_missed,
                            }
                        }
                    }
                }
                None => {
                    let g = group_of[&GroupKey::of(pod)];
                    let reason = diagnosed.entry(g).or_insert_with(|| self.diagnose(pod, &groups[g])).clone();
                    Outcome::Unschedulable { reason }
                }
            };
            decisions.push(PodDecision { pod: keys[p].take().unwrap_or_else(|| pod.key()), workload: pod.workload.clone(), outcome, resize: None });
        }
        Provisioning { pods: decisions, claims }
    }

    /// Says exactly why a pod found no place: which constraint no server
    /// meets, or how the matching servers are taken, or which ceiling holds.
    fn diagnose(&self, pod: &Pod, group: &Group) -> Unschedulable {
        let snap = self.snap;
        let mut mismatches: BTreeMap<String, usize> = BTreeMap::new();
        let mut matching = 0;
        let (mut in_use, mut claimed_now, mut failed, mut quarantined, mut maintenance, mut free) = (0, 0, 0, 0, 0, 0);
        let (mut unadopted, mut mismatched, mut misconfigured) = (0, 0, 0);
        // The offerings of each class's sample server, in their order: one
        // pass over them, not one per class.
        let mut by_sample: HashMap<usize, Vec<&Offering>> = HashMap::new();
        for o in &self.offerings {
            by_sample.entry(self.classes[o.class].sample).or_default().push(o);
        }
        for class in &self.classes {
            let sample = &snap.servers[class.sample];
            let offerings: &[&Offering] = by_sample.get(&class.sample).map_or(&[], Vec::as_slice);
            if offerings.is_empty() {
                *mismatches.entry("ServerPool requirements (no ServerPool admits the server)".into()).or_default() += class.members.len();
                continue;
            }
            let first_mismatch = offerings.iter().find_map(|o| {
                let m = check_node_affinity(pod, &o.labels, &sample.name)
                    .and_then(|_| check_taints(pod, &o.taints, false))
                    .and_then(|_| pod.requests.fits_in(&o.alloc).map_err(NodeMismatch::Resources));
                m.err()
            });
            let ok = offerings.iter().any(|o| {
                check_node_affinity(pod, &o.labels, &sample.name).is_ok()
                    && check_taints(pod, &o.taints, false).is_ok()
                    && pod.requests.fits(&o.alloc)
            });
            if !ok {
                let m = first_mismatch.map(|m| generalize(&m)).unwrap_or_else(|| "unknown".into());
                *mismatches.entry(m).or_default() += class.members.len();
                continue;
            }
            if class.unlimited {
                matching += 1;
                free += 1;
                continue;
            }
            for &i in &class.members {
                let s = &snap.servers[i];
                matching += 1;
                match s.health {
                    Health::Failed => failed += 1,
                    Health::Quarantined => quarantined += 1,
                    Health::Maintenance => maintenance += 1,
                    Health::Unadopted => unadopted += 1,
                    Health::IdentityMismatch => mismatched += 1,
                    Health::Misconfigured => misconfigured += 1,
                    Health::Healthy if s.claim.is_some() || s.node.is_some() => in_use += 1,
                    Health::Healthy if !class.free.contains(&i) => claimed_now += 1,
                    Health::Healthy => free += 1,
                }
            }
        }
        if matching == 0 {
            let mut constraints: Vec<(String, usize)> = mismatches.into_iter().collect();
            constraints.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            constraints.truncate(4);
            return Unschedulable::NoMatchingHardware { servers: snap.servers.len(), constraints };
        }
        if free == 0 {
            return Unschedulable::AllMatchingBusy {
                matching,
                in_use,
                claimed_now,
                failed,
                quarantined,
                maintenance,
                unadopted,
                mismatched,
                misconfigured,
            };
        }
        group.blocked.clone().unwrap_or(Unschedulable::Topology { constraint: "the pod's inter-pod constraints".to_string() })
    }
}

/// Turns a per-server mismatch into a statement about the inventory, so that
/// servers failing the same way count together.
fn generalize(m: &NodeMismatch) -> String {
    match m {
        NodeMismatch::Resources(s) => format!("{} (requests {})", s.resource, {
            match s.resource.as_str() {
                "cpu" => crate::quantity::format_cpu_milli(s.requested),
                "memory" | "ephemeral-storage" => crate::quantity::format_bytes(s.requested),
                _ => s.requested.to_string(),
            }
        }),
        other => other.to_string(),
    }
}

/// Pending pods grouped by [`GroupKey`]: the part of a decision that needs
/// the snapshot alone, so a large one is grouped on a second thread while
/// the first builds the inventory.
struct Grouping<'s> {
    /// The pods that want a place, by index in the snapshot.
    pending: Vec<usize>,
    group_of: HashMap<GroupKey<'s>, usize>,
    /// Each group's pods in creation order; groups in order of first
    /// appearance.
    members: Vec<Vec<usize>>,
    /// Creation time of each pending pod, by index in the snapshot.
    created: Vec<Seconds>,
    /// Each group's cpu and memory request.
    size: Vec<(i64, i64)>,
}

impl<'s> Grouping<'s> {
    /// What the orders of a decision read of a pod is copied out while the
    /// pod is at hand: read through each pod's own allocation, every
    /// comparison of a sort would wait on memory.
    fn of(snap: &'s Snapshot) -> Self {
        let pending: Vec<usize> = (0..snap.pods.len()).filter(|&i| snap.pods[i].is_pending_demand()).collect();
        let mut group_of: HashMap<GroupKey<'s>, usize> = HashMap::with_capacity(pending.len());
        let mut members: Vec<Vec<usize>> = Vec::new();
        let mut created: Vec<Seconds> = vec![0; snap.pods.len()];
        let mut size: Vec<(i64, i64)> = Vec::new();
        for &i in &pending {
            let pod = &snap.pods[i];
            created[i] = pod.created_s;
            let next = members.len();
            let g = *group_of.entry(GroupKey::of(pod)).or_insert(next);
            if g == next {
                members.push(Vec::new());
                size.push((pod.requests.cpu_milli, pod.requests.memory_bytes));
            }
            members[g].push(i);
        }
        for pods in &mut members {
            if !pods.is_sorted_by_key(|&i| created[i]) {
                pods.sort_by_key(|&i| (created[i], i));
            }
        }
        Grouping { pending, group_of, members, created, size }
    }
}

/// The scheduling-relevant part of a pod: pods with equal keys are
/// interchangeable for placement.
#[derive(PartialEq, Eq, Hash)]
struct GroupKey<'p> {
    namespace: &'p str,
    labels: &'p Labels,
    requests: &'p Resources,
    node_selector: &'p Labels,
    node_affinity: &'p [crate::labels::NodeSelectorTerm],
    tolerations: &'p [crate::labels::Toleration],
    pod_affinity: &'p [PodAffinityTerm],
    pod_anti_affinity: &'p [PodAffinityTerm],
    topology_spread: &'p [TopologySpread],
    host_ports: &'p [HostPort],
    deadline_s: Option<Seconds>,
}

impl<'p> GroupKey<'p> {
    fn of(pod: &'p Pod) -> Self {
        GroupKey {
            namespace: &pod.namespace,
            labels: &pod.labels,
            requests: &pod.requests,
            node_selector: &pod.node_selector,
            node_affinity: &pod.node_affinity,
            tolerations: &pod.tolerations,
            pod_affinity: &pod.pod_affinity,
            pod_anti_affinity: &pod.pod_anti_affinity,
            topology_spread: &pod.topology_spread,
            host_ports: &pod.host_ports,
            deadline_s: pod.deadline_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Resources;

    /// Two threads or one, the same plan: on a snapshot large enough to
    /// take the second thread, and on one with every kind of constraint.
    #[test]
    fn a_plan_is_the_same_on_one_thread_or_two() {
        let large = crate::shapes::bare_metal(ASIDE_FROM);
        assert!(large.pods.len() >= ASIDE_FROM);
        for snap in [large, crate::shapes::reference(1000)] {
            let one = serde_json::to_string(&plan_of(&snap, 0, false)).expect("a plan serializes");
            let two = serde_json::to_string(&plan_of(&snap, 0, true)).expect("a plan serializes");
            assert!(one == two, "the plans differ");
            assert!(one.contains("new_claim"), "the snapshot opens claims");
        }
    }

    /// Of two free servers that both fit, a claim takes the one that draws
    /// less with its pods on it, not the one that idles lower: a small GPU
    /// server idles at fewer watts than a large one, but its GPU draws more
    /// under load.
    #[test]
    fn a_claim_takes_the_server_that_draws_least_with_its_pods_on_it() {
        let gi = 1i64 << 30;
        // Idles at 87 W; its one GPU adds 265 W at full use.
        let mut small = Server::new("small", Resources::new(8_000, 32 * gi).with_pods(110)).with_gpus("V100", 1);
        small.power = PowerProfile { gpu_watts: Some(265.0), ..PowerProfile::new(87.0, 378.0, 120.0, 11.0) };
        // Idles at 215 W; each of its two GPUs adds 60 W at full use.
        let mut large = Server::new("large", Resources::new(104_000, 512 * gi).with_pods(110)).with_gpus("T4", 2);
        large.power = PowerProfile { gpu_watts: Some(120.0), ..PowerProfile::new(215.0, 673.0, 300.0, 12.0) };
        let mut requests = Resources::new(6_000, 12 * gi).with_pods(1);
        requests.set_extended(crate::resources::GPU, 1);
        let snap = Snapshot {
            pods: vec![Pod::new("app", "infer", requests)].into(),
            servers: vec![small.clone(), large.clone()],
            pools: vec![ServerPool::new("default")],
            ..Default::default()
        };
        let plan = provision(&snap, 0);
        let Some(Outcome::NewClaim { server, .. }) = plan.decision("app/infer").map(|d| &d.outcome) else { panic!("no new claim: {:?}", plan.pods) };
        // 215 + 60 W against 87 + 265 W.
        let draw = |s: &Server| s.power.idle_watts + s.power.load_watts(&s.capacity, 0, 1_000);
        assert!(draw(&large) < draw(&small), "{} vs {}", draw(&large), draw(&small));
        assert_eq!(server, "large");
    }

    /// Servers whose profiles say nothing of their GPUs' draw, or that
    /// have none, are compared by idle watts, then by the capacity they
    /// would waste: an unstated profile is the same on a large server and
    /// a small one, and its load per core says nothing of the hardware.
    #[test]
    fn without_a_stated_gpu_draw_a_claim_takes_the_tightest_fit() {
        let gi = 1i64 << 30;
        for gpus in [0, 2] {
            let server = |name: &str, cores: i64| {
                let s = Server::new(name, Resources::new(cores * 1000, cores * 2 * gi).with_pods(110));
                if gpus > 0 { s.with_gpus("T4", gpus) } else { s }
            };
            let mut requests = Resources::new(16_000, 32 * gi).with_pods(1);
            requests.set_extended(crate::resources::GPU, gpus.min(1));
            let snap = Snapshot {
                pods: vec![Pod::new("app", "job", requests)].into(),
                servers: vec![server("roomy", 48), server("tight", 20)],
                pools: vec![ServerPool::new("default")],
                ..Default::default()
            };
            let plan = provision(&snap, 0);
            let Some(Outcome::NewClaim { server, .. }) = plan.decision("app/job").map(|d| &d.outcome) else {
                panic!("no new claim: {:?}", plan.pods)
            };
            assert_eq!(server, "tight", "with {gpus} GPUs");
        }
    }

    /// `same_hardware` is the equality of `hardware_key`, field by field.
    #[test]
    fn same_hardware_agrees_with_the_hardware_key() {
        let base = Server::new("a", Resources::new(32_000, 128 << 30)).with_labels(&[("zone", "z1"), (HOSTNAME, "a")]);
        let mut variants = vec![base.clone()];
        let mut other_host = base.clone().with_labels(&[(HOSTNAME, "b")]);
        other_host.name = "b".into();
        variants.push(other_host);
        variants.push(base.clone().with_labels(&[("zone", "z2")]));
        variants.push(base.clone().with_labels(&[("rack", "r1")]));
        variants.push(Server::new("a", Resources::new(32_000, 64 << 30)).with_labels(&[("zone", "z1")]));
        let mut hot = base.clone();
        hot.power.idle_watts += 1.0;
        variants.push(hot);
        let mut told = base.clone();
        told.power.gpu_watts = Some(0.0);
        variants.push(told);
        let mut slow = base.clone();
        slow.durations.boot_s += 1;
        variants.push(slow);
        let mut failed = base.clone();
        failed.failures = 2;
        variants.push(failed);
        for a in &variants {
            for b in &variants {
                assert_eq!(same_hardware(a, b), hardware_key(a) == hardware_key(b), "{a:?} vs {b:?}");
                if same_class(a, b) {
                    assert_eq!(class_hash(a), class_hash(b));
                }
            }
        }
        assert!(same_hardware(&variants[0], &variants[1]), "the hostname does not count");
        assert!(!same_class(&variants[0], &variants[7]), "failures in a row make another class");
    }
}
