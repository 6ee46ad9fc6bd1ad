//! The CRD manifests in deploy/ are generated from the code: regenerate
//! them with `ironclaim crds > deploy/crds/ironclaim.dev.yaml` (and the
//! chart's copy) when this fails.

use std::path::Path;

fn deploy(path: &str) -> String {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy").join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[test]
fn deploy_crds_match_what_ironclaim_crds_prints() {
    let generated = ironclaim_k8s::api::crds_yaml().expect("crds");
    for path in ["crds/ironclaim.dev.yaml", "helm/ironclaim/crds/ironclaim.dev.yaml"] {
        assert!(deploy(path) == generated, "deploy/{path} drifted from the code: run `ironclaim crds > deploy/{path}`");
    }
}

#[test]
fn the_chart_grants_the_same_cluster_rules_as_deploy_rbac() {
    let rules = |text: &str| -> Vec<String> {
        let start = text.find("kind: ClusterRole\n").expect("a ClusterRole");
        let body = &text[start..];
        let end = body.find("\n---").unwrap_or(body.len());
        body[..end]
            .lines()
            .map(str::trim)
            .filter(|l| ["- apiGroups", "resources", "resourceNames", "verbs"].iter().any(|k| l.starts_with(k)))
            .map(str::to_string)
            .collect()
    };
    let plain = rules(&deploy("rbac.yaml"));
    assert!(plain.len() >= 30, "{plain:?}");
    let chart = ironclaim_testenv::helm(["template", "ironclaim", &crate::deploy_helm::chart(), "--show-only", "templates/rbac.yaml"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plain, rules(&chart));
}

/// Issue 14, hole 9: the controller could drain (and power off) the node
/// it runs on. Its own pods are do-not-disrupt as ironclaim reads them,
/// cannot be scheduled on a node ironclaim manages, keep their replicas on
/// different nodes, and a PodDisruptionBudget keeps one of them up.
#[test]
fn the_controller_never_runs_on_or_drains_a_node_it_manages() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::policy::v1::PodDisruptionBudget;

    let text = deploy("deployment.yaml");
    let mut docs = text.split("\n---\n");
    let deployment: Deployment = serde_saphyr::from_str(docs.next().unwrap()).expect("the Deployment");
    let pdb: PodDisruptionBudget = serde_saphyr::from_str(docs.next().expect("a second document")).expect("the PodDisruptionBudget");
    protects_its_nodes(&deployment, &pdb, "deploy/deployment.yaml");

    // The chart, as helm renders it, carries the same protections.
    let chart = crate::deploy_helm::render(&[]);
    let of = |kind: &str| crate::deploy_helm::the(&chart, kind).clone();
    let deployment: Deployment = serde_json::from_value(of("Deployment")).expect("the chart's Deployment");
    let pdb: PodDisruptionBudget = serde_json::from_value(of("PodDisruptionBudget")).expect("the chart's PodDisruptionBudget");
    protects_its_nodes(&deployment, &pdb, "the chart");
}

fn protects_its_nodes(deployment: &k8s_openapi::api::apps::v1::Deployment, pdb: &k8s_openapi::api::policy::v1::PodDisruptionBudget, source: &str) {
    use ironclaim_core::labels::Labels;
    use ironclaim_core::predicates::check_node_affinity;

    let spec = &deployment.spec;
    let pod =
        ironclaim_k8s::pod::pod_from_template(&spec.template, "ironclaim-system", "ironclaim-controller", source).expect("the pod template converts");
    assert!(pod.do_not_disrupt, "{source}: ironclaim would drain its own controller");

    let labels = |pairs: &[(&str, &str)]| -> Labels { pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect() };
    let managed = labels(&[
        ("kubernetes.io/hostname", "r1-u01"),
        (ironclaim_core::provision::SERVERPOOL_LABEL, "general"),
        (ironclaim_core::provision::SERVER_LABEL, "r1-u01"),
    ]);
    let labelled_only = labels(&[("kubernetes.io/hostname", "r1-u02"), (ironclaim_core::provision::SERVER_LABEL, "r1-u02")]);
    let control = labels(&[("kubernetes.io/hostname", "cp-1")]);
    assert!(check_node_affinity(&pod, &managed, "r1-u01").is_err(), "{source}: schedulable on a managed node");
    assert!(check_node_affinity(&pod, &labelled_only, "r1-u02").is_err(), "{source}: schedulable on a node linked to a server");
    assert!(check_node_affinity(&pod, &control, "cp-1").is_ok(), "{source}: nowhere to run");

    let anti = spec.template.spec.as_ref().unwrap().affinity.as_ref().and_then(|a| a.pod_anti_affinity.as_ref()).expect("anti-affinity");
    let terms = anti.required_during_scheduling_ignored_during_execution.as_ref().expect("required anti-affinity");
    assert!(terms.iter().any(|t| t.topology_key == "kubernetes.io/hostname"), "{source}: two replicas may share a node");
    let pdb_spec = pdb.spec.as_ref().unwrap();
    assert_eq!(pdb_spec.min_available, Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1)), "{source}");
    assert_eq!(
        pdb_spec.selector.as_ref().and_then(|s| s.match_labels.clone()),
        spec.selector.match_labels.clone(),
        "{source}: the PDB selects the controller's pods"
    );

    // The root filesystem is read-only; BMC CA bundles are written under
    // the temporary directory, which must be a writable volume.
    let pod_spec = spec.template.spec.as_ref().unwrap();
    let container = &pod_spec.containers[0];
    assert_eq!(container.security_context.as_ref().and_then(|c| c.read_only_root_filesystem), Some(true), "{source}");
    let tmp = container.volume_mounts.iter().flatten().find(|m| m.mount_path == "/tmp").expect("a writable /tmp for CA bundles");
    let volume = pod_spec.volumes.iter().flatten().find(|v| v.name == tmp.name).expect("the /tmp volume");
    assert!(volume.empty_dir.is_some(), "{source}: /tmp is an emptyDir");
}
