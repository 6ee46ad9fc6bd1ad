//! `ProvisioningRequest` (`autoscaling.x-k8s.io/v1`), the API Cluster
//! Autoscaler implements for capacity asked for as a whole, as ironclaim
//! reads it: sets of pods, each a PodTemplate and a count, and the class
//! that says what to do with them. The CRD is Cluster Autoscaler's;
//! ironclaim installs none.

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The class whose pods are given servers all together or not at all.
pub const ATOMIC_SCALE_UP: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
/// The class that only asks whether the pods fit the nodes there are.
pub const CHECK_CAPACITY: &str = "check-capacity.autoscaling.x-k8s.io";

/// Conditions, as Cluster Autoscaler writes them.
pub const ACCEPTED: &str = "Accepted";
pub const PROVISIONED: &str = "Provisioned";
pub const FAILED: &str = "Failed";
pub const BOOKING_EXPIRED: &str = "BookingExpired";

/// On a pod: the ProvisioningRequest (in its namespace) whose capacity it
/// consumes.
pub const CONSUME_ANNOTATION: &str = "autoscaling.x-k8s.io/consume-provisioning-request";

#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(group = "autoscaling.x-k8s.io", version = "v1", kind = "ProvisioningRequest", namespaced, status = "ProvisioningRequestStatus")]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestSpec {
    pub provisioning_class_name: String,
    #[serde(default)]
    pub pod_sets: Vec<PodSet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    pub pod_template_ref: TemplateRef,
    pub count: i32,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
pub struct TemplateRef {
    #[serde(default)]
    pub name: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_class_details: Option<BTreeMap<String, String>>,
}

impl ProvisioningRequest {
    /// The condition of `type_` when it is True.
    pub fn holds(&self, type_: &str) -> Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
        self.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_ && c.status == "True")
    }
}
