//! The API writes of a drain, which the driver's drain
//! ([`ironclaim_driver::drain`]) decides and the executor carries out:
//! cordon, evict, uncordon, leave cordoned; and the power-off and release
//! of a stranded server.
//!
//! # Guarantees
//! - A node is cordoned with `spec.unschedulable` and the
//!   [`DISRUPTING_TAINT`], remembering whether it was unschedulable before,
//!   so uncordoning leaves it as it was.
//! - Pods leave through the `policy/v1` Eviction API only, so every
//!   PodDisruptionBudget is enforced by the API server itself: a 429 comes
//!   back as [`Evicted::Blocked`], for the drain to wait out. The request is
//!   built here and sent once per attempt, never retried inside the client.
//! - An abandoned drain's uncordon stamps [`DRAIN_ABANDONED_ANNOTATION`] in
//!   the same write, which holds the node back from another drain for a
//!   cool-down.
//! - A server is powered off only through [`Claims::power_off`]'s last
//!   check, and confirmed off before its Node is deleted and it is
//!   released.
//!
//! # Assumptions
//! The client should be built with kube's default retry off
//! (`Config::default_retry = false`): with it on, kube retries a 429 for
//! minutes inside one request. Each attempt is also bounded by
//! [`DrainSettings::attempt_timeout`].

use std::sync::Arc;
use std::time::Duration;

use ironclaim_core::DISRUPTING_TAINT;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::{Server, ServerClaim};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::client::Body;
use kube::{Api, Client, ResourceExt};

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
    #[error("parking node {node} (or bringing it back) failed")]
    ParkFailed {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("marking node {node} as a warm spare (or no longer one) failed")]
    MarkFailed {
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
            DrainError::MarkFailed { .. } => "mark_failed",
            DrainError::ParkFailed { .. } => "park_failed",
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
    /// When the ServerPool sets no `drainTimeout`.
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

/// Puts on (`on`) or takes off one of ironclaim's soft taints (`key`,
/// `PreferNoSchedule`), leaving every other taint as it is. A node already
/// gone, or already so, is fine.
pub async fn mark(client: &Client, node: &str, key: &str, on: bool) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let fail = |source| DrainError::MarkFailed { node: node.to_string(), source };
    for _ in 0..5 {
        let current = match nodes.get(node).await {
            Ok(n) => n,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(fail(source)),
        };
        let mut taints = current.spec.clone().unwrap_or_default().taints.unwrap_or_default();
        if taints.iter().any(|t| t.key == key) == on {
            return Ok(());
        }
        taints.retain(|t| t.key != key);
        if on {
            taints.push(k8s_openapi::api::core::v1::Taint { key: key.to_string(), value: None, effect: "PreferNoSchedule".into(), time_added: None });
        }
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"taints": taints},
        });
        match nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(fail(source)),
        }
    }
    Err(fail(kube::Error::Service("the node kept changing under the write".into())))
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

/// Powers a stranded server off through the last check and releases it.
/// Cheap to share.
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
    /// Powers the server off gracefully, confirms it, deletes its Node,
    /// and releases the server from its claim.
    pub async fn power_off_and_release(&self, server_name: &str, node: Option<&str>) -> Result<()> {
        let server = Api::<Server>::all(self.client.clone())
            .get(server_name)
            .await
            .map_err(|source| DrainError::ReadServerFailed { server: server_name.to_string(), source })?;
        self.power_off_confirmed(&server, node).await?;
        if let Some(node) = node {
            match Api::<Node>::all(self.client.clone()).delete(node, &DeleteParams::default()).await {
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

    /// Ends the server's claim (the ServerClaim is deleted) and clears the
    /// claim and node from its status.
    pub async fn release(&self, server_name: &str) -> Result<()> {
        let servers: Api<Server> = Api::all(self.client.clone());
        let server = servers.get(server_name).await.map_err(|source| DrainError::ReadServerFailed { server: server_name.to_string(), source })?;
        let status = server.status.clone().unwrap_or_default();
        if let Some(claim) = status.claim.clone().filter(|c| !c.is_empty()) {
            match Api::<ServerClaim>::all(self.client.clone()).delete(&claim, &DeleteParams::default()).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(err) => tracing::warn!(%claim, error = %err, "deleting the claim failed; the sweep releases its server"),
            }
            self.claims
                .release_server(&server, &claim, false, false, false)
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
