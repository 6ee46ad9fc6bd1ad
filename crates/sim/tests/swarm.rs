//! Many seeds, each its own rack, load and fault probabilities
//! ([`ironclaim_sim::swarm`]): the checkers must never trip, and once
//! faults stop every pod a free server could host is placed within a
//! bound. A failure prints each failing seed's settings and the command
//! that replays it. `SWARM_SEEDS=N` runs more; `ironclaim swarm --seeds N`
//! runs them in parallel with a progress bar.

mod common;

use ironclaim_sim::engine::Prepared;
use ironclaim_sim::policy::PolicyKind;
use ironclaim_sim::{Broken, Faults, SimConfig, swarm};

#[test]
fn checkers_hold_under_random_faults_across_many_seeds() {
    let seeds: u64 = std::env::var("SWARM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(64);
    let mut failures = Vec::new();
    let (mut takeovers, mut crashes) = (0, 0);
    for seed in 1..=seeds {
        let result = swarm::run_seed(seed, &PolicyKind::ALL);
        takeovers += result.runs.iter().map(|r| r.takeovers).sum::<u64>();
        crashes += result.runs.iter().map(|r| r.crashes).sum::<u64>();
        for run in result.runs.iter().filter(|r| !r.violations.is_empty()) {
            failures.push(format!(
                "{}\n  policy {}: {:?}\n  replay: {}",
                swarm::describe(&swarm::case(seed)),
                run.policy.name(),
                &run.violations[..run.violations.len().min(3)],
                swarm::replay_command(seed)
            ));
        }
    }
    assert!(failures.is_empty(), "checker violations:\n{}", failures.join("\n"));
    // The faults that need a second replica and a restart were exercised.
    if seeds >= 32 {
        assert!(takeovers > 0 && crashes > 0, "{takeovers} lease takeovers, {crashes} crashes over {seeds} seeds");
    }
}

/// On `w`, an honest rack trips no checker and the `broken` one trips `checker`.
fn broken_rack_trips(w: &ironclaim_sim::Workload, seed: u64, kind: PolicyKind, broken: Broken, checker: &str) {
    broken_trips(w, SimConfig { seed, faults: Faults::none(), ..Default::default() }, kind, broken, checker);
}

/// [`broken_rack_trips`] from the `honest` configuration.
fn broken_trips(w: &ironclaim_sim::Workload, honest: SimConfig, kind: PolicyKind, broken: Broken, checker: &str) {
    let prep = Prepared::new(w, None);
    let stats = ironclaim_sim::run_policy(w, &prep, &honest, kind, &mut |_| {});
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    let broken = SimConfig { broken: Some(broken), ..honest };
    let stats = ironclaim_sim::run_policy(w, &prep, &broken, kind, &mut |_| {});
    assert!(stats.violations.iter().any(|v| v.checker == checker), "expected a {checker} violation, got {:?}", stats.violations);
}

#[test]
fn the_checkers_catch_a_rack_that_shows_nodes_empty_and_powers_off_unchecked() {
    broken_rack_trips(&common::small_rack(7, 2), 7, PolicyKind::Reactive, Broken::StaleEmptyNodes, "powered-off-busy");
}

#[test]
fn the_checkers_catch_a_rack_that_hides_claims_and_grants_every_take() {
    broken_rack_trips(&common::rack_with_load(3, 3, 120), 3, PolicyKind::Ironclaim, Broken::UnfencedTakes, "claimed-twice");
}

/// Issue 14, hole 3 in the swarm: two replicas whose wall clocks are up to
/// an hour apart. Judged by what each observed (the driver's lease), one
/// leads at a time; judged by wall clocks against the writer's renew time,
/// both lead, and the lease checker sees power actions by a replica that
/// no longer holds the lease.
#[test]
fn the_checkers_catch_replicas_that_judge_the_lease_by_their_wall_clocks() {
    let honest = SimConfig { seed: 3, replicas: 2, faults: Faults { clock_skew_s: 3600, ..Faults::none() }, ..Default::default() };
    broken_trips(&common::rack_with_load(3, 3, 120), honest, PolicyKind::Ironclaim, Broken::WallClockLease, "acted-without-lease");
}

/// Issue 14, hole 1 in the swarm: existing workers on machines of the
/// inventory, their Nodes without an ironclaim label, some of their BMCs
/// reporting no UUID. Linked by system UUID, or held back as unadopted,
/// none is powered off; linked by label alone and taken as adopted, an
/// idle-looking worker is powered off with its pods on it.
#[test]
fn the_checkers_catch_a_rack_that_links_nodes_by_label_alone() {
    let faults = Faults { foreign_workers: 2, identity_unread_probability: 0.5, ..Faults::none() };
    let honest = SimConfig { seed: 5, faults, ..Default::default() };
    broken_trips(&common::rack_with_load(5, 3, 120), honest, PolicyKind::Ironclaim, Broken::LabelOnlyIdentity, "powered-off-busy");
}

/// Cloned labels and stale twins beside existing workers: the honest rack
/// keeps every checker quiet, for every policy.
#[test]
fn cloned_labels_and_stale_nodes_never_power_off_a_machine_running_work() {
    let faults = Faults { foreign_workers: 2, cloned_label_probability: 1.0, stale_node_probability: 0.2, ..Faults::none() };
    for seed in 1..=4 {
        let w = common::rack_with_load(seed, 3, 120);
        let prep = Prepared::new(&w, None);
        let cfg = SimConfig { seed, faults: faults.clone(), ..Default::default() };
        for kind in PolicyKind::ALL {
            let stats = ironclaim_sim::run_policy(&w, &prep, &cfg, kind, &mut |_| {});
            assert!(stats.violations.is_empty(), "seed {seed} {}: {:?}", kind.name(), stats.violations);
        }
    }
}
