//! The controller dies after claiming a server and sending its power-on,
//! before the ServerClaim is written. A new controller leaves the claim alone
//! while it could still be opening, then powers the server off and
//! releases it; the pod is placed on another server and nothing is powered
//! on twice.

use std::time::{Duration, Instant};

use crate::support::*;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_testenv::eventually;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_left_without_its_serverclaim_waits_out_the_grace_then_is_released_without_a_second_power_on() {
    let (env, client) = setup().await;
    let (machines, sushy) = two_machines_the_second_on(&env, 41, true);
    let grace = Duration::from_secs(20);
    let claimed_at = jiff::Timestamp::now();
    let servers: Api<ironclaim_k8s::api::Server> = Api::all(client.clone());
    servers
        .patch_status(
            "r1-u02",
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"claim": "default-r1-u02-gone1", "claimedAt": claimed_at.to_string(), "powerState": "PoweringOn"}})),
        )
        .await
        .unwrap();
    let written = Instant::now();
    // r1-u02 must not boot into a node: it belongs to nobody now. A sweep
    // runs well inside the grace, and the opening claim is untouched.
    let (controller, _harness) = restart_after_dead_opening(&env, &client, &sushy, &machines, "restarted", grace).await;
    let held = server(&client, "r1-u02").await.status.unwrap_or_default();
    assert!(written.elapsed() < grace, "the check ran after the grace ({:?}); it proves nothing", written.elapsed());
    assert_eq!(held.claim.as_deref(), Some("default-r1-u02-gone1"), "released inside the grace: {held:?}");
    assert_eq!(sushy.resets(&machines[1].uuid), 0, "r1-u02 touched inside the grace: {}", sushy.log_text());

    await_bound(&client, "app", Duration::from_secs(40)).await;
    assert_eq!(pod_node(&client, "app").await.as_deref(), Some("r1-u01"));

    let c = client.clone();
    eventually("r1-u02 powered off and released after the grace", Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            let s = server(&c, "r1-u02").await.status.unwrap_or_default();
            if s.claim.is_none() && s.claimed_at.is_none() && s.power_state == Some(PowerState::Off) { Ok(()) } else { Err(format!("{s:?}")) }
        }
    })
    .await;
    assert!(written.elapsed() >= grace, "released before the grace ended");
    // One reset on r1-u02, the power-off; one on r1-u01, its power-on.
    assert_eq!(sushy.resets(&machines[1].uuid), 1, "{}", sushy.log_text());
    assert_eq!(sushy.resets(&machines[0].uuid), 1, "{}", sushy.log_text());
    assert_eq!(claims(&client).await.len(), 1, "one claim, for r1-u01");
    assert_eq!(server(&client, "r1-u02").await.status.unwrap().failures, 0, "an abandoned opening is not the server's failure");
    controller.stop().await;
}
