//! Pods as the core sees them: every edge of `pod_from_k8s`.

use ironclaim_core::labels::TolerationOperator;
use ironclaim_core::model::{HostPort, Owner, PodAffinityTerm, PodPhase, TopologySpread, WhenUnsatisfiable};
use ironclaim_core::{LabelSelector, NodeSelectorTerm, Operator, Requirement, Resources, TaintEffect, Toleration};
use ironclaim_k8s::pod_from_k8s;
use k8s_openapi::api::core::v1::Pod;

const GI: i64 = 1 << 30;
const MI: i64 = 1 << 20;

fn parse(yaml: &str) -> Pod {
    serde_saphyr::from_str(yaml).unwrap_or_else(|e| panic!("test manifest does not parse: {e}\n{yaml}"))
}

/// A pod named `p` in namespace `ns` with the given spec (indented YAML).
fn pod_with_spec(spec: &str) -> Pod {
    parse(&format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns\n  labels: {{app: web, tier: front}}\nspec:\n{spec}"))
}

fn convert(spec: &str) -> ironclaim_core::Pod {
    pod_from_k8s(&pod_with_spec(spec)).unwrap_or_else(|e| panic!("{e}\n{spec}"))
}

fn req(cpu_milli: i64, memory: i64) -> Resources {
    Resources::new(cpu_milli, memory).with_pods(1)
}

#[test]
fn effective_requests_follow_kube_scheduler() {
    let cases: &[(&str, &str, Resources)] = &[
        ("one container", "  containers:\n  - {name: a, resources: {requests: {cpu: 500m, memory: 1Gi}}}\n", req(500, GI)),
        ("no resources at all: one pod slot", "  containers:\n  - {name: a}\n", req(0, 0)),
        (
            "containers add up",
            "  containers:\n  - {name: a, resources: {requests: {cpu: 500m, memory: 1Gi}}}\n  - {name: b, resources: {requests: {cpu: 250m, memory: 512Mi}}}\n",
            req(750, GI + 512 * MI),
        ),
        (
            "a larger init container wins resource by resource",
            "  initContainers:\n  - {name: i, resources: {requests: {cpu: '2', memory: 100Mi}}}\n  containers:\n  - {name: a, resources: {requests: {cpu: 500m, memory: 1Gi}}}\n",
            req(2000, GI),
        ),
        (
            "init containers run one at a time: the largest counts, not the sum",
            "  initContainers:\n  - {name: i1, resources: {requests: {cpu: '1'}}}\n  - {name: i2, resources: {requests: {cpu: '3'}}}\n  containers:\n  - {name: a, resources: {requests: {cpu: 500m}}}\n",
            req(3000, 0),
        ),
        (
            "a sidecar (restartPolicy Always) adds to the containers",
            "  initContainers:\n  - {name: proxy, restartPolicy: Always, resources: {requests: {cpu: 200m, memory: 64Mi}}}\n  containers:\n  - {name: a, resources: {requests: {cpu: 500m, memory: 1Gi}}}\n",
            req(700, GI + 64 * MI),
        ),
        (
            "an init container after a sidecar runs beside it",
            "  initContainers:\n  - {name: proxy, restartPolicy: Always, resources: {requests: {cpu: '1'}}}\n  - {name: migrate, resources: {requests: {cpu: '2'}}}\n  containers:\n  - {name: a, resources: {requests: {cpu: 500m}}}\n",
            req(3000, 0),
        ),
        (
            "an init container before a sidecar runs without it",
            "  initContainers:\n  - {name: migrate, resources: {requests: {cpu: '2'}}}\n  - {name: proxy, restartPolicy: Always, resources: {requests: {cpu: '1'}}}\n  containers:\n  - {name: a, resources: {requests: {cpu: 500m}}}\n",
            req(2000, 0),
        ),
        (
            "pod overhead is added last",
            "  overhead: {cpu: 250m, memory: 120Mi}\n  initContainers:\n  - {name: i, resources: {requests: {cpu: '2'}}}\n  containers:\n  - {name: a, resources: {requests: {cpu: 500m, memory: 1Gi}}}\n",
            req(2250, GI + 120 * MI),
        ),
        (
            "a limit stands in for a missing request",
            "  containers:\n  - {name: a, resources: {limits: {cpu: '2', memory: 4Gi}}}\n",
            req(2000, 4 * GI),
        ),
        (
            "a request is kept when both are set, per resource",
            "  containers:\n  - {name: a, resources: {requests: {cpu: '1'}, limits: {cpu: '2', memory: 4Gi}}}\n",
            req(1000, 4 * GI),
        ),
        (
            "limits stand in for init container requests too",
            "  initContainers:\n  - {name: i, resources: {limits: {memory: 8Gi}}}\n  containers:\n  - {name: a, resources: {requests: {memory: 1Gi}}}\n",
            req(0, 8 * GI),
        ),
        (
            "extended resources set as limits only",
            "  containers:\n  - {name: a, resources: {requests: {cpu: '8'}, limits: {nvidia.com/gpu: '2'}}}\n",
            req(8000, 0).with_extended("nvidia.com/gpu", 2),
        ),
        (
            "ephemeral storage and hugepages",
            "  containers:\n  - {name: a, resources: {requests: {ephemeral-storage: 10Gi, hugepages-2Mi: 1Gi}}}\n",
            Resources { ephemeral_bytes: 10 * GI, ..req(0, 0) }.with_extended("hugepages-2Mi", GI),
        ),
        (
            "pod-level resources replace the containers' cpu and memory",
            "  resources: {requests: {cpu: '4'}, limits: {memory: 16Gi}}\n  containers:\n  - {name: a, resources: {requests: {cpu: '1', memory: 1Gi, ephemeral-storage: 1Gi}}}\n",
            Resources { ephemeral_bytes: GI, ..req(4000, 16 * GI) },
        ),
        ("numbers are quantities too", "  containers:\n  - {name: a, resources: {requests: {cpu: 2, memory: 1073741824}}}\n", req(2000, GI)),
    ];
    for (what, spec, want) in cases {
        assert_eq!(&convert(spec).requests, want, "{what}");
    }
}

#[test]
fn node_selector_and_every_form_of_required_node_affinity() {
    let pod = convert(
        "  nodeSelector: {accelerator: nvidia-a100}
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
        - matchExpressions:
          - {key: zone, operator: In, values: [a, b]}
          - {key: rack, operator: NotIn, values: [r9]}
          - {key: gpu, operator: Exists}
          - {key: spot, operator: DoesNotExist}
          - {key: cores, operator: Gt, values: ['16']}
          - {key: age, operator: Lt, values: ['30']}
        - matchFields:
          - {key: metadata.name, operator: In, values: [n1]}
      preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 1
        preference:
          matchExpressions:
          - {key: ignored, operator: Exists}
  containers: [{name: a}]
",
    );
    assert_eq!(pod.node_selector.get("accelerator").map(String::as_str), Some("nvidia-a100"));
    use Operator::*;
    let r = |k: &str, op, v: &[&str]| Requirement::new(k, op, v);
    assert_eq!(
        pod.node_affinity,
        vec![
            NodeSelectorTerm {
                match_expressions: vec![
                    r("zone", In, &["a", "b"]),
                    r("rack", NotIn, &["r9"]),
                    r("gpu", Exists, &[]),
                    r("spot", DoesNotExist, &[]),
                    r("cores", Gt, &["16"]),
                    r("age", Lt, &["30"]),
                ],
                match_fields: vec![],
            },
            NodeSelectorTerm { match_expressions: vec![], match_fields: vec![r("metadata.name", In, &["n1"])] },
        ],
        "preferred terms are not constraints"
    );
}

#[test]
fn tolerations_keep_operator_value_and_effect() {
    let pod = convert(
        "  tolerations:
  - {operator: Exists}
  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
  - {key: dedicated, value: ml, effect: NoExecute, tolerationSeconds: 60}
  - {key: soft, operator: Equal, value: x, effect: PreferNoSchedule}
  containers: [{name: a}]
",
    );
    assert_eq!(
        *pod.tolerations,
        vec![
            Toleration { key: "".into(), operator: TolerationOperator::Exists, value: "".into(), effect: None },
            Toleration {
                key: "nvidia.com/gpu".into(),
                operator: TolerationOperator::Exists,
                value: "".into(),
                effect: Some(TaintEffect::NoSchedule),
            },
            Toleration { key: "dedicated".into(), operator: TolerationOperator::Equal, value: "ml".into(), effect: Some(TaintEffect::NoExecute) },
            Toleration { key: "soft".into(), operator: TolerationOperator::Equal, value: "x".into(), effect: Some(TaintEffect::PreferNoSchedule) },
        ]
    );
}

#[test]
fn pod_affinity_and_anti_affinity_with_namespaces_and_label_keys() {
    let pod = convert(
        "  affinity:
    podAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector: {matchLabels: {app: cache}}
        namespaces: [infra]
        topologyKey: topology.kubernetes.io/zone
      - labelSelector: {matchExpressions: [{key: app, operator: In, values: [db]}]}
        namespaceSelector: {}
        topologyKey: kubernetes.io/hostname
    podAntiAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
      - labelSelector: {matchLabels: {app: web}}
        matchLabelKeys: [tier, absent]
        mismatchLabelKeys: [app]
        topologyKey: kubernetes.io/hostname
      - topologyKey: kubernetes.io/hostname
  containers: [{name: a}]
",
    );
    assert_eq!(
        pod.pod_affinity,
        vec![
            PodAffinityTerm {
                label_selector: Some(LabelSelector::matching(&[("app", "cache")])),
                namespaces: vec!["infra".into()],
                namespace_selector: None,
                topology_key: "topology.kubernetes.io/zone".into(),
            },
            PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Default::default(),
                    match_expressions: vec![Requirement::new("app", Operator::In, &["db"])],
                }),
                namespaces: vec![],
                namespace_selector: Some(Default::default()),
                topology_key: "kubernetes.io/hostname".into(),
            },
        ]
    );
    let mut merged = LabelSelector::matching(&[("app", "web")]);
    merged.match_expressions = vec![Requirement::new("tier", Operator::In, &["front"]), Requirement::new("app", Operator::NotIn, &["web"])];
    assert_eq!(
        pod.pod_anti_affinity,
        vec![
            PodAffinityTerm {
                label_selector: Some(merged),
                namespaces: vec![],
                namespace_selector: None,
                topology_key: "kubernetes.io/hostname".into(),
            },
            PodAffinityTerm { label_selector: None, namespaces: vec![], namespace_selector: None, topology_key: "kubernetes.io/hostname".into() },
        ],
        "matchLabelKeys and mismatchLabelKeys take the pod's own values; absent keys are ignored; no selector matches nothing"
    );
}

#[test]
fn topology_spread_constraints() {
    let pod = convert(
        "  topologySpreadConstraints:
  - {maxSkew: 1, topologyKey: topology.kubernetes.io/zone, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: web}}, minDomains: 3}
  - {maxSkew: 2, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: ScheduleAnyway, labelSelector: {matchLabels: {app: web}}, matchLabelKeys: [tier]}
  containers: [{name: a}]
",
    );
    let mut with_tier = LabelSelector::matching(&[("app", "web")]);
    with_tier.match_expressions.push(Requirement::new("tier", Operator::In, &["front"]));
    assert_eq!(
        pod.topology_spread,
        vec![
            TopologySpread {
                max_skew: 1,
                topology_key: "topology.kubernetes.io/zone".into(),
                when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
                label_selector: Some(LabelSelector::matching(&[("app", "web")])),
                min_domains: Some(3),
                node_affinity_policy: ironclaim_core::model::InclusionPolicy::Honor,
                node_taints_policy: ironclaim_core::model::InclusionPolicy::Ignore,
            },
            TopologySpread {
                max_skew: 2,
                topology_key: "kubernetes.io/hostname".into(),
                when_unsatisfiable: WhenUnsatisfiable::ScheduleAnyway,
                label_selector: Some(with_tier),
                min_domains: None,
                node_affinity_policy: ironclaim_core::model::InclusionPolicy::Honor,
                node_taints_policy: ironclaim_core::model::InclusionPolicy::Ignore,
            },
        ]
    );
}

#[test]
fn host_ports_from_containers_sidecars_and_host_network() {
    let hp = |port: u16, protocol: &str, host_ip: &str| HostPort { port, protocol: protocol.into(), host_ip: host_ip.into() };
    let cases: &[(&str, &str, Vec<HostPort>)] = &[
        ("container port without host port", "  containers:\n  - {name: a, ports: [{containerPort: 8080}]}\n", vec![]),
        (
            "host port with protocol and address",
            "  containers:\n  - {name: a, ports: [{containerPort: 53, hostPort: 53, protocol: UDP, hostIP: 10.0.0.1}, {containerPort: 80, hostPort: 8080}]}\n",
            vec![hp(53, "UDP", "10.0.0.1"), hp(8080, "TCP", "")],
        ),
        (
            "hostNetwork makes every container port a host port",
            "  hostNetwork: true\n  containers:\n  - {name: a, ports: [{containerPort: 9100}]}\n",
            vec![hp(9100, "TCP", "")],
        ),
        (
            "sidecars hold their ports, plain init containers do not",
            "  initContainers:\n  - {name: once, ports: [{containerPort: 1, hostPort: 1}]}\n  - {name: proxy, restartPolicy: Always, ports: [{containerPort: 15001, hostPort: 15001}]}\n  containers:\n  - {name: a}\n",
            vec![hp(15001, "TCP", "")],
        ),
    ];
    for (what, spec, want) in cases {
        assert_eq!(&convert(spec).host_ports, want, "{what}");
    }
}

fn with_metadata(metadata: &str, status: &str) -> ironclaim_core::Pod {
    let yaml = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n{metadata}spec:\n  containers: [{{name: a}}]\n{status}");
    pod_from_k8s(&parse(&yaml)).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

#[test]
fn owner_and_workload() {
    let cases: &[(&str, &str, Option<Owner>, Option<&str>)] = &[
        ("no owner", "", None, None),
        (
            "a Deployment's pod: the ReplicaSet owns it, the Deployment names the workload",
            "  labels: {pod-template-hash: 5d4f8c}\n  ownerReferences:\n  - {apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f8c, uid: u1, controller: true}\n",
            Some(Owner { kind: "ReplicaSet".into(), name: "web-5d4f8c".into() }),
            Some("web"),
        ),
        (
            "a bare ReplicaSet's pod",
            "  ownerReferences:\n  - {apiVersion: apps/v1, kind: ReplicaSet, name: legacy, uid: u1, controller: true}\n",
            Some(Owner { kind: "ReplicaSet".into(), name: "legacy".into() }),
            Some("legacy"),
        ),
        (
            "the controller reference wins over the first",
            "  ownerReferences:\n  - {apiVersion: v1, kind: ConfigMap, name: cm, uid: u0}\n  - {apiVersion: batch/v1, kind: Job, name: nightly, uid: u1, controller: true}\n",
            Some(Owner { kind: "Job".into(), name: "nightly".into() }),
            Some("nightly"),
        ),
        (
            "without a controller reference the first owner",
            "  ownerReferences:\n  - {apiVersion: apps/v1, kind: StatefulSet, name: db, uid: u0}\n",
            Some(Owner { kind: "StatefulSet".into(), name: "db".into() }),
            Some("db"),
        ),
    ];
    for (what, metadata, owner, workload) in cases {
        let pod = with_metadata(metadata, "");
        assert_eq!(&pod.owner, owner, "{what}");
        assert_eq!(pod.workload.as_deref(), *workload, "{what}");
    }
}

#[test]
fn phase_binding_priority_creation_and_termination() {
    let pod = with_metadata("", "");
    assert_eq!(
        (pod.namespace.as_str(), pod.phase, pod.node_name.clone(), pod.priority, pod.terminating),
        ("default", PodPhase::Pending, None, 0, false)
    );

    let bound = pod_from_k8s(&parse(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n  namespace: ns\n  creationTimestamp: '2026-01-02T03:04:05Z'\n  deletionTimestamp: '2026-01-02T03:05:05Z'\nspec:\n  nodeName: n1\n  priority: 1000\n  containers: [{name: a}]\nstatus: {phase: Running}\n",
    ))
    .unwrap();
    assert_eq!(bound.node_name.as_deref(), Some("n1"));
    assert_eq!(bound.phase, PodPhase::Running);
    assert_eq!(bound.priority, 1000);
    assert!(bound.terminating);
    assert_eq!(bound.created_s, 1_767_323_045);

    let phases: &[(&str, PodPhase)] = &[
        ("Pending", PodPhase::Pending),
        ("Running", PodPhase::Running),
        ("Succeeded", PodPhase::Succeeded),
        ("Failed", PodPhase::Failed),
        ("Unknown", PodPhase::Pending),
    ];
    for (text, want) in phases {
        assert_eq!(with_metadata("", &format!("status: {{phase: {text}}}\n")).phase, *want, "{text}");
    }
}

#[test]
fn annotations_set_deadline_and_do_not_disrupt() {
    let cases: &[(&str, Option<u64>, bool)] = &[
        ("{}", None, false),
        ("{ironclaim.dev/deadline: 10m}", Some(600), false),
        ("{ironclaim.dev/deadline: 1h}", Some(3600), false),
        ("{ironclaim.dev/deadline: 90s}", Some(90), false),
        ("{ironclaim.dev/deadline: 1h30m}", Some(5400), false),
        ("{ironclaim.dev/do-not-disrupt: 'true'}", None, true),
        ("{ironclaim.dev/do-not-disrupt: 'false'}", None, false),
        ("{karpenter.sh/do-not-disrupt: 'true'}", None, true),
        ("{karpenter.sh/do-not-disrupt: 'false'}", None, false),
        ("{cluster-autoscaler.kubernetes.io/safe-to-evict: 'false'}", None, true),
        ("{cluster-autoscaler.kubernetes.io/safe-to-evict: 'true'}", None, false),
    ];
    for (annotations, deadline, do_not_disrupt) in cases {
        let pod = with_metadata(&format!("  annotations: {annotations}\n"), "");
        assert_eq!((pod.deadline_s, pod.do_not_disrupt), (*deadline, *do_not_disrupt), "{annotations}");
    }
}

#[test]
fn karpenters_do_not_disrupt_duration_runs_from_the_pods_start() {
    let created = "  creationTimestamp: '2026-01-05T12:00:00Z'\n  annotations: {karpenter.sh/do-not-disrupt: 30m}\n";
    let t0: u64 = 1_767_614_400;
    // Not started yet: from its creation.
    let pending = with_metadata(created, "");
    assert!(!pending.do_not_disrupt);
    assert_eq!(pending.do_not_disrupt_until_s, Some(t0 + 1800));
    // Started five minutes after its creation: from its start.
    let running = with_metadata(created, "status: {phase: Running, startTime: '2026-01-05T12:05:00Z'}\n");
    assert_eq!(running.do_not_disrupt_until_s, Some(t0 + 300 + 1800));
    assert!(running.protected_at(t0 + 2099) && !running.protected_at(t0 + 2100));
}

#[test]
fn bad_fields_are_named_by_their_path() {
    let cases: &[(&str, &str)] = &[
        ("  containers:\n  - {name: a, resources: {requests: {cpu: 1x}}}\n", "spec.containers[0].resources.requests.cpu: invalid quantity \"1x\""),
        (
            "  containers:\n  - {name: a}\n  - {name: b, resources: {limits: {nvidia.com/gpu: '-1'}}}\n",
            "spec.containers[1].resources.limits[\"nvidia.com/gpu\"]: invalid quantity \"-1\"",
        ),
        (
            "  initContainers:\n  - {name: i, resources: {requests: {memory: 1Qi}}}\n  containers: [{name: a}]\n",
            "spec.initContainers[0].resources.requests.memory: invalid quantity \"1Qi\"",
        ),
        ("  overhead: {cpu: lots}\n  containers: [{name: a}]\n", "spec.overhead.cpu: invalid quantity \"lots\""),
        (
            "  containers:\n  - {name: a, resources: {requests: {memory: 2Ei}}}\n",
            "spec.containers[0].resources.requests.memory: invalid quantity \"2Ei\": larger than any machine",
        ),
        (
            "  affinity:\n    nodeAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n        nodeSelectorTerms:\n        - matchExpressions: [{key: z, operator: Near}]\n  containers: [{name: a}]\n",
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: unknown node selector operator \"Near\"",
        ),
        (
            "  affinity:\n    podAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n      - {labelSelector: {matchExpressions: [{key: a, operator: Gt, values: ['1']}]}, topologyKey: z}\n  containers: [{name: a}]\n",
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator: unknown label selector operator \"Gt\"",
        ),
        (
            "  tolerations: [{key: a, effect: NoScheduleX}]\n  containers: [{name: a}]\n",
            "spec.tolerations[0].effect: unknown taint effect \"NoScheduleX\"",
        ),
        (
            "  tolerations: [{key: a, operator: Maybe}]\n  containers: [{name: a}]\n",
            "spec.tolerations[0].operator: unknown toleration operator \"Maybe\"",
        ),
        (
            "  topologySpreadConstraints: [{maxSkew: 0, topologyKey: z, whenUnsatisfiable: DoNotSchedule}]\n  containers: [{name: a}]\n",
            "spec.topologySpreadConstraints[0].maxSkew: must be greater than 0",
        ),
        (
            "  topologySpreadConstraints: [{maxSkew: 1, topologyKey: z, whenUnsatisfiable: Sometimes}]\n  containers: [{name: a}]\n",
            "spec.topologySpreadConstraints[0].whenUnsatisfiable: unknown whenUnsatisfiable \"Sometimes\"",
        ),
        (
            "  containers:\n  - {name: a, ports: [{containerPort: 80, hostPort: 70000}]}\n",
            "spec.containers[0].ports[0].hostPort: not a port number: 70000",
        ),
    ];
    for (spec, want) in cases {
        let err = pod_from_k8s(&pod_with_spec(spec)).expect_err(spec).to_string();
        assert!(err.starts_with(want), "got:  {err}\nwant: {want}");
    }
}

#[test]
fn bad_annotations_and_metadata_are_named_by_their_path() {
    let cases: &[(&str, &str)] = &[
        ("  annotations: {ironclaim.dev/deadline: soon}\n", "metadata.annotations[\"ironclaim.dev/deadline\"]: invalid duration \"soon\""),
        ("  annotations: {ironclaim.dev/deadline: '-5m'}\n", "metadata.annotations[\"ironclaim.dev/deadline\"]: invalid duration \"-5m\": negative"),
        (
            "  annotations: {ironclaim.dev/deadline: '600'}\n",
            "metadata.annotations[\"ironclaim.dev/deadline\"]: invalid duration \"600\": missing unit",
        ),
        (
            "  annotations: {ironclaim.dev/do-not-disrupt: 'yes'}\n",
            "metadata.annotations[\"ironclaim.dev/do-not-disrupt\"]: expected \"true\" or \"false\"",
        ),
        (
            "  annotations: {karpenter.sh/do-not-disrupt: 'yes'}\n",
            "metadata.annotations[\"karpenter.sh/do-not-disrupt\"]: invalid duration \"yes\": expected \"true\" or a duration",
        ),
    ];
    for (metadata, want) in cases {
        let yaml = format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\n{metadata}spec:\n  containers: [{{name: a}}]\n");
        let err = pod_from_k8s(&parse(&yaml)).expect_err(metadata).to_string();
        assert!(err.starts_with(want), "got:  {err}\nwant: {want}");
    }
    let nameless = parse("apiVersion: v1\nkind: Pod\nmetadata: {}\nspec:\n  containers: [{name: a}]\n");
    assert_eq!(pod_from_k8s(&nameless).unwrap_err().to_string(), "metadata.name: required");
    let specless = parse("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n");
    assert_eq!(pod_from_k8s(&specless).unwrap_err().to_string(), "spec: required");
}

/// A pod bound to node-3 whose one container asks for `spec_cpu`, with the
/// kubelet's status: what it applied and allocated, and the resize condition.
fn resizing(spec_cpu: &str, applied: &str, allocated: &str, condition: &str) -> ironclaim_core::Pod {
    let yaml = format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: db-0\n  namespace: shop\n  creationTimestamp: '2026-01-01T00:00:00Z'\n  ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, name: db, uid: u, controller: true}}]\nspec:\n  nodeName: node-3\n  containers:\n  - {{name: db, resources: {{requests: {{cpu: '{spec_cpu}', memory: 4Gi}}}}}}\nstatus:\n  phase: Running\n  conditions:\n{condition}  containerStatuses:\n  - {{name: db, image: db, imageID: '', ready: true, restartCount: 0, resources: {{requests: {{cpu: '{applied}', memory: 4Gi}}}}, allocatedResources: {{cpu: '{allocated}', memory: 4Gi}}}}\n"
    );
    pod_from_k8s(&parse(&yaml)).unwrap_or_else(|e| panic!("{e}\n{yaml}"))
}

fn condition(status: &str, reason: &str) -> String {
    format!("  - {{type: PodResizePending, status: '{status}', reason: {reason}, lastTransitionTime: '2026-01-01T00:10:00Z'}}\n")
}

#[test]
fn an_infeasible_resize_holds_what_the_kubelet_applied_and_asks_for_the_spec() {
    use ironclaim_core::model::ResizeReason;
    let p = resizing("12", "4", "4", &condition("True", "Infeasible"));
    assert_eq!(p.requests, req(4000, 4 * GI), "kube-scheduler counts the applied size while the resize is infeasible");
    let r = p.resize.clone().expect("a resize waits");
    assert_eq!((r.desired, r.reason), (req(12_000, 4 * GI), ResizeReason::Infeasible));
    assert_eq!(r.since_s, 1_767_225_600 + 600, "since the condition's last transition");
    assert!(p.is_resize_demand() && !p.is_pending_demand());
}

#[test]
fn a_deferred_resize_is_counted_at_its_new_size_where_it_runs() {
    use ironclaim_core::model::ResizeReason;
    let p = resizing("12", "4", "4", &condition("True", "Deferred"));
    assert_eq!(p.requests, req(12_000, 4 * GI), "kube-scheduler counts the larger of spec and status");
    assert_eq!(p.resize.map(|r| r.reason), Some(ResizeReason::Deferred));
}

#[test]
fn no_resize_waits_without_a_true_condition_a_known_reason_or_growth() {
    // Applied, or being applied: nothing waits.
    assert_eq!(resizing("12", "12", "12", "  - {type: Ready, status: 'True'}\n").resize, None);
    // A condition that no longer holds.
    assert_eq!(resizing("12", "4", "4", &condition("False", "Infeasible")).resize, None);
    // A reason this version does not know: not demand.
    assert_eq!(resizing("12", "4", "4", &condition("True", "Unknown")).resize, None);
    // A shrink the kubelet has not applied holds the old, larger size.
    let shrink = resizing("2", "4", "4", &condition("True", "Infeasible"));
    assert_eq!((shrink.requests.clone(), shrink.resize), (req(4000, 4 * GI), None));
    // The larger of applied and allocated is held.
    assert_eq!(resizing("1", "2", "3", "  - {type: Ready, status: 'True'}\n").requests, req(3000, 4 * GI));
}

#[test]
fn a_bad_quantity_in_the_status_names_its_field() {
    let yaml = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: ns}\nspec:\n  nodeName: n\n  containers:\n  - {name: a, resources: {requests: {cpu: '1'}}}\nstatus:\n  containerStatuses:\n  - {name: a, image: a, imageID: '', ready: true, restartCount: 0, allocatedResources: {cpu: 'lots'}}\n";
    let err = serde_saphyr::from_str::<Pod>(yaml).map_err(|e| e.to_string()).and_then(|p| pod_from_k8s(&p).map_err(|e| e.to_string()));
    let err = err.expect_err("lots is no quantity");
    assert!(err.contains("allocatedResources") || err.contains("lots"), "{err}");
}
