//! Transition rates and the cap on power cycles, checked on random
//! snapshots by counting, per group, the changes of the last minute and
//! the ones a plan makes, with nothing of the core's own bookkeeping.

mod support;

use ironclaim_core::disruption::{Action, disrupt};
use ironclaim_core::transitions::{TransitionRate, parse_rate};
use ironclaim_core::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

const ZONE: &str = "topology.kubernetes.io/zone";
const NOW: Seconds = 100_000;

/// A random snapshot with rates per zone and for the fleet, a daily cap,
/// and recent power changes on some servers.
fn limited(seed: u64) -> Snapshot {
    let mut snap = support::random_snapshot(seed);
    let mut r = support::Rng::new(seed ^ 0x5eed);
    snap.transition_limits.rates.push(parse_rate(&format!("{ZONE}={}", 1 + r.below(3))).unwrap());
    if r.chance(50) {
        snap.transition_limits.rates.push(parse_rate(&format!("fleet={}", 1 + r.below(5))).unwrap());
    }
    snap.transition_limits.max_cycles_per_day = Some(1 + r.below(3) as u32);
    for s in &mut snap.servers {
        for _ in 0..r.below(4) {
            // Within the last two minutes, or earlier in the day.
            let ago = if r.chance(50) { r.below(120) } else { 120 + r.below(80_000) };
            s.power_changes.push(PowerChange { at_s: NOW - ago, on: r.chance(50) });
        }
        s.power_changes.sort_by_key(|c| c.at_s);
        s.idle_since_s = s.idle_since_s.or(Some(0));
    }
    snap
}

/// The group names of a server under each rate, the slow way.
fn groups(rate: &TransitionRate, s: &Server) -> Option<String> {
    match &rate.scope {
        transitions::RateScope::Fleet => Some("fleet".into()),
        transitions::RateScope::Label(k) => s.labels.get(k).map(|v| format!("{k}={v}")),
        transitions::RateScope::Pool => unreachable!("not generated"),
    }
}

/// Every group over its rate once the plan's changes are added to those
/// of the last minute, where it was within its rate before.
fn over(snap: &Snapshot, changed: &[&str]) -> Vec<String> {
    let mut errors = Vec::new();
    for rate in &snap.transition_limits.rates {
        let mut recent: BTreeMap<String, u32> = BTreeMap::new();
        let mut planned: BTreeMap<String, u32> = BTreeMap::new();
        for s in &snap.servers {
            let Some(g) = groups(rate, s) else { continue };
            *recent.entry(g.clone()).or_default() += s.power_changes.iter().filter(|c| NOW - c.at_s < 60).count() as u32;
            *planned.entry(g).or_default() += changed.iter().filter(|&&c| c == s.name).count() as u32;
        }
        for (g, n) in planned {
            let before = recent.get(&g).copied().unwrap_or(0);
            if n > 0 && before + n > rate.per_minute {
                errors.push(format!("{g}: {before} changes in the last minute and {n} planned, rate {}", rate.per_minute));
            }
        }
    }
    errors
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    #[test]
    fn provision_powers_on_no_group_past_its_rate(seed in any::<u64>()) {
        let snap = limited(seed);
        let plan = provision(&snap, NOW);
        let cold: Vec<&str> = plan
            .claims
            .iter()
            .filter(|c| snap.servers.iter().any(|s| s.name == c.server && s.power_state != PowerState::On))
            .map(|c| c.server.as_str())
            .collect();
        let errors = over(&snap, &cold);
        prop_assert!(errors.is_empty(), "seed {seed}: {errors:#?}");
    }

    #[test]
    fn disrupt_keeps_every_group_within_its_rate_and_no_capped_server_goes_off(seed in any::<u64>()) {
        let snap = limited(seed);
        let plan = disrupt(&snap, NOW);
        let mut changed: Vec<&str> = Vec::new();
        let cap = snap.transition_limits.max_cycles_per_day.unwrap();
        let mut errors = Vec::new();
        for a in &plan.actions {
            let (server, off) = match a {
                Action::PowerOff { server, .. } => (Some(server.as_str()), true),
                Action::Drain { server, .. } => (server.as_deref(), true),
                Action::PowerOn { server, .. } | Action::PowerOnForHeadroom { server, .. } | Action::PowerOnForReplacement { server, .. } => {
                    (Some(server.as_str()), false)
                }
            };
            let Some(server) = server else { continue };
            changed.push(server);
            let s = snap.servers.iter().find(|s| s.name == server).unwrap();
            let offs = s.power_changes.iter().filter(|c| !c.on && NOW - c.at_s < 86_400).count() as u32;
            if off && offs >= cap {
                errors.push(format!("{server} powered off {offs} times today, cap {cap}, and planned off again: {a:?}"));
            }
        }
        errors.extend(over(&snap, &changed));
        prop_assert!(errors.is_empty(), "seed {seed}: {errors:#?}");
    }
}

#[test]
fn a_pod_that_needs_a_cold_server_in_a_rack_at_its_rate_waits_and_is_told_when() {
    let mut snap = Snapshot::default();
    snap.pools.push(ServerPool::new("general"));
    for (name, rack) in [("a", "r1"), ("b", "r1"), ("c", "r2")] {
        snap.servers.push(Server::new(name, Resources::new(16_000, 64 << 30)).with_labels(&[("rack", rack)]));
    }
    snap.servers[0].power_changes.push(PowerChange { at_s: NOW - 20, on: true });
    snap.servers[2].power_changes.push(PowerChange { at_s: NOW - 50, on: false });
    snap.transition_limits.rates.push(parse_rate("rack=1").unwrap());
    snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
    let plan = provision(&snap, NOW);
    match &plan.pods[0].outcome {
        Outcome::Unschedulable { reason } => {
            assert_eq!(reason.metric_label(), "transition_rate");
            // r2's change leaves the minute first, after 10 s.
            let text = reason.to_string();
            assert!(text.contains("the next may start in"), "{text}");
        }
        other => panic!("expected to wait for the rate, got {other:?}"),
    }
    assert_eq!(transitions::next_change_s(&snap, NOW), Some(NOW + 10));
    // Ten seconds on, r2 may change again: its server is claimed.
    let plan = provision(&snap, NOW + 10);
    assert_eq!(plan.claims.iter().map(|c| c.server.as_str()).collect::<Vec<_>>(), ["c"]);
}

#[test]
fn the_least_worn_of_identical_servers_is_powered_on_first() {
    let mut snap = Snapshot::default();
    snap.pools.push(ServerPool::new("general"));
    for name in ["a", "b", "c"] {
        snap.servers.push(Server::new(name, Resources::new(16_000, 64 << 30)));
    }
    snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
    snap.transition_limits.max_cycles_per_day = Some(10);
    // With nothing recorded, the first by name.
    assert_eq!(provision(&snap, NOW).claims[0].server, "a");
    // a was cycled twice today, b once, c never: c goes first.
    for (i, offs) in [(0, 2), (1, 1)] {
        for k in 0..offs {
            snap.servers[i].power_changes.push(PowerChange { at_s: NOW - 10_000 + k, on: false });
        }
    }
    assert_eq!(provision(&snap, NOW).claims[0].server, "c");
    snap.servers[2].power_changes.push(PowerChange { at_s: NOW - 5_000, on: false });
    // c and b once each: b's power has been unchanged longer.
    assert_eq!(provision(&snap, NOW).claims[0].server, "b");
    // With no cap, wear is not weighed: the first by name.
    snap.transition_limits.max_cycles_per_day = None;
    assert_eq!(provision(&snap, NOW).claims[0].server, "a");
}
