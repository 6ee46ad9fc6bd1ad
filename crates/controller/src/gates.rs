//! Readiness gates: when a registered node counts as ready for its pods.
//!
//! Kubelet Ready alone is too early for CNI, storage or GPU drivers. A
//! ServerPool's `spec.readiness` adds: labels present, extended resources
//! advertised with a non-zero amount, the pool's startup taints removed,
//! and named node conditions True.

use ironclaim_k8s::api::serverclaim::Stage;
use ironclaim_k8s::api::{ServerClaim, ServerPool};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

/// Whether a claim has passed its gates (Ready or further).
pub fn claim_passed_gates(claim: &ServerClaim) -> bool {
    matches!(claim.status.as_ref().and_then(|s| s.stage), Some(Stage::Ready | Stage::Serving))
}

/// The gates a node has not passed yet, in the order they are checked;
/// empty when it is ready for its pods.
pub fn unmet(node: &Node, pool: Option<&ServerPool>) -> Vec<String> {
    let mut unmet = Vec::new();
    let status = node.status.as_ref();
    let condition_true =
        |kind: &str| status.and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == kind && c.status == "True"));
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if !condition_true("Ready") {
        unmet.push("node Ready".to_string());
    } else if let Some(t) = taints.iter().find(|t| t.effect == "NoSchedule" && ironclaim_core::predicates::LIFECYCLE_TAINTS.contains(&t.key.as_str()))
    {
        // The node lifecycle controller lifts it after the condition turns,
        // seconds later or minutes on a busy control plane; until then
        // kube-scheduler places no pod there, and the claim stays in
        // flight for its pods rather than leave them to open another.
        unmet.push(format!("node Ready (its {} taint is not lifted yet)", t.key));
    }
    let Some(gates) = pool.and_then(|p| p.spec.readiness.as_ref()) else {
        return unmet;
    };
    let labels = node.labels();
    for label in &gates.labels {
        if !labels.contains_key(label) {
            unmet.push(format!("label {label}"));
        }
    }
    let allocatable = status.and_then(|s| s.allocatable.as_ref());
    for resource in &gates.extended_resources {
        let advertised = allocatable.and_then(|a| a.get(resource)).and_then(|q| q.0.trim().parse::<f64>().ok()).is_some_and(|v| v > 0.0);
        if !advertised {
            unmet.push(format!("{resource} advertised"));
        }
    }
    if gates.startup_taints_removed {
        let startup = pool.and_then(|p| p.spec.template.as_ref()).map(|t| t.startup_taints.as_slice()).unwrap_or_default();
        for t in startup {
            if taints.iter().any(|n| n.key == t.key) {
                unmet.push(format!("startup taint {} removed", t.key));
            }
        }
    }
    for kind in &gates.node_conditions {
        if !condition_true(kind) {
            unmet.push(format!("condition {kind}"));
        }
    }
    unmet
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(ready: &str, taints: serde_json::Value) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": "r1-u01"},
            "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready}]}
        }))
        .expect("node")
    }

    #[test]
    fn a_ready_node_still_carrying_the_lifecycle_taint_has_not_passed_the_ready_gate() {
        assert!(unmet(&node("True", json!([])), None).is_empty());
        assert_eq!(unmet(&node("False", json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}])), None), ["node Ready"]);
        // Ready, but the node lifecycle controller has not lifted its taint
        // yet (it lags on a busy control plane): kube-scheduler places
        // nothing there, so the claim's pods are still its own to wait for.
        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
            let lagging = node("True", json!([{"key": key, "effect": "NoSchedule"}]));
            assert_eq!(unmet(&lagging, None), [format!("node Ready (its {key} taint is not lifted yet)")]);
        }
        // Its NoExecute twin is tolerated by every pod the API server
        // admits (for 300 s), and another taint is the pool's business.
        let tolerated = node("True", json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}, {"key": "x", "effect": "NoSchedule"}]));
        assert!(unmet(&tolerated, None).is_empty());
    }
}
