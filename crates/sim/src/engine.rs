//! The discrete-event engine: a virtual clock, an event queue, simulated
//! servers that boot through stages with drawn durations and injected
//! faults, a model of kube-scheduler that binds pods to Ready nodes, and
//! the decision core's [`ironclaim_core::provision`] called on each closed
//! batch of unschedulable pods, exactly as the controller will call it.
//!
//! # Determinism
//! Events at the same second run in the order they were queued; every
//! collection that is iterated is ordered (vectors, B-trees); hash maps are
//! only looked up. Each server draws from its own seeded stream.

use crate::check::Checker;
use crate::config::{Scoring, SimConfig};
use crate::policy::{FirstPod, FleetView, PolicyKind, PowerPolicy, ServerStatus};
use crate::rng::{SimRng, chance, lognormal_s, stream};
use crate::workload::{HardwareClass, Workload, gpu_milli_of};
use ironclaim_core::labels::{HOSTNAME, Labels, Taint};
use ironclaim_core::predicates::{check_node_affinity, check_taints};
use ironclaim_core::provision::{NODEPOOL_LABEL, SERVER_LABEL};
use ironclaim_core::{ClaimInFlight, Health, Node, Outcome, Owner, Pod, PodPhase, PowerState, Resources, Seconds, Server, Snapshot, Stage};
use ironclaim_driver::backoff::{FailureBackoff, quarantines};
use serde::Serialize;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::fmt;

/// Why a claim failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The BMC refused or dropped the power-on request.
    BmcError,
    /// PXE or local boot failed.
    BootFailed,
    /// The node never registered (or booted past the stuck threshold).
    JoinTimeout,
    /// The GPU driver validation gate failed.
    GpuGateFailed,
}

impl FailureReason {
    pub fn label(self) -> &'static str {
        match self {
            FailureReason::BmcError => "bmc_error",
            FailureReason::BootFailed => "boot_failed",
            FailureReason::JoinTimeout => "join_timeout",
            FailureReason::GpuGateFailed => "gpu_gate_failed",
        }
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

const STAGES: [(Stage, &str); 5] = [
    (Stage::Selected, "selected"),
    (Stage::PoweringOn, "powering_on"),
    (Stage::Booting, "booting"),
    (Stage::Joined, "joined"),
    (Stage::Ready, "ready"),
];

fn stage_rank(stage: Stage) -> u8 {
    STAGES.iter().position(|(s, _)| *s == stage).unwrap_or(0) as u8
}

pub fn stage_label(stage: Stage) -> &'static str {
    match stage {
        Stage::Selected => "selected",
        Stage::PoweringOn => "powering_on",
        Stage::Booting => "booting",
        Stage::Joined => "joined",
        Stage::Ready => "ready",
    }
}

/// What the run is compared on, shared by every policy: server classes,
/// NodePool membership, unique pod names and the pods no server can host.
pub struct Prepared {
    pub classes: Vec<HardwareClass>,
    pub class_of: Vec<usize>,
    /// The NodePool a server joins when a policy powers it on itself.
    pub pool_of: Vec<Option<usize>>,
    /// Pods with unique names, created at their arrival.
    pub pods: Vec<Pod>,
    /// Per pod: why no server of the inventory can ever host it.
    pub unplaceable: Vec<Option<String>>,
    pub end_s: Seconds,
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
        let pool_of = w.servers.iter().map(|s| order.iter().copied().find(|&p| w.pools[p].admits(&s.server))).collect();
        let mut seen: HashMap<String, u32> = HashMap::new();
        let mut pods = Vec::with_capacity(w.pods.len());
        let mut pod_index = HashMap::with_capacity(w.pods.len());
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
            pod_index.insert(pod.key(), i);
            pods.push(pod);
        }
        let server_index = w.servers.iter().enumerate().map(|(i, s)| (s.server.name.clone(), i)).collect();
        let end_s = duration_s.unwrap_or(w.end_s);
        let mut p = Prepared { classes, class_of, pool_of, unplaceable: vec![None; pods.len()], pods, end_s, pod_index, server_index };
        p.find_unplaceable(w);
        p
    }

    /// Asks the core once, with every server free and one pod of each
    /// shape pending, which shapes no hardware can ever host.
    fn find_unplaceable(&mut self, w: &Workload) {
        let mut shapes: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, p) in self.pods.iter().enumerate() {
            let key = format!("{:?}|{:?}|{:?}|{:?}", p.requests, p.node_selector, p.node_affinity, p.tolerations);
            shapes.entry(key).or_default().push(i);
        }
        let mut snap = Snapshot {
            pools: w.pools.clone(),
            daemonsets: w.daemonsets.clone(),
            servers: w.servers.iter().map(|s| s.server.clone()).collect(),
            ..Default::default()
        };
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
enum State {
    Off,
    Starting,
    Ready,
    Stopping,
}

struct Srv {
    state: State,
    health: Health,
    consecutive_failures: u32,
    failures: u32,
    allocated: Resources,
    workload_pods: Vec<usize>,
    daemon_pods: Vec<usize>,
    idle_since: Option<Seconds>,
    labels: Labels,
    taints: Vec<Taint>,
    pool: Option<usize>,
    rng: SimRng,
    watts: f64,
    /// Watts above idle while Ready (utilisation).
    dynamic_watts: f64,
    epoch: u64,
    claim: Option<usize>,
}

struct Step {
    stage: Stage,
    duration_s: Seconds,
    fails: Option<FailureReason>,
}

struct ClaimRun {
    server: usize,
    pool: usize,
    spare: bool,
    stage: Stage,
    stage_started_s: Seconds,
    steps: Vec<Step>,
    step: usize,
    opened_s: Seconds,
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
    bound_at: Option<Seconds>,
    withdrawn_at: Option<Seconds>,
    covered_by: Option<usize>,
    attempted_epoch: Option<u64>,
    last_reason: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    Arrive(usize),
    Depart(usize),
    StageDone { server: usize, epoch: u64 },
    StopDone { server: usize, epoch: u64 },
    BackoffOver { server: usize, epoch: u64 },
    BatchClose,
    Reconcile,
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

/// Failed claims listed one by one in the report, beyond which they are
/// only counted.
const MAX_FAILED_CLAIMS_KEPT: usize = 200;

/// One failed claim: which server, when, at which stage, why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FailedClaim {
    pub claim: String,
    pub server: String,
    /// Opened by the power policy for a warm spare, not for pods.
    pub spare: bool,
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
    pub pods_placed: u64,
    pub pods_withdrawn: u64,
    pub pods_pending_at_end: u64,
    pub deadline_misses: u64,
    pub power_on_cycles: Vec<u32>,
    pub claims_for_pods: u64,
    pub claims_spare: u64,
    pub claims_ready: u64,
    pub claims_in_flight_at_end: u64,
    pub cold_to_ready_s: Vec<Seconds>,
    pub failures: Vec<FailureCount>,
    pub stale_accounting: u64,
    pub provision_calls: u64,
    /// Last core reason for pods that were still pending at the end.
    pub waiting_reasons: Vec<(String, u64)>,
    pub violations: Vec<crate::check::Violation>,
    pub timeline: Timeline,
    pub quarantined: u64,
    /// The first failed claims, one by one.
    pub failed_claims: Vec<FailedClaim>,
}

/// Series sampled at regular times, for plots.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Timeline {
    pub at_s: Vec<Seconds>,
    pub powered: Vec<u32>,
    pub watts: Vec<f64>,
    pub pending: Vec<u32>,
}

pub struct Engine<'a> {
    w: &'a Workload,
    prep: &'a Prepared,
    cfg: &'a SimConfig,
    policy: Box<dyn PowerPolicy + 'a>,
    now: Seconds,
    end: Seconds,
    queue: BinaryHeap<Queued>,
    seq: u64,
    srv: Vec<Srv>,
    status: Vec<ServerStatus>,
    cycles: Vec<u32>,
    powered: BTreeSet<usize>,
    ready: BTreeSet<usize>,
    pods: Vec<PodRun>,
    pending: BTreeSet<(i64, Seconds, usize)>,
    claims: Vec<ClaimRun>,
    world_epoch: u64,
    batch: Option<(Seconds, Seconds)>,
    reconciles: BTreeSet<Seconds>,
    in_reconcile: bool,
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
    failures: BTreeMap<(u8, FailureReason), u64>,
    failed_claims: Vec<FailedClaim>,
    cold_to_ready: Vec<Seconds>,
    claims_for_pods: u64,
    claims_spare: u64,
    claims_ready: u64,
    stale: u64,
    provision_calls: u64,
    liveness_bound_s: Seconds,
    last_liveness_check: Seconds,
}

/// Whether `request` fits next to `used` on `capacity`, with the rules of
/// [`Resources::fits`], without building the free vector.
fn fits_beside(request: &Resources, used: &Resources, capacity: &Resources) -> bool {
    let ok = |r: i64, u: i64, c: i64| r <= 0 || r <= c - u;
    ok(request.pods, used.pods, capacity.pods)
        && ok(request.cpu_milli, used.cpu_milli, capacity.cpu_milli)
        && ok(request.memory_bytes, used.memory_bytes, capacity.memory_bytes)
        && ok(request.ephemeral_bytes, used.ephemeral_bytes, capacity.ephemeral_bytes)
        && request.extended.iter().all(|(name, r)| ok(*r, used.extended(name), capacity.extended(name)))
}

fn ds_owner() -> Option<Owner> {
    Some(Owner { kind: "DaemonSet".into(), name: String::new() })
}

impl<'a> Engine<'a> {
    pub fn new(w: &'a Workload, prep: &'a Prepared, cfg: &'a SimConfig, policy: Box<dyn PowerPolicy + 'a>) -> Self {
        let n = w.servers.len();
        let srv = (0..n)
            .map(|i| Srv {
                state: State::Off,
                health: Health::Healthy,
                consecutive_failures: 0,
                failures: 0,
                allocated: Resources::default(),
                workload_pods: Vec::new(),
                daemon_pods: Vec::new(),
                idle_since: None,
                labels: Labels::new(),
                taints: Vec::new(),
                pool: prep.pool_of[i],
                rng: stream(cfg.seed, "server", i as u64),
                watts: w.servers[i].server.power.off_watts,
                dynamic_watts: 0.0,
                epoch: 0,
                claim: None,
            })
            .collect();
        let end = prep.end_s;
        let points = cfg.timeline_points.max(2) as u64;
        let max_cold: Seconds = w
            .servers
            .iter()
            .map(|s| {
                let d = &s.server.durations;
                let f = cfg.stuck_factor * cfg.faults.slow_boot_factor.max(1.0);
                (d.cold_s() as f64 * f) as Seconds
            })
            .max()
            .unwrap_or(0);
        let liveness_bound_s = 2 * max_cold + cfg.batch_max_s + 3 * cfg.reconcile_interval_s + 2 * cfg.power_off_s;
        let fleet_watts = w.servers.iter().map(|s| s.server.power.off_watts).sum();
        Engine {
            w,
            prep,
            cfg,
            policy,
            now: 0,
            end,
            queue: BinaryHeap::new(),
            seq: 0,
            srv,
            status: vec![ServerStatus::Off; n],
            cycles: vec![0; n],
            powered: BTreeSet::new(),
            ready: BTreeSet::new(),
            pods: (0..prep.pods.len())
                .map(|_| PodRun {
                    state: PodState::NotArrived,
                    bound_at: None,
                    withdrawn_at: None,
                    covered_by: None,
                    attempted_epoch: None,
                    last_reason: None,
                })
                .collect(),
            pending: BTreeSet::new(),
            claims: Vec::new(),
            world_epoch: 0,
            batch: None,
            reconciles: BTreeSet::new(),
            in_reconcile: false,
            fleet_watts,
            fleet_dynamic_watts: 0.0,
            energy_j: 0.0,
            dynamic_j: 0.0,
            powered_area: 0.0,
            last_t: 0,
            peak_powered: 0,
            checker: Checker::new(&prep.class_of),
            timeline: Timeline::default(),
            sample_every: (end / points).max(1),
            next_sample: 0,
            failures: BTreeMap::new(),
            failed_claims: Vec::new(),
            cold_to_ready: Vec::new(),
            claims_for_pods: 0,
            claims_spare: 0,
            claims_ready: 0,
            stale: 0,
            provision_calls: 0,
            liveness_bound_s,
            last_liveness_check: 0,
        }
    }

    fn push(&mut self, at: Seconds, event: Event) {
        self.seq += 1;
        self.queue.push(Queued { at, seq: self.seq, event });
    }

    fn request_reconcile(&mut self, at: Seconds) {
        let i = self.cfg.reconcile_interval_s.max(1);
        let mut t = at.max(self.now);
        if self.in_reconcile && t <= self.now {
            t = self.now + 1;
        }
        let aligned = t.div_ceil(i) * i;
        if self.reconciles.insert(aligned) {
            self.push(aligned, Event::Reconcile);
        }
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
        }
        let powered: Vec<usize> = self.powered.iter().copied().collect();
        let on = {
            let view = FleetView {
                now_s: 0,
                servers: &self.w.servers,
                classes: &self.prep.classes,
                class_of: &self.prep.class_of,
                status: &self.status,
                power_on_cycles: &self.cycles,
                powered: &powered,
            };
            self.policy.initially_on(&view)
        };
        for s in on {
            if self.srv[s].state == State::Off
                && let Some(pool) = self.srv[s].pool
            {
                self.powered.insert(s);
                self.make_ready(s, pool);
            }
        }
        self.request_reconcile(0);
        let mut handled: u64 = 0;
        while let Some(q) = self.queue.pop() {
            if q.at > self.end {
                break;
            }
            self.advance(q.at);
            self.handle(q.event);
            handled += 1;
            if handled.is_multiple_of(4096) && self.end > 0 {
                progress(self.now as f64 / self.end as f64);
            }
        }
        self.advance(self.end);
        progress(1.0);
        self.finish()
    }

    fn advance(&mut self, t: Seconds) {
        while self.next_sample <= t && self.next_sample <= self.end {
            let at = self.next_sample;
            self.timeline.at_s.push(at);
            self.timeline.powered.push(self.powered.len() as u32);
            self.timeline.watts.push(self.fleet_watts);
            self.timeline.pending.push(self.pending.len() as u32);
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
        match event {
            Event::Arrive(p) => self.arrive(p),
            Event::Depart(p) => self.depart(p),
            Event::StageDone { server, epoch } if self.srv[server].epoch == epoch => self.stage_done(server),
            Event::StopDone { server, epoch } if self.srv[server].epoch == epoch => self.stop_done(server),
            Event::BackoffOver { server, epoch } if self.srv[server].epoch == epoch && self.srv[server].health == Health::Failed => {
                self.srv[server].health = Health::Healthy;
                if self.srv[server].state == State::Off {
                    self.status[server] = ServerStatus::Off;
                }
                self.world_changed();
            }
            Event::BatchClose => self.batch_close(),
            Event::Reconcile => {
                self.reconciles.remove(&self.now);
                self.reconcile();
            }
            _ => {}
        }
    }

    // ---- power and state -------------------------------------------------

    fn refresh_watts(&mut self, s: usize) {
        let sim = &self.w.servers[s];
        let p = &sim.server.power;
        let srv = &self.srv[s];
        let w = match srv.state {
            State::Off => p.off_watts,
            State::Stopping => p.idle_watts,
            State::Starting => {
                let stage = srv.claim.map(|c| self.claims[c].stage).unwrap_or(Stage::PoweringOn);
                if stage == Stage::Joined { p.idle_watts } else { p.boot_watts }
            }
            State::Ready => {
                let cap = &sim.server.capacity;
                let frac = |a: i64, c: i64| if c > 0 { (a as f64 / c as f64).clamp(0.0, 1.0) } else { 0.0 };
                let cpu = frac(srv.allocated.cpu_milli, cap.cpu_milli);
                let gpu = frac(gpu_milli_of(&srv.allocated), gpu_milli_of(cap));
                let g = sim.gpu_dynamic_share;
                p.idle_watts + (p.peak_watts - p.idle_watts) * ((1.0 - g) * cpu + g * gpu)
            }
        };
        let dynamic = if srv.state == State::Ready { w - p.idle_watts } else { 0.0 };
        self.fleet_watts += w - self.srv[s].watts;
        self.fleet_dynamic_watts += dynamic - self.srv[s].dynamic_watts;
        self.srv[s].watts = w;
        self.srv[s].dynamic_watts = dynamic;
    }

    fn set_status(&mut self, s: usize) {
        let srv = &self.srv[s];
        self.status[s] = match srv.state {
            State::Off if srv.health == Health::Healthy => ServerStatus::Off,
            State::Off => ServerStatus::Unavailable,
            State::Starting => ServerStatus::Starting { spare: srv.claim.is_some_and(|c| self.claims[c].spare) },
            State::Ready => ServerStatus::Ready { idle_since: srv.idle_since },
            State::Stopping => ServerStatus::Stopping,
        };
    }

    fn world_changed(&mut self) {
        self.world_epoch += 1;
        self.request_reconcile(self.now);
    }

    fn make_ready(&mut self, s: usize, pool: usize) {
        let sim = &self.w.servers[s];
        let p = &self.w.pools[pool];
        let mut labels = sim.server.labels.clone();
        labels.extend(p.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
        labels.insert(NODEPOOL_LABEL.to_string(), p.name.clone());
        labels.insert(SERVER_LABEL.to_string(), sim.server.name.clone());
        labels.insert(HOSTNAME.to_string(), sim.server.name.clone());
        let srv = &mut self.srv[s];
        srv.labels = labels;
        srv.taints = p.taints.clone();
        srv.pool = Some(pool);
        srv.state = State::Ready;
        srv.claim = None;
        srv.idle_since = Some(self.now);
        srv.allocated = Resources::default();
        srv.daemon_pods.clear();
        for (i, ds) in self.w.daemonsets.iter().enumerate() {
            let t = &ds.template;
            if check_node_affinity(t, &srv.labels, &sim.server.name).is_ok() && check_taints(t, &srv.taints, false).is_ok() {
                srv.allocated.add(&Resources { pods: 1, ..t.requests.clone() });
                srv.daemon_pods.push(i);
            }
        }
        self.ready.insert(s);
        self.checker.node_ready(s);
        self.set_status(s);
        self.refresh_watts(s);
    }

    fn start_claim(&mut self, s: usize, pool: usize, spare: bool, pods: &[usize]) -> Option<usize> {
        if self.srv[s].state != State::Off || self.srv[s].health != Health::Healthy {
            return None;
        }
        let id = self.claims.len();
        self.checker.claim_opened(self.now, s, &self.w.servers[s].server.name);
        let d = self.w.servers[s].server.durations;
        let has_gpu = gpu_milli_of(&self.w.servers[s].server.capacity) > 0;
        let f = &self.cfg.faults;
        let faults = f.active_at(self.now);
        let stuck = self.cfg.stuck_factor;
        let rng = &mut self.srv[s].rng;
        let power_on = lognormal_s(rng, d.power_on_s, d.tail_percent, stuck);
        let mut boot = lognormal_s(rng, d.boot_s, d.tail_percent, stuck);
        let join = lognormal_s(rng, d.join_s, d.tail_percent, stuck);
        let ready = lognormal_s(rng, d.ready_s, d.tail_percent, stuck);
        let slow = chance(rng, f.slow_boot_probability);
        let bmc = chance(rng, f.bmc_error_probability);
        let boot_fail = chance(rng, f.boot_failure_probability);
        let never_joins = chance(rng, f.never_joins_probability);
        let gate = chance(rng, f.gpu_gate_failure_probability);
        if faults && slow {
            boot = (boot as f64 * f.slow_boot_factor.max(1.0)).round() as Seconds;
        }
        // A boot and join longer than this is stuck, not slow.
        let stuck_s = ((d.boot_s + d.join_s) as f64 * stuck).round() as Seconds;
        let mut steps = Vec::with_capacity(3);
        if faults && bmc {
            steps.push(Step { stage: Stage::PoweringOn, duration_s: power_on.min(15), fails: Some(FailureReason::BmcError) });
        } else {
            steps.push(Step { stage: Stage::PoweringOn, duration_s: power_on, fails: None });
            if faults && boot_fail {
                steps.push(Step { stage: Stage::Booting, duration_s: boot, fails: Some(FailureReason::BootFailed) });
            } else if (faults && never_joins) || boot + join > stuck_s {
                steps.push(Step { stage: Stage::Booting, duration_s: stuck_s, fails: Some(FailureReason::JoinTimeout) });
            } else {
                steps.push(Step { stage: Stage::Booting, duration_s: boot + join, fails: None });
                let fails = (faults && gate && has_gpu).then_some(FailureReason::GpuGateFailed);
                steps.push(Step { stage: Stage::Joined, duration_s: ready, fails });
            }
        }
        let first = steps[0].duration_s;
        self.claims.push(ClaimRun {
            server: s,
            pool,
            spare,
            stage: Stage::PoweringOn,
            stage_started_s: self.now,
            steps,
            step: 0,
            opened_s: self.now,
        });
        if spare {
            self.claims_spare += 1;
        } else {
            self.claims_for_pods += 1;
        }
        let srv = &mut self.srv[s];
        srv.state = State::Starting;
        srv.claim = Some(id);
        srv.epoch += 1;
        let epoch = srv.epoch;
        self.cycles[s] += 1;
        self.powered.insert(s);
        self.peak_powered = self.peak_powered.max(self.powered.len());
        self.set_status(s);
        self.refresh_watts(s);
        for &p in pods {
            self.pods[p].covered_by = Some(id);
        }
        self.push(self.now + first, Event::StageDone { server: s, epoch });
        Some(id)
    }

    fn stage_done(&mut self, s: usize) {
        let Some(c) = self.srv[s].claim else { return };
        let claim = &mut self.claims[c];
        let step = &claim.steps[claim.step];
        if let Some(reason) = step.fails {
            let stage = step.stage;
            self.fail_claim(s, stage, reason);
            return;
        }
        claim.step += 1;
        if claim.step < claim.steps.len() {
            let next = &claim.steps[claim.step];
            claim.stage = next.stage;
            claim.stage_started_s = self.now;
            let d = next.duration_s;
            let epoch = self.srv[s].epoch;
            self.refresh_watts(s);
            self.push(self.now + d, Event::StageDone { server: s, epoch });
            return;
        }
        let (pool, opened) = (claim.pool, claim.opened_s);
        self.claims_ready += 1;
        self.cold_to_ready.push(self.now - opened);
        self.checker.claim_closed(s);
        self.srv[s].consecutive_failures = 0;
        self.make_ready(s, pool);
        self.bind_pending();
        if !self.pending.is_empty() {
            self.world_epoch += 1;
        }
        self.request_reconcile(self.now);
    }

    fn fail_claim(&mut self, s: usize, stage: Stage, reason: FailureReason) {
        *self.failures.entry((stage_rank(stage), reason)).or_insert(0) += 1;
        if self.failed_claims.len() < MAX_FAILED_CLAIMS_KEPT
            && let Some(c) = self.srv[s].claim
        {
            let claim = &self.claims[c];
            self.failed_claims.push(FailedClaim {
                claim: format!("c{c}"),
                server: self.w.servers[s].server.name.clone(),
                spare: claim.spare,
                opened_s: claim.opened_s,
                failed_s: self.now,
                stage: stage_label(stage),
                reason,
            });
        }
        self.checker.claim_closed(s);
        let srv = &mut self.srv[s];
        srv.failures += 1;
        srv.consecutive_failures += 1;
        srv.claim = None;
        if quarantines(srv.consecutive_failures, self.cfg.quarantine_after_failures) {
            srv.health = Health::Quarantined;
        } else {
            srv.health = Health::Failed;
        }
        self.begin_stop(s);
        if self.srv[s].health == Health::Failed {
            let backoff =
                FailureBackoff { base_s: self.cfg.failure_backoff_s, max_s: self.cfg.failure_backoff_max_s }.after(self.srv[s].consecutive_failures);
            let epoch = self.srv[s].epoch;
            self.push(self.now + self.cfg.power_off_s + backoff, Event::BackoffOver { server: s, epoch });
        }
        self.world_changed();
    }

    fn begin_stop(&mut self, s: usize) {
        if self.srv[s].state == State::Ready {
            self.checker.powering_off(self.now, s, &self.w.servers[s].server.name);
            self.ready.remove(&s);
            let evicted = std::mem::take(&mut self.srv[s].workload_pods);
            for p in evicted {
                self.pods[p].state = PodState::Pending;
                self.pods[p].bound_at = None;
                self.pods[p].covered_by = None;
                self.pods[p].attempted_epoch = None;
                self.pending.insert(self.pending_key(p));
                self.open_batch();
            }
        }
        let srv = &mut self.srv[s];
        srv.state = State::Stopping;
        srv.allocated = Resources::default();
        srv.daemon_pods.clear();
        srv.idle_since = None;
        srv.epoch += 1;
        let epoch = srv.epoch;
        self.set_status(s);
        self.refresh_watts(s);
        self.push(self.now + self.cfg.power_off_s, Event::StopDone { server: s, epoch });
    }

    fn stop_done(&mut self, s: usize) {
        self.srv[s].state = State::Off;
        self.powered.remove(&s);
        self.set_status(s);
        self.refresh_watts(s);
        self.world_changed();
    }

    // ---- pods and the scheduler -------------------------------------------

    fn pending_key(&self, p: usize) -> (i64, Seconds, usize) {
        (-i64::from(self.prep.pods[p].priority), self.w.pods[p].arrival_s, p)
    }

    fn arrive(&mut self, p: usize) {
        if self.prep.unplaceable[p].is_some() {
            self.pods[p].state = PodState::Done;
            return;
        }
        self.pods[p].state = PodState::Pending;
        if let Some(s) = self.best_node(p) {
            self.bind(p, s);
        } else {
            self.pending.insert(self.pending_key(p));
            self.open_batch();
        }
    }

    fn depart(&mut self, p: usize) {
        match self.pods[p].state {
            PodState::Bound { server } => {
                let pod = &self.prep.pods[p];
                let srv = &mut self.srv[server];
                srv.allocated.sub(&pod.requests);
                srv.workload_pods.retain(|&x| x != p);
                self.checker.unbound(server);
                if srv.workload_pods.is_empty() {
                    srv.idle_since = Some(self.now);
                    self.request_reconcile(self.now);
                }
                self.set_status(server);
                self.refresh_watts(server);
                self.pods[p].state = PodState::Done;
                self.bind_pending();
            }
            PodState::Pending => {
                let key = self.pending_key(p);
                self.pending.remove(&key);
                self.pods[p].state = PodState::Done;
                self.pods[p].withdrawn_at = Some(self.now);
            }
            _ => self.pods[p].state = PodState::Done,
        }
    }

    /// kube-scheduler: filter Ready nodes, score by the strategy, ties to
    /// the lowest server index.
    fn best_node(&self, p: usize) -> Option<usize> {
        let pod = &self.prep.pods[p];
        let mut best: Option<(f64, usize)> = None;
        for &s in &self.ready {
            let srv = &self.srv[s];
            let cap = &self.w.servers[s].server.capacity;
            if !fits_beside(&pod.requests, &srv.allocated, cap)
                || check_node_affinity(pod, &srv.labels, &self.w.servers[s].server.name).is_err()
                || check_taints(pod, &srv.taints, false).is_err()
            {
                continue;
            }
            let frac = |used: i64, c: i64| if c > 0 { used as f64 / c as f64 } else { 1.0 };
            let cpu = frac(srv.allocated.cpu_milli + pod.requests.cpu_milli, cap.cpu_milli);
            let mem = frac(srv.allocated.memory_bytes + pod.requests.memory_bytes, cap.memory_bytes);
            let score = match self.cfg.scoring {
                Scoring::LeastAllocated => ((1.0 - cpu) + (1.0 - mem)) / 2.0,
                Scoring::MostAllocated => (cpu + mem) / 2.0,
            };
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, s));
            }
        }
        best.map(|(_, s)| s)
    }

    fn bind(&mut self, p: usize, s: usize) {
        let key = self.pending_key(p);
        self.pending.remove(&key);
        let pod = &self.prep.pods[p];
        let was_idle = self.srv[s].workload_pods.is_empty();
        let srv = &mut self.srv[s];
        srv.allocated.add(&pod.requests);
        srv.workload_pods.push(p);
        srv.idle_since = None;
        self.checker.bound(s);
        let run = &mut self.pods[p];
        run.state = PodState::Bound { server: s };
        run.bound_at = Some(self.now);
        run.covered_by = None;
        if was_idle {
            // Fresh demand only if no busy node had room: a scheduler that
            // spreads onto an idle spare is not a burst.
            if !self.busy_node_has_room(p, s) {
                self.policy.observe(FirstPod { at_s: self.now, class: self.prep.class_of[s], deadline_s: pod.deadline_s });
            }
            self.request_reconcile(self.now);
        }
        self.set_status(s);
        self.refresh_watts(s);
    }

    /// Whether a Ready node other than `except` that runs workload pods
    /// could also have taken pod `p`.
    fn busy_node_has_room(&self, p: usize, except: usize) -> bool {
        let pod = &self.prep.pods[p];
        self.ready.iter().any(|&s| {
            let srv = &self.srv[s];
            let sim = &self.w.servers[s].server;
            s != except
                && !srv.workload_pods.is_empty()
                && fits_beside(&pod.requests, &srv.allocated, &sim.capacity)
                && check_node_affinity(pod, &srv.labels, &sim.name).is_ok()
                && check_taints(pod, &srv.taints, false).is_ok()
        })
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

    // ---- the autoscaler ----------------------------------------------------

    fn open_batch(&mut self) {
        let now = self.now;
        let close = match &mut self.batch {
            Some((start, last)) => {
                *last = now;
                (*last + self.cfg.batch_idle_s).min(*start + self.cfg.batch_max_s)
            }
            None => {
                self.batch = Some((now, now));
                now + self.cfg.batch_idle_s.min(self.cfg.batch_max_s)
            }
        };
        self.push(close, Event::BatchClose);
    }

    fn batch_close(&mut self) {
        let Some((start, last)) = self.batch else { return };
        let close = (last + self.cfg.batch_idle_s).min(start + self.cfg.batch_max_s);
        if self.now < close {
            return;
        }
        self.batch = None;
        self.provision_now();
    }

    fn uncovered(&self) -> Vec<usize> {
        self.pending
            .iter()
            .map(|k| k.2)
            .filter(|&p| self.pods[p].covered_by.is_none_or(|c| self.srv[self.claims[c].server].claim != Some(c)))
            .collect()
    }

    fn server_for_core(&self, s: usize) -> Server {
        let mut server = self.w.servers[s].server.clone();
        let srv = &self.srv[s];
        server.failures = srv.failures;
        server.health = srv.health;
        server.claim = None;
        server.node = None;
        match srv.state {
            State::Ready => {
                server.power_state = PowerState::On;
                server.node = Some(server.name.clone());
            }
            State::Starting => {
                server.power_state = PowerState::On;
                server.claim = srv.claim.map(|c| format!("c{c}"));
            }
            State::Off | State::Stopping => server.power_state = PowerState::Off,
        }
        server
    }

    /// Builds the snapshot the core decides from. Free powered-off servers
    /// are passed per group of identical ones (hardware class and failure
    /// count), at most as many as there are pods to place: the core can
    /// open no more claims than that, so its decision is the same as with
    /// the whole inventory, and a large idle inventory costs nothing.
    fn snapshot(&self, uncovered: usize) -> Snapshot {
        let mut snap = Snapshot { pools: self.w.pools.clone(), daemonsets: self.w.daemonsets.clone(), ..Default::default() };
        for &s in &self.ready {
            let srv = &self.srv[s];
            let name = &self.w.servers[s].server.name;
            snap.nodes.push(Node {
                name: name.clone(),
                labels: srv.labels.clone(),
                taints: srv.taints.clone(),
                allocatable: self.w.servers[s].server.capacity.clone(),
                unschedulable: false,
                ready: true,
                server: Some(name.clone()),
                disrupting: false,
            });
            for &p in &srv.workload_pods {
                let mut pod = self.prep.pods[p].clone();
                pod.node_name = Some(name.clone());
                pod.phase = PodPhase::Running;
                snap.pods.push(pod);
            }
            for &d in &srv.daemon_pods {
                let mut pod = self.w.daemonsets[d].template.clone();
                pod.name = format!("{}-{}", self.w.daemonsets[d].name, name);
                pod.owner = ds_owner();
                pod.node_name = Some(name.clone());
                pod.phase = PodPhase::Running;
                snap.pods.push(pod);
            }
        }
        for k in &self.pending {
            snap.pods.push(self.prep.pods[k.2].clone());
        }
        let per_group = uncovered.max(1);
        for class in &self.prep.classes {
            let mut free: Vec<usize> = Vec::new();
            for &s in &class.members {
                let srv = &self.srv[s];
                match srv.state {
                    State::Stopping => {}
                    State::Off if srv.health == Health::Healthy => free.push(s),
                    _ => snap.servers.push(self.server_for_core(s)),
                }
            }
            free.sort_by_key(|&s| (self.srv[s].failures, self.cycles[s], s));
            let mut taken_in_group = 0;
            let mut group_failures = None;
            for s in free {
                let f = self.srv[s].failures;
                if group_failures != Some(f) {
                    group_failures = Some(f);
                    taken_in_group = 0;
                }
                if taken_in_group < per_group {
                    snap.servers.push(self.server_for_core(s));
                    taken_in_group += 1;
                }
            }
        }
        for (id, claim) in self.claims.iter().enumerate() {
            if self.srv[claim.server].claim == Some(id) {
                snap.claims.push(ClaimInFlight {
                    name: format!("c{id}"),
                    server: self.w.servers[claim.server].server.name.clone(),
                    pool: self.w.pools[claim.pool].name.clone(),
                    stage: claim.stage,
                    stage_started_s: claim.stage_started_s,
                    pods: Vec::new(),
                });
            }
        }
        snap
    }

    fn provision_now(&mut self) {
        let uncovered = self.uncovered();
        if uncovered.is_empty() {
            return;
        }
        let snap = self.snapshot(uncovered.len());
        self.provision_calls += 1;
        let plan = ironclaim_core::provision(&snap, self.now);
        let epoch = self.world_epoch;
        for &p in &uncovered {
            self.pods[p].attempted_epoch = Some(epoch);
        }
        let pool_index = |name: &str| self.w.pools.iter().position(|p| p.name == name);
        let mut started: Vec<(usize, Vec<usize>, usize)> = Vec::new();
        for c in &plan.claims {
            let (Some(&s), Some(pool)) = (self.prep.server_index.get(&c.server), pool_index(&c.pool)) else {
                continue;
            };
            let pods: Vec<usize> = c.pods.iter().filter_map(|k| self.prep.pod_index.get(k).copied()).collect();
            started.push((s, pods, pool));
        }
        for (s, pods, pool) in started {
            self.start_claim(s, pool, false, &pods);
        }
        for d in &plan.pods {
            let Some(&p) = self.prep.pod_index.get(&d.pod) else { continue };
            match &d.outcome {
                Outcome::InFlight { server, .. } => {
                    if let Some(&s) = self.prep.server_index.get(server) {
                        self.pods[p].covered_by = self.srv[s].claim;
                    }
                }
                Outcome::NewClaim { .. } => {}
                Outcome::Existing { .. } => {
                    self.stale += 1;
                    self.pods[p].last_reason = Some("fits a Ready node: stale accounting".into());
                }
                Outcome::Unschedulable { reason } => self.pods[p].last_reason = Some(reason.to_string()),
            }
        }
    }

    fn reconcile(&mut self) {
        self.in_reconcile = true;
        let powered: Vec<usize> = self.powered.iter().copied().collect();
        let plan = {
            let view = FleetView {
                now_s: self.now,
                servers: &self.w.servers,
                classes: &self.prep.classes,
                class_of: &self.prep.class_of,
                status: &self.status,
                power_on_cycles: &self.cycles,
                powered: &powered,
            };
            self.policy.decide(&view)
        };
        self.checker.declare_floors(&plan.floors);
        for &s in &plan.power_off {
            if self.srv[s].state == State::Ready {
                self.begin_stop(s);
            }
        }
        for &s in &plan.power_on {
            if let Some(pool) = self.srv[s].pool {
                self.start_claim(s, pool, true, &[]);
            }
        }
        if let Some(t) = plan.wake_at_s {
            self.request_reconcile(t);
        }
        let stale = self.pending.iter().any(|k| {
            let run = &self.pods[k.2];
            run.attempted_epoch.is_none_or(|e| e < self.world_epoch)
        });
        if stale && self.batch.is_none() {
            self.provision_now();
        }
        self.check_liveness();
        self.in_reconcile = false;
    }

    fn check_liveness(&mut self) {
        let Some(until) = self.cfg.faults.faults_until_s else { return };
        if self.now < until || self.pending.is_empty() {
            return;
        }
        if self.now < self.last_liveness_check + 60 {
            return;
        }
        self.last_liveness_check = self.now;
        let bound = self.liveness_bound_s;
        let overdue: Vec<usize> =
            self.pending.iter().map(|k| k.2).filter(|&p| self.now.saturating_sub(self.w.pods[p].arrival_s.max(until)) > bound).collect();
        for p in overdue {
            if let Some(host) = self.could_host(p) {
                let waited = self.now - self.w.pods[p].arrival_s.max(until);
                let key = self.prep.pods[p].key();
                self.checker.pending_too_long(self.now, &key, waited, bound, &host);
            }
        }
    }

    /// A server that could host the pod now: a Ready node with room, or a
    /// healthy powered-off server whose NodePool admits the pod.
    fn could_host(&self, p: usize) -> Option<String> {
        let pod = &self.prep.pods[p];
        for (s, srv) in self.srv.iter().enumerate() {
            let sim = &self.w.servers[s].server;
            let fits = match srv.state {
                State::Ready => {
                    pod.requests.fits(&sim.capacity.minus(&srv.allocated))
                        && check_node_affinity(pod, &srv.labels, &sim.name).is_ok()
                        && check_taints(pod, &srv.taints, false).is_ok()
                }
                State::Off if srv.health == Health::Healthy => self.w.pools.iter().any(|pool| {
                    if !pool.admits(sim) {
                        return false;
                    }
                    let mut labels = sim.labels.clone();
                    labels.extend(pool.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
                    labels.insert(NODEPOOL_LABEL.to_string(), pool.name.clone());
                    pod.requests.fits(&sim.capacity)
                        && check_node_affinity(pod, &labels, &sim.name).is_ok()
                        && check_taints(pod, &pool.taints, false).is_ok()
                }),
                _ => false,
            };
            if fits {
                return Some(sim.name.clone());
            }
        }
        None
    }

    fn finish(self) -> RunStats {
        let end = self.end;
        let mut pending_s = Vec::new();
        let (mut placed, mut withdrawn, mut at_end, mut misses) = (0, 0, 0, 0);
        let mut waiting: BTreeMap<String, u64> = BTreeMap::new();
        for (p, run) in self.pods.iter().enumerate() {
            let tp = &self.w.pods[p];
            if tp.arrival_s > end || self.prep.unplaceable[p].is_some() {
                continue;
            }
            let waited = match (run.state, run.bound_at, run.withdrawn_at) {
                (PodState::Bound { .. }, Some(b), _) => {
                    placed += 1;
                    b - tp.arrival_s
                }
                (PodState::Done, Some(b), _) => {
                    placed += 1;
                    b - tp.arrival_s
                }
                (_, _, Some(w)) => {
                    withdrawn += 1;
                    w - tp.arrival_s
                }
                _ => {
                    at_end += 1;
                    let reason = run.last_reason.clone().unwrap_or_else(|| "waiting for a claim in flight".into());
                    *waiting.entry(reason).or_insert(0) += 1;
                    end - tp.arrival_s
                }
            };
            if self.prep.pods[p].deadline_s.is_some_and(|d| waited > d) {
                misses += 1;
            }
            pending_s.push(waited);
        }
        let mut waiting_reasons: Vec<(String, u64)> = waiting.into_iter().collect();
        waiting_reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        waiting_reasons.truncate(10);
        let claims_in_flight_at_end = self.srv.iter().filter(|s| s.claim.is_some()).count() as u64;
        let failures = self.failures.iter().map(|(&(rank, reason), &count)| FailureCount { stage: STAGES[rank as usize].1, reason, count }).collect();
        RunStats {
            policy: self.policy.kind(),
            scoring: self.cfg.scoring,
            energy_kwh: self.energy_j / 3.6e6,
            dynamic_kwh: self.dynamic_j / 3.6e6,
            powered_mean: if end > 0 { self.powered_area / end as f64 } else { self.powered.len() as f64 },
            powered_peak: self.peak_powered.max(self.powered.len()),
            pending_s,
            pods_placed: placed,
            pods_withdrawn: withdrawn,
            pods_pending_at_end: at_end,
            deadline_misses: misses,
            power_on_cycles: self.cycles.clone(),
            claims_for_pods: self.claims_for_pods,
            claims_spare: self.claims_spare,
            claims_ready: self.claims_ready,
            claims_in_flight_at_end,
            cold_to_ready_s: self.cold_to_ready,
            failures,
            stale_accounting: self.stale,
            provision_calls: self.provision_calls,
            waiting_reasons,
            violations: self.checker.violations,
            timeline: self.timeline,
            quarantined: self.srv.iter().filter(|s| s.health == Health::Quarantined).count() as u64,
            failed_claims: self.failed_claims,
        }
    }
}

/// Runs one policy over a prepared workload.
pub fn run_policy(w: &Workload, prep: &Prepared, cfg: &SimConfig, kind: PolicyKind, progress: &mut dyn FnMut(f64)) -> RunStats {
    let policy = kind.build(&cfg.policy);
    Engine::new(w, prep, cfg, policy).run(progress)
}
