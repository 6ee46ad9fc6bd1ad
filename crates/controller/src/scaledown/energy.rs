//! Energy in the open: watts saved by the servers that are off, energy
//! saved since start, warm spares on, and the one-line fleet summary
//! `ironclaim servers` prints.
//!
//! Fleet watts come from the BMCs' own readings, which the controller's
//! power sweep already publishes as `ironclaim_fleet_watts`; this module
//! adds what scale-down is for: what being off saves.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::atomic::AtomicU64;

use ironclaim_core::model::{Health, PowerState, Seconds, Snapshot};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::metrics::Declared;

type Labels = Vec<(String, String)>;

/// The fleet at a glance, from one snapshot.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetSummary {
    /// Servers powered off.
    pub off: usize,
    /// What the servers that are off would draw idling, less what they
    /// draw off: their measured idle watts minus their standby watts.
    pub saving_watts: f64,
    /// Healthy servers powered on with no workload pod: unclaimed warm
    /// spares and empty nodes alike, ready for a burst in seconds.
    pub warm_spares: usize,
}

/// Summarises the fleet: "6 servers off, saving 2.4 kW; 2 warm spares on".
///
/// # Guarantees
/// Only servers that are one machine each count (templates are skipped);
/// a server is a warm spare when it is on, healthy, and either unclaimed
/// with no node, or holding a node that is ready, schedulable, not being
/// drained and runs no pod other than DaemonSet pods.
///
/// # Assumptions
/// The snapshot's `Off` is the servers' last known state; a server whose
/// state is unknown reads as off there, so leave such servers out of the
/// snapshot (as the controller does) for an exact count.
pub fn fleet_summary(snapshot: &Snapshot) -> FleetSummary {
    // One pass over the nodes and one over the pods, then each server looks
    // its node up: a fleet of 5,000 servers and 150,000 pods is not walked
    // once per server.
    let nodes: HashMap<&str, &ironclaim_core::model::Node> = snapshot.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
    let working: HashSet<&str> = snapshot
        .pods
        .iter()
        .filter(|p| p.occupies_node() && !p.terminating && !p.is_daemonset_pod())
        .filter_map(|p| p.node_name.as_deref())
        .collect();
    let mut summary = FleetSummary::default();
    for server in snapshot.servers.iter().filter(|s| !s.unlimited) {
        if server.power_state == PowerState::Off {
            summary.off += 1;
            summary.saving_watts += (server.power.idle_watts - server.power.off_watts).max(0.0);
            continue;
        }
        if server.health != Health::Healthy {
            continue;
        }
        let busy = match &server.node {
            None => server.claim.is_some(),
            Some(node) => {
                let usable = nodes.get(node.as_str()).is_none_or(|n| n.ready && !n.unschedulable && !n.disrupting);
                !usable || working.contains(node.as_str())
            }
        };
        if !busy {
            summary.warm_spares += 1;
        }
    }
    summary
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Watts in the unit a person reads: "850 W", "2.4 kW", "1.2 MW".
pub fn human_watts(watts: f64) -> String {
    let w = watts.max(0.0);
    if w >= 1_000_000.0 {
        format!("{:.1} MW", w / 1_000_000.0)
    } else if w >= 1000.0 {
        format!("{:.1} kW", w / 1000.0)
    } else {
        format!("{w:.0} W")
    }
}

impl fmt::Display for FleetSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} off, saving {}; {} on",
            plural(self.off, "server", "servers"),
            human_watts(self.saving_watts),
            plural(self.warm_spares, "warm spare", "warm spares")
        )
    }
}

/// The scale-down metrics, registered in the controller's registry.
#[derive(Clone, Default)]
pub struct ScaleDownMetrics {
    /// Idle watts avoided right now by the servers that are off.
    pub watts_saved: Gauge<f64, AtomicU64>,
    /// Joules saved since this controller started: watts saved, integrated.
    pub energy_saved: Counter<f64, AtomicU64>,
    /// Servers powered off, as the last snapshot had them.
    pub servers_off: Gauge,
    /// Healthy powered-on servers running no workload.
    pub warm_spares: Gauge,
    /// Scale-down actions by action (`drain`, `power_off`, `power_on`),
    /// reason and outcome.
    pub actions: Family<Labels, Counter>,
    /// Eviction requests by answer (`evicted`, `blocked`, `gone`, `failed`).
    pub evictions: Family<Labels, Counter>,
    /// Stranded resources found in the last pass, by kind.
    pub stranded: Family<Labels, Gauge>,
}

impl ScaleDownMetrics {
    /// Creates the metrics and registers them (prefixed by the registry).
    pub fn register(registry: &mut Registry) -> Self {
        let m = ScaleDownMetrics::default();
        registry.register("watts_saved", "Idle watts avoided by the servers that are off", m.watts_saved.clone());
        registry.register("energy_saved_joules", "Energy saved by powered-off servers since start", m.energy_saved.clone());
        registry.register("servers_off", "Servers powered off", m.servers_off.clone());
        registry.register("warm_spares", "Healthy powered-on servers running no workload", m.warm_spares.clone());
        registry.register("scaledown_actions", "Scale-down actions by action, reason and outcome", Declared(m.actions.clone()));
        registry.register("evictions", "Eviction requests by answer", Declared(m.evictions.clone()));
        registry.register("stranded", "Stranded resources found in the last pass, by kind", Declared(m.stranded.clone()));
        m
    }

    pub fn action(&self, action: &str, reason: &str, outcome: &str) {
        self.actions
            .get_or_create(&vec![("action".into(), action.into()), ("reason".into(), reason.into()), ("outcome".into(), outcome.into())])
            .inc();
    }

    pub fn eviction(&self, outcome: &str) {
        self.evictions.get_or_create(&vec![("outcome".into(), outcome.into())]).inc();
    }

    /// The stranded resources of the last pass, one kind per finding: a
    /// kind none was found of any more is dropped.
    pub fn set_stranded<'a>(&self, kinds: impl IntoIterator<Item = &'a str>) {
        self.stranded.clear();
        for kind in kinds {
            self.stranded.get_or_create(&vec![("kind".into(), kind.into())]).inc();
        }
    }
}

/// Integrates the watts saved between observations into joules.
#[derive(Debug, Default)]
pub struct EnergyMeter {
    last: Option<(Seconds, f64)>,
}

impl EnergyMeter {
    /// Records the fleet at `now_s` and returns the joules saved since the
    /// previous observation (the earlier rate held until now).
    pub fn observe(&mut self, now_s: Seconds, summary: &FleetSummary, metrics: &ScaleDownMetrics) -> f64 {
        let joules = match self.last {
            Some((then, watts)) if now_s > then => watts * (now_s - then) as f64,
            _ => 0.0,
        };
        if self.last.is_none_or(|(then, _)| now_s >= then) {
            self.last = Some((now_s, summary.saving_watts));
        }
        metrics.watts_saved.set(summary.saving_watts);
        metrics.energy_saved.inc_by(joules);
        metrics.servers_off.set(summary.off as i64);
        metrics.warm_spares.set(summary.warm_spares as i64);
        joules
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_core::model::{Node, Pod, PowerProfile, Server};
    use ironclaim_core::resources::Resources;

    fn server(name: &str, idle: f64, on: bool) -> Server {
        let mut s = Server::new(name, Resources::new(8000, 16 << 30));
        s.power = PowerProfile::new(idle, idle * 2.0, idle, 0.0);
        if on { s.warm() } else { s }
    }

    #[test]
    fn six_off_and_two_spares_read_as_the_servers_command_prints_them() {
        let mut snap = Snapshot::default();
        for i in 0..6 {
            snap.servers.push(server(&format!("off-{i}"), 400.0, false));
        }
        snap.servers.push(server("spare-0", 200.0, true));
        let mut empty = server("empty-node", 200.0, true);
        empty.node = Some("empty-node".into());
        empty.claim = Some("c1".into());
        snap.servers.push(empty);
        let mut busy = server("busy", 200.0, true);
        busy.node = Some("busy".into());
        busy.claim = Some("c2".into());
        snap.servers.push(busy);
        snap.nodes.push(Node::new("busy", Resources::new(8000, 16 << 30)));
        let mut pod = Pod::new("default", "web", Resources::new(100, 1 << 20));
        pod.node_name = Some("busy".into());
        pod.phase = ironclaim_core::model::PodPhase::Running;
        snap.pods.push(pod);
        let summary = fleet_summary(&snap);
        assert_eq!(summary, FleetSummary { off: 6, saving_watts: 2400.0, warm_spares: 2 });
        assert_eq!(summary.to_string(), "6 servers off, saving 2.4 kW; 2 warm spares on");
    }

    #[test]
    fn a_claimed_server_still_booting_is_no_spare_and_one_of_each_reads_singular() {
        let mut snap = Snapshot::default();
        let mut booting = server("booting", 150.0, true);
        booting.claim = Some("c".into());
        snap.servers.push(booting);
        snap.servers.push(server("off", 150.0, false));
        snap.servers.push(server("spare", 150.0, true));
        assert_eq!(fleet_summary(&snap).to_string(), "1 server off, saving 150 W; 1 warm spare on");
    }

    #[test]
    fn draining_cordoned_or_unready_nodes_are_no_spares_and_templates_do_not_count() {
        let mut snap = Snapshot::default();
        for (name, unschedulable, disrupting, ready) in
            [("cordoned", true, false, true), ("draining", true, true, true), ("booting", false, false, false), ("fine", false, false, true)]
        {
            let mut s = server(name, 100.0, true);
            s.node = Some(name.into());
            s.claim = Some(format!("c-{name}"));
            snap.servers.push(s);
            let mut n = Node::new(name, Resources::new(8000, 16 << 30));
            (n.unschedulable, n.disrupting, n.ready) = (unschedulable, disrupting, ready);
            snap.nodes.push(n);
        }
        let mut template = server("vm-template", 100.0, false);
        template.unlimited = true;
        snap.servers.push(template);
        let mut sick = server("sick", 100.0, true);
        sick.health = Health::Quarantined;
        snap.servers.push(sick);
        assert_eq!(fleet_summary(&snap), FleetSummary { off: 0, saving_watts: 0.0, warm_spares: 1 });
    }

    #[test]
    fn standby_draw_is_subtracted_and_never_counts_negative() {
        let mut snap = Snapshot::default();
        let mut a = server("a", 250.0, false);
        a.power.off_watts = 10.0;
        let mut b = server("b", 5.0, false);
        b.power.off_watts = 10.0;
        snap.servers = vec![a, b];
        let summary = fleet_summary(&snap);
        assert_eq!(summary.saving_watts, 240.0);
        assert_eq!(summary.to_string(), "2 servers off, saving 240 W; 0 warm spares on");
        assert_eq!(human_watts(1_260_000.0), "1.3 MW");
        assert_eq!(human_watts(999.4), "999 W");
    }

    #[test]
    fn energy_is_the_previous_rate_held_until_now() {
        let metrics = ScaleDownMetrics::default();
        let mut meter = EnergyMeter::default();
        let two_kw = FleetSummary { off: 2, saving_watts: 2000.0, warm_spares: 0 };
        assert_eq!(meter.observe(100, &two_kw, &metrics), 0.0);
        assert_eq!(meter.observe(110, &FleetSummary::default(), &metrics), 20_000.0);
        assert_eq!(meter.observe(120, &two_kw, &metrics), 0.0);
        // A clock that steps back adds nothing.
        assert_eq!(meter.observe(90, &two_kw, &metrics), 0.0);
        assert_eq!(metrics.energy_saved.get(), 20_000.0);
        assert_eq!(metrics.watts_saved.get(), 2000.0);
    }
}
