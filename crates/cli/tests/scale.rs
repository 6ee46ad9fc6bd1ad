//! The controller binary at fleet scale, against the real control plane of
//! `hack/testenv` (kube-apiserver, kube-controller-manager, kube-scheduler;
//! kwok plays the kubelets) and an in-process test BMC per Server (the
//! redfish crate's mock, the DMTF mockup's system copied per Server, one
//! loopback endpoint each over one shared world).
//!
//! The fleet: `on` Servers powered on, each a kwok Node; `off` Servers
//! powered off; `plain` Nodes no Server stands behind; every Node holds
//! `pods_per_node` bound pods of 1 CPU (30 of a Server's 32). Then a burst
//! of 5 pods of 6 CPU per powered-off Server arrives: none fits a running
//! Node, so each powered-off Server must be powered on, once.
//!
//! What is measured, printed as a table: the controller's resident memory
//! (p95 and peak, sampled every half second from `/proc`), its CPU time,
//! the time from the burst to the last power-on request the BMC received,
//! the decision latency the controller reports, its watch lag, and the
//! requests per second it sent to the API server (its own count,
//! `ironclaim_api_requests_total`).
//!
//! What is checked: every powered-off Server got exactly one power-on and
//! no running one got any power request; every burst pod was bound; no
//! window of the run saw more requests than `--kube-api-burst` plus
//! `--kube-api-qps` times its length.
//!
//! The default suite runs a small fleet. `hack/scale-test` runs the
//! 5,000-node one (`the_controller_at_fleet_scale_full`, ignored here),
//! in release; docs/bench.md has its figures.

#[path = "../../redfish/tests/common/mod.rs"]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use common::mock::MockBmc;
use common::{PASSWORD, USERNAME};
use ironclaim_testenv::TempDir;
use ironclaim_testenv::{FAKE_NODE_ANNOTATION, TestEnv};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const NS: &str = "scale";

/// The fleet a run builds.
#[derive(Clone, Debug)]
struct Fleet {
    on: usize,
    off: usize,
    plain: usize,
    pods_per_node: usize,
    qps: u32,
    api_burst: u32,
}

impl Fleet {
    fn nodes(&self) -> usize {
        self.on + self.plain
    }
    fn servers(&self) -> usize {
        self.on + self.off
    }
    fn burst_pods(&self) -> usize {
        self.off * PODS_PER_NEW_SERVER
    }

    /// The 5,000-node fleet of the issue, or what `IRONCLAIM_SCALE_*` say.
    fn from_env() -> Fleet {
        let var = |name: &str, default: usize| -> usize {
            std::env::var(name).ok().map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")))
        };
        Fleet {
            on: var("IRONCLAIM_SCALE_ON", 4_000),
            off: var("IRONCLAIM_SCALE_OFF", 1_000),
            plain: var("IRONCLAIM_SCALE_PLAIN", 1_000),
            pods_per_node: var("IRONCLAIM_SCALE_PODS_PER_NODE", 30),
            qps: var("IRONCLAIM_SCALE_QPS", 100) as u32,
            api_burst: var("IRONCLAIM_SCALE_API_BURST", 200) as u32,
        }
    }
}

const SERVER_CPU: usize = 32;
const BURST_POD_CPU: usize = 6;
const PODS_PER_NEW_SERVER: usize = SERVER_CPU / BURST_POD_CPU;
/// From a power-on to the Node registering.
const BOOT: Duration = Duration::from_secs(2);

fn system_id(i: usize) -> String {
    format!("sys-{i:05}")
}

fn server_name(i: usize) -> String {
    format!("srv-{i:05}")
}

fn server(i: usize, endpoint: &str) -> Value {
    json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": server_name(i)},
        "spec": {
            "bmc": {"address": format!("{endpoint}/redfish/v1/Systems/{}", system_id(i)), "credentialsSecretRef": {"name": "bmc", "namespace": NS}},
            "hardware": {"cpu": SERVER_CPU.to_string(), "memory": "128Gi"},
            "labels": {"topology.kubernetes.io/rack": format!("r{:03}", i / 40)},
            "power": {"idleWatts": 150, "peakWatts": 400},
            "stageDurations": {"powerOn": "10s", "boot": "5s", "join": "5s", "ready": "5s", "tailPercent": 150}
        }
    })
}

/// A kwok Node: a Server's (`server` set) or a plain one.
fn node(name: &str, server: Option<&str>) -> Value {
    let mut labels = json!({"kubernetes.io/hostname": name, "topology.kubernetes.io/rack": "plain"});
    let mut spec = json!({});
    if let Some(server) = server {
        labels["ironclaim.dev/server"] = json!(server);
        spec["providerID"] = json!(format!("ironclaim://{server}"));
    }
    let capacity = json!({"cpu": SERVER_CPU.to_string(), "memory": "128Gi", "pods": "110"});
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": {FAKE_NODE_ANNOTATION.0: FAKE_NODE_ANNOTATION.1}},
        "spec": spec,
        "status": {"capacity": capacity, "allocatable": capacity}
    })
}

fn pod(name: &str, cpu: usize, memory_gi: usize, node: Option<&str>) -> Value {
    let mut spec = json!({
        "automountServiceAccountToken": false,
        "containers": [{"name": "c", "image": "registry.invalid/app", "resources": {"requests": {"cpu": cpu.to_string(), "memory": format!("{memory_gi}Gi")}}}]
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS, "labels": {"app": name.split('-').next().unwrap_or(name)}}, "spec": spec})
}

/// Creates every object through `api`, `in_flight` at a time, saying how
/// far it got every tenth.
async fn create_all<K>(api: &Api<K>, objects: Vec<Value>, what: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug + Send + Sync + 'static,
{
    let started = Instant::now();
    let total = objects.len();
    let in_flight = Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    let mut done = 0usize;
    for (i, value) in objects.into_iter().enumerate() {
        let permit = in_flight.clone().acquire_owned().await.expect("semaphore");
        let api = api.clone();
        tasks.spawn(async move {
            let _permit = permit;
            let object: K = serde_json::from_value(value).expect("object");
            for attempt in 0.. {
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => return,
                    Err(kube::Error::Api(s)) if s.code == 409 => return,
                    Err(e) if attempt < 5 => {
                        eprintln!("create: {e}; again");
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                    Err(e) => panic!("create: {e}"),
                }
            }
        });
        while let Some(joined) = tasks.try_join_next() {
            joined.expect("create task");
            done += 1;
        }
        if total >= 1_000 && (i + 1) % (total / 10) == 0 {
            println!("  {what}: {}/{total} sent, {:.0} s", i + 1, started.elapsed().as_secs_f64());
        }
    }
    while let Some(joined) = tasks.join_next().await {
        joined.expect("create task");
        done += 1;
    }
    assert_eq!(done, total);
    println!("  {what}: {total} created in {:.1} s", started.elapsed().as_secs_f64());
}

/// One look at the controller process.
#[derive(Clone, Copy, Debug)]
struct Sample {
    /// When the scrape of the metrics was sent.
    at: Instant,
    /// When its answer came: the count read lies between the two.
    answered: Instant,
    rss_kib: u64,
    cpu_ticks: u64,
    /// `ironclaim_api_requests_total`, all verbs; None before it serves.
    requests: Option<u64>,
}

fn proc_sample(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.split_whitespace().next()?.parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line.
    let rest: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let cpu = rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?;
    Some((rss, cpu))
}

fn clock_ticks_per_second() -> f64 {
    Command::new("getconf").arg("CLK_TCK").output().ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok()).unwrap_or(100.0)
}

/// The body of the controller's `GET path`, when it answers 200.
async fn get(port: u16, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes()).await.ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    head.contains(" 200 ").then(|| body.to_string())
}

async fn metrics(port: u16) -> Option<String> {
    get(port, "/metrics").await
}

/// The sum of a metric's samples whose name and labels start with `prefix`.
fn metric_sum(text: &str, prefix: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#') && l.starts_with(prefix))
        .filter_map(|l| l.rsplit_once(' ').and_then(|(_, v)| v.parse::<f64>().ok()))
        .sum()
}

/// Cumulative bucket counts of a histogram's series, by upper bound.
fn buckets(text: &str, series: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{series}_bucket{{");
    let mut out: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((bound, l.rsplit_once(' ')?.1.parse().ok()?))
        })
        .collect();
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// The upper bound of the bucket holding quantile `q` of what was
/// observed between two scrapes.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let diff: Vec<(f64, f64)> = after.iter().map(|(b, n)| (*b, n - before.iter().find(|(x, _)| x == b).map_or(0.0, |(_, m)| *m))).collect();
    let total = diff.last()?.1;
    (total > 0.0).then(|| diff.iter().find(|(_, n)| *n >= q * total).map_or(f64::INFINITY, |(b, _)| *b))
}

fn percentile(values: &mut [u64], p: f64) -> u64 {
    values.sort_unstable();
    values.get(((values.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0)
}

/// The controller, as a user runs it: the built binary.
struct ControllerProcess {
    child: Child,
    port: u16,
    log: std::path::PathBuf,
    /// Run under `IRONCLAIM_SCALE_WRAP`: `child` is the wrapper.
    wrapped: bool,
}

impl ControllerProcess {
    fn start(env: &TestEnv, fleet: &Fleet, dir: &TempDir) -> ControllerProcess {
        let port = common::free_port();
        let log = dir.path().join("controller.log");
        let file = std::fs::File::create(&log).expect("log file");
        // `IRONCLAIM_SCALE_WRAP`: a command to run the controller under (a
        // heap profiler); the process measured is then the wrapper.
        let wrap = std::env::var("IRONCLAIM_SCALE_WRAP").unwrap_or_default();
        let mut words = wrap.split_whitespace();
        let wrapper = words.next();
        let wrapped = wrapper.is_some();
        let mut command = match wrapper {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(env!("CARGO_BIN_EXE_ironclaim"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_ironclaim")),
        };
        let child = command
            .args(["controller", "--log-format", "json", "--dashboard", "false", "--controller-namespace", NS])
            .args(["--metrics-address", &format!("127.0.0.1:{port}")])
            .args(["--kube-api-qps", &fleet.qps.to_string(), "--kube-api-burst", &fleet.api_burst.to_string()])
            .args(["--batch-idle", "1s", "--batch-max", "10s", "--power-sweep-every", "20s"])
            .arg("--kubeconfig")
            .arg(env.kubeconfig())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .expect("start ironclaim controller");
        ControllerProcess { child, port, log, wrapped }
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// SIGTERM, and how it exited. Under a wrapper (`IRONCLAIM_SCALE_WRAP`)
    /// the signal goes to the controller the wrapper started or became
    /// (not to the wrapper's own helpers, which write what it measured),
    /// and the exit is the wrapper's.
    fn stop(mut self) -> Option<i32> {
        let controller =
            |pid: &u32| std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e == std::path::Path::new(env!("CARGO_BIN_EXE_ironclaim")));
        // A wrapper that execs the controller (`env`, `taskset`) is the
        // controller itself.
        let targets: Vec<u32> = if self.wrapped {
            std::iter::once(self.child.id()).chain(descendants(self.child.id())).filter(controller).collect()
        } else {
            vec![self.child.id()]
        };
        for pid in targets {
            let _ = Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        }
        for _ in 0..100 {
            if let Ok(Some(status)) = self.child.try_wait() {
                return status.code();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        None
    }
}

/// The processes below `pid`, from /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|p| {
            let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
            // The parent is the second field after the command's closing parenthesis.
            let ppid = stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()?;
            Some((p, ppid))
        })
        .collect();
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, _) in parents.iter().filter(|&&(_, parent)| parent == p) {
            out.push(child);
            frontier.push(child);
        }
    }
    out
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits for `check` to hold, up to `within`, polling every `every`.
async fn until<F, Fut>(what: &str, within: Duration, every: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let started = Instant::now();
    let mut told = Instant::now();
    loop {
        let last = match check().await {
            Ok(()) => return started.elapsed(),
            Err(e) => e,
        };
        assert!(started.elapsed() < within, "{what}: not within {within:?}: {last}");
        if told.elapsed() >= Duration::from_secs(30) {
            println!("  waiting for {what}, {:.0} s: {last}", started.elapsed().as_secs_f64());
            told = Instant::now();
        }
        tokio::time::sleep(every).await;
    }
}

/// Plays the machines: a Server powered on registers its Node `BOOT`
/// later. Returns when dropped.
fn play_machines(client: Client, bmc: &MockBmc, first_off: usize) -> tokio::task::JoinHandle<()> {
    let world = bmc.world.clone();
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client);
        let mut seen = 0usize;
        let mut due: Vec<(Instant, usize)> = Vec::new();
        let mut registered = BTreeSet::new();
        loop {
            {
                let w = world.lock().unwrap_or_else(|p| p.into_inner());
                for reset in &w.reset_log[seen..] {
                    let id = reset.system.rsplit('/').next().unwrap_or_default();
                    if let Some(i) = id.strip_prefix("sys-").and_then(|n| n.parse::<usize>().ok())
                        && i >= first_off
                        && matches!(reset.reset.as_str(), "On" | "ForceOn")
                    {
                        due.push((reset.answered + BOOT, i));
                    }
                }
                seen = w.reset_log.len();
            }
            let now = Instant::now();
            let ready: Vec<usize> = due.iter().filter(|(at, _)| *at <= now).map(|(_, i)| *i).collect();
            due.retain(|(at, _)| *at > now);
            for i in ready {
                if registered.insert(i) {
                    let name = server_name(i);
                    let n: Node = serde_json::from_value(node(&name, Some(&name))).expect("node");
                    let _ = nodes.create(&PostParams::default(), &n).await;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

async fn run(fleet: Fleet) {
    println!(
        "fleet: {fleet:?}: {} nodes, {} servers, {} bound pods, a burst of {} pods",
        fleet.nodes(),
        fleet.servers(),
        fleet.nodes() * fleet.pods_per_node,
        fleet.burst_pods()
    );
    ironclaim_redfish::install_crypto_provider();
    let env = TestEnv::for_process().expect("test environment");
    let client = env.client().await.expect("client");
    let crds = ironclaim_k8s::api::crds_yaml().expect("crds");
    env.install_crds(&crds, &ironclaim_k8s::api::crd_names()).expect("ironclaim's CRDs");
    let _ = env.kubectl(["create", "namespace", NS]);
    let _ = env.kubectl([
        "-n",
        NS,
        "create",
        "secret",
        "generic",
        "bmc",
        &format!("--from-literal=username={USERNAME}"),
        &format!("--from-literal=password={PASSWORD}"),
    ]);
    // An empty node idles two minutes before it is drained, past the
    // burst's binding: the run measures the burst, not drains of nodes the
    // scheduler has yet to fill (docs/bench.md, run 8).
    let pool = json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool", "metadata": {"name": "fleet"},
                      "spec": {"requirements": [], "disruption": {"consolidateAfter": "2m"}}});
    env.kubectl_with_stdin(["apply", "-f", "-"], &pool.to_string()).expect("pool");

    // The BMC: every Server's system, the first `on` of them powered on.
    let bmc = MockBmc::start().await;
    {
        let mut w = bmc.world();
        for i in 0..fleet.servers() {
            w.add_system(&system_id(i), if i < fleet.on { "On" } else { "Off" });
        }
    }
    // A BMC per server, as racks have: an endpoint each, one world behind.
    let mut endpoints = Vec::with_capacity(fleet.servers());
    for _ in 0..fleet.servers() {
        endpoints.push(bmc.listen_again().await);
    }
    println!("building the fleet");
    let servers: Vec<Value> = endpoints.iter().enumerate().map(|(i, endpoint)| server(i, endpoint)).collect();
    create_all(&Api::<ironclaim_k8s::api::Server>::all(client.clone()), servers, "Servers").await;
    let node_names: Vec<String> = (0..fleet.on).map(server_name).chain((0..fleet.plain).map(|i| format!("plain-{i:05}"))).collect();
    let nodes: Vec<Value> = node_names.iter().enumerate().map(|(i, n)| node(n, (i < fleet.on).then_some(n.as_str()))).collect();
    create_all(&Api::<Node>::all(client.clone()), nodes, "Nodes").await;
    let pods: Vec<Value> =
        node_names.iter().flat_map(|n| (0..fleet.pods_per_node).map(move |k| pod(&format!("bulk-{n}-{k:02}"), 1, 2, Some(n)))).collect();
    create_all(&Api::<Pod>::namespaced(client.clone(), NS), pods, "bound pods").await;

    // The controller starts on the built fleet: its first list is the whole of it.
    let dir = TempDir::new("scale");
    let started = Instant::now();
    let mut controller = ControllerProcess::start(&env, &fleet, &dir);
    let pid = controller.child.id();
    let port = controller.port;
    let samples = Arc::new(std::sync::Mutex::new(Vec::<Sample>::new()));
    let sampler = {
        let samples = samples.clone();
        tokio::spawn(async move {
            loop {
                let at = Instant::now();
                let requests = metrics(port).await.map(|m| metric_sum(&m, "ironclaim_api_requests_total") as u64);
                let answered = Instant::now();
                let Some((rss_kib, cpu_ticks)) = proc_sample(pid) else { return };
                samples.lock().unwrap_or_else(|p| p.into_inner()).push(Sample { at, answered, rss_kib, cpu_ticks, requests });
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let ready_after = until("the controller ready", Duration::from_secs(600), Duration::from_millis(200), || async move {
        if get(port, "/readyz").await.is_some() { Ok(()) } else { Err("not ready (or not serving yet)".into()) }
    })
    .await;
    assert!(controller.alive(), "the controller exited:\n{}", controller.log_tail());
    println!("controller ready {:.1} s after its start", ready_after.as_secs_f64());
    // Its first power sweep has read every server.
    let servers = fleet.servers() as f64;
    let swept_after = until("every server's power read", Duration::from_secs(600), Duration::from_millis(500), || async move {
        let m = metrics(port).await.unwrap_or_default();
        let read = metric_sum(&m, "ironclaim_servers{");
        if read >= servers { Ok(()) } else { Err(format!("{read} of {servers}")) }
    })
    .await;
    println!("every server's power read {:.1} s later", swept_after.as_secs_f64());
    let settled = Instant::now();
    let before = metrics(port).await.expect("metrics");

    // The burst.
    let machines = play_machines(client.clone(), &bmc, fleet.on);
    let burst_start = Instant::now();
    let burst: Vec<Value> = (0..fleet.burst_pods()).map(|k| pod(&format!("burst-{k:05}"), BURST_POD_CPU, 8, None)).collect();
    create_all(&Api::<Pod>::namespaced(client.clone(), NS), burst, "burst pods").await;
    let burst_created = Instant::now();
    let world = bmc.world.clone();
    let (first_off, want) = (fleet.on, fleet.off);
    let powered_after = until("every powered-off server asked to power on", Duration::from_secs(1200), Duration::from_millis(200), || {
        let world = world.clone();
        async move {
            let w = world.lock().unwrap_or_else(|p| p.into_inner());
            let on = w.reset_log.iter().filter(|r| matches!(r.reset.as_str(), "On" | "ForceOn")).count();
            if on >= want { Ok(()) } else { Err(format!("{on} of {want} power-ons (systems from {first_off})")) }
        }
    })
    .await;
    println!("every powered-off server asked to power on {:.1} s after the burst's last pod", powered_after.as_secs_f64());
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let burst_total = fleet.burst_pods();
    until("every burst pod bound", Duration::from_secs(1800), Duration::from_secs(1), || {
        let pods_api = pods_api.clone();
        async move {
            let list = pods_api.list(&ListParams::default().labels("app=burst")).await.map_err(|e| e.to_string())?;
            let bound = list.items.iter().filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()).count();
            if bound == burst_total { Ok(()) } else { Err(format!("{bound} of {burst_total} bound")) }
        }
    })
    .await;
    let bound_at = Instant::now();
    let after = metrics(port).await.expect("metrics");
    let ended = Instant::now();
    machines.abort();
    assert!(controller.alive(), "the controller exited:\n{}", controller.log_tail());
    sampler.abort();
    let log = controller.log.clone();
    let exit = controller.stop();

    // What the BMC saw: one power-on per powered-off server, nothing else.
    let resets = bmc.world().reset_log.clone();
    let mut by_system: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for r in &resets {
        by_system.entry(r.system.rsplit('/').next().unwrap_or_default().to_string()).or_default().push(r.reset.clone());
    }
    let touched_running: Vec<&String> =
        by_system.keys().filter(|id| id.strip_prefix("sys-").and_then(|n| n.parse::<usize>().ok()).is_some_and(|i| i < fleet.on)).collect();
    assert!(touched_running.is_empty(), "power requests to servers running work: {touched_running:?}");
    let twice: Vec<(&String, &Vec<String>)> = by_system.iter().filter(|(_, r)| r.len() != 1).collect();
    if !twice.is_empty() {
        // What the controller said of them, for the failure to explain itself.
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let names: Vec<String> = twice.iter().take(3).map(|(id, _)| id.replace("sys-", "srv-")).collect();
        let said: Vec<&str> = text.lines().filter(|l| names.iter().any(|n| l.contains(n.as_str()))).collect();
        panic!(
            "servers not powered on exactly once: {:?}\nthe controller's log of the first of them:\n{}",
            &twice[..twice.len().min(10)],
            said.join("\n")
        );
    }
    assert_eq!(by_system.len(), fleet.off, "power-ons");
    let last_power_on = resets.iter().map(|r| r.arrived).max().expect("a power-on");
    let first_power_on = resets.iter().map(|r| r.arrived).min().expect("a power-on");

    // The API rate the flags promise, over every window the samples span.
    let samples = samples.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let counted: Vec<(Instant, Instant, u64)> = samples.iter().filter_map(|s| s.requests.map(|r| (s.at, s.answered, r))).collect();
    let mut peak_qps = 0.0f64;
    for (i, (t0, _, r0)) in counted.iter().enumerate() {
        for (t1, answered1, r1) in &counted[i + 1..] {
            let window = t1.duration_since(*t0).as_secs_f64();
            let sent = r1.saturating_sub(*r0) as f64;
            // The two counts were read at most this far apart: from the
            // first scrape's sending to the second's answer (a busy
            // controller may take a while to answer one).
            let apart = answered1.duration_since(*t0).as_secs_f64();
            let allowed = f64::from(fleet.api_burst) + f64::from(fleet.qps) * apart;
            assert!(
                sent <= allowed,
                "{sent} requests in {window:.2} s (counts read at most {apart:.2} s apart), over --kube-api-burst {} and --kube-api-qps {}",
                fleet.api_burst,
                fleet.qps
            );
            if (0.9..=1.6).contains(&window) {
                peak_qps = peak_qps.max(sent / window);
            }
        }
    }

    // Figures.
    let ticks = clock_ticks_per_second();
    let mut rss: Vec<u64> = samples.iter().map(|s| s.rss_kib).collect();
    let rss_peak = rss.iter().copied().max().unwrap_or(0);
    let rss_p95 = percentile(&mut rss, 0.95);
    let cpu_at = |t: Instant| samples.iter().rfind(|s| s.at <= t).map_or(0, |s| s.cpu_ticks);
    let cpu_total = samples.last().map_or(0, |s| s.cpu_ticks) as f64 / ticks;
    let cpu_start = cpu_at(settled) as f64 / ticks;
    let cpu_burst = cpu_total - cpu_start;
    let requests_total = counted.last().map_or(0, |c| c.2);
    let run_s = ended.duration_since(started).as_secs_f64();
    let lag_series = "ironclaim_watch_lag_seconds";
    let pod_before = kind_buckets(&before, lag_series, "Pod");
    let pod_after = kind_buckets(&after, lag_series, "Pod");
    let decision_before = buckets(&before, "ironclaim_decision_latency_seconds");
    let decision_after = buckets(&after, "ironclaim_decision_latency_seconds");
    let decisions = metric_sum(&after, "ironclaim_decision_latency_seconds_count") - metric_sum(&before, "ironclaim_decision_latency_seconds_count");
    let fmt_q = |v: Option<f64>| v.map_or("-".to_string(), |s| if s.is_infinite() { "over the top bucket".into() } else { format!("<= {s} s") });
    let rows = [
        (
            "nodes / servers / bound pods / burst pods",
            format!("{} / {} / {} / {}", fleet.nodes(), fleet.servers(), fleet.nodes() * fleet.pods_per_node, fleet.burst_pods()),
        ),
        ("controller start to ready (first list)", format!("{:.1} s", ready_after.as_secs_f64())),
        ("first power sweep of every server", format!("{:.1} s", swept_after.as_secs_f64())),
        ("RSS p95 / peak over the run", format!("{:.0} MiB / {:.0} MiB", rss_p95 as f64 / 1024.0, rss_peak as f64 / 1024.0)),
        ("CPU, whole run / burst to end", format!("{cpu_total:.1} s / {cpu_burst:.1} s (run {run_s:.0} s)")),
        ("burst pods created", format!("{:.1} s", burst_created.duration_since(burst_start).as_secs_f64())),
        (
            "burst start to first / last power-on request",
            format!(
                "{:.1} s / {:.1} s",
                first_power_on.saturating_duration_since(burst_start).as_secs_f64(),
                last_power_on.saturating_duration_since(burst_start).as_secs_f64()
            ),
        ),
        (
            "last burst pod created to last power-on request",
            format!("{:.1} s (batch idle 1 s, max 10 s)", last_power_on.saturating_duration_since(burst_created).as_secs_f64()),
        ),
        (
            "decisions in the burst; latency p50 / max bucket",
            format!(
                "{decisions:.0}; {} / {}",
                fmt_q(quantile(&decision_before, &decision_after, 0.5)),
                fmt_q(quantile(&decision_before, &decision_after, 1.0))
            ),
        ),
        ("burst start to every burst pod bound", format!("{:.1} s", bound_at.duration_since(burst_start).as_secs_f64())),
        (
            "watch lag of Pods in the burst p50 / p99",
            format!("{} / {}", fmt_q(quantile(&pod_before, &pod_after, 0.5)), fmt_q(quantile(&pod_before, &pod_after, 0.99))),
        ),
        (
            "API requests: total, mean / peak per second",
            format!(
                "{requests_total}, {:.1} / {peak_qps:.0} (--kube-api-qps {} --kube-api-burst {})",
                requests_total as f64 / run_s,
                fleet.qps,
                fleet.api_burst
            ),
        ),
        ("requests by verb", requests_by(&after, "verb")),
        ("requests by resource", requests_by(&after, "resource")),
    ];
    println!();
    for (what, value) in rows {
        println!("| {what} | {value} |");
    }
    if exit != Some(0) {
        // The log's directory goes with the test: its end is what says why.
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = &lines[lines.len().saturating_sub(40)..];
        panic!("the controller did not stop cleanly on SIGTERM (exit {exit:?}); the end of its log:\n{}", tail.join("\n"));
    }
}

/// A histogram's buckets for one `kind`.
fn kind_buckets(text: &str, series: &str, kind: &str) -> Vec<(f64, f64)> {
    let only: String = text.lines().filter(|l| l.contains(&format!("kind=\"{kind}\""))).map(|l| format!("{l}\n")).collect();
    buckets(&only, series)
}

/// `ironclaim_api_requests_total` summed by one label (`verb` or
/// `resource`), most first.
fn requests_by(text: &str, label: &str) -> String {
    let mut sums: std::collections::BTreeMap<String, f64> = std::collections::BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with("ironclaim_api_requests_total{")) {
        let Some(value) = l.split(&format!("{label}=\"")).nth(1).and_then(|v| v.split('"').next()) else { continue };
        let n: f64 = l.rsplit_once(' ').and_then(|(_, n)| n.parse().ok()).unwrap_or(0.0);
        *sums.entry(value.to_string()).or_default() += n;
    }
    let mut sums: Vec<(String, f64)> = sums.into_iter().collect();
    sums.sort_by(|a, b| b.1.total_cmp(&a.1));
    sums.iter().map(|(v, n)| format!("{v} {n}")).collect::<Vec<_>>().join(", ")
}

/// A small fleet, in the default suite: the same run and checks as the
/// 5,000-node one, with the API rate low enough to bind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_at_fleet_scale() {
    run(Fleet { on: 40, off: 10, plain: 10, pods_per_node: 30, qps: 20, api_burst: 40 }).await;
}

/// The fleet of the issue: 5,000 nodes, 150,000 pods, 5,000 Servers and a
/// burst of 5,000 pods (`IRONCLAIM_SCALE_*` change it). Run by
/// `hack/scale-test`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "about 20 minutes on two cores: run hack/scale-test"]
async fn the_controller_at_fleet_scale_full() {
    run(Fleet::from_env()).await;
}
