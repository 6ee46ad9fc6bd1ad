//! Safe drains: cordon, evict, wait, and only then power off.
//!
//! # Guarantees
//! - The node is cordoned (`spec.unschedulable` and the
//!   [`DISRUPTING_TAINT`]) before the first eviction, so nothing new lands.
//! - Pods leave through the `policy/v1` Eviction API only, so every
//!   PodDisruptionBudget is enforced by the API server itself. A 429 (a
//!   budget says no, for now) is waited out and retried; the request is
//!   built here and sent once per attempt, never retried inside the client.
//! - A pod annotated `ironclaim.dev/do-not-disrupt`,
//!   `karpenter.sh/do-not-disrupt: "true"` or
//!   `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"` is never
//!   evicted: its presence abandons the drain. So does a pod no controller
//!   would recreate, unless the plan named it.
//! - Eviction order is stable: priority ascending, then namespace and name;
//!   DaemonSet pods last, once, and not waited for.
//! - Past the drain timeout the drain is abandoned and the node uncordoned;
//!   the same write stamps [`DRAIN_ABANDONED_ANNOTATION`], which holds the
//!   node back from another drain for a cool-down.
//! - The server is powered off only once its node holds no workload pod,
//!   and confirmed off before its Node is deleted and the server released.
//!
//! # Assumptions
//! The client should be built with kube's default retry off
//! (`Config::default_retry = false`): with it on, kube retries a 429 for
//! minutes inside one request. Each attempt is also bounded by
//! [`DrainSettings::attempt_timeout`], so the drain timeout holds either way.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ironclaim_core::DISRUPTING_TAINT;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::{NodeClaim, Server};
use ironclaim_k8s::pod::{DO_NOT_DISRUPT_ANNOTATION, KARPENTER_DO_NOT_DISRUPT_ANNOTATION, SAFE_TO_EVICT_ANNOTATION};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::client::Body;
use kube::{Api, Client, ResourceExt};
use tokio::time::Instant;

use crate::claims::Claims;
use crate::provider::{Power, PowerError};
use crate::scaledown::energy::ScaleDownMetrics;
use crate::scaledown::notes::{Kind, Notes};

/// Set on a node the drain found already unschedulable, so abandoning the
/// drain leaves it as it was.
pub const WAS_UNSCHEDULABLE_ANNOTATION: &str = "ironclaim.dev/was-unschedulable";
/// When the node's last drain was abandoned (RFC 3339): the node is not
/// drained again until its cool-down has passed.
pub const DRAIN_ABANDONED_ANNOTATION: &str = "ironclaim.dev/drain-abandoned-at";
/// Pods the kubelet runs from a manifest; the API cannot evict them.
const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";

#[derive(Debug, thiserror::Error)]
pub enum DrainError {
    #[error("cordoning node {node} failed")]
    CordonFailed {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("uncordoning node {node} failed")]
    UncordonFailed {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("listing the pods of node {node} failed")]
    ListPodsFailed {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("reading server {server} failed")]
    ReadServerFailed {
        server: String,
        #[source]
        source: kube::Error,
    },
    #[error("powering off server {server} failed")]
    PowerOffFailed {
        server: String,
        #[source]
        source: PowerError,
    },
    #[error("powering on server {server} failed")]
    PowerOnFailed {
        server: String,
        #[source]
        source: PowerError,
    },
    #[error("server {server} still reports {state:?} after its power-off")]
    NotConfirmedOff { server: String, state: PowerState },
    #[error("server {server} was not powered off: {why}")]
    PowerOffRefused { server: String, why: String },
    #[error("deleting node {node} failed")]
    DeleteNodeFailed {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("releasing server {server} failed")]
    ReleaseFailed {
        server: String,
        #[source]
        source: crate::Error,
    },
}

impl DrainError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            DrainError::CordonFailed { .. } => "cordon_failed",
            DrainError::UncordonFailed { .. } => "uncordon_failed",
            DrainError::ListPodsFailed { .. } => "list_pods_failed",
            DrainError::ReadServerFailed { .. } => "read_server_failed",
            DrainError::PowerOffFailed { .. } => "power_off_failed",
            DrainError::PowerOnFailed { .. } => "power_on_failed",
            DrainError::NotConfirmedOff { .. } => "power_off_not_confirmed",
            DrainError::PowerOffRefused { .. } => "power_off_refused",
            DrainError::DeleteNodeFailed { .. } => "delete_node_failed",
            DrainError::ReleaseFailed { .. } => "release_failed",
        }
    }
}

pub type Result<T, E = DrainError> = std::result::Result<T, E>;

/// How a drain paces itself.
#[derive(Clone, Debug)]
pub struct DrainSettings {
    /// The first wait after a refused eviction; doubles up to `retry_max`.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// One eviction request, at most.
    pub attempt_timeout: Duration,
    /// When the NodePool sets no `drainTimeout`.
    pub default_timeout: Duration,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings {
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(10),
            default_timeout: Duration::from_secs(600),
        }
    }
}

/// One drain to carry out.
#[derive(Clone, Debug)]
pub struct DrainRequest {
    pub node: String,
    pub server: Option<String>,
    /// Why, for the taint's value, events and metrics (`empty`, `underutilized`, `maintenance`).
    pub reason: String,
    /// Pods (`namespace/name`) the plan moves; a pod without a controller
    /// is evicted only if named here.
    pub planned: BTreeSet<String>,
    pub timeout: Duration,
    /// Power the server off and release it once drained (false for a
    /// server in maintenance: it stays as the operator left it).
    pub power_off: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DrainOutcome {
    /// Drained; if asked, powered off, its Node deleted, its server released.
    Done { evicted: usize },
    /// Given up and uncordoned.
    Abandoned { why: String },
}

/// The answer to one eviction request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Evicted {
    Yes,
    /// 429: a PodDisruptionBudget refuses for now.
    Blocked(String),
    /// 404: already gone.
    Gone,
    Failed(String),
}

/// Sends one `policy/v1` Eviction for a pod, once: the request is built
/// here so the answer (notably 429) comes back as it is.
pub async fn evict(client: &Client, namespace: &str, name: &str, timeout: Duration) -> Evicted {
    let body = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": namespace},
    });
    let path = format!("/api/v1/namespaces/{namespace}/pods/{name}/eviction");
    let request = match kube::core::Request::new(path).create(&PostParams::default(), body.to_string().into_bytes()) {
        Ok(r) => r,
        Err(err) => return Evicted::Failed(err.to_string()),
    };
    let sent = tokio::time::timeout(timeout, client.send(request.map(Body::from))).await;
    let response = match sent {
        Err(_) => return Evicted::Failed(format!("no answer within {timeout:?}")),
        Ok(Err(err)) => return Evicted::Failed(err.to_string()),
        Ok(Ok(r)) => r,
    };
    let code = response.status().as_u16();
    let text = match tokio::time::timeout(timeout, response.into_body().collect_bytes()).await {
        Ok(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        _ => String::new(),
    };
    let message = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(str::to_string))
        .unwrap_or(text);
    match code {
        200..=299 => Evicted::Yes,
        404 => Evicted::Gone,
        429 => Evicted::Blocked(message),
        _ => Evicted::Failed(format!("HTTP {code}: {message}")),
    }
}

/// Whether a pod must stay where it is, by its annotations. An
/// `ironclaim.dev/do-not-disrupt` with any value but "false" counts: a
/// typo must not make a pod evictable.
pub fn must_not_disrupt(pod: &Pod) -> bool {
    let a = pod.annotations();
    a.get(DO_NOT_DISRUPT_ANNOTATION).is_some_and(|v| v != "false")
        || a.get(KARPENTER_DO_NOT_DISRUPT_ANNOTATION).is_some_and(|v| v == "true")
        || a.get(SAFE_TO_EVICT_ANNOTATION).is_some_and(|v| v == "false")
}

fn controller_kind(pod: &Pod) -> Option<String> {
    pod.owner_references().iter().find(|o| o.controller == Some(true)).map(|o| o.kind.clone())
}

fn is_daemonset_pod(pod: &Pod) -> bool {
    controller_kind(pod).as_deref() == Some("DaemonSet")
}

fn finished(pod: &Pod) -> bool {
    matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed"))
}

fn key(pod: &Pod) -> String {
    format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any())
}

/// The pods still to leave, workload first in a stable order, then
/// DaemonSet pods.
pub fn eviction_order(pods: &[Pod]) -> (Vec<&Pod>, Vec<&Pod>) {
    let mut movable: Vec<&Pod> = pods.iter().filter(|p| !finished(p) && !p.annotations().contains_key(MIRROR_ANNOTATION)).collect();
    movable.sort_by_key(|p| (p.spec.as_ref().and_then(|s| s.priority).unwrap_or(0), key(p)));
    movable.into_iter().partition(|p| !is_daemonset_pod(p))
}

/// Cordons the node with the disrupting taint, remembering whether it
/// was already unschedulable.
pub async fn cordon(client: &Client, node: &str, reason: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let fail = |source| DrainError::CordonFailed { node: node.to_string(), source };
    for _ in 0..5 {
        let current = nodes.get(node).await.map_err(fail)?;
        let spec = current.spec.clone().unwrap_or_default();
        let mut taints = spec.taints.clone().unwrap_or_default();
        if taints.iter().any(|t| t.key == DISRUPTING_TAINT) && spec.unschedulable == Some(true) {
            return Ok(());
        }
        taints.retain(|t| t.key != DISRUPTING_TAINT);
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: DISRUPTING_TAINT.to_string(),
            value: Some(reason.to_string()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
        let mut patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"unschedulable": true, "taints": taints},
        });
        if spec.unschedulable == Some(true) {
            patch["metadata"]["annotations"] = serde_json::json!({WAS_UNSCHEDULABLE_ANNOTATION: "true"});
        }
        match nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(source) => return Err(fail(source)),
        }
    }
    Err(fail(kube::Error::Service("the node kept changing under the cordon".into())))
}

/// Removes the disrupting taint and restores schedulability as it was
/// before the drain. A node already gone is fine.
pub async fn uncordon(client: &Client, node: &str) -> Result<()> {
    uncordon_noting(client, node, None).await
}

/// [`uncordon`], recording in the same write, when given, the
/// time the drain was abandoned ([`DRAIN_ABANDONED_ANNOTATION`]).
pub async fn uncordon_noting(client: &Client, node: &str, abandoned_at: Option<jiff::Timestamp>) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let fail = |source| DrainError::UncordonFailed { node: node.to_string(), source };
    for _ in 0..5 {
        let current = match nodes.get(node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(fail(source)),
        };
        let spec = current.spec.clone().unwrap_or_default();
        let taints: Vec<_> = spec.taints.clone().unwrap_or_default().into_iter().filter(|t| t.key != DISRUPTING_TAINT).collect();
        let was = current.annotations().get(WAS_UNSCHEDULABLE_ANNOTATION).is_some_and(|v| v == "true");
        let mut patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version(), "annotations": {WAS_UNSCHEDULABLE_ANNOTATION: null}},
            "spec": {"unschedulable": was, "taints": taints},
        });
        if let Some(at) = abandoned_at {
            patch["metadata"]["annotations"][DRAIN_ABANDONED_ANNOTATION] = at.to_string().into();
        }
        match nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(fail(source)),
        }
    }
    Err(fail(kube::Error::Service("the node kept changing under the uncordon".into())))
}

/// Drops the disrupting taint but keeps the node unschedulable: the
/// drain is over, the node is the operator's.
pub async fn leave_cordoned(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let fail = |source| DrainError::UncordonFailed { node: node.to_string(), source };
    let current = match nodes.get(node).await {
        Ok(n) => n,
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
        Err(source) => return Err(fail(source)),
    };
    let taints: Vec<_> =
        current.spec.clone().unwrap_or_default().taints.unwrap_or_default().into_iter().filter(|t| t.key != DISRUPTING_TAINT).collect();
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": current.resource_version(), "annotations": {WAS_UNSCHEDULABLE_ANNOTATION: null}},
        "spec": {"unschedulable": true, "taints": taints},
    });
    nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(fail)?;
    Ok(())
}

/// Carries out drains. Cheap to share.
#[derive(Clone)]
pub struct Drainer {
    pub client: Client,
    pub power: Arc<dyn Power>,
    pub claims: Arc<Claims>,
    pub notes: Notes,
    pub metrics: ScaleDownMetrics,
    pub settings: DrainSettings,
}

impl Drainer {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Cordons the node with the disrupting taint ([`cordon`]).
    pub async fn cordon(&self, node: &str, reason: &str) -> Result<()> {
        cordon(&self.client, node, reason).await
    }

    /// Uncordons the node as it was before the drain ([`uncordon`]).
    pub async fn uncordon(&self, node: &str) -> Result<()> {
        uncordon(&self.client, node).await
    }

    /// [`uncordon_noting`].
    pub async fn uncordon_noting(&self, node: &str, abandoned_at: Option<jiff::Timestamp>) -> Result<()> {
        uncordon_noting(&self.client, node, abandoned_at).await
    }

    /// [`leave_cordoned`].
    pub async fn leave_cordoned(&self, node: &str) -> Result<()> {
        leave_cordoned(&self.client, node).await
    }

    async fn pods_on(&self, node: &str) -> Result<Vec<Pod>> {
        let params = ListParams::default().fields(&format!("spec.nodeName={node}"));
        Api::<Pod>::all(self.client.clone())
            .list(&params)
            .await
            .map(|l| l.items)
            .map_err(|source| DrainError::ListPodsFailed { node: node.to_string(), source })
    }

    async fn abandon(&self, request: &DrainRequest, why: String) -> Result<DrainOutcome> {
        self.uncordon_noting(&request.node, Some(jiff::Timestamp::now())).await?;
        self.notes.warn(Kind::Node, &request.node, "DrainAbandoned", &why).await;
        self.metrics.action("drain", &request.reason, "abandoned");
        Ok(DrainOutcome::Abandoned { why })
    }

    /// Drains one node, then (if asked) powers its server off and releases it.
    ///
    /// # Errors
    /// API or power failures; the node stays cordoned so the next pass
    /// (or a restarted controller, which uncordons drains it does not
    /// own) sees where it stands.
    pub async fn drain(&self, request: &DrainRequest) -> Result<DrainOutcome> {
        let started = Instant::now();
        let deadline = started + request.timeout;
        self.cordon(&request.node, &request.reason).await?;
        self.notes.normal(Kind::Node, &request.node, "Draining", &format!("cordoned and draining ({})", request.reason)).await;
        let mut evicted: BTreeSet<String> = BTreeSet::new();
        let mut daemonset_evicted: BTreeSet<String> = BTreeSet::new();
        let mut wait = self.settings.retry_initial;
        loop {
            let pods = self.pods_on(&request.node).await?;
            let (workload, daemonset) = eviction_order(&pods);
            let staying: Vec<&Pod> = workload.iter().copied().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
            if let Some(p) = staying.iter().find(|p| must_not_disrupt(p)) {
                return self.abandon(request, format!("pod {} must not be disrupted", key(p))).await;
            }
            if let Some(p) = staying.iter().find(|p| controller_kind(p).is_none() && !request.planned.contains(&key(p))) {
                return self.abandon(request, format!("pod {} has no controller to recreate it", key(p))).await;
            }
            if workload.is_empty() {
                for p in daemonset.iter().filter(|p| p.metadata.deletion_timestamp.is_none()) {
                    if daemonset_evicted.insert(key(p)) {
                        let answer = evict(&self.client, &p.namespace().unwrap_or_default(), &p.name_any(), self.settings.attempt_timeout).await;
                        self.metrics.eviction(answer_label(&answer));
                    }
                }
                break;
            }
            if Instant::now() >= deadline {
                let left: Vec<String> = workload.iter().map(|p| key(p)).collect();
                let why = format!("drain timed out after {}s; {} pod(s) left: {}", request.timeout.as_secs(), left.len(), left.join(", "));
                return self.abandon(request, why).await;
            }
            let mut blocked = None;
            for p in &staying {
                let answer = evict(&self.client, &p.namespace().unwrap_or_default(), &p.name_any(), self.settings.attempt_timeout).await;
                self.metrics.eviction(answer_label(&answer));
                match answer {
                    Evicted::Yes | Evicted::Gone => {
                        evicted.insert(key(p));
                    }
                    Evicted::Blocked(why) => {
                        blocked.get_or_insert_with(|| format!("eviction of {} refused: {why}", key(p)));
                    }
                    Evicted::Failed(why) => tracing::warn!(pod = %key(p), %why, "eviction failed; retrying"),
                }
            }
            if let Some(why) = &blocked {
                self.notes.normal(Kind::Node, &request.node, "DrainWaiting", why).await;
                wait = (wait * 2).min(self.settings.retry_max);
            } else {
                wait = self.settings.retry_initial;
            }
            tokio::time::sleep(wait.min(deadline.saturating_duration_since(Instant::now())).max(Duration::from_millis(50))).await;
        }
        if request.power_off
            && let Some(server) = &request.server
        {
            self.power_off_and_release(server, Some(&request.node)).await?;
        } else if let Some(server) = &request.server {
            // Maintenance: the server stays on and cordoned for the operator.
            self.release(server).await?;
            self.leave_cordoned(&request.node).await?;
        }
        let took = started.elapsed().as_secs();
        self.notes
            .normal(Kind::Node, &request.node, "Drained", &format!("drained in {took}s: {} pod(s) evicted ({})", evicted.len(), request.reason))
            .await;
        self.metrics.action("drain", &request.reason, "done");
        Ok(DrainOutcome::Done { evicted: evicted.len() })
    }

    /// Powers the server off gracefully, confirms it, deletes its Node,
    /// and releases the server from its claim.
    pub async fn power_off_and_release(&self, server_name: &str, node: Option<&str>) -> Result<()> {
        let server = Api::<Server>::all(self.client.clone())
            .get(server_name)
            .await
            .map_err(|source| DrainError::ReadServerFailed { server: server_name.to_string(), source })?;
        self.power_off_confirmed(&server, node).await?;
        if let Some(node) = node {
            match self.nodes().delete(node, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(source) => return Err(DrainError::DeleteNodeFailed { node: node.to_string(), source }),
            }
        }
        self.release(server_name).await?;
        self.notes.normal(Kind::Server, server_name, "PoweredOff", "powered off and released").await;
        Ok(())
    }

    /// Powers off through the last check every power-off passes
    /// ([`Claims::power_off`]: the claim still the server's, no node on it
    /// but `node`, no workload pod or volume on `node`, its identity and
    /// adoption not in doubt), and reads the state back.
    pub async fn power_off_confirmed(&self, server: &Server, node: Option<&str>) -> Result<()> {
        let name = server.name_any();
        let holder = server.status.as_ref().and_then(|s| s.claim.as_deref()).filter(|c| !c.is_empty());
        match self.claims.power_off(&name, holder, node).await {
            ironclaim_driver::Report::PoweredOff { refused: Some(why), .. } => return Err(DrainError::PowerOffRefused { server: name, why }),
            ironclaim_driver::Report::PoweredOff { result: Err(failure), .. } => {
                return Err(DrainError::PowerOffRefused { server: name, why: failure.message });
            }
            _ => {}
        }
        let state = self.power.power_state(server).await.map_err(|source| DrainError::PowerOffFailed { server: name.clone(), source })?;
        if state != PowerState::Off {
            return Err(DrainError::NotConfirmedOff { server: name, state });
        }
        let patch = serde_json::json!({"status": {"powerState": PowerState::Off}});
        if let Err(err) = Api::<Server>::all(self.client.clone()).patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::warn!(server = %name, error = %err, "writing the power state failed; the sweep will");
        }
        Ok(())
    }

    /// Ends the server's claim (the NodeClaim is deleted) and clears the
    /// claim and node from its status.
    pub async fn release(&self, server_name: &str) -> Result<()> {
        let servers: Api<Server> = Api::all(self.client.clone());
        let server = servers.get(server_name).await.map_err(|source| DrainError::ReadServerFailed { server: server_name.to_string(), source })?;
        let status = server.status.clone().unwrap_or_default();
        if let Some(claim) = status.claim.clone().filter(|c| !c.is_empty()) {
            match Api::<NodeClaim>::all(self.client.clone()).delete(&claim, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(err) => tracing::warn!(%claim, error = %err, "deleting the claim failed; the sweep releases its server"),
            }
            self.claims
                .release_server(&server, &claim, false, false)
                .await
                .map_err(|source| DrainError::ReleaseFailed { server: server_name.to_string(), source })?;
        } else if status.node.is_some() {
            let patch = serde_json::json!({"status": {"node": null}});
            servers
                .patch_status(server_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| DrainError::ReadServerFailed { server: server_name.to_string(), source })?;
        }
        Ok(())
    }
}

fn answer_label(answer: &Evicted) -> &'static str {
    match answer {
        Evicted::Yes => "evicted",
        Evicted::Blocked(_) => "blocked",
        Evicted::Gone => "gone",
        Evicted::Failed(_) => "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, priority: i32, owner: Option<&str>, annotations: serde_json::Value) -> Pod {
        let owners = owner.map(|kind| json!([{"apiVersion": "apps/v1", "kind": kind, "name": "o", "uid": "u", "controller": true}]));
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": annotations, "ownerReferences": owners.unwrap_or(json!([]))},
            "spec": {"containers": [], "priority": priority},
        }))
        .expect("pod")
    }

    #[test]
    fn workload_goes_first_by_priority_then_name_and_daemonset_pods_last() {
        let pods = vec![
            pod("b", 0, Some("ReplicaSet"), json!({})),
            pod("ds", -100, Some("DaemonSet"), json!({})),
            pod("a", 0, Some("ReplicaSet"), json!({})),
            pod("low", -5, Some("ReplicaSet"), json!({})),
            pod("mirror", -10, None, json!({"kubernetes.io/config.mirror": "x"})),
        ];
        let (workload, daemonset) = eviction_order(&pods);
        let names: Vec<String> = workload.iter().map(|p| p.name_any()).collect();
        assert_eq!(names, ["low", "a", "b"]);
        assert_eq!(daemonset.iter().map(|p| p.name_any()).collect::<Vec<_>>(), ["ds"]);
    }

    #[test]
    fn every_do_not_disrupt_spelling_holds_a_pod_and_a_typo_does_too() {
        let held = |a: serde_json::Value| must_not_disrupt(&pod("p", 0, Some("ReplicaSet"), a));
        assert!(held(json!({"ironclaim.dev/do-not-disrupt": "true"})));
        assert!(held(json!({"ironclaim.dev/do-not-disrupt": "yes"})));
        assert!(held(json!({"karpenter.sh/do-not-disrupt": "true"})));
        assert!(held(json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "false"})));
        assert!(!held(json!({"ironclaim.dev/do-not-disrupt": "false"})));
        assert!(!held(json!({"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"})));
        assert!(!held(json!({})));
    }
}
