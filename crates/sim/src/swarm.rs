//! The swarm: many seeds, each a small rack with its own load and its own
//! fault probabilities, every policy run on it under the checkers of
//! [`crate::check`]. Faults stop after [`FAULTS_FOR_S`]; from then on the
//! liveness checks hold the autoscaler to placing every placeable pod.
//!
//! A seed is all it takes to replay a case: [`case`] draws the workload
//! and the settings from it alone, and [`replay_command`] names the
//! command that runs it again with every detail.

use crate::check::Violation;
use crate::engine::Prepared;
use crate::policy::PolicyKind;
use crate::rng;
use crate::workload::{TracePod, Workload, hardware_server, pod_requests};
use crate::{Faults, Scoring, SimConfig};
use ironclaim_core::{Pod, Seconds, Server, ServerPool};
use rand::RngExt;

/// Faults strike during the first three hours of a case.
pub const FAULTS_FOR_S: Seconds = 3 * 3600;
/// Hours of arrivals in a case; it runs three more for the liveness checks.
pub const HOURS: u64 = 5;

/// One case of the swarm: a workload and the settings it runs with.
#[derive(Clone, Debug)]
pub struct Case {
    pub seed: u64,
    pub workload: Workload,
    pub config: SimConfig,
}

/// A small mixed rack (six CPU servers, three with four GPUs each) and a
/// random stream of pods drawn from `seed`, arrivals at most `max_gap_s`
/// apart: enough capacity for the demand, so every pod can eventually land.
pub fn rack(seed: u64, hours: u64, max_gap_s: u64) -> Workload {
    let mut servers: Vec<Server> = Vec::new();
    for i in 0..6 {
        servers.push(hardware_server(&format!("cpu-{i}"), 32_000, 131_072, 0, ""));
    }
    for i in 0..3 {
        servers.push(hardware_server(&format!("gpu-{i}"), 64_000, 262_144, 4, "T4"));
    }
    let mut r = rng::stream(seed, "swarm-workload", 0);
    let mut pods = Vec::new();
    let end = hours * 3600;
    let mut t: u64 = 0;
    let mut k = 0;
    while t < end {
        t += r.random_range(10..max_gap_s.max(11));
        let gpu = r.random_bool(0.3);
        let (cpu, gpus, milli) = if gpu {
            (r.random_range(1..8) * 1000, 1, if r.random_bool(0.5) { 1000 } else { r.random_range(100..900) })
        } else {
            (r.random_range(1..12) * 1000, 0, 0)
        };
        let mut pod = Pod::new("swarm", &format!("p{k}"), pod_requests(cpu, 4096, gpus, milli));
        pod.deadline_s = Some(if r.random_bool(0.5) { 300 } else { 1800 });
        let life = r.random_range(60..4 * 3600);
        pods.push(TracePod { pod, arrival_s: t, departure_s: Some(t + life), resize: None });
        k += 1;
    }
    Workload { name: "small rack".into(), servers, pools: vec![ServerPool::new("default")], daemonsets: Vec::new(), pods, end_s: end + 3 * 3600 }
}

/// The fault probabilities of a seed. Each class is on in about two seeds
/// of three, at a probability drawn from its range, so that seeds cover
/// classes alone and together.
pub fn faults(seed: u64, until_s: Seconds) -> Faults {
    let mut r = rng::stream(seed, "swarm-faults", 0);
    let mut p = |max: f64| if r.random_bool(0.65) { r.random_range(0.0..max) } else { 0.0 };
    let mut f = Faults {
        bmc_error_probability: p(0.3),
        boot_failure_probability: p(0.3),
        never_joins_probability: p(0.2),
        gpu_gate_failure_probability: p(0.4),
        slow_boot_probability: p(0.3),
        bmc_off_error_probability: p(0.3),
        bmc_partition_probability: p(0.2),
        slow_bmc_probability: p(0.5),
        node_lost_probability: p(0.3),
        crash_probability: p(0.02),
        faults_until_s: Some(until_s),
        ..Faults::none()
    };
    let mut r = rng::stream(seed, "swarm-faults", 1);
    f.slow_boot_factor = r.random_range(1.0..4.0);
    f.slow_bmc_s = if f.slow_bmc_probability > 0.0 { r.random_range(5..=180) } else { 0 };
    f.watch_lag_s = if r.random_bool(0.5) { r.random_range(1..=120) } else { 0 };
    // Classes added later draw from streams of their own, so the classes
    // above keep their values seed by seed.
    let mut r = rng::stream(seed, "swarm-faults", 2);
    f.api_write_failure_probability = if r.random_bool(0.65) { r.random_range(0.0..0.2) } else { 0.0 };
    let mut r = rng::stream(seed, "swarm-faults", 3);
    if r.random_bool(0.65) {
        f.api_outages_per_hour = r.random_range(0.05..1.0);
        f.api_outage_max_s = r.random_range(10..=900);
    }
    if r.random_bool(0.65) {
        f.partitions_per_hour = r.random_range(0.1..4.0);
        f.partition_max_s = r.random_range(5..=300);
    }
    if r.random_bool(0.5) {
        f.clock_skew_s = r.random_range(1..=3600);
    }
    // Identity: existing workers on machines of the inventory, cloned
    // labels, BMCs that report no UUID, stale Nodes of a reinstall.
    let mut r = rng::stream(seed, "swarm-faults", 4);
    if r.random_bool(0.5) {
        f.foreign_workers = r.random_range(1..=2);
        f.cloned_label_probability = if r.random_bool(0.5) { r.random_range(0.3..1.0) } else { 0.0 };
    }
    if r.random_bool(0.5) {
        f.identity_unread_probability = r.random_range(0.0..0.6);
    }
    if r.random_bool(0.4) {
        f.stale_node_probability = r.random_range(0.0..0.1);
    }
    f
}

/// How many controller replicas a seed runs: one in about half the
/// seeds, two electing a leader in the others.
pub fn replicas(seed: u64) -> u32 {
    if rng::stream(seed, "swarm-replicas", 0).random_bool(0.5) { 2 } else { 1 }
}

/// The case of a seed: odd seeds a busy rack (arrivals up to 2 min
/// apart), even ones a quiet one; scoring and quarantine vary with it.
pub fn case(seed: u64) -> Case {
    let workload = rack(seed, HOURS, if seed % 2 == 1 { 120 } else { 900 });
    let config = SimConfig {
        seed,
        faults: faults(seed, FAULTS_FOR_S),
        scoring: if seed.is_multiple_of(2) { Scoring::LeastAllocated } else { Scoring::MostAllocated },
        quarantine_after_failures: 2 + (seed % 3) as u32,
        replicas: replicas(seed),
        ..Default::default()
    };
    Case { seed, workload, config }
}

/// What one policy did on a case.
#[derive(Clone, Debug)]
pub struct PolicyRun {
    pub policy: PolicyKind,
    pub violations: Vec<Violation>,
    pub crashes: u64,
    pub takeovers: u64,
    pub nodes_lost: u64,
    pub power_offs_refused: u64,
    pub pods_placed: u64,
    pub pods_pending_at_end: u64,
}

/// What every policy did on a seed's case.
#[derive(Clone, Debug)]
pub struct SeedResult {
    pub seed: u64,
    pub runs: Vec<PolicyRun>,
}

impl SeedResult {
    pub fn failed(&self) -> bool {
        self.runs.iter().any(|r| !r.violations.is_empty())
    }
}

/// Runs `policies` on the seed's case.
pub fn run_seed(seed: u64, policies: &[PolicyKind]) -> SeedResult {
    let c = case(seed);
    let prep = Prepared::new(&c.workload, None);
    let runs = policies
        .iter()
        .map(|&policy| {
            let stats = crate::run_policy(&c.workload, &prep, &c.config, policy, &mut |_| {});
            PolicyRun {
                policy,
                violations: stats.violations,
                crashes: stats.crashes,
                takeovers: stats.takeovers,
                nodes_lost: stats.nodes_lost,
                power_offs_refused: stats.power_offs_refused,
                pods_placed: stats.pods_placed,
                pods_pending_at_end: stats.pods_pending_at_end,
            }
        })
        .collect();
    SeedResult { seed, runs }
}

/// The command that replays one seed with every detail.
pub fn replay_command(seed: u64) -> String {
    format!("ironclaim swarm --seed {seed}")
}

/// The settings of a case on one line: enough, with the seed, to replay it.
pub fn describe(c: &Case) -> String {
    format!(
        "seed {} ({}: {}, {}) scoring={} quarantine_after_failures={} replicas={} faults: {}",
        c.seed,
        c.workload.name,
        crate::report::count(c.workload.servers.len() as u64, "server", "servers"),
        crate::report::count(c.workload.pods.len() as u64, "pod", "pods"),
        c.config.scoring,
        c.config.quarantine_after_failures,
        c.config.replicas,
        c.config.faults
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_is_drawn_from_its_seed_alone() {
        let (a, b) = (case(17), case(17));
        assert_eq!(a.config, b.config);
        assert_eq!(a.workload.pods.len(), b.workload.pods.len());
        assert_ne!(case(18).config, a.config);
    }

    #[test]
    fn every_fault_class_is_drawn_by_some_seed_and_left_out_by_another() {
        let all: Vec<Faults> = (1..=64).map(|s| faults(s, FAULTS_FOR_S)).collect();
        type Drawn = fn(&Faults) -> bool;
        let classes: [(&str, Drawn); 16] = [
            ("bmc_error", |f| f.bmc_error_probability > 0.0),
            ("boot_failure", |f| f.boot_failure_probability > 0.0),
            ("never_joins", |f| f.never_joins_probability > 0.0),
            ("gpu_gate_failure", |f| f.gpu_gate_failure_probability > 0.0),
            ("slow_boot", |f| f.slow_boot_probability > 0.0),
            ("bmc_off_error", |f| f.bmc_off_error_probability > 0.0),
            ("bmc_partition", |f| f.bmc_partition_probability > 0.0),
            ("slow_bmc", |f| f.slow_bmc_probability > 0.0 && f.slow_bmc_s > 0),
            ("node_lost", |f| f.node_lost_probability > 0.0),
            ("crash", |f| f.crash_probability > 0.0),
            ("watch_lag", |f| f.watch_lag_s > 0),
            ("api_write_failure", |f| f.api_write_failure_probability > 0.0),
            ("api_outage", |f| f.api_outages_per_hour > 0.0 && f.api_outage_max_s > 0),
            ("partition", |f| f.partitions_per_hour > 0.0 && f.partition_max_s > 0),
            ("clock_skew", |f| f.clock_skew_s > 0),
            ("faults_stop", |f| f.faults_until_s == Some(FAULTS_FOR_S)),
        ];
        for (name, on) in classes {
            assert!(all.iter().any(on), "no seed draws {name}");
            if name != "faults_stop" {
                assert!(!all.iter().all(on), "every seed draws {name}");
            }
        }
        // Leader loss needs a second replica: some seeds run two, some one,
        // and some run two with partitions and clock skew together.
        let two: Vec<u64> = (1..=64).filter(|&s| replicas(s) == 2).collect();
        assert!(!two.is_empty() && two.len() < 64);
        assert!(two.iter().any(|&s| all[s as usize - 1].partitions_per_hour > 0.0 && all[s as usize - 1].clock_skew_s > 0));
    }
}
