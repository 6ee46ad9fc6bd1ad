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
    assert_eq!(plain, rules(&deploy("helm/ironclaim/templates/rbac.yaml")));
}
