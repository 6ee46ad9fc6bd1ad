//! The real kube-scheduler's answer to a scenario, on the test control
//! plane: the scenario's nodes are kwok nodes, its bound pods are bound by
//! `spec.nodeName`, and each pending pod (or each probe copy of one) is
//! left to kube-scheduler until it binds or is marked unschedulable.
//!
//! # Making sure kube-scheduler has seen the scenario
//! Nodes and pods reach kube-scheduler on separate watches. Before the
//! first pending pod is created, a barrier pod that only the last node
//! created can take must bind there: kube-scheduler then knows every node
//! of the scenario (and has seen the previous scenario's nodes go, which
//! were deleted before). Pods arrive on one watch in order, so the bound
//! pods created before a pending pod are known when it is scheduled. An
//! unschedulable answer must also name as many nodes as the scenario has
//! ("0/N nodes are available"), or it is asked again.

use anyhow::{Context, Result, anyhow, bail, ensure};
use ironclaim_testenv::TestEnv;
use k8s_openapi::api::core::v1 as k8s;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use crate::generate::{NAMESPACES, RUN_LABEL, Scenario};

const BARRIER_NAMESPACE: &str = "agree-barrier";
const POLL: Duration = Duration::from_millis(5);
/// Longer than kube-scheduler takes for one pod on a handful of nodes by
/// orders of magnitude; reaching it is a failure of the environment.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);
/// kube-scheduler's initial backoff for an unschedulable pod is one second.
const SETTLE: Duration = Duration::from_millis(1500);

/// A control plane prepared for scenarios.
pub struct Cluster {
    _env: TestEnv,
    client: kube::Client,
}

/// What kube-scheduler did with one pending pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Bound(String),
    Unschedulable(String),
}

impl Cluster {
    /// Joins (or starts) the process's control plane and creates the
    /// scenarios' namespaces; removes what an interrupted run left.
    pub async fn start() -> Result<Cluster> {
        let env = TestEnv::for_process().context("starting the test control plane (hack/testenv build first)")?;
        let client = env.client().await.context("client")?;
        let cluster = Cluster { _env: env, client };
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

    fn pods(&self, namespace: &str) -> Api<k8s::Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Deletes every object of earlier scenarios, pods first.
    pub async fn clear(&self) -> Result<()> {
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        let mine = ListParams::default().labels(&format!("{RUN_LABEL}=true"));
        for (ns, _) in NAMESPACES {
            self.pods(ns).delete_collection(&now, &mine).await.with_context(|| format!("delete pods in {ns}"))?;
        }
        self.pods(BARRIER_NAMESPACE).delete_collection(&now, &ListParams::default()).await?;
        let nodes: Api<k8s::Node> = Api::all(self.client.clone());
        nodes.delete_collection(&now, &mine).await.context("delete nodes")?;
        Ok(())
    }

    async fn create_pod(&self, pod: &Value) -> Result<()> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default").to_string();
        let typed: k8s::Pod = serde_json::from_value(pod.clone()).context("pod manifest")?;
        self.pods(&ns)
            .create(&PostParams::default(), &typed)
            .await
            .with_context(|| format!("create pod {ns}/{}", typed.metadata.name.unwrap_or_default()))?;
        Ok(())
    }

    async fn delete_pod(&self, pod: &Value) -> Result<()> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        self.pods(ns).delete(name, &now).await.with_context(|| format!("delete pod {ns}/{name}"))?;
        Ok(())
    }

    /// Creates the scenario's nodes and bound pods and waits until
    /// kube-scheduler knows them all.
    pub async fn set_up(&self, scenario: &Scenario) -> Result<()> {
        self.clear().await?;
        let nodes: Api<k8s::Node> = Api::all(self.client.clone());
        for n in &scenario.nodes {
            let typed: k8s::Node = serde_json::from_value(n.clone()).context("node manifest")?;
            nodes.create(&PostParams::default(), &typed).await.with_context(|| format!("create node {}", typed.metadata.name.unwrap_or_default()))?;
        }
        // The API server adds node.kubernetes.io/not-ready to a new node;
        // the node lifecycle controller lifts it once kwok reports Ready.
        let names = scenario.node_names();
        let start = Instant::now();
        loop {
            let list = nodes.list(&ListParams::default().labels(&format!("{RUN_LABEL}=true"))).await?;
            let settled = list.items.iter().filter(|n| is_ready(n) && !has_condition_taint(n)).count();
            if settled == names.len() && list.items.len() == names.len() {
                break;
            }
            ensure!(
                start.elapsed() < ANSWER_TIMEOUT,
                "scenario {}: only {settled} of {} nodes Ready after {ANSWER_TIMEOUT:?}",
                scenario.seed,
                names.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.barrier(scenario).await?;
        for p in &scenario.bound {
            self.create_pod(p).await?;
        }
        Ok(())
    }

    /// Binds a pod that only the last node can take, then deletes it.
    async fn barrier(&self, scenario: &Scenario) -> Result<()> {
        let last = scenario.node_names().pop().ok_or_else(|| anyhow!("scenario {} has no nodes", scenario.seed))?;
        let pod = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("barrier-{}", scenario.seed), "namespace": BARRIER_NAMESPACE},
            "spec": {
                "containers": [{"name": "c", "image": "registry.invalid/barrier"}],
                "tolerations": [{"operator": "Exists"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [last]}]}
                ]}}}
            }
        });
        self.create_pod(&pod).await?;
        let verdict = self.verdict(&pod).await;
        self.delete_pod(&pod).await?;
        match verdict? {
            Verdict::Bound(node) if node == last => Ok(()),
            // A last node with no pod slots left takes no barrier: the
            // answers' node count still guards the unschedulable ones.
            Verdict::Unschedulable(_) if pod_slots(&scenario.nodes[scenario.nodes.len() - 1]) == 0 => {
                tokio::time::sleep(Duration::from_millis(200)).await;
                Ok(())
            }
            other => bail!("scenario {}: the barrier pod for {last} ended {other:?}", scenario.seed),
        }
    }

    /// Waits for kube-scheduler to bind `pod` or mark it unschedulable.
    async fn verdict(&self, pod: &Value) -> Result<Verdict> {
        let ns = pod["metadata"]["namespace"].as_str().unwrap_or("default");
        let name = pod["metadata"]["name"].as_str().unwrap_or_default();
        let api = self.pods(ns);
        let start = Instant::now();
        loop {
            let p = api.get(name).await.with_context(|| format!("get pod {ns}/{name}"))?;
            if let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()) {
                return Ok(Verdict::Bound(node));
            }
            let scheduled = p.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"));
            if let Some(c) = scheduled
                && c.status == "False"
                && c.reason.as_deref() == Some("Unschedulable")
            {
                return Ok(Verdict::Unschedulable(c.message.clone().unwrap_or_default()));
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
                self.create_pod(&probe).await?;
                let verdict = self.verdict(&probe).await;
                self.delete_pod(&probe).await?;
                match verdict? {
                    Verdict::Unschedulable(message) if nodes_counted(&message) != Some(nodes.len()) => {
                        ensure!(
                            attempt < 3,
                            "probe for {node}: kube-scheduler kept counting other nodes than the scenario's {}: {message}",
                            nodes.len()
                        );
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
        for p in &scenario.pending {
            self.create_pod(p).await?;
        }
        let mut last_change = Instant::now();
        let mut last: Vec<Option<String>> = Vec::new();
        loop {
            let mut now = Vec::new();
            let mut answered = 0;
            for p in &scenario.pending {
                let ns = p["metadata"]["namespace"].as_str().unwrap_or("default");
                let name = p["metadata"]["name"].as_str().unwrap_or_default();
                let got = self.pods(ns).get(name).await?;
                let node = got.spec.as_ref().and_then(|s| s.node_name.clone());
                let unschedulable = got
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "PodScheduled" && c.status == "False"));
                if node.is_some() || unschedulable {
                    answered += 1;
                }
                now.push(node);
            }
            if now != last {
                last = now;
                last_change = Instant::now();
            }
            // Every pod answered and nothing moved for longer than
            // kube-scheduler's first backoff: a pod marked unschedulable is
            // tried again when another binds, after that backoff.
            let all_bound = last.iter().all(Option::is_some);
            if answered == scenario.pending.len() && (all_bound || last_change.elapsed() > SETTLE) {
                return Ok(last);
            }
            ensure!(last_change.elapsed() < ANSWER_TIMEOUT, "scenario {}: pending pods unanswered after {ANSWER_TIMEOUT:?}", scenario.seed);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn is_ready(node: &k8s::Node) -> bool {
    node.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn has_condition_taint(node: &k8s::Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"))
}

fn pod_slots(node: &Value) -> i64 {
    node["status"]["allocatable"]["pods"].as_str().and_then(|s| s.parse().ok()).unwrap_or(110)
}

/// N in kube-scheduler's "0/N nodes are available: ...".
fn nodes_counted(message: &str) -> Option<usize> {
    let rest = message.strip_prefix("0/")?;
    rest.split_once(' ')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_the_node_count_of_an_unschedulable_message() {
        assert_eq!(super::nodes_counted("0/5 nodes are available: 5 Insufficient cpu."), Some(5));
        assert_eq!(super::nodes_counted("no nodes"), None);
    }
}
