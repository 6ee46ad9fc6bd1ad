//! Two controllers against one API server: with leader election only one
//! acts; without it, the claim on a server is still written once.

use ironclaim_core::transitions::{TransitionLimits, parse_rate};
use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_controller::leader::LeaseSettings;
use ironclaim_testenv::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_with_leader_election_one_acts_and_the_other_takes_over_when_it_stops() {
    let (env, client) = setup().await;
    let machines = vec![Machine::new("le-1", 41, 16, 32), Machine::new("le-2", 42, 16, 32)];
    let sushy = start_sushy_for(&machines, SystemPower::Off);
    for m in &machines {
        apply(&env, &m.server_json(&sushy));
    }
    apply(&env, &serverpool("default", json!([]), json!({})));
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());

    let lease = |identity: &str, power_budget_watts: Option<f64>, transition_limits: TransitionLimits| LeaseSettings {
        namespace: NAMESPACE.into(),
        name: "ironclaim-controller".into(),
        identity: identity.into(),
        duration: Duration::from_secs(6),
        power_budget_watts,
        transition_limits,
    };
    // a decides under a fleet budget and transition rate (far above what
    // the test powers), b under neither: the Lease says the holder's, for
    // `ironclaim explain`.
    let mut a = settings("replica-a");
    a.power_budget_watts = Some(100_000.0);
    a.transition_limits = TransitionLimits { rates: vec![parse_rate("fleet=100").expect("a rate")], max_cycles_per_day: Some(50) };
    a.lease = Some(lease("replica-a", a.power_budget_watts, a.transition_limits.clone()));
    let mut b = settings("replica-b");
    b.lease = Some(lease("replica-b", None, TransitionLimits::default()));
    let replica_a = Controller::new(client.clone(), redfish(&client), a);
    let metrics_a = replica_a.metrics();
    let running_a = run(replica_a);
    // a takes the lease first.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    let l = leases.clone();
    eventually("replica-a holds the lease", Duration::from_secs(10), || {
        let l = l.clone();
        async move {
            let holder = l.get_opt("ironclaim-controller").await.ok().flatten().and_then(|l| l.spec?.holder_identity);
            if holder.as_deref() == Some("replica-a") { Ok(()) } else { Err(format!("{holder:?}")) }
        }
    })
    .await;
    let held = leases.get("ironclaim-controller").await.expect("the lease");
    assert_eq!(ironclaim_controller::leader::power_budget_of(&held), Some(100_000.0), "{:?}", held.metadata.annotations);
    let limits = ironclaim_controller::leader::transition_limits_of(&held);
    assert_eq!((limits.rates.len(), limits.max_cycles_per_day), (1, Some(50)), "{:?}", held.metadata.annotations);
    let replica_b = Controller::new(client.clone(), redfish(&client), b);
    let metrics_b = replica_b.metrics();
    let running_b = run(replica_b);

    apply(&env, &pod("first", "12", "8Gi", &[], 0));
    let c = client.clone();
    eventually("first bound", Duration::from_secs(40), || {
        let c = c.clone();
        async move { bound(&c, "first").await }
    })
    .await;
    let opened = claims(&client).await;
    assert_eq!(
        opened.len(),
        1,
        "only the leader opened a claim: {:?}",
        opened.iter().map(|c| (c.metadata.name.clone(), c.metadata.labels.clone(), c.status.clone())).collect::<Vec<_>>()
    );
    assert!(metrics_a.render().contains("ironclaim_leader 1"));
    assert!(metrics_b.render().contains("ironclaim_leader 0"));
    assert!(!metrics_b.render().contains("ironclaim_claims_total{"), "the standby ended no claim");

    // The leader stops gracefully and hands the lease over.
    running_a.stop().await;
    apply(&env, &pod("second", "12", "8Gi", &[], 0));
    let c = client.clone();
    eventually("second bound by replica-b", Duration::from_secs(40), || {
        let c = c.clone();
        async move { bound(&c, "second").await }
    })
    .await;
    assert!(metrics_b.render().contains("ironclaim_leader 1"));
    assert_eq!(claims(&client).await.len(), 2);
    let held = leases.get("ironclaim-controller").await.expect("the lease");
    assert_eq!(ironclaim_controller::leader::power_budget_of(&held), None, "b decides with no budget: {:?}", held.metadata.annotations);
    assert!(ironclaim_controller::leader::transition_limits_of(&held).is_empty(), "nor limits: {:?}", held.metadata.annotations);
    running_b.stop().await;
}
