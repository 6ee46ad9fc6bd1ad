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
    if !condition_true("Ready") {
        unmet.push("node Ready".to_string());
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
        let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
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
