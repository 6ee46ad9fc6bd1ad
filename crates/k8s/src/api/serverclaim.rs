//! `ServerClaim`: the decision that one server becomes a node for a set of
//! pending pods, and the record of how far that got.

use super::schema;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

// clippy reads the repeated `type_ = ...` of the printcolumns as duplicated
// attributes; they are one column each.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ironclaim.dev",
    version = "v1alpha1",
    kind = "ServerClaim",
    plural = "serverclaims",
    shortname = "srvclaim",
    category = "ironclaim",
    status = "ServerClaimStatus",
    derive = "PartialEq",
    doc = "One server becoming a node for a set of pending pods, with the timeline of every stage.",
    printcolumn(name = "Server", type_ = "string", json_path = ".spec.server"),
    printcolumn(name = "Pool", type_ = "string", json_path = ".spec.pool"),
    printcolumn(name = "Stage", type_ = "string", json_path = ".status.stage"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.nodeName"),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.failureReason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.server == oldSelf.server", "message": "server is immutable"},
    {"rule": "self.pool == oldSelf.pool", "message": "pool is immutable"}
]))]
pub struct ServerClaimSpec {
    /// The Server this claim powers on.
    #[schemars(length(min = 1, max = 253))]
    pub server: String,
    /// The ServerPool it was opened under.
    #[schemars(length(min = 1, max = 253))]
    pub pool: String,
    /// The pods it was opened for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10000))]
    pub pods: Vec<PodReference>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodReference {
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// The claim's stages and failure reasons are the driver's, which walks
/// the claim: one enum each, one name each everywhere.
pub use ironclaim_driver::{FailureReason, Stage};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum StageOutcome {
    InProgress,
    Succeeded,
    Failed,
    TimedOut,
}

/// One stage of the timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageRecord {
    pub stage: Stage,
    pub start_time: Time,
    /// Set when the stage ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub duration_seconds: Option<i64>,
    pub outcome: StageOutcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.failureMessage) || has(self.failureReason)", "message": "failureMessage needs a failureReason"}
]))]
pub struct ServerClaimStatus {
    /// The stage reached so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<Stage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Every stage entered, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub stages: Vec<StageRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<FailureReason>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 4096))]
    pub failure_message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}
