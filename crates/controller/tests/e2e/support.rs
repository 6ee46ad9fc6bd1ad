//! The world the end-to-end tests run the controller in: the real control
//! plane of `hack/testenv`, a sushy-tools Redfish emulator per test, and
//! a harness that plays the machines (a powered-on system registers a kwok
//! Node with its server's capacity after a boot delay; a powered-off one
//! loses it).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ironclaim_controller::batch::Windows;
use ironclaim_controller::claims::{ClaimSettings, Retry};
use ironclaim_controller::index::FailureBackoff;
use ironclaim_controller::timeline::Deadlines;
use ironclaim_controller::{Controller, Power, RedfishPower, Settings};
use ironclaim_k8s::api::{Server, ServerClaim};
use ironclaim_redfish::{Bmc, BmcAddress, BmcConfig, Credentials, SystemSelector, Timing};
use ironclaim_testenv::{FAKE_NODE_ANNOTATION, TestEnv, eventually};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

pub const NAMESPACE: &str = "ironclaim-e2e";

pub use ironclaim_testenv::sushy::{Sushy, SystemPower};

/// A sushy-tools emulator on plain HTTP without authentication (the BMC
/// Secret's credentials are accepted as any would be), with these systems.
pub fn start_sushy<S: Into<String>>(systems: impl IntoIterator<Item = (S, SystemPower)>) -> Sushy {
    Sushy::builder().systems(systems).start().unwrap_or_else(|error| panic!("{error}"))
}

/// [`start_sushy`] with one system per machine, all in `power`.
pub fn start_sushy_for(machines: &[Machine], power: SystemPower) -> Sushy {
    start_sushy(machines.iter().map(|m| (m.uuid.clone(), power)))
}

pub fn uuid(index: usize) -> String {
    format!("5e7a0000-0000-4000-8000-{index:012x}")
}

/// Fast timing for the emulator, whose resets take effect 1 to 11 s later.
pub fn timing() -> Timing {
    Timing {
        request_timeout: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(1),
        retries: 1,
        retry_backoff: Duration::from_millis(100),
        poll_initial: Duration::from_millis(250),
        poll_max: Duration::from_millis(500),
        resend_after: Duration::from_secs(15),
        confirm_timeout: Duration::from_secs(30),
        graceful_timeout: Duration::from_secs(15),
        task_timeout: Duration::from_secs(10),
        idle_connection: Duration::from_secs(2),
    }
}

/// One server as the test declares it.
#[derive(Clone, Debug)]
pub struct Machine {
    pub name: String,
    pub uuid: String,
    pub cpu: u32,
    pub memory_gi: u32,
    pub gpus: Option<(&'static str, u32)>,
    pub labels: BTreeMap<String, String>,
    /// From BMC On to the Node registering.
    pub boot: Duration,
    /// From the Node registering to the GPUs being advertised.
    pub gpu_driver: Duration,
    /// Never registers a Node (a stuck PXE boot).
    pub registers: bool,
    /// Taints the bootstrap registers the Node with (`key`, NoSchedule).
    pub taints: Vec<String>,
    /// `spec.stageDurations` of the Server.
    pub expected: [&'static str; 4],
    /// Plays a kubelet whose Node outlives a power-off: registered Ready
    /// with a boot ID, left in place when the machine goes off, and
    /// reported Ready with a new boot ID when it boots again.
    pub keeps_node: bool,
}

impl Machine {
    pub fn new(name: &str, index: usize, cpu: u32, memory_gi: u32) -> Self {
        Machine {
            name: name.into(),
            uuid: uuid(index),
            cpu,
            memory_gi,
            gpus: None,
            labels: BTreeMap::new(),
            boot: Duration::from_secs(1),
            gpu_driver: Duration::ZERO,
            registers: true,
            taints: Vec::new(),
            expected: ["12s", "3s", "2s", "3s"],
            keeps_node: false,
        }
    }
    pub fn keeping_its_node(mut self) -> Self {
        self.keeps_node = true;
        self
    }
    pub fn label(mut self, k: &str, v: &str) -> Self {
        self.labels.insert(k.into(), v.into());
        self
    }
    pub fn gpus(mut self, model: &'static str, count: u32, driver: Duration) -> Self {
        self.gpus = Some((model, count));
        self.gpu_driver = driver;
        self
    }
    pub fn taint(mut self, key: &str) -> Self {
        self.taints.push(key.into());
        self
    }
    pub fn never_registers(mut self) -> Self {
        self.registers = false;
        self
    }

    pub fn server_json(&self, sushy: &Sushy) -> serde_json::Value {
        let mut hardware = json!({"cpu": self.cpu.to_string(), "memory": format!("{}Gi", self.memory_gi)});
        if let Some((model, count)) = self.gpus {
            hardware["gpus"] = json!([{"model": model, "count": count}]);
        }
        json!({
            "apiVersion": "ironclaim.dev/v1alpha1",
            "kind": "Server",
            "metadata": {"name": self.name},
            "spec": {
                "bmc": {
                    "address": sushy.system_url(&self.uuid),
                    "credentialsSecretRef": {"name": "bmc", "namespace": NAMESPACE}
                },
                "hardware": hardware,
                "labels": self.labels,
                "power": {"idleWatts": 150, "peakWatts": 400},
                "stageDurations": {"powerOn": self.expected[0], "boot": self.expected[1], "join": self.expected[2], "ready": self.expected[3], "tailPercent": 150}
            }
        })
    }

    fn node(&self, with_gpus: bool) -> serde_json::Value {
        let mut labels = self.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), self.name.clone());
        labels.insert("ironclaim.dev/server".into(), self.name.clone());
        let mut capacity = json!({"cpu": self.cpu.to_string(), "memory": format!("{}Gi", self.memory_gi), "pods": "110"});
        if let (Some((_, count)), true) = (self.gpus, with_gpus) {
            capacity["nvidia.com/gpu"] = json!(count.to_string());
        }
        json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": {FAKE_NODE_ANNOTATION.0: FAKE_NODE_ANNOTATION.1}},
            "spec": {
                "providerID": format!("ironclaim://{}", self.name),
                "taints": self.taints.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>()
            },
            "status": {"capacity": capacity, "allocatable": capacity}
        })
    }

    /// The status a kubelet reports at the start of boot number `boot`.
    fn kubelet_status(&self, boot: u32) -> serde_json::Value {
        let now = jiff::Timestamp::now().to_string();
        json!({
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": now, "lastTransitionTime": now}],
            "nodeInfo": {"systemUUID": self.uuid, "bootID": format!("{}-boot-{boot}", self.name), "machineID": "", "kernelVersion": "",
                         "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64"}
        })
    }
}

/// Plays the machines until dropped.
pub struct Machines {
    task: tokio::task::JoinHandle<()>,
    /// Nodes the harness registered, by server, in order.
    pub registered: Arc<Mutex<Vec<String>>>,
}

impl Drop for Machines {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Machines {
    pub fn start(client: Client, sushy: &Sushy, machines: Vec<Machine>) -> Machines {
        let endpoint = BmcAddress::parse(&sushy.endpoint()).expect("address").endpoint;
        let creds = Credentials::new("admin", ironclaim_redfish::credentials::Secret::new("password"));
        let mut config = BmcConfig::new(endpoint, creds);
        config.timing = timing();
        let bmc = Bmc::new(config, Arc::new(tokio::sync::Semaphore::new(8))).expect("bmc");
        let registered: Arc<Mutex<Vec<String>>> = Arc::default();
        let log = registered.clone();
        let task = tokio::spawn(async move {
            let nodes: Api<Node> = Api::all(client);
            let mut on_since: BTreeMap<String, Instant> = BTreeMap::new();
            let mut node_since: BTreeMap<String, Instant> = BTreeMap::new();
            let mut gpus_shown: BTreeMap<String, bool> = BTreeMap::new();
            let mut boots: BTreeMap<String, u32> = BTreeMap::new();
            loop {
                for m in &machines {
                    let selector = SystemSelector::parse(&m.uuid).expect("selector");
                    let Ok(state) = bmc.power_state(&selector).await else { continue };
                    if state == ironclaim_redfish::PowerState::On {
                        let since = *on_since.entry(m.name.clone()).or_insert_with(Instant::now);
                        if !m.registers || since.elapsed() < m.boot {
                            continue;
                        }
                        if !node_since.contains_key(&m.name) {
                            let with_gpus = m.gpu_driver.is_zero();
                            let mut value = m.node(with_gpus);
                            let boot = *boots.entry(m.name.clone()).and_modify(|b| *b += 1).or_insert(1);
                            if m.keeps_node {
                                value["status"]
                                    .as_object_mut()
                                    .expect("status")
                                    .extend(m.kubelet_status(boot).as_object().cloned().unwrap_or_default());
                            }
                            let node: Node = serde_json::from_value(value.clone()).expect("node");
                            let registered = match nodes.create(&PostParams::default(), &node).await {
                                // A kubelet whose Node outlived the power-off
                                // reports on it from the new boot.
                                Err(kube::Error::Api(s)) if s.code == 409 && m.keeps_node => nodes
                                    .patch_status(&m.name, &PatchParams::default(), &Patch::Strategic(&json!({"status": m.kubelet_status(boot)})))
                                    .await
                                    .map(|_| ()),
                                other => other.map(|_| ()),
                            };
                            match registered {
                                Ok(()) | Err(kube::Error::Api(_)) => {
                                    node_since.insert(m.name.clone(), Instant::now());
                                    gpus_shown.insert(m.name.clone(), with_gpus);
                                    log.lock().unwrap_or_else(|p| p.into_inner()).push(m.name.clone());
                                }
                                Err(_) => {}
                            }
                        } else if !gpus_shown[&m.name] && node_since[&m.name].elapsed() >= m.gpu_driver {
                            let node = m.node(true);
                            let patch = json!({"status": {"capacity": node["status"]["capacity"], "allocatable": node["status"]["allocatable"]}});
                            if nodes.patch_status(&m.name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                                gpus_shown.insert(m.name.clone(), true);
                            }
                        }
                    } else if state == ironclaim_redfish::PowerState::Off {
                        on_since.remove(&m.name);
                        if node_since.remove(&m.name).is_some() && !m.keeps_node {
                            let _ = nodes.delete(&m.name, &DeleteParams::default()).await;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        Machines { task, registered }
    }
}

/// The namespaces tests put objects in besides [`NAMESPACE`]: where
/// deploy/rbac.yaml runs the controller, the BareMetalHosts of the Metal3
/// tests, and the chart's release.
const OTHER_NAMESPACES: [&str; 3] = ["ironclaim-system", "metal3-hosts", crate::deploy_helm::RELEASE_NAMESPACE];

/// Whose turn it is on the control plane: one test at a time.
static CLUSTER_TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The control plane, held by one test until dropped (it derefs to the
/// [`TestEnv`]). The controller acts on every Server, ServerPool and pending
/// pod it sees, so two tests on one cluster would claim each other's
/// servers: they take turns instead.
pub struct Cluster {
    env: TestEnv,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl std::ops::Deref for Cluster {
    type Target = TestEnv;
    fn deref(&self) -> &TestEnv {
        &self.env
    }
}

/// Waits for the cluster's turn, then the control plane of this test
/// binary as a fresh one would be (see [`reset`]), with the CRDs, the
/// namespace and the BMC Secret. Keep the [`Cluster`] until the test ends.
/// The controllers' logs on stderr when `IRONCLAIM_TEST_LOG` holds a
/// filter (`info`, `ironclaim_controller=debug`): run with `--nocapture`.
fn log_when_asked() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let Ok(spec) = std::env::var("IRONCLAIM_TEST_LOG") {
            let filter = tracing_subscriber::EnvFilter::try_new(&spec).unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
            let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        }
    });
}

pub async fn setup() -> (Cluster, Client) {
    let turn = CLUSTER_TURN.lock().await;
    ironclaim_redfish::install_crypto_provider();
    log_when_asked();
    let env = TestEnv::for_process().expect("test environment");
    let client = env.client().await.expect("client");
    let crds = ironclaim_k8s::api::crds_yaml().expect("crds");
    env.install_crds(&crds, &ironclaim_k8s::api::crd_names()).expect("ironclaim's CRDs");
    reset(&env, &client).await;
    let _ = env.kubectl(["create", "namespace", NAMESPACE]);
    let _ = env.kubectl(["-n", NAMESPACE, "create", "secret", "generic", "bmc", "--from-literal=username=admin", "--from-literal=password=password"]);
    (Cluster { env, _turn: turn }, client)
}

/// Removes what earlier tests left (also tests that failed half-way): every
/// Server, ServerPool, ServerClaim and Node; in the tests' namespaces the
/// workloads, pods, PodDisruptionBudgets, ConfigMaps (the claim ledger),
/// Leases and BareMetalHosts; and all Events. What stays is what a test
/// may create again without harm: namespaces, Secrets, RBAC, CRDs.
async fn reset(env: &TestEnv, client: &Client) {
    let kubectl = |args: &[&str]| env.kubectl(args).unwrap_or_else(|e| panic!("reset: {e}"));
    // Orphaned, so that nothing recreates the pods removed next.
    kubectl(&["-n", NAMESPACE, "delete", "deployments,replicasets,poddisruptionbudgets", "--all", "--cascade=orphan", "--ignore-not-found"]);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    for p in pods.list(&ListParams::default()).await.expect("list pods").items {
        if !p.finalizers().is_empty() {
            let _ = pods.patch(&p.name_any(), &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}}))).await;
        }
    }
    // No kubelet stands behind a kwok pod: nothing to wait for.
    kubectl(&["-n", NAMESPACE, "delete", "pods", "--all", "--force", "--grace-period=0", "--ignore-not-found"]);
    kubectl(&["delete", "serverclaims,servers,serverpools", "--all", "--ignore-not-found"]);
    kubectl(&["delete", "nodes", "--all", "--ignore-not-found"]);
    for ns in std::iter::once(NAMESPACE).chain(OTHER_NAMESPACES) {
        kubectl(&["-n", ns, "delete", "configmaps,leases", "--field-selector=metadata.name!=kube-root-ca.crt", "--ignore-not-found"]);
        // The Metal3, CapacityBuffer and ProvisioningRequest tests install
        // those CRDs; before them, there are none.
        for kind in ["baremetalhosts.metal3.io", "capacitybuffers.autoscaling.x-k8s.io", "provisioningrequests.autoscaling.x-k8s.io"] {
            if let Err(e) = env.kubectl(["-n", ns, "delete", kind, "--all", "--ignore-not-found"])
                && !e.to_string().contains("doesn't have a resource type")
            {
                panic!("reset: {e}");
            }
        }
    }
    kubectl(&["delete", "events", "--all", "--all-namespaces", "--ignore-not-found"]);
    let nodes: Api<Node> = Api::all(client.clone());
    let servers: Api<Server> = Api::all(client.clone());
    eventually("the cluster empty of earlier tests' pods, nodes and servers", Duration::from_secs(30), || {
        let (pods, nodes, servers) = (pods.clone(), nodes.clone(), servers.clone());
        async move {
            let left = |l: Result<Vec<String>, kube::Error>| l.map_err(|e| e.to_string());
            let pods = left(pods.list(&ListParams::default()).await.map(|l| l.items.iter().map(ResourceExt::name_any).collect()))?;
            let nodes = left(nodes.list(&ListParams::default()).await.map(|l| l.items.iter().map(ResourceExt::name_any).collect()))?;
            let servers = left(servers.list(&ListParams::default()).await.map(|l| l.items.iter().map(ResourceExt::name_any).collect()))?;
            if pods.is_empty() && nodes.is_empty() && servers.is_empty() {
                Ok(())
            } else {
                Err(format!("pods {pods:?}, nodes {nodes:?}, servers {servers:?}"))
            }
        }
    })
    .await;
}

/// r1-u01 (off) and r1-u02, on. With `recorded`, r1-u02's power-on came
/// from the dead controller, recorded on its Server before it was sent,
/// as every power-on of ironclaim's is; without, r1-u02 was on before.
/// One ServerPool over both.
pub fn two_machines_the_second_on(env: &TestEnv, first_index: usize, recorded: bool) -> (Vec<Machine>, Sushy) {
    let machines = vec![Machine::new("r1-u01", first_index, 16, 32), Machine::new("r1-u02", first_index + 1, 16, 32)];
    let sushy = start_sushy([(machines[0].uuid.clone(), SystemPower::Off), (machines[1].uuid.clone(), SystemPower::On)]);
    for m in &machines {
        apply(env, &m.server_json(&sushy));
    }
    if recorded {
        let patch = json!({"status": {"poweredOnByIronclaim": true}}).to_string();
        env.kubectl(["patch", "server", "r1-u02", "--subresource=status", "--type=merge", "-p", patch.as_str()])
            .unwrap_or_else(|e| panic!("recording r1-u02's power-on: {e}"));
    }
    apply(env, &serverpool("default", json!([]), json!({})));
    (machines, sushy)
}

/// The restart after an opening died: the harness plays r1-u01 only (the
/// dead opening's r1-u02 must not become a node), a controller with
/// `grace` as its opening grace and a fast power sweep starts, and a pod
/// `app` that fits either server arrives. Returns once a sweep has run
/// (it recorded r1-u01's power), two seconds later.
pub async fn restart_after_dead_opening(
    env: &TestEnv,
    client: &Client,
    sushy: &Sushy,
    machines: &[Machine],
    instance: &str,
    grace: Duration,
) -> (Running, Machines) {
    let harness = Machines::start(client.clone(), sushy, vec![machines[0].clone()]);
    let mut s = settings(instance);
    s.claims.opening_grace = grace;
    s.power_sweep_every = Duration::from_millis(500);
    let controller = run(Controller::new(client.clone(), redfish(client), s));
    apply(env, &pod("app", "8", "8Gi", &[], 0));
    let c = client.clone();
    eventually("a sweep recorded r1-u01's power", Duration::from_secs(15), || {
        let c = c.clone();
        async move { if server(&c, "r1-u01").await.status.unwrap_or_default().power_state.is_some() { Ok(()) } else { Err("not yet".into()) } }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    (controller, harness)
}

/// Waits up to `within` for `pod` to be bound; returns what [`bound`] says.
pub async fn await_bound(client: &Client, pod: &str, within: Duration) -> String {
    let c = client.clone();
    let pod = pod.to_string();
    eventually(&format!("{pod} bound"), within, || {
        let (c, pod) = (c.clone(), pod.clone());
        async move { bound(&c, &pod).await }
    })
    .await
}

pub fn apply(env: &TestEnv, value: &serde_json::Value) {
    env.kubectl_with_stdin(["apply", "-f", "-"], &value.to_string()).unwrap_or_else(|e| panic!("apply {value}: {e}"));
}

/// A Ready kwok node that exists before the test, not backed by a server.
pub fn existing_node(name: &str, cpu: u32, memory_gi: u32, labels: &[(&str, &str)], gpus: u32, taints: &[&str]) -> serde_json::Value {
    let mut l: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    l.insert("kubernetes.io/hostname".into(), name.into());
    let mut capacity = json!({"cpu": cpu.to_string(), "memory": format!("{memory_gi}Gi"), "pods": "110"});
    if gpus > 0 {
        capacity["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": l, "annotations": {FAKE_NODE_ANNOTATION.0: FAKE_NODE_ANNOTATION.1}},
        "spec": {"taints": taints.iter().map(|k| json!({"key": k, "effect": "NoSchedule"})).collect::<Vec<_>>()},
        "status": {"capacity": capacity, "allocatable": capacity}
    })
}

/// A pod; GPU pods tolerate the `nvidia.com/gpu` taint.
pub fn pod(name: &str, cpu: &str, memory: &str, selector: &[(&str, &str)], gpus: u32) -> serde_json::Value {
    let mut requests = json!({"cpu": cpu, "memory": memory});
    let mut limits = json!({});
    if gpus > 0 {
        requests["nvidia.com/gpu"] = json!(gpus.to_string());
        limits["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    let selector: BTreeMap<&str, &str> = selector.iter().copied().collect();
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "nodeSelector": selector,
            "tolerations": if gpus > 0 { json!([{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]) } else { json!([]) },
            "containers": [{"name": "c", "image": "registry.invalid/app", "resources": {"requests": requests, "limits": limits}}]
        }
    })
}

pub fn serverpool(name: &str, requirements: serde_json::Value, readiness: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
        "metadata": {"name": name},
        "spec": {"requirements": requirements, "readiness": readiness}
    })
}

/// A ServerPool whose nodes carry `taint` (NoSchedule).
pub fn tainted_serverpool(name: &str, requirements: serde_json::Value, readiness: serde_json::Value, taint: &str) -> serde_json::Value {
    let mut pool = serverpool(name, requirements, readiness);
    pool["spec"]["template"] = json!({"taints": [{"key": taint, "effect": "NoSchedule"}]});
    pool
}

/// Short windows and deadlines, so a test runs in seconds.
pub fn settings(instance: &str) -> Settings {
    Settings {
        windows: Windows { idle: Duration::from_millis(300), max: Duration::from_secs(2) },
        claims: ClaimSettings {
            deadlines: Deadlines { margin_percent: 200, floor_s: 5 },
            retry: Retry { base: Duration::from_millis(500), max: Duration::from_secs(2), attempts: 4 },
            quarantine_after: 3,
            failed_claim_ttl: Duration::from_secs(3600),
            opening_grace: Duration::from_secs(60),
            lock_namespace: NAMESPACE.into(),
        },
        failure_backoff: FailureBackoff { base_s: 600, max_s: 3600 },
        tick: Duration::from_millis(200),
        redecide_every: Duration::from_secs(2),
        power_sweep_every: Duration::from_secs(3),
        lease: None,
        metrics_address: None,
        instance: instance.into(),
        open_concurrency: 8,
        publish_events: true,
        scaledown: Default::default(),
        dry_run: false,
        power_budget_watts: None,
        transition_limits: Default::default(),
        dashboard: true,
        api_requests: Default::default(),
        events_client: None,
    }
}

/// The body of `GET path` on 127.0.0.1:`port`, when it answers 200.
pub async fn http_get(port: u16, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.map_err(|e| e.to_string())?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).await.map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(|e| e.to_string())?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") => Ok(body.to_string()),
        _ => Err(response),
    }
}

/// A free port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
}

pub fn redfish(client: &Client) -> Arc<dyn Power> {
    Arc::new(RedfishPower::new(client.clone(), timing()))
}

/// A controller running in a task until the returned sender is dropped or fired.
pub struct Running {
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<ironclaim_controller::Result<()>>,
}

impl Running {
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), &mut self.task).await;
    }
    /// Ends it abruptly, as a killed process would.
    pub fn kill(self) {
        self.task.abort();
    }
}

pub fn run(controller: Controller) -> Running {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(controller.run(async move {
        let _ = rx.await;
    }));
    Running { stop: Some(tx), task }
}

pub async fn claims(client: &Client) -> Vec<ServerClaim> {
    Api::<ServerClaim>::all(client.clone()).list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default()
}

/// A ServerPool of the servers labelled `e2e.ironclaim.dev/pool: NAME`,
/// weight 100, every node disruptable.
pub fn labelled_pool(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
        "metadata": {"name": name},
        "spec": {
            "weight": 100,
            "requirements": [{"key": "e2e.ironclaim.dev/pool", "operator": "In", "values": [name]}],
            "disruption": {"budgets": [{"nodes": "100%"}]}
        }
    })
}

/// The status of the claim on `server` once it is Serving, having walked
/// every stage and passed each.
pub async fn served_claim(client: &Client, server: &str) -> ironclaim_k8s::api::serverclaim::ServerClaimStatus {
    use ironclaim_k8s::api::serverclaim::{Stage, StageOutcome};
    let c = client.clone();
    let claim = eventually("the claim serving", Duration::from_secs(15), || {
        let c = c.clone();
        async move {
            let all = claims(&c).await;
            match all.iter().find(|x| x.spec.server == server) {
                Some(x) if x.status.as_ref().and_then(|s| s.stage) == Some(Stage::Serving) => Ok(x.clone()),
                _ => Err(format!("{:?}", names(&all))),
            }
        }
    })
    .await;
    let status = claim.status.clone().unwrap_or_default();
    let stages: Vec<Stage> = status.stages.iter().map(|r| r.stage).collect();
    assert_eq!(stages, [Stage::Selected, Stage::PoweringOn, Stage::Booting, Stage::Joined, Stage::Ready, Stage::Serving]);
    assert!(status.stages.iter().all(|r| r.outcome == StageOutcome::Succeeded), "{status:?}");
    status
}

pub async fn server(client: &Client, name: &str) -> Server {
    Api::<Server>::all(client.clone()).get(name).await.expect("server")
}

pub async fn pod_node(client: &Client, name: &str) -> Option<String> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.get(name).await.ok().and_then(|p| p.spec.and_then(|s| s.node_name))
}

/// The Events on a pod, as "reason: note" lines.
pub async fn pod_events(client: &Client, pod: &str) -> Vec<String> {
    settled_events(client, Some(NAMESPACE), |r| r.name.as_deref() == Some(pod)).await
}

/// The Events about what `regarding` picks, as `reason: note`, once two
/// reads a quarter of a second apart agree (at most 3 s): the controller
/// sends Events from a queue, after the writes they tell of.
pub async fn settled_events(
    client: &Client,
    namespace: Option<&str>,
    regarding: impl Fn(&k8s_openapi::api::core::v1::ObjectReference) -> bool,
) -> Vec<String> {
    let events: Api<k8s_openapi::api::events::v1::Event> = match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let read = || async {
        let list = events.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
        list.into_iter()
            .filter(|e| e.regarding.as_ref().is_some_and(&regarding))
            .map(|e| format!("{}: {}", e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect::<Vec<String>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut last = read().await;
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = read().await;
        if now == last || std::time::Instant::now() >= deadline {
            return now;
        }
        last = now;
    }
}

pub fn names(claims: &[ServerClaim]) -> Vec<String> {
    claims.iter().map(|c| format!("{} -> {} ({:?})", c.name_any(), c.spec.server, c.status.as_ref().and_then(|s| s.stage))).collect()
}

/// The node a pod is bound to, or what the claims look like while it waits.
pub async fn bound(client: &Client, pod: &str) -> Result<String, String> {
    match pod_node(client, pod).await {
        Some(node) => Ok(node),
        None => Err(format!("{pod} pending; claims: {:?}", names(&claims(client).await))),
    }
}

/// Installs CRDs of a peer project (`hack/testenv peer-crds` fetched them:
/// `peer` is the start of its directory's name, `karpenter-`) and waits
/// until each named CRD is established.
pub fn install_peer_crds(env: &TestEnv, peer: &str, files: &[&str], crds: &[&str]) {
    let dir = TestEnv::peer_crd_dirs()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .find(|d| d.file_name().is_some_and(|n| n.to_string_lossy().starts_with(peer)))
        .unwrap_or_else(|| panic!("hack/testenv peer-crds gives no {peer}* CRDs"));
    for file in files {
        let text = std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        env.kubectl_with_stdin(["apply", "--server-side", "-f", "-"], &text).unwrap_or_else(|e| panic!("apply {file}: {e}"));
    }
    for crd in crds {
        env.kubectl(["wait", "--for=condition=Established", &format!("crd/{crd}"), "--timeout=30s"])
            .unwrap_or_else(|e| panic!("{crd} established: {e}"));
    }
}
