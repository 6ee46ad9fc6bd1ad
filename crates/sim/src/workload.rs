//! What a simulation replays: an inventory of servers, ServerPools,
//! DaemonSets, and pods that arrive and leave at given times.

use ironclaim_core::resources::{GPU, GPU_MILLI};
use ironclaim_core::{DaemonSet, Pod, PowerProfile, Resources, Seconds, Server, ServerPool, StageDurations};
use serde::Serialize;
use std::collections::BTreeMap;

/// The GPU model of a server, for pods that accept only some models.
pub const GPU_MODEL_LABEL: &str = "ironclaim.dev/gpu-model";
/// The hardware class of a server (same shape, power and durations).
pub const HARDWARE_LABEL: &str = "ironclaim.dev/hardware";

const MIB: i64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

/// A pod of the trace: its spec, when it is created, when it is deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct TracePod {
    pub pod: Pod,
    pub arrival_s: Seconds,
    /// None: it runs until the end of the run.
    pub departure_s: Option<Seconds>,
    /// An in-place resize asked of the pod while it runs (as VPA's updater
    /// asks one).
    pub resize: Option<TraceResize>,
}

/// An in-place resize: at `at_s`, the pod asks for `to`. The rack's kubelet
/// applies it when the pod's node has the room; defers it when the node
/// could give it once its other pods leave; beyond the node's allocatable
/// the API server refuses it. The rack's VPA recreates the pod at its new
/// size at once when refused, and after [`VPA_DEFERRED_EVICT_S`] of a
/// deferred resize.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceResize {
    pub at_s: Seconds,
    pub to: ironclaim_core::Resources,
}

/// How long VPA (`InPlaceOrRecreate`) leaves a deferred resize before it
/// evicts the pod to have it recreated at its new size.
pub const VPA_DEFERRED_EVICT_S: Seconds = 300;

#[derive(Clone, Debug, PartialEq)]
pub struct Workload {
    pub name: String,
    pub servers: Vec<Server>,
    pub pools: Vec<ServerPool>,
    pub daemonsets: Vec<DaemonSet>,
    pub pods: Vec<TracePod>,
    /// Where the run ends unless the settings say otherwise.
    pub end_s: Seconds,
}

impl Workload {
    /// Gives every pod that has no owner a ReplicaSet named after its
    /// workload: a drain may then evict it, and its controller makes it
    /// again at once, a new pod that waits to be placed like any other.
    pub fn give_owners(&mut self) {
        for tp in self.pods.iter_mut().filter(|tp| tp.pod.owner.is_none()) {
            let name = tp.pod.workload.clone().unwrap_or_else(|| tp.pod.namespace.clone());
            tp.pod.owner = Some(ironclaim_core::Owner { kind: "ReplicaSet".into(), name });
        }
    }
}

/// Servers that are interchangeable: same hardware, labels but the
/// hostname, power and durations.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HardwareClass {
    pub name: String,
    pub members: Vec<usize>,
}

impl Workload {
    /// Groups servers into hardware classes, in order of first appearance.
    pub fn hardware_classes(&self) -> (Vec<HardwareClass>, Vec<usize>) {
        let mut by_key: BTreeMap<String, usize> = BTreeMap::new();
        let mut classes: Vec<HardwareClass> = Vec::new();
        let mut class_of = Vec::with_capacity(self.servers.len());
        for (i, s) in self.servers.iter().enumerate() {
            let key = ironclaim_core::provision::hardware_key(s);
            let next = classes.len();
            let c = *by_key.entry(key).or_insert(next);
            if c == next {
                let name = s.labels.get(HARDWARE_LABEL).cloned().unwrap_or_else(|| describe_capacity(&s.capacity, s.labels.get(GPU_MODEL_LABEL)));
                classes.push(HardwareClass { name, members: Vec::new() });
            }
            classes[c].members.push(i);
            class_of.push(c);
        }
        (classes, class_of)
    }

    /// The last arrival or departure in the trace.
    pub fn last_event_s(&self) -> Seconds {
        self.pods.iter().map(|p| p.departure_s.unwrap_or(p.arrival_s).max(p.arrival_s)).max().unwrap_or(0)
    }
}

/// A short name for a hardware shape: `cpu96-mem384g-8xG2`.
pub fn describe_capacity(c: &Resources, model: Option<&String>) -> String {
    let mut name = format!("cpu{}-mem{}g", c.cpu_milli / 1000, (c.memory_bytes as f64 / GIB).round() as i64);
    if c.gpus() > 0 {
        name.push_str(&format!("-{}x{}", c.gpus(), model.map(String::as_str).unwrap_or("gpu")));
    }
    name
}

/// Idle and peak watts of one GPU, by model. The trace's G2 and G3 are
/// anonymised models; they are taken as a 300 W and a 400 W class part.
pub fn gpu_watts(model: &str) -> (f64, f64) {
    match model {
        "T4" => (10.0, 70.0),
        "P100" => (30.0, 250.0),
        "V100M16" | "V100M32" | "V100" => (35.0, 300.0),
        "A10" => (20.0, 150.0),
        "G2" => (35.0, 300.0),
        "G3" | "A100" => (50.0, 400.0),
        "H100" => (70.0, 700.0),
        _ => (35.0, 300.0),
    }
}

/// Estimates a server's power profile from its hardware when the inventory
/// does not state it: a platform part from vCPUs and memory, plus each
/// GPU's idle and peak draw. See docs/simulate.md for the figures.
pub fn estimated_power(cpu_milli: i64, memory_bytes: i64, gpus: i64, model: &str) -> PowerProfile {
    let vcpu = cpu_milli as f64 / 1000.0;
    let gib = memory_bytes as f64 / GIB;
    // Busy cores and memory add the same watts whatever the server's size.
    let platform_idle = 40.0 + 1.25 * vcpu + 0.05 * gib;
    let platform_peak = platform_idle + 3.0 * vcpu + 0.05 * gib;
    let (gi, gp) = if gpus > 0 { gpu_watts(model) } else { (0.0, 0.0) };
    let n = gpus as f64;
    let idle = platform_idle + n * gi;
    let peak = platform_peak + n * gp;
    let boot = 1.5 * platform_idle + n * gi;
    let off = 10.0 + 1.0 * n;
    PowerProfile { gpu_watts: (gpus > 0).then_some(n * (gp - gi)), ..PowerProfile::new(idle, peak, boot, off) }
}

/// Stage durations assumed for a server whose inventory states none: a
/// local boot of a large server; GPU servers add driver validation.
pub fn estimated_durations(gpus: i64) -> StageDurations {
    if gpus > 0 {
        StageDurations { power_on_s: 30, boot_s: 300, join_s: 45, ready_s: 150, tail_percent: 150 }
    } else {
        StageDurations { power_on_s: 30, boot_s: 240, join_s: 45, ready_s: 30, tail_percent: 150 }
    }
}

/// A server from its hardware, with estimated power and durations.
pub fn hardware_server(name: &str, cpu_milli: i64, memory_mib: i64, gpus: i64, model: &str) -> Server {
    let memory_bytes = memory_mib.saturating_mul(MIB);
    let mut capacity = Resources::new(cpu_milli, memory_bytes).with_pods(110);
    let mut server = Server::new(name, capacity.clone());
    if gpus > 0 {
        capacity.set_extended(GPU, gpus);
        capacity.set_extended(GPU_MILLI, gpus * 1000);
        server.capacity = capacity;
        let model = if model.is_empty() { "gpu" } else { model };
        server.labels.insert(GPU_MODEL_LABEL.to_string(), model.to_string());
        server.labels.insert("nvidia.com/gpu.product".to_string(), model.to_string());
    }
    server.power = estimated_power(cpu_milli, memory_bytes, gpus, model);
    server.durations = estimated_durations(gpus);
    let class = describe_capacity(&server.capacity, server.labels.get(GPU_MODEL_LABEL));
    server.labels.insert(HARDWARE_LABEL.to_string(), class);
    server.labels.insert(ironclaim_core::labels::HOSTNAME.to_string(), name.to_string());
    server
}

/// Requests of a pod asking for `num_gpu` GPUs, or for `gpu_milli`
/// thousandths of one GPU when `num_gpu` is 1 and `gpu_milli` < 1000.
pub fn pod_requests(cpu_milli: i64, memory_mib: i64, num_gpu: i64, gpu_milli: i64) -> Resources {
    let mut r = Resources::new(cpu_milli, memory_mib.saturating_mul(MIB)).with_pods(1);
    if num_gpu == 1 && gpu_milli > 0 && gpu_milli < 1000 {
        r.set_extended(GPU_MILLI, gpu_milli);
    } else if num_gpu > 0 {
        r.set_extended(GPU, num_gpu);
        r.set_extended(GPU_MILLI, num_gpu * 1000);
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gpu_share_requests_only_milli_gpus_and_a_whole_gpu_requests_both() {
        let share = pod_requests(4000, 1024, 1, 460);
        assert_eq!(share.gpus(), 0);
        assert_eq!(share.extended(GPU_MILLI), 460);
        let whole = pod_requests(4000, 1024, 2, 1000);
        assert_eq!(whole.gpus(), 2);
        assert_eq!(whole.extended(GPU_MILLI), 2000);
        let none = pod_requests(4000, 1024, 0, 0);
        assert!(none.extended.is_empty());
    }

    #[test]
    fn a_share_does_not_fit_a_gpu_held_by_a_whole_gpu_pod() {
        let server = hardware_server("s", 32_000, 65_536, 1, "T4");
        let mut free = server.capacity.clone();
        free.sub(&pod_requests(1000, 1024, 1, 1000));
        assert!(!pod_requests(1000, 1024, 1, 300).fits(&free));
    }

    #[test]
    fn estimated_power_grows_with_gpus_and_keeps_idle_below_peak() {
        let cpu = estimated_power(96_000, 384 << 30, 0, "");
        let gpu = estimated_power(96_000, 384 << 30, 8, "G2");
        assert!(cpu.idle_watts < cpu.peak_watts && gpu.idle_watts < gpu.peak_watts);
        assert!(gpu.idle_watts > cpu.idle_watts + 200.0);
        assert_eq!(cpu.gpu_watts, None);
        let share = gpu.gpu_watts.unwrap_or(0.0) / (gpu.peak_watts - gpu.idle_watts);
        assert!(share > 0.7 && share < 1.0);
        assert!(cpu.off_watts < cpu.idle_watts);
    }

    #[test]
    fn hardware_classes_group_identical_servers() {
        let w = Workload {
            name: "t".into(),
            servers: vec![
                hardware_server("a", 32_000, 1024, 0, ""),
                hardware_server("b", 64_000, 1024, 0, ""),
                hardware_server("c", 32_000, 1024, 0, ""),
            ],
            pools: vec![],
            daemonsets: vec![],
            pods: vec![],
            end_s: 0,
        };
        let (classes, of) = w.hardware_classes();
        assert_eq!(classes.len(), 2);
        assert_eq!(of, vec![0, 1, 0]);
        assert_eq!(classes[0].members, vec![0, 2]);
    }
}
