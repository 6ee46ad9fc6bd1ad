//! ProvisioningRequests end to end, with Cluster Autoscaler's CRD
//! (`autoscaling.x-k8s.io/v1`, as OpenShift's cluster-autoscaler-operator
//! ships it in its Go module) on the real control plane, three 8-CPU servers
//! off, and pods of 6 CPU (one per server):
//!
//! - a capacity check finds no room and powers nothing on;
//! - an all-or-nothing request for four pods powers nothing on;
//! - one for three powers all three servers on, is `Provisioned` once they
//!   are Ready nodes, and its room stays booked (no scale-down, though the
//!   servers break even in a second) until three pods that consume the
//!   request are bound there;
//! - a capacity check for a pod that fits then finds it.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_k8s::provisioning_request::ProvisioningRequest;
use ironclaim_testenv::eventually;
use kube::Api;
use serde_json::json;

/// `type=status:reason` of each condition of the request.
async fn conditions(client: &kube::Client, name: &str) -> Result<Vec<String>, String> {
    let api: Api<ProvisioningRequest> = Api::namespaced(client.clone(), NAMESPACE);
    let r = api.get(name).await.map_err(|e| e.to_string())?;
    Ok(r.status.unwrap_or_default().conditions.iter().map(|c| format!("{}={}:{}", c.type_, c.status, c.reason)).collect())
}

async fn until_condition(client: &kube::Client, name: &str, want: &str, within: Duration) -> Vec<String> {
    let c = client.clone();
    let (name, want) = (name.to_string(), want.to_string());
    eventually(&format!("{name}: {want}"), within, || {
        let (c, name, want) = (c.clone(), name.clone(), want.clone());
        async move {
            let cs = conditions(&c, &name).await?;
            if cs.contains(&want) { Ok(cs) } else { Err(format!("{cs:?}")) }
        }
    })
    .await
}

fn request(name: &str, class: &str, template: &str, count: i32) -> serde_json::Value {
    json!({
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"provisioningClassName": class, "podSets": [{"podTemplateRef": {"name": template}, "count": count}]}
    })
}

fn template(name: &str, cpu: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "PodTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "template": {"spec": {"containers": [app_container(cpu, "1Gi")], "nodeSelector": {POOL_LABEL: "preq"}}}
    })
}

const ATOMIC: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
const CHECK: &str = "check-capacity.autoscaling.x-k8s.io";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_gets_all_its_servers_or_none_and_its_room_stays_booked_for_its_pods() {
    let (env, client) = setup().await;
    install_peer_crds(&env, "cluster-autoscaler-operator-", &["11_provisioningrequest.crd.yaml"], &["provisioningrequests.autoscaling.x-k8s.io"]);
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "provisioningrequests.autoscaling.x-k8s.io", "--all", "--ignore-not-found"]);
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", "preq-train", "--ignore-not-found"]);
    let pool = "preq";
    let machines = machines("preq", pool, 3, 171);
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let sushy = start_sushy(machines.iter().map(|m| (m.uuid.clone(), SystemPower::Off)));
    // Break-even: 10 W x 15 s / 150 W = 1 s: only a booking keeps an empty node on.
    apply_servers(&env, &sushy, &machines, 10);
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    apply(&env, &template("worker", "6"));
    apply(&env, &template("small", "1"));
    let running = run(Controller::new(client.clone(), redfish(&client), settings("preq")));
    let bmcs = Bmcs::new(&sushy);
    let all_off = |what: &'static str| {
        let (bmcs, ms) = (&bmcs, machines.clone());
        async move {
            for _ in 0..5 {
                assert_eq!(bmcs.on(&ms).await, Vec::<String>::new(), "{what}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };

    // A capacity check with every server off: not found, nothing powered on.
    apply(&env, &request("check-off", CHECK, "small", 1));
    let cs = until_condition(&client, "check-off", "Provisioned=False:CapacityIsNotFound", Duration::from_secs(30)).await;
    assert!(cs.contains(&"Accepted=True:Accepted".to_string()), "{cs:?}");
    all_off("a capacity check powers nothing on").await;

    // Four pods of 6 CPU, three servers: all or nothing is nothing.
    apply(&env, &request("too-big", ATOMIC, "worker", 4));
    until_condition(&client, "too-big", "Provisioned=False:CapacityIsNotFound", Duration::from_secs(30)).await;
    all_off("no server is powered on for part of a gang").await;
    env.kubectl(["-n", NAMESPACE, "delete", "provisioningrequests.autoscaling.x-k8s.io", "too-big", "check-off"]).expect("delete");

    // Three: all three servers.
    let asked = Instant::now();
    apply(&env, &request("gang", ATOMIC, "worker", 3));
    let ms = machines.clone();
    eventually("all three servers on", Duration::from_secs(40), || {
        let (bmcs, ms) = (&bmcs, ms.clone());
        async move {
            let on = bmcs.on(&ms).await;
            if on.len() == 3 { Ok(()) } else { Err(format!("on: {on:?}")) }
        }
    })
    .await;
    let powered = asked.elapsed();
    until_condition(&client, "gang", "Provisioned=True:Provisioned", Duration::from_secs(60)).await;
    let provisioned = asked.elapsed();
    // Booked: the empty nodes stay, past their break-even, for the pods to come.
    sleep_s(6).await;
    assert_eq!(bmcs.on(&machines).await.len(), 3, "the booked room was scaled down");

    // The pods that consume the request land there; nothing more comes on.
    let consuming = json!({"metadata": {"labels": {"app": "preq-train"}, "annotations": {
        "autoscaling.x-k8s.io/consume-provisioning-request": "gang",
        "autoscaling.x-k8s.io/provisioning-class-name": ATOMIC}},
        "spec": {"containers": [app_container("6", "1Gi")], "nodeSelector": {POOL_LABEL: pool}}});
    apply(
        &env,
        &json!({
            "apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": "preq-train", "namespace": NAMESPACE},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "preq-train"}}, "template": consuming}
        }),
    );
    let c = client.clone();
    let nodes = eventually("the three pods bound", Duration::from_secs(40), || {
        let c = c.clone();
        async move {
            let mut nodes: Vec<String> =
                pods(&c, NAMESPACE, "app=preq-train").await.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
            nodes.sort();
            if nodes.len() == 3 { Ok(nodes) } else { Err(format!("bound on {nodes:?}")) }
        }
    })
    .await;
    let bound = asked.elapsed();
    assert_eq!(nodes, machines.iter().map(|m| m.name.clone()).collect::<Vec<_>>(), "one pod per server");

    // A pod of 1 CPU fits beside them: the capacity check finds it.
    apply(&env, &request("check-on", CHECK, "small", 1));
    until_condition(&client, "check-on", "Provisioned=True:CapacityIsFound", Duration::from_secs(30)).await;
    eprintln!(
        "provisioning request: all three servers on {:.1}s after the request, Provisioned at {:.1}s, its three pods bound at {:.1}s",
        powered.as_secs_f64(),
        provisioned.as_secs_f64(),
        bound.as_secs_f64()
    );
    running.stop().await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "provisioningrequests.autoscaling.x-k8s.io", "--all", "--ignore-not-found"]);
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", "preq-train", "--ignore-not-found"]);
    clean(&env, &client, &machines, pool).await;
}
