//! The CRDs' own validation, applied to an object before it is used: what
//! the API server would refuse, the loader refuses too.
//!
//! # One definition
//!
//! The rules are not written here. They are the OpenAPI schemas of
//! [`crds()`](super::crds), the very CRDs `ironclaim crds` prints and the
//! API server enforces, generated from the API types (their serde and
//! schemars attributes, the `x-kubernetes-validations` rules beside them,
//! the patterns of `api/schema.rs`). This module only reads those schemas
//! as kube-apiserver does, so a rule added to a type reaches the CRD and
//! the loader at once, and neither can drift from the other:
//!
//! - null values of fields that are not `nullable` are dropped, then
//!   `default`s are filled in (the API server defaults before validating);
//! - a field no schema declares is unknown (the root's `apiVersion`, `kind`
//!   and `metadata` are the API server's own), unless the schema preserves
//!   unknown fields;
//! - `type`, `x-kubernetes-int-or-string`, `required`, `enum`, `pattern`,
//!   `minLength`/`maxLength` (in characters), `minimum`/`maximum` (with
//!   `exclusiveMinimum`/`exclusiveMaximum`), `multipleOf`,
//!   `minItems`/`maxItems`, `minProperties`/`maxProperties`, and the
//!   uniqueness of `x-kubernetes-list-type` `set` and `map` lists;
//! - `x-kubernetes-validations`: each CEL rule is evaluated with `self`
//!   bound to the field's value, objects and maps as CEL maps, integers as
//!   `int`. Transition rules (those reading `oldSelf`) only apply to an
//!   update, and are skipped, as the API server skips them on a create.
//!
//! Not checked: `format`s (ironclaim's schemas use them only on integers
//! and on the `metav1.Time`s of statuses), and CEL cost limits.
//!
//! Patterns are compiled by the `regex` crate, whose syntax is the RE2
//! syntax Go's `regexp` reads for everything these patterns use; CEL by
//! the `cel` crate. The test `crds_apiserver` feeds the same documents to
//! this module and to kube-apiserver and checks that they agree.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool};
use regex::Regex;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, OnceLock};

/// What the API server would refuse in an object, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The field, as `kubectl explain` spells it (`spec.bmc.address`,
    /// `spec.requirements[0]`); empty for the object itself.
    pub path: String,
    pub problem: Problem,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A field the schema does not declare.
    UnknownField,
    /// A required field is missing.
    Required,
    /// A value the schema or one of its rules refuses; the text says why.
    Invalid(String),
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = if self.path.is_empty() { "<object>" } else { &self.path };
        match &self.problem {
            Problem::UnknownField => write!(f, "{path}: unknown field"),
            Problem::Required => write!(f, "{path}: required"),
            Problem::Invalid(why) => write!(f, "{path}: {why}"),
        }
    }
}

/// Checks `object`, an ironclaim.dev object of `kind` as a manifest holds
/// it, against its CRD's schema.
///
/// # Guarantees
/// - Empty when the API server would store the object (on a create: see
///   the module's notes for what is not checked).
/// - Otherwise every violation found, schema violations (unknown fields
///   first) before CEL rules, each group in document order.
/// - `None` for a kind the API does not have.
pub fn validate(kind: &str, object: &Value) -> Option<Vec<Violation>> {
    let compiled = compiled().get(kind)?;
    let mut object = object.clone();
    prepare(&compiled.schema, &mut object, true);
    let mut check = Check { compiled, schema_violations: Vec::new(), rule_violations: Vec::new() };
    check.walk(&compiled.schema, &object, "", true);
    let Check { mut schema_violations, rule_violations, .. } = check;
    schema_violations.sort_by_key(|v| v.problem != Problem::UnknownField);
    schema_violations.extend(rule_violations);
    Some(schema_violations)
}

/// Every CEL rule of every CRD with whether it compiles here, for tests:
/// a rule this module cannot compile would refuse every object it covers.
pub fn rules() -> Vec<(String, String, Result<(), String>)> {
    let mut out = Vec::new();
    for (kind, compiled) in compiled() {
        for (rule, program) in &compiled.rules {
            out.push((kind.clone(), rule.clone(), program.as_ref().map(|_| ()).map_err(Clone::clone)));
        }
    }
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

struct Compiled {
    schema: JSONSchemaProps,
    patterns: HashMap<String, Result<Regex, String>>,
    rules: HashMap<String, Result<cel::Program, String>>,
}

fn compiled() -> &'static BTreeMap<String, Compiled> {
    static COMPILED: OnceLock<BTreeMap<String, Compiled>> = OnceLock::new();
    COMPILED.get_or_init(|| {
        let mut all = BTreeMap::new();
        for crd in super::crds() {
            let Some(schema) = crd.spec.versions.first().and_then(|v| v.schema.as_ref()).and_then(|s| s.open_api_v3_schema.clone()) else {
                continue;
            };
            let mut compiled = Compiled { schema: JSONSchemaProps::default(), patterns: HashMap::new(), rules: HashMap::new() };
            collect(&schema, &mut compiled);
            compiled.schema = schema;
            all.insert(crd.spec.names.kind.clone(), compiled);
        }
        all
    })
}

fn collect(schema: &JSONSchemaProps, into: &mut Compiled) {
    if let Some(pattern) = &schema.pattern {
        into.patterns.entry(pattern.clone()).or_insert_with(|| Regex::new(pattern).map_err(|e| e.to_string()));
    }
    for rule in schema.x_kubernetes_validations.iter().flatten() {
        into.rules.entry(rule.rule.clone()).or_insert_with(|| cel::Program::compile(&rule.rule).map_err(|e| e.to_string()));
    }
    for child in children(schema) {
        collect(child, into);
    }
}

fn children(schema: &JSONSchemaProps) -> Vec<&JSONSchemaProps> {
    let mut out: Vec<&JSONSchemaProps> = schema.properties.iter().flat_map(|p| p.values()).collect();
    if let Some(JSONSchemaPropsOrBool::Schema(extra)) = &schema.additional_properties {
        out.push(extra);
    }
    match &schema.items {
        Some(JSONSchemaPropsOrArray::Schema(items)) => out.push(items),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => out.extend(items),
        None => {}
    }
    out
}

fn item_schema(schema: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match &schema.items {
        Some(JSONSchemaPropsOrArray::Schema(items)) => Some(items),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => items.first(),
        None => None,
    }
}

fn extra_schema(schema: &JSONSchemaProps) -> Option<&JSONSchemaProps> {
    match &schema.additional_properties {
        Some(JSONSchemaPropsOrBool::Schema(extra)) => Some(extra),
        _ => None,
    }
}

/// The API server's decoding steps before validation: null values of
/// fields that are not nullable are dropped, then defaults filled in.
fn prepare(schema: &JSONSchemaProps, value: &mut Value, root: bool) {
    match value {
        Value::Object(map) => {
            if let Some(properties) = &schema.properties {
                map.retain(|key, v| !(v.is_null() && properties.get(key).is_some_and(|p| p.nullable != Some(true))));
                for (key, property) in properties {
                    if let (false, Some(default)) = (map.contains_key(key), &property.default) {
                        map.insert(key.clone(), default.0.clone());
                    }
                }
                for (key, v) in map.iter_mut() {
                    if root && key == "metadata" {
                        continue;
                    }
                    if let Some(property) = properties.get(key) {
                        prepare(property, v, false);
                    }
                }
            } else if let Some(extra) = extra_schema(schema) {
                map.retain(|_, v| !(v.is_null() && extra.nullable != Some(true)));
                for v in map.values_mut() {
                    prepare(extra, v, false);
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = item_schema(schema) {
                for v in items {
                    prepare(item, v, false);
                }
            }
        }
        _ => {}
    }
}

struct Check<'a> {
    compiled: &'a Compiled,
    schema_violations: Vec<Violation>,
    rule_violations: Vec<Violation>,
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "an integer",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

fn quoted(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

impl Check<'_> {
    fn invalid(&mut self, path: &str, why: String) {
        self.schema_violations.push(Violation { path: path.to_string(), problem: Problem::Invalid(why) });
    }

    /// Validates `value` against `schema`; false when anything under it
    /// is invalid (its CEL rules are then not evaluated: they may read
    /// the very fields that are wrong).
    fn walk(&mut self, schema: &JSONSchemaProps, value: &Value, path: &str, root: bool) -> bool {
        let before = self.schema_violations.len();
        if value.is_null() {
            if schema.nullable != Some(true) {
                self.invalid(path, "must not be null".into());
            }
            return self.schema_violations.len() == before;
        }
        if schema.x_kubernetes_int_or_string == Some(true) {
            if !(value.is_string() || value.as_i64().is_some() || value.as_u64().is_some()) {
                self.invalid(path, format!("must be an integer or a string, found {}", type_name(value)));
                return false;
            }
        } else if let Some(want) = schema.type_.as_deref() {
            let fits = match want {
                "object" => value.is_object(),
                "array" => value.is_array(),
                "string" => value.is_string(),
                "integer" => value.as_i64().is_some() || value.as_u64().is_some(),
                "number" => value.is_number(),
                "boolean" => value.is_boolean(),
                _ => true,
            };
            if !fits {
                self.invalid(path, format!("must be of type {want}, found {}", type_name(value)));
                return false;
            }
        }
        if let Some(allowed) = &schema.enum_
            && !allowed.iter().any(|a| a.0 == *value)
        {
            let list: Vec<String> = allowed.iter().map(|a| quoted(&a.0)).collect();
            self.invalid(path, format!("unsupported value {}: must be one of {}", quoted(value), list.join(", ")));
        }
        match value {
            Value::Object(map) => self.object(schema, map, path, root),
            Value::Array(items) => self.array(schema, items, path),
            Value::String(s) => self.string(schema, s, path),
            Value::Number(n) => self.number(schema, n, path),
            _ => {}
        }
        let valid = self.schema_violations.len() == before;
        if valid {
            self.rules(schema, value, path);
        }
        valid
    }

    fn object(&mut self, schema: &JSONSchemaProps, map: &serde_json::Map<String, Value>, path: &str, root: bool) {
        let properties = schema.properties.as_ref();
        let extra = extra_schema(schema);
        let preserve = schema.x_kubernetes_preserve_unknown_fields == Some(true)
            || matches!(schema.additional_properties, Some(JSONSchemaPropsOrBool::Bool(true)));
        for (key, v) in map {
            // The root's apiVersion, kind and metadata are the API
            // server's own, checked by it (and by the typed decoding).
            if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            let here = join(path, key);
            match (properties.and_then(|p| p.get(key)), extra) {
                (Some(property), _) => {
                    self.walk(property, v, &here, false);
                }
                (None, Some(extra)) => {
                    self.walk(extra, v, &here, false);
                }
                (None, None) if preserve => {}
                (None, None) => self.schema_violations.push(Violation { path: here, problem: Problem::UnknownField }),
            }
        }
        for key in schema.required.iter().flatten() {
            if !map.contains_key(key) {
                self.schema_violations.push(Violation { path: join(path, key), problem: Problem::Required });
            }
        }
        let count = map.len() as i64;
        if let Some(min) = schema.min_properties.filter(|m| count < *m) {
            self.invalid(path, format!("must have at least {min} entries, found {count}"));
        }
        if let Some(max) = schema.max_properties.filter(|m| count > *m) {
            self.invalid(path, format!("must have at most {max} entries, found {count}"));
        }
    }

    fn array(&mut self, schema: &JSONSchemaProps, items: &[Value], path: &str) {
        if let Some(item) = item_schema(schema) {
            for (i, v) in items.iter().enumerate() {
                self.walk(item, v, &format!("{path}[{i}]"), false);
            }
        }
        let count = items.len() as i64;
        if let Some(min) = schema.min_items.filter(|m| count < *m) {
            self.invalid(path, format!("must have at least {min} items, found {count}"));
        }
        if let Some(max) = schema.max_items.filter(|m| count > *m) {
            self.invalid(path, format!("must have at most {max} items, found {count}"));
        }
        match schema.x_kubernetes_list_type.as_deref() {
            Some("set") => {
                let mut seen = HashSet::new();
                for (i, v) in items.iter().enumerate() {
                    if !seen.insert(v.to_string()) {
                        self.invalid(&format!("{path}[{i}]"), format!("duplicate value {}", quoted(v)));
                    }
                }
            }
            Some("map") => {
                let keys = schema.x_kubernetes_list_map_keys.clone().unwrap_or_default();
                let mut seen = HashSet::new();
                for (i, v) in items.iter().enumerate() {
                    let key: Vec<String> = keys.iter().map(|k| v.get(k).map(quoted).unwrap_or_default()).collect();
                    if !seen.insert(key.clone()) {
                        self.invalid(&format!("{path}[{i}]"), format!("duplicate entry with {} {}", keys.join(", "), key.join(", ")));
                    }
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, schema: &JSONSchemaProps, s: &str, path: &str) {
        let chars = s.chars().count() as i64;
        if let Some(min) = schema.min_length.filter(|m| chars < *m) {
            self.invalid(path, format!("{s:?} is shorter than {min} characters"));
        }
        if let Some(max) = schema.max_length.filter(|m| chars > *m) {
            self.invalid(path, format!("may have at most {max} characters, found {chars}"));
        }
        if let Some(pattern) = &schema.pattern {
            match self.compiled.patterns.get(pattern) {
                Some(Ok(re)) if re.is_match(s) => {}
                Some(Ok(_)) => self.invalid(path, format!("invalid value {s:?}: must match {pattern}")),
                Some(Err(e)) => {
                    let why = format!("the schema's pattern {pattern} cannot be read here: {e}");
                    self.invalid(path, why);
                }
                None => self.invalid(path, format!("the schema's pattern {pattern} was not compiled")),
            }
        }
    }

    fn number(&mut self, schema: &JSONSchemaProps, n: &serde_json::Number, path: &str) {
        let Some(x) = n.as_f64() else { return };
        if let Some(min) = schema.minimum {
            let exclusive = schema.exclusive_minimum == Some(true);
            if x < min || (exclusive && x == min) {
                let bound = if exclusive { "greater than" } else { "at least" };
                self.invalid(path, format!("must be {bound} {}, found {n}", bound_text(min)));
            }
        }
        if let Some(max) = schema.maximum {
            let exclusive = schema.exclusive_maximum == Some(true);
            if x > max || (exclusive && x == max) {
                let bound = if exclusive { "less than" } else { "at most" };
                self.invalid(path, format!("must be {bound} {}, found {n}", bound_text(max)));
            }
        }
        if let Some(step) = schema.multiple_of.filter(|s| *s > 0.0)
            && (x / step).fract() != 0.0
        {
            self.invalid(path, format!("must be a multiple of {}, found {n}", bound_text(step)));
        }
    }

    fn rules(&mut self, schema: &JSONSchemaProps, value: &Value, path: &str) {
        let Some(rules) = &schema.x_kubernetes_validations else { return };
        let mut bound: Option<cel::Value> = None;
        for rule in rules {
            // A transition rule compares with the stored object: an
            // update's concern, skipped on a create as the API server does.
            if rule.rule.contains("oldSelf") {
                continue;
            }
            let at = match rule.field_path.as_deref() {
                Some(field) if !field.is_empty() => format!("{path}{field}"),
                _ => path.to_string(),
            };
            let message = rule.message.clone().unwrap_or_else(|| format!("failed rule: {}", rule.rule));
            let outcome = match self.compiled.rules.get(&rule.rule) {
                Some(Ok(program)) => {
                    let this = bound.get_or_insert_with(|| to_cel(value)).clone();
                    let mut context = cel::Context::with_env(stdlib());
                    context.add_variable_from_value("self", this);
                    match program.execute(&context) {
                        Ok(cel::Value::Bool(true)) => Ok(()),
                        Ok(cel::Value::Bool(false)) => Err(message),
                        Ok(other) => Err(format!("rule {:?} is not a condition: it gave {other:?}", rule.rule)),
                        Err(e) => Err(format!("{message} (rule {:?} could not be evaluated: {e})", rule.rule)),
                    }
                }
                Some(Err(e)) => Err(format!("rule {:?} cannot be read here: {e}", rule.rule)),
                None => Err(format!("rule {:?} was not compiled", rule.rule)),
            };
            if let Err(why) = outcome {
                self.rule_violations.push(Violation { path: at, problem: Problem::Invalid(why) });
            }
        }
    }
}

/// CEL's standard environment, built once.
fn stdlib() -> Arc<cel::Env> {
    static ENV: OnceLock<Arc<cel::Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(cel::Env::stdlib())).clone()
}

fn bound_text(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 { format!("{}", x as i64) } else { x.to_string() }
}

/// A JSON value as CEL sees a field of a custom resource: objects and maps
/// as maps without their null fields, integers as `int`, other numbers as
/// `double`.
fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(map) => {
            // A field set to null is not set, for `has()` as for the API
            // server (checked against kube-apiserver v1.37.2).
            let entries: HashMap<String, cel::Value> = map.iter().filter(|(_, v)| !v.is_null()).map(|(k, v)| (k.clone(), to_cel(v))).collect();
            cel::Value::from(entries)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn server(spec: Value) -> Value {
        json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": "s", "labels": {"a": "b"}}, "spec": spec})
    }

    fn problems(kind: &str, object: Value) -> Vec<String> {
        validate(kind, &object).expect("a kind of the API").iter().map(ToString::to_string).collect()
    }

    const BMC: &str = "https://10.0.0.1";

    #[test]
    fn a_valid_server_has_no_violations_and_defaults_fill_in() {
        let ok = server(json!({
            "bmc": {"address": BMC, "credentialsSecretRef": {"name": "b", "namespace": "n"}},
            "hardware": {"cpu": 32, "memory": "128Gi"},
            "power": {"idleWatts": 100, "peakWatts": 100},
        }));
        assert_eq!(problems("Server", ok), Vec::<String>::new());
        // provider.type defaults to Redfish before the rule reads it.
        let provider_without_type = server(json!({"provider": {}, "hardware": {"cpu": 32, "memory": "128Gi"}}));
        assert_eq!(problems("Server", provider_without_type), ["spec: bmc is required unless provider.type is Metal3, External or ClusterAPI"]);
        assert!(validate("Rack", &json!({})).is_none());
    }

    #[test]
    fn an_external_provider_needs_its_name_and_only_with_type_external() {
        let hardware = json!({"cpu": 8, "memory": "16Gi"});
        let external = server(json!({
            "provider": {"type": "External", "external": {"name": "ipmi", "parameters": {"address": "10.0.0.21", "bmc.port": "623"}}},
            "hardware": hardware,
        }));
        assert_eq!(problems("Server", external), Vec::<String>::new(), "no bmc needed");
        let without = server(json!({"provider": {"type": "External"}, "hardware": hardware}));
        assert_eq!(problems("Server", without), ["spec.provider: external is required when type is External, and only then"]);
        let stray = server(json!({
            "bmc": {"address": BMC, "credentialsSecretRef": {"name": "b", "namespace": "n"}},
            "provider": {"type": "Redfish", "external": {"name": "ipmi"}},
            "hardware": hardware,
        }));
        assert_eq!(problems("Server", stray), ["spec.provider: external is required when type is External, and only then"]);
        let bad_name = server(json!({"provider": {"type": "External", "external": {"name": "IPMI_1"}}, "hardware": hardware}));
        assert!(problems("Server", bad_name).iter().any(|p| p.starts_with("spec.provider.external.name: invalid value")));
        let too_long = server(
            json!({"provider": {"type": "External", "external": {"name": "ipmi", "parameters": {"k": "x".repeat(1025)}}}, "hardware": hardware}),
        );
        assert!(problems("Server", too_long).iter().any(|p| p.starts_with("spec.provider.external.parameters.k")), "at most 1,024 characters");
    }

    #[test]
    fn a_cluster_api_server_names_its_machine_deployment_and_needs_no_bmc() {
        let hardware = json!({"cpu": 8, "memory": "16Gi"});
        let ok = server(
            json!({"provider": {"type": "ClusterAPI", "clusterAPI": {"namespace": "lab", "machineDeployment": "workers"}}, "hardware": hardware}),
        );
        assert_eq!(problems("Server", ok), Vec::<String>::new());
        let without = server(json!({"provider": {"type": "ClusterAPI"}, "hardware": hardware}));
        assert_eq!(problems("Server", without), ["spec.provider: clusterAPI is required when type is ClusterAPI, and only then"]);
        let stray = server(json!({
            "provider": {"type": "Metal3", "metal3": {"namespace": "h", "name": "x"}, "clusterAPI": {"namespace": "lab", "machineDeployment": "workers"}},
            "hardware": hardware,
        }));
        assert_eq!(problems("Server", stray), ["spec.provider: clusterAPI is required when type is ClusterAPI, and only then"]);
    }

    #[test]
    fn schema_violations_come_before_rules_and_unknown_fields_first() {
        let bad = server(json!({
            "hardware": {"cpu": "-1", "memory": "128Gi", "pods": 0},
            "power": {"idleWatts": 500, "peakWatts": 100},
            "colour": "red",
        }));
        assert_eq!(
            problems("Server", bad),
            [
                "spec.colour: unknown field",
                "spec.hardware.cpu: invalid value \"-1\": must match ^\\+?(([0-9]+(\\.[0-9]*)?)|(\\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?[0-9]+))?$",
                "spec.hardware.pods: must be at least 1, found 0",
                "spec.power: peakWatts must be at least idleWatts",
            ]
        );
    }

    #[test]
    fn cel_rules_with_durations_lists_and_regexes() {
        let pool = |spec: Value| json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool", "metadata": {"name": "p"}, "spec": spec});
        assert_eq!(
            problems("ServerPool", pool(json!({"warmSpares": {"adaptive": {"window": "30s"}}}))),
            ["spec.warmSpares.adaptive: window must be between 1m and 168h"]
        );
        assert_eq!(problems("ServerPool", pool(json!({"warmSpares": {"adaptive": {"window": "2h"}}}))), Vec::<String>::new());
        assert_eq!(
            problems(
                "ServerPool",
                pool(json!({"requirements": [{"key": "c", "operator": "Gt", "values": ["x"]}, {"key": "c", "operator": "Lt", "values": ["-3"]}]}))
            ),
            ["spec.requirements[0]: Gt and Lt take exactly one integer value"]
        );
        assert_eq!(
            problems("ServerPool", pool(json!({"requirements": [{"key": "z", "operator": "Near"}]}))),
            [
                "spec.requirements[0].operator: unsupported value \"Near\": must be one of \"In\", \"NotIn\", \"Exists\", \"DoesNotExist\", \"Gt\", \"Lt\""
            ]
        );
        // A transition rule (oldSelf) is an update's concern.
        let claim =
            json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim", "metadata": {"name": "c"}, "spec": {"server": "s", "pool": "p"}});
        assert_eq!(problems("ServerClaim", claim), Vec::<String>::new());
    }

    #[test]
    fn nulls_of_fields_that_are_not_nullable_are_dropped_before_required_is_checked() {
        let with_null = server(json!({"bmc": null, "hardware": {"cpu": 1, "memory": "1Gi"}, "labels": null}));
        assert_eq!(problems("Server", with_null), ["spec: bmc is required unless provider.type is Metal3, External or ClusterAPI"]);
        let missing = server(json!({"bmc": {"address": BMC, "credentialsSecretRef": {"name": "b", "namespace": "n"}}}));
        assert_eq!(problems("Server", missing), ["spec.hardware: required"]);
    }
}
