//! Executing claims: opening them, claiming servers atomically, powering
//! them on, and walking each claim through its stages until its pods are
//! bound, or it fails and its server is released.
//!
//! # Restart safety
//! Every step is written to the API before the action it announces. The
//! server's claim lock (an entry in the lock ledger, see [`crate::locks`])
//! is taken before the power-on is sent; that write, shared by the claims
//! opened with it, is all a power-on waits for. The claim is then written
//! to the Server (its name, `claimedAt`, power state `PoweringOn`) and the
//! NodeClaim follows (with its `Selected` and `PoweringOn` stages) while
//! the power-on is under way. A restarted controller reads where each claim
//! stands and asks the BMC before acting: a server already on is not
//! powered on again, and a power-on sent less than the server's power-on
//! budget ago is waited for, not repeated. A server whose claim is gone,
//! and was claimed longer ago than the opening grace, is powered off and
//! released; so is a server whose lock names a claim the Server never
//! recorded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironclaim_core::model::{Seconds, StageDurations};
use ironclaim_core::outcome::NewClaim;
use ironclaim_k8s::api::nodeclaim::{FailureReason, NodeClaimSpec, NodeClaimStatus, PodReference, Stage};
use ironclaim_k8s::api::server::{PowerState, ServerStatus};
use ironclaim_k8s::api::{NodeClaim, NodePool, Server};
use ironclaim_k8s::node::SERVER_LABEL;
use ironclaim_k8s::server_to_core;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::{Error, Result};
use crate::events::Events;
use crate::gates;
use crate::index::CLAIM_FAILED_CONDITION;
use crate::leader::{FencedPower, Gate};
use crate::locks::{Lock, Locks, Taken};
use crate::metrics::Metrics;
use crate::provider::{Power, PowerError};
use crate::timeline::{self, Deadlines, Ended};

/// The label on a NodeClaim naming its NodePool.
pub const NODEPOOL_LABEL: &str = ironclaim_core::provision::NODEPOOL_LABEL;
/// The condition on a NodeClaim that carries the last power error.
pub const POWERED_ON_CONDITION: &str = "PoweredOn";
/// The condition on a NodeClaim that says which gates are still unmet.
pub const GATES_CONDITION: &str = "GatesPassed";

/// How power actions are retried: the driver's rule.
pub use ironclaim_driver::backoff::Retry;

/// Knobs of the claim executor.
#[derive(Clone, Debug)]
pub struct ClaimSettings {
    pub deadlines: Deadlines,
    pub retry: Retry,
    /// A server is quarantined after this many failed claims in a row.
    pub quarantine_after: u32,
    /// Failed claims are kept this long as a record, then deleted.
    pub failed_claim_ttl: Duration,
    /// How long a server's claim may wait for its NodeClaim before the
    /// server counts as orphaned. The NodeClaim is written right after the
    /// power-on, so anything longer means the controller that opened it is
    /// gone.
    pub opening_grace: Duration,
    /// Where the claim lock ledger (a ConfigMap) lives: the controller's
    /// own namespace.
    pub lock_namespace: String,
}

impl Default for ClaimSettings {
    fn default() -> Self {
        ClaimSettings {
            deadlines: Deadlines::default(),
            retry: Retry::default(),
            quarantine_after: 3,
            failed_claim_ttl: Duration::from_secs(3600),
            opening_grace: Duration::from_secs(60),
            lock_namespace: "ironclaim-system".into(),
        }
    }
}

/// Everything one claim's reconcile reads, copied out of the index.
#[derive(Clone, Debug)]
pub struct ClaimView {
    pub claim: NodeClaim,
    pub server: Option<Server>,
    pub node: Option<Node>,
    pub pool: Option<NodePool>,
    /// Pods of the claim that still exist and wait for a node.
    pub pods_pending: Vec<(String, String, Option<String>)>,
    /// Pods of the claim bound to its node.
    pub pods_bound: usize,
}

/// A pod of a claim, as events address it: namespace, name, uid.
type PodKey = (String, String, Option<String>);

#[derive(Debug)]
enum Action {
    /// Powers on, then tells these pods the server is on: on the BMC's
    /// confirmation itself, before the node can register and before the
    /// loop's next pass records the stage.
    PowerOn(Vec<PodKey>),
    PowerOff,
}

/// A power action that ended, with how.
type Finished = (Action, std::result::Result<(), PowerError>);

struct Running {
    action: Action,
    handle: JoinHandle<std::result::Result<(), PowerError>>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Attempts {
    failed: u32,
    next_at: Option<Instant>,
}

/// A claim just opened: its server claimed and powering on, its NodeClaim
/// not yet written.
#[derive(Clone, Debug)]
pub struct Opened {
    pub name: String,
    /// When its power-on was handed to the provider.
    pub power_on_sent: Option<Instant>,
    /// The server as it was when its lock was taken.
    server: Server,
    /// The NodeClaim to write.
    record: NodeClaim,
    decided_s: Seconds,
    sent_s: Seconds,
}

impl Opened {
    /// How many pods the claim was opened for.
    pub fn pods(&self) -> usize {
        self.record.spec.pods.len()
    }

    #[cfg(test)]
    pub(crate) fn for_test(name: &str, pods: usize, power_on_sent: Option<Instant>) -> Opened {
        let pod = PodReference { namespace: "ns".into(), name: "p".into(), uid: None };
        Opened {
            name: name.into(),
            power_on_sent,
            server: Server::new("s", serde_json::from_value(serde_json::json!({"bmc": {"address": "https://bmc.invalid/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}}, "hardware": {"cpu": "1", "memory": "1Gi"}})).expect("spec")),
            record: NodeClaim::new(name, NodeClaimSpec { server: "s".into(), pool: "p".into(), pods: vec![pod; pods] }),
            decided_s: 0,
            sent_s: 0,
        }
    }
}

/// A fresh NodeClaim name, `POOL-SERVER-xxxxx`, chosen here rather than by
/// the API server because the server is claimed under it before the
/// NodeClaim is created.
fn claim_name(pool: &str, server: &str) -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded per process; the clock and a counter make two
    // names of one process differ.
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    hasher.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    ironclaim_driver::claim::claim_name(pool, server, hasher.finish())
}

/// Opens and drives claims. Cheap to share.
pub struct Claims {
    client: Client,
    power: Arc<dyn Power>,
    settings: ClaimSettings,
    metrics: Arc<Metrics>,
    events: Events,
    running: Mutex<HashMap<String, Running>>,
    attempts: Mutex<HashMap<String, Attempts>>,
    /// The resourceVersion of each claim's last status write by this
    /// process: a view older than it is stale and waits for the watch.
    written: Mutex<HashMap<String, u64>>,
    locks: Locks,
    /// Nothing is claimed, written or powered while it is shut.
    gate: Gate,
}

fn now_s() -> Seconds {
    jiff::Timestamp::now().as_second().max(0) as Seconds
}

fn durations_of(server: &Server) -> StageDurations {
    server_to_core(server).map(|s| s.durations).unwrap_or_default()
}

impl Claims {
    pub fn new(client: Client, power: Arc<dyn Power>, settings: ClaimSettings, metrics: Arc<Metrics>, events: Events) -> Self {
        let locks = Locks::new(client.clone(), &settings.lock_namespace);
        Claims {
            client,
            power,
            settings,
            metrics,
            events,
            running: Mutex::new(HashMap::new()),
            attempts: Mutex::new(HashMap::new()),
            written: Mutex::new(HashMap::new()),
            locks,
            gate: Gate::always(),
        }
    }

    /// Acts only while `gate` is open (leader election). Every power action
    /// through these claims, the sweep and scale-down is fenced by it at the
    /// moment it reaches the provider ([`FencedPower`]).
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.power = Arc::new(FencedPower::new(self.power.clone(), gate.clone()));
        self.gate = gate;
        self
    }

    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    fn ensure_acting(&self) -> Result<()> {
        if self.gate.acting() { Ok(()) } else { Err(Error::NotLeading) }
    }

    pub fn events(&self) -> &Events {
        &self.events
    }

    pub fn opening_grace(&self) -> Duration {
        self.settings.opening_grace
    }

    pub fn power(&self) -> Arc<dyn Power> {
        self.power.clone()
    }

    fn claims_api(&self) -> Api<NodeClaim> {
        Api::all(self.client.clone())
    }

    fn servers_api(&self) -> Api<Server> {
        Api::all(self.client.clone())
    }

    /// Opens a claim the core decided on, up to its power-on: takes the
    /// server's lock (one write to the lock ledger, shared by the claims
    /// opened at the same time) and sends the power-on. The claim is
    /// written to the Server and the NodeClaim created afterwards by
    /// [`Claims::record_opened`], so a power-on waits for one cheap write.
    ///
    /// # Errors
    /// [`Error::ServerHeld`] when another claim holds the server;
    /// [`Error::ClaimLockFailed`] when the lock could not be taken.
    ///
    /// `known` is the server as the index last saw it, checked free
    /// without reading it again (a stale copy is caught by the lock).
    /// `decided_s` is when the core chose it.
    pub async fn open(&self, new: &NewClaim, uids: &HashMap<String, String>, known: Option<Server>, decided_s: Seconds) -> Result<Opened> {
        self.ensure_acting()?;
        let name = claim_name(&new.pool, &new.server);
        let pods: Vec<PodReference> = new
            .pods
            .iter()
            .map(|key| {
                let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
                PodReference { namespace: namespace.to_string(), name: name.to_string(), uid: uids.get(key).cloned() }
            })
            .collect();
        let (server, newly) = match self.take_server(&new.server, &name, known).await {
            Ok(claimed) => claimed,
            Err(err @ Error::ServerHeld { .. }) => {
                self.metrics.claim_ended("failed", timeline::reason_label(FailureReason::ClaimConflict));
                return Err(err);
            }
            Err(err) => return Err(err),
        };
        // Always newly taken here (the name is fresh), but a power-on is
        // sent only by the call that took the lock.
        let mut power_on_sent = None;
        if newly {
            let keys = pods.iter().map(|p| (p.namespace.clone(), p.name.clone(), p.uid.clone())).collect();
            self.spawn(&name, Action::PowerOn(keys), server.clone());
            power_on_sent = Some(Instant::now());
        }
        let record = NodeClaim {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(NODEPOOL_LABEL.to_string(), new.pool.clone()), (SERVER_LABEL.to_string(), new.server.clone())].into()),
                ..ObjectMeta::default()
            },
            spec: NodeClaimSpec { server: new.server.clone(), pool: new.pool.clone(), pods },
            status: None,
        };
        Ok(Opened { name, power_on_sent, server, record, decided_s, sent_s: now_s() })
    }

    /// Records a claim [`Claims::open`] opened: the claim on the Server's
    /// status, then its NodeClaim with the first two stages. Until both
    /// exist the lock's and the server's times tell the orphan sweep the
    /// claim is being opened; if this fails for good the sweep powers the
    /// server off and releases it once the opening grace has passed.
    ///
    /// # Errors
    /// [`Error::ClaimServerFailed`], [`Error::ServerHeld`],
    /// [`Error::CreateClaimFailed`], [`Error::ApplyStatusFailed`].
    pub async fn record_opened(&self, opened: &Opened) -> Result<()> {
        let server = &opened.record.spec.server;
        self.write_claim(&opened.server, &opened.name).await?;
        match self.claims_api().create(&PostParams::default(), &opened.record).await {
            Ok(_) => {}
            // A retried create that had landed.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(source) => {
                return Err(Error::CreateClaimFailed { server: server.clone(), source });
            }
        }
        let mut status = NodeClaimStatus::default();
        timeline::enter(&mut status, Stage::Selected, opened.decided_s, None);
        let ended = timeline::enter(&mut status, Stage::PoweringOn, opened.sent_s, None);
        self.write_status(&opened.name, &status).await?;
        self.record(ended, &opened.record.spec.pool);
        Ok(())
    }

    /// Claims the server of a NodeClaim that exists without a stage (its
    /// status write was lost) and records `PoweringOn`.
    ///
    /// # Guarantees
    /// A power-on is sent only by the call that took the server's lock.
    /// When the server was already held by this claim (a restart, or a
    /// retried write), nothing is sent here: the `PoweringOn` stage waits
    /// through the power-on budget and asks the BMC before sending again.
    async fn select(&self, claim: &NodeClaim, server_name: &str) -> Result<()> {
        let name = claim.name_any();
        let now = now_s();
        self.ensure_acting()?;
        let claimed = match self.take_server(server_name, &name, None).await {
            Ok((server, newly)) => self.write_claim(&server, &name).await.map(|server| (server, newly)),
            Err(err) => Err(err),
        };
        let (server, newly) = match claimed {
            Ok(claimed) => claimed,
            Err(err @ Error::ServerHeld { .. }) => {
                let mut status = claim.status.clone().unwrap_or_default();
                timeline::enter(&mut status, Stage::Selected, now, None);
                let ended = timeline::fail(&mut status, FailureReason::ClaimConflict, err.to_string(), now, false);
                self.write_status(&name, &status).await?;
                self.record(ended, &claim.spec.pool);
                self.metrics.claim_ended("failed", timeline::reason_label(FailureReason::ClaimConflict));
                return Err(err);
            }
            Err(err) => return Err(err),
        };
        if newly {
            let pods = claim.spec.pods.iter().map(|p| (p.namespace.clone(), p.name.clone(), p.uid.clone())).collect();
            self.spawn(&name, Action::PowerOn(pods), server);
        }
        let mut status = claim.status.clone().unwrap_or_default();
        timeline::enter(&mut status, Stage::Selected, claim.metadata.creation_timestamp.as_ref().map_or(now, timeline::seconds), None);
        let ended = timeline::enter(&mut status, Stage::PoweringOn, now, None);
        self.write_status(&name, &status).await?;
        self.record(ended, &claim.spec.pool);
        Ok(())
    }

    /// Claims `server` for `claim`: takes its lock, then writes the claim
    /// to its status.
    ///
    /// # Errors
    /// [`Error::ServerHeld`] when another claim holds the server (also when
    /// it won a race for it); [`Error::ClaimLockFailed`] or
    /// [`Error::ClaimServerFailed`] otherwise.
    pub async fn claim_server(&self, server: &str, claim: &str) -> Result<Server> {
        let (current, _) = self.take_server(server, claim, None).await?;
        self.write_claim(&current, claim).await
    }

    /// Takes `server` for `claim` if its copy (`known`, the index's, or a
    /// fresh read) shows it free: by creating its lock, which of two
    /// claimers only one can do. True when this call took it: only then
    /// may a power-on be sent.
    async fn take_server(&self, server: &str, claim: &str, known: Option<Server>) -> Result<(Server, bool)> {
        let current = match known.filter(|k| k.metadata.resource_version.is_some()) {
            Some(k) => k,
            None => self.servers_api().get_status(server).await.map_err(|source| Error::ClaimServerFailed { server: server.into(), source })?,
        };
        let status = current.status.clone().unwrap_or_default();
        match status.claim.as_deref() {
            // Already ours; a claim written before locks existed gets its lock now.
            Some(holder) if holder == claim => {
                self.locks.take(&current, claim).await?;
                return Ok((current, false));
            }
            Some(holder) if !holder.is_empty() => {
                return Err(Error::ServerHeld { server: server.into(), holder: holder.into() });
            }
            _ => {}
        }
        if current.spec.maintenance || status.quarantined {
            return Err(Error::ServerHeld { server: server.into(), holder: "maintenance or quarantine".into() });
        }
        let taken = self.locks.take(&current, claim).await?;
        Ok((current, taken == Taken::Now))
    }

    /// Writes the claim the caller holds the lock of to the server's
    /// status: its name, `claimedAt`, and `PoweringOn` unless the server
    /// is on. A merge patch of those fields on the resourceVersion read,
    /// read again on a conflict (the power sweep may have written since).
    ///
    /// # Errors
    /// [`Error::ServerHeld`] if the status names another claim (a lock
    /// broken under a live claim); [`Error::ClaimServerFailed`] otherwise.
    async fn write_claim(&self, known: &Server, claim: &str) -> Result<Server> {
        let api = self.servers_api();
        let server = known.name_any();
        let mut current = Some(known.clone()).filter(|k| k.metadata.resource_version.is_some());
        for _ in 0..5 {
            let read = match current.take() {
                Some(k) => k,
                None => api.get_status(&server).await.map_err(|source| Error::ClaimServerFailed { server: server.clone(), source })?,
            };
            let status = read.status.clone().unwrap_or_default();
            match status.claim.as_deref() {
                Some(holder) if holder == claim => return Ok(read),
                Some(holder) if !holder.is_empty() => {
                    return Err(Error::ServerHeld { server, holder: holder.into() });
                }
                _ => {}
            }
            let mut claimed = serde_json::json!({
                "claim": claim,
                "claimedAt": Time(jiff::Timestamp::now()),
            });
            if status.power_state != Some(PowerState::On) {
                claimed["powerState"] = serde_json::json!(PowerState::PoweringOn);
            }
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": read.metadata.resource_version},
                "status": claimed,
            });
            match api.patch_status(&server, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(written) => return Ok(written),
                Err(kube::Error::Api(status)) if status.code == 409 => continue,
                Err(source) => {
                    return Err(Error::ClaimServerFailed { server, source });
                }
            }
        }
        Err(Error::ServerHeld { server, holder: "a concurrent writer".into() })
    }

    async fn write_status(&self, claim: &str, status: &NodeClaimStatus) -> Result<()> {
        let patch = serde_json::json!({ "status": status });
        let written = self
            .claims_api()
            .patch_status(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ApplyStatusFailed { claim: claim.into(), source })?;
        if let Some(version) = written.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok()) {
            self.written.lock().unwrap_or_else(PoisonError::into_inner).insert(claim.to_string(), version);
        }
        Ok(())
    }

    /// Whether the view predates this process's last write of the claim.
    /// (resourceVersions are opaque by contract; kube-apiserver on etcd
    /// gives increasing integers, and anything else is never "stale".)
    fn stale(&self, claim: &NodeClaim) -> bool {
        let seen = claim.metadata.resource_version.as_deref().and_then(|v| v.parse::<u64>().ok());
        let written = self.written.lock().unwrap_or_else(PoisonError::into_inner).get(&claim.name_any()).copied();
        matches!((seen, written), (Some(seen), Some(written)) if seen < written)
    }

    fn record(&self, ended: Option<Ended>, pool: &str) {
        if let Some((stage, took, outcome)) = ended {
            let outcome = format!("{outcome:?}");
            self.metrics.observe_stage(timeline::stage_name(stage), pool, &outcome.to_lowercase(), took as f64);
        }
    }

    /// Starts a power action, only while the gate is open; the action is
    /// cut short when the gate shuts.
    fn spawn(&self, claim: &str, action: Action, server: Server) {
        if !self.gate.acting() {
            return;
        }
        let power = self.power.clone();
        let gate = self.gate.clone();
        let cut_short = || PowerError {
            reason: FailureReason::PowerActionFailed,
            label: "not_leading",
            message: "this replica stopped leading before the power action finished".into(),
        };
        let handle = match &action {
            Action::PowerOn(pods) => {
                let (events, pods) = (self.events.clone(), pods.clone());
                tokio::spawn(async move {
                    tokio::select! { r = power.power_on(&server) => r, _ = gate.lost() => Err(cut_short()) }?;
                    let note = timeline::powered_on_note(&server.name_any(), 0, &durations_of(&server));
                    for (namespace, pod, uid) in &pods {
                        events.pod(namespace, pod, uid.as_deref(), "WaitingForServer", &note).await;
                    }
                    Ok(())
                })
            }
            Action::PowerOff => tokio::spawn(async move {
                tokio::select! { r = power.power_off(&server) => r, _ = gate.lost() => Err(cut_short()) }
            }),
        };
        self.running.lock().unwrap_or_else(PoisonError::into_inner).insert(claim.to_string(), Running { action, handle });
    }

    /// The finished action of a claim, if one finished; `Err(())` while one runs.
    fn take_finished(&self, claim: &str) -> std::result::Result<Option<Finished>, ()> {
        let mut running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(r) = running.get(claim) else {
            return Ok(None);
        };
        if !r.handle.is_finished() {
            return Err(());
        }
        let Some(r) = running.remove(claim) else {
            return Ok(None);
        };
        let result = match futures::FutureExt::now_or_never(r.handle) {
            Some(Ok(result)) => result,
            Some(Err(join)) => Err(PowerError {
                reason: FailureReason::PowerActionFailed,
                label: "task_failed",
                message: format!("the power task ended abnormally: {join}"),
            }),
            None => return Err(()),
        };
        Ok(Some((r.action, result)))
    }

    fn retry_due(&self, claim: &str) -> bool {
        let attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        attempts.get(claim).and_then(|a| a.next_at).is_none_or(|at| Instant::now() >= at)
    }

    fn attempted(&self, claim: &str) -> bool {
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner).contains_key(claim)
    }

    /// Counts a failed attempt and schedules the next; the count so far.
    fn failed_attempt(&self, claim: &str) -> u32 {
        let mut attempts = self.attempts.lock().unwrap_or_else(PoisonError::into_inner);
        let a = attempts.entry(claim.to_string()).or_default();
        a.failed += 1;
        a.next_at = Some(Instant::now() + self.settings.retry.delay(a.failed));
        a.failed
    }

    /// Brings one claim a step further. Idempotent: it looks at where the
    /// claim stands and does what that stage needs, whatever triggered it.
    ///
    /// # Errors
    /// The API or provider step that failed; the caller counts it and
    /// tries again on the next pass.
    pub async fn reconcile(&self, view: &ClaimView) -> Result<()> {
        let claim = &view.claim;
        let name = claim.name_any();
        if self.stale(claim) || !self.gate.acting() {
            return Ok(());
        }
        let mut status = claim.status.clone().unwrap_or_default();
        if status.failure_reason.is_some() {
            return self.release_failed(view).await;
        }
        let now = now_s();
        let Some(server) = view.server.clone() else {
            let ended = timeline::fail(
                &mut status,
                FailureReason::ServerUnavailable,
                format!("server {} is not in the inventory", claim.spec.server),
                now,
                false,
            );
            self.write_status(&name, &status).await?;
            self.record(ended, &claim.spec.pool);
            self.metrics.claim_ended("failed", timeline::reason_label(FailureReason::ServerUnavailable));
            return Ok(());
        };
        let durations = durations_of(&server);
        let stage = status.stage.unwrap_or(Stage::Selected);
        let started = timeline::stage_started_s(&status).unwrap_or(now);
        let age = now.saturating_sub(started);
        let budget = timeline::driver_stage(stage).and_then(|st| self.settings.deadlines.budget(st, &durations));
        match stage {
            Stage::Selected => self.select(claim, &claim.spec.server).await,
            Stage::PoweringOn => self.reconcile_power_on(view, status, &server, age).await,
            Stage::Booting => {
                if let Some(node) = &view.node {
                    let node_name = node.name_any();
                    self.link_node(&server, node, view.pool.as_ref()).await?;
                    status.node_name = Some(node_name.clone());
                    let ended = timeline::enter(&mut status, Stage::Joined, now, Some(format!("node {node_name} registered")));
                    self.write_status(&name, &status).await?;
                    self.record(ended, &claim.spec.pool);
                    self.tell_pods(view, &status, &durations, now).await;
                    return Ok(());
                }
                if let Some(b) = budget
                    && age > b.stuck_after_s
                {
                    let message = format!(
                        "server {} powered on {} ago and no node registered; it usually registers in {} (stuck after {})",
                        server.name_any(),
                        timeline::human(age),
                        timeline::human(b.usual_s),
                        timeline::human(b.stuck_after_s)
                    );
                    return self.fail(view, status, FailureReason::RegistrationTimedOut, message, true).await;
                }
                Ok(())
            }
            Stage::Joined => {
                let Some(node) = &view.node else {
                    let message = format!("node {} went away before it was ready", status.node_name.clone().unwrap_or_default());
                    return self.fail(view, status, FailureReason::NodeLost, message, false).await;
                };
                let unmet = gates::unmet(node, view.pool.as_ref());
                if unmet.is_empty() {
                    let ended = timeline::enter(&mut status, Stage::Ready, now, Some("node Ready and readiness gates passed".into()));
                    timeline::set_condition(
                        &mut status.conditions,
                        GATES_CONDITION,
                        true,
                        "Passed",
                        "every readiness gate passed",
                        now,
                        claim.metadata.generation,
                    );
                    self.write_status(&name, &status).await?;
                    self.record(ended, &claim.spec.pool);
                    self.metrics.claim_ended("ready", "");
                    self.measure(&server, claim, node, now).await?;
                    self.tell_pods(view, &status, &durations, now).await;
                    return Ok(());
                }
                let waiting = format!("waiting for {}", unmet.join(", "));
                if let Some(b) = budget
                    && age > b.stuck_after_s
                {
                    let reason =
                        if unmet.iter().any(|u| u == "node Ready") { FailureReason::NodeNotReady } else { FailureReason::ReadinessGateFailed };
                    let message = format!(
                        "node {} registered {} ago and is not ready: {waiting}; usually ready in {}",
                        node.name_any(),
                        timeline::human(age),
                        timeline::human(b.usual_s)
                    );
                    return self.fail(view, status, reason, message, true).await;
                }
                let before = status.conditions.iter().find(|c| c.type_ == GATES_CONDITION).map(|c| c.message.clone());
                if before.as_deref() != Some(waiting.as_str()) {
                    timeline::set_condition(&mut status.conditions, GATES_CONDITION, false, "Waiting", &waiting, now, claim.metadata.generation);
                    self.write_status(&name, &status).await?;
                }
                Ok(())
            }
            Stage::Ready => {
                if view.pods_pending.is_empty() {
                    let ended = timeline::enter(&mut status, Stage::Serving, now, Some(format!("{} pod(s) bound", view.pods_bound)));
                    self.write_status(&name, &status).await?;
                    self.record(ended, &claim.spec.pool);
                }
                Ok(())
            }
            Stage::Serving | Stage::Draining | Stage::PoweringOff | Stage::Off => Ok(()),
        }
    }

    async fn reconcile_power_on(&self, view: &ClaimView, mut status: NodeClaimStatus, server: &Server, age: Seconds) -> Result<()> {
        let claim = &view.claim;
        let name = claim.name_any();
        let now = now_s();
        let durations = durations_of(server);
        let confirmed = match self.take_finished(&name) {
            Err(()) => return Ok(()),
            Ok(Some((Action::PowerOn(_), Ok(())))) => true,
            Ok(Some((_, Err(err)))) => return self.power_failed(view, status, err).await,
            Ok(Some((Action::PowerOff, Ok(())))) | Ok(None) => false,
        };
        let on = confirmed || {
            if !self.retry_due(&name) {
                return Ok(());
            }
            match self.power.power_state(server).await {
                Ok(PowerState::On) => true,
                Ok(_) => false,
                // The BMC cannot even be read: count it like a failed attempt.
                Err(err) => return self.power_failed(view, status, err).await,
            }
        };
        if on {
            timeline::set_condition(
                &mut status.conditions,
                POWERED_ON_CONDITION,
                true,
                "Confirmed",
                "the provider confirms the power is on",
                now,
                claim.metadata.generation,
            );
            let ended = timeline::enter(&mut status, Stage::Booting, now, Some("power on confirmed".into()));
            self.write_status(&name, &status).await?;
            self.record(ended, &claim.spec.pool);
            self.attempts.lock().unwrap_or_else(PoisonError::into_inner).remove(&name);
            if !confirmed {
                // Found on by a read (a power-on of an earlier run): the
                // power task that would have told the pods is not ours.
                self.tell_pods(view, &status, &durations, now).await;
            }
            self.set_server_power(server, PowerState::On).await?;
            return Ok(());
        }
        // Off. A power-on sent by an earlier run of the controller (or this
        // one, before a restart of its task) may still be settling: wait
        // for it through the power-on budget before sending another.
        let budget = self.settings.deadlines.budget(ironclaim_driver::Stage::PoweringOn, &durations).map_or(60, |b| b.stuck_after_s);
        if !self.attempted(&name) && age < budget {
            return Ok(());
        }
        self.spawn(&name, Action::PowerOn(view.pods_pending.clone()), server.clone());
        Ok(())
    }

    /// A failed power attempt: recorded on the claim's `PoweredOn`
    /// condition with its typed reason and the next retry, or the claim
    /// fails once the attempts are used up.
    async fn power_failed(&self, view: &ClaimView, mut status: NodeClaimStatus, err: PowerError) -> Result<()> {
        let name = view.claim.name_any();
        self.metrics.power_failure(err.metric_label());
        let failed = self.failed_attempt(&name);
        let message = format!("attempt {failed} of {}: {}", self.settings.retry.attempts, err.message);
        if failed >= self.settings.retry.attempts {
            return self.fail(view, status, err.reason, message, false).await;
        }
        let delay = self.settings.retry.delay(failed);
        timeline::set_condition(
            &mut status.conditions,
            POWERED_ON_CONDITION,
            false,
            &timeline::reason_word(err.reason),
            &format!("{message}; retrying in {}", timeline::human(delay.as_secs().max(1))),
            now_s(),
            view.claim.metadata.generation,
        );
        self.write_status(&name, &status).await
    }

    async fn fail(&self, view: &ClaimView, mut status: NodeClaimStatus, reason: FailureReason, message: String, timed_out: bool) -> Result<()> {
        let name = view.claim.name_any();
        let now = now_s();
        let ended = timeline::fail(&mut status, reason, message.clone(), now, timed_out);
        self.write_status(&name, &status).await?;
        self.record(ended, &view.claim.spec.pool);
        self.metrics.claim_ended("failed", timeline::reason_label(reason));
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner).remove(&name);
        for (namespace, pod, uid) in &view.pods_pending {
            self.events
                .warn(
                    namespace,
                    pod,
                    uid.as_deref(),
                    "ClaimFailed",
                    &format!("claim {name} on server {} failed ({reason:?}): {message}; re-planning", view.claim.spec.server),
                )
                .await;
        }
        Ok(())
    }

    /// A failed claim's server: power it off unless it became a node, then
    /// release it, count the failure, and quarantine it after repeats.
    async fn release_failed(&self, view: &ClaimView) -> Result<()> {
        let name = view.claim.name_any();
        let Some(server) = &view.server else {
            return self.collect(view).await;
        };
        let holds = server.status.as_ref().and_then(|s| s.claim.as_deref()) == Some(name.as_str());
        if !holds {
            return self.collect(view).await;
        }
        let claim_conflict = view.claim.status.as_ref().and_then(|s| s.failure_reason) == Some(FailureReason::ClaimConflict);
        if view.node.is_none() && !claim_conflict {
            match self.take_finished(&name) {
                Err(()) => return Ok(()),
                Ok(Some((Action::PowerOff, Ok(())))) => {}
                Ok(Some((_, Err(err)))) => {
                    self.metrics.power_failure(err.metric_label());
                    self.failed_attempt(&name);
                    return Ok(());
                }
                Ok(Some((Action::PowerOn(_), Ok(())))) | Ok(None) => {
                    if !self.retry_due(&name) {
                        return Ok(());
                    }
                    match self.power.power_state(server).await {
                        Ok(PowerState::Off) => {}
                        _ => {
                            self.spawn(&name, Action::PowerOff, server.clone());
                            return Ok(());
                        }
                    }
                }
            }
        }
        self.attempts.lock().unwrap_or_else(PoisonError::into_inner).remove(&name);
        self.release_server(server, &name, !claim_conflict).await?;
        Ok(())
    }

    /// Clears the server's claim (only if `claim` still holds it), counts
    /// the failure and sets the failure condition; then gives up the
    /// claim's lock, which outlives the status claim by this order.
    pub async fn release_server(&self, server: &Server, claim: &str, count_failure: bool) -> Result<()> {
        if self.clear_claim(server, claim, count_failure).await? {
            self.locks.give_up(&server.name_any(), claim).await?;
        }
        Ok(())
    }

    /// True once the server no longer names `claim`; false when five
    /// writers in a row got there first (the next pass tries again).
    async fn clear_claim(&self, server: &Server, claim: &str, count_failure: bool) -> Result<bool> {
        let api = self.servers_api();
        let server_name = server.name_any();
        for _ in 0..5 {
            let mut current =
                api.get_status(&server_name).await.map_err(|source| Error::ServerStatusFailed { server: server_name.clone(), source })?;
            let mut status: ServerStatus = current.status.clone().unwrap_or_default();
            if status.claim.as_deref() != Some(claim) {
                return Ok(true);
            }
            let now = now_s();
            status.claim = None;
            status.claimed_at = None;
            status.node = None;
            if count_failure {
                status.failures += 1;
                if status.failures >= i64::from(self.settings.quarantine_after) {
                    status.quarantined = true;
                }
                let message = format!("claim {claim} failed; {} failure(s) in a row", status.failures);
                timeline::set_condition(&mut status.conditions, CLAIM_FAILED_CONDITION, true, "ClaimFailed", &message, now, None);
                // A new failure restarts the backoff even when the condition was already True.
                if let Some(c) = status.conditions.iter_mut().find(|c| c.type_ == CLAIM_FAILED_CONDITION) {
                    c.last_transition_time = timeline::time(now);
                }
                status.power_state = Some(PowerState::Off);
            }
            current.status = Some(status);
            match api.replace_status(&server_name, &PostParams::default(), &current).await {
                Ok(_) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(source) => {
                    return Err(Error::ServerStatusFailed { server: server_name, source });
                }
            }
        }
        Ok(false)
    }

    /// Deletes a failed claim once its record has been kept long enough.
    async fn collect(&self, view: &ClaimView) -> Result<()> {
        let created = view.claim.metadata.creation_timestamp.as_ref().map_or(0, timeline::seconds);
        if now_s().saturating_sub(created) < self.settings.failed_claim_ttl.as_secs() {
            return Ok(());
        }
        match self.claims_api().delete(&view.claim.name_any(), &Default::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(source) => Err(Error::ReadFailed { what: format!("NodeClaim {}", view.claim.name_any()), source }),
        }
    }

    /// Records the node on the server's status and gives the node its
    /// pool's labels.
    async fn link_node(&self, server: &Server, node: &Node, pool: Option<&NodePool>) -> Result<()> {
        let node_name = node.name_any();
        let mut labels: std::collections::BTreeMap<String, String> = server.spec.labels.clone();
        if let Some(pool) = pool {
            if let Some(t) = &pool.spec.template {
                labels.extend(t.labels.clone());
            }
            labels.insert(NODEPOOL_LABEL.to_string(), pool.name_any());
        }
        labels.insert(SERVER_LABEL.to_string(), server.name_any());
        let missing = labels.iter().any(|(k, v)| node.labels().get(k) != Some(v));
        if missing {
            let patch = serde_json::json!({"metadata": {"labels": labels}});
            Api::<Node>::all(self.client.clone())
                .patch(&node_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| Error::LabelNodeFailed { node: node_name.clone(), source })?;
        }
        let patch = serde_json::json!({"status": {"node": node_name}});
        self.servers_api()
            .patch_status(&server.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ServerStatusFailed { server: server.name_any(), source })?;
        Ok(())
    }

    async fn set_server_power(&self, server: &Server, state: PowerState) -> Result<()> {
        let patch = serde_json::json!({"status": {"powerState": state}});
        self.servers_api()
            .patch_status(&server.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ServerStatusFailed { server: server.name_any(), source })?;
        Ok(())
    }

    /// Folds this start's stage durations into the server's measurements
    /// and clears its failure streak.
    async fn measure(&self, server: &Server, claim: &NodeClaim, node: &Node, now: Seconds) -> Result<()> {
        let Some(status) = &claim.status else {
            return Ok(());
        };
        let took =
            |stage: Stage| status.stages.iter().rev().find(|r| r.stage == stage).and_then(|r| r.duration_seconds).map_or(0, |d| d.max(0) as Seconds);
        let joined_at = status.stages.iter().rev().find(|r| r.stage == Stage::Joined).map_or(now, |r| timeline::seconds(&r.start_time));
        let node_ready_at = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready" && c.status == "True"))
            .and_then(|c| c.last_transition_time.as_ref())
            .map_or(joined_at, timeline::seconds)
            .clamp(joined_at, now);
        let sample = [took(Stage::PoweringOn), took(Stage::Booting), node_ready_at - joined_at, now - node_ready_at];
        let tail = durations_of(server).tail_percent;
        let measured = timeline::fold_start(server.status.as_ref().and_then(|s| s.measured_durations.as_ref()), sample, tail);
        let patch = serde_json::json!({"status": {"measuredDurations": measured, "failures": 0}});
        self.servers_api()
            .patch_status(&server.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ServerStatusFailed { server: server.name_any(), source })?;
        Ok(())
    }

    /// Tells each pod still waiting on the claim where it stands.
    pub async fn tell_pods(&self, view: &ClaimView, status: &NodeClaimStatus, d: &StageDurations, now: Seconds) {
        let note = timeline::waiting_note(&view.claim.spec.server, status, d, now);
        for (namespace, pod, uid) in &view.pods_pending {
            self.events.pod(namespace, pod, uid.as_deref(), "WaitingForServer", &note).await;
        }
    }

    /// A server whose claim no longer exists: power it off if it never
    /// became a node, and release it. Without counting a failure: the
    /// claim was removed, the server did nothing wrong.
    pub async fn release_orphan(&self, server: &Server, claim: &str, has_node: bool) -> Result<()> {
        if !has_node {
            self.power_off_unless_off(server).await?;
        }
        self.release_server(server, claim, false).await
    }

    /// Powers `server` off unless its BMC already reads Off: a power-on
    /// nobody follows up may have reached it.
    async fn power_off_unless_off(&self, server: &Server) -> Result<()> {
        let failed = |source| Error::PowerFailed { server: server.name_any(), source };
        match self.power.power_state(server).await.map_err(failed)? {
            PowerState::Off => Ok(()),
            _ => self.power.power_off(server).await.map_err(failed),
        }
    }

    /// Breaks a lock an opening left behind when it died before writing
    /// the claim to the server (see [`crate::locks`]), or one whose server
    /// was deleted: confirmed against the API first, since the watch may
    /// lag. Its power-on may have reached the BMC, so a server that is not
    /// a node is powered off, as an orphan is; then the lock goes.
    ///
    /// # Errors
    /// [`Error::ReadFailed`], [`Error::ServerStatusFailed`] when a read
    /// failed; [`Error::ClaimLockFailed`] when giving the lock up did;
    /// [`Error::PowerFailed`] when the power-off did (the lock is kept, so
    /// the next sweep tries again).
    pub async fn break_lock(&self, lock: &Lock, has_node: bool) -> Result<()> {
        self.ensure_acting()?;
        let name = &lock.server;
        if self.locks.read(name).await?.as_ref() != Some(lock) {
            return Ok(());
        }
        let current = self.servers_api().get_opt(name).await.map_err(|source| Error::ServerStatusFailed { server: name.clone(), source })?;
        let named = current.as_ref().and_then(|s| s.status.as_ref()).and_then(|s| s.claim.as_deref()).filter(|c| !c.is_empty());
        if named == Some(lock.holder.as_str()) {
            return Ok(());
        }
        tracing::warn!(server = %name, claim = %lock.holder, "a claim lock outlived its opening or its server; breaking it");
        if let Some(current) = &current
            && !has_node
            && named.is_none()
        {
            self.power_off_unless_off(current).await?;
        }
        self.locks.give_up(name, &lock.holder).await
    }

    /// Reads (or creates) the claim lock ledger ahead of the first claims
    /// (see [`Locks::prepare`]).
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn prepare_locks(&self) -> Result<()> {
        self.locks.prepare().await
    }

    /// Stops every running power task (on shutdown or lost leadership).
    /// What they announced is on the API, so a successor picks them up.
    pub fn abort_all(&self) {
        for (_, r) in self.running.lock().unwrap_or_else(PoisonError::into_inner).drain() {
            r.handle.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::claim_name;

    #[test]
    fn claim_names_are_valid_distinct_and_bounded() {
        let names: std::collections::HashSet<String> = (0..1000).map(|_| claim_name("general", "r1-u01")).collect();
        assert_eq!(names.len(), 1000);
        for n in &names {
            assert!(n.starts_with("general-r1-u01-") && n.len() == "general-r1-u01-".len() + 5, "{n}");
            assert!(n.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'), "{n}");
        }
        // 240 characters of prefix cut inside the server name, then the suffix.
        let long = claim_name(&"p".repeat(200), &"s".repeat(100));
        assert_eq!(long.len(), 246, "{long}");
        let cut_at_dash = claim_name(&"p".repeat(239), "s");
        assert!(!cut_at_dash.contains("--"), "{cut_at_dash}");
    }
}
