//! The controller works with exactly the rules of deploy/rbac.yaml: it runs
//! as the ironclaim ServiceAccount (impersonated) against the real API
//! server, claims a server, powers it on and sees its pod bound.

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_controller::leader::LeaseSettings;
use ironclaim_testenv::eventually;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_runs_with_exactly_the_rules_of_deploy_rbac() {
    let (env, admin) = setup().await;
    let rbac = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rbac.yaml")).unwrap();
    env.kubectl_with_stdin(["apply", "-f", "-"], &rbac).expect("apply deploy/rbac.yaml");
    let _ = env.kubectl([
        "-n",
        "ironclaim-system",
        "create",
        "secret",
        "generic",
        "bmc",
        "--from-literal=username=admin",
        "--from-literal=password=password",
    ]);

    let machines = vec![Machine::new("rbac-1", 51, 16, 32)];
    let sushy = start_sushy([(machines[0].uuid.clone(), SystemPower::Off)]);
    let mut server = machines[0].server_json(&sushy);
    server["spec"]["bmc"]["credentialsSecretRef"]["namespace"] = json!("ironclaim-system");
    apply(&env, &server);
    apply(&env, &serverpool("default", json!([]), json!({})));
    let _harness = Machines::start(admin.clone(), &sushy, machines.clone());

    // The admin's kubeconfig, impersonating the ServiceAccount.
    let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig()).unwrap();
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.unwrap();
    config.auth_info.impersonate = Some("system:serviceaccount:ironclaim-system:ironclaim".into());
    config.auth_info.impersonate_groups =
        Some(vec!["system:serviceaccounts".into(), "system:serviceaccounts:ironclaim-system".into(), "system:authenticated".into()]);
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    // The rules are in force: the account may not read Secrets elsewhere.
    let forbidden = kube::Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), NAMESPACE).get("bmc").await;
    assert!(matches!(forbidden, Err(kube::Error::Api(ref s)) if s.code == 403), "{forbidden:?}");
    // `ironclaim controller` checks the CRDs before it starts: the rules
    // must let it read them.
    let preflight = ironclaim_controller::doctor::preflight(&client).await;
    assert!(preflight.is_ok(), "the controller's start-up check fails under deploy/rbac.yaml: {preflight:?}");

    let mut settings = settings("rbac");
    // Claim locks where the Deployment keeps them: in its own namespace.
    settings.claims.lock_namespace = "ironclaim-system".into();
    settings.lease = Some(LeaseSettings {
        namespace: "ironclaim-system".into(),
        name: "ironclaim-controller".into(),
        identity: "rbac".into(),
        duration: Duration::from_secs(10),
        power_budget_watts: None,
        transition_limits: Default::default(),
    });
    let controller = Controller::new(client.clone(), redfish(&client), settings);
    let metrics = controller.metrics();
    let running = run(controller);
    apply(&env, &pod("app", "8", "8Gi", &[], 0));
    let c = admin.clone();
    eventually("the app bound under the ServiceAccount's rules", Duration::from_secs(45), || {
        let c = c.clone();
        async move { bound(&c, "app").await }
    })
    .await;
    assert_eq!(pod_node(&admin, "app").await.as_deref(), Some("rbac-1"));
    let c = admin.clone();
    eventually("events written", Duration::from_secs(10), || {
        let c = c.clone();
        async move {
            let events = pod_events(&c, "app").await;
            if events.iter().any(|e| e.starts_with("ServerClaimed")) { Ok(()) } else { Err(format!("{events:?}")) }
        }
    })
    .await;
    let text = metrics.render();
    assert!(!text.contains("ironclaim_errors_total{"), "a step failed under these rules: {text}");
    running.stop().await;
}
