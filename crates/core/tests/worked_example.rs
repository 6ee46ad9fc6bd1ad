//! The worked example of the product brief, end to end through the core.

use ironclaim_core::scenario::worked_example;
use ironclaim_core::*;

fn outcome<'p>(plan: &'p Provisioning, pod: &str) -> &'p Outcome {
    &plan.decision(pod).unwrap_or_else(|| panic!("no decision for {pod}")).outcome
}

#[test]
fn web_burst_opens_no_claim_and_is_reported_as_stale_accounting() {
    let plan = provision(&worked_example(), 0);
    for i in 0..6 {
        match outcome(&plan, &format!("shop/web-burst-{i}")) {
            Outcome::Existing { node } => assert!(node.starts_with("general-"), "web-{i} on {node}"),
            other => panic!("web-{i}: {other:?}"),
        }
    }
    assert!(plan.claims.iter().all(|c| c.pods.iter().all(|p| !p.starts_with("shop/"))));
}

#[test]
fn batch_pod_gets_a_32_vcpu_general_server_the_warm_one() {
    let plan = provision(&worked_example(), 0);
    match outcome(&plan, "analytics/batch-job-0") {
        Outcome::NewClaim { server, path, eta_s, .. } => {
            assert_eq!(server, "r1-u10");
            assert_eq!(*path, SupplyPath::Warm);
            assert_eq!(*eta_s, 105);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn first_gpu_pod_lands_on_gpu_a_second_gets_an_a100_server() {
    let plan = provision(&worked_example(), 0);
    assert_eq!(outcome(&plan, "ml/gpu-inference-0"), &Outcome::Existing { node: "gpu-a".into() });
    match outcome(&plan, "ml/gpu-inference-1") {
        Outcome::NewClaim { server, path, .. } => {
            assert!(server.starts_with("r2-u2"), "{server}");
            assert_eq!(*path, SupplyPath::Cold);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(plan.claims.len(), 2, "{:#?}", plan.claims);
}

#[test]
fn without_the_warm_server_the_batch_pod_takes_a_cold_one_with_a_longer_eta() {
    let mut snap = worked_example();
    snap.servers.retain(|s| s.name != "r1-u10");
    let plan = provision(&snap, 0);
    match outcome(&plan, "analytics/batch-job-0") {
        Outcome::NewClaim { path, eta_s, .. } => {
            assert_eq!(*path, SupplyPath::Cold);
            assert_eq!(*eta_s, 45 + 600 + 60 + 45);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn no_a100_in_stock_names_the_busy_servers() {
    let mut snap = worked_example();
    for s in &mut snap.servers {
        if s.name == "r2-u20" {
            s.health = Health::Maintenance;
        }
        if s.name == "r2-u21" {
            s.node = Some("r2-u21".into());
        }
    }
    let plan = provision(&snap, 0);
    match outcome(&plan, "ml/gpu-inference-1") {
        Outcome::Unschedulable { reason: Unschedulable::AllMatchingBusy { matching, in_use, maintenance, .. } } => {
            assert_eq!((*matching, *in_use, *maintenance), (2, 1, 1));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pod_no_server_can_host_names_the_constraint() {
    let mut snap = worked_example();
    let mut huge = Pod::new("ml", "h100", Resources::new(1000, 1 << 30).with_extended(GPU, 1));
    huge.node_selector.insert("accelerator".into(), "nvidia-h100".into());
    snap.pods.push(huge);
    let plan = provision(&snap, 0);
    match outcome(&plan, "ml/h100") {
        Outcome::Unschedulable { reason: r @ Unschedulable::NoMatchingHardware { .. } } => {
            let text = r.to_string();
            assert!(text.contains("accelerator=nvidia-h100"), "{text}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn gpu_pool_limit_is_named_when_reached() {
    let mut snap = worked_example();
    snap.pools[1].limits.gpus = Some(3);
    let plan = provision(&snap, 0);
    match outcome(&plan, "ml/gpu-inference-1") {
        Outcome::Unschedulable { reason: Unschedulable::PoolLimit { pool, limit } } => {
            assert_eq!(pool, "gpu");
            assert!(limit.starts_with("gpus"), "{limit}");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn power_budget_stops_a_cold_power_on() {
    let mut snap = worked_example();
    // The warm server already counts; no room for a 2.4 kW A100 host.
    snap.power_budget_watts = Some(1000.0);
    let plan = provision(&snap, 0);
    assert!(matches!(outcome(&plan, "ml/gpu-inference-1"), Outcome::Unschedulable { reason: Unschedulable::PowerBudget { .. } }));
}

#[test]
fn same_snapshot_same_plan() {
    let a = provision(&worked_example(), 0);
    let b = provision(&worked_example(), 0);
    assert_eq!(a, b);
}
