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
//! # Guarantees
//! A renewal sent at local time `t` writes a `renewTime` no earlier than
//! `t`; another candidate may take the lease only once its clock reads
//! `renewTime + duration`. The gate closes at `t + renew_deadline`, a third
//! of the duration before that, so the two never act at once unless the
//! clocks drift apart by more than that third.

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

use crate::error::{Error, Result};
use crate::metrics::Metrics;

#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub namespace: String,
    pub name: String,
    /// This replica's name (its pod name).
    pub identity: String,
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
}

impl LeaseSettings {
    /// How often the holder renews: a third of the duration.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// How long after a renewal was sent this replica may act on it: two
    /// thirds of the duration, leaving a third for clock drift and for the
    /// renewal's own round-trip.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
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
    valid_until: Mutex<Option<Instant>>,
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
        Gate { inner: Arc::new(GateInner { always, valid_until: Mutex::new(None), changed }) }
    }

    /// True while this replica may act: it holds the lease and the lease
    /// is still valid by this replica's clock.
    pub fn acting(&self) -> bool {
        self.inner.always || self.valid_until().is_some_and(|until| Instant::now() < until)
    }

    fn valid_until(&self) -> Option<Instant> {
        *self.inner.valid_until.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Opens the gate until `until` (a renewal succeeded).
    pub fn grant(&self, until: Instant) {
        *self.inner.valid_until.lock().unwrap_or_else(PoisonError::into_inner) = Some(until);
        self.inner.changed.send_modify(|n| *n += 1);
    }

    /// Shuts the gate now (a renewal failed, was refused, or shutdown).
    pub fn revoke(&self) {
        *self.inner.valid_until.lock().unwrap_or_else(PoisonError::into_inner) = None;
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

/// Renews the lease every [`LeaseSettings::renew_every`] in its own task
/// and keeps `gate` open only while the last renewal holds; the `leader`
/// gauge follows the gate. Runs until the handle is aborted.
pub fn spawn_renewal(client: Client, settings: LeaseSettings, gate: Gate, metrics: Arc<Metrics>) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let sent = Instant::now();
            let deadline = sent + settings.renew_deadline();
            match tokio::time::timeout_at(deadline, try_acquire(&client, &settings)).await {
                Ok(Ok(true)) => gate.grant(deadline),
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
///
/// # Errors
/// [`Error::LeaseFailed`] when the API server cannot be asked; a lost race
/// (409) is not an error, just `false`.
pub async fn try_acquire(client: &Client, settings: &LeaseSettings) -> Result<bool> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &settings.namespace);
    let failed = |source| Error::LeaseFailed { lease: format!("{}/{}", settings.namespace, settings.name), source };
    let now = Timestamp::now();
    let seconds = i32::try_from(settings.duration.as_secs()).unwrap_or(i32::MAX).max(1);
    let mine = |transitions: i32, acquired: Option<MicroTime>| LeaseSpec {
        holder_identity: Some(settings.identity.clone()),
        lease_duration_seconds: Some(seconds),
        acquire_time: acquired.or(Some(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    };
    let current = match api.get_opt(&settings.name).await.map_err(failed)? {
        Some(lease) => lease,
        None => {
            let lease = Lease { metadata: ObjectMeta { name: Some(settings.name.clone()), ..ObjectMeta::default() }, spec: Some(mine(0, None)) };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(source) => Err(failed(source)),
            };
        }
    };
    let spec = current.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.clone().unwrap_or_default();
    let held_for = Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(seconds)).unwrap_or(0));
    let renewed = spec.renew_time.as_ref().map(|t| t.0).unwrap_or(Timestamp::UNIX_EPOCH);
    let expired = now.duration_since(renewed).unsigned_abs() >= held_for || now < renewed && holder.is_empty();
    let next = if holder == settings.identity {
        mine(spec.lease_transitions.unwrap_or(0), spec.acquire_time.clone())
    } else if holder.is_empty() || expired {
        mine(spec.lease_transitions.unwrap_or(0) + 1, None)
    } else {
        return Ok(false);
    };
    let mut lease = current;
    lease.spec = Some(next);
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
        gate.grant(Instant::now() + Duration::from_secs(4));
        assert!(gate.acting());
        let started = Instant::now();
        gate.lost().await;
        assert_eq!(started.elapsed(), Duration::from_secs(4));
        assert!(!gate.acting());
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoked_gate_shuts_at_once_and_wakes_whoever_waits_for_it() {
        let gate = Gate::closed();
        gate.grant(Instant::now() + Duration::from_secs(60));
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.lost().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        gate.revoke();
        tokio::time::timeout(Duration::from_millis(10), waiter).await.expect("lost() resolves on revoke").unwrap();
        assert!(!gate.acting());
    }

    #[test]
    fn a_replica_stops_acting_a_third_of_the_lease_before_another_may_take_it() {
        let settings = LeaseSettings { namespace: "ns".into(), name: "l".into(), identity: "a".into(), duration: Duration::from_secs(15) };
        assert_eq!(settings.renew_deadline(), Duration::from_secs(10));
        assert!(settings.renew_every() < settings.renew_deadline());
    }

    #[test]
    fn without_leader_election_the_gate_is_always_open() {
        let gate = Gate::always();
        gate.revoke();
        assert!(gate.acting());
    }
}
