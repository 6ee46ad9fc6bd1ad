//! An in-place resize its node cannot give is demand, on the real control
//! plane. A Deployment's pod runs on node-3 (8 CPU) beside a 5-CPU pod; it
//! is resized in place through the `resize` subresource from 2 to 6 CPU,
//! and, since kwok has no kubelet, the test writes the pod's status as the
//! kubelet would: the 2 CPU it applied and allocated, and the
//! `PodResizePending` condition with reason `Deferred` (the other pod holds
//! the room). ironclaim powers on the 16-CPU server for it and says so on
//! the pod. Then the test does what VPA's recreate does (the Deployment's
//! template at the new size): the new pod lands on the new node. Each
//! stage is timed from the resize.
//!
//! (A resize beyond the node's allocatable, which the kubelet would find
//! infeasible, is refused by the API server itself since Kubernetes 1.35:
//! VPA then recreates the pod at its new size, and that pending pod is
//! demand like any other.)

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_testenv::eventually;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

/// The pods of the Deployment `db`, with their nodes.
async fn db_pods(client: &kube::Client) -> Vec<(String, Option<String>)> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods.list(&ListParams::default().labels("app=db")).await.map(|l| l.items).unwrap_or_default();
    list.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).map(|p| (p.name_any(), p.spec.and_then(|s| s.node_name))).collect()
}

fn deployment(cpu: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "db", "namespace": NAMESPACE},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": "registry.invalid/db", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
            }
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resize_its_node_cannot_give_powers_on_a_server_and_the_recreated_pod_lands_there() {
    let (env, client) = setup().await;
    let pool = "resize";
    let machines = vec![Machine::new("r4-u02", 71, 16, 32).label(POOL_LABEL, pool).label("ironclaim.dev/class", "big")];
    clean(&env, &client, &machines, pool).await;
    apply(&env, &existing_node("node-3", 8, 16, &[], 0, &[]));
    let mut web = pod("web", "5", "1Gi", &[], 0);
    web["spec"]["nodeName"] = json!("node-3");
    apply(&env, &web);
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let sushy = start_sushy([(machines[0].uuid.clone(), SystemPower::Off)]);
    apply_servers(&env, &sushy, &machines, 50);
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    let running = run(Controller::new(client.clone(), redfish(&client), settings("resize")));

    apply(&env, &deployment("2"));
    let c = client.clone();
    let (pod, node) = eventually("db running on node-3", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            match db_pods(&c).await.as_slice() {
                [(name, Some(node))] => Ok((name.clone(), node.clone())),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(node, "node-3");

    // The kubelet's status: the 2 CPU it applied and allocated (a node
    // that resizes in place says so), and, once asked for 6 CPU on a
    // node whose other pod holds the room, that the resize is deferred.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let kubelet_says = |deferred: bool| {
        let (pods, pod) = (pods.clone(), pod.clone());
        async move {
            let now = jiff::Timestamp::now().to_string();
            let conditions = if deferred {
                json!([{"type": "PodResizePending", "status": "True", "reason": "Deferred", "lastTransitionTime": now,
                        "message": "Node didn't have enough resource: cpu, requested: 6000, used: 7000, capacity: 8000"}])
            } else {
                json!([])
            };
            let status = json!({"status": {
                "conditions": conditions,
                "containerStatuses": [{"name": "db", "image": "registry.invalid/db", "imageID": "", "ready": true, "restartCount": 0, "started": true,
                                       "state": {"running": {"startedAt": now}},
                                       "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}, "allocatedResources": {"cpu": "2", "memory": "1Gi"}}]
            }});
            pods.patch_status(&pod, &PatchParams::default(), &Patch::Strategic(&status)).await.map(|_| ()).unwrap_or_else(|e| panic!("status: {e}"));
        }
    };
    // kwok marks the pod running once (it sets the pod IP); wait for that,
    // or its status, with no `resources`, would overwrite the kubelet's
    // below and the API server would refuse the resize as unsupported.
    let (p, n) = (pods.clone(), pod.clone());
    eventually("kwok marks db running", Duration::from_secs(30), || {
        let (p, n) = (p.clone(), n.clone());
        async move {
            let pod = p.get(&n).await.map_err(|e| e.to_string())?;
            pod.status.and_then(|s| s.pod_ip).map(|_| ()).ok_or_else(|| "no pod IP yet".to_string())
        }
    })
    .await;
    kubelet_says(false).await;
    // The resize, through the subresource, as VPA's updater asks for it.
    let resized = Instant::now();
    let resize = json!({"spec": {"containers": [{"name": "db", "resources": {"requests": {"cpu": "6", "memory": "1Gi"}}}]}}).to_string();
    env.kubectl(["-n", NAMESPACE, "patch", "pod", &pod, "--subresource=resize", "--type=strategic", "-p", &resize])
        .unwrap_or_else(|e| panic!("resize: {e}"));
    kubelet_says(true).await;

    // No other Ready node has 6 CPU free: ironclaim claims the 16-CPU
    // server for the resize, and says why on the pod.
    let c = client.clone();
    let claimed = eventually("a claim for the resized pod", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let all = claims(&c).await;
            all.iter()
                .find(|x| x.spec.server == "r4-u02")
                .map(|x| x.spec.pods.iter().map(|p| p.name.clone()).collect::<Vec<_>>())
                .ok_or(format!("{:?}", crate::support::names(&all)))
        }
    })
    .await;
    let claimed_after = resized.elapsed();
    assert_eq!(claimed, vec![pod.clone()], "the claim is opened for the resized pod");
    let (c, p) = (client.clone(), pod.clone());
    let event = eventually("the pod told which server its resize powers on", Duration::from_secs(30), || {
        let (c, p) = (c.clone(), p.clone());
        async move { pod_events(&c, &p).await.into_iter().find(|e| e.starts_with("ServerClaimed:")).ok_or_else(|| "no event yet".to_string()) }
    })
    .await;
    assert!(event.contains("resize to 6 CPU deferred on node-3; server r4-u02 powering on"), "{event}");
    let (c, m) = (client.clone(), machines.clone());
    eventually("r4-u02's node ready", Duration::from_secs(60), || {
        let (c, m) = (c.clone(), m.clone());
        async move { nodes_ready(&c, &m).await }
    })
    .await;
    let ready_after = resized.elapsed();

    // VPA's recreate: the template at the new size; the new pod lands on
    // the new node, and the old one goes.
    apply(&env, &deployment("6"));
    let c = client.clone();
    let moved = eventually("db recreated on r4-u02", Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            match db_pods(&c).await.as_slice() {
                [(name, Some(node))] if node == "r4-u02" => Ok(name.clone()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let landed_after = resized.elapsed();
    assert_ne!(moved, pod);
    // One server for one resize.
    let all = claims(&client).await;
    assert_eq!(all.len(), 1, "{:?}", crate::support::names(&all));
    println!(
        "resize to 6 CPU deferred on a full node: claimed {:.1} s, node Ready {:.1} s, recreated pod bound on the new server {:.1} s after the resize",
        claimed_after.as_secs_f64(),
        ready_after.as_secs_f64(),
        landed_after.as_secs_f64()
    );
    running.stop().await;
}
