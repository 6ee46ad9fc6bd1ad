//! Helpers for the scale-down tests, on top of the shared `support`
//! harness: a pool of servers already on, with break-even in seconds.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ironclaim_core::DISRUPTING_TAINT;
use ironclaim_redfish::{Bmc, BmcAddress, BmcConfig, Credentials, SystemSelector};
use ironclaim_testenv::TestEnv;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::support::{Machine, Machines, Sushy, SystemPower, apply, start_sushy_for, timing};

/// The label that ties a test's servers to its ServerPool.
pub const POOL_LABEL: &str = "e2e.ironclaim.dev/pool";

/// A ReplicaSet of one pod labelled `app: name`, in the test namespace:
/// `template_metadata` adds to the pod's metadata (finalizers,
/// annotations), `pod_spec` is its spec.
pub fn one_replica(name: &str, template_metadata: serde_json::Value, pod_spec: serde_json::Value) -> serde_json::Value {
    let mut metadata = json!({"labels": {"app": name}});
    for (k, v) in template_metadata.as_object().cloned().unwrap_or_default() {
        metadata[k] = v;
    }
    json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {"name": name, "namespace": crate::support::NAMESPACE},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}, "template": {"metadata": metadata, "spec": pod_spec}}
    })
}

/// One container asking for `cpu` and `memory`.
pub fn app_container(cpu: &str, memory: &str) -> serde_json::Value {
    json!({"name": "c", "image": "registry.invalid/app", "resources": {"requests": {"cpu": cpu, "memory": memory}}})
}

/// `count` machines named `{prefix}-{i}`, class `small`, in pool `pool`.
/// `uuid_base` keeps the emulator's systems apart between tests.
pub fn machines(prefix: &str, pool: &str, count: usize, uuid_base: usize) -> Vec<Machine> {
    (0..count)
        .map(|i| Machine::new(&format!("{prefix}-{i}"), uuid_base + i, 8, 16).label(POOL_LABEL, pool).label("ironclaim.dev/class", "small"))
        .collect()
}

/// Applies the Servers with a boot draw that makes break-even
/// `boot_watts` x 15 s / 150 W (the stages last 12 s + 3 s, idle is 150 W).
pub fn apply_servers(env: &TestEnv, sushy: &Sushy, machines: &[Machine], boot_watts: i64) {
    for m in machines {
        let mut server = m.server_json(sushy);
        server["spec"]["power"] = json!({"idleWatts": 150, "peakWatts": 400, "bootWatts": boot_watts, "offWatts": 0});
        apply(env, &server);
    }
}

/// A ServerPool for the test's servers only (weight 100 wins over pools
/// other tests left behind).
pub fn apply_pool(env: &TestEnv, pool: &str, warm_floor: i64, disruption: serde_json::Value) {
    apply(
        env,
        &json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": pool},
            "spec": {
                "weight": 100,
                "requirements": [{"key": POOL_LABEL, "operator": "In", "values": [pool]}],
                "warmSpares": {"floor": [{"class": "small", "count": warm_floor}]},
                "disruption": disruption
            }
        }),
    );
}

/// Reads power states straight from the emulator.
pub struct Bmcs {
    bmc: Bmc,
}

impl Bmcs {
    pub fn new(sushy: &Sushy) -> Self {
        let endpoint = BmcAddress::parse(&sushy.endpoint()).expect("address").endpoint;
        let creds = Credentials::new("admin", ironclaim_redfish::credentials::Secret::new("password"));
        let mut config = BmcConfig::new(endpoint, creds);
        config.timing = timing();
        Bmcs { bmc: Bmc::new(config, Arc::new(tokio::sync::Semaphore::new(8))).expect("bmc") }
    }

    pub async fn is_on(&self, m: &Machine) -> Option<bool> {
        let selector = SystemSelector::parse(&m.uuid).ok()?;
        let state = self.bmc.power_state(&selector).await.ok()?;
        Some(state == ironclaim_redfish::PowerState::On)
    }

    /// The machines that are on, by name (unreadable ones count as on).
    pub async fn on(&self, machines: &[Machine]) -> Vec<String> {
        let mut on = Vec::new();
        for m in machines {
            if self.is_on(m).await != Some(false) {
                on.push(m.name.clone());
            }
        }
        on
    }
}

pub async fn node(client: &Client, name: &str) -> Option<Node> {
    Api::<Node>::all(client.clone()).get_opt(name).await.ok().flatten()
}

pub fn is_disrupting(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| ts.iter().any(|t| t.key == DISRUPTING_TAINT))
}

pub fn is_unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// Pods of a namespace matching a label selector.
pub async fn pods(client: &Client, namespace: &str, selector: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), namespace).list(&ListParams::default().labels(selector)).await.map(|l| l.items).unwrap_or_default()
}

pub fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none()
        && pod.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The Events on a cluster-scoped object, as "reason: note".
pub async fn object_events(client: &Client, kind: &str, name: &str) -> Vec<String> {
    crate::support::settled_events(client, None, |r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)).await
}

/// Removes a test's objects so later tests on the shared control plane
/// do not meet them.
pub async fn clean(env: &TestEnv, client: &Client, machines: &[Machine], pool: &str) {
    let _ = env.kubectl(["delete", "serverpool", pool, "--ignore-not-found", "--wait=false"]);
    for m in machines {
        let _ = env.kubectl(["delete", "server", &m.name, "--ignore-not-found", "--wait=false"]);
        let _ = Api::<Node>::all(client.clone()).delete(&m.name, &DeleteParams::default()).await;
    }
}

pub async fn sleep_s(s: u64) {
    tokio::time::sleep(Duration::from_secs(s)).await;
}

/// Every node of the machines exists and is Ready.
pub async fn nodes_ready(client: &Client, machines: &[Machine]) -> Result<(), String> {
    for m in machines {
        let Some(n) = node(client, &m.name).await else { return Err(format!("{} has no node", m.name)) };
        let is_ready =
            n.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !is_ready {
            return Err(format!("{} not ready", m.name));
        }
    }
    Ok(())
}

pub fn names<T: ResourceExt>(objects: &[T]) -> Vec<String> {
    objects.iter().map(ResourceExt::name_any).collect()
}

/// The machines on (a Sushy system each, already powered), their Servers
/// applied with `boot_watts`, the harness playing them, and every node
/// Ready. Keep both returned values alive for the test.
pub async fn powered_fleet(env: &TestEnv, client: &Client, machines: &[Machine], boot_watts: i64) -> (Sushy, Machines) {
    let sushy = start_sushy_for(machines, SystemPower::On);
    apply_servers(env, &sushy, machines, boot_watts);
    let harness = Machines::start(client.clone(), &sushy, machines.to_vec());
    let (c, ms) = (client.clone(), machines.to_vec());
    ironclaim_testenv::eventually("the servers' nodes ready", Duration::from_secs(30), || {
        let (c, ms) = (c.clone(), ms.clone());
        async move { nodes_ready(&c, &ms).await }
    })
    .await;
    (sushy, harness)
}
