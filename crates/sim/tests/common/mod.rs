//! Shared fixtures for the simulator's integration tests.
#![allow(dead_code)]

use ironclaim_core::{NodePool, Pod};
use ironclaim_sim::trace::{parse_pods_csv, parse_servers_csv, pods_from_rows, servers_from_rows};
use ironclaim_sim::workload::{TracePod, Workload, hardware_server, pod_requests};
use ironclaim_sim::{SimServer, rng};
use rand::RngExt;
use std::path::PathBuf;

/// The openb data: `$IRONCLAIM_SHARED_DIR/data/openb`, else
/// `<repo>/../shared/data/openb`.
pub fn openb_dir() -> PathBuf {
    match std::env::var_os("IRONCLAIM_SHARED_DIR") {
        Some(dir) => PathBuf::from(dir).join("data/openb"),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/openb"),
    }
}

/// The first `pods` pods of the default openb trace on a stratified
/// sample of `servers` openb servers.
pub fn openb_slice(pods: usize, servers: usize, seed: u64) -> Workload {
    let dir = openb_dir();
    let pod_path = dir.join("openb_pod_list_default.csv");
    let node_path = dir.join("openb_node_list_all_node.csv");
    let pod_text = std::fs::read_to_string(&pod_path).unwrap_or_else(|e| panic!("{}: {e}", pod_path.display()));
    let node_text = std::fs::read_to_string(&node_path).unwrap_or_else(|e| panic!("{}: {e}", node_path.display()));
    let mut rows = parse_pods_csv(&pod_path, &pod_text).expect("openb pods parse");
    rows.truncate(pods);
    let inventory = servers_from_rows(&parse_servers_csv(&node_path, &node_text).expect("openb nodes parse"));
    let mut w = Workload {
        name: "openb slice".into(),
        servers: ironclaim_sim::sample::stratified_sample(&inventory, servers, seed),
        pools: vec![NodePool::new("default")],
        daemonsets: Vec::new(),
        pods: pods_from_rows(&rows),
        end_s: 0,
    };
    w.end_s = w.last_event_s();
    w
}

/// A small mixed rack and a random stream of pods drawn from `seed`:
/// enough capacity for the demand, so every pod can eventually land.
pub fn small_rack(seed: u64, hours: u64) -> Workload {
    rack_with_load(seed, hours, 900)
}

/// Like [`small_rack`], with arrivals at most `max_gap_s` apart.
pub fn rack_with_load(seed: u64, hours: u64, max_gap_s: u64) -> Workload {
    let mut servers: Vec<SimServer> = Vec::new();
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
        pods.push(TracePod { pod, arrival_s: t, departure_s: Some(t + life) });
        k += 1;
    }
    Workload { name: "small rack".into(), servers, pools: vec![NodePool::new("default")], daemonsets: Vec::new(), pods, end_s: end + 3 * 3600 }
}
