//! `ironclaim explain pod NS/NAME`: why a pod waits, which claim and server
//! it waits for, which stage that claim is in and when it should be ready,
//! or the exact reason nothing can be provisioned for it.

use std::path::PathBuf;

use anyhow::anyhow;
use ironclaim_controller::index::FailureBackoff;
use ironclaim_controller::timeline;
use ironclaim_core::outcome::Outcome;
use ironclaim_k8s::server_to_core;
use kube::ResourceExt;

use crate::exit::Failure;
use crate::render;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    what: What,
    #[arg(long, value_name = "FILE", env = "KUBECONFIG", global = true)]
    kubeconfig: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum What {
    /// A pod, as NAMESPACE/NAME (or NAME in the default namespace).
    Pod { pod: String },
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

pub fn run(args: Args) -> Result<(), Failure> {
    let What::Pod { pod } = args.what;
    let (namespace, name) = match pod.split_once('/') {
        Some((ns, n)) if !ns.is_empty() && !n.is_empty() => (ns.to_string(), n.to_string()),
        Some(_) => return Err(Failure::bad_input(anyhow!("expected NAMESPACE/NAME, found {pod:?}"))),
        None => ("default".to_string(), pod.clone()),
    };
    let key = format!("{namespace}/{name}");
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    runtime.block_on(async move {
        let client = crate::controller::client(args.kubeconfig.as_ref()).await.map_err(Failure::world)?;
        let index = ironclaim_controller::cluster::read(&client).await.map_err(Failure::world)?;
        let Some(entry) = index.pods.get(&key) else {
            if let Some(err) = index.bad_pods.get(&key) {
                return Err(Failure::world(anyhow!("pod {key} cannot be read: {err}")));
            }
            return Err(Failure::world(anyhow!("pod {key} not found")));
        };
        if let Some(node) = &entry.pod.node_name {
            println!("pod {key} is bound to node {node}");
            return Ok(());
        }
        if !entry.pod.is_pending_demand() {
            println!("pod {key} does not wait for a node (phase {:?}, terminating {})", entry.pod.phase, entry.pod.terminating);
            return Ok(());
        }
        let now = now_s();
        // The claims opened for it, newest last.
        let mut claims: Vec<_> = index
            .claims
            .values()
            .filter(|c| c.spec.pods.iter().any(|p| p.namespace == namespace && p.name == name))
            .collect();
        claims.sort_by_key(|c| c.metadata.creation_timestamp.as_ref().map(|t| t.0));
        for claim in &claims {
            let status = claim.status.clone().unwrap_or_default();
            let server = index.servers.get(&claim.spec.server);
            let durations = server.and_then(|s| server_to_core(s).ok()).map(|s| s.durations).unwrap_or_default();
            match (status.failure_reason, &status.failure_message) {
                (Some(reason), message) => println!(
                    "claim {} on server {} failed: {reason:?}: {}",
                    claim.name_any(),
                    claim.spec.server,
                    message.clone().unwrap_or_default()
                ),
                (None, _) => println!("{}", timeline::waiting_note(&claim.spec.server, &status, &durations, now)),
            }
            let mut table = render::table(&["STAGE", "STARTED", "TOOK", "OUTCOME", "MESSAGE"]);
            for r in &status.stages {
                table.add_row(vec![
                    timeline::stage_name(r.stage).replace('_', " "),
                    format!("{} ago", timeline::human(now.saturating_sub(timeline::seconds(&r.start_time)))),
                    r.duration_seconds.map(|d| timeline::human(d.max(0) as u64)).unwrap_or_else(|| "-".into()),
                    format!("{:?}", r.outcome),
                    r.message.clone().unwrap_or_default(),
                ]);
            }
            println!("claim {} (pool {}):\n{table}", claim.name_any(), claim.spec.pool);
            for c in &status.conditions {
                if c.status == "False" {
                    println!("  {}: {} ({})", c.type_, c.message, c.reason);
                }
            }
        }
        // What the core decides for it now.
        let (snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
        let plan = ironclaim_core::provision(&snapshot, now);
        match plan.decision(&key).map(|d| &d.outcome) {
            Some(Outcome::Existing { node }) => println!(
                "it fits Ready node {node} now: the scheduler should bind it; if it does not, capacity or request accounting is stale"
            ),
            Some(Outcome::InFlight { claim, server, eta_s }) => {
                println!("it waits for claim {claim} on server {server}: ready in about {}", timeline::human(*eta_s))
            }
            Some(Outcome::NewClaim { server, path, eta_s, .. }) => println!(
                "the next decision claims server {server} ({path}) for it: ready in about {}",
                timeline::human(*eta_s)
            ),
            Some(Outcome::Unschedulable { reason }) => println!("nothing can be provisioned for it: {reason}"),
            None => println!("the core does not count it as pending demand"),
        }
        Ok(())
    })
}
