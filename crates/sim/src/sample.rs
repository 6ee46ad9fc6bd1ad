//! A seeded stratified sample of an inventory that keeps its hardware mix.
//!
//! # How the sample is chosen
//! Servers are split into strata by hardware class (same cpu, memory, GPU
//! count and model). Each stratum gets `n * size / total` servers, rounded
//! down, and the servers left over go to the strata with the largest
//! remainders (Hamilton's method; equal remainders are ordered by a seeded
//! shuffle). Within a stratum, servers are drawn uniformly without
//! replacement from the seeded stream. The sample keeps inventory order.

use crate::engine::Prepared;
use crate::fit::{class_allocatable, fit_sets};
use crate::rng::stream;
use crate::workload::{HardwareClass, TracePod, Workload};
use ironclaim_core::Server;
use rand::RngExt;
use serde::Serialize;

/// Picks `n` servers by stratified sampling; all of them if `n` is at
/// least the inventory's size.
pub fn stratified_sample(servers: &[Server], n: usize, seed: u64) -> Vec<Server> {
    if n >= servers.len() {
        return servers.to_vec();
    }
    let classes = hardware_classes(servers);
    let draw = stratified_draw(&classes, servers.len(), n, seed);
    draw.servers(servers)
}

fn hardware_classes(servers: &[Server]) -> Vec<HardwareClass> {
    let w = Workload { name: String::new(), servers: servers.to_vec(), pools: Vec::new(), daemonsets: Vec::new(), pods: Vec::new(), end_s: 0 };
    w.hardware_classes().0
}

/// A stratified draw: per hardware class, its members with the drawn ones
/// first, and how many are drawn.
struct Draw {
    members: Vec<Vec<usize>>,
    taken: Vec<usize>,
}

impl Draw {
    /// Draws one more member of class `c`, uniformly among those left.
    fn take_one(&mut self, c: usize, rng: &mut crate::rng::SimRng) {
        let (k, members) = (self.taken[c], &mut self.members[c]);
        let j = rng.random_range(k..members.len());
        members.swap(k, j);
        self.taken[c] += 1;
    }

    /// The drawn servers, in inventory order.
    fn servers(&self, servers: &[Server]) -> Vec<Server> {
        let mut chosen: Vec<usize> = self.members.iter().zip(&self.taken).flat_map(|(m, &t)| m[..t].iter().copied()).collect();
        chosen.sort_unstable();
        chosen.into_iter().map(|i| servers[i].clone()).collect()
    }
}

fn stratified_draw(classes: &[HardwareClass], total: usize, n: usize, seed: u64) -> Draw {
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
    let mut draw = Draw { members: classes.iter().map(|c| c.members.clone()).collect(), taken: vec![0; classes.len()] };
    // Partial Fisher-Yates: the first `quota` slots are the draw.
    for (c, &q) in quota.iter().enumerate() {
        for _ in 0..q.min(draw.members[c].len()) {
            draw.take_one(c, &mut rng);
        }
    }
    draw
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
        let g = r.gpu_milli();
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
pub fn sample_size_for_peak(servers: &[Server], peak: PeakDemand, headroom: f64, seed: u64) -> usize {
    let covers = |n: usize| {
        let sample = stratified_sample(servers, n, seed);
        let (mut c, mut m, mut g) = (0i64, 0i64, 0i64);
        for s in &sample {
            c += s.capacity.cpu_milli;
            m += s.capacity.memory_bytes;
            g += s.capacity.gpu_milli();
        }
        c as f64 >= headroom * peak.cpu_milli as f64
            && m as f64 >= headroom * peak.memory_bytes as f64
            && g as f64 >= headroom * peak.gpu_milli as f64
    };
    (1..=servers.len()).find(|&n| covers(n)).unwrap_or(servers.len())
}

/// Pods that can run only on some hardware classes, with their peak.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConstraintClass {
    /// The hardware classes the pods fit (their fit set), by name.
    pub hardware: Vec<String>,
    /// Pods whose fit set is exactly this one.
    pub pods: usize,
    /// Peak concurrent demand of every pod that must run on these classes:
    /// these pods and those whose fit set lies within this one.
    pub peak: PeakDemand,
}

/// A sample that can host its trace: the stratified sample sized by the
/// aggregate peak, plus the servers its constraint classes need.
#[derive(Clone, Debug, PartialEq)]
pub struct AutoSample {
    pub servers: Vec<Server>,
    /// Size of the stratified sample that covers the aggregate peak.
    pub stratified: usize,
    /// Servers added on top, per hardware class, in order of first addition.
    pub added: Vec<(String, usize)>,
    /// Constraint classes the whole inventory cannot carry at their peak.
    pub short: Vec<ConstraintClass>,
    pub classes: Vec<ConstraintClass>,
}

/// The constraint classes of a workload: pods grouped by the set of
/// hardware classes they fit (GPU model, node selectors and affinity,
/// taints, and shapes only some servers are large enough for), each with
/// the peak of the demand confined to its classes.
///
/// # Guarantees
/// One class per distinct fit set, in order of first use; pods no
/// hardware can host are in none.
pub fn constraint_classes(w: &Workload) -> Vec<ConstraintClass> {
    let prep = Prepared::new(w, None);
    let alloc = class_allocatable(w, &prep);
    let fits = fit_sets(w, &prep, &alloc);
    constraint_classes_of(w, &prep, &fits)
}

fn constraint_classes_of(w: &Workload, prep: &Prepared, fits: &crate::fit::FitSets) -> Vec<ConstraintClass> {
    (0..fits.sets.len())
        .map(|f| {
            let confined: Vec<TracePod> =
                w.pods.iter().zip(&fits.of_pod).filter(|(_, g)| g.is_some_and(|g| fits.within(g, f))).map(|(p, _)| p.clone()).collect();
            ConstraintClass {
                hardware: (0..prep.classes.len()).filter(|&c| fits.sets[f][c]).map(|c| prep.classes[c].name.clone()).collect(),
                pods: fits.of_pod.iter().filter(|&&g| g == Some(f)).count(),
                peak: peak_demand(&confined),
            }
        })
        .collect()
}

/// The sample `--servers-sample auto` replays on.
///
/// The stratified sample of the smallest size whose aggregate cpu, memory
/// and GPUs cover `headroom` times the trace's peak
/// ([`sample_size_for_peak`]); then, most constrained class first (fewest
/// hardware classes), every constraint class the sample cannot carry at
/// its peak gets servers of its hardware added, one at a time, each from
/// the class that covers most of what is missing (ties to the class with
/// more servers, then the first), drawn uniformly among that class's
/// servers not yet in the sample.
///
/// # Guarantees
/// Deterministic per seed. For every constraint class, the sampled
/// servers it fits offer `headroom` times its peak cpu, memory and GPUs,
/// unless the whole inventory does not (then all of its servers are in the
/// sample and the class is listed in `short`). Capacity is necessary, not
/// sufficient: packing may need more.
pub fn auto_sample(w: &Workload, headroom: f64, seed: u64) -> AutoSample {
    let prep = Prepared::new(w, None);
    let alloc = class_allocatable(w, &prep);
    let fits = fit_sets(w, &prep, &alloc);
    let classes = constraint_classes_of(w, &prep, &fits);
    let stratified = sample_size_for_peak(&w.servers, peak_demand(&w.pods), headroom, seed);
    let mut draw = stratified_draw(&prep.classes, w.servers.len(), stratified.min(w.servers.len()), seed);
    let mut rng = stream(seed, "servers-sample-constraints", 0);
    let offer = |c: usize| -> [f64; 3] { alloc[c].as_ref().map_or([0.0; 3], |a| [a.cpu_milli as f64, a.memory_bytes as f64, a.gpu_milli() as f64]) };
    let mut order: Vec<usize> = (0..classes.len()).collect();
    order.sort_by_key(|&f| (fits.sets[f].iter().filter(|&&b| b).count(), f));
    let mut added: Vec<(String, usize)> = Vec::new();
    let mut short = Vec::new();
    for f in order {
        let need = [classes[f].peak.cpu_milli as f64, classes[f].peak.memory_bytes as f64, classes[f].peak.gpu_milli as f64].map(|v| headroom * v);
        // Each pass adds a server: at most the inventory's size of them.
        loop {
            let mut missing = need;
            for c in (0..prep.classes.len()).filter(|&c| fits.sets[f][c]) {
                let o = offer(c);
                for d in 0..3 {
                    missing[d] -= draw.taken[c] as f64 * o[d];
                }
            }
            if missing.iter().all(|&m| m <= 0.0) {
                break;
            }
            let gain = |c: usize| -> f64 {
                let o = offer(c);
                (0..3).filter(|&d| missing[d] > 0.0).map(|d| o[d].min(missing[d]) / missing[d]).sum()
            };
            let best = (0..prep.classes.len())
                .filter(|&c| fits.sets[f][c] && draw.taken[c] < draw.members[c].len() && gain(c) > 0.0)
                .max_by(|&a, &b| gain(a).total_cmp(&gain(b)).then(draw.members[a].len().cmp(&draw.members[b].len())).then(b.cmp(&a)));
            let Some(c) = best else {
                short.push(classes[f].clone());
                break;
            };
            draw.take_one(c, &mut rng);
            let name = &prep.classes[c].name;
            match added.iter_mut().find(|(n, _)| n == name) {
                Some((_, k)) => *k += 1,
                None => added.push((name.clone(), 1)),
            }
        }
    }
    AutoSample { servers: draw.servers(&w.servers), stratified, added, short, classes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::hardware_server;

    fn inventory() -> Vec<Server> {
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
        let count = |p: char| s.iter().filter(|x| x.name.starts_with(p)).count();
        assert_eq!((count('g'), count('c'), count('t')), (12, 6, 2));
    }

    #[test]
    fn the_same_seed_draws_the_same_servers_and_another_seed_others() {
        let names = |seed| stratified_sample(&inventory(), 20, seed).into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_eq!(names(3), names(3));
        assert_ne!(names(3), names(4));
    }

    #[test]
    fn the_sample_size_for_a_peak_covers_it_and_one_less_does_not() {
        let inv = inventory();
        let peak = PeakDemand { cpu_milli: 500_000, memory_bytes: 1 << 40, gpu_milli: 40_000, pods: 10 };
        let n = sample_size_for_peak(&inv, peak, 1.0, 9);
        let gpus = |n| stratified_sample(&inv, n, 9).iter().map(|s| s.capacity.gpu_milli()).sum::<i64>();
        assert!(gpus(n) >= 40_000);
        let cpus = |n| stratified_sample(&inv, n, 9).iter().map(|s| s.capacity.cpu_milli).sum::<i64>();
        assert!(gpus(n - 1) < 40_000 || cpus(n - 1) < 500_000);
    }

    /// `inventory()` with a pod only a G2 host is large enough for, and
    /// T4 pods of two GPUs each: of every three, two run at 100-150 s and
    /// one at 200-300 s.
    fn t4_workload(t4_pods: u32) -> Workload {
        use crate::trace::{PodRow, workload_from_rows};
        let mut pods = vec![PodRow { name: "big".into(), cpu_milli: 90_000, memory_mib: 65_536, num_gpu: 8, arrival_s: 0, ..Default::default() }];
        for i in 0..t4_pods {
            let (arrival_s, departure_s) = if i % 3 == 2 { (200, Some(300)) } else { (100, Some(150)) };
            let r = PodRow {
                name: format!("t4-{i}"),
                cpu_milli: 2_000,
                memory_mib: 4_096,
                num_gpu: 2,
                gpu_spec: "T4".into(),
                arrival_s,
                departure_s,
                ..Default::default()
            };
            pods.push(r);
        }
        let mut w = workload_from_rows("t4", &[], &pods);
        w.servers = inventory();
        w
    }

    fn t4_gpus(servers: &[Server]) -> i64 {
        servers.iter().filter(|s| s.name.starts_with('t')).map(|s| s.capacity.gpus()).sum()
    }

    #[test]
    fn a_constraint_class_peaks_with_the_pods_confined_to_it() {
        let classes = constraint_classes(&t4_workload(6));
        let t4 = classes.iter().find(|c| c.hardware == ["cpu104-mem512g-2xT4"]).expect("a T4 class");
        assert_eq!(t4.pods, 6);
        // Four pods at 100-150 (two GPUs each), two at 200-300.
        assert_eq!((t4.peak.gpu_milli, t4.peak.pods), (8_000, 4));
        let g2 = classes.iter().find(|c| c.hardware == ["cpu96-mem384g-8xG2"]).expect("the big pod fits only G2 hosts");
        assert_eq!((g2.pods, g2.peak.gpu_milli), (1, 8_000));
        assert_eq!(classes.len(), 2);
    }

    #[test]
    fn the_auto_sample_carries_every_constraint_class_at_its_peak() {
        let w = t4_workload(6);
        for seed in 0..20 {
            let s = auto_sample(&w, 1.0, seed);
            // The aggregate's stratified sample draws no T4 host; the T4 pods need 8 T4 GPUs: 4 hosts.
            assert_eq!(t4_gpus(&s.servers), 8, "seed {seed}");
            assert_eq!(s.added, vec![("cpu104-mem512g-2xT4".to_string(), 4)], "seed {seed}");
            assert_eq!(s.servers.len(), s.stratified + 4);
            assert!(s.short.is_empty());
            assert_eq!(s, auto_sample(&w, 1.0, seed), "the same seed draws the same sample");
        }
        let names = |seed| auto_sample(&w, 1.0, seed).servers.into_iter().map(|s| s.name).collect::<Vec<_>>();
        assert_ne!(names(1), names(2));
    }

    #[test]
    fn a_constraint_class_beyond_the_inventory_takes_all_its_servers_and_is_named() {
        // 33 T4 pods, 22 at once: 44 GPUs, and the inventory has 20.
        let s = auto_sample(&t4_workload(33), 1.0, 3);
        assert_eq!(t4_gpus(&s.servers), 20);
        assert_eq!(s.short.len(), 1);
        assert_eq!(s.short[0].hardware, ["cpu104-mem512g-2xT4"]);
    }
}
