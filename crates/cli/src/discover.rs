//! `ironclaim servers discover`: the inventory written from the BMCs. Each
//! system a BMC serves becomes one `Server` manifest on stdout (YAML, or a
//! JSON List); what could not be determined, and every endpoint or system
//! that failed, is a row of the table on stderr. With `--metal3` the
//! machines come from Metal3's BareMetalHosts instead ([`metal3`]).
//!
//! With `--apply`, the complete manifests are also server-side applied
//! (field manager `ironclaim-discover`) without force: a field another
//! manager (an operator's `kubectl apply`) set is taken out and left as it
//! is, and the rest applied, each such field a row of the table.
//!
//! Exit codes: 0 every endpoint answered and every manifest is complete
//! (and applied); 1 an endpoint or a system failed, a manifest lacks a
//! field the CRD requires, or an apply failed (the good manifests are
//! printed all the same); 2 bad input (an address, a file, the
//! credentials, the kubeconfig), before any BMC is asked.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use ironclaim_k8s::api::validate::{Problem, validate};
use ironclaim_redfish::discover::{DiscoveredSystem, Fact, SystemOutcome};
use ironclaim_redfish::{Bmc, BmcAddress, BmcConfig, Timing};
use serde_json::{Map, Value, json};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use url::Url;

use crate::bmc::{bad_or_world, row_error};
use crate::exit::Failure;

mod cluster_api;
mod metal3;

/// The labels a chassis's place in the rack becomes.
pub const RACK_LABEL: &str = "ironclaim.dev/rack";
pub const ROW_LABEL: &str = "ironclaim.dev/row";
pub const RACK_UNIT_LABEL: &str = "ironclaim.dev/rack-unit";
pub const SLOT_LABEL: &str = "ironclaim.dev/slot";
/// The annotations that record what identifies the machine.
pub const SYSTEM_UUID_ANNOTATION: &str = "ironclaim.dev/system-uuid";
pub const SERIAL_NUMBER_ANNOTATION: &str = "ironclaim.dev/serial-number";
pub const MAC_ADDRESSES_ANNOTATION: &str = "ironclaim.dev/mac-addresses";
/// The watts the BMC read while the system was on, at discovery.
pub const WATTS_READ_ANNOTATION: &str = "ironclaim.dev/discovered-watts";

/// The most endpoints one run reads: a bound on a runaway file.
const MAX_ENDPOINTS: usize = 10_000;
/// `spec.hardware.gpus`'s bound in the CRD.
const MAX_GPU_MODELS: usize = 16;
/// `spec.bmc.caBundle`'s bound in the CRD.
const MAX_CA_BUNDLE_CHARS: usize = 65_536;

#[derive(clap::Args)]
pub struct Args {
    /// BMC endpoints: https://host[:port] (every system it serves), or an
    /// address naming one system, such as
    /// redfish+https://host/redfish/v1/Systems/ID.
    #[arg(value_name = "ENDPOINT", required_unless_present_any = ["endpoints_file", "metal3", "cluster_api"])]
    endpoints: Vec<String>,
    /// Read Metal3 instead of BMCs: each provisioned or externally
    /// provisioned BareMetalHost (metal3.io/v1alpha1) of the cluster, with
    /// its HardwareData, becomes a Server powered through Metal3
    /// (spec.provider.type: Metal3).
    #[arg(
        long,
        conflicts_with_all = [
            "endpoints", "endpoints_file", "username", "password_file", "credentials_dir", "ca_file",
            "insecure_skip_verify", "auth", "concurrency", "request_timeout", "credentials_secret",
        ]
    )]
    metal3: bool,
    /// Read Cluster API instead of BMCs: each MachineDeployment that is a
    /// node group (it has the Cluster Autoscaler's max-size annotation)
    /// becomes one Server per replica it may have
    /// (spec.provider.type: ClusterAPI), with the capacity its
    /// scale-from-zero annotations or its infrastructure template give.
    #[arg(
        long,
        conflicts_with_all = [
            "metal3", "endpoints", "endpoints_file", "username", "password_file", "credentials_dir", "ca_file",
            "insecure_skip_verify", "auth", "concurrency", "request_timeout", "credentials_secret",
        ]
    )]
    cluster_api: bool,
    /// With --metal3 or --cluster-api: the namespace of the BareMetalHosts
    /// or MachineDeployments; without it, the kubeconfig context's
    /// namespace.
    #[arg(short, long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// With --metal3 or --cluster-api: every namespace.
    #[arg(short = 'A', long, conflicts_with = "namespace")]
    all_namespaces: bool,
    /// With --metal3 or --cluster-api: only the BareMetalHosts or
    /// MachineDeployments whose labels match this selector
    /// (rack=r7,role!=storage).
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    selector: Option<String>,
    /// A file of endpoints, one per line; blank lines and lines starting
    /// with # are skipped.
    #[arg(long, value_name = "FILE")]
    endpoints_file: Option<PathBuf>,
    #[command(flatten)]
    access: crate::bmc::BmcAccess,
    /// HTTP requests in flight across all BMCs.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// How long one HTTP request may take: a duration (15s, 1m) or a
    /// number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = crate::duration::go_or_seconds)]
    request_timeout: Duration,
    /// The Secret the controller will read the BMC credentials from, as
    /// NAMESPACE/NAME; written into each Server as
    /// spec.bmc.credentialsSecretRef.
    #[arg(long, value_name = "NAMESPACE/NAME", default_value = "ironclaim-system/bmc-credentials")]
    credentials_secret: String,
    /// How to print the manifests: yaml (one document per Server) or json
    /// (one List).
    #[arg(short, long, value_enum, default_value_t = ManifestFormat::Yaml)]
    output: ManifestFormat,
    /// Also apply the complete manifests to the cluster (server-side apply,
    /// field manager ironclaim-discover), leaving every field another
    /// manager set as it is. With --metal3, the cluster the hosts are read
    /// from.
    #[arg(long)]
    apply: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum ManifestFormat {
    /// A stream of YAML documents, for `kubectl apply -f -`.
    Yaml,
    /// One `kind: List` JSON document.
    Json,
}

/// What goes into every manifest besides what the BMC says.
struct Settings {
    secret_namespace: String,
    secret_name: String,
    ca_bundle: Option<String>,
    insecure_skip_verify: bool,
}

/// One row of the table on stderr: a field left out, or a failure.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Gap {
    /// The BMC endpoint; empty with `--metal3`.
    endpoint: String,
    /// The system's path, or `-` when the endpoint failed; with
    /// `--metal3`, the BareMetalHost's `NAMESPACE/NAME`.
    system: String,
    /// The Server's name, when a manifest was written.
    server: String,
    field: String,
    why: String,
}

/// What one run found.
#[derive(Default)]
struct Found {
    manifests: Vec<Value>,
    /// The names of the manifests the CRD refuses: never applied.
    incomplete_names: BTreeSet<String>,
    gaps: Vec<Gap>,
    failed_endpoints: usize,
    failed_systems: usize,
    applied: usize,
    failed_applies: usize,
    /// With `--metal3`: the BareMetalHosts that cannot be Servers; with
    /// `--cluster-api`, the MachineDeployments that are no node group (a
    /// row each). Not a failure: a host waiting to be provisioned is
    /// normal.
    unusable_hosts: usize,
}

pub fn run(args: Args, cluster: &crate::cluster::ClusterArgs) -> Result<(), Failure> {
    crate::logging::init(crate::logging::LogFormat::Text, "warn");
    ironclaim_redfish::install_crypto_provider();
    if args.metal3 {
        return metal3::run(&args, cluster);
    }
    if args.cluster_api {
        return cluster_api::run(&args, cluster);
    }
    // clap's `requires` is met by a flag's default: checked here.
    if args.namespace.is_some() || args.all_namespaces || args.selector.is_some() {
        return Err(Failure::bad_input(anyhow!(
            "--namespace, --all-namespaces and --selector choose BareMetalHosts or MachineDeployments: they go with --metal3 or --cluster-api"
        )));
    }
    if args.request_timeout.is_zero() {
        return Err(Failure::bad_input(anyhow!("--request-timeout must be longer than 0s")));
    }
    let addresses = endpoints(&args).map_err(Failure::BadInput)?;
    let credentials = args.access.credentials().map_err(Failure::BadInput)?;
    let settings = settings(&args).map_err(Failure::BadInput)?;
    let limiter = Arc::new(Semaphore::new(args.concurrency as usize));
    let tls = args.access.tls();
    let timing = Timing { request_timeout: args.request_timeout, ..Timing::default() };
    let mut clients = Vec::new();
    for address in addresses {
        let mut config = BmcConfig::new(address.endpoint.clone(), credentials.clone());
        config.tls = tls.clone();
        config.auth = args.access.auth.mode();
        config.timing = timing.clone();
        clients.push((address, Bmc::new(config, limiter.clone()).map_err(bad_or_world)?));
    }

    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime").map_err(Failure::World)?;
    // A kubeconfig that does not work is bad input, found before any BMC is asked.
    let cluster = if args.apply { Some(runtime.block_on(crate::cluster::connect(cluster))?) } else { None };
    let outcomes = runtime.block_on(async {
        let mut tasks = JoinSet::new();
        for (index, (address, bmc)) in clients.into_iter().enumerate() {
            tasks.spawn(async move {
                let outcome = bmc.inventory(address.system.as_ref()).await;
                // A session left open expires on the BMC by itself.
                let _ = bmc.logout().await;
                (index, address.endpoint, outcome)
            });
        }
        let mut outcomes = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            if let Ok(outcome) = joined {
                outcomes.push(outcome);
            }
        }
        // In the order given, whatever order they answered in.
        outcomes.sort_by_key(|(index, _, _)| *index);
        outcomes
    });

    let mut found = Found::default();
    let mut names = BTreeSet::new();
    for (_, endpoint, outcome) in outcomes {
        match outcome {
            Ok(systems) => add_systems(&mut found, &mut names, &endpoint, systems, &settings),
            Err(err) => {
                found.failed_endpoints += 1;
                let err = row_error(&err);
                found.gaps.push(Gap {
                    endpoint: endpoint.to_string(),
                    system: "-".into(),
                    server: String::new(),
                    field: "-".into(),
                    why: format!("{}: {}", err.kind, err.message),
                });
            }
        }
    }

    if let Some(connection) = &cluster {
        let origin = |manifest: &Value| (connection.server.clone(), manifest["spec"]["bmc"]["address"].as_str().unwrap_or_default().to_owned());
        runtime.block_on(apply_all(connection, &mut found, origin));
    }
    report(&args, &found, Source::Redfish)
}

/// The runtime of the cluster-reading sources.
fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| Failure::world(anyhow!("cannot start the async runtime: {e}")))
}

/// The namespace `--namespace` or `--all-namespaces` chooses (None: every
/// one), else the kubeconfig context's.
fn chosen_namespace(args: &Args, connection: &crate::cluster::Connection) -> Option<String> {
    match (&args.namespace, args.all_namespaces) {
        (Some(namespace), _) => Some(namespace.clone()),
        (None, true) => None,
        (None, false) => Some(connection.client.default_namespace().to_owned()),
    }
}

/// Says on stderr that nothing of `kind` was found where `args` looked.
fn say_none_found(kind: &str, namespace: Option<&str>, args: &Args) {
    let place = namespace.map_or_else(|| "in any namespace".to_owned(), |ns| format!("in namespace {ns}"));
    let selector = args.selector.as_ref().map(|s| format!(" matching {s:?}")).unwrap_or_default();
    eprintln!("no {kind} {place}{selector}");
}

/// A failed list of a peer's objects, typed: not served is the world
/// (`served` names the resource and its CRDs), a refused selector bad
/// input, an API server that does not answer the world with the fix.
fn list_failure(err: &kube::Error, connection: &crate::cluster::Connection, selector: Option<&str>, plural: &str, served: &str) -> Failure {
    match err {
        kube::Error::Api(status) if status.code == 404 => {
            Failure::world(anyhow!("the cluster at {} serves no {served} are not installed there", connection.server))
        }
        kube::Error::Api(status) if status.code == 400 && selector.is_some() => {
            Failure::bad_input(anyhow!("--selector {:?}: {}", selector.unwrap_or_default(), status.message))
        }
        kube::Error::Api(_) => Failure::world(anyhow!("cannot list the {plural} of {}: {}", connection.server, one_line(err))),
        other => Failure::world(anyhow!(
            "the API server {} does not answer ({}): check --kubeconfig, --context and the network path to it",
            connection.server,
            crate::cluster::root_cause(other)
        )),
    }
}

/// An API error in one line.
fn one_line(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string().lines().next().unwrap_or_default().to_owned(),
    }
}

/// Where the machines were read from, which decides the table's columns.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Source {
    Redfish,
    Metal3,
    ClusterApi,
}

/// Prints the manifests, the table and the summary, and says the exit code.
fn report(args: &Args, found: &Found, source: Source) -> Result<(), Failure> {
    // The manifests first, so that on a terminal the table is not scrolled
    // away by them; a reader gone from stdout does not hide a failure.
    match print(args.output, &found.manifests) {
        Ok(()) | Err(Failure::OutputClosed) => {}
        Err(other) => return Err(other),
    }
    if !found.gaps.is_empty() {
        eprint!("{}", table(&found.gaps, source));
    }
    if source == Source::Metal3 {
        let hosts = found.manifests.len() + found.unusable_hosts;
        eprintln!(
            "read {}: {}, {}{}",
            crate::render::count(hosts as u64, "BareMetalHost", "BareMetalHosts"),
            crate::render::count(found.manifests.len() as u64, "Server written", "Servers written"),
            crate::render::count(found.unusable_hosts as u64, "host not used", "hosts not used"),
            if found.unusable_hosts > 0 { " (see the table)" } else { "" },
        );
    }
    if source == Source::ClusterApi {
        let deployments =
            found.unusable_hosts + found.manifests.iter().map(|m| m["spec"]["provider"]["clusterAPI"].to_string()).collect::<BTreeSet<_>>().len();
        eprintln!(
            "read {}: {}, {}{}",
            crate::render::count(deployments as u64, "MachineDeployment", "MachineDeployments"),
            crate::render::count(found.manifests.len() as u64, "Server written", "Servers written"),
            crate::render::count(found.unusable_hosts as u64, "deployment not used", "deployments not used"),
            if found.unusable_hosts > 0 { " (see the table)" } else { "" },
        );
    }
    if args.apply {
        eprintln!("applied {} (field manager {FIELD_MANAGER})", crate::render::count(found.applied as u64, "Server", "Servers"));
    }
    verdict(found)
}

/// Exit 1 when anything failed or a manifest is incomplete.
fn verdict(found: &Found) -> Result<(), Failure> {
    let mut problems = Vec::new();
    if found.failed_endpoints > 0 {
        problems.push(crate::render::count(found.failed_endpoints as u64, "endpoint failed", "endpoints failed"));
    }
    if found.failed_systems > 0 {
        problems.push(crate::render::count(found.failed_systems as u64, "system could not be read", "systems could not be read"));
    }
    if !found.incomplete_names.is_empty() {
        problems.push(crate::render::count(found.incomplete_names.len() as u64, "manifest the CRD refuses", "manifests the CRD refuses"));
    }
    if found.failed_applies > 0 {
        problems.push(crate::render::count(found.failed_applies as u64, "Server could not be applied", "Servers could not be applied"));
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(Failure::World(anyhow!(
        "discover: {}; {} printed (see the table above)",
        problems.join(", "),
        crate::render::count(found.manifests.len() as u64, "Server", "Servers")
    )))
}

/// The field manager of `--apply`: the fields it owns are the ones
/// discovery wrote, and a later run updates only those.
const FIELD_MANAGER: &str = "ironclaim-discover";

/// Applies every complete manifest, recording what was applied, what was
/// left as another manager set it, and what failed (a row each, placed by
/// `origin`: the endpoint and system of a manifest).
async fn apply_all(connection: &crate::cluster::Connection, found: &mut Found, origin: impl Fn(&Value) -> (String, String)) {
    let api: kube::Api<ironclaim_k8s::api::Server> = kube::Api::all(connection.client.clone());
    for manifest in &found.manifests {
        let name = manifest["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if found.incomplete_names.contains(&name) {
            continue;
        }
        let (endpoint, system) = origin(manifest);
        let gap = |field: String, why: String| Gap { endpoint: endpoint.clone(), system: system.clone(), server: name.clone(), field, why };
        match apply_one(&api, &name, manifest.clone()).await {
            Ok(kept) => {
                found.applied += 1;
                for (field, owner) in kept {
                    found.gaps.push(gap(field, format!("left as it is, not applied: {owner}")));
                }
            }
            Err(err) => {
                found.failed_applies += 1;
                found.gaps.push(gap("-".into(), format!("apply failed: {err}")));
            }
        }
    }
}

/// Server-side applies one manifest without force. When fields conflict
/// with another manager's, they are taken out and the rest applied once
/// more; returns the fields left alone, each with its owner's words.
async fn apply_one(api: &kube::Api<ironclaim_k8s::api::Server>, name: &str, mut manifest: Value) -> Result<Vec<(String, String)>, kube::Error> {
    let params = kube::api::PatchParams::apply(FIELD_MANAGER);
    let mut kept = Vec::new();
    // Bounded: the first attempt, and one without the conflicting fields.
    for _ in 0..2 {
        match api.patch(name, &params, &kube::api::Patch::Apply(&manifest)).await {
            Ok(_) => return Ok(kept),
            Err(kube::Error::Api(status)) if status.code == 409 && kept.is_empty() => {
                let causes = status.details.as_ref().map(|d| d.causes.clone()).unwrap_or_default();
                for cause in causes.iter().filter(|c| c.reason == "FieldManagerConflict") {
                    if remove_field(&mut manifest, &cause.field) {
                        kept.push((cause.field.trim_start_matches('.').to_owned(), cause.message.clone()));
                    }
                }
                if kept.is_empty() {
                    return Err(kube::Error::Api(status));
                }
            }
            Err(err) => return Err(err),
        }
    }
    Err(kube::Error::Api(
        kube::core::Status::failure(&format!("the fields of {name} kept conflicting after those of other managers were left out"), "Conflict")
            .with_code(409)
            .boxed(),
    ))
}

/// Takes the field at `path` (`.spec.hardware.cpu`,
/// `.spec.labels.ironclaim.dev/rack`: map keys may hold dots) out of
/// `manifest`. True when it was there.
fn remove_field(manifest: &mut Value, path: &str) -> bool {
    fn walk(value: &mut Value, rest: &str) -> bool {
        let Some(object) = value.as_object_mut() else { return false };
        let Some(rest) = rest.strip_prefix('.') else { return false };
        if object.remove(rest).is_some() {
            return true;
        }
        // The longest key the path starts with, then deeper.
        let mut keys: Vec<String> = object.keys().filter(|k| rest.starts_with(&format!("{k}."))).cloned().collect();
        keys.sort_by_key(|k| std::cmp::Reverse(k.len()));
        keys.into_iter().any(|key| object.get_mut(&key).is_some_and(|child| walk(child, &rest[key.len()..])))
    }
    walk(manifest, path)
}

/// The endpoints of the command line and of `--endpoints-file`, parsed,
/// each once.
fn endpoints(args: &Args) -> anyhow::Result<Vec<BmcAddress>> {
    let mut texts: Vec<(String, String)> = args.endpoints.iter().map(|e| (e.clone(), format!("endpoint {e:?}"))).collect();
    if let Some(path) = &args.endpoints_file {
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read endpoints file {}", path.display()))?;
        for (number, line) in text.lines().enumerate() {
            let line = line.trim();
            if !line.is_empty() && !line.starts_with('#') {
                texts.push((line.to_owned(), format!("{}:{}", path.display(), number + 1)));
            }
        }
    }
    if texts.is_empty() {
        return Err(anyhow!("no endpoint given: name them on the command line or in --endpoints-file"));
    }
    if texts.len() > MAX_ENDPOINTS {
        return Err(anyhow!("{} endpoints given; one run reads at most {MAX_ENDPOINTS}", texts.len()));
    }
    let mut seen = BTreeSet::new();
    let mut addresses = Vec::new();
    for (text, place) in texts {
        let address = BmcAddress::parse(&text).with_context(|| place.clone())?;
        if seen.insert((address.endpoint.to_string(), address.system.clone())) {
            addresses.push(address);
        }
    }
    Ok(addresses)
}

fn settings(args: &Args) -> anyhow::Result<Settings> {
    let (namespace, name) = args
        .credentials_secret
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .ok_or_else(|| anyhow!("--credentials-secret must be NAMESPACE/NAME, not {:?}", args.credentials_secret))?;
    let ca_bundle = match &args.access.ca_file {
        None => None,
        Some(path) => {
            let pem = std::fs::read_to_string(path).with_context(|| format!("cannot read the CA file {}", path.display()))?;
            if pem.chars().count() > MAX_CA_BUNDLE_CHARS {
                return Err(anyhow!("the CA file {} is longer than spec.bmc.caBundle allows ({MAX_CA_BUNDLE_CHARS} characters)", path.display()));
            }
            Some(pem)
        }
    };
    Ok(Settings {
        secret_namespace: namespace.to_owned(),
        secret_name: name.to_owned(),
        ca_bundle,
        insecure_skip_verify: args.access.insecure_skip_verify,
    })
}

fn add_systems(found: &mut Found, names: &mut BTreeSet<String>, endpoint: &Url, systems: Vec<SystemOutcome>, settings: &Settings) {
    for outcome in systems {
        let system = match outcome.result {
            Ok(system) => system,
            Err(err) => {
                found.failed_systems += 1;
                let err = row_error(&err);
                found.gaps.push(Gap {
                    endpoint: endpoint.to_string(),
                    system: outcome.path,
                    server: String::new(),
                    field: "-".into(),
                    why: format!("{}: {}", err.kind, err.message),
                });
                continue;
            }
        };
        let (manifest, gaps, valid) = manifest(endpoint, &system, settings, names);
        let server = manifest["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if !valid {
            found.incomplete_names.insert(server.clone());
        }
        for (field, why) in gaps {
            found.gaps.push(Gap { endpoint: endpoint.to_string(), system: system.path.clone(), server: server.clone(), field, why });
        }
        found.manifests.push(manifest);
    }
}

/// The field of the manifest a fact fills.
fn field_of(fact: Fact) -> String {
    match fact {
        Fact::Uuid => format!("metadata.annotations[{SYSTEM_UUID_ANNOTATION}]"),
        Fact::SerialNumber => format!("metadata.annotations[{SERIAL_NUMBER_ANNOTATION}]"),
        Fact::Cpus => "spec.hardware.cpu".into(),
        Fact::Memory => "spec.hardware.memory".into(),
        Fact::Gpus => "spec.hardware.gpus".into(),
        Fact::MacAddresses => format!("metadata.annotations[{MAC_ADDRESSES_ANNOTATION}]"),
        Fact::Location => format!("spec.labels[{RACK_LABEL}, {RACK_UNIT_LABEL}]"),
        Fact::Watts => "spec.power".into(),
    }
}

/// The Server manifest of one system, each field left out with why, and
/// whether the CRD accepts the manifest. `names` holds the names already
/// given; the new one joins them.
fn manifest(endpoint: &Url, system: &DiscoveredSystem, settings: &Settings, names: &mut BTreeSet<String>) -> (Value, Vec<(String, String)>, bool) {
    let mut gaps: Vec<(String, String)> = system.unknown.iter().map(|u| (field_of(u.fact), u.reason.clone())).collect();

    let id = system.id.clone().unwrap_or_else(|| system.path.rsplit('/').next().unwrap_or_default().to_owned());
    let host = endpoint.host_str().unwrap_or_default();
    let candidates = [system.serial_number.clone(), system.uuid.clone(), Some(format!("{host}-{id}"))];
    let base = candidates.iter().flatten().find_map(|c| dns_label(c)).unwrap_or_else(|| "server".to_owned());
    let name = unique_name(&base, names, |_| false);
    if name != base {
        gaps.push(("metadata.name".into(), format!("{base} was given to another system first; named {name}")));
    }

    let mut annotations = Map::new();
    if let Some(uuid) = &system.uuid {
        annotations.insert(SYSTEM_UUID_ANNOTATION.into(), json!(uuid));
    }
    if let Some(serial) = &system.serial_number {
        annotations.insert(SERIAL_NUMBER_ANNOTATION.into(), json!(serial));
    }
    if let Some(macs) = &system.mac_addresses {
        annotations.insert(MAC_ADDRESSES_ANNOTATION.into(), json!(macs.join(",")));
    }

    let mut hardware = Map::new();
    if let Some(cpus) = system.cpus {
        hardware.insert("cpu".into(), json!(cpus.to_string()));
    }
    if let Some(mib) = system.memory_mib {
        hardware.insert("memory".into(), json!(memory_quantity(mib)));
    }
    let mut gpus = Vec::new();
    for gpu in system.gpus.iter().flatten() {
        match (label_value(&gpu.model), gpu.count) {
            (Some(model), count @ 1..=64) => gpus.push(json!({"model": model, "count": count})),
            (None, _) => gaps.push(("spec.hardware.gpus".into(), format!("GPU model {:?} cannot be written as a label value", gpu.model))),
            (_, count) => gaps.push(("spec.hardware.gpus".into(), format!("{count} GPUs of model {:?}: more than the CRD allows (64)", gpu.model))),
        }
    }
    if gpus.len() > MAX_GPU_MODELS {
        gaps.push(("spec.hardware.gpus".into(), format!("{} GPU models: the CRD allows {MAX_GPU_MODELS}; the first are written", gpus.len())));
        gpus.truncate(MAX_GPU_MODELS);
    }
    if !gpus.is_empty() {
        hardware.insert("gpus".into(), Value::Array(gpus));
    }

    let mut labels = Map::new();
    let location = &system.location;
    for (key, value) in
        [(RACK_LABEL, &location.rack), (ROW_LABEL, &location.row), (RACK_UNIT_LABEL, &location.rack_offset), (SLOT_LABEL, &location.slot)]
    {
        if let Some(text) = value {
            match label_value(text) {
                Some(v) => {
                    labels.insert(key.into(), json!(v));
                }
                None => gaps.push((format!("spec.labels[{key}]"), format!("{text:?} cannot be written as a label value"))),
            }
        }
    }

    let mut bmc = Map::new();
    bmc.insert("address".into(), json!(format!("redfish+{}", endpoint.join(&system.path).map_or_else(|_| endpoint.to_string(), String::from))));
    bmc.insert("credentialsSecretRef".into(), json!({"name": settings.secret_name, "namespace": settings.secret_namespace}));
    if let Some(ca) = &settings.ca_bundle {
        bmc.insert("caBundle".into(), json!(ca));
    }
    if settings.insecure_skip_verify {
        bmc.insert("insecureSkipVerify".into(), json!(true));
    }

    let mut spec = Map::new();
    spec.insert("bmc".into(), Value::Object(bmc));
    spec.insert("hardware".into(), Value::Object(hardware));
    if !labels.is_empty() {
        spec.insert("labels".into(), Value::Object(labels));
    }
    if let Some(watts) = &system.watts {
        // A reading under unknown load is neither figure the CRD asks for,
        // and the power budget counts peakWatts: written as an annotation.
        let read = (watts.watts.round() as i64).clamp(0, 100_000);
        annotations.insert(WATTS_READ_ANNOTATION.into(), json!(read.to_string()));
        gaps.push((
            "spec.power".into(),
            format!(
                "not written: {read} W read from {} under unknown load is neither idleWatts nor peakWatts (the power budget counts peakWatts); set both from the data sheet",
                watts.resource
            ),
        ));
    }

    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    let manifest = json!({"apiVersion": ironclaim_k8s::api::API_VERSION, "kind": "Server", "metadata": metadata, "spec": spec});

    let valid = check_against_crd(&manifest, &mut gaps);
    (manifest, gaps, valid)
}

/// Mebibytes as a quantity: whole gibibytes as `Gi`.
fn memory_quantity(mib: u64) -> String {
    if mib.is_multiple_of(1024) { format!("{}Gi", mib / 1024) } else { format!("{mib}Mi") }
}

/// Gives `base`, or when `taken` says it is, `base-2`, `base-3`, ... (each
/// a DNS label), and adds the name given to `names`.
fn unique_name(base: &str, names: &mut BTreeSet<String>, taken: impl Fn(&str) -> bool) -> String {
    let mut name = base.to_owned();
    for n in 2.. {
        if !taken(&name) && names.insert(name.clone()) {
            break;
        }
        name = dns_label(&format!("{base}-{n}")).unwrap_or_else(|| format!("server-{n}"));
    }
    name
}

/// The CRD's own schema says what the API server would refuse: each
/// violation joins the row of its field, or is a row of its own. True
/// when there is none.
fn check_against_crd(manifest: &Value, gaps: &mut Vec<(String, String)>) -> bool {
    let violations = validate("Server", manifest).unwrap_or_default();
    for violation in &violations {
        let why = match &violation.problem {
            Problem::Required => "required by the CRD: the API server refuses this Server until it is set".to_owned(),
            Problem::UnknownField => "the CRD has no such field".to_owned(),
            Problem::Invalid(why) => format!("the CRD refuses the value: {why}"),
        };
        match gaps.iter_mut().find(|(field, _)| *field == violation.path) {
            Some((_, reason)) => *reason = format!("{reason}; {why}"),
            None => gaps.push((violation.path.clone(), why)),
        }
    }
    violations.is_empty()
}

/// `text` as a DNS-1123 label: lowercase letters, digits and `-`, at most
/// 63 characters, a letter or digit at both ends.
fn dns_label(text: &str) -> Option<String> {
    let mut out = String::new();
    for c in text.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    let cut: String = out.chars().take(63).collect();
    let label = cut.trim_matches('-');
    (!label.is_empty()).then(|| label.to_owned())
}

/// `text` as a label value: letters, digits, `-`, `_` and `.`, at most 63
/// characters, a letter or digit at both ends; other characters become `-`.
fn label_value(text: &str) -> Option<String> {
    let replaced: String = text.trim().chars().map(|c| if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') { c } else { '-' }).collect();
    let trimmed = replaced.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    let cut: String = trimmed.chars().take(63).collect();
    let value = cut.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    (!value.is_empty()).then(|| value.to_owned())
}

fn print(format: ManifestFormat, manifests: &[Value]) -> Result<(), Failure> {
    let text = match format {
        ManifestFormat::Json => {
            let list = json!({"apiVersion": "v1", "kind": "List", "items": manifests});
            serde_json::to_string_pretty(&list).map(|s| s + "\n").map_err(|e| Failure::world(anyhow!("cannot write the manifests as JSON: {e}")))?
        }
        ManifestFormat::Yaml => {
            let mut text = String::new();
            for manifest in manifests {
                text.push_str("---\n");
                text.push_str(&serde_saphyr::to_string(manifest).map_err(|e| Failure::world(anyhow!("cannot write the manifests as YAML: {e}")))?);
            }
            text
        }
    };
    crate::output::write(&text)
}

fn table(gaps: &[Gap], source: Source) -> String {
    let mut table = match source {
        Source::Redfish => crate::render::table(&["ENDPOINT", "SYSTEM", "SERVER", "FIELD", "WHY"]),
        Source::Metal3 => crate::render::table(&["BAREMETALHOST", "SERVER", "FIELD", "WHY"]),
        Source::ClusterApi => crate::render::table(&["MACHINEDEPLOYMENT", "SERVER", "FIELD", "WHY"]),
    };
    for gap in gaps {
        match source {
            Source::Redfish => table.add_row(vec![&gap.endpoint, &gap.system, &gap.server, &gap.field, &gap.why]),
            Source::Metal3 | Source::ClusterApi => table.add_row(vec![&gap.system, &gap.server, &gap.field, &gap.why]),
        };
    }
    format!("{table}\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_dns_labels() {
        assert_eq!(dns_label("437XR1138R2").as_deref(), Some("437xr1138r2"));
        assert_eq!(dns_label("  SN: 12/34 ").as_deref(), Some("sn-12-34"));
        assert_eq!(dns_label("---"), None);
        assert_eq!(dns_label(&"a".repeat(70)).map(|l| l.len()), Some(63));
        assert_eq!(dns_label(&format!("{}-b", "a".repeat(62))).as_deref(), Some("a".repeat(62).as_str()));
    }

    fn settings() -> Settings {
        Settings { secret_namespace: "ironclaim-system".into(), secret_name: "bmc".into(), ca_bundle: None, insecure_skip_verify: false }
    }

    fn system(serial: &str, cpus: Option<u64>) -> DiscoveredSystem {
        DiscoveredSystem {
            path: "/redfish/v1/Systems/1".into(),
            id: Some("1".into()),
            serial_number: Some(serial.into()),
            cpus,
            memory_mib: Some(1536),
            ..DiscoveredSystem::default()
        }
    }

    #[test]
    fn a_name_already_given_gets_a_suffix_and_a_row() {
        let endpoint = Url::parse("https://10.0.0.5/").unwrap();
        let mut names = BTreeSet::new();
        let (first, gaps, valid) = manifest(&endpoint, &system("SN-1", Some(8)), &settings(), &mut names);
        assert_eq!((first["metadata"]["name"].as_str(), gaps.len(), valid), (Some("sn-1"), 0, true));
        assert_eq!(first["spec"]["hardware"], json!({"cpu": "8", "memory": "1536Mi"}));
        assert_eq!(first["spec"]["bmc"]["address"], "redfish+https://10.0.0.5/redfish/v1/Systems/1");
        let (second, gaps, _) = manifest(&endpoint, &system("sn 1", Some(8)), &settings(), &mut names);
        assert_eq!(second["metadata"]["name"], "sn-1-2");
        assert_eq!(gaps, vec![("metadata.name".to_owned(), "sn-1 was given to another system first; named sn-1-2".to_owned())]);
    }

    #[test]
    fn a_missing_required_field_is_left_out_and_its_row_says_the_crd_requires_it() {
        let mut names = BTreeSet::new();
        let mut found = system("SN-2", None);
        found.unknown.push(ironclaim_redfish::discover::Unknown { fact: Fact::Cpus, reason: "no ProcessorSummary".into() });
        let (server, gaps, valid) = manifest(&Url::parse("http://bmc:8000/").unwrap(), &found, &settings(), &mut names);
        assert!(!valid);
        assert_eq!(server["spec"]["hardware"], json!({"memory": "1536Mi"}), "nothing is guessed");
        assert_eq!(gaps.len(), 1, "{gaps:?}");
        assert_eq!(gaps[0].0, "spec.hardware.cpu");
        assert!(gaps[0].1.starts_with("no ProcessorSummary; required by the CRD"), "{gaps:?}");
    }

    #[test]
    fn a_conflicting_field_is_found_even_under_a_key_with_dots() {
        let mut manifest =
            json!({"spec": {"hardware": {"cpu": "8", "memory": "1Gi"}, "labels": {"ironclaim.dev/rack": "R1", "ironclaim.dev/row": "B"}}});
        assert!(remove_field(&mut manifest, ".spec.hardware.cpu"));
        assert!(remove_field(&mut manifest, ".spec.labels.ironclaim.dev/rack"));
        assert!(!remove_field(&mut manifest, ".spec.labels.ironclaim.dev/slot"));
        assert_eq!(manifest, json!({"spec": {"hardware": {"memory": "1Gi"}, "labels": {"ironclaim.dev/row": "B"}}}));
    }

    #[test]
    fn label_values_keep_what_kubernetes_allows() {
        assert_eq!(label_value("WEB43").as_deref(), Some("WEB43"));
        assert_eq!(label_value("NVIDIA H100 80GB HBM3").as_deref(), Some("NVIDIA-H100-80GB-HBM3"));
        assert_eq!(label_value("(rack 7)").as_deref(), Some("rack-7"));
        assert_eq!(label_value("  "), None);
    }
}
