//! Many seeds, random fault settings: the checkers must never trip, and
//! once faults stop every pod a free server could host is placed within
//! a bound. A failure prints the seed and the settings to replay it.

mod common;

use ironclaim_sim::engine::Prepared;
use ironclaim_sim::policy::PolicyKind;
use ironclaim_sim::{Broken, Faults, Scoring, SimConfig, rng};
use rand::RngExt;

fn random_faults(seed: u64, until_s: u64) -> Faults {
    let mut r = rng::stream(seed, "swarm-faults", 0);
    Faults {
        bmc_error_probability: r.random_range(0.0..0.3),
        boot_failure_probability: r.random_range(0.0..0.3),
        never_joins_probability: r.random_range(0.0..0.2),
        gpu_gate_failure_probability: r.random_range(0.0..0.4),
        slow_boot_probability: r.random_range(0.0..0.3),
        slow_boot_factor: r.random_range(1.0..4.0),
        faults_until_s: Some(until_s),
    }
}

#[test]
fn checkers_hold_under_random_faults_across_many_seeds() {
    let seeds: u64 = std::env::var("SWARM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(24);
    let mut failures = Vec::new();
    for seed in 1..=seeds {
        // Odd seeds run a busy rack (arrivals up to 2 min apart), even a quiet one.
        let w = common::rack_with_load(seed, 5, if seed % 2 == 1 { 120 } else { 900 });
        let cfg = SimConfig {
            seed,
            faults: random_faults(seed, 3 * 3600),
            scoring: if seed % 2 == 0 { Scoring::LeastAllocated } else { Scoring::MostAllocated },
            quarantine_after_failures: 2 + (seed % 3) as u32,
            ..Default::default()
        };
        let prep = Prepared::new(&w, None);
        for kind in PolicyKind::ALL {
            let stats = ironclaim_sim::run_policy(&w, &prep, &cfg, kind, &mut |_| {});
            if !stats.violations.is_empty() {
                failures.push(format!(
                    "seed {seed} policy {} scoring {} faults {{{}}} quarantine_after {}: {:?}",
                    kind.name(),
                    cfg.scoring,
                    cfg.faults,
                    cfg.quarantine_after_failures,
                    &stats.violations[..stats.violations.len().min(3)]
                ));
            }
        }
    }
    assert!(failures.is_empty(), "checker violations:\n{}", failures.join("\n"));
}

#[test]
fn the_checkers_catch_a_rack_that_shows_nodes_empty_and_powers_off_unchecked() {
    let w = common::small_rack(7, 2);
    let prep = Prepared::new(&w, None);
    let honest = SimConfig { seed: 7, faults: Faults::none(), ..Default::default() };
    let stats = ironclaim_sim::run_policy(&w, &prep, &honest, PolicyKind::Reactive, &mut |_| {});
    assert!(stats.violations.is_empty(), "{:?}", stats.violations);
    let broken = SimConfig { broken: Some(Broken::StaleEmptyNodes), ..honest };
    let stats = ironclaim_sim::run_policy(&w, &prep, &broken, PolicyKind::Reactive, &mut |_| {});
    assert!(stats.violations.iter().any(|v| v.checker == "powered-off-busy"), "expected a powered-off-busy violation, got {:?}", stats.violations);
}
