//! The demo's workload and pools: three Deployments that burst together
//! and go quiet, one for each class of the rack.

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

pub const NAMESPACE: &str = "demo";

/// A Deployment of the burst: name, replicas, cpu, memory, GPUs per pod.
struct Burst {
    name: &'static str,
    replicas: u32,
    cpu: &'static str,
    memory: &'static str,
    gpus: u32,
}

const BURST: [Burst; 3] = [
    Burst { name: "web", replicas: 24, cpu: "2", memory: "4Gi", gpus: 0 },
    Burst { name: "batch", replicas: 3, cpu: "40", memory: "200Gi", gpus: 0 },
    Burst { name: "inference", replicas: 2, cpu: "8", memory: "32Gi", gpus: 2 },
];

pub fn describe() -> String {
    BURST
        .iter()
        .map(|b| {
            let gpus = if b.gpus > 0 { format!(", {} GPU", b.gpus) } else { String::new() };
            format!("{} {} x ({} cpu, {}{gpus})", b.name, b.replicas, b.cpu, b.memory)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The pools: general and large machines in one with a warm spare, the
/// GPU machines in another.
pub fn pools() -> Vec<Value> {
    vec![
        json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": "general"},
            "spec": {
                "weight": 10,
                "requirements": [{"key": crate::rack::CLASS_LABEL, "operator": "In", "values": ["general", "large"]}],
                "warmSpares": {"floor": [{"class": "general", "count": 1}]},
                "disruption": {"consolidateAfter": "1m", "budgets": [{"nodes": "50%"}], "drainTimeout": "2m"}
            }
        }),
        json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": "gpu"},
            "spec": {
                "requirements": [{"key": "accelerator", "operator": "Exists"}],
                "readiness": {"extendedResources": ["nvidia.com/gpu"]},
                "disruption": {"consolidateAfter": "2m", "drainTimeout": "2m"}
            }
        }),
    ]
}

/// The namespace and the Deployments, at zero replicas.
pub async fn create(client: &Client) -> Result<()> {
    let apply = PatchParams::apply(super::FIELD_MANAGER).force();
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    Api::<Namespace>::all(client.clone()).patch(NAMESPACE, &apply, &Patch::Apply(&ns)).await.context("create the demo namespace")?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    for b in &BURST {
        let mut requests = json!({"cpu": b.cpu, "memory": b.memory});
        if b.gpus > 0 {
            requests["nvidia.com/gpu"] = json!(b.gpus.to_string());
        }
        let deployment = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": b.name, "namespace": NAMESPACE},
            "spec": {
                "replicas": 0,
                "selector": {"matchLabels": {"app": b.name}},
                "template": {
                    "metadata": {"labels": {"app": b.name}},
                    "spec": {
                        "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": b.name, "image": "registry.k8s.io/pause:3.10", "resources": {"requests": requests, "limits": if b.gpus > 0 { json!({"nvidia.com/gpu": b.gpus.to_string()}) } else { json!({}) }}}]
                    }
                }
            }
        });
        deployments.patch(b.name, &apply, &Patch::Apply(&deployment)).await.with_context(|| format!("create Deployment {}", b.name))?;
    }
    Ok(())
}

/// Scales every Deployment of the burst up (`on`) or to zero.
pub async fn scale(client: &Client, on: bool) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    for b in &BURST {
        let replicas = if on { b.replicas } else { 0 };
        deployments
            .patch_scale(b.name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": replicas}})))
            .await
            .with_context(|| format!("scale Deployment {} to {replicas}", b.name))?;
    }
    Ok(())
}

/// Pods of the workload: how many the burst asks for and how many are bound.
pub struct State {
    pub total: usize,
    pub bound: usize,
}

impl State {
    pub fn unbound(&self) -> usize {
        self.total - self.bound.min(self.total)
    }
}

pub async fn state(client: &Client) -> Result<State> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods.list(&Default::default()).await.context("list the demo's pods")?;
    let live: Vec<&Pod> = list.items.iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
    let bound = live.iter().filter(|p| p.spec.as_ref().is_some_and(|s| s.node_name.is_some())).count();
    let asked: usize = BURST.iter().map(|b| b.replicas as usize).sum();
    Ok(State { total: asked.max(live.len()), bound })
}
