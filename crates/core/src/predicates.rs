//! The per-node filters of kube-scheduler that do not depend on other pods:
//! resources, node name, node selector, required node affinity, taints and
//! tolerations, cordoned nodes, host ports. Each failure names its
//! constraint so that "why not" is never a guess.

use crate::labels::{Labels, Taint, TaintEffect, untolerated_taint};
use crate::model::{HostPort, Pod};
use crate::resources::{Resources, Shortfall};
use std::fmt;

/// The taint kube-scheduler's NodeUnschedulable filter treats a cordoned
/// node as carrying; tolerating it lets a pod onto a cordoned node.
pub const UNSCHEDULABLE_TAINT: &str = "node.kubernetes.io/unschedulable";
/// The taint the node lifecycle controller gives a NotReady node.
pub const NOT_READY_TAINT: &str = "node.kubernetes.io/not-ready";
/// The taint the node lifecycle controller gives a node whose Ready
/// condition is Unknown (no word from its kubelet).
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";
/// The taints the node lifecycle controller keeps on a node while its Ready
/// condition is not True, and lifts some time after it turns True.
pub const LIFECYCLE_TAINTS: [&str; 2] = [NOT_READY_TAINT, UNREACHABLE_TAINT];

/// Why a pod does not fit one node, before other pods are considered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeMismatch {
    Resources(Shortfall),
    NodeSelector { key: String, want: String },
    NodeAffinity(String),
    Taint(Taint),
    HostPort(u16),
}

impl NodeMismatch {
    /// A short label to count mismatches by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            NodeMismatch::Resources(_) => "resources",
            NodeMismatch::NodeSelector { .. } => "node selector",
            NodeMismatch::NodeAffinity(_) => "node affinity",
            NodeMismatch::Taint(_) => "taint",
            NodeMismatch::HostPort(_) => "host port",
        }
    }
}

impl fmt::Display for NodeMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeMismatch::Resources(s) => write!(f, "{s}"),
            NodeMismatch::NodeSelector { key, want } => write!(f, "node selector {key}={want}"),
            NodeMismatch::NodeAffinity(terms) => write!(f, "required node affinity {terms}"),
            NodeMismatch::Taint(t) => write!(f, "untolerated taint {t}"),
            NodeMismatch::HostPort(p) => write!(f, "host port {p} in use"),
        }
    }
}

/// The NodeAffinity filter as a yes or no, without building a reason: the
/// scheduler's hot path.
pub fn node_affinity_matches(pod: &Pod, labels: &Labels, node_name: &str) -> bool {
    pod.node_selector.iter().all(|(k, v)| labels.get(k) == Some(v))
        && (pod.node_affinity.is_empty() || pod.node_affinity.iter().any(|t| t.matches(labels, node_name)))
}

/// The TaintToleration and NodeUnschedulable filters as a yes or no.
pub fn taints_tolerated(pod: &Pod, taints: &[Taint], cordoned: bool) -> bool {
    if untolerated_taint(taints, &pod.tolerations).is_some() {
        return false;
    }
    !cordoned || {
        let t = Taint::new(UNSCHEDULABLE_TAINT, "", TaintEffect::NoSchedule);
        pod.tolerations.iter().any(|tol| tol.tolerates(&t))
    }
}

/// nodeSelector and required node affinity (NodeAffinity filter).
pub fn check_node_affinity(pod: &Pod, labels: &Labels, node_name: &str) -> Result<(), NodeMismatch> {
    for (key, want) in &pod.node_selector {
        if labels.get(key) != Some(want) {
            return Err(NodeMismatch::NodeSelector { key: key.clone(), want: want.clone() });
        }
    }
    if !pod.node_affinity.is_empty() && !pod.node_affinity.iter().any(|t| t.matches(labels, node_name)) {
        let terms: Vec<String> = pod
            .node_affinity
            .iter()
            .map(|t| {
                let parts: Vec<String> = t.match_expressions.iter().chain(&t.match_fields).map(|r| r.to_string()).collect();
                parts.join(" and ")
            })
            .collect();
        return Err(NodeMismatch::NodeAffinity(terms.join(" or ")));
    }
    Ok(())
}

/// TaintToleration and NodeUnschedulable filters.
pub fn check_taints(pod: &Pod, taints: &[Taint], cordoned: bool) -> Result<(), NodeMismatch> {
    if let Some(t) = untolerated_taint(taints, &pod.tolerations) {
        return Err(NodeMismatch::Taint(t.clone()));
    }
    if cordoned {
        let t = Taint::new(UNSCHEDULABLE_TAINT, "", TaintEffect::NoSchedule);
        if !pod.tolerations.iter().any(|tol| tol.tolerates(&t)) {
            return Err(NodeMismatch::Taint(t));
        }
    }
    Ok(())
}

/// NodePorts filter.
pub fn check_host_ports(pod: &Pod, used: &[HostPort]) -> Result<(), NodeMismatch> {
    for want in &pod.host_ports {
        if used.iter().any(|u| u.conflicts(want)) {
            return Err(NodeMismatch::HostPort(want.port));
        }
    }
    Ok(())
}

/// NodeResourcesFit filter.
pub fn check_resources(requests: &Resources, free: &Resources) -> Result<(), NodeMismatch> {
    requests.fits_in(free).map_err(NodeMismatch::Resources)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{NodeSelectorTerm, Operator, Requirement, Toleration, TolerationOperator};

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn fast_and_explaining_filters_agree() {
        let mut pod = Pod::new("ns", "p", Resources::default()).with_node_selector(&[("a", "1")]);
        pod.tolerations.push(Toleration::exists("t"));
        let cases = [
            (labels(&[("a", "1")]), vec![], false),
            (labels(&[("a", "2")]), vec![], false),
            (labels(&[("a", "1")]), vec![Taint::new("t", "", TaintEffect::NoSchedule)], false),
            (labels(&[("a", "1")]), vec![Taint::new("u", "", TaintEffect::NoSchedule)], false),
            (labels(&[("a", "1")]), vec![], true),
        ];
        for (node, taints, cordoned) in cases {
            assert_eq!(node_affinity_matches(&pod, &node, "n"), check_node_affinity(&pod, &node, "n").is_ok());
            assert_eq!(taints_tolerated(&pod, &taints, cordoned), check_taints(&pod, &taints, cordoned).is_ok());
        }
    }

    #[test]
    fn node_selector_needs_every_pair() {
        let pod = Pod::new("ns", "p", Resources::default()).with_node_selector(&[("a", "1"), ("b", "2")]);
        assert!(check_node_affinity(&pod, &labels(&[("a", "1"), ("b", "2"), ("c", "3")]), "n").is_ok());
        let err = check_node_affinity(&pod, &labels(&[("a", "1")]), "n").unwrap_err();
        assert_eq!(err.to_string(), "node selector b=2");
    }

    #[test]
    fn affinity_terms_are_ored_and_expressions_anded() {
        let mut pod = Pod::new("ns", "p", Resources::default());
        pod.node_affinity = vec![
            NodeSelectorTerm {
                match_expressions: vec![Requirement::new("zone", Operator::In, &["a"]), Requirement::new("gpu", Operator::Exists, &[])],
                match_fields: vec![],
            },
            NodeSelectorTerm { match_expressions: vec![Requirement::new("zone", Operator::In, &["b"])], match_fields: vec![] },
        ];
        let cases = [
            (labels(&[("zone", "a"), ("gpu", "x")]), true),
            (labels(&[("zone", "a")]), false),
            (labels(&[("zone", "b")]), true),
            (labels(&[("zone", "c"), ("gpu", "x")]), false),
        ];
        for (node, want) in cases {
            assert_eq!(check_node_affinity(&pod, &node, "n").is_ok(), want, "{node:?}");
        }
    }

    #[test]
    fn cordoned_node_admits_only_pods_tolerating_unschedulable() {
        let pod = Pod::new("ns", "p", Resources::default());
        assert!(check_taints(&pod, &[], true).is_err());
        let mut tolerant = pod.clone();
        tolerant.tolerations.push(Toleration {
            key: UNSCHEDULABLE_TAINT.into(),
            operator: TolerationOperator::Exists,
            effect: Some(TaintEffect::NoSchedule),
            ..Default::default()
        });
        assert!(check_taints(&tolerant, &[], true).is_ok());
    }

    #[test]
    fn no_execute_and_no_schedule_block_prefer_does_not() {
        let pod = Pod::new("ns", "p", Resources::default());
        for (effect, blocks) in [(TaintEffect::NoSchedule, true), (TaintEffect::NoExecute, true), (TaintEffect::PreferNoSchedule, false)] {
            let taints = [Taint::new("k", "v", effect)];
            assert_eq!(check_taints(&pod, &taints, false).is_err(), blocks, "{effect:?}");
        }
    }

    #[test]
    fn host_ports_conflict_by_port_protocol_and_address() {
        let mut pod = Pod::new("ns", "p", Resources::default());
        pod.host_ports.push(HostPort { port: 80, protocol: "TCP".into(), host_ip: "10.0.0.1".into() });
        let used = |port, proto: &str, ip: &str| vec![HostPort { port, protocol: proto.into(), host_ip: ip.into() }];
        assert!(check_host_ports(&pod, &used(80, "TCP", "")).is_err());
        assert!(check_host_ports(&pod, &used(80, "TCP", "10.0.0.1")).is_err());
        assert!(check_host_ports(&pod, &used(80, "TCP", "10.0.0.2")).is_ok());
        assert!(check_host_ports(&pod, &used(80, "UDP", "")).is_ok());
        assert!(check_host_ports(&pod, &used(81, "TCP", "")).is_ok());
    }
}
