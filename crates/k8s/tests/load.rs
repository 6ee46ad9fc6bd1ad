//! Manifests to snapshots: formats, controllers, budgets, inventory, and
//! where errors point.

use ironclaim_core::model::{Owner, PodPhase, Stage};
use ironclaim_core::{LabelSelector, Resources, Snapshot, TaintEffect};
use ironclaim_k8s::{LoadError, Loader, load_files, load_str};
use std::collections::BTreeMap;

const GI: i64 = 1 << 30;

fn load(yaml: &str) -> Snapshot {
    match load_str("test.yaml", yaml) {
        Ok(m) => {
            assert!(m.warnings.is_empty(), "unexpected warnings: {:?}", m.warnings);
            m.snapshot
        }
        Err(e) => panic!("{e}"),
    }
}

fn error(file: &str, text: &str) -> String {
    match load_str(file, text) {
        Ok(m) => panic!("loaded, expected an error: {:?}", m.snapshot),
        Err(e) => e.to_string(),
    }
}

fn names(snapshot: &Snapshot) -> Vec<String> {
    snapshot.pods.iter().map(|p| p.key()).collect()
}

const WEB_TEMPLATE: &str = "  template:
    metadata: {labels: {app: web}}
    spec:
      containers: [{name: web, resources: {requests: {cpu: 500m, memory: 1Gi}}}]
";

fn deployment(name: &str, replicas: Option<i32>) -> String {
    let replicas = replicas.map(|r| format!("  replicas: {r}\n")).unwrap_or_default();
    format!(
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {{name: {name}, namespace: shop}}\nspec:\n{replicas}  selector: {{matchLabels: {{app: web}}}}\n{WEB_TEMPLATE}"
    )
}

#[test]
fn controllers_expand_to_their_replicas() {
    let cases: &[(&str, String, Vec<&str>)] = &[
        ("a Deployment's replicas", deployment("web", Some(3)), vec!["shop/web-0", "shop/web-1", "shop/web-2"]),
        ("replicas default to 1", deployment("web", None), vec!["shop/web-0"]),
        ("zero replicas, no pods", deployment("web", Some(0)), vec![]),
        (
            "a ReplicaSet",
            format!(
                "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata: {{name: rs, namespace: shop}}\nspec:\n  replicas: 2\n  selector: {{matchLabels: {{app: web}}}}\n{WEB_TEMPLATE}"
            ),
            vec!["shop/rs-0", "shop/rs-1"],
        ),
        (
            "a StatefulSet",
            format!(
                "apiVersion: apps/v1\nkind: StatefulSet\nmetadata: {{name: db, namespace: shop}}\nspec:\n  replicas: 2\n  serviceName: db\n  selector: {{matchLabels: {{app: web}}}}\n{WEB_TEMPLATE}"
            ),
            vec!["shop/db-0", "shop/db-1"],
        ),
        (
            "a Job runs its parallelism",
            format!("apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j, namespace: shop}}\nspec:\n  parallelism: 3\n{WEB_TEMPLATE}"),
            vec!["shop/j-0", "shop/j-1", "shop/j-2"],
        ),
        (
            "a Job runs no more than the completions to go",
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j, namespace: shop}}\nspec:\n  parallelism: 5\n  completions: 4\n{WEB_TEMPLATE}status: {{succeeded: 2}}\n"
            ),
            vec!["shop/j-0", "shop/j-1"],
        ),
        (
            "a Job without parallelism runs one pod",
            format!("apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j, namespace: shop}}\nspec:\n  completions: 10\n{WEB_TEMPLATE}"),
            vec!["shop/j-0"],
        ),
        (
            "a suspended Job runs none",
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j, namespace: shop}}\nspec:\n  parallelism: 2\n  suspend: true\n{WEB_TEMPLATE}"
            ),
            vec![],
        ),
        (
            "a finished Job runs none",
            format!(
                "apiVersion: batch/v1\nkind: Job\nmetadata: {{name: j, namespace: shop}}\nspec:\n  parallelism: 2\n{WEB_TEMPLATE}status:\n  conditions: [{{type: Complete, status: 'True'}}]\n"
            ),
            vec![],
        ),
    ];
    for (what, yaml, want) in cases {
        assert_eq!(names(&load(yaml)), *want, "{what}");
    }
}

#[test]
fn expanded_pods_carry_the_template_owner_and_workload() {
    let snap = load(&deployment("web", Some(2)));
    let pod = &snap.pods[0];
    assert_eq!(pod.requests, Resources::new(500, GI).with_pods(1));
    assert_eq!(pod.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(pod.owner, Some(Owner { kind: "Deployment".into(), name: "web".into() }));
    assert_eq!(pod.workload.as_deref(), Some("web"));
    assert_eq!((pod.phase, pod.node_name.as_deref()), (PodPhase::Pending, None));
    assert!(pod.is_pending_demand());
}

/// What `kubectl get deploy,rs,pods -o yaml` gives for a Deployment of three
/// replicas with two pods running and one not yet created.
const DEPLOYMENT_RS_AND_PODS: &str = "apiVersion: v1
kind: List
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: web, namespace: shop}
  spec:
    replicas: 3
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web}}
      spec: {containers: [{name: web}]}
- apiVersion: apps/v1
  kind: ReplicaSet
  metadata:
    name: web-5d4f8c
    namespace: shop
    ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: web, uid: d1, controller: true}]
  spec:
    replicas: 3
    selector: {matchLabels: {app: web}}
    template:
      metadata: {labels: {app: web, pod-template-hash: 5d4f8c}}
      spec: {containers: [{name: web}]}
- apiVersion: v1
  kind: Pod
  metadata:
    name: web-5d4f8c-aaaaa
    namespace: shop
    labels: {app: web, pod-template-hash: 5d4f8c}
    ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f8c, uid: r1, controller: true}]
  spec: {nodeName: n1, containers: [{name: web}]}
  status: {phase: Running}
- apiVersion: v1
  kind: Pod
  metadata:
    name: web-5d4f8c-bbbbb
    namespace: shop
    labels: {app: web, pod-template-hash: 5d4f8c}
    ownerReferences: [{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f8c, uid: r1, controller: true}]
  spec: {nodeName: n1, containers: [{name: web}]}
  status: {phase: Running}
";

#[test]
fn controllers_add_only_the_pods_the_input_does_not_hold() {
    let snap = load(DEPLOYMENT_RS_AND_PODS);
    assert_eq!(names(&snap), vec!["shop/web-5d4f8c-0", "shop/web-5d4f8c-aaaaa", "shop/web-5d4f8c-bbbbb"]);
    assert!(snap.pods.iter().all(|p| p.workload.as_deref() == Some("web")), "{:?}", snap.pods);
    assert_eq!(snap.pods.iter().filter(|p| p.is_pending_demand()).count(), 1);
}

#[test]
fn a_deployment_and_its_pods_without_the_replicaset_are_not_counted_twice() {
    let without_rs: String =
        DEPLOYMENT_RS_AND_PODS.split("\n- ").filter(|item| !item.contains("kind: ReplicaSet\n")).collect::<Vec<_>>().join("\n- ");
    let snap = load(&without_rs);
    assert_eq!(names(&snap), vec!["shop/web-0", "shop/web-5d4f8c-aaaaa", "shop/web-5d4f8c-bbbbb"]);
}

#[test]
fn finished_and_terminating_pods_do_not_count_toward_replicas() {
    let yaml = format!(
        "{}---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web-old\n  namespace: shop\n  deletionTimestamp: '2026-01-01T00:00:00Z'\n  ownerReferences: [{{apiVersion: apps/v1, kind: Deployment, name: web, uid: d1, controller: true}}]\nspec: {{containers: [{{name: web}}]}}\n",
        deployment("web", Some(1))
    );
    let snap = load(&yaml);
    assert_eq!(names(&snap), vec!["shop/web-0", "shop/web-old"]);
}

#[test]
fn daemonsets_become_overhead_not_pods() {
    let snap = load(
        "apiVersion: apps/v1
kind: DaemonSet
metadata: {name: node-exporter, namespace: monitoring}
spec:
  selector: {matchLabels: {app: ne}}
  template:
    metadata: {labels: {app: ne}}
    spec:
      tolerations: [{operator: Exists}]
      containers: [{name: ne, resources: {requests: {cpu: 100m, memory: 64Mi}}}]
",
    );
    assert!(snap.pods.is_empty());
    assert_eq!(snap.daemonsets.len(), 1);
    let ds = &snap.daemonsets[0];
    assert_eq!((ds.namespace.as_str(), ds.name.as_str()), ("monitoring", "node-exporter"));
    assert_eq!(ds.template.requests, Resources::new(100, 64 << 20).with_pods(1));
    assert!(ds.template.is_daemonset_pod());
}

#[test]
fn nodes_keep_allocatable_taints_cordon_and_readiness() {
    let snap = load(
        "apiVersion: v1
kind: Node
metadata: {name: n1, labels: {zone: a, ironclaim.dev/server: r1-u10}}
spec:
  unschedulable: true
  taints: [{key: gpu, value: 'true', effect: NoSchedule}]
status:
  capacity: {cpu: '32', memory: 128Gi, pods: '110'}
  allocatable: {cpu: 31500m, memory: 120Gi, pods: '110', nvidia.com/gpu: '4'}
  conditions: [{type: Ready, status: 'False'}]
---
apiVersion: v1
kind: Node
metadata: {name: n2}
status:
  capacity: {cpu: '8', memory: 16Gi, pods: '50'}
  conditions: [{type: MemoryPressure, status: 'False'}, {type: Ready, status: 'True'}]
",
    );
    let n1 = &snap.nodes[0];
    assert_eq!(n1.allocatable, Resources::new(31_500, 120 * GI).with_pods(110).with_extended("nvidia.com/gpu", 4));
    assert_eq!(n1.taints, vec![ironclaim_core::Taint::new("gpu", "true", TaintEffect::NoSchedule)]);
    assert!(n1.unschedulable);
    assert!(!n1.ready);
    assert_eq!(n1.server.as_deref(), Some("r1-u10"));
    assert_eq!(n1.labels.get("kubernetes.io/hostname").map(String::as_str), Some("n1"));
    let n2 = &snap.nodes[1];
    assert_eq!(n2.allocatable, Resources::new(8000, 16 * GI).with_pods(50), "capacity when no allocatable");
    assert!(n2.ready);
}

fn pdb_allowed(pdb_spec: &str, pdb_status: &str, pods: usize, running: usize) -> i64 {
    let mut yaml = format!(
        "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {{name: b, namespace: shop}}\nspec:\n  selector: {{matchLabels: {{app: web}}}}\n{pdb_spec}{pdb_status}"
    );
    for i in 0..pods {
        let status = if i < running { "status: {phase: Running}\n" } else { "" };
        yaml.push_str(&format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: w{i}, namespace: shop, labels: {{app: web}}}}\nspec: {{nodeName: n1, containers: [{{name: c}}]}}\n{status}"
        ));
    }
    // A pod of another namespace and one of another app are never selected.
    yaml.push_str("---\napiVersion: v1\nkind: Pod\nmetadata: {name: x, namespace: other, labels: {app: web}}\nspec: {containers: [{name: c}]}\nstatus: {phase: Running}\n");
    yaml.push_str("---\napiVersion: v1\nkind: Pod\nmetadata: {name: y, namespace: shop, labels: {app: db}}\nspec: {containers: [{name: c}]}\nstatus: {phase: Running}\n");
    let snap = load(&yaml);
    assert_eq!(snap.pdbs.len(), 1);
    assert_eq!(snap.pdbs[0].selector, LabelSelector::matching(&[("app", "web")]));
    snap.pdbs[0].disruptions_allowed
}

#[test]
fn pdb_disruptions_allowed_from_status_or_computed_as_kubernetes_does() {
    let cases: &[(&str, &str, &str, usize, usize, i64)] = &[
        (
            "the status is taken as it is",
            "  minAvailable: 1\n",
            "status: {disruptionsAllowed: 7, currentHealthy: 0, desiredHealthy: 0, expectedPods: 0}\n",
            3,
            3,
            7,
        ),
        ("minAvailable as a count", "  minAvailable: 2\n", "", 3, 3, 1),
        ("minAvailable above the healthy pods", "  minAvailable: 2\n", "", 3, 1, 0),
        ("minAvailable as a percentage rounds up", "  minAvailable: '50%'\n", "", 3, 3, 1),
        ("maxUnavailable as a count", "  maxUnavailable: 1\n", "", 4, 4, 1),
        ("maxUnavailable as a percentage rounds up", "  maxUnavailable: '30%'\n", "", 4, 4, 2),
        ("maxUnavailable counts pods not yet running", "  maxUnavailable: 1\n", "", 4, 3, 0),
        ("neither: every healthy pod", "", "", 3, 2, 2),
    ];
    for (what, spec, status, pods, running, want) in cases {
        assert_eq!(pdb_allowed(spec, status, *pods, *running), *want, "{what}");
    }
}

#[test]
fn a_pdb_without_selector_selects_nothing_and_is_dropped() {
    let snap = load("apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: b}\nspec: {minAvailable: 1}\n");
    assert!(snap.pdbs.is_empty());
}

const SERVER: &str = "apiVersion: ironclaim.dev/v1alpha1
kind: Server
metadata: {name: r1-u10}
spec:
  bmc:
    address: redfish+https://10.0.1.10/redfish/v1/Systems/1
    credentialsSecretRef: {name: bmc, namespace: ironclaim-system}
  hardware:
    cpu: 64
    memory: 512Gi
    ephemeralStorage: 2Ti
    gpus: [{model: H100, count: 8}, {model: X1, count: 2, resourceName: example.com/fpga}]
    extendedResources: {example.com/nic: '2'}
  labels: {zone: a}
  stageDurations: {powerOn: 30s, boot: 5m, tailPercent: 200}
";

#[test]
fn the_gpus_part_of_a_servers_power_range_reaches_the_core() {
    let snap = load(&format!("{SERVER}  power: {{idleWatts: 300, peakWatts: 2500, gpuWatts: 1800}}\n"));
    let p = snap.servers[0].power;
    assert_eq!((p.idle_watts, p.peak_watts, p.gpu_watts), (300.0, 2500.0, Some(1800.0)));
    // All 8 GPUs busy, no cpu: the GPUs' part of the range.
    assert_eq!(p.load_watts(&snap.servers[0].capacity, 0, 8_000), 1800.0);
}

#[test]
fn servers_become_inventory_with_hardware_labels_and_durations() {
    let snap = load(SERVER);
    let s = &snap.servers[0];
    assert_eq!(
        s.capacity,
        Resources { ephemeral_bytes: 2 << 40, ..Resources::new(64_000, 512 * GI).with_pods(110) }
            .with_extended("nvidia.com/gpu", 8)
            .with_extended("example.com/fpga", 2)
            .with_extended("example.com/nic", 2)
    );
    assert_eq!(s.labels.get("nvidia.com/gpu.product").map(String::as_str), Some("H100"));
    assert_eq!(s.labels.get("zone").map(String::as_str), Some("a"));
    let defaults = ironclaim_core::model::StageDurations::default();
    assert_eq!((s.durations.power_on_s, s.durations.boot_s), (30, 300));
    assert_eq!((s.durations.join_s, s.durations.ready_s), (defaults.join_s, defaults.ready_s));
    assert_eq!(s.durations.tail_percent, 200);
    assert_eq!(s.power, ironclaim_core::model::PowerProfile::default());
    assert_eq!(s.health, ironclaim_core::model::Health::Healthy);
    assert!(!s.is_warm());
}

#[test]
fn server_status_measurements_health_and_links() {
    let yaml = format!(
        "{SERVER}  maintenance: false
status:
  powerState: PoweringOn
  node: n7
  failures: 2
  quarantined: true
  measuredDurations:
    powerOn: {{p50Seconds: 20, p90Seconds: 40, samples: 5}}
    boot: {{p50Seconds: 180, p90Seconds: 360, samples: 5}}
---
apiVersion: v1
kind: Node
metadata: {{name: n7}}
status: {{allocatable: {{cpu: '64', memory: 512Gi, pods: '110'}}}}
"
    );
    let snap = load(&yaml);
    let s = &snap.servers[0];
    assert!(s.is_warm());
    assert_eq!((s.failures, s.health), (2, ironclaim_core::model::Health::Quarantined));
    assert_eq!((s.durations.power_on_s, s.durations.boot_s), (20, 180), "measured medians win over the spec");
    assert_eq!(s.durations.tail_percent, 200, "p90 over p50 of the measured path");
    assert_eq!(s.node.as_deref(), Some("n7"));
    assert_eq!(snap.nodes[0].server.as_deref(), Some("r1-u10"));

    let in_maintenance = load(&SERVER.replace("  labels: {zone: a}\n", "  labels: {zone: a}\n  maintenance: true\n"));
    assert_eq!(in_maintenance.servers[0].health, ironclaim_core::model::Health::Maintenance);
}

#[test]
fn serverpools_and_claims_in_flight() {
    let snap = load(&format!(
        "apiVersion: ironclaim.dev/v1alpha1
kind: ServerPool
metadata: {{name: gpu}}
spec:
  weight: 10
  requirements:
  - {{key: accelerator, operator: Exists}}
  - {{key: cores, operator: Gt, values: ['16']}}
  template:
    labels: {{pool: gpu}}
    taints: [{{key: gpu, value: 'true', effect: NoSchedule}}]
    startupTaints: [{{key: node.example/setup, effect: NoExecute}}]
  limits: {{cpu: '512', memory: 4Ti, gpus: 16, servers: 4, watts: 12000}}
  defaultDeadline: 45m
---
apiVersion: ironclaim.dev/v1alpha1
kind: ServerClaim
metadata: {{name: claim-1, creationTimestamp: '2026-01-01T00:00:00Z'}}
spec: {{server: r1-u10, pool: gpu}}
status:
  stage: Booting
  stages:
  - {{stage: Selected, startTime: '2026-01-01T00:00:00Z', durationSeconds: 1, outcome: Succeeded}}
  - {{stage: Booting, startTime: '2026-01-01T00:01:00Z', outcome: InProgress}}
---
apiVersion: ironclaim.dev/v1alpha1
kind: ServerClaim
metadata: {{name: claim-done}}
spec: {{server: r9, pool: gpu}}
status: {{stage: Serving}}
---
apiVersion: ironclaim.dev/v1alpha1
kind: ServerClaim
metadata: {{name: claim-failed}}
spec: {{server: r8, pool: gpu}}
status: {{stage: Booting, failureReason: RegistrationTimedOut}}
---
{SERVER}"
    ));
    let pool = &snap.pools[0];
    assert_eq!(pool.weight, 10);
    assert_eq!(pool.requirements.len(), 2);
    assert_eq!(pool.labels.get("pool").map(String::as_str), Some("gpu"));
    assert_eq!(pool.taints.len(), 1);
    assert_eq!(pool.startup_taints[0].effect, TaintEffect::NoExecute);
    assert_eq!(pool.limits.cpu_milli, Some(512_000));
    assert_eq!(pool.limits.memory_bytes, Some(4 << 40));
    assert_eq!((pool.limits.gpus, pool.limits.servers, pool.limits.watts), (Some(16), Some(4), Some(12000.0)));
    assert_eq!(pool.deadline_s, Some(2700));
    assert_eq!(snap.claims.len(), 1, "only claims on their way to Ready are in flight");
    let claim = &snap.claims[0];
    assert_eq!((claim.name.as_str(), claim.server.as_str(), claim.pool.as_str()), ("claim-1", "r1-u10", "gpu"));
    assert_eq!(claim.stage, Stage::Booting);
    assert_eq!(claim.stage_started_s, 1_767_225_660);
    assert_eq!(snap.servers[0].claim.as_deref(), Some("claim-1"), "the claimed server is not free");
}

#[test]
fn json_as_kubectl_writes_it() {
    let json = r#"{
  "apiVersion": "v1",
  "kind": "List",
  "items": [
    {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"},
     "status": {"allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}},
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "api", "namespace": "shop"},
     "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "api"}},
              "template": {"metadata": {"labels": {"app": "api"}},
                           "spec": {"containers": [{"name": "api", "resources": {"requests": {"cpu": "250m"}}}]}}}}
  ]
}"#;
    for file in ["cluster.json", "cluster.txt"] {
        let snap = load_str(file, json).unwrap_or_else(|e| panic!("{e}")).snapshot;
        assert_eq!(snap.nodes.len(), 1, "{file}");
        assert_eq!(names(&snap), vec!["shop/api-0", "shop/api-1"], "{file}");
    }
    let two_objects = "{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"a\"}}\n{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"metadata\":{\"name\":\"b\"}}";
    assert_eq!(load_str("x.json", two_objects).unwrap().snapshot.nodes.len(), 2);
}

#[test]
fn typed_lists_and_empty_documents() {
    let snap = load(
        "---\n---\napiVersion: v1\nkind: NodeList\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: a}}\n- {apiVersion: v1, kind: Node, metadata: {name: b}}\n---\n# only a comment\n",
    );
    assert_eq!(snap.nodes.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(), vec!["a", "b"]);
}

#[test]
fn yaml_1_1_booleans_are_strings() {
    let snap =
        load("apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: n, labels: {enabled: yes, legacy: off}}\nspec: {containers: [{name: c}]}\n");
    assert_eq!(snap.pods[0].namespace, "n");
    assert_eq!(snap.pods[0].labels.get("enabled").map(String::as_str), Some("yes"));
}

#[test]
fn kinds_plan_does_not_read_are_skipped_with_a_warning() {
    let m = load_str(
        "all.yaml",
        "apiVersion: v1\nkind: Service\nmetadata: {name: web, namespace: shop}\n---\napiVersion: metal3.io/v1alpha1\nkind: Server\nmetadata: {name: other}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
    )
    .unwrap();
    assert_eq!(m.snapshot.nodes.len(), 1);
    assert!(m.snapshot.servers.is_empty(), "a Server of another group is not ironclaim's");
    let warnings: Vec<String> = m.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warnings,
        vec![
            "all.yaml:1: document 1 (Service shop/web): skipped: plan does not read Service (v1)",
            "all.yaml:5: document 2 (Server other): skipped: plan does not read Server (metal3.io/v1alpha1)",
        ]
    );
}

#[test]
fn errors_name_the_file_document_object_and_field() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "workloads.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n2}\n---\napiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  selector: {}\n  template:\n    spec:\n      containers:\n      - name: web\n        resources: {requests: {cpu: 1x}}\n",
            "workloads.yaml:9: document 3 (Deployment shop/web): spec.template.spec.containers[0].resources.requests.cpu: invalid quantity \"1x\"",
        ),
        (
            "bad.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n   oops: 1\n",
            "bad.yaml:5:8: invalid YAML: mapping values are not allowed in this context",
        ),
        ("bad.yaml", "apiVersion: v1\nkind: [Pod\n", "bad.yaml:2:7: invalid YAML:"),
        ("bad.json", "{\"kind\": \"Pod\",\n \"metadata\": }", "bad.json:2:14: invalid JSON: expected value"),
        (
            "types.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web, namespace: shop}\nspec:\n  replicas: three\n  selector: {}\n  template: {spec: {containers: []}}\n",
            "types.yaml:1: document 1 (Deployment shop/web): spec.replicas: invalid type: string, expected i32",
        ),
        (
            "types.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {version: 1.10}}\nspec: {containers: []}\n",
            "types.yaml:1: document 1 (Pod p): metadata.labels.version: invalid type: floating point, expected a string",
        ),
        (
            "list.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: a}}\n- {apiVersion: v1, kind: Pod, metadata: {name: p, namespace: n}, spec: {containers: [{name: c, ports: [{containerPort: x}]}]}}\n",
            "list.yaml:1: document 1, items[1] (Pod n/p): spec.containers[0].ports[0].containerPort: invalid type: string, expected i32",
        ),
        ("a.yaml", "apiVersion: v1\nmetadata: {name: p}\n", "a.yaml:1: document 1: no kind: not a Kubernetes object"),
        ("a.yaml", "kind: Pod\nmetadata: {name: p}\n", "a.yaml:1: document 1 (Pod p): no apiVersion: not a Kubernetes object"),
        ("a.yaml", "- just\n- a list\n", "a.yaml:1: document 1: expected a Kubernetes object, found a list"),
        ("a.yaml", "hello\n", "a.yaml:1: document 1: expected a Kubernetes object, found a string"),
        (
            "a.yaml",
            "apiVersion: ironclaim.dev/v1alpha1\nkind: Rack\nmetadata: {name: r1}\n",
            "a.yaml:1: document 1 (Rack r1): unknown kind \"Rack\" in \"ironclaim.dev/v1alpha1\"",
        ),
        (
            "a.yaml",
            "apiVersion: ironclaim.dev/v9\nkind: Server\nmetadata: {name: r1}\n",
            "a.yaml:1: document 1 (Server r1): unknown kind \"Server\" in \"ironclaim.dev/v9\"",
        ),
        (
            "a.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n---\napiVersion: v1\nkind: Node\nmetadata: {name: n1}\n",
            "a.yaml:5: document 2 (Node n1): Node n1 is also defined at a.yaml:1: document 1 (Node n1)",
        ),
        (
            "a.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: 2000000\n  selector: {}\n  template: {spec: {containers: []}}\n",
            "a.yaml:1: document 1 (Deployment web): more than 500000 pods in all",
        ),
        (
            "a.yaml",
            "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\nspec:\n  replicas: -1\n  selector: {}\n  template: {spec: {containers: []}}\n",
            "a.yaml:1: document 1 (Deployment web): spec.replicas: must not be negative, found -1",
        ),
        (
            "a.yaml",
            "apiVersion: policy/v1\nkind: PodDisruptionBudget\nmetadata: {name: b, namespace: n}\nspec: {selector: {}, minAvailable: 'half'}\n",
            "a.yaml:1: document 1 (PodDisruptionBudget n/b): spec.minAvailable: expected an integer or a percentage",
        ),
        (
            "inventory.yaml",
            &format!("{SERVER}  power: {{idleWatts: 100, peakWatts: 300}}\n").replace("cpu: 64", "cpu: '-64'"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.hardware.cpu: invalid quantity \"-64\": negative",
        ),
        (
            "inventory.yaml",
            &SERVER.replace("boot: 5m", "boot: five minutes"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.stageDurations.boot: invalid duration \"five minutes\"",
        ),
        (
            "pools.yaml",
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: p}\nspec:\n  requirements: [{key: cores, operator: Gt, values: [many]}]\n",
            "pools.yaml:1: document 1 (ServerPool p): spec.requirements[0].values: Gt and Lt take exactly one integer value",
        ),
        (
            "pools.yaml",
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: p}\nspec:\n  requirements: [{key: cores, operator: Near}]\n",
            "pools.yaml:1: document 1 (ServerPool p): spec.requirements[0].operator: unknown variant, expected one of `In`",
        ),
    ];
    for (file, text, want) in cases {
        let got = error(file, text);
        assert!(got.starts_with(want), "got:  {got}\nwant: {want}");
    }
}

#[test]
fn files_directories_and_what_cannot_be_read() {
    let tmp = ironclaim_testenv::TempDir::new("k8s-load");
    let dir = tmp.to_path_buf();
    std::fs::write(dir.join("a-nodes.yaml"), "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\n").unwrap();
    std::fs::write(dir.join("b-pods.json"), "{\"apiVersion\":\"v1\",\"kind\":\"Pod\",\"metadata\":{\"name\":\"p\"},\"spec\":{\"containers\":[]}}")
        .unwrap();
    std::fs::write(dir.join("notes.txt"), "not a manifest").unwrap();
    let m = load_files(std::slice::from_ref(&dir)).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((m.snapshot.nodes.len(), m.snapshot.pods.len()), (1, 1));

    let missing = dir.join("missing.yaml");
    let err = load_files(std::slice::from_ref(&missing)).unwrap_err();
    assert!(matches!(err, LoadError::Read { .. }), "{err:?}");
    assert_eq!(err.to_string(), format!("cannot read {}", missing.display()));
    assert!(std::error::Error::source(&err).is_some());

    let binary = dir.join("binary.yaml");
    std::fs::write(&binary, [b'k', b'i', 0xff, 0xfe]).unwrap();
    let err = load_files(std::slice::from_ref(&binary)).unwrap_err().to_string();
    assert_eq!(err, format!("{}: invalid text: not UTF-8 (at byte 2)", binary.display()));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn several_sources_resolve_together() {
    let mut loader = Loader::new();
    loader.add_str("deploy.yaml", &deployment("web", Some(2))).unwrap();
    loader
        .add_str(
            "pods.yaml",
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web-0, namespace: shop, ownerReferences: [{apiVersion: apps/v1, kind: Deployment, name: web, uid: u, controller: true}]}\nspec: {nodeName: n1, containers: [{name: c}]}\nstatus: {phase: Running}\n",
        )
        .unwrap();
    let snap = loader.finish().unwrap().snapshot;
    assert_eq!(names(&snap), vec!["shop/web-1", "shop/web-0"], "the expansion skips the name the input holds");
}

#[test]
fn metric_labels_and_locations() {
    let err =
        load_str("a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c, resources: {requests: {cpu: x}}}]}\n")
            .unwrap_err();
    assert_eq!(err.metric_label(), "invalid_quantity");
    let at = err.location().expect("located");
    assert_eq!((at.file.as_str(), at.document, at.line), ("a.yaml", 1, Some(1)));
    let syntax = load_str("a.yaml", "a: [").unwrap_err();
    assert_eq!(syntax.metric_label(), "syntax");
    assert!(syntax.location().is_none());
    let mut labels = BTreeMap::new();
    for text in ["kind: X\n", "apiVersion: v1\nkind: Pod\nmetadata: {name: [x]}\n"] {
        let e = load_str("a.yaml", text).unwrap_err();
        labels.insert(e.metric_label(), e.to_string());
    }
    assert!(labels.contains_key("not_an_object") && labels.contains_key("field_type"), "{labels:?}");
}

#[test]
fn json_documents_are_located_by_line_and_yaml_flow_mappings_still_load() {
    let two = "{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"a\"}}\n\n{\"apiVersion\": \"v1\", \"kind\": \"Node\",\n \"metadata\": {\"name\": \"b\"}, \"spec\": {\"unschedulable\": \"yes\"}}\n";
    let err = error("nodes.json", two);
    assert!(err.starts_with("nodes.json:3: document 2 (Node b): spec.unschedulable: invalid type: string, expected a boolean"), "{err}");
    let flow = "{apiVersion: v1, kind: Node, metadata: {name: n1}}\n";
    assert_eq!(load(flow).nodes[0].name, "n1");
    let broken = error("broken.txt", "{\"apiVersion\": \"v1\",, }");
    assert!(broken.starts_with("broken.txt:1:21: invalid JSON"), "{broken}");
}

#[test]
fn serverpool_warm_spares_and_disruption_reach_the_core() {
    use ironclaim_core::model::{BudgetNodes, DisruptionReason};
    let snap = load(
        "apiVersion: ironclaim.dev/v1alpha1
kind: ServerPool
metadata: {name: general}
spec:
  warmSpares:
    classLabel: example.com/class
    floor: [{class: general-32, count: 2}, {class: small, count: 0}]
    headroom: {cpu: '8', memory: 16Gi, gpus: 1}
    schedule: '0 8 * * 1-5'
    duration: 10h
    adaptive: {window: 2h}
  disruption:
    consolidateAfter: 30m
    budgets:
    - {nodes: '10%'}
    - {nodes: '0', schedule: '@daily', duration: 1h, reasons: [Underutilized, Drifted]}
    drainTimeout: 15m
    nodeAfterPowerOff: Park
    emptyByAttrition: false
---
apiVersion: ironclaim.dev/v1alpha1
kind: ServerPool
metadata: {name: pinned}
spec:
  disruption: {consolidateAfter: Never}
",
    );
    let warm = &snap.pools[0].warm;
    assert_eq!(warm.class_label.as_deref(), Some("example.com/class"));
    assert_eq!(warm.floor.iter().map(|(c, n)| (c.as_str(), *n)).collect::<Vec<_>>(), vec![("general-32", 2), ("small", 0)]);
    let headroom = warm.headroom.as_ref().expect("a headroom");
    assert_eq!((headroom.cpu_milli, headroom.memory_bytes, headroom.gpus()), (8000, 16 << 30, 1));
    let window = warm.window.as_ref().expect("a window");
    assert_eq!((window.cron.text.as_str(), window.duration_s), ("0 8 * * 1-5", 36_000));
    // Monday 2026-01-05 09:00 UTC is inside, 19:00 is not.
    assert!(window.is_active(1_767_603_600));
    assert!(!window.is_active(1_767_639_600));
    assert_eq!(warm.adaptive.as_ref().map(|a| (a.window_s, a.z)), Some((7200, 1.0)));
    assert_eq!(snap.pools[1].warm.adaptive, None);
    let d = &snap.pools[0].disruption;
    assert_eq!((d.consolidate_after_s, d.never, d.drain_timeout_s), (Some(1800), false, Some(900)));
    assert_eq!(d.budgets.len(), 2);
    assert_eq!((d.budgets[0].nodes, d.budgets[0].window.is_none()), (BudgetNodes::Percent(10), true));
    assert_eq!(d.budgets[1].nodes, BudgetNodes::Count(0));
    assert_eq!(d.budgets[1].reasons, vec![DisruptionReason::Underutilized, DisruptionReason::Drifted]);
    assert_eq!(d.budgets[1].window.as_ref().map(|w| w.duration_s), Some(3600));
    assert!(snap.pools[1].disruption.never);
    assert_eq!(
        (d.node_after_power_off, snap.pools[1].disruption.node_after_power_off),
        (ironclaim_core::NodeAfterPowerOff::Park, ironclaim_core::NodeAfterPowerOff::Delete)
    );
    assert_eq!((d.empty_by_attrition, snap.pools[1].disruption.empty_by_attrition), (false, true));

    let pool = |spec: &str| format!("apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {{name: p}}\nspec:\n{spec}");
    let cases: &[(&str, &str)] = &[
        ("  warmSpares: {schedule: '@daily'}\n", "spec.warmSpares: schedule and duration go together"),
        ("  warmSpares: {schedule: '0 25 * * *', duration: 1h}\n", "spec.warmSpares.schedule: invalid cron schedule"),
        ("  warmSpares: {schedule: '1-5/4294967295 * * * *', duration: 1h}\n", "spec.warmSpares.schedule: a step in"),
        ("  warmSpares: {floor: [{class: a, count: 1}, {class: a, count: 2}]}\n", "spec.warmSpares.floor[1].class: class \"a\" is listed twice"),
        ("  warmSpares: {floor: [{class: a, count: -1}]}\n", "spec.warmSpares.floor[0].count: must not be negative"),
        ("  warmSpares: {adaptive: {window: 30s}}\n", "spec.warmSpares.adaptive.window: must be between 1m and 168h"),
        ("  warmSpares: {adaptive: {window: 169h}}\n", "spec.warmSpares.adaptive.window: must be between 1m and 168h"),
        ("  warmSpares: {adaptive: {window: soon}}\n", "spec.warmSpares.adaptive.window: invalid duration"),
        ("  disruption: {budgets: [{nodes: '150%'}]}\n", "spec.disruption.budgets[0].nodes: expected a count or a percentage"),
        ("  disruption: {budgets: [{nodes: some}]}\n", "spec.disruption.budgets[0].nodes: expected a count or a percentage"),
        ("  disruption: {budgets: [{nodes: '1', duration: 1h}]}\n", "spec.disruption.budgets[0]: schedule and duration go together"),
        ("  disruption: {consolidateAfter: sometimes}\n", "spec.disruption.consolidateAfter: invalid duration"),
        ("  disruption: {drainTimeout: '-1m'}\n", "spec.disruption.drainTimeout: invalid duration"),
    ];
    for (spec, want) in cases {
        let got = error("pool.yaml", &pool(spec));
        let want = format!("pool.yaml:1: document 1 (ServerPool p): {want}");
        assert!(got.starts_with(&want), "got:  {got}\nwant: {want}");
    }
    let by_default = load(&pool("  warmSpares: {adaptive: {}}\n"));
    assert_eq!(by_default.pools[0].warm.adaptive.as_ref().map(|a| (a.window_s, a.weekly)), Some((4 * 3600, false)));
    let weekly = load(&pool("  warmSpares: {adaptive: {weekly: true}}\n"));
    assert_eq!(weekly.pools[0].warm.adaptive.as_ref().map(|a| a.weekly), Some(true));
}

#[test]
fn priority_classes_resolve_pods_that_name_them() {
    let m = load_str(
        "prio.yaml",
        "apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: overprovisioning}
value: -10
---
apiVersion: scheduling.k8s.io/v1
kind: PriorityClass
metadata: {name: normal}
value: 100
globalDefault: true
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: pause, namespace: buffer}
spec:
  replicas: 2
  selector: {matchLabels: {app: pause}}
  template:
    metadata: {labels: {app: pause}}
    spec: {priorityClassName: overprovisioning, containers: [{name: pause}]}
---
apiVersion: v1
kind: Pod
metadata: {name: plain}
spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: admitted}
spec: {priorityClassName: normal, priority: 7, containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: critical, namespace: kube-system}
spec: {priorityClassName: system-cluster-critical, containers: [{name: c}]}
---
apiVersion: v1
kind: Pod
metadata: {name: orphan}
spec: {priorityClassName: batch-low, containers: [{name: c}]}
",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let priority = |key: &str| m.snapshot.pods.iter().find(|p| p.key() == key).map(|p| p.priority);
    assert_eq!(priority("buffer/pause-0"), Some(-10));
    assert!(m.snapshot.pods.iter().find(|p| p.key() == "buffer/pause-1").is_some_and(|p| p.is_pending_demand()), "-10 is still demand");
    assert_eq!(priority("default/plain"), Some(100), "the global default");
    assert_eq!(priority("default/admitted"), Some(7), "spec.priority as admission wrote it");
    assert_eq!(priority("kube-system/critical"), Some(2_000_000_000));
    assert_eq!(priority("default/orphan"), Some(0));
    let warnings: Vec<String> = m.warnings.iter().map(|w| w.to_string()).collect();
    assert_eq!(
        warnings,
        vec!["prio.yaml:37: document 7 (Pod orphan): PriorityClass batch-low is not in the input: its pods are planned at priority 0"]
    );
}

#[test]
fn too_many_documents_is_an_error_naming_the_file_and_the_limit() {
    let text = "--- ~\n".repeat(200_001);
    let message = error("huge.yaml", &text);
    assert!(message.starts_with("huge.yaml: "), "{message}");
    assert!(message.contains("more than 200000 documents"), "{message}");
    assert!(!message.contains("Budget") && !message.contains("{"), "debug text: {message}");
    // Under the limit, the same stream loads.
    load_str("huge.yaml", &"--- ~\n".repeat(1000)).expect("a thousand empty documents");
    // JSON streams have the same limit.
    let message = error("huge.json", &"{}\n".repeat(200_001));
    assert!(message.starts_with("huge.json: more than 200000 documents"), "{message}");
}

/// Issue "The first hour", item 2: a field the API server would reject as
/// unknown (`kubectl apply`, strict field validation) was dropped, and the
/// plan went on without it: `maintainance: true` planned the server as not
/// in maintenance.
#[test]
fn unknown_fields_are_errors_naming_file_document_object_and_field() {
    let pod = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: shop}\nspec:\n  containers:\n  - name: c\n    resources: {requests: {cpu: 100m}}\n";
    let cases: Vec<(&str, String, &str)> = vec![
        // The Server's own fields, at every depth.
        ("inventory.yaml", format!("{SERVER}  maintainance: true\n"), "inventory.yaml:1: document 1 (Server r1-u10): spec.maintainance: unknown field (did you mean maintenance?)"),
        ("inventory.yaml", format!("{SERVER}resource: {{}}\n"), "inventory.yaml:1: document 1 (Server r1-u10): resource: unknown field"),
        (
            "inventory.yaml",
            SERVER.replace("metadata: {name: r1-u10}", "metadata: {name: r1-u10, lables: {zone: a}}"),
            "inventory.yaml:1: document 1 (Server r1-u10): metadata.lables: unknown field",
        ),
        (
            "inventory.yaml",
            SERVER.replace("{model: X1, count: 2,", "{model: X1, count: 2, memory: 80Gi,"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.hardware.gpus[1].memory: unknown field",
        ),
        (
            "inventory.yaml",
            format!("---\n{SERVER}status: {{measuredDurations: {{boot: {{p50Seconds: 1, p90Seconds: 2, samples: 1, p99Seconds: 3}}}}}}\n"),
            "inventory.yaml:2: document 1 (Server r1-u10): status.measuredDurations.boot.p99Seconds: unknown field",
        ),
        (
            "pools.yaml",
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: gpu}\nspec:\n  nodeSelecter: {gpu: 'true'}\n".into(),
            "pools.yaml:1: document 1 (ServerPool gpu): spec.nodeSelecter: unknown field",
        ),
        (
            "pools.yaml",
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: gpu}\nspec:\n  requirements: [{key: zone, operator: In, value: [a]}]\n".into(),
            "pools.yaml:1: document 1 (ServerPool gpu): spec.requirements[0].value: unknown field",
        ),
        (
            "claims.yaml",
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: c1}\nspec: {server: r1, pool: gpu, node: n1}\n".into(),
            "claims.yaml:1: document 1 (ServerClaim c1): spec.node: unknown field",
        ),
        // Kubernetes' kinds, read through k8s-openapi's types.
        ("pods.yaml", pod.replace("  containers:", "  nodeSelecter: {zone: a}\n  containers:"), "pods.yaml:1: document 1 (Pod shop/p): spec.nodeSelecter: unknown field (did you mean nodeSelector?)"),
        ("pods.yaml", pod.replace("    resources:", "    resource:"), "pods.yaml:1: document 1 (Pod shop/p): spec.containers[0].resource: unknown field"),
        ("pods.yaml", pod.replace("namespace: shop}", "namespace: shop, lables: {app: web}}"), "pods.yaml:1: document 1 (Pod shop/p): metadata.lables: unknown field"),
        (
            "pods.yaml",
            pod.replace("requests: {cpu: 100m}", "requests: {cpu: 100m}, limts: {cpu: 200m}"),
            "pods.yaml:1: document 1 (Pod shop/p): spec.containers[0].resources.limts: unknown field",
        ),
        (
            "web.yaml",
            deployment("web", Some(2)).replace("resources:", "resource:"),
            "web.yaml:1: document 1 (Deployment shop/web): spec.template.spec.containers[0].resource: unknown field",
        ),
        ("web.yaml", deployment("web", None).replace("spec:\n  selector", "spec:\n  replica: 3\n  selector"), "web.yaml:1: document 1 (Deployment shop/web): spec.replica: unknown field"),
        (
            "web.yaml",
            deployment("web", None).replace("metadata: {labels: {app: web}}", "metadata: {lables: {app: web}}"),
            "web.yaml:1: document 1 (Deployment shop/web): spec.template.metadata.lables: unknown field",
        ),
        (
            "nodes.yaml",
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1}\nstatus: {allocatible: {cpu: '8'}}\n".into(),
            "nodes.yaml:1: document 1 (Node n1): status.allocatible: unknown field (did you mean allocatable?)",
        ),
        (
            "list.yaml",
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Node, metadata: {name: a}}\n- {apiVersion: policy/v1, kind: PodDisruptionBudget, metadata: {name: b, namespace: n}, spec: {minAvailabe: 1}}\n".into(),
            "list.yaml:1: document 1, items[1] (PodDisruptionBudget n/b): spec.minAvailabe: unknown field",
        ),
        (
            "pods.json",
            r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"containers": [], "priorityClass": "high"}}"#.into(),
            "pods.json:1: document 1 (Pod p): spec.priorityClass: unknown field",
        ),
    ];
    let mut failures = Vec::new();
    for (file, text, want) in &cases {
        match load_str(file, text) {
            Ok(_) => failures.push(format!("loaded, want {want}")),
            Err(e) if e.to_string().starts_with(want) && e.metric_label() == "unknown_field" => {}
            Err(e) => failures.push(format!("got:  {e} ({})\nwant: {want}", e.metric_label())),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Without the typos, the same documents load.
    load(&format!("{SERVER}  maintenance: true\n"));
    load(pod);
    load(&deployment("web", Some(2)));
}

/// Issue "The first hour", item 2: Servers the API server refuses by its
/// CRD's rules were loaded, and even claimed. The loader applies the same
/// rules, read from the same CRD.
#[test]
fn objects_the_crds_refuse_are_errors_with_the_crds_reason() {
    let no_bmc = SERVER.replace(
        "  bmc:\n    address: redfish+https://10.0.1.10/redfish/v1/Systems/1\n    credentialsSecretRef: {name: bmc, namespace: ironclaim-system}\n",
        "",
    );
    let cases: Vec<(String, &str)> = vec![
        (
            no_bmc.clone(),
            "inventory.yaml:1: document 1 (Server r1-u10): spec: bmc is required unless provider.type is Metal3, External or ClusterAPI",
        ),
        (
            format!("{no_bmc}  provider: {{type: Redfish}}\n"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec: bmc is required unless provider.type is Metal3, External or ClusterAPI",
        ),
        (
            SERVER.replace("redfish+https://10.0.1.10/redfish/v1/Systems/1", "ftp://10.0.1.10"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.bmc.address: invalid value \"ftp://10.0.1.10\": must match ^(redfish\\+)?https?://[^\\s]+$",
        ),
        (
            format!("{SERVER}  power: {{idleWatts: 500, peakWatts: 300}}\n"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.power: peakWatts must be at least idleWatts",
        ),
        (
            format!("{SERVER}  power: {{idleWatts: 300, peakWatts: 1000, gpuWatts: 800}}\n"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.power: gpuWatts must be at most peakWatts - idleWatts",
        ),
        (
            SERVER.replace("credentialsSecretRef: {name: bmc, namespace: ironclaim-system}", "credentialsSecretRef: {name: bmc}"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.bmc.credentialsSecretRef: missing field `namespace`",
        ),
        (format!("{SERVER}  adopt: Always\n"), "inventory.yaml:1: document 1 (Server r1-u10): spec.adopt: unknown variant, expected one of `Auto`"),
        (
            SERVER.replace("{model: H100, count: 8}", "{model: H100, count: 80}"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.hardware.gpus[0].count: must be at most 64, found 80",
        ),
        (
            SERVER.replace("labels: {zone: a}", "labels: {zone: 'rack 1'}"),
            "inventory.yaml:1: document 1 (Server r1-u10): spec.labels.zone: invalid value \"rack 1\": must match",
        ),
        (
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: p}\nspec: {weight: 101}\n".into(),
            "inventory.yaml:1: document 1 (ServerPool p): spec.weight: must be at most 100, found 101",
        ),
        (
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: p}\nspec:\n  warmSpares: {schedule: '0 8 * * 1-5'}\n".into(),
            "inventory.yaml:1: document 1 (ServerPool p): spec.warmSpares: schedule and duration go together",
        ),
        (
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: p}\nspec:\n  warmSpares: {adaptive: {window: 30s}}\n".into(),
            "inventory.yaml:1: document 1 (ServerPool p): spec.warmSpares.adaptive.window: must be between 1m and 168h",
        ),
        (
            "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: c}\nspec: {server: r1, pool: ''}\n".into(),
            "inventory.yaml:1: document 1 (ServerClaim c): spec.pool: \"\" is shorter than 1 characters",
        ),
    ];
    let mut failures = Vec::new();
    for (text, want) in &cases {
        match load_str("inventory.yaml", text) {
            Ok(m) => failures.push(format!("loaded ({} servers), want {want}", m.snapshot.servers.len())),
            Err(e) if e.to_string().starts_with(want) => {}
            Err(e) => failures.push(format!("got:  {e}\nwant: {want}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // What the rules allow loads: Metal3 without a BMC, http, equal watts,
    // a Redfish server with its BMC, a window in range.
    load(&format!("{no_bmc}  provider: {{type: Metal3, metal3: {{namespace: metal3, name: r1-u10}}}}\n"));
    load(&SERVER.replace("redfish+https://10.0.1.10/redfish/v1/Systems/1", "http://10.0.1.10"));
    load(&format!("{SERVER}  power: {{idleWatts: 300, peakWatts: 300}}\n  provider: {{type: Redfish}}\n"));
    load(
        "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerPool\nmetadata: {name: p}\nspec:\n  warmSpares: {adaptive: {window: 2h}, schedule: '@daily', duration: 8h}\n",
    );
}

/// Strictness must not refuse what kubectl itself writes: `create
/// --dry-run=client -o yaml` (null creationTimestamp, empty strategy,
/// resources and status), a StatefulSet's claim templates with their
/// apiVersion and kind, and a Server as `kubectl get -o yaml` prints it.
#[test]
fn what_kubectl_writes_still_loads_strictly() {
    let created = "apiVersion: apps/v1
kind: Deployment
metadata:
  creationTimestamp: null
  labels: {app: web}
  name: web
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  strategy: {}
  template:
    metadata:
      creationTimestamp: null
      labels: {app: web}
    spec:
      containers:
      - image: nginx
        name: nginx
        resources: {}
status: {}
";
    assert_eq!(load(created).pods.len(), 2);
    let sts = "apiVersion: apps/v1
kind: StatefulSet
metadata: {name: db, namespace: shop}
spec:
  replicas: 1
  serviceName: db
  selector: {matchLabels: {app: db}}
  template:
    metadata: {labels: {app: db}}
    spec: {containers: [{name: db, image: postgres}]}
  volumeClaimTemplates:
  - apiVersion: v1
    kind: PersistentVolumeClaim
    metadata: {creationTimestamp: null, name: data}
    spec:
      accessModes: [ReadWriteOnce]
      resources: {requests: {storage: 10Gi}}
      volumeMode: Filesystem
    status: {phase: Pending}
";
    assert_eq!(load(sts).pods.len(), 1);
    let got = SERVER.replace(
        "metadata: {name: r1-u10}",
        "metadata:
  creationTimestamp: '2026-01-01T00:00:00Z'
  generation: 3
  name: r1-u10
  resourceVersion: '4242'
  uid: 5f0e7a52-1c3b-4c4e-9a53-6b0d1c9e2f11
  managedFields:
  - {apiVersion: ironclaim.dev/v1alpha1, fieldsType: FieldsV1, fieldsV1: {f:spec: {}}, manager: kubectl, operation: Apply, time: '2026-01-01T00:00:00Z'}",
    ) + "status:
  powerState: 'Off'
  failures: 0
  quarantined: false
  identity: {systemUUID: 5f0e7a52-1c3b-4c4e-9a53-6b0d1c9e2f11}
  conditions:
  - {type: Reachable, status: 'True', reason: BmcAnswered, message: '', lastTransitionTime: '2026-01-01T00:00:00Z', observedGeneration: 3}
";
    assert_eq!(load(&got).servers.len(), 1);
}
