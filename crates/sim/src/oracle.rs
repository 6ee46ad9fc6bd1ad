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
//! Two lower bounds are computed for each instant, and the oracle's power
//! is the higher of the two, plus the off watts of the whole inventory:
//!
//! - **apart**: the cheapest such choice (idle minus off watts per server,
//!   found by branch and bound), plus the smallest possible utilisation
//!   draw (the running cpu and milli-GPUs poured into the classes that draw
//!   least per unit, up to each class's whole capacity, powered or not);
//! - **together** ([`coupled_bound`]): load is drawn only on powered
//!   servers, so a class that draws little under load counts for its idle
//!   watts too. Over fractional servers and the total demand (no fit
//!   sets), by linear-programming duality.
//!
//! Boot energy, boot time and fragmentation are ignored, so no policy can
//! do better; a ratio near 1 is out of reach when pods are short compared
//! with a boot.
//!
//! A search that exceeds its node budget falls back to the per-constraint
//! fractional bound, which is still a lower bound; the report counts how
//! often that happened, and how often the bound together was the higher.

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
    /// Segments (stretches of constant demand) solved, those where the
    /// search fell back to the fractional bound, and those where the
    /// bound that keeps load on powered servers was the higher.
    pub segments: u64,
    pub fallbacks: u64,
    pub coupled: u64,
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
            let cap = &s.capacity;
            let p = &s.power;
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
    let off_total: f64 = w.servers.iter().map(|s| s.power.off_watts).sum();

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
    let mut totals = [0i64; 4];
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
    let mut memo: HashMap<Vec<i64>, Segment> = HashMap::new();
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
            energy_j += dt * (off_total + current.0);
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
            let amounts = [r.cpu_milli, r.memory_bytes, r.gpu_milli(), r.pods.max(1)];
            let d = &mut demand[pod_fit[i]];
            for (x, a) in d.iter_mut().zip(amounts) {
                *x += sign * a;
            }
            for (j, &size) in gpu_sizes.iter().enumerate() {
                if r.gpus() >= size {
                    d[4 + j] += sign;
                }
            }
            for (t, a) in totals.iter_mut().zip(amounts) {
                *t += sign * a;
            }
            k += 1;
        }
        let key: Vec<i64> = demand.iter().flatten().copied().collect();
        let seg = *memo.entry(key).or_insert_with(|| {
            let (on, servers, fell_back) = min_on_watts(&classes, &fit_sets, &inside, &demand, &gpu_sizes);
            let apart = on + fill(&cpu_fill, totals[0] as f64) + fill(&gpu_fill, totals[2] as f64);
            let together = coupled_bound(&classes, totals.map(|t| t as f64));
            Segment { watts: apart.max(together), servers, fell_back, coupled: together > apart }
        });
        out.segments += 1;
        out.fallbacks += u64::from(seg.fell_back);
        out.coupled += u64::from(seg.coupled);
        current = (seg.watts, seg.servers);
    }
    record_samples(Seconds::MAX, current.1, &mut out);
    out.servers_at.truncate(sample_at.len());
    out.energy_kwh = energy_j / 3.6e6;
    out.servers_mean = if end > 0 { servers_area / end as f64 } else { 0.0 };
    out
}

/// The oracle's answer for one stretch of constant demand.
#[derive(Clone, Copy)]
struct Segment {
    /// Watts above the inventory's off watts.
    watts: f64,
    servers: u32,
    fell_back: bool,
    coupled: bool,
}

/// A lower bound on the on and load watts of any powered servers that
/// carry `demand` (cpu, memory, milli-GPUs and pod slots in total), where
/// load is drawn only on powered servers and no server carries more than
/// it offers.
///
/// The bound of [`min_on_watts`] plus the least load pours the load into
/// the most frugal classes whether they are on or not: a server whose GPUs
/// draw little under load counts for its load but not for its idle watts.
/// Here the two go together. As a linear program over fractional servers
/// `x_c` and load `l_rc` of resource `r` on class `c`:
///
/// minimise `sum on_c x_c + sum dyn_rc l_rc` subject to
/// `sum_c l_rc >= D_r`, `0 <= l_rc <= cap_rc x_c`, `0 <= x_c <= available_c`.
///
/// For any prices `p_r >= 0`, its Lagrangian dual gives
/// `sum p_r D_r + sum_c available_c min(0, on_c - sum_r cap_rc (p_r - dyn_rc)+)`,
/// no more than the program's minimum, itself no more than any real
/// choice's watts. So every price vector gives a true lower bound; the
/// prices are raised one resource at a time to the best breakpoint of the
/// dual until none gains, and the best value seen is returned.
fn coupled_bound(classes: &[ClassInfo], demand: [f64; 4]) -> f64 {
    if demand.iter().all(|&d| d <= 0.0) {
        return 0.0;
    }
    let live: Vec<&ClassInfo> = classes.iter().filter(|c| c.available > 0).collect();
    let caps: Vec<[f64; 4]> =
        live.iter().map(|c| [c.alloc.cpu_milli as f64, c.alloc.memory_bytes as f64, c.alloc.gpu_milli() as f64, c.alloc.pods as f64]).collect();
    let dyns: Vec<[f64; 4]> = live.iter().map(|c| [c.cpu_dyn_per_milli, 0.0, c.gpu_dyn_per_milli, 0.0]).collect();
    let dual = |p: &[f64; 4]| -> f64 {
        let mut v: f64 = (0..4).map(|r| p[r] * demand[r].max(0.0)).sum();
        for (k, c) in live.iter().enumerate() {
            let gain: f64 = (0..4).map(|r| caps[k][r] * (p[r] - dyns[k][r]).max(0.0)).sum();
            v += c.available as f64 * (c.on_watts - gain).min(0.0);
        }
        v
    };
    let mut p = [0.0f64; 4];
    let mut best = dual(&p);
    // The prices a linear program finds: `dual` of them is the bound, so a
    // solver's rounding can lower the bound but never raise it above the
    // truth.
    if let Some(q) = lp_prices(&live, &caps, &dyns, demand) {
        let v = dual(&q);
        if v > best {
            best = v;
            p = q;
        }
    }
    for _ in 0..50 {
        let before = best;
        for r in 0..4 {
            if demand[r] <= 0.0 {
                continue;
            }
            // Breakpoints of the dual along p_r: where a class starts to
            // gain from this resource, and where its gain covers its on
            // watts.
            let mut candidates = vec![0.0];
            for k in 0..live.len() {
                if caps[k][r] <= 0.0 {
                    continue;
                }
                let others: f64 = (0..4).filter(|&s| s != r).map(|s| caps[k][s] * (p[s] - dyns[k][s]).max(0.0)).sum();
                candidates.push(dyns[k][r]);
                let left = live[k].on_watts - others;
                if left > 0.0 {
                    candidates.push(dyns[k][r] + left / caps[k][r]);
                }
            }
            for t in candidates {
                let mut q = p;
                q[r] = t.max(0.0);
                let v = dual(&q);
                if v > best {
                    best = v;
                    p = q;
                }
            }
        }
        if best <= before * (1.0 + 1e-12) {
            break;
        }
    }
    best.max(0.0)
}

/// The prices of the dual of [`coupled_bound`]'s program, solved as a
/// linear program: maximise `sum D_r p_r - sum available_c s_c` over
/// `p, q, s >= 0` with `q_rc >= p_r - dyn_rc` and
/// `s_c >= sum_r cap_rc q_rc - on_c`. Resources are counted in cores, GiB,
/// GPUs and pods so that the solver sees numbers of like size. `None`
/// when the solver gives no answer.
fn lp_prices(live: &[&ClassInfo], caps: &[[f64; 4]], dyns: &[[f64; 4]], demand: [f64; 4]) -> Option<[f64; 4]> {
    use microlp::{ComparisonOp, OptimizationDirection, Problem, SolveOutcome};
    const UNIT: [f64; 4] = [1000.0, (1u64 << 30) as f64, 1000.0, 1.0];
    let mut lp = Problem::new(OptimizationDirection::Maximize);
    let p: Vec<_> = (0..4).map(|r| lp.add_var(demand[r].max(0.0) / UNIT[r], (0.0, f64::INFINITY))).collect();
    for (k, c) in live.iter().enumerate() {
        let s = lp.add_var(-(c.available as f64), (0.0, f64::INFINITY));
        let mut row = vec![(s, 1.0)];
        for r in 0..4 {
            let cap = caps[k][r] / UNIT[r];
            if cap <= 0.0 {
                continue;
            }
            let q = lp.add_var(0.0, (0.0, f64::INFINITY));
            lp.add_constraint([(q, 1.0), (p[r], -1.0)], ComparisonOp::Ge, -dyns[k][r] * UNIT[r]);
            row.push((q, -cap));
        }
        lp.add_constraint(&row, ComparisonOp::Ge, -c.on_watts);
    }
    match lp.solve() {
        Ok(SolveOutcome::Solution(sol)) => Some([0, 1, 2, 3].map(|r| (sol[p[r]] / UNIT[r]).max(0.0))),
        _ => None,
    }
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

    fn class(on_watts: f64, available: i64, cpu_milli: i64, gpus: i64, cpu_dyn: f64, gpu_dyn: f64) -> ClassInfo {
        let mut alloc = Resources::new(cpu_milli, cpu_milli << 22).with_pods(110);
        alloc.set_extended(ironclaim_core::GPU, gpus);
        ClassInfo { alloc, gpus, on_watts, cpu_dyn_per_milli: cpu_dyn, gpu_dyn_per_milli: if gpus > 0 { gpu_dyn } else { 0.0 }, available }
    }

    /// The least watts of any whole number of servers per class carrying
    /// `demand`, each resource's load poured into the powered servers that
    /// draw least for it: what `coupled_bound` must never exceed.
    fn cheapest_whole_choice(classes: &[ClassInfo], demand: [f64; 4]) -> f64 {
        let mut best = f64::INFINITY;
        let mut x = vec![0i64; classes.len()];
        loop {
            let caps = |c: &ClassInfo| [c.alloc.cpu_milli as f64, c.alloc.memory_bytes as f64, c.alloc.gpu_milli() as f64, c.alloc.pods as f64];
            let covers = (0..4).all(|r| classes.iter().zip(&x).map(|(c, &n)| caps(c)[r] * n as f64).sum::<f64>() >= demand[r]);
            if covers {
                let mut watts: f64 = classes.iter().zip(&x).map(|(c, &n)| c.on_watts * n as f64).sum();
                for (r, dyn_of) in [(0, (|c: &ClassInfo| c.cpu_dyn_per_milli) as fn(&ClassInfo) -> f64), (2, |c: &ClassInfo| c.gpu_dyn_per_milli)] {
                    let mut order: Vec<usize> = (0..classes.len()).collect();
                    order.sort_by(|&a, &b| dyn_of(&classes[a]).total_cmp(&dyn_of(&classes[b])));
                    let mut left = demand[r];
                    for k in order {
                        let take = left.min(caps(&classes[k])[r] * x[k] as f64);
                        watts += take * dyn_of(&classes[k]);
                        left -= take;
                    }
                }
                best = best.min(watts);
            }
            let mut k = 0;
            while k < x.len() && x[k] == classes[k].available {
                x[k] = 0;
                k += 1;
            }
            if k == x.len() {
                return best;
            }
            x[k] += 1;
        }
    }

    proptest::proptest! {
        /// The coupled bound is a lower bound: never above the cheapest
        /// whole choice of servers that carries the demand.
        #[test]
        fn the_coupled_bound_is_never_above_a_real_choice(
            specs in proptest::collection::vec((1.0f64..500.0, 0i64..4, 1i64..64, 0i64..9, 0.001f64..0.01, 0.0f64..0.4), 1..4),
            cpu in 0i64..200_000,
            gpu in 0i64..20_000,
        ) {
            let classes: Vec<ClassInfo> = specs.iter().map(|&(on, n, cores, gpus, cd, gd)| class(on, n, cores * 1000, gpus, cd, gd)).collect();
            let demand = [cpu as f64, (cpu << 22) as f64 / 2.0, gpu as f64, 1.0];
            let real = cheapest_whole_choice(&classes, demand);
            let bound = coupled_bound(&classes, demand);
            proptest::prop_assert!(bound <= real * (1.0 + 1e-9) + 1e-6, "bound {bound} above a real choice {real}");
        }
    }

    /// With one class the program's minimum is plain: enough fractional
    /// servers for the scarcest resource, plus every unit's load. The
    /// bound reaches it.
    #[test]
    fn the_coupled_bound_reaches_the_programs_minimum_on_one_class() {
        let classes = [class(200.0, 10, 32_000, 4, 0.003, 0.25)];
        let demand = [40_000.0, 1.0, 6_000.0, 5.0];
        let servers = (40_000.0f64 / 32_000.0).max(6_000.0 / 4_000.0);
        let minimum = 200.0 * servers + 0.003 * 40_000.0 + 0.25 * 6_000.0;
        let bound = coupled_bound(&classes, demand);
        assert!((bound - minimum).abs() < 1e-6 * minimum, "{bound} vs {minimum}");
    }

    /// A GPU server that idles higher but draws less under load is what
    /// the bound counts, where the bound apart would count the idle watts
    /// of one class and the load of the other.
    #[test]
    fn the_coupled_bound_keeps_load_on_powered_servers() {
        // Large: 8 GPUs, idles at 450 W, 265 W a busy GPU. Small: 2 GPUs,
        // idles at 200 W, 60 W a busy GPU.
        let classes = [class(450.0, 4, 96_000, 8, 0.003, 0.265), class(200.0, 8, 104_000, 2, 0.003, 0.06)];
        let demand = [8_000.0, 1.0, 8_000.0, 8.0];
        let apart = 450.0 + 8_000.0 * 0.003 + 8_000.0 * 0.06;
        let bound = coupled_bound(&classes, demand);
        let real = cheapest_whole_choice(&classes, demand);
        assert!(bound > apart * 1.2 && bound <= real + 1e-9, "apart {apart}, bound {bound}, real {real}");
    }

    #[test]
    fn an_empty_trace_costs_only_the_off_watts() {
        let w = workload(vec![]);
        let prep = Prepared::new(&w, None);
        let b = oracle_bound(&w, &prep, &[]);
        let off: f64 = w.servers.iter().map(|s| s.power.off_watts).sum();
        assert!((b.energy_kwh - off * 1000.0 / 3.6e6).abs() < 1e-9);
    }

    #[test]
    fn one_small_cpu_pod_keeps_the_cheapest_fitting_server_on() {
        let w = workload(vec![pod("a", 1000, 0, 0, 1000)]);
        let prep = Prepared::new(&w, None);
        let b = oracle_bound(&w, &prep, &[0, 500]);
        assert_eq!(b.servers_at, vec![1, 1]);
        let cpu = &w.servers[0].power;
        let off: f64 = w.servers.iter().map(|s| s.power.off_watts).sum();
        let on = cpu.idle_watts - cpu.off_watts;
        // Dynamic draw is bounded apart, on the class where the pod draws least:
        // the GPU host's platform share per vCPU is lower than the CPU server's.
        let g = &w.servers[4];
        let platform_range = g.power.peak_watts - g.power.idle_watts - g.power.gpu_range_watts(&g.capacity);
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
