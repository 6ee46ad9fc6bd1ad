//! Stranded resources: capacity that costs power or confuses the scheduler
//! because its records disagree.
//!
//! - A server powered on with no claim and no node that the warm-spare
//!   policy cannot govern (quarantined or in maintenance). Healthy ones
//!   are warm spares: the core powers them off once it pays.
//! - A Node that names a server the inventory no longer has.
//! - A claim whose server an operator put in maintenance.
//!
//! Finding is pure ([`find`]); the controller repairs each finding once it
//! has persisted past a grace period, or reports it and leaves it alone
//! when repair would be unsafe.

use ironclaim_k8s::api::server::PowerState;
use kube::ResourceExt;

use crate::index::{Index, node_server};

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Finding {
    /// On, unclaimed, no node, and out of the warm-spare policy's reach.
    ServerOnUnused { server: String, maintenance: bool },
    /// A Node whose server is gone from the inventory.
    NodeWithoutServer { node: String, server: String, workload_pods: usize },
    /// A live claim on a server in maintenance.
    ClaimOnMaintenance { claim: String, server: String, node: Option<String> },
}

impl Finding {
    /// Identity across passes, for the grace period.
    pub fn key(&self) -> String {
        match self {
            Finding::ServerOnUnused { server, .. } => format!("server/{server}"),
            Finding::NodeWithoutServer { node, .. } => format!("node/{node}"),
            Finding::ClaimOnMaintenance { claim, .. } => format!("claim/{claim}"),
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            Finding::ServerOnUnused { .. } => "server_on_unused",
            Finding::NodeWithoutServer { .. } => "node_without_server",
            Finding::ClaimOnMaintenance { .. } => "claim_on_maintenance",
        }
    }
}

/// Every stranded resource in the index, in a stable order.
pub fn find(index: &Index) -> Vec<Finding> {
    let mut out = Vec::new();
    for (name, server) in &index.servers {
        let status = server.status.clone().unwrap_or_default();
        let on = matches!(status.power_state, Some(PowerState::On | PowerState::PoweringOn));
        let claimed = status.claim.as_deref().is_some_and(|c| !c.is_empty());
        let unhealthy = server.spec.maintenance || status.quarantined;
        if on && !claimed && unhealthy && index.node_of_server(name).is_none() {
            out.push(Finding::ServerOnUnused { server: name.clone(), maintenance: server.spec.maintenance });
        }
    }
    for (name, node) in &index.nodes {
        let Some(server) = node_server(node) else { continue };
        if index.servers.contains_key(&server) {
            continue;
        }
        let workload_pods = index
            .pods
            .values()
            .filter(|e| e.pod.node_name.as_deref() == Some(name.as_str()) && e.pod.occupies_node() && !e.pod.is_daemonset_pod())
            .count();
        out.push(Finding::NodeWithoutServer { node: name.clone(), server, workload_pods });
    }
    for claim in index.claims.values() {
        if claim.status.as_ref().is_some_and(|s| s.failure_reason.is_some()) {
            continue;
        }
        let Some(server) = index.servers.get(&claim.spec.server) else { continue };
        if server.spec.maintenance {
            out.push(Finding::ClaimOnMaintenance {
                claim: claim.name_any(),
                server: claim.spec.server.clone(),
                node: index.node_of_server(&claim.spec.server).map(ResourceExt::name_any),
            });
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_k8s::api::{ServerClaim, Server};
    use k8s_openapi::api::core::v1::Node;
    use serde_json::json;

    fn server(name: &str, power: &str, claim: Option<&str>, maintenance: bool, quarantined: bool) -> Server {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name},
            "spec": {
                "bmc": {"address": "http://bmc/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "s", "namespace": "n"}},
                "hardware": {"cpu": "8", "memory": "16Gi"},
                "maintenance": maintenance
            },
            "status": {"powerState": power, "claim": claim, "quarantined": quarantined}
        }))
        .expect("server")
    }

    fn node(name: &str, server: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"providerID": format!("ironclaim://{server}")}
        }))
        .expect("node")
    }

    #[test]
    fn a_healthy_idle_server_is_a_warm_spare_not_stranded() {
        let mut index = Index::default();
        index.apply(server("spare", "On", None, false, false));
        index.apply(server("busy", "On", Some("c"), false, false));
        assert!(find(&index).is_empty());
    }

    #[test]
    fn quarantined_or_maintenance_servers_left_on_are_found() {
        let mut index = Index::default();
        index.apply(server("q", "On", None, false, true));
        index.apply(server("m", "On", None, true, false));
        index.apply(server("m-off", "Off", None, true, false));
        assert_eq!(
            find(&index),
            [Finding::ServerOnUnused { server: "m".into(), maintenance: true }, Finding::ServerOnUnused { server: "q".into(), maintenance: false },]
        );
    }

    #[test]
    fn a_node_naming_a_deleted_server_and_a_claim_on_maintenance_are_found() {
        let mut index = Index::default();
        index.apply(node("ghost", "gone"));
        index.apply(server("m", "On", Some("c1"), true, false));
        index.apply(node("m", "m"));
        let claim: ServerClaim = serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": "c1"},
            "spec": {"server": "m", "pool": "p", "pods": []}
        }))
        .expect("claim");
        index.apply(claim);
        assert_eq!(
            find(&index),
            [
                Finding::NodeWithoutServer { node: "ghost".into(), server: "gone".into(), workload_pods: 0 },
                Finding::ClaimOnMaintenance { claim: "c1".into(), server: "m".into(), node: Some("m".into()) },
            ]
        );
    }
}
