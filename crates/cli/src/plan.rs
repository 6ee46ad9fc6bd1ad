//! `ironclaim plan`: where pending pods go, on the worked example or on
//! manifests, and the sensitivity table.

use crate::exit::Failure;
use crate::output::{self, OutputArg};
use crate::render;
use ironclaim_core::sensitivity::{self, Variation};
use ironclaim_core::*;
use serde::Serialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct Args {
    /// Manifests to plan for (multi-document YAML or JSON, `kind: List`
    /// too): Pods, workloads, Nodes, PDBs, Servers, ServerPools. Without it,
    /// the worked example.
    #[arg(short = 'f', long = "file", value_name = "FILE")]
    files: Vec<PathBuf>,
    /// Vary one input and print the sensitivity table: warm=0,1,2,
    /// boot=5m,30m, stock=0,1, requests=x0.5,x1,x1.5, budget=none,12000
    /// (watts). Repeat for more axes.
    #[arg(long = "vary", value_name = "KEY=V1,V2")]
    vary: Vec<String>,
    #[command(flatten)]
    output: OutputArg,
    /// The time to plan at, in Unix seconds. Defaults to the creation time
    /// of the newest pod in the manifests, so that deadlines count from
    /// when the pods arrived (0 for the worked example).
    #[arg(long, value_name = "UNIX_SECONDS")]
    now: Option<u64>,
    /// Peak watts the powered fleet may draw, as the controller's flag of
    /// the same name: a pod whose server would cross it is `power budget
    /// reached`.
    #[arg(long, value_name = "WATTS", allow_negative_numbers = true, value_parser = crate::watts::budget)]
    power_budget_watts: Option<f64>,
    /// Transition rates, as the controller's flag of the same name; the
    /// power changes they count are those the Servers' status records.
    #[arg(long, value_name = "SCOPE=N", value_parser = crate::simulate::transition_rate)]
    transition_rate: Vec<ironclaim_core::transitions::TransitionRate>,
    /// The cap on power cycles a day, as the controller's flag.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_cycles_per_day: Option<u32>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let mut snapshot = load(&args.files)?;
    if let Some(watts) = args.power_budget_watts {
        snapshot.power_budget_watts = Some(watts);
    }
    snapshot.transition_limits.rates = args.transition_rate;
    snapshot.transition_limits.max_cycles_per_day = args.max_cycles_per_day;
    let now = args.now.unwrap_or_else(|| snapshot.pods.iter().map(|p| p.created_s).max().unwrap_or(0));
    if args.vary.is_empty() {
        let plan = provision(&snapshot, now);
        let view = PlanView::new(&plan);
        return output::print(args.output.output, &view, |view| plan_table(view, &plan));
    }
    let axes = args.vary.iter().map(|v| sensitivity::parse_vary(v)).collect::<Result<Vec<_>, _>>().map_err(Failure::bad_input)?;
    let rows: Vec<SensitivityRow> = sensitivity::combinations(&axes)
        .into_iter()
        .map(|variations| {
            let varied = sensitivity::apply(&snapshot, &variations);
            let plan = provision(&varied, now);
            SensitivityRow::new(&variations, &PlanView::new(&plan))
        })
        .collect();
    output::print(args.output.output, &rows[..], sensitivity_table)
}

fn load(files: &[PathBuf]) -> Result<Snapshot, Failure> {
    if files.is_empty() {
        return Ok(scenario::worked_example());
    }
    let manifests = ironclaim_k8s::load_files(files).map_err(Failure::bad_input)?;
    for w in &manifests.warnings {
        eprintln!("warning: {w}");
    }
    Ok(manifests.snapshot)
}

/// The JSON shape of `plan --output json` (documented in docs/plan.md).
#[derive(Serialize)]
struct PlanView {
    workloads: Vec<WorkloadView>,
    claims: Vec<ClaimView>,
}

#[derive(Serialize)]
struct WorkloadView {
    name: String,
    pods: Vec<PodView>,
}

#[derive(Serialize)]
struct PodView {
    name: String,
    outcome: &'static str,
    node: Option<String>,
    server: Option<String>,
    claim: Option<String>,
    path: Option<SupplyPath>,
    eta_s: Option<u64>,
    deadline_missed: bool,
    reason: Option<String>,
    reason_kind: Option<&'static str>,
    /// The pod runs and waits for an in-place resize its node did not
    /// apply: `resize to 12 CPU infeasible on node-3`.
    #[serde(skip_serializing_if = "Option::is_none")]
    resize: Option<String>,
}

#[derive(Serialize)]
struct ClaimView {
    name: String,
    server: String,
    pool: String,
    pods: Vec<String>,
    path: SupplyPath,
    eta_s: u64,
    requested: String,
    capacity: String,
    added_idle_watts: f64,
    deadline_missed: bool,
}

impl PlanView {
    /// The view of a plan, from the plan alone: a decision carries its
    /// pod's workload, and a pod without one (no ownerReferences) is a
    /// workload of its own, named by its key. Linear in the decisions.
    fn new(plan: &Provisioning) -> Self {
        let mut workloads: Vec<WorkloadView> = Vec::new();
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        for d in &plan.pods {
            let name = d.workload.clone().unwrap_or_else(|| d.pod.clone());
            let i = *index.entry(name.clone()).or_insert_with(|| {
                workloads.push(WorkloadView { name, pods: Vec::new() });
                workloads.len() - 1
            });
            let mut pod = PodView {
                name: d.pod.clone(),
                outcome: d.outcome.label(),
                node: None,
                server: None,
                claim: None,
                path: None,
                eta_s: d.outcome.eta_s(),
                deadline_missed: false,
                reason: None,
                reason_kind: None,
                resize: d.resize.as_ref().map(ToString::to_string),
            };
            match &d.outcome {
                Outcome::Existing { node } => {
                    pod.node = Some(node.clone());
                    // plan reads manifests, a what-if: a pod that fits a
                    // Ready node there needs no server. (explain, which reads
                    // a live cluster, says the scheduler should bind it.)
                    pod.reason = Some(match &d.resize {
                        Some(wait) => format!("{wait}; fits Ready node {node} once moved: no server needed"),
                        None => format!("fits Ready node {node}: no server needed"),
                    });
                }
                Outcome::InFlight { claim, server, .. } => {
                    pod.claim = Some(claim.clone());
                    pod.server = Some(server.clone());
                    pod.node = Some(server.clone());
                }
                Outcome::NewClaim { claim, server, path, deadline_missed, .. } => {
                    pod.claim = Some(claim.clone());
                    pod.server = Some(server.clone());
                    pod.node = Some(server.clone());
                    pod.path = Some(*path);
                    pod.deadline_missed = *deadline_missed;
                    pod.reason = d.resize.as_ref().map(|wait| format!("{wait}; server {server} powering on"));
                }
                Outcome::Unschedulable { reason } => {
                    pod.reason = Some(reason.to_string());
                    pod.reason_kind = Some(reason.metric_label());
                }
            }
            workloads[i].pods.push(pod);
        }
        let claims = plan
            .claims
            .iter()
            .map(|c| ClaimView {
                name: c.name.clone(),
                server: c.server.clone(),
                pool: c.pool.clone(),
                pods: c.pods.clone(),
                path: c.path,
                eta_s: c.eta_s,
                requested: c.requested.to_string(),
                capacity: c.capacity.to_string(),
                added_idle_watts: c.added_idle_watts,
                deadline_missed: c.deadline_missed,
            })
            .collect();
        PlanView { workloads, claims }
    }
}

fn where_of(p: &PodView) -> String {
    match (p.outcome, &p.node, &p.path) {
        ("existing", Some(n), _) => n.clone(),
        (_, Some(n), Some(path)) => format!("{n} ({path})"),
        (_, Some(n), None) => n.clone(),
        _ => "-".into(),
    }
}

fn plan_table(view: &PlanView, plan: &Provisioning) -> String {
    let mut pods = render::table(&["workload", "pod", "outcome", "where", "ready in", "note"]);
    for w in &view.workloads {
        for p in &w.pods {
            let note = match p.outcome {
                "existing" | "unschedulable" => p.reason.clone().unwrap_or_default(),
                _ if p.deadline_missed => "misses its deadline".to_string(),
                _ => String::new(),
            };
            // A pod waiting for a resize says which, unless its note does.
            let note = match &p.resize {
                Some(r) if !note.starts_with(r.as_str()) => [r.as_str(), note.as_str()].join("; ").trim_end_matches("; ").to_string(),
                _ => note,
            };
            pods.add_row(vec![
                w.name.clone(),
                p.name.clone(),
                p.outcome.replace('_', " "),
                where_of(p),
                p.eta_s.map(render::duration).unwrap_or_else(|| "-".into()),
                note,
            ]);
        }
    }
    let mut text = format!("{pods}\n");
    if view.claims.is_empty() {
        text.push_str("No claims: nothing to power on.\n");
    } else {
        let mut claims = render::table(&["claim", "server", "pool", "path", "ready in", "pods", "requested / capacity", "added idle"]);
        for c in &view.claims {
            claims.add_row(vec![
                c.name.clone(),
                c.server.clone(),
                c.pool.clone(),
                c.path.to_string(),
                render::duration(c.eta_s),
                c.pods.len().to_string(),
                format!("{} / {}", c.requested, c.capacity),
                format!("{:.0} W", c.added_idle_watts),
            ]);
        }
        text.push_str(&format!("{claims}\n"));
    }
    text.push_str(&summary(plan));
    text.push('\n');
    text
}

/// `9 pending pods: 7 fit Ready nodes now, 2 go to 2 new claims (+480 W idle), 0 cannot be placed.`
fn summary(plan: &Provisioning) -> String {
    let count_of = |f: fn(&Outcome) -> bool| plan.pods.iter().filter(|d| f(&d.outcome)).count() as u64;
    let existing = count_of(|o| matches!(o, Outcome::Existing { .. }));
    let unschedulable = count_of(|o| matches!(o, Outcome::Unschedulable { .. }));
    let total = plan.pods.len() as u64;
    if total == 0 {
        return "No pending pods: nothing to place.".to_string();
    }
    let claimed = total - existing - unschedulable;
    // Summed from +0.0: an empty sum of f64 is -0.0, printed "-0".
    let added = plan.claims.iter().fold(0.0, |watts, c| watts + c.added_idle_watts);
    format!(
        "{}: {existing} {} now, {claimed} {} to {} (+{added:.0} W idle), {unschedulable} cannot be placed.",
        render::count(total, "pending pod", "pending pods"),
        if existing == 1 { "fits a Ready node" } else { "fit Ready nodes" },
        if claimed == 1 { "goes" } else { "go" },
        render::count(plan.claims.len() as u64, "new claim", "new claims"),
    )
}

#[derive(Serialize)]
struct SensitivityRow {
    variations: Vec<String>,
    workloads: Vec<WorkloadSummary>,
}

#[derive(Serialize)]
struct WorkloadSummary {
    name: String,
    outcome: String,
    /// Time until the last of its pods can run; None if some cannot.
    ready_in_s: Option<u64>,
    deadline_missed: bool,
}

impl SensitivityRow {
    fn new(variations: &[Variation], view: &PlanView) -> Self {
        let workloads = view
            .workloads
            .iter()
            .map(|w| {
                let mut counts: BTreeMap<String, usize> = BTreeMap::new();
                for p in &w.pods {
                    let key = match (p.outcome, p.path) {
                        ("new_claim", Some(path)) => format!("new {path}"),
                        ("unschedulable", _) => format!("unschedulable ({})", p.reason_kind.unwrap_or("?")),
                        (o, _) => o.replace('_', " "),
                    };
                    *counts.entry(key).or_default() += 1;
                }
                let outcome = counts.iter().map(|(k, n)| format!("{n} {k}")).collect::<Vec<_>>().join(", ");
                let ready_in_s = w.pods.iter().map(|p| p.eta_s).collect::<Option<Vec<_>>>().map(|v| v.into_iter().max().unwrap_or(0));
                WorkloadSummary { name: w.name.clone(), outcome, ready_in_s, deadline_missed: w.pods.iter().any(|p| p.deadline_missed) }
            })
            .collect();
        SensitivityRow { variations: variations.iter().map(|v| v.to_string()).collect(), workloads }
    }
}

fn sensitivity_table(rows: &[SensitivityRow]) -> String {
    let Some(first) = rows.first() else { return String::new() };
    let mut header: Vec<String> = vec!["inputs".into()];
    header.extend(first.workloads.iter().map(|w| w.name.clone()));
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = render::table(&header_refs);
    for row in rows {
        let mut cells = vec![row.variations.join(" ")];
        for w in &row.workloads {
            let ready = match w.ready_in_s {
                Some(s) => format!("ready in {}", render::duration(s)),
                None => "stays pending".into(),
            };
            let late = if w.deadline_missed { " (late)" } else { "" };
            cells.push(format!("{}\n{ready}{late}", w.outcome));
        }
        t.add_row(cells);
    }
    format!("{t}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decision(pod: &str, workload: Option<&str>) -> PodDecision {
        PodDecision { pod: pod.into(), workload: workload.map(String::from), outcome: Outcome::Existing { node: "n1".into() }, resize: None }
    }

    #[test]
    fn the_summary_agrees_in_number_and_shows_no_negative_zero() {
        let existing = decision("shop/web-0", Some("web"));
        let plan = Provisioning { pods: vec![existing.clone()], claims: Vec::new() };
        assert_eq!(summary(&plan), "1 pending pod: 1 fits a Ready node now, 0 go to 0 new claims (+0 W idle), 0 cannot be placed.");
        let plan = Provisioning { pods: vec![existing.clone(), existing], claims: Vec::new() };
        assert_eq!(summary(&plan), "2 pending pods: 2 fit Ready nodes now, 0 go to 0 new claims (+0 W idle), 0 cannot be placed.");
        assert_eq!(summary(&Provisioning::default()), "No pending pods: nothing to place.");
    }

    /// Pods without ownerReferences: each is a workload of its own, named
    /// by its key, in the order of the decisions; the view is made from the
    /// plan alone (it once searched the snapshot's pods for every decision:
    /// 20,000 bare pods took 27 s).
    #[test]
    fn bare_pods_are_workloads_of_their_own_named_by_their_keys() {
        let mut pods: Vec<PodDecision> = (0..20_000).map(|i| decision(&format!("batch/bare-{i}"), None)).collect();
        pods.insert(1, decision("shop/web-0", Some("web")));
        pods.push(decision("shop/web-1", Some("web")));
        let view = PlanView::new(&Provisioning { pods, claims: Vec::new() });
        assert_eq!(view.workloads.len(), 20_001);
        let names: Vec<&str> = view.workloads.iter().take(3).map(|w| w.name.as_str()).collect();
        assert_eq!(names, ["batch/bare-0", "web", "batch/bare-1"]);
        assert_eq!(view.workloads[1].pods.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["shop/web-0", "shop/web-1"]);
        assert!(view.workloads.iter().filter(|w| w.name != "web").all(|w| w.pods.len() == 1 && w.pods[0].name == w.name));
    }
}
