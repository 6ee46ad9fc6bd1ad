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

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why a value could not be decoded strictly.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StrictError {
    /// A field does not have the type's type; `path` as `kubectl explain`
    /// spells it.
    Type { path: String, message: String },
    /// Fields the type does not have, in input order.
    Unknown { paths: Vec<String> },
}

/// Decodes `value` into `T`; any key `T` would skip is an error.
pub(crate) fn decode<T: DeserializeOwned>(value: Value) -> Result<T, StrictError> {
    let mut unknown = Vec::new();
    let mut skipped = |path: serde_ignored::Path<'_>| unknown.push(field_path(&path));
    let typed = serde_path_to_error::deserialize(serde_ignored::Deserializer::new(value, &mut skipped))
        .map_err(|e| StrictError::Type { path: e.path().to_string(), message: e.into_inner().to_string() });
    // A type error stops the decoding where it is: it is the first problem.
    let typed = typed?;
    if unknown.is_empty() { Ok(typed) } else { Err(StrictError::Unknown { paths: unknown }) }
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
        assert_eq!(decode::<Pod>(pod), Err(StrictError::Unknown { paths: vec!["metadata.lables".into(), "spec.containers[1].resource".into()] }));
        let good = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}, "status": {"phase": "Pending"}});
        assert!(decode::<Pod>(good).is_ok());
    }

    #[test]
    fn a_type_error_comes_with_its_path() {
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "spec": {"containers": [{"name": 3}]}});
        match decode::<Pod>(pod) {
            Err(StrictError::Type { path, .. }) => assert_eq!(path, "spec.containers[0].name"),
            other => panic!("{other:?}"),
        }
    }
}
