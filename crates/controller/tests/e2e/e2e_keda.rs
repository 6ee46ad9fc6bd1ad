//! The replicas axis and the machines axis together, with the real KEDA
//! operator (built from KEDA's Go module) on the real control plane: a
//! ScaledObject with a `metrics-api` trigger reads a queue depth the test
//! serves over HTTP on loopback. When the queue fills, KEDA takes the
//! Deployment from 0 to 4 replicas of 3 CPU; ironclaim powers on two of the
//! three 8-CPU servers (two pods each), and the pods bind. When the queue
//! drains, KEDA scales the Deployment to 0 after its cooldown, and ironclaim
//! powers both servers off once they are empty and past break-even. Each
//! stage is printed with its time from the trigger.
//!
//! KEDA moves between 0 and 4 on its own (`idleReplicaCount: 0`,
//! `minReplicaCount: 4`): its metrics API server, which the HPA would read
//! to go between 1 and N, is not run (see `ironclaim_testenv::keda`).

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_testenv::eventually;
use ironclaim_testenv::keda::Keda;
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use serde_json::json;

const APP: &str = "queue-worker";

/// Serves `{"depth": N}` on `GET /queue` from a thread, N read from `depth`
/// at each request; returns the port.
fn serve_queue(depth: Arc<AtomicU32>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the queue endpoint");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let body = format!("{{\"depth\": {}}}", depth.load(Ordering::SeqCst));
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

async fn replicas(client: &kube::Client) -> Option<i32> {
    Api::<Deployment>::namespaced(client.clone(), NAMESPACE).get_opt(APP).await.ok().flatten()?.spec.replicas
}

/// Waits until KEDA has scaled the Deployment to `n` replicas.
async fn until_replicas(client: &kube::Client, n: i32) {
    let c = client.clone();
    eventually(&format!("KEDA scales the Deployment to {n}"), Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            match replicas(&c).await {
                Some(r) if r == n => Ok(()),
                r => Err(format!("replicas {r:?}")),
            }
        }
    })
    .await;
}

/// Waits until the Deployment has `n` pods.
async fn until_pods(client: &kube::Client, n: usize) {
    let c = client.clone();
    eventually(&format!("{n} pods of {APP}"), Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let have = pods(&c, NAMESPACE, &format!("app={APP}")).await.len();
            if have == n { Ok(()) } else { Err(format!("{have} pods")) }
        }
    })
    .await;
}

/// Stage timings from the trigger, printed as a table at the end.
struct Stages {
    from: Instant,
    rows: Vec<(&'static str, Duration)>,
}

impl Stages {
    fn mark(&mut self, stage: &'static str) {
        let at = self.from.elapsed();
        eprintln!("keda e2e: {stage} at {:.1} s", at.as_secs_f64());
        self.rows.push((stage, at));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keda_scales_a_deployment_from_zero_the_servers_come_on_for_it_and_go_off_after_it_scales_back() {
    let (env, client) = setup().await;
    let keda = Keda::start(&env).unwrap_or_else(|e| panic!("{e}"));
    // A ScaledObject an earlier run left holds KEDA's finalizer: KEDA, now
    // running, lets it go.
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "scaledobjects.keda.sh", "--all", "--ignore-not-found", "--timeout=30s"]);
    let pool = "keda";
    let machines = machines("keda", pool, 3, 181);
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let sushy = start_sushy(machines.iter().map(|m| (m.uuid.clone(), SystemPower::Off)));
    // Break-even: 10 W x 15 s / 150 W = 1 s.
    apply_servers(&env, &sushy, &machines, 10);
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    let running = run(Controller::new(client.clone(), redfish(&client), settings("keda")));
    let bmcs = Bmcs::new(&sushy);

    let depth = Arc::new(AtomicU32::new(0));
    let port = serve_queue(depth.clone());
    let template = json!({"metadata": {"labels": {"app": APP}},
        "spec": {"containers": [app_container("3", "1Gi")], "nodeSelector": {POOL_LABEL: pool}}});
    apply(
        &env,
        &json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": APP, "namespace": NAMESPACE},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": APP}}, "template": template}
        }),
    );
    apply(
        &env,
        &json!({
            "apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
            "metadata": {"name": APP, "namespace": NAMESPACE},
            "spec": {
                "scaleTargetRef": {"name": APP},
                "pollingInterval": 1, "cooldownPeriod": 5,
                "idleReplicaCount": 0, "minReplicaCount": 4, "maxReplicaCount": 4,
                "triggers": [{"type": "metrics-api", "metadata": {
                    "url": format!("http://127.0.0.1:{port}/queue"), "valueLocation": "depth", "format": "json",
                    "targetValue": "1", "activationTargetValue": "0"}}]
            }
        }),
    );
    // KEDA has read the ScaledObject and the empty queue: nothing moves.
    let c = client.clone();
    eventually("KEDA ready for the ScaledObject", Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
                c,
                NAMESPACE,
                &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("keda.sh", "v1alpha1", "ScaledObject")),
            );
            let so = api.get(APP).await.map_err(|e| e.to_string())?;
            let ready = so.data["status"]["conditions"].as_array().is_some_and(|cs| cs.iter().any(|c| c["type"] == "Ready" && c["status"] == "True"));
            if ready { Ok(()) } else { Err(format!("{}", so.data["status"])) }
        }
    })
    .await;
    sleep_s(3).await;
    assert_eq!(replicas(&client).await, Some(0), "KEDA keeps an idle Deployment at zero");
    assert_eq!(bmcs.on(&machines).await, Vec::<String>::new(), "nothing is powered on for an empty queue");

    // The queue fills.
    let mut stages = Stages { from: Instant::now(), rows: Vec::new() };
    depth.store(12, Ordering::SeqCst);
    until_replicas(&client, 4).await;
    stages.mark("KEDA scaled the Deployment 0 -> 4");
    until_pods(&client, 4).await;
    stages.mark("the ReplicaSet created 4 pending pods");
    let c = client.clone();
    eventually("claims for the pods", Duration::from_secs(30), || {
        let c = c.clone();
        async move {
            let n = claims(&c).await.len();
            if n >= 2 { Ok(()) } else { Err(format!("{n} claims")) }
        }
    })
    .await;
    stages.mark("ironclaim claimed 2 servers");
    let ms = machines.clone();
    let on = eventually("two servers on", Duration::from_secs(40), || {
        let (bmcs, ms) = (&bmcs, ms.clone());
        async move {
            let on = bmcs.on(&ms).await;
            if on.len() == 2 { Ok(on) } else { Err(format!("on: {on:?}")) }
        }
    })
    .await;
    stages.mark("both servers powered on (BMC)");
    let powered: Vec<Machine> = machines.iter().filter(|m| on.contains(&m.name)).cloned().collect();
    let c = client.clone();
    let p = powered.clone();
    eventually("their nodes Ready", Duration::from_secs(60), || {
        let (c, p) = (c.clone(), p.clone());
        async move { nodes_ready(&c, &p).await }
    })
    .await;
    stages.mark("their nodes joined and Ready");
    let c = client.clone();
    let nodes = eventually("the four pods bound", Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            let mut nodes: Vec<String> =
                pods(&c, NAMESPACE, &format!("app={APP}")).await.iter().filter_map(|p| p.spec.as_ref()?.node_name.clone()).collect();
            nodes.sort();
            if nodes.len() == 4 { Ok(nodes) } else { Err(format!("bound on {nodes:?}")) }
        }
    })
    .await;
    stages.mark("all 4 pods bound");
    // ironclaim's own account of each server's path, from its claim.
    for claim in claims(&client).await {
        let path: Vec<String> = claim
            .status
            .iter()
            .flat_map(|s| &s.stages)
            .map(|r| format!("{:?} {}", r.stage, r.duration_seconds.map_or("-".into(), |d| format!("{d} s"))))
            .collect();
        eprintln!("keda e2e: claim of {}: {}", claim.spec.server, path.join(", "));
    }
    let mut expected: Vec<String> = on.iter().flat_map(|n| [n.clone(), n.clone()]).collect();
    expected.sort();
    assert_eq!(nodes, expected, "two pods on each powered server");
    let off = machines.iter().find(|m| !on.contains(&m.name)).expect("a third server");
    assert_eq!(bmcs.is_on(off).await, Some(false), "the third server stays off");

    // The queue drains.
    depth.store(0, Ordering::SeqCst);
    stages.mark("the queue drained");
    until_replicas(&client, 0).await;
    stages.mark("KEDA scaled the Deployment 4 -> 0 (cooldown 5 s)");
    until_pods(&client, 0).await;
    stages.mark("the pods gone");
    let ms = machines.clone();
    eventually("both servers off", Duration::from_secs(60), || {
        let (bmcs, ms) = (&bmcs, ms.clone());
        async move {
            let on = bmcs.on(&ms).await;
            if on.is_empty() { Ok(()) } else { Err(format!("on: {on:?}")) }
        }
    })
    .await;
    stages.mark("both servers powered off (BMC)");

    eprintln!("keda e2e: stage timings from the queue filling (s)");
    for (stage, at) in &stages.rows {
        eprintln!("  {:>6.1}  {stage}", at.as_secs_f64());
    }
    env.kubectl(["-n", NAMESPACE, "delete", "scaledobjects.keda.sh", APP, "--timeout=30s"]).expect("delete the ScaledObject");
    running.stop().await;
    drop(keda);
    clean(&env, &client, &machines, pool).await;
}
