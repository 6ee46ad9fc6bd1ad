//! Two controllers without leader election race for the same servers:
//! the claim is written with the resourceVersion read, so each server is
//! won by exactly one.

mod support;

use std::sync::Arc;

use ironclaim_controller::Error;
use ironclaim_controller::claims::Claims;
use ironclaim_controller::events::Events;
use ironclaim_controller::metrics::Metrics;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_racing_for_the_same_servers_never_both_win_one() {
    let (env, client) = setup().await;
    let sushy = Sushy::start(&[]);
    let names: Vec<String> = (0..12).map(|i| format!("race-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        apply(&env, &Machine::new(name, 100 + i, 8, 8).server_json(&sushy));
    }
    let metrics = Arc::new(Metrics::new());
    let make = || Arc::new(Claims::new(client.clone(), redfish(&client), settings("race").claims, metrics.clone(), Events::disabled()));
    let (one, two) = (make(), make());
    let mut tasks = tokio::task::JoinSet::new();
    for name in &names {
        for (claimer, who) in [(one.clone(), "one"), (two.clone(), "two")] {
            let name = name.clone();
            tasks.spawn(async move { (name.clone(), who, claimer.claim_server(&name, &format!("claim-{who}-{name}")).await) });
        }
    }
    let mut wins = std::collections::BTreeMap::<String, Vec<&str>>::new();
    while let Some(joined) = tasks.join_next().await {
        let (name, who, result) = joined.unwrap();
        match result {
            Ok(_) => wins.entry(name).or_default().push(who),
            Err(Error::ServerHeld { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
        }
    }
    for name in &names {
        let winners = wins.get(name).cloned().unwrap_or_default();
        assert_eq!(winners.len(), 1, "{name}: {winners:?}");
        let holder = server(&client, name).await.status.unwrap().claim.unwrap();
        assert_eq!(holder, format!("claim-{}-{name}", winners[0]));
    }
}

/// The claim is a merge patch carrying the resourceVersion read; the race
/// above relies on the API server refusing it when that version is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_merge_patch_with_a_stale_resource_version_is_refused() {
    use kube::api::{Patch, PatchParams};
    let (env, client) = setup().await;
    let sushy = Sushy::start(&[]);
    apply(&env, &Machine::new("stale-0", 140, 8, 8).server_json(&sushy));
    let api: kube::Api<ironclaim_k8s::api::Server> = kube::Api::all(client.clone());
    let read = api.get_status("stale-0").await.unwrap();
    let version = read.metadata.resource_version.clone().unwrap();
    let with = |claim: &str, rv: &str| serde_json::json!({"metadata": {"resourceVersion": rv}, "status": {"claim": claim}});
    api.patch_status("stale-0", &PatchParams::default(), &Patch::Merge(&with("first", &version))).await.expect("the current version is accepted");
    match api.patch_status("stale-0", &PatchParams::default(), &Patch::Merge(&with("second", &version))).await {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 409, "{status:?}"),
        other => panic!("a write on a stale version went through: {other:?}"),
    }
    assert_eq!(server(&client, "stale-0").await.status.unwrap().claim.as_deref(), Some("first"));
}
