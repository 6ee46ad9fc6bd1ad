//! The BMC fails: the claim shows the typed reason and retries with
//! backoff; when the BMC answers again the claim goes on.

use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_controller::claims::{POWERED_ON_CONDITION, Retry};
use ironclaim_testenv::eventually;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_bmc_is_a_typed_reason_retried_with_backoff_until_it_answers() {
    let (env, client) = setup().await;
    let machines = vec![Machine::new("bmc-flaky", 21, 16, 32)];
    let mut sushy = start_sushy_for(&machines, SystemPower::Off);
    for m in &machines {
        apply(&env, &m.server_json(&sushy));
    }
    apply(&env, &serverpool("default", json!([]), json!({})));
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    let mut settings = settings("bmc-failure");
    settings.claims.retry = Retry { base: Duration::from_millis(500), max: Duration::from_secs(4), attempts: 10 };
    let running = run(Controller::new(client.clone(), redfish(&client), settings));

    sushy.kill();
    apply(&env, &pod("app", "8", "8Gi", &[], 0));

    let c = client.clone();
    let seen = eventually("a second failed attempt on the claim", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let all = claims(&c).await;
            let condition =
                all.iter().filter_map(|c| c.status.as_ref()).flat_map(|s| s.conditions.iter()).find(|c| c.type_ == POWERED_ON_CONDITION).cloned();
            match condition {
                Some(c) if c.status == "False" && c.message.starts_with("attempt 2 of 10") => Ok(c),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    assert_eq!(seen.reason, "BmcUnreachable", "{seen:?}");
    assert!(seen.message.contains("retrying in 1s"), "the backoff doubles: {}", seen.message);
    let all = claims(&client).await;
    assert_eq!(all.len(), 1);
    assert!(all[0].status.as_ref().unwrap().failure_reason.is_none(), "still retrying, not failed");

    sushy.restart().expect("restart the emulator");
    let c = client.clone();
    eventually("the app bound once the BMC answers", Duration::from_secs(40), || {
        let c = c.clone();
        async move { pod_node(&c, "app").await.ok_or_else(|| "pending".to_string()) }
    })
    .await;
    assert_eq!(pod_node(&client, "app").await.as_deref(), Some("bmc-flaky"));
    let all = claims(&client).await;
    let condition = all[0].status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == POWERED_ON_CONDITION).cloned().unwrap();
    assert_eq!((condition.status.as_str(), condition.reason.as_str()), ("True", "Confirmed"));
    running.stop().await;
}
