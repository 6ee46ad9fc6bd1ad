//! Two controllers without leader election race for the same servers:
//! the claim lock is written to the ledger with the resourceVersion read,
//! so each server is won by exactly one; and a replica's view of the
//! ledger from its own last write never decides for it.

use std::sync::Arc;

use crate::support::*;
use ironclaim_controller::Error;
use ironclaim_controller::claims::Claims;
use ironclaim_controller::events::Events;
use ironclaim_controller::metrics::Metrics;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_claimers_racing_for_the_same_servers_never_both_win_one() {
    let (env, client) = setup().await;
    let sushy = start_sushy_for(&[], SystemPower::Off);
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
    let sushy = start_sushy_for(&[], SystemPower::Off);
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

/// Two replicas take turns on the ledger; each keeps its copy from its
/// own last write, which the other's writes make stale. No answer may come
/// from that stale copy: a lock released elsewhere is free, a lock taken
/// elsewhere is given up when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_never_answers_from_its_stale_copy_of_the_ledger() {
    use ironclaim_controller::locks::{Locks, Taken};
    let (_env, client) = setup().await;
    let sushy = start_sushy_for(&[], SystemPower::Off);
    let server = |name: &str, index: usize| -> ironclaim_k8s::api::Server {
        serde_json::from_value(Machine::new(name, index, 8, 8).server_json(&sushy)).unwrap()
    };
    let (s1, s2) = (server("ledger-1", 150), server("ledger-2", 151));
    let (a, b) = (Locks::new(client.clone(), NAMESPACE), Locks::new(client.clone(), NAMESPACE));
    let holder = |name: &'static str| {
        let locks = Locks::new(client.clone(), NAMESPACE);
        async move { locks.read(name).await.unwrap().map(|l| l.holder) }
    };

    assert_eq!(a.take(&s1, "c1").await.unwrap(), Taken::Now);
    b.give_up("ledger-1", "c1").await.unwrap();
    assert_eq!(holder("ledger-1").await, None);
    // A's copy still shows c1 on ledger-1.
    assert_eq!(a.take(&s1, "c2").await.unwrap(), Taken::Now, "a lock released by the other replica is free");
    assert_eq!(holder("ledger-1").await.as_deref(), Some("c2"));

    assert_eq!(b.take(&s2, "c5").await.unwrap(), Taken::Now);
    // A's copy has no ledger-2 at all.
    a.give_up("ledger-2", "c5").await.unwrap();
    assert_eq!(holder("ledger-2").await, None, "a lock taken by the other replica is given up when asked");

    match b.take(&s1, "c3").await {
        Err(Error::ServerHeld { holder, .. }) => assert_eq!(holder, "c2"),
        other => panic!("ledger-1 is held by c2: {other:?}"),
    }
    assert_eq!(b.take(&s1, "c2").await.unwrap(), Taken::Already);
}
