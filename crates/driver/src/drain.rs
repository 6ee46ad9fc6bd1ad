//! One drain, from cordon to power-off: the node is cordoned, its
//! workload pods evicted (the API's answers pace the retries), DaemonSet
//! pods evicted last, then the server powered off and released.
//!
//! # Guarantees
//! - Cordon comes before the first eviction, so nothing new lands.
//! - A pod that must not be disrupted, or that no controller would
//!   recreate (unless the plan named it), abandons the drain.
//! - Past the timeout, with workload left, the drain is abandoned and the
//!   node uncordoned, stamped for a cool-down.
//! - The power-off is asked for only once the node holds no workload pod,
//!   and the runner checks that again, fresh, before it acts. A power-off
//!   that fails or is refused keeps the node cordoned: it is retried with
//!   a doubling wait, the reason said on the server; never uncordoned
//!   while the BMC may still be shutting the machine down.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ironclaim_core::model::Pod;

use crate::{Effect, Eviction, PowerFailure};

/// The knobs of drains.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainSettings {
    /// First wait between eviction rounds; doubled while a budget says no.
    pub retry_initial: Duration,
    pub retry_max: Duration,
    /// The drain timeout where the ServerPool sets none.
    pub default_timeout: Duration,
}

impl Default for DrainSettings {
    fn default() -> Self {
        DrainSettings { retry_initial: Duration::from_secs(1), retry_max: Duration::from_secs(30), default_timeout: Duration::from_secs(600) }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Cordon,
    Evicting,
    PoweringOff { running: bool },
}

/// How a drain ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ended {
    /// Powered off (or, without a power-off, left cordoned) and released.
    Done {
        evicted: usize,
    },
    Abandoned {
        why: String,
    },
}

/// A drain under way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drain {
    pub node: String,
    pub server: Option<String>,
    /// Why, as metrics and notes say it (`empty`, `underutilized`, ...).
    pub reason: String,
    /// Pods the plan named: evicted even without a controller.
    pub planned: BTreeSet<String>,
    /// Power the server off once drained (false: maintenance, left on).
    pub power_off: bool,
    /// Once powered off, park the node rather than delete it.
    pub park: bool,
    pub started: Duration,
    pub deadline: Duration,
    phase: Phase,
    evicted: BTreeSet<String>,
    /// The DaemonSet pods asked to leave (those present once the workload
    /// was gone), and their answers: accepted (true) or refused (false).
    daemonset_asked: BTreeSet<String>,
    daemonset_answers: BTreeMap<String, bool>,
    wait: Duration,
    next_round: Duration,
    blocked: Option<String>,
    power_failures: u32,
    /// Power-offs refused by the fresh checks in a row, and the earliest
    /// the next may be asked: a refusal with nothing to evict (a volume
    /// still attached, say) is not asked again at once.
    refusals: u32,
    power_off_not_before: Duration,
}

fn workload(pods: &[Pod]) -> (Vec<&Pod>, Vec<&Pod>) {
    let mut w: Vec<&Pod> = pods.iter().filter(|p| p.occupies_node() && !p.is_daemonset_pod()).collect();
    w.sort_by(|a, b| a.priority.cmp(&b.priority).then(a.namespace.cmp(&b.namespace)).then(a.name.cmp(&b.name)));
    let mut d: Vec<&Pod> = pods.iter().filter(|p| p.occupies_node() && p.is_daemonset_pod()).collect();
    d.sort_by(|a, b| a.namespace.cmp(&b.namespace).then(a.name.cmp(&b.name)));
    (w, d)
}

/// `retry_initial` doubled `times`, at most `cap_factor` times `retry_max`.
fn doubling(settings: &DrainSettings, times: u32, cap_factor: u32) -> Duration {
    settings.retry_initial.saturating_mul(1 << times.min(12)).min(settings.retry_max.max(settings.retry_initial) * cap_factor)
}

impl Drain {
    pub fn new(
        node: &str,
        server: Option<&str>,
        reason: &str,
        planned: BTreeSet<String>,
        timeout: Duration,
        settings: &DrainSettings,
        now: Duration,
    ) -> Self {
        Drain {
            node: node.to_string(),
            server: server.map(str::to_string),
            reason: reason.to_string(),
            planned,
            power_off: true,
            park: false,
            started: now,
            deadline: now + timeout,
            phase: Phase::Cordon,
            evicted: BTreeSet::new(),
            daemonset_asked: BTreeSet::new(),
            daemonset_answers: BTreeMap::new(),
            wait: settings.retry_initial,
            next_round: now,
            blocked: None,
            power_failures: 0,
            refusals: 0,
            power_off_not_before: now,
        }
    }

    /// Leaves the server on once drained (maintenance): it is released,
    /// its node left cordoned for the operator.
    pub fn without_power_off(mut self) -> Self {
        self.power_off = false;
        self
    }

    /// Once powered off, keeps the node, parked ([`Effect::ParkNode`]),
    /// rather than deleting it.
    pub fn parking_node(mut self) -> Self {
        self.park = true;
        self
    }

    /// Whether the power-off is under way (its server must not be touched).
    pub fn powering_off(&self) -> bool {
        matches!(self.phase, Phase::PoweringOff { .. })
    }

    /// When the drain wants its next step.
    pub fn next_at(&self) -> Duration {
        self.next_round
    }

    /// An eviction answered.
    pub fn evicted(&mut self, pod: &str, answer: &Eviction, settings: &DrainSettings) {
        let daemonset = self.daemonset_asked.contains(pod);
        if daemonset {
            self.daemonset_answers.insert(pod.to_string(), matches!(answer, Eviction::Evicted | Eviction::Gone));
        }
        match answer {
            Eviction::Evicted | Eviction::Gone => {
                // The count is of workload pods.
                if !daemonset {
                    self.evicted.insert(pod.to_string());
                }
            }
            Eviction::Blocked(why) => {
                if self.blocked.is_none() {
                    self.blocked = Some(format!("eviction of {pod} refused: {why}"));
                    self.wait = (self.wait * 2).min(settings.retry_max);
                }
            }
            Eviction::Failed(_) => {}
        }
    }

    /// The power-off answered: `Ok` is confirmed off.
    pub fn powered_off(
        &mut self,
        result: &Result<(), PowerFailure>,
        refused: Option<&str>,
        settings: &DrainSettings,
        now: Duration,
    ) -> Option<String> {
        match (result, refused) {
            (Ok(()), None) => {
                self.phase = Phase::PoweringOff { running: false };
                None
            }
            (_, Some(why)) => {
                // Something landed or stayed on the node: back to evicting,
                // at once; the power-off is asked again after a wait that
                // doubles with each refusal in a row.
                self.refusals += 1;
                let wait = doubling(settings, self.refusals - 1, 1);
                self.power_off_not_before = now + wait;
                self.phase = Phase::Evicting;
                self.next_round = now;
                Some(format!("power-off refused: {why}; draining again, the power-off asked again in {}s", wait.as_secs().max(1)))
            }
            (Err(err), None) => {
                self.power_failures += 1;
                let wait = doubling(settings, self.power_failures, 4);
                self.phase = Phase::PoweringOff { running: false };
                self.next_round = now + wait;
                Some(format!(
                    "power-off failed ({} in a row): {}; node kept cordoned, retrying in {}s",
                    self.power_failures,
                    err.message,
                    wait.as_secs().max(1)
                ))
            }
        }
    }

    /// One step. `pods` are the pods on the node, as fresh as the runner
    /// has them; `holder` the claim the server's status names; `off`
    /// whether the last power-off was confirmed. Returns the effects and,
    /// once it ends, how.
    pub fn step(&mut self, pods: &[Pod], holder: Option<&str>, off: bool, now: Duration) -> (Vec<Effect>, Option<Ended>) {
        let mut out = Vec::new();
        match self.phase {
            Phase::Cordon => {
                out.push(Effect::Cordon { node: self.node.clone(), reason: self.reason.clone() });
                out.push(Effect::Note {
                    subject: self.node.clone(),
                    reason: "Draining",
                    message: format!("cordoned and draining ({})", self.reason),
                    warning: false,
                });
                self.phase = Phase::Evicting;
                return (out, None);
            }
            Phase::PoweringOff { running: true } => return (out, None),
            Phase::PoweringOff { running: false } if off => {
                let Some(server) = self.server.clone() else { return (out, Some(Ended::Done { evicted: self.evicted.len() })) };
                out.push(if self.park {
                    Effect::ParkNode { node: self.node.clone(), server: server.clone() }
                } else {
                    Effect::DeleteNode { node: self.node.clone() }
                });
                if let Some(claim) = holder {
                    out.push(Effect::Release {
                        server: server.clone(),
                        claim: claim.to_string(),
                        count_failure: false,
                        quarantine: false,
                        untouched: false,
                    });
                    out.push(Effect::DeleteClaim { claim: claim.to_string() });
                }
                let took = now.saturating_sub(self.started).as_secs();
                out.push(Effect::Note {
                    subject: self.node.clone(),
                    reason: "Drained",
                    message: format!(
                        "drained in {took}s: {} pod(s) evicted ({}); server {server} powered off and released{}",
                        self.evicted.len(),
                        self.reason,
                        if self.park { "; node kept, parked until the server boots again" } else { "" }
                    ),
                    warning: false,
                });
                return (out, Some(Ended::Done { evicted: self.evicted.len() }));
            }
            Phase::PoweringOff { running: false } => {
                if now < self.next_round {
                    return (out, None);
                }
                let Some(server) = self.server.clone() else { return (out, Some(Ended::Done { evicted: self.evicted.len() })) };
                self.phase = Phase::PoweringOff { running: true };
                out.push(Effect::PowerOff { server, claim: holder.map(str::to_string), node: Some(self.node.clone()) });
                return (out, None);
            }
            Phase::Evicting => {}
        }
        let (workload, daemonset) = workload(pods);
        let staying: Vec<&Pod> = workload.iter().copied().filter(|p| !p.terminating).collect();
        if let Some(p) = staying.iter().find(|p| p.protected_at(now.as_secs())) {
            return self.abandon(format!("pod {} must not be disrupted", p.key()));
        }
        if let Some(p) = staying.iter().find(|p| p.owner.is_none() && !self.planned.contains(&p.key())) {
            return self.abandon(format!("pod {} has no controller to recreate it", p.key()));
        }
        if workload.is_empty() {
            let present: Vec<&Pod> = daemonset.iter().copied().filter(|p| !p.terminating).collect();
            if self.daemonset_asked.is_empty() && !present.is_empty() {
                // Asked once: a DaemonSet that tolerates the cordon puts a
                // new pod back at once, and that one goes with the power.
                for p in &present {
                    self.daemonset_asked.insert(p.key());
                    out.push(Effect::Evict { node: self.node.clone(), pod: p.key() });
                }
                if self.power_off {
                    // The power-off waits for their answers.
                    self.next_round = now + self.wait;
                    return (out, None);
                }
            }
            if self.power_off {
                // A refusal (429: a PodDisruptionBudget over DaemonSet pods)
                // is honoured: the pod is asked again after the wait, and
                // the power waits until it is accepted or the drain times out.
                let asked: Vec<&Pod> = present.iter().copied().filter(|p| self.daemonset_asked.contains(&p.key())).collect();
                let unanswered = asked.iter().any(|p| !self.daemonset_answers.contains_key(&p.key()));
                let refused: Vec<&Pod> = asked.iter().copied().filter(|p| self.daemonset_answers.get(&p.key()) == Some(&false)).collect();
                if unanswered || !refused.is_empty() {
                    if now >= self.deadline {
                        let timeout = self.deadline.saturating_sub(self.started).as_secs();
                        let left: Vec<String> = asked.iter().map(|p| p.key()).collect();
                        return self.abandon(format!("drain timed out after {timeout}s; DaemonSet pod(s) not let go: {}", left.join(", ")));
                    }
                    if now < self.next_round {
                        return (out, None);
                    }
                    if let Some(why) = self.blocked.take() {
                        out.push(Effect::Note { subject: self.node.clone(), reason: "DrainWaiting", message: why, warning: false });
                    }
                    for p in refused {
                        self.daemonset_answers.remove(&p.key());
                        out.push(Effect::Evict { node: self.node.clone(), pod: p.key() });
                    }
                    self.next_round = now + self.wait;
                    return (out, None);
                }
            }
            if !self.power_off {
                if let (Some(server), Some(claim)) = (self.server.clone(), holder) {
                    out.push(Effect::Release { server, claim: claim.to_string(), count_failure: false, quarantine: false, untouched: false });
                    out.push(Effect::DeleteClaim { claim: claim.to_string() });
                }
                out.push(Effect::KeepCordoned { node: self.node.clone() });
                let took = now.saturating_sub(self.started).as_secs();
                out.push(Effect::Note {
                    subject: self.node.clone(),
                    reason: "Drained",
                    message: format!("drained in {took}s: {} pod(s) evicted ({}); left on and cordoned", self.evicted.len(), self.reason),
                    warning: false,
                });
                return (out, Some(Ended::Done { evicted: self.evicted.len() }));
            }
            self.phase = Phase::PoweringOff { running: false };
            self.next_round = self.power_off_not_before.max(now);
            let (more, ended) = self.step(pods, holder, false, now);
            out.extend(more);
            return (out, ended);
        }
        if now >= self.deadline {
            let left: Vec<String> = workload.iter().map(|p| p.key()).collect();
            let timeout = self.deadline.saturating_sub(self.started).as_secs();
            return self.abandon(format!("drain timed out after {timeout}s; {} pod(s) left: {}", left.len(), left.join(", ")));
        }
        if now < self.next_round {
            return (out, None);
        }
        if let Some(why) = self.blocked.take() {
            out.push(Effect::Note { subject: self.node.clone(), reason: "DrainWaiting", message: why, warning: false });
        }
        for p in &staying {
            out.push(Effect::Evict { node: self.node.clone(), pod: p.key() });
        }
        self.next_round = now + self.wait;
        (out, None)
    }

    fn abandon(&mut self, why: String) -> (Vec<Effect>, Option<Ended>) {
        let out = vec![
            Effect::Uncordon { node: self.node.clone(), abandoned: true },
            Effect::Note { subject: self.node.clone(), reason: "DrainAbandoned", message: why.clone(), warning: true },
        ];
        (out, Some(Ended::Abandoned { why }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_core::Resources;
    use ironclaim_core::model::Owner;

    fn pod(name: &str, owner: Option<&str>) -> Pod {
        let mut p = Pod::new("ns", name, Resources::new(100, 1 << 20)).bound_to("n");
        p.owner = owner.map(|k| Owner { kind: k.into(), name: "o".into() });
        p
    }

    fn names(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::Cordon { .. } => "cordon".to_string(),
                Effect::Uncordon { abandoned, .. } => format!("uncordon (abandoned {abandoned})"),
                Effect::KeepCordoned { .. } => "keep cordoned".into(),
                Effect::Evict { pod, .. } => format!("evict {pod}"),
                Effect::PowerOff { node, .. } => format!("power off (node {})", node.clone().unwrap_or_default()),
                Effect::DeleteNode { .. } => "delete node".into(),
                Effect::ParkNode { .. } => "park node".into(),
                Effect::Release { .. } => "release".into(),
                Effect::DeleteClaim { .. } => "delete claim".into(),
                Effect::Note { reason, .. } => format!("note {reason}"),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn drain() -> Drain {
        Drain::new("n", Some("srv"), "underutilized", BTreeSet::new(), s(60), &DrainSettings::default(), s(0))
    }

    #[test]
    fn a_drain_cordons_evicts_workload_then_daemonsets_then_powers_off_and_releases() {
        let settings = DrainSettings::default();
        let mut d = drain();
        let pods = vec![pod("web", Some("ReplicaSet")), pod("agent", Some("DaemonSet"))];
        let (e, end) = d.step(&pods, Some("c"), false, s(0));
        assert_eq!((names(&e), end), (vec!["cordon".into(), "note Draining".into()], None));
        let (e, _) = d.step(&pods, Some("c"), false, s(0));
        assert_eq!(names(&e), ["evict ns/web"]);
        d.evicted("ns/web", &Eviction::Evicted, &settings);
        let (e, _) = d.step(&pods[1..], Some("c"), false, s(1));
        assert_eq!(names(&e), ["evict ns/agent"], "the power-off waits for the DaemonSet pod's answer");
        d.evicted("ns/agent", &Eviction::Evicted, &settings);
        let (e, _) = d.step(&pods[1..], Some("c"), false, s(2));
        assert_eq!(names(&e), ["power off (node n)"]);
        assert!(d.step(&pods[1..], Some("c"), false, s(2)).0.is_empty(), "one power-off at a time");
        d.powered_off(&Ok(()), None, &settings, s(3));
        let (e, end) = d.step(&[], Some("c"), true, s(3));
        assert_eq!(names(&e), ["delete node", "release", "delete claim", "note Drained"]);
        assert_eq!(end, Some(Ended::Done { evicted: 1 }));
    }

    #[test]
    fn a_budget_that_says_no_doubles_the_wait_and_the_timeout_abandons_and_uncordons() {
        let settings = DrainSettings::default();
        let mut d = drain();
        let pods = vec![pod("web", Some("ReplicaSet"))];
        d.step(&pods, None, false, s(0));
        let mut asked = Vec::new();
        for t in 0..70 {
            let (e, end) = d.step(&pods, None, false, s(t));
            if e.iter().any(|e| matches!(e, Effect::Evict { .. })) {
                asked.push(t);
                d.evicted("ns/web", &Eviction::Blocked("PDB web allows 0".into()), &settings);
            }
            if let Some(Ended::Abandoned { why }) = end {
                assert_eq!(t, 60);
                assert!(why.contains("timed out after 60s; 1 pod(s) left: ns/web"), "{why}");
                assert_eq!(names(&e), ["uncordon (abandoned true)", "note DrainAbandoned"]);
                assert_eq!(asked, [0, 1, 3, 7, 15, 31]);
                return;
            }
        }
        panic!("never abandoned");
    }

    #[test]
    fn a_do_not_disrupt_pod_or_an_unowned_one_abandons_and_a_planned_unowned_one_is_evicted() {
        let mut d = drain();
        let mut keep = pod("keep", Some("ReplicaSet"));
        keep.do_not_disrupt = true;
        d.step(&[], None, false, s(0));
        let (_, end) = d.step(&[keep], None, false, s(0));
        assert!(matches!(end, Some(Ended::Abandoned { why }) if why.contains("must not be disrupted")));
        let mut d = drain();
        d.step(&[], None, false, s(0));
        let (_, end) = d.step(&[pod("bare", None)], None, false, s(0));
        assert!(matches!(end, Some(Ended::Abandoned { why }) if why.contains("no controller")));
        let mut d = Drain::new("n", Some("srv"), "underutilized", BTreeSet::from(["ns/bare".to_string()]), s(60), &DrainSettings::default(), s(0));
        d.step(&[], None, false, s(0));
        assert_eq!(names(&d.step(&[pod("bare", None)], None, false, s(0)).0), ["evict ns/bare"]);
    }

    #[test]
    fn a_failed_power_off_keeps_the_node_cordoned_and_retries_with_a_doubling_wait() {
        let settings = DrainSettings::default();
        let mut d = drain();
        d.step(&[], Some("c"), false, s(0));
        let (e, _) = d.step(&[], Some("c"), false, s(0));
        assert_eq!(names(&e), ["power off (node n)"]);
        let failure = PowerFailure { reason: crate::FailureReason::BmcUnreachable, message: "timed out".into() };
        let note = d.powered_off(&Err(failure.clone()), None, &settings, s(1)).unwrap();
        assert!(note.contains("node kept cordoned"), "{note}");
        // Never an uncordon; the next power-off waits 2 s, then 4 s.
        assert!(d.step(&[], Some("c"), false, s(2)).0.is_empty());
        assert_eq!(names(&d.step(&[], Some("c"), false, s(3)).0), ["power off (node n)"]);
        d.powered_off(&Err(failure), None, &settings, s(3));
        assert!(d.step(&[], Some("c"), false, s(6)).0.is_empty());
        assert_eq!(names(&d.step(&[], Some("c"), false, s(7)).0), ["power off (node n)"]);
        // Refused because a pod landed: back to evicting it.
        d.powered_off(&Ok(()), Some("pod ns/late runs on it"), &settings, s(8));
        assert_eq!(names(&d.step(&[pod("late", Some("ReplicaSet"))], Some("c"), false, s(8)).0), ["evict ns/late"]);
    }

    #[test]
    fn a_daemonset_pod_a_budget_keeps_holds_the_power_off_until_its_eviction_is_accepted() {
        let settings = DrainSettings::default();
        let mut d = drain();
        let agent = [pod("agent", Some("DaemonSet"))];
        d.step(&agent, Some("c"), false, s(0));
        assert_eq!(names(&d.step(&agent, Some("c"), false, s(0)).0), ["evict ns/agent"]);
        d.evicted("ns/agent", &Eviction::Blocked("Cannot evict pod as it would violate the pod's disruption budget.".into()), &settings);
        // Refused: no power-off; asked again once the wait ran out.
        assert_eq!(names(&d.step(&agent, Some("c"), false, s(1)).0), ["note DrainWaiting", "evict ns/agent"]);
        assert!(d.step(&agent, Some("c"), false, s(2)).0.is_empty(), "no answer yet: no power-off");
        d.evicted("ns/agent", &Eviction::Evicted, &settings);
        assert_eq!(names(&d.step(&agent, Some("c"), false, s(3)).0), ["power off (node n)"]);
        // Refused until the timeout: abandoned, never powered off.
        let mut e = drain();
        e.step(&agent, Some("c"), false, s(0));
        e.step(&agent, Some("c"), false, s(0));
        let mut powered = false;
        let mut ended = None;
        for t in 1..=61 {
            e.evicted("ns/agent", &Eviction::Blocked("budget".into()), &settings);
            let (out, end) = e.step(&agent, Some("c"), false, s(t));
            powered |= out.iter().any(|x| matches!(x, Effect::PowerOff { .. }));
            if end.is_some() {
                ended = end;
                break;
            }
        }
        assert!(!powered);
        assert!(matches!(ended, Some(Ended::Abandoned { .. })), "{ended:?}");
    }

    #[test]
    fn a_refused_power_off_with_nothing_to_evict_is_asked_again_after_a_doubling_wait_not_at_once() {
        let settings = DrainSettings::default();
        let mut d = drain();
        d.step(&[], Some("c"), false, s(0));
        assert_eq!(names(&d.step(&[], Some("c"), false, s(0)).0), ["power off (node n)"]);
        // A volume is still attached: nothing to evict, nothing to do for 1 s.
        let note = d.powered_off(&Ok(()), Some("node n still has volume pv-1 attached"), &settings, s(1)).unwrap();
        assert!(note.contains("asked again in 1s"), "{note}");
        assert!(d.step(&[], Some("c"), false, s(1)).0.is_empty(), "asked again at once");
        assert_eq!(d.next_at(), s(2));
        assert_eq!(names(&d.step(&[], Some("c"), false, s(2)).0), ["power off (node n)"]);
        d.powered_off(&Ok(()), Some("node n still has volume pv-1 attached"), &settings, s(2));
        assert!(d.step(&[], Some("c"), false, s(3)).0.is_empty());
        assert_eq!(names(&d.step(&[], Some("c"), false, s(4)).0), ["power off (node n)"], "2 s the second time");
    }
}
