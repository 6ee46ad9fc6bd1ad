//! A seeded stratified sample of an inventory that keeps its hardware mix.
//!
//! # How the sample is chosen
//! Servers are split into strata by hardware class (same cpu, memory, GPU
//! count and model). Each stratum gets `n * size / total` servers, rounded
//! down, and the servers left over go to the strata with the largest
//! remainders (Hamilton's method; equal remainders are ordered by a seeded
//! shuffle). Within a stratum, servers are drawn uniformly without
//! replacement from the seeded stream. The sample keeps inventory order.

use crate::rng::stream;
use crate::workload::{SimServer, TracePod, gpu_milli_of};
use rand::RngExt;
use serde::Serialize;

/// Picks `n` servers by stratified sampling; all of them if `n` is at
/// least the inventory's size.
pub fn stratified_sample(servers: &[SimServer], n: usize, seed: u64) -> Vec<SimServer> {
    if n >= servers.len() {
        return servers.to_vec();
    }
    let w = crate::workload::Workload {
        name: String::new(),
        servers: servers.to_vec(),
        pools: Vec::new(),
        daemonsets: Vec::new(),
        pods: Vec::new(),
        end_s: 0,
    };
    let (classes, _) = w.hardware_classes();
    let total = servers.len();
    let mut rng = stream(seed, "servers-sample", 0);
    let mut quota: Vec<usize> = classes.iter().map(|c| n * c.members.len() / total).collect();
    let assigned: usize = quota.iter().sum();
    // Largest remainder first; a seeded key breaks ties.
    let mut order: Vec<(usize, u64, usize)> =
        classes.iter().enumerate().map(|(i, c)| ((n * c.members.len()) % total, rng.random::<u64>(), i)).collect();
    order.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    for &(_, _, i) in order.iter().take(n - assigned) {
        quota[i] += 1;
    }
    let mut chosen: Vec<usize> = Vec::with_capacity(n);
    for (c, class) in classes.iter().enumerate() {
        let mut members = class.members.clone();
        // Partial Fisher-Yates: the first `quota` slots are the draw.
        for k in 0..quota[c].min(members.len()) {
            let j = rng.random_range(k..members.len());
            members.swap(k, j);
        }
        chosen.extend(members.into_iter().take(quota[c]));
    }
    chosen.sort_unstable();
    chosen.into_iter().map(|i| servers[i].clone()).collect()
}

/// The largest concurrent demand of a trace, each resource at its own peak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct PeakDemand {
    pub cpu_milli: i64,
    pub memory_bytes: i64,
    pub gpu_milli: i64,
    pub pods: i64,
}

pub fn peak_demand(pods: &[TracePod]) -> PeakDemand {
    let mut events: Vec<(u64, i64, i64, i64, i64)> = Vec::with_capacity(pods.len() * 2);
    for p in pods {
        let r = &p.pod.requests;
        let g = gpu_milli_of(r);
        events.push((p.arrival_s, 1, r.cpu_milli, r.memory_bytes, g));
        if let Some(d) = p.departure_s {
            events.push((d, -1, -r.cpu_milli, -r.memory_bytes, -g));
        }
    }
    // Departures before arrivals at the same second.
    events.sort_by_key(|e| (e.0, e.1));
    let (mut now, mut peak) = (PeakDemand::default(), PeakDemand::default());
    for (_, n, c, m, g) in events {
        now.pods += n;
        now.cpu_milli += c;
        now.memory_bytes += m;
        now.gpu_milli += g;
        peak.pods = peak.pods.max(now.pods);
        peak.cpu_milli = peak.cpu_milli.max(now.cpu_milli);
        peak.memory_bytes = peak.memory_bytes.max(now.memory_bytes);
        peak.gpu_milli = peak.gpu_milli.max(now.gpu_milli);
    }
    peak
}

/// The smallest sample size whose stratified sample offers at least
/// `headroom` times the trace's peak cpu, memory and GPUs in aggregate.
/// Aggregate capacity is necessary, not sufficient: packing may need more.
pub fn sample_size_for_peak(servers: &[SimServer], peak: PeakDemand, headroom: f64, seed: u64) -> usize {
    let covers = |n: usize| {
        let sample = stratified_sample(servers, n, seed);
        let (mut c, mut m, mut g) = (0i64, 0i64, 0i64);
        for s in &sample {
            c += s.server.capacity.cpu_milli;
            m += s.server.capacity.memory_bytes;
            g += gpu_milli_of(&s.server.capacity);
        }
        c as f64 >= headroom * peak.cpu_milli as f64
            && m as f64 >= headroom * peak.memory_bytes as f64
            && g as f64 >= headroom * peak.gpu_milli as f64
    };
    (1..=servers.len()).find(|&n| covers(n)).unwrap_or(servers.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::hardware_server;

    fn inventory() -> Vec<SimServer> {
        let mut v = Vec::new();
        for i in 0..60 {
            v.push(hardware_server(&format!("g{i:03}"), 96_000, 393_216, 8, "G2"));
        }
        for i in 0..30 {
            v.push(hardware_server(&format!("c{i:03}"), 32_000, 262_144, 0, ""));
        }
        for i in 0..10 {
            v.push(hardware_server(&format!("t{i:03}"), 104_000, 524_288, 2, "T4"));
        }
        v
    }

    #[test]
    fn the_sample_keeps_the_hardware_mix() {
        let s = stratified_sample(&inventory(), 20, 5);
        assert_eq!(s.len(), 20);
        let count = |p: char| s.iter().filter(|x| x.server.name.starts_with(p)).count();
        assert_eq!((count('g'), count('c'), count('t')), (12, 6, 2));
    }

    #[test]
    fn the_same_seed_draws_the_same_servers_and_another_seed_others() {
        let names = |seed| stratified_sample(&inventory(), 20, seed).into_iter().map(|s| s.server.name).collect::<Vec<_>>();
        assert_eq!(names(3), names(3));
        assert_ne!(names(3), names(4));
    }

    #[test]
    fn the_sample_size_for_a_peak_covers_it_and_one_less_does_not() {
        let inv = inventory();
        let peak = PeakDemand { cpu_milli: 500_000, memory_bytes: 1 << 40, gpu_milli: 40_000, pods: 10 };
        let n = sample_size_for_peak(&inv, peak, 1.0, 9);
        let gpus = |n| stratified_sample(&inv, n, 9).iter().map(|s| gpu_milli_of(&s.server.capacity)).sum::<i64>();
        assert!(gpus(n) >= 40_000);
        let cpus = |n| stratified_sample(&inv, n, 9).iter().map(|s| s.server.capacity.cpu_milli).sum::<i64>();
        assert!(gpus(n - 1) < 40_000 || cpus(n - 1) < 500_000);
    }
}
