//! Leader election through a `coordination.k8s.io/v1` Lease.
//!
//! One replica holds the Lease and acts; the others watch and take over
//! once it has not been renewed for its duration. Every write carries the
//! resourceVersion read, so two candidates can never both win a round.
//!
//! Renewal runs in its own task ([`spawn_renewal`]), so a slow BMC or API
//! call in the controller's loop never delays it. What may act is decided
//! by a [`Gate`]: open only until a deadline measured on this replica's own
//! monotonic clock from the moment the last successful renewal was sent,
//! and shut at once when a renewal fails or is refused.
//!
//! Who may take the lease and who may act is decided by the sans-IO
//! [`ironclaim_driver::lease`], on this replica's own monotonic clock; its
//! guarantees are this module's. The simulator runs the same code for each
//! of its replicas.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use ironclaim_core::transitions::TransitionLimits;
use ironclaim_driver::lease::{LeaseTimes, Observer, Record, Round, Tenure};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::serverclaim::FailureReason;
use kube::ResourceExt;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::provider::{Power, PowerError, PowerFuture};

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's name (its pod name).
    pub identity: String,
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
    /// The fleet's power budget this replica decides with, written on the
    /// Lease ([`POWER_BUDGET_ANNOTATION`]) so that `ironclaim explain`
    /// decides with the leader's.
    pub power_budget_watts: Option<f64>,
    /// The transition rates and the cap on power cycles this replica
    /// decides with, written on the Lease ([`TRANSITION_LIMITS_ANNOTATION`])
    /// for the same reason.
    pub transition_limits: TransitionLimits,
}

/// The Lease annotation that says the leader's fleet power budget, in
/// watts; absent when it has none.
pub const POWER_BUDGET_ANNOTATION: &str = "ironclaim.dev/power-budget-watts";

/// The Lease annotation that says the leader's transition limits, as JSON
/// (`{"rates":[{"scope":"fleet","per_minute":2}],"max_cycles_per_day":3}`);
/// absent when it has none.
pub const TRANSITION_LIMITS_ANNOTATION: &str = "ironclaim.dev/transition-limits";

/// The leader's transition limits, as its Lease says; none when the
/// annotation is absent or not what a leader writes.
pub fn transition_limits_of(lease: &Lease) -> TransitionLimits {
    lease.annotations().get(TRANSITION_LIMITS_ANNOTATION).and_then(|text| serde_json::from_str(text).ok()).unwrap_or_default()
}

/// The leader's fleet power budget, as its Lease says.
pub fn power_budget_of(lease: &Lease) -> Option<f64> {
    lease.annotations().get(POWER_BUDGET_ANNOTATION).and_then(|w| w.trim().parse::<f64>().ok()).filter(|w| w.is_finite() && *w > 0.0)
}

/// Writes what the holder decides with onto the Lease's annotations.
fn annotate(metadata: &mut ObjectMeta, settings: &LeaseSettings) {
    let annotations = metadata.annotations.get_or_insert_with(Default::default);
    match settings.power_budget_watts {
        Some(watts) => annotations.insert(POWER_BUDGET_ANNOTATION.to_owned(), watts.to_string()),
        None => annotations.remove(POWER_BUDGET_ANNOTATION),
    };
    match serde_json::to_string(&settings.transition_limits) {
        Ok(text) if !settings.transition_limits.is_empty() => annotations.insert(TRANSITION_LIMITS_ANNOTATION.to_owned(), text),
        _ => annotations.remove(TRANSITION_LIMITS_ANNOTATION),
    };
    if annotations.is_empty() {
        metadata.annotations = None;
    }
}

impl LeaseSettings {
    pub fn times(&self) -> LeaseTimes {
        LeaseTimes { duration: self.duration }
    }

    /// How often the holder renews ([`LeaseTimes::renew_every`]).
    pub fn renew_every(&self) -> Duration {
        self.times().renew_every()
    }

    /// How long after a renewal was sent this replica may act on it
    /// ([`LeaseTimes::renew_deadline`]).
    pub fn renew_deadline(&self) -> Duration {
        self.times().renew_deadline()
    }
}

/// Whether this replica may act right now. Cheap to clone; every clone
/// sees the same state.
#[derive(Clone, Debug)]
pub struct Gate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    /// Without leader election the gate is always open.
    always: bool,
    /// The origin of the tenure's times: this replica's monotonic clock.
    epoch: Instant,
    tenure: Mutex<Tenure>,
    changed: watch::Sender<u64>,
}

impl Gate {
    /// Always open: a replica that runs without leader election.
    pub fn always() -> Gate {
        Gate::build(true)
    }

    /// Shut until a renewal opens it.
    pub fn closed() -> Gate {
        Gate::build(false)
    }

    fn build(always: bool) -> Gate {
        let (changed, _) = watch::channel(0);
        Gate { inner: Arc::new(GateInner { always, epoch: Instant::now(), tenure: Mutex::new(Tenure::default()), changed }) }
    }

    /// True while this replica may act: it holds the lease and the lease
    /// is still valid by this replica's clock.
    pub fn acting(&self) -> bool {
        self.inner.always || self.tenure().acting(self.clock())
    }

    /// This replica's monotonic time, as the tenure counts it.
    fn clock(&self) -> Duration {
        self.inner.epoch.elapsed()
    }

    fn tenure(&self) -> Tenure {
        *self.inner.tenure.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn valid_until(&self) -> Option<Instant> {
        self.tenure().until().map(|until| self.inner.epoch + until)
    }

    /// Opens the gate: a renewal sent at `sent` succeeded, so this replica
    /// may act until the lease's renew deadline after it.
    pub fn grant(&self, sent: Instant, times: &LeaseTimes) {
        let sent = sent.saturating_duration_since(self.inner.epoch);
        self.inner.tenure.lock().unwrap_or_else(PoisonError::into_inner).granted(sent, times);
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Shuts the gate now (a renewal failed, was refused, or shutdown).
    pub fn revoke(&self) {
        self.inner.tenure.lock().unwrap_or_else(PoisonError::into_inner).revoked();
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Resolves once the gate is open.
    pub async fn gained(&self) {
        let mut changes = self.inner.changed.subscribe();
        while !self.acting() {
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Resolves once the gate is shut: revoked, or its validity ran out.
    /// Never resolves for a gate that is always open.
    pub async fn lost(&self) {
        if self.inner.always {
            return std::future::pending().await;
        }
        let mut changes = self.inner.changed.subscribe();
        loop {
            let Some(until) = self.valid_until().filter(|u| Instant::now() < *u) else { return };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                _ = changes.changed() => {}
            }
        }
    }
}

/// The power boundary, fenced by the lease: every power action is checked
/// against the [`Gate`] at the moment it is handed to the provider, so an
/// action decided while leading is refused once this replica no longer
/// leads by its own clock, however long ago it was decided and whichever
/// task (a claim, the sweep, a drain) carries it out. Reads pass through.
pub struct FencedPower {
    inner: std::sync::Arc<dyn Power>,
    gate: Gate,
}

impl FencedPower {
    pub fn new(inner: std::sync::Arc<dyn Power>, gate: Gate) -> Self {
        FencedPower { inner, gate }
    }

    fn fenced(&self, action: &str, server: &Server) -> std::result::Result<(), PowerError> {
        if self.gate.acting() {
            return Ok(());
        }
        tracing::warn!(server = %server.name_any(), action, "refused: this replica does not hold the lease");
        Err(PowerError {
            reason: FailureReason::PowerActionFailed,
            label: "not_leading",
            message: format!("{action} of server {} refused: this replica does not hold the lease", server.name_any()),
        })
    }
}

impl Power for FencedPower {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            self.fenced("power-on", server)?;
            self.inner.power_on(server).await
        })
    }

    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            self.fenced("power-off", server)?;
            self.inner.power_off(server).await
        })
    }

    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        self.inner.power_state(server)
    }

    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        self.inner.watts(server)
    }

    fn identity<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<crate::provider::SystemIdentity>> {
        self.inner.identity(server)
    }

    fn survey<'a>(
        &'a self,
        server: &'a Server,
        identity: bool,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = crate::provider::Survey> + Send + 'a>> {
        self.inner.survey(server, identity)
    }
}

/// Renews the lease every [`LeaseSettings::renew_every`] in its own task
/// and keeps `gate` open only while the last renewal holds; the `leader`
/// gauge follows the gate. Runs until the handle is aborted.
pub fn spawn_renewal(client: Client, settings: LeaseSettings, gate: Gate, metrics: Arc<Metrics>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut observer = Observer::default();
        let epoch = Instant::now();
        loop {
            let sent = Instant::now();
            let deadline = sent + settings.renew_deadline();
            let now = sent.saturating_duration_since(epoch);
            match tokio::time::timeout_at(deadline, try_acquire(&client, &settings, &mut observer, now)).await {
                Ok(Ok(true)) => gate.grant(sent, &settings.times()),
                Ok(Ok(false)) => gate.revoke(),
                Ok(Err(err)) => {
                    tracing::warn!(error = %err, "lease renewal failed; not acting until it succeeds");
                    metrics.error(err.metric_label());
                    gate.revoke();
                }
                Err(_) => {
                    tracing::warn!(
                        deadline_ms = settings.renew_deadline().as_millis() as u64,
                        "lease renewal timed out; not acting until it succeeds"
                    );
                    gate.revoke();
                }
            }
            metrics.leader.set(i64::from(gate.acting()));
            tokio::time::sleep_until(sent + settings.renew_every()).await;
        }
    })
}

/// Tries once to acquire or renew the lease; true while this replica holds it.
/// Another holder's lease is taken only once `observer` has watched its
/// record stand still for the lease's duration; `now` is this replica's
/// monotonic time.
///
/// # Errors
/// [`Error::LeaseFailed`] when the API server cannot be asked; a lost race
/// (409) is not an error, just `false`.
pub async fn try_acquire(client: &Client, settings: &LeaseSettings, observer: &mut Observer, now: Duration) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let failed = |source| Error::LeaseFailed { lease: format!("{}/{}", settings.namespace, settings.name), source };
    let wall = Timestamp::now();
    let seconds = i32::try_from(settings.duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let mine = |transitions: i32, acquired: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(seconds),
        acquire_time: acquired.or(Some(MicroTime(wall))),
        renew_time: Some(MicroTime(wall)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let Some(current) = api.get_opt(&settings.name).await.map_err(failed)? else {
        debug_assert_eq!(observer.round(&settings.identity, None, settings.duration, now), Round::Create);
        let mut lease = Lease { metadata: ObjectMeta { name: Some(settings.name.clone()), ..ObjectMeta::default() }, spec: Some(mine(0, None)) };
        annotate(&mut lease.metadata, settings);
        return match api.create(&PostParams::default(), &lease).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(source) => Err(failed(source)),
        };
    };
    let spec = current.spec.clone().unwrap_or_default();
    let held_for = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0));
    let record = Record {
        holder: spec.holder_identity.clone().unwrap_or_default(),
        renew_time: spec.renew_time.as_ref().map(|t| t.0.as_microsecond()),
        version: current.metadata.resource_version.clone(),
    };
    let next = match observer.round(&settings.identity, Some(&record), held_for, now) {
        Round::Renew => mine(spec.lease_transitions.unwrap_or(0), spec.acquire_time.clone()),
        Round::Take | Round::Create => mine(spec.lease_transitions.unwrap_or(0) + 1, None),
        Round::Wait => return Ok(false),
    };
    let mut lease = current;
    lease.spec = Some(next);
    annotate(&mut lease.metadata, settings);
    match api.replace(&settings.name, &PostParams::default(), &lease).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(source) => Err(failed(source)),
    }
}

/// Gives the lease up on shutdown so a successor need not wait it out.
pub async fn release(client: &Client, settings: &LeaseSettings) {
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let Ok(Some(mut lease)) = api.get_opt(&settings.name).await else { return };
    let Some(spec) = lease.spec.as_mut() else { return };
    if spec.holder_identity.as_deref() != Some(settings.identity.as_str()) {
        return;
    }
    spec.holder_identity = None;
    spec.renew_time = None;
    let _ = api.replace(&settings.name, &PostParams::default(), &lease).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_granted_gate_shuts_by_its_own_clock_when_no_renewal_follows() {
        let gate = Gate::closed();
        assert!(!gate.acting());
        gate.grant(Instant::now(), &lasting(6));
        assert!(gate.acting());
        let started = Instant::now();
        gate.lost().await;
        assert_eq!(started.elapsed(), Duration::from_secs(4));
        assert!(!gate.acting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoked_gate_shuts_at_once_and_wakes_whoever_waits_for_it() {
        let gate = Gate::closed();
        gate.grant(Instant::now(), &lasting(90));
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.lost().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        gate.revoke();
        tokio::time::timeout(Duration::from_millis(10), waiter).await.expect("lost() resolves on revoke").unwrap();
        assert!(!gate.acting());
    }

    /// A lease of `secs`: acting lasts two thirds of it after a renewal.
    fn lasting(secs: u64) -> LeaseTimes {
        LeaseTimes { duration: Duration::from_secs(secs) }
    }

    /// Counts what reaches the provider.
    #[derive(Default)]
    struct Counting {
        calls: Mutex<Vec<&'static str>>,
    }

    impl Power for Counting {
        fn power_on<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, ()> {
            self.calls.lock().unwrap().push("on");
            Box::pin(async { Ok(()) })
        }
        fn power_off<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, ()> {
            self.calls.lock().unwrap().push("off");
            Box::pin(async { Ok(()) })
        }
        fn power_state<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, PowerState> {
            self.calls.lock().unwrap().push("read");
            Box::pin(async { Ok(PowerState::On) })
        }
        fn watts<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, Option<f64>> {
            Box::pin(async { Ok(None) })
        }
    }

    fn server() -> Server {
        Server::new(
            "r1-u01",
            serde_json::from_value(serde_json::json!({"bmc": {"address": "https://bmc.invalid/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}}, "hardware": {"cpu": "1", "memory": "1Gi"}})).unwrap(),
        )
    }

    /// Issue 14, hole 4: an ex-leader's detached work (the sweep, a drain,
    /// a claim's power task) kept powering servers off. Fenced at the
    /// power boundary, an action decided while leading is refused once the
    /// lease ran out by this replica's clock, and never reaches the BMC.
    #[tokio::test(start_paused = true)]
    async fn a_power_action_decided_while_leading_is_refused_once_the_lease_ran_out() {
        let counting = std::sync::Arc::new(Counting::default());
        let gate = Gate::closed();
        let fenced = FencedPower::new(counting.clone(), gate.clone());
        gate.grant(Instant::now(), &lasting(15));
        let s = server();
        fenced.power_off(&s).await.expect("leading: sent");
        tokio::time::advance(Duration::from_secs(10)).await;
        let refused = fenced.power_off(&s).await.expect_err("the lease ran out");
        assert_eq!(refused.label, "not_leading");
        assert!(fenced.power_on(&s).await.is_err());
        gate.grant(Instant::now(), &lasting(15));
        gate.revoke();
        assert!(fenced.power_off(&s).await.is_err(), "revoked");
        // Reads are not actions: they pass.
        assert_eq!(fenced.power_state(&s).await.unwrap(), PowerState::On);
        assert_eq!(*counting.calls.lock().unwrap(), ["off", "read"]);
        // Without leader election every action passes.
        let always = FencedPower::new(counting.clone(), Gate::always());
        always.power_on(&s).await.unwrap();
    }

    /// The same hole through the claims' own path: the sweep's release of an
    /// orphaned server by a replica that no longer leads (its gate ran out
    /// mid-sweep) reads the BMC but sends no power-off.
    #[tokio::test(start_paused = true)]
    async fn an_ex_leaders_sweep_releases_no_orphan_by_powering_it_off() {
        let counting = std::sync::Arc::new(Counting::default());
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let gate = Gate::closed();
        let claims = crate::claims::Claims::new(
            client,
            counting.clone(),
            crate::claims::ClaimSettings::default(),
            std::sync::Arc::new(Metrics::new()),
            crate::events::Events::disabled(),
        )
        .with_gate(gate.clone());
        gate.grant(Instant::now(), &LeaseTimes { duration: Duration::from_millis(1500) });
        tokio::time::advance(Duration::from_secs(2)).await;
        let result = claims.release_orphan(&server(), "gone-claim", false).await;
        assert!(result.is_err(), "an ex-leader must not release: {result:?}");
        assert!(!counting.calls.lock().unwrap().contains(&"off"), "powered off by an ex-leader: {:?}", counting.calls.lock().unwrap());
    }

    #[test]
    fn without_leader_election_the_gate_is_always_open() {
        let gate = Gate::always();
        gate.revoke();
        assert!(gate.acting());
    }
}
