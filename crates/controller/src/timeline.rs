//! The stage timeline on a ServerClaim's status, the per-server deadlines
//! that tell slow from stuck, and the words pods are told while they wait.
//!
//! Pure functions over the API types: no IO, times passed in.

use ironclaim_core::model::{Seconds, StageDurations};
use ironclaim_k8s::api::server::{MeasuredDurations, MeasuredStage};
use ironclaim_k8s::api::serverclaim::{FailureReason, ServerClaimStatus, Stage, StageOutcome, StageRecord};
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// The condition reason for a failure: its variant name.
pub fn reason_word(reason: FailureReason) -> String {
    format!("{reason:?}")
}

pub fn time(s: Seconds) -> Time {
    Time(Timestamp::from_second(i64::try_from(s).unwrap_or(i64::MAX)).unwrap_or(Timestamp::UNIX_EPOCH))
}

pub fn seconds(t: &Time) -> Seconds {
    t.0.as_second().max(0) as Seconds
}

/// When the current stage began, if any stage was entered.
pub fn stage_started_s(status: &ServerClaimStatus) -> Option<Seconds> {
    status.stages.last().map(|r| seconds(&r.start_time))
}

/// A stage record that ended: (stage, seconds, outcome).
pub type Ended = (Stage, Seconds, StageOutcome);

fn close_last(status: &mut ServerClaimStatus, now_s: Seconds, outcome: StageOutcome, message: Option<String>) -> Option<Ended> {
    let last = status.stages.last_mut()?;
    if last.outcome != StageOutcome::InProgress {
        return None;
    }
    let took = now_s.saturating_sub(seconds(&last.start_time));
    last.duration_seconds = Some(i64::try_from(took).unwrap_or(i64::MAX));
    last.outcome = outcome;
    if message.is_some() {
        last.message = message;
    }
    Some((last.stage, took, outcome))
}

/// Ends the current stage as succeeded and enters `stage`.
///
/// # Guarantees
/// Idempotent: entering the stage the claim is already in changes nothing.
/// The record list stays within the CRD's bound of 64.
pub fn enter(status: &mut ServerClaimStatus, stage: Stage, now_s: Seconds, message: Option<String>) -> Option<Ended> {
    if status.stage == Some(stage) {
        return None;
    }
    let ended = close_last(status, now_s, StageOutcome::Succeeded, None);
    if status.stages.len() >= 63 {
        status.stages.remove(0);
    }
    // Serving is where the path ends: the record is complete at once.
    let (outcome, duration) = if stage == Stage::Serving { (StageOutcome::Succeeded, Some(0)) } else { (StageOutcome::InProgress, None) };
    status.stages.push(StageRecord { stage, start_time: time(now_s), duration_seconds: duration, outcome, message });
    status.stage = Some(stage);
    ended
}

/// Ends the current stage as failed (or timed out) and records why.
pub fn fail(status: &mut ServerClaimStatus, reason: FailureReason, message: String, now_s: Seconds, timed_out: bool) -> Option<Ended> {
    let outcome = if timed_out { StageOutcome::TimedOut } else { StageOutcome::Failed };
    let ended = close_last(status, now_s, outcome, Some(truncate(&message, 1024)));
    status.failure_reason = Some(reason);
    status.failure_message = Some(truncate(&message, 4096));
    ended
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// Sets a condition, keeping its transition time when the status is the same.
pub fn set_condition(conditions: &mut Vec<Condition>, kind: &str, ok: bool, reason: &str, message: &str, now_s: Seconds, generation: Option<i64>) {
    let status = if ok { "True" } else { "False" };
    let message = truncate(message, 32768);
    if let Some(c) = conditions.iter_mut().find(|c| c.type_ == kind) {
        if c.status != status {
            c.last_transition_time = time(now_s);
        }
        c.status = status.to_string();
        c.reason = reason.to_string();
        c.message = message;
        c.observed_generation = generation;
        return;
    }
    conditions.push(Condition {
        type_: kind.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: time(now_s),
        observed_generation: generation,
    });
}

/// Slow versus stuck: the driver's budgets.
pub use ironclaim_driver::deadline::{Budget, Deadlines};

pub use ironclaim_driver::claim::human;

/// What a pod waiting on a server hears once the server is confirmed on.
pub fn powered_on_note(server: &str, ago_s: Seconds, d: &StageDurations) -> String {
    format!("waiting for server {server}: powered on {} ago, node not registered yet, usually registers in {}", human(ago_s), human(d.boot_s))
}

/// What a pod waiting on this claim is told: where the claim stands and
/// what happens next.
pub fn waiting_note(server: &str, status: &ServerClaimStatus, d: &StageDurations, now_s: Seconds) -> String {
    let stage = status.stage.unwrap_or(Stage::Selected);
    let ago = stage_started_s(status).map_or(0, |t| now_s.saturating_sub(t));
    let node = status.node_name.as_deref().unwrap_or("?");
    match stage {
        Stage::Selected => format!("waiting for server {server}: selected {} ago, power-on not requested yet", human(ago)),
        Stage::PoweringOn => format!(
            "waiting for server {server}: power-on requested {} ago, the BMC has not confirmed yet, usually confirms in {}",
            human(ago),
            human(d.power_on_s)
        ),
        Stage::Booting => powered_on_note(server, ago, d),
        Stage::Joined => format!(
            "waiting for server {server}: node {node} registered {} ago, readiness gates not passed yet, usually ready in {}",
            human(ago),
            human(d.join_s + d.ready_s)
        ),
        Stage::Ready | Stage::Serving => format!("server {server} is node {node}, ready: the scheduler binds the pod next"),
    }
}

/// Folds one observed duration into a stage's estimates.
///
/// # Guarantees
/// The first sample sets the median, and the tail at `tail_percent` of it;
/// later samples move both by an exponentially weighted step (weight 1/n,
/// at least 1/8), the tail faster upwards than downwards, and the tail
/// never drops below the median.
pub fn fold_sample(stage: Option<&MeasuredStage>, sample_s: Seconds, tail_percent: u32) -> MeasuredStage {
    let x = i64::try_from(sample_s).unwrap_or(i64::MAX);
    match stage {
        None => MeasuredStage { p50_seconds: x, p90_seconds: x.saturating_mul(i64::from(tail_percent)) / 100, samples: 1 },
        Some(m) => {
            let n = m.samples.saturating_add(1);
            let w = n.min(8);
            let p50 = m.p50_seconds + (x - m.p50_seconds) / w;
            let p90 = if x > m.p90_seconds { m.p90_seconds + (x - m.p90_seconds) / w } else { m.p90_seconds - (m.p90_seconds - x) / (4 * w) };
            MeasuredStage { p50_seconds: p50.max(0), p90_seconds: p90.max(p50).max(0), samples: n }
        }
    }
}

/// The stage durations of one successful start, folded into a server's
/// measurements: (power-on, boot, join, ready) in seconds.
pub fn fold_start(measured: Option<&MeasuredDurations>, start: [Seconds; 4], tail_percent: u32) -> MeasuredDurations {
    let m = measured.cloned().unwrap_or_default();
    MeasuredDurations {
        power_on: Some(fold_sample(m.power_on.as_ref(), start[0], tail_percent)),
        boot: Some(fold_sample(m.boot.as_ref(), start[1], tail_percent)),
        join: Some(fold_sample(m.join.as_ref(), start[2], tail_percent)),
        ready: Some(fold_sample(m.ready.as_ref(), start[3], tail_percent)),
    }
}

/// What a pending pod is told of the core's outcome for it, in one line:
/// what it waits for and when it should be ready. `ironclaim explain` and
/// the dashboard say the same.
pub fn outcome_note(outcome: &ironclaim_core::outcome::Outcome) -> String {
    use ironclaim_core::outcome::Outcome;
    match outcome {
        Outcome::Existing { node } => {
            format!("it fits Ready node {node} now: the scheduler should bind it; if it does not, capacity or request accounting is stale")
        }
        Outcome::InFlight { claim, server, eta_s } => format!("it waits for claim {claim} on server {server}: ready in about {}", human(*eta_s)),
        Outcome::NewClaim { server, path, eta_s, .. } => {
            format!("the next decision claims server {server} ({path}) for it: ready in about {}", human(*eta_s))
        }
        Outcome::Unschedulable { reason } => format!("nothing can be provisioned for it: {reason}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entering_stages_closes_the_previous_one_with_its_duration() {
        let mut status = ServerClaimStatus::default();
        assert_eq!(enter(&mut status, Stage::Selected, 100, None), None);
        assert_eq!(enter(&mut status, Stage::PoweringOn, 101, None), Some((Stage::Selected, 1, StageOutcome::Succeeded)));
        assert_eq!(enter(&mut status, Stage::PoweringOn, 105, None), None, "entering the same stage twice is a no-op");
        assert_eq!(enter(&mut status, Stage::Booting, 130, None), Some((Stage::PoweringOn, 29, StageOutcome::Succeeded)));
        assert_eq!(status.stages.len(), 3);
        assert_eq!(status.stages[2].outcome, StageOutcome::InProgress);
        let ended = fail(&mut status, FailureReason::RegistrationTimedOut, "stuck".into(), 200, true);
        assert_eq!(ended, Some((Stage::Booting, 70, StageOutcome::TimedOut)));
        assert_eq!(status.failure_reason, Some(FailureReason::RegistrationTimedOut));
    }

    #[test]
    fn the_waiting_note_says_what_happens_next() {
        let mut status = ServerClaimStatus::default();
        enter(&mut status, Stage::Booting, 1000, None);
        let d = StageDurations { boot_s: 240, ..StageDurations::default() };
        assert_eq!(
            waiting_note("r2-u14", &status, &d, 1180),
            "waiting for server r2-u14: powered on 3m ago, node not registered yet, usually registers in 4m"
        );
    }

    #[test]
    fn measurements_follow_the_samples_and_keep_the_tail_above_the_median() {
        let first = fold_sample(None, 100, 150);
        assert_eq!((first.p50_seconds, first.p90_seconds, first.samples), (100, 150, 1));
        let mut m = first;
        for _ in 0..30 {
            m = fold_sample(Some(&m), 40, 150);
        }
        assert!(m.p50_seconds <= 50 && m.p90_seconds >= m.p50_seconds, "{m:?}");
        let slow = fold_sample(Some(&m), 400, 150);
        assert!(slow.p90_seconds > m.p90_seconds);
    }
}
