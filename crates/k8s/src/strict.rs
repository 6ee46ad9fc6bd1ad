//! Strict decoding: a field the type does not know is an error, as
//! `kubectl apply` (server-side field validation `Strict`) makes it, instead
//! of being dropped.
//!
//! # How unknown fields are found
//!
//! The value is decoded through [`serde_ignored`], which wraps the
//! deserializer and reports every key the target type skips, with its path.
//! That works for every type whose `Deserialize` passes a key it does not
//! know to `IgnoredAny`: serde's derive without `deny_unknown_fields` (the
//! ironclaim.dev types) and k8s-openapi's generated impls (`Pod`,
//! `Deployment`, `Node`, ...), whose unknown-field arm reads an `IgnoredAny`.
//!
//! The other way, decoding and then comparing the input's JSON with the
//! typed value serialized again, was not taken: a value the type writes
//! back differently from how it was written (a quantity `1` read as `"1"`,
//! a time with fractional seconds, a `null`, a defaulted field, an
//! int-or-string) would have to be told apart from a dropped field case by
//! case, and a missed case is either a false error or a silent drop.
//! `serde_ignored` sees only keys, at the point the type skips them.
//!
//! What it cannot see: a field the type knows and the API server does not
//! (k8s-openapi is built for the Kubernetes version the project targets,
//! so the two agree), and keys under a free-form value (`RawExtension`,
//! `x-kubernetes-preserve-unknown-fields`), which the API server keeps too.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::{JsonSchema, SchemaGenerator};
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a value could not be decoded strictly.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StrictError {
    /// A field does not have the type's type; `path` as `kubectl explain`
    /// spells it.
    Type { path: String, message: String },
    /// Fields the type does not have, in input order; `hint` is the known
    /// field the first one is likely a misspelling of.
    Unknown { paths: Vec<String>, hint: Option<String> },
}

/// Decodes `value` into `T`; any key `T` would skip is an error.
pub(crate) fn decode<T: DeserializeOwned + JsonSchema>(value: Value) -> Result<T, StrictError> {
    let mut unknown = Vec::new();
    let mut skipped = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
    let typed = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut skipped))
        // The message names the field's path and type, never its value.
        .map_err(|e| StrictError::Type { path: e.path().to_string(), message: crate::redact::serde_message(&e.into_inner().to_string(), &[]) });
    // A type error stops the decoding where it is: it is the first problem.
    let typed = typed?;
    match unknown.first() {
        None => Ok(typed),
        Some(first) => {
            let hint = closest(first, &siblings::<T>(first));
            Err(StrictError::Unknown { paths: unknown, hint })
        }
    }
}

/// The fields `T` has beside the unknown field at `path`, read from `T`'s
/// JSON schema (k8s-openapi's schemars impls, and the derived ones of the
/// ironclaim.dev types, whose `metadata` is an `ObjectMeta`). Only for the
/// hint: empty when the path cannot be followed.
fn siblings<T: JsonSchema>(path: &str) -> Vec<String> {
    let mut generator = SchemaGenerator::default();
    let root = generator.root_schema_for::<T>().to_value();
    let meta = generator.subschema_for::<ObjectMeta>().to_value();
    let defs = generator.definitions().clone();
    // Every schema a value at `node` may have: $refs followed into the
    // definitions, anyOf/allOf/oneOf (an Option's schema) opened.
    let resolve = |node: &Value| -> Vec<Value> {
        let mut out = Vec::new();
        let mut stack = vec![node.clone()];
        while let Some(next) = stack.pop() {
            if out.len() + stack.len() > 64 {
                break;
            }
            if let Some(name) = next.get("$ref").and_then(Value::as_str).and_then(|r| r.rsplit('/').next())
                && let Some(target) = defs.get(name)
            {
                stack.push(target.clone());
                continue;
            }
            for key in ["anyOf", "allOf", "oneOf"] {
                stack.extend(next.get(key).and_then(Value::as_array).into_iter().flatten().cloned());
            }
            out.push(next);
        }
        out
    };
    let steps = segments(path);
    let Some((_, parents)) = steps.split_last() else { return Vec::new() };
    let mut nodes = vec![root];
    for (depth, step) in parents.iter().enumerate() {
        let mut next = Vec::new();
        for node in nodes.iter().flat_map(&resolve) {
            match step {
                Segment::Index => next.extend(node.get("items").cloned()),
                Segment::Key(key) => match node.get("properties").and_then(|p| p.get(key.as_str())) {
                    Some(child) => next.push(child.clone()),
                    // kube's derive leaves metadata out of a custom
                    // resource's schema: it is an ObjectMeta.
                    None if depth == 0 && key == "metadata" => next.push(meta.clone()),
                    None => next.extend(node.get("additionalProperties").filter(|a| a.is_object()).cloned()),
                },
            }
        }
        nodes = next;
    }
    let mut names: Vec<String> = nodes
        .iter()
        .flat_map(&resolve)
        .filter_map(|n| n.get("properties").and_then(Value::as_object).map(|p| p.keys().cloned().collect::<Vec<_>>()))
        .flatten()
        .collect();
    names.sort();
    names.dedup();
    names
}

enum Segment {
    Key(String),
    Index,
}

/// `spec.containers[0].resource` as its steps.
fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.') {
        let (key, indexes) = part.split_once('[').unwrap_or((part, ""));
        if !key.is_empty() {
            out.push(Segment::Key(key.to_string()));
        }
        out.extend(indexes.matches(']').map(|_| Segment::Index));
    }
    out
}

/// The known field nearest to the unknown one at the end of `path`, when
/// it is near enough to be a misspelling of it: at most 2 edits, 3 for a
/// name of 10 characters or more, letter case aside.
fn closest(path: &str, known: &[String]) -> Option<String> {
    let typed = path.rsplit('.').next().unwrap_or(path).to_lowercase();
    let limit = if typed.chars().count() >= 10 { 3 } else { 2 };
    known.iter().map(|k| (distance(&typed, &k.to_lowercase()), k)).filter(|(d, _)| *d <= limit).min_by_key(|(d, _)| *d).map(|(_, k)| k.clone())
}

/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`.
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut rows = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1).min(rows[i][j - 1] + 1).min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

/// `spec.containers[0].resource`, as the API server and `kubectl explain`
/// write a field's path.
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            let parent = field_path(parent);
            if parent.is_empty() { key.clone() } else { format!("{parent}.{key}") }
        }
        Path::Some { parent } | Path::NewtypeStruct { parent } | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::json;

    #[test]
    fn unknown_keys_are_reported_with_their_path_and_known_ones_are_not() {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "p", "lables": {"a": "b"}},
            "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}, {"name": "d", "resource": {}}]},
        });
        assert_eq!(
            decode::<Pod>(pod),
            Err(StrictError::Unknown { paths: vec!["metadata.lables".into(), "spec.containers[1].resource".into()], hint: Some("labels".into()) })
        );
        let good = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}});
        assert!(decode::<Pod>(good).is_ok());
    }

    #[test]
    fn a_type_error_names_the_field_and_never_its_value() {
        let pod =
            json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": "c", "env": [{"name": "TOKEN", "valueFrom": "hunter2"}]}]}});
        match decode::<Pod>(pod) {
            Err(StrictError::Type { path, message }) => {
                assert_eq!(path, "spec.containers[0].env[0].valueFrom");
                assert!(message.starts_with("invalid type: string, expected"), "{message}");
                assert!(!message.contains("hunter2"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_type_error_comes_with_its_path() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": 3}]}});
        match decode::<Pod>(pod) {
            Err(StrictError::Type { path, .. }) => assert_eq!(path, "spec.containers[0].name"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_misspelt_field_gets_the_known_one_it_is_near() {
        let hint = |path: &str| closest(path, &siblings::<Pod>(path));
        assert_eq!(hint("spec.nodeSelecter").as_deref(), Some("nodeSelector"));
        assert_eq!(hint("spec.containers[3].resource").as_deref(), Some("resources"));
        assert_eq!(hint("spec.containers[0].resources.limts").as_deref(), Some("limits"));
        assert_eq!(hint("metadata.Labels").as_deref(), Some("labels"));
        assert_eq!(hint("spec.colour"), None);
        let server = |path: &str| closest(path, &siblings::<crate::api::Server>(path));
        assert_eq!(server("spec.maintainance").as_deref(), Some("maintenance"));
        assert_eq!(server("spec.hardware.gpus[0].modle").as_deref(), Some("model"));
        assert_eq!(server("metadata.lables").as_deref(), Some("labels"));
        assert_eq!(server("spec.bmc.adress").as_deref(), Some("address"));
        assert_eq!(distance("lables", "labels"), 1);
    }
}
