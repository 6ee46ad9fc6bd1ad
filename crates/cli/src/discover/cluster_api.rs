//! `servers discover --cluster-api`: the inventory written from Cluster
//! API. Each MachineDeployment that is a node group (it carries the
//! Cluster Autoscaler's `cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size`)
//! becomes one Server per replica it may have
//! (`spec.provider: {type: ClusterAPI, clusterAPI: {namespace, machineDeployment}}`),
//! with the hardware and labels its nodes will have: the scale-from-zero
//! annotations (`capacity.cluster-autoscaler.kubernetes.io/*`), else the
//! `status.capacity` of its infrastructure machine template. Every other
//! MachineDeployment is a row of the table, with why; it does not fail the
//! run.
//!
//! The Servers that already name a MachineDeployment keep their names, so
//! that `--apply` updates them; new ones are `DEPLOYMENT-N`, never the
//! name of another machine's Server.
//!
//! Exit codes: 0 every node group written (and applied); 1 a list
//! failed, a manifest lacks a field the CRD requires, or an apply failed;
//! 2 bad input (the kubeconfig, a selector the API server refuses).

use std::collections::{BTreeMap, BTreeSet};

use anyhow::anyhow;
use ironclaim_controller::cluster_api::{MAX_SIZE_ANNOTATION, ScaleFromZero, machinedeployment_resource};
use ironclaim_k8s::api::Server;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};

use super::{Args, Found, Gap, Source, apply_all, check_against_crd, dns_label, label_value, one_line, unique_name};
use crate::cluster::{ClusterArgs, Connection};
use crate::exit::Failure;

/// A MachineDeployment, by namespace and name.
type Key = (String, String);

/// One MachineDeployment and what its nodes will have, when it was read.
struct Deployment {
    key: Key,
    object: DynamicObject,
    /// The infrastructure template's `status.capacity`, or why it could
    /// not be read; None when the annotations were enough.
    template_capacity: Option<Result<BTreeMap<String, String>, String>>,
}

pub(super) fn run(args: &Args, cluster: &ClusterArgs) -> Result<(), Failure> {
    let found = super::runtime()?.block_on(async {
        let connection = crate::cluster::connect(cluster).await?;
        let namespace = super::chosen_namespace(args, &connection);
        let (deployments, servers) = read_cluster(&connection, namespace.as_deref(), args.selector.as_deref()).await?;
        if deployments.is_empty() {
            super::say_none_found("MachineDeployment", namespace.as_deref(), args);
        }
        let mut found = Found::default();
        add_deployments(&mut found, &deployments, &servers);
        if args.apply {
            let origin = |manifest: &Value| {
                let md = &manifest["spec"]["provider"]["clusterAPI"];
                (String::new(), format!("{}/{}", md["namespace"].as_str().unwrap_or_default(), md["machineDeployment"].as_str().unwrap_or_default()))
            };
            apply_all(&connection, &mut found, origin).await;
        }
        Ok::<_, Failure>(found)
    })?;
    super::report(args, &found, Source::ClusterApi)
}

/// Lists the MachineDeployments (in `namespace`, or every one), the
/// templates of those without capacity annotations, and every Server.
async fn read_cluster(connection: &Connection, namespace: Option<&str>, selector: Option<&str>) -> Result<(Vec<Deployment>, Vec<Server>), Failure> {
    let mut params = ListParams::default();
    if let Some(selector) = selector {
        params = params.labels(selector);
    }
    let resource = machinedeployment_resource();
    let api: Api<DynamicObject> = match namespace {
        Some(namespace) => Api::namespaced_with(connection.client.clone(), namespace, &resource),
        None => Api::all_with(connection.client.clone(), &resource),
    };
    let list = api.list(&params).await.map_err(|err| {
        super::list_failure(&err, connection, selector, "MachineDeployments", "MachineDeployments (cluster.x-k8s.io/v1beta2): Cluster API's CRDs")
    })?;
    let mut deployments = Vec::new();
    for object in list.items {
        let key = (object.namespace().unwrap_or_default(), object.name_any());
        let annotated = ScaleFromZero::of(object.annotations()).map(|s| s.resources.contains_key("cpu") && s.resources.contains_key("memory"));
        let template_capacity = match annotated {
            Ok(true) | Err(_) => None,
            Ok(false) => Some(template_capacity(connection, &key.0, &object).await),
        };
        deployments.push(Deployment { key, object, template_capacity });
    }
    deployments.sort_by(|a, b| a.key.cmp(&b.key));
    let servers = match Api::<Server>::all(connection.client.clone()).list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
        Err(err) => return Err(Failure::world(anyhow!("cannot list the Servers of {}: {}", connection.server, one_line(&err)))),
    };
    Ok((deployments, servers))
}

/// The `status.capacity` of the MachineDeployment's infrastructure
/// template (`spec.template.spec.infrastructureRef`), found through the
/// API server's discovery of its group.
async fn template_capacity(connection: &Connection, namespace: &str, deployment: &DynamicObject) -> Result<BTreeMap<String, String>, String> {
    let reference = &deployment.data["spec"]["template"]["spec"]["infrastructureRef"];
    let (Some(group), Some(kind), Some(name)) = (reference["apiGroup"].as_str(), reference["kind"].as_str(), reference["name"].as_str()) else {
        return Err("spec.template.spec.infrastructureRef names no template".into());
    };
    let what = format!("{kind} {namespace}/{name} ({group})");
    let discovered = kube::discovery::group(&connection.client, group).await.map_err(|err| format!("the API server serves no {group}: {err}"))?;
    let Some((resource, _)) = discovered.recommended_kind(kind) else {
        return Err(format!("the API server serves no kind {kind} in {group}"));
    };
    let api: Api<DynamicObject> = Api::namespaced_with(connection.client.clone(), namespace, &resource);
    let template = api.get(name).await.map_err(|err| format!("cannot read {what}: {}", one_line(&err)))?;
    let Some(capacity) = template.data["status"]["capacity"].as_object() else {
        return Err(format!("{what} has no status.capacity"));
    };
    Ok(capacity.iter().filter_map(|(k, v)| v.as_str().map(|v| (k.clone(), v.to_owned()))).collect())
}

/// The MachineDeployment a Server is a Machine of.
fn deployment_of(server: &Server) -> Option<Key> {
    server.spec.machine_deployment().map(|md| (md.namespace.clone(), md.machine_deployment.clone()))
}

/// The manifests of each node group, a row for each MachineDeployment
/// that is not one and for each field left out.
fn add_deployments(found: &mut Found, deployments: &[Deployment], servers: &[Server]) {
    let taken: BTreeSet<String> = servers.iter().map(ResourceExt::name_any).collect();
    let mut by_deployment: BTreeMap<Key, Vec<&Server>> = BTreeMap::new();
    for server in servers {
        if let Some(key) = deployment_of(server) {
            by_deployment.entry(key).or_default().push(server);
        }
    }
    let mut names = BTreeSet::new();
    for deployment in deployments {
        let place = format!("{}/{}", deployment.key.0, deployment.key.1);
        let row = |server: &str, field: &str, why: String| Gap {
            endpoint: String::new(),
            system: place.clone(),
            server: server.into(),
            field: field.into(),
            why,
        };
        let existing = by_deployment.get(&deployment.key).map(Vec::as_slice).unwrap_or_default();
        match slots(deployment, existing, &taken, &mut names) {
            Ok(written) => {
                for (manifest, gaps, valid) in written {
                    let server = manifest["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                    if !valid {
                        found.incomplete_names.insert(server.clone());
                    }
                    found.gaps.extend(gaps.into_iter().map(|(field, why)| row(&server, &field, why)));
                    found.manifests.push(manifest);
                }
            }
            Err((field, why)) => {
                found.unusable_hosts += 1;
                found.gaps.push(row("", &field, why));
            }
        }
    }
}

/// A manifest per replica `deployment` may have, or why it is no node
/// group (the field and the reason).
#[allow(clippy::type_complexity)]
fn slots(
    deployment: &Deployment,
    existing: &[&Server],
    taken: &BTreeSet<String>,
    names: &mut BTreeSet<String>,
) -> Result<Vec<(Value, Vec<(String, String)>, bool)>, (String, String)> {
    let annotations = deployment.object.annotations();
    let field = |key: &str| format!("metadata.annotations[{key}]");
    let Some(max) = annotations.get(MAX_SIZE_ANNOTATION) else {
        return Err((field(MAX_SIZE_ANNOTATION), "not a node group: without a max size, how many machines it may add is unknown".into()));
    };
    let max: usize = max
        .trim()
        .parse()
        .ok()
        .filter(|n| (1..=1000).contains(n))
        .ok_or_else(|| (field(MAX_SIZE_ANNOTATION), format!("{max:?} is not a number of machines between 1 and 1000")))?;
    let scale = ScaleFromZero::of(annotations).map_err(|why| ("metadata.annotations".to_owned(), why))?;
    let mut resources = scale.resources.clone();
    let mut notes = Vec::new();
    if let Some(capacity) = &deployment.template_capacity {
        match capacity {
            Ok(capacity) => {
                for (name, quantity) in capacity {
                    resources.entry(name.clone()).or_insert_with(|| quantity.clone());
                }
            }
            Err(why) => notes.push(("spec.hardware".to_owned(), format!("no capacity annotations, and the template's capacity: {why}"))),
        }
    }
    if !(resources.contains_key("cpu") && resources.contains_key("memory")) {
        let why = notes.pop().map(|(_, why)| why).unwrap_or_else(|| "no cpu and memory".into());
        return Err((
            "spec.hardware".into(),
            format!(
                "{why}: set capacity.cluster-autoscaler.kubernetes.io/cpu and memory on the MachineDeployment, or status.capacity on its infrastructure template"
            ),
        ));
    }
    let mut hardware = Map::new();
    let mut extended = Map::new();
    for (name, quantity) in &resources {
        match name.as_str() {
            "cpu" => hardware.insert("cpu".into(), json!(quantity)),
            "memory" => hardware.insert("memory".into(), json!(quantity)),
            "ephemeral-storage" => hardware.insert("ephemeralStorage".into(), json!(quantity)),
            "pods" => hardware.insert("pods".into(), json!(quantity.parse::<i64>().unwrap_or(110))),
            other => extended.insert(other.to_owned(), json!(quantity)),
        };
    }
    if !extended.is_empty() {
        hardware.insert("extendedResources".into(), Value::Object(extended));
    }
    let mut labels = Map::new();
    for (key, value) in &scale.labels {
        match label_value(value).filter(|v| v == value) {
            Some(v) => {
                labels.insert(key.clone(), json!(v));
            }
            None => notes.push((format!("spec.labels[{key}]"), format!("{value:?} is not a label value: left out"))),
        }
    }
    if !scale.taints.is_empty() {
        notes.push(("spec".into(), format!("its nodes are tainted {}: set the taints on the ServerPool of these servers", scale.taints.join(", "))));
    }

    // The names: those of the Servers already there, then DEPLOYMENT-N.
    let mut existing: Vec<String> = existing.iter().map(|s| s.name_any()).collect();
    existing.sort();
    let mut chosen: Vec<String> = Vec::new();
    for name in existing.iter().take(max) {
        names.insert(name.clone());
        chosen.push(name.clone());
    }
    if existing.len() > max {
        notes.push((
            "metadata.name".into(),
            format!("Servers {} name this MachineDeployment beyond its max size {max}: delete them", existing[max..].join(", ")),
        ));
    }
    let base = dns_label(&deployment.key.1).unwrap_or_else(|| "machine".into());
    let mut n = 1;
    while chosen.len() < max {
        let candidate = format!("{base}-{n}");
        n += 1;
        if taken.contains(&candidate) || names.contains(&candidate) {
            continue;
        }
        chosen.push(unique_name(&candidate, names, |c| taken.contains(c)));
    }
    let mut written = Vec::new();
    for (i, name) in chosen.into_iter().enumerate() {
        let mut spec = json!({
            "provider": {"type": "ClusterAPI", "clusterAPI": {"namespace": deployment.key.0, "machineDeployment": deployment.key.1}},
            "hardware": hardware,
        });
        if !labels.is_empty() {
            spec["labels"] = Value::Object(labels.clone());
        }
        let manifest = json!({"apiVersion": ironclaim_k8s::api::API_VERSION, "kind": "Server", "metadata": {"name": name}, "spec": spec});
        // The notes are the deployment's: said once, on its first server.
        let mut gaps = if i == 0 { notes.clone() } else { Vec::new() };
        let valid = check_against_crd(&manifest, &mut gaps);
        written.push((manifest, gaps, valid));
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn deployment(name: &str, annotations: Value, template_capacity: Option<Result<BTreeMap<String, String>, String>>) -> Deployment {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
            "metadata": {"name": name, "namespace": "lab", "annotations": annotations},
            "spec": {"replicas": 0}
        }))
        .unwrap();
        Deployment { key: ("lab".into(), name.into()), object, template_capacity }
    }

    fn server(name: &str, md: &str) -> Server {
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": name},
            "spec": {"provider": {"type": "ClusterAPI", "clusterAPI": {"namespace": "lab", "machineDeployment": md}}, "hardware": {"cpu": "1", "memory": "1Gi"}}
        }))
        .unwrap()
    }

    #[test]
    fn a_node_group_becomes_one_server_per_replica_it_may_have_with_the_capacity_it_announces() {
        let md = deployment(
            "gpu",
            json!({
                MAX_SIZE_ANNOTATION: "3",
                "capacity.cluster-autoscaler.kubernetes.io/cpu": "64",
                "capacity.cluster-autoscaler.kubernetes.io/memory": "512Gi",
                "capacity.cluster-autoscaler.kubernetes.io/gpu-count": "8",
                "capacity.cluster-autoscaler.kubernetes.io/maxPods": "250",
                "capacity.cluster-autoscaler.kubernetes.io/labels": "ironclaim.dev/class=a100,zone=z1",
                "capacity.cluster-autoscaler.kubernetes.io/taints": "nvidia.com/gpu=present:NoSchedule"
            }),
            None,
        );
        // gpu-1 is another machine's Server; gpu-2 already names this one.
        let taken: BTreeSet<String> = ["gpu-1".to_string(), "gpu-2".to_string()].into();
        let mine = server("gpu-2", "gpu");
        let written = slots(&md, &[&mine], &taken, &mut BTreeSet::new()).unwrap();
        let names: Vec<&str> = written.iter().map(|(m, _, _)| m["metadata"]["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["gpu-2", "gpu-3", "gpu-4"]);
        let (manifest, gaps, valid) = &written[0];
        assert!(valid, "{gaps:?}");
        assert_eq!(manifest["spec"]["hardware"], json!({"cpu": "64", "memory": "512Gi", "pods": 250, "extendedResources": {"nvidia.com/gpu": "8"}}));
        assert_eq!(manifest["spec"]["labels"], json!({"ironclaim.dev/class": "a100", "zone": "z1"}));
        assert_eq!(manifest["spec"]["provider"], json!({"type": "ClusterAPI", "clusterAPI": {"namespace": "lab", "machineDeployment": "gpu"}}));
        assert!(gaps.iter().any(|(_, why)| why.contains("tainted nvidia.com/gpu=present:NoSchedule")), "{gaps:?}");
        assert!(written[1].1.is_empty(), "the deployment's notes are said once");
    }

    #[test]
    fn a_deployment_without_a_max_size_or_capacity_is_a_row_that_says_what_to_set() {
        let (field, why) = slots(&deployment("plain", json!({}), None), &[], &BTreeSet::new(), &mut BTreeSet::new()).unwrap_err();
        assert_eq!(field, format!("metadata.annotations[{MAX_SIZE_ANNOTATION}]"));
        assert!(why.contains("not a node group"), "{why}");
        let no_capacity = deployment("bare", json!({MAX_SIZE_ANNOTATION: "2"}), Some(Err("InfraTemplate lab/t has no status.capacity".into())));
        let (field, why) = slots(&no_capacity, &[], &BTreeSet::new(), &mut BTreeSet::new()).unwrap_err();
        assert_eq!(field, "spec.hardware");
        assert!(why.contains("has no status.capacity") && why.contains("capacity.cluster-autoscaler.kubernetes.io/cpu"), "{why}");
        let from_template = deployment(
            "templated",
            json!({MAX_SIZE_ANNOTATION: "1"}),
            Some(Ok([("cpu".to_string(), "16".to_string()), ("memory".to_string(), "64Gi".to_string())].into())),
        );
        let written = slots(&from_template, &[], &BTreeSet::new(), &mut BTreeSet::new()).unwrap();
        assert_eq!(written[0].0["spec"]["hardware"], json!({"cpu": "16", "memory": "64Gi"}));
        let bad_max = deployment("odd", json!({MAX_SIZE_ANNOTATION: "many"}), None);
        assert!(slots(&bad_max, &[], &BTreeSet::new(), &mut BTreeSet::new()).unwrap_err().1.contains("\"many\""));
    }
}
