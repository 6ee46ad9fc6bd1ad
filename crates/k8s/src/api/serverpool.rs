//! `ServerPool`: which servers a class of workloads may use, and how they
//! become nodes.

use super::common::{NodeRequirement, NodeTaint};
use super::schema;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Label whose value names a server's hardware class for warm-spare floors
/// unless a pool names another.
pub const CLASS_LABEL: &str = ironclaim_core::CLASS_LABEL;

// clippy reads the repeated `type_ = ...` of the printcolumns as duplicated
// attributes; they are one column each.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ironclaim.dev",
    version = "v1alpha1",
    kind = "ServerPool",
    plural = "serverpools",
    shortname = "srvpool",
    category = "ironclaim",
    status = "ServerPoolStatus",
    derive = "PartialEq",
    doc = "Which servers a class of workloads may use, the nodes they become, and the pool's limits.",
    printcolumn(name = "Weight", type_ = "integer", json_path = ".spec.weight"),
    printcolumn(name = "Servers", type_ = "integer", json_path = ".status.servers"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".status.resources.cpu"),
    printcolumn(name = "Watts", type_ = "integer", json_path = ".status.watts"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ServerPoolSpec {
    /// Pools with a higher weight are tried first.
    #[serde(default)]
    #[schemars(range(min = 0, max = 100))]
    pub weight: i32,
    /// On the servers' labels, ANDed: which servers belong to the pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub requirements: Vec<NodeRequirement>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<NodeTemplate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<Limits>,
    /// How long after creation a pod should be running when it carries no
    /// `ironclaim.dev/deadline` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub default_deadline: Option<String>,
    /// What must hold, beyond node Ready, before a node counts as ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub readiness: Option<ReadinessGates>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm_spares: Option<WarmSpares>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<Disruption>,
}

/// What the pool's nodes carry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTemplate {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::labels")]
    pub labels: BTreeMap<String, String>,
    /// Pods must tolerate these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub taints: Vec<NodeTaint>,
    /// Taints the node starts with and an agent removes once it is set up;
    /// pods need not tolerate them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub startup_taints: Vec<NodeTaint>,
}

/// Upper bounds on the servers the pool holds at once; unset is unbounded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Limits {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub cpu: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub memory: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub gpus: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub servers: Option<i64>,
    /// Peak watts of the pool's powered servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub watts: Option<i64>,
}

/// Gates a node passes, after the kubelet reports Ready, before the claim
/// counts as ready.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReadinessGates {
    /// Label keys the node must carry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 316)))]
    pub labels: Vec<String>,
    /// Extended resources the node must advertise with a non-zero
    /// allocatable amount, e.g. `nvidia.com/gpu`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 316)))]
    pub extended_resources: Vec<String>,
    /// The pool's startup taints must be gone.
    #[serde(default = "yes")]
    pub startup_taints_removed: bool,
    /// Node condition types that must be True.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 316)))]
    pub node_conditions: Vec<String>,
}

fn yes() -> bool {
    true
}

/// Servers kept powered on and idle so bursts land in seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.schedule) == has(self.duration)", "message": "schedule and duration go together"}
]))]
pub struct WarmSpares {
    /// The server label that names a class; `ironclaim.dev/class` when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    pub class_label: Option<String>,
    /// How many idle servers of each class to keep on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub floor: Vec<WarmFloor>,
    /// Free capacity to keep on running nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub headroom: Option<Headroom>,
    /// When the floor and headroom apply (cron, e.g. `0 8 * * 1-5`); always
    /// when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((\S+\s+){4}\S+)$"))]
    pub schedule: Option<String>,
    /// How long each scheduled window lasts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub duration: Option<String>,
    /// Raise each class's floor to the fresh demand of the recent past;
    /// `floor` stays the minimum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<AdaptiveWarmSpares>,
}

/// The adaptive floor: over `window`, the pods that needed a server of the
/// class of their own and would miss their deadline waiting for a cold boot
/// give a rate; the floor is the servers expected to be needed during one
/// cold boot, plus one standard deviation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.window) || (duration(self.window) >= duration('1m') && duration(self.window) <= duration('168h'))",
     "message": "window must be between 1m and 168h"}
]))]
pub struct AdaptiveWarmSpares {
    /// How far back arrivals count; 4h when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub window: Option<String>,
    /// Past days whose demand at this time of day powers spares on ahead of
    /// a recurring ramp; 7 when unset, 0 turns it off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 28))]
    pub history_days: Option<i64>,
    /// On how many of those days the demand must have come; 3 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 28))]
    pub min_days_seen: Option<i64>,
    /// Tell weekdays from weekend days (UTC): a weekday's profile looks at
    /// past weekdays, a weekend day's at past weekend days, where at least
    /// minDaysSeen of them are in view; false when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weekly: Option<bool>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WarmFloor {
    #[schemars(length(min = 1, max = 63))]
    pub class: String,
    #[schemars(range(min = 0, max = 10000))]
    pub count: i64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Headroom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub cpu: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub memory: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub gpus: Option<i64>,
}

/// When and how fast the pool's idle or underused servers are drained and
/// powered off.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Disruption {
    /// How long a node stays empty or underused before it is consolidated,
    /// or `Never`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^(([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+|Never)$"))]
    pub consolidate_after: Option<String>,
    /// The most restrictive active budget wins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 50))]
    pub budgets: Vec<Budget>,
    /// How long a drain may take before the node is left as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub drain_timeout: Option<String>,
    /// What becomes of a node once its server is powered off: `Delete`
    /// (the default) deletes the Node; `Park` keeps it, cordoned, with
    /// the condition `Suspended=True` that Cluster Autoscaler reads, until
    /// the server boots again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_after_power_off: Option<NodeAfterPowerOff>,
    /// Whether the pool's emptiest underutilized node carries the soft
    /// taint `ironclaim.dev/emptying:PreferNoSchedule`, so that new pods
    /// go elsewhere and it empties with no eviction (the default); `false`
    /// leaves kube-scheduler's spreading as it is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub empty_by_attrition: Option<bool>,
}

/// What becomes of a node once its server is powered off.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NodeAfterPowerOff {
    Delete,
    Park,
}

/// How many nodes may be disrupted at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.schedule) == has(self.duration)", "message": "schedule and duration go together"}
]))]
pub struct Budget {
    /// A count (`2`) or a percentage of the pool's nodes (`10%`, rounded up).
    #[schemars(pattern(r"^((100|[0-9]{1,2})%|[0-9]+)$"))]
    pub nodes: String,
    /// When the budget applies (cron); always when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(r"^(@(annually|yearly|monthly|weekly|daily|midnight|hourly))|((\S+\s+){4}\S+)$"))]
    pub schedule: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub duration: Option<String>,
    /// The reasons the budget limits; all when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<DisruptionReason>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DisruptionReason {
    Empty,
    Underutilized,
    Drifted,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerPoolStatus {
    /// Servers the pool holds (claimed or serving).
    #[serde(default)]
    pub servers: i64,
    /// Resources of the servers the pool holds.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::quantity_map")]
    pub resources: BTreeMap<String, Quantity>,
    /// Peak watts of the pool's powered servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watts: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
    /// The fresh demand the pool's servers were claimed for over the last
    /// eight days, oldest first: the history its warm floors' daily profile
    /// is learned from, kept here so that it outlives the claims and the
    /// controller's restarts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 5000))]
    pub arrivals: Vec<ArrivalRecord>,
}

/// One arrival: a pod that needed a server of its own.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ArrivalRecord {
    /// When the pod was created, in seconds since the Unix epoch.
    pub at: i64,
    /// The server claimed for it.
    pub server: String,
    /// The pod's deadline in seconds, when it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline_seconds: Option<i64>,
}
