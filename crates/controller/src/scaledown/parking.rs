//! Parked nodes: a ServerPool with `disruption.nodeAfterPowerOff: Park`
//! keeps the Node of a server powered off, instead of deleting it.
//!
//! Parking, once the power-off is confirmed ([`park`]):
//! - the node's boot ID and the time are recorded in annotations
//!   ([`PARKED_BOOT_ID_ANNOTATION`], [`PARKED_AT_ANNOTATION`]) and it is
//!   labelled [`PARKED_LABEL`];
//! - it stays unschedulable; the disrupting taint goes, as the drain is
//!   over, and the taint `node.kubernetes.io/out-of-service=nodeshutdown`
//!   (NoExecute) comes, so that no pod, DaemonSet pods included, stays
//!   bound to a node whose kubelet is off;
//! - its status carries the condition `Suspended=True`, which Cluster
//!   Autoscaler (1.36+) counts as suspended rather than unready;
//! - its Cluster API Machine, when it has one, is annotated
//!   [`SKIP_REMEDIATION_ANNOTATION`], so that a MachineHealthCheck does
//!   not remediate a machine that is off on purpose.
//!
//! While parked the index counts the node as none: its server is off and
//! free, as if the node had been deleted (see
//! [`ironclaim_k8s::node::parking`]). When the server boots again and the
//! kubelet reports Ready with a new boot ID, the node is back: [`unpark`]
//! sets `Suspended=False`, restores schedulability as it was before the
//! drain, takes the Machine's annotation off, and clears the marks last,
//! so that a pass cut short is finished by the next one.

use ironclaim_core::DISRUPTING_TAINT;
use ironclaim_k8s::node::{
    CLUSTER_NAMESPACE_ANNOTATION, MACHINE_ANNOTATION, PARKED_AT_ANNOTATION, PARKED_BOOT_ID_ANNOTATION, PARKED_LABEL, Parking, SERVER_LABEL,
    SKIP_REMEDIATION_ANNOTATION, SUSPENDED_CONDITION, parking,
};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::drain::{DrainError, Result, WAS_UNSCHEDULABLE_ANNOTATION};

/// Kubernetes' taint for a node whose machine is shut down: pods without
/// a toleration are deleted from it and their volumes detached, and
/// DaemonSet pods are not put back on it, so nothing stays bound to a node
/// whose kubelet cannot answer. On while parked.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";
pub const OUT_OF_SERVICE_VALUE: &str = "nodeshutdown";

/// The reason of the `Suspended` condition while parked, and once back.
pub const PARKED_REASON: &str = "PoweredOff";
pub const RESUMED_REASON: &str = "PoweredOn";

fn fail(node: &str) -> impl Fn(kube::Error) -> DrainError + '_ {
    move |source| DrainError::ParkFailed { node: node.to_string(), source }
}

/// Parks `node`, whose server `server` was confirmed off. A node already
/// gone is fine; one already parked is left as it is.
pub async fn park(client: &Client, node: &str, server: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let Some(current) = nodes.get_opt(node).await.map_err(fail(node))? else { return Ok(()) };
        if parking(&current) != Parking::No {
            return Ok(());
        }
        let boot_id = current.status.as_ref().and_then(|s| s.node_info.as_ref()).map_or("", |i| i.boot_id.as_str());
        let mut taints: Vec<_> = current
            .spec
            .clone()
            .unwrap_or_default()
            .taints
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key != DISRUPTING_TAINT && t.key != OUT_OF_SERVICE_TAINT)
            .collect();
        taints.push(Taint {
            key: OUT_OF_SERVICE_TAINT.into(),
            value: Some(OUT_OF_SERVICE_VALUE.into()),
            effect: "NoExecute".into(),
            time_added: None,
        });
        let now = jiff::Timestamp::now().to_string();
        let patch = json!({
            "metadata": {
                "resourceVersion": current.resource_version(),
                "labels": {PARKED_LABEL: "true"},
                "annotations": {PARKED_AT_ANNOTATION: now, PARKED_BOOT_ID_ANNOTATION: boot_id},
            },
            "spec": {"unschedulable": true, "taints": taints},
        });
        match nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(fail(node)(source)),
        }
        return finish(client, node, Some(server)).await;
    }
    Err(fail(node)(kube::Error::Service("the node kept changing under the write".into())))
}

/// Writes what parking tells others, once the marks are on: `Suspended=True`
/// and the Machine's skip-remediation. Also finishes a park a failed write
/// cut short ([`unfinished`]).
pub async fn finish(client: &Client, node: &str, server: Option<&str>) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(current) = nodes.get_opt(node).await.map_err(fail(node))? else { return Ok(()) };
    let server = server.map_or_else(|| current.labels().get(SERVER_LABEL).cloned().unwrap_or_else(|| "its server".into()), str::to_string);
    let message = format!("{server} powered off by ironclaim; the node is kept until the server boots again");
    suspended(&nodes, node, true, PARKED_REASON, &message).await?;
    if let Some((namespace, machine)) = machine_of(&current) {
        skip_remediation(client, &namespace, &machine, true).await;
    }
    Ok(())
}

/// Parked nodes whose `Suspended=True` a failed write left out.
pub fn unfinished(nodes: &std::collections::BTreeMap<String, Box<Node>>) -> Vec<String> {
    nodes
        .iter()
        .filter(|(_, n)| parking(n) == Parking::Parked)
        .filter(|(_, n)| {
            !n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == SUSPENDED_CONDITION && c.status == "True"))
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// Brings back `node` once its kubelet is back from a new boot
/// ([`Parking::Back`]); any other node is left as it is.
pub async fn unpark(client: &Client, node: &str) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for _ in 0..5 {
        let Some(current) = nodes.get_opt(node).await.map_err(fail(node))? else { return Ok(()) };
        if parking(&current) != Parking::Back {
            return Ok(());
        }
        suspended(&nodes, node, false, RESUMED_REASON, "the server booted again and its kubelet is back").await?;
        if let Some((namespace, machine)) = machine_of(&current) {
            skip_remediation(client, &namespace, &machine, false).await;
        }
        let was = current.annotations().get(WAS_UNSCHEDULABLE_ANNOTATION).is_some_and(|v| v == "true");
        let taints: Vec<_> =
            current.spec.clone().unwrap_or_default().taints.unwrap_or_default().into_iter().filter(|t| t.key != OUT_OF_SERVICE_TAINT).collect();
        let patch = json!({
            "metadata": {
                "resourceVersion": current.resource_version(),
                "labels": {PARKED_LABEL: null},
                "annotations": {PARKED_AT_ANNOTATION: null, PARKED_BOOT_ID_ANNOTATION: null, WAS_UNSCHEDULABLE_ANNOTATION: null},
            },
            "spec": {"unschedulable": was, "taints": taints},
        });
        match nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(()),
            Err(source) => return Err(fail(node)(source)),
        }
    }
    Err(fail(node)(kube::Error::Service("the node kept changing under the write".into())))
}

/// Writes the node's `Suspended` condition (merged by type with the
/// kubelet's own conditions).
async fn suspended(nodes: &Api<Node>, node: &str, on: bool, reason: &str, message: &str) -> Result<()> {
    let now = jiff::Timestamp::now().to_string();
    let condition = json!({
        "type": SUSPENDED_CONDITION, "status": if on { "True" } else { "False" }, "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": now,
    });
    let patch = json!({"status": {"conditions": [condition]}});
    match nodes.patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch)).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(fail(node)(source)),
    }
}

/// The Cluster API Machine that made `node`, as (namespace, name).
fn machine_of(node: &Node) -> Option<(String, String)> {
    let a = node.metadata.annotations.as_ref()?;
    Some((a.get(CLUSTER_NAMESPACE_ANNOTATION)?.clone(), a.get(MACHINE_ANNOTATION)?.clone()))
}

/// Puts on or takes off the Machine's skip-remediation annotation. Best
/// effort: where Cluster API is not installed, or the Machine is gone,
/// there is no health check to keep off; a failure is logged.
async fn skip_remediation(client: &Client, namespace: &str, machine: &str, on: bool) {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &crate::cluster_api::machine_resource());
    let value = if on { json!("") } else { json!(null) };
    let patch = json!({"metadata": {"annotations": {SKIP_REMEDIATION_ANNOTATION: value}}});
    match api.patch(machine, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(err) => tracing::warn!(%namespace, %machine, error = %err, "marking the Machine of a parked node failed"),
    }
}

/// The parked nodes whose kubelets are back, to unpark.
pub fn back(nodes: &std::collections::BTreeMap<String, Box<Node>>) -> Vec<String> {
    nodes.iter().filter(|(_, n)| parking(n) == Parking::Back).map(|(name, _)| name.clone()).collect()
}
