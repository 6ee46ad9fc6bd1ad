//! Manifests to a [`Snapshot`]: what `ironclaim plan -f FILE...` reads.
//!
//! Multi-document YAML and JSON as `kubectl get -o yaml|json` writes them,
//! `kind: List` included. Pods, Nodes and PodDisruptionBudgets are taken as
//! they are; Deployments, ReplicaSets, StatefulSets and Jobs add the pods
//! they would create and the input does not already hold; DaemonSets become
//! the snapshot's DaemonSets; Servers, ServerPools and ServerClaims become the
//! inventory, the pools and the claims in flight.

use crate::api::validate::Problem;
use crate::api::{self, ServerClaim, ServerPool, Server};
use crate::convert::{serverclaim_in_flight, serverpool_to_core, server_to_core};
use crate::error::ConvertError;
use crate::node::{node_from_k8s, pdb_from_k8s, pod_is_healthy};
use crate::pod::{owner, pod_from_k8s, pod_from_template, workload_name};
use crate::strict::{self, StrictError};
use ironclaim_core::model::{DaemonSet, Owner, PodPhase, Seconds};
use ironclaim_core::{Pod, Snapshot};
use k8s_openapi::api::apps::v1 as apps;
use k8s_openapi::api::batch::v1 as batch;
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::api::policy::v1 as policy;
use k8s_openapi::api::scheduling::v1 as scheduling;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use thiserror::Error;

/// The most pods one load may hold, read and expanded together. A replica
/// count beyond it is a typo, and would only exhaust memory.
pub const MAX_PODS: usize = 500_000;

/// The most documents one file may hold, YAML or JSON: ample for `kubectl
/// get -A -o yaml` of a large cluster written one object a document, and a
/// bound on what a document-separator storm can cost.
pub const MAX_DOCUMENTS: usize = 200_000;

/// Where something was found: the file, the document in it (from 1), the
/// item of a `kind: List`, and the object when its kind and name are known.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Location {
    pub file: String,
    pub document: usize,
    /// The line the document starts on, when the format tells.
    pub line: Option<u64>,
    pub item: Option<usize>,
    pub object: Option<ObjectName>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectName {
    pub kind: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl fmt::Display for ObjectName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind)?;
        match (&self.namespace, &self.name) {
            (Some(ns), Some(name)) => write!(f, " {ns}/{name}"),
            (None, Some(name)) => write!(f, " {name}"),
            (_, None) => Ok(()),
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `file:line:` first, as editors and terminals link it.
        match self.line {
            Some(line) => write!(f, "{}:{line}: document {}", self.file, self.document)?,
            None => write!(f, "{}: document {}", self.file, self.document)?,
        }
        if let Some(item) = self.item {
            write!(f, ", items[{item}]")?;
        }
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        Ok(())
    }
}

/// Something the loader skipped or read approximately; the plan is still
/// made, and the caller shows these.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Warning {
    pub at: Location,
    pub message: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.at, self.message)
    }
}

/// Why manifests could not be loaded.
///
/// Every message is complete on its own: the location, the field path and
/// what is wrong are in the `Display` text, so one line tells the user
/// where to look. Only IO errors keep a source.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("cannot read {file}")]
    Read {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// Not YAML, JSON or UTF-8 text; `line` and `column` count from 1, 0
    /// when unknown.
    #[error("{}: invalid {format}: {message}", position(file, *line, *column))]
    Syntax { file: String, format: &'static str, line: u64, column: u64, message: String },
    #[error("{at}: {message}")]
    NotAnObject { at: Box<Location>, message: String },
    /// A field does not have the type Kubernetes gives it.
    #[error("{at}: {path}: {message}")]
    Field { at: Box<Location>, path: String, message: String },
    /// A field the object's kind does not have: the API server refuses it
    /// (`kubectl apply` validates fields strictly), so it is not dropped.
    /// `more` holds the object's other unknown fields.
    #[error("{at}: {path}: unknown field{}{}", did_you_mean(hint), also(more))]
    UnknownField { at: Box<Location>, path: String, hint: Option<String>, more: Vec<String> },
    /// A field has the right type and a value that cannot be used.
    #[error("{at}: {error}")]
    Convert { at: Box<Location>, error: ConvertError },
    /// A kind of the ironclaim.dev group this version does not know.
    #[error("{at}: unknown kind {kind:?} in {api_version:?} (this version knows {known})")]
    UnknownKind { at: Box<Location>, api_version: String, kind: String, known: String },
    #[error("{at}: {object} is also defined at {first}")]
    Duplicate { at: Box<Location>, object: String, first: Box<Location> },
    #[error("{at}: {message}")]
    TooLarge { at: Box<Location>, message: String },
    /// A file holds more documents than [`MAX_DOCUMENTS`].
    #[error(
        "{file}: more than {limit} documents: ironclaim reads at most {limit} from one file; split it, or write the objects as the items of a List"
    )]
    TooManyDocuments { file: String, limit: usize },
}

impl LoadError {
    /// The error's kind, for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            LoadError::Read { .. } => "read",
            LoadError::Syntax { .. } => "syntax",
            LoadError::NotAnObject { .. } => "not_an_object",
            LoadError::Field { .. } => "field_type",
            LoadError::UnknownField { .. } => "unknown_field",
            LoadError::Convert { error, .. } => error.metric_label(),
            LoadError::UnknownKind { .. } => "unknown_kind",
            LoadError::Duplicate { .. } => "duplicate",
            LoadError::TooLarge { .. } | LoadError::TooManyDocuments { .. } => "too_large",
        }
    }

    /// Where the error is, when it is inside a document.
    pub fn location(&self) -> Option<&Location> {
        match self {
            LoadError::Read { .. } | LoadError::Syntax { .. } | LoadError::TooManyDocuments { .. } => None,
            LoadError::NotAnObject { at, .. }
            | LoadError::Field { at, .. }
            | LoadError::UnknownField { at, .. }
            | LoadError::Convert { at, .. }
            | LoadError::UnknownKind { at, .. }
            | LoadError::Duplicate { at, .. }
            | LoadError::TooLarge { at, .. } => Some(at),
        }
    }
}

/// What manifests hold, and what was skipped on the way.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Manifests {
    pub snapshot: Snapshot,
    pub warnings: Vec<Warning>,
}

/// Loads files as `ironclaim plan -f` does: each path a file, a directory
/// (its `.yaml`, `.yml` and `.json` files, sorted by name, not recursing),
/// or `-` for standard input.
///
/// # Errors
/// The first problem found, located by file, document and field.
pub fn load_files(paths: &[PathBuf]) -> Result<Manifests, LoadError> {
    let mut loader = Loader::new();
    for path in paths {
        loader.add_path(path)?;
    }
    loader.finish()
}

/// Loads one text; `file` names it in errors and picks JSON for `.json`
/// (other text that starts with `{` is tried as JSON, then as YAML).
///
/// # Errors
/// The first problem found, located by document and field.
pub fn load_str(file: &str, text: &str) -> Result<Manifests, LoadError> {
    let mut loader = Loader::new();
    loader.add_str(file, text)?;
    loader.finish()
}

/// Reads manifests from several sources, then resolves what spans them
/// (controllers and their pods, budgets and the pods they select, servers
/// and their nodes) in [`Loader::finish`].
#[derive(Default)]
pub struct Loader {
    entries: Vec<Entry>,
    seen: HashMap<(String, String, String), Location>,
    warnings: Vec<Warning>,
    pods: usize,
}

struct ReadPod {
    at: Location,
    pod: Pod,
    healthy: bool,
    priority: PriorityFrom,
}

/// Where a pod's priority comes from. Admission writes `spec.priority` from
/// the pod's PriorityClass; a hand-written manifest leaves that to us.
#[derive(Clone, Debug, PartialEq, Eq)]
enum PriorityFrom {
    /// `spec.priority` is set, or the template's is.
    Spec,
    /// `priorityClassName` without `spec.priority`.
    Class(String),
    /// Neither: the global default class, if any.
    GlobalDefault,
}

impl PriorityFrom {
    fn of(spec: Option<&k8s::PodSpec>) -> PriorityFrom {
        match spec {
            Some(s) if s.priority.is_none() => match s.priority_class_name.as_deref() {
                Some(class) if !class.is_empty() => PriorityFrom::Class(class.to_string()),
                _ => PriorityFrom::GlobalDefault,
            },
            _ => PriorityFrom::Spec,
        }
    }
}

/// The classes Kubernetes creates itself, with their values.
const SYSTEM_PRIORITY_CLASSES: [(&str, i32); 2] = [("system-cluster-critical", 2_000_000_000), ("system-node-critical", 2_000_001_000)];

struct Workload {
    at: Location,
    priority: PriorityFrom,
    kind: WorkloadKind,
    namespace: String,
    name: String,
    replicas: usize,
    /// The pod it creates, named after the workload until expanded.
    template: Pod,
    /// The Deployment that owns a ReplicaSet.
    deployment: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum WorkloadKind {
    Deployment,
    ReplicaSet,
    StatefulSet,
    Job,
}

impl WorkloadKind {
    fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::Job => "Job",
        }
    }
}

enum Entry {
    Pod(ReadPod),
    Workload(Workload),
    DaemonSet(DaemonSet),
    Node(ironclaim_core::Node),
    Pdb(Location, Box<policy::PodDisruptionBudget>),
    Server(ironclaim_core::Server),
    Pool(ironclaim_core::ServerPool),
    Claim(ironclaim_core::ClaimInFlight),
    PriorityClass { name: String, value: i32, global_default: bool },
}

fn yaml_options() -> serde_saphyr::Options {
    // Large enough for `kubectl get pods -A -o yaml` on a big cluster, small
    // enough that hostile input cannot exhaust memory or the stack.
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_events: 50_000_000,
            max_nodes: 20_000_000,
            max_documents: MAX_DOCUMENTS,
            max_depth: 64,
            max_total_scalar_bytes: 512 * 1024 * 1024,
        },
        // YAML 1.2 booleans only: `n`, `no`, `on`, `off` are strings (a
        // namespace `n`, a power state `On`), and `0755` stays text.
        strict_booleans: true,
        leading_zero_numbers_as_strings: true,
    }
}

impl Loader {
    pub fn new() -> Self {
        Loader::default()
    }

    /// Reads a file, a directory of manifests, or `-` (standard input).
    ///
    /// # Errors
    /// The file cannot be read, or its first bad document.
    pub fn add_path(&mut self, path: &Path) -> Result<(), LoadError> {
        let name = path.display().to_string();
        let read_error = |source| LoadError::Read { file: name.clone(), source };
        if path == Path::new("-") {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).map_err(read_error)?;
            return self.add_str("<stdin>", &text);
        }
        if path.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(read_error)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
                .collect();
            files.sort();
            for file in files {
                self.add_path(&file)?;
            }
            return Ok(());
        }
        let bytes = std::fs::read(path).map_err(read_error)?;
        let text = String::from_utf8(bytes).map_err(|e| LoadError::Syntax {
            file: name.clone(),
            format: "text",
            line: 0,
            column: 0,
            message: format!("not UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        })?;
        self.add_str(&name, &text)
    }

    /// Reads one text holding one or more documents.
    ///
    /// # Errors
    /// Its first bad document.
    pub fn add_str(&mut self, file: &str, text: &str) -> Result<(), LoadError> {
        let documents = if file.ends_with(".json") {
            json_documents(file, text)?
        } else if text.trim_start().starts_with('{') {
            // JSON, or a YAML flow mapping: JSON's errors are the clearer
            // when it is JSON, YAML's when it is not.
            match json_documents(file, text) {
                Ok(docs) => docs,
                Err(json_error) => yaml_documents(file, text).map_err(|_| json_error)?,
            }
        } else {
            yaml_documents(file, text)?
        };
        for (i, (line, value)) in documents.into_iter().enumerate() {
            let at = Location { file: file.to_string(), document: i + 1, line, item: None, object: None };
            self.add_document(at, value)?;
        }
        Ok(())
    }

    fn add_document(&mut self, at: Location, value: Value) -> Result<(), LoadError> {
        let Value::Object(map) = &value else {
            if value.is_null() {
                return Ok(());
            }
            return Err(LoadError::NotAnObject { message: format!("expected a Kubernetes object, found {}", type_name(&value)), at: Box::new(at) });
        };
        let kind = map.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind == "List" || (kind.ends_with("List") && map.get("items").is_some_and(Value::is_array)) {
            let Some(Value::Array(items)) = map.get("items") else {
                return Err(LoadError::Field { at: Box::new(at), path: "items".into(), message: "a List needs an items array".into() });
            };
            for (i, item) in items.iter().enumerate() {
                let at = Location { item: Some(i), ..at.clone() };
                if item.get("kind").and_then(Value::as_str).is_some_and(|k| k.ends_with("List")) {
                    return Err(LoadError::NotAnObject { at: Box::new(at), message: "a List inside a List".into() });
                }
                self.add_object(at, item.clone())?;
            }
            return Ok(());
        }
        self.add_object(at, value)
    }

    fn add_object(&mut self, mut at: Location, value: Value) -> Result<(), LoadError> {
        let Value::Object(map) = &value else {
            return Err(LoadError::NotAnObject { message: format!("expected a Kubernetes object, found {}", type_name(&value)), at: Box::new(at) });
        };
        let Some(kind) = map.get("kind").and_then(Value::as_str).map(str::to_string) else {
            return Err(LoadError::NotAnObject { at: Box::new(at), message: "no kind: not a Kubernetes object".into() });
        };
        let metadata = map.get("metadata");
        let meta_str = |key: &str| metadata.and_then(|m| m.get(key)).and_then(Value::as_str).map(str::to_string);
        at.object = Some(ObjectName { kind: kind.clone(), namespace: meta_str("namespace"), name: meta_str("name") });
        let Some(api_version) = map.get("apiVersion").and_then(Value::as_str).map(str::to_string) else {
            return Err(LoadError::NotAnObject { at: Box::new(at), message: "no apiVersion: not a Kubernetes object".into() });
        };
        let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
        match (group, kind.as_str()) {
            ("", "Pod") => {
                let pod: k8s::Pod = typed(&at, value)?;
                let healthy = pod_is_healthy(&pod);
                let converted = convert(&at, pod_from_k8s(&pod))?;
                self.register(&at, "Pod", &converted.namespace, &converted.name)?;
                self.count_pods(&at, 1)?;
                let priority = PriorityFrom::of(pod.spec.as_ref());
                self.entries.push(Entry::Pod(ReadPod { at, pod: converted, healthy, priority }));
            }
            ("", "Node") => {
                let node: k8s::Node = typed(&at, value)?;
                let converted = convert(&at, node_from_k8s(&node))?;
                self.register(&at, "Node", "", &converted.name)?;
                self.entries.push(Entry::Node(converted));
            }
            ("apps", "Deployment") => {
                let d: apps::Deployment = typed(&at, value)?;
                let spec = &d.spec;
                let replicas = replicas(&at, spec.replicas, "spec.replicas")?;
                self.add_workload(at, WorkloadKind::Deployment, &d.metadata, replicas, &spec.template, None)?;
            }
            ("apps", "ReplicaSet") => {
                let rs: apps::ReplicaSet = typed(&at, value)?;
                let spec = &rs.spec;
                let replicas = replicas(&at, spec.replicas, "spec.replicas")?;
                let template = spec.template.as_ref().ok_or_else(|| missing(&at, "spec.template"))?;
                let deployment =
                    owner(rs.metadata.owner_references.as_deref().unwrap_or_default()).filter(|o| o.kind == "Deployment").map(|o| o.name.clone());
                self.add_workload(at, WorkloadKind::ReplicaSet, &rs.metadata, replicas, template, deployment)?;
            }
            ("apps", "StatefulSet") => {
                let s: apps::StatefulSet = typed(&at, value)?;
                let spec = &s.spec;
                let replicas = replicas(&at, spec.replicas, "spec.replicas")?;
                self.add_workload(at, WorkloadKind::StatefulSet, &s.metadata, replicas, &spec.template, None)?;
            }
            ("batch", "Job") => {
                let job: batch::Job = typed(&at, value)?;
                let spec = job.spec.as_ref().ok_or_else(|| missing(&at, "spec"))?;
                let count = job_pods(&at, &job)?;
                self.add_workload(at, WorkloadKind::Job, &job.metadata, count, &spec.template, None)?;
            }
            ("apps", "DaemonSet") => {
                let ds: apps::DaemonSet = typed(&at, value)?;
                let spec = &ds.spec;
                let (namespace, name) = namespaced_name(&at, &ds.metadata)?;
                let mut template = convert(&at, pod_from_template(&spec.template, &namespace, &name, "spec.template"))?;
                template.owner = Some(Owner { kind: "DaemonSet".into(), name: name.clone() });
                template.workload = Some(name.clone());
                self.register(&at, "DaemonSet", &namespace, &name)?;
                self.entries.push(Entry::DaemonSet(DaemonSet { namespace, name, template }));
            }
            ("scheduling.k8s.io", "PriorityClass") => {
                let class: scheduling::PriorityClass = typed(&at, value)?;
                let name = class.metadata.name.clone().ok_or_else(|| missing(&at, "metadata.name"))?;
                let value = class.value.ok_or_else(|| missing(&at, "value"))?;
                self.register(&at, "PriorityClass", "", &name)?;
                self.entries.push(Entry::PriorityClass { name, value, global_default: class.global_default == Some(true) });
            }
            ("policy", "PodDisruptionBudget") => {
                let pdb: policy::PodDisruptionBudget = typed(&at, value)?;
                let (namespace, name) = namespaced_name(&at, &pdb.metadata)?;
                self.register(&at, "PodDisruptionBudget", &namespace, &name)?;
                self.entries.push(Entry::Pdb(at, Box::new(pdb)));
            }
            (api::GROUP, _) => self.add_ironclaim(at, &api_version, &kind, value)?,
            _ => self.warnings.push(Warning { message: format!("skipped: plan does not read {kind} ({api_version})"), at }),
        }
        Ok(())
    }

    fn add_ironclaim(&mut self, at: Location, api_version: &str, kind: &str, mut value: Value) -> Result<(), LoadError> {
        let known = "Server, ServerPool and ServerClaim in ironclaim.dev/v1alpha1";
        if api_version != api::API_VERSION {
            return Err(LoadError::UnknownKind { at: Box::new(at), api_version: api_version.into(), kind: kind.into(), known: known.into() });
        }
        // The types kube derives for a custom resource have no apiVersion
        // or kind (the impl knows them, and they were just checked): to a
        // strict decoding they would be unknown.
        if let Value::Object(map) = &mut value {
            map.remove("apiVersion");
            map.remove("kind");
        }
        let original = value.clone();
        // The CRD's own rules, once the typed reading (with its errors of
        // type and unknown fields) and the conversion (with its errors
        // that name a quantity or a duration) had their say.
        let schema = |at: &Location| validated(at, kind, &original);
        match kind {
            "Server" => {
                let server: Server = typed(&at, value)?;
                let converted = convert(&at, server_to_core(&server))?;
                schema(&at)?;
                self.register(&at, "Server", "", &converted.name)?;
                self.entries.push(Entry::Server(converted));
            }
            "ServerPool" => {
                let pool: ServerPool = typed(&at, value)?;
                let converted = convert(&at, serverpool_to_core(&pool))?;
                schema(&at)?;
                self.register(&at, "ServerPool", "", &converted.name)?;
                self.entries.push(Entry::Pool(converted));
            }
            "ServerClaim" => {
                let claim: ServerClaim = typed(&at, value)?;
                let name = claim.metadata.name.clone().ok_or_else(|| missing(&at, "metadata.name"))?;
                let in_flight = convert(&at, serverclaim_in_flight(&claim))?;
                schema(&at)?;
                self.register(&at, "ServerClaim", "", &name)?;
                if let Some(in_flight) = in_flight {
                    self.entries.push(Entry::Claim(in_flight));
                }
            }
            _ => return Err(LoadError::UnknownKind { at: Box::new(at), api_version: api_version.into(), kind: kind.into(), known: known.into() }),
        }
        Ok(())
    }

    fn add_workload(
        &mut self,
        at: Location,
        kind: WorkloadKind,
        meta: &ObjectMeta,
        replicas: usize,
        template: &k8s::PodTemplateSpec,
        deployment: Option<String>,
    ) -> Result<(), LoadError> {
        let (namespace, name) = namespaced_name(&at, meta)?;
        let mut pod = convert(&at, pod_from_template(template, &namespace, &name, "spec.template"))?;
        pod.owner = Some(Owner { kind: kind.as_str().into(), name: name.clone() });
        pod.workload = Some(deployment.clone().unwrap_or_else(|| name.clone()));
        pod.created_s = meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second().max(0) as Seconds);
        pod.phase = PodPhase::Pending;
        self.register(&at, kind.as_str(), &namespace, &name)?;
        self.count_pods(&at, replicas)?;
        let priority = PriorityFrom::of(template.spec.as_ref());
        self.entries.push(Entry::Workload(Workload { at, priority, kind, namespace, name, replicas, template: pod, deployment }));
        Ok(())
    }

    fn register(&mut self, at: &Location, kind: &str, namespace: &str, name: &str) -> Result<(), LoadError> {
        let key = (kind.to_string(), namespace.to_string(), name.to_string());
        if let Some(first) = self.seen.get(&key) {
            let object = if namespace.is_empty() { format!("{kind} {name}") } else { format!("{kind} {namespace}/{name}") };
            return Err(LoadError::Duplicate { at: Box::new(at.clone()), object, first: Box::new(first.clone()) });
        }
        self.seen.insert(key, at.clone());
        Ok(())
    }

    fn count_pods(&mut self, at: &Location, more: usize) -> Result<(), LoadError> {
        self.pods = self.pods.saturating_add(more);
        if self.pods > MAX_PODS {
            return Err(LoadError::TooLarge { at: Box::new(at.clone()), message: format!("more than {MAX_PODS} pods in all") });
        }
        Ok(())
    }

    /// Resolves what spans documents and builds the snapshot.
    ///
    /// # Guarantees
    /// - A controller adds only the pods the input does not already hold:
    ///   its desired count minus its pods present and not terminating or
    ///   finished. A Deployment whose ReplicaSets are in the input leaves
    ///   the pods to them. Added pods are named `<controller>-<i>`.
    /// - Pods of a ReplicaSet owned by a Deployment in the input are the
    ///   Deployment's workload.
    /// - A node gets its server from the Server whose status names it.
    /// - A claim in flight marks its server as claimed.
    ///
    /// # Errors
    /// A PodDisruptionBudget whose counts cannot be read.
    pub fn finish(self) -> Result<Manifests, LoadError> {
        let Loader { entries, mut warnings, .. } = self;
        let mut snapshot = Snapshot::default();

        let mut classes: HashMap<String, i32> = SYSTEM_PRIORITY_CLASSES.iter().map(|(n, v)| (n.to_string(), *v)).collect();
        let mut global_default = None;
        for entry in &entries {
            if let Entry::PriorityClass { name, value, global_default: is_default } = entry {
                classes.insert(name.clone(), *value);
                if *is_default {
                    global_default = Some(*value);
                }
            }
        }
        let mut unknown_classes: BTreeMap<String, Location> = BTreeMap::new();
        let mut resolve = |pod: &mut Pod, from: &PriorityFrom, at: &Location| match from {
            PriorityFrom::Spec => {}
            PriorityFrom::GlobalDefault => pod.priority = global_default.unwrap_or(0),
            PriorityFrom::Class(class) => match classes.get(class) {
                Some(value) => pod.priority = *value,
                None => {
                    unknown_classes.entry(class.clone()).or_insert_with(|| at.clone());
                }
            },
        };

        // ReplicaSet -> Deployment, from the ReplicaSets in the input.
        let mut rs_deployment: HashMap<(String, String), String> = HashMap::new();
        let mut deployments_with_rs: BTreeSet<(String, String)> = BTreeSet::new();
        for entry in &entries {
            if let Entry::Workload(w) = entry
                && let Some(d) = &w.deployment
            {
                rs_deployment.insert((w.namespace.clone(), w.name.clone()), d.clone());
                deployments_with_rs.insert((w.namespace.clone(), d.clone()));
            }
        }
        // Pods present per owner, and per Deployment through its ReplicaSets.
        let mut present: HashMap<(String, String, String), usize> = HashMap::new();
        let mut taken_names: BTreeSet<(String, String)> = BTreeSet::new();
        enum Slot<'a> {
            Read(Box<Pod>, bool),
            Expand(&'a Workload),
        }
        let mut slots: Vec<Slot> = Vec::new();
        for entry in &entries {
            match entry {
                Entry::Pod(read) => {
                    let mut pod = read.pod.clone();
                    resolve(&mut pod, &read.priority, &read.at);
                    if let Some(o) = &pod.owner
                        && o.kind == "ReplicaSet"
                        && let Some(d) = rs_deployment.get(&(pod.namespace.clone(), o.name.clone()))
                    {
                        pod.workload = Some(d.clone());
                    }
                    taken_names.insert((pod.namespace.clone(), pod.name.clone()));
                    let live = !pod.terminating && !matches!(pod.phase, PodPhase::Succeeded | PodPhase::Failed);
                    if let (true, Some(o)) = (live, &pod.owner) {
                        *present.entry((pod.namespace.clone(), o.kind.clone(), o.name.clone())).or_default() += 1;
                        if o.kind == "ReplicaSet" {
                            let deployment =
                                rs_deployment.get(&(pod.namespace.clone(), o.name.clone())).cloned().unwrap_or_else(|| workload_name(o, &pod.labels));
                            *present.entry((pod.namespace.clone(), "Deployment".into(), deployment)).or_default() += 1;
                        }
                    }
                    slots.push(Slot::Read(Box::new(pod), read.healthy));
                }
                Entry::Workload(w) => slots.push(Slot::Expand(w)),
                _ => {}
            }
        }
        // Each workload's missing pods take its place in input order.
        let mut expanded: Vec<(Pod, bool)> = Vec::new();
        for slot in slots {
            let w = match slot {
                Slot::Read(pod, healthy) => {
                    expanded.push((*pod, healthy));
                    continue;
                }
                Slot::Expand(w) => w,
            };
            if w.kind == WorkloadKind::Deployment && deployments_with_rs.contains(&(w.namespace.clone(), w.name.clone())) {
                continue;
            }
            let mut template = w.template.clone();
            resolve(&mut template, &w.priority, &w.at);
            let have = present.get(&(w.namespace.clone(), w.kind.as_str().to_string(), w.name.clone())).copied().unwrap_or(0);
            let missing = w.replicas.saturating_sub(have);
            let mut index = 0usize;
            for _ in 0..missing {
                // Bounded: at most `missing` names are taken by this loop and
                // at most the input's pod count were taken before it.
                let name = loop {
                    let candidate = format!("{}-{index}", w.name);
                    index += 1;
                    if !taken_names.contains(&(w.namespace.clone(), candidate.clone())) {
                        break candidate;
                    }
                };
                taken_names.insert((w.namespace.clone(), name.clone()));
                expanded.push((Pod { name, ..template.clone() }, false));
            }
        }

        let mut pdbs = Vec::new();
        for entry in &entries {
            match entry {
                Entry::Node(n) => snapshot.nodes.push(n.clone()),
                Entry::DaemonSet(d) => snapshot.daemonsets.push(d.clone()),
                Entry::Server(s) => snapshot.servers.push(s.clone()),
                Entry::Pool(p) => snapshot.pools.push(p.clone()),
                Entry::Claim(c) => snapshot.claims.push(c.clone()),
                Entry::Pdb(at, pdb) => pdbs.push((at, pdb)),
                Entry::Pod(_) | Entry::Workload(_) | Entry::PriorityClass { .. } => {}
            }
        }
        let selectable: Vec<(&Pod, bool)> = expanded.iter().map(|(p, h)| (p, *h)).collect();
        for (at, pdb) in pdbs {
            if let Some(converted) = convert(at, pdb_from_k8s(pdb, &selectable))? {
                snapshot.pdbs.push(converted);
            }
        }
        snapshot.pods = expanded.into_iter().map(|(p, _)| p).collect();

        let node_server: BTreeMap<String, String> = snapshot.servers.iter().filter_map(|s| s.node.clone().map(|n| (n, s.name.clone()))).collect();
        for node in &mut snapshot.nodes {
            if node.server.is_none() {
                node.server = node_server.get(&node.name).cloned();
            }
        }
        let claimed: BTreeMap<String, String> = snapshot.claims.iter().map(|c| (c.server.clone(), c.name.clone())).collect();
        for server in &mut snapshot.servers {
            if server.claim.is_none() {
                server.claim = claimed.get(&server.name).cloned();
            }
        }
        for (class, at) in unknown_classes {
            warnings.push(Warning { at, message: format!("PriorityClass {class} is not in the input: its pods are planned at priority 0") });
        }
        Ok(Manifests { snapshot, warnings })
    }
}

fn did_you_mean(hint: &Option<String>) -> String {
    hint.as_ref().map(|h| format!(" (did you mean {h}?)")).unwrap_or_default()
}

fn also(more: &[String]) -> String {
    match more {
        [] => String::new(),
        [one] => format!(" (and {one})"),
        [first, rest @ ..] => format!(" (and {first} and {} more)", rest.len()),
    }
}

fn position(file: &str, line: u64, column: u64) -> String {
    match (line, column) {
        (0, _) => file.to_string(),
        (l, 0) => format!("{file}:{l}"),
        (l, c) => format!("{file}:{l}:{c}"),
    }
}

/// Decodes an object strictly (see [`crate::strict`]): a field of the wrong
/// type, or one the kind does not have, is an error.
fn typed<T: DeserializeOwned + JsonSchema>(at: &Location, value: Value) -> Result<T, LoadError> {
    strict::decode(value).map_err(|e| match e {
        StrictError::Type { path, message } => LoadError::Field { at: Box::new(at.clone()), path, message },
        StrictError::Unknown { mut paths, hint } => {
            let path = paths.remove(0);
            LoadError::UnknownField { at: Box::new(at.clone()), path, hint, more: paths }
        }
    })
}

/// Checks an ironclaim.dev object against its CRD ([`api::validate`]): the
/// first violation, unknown fields first, is the error.
fn validated(at: &Location, kind: &str, object: &Value) -> Result<(), LoadError> {
    let Some(first) = api::validate::validate(kind, object).and_then(|v| v.into_iter().next()) else { return Ok(()) };
    let at = Box::new(at.clone());
    Err(match first.problem {
        Problem::UnknownField => LoadError::UnknownField { at, path: first.path, hint: None, more: Vec::new() },
        Problem::Required => LoadError::Convert { at, error: ConvertError::Missing { path: first.path } },
        Problem::Invalid(message) => LoadError::Convert { at, error: ConvertError::Invalid { path: first.path, message } },
    })
}

fn convert<T>(at: &Location, result: Result<T, ConvertError>) -> Result<T, LoadError> {
    result.map_err(|error| LoadError::Convert { at: Box::new(at.clone()), error })
}

fn missing(at: &Location, path: &str) -> LoadError {
    LoadError::Convert { at: Box::new(at.clone()), error: ConvertError::Missing { path: path.into() } }
}

fn namespaced_name(at: &Location, meta: &ObjectMeta) -> Result<(String, String), LoadError> {
    let name = meta.name.clone().ok_or_else(|| missing(at, "metadata.name"))?;
    Ok((meta.namespace.clone().unwrap_or_else(|| "default".into()), name))
}

/// `spec.replicas`, 1 when unset as the API server defaults it.
fn replicas(at: &Location, value: Option<i32>, path: &str) -> Result<usize, LoadError> {
    let n = value.unwrap_or(1);
    usize::try_from(n).map_err(|_| LoadError::Convert {
        at: Box::new(at.clone()),
        error: ConvertError::invalid(path.into(), format!("must not be negative, found {n}")),
    })
}

/// The pods a Job runs at once: none when suspended or finished, else its
/// parallelism (1 when unset), at most the completions still to go.
fn job_pods(at: &Location, job: &batch::Job) -> Result<usize, LoadError> {
    let Some(spec) = job.spec.as_ref() else { return Ok(0) };
    if spec.suspend == Some(true) {
        return Ok(0);
    }
    let status = job.status.as_ref();
    let finished = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True"));
    if finished {
        return Ok(0);
    }
    let parallelism = replicas(at, spec.parallelism, "spec.parallelism")?;
    match spec.completions {
        None => Ok(parallelism),
        Some(c) => {
            let completions = replicas(at, Some(c), "spec.completions")?;
            let succeeded = status.and_then(|s| s.succeeded).unwrap_or(0).max(0) as usize;
            Ok(parallelism.min(completions.saturating_sub(succeeded)))
        }
    }
}

/// The values of a JSON text, each with the line it starts on.
fn json_documents(file: &str, text: &str) -> Result<Vec<(Option<u64>, Value)>, LoadError> {
    let mut docs = Vec::new();
    let mut stream = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let (mut counted, mut line) = (0usize, 1u64);
    loop {
        let before = stream.byte_offset();
        let Some(value) = stream.next() else { break };
        if docs.len() == MAX_DOCUMENTS {
            return Err(LoadError::TooManyDocuments { file: file.to_string(), limit: MAX_DOCUMENTS });
        }
        let value = value.map_err(|e| LoadError::Syntax {
            file: file.to_string(),
            format: "JSON",
            line: e.line() as u64,
            column: e.column() as u64,
            message: json_message(&e),
        })?;
        let rest = &text[before..];
        let start = before + (rest.len() - rest.trim_start().len());
        // Counted on from the previous document: a stream of many small
        // documents is read in linear time.
        line += text[counted..start].bytes().filter(|b| *b == b'\n').count() as u64;
        counted = start;
        docs.push((Some(line), value));
    }
    Ok(docs)
}

/// The documents of a YAML text, each with the line it starts on; empty
/// documents are left out.
fn yaml_documents(file: &str, text: &str) -> Result<Vec<(Option<u64>, Value)>, LoadError> {
    let docs: Vec<serde_saphyr::Spanned<Value>> = serde_saphyr::from_multiple_with_options(text, yaml_options()).map_err(|e| yaml_error(file, &e))?;
    Ok(docs.into_iter().map(|d| (Some(d.referenced.line()).filter(|l| *l > 0), d.value)).collect())
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

fn json_message(e: &serde_json::Error) -> String {
    // serde_json appends " at line L column C"; the location is shown apart.
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

fn yaml_error(file: &str, e: &serde_saphyr::Error) -> LoadError {
    if let serde_saphyr::Error::Budget { breach: serde_saphyr::budget::BudgetBreach::Documents { .. }, .. } = e.without_snippet() {
        return LoadError::TooManyDocuments { file: file.to_string(), limit: MAX_DOCUMENTS };
    }
    let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
    let options = serde_saphyr::render_options! { snippets: serde_saphyr::SnippetMode::Off };
    let mut message = e.render_with_options(options);
    for suffix in [" at line ", ", set DuplicateKeyPolicy"] {
        if let Some(i) = message.rfind(suffix) {
            message.truncate(i);
        }
    }
    LoadError::Syntax { file: file.to_string(), format: "YAML", line, column, message }
}
