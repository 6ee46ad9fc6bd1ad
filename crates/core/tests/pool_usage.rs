//! What each ServerPool holds, as its limits count it, agrees with what the
//! scheduler enforces.

use ironclaim_core::outcome::{Outcome, Unschedulable};
use ironclaim_core::provision::{pool_usage, provision};
use ironclaim_core::scenario::worked_example;

#[test]
fn an_idle_fleet_holds_nothing() {
    let usage = pool_usage(&worked_example());
    assert_eq!(usage.iter().map(|u| u.pool.as_str()).collect::<Vec<_>>(), ["general", "gpu"]);
    for u in &usage {
        assert_eq!((u.servers, u.cpu_milli, u.gpus, u.watts, u.limit_reached.clone()), (0, 0, 0, 0.0, None), "{u:?}");
    }
}

#[test]
fn held_servers_count_in_the_pool_that_admits_them_and_a_reached_limit_is_the_one_the_scheduler_enforces() {
    let mut snap = worked_example();
    let a100 = snap.servers.iter().position(|s| s.name == "r2-u20").unwrap();
    let general = snap.servers.iter().position(|s| s.name == "r1-u11").unwrap();
    snap.servers[a100].claim = Some("gpu-r2-u20-x".into());
    snap.servers[general].node = Some("r1-u11".into());
    let usage = pool_usage(&snap);
    let (g, gpu) = (&usage[0], &usage[1]);
    assert_eq!((g.pool.as_str(), g.servers, g.cpu_milli, g.gpus), ("general", 1, snap.servers[general].capacity.cpu_milli, 0));
    assert_eq!(g.watts, snap.servers[general].power.peak_watts);
    assert_eq!((gpu.servers, gpu.gpus), (1, snap.servers[a100].capacity.gpus()));
    assert_eq!(gpu.limit_reached, None, "8 GPUs allowed");

    // Cap the GPU pool at what it holds: the status says so, and the
    // scheduler refuses the next A100 host for the same reason.
    snap.pools[1].limits.gpus = Some(gpu.gpus);
    let usage = pool_usage(&snap);
    let reached = usage[1].limit_reached.clone().expect("the gpu limit is reached");
    assert!(reached.starts_with("gpus "), "{reached}");
    let plan = provision(&snap, 0);
    let second = plan.pods.iter().find(|d| d.pod == "ml/gpu-inference-1").unwrap();
    assert!(
        matches!(&second.outcome, Outcome::Unschedulable { reason: Unschedulable::PoolLimit { pool, .. } } if pool == "gpu"),
        "{:?}",
        second.outcome
    );
}
