//! `ironclaim explain pod NS/NAME`: why a pod waits, which claim and server
//! it waits for, which stage that claim is in and when it should be ready,
//! or the exact reason nothing can be provisioned for it.

use std::path::PathBuf;

use anyhow::anyhow;
use ironclaim_controller::index::{FailureBackoff, Index};
use ironclaim_controller::timeline;
use ironclaim_core::outcome::Outcome;
use ironclaim_k8s::api::NodeClaim;
use ironclaim_k8s::server_to_core;
use kube::ResourceExt;
use serde::Serialize;

use crate::exit::Failure;
use crate::plan::Output;
use crate::render;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    /// A kubeconfig; without it, $KUBECONFIG, ~/.kube/config or the in-cluster service account.
    #[arg(long, value_name = "FILE", global = true)]
    kubeconfig: Option<PathBuf>,
    /// The controller's namespace, where its claim lock ledger lives.
    #[arg(long, value_name = "NAMESPACE", default_value = "ironclaim-system", global = true)]
    controller_namespace: String,
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

#[derive(clap::Subcommand)]
enum What {
    /// A pod, as NAMESPACE/NAME (or NAME in the default namespace).
    Pod { pod: String },
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
    /// `bound`, `waiting` (pending demand) or `not_waiting`.
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
        let client = crate::controller::client(args.kubeconfig.as_ref()).await.map_err(Failure::world)?;
        let index = ironclaim_controller::cluster::read(&client, &args.controller_namespace).await.map_err(Failure::world)?;
        explain(&index, &namespace, &name, now_s())
    })?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&explanation).map_err(Failure::world)?),
        Output::Table => print(&explanation),
    }
    Ok(())
}

fn explain(index: &Index, namespace: &str, name: &str, now: u64) -> Result<Explanation, Failure> {
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
    };
    // The claims opened for it, oldest first.
    let mut claims: Vec<&NodeClaim> =
        index.claims.values().filter(|c| c.spec.pods.iter().any(|p| p.namespace == namespace && p.name == name)).collect();
    claims.sort_by_key(|c| (c.metadata.creation_timestamp.as_ref().map(|t| t.0), c.name_any()));
    explanation.claims = claims.into_iter().map(|c| claim_view(index, c, now)).collect();
    if entry.pod.node_name.is_some() {
        explanation.state = "bound";
        return Ok(explanation);
    }
    if !entry.pod.is_pending_demand() {
        explanation.state = "not_waiting";
        return Ok(explanation);
    }
    // What the core decides for it now, as the controller would.
    let (snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
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
    explanation.decision = Some(match plan.decision(&key).map(|d| &d.outcome) {
        Some(Outcome::Existing { node }) => DecisionView {
            outcome: "existing",
            node: Some(node.clone()),
            eta_s: Some(0),
            summary: format!("it fits Ready node {node} now: the scheduler should bind it; if it does not, capacity or request accounting is stale"),
            ..empty
        },
        Some(Outcome::InFlight { claim, server, eta_s }) => DecisionView {
            outcome: "in_flight",
            claim: Some(claim.clone()),
            server: Some(server.clone()),
            eta_s: Some(*eta_s),
            summary: format!("it waits for claim {claim} on server {server}: ready in about {}", timeline::human(*eta_s)),
            ..empty
        },
        Some(Outcome::NewClaim { server, path, eta_s, .. }) => DecisionView {
            outcome: "new_claim",
            server: Some(server.clone()),
            path: Some(path.to_string()),
            eta_s: Some(*eta_s),
            summary: format!("the next decision claims server {server} ({path}) for it: ready in about {}", timeline::human(*eta_s)),
            ..empty
        },
        Some(Outcome::Unschedulable { reason }) => DecisionView {
            outcome: "unschedulable",
            reason: Some(reason.to_string()),
            reason_detail: serde_json::to_value(reason).ok(),
            summary: format!("nothing can be provisioned for it: {reason}"),
            ..empty
        },
        None => DecisionView { summary: "the core does not count it as pending demand".into(), ..empty },
    });
    Ok(explanation)
}

fn claim_view(index: &Index, claim: &NodeClaim, now: u64) -> ClaimView {
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

fn print(e: &Explanation) {
    match (e.state, &e.node) {
        ("bound", Some(node)) => println!("pod {} is bound to node {node}", e.pod),
        ("not_waiting", _) => println!("pod {} does not wait for a node (phase {})", e.pod, e.phase.as_deref().unwrap_or("?")),
        _ => {}
    }
    for claim in &e.claims {
        match (&claim.failure_reason, &claim.note) {
            (Some(reason), _) => {
                println!("claim {} on server {} failed: {reason}: {}", claim.name, claim.server, claim.failure_message.as_deref().unwrap_or_default())
            }
            (None, Some(note)) => println!("{note}"),
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
        println!("claim {} (pool {}):\n{table}", claim.name, claim.pool);
        for p in &claim.problems {
            println!("  {p}");
        }
    }
    if let Some(d) = &e.decision {
        println!("{}", d.summary);
    }
}

#[cfg(test)]
mod tests {
    use super::parse_pod;

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
