//! The driver's [`World`] read from the controller's [`Index`]: the
//! autoscaler sees the cluster exactly as the watches last delivered it.
//!
//! No IO: every read is a copy out of the index at one `now`. What must be
//! fresh (the pods on a node about to be powered off) the executor reads
//! again from the API before it acts.

use ironclaim_core::model::{Pod, Seconds, Snapshot};
use ironclaim_driver::autoscaler::World;
use ironclaim_driver::{ClaimRecord, ClaimView, NodeFacts, ServerFacts, Stage};
use ironclaim_k8s::api::ServerClaim;
use ironclaim_k8s::api::serverclaim::ServerClaimStatus;
use ironclaim_k8s::convert::stage_durations;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use crate::gates;
use crate::index::{self, FailureBackoff, Index};
use crate::scaledown::drain::DRAIN_ABANDONED_ANNOTATION;
use crate::timeline;

/// The index at one moment, as the autoscaler reads it.
pub struct IndexWorld<'a> {
    pub index: &'a Index,
    pub now_s: Seconds,
    pub backoff: FailureBackoff,
    /// The fleet's power budget, from the controller's settings: the core
    /// counts it on every decision, scale-up and scale-down alike.
    pub power_budget_watts: Option<f64>,
    /// How often servers may change power, from the controller's settings.
    pub transition_limits: &'a ironclaim_core::transitions::TransitionLimits,
}

/// A ServerClaim as the driver records a claim. A claim with no stage yet
/// (its first status write was lost) is at [`Stage::Selected`]; stages
/// past serving (draining, powering off, off) count as serving.
pub fn record_of(claim: &ServerClaim) -> ClaimRecord {
    let empty = ServerClaimStatus::default();
    let status = claim.status.as_ref().unwrap_or(&empty);
    let as_driver = |s: Stage| s;
    let history: Vec<(Stage, Seconds)> = status.stages.iter().map(|r| (as_driver(r.stage), timeline::seconds(&r.start_time))).collect();
    let created_s = claim.metadata.creation_timestamp.as_ref().map(timeline::seconds).or_else(|| history.first().map(|h| h.1)).unwrap_or(0);
    ClaimRecord {
        name: claim.name_any(),
        server: claim.spec.server.clone(),
        pool: claim.spec.pool.clone(),
        pods: claim.spec.pods.iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect(),
        stage: status.stage.map_or(Stage::Selected, as_driver),
        stage_started_s: timeline::stage_started_s(status).unwrap_or(created_s),
        failure: status.failure_reason,
        node: status.node_name.clone(),
        created_s,
        history,
    }
}

/// Since when the node's Ready condition has been True.
fn ready_since_s(node: &Node) -> Option<Seconds> {
    let ready = ironclaim_k8s::node::true_condition(node, "Ready")?;
    Some(ready.last_transition_time.as_ref().map_or(0, timeline::seconds))
}

impl IndexWorld<'_> {
    fn view(&self, claim: &ServerClaim) -> ClaimView {
        let index = self.index;
        let record = record_of(claim);
        let server = index.servers.get(&claim.spec.server).map(|s| {
            let status = s.status.as_ref();
            ServerFacts {
                holder: status.and_then(|st| st.claim.clone()).filter(|c| !c.is_empty()),
                durations: stage_durations(s).unwrap_or_default(),
                failures: status.map_or(0, |st| u32::try_from(st.failures.max(0)).unwrap_or(u32::MAX)),
                power_on_sent: status.is_some_and(|st| st.powered_on_by_ironclaim),
            }
        });
        let node = index.node_of_server(&claim.spec.server);
        let node_name = node.map(ResourceExt::name_any);
        let facts = node.map(|n| {
            let since = ready_since_s(n);
            NodeFacts {
                name: n.name_any(),
                ready: since.is_some(),
                ready_since_s: since,
                lifecycle_taint: gates::lifecycle_taint(n),
                unmet: gates::unmet(n, index.pools.get(&claim.spec.pool)),
            }
        });
        let mut pods_pending = Vec::new();
        let mut pods_bound = 0;
        for p in &claim.spec.pods {
            let key = format!("{}/{}", p.namespace, p.name);
            let Some(entry) = index.pods.get(&key) else { continue };
            // A pod of the same name recreated since is not the claim's.
            if p.uid.is_some() && entry.pod.uid.is_some() && p.uid != entry.pod.uid {
                continue;
            }
            if entry.pod.node_name.is_some() && entry.pod.node_name == node_name {
                pods_bound += 1;
            } else if entry.pod.is_pending_demand() {
                pods_pending.push(key);
            }
        }
        ClaimView { record, server, node: facts, pods_pending, pods_bound }
    }
}

impl World for IndexWorld<'_> {
    fn pending(&self) -> Vec<String> {
        self.index.pending_pod_keys().cloned().collect()
    }

    fn snapshot(&self, _scale_up: Option<usize>) -> Snapshot {
        let mut snapshot = self.index.snapshot(self.now_s, self.backoff).0;
        snapshot.power_budget_watts = self.power_budget_watts;
        snapshot.transition_limits = self.transition_limits.clone();
        snapshot
    }

    fn claims(&self) -> Vec<ClaimView> {
        self.index.claims.values().map(|c| self.view(c)).collect()
    }

    fn last_failure_s(&self, server: &str) -> Option<Seconds> {
        self.index.servers.get(server).and_then(|s| index::last_failure_s(s))
    }

    fn abandoned_drains(&self) -> Vec<(String, Seconds)> {
        self.index
            .nodes
            .values()
            .filter_map(|n| {
                let at = crate::scaledown::pacing::abandoned_at(n.annotations().get(DRAIN_ABANDONED_ANNOTATION)?)?;
                Some((n.name_any(), at))
            })
            .collect()
    }

    fn recorded_idle(&self, server: &str) -> (Option<Seconds>, Option<Seconds>) {
        let Some(s) = self.index.servers.get(server) else { return (None, None) };
        let status = s.status.as_ref();
        let recorded = status.and_then(|st| st.idle_since.as_ref()).map(timeline::seconds);
        let claimed = status.and_then(|st| st.claimed_at.as_ref()).map(timeline::seconds);
        let registered = self.index.node_of_server(server).and_then(|n| n.metadata.creation_timestamp.as_ref()).map(timeline::seconds);
        (recorded, claimed.max(registered))
    }

    fn pods_on(&self, node: &str) -> Vec<Pod> {
        self.index.pods.values().filter(|e| e.pod.node_name.as_deref() == Some(node)).map(|e| (*e.pod).clone()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_k8s::api::Server;
    use serde_json::json;

    const NOW_S: Seconds = 1_767_614_400;
    const BACKOFF: FailureBackoff = FailureBackoff { base_s: 60, max_s: 600 };

    fn server(name: &str, claim: Option<&str>) -> Server {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": name},
            "spec": {"bmc": {"address": "https://10.0.0.1/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}},
                     "hardware": {"cpu": "16", "memory": "64Gi"}},
            "status": {"claim": claim, "failures": 2, "claimedAt": "2026-01-05T11:50:00Z"}
        }))
        .expect("server")
    }

    fn claim(name: &str, server: &str, status: serde_json::Value) -> ServerClaim {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": name, "creationTimestamp": "2026-01-05T11:50:00Z"},
            "spec": {"server": server, "pool": "general", "pods": [
                {"namespace": "app", "name": "web", "uid": "uid-web"},
                {"namespace": "app", "name": "db", "uid": "uid-db"},
                {"namespace": "app", "name": "gone", "uid": "uid-gone"}]},
            "status": status
        }))
        .expect("serverclaim")
    }

    fn node(name: &str, server: &str, ready_since: Option<&str>, annotations: serde_json::Value) -> Node {
        let conditions = ready_since.map(|t| json!([{"type": "Ready", "status": "True", "lastTransitionTime": t}])).unwrap_or(json!([]));
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations, "creationTimestamp": "2026-01-05T11:55:00Z"},
            "spec": {"providerID": format!("ironclaim://{server}")},
            "status": {"conditions": conditions}
        }))
        .expect("node")
    }

    fn pod(name: &str, node: Option<&str>) -> k8s_openapi::api::core::v1::Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "app", "uid": format!("uid-{name}"), "creationTimestamp": "2026-01-05T11:49:00Z"},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        }))
        .expect("pod")
    }

    #[test]
    fn a_joined_claim_reads_its_server_node_and_pods_from_the_index() {
        let mut index = Index::default();
        index.apply(server("s1", Some("c1")));
        index.apply(node("n1", "s1", Some("2026-01-05T11:58:00Z"), json!({})));
        index.apply(pod("web", Some("n1")));
        index.apply(pod("db", None));
        index.apply(claim(
            "c1",
            "s1",
            json!({"stage": "Joined", "nodeName": "n1", "stages": [
                {"stage": "Selected", "startTime": "2026-01-05T11:50:00Z", "outcome": "Succeeded"},
                {"stage": "PoweringOn", "startTime": "2026-01-05T11:50:01Z", "outcome": "Succeeded"},
                {"stage": "Booting", "startTime": "2026-01-05T11:51:00Z", "outcome": "Succeeded"},
                {"stage": "Joined", "startTime": "2026-01-05T11:55:00Z", "outcome": "InProgress"}]}),
        ));
        let world = IndexWorld { index: &index, now_s: NOW_S, backoff: BACKOFF, power_budget_watts: None, transition_limits: &Default::default() };
        let views = world.claims();
        assert_eq!(views.len(), 1);
        let v = &views[0];
        assert_eq!((v.record.stage, v.record.stage_started_s, v.record.failure), (Stage::Joined, NOW_S - 300, None));
        assert_eq!(v.record.entered_s(Stage::Booting), Some(NOW_S - 540));
        assert_eq!(v.record.pods, ["app/web", "app/db", "app/gone"]);
        let server = v.server.as_ref().expect("server facts");
        assert_eq!((server.holder.as_deref(), server.failures), (Some("c1"), 2));
        let node = v.node.as_ref().expect("node facts");
        assert_eq!((node.name.as_str(), node.ready, node.ready_since_s), ("n1", true, Some(NOW_S - 120)));
        assert!(node.passed(), "{node:?}");
        assert_eq!((v.pods_pending.as_slice(), v.pods_bound), (&["app/db".to_string()][..], 1));
        assert_eq!(world.pending(), ["app/db"]);
        assert_eq!(world.pods_on("n1").len(), 1);
        assert_eq!(world.recorded_idle("s1"), (None, Some(NOW_S - 300)), "the node registered after the claim was written");
    }

    #[test]
    fn a_claim_with_no_status_is_selected_and_a_failed_one_keeps_its_reason() {
        let mut index = Index::default();
        index.apply(claim("c1", "s1", json!(null)));
        index.apply(claim(
            "c2",
            "s2",
            json!({"stage": "Booting", "failureReason": "RegistrationTimedOut", "stages": [
                {"stage": "Booting", "startTime": "2026-01-05T11:51:00Z", "outcome": "TimedOut"}]}),
        ));
        let world = IndexWorld { index: &index, now_s: NOW_S, backoff: BACKOFF, power_budget_watts: None, transition_limits: &Default::default() };
        let views = world.claims();
        assert_eq!((views[0].record.stage, views[0].record.stage_started_s), (Stage::Selected, NOW_S - 600));
        assert!(views[0].server.is_none(), "the server is not in the inventory");
        assert_eq!(views[1].record.failure, Some(ironclaim_driver::FailureReason::RegistrationTimedOut));
    }

    #[test]
    fn an_abandoned_drain_is_read_from_its_annotation_and_a_bad_value_is_ignored() {
        let mut index = Index::default();
        index.apply(node("n1", "s1", None, json!({DRAIN_ABANDONED_ANNOTATION: "2026-01-05T11:00:00Z"})));
        index.apply(node("n2", "s2", None, json!({DRAIN_ABANDONED_ANNOTATION: "yesterday"})));
        let world = IndexWorld { index: &index, now_s: NOW_S, backoff: BACKOFF, power_budget_watts: None, transition_limits: &Default::default() };
        assert_eq!(world.abandoned_drains(), [("n1".to_string(), NOW_S - 3600)]);
    }

    fn cold_server(name: &str, peak_watts: i64) -> Server {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": name},
            "spec": {"bmc": {"address": "https://10.0.0.1/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}},
                     "hardware": {"cpu": "16", "memory": "64Gi"}, "power": {"idleWatts": 150, "peakWatts": peak_watts}},
            "status": {"powerState": "Off"}
        }))
        .expect("server")
    }

    #[test]
    fn the_power_budget_reaches_the_decision_and_counts_the_peak_watts_of_servers_on() {
        let mut index = Index::default();
        index.apply(cold_server("cold", 400));
        // On and taken: it hosts nothing new, but it draws from the budget.
        let mut busy = cold_server("busy", 500);
        let status = busy.status.as_mut().expect("status");
        status.power_state = Some(ironclaim_k8s::api::server::PowerState::On);
        status.claim = Some("other".into());
        index.apply(busy);
        index.apply(pod("db", None));
        let decide = |budget: Option<f64>| {
            let world =
                IndexWorld { index: &index, now_s: NOW_S, backoff: BACKOFF, power_budget_watts: budget, transition_limits: &Default::default() };
            let plan = ironclaim_core::provision(&world.snapshot(None), NOW_S);
            plan.decision("app/db").expect("a decision").outcome.clone()
        };
        use ironclaim_core::{Outcome, Unschedulable};
        for budget in [None, Some(900.0)] {
            assert!(matches!(decide(budget), Outcome::NewClaim { ref server, .. } if server == "cold"), "{budget:?}: {:?}", decide(budget));
        }
        match decide(Some(899.0)) {
            Outcome::Unschedulable { reason: Unschedulable::PowerBudget { budget_watts, needed_watts } } => {
                assert_eq!((budget_watts, needed_watts), (899.0, 1.0));
            }
            other => panic!("{other:?}"),
        }
    }
}
