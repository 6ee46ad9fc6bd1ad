//! Scale-down: the core decides ([`ironclaim_core::disruption::disrupt`]),
//! this module carries it out.
//!
//! Each pass takes the controller's snapshot, stamps how long each server
//! has idled, marks what is already in progress, asks the core, and runs
//! each new action as its own task: drains ([`drain`]), warm-spare power
//! on and off ([`power`]). Stranded resources ([`stranded`]) are found and
//! repaired in the same pass, and the energy saved is metered ([`energy`]).
//!
//! # Guarantees
//! - One action per node or server at a time; what is in flight counts
//!   against budgets and floors in the next decision.
//! - Passes run only while this replica leads.
//! - A node carrying the disrupting taint that no task of this process is
//!   draining (a drain cut short by a restart) is uncordoned, and the core
//!   decides about it afresh.
//! - Idle time is recorded on the Server (`status.idleSince`) when it
//!   starts and cleared when the server is busy again ([`idle`]): a
//!   restarted controller carries on from it.
//! - A drain that evicts workload starts only when a pass at least
//!   [`ScaleDownSettings::revalidate_after`] after the first proposal
//!   proposes it again; a node whose drain was abandoned is not drained
//!   again for [`ScaleDownSettings::drain_cool_down`] ([`pacing`]).
//! - A server in maintenance never counts as idle: its node is the
//!   operator's, and is not powered off for idling.

pub mod drain;
pub mod energy;
pub mod idle;
pub mod notes;
pub mod pacing;
pub mod power;
pub mod stranded;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use ironclaim_core::disruption::{Action, disrupt};
use ironclaim_core::model::{PowerState, Seconds, Snapshot};
use ironclaim_k8s::api::nodeclaim::Stage;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;

use crate::claims::Claims;
use crate::index::{FailureBackoff, Index};
use crate::metrics::Metrics;
use drain::{DrainRequest, DrainSettings, Drainer};
use energy::{EnergyMeter, ScaleDownMetrics, fleet_summary};
use idle::IdleClock;
use notes::{Kind, Notes};
use pacing::Settling;
use stranded::Finding;

pub use energy::{FleetSummary, fleet_summary as summary};

/// Knobs of scale-down.
#[derive(Clone, Debug)]
pub struct ScaleDownSettings {
    /// How often the core is asked.
    pub every: Duration,
    pub drain: DrainSettings,
    /// How long a stranded resource persists before it is repaired.
    pub stranded_grace: Duration,
    /// A drain that evicts workload starts only when a pass at least this
    /// long after its first proposal proposes it again.
    pub revalidate_after: Duration,
    /// A node whose drain was abandoned is not drained again for this long.
    pub drain_cool_down: Duration,
    pub publish_events: bool,
}

impl Default for ScaleDownSettings {
    fn default() -> Self {
        ScaleDownSettings {
            every: Duration::from_secs(2),
            drain: DrainSettings::default(),
            stranded_grace: Duration::from_secs(300),
            revalidate_after: Duration::from_secs(15),
            drain_cool_down: Duration::from_secs(600),
            publish_events: true,
        }
    }
}

#[derive(Default)]
struct State {
    /// Since when each server has idled, kept on its status too.
    idle: IdleClock,
    /// Drains of busy nodes waiting to be proposed again.
    settling: Settling,
    /// Running actions by node or server name.
    tasks: HashMap<String, (Work, JoinHandle<()>)>,
    meter: EnergyMeter,
    /// Since when each stranded finding has been seen, by key.
    stranded_since: HashMap<String, Seconds>,
}

#[derive(Clone, Debug, PartialEq)]
enum Work {
    Drain { server: Option<String> },
    PowerOff,
    PowerOn,
    Repair,
}

/// The scale-down executor. Share it in an `Arc`.
pub struct ScaleDown {
    index: Arc<Mutex<Index>>,
    metrics: Arc<Metrics>,
    backoff: FailureBackoff,
    settings: ScaleDownSettings,
    drainer: Drainer,
    state: Mutex<State>,
}

/// Stops the scale-down loop and its tasks when dropped.
pub struct Running {
    scaledown: Arc<ScaleDown>,
    task: JoinHandle<()>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
        self.scaledown.abort_all();
    }
}

fn now_s() -> Seconds {
    jiff::Timestamp::now().as_second().max(0) as Seconds
}

impl ScaleDown {
    /// Builds the executor on the controller's index, claims (for the power
    /// provider and server release) and metrics.
    pub fn new(
        client: Client,
        index: Arc<Mutex<Index>>,
        claims: Arc<Claims>,
        metrics: Arc<Metrics>,
        backoff: FailureBackoff,
        instance: &str,
        settings: ScaleDownSettings,
    ) -> Self {
        let notes = if settings.publish_events { Notes::new(client.clone(), "ironclaim", instance) } else { Notes::disabled() };
        let drainer = Drainer { client, power: claims.power(), claims, notes, metrics: metrics.scaledown.clone(), settings: settings.drain.clone() };
        ScaleDown { index, metrics, backoff, settings, drainer, state: Mutex::default() }
    }

    fn metrics(&self) -> &ScaleDownMetrics {
        &self.metrics.scaledown
    }

    /// Runs a pass every [`ScaleDownSettings::every`] while this replica
    /// may act (the claims' leader [`Gate`](crate::leader::Gate) is open),
    /// until the returned handle is dropped. A pass, and every drain it
    /// started, is cut short the moment the gate shuts.
    pub fn spawn(self: Arc<Self>) -> Running {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let gate = this.drainer.claims.gate().clone();
            loop {
                tokio::time::sleep(this.settings.every).await;
                if !gate.acting() {
                    this.abort_all();
                    this.forget();
                    continue;
                }
                tokio::select! {
                    _ = this.reconcile(now_s()) => {}
                    _ = gate.lost() => {}
                }
                if !gate.acting() {
                    this.abort_all();
                }
            }
        });
        Running { scaledown: self, task }
    }

    /// Drops what this process believed while it acted: whoever acts next
    /// starts from what is recorded on the API.
    fn forget(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.idle.forget();
        state.settling.forget();
    }

    fn abort_all(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, (_, handle)) in state.tasks.drain() {
            handle.abort();
        }
    }

    /// One pass: decide, start new actions, repair stranded resources,
    /// meter energy. Idempotent: an action already running is not started
    /// again.
    pub async fn reconcile(&self, now: Seconds) {
        let cool_down_s = self.settings.drain_cool_down.as_secs();
        let (mut snapshot, tainted, findings, not_serving, recorded, cooling, unknown_power) = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            let (snapshot, _) = index.snapshot(now, self.backoff);
            let tainted: Vec<String> = index
                .nodes
                .values()
                .filter(|n| {
                    n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == ironclaim_core::DISRUPTING_TAINT))
                })
                .map(ResourceExt::name_any)
                .collect();
            let not_serving: BTreeSet<String> = index
                .claims
                .values()
                .filter(|c| c.status.as_ref().is_none_or(|s| s.failure_reason.is_none() && s.stage != Some(Stage::Serving)))
                .map(|c| c.spec.server.clone())
                .collect();
            let cooling = pacing::cooling(
                index.nodes.iter().filter_map(|(name, n)| Some((name.as_str(), n.annotations().get(drain::DRAIN_ABANDONED_ANNOTATION)?.as_str()))),
                now,
                cool_down_s,
            );
            let unknown_power: BTreeSet<String> = index
                .servers
                .iter()
                .filter(|(_, s)| s.status.as_ref().and_then(|s| s.power_state).is_none_or(|p| p == ironclaim_k8s::api::server::PowerState::Unknown))
                .map(|(name, _)| name.clone())
                .collect();
            (snapshot, tainted, stranded::find(&index), not_serving, recorded_idle(&index), cooling, unknown_power)
        };
        let (running, writes) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.tasks.retain(|_, (_, h)| !h.is_finished());
            let not_serving: BTreeSet<&str> = not_serving.iter().map(String::as_str).collect();
            let writes = idle::stamp(&mut state.idle, &mut snapshot, &not_serving, |s| recorded.get(s).copied().unwrap_or_default(), now);
            (state.tasks.iter().map(|(k, (w, _))| (k.clone(), w.clone())).collect::<HashMap<String, Work>>(), writes)
        };
        self.record_idle(writes).await;
        mark_in_flight(&mut snapshot, &running);

        for node in tainted.iter().filter(|n| !running.contains_key(*n)) {
            // A drain this process does not own: cut short by a restart.
            let (drainer, node) = (self.drainer.clone(), node.clone());
            self.start(node.clone(), Work::Repair, async move {
                if let Err(err) = drainer.uncordon(&node).await {
                    tracing::warn!(%node, error = %err, "uncordoning an orphaned drain failed");
                } else {
                    drainer.notes.normal(Kind::Node, &node, "DrainAbandoned", "a drain cut short by a restart: uncordoned").await;
                }
            });
        }

        let mut decided = snapshot.clone();
        pacing::hold_cooling(&mut decided, &cooling);
        let mut plan = disrupt(&decided, now);
        pacing::drop_cooling(&mut plan.actions, &mut plan.held, &cooling, now);
        let (go, waiting) = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            state.settling.settle(plan.actions, now, self.settings.revalidate_after.as_secs())
        };
        for action in go {
            self.act(action, &snapshot, &running);
        }
        for held in &plan.held {
            let kind = if snapshot.nodes.iter().any(|n| n.name == held.subject) { Kind::Node } else { Kind::Server };
            self.drainer.notes.normal(kind, &held.subject, "ScaleDownHeld", &held.why).await;
        }
        let settle_s = self.settings.revalidate_after.as_secs();
        for w in &waiting {
            let note = format!("proposed for consolidation; drained only if still proposed {settle_s}s later");
            self.drainer.notes.normal(Kind::Node, &w.node, "ConsolidationProposed", &note).await;
        }
        self.repair(findings, &running, &cooling, now).await;

        // A server whose power state is unknown is neither off nor a spare.
        snapshot.servers.retain(|s| !unknown_power.contains(&s.name));
        let summary = fleet_summary(&snapshot);
        self.state.lock().unwrap_or_else(PoisonError::into_inner).meter.observe(now, &summary, self.metrics());
    }

    /// Writes `status.idleSince` where it changed. A failed write is
    /// retried on the next pass.
    async fn record_idle(&self, writes: Vec<idle::Write>) {
        let api: Api<ironclaim_k8s::api::Server> = Api::all(self.drainer.client.clone());
        let sends = writes.into_iter().map(|w| {
            let api = api.clone();
            async move {
                let value = w
                    .idle_since
                    .map(|s| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::from_second(s as i64).unwrap_or_default()));
                let patch = serde_json::json!({"status": {"idleSince": value}});
                match api.patch_status(&w.server, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => None,
                    Err(kube::Error::Api(s)) if s.code == 404 => None,
                    Err(err) => {
                        tracing::warn!(server = %w.server, error = %err, "recording the idle time failed; retrying next pass");
                        Some(w.server)
                    }
                }
            }
        });
        let failed: Vec<Option<String>> = futures::stream::iter(sends).buffer_unordered(8).collect().await;
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for server in failed.into_iter().flatten() {
            state.idle.failed(&server);
        }
    }

    fn start(&self, key: String, work: Work, job: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = self.drainer.claims.gate().clone();
        if state.tasks.contains_key(&key) || !gate.acting() {
            return;
        }
        // A drain or power action stops the moment this replica stops leading.
        let job = async move {
            tokio::select! {
                _ = job => {}
                _ = gate.lost() => {}
            }
        };
        state.tasks.insert(key, (work, tokio::spawn(job)));
    }

    fn act(&self, action: Action, snapshot: &Snapshot, running: &HashMap<String, Work>) {
        let drainer = self.drainer.clone();
        let metrics = self.metrics().clone();
        match action {
            Action::PowerOff { server, class, idle_s, break_even_s, saves_watts } => {
                if running.contains_key(&server) {
                    return;
                }
                let note = format!("idle {idle_s}s, past its {break_even_s}s break-even; class {class} keeps its floor; saves {saves_watts:.0} W");
                let name = server.clone();
                self.start(server, Work::PowerOff, async move {
                    match power::power_off_spare(&drainer, &name, &note).await {
                        Ok(true) => metrics.action("power_off", "idle", "done"),
                        Ok(false) => metrics.action("power_off", "idle", "claimed"),
                        Err(err) => {
                            metrics.action("power_off", "idle", err.metric_label());
                            tracing::warn!(server = %name, error = %err, "powering off a spare failed");
                        }
                    }
                });
            }
            Action::PowerOn { server, class, floor, on } => {
                if running.contains_key(&server) {
                    return;
                }
                let note = format!("warm floor of {class} is {floor}, {on} on");
                let name = server.clone();
                self.start(server, Work::PowerOn, async move {
                    match power::power_on_spare(&drainer, &name, &note).await {
                        Ok(true) => metrics.action("power_on", "warm_floor", "done"),
                        Ok(false) => metrics.action("power_on", "warm_floor", "claimed"),
                        Err(err) => {
                            metrics.action("power_on", "warm_floor", err.metric_label());
                            tracing::warn!(server = %name, error = %err, "powering on a spare failed");
                        }
                    }
                });
            }
            Action::PowerOnForHeadroom { server, pool, short } => {
                if running.contains_key(&server) {
                    return;
                }
                let note = format!("NodePool {pool} is short of its headroom by {short}");
                let name = server.clone();
                self.start(server, Work::PowerOn, async move {
                    match power::power_on_spare(&drainer, &name, &note).await {
                        Ok(true) => metrics.action("power_on", "headroom", "done"),
                        Ok(false) => metrics.action("power_on", "headroom", "claimed"),
                        Err(err) => {
                            metrics.action("power_on", "headroom", err.metric_label());
                            tracing::warn!(server = %name, error = %err, "powering on a spare for headroom failed");
                        }
                    }
                });
            }
            Action::PowerOnForReplacement { server, pool, replaces, watts_saved } => {
                if running.contains_key(&server) {
                    return;
                }
                // Powered on like a spare; once it is a Ready node the core's
                // underutilized consolidation drains the replaced nodes onto it.
                let note = format!("NodePool {pool}: to take over {} (saves {watts_saved:.0} W)", replaces.join(", "));
                let name = server.clone();
                self.start(server, Work::PowerOn, async move {
                    match power::power_on_spare(&drainer, &name, &note).await {
                        Ok(true) => metrics.action("power_on", "replacement", "done"),
                        Ok(false) => metrics.action("power_on", "replacement", "claimed"),
                        Err(err) => {
                            metrics.action("power_on", "replacement", err.metric_label());
                            tracing::warn!(server = %name, error = %err, "powering on a replacement failed");
                        }
                    }
                });
            }
            Action::Drain { node, server, pool, reason, evict, .. } => {
                if running.contains_key(&node) || server.as_ref().is_some_and(|s| running.contains_key(s)) {
                    return;
                }
                let timeout = snapshot
                    .pools
                    .iter()
                    .find(|p| p.name == pool)
                    .and_then(|p| p.disruption.drain_timeout_s)
                    .map_or(self.settings.drain.default_timeout, Duration::from_secs);
                let reason = format!("{reason:?}").to_lowercase();
                let request = DrainRequest {
                    node: node.clone(),
                    server: server.clone(),
                    reason: reason.clone(),
                    planned: evict.into_iter().collect(),
                    timeout,
                    power_off: true,
                };
                self.start(node, Work::Drain { server }, async move {
                    if let Err(err) = drainer.drain(&request).await {
                        metrics.action("drain", &reason, err.metric_label());
                        tracing::warn!(node = %request.node, error = %err, "drain failed");
                    }
                });
            }
        }
    }

    /// Reports each stranded resource, and repairs it once it has lasted
    /// the grace period when repair is safe.
    async fn repair(&self, findings: Vec<Finding>, running: &HashMap<String, Work>, cooling: &BTreeMap<String, Seconds>, now: Seconds) {
        let grace = self.settings.stranded_grace.as_secs();
        let due: Vec<Finding> = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let keys: BTreeSet<String> = findings.iter().map(Finding::key).collect();
            state.stranded_since.retain(|k, _| keys.contains(k));
            findings.into_iter().filter(|f| now.saturating_sub(*state.stranded_since.entry(f.key()).or_insert(now)) >= grace).collect()
        };
        self.metrics().stranded.clear();
        for f in &due {
            self.metrics().stranded.get_or_create(&vec![("kind".into(), f.metric_label().into())]).inc();
        }
        let notes = &self.drainer.notes;
        for f in due {
            match f {
                Finding::ServerOnUnused { server, maintenance: true } => {
                    notes.warn(Kind::Server, &server, "Stranded", "powered on with no claim or node; left on: it is in maintenance").await;
                }
                Finding::ServerOnUnused { server, maintenance: false } => {
                    if running.contains_key(&server) {
                        continue;
                    }
                    let drainer = self.drainer.clone();
                    let name = server.clone();
                    self.start(server, Work::Repair, async move {
                        let note = "quarantined, powered on with no claim or node: powered off";
                        match drainer.power_off_and_release(&name, None).await {
                            Ok(()) => drainer.notes.warn(Kind::Server, &name, "Stranded", note).await,
                            Err(err) => tracing::warn!(server = %name, error = %err, "powering off a stranded server failed"),
                        }
                    });
                }
                Finding::NodeWithoutServer { node, server, workload_pods } => {
                    if workload_pods > 0 {
                        let note = format!("its server {server} is gone from the inventory; left alone: it runs {workload_pods} pod(s)");
                        notes.warn(Kind::Node, &node, "Stranded", &note).await;
                        continue;
                    }
                    match Api::<k8s_openapi::api::core::v1::Node>::all(self.drainer.client.clone()).delete(&node, &DeleteParams::default()).await {
                        Ok(_) | Err(kube::Error::Api(_)) => {
                            let note = format!("its server {server} is gone from the inventory and it runs no pod: deleted");
                            notes.warn(Kind::Node, &node, "Stranded", &note).await;
                        }
                        Err(err) => tracing::warn!(%node, error = %err, "deleting a stranded node failed"),
                    }
                }
                Finding::ClaimOnMaintenance { claim, server, node } => {
                    let Some(node) = node else {
                        let note = format!("claim {claim} holds it but it is in maintenance; left to the claim, which cannot power it on");
                        notes.warn(Kind::Server, &server, "Stranded", &note).await;
                        continue;
                    };
                    if running.contains_key(&node) {
                        continue;
                    }
                    if let Some(until) = cooling.get(&node) {
                        let note = format!(
                            "in maintenance under claim {claim}; the drain of node {node} was abandoned, retried in {}s",
                            until.saturating_sub(now)
                        );
                        notes.warn(Kind::Server, &server, "Stranded", &note).await;
                        continue;
                    }
                    let request = DrainRequest {
                        node: node.clone(),
                        server: Some(server.clone()),
                        reason: "maintenance".into(),
                        planned: BTreeSet::new(),
                        timeout: self.settings.drain.default_timeout,
                        power_off: false,
                    };
                    let drainer = self.drainer.clone();
                    notes.warn(Kind::Server, &server, "Stranded", &format!("in maintenance under claim {claim}: draining node {node}")).await;
                    self.start(node, Work::Drain { server: Some(server) }, async move {
                        if let Err(err) = drainer.drain(&request).await {
                            tracing::warn!(node = %request.node, error = %err, "maintenance drain failed");
                        }
                    });
                }
            }
        }
    }
}

/// What is in flight counts in the decision: nodes being drained are
/// disrupting, servers being powered on or off are in their new state.
fn mark_in_flight(snapshot: &mut Snapshot, running: &HashMap<String, Work>) {
    let draining_servers: BTreeSet<&str> =
        running.values().filter_map(|w| if let Work::Drain { server } = w { server.as_deref() } else { None }).collect();
    for n in snapshot.nodes.iter_mut() {
        if running.contains_key(&n.name) || n.server.as_deref().is_some_and(|s| draining_servers.contains(s)) {
            n.disrupting = true;
        }
    }
    for s in snapshot.servers.iter_mut() {
        match running.get(&s.name) {
            Some(Work::PowerOn) => s.power_state = PowerState::On,
            Some(Work::PowerOff) => s.power_state = PowerState::Off,
            _ => {}
        }
    }
}

/// For each server: its recorded `status.idleSince`, and the latest known
/// start of business (its claim written, its node registered), in seconds.
fn recorded_idle(index: &crate::index::Index) -> HashMap<String, (Option<Seconds>, Option<Seconds>)> {
    let secs = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_second().max(0) as Seconds;
    index
        .servers
        .iter()
        .map(|(name, server)| {
            let status = server.status.as_ref();
            let recorded = status.and_then(|s| s.idle_since.as_ref()).map(secs);
            let claimed = status.and_then(|s| s.claimed_at.as_ref()).map(secs);
            let registered = index.node_of_server(name).and_then(|n| n.metadata.creation_timestamp.as_ref()).map(secs);
            (name.clone(), (recorded, claimed.max(registered)))
        })
        .collect()
}
