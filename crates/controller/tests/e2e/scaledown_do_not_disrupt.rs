//! A pod that must not be disrupted keeps its server on, even when its
//! node is underutilized and the pod would fit elsewhere.

use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_testenv::eventually;
use serde_json::json;

fn replicaset(name: &str, cpu: &str, placement: serde_json::Value, annotations: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({"containers": [app_container(cpu, "1Gi")], "tolerations": [{"operator": "Exists"}]});
    for (k, v) in placement.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    one_replica(name, json!({"annotations": annotations}), spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_do_not_disrupt_pod_keeps_its_underutilized_server_on() {
    let (env, client) = setup().await;
    let pool = "sd-dnr";
    let machines = machines("sd-dnr", pool, 3, 1);
    let (a, b, c_) = (&machines[0].name, &machines[1].name, &machines[2].name);
    clean(&env, &client, &machines, pool).await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", "sd-dnr-keep", "sd-dnr-pinned", "--ignore-not-found"]);
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let (sushy, _harness) = powered_fleet(&env, &client, &machines, 10).await;
    // On a: a small pod that would fit on b, but must not be disrupted.
    apply(&env, &replicaset("sd-dnr-keep", "1", json!({"nodeName": a}), json!({"ironclaim.dev/do-not-disrupt": "true"})));
    // On b: a pod pinned there, so b stays for its own reason.
    apply(&env, &replicaset("sd-dnr-pinned", "2", json!({"nodeSelector": {"kubernetes.io/hostname": b}}), json!({})));
    let c = client.clone();
    let kept = eventually("the pods running", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let keep = pods(&c, NAMESPACE, "app=sd-dnr-keep").await;
            let pinned = pods(&c, NAMESPACE, "app=sd-dnr-pinned").await;
            match (keep.first(), pinned.first()) {
                (Some(k), Some(p)) if ready(k) && ready(p) => Ok(k.metadata.uid.clone()),
                _ => Err("not ready yet".to_string()),
            }
        }
    })
    .await;

    let controller = Controller::new(client.clone(), redfish(&client), settings("sd-dnr"));
    let running = run(controller);
    let bmcs = Bmcs::new(&sushy);
    // The empty server goes: the controller is acting.
    let (bm, empty) = (&bmcs, machines[2].clone());
    eventually("the empty server powered off", Duration::from_secs(40), || async {
        if bm.is_on(&empty).await == Some(false) { Ok(()) } else { Err(format!("{c_} still on")) }
    })
    .await;
    // Several passes later, the protected pod's server is still on and untouched.
    sleep_s(6).await;
    assert_eq!(bmcs.is_on(&machines[0]).await, Some(true), "the do-not-disrupt pod's server was powered off");
    let n = node(&client, a).await.expect("node a");
    assert!(!is_disrupting(&n) && !is_unschedulable(&n), "node a was cordoned");
    let keep = pods(&client, NAMESPACE, "app=sd-dnr-keep").await;
    assert_eq!(keep.len(), 1);
    assert_eq!(keep[0].metadata.uid, kept, "the do-not-disrupt pod was replaced");
    assert_eq!(keep[0].spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(a.as_str()));
    let events = object_events(&client, "Node", a).await;
    assert!(events.iter().any(|e| e.starts_with("ScaleDownHeld:") && e.contains("must not be disrupted")), "{events:?}");
    assert_eq!(bmcs.is_on(&machines[1]).await, Some(true));
    // Not drained, a is left to empty by attrition: the emptier of the
    // two, its pod fits beside b's, so new pods are steered to b.
    let emptying = |n: &k8s_openapi::api::core::v1::Node| {
        n.spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "ironclaim.dev/emptying" && t.effect == "PreferNoSchedule"))
    };
    assert!(emptying(&n), "node a is not marked to empty: {:?}", n.spec);
    assert!(!emptying(&node(&client, b).await.expect("node b")), "node b was marked too");
    assert!(events.iter().any(|e| e.starts_with("Emptying:") && e.contains("fit on the other nodes")), "{events:?}");
    running.stop().await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", "sd-dnr-keep", "sd-dnr-pinned", "--ignore-not-found"]);
    clean(&env, &client, &machines, pool).await;
}
