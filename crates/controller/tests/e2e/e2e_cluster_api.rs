//! The Cluster API provider end to end, on the real control plane with
//! Cluster API's own MachineDeployment and Machine CRDs (v1beta2, from the
//! `sigs.k8s.io/cluster-api` module, `hack/testenv peer-crds`).
//!
//! The Cluster API controllers need a management cluster this machine
//! cannot host, so a small stand-in plays them and the machines: it keeps
//! each MachineDeployment's Machines at its replicas (creating Machines,
//! and removing the ones annotated `cluster.x-k8s.io/delete-machine`
//! first, else the newest, as a MachineSet does), walks each new Machine
//! through Pending, Provisioning and Provisioned (setting a providerID) to
//! Running, registering a kwok Node for it and setting `status.nodeRef`.
//! Like Cluster API's Machine controller, it copies the Machine's labels
//! of the `node.cluster.x-k8s.io/` domain onto the Node. It fakes the
//! MachineSet and Machine controllers, the infrastructure provider and the
//! kubelet; what ironclaim writes (replicas, annotations, labels) goes
//! through the real API server and CRD schemas.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use ironclaim_controller::cluster_api::{
    DELETE_MACHINE_ANNOTATION, DEPLOYMENT_NAME_LABEL, MACHINE_SERVER_ANNOTATION, machine_resource, machinedeployment_resource,
};
use ironclaim_controller::{ClusterApiPower, Controller, ExternalPower, Metal3Power, ProviderRouter};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::node::CLUSTER_API_SERVER_LABEL;
use ironclaim_testenv::{TestEnv, eventually};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const NS: &str = "capi-e2e";
const MD: &str = "workers";

async fn install_cluster_api_crds(env: &TestEnv) {
    install_peer_crds(
        env,
        "cluster-api-",
        &["cluster.x-k8s.io_machinedeployments.yaml", "cluster.x-k8s.io_machines.yaml"],
        &["machinedeployments.cluster.x-k8s.io", "machines.cluster.x-k8s.io"],
    );
    let _ = env.kubectl(["create", "namespace", NS]);
    // What an earlier test of this binary left, gone; and the fresh CRDs'
    // storage ready (it answers 429 while it initializes).
    let client = env.client().await.expect("client");
    for resource in [machinedeployment_resource(), machine_resource()] {
        let all = api(&client, &resource);
        eventually("the Cluster API objects of earlier tests gone", Duration::from_secs(30), || {
            let all = all.clone();
            async move {
                let left = all.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
                if left.items.is_empty() {
                    return Ok(());
                }
                for object in &left.items {
                    let _ = all.delete(&object.name_any(), &DeleteParams::default()).await;
                }
                Err(format!("{} left", left.items.len()))
            }
        })
        .await;
    }
}

fn api(client: &Client, resource: &kube::api::ApiResource) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), NS, resource)
}

/// Creates `object`, waiting out the discovery lag of a fresh CRD.
async fn create(api: &Api<DynamicObject>, object: serde_json::Value) {
    let object: DynamicObject = serde_json::from_value(object).expect("object");
    for _ in 0..50 {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => return,
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 429 => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(err) => panic!("create {}: {err}", object.name_any()),
        }
    }
    panic!("the API server never served {}", object.name_any());
}

fn cluster_api_server(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name},
        "spec": {
            "provider": {"type": "ClusterAPI", "clusterAPI": {"namespace": NS, "machineDeployment": MD}},
            "hardware": {"cpu": "16", "memory": "32Gi"},
            "labels": {"e2e.ironclaim.dev/pool": "capi", "ironclaim.dev/class": "capi"},
            // Break-even: 50 W x 15 s / 150 W = 5 s idle before powering off.
            "power": {"idleWatts": 150, "peakWatts": 400, "bootWatts": 50, "offWatts": 0},
            "stageDurations": {"powerOn": "12s", "boot": "3s", "join": "2s", "ready": "3s", "tailPercent": 150}
        }
    })
}

/// What the stand-in did: machines created and deleted, in order.
type Record = Arc<Mutex<Vec<String>>>;

/// The stand-in for the Cluster API controllers and the machines.
struct StandIn {
    task: tokio::task::JoinHandle<()>,
    record: Record,
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StandIn {
    fn start(client: Client, step: Duration) -> StandIn {
        let record: Record = Arc::default();
        let log = record.clone();
        let task = tokio::spawn(async move {
            let deployments = api(&client, &machinedeployment_resource());
            let machines = api(&client, &machine_resource());
            let nodes: Api<Node> = Api::all(client.clone());
            // When each machine entered its phase.
            let mut since: BTreeMap<String, Instant> = BTreeMap::new();
            let mut made = 0;
            loop {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let Ok(md) = deployments.get(MD).await else { continue };
                let replicas = md.data["spec"]["replicas"].as_i64().unwrap_or(0);
                let params = ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}={MD}"));
                let Ok(list) = machines.list(&params).await else { continue };
                let mut live: Vec<&DynamicObject> = list.items.iter().filter(|m| m.data["status"]["phase"] != "Deleting").collect();
                // The MachineSet: create to replicas, or delete the marked
                // first, else the newest.
                if (live.len() as i64) < replicas {
                    made += 1;
                    let name = format!("{MD}-{made}");
                    let machine = json!({
                        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                        "metadata": {"name": name, "namespace": NS, "labels": {DEPLOYMENT_NAME_LABEL: MD, "cluster.x-k8s.io/cluster-name": "lab"}},
                        "spec": {
                            "clusterName": "lab",
                            "bootstrap": {"dataSecretName": "bootstrap"},
                            "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3Machine", "name": name}
                        }
                    });
                    let machine: DynamicObject = serde_json::from_value(machine).expect("machine");
                    if machines.create(&PostParams::default(), &machine).await.is_ok() {
                        let status = json!({"status": {"phase": "Pending"}});
                        let _ = machines.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
                        log.lock().unwrap_or_else(|p| p.into_inner()).push(format!("created {name}"));
                    }
                    continue;
                }
                if (live.len() as i64) > replicas {
                    live.sort_by_key(|m| (!m.annotations().contains_key(DELETE_MACHINE_ANNOTATION), std::cmp::Reverse(m.name_any())));
                    let victim = live[0].name_any();
                    let status = json!({"status": {"phase": "Deleting"}});
                    let _ = machines.patch_status(&victim, &PatchParams::default(), &Patch::Merge(&status)).await;
                    since.insert(victim, Instant::now());
                    continue;
                }
                // The machines: one phase a step.
                for m in &list.items {
                    let name = m.name_any();
                    let phase = m.data["status"]["phase"].as_str().unwrap_or("Pending").to_string();
                    let entered = *since.entry(name.clone()).or_insert_with(Instant::now);
                    if entered.elapsed() < step {
                        continue;
                    }
                    let node = format!("{name}-node");
                    let provider_id = format!("stand-in://{name}");
                    let next = match phase.as_str() {
                        "Pending" => json!({"status": {"phase": "Provisioning"}}),
                        "Provisioning" => {
                            let spec = json!({"spec": {"providerID": provider_id}});
                            let _ = machines.patch(&name, &PatchParams::default(), &Patch::Merge(&spec)).await;
                            json!({"status": {"phase": "Provisioned"}})
                        }
                        "Provisioned" => {
                            let mut n = existing_node(&node, 16, 32, &[], 0, &[]);
                            n["spec"]["providerID"] = json!(provider_id);
                            for (k, v) in m.labels().iter().filter(|(k, _)| k.starts_with("node.cluster.x-k8s.io/")) {
                                n["metadata"]["labels"][k] = json!(v);
                            }
                            let n: Node = serde_json::from_value(n).expect("node");
                            if !matches!(nodes.create(&PostParams::default(), &n).await, Ok(_) | Err(kube::Error::Api(_))) {
                                continue;
                            }
                            json!({"status": {"phase": "Running", "nodeRef": {"name": node}}})
                        }
                        "Deleting" => {
                            let _ = nodes.delete(&node, &DeleteParams::default()).await;
                            if machines.delete(&name, &DeleteParams::default()).await.is_ok() {
                                since.remove(&name);
                                log.lock().unwrap_or_else(|p| p.into_inner()).push(format!("deleted {name}"));
                            }
                            continue;
                        }
                        _ => continue,
                    };
                    if machines.patch_status(&name, &PatchParams::default(), &Patch::Merge(&next)).await.is_ok() {
                        since.insert(name, Instant::now());
                    }
                }
            }
        });
        StandIn { task, record }
    }

    fn record(&self) -> Vec<String> {
        self.record.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

async fn replicas(client: &Client) -> i64 {
    api(client, &machinedeployment_resource()).get(MD).await.expect("the MachineDeployment").data["spec"]["replicas"].as_i64().unwrap_or(-1)
}

/// The MachineDeployment of the tests, at 0 replicas, with `annotations`.
fn machine_deployment(annotations: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
        "metadata": {"name": MD, "namespace": NS, "annotations": annotations},
        "spec": {
            "clusterName": "lab",
            "replicas": 0,
            "selector": {"matchLabels": {DEPLOYMENT_NAME_LABEL: MD}},
            "template": {
                "metadata": {"labels": {DEPLOYMENT_NAME_LABEL: MD}},
                "spec": {
                    "clusterName": "lab",
                    "bootstrap": {"dataSecretName": "bootstrap"},
                    "infrastructureRef": {"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "Metal3MachineTemplate", "name": "workers"}
                }
            }
        }
    })
}

/// The Machine ironclaim took for `server`, by its annotation.
async fn machine_of(client: &Client, server: &str) -> Option<String> {
    let list = api(client, &machine_resource()).list(&ListParams::default()).await.ok()?;
    list.items.iter().find(|m| m.annotations().get(MACHINE_SERVER_ANNOTATION).map(String::as_str) == Some(server)).map(|m| m.name_any())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pending_pods_scale_a_machinedeployment_up_and_an_idle_server_removes_exactly_its_own_machine() {
    let (env, client) = setup().await;
    install_cluster_api_crds(&env).await;
    let annotations = json!({
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "0",
        "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "2",
        "capacity.cluster-autoscaler.kubernetes.io/cpu": "16",
        "capacity.cluster-autoscaler.kubernetes.io/memory": "32Gi"
    });
    create(&api(&client, &machinedeployment_resource()), machine_deployment(annotations)).await;
    for slot in ["capi-1", "capi-2"] {
        apply(&env, &cluster_api_server(slot));
    }
    apply(&env, &labelled_pool("capi"));
    let stand_in = StandIn::start(client.clone(), Duration::from_millis(600));
    let power = Arc::new(ProviderRouter {
        redfish: redfish(&client),
        metal3: Arc::new(Metal3Power::new(client.clone(), Duration::from_secs(20))),
        external: Arc::new(ExternalPower::none()),
        cluster_api: Arc::new(ClusterApiPower::new(client.clone(), Duration::from_secs(30)).with_poll(Duration::from_millis(200))),
    });
    let controller = Controller::new(client.clone(), power, settings("cluster-api"));
    let metrics = controller.metrics();
    let running = run(controller);

    // Scale-up: each pod needs a machine of its own (12 of 16 CPUs).
    let created = Instant::now();
    apply(&env, &pod("capi-a", "12", "8Gi", &[], 0));
    let c = client.clone();
    let node_a = eventually("pod a bound to a new Machine's node", Duration::from_secs(45), || {
        let c = c.clone();
        async move { bound(&c, "capi-a").await }
    })
    .await;
    let bound_after = created.elapsed();
    let slot_a =
        Api::<Node>::all(client.clone()).get(&node_a).await.expect("node a").labels().get(CLUSTER_API_SERVER_LABEL).cloned().expect("linked");
    served_claim(&client, &slot_a).await;
    let machine_a = machine_of(&client, &slot_a).await.expect("the Machine of pod a's server");
    assert_eq!(node_a, format!("{machine_a}-node"));
    assert_eq!(replicas(&client).await, 1);

    apply(&env, &pod("capi-b", "12", "8Gi", &[], 0));
    let c = client.clone();
    let node_b = eventually("pod b bound to a second Machine's node", Duration::from_secs(45), || {
        let c = c.clone();
        async move { bound(&c, "capi-b").await }
    })
    .await;
    assert_ne!(node_a, node_b);
    let slot_b = if slot_a == "capi-1" { "capi-2" } else { "capi-1" };
    let machine_b = machine_of(&client, slot_b).await.expect("the Machine of pod b's server");
    assert_eq!(node_b, format!("{machine_b}-node"));
    assert_eq!(replicas(&client).await, 2);

    // Scale-down: pod a leaves; its server goes idle and removes its own
    // Machine, although the stand-in, like a MachineSet, would remove the
    // newest (b's) unless told.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.delete("capi-a", &DeleteParams::default().grace_period(0)).await.expect("delete pod a");
    let c = client.clone();
    let gone = machine_a.clone();
    eventually("pod a's Machine removed", Duration::from_secs(60), || {
        let (c, gone) = (c.clone(), gone.clone());
        async move {
            let left = api(&c, &machine_resource()).get_opt(&gone).await.ok().flatten();
            if left.is_none() { Ok(()) } else { Err(format!("replicas {}", replicas(&c).await)) }
        }
    })
    .await;
    assert_eq!(replicas(&client).await, 1);
    assert_eq!(machine_of(&client, slot_b).await.as_deref(), Some(machine_b.as_str()), "pod b's Machine stays");
    assert_eq!(pod_node(&client, "capi-b").await.as_deref(), Some(node_b.as_str()));
    assert_eq!(stand_in.record(), [format!("created {machine_a}"), format!("created {machine_b}"), format!("deleted {machine_a}")]);
    let text = metrics.render();
    assert!(!text.contains("ironclaim_power_failures_total{"), "{text}");
    println!("cluster-api: pod a bound {bound_after:?} after creation");
    running.stop().await;
}

/// A power-off cut short between its mark and its scale-down (a restart,
/// a lost lease) leaves a Machine marked with its replica still there:
/// the next power-on takes the mark back, the next power-off finishes the
/// scale-down; and a group at its minimum size is never marked at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_power_off_cut_short_is_taken_back_or_finished_and_the_minimum_size_marks_nothing() {
    use ironclaim_controller::Power;
    let (env, client) = setup().await;
    install_cluster_api_crds(&env).await;
    let annotations = json!({"cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size": "2"});
    create(&api(&client, &machinedeployment_resource()), machine_deployment(annotations)).await;
    let _stand_in = StandIn::start(client.clone(), Duration::from_millis(300));
    let power = ClusterApiPower::new(client.clone(), Duration::from_secs(30)).with_poll(Duration::from_millis(200));
    let server: Server = serde_json::from_value(cluster_api_server("capi-x")).expect("server");
    let machines = api(&client, &machine_resource());
    let mark = |value: serde_json::Value| json!({"metadata": {"annotations": {DELETE_MACHINE_ANNOTATION: value}}});

    power.power_on(&server).await.expect("power on");
    let machine = machine_of(&client, "capi-x").await.expect("taken");
    let labels = machines.get(&machine).await.expect("machine").labels().clone();
    assert_eq!(labels.get(CLUSTER_API_SERVER_LABEL).map(String::as_str), Some("capi-x"), "the label its Node gets");
    assert_eq!(replicas(&client).await, 1);

    // Cut short after the mark: the next power-on takes the mark back.
    machines.patch(&machine, &PatchParams::default(), &Patch::Merge(&mark(json!("ironclaim")))).await.expect("mark");
    power.power_on(&server).await.expect("power on again");
    let kept = machines.get(&machine).await.expect("kept");
    assert!(!kept.annotations().contains_key(DELETE_MACHINE_ANNOTATION), "the mark is taken back");
    assert_eq!(replicas(&client).await, 1);

    // Cut short again; this time a power-off comes next and finishes it.
    machines.patch(&machine, &PatchParams::default(), &Patch::Merge(&mark(json!("ironclaim")))).await.expect("mark");
    power.power_off(&server).await.expect("power off");
    assert_eq!(replicas(&client).await, 0);
    assert!(machines.get_opt(&machine).await.expect("read").is_none(), "the marked Machine went");

    // At its minimum size a group is not shrunk, and nothing is marked.
    power.power_on(&server).await.expect("power on");
    let machine = machine_of(&client, "capi-x").await.expect("taken");
    let min = json!({"metadata": {"annotations": {"cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size": "1"}}});
    api(&client, &machinedeployment_resource()).patch(MD, &PatchParams::default(), &Patch::Merge(&min)).await.expect("min size");
    let err = power.power_off(&server).await.expect_err("at its minimum");
    assert_eq!(err.label, "at_min_size", "{}", err.message);
    let still = machines.get(&machine).await.expect("still there");
    assert!(!still.annotations().contains_key(DELETE_MACHINE_ANNOTATION), "not marked");
    assert_eq!(replicas(&client).await, 1);
}
