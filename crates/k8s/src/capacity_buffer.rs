//! `CapacityBuffer` (`autoscaling.x-k8s.io/v1beta1`), the API Cluster
//! Autoscaler and Karpenter implement for warm capacity, as ironclaim reads
//! it: the shape of one chunk (a PodTemplate, or the template of a
//! Deployment, StatefulSet or ReplicaSet) and how many chunks to keep.
//! The CRD is theirs; ironclaim installs none.

use ironclaim_core::Resources;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The only provisioning strategy the API defines, and the default.
pub const ACTIVE_CAPACITY: &str = "buffer.x-k8s.io/active-capacity";
/// Condition: the buffer's chunk and count are resolved.
pub const READY_FOR_PROVISIONING: &str = "ReadyForProvisioning";
/// Condition: where the buffer's room is.
pub const PROVISIONING: &str = "Provisioning";

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(group = "autoscaling.x-k8s.io", version = "v1beta1", kind = "CapacityBuffer", namespaced, status = "CapacityBufferStatus")]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scalable_ref: Option<ScalableRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentage: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct LocalRef {
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ScalableRef {
    #[serde(default)]
    pub api_group: String,
    pub kind: String,
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityBufferStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_ref: Option<LocalRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
}

/// How many chunks a buffer keeps, and whether its limits cut them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count {
    pub chunks: u32,
    pub limited: bool,
}

/// The number of chunks, as the API defines it: `replicas`; or `percentage`
/// of the workload's replicas, rounded up, at least 1; the smaller when
/// both are set; capped by what fits in `limits` (all of the chunks'
/// requests together), and, with neither count set, as many as fit there.
///
/// # Errors
/// A negative count or percentage, a percentage without a workload, a
/// limit that does not parse: the field, and why.
pub fn count(spec: &CapacityBufferSpec, workload_replicas: Option<i32>, chunk: &Resources) -> Result<Count, String> {
    if let Some(r) = spec.replicas
        && r < 0
    {
        return Err(format!("spec.replicas: {r} is negative"));
    }
    let by_percentage = match (spec.percentage, workload_replicas) {
        (Some(p), _) if p < 0 => return Err(format!("spec.percentage: {p} is negative")),
        (Some(_), None) => return Err("spec.percentage: applies only with spec.scalableRef".to_string()),
        (Some(p), Some(n)) => Some(((i64::from(p) * i64::from(n.max(0)) + 99) / 100).max(1)),
        (None, _) => None,
    };
    let wanted = match (spec.replicas.map(i64::from), by_percentage) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    let fit = match &spec.limits {
        None => None,
        Some(limits) => match fitting(limits, chunk)? {
            None => return Err("spec.limits names no resource a chunk requests".to_string()),
            n => n,
        },
    };
    let (chunks, limited) = match (wanted, fit) {
        (Some(w), Some(f)) => (w.min(f), f < w),
        (Some(w), None) => (w, false),
        (None, Some(f)) => (f, false),
        (None, None) => (0, false),
    };
    Ok(Count { chunks: u32::try_from(chunks.clamp(0, i64::from(u32::MAX))).unwrap_or(u32::MAX), limited })
}

/// How many chunks fit in `limits`: each limit bounds the chunks by the
/// resource it names; None when no limit names a resource the chunk asks for.
fn fitting(limits: &BTreeMap<String, Quantity>, chunk: &Resources) -> Result<Option<i64>, String> {
    let mut n: Option<i64> = None;
    for (name, q) in limits {
        let scale = if name == "cpu" { 1000 } else { 1 };
        let limit = crate::resources::quantity(q, scale, || crate::resources::field("spec.limits", name)).map_err(|e| e.to_string())?;
        let each = match name.as_str() {
            "cpu" => chunk.cpu_milli,
            "memory" => chunk.memory_bytes,
            "ephemeral-storage" => chunk.ephemeral_bytes,
            "pods" => chunk.pods.max(1),
            other => chunk.extended(other),
        };
        if each > 0 {
            n = Some(n.map_or(limit / each, |m| m.min(limit / each)));
        }
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(replicas: Option<i32>, percentage: Option<i32>, limits: &[(&str, &str)]) -> CapacityBufferSpec {
        CapacityBufferSpec {
            replicas,
            percentage,
            limits: (!limits.is_empty()).then(|| limits.iter().map(|(k, v)| (k.to_string(), Quantity(v.to_string()))).collect()),
            ..Default::default()
        }
    }

    const CHUNK: Resources = Resources { cpu_milli: 2000, memory_bytes: 4 << 30, ephemeral_bytes: 0, pods: 1, extended: Vec::new() };

    #[test]
    fn the_count_follows_the_api() {
        let c = |s: CapacityBufferSpec, n: Option<i32>| count(&s, n, &CHUNK).map(|c| (c.chunks, c.limited));
        assert_eq!(c(spec(Some(3), None, &[]), None), Ok((3, false)));
        // 20 % of 10 replicas is 2; of 3 it is 0.6, rounded up to 1; of 0, at least 1.
        assert_eq!(c(spec(None, Some(20), &[]), Some(10)), Ok((2, false)));
        assert_eq!(c(spec(None, Some(20), &[]), Some(3)), Ok((1, false)));
        assert_eq!(c(spec(None, Some(20), &[]), Some(0)), Ok((1, false)));
        assert_eq!(c(spec(Some(5), Some(50), &[]), Some(4)), Ok((2, false)), "the smaller of the two");
        // 7 CPU hold 3 chunks of 2.
        assert_eq!(c(spec(Some(5), None, &[("cpu", "7")]), None), Ok((3, true)));
        assert_eq!(c(spec(Some(2), None, &[("cpu", "7")]), None), Ok((2, false)));
        assert_eq!(c(spec(None, None, &[("cpu", "7"), ("memory", "8Gi")]), None), Ok((2, false)), "as many as fit");
        assert_eq!(c(spec(None, None, &[]), None), Ok((0, false)));
        assert!(c(spec(Some(2), None, &[("nvidia.com/gpu", "4")]), None).unwrap_err().contains("names no resource"));
        assert!(c(spec(Some(-1), None, &[]), None).unwrap_err().contains("spec.replicas"));
        assert!(c(spec(None, Some(10), &[]), None).unwrap_err().contains("scalableRef"));
        assert!(c(spec(Some(1), None, &[("cpu", "lots")]), None).unwrap_err().contains("spec.limits"));
    }
}
