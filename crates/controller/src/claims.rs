//! The claim executor: what the driver's claim state machine
//! ([`ironclaim_driver::claim`]) decides, carried out against the API and
//! the power provider, and answered with [`Report`]s.
//!
//! # Restart safety
//! Every step is written to the API before the action it announces. A
//! take ([`Claims::take`]) takes the server's claim lock (an entry in the
//! lock ledger, see [`crate::locks`]; concurrent takes share a write per
//! shard),
//! writes the claim to the Server (its name, `claimedAt`, power state
//! `PoweringOn`) and creates the ServerClaim at `Selected`; only then does
//! the driver send the power-on. A restarted controller reads where each
//! claim stands and the driver asks the BMC before acting: a server already
//! on is not powered on again, and a power-on sent less than the server's
//! power-on budget ago is waited for, not repeated. A server whose claim is
//! gone, and was claimed longer ago than the opening grace, is powered off
//! and released; so is a server whose lock names a claim the Server never
//! recorded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironclaim_core::identity;
use ironclaim_core::model::{Seconds, StageDurations};
use ironclaim_driver::{ClaimRecord, PowerFailure, Report};
use ironclaim_k8s::api::server::{BMC_CONFIGURED_CONDITION, PowerState, ServerStatus};
use ironclaim_k8s::api::serverclaim::{FailureReason, PodReference, ServerClaimSpec, ServerClaimStatus, Stage};
use ironclaim_k8s::api::{Server, ServerClaim, ServerPool};
use ironclaim_k8s::node::{Parking, SERVER_LABEL, parking};
use ironclaim_k8s::server_to_core;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};

use crate::error::{Error, Result};
use crate::events::Events;
use crate::index::CLAIM_FAILED_CONDITION;
use crate::leader::{FencedPower, Gate};
use crate::locks::{Lock, Locks, Taken};
use crate::metrics::Metrics;
use crate::provider::{Power, PowerError};
use crate::timeline::{self, Deadlines, Ended};

/// The label on a ServerClaim naming its ServerPool.
pub const SERVERPOOL_LABEL: &str = ironclaim_core::provision::SERVERPOOL_LABEL;
/// The condition on a ServerClaim that carries the last power error.
pub const POWERED_ON_CONDITION: &str = "PoweredOn";
/// The condition on a ServerClaim that says which gates are still unmet.
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
    /// How long a server's claim may wait for its ServerClaim before the
    /// server counts as orphaned. The ServerClaim is written right after the
    /// claim, so anything longer means the controller that opened it is
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

impl ClaimSettings {
    /// The driver's claim settings of these.
    pub fn driver(&self) -> ironclaim_driver::claim::ClaimSettings {
        ironclaim_driver::claim::ClaimSettings {
            deadlines: self.deadlines,
            retry: self.retry,
            quarantine_after: self.quarantine_after,
            failed_claim_ttl_s: self.failed_claim_ttl.as_secs(),
            ..ironclaim_driver::claim::ClaimSettings::default()
        }
    }
}

/// A pod of a claim, as events address it: namespace, name, uid.
pub type PodKey = (String, String, Option<String>);

/// Carries out claim effects. Cheap to share.
pub struct Claims {
    client: Client,
    power: Arc<dyn Power>,
    settings: ClaimSettings,
    metrics: Arc<Metrics>,
    events: Events,
    locks: Locks,
    /// Nothing is claimed, written or powered while it is shut.
    gate: Gate,
    /// The last power error per server, so the retry note names its reason.
    power_errors: Mutex<HashMap<String, FailureReason>>,
}

fn now_s() -> Seconds {
    jiff::Timestamp::now().as_second().max(0) as Seconds
}

fn durations_of(server: &Server) -> StageDurations {
    server_to_core(server).map(|s| s.durations).unwrap_or_default()
}

fn not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 404)
}

impl Claims {
    pub fn new(client: Client, power: Arc<dyn Power>, settings: ClaimSettings, metrics: Arc<Metrics>, events: Events) -> Self {
        let locks = Locks::new(client.clone(), &settings.lock_namespace);
        Claims { client, power, settings, metrics, events, locks, gate: Gate::always(), power_errors: Mutex::default() }
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

    pub fn client(&self) -> Client {
        self.client.clone()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn opening_grace(&self) -> Duration {
        self.settings.opening_grace
    }

    pub fn power(&self) -> Arc<dyn Power> {
        self.power.clone()
    }

    fn claims_api(&self) -> Api<ServerClaim> {
        Api::all(self.client.clone())
    }

    fn servers_api(&self) -> Api<Server> {
        Api::all(self.client.clone())
    }

    /// The server, from `known` (the index's copy) or read.
    async fn server(&self, name: &str, known: Option<Server>) -> Result<Server> {
        match known {
            Some(s) => Ok(s),
            None => self.servers_api().get(name).await.map_err(|source| Error::ServerStatusFailed { server: name.into(), source }),
        }
    }

    /// Carries out [`ironclaim_driver::Effect::TakeServer`]: takes the
    /// server's lock, writes the claim to the Server, and creates the
    /// ServerClaim at `Selected`. `uids` are the pods' uids as the index knows
    /// them; `known` is the server as the index last saw it (a stale copy
    /// is caught by the lock and the write's resourceVersion).
    ///
    /// # Guarantees
    /// [`Report::Taken`] with `newly` only when this call took the lock:
    /// only then does the driver send a power-on.
    pub async fn take(&self, record: &ClaimRecord, uids: &HashMap<String, String>, known: Option<Server>) -> Report {
        let claim = record.name.clone();
        let taken = match self.ensure_acting() {
            Ok(()) => self.take_server(&record.server, &claim, known).await,
            Err(err) => Err(err),
        };
        let (server, newly) = match taken {
            Ok(taken) => taken,
            Err(Error::ServerHeld { holder, .. }) => return Report::Held { claim, holder },
            Err(err) => {
                self.metrics.error(err.metric_label());
                return Report::TakeFailed { claim, message: format!("{err:#}") };
            }
        };
        let opened = async {
            self.write_claim(&server, &claim).await?;
            let pods = record
                .pods
                .iter()
                .map(|key| {
                    let (namespace, name) = key.split_once('/').unwrap_or(("default", key));
                    PodReference { namespace: namespace.to_string(), name: name.to_string(), uid: uids.get(key).cloned() }
                })
                .collect();
            let serverclaim = ServerClaim {
                metadata: ObjectMeta {
                    name: Some(claim.clone()),
                    labels: Some([(SERVERPOOL_LABEL.to_string(), record.pool.clone()), (SERVER_LABEL.to_string(), record.server.clone())].into()),
                    ..ObjectMeta::default()
                },
                spec: ServerClaimSpec { server: record.server.clone(), pool: record.pool.clone(), pods },
                status: None,
            };
            match self.claims_api().create(&PostParams::default(), &serverclaim).await {
                Ok(_) => {}
                // A retried create that had landed.
                Err(kube::Error::Api(status)) if status.code == 409 => {}
                Err(source) => return Err(Error::CreateClaimFailed { server: record.server.clone(), source }),
            }
            // The claim exists: a lost write of its first stage only
            // leaves it at Selected, where the driver moves it on.
            let mut status = ServerClaimStatus::default();
            timeline::enter(&mut status, Stage::Selected, record.stage_started_s, None);
            if let Err(err) = self.patch_claim_status(&claim, &status, None).await {
                tracing::warn!(%claim, error = %err, "writing the claim's first stage failed");
                self.metrics.error(err.metric_label());
            }
            Ok(())
        };
        match opened.await {
            Ok(()) => Report::Taken { claim, newly },
            Err(Error::ServerHeld { holder, .. }) => Report::Held { claim, holder },
            Err(err) => {
                // The server may stay claimed: the orphan sweep releases it
                // once the opening grace has passed.
                self.metrics.error(err.metric_label());
                Report::TakeFailed { claim, message: format!("{err:#}") }
            }
        }
    }

    fn power_failure(&self, server: &str, err: PowerError) -> PowerFailure {
        self.metrics.power_failure(err.metric_label());
        self.power_errors.lock().unwrap_or_else(PoisonError::into_inner).insert(server.to_string(), err.reason);
        PowerFailure { reason: err.reason, message: err.message }
    }

    /// Carries out [`ironclaim_driver::Effect::PowerOn`] for a claim or a
    /// spare, and tells `pods` the server is on as soon as the provider
    /// confirms it.
    ///
    /// # Guarantees
    /// A server the BMC reads off is recorded as powered on by ironclaim
    /// before the power-on is sent (and nothing is sent when that write
    /// fails): only then is it ironclaim's to power off again. One the BMC
    /// already reads on is left unrecorded: that power was not ironclaim's,
    /// and whatever runs there keeps it until a node links to the server.
    /// The power read and the power-on are one action: they share one
    /// read of the credentials Secret ([`crate::provider::one_action`]).
    pub async fn power_on(&self, server: Arc<Server>, pods: &[PodKey]) -> Report {
        crate::provider::one_action(self.power_on_in_action(server, pods)).await
    }

    async fn power_on_in_action(&self, server: Arc<Server>, pods: &[PodKey]) -> Report {
        let name = server.name_any();
        let answer = |result| Report::PoweredOn { server: name.clone(), result };
        match self.power.power_state(&server).await {
            Ok(PowerState::On | PowerState::PoweringOn) => {}
            Ok(_) => {
                let changes = server.status.as_ref().map_or(&[][..], |s| s.power_changes.as_slice());
                let changes = ironclaim_k8s::api::server::with_power_change(changes, now_s(), true);
                let patch =
                    serde_json::json!({"status": {"powerState": PowerState::PoweringOn, "poweredOnByIronclaim": true, "powerChanges": changes}});
                if let Err(source) = self.servers_api().patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    let err = Error::ServerStatusFailed { server: name.clone(), source };
                    self.metrics.error(err.metric_label());
                    let message = format!("{err:#}; not powered on until ironclaim has recorded that it did");
                    return answer(Err(PowerFailure { reason: ironclaim_driver::FailureReason::PowerActionFailed, message }));
                }
            }
            Err(err) => return answer(Err(self.power_failure(&name, err))),
        }
        let result = match self.power.power_on(&server).await {
            Ok(()) => {
                let note = timeline::powered_on_note(&name, 0, &durations_of(&server));
                for (namespace, pod, uid) in pods {
                    self.events.pod(namespace, pod, uid.as_deref(), "WaitingForServer", &note).await;
                }
                Ok(())
            }
            Err(err) => Err(self.power_failure(&name, err)),
        };
        answer(result)
    }

    /// Carries out [`ironclaim_driver::Effect::ReadPower`].
    pub async fn read_power(&self, server: Arc<Server>) -> Report {
        let name = server.name_any();
        let result = match self.power.power_state(&server).await {
            Ok(state) => Ok(state == PowerState::On),
            Err(err) => Err(self.power_failure(&name, err)),
        };
        Report::PowerRead { server: name, result }
    }

    /// Carries out [`ironclaim_driver::Effect::PowerOff`], after checking,
    /// fresh from the API, that the server's claim is still `claim`, that
    /// `node` (when given) holds no pod but DaemonSet and finished ones,
    /// and that a claim's server with no `node` named became no node;
    /// refused otherwise. A server the BMC already reads Off is not sent
    /// another power-off.
    pub async fn power_off(&self, server: &str, claim: Option<&str>, node: Option<&str>) -> Report {
        let answer = |result, refused| Report::PoweredOff { server: server.to_string(), result, refused };
        let current = match self.servers_api().get(server).await {
            Ok(s) => s,
            Err(err) => return answer(Ok(()), Some(format!("server {server} could not be read: {err}"))),
        };
        let holder = current.status.as_ref().and_then(|s| s.claim.as_deref()).filter(|c| !c.is_empty());
        if holder != claim {
            let holder = holder.unwrap_or("nothing");
            return answer(Ok(()), Some(format!("server {server} is held by {holder}, not by {}", claim.unwrap_or("nothing"))));
        }
        match self.power_off_if_safe(&current, node).await {
            Ok(refused) => answer(Ok(()), refused),
            Err(err) => answer(Err(self.power_failure(server, err)), None),
        }
    }

    /// Cuts the power of `current` (read fresh by the caller) only if
    /// nothing says it runs work, by what the API and its BMC say now:
    /// Ok(Some(why)) refuses, Ok(None) once it is off (or was).
    ///
    /// # Guarantees
    /// The Nodes are listed fresh (the index may be behind): a node on the
    /// server other than `node` (by label, provider ID or system UUID), an
    /// identity in doubt, or a server on that ironclaim did not power on
    /// and no node links to, refuses ([`identity::refuse_power_off`]). For
    /// `node`, a pod that is not a DaemonSet's or finished, or a volume
    /// still attached, refuses. A server the BMC reads off is sent nothing.
    async fn power_off_if_safe(&self, current: &Server, node: Option<&str>) -> std::result::Result<Option<String>, PowerError> {
        let server = current.metadata.name.as_deref().unwrap_or_default();
        let nodes = match Api::<Node>::all(self.client.clone()).list(&ListParams::default()).await {
            Ok(nodes) => nodes.items,
            Err(err) => return Ok(Some(format!("the nodes could not be listed: {err}"))),
        };
        if self.power.power_state(current).await? == PowerState::Off {
            return Ok(None);
        }
        let (recorded, reported) = crate::index::recorded_identity(current);
        let host = current.spec.metal3_host();
        let metal3 = |ns: &str, name: &str| host.filter(|h| h.namespace == ns && h.name == name).map(|_| server);
        let facts = identity::PowerFacts { on: true, ..crate::index::power_facts(current, false) };
        // A parked node whose kubelet is not back from a new boot runs
        // nothing (see `ironclaim_k8s::node::parking`).
        let says = nodes.iter().filter(|n| parking(n) != Parking::Parked).map(|n| crate::index::node_says_with(n, metal3));
        if let Some(why) = identity::refuse_power_off(server, recorded, reported, facts, says, node) {
            return Ok(Some(why));
        }
        if let Some(node) = node {
            match self.workload_on(node).await {
                Ok(None) => {}
                Ok(Some(pod)) => return Ok(Some(format!("node {node} still runs pod {pod}"))),
                Err(err) => return Ok(Some(format!("the pods on node {node} could not be listed: {err}"))),
            }
            match self.volume_on(node).await {
                Ok(None) => {}
                Ok(Some(volume)) => return Ok(Some(format!("node {node} still has {volume} attached"))),
                Err(err) => return Ok(Some(format!("the volume attachments could not be listed: {err}"))),
            }
        }
        self.power.power_off(current).await?;
        // Recorded once sent: the cap on power cycles a day counts it.
        let changes = current.status.as_ref().map_or(&[][..], |s| s.power_changes.as_slice());
        let patch = serde_json::json!({"status": {"powerChanges": ironclaim_k8s::api::server::with_power_change(changes, now_s(), false)}});
        if let Err(err) = self.servers_api().patch_status(server, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::warn!(%server, error = %err, "recording the power-off failed; its cap on power cycles a day may count one less");
        }
        Ok(None)
    }

    /// A volume attached to `node` or being detached from it, listed from
    /// the API: cutting the power would cut its writes short.
    async fn volume_on(&self, node: &str) -> std::result::Result<Option<String>, kube::Error> {
        use k8s_openapi::api::storage::v1::VolumeAttachment;
        let attachments = Api::<VolumeAttachment>::all(self.client.clone()).list(&ListParams::default()).await?;
        Ok(attachments.items.iter().find(|a| a.spec.node_name == node).map(|a| {
            let volume = a.spec.source.persistent_volume_name.as_deref().map_or_else(|| "an inline volume".to_string(), |pv| format!("volume {pv}"));
            format!("{volume} (VolumeAttachment {})", a.name_any())
        }))
    }

    /// The first pod on `node`, listed from the API, that is neither a
    /// DaemonSet's nor finished.
    async fn workload_on(&self, node: &str) -> std::result::Result<Option<String>, kube::Error> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let pods = Api::<Pod>::all(self.client.clone()).list(&params).await?;
        Ok(pods
            .items
            .iter()
            .find(|p| {
                let daemon = p.owner_references().iter().any(|o| o.kind == "DaemonSet");
                let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
                !daemon && !matches!(phase, Some("Succeeded" | "Failed"))
            })
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any())))
    }

    /// Writes a ServerClaim's status, on the resourceVersion it was read at
    /// when given.
    async fn patch_claim_status(&self, claim: &str, status: &ServerClaimStatus, version: Option<&str>) -> Result<()> {
        let patch = match version {
            Some(v) => serde_json::json!({"metadata": {"resourceVersion": v}, "status": status}),
            None => serde_json::json!({ "status": status }),
        };
        self.claims_api()
            .patch_status(claim, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ApplyStatusFailed { claim: claim.into(), source })?;
        Ok(())
    }

    /// Reads the ServerClaim, lets `change` edit its status, and writes it on
    /// the version read, read again on a conflict. Ok(None) when the claim
    /// is gone; otherwise the claim as read. `known` (the index's copy)
    /// stands in for the first read: a stale copy only costs a conflict
    /// and a read, and what a stale copy shows as done (a stage entered, a
    /// failure) is done, since neither is ever undone.
    async fn update_claim(
        &self,
        claim: &str,
        known: Option<ServerClaim>,
        mut change: impl FnMut(&ServerClaim, &mut ServerClaimStatus) -> bool,
    ) -> Result<Option<ServerClaim>> {
        self.ensure_acting()?;
        let mut known = known.filter(|k| k.metadata.resource_version.is_some());
        for _ in 0..5 {
            let read = match known.take() {
                Some(k) => k,
                None => match self.claims_api().get_status(claim).await {
                    Ok(c) => c,
                    Err(err) if not_found(&err) => return Ok(None),
                    Err(source) => return Err(Error::ReadFailed { what: format!("ServerClaim {claim}"), source }),
                },
            };
            let mut status = read.status.clone().unwrap_or_default();
            if !change(&read, &mut status) {
                return Ok(Some(read));
            }
            match self.patch_claim_status(claim, &status, read.metadata.resource_version.as_deref()).await {
                Ok(()) => return Ok(Some(read)),
                Err(Error::ApplyStatusFailed { source: kube::Error::Api(s), .. }) if s.code == 409 => continue,
                // Gone since the index's copy.
                Err(Error::ApplyStatusFailed { source: kube::Error::Api(s), .. }) if s.code == 404 => return Ok(None),
                Err(err) => return Err(err),
            }
        }
        Err(Error::WriteContended { what: format!("the status of ServerClaim {claim}") })
    }

    /// Carries out [`ironclaim_driver::Effect::EnterStage`]: closes the
    /// current stage, opens `stage`, sets the condition the stage confirms,
    /// and counts the stage that ended. `pods` are told where they stand.
    pub async fn enter_stage(
        &self,
        claim: &str,
        stage: ironclaim_driver::Stage,
        message: &str,
        pods: &[PodKey],
        server: Option<&Server>,
        known: Option<ServerClaim>,
    ) -> Result<()> {
        let now = now_s();
        let mut ended = None;
        let mut written = ServerClaimStatus::default();
        let read = self
            .update_claim(claim, known, |read, status| {
                if status.stage == Some(stage) || status.failure_reason.is_some() {
                    return false;
                }
                if status.stages.is_empty() && stage != Stage::Selected {
                    let created = read.metadata.creation_timestamp.as_ref().map_or(now, timeline::seconds);
                    timeline::enter(status, Stage::Selected, created, None);
                }
                ended = timeline::enter(status, stage, now, Some(message.to_string()));
                let generation = read.metadata.generation;
                match stage {
                    Stage::Booting => timeline::set_condition(
                        &mut status.conditions,
                        POWERED_ON_CONDITION,
                        true,
                        "Confirmed",
                        "the provider confirms the power is on",
                        now,
                        generation,
                    ),
                    Stage::Ready => timeline::set_condition(
                        &mut status.conditions,
                        GATES_CONDITION,
                        true,
                        "Passed",
                        "every readiness gate passed",
                        now,
                        generation,
                    ),
                    _ => {}
                }
                written = status.clone();
                true
            })
            .await?;
        let Some(read) = read else { return Ok(()) };
        if written.stage != Some(stage) {
            return Ok(());
        }
        self.record(ended, &read.spec.pool);
        match stage {
            Stage::Booting => {
                self.power_errors.lock().unwrap_or_else(PoisonError::into_inner).remove(&read.spec.server);
                if let Some(server) = server {
                    self.set_server_power(server, PowerState::On).await?;
                }
            }
            Stage::Ready => self.metrics.claim_ended("ready", ""),
            _ => {}
        }
        if matches!(stage, Stage::Joined | Stage::Ready)
            && let Some(server) = server
        {
            let note = timeline::waiting_note(&read.spec.server, &written, &durations_of(server), now);
            for (namespace, pod, uid) in pods {
                self.events.pod(namespace, pod, uid.as_deref(), "WaitingForServer", &note).await;
            }
        }
        Ok(())
    }

    /// Carries out [`ironclaim_driver::Effect::FailClaim`], and tells the
    /// claim's waiting pods it is re-planned. A claim that was never
    /// written (its take lost) is only counted.
    /// The server a claim names, read from the API; None when it cannot be read.
    pub async fn server_of_claim(&self, claim: &str) -> Option<String> {
        self.claims_api().get_opt(claim).await.ok().flatten().map(|c| c.spec.server)
    }

    pub async fn fail(
        &self,
        claim: &str,
        reason: ironclaim_driver::FailureReason,
        message: &str,
        timed_out: bool,
        pods: &[PodKey],
        known: Option<ServerClaim>,
    ) -> Result<()> {
        let now = now_s();
        let mut ended = None;
        let read = self
            .update_claim(claim, known, |_, status| {
                if status.failure_reason.is_some() {
                    return false;
                }
                ended = timeline::fail(status, reason, message.to_string(), now, timed_out);
                true
            })
            .await?;
        self.metrics.claim_ended("failed", reason.label());
        let Some(read) = read else { return Ok(()) };
        self.record(ended, &read.spec.pool);
        for (namespace, pod, uid) in pods {
            let note = format!("claim {claim} on server {} failed ({reason:?}): {message}; re-planning", read.spec.server);
            self.events.warn(namespace, pod, uid.as_deref(), "ClaimFailed", &note).await;
        }
        Ok(())
    }

    /// After a claim failed by a fault of configuration: the
    /// `BmcConfigured` condition, False, on its server and on every other
    /// Redfish server that references the same credentials Secret, so no
    /// claim moves on to the next server behind the same broken reference.
    /// The power sweep sets it True again once a read through the same
    /// configuration succeeds. Returns the servers marked and what their
    /// condition says.
    pub async fn mark_misconfigured(&self, server: &str, reason: ironclaim_driver::FailureReason, message: &str) -> Result<Vec<(String, String)>> {
        let api = self.servers_api();
        let failed = match api.get(server).await {
            Ok(s) => s,
            Err(err) if not_found(&err) => return Ok(Vec::new()),
            Err(source) => return Err(Error::ServerStatusFailed { server: server.into(), source }),
        };
        let mut marked = vec![(server.to_string(), message.to_string())];
        if reason == ironclaim_driver::FailureReason::BmcCredentialsMissing
            && let Some(bmc) = failed.spec.bmc.as_ref().filter(|_| crate::provider::uses_redfish(&failed))
        {
            let all = api.list(&ListParams::default()).await.map_err(|source| Error::ServerStatusFailed { server: server.into(), source })?;
            for other in all.items {
                let shares = other.spec.bmc.as_ref().is_some_and(|b| b.credentials_secret_ref == bmc.credentials_secret_ref);
                if other.name_any() != server && shares && crate::provider::uses_redfish(&other) {
                    marked.push((other.name_any(), format!("{message}; server {} references the same Secret", other.name_any())));
                }
            }
        }
        let word = timeline::reason_word(reason);
        let mut written = Vec::new();
        for (name, note) in marked {
            // One server's write failing does not spare the others.
            match self.set_server_condition(&name, BMC_CONFIGURED_CONDITION, false, &word, &note).await {
                Ok(()) => written.push((name, note)),
                Err(err) => tracing::warn!(server = %name, error = %err, "holding back a server whose BMC configuration is broken failed"),
            }
        }
        Ok(written)
    }

    /// Sets one condition on a server's status, on the resourceVersion read
    /// (read again on a conflict).
    async fn set_server_condition(&self, server: &str, kind: &str, ok: bool, reason: &str, message: &str) -> Result<()> {
        let api = self.servers_api();
        for _ in 0..5 {
            let mut current = match api.get_status(server).await {
                Ok(s) => s,
                Err(err) if not_found(&err) => return Ok(()),
                Err(source) => return Err(Error::ServerStatusFailed { server: server.into(), source }),
            };
            let mut status: ServerStatus = current.status.clone().unwrap_or_default();
            timeline::set_condition(&mut status.conditions, kind, ok, reason, message, now_s(), None);
            if current.status.as_ref() == Some(&status) {
                return Ok(());
            }
            current.status = Some(status);
            match api.replace_status(server, &PostParams::default(), &current).await {
                Ok(_) => return Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(source) => return Err(Error::ServerStatusFailed { server: server.into(), source }),
            }
        }
        Ok(())
    }

    /// A note about a claim becomes one of its conditions: a power-on
    /// retried names the provider's reason on `PoweredOn`; gates still
    /// unmet are listed on `GatesPassed`.
    pub async fn note_on_claim(&self, claim: &str, reason: &str, message: &str) -> Result<()> {
        let now = now_s();
        let condition = match reason {
            "PowerOnRetrying" => {
                let server = self.claims_api().get_status(claim).await.ok().map(|c| c.spec.server);
                let failure = server.and_then(|s| self.power_errors.lock().unwrap_or_else(PoisonError::into_inner).get(&s).copied());
                (POWERED_ON_CONDITION, timeline::reason_word(failure.unwrap_or(FailureReason::PowerActionFailed)))
            }
            "GatesWaiting" => (GATES_CONDITION, "Waiting".to_string()),
            _ => return Ok(()),
        };
        self.update_claim(claim, None, |read, status| {
            timeline::set_condition(&mut status.conditions, condition.0, false, &condition.1, message, now, read.metadata.generation);
            true
        })
        .await?;
        Ok(())
    }

    /// Carries out [`ironclaim_driver::Effect::DeleteClaim`].
    pub async fn delete_claim(&self, claim: &str) -> Result<()> {
        self.ensure_acting()?;
        match self.claims_api().delete(claim, &Default::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => Ok(()),
            Err(source) => Err(Error::ReadFailed { what: format!("ServerClaim {claim}"), source }),
        }
    }

    /// Carries out [`ironclaim_driver::Effect::LinkNode`]: the node on the
    /// server's and the claim's status, the pool's labels on the node.
    pub async fn link(
        &self,
        claim: &str,
        server: &str,
        node: &str,
        known_node: Option<Node>,
        pool: Option<&ServerPool>,
        known: Option<Server>,
    ) -> Result<()> {
        self.ensure_acting()?;
        let server = self.server(server, known).await?;
        let node = match known_node {
            Some(n) => n,
            None => {
                Api::<Node>::all(self.client.clone()).get(node).await.map_err(|source| Error::ReadFailed { what: format!("Node {node}"), source })?
            }
        };
        self.link_node(&server, &node, pool).await?;
        let patch = serde_json::json!({"status": {"nodeName": node.name_any()}});
        match self.claims_api().patch_status(claim, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(err) if not_found(&err) => Ok(()),
            Err(source) => Err(Error::ApplyStatusFailed { claim: claim.into(), source }),
        }
    }

    /// Carries out [`ironclaim_driver::Effect::Measure`]: folds one start's
    /// stage durations into the server's measurements and clears its
    /// failure streak.
    pub async fn measure(&self, server: &str, sample: [Seconds; 4]) -> Result<()> {
        self.ensure_acting()?;
        let current = self.server(server, None).await?;
        let tail = durations_of(&current).tail_percent;
        let measured = timeline::fold_start(current.status.as_ref().and_then(|s| s.measured_durations.as_ref()), sample, tail);
        let patch = serde_json::json!({"status": {"measuredDurations": measured, "failures": 0}});
        self.servers_api()
            .patch_status(server, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| Error::ServerStatusFailed { server: server.into(), source })?;
        Ok(())
    }

    /// Carries out [`ironclaim_driver::Effect::Release`].
    pub async fn release(&self, server: &str, claim: &str, count_failure: bool, quarantine: bool, untouched: bool) -> Result<()> {
        self.ensure_acting()?;
        let current = match self.servers_api().get(server).await {
            Ok(s) => s,
            Err(err) if not_found(&err) => return self.locks.give_up(server, claim).await,
            Err(source) => return Err(Error::ServerStatusFailed { server: server.into(), source }),
        };
        self.release_server(&current, claim, count_failure, quarantine, untouched).await
    }

    fn record(&self, ended: Option<Ended>, pool: &str) {
        if let Some((stage, took, outcome)) = ended {
            let outcome = format!("{outcome:?}");
            self.metrics.observe_stage(stage.label(), pool, &outcome.to_lowercase(), took as f64);
        }
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
        if let Some(held) = status.misconfigured() {
            return Err(Error::ServerHeld { server: server.into(), holder: format!("nothing: its BMC configuration is broken ({})", held.reason) });
        }
        if current.spec.maintenance || status.quarantined {
            return Err(Error::ServerHeld { server: server.into(), holder: "maintenance or quarantine".into() });
        }
        // On and not ironclaim's: whatever runs there is not a claim's to
        // take. (A node linked to it is no free server either: the index
        // keeps the core from choosing it.)
        if ironclaim_core::identity::unadopted(crate::index::power_facts(&current, false)).is_some() {
            return Err(Error::ServerHeld { server: server.into(), holder: "nothing ironclaim knows: the server is not adopted".into() });
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

    /// Clears the server's claim (only if `claim` still holds it), counts
    /// the failure, quarantines the server when told to, and sets the
    /// failure condition; then gives up the
    /// claim's lock, which outlives the status claim by this order.
    pub async fn release_server(&self, server: &Server, claim: &str, count_failure: bool, quarantine: bool, untouched: bool) -> Result<()> {
        if self.clear_claim(server, claim, count_failure, quarantine, untouched).await? {
            self.locks.give_up(&server.name_any(), claim).await?;
        }
        Ok(())
    }

    /// True once the server no longer names `claim`; false when five
    /// writers in a row got there first (the next pass tries again).
    async fn clear_claim(&self, server: &Server, claim: &str, count_failure: bool, quarantine: bool, untouched: bool) -> Result<bool> {
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
                if quarantine {
                    status.quarantined = true;
                }
                let message = format!("claim {claim} failed; {} failure(s) in a row", status.failures);
                timeline::set_condition(&mut status.conditions, CLAIM_FAILED_CONDITION, true, "ClaimFailed", &message, now, None);
                // A new failure restarts the backoff even when the condition was already True.
                if let Some(c) = status.conditions.iter_mut().find(|c| c.type_ == CLAIM_FAILED_CONDITION) {
                    c.last_transition_time = timeline::time(now);
                }
                status.power_state = Some(PowerState::Off);
                status.powered_on_by_ironclaim = false;
            } else if untouched && status.power_state == Some(PowerState::PoweringOn) {
                // Written when the claim was taken (the server was not on);
                // no power-on was sent since: the sweep says what it is
                // once it can read it.
                status.power_state = Some(PowerState::Unknown);
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

    /// Records the node on the server's status and gives the node its
    /// pool's labels.
    async fn link_node(&self, server: &Server, node: &Node, pool: Option<&ServerPool>) -> Result<()> {
        let node_name = node.name_any();
        let mut labels: std::collections::BTreeMap<String, String> = server.spec.labels.clone();
        if let Some(pool) = pool {
            if let Some(t) = &pool.spec.template {
                labels.extend(t.labels.clone());
            }
            labels.insert(SERVERPOOL_LABEL.to_string(), pool.name_any());
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

    /// A server whose claim no longer exists: power it off if it never
    /// became a node, and release it. Without counting a failure: the
    /// claim was removed, the server did nothing wrong.
    pub async fn release_orphan(&self, server: &Server, claim: &str, has_node: bool) -> Result<()> {
        if !has_node {
            self.power_off_unless_in_doubt(server).await?;
        }
        self.release_server(server, claim, false, false, false).await
    }

    /// Powers `server` off, read fresh, unless its BMC already reads Off or
    /// the last check refuses (a power-on nobody follows up may have
    /// reached it; a machine that runs work it cannot rule out stays on,
    /// and its Server's conditions say why).
    async fn power_off_unless_in_doubt(&self, server: &Server) -> Result<()> {
        let name = server.name_any();
        let current = self.servers_api().get(&name).await.map_err(|source| Error::ServerStatusFailed { server: name.clone(), source })?;
        match self.power_off_if_safe(&current, None).await {
            Ok(None) => Ok(()),
            Ok(Some(why)) => {
                tracing::warn!(server = %name, %why, "not powered off");
                Ok(())
            }
            Err(source) => Err(Error::PowerFailed { server: name, source }),
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
            self.power_off_unless_in_doubt(current).await?;
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_driver_gets_the_controllers_claim_settings() {
        let settings = ClaimSettings { quarantine_after: 5, failed_claim_ttl: Duration::from_secs(90), ..ClaimSettings::default() };
        let driver = settings.driver();
        assert_eq!((driver.quarantine_after, driver.failed_claim_ttl_s), (5, 90));
        assert_eq!(driver.retry, settings.retry);
    }
}
