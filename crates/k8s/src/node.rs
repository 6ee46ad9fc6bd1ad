//! Nodes and PodDisruptionBudgets as the core sees them.

use crate::error::{ConvertError, Result};
use crate::resources::Amounts;
use crate::selector::{label_selector, taint};
use ironclaim_core::labels::HOSTNAME;
use ironclaim_core::model::PodPhase;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::policy::v1 as policy;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

/// The label that names the inventory Server behind a node, set by the
/// machine's bootstrap.
pub const SERVER_LABEL: &str = "ironclaim.dev/server";
/// The label that names the Server a Cluster API Machine was taken for:
/// ironclaim puts it on the Machine, and Cluster API's Machine controller
/// copies labels of the `node.cluster.x-k8s.io/` domain onto the Machine's
/// Node, where it links the node to its server as [`SERVER_LABEL`] does.
pub const CLUSTER_API_SERVER_LABEL: &str = "node.cluster.x-k8s.io/ironclaim-server";
/// On a Node, `"true"`: Karpenter's, keep it from consolidation.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";
/// On a Node, `"true"`: Cluster Autoscaler's, never scale it down.
pub const SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";

/// On a parked Node: when its server was confirmed off and the node kept
/// (RFC 3339).
pub const PARKED_AT_ANNOTATION: &str = "ironclaim.dev/parked-at";
/// On a parked Node: the kubelet's `status.nodeInfo.bootID` when it was
/// parked. A different boot ID, reported Ready, is the kubelet back from a
/// new boot.
pub const PARKED_BOOT_ID_ANNOTATION: &str = "ironclaim.dev/parked-boot-id";
/// On a parked Node, `"true"`: for selectors (`kubectl get nodes -l
/// ironclaim.dev/parked`).
pub const PARKED_LABEL: &str = "ironclaim.dev/parked";
/// The Node condition a parked node carries, `True` while parked: Cluster
/// Autoscaler (1.36+) counts such a node as suspended, not unready.
pub const SUSPENDED_CONDITION: &str = "Suspended";
/// On a Cluster API Machine: its MachineHealthCheck leaves it alone. Put
/// on the Machine of a parked node, taken off when it is back.
pub const SKIP_REMEDIATION_ANNOTATION: &str = "cluster.x-k8s.io/skip-remediation";
/// On a Node Cluster API made: the name and namespace of its Machine.
pub const MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/machine";
pub const CLUSTER_NAMESPACE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-namespace";

/// Where a node stands with parking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parking {
    /// Not parked.
    No,
    /// Parked: its server was powered off and the node kept. It counts as
    /// no node (its server is off and free) until the kubelet is back.
    Parked,
    /// Parked, and its kubelet reports from a new boot (a boot ID other than
    /// the one recorded when it was parked), not Ready yet: a node again,
    /// whose machine runs, though it is not yet brought back.
    Booted,
    /// Parked, and its kubelet is back from a new boot and Ready: a node
    /// again, its parking marks to be cleared.
    Back,
}

/// The node's condition of type `kind` when its status is `True`: the one
/// place the Ready condition and readiness gates are read.
pub fn true_condition<'n>(node: &'n k8s::Node, kind: &str) -> Option<&'n k8s::NodeCondition> {
    node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == kind && c.status == "True")
}

/// Where `node` stands with parking.
///
/// # Guarantees
/// - Only a node marked [`PARKED_AT_ANNOTATION`] is parked.
/// - It stays [`Parking::Parked`] (no node) only while it reports no boot
///   ID other than [`PARKED_BOOT_ID_ANNOTATION`]: any other non-empty one
///   is a machine that booted again, a node whatever its Ready condition,
///   so nothing that runs is hidden. A Ready condition left from before
///   the power-off (the node lifecycle controller marks it Unknown only
///   after its grace period) never counts, and nothing depends on clocks.
/// - It is [`Parking::Back`] once that new boot is Ready.
pub fn parking(node: &k8s::Node) -> Parking {
    let annotations = node.metadata.annotations.as_ref();
    if annotations.and_then(|a| a.get(PARKED_AT_ANNOTATION)).is_none() {
        return Parking::No;
    }
    let recorded = annotations.and_then(|a| a.get(PARKED_BOOT_ID_ANNOTATION)).map_or("", String::as_str);
    let status = node.status.as_ref();
    let boot_id = status.and_then(|s| s.node_info.as_ref()).map_or("", |i| i.boot_id.trim());
    let ready = true_condition(node, "Ready").is_some();
    match (boot_id.is_empty() || boot_id == recorded.trim(), ready) {
        (true, _) => Parking::Parked,
        (false, false) => Parking::Booted,
        (false, true) => Parking::Back,
    }
}

/// Converts a Node.
///
/// # Guarantees
/// - `allocatable` is `status.allocatable`, or `status.capacity` when the
///   node reports no allocatable.
/// - `ready` follows the Ready condition; a node that reports no conditions
///   at all (a hand-written manifest) counts as ready.
/// - The node carries `kubernetes.io/hostname` (its name when unset) and
///   its `server` is the `ironclaim.dev/server` label.
/// - `do_not_disrupt` when `karpenter.sh/do-not-disrupt` or
///   `cluster-autoscaler.kubernetes.io/scale-down-disabled` is `"true"`.
///
/// # Errors
/// The first field that cannot be read, with its path.
pub fn node_from_k8s(node: &k8s::Node) -> Result<ironclaim_core::Node> {
    let name = node.metadata.name.clone().ok_or(ConvertError::Missing { path: "metadata.name".into() })?;
    let mut labels = node.metadata.labels.clone().unwrap_or_default();
    labels.entry(HOSTNAME.to_string()).or_insert_with(|| name.clone());
    let spec = node.spec.as_ref();
    let taints: Vec<ironclaim_core::Taint> = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(i, t)| taint(t, &format!("spec.taints[{i}]")))
        .collect::<Result<_>>()?;
    let status = node.status.as_ref();
    let allocatable = match (status.and_then(|s| s.allocatable.as_ref()), status.and_then(|s| s.capacity.as_ref())) {
        (Some(list), _) => Amounts::parse(Some(list), "status.allocatable")?,
        (None, Some(list)) => Amounts::parse(Some(list), "status.capacity")?,
        (None, None) => Amounts::default(),
    };
    let ready = status.and_then(|s| s.conditions.as_ref()).is_none() || true_condition(node, "Ready").is_some();
    let says = |key: &str| node.metadata.annotations.as_ref().and_then(|a| a.get(key)).is_some_and(|v| v == "true");
    Ok(ironclaim_core::Node {
        do_not_disrupt: says(KARPENTER_DO_NOT_DISRUPT) || says(SCALE_DOWN_DISABLED),
        disrupting: taints.iter().any(|t| t.key == ironclaim_core::DISRUPTING_TAINT),
        server: labels.get(SERVER_LABEL).or_else(|| labels.get(CLUSTER_API_SERVER_LABEL)).cloned(),
        name,
        labels: labels.into(),
        taints,
        allocatable: allocatable.to_resources(true),
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
    })
}

/// Whether a pod counts as healthy for a PodDisruptionBudget: running, not
/// terminating, and Ready (or reporting no conditions).
pub fn pod_is_healthy(pod: &k8s::Pod) -> bool {
    let status = pod.status.as_ref();
    pod.metadata.deletion_timestamp.is_none()
        && status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status.and_then(|s| s.conditions.as_ref()).is_none_or(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Converts a PodDisruptionBudget. `pods` are the pods it may select, with
/// whether each is healthy; they are read only when the budget has no
/// status to take `disruptionsAllowed` from.
///
/// # Guarantees
/// - A budget without a selector selects no pods (policy/v1) and gives
///   `None`: it constrains nothing.
/// - Without a status, `disruptionsAllowed` is computed as the disruption
///   controller does: the expected count is the number of matching pods
///   not finished, percentages round up, and the result is the healthy
///   matching pods above the desired floor, never negative.
///
/// # Errors
/// An unreadable selector, or an unreadable `minAvailable`/`maxUnavailable`.
pub fn pdb_from_k8s(pdb: &policy::PodDisruptionBudget, pods: &[(&ironclaim_core::Pod, bool)]) -> Result<Option<ironclaim_core::PodDisruptionBudget>> {
    let name = pdb.metadata.name.clone().ok_or(ConvertError::Missing { path: "metadata.name".into() })?;
    let namespace = pdb.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
    let Some(spec) = pdb.spec.as_ref() else {
        return Ok(None);
    };
    let Some(selector) = spec.selector.as_ref() else {
        return Ok(None);
    };
    let selector = label_selector(selector, "spec.selector")?;
    let disruptions_allowed = match pdb.status.as_ref().and_then(|s| s.disruptions_allowed) {
        Some(allowed) => i64::from(allowed.max(0)),
        None => {
            let matching: Vec<bool> = pods
                .iter()
                .filter(|(p, _)| {
                    p.namespace == namespace && !matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed) && selector.matches(&p.labels)
                })
                .map(|(_, healthy)| *healthy)
                .collect();
            let expected = matching.len() as i64;
            let healthy = matching.iter().filter(|h| **h).count() as i64;
            let desired_healthy = match (&spec.max_unavailable, &spec.min_available) {
                (Some(max), _) => expected - scaled(max, expected, "spec.maxUnavailable")?,
                (None, Some(min)) => scaled(min, expected, "spec.minAvailable")?,
                (None, None) => 0,
            };
            (healthy - desired_healthy).max(0)
        }
    };
    Ok(Some(ironclaim_core::PodDisruptionBudget { namespace, name, selector, disruptions_allowed }))
}

/// An integer, or a percentage of `total` rounded up, as the disruption
/// controller reads `minAvailable` and `maxUnavailable`.
fn scaled(value: &IntOrString, total: i64, path: &str) -> Result<i64> {
    match value {
        IntOrString::Int(n) if *n >= 0 => Ok(i64::from(*n)),
        IntOrString::Int(n) => Err(ConvertError::invalid(path.to_string(), format!("must not be negative, found {n}"))),
        IntOrString::String(s) => {
            let percent =
                s.strip_suffix('%').and_then(|p| p.parse::<i64>().ok()).filter(|p| (0..=100).contains(p)).ok_or_else(|| {
                    ConvertError::invalid(path.to_string(), format!("expected an integer or a percentage like \"50%\", found {s:?}"))
                })?;
            Ok((percent * total + 99) / 100)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(annotations: serde_json::Value) -> k8s::Node {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "n1", "annotations": annotations}})).expect("node")
    }

    #[test]
    fn a_parked_node_is_back_only_ready_from_another_boot() {
        let at = |boot: &str, ready: &str, recorded: Option<&str>| {
            let mut annotations = serde_json::json!({});
            if let Some(r) = recorded {
                annotations = serde_json::json!({PARKED_AT_ANNOTATION: "2026-01-05T12:00:00Z", PARKED_BOOT_ID_ANNOTATION: r});
            }
            let n: k8s::Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n1", "annotations": annotations},
                "status": {"conditions": [{"type": "Ready", "status": ready}],
                           "nodeInfo": {"bootID": boot, "systemUUID": "", "machineID": "", "kernelVersion": "", "osImage": "",
                                        "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                                        "operatingSystem": "linux", "architecture": "amd64"}}
            }))
            .expect("node");
            parking(&n)
        };
        assert_eq!(at("b1", "True", None), Parking::No);
        assert_eq!(at("b1", "True", Some("b1")), Parking::Parked, "Ready left from before the power-off");
        assert_eq!(at("b2", "Unknown", Some("b1")), Parking::Booted, "a new boot not Ready yet: a node, not yet back");
        assert_eq!(at("b2", "True", Some("b1")), Parking::Back);
        assert_eq!(at("", "True", Some("")), Parking::Parked, "a kubelet that reports no boot ID never comes back by itself");
        assert_eq!(at("b1", "True", Some("")), Parking::Back);
    }

    #[test]
    fn a_node_says_do_not_disrupt_in_karpenters_or_cluster_autoscalers_words() {
        let says = |a: serde_json::Value| node_from_k8s(&node(a)).expect("converts").do_not_disrupt;
        assert!(says(serde_json::json!({KARPENTER_DO_NOT_DISRUPT: "true"})));
        assert!(says(serde_json::json!({SCALE_DOWN_DISABLED: "true"})));
        assert!(!says(serde_json::json!({KARPENTER_DO_NOT_DISRUPT: "false", SCALE_DOWN_DISABLED: "false"})));
        assert!(!says(serde_json::json!({})));
    }
}
