//! Idle time survives a restart: the controller records on each Server
//! since when it idles, and a new controller carries on from that record,
//! so break-even is not waited out again from zero.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_testenv::eventually;
use serde_json::json;

/// `status.idleSince` of a server, in seconds.
async fn idle_since(client: &kube::Client, name: &str) -> Option<i64> {
    server(client, name).await.status.and_then(|s| s.idle_since).map(|t| t.0.as_second())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_controller_carries_on_from_the_recorded_idle_time() {
    let (env, client) = setup().await;
    let pool = "sd-idle";
    let machines = machines("sd-idle", pool, 1, 61);
    let name = machines[0].name.clone();
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    // Break-even: 300 W x 15 s / 150 W = 30 s.
    let (_sushy, _harness) = powered_fleet(&env, &client, &machines, 300).await;

    // The first controller sees the empty node idle and records it.
    let first = run(Controller::new(client.clone(), redfish(&client), settings("sd-idle-1")));
    let (c, n) = (client.clone(), name.clone());
    let since = eventually("idleSince recorded", Duration::from_secs(20), || {
        let (c, n) = (c.clone(), n.clone());
        async move { idle_since(&c, &n).await.ok_or("not yet".to_string()) }
    })
    .await;
    let recorded_at = Instant::now();
    let now = jiff::Timestamp::now().as_second();
    assert!((now - since).abs() <= 5, "idleSince {since} is not about now ({now})");

    // A third of the way to break-even it stops; another takes over.
    let third = Duration::from_secs(10);
    tokio::time::sleep(third.saturating_sub(recorded_at.elapsed())).await;
    first.stop().await;
    assert!(node(&client, &name).await.is_some_and(|n| !is_disrupting(&n)), "drained before break-even");
    let second = run(Controller::new(client.clone(), redfish(&client), settings("sd-idle-2")));
    let restarted = Instant::now();

    // The drain starts 30 s after the recorded start, not 30 s after the restart.
    let deadline = restarted + Duration::from_secs(40);
    let cordoned = loop {
        if node(&client, &name).await.is_none_or(|n| is_disrupting(&n)) {
            break restarted.elapsed();
        }
        assert!(Instant::now() < deadline, "not drained 40 s after the restart");
        assert_eq!(idle_since(&client, &name).await, Some(since), "the second controller rewrote idleSince");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let idled = jiff::Timestamp::now().as_second() - since;
    assert!(idled >= 29, "drained after {idled} s of idling, before the 30 s break-even");
    assert!(cordoned < Duration::from_secs(25), "drained {cordoned:?} after the restart: break-even was waited out from zero");

    // Once off, the record is cleared.
    let (c, n) = (client.clone(), name.clone());
    eventually("idleSince cleared once off", Duration::from_secs(40), || {
        let (c, n) = (c.clone(), n.clone());
        async move {
            match idle_since(&c, &n).await {
                None => Ok(()),
                Some(t) => Err(format!("still {t}")),
            }
        }
    })
    .await;
    second.stop().await;
    clean(&env, &client, &machines, pool).await;
}
