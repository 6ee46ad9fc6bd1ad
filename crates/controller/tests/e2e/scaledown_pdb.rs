//! Drains against a real PodDisruptionBudget: a refused eviction (429) is
//! waited out, availability never drops below `minAvailable`, and the
//! drain completes once the budget allows; past its timeout a drain is
//! abandoned and the node uncordoned.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::claims::{ClaimSettings, Claims};
use ironclaim_controller::events::Events;
use ironclaim_controller::metrics::Metrics;
use ironclaim_controller::scaledown::drain::{DRAIN_ABANDONED_ANNOTATION, DrainOutcome, DrainRequest, DrainSettings, Drainer};
use ironclaim_controller::scaledown::notes::Notes;
use ironclaim_testenv::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

fn deployment(name: &str, replicas: i32, selector: &str) -> serde_json::Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {POOL_LABEL: selector},
                    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                    "containers": [{"name": "c", "image": "registry.invalid/app", "resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}]
                }
            }
        }
    })
}

fn pdb(name: &str, min_available: i32) -> serde_json::Value {
    json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": name}}}
    })
}

async fn set_unschedulable(client: &Client, node: &str, on: bool) {
    let patch = json!({"spec": {"unschedulable": on}});
    Api::<Node>::all(client.clone()).patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch node");
}

fn drainer(client: &Client) -> Drainer {
    let metrics = Arc::new(Metrics::new());
    let power = redfish(client);
    let claims = Arc::new(Claims::new(client.clone(), power.clone(), ClaimSettings::default(), metrics.clone(), Events::disabled()));
    Drainer {
        client: client.clone(),
        power,
        claims,
        notes: Notes::new(client.clone(), "ironclaim", "sd-pdb"),
        metrics: metrics.scaledown.clone(),
        settings: DrainSettings { retry_initial: Duration::from_millis(200), retry_max: Duration::from_secs(1), ..DrainSettings::default() },
    }
}

/// Two replicas on the first machine, the second machine free but
/// schedulable, a PDB at its floor.
async fn two_replicas_on_the_first(env: &ironclaim_testenv::TestEnv, client: &Client, app: &str, machines: &[Machine]) {
    set_unschedulable(client, &machines[1].name, true).await;
    apply(env, &deployment(app, 2, app));
    let c = client.clone();
    let first = machines[0].name.clone();
    eventually("two replicas ready on the first node", Duration::from_secs(30), || {
        let (c, first) = (c.clone(), first.clone());
        async move {
            let ps = pods(&c, NAMESPACE, &format!("app={app}")).await;
            let on_first = ps.iter().filter(|p| ready(p) && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(first.as_str())).count();
            if on_first == 2 { Ok(()) } else { Err(format!("{on_first} ready on {first}")) }
        }
    })
    .await;
    set_unschedulable(client, &machines[1].name, false).await;
    apply(env, &pdb(app, 2));
    // Let the disruption controller observe the budget.
    sleep_s(2).await;
}

async fn start(env: &ironclaim_testenv::TestEnv, client: &Client, prefix: &str, uuid_base: usize) -> (Vec<Machine>, Sushy, Machines) {
    let machines = machines(prefix, prefix, 2, uuid_base);
    clean(env, client, &machines, prefix).await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "deployment,pdb", prefix, "--ignore-not-found"]);
    let (sushy, harness) = powered_fleet(env, client, &machines, 10).await;
    (machines, sushy, harness)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pdb_at_its_floor_holds_the_drain_which_completes_once_the_budget_allows() {
    let (env, client) = setup().await;
    let app = "sd-pdb";
    let (machines, sushy, _harness) = start(&env, &client, app, 1).await;
    two_replicas_on_the_first(&env, &client, app, &machines).await;

    // Watch availability the whole time.
    let lowest = Arc::new(AtomicUsize::new(usize::MAX));
    let watching = Arc::new(AtomicBool::new(true));
    let (c, low, w) = (client.clone(), lowest.clone(), watching.clone());
    let watcher = tokio::spawn(async move {
        while w.load(Ordering::SeqCst) {
            let n = pods(&c, NAMESPACE, &format!("app={app}")).await.iter().filter(|p| ready(p)).count();
            low.fetch_min(n, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });

    let drainer = drainer(&client);
    let metrics = drainer.metrics.clone();
    let request = DrainRequest {
        node: machines[0].name.clone(),
        server: Some(machines[0].name.clone()),
        reason: "underutilized".into(),
        planned: BTreeSet::new(),
        timeout: Duration::from_secs(45),
        power_off: true,
    };
    let d = drainer.clone();
    let draining = tokio::spawn(async move { d.drain(&request).await });

    // The budget refuses: the drain waits, both replicas stay.
    sleep_s(5).await;
    assert!(!draining.is_finished(), "the drain ended while the PDB refused every eviction");
    let blocked = metrics.evictions.get_or_create(&vec![("outcome".into(), "blocked".into())]).get();
    assert!(blocked >= 2, "no eviction was refused with 429 ({blocked})");
    let n = node(&client, &machines[0].name).await.expect("node");
    assert!(is_disrupting(&n) && is_unschedulable(&n), "the draining node is not cordoned");
    let on_first = pods(&client, NAMESPACE, &format!("app={app}")).await.iter().filter(|p| ready(p)).count();
    assert_eq!(on_first, 2);

    // A third replica lands on the other node: the budget allows one at a time.
    env.kubectl(["-n", NAMESPACE, "scale", "deployment", app, "--replicas=3"]).expect("scale");
    let outcome = tokio::time::timeout(Duration::from_secs(45), draining).await.expect("drain finished").expect("task").expect("drain");
    assert_eq!(outcome, DrainOutcome::Done { evicted: 2 });
    watching.store(false, Ordering::SeqCst);
    let _ = watcher.await;
    assert!(lowest.load(Ordering::SeqCst) >= 2, "availability fell below minAvailable: {}", lowest.load(Ordering::SeqCst));
    let bmcs = Bmcs::new(&sushy);
    assert_eq!(bmcs.is_on(&machines[0]).await, Some(false), "the drained server is still on");
    assert!(node(&client, &machines[0].name).await.is_none(), "the drained node was not deleted");
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "deployment,pdb", app, "--ignore-not-found"]);
    clean(&env, &client, &machines, app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_still_refused_at_its_timeout_is_abandoned_and_the_node_uncordoned() {
    let (env, client) = setup().await;
    let app = "sd-pdb-timeout";
    let (machines, sushy, _harness) = start(&env, &client, app, 11).await;
    two_replicas_on_the_first(&env, &client, app, &machines).await;
    let drainer = drainer(&client);
    let request = DrainRequest {
        node: machines[0].name.clone(),
        server: Some(machines[0].name.clone()),
        reason: "underutilized".into(),
        planned: BTreeSet::new(),
        timeout: Duration::from_secs(4),
        power_off: true,
    };
    let outcome = tokio::time::timeout(Duration::from_secs(30), drainer.drain(&request)).await.expect("drain returned").expect("drain");
    assert!(matches!(&outcome, DrainOutcome::Abandoned { why } if why.contains("timed out")), "{outcome:?}");
    let n = node(&client, &machines[0].name).await.expect("node kept");
    assert!(!is_disrupting(&n) && !is_unschedulable(&n), "the abandoned node is still cordoned");
    // The same write starts its cool-down: the controller leaves it alone for a while.
    let stamped = n.metadata.annotations.as_ref().and_then(|a| a.get(DRAIN_ABANDONED_ANNOTATION)).and_then(|v| v.parse::<jiff::Timestamp>().ok());
    let age = stamped.map(|t| jiff::Timestamp::now().as_second() - t.as_second());
    assert!(age.is_some_and(|a| (0..30).contains(&a)), "no fresh {DRAIN_ABANDONED_ANNOTATION} on the abandoned node: {:?}", n.metadata.annotations);
    assert_eq!(pods(&client, NAMESPACE, &format!("app={app}")).await.iter().filter(|p| ready(p)).count(), 2);
    assert_eq!(Bmcs::new(&sushy).is_on(&machines[0]).await, Some(true), "an abandoned drain powered the server off");
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "deployment,pdb", app, "--ignore-not-found"]);
    clean(&env, &client, &machines, app).await;
}
