//! Seeded scenarios: a small cluster (nodes with labels, taints, capacity
//! and cordons; bound pods with labels, ports, requests and anti-affinity)
//! and pending pods drawing every constraint ironclaim models.
//!
//! A scenario is plain Kubernetes manifests, the same objects both sides
//! read: the API server (and so kube-scheduler) gets them as they are, and
//! ironclaim converts them with the controller's own conversions.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

/// Every object a scenario creates carries this label, so a run can delete
/// what an earlier, interrupted run left.
pub const RUN_LABEL: &str = "agree.ironclaim.dev/run";
/// The domain of the per-node probe resources: node `i` of a scenario has
/// one `agree.ironclaim.dev/<node name>`, so a probe pod requesting it can
/// land on that node alone.
pub const PROBE_DOMAIN: &str = "agree.ironclaim.dev";
/// The namespaces scenarios put pods in, with their labels (for
/// `namespaceSelector`). Created once per run, never deleted by it.
pub const NAMESPACES: [(&str, &[(&str, &str)]); 3] = [
    ("agree-a", &[("team", "red"), ("env", "prod")]),
    ("agree-b", &[("team", "blue"), ("env", "prod")]),
    ("agree-c", &[("team", "red"), ("env", "dev")]),
];

pub const ZONE: &str = "topology.kubernetes.io/zone";
pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub const RACK: &str = "example.com/rack";
const DISK: &str = "example.com/disk";
const CORES: &str = "example.com/cores";
const TOPOLOGY_KEYS: [&str; 3] = [ZONE, HOSTNAME, RACK];
const APPS: [&str; 3] = ["web", "db", "cache"];
const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// The taint of a node whose Ready condition is False.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";

/// One cluster and its pending pods, as manifests.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub seed: u64,
    pub nodes: Vec<Value>,
    /// Pods bound by `spec.nodeName`, as a kubelet runs them.
    pub bound: Vec<Value>,
    pub pending: Vec<Value>,
}

/// Which kind of scenario: one pending pod probed against every node, or
/// several pending pods at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Single,
    Batch,
}

struct Gen {
    rng: ChaCha8Rng,
    prefix: String,
}

impl Gen {
    fn chance(&mut self, p: f64) -> bool {
        self.rng.random_bool(p)
    }
    fn pick<'a, T: ?Sized>(&mut self, from: &[&'a T]) -> &'a T {
        from[self.rng.random_range(0..from.len())]
    }
    fn below(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }
    fn node_name(&self, i: usize) -> String {
        format!("{}-n{i}", self.prefix)
    }

    /// A cpu quantity, written the several ways people write it.
    fn cpu(&mut self, milli: u64) -> String {
        match self.below(3) {
            0 if milli.is_multiple_of(1000) => format!("{}", milli / 1000),
            1 => {
                let whole = milli / 1000;
                let frac = format!("{:03}", milli % 1000);
                let frac = frac.trim_end_matches('0');
                if frac.is_empty() { format!("{whole}") } else { format!("{whole}.{frac}") }
            }
            _ => format!("{milli}m"),
        }
    }

    fn memory(&mut self, mib: u64) -> String {
        match self.below(3) {
            0 if mib.is_multiple_of(1024) => format!("{}Gi", mib / 1024),
            1 => format!("{}", mib * 1024 * 1024),
            _ => format!("{mib}Mi"),
        }
    }

    fn node(&mut self, i: usize) -> Value {
        let name = self.node_name(i);
        let mut labels = serde_json::Map::new();
        labels.insert(HOSTNAME.into(), json!(name));
        labels.insert(RUN_LABEL.into(), json!("true"));
        if self.chance(0.85) {
            labels.insert(ZONE.into(), json!(self.pick(&["a", "b", "c"])));
        }
        if self.chance(0.7) {
            labels.insert(RACK.into(), json!(self.pick(&["r1", "r2", "r3", "r4"])));
        }
        if self.chance(0.5) {
            labels.insert(DISK.into(), json!(self.pick(&["ssd", "hdd"])));
        }
        if self.chance(0.6) {
            labels.insert(CORES.into(), json!(self.pick(&["8", "16", "32"])));
        }
        let mut taints = Vec::new();
        if self.chance(0.35) {
            let choices = [
                json!({"key": "dedicated", "value": "batch", "effect": "NoSchedule"}),
                json!({"key": "dedicated", "value": "web", "effect": "NoSchedule"}),
                json!({"key": "example.com/maint", "effect": "NoExecute"}),
                json!({"key": "example.com/soft", "value": "x", "effect": "PreferNoSchedule"}),
            ];
            taints.push(choices[self.below(choices.len())].clone());
            if self.chance(0.3) {
                let other = choices[self.below(choices.len())].clone();
                if !taints.iter().any(|t| t["key"] == other["key"] && t["effect"] == other["effect"]) {
                    taints.push(other);
                }
            }
        }
        let cpu_milli = 50 * self.rng.random_range(10..=160u64);
        let mem_mib = 256 * self.rng.random_range(2..=64u64);
        let pods = match self.below(10) {
            0 => self.rng.random_range(0..=3u64),
            _ => 110,
        };
        let mut capacity = serde_json::Map::new();
        capacity.insert("cpu".into(), json!(self.cpu(cpu_milli)));
        capacity.insert("memory".into(), json!(self.memory(mem_mib)));
        capacity.insert("pods".into(), json!(pods.to_string()));
        if self.chance(0.3) {
            capacity.insert("ephemeral-storage".into(), json!(format!("{}Gi", self.rng.random_range(1..=20u64))));
        }
        capacity.insert(format!("{PROBE_DOMAIN}/{name}"), json!("1"));
        let unschedulable = self.chance(0.1);
        if self.chance(0.08) {
            // NotReady: no kubelet (kwok leaves it alone), the condition and
            // the taint the API server and the node lifecycle controller give
            // such a node.
            taints.push(json!({"key": NOT_READY_TAINT, "effect": "NoSchedule"}));
            return json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": labels},
                "spec": {"taints": taints, "unschedulable": unschedulable},
                "status": {
                    "capacity": capacity.clone(),
                    "allocatable": capacity,
                    "conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "no kubelet"}],
                },
            });
        }
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name,
                "labels": labels,
                "annotations": {ironclaim_testenv::FAKE_NODE_ANNOTATION.0: ironclaim_testenv::FAKE_NODE_ANNOTATION.1},
            },
            "spec": {"taints": taints, "unschedulable": unschedulable},
            "status": {"capacity": capacity.clone(), "allocatable": capacity},
        })
    }

    fn pod_labels(&mut self) -> serde_json::Map<String, Value> {
        let mut labels = serde_json::Map::new();
        labels.insert(RUN_LABEL.into(), json!("true"));
        if self.chance(0.8) {
            labels.insert("app".into(), json!(self.pick(&APPS)));
        }
        if self.chance(0.5) {
            labels.insert("tier".into(), json!(self.pick(&["front", "back"])));
        }
        if self.chance(0.6) {
            labels.insert("release".into(), json!(self.pick(&["v1", "v2"])));
        }
        labels
    }

    fn requests(&mut self, big: bool) -> Value {
        let mut r = serde_json::Map::new();
        if self.chance(0.9) {
            let cpu = if big { 50 * self.rng.random_range(1..=100u64) } else { 50 * self.rng.random_range(1..=40u64) };
            r.insert("cpu".into(), json!(self.cpu(cpu)));
        }
        if self.chance(0.8) {
            let mib = 128 * self.rng.random_range(1..=if big { 64 } else { 24 });
            r.insert("memory".into(), json!(self.memory(mib)));
        }
        if self.chance(0.1) {
            r.insert("ephemeral-storage".into(), json!(format!("{}Gi", self.rng.random_range(1..=8u64))));
        }
        Value::Object(r)
    }

    fn selector(&mut self, all_namespaces: bool) -> Value {
        // Selectors that could match a pod without labels (NotIn,
        // DoesNotExist) stay within named namespaces: a selector across all
        // namespaces would also see the scenario's barrier pod.
        match self.below(if all_namespaces { 3 } else { 5 }) {
            0 => json!({"matchLabels": {"app": self.pick(&APPS)}}),
            1 => json!({"matchExpressions": [{"key": "app", "operator": "In", "values": [self.pick(&APPS), self.pick(&APPS)]}]}),
            2 => json!({"matchLabels": {"app": self.pick(&APPS)}, "matchExpressions": [{"key": "tier", "operator": "Exists"}]}),
            3 => json!({"matchExpressions": [{"key": "app", "operator": "NotIn", "values": [self.pick(&APPS)]}]}),
            _ => json!({"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]}),
        }
    }

    fn affinity_term(&mut self) -> Value {
        let mut term = serde_json::Map::new();
        term.insert("topologyKey".into(), json!(self.pick(&TOPOLOGY_KEYS)));
        let all_namespaces = match self.below(10) {
            0..=5 => false,
            6 | 7 => {
                let n = NAMESPACES[self.below(3)].0;
                let m = NAMESPACES[self.below(3)].0;
                term.insert("namespaces".into(), json!([n, m]));
                false
            }
            8 => {
                term.insert("namespaceSelector".into(), json!({}));
                true
            }
            _ => {
                term.insert("namespaceSelector".into(), json!({"matchLabels": {"team": self.pick(&["red", "blue"])}}));
                true
            }
        };
        if self.chance(0.03) {
            // A nil selector: matches no pod.
            return Value::Object(term);
        }
        let selector = self.selector(all_namespaces);
        term.insert("labelSelector".into(), selector);
        // The API server merges these into the selector from the pod's own
        // labels, when it creates the pod.
        match self.below(12) {
            0 => {
                term.insert("matchLabelKeys".into(), json!(["release"]));
            }
            1 => {
                term.insert("mismatchLabelKeys".into(), json!(["release"]));
            }
            _ => {}
        }
        Value::Object(term)
    }

    fn host_ports(&mut self) -> Value {
        let n = 1 + self.below(2);
        let ports: Vec<Value> = (0..n)
            .map(|_| {
                let mut p = serde_json::Map::new();
                p.insert("containerPort".into(), json!(8080 + self.below(100)));
                p.insert("hostPort".into(), json!(*self.pick(&[&80u16, &443, &9100])));
                match self.below(4) {
                    0 => {
                        p.insert("protocol".into(), json!("UDP"));
                    }
                    1 => {
                        p.insert("protocol".into(), json!("TCP"));
                    }
                    _ => {}
                }
                match self.below(4) {
                    0 => {
                        p.insert("hostIP".into(), json!("0.0.0.0"));
                    }
                    1 => {
                        p.insert("hostIP".into(), json!(self.pick(&["127.0.0.1", "127.0.0.2"])));
                    }
                    _ => {}
                }
                Value::Object(p)
            })
            .collect();
        // The API server refuses two ports with the same containerPort or
        // the same hostPort and protocol: keep the first of each.
        let mut seen = Vec::new();
        let ports: Vec<Value> = ports
            .into_iter()
            .filter(|p| {
                let protocol = p.get("protocol").cloned().unwrap_or(json!("TCP"));
                let keys = [(p["containerPort"].clone(), protocol.clone()), (p["hostPort"].clone(), protocol)];
                if keys.iter().any(|k| seen.contains(k)) {
                    return false;
                }
                seen.extend(keys);
                true
            })
            .collect();
        Value::Array(ports)
    }

    fn bound_pod(&mut self, i: usize, nodes: usize) -> Value {
        let namespace = NAMESPACES[self.below(3)].0;
        let on = self.below(nodes);
        let node = self.node_name(on);
        let mut container = json!({"name": "c", "image": "registry.invalid/app", "resources": {"requests": self.requests(false)}});
        if self.chance(0.15) {
            container["ports"] = self.host_ports();
        }
        let mut spec = json!({"nodeName": node, "containers": [container], "tolerations": [{"operator": "Exists"}]});
        if self.chance(0.2) {
            spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [self.affinity_term()]}});
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{}-b{i}", self.prefix), "namespace": namespace, "labels": self.pod_labels()},
            "spec": spec,
        })
    }

    fn node_affinity(&mut self, nodes: usize) -> Value {
        let terms: Vec<Value> = (0..1 + self.below(2))
            .map(|_| {
                let exprs: Vec<Value> = (0..1 + self.below(2))
                    .map(|_| match self.below(7) {
                        0 => json!({"key": ZONE, "operator": "In", "values": [self.pick(&["a", "b", "c"])]}),
                        1 => json!({"key": ZONE, "operator": "NotIn", "values": [self.pick(&["a", "b", "c"])]}),
                        2 => json!({"key": DISK, "operator": "Exists"}),
                        3 => json!({"key": DISK, "operator": "DoesNotExist"}),
                        4 => json!({"key": CORES, "operator": "Gt", "values": [self.pick(&["8", "16"])]}),
                        5 => json!({"key": CORES, "operator": "Lt", "values": [self.pick(&["16", "32"])]}),
                        _ => json!({"key": RACK, "operator": "In", "values": [self.pick(&["r1", "r2"]), self.pick(&["r3", "r4"])]}),
                    })
                    .collect();
                if self.chance(0.15) {
                    let on = self.below(nodes);
                    let node = self.node_name(on);
                    json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]})
                } else {
                    json!({"matchExpressions": exprs})
                }
            })
            .collect();
        json!({"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}})
    }

    fn tolerations(&mut self) -> Value {
        let choices = [
            json!({"key": "dedicated", "operator": "Equal", "value": "batch", "effect": "NoSchedule"}),
            json!({"key": "dedicated", "value": "web"}),
            json!({"key": "dedicated", "operator": "Exists"}),
            json!({"key": "example.com/maint", "operator": "Exists", "effect": "NoExecute"}),
            json!({"key": UNSCHEDULABLE_TAINT, "operator": "Exists", "effect": "NoSchedule"}),
            json!({"operator": "Exists"}),
        ];
        let n = 1 + self.below(2);
        Value::Array((0..n).map(|_| choices[self.below(choices.len())].clone()).collect())
    }

    fn spread(&mut self) -> Value {
        let mut c = serde_json::Map::new();
        c.insert("maxSkew".into(), json!(1 + self.below(2)));
        c.insert("topologyKey".into(), json!(self.pick(&TOPOLOGY_KEYS)));
        let anyway = self.chance(0.15);
        c.insert("whenUnsatisfiable".into(), json!(if anyway { "ScheduleAnyway" } else { "DoNotSchedule" }));
        match self.below(30) {
            // nil: counts no pod, and the pod is not its own match.
            0 => {}
            // {}: counts no pod, yet the pod matches it itself.
            1 => {
                c.insert("labelSelector".into(), json!({}));
            }
            _ => {
                c.insert("labelSelector".into(), self.selector(false));
                if self.chance(0.15) {
                    c.insert("matchLabelKeys".into(), json!(["release"]));
                }
            }
        }
        if !anyway && self.chance(0.25) {
            c.insert("minDomains".into(), json!(2 + self.below(3)));
        }
        if self.chance(0.3) {
            c.insert("nodeAffinityPolicy".into(), json!(self.pick(&["Honor", "Ignore"])));
        }
        if self.chance(0.3) {
            c.insert("nodeTaintsPolicy".into(), json!(self.pick(&["Honor", "Ignore"])));
        }
        Value::Object(c)
    }

    fn pending_pod(&mut self, i: usize, nodes: usize) -> Value {
        let namespace = NAMESPACES[self.below(3)].0;
        let mut container = json!({"name": "c", "image": "registry.invalid/app", "resources": {"requests": self.requests(true)}});
        if self.chance(0.15) {
            container["ports"] = self.host_ports();
        }
        let mut spec = json!({"containers": [container]});
        if self.chance(0.2) {
            let mut sel = serde_json::Map::new();
            if self.chance(0.7) {
                sel.insert(ZONE.into(), json!(self.pick(&["a", "b", "c"])));
            } else {
                sel.insert(DISK.into(), json!(self.pick(&["ssd", "hdd"])));
            }
            spec["nodeSelector"] = Value::Object(sel);
        }
        if self.chance(0.45) {
            spec["tolerations"] = self.tolerations();
        }
        let mut affinity = serde_json::Map::new();
        if self.chance(0.3) {
            affinity.insert("nodeAffinity".into(), self.node_affinity(nodes));
        }
        if self.chance(0.3) {
            let terms: Vec<Value> = (0..1 + self.below(2)).map(|_| self.affinity_term()).collect();
            affinity.insert("podAffinity".into(), json!({"requiredDuringSchedulingIgnoredDuringExecution": terms}));
        }
        if self.chance(0.3) {
            let terms: Vec<Value> = (0..1 + self.below(2)).map(|_| self.affinity_term()).collect();
            affinity.insert("podAntiAffinity".into(), json!({"requiredDuringSchedulingIgnoredDuringExecution": terms}));
        }
        if !affinity.is_empty() {
            spec["affinity"] = Value::Object(affinity);
        }
        if self.chance(0.4) {
            let mut list: Vec<Value> = Vec::new();
            for _ in 0..1 + self.below(2) {
                let c = self.spread();
                // One constraint per (topologyKey, whenUnsatisfiable), as the
                // API server requires.
                if !list.iter().any(|o| o["topologyKey"] == c["topologyKey"] && o["whenUnsatisfiable"] == c["whenUnsatisfiable"]) {
                    list.push(c);
                }
            }
            spec["topologySpreadConstraints"] = Value::Array(list);
        }
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": format!("{}-p{i}", self.prefix), "namespace": namespace, "labels": self.pod_labels()},
            "spec": spec,
        })
    }
}

/// The scenario of `seed` in `mode`. Same seed, same scenario.
pub fn scenario(seed: u64, mode: Mode) -> Scenario {
    let tag = match mode {
        Mode::Single => "s",
        Mode::Batch => "m",
    };
    let mut g = Gen { rng: ChaCha8Rng::seed_from_u64(seed ^ if mode == Mode::Batch { 0x5eed_ba7c } else { 0 }), prefix: format!("{tag}{seed}") };
    let nodes_n = 2 + g.below(5);
    let nodes: Vec<Value> = (0..nodes_n).map(|i| g.node(i)).collect();
    let bound_n = g.below(9);
    let bound = (0..bound_n).map(|i| g.bound_pod(i, nodes_n)).collect();
    let pending_n = match mode {
        Mode::Single => 1,
        Mode::Batch => 2 + g.below(7),
    };
    let pending = if mode == Mode::Batch && g.chance(0.5) {
        // Copies of one pod, as a Deployment makes them: where order
        // effects between pods show most.
        let first = g.pending_pod(0, nodes_n);
        (0..pending_n)
            .map(|i| {
                let mut p = first.clone();
                p["metadata"]["name"] = json!(format!("{}-p{i}", g.prefix));
                p
            })
            .collect()
    } else {
        (0..pending_n).map(|i| g.pending_pod(i, nodes_n)).collect()
    };
    let mut pending: Vec<Value> = pending;
    if mode == Mode::Batch {
        // A gated pod is no demand: kube-scheduler never tries it.
        for p in &mut pending {
            if g.chance(0.1) {
                p["spec"]["schedulingGates"] = json!([{"name": "example.com/hold"}]);
            }
        }
    }
    Scenario { seed, nodes, bound, pending }
}

impl Scenario {
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n["metadata"]["name"].as_str().unwrap_or_default().to_string()).collect()
    }

    /// A copy of pending pod `pod` that can land on `node` alone: it asks
    /// for the one unit of that node's probe resource.
    pub fn probe(&self, pod: usize, node: &str) -> Value {
        let mut p = self.pending[pod].clone();
        let name = format!("{}-probe-{node}", p["metadata"]["name"].as_str().unwrap_or_default());
        p["metadata"]["name"] = json!(name);
        let resource = format!("{PROBE_DOMAIN}/{node}");
        let c = &mut p["spec"]["containers"][0]["resources"];
        c["requests"][&resource] = json!("1");
        c["limits"][&resource] = json!("1");
        p
    }

    /// The whole scenario as one multi-document YAML manifest.
    pub fn manifest(&self) -> String {
        let mut out = String::new();
        for ns in NAMESPACES {
            let labels: serde_json::Map<String, Value> = ns.1.iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
            let doc = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns.0, "labels": labels}});
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(&doc).unwrap_or_default());
        }
        for doc in self.nodes.iter().chain(&self.bound).chain(&self.pending) {
            out.push_str("---\n");
            out.push_str(&serde_saphyr::to_string(doc).unwrap_or_default());
        }
        out
    }
}
