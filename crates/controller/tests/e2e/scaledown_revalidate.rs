//! Pacing of drains on the real control plane: an underutilized node is
//! drained only once a later pass proposes it again; when that drain is
//! abandoned at its timeout, the node is left alone for its cool-down,
//! then drained normally.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::scaledown::ScaleDownSettings;
use ironclaim_controller::scaledown::drain::DRAIN_ABANDONED_ANNOTATION;
use ironclaim_controller::{Controller, Settings};
use ironclaim_testenv::eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const SETTLE: Duration = Duration::from_secs(5);
const COOL_DOWN: Duration = Duration::from_secs(12);
const HOLD: &str = "e2e.ironclaim.dev/hold";

/// One small replica whose pods keep a finalizer: evicted, they stay
/// terminating until the test lets them go, so the drain times out.
fn held_replicaset(name: &str, pool: &str) -> serde_json::Value {
    one_replica(name, json!({"finalizers": [HOLD]}), json!({"nodeSelector": {POOL_LABEL: pool}, "containers": [app_container("1", "1Gi")]}))
}

async fn set_unschedulable(client: &Client, node: &str, on: bool) {
    let patch = json!({"spec": {"unschedulable": on}});
    Api::<Node>::all(client.clone()).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch node");
}

async fn release_held_pods(client: &Client, app: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for p in pods(client, NAMESPACE, &format!("app={app}")).await {
        let _ = api.patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"finalizers": null}}))).await;
    }
}

/// Waits until the node carries the disrupting taint (or is gone), and
/// returns when that was seen.
async fn cordoned(client: &Client, name: &str, within: Duration) -> Instant {
    let deadline = Instant::now() + within;
    loop {
        if node(client, name).await.is_none_or(|n| is_disrupting(&n)) {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{name} not cordoned within {within:?}; events {:?}", object_events(client, "Node", name).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_underutilized_drain_waits_for_a_second_proposal_and_an_abandoned_one_cools_down() {
    let (env, client) = setup().await;
    let pool = "sd-reval";
    let app = "sd-reval-held";
    let pinned = "sd-reval-pinned";
    let machines = machines("sd-reval", pool, 2, 71);
    let (a, b) = (machines[0].name.clone(), machines[1].name.clone());
    clean(&env, &client, &machines, pool).await;
    release_held_pods(&client, app).await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", app, "--ignore-not-found"]);
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "pod", pinned, "--ignore-not-found", "--grace-period=0"]);
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}], "drainTimeout": "3s"}));
    // Break-even: 10 W x 15 s / 150 W = 1 s.
    let (sushy, _harness) = powered_fleet(&env, &client, &machines, 10).await;
    // a runs one small replica that fits on b; b keeps a pod of its own.
    set_unschedulable(&client, &b, true).await;
    apply(&env, &held_replicaset(app, pool));
    let c = client.clone();
    eventually("the replica ready on a", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let ps = pods(&c, NAMESPACE, &format!("app={app}")).await;
            if ps.iter().any(ready) { Ok(()) } else { Err(format!("{:?}", crate::scaledown_support::names(&ps))) }
        }
    })
    .await;
    set_unschedulable(&client, &b, false).await;
    apply(&env, &pod(pinned, "2", "2Gi", &[("kubernetes.io/hostname", &b)], 0));
    let c = client.clone();
    eventually("the pinned pod bound to b", Duration::from_secs(20), || {
        let c = c.clone();
        async move { pod_node(&c, pinned).await.ok_or("pending".to_string()) }
    })
    .await;

    let settings = Settings {
        scaledown: ScaleDownSettings { revalidate_after: SETTLE, drain_cool_down: COOL_DOWN, ..ScaleDownSettings::default() },
        ..settings("sd-reval")
    };
    let started = Instant::now();
    let running = run(Controller::new(client.clone(), redfish(&client), settings));

    // The drain of a waits for a second proposal at least SETTLE later.
    let first_cordon = cordoned(&client, &a, Duration::from_secs(40)).await;
    let events = object_events(&client, "Node", &a).await;
    assert!(events.iter().any(|e| e.starts_with("ConsolidationProposed:")), "{events:?}");
    // The driver's clock counts whole seconds: the second proposal comes
    // SETTLE after the second the first fell in, so less than a second of
    // it may have passed already.
    let at_least = SETTLE - Duration::from_secs(1);
    assert!(first_cordon - started >= at_least, "cordoned {:?} after start, before the {SETTLE:?} re-validation", first_cordon - started);

    // Its pod cannot leave (finalizer): abandoned at the 3 s timeout, uncordoned, stamped.
    let c = client.clone();
    let an = a.clone();
    let (abandoned_at, stamp) = eventually("the drain abandoned and a uncordoned", Duration::from_secs(30), || {
        let (c, an) = (c.clone(), an.clone());
        async move {
            let n = node(&c, &an).await.ok_or("a is gone".to_string())?;
            let stamped = n.annotations().get(DRAIN_ABANDONED_ANNOTATION).cloned();
            match (is_disrupting(&n), stamped) {
                (false, Some(at)) => Ok((Instant::now(), at)),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let events = object_events(&client, "Node", &a).await;
    assert!(events.iter().any(|e| e.starts_with("DrainAbandoned:") && e.contains("timed out")), "{events:?}");

    // Cooling down: a looks empty now (its pod is terminating) and idle past
    // break-even, yet it is not drained again. The window is counted from
    // the stamp itself, the time the controller counts from.
    let stamped = stamp.parse::<jiff::Timestamp>().expect("the stamp is a time");
    let since_stamp = Duration::try_from(jiff::Timestamp::now().duration_since(stamped)).unwrap_or_default();
    let stamped_at = Instant::now() - since_stamp;
    let watch_until = stamped_at + COOL_DOWN - Duration::from_secs(2);
    while Instant::now() < watch_until {
        let n = node(&client, &a).await.expect("a kept");
        if is_disrupting(&n) {
            let taint = n.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
            panic!(
                "a drained again {:?} after its drain was abandoned (stamped {stamp}, now {}); taints {taint:?}; events {:?}",
                abandoned_at.elapsed(),
                jiff::Timestamp::now(),
                object_events(&client, "Node", &a).await
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let events = object_events(&client, "Node", &a).await;
    assert!(events.iter().any(|e| e.starts_with("ScaleDownHeld:") && e.contains("cool-down")), "{events:?}");

    // The pod may go now; once the cool-down is over, a is drained and powered off.
    release_held_pods(&client, app).await;
    let second_cordon = cordoned(&client, &a, Duration::from_secs(40)).await;
    assert!(second_cordon >= stamped_at + COOL_DOWN - Duration::from_secs(1), "drained again {:?} after abandoning", second_cordon - stamped_at);
    let bmcs = Bmcs::new(&sushy);
    let (bm, ma) = (&bmcs, machines[0].clone());
    eventually("a powered off", Duration::from_secs(40), || async {
        if bm.is_on(&ma).await == Some(false) { Ok(()) } else { Err("still on".to_string()) }
    })
    .await;
    assert_eq!(bmcs.is_on(&machines[1]).await, Some(true), "b, which runs pods, was powered off");

    running.stop().await;
    release_held_pods(&client, app).await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", app, "--ignore-not-found"]);
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "pod", pinned, "--ignore-not-found", "--grace-period=0"]);
    clean(&env, &client, &machines, pool).await;
}
