//! ironclaim's answer to a scenario: its manifests converted as the
//! controller converts what it watches, then planned by the decision core.
//!
//! The snapshot holds the scenario's nodes and pods and no inventory, so a
//! pending pod either fits an existing node or stays unschedulable: exactly
//! the question kube-scheduler answers.

use anyhow::{Context, Result};
use ironclaim_core::{Outcome, Snapshot, provision};
use k8s_openapi::api::core::v1 as k8s;
use serde_json::Value;
use std::collections::BTreeSet;

use crate::generate::{NAMESPACES, Scenario};

fn snapshot(nodes: &[Value], pods: &[&Value]) -> Result<Snapshot> {
    let mut snap = Snapshot::default();
    for (name, labels) in NAMESPACES {
        snap.namespaces.insert(name.to_string(), labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    }
    for (i, n) in nodes.iter().enumerate() {
        let node: k8s::Node = serde_json::from_value(n.clone()).with_context(|| format!("node {i}"))?;
        let name = node.metadata.name.clone().unwrap_or_default();
        snap.nodes.push(ironclaim_k8s::node_from_k8s(&node).with_context(|| format!("node {name}"))?);
    }
    for p in pods {
        let pod: k8s::Pod = serde_json::from_value((*p).clone()).context("pod")?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        snap.pods.push(ironclaim_k8s::pod_from_k8s(&pod).with_context(|| format!("pod {name}"))?);
    }
    Ok(snap)
}

fn key(pod: &Value) -> String {
    format!("{}/{}", pod["metadata"]["namespace"].as_str().unwrap_or_default(), pod["metadata"]["name"].as_str().unwrap_or_default())
}

/// The nodes pending pod `pod` of the scenario fits, one probe per node.
pub fn feasible(scenario: &Scenario, pod: usize) -> Result<BTreeSet<String>> {
    let mut out = BTreeSet::new();
    for node in scenario.node_names() {
        let probe = scenario.probe(pod, &node);
        let mut pods: Vec<&Value> = scenario.bound.iter().collect();
        pods.push(&probe);
        let snap = snapshot(&scenario.nodes, &pods)?;
        let plan = provision(&snap, 0);
        if let Some(d) = plan.decision(&key(&probe))
            && let Outcome::Existing { node: on } = &d.outcome
        {
            anyhow::ensure!(*on == node, "probe {} placed on {on}, which lacks its probe resource", key(&probe));
            out.insert(node);
        }
    }
    Ok(out)
}

/// How many of the scenario's pending pods ironclaim places on existing
/// nodes when it plans them all at once.
pub fn placed(scenario: &Scenario) -> Result<usize> {
    let pods: Vec<&Value> = scenario.bound.iter().chain(&scenario.pending).collect();
    let snap = snapshot(&scenario.nodes, &pods)?;
    let plan = provision(&snap, 0);
    Ok(plan.pods.iter().filter(|d| matches!(d.outcome, Outcome::Existing { .. })).count())
}
