//! The controller dies after taking a server's claim lock and sending its
//! power-on, before writing the claim to the Server: only the lock says
//! the server is taken (in its shard of the ledger, or in the single
//! ledger of an earlier version). A new controller leaves it alone while it could
//! still be opening, then breaks the lock and powers the server off; the
//! pod is placed on another server and nothing is powered on twice.

use std::time::{Duration, Instant};

use crate::support::*;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_testenv::eventually;
use kube::Api;
use serde_json::json;

/// A lock ledger ConfigMap named `ledger` whose only entry locks r1-u02
/// for `holder`, taken now, as an opening that died left it; the ledgers'
/// API.
async fn ledger_locking_r1_u02(client: &kube::Client, ledger: &str, holder: &str) -> Api<k8s_openapi::api::core::v1::ConfigMap> {
    use ironclaim_controller::locks::LEDGER_LABEL;
    let ledgers: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let acquired = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let entry = json!({"holder": holder, "acquired": acquired}).to_string();
    let ledger = serde_json::from_value(json!({
        "metadata": {"name": ledger, "labels": {LEDGER_LABEL: "true"}},
        "data": {"r1-u02": entry}
    }))
    .unwrap();
    ledgers.create(&Default::default(), &ledger).await.unwrap();
    ledgers
}

/// The lock is left in the single ledger of the version before shards,
/// as a controller upgraded from it finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lock_left_in_the_single_ledger_of_an_earlier_version_waits_out_the_grace_then_is_broken_and_the_server_powered_off() {
    use ironclaim_controller::locks::{LEGACY_LEDGER_NAME, ledger_of};
    let (env, client) = setup().await;
    let (machines, sushy) = two_machines_the_second_on(&env, 51, true);
    let ledgers = ledger_locking_r1_u02(&client, LEGACY_LEDGER_NAME, "default-r1-u02-gone2").await;
    // The server's shard's lock, else the legacy ledger's.
    let lock_of = |server: &'static str| {
        let ledgers = ledgers.clone();
        async move {
            let mut value = None;
            for name in [ledger_of(server), LEGACY_LEDGER_NAME.to_string()] {
                let ledger = ledgers.get_opt(&name).await.map_err(|e| e.to_string())?;
                value = value.or(ledger.and_then(|l| l.data).unwrap_or_default().remove(server));
            }
            Ok::<_, String>(value.map(|v| serde_json::from_str::<serde_json::Value>(&v).unwrap()["holder"].as_str().unwrap().to_string()))
        }
    };
    let written = Instant::now();
    let grace = Duration::from_secs(20);
    let (controller, _harness) = restart_after_dead_opening(&env, &client, &sushy, &machines, "restarted-lock", grace).await;
    assert!(written.elapsed() < grace, "the check ran after the grace ({:?}); it proves nothing", written.elapsed());
    assert_eq!(lock_of("r1-u02").await.unwrap().as_deref(), Some("default-r1-u02-gone2"), "the lock was broken inside the grace");
    assert_eq!(server(&client, "r1-u02").await.status.unwrap_or_default().claim, None, "r1-u02 was claimed while locked");
    assert_eq!(sushy.resets(&machines[1].uuid), 0, "r1-u02 touched inside the grace: {}", sushy.log_text());

    await_bound(&client, "app", Duration::from_secs(40)).await;
    assert_eq!(pod_node(&client, "app").await.as_deref(), Some("r1-u01"));

    let c = client.clone();
    eventually("r1-u02 powered off and its lock broken after the grace", Duration::from_secs(60), || {
        let (c, lock) = (c.clone(), lock_of("r1-u02"));
        async move {
            let s = server(&c, "r1-u02").await.status.unwrap_or_default();
            let lock = lock.await?;
            if lock.is_none() && s.power_state == Some(PowerState::Off) { Ok(()) } else { Err(format!("lock {lock:?}, {s:?}")) }
        }
    })
    .await;
    assert!(written.elapsed() >= grace, "broken before the grace ended");
    assert_eq!(sushy.resets(&machines[1].uuid), 1, "r1-u02: one reset, the power-off: {}", sushy.log_text());
    assert_eq!(sushy.resets(&machines[0].uuid), 1, "r1-u01: one reset, its power-on: {}", sushy.log_text());
    assert_eq!(server(&client, "r1-u02").await.status.unwrap().failures, 0, "an abandoned opening is not the server's failure");
    // The app's own claim holds r1-u01's lock, and the Server names it.
    let holder = lock_of("r1-u01").await.unwrap();
    assert!(holder.is_some(), "r1-u01 is not locked");
    assert_eq!(server(&client, "r1-u01").await.status.unwrap().claim, holder);
    controller.stop().await;
}

/// The same lock, left on a machine that was on before and that ironclaim
/// never recorded powering on: the lock is broken after the grace, and
/// the machine, whatever it runs, stays on, its Server saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_lock_left_on_a_machine_ironclaim_did_not_power_on_is_broken_and_the_machine_left_on() {
    use ironclaim_controller::controller::ADOPTED_CONDITION;
    use ironclaim_controller::locks::ledger_of;
    let (env, client) = setup().await;
    let (machines, sushy) = two_machines_the_second_on(&env, 56, false);
    let ledgers = ledger_locking_r1_u02(&client, &ledger_of("r1-u02"), "default-r1-u02-gone3").await;
    let grace = Duration::from_secs(5);
    let (controller, _harness) = restart_after_dead_opening(&env, &client, &sushy, &machines, "restarted-lock-unadopted", grace).await;
    let (c, l) = (client.clone(), ledgers.clone());
    eventually("the lock broken and r1-u02 said to be unadopted", Duration::from_secs(40), || {
        let (c, l) = (c.clone(), l.clone());
        async move {
            let locked = l.get(&ledger_of("r1-u02")).await.map_err(|e| e.to_string())?.data.unwrap_or_default().contains_key("r1-u02");
            let status = server(&c, "r1-u02").await.status.unwrap_or_default();
            let adopted = status.conditions.iter().find(|c| c.type_ == ADOPTED_CONDITION).map(|c| (c.status.clone(), c.reason.clone()));
            match (locked, adopted) {
                (false, Some((s, r))) if s == "False" && r == "Unadopted" => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    await_bound(&client, "app", Duration::from_secs(40)).await;
    assert_eq!(pod_node(&client, "app").await.as_deref(), Some("r1-u01"), "the app went to the free server");
    assert_eq!(sushy.resets(&machines[1].uuid), 0, "r1-u02 was powered off: {}", sushy.log_text());
    controller.stop().await;
}
