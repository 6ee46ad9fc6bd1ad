//! Stranded resources on the real control plane and sushy BMCs: a
//! quarantined server left on with no claim or node is powered off, a
//! Node naming a server that is gone is deleted, and a claim whose server
//! was put in maintenance has its node drained and is released, the
//! server left on and its node cordoned for the operator. Each only after
//! the grace period, each with a `Stranded` Event.

use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::scaledown::ScaleDownSettings;
use ironclaim_controller::{Controller, Settings};
use ironclaim_k8s::api::{ServerClaim, Server};
use ironclaim_testenv::eventually;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

const GRACE: Duration = Duration::from_secs(4);

fn replicaset(name: &str, pool: &str) -> serde_json::Value {
    // No tolerations: a pod tolerating every taint would land back on the
    // cordoned node it was just evicted from.
    one_replica(name, json!({}), json!({"nodeSelector": {POOL_LABEL: pool}, "containers": [app_container("2", "2Gi")]}))
}

async fn patch_status(client: &Client, server: &str, status: serde_json::Value) {
    Api::<Server>::all(client.clone())
        .patch_status(server, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .expect("patch server status");
}

async fn wait_event(client: &Client, kind: &str, name: &str, prefix: &str, within: Duration) -> String {
    let (c, kind, name, prefix) = (client.clone(), kind.to_string(), name.to_string(), prefix.to_string());
    eventually(&format!("{prefix} on {kind} {name}"), within, || {
        let (c, kind, name, prefix) = (c.clone(), kind.clone(), name.clone(), prefix.clone());
        async move {
            let events = object_events(&c, &kind, &name).await;
            events.iter().find(|e| e.starts_with(&prefix)).cloned().ok_or(format!("{events:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stranded_servers_nodes_and_claims_are_found_and_repaired_after_the_grace_period() {
    let (env, client) = setup().await;
    let pool = "sd-strand";
    let app = "sd-strand-work";
    // Index 0: quarantined and on, never a node. Index 1: claimed, then maintenance.
    let mut machines = machines("sd-strand", pool, 2, 41);
    machines[0] = machines[0].clone().never_registers();
    let (quarantined, maintained) = (machines[0].clone(), machines[1].clone());
    let ghost = "sd-strand-ghost";
    clean(&env, &client, &machines, pool).await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", app, "--ignore-not-found"]);
    let _ = env.kubectl(["delete", "node", ghost, "--ignore-not-found"]);
    let sushy = start_sushy([(quarantined.uuid.clone(), SystemPower::On), (maintained.uuid.clone(), SystemPower::Off)]);
    // Break-even 1 s: an idle server here would be powered off at once.
    apply_servers(&env, &sushy, &machines, 10);
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    // Quarantined after ironclaim's own power-on failed it three times,
    // recorded as every power-on of ironclaim's is.
    patch_status(&client, &quarantined.name, json!({"quarantined": true, "failures": 3, "powerState": "On", "poweredOnByIronclaim": true})).await;
    // A node that names a server the inventory never had, running nothing.
    let mut ghost_node = existing_node(ghost, 4, 8, &[], 0, &[]);
    ghost_node["spec"]["providerID"] = json!(format!("ironclaim://{ghost}"));
    apply(&env, &ghost_node);
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());

    let settings = Settings { scaledown: ScaleDownSettings { stranded_grace: GRACE, ..ScaleDownSettings::default() }, ..settings("sd-strand") };
    let controller = Controller::new(client.clone(), redfish(&client), settings);
    let metrics = controller.metrics();
    let running = run(controller);
    let started = Instant::now();

    // The workload claims the cold server, which boots and serves it.
    apply(&env, &replicaset(app, pool));
    let c = client.clone();
    let m = maintained.name.clone();
    let claim = eventually("the workload served by its claimed server", Duration::from_secs(60), || {
        let (c, m) = (c.clone(), m.clone());
        async move {
            let p = pods(&c, NAMESPACE, &format!("app={app}")).await;
            if !p.first().is_some_and(|p| ready(p) && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(m.as_str())) {
                return Err(format!("pods: {:?}; claims: {:?}", crate::scaledown_support::names(&p), crate::support::names(&claims(&c).await)));
            }
            server(&c, &m).await.status.and_then(|s| s.claim).ok_or("the server names no claim".to_string())
        }
    })
    .await;

    // (a) The quarantined server is powered off, not before the grace period.
    let bmcs = Bmcs::new(&sushy);
    let (b, q) = (&bmcs, quarantined.clone());
    eventually("the quarantined server powered off", Duration::from_secs(40), || async {
        if b.is_on(&q).await == Some(false) { Ok(()) } else { Err(format!("{} still on", q.name)) }
    })
    .await;
    assert!(started.elapsed() >= GRACE, "powered off {:?} after start, within the {GRACE:?} grace", started.elapsed());
    let note = wait_event(&client, "Server", &quarantined.name, "Stranded:", Duration::from_secs(10)).await;
    assert!(note.contains("powered off"), "{note}");

    // (b) The node without a server is deleted.
    let c = client.clone();
    eventually("the node without a server deleted", Duration::from_secs(30), || {
        let c = c.clone();
        async move { if node(&c, ghost).await.is_none() { Ok(()) } else { Err(format!("{ghost} still there")) } }
    })
    .await;
    let note = wait_event(&client, "Node", ghost, "Stranded:", Duration::from_secs(10)).await;
    assert!(note.contains("gone from the inventory"), "{note}");

    // (c) The claimed server goes into maintenance: found, drained, released.
    let maintenance = Instant::now();
    Api::<Server>::all(client.clone())
        .patch(&maintained.name, &PatchParams::default(), &Patch::Merge(&json!({"spec": {"maintenance": true}})))
        .await
        .expect("maintenance");
    let note = wait_event(&client, "Server", &maintained.name, "Stranded:", Duration::from_secs(30)).await;
    assert!(note.contains("in maintenance under claim") && note.contains(&claim), "{note}");
    assert!(maintenance.elapsed() >= GRACE, "reported {:?} after maintenance, within the {GRACE:?} grace", maintenance.elapsed());
    let (c, m, cl) = (client.clone(), maintained.name.clone(), claim.clone());
    eventually("the claim released", Duration::from_secs(40), || {
        let (c, m, cl) = (c.clone(), m.clone(), cl.clone());
        async move {
            let status = server(&c, &m).await.status.unwrap_or_default();
            let claim_left = Api::<ServerClaim>::all(c.clone()).get_opt(&cl).await.ok().flatten().is_some();
            match (status.claim, status.node, claim_left) {
                (None, None, false) => Ok(()),
                other => Err(format!(
                    "server claim, node, ServerClaim present: {other:?}; node events {:?}; server events {:?}",
                    object_events(&c, "Node", &m).await,
                    object_events(&c, "Server", &m).await
                )),
            }
        }
    })
    .await;
    let drained = wait_event(&client, "Node", &maintained.name, "Drained:", Duration::from_secs(10)).await;
    assert!(drained.contains("maintenance"), "{drained}");
    let workload = pods(&client, NAMESPACE, &format!("app={app}")).await;
    assert!(
        workload.iter().all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) != Some(maintained.name.as_str())),
        "a workload pod is still on the maintenance node: {:?}",
        crate::scaledown_support::names(&workload)
    );

    // The server stays on and its node cordoned for the operator, pass after pass.
    sleep_s(6).await;
    assert_eq!(bmcs.is_on(&maintained).await, Some(true), "the maintenance server was powered off");
    let n = node(&client, &maintained.name).await.expect("the maintenance node was deleted");
    assert!(is_unschedulable(&n) && !is_disrupting(&n), "the maintenance node is not left cordoned: {:?}", n.spec);
    let text = metrics.render();
    assert!(text.contains("ironclaim_scaledown_actions_total{action=\"drain\",reason=\"maintenance\",outcome=\"done\"} 1"), "{text}");

    running.stop().await;
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "replicaset", app, "--ignore-not-found"]);
    let _ = env.kubectl(["delete", "node", ghost, "--ignore-not-found"]);
    clean(&env, &client, &machines, pool).await;
}
