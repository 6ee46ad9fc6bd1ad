//! Checkers that are not the code under test. They keep their own books
//! from the events the engine reports (claims, bindings, nodes, power-offs)
//! and flag any step that breaks a safety property:
//!
//! - no server is claimed twice, or claimed while it is a node;
//! - no server with running non-DaemonSet pods is powered off;
//! - no power-off takes the idle servers below a floor the policy declared;
//! - once faults stop, every pending pod that a free server could host is
//!   placed within a bound (liveness).
//!
//! The simulator never evicts a running pod (it powers off only empty
//! servers and does not consolidate), so PodDisruptionBudgets cannot be
//! crossed and are not modelled.

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
    claimed: BTreeSet<usize>,
    nodes: BTreeSet<usize>,
    workload_pods: Vec<u32>,
    floors: Vec<Floor>,
    pub violations: Vec<Violation>,
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
        }
    }

    pub fn claim_opened(&mut self, at_s: Seconds, server: usize, name: &str) {
        if !self.claimed.insert(server) {
            self.flag(at_s, "claimed-twice", format!("server {name} claimed while another claim holds it"));
        }
        if self.nodes.contains(&server) {
            self.flag(at_s, "claimed-twice", format!("server {name} claimed while it is a node"));
        }
    }

    pub fn claim_closed(&mut self, server: usize) {
        self.claimed.remove(&server);
    }

    pub fn node_ready(&mut self, server: usize) {
        self.nodes.insert(server);
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

    fn idle_nodes(&self, class: Option<usize>) -> usize {
        self.nodes.iter().filter(|&&s| self.workload_pods[s] == 0 && class.is_none_or(|c| self.class_of[s] == c)).count()
    }

    pub fn powering_off(&mut self, at_s: Seconds, server: usize, name: &str) {
        if self.workload_pods[server] > 0 {
            let n = self.workload_pods[server];
            self.flag(at_s, "powered-off-busy", format!("server {name} powered off with {n} running pods"));
        }
        let was_node = self.nodes.remove(&server);
        if !was_node {
            return;
        }
        let floors = self.floors.clone();
        for f in floors {
            if f.class.is_some_and(|c| c != self.class_of[server]) {
                continue;
            }
            let left = self.idle_nodes(f.class);
            if left < f.count as usize {
                self.flag(at_s, "warm-spare-floor", format!("powering off {name} leaves {left} idle servers, below the floor of {}", f.count));
            }
        }
    }

    pub fn pending_too_long(&mut self, at_s: Seconds, pod: &str, waited_s: Seconds, bound_s: Seconds, host: &str) {
        self.flag(at_s, "liveness", format!("pod {pod} pending {waited_s}s after faults stopped (bound {bound_s}s) while {host} could host it"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_on_one_server_is_flagged() {
        let mut c = Checker::new(&[0, 0]);
        c.claim_opened(5, 1, "s1");
        c.claim_opened(6, 1, "s1");
        assert_eq!(c.violations.len(), 1);
        assert_eq!(c.violations[0].checker, "claimed-twice");
    }

    #[test]
    fn powering_off_a_busy_server_is_flagged() {
        let mut c = Checker::new(&[0]);
        c.node_ready(0);
        c.bound(0);
        c.powering_off(9, 0, "s0");
        assert_eq!(c.violations[0].checker, "powered-off-busy");
    }

    #[test]
    fn powering_off_below_the_floor_is_flagged_and_above_it_is_not() {
        let mut c = Checker::new(&[0, 0, 1]);
        for s in 0..3 {
            c.node_ready(s);
        }
        c.declare_floors(&[Floor { class: Some(0), count: 1 }]);
        c.powering_off(1, 2, "other-class");
        c.powering_off(1, 0, "s0");
        assert!(c.violations.is_empty());
        c.powering_off(2, 1, "s1");
        assert_eq!(c.violations.len(), 1);
        assert_eq!(c.violations[0].checker, "warm-spare-floor");
    }
}
