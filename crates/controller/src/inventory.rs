//! The inventory as the cluster sees it: each server's power, claim and
//! stage, node, watts and health; what the fleet draws, and what powering
//! off saves. One reading for `ironclaim servers` and the dashboard.

use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::{PowerState, ProviderType};
use ironclaim_k8s::server_to_core;
use kube::ResourceExt;
use serde::Serialize;

use crate::index::{FailureBackoff, Index};
use crate::provider::{BAREMETALHOST_ANNOTATION, provider_type};

/// One server, as `--output json` prints it.
#[derive(Serialize)]
pub struct Row {
    pub name: String,
    /// `redfish`, or `metal3 NAMESPACE/NAME`.
    pub provider: String,
    /// `on`, `off`, `powering on`, `powering off` or `unknown`.
    pub power: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// The claim's stage, `failed: Reason`, or `claim missing`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The last reading, while the server is not off (a reading taken
    /// before it was powered off is not shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub watts: Option<i64>,
    /// `identity mismatch`, `not adopted` (ironclaim keeps its hands off;
    /// the Server's conditions say why), `maintenance`, `quarantined (N
    /// failures)`, `N failures` (`1 failure`) or `healthy`.
    pub health: String,
    pub cpu: String,
    pub memory: String,
    pub gpus: Vec<String>,
}

/// What the fleet draws: measured where there is a reading, estimated from
/// the power profiles elsewhere.
#[derive(Default, Serialize)]
pub struct Summary {
    pub servers: usize,
    pub on: usize,
    pub off: usize,
    pub powering_on: usize,
    pub powering_off: usize,
    pub unknown: usize,
    /// Sum of the readings of servers that are not off.
    pub measured_watts: i64,
    /// How many servers that are not off have a reading.
    pub measured_servers: usize,
    /// Powered servers without a reading, at their idle (or boot) watts.
    pub estimated_powered_watts: i64,
    pub unmeasured_servers: usize,
    /// Powered-off servers at their profile's off watts.
    pub estimated_off_watts: i64,
    pub total_watts: i64,
}

/// What powering off saves, as the controller's scale-down counts it
/// (`ironclaim_controller::scaledown::summary`).
#[derive(Serialize)]
pub struct Energy {
    pub off: usize,
    pub saving_watts: f64,
    pub warm_spares: usize,
    /// `6 servers off, saving 2.4 kW; 2 warm spares on`
    pub line: String,
}

#[derive(Serialize)]
pub struct Inventory {
    pub servers: Vec<Row>,
    pub summary: Summary,
    pub energy: Energy,
}

pub fn provider(server: &Server) -> String {
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

pub fn inventory(index: &Index) -> Inventory {
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
        let facts = crate::index::power_facts(server, links.node_of(&server.name_any()).is_some());
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
pub fn energy(index: &Index) -> Energy {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (mut snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
    snapshot.servers.retain(|s| {
        index.servers.get(&s.name).and_then(|k| k.status.as_ref()).and_then(|st| st.power_state).is_some_and(|p| p != PowerState::Unknown)
    });
    let fleet = crate::scaledown::summary(&snapshot);
    Energy { off: fleet.off, saving_watts: fleet.saving_watts, warm_spares: fleet.warm_spares, line: fleet.to_string() }
}

/// `1 failure`, `3 failures`.
pub fn failures(n: i64) -> String {
    if n == 1 { "1 failure".to_string() } else { format!("{} failures", n.max(0)) }
}
