//! When a drain the core proposes may start: a busy node's drain only once
//! a later pass proposes it again, and no drain of a node whose last drain
//! was abandoned until its cool-down has passed.
//!
//! # Guarantees
//! - A drain that evicts workload (any reason but `Empty`) starts only on
//!   a pass at least `settle` after the first pass that proposed it, with
//!   every pass in between proposing it too; a pass that does not forgets
//!   it. Empty-node drains and spare power actions pass at once.
//! - A node whose drain was abandoned less than `cool_down` ago is held
//!   before the core decides: its workload pods count as must-not-disrupt
//!   in the core's copy of the cluster, so it costs no budget, PDB
//!   allowance or headroom in the plan; a drain of it the core still plans
//!   (an empty node) is dropped. Either way it is reported held.
//! - The abandonment is recorded on the Node (the controller's
//!   `ironclaim.dev/drain-abandoned-at` annotation), so the cool-down
//!   survives a restart and a change of leader.

use std::collections::{BTreeMap, HashMap};

use ironclaim_core::disruption::{Action, Held};
use ironclaim_core::model::{DisruptionReason, Seconds, Snapshot};

/// Underutilized drains waiting for a second proposal.
#[derive(Debug, Default)]
pub struct Settling {
    first: HashMap<String, Seconds>,
}

/// A drain proposed and not started yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub node: String,
    /// Since when it has been proposed on every pass.
    pub since: Seconds,
    /// Seconds until a pass may start it.
    pub left_s: Seconds,
}

fn settles(action: &Action) -> Option<&str> {
    match action {
        Action::Drain { node, reason, .. } if *reason != DisruptionReason::Empty => Some(node),
        _ => None,
    }
}

impl Settling {
    pub fn forget(&mut self) {
        self.first.clear();
    }

    /// Splits one pass's actions into those to start now and drains still
    /// waiting to be proposed again `settle_s` after their first proposal.
    /// A drain let through is forgotten: it must be proposed anew (and
    /// wait again) if it never started.
    pub fn settle(&mut self, actions: Vec<Action>, now: Seconds, settle_s: Seconds) -> (Vec<Action>, Vec<Waiting>) {
        let proposed: Vec<String> = actions.iter().filter_map(settles).map(str::to_string).collect();
        self.first.retain(|node, _| proposed.contains(node));
        let (mut go, mut waiting) = (Vec::new(), Vec::new());
        for action in actions {
            let Some(node) = settles(&action).map(str::to_string) else {
                go.push(action);
                continue;
            };
            let since = *self.first.entry(node.clone()).or_insert(now);
            let ready_at = since.saturating_add(settle_s);
            if now >= ready_at {
                self.first.remove(&node);
                go.push(action);
            } else {
                waiting.push(Waiting { node, since, left_s: ready_at.saturating_sub(now) });
            }
        }
        (go, waiting)
    }
}

/// Nodes still cooling down after an abandoned drain, with the second
/// their cool-down ends, from `(node, abandoned at)` pairs.
pub fn cooling<'a>(abandoned: impl IntoIterator<Item = (&'a str, Seconds)>, now: Seconds, cool_down_s: Seconds) -> BTreeMap<String, Seconds> {
    abandoned
        .into_iter()
        .filter_map(|(node, at)| {
            let until = at.saturating_add(cool_down_s);
            (now < until).then(|| (node.to_string(), until))
        })
        .collect()
}

fn cooling_note(until: Seconds, now: Seconds) -> String {
    format!("its last drain was abandoned; not drained again for {}s (cool-down)", until.saturating_sub(now))
}

/// Marks the workload pods of cooling nodes must-not-disrupt in the core's
/// copy of the cluster, so the core holds those nodes without spending
/// budget on them.
pub fn hold_cooling(snapshot: &mut Snapshot, cooling: &BTreeMap<String, Seconds>) {
    if cooling.is_empty() {
        return;
    }
    for p in snapshot.pods.iter_mut_where(|p| p.node_name.as_deref().is_some_and(|n| cooling.contains_key(n)) && !p.is_daemonset_pod()) {
        p.do_not_disrupt = true;
    }
}

/// Drops drains of cooling nodes the core still planned, and says why
/// each cooling node is held (replacing the core's must-not-disrupt note).
pub fn drop_cooling(actions: &mut Vec<Action>, held: &mut Vec<Held>, cooling: &BTreeMap<String, Seconds>, now: Seconds) {
    if cooling.is_empty() {
        return;
    }
    let mut dropped = Vec::new();
    actions.retain(|a| match a {
        Action::Drain { node, .. } if cooling.contains_key(node) => {
            dropped.push(node.clone());
            false
        }
        _ => true,
    });
    for h in held.iter_mut() {
        if let Some(&until) = cooling.get(&h.subject) {
            h.why = cooling_note(until, now);
        }
    }
    for node in dropped {
        if !held.iter().any(|h| h.subject == node) {
            let why = cooling_note(cooling[&node], now);
            held.push(Held { subject: node, why });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_core::model::{Node, Pod};
    use ironclaim_core::resources::Resources;

    fn drain(node: &str, reason: DisruptionReason) -> Action {
        Action::Drain {
            node: node.into(),
            server: Some(node.into()),
            pool: "p".into(),
            reason,
            evict: if reason == DisruptionReason::Empty { vec![] } else { vec![format!("ns/{node}-pod")] },
            daemonset_pods: vec![],
            saves_watts: 100.0,
        }
    }

    fn off(server: &str) -> Action {
        Action::PowerOff { server: server.into(), class: "c".into(), idle_s: 20, break_even_s: 10, saves_watts: 100.0 }
    }

    fn nodes(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .map(|a| match a {
                Action::Drain { node, .. } => node.clone(),
                Action::PowerOff { server, .. } => server.clone(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn an_underutilized_drain_starts_only_when_proposed_again_after_the_settle_time() {
        let mut s = Settling::default();
        let plan = || vec![drain("busy", DisruptionReason::Underutilized), drain("empty", DisruptionReason::Empty), off("spare")];
        // First proposal at t=100: empty nodes and spares go at once.
        let (go, waiting) = s.settle(plan(), 100, 15);
        assert_eq!(nodes(&go), ["empty", "spare"]);
        assert_eq!(waiting, [Waiting { node: "busy".into(), since: 100, left_s: 15 }]);
        // Passes every 2 s: still waiting at 114.
        for t in (102..=114).step_by(2) {
            let (go, waiting) = s.settle(vec![drain("busy", DisruptionReason::Underutilized)], t, 15);
            assert!(go.is_empty(), "started at {t}");
            assert_eq!(waiting[0].left_s, 115 - t);
        }
        // The pass at 116 proposes it again: it starts, once.
        let (go, waiting) = s.settle(vec![drain("busy", DisruptionReason::Underutilized)], 116, 15);
        assert_eq!((nodes(&go), waiting), (vec!["busy".to_string()], vec![]));
        // Proposed again later (it did not start, say): it waits anew.
        let (go, _) = s.settle(vec![drain("busy", DisruptionReason::Underutilized)], 118, 15);
        assert!(go.is_empty());
    }

    #[test]
    fn a_pass_that_does_not_propose_it_resets_the_wait() {
        let mut s = Settling::default();
        s.settle(vec![drain("busy", DisruptionReason::Underutilized)], 100, 15);
        s.settle(vec![], 110, 15);
        let (go, waiting) = s.settle(vec![drain("busy", DisruptionReason::Underutilized)], 120, 15);
        assert!(go.is_empty());
        assert_eq!(waiting[0].since, 120);
        // A single pass never confirms itself, even with a long gap to the next.
        let (go, _) = s.settle(vec![drain("busy", DisruptionReason::Underutilized)], 200, 15);
        assert_eq!(nodes(&go), ["busy"]);
    }

    #[test]
    fn drifted_drains_wait_too_and_zero_settle_lets_everything_through() {
        let mut s = Settling::default();
        assert!(s.settle(vec![drain("old", DisruptionReason::Drifted)], 100, 15).0.is_empty());
        let mut s = Settling::default();
        assert_eq!(s.settle(vec![drain("busy", DisruptionReason::Underutilized)], 100, 0).0.len(), 1);
    }

    #[test]
    fn cooling_ends_after_the_cool_down() {
        let annotated = [("n1", 1000), ("old", 10)];
        assert_eq!(cooling(annotated, 1599, 600), BTreeMap::from([("n1".to_string(), 1600)]));
        assert!(cooling(annotated, 1600, 600).is_empty());
    }

    #[test]
    fn a_cooling_node_is_held_before_the_core_and_its_drain_dropped_after() {
        let mut snap = Snapshot::default();
        snap.nodes.push(Node::new("n1", Resources::new(8000, 16 << 30)));
        let mut web = Pod::new("ns", "web", Resources::new(100, 1 << 20));
        web.node_name = Some("n1".into());
        let mut elsewhere = Pod::new("ns", "api", Resources::new(100, 1 << 20));
        elsewhere.node_name = Some("n2".into());
        snap.pods = vec![web, elsewhere].into();
        let cool = BTreeMap::from([("n1".to_string(), 1600)]);
        hold_cooling(&mut snap, &cool);
        assert!(snap.pods[0].do_not_disrupt);
        assert!(!snap.pods[1].do_not_disrupt);

        let mut actions = vec![drain("n1", DisruptionReason::Empty), drain("n2", DisruptionReason::Underutilized)];
        let mut held = vec![Held { subject: "n3".into(), why: "kept".into() }];
        drop_cooling(&mut actions, &mut held, &cool, 1000);
        assert_eq!(nodes(&actions), ["n2"]);
        assert_eq!(held[1], Held { subject: "n1".into(), why: "its last drain was abandoned; not drained again for 600s (cool-down)".into() });
    }
}
