//! `servers discover --metal3`: the inventory written from Metal3. Each
//! BareMetalHost that is provisioned or externally provisioned, not in
//! error nor detached, and has a HardwareData, becomes a Server powered
//! through it (`spec.provider: {type: Metal3, metal3: {namespace, name}}`,
//! no `spec.bmc`: the baremetal-operator holds the BMC). Every other host
//! is a row of the table, with the kind of reason
//! ([`ironclaim_k8s::metal3::Unusable`]); it does not fail the run.
//!
//! A host that a Server already names (`spec.provider.metal3`, or the
//! deprecated annotation) is written under that Server's name, so that
//! `--apply` updates it; a new host is named after itself, never after a
//! Server of another machine.
//!
//! Exit codes: 0 every usable host written (and applied); 1 a list
//! failed, a manifest lacks a field the CRD requires, or an apply failed;
//! 2 bad input (the kubeconfig, a selector the API server refuses).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::anyhow;
use ironclaim_controller::provider::{BAREMETALHOST_ANNOTATION, baremetalhost_resource, hardwaredata_resource};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::ProviderType;
use ironclaim_k8s::metal3::{DiscoveredHost, Fact, read_host};
use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};

use super::{
    Args, Found, Gap, MAC_ADDRESSES_ANNOTATION, SERIAL_NUMBER_ANNOTATION, SYSTEM_UUID_ANNOTATION, Source, apply_all, check_against_crd, dns_label,
    memory_quantity, one_line, unique_name,
};
use crate::cluster::{ClusterArgs, Connection};
use crate::exit::Failure;

/// A host, by namespace and name.
type HostKey = (String, String);

/// The Servers already in the cluster, as discovery needs them.
#[derive(Default)]
struct Existing {
    /// Every Server's name: none is given to another machine.
    names: BTreeSet<String>,
    /// The Servers that name each host, sorted by name.
    by_host: BTreeMap<HostKey, Vec<Server>>,
}

impl Existing {
    fn of(servers: Vec<Server>) -> Self {
        let mut existing = Existing::default();
        for server in servers {
            existing.names.insert(server.name_any());
            if let Some(host) = host_of(&server) {
                existing.by_host.entry(host).or_default().push(server);
            }
        }
        for servers in existing.by_host.values_mut() {
            servers.sort_by_key(|s| s.name_any());
        }
        existing
    }
}

/// The host a Server is powered through: `spec.provider.metal3`, or
/// without `spec.provider`, the deprecated annotation.
fn host_of(server: &Server) -> Option<HostKey> {
    match &server.spec.provider {
        Some(provider) if provider.type_ == ProviderType::Metal3 => provider.metal3.as_ref().map(|h| (h.namespace.clone(), h.name.clone())),
        Some(_) => None,
        None => server
            .annotations()
            .get(BAREMETALHOST_ANNOTATION)
            .and_then(|r| r.split_once('/'))
            .map(|(namespace, name)| (namespace.to_owned(), name.to_owned())),
    }
}

pub(super) fn run(args: &Args, cluster: &ClusterArgs) -> Result<(), Failure> {
    let found = super::runtime()?.block_on(async {
        let connection = crate::cluster::connect(cluster).await?;
        let namespace = super::chosen_namespace(args, &connection);
        let read = read_cluster(&connection, namespace.as_deref(), args.selector.as_deref()).await?;
        let mut found = Found::default();
        add_hosts(&mut found, &read);
        if read.hosts.is_empty() {
            super::say_none_found("BareMetalHost", namespace.as_deref(), args);
        }
        if args.apply {
            let origin = |manifest: &Value| {
                let host = &manifest["spec"]["provider"]["metal3"];
                (String::new(), format!("{}/{}", host["namespace"].as_str().unwrap_or_default(), host["name"].as_str().unwrap_or_default()))
            };
            apply_all(&connection, &mut found, origin).await;
        }
        Ok::<_, Failure>(found)
    })?;
    super::report(args, &found, Source::Metal3)
}

/// What one run reads from the cluster.
struct Read {
    /// The hosts, sorted by namespace and name.
    hosts: Vec<Value>,
    hardware: BTreeMap<HostKey, Value>,
    existing: Existing,
}

/// Lists the hosts (in `namespace`, or every one), their HardwareData and
/// every Server.
///
/// # Errors
/// Bad input for a selector the API server refuses; the world when the
/// cluster serves no BareMetalHosts or a list fails. A cluster without
/// the HardwareData CRD has none (each host says so); one without
/// ironclaim's CRDs has no Servers yet.
async fn read_cluster(connection: &Connection, namespace: Option<&str>, selector: Option<&str>) -> Result<Read, Failure> {
    let mut params = ListParams::default();
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let hosts = list(connection, &baremetalhost_resource(), namespace, &params)
        .await
        .map_err(|err| super::list_failure(&err, connection, selector, "BareMetalHosts", "BareMetalHosts (metal3.io/v1alpha1): Metal3's CRDs"))?;
    let hardware = match list(connection, &hardwaredata_resource(), namespace, &ListParams::default()).await {
        Ok(items) => items,
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(err) => return Err(Failure::world(anyhow!("cannot list the HardwareData of {}: {}", connection.server, one_line(&err)))),
    };
    let servers = match Api::<Server>::all(connection.client.clone()).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(err) => return Err(Failure::world(anyhow!("cannot list the Servers of {}: {}", connection.server, one_line(&err)))),
    };
    let key = |value: &Value| {
        let metadata = &value["metadata"];
        (metadata["namespace"].as_str().unwrap_or_default().to_owned(), metadata["name"].as_str().unwrap_or_default().to_owned())
    };
    let mut hosts = hosts;
    hosts.sort_by_key(key);
    let hardware = hardware.into_iter().map(|data| (key(&data), data)).collect();
    Ok(Read { hosts, hardware, existing: Existing::of(servers) })
}

/// The objects of `resource`, each as JSON.
async fn list(connection: &Connection, resource: &ApiResource, namespace: Option<&str>, params: &ListParams) -> kube::Result<Vec<Value>> {
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(connection.client.clone(), namespace, resource),
        None => Api::all_with(connection.client.clone(), resource),
    };
    let list = api.list(params).await?;
    Ok(list.items.iter().filter_map(|item| serde_json::to_value(item).ok()).collect())
}

/// A manifest for each host that can be a Server, a row for each that
/// cannot and for each fact left out.
fn add_hosts(found: &mut Found, read: &Read) {
    let mut names = BTreeSet::new();
    for host in &read.hosts {
        let key =
            (host["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(), host["metadata"]["name"].as_str().unwrap_or_default().to_owned());
        let place = format!("{}/{}", key.0, key.1);
        let servers = read.existing.by_host.get(&key).map(Vec::as_slice).unwrap_or_default();
        let discovered = match read_host(host, read.hardware.get(&key)) {
            Ok(discovered) => discovered,
            Err(err) => {
                found.unusable_hosts += 1;
                let server = servers.first().map(ResourceExt::name_any).unwrap_or_default();
                found.gaps.push(Gap {
                    endpoint: String::new(),
                    system: place,
                    server,
                    field: "-".into(),
                    why: format!("{}: {err}", err.metric_label()),
                });
                continue;
            }
        };
        let (manifest, gaps, valid) = manifest(&discovered, servers, &read.existing, &mut names);
        let server = manifest["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if !valid {
            found.incomplete_names.insert(server.clone());
        }
        for (field, why) in gaps {
            found.gaps.push(Gap { endpoint: String::new(), system: place.clone(), server: server.clone(), field, why });
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
    }
}

/// The Server manifest of one host, each field left out with why, and
/// whether the CRD accepts the manifest. `servers` are those that already
/// name the host; `names` holds the names already given this run.
fn manifest(host: &DiscoveredHost, servers: &[Server], existing: &Existing, names: &mut BTreeSet<String>) -> (Value, Vec<(String, String)>, bool) {
    let mut gaps = Vec::new();
    let name = match servers {
        [first, rest @ ..] => {
            let name = first.name_any();
            if !rest.is_empty() {
                let others: Vec<String> = rest.iter().map(ResourceExt::name_any).collect();
                gaps.push((
                    "metadata.name".to_owned(),
                    format!("Servers {name} and {} all name this host; written as {name}: delete the others", others.join(", ")),
                ));
            }
            names.insert(name.clone());
            name
        }
        [] => {
            let base = dns_label(&host.name).unwrap_or_else(|| "server".to_owned());
            let name = unique_name(&base, names, |n| existing.names.contains(n));
            if name != base {
                gaps.push(("metadata.name".to_owned(), format!("{base} is the name of another machine's Server; named {name}")));
            }
            name
        }
    };
    // The operator's word on GPUs stands for what Metal3 cannot know.
    let gpus_set = servers.first().is_some_and(|s| !s.spec.hardware.gpus.is_empty());
    for unknown in &host.unknown {
        if unknown.fact == Fact::Gpus && gpus_set {
            continue;
        }
        gaps.push((field_of(unknown.fact), unknown.reason.clone()));
    }

    let mut annotations = Map::new();
    if let Some(serial) = &host.serial_number {
        annotations.insert(SERIAL_NUMBER_ANNOTATION.into(), json!(serial));
    }
    if let Some(macs) = &host.mac_addresses {
        annotations.insert(MAC_ADDRESSES_ANNOTATION.into(), json!(macs.join(",")));
    }
    let mut hardware = Map::new();
    if let Some(cpus) = host.cpus {
        hardware.insert("cpu".into(), json!(cpus.to_string()));
    }
    if let Some(mib) = host.memory_mib {
        hardware.insert("memory".into(), json!(memory_quantity(mib)));
    }
    let mut metadata = Map::new();
    metadata.insert("name".into(), json!(name));
    if !annotations.is_empty() {
        metadata.insert("annotations".into(), Value::Object(annotations));
    }
    let manifest = json!({
        "apiVersion": ironclaim_k8s::api::API_VERSION,
        "kind": "Server",
        "metadata": metadata,
        "spec": {
            "provider": {"type": "Metal3", "metal3": {"namespace": host.namespace, "name": host.name}},
            "hardware": hardware,
        },
    });
    let valid = check_against_crd(&manifest, &mut gaps);
    (manifest, gaps, valid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_k8s::metal3::Unknown;

    fn host(name: &str) -> DiscoveredHost {
        DiscoveredHost {
            namespace: "metal3".into(),
            name: name.into(),
            provisioning_state: "provisioned".into(),
            cpus: Some(32),
            memory_mib: Some(131072),
            serial_number: Some("SN-7".into()),
            mac_addresses: Some(vec!["b4:96:91:0a:00:01".into()]),
            unknown: vec![Unknown { fact: Fact::Gpus, reason: "no PCI devices".into() }],
        }
    }

    fn server(name: &str, host: Option<(&str, &str)>) -> Server {
        let provider = host.map(|(ns, n)| json!({"type": "Metal3", "metal3": {"namespace": ns, "name": n}}));
        let mut spec = json!({"hardware": {"cpu": "8", "memory": "8Gi"}});
        match provider {
            Some(p) => spec["provider"] = p,
            None => spec["bmc"] = json!({"address": "https://10.0.0.9", "credentialsSecretRef": {"name": "b", "namespace": "n"}}),
        }
        serde_json::from_value(json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": name}, "spec": spec}))
            .expect("a Server")
    }

    #[test]
    fn a_host_becomes_a_metal3_server_without_a_bmc_that_the_crd_accepts() {
        let (manifest, gaps, valid) = manifest(&host("worker-7"), &[], &Existing::default(), &mut BTreeSet::new());
        assert!(valid, "{gaps:?}");
        assert_eq!(manifest["metadata"]["name"], "worker-7");
        assert_eq!(manifest["spec"]["provider"], json!({"type": "Metal3", "metal3": {"namespace": "metal3", "name": "worker-7"}}));
        assert_eq!(manifest["spec"]["hardware"], json!({"cpu": "32", "memory": "128Gi"}));
        assert!(manifest["spec"].get("bmc").is_none());
        assert_eq!(gaps, vec![("spec.hardware.gpus".to_owned(), "no PCI devices".to_owned())]);
    }

    #[test]
    fn a_host_a_server_names_keeps_that_name_and_a_new_host_takes_no_other_machines_name() {
        let existing = Existing::of(vec![server("rack1-u07", Some(("metal3", "worker-7"))), server("worker-8", None)]);
        let mut names = BTreeSet::new();
        let servers = &existing.by_host[&("metal3".to_owned(), "worker-7".to_owned())];
        let (kept, _, _) = manifest(&host("worker-7"), servers, &existing, &mut names);
        assert_eq!(kept["metadata"]["name"], "rack1-u07");
        let (renamed, gaps, _) = manifest(&host("worker-8"), &[], &existing, &mut names);
        assert_eq!(renamed["metadata"]["name"], "worker-8-2", "worker-8 is a Redfish Server of another machine");
        assert!(gaps.iter().any(|(f, why)| f == "metadata.name" && why.contains("another machine")), "{gaps:?}");
    }

    #[test]
    fn gpus_the_operator_set_on_the_server_are_not_reported_unknown() {
        let mut with_gpus = server("w7", Some(("metal3", "worker-7")));
        with_gpus.spec.hardware.gpus = vec![ironclaim_k8s::api::server::Gpu { model: "A100".into(), count: 4, resource_name: None }];
        let existing = Existing::of(vec![with_gpus.clone()]);
        let (_, gaps, _) = manifest(&host("worker-7"), &[with_gpus], &existing, &mut BTreeSet::new());
        assert!(gaps.is_empty(), "{gaps:?}");
    }

    #[test]
    fn a_host_without_cpu_count_is_written_but_marked_incomplete() {
        let mut partial = host("worker-9");
        partial.cpus = None;
        partial.unknown.insert(0, Unknown { fact: Fact::Cpus, reason: "no cpu.count".into() });
        let (manifest, gaps, valid) = manifest(&partial, &[], &Existing::default(), &mut BTreeSet::new());
        assert!(!valid);
        assert_eq!(manifest["spec"]["hardware"], json!({"memory": "128Gi"}));
        assert!(gaps.iter().any(|(f, why)| f == "spec.hardware.cpu" && why.starts_with("no cpu.count; required by the CRD")), "{gaps:?}");
    }
}
