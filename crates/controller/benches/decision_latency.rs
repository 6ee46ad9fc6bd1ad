//! Decision latency against the real API server: from the start of a
//! decision (the batching window excluded) to the last power-on request
//! it sent, at 1,000 pending pods and 500 servers.
//!
//!     cargo bench -p ironclaim-controller --bench decision_latency
//!
//! `IRONCLAIM_BENCH_OPEN_CONCURRENCY` (default 32) sets how many claims are
//! opened at once; `IRONCLAIM_BENCH_IDLE_S` (default 2) the batching idle
//! window, so the decision can also be taken after the scheduler has
//! finished marking the burst unschedulable.
//!
//! The power provider records calls and answers at once, so the figure is
//! the controller's own: snapshot, core and the claim locks against a real
//! kube-apiserver (the Servers' status and the ServerClaims are written after
//! the power-ons).
//!
//! It then times writes with nothing else running: 59 merge patches of
//! Server status sent at once, 59 of ConfigMaps, and one patch carrying 59
//! entries to a ConfigMap (what a lock ledger shard's group commit sends).
//! A write to a custom resource costs several times a built-in one on the
//! API server, and one write carrying many changes costs about one, which
//! is why the locks are ConfigMap entries, each shard's written together,
//! and the Server's status is written after the power-on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use ironclaim_controller::batch::Windows;
use ironclaim_controller::provider::PowerFuture;
use ironclaim_controller::{Controller, Power, Settings};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_testenv::TestEnv;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::json;

const SERVERS: usize = 500;
const PODS: usize = 1000;
const NAMESPACE: &str = "bench";

struct Recording {
    power_ons: AtomicUsize,
}

impl Power for Recording {
    fn power_on<'a>(&'a self, _: &'a Server) -> PowerFuture<'a, ()> {
        self.power_ons.fetch_add(1, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    }
    fn power_off<'a>(&'a self, _: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn power_state<'a>(&'a self, _: &'a Server) -> PowerFuture<'a, PowerState> {
        Box::pin(async { Ok(PowerState::Off) })
    }
    fn watts<'a>(&'a self, _: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async { Ok(None) })
    }
}

async fn create_all<K>(api: Api<K>, objects: Vec<K>)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let mut tasks = tokio::task::JoinSet::new();
    let shared = Arc::new(tokio::sync::Semaphore::new(32));
    for o in objects {
        let (api, permit) = (api.clone(), shared.clone());
        tasks.spawn(async move {
            let _p = permit.acquire().await;
            let _ = api.create(&PostParams::default(), &o).await;
        });
    }
    while tasks.join_next().await.is_some() {}
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    ironclaim_redfish::install_crypto_provider();
    let env = TestEnv::shared().expect("test environment (hack/testenv build)");
    let client: Client = env.client().await.expect("client");
    env.kubectl_with_stdin(["apply", "--server-side", "-f", "-"], &ironclaim_k8s::api::crds_yaml().unwrap()).unwrap();
    for crd in ["servers", "serverpools", "serverclaims"] {
        env.kubectl(["wait", "--for=condition=Established", &format!("crd/{crd}.ironclaim.dev")]).unwrap();
    }
    let _ = env.kubectl(["create", "namespace", NAMESPACE]);
    let pool: ironclaim_k8s::api::ServerPool =
        serde_json::from_value(json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool", "metadata": {"name": "bench"}, "spec": {}}))
            .unwrap();
    let _ = Api::<ironclaim_k8s::api::ServerPool>::all(client.clone()).create(&PostParams::default(), &pool).await;
    let servers: Vec<Server> = (0..SERVERS)
        .map(|i| {
            let (cpu, memory) = [("16", "64Gi"), ("32", "128Gi"), ("64", "256Gi")][i % 3];
            let zone = ["a", "b", "c", "d"][i % 4];
            serde_json::from_value(json!({
                "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": format!("s-{i:03}")},
                "spec": {
                    "bmc": {"address": format!("https://10.0.{}.{}/redfish/v1/Systems/1", i / 250, i % 250), "credentialsSecretRef": {"name": "bmc", "namespace": NAMESPACE}},
                    "hardware": {"cpu": cpu, "memory": memory},
                    "labels": {"topology.kubernetes.io/zone": zone}
                }
            }))
            .unwrap()
        })
        .collect();
    let started = Instant::now();
    create_all(Api::<Server>::all(client.clone()), servers).await;
    eprintln!("{SERVERS} servers created in {:?}", started.elapsed());

    let power = Arc::new(Recording { power_ons: AtomicUsize::new(0) });
    // IRONCLAIM_BENCH_IDLE_S: a longer batching idle window decides after
    // the scheduler has finished marking the burst unschedulable.
    let idle_s: u64 = std::env::var("IRONCLAIM_BENCH_IDLE_S").ok().and_then(|v| v.parse().ok()).unwrap_or(2);
    let mut settings = Settings {
        windows: Windows { idle: Duration::from_secs(idle_s), max: Duration::from_secs(30 + idle_s) },
        redecide_every: Duration::from_secs(3600),
        power_sweep_every: Duration::from_secs(3600),
        publish_events: false,
        instance: "bench".into(),
        ..Settings::default()
    };
    settings.claims.lock_namespace = NAMESPACE.into();
    // IRONCLAIM_BENCH_OPEN_CONCURRENCY compares settings without a rebuild.
    if let Some(n) = std::env::var("IRONCLAIM_BENCH_OPEN_CONCURRENCY").ok().and_then(|v| v.parse().ok()) {
        settings.open_concurrency = n;
    }
    let open_concurrency = settings.open_concurrency;
    let controller = Controller::new(client.clone(), power.clone(), settings);
    let decisions = controller.decisions();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async move {
        let _ = stopped.await;
    }));
    tokio::time::sleep(Duration::from_secs(2)).await;

    let pods: Vec<Pod> = (0..PODS)
        .map(|i| {
            let (cpu, memory) = [("1", "2Gi"), ("2", "4Gi"), ("4", "8Gi"), ("8", "16Gi")][i % 4];
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("p-{i:04}"), "namespace": NAMESPACE},
                "spec": {"containers": [{"name": "c", "image": "registry.invalid/app", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]}
            }))
            .unwrap()
        })
        .collect();
    let started = Instant::now();
    create_all(Api::<Pod>::namespaced(client.clone(), NAMESPACE), pods).await;
    eprintln!("{PODS} pods created in {:?}", started.elapsed());

    let deadline = Instant::now() + Duration::from_secs(120);
    let decision = loop {
        let found = decisions.lock().unwrap().iter().find(|d| d.pending_pods >= PODS && d.claims_opened > 0).cloned();
        if let Some(d) = found {
            break d;
        }
        assert!(Instant::now() < deadline, "no decision over {PODS} pods: {:?}", decisions.lock().unwrap());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let _ = stop.send(());
    let _ = task.await;
    let floor = |label: &'static str| {
        let client = client.clone();
        async move {
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..59usize {
                let client = client.clone();
                tasks.spawn(async move {
                    let params = kube::api::PatchParams::default();
                    if label == "59 Server status patches at once" {
                        let patch = json!({"status": {"claim": format!("floor-{i}")}});
                        let api = Api::<Server>::all(client);
                        api.patch_status(&format!("s-{:03}", SERVERS - 1 - i), &params, &kube::api::Patch::Merge(&patch)).await.map(|_| ())
                    } else if label == "one ConfigMap of 59 entries" {
                        if i > 0 {
                            return Ok(());
                        }
                        let entries: serde_json::Map<String, serde_json::Value> =
                            (0..59).map(|j| (format!("s-{j:03}"), json!(format!("{{\"holder\":\"floor-{j}\"}}")))).collect();
                        let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, NAMESPACE);
                        api.patch("floor-0", &params, &kube::api::Patch::Merge(&json!({"data": entries}))).await.map(|_| ())
                    } else {
                        let patch = json!({"data": {"claim": format!("floor-{i}")}});
                        let api = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, NAMESPACE);
                        api.patch(&format!("floor-{i}"), &params, &kube::api::Patch::Merge(&patch)).await.map(|_| ())
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                done.expect("task").expect("patch");
            }
            println!("{label}: {:.1} ms", started.elapsed().as_secs_f64() * 1e3);
        }
    };
    let configmaps = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), NAMESPACE);
    for i in 0..59 {
        let cm = serde_json::from_value(json!({"metadata": {"name": format!("floor-{i}")}, "data": {}})).unwrap();
        let _ = configmaps.create(&PostParams::default(), &cm).await;
    }
    floor("59 Server status patches at once").await;
    floor("59 ConfigMap patches at once").await;
    floor("one ConfigMap of 59 entries").await;
    println!(
        "decision latency at {} pending pods and {SERVERS} servers, {} claims opened at once, idle window {idle_s} s: {:.1} ms to the last power-on request, {:.1} ms to the first, {:.1} ms for the median pod (core {:.1} ms), {} claims opened, {} failed, {} power-on requests",
        decision.pending_pods,
        open_concurrency,
        decision.latency.as_secs_f64() * 1e3,
        decision.first_power_on.unwrap_or_default().as_secs_f64() * 1e3,
        decision.median_pod.unwrap_or_default().as_secs_f64() * 1e3,
        decision.provision_time.as_secs_f64() * 1e3,
        decision.claims_opened,
        decision.claims_failed,
        power.power_ons.load(Ordering::SeqCst)
    );
}
