//! Gangs: servers are powered on for all of a gang's pending pods or for
//! none, and the room a gang's pods would land on is not taken away.

use ironclaim_core::disruption::{Action, disrupt};
use ironclaim_core::provision::{SERVER_LABEL, SERVERPOOL_LABEL};
use ironclaim_core::*;

const GI: i64 = 1 << 30;
const HOUR: u64 = 3600;

fn server(name: &str) -> Server {
    Server::new(name, Resources::new(32_000, 128 * GI).with_pods(110))
}

fn member(gang: &str, i: usize) -> Pod {
    let mut p = Pod::new("train", &format!("{gang}-{i}"), Resources::new(24_000, 8 * GI));
    p.gang = Some(format!("train/{gang}"));
    p
}

fn snapshot(servers: usize) -> Snapshot {
    let mut pool = ServerPool::new("general");
    pool.disruption.budgets = vec![Budget { nodes: BudgetNodes::Percent(100), window: None, reasons: vec![] }];
    Snapshot { pools: vec![pool], servers: (0..servers).map(|i| server(&format!("s{i}"))).collect(), ..Default::default() }
}

#[test]
fn a_gang_that_does_not_fit_whole_powers_nothing_on_and_others_are_decided_as_before() {
    let mut snap = snapshot(3);
    snap.pods = (0..4).map(|i| member("job", i)).collect();
    snap.pods.push(Pod::new("web", "alone", Resources::new(1_000, GI)));
    let plan = provision(&snap, 0);
    for i in 0..4 {
        match &plan.decision(&format!("train/job-{i}")).expect("decided").outcome {
            Outcome::Unschedulable { reason: Unschedulable::Gang { gang, unplaced, of, why } } => {
                assert_eq!((gang.as_str(), *unplaced, *of), ("train/job", 1, 4));
                assert!(why.contains("no matching spare"), "{why}");
            }
            other => panic!("job-{i}: {other:?}"),
        }
    }
    assert!(plan.claims.iter().all(|c| c.pods.iter().all(|p| !p.starts_with("train/"))), "{:?}", plan.claims);
    assert!(matches!(plan.decision("web/alone").unwrap().outcome, Outcome::NewClaim { .. } | Outcome::Existing { .. }), "{plan:?}");
    // Nor does it take room from the rest: three servers are free for
    // three other pods of 24 CPU, though the gang's pods would have taken
    // them first.
    let mut others = snap.clone();
    others.pods.extend((0..3).map(|i| Pod::new("web", &format!("big-{i}"), Resources::new(24_000, 8 * GI))));
    let plan = provision(&others, 0);
    for i in 0..3 {
        assert!(matches!(plan.decision(&format!("web/big-{i}")).unwrap().outcome, Outcome::NewClaim { .. }), "{plan:?}");
    }
    assert_eq!(plan.pods.len(), others.pods.len(), "one decision per pending pod");
    let text = Unschedulable::Gang { gang: "train/job".into(), unplaced: 1, of: 4, why: "x".into() }.to_string();
    assert_eq!(text, "all or nothing for train/job: 1 of its 4 pods cannot be placed (x); no server is powered on for it");

    // One more server: the whole gang is placed, a server each.
    snap.servers.push(server("s3"));
    let plan = provision(&snap, 0);
    let gang_claims = plan.claims.iter().filter(|c| c.pods.iter().any(|p| p.starts_with("train/"))).count();
    assert_eq!(gang_claims, 4, "{:?}", plan.claims);
}

#[test]
fn an_empty_node_a_gang_pod_would_land_on_is_booked_not_idle() {
    let mut snap = snapshot(0);
    let mut s = server("n0");
    s.power_state = PowerState::On;
    s.node = Some("n0".into());
    s.idle_since_s = Some(0);
    let mut n = Node::new("n0", s.capacity.clone()).with_labels(&[(SERVERPOOL_LABEL, "general"), (SERVER_LABEL, "n0")]);
    n.server = Some("n0".into());
    snap.nodes.push(n);
    snap.servers.push(s);
    let d = disrupt(&snap, 10 * HOUR);
    assert!(d.actions.iter().any(|a| matches!(a, Action::Drain { .. } | Action::PowerOff { .. })), "idle, no gang: {d:?}");
    snap.pods.push(member("job", 0));
    let d = disrupt(&snap, 10 * HOUR);
    assert!(d.actions.is_empty(), "{d:?}");
    assert!(d.held.iter().any(|h| h.subject == "n0" && h.why == "the room booked for train/job"), "{d:?}");
}
