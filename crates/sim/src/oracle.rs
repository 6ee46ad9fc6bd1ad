//! The offline oracle: a lower bound on the energy any policy needs to
//! serve the trace, computed with full knowledge of the future.
//!
//! # How it is computed
//! Every pod runs from its arrival to its departure with no wait. Between
//! two consecutive arrivals or departures the set of running pods is fixed,
//! and the oracle asks: which powered-on servers, at least, could host it?
//! That is bin packing; the oracle relaxes it to *aggregate capacity* so
//! that its answer is a true lower bound:
//!
//! - each pod may only use server classes it fits on (resources once the
//!   DaemonSets are counted, node affinity, taints: its *fit set*);
//! - for every fit set `F` among the running pods, the servers powered in
//!   `F` must together offer the cpu, memory, milli-GPUs and pod slots of
//!   all pods whose fit set lies inside `F`, and at least one whole-GPU
//!   slot of size `k` per pod asking for `k` whole GPUs;
//! - servers are whole (an integer count per class, at most the class size).
//!
//! The cheapest such choice (idle minus off watts per server, found by
//! branch and bound) plus the off watts of the whole inventory plus the
//! smallest possible utilisation draw (the running cpu and milli-GPUs
//! poured into the classes that draw least per unit, up to each class's
//! whole capacity) is the oracle's power at that instant. Boot energy, boot time and fragmentation are ignored, so no
//! policy can do better; a ratio near 1 is out of reach when pods are short
//! compared with a boot.
//!
//! A search that exceeds its node budget falls back to the per-constraint
//! fractional bound, which is still a lower bound; the report counts how
//! often that happened.

use crate::engine::Prepared;
use crate::fit::{class_allocatable, fit_sets};
use crate::workload::Workload;
use ironclaim_core::{Resources, Seconds};
use serde::Serialize;
use std::collections::HashMap;

/// The oracle's answer for a whole run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OracleBound {
    pub energy_kwh: f64,
    /// Mean servers of the oracle's best cover (when the search is cut
    /// short, the cover found so far; its energy is not used).
    pub servers_mean: f64,
    /// Segments (stretches of constant demand) solved, and those where the
    /// search fell back to the fractional bound.
    pub segments: u64,
    pub fallbacks: u64,
    /// Servers on at each timeline sample, for plots.
    #[serde(skip)]
    pub servers_at: Vec<u32>,
}

struct ClassInfo {
    /// Capacity once DaemonSets are counted.
    alloc: Resources,
    gpus: i64,
    on_watts: f64,
    cpu_dyn_per_milli: f64,
    gpu_dyn_per_milli: f64,
    available: i64,
}

const NODE_BUDGET: u64 = 400;

/// Cheapest cost of `amount` units over (watts per unit, capacity) sorted
/// cheapest first.
fn fill(order: &[(f64, f64)], amount: f64) -> f64 {
    let (mut left, mut cost) = (amount.max(0.0), 0.0);
    for &(unit, cap) in order {
        let take = left.min(cap);
        cost += take * unit;
        left -= take;
        if left <= 0.0 {
            break;
        }
    }
    cost
}

/// Computes the oracle bound for the prepared workload, sampling the
/// number of servers at `sample_at` times.
pub fn oracle_bound(w: &Workload, prep: &Prepared, sample_at: &[Seconds]) -> OracleBound {
    let end = prep.end_s;
    let allocatable = class_allocatable(w, prep);
    let classes: Vec<ClassInfo> = prep
        .classes
        .iter()
        .zip(&allocatable)
        .map(|(c, alloc)| {
            let s = &w.servers[c.members[0]];
            let cap = &s.server.capacity;
            let p = &s.server.power;
            let range = (p.peak_watts - p.idle_watts).max(0.0);
            let gpu_range = p.gpu_range_watts(cap);
            ClassInfo {
                gpus: cap.gpus(),
                on_watts: (p.idle_watts - p.off_watts).max(0.0),
                cpu_dyn_per_milli: if cap.cpu_milli > 0 { (range - gpu_range) / cap.cpu_milli as f64 } else { 0.0 },
                gpu_dyn_per_milli: {
                    let gm = cap.gpu_milli();
                    if gm > 0 { gpu_range / gm as f64 } else { 0.0 }
                },
                alloc: alloc.clone().unwrap_or_else(|| cap.with_default_pods()),
                available: if alloc.is_some() { c.members.len() as i64 } else { 0 },
            }
        })
        .collect();
    let off_total: f64 = w.servers.iter().map(|s| s.server.power.off_watts).sum();

    let fits = fit_sets(w, prep, &allocatable);
    let pod_fit: Vec<usize> = fits.of_pod.iter().map(|f| f.unwrap_or(usize::MAX)).collect();
    let fit_sets = fits.sets.clone();
    // Fit sets as subsets of one another.
    let inside: Vec<Vec<usize>> = (0..fit_sets.len()).map(|u| (0..fit_sets.len()).filter(|&g| fits.within(g, u)).collect()).collect();
    let mut gpu_sizes: Vec<i64> =
        prep.pods.iter().enumerate().filter(|&(i, _)| pod_fit[i] != usize::MAX).map(|(_, p)| p.requests.gpus()).filter(|&k| k > 1).collect();
    gpu_sizes.sort_unstable();
    gpu_sizes.dedup();

    let mut events: Vec<(Seconds, bool, usize)> = Vec::new();
    for (i, tp) in w.pods.iter().enumerate() {
        if pod_fit[i] == usize::MAX || tp.arrival_s >= end {
            continue;
        }
        let leave = tp.departure_s.unwrap_or(end).min(end);
        if leave <= tp.arrival_s {
            continue;
        }
        events.push((tp.arrival_s, true, i));
        events.push((leave, false, i));
    }
    events.sort_by_key(|&(t, arrive, i)| (t, arrive, i));

    // Running demand per fit set: cpu, memory, milli-GPU, pods, k-GPU pods.
    let dims = 4 + gpu_sizes.len();
    let mut demand = vec![vec![0i64; dims]; fit_sets.len()];
    let mut dyn_watts = 0.0f64;
    let (mut cpu_total, mut gpu_total) = (0i64, 0i64);
    // Utilisation watts, filled into the most frugal classes first up to
    // their whole capacity (per unit: watts, capacity).
    let fill_order = |per_unit: &dyn Fn(&ClassInfo) -> (f64, f64)| {
        let mut v: Vec<(f64, f64)> = classes.iter().filter(|c| c.available > 0).map(per_unit).filter(|&(_, cap)| cap > 0.0).collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let cpu_fill = fill_order(&|c: &ClassInfo| (c.cpu_dyn_per_milli, (c.alloc.cpu_milli * c.available) as f64));
    let gpu_fill = fill_order(&|c: &ClassInfo| (c.gpu_dyn_per_milli, (c.alloc.gpu_milli() * c.available) as f64));
    let mut out = OracleBound::default();
    let mut memo: HashMap<Vec<i64>, (f64, u32, bool)> = HashMap::new();
    let mut energy_j = 0.0;
    let mut servers_area = 0.0;
    let mut last = 0;
    let mut k = 0;
    let mut current = (0.0f64, 0u32);
    let mut sample_idx = 0;
    let mut record_samples = |upto: Seconds, servers: u32, out: &mut OracleBound| {
        while sample_idx < sample_at.len() && sample_at[sample_idx] < upto {
            out.servers_at.push(servers);
            sample_idx += 1;
        }
    };
    while k <= events.len() {
        let t = if k < events.len() { events[k].0 } else { end };
        if t > last {
            let dt = (t - last) as f64;
            energy_j += dt * (off_total + current.0 + dyn_watts);
            servers_area += dt * f64::from(current.1);
            record_samples(t, current.1, &mut out);
            last = t;
        }
        if k == events.len() {
            break;
        }
        while k < events.len() && events[k].0 == t {
            let (_, arrive, i) = events[k];
            let sign = if arrive { 1 } else { -1 };
            let r = &prep.pods[i].requests;
            let d = &mut demand[pod_fit[i]];
            d[0] += sign * r.cpu_milli;
            d[1] += sign * r.memory_bytes;
            d[2] += sign * r.gpu_milli();
            d[3] += sign * r.pods.max(1);
            for (j, &size) in gpu_sizes.iter().enumerate() {
                if r.gpus() >= size {
                    d[4 + j] += sign;
                }
            }
            cpu_total += sign * r.cpu_milli;
            gpu_total += sign * r.gpu_milli();
            k += 1;
        }
        dyn_watts = fill(&cpu_fill, cpu_total as f64) + fill(&gpu_fill, gpu_total as f64);
        let key: Vec<i64> = demand.iter().flatten().copied().collect();
        let (watts, servers, fell_back) = match memo.get(&key) {
            Some(&v) => v,
            None => {
                let v = min_on_watts(&classes, &fit_sets, &inside, &demand, &gpu_sizes);
                memo.insert(key, v);
                v
            }
        };
        out.segments += 1;
        if fell_back {
            out.fallbacks += 1;
        }
        current = (watts, servers);
    }
    record_samples(Seconds::MAX, current.1, &mut out);
    out.servers_at.truncate(sample_at.len());
    out.energy_kwh = energy_j / 3.6e6;
    out.servers_mean = if end > 0 { servers_area / end as f64 } else { 0.0 };
    out
}

struct Problem {
    /// Per constraint: coefficient per class, and what must be covered.
    coef: Vec<Vec<f64>>,
    rhs: Vec<f64>,
    weight: Vec<f64>,
    available: Vec<i64>,
    /// Classes in branching order.
    order: Vec<usize>,
    /// Per constraint: (unit cost, position in `order`, capacity), cheapest
    /// first, for the fractional bound.
    cheapest: Vec<Vec<(f64, usize, f64)>>,
}

/// The cheapest integer choice of servers per class covering every
/// constraint: (on watts, servers, fell back to the fractional bound).
fn min_on_watts(classes: &[ClassInfo], fit_sets: &[Vec<bool>], inside: &[Vec<usize>], demand: &[Vec<i64>], gpu_sizes: &[i64]) -> (f64, u32, bool) {
    let mut coef = Vec::new();
    let mut rhs = Vec::new();
    for (u, set) in fit_sets.iter().enumerate() {
        if demand[u].iter().all(|&d| d <= 0) {
            continue;
        }
        let mut total = vec![0i64; demand[u].len()];
        for &g in &inside[u] {
            for (t, d) in total.iter_mut().zip(&demand[g]) {
                *t += d;
            }
        }
        for (dim, &need) in total.iter().enumerate() {
            if need <= 0 {
                continue;
            }
            let row: Vec<f64> = classes
                .iter()
                .enumerate()
                .map(|(c, info)| {
                    if !set[c] {
                        return 0.0;
                    }
                    match dim {
                        0 => info.alloc.cpu_milli as f64,
                        1 => info.alloc.memory_bytes as f64,
                        2 => info.alloc.gpu_milli() as f64,
                        3 => info.alloc.pods as f64,
                        _ => (info.gpus / gpu_sizes[dim - 4]) as f64,
                    }
                })
                .collect();
            coef.push(row);
            rhs.push(need as f64);
        }
    }
    if rhs.is_empty() {
        return (0.0, 0, false);
    }
    let weight: Vec<f64> = classes.iter().map(|c| c.on_watts).collect();
    let available: Vec<i64> = classes.iter().map(|c| c.available).collect();
    let useful =
        |c: usize| rhs.iter().enumerate().filter(|&(j, _)| coef[j][c] > 0.0).map(|(j, &d)| (d / coef[j][c]).ceil() as i64).max().unwrap_or(0);
    let useful_of: Vec<i64> = (0..classes.len()).map(useful).collect();
    // A class is dropped when another is no dearer, at least as large on
    // every constraint, and plentiful enough to stand in for it: any
    // cover using the first stays a cover, no dearer, with the second.
    let dominates = |a: usize, b: usize| {
        a != b
            && available[a] >= useful_of[a]
            && weight[a] <= weight[b]
            && coef.iter().all(|row| row[a] >= row[b])
            && (weight[a] < weight[b] || coef.iter().any(|row| row[a] > row[b]) || a < b)
    };
    let live: Vec<usize> = (0..classes.len()).filter(|&b| available[b] > 0 && useful_of[b] > 0).collect();
    let mut order: Vec<usize> = live.iter().copied().filter(|&b| !live.iter().any(|&a| dominates(a, b))).collect();
    // Cheapest per unit of the first constraint first: good incumbents early.
    order.sort_by(|&a, &b| {
        let ra = weight[a] / coef[0][a].max(1e-9);
        let rb = weight[b] / coef[0][b].max(1e-9);
        ra.total_cmp(&rb).then(a.cmp(&b))
    });
    let cheapest = coef
        .iter()
        .map(|row| {
            let mut v: Vec<(f64, usize, f64)> = order
                .iter()
                .enumerate()
                .filter(|&(_, &c)| row[c] > 0.0)
                .map(|(pos, &c)| (weight[c] / row[c], pos, row[c] * available[c] as f64))
                .collect();
            v.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            v
        })
        .collect();
    let p = Problem { coef, rhs, weight, available, order, cheapest };
    let root = fractional_bound(&p, 0, &p.rhs);
    let mut best = (f64::INFINITY, 0u32);
    let mut counts = vec![0i64; classes.len()];
    let mut nodes = 0u64;
    let deficit = p.rhs.clone();
    search(&p, 0, &deficit, 0.0, &mut counts, &mut best, &mut nodes, NODE_BUDGET);
    if nodes > NODE_BUDGET || !best.0.is_finite() {
        // The search was cut short: the root bound stands for the energy;
        // the best cover found, if any, for the server count.
        let servers = if best.0.is_finite() {
            best.1
        } else {
            p.rhs
                .iter()
                .enumerate()
                .map(|(j, &d)| {
                    let top = p.order.iter().map(|&c| p.coef[j][c]).fold(0.0, f64::max);
                    if top > 0.0 { (d / top).ceil() as u32 } else { 0 }
                })
                .max()
                .unwrap_or(0)
        };
        return (if root.is_finite() { root.max(0.0) } else { 0.0 }, servers, true);
    }
    (best.0, best.1, false)
}

/// For each unmet constraint, the cheapest fractional cover by the classes
/// still to decide; the largest of these bounds the remaining cost.
fn fractional_bound(p: &Problem, from: usize, deficit: &[f64]) -> f64 {
    let mut bound: f64 = 0.0;
    for (j, &d) in deficit.iter().enumerate() {
        if d <= 0.0 {
            continue;
        }
        let mut left = d;
        let mut cost = 0.0;
        for &(unit, pos, cap) in &p.cheapest[j] {
            if pos < from {
                continue;
            }
            let take = left.min(cap);
            cost += take * unit;
            left -= take;
            if left <= 0.0 {
                break;
            }
        }
        if left > 1e-9 {
            return f64::INFINITY;
        }
        bound = bound.max(cost);
    }
    bound
}

#[allow(clippy::too_many_arguments)]
fn search(p: &Problem, i: usize, deficit: &[f64], cost: f64, counts: &mut [i64], best: &mut (f64, u32), nodes: &mut u64, budget: u64) {
    *nodes += 1;
    if *nodes > budget {
        return;
    }
    if deficit.iter().all(|&d| d <= 0.0) {
        if cost < best.0 {
            *best = (cost, counts.iter().sum::<i64>() as u32);
        }
        return;
    }
    if i == p.order.len() {
        return;
    }
    if cost + fractional_bound(p, i, deficit) >= best.0 - 1e-9 {
        return;
    }
    let c = p.order[i];
    let useful = deficit
        .iter()
        .enumerate()
        .filter(|&(j, &d)| d > 0.0 && p.coef[j][c] > 0.0)
        .map(|(j, &d)| (d / p.coef[j][c]).ceil() as i64)
        .max()
        .unwrap_or(0)
        .min(p.available[c]);
    let mut next = deficit.to_vec();
    for n in (0..=useful).rev() {
        for (j, d) in next.iter_mut().enumerate() {
            *d = deficit[j] - n as f64 * p.coef[j][c];
        }
        counts[c] = n;
        search(p, i + 1, &next, cost + n as f64 * p.weight[c], counts, best, nodes, budget);
        if *nodes > budget {
            break;
        }
    }
    counts[c] = 0;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{TracePod, hardware_server, pod_requests};
    use ironclaim_core::{Pod, ServerPool};

    fn workload(pods: Vec<TracePod>) -> Workload {
        let mut servers = Vec::new();
        for i in 0..4 {
            servers.push(hardware_server(&format!("c{i}"), 32_000, 131_072, 0, ""));
        }
        for i in 0..2 {
            servers.push(hardware_server(&format!("g{i}"), 96_000, 393_216, 8, "G2"));
        }
        Workload { name: "t".into(), servers, pools: vec![ServerPool::new("default")], daemonsets: vec![], pods, end_s: 1000 }
    }

    fn pod(name: &str, cpu: i64, gpus: i64, from: Seconds, to: Seconds) -> TracePod {
        TracePod {
            pod: Pod::new("t", name, pod_requests(cpu, 1024, gpus, if gpus > 0 { 1000 } else { 0 })),
            arrival_s: from,
            departure_s: Some(to),
            resize: None,
        }
    }

    #[test]
    fn an_empty_trace_costs_only_the_off_watts() {
        let w = workload(vec![]);
        let prep = Prepared::new(&w, None);
        let b = oracle_bound(&w, &prep, &[]);
        let off: f64 = w.servers.iter().map(|s| s.server.power.off_watts).sum();
        assert!((b.energy_kwh - off * 1000.0 / 3.6e6).abs() < 1e-9);
    }

    #[test]
    fn one_small_cpu_pod_keeps_the_cheapest_fitting_server_on() {
        let w = workload(vec![pod("a", 1000, 0, 0, 1000)]);
        let prep = Prepared::new(&w, None);
        let b = oracle_bound(&w, &prep, &[0, 500]);
        assert_eq!(b.servers_at, vec![1, 1]);
        let cpu = &w.servers[0].server.power;
        let off: f64 = w.servers.iter().map(|s| s.server.power.off_watts).sum();
        let on = cpu.idle_watts - cpu.off_watts;
        // Dynamic draw is bounded apart, on the class where the pod draws least:
        // the GPU host's platform share per vCPU is lower than the CPU server's.
        let g = &w.servers[4];
        let platform_range = g.server.power.peak_watts - g.server.power.idle_watts - g.server.power.gpu_range_watts(&g.server.capacity);
        let dynamic = ((cpu.peak_watts - cpu.idle_watts) * 1000.0 / 32_000.0).min(platform_range * 1000.0 / 96_000.0);
        let expect = (off + on + dynamic) * 1000.0 / 3.6e6;
        assert!((b.energy_kwh - expect).abs() < 1e-9, "{} vs {expect}", b.energy_kwh);
    }

    #[test]
    fn two_eight_gpu_pods_need_two_gpu_servers_even_if_cpu_would_fit_one() {
        let w = workload(vec![pod("a", 1000, 8, 0, 1000), pod("b", 1000, 8, 0, 1000)]);
        let prep = Prepared::new(&w, None);
        let b = oracle_bound(&w, &prep, &[10]);
        assert_eq!(b.servers_at, vec![2]);
        assert_eq!(b.fallbacks, 0);
    }
}
