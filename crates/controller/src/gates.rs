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

/// On a node whose Ready condition is True, the NoSchedule taint the node
/// lifecycle controller keeps on it until it catches up: it lifts it
/// seconds after the condition turns, minutes on a busy control plane, and
/// until then kube-scheduler places no pod there. The claim stays in flight
/// for its pods meanwhile, rather than leave them to open another.
pub fn lifecycle_taint(node: &Node) -> Option<String> {
    if !ready(node) {
        return None;
    }
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    taints.iter().find(|t| t.effect == "NoSchedule" && ironclaim_core::predicates::LIFECYCLE_TAINTS.contains(&t.key.as_str())).map(|t| t.key.clone())
}

fn condition_true(node: &Node, kind: &str) -> bool {
    ironclaim_k8s::node::true_condition(node, kind).is_some()
}

fn ready(node: &Node) -> bool {
    condition_true(node, "Ready")
}

/// The pool's readiness gates a node has not passed yet, in the order they
/// are checked; empty when it passed them all (or the pool has none).
pub fn unmet(node: &Node, pool: Option<&ServerPool>) -> Vec<String> {
    let mut unmet = Vec::new();
    let status = node.status.as_ref();
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
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
        if !condition_true(node, kind) {
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
    fn a_ready_node_still_carrying_the_lifecycle_taint_is_told_apart_from_the_pool_gates() {
        assert_eq!(lifecycle_taint(&node("True", json!([]))), None);
        // Not Ready: the taint is the lifecycle controller's answer to that,
        // and "not Ready" says it all.
        assert_eq!(lifecycle_taint(&node("False", json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]))), None);
        // Ready, but the node lifecycle controller has not lifted its taint
        // yet (it lags on a busy control plane): kube-scheduler places
        // nothing there, so the claim's pods are still its own to wait for.
        for key in ["node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"] {
            let lagging = node("True", json!([{"key": key, "effect": "NoSchedule"}]));
            assert_eq!(lifecycle_taint(&lagging).as_deref(), Some(key));
            assert!(unmet(&lagging, None).is_empty(), "not a gate of the pool");
        }
        // Its NoExecute twin is tolerated by every pod the API server
        // admits (for 300 s), and another taint is the pool's business.
        let tolerated = node("True", json!([{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}, {"key": "x", "effect": "NoSchedule"}]));
        assert_eq!(lifecycle_taint(&tolerated), None);
        assert!(unmet(&tolerated, None).is_empty());
    }
}
