//! Scale-down end to end: once the workload is gone, empty servers are
//! drained and powered off after their break-even time, except the
//! warm-spare floor.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_testenv::eventually;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_servers_power_off_after_break_even_and_the_warm_floor_stays_on() {
    let (env, client) = setup().await;
    let pool = "sd-floor";
    let machines = machines("sd-floor", pool, 3, 1);
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 1, json!({"budgets": [{"nodes": "100%"}]}));
    // Break-even: 100 W x 15 s / 150 W = 10 s.
    let (sushy, _harness) = powered_fleet(&env, &client, &machines, 100).await;
    for m in &machines {
        apply(&env, &pod(&format!("{}-work", m.name), "2", "2Gi", &[("kubernetes.io/hostname", &m.name)], 0));
    }
    let c = client.clone();
    let ms = machines.clone();
    eventually("every workload bound", Duration::from_secs(20), || {
        let (c, ms) = (c.clone(), ms.clone());
        async move {
            for m in &ms {
                pod_node(&c, &format!("{}-work", m.name)).await.ok_or(format!("{}-work pending", m.name))?;
            }
            Ok(())
        }
    })
    .await;

    let controller = Controller::new(client.clone(), redfish(&client), settings("sd-floor"));
    let metrics = controller.metrics();
    let running = run(controller);
    let bmcs = Bmcs::new(&sushy);
    // Busy servers stay on.
    sleep_s(3).await;
    assert_eq!(bmcs.on(&machines).await.len(), 3, "a busy server was powered off");

    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for m in &machines {
        pods.delete(&format!("{}-work", m.name), &DeleteParams::default().grace_period(0)).await.expect("delete pod");
    }
    let emptied = Instant::now();

    // Nothing is cordoned before break-even; then two of three go.
    let mut first_cordon: Option<Duration> = None;
    let deadline = Instant::now() + Duration::from_secs(50);
    loop {
        for m in &machines {
            if first_cordon.is_none() && node(&client, &m.name).await.is_some_and(|n| is_disrupting(&n)) {
                first_cordon = Some(emptied.elapsed());
            }
        }
        let on = bmcs.on(&machines).await;
        if on.len() == 1 {
            break;
        }
        assert!(Instant::now() < deadline, "still on after 50 s: {on:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let first_cordon = first_cordon.expect("a drain was seen");
    assert!(first_cordon >= Duration::from_secs(9), "drained {first_cordon:?} after the pods left, before the 10 s break-even");

    // The floor holds: one spare stays on, with its node, pass after pass.
    sleep_s(5).await;
    let on = bmcs.on(&machines).await;
    assert_eq!(on.len(), 1, "the warm floor was crossed: {on:?}");
    assert!(node(&client, &on[0]).await.is_some(), "the warm spare lost its node");
    for m in machines.iter().filter(|m| m.name != on[0]) {
        let c = client.clone();
        let name = m.name.clone();
        eventually("the drained node deleted", Duration::from_secs(10), || {
            let (c, name) = (c.clone(), name.clone());
            async move { if node(&c, &name).await.is_none() { Ok(()) } else { Err(format!("{name} still has a node")) } }
        })
        .await;
        let events = object_events(&client, "Node", &m.name).await;
        assert!(events.iter().any(|e| e.starts_with("Drained:")), "{events:?}");
    }
    let text = metrics.render();
    assert!(text.contains("ironclaim_scaledown_actions_total{action=\"drain\",reason=\"empty\",outcome=\"done\"} 2"), "{text}");
    running.stop().await;
    clean(&env, &client, &machines, pool).await;
}

/// The soft taint of a warm spare goes on and comes off a real Node, and
/// leaves the node's other taints as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_node_is_marked_with_a_soft_taint_and_unmarked_leaving_other_taints() {
    let (env, client) = setup().await;
    apply(&env, &existing_node("spare-mark", 8, 16, &[], 0, &["keep-me"]));
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let taints = |n: k8s_openapi::api::core::v1::Node| -> Vec<(String, String)> {
        n.spec.and_then(|s| s.taints).unwrap_or_default().into_iter().map(|t| (t.key, t.effect)).collect()
    };
    use ironclaim_controller::scaledown::drain::mark;
    use ironclaim_core::provision::SPARE_TAINT;
    mark(&client, "spare-mark", SPARE_TAINT, true).await.expect("mark");
    mark(&client, "spare-mark", SPARE_TAINT, true).await.expect("mark again");
    let spare = ("ironclaim.dev/spare".to_string(), "PreferNoSchedule".to_string());
    let keep = ("keep-me".to_string(), "NoSchedule".to_string());
    // The node lifecycle controller may add taints of its own meanwhile.
    let marked = taints(nodes.get("spare-mark").await.unwrap());
    assert!(marked.contains(&keep) && marked.iter().filter(|t| **t == spare).count() == 1, "{marked:?}");
    mark(&client, "spare-mark", SPARE_TAINT, false).await.expect("unmark");
    let unmarked = taints(nodes.get("spare-mark").await.unwrap());
    assert!(unmarked.contains(&keep) && !unmarked.contains(&spare), "{unmarked:?}");
    mark(&client, "no-such-node", SPARE_TAINT, true).await.expect("a node already gone is fine");
    nodes.delete("spare-mark", &DeleteParams::default()).await.unwrap();
}
