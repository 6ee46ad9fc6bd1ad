//! Types shared by the ironclaim.dev resources.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a requirement compares a server's label with its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RequirementOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

/// One `key operator values` expression on a server's labels.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(self.operator in ['In', 'NotIn']) || (has(self.values) && size(self.values) > 0)",
        "message": "In and NotIn need at least one value"
    },
    {
        "rule": "!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || size(self.values) == 0",
        "message": "Exists and DoesNotExist take no values"
    },
    {
        "rule": "!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 && self.values[0].matches('^-?[0-9]+$'))",
        "message": "Gt and Lt take exactly one integer value"
    }
]))]
pub struct NodeRequirement {
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    pub operator: RequirementOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100), inner(length(max = 63)))]
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// A taint a pool's nodes carry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTaint {
    #[schemars(length(min = 1, max = 316))]
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    #[schemars(length(max = 63))]
    pub value: String,
    pub effect: TaintEffect,
}

/// A namespaced Secret, referenced from a cluster-scoped object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretReference {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
}
