//! Selectors, node selector terms and taints, from their Kubernetes shapes.

use crate::error::{ConvertError, Result};
use ironclaim_core::{LabelSelector, NodeSelectorTerm, Operator, Requirement, TaintEffect};
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1 as meta;

pub(crate) fn operator(text: &str, path: &str, allow_numeric: bool) -> Result<Operator> {
    let op = match text {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        "Gt" if allow_numeric => Operator::Gt,
        "Lt" if allow_numeric => Operator::Lt,
        other => {
            let what = if allow_numeric { "node selector operator" } else { "label selector operator" };
            return Err(ConvertError::UnknownValue { path: path.to_string(), what, value: other.to_string() });
        }
    };
    Ok(op)
}

pub(crate) fn taint_effect(text: &str, path: &str) -> Result<TaintEffect> {
    match text {
        "NoSchedule" => Ok(TaintEffect::NoSchedule),
        "PreferNoSchedule" => Ok(TaintEffect::PreferNoSchedule),
        "NoExecute" => Ok(TaintEffect::NoExecute),
        other => Err(ConvertError::UnknownValue { path: path.to_string(), what: "taint effect", value: other.to_string() }),
    }
}

/// A label selector (`matchLabels` and `matchExpressions`).
pub(crate) fn label_selector(s: &meta::LabelSelector, path: &str) -> Result<LabelSelector> {
    let match_expressions = s
        .match_expressions
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, e)| {
            let at = format!("{path}.matchExpressions[{i}]");
            Ok(Requirement {
                key: e.key.clone(),
                operator: operator(&e.operator, &format!("{at}.operator"), false)?,
                values: e.values.clone().unwrap_or_default(),
            })
        })
        .collect::<Result<_>>()?;
    Ok(LabelSelector { match_labels: s.match_labels.clone().unwrap_or_default().into(), match_expressions })
}

fn node_requirements(list: Option<&Vec<k8s::NodeSelectorRequirement>>, path: &str) -> Result<Vec<Requirement>> {
    list.into_iter()
        .flatten()
        .enumerate()
        .map(|(i, r)| {
            Ok(Requirement {
                key: r.key.clone(),
                operator: operator(&r.operator, &format!("{path}[{i}].operator"), true)?,
                values: r.values.clone().unwrap_or_default(),
            })
        })
        .collect()
}

/// One term of a required node affinity.
pub(crate) fn node_selector_term(t: &k8s::NodeSelectorTerm, path: &str) -> Result<NodeSelectorTerm> {
    Ok(NodeSelectorTerm {
        match_expressions: node_requirements(t.match_expressions.as_ref(), &format!("{path}.matchExpressions"))?,
        match_fields: node_requirements(t.match_fields.as_ref(), &format!("{path}.matchFields"))?,
    })
}

pub(crate) fn taint(t: &k8s::Taint, path: &str) -> Result<ironclaim_core::Taint> {
    Ok(ironclaim_core::Taint {
        key: t.key.clone(),
        value: t.value.clone().unwrap_or_default(),
        effect: taint_effect(&t.effect, &format!("{path}.effect"))?,
    })
}
