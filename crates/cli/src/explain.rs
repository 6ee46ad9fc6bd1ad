//! `ironclaim explain pod NS/NAME`: why a pod waits, which claim and server
//! it waits for, which stage that claim is in and when it should be ready,
//! or the exact reason nothing can be provisioned for it.

use anyhow::anyhow;
use ironclaim_controller::index::{FailureBackoff, Index};
use ironclaim_controller::timeline;
use ironclaim_core::outcome::Outcome;
use ironclaim_core::transitions::TransitionLimits;
use ironclaim_k8s::api::ServerClaim;
use ironclaim_k8s::server_to_core;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, ResourceExt};
use serde::Serialize;

use crate::exit::Failure;
use crate::output::{self, Output};
use crate::render;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    #[command(flatten)]
    cluster: crate::cluster::ClusterArgs,
    /// The controller's namespace, where its claim lock ledger and its
    /// leader Lease live.
    #[arg(long, value_name = "NAMESPACE", default_value = "ironclaim-system", global = true)]
    controller_namespace: String,
    /// The controller's leader Lease: whether it is renewed tells whether a
    /// controller runs.
    #[arg(long, value_name = "NAME", default_value = crate::controller::LEASE_NAME, global = true)]
    lease_name: String,
    /// How to print: table, json or yaml (json and yaml are the same document).
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

#[derive(clap::Subcommand)]
enum What {
    /// A pod, as NAMESPACE/NAME (or NAME in the default namespace).
    Pod {
        /// The pod: NAMESPACE/NAME, or NAME in the default namespace.
        #[arg(value_name = "NAMESPACE/NAME")]
        pod: String,
    },
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// A namespace is a DNS label; a pod's name a DNS subdomain.
fn dns_label(s: &str) -> bool {
    (1..=63).contains(&s.len())
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

/// `NAMESPACE/NAME` or `NAME` (in `default`), checked as Kubernetes
/// checks names.
pub fn parse_pod(text: &str) -> anyhow::Result<(String, String)> {
    let (namespace, name) = match text.split_once('/') {
        Some((ns, n)) => (ns, n),
        None => ("default", text),
    };
    if namespace.is_empty() || name.is_empty() || name.contains('/') {
        return Err(anyhow!("expected NAMESPACE/NAME (or NAME in the default namespace), found {text:?}"));
    }
    if !dns_label(namespace) {
        return Err(anyhow!("{namespace:?} is not a namespace name: lowercase letters, digits and '-', at most 63"));
    }
    if !dns_subdomain(name) {
        return Err(anyhow!("{name:?} is not a pod name: lowercase letters, digits, '-' and '.', at most 253"));
    }
    Ok((namespace.to_string(), name.to_string()))
}

/// What `explain pod` found, as `--output json` prints it.
#[derive(Serialize)]
struct Explanation {
    pod: String,
    /// `bound`, `waiting` (pending demand), `resize_waiting` (runs, and
    /// waits for an in-place resize its node did not apply) or `not_waiting`.
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    phase: Option<String>,
    /// The claims opened for the pod, oldest first.
    claims: Vec<ClaimView>,
    /// What the core decides for it now (`waiting` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    decision: Option<DecisionView>,
    /// When it should be running, if it has a deadline (`waiting` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    deadline: Option<DeadlineView>,
    /// Whether a controller runs to act on the decision.
    controller: ControllerView,
}

#[derive(Serialize)]
struct DeadlineView {
    /// How long after its creation the pod should be running.
    after_creation_s: u64,
    /// `annotation` (ironclaim.dev/deadline) or `pool` (its ServerPool's defaultDeadline).
    source: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pool: Option<String>,
    /// Seconds until the deadline; negative once it has passed.
    left_s: i64,
}

impl DeadlineView {
    /// `deadline: 10m after it was created (its ironclaim.dev/deadline annotation): 4m left`
    fn line(&self) -> String {
        let source = match &self.pool {
            Some(pool) => format!("ServerPool {pool}'s defaultDeadline"),
            None => "its ironclaim.dev/deadline annotation".to_string(),
        };
        let left = if self.left_s >= 0 {
            format!("{} left", timeline::human(self.left_s as u64))
        } else {
            format!("passed {} ago", timeline::human(self.left_s.unsigned_abs()))
        };
        format!("deadline: {} after it was created ({source}): {left}", timeline::human(self.after_creation_s))
    }
}

/// Whether a controller runs, as its leader Lease says.
#[derive(Serialize)]
struct ControllerView {
    /// `running` (the lease was renewed within its duration), `stopped`
    /// (it lapsed), `no_lease`, or `unknown` (it could not be read).
    state: &'static str,
    /// NAMESPACE/NAME of the lease.
    lease: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    renewed_ago_s: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    /// The fleet power budget the leader decides with, as its Lease says;
    /// the decision here is made with it too.
    #[serde(skip_serializing_if = "Option::is_none")]
    power_budget_watts: Option<f64>,
    /// The transition rates and cap on power cycles the leader decides
    /// with, as its Lease says; the decision here keeps them too.
    #[serde(skip_serializing_if = "TransitionLimits::is_empty")]
    transition_limits: TransitionLimits,
}

impl ControllerView {
    /// Reads what a Lease (or its absence, or the error reading it) says at `now`.
    fn of(lease_name: String, read: Result<Option<Lease>, String>, now: u64) -> Self {
        let mut view = ControllerView {
            state: "no_lease",
            lease: lease_name,
            holder: None,
            renewed_ago_s: None,
            error: None,
            power_budget_watts: None,
            transition_limits: TransitionLimits::default(),
        };
        match read {
            Err(error) => {
                view.state = "unknown";
                view.error = Some(error);
            }
            Ok(None) => {}
            Ok(Some(lease)) => {
                view.power_budget_watts = ironclaim_controller::leader::power_budget_of(&lease);
                view.transition_limits = ironclaim_controller::leader::transition_limits_of(&lease);
                let spec = lease.spec.unwrap_or_default();
                view.holder = spec.holder_identity.filter(|h| !h.is_empty());
                let renewed = spec.renew_time.map(|t| t.0.as_second().max(0) as u64);
                view.renewed_ago_s = renewed.map(|r| now.saturating_sub(r));
                let duration = spec.lease_duration_seconds.unwrap_or(15).max(1) as u64;
                view.state = match (&view.holder, renewed) {
                    (Some(_), Some(r)) if r + duration >= now => "running",
                    _ => "stopped",
                };
            }
        }
        view
    }

    /// What to say when no controller is known to run; nothing when one is.
    fn warning(&self) -> Option<String> {
        let act = "nothing claims or powers on a server for this pod until one runs";
        match self.state {
            "running" => None,
            "stopped" => Some(format!(
                "no controller is running: the lease {} was last renewed{}{}; {act}",
                self.lease,
                self.holder.as_deref().map(|h| format!(" by {h}")).unwrap_or_default(),
                self.renewed_ago_s.map(|s| format!(" {} ago", timeline::human(s))).unwrap_or_default(),
            )),
            "no_lease" => Some(format!(
                "no controller is running, as far as can be seen: there is no lease {} (a controller started with --leader-elect holds it); {act}",
                self.lease
            )),
            _ => Some(format!(
                "whether a controller runs is unknown: the lease {} cannot be read: {}",
                self.lease,
                self.error.as_deref().unwrap_or("?")
            )),
        }
    }
}

#[derive(Serialize)]
struct ClaimView {
    name: String,
    server: String,
    pool: String,
    stage: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_message: Option<String>,
    /// Where the claim stands, as the pod's Events say it.
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    stages: Vec<StageView>,
    /// Conditions that are False: `TYPE: message (Reason)`.
    problems: Vec<String>,
}

#[derive(Serialize)]
struct StageView {
    stage: &'static str,
    started_ago_s: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    took_s: Option<u64>,
    outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
}

#[derive(Serialize)]
struct DecisionView {
    /// `existing`, `in_flight`, `new_claim`, `unschedulable` or `none`.
    outcome: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    server: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    eta_s: Option<u64>,
    /// The core's exact reason, for `unschedulable`.
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason_detail: Option<serde_json::Value>,
    /// The sentence the table prints.
    summary: String,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let What::Pod { pod } = args.what;
    let (namespace, name) = parse_pod(&pod).map_err(Failure::bad_input)?;
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    let explanation = runtime.block_on(async {
        let connection = crate::cluster::connect(&args.cluster).await?;
        let index = crate::cluster::read(&connection, &args.controller_namespace).await?;
        let client = connection.client;
        let lease = Api::<Lease>::namespaced(client, &args.controller_namespace).get_opt(&args.lease_name).await.map_err(|e| e.to_string());
        let now = now_s();
        let controller = ControllerView::of(format!("{}/{}", args.controller_namespace, args.lease_name), lease, now);
        explain(&index, &namespace, &name, now, controller)
    })?;
    output::print(args.output, &explanation, table)
}

fn explain(index: &Index, namespace: &str, name: &str, now: u64, controller: ControllerView) -> Result<Explanation, Failure> {
    let key = format!("{namespace}/{name}");
    let Some(entry) = index.pods.get(&key) else {
        if let Some(err) = index.bad_pods.get(&key) {
            return Err(Failure::world(anyhow!("pod {key} cannot be read: {}", err.error)));
        }
        return Err(Failure::world(anyhow!("pod {key} not found")));
    };
    let mut explanation = Explanation {
        pod: key.clone(),
        state: "waiting",
        node: entry.pod.node_name.clone(),
        phase: Some(format!("{:?}", entry.pod.phase)),
        claims: Vec::new(),
        decision: None,
        deadline: None,
        controller,
    };
    // The claims opened for it, oldest first.
    let mut claims: Vec<&ServerClaim> =
        index.claims.values().filter(|c| c.spec.pods.iter().any(|p| p.namespace == namespace && p.name == name)).collect();
    claims.sort_by_key(|c| (c.metadata.creation_timestamp.as_ref().map(|t| t.0), c.name_any()));
    explanation.claims = claims.into_iter().map(|c| claim_view(index, c, now)).collect();
    if entry.pod.is_resize_demand() {
        explanation.state = "resize_waiting";
    } else if entry.pod.node_name.is_some() {
        explanation.state = "bound";
        return Ok(explanation);
    }
    if !entry.pod.is_demand() {
        explanation.state = "not_waiting";
        return Ok(explanation);
    }
    // What the core decides for it now, as the controller would.
    let (mut snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
    snapshot.power_budget_watts = explanation.controller.power_budget_watts;
    snapshot.transition_limits = explanation.controller.transition_limits.clone();
    let plan = ironclaim_core::provision(&snapshot, now);
    let empty = DecisionView {
        outcome: "none",
        node: None,
        claim: None,
        server: None,
        path: None,
        eta_s: None,
        reason: None,
        reason_detail: None,
        summary: String::new(),
    };
    let outcome = plan.decision(&key).map(|d| &d.outcome);
    // The pod's own deadline, else its claim's ServerPool's default (the
    // core's rule); a pod with no claim has no pool to take one from.
    let pool = match outcome {
        Some(Outcome::NewClaim { claim, .. }) => plan.claims.iter().find(|c| &c.name == claim).map(|c| c.pool.clone()),
        Some(Outcome::InFlight { claim, .. }) => index.claims.get(claim).map(|c| c.spec.pool.clone()),
        _ => None,
    };
    let deadline = match (entry.pod.deadline_s, pool) {
        (Some(after), _) => Some((after, None)),
        (None, Some(pool)) => snapshot.pools.iter().find(|p| p.name == pool).and_then(|p| p.deadline_s).map(|after| (after, Some(pool))),
        (None, None) => None,
    };
    explanation.deadline = deadline.map(|(after, pool)| DeadlineView {
        after_creation_s: after,
        source: if pool.is_some() { "pool" } else { "annotation" },
        pool,
        // A resize's deadline runs from when it started waiting.
        left_s: (entry.pod.resize.as_ref().map_or(entry.pod.created_s, |r| r.since_s) + after) as i64 - now as i64,
    });
    let mut summary = outcome.map_or_else(|| "the core does not count it as pending demand".to_string(), timeline::outcome_note);
    if let Some(wait) = plan.decision(&key).and_then(|d| d.resize.as_ref()) {
        summary = format!("{wait}; {summary}");
    }
    explanation.decision = Some(match outcome {
        Some(Outcome::Existing { node }) => DecisionView { outcome: "existing", node: Some(node.clone()), eta_s: Some(0), summary, ..empty },
        Some(Outcome::InFlight { claim, server, eta_s }) => {
            DecisionView { outcome: "in_flight", claim: Some(claim.clone()), server: Some(server.clone()), eta_s: Some(*eta_s), summary, ..empty }
        }
        Some(Outcome::NewClaim { server, path, eta_s, .. }) => {
            DecisionView { outcome: "new_claim", server: Some(server.clone()), path: Some(path.to_string()), eta_s: Some(*eta_s), summary, ..empty }
        }
        Some(Outcome::Unschedulable { reason }) => DecisionView {
            outcome: "unschedulable",
            reason: Some(reason.to_string()),
            reason_detail: serde_json::to_value(reason).ok(),
            summary,
            ..empty
        },
        None => DecisionView { summary, ..empty },
    });
    Ok(explanation)
}

fn claim_view(index: &Index, claim: &ServerClaim, now: u64) -> ClaimView {
    let status = claim.status.clone().unwrap_or_default();
    let server = index.servers.get(&claim.spec.server);
    let durations = server.and_then(|s| server_to_core(s).ok()).map(|s| s.durations).unwrap_or_default();
    let failed = status.failure_reason.is_some();
    ClaimView {
        name: claim.name_any(),
        server: claim.spec.server.clone(),
        pool: claim.spec.pool.clone(),
        stage: status.stage.map(|s| s.label()),
        failure_reason: status.failure_reason.map(|r| format!("{r:?}")),
        failure_message: status.failure_message.clone(),
        note: (!failed).then(|| timeline::waiting_note(&claim.spec.server, &status, &durations, now)),
        stages: status
            .stages
            .iter()
            .map(|r| StageView {
                stage: r.stage.label(),
                started_ago_s: now.saturating_sub(timeline::seconds(&r.start_time)),
                took_s: r.duration_seconds.map(|d| d.max(0) as u64),
                outcome: format!("{:?}", r.outcome),
                message: r.message.clone(),
            })
            .collect(),
        problems: status.conditions.iter().filter(|c| c.status == "False").map(|c| format!("{}: {} ({})", c.type_, c.message, c.reason)).collect(),
    }
}

fn table(e: &Explanation) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    match (e.state, &e.node) {
        ("bound", Some(node)) => _ = writeln!(out, "pod {} is bound to node {node}", e.pod),
        ("resize_waiting", Some(node)) => _ = writeln!(out, "pod {} runs on node {node} and waits for an in-place resize", e.pod),
        ("not_waiting", _) => _ = writeln!(out, "pod {} does not wait for a node (phase {})", e.pod, e.phase.as_deref().unwrap_or("?")),
        _ => {}
    }
    for claim in &e.claims {
        match (&claim.failure_reason, &claim.note) {
            (Some(reason), _) => {
                _ = writeln!(
                    out,
                    "claim {} on server {} failed: {reason}: {}",
                    claim.name,
                    claim.server,
                    claim.failure_message.as_deref().unwrap_or_default()
                )
            }
            (None, Some(note)) => _ = writeln!(out, "{note}"),
            (None, None) => {}
        }
        let mut table = render::table(&["STAGE", "STARTED", "TOOK", "OUTCOME", "MESSAGE"]);
        for r in &claim.stages {
            table.add_row(vec![
                r.stage.replace('_', " "),
                format!("{} ago", timeline::human(r.started_ago_s)),
                r.took_s.map(timeline::human).unwrap_or_else(|| "-".into()),
                r.outcome.clone(),
                r.message.clone().unwrap_or_default(),
            ]);
        }
        _ = writeln!(out, "claim {} (pool {}):\n{table}", claim.name, claim.pool);
        for p in &claim.problems {
            _ = writeln!(out, "  {p}");
        }
    }
    if let Some(d) = &e.deadline {
        _ = writeln!(out, "{}", d.line());
    }
    if let Some(d) = &e.decision {
        _ = writeln!(out, "{}", d.summary);
    }
    // A bound pod needs no controller; a waiting one does.
    if e.state == "waiting"
        && let Some(warning) = e.controller.warning()
    {
        _ = writeln!(out, "{warning}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_controller::index::Indexed;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    const NOW: u64 = 1_800_000_000;

    fn lease(holder: &str, renewed_ago_s: u64) -> Lease {
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(timeline::time(NOW - renewed_ago_s).0)),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    fn no_controller() -> ControllerView {
        ControllerView::of("ironclaim-system/ironclaim-controller".into(), Ok(None), NOW)
    }

    /// A pending pod created `age_s` ago, with an `ironclaim.dev/deadline` when given.
    fn index_with_pod(age_s: u64, deadline: Option<&str>) -> Index {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": "web", "namespace": "shop",
                "creationTimestamp": timeline::time(NOW - age_s),
                "annotations": deadline.map(|d| serde_json::json!({"ironclaim.dev/deadline": d})).unwrap_or(serde_json::json!({}))
            },
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": "Pending"}
        }))
        .expect("a pod");
        let mut index = Index::default();
        pod.apply(&mut index);
        index
    }

    #[test]
    fn a_waiting_pod_is_told_its_deadline_and_what_is_left_of_it() {
        let e = explain(&index_with_pod(120, Some("10m")), "shop", "web", NOW, no_controller()).unwrap_or_else(|_| panic!("explained"));
        let d = e.deadline.expect("a deadline");
        assert_eq!((d.after_creation_s, d.source, d.left_s), (600, "annotation", 480));
        assert_eq!(d.line(), "deadline: 10m after it was created (its ironclaim.dev/deadline annotation): 8m left");
        let e = explain(&index_with_pod(900, Some("10m")), "shop", "web", NOW, no_controller()).unwrap_or_else(|_| panic!("explained"));
        assert_eq!(
            e.deadline.expect("a deadline").line(),
            "deadline: 10m after it was created (its ironclaim.dev/deadline annotation): passed 5m ago"
        );
        let e = explain(&index_with_pod(120, None), "shop", "web", NOW, no_controller()).unwrap_or_else(|_| panic!("explained"));
        assert!(e.deadline.is_none());
    }

    #[test]
    fn the_lease_tells_whether_a_controller_runs() {
        let name = || "ironclaim-system/ironclaim-controller".to_string();
        let running = ControllerView::of(name(), Ok(Some(lease("ironclaim-7f9", 5))), NOW);
        assert_eq!((running.state, running.warning()), ("running", None));
        let stopped = ControllerView::of(name(), Ok(Some(lease("ironclaim-7f9", 7200))), NOW);
        assert_eq!(stopped.state, "stopped");
        assert_eq!(
            stopped.warning().as_deref(),
            Some(
                "no controller is running: the lease ironclaim-system/ironclaim-controller was last renewed by ironclaim-7f9 2h00m ago; \
                 nothing claims or powers on a server for this pod until one runs"
            )
        );
        let released = ControllerView::of(name(), Ok(Some(lease("", 1))), NOW);
        assert_eq!(released.state, "stopped");
        let none = ControllerView::of(name(), Ok(None), NOW);
        assert!(none.warning().is_some_and(|w| w.starts_with("no controller is running, as far as can be seen: there is no lease")));
        let forbidden = ControllerView::of(name(), Err("leases is forbidden".into()), NOW);
        assert_eq!(forbidden.state, "unknown");
        assert!(forbidden.warning().is_some_and(|w| w.ends_with("cannot be read: leases is forbidden")));
    }

    /// The pod of [`index_with_pod`], a default pool, and one 8-core server
    /// `cold-1` (200 W idle, 600 W peak) whose status is `status`.
    fn index_with_cold_server(status: serde_json::Value) -> Index {
        let mut index = index_with_pod(60, None);
        let server: ironclaim_k8s::api::Server = serde_json::from_value(serde_json::json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": "cold-1"},
            "spec": {
                "bmc": {"address": "https://10.0.0.1", "credentialsSecretRef": {"name": "bmc", "namespace": "ironclaim-system"}},
                "hardware": {"cpu": "8", "memory": "32Gi"}, "power": {"idleWatts": 200, "peakWatts": 600}
            },
            "status": status
        }))
        .expect("a server");
        server.apply(&mut index);
        let pool: ironclaim_k8s::api::ServerPool = serde_json::from_value(serde_json::json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool", "metadata": {"name": "default"}, "spec": {}
        }))
        .expect("a pool");
        pool.apply(&mut index);
        index
    }

    /// The leader's budget, read from its Lease, holds the decision here as
    /// it holds the leader's: a cold server whose peak would exceed it is
    /// not the answer.
    #[test]
    fn the_decision_is_made_with_the_power_budget_the_lease_says() {
        let index = index_with_cold_server(serde_json::json!({"powerState": "Off"}));
        let led = |budget: Option<&str>| {
            let mut lease = lease("ironclaim-7f9", 5);
            if let Some(watts) = budget {
                lease.metadata.annotations = Some([(ironclaim_controller::leader::POWER_BUDGET_ANNOTATION.to_string(), watts.to_string())].into());
            }
            ControllerView::of("ironclaim-system/ironclaim-controller".into(), Ok(Some(lease)), NOW)
        };
        let outcome = |budget| {
            let e = explain(&index, "shop", "web", NOW, led(budget)).unwrap_or_else(|_| panic!("explained"));
            e.decision.expect("a decision").outcome
        };
        assert_eq!(outcome(None), "new_claim");
        assert_eq!(outcome(Some("5000")), "new_claim");
        assert_eq!(outcome(Some("500")), "unschedulable");
        assert_eq!(led(Some("500")).power_budget_watts, Some(500.0));
        assert_eq!(led(Some("none")).power_budget_watts, None, "what is not a number of watts is no budget");
    }

    /// The leader's transition limits, read from its Lease, hold the
    /// decision here too: a cold server powered off a moment ago under a
    /// fleet rate of one change a minute is not powered on again yet.
    #[test]
    fn the_decision_keeps_the_transition_limits_the_lease_says() {
        let index = index_with_cold_server(serde_json::json!({"powerState": "Off", "powerChanges": [{"at": NOW - 10, "on": false}]}));
        let led = |limits: Option<&str>| {
            let mut lease = lease("ironclaim-7f9", 5);
            if let Some(text) = limits {
                lease.metadata.annotations =
                    Some([(ironclaim_controller::leader::TRANSITION_LIMITS_ANNOTATION.to_string(), text.to_string())].into());
            }
            ControllerView::of("ironclaim-system/ironclaim-controller".into(), Ok(Some(lease)), NOW)
        };
        let decide = |limits| explain(&index, "shop", "web", NOW, led(limits)).unwrap_or_else(|_| panic!("explained"));
        let one_a_minute = r#"{"rates":[{"scope":"fleet","per_minute":1}]}"#;
        assert_eq!(decide(None).decision.expect("a decision").outcome, "new_claim");
        let held = decide(Some(one_a_minute));
        let decision = held.decision.as_ref().expect("a decision");
        assert_eq!(decision.outcome, "unschedulable");
        let reason = decision.reason.as_deref().unwrap_or_default();
        assert!(reason.starts_with("transition rate of the fleet reached") && reason.ends_with("the next may start in 50s"), "{reason}");
        assert_eq!(held.controller.transition_limits.rates.len(), 1);
        assert!(led(Some("fleet=1")).transition_limits.is_empty(), "what a leader does not write is no limit");
    }

    #[test]
    fn pod_references_are_checked_as_kubernetes_names() {
        assert_eq!(parse_pod("ml/train-0").unwrap(), ("ml".into(), "train-0".into()));
        assert_eq!(parse_pod("web").unwrap(), ("default".into(), "web".into()));
        assert_eq!(parse_pod("ns/a.b-c").unwrap(), ("ns".into(), "a.b-c".into()));
        for bad in ["", "/", "ns/", "/name", "a/b/c", "NS/x", "ns/Name", "ns/-x", "ns/x_y", &format!("{}/x", "n".repeat(64))] {
            assert!(parse_pod(bad).is_err(), "{bad:?} accepted");
        }
    }
}
