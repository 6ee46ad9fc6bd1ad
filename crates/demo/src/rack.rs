//! The emulated rack: what each machine is (the facts an operator knows of
//! the servers they bought and the BMC of sushy-tools' fake driver does not
//! report), and a player that makes the machines behave: a system the
//! emulator reports On registers a kwok Node after its boot delay, as a
//! kubelet would, with the firmware UUID in `nodeInfo.systemUUID`; a system
//! reported Off loses its Node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ironclaim_redfish::{Bmc, BmcAddress, BmcConfig, Credentials, PowerState, SystemSelector, Timing};
use ironclaim_testenv::FAKE_NODE_ANNOTATION;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// A kind of machine in the rack.
#[derive(Debug)]
pub struct Class {
    pub name: &'static str,
    pub count: usize,
    pub cpu: u32,
    pub memory_gi: u32,
    pub gpus: Option<(&'static str, u32)>,
    pub idle_watts: u32,
    pub peak_watts: u32,
    /// From the BMC reporting On to the Node registering: firmware, PXE, OS
    /// and kubelet, shortened for a demo.
    pub boot: Duration,
}

/// The rack: 20 machines in three classes.
pub const CLASSES: [Class; 3] = [
    Class { name: "general", count: 12, cpu: 32, memory_gi: 128, gpus: None, idle_watts: 110, peak_watts: 350, boot: Duration::from_secs(15) },
    Class { name: "large", count: 6, cpu: 96, memory_gi: 768, gpus: None, idle_watts: 230, peak_watts: 800, boot: Duration::from_secs(25) },
    Class {
        name: "gpu",
        count: 2,
        cpu: 64,
        memory_gi: 512,
        gpus: Some(("A100", 4)),
        idle_watts: 480,
        peak_watts: 2400,
        boot: Duration::from_secs(35),
    },
];

/// The label that names a server's class (the warm-spare floor counts by it).
pub const CLASS_LABEL: &str = "ironclaim.dev/class";

/// One machine: its name in the cluster, its firmware UUID (the emulator's
/// system id), its class.
#[derive(Clone, Debug)]
pub struct Machine {
    pub name: String,
    pub uuid: String,
    pub class: &'static Class,
}

/// Every machine of the rack, in order.
pub fn machines() -> Vec<Machine> {
    let mut all = Vec::new();
    for class in &CLASSES {
        for i in 1..=class.count {
            let index = all.len() + 1;
            all.push(Machine { name: format!("{}-{i:02}", class.name), uuid: format!("5e7a0de0-0000-4000-8000-{index:012x}"), class });
        }
    }
    all
}

impl Machine {
    /// What the operator adds to what discovery read: the hardware the
    /// emulator does not report, the power profile, the expected stage
    /// durations, the class.
    pub fn complete(&self, discovered: &mut Value) {
        let c = self.class;
        let mut hardware = json!({"cpu": c.cpu.to_string(), "memory": format!("{}Gi", c.memory_gi)});
        if let Some((model, count)) = c.gpus {
            hardware["gpus"] = json!([{"model": model, "count": count}]);
        }
        discovered["metadata"]["name"] = json!(self.name);
        let spec = &mut discovered["spec"];
        spec["hardware"] = hardware;
        spec["power"] = json!({"idleWatts": c.idle_watts, "peakWatts": c.peak_watts});
        spec["stageDurations"] = json!({"powerOn": "10s", "boot": format!("{}s", c.boot.as_secs()), "join": "2s", "ready": "2s", "tailPercent": 150});
        if !spec["labels"].is_object() {
            spec["labels"] = json!({});
        }
        spec["labels"][CLASS_LABEL] = json!(c.name);
        if c.gpus.is_some() {
            spec["labels"]["accelerator"] = json!("nvidia-a100");
        }
    }

    /// The Node its kubelet registers.
    fn node(&self, server: &Value) -> Value {
        let c = self.class;
        let mut labels = server["spec"]["labels"].as_object().cloned().unwrap_or_default();
        labels.insert("kubernetes.io/hostname".into(), json!(self.name));
        labels.insert("ironclaim.dev/server".into(), json!(self.name));
        let mut capacity = json!({"cpu": c.cpu.to_string(), "memory": format!("{}Gi", c.memory_gi), "pods": "110"});
        if let Some((_, count)) = c.gpus {
            capacity["nvidia.com/gpu"] = json!(count.to_string());
        }
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": {FAKE_NODE_ANNOTATION.0: FAKE_NODE_ANNOTATION.1}},
            "spec": {"providerID": format!("ironclaim://{}", self.name)},
            "status": {"capacity": capacity, "allocatable": capacity, "nodeInfo": {
                "systemUUID": self.uuid, "machineID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                "operatingSystem": "linux", "architecture": "amd64"
            }}
        })
    }
}

/// Something that happened in the rack, for the demo's log.
#[derive(Debug)]
pub enum RackEvent {
    PoweredOn { machine: String },
    Joined { machine: String, after: Duration },
    PoweredOff { machine: String },
}

/// Plays the machines until the task is aborted: reads each system's power
/// from the emulator and registers or removes its Node.
pub fn play(
    client: Client,
    endpoint: &str,
    username: &str,
    password: &str,
    events: mpsc::UnboundedSender<RackEvent>,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let endpoint = BmcAddress::parse(endpoint)?.endpoint;
    let mut config = BmcConfig::new(endpoint, Credentials::new(username, ironclaim_redfish::credentials::Secret::new(password)));
    config.timing = Timing { request_timeout: Duration::from_secs(5), connect_timeout: Duration::from_secs(2), retries: 0, ..Timing::default() };
    let bmc = Bmc::new(config, Arc::new(tokio::sync::Semaphore::new(4)))?;
    let machines = machines();
    Ok(tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client.clone());
        let servers: Api<kube::api::DynamicObject> = Api::all_with(client, &server_resource());
        let mut on_since: BTreeMap<String, Instant> = BTreeMap::new();
        let mut registered: BTreeMap<String, bool> = BTreeMap::new();
        loop {
            for m in &machines {
                let Ok(selector) = SystemSelector::parse(&m.uuid) else { continue };
                let Ok(state) = bmc.power_state(&selector).await else { continue };
                match state {
                    PowerState::On => {
                        let since = *on_since.entry(m.name.clone()).or_insert_with(|| {
                            let _ = events.send(RackEvent::PoweredOn { machine: m.name.clone() });
                            Instant::now()
                        });
                        if registered.contains_key(&m.name) || since.elapsed() < m.class.boot {
                            continue;
                        }
                        let Ok(server) = servers.get(&m.name).await else { continue };
                        let Ok(server) = serde_json::to_value(&server) else { continue };
                        let Ok(node) = serde_json::from_value::<Node>(m.node(&server)) else { continue };
                        match nodes.create(&PostParams::default(), &node).await {
                            Ok(_) | Err(kube::Error::Api(_)) => {
                                registered.insert(m.name.clone(), true);
                                let _ = events.send(RackEvent::Joined { machine: m.name.clone(), after: since.elapsed() });
                            }
                            Err(_) => {}
                        }
                    }
                    PowerState::Off => {
                        if on_since.remove(&m.name).is_some() {
                            let _ = events.send(RackEvent::PoweredOff { machine: m.name.clone() });
                        }
                        if registered.remove(&m.name).is_some() {
                            let _ = nodes.delete(&m.name, &DeleteParams::default()).await;
                        }
                    }
                    _ => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }))
}

/// The Server resource, for reads without the typed API.
pub fn server_resource() -> kube::discovery::ApiResource {
    kube::discovery::ApiResource {
        group: "ironclaim.dev".into(),
        version: "v1alpha1".into(),
        api_version: "ironclaim.dev/v1alpha1".into(),
        kind: "Server".into(),
        plural: "servers".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rack_has_twenty_machines_with_distinct_names_and_uuids() {
        let all = machines();
        assert_eq!(all.len(), 20);
        let names: std::collections::BTreeSet<_> = all.iter().map(|m| &m.name).collect();
        let uuids: std::collections::BTreeSet<_> = all.iter().map(|m| &m.uuid).collect();
        assert_eq!((names.len(), uuids.len()), (20, 20));
    }

    #[test]
    fn a_node_carries_the_server_labels_its_capacity_and_the_firmware_uuid() {
        let gpu = machines().into_iter().find(|m| m.class.gpus.is_some()).unwrap();
        let mut server = json!({"metadata": {}, "spec": {"labels": {"ironclaim.dev/rack": "WEB43"}}});
        gpu.complete(&mut server);
        let node = gpu.node(&server);
        assert_eq!(node["metadata"]["labels"]["ironclaim.dev/rack"], "WEB43");
        assert_eq!(node["metadata"]["labels"][CLASS_LABEL], "gpu");
        assert_eq!(node["status"]["allocatable"]["nvidia.com/gpu"], "4");
        assert_eq!(node["status"]["nodeInfo"]["systemUUID"], gpu.uuid);
        serde_json::from_value::<Node>(node).expect("a Node");
    }
}
