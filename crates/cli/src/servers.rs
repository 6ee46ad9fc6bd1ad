//! `ironclaim servers`: the inventory as the cluster sees it: power, claim
//! and its stage, node, watts, health; what the fleet draws, and what
//! powering off saves.

use ironclaim_controller::index::{FailureBackoff, Index};
use ironclaim_controller::provider::{BAREMETALHOST_ANNOTATION, provider_type};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::server::ProviderType;
use ironclaim_k8s::server_to_core;
use kube::ResourceExt;
use serde::Serialize;

use crate::exit::Failure;
use crate::output::{self, OutputArg};
use crate::render;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    cluster: crate::cluster::ClusterArgs,
    /// The controller's namespace, where its claim lock ledger lives.
    #[arg(long, value_name = "NAMESPACE", default_value = "ironclaim-system")]
    controller_namespace: String,
    #[command(flatten)]
    output: OutputArg,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Read BMCs over Redfish (or Metal3's BareMetalHosts, with --metal3)
    /// and print a Server manifest for each machine; what could not be
    /// determined goes to stderr.
    Discover(crate::discover::Args),
}

/// One server, as `--output json` prints it.
#[derive(Serialize)]
struct Row {
    name: String,
    /// `redfish`, or `metal3 NAMESPACE/NAME`.
    provider: String,
    /// `on`, `off`, `powering on`, `powering off` or `unknown`.
    power: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    claim: Option<String>,
    /// The claim's stage, `failed: Reason`, or `claim missing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    /// The last reading, while the server is not off (a reading taken
    /// before it was powered off is not shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    watts: Option<i64>,
    /// `identity mismatch`, `not adopted` (ironclaim keeps its hands off;
    /// the Server's conditions say why), `maintenance`, `quarantined (N
    /// failures)`, `N failures` (`1 failure`) or `healthy`.
    health: String,
    cpu: String,
    memory: String,
    gpus: Vec<String>,
}

/// What the fleet draws: measured where there is a reading, estimated from
/// the power profiles elsewhere.
#[derive(Default, Serialize)]
struct Summary {
    servers: usize,
    on: usize,
    off: usize,
    powering_on: usize,
    powering_off: usize,
    unknown: usize,
    /// Sum of the readings of servers that are not off.
    measured_watts: i64,
    /// How many servers that are not off have a reading.
    measured_servers: usize,
    /// Powered servers without a reading, at their idle (or boot) watts.
    estimated_powered_watts: i64,
    unmeasured_servers: usize,
    /// Powered-off servers at their profile's off watts.
    estimated_off_watts: i64,
    total_watts: i64,
}

/// What powering off saves, as the controller's scale-down counts it
/// (`ironclaim_controller::scaledown::summary`).
#[derive(Serialize)]
struct Energy {
    off: usize,
    saving_watts: f64,
    warm_spares: usize,
    /// `6 servers off, saving 2.4 kW; 2 warm spares on`
    line: String,
}

#[derive(Serialize)]
struct Inventory {
    servers: Vec<Row>,
    summary: Summary,
    energy: Energy,
}

pub fn run(args: Args) -> Result<(), Failure> {
    if let Some(Action::Discover(discover)) = args.action {
        return crate::discover::run(discover, &args.cluster);
    }
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    let inventory = runtime.block_on(async {
        let connection = crate::cluster::connect(&args.cluster).await?;
        let index = crate::cluster::read(&connection, &args.controller_namespace).await?;
        Ok::<_, Failure>(inventory(&index))
    })?;
    output::print(args.output.output, &inventory, table)
}

fn provider(server: &Server) -> String {
    match provider_type(server) {
        ProviderType::Redfish => "redfish".into(),
        ProviderType::External => format!("external {}", server.spec.external_provider().map(|e| e.name.as_str()).unwrap_or_default()),
        ProviderType::ClusterApi => match server.spec.machine_deployment() {
            Some(md) => format!("cluster-api {}/{}", md.namespace, md.machine_deployment),
            None => "cluster-api".into(),
        },
        ProviderType::Metal3 => match server.spec.metal3_host() {
            Some(h) => format!("metal3 {}/{}", h.namespace, h.name),
            None => format!("metal3 {}", server.annotations().get(BAREMETALHOST_ANNOTATION).cloned().unwrap_or_default()),
        },
    }
}

fn inventory(index: &Index) -> Inventory {
    let mut summary = Summary { servers: index.servers.len(), ..Summary::default() };
    let mut rows = Vec::new();
    let links = index.links();
    for server in index.servers.values() {
        let status = server.status.clone().unwrap_or_default();
        let profile = server_to_core(server).map(|s| s.power).unwrap_or_default();
        let state = status.power_state.unwrap_or(PowerState::Unknown);
        let power = match state {
            PowerState::On => "on",
            PowerState::Off => "off",
            PowerState::PoweringOn => "powering on",
            PowerState::PoweringOff => "powering off",
            PowerState::Unknown => "unknown",
        };
        let counter = match state {
            PowerState::On => &mut summary.on,
            PowerState::Off => &mut summary.off,
            PowerState::PoweringOn => &mut summary.powering_on,
            PowerState::PoweringOff => &mut summary.powering_off,
            PowerState::Unknown => &mut summary.unknown,
        };
        *counter += 1;
        let watts = if state == PowerState::Off { None } else { status.watts };
        match (state, watts) {
            (PowerState::Off, _) => summary.estimated_off_watts += profile.off_watts.round() as i64,
            (PowerState::Unknown, None) => {}
            (_, Some(w)) => {
                summary.measured_watts += w;
                summary.measured_servers += 1;
            }
            (PowerState::PoweringOn, None) => {
                summary.estimated_powered_watts += profile.boot_watts.round() as i64;
                summary.unmeasured_servers += 1;
            }
            (_, None) => {
                summary.estimated_powered_watts += profile.idle_watts.round() as i64;
                summary.unmeasured_servers += 1;
            }
        }
        // A server locked for a claim its status does not name yet is
        // being opened (or its opening died; the controller's sweep breaks
        // such a lock after the opening grace).
        let named = status.claim.clone().filter(|c| !c.is_empty());
        let locked = index.locks.get(&server.name_any()).map(|l| l.holder.clone()).filter(|_| named.is_none());
        let claim = named.or(locked.clone());
        let stage = claim.as_ref().map(|claim| match index.claims.get(claim).and_then(|c| c.status.as_ref()) {
            None if locked.is_some() => "opening (locked)".to_string(),
            None if !index.claims.contains_key(claim) => "claim missing".to_string(),
            None => "selected".to_string(),
            Some(s) => match (s.failure_reason, s.stage) {
                (Some(r), _) => format!("failed: {r:?}"),
                (None, Some(stage)) => stage.label().replace('_', " "),
                (None, None) => "selected".into(),
            },
        });
        let node = status.node.clone().or_else(|| links.node_of(&server.name_any()).map(str::to_string));
        let facts = ironclaim_controller::index::power_facts(server, links.node_of(&server.name_any()).is_some());
        let health = if links.mismatch(&server.name_any()).is_some() {
            "identity mismatch".to_string()
        } else if ironclaim_core::identity::unadopted(facts).is_some() {
            "not adopted".to_string()
        } else if server.spec.maintenance {
            "maintenance".to_string()
        } else if status.quarantined {
            format!("quarantined ({})", failures(status.failures))
        } else if status.failures > 0 {
            failures(status.failures)
        } else {
            "healthy".to_string()
        };
        rows.push(Row {
            name: server.name_any(),
            provider: provider(server),
            power,
            claim,
            stage,
            node,
            watts,
            health,
            cpu: server.spec.hardware.cpu.0.clone(),
            memory: server.spec.hardware.memory.0.clone(),
            gpus: server.spec.hardware.gpus.iter().map(|g| format!("{}x{}", g.count, g.model)).collect(),
        });
    }
    summary.total_watts = summary.measured_watts + summary.estimated_powered_watts + summary.estimated_off_watts;
    Inventory { servers: rows, summary, energy: energy(index) }
}

/// The controller's energy summary, on the same snapshot it plans on; a
/// server whose power state is unknown is neither off nor a spare, so it
/// is left out, as the controller does.
fn energy(index: &Index) -> Energy {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (mut snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
    snapshot.servers.retain(|s| {
        index.servers.get(&s.name).and_then(|k| k.status.as_ref()).and_then(|st| st.power_state).is_some_and(|p| p != PowerState::Unknown)
    });
    let fleet = ironclaim_controller::scaledown::summary(&snapshot);
    Energy { off: fleet.off, saving_watts: fleet.saving_watts, warm_spares: fleet.warm_spares, line: fleet.to_string() }
}

/// `5 servers: 2 on, 3 off; about 480 W: 430 W measured on 2 servers, 50 W for 3 powered off (their offWatts)`
fn summary_line(s: &Summary) -> String {
    let mut states = vec![format!("{} on", s.on), format!("{} off", s.off)];
    for (n, what) in [(s.powering_on, "powering on"), (s.powering_off, "powering off"), (s.unknown, "unknown")] {
        if n > 0 {
            states.push(format!("{n} {what}"));
        }
    }
    let mut parts = vec![format!("{} W measured on {} server{}", s.measured_watts, s.measured_servers, plural(s.measured_servers))];
    if s.unmeasured_servers > 0 {
        parts.push(format!(
            "{} W for {} powered without a reading (their idleWatts, bootWatts while powering on)",
            s.estimated_powered_watts, s.unmeasured_servers
        ));
    }
    if s.off > 0 {
        parts.push(format!("{} W for {} powered off (their offWatts)", s.estimated_off_watts, s.off));
    }
    let about = if s.unmeasured_servers > 0 || s.off > 0 { "about " } else { "" };
    format!("{} server{}: {}; {about}{} W: {}", s.servers, plural(s.servers), states.join(", "), s.total_watts, parts.join(", "))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// `1 failure`, `3 failures`.
fn failures(n: i64) -> String {
    render::count(n.max(0) as u64, "failure", "failures")
}

fn table(inventory: &Inventory) -> String {
    let mut table = render::table(&["SERVER", "POWER", "CLAIM", "STAGE", "NODE", "WATTS", "HEALTH", "CPU", "MEMORY", "GPUS"]);
    for r in &inventory.servers {
        table.add_row(vec![
            r.name.clone(),
            r.power.to_string(),
            r.claim.clone().unwrap_or_default(),
            r.stage.clone().unwrap_or_default(),
            r.node.clone().unwrap_or_default(),
            r.watts.map(|w| format!("{w} W")).unwrap_or_else(|| "-".into()),
            r.health.clone(),
            r.cpu.clone(),
            r.memory.clone(),
            r.gpus.join(", "),
        ]);
    }
    format!("{table}\n{}\n{}\n", summary_line(&inventory.summary), inventory.energy.line)
}

#[cfg(test)]
mod tests {
    use super::{Summary, failures, summary_line};

    #[test]
    fn failures_are_counted_in_agreement() {
        assert_eq!(failures(1), "1 failure");
        assert_eq!(failures(3), "3 failures");
    }

    #[test]
    fn the_summary_says_what_is_measured_and_what_is_estimated() {
        let all_measured = Summary { servers: 2, on: 2, measured_watts: 400, measured_servers: 2, total_watts: 400, ..Summary::default() };
        assert_eq!(summary_line(&all_measured), "2 servers: 2 on, 0 off; 400 W: 400 W measured on 2 servers");
        let mixed = Summary {
            servers: 5,
            on: 2,
            off: 2,
            powering_on: 1,
            measured_watts: 430,
            measured_servers: 1,
            estimated_powered_watts: 300,
            unmeasured_servers: 2,
            estimated_off_watts: 30,
            total_watts: 760,
            ..Summary::default()
        };
        assert_eq!(
            summary_line(&mixed),
            "5 servers: 2 on, 2 off, 1 powering on; about 760 W: 430 W measured on 1 server, \
             300 W for 2 powered without a reading (their idleWatts, bootWatts while powering on), 30 W for 2 powered off (their offWatts)"
        );
    }
}
