//! CapacityBuffers (`autoscaling.x-k8s.io/v1beta1`): read every few
//! seconds where their CRD is installed, each resolved to its chunk (a
//! PodTemplate, or the template of a Deployment, StatefulSet or
//! ReplicaSet) and its count, the room they ask for added to the headroom
//! of the ServerPool a chunk would be opened in ([`ironclaim_core::buffer`]),
//! and their status written back as the API defines it:
//!
//! - `ReadyForProvisioning`: True (`Resolved`) once the chunk and the count
//!   are known; False with `PodTemplateNotFound`, `ScalableRefNotFound`,
//!   `UnsupportedStrategy`, `NoServerPool` or `ResolutionFailed`, and why.
//! - `Provisioning`: True with `FitsExistingCapacity` when the pool's free
//!   capacity holds its headroom, `RequiresNewCapacity` while spares are
//!   powered on for it; False with `BufferEmpty` for a count of zero.
//! - `replicas`, `podTemplateRef` (for a buffer that names one),
//!   `provisioningStrategy`.
//!
//! Without the CRD nothing is read and nothing is added. Only the leader
//! writes status; every replica keeps the rooms, so a new leader decides
//! with them at once.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironclaim_core::buffer::{Buffer, Room};
use ironclaim_core::disruption::{Action, disrupt};
use ironclaim_k8s::capacity_buffer::{self, ACTIVE_CAPACITY, CapacityBuffer, CapacityBufferStatus, LocalRef};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{PodTemplate, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::index::Index;
use crate::upstream::{Reader, condition};

/// The reason of a resolution the API did not answer.
const UNANSWERED: &str = "Unanswered";

/// A buffer as resolved in one pass.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    pub namespace: String,
    pub name: String,
    /// Its chunk and count, or (reason, message) of why not.
    pub outcome: Result<(Buffer, bool), (&'static str, String)>,
    /// The API failed to answer (not a 404): the room of the last pass
    /// stays, and the status is left as it is.
    pub unanswered: bool,
    pub template_ref: Option<String>,
}

/// Reads the buffers and writes their status, every [`EVERY`].
pub struct Buffers {
    client: Client,
    index: Arc<Mutex<Index>>,
    leading: Arc<dyn Fn() -> bool + Send + Sync>,
}

impl Reader for Buffers {
    const API: &'static str = "CapacityBuffer (autoscaling.x-k8s.io/v1beta1)";
    const EVERY: Duration = Duration::from_secs(5);

    fn pass(&self) -> impl std::future::Future<Output = Result<(), kube::Error>> + Send {
        Buffers::pass(self)
    }

    fn forget(&self) {
        self.index.lock().unwrap_or_else(PoisonError::into_inner).buffer_rooms.clear();
    }
}

impl Buffers {
    pub fn new(client: Client, index: Arc<Mutex<Index>>, leading: Arc<dyn Fn() -> bool + Send + Sync>) -> Self {
        Buffers { client, index, leading }
    }

    /// One pass: read, resolve, keep the rooms, write the status.
    pub async fn pass(&self) -> Result<(), kube::Error> {
        let api: Api<CapacityBuffer> = Api::all(self.client.clone());
        let buffers = api.list(&ListParams::default()).await?.items;
        if buffers.is_empty() {
            self.index.lock().unwrap_or_else(PoisonError::into_inner).buffer_rooms.clear();
            return Ok(());
        }
        let mut resolved = Vec::with_capacity(buffers.len());
        for b in &buffers {
            resolved.push(self.resolve(b).await);
        }
        let now = jiff::Timestamp::now().as_second().max(0) as u64;
        // The snapshot without any buffer's room, taken under the lock; the
        // rest is worked out without holding it.
        let mut snapshot = {
            let mut index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            let kept = std::mem::take(&mut index.buffer_rooms);
            let (snapshot, _) = index.snapshot(now, ironclaim_driver::backoff::FailureBackoff { base_s: 60, max_s: 3600 });
            index.buffer_rooms = kept;
            snapshot
        };
        let chunks: Vec<Buffer> = resolved.iter().filter_map(|r| r.outcome.as_ref().ok().map(|(b, _)| b.clone())).collect();
        let mut rooms = ironclaim_core::buffer::rooms(&snapshot, &chunks);
        {
            let mut index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            // A buffer the API did not answer for keeps its last room.
            for r in resolved.iter().filter(|r| r.unanswered) {
                let key = format!("{}/{}", r.namespace, r.name);
                rooms.extend(index.buffer_rooms.iter().filter(|x| x.buffer == key).cloned());
            }
            index.buffer_rooms = rooms.clone();
        }
        if !(self.leading)() {
            return Ok(());
        }
        ironclaim_core::buffer::apply(&mut snapshot, &rooms);
        let plan = disrupt(&snapshot, now);
        for (b, r) in buffers.iter().zip(&resolved).filter(|(_, r)| !r.unanswered) {
            let room = rooms.iter().find(|x| x.buffer == format!("{}/{}", r.namespace, r.name));
            let mut status = status_of(b, r, room, &plan);
            // A condition that still holds keeps the time it began to.
            for c in &mut status.conditions {
                if let Some(old) = b.status.as_ref().and_then(|s| s.conditions.iter().find(|o| o.type_ == c.type_ && o.status == c.status)) {
                    c.last_transition_time = old.last_transition_time.clone();
                }
            }
            if b.status.as_ref().is_none_or(|old| differs(old, &status)) {
                let api: Api<CapacityBuffer> = Api::namespaced(self.client.clone(), &r.namespace);
                // Every field named, null when unset: a merge patch clears
                // what no longer holds.
                let patch = serde_json::json!({"status": {
                    "replicas": status.replicas,
                    "podTemplateRef": status.pod_template_ref,
                    "podTemplateGeneration": status.pod_template_generation,
                    "provisioningStrategy": status.provisioning_strategy,
                    "conditions": status.conditions,
                }});
                if let Err(err) = api.patch_status(&r.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    tracing::warn!(buffer = %format!("{}/{}", r.namespace, r.name), error = %err, "writing the CapacityBuffer's status failed");
                }
            }
        }
        Ok(())
    }

    async fn resolve(&self, b: &CapacityBuffer) -> Resolved {
        let namespace = b.namespace().unwrap_or_else(|| "default".into());
        let name = b.name_any();
        let template_ref = b.spec.pod_template_ref.as_ref().map(|r| r.name.clone());
        let outcome = self.chunk_of(b, &namespace, &name).await;
        let unanswered = matches!(&outcome, Err((reason, _)) if *reason == UNANSWERED);
        Resolved { namespace, name, outcome, template_ref, unanswered }
    }

    async fn chunk_of(&self, b: &CapacityBuffer, namespace: &str, name: &str) -> Result<(Buffer, bool), (&'static str, String)> {
        let spec = &b.spec;
        let strategy = spec.provisioning_strategy.as_deref().unwrap_or(ACTIVE_CAPACITY);
        if strategy != ACTIVE_CAPACITY {
            return Err(("UnsupportedStrategy", format!("provisioningStrategy {strategy:?}: ironclaim keeps {ACTIVE_CAPACITY:?} only")));
        }
        let missing = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 404);
        let (template, replicas, path): (PodTemplateSpec, Option<i32>, String) = match (&spec.pod_template_ref, &spec.scalable_ref) {
            (Some(r), None) => {
                let api: Api<PodTemplate> = Api::namespaced(self.client.clone(), namespace);
                match api.get(&r.name).await {
                    Ok(t) => (t.template.unwrap_or_default(), None, format!("PodTemplate {namespace}/{}: template", r.name)),
                    Err(e) if missing(&e) => return Err(("PodTemplateNotFound", format!("PodTemplate {namespace}/{} not found", r.name))),
                    Err(e) => return Err((UNANSWERED, format!("reading PodTemplate {namespace}/{}: {e}", r.name))),
                }
            }
            (None, Some(r)) if r.api_group.is_empty() || r.api_group == "apps" => {
                let at = format!("{} {namespace}/{}", r.kind, r.name);
                let got = match r.kind.as_str() {
                    "Deployment" => Api::<Deployment>::namespaced(self.client.clone(), namespace)
                        .get(&r.name)
                        .await
                        .map(|d| Some((d.spec.template, d.spec.replicas.unwrap_or(1)))),
                    "StatefulSet" => Api::<StatefulSet>::namespaced(self.client.clone(), namespace)
                        .get(&r.name)
                        .await
                        .map(|d| Some((d.spec.template, d.spec.replicas.unwrap_or(1)))),
                    "ReplicaSet" => Api::<ReplicaSet>::namespaced(self.client.clone(), namespace)
                        .get(&r.name)
                        .await
                        .map(|d| d.spec.template.map(|t| (t, d.spec.replicas.unwrap_or(1)))),
                    other => return Err(("ResolutionFailed", format!("scalableRef kind {other:?}: Deployment, StatefulSet or ReplicaSet"))),
                };
                match got {
                    Ok(Some((t, n))) => (t, Some(n), format!("{at}: spec.template")),
                    Ok(None) => return Err(("ResolutionFailed", format!("{at} has no template"))),
                    Err(e) if missing(&e) => return Err(("ScalableRefNotFound", format!("{at} not found"))),
                    Err(e) => return Err((UNANSWERED, format!("reading {at}: {e}"))),
                }
            }
            (None, Some(r)) => return Err(("ResolutionFailed", format!("scalableRef apiGroup {:?}: apps only", r.api_group))),
            _ => return Err(("ResolutionFailed", "exactly one of spec.podTemplateRef and spec.scalableRef".into())),
        };
        let chunk = ironclaim_k8s::pod_from_template(&template, namespace, &format!("{name}-chunk"), &path)
            .map_err(|e| ("ResolutionFailed", format!("{path}: {e}")))?;
        let count = capacity_buffer::count(spec, replicas, &chunk.requests).map_err(|e| ("ResolutionFailed", e))?;
        Ok((Buffer { namespace: namespace.into(), name: name.into(), chunk, chunks: count.chunks }, count.limited))
    }
}

/// The status a buffer should show.
fn status_of(b: &CapacityBuffer, r: &Resolved, room: Option<&Room>, plan: &ironclaim_core::disruption::Disruption) -> CapacityBufferStatus {
    let generation = b.metadata.generation;
    let mut status = CapacityBufferStatus {
        provisioning_strategy: Some(b.spec.provisioning_strategy.clone().unwrap_or_else(|| ACTIVE_CAPACITY.into())),
        ..Default::default()
    };
    match &r.outcome {
        Err((reason, message)) => {
            status.conditions.push(condition(capacity_buffer::READY_FOR_PROVISIONING, false, reason, message.clone(), generation));
        }
        Ok((buffer, limited)) => {
            status.replicas = Some(i32::try_from(buffer.chunks).unwrap_or(i32::MAX));
            status.pod_template_ref = r.template_ref.clone().map(|name| LocalRef { name });
            let pool = room.and_then(|x| x.pool.clone());
            match (&pool, room.and_then(|x| x.unplaceable.clone())) {
                (None, Some(why)) => {
                    status.conditions.push(condition(capacity_buffer::READY_FOR_PROVISIONING, false, "NoServerPool", why, generation));
                }
                _ => status.conditions.push(condition(
                    capacity_buffer::READY_FOR_PROVISIONING,
                    true,
                    "Resolved",
                    format!("{} chunk(s) of {}", buffer.chunks, buffer.chunk.requests),
                    generation,
                )),
            }
            if buffer.chunks == 0 {
                status.conditions.push(condition(capacity_buffer::PROVISIONING, false, "BufferEmpty", "no chunks to keep".into(), generation));
            } else if let Some(pool) = pool {
                let powering = plan.actions.iter().any(|a| matches!(a, Action::PowerOnForHeadroom { pool: p, .. } if *p == pool));
                let short = plan.held.iter().find(|h| h.why.contains(&format!("ServerPool {pool} is short of its headroom")));
                let (reason, message) = match (powering, short) {
                    (true, _) => ("RequiresNewCapacity", format!("kept in ServerPool {pool}'s headroom: spares powering on")),
                    (false, Some(h)) => ("RequiresNewCapacity", h.why.clone()),
                    (false, None) => ("FitsExistingCapacity", format!("kept in ServerPool {pool}'s headroom: its free capacity holds it")),
                };
                status.conditions.push(condition(capacity_buffer::PROVISIONING, true, reason, message, generation));
            }
            if *limited {
                // Not LimitedByQuotas: that condition speaks of namespace
                // ResourceQuotas, which ironclaim does not read.
                if let Some(ready) = status.conditions.iter_mut().find(|c| c.type_ == capacity_buffer::READY_FOR_PROVISIONING && c.status == "True") {
                    ready.message.push_str("; spec.limits cut the count");
                }
            }
        }
    }
    status
}

/// Whether the status to write says something the old one does not
/// (transition times aside: a condition keeps its time while it holds).
fn differs(old: &CapacityBufferStatus, new: &CapacityBufferStatus) -> bool {
    let strip = |s: &CapacityBufferStatus| {
        let mut s = s.clone();
        for c in &mut s.conditions {
            c.last_transition_time = Time(jiff::Timestamp::UNIX_EPOCH);
        }
        s
    };
    strip(old) != strip(new)
}
