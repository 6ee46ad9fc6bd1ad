//! Leader election through a `coordination.k8s.io/v1` Lease.
//!
//! One replica holds the Lease and acts; the others watch and take over
//! once it has not been renewed for its duration. Every write carries the
//! resourceVersion read, so two candidates can never both win a round.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::error::{Error, Result};

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
            let lease = Lease {
                metadata: ObjectMeta { name: Some(settings.name.clone()), ..ObjectMeta::default() },
                spec: Some(mine(0, None)),
            };
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
