//! Scale-down decisions: break-even, warm floors, budgets, PDBs, and
//! properties that hold on random fleets.

use ironclaim_core::disruption::{break_even_s, disrupt, Action};
use ironclaim_core::warm;
use ironclaim_core::provision::{NODEPOOL_LABEL, SERVER_LABEL};
use ironclaim_core::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const GI: i64 = 1 << 30;
const HOUR: u64 = 3600;

fn pool() -> NodePool {
    let mut p = NodePool::new("general");
    p.disruption.budgets = vec![Budget { nodes: BudgetNodes::Percent(100), window: None, reasons: vec![] }];
    p
}

fn server(name: &str) -> Server {
    let mut s = Server::new(name, Resources::new(32_000, 128 * GI).with_pods(110)).with_labels(&[(CLASS_LABEL, "general-32")]);
    s.power = PowerProfile { idle_watts: 170.0, peak_watts: 420.0, boot_watts: 260.0, off_watts: 8.0 };
    s
}

/// A server that is a node, with the node and `pods` running on it.
fn node_with(snap: &mut Snapshot, name: &str, idle_since: Option<u64>, pods: &[(&str, i64)]) {
    let mut s = server(name);
    s.power_state = PowerState::On;
    s.node = Some(name.into());
    s.idle_since_s = idle_since;
    let mut n = Node::new(name, s.capacity.clone()).with_labels(&[(NODEPOOL_LABEL, "general"), (SERVER_LABEL, name)]);
    n.server = Some(name.into());
    snap.nodes.push(n);
    snap.servers.push(s);
    for (pod, cpu) in pods {
        let mut p = Pod::new("app", pod, Resources::new(*cpu, GI)).with_labels(&[("app", "web")]).bound_to(name);
        p.owner = Some(Owner { kind: "ReplicaSet".into(), name: "web".into() });
        snap.pods.push(p);
    }
}

fn spare(snap: &mut Snapshot, name: &str, idle_since: u64) {
    let mut s = server(name).warm();
    s.idle_since_s = Some(idle_since);
    snap.servers.push(s);
}

#[test]
fn an_idle_spare_is_powered_off_only_after_its_break_even_time() {
    let mut snap = Snapshot { pools: vec![pool()], ..Default::default() };
    spare(&mut snap, "s1", 0);
    let be = break_even_s(&snap.servers[0]);
    let early = disrupt(&snap, be - 1);
    assert!(early.actions.is_empty(), "{early:?}");
    assert!(early.held[0].why.contains("break-even"));
    let late = disrupt(&snap, be);
    assert!(matches!(&late.actions[..], [Action::PowerOff { server, .. }] if server == "s1"));
}

#[test]
fn the_warm_floor_keeps_spares_on_and_restores_itself() {
    let mut p = pool();
    p.warm.floor.insert("general-32".into(), 1);
    let mut snap = Snapshot { pools: vec![p], ..Default::default() };
    spare(&mut snap, "s1", 0);
    spare(&mut snap, "s2", 100);
    let d = disrupt(&snap, 10 * HOUR);
    let offs: Vec<&Action> = d.actions.iter().filter(|a| matches!(a, Action::PowerOff { .. })).collect();
    // The one idle longest goes; one stays for the floor.
    assert!(matches!(offs[..], [Action::PowerOff { server, .. }] if server == "s1"), "{d:?}");

    let mut cold_only = snap.clone();
    for s in &mut cold_only.servers {
        s.power_state = PowerState::Off;
    }
    let d = disrupt(&cold_only, 10 * HOUR);
    assert!(matches!(&d.actions[..], [Action::PowerOn { floor: 1, on: 0, .. }]), "{d:?}");
}

#[test]
fn empty_nodes_drain_one_at_a_time_under_a_one_node_budget() {
    let mut p = pool();
    p.disruption.budgets = vec![Budget { nodes: BudgetNodes::Count(1), window: None, reasons: vec![] }];
    let mut snap = Snapshot { pools: vec![p], ..Default::default() };
    for i in 0..10 {
        node_with(&mut snap, &format!("n{i}"), Some(0), &[]);
    }
    let d = disrupt(&snap, 10 * HOUR);
    assert_eq!(d.actions.iter().filter(|a| matches!(a, Action::Drain { .. })).count(), 1, "{d:?}");
    snap.nodes[0].disrupting = true;
    let d = disrupt(&snap, 10 * HOUR);
    assert_eq!(d.actions.iter().filter(|a| matches!(a, Action::Drain { .. })).count(), 0, "{d:?}");
}

#[test]
fn consolidate_after_only_lengthens_the_wait() {
    let mut p = pool();
    p.disruption.consolidate_after_s = Some(2 * HOUR);
    let mut snap = Snapshot { pools: vec![p], ..Default::default() };
    node_with(&mut snap, "n0", Some(0), &[]);
    assert!(disrupt(&snap, HOUR).actions.is_empty());
    assert_eq!(disrupt(&snap, 2 * HOUR).actions.len(), 1);
}

#[test]
fn an_underutilized_node_is_drained_when_its_pods_fit_elsewhere() {
    let mut snap = Snapshot { pools: vec![pool()], ..Default::default() };
    node_with(&mut snap, "busy", None, &[("a", 20_000)]);
    node_with(&mut snap, "light", None, &[("b", 2000), ("c", 2000)]);
    let d = disrupt(&snap, HOUR);
    match &d.actions[..] {
        [Action::Drain { node, reason: DisruptionReason::Underutilized, evict, .. }] => {
            assert_eq!(node, "light");
            assert_eq!(evict.len(), 2);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pdb_with_no_disruptions_left_and_do_not_disrupt_pods_hold_the_drain() {
    let mut snap = Snapshot { pools: vec![pool()], ..Default::default() };
    node_with(&mut snap, "busy", None, &[("a", 20_000)]);
    node_with(&mut snap, "light", None, &[("b", 2000)]);
    snap.pdbs.push(PodDisruptionBudget {
        namespace: "app".into(),
        name: "web".into(),
        selector: LabelSelector::matching(&[("app", "web")]),
        disruptions_allowed: 0,
    });
    let d = disrupt(&snap, HOUR);
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.held.iter().any(|h| h.why.contains("PodDisruptionBudget app/web")));

    snap.pdbs.clear();
    snap.pods.iter_mut().find(|p| p.name == "b").unwrap().do_not_disrupt = true;
    let d = disrupt(&snap, HOUR);
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.held.iter().any(|h| h.why.contains("must not be disrupted")));
}

#[test]
fn a_node_whose_pods_fit_nowhere_else_stays() {
    let mut snap = Snapshot { pools: vec![pool()], ..Default::default() };
    node_with(&mut snap, "a", None, &[("x", 10_000)]);
    node_with(&mut snap, "b", None, &[("y", 10_000)]);
    snap.nodes[1].allocatable = Resources::new(12_000, 128 * GI).with_pods(110);
    // a is underused (10 of 32) but 10 more do not fit b's 12; b is busy (10 of 12).
    let d = disrupt(&snap, HOUR);
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.held.iter().any(|h| h.subject == "a" && h.why.contains("do not all fit")), "{d:?}");
}

#[test]
fn headroom_keeps_an_empty_node_on_and_powers_a_spare_on_when_short() {
    let mut p = pool();
    p.warm.headroom = Some(Resources::new(8000, 16 * GI));
    let mut snap = Snapshot { pools: vec![p], ..Default::default() };
    node_with(&mut snap, "n0", Some(0), &[]);
    let d = disrupt(&snap, 10 * HOUR);
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.held.iter().any(|h| h.subject == "n0" && h.why.contains("headroom")), "{d:?}");

    // Busy nodes, no spare: the pool is short and a cold server comes on.
    let mut snap = Snapshot { pools: snap.pools.clone(), ..Default::default() };
    node_with(&mut snap, "busy", None, &[("a", 30_000)]);
    snap.servers.push(server("cold-1"));
    let d = disrupt(&snap, 10 * HOUR);
    match &d.actions[..] {
        [Action::PowerOnForHeadroom { server, pool, short }] => {
            assert_eq!((server.as_str(), pool.as_str()), ("cold-1", "general"));
            assert!(short.contains("cpu 6"), "{short}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_adaptive_floor_powers_spares_on_for_urgent_fresh_demand() {
    let mut p = pool();
    p.warm.adaptive = Some(AdaptiveFloor::new(4 * HOUR));
    p.warm.floor.insert("general-32".into(), 1);
    let mut snap = Snapshot { pools: vec![p], ..Default::default() };
    for i in 0..8 {
        snap.servers.push(server(&format!("cold{i}")));
    }
    let cold = snap.servers[0].durations.cold_s();
    let floor = |snap: &Snapshot| warm::floors(snap, 2 * HOUR)[&("general".to_string(), "general-32".to_string())];
    assert_eq!(floor(&snap), 1, "no demand: the static floor");
    // 30 urgent fresh servers over two hours.
    snap.arrivals = (0..30).map(|k| Arrival { at_s: k * 240, server: format!("cold{}", k % 8), deadline_s: Some(60) }).collect();
    let m = 30.0 * cold as f64 / (2 * HOUR) as f64;
    let want = (m + m.sqrt()).ceil() as u32;
    assert!(want > 1);
    assert_eq!(floor(&snap), want);
    let d = disrupt(&snap, 2 * HOUR);
    let on = d.actions.iter().filter(|a| matches!(a, Action::PowerOn { floor, .. } if *floor == want)).count();
    assert_eq!(on as u32, want, "{d:?}");
    // Patient pods, and a pool without the adaptive floor, keep the static one.
    let mut patient = snap.clone();
    for a in &mut patient.arrivals {
        a.deadline_s = Some(cold);
    }
    assert_eq!(floor(&patient), 1);
    snap.pools[0].warm.adaptive = None;
    assert_eq!(floor(&snap), 1);
}

fn random_fleet(seed: u64) -> (Snapshot, u64) {
    let mut x = seed | 1;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n.max(1)
    };
    let mut p = pool();
    p.disruption.budgets = vec![Budget { nodes: BudgetNodes::Count(1 + next(3) as u32), window: None, reasons: vec![] }];
    p.warm.floor.insert("general-32".into(), next(3) as u32);
    if next(3) == 0 {
        p.warm.headroom = Some(Resources::new(4000 * next(12) as i64, GI * next(64) as i64));
    }
    let mut snap = Snapshot { pools: vec![p], ..Default::default() };
    for i in 0..next(8) {
        let pods: Vec<(String, i64)> = (0..next(4)).map(|k| (format!("p{i}-{k}"), 500 * (1 + next(12) as i64))).collect();
        let refs: Vec<(&str, i64)> = pods.iter().map(|(n, c)| (n.as_str(), *c)).collect();
        node_with(&mut snap, &format!("n{i}"), Some(next(3 * HOUR)), &refs);
        if next(5) == 0 {
            snap.nodes.last_mut().unwrap().disrupting = true;
        }
    }
    for i in 0..next(5) {
        spare(&mut snap, &format!("s{i}"), next(3 * HOUR));
    }
    for i in 0..next(3) {
        snap.servers.push(server(&format!("cold{i}")));
    }
    for p in snap.pods.iter_mut() {
        if next(6) == 0 {
            p.do_not_disrupt = true;
        }
    }
    if next(2) == 0 {
        snap.pdbs.push(PodDisruptionBudget {
            namespace: "app".into(),
            name: "web".into(),
            selector: LabelSelector::matching(&[("app", "web")]),
            disruptions_allowed: next(3) as i64,
        });
    }
    (snap, 3 * HOUR + next(2 * HOUR))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn no_plan_crosses_a_pdb_a_floor_or_a_budget(seed in any::<u64>()) {
        let (snap, now) = random_fleet(seed);
        let d = disrupt(&snap, now);
        let pods: BTreeMap<String, &Pod> = snap.pods.iter().map(|p| (p.key(), p)).collect();
        let mut evictions_by_pdb = vec![0i64; snap.pdbs.len()];
        let mut drains = 0u32;
        let mut offs = 0u32;
        for a in &d.actions {
            match a {
                Action::Drain { node, evict, .. } => {
                    drains += 1;
                    // Never a node with a pod that must stay, never a pod left behind.
                    for p in snap.pods.iter().filter(|p| p.node_name.as_deref() == Some(node) && !p.is_daemonset_pod()) {
                        prop_assert!(!p.do_not_disrupt, "seed {seed}: drained {node} with do-not-disrupt {}", p.key());
                        prop_assert!(evict.contains(&p.key()), "seed {seed}: {} left behind on {node}", p.key());
                    }
                    for e in evict {
                        let p = pods[e];
                        for (k, pdb) in snap.pdbs.iter().enumerate() {
                            if pdb.namespace == p.namespace && pdb.selector.matches(&p.labels) {
                                evictions_by_pdb[k] += 1;
                            }
                        }
                    }
                }
                Action::PowerOff { server, .. } => {
                    offs += 1;
                    let s = snap.servers.iter().find(|s| &s.name == server).unwrap();
                    prop_assert!(s.node.is_none() && s.claim.is_none(), "seed {seed}: powered off a busy server");
                }
                Action::PowerOn { server, .. } | Action::PowerOnForHeadroom { server, .. } => {
                    let s = snap.servers.iter().find(|s| &s.name == server).unwrap();
                    prop_assert!(s.is_available() && !s.is_warm(), "seed {seed}: powered on {server}");
                }
            }
        }
        for (k, pdb) in snap.pdbs.iter().enumerate() {
            prop_assert!(evictions_by_pdb[k] <= pdb.disruptions_allowed, "seed {seed}: PDB crossed");
        }
        // Headroom: what scale-down takes away leaves the free capacity at
        // or above it, or takes nothing when it was already short.
        if let Some(want) = &snap.pools[0].warm.headroom {
            let mut free = Resources::default();
            for n in snap.nodes.iter().filter(|n| !n.disrupting) {
                free.add(&n.allocatable);
                for p in snap.pods.iter().filter(|p| p.node_name.as_deref() == Some(&n.name)) {
                    free.sub(&p.requests);
                }
            }
            for s in snap.servers.iter().filter(|s| s.is_available() && s.is_warm()) {
                free.add(&s.capacity);
            }
            let mut taken = Resources::default();
            for a in &d.actions {
                match a {
                    Action::PowerOff { server, .. } => taken.add(&snap.servers.iter().find(|s| &s.name == server).unwrap().capacity),
                    Action::Drain { node, .. } => taken.add(&snap.nodes.iter().find(|n| &n.name == node).unwrap().allocatable),
                    _ => {}
                }
            }
            let after = free.minus(&taken);
            let holds = |f: &Resources| (want.cpu_milli == 0 || f.cpu_milli >= want.cpu_milli) && (want.memory_bytes == 0 || f.memory_bytes >= want.memory_bytes);
            prop_assert!(taken.is_zero() || holds(&after), "seed {seed}: headroom {want:?} crossed: free {free:?}, taken {taken:?}");
        }
        let budget = match snap.pools[0].disruption.budgets[0].nodes { BudgetNodes::Count(n) => n, BudgetNodes::Percent(_) => u32::MAX };
        let disrupting = snap.nodes.iter().filter(|n| n.disrupting).count() as u32;
        prop_assert!(drains + disrupting <= budget.max(disrupting), "seed {seed}: budget crossed: {drains} + {disrupting} > {budget}");
        // The floor: idle capacity left on is at least min(floor, what there was).
        let floor = snap.pools[0].warm.floor["general-32"];
        let empty_nodes = snap.nodes.iter().filter(|n| !n.disrupting && !snap.pods.iter().any(|p| p.node_name.as_deref() == Some(&n.name))).count() as u32;
        let spares = snap.servers.iter().filter(|s| s.is_available() && s.is_warm()).count() as u32;
        let empty_drains = d.actions.iter().filter(|a| matches!(a, Action::Drain { reason: DisruptionReason::Empty, .. })).count() as u32;
        let before = empty_nodes + spares;
        let after = before - offs - empty_drains;
        prop_assert!(after >= floor.min(before), "seed {seed}: floor {floor} crossed: {before} -> {after}");
    }
}
