//! `controller --dry-run` on the real control plane: a pod that needs a
//! server powered on and an empty node past break-even are each told what
//! would be done (Events, reason DryRun, and a count), and nothing is done:
//! no ServerClaim, no power-on or power-off at the emulator, no cordon.

use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::{Controller, Settings};
use ironclaim_testenv::eventually;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_tells_the_claim_and_the_drain_it_would_make_and_makes_neither() {
    let (env, client) = setup().await;
    let pool = "dry";
    let label = |m: Machine| m.label(POOL_LABEL, pool).label("ironclaim.dev/class", "small");
    // dry-0 is on with an empty node; dry-1, large, is off.
    let machines = vec![label(Machine::new("dry-0", 91, 8, 16)), label(Machine::new("dry-1", 92, 32, 64))];
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let sushy = start_sushy([(machines[0].uuid.clone(), SystemPower::On), (machines[1].uuid.clone(), SystemPower::Off)]);
    // Break-even: 10 W x 15 s / 150 W = 1 s.
    apply_servers(&env, &sushy, &machines, 10);
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    let (c, on) = (client.clone(), machines[..1].to_vec());
    eventually("dry-0's node ready", Duration::from_secs(30), || {
        let (c, on) = (c.clone(), on.clone());
        async move { nodes_ready(&c, &on).await }
    })
    .await;
    // Fits only dry-1, which is off.
    apply(&env, &pod("dry-big", "20", "8Gi", &[], 0));

    let controller = Controller::new(client.clone(), redfish(&client), Settings { dry_run: true, ..settings("dry") });
    let metrics = controller.metrics();
    let running = run(controller);

    let c = client.clone();
    let told = eventually("the pod told of the claim it would make", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let events = pod_events(&c, "dry-big").await;
            events.into_iter().find(|e| e.starts_with("DryRun:")).ok_or_else(|| "no DryRun event yet".to_string())
        }
    })
    .await;
    assert!(told.contains("would claim server dry-1") && told.contains(&format!("{NAMESPACE}/dry-big")), "{told}");
    let c = client.clone();
    let drain = eventually("the node told of the drain it would make", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let events = object_events(&c, "Node", "dry-0").await;
            events.into_iter().find(|e| e.starts_with("DryRun:")).ok_or_else(|| "no DryRun event yet".to_string())
        }
    })
    .await;
    assert!(drain.contains("would cordon and drain (empty)"), "{drain}");

    // Nothing was done, pass after pass.
    let bmcs = Bmcs::new(&sushy);
    for _ in 0..5 {
        assert!(claims(&client).await.is_empty(), "a dry run wrote a ServerClaim");
        assert_eq!(bmcs.is_on(&machines[0]).await, Some(true), "a dry run powered dry-0 off");
        assert_eq!(bmcs.is_on(&machines[1]).await, Some(false), "a dry run powered dry-1 on");
        let n = node(&client, "dry-0").await.expect("dry-0's node kept");
        assert!(!is_disrupting(&n) && !is_unschedulable(&n), "a dry run cordoned dry-0");
        assert!(object_events(&client, "Node", "dry-0").await.iter().all(|e| !e.starts_with("Draining:")), "a drain told as under way");
        sleep_s(1).await;
    }
    // Decided again every pass (counted), told once while the words stay
    // the same: one Event, never repeated into a series.
    let events: kube::Api<k8s_openapi::api::events::v1::Event> = kube::Api::namespaced(client.clone(), NAMESPACE);
    let told: Vec<_> = events
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("DryRun") && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("dry-big"))
        .collect();
    let repeats: Vec<i32> = told.iter().map(|e| e.series.as_ref().map_or(1, |s| s.count)).collect();
    assert_eq!(repeats, [1], "the same dry-run decision told more than once");
    let text = metrics.render();
    for action in ["claim", "drain"] {
        assert!(text.contains(&format!("ironclaim_dry_run_actions_total{{action=\"{action}\"}}")), "{action} not counted:\n{text}");
    }

    running.stop().await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "pod", "dry-big", "--ignore-not-found", "--grace-period=0"]);
    clean(&env, &client, &machines, pool).await;
}
