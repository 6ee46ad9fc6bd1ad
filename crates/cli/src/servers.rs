//! `ironclaim servers`: the inventory as the cluster sees it: power, claim
//! and its stage, node, watts, health.

use std::path::PathBuf;

use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::server_to_core;
use kube::ResourceExt;

use crate::exit::Failure;
use crate::render;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, value_name = "FILE", env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    runtime.block_on(async move {
        let client = crate::controller::client(args.kubeconfig.as_ref()).await.map_err(Failure::world)?;
        let index = ironclaim_controller::cluster::read(&client).await.map_err(Failure::world)?;
        let mut table = render::table(&["SERVER", "POWER", "CLAIM", "STAGE", "NODE", "WATTS", "HEALTH", "CPU", "MEMORY", "GPUS"]);
        let mut fleet_watts = 0i64;
        let mut off = 0;
        for server in index.servers.values() {
            let status = server.status.clone().unwrap_or_default();
            let power = match status.power_state {
                Some(PowerState::On) => "on",
                Some(PowerState::Off) => {
                    off += 1;
                    "off"
                }
                Some(PowerState::PoweringOn) => "powering on",
                Some(PowerState::PoweringOff) => "powering off",
                Some(PowerState::Unknown) | None => "unknown",
            };
            let claim = status.claim.clone().unwrap_or_default();
            let stage = index
                .claims
                .get(&claim)
                .and_then(|c| c.status.as_ref())
                .map(|s| match (s.failure_reason, s.stage) {
                    (Some(r), _) => format!("failed: {r:?}"),
                    (None, Some(stage)) => ironclaim_controller::timeline::stage_name(stage).replace('_', " "),
                    (None, None) => "selected".into(),
                })
                .unwrap_or_default();
            let node = status.node.clone().or_else(|| index.node_of_server(&server.name_any()).map(|n| n.name_any())).unwrap_or_default();
            fleet_watts += status.watts.unwrap_or(0);
            let health = if server.spec.maintenance {
                "maintenance".to_string()
            } else if status.quarantined {
                format!("quarantined ({} failures)", status.failures)
            } else if status.failures > 0 {
                format!("{} failure(s)", status.failures)
            } else {
                "healthy".to_string()
            };
            let gpus: Vec<String> = server.spec.hardware.gpus.iter().map(|g| format!("{}x{}", g.count, g.model)).collect();
            let _ = server_to_core(server);
            table.add_row(vec![
                server.name_any(),
                power.to_string(),
                claim,
                stage,
                node,
                status.watts.map(|w| format!("{w} W")).unwrap_or_else(|| "-".into()),
                health,
                server.spec.hardware.cpu.0.clone(),
                server.spec.hardware.memory.0.clone(),
                gpus.join(", "),
            ]);
        }
        println!("{table}");
        println!("{} servers, {off} powered off; the BMCs report {fleet_watts} W in total", index.servers.len());
        Ok(())
    })
}
