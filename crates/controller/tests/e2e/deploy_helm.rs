//! The Helm chart (deploy/helm/ironclaim) as helm renders and installs it,
//! with the helm `hack/testenv helm` builds: it lints clean, renders every
//! object with what the values ask, installs into the test control plane,
//! and its ServiceAccount's rules are enough for the controller to lead,
//! reconcile and serve its metrics.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_controller::leader::LeaseSettings;
use ironclaim_testenv::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use serde_json::{Value, json};

/// Where the install test puts the release: its own namespace, apart from
/// the objects deploy/rbac.yaml's test applies in ironclaim-system.
pub const RELEASE_NAMESPACE: &str = "ironclaim-helm";
const RELEASE: &str = "ironclaim";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn chart() -> String {
    repo().join("deploy/helm/ironclaim").display().to_string()
}

/// `helm template` of the chart in namespace ironclaim-system with these
/// extra arguments, as parsed objects.
pub fn render(extra: &[&str]) -> Vec<Value> {
    let chart = chart();
    let mut args = vec!["template", RELEASE, chart.as_str(), "--namespace", "ironclaim-system"];
    args.extend_from_slice(extra);
    let text = ironclaim_testenv::helm(&args).unwrap_or_else(|e| panic!("{e}"));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap_or_else(|e| panic!("helm template printed what is not YAML: {e}\n{text}"))
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

pub fn kinds(objects: &[Value]) -> Vec<String> {
    objects.iter().map(|o| format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?"))).collect()
}

pub fn the<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let mut of_kind = objects.iter().filter(|o| o["kind"] == kind);
    let found = of_kind.next().unwrap_or_else(|| panic!("no {kind} among {:?}", kinds(objects)));
    assert!(of_kind.next().is_none(), "more than one {kind} among {:?}", kinds(objects));
    found
}

#[test]
fn the_chart_lints_strictly_and_its_schema_refuses_unknown_values() {
    let chart = chart();
    let lint = ironclaim_testenv::helm(["lint", "--strict", chart.as_str()]).unwrap_or_else(|e| panic!("{e}"));
    assert!(lint.contains("0 chart(s) failed"), "{lint}");
    let lint = ironclaim_testenv::helm(["lint", "--strict", chart.as_str(), "--set", "controller.dryRun=true,controller.leaderElect=false"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(lint.contains("0 chart(s) failed"), "{lint}");

    for (set, why) in [
        ("replica=3", "an unknown top-level value"),
        ("controller.dryrun=true", "an unknown controller flag"),
        ("controller.logFormat=xml", "a log format the controller does not know"),
        ("controller.batchIdle=soon", "a duration Go would not parse"),
        ("image.digest=latest", "a digest that is not sha256"),
    ] {
        let refused = ironclaim_testenv::helm(["template", RELEASE, chart.as_str(), "--set", set]);
        assert!(
            matches!(&refused, Err(ironclaim_testenv::Error::HelmFailed { stderr, .. }) if stderr.contains("schema")),
            "{why} ({set}) was accepted: {refused:?}"
        );
    }
}

#[test]
fn the_chart_readme_is_generated_from_the_values() {
    let output = std::process::Command::new(repo().join("hack/chart-readme")).arg("--check").output().expect("run hack/chart-readme");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn the_chart_renders_every_object_and_the_monitoring_ones_only_where_the_api_is_served() {
    let objects = render(&[]);
    let mut found: Vec<String> = kinds(&objects);
    found.sort();
    assert_eq!(
        found,
        [
            "ClusterRole/ironclaim",
            "ClusterRoleBinding/ironclaim",
            "Deployment/ironclaim",
            "PodDisruptionBudget/ironclaim",
            "Role/ironclaim-bmc-credentials",
            "Role/ironclaim-leader-election",
            "RoleBinding/ironclaim-bmc-credentials",
            "RoleBinding/ironclaim-leader-election",
            "Service/ironclaim-metrics",
            "ServiceAccount/ironclaim",
        ]
    );
    for object in &objects {
        let labels = &object["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/managed-by"], "Helm", "{}", kinds(std::slice::from_ref(object))[0]);
        assert_eq!(labels["app.kubernetes.io/instance"], RELEASE);
        if object["kind"] != "ClusterRole" && object["kind"] != "ClusterRoleBinding" {
            assert_eq!(object["metadata"]["namespace"], "ironclaim-system", "{}", kinds(std::slice::from_ref(object))[0]);
        }
    }

    let deployment = the(&objects, "Deployment");
    let pod = &deployment["spec"]["template"]["spec"];
    let selector = &deployment["spec"]["selector"]["matchLabels"];
    assert_eq!(pod["serviceAccountName"], the(&objects, "ServiceAccount")["metadata"]["name"]);
    let binding = the(&objects, "ClusterRoleBinding");
    assert_eq!(binding["subjects"][0]["name"], "ironclaim");
    assert_eq!(binding["roleRef"]["name"], the(&objects, "ClusterRole")["metadata"]["name"]);

    // The Service carries the metrics port to the controller's pods.
    let service = the(&objects, "Service");
    assert_eq!(&service["spec"]["selector"], selector);
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");

    let container = &pod["containers"][0];
    assert_eq!(container["image"], "ghcr.io/ironclaim/ironclaim:v0.1.0");
    assert_eq!(container["ports"][0], json!({"name": "metrics", "containerPort": 8080, "protocol": "TCP"}));
    assert_eq!(container["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
    assert_eq!(container["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "metrics"}));
    assert_eq!(container["resources"], json!({"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}}));
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(container["securityContext"]["capabilities"]["drop"], json!(["ALL"]));
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    let spread = &pod["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(&spread["labelSelector"]["matchLabels"], selector, "the spread counts the controller's own pods");
    assert_eq!(&pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]["matchLabels"], selector);
    assert_eq!(&the(&objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], selector);
    let args: Vec<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    assert!(args.contains(&"--leader-elect") && !args.contains(&"--dry-run"), "{args:?}");

    // Where the Prometheus Operator's API is served, and only there, the
    // ServiceMonitor scrapes that port and the alerts are those of
    // deploy/monitoring/prometheusrule.yaml.
    let monitored = render(&["--api-versions", "monitoring.coreos.com/v1"]);
    assert_eq!(monitored.len(), objects.len() + 2, "{:?}", kinds(&monitored));
    let monitor = the(&monitored, "ServiceMonitor");
    assert_eq!(&monitor["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");
    let rule = the(&monitored, "PrometheusRule");
    let text = std::fs::read_to_string(repo().join("deploy/monitoring/prometheusrule.yaml")).unwrap();
    let plain: Value = serde_saphyr::from_str(&text).expect("deploy/monitoring/prometheusrule.yaml");
    assert!(plain["spec"]["groups"].as_array().is_some_and(|g| g.len() >= 4), "{plain}");
    assert_eq!(
        rule["spec"], plain["spec"],
        "deploy/helm/ironclaim/files/alerts.yaml drifted from deploy/monitoring/prometheusrule.yaml's spec: change both"
    );
    let off = render(&["--api-versions", "monitoring.coreos.com/v1", "--set", "serviceMonitor.enabled=false,prometheusRule.enabled=false"]);
    assert_eq!(kinds(&off), kinds(&objects));
}

/// Every flag of `ironclaim controller` is a value under `controller:` (or
/// set by the chart itself), and each value reaches its flag.
#[test]
fn every_controller_flag_is_a_chart_value_that_reaches_the_flag() {
    let objects = render(&[
        "--set",
        "controller.batchIdle=2s,controller.batchMax=20s,controller.stuckMarginPercent=150,controller.quarantineAfter=5",
        "--set",
        "controller.redecideEvery=45s,controller.powerSweepEvery=2m,controller.leaseName=ic-lease,controller.leaseDuration=30s",
        "--set",
        "controller.dryRun=true,controller.powerBudgetWatts=12000,controller.logFormat=text,metricsPort=9090",
        "--set",
        "controller.maxCyclesPerDay=6,controller.kubeApiQps=12.5,controller.kubeApiBurst=30",
        "--set-json",
        r#"controller.transitionRates=["topology.kubernetes.io/rack=4","fleet=20"]"#,
        "--set",
        "extraArgs={--some-future-flag=1}",
        "--set",
        "image.digest=sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        "--set",
        "env[0].name=RUST_LOG,env[0].value=debug,nodeSelector.role=infra,podAnnotations.team=metal,podLabels.tier=control",
        "--set",
        "tolerations[0].key=infra,tolerations[0].operator=Exists",
        "--set-json",
        r#"externalProviders.providers=[{"name":"ipmi","command":["/etc/ironclaim/providers/ipmi.sh"],"timeout":"30s"}]"#,
        "--set-json",
        r##"externalProviders.scripts={"ipmi.sh":"#!/bin/sh\necho hi\n"}"##,
    ]);
    let deployment = the(&objects, "Deployment");
    let template = &deployment["spec"]["template"];
    let container = &template["spec"]["containers"][0];
    let args: BTreeSet<&str> = container["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
    for expected in [
        "controller",
        "--metrics-address=0.0.0.0:9090",
        "--batch-idle=2s",
        "--batch-max=20s",
        "--stuck-margin-percent=150",
        "--quarantine-after=5",
        "--redecide-every=45s",
        "--power-sweep-every=2m",
        "--leader-elect",
        "--lease-name=ic-lease",
        "--lease-duration=30s",
        "--dry-run",
        "--power-budget-watts=12000",
        "--transition-rate=topology.kubernetes.io/rack=4",
        "--transition-rate=fleet=20",
        "--max-cycles-per-day=6",
        "--kube-api-qps=12.5",
        "--kube-api-burst=30",
        "--log-format=text",
        "--some-future-flag=1",
        "--external-providers=/etc/ironclaim/providers/providers.yaml",
    ] {
        assert!(args.contains(expected), "{expected} missing from {args:?}");
    }
    // The providers file the controller reads is the one the values give,
    // and the controller accepts it; the scripts are mounted executable.
    let config = the(&objects, "ConfigMap");
    let file = config["data"]["providers.yaml"].as_str().expect("providers.yaml");
    let parsed = ironclaim_controller::ExternalPower::parse("providers.yaml", file).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(parsed.names().collect::<Vec<_>>(), ["ipmi"]);
    assert_eq!(config["data"]["ipmi.sh"], "#!/bin/sh\necho hi\n");
    let volume = template["spec"]["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "external-providers").expect("the volume");
    assert_eq!(volume["configMap"]["defaultMode"], 0o555);
    assert_eq!(template["spec"]["shareProcessNamespace"], true, "PID 1 reaps what a killed command leaves");
    assert_eq!(container["image"], "ghcr.io/ironclaim/ironclaim@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
    assert_eq!(container["ports"][0]["containerPort"], 9090);
    assert!(container["env"].as_array().unwrap().contains(&json!({"name": "RUST_LOG", "value": "debug"})), "{}", container["env"]);
    assert_eq!(template["spec"]["nodeSelector"], json!({"role": "infra"}));
    assert_eq!(template["spec"]["tolerations"], json!([{"key": "infra", "operator": "Exists"}]));
    assert_eq!(template["metadata"]["annotations"]["team"], "metal");
    assert_eq!(template["metadata"]["annotations"]["ironclaim.dev/do-not-disrupt"], "true", "the chart's own annotations stay");
    assert_eq!(template["metadata"]["labels"]["tier"], "control");
    assert_eq!(the(&objects, "Service")["spec"]["ports"][0]["port"], 9090);

    // The flags the controller has, read from its argument struct; the
    // chart sets the namespace and identity through the env of the pod, and
    // runs in-cluster, so the kubeconfig flags do not apply.
    let source = std::fs::read_to_string(repo().join("crates/cli/src/controller.rs")).unwrap();
    let body = &source[source.find("pub struct Args {").expect("the controller's Args")..];
    let body = &body[..body.find("\n}").unwrap()];
    let by_env = ["controller-namespace", "identity"];
    let mut flags = 0;
    for field in body.lines().map(str::trim).filter_map(|l| l.strip_suffix(',')).filter_map(|l| l.split_once(':')).map(|(name, _)| name.trim()) {
        if field == "cluster" {
            continue;
        }
        let flag = field.replace('_', "-");
        flags += 1;
        if by_env.contains(&flag.as_str()) {
            let env = container["env"].as_array().unwrap();
            let var = if flag == "identity" { "POD_NAME" } else { "POD_NAMESPACE" };
            assert!(env.iter().any(|e| e["name"] == var), "--{flag} comes from {var}, which the chart does not set");
            continue;
        }
        assert!(
            args.iter().any(|a| *a == format!("--{flag}") || a.starts_with(&format!("--{flag}="))),
            "--{flag} of `ironclaim controller` is no chart value"
        );
    }
    assert!(flags >= 14, "read {flags} flags from crates/cli/src/controller.rs");
}

#[test]
fn the_chart_reaches_bmc_secrets_in_the_namespaces_it_is_given() {
    let objects = render(&["--set", "bmcSecretNamespaces={racks-a,racks-b}"]);
    let roles: BTreeSet<String> = objects
        .iter()
        .filter(|o| o["kind"] == "RoleBinding" && o["metadata"]["name"] == "ironclaim-bmc-credentials")
        .map(|o| o["metadata"]["namespace"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(roles, ["ironclaim-system", "racks-a", "racks-b"].map(String::from).into());
}

/// `helm install` into the real control plane, then the controller run out
/// of cluster with a token of the chart's ServiceAccount (not the admin's
/// credentials): it takes the Lease, writes a Server's power state and
/// serves ironclaim_leader 1 on /metrics. `helm uninstall` removes it all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_installed_chart_runs_the_controller_under_its_own_service_account() {
    let (env, admin) = setup().await;
    let chart = chart();
    // A release left by a run that failed half-way.
    let _ = env.helm(["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE]);
    // The BMC Secret of the tests' Servers is in their namespace.
    let installed = env
        .helm([
            "install",
            RELEASE,
            chart.as_str(),
            "--namespace",
            RELEASE_NAMESPACE,
            "--create-namespace",
            "--set",
            &format!("bmcSecretNamespaces={{{NAMESPACE}}}"),
        ])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(installed.contains("STATUS: deployed"), "{installed}");
    assert!(installed.contains("ironclaim doctor"), "the notes say how to check it: {installed}");
    let listed = env
        .kubectl(["-n", RELEASE_NAMESPACE, "get", "deployment,serviceaccount,service,poddisruptionbudget,role,rolebinding", "-o", "name"])
        .expect("list the release");
    for object in [
        "deployment.apps/ironclaim",
        "serviceaccount/ironclaim",
        "service/ironclaim-metrics",
        "poddisruptionbudget.policy/ironclaim",
        "role.rbac.authorization.k8s.io/ironclaim-leader-election",
        "rolebinding.rbac.authorization.k8s.io/ironclaim-bmc-credentials",
    ] {
        assert!(listed.lines().any(|l| l == object), "{object} not installed: {listed}");
    }
    env.kubectl(["get", "clusterrole/ironclaim", "clusterrolebinding/ironclaim"]).expect("the cluster-wide RBAC installed");

    // A kubeconfig holding nothing but a token of the chart's ServiceAccount.
    let token = env.kubectl(["-n", RELEASE_NAMESPACE, "create", "token", "ironclaim", "--duration=10m"]).expect("create token");
    let admin_config = kube::config::Kubeconfig::read_from(env.kubeconfig()).expect("admin kubeconfig");
    let cluster = admin_config.clusters[0].cluster.clone().expect("a cluster");
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testenv", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
        }}],
        "users": [{"name": "ironclaim", "user": {"token": token.trim()}}],
        "contexts": [{"name": "ironclaim", "context": {"cluster": "testenv", "user": "ironclaim", "namespace": RELEASE_NAMESPACE}}],
        "current-context": "ironclaim",
    });
    let path = std::env::temp_dir().join(format!("ironclaim-helm-{}.kubeconfig", std::process::id()));
    std::fs::write(&path, kubeconfig.to_string()).expect("write the kubeconfig");
    let read = kube::config::Kubeconfig::read_from(&path).expect("read the token kubeconfig");
    let _ = std::fs::remove_file(&path);
    let mut config = kube::Config::from_custom_kubeconfig(read, &Default::default()).await.expect("token config");
    config.default_retry = false;
    let client = kube::Client::try_from(config).expect("token client");
    let forbidden = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client.clone(), "kube-system").list(&Default::default()).await;
    assert!(matches!(forbidden, Err(kube::Error::Api(ref s)) if s.code == 403), "the token is not the admin's: {forbidden:?}");
    // `ironclaim controller` checks the CRDs before it starts: the chart's
    // rules must let it read them.
    let preflight = ironclaim_controller::doctor::preflight(&client).await;
    assert!(preflight.is_ok(), "the controller's start-up check fails under the chart's RBAC: {preflight:?}");

    let machine = Machine::new("helm-1", 61, 16, 32);
    let sushy = start_sushy([(machine.uuid.clone(), SystemPower::Off)]);
    apply(&env, &machine.server_json(&sushy));

    let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
    let mut settings = settings("helm-replica");
    settings.claims.lock_namespace = RELEASE_NAMESPACE.into();
    settings.metrics_address = Some(([127, 0, 0, 1], port).into());
    settings.lease = Some(LeaseSettings {
        namespace: RELEASE_NAMESPACE.into(),
        name: "ironclaim-controller".into(),
        identity: "helm-replica".into(),
        duration: Duration::from_secs(10),
        power_budget_watts: None,
        transition_limits: Default::default(),
    });
    let controller = Controller::new(client.clone(), redfish(&client), settings);
    let metrics = controller.metrics();
    let running = run(controller);

    let leases: Api<Lease> = Api::namespaced(admin.clone(), RELEASE_NAMESPACE);
    eventually("the controller holds the Lease", Duration::from_secs(20), || {
        let leases = leases.clone();
        async move {
            let holder = leases.get_opt("ironclaim-controller").await.ok().flatten().and_then(|l| l.spec?.holder_identity);
            if holder.as_deref() == Some("helm-replica") { Ok(()) } else { Err(format!("{holder:?}")) }
        }
    })
    .await;
    let c = admin.clone();
    eventually("the power sweep wrote helm-1's power state", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let status = server(&c, "helm-1").await.status.unwrap_or_default();
            if status.power_state.is_some() { Ok(()) } else { Err(format!("{status:?}")) }
        }
    })
    .await;
    let scraped = eventually("ironclaim_leader 1 on /metrics", Duration::from_secs(10), || async move {
        let body = http_get(port, "/metrics").await?;
        if body.lines().any(|l| l == "ironclaim_leader 1") { Ok(body) } else { Err(body) }
    })
    .await;
    assert!(!metrics.render().contains("ironclaim_errors_total{"), "a step failed under the chart's rules: {scraped}");
    running.stop().await;

    env.helm(["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE]).unwrap_or_else(|e| panic!("{e}"));
    let left = env
        .kubectl([
            "-n",
            RELEASE_NAMESPACE,
            "get",
            "deployment,serviceaccount,service,poddisruptionbudget,role,rolebinding",
            "-l",
            &format!("app.kubernetes.io/instance={RELEASE}"),
            "-o",
            "name",
        ])
        .expect("list");
    assert_eq!(left.trim(), "", "helm uninstall left objects behind");
    let cluster_role = env.kubectl(["get", "clusterrole", "ironclaim", "--ignore-not-found", "-o", "name"]).expect("get clusterrole");
    assert_eq!(cluster_role.trim(), "");
}
