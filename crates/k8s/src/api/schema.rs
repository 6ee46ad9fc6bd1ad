//! Schema pieces the derives cannot express: quantities as integer-or-string
//! with the Kubernetes syntax, Go durations, and condition lists keyed by type.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{Schema, SchemaGenerator, json_schema};

/// A non-negative Kubernetes quantity ("32", "500m", "128Gi", "1e3",
/// "5e-1"), exactly what `parse_quantity` reads: no minus sign, so limits
/// and capacities cannot go negative, and integer exponents only.
pub const QUANTITY_PATTERN: &str = r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$";

/// A Go duration as `time.ParseDuration` reads it, without a sign: "90s",
/// "10m", "1h30m", "1.5h".
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$";

/// A label value: at most 63 characters, alphanumeric at both ends.
pub const LABEL_VALUE_PATTERN: &str = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$";

pub fn quantity(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "A non-negative Kubernetes quantity, such as 32, 500m or 128Gi.",
        "pattern": QUANTITY_PATTERN,
        "x-kubernetes-int-or-string": true,
    })
}

pub fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "description": "A duration such as 90s, 10m or 1h30m.",
        "type": "string",
        "pattern": DURATION_PATTERN,
    })
}

/// `metav1.Condition`s as a map keyed by `type`, so server-side apply merges
/// them per type instead of replacing the list.
pub fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<Condition>();
    json_schema!({
        "description": "The latest observations of the object's state.",
        "type": "array",
        "items": item,
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
    })
}

/// Schema of a map of label keys to label values.
pub fn labels(generator: &mut SchemaGenerator) -> Schema {
    let _ = generator;
    json_schema!({
        "type": "object",
        "additionalProperties": {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
    })
}

/// Schema of a map of free-form string parameters: at most 32, each
/// value at most 1,024 characters.
pub fn parameters(generator: &mut SchemaGenerator) -> Schema {
    let _ = generator;
    json_schema!({
        "type": "object",
        "maxProperties": 32,
        "additionalProperties": {"type": "string", "maxLength": 1024},
    })
}

/// Schema of a map of resource names to quantities.
pub fn quantity_map(generator: &mut SchemaGenerator) -> Schema {
    let item = quantity(generator);
    json_schema!({
        "type": "object",
        "additionalProperties": item,
    })
}
