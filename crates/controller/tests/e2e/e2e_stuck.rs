//! A server that powers on but never registers a node is stuck by its own
//! measured durations: powered off, its failure counted, another claimed.

use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_k8s::api::serverclaim::{FailureReason, StageOutcome};
use ironclaim_testenv::eventually;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_never_registers_is_stuck_powered_off_and_another_is_claimed() {
    let (env, client) = setup().await;
    // The stuck one fits the pod more tightly, so it is chosen first.
    let machines = vec![Machine::new("pxe-stuck", 11, 20, 40).never_registers(), Machine::new("spare", 12, 24, 48)];
    let sushy = start_sushy_for(&machines, SystemPower::Off);
    for m in &machines {
        apply(&env, &m.server_json(&sushy));
    }
    apply(&env, &serverpool("default", json!([]), json!({})));
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    let running = run(Controller::new(client.clone(), redfish(&client), settings("stuck")));

    apply(&env, &pod("job", "16", "32Gi", &[], 0));

    let c = client.clone();
    eventually("the job bound to the spare", Duration::from_secs(55), || {
        let c = c.clone();
        async move {
            match pod_node(&c, "job").await {
                Some(node) => Ok(node),
                None => Err(format!("{:?}", names(&claims(&c).await))),
            }
        }
    })
    .await;
    assert_eq!(pod_node(&client, "job").await.as_deref(), Some("spare"));

    let all = claims(&client).await;
    let stuck = all.iter().find(|c| c.spec.server == "pxe-stuck").expect("a claim on the stuck server");
    let status = stuck.status.as_ref().unwrap();
    assert_eq!(status.failure_reason, Some(FailureReason::RegistrationTimedOut), "{status:?}");
    let message = status.failure_message.clone().unwrap();
    assert!(message.contains("no node registered; it usually registers in 3s (stuck after 8s)"), "{message}");
    assert_eq!(status.stages.last().unwrap().outcome, StageOutcome::TimedOut);

    // Powered off again and released, with the failure counted.
    let c = client.clone();
    eventually("the stuck server released", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let s = server(&c, "pxe-stuck").await.status.unwrap_or_default();
            if s.claim.is_none() && s.failures == 1 { Ok(()) } else { Err(format!("{s:?}")) }
        }
    })
    .await;
    let on_off = sushy.resets(&machines[0].uuid);
    assert_eq!(on_off, 2, "one power-on and one power-off: {}", sushy.log_text());
    let events = pod_events(&client, "job").await;
    assert!(events.iter().any(|e| e.starts_with("ClaimFailed:") && e.contains("RegistrationTimedOut")), "{events:?}");
    running.stop().await;
}
