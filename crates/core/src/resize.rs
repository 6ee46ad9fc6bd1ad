//! In-place resizes as demand.
//!
//! A pod whose in-place resize its node has not applied (the kubelet's
//! `PodResizePending` condition, `Infeasible` or `Deferred`) keeps running
//! there at the size it holds. VPA, or whoever asked for the resize, then
//! evicts or recreates it, and it lands wherever kube-scheduler finds room
//! for its new size: on a bare-metal fleet, often nowhere that is on.
//!
//! The core plans for such a pod as for a pending one, through a
//! *stand-in*: the pod at its desired size, unbound, kept off the node it
//! runs on (whose kubelet already said no). A Ready node that can host the
//! stand-in needs no server: the pod lands there once it is moved. Else a
//! server is planned for it, the same way as for any pending pod, and the
//! pod's decision says which resize it is for ([`ResizeWait`]).
//!
//! # Guarantees
//! - The pod keeps holding what it holds on its node: a stand-in adds
//!   demand and takes no room away.
//! - A stand-in never lands on the node its pod runs on.
//! - Its deadline runs from when the resize started waiting.
//! - Expanding an expanded snapshot adds nothing: its pods carry no resize.

use crate::labels::{NodeSelectorTerm, Operator, Requirement};
use crate::model::{Pod, PodPhase, ResizeReason, Snapshot};
use crate::resources::Resources;
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// The field a node selector term matches a node's name with.
const NODE_NAME_FIELD: &str = "metadata.name";

/// What a decision is about when its pod waits for a resize: the node
/// that did not apply it, why, and what the pod grows to.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeWait {
    pub node: String,
    pub reason: ResizeReason,
    /// The resources that grow, at their new size: `12 CPU, 48Gi memory`.
    pub grows_to: String,
}

impl fmt::Display for ResizeWait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "resize to {} {} on {}", self.grows_to, self.reason.as_str(), self.node)
    }
}

/// The resources of `desired` that exceed `held`, at their new size.
fn grows_to(held: &Resources, desired: &Resources) -> String {
    let mut parts = Vec::new();
    if desired.cpu_milli > held.cpu_milli {
        parts.push(format!("{} CPU", crate::quantity::format_cpu_milli(desired.cpu_milli)));
    }
    if desired.memory_bytes > held.memory_bytes {
        parts.push(format!("{} memory", crate::quantity::format_bytes(desired.memory_bytes)));
    }
    if desired.ephemeral_bytes > held.ephemeral_bytes {
        parts.push(format!("{} ephemeral-storage", crate::quantity::format_bytes(desired.ephemeral_bytes)));
    }
    for (name, amount) in &desired.extended {
        if *amount > held.extended(name) {
            parts.push(format!("{amount} {name}"));
        }
    }
    if parts.is_empty() {
        // A resize that grows nothing still waits: name its size.
        parts.push(format!("{} CPU", crate::quantity::format_cpu_milli(desired.cpu_milli)));
    }
    parts.join(", ")
}

/// What the decision of a pod waiting for a resize is about; None for any
/// other pod.
pub fn wait_of(pod: &Pod) -> Option<ResizeWait> {
    if !pod.is_resize_demand() {
        return None;
    }
    let resize = pod.resize.as_ref()?;
    let given = resize.given.as_ref().unwrap_or(&pod.requests);
    Some(ResizeWait { node: pod.node_name.clone()?, reason: resize.reason, grows_to: grows_to(given, &resize.desired) })
}

/// The pod a resize asks for: at its desired size, unbound, pending since
/// the resize started waiting, and kept off the node it runs on. None for
/// a pod that is no resize demand.
pub fn stand_in(pod: &Pod) -> Option<Pod> {
    if !pod.is_resize_demand() {
        return None;
    }
    let resize = pod.resize.as_ref()?;
    let node = pod.node_name.as_deref()?;
    let not_here = Requirement { key: NODE_NAME_FIELD.to_string(), operator: Operator::NotIn, values: vec![node.to_string()] };
    let mut out = pod.clone();
    out.requests = Resources { pods: 1, ..resize.desired.clone() };
    out.node_name = None;
    out.phase = PodPhase::Pending;
    out.created_s = resize.since_s;
    out.resize = None;
    if out.node_affinity.is_empty() {
        out.node_affinity.push(NodeSelectorTerm { match_expressions: Vec::new(), match_fields: vec![not_here] });
    } else {
        // Terms are ORed: each must keep it off the node.
        for term in &mut out.node_affinity {
            term.match_fields.push(not_here.clone());
        }
    }
    Some(out)
}

/// The snapshot with a stand-in for every pod waiting for a resize, after
/// the pods as they are (which no longer carry their resize); the snapshot
/// itself when no pod waits for one.
pub fn with_demand(snapshot: &Snapshot) -> Cow<'_, Snapshot> {
    if !snapshot.pods.iter().any(|p| p.resize.is_some()) {
        return Cow::Borrowed(snapshot);
    }
    let mut out = snapshot.clone();
    let stand_ins: Vec<Pod> = out.pods.iter().filter_map(stand_in).collect();
    for p in out.pods.iter_mut_where(|p| p.resize.is_some()) {
        p.resize = None;
    }
    out.pods.extend(stand_ins);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Node, Resize};

    fn resized(node: &str, held: i64, desired: i64, reason: ResizeReason) -> Pod {
        let mut p = Pod::new("ns", "db", Resources::new(held, 1 << 30)).bound_to(node);
        p.created_s = 10;
        p.owner = Some(crate::model::Owner { kind: "StatefulSet".into(), name: "db".into() });
        p.resize = Some(Box::new(Resize { desired: Resources::new(desired, 1 << 30).with_pods(1), reason, since_s: 500, given: None }));
        p
    }

    #[test]
    fn a_stand_in_is_the_pod_at_its_new_size_off_its_node_since_the_resize() {
        let s = stand_in(&resized("node-3", 4000, 12000, ResizeReason::Infeasible)).unwrap();
        assert_eq!((s.requests.cpu_milli, s.requests.pods, s.node_name.as_deref(), s.phase), (12000, 1, None, PodPhase::Pending));
        assert_eq!(s.created_s, 500);
        assert!(s.is_pending_demand() && s.resize.is_none());
        let n3 = Node::new("node-3", Resources::new(64000, 1 << 40));
        let n4 = Node::new("node-4", Resources::new(64000, 1 << 40));
        assert!(!crate::predicates::node_affinity_matches(&s, &n3.labels, &n3.name));
        assert!(crate::predicates::node_affinity_matches(&s, &n4.labels, &n4.name));
    }

    #[test]
    fn a_stand_in_keeps_the_pods_own_affinity_in_every_term() {
        let mut p = resized("a", 1000, 2000, ResizeReason::Deferred);
        p.node_affinity = vec![
            NodeSelectorTerm { match_expressions: vec![Requirement::new("zone", Operator::In, &["x"])], match_fields: Vec::new() },
            NodeSelectorTerm { match_expressions: vec![Requirement::new("zone", Operator::In, &["y"])], match_fields: Vec::new() },
        ];
        let s = stand_in(&p).unwrap();
        let a = Node::new("a", Resources::new(8000, 1 << 34)).with_labels(&[("zone", "x")]);
        let b = Node::new("b", Resources::new(8000, 1 << 34)).with_labels(&[("zone", "y")]);
        let c = Node::new("c", Resources::new(8000, 1 << 34)).with_labels(&[("zone", "z")]);
        let fits = |n: &Node| crate::predicates::node_affinity_matches(&s, &n.labels, &n.name);
        assert_eq!((fits(&a), fits(&b), fits(&c)), (false, true, false));
    }

    #[test]
    fn pods_that_are_no_resize_demand_have_no_stand_in() {
        let mut pending = resized("a", 1000, 2000, ResizeReason::Infeasible);
        pending.node_name = None;
        pending.phase = PodPhase::Pending;
        let mut finished = resized("a", 1000, 2000, ResizeReason::Infeasible);
        finished.phase = PodPhase::Succeeded;
        let mut leaving = resized("a", 1000, 2000, ResizeReason::Infeasible);
        leaving.terminating = true;
        let mut expendable = resized("a", 1000, 2000, ResizeReason::Infeasible);
        expendable.priority = -11;
        // Nothing would make it again where the room is.
        let mut bare = resized("a", 1000, 2000, ResizeReason::Infeasible);
        bare.owner = None;
        for p in [pending, finished, leaving, expendable, bare, Pod::new("ns", "plain", Resources::new(1000, 0)).bound_to("a")] {
            assert!(stand_in(&p).is_none(), "{p:?}");
            assert!(wait_of(&p).is_none());
        }
    }

    #[test]
    fn expanding_twice_adds_nothing() {
        let snap = Snapshot { pods: vec![resized("a", 1000, 2000, ResizeReason::Infeasible)].into(), ..Default::default() };
        let once = with_demand(&snap).into_owned();
        assert_eq!(once.pods.len(), 2);
        assert_eq!(once.pods[0].node_name.as_deref(), Some("a"));
        assert_eq!(once.pods[0].requests.cpu_milli, 1000);
        let twice = with_demand(&once);
        assert!(matches!(twice, Cow::Borrowed(_)));
        let none = Snapshot::default();
        assert!(matches!(with_demand(&none), Cow::Borrowed(_)));
    }

    #[test]
    fn the_wait_names_what_grows() {
        let mut p = resized("node-3", 4000, 12000, ResizeReason::Infeasible);
        assert_eq!(wait_of(&p).unwrap().to_string(), "resize to 12 CPU infeasible on node-3");
        p.resize.as_mut().unwrap().desired = Resources::new(4000, 48 << 30).with_extended(crate::GPU, 2);
        p.resize.as_mut().unwrap().reason = ResizeReason::Deferred;
        assert_eq!(wait_of(&p).unwrap().to_string(), "resize to 48Gi memory, 2 nvidia.com/gpu deferred on node-3");
        // A deferred resize is counted at its new size: what grows is told
        // against what the kubelet gave.
        p.requests = Resources::new(4000, 48 << 30).with_extended(crate::GPU, 2);
        p.resize.as_mut().unwrap().given = Some(Resources::new(4000, 1 << 30));
        assert_eq!(wait_of(&p).unwrap().to_string(), "resize to 48Gi memory, 2 nvidia.com/gpu deferred on node-3");
    }
}
