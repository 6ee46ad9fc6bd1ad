//! A claim in flight keeps the room its own pods need: a pod that arrives
//! later may use what is left, never what they wait for.

use ironclaim_core::Resources;
use ironclaim_core::model::{ClaimInFlight, Node, Pod, Snapshot, Stage};
use ironclaim_core::outcome::Outcome;
use ironclaim_core::provision::provision;
use ironclaim_core::scenario::worked_example_servers;

const GI: i64 = 1 << 30;

/// r1-u11 (32 cores, 120 GiB) booting for `small`; everything else of the
/// worked example's servers is free.
fn booting_for(pods: Vec<Pod>, named: &[&str]) -> Snapshot {
    let mut servers = worked_example_servers();
    let held = servers.iter_mut().find(|s| s.name == "r1-u11").unwrap();
    held.claim = Some("general-r1-u11-abcde".into());
    Snapshot {
        pods: pods.into(),
        servers,
        claims: vec![ClaimInFlight {
            name: "general-r1-u11-abcde".into(),
            server: "r1-u11".into(),
            pool: "default".into(),
            stage: Stage::Booting,
            stage_started_s: 0,
            pods: named.iter().map(|s| s.to_string()).collect(),
        }],
        ..Default::default()
    }
}

fn pod(name: &str, cpu_milli: i64, memory_gi: i64, created_s: u64) -> Pod {
    let mut p = Pod::new("app", name, Resources::new(cpu_milli, memory_gi * GI));
    p.created_s = created_s;
    p
}

fn outcome<'a>(plan: &'a ironclaim_core::outcome::Provisioning, pod: &str) -> &'a Outcome {
    &plan.pods.iter().find(|d| d.pod == pod).unwrap_or_else(|| panic!("{pod} not in the plan")).outcome
}

fn claim_of(o: &Outcome) -> Option<&str> {
    match o {
        Outcome::InFlight { claim, .. } => Some(claim),
        _ => None,
    }
}

#[test]
fn a_bigger_pod_arriving_later_does_not_take_the_room_a_claim_was_opened_for() {
    // `small` was the reason for the claim; `big` came later and is larger,
    // so the scheduler looks at it first. Both cannot share r1-u11.
    let small = pod("small", 16_000, 60, 10);
    let big = pod("big", 24_000, 60, 20);
    let plan = provision(&booting_for(vec![small.clone(), big.clone()], &["app/small"]), 100);
    assert_eq!(claim_of(outcome(&plan, "app/small")), Some("general-r1-u11-abcde"), "{:?}", plan.pods);
    assert!(matches!(outcome(&plan, "app/big"), Outcome::NewClaim { .. }), "{:?}", outcome(&plan, "app/big"));

    // Without the claim naming it, first fit by size gives the room to `big`
    // and `small` needs a new server: what the reservation prevents.
    let plan = provision(&booting_for(vec![small, big], &[]), 100);
    assert_eq!(claim_of(outcome(&plan, "app/big")), Some("general-r1-u11-abcde"));
    assert!(matches!(outcome(&plan, "app/small"), Outcome::NewClaim { .. }));
}

#[test]
fn room_beyond_the_claims_own_pods_is_anyones_and_a_pod_that_found_a_node_frees_its_room() {
    let small = pod("small", 16_000, 60, 10);
    let other = pod("other", 8_000, 16, 20);
    let plan = provision(&booting_for(vec![small.clone(), other.clone()], &["app/small"]), 100);
    assert_eq!(claim_of(outcome(&plan, "app/small")), Some("general-r1-u11-abcde"));
    assert_eq!(claim_of(outcome(&plan, "app/other")), Some("general-r1-u11-abcde"), "16 cores left are free to use");

    // A Ready node now takes `small`: its room on the claim goes to `big`.
    let big = pod("big", 24_000, 60, 20);
    let mut snap = booting_for(vec![small, big], &["app/small"]);
    snap.nodes.push(Node::new("spare", Resources::new(16_000, 64 * GI).with_pods(110)));
    let plan = provision(&snap, 100);
    assert!(matches!(outcome(&plan, "app/small"), Outcome::Existing { .. }), "{:?}", outcome(&plan, "app/small"));
    assert_eq!(claim_of(outcome(&plan, "app/big")), Some("general-r1-u11-abcde"));
}
