//! Shared fixtures for the simulator's integration tests.
#![allow(dead_code)]

use ironclaim_core::ServerPool;
use ironclaim_sim::trace::{parse_pods_csv, parse_servers_csv, pods_from_rows, servers_from_rows};
use ironclaim_sim::workload::Workload;
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
        pools: vec![ServerPool::new("default")],
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
    ironclaim_sim::swarm::rack(seed, hours, max_gap_s)
}
