//! The real kube-scheduler's answer to a scenario, on the test control
//! plane: the scenario's nodes are nodes no kubelet runs, its bound pods
//! are bound by `spec.nodeName`, and each pending pod (or each probe copy
//! of one) is left to kube-scheduler until it binds or is marked
//! unschedulable.
//!
//! # The nodes kube-scheduler sees
//! A node is created as its manifest says, with what the kubelet, the API
//! server and kube-controller-manager would write on it after, written at
//! once: a Ready condition unless the manifest has one; the NoSchedule
//! taint the node lifecycle controller keeps for that condition (none for
//! Ready, `node.kubernetes.io/not-ready` for not) and for a cordon; the TTL
//! controller's annotation. The `node.kubernetes.io/not-ready` taint the
//! API server puts on every new node is lifted from a Ready one as the
//! controller would lift it; the controller then finds nothing to do. kwok's
//! annotation is dropped: kube-scheduler reads no condition and nothing
//! else a kubelet writes, and places pods no kubelet needs to run. One more
//! label, `agree.ironclaim.dev/barrier`, which no scenario selects on,
//! marks the node the barrier pod goes to.
//!
//! # Making sure kube-scheduler has seen the scenario
//! Nodes and pods reach kube-scheduler on separate watches, each in the
//! order the API server wrote them. Once the previous scenario's nodes
//! are deleted and this one's written and seen settled, one node is
//! labelled `agree.ironclaim.dev/barrier=<seed>`, a write after all those,
//! and a barrier pod that only that node with that label can take must
//! bind there: kube-scheduler then has every node as it is. (It may try the
//! barrier pod before the label reaches it; it tries again when it does.)
//! The barrier pod is deleted before the first pending pod is created.
//!
//! Pods arrive on one watch in order, so the bound pods created (and the
//! barrier, the earlier probes and the previous scenario's pods deleted)
//! before a pending pod are known when it is scheduled. The bound pods are
//! created concurrently with each other, and with the nodes when the
//! barrier node has a pod slot for the barrier beside them, else after the
//! barrier; but always before the first pending pod. The previous
//! scenario's objects are deleted by name while this one's are created
//! (pods before nodes, all before the barrier). Probes go one at a time,
//! each deleted before the next is created. An unschedulable answer must
//! also name as many nodes as the scenario has ("0/N nodes are
//! available"), or it is asked again.
//!
//! # When pending pods are settled
//! In a batch, kube-scheduler tries a pod it marked unschedulable again
//! when another binds. The pods are settled once every one has an answer,
//! and then either all are bound, or none moved for 200 ms and
//! kube-scheduler's metrics show it idle (nothing queued, nothing being
//! bound) at the start and at the end of another 200 ms with no attempt in
//! between. Without its metrics (a control plane not started by testenv),
//! once none moved for 1.5 s, longer than its first backoff.

use anyhow::{Context, Result, anyhow, bail, ensure};
use ironclaim_testenv::TestEnv;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::task::JoinSet;

use crate::generate::{NAMESPACES, RUN_LABEL, Scenario};

const BARRIER_NAMESPACE: &str = "agree-barrier";
/// The label the barrier pod asks for; no scenario selects on it.
const BARRIER_LABEL: &str = "agree.ironclaim.dev/barrier";
const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// The annotation kube-controller-manager's TTL controller writes on every
/// node without it ("0" below 100 nodes). Set at creation, it spares the
/// node that write, which races the node lifecycle controller's taint
/// update and delays it by its conflict backoff (100-200 ms).
const TTL_ANNOTATION: (&str, &str) = ("node.alpha.kubernetes.io/ttl", "0");
/// Between two reads of a pod kube-scheduler is deciding.
const POLL: Duration = Duration::from_millis(2);
/// Between two reads of nodes the node lifecycle controller is tainting.
const NODE_POLL: Duration = Duration::from_millis(5);
/// Longer than kube-scheduler takes for one pod on a handful of nodes by
/// orders of magnitude; reaching it is a failure of the environment.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// Without kube-scheduler's metrics: longer than its initial backoff for
/// an unschedulable pod, one second.
const SETTLE: Duration = Duration::from_millis(1500);
/// With them: far longer than a binding takes to reach kube-scheduler's
/// watch. (A pod it is to try again waits for no backoff once nothing
/// else is queued: SchedulerPopFromBackoffQ.)
const QUIET: Duration = Duration::from_millis(200);
/// Between two reads of pending pods kube-scheduler is binding.
const BATCH_POLL: Duration = Duration::from_millis(20);

/// A control plane prepared for scenarios.
pub struct Cluster {
    _env: TestEnv,
    client: kube::Client,
    timings: Timings,
    /// What the last scenario created and did not delete.
    left: Mutex<Left>,
    /// `None` on a control plane not started by testenv.
    metrics: Option<SchedulerMetrics>,
}

/// Objects of a scenario, by name.
#[derive(Clone, Debug, Default)]
struct Left {
    nodes: Vec<String>,
    /// Namespace and name.
    pods: Vec<(String, String)>,
}

/// What kube-scheduler did with one pending pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Bound(String),
    Unschedulable(String),
}

/// Wall-clock time spent in each phase of the scenarios run so far.
#[derive(Debug, Default)]
pub struct Timings(Mutex<BTreeMap<&'static str, Phase>>);

/// One phase's share of [`Timings`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Phase {
    pub count: u64,
    pub total: Duration,
    pub max: Duration,
}

impl Timings {
    fn add(&self, phase: &'static str, since: Instant) {
        let took = since.elapsed();
        let mut all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let p = all.entry(phase).or_default();
        p.count += 1;
        p.total += took;
        p.max = p.max.max(took);
    }

    /// Every phase so far, by name.
    pub fn phases(&self) -> Vec<(&'static str, Phase)> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(k, v)| (*k, *v)).collect()
    }
}

impl Cluster {
    /// Joins (or starts) the process's control plane and creates the
    /// scenarios' namespaces; removes what an interrupted run left.
    pub async fn start() -> Result<Cluster> {
        let env = TestEnv::for_process().context("starting the test control plane (hack/testenv build first)")?;
        let client = env.client().await.context("client")?;
        let metrics = SchedulerMetrics::connect(&env).await.unwrap_or_else(|e| {
            eprintln!("warning: {e:#}: batch scenarios settle by time, {SETTLE:?} after the last binding");
            None
        });
        let cluster = Cluster { _env: env, client, timings: Timings::default(), left: Mutex::default(), metrics };
        let namespaces: Api<k8s::Namespace> = Api::all(cluster.client.clone());
        let mut all: Vec<(&str, &[(&str, &str)])> = NAMESPACES.to_vec();
        all.push((BARRIER_NAMESPACE, &[]));
        for (name, labels) in all {
            let labels: serde_json::Map<String, Value> = labels.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            let ns: k8s::Namespace = serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}}))?;
            match namespaces.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e).with_context(|| format!("create namespace {name}")),
            }
            // The ServiceAccount admission refuses pods until the
            // namespace's default ServiceAccount exists.
            let accounts: Api<k8s::ServiceAccount> = Api::namespaced(cluster.client.clone(), name);
            let start = Instant::now();
            while accounts.get_opt("default").await?.is_none() {
                ensure!(start.elapsed() < ANSWER_TIMEOUT, "namespace {name} has no default ServiceAccount after {ANSWER_TIMEOUT:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        cluster.clear().await?;
        Ok(cluster)
    }

    /// Where the time of the scenarios run so far went.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    fn pods(&self, namespace: &str) -> Api<k8s::Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    fn nodes(&self) -> Api<k8s::Node> {
        Api::all(self.client.clone())
    }

    /// Deletes every object of earlier scenarios (and of interrupted
    /// runs), pods first.
    pub async fn clear(&self) -> Result<()> {
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let mine = ListParams::default().labels(&format!("{RUN_LABEL}=true"));
        let delete = |ns: &'static str, which: ListParams| {
            let (api, now) = (self.pods(ns), now.clone());
            async move { api.delete_collection(&now, &which).await.with_context(|| format!("delete pods in {ns}")) }
        };
        let [a, b, c] = NAMESPACES.map(|(ns, _)| ns);
        tokio::try_join!(
            delete(a, mine.clone()),
            delete(b, mine.clone()),
            delete(c, mine.clone()),
            delete(BARRIER_NAMESPACE, ListParams::default())
        )?;
        self.nodes().delete_collection(&now, &mine).await.context("delete nodes")?;
        *self.left.lock().unwrap_or_else(PoisonError::into_inner) = Left::default();
        Ok(())
    }

    /// Deletes what a scenario left, pods first.
    async fn remove(client: kube::Client, left: Left) -> Result<()> {
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let mut deleting = JoinSet::new();
        for (ns, name) in left.pods {
            let (api, now) = (Api::<k8s::Pod>::namespaced(client.clone(), &ns), now.clone());
            deleting.spawn(async move { gone(api.delete(&name, &now).await).with_context(|| format!("delete pod {ns}/{name}")) });
        }
        join(deleting).await?;
        let mut deleting = JoinSet::new();
        for name in left.nodes {
            let (api, now) = (Api::<k8s::Node>::all(client.clone()), now.clone());
            deleting.spawn(async move { gone(api.delete(&name, &now).await).with_context(|| format!("delete node {name}")) });
        }
        join(deleting).await
    }

    async fn create_pod(&self, pod: &Value) -> Result<()> {
        create_pod(self.client.clone(), pod.clone()).await
    }

    async fn delete_pod(&self, pod: &Value) -> Result<()> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        self.pods(ns).delete(name, &now).await.with_context(|| format!("delete pod {ns}/{name}"))?;
        Ok(())
    }

    /// Creates the scenario's nodes and bound pods, deletes the previous
    /// scenario's, and waits until kube-scheduler knows them all.
    pub async fn set_up(&self, scenario: &Scenario) -> Result<()> {
        // The barrier pod takes a pod slot: on a node with one left beside
        // the bound pods, those can be created with the nodes; else they
        // wait for the barrier to be gone, and on nodes without any slot
        // there is no barrier at all.
        let (barrier, bound_first) = match barrier_node(scenario, true) {
            Some(node) => (Some(node), true),
            None => (barrier_node(scenario, false), false),
        };
        let created = Left { nodes: scenario.node_names(), pods: scenario.bound.iter().map(key).collect() };
        let previous = std::mem::replace(&mut *self.left.lock().unwrap_or_else(PoisonError::into_inner), created.clone());
        // The previous scenario goes while this one comes, unless they
        // share a name (the same scenario again).
        let t = Instant::now();
        let mut creating = JoinSet::new();
        if previous.nodes.iter().any(|n| created.nodes.contains(n)) || previous.pods.iter().any(|p| created.pods.contains(p)) {
            Self::remove(self.client.clone(), previous).await?;
        } else {
            creating.spawn(Self::remove(self.client.clone(), previous));
        }
        for n in &scenario.nodes {
            let mut node: k8s::Node = serde_json::from_value(n.clone()).context("node manifest")?;
            prepare(&mut node);
            creating.spawn(create_node(self.nodes(), node));
        }
        if bound_first {
            for p in &scenario.bound {
                creating.spawn(create_pod(self.client.clone(), p.clone()));
            }
        }
        join(creating).await?;
        self.timings.add(if bound_first { "set_up: swap nodes+bound" } else { "set_up: swap nodes" }, t);

        let t = Instant::now();
        self.settled(scenario).await?;
        self.timings.add("set_up: nodes settled", t);

        let t = Instant::now();
        match &barrier {
            Some(node) => self.barrier(scenario, node).await?,
            // Nothing can bind: every answer is unschedulable, and its node
            // count guards it.
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
        self.timings.add("set_up: barrier", t);

        if !bound_first {
            let t = Instant::now();
            let mut creating = JoinSet::new();
            for p in &scenario.bound {
                creating.spawn(create_pod(self.client.clone(), p.clone()));
            }
            join(creating).await?;
            self.timings.add("set_up: create bound", t);
        }
        Ok(())
    }

    /// Waits until the API server shows exactly the scenario's nodes,
    /// tainted as the node lifecycle controller taints them for good.
    async fn settled(&self, scenario: &Scenario) -> Result<()> {
        let names: BTreeSet<String> = scenario.node_names().into_iter().collect();
        let mine = ListParams::default().labels(&format!("{RUN_LABEL}=true"));
        let start = Instant::now();
        loop {
            let list = self.nodes().list(&mine).await.context("list nodes")?;
            let settled = list.items.iter().filter(|n| names.contains(n.metadata.name.as_deref().unwrap_or_default()) && is_settled(n)).count();
            if settled == names.len() && list.items.len() == names.len() {
                return Ok(());
            }
            ensure!(
                start.elapsed() < ANSWER_TIMEOUT,
                "scenario {}: only {settled} of {} nodes tainted as their Ready condition and cordon say after {ANSWER_TIMEOUT:?}",
                scenario.seed,
                names.len()
            );
            tokio::time::sleep(NODE_POLL).await;
        }
    }

    /// Labels `node`, then binds a pod that only `node` with that label can
    /// take, then deletes it.
    async fn barrier(&self, scenario: &Scenario, node: &str) -> Result<()> {
        let seed = scenario.seed.to_string();
        let label = json!({"metadata": {"labels": {BARRIER_LABEL: seed}}});
        self.nodes().patch(node, &PatchParams::default(), &Patch::Merge(&label)).await.with_context(|| format!("label node {node}"))?;
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("barrier-{}", scenario.seed), "namespace": BARRIER_NAMESPACE},
            "spec": {
                "containers": [{"name": "c", "image": "registry.invalid/barrier"}],
                "tolerations": [{"operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{
                    "matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}],
                    "matchExpressions": [{"key": BARRIER_LABEL, "operator": "In", "values": [seed]}],
                }]}}}
            }
        });
        self.create_pod(&pod).await?;
        // kube-scheduler may try the pod before the label reaches it, and
        // then again when it does.
        let verdict = self.verdict(&pod, true).await;
        self.delete_pod(&pod).await?;
        match verdict? {
            Verdict::Bound(on) if on == node => Ok(()),
            other => bail!("scenario {}: the barrier pod for {node} ended {other:?}", scenario.seed),
        }
    }

    /// Waits for kube-scheduler to bind `pod` or, unless `bind` says to wait
    /// for a binding, mark it unschedulable.
    async fn verdict(&self, pod: &Value, bind: bool) -> Result<Verdict> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let api = self.pods(ns);
        let start = Instant::now();
        let mut early = false;
        loop {
            let t = Instant::now();
            let p = api.get(name).await.with_context(|| format!("get pod {ns}/{name}"))?;
            self.timings.add("verdict: read", t);
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                return Ok(Verdict::Bound(node));
            }
            let scheduled = p.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
            if let Some(c) = scheduled
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
            {
                let message = c.message.clone().unwrap_or_default();
                if !bind {
                    return Ok(Verdict::Unschedulable(message));
                }
                if !early {
                    early = true;
                    self.timings.add("barrier: tried before its label came", Instant::now());
                }
                ensure!(start.elapsed() < ANSWER_TIMEOUT, "pod {ns}/{name}: still unschedulable after {ANSWER_TIMEOUT:?}: {message}");
            }
            ensure!(start.elapsed() < ANSWER_TIMEOUT, "pod {ns}/{name}: kube-scheduler gave no answer in {ANSWER_TIMEOUT:?}");
            tokio::time::sleep(POLL).await;
        }
    }

    /// The nodes kube-scheduler binds pending pod `pod` to, one probe per
    /// node, each deleted before the next is created.
    pub async fn feasible(&self, scenario: &Scenario, pod: usize) -> Result<BTreeSet<String>> {
        let mut out = BTreeSet::new();
        let nodes = scenario.node_names();
        for node in &nodes {
            let probe = scenario.probe(pod, node);
            let mut attempt = 0;
            let verdict = loop {
                attempt += 1;
                let t = Instant::now();
                self.create_pod(&probe).await?;
                self.timings.add("probe: create", t);
                let t = Instant::now();
                let verdict = self.verdict(&probe, false).await;
                self.timings.add(
                    match verdict {
                        Ok(Verdict::Bound(_)) => "probe: verdict (bound)",
                        _ => "probe: verdict (unschedulable)",
                    },
                    t,
                );
                let t = Instant::now();
                self.delete_pod(&probe).await?;
                self.timings.add("probe: delete", t);
                match verdict? {
                    Verdict::Unschedulable(message) if nodes_counted(&message) != Some(nodes.len()) => {
                        ensure!(
                            attempt < 3,
                            "probe for {node}: kube-scheduler kept counting other nodes than the scenario's {}: {message}",
                            nodes.len()
                        );
                        self.timings.add("probe: asked again", Instant::now());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    v => break v,
                }
            };
            match verdict {
                Verdict::Bound(on) => {
                    ensure!(on == *node, "probe for {node} bound to {on}");
                    out.insert(on);
                }
                Verdict::Unschedulable(_) => {}
            }
        }
        Ok(out)
    }

    /// Creates every pending pod at once and waits until kube-scheduler
    /// stops binding them; returns where each pending pod went (`None`:
    /// unschedulable), in the scenario's order.
    pub async fn bind_all(&self, scenario: &Scenario) -> Result<Vec<Option<String>>> {
        let t = Instant::now();
        self.left.lock().unwrap_or_else(PoisonError::into_inner).pods.extend(scenario.pending.iter().map(key));
        for p in &scenario.pending {
            self.create_pod(p).await?;
        }
        self.timings.add("batch: create pending", t);
        let t = Instant::now();
        let mut last_change = Instant::now();
        let mut last: Vec<Option<String>> = Vec::new();
        // When kube-scheduler was last seen idle since the last move, and
        // its metrics then.
        let mut idle_since: Option<(Instant, Queue)> = None;
        loop {
            let (now, answered) = self.placements(scenario).await?;
            if now != last {
                last = now;
                last_change = Instant::now();
                idle_since = None;
            }
            // Every pod answered, and either all bound or nothing will move:
            // a pod marked unschedulable is tried again when another binds.
            if answered {
                if last.iter().all(Option::is_some) {
                    self.timings.add("batch: wait (all bound)", t);
                    return Ok(last);
                }
                match &self.metrics {
                    None if last_change.elapsed() > SETTLE => {
                        self.timings.add("batch: wait (settled, by time)", t);
                        return Ok(last);
                    }
                    None => {}
                    Some(metrics) if last_change.elapsed() >= QUIET => match idle_since {
                        None => {
                            let queue = metrics.read().await?;
                            idle_since = queue.idle().then(|| (Instant::now(), queue));
                        }
                        Some((since, before)) if since.elapsed() >= QUIET => {
                            let queue = metrics.read().await?;
                            if queue.idle() && queue.attempts == before.attempts {
                                self.timings.add("batch: wait (settled, scheduler idle)", t);
                                return Ok(last);
                            }
                            idle_since = queue.idle().then(|| (Instant::now(), queue));
                        }
                        Some(_) => {}
                    },
                    Some(_) => {}
                }
            }
            ensure!(last_change.elapsed() < ANSWER_TIMEOUT, "scenario {}: pending pods unanswered after {ANSWER_TIMEOUT:?}", scenario.seed);
            tokio::time::sleep(BATCH_POLL).await;
        }
    }

    /// Where each pending pod is bound, and whether every one has an
    /// answer (bound, or marked unschedulable).
    async fn placements(&self, scenario: &Scenario) -> Result<(Vec<Option<String>>, bool)> {
        let mut namespaces: Vec<&str> = scenario.pending.iter().map(|p| p["metadata"]["namespace"].as_str().unwrap_or("default")).collect();
        namespaces.sort_unstable();
        namespaces.dedup();
        let mut pods = BTreeMap::new();
        for ns in namespaces {
            for p in self.pods(ns).list(&ListParams::default()).await.with_context(|| format!("list pods in {ns}"))? {
                pods.insert((ns.to_string(), p.metadata.name.clone().unwrap_or_default()), p);
            }
        }
        let mut answered = true;
        let mut out = Vec::new();
        for p in &scenario.pending {
            let (ns, name) = key(p);
            let got = pods.get(&(ns.clone(), name.clone())).ok_or_else(|| anyhow!("pending pod {ns}/{name} is gone"))?;
            let node = got.spec.as_ref().and_then(|s| s.node_name.clone());
            let unschedulable = got
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False"));
            answered &= node.is_some() || unschedulable;
            out.push(node);
        }
        Ok((out, answered))
    }
}

/// kube-scheduler's metrics endpoint, on the port testenv's state dir
/// names beside the kubeconfig.
struct SchedulerMetrics {
    client: kube::Client,
}

/// What kube-scheduler's metrics say about its queue.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Queue {
    /// Pods waiting to be tried, now or after their backoff.
    waiting: f64,
    /// Bindings under way.
    binding: f64,
    /// Scheduling attempts so far, whatever their result.
    attempts: f64,
}

impl SchedulerMetrics {
    /// `None` when the control plane was not started by testenv (no ports
    /// file beside its kubeconfig).
    async fn connect(env: &TestEnv) -> Result<Option<SchedulerMetrics>> {
        let Some(ports) = env.kubeconfig().parent().and_then(|dir| std::fs::read_to_string(dir.join("ports")).ok()) else { return Ok(None) };
        let port: u16 = ports
            .lines()
            .find_map(|l| l.strip_prefix("SCHEDULER_PORT="))
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| anyhow!("no SCHEDULER_PORT in testenv's ports file"))?;
        let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig()).context("read the kubeconfig")?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default()).await.context("kubeconfig")?;
        config.cluster_url = format!("https://127.0.0.1:{port}").parse().context("kube-scheduler's address")?;
        // kube-scheduler serves a self-signed certificate; the client
        // certificate is the admin's, as for the API server.
        config.accept_invalid_certs = true;
        config.default_retry = false;
        let metrics = SchedulerMetrics { client: kube::Client::try_from(config).context("client for kube-scheduler")? };
        // A kube-scheduler just started answers 403 until it has read the
        // client CA from the API server; give it a few seconds.
        let mut tries = 0;
        loop {
            match metrics.read().await {
                Ok(_) => return Ok(Some(metrics)),
                Err(_) if tries < 40 => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn read(&self) -> Result<Queue> {
        let request = kube::core::Request::new("/metrics").list(&ListParams::default()).context("metrics request")?;
        Queue::parse(&self.client.request_text(request).await.context("read kube-scheduler's metrics")?)
    }
}

impl Queue {
    fn idle(&self) -> bool {
        self.waiting == 0.0 && self.binding == 0.0
    }

    /// From kube-scheduler's metrics, in Prometheus' text format.
    fn parse(metrics: &str) -> Result<Queue> {
        // The counters of attempts and bindings appear with the first.
        let (mut active, mut backoff, mut binding, mut attempts) = (None, None, 0.0, 0.0);
        for line in metrics.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            match name {
                "scheduler_pending_pods{queue=\"active\"}" => active = Some(value),
                "scheduler_pending_pods{queue=\"backoff\"}" => backoff = Some(value),
                "scheduler_goroutines{operation=\"binding\"}" => binding += value,
                _ if name.starts_with("scheduler_schedule_attempts_total{") => attempts += value,
                _ => {}
            }
        }
        let (Some(active), Some(backoff)) = (active, backoff) else { bail!("kube-scheduler's metrics lack its active and backoff queues") };
        Ok(Queue { waiting: active + backoff, binding, attempts })
    }
}

async fn create_pod(client: kube::Client, pod: Value) -> Result<()> {
    let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
    let typed: k8s::Pod = serde_json::from_value(pod).context("pod manifest")?;
    Api::<k8s::Pod>::namespaced(client, &ns)
        .create(&PostParams::default(), &typed)
        .await
        .with_context(|| format!("create pod {ns}/{}", typed.metadata.name.unwrap_or_default()))?;
    Ok(())
}

/// Creates `node`, then lifts the taints the API server put on it for a
/// node not ready yet where the node lifecycle controller lifts them (it
/// then finds nothing to do).
async fn create_node(api: Api<k8s::Node>, node: k8s::Node) -> Result<()> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let want = condition_taint(&node);
    let mut node = api.create(&PostParams::default(), &node).await.with_context(|| format!("create node {name}"))?;
    let mut attempt = 0;
    loop {
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        let unwanted = |t: &k8s::Taint| is_condition_taint(t) && Some(t.key.as_str()) != want;
        if !taints.iter().any(unwanted) {
            return Ok(());
        }
        let keep: Vec<&k8s::Taint> = taints.iter().filter(|t| !unwanted(t)).collect();
        // Only over the version read: a taint written since is not undone.
        let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version}, "spec": {"taints": keep}});
        match api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < 5 => {
                attempt += 1;
                node = api.get(&name).await.with_context(|| format!("get node {name}"))?;
            }
            Err(e) => return Err(e).with_context(|| format!("untaint node {name}")),
        }
    }
}

/// A NoSchedule taint the node lifecycle controller keeps as the Ready
/// condition says.
fn is_condition_taint(taint: &k8s::Taint) -> bool {
    (taint.key == NOT_READY_TAINT || taint.key == UNREACHABLE_TAINT) && taint.effect == "NoSchedule"
}

/// The NoSchedule taint the node lifecycle controller keeps on `node`:
/// none when Ready, `not-ready` when not, `unreachable` when unknown.
fn condition_taint(node: &k8s::Node) -> Option<&'static str> {
    let ready = node.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready.map(|c| c.status.as_str()) {
        Some("False") => Some(NOT_READY_TAINT),
        Some("Unknown") => Some(UNREACHABLE_TAINT),
        _ => None,
    }
}

/// Namespace and name of a pod manifest.
fn key(pod: &Value) -> (String, String) {
    let field = |f: &str| pod["metadata"][f].as_str().unwrap_or_default().to_string();
    (field("namespace"), field("name"))
}

/// Deleted, or not there to delete.
fn gone<T>(deleted: kube::Result<T>) -> kube::Result<()> {
    match deleted {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Waits for every task; the first error, if any.
async fn join(mut tasks: JoinSet<Result<()>>) -> Result<()> {
    while let Some(done) = tasks.join_next().await {
        done.context("task")??;
    }
    Ok(())
}

/// A scenario node as it is created: Ready unless its manifest says
/// otherwise, with the taints the node lifecycle controller would add for
/// its Ready condition and its cordon, with the TTL controller's
/// annotation, and without kwok's.
fn prepare(node: &mut k8s::Node) {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions = node.status.get_or_insert_default().conditions.get_or_insert_default();
    if !conditions.iter().any(|c| c.type_ == "Ready") {
        conditions.push(k8s::NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            message: Some("created Ready by the agreement check".into()),
            last_heartbeat_time: Some(now.clone()),
            last_transition_time: Some(now.clone()),
        });
    }
    let condition = condition_taint(node);
    let spec = node.spec.get_or_insert_default();
    let cordon = (spec.unschedulable == Some(true)).then_some(UNSCHEDULABLE_TAINT);
    let taints = spec.taints.get_or_insert_default();
    for key in [condition, cordon].into_iter().flatten() {
        if !taints.iter().any(|t| t.key == key && t.effect == "NoSchedule") {
            taints.push(k8s::Taint { key: key.into(), effect: "NoSchedule".into(), time_added: Some(now.clone()), value: None });
        }
    }
    let annotations = node.metadata.annotations.get_or_insert_default();
    annotations.entry(TTL_ANNOTATION.0.into()).or_insert_with(|| TTL_ANNOTATION.1.into());
    annotations.remove(ironclaim_testenv::FAKE_NODE_ANNOTATION.0);
}

/// Tainted as the node lifecycle controller taints it for good: for its
/// Ready condition, and for its cordon.
fn is_settled(node: &k8s::Node) -> bool {
    let taints = node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default();
    let cordoned = node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let mut condition: Vec<&str> = taints.iter().filter(|t| is_condition_taint(t)).map(|t| t.key.as_str()).collect();
    condition.dedup();
    condition == Vec::from_iter(condition_taint(node)) && taints.iter().any(|t| t.key == UNSCHEDULABLE_TAINT) == cordoned
}

/// The last node with a pod slot for the barrier pod: beside the bound
/// pods when `beside_bound`, else on an empty node.
fn barrier_node(scenario: &Scenario, beside_bound: bool) -> Option<String> {
    scenario.nodes.iter().rev().find_map(|n| {
        let name = n["metadata"]["name"].as_str()?;
        let used = if beside_bound { scenario.bound.iter().filter(|p| p["spec"]["nodeName"].as_str() == Some(name)).count() } else { 0 };
        (pod_slots(n) > used as i64).then(|| name.to_string())
    })
}

fn pod_slots(node: &Value) -> i64 {
    // None reported, none free, as NodeResourcesFit counts them.
    node["status"]["allocatable"]["pods"].as_str().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// N in kube-scheduler's "0/N nodes are available: ...".
fn nodes_counted(message: &str) -> Option<usize> {
    let rest = message.strip_prefix("0/")?;
    rest.split_once(' ')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(manifest: Value) -> k8s::Node {
        serde_json::from_value(manifest).expect("node manifest")
    }

    fn taint_keys(node: &k8s::Node) -> Vec<&str> {
        node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default().iter().map(|t| t.key.as_str()).collect()
    }

    #[test]
    fn reads_the_node_count_of_an_unschedulable_message() {
        assert_eq!(super::nodes_counted("0/5 nodes are available: 5 Insufficient cpu."), Some(5));
        assert_eq!(super::nodes_counted("no nodes"), None);
    }

    #[test]
    fn a_node_is_created_as_the_controllers_would_leave_it() {
        let mut n = node(json!({
            "metadata": {"name": "n", "annotations": {"kwok.x-k8s.io/node": "fake"}},
            "spec": {"taints": [{"key": "dedicated", "value": "web", "effect": "NoSchedule"}], "unschedulable": true},
        }));
        prepare(&mut n);
        assert_eq!(condition_taint(&n), None, "Ready");
        assert_eq!(taint_keys(&n), ["dedicated", UNSCHEDULABLE_TAINT]);
        let annotations = n.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.get(TTL_ANNOTATION.0).map(String::as_str), Some(TTL_ANNOTATION.1));
        assert!(!annotations.contains_key(ironclaim_testenv::FAKE_NODE_ANNOTATION.0));
        assert!(is_settled(&n));

        // As the API server returns it: with the taint of a new node.
        n.spec.as_mut().and_then(|s| s.taints.as_mut()).expect("taints").push(k8s::Taint {
            key: NOT_READY_TAINT.into(),
            effect: "NoSchedule".into(),
            ..k8s::Taint::default()
        });
        assert!(!is_settled(&n));
    }

    #[test]
    fn a_node_not_ready_keeps_its_taint() {
        let mut n = node(json!({
            "metadata": {"name": "n"},
            "status": {"conditions": [{"type": "Ready", "status": "False"}]},
        }));
        prepare(&mut n);
        assert_eq!(condition_taint(&n), Some(NOT_READY_TAINT));
        assert_eq!(taint_keys(&n), [NOT_READY_TAINT]);
        assert!(is_settled(&n));
    }

    #[test]
    fn a_cordoned_node_is_settled_with_its_taint_only() {
        let cordoned =
            json!({"metadata": {"name": "n"}, "spec": {"unschedulable": true}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        assert!(!is_settled(&node(cordoned.clone())));
        let mut n = node(cordoned);
        prepare(&mut n);
        assert!(is_settled(&n));
    }

    #[test]
    fn reads_kube_schedulers_queue_from_its_metrics() {
        // Before the first attempt, the counters are not there yet.
        let fresh = "# TYPE scheduler_pending_pods gauge\nscheduler_pending_pods{queue=\"active\"} 0\nscheduler_pending_pods{queue=\"backoff\"} 0\nscheduler_pending_pods{queue=\"unschedulable\"} 0\n";
        let queue = Queue::parse(fresh).expect("fresh");
        assert!(queue.idle());
        assert_eq!(queue.attempts, 0.0);
        let busy = "scheduler_goroutines{operation=\"binding\"} 1\nscheduler_pending_pods{queue=\"active\"} 0\nscheduler_pending_pods{queue=\"backoff\"} 2\nscheduler_pending_pods{queue=\"unschedulable\"} 3\nscheduler_schedule_attempts_total{profile=\"default-scheduler\",result=\"scheduled\"} 1204\nscheduler_schedule_attempts_total{profile=\"default-scheduler\",result=\"unschedulable\"} 2295\n";
        assert_eq!(Queue::parse(busy).expect("busy"), Queue { waiting: 2.0, binding: 1.0, attempts: 3499.0 });
        assert!(Queue::parse("up 1\n").is_err());
    }

    #[test]
    fn the_barrier_goes_to_the_last_node_with_a_slot_to_spare() {
        let scenario = Scenario {
            seed: 0,
            nodes: vec![
                json!({"metadata": {"name": "a"}, "status": {"allocatable": {"pods": "110"}}}),
                json!({"metadata": {"name": "b"}, "status": {"allocatable": {"pods": "1"}}}),
                json!({"metadata": {"name": "c"}, "status": {"allocatable": {"pods": "0"}}}),
            ],
            bound: vec![json!({"metadata": {"name": "p", "namespace": "agree-a"}, "spec": {"nodeName": "b"}})],
            pending: vec![],
        };
        assert_eq!(barrier_node(&scenario, true).as_deref(), Some("a"));
        assert_eq!(barrier_node(&scenario, false).as_deref(), Some("b"));
        let full = Scenario { nodes: scenario.nodes[1..].to_vec(), ..scenario };
        assert_eq!(barrier_node(&full, true), None);
        assert_eq!(barrier_node(&full, false).as_deref(), Some("b"));
    }
}
