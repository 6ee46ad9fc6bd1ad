//! Scale-down: the driver's [`Autoscaler`](ironclaim_driver::Autoscaler)
//! decides and paces it (the core's [`disrupt`](ironclaim_core::disruption::disrupt),
//! idle clocks, re-validation, cool-downs, drains from cordon to power-off),
//! and the controller's [`Executor`](crate::executor::Executor) carries out
//! its effects. This module keeps what the driver has no part in:
//!
//! - stranded resources ([`stranded`]), found and repaired once they have
//!   lasted a grace period; a claim on a server in maintenance is repaired
//!   by a drain the driver runs ([`MaintenanceDrain`]);
//! - the energy saved, metered ([`energy`]);
//! - the node operations and the Eviction API call ([`drain`]) the
//!   executor uses.
//!
//! # Guarantees
//! - Passes run only while this replica leads.
//! - A server in maintenance never counts as idle (the driver's rule): its
//!   node is the operator's, and is not powered off for idling.

pub mod drain;
pub mod energy;
pub mod notes;
pub mod pacing;
pub mod parking;
pub mod stranded;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironclaim_core::model::Seconds;
use kube::api::DeleteParams;
use kube::{Api, Client};
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinHandle;

use crate::claims::Claims;
use crate::index::{FailureBackoff, Index};
use crate::metrics::Metrics;
use drain::{DrainSettings, Drainer};
use energy::{EnergyMeter, ScaleDownMetrics, fleet_summary};
use notes::{Kind, Notes};
use stranded::Finding;

pub use energy::{FleetSummary, fleet_summary as summary};

/// Knobs of scale-down.
#[derive(Clone, Debug)]
pub struct ScaleDownSettings {
    /// How often the driver's scale-down pass runs, and this module's.
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
    /// Repair stranded servers, nodes and claims (off under `--dry-run`).
    pub repair: bool,
}

impl Default for ScaleDownSettings {
    fn default() -> Self {
        ScaleDownSettings {
            every: Duration::from_secs(2),
            drain: DrainSettings::default(),
            stranded_grace: Duration::from_secs(300),
            revalidate_after: Duration::from_secs(15),
            drain_cool_down: Duration::from_secs(600),
            repair: true,
            publish_events: true,
        }
    }
}

impl ScaleDownSettings {
    /// The driver's scale-down settings of these.
    pub fn driver(&self) -> ironclaim_driver::ScaleDownSettings {
        ironclaim_driver::ScaleDownSettings {
            every: self.every,
            revalidate_after: self.revalidate_after,
            cool_down: self.drain_cool_down,
            drain: ironclaim_driver::drain::DrainSettings {
                retry_initial: self.drain.retry_initial,
                retry_max: self.drain.retry_max,
                default_timeout: self.drain.default_timeout,
            },
            quiet_max: None,
        }
    }
}

/// A drain of the node of a claim whose server is in maintenance, for the
/// driver to run ([`ironclaim_driver::Autoscaler::drain_for_maintenance`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MaintenanceDrain {
    pub node: String,
    pub server: String,
    pub timeout: Duration,
}

#[derive(Default)]
struct State {
    /// Repairs running, by server name.
    tasks: HashMap<String, JoinHandle<()>>,
    meter: EnergyMeter,
    /// Since when each stranded finding has been seen, by key.
    stranded_since: HashMap<String, Seconds>,
    /// Nodes whose maintenance drain was asked for and told.
    asked: BTreeSet<String>,
}

/// Stranded-resource repair and the energy meter. Share it in an `Arc`.
pub struct ScaleDown {
    index: Arc<Mutex<Index>>,
    metrics: Arc<Metrics>,
    backoff: FailureBackoff,
    settings: ScaleDownSettings,
    drainer: Drainer,
    maintenance: UnboundedSender<MaintenanceDrain>,
    state: Mutex<State>,
}

/// Stops the loop and its repairs when dropped.
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
    /// Builds it on the controller's index, claims (for the power provider
    /// and server release) and metrics, telling by `notes`; maintenance
    /// drains are asked for on `maintenance`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        index: Arc<Mutex<Index>>,
        claims: Arc<Claims>,
        metrics: Arc<Metrics>,
        backoff: FailureBackoff,
        notes: Notes,
        settings: ScaleDownSettings,
        maintenance: UnboundedSender<MaintenanceDrain>,
    ) -> Self {
        let drainer = Drainer { client, power: claims.power(), claims, notes, metrics: metrics.scaledown.clone(), settings: settings.drain.clone() };
        ScaleDown { index, metrics, backoff, settings, drainer, maintenance, state: Mutex::default() }
    }

    fn metrics(&self) -> &ScaleDownMetrics {
        &self.metrics.scaledown
    }

    /// Runs a pass every [`ScaleDownSettings::every`] while this replica
    /// may act (the claims' leader [`Gate`](crate::leader::Gate) is open),
    /// until the returned handle is dropped. A pass, and every repair it
    /// started, is cut short the moment the gate shuts.
    pub fn spawn(self: Arc<Self>) -> Running {
        let this = self.clone();
        let task = tokio::spawn(async move {
            let gate = this.drainer.claims.gate().clone();
            loop {
                tokio::time::sleep(this.settings.every).await;
                if !gate.acting() {
                    this.abort_all();
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

    fn abort_all(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        for (_, handle) in state.tasks.drain() {
            handle.abort();
        }
        state.asked.clear();
    }

    /// One pass: repair stranded resources, meter energy. Idempotent: a
    /// repair already running is not started again.
    pub async fn reconcile(&self, now: Seconds) {
        let cool_down_s = self.settings.drain_cool_down.as_secs();
        let (mut snapshot, findings, cooling, unknown_power, back) = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            let (snapshot, _) = index.snapshot(now, self.backoff);
            let cooling = pacing::cooling(
                index.nodes.iter().filter_map(|(name, n)| {
                    Some((name.as_str(), kube::ResourceExt::annotations(&**n).get(drain::DRAIN_ABANDONED_ANNOTATION)?.as_str()))
                }),
                now,
                cool_down_s,
            );
            let unknown_power: BTreeSet<String> = index
                .servers
                .iter()
                .filter(|(_, s)| s.status.as_ref().and_then(|s| s.power_state).is_none_or(|p| p == ironclaim_k8s::api::server::PowerState::Unknown))
                .map(|(name, _)| name.clone())
                .collect();
            (snapshot, stranded::find(&index), cooling, unknown_power, (parking::back(&index.nodes), parking::unfinished(&index.nodes)))
        };
        self.state.lock().unwrap_or_else(PoisonError::into_inner).tasks.retain(|_, h| !h.is_finished());
        let (back, unfinished) = back;
        for node in unfinished {
            let drainer = self.drainer.clone();
            self.start(format!("park/{node}"), async move {
                if let Err(err) = parking::finish(&drainer.client, &node, None).await {
                    tracing::warn!(%node, error = %err, "finishing a parked node failed; tried again next pass");
                }
            });
        }
        for node in back {
            let drainer = self.drainer.clone();
            self.start(format!("unpark/{node}"), async move {
                match parking::unpark(&drainer.client, &node).await {
                    Ok(()) => drainer.notes.normal(Kind::Node, &node, "Unparked", "its server booted again: no longer parked, schedulable").await,
                    Err(err) => {
                        tracing::warn!(%node, error = %err, "bringing a parked node back failed; tried again next pass");
                        drainer.claims.metrics().error(err.metric_label());
                    }
                }
            });
        }
        if self.settings.repair {
            self.repair(findings, &cooling, now).await;
        }

        // A server whose power state is unknown is neither off nor a spare.
        snapshot.servers.retain(|s| !unknown_power.contains(&s.name));
        let summary = fleet_summary(&snapshot);
        self.state.lock().unwrap_or_else(PoisonError::into_inner).meter.observe(now, &summary, self.metrics());
    }

    fn start(&self, key: String, job: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let gate = self.drainer.claims.gate().clone();
        if state.tasks.contains_key(&key) || !gate.acting() {
            return;
        }
        // A power action stops the moment this replica stops leading.
        let job = async move {
            tokio::select! {
                _ = job => {}
                _ = gate.lost() => {}
            }
        };
        state.tasks.insert(key, tokio::spawn(job));
    }

    /// Reports each stranded resource, and repairs it once it has lasted
    /// the grace period when repair is safe.
    async fn repair(&self, findings: Vec<Finding>, cooling: &BTreeMap<String, Seconds>, now: Seconds) {
        let grace = self.settings.stranded_grace.as_secs();
        let due: Vec<Finding> = {
            let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            let keys: BTreeSet<String> = findings.iter().map(Finding::key).collect();
            state.stranded_since.retain(|k, _| keys.contains(k));
            let nodes: BTreeSet<&str> =
                findings.iter().filter_map(|f| if let Finding::ClaimOnMaintenance { node, .. } = f { node.as_deref() } else { None }).collect();
            state.asked.retain(|n| nodes.contains(n.as_str()));
            findings.into_iter().filter(|f| now.saturating_sub(*state.stranded_since.entry(f.key()).or_insert(now)) >= grace).collect()
        };
        self.metrics().set_stranded(due.iter().map(Finding::metric_label));
        let notes = &self.drainer.notes;
        for f in due {
            match f {
                Finding::ServerOnUnused { server, maintenance: true } => {
                    notes.warn(Kind::Server, &server, "Stranded", "powered on with no claim or node; left on: it is in maintenance").await;
                }
                Finding::ServerOnUnused { server, maintenance: false } => {
                    let drainer = self.drainer.clone();
                    let name = server.clone();
                    self.start(server, async move {
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
                    if let Some(until) = cooling.get(&node) {
                        let note = format!(
                            "in maintenance under claim {claim}; the drain of node {node} was abandoned, retried in {}s",
                            until.saturating_sub(now)
                        );
                        notes.warn(Kind::Server, &server, "Stranded", &note).await;
                        continue;
                    }
                    let first = self.state.lock().unwrap_or_else(PoisonError::into_inner).asked.insert(node.clone());
                    if first {
                        notes.warn(Kind::Server, &server, "Stranded", &format!("in maintenance under claim {claim}: draining node {node}")).await;
                    }
                    // Asked every pass until its claim is gone: the driver
                    // starts one drain per node and ignores the rest.
                    let _ = self.maintenance.send(MaintenanceDrain { node, server, timeout: self.settings.drain.default_timeout });
                }
            }
        }
    }
}
