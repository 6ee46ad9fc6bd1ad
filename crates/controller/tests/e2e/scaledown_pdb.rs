//! The API side of a drain against a real PodDisruptionBudget, as the
//! executor carries out the driver's drain effects: an eviction the
//! budget refuses comes back as a 429 (`Evicted::Blocked`) and evicts
//! nothing, availability never drops below `minAvailable`, and evictions
//! go through once the budget allows; an abandoned drain's uncordon leaves
//! the node schedulable and stamps its cool-down. How the drain waits out
//! a 429, times out and powers off is the driver's, tested in
//! `ironclaim_driver::drain` and end to end by the scale-down tests.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::scaledown::drain::{self, DRAIN_ABANDONED_ANNOTATION, Evicted};
use ironclaim_testenv::eventually;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
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
async fn a_pdb_at_its_floor_refuses_evictions_with_429_until_a_replica_more_lets_one_go() {
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

    // The drain's first step: cordon. Then each eviction the budget refuses.
    drain::cordon(&client, &machines[0].name, "underutilized").await.expect("cordon");
    let n = node(&client, &machines[0].name).await.expect("node");
    assert!(is_disrupting(&n) && is_unschedulable(&n), "the draining node is not cordoned");
    let on_first: Vec<String> = pods(&client, NAMESPACE, &format!("app={app}")).await.iter().map(|p| p.name_any()).collect();
    assert_eq!(on_first.len(), 2);
    for pod in &on_first {
        let answer = drain::evict(&client, NAMESPACE, pod, Duration::from_secs(5)).await;
        assert!(matches!(&answer, Evicted::Blocked(why) if why.contains("disruption budget")), "{pod}: {answer:?}");
    }
    sleep_s(2).await;
    assert_eq!(pods(&client, NAMESPACE, &format!("app={app}")).await.iter().filter(|p| ready(p)).count(), 2, "a refused eviction evicted");

    // A third replica lands on the other node: the budget lets one go at a
    // time, each once its replacement is ready, as the drain asks again.
    env.kubectl(["-n", NAMESPACE, "scale", "deployment", app, "--replicas=3"]).expect("scale");
    for pod in &on_first {
        let (c, pod) = (client.clone(), pod.clone());
        eventually("the budget lets the eviction through", Duration::from_secs(45), || {
            let (c, pod) = (c.clone(), pod.clone());
            async move {
                match drain::evict(&c, NAMESPACE, &pod, Duration::from_secs(5)).await {
                    Evicted::Yes | Evicted::Gone => Ok(()),
                    other => {
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        Err(format!("{other:?}"))
                    }
                }
            }
        })
        .await;
    }
    let c = client.clone();
    let first = machines[0].name.clone();
    eventually("no replica left on the drained node", Duration::from_secs(30), || {
        let (c, first) = (c.clone(), first.clone());
        async move {
            let left = pods(&c, NAMESPACE, &format!("app={app}"))
                .await
                .iter()
                .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(first.as_str()))
                .count();
            if left == 0 { Ok(()) } else { Err(format!("{left} left")) }
        }
    })
    .await;
    watching.store(false, Ordering::SeqCst);
    let _ = watcher.await;
    assert!(lowest.load(Ordering::SeqCst) >= 2, "availability fell below minAvailable: {}", lowest.load(Ordering::SeqCst));
    assert_eq!(Bmcs::new(&sushy).is_on(&machines[0]).await, Some(true), "nothing here powers a server off");
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "deployment,pdb", app, "--ignore-not-found"]);
    clean(&env, &client, &machines, app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_drains_uncordon_leaves_the_node_as_it_was_and_stamps_its_cool_down() {
    let (env, client) = setup().await;
    let app = "sd-pdb-timeout";
    let (machines, sushy, _harness) = start(&env, &client, app, 11).await;
    two_replicas_on_the_first(&env, &client, app, &machines).await;
    drain::cordon(&client, &machines[0].name, "underutilized").await.expect("cordon");
    for p in pods(&client, NAMESPACE, &format!("app={app}")).await {
        assert!(matches!(drain::evict(&client, NAMESPACE, &p.name_any(), Duration::from_secs(5)).await, Evicted::Blocked(_)));
    }
    // Abandoned at its timeout: uncordoned, the cool-down stamped in the same write.
    drain::uncordon_noting(&client, &machines[0].name, Some(jiff::Timestamp::now())).await.expect("uncordon");
    let n = node(&client, &machines[0].name).await.expect("node kept");
    assert!(!is_disrupting(&n) && !is_unschedulable(&n), "the abandoned node is still cordoned");
    let stamped = n.metadata.annotations.as_ref().and_then(|a| a.get(DRAIN_ABANDONED_ANNOTATION)).and_then(|v| v.parse::<jiff::Timestamp>().ok());
    let age = stamped.map(|t| jiff::Timestamp::now().as_second() - t.as_second());
    assert!(age.is_some_and(|a| (0..30).contains(&a)), "no fresh {DRAIN_ABANDONED_ANNOTATION} on the abandoned node: {:?}", n.metadata.annotations);
    assert_eq!(pods(&client, NAMESPACE, &format!("app={app}")).await.iter().filter(|p| ready(p)).count(), 2);
    assert_eq!(Bmcs::new(&sushy).is_on(&machines[0]).await, Some(true), "an abandoned drain powered the server off");

    // A node the operator had cordoned before stays cordoned.
    set_unschedulable(&client, &machines[1].name, true).await;
    drain::cordon(&client, &machines[1].name, "empty").await.expect("cordon");
    drain::uncordon_noting(&client, &machines[1].name, Some(jiff::Timestamp::now())).await.expect("uncordon");
    let n = node(&client, &machines[1].name).await.expect("node kept");
    assert!(!is_disrupting(&n) && is_unschedulable(&n), "the operator's cordon was undone");
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "deployment,pdb", app, "--ignore-not-found"]);
    clean(&env, &client, &machines, app).await;
}
