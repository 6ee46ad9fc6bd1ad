//! `hack/demo`: ironclaim on a real control plane, with a rack of 20
//! emulated servers and no hardware. It starts the control plane of
//! `hack/testenv` and sushy-tools, discovers the rack with `ironclaim
//! servers discover`, installs ironclaim from the Helm chart's rendered
//! manifests, runs the controller under the chart's ServiceAccount, plays
//! the machines (a system powered on joins as a kwok Node after its boot
//! delay) and runs a workload that bursts and goes quiet, telling what
//! happens and where to look.
//!
//! With `--check` it runs one burst, waits until every pod is bound, prints
//! the times and exits: 0 when every pod was bound in time, 1 otherwise.

mod rack;
mod workload;

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Parser;
use ironclaim_testenv::TestEnv;
use ironclaim_testenv::sushy::{Sushy, SystemPower};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::rack::RackEvent;

/// The namespace of the release, the BMC Secret and the controller's Lease.
const SYSTEM_NAMESPACE: &str = "ironclaim-system";
const RELEASE: &str = "ironclaim";
const BMC_USER: &str = "admin";
const BMC_SECRET: &str = "bmc-credentials";
/// The field manager of what the demo applies as the operator.
const FIELD_MANAGER: &str = "ironclaim-demo";

#[derive(Parser)]
#[command(about = "ironclaim on a real control plane with an emulated rack of 20 servers")]
struct Args {
    /// The ironclaim binary to run.
    #[arg(long, value_name = "PATH")]
    ironclaim: PathBuf,
    /// The Helm chart to install from.
    #[arg(long, value_name = "DIR", default_value = "deploy/helm/ironclaim")]
    chart: PathBuf,
    /// Where kubectl and the control plane's binaries are, to tell the user.
    #[arg(long, value_name = "DIR")]
    bin_dir: Option<PathBuf>,
    /// Seconds since the epoch when the demo was asked for (hack/demo's
    /// start, its builds included); defaults to now.
    #[arg(long, value_name = "SECONDS")]
    started_at: Option<f64>,
    /// How long each burst of work lasts.
    #[arg(long, value_name = "SECONDS", default_value_t = 240)]
    burst: u64,
    /// How long the quiet between bursts lasts.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    quiet: u64,
    /// One burst; exit once every pod is bound (0) or after --timeout (1).
    #[arg(long)]
    check: bool,
    /// With --check: how long the pods of the burst may take to be bound.
    #[arg(long, value_name = "SECONDS", default_value_t = 300)]
    timeout: u64,
    /// Save a screenshot of the controller's dashboard (/ui) here once,
    /// mid-burst (some pods bound, not all), with headless Chromium
    /// (`$IRONCLAIM_CHROMIUM`, else chromium-headless-shell on PATH;
    /// `hack/testenv browser` installs it).
    #[arg(long, value_name = "PNG")]
    screenshot: Option<PathBuf>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args = Args::parse();
    match run(args).await {
        Ok(()) => {}
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::exit(1);
        }
    }
}

/// The clock the demo tells times by: since hack/demo started.
struct Clock {
    asked: SystemTime,
    here: Instant,
}

impl Clock {
    fn new(started_at: Option<f64>) -> Clock {
        let now = SystemTime::now();
        let asked = started_at.and_then(|s| Duration::try_from_secs_f64(s).ok()).map(|d| UNIX_EPOCH + d).filter(|t| *t <= now).unwrap_or(now);
        Clock { asked, here: Instant::now() }
    }
    fn since_asked(&self) -> Duration {
        SystemTime::now().duration_since(self.asked).unwrap_or(self.here.elapsed())
    }
    fn stamp(&self) -> String {
        format!("[{:>6}]", short(self.since_asked()))
    }
}

fn short(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 60 { format!("{}m{:02}s", s / 60, s % 60) } else { format!("{:.1}s", d.as_secs_f64()) }
}

fn step(clock: &Clock, what: &str) {
    println!("\n{} ==> {what}", clock.stamp());
}

async fn run(args: Args) -> Result<()> {
    let clock = Clock::new(args.started_at);
    let mut work = WorkDir::create()?;

    step(&clock, "control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (hack/testenv)");
    let env = tokio::task::spawn_blocking(TestEnv::shared).await?.context("start the control plane")?;
    let admin = env.client().await.context("connect to the control plane")?;
    println!("{} up; admin kubeconfig {}", clock.stamp(), env.kubeconfig().display());

    step(&clock, "the rack: 20 Redfish systems on sushy-tools, all powered off");
    let machines = rack::machines();
    let password = format!("demo-{}", std::process::id());
    let sushy = tokio::task::spawn_blocking({
        let systems: Vec<(String, SystemPower)> = machines.iter().map(|m| (m.uuid.clone(), SystemPower::Off)).collect();
        let password = password.clone();
        move || Sushy::builder().systems(systems).basic_auth(BMC_USER, &password).start()
    })
    .await?
    .context("start the Redfish emulator")?;
    for class in &rack::CLASSES {
        let gpus = class.gpus.map(|(m, n)| format!(", {n}x {m}")).unwrap_or_default();
        println!(
            "  {:>2} x {:<8} {:>3} cpu, {:>4} GiB{gpus}; {} W idle, {} W peak; boots in {} s",
            class.count,
            class.name,
            class.cpu,
            class.memory_gi,
            class.idle_watts,
            class.peak_watts,
            class.boot.as_secs()
        );
    }
    println!("{} BMC at {} (user {BMC_USER})", clock.stamp(), sushy.endpoint());

    step(&clock, "install ironclaim from the chart's rendered manifests (helm template)");
    let installed = install(&env, &args.chart)?;
    println!("{} applied {}", clock.stamp(), installed.join(", "));
    let password_file = work.join("bmc-password");
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&password_file)
            .context("create the BMC password file")?;
        file.write_all(password.as_bytes()).context("write the BMC password file")?;
    }
    env.kubectl([
        "-n",
        SYSTEM_NAMESPACE,
        "create",
        "secret",
        "generic",
        BMC_SECRET,
        &format!("--from-literal=username={BMC_USER}"),
        &format!("--from-file=password={}", password_file.display()),
    ])
    .context("create the BMC credentials Secret")?;

    step(&clock, &format!("discover the rack: ironclaim servers discover {}", sushy.endpoint()));
    let discovered = discover(&args.ironclaim, &sushy.endpoint(), &password_file, &work)?;
    let servers: Api<DynamicObject> = Api::all_with(admin.clone(), &rack::server_resource());
    for machine in &machines {
        let Some(mut manifest) =
            discovered.iter().find(|m| m["metadata"]["annotations"]["ironclaim.dev/system-uuid"] == machine.uuid.as_str()).cloned()
        else {
            bail!("discovery found no system with UUID {} (log: {})", machine.uuid, work.join("discover.log").display());
        };
        machine.complete(&mut manifest);
        servers
            .patch(&machine.name, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&manifest))
            .await
            .with_context(|| format!("apply Server {}", machine.name))?;
    }
    println!(
        "{} {} Servers: identity, NICs and rack place as read from the BMCs; cpu, memory, GPUs, watts and boot times from the rack plan, since the emulator's systems report none",
        clock.stamp(),
        machines.len()
    );
    apply_all(&admin, &workload::pools()).await?;
    println!("{} ServerPools: general (classes general and large, one warm spare), gpu", clock.stamp());

    step(&clock, "the controller, under the chart's ServiceAccount (no kubelet runs containers here: the Deployment's pod is this process)");
    let (mut controller, metrics) = start_controller(&env, &args, &installed_args(&args.chart)?, &work)?;
    println!("{} running; log {}, metrics http://{metrics}/metrics", clock.stamp(), work.join("controller.log").display());

    let (tx, mut rack_events) = mpsc::unbounded_channel();
    let player = rack::play(admin.clone(), &sushy.endpoint(), BMC_USER, &password, tx)?;
    workload::create(&admin).await?;
    where_to_look(&env, &args, &metrics);

    let result = tokio::select! {
        result = drive(&admin, &clock, &args, &mut rack_events, &mut controller, &metrics) => result,
        _ = tokio::signal::ctrl_c() => {
            println!("\n{} interrupted", clock.stamp());
            Ok(())
        }
    };
    player.abort();
    let _ = controller.kill();
    let _ = controller.wait();
    drop(sushy);
    if result.is_err() {
        eprintln!("the controller's log: {}", work.join("controller.log").display());
    } else {
        work.done = true;
    }
    println!("{} stopping the control plane and the emulator", clock.stamp());
    drop(env);
    result
}

/// The demo's files: the BMC password, the controller's kubeconfig and the
/// logs. The password and the kubeconfig go with the run, whichever way it
/// ends; the logs stay when it failed, for the message that names them.
struct WorkDir {
    path: PathBuf,
    done: bool,
}

impl WorkDir {
    fn create() -> Result<Self> {
        let path = std::env::temp_dir().join(format!("ironclaim-demo-{}", std::process::id()));
        std::fs::create_dir_all(&path).with_context(|| format!("create {}", path.display()))?;
        Ok(WorkDir { path, done: false })
    }
}

impl std::ops::Deref for WorkDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.done {
            let _ = std::fs::remove_dir_all(&self.path);
        } else {
            for secret in ["bmc-password", "controller.kubeconfig"] {
                let _ = std::fs::remove_file(self.path.join(secret));
            }
        }
    }
}

/// Applies everything the chart renders except the Deployment, whose pod
/// no kubelet here can run; returns the kinds and names applied.
fn install(env: &TestEnv, chart: &Path) -> Result<Vec<String>> {
    let objects = render(chart)?;
    let namespace = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}});
    env.kubectl_with_stdin(["apply", "--server-side", "-f", "-"], &namespace.to_string()).context("create the release namespace")?;
    let (crds, rest): (Vec<Value>, Vec<Value>) =
        objects.into_iter().filter(|o| o["kind"] != "Deployment").partition(|o| o["kind"] == "CustomResourceDefinition");
    let list = |items: &[Value]| json!({"apiVersion": "v1", "kind": "List", "items": items}).to_string();
    // As helm installs them: the chart's crds/ as they are (their schemas
    // carry `null` in enums, which kubectl refuses in a re-encoded List).
    let crd_dir = chart.join("crds");
    env.kubectl(["apply".as_ref(), "--server-side".as_ref(), "-f".as_ref(), crd_dir.as_os_str()])
        .with_context(|| format!("apply the chart's CRDs ({})", crd_dir.display()))?;
    for crd in &crds {
        let name = crd["metadata"]["name"].as_str().unwrap_or_default();
        env.kubectl(["wait", "--for=condition=Established", &format!("crd/{name}"), "--timeout=60s"])
            .with_context(|| format!("wait for CRD {name}"))?;
    }
    env.kubectl_with_stdin(["apply", "--server-side", "-f", "-"], &list(&rest)).context("apply the chart's objects")?;
    let mut names: Vec<String> = crds
        .iter()
        .chain(&rest)
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?")))
        .collect();
    names.sort();
    Ok(names)
}

/// `helm template` of the chart, with the values of the demo.
fn render(chart: &Path) -> Result<Vec<Value>> {
    let chart = chart.to_string_lossy();
    let text = ironclaim_testenv::helm([
        "template",
        RELEASE,
        chart.as_ref(),
        "--namespace",
        SYSTEM_NAMESPACE,
        "--include-crds",
        "--set",
        "controller.logFormat=text,controller.powerSweepEvery=10s",
    ])
    .context("helm template")?;
    let docs = serde_saphyr::from_multiple::<Value>(&text).context("helm template printed what is not YAML")?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The controller's command line as the chart's Deployment runs it.
fn installed_args(chart: &Path) -> Result<Vec<String>> {
    let objects = render(chart)?;
    let deployment = objects.iter().find(|o| o["kind"] == "Deployment").context("the chart renders no Deployment")?;
    let args = deployment["spec"]["template"]["spec"]["containers"][0]["args"].as_array().context("the Deployment's container has no args")?;
    Ok(args.iter().filter_map(|a| a.as_str().map(String::from)).collect())
}

/// Runs `ironclaim servers discover` and returns the manifests it printed.
fn discover(ironclaim: &Path, endpoint: &str, password_file: &Path, work: &Path) -> Result<Vec<Value>> {
    let log = work.join("discover.log");
    let output = Command::new(ironclaim)
        .args(["servers", "discover", endpoint, "--username", BMC_USER, "--password-file"])
        .arg(password_file)
        .args(["--credentials-secret", &format!("{SYSTEM_NAMESPACE}/{BMC_SECRET}"), "-o", "json"])
        .env("COLUMNS", "200")
        .output()
        .with_context(|| format!("run {}", ironclaim.display()))?;
    std::fs::write(&log, &output.stderr).with_context(|| format!("write {}", log.display()))?;
    // Exit 1 is expected: the emulator reports no CPUs or memory, so every
    // manifest lacks what the CRD requires until the rack plan adds it.
    if output.status.code() != Some(0) && output.status.code() != Some(1) {
        bail!("servers discover failed ({}); its log: {}\n{}", output.status, log.display(), String::from_utf8_lossy(&output.stderr));
    }
    let list: Value =
        serde_json::from_slice(&output.stdout).with_context(|| format!("servers discover printed no JSON List; its log: {}", log.display()))?;
    let items = list["items"].as_array().cloned().unwrap_or_default();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let gaps = |field: &str| stderr.lines().filter(|l| l.contains(field)).count();
    println!(
        "  {} systems read; not reported by the emulator: cpu on {}, memory on {}, GPUs on {}, watts on {} (all powered off); table: {}",
        items.len(),
        gaps("spec.hardware.cpu"),
        gaps("spec.hardware.memory"),
        gaps("spec.hardware.gpus"),
        gaps("spec.power"),
        log.display()
    );
    Ok(items)
}

/// A kubeconfig holding nothing but a token of the chart's ServiceAccount.
fn service_account_kubeconfig(env: &TestEnv, path: &Path) -> Result<()> {
    let token = env.kubectl(["-n", SYSTEM_NAMESPACE, "create", "token", RELEASE, "--duration=24h"]).context("create a ServiceAccount token")?;
    let admin = kube::config::Kubeconfig::read_from(env.kubeconfig()).context("read the admin kubeconfig")?;
    let cluster = admin.clusters.first().and_then(|c| c.cluster.clone()).context("the admin kubeconfig names no cluster")?;
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "demo", "cluster": {"server": cluster.server, "certificate-authority-data": cluster.certificate_authority_data}}],
        "users": [{"name": RELEASE, "user": {"token": token.trim()}}],
        "contexts": [{"name": RELEASE, "context": {"cluster": "demo", "user": RELEASE, "namespace": SYSTEM_NAMESPACE}}],
        "current-context": RELEASE,
    });
    std::fs::write(path, config.to_string()).with_context(|| format!("write {}", path.display()))
}

fn start_controller(env: &TestEnv, args: &Args, chart_args: &[String], work: &Path) -> Result<(Child, String)> {
    let kubeconfig = work.join("controller.kubeconfig");
    service_account_kubeconfig(env, &kubeconfig)?;
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).context("find a free port")?.to_string();
    let chart_args: Vec<String> =
        chart_args.iter().map(|a| if a.starts_with("--metrics-address=") { format!("--metrics-address={metrics}") } else { a.clone() }).collect();
    let log = std::fs::File::create(work.join("controller.log")).context("create the controller's log")?;
    let child = Command::new(&args.ironclaim)
        .args(&chart_args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .env("POD_NAME", "ironclaim-demo-0")
        .env("POD_NAMESPACE", SYSTEM_NAMESPACE)
        .stdin(Stdio::null())
        .stdout(log.try_clone().context("open the controller's log")?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("start {} controller", args.ironclaim.display()))?;
    Ok((child, metrics))
}

async fn apply_all(client: &Client, objects: &[Value]) -> Result<()> {
    for object in objects {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let kind = object["kind"].as_str().unwrap_or_default();
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        let plural = format!("{}s", kind.to_lowercase());
        let resource = kube::discovery::ApiResource::from_gvk_with_plural(&gvk, &plural);
        let api: Api<DynamicObject> = match object["metadata"]["namespace"].as_str() {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(object)).await.with_context(|| format!("apply {kind} {name}"))?;
    }
    Ok(())
}

fn where_to_look(env: &TestEnv, args: &Args, metrics: &str) {
    println!("\nWhere to look, in another shell:");
    println!("  export KUBECONFIG={}", env.kubeconfig().display());
    if let Some(dir) = &args.bin_dir {
        println!("  export PATH={}:$PATH", dir.display());
    }
    println!("  kubectl get servers,serverclaims -w");
    println!("  kubectl get pods -n {} -o wide", workload::NAMESPACE);
    println!("  {} servers", args.ironclaim.display());
    println!("  {} explain pod {}/<pod>", args.ironclaim.display(), workload::NAMESPACE);
    println!("  curl -s http://{metrics}/metrics | grep '^ironclaim_'");
    println!("  the rack, live: http://{metrics}/ui");
    println!("Ctrl-C stops everything.");
    let _ = std::io::stdout().flush();
}

/// Bursts and quiets, telling what happens, until interrupted (or, with
/// `--check`, until the first burst is bound).
async fn drive(
    client: &Client,
    clock: &Clock,
    args: &Args,
    events: &mut mpsc::UnboundedReceiver<RackEvent>,
    controller: &mut Child,
    metrics: &str,
) -> Result<()> {
    let mut round = 0;
    let mut screenshot = args.screenshot.clone();
    loop {
        round += 1;
        step(clock, &format!("burst {round}: {}", workload::describe()));
        workload::scale(client, true).await?;
        let started = Instant::now();
        let deadline = if args.check { Duration::from_secs(args.timeout) } else { Duration::from_secs(args.burst) };
        let mut first_bound: Option<Duration> = None;
        let mut first_bound_since_asked: Option<Duration> = None;
        let mut all_bound: Option<Duration> = None;
        let mut last = String::new();
        while started.elapsed() < deadline {
            tell_rack(clock, events);
            if let Some(status) = controller.try_wait()? {
                bail!("the controller exited ({status})");
            }
            let state = workload::state(client).await?;
            if first_bound.is_none() && state.bound > 0 {
                let after = started.elapsed();
                first_bound = Some(after);
                first_bound_since_asked = Some(clock.since_asked());
                println!("{} first pod bound, {} after the burst began", clock.stamp(), short(after));
            }
            if state.bound > 0
                && state.bound < state.total
                && let Some(path) = screenshot.take()
            {
                match dashboard_screenshot(metrics, &path).await {
                    Ok(()) => println!("{} the dashboard mid-burst: {}", clock.stamp(), path.display()),
                    Err(err) => eprintln!("{} no screenshot of the dashboard: {err:#}", clock.stamp()),
                }
            }
            if all_bound.is_none() && state.bound == state.total && state.total > 0 {
                all_bound = Some(started.elapsed());
                println!("{} all {} pods bound, {} after the burst began", clock.stamp(), state.total, short(started.elapsed()));
                if args.check {
                    break;
                }
            }
            let servers = servers_summary(client).await.unwrap_or_default();
            let line = format!("pods bound {}/{}; {servers}", state.bound, state.total);
            if line != last {
                println!("{} {line}", clock.stamp());
                last = line;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        if args.check {
            tell_rack(clock, events);
            let (Some(first), Some(first_since_asked), Some(all)) = (first_bound, first_bound_since_asked, all_bound) else {
                let state = workload::state(client).await?;
                bail!("{} pods of {} still unbound after {} s", state.unbound(), state.total, args.timeout);
            };
            println!(
                "\ncheck passed: the first pod was bound {} after the burst began, {} after hack/demo started; all {} after {}",
                short(first),
                short(first_since_asked),
                workload::state(client).await?.total,
                short(all)
            );
            return Ok(());
        }
        step(clock, &format!("quiet for {} s: the workload scales to zero; idle servers are drained and powered off", args.quiet));
        workload::scale(client, false).await?;
        let quiet = Instant::now();
        let mut last = String::new();
        while quiet.elapsed() < Duration::from_secs(args.quiet) {
            tell_rack(clock, events);
            if let Some(status) = controller.try_wait()? {
                bail!("the controller exited ({status})");
            }
            let line = servers_summary(client).await.unwrap_or_default();
            if line != last {
                println!("{} {line}", clock.stamp());
                last = line;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// A screenshot of the controller's `/ui` at `metrics`, saved at `path`.
async fn dashboard_screenshot(metrics: &str, path: &Path) -> Result<()> {
    let browser = ironclaim_testenv::chromium_path()?;
    let url = format!("http://{metrics}/ui");
    let target = format!("--screenshot={}", path.display());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(browser)
            .args(["--no-sandbox", "--disable-gpu", "--virtual-time-budget=3000", "--window-size=1400,1300", target.as_str(), url.as_str()])
            .output()
    })
    .await??;
    if !out.status.success() {
        bail!("the browser failed: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or_default());
    }
    Ok(())
}

fn tell_rack(clock: &Clock, events: &mut mpsc::UnboundedReceiver<RackEvent>) {
    while let Ok(event) = events.try_recv() {
        match event {
            RackEvent::PoweredOn { machine } => println!("{} {machine}: the BMC reports On; booting", clock.stamp()),
            RackEvent::Joined { machine, after } => println!("{} {machine}: joined as a Node {} after power-on", clock.stamp(), short(after)),
            RackEvent::PoweredOff { machine } => println!("{} {machine}: the BMC reports Off; its Node is gone", clock.stamp()),
        }
    }
}

/// Servers by power state, and the watts the powered ones idle at.
async fn servers_summary(client: &Client) -> Result<String> {
    let servers: Api<DynamicObject> = Api::all_with(client.clone(), &rack::server_resource());
    let list = servers.list(&Default::default()).await?;
    let mut on = 0;
    let mut powering = 0;
    let mut claimed = 0;
    let mut watts = 0;
    for server in &list {
        let status = &server.data["status"];
        match status["powerState"].as_str() {
            Some("On") => {
                on += 1;
                watts += server.data["spec"]["power"]["idleWatts"].as_u64().unwrap_or(0);
            }
            Some("PoweringOn") | Some("PoweringOff") => powering += 1,
            _ => {}
        }
        if status["claim"].is_string() {
            claimed += 1;
        }
    }
    Ok(format!("servers on {on}/{}, changing {powering}, claimed {claimed}; idle draw of those on {watts} W", list.items.len()))
}
