//! An independent checker for provisioning plans, and a generator of random
//! snapshots. The checker shares no code with the scheduler beyond the data
//! model: it recomputes every constraint from the final placement, the slow
//! and obvious way.
#![allow(dead_code)]

use ironclaim_core::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

pub const ZONES: [&str; 3] = ["z1", "z2", "z3"];
const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

/// A tiny deterministic generator, so that a failing case is its seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

const GI: i64 = 1 << 30;

/// A random but well-formed snapshot: every zone has a Ready node, servers
/// in several classes and states, pods with every kind of constraint.
pub fn random_snapshot(seed: u64) -> Snapshot {
    let mut r = Rng::new(seed);
    let mut snap = Snapshot::default();
    let node_count = 3 + r.below(5) as usize;
    for i in 0..node_count {
        let zone = ZONES[i % 3];
        let mut n = Node::new(&format!("node-{i}"), Resources::new(4000 + 4000 * r.below(4) as i64, 16 * GI).with_pods(20))
            .with_labels(&[(ZONE, zone), ("disk", if r.chance(50) { "ssd" } else { "hdd" })]);
        if r.chance(20) {
            n.taints.push(Taint::new("dedicated", "db", TaintEffect::NoSchedule));
        }
        if r.chance(10) {
            n.unschedulable = true;
        }
        if r.chance(15) {
            n.allocatable.set_extended(GPU, 1 + r.below(2) as i64);
        }
        snap.nodes.push(n);
    }
    let mut general = ServerPool::new("general");
    general.requirements = vec![Requirement::new("class", Operator::NotIn, &["gpu"])];
    let mut gpu = ServerPool::new("gpu");
    gpu.weight = 5;
    gpu.requirements = vec![Requirement::new("class", Operator::In, &["gpu"])];
    gpu.taints = vec![Taint::new(GPU, "true", TaintEffect::NoSchedule)];
    if r.chance(30) {
        gpu.limits.gpus = Some(2 + r.below(6) as i64);
    }
    if r.chance(30) {
        general.limits.cpu_milli = Some(32_000 + 16_000 * r.below(6) as i64);
    }
    if r.chance(20) {
        general.limits.servers = Some(1 + r.below(4) as i64);
    }
    snap.pools = vec![general, gpu];
    let server_count = r.below(14) as usize;
    for i in 0..server_count {
        let zone = *r.pick(&ZONES);
        let kind = r.below(3);
        let mut s = match kind {
            0 => Server::new(&format!("s{i:02}"), Resources::new(16_000, 64 * GI).with_pods(50)).with_labels(&[("class", "small")]),
            1 => Server::new(&format!("s{i:02}"), Resources::new(32_000, 128 * GI).with_pods(50)).with_labels(&[("class", "large")]),
            _ => Server::new(&format!("s{i:02}"), Resources::new(32_000, 256 * GI).with_pods(50))
                .with_labels(&[("class", "gpu")])
                .with_gpus("A100", 1 + r.below(4) as i64),
        };
        s.labels.insert(ZONE.into(), zone.into());
        s.labels.insert("disk".into(), if r.chance(50) { "ssd".into() } else { "hdd".into() });
        if r.chance(30) {
            s.power_state = PowerState::On;
        }
        match r.below(10) {
            0 => s.health = Health::Maintenance,
            1 => s.health = Health::Quarantined,
            2 => s.health = Health::Failed,
            3 => s.node = Some(s.name.clone()),
            _ => {}
        }
        s.durations.boot_s = 60 + 60 * r.below(20);
        snap.servers.push(s);
    }
    if r.chance(30) {
        snap.power_budget_watts = Some(500.0 + 500.0 * r.below(6) as f64);
    }
    if r.chance(40) {
        let mut t = Pod::new("kube-system", "agent", Resources::new(200, GI / 4));
        t.tolerations.push(Toleration { operator: TolerationOperator::Exists, ..Default::default() });
        snap.daemonsets.push(DaemonSet { namespace: "kube-system".into(), name: "agent".into(), template: t });
    }
    // Some pods already run.
    for i in 0..r.below(6) {
        let node = &snap.nodes[r.below(node_count as u64) as usize];
        let mut p = Pod::new("default", &format!("running-{i}"), Resources::new(500, GI)).bound_to(&node.name);
        p.labels.insert("app".into(), (*r.pick(&["db", "cache"])).into());
        if r.chance(30) {
            p.host_ports.push(HostPort { port: 8080, protocol: "TCP".into(), host_ip: String::new() });
        }
        snap.pods.push(p);
    }
    let groups = 1 + r.below(6);
    let mut n = 0;
    for g in 0..groups {
        let replicas = 1 + r.below(8);
        let cpu = 250 * (1 + r.below(24) as i64);
        let mem = GI / 2 * (1 + r.below(24) as i64);
        let app = format!("app-{g}");
        let mut template = Pod::new("default", "", Resources::new(cpu, mem)).with_labels(&[("app", &app)]);
        match r.below(10) {
            0 => {
                template.node_selector.insert("disk".into(), "ssd".into());
            }
            1 => {
                template.node_affinity = vec![NodeSelectorTerm {
                    match_expressions: vec![Requirement::new(ZONE, Operator::In, &[ZONES[r.below(3) as usize]])],
                    match_fields: vec![],
                }]
            }
            2 => {
                template.requests.set_extended(GPU, 1 + r.below(2) as i64);
                template.tolerations.push(Toleration::exists(GPU));
            }
            3 => template.tolerations.push(Toleration { key: "dedicated".into(), value: "db".into(), ..Default::default() }),
            _ => {}
        }
        let selector = Some(LabelSelector::matching(&[("app", &app)]));
        match r.below(8) {
            0 => template.pod_anti_affinity.push(PodAffinityTerm {
                label_selector: selector.clone(),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: HOST.into(),
            }),
            1 => template.pod_affinity.push(PodAffinityTerm {
                label_selector: selector.clone(),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: ZONE.into(),
            }),
            2 => template.topology_spread.push(TopologySpread {
                max_skew: 1 + r.below(2) as u32,
                topology_key: ZONE.into(),
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
                label_selector: selector.clone(),
                min_domains: None,
                node_affinity_policy: ironclaim_core::model::InclusionPolicy::Honor,
                node_taints_policy: ironclaim_core::model::InclusionPolicy::Ignore,
            }),
            3 => template.host_ports.push(HostPort { port: 8080, protocol: "TCP".into(), host_ip: String::new() }),
            4 => template.pod_anti_affinity.push(PodAffinityTerm {
                label_selector: Some(LabelSelector::matching(&[("app", "db")])),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: HOST.into(),
            }),
            _ => {}
        }
        if r.chance(30) {
            template.deadline_s = Some(60 * (1 + r.below(30)));
        }
        for _ in 0..replicas {
            let mut p = template.clone();
            p.name = format!("p{n}");
            p.created_s = r.below(100);
            n += 1;
            snap.pods.push(p);
        }
    }
    // Some running pods wait for an in-place resize their node did not
    // apply. A generator of its own, so the rest is as before.
    let mut r = Rng::new(seed ^ 0x5eed_0f4e_512e);
    for p in snap.pods.iter_mut().filter(|p| p.occupies_node()) {
        if r.chance(35) {
            let mut desired = p.requests.clone();
            desired.cpu_milli *= 2 + r.below(24) as i64;
            if r.chance(30) {
                desired.memory_bytes *= 2 + r.below(8) as i64;
            }
            let reason = if r.chance(50) { ResizeReason::Infeasible } else { ResizeReason::Deferred };
            p.resize = Some(Box::new(Resize { desired, reason, since_s: r.below(100), given: None }));
            if r.chance(80) {
                p.owner = Some(Owner { kind: "StatefulSet".into(), name: p.name.clone() });
            }
        }
    }
    snap
}

/// Where a pod ended up: a node name (existing or new) and its labels.
struct Host {
    labels: Labels,
    taints: Vec<Taint>,
    cordoned: bool,
    capacity: Resources,
}

fn tolerated(pod: &Pod, taint: &Taint) -> bool {
    pod.tolerations.iter().any(|t| {
        let effect_ok = t.effect.is_none() || t.effect == Some(taint.effect);
        let key_ok = match t.operator {
            TolerationOperator::Exists => t.key.is_empty() || t.key == taint.key,
            TolerationOperator::Equal => t.key == taint.key && t.value == taint.value,
        };
        effect_ok && key_ok
    })
}

fn selector_ok(pod: &Pod, labels: &Labels, name: &str) -> bool {
    let sel = pod.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v));
    let aff = pod.node_affinity.is_empty()
        || pod.node_affinity.iter().any(|t| {
            (!t.match_expressions.is_empty() || !t.match_fields.is_empty())
                && t.match_expressions.iter().all(|r| r.matches(labels))
                && t.match_fields.iter().all(|r| r.key == "metadata.name" && r.matches_value(Some(name)))
        });
    sel && aff
}

fn term_matches(term: &PodAffinityTerm, owner_ns: &str, other: &Pod) -> bool {
    // Random snapshots give namespaces no labels: a selector sees none.
    let by_selector = term.namespace_selector.as_ref().is_some_and(|s| s.matches(&Labels::new()));
    let own = term.namespaces.is_empty() && term.namespace_selector.is_none() && other.namespace == owner_ns;
    let ns_ok = by_selector || own || term.namespaces.contains(&other.namespace);
    ns_ok && term.label_selector.as_ref().is_some_and(|s| s.matches(&other.labels))
}

/// Checks a plan against its snapshot. Returns every violation found.
pub fn check(snap: &Snapshot, plan: &Provisioning) -> Vec<String> {
    let mut errors = Vec::new();
    let servers: HashMap<&str, &Server> = snap.servers.iter().map(|s| (s.name.as_str(), s)).collect();
    let pools: HashMap<&str, &ServerPool> = snap.pools.iter().map(|p| (p.name.as_str(), p)).collect();

    // What each decision is for: a pending pod as it is, or a running pod
    // waiting for a resize at its new size, unbound (where it runs must not
    // be where it goes).
    let mut wants: HashMap<String, Pod> = HashMap::new();
    let mut runs_on: HashMap<String, String> = HashMap::new();
    for p in &snap.pods {
        if p.is_pending_demand() {
            wants.insert(p.key(), p.clone());
        } else if let (Some(resize), true) =
            (&p.resize, p.owner.is_some() && p.occupies_node() && !p.terminating && p.priority >= -10 && !p.is_daemonset_pod())
        {
            let mut want = p.clone();
            want.requests = Resources { pods: 1, ..resize.desired.clone() };
            want.node_name = None;
            want.phase = PodPhase::Pending;
            want.resize = None;
            runs_on.insert(p.key(), p.node_name.clone().unwrap());
            wants.insert(p.key(), want);
        }
    }
    let pods: HashMap<String, &Pod> = wants.iter().map(|(k, p)| (k.clone(), p)).collect();
    for d in &plan.pods {
        if d.resize.as_ref().map(|w| w.node.as_str()) != runs_on.get(&d.pod).map(String::as_str) {
            errors.push(format!("{} says resize {:?}, but the pod waits for {:?}", d.pod, d.resize, runs_on.get(&d.pod)));
        }
        let host = match &d.outcome {
            Outcome::Existing { node } => Some(node),
            Outcome::NewClaim { server, .. } | Outcome::InFlight { server, .. } => Some(server),
            Outcome::Unschedulable { .. } => None,
        };
        if host.is_some() && host == runs_on.get(&d.pod) {
            errors.push(format!("{} resized onto the node that did not resize it", d.pod));
        }
    }

    // Every pending pod decided exactly once.
    let pending: BTreeSet<String> = wants.keys().cloned().collect();
    let decided: Vec<&str> = plan.pods.iter().map(|d| d.pod.as_str()).collect();
    let decided_set: BTreeSet<String> = decided.iter().map(|s| s.to_string()).collect();
    if decided.len() != decided_set.len() || decided_set != pending {
        errors.push(format!("decided {decided_set:?} but pending {pending:?}"));
    }

    // No server claimed twice or claimed while unavailable.
    let mut claimed = BTreeSet::new();
    for c in &plan.claims {
        if !claimed.insert(c.server.clone()) {
            errors.push(format!("server {} claimed twice", c.server));
        }
        match servers.get(c.server.as_str()) {
            None => errors.push(format!("claim on unknown server {}", c.server)),
            Some(s) => {
                if s.health != Health::Healthy || s.claim.is_some() || s.node.is_some() {
                    errors.push(format!("claimed unavailable server {} ({:?})", s.name, s.health));
                }
                let want = if s.power_state == PowerState::On { SupplyPath::Warm } else { SupplyPath::Cold };
                if c.path != want {
                    errors.push(format!("claim {} path {:?} for a server {:?}", c.name, c.path, s.power_state));
                }
                match pools.get(c.pool.as_str()) {
                    Some(pool) if pool.requirements.iter().all(|r| r.matches(&s.labels)) => {}
                    _ => errors.push(format!("server {} not admitted by pool {}", s.name, c.pool)),
                }
            }
        }
        if c.pods.is_empty() {
            errors.push(format!("claim {} has no pods", c.name));
        }
    }

    // Build hosts: Ready nodes and the new claims.
    let mut hosts: BTreeMap<String, Host> = BTreeMap::new();
    for n in snap.nodes.iter().filter(|n| n.ready) {
        let mut cap = n.allocatable.clone();
        if cap.pods == 0 {
            cap.pods = 110;
        }
        hosts.insert(n.name.clone(), Host { labels: n.labels.clone(), taints: n.taints.clone(), cordoned: n.unschedulable, capacity: cap });
    }
    for c in &plan.claims {
        let (Some(s), Some(pool)) = (servers.get(c.server.as_str()), pools.get(c.pool.as_str())) else { continue };
        let mut labels = s.labels.clone();
        labels.extend(pool.labels.clone());
        labels.insert(HOST.into(), s.name.clone());
        let mut cap = s.capacity.clone();
        if cap.pods == 0 {
            cap.pods = 110;
        }
        // DaemonSets that would land take their share first.
        for ds in &snap.daemonsets {
            let t = &ds.template;
            if selector_ok(t, &labels, &s.name) && pool.taints.iter().all(|x| x.effect == TaintEffect::PreferNoSchedule || tolerated(t, x)) {
                cap.sub(&t.requests);
                cap.pods -= 1;
            }
        }
        hosts.insert(c.server.clone(), Host { labels, taints: pool.taints.clone(), cordoned: false, capacity: cap });
    }

    // Final placement of every pod, bound or planned.
    let mut on: BTreeMap<String, Vec<&Pod>> = BTreeMap::new();
    for p in snap.pods.iter().filter(|p| p.occupies_node()) {
        on.entry(p.node_name.clone().unwrap()).or_default().push(p);
    }
    let mut planned: Vec<(&Pod, String)> = Vec::new();
    for d in &plan.pods {
        let pod = pods[&d.pod];
        let host = match &d.outcome {
            Outcome::Existing { node } => node.clone(),
            Outcome::NewClaim { server, claim, .. } => {
                match plan.claims.iter().find(|c| &c.name == claim) {
                    Some(c) if c.pods.contains(&d.pod) && &c.server == server => {}
                    _ => errors.push(format!("{} says claim {claim} but the claim does not list it", d.pod)),
                }
                server.clone()
            }
            Outcome::InFlight { server, .. } => server.clone(),
            Outcome::Unschedulable { reason } => {
                if let Unschedulable::NoMatchingHardware { .. } = reason {
                    // Independently: no server could host this pod even empty.
                    for s in &snap.servers {
                        for pool in snap.pools.iter().filter(|p| p.requirements.iter().all(|r| r.matches(&s.labels))) {
                            let mut labels = s.labels.clone();
                            labels.extend(pool.labels.clone());
                            labels.insert(HOST.into(), s.name.clone());
                            let mut cap = s.capacity.clone();
                            cap.pods = if cap.pods == 0 { 110 } else { cap.pods };
                            for ds in &snap.daemonsets {
                                let t = &ds.template;
                                if selector_ok(t, &labels, &s.name)
                                    && pool.taints.iter().all(|x| x.effect == TaintEffect::PreferNoSchedule || tolerated(t, x))
                                {
                                    cap.sub(&t.requests);
                                    cap.pods -= 1;
                                }
                            }
                            let taints_ok = pool.taints.iter().all(|x| x.effect == TaintEffect::PreferNoSchedule || tolerated(pod, x));
                            if taints_ok && selector_ok(pod, &labels, &s.name) && pod.requests.fits(&cap) {
                                errors.push(format!("{} said to match no hardware, but {} in pool {} fits", d.pod, s.name, pool.name));
                            }
                        }
                    }
                }
                continue;
            }
        };
        if !hosts.contains_key(&host) {
            errors.push(format!("{} placed on unknown host {host}", d.pod));
            continue;
        }
        on.entry(host.clone()).or_default().push(pod);
        planned.push((pod, host));
    }

    // Per host: resources and host ports.
    for (name, pods_on) in &on {
        let Some(h) = hosts.get(name) else { continue };
        let mut used = Resources::default();
        for p in pods_on {
            used.add(&p.requests);
        }
        // A pod waiting for a resize shares its key with its new size: the
        // newcomer is the very object planned.
        let is_planned = |p: &Pod| planned.iter().any(|(q, _)| std::ptr::eq(*q, p));
        if used.fits_in(&h.capacity).is_err() && pods_on.iter().any(|p| is_planned(p)) {
            errors.push(format!("{name} overcommitted: {used:?} > {:?}", h.capacity));
        }
        // Only newcomers are the plan's doing; running pods are as they are.
        for (i, p) in pods_on.iter().enumerate() {
            let is_planned = is_planned(p);
            for (j, q) in pods_on.iter().enumerate() {
                if i == j || !is_planned {
                    continue;
                }
                for hp in &p.host_ports {
                    if q.host_ports.iter().any(|x| x.port == hp.port && x.protocol == hp.protocol) {
                        errors.push(format!("{name}: host port {} taken by {} and {}", hp.port, p.key(), q.key()));
                    }
                }
            }
        }
    }

    let host_of = |p: &Pod| -> Option<String> {
        p.node_name.clone().filter(|_| p.occupies_node()).or_else(|| planned.iter().find(|(q, _)| q.key() == p.key()).map(|(_, h)| h.clone()))
    };
    let domain = |host: &str, key: &str| hosts.get(host).and_then(|h| h.labels.get(key).cloned());
    let everyone: Vec<(&Pod, String)> = snap.pods.iter().filter_map(|p| host_of(p).map(|h| (p, h))).collect();

    for (pod, host) in &planned {
        let h = &hosts[host];
        if !selector_ok(pod, &h.labels, host) {
            errors.push(format!("{} on {host} breaks its node selector or affinity", pod.key()));
        }
        for t in &h.taints {
            if t.effect != TaintEffect::PreferNoSchedule && !tolerated(pod, t) {
                errors.push(format!("{} on {host} does not tolerate {t}", pod.key()));
            }
        }
        if h.cordoned {
            errors.push(format!("{} on cordoned {host}", pod.key()));
        }
        for term in &pod.pod_anti_affinity {
            let mine = domain(host, &term.topology_key);
            for (other, oh) in &everyone {
                if other.key() != pod.key() && mine.is_some() && domain(oh, &term.topology_key) == mine && term_matches(term, &pod.namespace, other) {
                    errors.push(format!("{} anti-affinity broken by {} on {}", pod.key(), other.key(), term.topology_key));
                }
            }
        }
        // Symmetry: running pods' anti-affinity must not be broken by newcomers.
        for (other, oh) in &everyone {
            if other.key() == pod.key() {
                continue;
            }
            for term in &other.pod_anti_affinity {
                let theirs = domain(oh, &term.topology_key);
                if theirs.is_some() && domain(host, &term.topology_key) == theirs && term_matches(term, &other.namespace, pod) {
                    errors.push(format!("{} breaks the anti-affinity of {}", pod.key(), other.key()));
                }
            }
        }
        for term in &pod.pod_affinity {
            let mine = domain(host, &term.topology_key);
            let partner = everyone
                .iter()
                .any(|(o, oh)| o.key() != pod.key() && term_matches(term, &pod.namespace, o) && domain(oh, &term.topology_key) == mine);
            let alone =
                term_matches(term, &pod.namespace, pod) && everyone.iter().filter(|(o, _)| term_matches(term, &pod.namespace, o)).count() == 1;
            if mine.is_none() || !(partner || alone) {
                errors.push(format!("{} affinity on {} unmet", pod.key(), term.topology_key));
            }
        }
        for s in &pod.topology_spread {
            let sel = s.label_selector.clone();
            let group_member = |o: &Pod| o.namespace == pod.namespace && sel.as_ref().is_some_and(|x| x.matches(&o.labels));
            let same_spread = |o: &Pod| group_member(o) && o.topology_spread.iter().any(|t| t == s);
            let is_node = |name: &str| snap.nodes.iter().any(|n| n.name == name);
            let eligible = |name: &str, h: &Host| {
                h.labels.contains_key(&s.topology_key)
                    && selector_ok(pod, &h.labels, name)
                    && h.taints.iter().all(|t| t.effect == TaintEffect::PreferNoSchedule || tolerated(pod, t))
            };
            // Some order of bindings must keep every step within the skew.
            // Pods on Ready nodes may bind now, when kube-scheduler weighs
            // only the domains of Ready nodes, or later; pods on claims bind
            // once the claims join, weighed then against those domains and
            // the claims' that hold pods of the spread. Greedy: free riders
            // first, then the pod going to the emptiest domain.
            let mut counts: BTreeMap<String, i64> = BTreeMap::new();
            for (name, h) in &hosts {
                if is_node(name) && eligible(name, h) {
                    counts.insert(h.labels[&s.topology_key].clone(), 0);
                }
            }
            let planned_here = |o: &Pod| planned.iter().any(|(q, _)| q.key() == o.key());
            let mut now: Vec<(&Pod, String)> = Vec::new();
            let mut later: Vec<(&Pod, String)> = Vec::new();
            for (o, oh) in &everyone {
                if !group_member(o) {
                    continue;
                }
                let Some(d) = domain(oh, &s.topology_key) else { continue };
                if !planned_here(o) {
                    if let Some(c) = counts.get_mut(&d) {
                        *c += 1;
                    }
                } else if is_node(oh) {
                    now.push((o, d));
                } else {
                    later.push((o, d));
                }
            }
            let bind = |counts: &mut BTreeMap<String, i64>, waiting: &mut Vec<(&Pod, String)>, must_finish: bool| -> bool {
                while !waiting.is_empty() {
                    let min = counts.values().min().copied().unwrap_or(0);
                    let next = waiting
                        .iter()
                        .enumerate()
                        .filter(|(_, (o, d))| !same_spread(o) || counts.get(d).is_none_or(|c| c + 1 - min <= s.max_skew as i64))
                        .min_by_key(|(_, (o, d))| (same_spread(o), counts.get(d).copied().unwrap_or(0)))
                        .map(|(i, _)| i);
                    let Some(i) = next else { return !must_finish };
                    let (_, d) = waiting.remove(i);
                    if let Some(c) = counts.get_mut(&d) {
                        *c += 1;
                    }
                }
                true
            };
            bind(&mut counts, &mut now, false);
            for (name, h) in &hosts {
                let holds_group = later.iter().any(|(o, _)| host_of(o).as_deref() == Some(name.as_str()));
                if !is_node(name) && holds_group && eligible(name, h) {
                    counts.entry(h.labels[&s.topology_key].clone()).or_insert(0);
                }
            }
            later.append(&mut now);
            if !bind(&mut counts, &mut later, true) {
                let waiting: Vec<(String, String)> = later.iter().map(|(o, d)| (o.key(), d.clone())).collect();
                errors.push(format!(
                    "{} spread on {} skewed: no binding order fits; reached {counts:?}, waiting {waiting:?}",
                    pod.key(),
                    s.topology_key
                ));
            }
        }
    }

    // Limits and the power budget, recomputed from scratch.
    for pool in &snap.pools {
        let mut cpu = 0;
        let mut gpus = 0;
        let mut count = 0;
        for s in &snap.servers {
            let in_pool_now = (s.node.is_some() || s.claim.is_some())
                && snap
                    .pools
                    .iter()
                    .filter(|p| p.requirements.iter().all(|r| r.matches(&s.labels)))
                    .max_by(|a, b| a.weight.cmp(&b.weight).then(b.name.cmp(&a.name)))
                    .map(|p| &p.name)
                    == Some(&pool.name);
            let new_here = plan.claims.iter().any(|c| c.server == s.name && c.pool == pool.name);
            if in_pool_now || new_here {
                cpu += s.capacity.cpu_milli;
                gpus += s.capacity.gpus();
                count += 1;
            }
        }
        let opened_here = plan.claims.iter().any(|c| c.pool == pool.name);
        if opened_here {
            if pool.limits.cpu_milli.is_some_and(|l| cpu > l) {
                errors.push(format!("pool {} over cpu limit: {cpu}", pool.name));
            }
            if pool.limits.gpus.is_some_and(|l| gpus > l) {
                errors.push(format!("pool {} over gpu limit: {gpus}", pool.name));
            }
            if pool.limits.servers.is_some_and(|l| count > l) {
                errors.push(format!("pool {} over server limit: {count}", pool.name));
            }
        }
    }
    if let Some(budget) = snap.power_budget_watts {
        let on: f64 = snap
            .servers
            .iter()
            .filter(|s| s.power_state == PowerState::On || s.node.is_some() || s.claim.is_some())
            .map(|s| s.power.peak_watts)
            .sum();
        let cold: f64 = plan.claims.iter().filter(|c| c.path == SupplyPath::Cold).map(|c| servers[c.server.as_str()].power.peak_watts).sum();
        if cold > 0.0 && on + cold > budget {
            errors.push(format!("power budget {budget} crossed: {on} on + {cold} powering on"));
        }
    }
    errors
}
