//! Benchmark shapes: deterministic inputs for `ironclaim bench` and the
//! criterion benches.
//!
//! - `reference`: the shape of Karpenter's scheduling benchmark: 400 machine
//!   types of unlimited count (type i has i+1 vCPU, 2(i+1) GiB, 10(i+1)
//!   pods), offered in three zones, and pods split evenly across five kinds:
//!   plain, zonal topology spread, hostname topology spread, zonal
//!   self-affinity, hostname anti-affinity.
//! - `bare_metal`: 10,000 individual servers in 20 hardware classes over four
//!   zones and forty racks, a tenth of them warm, some failed or in
//!   maintenance, a thousand already nodes with running pods; pending pods
//!   with mixed constraints.

use crate::labels::{HOSTNAME, LabelSelector, NodeSelectorTerm, Operator, Requirement, Taint, TaintEffect, Toleration, ZONE};
use crate::model::*;
use crate::resources::{GPU, Resources};

const GI: i64 = 1 << 30;
const MI: i64 = 1 << 20;

/// A deterministic sequence, so that shapes need no random crate.
struct Cycle(u64);

impl Cycle {
    fn next(&mut self, n: u64) -> u64 {
        // SplitMix64: good spread, no state beyond one word.
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }
}

const ZONES: [&str; 3] = ["test-zone-1", "test-zone-2", "test-zone-3"];

fn selector(app: &str) -> Option<LabelSelector> {
    Some(LabelSelector::matching(&[("app", app)]))
}

/// The reference shape with `pods` pending pods.
pub fn reference(pods: usize) -> Snapshot {
    let mut snap = Snapshot::default();
    for i in 0..400i64 {
        for zone in ZONES {
            let mut s = Server::new(&format!("type-{i:03}-{zone}"), Resources::new((i + 1) * 1000, 2 * (i + 1) * GI).with_pods(10 * (i + 1)))
                .with_labels(&[(ZONE, zone), ("node.kubernetes.io/instance-type", &format!("type-{i:03}"))]);
            s.unlimited = true;
            s.power.idle_watts = 50.0 + i as f64;
            s.power.peak_watts = 100.0 + 3.0 * i as f64;
            snap.servers.push(s);
        }
    }
    let cpus = [100, 250, 500, 1000, 1500];
    let mems = [100 * MI, 256 * MI, 512 * MI, GI, 2 * GI, 4 * GI];
    let mut rng = Cycle(7);
    for n in 0..pods {
        let cpu = cpus[rng.next(cpus.len() as u64) as usize];
        let mem = mems[rng.next(mems.len() as u64) as usize];
        let kind = n % 5;
        let app = ["plain", "spread-zone", "spread-host", "affinity-zone", "anti-host"][kind];
        let mut p = Pod::new("default", &format!("pod-{n}"), Resources::new(cpu, mem)).with_labels(&[("app", app)]);
        p.created_s = n as u64;
        match kind {
            1 | 2 => p.topology_spread.push(TopologySpread {
                max_skew: 1,
                topology_key: if kind == 1 { ZONE } else { HOSTNAME }.into(),
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
                label_selector: selector(app),
                min_domains: None,
                node_affinity_policy: crate::model::InclusionPolicy::Honor,
                node_taints_policy: crate::model::InclusionPolicy::Ignore,
            }),
            3 => p.pod_affinity.push(PodAffinityTerm {
                label_selector: selector(app),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: ZONE.into(),
            }),
            4 => p.pod_anti_affinity.push(PodAffinityTerm {
                label_selector: selector(app),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: HOSTNAME.into(),
            }),
            _ => {}
        }
        snap.pods.push(p);
    }
    snap
}

/// The bare-metal shape: 10,000 servers and `pods` pending pods.
pub fn bare_metal(pods: usize) -> Snapshot {
    let mut rng = Cycle(11);
    let mut snap = Snapshot::default();
    let zones = ["zone-a", "zone-b", "zone-c", "zone-d"];
    // Twenty hardware classes: cpu, memory GiB, gpus, gpu model, idle, peak.
    let mut classes: Vec<(i64, i64, i64, &str, f64, f64)> = Vec::new();
    for (i, cpu) in [16, 24, 32, 48, 64, 96, 128].iter().enumerate() {
        classes.push((*cpu, cpu * 4, 0, "", 90.0 + 12.0 * *cpu as f64 / 8.0, 200.0 + 5.0 * *cpu as f64));
        classes.push((*cpu, cpu * 8, 0, "", 110.0 + 12.0 * *cpu as f64 / 8.0, 230.0 + 5.0 * *cpu as f64));
        if i < 3 {
            classes.push((*cpu * 2, cpu * 16, 4, ["A100", "H100", "L40S"][i], 450.0, 2400.0));
        }
    }
    classes.truncate(20);
    let mut gpu_pool = ServerPool::new("gpu");
    gpu_pool.weight = 10;
    gpu_pool.requirements = vec![Requirement::new("nvidia.com/gpu.product", Operator::Exists, &[])];
    gpu_pool.taints = vec![Taint::new(GPU, "true", TaintEffect::NoSchedule)];
    let mut general = ServerPool::new("general");
    general.requirements = vec![Requirement::new("nvidia.com/gpu.product", Operator::DoesNotExist, &[])];
    general.deadline_s = Some(3600);
    snap.pools = vec![general, gpu_pool];
    for n in 0..10_000usize {
        let c = n % classes.len();
        let (cpu, mem, gpus, model, idle, peak) = classes[c];
        let zone = zones[n / 7 % zones.len()];
        let rack = format!("rack-{:02}", n / 250);
        let mut s = Server::new(&format!("srv-{n:05}"), Resources::new(cpu * 1000, mem * GI).with_pods(110))
            .with_labels(&[(ZONE, zone), ("ironclaim.dev/rack", &rack)]);
        if gpus > 0 {
            s = s.with_gpus(model, gpus);
        }
        s.power = PowerProfile::new(idle, peak, idle * 1.4, 10.0);
        s.durations.boot_s = 300 + 60 * (c as u64 % 10);
        let roll = rng.next(100);
        match roll {
            _ if n % 10 == 3 => {
                s.power_state = PowerState::On;
                s.node = Some(s.name.clone());
                let mut node = Node::new(&s.name, s.capacity.clone());
                node.labels.extend(s.labels.clone());
                node.server = Some(s.name.clone());
                if gpus > 0 {
                    node.taints.push(Taint::new(GPU, "true", TaintEffect::NoSchedule));
                }
                // Running pods fill most of it.
                for k in 0..8 {
                    let mut p = Pod::new("prod", &format!("{}-run-{k}", s.name), Resources::new(cpu * 100, mem * GI / 10))
                        .with_labels(&[("app", "running")])
                        .bound_to(&s.name);
                    p.tolerations.push(Toleration::exists(GPU));
                    snap.pods.push(p);
                }
                snap.nodes.push(node);
            }
            0..=9 => s.power_state = PowerState::On,
            10 => s.health = Health::Maintenance,
            11 => s.health = Health::Quarantined,
            12 => s.health = Health::Failed,
            _ => {}
        }
        snap.servers.push(s);
    }
    let cpus = [250, 500, 1000, 2000, 4000, 8000];
    let mems = [256 * MI, 512 * MI, GI, 2 * GI, 4 * GI, 8 * GI, 16 * GI];
    for n in 0..pods {
        let app = format!("svc-{}", n % 200);
        let mut p = Pod::new("work", &format!("pod-{n}"), Resources::new(cpus[rng.next(6) as usize], mems[rng.next(7) as usize]))
            .with_labels(&[("app", &app)]);
        p.created_s = n as u64 / 100;
        match n % 20 {
            0 => {
                p.requests.set_extended(GPU, 1 + rng.next(2) as i64);
                p.tolerations.push(Toleration::exists(GPU));
                p.node_selector.insert("nvidia.com/gpu.product".into(), ["A100", "H100", "L40S"][rng.next(3) as usize].into());
                p.deadline_s = Some(1800);
            }
            1 | 2 => p.topology_spread.push(TopologySpread {
                max_skew: 2,
                topology_key: ZONE.into(),
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
                label_selector: selector(&app),
                min_domains: None,
                node_affinity_policy: crate::model::InclusionPolicy::Honor,
                node_taints_policy: crate::model::InclusionPolicy::Ignore,
            }),
            3 => p.pod_anti_affinity.push(PodAffinityTerm {
                label_selector: selector(&app),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: HOSTNAME.into(),
            }),
            4 => {
                p.node_affinity = vec![NodeSelectorTerm {
                    match_expressions: vec![Requirement::new(ZONE, Operator::In, &[zones[rng.next(4) as usize]])],
                    match_fields: vec![],
                }]
            }
            5 => p.deadline_s = Some(300),
            _ => {}
        }
        snap.pods.push(p);
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_have_the_documented_size() {
        let r = reference(100);
        assert_eq!(r.servers.len(), 1200);
        assert_eq!(r.pods.len(), 100);
        let b = bare_metal(10);
        assert_eq!(b.servers.len(), 10_000);
        assert_eq!(b.nodes.len(), 1000);
        assert_eq!(b.pods.iter().filter(|p| p.is_pending_demand()).count(), 10);
    }
}
