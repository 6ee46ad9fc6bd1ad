//! Arrival-order packing of a static trace: a pod list without times
//! (such as openb's `multigpu20`), whose pods arrive one after another in
//! the file's order and stay.
//!
//! # How a run goes
//! No clock runs and nothing leaves. Each pod in turn goes to the node
//! the kube-scheduler model picks among the powered servers (the filters
//! and the scoring of the timed replay, ties to the first server in
//! inventory order). When none can take it:
//! - `always-on` has every server powered from the start: the pod is
//!   refused;
//! - `reactive` and `ironclaim` power one server on, the one the core's
//!   `provision` picks among the servers still off for that pod alone; when
//!   the core finds none, the pod is refused. With no time and no
//!   departures there is no rate to learn and nothing to scale down, so the
//!   two pack alike;
//! - `warm-spares` also keeps `warm_spares` idle servers of the most
//!   numerous hardware class powered while that class has servers left
//!   (the first ones off, in inventory order).
//!
//! The run stops at the first refusal: the figures are those of the pods
//! placed before it. Pods no server of the inventory can ever host are
//! left out, as in the timed replay, and counted apart.

use crate::config::Scoring;
use crate::engine::{Prepared, fits_beside, node_score};
use crate::fit::{class_allocatable, node_labels};
use crate::policy::PolicyKind;
use crate::report::count;
use crate::workload::Workload;
use ironclaim_core::labels::{HOSTNAME, Labels, Taint};
use ironclaim_core::predicates::{check_node_affinity, check_taints};
use ironclaim_core::{Outcome, PowerState, Resources, Snapshot};
use serde::Serialize;

/// The first pod no server took.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refusal {
    /// Its position in the file, from 0 (pods no server can host counted).
    pub index: usize,
    pub pod: String,
    pub reason: String,
}

/// One policy under one scoring.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PackingRun {
    pub policy: &'static str,
    pub scoring: Scoring,
    /// Pods placed before the first refusal (all the placeable ones when
    /// none was refused).
    pub pods_placed: usize,
    pub first_refused: Option<Refusal>,
    pub servers_powered: usize,
    /// Thousandths of a GPU requested by the placed pods.
    pub gpu_milli_allocated: i64,
    /// Allocated GPUs over every GPU of the inventory.
    pub gpu_allocation_ratio: f64,
    /// Allocated GPUs over the GPUs of the powered servers.
    pub gpu_allocation_ratio_powered: f64,
}

/// Every policy under both scorings on one static trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PackingReport {
    pub workload: String,
    pub servers: usize,
    pub gpu_milli_inventory: i64,
    pub pods: usize,
    pub pods_unplaceable: usize,
    pub warm_spares: u32,
    pub runs: Vec<PackingRun>,
}

struct Node {
    /// What pods may use once DaemonSets are counted; None: no ServerPool
    /// admits the server, it never becomes a node.
    allocatable: Option<Resources>,
    labels: Labels,
    taints: Vec<Taint>,
}

/// What is powered and what the placed pods use, per server.
struct Rack {
    used: Vec<Resources>,
    holds_pods: Vec<bool>,
    powered: Vec<bool>,
    /// The servers still off, as the core sees them.
    off: Snapshot,
}

impl Rack {
    fn power_on(&mut self, w: &Workload, s: usize) {
        self.powered[s] = true;
        let name = &w.servers[s].name;
        self.off.servers.retain(|x| &x.name != name);
    }

    /// Powers on the first servers still off among `members` until
    /// `count` of them are powered and hold no pod, or none is left.
    fn keep_floor(&mut self, w: &Workload, floor: Option<(&[usize], usize)>) {
        let Some((members, count)) = floor else { return };
        let idle = members.iter().filter(|&&m| self.powered[m] && !self.holds_pods[m]).count();
        let next: Vec<usize> = members.iter().copied().filter(|&m| !self.powered[m]).take(count.saturating_sub(idle)).collect();
        for m in next {
            self.power_on(w, m);
        }
    }
}

/// Packs `w`'s pods in order under one policy and scoring.
pub fn pack(w: &Workload, prep: &Prepared, kind: PolicyKind, scoring: Scoring, warm_spares: u32) -> PackingRun {
    let alloc = class_allocatable(w, prep);
    let nodes: Vec<Node> = w
        .servers
        .iter()
        .enumerate()
        .map(|(s, srv)| match prep.pool_of[s] {
            Some(p) => {
                let mut labels = node_labels(&srv.labels, &w.pools[p]);
                labels.insert(HOSTNAME.to_string(), srv.name.clone());
                Node { allocatable: alloc[prep.class_of[s]].clone(), labels, taints: w.pools[p].taints.clone() }
            }
            None => Node { allocatable: None, labels: Labels::new(), taints: Vec::new() },
        })
        .collect();
    let mut rack = Rack {
        used: vec![Resources::default(); w.servers.len()],
        holds_pods: vec![false; w.servers.len()],
        powered: vec![false; w.servers.len()],
        off: Snapshot { pools: w.pools.clone(), daemonsets: w.daemonsets.clone(), ..Default::default() },
    };
    if kind == PolicyKind::AlwaysOn {
        for (s, n) in nodes.iter().enumerate() {
            rack.powered[s] = n.allocatable.is_some();
        }
    } else {
        rack.off.servers = w.servers.clone();
        for s in &mut rack.off.servers {
            s.power_state = PowerState::Off;
        }
    }
    // The warm-spares policy's floor class: the most numerous one a pool
    // admits, ties to the first.
    let floor_class = (kind == PolicyKind::WarmSpares && warm_spares > 0)
        .then(|| {
            (0..prep.classes.len())
                .filter(|&c| alloc[c].is_some())
                .max_by(|&a, &b| prep.classes[a].members.len().cmp(&prep.classes[b].members.len()).then(b.cmp(&a)))
        })
        .flatten();
    let floor = floor_class.map(|c| (prep.classes[c].members.as_slice(), warm_spares as usize));
    rack.keep_floor(w, floor);

    let mut placed = 0;
    let mut first_refused = None;
    for (i, pod) in prep.pods.iter().enumerate() {
        if prep.unplaceable[i].is_some() {
            continue;
        }
        let fits = |s: usize, used: &[Resources]| {
            let n = &nodes[s];
            n.allocatable.as_ref().is_some_and(|a| fits_beside(&pod.requests, &used[s], a))
                && check_node_affinity(pod, &n.labels, &w.servers[s].name).is_ok()
                && check_taints(pod, &n.taints, false).is_ok()
        };
        let mut best: Option<(f64, usize)> = None;
        for s in (0..w.servers.len()).filter(|&s| rack.powered[s] && fits(s, &rack.used)) {
            let score = node_score(scoring, &pod.requests, &rack.used[s], &w.servers[s].capacity);
            if best.is_none_or(|(b, _)| score > b) {
                best = Some((score, s));
            }
        }
        let target = match best {
            Some((_, s)) => Ok(s),
            None if kind == PolicyKind::AlwaysOn => Err("no powered server has room for it".to_string()),
            None => {
                let mut ask = pod.clone();
                ask.deadline_s = None;
                rack.off.pods = vec![ask].into();
                let plan = ironclaim_core::provision(&rack.off, 0);
                match plan.decision(&pod.key()).map(|d| &d.outcome) {
                    Some(Outcome::NewClaim { server, .. }) => match prep.server(server) {
                        Some(s) if fits(s, &rack.used) => {
                            rack.power_on(w, s);
                            Ok(s)
                        }
                        _ => Err(format!("the core picked {server}, which the scheduler model does not fit it on")),
                    },
                    Some(Outcome::Unschedulable { reason }) => Err(reason.to_string()),
                    other => Err(format!("the core answered {other:?}")),
                }
            }
        };
        match target {
            Ok(s) => {
                rack.used[s].add(&pod.requests);
                rack.holds_pods[s] = true;
                placed += 1;
                rack.keep_floor(w, floor);
            }
            Err(reason) => {
                first_refused = Some(Refusal { index: i, pod: pod.key(), reason });
                break;
            }
        }
    }
    let gpu_inventory: i64 = w.servers.iter().map(|s| s.capacity.gpu_milli()).sum();
    let gpu_powered: i64 = w.servers.iter().zip(&rack.powered).filter(|(_, p)| **p).map(|(s, _)| s.capacity.gpu_milli()).sum();
    let gpu_used: i64 = rack.used.iter().map(Resources::gpu_milli).sum();
    let ratio = |a: i64, b: i64| if b > 0 { a as f64 / b as f64 } else { 0.0 };
    PackingRun {
        policy: kind.name(),
        scoring,
        pods_placed: placed,
        first_refused,
        servers_powered: rack.powered.iter().filter(|&&p| p).count(),
        gpu_milli_allocated: gpu_used,
        gpu_allocation_ratio: ratio(gpu_used, gpu_inventory),
        gpu_allocation_ratio_powered: ratio(gpu_used, gpu_powered),
    }
}

/// Packs `w` under every policy of `kinds`, each under `scoring` and then
/// the other scoring.
pub fn compare_packing(w: &Workload, kinds: &[PolicyKind], scoring: Scoring, warm_spares: u32) -> PackingReport {
    let prep = Prepared::new(w, None);
    let mut runs = Vec::new();
    for sc in [scoring, scoring.other()] {
        for &k in kinds {
            runs.push(pack(w, &prep, k, sc, warm_spares));
        }
    }
    PackingReport {
        workload: w.name.clone(),
        servers: w.servers.len(),
        gpu_milli_inventory: w.servers.iter().map(|s| s.capacity.gpu_milli()).sum(),
        pods: w.pods.len(),
        pods_unplaceable: prep.unplaceable.iter().filter(|u| u.is_some()).count(),
        warm_spares,
        runs,
    }
}

impl PackingReport {
    pub fn to_table(&self) -> String {
        use comfy_table::{CellAlignment, Table, presets::UTF8_FULL_CONDENSED};
        let mut out = format!(
            "static trace {}: {} in the file's order, each staying; {}, {} GPUs\n",
            self.workload,
            count(self.pods as u64, "pod", "pods"),
            count(self.servers as u64, "server", "servers"),
            self.gpu_milli_inventory as f64 / 1000.0
        );
        if self.pods_unplaceable > 0 {
            out.push_str(&format!("{} no server can host, left out\n", count(self.pods_unplaceable as u64, "pod", "pods")));
        }
        let mut t = Table::new();
        t.load_preset(UTF8_FULL_CONDENSED);
        t.set_header([
            "policy",
            "scoring",
            "pods placed before the first refusal",
            "GPU allocation",
            "of powered GPUs",
            "servers powered",
            "first refused",
        ]);
        for r in &self.runs {
            t.add_row([
                r.policy.to_string(),
                r.scoring.to_string(),
                r.pods_placed.to_string(),
                format!("{:.1} %", r.gpu_allocation_ratio * 100.0),
                format!("{:.1} %", r.gpu_allocation_ratio_powered * 100.0),
                r.servers_powered.to_string(),
                r.first_refused.as_ref().map(|f| format!("#{} {}: {}", f.index, f.pod, f.reason)).unwrap_or_else(|| "none".into()),
            ]);
        }
        for c in 2..6 {
            if let Some(col) = t.column_mut(c) {
                col.set_cell_alignment(CellAlignment::Right);
            }
        }
        out.push_str(&t.to_string());
        out.push('\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{PodRow, ServerRow, workload_from_rows};

    /// Two 2-GPU T4 hosts and two CPU servers, 32 vCPU each. In order:
    /// four 1-GPU pods (4 vCPU), one pod larger than any server, three
    /// 16-vCPU pods, a fifth 1-GPU pod, a 1-vCPU pod.
    fn tiny() -> Workload {
        let server = |name: &str, gpu: i64, model: &str| ServerRow {
            name: name.into(),
            count: Some(2),
            cpu_milli: 32_000,
            memory_mib: 131_072,
            gpu,
            model: model.into(),
            ..Default::default()
        };
        let pod =
            |name: &str, cpu: i64, gpus: i64| PodRow { name: name.into(), cpu_milli: cpu, memory_mib: 8_192, num_gpu: gpus, ..Default::default() };
        let pods = vec![
            pod("a", 4_000, 1),
            pod("b", 4_000, 1),
            pod("huge", 64_000, 0),
            pod("c", 4_000, 1),
            pod("d", 4_000, 1),
            pod("e", 16_000, 0),
            pod("f", 16_000, 0),
            pod("g", 16_000, 0),
            pod("h", 1_000, 1),
            pod("i", 1_000, 0),
        ];
        workload_from_rows("tiny", &[server("gpu", 2, "T4"), server("cpu", 0, "")], &pods)
    }

    #[test]
    fn a_tiny_static_trace_packs_as_counted_by_hand() {
        // Counted by hand: the four GPUs of the inventory take the first
        // four GPU pods wherever they land; `huge` fits no server and is
        // left out; the three 16-vCPU pods fit in the 112 vCPU left (no
        // piece smaller than 24 before them); `h` (file position 8) finds
        // no GPU. Placed: 7, GPUs allocated 4 of 4. Powered: always-on all
        // 4; on demand the two GPU hosts carry a-d, `e` and `f` (24 vCPU
        // free on each) and `g` needs a CPU server: 3. The warm-spares
        // floor class is the GPU hosts (a tie, the first), already used.
        let w = tiny();
        let report = compare_packing(&w, &PolicyKind::ALL, Scoring::LeastAllocated, 2);
        assert_eq!(report.pods_unplaceable, 1);
        assert_eq!(report.gpu_milli_inventory, 4_000);
        assert_eq!(report.runs.len(), 8);
        for r in &report.runs {
            let label = format!("{} {}", r.policy, r.scoring);
            assert_eq!(r.pods_placed, 7, "{label}");
            let refused = r.first_refused.as_ref().expect("h is refused");
            assert_eq!((refused.index, refused.pod.as_str()), (8, "trace/h"), "{label}");
            assert_eq!(r.gpu_milli_allocated, 4_000, "{label}");
            assert_eq!((r.gpu_allocation_ratio, r.gpu_allocation_ratio_powered), (1.0, 1.0), "{label}");
            let powered = if r.policy == "always-on" { 4 } else { 3 };
            assert_eq!(r.servers_powered, powered, "{label}");
        }
        assert!(report.to_table().contains("pods placed before the first refusal"));
    }

    #[test]
    fn a_trace_that_fits_reports_no_refusal_and_a_partial_gpu_allocation() {
        let mut w = tiny();
        // Keep a, b (two GPUs of four) and the 1-vCPU pod.
        w.pods.retain(|p| ["a", "b", "i"].contains(&p.pod.name.as_str()));
        let prep = Prepared::new(&w, None);
        let r = pack(&w, &prep, PolicyKind::Reactive, Scoring::MostAllocated, 0);
        assert_eq!((r.pods_placed, r.first_refused.clone()), (3, None));
        assert_eq!(r.servers_powered, 1, "packing puts all three on one GPU host");
        assert_eq!((r.gpu_allocation_ratio, r.gpu_allocation_ratio_powered), (0.5, 1.0));
        let r = pack(&w, &prep, PolicyKind::AlwaysOn, Scoring::LeastAllocated, 0);
        assert_eq!((r.servers_powered, r.gpu_allocation_ratio_powered), (4, 0.5));
    }
}
