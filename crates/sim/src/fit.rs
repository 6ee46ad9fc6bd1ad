//! Which hardware classes can host a pod at all: its *fit set*.
//!
//! A pod fits a class when one empty server of it, as a node of the
//! ServerPool that admits it, passes the pod's filters: resources once the
//! DaemonSets that land there are counted, nodeSelector and required node
//! affinity (GPU model, labels), taints. The oracle bounds energy with fit
//! sets, and the auto sample sizes itself with them.

use crate::engine::Prepared;
use crate::workload::Workload;
use ironclaim_core::labels::HOSTNAME;
use ironclaim_core::predicates::{check_node_affinity, check_taints};
use ironclaim_core::provision::SERVERPOOL_LABEL;
use ironclaim_core::{Labels, Resources, ServerPool};
use std::collections::{BTreeMap, HashMap};

/// A server's labels as a node of `pool`, without its hostname (the same
/// for every member of a class).
pub(crate) fn node_labels(labels: &Labels, pool: &ServerPool) -> Labels {
    let mut l = labels.clone();
    l.extend(pool.labels.iter().map(|(k, v)| (k.clone(), v.clone())));
    l.insert(SERVERPOOL_LABEL.to_string(), pool.name.clone());
    l.remove(HOSTNAME);
    l
}

/// Per hardware class of `prep`: what one of its servers offers pods once
/// the DaemonSets that land on it are counted; None when no ServerPool
/// admits the class (its servers never become nodes).
pub fn class_allocatable(w: &Workload, prep: &Prepared) -> Vec<Option<Resources>> {
    prep.classes
        .iter()
        .map(|c| {
            let s = &w.servers[c.members[0]];
            let pool = &w.pools[prep.pool_of[c.members[0]]?];
            let mut alloc = s.capacity.clone();
            if alloc.pods == 0 {
                alloc.pods = 110;
            }
            let labels = node_labels(&s.labels, pool);
            for ds in &w.daemonsets {
                let t = &ds.template;
                if check_node_affinity(t, &labels, &s.name).is_ok() && check_taints(t, &pool.taints, false).is_ok() {
                    alloc.sub(&Resources { pods: 1, ..t.requests.clone() });
                }
            }
            Some(alloc)
        })
        .collect()
}

/// The distinct fit sets of a workload's pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FitSets {
    /// Per fit set: per hardware class of `prep`, whether the pods fit it.
    pub sets: Vec<Vec<bool>>,
    /// Per pod of `prep`: the index of its fit set; None for a pod the
    /// core finds no hardware for (`Prepared::unplaceable`) or that fits
    /// no class.
    pub of_pod: Vec<Option<usize>>,
}

impl FitSets {
    /// Whether every class of fit set `inner` is in fit set `outer`.
    pub fn within(&self, inner: usize, outer: usize) -> bool {
        self.sets[inner].iter().zip(&self.sets[outer]).all(|(&i, &o)| !i || o)
    }
}

/// The fit set of every pod, computed once per distinct shape (requests,
/// nodeSelector, affinity, tolerations), numbered in order of first use.
pub fn fit_sets(w: &Workload, prep: &Prepared, alloc: &[Option<Resources>]) -> FitSets {
    let mut out = FitSets { sets: Vec::new(), of_pod: vec![None; prep.pods.len()] };
    let mut ids: BTreeMap<Vec<bool>, usize> = BTreeMap::new();
    let mut by_shape: HashMap<String, Option<usize>> = HashMap::new();
    let labels: Vec<Option<Labels>> =
        prep.classes.iter().map(|c| prep.pool_of[c.members[0]].map(|p| node_labels(&w.servers[c.members[0]].labels, &w.pools[p]))).collect();
    for (i, pod) in prep.pods.iter().enumerate() {
        if prep.unplaceable[i].is_some() {
            continue;
        }
        let key = format!("{:?}|{:?}|{:?}|{:?}", pod.requests, pod.node_selector, pod.node_affinity, pod.tolerations);
        if let Some(&f) = by_shape.get(&key) {
            out.of_pod[i] = f;
            continue;
        }
        let set: Vec<bool> = (0..prep.classes.len())
            .map(|c| {
                let first = prep.classes[c].members[0];
                let (Some(a), Some(l), Some(p)) = (&alloc[c], &labels[c], prep.pool_of[first]) else { return false };
                pod.requests.fits(a)
                    && check_node_affinity(pod, l, &w.servers[first].name).is_ok()
                    && check_taints(pod, &w.pools[p].taints, false).is_ok()
            })
            .collect();
        let f = if set.iter().any(|&b| b) {
            let next = out.sets.len();
            let f = *ids.entry(set.clone()).or_insert(next);
            if f == next {
                out.sets.push(set);
            }
            Some(f)
        } else {
            None
        };
        by_shape.insert(key, f);
        out.of_pod[i] = f;
    }
    out
}
