//! A ServerPool with `disruption.nodeAfterPowerOff: Park` keeps the Node of
//! a server it powers off: cordoned, marked `Suspended=True` as Cluster
//! Autoscaler reads it, and counted as no node. A pending pod then takes
//! the server again, and once the kubelet is back from a new boot the node
//! is unparked and the pod bound on it.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_k8s::node::{PARKED_AT_ANNOTATION, PARKED_BOOT_ID_ANNOTATION, PARKED_LABEL, SUSPENDED_CONDITION};
use ironclaim_testenv::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde_json::json;

fn suspended(node: &Node) -> Option<(String, String)> {
    let c = node.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == SUSPENDED_CONDITION)?;
    Some((c.status.clone(), c.reason.clone().unwrap_or_default()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parking_pool_keeps_the_node_of_a_server_it_powers_off_and_brings_it_back_for_a_pod() {
    let (env, client) = setup().await;
    let pool = "sd-park";
    let machines: Vec<Machine> = machines("sd-park", pool, 1, 161).into_iter().map(Machine::keeping_its_node).collect();
    let name = machines[0].name.clone();
    clean(&env, &client, &machines, pool).await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", "sd-park-app", "--ignore-not-found"]);
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}], "nodeAfterPowerOff": "Park"}));
    let (sushy, _harness) = powered_fleet(&env, &client, &machines, 10).await;

    let controller = Controller::new(client.clone(), redfish(&client), settings("sd-park"));
    let running = run(controller);
    let bmcs = Bmcs::new(&sushy);
    let started = Instant::now();
    let (bm, m) = (&bmcs, machines[0].clone());
    eventually("the empty server powered off", Duration::from_secs(40), || async {
        if bm.is_on(&m).await == Some(false) { Ok(()) } else { Err(format!("{} still on", m.name)) }
    })
    .await;
    let off_after = started.elapsed();
    let c = client.clone();
    let n = name.clone();
    let parked = eventually("the node parked", Duration::from_secs(20), || {
        let (c, n) = (c.clone(), n.clone());
        async move {
            let node = node(&c, &n).await.ok_or("the node was deleted")?;
            if suspended(&node).is_some_and(|(s, _)| s == "True") { Ok(node) } else { Err(format!("not parked yet: {:?}", suspended(&node))) }
        }
    })
    .await;
    let parked_after = started.elapsed();
    assert_eq!(suspended(&parked), Some(("True".into(), "PoweredOff".into())));
    assert_eq!(parked.labels().get(PARKED_LABEL).map(String::as_str), Some("true"));
    assert!(parked.annotations().contains_key(PARKED_AT_ANNOTATION), "{:?}", parked.annotations());
    assert_eq!(parked.annotations().get(PARKED_BOOT_ID_ANNOTATION).map(String::as_str), Some(format!("{name}-boot-1").as_str()));
    assert!(is_unschedulable(&parked) && !is_disrupting(&parked), "parked: cordoned, the drain's taint gone");
    let out_of_service = |n: &Node| {
        n.spec.as_ref().and_then(|s| s.taints.as_ref()).is_some_and(|ts| {
            ts.iter().any(|t| t.key == "node.kubernetes.io/out-of-service" && t.effect == "NoExecute" && t.value.as_deref() == Some("nodeshutdown"))
        })
    };
    assert!(out_of_service(&parked), "parked: out of service, so nothing stays bound to it");
    let events = object_events(&client, "Node", &name).await;
    assert!(events.iter().any(|e| e.starts_with("Drained:") && e.contains("parked")), "{events:?}");
    // Several passes later: still parked, the server off and free.
    sleep_s(4).await;
    assert_eq!(bmcs.is_on(&machines[0]).await, Some(false));
    let s = server(&client, &name).await;
    assert!(s.status.as_ref().and_then(|st| st.claim.as_deref()).is_none_or(str::is_empty), "{:?}", s.status);

    // A pod only this server can take: the parked node counts as none, so
    // the server is claimed and powered on; the kubelet comes back from a
    // new boot and the node is unparked.
    let asked = Instant::now();
    let spec = json!({"containers": [app_container("6", "1Gi")], "nodeSelector": {POOL_LABEL: pool}});
    apply(&env, &one_replica("sd-park-app", json!({}), spec));
    let c = client.clone();
    let bound_to = eventually("the pod bound on the unparked node", Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            let pods = pods(&c, NAMESPACE, "app=sd-park-app").await;
            match pods.first().and_then(|p| p.spec.as_ref()?.node_name.clone()) {
                Some(node) => Ok(node),
                None => Err("not bound yet".to_string()),
            }
        }
    })
    .await;
    let bound_after = asked.elapsed();
    assert_eq!(bound_to, name, "bound on the node that was parked");
    let back = node(&client, &name).await.expect("node");
    assert_eq!(suspended(&back), Some(("False".into(), "PoweredOn".into())));
    assert!(!back.labels().contains_key(PARKED_LABEL) && !back.annotations().contains_key(PARKED_AT_ANNOTATION), "{:?}", back.metadata);
    assert!(!is_unschedulable(&back) && !out_of_service(&back), "schedulable again");
    let events = object_events(&client, "Node", &name).await;
    assert!(events.iter().any(|e| e.starts_with("Unparked:")), "{events:?}");
    eprintln!(
        "park: powered off {:.1}s after start, parked at {:.1}s; a pod asked for the server bound on its unparked node {:.1}s later",
        off_after.as_secs_f64(),
        parked_after.as_secs_f64(),
        bound_after.as_secs_f64()
    );
    running.stop().await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", "sd-park-app", "--ignore-not-found"]);
    clean(&env, &client, &machines, pool).await;
}
