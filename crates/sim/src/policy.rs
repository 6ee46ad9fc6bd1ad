//! When to power servers off, and how many idle servers to keep on.
//!
//! The decision core plans scale-up; this module holds the power policies
//! the simulator compares, behind one trait, so that the default can move
//! into the core unchanged: it reads a [`FleetView`] and a time and returns
//! a [`PowerPlan`], with no IO and no clock of its own.

use crate::config::PolicySettings;
use crate::workload::{HardwareClass, SimServer};
use ironclaim_core::disruption::break_even_s;
use ironclaim_core::{AdaptiveFloor, Seconds, Server, warm};
use serde::Serialize;
use std::collections::VecDeque;

/// Where a server stands, as a power policy needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerStatus {
    /// Powered off and free to be claimed.
    Off,
    /// Powered off and not claimable: failed (backing off) or quarantined.
    Unavailable,
    /// A claim is in flight; `spare` when the policy started it.
    Starting { spare: bool },
    /// A Ready node. `idle_since` is set when no non-DaemonSet pod runs on it.
    Ready { idle_since: Option<Seconds> },
    /// Being powered off.
    Stopping,
}

/// A read-only view of the fleet for a policy.
pub struct FleetView<'a> {
    pub now_s: Seconds,
    pub servers: &'a [SimServer],
    pub classes: &'a [HardwareClass],
    pub class_of: &'a [usize],
    pub status: &'a [ServerStatus],
    pub power_on_cycles: &'a [u32],
    /// Servers not Off, in index order.
    pub powered: &'a [usize],
}

impl FleetView<'_> {
    /// Off, claimable servers of a class, least-cycled first (wear levelling).
    pub fn off_in_class(&self, class: usize) -> Vec<usize> {
        let mut v: Vec<usize> = self.classes[class].members.iter().copied().filter(|&s| self.status[s] == ServerStatus::Off).collect();
        v.sort_by_key(|&s| (self.power_on_cycles[s], s));
        v
    }

    /// Idle Ready servers, as (server, idle since).
    pub fn idle(&self) -> Vec<(usize, Seconds)> {
        self.powered
            .iter()
            .filter_map(|&s| match self.status[s] {
                ServerStatus::Ready { idle_since: Some(t) } => Some((s, t)),
                _ => None,
            })
            .collect()
    }

    pub fn starting_spares(&self) -> Vec<usize> {
        self.powered.iter().copied().filter(|&s| self.status[s] == ServerStatus::Starting { spare: true }).collect()
    }
}

/// A demand signal: a server that had no workload pod received one, and no
/// server already running workload pods had room for it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FirstPod {
    pub at_s: Seconds,
    pub class: usize,
    /// The pod's deadline, from its creation.
    pub deadline_s: Option<Seconds>,
}

/// At least `count` idle Ready servers (of `class`, or of any class) stay
/// on. Checkers hold the policy to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Floor {
    pub class: Option<usize>,
    pub count: u32,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PowerPlan {
    /// Idle Ready servers to power off now.
    pub power_off: Vec<usize>,
    /// Off servers to power on as warm spares.
    pub power_on: Vec<usize>,
    pub floors: Vec<Floor>,
    /// Call again at this time even if nothing else happens.
    pub wake_at_s: Option<Seconds>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    AlwaysOn,
    Reactive,
    WarmSpares,
    Ironclaim,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [PolicyKind::AlwaysOn, PolicyKind::Reactive, PolicyKind::WarmSpares, PolicyKind::Ironclaim];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::AlwaysOn => "always-on",
            PolicyKind::Reactive => "reactive",
            PolicyKind::WarmSpares => "warm-spares",
            PolicyKind::Ironclaim => "ironclaim",
        }
    }

    pub fn parse(s: &str) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|k| k.name() == s.trim())
    }

    pub fn build(self, settings: &PolicySettings) -> Box<dyn PowerPolicy> {
        match self {
            PolicyKind::AlwaysOn => Box::new(AlwaysOn),
            PolicyKind::Reactive => Box::new(Reactive { idle_timeout_s: settings.idle_timeout_s }),
            PolicyKind::WarmSpares => Box::new(WarmSpares { spares: settings.warm_spares, idle_timeout_s: settings.idle_timeout_s }),
            PolicyKind::Ironclaim => Box::new(Ironclaim::new(settings)),
        }
    }
}

/// A power policy: which servers start on, which to power off, which to
/// keep or bring on as warm spares.
pub trait PowerPolicy {
    fn kind(&self) -> PolicyKind;
    /// Servers that are Ready nodes when the run starts.
    fn initially_on(&self, view: &FleetView<'_>) -> Vec<usize>;
    /// A server got its first workload pod.
    fn observe(&mut self, _signal: FirstPod) {}
    /// Called at every reconcile.
    fn decide(&mut self, view: &FleetView<'_>) -> PowerPlan;
}

/// Every server on, all the time: the energy baseline.
pub struct AlwaysOn;

impl PowerPolicy for AlwaysOn {
    fn kind(&self) -> PolicyKind {
        PolicyKind::AlwaysOn
    }
    fn initially_on(&self, view: &FleetView<'_>) -> Vec<usize> {
        (0..view.servers.len()).collect()
    }
    fn decide(&mut self, _view: &FleetView<'_>) -> PowerPlan {
        PowerPlan::default()
    }
}

/// Power on only for pending pods (the core's claims), power off after a
/// fixed idle time, no spares.
pub struct Reactive {
    pub idle_timeout_s: Seconds,
}

impl PowerPolicy for Reactive {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Reactive
    }
    fn initially_on(&self, _view: &FleetView<'_>) -> Vec<usize> {
        Vec::new()
    }
    fn decide(&mut self, view: &FleetView<'_>) -> PowerPlan {
        let mut plan = PowerPlan::default();
        for (s, since) in view.idle() {
            let due = since + self.idle_timeout_s;
            if due <= view.now_s {
                plan.power_off.push(s);
            } else {
                plan.wake_at_s = Some(plan.wake_at_s.map_or(due, |w| w.min(due)));
            }
        }
        plan
    }
}

/// The most numerous hardware class: where a fixed spare policy draws from.
fn most_numerous_class(classes: &[HardwareClass]) -> Option<usize> {
    (0..classes.len()).max_by(|&a, &b| classes[a].members.len().cmp(&classes[b].members.len()).then(b.cmp(&a)))
}

/// Keeps a fixed number of idle servers on (of any class; new spares come
/// from the most numerous class), powers the rest off after a fixed idle
/// time.
pub struct WarmSpares {
    pub spares: u32,
    pub idle_timeout_s: Seconds,
}

impl PowerPolicy for WarmSpares {
    fn kind(&self) -> PolicyKind {
        PolicyKind::WarmSpares
    }
    fn initially_on(&self, view: &FleetView<'_>) -> Vec<usize> {
        let Some(c) = most_numerous_class(view.classes) else { return Vec::new() };
        view.classes[c].members.iter().copied().take(self.spares as usize).collect()
    }
    fn decide(&mut self, view: &FleetView<'_>) -> PowerPlan {
        let mut plan = PowerPlan { floors: vec![Floor { class: None, count: self.spares }], ..Default::default() };
        let mut idle = view.idle();
        // Keep the most recently idle servers as the spares.
        idle.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let keep = self.spares as usize;
        for &(s, since) in idle.iter().skip(keep) {
            let due = since + self.idle_timeout_s;
            if due <= view.now_s {
                plan.power_off.push(s);
            } else {
                plan.wake_at_s = Some(plan.wake_at_s.map_or(due, |w| w.min(due)));
            }
        }
        let have = idle.len() + view.starting_spares().len();
        if have < keep
            && let Some(c) = most_numerous_class(view.classes)
        {
            let mut candidates = view.off_in_class(c);
            if candidates.is_empty() {
                candidates = (0..view.classes.len()).flat_map(|k| view.off_in_class(k)).collect();
            }
            plan.power_on.extend(candidates.into_iter().take(keep - have));
        }
        plan
    }
}

/// ironclaim's default: the core's scale-down rules for idle servers.
///
/// # Power-off
/// An idle server is powered off once it has been idle for the core's
/// break-even time ([`ironclaim_core::disruption::break_even_s`]): the
/// energy of its power-on and boot divided by what staying on costs (idle
/// minus off watts). Idling shorter than that costs less than a power
/// cycle; longer, the cycle pays.
///
/// # Warm-spare floor
/// Per hardware class, the core's adaptive floor
/// ([`ironclaim_core::warm::adaptive_floor`]) over the servers that
/// received a first workload pod no busy node had room for (the engine
/// reports only those), taken from the most recently idle servers.
pub struct Ironclaim {
    adaptive: AdaptiveFloor,
    events: Vec<VecDeque<FirstPod>>,
    started_s: Option<Seconds>,
}

impl Ironclaim {
    pub fn new(settings: &PolicySettings) -> Self {
        Ironclaim {
            adaptive: AdaptiveFloor { window_s: settings.rate_window_s.max(warm::MIN_WINDOW_S), z: settings.floor_z },
            events: Vec::new(),
            started_s: None,
        }
    }

    /// The floor of a class from the demand seen in the window.
    fn floor_of(&self, class: usize, view: &FleetView<'_>) -> u32 {
        let Some(events) = self.events.get(class) else { return 0 };
        let members: Vec<&Server> = view.classes[class].members.iter().map(|&s| &view.servers[s].server).collect();
        let demand = events.iter().map(|e| (e.at_s, e.deadline_s));
        warm::adaptive_floor(demand, &members, &self.adaptive, self.started_s.unwrap_or(0), view.now_s)
    }
}

impl PowerPolicy for Ironclaim {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Ironclaim
    }

    fn initially_on(&self, _view: &FleetView<'_>) -> Vec<usize> {
        Vec::new()
    }

    fn observe(&mut self, signal: FirstPod) {
        if self.events.len() <= signal.class {
            self.events.resize_with(signal.class + 1, VecDeque::new);
        }
        self.events[signal.class].push_back(signal);
    }

    fn decide(&mut self, view: &FleetView<'_>) -> PowerPlan {
        let now = view.now_s;
        self.started_s.get_or_insert(now);
        let window_s = self.adaptive.window_s;
        let horizon = now.saturating_sub(window_s);
        let mut wake: Option<Seconds> = None;
        let mut soonest = |t: Seconds| wake = Some(wake.map_or(t, |w: Seconds| w.min(t)));
        for q in &mut self.events {
            while q.front().is_some_and(|e| e.at_s < horizon) {
                q.pop_front();
            }
            if let Some(e) = q.front() {
                soonest(e.at_s + window_s + 1);
            }
        }
        let mut plan = PowerPlan::default();
        let mut idle_by_class: Vec<Vec<(usize, Seconds)>> = vec![Vec::new(); view.classes.len()];
        for (s, since) in view.idle() {
            idle_by_class[view.class_of[s]].push((s, since));
        }
        let mut spares_by_class = vec![0usize; view.classes.len()];
        for s in view.starting_spares() {
            spares_by_class[view.class_of[s]] += 1;
        }
        for (c, idle) in idle_by_class.iter_mut().enumerate() {
            let floor = self.floor_of(c, view);
            if floor > 0 {
                plan.floors.push(Floor { class: Some(c), count: floor });
            }
            idle.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
            for &(s, since) in idle.iter().skip(floor as usize) {
                let due = since + break_even_s(&view.servers[s].server);
                if due <= now {
                    plan.power_off.push(s);
                } else {
                    soonest(due);
                }
            }
            let have = idle.len() + spares_by_class[c];
            if have < floor as usize {
                plan.power_on.extend(view.off_in_class(c).into_iter().take(floor as usize - have));
            }
        }
        plan.wake_at_s = wake;
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Workload, hardware_server};

    fn fleet() -> (Vec<SimServer>, Vec<HardwareClass>, Vec<usize>) {
        let servers: Vec<SimServer> = (0..6).map(|i| hardware_server(&format!("s{i}"), 32_000, 131_072, 0, "")).collect();
        let w = Workload { name: "t".into(), servers: servers.clone(), pools: vec![], daemonsets: vec![], pods: vec![], end_s: 0 };
        let (classes, class_of) = w.hardware_classes();
        (servers, classes, class_of)
    }

    #[test]
    fn break_even_is_the_cores_boot_energy_over_the_saving_of_being_off() {
        let (mut servers, classes, class_of) = fleet();
        let s = &mut servers[1].server;
        s.power = ironclaim_core::PowerProfile { idle_watts: 110.0, peak_watts: 300.0, boot_watts: 200.0, off_watts: 10.0 };
        s.durations = ironclaim_core::StageDurations { power_on_s: 30, boot_s: 240, join_s: 30, ready_s: 0, tail_percent: 150 };
        // 200 W over power-on and boot (270 s) = 54 kJ; staying on costs
        // 100 W more than off: 540 s.
        assert_eq!(break_even_s(&servers[1].server), 540);
        let mut status = vec![ServerStatus::Off; servers.len()];
        status[1] = ServerStatus::Ready { idle_since: Some(0) };
        let cycles = vec![0; servers.len()];
        let view = |now_s| FleetView {
            now_s,
            servers: &servers,
            classes: &classes,
            class_of: &class_of,
            status: &status,
            power_on_cycles: &cycles,
            powered: &[1],
        };
        let mut p = Ironclaim::new(&PolicySettings::default());
        assert!(p.decide(&view(539)).power_off.is_empty());
        assert_eq!(p.decide(&view(540)).power_off, vec![1]);
    }

    #[test]
    fn the_floor_follows_urgent_fresh_demand_and_ignores_patient_pods() {
        let (servers, classes, class_of) = fleet();
        let cold = servers[0].server.durations.cold_s();
        let status = vec![ServerStatus::Off; servers.len()];
        let cycles = vec![0; servers.len()];
        let view = |now_s| FleetView {
            now_s,
            servers: &servers,
            classes: &classes,
            class_of: &class_of,
            status: &status,
            power_on_cycles: &cycles,
            powered: &[],
        };
        let mut p = Ironclaim::new(&PolicySettings::default());
        assert!(p.decide(&view(0)).floors.is_empty(), "no demand, no floor");
        // Patient pods (deadline longer than a cold boot) never raise it.
        for t in 0..20 {
            p.observe(FirstPod { at_s: t * 60, class: 0, deadline_s: Some(cold + 60) });
        }
        assert!(p.decide(&view(1200)).floors.is_empty());
        // 20 urgent fresh servers in the first hour: m = 20 * cold / 3600.
        for t in 0..20 {
            p.observe(FirstPod { at_s: 1200 + t * 60, class: 0, deadline_s: Some(60) });
        }
        let plan = p.decide(&view(2400));
        let m = 20.0 * cold as f64 / 3600.0;
        let want = (m + m.sqrt()).ceil() as u32;
        assert_eq!(plan.floors, vec![Floor { class: Some(0), count: want }]);
        assert_eq!(plan.power_on.len(), want as usize, "missing spares are powered on");
        // Once the window has passed, the floor drops back to zero.
        let later = p.decide(&view(2400 + 5 * 3600));
        assert!(later.floors.is_empty());
    }

    #[test]
    fn idle_servers_above_the_floor_go_off_at_break_even_and_not_before() {
        let (servers, classes, class_of) = fleet();
        let be = break_even_s(&servers[0].server);
        let mut status = vec![ServerStatus::Off; servers.len()];
        status[1] = ServerStatus::Ready { idle_since: Some(1000) };
        let cycles = vec![0; servers.len()];
        let powered = [1];
        let view = |now_s| FleetView {
            now_s,
            servers: &servers,
            classes: &classes,
            class_of: &class_of,
            status: &status,
            power_on_cycles: &cycles,
            powered: &powered,
        };
        let mut p = Ironclaim::new(&PolicySettings::default());
        let early = p.decide(&view(1000 + be - 1));
        assert!(early.power_off.is_empty());
        assert_eq!(early.wake_at_s, Some(1000 + be));
        assert_eq!(p.decide(&view(1000 + be)).power_off, vec![1]);
    }
}
