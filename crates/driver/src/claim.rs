//! One claim's walk: server taken, powered on, booting, a node joined, the
//! node Ready and its gates passed, its pods bound; or a failure, after
//! which the server is powered off (unless it became a node) and released,
//! the failure counted against it.
//!
//! [`step`] is one reconcile of one claim: it looks at where the claim
//! stands ([`ClaimView`], what the API holds) and at what this process
//! has under way for it ([`ClaimIo`]), and returns what to do. It does not
//! care why it was called.
//!
//! # Guarantees
//! - A power-on is sent only after the server was taken by this claim's
//!   own take ([`crate::Report::Taken`] with `newly`), or, for a claim
//!   found at `PoweringOn` (a restart), after the BMC read Off and the
//!   power-on budget passed; never while a power action is under way.
//! - A failed power attempt is retried after [`Retry::delay`]; after
//!   [`Retry::attempts`] the claim fails with the last reason. A fault of
//!   configuration ([`FailureReason::is_configuration`]: a missing
//!   credentials Secret, an unusable address) fails the claim at once: it
//!   will not pass by itself.
//! - A stage past its budget ([`Deadlines`]) fails the claim as timed out.
//! - A failed claim's server is powered off (unless it is a node, the
//!   claim lost its server to another claim, or a fault of configuration
//!   stopped it before any power-on was sent) and confirmed off before it
//!   is released; a release counts a failure except after a conflict or a
//!   fault of configuration.

use std::time::Duration;

use ironclaim_core::model::{Seconds, StageDurations};
use serde::{Deserialize, Serialize};

use crate::backoff::{Retry, quarantines};
use crate::deadline::Deadlines;
use crate::{Effect, FailureReason, PowerFailure, Stage};

/// A claim as the API holds it (a ServerClaim and its server's claim).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    pub name: String,
    pub server: String,
    pub pool: String,
    /// The pods (`namespace/name`) it was opened for.
    pub pods: Vec<String>,
    pub stage: Stage,
    pub stage_started_s: Seconds,
    pub failure: Option<FailureReason>,
    pub node: Option<String>,
    pub created_s: Seconds,
    /// Each stage entered so far, with when: the timeline a start's
    /// measurements are taken from.
    pub history: Vec<(Stage, Seconds)>,
}

impl ClaimRecord {
    /// When the claim entered `stage`, if it did.
    pub fn entered_s(&self, stage: Stage) -> Option<Seconds> {
        self.history.iter().rev().find(|(s, _)| *s == stage).map(|(_, at)| *at)
    }
}

/// The claim's server, as the API holds it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFacts {
    /// The claim its status names.
    pub holder: Option<String>,
    pub durations: StageDurations,
    /// Failed claims in a row so far.
    pub failures: u32,
    /// A power-on may have been sent since it was last read off: its
    /// record says ironclaim powered it on (written before every power-on).
    pub power_on_sent: bool,
}

/// The node linked to the claim's server.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub name: String,
    pub ready: bool,
    /// Since when Ready has been True; None when not Ready.
    pub ready_since_s: Option<Seconds>,
    /// On a Ready node, the NoSchedule taint the node lifecycle controller
    /// has not lifted yet (`node.kubernetes.io/not-ready` or
    /// `unreachable`): kube-scheduler places no pod there until it does.
    pub lifecycle_taint: Option<String>,
    /// The pool's readiness gates not met yet.
    pub unmet: Vec<String>,
}

impl NodeFacts {
    /// Ready, untainted and past every gate of its pool.
    pub fn passed(&self) -> bool {
        self.ready && self.lifecycle_taint.is_none() && self.unmet.is_empty()
    }

    /// What the node still waits for, in the order it is checked: Ready,
    /// the lifecycle taint, then the pool's gates.
    pub fn waiting_for(&self) -> Vec<String> {
        let mut waiting = Vec::with_capacity(self.unmet.len() + 1);
        if !self.ready {
            waiting.push("node Ready".to_string());
        } else if let Some(taint) = &self.lifecycle_taint {
            waiting.push(format!("node Ready (its {taint} taint is not lifted yet)"));
        }
        waiting.extend(self.unmet.iter().cloned());
        waiting
    }
}

/// Everything one claim's step reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimView {
    pub record: ClaimRecord,
    /// None: the server is gone from the inventory.
    pub server: Option<ServerFacts>,
    pub node: Option<NodeFacts>,
    /// Pods of the claim that still exist and wait for a node.
    pub pods_pending: Vec<String>,
    /// Pods of the claim bound to its node.
    pub pods_bound: usize,
}

/// A power action or read this process has under way or just finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Io {
    PowerOn,
    PowerOff,
    Read,
}

/// What this process holds about one claim, beyond the API: lost on a
/// restart, by design (a restarted process reads and asks again).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimIo {
    /// The action under way.
    pub running: Option<Io>,
    /// The last action that finished, and how.
    pub finished: Option<(Io, Result<bool, PowerFailure>)>,
    /// Failed attempts in a row.
    pub failed: u32,
    /// No attempt before this.
    pub next_at: Option<Duration>,
    /// The gates note last written, so it is written on change only.
    pub gates_note: Option<String>,
    /// Since when this process has seen the serving node NotReady.
    pub not_ready_since: Option<Duration>,
}

/// How long a claim whose record writes failed `failed` times in a row
/// waits before it writes again: 1 s, doubling, at most 30 s.
pub fn write_again_after(failed: u32) -> Duration {
    Duration::from_secs(1u64 << failed.saturating_sub(1).min(5)).min(Duration::from_secs(30))
}

impl ClaimIo {
    fn retry_due(&self, now: Duration) -> bool {
        self.next_at.is_none_or(|at| now >= at)
    }

    fn fail_attempt(&mut self, retry: &Retry, now: Duration) -> u32 {
        self.failed += 1;
        self.next_at = Some(now + retry.delay(self.failed));
        self.failed
    }
}

/// The knobs of a claim's walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClaimSettings {
    pub deadlines: Deadlines,
    pub retry: Retry,
    /// A server is quarantined after this many failed claims in a row.
    pub quarantine_after: u32,
    /// A failed claim's record is kept this long, then deleted.
    pub failed_claim_ttl_s: Seconds,
    /// A serving node NotReady this long fails its claim.
    pub not_ready_grace_s: Seconds,
}

impl Default for ClaimSettings {
    fn default() -> Self {
        ClaimSettings {
            deadlines: Deadlines::default(),
            retry: Retry::default(),
            quarantine_after: 3,
            failed_claim_ttl_s: 3600,
            not_ready_grace_s: 300,
        }
    }
}

/// A claim's name, `POOL-SERVER-xxxxx`: five letters drawn from `bits`
/// (the caller's randomness) make it unique; the prefix is cut so the name
/// stays within 253 characters.
pub fn claim_name(pool: &str, server: &str, mut bits: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let suffix: String = (0..5)
        .map(|_| {
            let c = ALPHABET[(bits % ALPHABET.len() as u64) as usize] as char;
            bits /= ALPHABET.len() as u64;
            c
        })
        .collect();
    let prefix: String = format!("{pool}-{server}").chars().take(240).collect();
    let prefix = prefix.trim_end_matches(['-', '.']);
    format!("{prefix}-{suffix}")
}

/// A duration as people say it: `45s`, `3m`, `1h20m`.
pub fn human(s: Seconds) -> String {
    match s {
        0..=89 => format!("{s}s"),
        90..=5399 => format!("{}m", (s + 30) / 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

fn fail(name: &str, reason: FailureReason, message: String, timed_out: bool) -> Effect {
    Effect::FailClaim { claim: name.to_string(), reason, message, timed_out }
}

fn enter(name: &str, stage: Stage, message: impl Into<String>) -> Effect {
    Effect::EnterStage { claim: name.to_string(), stage, message: message.into() }
}

/// One reconcile of one claim at `now` (`now_s` its whole seconds):
/// updates `io` and returns the effects due.
pub fn step(view: &ClaimView, io: &mut ClaimIo, settings: &ClaimSettings, now: Duration) -> Vec<Effect> {
    let now_s = now.as_secs();
    let r = &view.record;
    let name = r.name.as_str();
    if r.failure.is_some() {
        return release_failed(view, io, settings, now);
    }
    let Some(server) = &view.server else {
        return vec![fail(name, FailureReason::ServerUnavailable, format!("server {} is not in the inventory", r.server), false)];
    };
    if server.holder.as_deref() != Some(name) {
        let holder = server.holder.clone().unwrap_or_else(|| "nothing".into());
        return vec![fail(name, FailureReason::ServerUnavailable, format!("server {} is held by {holder}, not by this claim", r.server), false)];
    }
    let age = now_s.saturating_sub(r.stage_started_s);
    let budget = settings.deadlines.budget(r.stage, &server.durations);
    match r.stage {
        // Stepped only once no take of this process is under way (see
        // [`crate::Autoscaler`]): the server is the claim's, but the stage
        // that says so was not written (the write failed, or the process
        // that took it stopped). Powering on waits for the BMC's word.
        Stage::Selected => vec![enter(name, Stage::PoweringOn, format!("server {} taken", r.server))],
        Stage::PoweringOn => power_on(view, io, settings, server, age, now),
        Stage::Booting => {
            if let Some(node) = &view.node {
                let mut out = vec![Effect::LinkNode { claim: name.into(), server: r.server.clone(), node: node.name.clone(), pool: r.pool.clone() }];
                if r.pods.is_empty() {
                    // A claim of no pods keeps a warm spare as a node.
                    out.push(Effect::Mark { node: node.name.clone(), mark: crate::Mark::Spare, on: true });
                }
                out.push(enter(name, Stage::Joined, format!("node {} registered", node.name)));
                return out;
            }
            match budget {
                Some(b) if age > b.stuck_after_s => vec![fail(
                    name,
                    FailureReason::RegistrationTimedOut,
                    format!(
                        "server {} powered on {} ago and no node registered; it usually registers in {} (stuck after {})",
                        r.server,
                        human(age),
                        human(b.usual_s),
                        human(b.stuck_after_s)
                    ),
                    true,
                )],
                _ => Vec::new(),
            }
        }
        Stage::Joined => {
            let Some(node) = &view.node else {
                let message = format!("node {} went away before it was ready", r.node.clone().unwrap_or_default());
                return vec![fail(name, FailureReason::NodeLost, message, false)];
            };
            if node.passed() {
                io.gates_note = None;
                let joined_at = r.stage_started_s;
                let ready_at = node.ready_since_s.unwrap_or(joined_at).clamp(joined_at, now_s);
                let took = |from: Stage, to: Stage| match (r.entered_s(from), r.entered_s(to)) {
                    (Some(a), Some(b)) => b.saturating_sub(a),
                    _ => 0,
                };
                let sample = [took(Stage::PoweringOn, Stage::Booting), took(Stage::Booting, Stage::Joined), ready_at - joined_at, now_s - ready_at];
                return vec![
                    enter(name, Stage::Ready, "node Ready and readiness gates passed"),
                    Effect::Measure { server: r.server.clone(), sample },
                ];
            }
            let waiting = format!("waiting for {}", node.waiting_for().join(", "));
            // A Ready node that waits only for the node lifecycle controller
            // to lift its taint waits on the control plane, not on the
            // server: another server would wait the same, so the claim is
            // not failed for it, however long it takes.
            let server_fine = node.ready && node.unmet.is_empty();
            if let Some(b) = budget
                && age > b.stuck_after_s
                && !server_fine
            {
                let reason = if !node.ready { FailureReason::NodeNotReady } else { FailureReason::ReadinessGateFailed };
                let message =
                    format!("node {} registered {} ago and is not ready: {waiting}; usually ready in {}", node.name, human(age), human(b.usual_s));
                return vec![fail(name, reason, message, true)];
            }
            if io.gates_note.as_deref() != Some(waiting.as_str()) {
                io.gates_note = Some(waiting.clone());
                return vec![Effect::Note { subject: format!("claim {name}"), reason: "GatesWaiting", message: waiting, warning: false }];
            }
            Vec::new()
        }
        Stage::Ready => {
            // Its node may go while the claim waits for its pods: they can
            // no longer land there, and the server would stay held.
            if let Some(failed) = node_gone(view, io, settings, now, "ready") {
                return vec![failed];
            }
            if view.pods_pending.is_empty() { vec![enter(name, Stage::Serving, format!("{} pod(s) bound", view.pods_bound))] } else { Vec::new() }
        }
        Stage::Serving => node_gone(view, io, settings, now, "serving").into_iter().collect(),
    }
}

/// A ready or serving claim's node: gone is a `node_lost` failure, NotReady
/// for the grace a `node_not_ready` one. The grace runs from the moment
/// this process first saw it NotReady: a restart only lengthens it.
fn node_gone(view: &ClaimView, io: &mut ClaimIo, settings: &ClaimSettings, now: Duration, stage: &str) -> Option<Effect> {
    let r = &view.record;
    match &view.node {
        None => {
            Some(fail(&r.name, FailureReason::NodeLost, format!("node {} of a {stage} claim is gone", r.node.clone().unwrap_or_default()), false))
        }
        Some(node) if !node.ready => {
            let since = *io.not_ready_since.get_or_insert(now);
            let down_s = now.saturating_sub(since).as_secs();
            (down_s >= settings.not_ready_grace_s).then(|| {
                let message = format!("node {} of a {stage} claim has been NotReady for {}", node.name, human(down_s));
                fail(&r.name, FailureReason::NodeNotReady, message, true)
            })
        }
        Some(_) => {
            io.not_ready_since = None;
            None
        }
    }
}

/// When [`step`] next has something to do for this claim with nothing
/// else changed: a retry, a stage past its budget, a serving node's grace
/// run out, a failed record's time to go. None: it waits for an answer or
/// for the world to change.
pub fn due_at(view: &ClaimView, io: &ClaimIo, settings: &ClaimSettings) -> Option<Duration> {
    let r = &view.record;
    let secs = Duration::from_secs;
    let holds = view.server.as_ref().is_some_and(|s| s.holder.as_deref() == Some(r.name.as_str()));
    if r.failure.is_some() && !holds {
        // Released: nothing but its record's time to go.
        return Some(secs(r.created_s.saturating_add(settings.failed_claim_ttl_s)));
    }
    let Some(server) = view.server.as_ref() else { return Some(Duration::ZERO) };
    if io.running.is_some() {
        return None;
    }
    if io.finished.is_some() {
        return Some(Duration::ZERO);
    }
    if r.failure.is_some() {
        return Some(io.next_at.unwrap_or(Duration::ZERO));
    }
    if !holds || r.stage == Stage::Selected {
        return Some(Duration::ZERO);
    }
    let past =
        |stage: Stage| settings.deadlines.budget(stage, &server.durations).map(|b| secs(r.stage_started_s.saturating_add(b.stuck_after_s) + 1));
    match r.stage {
        Stage::Selected => Some(Duration::ZERO),
        Stage::PoweringOn => match io.next_at {
            Some(at) => Some(at),
            None => Some(Duration::ZERO),
        },
        Stage::Booting | Stage::Joined => past(r.stage),
        Stage::Ready | Stage::Serving => io.not_ready_since.map(|since| since + secs(settings.not_ready_grace_s)),
    }
}

/// `PoweringOn`: wait for the power-on under way, retry a failed one,
/// move on once it is confirmed; after a restart, read the BMC first.
fn power_on(view: &ClaimView, io: &mut ClaimIo, settings: &ClaimSettings, server: &ServerFacts, age: Seconds, now: Duration) -> Vec<Effect> {
    let r = &view.record;
    let name = r.name.as_str();
    if io.running.is_some() {
        return Vec::new();
    }
    let on = match io.finished.take() {
        Some((Io::PowerOn, Ok(_))) => true,
        Some((Io::Read, Ok(on))) => on,
        Some((_, Err(err))) => return power_failed(view, io, settings, err, now),
        Some((Io::PowerOff, Ok(_))) | None => {
            if !io.retry_due(now) {
                return Vec::new();
            }
            io.running = Some(Io::Read);
            return vec![Effect::ReadPower { server: r.server.clone() }];
        }
    };
    if on {
        *io = ClaimIo::default();
        return vec![enter(name, Stage::Booting, "power on confirmed")];
    }
    // Off. A power-on sent by an earlier run may still be settling: wait
    // for it through the power-on budget before sending another.
    let budget = settings.deadlines.budget(Stage::PoweringOn, &server.durations).map_or(60, |b| b.stuck_after_s);
    if io.failed == 0 && io.next_at.is_none() && age < budget {
        io.next_at = Some(now + Duration::from_secs(budget - age));
        return Vec::new();
    }
    io.running = Some(Io::PowerOn);
    vec![Effect::PowerOn { server: r.server.clone(), claim: Some(name.into()) }]
}

fn power_failed(view: &ClaimView, io: &mut ClaimIo, settings: &ClaimSettings, err: PowerFailure, now: Duration) -> Vec<Effect> {
    let name = view.record.name.as_str();
    if err.reason.is_configuration() {
        *io = ClaimIo::default();
        return vec![fail(name, err.reason, err.message, false)];
    }
    let failed = io.fail_attempt(&settings.retry, now);
    let message = format!("attempt {failed} of {}: {}", settings.retry.attempts, err.message);
    if failed >= settings.retry.attempts {
        *io = ClaimIo::default();
        return vec![fail(name, err.reason, message, false)];
    }
    let delay = settings.retry.delay(failed).as_secs().max(1);
    vec![Effect::Note {
        subject: format!("claim {name}"),
        reason: "PowerOnRetrying",
        message: format!("{message}; retrying in {}", human(delay)),
        warning: true,
    }]
}

/// A failed claim: power its server off unless it became a node, then
/// release it, counting the failure; delete the record after its TTL.
fn release_failed(view: &ClaimView, io: &mut ClaimIo, settings: &ClaimSettings, now: Duration) -> Vec<Effect> {
    let r = &view.record;
    let name = r.name.as_str();
    let holds = view.server.as_ref().is_some_and(|s| s.holder.as_deref() == Some(name));
    if !holds {
        if now.as_secs().saturating_sub(r.created_s) >= settings.failed_claim_ttl_s {
            return vec![Effect::DeleteClaim { claim: name.into() }];
        }
        return Vec::new();
    }
    let conflict = r.failure == Some(FailureReason::ClaimConflict);
    // A fault of configuration is not the machine's: it is not counted.
    // When no power-on was ever sent, the server is released as it is; when
    // one may have been (an earlier attempt, an earlier run), it is powered
    // off and confirmed off like any other, and a configuration that still
    // fails keeps the claim holding the server until it is fixed.
    let configuration = r.failure.is_some_and(FailureReason::is_configuration);
    let untouched = configuration && view.server.as_ref().is_some_and(|s| !s.power_on_sent);
    if view.node.is_none() && !conflict && !untouched {
        if io.running.is_some() {
            return Vec::new();
        }
        match io.finished.take() {
            Some((Io::PowerOff, Ok(_))) => {}
            Some((_, Err(_))) => {
                io.fail_attempt(&settings.retry, now);
                return Vec::new();
            }
            _ => {
                if !io.retry_due(now) {
                    return Vec::new();
                }
                io.running = Some(Io::PowerOff);
                return vec![Effect::PowerOff { server: r.server.clone(), claim: Some(name.into()), node: None }];
            }
        }
    }
    *io = ClaimIo::default();
    let failures = view.server.as_ref().map_or(0, |s| s.failures) + 1;
    let blamed = !conflict && !configuration;
    vec![Effect::Release {
        server: r.server.clone(),
        claim: name.into(),
        count_failure: blamed,
        quarantine: blamed && quarantines(failures, settings.quarantine_after),
        untouched,
    }]
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_S: Seconds = 10_000;

    fn now() -> Duration {
        Duration::from_secs(NOW_S)
    }

    fn view(stage: Stage, started_ago_s: Seconds) -> ClaimView {
        ClaimView {
            record: ClaimRecord {
                name: "c".into(),
                server: "s".into(),
                pool: "p".into(),
                pods: vec!["ns/a".into()],
                stage,
                stage_started_s: NOW_S - started_ago_s,
                failure: None,
                node: None,
                created_s: NOW_S - started_ago_s,
                history: vec![(stage, NOW_S - started_ago_s)],
            },
            server: Some(ServerFacts {
                holder: Some("c".into()),
                durations: StageDurations { power_on_s: 30, boot_s: 240, join_s: 30, ready_s: 30, tail_percent: 150 },
                failures: 0,
                power_on_sent: false,
            }),
            node: None,
            pods_pending: vec!["ns/a".into()],
            pods_bound: 0,
        }
    }

    fn node(ready: bool, unmet: &[&str]) -> Option<NodeFacts> {
        Some(NodeFacts {
            name: "n".into(),
            ready,
            ready_since_s: ready.then_some(NOW_S),
            lifecycle_taint: None,
            unmet: unmet.iter().map(|s| s.to_string()).collect(),
        })
    }

    /// What a claim says it waits for names the lifecycle taint apart from
    /// the pool's gates, and "node Ready" alone when the node is not.
    #[test]
    fn a_node_says_what_it_waits_for() {
        let text = |n: Option<NodeFacts>| n.expect("node").waiting_for().join(", ");
        assert_eq!(text(node(false, &["gpu driver"])), "node Ready, gpu driver");
        assert_eq!(text(tainted(&["gpu driver"])), "node Ready (its node.kubernetes.io/not-ready taint is not lifted yet), gpu driver");
        assert_eq!(text(node(true, &[])), "");
        assert!(node(true, &[]).expect("node").passed());
        assert!(!tainted(&[]).expect("node").passed());
    }

    /// A Ready node the node lifecycle controller has not untainted yet.
    fn tainted(unmet: &[&str]) -> Option<NodeFacts> {
        node(true, unmet).map(|n| NodeFacts { lifecycle_taint: Some("node.kubernetes.io/not-ready".into()), ..n })
    }

    fn failed(reason: FailureReason) -> ClaimView {
        let mut v = view(Stage::Booting, 900);
        v.record.failure = Some(reason);
        v
    }

    fn kinds(effects: &[Effect]) -> Vec<String> {
        effects
            .iter()
            .map(|e| match e {
                Effect::EnterStage { stage, .. } => format!("enter {}", stage.label()),
                Effect::FailClaim { reason, timed_out, .. } => format!("fail {reason}{}", if *timed_out { " (timed out)" } else { "" }),
                Effect::PowerOn { .. } => "power on".into(),
                Effect::PowerOff { .. } => "power off".into(),
                Effect::ReadPower { .. } => "read power".into(),
                Effect::LinkNode { .. } => "link node".into(),
                Effect::Release { count_failure, quarantine, untouched: false, .. } => {
                    format!("release (count {count_failure}, quarantine {quarantine})")
                }
                Effect::Release { count_failure, quarantine, untouched: true, .. } => {
                    format!("release untouched (count {count_failure}, quarantine {quarantine})")
                }
                Effect::DeleteClaim { .. } => "delete claim".into(),
                Effect::Note { reason, .. } => format!("note {reason}"),
                Effect::Measure { .. } => "measure".into(),
                other => format!("{other:?}"),
            })
            .collect()
    }

    fn run(v: &ClaimView, io: &mut ClaimIo) -> Vec<String> {
        kinds(&step(v, io, &ClaimSettings::default(), now()))
    }

    /// State x observation -> effects, one row each.
    #[test]
    fn each_stage_and_observation_gives_the_expected_effects() {
        let ok = |io: Io, on: bool| ClaimIo { finished: Some((io, Ok(on))), ..ClaimIo::default() };
        let err = |io: Io| ClaimIo {
            finished: Some((io, Err(PowerFailure { reason: FailureReason::BmcUnreachable, message: "connection refused".into() }))),
            ..ClaimIo::default()
        };
        let with_node = |mut v: ClaimView, n: Option<NodeFacts>| {
            v.node = n;
            v
        };
        let bound = |mut v: ClaimView| {
            v.pods_pending.clear();
            v.pods_bound = 1;
            v
        };
        let mut no_server = view(Stage::Booting, 10);
        no_server.server = None;
        let mut selected_not_held = view(Stage::Selected, 0);
        selected_not_held.server.as_mut().unwrap().holder = None;
        let mut taken_elsewhere = view(Stage::Booting, 10);
        taken_elsewhere.server.as_mut().unwrap().holder = Some("other".into());
        let mut not_held_failed = failed(FailureReason::RegistrationTimedOut);
        not_held_failed.server.as_mut().unwrap().holder = None;
        let mut third_failure = failed(FailureReason::RegistrationTimedOut);
        third_failure.server.as_mut().unwrap().failures = 2;
        let mut old_not_held = not_held_failed.clone();
        old_not_held.record.created_s = NOW_S - 3600;
        let running = |io: Io| ClaimIo { running: Some(io), ..ClaimIo::default() };
        let config = |io: Io, reason: FailureReason| ClaimIo {
            finished: Some((io, Err(PowerFailure { reason, message: "Secret metal/bmc-r1 does not exist".into() }))),
            ..ClaimIo::default()
        };
        let mut selected_elsewhere = view(Stage::Selected, 0);
        selected_elsewhere.server.as_mut().unwrap().holder = Some("other".into());
        let rows: Vec<(&str, ClaimView, ClaimIo, Vec<&str>)> = vec![
            ("selected and held: the take's stage was not written", view(Stage::Selected, 0), ClaimIo::default(), vec!["enter powering_on"]),
            ("selected, not held: the take did not land", selected_not_held, ClaimIo::default(), vec!["fail server_unavailable"]),
            ("selected, held by another claim", selected_elsewhere, ClaimIo::default(), vec!["fail server_unavailable"]),
            ("server gone", no_server, ClaimIo::default(), vec!["fail server_unavailable"]),
            ("server held by another claim", taken_elsewhere, ClaimIo::default(), vec!["fail server_unavailable"]),
            ("powering on, nothing known: read the BMC", view(Stage::PoweringOn, 5), ClaimIo::default(), vec!["read power"]),
            ("powering on, a power-on is under way", view(Stage::PoweringOn, 5), running(Io::PowerOn), vec![]),
            ("powering on, confirmed", view(Stage::PoweringOn, 5), ok(Io::PowerOn, true), vec!["enter booting"]),
            ("powering on, read On", view(Stage::PoweringOn, 5), ok(Io::Read, true), vec!["enter booting"]),
            ("powering on, read Off inside the budget: wait", view(Stage::PoweringOn, 5), ok(Io::Read, false), vec![]),
            ("powering on, read Off past the budget: send", view(Stage::PoweringOn, 500), ok(Io::Read, false), vec!["power on"]),
            ("powering on, failed: retry later", view(Stage::PoweringOn, 5), err(Io::PowerOn), vec!["note PowerOnRetrying"]),
            ("powering on, read failed: counts as an attempt", view(Stage::PoweringOn, 5), err(Io::Read), vec!["note PowerOnRetrying"]),
            (
                "powering on, its credentials Secret missing: fails at once",
                view(Stage::PoweringOn, 5),
                config(Io::Read, FailureReason::BmcCredentialsMissing),
                vec!["fail bmc_credentials_missing"],
            ),
            (
                "powering on, an unusable address: fails at once",
                view(Stage::PoweringOn, 5),
                config(Io::PowerOn, FailureReason::BmcConfigInvalid),
                vec!["fail bmc_config_invalid"],
            ),
            ("booting, no node yet", view(Stage::Booting, 100), ClaimIo::default(), vec![]),
            (
                "booting, node registered",
                with_node(view(Stage::Booting, 100), node(false, &[])),
                ClaimIo::default(),
                vec!["link node", "enter joined"],
            ),
            ("booting past 2x its tail", view(Stage::Booting, 721), ClaimIo::default(), vec!["fail registration_timed_out (timed out)"]),
            ("joined, node gone", view(Stage::Joined, 5), ClaimIo::default(), vec!["fail node_lost"]),
            ("joined, not ready", with_node(view(Stage::Joined, 5), node(false, &[])), ClaimIo::default(), vec!["note GatesWaiting"]),
            ("joined, ready, gates met", with_node(view(Stage::Joined, 5), node(true, &[])), ClaimIo::default(), vec!["enter ready", "measure"]),
            (
                "joined, never ready",
                with_node(view(Stage::Joined, 181), node(false, &[])),
                ClaimIo::default(),
                vec!["fail node_not_ready (timed out)"],
            ),
            (
                "joined, Ready, the lifecycle taint not lifted yet",
                with_node(view(Stage::Joined, 5), tainted(&[])),
                ClaimIo::default(),
                vec!["note GatesWaiting"],
            ),
            (
                "joined, Ready, the lifecycle taint not lifted past the budget: the control plane lags, the server is fine",
                with_node(view(Stage::Joined, 181), tainted(&[])),
                ClaimIo::default(),
                vec!["note GatesWaiting"],
            ),
            (
                "joined, Ready, the lifecycle taint and a gate past the budget",
                with_node(view(Stage::Joined, 181), tainted(&["gpu driver"])),
                ClaimIo::default(),
                vec!["fail readiness_gate_failed (timed out)"],
            ),
            (
                "joined, a gate never passes",
                with_node(view(Stage::Joined, 181), node(true, &["gpu driver"])),
                ClaimIo::default(),
                vec!["fail readiness_gate_failed (timed out)"],
            ),
            ("ready, pods still pending", with_node(view(Stage::Ready, 5), node(true, &[])), ClaimIo::default(), vec![]),
            ("ready, pods bound", bound(with_node(view(Stage::Ready, 5), node(true, &[]))), ClaimIo::default(), vec!["enter serving"]),
            ("ready, pods still pending, node deleted", view(Stage::Ready, 5), ClaimIo::default(), vec!["fail node_lost"]),
            (
                "ready, pods still pending, node NotReady past its grace",
                with_node(view(Stage::Ready, 5), node(false, &[])),
                ClaimIo { not_ready_since: Some(now() - Duration::from_secs(ClaimSettings::default().not_ready_grace_s)), ..ClaimIo::default() },
                vec!["fail node_not_ready (timed out)"],
            ),
            ("serving, node healthy", bound(with_node(view(Stage::Serving, 5), node(true, &[]))), ClaimIo::default(), vec![]),
            ("serving, node deleted", bound(view(Stage::Serving, 5)), ClaimIo::default(), vec!["fail node_lost"]),
            ("failed, no node: power off first", failed(FailureReason::RegistrationTimedOut), ClaimIo::default(), vec!["power off"]),
            ("failed, power-off under way", failed(FailureReason::RegistrationTimedOut), running(Io::PowerOff), vec![]),
            (
                "failed, confirmed off: release, counted",
                failed(FailureReason::RegistrationTimedOut),
                ok(Io::PowerOff, false),
                vec!["release (count true, quarantine false)"],
            ),
            ("failed, power-off failed: retry later", failed(FailureReason::RegistrationTimedOut), err(Io::PowerOff), vec![]),
            ("failed, third in a row: quarantine", third_failure, ok(Io::PowerOff, false), vec!["release (count true, quarantine true)"]),
            (
                "failed with a node: release without power-off",
                with_node(failed(FailureReason::NodeNotReady), node(false, &[])),
                ClaimIo::default(),
                vec!["release (count true, quarantine false)"],
            ),
            (
                "failed on a conflict: release, not counted, no power-off",
                failed(FailureReason::ClaimConflict),
                ClaimIo::default(),
                vec!["release (count false, quarantine false)"],
            ),
            (
                "failed by its configuration, no power-on ever sent: released as it is, not counted, no power-off",
                failed(FailureReason::BmcCredentialsMissing),
                ClaimIo::default(),
                vec!["release untouched (count false, quarantine false)"],
            ),
            (
                "failed by its configuration, third in a row: not quarantined",
                {
                    let mut v = failed(FailureReason::BmcConfigInvalid);
                    v.server.as_mut().unwrap().failures = 2;
                    v
                },
                ClaimIo::default(),
                vec!["release untouched (count false, quarantine false)"],
            ),
            (
                "failed by its configuration after a power-on may have been sent: powered off first",
                {
                    let mut v = failed(FailureReason::BmcCredentialsMissing);
                    v.server.as_mut().unwrap().power_on_sent = true;
                    v
                },
                ClaimIo::default(),
                vec!["power off"],
            ),
            (
                "failed by its configuration after a power-on, confirmed off: released, not counted",
                {
                    let mut v = failed(FailureReason::BmcCredentialsMissing);
                    v.server.as_mut().unwrap().power_on_sent = true;
                    v
                },
                ok(Io::PowerOff, false),
                vec!["release (count false, quarantine false)"],
            ),
            (
                "failed by its configuration after a power-on, the power-off fails too: the claim keeps the server",
                {
                    let mut v = failed(FailureReason::BmcCredentialsMissing);
                    v.server.as_mut().unwrap().power_on_sent = true;
                    v
                },
                config(Io::PowerOff, FailureReason::BmcCredentialsMissing),
                vec![],
            ),
            ("failed, released, kept as a record", not_held_failed, ClaimIo::default(), vec![]),
            ("failed, released, past its TTL", old_not_held, ClaimIo::default(), vec!["delete claim"]),
        ];
        for (what, v, mut io, want) in rows {
            assert_eq!(run(&v, &mut io), want, "{what}");
        }
    }

    #[test]
    fn power_on_is_retried_with_backoff_then_the_claim_fails_with_the_last_reason() {
        let v = view(Stage::PoweringOn, 5);
        let settings =
            ClaimSettings { retry: Retry { base: Duration::from_secs(2), max: Duration::from_secs(60), attempts: 3 }, ..ClaimSettings::default() };
        let mut io = ClaimIo::default();
        let mut t = now();
        let mut log = Vec::new();
        for _ in 0..200 {
            let effects = step(&v, &mut io, &settings, t);
            for e in &effects {
                match e {
                    Effect::ReadPower { .. } => {
                        io.running = None;
                        io.finished = Some((Io::Read, Ok(false)));
                    }
                    Effect::PowerOn { .. } => {
                        io.running = None;
                        io.finished = Some((Io::PowerOn, Err(PowerFailure { reason: FailureReason::PowerActionFailed, message: "500".into() })));
                    }
                    _ => {}
                }
            }
            log.extend(kinds(&effects).into_iter().map(|k| format!("{}s {k}", t.as_secs() - NOW_S)));
            if effects.iter().any(|e| matches!(e, Effect::FailClaim { .. })) {
                break;
            }
            t += Duration::from_secs(1);
        }
        // Read Off, wait out the 90 s power-on budget, read again, send; it
        // fails; 2 s later read (it may have landed after all), send; fails;
        // 4 s later read, send; fails the third time: the claim fails.
        assert_eq!(
            log,
            [
                "0s read power",
                "85s read power",
                "86s power on",
                "87s note PowerOnRetrying",
                "89s read power",
                "90s power on",
                "91s note PowerOnRetrying",
                "95s read power",
                "96s power on",
                "97s fail power_action_failed",
            ]
        );
    }

    #[test]
    fn a_serving_node_not_ready_past_its_grace_fails_its_claim_and_recovering_resets_the_grace() {
        let mut v = view(Stage::Serving, 5);
        v.node = node(false, &[]);
        v.pods_pending.clear();
        let settings = ClaimSettings::default();
        let mut io = ClaimIo::default();
        assert!(step(&v, &mut io, &settings, now()).is_empty());
        assert!(step(&v, &mut io, &settings, now() + Duration::from_secs(299)).is_empty());
        v.node = node(true, &[]);
        assert!(step(&v, &mut io, &settings, now() + Duration::from_secs(300)).is_empty());
        v.node = node(false, &[]);
        assert!(step(&v, &mut io, &settings, now() + Duration::from_secs(301)).is_empty(), "the grace starts again");
        let effects = step(&v, &mut io, &settings, now() + Duration::from_secs(601));
        assert_eq!(kinds(&effects), ["fail node_not_ready (timed out)"]);
    }
}
