//! Inter-pod constraints through the provisioner, case by case: each test
//! is a small cluster and the placement kube-scheduler would make.

use ironclaim_core::*;

const GI: i64 = 1 << 30;
const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

fn node(name: &str, zone: Option<&str>) -> Node {
    let n = Node::new(name, Resources::new(16_000, 64 * GI).with_pods(110));
    match zone {
        Some(z) => n.with_labels(&[(ZONE, z)]),
        None => n,
    }
}

fn pod(name: &str, app: &str) -> Pod {
    Pod::new("default", name, Resources::new(1000, GI)).with_labels(&[("app", app)])
}

fn term(app: &str, key: &str) -> PodAffinityTerm {
    PodAffinityTerm {
        label_selector: Some(LabelSelector::matching(&[("app", app)])),
        namespaces: vec![],
        namespace_selector: None,
        topology_key: key.into(),
    }
}

fn spread(app: &str, key: &str, max_skew: u32, min_domains: Option<u32>) -> TopologySpread {
    TopologySpread { min_domains, ..TopologySpread::new(max_skew, key, Some(LabelSelector::matching(&[("app", app)]))) }
}

fn placed(snap: &Snapshot) -> Vec<(String, String)> {
    provision(snap, 0)
        .pods
        .into_iter()
        .map(|d| {
            let at = match d.outcome {
                Outcome::Existing { node } => node,
                Outcome::NewClaim { server, .. } => format!("new:{server}"),
                Outcome::InFlight { server, .. } => format!("flight:{server}"),
                Outcome::Unschedulable { reason } => format!("unschedulable:{}", reason.metric_label()),
            };
            (d.pod.trim_start_matches("default/").to_string(), at)
        })
        .collect()
}

fn at(placements: &[(String, String)], pod: &str) -> String {
    placements.iter().find(|(p, _)| p == pod).map(|(_, a)| a.clone()).unwrap_or_default()
}

#[test]
fn hostname_anti_affinity_puts_each_replica_on_its_own_node() {
    let mut snap = Snapshot { nodes: vec![node("a", None), node("b", None)], ..Default::default() };
    for i in 0..3 {
        let mut p = pod(&format!("r{i}"), "db");
        p.pod_anti_affinity.push(term("db", HOST));
        snap.pods.push(p);
    }
    let got = placed(&snap);
    let mut hosts: Vec<String> = got.iter().map(|(_, a)| a.clone()).collect();
    hosts.sort();
    assert_eq!(hosts, vec!["a", "b", "unschedulable:no_matching_hardware"], "{got:?}");
}

#[test]
fn a_running_pods_anti_affinity_repels_newcomers_it_selects() {
    let mut snap = Snapshot { nodes: vec![node("a", None), node("b", None)], ..Default::default() };
    let mut guard = pod("guard", "guard").bound_to("a");
    guard.pod_anti_affinity.push(term("noisy", HOST));
    snap.pods.push(guard);
    snap.pods.push(pod("n0", "noisy"));
    snap.pods.push(pod("q0", "quiet"));
    let got = placed(&snap);
    assert_eq!(at(&got, "n0"), "b");
    assert_eq!(at(&got, "q0"), "a");
}

#[test]
fn zone_anti_affinity_counts_the_whole_zone() {
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a")), node("a2", Some("a")), node("b1", Some("b"))], ..Default::default() };
    snap.pods.push(pod("existing", "db").bound_to("a1"));
    let mut p = pod("new", "db");
    p.pod_anti_affinity.push(term("db", ZONE));
    snap.pods.push(p);
    assert_eq!(at(&placed(&snap), "new"), "b1");
}

#[test]
fn affinity_follows_the_pods_it_selects_and_the_first_of_a_group_goes_anywhere() {
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a")), node("b1", Some("b"))], ..Default::default() };
    snap.pods.push(pod("cache", "cache").bound_to("b1"));
    let mut web = pod("web", "web");
    web.pod_affinity.push(term("cache", ZONE));
    snap.pods.push(web);
    // Self-affinity: the first may go anywhere, the rest follow it.
    for i in 0..3 {
        let mut p = pod(&format!("g{i}"), "gang");
        p.pod_affinity.push(term("gang", ZONE));
        snap.pods.push(p);
    }
    let got = placed(&snap);
    assert_eq!(at(&got, "web"), "b1");
    let zones: Vec<String> = (0..3).map(|i| at(&got, &format!("g{i}"))).collect();
    assert!(zones.iter().all(|z| z == &zones[0]), "{got:?}");
}

#[test]
fn affinity_to_pods_that_do_not_exist_is_unschedulable() {
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a"))], ..Default::default() };
    let mut p = pod("web", "web");
    p.pod_affinity.push(term("cache", ZONE));
    snap.pods.push(p);
    assert!(at(&placed(&snap), "web").starts_with("unschedulable"));
}

#[test]
fn affinity_needs_the_topology_key_on_the_node() {
    let mut snap = Snapshot { nodes: vec![node("nozone", None)], ..Default::default() };
    let mut p = pod("g0", "gang");
    p.pod_affinity.push(term("gang", ZONE));
    snap.pods.push(p);
    assert!(at(&placed(&snap), "g0").starts_with("unschedulable"));
}

#[test]
fn zone_spread_keeps_the_skew_within_max_skew() {
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a")), node("b1", Some("b")), node("c1", Some("c"))], ..Default::default() };
    for i in 0..6 {
        let mut p = pod(&format!("s{i}"), "web");
        p.topology_spread.push(spread("web", ZONE, 1, None));
        snap.pods.push(p);
    }
    let got = placed(&snap);
    for n in ["a1", "b1", "c1"] {
        assert_eq!(got.iter().filter(|(_, a)| a == n).count(), 2, "{got:?}");
    }
}

#[test]
fn spread_counts_only_domains_the_pod_may_use() {
    // Zone c is excluded by node affinity, so it does not hold the minimum at zero.
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a")), node("b1", Some("b")), node("c1", Some("c"))], ..Default::default() };
    for i in 0..4 {
        let mut p = pod(&format!("s{i}"), "web");
        p.topology_spread.push(spread("web", ZONE, 1, None));
        p.node_affinity = vec![NodeSelectorTerm { match_expressions: vec![Requirement::new(ZONE, Operator::In, &["a", "b"])], match_fields: vec![] }];
        snap.pods.push(p);
    }
    let got = placed(&snap);
    assert_eq!(got.iter().filter(|(_, a)| a == "a1").count(), 2, "{got:?}");
    assert_eq!(got.iter().filter(|(_, a)| a == "b1").count(), 2, "{got:?}");
}

#[test]
fn min_domains_holds_the_minimum_at_zero_until_enough_domains_exist() {
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a")), node("b1", Some("b"))], ..Default::default() };
    for i in 0..4 {
        let mut p = pod(&format!("s{i}"), "web");
        p.topology_spread.push(spread("web", ZONE, 1, Some(3)));
        snap.pods.push(p);
    }
    let got = placed(&snap);
    // With two domains and minDomains 3, each zone takes at most maxSkew.
    assert_eq!(got.iter().filter(|(_, a)| a.starts_with("unschedulable")).count(), 2, "{got:?}");
}

#[test]
fn spread_with_schedule_anyway_never_blocks() {
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a"))], ..Default::default() };
    for i in 0..3 {
        let mut p = pod(&format!("s{i}"), "web");
        let mut s = spread("web", ZONE, 1, Some(5));
        s.when_unsatisfiable = WhenUnsatisfiable::ScheduleAnyway;
        p.topology_spread.push(s);
        snap.pods.push(p);
    }
    assert!(placed(&snap).iter().all(|(_, a)| a == "a1"));
}

#[test]
fn anti_affinity_terms_select_in_their_namespaces_only() {
    let mut snap = Snapshot { nodes: vec![node("a", None)], ..Default::default() };
    let mut other = pod("other-db", "db").bound_to("a");
    other.namespace = "other".into();
    snap.pods.push(other);
    let mut p = pod("db", "db");
    p.pod_anti_affinity.push(term("db", HOST));
    snap.pods.push(p.clone());
    assert_eq!(at(&placed(&snap), "db"), "a", "a pod in another namespace does not count");
    p.name = "db-all".into();
    p.pod_anti_affinity[0].namespace_selector = Some(Default::default());
    snap.pods.retain(|q| q.name != "db");
    snap.pods.push(p);
    assert!(at(&placed(&snap), "db-all").starts_with("unschedulable"));
}

#[test]
fn new_servers_host_one_hostname_spread_pod_each_while_fresh_hosts_remain() {
    let mut snap = Snapshot::default();
    for i in 0..3 {
        snap.servers.push(Server::new(&format!("s{i}"), Resources::new(32_000, 128 * GI).with_pods(110)));
    }
    for i in 0..4 {
        let mut p = pod(&format!("h{i}"), "web");
        p.topology_spread.push(spread("web", HOST, 1, None));
        snap.pods.push(p);
    }
    let got = placed(&snap);
    let mut servers: Vec<String> = got.iter().map(|(_, a)| a.clone()).collect();
    servers.sort();
    // Three fresh hosts take one each; once none is left, the fourth may join one.
    assert_eq!(servers.iter().filter(|s| s.starts_with("new:")).count(), 4, "{got:?}");
    servers.dedup();
    assert_eq!(servers.len(), 3, "{got:?}");
}

/// The nodes `pending` fits among the snapshot's, one probe per node: a copy
/// that only that node can take (it asks for the node's own resource).
fn feasible(snap: &Snapshot, pending: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    for n in &snap.nodes {
        let mut s = snap.clone();
        for node in &mut s.nodes {
            node.allocatable.set_extended(&format!("probe/{}", node.name), 1);
        }
        let mut probe = pending.clone();
        probe.requests.set_extended(&format!("probe/{}", n.name), 1);
        s.pods.push(probe);
        if let Some(Outcome::Existing { node }) = provision(&s, 0).decision(&pending.key()).map(|d| d.outcome.clone()) {
            out.push(node);
        }
    }
    out
}

fn labelled(name: &str, labels: &[(&str, &str)]) -> Node {
    Node::new(name, Resources::new(16_000, 64 * GI).with_pods(110)).with_labels(labels)
}

/// Each case is a disagreement the agreement check found (or a rule read
/// in kube-scheduler's filter plugins at v1.37), with the nodes
/// kube-scheduler accepts.
#[test]
fn cases_where_ironclaim_and_kube_scheduler_once_disagreed() {
    type Case = (&'static str, Snapshot, Pod, Vec<&'static str>);
    let mut cases: Vec<Case> = Vec::new();

    // NodeResourcesFit: a node that reports no pod slots takes no pod.
    {
        let mut full = labelled("full", &[]);
        full.allocatable.pods = 0;
        let snap = Snapshot { nodes: vec![full, labelled("room", &[])], ..Default::default() };
        cases.push(("a node reporting zero pod slots", snap, pod("p", "web"), vec!["room"]));
    }
    // PodTopologySpread: a node lacking any constraint's key is no domain of
    // any constraint, and its pods are not counted.
    {
        let mut snap = Snapshot {
            nodes: vec![
                labelled("zone-rack", &[(ZONE, "a"), ("rack", "r1")]),
                labelled("zone-only", &[(ZONE, "a")]),
                labelled("other-zone", &[(ZONE, "b")]),
            ],
            ..Default::default()
        };
        snap.pods.push(pod("w", "web").bound_to("zone-only"));
        let mut p = pod("p", "web");
        for key in [ZONE, "rack"] {
            p.topology_spread.push(TopologySpread::new(1, key, Some(LabelSelector::matching(&[("app", "web")]))));
        }
        cases.push(("spread counts only nodes with every key", snap, p, vec!["zone-rack"]));
    }
    // PodTopologySpread: an empty selector counts no pod, yet the pod
    // matches it itself.
    {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[(ZONE, "a")]), labelled("b", &[(ZONE, "b")])], ..Default::default() };
        snap.pods.push(pod("w1", "web").bound_to("a"));
        snap.pods.push(pod("w2", "web").bound_to("a"));
        let mut p = pod("p", "web");
        p.topology_spread.push(TopologySpread::new(1, ZONE, Some(LabelSelector::default())));
        cases.push(("spread with an empty selector", snap, p, vec!["a", "b"]));
    }
    // PodTopologySpread: terminating pods are not counted.
    {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[(ZONE, "a")]), labelled("b", &[(ZONE, "b")])], ..Default::default() };
        let mut leaving = pod("w", "web").bound_to("a");
        leaving.terminating = true;
        snap.pods.push(leaving);
        snap.pods.push(pod("x", "web").bound_to("a"));
        let mut p = pod("p", "web");
        p.topology_spread.push(TopologySpread::new(1, ZONE, Some(LabelSelector::matching(&[("app", "web")]))));
        cases.push(("spread does not count terminating pods", snap, p, vec!["b"]));
    }
    // PodTopologySpread: nodeTaintsPolicy Honor drops a tainted node as a
    // domain; Ignore (the default) keeps it, at zero.
    for (policy, want) in [(InclusionPolicy::Ignore, vec![]), (InclusionPolicy::Honor, vec!["a"])] {
        let mut tainted = labelled("t", &[(ZONE, "t")]);
        tainted.taints.push(Taint::new("dedicated", "x", TaintEffect::NoSchedule));
        let mut snap = Snapshot { nodes: vec![labelled("a", &[(ZONE, "a")]), tainted], ..Default::default() };
        snap.pods.push(pod("w", "web").bound_to("a"));
        let mut p = pod("p", "web");
        p.topology_spread
            .push(TopologySpread { node_taints_policy: policy, ..TopologySpread::new(1, ZONE, Some(LabelSelector::matching(&[("app", "web")]))) });
        cases.push(("nodeTaintsPolicy", snap, p, want));
    }
    // PodTopologySpread: nodeAffinityPolicy Ignore keeps a node the pod's
    // selector excludes as a domain.
    for (policy, want) in [(InclusionPolicy::Honor, vec!["a"]), (InclusionPolicy::Ignore, vec![])] {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[(ZONE, "a"), ("disk", "ssd")]), labelled("b", &[(ZONE, "b")])], ..Default::default() };
        snap.pods.push(pod("w", "web").bound_to("a"));
        let mut p = pod("p", "web").with_node_selector(&[("disk", "ssd")]);
        p.topology_spread
            .push(TopologySpread { node_affinity_policy: policy, ..TopologySpread::new(1, ZONE, Some(LabelSelector::matching(&[("app", "web")]))) });
        cases.push(("nodeAffinityPolicy", snap, p, want));
    }
    // InterPodAffinity: several required terms need one pod matching all.
    {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[(ZONE, "a")]), labelled("b", &[(ZONE, "b")])], ..Default::default() };
        snap.pods.push(pod("web", "web").bound_to("a"));
        snap.pods.push(Pod::new("default", "front", Resources::new(100, GI)).with_labels(&[("tier", "front")]).bound_to("a"));
        snap.pods.push(Pod::new("default", "both", Resources::new(100, GI)).with_labels(&[("app", "web"), ("tier", "front")]).bound_to("b"));
        let mut p = pod("p", "other");
        p.pod_affinity.push(term("web", ZONE));
        p.pod_affinity.push(PodAffinityTerm { label_selector: Some(LabelSelector::matching(&[("tier", "front")])), ..term("web", ZONE) });
        cases.push(("pod affinity terms need one pod matching all", snap, p, vec!["b"]));
    }
    // InterPodAffinity: the first pod of a self-affine group goes anywhere
    // only while no pod anywhere (on a node with the key) matches.
    {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[(ZONE, "a")]), labelled("b", &[])], ..Default::default() };
        snap.pods.push(pod("w", "web").bound_to("b"));
        let mut p = pod("p", "web");
        p.pod_affinity.push(term("web", ZONE));
        cases.push(("a matching pod on a node without the key", snap, p, vec!["a"]));
    }
    // InterPodAffinity: namespaceSelector reads namespace labels, ORed with
    // the names listed.
    {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[]), labelled("b", &[])], ..Default::default() };
        snap.namespaces.insert("team-red".into(), [("team".to_string(), "red".to_string())].into_iter().collect());
        snap.namespaces.insert("team-blue".into(), [("team".to_string(), "blue".to_string())].into_iter().collect());
        let mut red = pod("r", "db").bound_to("a");
        red.namespace = "team-red".into();
        let mut blue = pod("b", "db").bound_to("b");
        blue.namespace = "team-blue".into();
        snap.pods.extend([red, blue]);
        let mut p = pod("p", "web");
        p.pod_anti_affinity.push(PodAffinityTerm { namespace_selector: Some(LabelSelector::matching(&[("team", "red")])), ..term("db", HOST) });
        cases.push(("namespaceSelector by namespace labels", snap, p, vec!["b"]));
    }
    // InterPodAffinity: pods on a NotReady node still repel.
    {
        let mut gone = labelled("gone", &[(ZONE, "a")]);
        gone.ready = false;
        let mut snap = Snapshot { nodes: vec![gone, labelled("a", &[(ZONE, "a")]), labelled("b", &[(ZONE, "b")])], ..Default::default() };
        snap.pods.push(pod("db", "db").bound_to("gone"));
        let mut p = pod("p", "web");
        p.pod_anti_affinity.push(term("db", ZONE));
        cases.push(("pods on a NotReady node repel", snap, p, vec!["b"]));
    }
    // kube-scheduler reads no Ready condition: a NotReady node takes a pod
    // that tolerates its not-ready taint.
    {
        let mut gone = labelled("gone", &[]);
        gone.ready = false;
        let snap = Snapshot { nodes: vec![gone, labelled("a", &[])], ..Default::default() };
        let mut p = pod("p", "web");
        p.tolerations.push(Toleration::exists(""));
        cases.push(("a NotReady node and a pod tolerating everything", snap.clone(), p, vec!["gone", "a"]));
        cases.push(("a NotReady node and a pod tolerating nothing", snap, pod("q", "web"), vec!["a"]));
    }
    // NodePorts: "::" is no wildcard.
    {
        let mut snap = Snapshot { nodes: vec![labelled("a", &[])], ..Default::default() };
        let mut holder = pod("h", "x").bound_to("a");
        holder.host_ports.push(HostPort { port: 80, protocol: "TCP".into(), host_ip: "::".into() });
        snap.pods.push(holder);
        let mut p = pod("p", "web");
        p.host_ports.push(HostPort { port: 80, protocol: "TCP".into(), host_ip: "10.0.0.1".into() });
        cases.push(("host port on ::", snap, p, vec!["a"]));
    }

    let mut wrong = Vec::new();
    for (name, snap, p, want) in cases {
        let got = feasible(&snap, &p);
        if got != want {
            wrong.push(format!("{name}: kube-scheduler {want:?}, ironclaim {got:?}"));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

#[test]
fn a_gated_pod_is_not_demand() {
    let mut p = pod("p", "web");
    p.scheduling_gated = true;
    let snap = Snapshot { nodes: vec![labelled("a", &[])], pods: vec![p].into(), ..Default::default() };
    assert!(provision(&snap, 0).pods.is_empty(), "kube-scheduler does not try a gated pod, so nothing is planned for it");
}

#[test]
fn min_domains_opens_only_the_server_of_the_missing_zone() {
    // Ready nodes in zone a only, cold servers in zones a and b, replicas
    // spread by zone with minDomains 2. Until a second zone exists, each
    // zone may hold one replica. Once zone b's server is a node, the rest
    // fit zone a within the skew: one server is enough.
    let mut snap = Snapshot { nodes: vec![node("a1", Some("a")), node("a2", Some("a"))], ..Default::default() };
    for (name, zone) in [("cold-a", "a"), ("cold-b", "b")] {
        snap.servers.push(Server::new(name, Resources::new(32_000, 128 * GI).with_pods(110)).with_labels(&[(ZONE, zone)]));
    }
    for i in 0..4 {
        let mut p = pod(&format!("r{i}"), "web");
        p.created_s = i;
        p.topology_spread.push(spread("web", ZONE, 1, Some(2)));
        snap.pods.push(p);
    }
    let got = placed(&snap);
    let opened: std::collections::BTreeSet<&str> = got.iter().filter_map(|(_, a)| a.strip_prefix("new:")).collect();
    assert_eq!(opened, ["cold-b"].into_iter().collect(), "{got:?}");
    let in_a = got.iter().filter(|(_, a)| a.starts_with("a")).count();
    assert_eq!(in_a, 2, "two replicas in zone a, two on zone b's server: {got:?}");
}

/// A pod that names its host, by the hostname label or by the node's name,
/// joins a claim only when the claim's server is that host: a claim's
/// labels are its offering's with a hostname of its own, so the check
/// made once per offering does not answer for it.
#[test]
fn a_pod_that_names_its_host_joins_only_that_hosts_claim() {
    let mut snap = Snapshot::default();
    for i in 0..3 {
        snap.servers.push(Server::new(&format!("s{i}"), Resources::new(32_000, 128 * GI).with_pods(110)));
    }
    snap.pods.push(pod("first", "web"));
    let host = at(&placed(&snap), "first").trim_start_matches("new:").to_string();
    assert!(!host.is_empty() && !host.starts_with("unschedulable"), "{host}");
    let other = if host == "s0" { "s1" } else { "s0" };
    let names = |key: &str, fields: bool, value: &str| {
        let r = Requirement::new(key, Operator::In, &[value]);
        let t = if fields {
            NodeSelectorTerm { match_expressions: vec![], match_fields: vec![r] }
        } else {
            NodeSelectorTerm { match_expressions: vec![r], match_fields: vec![] }
        };
        vec![t]
    };
    for (i, (key, fields)) in [(HOST, false), ("metadata.name", true)].into_iter().enumerate() {
        let mut s = snap.clone();
        let mut mine = pod(&format!("mine{i}"), "web");
        mine.node_affinity = names(key, fields, &host);
        let mut elsewhere = pod(&format!("elsewhere{i}"), "web");
        elsewhere.node_affinity = names(key, fields, other);
        s.pods.push(mine);
        s.pods.push(elsewhere);
        let got = placed(&s);
        assert_eq!(at(&got, &format!("mine{i}")), format!("new:{host}"), "{key}: {got:?}");
        assert!(!at(&got, &format!("elsewhere{i}")).ends_with(&format!(":{host}")), "{key}: {got:?}");
    }
}
