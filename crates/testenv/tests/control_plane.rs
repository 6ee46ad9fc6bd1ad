//! Acceptance tests of the control plane started by `hack/testenv`: the real
//! scheduler binds pods, kwok runs them, the Eviction API enforces
//! PodDisruptionBudgets whose status kube-controller-manager computes, and
//! CRD schemas are enforced by kube-apiserver.
//!
//! They fail (never skip) when the binaries are not built.

use std::time::Duration;

use ironclaim_testenv::{FAKE_NODE_ANNOTATION, TestEnv, eventually};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ApiResource, DynamicObject, EvictParams, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const FIELD_MANAGER: &str = "ironclaim-testenv-tests";
/// Generous: on a loaded 2-core machine the controllers need a few seconds
/// per step, and a timeout here means a broken environment, not a slow one.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(90);

fn env() -> TestEnv {
    TestEnv::shared().unwrap_or_else(|error| panic!("{error}"))
}

async fn client(env: &TestEnv) -> Client {
    env.client().await.unwrap_or_else(|error| panic!("{error}"))
}

/// Names unique to this test process, so the tests also pass against a
/// reused environment (`IRONCLAIM_KUBECONFIG`) that saw earlier runs.
fn unique(base: &str) -> String {
    format!("{base}-{}", std::process::id())
}

fn apply() -> PatchParams {
    PatchParams::apply(FIELD_MANAGER).force()
}

/// A Node kwok plays the kubelet for, labelled so only this test's pods land
/// on it.
fn create_fake_node(env: &TestEnv, name: &str, pool: &str) {
    let (key, value) = FAKE_NODE_ANNOTATION;
    let manifest = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": { key: value },
            "labels": { "ironclaim.dev/test-pool": pool },
        },
        "status": {
            "capacity": { "cpu": "8", "memory": "32Gi", "pods": "110" },
            "allocatable": { "cpu": "8", "memory": "32Gi", "pods": "110" },
        },
    });
    env.kubectl_with_stdin(["apply", "-f", "-"], &manifest.to_string()).unwrap_or_else(|error| panic!("{error}"));
}

fn create_namespace(env: &TestEnv, name: &str) {
    let manifest = json!({ "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": name } });
    env.kubectl_with_stdin(["apply", "-f", "-"], &manifest.to_string()).unwrap_or_else(|error| panic!("{error}"));
}

fn deployment(name: &str, pool: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": {
                "metadata": { "labels": { "app": name } },
                "spec": {
                    "nodeSelector": { "ironclaim.dev/test-pool": pool },
                    "containers": [{
                        "name": "app",
                        // Never pulled: kwok only pretends to run containers.
                        "image": "registry.invalid/ironclaim/app:1",
                        "resources": { "requests": { "cpu": "100m", "memory": "64Mi" } },
                    }],
                },
            },
        },
    }))
    .expect("deployment manifest is valid")
}

fn is_ready(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn describe_pods(pods: &[Pod]) -> String {
    pods.iter()
        .map(|p| {
            format!(
                "{} node={:?} phase={:?} ready={}",
                p.metadata.name.as_deref().unwrap_or("?"),
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()),
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                is_ready(p)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Waits until exactly `count` live pods of `app` run Ready on `node`.
async fn running_pods_on(pods: &Api<Pod>, app: &str, node: &str, count: usize) -> Vec<Pod> {
    let selector = format!("app={app}");
    eventually(&format!("{count} pods of {app} Running and Ready on {node}"), CONVERGE_TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels(&selector)).await.map_err(|e| e.to_string())?;
        let live: Vec<Pod> = list.items.into_iter().filter(|p| p.metadata.deletion_timestamp.is_none()).collect();
        let done = live.len() == count
            && live.iter().all(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    && is_ready(p)
            });
        if done { Ok(live) } else { Err(describe_pods(&live)) }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduler_binds_deployment_pods_to_a_kwok_node_and_kwok_runs_them() {
    let env = env();
    let client = client(&env).await;
    let namespace = unique("scheduling");
    let node = unique("kwok-scheduling");
    create_namespace(&env, &namespace);
    create_fake_node(&env, &node, &namespace);

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    deployments.patch("web", &apply(), &Patch::Apply(deployment("web", &namespace, 2))).await.expect("deployment is accepted");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let running = running_pods_on(&pods, "web", &node, 2).await;
    assert_eq!(running.len(), 2);

    // kwok marked the node Ready; kubectl sees the same world as the client.
    let ready = env
        .kubectl(["get", "node", &node, "-o", "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}"])
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(ready.trim(), "True", "kwok should mark node {node} Ready");
    let nodes_of_pods = env
        .kubectl(["get", "pods", "-n", &namespace, "-l", "app=web", "-o", "jsonpath={.items[*].spec.nodeName}"])
        .unwrap_or_else(|error| panic!("{error}"));
    assert_eq!(nodes_of_pods.split_whitespace().collect::<Vec<_>>(), [node.as_str(); 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eviction_is_refused_at_the_pdb_floor_and_allowed_after_scaling_up() {
    let env = env();
    let client = client(&env).await;
    let namespace = unique("disruption");
    let node = unique("kwok-disruption");
    create_namespace(&env, &namespace);
    create_fake_node(&env, &node, &namespace);

    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    deployments.patch("guarded", &apply(), &Patch::Apply(deployment("guarded", &namespace, 2))).await.expect("deployment is accepted");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": { "name": "guarded" },
        "spec": { "minAvailable": 2, "selector": { "matchLabels": { "app": "guarded" } } },
    }))
    .expect("pdb manifest is valid");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), &namespace);
    pdbs.patch("guarded", &apply(), &Patch::Apply(pdb)).await.expect("pdb is accepted");

    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let running = running_pods_on(&pods, "guarded", &node, 2).await;
    // The disruption controller must have counted both pods, or a 429 below
    // would only mean "status not computed yet".
    wait_for_pdb(&pdbs, "guarded", 2, 0).await;

    let victim = running[0].metadata.name.clone().expect("pods have names");
    let refused = pods.evict(&victim, &EvictParams::default()).await;
    match refused {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 429, "eviction at the PDB floor: {status:?}");
            assert!(status.message.contains("disruption budget"), "429 should name the disruption budget: {}", status.message);
        }
        other => panic!("eviction at the PDB floor should be refused with 429, got {other:?}"),
    }
    let still_there = pods.get(&victim).await.expect("refused eviction keeps the pod");
    assert!(still_there.metadata.deletion_timestamp.is_none());

    deployments.patch("guarded", &apply(), &Patch::Apply(deployment("guarded", &namespace, 3))).await.expect("scale up is accepted");
    running_pods_on(&pods, "guarded", &node, 3).await;
    wait_for_pdb(&pdbs, "guarded", 3, 1).await;

    pods.evict(&victim, &EvictParams::default()).await.expect("eviction above the PDB floor succeeds");
    eventually(&format!("evicted pod {victim} to go away"), CONVERGE_TIMEOUT, || async {
        match pods.get_opt(&victim).await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(pod) if pod.metadata.deletion_timestamp.is_some() => Ok(()),
            Some(_) => Err("pod still there without a deletion timestamp".to_owned()),
        }
    })
    .await;
}

async fn wait_for_pdb(pdbs: &Api<PodDisruptionBudget>, name: &str, current_healthy: i32, disruptions_allowed: i32) {
    eventually(&format!("PDB {name} status currentHealthy={current_healthy} disruptionsAllowed={disruptions_allowed}"), CONVERGE_TIMEOUT, || async {
        let pdb = pdbs.get(name).await.map_err(|e| e.to_string())?;
        let generation = pdb.metadata.generation;
        let status = pdb.status.unwrap_or_default();
        if status.observed_generation == generation
            && status.current_healthy == Some(current_healthy)
            && status.expected_pods == Some(current_healthy)
            && status.disruptions_allowed == Some(disruptions_allowed)
        {
            Ok(())
        } else {
            Err(format!(
                "generation={generation:?} observed={:?} currentHealthy={:?} expectedPods={:?} disruptionsAllowed={:?}",
                status.observed_generation, status.current_healthy, status.expected_pods, status.disruptions_allowed
            ))
        }
    })
    .await;
}

const WIDGET_RULE_MESSAGE: &str = "more than 5 replicas need a large widget";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_schema_rejects_an_invalid_object_with_the_schema_message() {
    let env = env();
    let client = client(&env).await;
    let namespace = unique("schema");
    create_namespace(&env, &namespace);

    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "widgets.testenv.ironclaim.dev" },
        "spec": {
            "group": "testenv.ironclaim.dev",
            "scope": "Namespaced",
            "names": { "plural": "widgets", "singular": "widget", "kind": "Widget" },
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": { "openAPIV3Schema": {
                    "type": "object",
                    "properties": { "spec": {
                        "type": "object",
                        "required": ["replicas", "size"],
                        "properties": {
                            "replicas": { "type": "integer", "minimum": 0, "maximum": 10 },
                            "size": { "type": "string", "enum": ["small", "large"] },
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.replicas <= 5 || self.size == 'large'",
                            "message": WIDGET_RULE_MESSAGE,
                        }],
                    }},
                }},
            }],
        },
    }))
    .expect("crd manifest is valid");
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch("widgets.testenv.ironclaim.dev", &apply(), &Patch::Apply(crd)).await.expect("a structural schema is accepted");
    eventually("CRD widgets to be Established", CONVERGE_TIMEOUT, || async {
        let crd = crds.get("widgets.testenv.ironclaim.dev").await.map_err(|e| e.to_string())?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        if conditions.iter().any(|c| c.type_ == "Established" && c.status == "True") { Ok(()) } else { Err(format!("{conditions:?}")) }
    })
    .await;

    let gvk = GroupVersionKind::gvk("testenv.ironclaim.dev", "v1", "Widget");
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), &namespace, &ApiResource::from_gvk(&gvk));
    let widget = |name: &str, replicas: i64, size: &str| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "testenv.ironclaim.dev/v1",
            "kind": "Widget",
            "metadata": { "name": name },
            "spec": { "replicas": replicas, "size": size },
        }))
        .expect("widget manifest is valid")
    };

    // A valid object is stored: the rejections below come from the schema,
    // not from a resource that is not served.
    eventually("a valid widget to be created", CONVERGE_TIMEOUT, || async {
        match widgets.create(&PostParams::default(), &widget("fits", 3, "small")).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
            // Established can precede the handler being routable by a moment.
            Err(kube::Error::Api(status)) if status.code == 404 => Err(status.message),
            Err(error) => panic!("valid widget rejected: {error}"),
        }
    })
    .await;

    let rejected = widgets.create(&PostParams::default(), &widget("too-many", 7, "small")).await;
    match rejected {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "schema violation: {status:?}");
            assert!(status.message.contains(WIDGET_RULE_MESSAGE), "rejection should carry the schema's message: {}", status.message);
        }
        other => {
            panic!("widget violating the x-kubernetes-validations rule was accepted: {other:?}")
        }
    }

    // The OpenAPI bounds of the schema are enforced too, and kubectl reports them.
    let out_of_bounds = json!({
        "apiVersion": "testenv.ironclaim.dev/v1",
        "kind": "Widget",
        "metadata": { "name": "out-of-bounds", "namespace": namespace },
        "spec": { "replicas": 11, "size": "large" },
    });
    match env.kubectl_with_stdin(["create", "-f", "-"], &out_of_bounds.to_string()) {
        Err(ironclaim_testenv::Error::KubectlFailed { stderr, .. }) => assert!(
            stderr.contains("spec.replicas") && stderr.contains("less than or equal to 10"),
            "kubectl should show the schema's bound: {stderr}"
        ),
        other => panic!("widget with replicas=11 was not rejected: {other:?}"),
    }
    assert!(widgets.get_opt("too-many").await.expect("get works").is_none(), "the rejected widget must not be stored");
}
