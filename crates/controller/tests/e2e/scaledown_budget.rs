//! A disruption budget of one node holds while ten servers are idle: they
//! are drained one at a time.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_one_node_drains_ten_idle_servers_one_at_a_time() {
    let (env, client) = setup().await;
    let pool = "sd-budget";
    let machines = machines("sd-budget", pool, 10, 1);
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "1"}]}));
    // Break-even: 10 W x 15 s / 150 W = 1 s.
    let (sushy, _harness) = powered_fleet(&env, &client, &machines, 10).await;

    let controller = Controller::new(client.clone(), redfish(&client), settings("sd-budget"));
    let running = run(controller);
    let bmcs = Bmcs::new(&sushy);
    let mut most_at_once = 0;
    let mut drained_seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(35);
    let mut off = 0;
    let mut round = 0u32;
    // Sample until two servers are off, one after the other.
    while off < 2 {
        assert!(Instant::now() < deadline, "only {off} server(s) powered off in 35 s: the drains did not follow one another");
        let mut disrupting = Vec::new();
        for m in &machines {
            if node(&client, &m.name).await.is_some_and(|n| is_disrupting(&n)) {
                disrupting.push(m.name.clone());
                drained_seen.insert(m.name.clone());
            }
        }
        assert!(disrupting.len() <= 1, "the budget of one node was exceeded: {disrupting:?}");
        most_at_once = most_at_once.max(disrupting.len());
        round += 1;
        if round.is_multiple_of(10) {
            off = machines.len() - bmcs.on(&machines).await.len();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the budget keeps holding a while longer.
    let until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < until {
        let mut disrupting = 0;
        for m in &machines {
            if node(&client, &m.name).await.is_some_and(|n| is_disrupting(&n)) {
                disrupting += 1;
            }
        }
        assert!(disrupting <= 1, "the budget of one node was exceeded: {disrupting} nodes disrupting");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(most_at_once, 1, "nothing was seen draining");
    assert!(drained_seen.len() >= off, "a server went off without a drain: seen {drained_seen:?}, off {off}");
    running.stop().await;
    clean(&env, &client, &machines, pool).await;
}
