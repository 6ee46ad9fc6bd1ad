//! A plain first-fit-decreasing packer: the baseline the provisioner is
//! measured against. It is deliberately simple and shares none of the
//! provisioner's machinery: pods by cpu then memory, largest first; each
//! goes to the first open server it fits, else opens the largest free
//! server that fits it. It honours resources, node selectors, required node
//! affinity, taints and the per-host constraints (hostname anti-affinity and
//! hostname spread); it relaxes zonal constraints, which can only let it
//! open fewer servers.

use crate::labels::{HOSTNAME, Labels};
use crate::model::{Pod, Server, Snapshot, WhenUnsatisfiable};
use crate::predicates::{check_node_affinity, check_taints};
use crate::resources::Resources;

struct Bin<'s> {
    free: Resources,
    labels: Labels,
    taints: &'s [crate::labels::Taint],
    pods: Vec<&'s Pod>,
}

fn per_host_ok(pod: &Pod, bin: &Bin<'_>) -> bool {
    let anti_ok = pod.pod_anti_affinity.iter().filter(|t| t.topology_key == HOSTNAME).all(|t| {
        let sel = t.label_selector.as_ref();
        !bin.pods.iter().any(|o| o.namespace == pod.namespace && sel.is_some_and(|s| s.matches(&o.labels)))
    });
    let spread_ok =
        pod.topology_spread.iter().filter(|s| s.topology_key == HOSTNAME && s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule).all(|s| {
            let sel = s.label_selector.as_ref();
            let n = bin.pods.iter().filter(|o| o.namespace == pod.namespace && sel.is_some_and(|x| x.matches(&o.labels))).count();
            n < s.max_skew as usize
        });
    anti_ok && spread_ok
}

/// How many new servers first-fit-decreasing opens for the pending pods.
pub fn servers_opened(snapshot: &Snapshot) -> usize {
    let pools = &snapshot.pools;
    let mut pending: Vec<&Pod> = snapshot.pods.iter().filter(|p| p.is_pending_demand()).collect();
    pending.sort_by(|a, b| b.requests.cpu_milli.cmp(&a.requests.cpu_milli).then(b.requests.memory_bytes.cmp(&a.requests.memory_bytes)));
    let mut bins: Vec<Bin<'_>> = Vec::new();
    for node in snapshot.nodes.iter().filter(|n| n.ready && !n.unschedulable) {
        let mut free = node.allocatable.clone();
        if free.pods == 0 {
            free.pods = 110;
        }
        let mut pods = Vec::new();
        for p in snapshot.pods.iter().filter(|p| p.occupies_node() && p.node_name.as_deref() == Some(&node.name)) {
            free.sub(&p.requests);
            pods.push(p);
        }
        bins.push(Bin { free, labels: node.labels.clone(), taints: &node.taints, pods });
    }
    let existing = bins.len();
    let mut free_servers: Vec<&Server> = snapshot.servers.iter().filter(|s| s.is_available()).collect();
    free_servers.sort_by(|a, b| {
        b.capacity.cpu_milli.cmp(&a.capacity.cpu_milli).then(b.capacity.memory_bytes.cmp(&a.capacity.memory_bytes)).then(a.name.cmp(&b.name))
    });
    let mut used = vec![false; free_servers.len()];
    let no_taints: Vec<crate::labels::Taint> = Vec::new();
    for pod in pending {
        let fits = |b: &Bin<'_>| {
            pod.requests.fits(&b.free)
                && check_node_affinity(pod, &b.labels, "").is_ok()
                && check_taints(pod, b.taints, false).is_ok()
                && per_host_ok(pod, b)
        };
        if let Some(b) = bins.iter_mut().find(|b| fits(b)) {
            b.free.sub(&pod.requests);
            b.pods.push(pod);
            continue;
        }
        for (i, s) in free_servers.iter().enumerate() {
            if used[i] && !s.unlimited {
                continue;
            }
            let pool = pools.iter().find(|p| p.admits(s));
            if !pools.is_empty() && pool.is_none() {
                continue;
            }
            let mut labels = s.labels.clone();
            let taints = pool.map(|p| p.taints.as_slice()).unwrap_or(&no_taints);
            if let Some(p) = pool {
                labels.extend(p.labels.clone());
            }
            let mut free = s.capacity.clone();
            if free.pods == 0 {
                free.pods = 110;
            }
            let bin = Bin { free, labels, taints, pods: Vec::new() };
            if fits(&bin) {
                used[i] = true;
                let mut bin = bin;
                bin.free.sub(&pod.requests);
                bin.pods.push(pod);
                bins.push(bin);
                break;
            }
        }
    }
    bins.len() - existing
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worked_example_needs_two_servers() {
        assert_eq!(servers_opened(&crate::scenario::worked_example()), 2);
    }
}
