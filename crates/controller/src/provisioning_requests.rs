//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`): read every few seconds
//! where their CRD is installed. Each pod set (a PodTemplate and a count)
//! becomes that many stand-in pods of one gang ([`ironclaim_core::gang`]),
//! named `REQUEST-SET-I` in the request's namespace.
//!
//! - `best-effort-atomic-scale-up.autoscaling.x-k8s.io`: the stand-ins are
//!   pending pods of every decision, so servers are powered on for all of
//!   them or for none. Once every stand-in fits a Ready node the request is
//!   `Provisioned`, and the room stays booked (the stand-ins stay, and the
//!   nodes they would land on are not scaled down) for
//!   [`BOOKING`], less one stand-in per pod that consumes the request
//!   (`autoscaling.x-k8s.io/consume-provisioning-request`); then
//!   `BookingExpired`.
//! - `check-capacity.autoscaling.x-k8s.io`: the stand-ins are only checked
//!   against the nodes there are; nothing is powered on. `Provisioned`
//!   says whether they fit (`CapacityIsFound`, `CapacityIsNotFound`).
//!
//! Read every 5 s. Conditions written: `Accepted`, `Provisioned`, `Failed` (a pod template
//! that does not exist or cannot be read, a negative count) and
//! `BookingExpired`. Requests of any other class are another autoscaler's:
//! neither read nor written. Only the leader writes status; every replica
//! keeps the stand-ins.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironclaim_core::model::{Owner, Pod as CorePod, PodPhase};
use ironclaim_core::{Outcome, provision};
use ironclaim_k8s::provisioning_request::{
    ACCEPTED, ATOMIC_SCALE_UP, BOOKING_EXPIRED, CHECK_CAPACITY, FAILED, PROVISIONED, ProvisioningRequest, ProvisioningRequestStatus,
};
use k8s_openapi::api::core::v1::PodTemplate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::index::Index;
use crate::upstream::{Reader, condition};

/// How long provisioned room stays booked for a request's pods.
pub const BOOKING: Duration = Duration::from_secs(600);
/// The most stand-ins one request may ask for.
pub const MAX_PODS: i64 = 5_000;

/// A request as read in one pass.
struct Read {
    request: ProvisioningRequest,
    key: String,
    /// Its stand-ins, or why there are none: (reason, message) for the
    /// `Failed` condition; None when the API did not answer (the last
    /// pass's stand-ins stay and the status is left as it is).
    pods: Result<Vec<CorePod>, Option<(&'static str, String)>>,
}

/// Reads the requests and writes their status, every [`EVERY`].
pub struct ProvisioningRequests {
    client: Client,
    index: Arc<Mutex<Index>>,
    leading: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Reader for ProvisioningRequests {
    const API: &'static str = "ProvisioningRequest (autoscaling.x-k8s.io/v1)";
    const EVERY: Duration = Duration::from_secs(5);

    fn pass(&self) -> impl std::future::Future<Output = Result<(), kube::Error>> + Send {
        ProvisioningRequests::pass(self)
    }

    fn forget(&self) {
        self.index.lock().unwrap_or_else(PoisonError::into_inner).gang_pods.clear();
    }
}

impl ProvisioningRequests {
    pub fn new(client: Client, index: Arc<Mutex<Index>>, leading: Arc<dyn Fn() -> bool + Send + Sync>) -> Self {
        ProvisioningRequests { client, index, leading }
    }

    /// One pass: read, keep the stand-ins, write the status.
    pub async fn pass(&self) -> Result<(), kube::Error> {
        let api: Api<ProvisioningRequest> = Api::all(self.client.clone());
        let ours: Vec<ProvisioningRequest> = api
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|r| [ATOMIC_SCALE_UP, CHECK_CAPACITY].contains(&r.spec.provisioning_class_name.as_str()))
            .filter(|r| r.holds(FAILED).is_none() && r.holds(BOOKING_EXPIRED).is_none())
            .collect();
        let mut read = Vec::with_capacity(ours.len());
        for request in ours {
            read.push(self.read(request).await);
        }
        let now = jiff::Timestamp::now();
        let snapshot = {
            let mut index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            let mut consumed: BTreeMap<String, usize> = BTreeMap::new();
            // A pod's gang is the request it consumes, `namespace/name`.
            for e in index.pods.values() {
                if let Some(request) = &e.pod.gang
                    && !matches!(e.pod.phase, PodPhase::Succeeded | PodPhase::Failed)
                {
                    *consumed.entry(request.clone()).or_default() += 1;
                }
            }
            let mut gang_pods = BTreeMap::new();
            for r in &read {
                match &r.pods {
                    Ok(pods) if r.request.spec.provisioning_class_name == ATOMIC_SCALE_UP && !booking_over(&r.request, now) => {
                        // Each pod that consumes the request takes one stand-in's place.
                        let left = pods.len().saturating_sub(consumed.get(&r.key).copied().unwrap_or(0));
                        gang_pods.extend(pods.iter().take(left).map(|p| (p.key(), std::sync::Arc::new(p.clone()))));
                    }
                    Err(None) => gang_pods
                        .extend(index.gang_pods.iter().filter(|(_, p)| p.gang.as_deref() == Some(&r.key)).map(|(k, p)| (k.clone(), p.clone()))),
                    _ => {}
                }
            }
            index.gang_pods = gang_pods;
            let now_s = now.as_second().max(0) as u64;
            index.snapshot(now_s, ironclaim_driver::backoff::FailureBackoff { base_s: 60, max_s: 3600 }).0
        };
        if !(self.leading)() {
            return Ok(());
        }
        // The check-capacity stand-ins join the decision only here: they
        // are checked, never powered on for.
        let mut checked = snapshot;
        for r in read.iter().filter(|r| r.request.spec.provisioning_class_name == CHECK_CAPACITY && r.request.holds(PROVISIONED).is_none()) {
            if let Ok(pods) = &r.pods {
                checked.pods.extend(pods.iter().cloned());
            }
        }
        let now_s = now.as_second().max(0) as u64;
        let plan = provision(&checked, now_s);
        for r in read.iter().filter(|r| !matches!(r.pods, Err(None))) {
            let status = status_of(r, &plan, now);
            let old = r.request.status.clone().unwrap_or_default();
            let merged = merge(&old, status);
            if merged != old {
                let api: Api<ProvisioningRequest> = Api::namespaced(self.client.clone(), r.request.namespace().as_deref().unwrap_or("default"));
                let patch = serde_json::json!({"status": {"conditions": merged.conditions}});
                if let Err(err) = api.patch_status(&r.request.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                    tracing::warn!(request = %r.key, error = %err, "writing the ProvisioningRequest's status failed");
                }
            }
        }
        Ok(())
    }

    async fn read(&self, request: ProvisioningRequest) -> Read {
        let namespace = request.namespace().unwrap_or_else(|| "default".into());
        let name = request.name_any();
        let key = format!("{namespace}/{name}");
        let mut pods = Vec::new();
        let templates: Api<PodTemplate> = Api::namespaced(self.client.clone(), &namespace);
        for (j, set) in request.spec.pod_sets.iter().enumerate() {
            let at = format!("spec.podSets[{j}]");
            if set.count < 0 || pods.len() as i64 + i64::from(set.count) > MAX_PODS {
                let why = format!("{at}.count: {} pods; at most {MAX_PODS} in all", set.count);
                return Read { request, key, pods: Err(Some(("InvalidCount", why))) };
            }
            let template_name = &set.pod_template_ref.name;
            let template = match templates.get(template_name).await {
                Ok(t) => t.template.unwrap_or_default(),
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    let why = format!("{at}.podTemplateRef: PodTemplate {namespace}/{template_name} not found");
                    return Read { request, key, pods: Err(Some(("PodTemplateNotFound", why))) };
                }
                Err(err) => {
                    tracing::warn!(request = %key, error = %err, "reading a ProvisioningRequest's PodTemplate failed");
                    return Read { request, key, pods: Err(None) };
                }
            };
            let path = format!("PodTemplate {namespace}/{template_name}: template");
            for i in 0..set.count {
                match ironclaim_k8s::pod_from_template(&template, &namespace, &format!("{name}-{j}-{i}"), &path) {
                    Ok(mut pod) => {
                        pod.gang = Some(key.clone());
                        pod.owner = Some(Owner { kind: "ProvisioningRequest".into(), name: name.clone() });
                        pod.workload = Some(name.clone());
                        pods.push(pod);
                    }
                    Err(err) => return Read { request, key, pods: Err(Some(("InvalidPodTemplate", format!("{path}: {err}")))) },
                }
            }
        }
        Read { request, key, pods: Ok(pods) }
    }
}

/// Whether a provisioned request's booking is over.
fn booking_over(request: &ProvisioningRequest, now: jiff::Timestamp) -> bool {
    request.holds(PROVISIONED).is_some_and(|c| now.duration_since(c.last_transition_time.0).as_secs() >= BOOKING.as_secs() as i64)
}

/// The conditions a request should show now.
fn status_of(r: &Read, plan: &ironclaim_core::Provisioning, now: jiff::Timestamp) -> Vec<Condition> {
    let generation = r.request.metadata.generation;
    let pods = match &r.pods {
        Err(Some((reason, message))) => return vec![condition(FAILED, true, reason, message.clone(), generation)],
        Err(None) => return Vec::new(),
        Ok(pods) => pods,
    };
    let class = r.request.spec.provisioning_class_name.as_str();
    let mut out =
        vec![condition(ACCEPTED, true, "Accepted", format!("{} pod(s) in {} pod set(s)", pods.len(), r.request.spec.pod_sets.len()), generation)];
    if r.request.holds(PROVISIONED).is_some() {
        if booking_over(&r.request, now) {
            out.push(condition(BOOKING_EXPIRED, true, "BookingExpired", format!("the room was booked for {} s", BOOKING.as_secs()), generation));
        }
        return out;
    }
    let decisions: Vec<&Outcome> = pods.iter().filter_map(|p| plan.decision(&p.key()).map(|d| &d.outcome)).collect();
    let existing = decisions.iter().filter(|o| matches!(o, Outcome::Existing { .. })).count();
    let unplaced = decisions.iter().find_map(|o| if let Outcome::Unschedulable { reason } = o { Some(reason.to_string()) } else { None });
    let on_the_way: std::collections::BTreeSet<&str> = decisions
        .iter()
        .filter_map(|o| match o {
            Outcome::NewClaim { server, .. } | Outcome::InFlight { server, .. } => Some(server.as_str()),
            _ => None,
        })
        .collect();
    let all = pods.len();
    let (ok, reason, message) = if pods.is_empty() || existing == all {
        let reason = if class == CHECK_CAPACITY { "CapacityIsFound" } else { "Provisioned" };
        (true, reason, format!("all {all} pod(s) fit Ready nodes; the room is booked for {} s", BOOKING.as_secs()))
    } else if class == CHECK_CAPACITY {
        (false, "CapacityIsNotFound", format!("{existing} of {all} pod(s) fit Ready nodes; nothing is powered on for a capacity check"))
    } else if let Some(why) = unplaced {
        (false, "CapacityIsNotFound", why)
    } else {
        (false, "Provisioning", format!("{existing} of {all} pod(s) fit Ready nodes; {} server(s) on their way for the rest", on_the_way.len()))
    };
    out.push(condition(PROVISIONED, ok, reason, message, generation));
    out
}

/// The old status with `conditions` written over it, by type: a condition
/// whose status holds keeps the time it began to; one with nothing new is
/// left exactly as it was.
fn merge(old: &ProvisioningRequestStatus, conditions: Vec<Condition>) -> ProvisioningRequestStatus {
    let mut out = old.clone();
    for mut c in conditions {
        match out.conditions.iter_mut().find(|o| o.type_ == c.type_) {
            Some(o) if o.status == c.status && o.reason == c.reason && o.message == c.message && o.observed_generation == c.observed_generation => {}
            Some(o) => {
                if o.status == c.status {
                    c.last_transition_time = o.last_transition_time.clone();
                }
                *o = c;
            }
            None => out.conditions.push(c),
        }
    }
    out
}
