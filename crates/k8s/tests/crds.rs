//! The CRD manifests: their shape, structural schemas, printer columns and
//! CEL rules, and the YAML `ironclaim crds` prints. (The API server's own
//! verdict is in `crds_apiserver.rs`.)

use ironclaim_k8s::api::{self, crds, crds_yaml};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

fn schema(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    serde_json::to_value(version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("a schema")).unwrap()
}

fn crd(kind: &str) -> CustomResourceDefinition {
    crds().into_iter().find(|c| c.spec.names.kind == kind).unwrap_or_else(|| panic!("no CRD for {kind}"))
}

#[test]
fn three_cluster_scoped_kinds_with_status_subresources() {
    let all = crds();
    let kinds: Vec<&str> = all.iter().map(|c| c.spec.names.kind.as_str()).collect();
    assert_eq!(kinds, vec!["Server", "ServerPool", "ServerClaim"]);
    for crd in &all {
        assert_eq!(crd.spec.group, api::GROUP);
        assert_eq!(crd.spec.scope, "Cluster", "{}", crd.spec.names.kind);
        assert_eq!(crd.metadata.name.as_deref(), Some(format!("{}.{}", crd.spec.names.plural, api::GROUP).as_str()));
        let [version] = &crd.spec.versions[..] else { panic!("one version") };
        assert_eq!(version.name, api::VERSION);
        assert!(version.served && version.storage);
        assert!(version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some(), "{} has a status subresource", crd.spec.names.kind);
        assert_eq!(crd.spec.names.categories.as_deref(), Some(&["ironclaim".to_string()][..]));
    }
}

#[test]
fn printer_columns_show_what_an_operator_looks_for() {
    let columns = |kind: &str| -> Vec<(String, String)> {
        crd(kind).spec.versions[0].additional_printer_columns.iter().flatten().map(|c| (c.name.clone(), c.json_path.clone())).collect()
    };
    let names = |kind: &str| columns(kind).into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    assert_eq!(names("Server"), ["Power", "Claim", "Node", "CPU", "Memory", "Maintenance", "Failures", "Quarantined", "Age"]);
    assert_eq!(names("ServerPool"), ["Weight", "Servers", "CPU", "Watts", "Age"]);
    assert_eq!(names("ServerClaim"), ["Server", "Pool", "Stage", "Node", "Reason", "Age"]);
    // Every column points at a field the schema has.
    for kind in ["Server", "ServerPool", "ServerClaim"] {
        let schema = schema(&crd(kind));
        for (name, path) in columns(kind) {
            if path.starts_with(".metadata.") {
                continue;
            }
            let mut node = &schema;
            for part in path.trim_start_matches('.').split('.') {
                // A map's keys are any names: `.status.resources.cpu`.
                node = node
                    .get("properties")
                    .and_then(|p| p.get(part))
                    .or_else(|| node.get("additionalProperties"))
                    .unwrap_or_else(|| panic!("{kind} column {name}: {path} is not in the schema"));
            }
        }
    }
}

/// Kubernetes accepts only structural schemas: every node says its type
/// (or is an int-or-string), objects list their properties or their
/// additionalProperties, and no `$ref` or free-standing `anyOf` remains.
fn check_structural(node: &Value, path: &str, problems: &mut Vec<String>) {
    let Some(map) = node.as_object() else {
        problems.push(format!("{path}: not an object"));
        return;
    };
    let int_or_string = map.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
    if !int_or_string && !map.contains_key("type") {
        problems.push(format!("{path}: no type"));
    }
    for forbidden in ["$ref", "allOf", "oneOf", "anyOf", "not", "definitions", "$defs"] {
        if map.contains_key(forbidden) {
            problems.push(format!("{path}: {forbidden}"));
        }
    }
    if map.get("type") == Some(&Value::String("object".into())) && !map.contains_key("properties") && !map.contains_key("additionalProperties") {
        problems.push(format!("{path}: an object with neither properties nor additionalProperties"));
    }
    if let Some(props) = map.get("properties").and_then(Value::as_object) {
        for (name, child) in props {
            check_structural(child, &format!("{path}.{name}"), problems);
        }
    }
    if let Some(items) = map.get("items") {
        check_structural(items, &format!("{path}[]"), problems);
    }
    if let Some(extra) = map.get("additionalProperties").filter(|v| v.is_object()) {
        check_structural(extra, &format!("{path}{{}}"), problems);
    }
}

#[test]
fn schemas_are_structural() {
    for crd in crds() {
        let mut problems = Vec::new();
        let schema = schema(&crd);
        // The root's metadata, apiVersion and kind are the API server's.
        for part in ["spec", "status"] {
            check_structural(&schema["properties"][part], part, &mut problems);
        }
        assert!(problems.is_empty(), "{}: {problems:#?}", crd.spec.names.kind);
    }
}

fn rules_at<'a>(schema: &'a Value, path: &[&str]) -> Vec<&'a str> {
    let mut node = schema;
    for part in path {
        node = if *part == "[]" { &node["items"] } else { &node["properties"][part] };
    }
    node["x-kubernetes-validations"].as_array().map(|rules| rules.iter().filter_map(|r| r["message"].as_str()).collect()).unwrap_or_default()
}

#[test]
fn cel_rules_sit_where_a_rule_spans_fields() {
    let server = schema(&crd("Server"));
    assert_eq!(rules_at(&server, &["spec", "bmc"]), ["caBundle and insecureSkipVerify are mutually exclusive"]);
    assert_eq!(rules_at(&server, &["spec", "power"]), ["peakWatts must be at least idleWatts", "gpuWatts must be at most peakWatts - idleWatts"]);
    assert_eq!(rules_at(&server, &["status", "measuredDurations", "boot"]), ["p90Seconds must be at least p50Seconds"]);
    let pool = schema(&crd("ServerPool"));
    assert_eq!(
        rules_at(&pool, &["spec", "requirements", "[]"]),
        ["In and NotIn need at least one value", "Exists and DoesNotExist take no values", "Gt and Lt take exactly one integer value"]
    );
    assert_eq!(rules_at(&pool, &["spec", "warmSpares"]), ["schedule and duration go together"]);
    assert_eq!(rules_at(&pool, &["spec", "warmSpares", "adaptive"]), ["window must be between 1m and 168h"]);
    assert_eq!(rules_at(&pool, &["spec", "disruption", "budgets", "[]"]), ["schedule and duration go together"]);
    let claim = schema(&crd("ServerClaim"));
    assert_eq!(rules_at(&claim, &["spec"]), ["server is immutable", "pool is immutable"]);
    assert_eq!(rules_at(&claim, &["status"]), ["failureMessage needs a failureReason"]);
}

#[test]
fn quantities_and_counts_cannot_go_negative() {
    let pool = schema(&crd("ServerPool"));
    let limits = &pool["properties"]["spec"]["properties"]["limits"]["properties"];
    for field in ["cpu", "memory"] {
        let pattern = limits[field]["pattern"].as_str().unwrap_or_else(|| panic!("limits.{field} has a pattern"));
        // At most a plus sign before the number.
        assert!(pattern.starts_with(r"^\+?(([0-9]"), "no minus sign allowed: {pattern}");
        assert_eq!(limits[field]["x-kubernetes-int-or-string"], Value::Bool(true));
    }
    for field in ["gpus", "servers", "watts"] {
        assert_eq!(limits[field]["minimum"].as_f64(), Some(0.0), "limits.{field}");
    }
}

#[test]
fn the_yaml_stream_reads_back_as_the_same_crds() {
    let yaml = crds_yaml().expect("serializes");
    assert_eq!(yaml.matches("\n---\n").count() + usize::from(yaml.starts_with("---\n")), 3);
    let back: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&yaml).expect("reads back");
    assert_eq!(back, crds());
}

/// Every field of every CRD is named in docs/api.md: a field added to the
/// API without its documentation fails here.
#[test]
fn docs_api_md_names_every_field() {
    let doc = include_str!("../../../docs/api.md");
    let mut documented = std::collections::BTreeSet::new();
    for span in doc.split('`').skip(1).step_by(2) {
        for word in span.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            documented.insert(word.to_string());
        }
    }
    fn fields(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
        if let Some(props) = node.get("properties").and_then(Value::as_object) {
            for (name, child) in props {
                let here = format!("{path}.{name}");
                out.push((name.clone(), here.clone()));
                fields(child, &here, out);
            }
        }
        if let Some(items) = node.get("items") {
            fields(items, &format!("{path}[]"), out);
        }
    }
    let mut missing = Vec::new();
    for crd in crds() {
        let schema = schema(&crd);
        let mut all = Vec::new();
        for part in ["spec", "status"] {
            fields(&schema["properties"][part], &format!("{}.{part}", crd.spec.names.kind), &mut all);
        }
        // metav1.Condition's own fields are Kubernetes', documented there.
        all.retain(|(_, path)| !path.contains(".conditions[]."));
        missing.extend(all.into_iter().filter(|(name, _)| !documented.contains(name)).map(|(_, path)| path));
    }
    assert!(missing.is_empty(), "fields missing from docs/api.md: {missing:#?}");
}

/// Issue 16, item 6: one name per stage and per failure reason. The
/// ServerClaim API lists exactly the driver's stages and reasons (one enum
/// each), and every label metrics, logs, reports and the simulator use is
/// that name in snake_case.
#[test]
fn the_api_the_metrics_and_the_simulator_name_each_stage_and_reason_one_way() {
    let status = &schema(&crd("ServerClaim"))["properties"]["status"]["properties"];
    // Every value the schema allows, in order, whatever way it groups them.
    fn listed(v: &Value) -> Vec<String> {
        let mut out: Vec<String> = v["enum"].as_array().into_iter().flatten().filter_map(|s| s.as_str().map(str::to_string)).collect();
        for key in ["oneOf", "anyOf"] {
            out.extend(v[key].as_array().into_iter().flatten().flat_map(listed));
        }
        out
    }
    let snake = |name: &str| {
        let mut out = String::new();
        for (i, c) in name.chars().enumerate() {
            if c.is_uppercase() && i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    };
    // The values the CRD allows for `field`, and the names of `all`, as sets.
    let same_set = |field: &str, all: Vec<String>| {
        let mut allowed = listed(&status[field]);
        allowed.sort();
        let mut all = all;
        all.sort();
        assert_eq!(allowed, all, "{field}");
    };
    same_set("stage", ironclaim_driver::Stage::ALL.iter().map(|s| format!("{s:?}")).collect());
    for s in ironclaim_driver::Stage::ALL {
        assert_eq!(s.label(), snake(&format!("{s:?}")), "{s:?}");
    }
    same_set("failureReason", ironclaim_driver::FailureReason::ALL.iter().map(|r| format!("{r:?}")).collect());
    for r in ironclaim_driver::FailureReason::ALL {
        assert_eq!(r.label(), snake(&format!("{r:?}")), "{r:?}");
    }
}

/// The `format`s kube-apiserver v1.37 recognizes. Any other, such as the
/// `uint32` schemars writes for a Rust `u32`, makes every `kubectl apply`
/// of the CRDs warn `unrecognized format "uint32"`, and the API server
/// ignores it. (Checked against kube-apiserver v1.37.2: `int8`, `int16`,
/// `uint8` .. `uint64` warn; all of these do not.)
const FORMATS_KUBERNETES_RECOGNIZES: [&str; 31] = [
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "password",
    "date",
    "date-time",
    "datetime",
    "duration",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "bsonobjectid",
    "k8s-short-name",
    "k8s-long-name",
];

#[test]
fn every_format_in_the_crds_is_one_kubernetes_recognizes() {
    fn formats(node: &Value, path: &str, out: &mut Vec<(String, String)>) {
        match node {
            Value::Object(map) => {
                if let Some(Value::String(format)) = map.get("format") {
                    out.push((path.to_string(), format.clone()));
                }
                for (key, child) in map {
                    formats(child, &format!("{path}.{key}"), out);
                }
            }
            Value::Array(items) => items.iter().enumerate().for_each(|(i, child)| formats(child, &format!("{path}[{i}]"), out)),
            _ => {}
        }
    }
    let mut unrecognized = Vec::new();
    let mut seen = 0;
    for crd in crds() {
        let mut found = Vec::new();
        formats(&schema(&crd), &crd.spec.names.kind, &mut found);
        seen += found.len();
        unrecognized.extend(found.into_iter().filter(|(_, f)| !FORMATS_KUBERNETES_RECOGNIZES.contains(&f.as_str())));
    }
    assert!(seen > 0, "the scan found no format at all");
    assert!(unrecognized.is_empty(), "formats kube-apiserver does not recognize: {unrecognized:#?}");
    // The checked-in manifests are what `ironclaim crds` prints (deploy_crds
    // in the controller's tests); scan their text too.
    for path in ["crds/ironclaim.dev.yaml", "helm/ironclaim/crds/ironclaim.dev.yaml"] {
        let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(path);
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        let bad: Vec<&str> =
            text.lines().filter_map(|l| l.trim().strip_prefix("format: ")).filter(|f| !FORMATS_KUBERNETES_RECOGNIZES.contains(f)).collect();
        assert!(bad.is_empty(), "deploy/{path}: formats kube-apiserver does not recognize: {bad:?}");
    }
}

/// The loader evaluates the CRDs' CEL rules itself: one it could not
/// compile would refuse every object under it.
#[test]
fn every_cel_rule_of_the_crds_compiles_for_the_loader() {
    let rules = ironclaim_k8s::api::validate::rules();
    assert!(rules.len() >= 12, "{rules:#?}");
    let broken: Vec<_> = rules.iter().filter(|(_, _, compiled)| compiled.is_err()).collect();
    assert!(broken.is_empty(), "{broken:#?}");
}
