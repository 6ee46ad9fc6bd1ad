//! One seed, one run: the same seed gives byte-identical JSON.

mod common;

use ironclaim_sim::compare::compare;
use ironclaim_sim::embedded::default_day;
use ironclaim_sim::{PolicyKind, SimConfig};

fn json_for(seed: u64) -> String {
    let cfg = SimConfig { seed, ..Default::default() };
    compare(&default_day(seed), &cfg, &PolicyKind::ALL, &|_, _| {}).to_json()
}

#[test]
fn the_same_seed_gives_byte_identical_json_and_another_seed_does_not() {
    let a = json_for(11);
    let b = json_for(11);
    assert_eq!(a, b, "two runs with seed 11 differ");
    let c = json_for(12);
    assert_ne!(a, c, "seeds 11 and 12 gave the same run");
    assert!(a.contains("\"policy\": \"ironclaim\""));
    assert!(a.contains("\"oracle_energy_kwh\""));
}

#[test]
fn the_openb_replay_is_deterministic_too() {
    let w = common::openb_slice(300, 24, 5);
    let cfg = SimConfig { seed: 5, ..Default::default() };
    let a = compare(&w, &cfg, &[PolicyKind::Reactive, PolicyKind::Ironclaim], &|_, _| {}).to_json();
    let b = compare(&w, &cfg, &[PolicyKind::Reactive, PolicyKind::Ironclaim], &|_, _| {}).to_json();
    assert_eq!(a, b);
}
