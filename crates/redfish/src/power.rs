//! Power sequences: read the state, pick the reset type the BMC allows,
//! send it, follow a task monitor, and confirm the new state by polling.
//!
//! The sequences are written against [`PowerApi`], so they run the same way
//! against a real BMC ([`SystemHandle`]) and against an in-memory fake in
//! the unit tests below, where virtual time makes minutes of waiting free.

use std::sync::Mutex as SyncMutex;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::json;
use tokio::time::Instant;

use crate::client::{Bmc, Timing, jittered_backoff, malformed};
use crate::error::{Error, Result, Step};
use crate::payload::{self, ResetAction};

/// `PowerState` of a ComputerSystem.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    Paused,
    /// A value outside the standard set, kept verbatim.
    Other(String),
}

impl PowerState {
    pub fn from_redfish(value: &str) -> Self {
        match value {
            "On" => PowerState::On,
            "Off" => PowerState::Off,
            "PoweringOn" => PowerState::PoweringOn,
            "PoweringOff" => PowerState::PoweringOff,
            "Paused" => PowerState::Paused,
            other => PowerState::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            PowerState::On => "On",
            PowerState::Off => "Off",
            PowerState::PoweringOn => "PoweringOn",
            PowerState::PoweringOff => "PoweringOff",
            PowerState::Paused => "Paused",
            PowerState::Other(other) => other,
        }
    }

    /// The transitional state on the way to `self`, if any.
    fn on_the_way(&self) -> Option<PowerState> {
        match self {
            PowerState::On => Some(PowerState::PoweringOn),
            PowerState::Off => Some(PowerState::PoweringOff),
            _ => None,
        }
    }
}

impl std::fmt::Display for PowerState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for PowerState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// The `ResetType` values ironclaim sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub enum ResetType {
    On,
    ForceOn,
    PushPowerButton,
    GracefulShutdown,
    ForceOff,
}

impl ResetType {
    pub fn as_str(self) -> &'static str {
        match self {
            ResetType::On => "On",
            ResetType::ForceOn => "ForceOn",
            ResetType::PushPowerButton => "PushPowerButton",
            ResetType::GracefulShutdown => "GracefulShutdown",
            ResetType::ForceOff => "ForceOff",
        }
    }
}

impl std::fmt::Display for ResetType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Power-on preference: `On`, else `ForceOn`, else `PushPowerButton`.
pub const POWER_ON_PREFERENCE: [ResetType; 3] = [ResetType::On, ResetType::ForceOn, ResetType::PushPowerButton];

/// What a power action did.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct PowerOutcome {
    /// The confirmed state at the end.
    pub state: PowerState,
    /// Every reset sent, in order; empty when the system already was there.
    pub sent: Vec<ResetType>,
    /// Total time including confirmation.
    pub elapsed: Duration,
}

impl PowerOutcome {
    /// True when nothing had to be sent.
    pub fn was_no_op(&self) -> bool {
        self.sent.is_empty()
    }
}

/// The three things a power sequence needs from a system.
pub(crate) trait PowerApi {
    /// Reads `PowerState`.
    async fn read_state(&self, step: Step) -> Result<PowerState>;
    /// The allowed `ResetType` values; `None` when the BMC does not say.
    async fn allowed_reset_types(&self) -> Result<Option<Vec<String>>>;
    /// Sends one reset and, for a 202, follows the task monitor to its end.
    async fn send_reset(&self, reset: ResetType) -> Result<()>;
}

fn allows(allowed: &Option<Vec<String>>, reset: ResetType) -> bool {
    allowed.as_ref().is_none_or(|values| values.iter().any(|v| v == reset.as_str()))
}

fn choose(allowed: &Option<Vec<String>>, preference: &[ResetType]) -> Result<ResetType> {
    // When the BMC lists nothing, the first (standard) choice is assumed.
    preference
        .iter()
        .copied()
        .find(|reset| allows(allowed, *reset))
        .ok_or_else(|| Error::ActionNotSupported { wanted: preference.to_vec(), allowed: allowed.clone().unwrap_or_default() })
}

enum Waited {
    Reached,
    NotYet(PowerState),
}

/// Polls until `target` shows or `deadline` passes, with growing, jittered
/// delays. Read errors end the wait: they already had their retries.
async fn wait_for(api: &impl PowerApi, target: &PowerState, deadline: Instant, timing: &Timing) -> Result<Waited> {
    let mut delay = timing.poll_initial;
    loop {
        let now = Instant::now();
        if now >= deadline {
            let last = api.read_state(Step::ConfirmState).await?;
            return Ok(if &last == target { Waited::Reached } else { Waited::NotYet(last) });
        }
        let jitter = Duration::from_millis(fastrand::u64(0..=u64::try_from(delay.as_millis() / 5).unwrap_or(0)));
        tokio::time::sleep((delay + jitter).min(deadline - now)).await;
        let state = api.read_state(Step::ConfirmState).await?;
        if &state == target {
            return Ok(Waited::Reached);
        }
        delay = (delay * 2).min(timing.poll_max);
    }
}

/// Sends `reset` and confirms `target`. If the state has not moved after
/// `resend_after`, the BMC is taken to have dropped the action and it is
/// sent once more; then the wait goes on until `confirm_timeout`.
async fn send_and_confirm(api: &impl PowerApi, reset: ResetType, target: PowerState, timing: &Timing, sent: &mut Vec<ResetType>) -> Result<()> {
    api.send_reset(reset).await?;
    // Counted from when the BMC took the reset, not from when it was asked
    // for: a reset may wait for the endpoint's resets to other systems.
    let first_send = Instant::now();
    sent.push(reset);
    let mut sends = 1;
    let resend_deadline = first_send + timing.resend_after.min(timing.confirm_timeout);
    let final_deadline = first_send + timing.confirm_timeout;
    let mut last = match wait_for(api, &target, resend_deadline, timing).await? {
        Waited::Reached => return Ok(()),
        Waited::NotYet(last) => last,
    };
    let moving = target.on_the_way().is_some_and(|way| way == last);
    if !moving && Instant::now() < final_deadline {
        let opposite = if target == PowerState::On { PowerState::Off } else { PowerState::On };
        if last != opposite {
            // Neither where we asked nor where we started: sending again
            // (a toggle, for PushPowerButton) could make things worse.
            return Err(Error::UnexpectedState { state: last, doing: "confirm the power action" });
        }
        tracing::warn!(%reset, state = %last, "the BMC accepted the reset but the state did not change; sending it again");
        api.send_reset(reset).await?;
        sent.push(reset);
        sends += 1;
    }
    match wait_for(api, &target, final_deadline.max(Instant::now()), timing).await? {
        Waited::Reached => return Ok(()),
        Waited::NotYet(seen) => last = seen,
    }
    Err(Error::TimedOutWaitingForState { expected: target, last_seen: last, reset_type: reset, sends, waited: first_send.elapsed() })
}

/// Powers a system on.
///
/// # Guarantees
/// - Idempotent: a system already `On` gets no request but the read; one
///   `PoweringOn` is only waited for.
/// - Uses `On`, else `ForceOn`, else `PushPowerButton`, as allowed.
/// - Returns only once `On` was read back from the BMC.
///
/// # Errors
/// [`Error::ActionNotSupported`], [`Error::ActionRejected`],
/// [`Error::TimedOutWaitingForState`] after one re-send,
/// [`Error::UnexpectedState`] for `Paused` or unknown states, and any
/// transport error.
pub(crate) async fn power_on(api: &impl PowerApi, timing: &Timing) -> Result<PowerOutcome> {
    let started = Instant::now();
    let mut sent = Vec::new();
    let mut state = api.read_state(Step::ReadSystem).await?;
    let done = |state: PowerState, sent: Vec<ResetType>| Ok(PowerOutcome { state, sent, elapsed: started.elapsed() });
    if state == PowerState::PoweringOff {
        // Let the shutdown finish; an On sent now is often dropped.
        state = match wait_for(api, &PowerState::Off, started + timing.confirm_timeout, timing).await? {
            Waited::Reached => PowerState::Off,
            Waited::NotYet(last) => last,
        };
    }
    match state {
        PowerState::On => return done(PowerState::On, sent),
        PowerState::PoweringOn => {
            return match wait_for(api, &PowerState::On, started + timing.confirm_timeout, timing).await? {
                Waited::Reached => done(PowerState::On, sent),
                Waited::NotYet(last) => Err(Error::TimedOutWaitingForState {
                    expected: PowerState::On,
                    last_seen: last,
                    reset_type: ResetType::On,
                    sends: 0,
                    waited: started.elapsed(),
                }),
            };
        }
        PowerState::Off => {}
        other => return Err(Error::UnexpectedState { state: other, doing: "power on" }),
    }
    let reset = choose(&api.allowed_reset_types().await?, &POWER_ON_PREFERENCE)?;
    send_and_confirm(api, reset, PowerState::On, timing, &mut sent).await?;
    done(PowerState::On, sent)
}

/// Powers a system off: `GracefulShutdown` with a bounded wait, then
/// `ForceOff`.
///
/// # Guarantees
/// - Idempotent: a system already `Off` gets no request but the read.
/// - A graceful shutdown that is refused, or that does not finish within
///   `graceful_timeout`, is followed by `ForceOff` when the BMC allows it.
/// - Returns only once `Off` was read back from the BMC.
///
/// # Errors
/// As [`power_on`]; [`Error::ActionRejected`] when both resets are refused.
pub(crate) async fn power_off(api: &impl PowerApi, timing: &Timing) -> Result<PowerOutcome> {
    let started = Instant::now();
    let mut sent = Vec::new();
    let state = api.read_state(Step::ReadSystem).await?;
    let done = |sent: Vec<ResetType>| Ok(PowerOutcome { state: PowerState::Off, sent, elapsed: started.elapsed() });
    match &state {
        PowerState::Off => return done(sent),
        PowerState::PoweringOff => {
            if let Waited::Reached = wait_for(api, &PowerState::Off, started + timing.confirm_timeout, timing).await? {
                return done(sent);
            }
        }
        PowerState::On | PowerState::PoweringOn | PowerState::Paused => {}
        other => return Err(Error::UnexpectedState { state: other.clone(), doing: "power off" }),
    }
    let allowed = api.allowed_reset_types().await?;
    let graceful_allowed = allows(&allowed, ResetType::GracefulShutdown) && state != PowerState::Paused;
    let mut graceful_error = None;
    if graceful_allowed {
        match api.send_reset(ResetType::GracefulShutdown).await {
            Ok(()) => {
                sent.push(ResetType::GracefulShutdown);
                let deadline = Instant::now() + timing.graceful_timeout;
                match wait_for(api, &PowerState::Off, deadline, timing).await? {
                    Waited::Reached => return done(sent),
                    Waited::NotYet(last) => {
                        tracing::info!(state = %last, "graceful shutdown did not finish in time; forcing off");
                    }
                }
            }
            Err(err @ Error::ActionRejected { .. }) => {
                tracing::warn!(error = %err, "graceful shutdown refused; forcing off");
                graceful_error = Some(err);
            }
            Err(err) => return Err(err),
        }
    }
    if allows(&allowed, ResetType::ForceOff) {
        send_and_confirm(api, ResetType::ForceOff, PowerState::Off, timing, &mut sent).await?;
        return done(sent);
    }
    if let Some(err) = graceful_error {
        return Err(err);
    }
    if sent.contains(&ResetType::GracefulShutdown) {
        return Err(Error::TimedOutWaitingForState {
            expected: PowerState::Off,
            last_seen: api.read_state(Step::ConfirmState).await?,
            reset_type: ResetType::GracefulShutdown,
            sends: 1,
            waited: started.elapsed(),
        });
    }
    Err(Error::ActionNotSupported { wanted: vec![ResetType::GracefulShutdown, ResetType::ForceOff], allowed: allowed.unwrap_or_default() })
}

/// A system on a BMC, as the power sequences see it.
pub(crate) struct SystemHandle<'a> {
    pub bmc: &'a Bmc,
    pub path: String,
    reset: SyncMutex<Option<ResetAction>>,
}

impl<'a> SystemHandle<'a> {
    pub fn new(bmc: &'a Bmc, path: String) -> Self {
        SystemHandle { bmc, path, reset: SyncMutex::new(None) }
    }

    async fn reset_action(&self) -> Result<ResetAction> {
        let cached = self.reset.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(action) = cached {
            return Ok(action);
        }
        self.read_state(Step::ReadSystem).await?;
        let cached = self.reset.lock().unwrap_or_else(|p| p.into_inner()).clone();
        cached.ok_or_else(|| Error::ActionNotSupported { wanted: POWER_ON_PREFERENCE.to_vec(), allowed: Vec::new() })
    }

    async fn follow_task(&self, reset: ResetType, monitor: &str) -> Result<()> {
        let timing = self.bmc.timing();
        let deadline = Instant::now() + timing.task_timeout;
        let mut attempt = 0;
        loop {
            attempt += 1;
            tokio::time::sleep(jittered_backoff(timing.poll_initial, attempt.min(4))).await;
            let reply = self.bmc.request(Step::PollTask, Method::GET, monitor, None, true).await?;
            match reply.status {
                StatusCode::ACCEPTED => {}
                StatusCode::NO_CONTENT | StatusCode::NOT_FOUND => return Ok(()),
                status if status.is_success() => {
                    // A task monitor answers with the Task while it runs and
                    // may answer with anything once done.
                    let task = payload::parse_body(&reply.body).ok().and_then(|v| payload::task(&v).ok());
                    match task {
                        Some(task) if task.failed() => {
                            return Err(Error::TaskFailed {
                                task: monitor.to_owned(),
                                reset_type: reset,
                                state: task.state.unwrap_or_default(),
                                message: task.message.unwrap_or_else(|| "no message".into()),
                            });
                        }
                        Some(task) if task.state.is_some() && !task.completed() => {}
                        _ => return Ok(()),
                    }
                }
                status => {
                    return Err(Error::HttpStatus {
                        step: Step::PollTask,
                        url: reply.url.clone(),
                        status: status.as_u16(),
                        message: reply.message(),
                    });
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::TaskTimedOut { task: monitor.to_owned(), reset_type: reset, waited: timing.task_timeout });
            }
        }
    }
}

/// The System at `path` and its power state. A 404 is
/// [`Error::SystemNotFound`]; a System without `PowerState` is malformed.
pub(crate) async fn read_system(bmc: &Bmc, path: &str, step: Step) -> Result<(payload::System, PowerState)> {
    let system = bmc.get_parsed(step, path, payload::system).await.map_err(|err| match err {
        Error::HttpStatus { status: 404, .. } => Error::SystemNotFound { selector: format!("at {path}") },
        other => other,
    })?;
    let state = system.power_state.clone().ok_or_else(|| Error::MalformedPayload {
        url: path.to_owned(),
        path: "$.PowerState".into(),
        reason: "missing".into(),
    })?;
    Ok((system, state))
}

impl PowerApi for SystemHandle<'_> {
    async fn read_state(&self, step: Step) -> Result<PowerState> {
        let (system, state) = read_system(self.bmc, &self.path, step).await?;
        *self.reset.lock().unwrap_or_else(|p| p.into_inner()) = system.reset;
        Ok(state)
    }

    async fn allowed_reset_types(&self) -> Result<Option<Vec<String>>> {
        let action = self.reset_action().await?;
        if let Some(values) = action.allowable {
            return Ok(Some(values));
        }
        let Some(info) = action.action_info else { return Ok(None) };
        let value = self.bmc.get_json(Step::ReadActionInfo, &info).await?;
        payload::action_info_reset_types(&value).map_err(|err| malformed(&info, err))
    }

    async fn send_reset(&self, reset: ResetType) -> Result<()> {
        let action = self.reset_action().await?;
        let _one_reset_per_endpoint = self.bmc.reset_slot().await?;
        let body = json!({ "ResetType": reset.as_str() });
        tracing::info!(system = %self.path, %reset, "sending reset");
        let reply = self.bmc.request(Step::Reset, Method::POST, &action.target, Some(&body), false).await?;
        // The next read must be a full one, never a cached copy.
        self.bmc.forget(&self.path);
        match reply.status {
            StatusCode::ACCEPTED => match reply.header("Location") {
                Some(monitor) => {
                    let monitor = monitor.to_owned();
                    self.follow_task(reset, &monitor).await
                }
                None => Ok(()),
            },
            status if status.is_success() => Ok(()),
            status if status.is_client_error() => Err(Error::ActionRejected { reset_type: reset, status: status.as_u16(), message: reply.message() }),
            status => Err(Error::HttpStatus { step: Step::Reset, url: reply.url.clone(), status: status.as_u16(), message: reply.message() }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A system in memory: resets take effect after `apply_after`, the
    /// first `drop_first` resets are silently ignored.
    struct FakeSystem {
        state: SyncMutex<(PowerState, Option<(PowerState, Instant)>)>,
        allowed: Option<Vec<String>>,
        apply_after: Duration,
        drop_first: SyncMutex<u32>,
        reject: Vec<ResetType>,
        sent: SyncMutex<VecDeque<ResetType>>,
    }

    impl FakeSystem {
        fn new(state: PowerState) -> Self {
            FakeSystem {
                state: SyncMutex::new((state, None)),
                allowed: None,
                apply_after: Duration::from_secs(5),
                drop_first: SyncMutex::new(0),
                reject: Vec::new(),
                sent: SyncMutex::new(VecDeque::new()),
            }
        }
        fn sent(&self) -> Vec<ResetType> {
            self.sent.lock().unwrap().iter().copied().collect()
        }
    }

    impl PowerApi for FakeSystem {
        async fn read_state(&self, _step: Step) -> Result<PowerState> {
            let mut state = self.state.lock().unwrap();
            if let Some((next, at)) = state.1.clone()
                && Instant::now() >= at
            {
                *state = (next, None);
            }
            Ok(state.0.clone())
        }
        async fn allowed_reset_types(&self) -> Result<Option<Vec<String>>> {
            Ok(self.allowed.clone())
        }
        async fn send_reset(&self, reset: ResetType) -> Result<()> {
            self.sent.lock().unwrap().push_back(reset);
            if self.reject.contains(&reset) {
                return Err(Error::ActionRejected { reset_type: reset, status: 400, message: "no".into() });
            }
            let mut drop_first = self.drop_first.lock().unwrap();
            if *drop_first > 0 {
                *drop_first -= 1;
                return Ok(());
            }
            let next = match reset {
                ResetType::GracefulShutdown | ResetType::ForceOff => PowerState::Off,
                _ => PowerState::On,
            };
            self.state.lock().unwrap().1 = Some((next, Instant::now() + self.apply_after));
            Ok(())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn power_on_of_a_system_already_on_sends_nothing() {
        let fake = FakeSystem::new(PowerState::On);
        let outcome = power_on(&fake, &Timing::default()).await.unwrap();
        assert!(outcome.was_no_op());
        assert!(fake.sent().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn power_on_waits_for_the_state_to_show() {
        let fake = FakeSystem::new(PowerState::Off);
        let outcome = power_on(&fake, &Timing::default()).await.unwrap();
        assert_eq!(outcome.sent, vec![ResetType::On]);
        assert!(outcome.elapsed >= Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn silently_dropped_power_on_is_sent_once_more() {
        let fake = FakeSystem::new(PowerState::Off);
        *fake.drop_first.lock().unwrap() = 1;
        let outcome = power_on(&fake, &Timing::default()).await.unwrap();
        assert_eq!(outcome.sent, vec![ResetType::On, ResetType::On]);
    }

    #[tokio::test(start_paused = true)]
    async fn action_dropped_twice_is_a_timeout_naming_both_sends() {
        let fake = FakeSystem::new(PowerState::Off);
        *fake.drop_first.lock().unwrap() = 2;
        let timing = Timing::default();
        let err = power_on(&fake, &timing).await.unwrap_err();
        match err {
            Error::TimedOutWaitingForState { expected, last_seen, sends, waited, .. } => {
                assert_eq!((expected, last_seen, sends), (PowerState::On, PowerState::Off, 2));
                assert!(waited >= timing.confirm_timeout);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(fake.sent().len(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn power_on_prefers_force_on_then_push_button_when_on_is_not_allowed() {
        let mut fake = FakeSystem::new(PowerState::Off);
        fake.allowed = Some(vec!["ForceOff".into(), "PushPowerButton".into()]);
        power_on(&fake, &Timing::default()).await.unwrap();
        assert_eq!(fake.sent(), vec![ResetType::PushPowerButton]);

        let mut fake = FakeSystem::new(PowerState::Off);
        fake.allowed = Some(vec!["PushPowerButton".into(), "ForceOn".into()]);
        power_on(&fake, &Timing::default()).await.unwrap();
        assert_eq!(fake.sent(), vec![ResetType::ForceOn]);
    }

    #[tokio::test(start_paused = true)]
    async fn power_on_without_any_usable_reset_type_is_not_supported() {
        let mut fake = FakeSystem::new(PowerState::Off);
        fake.allowed = Some(vec!["ForceOff".into()]);
        let err = power_on(&fake, &Timing::default()).await.unwrap_err();
        assert_eq!(err.metric_label(), "action_not_supported");
        assert!(fake.sent().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn graceful_shutdown_that_hangs_is_followed_by_force_off() {
        let mut fake = FakeSystem::new(PowerState::On);
        // The OS ignores the ACPI request: the graceful reset is dropped.
        *fake.drop_first.get_mut().unwrap() = 1;
        let timing = Timing::default();
        let outcome = power_off(&fake, &timing).await.unwrap();
        assert_eq!(outcome.sent, vec![ResetType::GracefulShutdown, ResetType::ForceOff]);
        assert!(outcome.elapsed >= timing.graceful_timeout);
    }

    #[tokio::test(start_paused = true)]
    async fn refused_graceful_shutdown_falls_back_to_force_off_and_both_refused_is_rejected() {
        let mut fake = FakeSystem::new(PowerState::On);
        fake.reject = vec![ResetType::GracefulShutdown];
        let outcome = power_off(&fake, &Timing::default()).await.unwrap();
        assert_eq!(outcome.sent, vec![ResetType::ForceOff]);

        let mut fake = FakeSystem::new(PowerState::On);
        fake.reject = vec![ResetType::GracefulShutdown, ResetType::ForceOff];
        let err = power_off(&fake, &Timing::default()).await.unwrap_err();
        assert!(matches!(err, Error::ActionRejected { reset_type: ResetType::ForceOff, status: 400, .. }), "{err:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn power_off_of_a_system_already_off_sends_nothing() {
        let fake = FakeSystem::new(PowerState::Off);
        assert!(power_off(&fake, &Timing::default()).await.unwrap().was_no_op());
        assert!(fake.sent().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn paused_system_is_not_powered_on_blindly() {
        let fake = FakeSystem::new(PowerState::Paused);
        let err = power_on(&fake, &Timing::default()).await.unwrap_err();
        assert_eq!(err.metric_label(), "unexpected_state");
    }
}
