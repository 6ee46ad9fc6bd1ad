//! Existing workers listed as Servers are never powered off for idling:
//! two kwok workers that carry no ironclaim label, each running a pod, on
//! sushy systems that are on. One reports its firmware UUID
//! (`nodeInfo.systemUUID`), so ironclaim links it to its Server by the
//! UUID the BMC reports; the other reports none, so its Server stays
//! unadopted. Past break-even, and past it again under a restarted
//! controller, both machines are still on, and each Server says why.

use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_controller::controller::ADOPTED_CONDITION;
use ironclaim_testenv::{FAKE_NODE_ANNOTATION, eventually};
use serde_json::json;

/// A kwok worker that does not say which server it is, with `uuid` as its
/// firmware UUID ("" for none).
fn worker(name: &str, uuid: &str) -> serde_json::Value {
    let capacity = json!({"cpu": "8", "memory": "16Gi", "pods": "110"});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}, "annotations": {FAKE_NODE_ANNOTATION.0: FAKE_NODE_ANNOTATION.1}},
        "status": {"capacity": capacity, "allocatable": capacity, "nodeInfo": {
            "systemUUID": uuid, "machineID": "", "bootID": "", "kernelVersion": "", "osImage": "", "containerRuntimeVersion": "",
            "kubeletVersion": "", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"}}
    })
}

/// A pod already running on `node`, as the workers' own workload.
fn running_on(name: &str, node: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]}
    })
}

fn adopted(server: &ironclaim_k8s::api::Server) -> Option<(String, String, String)> {
    let c = server.status.as_ref()?.conditions.iter().find(|c| c.type_ == ADOPTED_CONDITION)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_existing_worker_without_any_ironclaim_label_stays_on_past_break_even_and_a_restart() {
    let (env, client) = setup().await;
    let pool = "sd-legacy";
    let machines = machines("sd-legacy", pool, 2, 81);
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let sushy = start_sushy_for(&machines, SystemPower::On);
    // Break-even: 100 W x 15 s / 150 W = 10 s.
    apply_servers(&env, &sushy, &machines, 100);
    let (linked, unlinked) = (&machines[0], &machines[1]);
    apply(&env, &worker("legacy-a.example", &linked.uuid));
    apply(&env, &worker("legacy-b.example", ""));
    apply(&env, &running_on("legacy-a-app", "legacy-a.example"));
    apply(&env, &running_on("legacy-b-app", "legacy-b.example"));

    let first = run(Controller::new(client.clone(), redfish(&client), settings("sd-legacy-1")));
    let (c, name) = (client.clone(), unlinked.name.clone());
    let (status, reason, message) = eventually("the unlinked worker's Server says it is not adopted", Duration::from_secs(30), || {
        let (c, name) = (c.clone(), name.clone());
        async move {
            match adopted(&server(&c, &name).await) {
                Some(a) if a.0 == "False" => Ok(a),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!((status.as_str(), reason.as_str()), ("False", "Unadopted"));
    assert!(message.contains("ironclaim did not power it on") && message.contains("spec.adopt"), "{message}");

    // The other one is linked by the UUID its BMC reports: recorded, and
    // its node is the server's.
    let (c, name, uuid) = (client.clone(), linked.name.clone(), linked.uuid.clone());
    eventually("the linked worker's identity recorded", Duration::from_secs(30), || {
        let (c, name, uuid) = (c.clone(), name.clone(), uuid.clone());
        async move {
            let s = server(&c, &name).await;
            let recorded = s.status.as_ref().and_then(|s| s.identity.as_ref()).and_then(|i| i.system_uuid.clone());
            match (recorded, adopted(&s)) {
                (Some(u), Some(a)) if u.eq_ignore_ascii_case(&uuid) && a.0 == "True" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;

    // Past break-even, then again past it under a new controller.
    sleep_s(15).await;
    first.stop().await;
    let second = run(Controller::new(client.clone(), redfish(&client), settings("sd-legacy-2")));
    sleep_s(15).await;
    let bmcs = Bmcs::new(&sushy);
    assert_eq!(bmcs.on(&machines).await, vec![linked.name.clone(), unlinked.name.clone()], "a worker running its pods was powered off");
    for m in &machines {
        let s = server(&client, &m.name).await;
        assert!(s.status.as_ref().is_some_and(|st| !st.powered_on_by_ironclaim), "{} was never powered on by ironclaim", m.name);
    }
    assert_eq!(adopted(&server(&client, &unlinked.name).await).map(|a| a.1), Some("Unadopted".to_string()));
    for w in ["legacy-a.example", "legacy-b.example"] {
        assert!(node(&client, w).await.is_some_and(|n| !is_unschedulable(&n)), "worker {w} was cordoned");
    }
    assert!(claims(&client).await.iter().all(|c| !machines.iter().any(|m| m.name == c.spec.server)), "a worker's server was claimed");
    second.stop().await;
    for w in ["legacy-a.example", "legacy-b.example"] {
        let _ = env.kubectl(["delete", "node", w, "--ignore-not-found", "--wait=false"]);
    }
    let _ = env.kubectl(["delete", "pod", "-n", NAMESPACE, "legacy-a-app", "legacy-b-app", "--ignore-not-found", "--wait=false", "--force"]);
    clean(&env, &client, &machines, pool).await;
}
