//! `examples/worked-example.yaml` is the embedded worked example written as
//! manifests: loading it gives the same inventory, pools and nodes, and the
//! core makes the same plan.

use ironclaim_core::{Outcome, Provisioning, SupplyPath, provision, scenario};
use ironclaim_k8s::load_files;
use std::collections::BTreeMap;
use std::path::PathBuf;

fn example_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../examples/worked-example.yaml")
}

fn loaded() -> ironclaim_core::Snapshot {
    let manifests = load_files(&[example_path()]).unwrap_or_else(|e| panic!("{e}"));
    assert!(manifests.warnings.is_empty(), "{:?}", manifests.warnings);
    manifests.snapshot
}

/// Per workload, each pod's outcome without the names that differ between
/// the two sources (pod and claim names), sorted.
fn outcomes_by_workload(plan: &Provisioning) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in &plan.pods {
        let text = match &d.outcome {
            Outcome::Existing { node } => format!("existing on {node}"),
            Outcome::InFlight { server, eta_s, .. } => format!("in flight on {server} in {eta_s}s"),
            Outcome::NewClaim { server, path, eta_s, deadline_missed, .. } => {
                format!("new claim {server} {path} in {eta_s}s, deadline missed: {deadline_missed}")
            }
            Outcome::Unschedulable { reason } => format!("unschedulable: {reason}"),
        };
        out.entry(d.workload.clone().unwrap_or_default()).or_default().push(text);
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

#[test]
fn the_manifests_hold_the_embedded_inventory_pools_and_nodes() {
    let snap = loaded();
    assert_eq!(snap.servers, scenario::worked_example_servers());
    assert_eq!(snap.pools, scenario::worked_example_pools());
    assert_eq!(snap.nodes, scenario::worked_example_nodes());
}

#[test]
fn the_workloads_expand_to_the_embedded_pods() {
    let snap = loaded();
    let embedded = scenario::worked_example_pods();
    assert_eq!(snap.pods.len(), embedded.len());
    let shape = |p: &ironclaim_core::Pod| {
        (p.workload.clone(), p.requests.clone(), p.node_selector.clone(), p.tolerations.clone(), p.deadline_s, p.labels.clone())
    };
    let mut ours: Vec<_> = snap.pods.iter().map(shape).collect();
    let mut theirs: Vec<_> = embedded.iter().map(shape).collect();
    ours.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    theirs.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    assert_eq!(ours, theirs);
}

#[test]
fn the_plan_from_the_manifests_is_the_embedded_plan() {
    let ours = provision(&loaded(), 0);
    let theirs = provision(&scenario::worked_example(), 0);
    assert_eq!(outcomes_by_workload(&ours), outcomes_by_workload(&theirs));
    let claims = |p: &Provisioning| {
        let mut c: Vec<_> = p.claims.iter().map(|c| (c.server.clone(), c.pool.clone(), c.path, c.eta_s, c.pods.len())).collect();
        c.sort_by(|a, b| a.0.cmp(&b.0));
        c
    };
    assert_eq!(claims(&ours), claims(&theirs));
}

#[test]
fn web_stays_on_existing_nodes_batch_takes_the_warm_server_inference_splits() {
    let plan = provision(&loaded(), 0);
    let by_workload = outcomes_by_workload(&plan);
    assert_eq!(by_workload["web-burst"].len(), 6);
    assert!(by_workload["web-burst"].iter().all(|o| o.starts_with("existing on general-")), "{by_workload:?}");
    let batch: Vec<_> = plan.pods.iter().filter(|d| d.workload.as_deref() == Some("batch-job")).collect();
    assert!(
        matches!(&batch[..], [d] if matches!(&d.outcome, Outcome::NewClaim { server, path: SupplyPath::Warm, .. } if server == "r1-u10")),
        "{batch:?}"
    );
    let inference = &by_workload["gpu-inference"];
    assert!(inference.iter().any(|o| o == "existing on gpu-a"), "{inference:?}");
    assert!(inference.iter().any(|o| o.starts_with("new claim r2-u2") && o.contains(" cold ")), "{inference:?}");
}
