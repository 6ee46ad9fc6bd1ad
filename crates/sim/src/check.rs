//! Checkers that are not the code under test. They keep their own books
//! from what the rack reports (takes, claims, nodes, bindings, power-offs)
//! and flag any step that breaks a safety property:
//!
//! - no server is taken while another claim holds it or while it is a node;
//! - no server with running workload pods is powered off;
//! - no power-off of an idle server takes the idle powered-on servers of
//!   its class below a floor the policy declared;
//! - once faults stop, every pending pod that a free server could host is
//!   placed within a bound (liveness).
//!
//! PodDisruptionBudgets are not modelled: the rack evicts a workload pod
//! only when the workload gives its pods owners ([`crate::Workload::give_owners`]),
//! and then no budget covers it.

use crate::policy::Floor;
use ironclaim_core::Seconds;
use serde::Serialize;
use std::collections::BTreeSet;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Violation {
    pub at_s: Seconds,
    pub checker: &'static str,
    pub message: String,
}

#[derive(Debug, Default)]
pub struct Checker {
    class_of: Vec<usize>,
    /// Servers with a claim on their way to Ready.
    claimed: BTreeSet<usize>,
    /// Servers powered on and up: a warm spare or a node.
    up: BTreeSet<usize>,
    workload_pods: Vec<u32>,
    floors: Vec<Floor>,
    lease: Option<LeaseBooks>,
    dropped: u64,
    pub violations: Vec<Violation>,
}

/// With leader election, who last wrote the lease record and when each
/// replica last did, by the rack's clock.
#[derive(Debug, Default)]
struct LeaseBooks {
    duration_s: Seconds,
    holder: Option<usize>,
    written_s: Vec<Option<Seconds>>,
}

/// Violations beyond this many are counted, not kept.
const MAX_KEPT: usize = 100;

impl Checker {
    pub fn new(class_of: &[usize]) -> Self {
        Checker { class_of: class_of.to_vec(), workload_pods: vec![0; class_of.len()], ..Default::default() }
    }

    fn flag(&mut self, at_s: Seconds, checker: &'static str, message: String) {
        if self.violations.len() < MAX_KEPT {
            self.violations.push(Violation { at_s, checker, message });
        } else {
            self.dropped += 1;
        }
    }

    /// The replicas elect a leader through a lease of `duration_s`.
    pub fn elect(&mut self, replicas: usize, duration_s: Seconds) {
        self.lease = Some(LeaseBooks { duration_s, holder: None, written_s: vec![None; replicas] });
    }

    /// Replica `r` wrote the lease record, as its holder.
    pub fn lease_written(&mut self, at_s: Seconds, r: usize) {
        if let Some(b) = self.lease.as_mut() {
            b.holder = Some(r);
            b.written_s[r] = Some(at_s);
        }
    }

    /// Replica `r` sent a power action to a BMC. With leader election it
    /// must be the record's holder, by a write less than the lease's
    /// duration old: no other replica can have taken over since.
    pub fn power_action(&mut self, at_s: Seconds, r: usize, action: &str, server: &str) {
        let Some(b) = &self.lease else { return };
        let fresh = b.written_s[r].is_some_and(|w| at_s < w + b.duration_s);
        if b.holder != Some(r) || !fresh {
            let holder = b.holder.map_or("nobody".to_string(), |h| format!("replica-{h}"));
            let message = format!(
                "replica-{r} sent a {action} of server {server} while the lease is {holder}'s (its own last renewal at {:?})",
                b.written_s[r]
            );
            self.flag(at_s, "acted-without-lease", message);
        }
    }

    /// The autoscaler asked to take the server; `held` when, by the rack's
    /// records, another claim holds it or it is a node.
    pub fn take_asked(&mut self, at_s: Seconds, server: usize, name: &str, held: bool) {
        if held || self.claimed.contains(&server) {
            self.flag(at_s, "claimed-twice", format!("server {name} asked for while another claim holds it or it is a node"));
        }
    }

    pub fn claim_opened(&mut self, server: usize) {
        self.claimed.insert(server);
    }

    /// The claim reached Ready, or was released.
    pub fn claim_closed(&mut self, server: usize) {
        self.claimed.remove(&server);
    }

    /// Being powered on, with no node yet (a warm spare, or a claim's
    /// server): warm capacity from the moment its power-on is sent.
    pub fn powered_idle(&mut self, server: usize) {
        self.up.insert(server);
    }

    /// The power-on failed: the server stayed off.
    pub fn powered_down(&mut self, server: usize) {
        self.up.remove(&server);
    }

    /// The server's node was lost (NotReady or deleted): it is up, but no
    /// warm capacity.
    pub fn node_lost(&mut self, server: usize) {
        self.up.remove(&server);
    }

    pub fn node_ready(&mut self, server: usize) {
        self.up.insert(server);
    }

    pub fn bound(&mut self, server: usize) {
        self.workload_pods[server] += 1;
    }

    pub fn unbound(&mut self, server: usize) {
        self.workload_pods[server] = self.workload_pods[server].saturating_sub(1);
    }

    pub fn declare_floors(&mut self, floors: &[Floor]) {
        self.floors = floors.to_vec();
    }

    /// Up, unclaimed and with no workload pod: by the rack's counts, or
    /// by `shown` (workload pods per server as the autoscaler saw them).
    fn idle(&self, server: usize, shown: Option<&[u32]>) -> bool {
        let pods = shown.map_or(self.workload_pods[server], |c| c[server]);
        self.up.contains(&server) && pods == 0 && !self.claimed.contains(&server)
    }

    fn idle_up(&self, class: Option<usize>, shown: Option<&[u32]>) -> usize {
        self.up.iter().filter(|&&s| self.idle(s, shown) && class.is_none_or(|c| self.class_of[s] == c)).count()
    }

    /// The server is being powered off. A workload pod on it is a
    /// violation, always by the rack's counts; the warm floors are judged
    /// by `shown` when given (a lagging watch: the floor is kept by what
    /// the autoscaler could see).
    pub fn powering_off(&mut self, at_s: Seconds, server: usize, name: &str, shown: Option<&[u32]>) {
        if self.workload_pods[server] > 0 {
            let n = self.workload_pods[server];
            self.flag(
                at_s,
                "powered-off-busy",
                format!("server {name} powered off with {}", crate::report::count(u64::from(n), "running pod", "running pods")),
            );
        }
        let was_idle = self.idle(server, shown);
        self.up.remove(&server);
        if !was_idle {
            return;
        }
        for f in self.floors.clone() {
            if f.class.is_some_and(|c| c != self.class_of[server]) {
                continue;
            }
            let left = self.idle_up(f.class, shown);
            if left < f.count as usize {
                self.flag(
                    at_s,
                    "warm-spare-floor",
                    format!(
                        "powering off {name} leaves {}, below the floor of {}",
                        crate::report::count(left as u64, "idle server", "idle servers"),
                        f.count
                    ),
                );
            }
        }
    }

    pub fn pending_too_long(&mut self, at_s: Seconds, pod: &str, waited_s: Seconds, bound_s: Seconds, host: &str) {
        self.flag(at_s, "liveness", format!("pod {pod} pending {waited_s}s after faults stopped (bound {bound_s}s) while {host} could host it"));
    }

    /// The run ended: violations past the kept ones are said, not lost.
    pub fn end(&mut self, at_s: Seconds) {
        if self.dropped > 0 {
            let n = self.dropped;
            self.violations.push(Violation {
                at_s,
                checker: "more",
                message: format!("{} not listed", crate::report::count(n, "more violation", "more violations")),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_take_of_a_held_server_is_flagged() {
        let mut c = Checker::new(&[0, 0]);
        c.take_asked(5, 1, "s1", false);
        c.claim_opened(1);
        assert!(c.violations.is_empty());
        c.take_asked(6, 1, "s1", false);
        c.take_asked(6, 0, "s0", true);
        assert_eq!(c.violations.len(), 2);
        assert!(c.violations.iter().all(|v| v.checker == "claimed-twice"));
    }

    #[test]
    fn powering_off_a_busy_server_is_flagged() {
        let mut c = Checker::new(&[0]);
        c.node_ready(0);
        c.bound(0);
        c.powering_off(9, 0, "s0", None);
        assert_eq!(c.violations[0].checker, "powered-off-busy");
    }

    #[test]
    fn powering_off_below_the_floor_is_flagged_and_above_it_is_not() {
        let mut c = Checker::new(&[0, 0, 1]);
        for s in 0..3 {
            c.node_ready(s);
        }
        c.declare_floors(&[Floor { class: Some(0), count: 1 }]);
        c.powering_off(1, 2, "other-class", None);
        c.powering_off(1, 0, "s0", None);
        assert!(c.violations.is_empty());
        c.powering_off(2, 1, "s1", None);
        assert_eq!(c.violations.len(), 1);
        assert_eq!(c.violations[0].checker, "warm-spare-floor");
    }
}
