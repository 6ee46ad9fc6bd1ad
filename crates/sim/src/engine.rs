//! The discrete-event engine: a virtual clock, an event queue and a
//! simulated rack (BMCs that power servers on and off, boots with drawn
//! durations and injected faults, nodes that register, turn Ready and pass
//! their gates, a model of kube-scheduler that binds pods), driven by the
//! autoscaler that ships: [`ironclaim_driver::Autoscaler`], the same state
//! machine the controller runs. The rack implements the driver's
//! [`World`] and carries out its [`Effect`]s, answering with [`Report`]s,
//! as the controller does against the Kubernetes API and the BMCs.
//!
//! # What the rack models, and what it does not
//! - A power-on takes the server's drawn power-on time; with a BMC fault
//!   the BMC fails the request (the driver retries it). The OS then boots;
//!   with a boot fault it never comes up, with a join fault no node ever
//!   registers, with a GPU gate fault the node never passes its gates:
//!   the driver's deadlines find each of those stuck.
//! - A warm spare (powered on with no claim) boots and waits; claimed, its
//!   node registers at once and goes through its join and readiness gates.
//! - A power-off is carried out only after the same fresh checks the
//!   controller makes: the server's claim is the one named, and the node
//!   holds no workload pod.
//! - A trace pod has no owner unless the workload gives it one: then a
//!   drain may evict it, and its controller makes it again at once, a new
//!   pod (created at the eviction, its wait counted as a pod's of its own)
//!   that the scheduler model binds if it fits anywhere. Without owners
//!   the core drains no node that runs one. DaemonSet pods are evicted
//!   last by drains. No PodDisruptionBudgets are modelled.
//!
//! # Determinism
//! Events at the same second run in the order they were queued, and the
//! autoscaler steps once after them; every collection that is iterated is
//! ordered (vectors, B-trees); hash maps are only looked up. Each server
//! draws from its own seeded stream.

use crate::check::Checker;
use crate::config::{Broken, Scoring, SimConfig};
use crate::policy::{PolicyKind, Setup};
use crate::rng::{SimRng, chance, lognormal_s, stream};
use crate::workload::{HardwareClass, Workload};
use foldhash::{HashMap, HashMapExt};
use ironclaim_core::identity::{self, Links, NodeSays};
use ironclaim_core::labels::{HOSTNAME, Labels, Taint, TaintEffect};
use ironclaim_core::model::{Arrival, PowerChange, Resize, ResizeReason};
use ironclaim_core::predicates::{check_node_affinity, check_taints};
use ironclaim_core::provision::{SERVER_LABEL, SERVERPOOL_LABEL};
use ironclaim_core::transitions::CYCLE_WINDOW_S;
use ironclaim_core::{ClaimInFlight, Health, Node, Outcome, Owner, Pod, PodPhase, Pods, PowerState, Resources, Seconds, Server, Snapshot};
use ironclaim_driver::autoscaler::World;
use ironclaim_driver::lease::{LeaseTimes, Observer, Record, Round, Tenure};
use ironclaim_driver::{
    Autoscaler, ClaimRecord, ClaimView, Effect, Eviction, NodeFacts, PowerFailure, Report, ScaleDownSettings, ServerFacts, Settings, Stage,
};
use rand::RngExt;
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, VecDeque};
use std::time::Duration;

pub use ironclaim_driver::FailureReason;

/// What the run is compared on, shared by every policy: server classes,
/// ServerPool membership, unique pod names and the pods no server can host.
pub struct Prepared {
    pub classes: Vec<HardwareClass>,
    pub class_of: Vec<usize>,
    /// The ServerPool a server joins when a policy powers it on itself.
    pub pool_of: Vec<Option<usize>>,
    /// Pods with unique names, created at their arrival.
    pub pods: Vec<Pod>,
    /// Per pod: why no server of the inventory can ever host it.
    pub unplaceable: Vec<Option<String>>,
    pub end_s: Seconds,
    /// Per pod: its key (`namespace/name`).
    keys: Vec<String>,
    pod_index: HashMap<String, usize>,
    server_index: HashMap<String, usize>,
}

impl Prepared {
    /// # Assumptions
    /// Server names are unique (the readers and generators ensure it).
    pub fn new(w: &Workload, duration_s: Option<Seconds>) -> Self {
        let (classes, class_of) = w.hardware_classes();
        let mut order: Vec<usize> = (0..w.pools.len()).collect();
        order.sort_by(|&a, &b| w.pools[b].weight.cmp(&w.pools[a].weight).then(w.pools[a].name.cmp(&w.pools[b].name)));
        let pool_of = w.servers.iter().map(|s| order.iter().copied().find(|&p| w.pools[p].admits(s))).collect();
        let mut seen: HashMap<String, u32> = HashMap::new();
        let mut pods = Vec::with_capacity(w.pods.len());
        let mut pod_index = HashMap::with_capacity(w.pods.len());
        let mut keys = Vec::with_capacity(w.pods.len());
        for (i, tp) in w.pods.iter().enumerate() {
            let mut pod = tp.pod.clone();
            let n = seen.entry(pod.key()).or_insert(0);
            if *n > 0 {
                pod.name = format!("{}~{}", pod.name, n);
            }
            *n += 1;
            pod.created_s = tp.arrival_s;
            pod.node_name = None;
            pod.phase = PodPhase::Pending;
            // A pod the trace resizes belongs to a controller, which VPA
            // targets and which makes it again.
            if tp.resize.is_some() && pod.owner.is_none() {
                pod.owner = Some(Owner { kind: "ReplicaSet".into(), name: pod.workload.clone().unwrap_or_else(|| pod.name.clone()) });
            }
            let key = pod.key();
            pod_index.insert(key.clone(), i);
            keys.push(key);
            pods.push(pod);
        }
        let server_index = w.servers.iter().enumerate().map(|(i, s)| (s.name.clone(), i)).collect();
        let end_s = duration_s.unwrap_or(w.end_s);
        let mut p = Prepared { classes, class_of, pool_of, unplaceable: vec![None; pods.len()], pods, end_s, keys, pod_index, server_index };
        p.find_unplaceable(w);
        p
    }

    /// The index of the server named `name`.
    pub fn server(&self, name: &str) -> Option<usize> {
        self.server_index.get(name).copied()
    }

    /// Asks the core once, with every server free and one pod of each
    /// shape pending, which shapes no hardware can ever host.
    fn find_unplaceable(&mut self, w: &Workload) {
        let mut shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, p) in self.pods.iter().enumerate() {
            let key = format!("{:?}|{:?}|{:?}|{:?}", p.requests, p.node_selector, p.node_affinity, p.tolerations);
            shapes.entry(key).or_default().push(i);
        }
        let mut snap = Snapshot { pools: w.pools.clone(), daemonsets: w.daemonsets.clone(), servers: w.servers.clone(), ..Default::default() };
        for s in &mut snap.servers {
            s.power_state = PowerState::Off;
        }
        let reps: Vec<usize> = shapes.values().map(|v| v[0]).collect();
        for &r in &reps {
            let mut pod = self.pods[r].clone();
            pod.deadline_s = None;
            snap.pods.push(pod);
        }
        let plan = ironclaim_core::provision(&snap, 0);
        for d in &plan.pods {
            if let Outcome::Unschedulable { reason } = &d.outcome
                && reason.metric_label() == "no_matching_hardware"
                && let Some(&rep) = self.pod_index.get(&d.pod)
            {
                let text = reason.to_string();
                let key = {
                    let p = &self.pods[rep];
                    format!("{:?}|{:?}|{:?}|{:?}", p.requests, p.node_selector, p.node_affinity, p.tolerations)
                };
                for &i in &shapes[&key] {
                    self.unplaceable[i] = Some(text.clone());
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Power {
    Off,
    PoweringOn,
    On,
    Stopping,
}

/// The draws of one power-on: durations and which faults strike.
#[derive(Clone, Copy, Debug)]
struct Attempt {
    power_on_s: Seconds,
    boot_s: Seconds,
    join_s: Seconds,
    ready_s: Seconds,
    bmc_error: bool,
    boot_fails: bool,
    never_joins: bool,
    gate_fails: bool,
}

/// A node of the rack: registered by a claimed server's kubelet.
#[derive(Clone, Debug)]
struct NodeRun {
    ready_since: Option<Seconds>,
    gates_passed: bool,
    cordoned: bool,
    disrupting: bool,
}

struct Srv {
    power: Power,
    /// The OS is up (a warm spare waits here until claimed).
    booted: bool,
    /// The claim the server's status names.
    holder: Option<String>,
    health: Health,
    /// Failed claims in a row, and in all.
    in_row: u32,
    failures: u32,
    last_failure_s: Option<Seconds>,
    node: Option<NodeRun>,
    recorded_idle: Option<Seconds>,
    business_s: Option<Seconds>,
    allocated: Resources,
    workload_pods: Vec<usize>,
    daemon_pods: Vec<usize>,
    labels: Labels,
    taints: Vec<Taint>,
    rng: SimRng,
    watts: f64,
    /// Watts above idle while a schedulable node (utilisation).
    dynamic_watts: f64,
    /// Bumped when a power action starts: events of an earlier one are void.
    epoch: u64,
    attempt: Option<Attempt>,
    /// Power-on and power-off requests waiting for the action under way,
    /// by who asked.
    on_waiting: Vec<Asker>,
    off_waiting: Vec<Asker>,
    /// Its BMC reports its system UUID (recorded on the Server).
    uuid_read: bool,
    /// ironclaim powered it on and has not seen it off since.
    powered_by_ironclaim: bool,
    /// An existing worker runs on it, ironclaim's or not.
    foreign: Option<Foreign>,
    /// A NotReady Node an earlier install left, naming this server.
    stale_twin: Option<String>,
    /// Its power actions of the last day, as the controller records them
    /// on the Server's status.
    power_changes: Vec<PowerChange>,
}

/// An existing worker on a machine of the inventory: its Node carries no
/// ironclaim label (or, from a cloned image, another server's), a taint
/// that keeps ironclaim's pods off, and pods nothing may disrupt.
#[derive(Clone, Debug)]
struct Foreign {
    node: String,
    /// The server its label names, if any.
    says: Option<String>,
    pods: u32,
}

/// The firmware UUID of machine `s`, as its BMC and its kubelet report it.
fn machine_uuid(s: usize) -> String {
    format!("5e7a0000-0000-4000-8000-{s:012x}")
}

fn machine_of_uuid(uuid: &str) -> Option<usize> {
    uuid.strip_prefix("5e7a0000-0000-4000-8000-").and_then(|h| usize::from_str_radix(h, 16).ok())
}

/// No BMC of the rack is ever pointed at another machine.
static NONE_MOVED: BTreeMap<String, String> = BTreeMap::new();

/// The rack's inventory as identity sees it: each server's recorded UUID.
struct RackInventory<'e, 'a> {
    engine: &'e Engine<'a>,
}

impl identity::Inventory for RackInventory<'_, '_> {
    fn uuid_of(&self, server: &str) -> Option<Option<&str>> {
        let s = self.engine.index(server)?;
        Some(self.engine.srv[s].uuid_read.then(|| self.engine.uuids[s].as_str()))
    }
    fn server_with_uuid(&self, uuid: &str) -> Option<&str> {
        let s = machine_of_uuid(uuid).filter(|&s| s < self.engine.srv.len() && self.engine.srv[s].uuid_read)?;
        Some(self.engine.w.servers[s].name.as_str())
    }
    fn moved(&self) -> &BTreeMap<String, String> {
        &NONE_MOVED
    }
}

/// Who asked for something: a replica, in one of its lives. An answer to
/// an earlier life (before a crash or a lost lease) reaches no one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Asker {
    replica: usize,
    incarnation: u64,
}

/// One replica of the controller: its autoscaler, its view of the lease,
/// its clock and its reach to the API.
struct Replica {
    /// Taken out while the engine steps it.
    auto: Option<Autoscaler>,
    /// Crashed: down until then.
    down_until: Seconds,
    observer: Observer,
    tenure: Tenure,
    /// Its wall clock runs this far ahead of the rack's (behind when
    /// negative): what it writes as the lease's renew time.
    skew_s: i64,
    /// When it is cut off from the API (start, end).
    partitions: Vec<(Seconds, Seconds)>,
    /// Acting at its last step: when it stops, it forgets.
    acting: bool,
    incarnation: u64,
    /// Answers that came in for it.
    inbox: Vec<Report>,
}

impl Replica {
    /// This life is over (a crash, or the lease lost): what it believed is
    /// forgotten, and answers to it reach no one.
    fn end_life(&mut self) {
        if let Some(auto) = self.auto.as_mut() {
            auto.forget();
        }
        self.acting = false;
        self.incarnation += 1;
        self.inbox.clear();
    }
}

/// The rack's lease record.
#[derive(Clone, Copy, Debug)]
struct LeaseRecord {
    /// None: released.
    holder: Option<usize>,
    /// By the writer's wall clock.
    renew_wall_s: i64,
    version: u64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum PodState {
    NotArrived,
    Pending,
    Bound { server: usize },
    Done,
}

struct PodRun {
    state: PodState,
    /// What the autoscaler's watch shows until `seen_until` (see
    /// [`crate::Faults::watch_lag_s`]); the rack's own checks read `state`.
    seen: PodState,
    seen_until: Seconds,
    bound_at: Option<Seconds>,
    withdrawn_at: Option<Seconds>,
    /// When the pod as it is now was created: its arrival, or the last
    /// eviction, after which its controller made it again.
    created_at: Seconds,
    /// Its requests since an in-place resize was applied or it was made
    /// again at its new size; None: as the trace made it.
    grown: Option<Resources>,
    /// A resize its node has not applied (deferred): the pod holds its
    /// requests until it is applied or VPA makes the pod again.
    resize: Option<Resize>,
}

/// What became of the in-place resizes a run asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Resizes {
    pub asked: u64,
    /// Applied where the pod ran, at once or once the room freed.
    pub in_place: u64,
    /// The pod made again at its new size elsewhere: refused (beyond its
    /// node's allocatable), or deferred past VPA's patience.
    pub recreated: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Arrive(usize),
    Depart(usize),
    /// The trace's in-place resize of a pod ([`crate::TraceResize`]).
    Resize(usize),
    /// VPA's fallback: a resize still deferred is given up, and the pod
    /// made again at its new size.
    VpaRecreate(usize),
    PowerOnDone {
        server: usize,
        epoch: u64,
    },
    BootDone {
        server: usize,
        epoch: u64,
    },
    Register {
        server: usize,
        epoch: u64,
    },
    NodeReady {
        server: usize,
        epoch: u64,
    },
    GatesDone {
        server: usize,
        epoch: u64,
    },
    StopDone {
        server: usize,
        epoch: u64,
    },
    /// A serving node is lost (see [`crate::Faults::node_lost_probability`]).
    NodeLost {
        server: usize,
        epoch: u64,
    },
    /// The taint manager evicts the pods of a node NotReady for 300 s.
    TaintEvict {
        server: usize,
        epoch: u64,
    },
    /// A late answer (a slow or cut-off BMC) reaches the controller.
    Answer(u64),
    /// A replica's round of leader election.
    LeaseRound(usize),
    Wake,
}

struct Queued {
    at: Seconds,
    seq: u64,
    event: Event,
}

impl PartialEq for Queued {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Queued {}
impl PartialOrd for Queued {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Queued {
    fn cmp(&self, o: &Self) -> Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

/// How long the arrivals of ended claims are kept at least: the default
/// daily profile's week and a day; longer where a pool's floor looks back
/// further ([`ironclaim_core::AdaptiveFloor::history_s`]), as the
/// controller's ServerPool status keeps them.
pub const ARRIVAL_HISTORY_S: Seconds = 8 * 86_400;

/// Failed claims listed one by one in the report, beyond which they are
/// only counted.
const MAX_FAILED_CLAIMS_KEPT: usize = 200;

/// One failed claim: which server, when, at which stage, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedClaim {
    pub claim: String,
    pub server: String,
    pub opened_s: Seconds,
    pub failed_s: Seconds,
    pub stage: &'static str,
    pub reason: FailureReason,
}

/// A claim failure, counted by stage and reason.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct FailureCount {
    pub stage: &'static str,
    pub reason: FailureReason,
    pub count: u64,
}

/// The outcome of one policy's run, before comparison.
#[derive(Clone, Debug, Serialize)]
pub struct RunStats {
    pub policy: PolicyKind,
    pub scoring: Scoring,
    pub energy_kwh: f64,
    /// The part of the energy drawn above idle by utilisation.
    pub dynamic_kwh: f64,
    pub powered_mean: f64,
    pub powered_peak: usize,
    /// Pending seconds of every placeable pod that arrived in the run:
    /// until bound, withdrawn (deleted while pending) or the end.
    pub pending_s: Vec<Seconds>,
    /// The same, by the pods' workload (the trace's, or `-`).
    pub pending_by_workload_s: BTreeMap<String, Vec<Seconds>>,
    pub pods_placed: u64,
    pub pods_withdrawn: u64,
    pub pods_pending_at_end: u64,
    pub deadline_misses: u64,
    /// The misses by the pods' workload (the trace's, or `-`).
    pub deadline_misses_by_workload: BTreeMap<String, u64>,
    pub power_on_cycles: Vec<u32>,
    /// The most times one server was powered off within 24 hours.
    pub peak_power_offs_per_day: u32,
    pub claims_for_pods: u64,
    /// Warm spares powered on by scale-down.
    pub claims_spare: u64,
    pub claims_ready: u64,
    pub claims_in_flight_at_end: u64,
    pub cold_to_ready_s: Vec<Seconds>,
    pub failures: Vec<FailureCount>,
    /// Power-offs the rack's fresh checks refused (the claim or the node's
    /// pods were not what the autoscaler believed).
    pub power_offs_refused: u64,
    pub drains_done: u64,
    /// Workload pods evicted by drains (their controllers made them again).
    pub pods_evicted: u64,
    /// In-place resizes the trace asked for: applied where the pod ran (at
    /// once or once the room freed), and pods made again at their new size
    /// (refused, or deferred past VPA's patience).
    pub resizes: Resizes,
    pub provision_calls: u64,
    pub scale_down_passes: u64,
    /// Why the pods still pending at the end wait, as the core says at the end.
    pub waiting_reasons: Vec<(String, u64)>,
    pub violations: Vec<crate::check::Violation>,
    pub timeline: Timeline,
    pub quarantined: u64,
    /// Controller crashes and lost nodes the faults caused.
    #[serde(skip_serializing_if = "is_zero")]
    pub crashes: u64,
    /// Times a replica took the lease over from another.
    #[serde(default)]
    pub takeovers: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub nodes_lost: u64,
    /// The first failed claims, one by one.
    pub failed_claims: Vec<FailedClaim>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Series sampled at regular times, for plots.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    pub at_s: Vec<Seconds>,
    pub powered: Vec<u32>,
    pub watts: Vec<f64>,
    pub pending: Vec<u32>,
    /// With [`SimConfig::record_states`]: at each sample, one character
    /// per server of the workload, in its order (see [`ServerState`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub states: Vec<String>,
}

/// A server's state in a replay, as the character [`Timeline::states`]
/// holds for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerState {
    /// `0`: powered off.
    Off,
    /// `1`: on, not yet a schedulable node, no pod: powering on, booting,
    /// joining.
    Booting,
    /// `2`: a schedulable node running no pod: a warm spare, or idle.
    Idle,
    /// `3`: a schedulable node running pods.
    Busy,
    /// `4`: running pods but not schedulable: being drained.
    Draining,
}

impl ServerState {
    pub fn code(self) -> char {
        match self {
            ServerState::Off => '0',
            ServerState::Booting => '1',
            ServerState::Idle => '2',
            ServerState::Busy => '3',
            ServerState::Draining => '4',
        }
    }
}

/// Whether `request` fits next to `used` on `capacity`, with the rules of
/// [`Resources::fits`], without building the free vector.
pub(crate) fn fits_beside(request: &Resources, used: &Resources, capacity: &Resources) -> bool {
    let ok = |r: i64, u: i64, c: i64| r <= 0 || r <= c - u;
    ok(request.pods, used.pods, capacity.pods)
        && ok(request.cpu_milli, used.cpu_milli, capacity.cpu_milli)
        && ok(request.memory_bytes, used.memory_bytes, capacity.memory_bytes)
        && ok(request.ephemeral_bytes, used.ephemeral_bytes, capacity.ephemeral_bytes)
        && request.extended.iter().all(|(name, r)| ok(*r, used.extended(name), capacity.extended(name)))
}

/// kube-scheduler's `NodeResourcesFit` score of a node for a pod, on cpu
/// and memory with equal weights; the higher the better.
pub(crate) fn node_score(scoring: Scoring, request: &Resources, used: &Resources, capacity: &Resources) -> f64 {
    let frac = |used: i64, c: i64| if c > 0 { used as f64 / c as f64 } else { 1.0 };
    let cpu = frac(used.cpu_milli + request.cpu_milli, capacity.cpu_milli);
    let mem = frac(used.memory_bytes + request.memory_bytes, capacity.memory_bytes);
    match scoring {
        Scoring::LeastAllocated => ((1.0 - cpu) + (1.0 - mem)) / 2.0,
        Scoring::MostAllocated => (cpu + mem) / 2.0,
    }
}

pub struct Engine<'a> {
    w: &'a Workload,
    prep: &'a Prepared,
    cfg: &'a SimConfig,
    kind: PolicyKind,
    setup: Setup,
    replicas: Vec<Replica>,
    /// The replica being stepped, in its current life.
    actor: Asker,
    lease: Option<LeaseRecord>,
    lease_times: LeaseTimes,
    /// When the API answers no one (start, end).
    outages: Vec<(Seconds, Seconds)>,
    /// Something happened that the acting replica steps on.
    due: bool,
    now: Seconds,
    end: Seconds,
    queue: BinaryHeap<Queued>,
    seq: u64,
    wakes: BTreeSet<Seconds>,
    srv: Vec<Srv>,
    cycles: Vec<u32>,
    /// The most power-offs of one server within 24 hours so far.
    peak_offs_per_day: u32,
    /// Servers not off.
    powered: BTreeSet<usize>,
    /// Schedulable nodes: Ready, gates passed, not cordoned.
    ready: BTreeSet<usize>,
    pods: Vec<PodRun>,
    pending: BTreeSet<(i64, Seconds, usize)>,
    /// The claims the world records (ServerClaims and their servers' claims).
    claims: BTreeMap<String, ClaimRecord>,
    /// The first pod of each live claim: the fresh demand adaptive floors count.
    arrivals: BTreeMap<String, Arrival>,
    /// Those of claims that have ended, kept for the floors' daily profile
    /// for `arrival_history_s`, oldest first.
    arrival_history: std::collections::VecDeque<Arrival>,
    arrival_history_s: Seconds,
    abandoned: BTreeMap<String, Seconds>,
    changed: bool,
    fleet_watts: f64,
    fleet_dynamic_watts: f64,
    energy_j: f64,
    dynamic_j: f64,
    powered_area: f64,
    last_t: Seconds,
    peak_powered: usize,
    checker: Checker,
    timeline: Timeline,
    sample_every: Seconds,
    next_sample: Seconds,
    failures: BTreeMap<(Stage, FailureReason), u64>,
    failed_claims: Vec<FailedClaim>,
    cold_to_ready: Vec<Seconds>,
    /// Per workload pod evicted by a drain, the wait of the pod its
    /// controller made before (pod index, seconds).
    earlier_waits: Vec<(usize, Seconds)>,
    resizes: Resizes,
    claims_ready: u64,
    power_offs_refused: u64,
    liveness_bound_s: Seconds,
    last_liveness_check: Seconds,
    /// Draws of the faults that strike the rack rather than one boot:
    /// drawn only when their probability is set, so a run without them
    /// draws what it always drew.
    fault_rng: SimRng,
    /// Answers on their way, by [`Event::Answer`] id.
    later: BTreeMap<u64, (Asker, Report)>,
    crashes: u64,
    takeovers: u64,
    nodes_lost: u64,
    /// Pods whose state the autoscaler's watch shows late.
    lagging: BTreeSet<usize>,
    /// Each machine's firmware UUID.
    uuids: Vec<String>,
    /// Bumped whenever a Node appears or goes: the links of
    /// [`Engine::links`] are made again only then.
    nodes_epoch: u64,
    links_cache: std::cell::RefCell<Option<(u64, std::sync::Arc<Links>)>>,
    /// Told every effect, answer and crash, for a replay that shows them.
    trace: Option<&'a mut Trace<'a>>,
}

/// What a traced run tells, at each simulated second.
pub type Trace<'t> = dyn FnMut(Seconds, &str) + 't;

/// How long the taint manager waits before it evicts the pods of a
/// NotReady node (the default toleration of `node.kubernetes.io/not-ready`).
const NOT_READY_EVICTION_S: Seconds = 300;
/// How long an unanswered power-off request takes to time out.
const BMC_TIMEOUT_S: Seconds = 30;

/// The name of a DaemonSet's pod on a node, as the rack names it in the
/// snapshot and finds it again when it is evicted.
fn daemon_pod_name(ds: &ironclaim_core::DaemonSet, node: &str) -> String {
    format!("{}-{node}", ds.name)
}

/// Free powered-off servers of one group a scale-down pass sees.
pub const COLD_PER_GROUP_FOR_SCALE_DOWN: usize = 4;

fn secs(d: Duration) -> Seconds {
    d.as_secs().saturating_add(u64::from(d.subsec_nanos() > 0))
}

/// Windows (start, end) within `until` that start at `per_hour` on
/// average (a Poisson process) and last 1 to `max_s` seconds each.
fn windows(rng: &mut SimRng, per_hour: f64, max_s: Seconds, until: Seconds) -> Vec<(Seconds, Seconds)> {
    let mut out = Vec::new();
    if per_hour <= 0.0 || max_s == 0 {
        return out;
    }
    let mut t = 0.0f64;
    loop {
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        t += -u.ln() * 3600.0 / per_hour;
        if t >= until as f64 {
            return out;
        }
        let start = t as Seconds;
        let end = (start + rng.random_range(1..=max_s)).min(until);
        out.push((start, end));
        t = end as f64;
    }
}

/// How far apart a run's timeline samples are.
fn sample_every(prep: &Prepared, cfg: &SimConfig) -> Seconds {
    (prep.end_s / cfg.timeline_points.max(2) as u64).max(1)
}

/// When every run of `prep` under `cfg` samples its timeline: from 0 to the
/// end, [`SimConfig::timeline_points`] apart.
pub fn sample_times(prep: &Prepared, cfg: &SimConfig) -> Vec<Seconds> {
    (0..=prep.end_s).step_by(sample_every(prep, cfg) as usize).collect()
}

/// The autoscaler's settings in the simulator: the controller's defaults,
/// with the run's batch windows, failure backoff and quarantine, stepped on
/// every change of the rack rather than on a fixed tick.
pub fn autoscaler_settings(cfg: &SimConfig, scale_down: bool) -> Settings {
    let mut s = Settings::default();
    s.windows.idle = Duration::from_secs(cfg.batch_idle_s);
    s.windows.max = Duration::from_secs(cfg.batch_max_s);
    s.reconcile_every = Duration::ZERO;
    s.backoff.base_s = cfg.failure_backoff_s;
    s.backoff.max_s = cfg.failure_backoff_max_s;
    s.claims.quarantine_after = cfg.quarantine_after_failures;
    s.name_seed = cfg.seed;
    s.held_notes = false;
    let quiet_max = Duration::from_secs(cfg.quiet_max_s.max(1));
    s.redecide_quiet_max = Some(quiet_max);
    s.scale_down = scale_down.then(|| ScaleDownSettings { quiet_max: Some(quiet_max), ..Default::default() });
    s
}

impl<'a> Engine<'a> {
    pub fn new(w: &'a Workload, prep: &'a Prepared, cfg: &'a SimConfig, kind: PolicyKind) -> Self {
        let setup = crate::policy::setup(kind, w, prep, &cfg.policy);
        let arrival_history_s = setup
            .pools
            .iter()
            .filter_map(|p| p.warm.adaptive.as_ref())
            .map(ironclaim_core::AdaptiveFloor::history_s)
            .fold(ARRIVAL_HISTORY_S, Seconds::max);
        let n = w.servers.len();
        let mut srv: Vec<Srv> = (0..n)
            .map(|i| Srv {
                power: Power::Off,
                booted: false,
                holder: None,
                health: Health::Healthy,
                in_row: 0,
                failures: 0,
                last_failure_s: None,
                node: None,
                recorded_idle: None,
                business_s: None,
                allocated: Resources::default(),
                workload_pods: Vec::new(),
                daemon_pods: Vec::new(),
                labels: Labels::new(),
                taints: Vec::new(),
                rng: stream(cfg.seed, "server", i as u64),
                watts: w.servers[i].power.off_watts,
                dynamic_watts: 0.0,
                epoch: 0,
                attempt: None,
                on_waiting: Vec::new(),
                off_waiting: Vec::new(),
                uuid_read: true,
                powered_by_ironclaim: false,
                foreign: None,
                stale_twin: None,
                power_changes: Vec::new(),
            })
            .collect();
        if cfg.faults.identity_unread_probability > 0.0 {
            let mut r = stream(cfg.seed, "identity", 0);
            for x in srv.iter_mut() {
                x.uuid_read = !chance(&mut r, cfg.faults.identity_unread_probability);
            }
        }
        let end = prep.end_s;
        let deadlines = ironclaim_driver::claim::ClaimSettings::default().deadlines;
        let max_cold: Seconds = w
            .servers
            .iter()
            .map(|s| {
                let d = &s.durations;
                let stuck = |stage| deadlines.budget(stage, d).map_or(0, |b| b.stuck_after_s);
                stuck(Stage::PoweringOn) + stuck(Stage::Booting) + stuck(Stage::Joined)
            })
            .max()
            .unwrap_or(0);
        // Once faults stop, a pod waits at most for one failed path and one
        // good one, each up to its stuck deadlines, a batch and a backoff.
        let liveness_bound_s = 2 * max_cold + cfg.batch_max_s + cfg.failure_backoff_max_s + 2 * cfg.power_off_s + 60;
        let fleet_watts = w.servers.iter().map(|s| s.power.off_watts).sum();
        let mut checker = Checker::new(&prep.class_of);
        checker.declare_floors(&setup.floors);
        let settings = autoscaler_settings(cfg, setup.scale_down);
        let count = cfg.replicas.max(1) as usize;
        let f = &cfg.faults;
        let until = f.faults_until_s.unwrap_or(end).min(end);
        let replicas = (0..count)
            .map(|r| {
                let mut rng = stream(cfg.seed, "replica", r as u64);
                let skew = f.clock_skew_s as i64;
                let skew_s = if skew > 0 { rng.random_range(-skew..=skew) } else { 0 };
                let partitions = if count > 1 { windows(&mut rng, f.partitions_per_hour, f.partition_max_s, until) } else { Vec::new() };
                Replica {
                    auto: Some(Autoscaler::new(settings.clone())),
                    down_until: 0,
                    observer: Observer::default(),
                    tenure: Tenure::default(),
                    skew_s,
                    partitions,
                    acting: false,
                    incarnation: 0,
                    inbox: Vec::new(),
                }
            })
            .collect();
        let outages = windows(&mut stream(cfg.seed, "api-outages", 0), f.api_outages_per_hour, f.api_outage_max_s, until);
        let lease_times = LeaseTimes { duration: Duration::from_secs(cfg.lease_s.max(3)) };
        if count > 1 {
            checker.elect(count, secs(lease_times.duration));
        }
        Engine {
            w,
            prep,
            cfg,
            kind,
            setup,
            replicas,
            actor: Asker { replica: 0, incarnation: 0 },
            lease: None,
            lease_times,
            outages,
            due: true,
            now: 0,
            end,
            queue: BinaryHeap::new(),
            seq: 0,
            wakes: BTreeSet::new(),
            srv,
            cycles: vec![0; n],
            peak_offs_per_day: 0,
            powered: BTreeSet::new(),
            ready: BTreeSet::new(),
            pods: (0..prep.pods.len())
                .map(|i| PodRun {
                    state: PodState::NotArrived,
                    seen: PodState::NotArrived,
                    seen_until: 0,
                    bound_at: None,
                    withdrawn_at: None,
                    created_at: w.pods[i].arrival_s,
                    grown: None,
                    resize: None,
                })
                .collect(),
            pending: BTreeSet::new(),
            claims: BTreeMap::new(),
            arrivals: BTreeMap::new(),
            arrival_history: Default::default(),
            arrival_history_s,
            abandoned: BTreeMap::new(),
            changed: true,
            fleet_watts,
            fleet_dynamic_watts: 0.0,
            energy_j: 0.0,
            dynamic_j: 0.0,
            powered_area: 0.0,
            last_t: 0,
            peak_powered: 0,
            checker,
            timeline: Timeline::default(),
            sample_every: sample_every(prep, cfg),
            next_sample: 0,
            failures: BTreeMap::new(),
            failed_claims: Vec::new(),
            cold_to_ready: Vec::new(),
            earlier_waits: Vec::new(),
            resizes: Resizes::default(),
            claims_ready: 0,
            power_offs_refused: 0,
            liveness_bound_s,
            last_liveness_check: 0,
            fault_rng: stream(cfg.seed, "rack-faults", 0),
            later: BTreeMap::new(),
            crashes: 0,
            takeovers: 0,
            nodes_lost: 0,
            lagging: BTreeSet::new(),
            uuids: (0..n).map(machine_uuid).collect(),
            nodes_epoch: 0,
            links_cache: std::cell::RefCell::new(None),
            trace: None,
        }
    }

    /// Tells `trace` every effect, answer and crash of the run.
    pub fn traced(mut self, trace: &'a mut Trace<'a>) -> Self {
        self.trace = Some(trace);
        self
    }

    fn tell(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = self.trace.as_mut() {
            t(self.now, &what());
        }
    }

    fn push(&mut self, at: Seconds, event: Event) {
        self.seq += 1;
        self.queue.push(Queued { at, seq: self.seq, event });
    }

    fn index(&self, server: &str) -> Option<usize> {
        self.prep.server_index.get(server).copied()
    }

    /// Runs to the end and returns the statistics.
    pub fn run(mut self, progress: &mut dyn FnMut(f64)) -> RunStats {
        for (i, tp) in self.w.pods.iter().enumerate() {
            if tp.arrival_s > self.end {
                continue;
            }
            self.push(tp.arrival_s, Event::Arrive(i));
            if let Some(d) = tp.departure_s
                && d <= self.end
            {
                self.push(d, Event::Depart(i));
            }
            if let Some(r) = &tp.resize
                && r.at_s >= tp.arrival_s
                && r.at_s <= self.end
                && tp.departure_s.is_none_or(|d| r.at_s < d)
            {
                self.push(r.at_s, Event::Resize(i));
            }
        }
        self.start_foreign_workers();
        if self.setup.all_on_at_start {
            for s in 0..self.srv.len() {
                if let Some(pool) = self.prep.pool_of[s]
                    && self.srv[s].foreign.is_none()
                {
                    self.start_as_node(s, pool);
                }
            }
        }
        for (a, b) in self.outages.clone() {
            self.tell(|| format!("the API will be out from {a} s to {b} s"));
        }
        for r in 0..self.replicas.len() {
            let (skew, cut) = (self.replicas[r].skew_s, self.replicas[r].partitions.clone());
            if skew != 0 {
                self.tell(|| format!("replica-{r}'s wall clock is {skew} s off"));
            }
            for (a, b) in cut {
                self.tell(|| format!("replica-{r} will be cut off from the API from {a} s to {b} s"));
            }
        }
        self.push(0, Event::Wake);
        if self.replicas.len() > 1 {
            for r in 0..self.replicas.len() {
                self.push(0, Event::LeaseRound(r));
            }
        }
        let mut handled: u64 = 0;
        while let Some(q) = self.queue.pop() {
            if q.at > self.end {
                break;
            }
            self.advance(q.at);
            // A round of election that changes nothing wakes no autoscaler.
            self.due |= !matches!(q.event, Event::LeaseRound(_));
            self.handle(q.event);
            // Everything due at this second first, then one step.
            if self.due && self.queue.peek().is_none_or(|n| n.at > self.now) {
                self.due = false;
                self.drive();
            }
            handled += 1;
            if handled.is_multiple_of(4096) && self.end > 0 {
                progress(self.now as f64 / self.end as f64);
            }
        }
        self.advance(self.end);
        progress(1.0);
        self.finish()
    }

    /// Each server's [`ServerState`] now, as [`Timeline::states`] keeps it.
    fn server_states(&self) -> String {
        let mut running = vec![false; self.w.servers.len()];
        for pod in &self.pods {
            if let PodState::Bound { server } = pod.state
                && let Some(r) = running.get_mut(server)
            {
                *r = true;
            }
        }
        (0..self.w.servers.len())
            .map(|i| {
                let state = match (self.powered.contains(&i), self.ready.contains(&i), running[i]) {
                    (false, _, _) => ServerState::Off,
                    (true, true, true) => ServerState::Busy,
                    (true, true, false) => ServerState::Idle,
                    (true, false, true) => ServerState::Draining,
                    (true, false, false) => ServerState::Booting,
                };
                state.code()
            })
            .collect()
    }

    fn advance(&mut self, t: Seconds) {
        while self.next_sample <= t && self.next_sample <= self.end {
            let at = self.next_sample;
            self.timeline.at_s.push(at);
            self.timeline.powered.push(self.powered.len() as u32);
            self.timeline.watts.push(self.fleet_watts);
            self.timeline.pending.push(self.pending.len() as u32);
            if self.cfg.record_states {
                let states = self.server_states();
                self.timeline.states.push(states);
            }
            self.next_sample += self.sample_every;
        }
        if t > self.last_t {
            let dt = (t - self.last_t) as f64;
            self.energy_j += self.fleet_watts * dt;
            self.dynamic_j += self.fleet_dynamic_watts * dt;
            self.powered_area += self.powered.len() as f64 * dt;
            self.last_t = t;
        }
        self.now = t;
    }

    fn handle(&mut self, event: Event) {
        let live = |e: &Self, s: usize, epoch: u64| e.srv[s].epoch == epoch;
        match event {
            Event::Arrive(p) => self.arrive(p),
            Event::Depart(p) => self.depart(p),
            Event::Resize(p) => self.resize(p),
            Event::VpaRecreate(p) => self.vpa_recreate(p),
            Event::PowerOnDone { server, epoch } if live(self, server, epoch) => self.power_on_done(server),
            Event::BootDone { server, epoch } if live(self, server, epoch) => self.boot_done(server),
            Event::Register { server, epoch } if live(self, server, epoch) => self.register(server),
            Event::NodeReady { server, epoch } if live(self, server, epoch) => self.node_ready(server),
            Event::GatesDone { server, epoch } if live(self, server, epoch) => self.gates_done(server),
            Event::StopDone { server, epoch } if live(self, server, epoch) => self.stop_done(server),
            Event::NodeLost { server, epoch } if live(self, server, epoch) => self.node_lost(server),
            Event::TaintEvict { server, epoch } if live(self, server, epoch) => self.taint_evict(server),
            Event::LeaseRound(r) => {
                self.lease_round(r);
                return;
            }
            Event::Answer(id) => {
                if let Some((to, r)) = self.later.remove(&id) {
                    self.deliver(to, r);
                }
            }
            Event::Wake => {
                self.wakes.remove(&self.now);
                return;
            }
            _ => return,
        }
        self.changed = true;
    }

    // ---- the autoscaler ------------------------------------------------------

    /// One step of each replica that may act at `now` (with one replica:
    /// unless it is down; with more: while it holds the lease by its own
    /// clock): the answers that came in, the step, every effect carried out
    /// and its answer handed back; then the next wake-up is queued. A
    /// replica that stopped acting forgets what it believed, as the
    /// controller does when it loses the lease.
    fn drive(&mut self) {
        if !self.lagging.is_empty() {
            let now = self.now;
            let pods = &self.pods;
            let before = self.lagging.len();
            self.lagging.retain(|&p| now < pods[p].seen_until);
            // The watch caught up on a pod: the world as shown changed.
            self.changed |= self.lagging.len() < before;
            // What the watch shows changes when a lag runs out.
            if let Some(next) = self.lagging.iter().map(|&p| self.pods[p].seen_until).min() {
                self.schedule_wake(next);
            }
        }
        let changed = std::mem::take(&mut self.changed);
        let mut next: Option<Seconds> = None;
        for r in 0..self.replicas.len() {
            let acts = self.may_act(r);
            let rep = &mut self.replicas[r];
            if !acts {
                if rep.acting {
                    rep.end_life();
                }
                if rep.down_until > self.now {
                    next = Some(next.map_or(rep.down_until, |n| n.min(rep.down_until)));
                }
                continue;
            }
            let fresh = !rep.acting;
            rep.acting = true;
            self.actor = Asker { replica: r, incarnation: rep.incarnation };
            if let Some(at) = self.step_replica(r, changed || fresh) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        if self.changed {
            // Effects changed the rack: the claims see it one second on,
            // as a controller sees its own writes at its next reconcile.
            self.schedule_wake(self.now + 1);
        } else if let Some(at) = next
            && at <= self.end
        {
            self.schedule_wake(at);
        }
        self.check_liveness();
    }

    /// Whether replica `r` may act now: it is up and, with leader
    /// election, holds the lease by its own clock.
    fn may_act(&self, r: usize) -> bool {
        let rep = &self.replicas[r];
        self.now >= rep.down_until && (self.replicas.len() == 1 || rep.tenure.acting(Duration::from_secs(self.now)))
    }

    /// Steps replica `r`; returns when it wants to be stepped again, None
    /// when it crashed.
    fn step_replica(&mut self, r: usize, changed: bool) -> Option<Seconds> {
        let mut auto = self.replicas[r].auto.take()?;
        let now = Duration::from_secs(self.now);
        if changed {
            auto.changed(now);
        }
        let mut effects: VecDeque<Effect> = VecDeque::new();
        for a in std::mem::take(&mut self.replicas[r].inbox) {
            self.tell(|| format!("answer {a:?}"));
            effects.extend(auto.report(a, now));
        }
        effects.extend(auto.step(&*self, now));
        while let Some(e) = effects.pop_front() {
            self.tell(|| format!("effect {e:?}"));
            let answer = self.apply(e);
            if self.fault(self.cfg.faults.crash_probability) {
                // Crashed after the effect, before its answer: the next
                // process starts from what the rack records.
                self.crashes += 1;
                self.tell(|| format!("crash: replica {r} restarts from the rack's records"));
                let down_until = self.now + self.fault_rng.random_range(5..=60);
                let rep = &mut self.replicas[r];
                rep.auto = Some(auto);
                rep.end_life();
                rep.tenure.revoked();
                rep.down_until = down_until;
                self.schedule_wake(down_until);
                return None;
            }
            if let Some(a) = answer {
                self.tell(|| format!("answer {a:?}"));
                effects.extend(auto.report(a, now));
            }
            for a in std::mem::take(&mut self.replicas[r].inbox) {
                self.tell(|| format!("answer {a:?}"));
                effects.extend(auto.report(a, now));
            }
        }
        let next = secs(auto.next_wake()).max(self.now + 1);
        self.replicas[r].auto = Some(auto);
        Some(next)
    }

    /// Whether the API answers replica `r` now: no outage, no partition.
    fn api_down(&self, r: usize) -> bool {
        let within = |w: &[(Seconds, Seconds)]| w.iter().any(|&(a, b)| a <= self.now && self.now < b);
        within(&self.outages) || within(&self.replicas[r].partitions)
    }

    /// When the outage under way ends, if one is.
    fn outage_end(&self) -> Option<Seconds> {
        self.outages.iter().find(|&&(a, b)| a <= self.now && self.now < b).map(|&(_, b)| b)
    }

    fn replica_name(r: usize) -> String {
        format!("replica-{r}")
    }

    /// A round of leader election by replica `r`, as the controller's
    /// renewal task runs it: read the record, decide with the driver's
    /// [`Observer`], write, and keep acting until the renew deadline by its
    /// own clock, or stop at once when the round failed or lost.
    fn lease_round(&mut self, r: usize) {
        let every = secs(self.lease_times.renew_every()).max(1);
        self.push(self.now + every, Event::LeaseRound(r));
        if self.now < self.replicas[r].down_until {
            return;
        }
        let mono = Duration::from_secs(self.now);
        let was = self.replicas[r].tenure.acting(mono);
        let me = Self::replica_name(r);
        let round = if self.api_down(r) {
            None
        } else if self.cfg.broken == Some(Broken::WallClockLease) {
            // Expiry judged by this replica's wall clock against the
            // writer's renew time.
            let wall = self.now as i64 + self.replicas[r].skew_s;
            let held = self.lease_times.duration.as_secs() as i64;
            Some(match self.lease {
                None => Round::Create,
                Some(l) if l.holder == Some(r) => Round::Renew,
                Some(l) if l.holder.is_none() || (wall - l.renew_wall_s).abs() >= held => Round::Take,
                Some(_) => Round::Wait,
            })
        } else {
            let record = self.lease.map(|l| Record {
                holder: l.holder.map(Self::replica_name).unwrap_or_default(),
                renew_time: Some(l.renew_wall_s * 1_000_000),
                version: Some(l.version.to_string()),
            });
            Some(self.replicas[r].observer.round(&me, record.as_ref(), self.lease_times.duration, mono))
        };
        let written = round.is_some_and(Round::writes) && !self.fault(self.cfg.faults.api_write_failure_probability);
        let times = self.lease_times;
        if written {
            if self.lease.is_some_and(|l| l.holder != Some(r)) {
                self.takeovers += 1;
                self.tell(|| format!("lease: {me} takes over"));
            }
            let version = self.lease.map_or(0, |l| l.version) + 1;
            self.lease = Some(LeaseRecord { holder: Some(r), renew_wall_s: self.now as i64 + self.replicas[r].skew_s, version });
            self.checker.lease_written(self.now, r);
            self.replicas[r].tenure.granted(mono, &times);
        } else {
            self.replicas[r].tenure.revoked();
        }
        if !was && self.replicas[r].tenure.acting(mono) {
            self.due = true;
        }
    }

    /// Whether a rack fault of probability `p` strikes now.
    fn fault(&mut self, p: f64) -> bool {
        p > 0.0 && self.cfg.faults.active_at(self.now) && chance(&mut self.fault_rng, p)
    }

    /// Hands an answer to the replica being stepped `after` seconds from now.
    fn answer_in(&mut self, after: Seconds, report: Report) {
        let to = self.actor;
        self.answer_to_in(to, after, report);
    }

    fn answer_to_in(&mut self, to: Asker, after: Seconds, report: Report) {
        self.seq += 1;
        let id = self.seq;
        self.later.insert(id, (to, report));
        self.push(self.now + after, Event::Answer(id));
    }

    /// An answer reaches whoever asked, unless that life of it is over.
    fn deliver(&mut self, to: Asker, report: Report) {
        let rep = &mut self.replicas[to.replica];
        if rep.incarnation == to.incarnation {
            rep.inbox.push(report);
        }
    }

    /// Hands a BMC's answer to whoever asked, late when the BMC is slow.
    fn bmc_answer(&mut self, to: Asker, report: Report) {
        if self.fault(self.cfg.faults.slow_bmc_probability) {
            let late = self.cfg.faults.slow_bmc_s;
            self.answer_to_in(to, late, report);
        } else {
            self.deliver(to, report);
        }
    }

    fn schedule_wake(&mut self, at: Seconds) {
        // Only the earliest wake matters: a later one finds nothing new.
        if self.wakes.first().is_some_and(|&t| t <= at) {
            return;
        }
        self.wakes.insert(at);
        self.push(at, Event::Wake);
    }

    /// Carries out one effect as the controller's executor would, with
    /// the same fresh checks; returns its answer when it has one now.
    fn apply(&mut self, effect: Effect) -> Option<Report> {
        let write = matches!(
            effect,
            Effect::TakeServer { .. }
                | Effect::EnterStage { .. }
                | Effect::LinkNode { .. }
                | Effect::FailClaim { .. }
                | Effect::Measure { .. }
                | Effect::RecordIdle { .. }
        );
        let unreachable = self.api_down(self.actor.replica);
        if unreachable {
            match &effect {
                Effect::Release { .. }
                | Effect::DeleteClaim { .. }
                | Effect::Cordon { .. }
                | Effect::Uncordon { .. }
                | Effect::KeepCordoned { .. }
                | Effect::DeleteNode { .. }
                | Effect::ParkNode { .. }
                | Effect::Mark { .. }
                | Effect::Note { .. } => {
                    // Logged and counted by the executor; the driver sees
                    // the world as it is at its next step.
                    self.tell(|| format!("the API did not answer: {effect:?}"));
                    return None;
                }
                Effect::Evict { node, pod } => {
                    return Some(Report::Evicted { node: node.clone(), pod: pod.clone(), answer: Eviction::Failed("the API did not answer".into()) });
                }
                _ => {}
            }
        }
        if write && (unreachable || self.fault(self.cfg.faults.api_write_failure_probability)) {
            // Refused by the API, or not answered: nothing is written. A
            // claim's write is answered as the controller's executor
            // answers it.
            let why = if unreachable { "the API did not answer" } else { "the API refused the write (conflict)" };
            self.tell(|| format!("write refused: {effect:?}"));
            return match effect {
                Effect::TakeServer { claim } => Some(Report::TakeFailed { claim: claim.name, message: why.into() }),
                Effect::EnterStage { claim, .. } | Effect::LinkNode { claim, .. } | Effect::FailClaim { claim, .. } => {
                    Some(Report::WriteFailed { claim: Some(claim), effect: "status".into(), message: why.into() })
                }
                _ => None,
            };
        }
        match effect {
            Effect::TakeServer { claim } => Some(self.take(claim)),
            Effect::PowerOn { server, claim } => self.power_on(&server, claim.as_deref()),
            Effect::PowerOff { server, claim, node } => self.power_off(&server, claim.as_deref(), node.as_deref()),
            Effect::ReadPower { server } => {
                let on = self.index(&server).is_some_and(|s| self.srv[s].power == Power::On);
                Some(Report::PowerRead { server, result: Ok(on) })
            }
            Effect::EnterStage { claim, stage, .. } => {
                let now = self.now;
                if let Some(r) = self.claims.get_mut(&claim) {
                    r.stage = stage;
                    r.stage_started_s = now;
                    r.history.push((stage, now));
                    if stage == Stage::Ready {
                        self.claims_ready += 1;
                        self.cold_to_ready.push(now - r.created_s);
                        let server = r.server.clone();
                        if let Some(s) = self.index(&server) {
                            self.checker.claim_closed(s);
                        }
                    }
                }
                self.changed = true;
                None
            }
            Effect::LinkNode { claim, node, .. } => {
                if let Some(r) = self.claims.get_mut(&claim) {
                    r.node = Some(node);
                }
                None
            }
            Effect::Measure { server, .. } => {
                if let Some(s) = self.index(&server) {
                    self.srv[s].in_row = 0;
                }
                None
            }
            Effect::FailClaim { claim, reason, .. } => {
                self.fail_claim(&claim, reason);
                None
            }
            Effect::Release { server, claim, count_failure, quarantine, .. } => {
                self.release(&server, &claim, count_failure, quarantine);
                None
            }
            Effect::DeleteClaim { claim } => {
                self.claims.remove(&claim);
                None
            }
            Effect::Cordon { node, .. } => {
                if let Some(s) = self.index(&node) {
                    if let Some(n) = self.srv[s].node.as_mut() {
                        n.cordoned = true;
                        n.disrupting = true;
                    }
                    self.ready.remove(&s);
                }
                None
            }
            Effect::Evict { node, pod } => Some(self.evict(node, pod)),
            Effect::Uncordon { node, abandoned } => {
                if abandoned {
                    self.abandoned.insert(node.clone(), self.now);
                }
                if let Some(s) = self.index(&node)
                    && let Some(n) = self.srv[s].node.as_mut()
                {
                    n.cordoned = false;
                    n.disrupting = false;
                    if n.gates_passed && self.srv[s].power == Power::On {
                        self.ready.insert(s);
                        self.bind_pending();
                    }
                }
                self.changed = true;
                None
            }
            Effect::KeepCordoned { node } => {
                if let Some(s) = self.index(&node)
                    && let Some(n) = self.srv[s].node.as_mut()
                {
                    n.disrupting = false;
                }
                self.changed = true;
                None
            }
            Effect::Mark { node, mark, on } => {
                if let Some(s) = self.index(&node)
                    && self.srv[s].node.is_some()
                {
                    let taints = &mut self.srv[s].taints;
                    taints.retain(|t| t.key != mark.taint());
                    if on {
                        taints.push(Taint::new(mark.taint(), "", TaintEffect::PreferNoSchedule));
                    }
                    self.nodes_epoch += 1;
                    self.changed = true;
                }
                None
            }
            // A parked node counts as no node until its server boots
            // again, as the controller's index reads it: to the rack, the
            // two are one.
            Effect::DeleteNode { node } | Effect::ParkNode { node, .. } => {
                if let Some(s) = self.index(&node) {
                    self.ready.remove(&s);
                    self.srv[s].node = None;
                    self.nodes_epoch += 1;
                    self.srv[s].daemon_pods.clear();
                }
                self.changed = true;
                None
            }
            Effect::RecordIdle { server, since } => {
                if let Some(s) = self.index(&server) {
                    self.srv[s].recorded_idle = since;
                }
                None
            }
            Effect::Note { .. } => None,
        }
    }

    fn take(&mut self, claim: ClaimRecord) -> Report {
        let Some(s) = self.index(&claim.server) else {
            return Report::TakeFailed { claim: claim.name, message: "no such server".into() };
        };
        let name = claim.name.clone();
        self.checker.take_asked(self.now, s, &claim.server, self.srv[s].holder.is_some() || self.srv[s].node.is_some());
        let unfenced = self.cfg.broken == Some(Broken::UnfencedTakes);
        if let Some(h) = self.srv[s].holder.as_ref().filter(|_| !unfenced) {
            return if *h == name { Report::Taken { claim: name, newly: false } } else { Report::Held { claim: name, holder: h.clone() } };
        }
        if self.srv[s].health != Health::Healthy && self.srv[s].health != Health::Failed {
            return Report::Held { claim: name, holder: format!("{:?}", self.srv[s].health).to_lowercase() };
        }
        if self.cfg.broken != Some(Broken::LabelOnlyIdentity) {
            let linked = self.links().node_of(&claim.server).is_some();
            if identity::unadopted(self.power_facts(s, linked)).is_some() {
                return Report::Held { claim: name, holder: "nothing ironclaim knows: the server is not adopted".into() };
            }
        }
        self.srv[s].holder = Some(name.clone());
        self.srv[s].business_s = Some(self.now);
        self.checker.claim_opened(s);
        if let Some(&first) = claim.pods.iter().filter_map(|k| self.prep.pod_index.get(k)).min_by_key(|&&p| (self.pods[p].created_at, p)) {
            let pod = &self.prep.pods[first];
            let at_s = self.pods[first].created_at;
            self.arrivals.insert(name.clone(), Arrival { at_s, server: claim.server.clone(), deadline_s: pod.deadline_s });
        }
        self.claims.insert(name.clone(), claim);
        self.changed = true;
        Report::Taken { claim: name, newly: true }
    }

    fn draw_attempt(&mut self, s: usize) -> Attempt {
        let d = self.w.servers[s].durations;
        let has_gpu = self.w.servers[s].capacity.gpu_milli() > 0;
        let f = &self.cfg.faults;
        let faults = f.active_at(self.now);
        let cut = self.cfg.stuck_factor;
        let rng = &mut self.srv[s].rng;
        let power_on_s = lognormal_s(rng, d.power_on_s, d.tail_percent, cut);
        let mut boot_s = lognormal_s(rng, d.boot_s, d.tail_percent, cut);
        let join_s = lognormal_s(rng, d.join_s, d.tail_percent, cut);
        let ready_s = lognormal_s(rng, d.ready_s, d.tail_percent, cut);
        let slow = chance(rng, f.slow_boot_probability);
        let bmc = chance(rng, f.bmc_error_probability);
        let boot_fail = chance(rng, f.boot_failure_probability);
        let never_joins = chance(rng, f.never_joins_probability);
        let gate = chance(rng, f.gpu_gate_failure_probability);
        if faults && slow {
            boot_s = (boot_s as f64 * f.slow_boot_factor.max(1.0)).round() as Seconds;
        }
        Attempt {
            power_on_s,
            boot_s,
            join_s,
            ready_s,
            bmc_error: faults && bmc,
            boot_fails: faults && boot_fail,
            never_joins: faults && never_joins,
            gate_fails: faults && gate && has_gpu,
        }
    }

    fn power_on(&mut self, server: &str, claim: Option<&str>) -> Option<Report> {
        let s = self.index(server)?;
        let refuse = |why: String| {
            Some(Report::PoweredOn {
                server: server.to_string(),
                result: Err(PowerFailure { reason: FailureReason::ServerUnavailable, message: why }),
            })
        };
        if claim.is_none() && self.api_down(self.actor.replica) {
            // A spare's server is read fresh before its power-on.
            return refuse(format!("server {server} could not be read: the API did not answer"));
        }
        if self.srv[s].holder.as_deref() != claim {
            return refuse(format!("server {server} is not held by {}", claim.unwrap_or("nothing")));
        }
        match self.srv[s].power {
            Power::Off => {
                self.checker.power_action(self.now, self.actor.replica, "power-on", server);
                self.record_power_change(s, true);
                let a = self.draw_attempt(s);
                let srv = &mut self.srv[s];
                srv.attempt = Some(a);
                srv.power = Power::PoweringOn;
                srv.powered_by_ironclaim = true;
                srv.epoch += 1;
                srv.on_waiting = vec![self.actor];
                let epoch = srv.epoch;
                self.cycles[s] += 1;
                self.checker.powered_idle(s);
                self.powered.insert(s);
                self.peak_powered = self.peak_powered.max(self.powered.len());
                self.refresh_watts(s);
                let took = if a.bmc_error { a.power_on_s.min(15) } else { a.power_on_s };
                self.push(self.now + took, Event::PowerOnDone { server: s, epoch });
                None
            }
            Power::PoweringOn => {
                self.srv[s].on_waiting.push(self.actor);
                None
            }
            Power::On => {
                // Already on (a warm spare): the claim's path starts from
                // its boot, with fresh draws for the join and the gates.
                if claim.is_some() {
                    let mut a = self.draw_attempt(s);
                    a.bmc_error = false;
                    a.boot_fails = false;
                    self.srv[s].attempt = Some(a);
                    if self.srv[s].booted && self.srv[s].node.is_none() {
                        let epoch = self.srv[s].epoch;
                        self.push(self.now, Event::Register { server: s, epoch });
                    }
                }
                Some(Report::PoweredOn { server: server.to_string(), result: Ok(()) })
            }
            Power::Stopping => Some(Report::PoweredOn {
                server: server.to_string(),
                result: Err(PowerFailure { reason: FailureReason::PowerActionFailed, message: "the server is shutting down".into() }),
            }),
        }
    }

    fn power_on_done(&mut self, s: usize) {
        let Some(a) = self.srv[s].attempt else { return };
        let name = self.w.servers[s].name.clone();
        let mut waiting = std::mem::take(&mut self.srv[s].on_waiting);
        if waiting.is_empty() {
            waiting.push(self.actor);
        }
        let result = if a.bmc_error {
            self.srv[s].power = Power::Off;
            self.powered.remove(&s);
            self.checker.powered_down(s);
            Err(PowerFailure { reason: FailureReason::PowerActionFailed, message: "the BMC failed the power-on request".into() })
        } else {
            self.srv[s].power = Power::On;
            self.srv[s].booted = false;
            if !a.boot_fails {
                let epoch = self.srv[s].epoch;
                self.push(self.now + a.boot_s, Event::BootDone { server: s, epoch });
            }
            Ok(())
        };
        self.refresh_watts(s);
        for to in waiting {
            self.bmc_answer(to, Report::PoweredOn { server: name.clone(), result: result.clone() });
        }
    }

    fn boot_done(&mut self, s: usize) {
        self.srv[s].booted = true;
        if self.srv[s].holder.is_some() && self.srv[s].node.is_none() {
            self.register(s);
        }
        self.refresh_watts(s);
    }

    /// The claimed server's kubelet registers its node (not Ready yet).
    fn register(&mut self, s: usize) {
        let Some(a) = self.srv[s].attempt else { return };
        if a.never_joins || self.srv[s].node.is_some() {
            return;
        }
        let Some(holder) = self.srv[s].holder.clone() else { return };
        let Some(pool) = self.claims.get(&holder).and_then(|r| self.setup.pools.iter().position(|p| p.name == r.pool)) else { return };
        self.label_node(s, pool);
        let srv = &mut self.srv[s];
        srv.node = Some(NodeRun { ready_since: None, gates_passed: false, cordoned: false, disrupting: false });
        self.nodes_epoch += 1;
        srv.business_s = Some(self.now);
        let epoch = srv.epoch;
        self.push(self.now + a.join_s, Event::NodeReady { server: s, epoch });
    }

    /// The node's labels and taints: the server's labels, its pool's, and
    /// the pool, server and hostname labels a claimed node gets.
    fn label_node(&mut self, s: usize, pool: usize) {
        let sim = &self.w.servers[s];
        let p = &self.setup.pools[pool];
        let mut labels = sim.labels.clone();
        labels.extend(p.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels.insert(SERVERPOOL_LABEL.to_string(), p.name.clone());
        labels.insert(SERVER_LABEL.to_string(), sim.name.clone());
        labels.insert(HOSTNAME.to_string(), sim.name.clone());
        self.srv[s].labels = labels;
        self.srv[s].taints = p.taints.clone();
    }

    fn node_ready(&mut self, s: usize) {
        let Some(a) = self.srv[s].attempt else { return };
        let Some(n) = self.srv[s].node.as_mut() else { return };
        n.ready_since = Some(self.now);
        if !a.gate_fails {
            let epoch = self.srv[s].epoch;
            self.push(self.now + a.ready_s, Event::GatesDone { server: s, epoch });
        }
    }

    fn gates_done(&mut self, s: usize) {
        let Some(n) = self.srv[s].node.as_mut() else { return };
        n.gates_passed = true;
        let schedulable = !n.cordoned;
        self.place_daemonsets(s);
        if schedulable {
            self.ready.insert(s);
        }
        self.checker.node_ready(s);
        self.refresh_watts(s);
        self.bind_pending();
        if self.srv[s].stale_twin.is_none() && self.fault(self.cfg.faults.stale_node_probability) {
            let twin = format!("{}-old", self.w.servers[s].name);
            self.tell(|| format!("rack: a stale Node {twin} appears"));
            self.srv[s].stale_twin = Some(twin);
            self.nodes_epoch += 1;
            self.changed = true;
        }
        if self.srv[s].holder.is_some() && self.fault(self.cfg.faults.node_lost_probability) {
            let after = self.fault_rng.random_range(60..=4 * 3600);
            let epoch = self.srv[s].epoch;
            self.push(self.now + after, Event::NodeLost { server: s, epoch });
        }
    }

    /// A serving node is lost: its kubelet stops (NotReady), or the Node
    /// is deleted and its pods with it. Not once faults have stopped.
    fn node_lost(&mut self, s: usize) {
        if !self.cfg.faults.active_at(self.now) || self.srv[s].power != Power::On || self.srv[s].node.is_none() {
            return;
        }
        self.nodes_lost += 1;
        self.ready.remove(&s);
        self.checker.node_lost(s);
        let name = self.w.servers[s].name.clone();
        if chance(&mut self.fault_rng, 0.5) {
            self.tell(|| format!("rack: node {name} deleted"));
            self.evict_all(s);
            self.srv[s].node = None;
            self.nodes_epoch += 1;
            self.srv[s].daemon_pods.clear();
        } else {
            self.tell(|| format!("rack: node {name} NotReady"));
            if let Some(n) = self.srv[s].node.as_mut() {
                n.ready_since = None;
            }
            let epoch = self.srv[s].epoch;
            self.push(self.now + NOT_READY_EVICTION_S, Event::TaintEvict { server: s, epoch });
        }
        self.refresh_watts(s);
    }

    /// The taint manager evicts the workload pods of a node still NotReady.
    fn taint_evict(&mut self, s: usize) {
        if self.srv[s].node.as_ref().is_some_and(|n| n.ready_since.is_none()) {
            self.evict_all(s);
        }
    }

    /// Every workload pod of the server goes back to pending (their
    /// controllers, here the trace, want them back).
    fn evict_all(&mut self, s: usize) {
        for p in self.srv[s].workload_pods.clone() {
            self.unbind(p, s);
            self.requeue(p);
        }
        self.bind_pending();
    }

    /// The existing workers of the faults: machines already on when the
    /// run starts, each with a Node ironclaim did not make.
    fn start_foreign_workers(&mut self) {
        let f = &self.cfg.faults;
        if f.foreign_workers == 0 {
            return;
        }
        let (wanted, cloned) = (f.foreign_workers as usize, f.cloned_label_probability);
        let mut r = stream(self.cfg.seed, "identity", 1);
        let mut off: Vec<usize> = (0..self.srv.len()).filter(|&s| self.srv[s].power == Power::Off).collect();
        let n = self.srv.len();
        for _ in 0..wanted.min(off.len()) {
            let s = off.swap_remove(r.random_range(0..off.len()));
            let name = self.w.servers[s].name.clone();
            let says = (n > 1 && chance(&mut r, cloned)).then(|| {
                let other = (s + 1 + r.random_range(0..n - 1)) % n;
                self.w.servers[other].name.clone()
            });
            let pods = 1 + r.random_range(0..3u32);
            self.tell(|| {
                format!(
                    "rack: {name} already runs worker-{name} with {}{}",
                    crate::report::count(u64::from(pods), "pod", "pods"),
                    says.as_ref().map(|o| format!(", labelled as server {o}")).unwrap_or_default()
                )
            });
            let srv = &mut self.srv[s];
            srv.power = Power::On;
            srv.booted = true;
            srv.foreign = Some(Foreign { node: format!("worker-{name}"), says, pods });
            self.nodes_epoch += 1;
            self.powered.insert(s);
            self.peak_powered = self.peak_powered.max(self.powered.len());
            self.checker.powered_idle(s);
            self.checker.node_ready(s);
            for _ in 0..pods {
                self.checker.bound(s);
            }
            self.refresh_watts(s);
        }
    }

    /// What every Node of the rack says of itself, as the API lists them.
    fn node_says(&self) -> Vec<NodeSays<'_>> {
        let label_only = self.cfg.broken == Some(Broken::LabelOnlyIdentity);
        let mut out = Vec::with_capacity(self.powered.len());
        for (s, srv) in self.srv.iter().enumerate() {
            let name = self.w.servers[s].name.as_str();
            let system_uuid = (!label_only).then(|| self.uuids[s].as_str());
            if srv.node.is_some() {
                out.push(NodeSays { node: name, server: Some(name), system_uuid });
            }
            if let Some(f) = &srv.foreign {
                out.push(NodeSays { node: &f.node, server: f.says.as_deref(), system_uuid });
            }
            if let Some(t) = &srv.stale_twin {
                out.push(NodeSays { node: t, server: Some(name), system_uuid });
            }
        }
        out
    }

    /// Which node runs on which server, by the shipping rules (or, broken,
    /// by the label alone); made again only once the Nodes changed.
    fn links(&self) -> std::sync::Arc<Links> {
        if let Some((epoch, links)) = self.links_cache.borrow().as_ref()
            && *epoch == self.nodes_epoch
        {
            return links.clone();
        }
        let links = std::sync::Arc::new(self.make_links());
        *self.links_cache.borrow_mut() = Some((self.nodes_epoch, links.clone()));
        links
    }

    fn make_links(&self) -> Links {
        let nodes = self.node_says();
        if self.cfg.broken == Some(Broken::LabelOnlyIdentity) {
            let mut links = Links::default();
            for n in nodes {
                if let Some(server) = n.server.filter(|s| self.index(s).is_some()) {
                    links.node_server.insert(n.node.to_string(), server.to_string());
                    links.server_node.entry(server.to_string()).or_insert_with(|| n.node.to_string());
                }
            }
            return links;
        }
        identity::link(nodes, &RackInventory { engine: self })
    }

    /// What identity knows of server `s`'s power.
    fn power_facts(&self, s: usize, linked: bool) -> identity::PowerFacts {
        let srv = &self.srv[s];
        identity::PowerFacts { on: srv.power != Power::Off, powered_on_by_ironclaim: srv.powered_by_ironclaim, linked, adopt: identity::Adopt::Auto }
    }

    /// The last check before a power-off of `s`, on the Nodes as listed
    /// now: the same rules as the controller's.
    fn identity_refusal(&self, s: usize, node: Option<&str>) -> Option<String> {
        if self.cfg.broken == Some(Broken::LabelOnlyIdentity) {
            return None;
        }
        let name = self.w.servers[s].name.as_str();
        let recorded = self.srv[s].uuid_read.then(|| self.uuids[s].as_str());
        identity::refuse_power_off(name, recorded, None, self.power_facts(s, false), self.node_says(), node)
    }

    /// A server that was a Ready node before the run began.
    fn start_as_node(&mut self, s: usize, pool: usize) {
        let a = self.draw_attempt(s);
        self.label_node(s, pool);
        let srv = &mut self.srv[s];
        srv.attempt = Some(a);
        srv.power = Power::On;
        srv.powered_by_ironclaim = true;
        srv.booted = true;
        srv.node = Some(NodeRun { ready_since: Some(0), gates_passed: true, cordoned: false, disrupting: false });
        self.nodes_epoch += 1;
        self.powered.insert(s);
        self.peak_powered = self.peak_powered.max(self.powered.len());
        self.place_daemonsets(s);
        self.ready.insert(s);
        self.checker.powered_idle(s);
        self.checker.node_ready(s);
        self.refresh_watts(s);
    }

    fn place_daemonsets(&mut self, s: usize) {
        let name = &self.w.servers[s].name;
        let srv = &mut self.srv[s];
        srv.allocated = Resources::default();
        srv.daemon_pods.clear();
        for &p in &srv.workload_pods {
            srv.allocated.add(self.pods[p].grown.as_ref().unwrap_or(&self.prep.pods[p].requests));
        }
        for (i, ds) in self.w.daemonsets.iter().enumerate() {
            let t = &ds.template;
            if check_node_affinity(t, &srv.labels, name).is_ok() && check_taints(t, &srv.taints, false).is_ok() {
                srv.allocated.add(&Resources { pods: 1, ..t.requests.clone() });
                srv.daemon_pods.push(i);
            }
        }
    }

    fn power_off(&mut self, server: &str, claim: Option<&str>, node: Option<&str>) -> Option<Report> {
        let s = self.index(server)?;
        let unchecked = self.cfg.broken == Some(Broken::StaleEmptyNodes);
        let refused = if self.api_down(self.actor.replica) {
            Some(format!("server {server} could not be read: the API did not answer"))
        } else if self.srv[s].holder.as_deref() != claim {
            Some(format!("server {server} is held by {}, not {}", self.srv[s].holder.as_deref().unwrap_or("nothing"), claim.unwrap_or("nothing")))
        } else if node.is_some() && !self.srv[s].workload_pods.is_empty() {
            Some(format!(
                "node {} runs {}",
                node.unwrap_or_default(),
                crate::report::count(self.srv[s].workload_pods.len() as u64, "workload pod", "workload pods")
            ))
        } else if node.is_none() && self.srv[s].node.is_some() {
            // Named no node, the server is listed against the Nodes.
            Some(format!("server {server} is node {server}"))
        } else if self.srv[s].power != Power::Off {
            self.identity_refusal(s, node)
        } else {
            None
        };
        if let Some(why) = refused
            && !unchecked
        {
            self.power_offs_refused += 1;
            return Some(Report::PoweredOff { server: server.to_string(), result: Ok(()), refused: Some(why) });
        }
        match self.srv[s].power {
            Power::Off => Some(Report::PoweredOff { server: server.to_string(), result: Ok(()), refused: None }),
            Power::Stopping => {
                self.srv[s].off_waiting.push(self.actor);
                None
            }
            Power::PoweringOn | Power::On => {
                self.checker.power_action(self.now, self.actor.replica, "power-off", server);
                self.record_power_change(s, false);
                let failed = |reason, message: &str| Report::PoweredOff {
                    server: server.to_string(),
                    result: Err(PowerFailure { reason, message: message.to_string() }),
                    refused: None,
                };
                if self.fault(self.cfg.faults.bmc_off_error_probability) {
                    self.answer_in(5, failed(FailureReason::PowerActionFailed, "the BMC failed the power-off request"));
                } else if self.fault(self.cfg.faults.bmc_partition_probability) {
                    // The request may have gone through before the BMC was cut off.
                    if chance(&mut self.fault_rng, 0.5) {
                        self.begin_stop(s);
                        self.srv[s].off_waiting.pop();
                    }
                    self.answer_in(BMC_TIMEOUT_S, failed(FailureReason::BmcUnreachable, "the BMC stopped answering during the power-off"));
                } else {
                    self.begin_stop(s);
                }
                None
            }
        }
    }

    /// Records a power action sent to the server, as the controller does
    /// on the Server's status: the last day's, at most
    /// [`ironclaim_core::transitions::RECORDED_CHANGES`].
    fn record_power_change(&mut self, s: usize, on: bool) {
        let changes = &mut self.srv[s].power_changes;
        changes.push(PowerChange { at_s: self.now, on });
        if changes.len() > 2 * ironclaim_core::transitions::RECORDED_CHANGES {
            ironclaim_core::transitions::prune(changes, self.now, ironclaim_core::transitions::RECORDED_CHANGES);
        }
        if !on {
            let offs = changes.iter().filter(|c| !c.on && self.now - c.at_s < CYCLE_WINDOW_S).count() as u32;
            self.peak_offs_per_day = self.peak_offs_per_day.max(offs);
        }
    }

    fn begin_stop(&mut self, s: usize) {
        // With a lagging watch, the floor is judged by the pods the
        // autoscaler was shown (it cannot keep a floor by what it cannot
        // see); the power-off of a busy server is judged by the truth.
        let shown = (!self.lagging.is_empty()).then(|| {
            let mut counts = vec![0u32; self.srv.len()];
            for p in 0..self.pods.len() {
                if let PodState::Bound { server } = self.shown(p) {
                    counts[server] += 1;
                }
            }
            counts
        });
        self.checker.powering_off(self.now, s, &self.w.servers[s].name, shown.as_deref());
        if let Some(f) = self.srv[s].foreign.take() {
            self.nodes_epoch += 1;
            for _ in 0..f.pods {
                self.checker.unbound(s);
            }
        }
        self.ready.remove(&s);
        // Pods on a machine that loses power fail; their controllers (here,
        // the trace) want them back, so they wait again.
        let lost = std::mem::take(&mut self.srv[s].workload_pods);
        for p in lost {
            self.requeue(p);
        }
        let srv = &mut self.srv[s];
        srv.power = Power::Stopping;
        srv.booted = false;
        srv.allocated = Resources::default();
        srv.daemon_pods.clear();
        srv.epoch += 1;
        srv.off_waiting.push(self.actor);
        if let Some(n) = srv.node.as_mut() {
            n.ready_since = None;
            n.gates_passed = false;
        }
        let epoch = srv.epoch;
        self.refresh_watts(s);
        self.push(self.now + self.cfg.power_off_s, Event::StopDone { server: s, epoch });
        self.changed = true;
    }

    fn stop_done(&mut self, s: usize) {
        self.srv[s].power = Power::Off;
        self.srv[s].powered_by_ironclaim = false;
        self.srv[s].attempt = None;
        self.powered.remove(&s);
        self.refresh_watts(s);
        let name = self.w.servers[s].name.clone();
        for to in std::mem::take(&mut self.srv[s].off_waiting) {
            self.bmc_answer(to, Report::PoweredOff { server: name.clone(), result: Ok(()), refused: None });
        }
    }

    fn fail_claim(&mut self, claim: &str, reason: FailureReason) {
        let now = self.now;
        let Some(r) = self.claims.get_mut(claim) else { return };
        if r.failure.is_some() {
            return;
        }
        r.failure = Some(reason);
        let (stage, opened, server) = (r.stage, r.created_s, r.server.clone());
        *self.failures.entry((stage, reason)).or_insert(0) += 1;
        if self.failed_claims.len() < MAX_FAILED_CLAIMS_KEPT {
            self.failed_claims.push(FailedClaim { claim: claim.to_string(), server, opened_s: opened, failed_s: now, stage: stage.label(), reason });
        }
        self.arrivals.remove(claim);
        self.changed = true;
    }

    fn release(&mut self, server: &str, claim: &str, count_failure: bool, quarantine: bool) {
        let Some(s) = self.index(server) else { return };
        if self.srv[s].holder.as_deref() != Some(claim) {
            return;
        }
        let srv = &mut self.srv[s];
        srv.holder = None;
        if count_failure {
            srv.in_row += 1;
            srv.failures += 1;
            srv.last_failure_s = Some(self.now);
        }
        if quarantine {
            srv.health = Health::Quarantined;
        }
        self.checker.claim_closed(s);
        if let Some(a) = self.arrivals.remove(claim) {
            while self.arrival_history.front().is_some_and(|old| old.at_s.saturating_add(self.arrival_history_s) < self.now) {
                self.arrival_history.pop_front();
            }
            self.arrival_history.push_back(a);
        }
        self.changed = true;
    }

    fn evict(&mut self, node: String, pod: String) -> Report {
        let answer = match (self.index(&node), self.prep.pod_index.get(&pod)) {
            (Some(s), Some(&p)) if self.srv[s].workload_pods.contains(&p) => {
                self.unbind(p, s);
                // Its controller makes it again, a new pod with a wait of its own.
                let run = &mut self.pods[p];
                let bound_at = run.bound_at.unwrap_or(self.now);
                self.earlier_waits.push((p, bound_at - run.created_at));
                run.created_at = self.now;
                self.requeue(p);
                self.bind_pending();
                Eviction::Evicted
            }
            (Some(s), None) => {
                // A DaemonSet pod, `namespace/ds-node`.
                let before = self.srv[s].daemon_pods.len();
                let ds = &self.w.daemonsets;
                self.srv[s].daemon_pods.retain(|&d| format!("{}/{}", ds[d].namespace, daemon_pod_name(&ds[d], &node)) != pod);
                if self.srv[s].daemon_pods.len() < before { Eviction::Evicted } else { Eviction::Gone }
            }
            _ => Eviction::Gone,
        };
        self.changed = true;
        Report::Evicted { node, pod, answer }
    }

    // ---- power ---------------------------------------------------------------

    fn refresh_watts(&mut self, s: usize) {
        let sim = &self.w.servers[s];
        let p = &sim.power;
        let srv = &self.srv[s];
        let schedulable = srv.node.as_ref().is_some_and(|n| n.gates_passed);
        let w = match srv.power {
            Power::Off => p.off_watts,
            Power::PoweringOn => p.boot_watts,
            Power::On if !srv.booted => p.boot_watts,
            Power::On if schedulable => p.idle_watts + p.load_watts(&sim.capacity, srv.allocated.cpu_milli, srv.allocated.gpu_milli()),
            Power::On | Power::Stopping => p.idle_watts,
        };
        let dynamic = if srv.power == Power::On && schedulable { w - p.idle_watts } else { 0.0 };
        self.fleet_watts += w - self.srv[s].watts;
        self.fleet_dynamic_watts += dynamic - self.srv[s].dynamic_watts;
        self.srv[s].watts = w;
        self.srv[s].dynamic_watts = dynamic;
    }

    // ---- pods and the scheduler ----------------------------------------------

    fn pending_key(&self, p: usize) -> (i64, Seconds, usize) {
        (-i64::from(self.prep.pods[p].priority), self.pods[p].created_at, p)
    }

    fn arrive(&mut self, p: usize) {
        if self.prep.unplaceable[p].is_some() {
            self.set_state(p, PodState::Done);
            return;
        }
        self.set_state(p, PodState::Pending);
        if let Some(s) = self.best_node(p) {
            self.bind(p, s);
        } else {
            self.pending.insert(self.pending_key(p));
        }
    }

    /// A pod's new state; with a lagging watch, the autoscaler goes on
    /// seeing the old one for a while.
    fn set_state(&mut self, p: usize, state: PodState) {
        let mut lag = if self.cfg.faults.active_at(self.now) { self.cfg.faults.watch_lag_s } else { 0 };
        if let Some(end) = self.outage_end() {
            // The watch shows nothing new until the API is back.
            lag = lag.max(end - self.now);
        }
        let run = &mut self.pods[p];
        if lag > 0 {
            if self.now >= run.seen_until {
                run.seen = run.state;
            }
            run.seen_until = self.now + lag;
            self.lagging.insert(p);
        }
        run.state = state;
    }

    /// A pod that lost its node waits again: its controller (here, the
    /// trace) wants it back.
    fn requeue(&mut self, p: usize) {
        self.set_state(p, PodState::Pending);
        self.pods[p].bound_at = None;
        self.pending.insert(self.pending_key(p));
    }

    /// The pod's state as the autoscaler's watch shows it.
    fn shown(&self, p: usize) -> PodState {
        let run = &self.pods[p];
        if self.now < run.seen_until { run.seen } else { run.state }
    }

    /// Pods shown pending, in the scheduler's order.
    fn shown_pending(&self) -> Vec<usize> {
        let mut out: Vec<usize> = self.pending.iter().map(|k| k.2).filter(|&p| self.shown(p) == PodState::Pending).collect();
        let late: Vec<usize> =
            self.lagging.iter().copied().filter(|&p| self.shown(p) == PodState::Pending && self.pods[p].state != PodState::Pending).collect();
        if !late.is_empty() {
            out.extend(late);
            out.sort_by_key(|&p| self.pending_key(p));
        }
        out
    }

    fn unbind(&mut self, p: usize, server: usize) {
        let srv = &mut self.srv[server];
        srv.allocated.sub(self.pods[p].grown.as_ref().unwrap_or(&self.prep.pods[p].requests));
        srv.workload_pods.retain(|&x| x != p);
        self.pods[p].resize = None;
        self.checker.unbound(server);
        self.refresh_watts(server);
        // The kubelet applies a deferred resize once the room is there.
        let deferred: Vec<usize> = self.srv[server].workload_pods.iter().copied().filter(|&q| self.pods[q].resize.is_some()).collect();
        for q in deferred {
            self.try_resize(q, server);
        }
    }

    /// The requests a pod holds or asks for now.
    fn requests(&self, p: usize) -> &Resources {
        self.pods[p].grown.as_ref().unwrap_or(&self.prep.pods[p].requests)
    }

    /// The trace asks a pod for an in-place resize ([`crate::TraceResize`]).
    fn resize(&mut self, p: usize) {
        let Some(to) = self.w.pods[p].resize.as_ref().map(|r| Resources { pods: 1, ..r.to.clone() }) else { return };
        self.resizes.asked += 1;
        match self.pods[p].state {
            PodState::Bound { server } => {
                let given = Some(self.requests(p).clone());
                self.pods[p].resize = Some(Resize { desired: to.clone(), reason: ResizeReason::Deferred, since_s: self.now, given });
                if self.try_resize(p, server) {
                    return;
                }
                if !to.fits(&self.w.servers[server].capacity) {
                    // Beyond the node's allocatable, the API server refuses
                    // the resize: VPA makes the pod again at its new size.
                    self.recreate(p, server);
                } else {
                    self.push(self.now + crate::workload::VPA_DEFERRED_EVICT_S, Event::VpaRecreate(p));
                }
            }
            // Not running yet: it is made at its new size.
            PodState::Pending => {
                self.pods[p].grown = Some(to);
                self.bind_pending();
            }
            PodState::NotArrived | PodState::Done => {}
        }
    }

    /// Applies a pod's deferred resize where it runs, if the node has the
    /// room now.
    fn try_resize(&mut self, p: usize, server: usize) -> bool {
        let Some(to) = self.pods[p].resize.as_ref().map(|r| r.desired.clone()) else { return false };
        let mut others = self.srv[server].allocated.clone();
        others.sub(self.requests(p));
        if !fits_beside(&to, &others, &self.w.servers[server].capacity) {
            return false;
        }
        others.add(&to);
        self.srv[server].allocated = others;
        self.pods[p].grown = Some(to);
        self.pods[p].resize = None;
        self.resizes.in_place += 1;
        self.refresh_watts(server);
        self.changed = true;
        true
    }

    /// VPA gives up on a resize still deferred.
    fn vpa_recreate(&mut self, p: usize) {
        if let (PodState::Bound { server }, Some(_)) = (self.pods[p].state, &self.pods[p].resize) {
            self.recreate(p, server);
        }
    }

    /// The pod evicted and made again at the size its resize asked for; its
    /// wait runs from the resize.
    fn recreate(&mut self, p: usize, server: usize) {
        let Some(resize) = self.pods[p].resize.clone() else { return };
        self.unbind(p, server);
        let run = &mut self.pods[p];
        let bound_at = run.bound_at.unwrap_or(self.now);
        self.earlier_waits.push((p, bound_at - run.created_at));
        run.created_at = resize.since_s;
        run.grown = Some(resize.desired);
        self.resizes.recreated += 1;
        self.requeue(p);
        self.bind_pending();
    }

    fn depart(&mut self, p: usize) {
        match self.pods[p].state {
            PodState::Bound { server } => {
                self.unbind(p, server);
                self.set_state(p, PodState::Done);
                self.bind_pending();
            }
            PodState::Pending => {
                let key = self.pending_key(p);
                self.pending.remove(&key);
                self.set_state(p, PodState::Done);
                self.pods[p].withdrawn_at = Some(self.now);
            }
            _ => self.set_state(p, PodState::Done),
        }
    }

    /// kube-scheduler: filter schedulable nodes, score by the strategy,
    /// ties to the lowest server index. A `PreferNoSchedule` taint the pod
    /// does not tolerate outweighs any resource score, as TaintToleration's
    /// weight (3) against NodeResourcesFit's (1) makes it.
    fn best_node(&self, p: usize) -> Option<usize> {
        let pod = &self.prep.pods[p];
        let requests = self.requests(p);
        let mut best: Option<(f64, usize)> = None;
        for &s in &self.ready {
            let srv = &self.srv[s];
            let cap = &self.w.servers[s].capacity;
            if !fits_beside(requests, &srv.allocated, cap)
                || check_node_affinity(pod, &srv.labels, &self.w.servers[s].name).is_err()
                || check_taints(pod, &srv.taints, false).is_err()
            {
                continue;
            }
            let soft =
                srv.taints.iter().filter(|t| t.effect == TaintEffect::PreferNoSchedule && !pod.tolerations.iter().any(|o| o.tolerates(t))).count();
            let score = node_score(self.cfg.scoring, requests, &srv.allocated, cap) - 10.0 * soft as f64;
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, s));
            }
        }
        best.map(|(_, s)| s)
    }

    fn bind(&mut self, p: usize, s: usize) {
        let key = self.pending_key(p);
        self.pending.remove(&key);
        // The first pod on a spare's node (a claim of no pods) is the fresh
        // demand it was kept for, as the controller reads it.
        if let Some(holder) = self.srv[s].holder.as_ref()
            && self.claims.get(holder).is_some_and(|r| r.pods.is_empty())
            && !self.arrivals.contains_key(holder)
        {
            let pod = &self.prep.pods[p];
            let arrival = Arrival { at_s: self.pods[p].created_at, server: self.w.servers[s].name.clone(), deadline_s: pod.deadline_s };
            self.arrivals.insert(holder.clone(), arrival);
        }
        let srv = &mut self.srv[s];
        srv.allocated.add(self.pods[p].grown.as_ref().unwrap_or(&self.prep.pods[p].requests));
        srv.workload_pods.push(p);
        self.checker.bound(s);
        self.set_state(p, PodState::Bound { server: s });
        self.pods[p].bound_at = Some(self.now);
        self.refresh_watts(s);
    }

    fn bind_pending(&mut self) {
        if self.pending.is_empty() || self.ready.is_empty() {
            return;
        }
        let order: Vec<usize> = self.pending.iter().map(|k| k.2).collect();
        for p in order {
            if let Some(s) = self.best_node(p) {
                self.bind(p, s);
            }
        }
    }

    // ---- what the autoscaler reads -------------------------------------------

    fn node_of(&self, s: usize, links: &Links) -> Option<Node> {
        let n = self.srv[s].node.as_ref()?;
        let name = &self.w.servers[s].name;
        Some(Node {
            name: name.clone(),
            labels: self.srv[s].labels.clone(),
            taints: self.srv[s].taints.clone(),
            allocatable: self.w.servers[s].capacity.with_default_pods(),
            unschedulable: n.cordoned || !n.gates_passed,
            ready: n.ready_since.is_some(),
            server: links.server_of(name).map(str::to_string),
            disrupting: n.disrupting,
            do_not_disrupt: false,
        })
    }

    /// The Nodes on `s` that ironclaim did not make, and their pods: an
    /// existing worker (Ready, tainted, its pods nothing may disrupt) and a
    /// stale twin (NotReady, empty).
    fn other_nodes_of(&self, s: usize, links: &Links, snap: &mut Snapshot) {
        let srv = &self.srv[s];
        let sim = &self.w.servers[s];
        let node = |name: &str, says: Option<&str>, ready: bool, taints: Vec<Taint>| {
            let mut labels = Labels::new();
            labels.insert(HOSTNAME.to_string(), name.to_string());
            if let Some(other) = says {
                labels.insert(SERVER_LABEL.to_string(), other.to_string());
            }
            Node {
                name: name.to_string(),
                labels,
                taints,
                allocatable: sim.capacity.with_default_pods(),
                unschedulable: false,
                ready,
                server: links.server_of(name).map(str::to_string),
                disrupting: false,
                do_not_disrupt: false,
            }
        };
        if let Some(f) = &srv.foreign {
            let taint = Taint { key: "legacy.example/dedicated".into(), value: String::new(), effect: ironclaim_core::TaintEffect::NoSchedule };
            snap.nodes.push(node(&f.node, f.says.as_deref(), true, vec![taint]));
            self.foreign_pods(f, &mut snap.pods);
        }
        if let Some(t) = &srv.stale_twin {
            snap.nodes.push(node(t, Some(&sim.name), false, Vec::new()));
        }
    }

    /// An existing worker's pods: running, owned, and not to be disrupted.
    fn foreign_pods(&self, f: &Foreign, out: &mut Pods) {
        for k in 0..f.pods {
            let mut pod = Pod::new("legacy", &format!("{}-app-{k}", f.node), Resources::new(1000, 1 << 30));
            pod.node_name = Some(f.node.clone());
            pod.phase = PodPhase::Running;
            pod.owner = Some(Owner { kind: "ReplicaSet".into(), name: format!("{}-app", f.node) });
            pod.do_not_disrupt = true;
            out.push(pod);
        }
    }

    fn pods_of(&self, s: usize, out: &mut Pods) {
        let name = &self.w.servers[s].name;
        if self.cfg.broken != Some(Broken::StaleEmptyNodes) {
            let here = PodState::Bound { server: s };
            let late = self.lagging.iter().copied().filter(|&p| self.pods[p].state != here && self.shown(p) == here);
            for p in self.srv[s].workload_pods.iter().copied().filter(|&p| self.shown(p) == here).chain(late) {
                let mut pod = self.prep.pods[p].clone();
                pod.created_s = self.pods[p].created_at;
                pod.node_name = Some(name.clone());
                pod.phase = PodPhase::Running;
                if let Some(grown) = &self.pods[p].grown {
                    pod.requests = grown.clone();
                }
                pod.resize = self.pods[p].resize.clone().map(Box::new);
                out.push(pod);
            }
        }
        for &d in &self.srv[s].daemon_pods {
            let ds = &self.w.daemonsets[d];
            let mut pod = ds.template.clone();
            pod.namespace = ds.namespace.clone();
            pod.name = daemon_pod_name(ds, name);
            pod.owner = Some(Owner { kind: "DaemonSet".into(), name: ds.name.clone() });
            pod.node_name = Some(name.clone());
            pod.phase = PodPhase::Running;
            out.push(pod);
        }
    }

    fn server_for_core(&self, s: usize, links: &Links) -> Server {
        let mut server = self.w.servers[s].clone();
        let srv = &self.srv[s];
        server.failures = srv.in_row;
        let linked = links.node_of(&server.name);
        server.health = if self.cfg.broken == Some(Broken::LabelOnlyIdentity) {
            srv.health
        } else {
            identity::health(srv.health, links.mismatch(&server.name).is_some(), self.power_facts(s, linked.is_some()))
        };
        server.claim = srv.holder.clone().filter(|_| self.cfg.broken != Some(Broken::UnfencedTakes));
        server.node = srv.node.as_ref().map(|_| server.name.clone()).or_else(|| linked.map(str::to_string));
        // A server on its way down reads as off: nothing is asked of it.
        server.power_state = match srv.power {
            Power::On | Power::PoweringOn => PowerState::On,
            Power::Off | Power::Stopping => PowerState::Off,
        };
        server.idle_since_s = srv.recorded_idle;
        server.power_changes = srv.power_changes.iter().filter(|c| self.now.saturating_sub(c.at_s) < CYCLE_WINDOW_S).copied().collect();
        // As the Server's recorded power says while the BMC boots it.
        server.powering_on = srv.power == Power::PoweringOn && srv.holder.is_none();
        server
    }

    /// Whether the server is powered off, healthy and free: one of many
    /// interchangeable candidates for a claim.
    fn free_off(&self, s: usize) -> bool {
        let srv = &self.srv[s];
        srv.power == Power::Off
            && srv.holder.is_none()
            && srv.node.is_none()
            && srv.health != Health::Quarantined
            && srv.health != Health::Maintenance
    }

    /// The check once faults stop: every pending pod a free server could
    /// host is placed within a bound.
    fn check_liveness(&mut self) {
        let Some(until) = self.cfg.faults.faults_until_s else { return };
        if self.now < until || self.pending.is_empty() || self.now < self.last_liveness_check + 60 {
            return;
        }
        self.last_liveness_check = self.now;
        let bound = self.liveness_bound_s;
        let overdue: Vec<usize> =
            self.pending.iter().map(|k| k.2).filter(|&p| self.now.saturating_sub(self.pods[p].created_at.max(until)) > bound).collect();
        for p in overdue {
            if let Some(host) = self.could_host(p) {
                let waited = self.now - self.pods[p].created_at.max(until);
                let prep = self.prep;
                self.checker.pending_too_long(self.now, &prep.keys[p], waited, bound, &host);
            }
        }
    }

    /// A server that could host the pod now: a schedulable node with room,
    /// or a healthy free powered-off server whose ServerPool admits the pod.
    fn could_host(&self, p: usize) -> Option<String> {
        let pod = &self.prep.pods[p];
        let links = self.links();
        for (s, srv) in self.srv.iter().enumerate() {
            let sim = &self.w.servers[s];
            // A server in doubt, or one another machine's Server claims to
            // be (a cloned label ironclaim cannot disprove), is no free
            // server to ironclaim: the fault made it so.
            if links.mismatch(&sim.name).is_some() || links.node_of(&sim.name).is_some_and(|n| n != sim.name) {
                continue;
            }
            let requests = self.requests(p);
            let fits = if self.ready.contains(&s) {
                requests.fits(&sim.capacity.minus(&srv.allocated))
                    && check_node_affinity(pod, &srv.labels, &sim.name).is_ok()
                    && check_taints(pod, &srv.taints, false).is_ok()
            } else if self.free_off(s) && srv.health == Health::Healthy {
                self.setup.pools.iter().any(|pool| {
                    if !pool.admits(sim) {
                        return false;
                    }
                    let mut labels = sim.labels.clone();
                    labels.extend(pool.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                    labels.insert(SERVERPOOL_LABEL.to_string(), pool.name.clone());
                    requests.fits(&sim.capacity)
                        && check_node_affinity(pod, &labels, &sim.name).is_ok()
                        && check_taints(pod, &pool.taints, false).is_ok()
                })
            } else {
                false
            };
            if fits {
                return Some(sim.name.clone());
            }
        }
        None
    }

    fn finish(mut self) -> RunStats {
        let end = self.end;
        let counters = self
            .replicas
            .iter()
            .filter_map(|r| r.auto.as_ref())
            .fold(Default::default(), |all: ironclaim_driver::autoscaler::Counters, a| all.plus(&a.counters));
        // Why the pods still pending wait: the core's answer at the end.
        let mut waiting: BTreeMap<String, u64> = BTreeMap::new();
        if !self.pending.is_empty() {
            let snap = self.snapshot(Some(self.pending.len()));
            for d in ironclaim_core::provision(&snap, end).pods {
                let reason = match &d.outcome {
                    Outcome::Unschedulable { reason } => reason.to_string(),
                    Outcome::InFlight { .. } => "waiting for a claim in flight".to_string(),
                    Outcome::NewClaim { .. } => "a claim would be opened for it".to_string(),
                    Outcome::Existing { .. } => "fits a node that is not schedulable yet".to_string(),
                };
                *waiting.entry(reason).or_insert(0) += 1;
            }
        }
        let mut pending_s = Vec::new();
        let mut pending_by_workload_s: BTreeMap<String, Vec<Seconds>> = BTreeMap::new();
        let (mut placed, mut withdrawn, mut at_end, mut misses) = (0, 0, 0, 0);
        let mut misses_by_workload: BTreeMap<String, u64> = BTreeMap::new();
        let mut waits: Vec<(usize, Seconds)> = Vec::with_capacity(self.pods.len() + self.earlier_waits.len());
        for (p, run) in self.pods.iter().enumerate() {
            let tp = &self.w.pods[p];
            if tp.arrival_s > end || self.prep.unplaceable[p].is_some() {
                continue;
            }
            let waited = match (run.state, run.bound_at, run.withdrawn_at) {
                (PodState::Bound { .. } | PodState::Done, Some(b), _) => {
                    placed += 1;
                    b - run.created_at
                }
                (_, _, Some(w)) => {
                    withdrawn += 1;
                    w.saturating_sub(run.created_at)
                }
                _ => {
                    at_end += 1;
                    end.saturating_sub(run.created_at)
                }
            };
            waits.push((p, waited));
        }
        // A pod its controller made again after an eviction waited again:
        // each wait is a pod's, as the API counts pods.
        waits.extend(self.earlier_waits.iter().copied().filter(|&(p, _)| self.prep.unplaceable[p].is_none()));
        for (p, waited) in waits {
            let pod = &self.prep.pods[p];
            if pod.deadline_s.is_some_and(|d| waited > d) {
                misses += 1;
                *misses_by_workload.entry(pod.workload.clone().unwrap_or_else(|| "-".into())).or_insert(0) += 1;
            }
            pending_s.push(waited);
            pending_by_workload_s.entry(pod.workload.clone().unwrap_or_else(|| "-".into())).or_default().push(waited);
        }
        let mut waiting_reasons: Vec<(String, u64)> = waiting.into_iter().collect();
        waiting_reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        waiting_reasons.truncate(10);
        let claims_in_flight_at_end = self.claims.values().filter(|r| r.failure.is_none() && r.stage < Stage::Ready).count() as u64;
        let failures = self.failures.iter().map(|(&(stage, reason), &count)| FailureCount { stage: stage.label(), reason, count }).collect();
        self.checker.end(end);
        RunStats {
            policy: self.kind,
            scoring: self.cfg.scoring,
            energy_kwh: self.energy_j / 3.6e6,
            dynamic_kwh: self.dynamic_j / 3.6e6,
            powered_mean: if end > 0 { self.powered_area / end as f64 } else { self.powered.len() as f64 },
            powered_peak: self.peak_powered.max(self.powered.len()),
            pending_s,
            pending_by_workload_s,
            pods_placed: placed,
            pods_withdrawn: withdrawn,
            pods_pending_at_end: at_end,
            deadline_misses: misses,
            deadline_misses_by_workload: misses_by_workload,
            power_on_cycles: self.cycles.clone(),
            peak_power_offs_per_day: self.peak_offs_per_day,
            claims_for_pods: counters.claims_opened,
            claims_spare: counters.spares_powered_on,
            claims_ready: self.claims_ready,
            claims_in_flight_at_end,
            cold_to_ready_s: self.cold_to_ready,
            failures,
            power_offs_refused: self.power_offs_refused,
            drains_done: counters.drains_done,
            pods_evicted: self.earlier_waits.len() as u64 - self.resizes.recreated,
            resizes: self.resizes,
            provision_calls: counters.decisions,
            scale_down_passes: counters.scale_down_passes,
            waiting_reasons,
            violations: self.checker.violations,
            timeline: self.timeline,
            quarantined: self.srv.iter().filter(|s| s.health == Health::Quarantined).count() as u64,
            failed_claims: self.failed_claims,
            crashes: self.crashes,
            takeovers: self.takeovers,
            nodes_lost: self.nodes_lost,
        }
    }

    /// The core's snapshot of the rack. Free powered-off servers are passed
    /// per group of identical ones (hardware class and failures in a row):
    /// with `scale_up` (pods to place), at most as many as there are pods,
    /// as the core can open no more claims than that, so its decision is
    /// the same as with the whole inventory; for scale-down, at most
    /// [`COLD_PER_GROUP_FOR_SCALE_DOWN`], which bounds how many spares of a
    /// group one pass powers on (the next pass powers on more). A server an
    /// arrival names is always passed: the warm floors count the arrivals
    /// by the class of their server, as the controller, which passes every
    /// server, does.
    fn snapshot(&self, scale_up: Option<usize>) -> Snapshot {
        let mut snap = Snapshot {
            pools: self.setup.pools.clone(),
            daemonsets: self.w.daemonsets.clone(),
            transition_limits: self.cfg.transition_limits.clone(),
            ..Default::default()
        };
        let links = self.links();
        for s in 0..self.srv.len() {
            if let Some(node) = self.node_of(s, &links) {
                snap.nodes.push(node);
                self.pods_of(s, &mut snap.pods);
            }
            self.other_nodes_of(s, &links, &mut snap);
        }
        for p in self.shown_pending() {
            let mut pod = self.prep.pods[p].clone();
            pod.created_s = self.pods[p].created_at;
            if let Some(grown) = &self.pods[p].grown {
                pod.requests = grown.clone();
            }
            snap.pods.push(pod);
        }
        let per_group = scale_up.map_or(COLD_PER_GROUP_FOR_SCALE_DOWN, |n| n.max(1));
        // Per class and group (failures in a row), the `per_group` least
        // cycled free servers: kept as a small sorted list per group while
        // the class is scanned, so the many free servers cost one look each.
        let mut groups: Vec<(u32, Vec<(u32, usize)>)> = Vec::new();
        let mut passed = vec![false; self.srv.len()];
        for class in &self.prep.classes {
            groups.clear();
            for &s in &class.members {
                if !self.free_off(s) {
                    passed[s] = true;
                    snap.servers.push(self.server_for_core(s, &links));
                    continue;
                }
                let in_row = self.srv[s].in_row;
                let at = match groups.iter().position(|g| g.0 == in_row) {
                    Some(at) => at,
                    None => {
                        groups.push((in_row, Vec::with_capacity(per_group.min(64) + 1)));
                        groups.len() - 1
                    }
                };
                let best = &mut groups[at].1;
                let key = (self.cycles[s], s);
                if best.len() == per_group && best.last().is_some_and(|&worst| worst <= key) {
                    continue;
                }
                let i = best.partition_point(|&k| k < key);
                best.insert(i, key);
                best.truncate(per_group);
            }
            groups.sort_unstable_by_key(|g| g.0);
            for (_, best) in &groups {
                for &(_, s) in best {
                    passed[s] = true;
                    snap.servers.push(self.server_for_core(s, &links));
                }
            }
        }
        for a in self.arrival_history.iter().chain(self.arrivals.values()) {
            if let Some(s) = self.index(&a.server)
                && !std::mem::replace(&mut passed[s], true)
            {
                snap.servers.push(self.server_for_core(s, &links));
            }
        }
        for r in self.claims.values() {
            let Some(stage) = r.stage.in_flight() else { continue };
            if r.failure.is_some() || self.cfg.broken == Some(Broken::UnfencedTakes) {
                continue;
            }
            snap.claims.push(ClaimInFlight {
                name: r.name.clone(),
                server: r.server.clone(),
                pool: r.pool.clone(),
                stage,
                stage_started_s: r.stage_started_s,
                pods: r.pods.clone(),
            });
        }
        snap.arrivals = self.arrival_history.iter().chain(self.arrivals.values()).cloned().collect();
        snap.arrivals.sort_by(|a, b| a.at_s.cmp(&b.at_s).then_with(|| a.server.cmp(&b.server)));
        snap
    }
}

impl World for Engine<'_> {
    fn pending(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.shown_pending().into_iter().map(|p| self.prep.keys[p].clone()).collect();
        // Running pods waiting for a resize their node cannot give yet.
        let resizing = self.srv.iter().flat_map(|s| s.workload_pods.iter().copied()).filter(|&p| self.pods[p].resize.is_some());
        keys.extend(resizing.map(|p| self.prep.keys[p].clone()));
        keys
    }

    fn snapshot(&self, scale_up: Option<usize>) -> Snapshot {
        Engine::snapshot(self, scale_up)
    }

    fn claims(&self) -> Vec<ClaimView> {
        self.claims
            .values()
            .map(|r| {
                let s = self.index(&r.server);
                let server = s.map(|s| ServerFacts {
                    holder: self.srv[s].holder.clone(),
                    durations: self.w.servers[s].durations,
                    failures: self.srv[s].in_row,
                    power_on_sent: self.srv[s].powered_by_ironclaim,
                });
                let node = s.and_then(|s| {
                    let n = self.srv[s].node.as_ref()?;
                    let ready = n.ready_since.is_some();
                    Some(NodeFacts {
                        name: self.w.servers[s].name.clone(),
                        ready,
                        ready_since_s: n.ready_since,
                        lifecycle_taint: None,
                        unmet: if ready && !n.gates_passed { vec!["readiness gates".to_string()] } else { Vec::new() },
                    })
                });
                let mut pods_pending = Vec::new();
                let mut pods_bound = 0;
                for k in &r.pods {
                    let Some(&p) = self.prep.pod_index.get(k) else { continue };
                    match self.shown(p) {
                        PodState::Pending => pods_pending.push(k.clone()),
                        PodState::Bound { server } if Some(server) == s => pods_bound += 1,
                        _ => {}
                    }
                }
                ClaimView { record: r.clone(), server, node, pods_pending, pods_bound }
            })
            .collect()
    }

    fn last_failure_s(&self, server: &str) -> Option<Seconds> {
        self.index(server).and_then(|s| self.srv[s].last_failure_s)
    }

    fn abandoned_drains(&self) -> Vec<(String, Seconds)> {
        self.abandoned.iter().map(|(n, t)| (n.clone(), *t)).collect()
    }

    fn recorded_idle(&self, server: &str) -> (Option<Seconds>, Option<Seconds>) {
        self.index(server).map_or((None, None), |s| (self.srv[s].recorded_idle, self.srv[s].business_s))
    }

    fn pods_on(&self, node: &str) -> Vec<Pod> {
        let mut out = Pods::default();
        if let Some(s) = self.index(node)
            && self.srv[s].node.is_some()
        {
            self.pods_of(s, &mut out);
        } else if let Some(f) = self.srv.iter().find_map(|srv| srv.foreign.as_ref().filter(|f| f.node == node)) {
            self.foreign_pods(f, &mut out);
        }
        out.iter().cloned().collect()
    }
}

/// Runs one policy over a prepared workload.
pub fn run_policy(w: &Workload, prep: &Prepared, cfg: &SimConfig, kind: PolicyKind, progress: &mut dyn FnMut(f64)) -> RunStats {
    Engine::new(w, prep, cfg, kind).run(progress)
}

/// [`run_policy`], telling `trace` every effect, answer and crash.
pub fn run_policy_traced(w: &Workload, prep: &Prepared, cfg: &SimConfig, kind: PolicyKind, trace: &mut Trace<'_>) -> RunStats {
    Engine::new(w, prep, cfg, kind).traced(trace).run(&mut |_| {})
}
