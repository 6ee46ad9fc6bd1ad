//! The worked example of the product brief, embedded: three Ready workers,
//! three workloads arriving together, and a rack of spares that shows every
//! supply path (Ready, warm, cold, none).

use crate::labels::{Taint, TaintEffect, Toleration, TolerationOperator, ZONE};
use crate::model::*;
use crate::resources::{GPU, Resources};

const GI: i64 = 1 << 30;

pub use crate::model::CLASS_LABEL;
/// Label carrying the GPU model, as the NVIDIA GPU feature discovery writes it.
pub const ACCELERATOR_LABEL: &str = "accelerator";

fn general_server(name: &str, zone: &str) -> Server {
    let mut s = Server::new(name, Resources::new(32_000, 120 * GI).with_pods(110)).with_labels(&[(CLASS_LABEL, "general-32"), (ZONE, zone)]);
    s.power = PowerProfile::new(170.0, 420.0, 260.0, 8.0);
    // PXE re-image on a cold start: power-on, ten minutes of boot, join, CNI.
    s.durations = StageDurations { power_on_s: 45, boot_s: 600, join_s: 60, ready_s: 45, tail_percent: 160 };
    s
}

fn a100_server(name: &str, zone: &str) -> Server {
    let mut s = Server::new(name, Resources::new(64_000, 500 * GI).with_pods(110))
        .with_labels(&[(CLASS_LABEL, "a100x4"), (ZONE, zone), (ACCELERATOR_LABEL, "nvidia-a100")])
        .with_gpus("A100", 4);
    s.power = PowerProfile::new(480.0, 2400.0, 650.0, 15.0);
    // GPU hosts add driver validation to readiness.
    s.durations = StageDurations { power_on_s: 60, boot_s: 780, join_s: 60, ready_s: 420, tail_percent: 170 };
    s
}

/// The inventory of spares behind the worked example: one warm 32-vCPU
/// general server, two cold ones that need PXE, and two cold A100 hosts.
pub fn worked_example_servers() -> Vec<Server> {
    vec![
        general_server("r1-u10", "zone-a").warm(),
        general_server("r1-u11", "zone-a"),
        general_server("r1-u12", "zone-b"),
        a100_server("r2-u20", "zone-a"),
        a100_server("r2-u21", "zone-b"),
    ]
}

pub fn worked_example_pools() -> Vec<ServerPool> {
    let mut general = ServerPool::new("general");
    general.requirements = vec![crate::Requirement::new(CLASS_LABEL, crate::Operator::In, &["general-32"])];
    general.deadline_s = Some(3600);
    let mut gpu = ServerPool::new("gpu");
    gpu.weight = 10;
    gpu.requirements = vec![crate::Requirement::new(ACCELERATOR_LABEL, crate::Operator::Exists, &[])];
    gpu.taints = vec![Taint::new(GPU, "true", TaintEffect::NoSchedule)];
    gpu.limits.gpus = Some(8);
    gpu.deadline_s = Some(3600);
    vec![general, gpu]
}

fn gpu_toleration() -> Toleration {
    Toleration { key: GPU.into(), operator: TolerationOperator::Exists, effect: Some(TaintEffect::NoSchedule), ..Default::default() }
}

/// The three workloads of the example, pending together at time 0. Pods
/// are named as the loader names a workload's pods (`<workload>-<i>`), so
/// `examples/worked-example.yaml` gives these very pods.
pub fn worked_example_pods() -> Vec<Pod> {
    let mut pods = Vec::new();
    for i in 0..6 {
        let mut p = Pod::new("shop", &format!("web-burst-{i}"), Resources::new(1000, 2 * GI)).with_labels(&[("app", "web")]);
        p.workload = Some("web-burst".into());
        p.deadline_s = Some(120);
        pods.push(p);
    }
    let mut batch = Pod::new("analytics", "batch-job-0", Resources::new(20_000, 40 * GI)).with_labels(&[("job", "batch")]);
    batch.workload = Some("batch-job".into());
    batch.deadline_s = Some(3600);
    pods.push(batch);
    for i in 0..2 {
        let mut p = Pod::new("ml", &format!("gpu-inference-{i}"), Resources::new(8000, 32 * GI).with_extended(GPU, 1))
            .with_labels(&[("app", "inference")])
            .with_node_selector(&[(ACCELERATOR_LABEL, "nvidia-a100")]);
        p.tolerations.push(gpu_toleration());
        p.workload = Some("gpu-inference".into());
        p.deadline_s = Some(1800);
        pods.push(p);
    }
    pods
}

/// The Ready workers: free capacity as in the brief.
pub fn worked_example_nodes() -> Vec<Node> {
    let mut gpu = Node::new("gpu-a", Resources::new(16_000, 120 * GI).with_pods(110).with_extended(GPU, 1))
        .with_labels(&[(ACCELERATOR_LABEL, "nvidia-a100"), (ZONE, "zone-a")]);
    gpu.taints.push(Taint::new(GPU, "true", TaintEffect::NoSchedule));
    vec![
        Node::new("general-a", Resources::new(8000, 28 * GI).with_pods(110)).with_labels(&[(ZONE, "zone-a")]),
        Node::new("general-b", Resources::new(8000, 28 * GI).with_pods(110)).with_labels(&[(ZONE, "zone-b")]),
        gpu,
    ]
}

/// The whole worked example as one snapshot.
pub fn worked_example() -> Snapshot {
    Snapshot {
        nodes: worked_example_nodes(),
        pods: worked_example_pods().into(),
        pools: worked_example_pools(),
        servers: worked_example_servers(),
        ..Default::default()
    }
}
