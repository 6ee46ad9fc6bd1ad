//! The dashboard: `/ui` (one page, its script and style inside it, no
//! outside asset) and `/ui/state` (what the page shows, as JSON), served
//! read-only beside `/metrics`. Every number on the page is a field of
//! [`State`], and every field is read from the API objects the controller
//! watches, as `ironclaim servers` and `ironclaim explain` read them
//! (docs/dashboard.md names the source of each).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ironclaim_core::Seconds;
use ironclaim_k8s::api::serverclaim::{Stage, StageOutcome};
use ironclaim_k8s::server_to_core;
use kube::ResourceExt;
use serde::Serialize;

use crate::controller::Decision;
use crate::index::{FailureBackoff, Index};
use crate::inventory::{Inventory, inventory};
use crate::timeline;

/// The page.
pub const PAGE: &str = include_str!("dashboard/index.html");

/// The labels a server's tile is grouped by, the first one it has.
pub const GROUP_LABELS: [&str; 3] = ["topology.kubernetes.io/rack", "rack", "topology.kubernetes.io/zone"];

/// What `/ui/state` answers.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct State {
    /// Seconds since the epoch when it was read.
    pub now: Seconds,
    /// The servers, their draw and what powering off saves, as `ironclaim
    /// servers` reads them.
    pub inventory: Inventory,
    /// One tile per server, in the order of `inventory.servers`.
    pub tiles: Vec<Tile>,
    /// Watts the fleet would draw with every server on at idle, against
    /// what it draws now.
    pub all_on_watts: i64,
    /// `--power-budget-watts`, when set.
    pub power_budget_watts: Option<f64>,
    /// Claims not yet serving, and those that failed in the last hour.
    pub claims: Vec<ClaimTimeline>,
    /// Pods waiting for a node, grouped by what the core decides for them.
    pub pending: Vec<PendingGroup>,
    /// The last decisions, newest first.
    pub decisions: Vec<DecisionLine>,
    /// The last Events this replica sent, newest first: why a server was
    /// powered on or kept on, why a drain waits.
    pub events: Vec<crate::events::Recorded>,
}

/// A server as its tile shows it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tile {
    pub name: String,
    /// The value of the first of [`GROUP_LABELS`] it has, else `fleet`.
    pub group: String,
    /// `off`, `powering on`, `booting`, `joined`, `ready`, `serving`,
    /// `on`, `draining`, `powering off`, `failed`, `quarantined`,
    /// `maintenance`, `unadopted`, `identity mismatch` or `unknown`.
    pub state: String,
}

/// One claim's stages as bars.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimTimeline {
    pub name: String,
    pub server: String,
    pub pool: String,
    /// Set when it failed.
    pub failure_reason: Option<String>,
    pub stages: Vec<StageBar>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StageBar {
    pub stage: &'static str,
    /// Seconds from the claim's first stage to this one's start.
    pub start_s: Seconds,
    /// How long it took, or has taken so far.
    pub took_s: Seconds,
    /// What the server's durations expect of it (its measured history,
    /// else its spec).
    pub expected_s: Seconds,
    /// `InProgress`, `Succeeded`, `Failed` or `TimedOut`.
    pub outcome: String,
    /// Longer than expected.
    pub slow: bool,
}

/// Pending pods that wait for the same kind of thing.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingGroup {
    /// `existing`, `in_flight`, `new_claim` or `unschedulable`.
    pub outcome: &'static str,
    pub pods: Vec<PendingPod>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingPod {
    pub pod: String,
    /// What `ironclaim explain` says of it.
    pub note: String,
    pub eta_s: Option<Seconds>,
    pub waiting_s: Seconds,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecisionLine {
    pub pending_pods: usize,
    pub claims_opened: usize,
    pub claims_failed: usize,
    pub latency_ms: u128,
}

/// A tile's state from its inventory row and its node.
fn tile_state(row: &crate::inventory::Row, draining: bool) -> String {
    let health = row.health.as_str();
    if health == "identity mismatch" {
        return health.into();
    }
    if health == "not adopted" {
        return "unadopted".into();
    }
    if health == "maintenance" || health.starts_with("quarantined") {
        return health.split(' ').next().unwrap_or(health).into();
    }
    if row.stage.as_deref().is_some_and(|s| s.starts_with("failed")) {
        return "failed".into();
    }
    match row.power {
        "off" => return "off".into(),
        "powering off" => return "powering off".into(),
        "unknown" => return "unknown".into(),
        _ => {}
    }
    if draining {
        return "draining".into();
    }
    match row.stage.as_deref() {
        Some("powering on") | Some("opening (locked)") | Some("selected") => "powering on".into(),
        Some(stage @ ("booting" | "joined" | "ready" | "serving")) => stage.into(),
        _ if row.power == "powering on" => "powering on".into(),
        _ => "on".into(),
    }
}

fn expected(stage: Stage, d: &ironclaim_core::StageDurations) -> Seconds {
    match stage {
        Stage::Selected | Stage::Serving => 0,
        Stage::PoweringOn => d.power_on_s,
        Stage::Booting => d.boot_s,
        Stage::Joined => d.join_s,
        Stage::Ready => d.ready_s,
    }
}

/// The dashboard's state of `index` at `now`: [`read`], then
/// [`Read::decide`].
pub fn state(index: &Index, now: Seconds, decisions: &[Decision], power_budget_watts: Option<f64>) -> State {
    read(index, now, decisions, power_budget_watts).decide()
}

/// What the dashboard reads of `index` at `now`, before deciding.
pub fn read(index: &Index, now: Seconds, decisions: &[Decision], power_budget_watts: Option<f64>) -> Read {
    let inventory = inventory(index);
    let mut all_on_watts = 0i64;
    let mut tiles = Vec::with_capacity(inventory.servers.len());
    for row in &inventory.servers {
        let server = index.servers.get(&row.name);
        let labels = server.map(|s| &s.spec.labels);
        let group = GROUP_LABELS.iter().find_map(|k| labels.and_then(|l| l.get(*k)).cloned()).unwrap_or_else(|| "fleet".into());
        let draining =
            row.node.as_ref().and_then(|n| index.nodes.get(n)).and_then(|n| n.spec.as_ref()).is_some_and(|spec| spec.unschedulable == Some(true));
        if let Some(core) = server.and_then(|s| server_to_core(s).ok()) {
            all_on_watts += core.power.idle_watts.round() as i64;
        }
        tiles.push(Tile { name: row.name.clone(), group, state: tile_state(row, draining) });
    }

    let mut claims = Vec::new();
    for claim in index.claims.values() {
        let status = claim.status.clone().unwrap_or_default();
        let serving = status.stage == Some(Stage::Serving);
        let first = status.stages.first().map(|r| timeline::seconds(&r.start_time));
        let recent_failure =
            status.failure_reason.is_some() && status.stages.last().is_some_and(|r| now.saturating_sub(timeline::seconds(&r.start_time)) < 3600);
        if serving || (status.failure_reason.is_some() && !recent_failure) {
            continue;
        }
        let durations = index.servers.get(&claim.spec.server).and_then(|s| server_to_core(s).ok()).map(|s| s.durations).unwrap_or_default();
        let stages = status
            .stages
            .iter()
            .map(|r| {
                let start = timeline::seconds(&r.start_time);
                let took = match r.duration_seconds {
                    Some(d) => d.max(0) as Seconds,
                    None => now.saturating_sub(start),
                };
                let expected_s = expected(r.stage, &durations);
                StageBar {
                    stage: r.stage.label(),
                    start_s: start.saturating_sub(first.unwrap_or(start)),
                    took_s: took,
                    expected_s,
                    outcome: format!("{:?}", r.outcome),
                    slow: expected_s > 0 && took > expected_s && r.outcome != StageOutcome::Succeeded || r.outcome == StageOutcome::TimedOut,
                }
            })
            .collect();
        claims.push(ClaimTimeline {
            name: claim.name_any(),
            server: claim.spec.server.clone(),
            pool: claim.spec.pool.clone(),
            failure_reason: status.failure_reason.map(|r| format!("{r:?}")),
            stages,
        });
    }

    let (mut snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
    snapshot.power_budget_watts = power_budget_watts;
    let waiting = waiting_pods(index);
    let decisions = decisions
        .iter()
        .rev()
        .take(10)
        .map(|d| DecisionLine {
            pending_pods: d.pending_pods,
            claims_opened: d.claims_opened,
            claims_failed: d.claims_failed,
            latency_ms: d.latency.as_millis(),
        })
        .collect();
    Read {
        state: State { now, inventory, tiles, all_on_watts, power_budget_watts, claims, pending: Vec::new(), decisions, events: Vec::new() },
        snapshot,
        waiting,
    }
}

/// What is read under the index's lock: the state but its pending pods,
/// and what deciding them needs.
pub struct Read {
    pub state: State,
    snapshot: ironclaim_core::Snapshot,
    waiting: Vec<(String, Seconds)>,
}

impl Read {
    /// The state, with the core's decision for each waiting pod: taken
    /// after the index is let go, since deciding is the long part.
    pub fn decide(mut self) -> State {
        let now = self.state.now;
        let plan = ironclaim_core::provision(&self.snapshot, now);
        let mut groups: BTreeMap<&'static str, Vec<PendingPod>> = BTreeMap::new();
        for (key, created_s) in self.waiting {
            let Some(decision) = plan.decision(&key) else { continue };
            use ironclaim_core::outcome::Outcome;
            let eta_s = match &decision.outcome {
                Outcome::Existing { .. } => Some(0),
                Outcome::InFlight { eta_s, .. } | Outcome::NewClaim { eta_s, .. } => Some(*eta_s),
                Outcome::Unschedulable { .. } => None,
            };
            groups.entry(decision.outcome.label()).or_default().push(PendingPod {
                pod: key,
                note: timeline::outcome_note(&decision.outcome),
                eta_s,
                waiting_s: now.saturating_sub(created_s),
            });
        }
        self.state.pending = groups.into_iter().map(|(outcome, pods)| PendingGroup { outcome, pods }).collect();
        self.state
    }
}

/// The pods waiting for a node, with when each was created.
fn waiting_pods(index: &Index) -> Vec<(String, Seconds)> {
    index.pods.iter().filter(|(_, e)| e.pod.node_name.is_none() && e.pod.is_pending_demand()).map(|(key, e)| (key.clone(), e.pod.created_s)).collect()
}

/// What `/ui/state` reads, and its answer kept for a second: a page polled
/// by many viewers decides at most once a second.
pub struct Source {
    pub index: Arc<Mutex<Index>>,
    pub decisions: Arc<Mutex<Vec<Decision>>>,
    pub journal: crate::events::Journal,
    pub power_budget_watts: Option<f64>,
    cached: Mutex<Option<(Instant, Arc<String>)>>,
}

impl Source {
    pub fn new(
        index: Arc<Mutex<Index>>,
        decisions: Arc<Mutex<Vec<Decision>>>,
        journal: crate::events::Journal,
        power_budget_watts: Option<f64>,
    ) -> Self {
        Source { index, decisions, journal, power_budget_watts, cached: Mutex::default() }
    }

    /// The state as JSON.
    pub fn json(&self) -> Arc<String> {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, json)) = cached.as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return json.clone();
        }
        let now = jiff::Timestamp::now().as_second().max(0) as Seconds;
        let decisions = self.decisions.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let read = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            read(&index, now, &decisions, self.power_budget_watts)
        };
        let mut state = read.decide();
        state.events = self.journal.newest_first();
        let json = Arc::new(serde_json::to_string(&state).unwrap_or_else(|err| format!("{{\"error\": \"{err}\"}}")));
        *cached = Some((Instant::now(), json.clone()));
        json
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_k8s::api::{Server, ServerClaim, ServerPool};
    use k8s_openapi::api::core::v1::{Node, Pod};
    use serde_json::{Value, json};

    const NOW_S: Seconds = 1_767_614_400; // 2026-01-05T12:00:00Z

    fn server(name: &str, rack: &str, power: &str, claim: Option<&str>, watts: Option<i64>) -> Server {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name},
            "spec": {
                "bmc": {"address": "https://10.0.0.1/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}},
                "hardware": {"cpu": "16", "memory": "64Gi"},
                "labels": {"topology.kubernetes.io/rack": rack, "pool": "general"},
                "power": {"idleWatts": 200, "peakWatts": 500, "offWatts": 10},
                "stageDurations": {"powerOn": "1m", "boot": "5m", "join": "1m", "ready": "1m"}
            },
            "status": {"powerState": power, "claim": claim, "watts": watts, "poweredOnByIronclaim": power != "Off"}
        }))
        .expect("server")
    }

    fn claim(name: &str, server: &str, stages: Value) -> ServerClaim {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": name},
            "spec": {"server": server, "pool": "general", "pods": []},
            "status": {"stage": "Booting", "stages": stages}
        }))
        .expect("claim")
    }

    fn pool() -> ServerPool {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": "general"},
            "spec": {"requirements": [{"key": "pool", "operator": "In", "values": ["general"]}]}
        }))
        .expect("pool")
    }

    fn pending_pod(name: &str, cpu: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "app", "uid": format!("uid-{name}"), "creationTimestamp": "2026-01-05T11:58:00Z"},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]}
        }))
        .expect("pod")
    }

    fn node(name: &str, server: &str, cordoned: bool) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"ironclaim.dev/server": server}},
            "spec": {"unschedulable": cordoned},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"}, "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .expect("node")
    }

    fn index() -> Index {
        let mut index = Index::default();
        index.apply(pool());
        index.apply(server("r1-u01", "r1", "Off", None, None));
        index.apply(server("r1-u02", "r1", "On", Some("c-boot"), None));
        index.apply(server("r2-u01", "r2", "On", None, Some(231)));
        index.apply(node("n-r2-u01", "r2-u01", true));
        index.apply(claim(
            "c-boot",
            "r1-u02",
            json!([
                {"stage": "Selected", "startTime": "2026-01-05T11:50:00Z", "durationSeconds": 0, "outcome": "Succeeded"},
                {"stage": "PoweringOn", "startTime": "2026-01-05T11:50:00Z", "durationSeconds": 90, "outcome": "Succeeded"},
                {"stage": "Booting", "startTime": "2026-01-05T11:51:30Z", "outcome": "InProgress"}
            ]),
        ));
        index.apply(pending_pod("web-1", "4"));
        index.apply(pending_pod("huge", "64"));
        index
    }

    #[test]
    fn tiles_say_each_servers_state_in_words_grouped_by_rack() {
        let state = state(&index(), NOW_S, &[], Some(5000.0));
        let tiles: Vec<(&str, &str, &str)> = state.tiles.iter().map(|t| (t.name.as_str(), t.group.as_str(), t.state.as_str())).collect();
        assert_eq!(tiles, [("r1-u01", "r1", "off"), ("r1-u02", "r1", "booting"), ("r2-u01", "r2", "draining")]);
        assert_eq!(state.all_on_watts, 600);
        assert_eq!(state.inventory.summary.total_watts, 231 + 200 + 10, "a reading, an idle estimate, an off server's watts");
        assert_eq!(state.power_budget_watts, Some(5000.0));
    }

    #[test]
    fn a_claim_in_flight_is_a_bar_per_stage_against_what_the_server_expects() {
        let state = state(&index(), NOW_S, &[], None);
        let claim = state.claims.iter().find(|c| c.name == "c-boot").expect("the claim in flight");
        let bars: Vec<(&str, Seconds, Seconds, Seconds, bool)> =
            claim.stages.iter().map(|s| (s.stage, s.start_s, s.took_s, s.expected_s, s.slow)).collect();
        // Booting has run 8m30s of the 5m expected: slow.
        assert_eq!(bars, [("selected", 0, 0, 0, false), ("powering_on", 0, 90, 60, false), ("booting", 90, 510, 300, true)]);
    }

    #[test]
    fn pending_pods_are_grouped_by_what_the_core_decides_with_explains_words() {
        let state = state(&index(), NOW_S, &[], None);
        let groups: BTreeMap<&str, Vec<&str>> = state.pending.iter().map(|g| (g.outcome, g.pods.iter().map(|p| p.pod.as_str()).collect())).collect();
        assert_eq!(groups.get("unschedulable"), Some(&vec!["app/huge"]), "{groups:?}");
        let web = state.pending.iter().flat_map(|g| &g.pods).find(|p| p.pod == "app/web-1").expect("web-1");
        assert_eq!(web.waiting_s, 120);
        assert!(web.note.contains("server r1-u0"), "{}", web.note);
    }

    /// Issue 21: the payload for 1,000 servers and 200 claims stays under
    /// 500 KB.
    #[test]
    fn the_state_of_a_thousand_servers_and_two_hundred_claims_is_under_500_kb() {
        let mut index = Index::default();
        index.apply(pool());
        for i in 0..1000 {
            let name = format!("rack{:02}-u{:02}", i / 40, i % 40);
            let claimed = (i < 200).then(|| format!("claim-{i}"));
            index.apply(server(
                &name,
                &format!("rack{:02}", i / 40),
                if i < 600 { "On" } else { "Off" },
                claimed.as_deref(),
                (i < 600).then_some(250),
            ));
            if let Some(claim_name) = claimed {
                index.apply(claim(
                    &claim_name,
                    &name,
                    json!([
                        {"stage": "Selected", "startTime": "2026-01-05T11:50:00Z", "durationSeconds": 0, "outcome": "Succeeded"},
                        {"stage": "PoweringOn", "startTime": "2026-01-05T11:50:00Z", "durationSeconds": 90, "outcome": "Succeeded"},
                        {"stage": "Booting", "startTime": "2026-01-05T11:51:30Z", "outcome": "InProgress"}
                    ]),
                ));
            }
        }
        let json = serde_json::to_string(&state(&index, NOW_S, &[], None)).unwrap();
        assert_eq!(serde_json::from_str::<Value>(&json).unwrap()["tiles"].as_array().map(Vec::len), Some(1000));
        assert!(json.len() < 500_000, "{} bytes", json.len());
        println!("1,000 servers, 200 claims: {} bytes", json.len());
    }

    #[test]
    fn the_page_loads_nothing_from_elsewhere_and_names_the_source_of_its_numbers() {
        assert!(!PAGE.contains("http://") && !PAGE.contains("https://") && !PAGE.contains("src=\""), "no outside asset");
        let state = serde_json::to_value(state(&index(), NOW_S, &[], None)).unwrap();
        for source in PAGE.split("data-source=\"").skip(1).map(|rest| &rest[..rest.find('"').unwrap_or(0)]) {
            let mut value = &state;
            for key in source.split('.') {
                value = value.get(key).unwrap_or_else(|| panic!("the page reads {source}, which /ui/state does not have"));
            }
        }
    }
}
