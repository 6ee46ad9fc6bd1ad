//! The API server's verdict on the CRDs: it accepts them as `ironclaim crds`
//! prints them, stores the worked example's inventory, enforces every
//! validation rule with its message, and keeps status behind the status
//! subresource. Runs on the real control plane of `hack/testenv`; fails
//! (never skips) when its binaries are not built.

use ironclaim_k8s::api::{self, Server, ServerClaim, ServerPool, crds_yaml};
use ironclaim_testenv::TestEnv;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Client, Resource};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

const MANAGER: &str = "ironclaim-k8s-tests";

fn env() -> TestEnv {
    TestEnv::shared().unwrap_or_else(|error| panic!("{error}"))
}

/// Applies the CRDs once per test process and waits until they are served.
async fn installed(env: &TestEnv) -> Client {
    static INSTALLED: OnceCell<()> = OnceCell::const_new();
    INSTALLED
        .get_or_init(|| async {
            let yaml = crds_yaml().expect("CRDs serialize");
            env.kubectl_with_stdin(["apply", "--server-side", "--field-manager", MANAGER, "-f", "-"], &yaml)
                .unwrap_or_else(|e| panic!("the API server refuses the CRDs: {e}"));
            for plural in ["servers", "serverpools", "serverclaims"] {
                let crd = format!("crd/{plural}.{}", api::GROUP);
                env.kubectl(["wait", "--for=condition=Established", "--timeout=90s", crd.as_str()])
                    .unwrap_or_else(|e| panic!("{crd} not established: {e}"));
            }
        })
        .await;
    env.client().await.unwrap_or_else(|error| panic!("{error}"))
}

fn unique(base: &str) -> String {
    format!("{base}-{}", std::process::id())
}

fn dynamic<K: Resource<DynamicType = ()>>(client: &Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &ApiResource::erase::<K>(&()))
}

async fn apply(api: &Api<DynamicObject>, object: Value) -> Result<DynamicObject, kube::Error> {
    let name = object["metadata"]["name"].as_str().expect("a name").to_string();
    let object: DynamicObject = serde_json::from_value(object).expect("an object");
    // The discovery cache of a fresh CRD can lag its Established condition
    // by a moment: retry a 404 briefly, never anything else.
    let mut tries = 0;
    loop {
        match api.patch(&name, &PatchParams::apply(MANAGER).force(), &Patch::Apply(&object)).await {
            Err(kube::Error::Api(status)) if status.code == 404 && tries < 50 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            other => return other,
        }
    }
}

fn server(name: &str, spec_changes: Value) -> Value {
    let mut spec = json!({
        "bmc": {
            "address": "redfish+https://10.0.1.10/redfish/v1/Systems/1",
            "credentialsSecretRef": {"name": "bmc", "namespace": "ironclaim-system"},
        },
        "hardware": {"cpu": 32, "memory": "120Gi"},
    });
    merge(&mut spec, spec_changes);
    json!({"apiVersion": api::API_VERSION, "kind": "Server", "metadata": {"name": name}, "spec": spec})
}

fn serverpool(name: &str, spec: Value) -> Value {
    json!({"apiVersion": api::API_VERSION, "kind": "ServerPool", "metadata": {"name": name}, "spec": spec})
}

fn serverclaim(name: &str, server: &str, pool: &str) -> Value {
    json!({"apiVersion": api::API_VERSION, "kind": "ServerClaim", "metadata": {"name": name}, "spec": {"server": server, "pool": pool}})
}

fn merge(into: &mut Value, changes: Value) {
    match (into, changes) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (slot, v) => *slot = v,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worked_example_inventory_is_accepted_and_listed_with_its_columns() {
    let env = env();
    installed(&env).await;
    let example = include_str!("../../../examples/worked-example.yaml");
    let ironclaim_docs: Vec<&str> = example.split("\n---\n").filter(|d| d.contains("apiVersion: ironclaim.dev/")).collect();
    assert_eq!(ironclaim_docs.len(), 7, "two pools and five servers");
    // Distinct names, so the test also passes against a reused environment.
    let suffix = format!("-{}", std::process::id());
    let renamed: Vec<String> = ironclaim_docs
        .iter()
        .map(|d| {
            let mut d = d.to_string();
            for name in ["general", "gpu", "r1-u10", "r1-u11", "r1-u12", "r2-u20", "r2-u21"] {
                d = d.replace(&format!("  name: {name}\n"), &format!("  name: {name}{suffix}\n"));
            }
            d
        })
        .collect();
    env.kubectl_with_stdin(["apply", "-f", "-"], &renamed.join("\n---\n"))
        .unwrap_or_else(|e| panic!("the worked example's inventory is refused: {e}"));

    let table = env.kubectl(["get", "servers", &format!("r2-u20{suffix}")]).expect("kubectl get servers");
    let header: Vec<&str> = table.lines().next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(header, ["NAME", "POWER", "CLAIM", "NODE", "CPU", "MEMORY", "MAINTENANCE", "AGE"], "{table}");
    assert!(table.contains("500Gi"), "{table}");
    let pools = env.kubectl(["get", "serverpools", &format!("gpu{suffix}")]).expect("kubectl get serverpools");
    assert!(pools.lines().next().unwrap_or_default().split_whitespace().eq(["NAME", "WEIGHT", "SERVERS", "CPU", "WATTS", "AGE"]), "{pools}");

    // What the API server stored reads back into the typed API and converts.
    let client = env.client().await.expect("client");
    let stored = Api::<Server>::all(client.clone()).get(&format!("r2-u20{suffix}")).await.expect("stored");
    let core = ironclaim_k8s::server_to_core(&stored).expect("converts");
    assert_eq!(core.capacity.gpus(), 4);
    assert!(stored.status.is_none(), "status is not written through the main resource");
    let pool = Api::<ServerPool>::all(client).get(&format!("gpu{suffix}")).await.expect("stored");
    assert_eq!(ironclaim_k8s::serverpool_to_core(&pool).expect("converts").limits.gpus, Some(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_objects_are_refused_with_the_rule_that_says_why() {
    let env = env();
    let client = installed(&env).await;
    let servers = dynamic::<Server>(&client);
    let pools = dynamic::<ServerPool>(&client);
    let n = |base: &str| unique(base);
    let cases: Vec<(&Api<DynamicObject>, Value, &str)> = vec![
        (
            &servers,
            server(&n("s-tls"), json!({"bmc": {"caBundle": "-----BEGIN CERTIFICATE-----", "insecureSkipVerify": true}})),
            "caBundle and insecureSkipVerify are mutually exclusive",
        ),
        (&servers, server(&n("s-cpu"), json!({"hardware": {"cpu": "-4"}})), "spec.hardware.cpu"),
        (&servers, server(&n("s-mem"), json!({"hardware": {"memory": "lots"}})), "spec.hardware.memory"),
        (&servers, server(&n("s-gpu"), json!({"hardware": {"gpus": [{"model": "A100", "count": 0}]}})), "spec.hardware.gpus[0].count"),
        (&servers, server(&n("s-model"), json!({"hardware": {"gpus": [{"model": "A100 80GB", "count": 1}]}})), "spec.hardware.gpus[0].model"),
        (&servers, server(&n("s-bmc"), json!({"bmc": {"address": "ftp://10.0.0.1"}})), "spec.bmc.address"),
        (&servers, server(&n("s-watts"), json!({"power": {"idleWatts": 500, "peakWatts": 100}})), "peakWatts must be at least idleWatts"),
        (
            &servers,
            server(&n("s-gpu-watts"), json!({"power": {"idleWatts": 300, "peakWatts": 1000, "gpuWatts": 800}})),
            "gpuWatts must be at most peakWatts - idleWatts",
        ),
        (&servers, server(&n("s-dur"), json!({"stageDurations": {"boot": "ten minutes"}})), "spec.stageDurations.boot"),
        (&pools, serverpool(&n("p-in"), json!({"requirements": [{"key": "zone", "operator": "In"}]})), "In and NotIn need at least one value"),
        (
            &pools,
            serverpool(&n("p-exists"), json!({"requirements": [{"key": "gpu", "operator": "Exists", "values": ["x"]}]})),
            "Exists and DoesNotExist take no values",
        ),
        (
            &pools,
            serverpool(&n("p-gt"), json!({"requirements": [{"key": "cores", "operator": "Gt", "values": ["many"]}]})),
            "Gt and Lt take exactly one integer value",
        ),
        (&pools, serverpool(&n("p-op"), json!({"requirements": [{"key": "zone", "operator": "Near"}]})), "spec.requirements[0].operator"),
        (&pools, serverpool(&n("p-gpus"), json!({"limits": {"gpus": -1}})), "spec.limits.gpus"),
        (&pools, serverpool(&n("p-mem"), json!({"limits": {"memory": "-1Gi"}})), "spec.limits.memory"),
        (&pools, serverpool(&n("p-weight"), json!({"weight": 101})), "spec.weight"),
        (&pools, serverpool(&n("p-deadline"), json!({"defaultDeadline": "soon"})), "spec.defaultDeadline"),
        (
            &pools,
            serverpool(&n("p-warm"), json!({"warmSpares": {"floor": [{"class": "general-32", "count": 1}], "schedule": "0 8 * * 1-5"}})),
            "schedule and duration go together",
        ),
        (&pools, serverpool(&n("p-budget"), json!({"disruption": {"budgets": [{"nodes": "150%"}]}})), "spec.disruption.budgets[0].nodes"),
        (
            &pools,
            serverpool(&n("p-taint"), json!({"template": {"taints": [{"key": "gpu", "effect": "Sometimes"}]}})),
            "spec.template.taints[0].effect",
        ),
    ];
    let mut failures = Vec::new();
    for (api, object, want) in cases {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_string();
        match apply(api, object).await {
            Err(kube::Error::Api(status)) if status.code == 422 && status.message.contains(want) => {}
            Err(kube::Error::Api(status)) => failures.push(format!("{name}: want 422 with {want:?}, got {}: {}", status.code, status.message)),
            Err(other) => failures.push(format!("{name}: {other}")),
            Ok(_) => failures.push(format!("{name}: accepted, want refused with {want:?}")),
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");

    // And the same shapes, valid, are stored.
    apply(&servers, server(&n("s-ok"), json!({"bmc": {"caBundle": "-----BEGIN CERTIFICATE-----"}, "power": {"idleWatts": 100, "peakWatts": 100}})))
        .await
        .expect("a valid server");
    apply(
        &pools,
        serverpool(
            &n("p-ok"),
            json!({
                "weight": 100,
                "requirements": [
                    {"key": "zone", "operator": "NotIn", "values": ["c"]},
                    {"key": "gpu", "operator": "DoesNotExist"},
                    {"key": "cores", "operator": "Lt", "values": ["-1"]},
                ],
                "limits": {"cpu": 0, "memory": "0", "gpus": 0, "servers": 0, "watts": 0},
                "defaultDeadline": "1h30m",
                "warmSpares": {"floor": [{"class": "general-32", "count": 1}], "schedule": "@daily", "duration": "8h"},
                "disruption": {"consolidateAfter": "Never", "budgets": [{"nodes": "10%", "reasons": ["Empty"]}, {"nodes": "0", "schedule": "0 9 * * 1-5", "duration": "8h"}], "drainTimeout": "15m"},
                "readiness": {"extendedResources": ["nvidia.com/gpu"], "nodeConditions": ["GpuHealthy"]},
            }),
        ),
    )
    .await
    .expect("a valid pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_goes_through_the_status_subresource_and_claims_keep_their_server() {
    let env = env();
    let client = installed(&env).await;
    let servers = dynamic::<Server>(&client);
    let name = unique("s-status");
    apply(&servers, server(&name, json!({}))).await.expect("created");
    let status = json!({"status": {
        "powerState": "On",
        "failures": 1,
        "measuredDurations": {"boot": {"p50Seconds": 300, "p90Seconds": 450, "samples": 12}},
        "conditions": [{"type": "Reachable", "status": "True", "reason": "BmcAnswered", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}],
    }});
    servers.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("status written");
    let typed = Api::<Server>::all(client.clone()).get(&name).await.expect("read back");
    let core = ironclaim_k8s::server_to_core(&typed).expect("converts");
    assert!(core.is_warm());
    assert_eq!((core.failures, core.durations.boot_s, core.durations.tail_percent), (1, 300, 150));

    let bad_status = json!({"status": {"measuredDurations": {"boot": {"p50Seconds": 300, "p90Seconds": 100, "samples": 1}}}});
    match servers.patch_status(&name, &PatchParams::default(), &Patch::Merge(&bad_status)).await {
        Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains("p90Seconds must be at least p50Seconds"), "{s:?}"),
        other => panic!("an inverted percentile was stored: {other:?}"),
    }

    let claims = dynamic::<ServerClaim>(&client);
    let claim = unique("c-immutable");
    apply(&claims, serverclaim(&claim, "r1-u10", "general")).await.expect("created");
    for (changed, want) in
        [(serverclaim(&claim, "r1-u11", "general"), "server is immutable"), (serverclaim(&claim, "r1-u10", "gpu"), "pool is immutable")]
    {
        match apply(&claims, changed).await {
            Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains(want), "{s:?}"),
            other => panic!("want {want:?}, got {other:?}"),
        }
    }
    let orphan_message = json!({"status": {"failureMessage": "no reason"}});
    match claims.patch_status(&claim, &PatchParams::default(), &Patch::Merge(&orphan_message)).await {
        Err(kube::Error::Api(s)) => assert!(s.code == 422 && s.message.contains("failureMessage needs a failureReason"), "{s:?}"),
        other => panic!("a failure message without a reason was stored: {other:?}"),
    }
    let timeline = json!({"status": {
        "stage": "Booting",
        "stages": [
            {"stage": "Selected", "startTime": "2026-01-01T00:00:00Z", "durationSeconds": 1, "outcome": "Succeeded"},
            {"stage": "PoweringOn", "startTime": "2026-01-01T00:00:01Z", "durationSeconds": 44, "outcome": "Succeeded"},
            {"stage": "Booting", "startTime": "2026-01-01T00:00:45Z", "outcome": "InProgress"},
        ],
    }});
    claims.patch_status(&claim, &PatchParams::default(), &Patch::Merge(&timeline)).await.expect("timeline written");
    let typed = Api::<ServerClaim>::all(client).get(&claim).await.expect("read back");
    let in_flight = ironclaim_k8s::serverclaim_in_flight(&typed).expect("converts").expect("in flight");
    assert_eq!(in_flight.stage, ironclaim_core::model::Stage::Booting);
    assert_eq!(in_flight.stage_started_s, 1_767_225_645);
}

/// Issue "The first hour", item 2: the same files, fed to `ironclaim plan`'s
/// loader and to the API server (`kubectl create --dry-run=server
/// --validate=strict`: server-side strict field validation, nothing
/// stored), are refused by both, each naming the same field; a good file is
/// accepted by both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_loader_and_the_api_server_refuse_the_same_files() {
    let env = env();
    installed(&env).await;
    let server = "apiVersion: ironclaim.dev/v1alpha1
kind: Server
metadata: {name: diff-r1}
spec:
  bmc:
    address: https://10.0.1.10
    credentialsSecretRef: {name: bmc, namespace: ironclaim-system}
  hardware: {cpu: 32, memory: 128Gi}
";
    let pool = "apiVersion: ironclaim.dev/v1alpha1
kind: ServerPool
metadata: {name: diff-general}
spec:
  weight: 10
  requirements: [{key: zone, operator: In, values: [a]}]
  template: {labels: {pool: general}}
";
    let claim = "apiVersion: ironclaim.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: diff-c1}\nspec: {server: diff-r1, pool: diff-general}\n";
    let pod = "apiVersion: v1
kind: Pod
metadata: {name: diff-p, namespace: default, labels: {app: diff}}
spec:
  automountServiceAccountToken: false
  containers:
  - name: c
    image: registry.example/app:1
    resources: {requests: {cpu: 100m}}
";
    let deployment = "apiVersion: apps/v1
kind: Deployment
metadata: {name: diff-web, namespace: default}
spec:
  replicas: 2
  selector: {matchLabels: {app: diff}}
  template:
    metadata: {labels: {app: diff}}
    spec:
      containers:
      - name: web
        image: registry.example/web:1
        resources: {requests: {cpu: 500m}}
";
    let node = "apiVersion: v1\nkind: Node\nmetadata: {name: diff-n1}\nstatus: {allocatable: {cpu: '8', memory: 32Gi, pods: '110'}}\n";
    let bmc = "  bmc:\n    address: https://10.0.1.10\n    credentialsSecretRef: {name: bmc, namespace: ironclaim-system}\n";

    // Each bad file, and the field both must name.
    let bad: Vec<(&str, String, &str)> = vec![
        ("maintainance", format!("{server}  maintainance: true\n"), "spec.maintainance"),
        ("root-field", format!("{server}resource: {{cpu: 1}}\n"), "resource"),
        ("server-metadata", server.replace("{name: diff-r1}", "{name: diff-r1, lables: {zone: a}}"), "metadata.lables"),
        (
            "gpu-field",
            server.replace("memory: 128Gi}", "memory: 128Gi, gpus: [{model: A100, count: 1, memory: 80Gi}]}"),
            "spec.hardware.gpus[0].memory",
        ),
        ("no-bmc", server.replace(bmc, ""), "bmc is required unless provider.type is Metal3, External or ClusterAPI"),
        ("ftp", server.replace("https://", "ftp://"), "spec.bmc.address"),
        ("watts", format!("{server}  power: {{idleWatts: 500, peakWatts: 300}}\n"), "peakWatts must be at least idleWatts"),
        ("pool-selecter", pool.replace("template: {labels", "template: {nodeSelecter: {a: b}, labels"), "spec.template.nodeSelecter"),
        ("pool-value", pool.replace("values: [a]", "value: [a]"), "spec.requirements[0].value"),
        ("pool-weight", pool.replace("weight: 10", "weight: 101"), "spec.weight"),
        ("claim-field", claim.replace("pool: diff-general}", "pool: diff-general, node: n1}"), "spec.node"),
        ("pod-selecter", pod.replace("  containers:", "  nodeSelecter: {zone: a}\n  containers:"), "spec.nodeSelecter"),
        ("pod-resource", pod.replace("    resources:", "    resource:"), "spec.containers[0].resource"),
        ("pod-labels", pod.replace("labels: {app: diff}}", "lables: {app: diff}}"), "metadata.lables"),
        ("deployment-resource", deployment.replace("        resources:", "        resource:"), "spec.template.spec.containers[0].resource"),
        ("deployment-replica", deployment.replace("  replicas: 2", "  replica: 2"), "spec.replica"),
        ("node-status", node.replace("allocatable", "allocatible"), "status.allocatible"),
        // The bad document second in a file: both refuse the file.
        ("second-document", format!("{server}---\n{}", pod.replace("    resources:", "    resource:")), "spec.containers[0].resource"),
    ];
    let dry_run = |text: &str| env.kubectl_with_stdin(["create", "--dry-run=server", "--validate=strict", "-f", "-"], text);
    let started = std::time::Instant::now();
    // kubectl runs are independent: all at once, to keep this test quick.
    let verdicts: Vec<_> = std::thread::scope(|scope| {
        let runs: Vec<_> = bad.iter().map(|(_, text, _)| scope.spawn(|| dry_run(text))).collect();
        runs.into_iter().map(|run| run.join().expect("kubectl thread")).collect()
    });
    let mut disagreements = Vec::new();
    for ((name, text, field), api) in bad.iter().zip(&verdicts) {
        let file = format!("{name}.yaml");
        let loader = ironclaim_k8s::load_str(&file, text);
        match (&loader, api) {
            (Err(l), Err(ironclaim_testenv::Error::KubectlFailed { stderr, .. })) => {
                let l = l.to_string();
                if !(l.contains(field) && l.starts_with(&file) && stderr.contains(field)) {
                    disagreements.push(format!("{name}: both refuse, not both naming {field:?}:\n  loader: {l}\n  api:    {stderr}"));
                }
            }
            (Err(_), Err(other)) => disagreements.push(format!("{name}: kubectl did not run: {other}")),
            (Ok(_), Err(e)) => disagreements.push(format!("{name}: the loader accepts what the API server refuses: {e}")),
            (Err(e), Ok(out)) => disagreements.push(format!("{name}: the API server accepts ({}) what the loader refuses: {e}", out.trim())),
            (Ok(_), Ok(out)) => disagreements.push(format!("{name}: both accept ({})", out.trim())),
        }
    }

    // The good documents together, and a Metal3 server without a bmc:
    // both accept them.
    let metal3 = format!(
        "{}  provider: {{type: Metal3, metal3: {{namespace: metal3, name: diff-r2}}}}\n  power: {{idleWatts: 300, peakWatts: 300}}\n",
        server.replace(bmc, "").replace("diff-r1", "diff-r2")
    );
    let good = [server, pool, claim, pod, deployment, node, metal3.as_str()].join("---\n");
    if let Err(e) = ironclaim_k8s::load_str("good.yaml", &good) {
        disagreements.push(format!("good: the loader refuses: {e}"));
    }
    // A pod is admitted once its namespace's default ServiceAccount exists,
    // which the controller manager creates a moment after start.
    let mut tries = 0;
    loop {
        match dry_run(&good) {
            Ok(_) => break,
            Err(ironclaim_testenv::Error::KubectlFailed { stderr, .. }) if stderr.contains("serviceaccount") && tries < 50 => {
                tries += 1;
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            Err(e) => {
                disagreements.push(format!("good: the API server refuses: {e}"));
                break;
            }
        }
    }
    eprintln!("{} files through the loader and the API server in {:?}", bad.len() + 1, started.elapsed());
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

/// One resource as discovery serves it: the names kubectl resolves.
struct Served {
    group: String,
    plural: String,
    names: Vec<String>,
    categories: Vec<String>,
}

/// Every top-level resource the API server serves, in every group's
/// preferred version, core included.
async fn served(client: &Client) -> Vec<Served> {
    let mut lists = vec![(String::new(), client.list_core_api_resources("v1").await.expect("core resources"))];
    for group in client.list_api_groups().await.expect("API groups").groups {
        let Some(version) = group.preferred_version.or_else(|| group.versions.first().cloned()) else { continue };
        lists.push((group.name.clone(), client.list_api_group_resources(&version.group_version).await.expect("group resources")));
    }
    let mut all = Vec::new();
    for (group, list) in lists {
        for r in list.resources.into_iter().filter(|r| !r.name.contains('/')) {
            let mut names = vec![r.name.clone()];
            names.extend((!r.singular_name.is_empty()).then(|| r.singular_name.clone()));
            names.extend(r.short_names.unwrap_or_default());
            all.push(Served { group: group.clone(), plural: r.name, names, categories: r.categories.unwrap_or_default() });
        }
    }
    all
}

/// With Karpenter's, Cluster API's and Metal3's real CRDs installed beside ironclaim's
/// (the migration path), every name kubectl resolves (plural, singular,
/// short name, category) means one resource: ironclaim's names and category
/// are nobody else's, and ironclaim's resources join no one else's category.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_coexist_with_karpenter_and_cluster_api() {
    let env = env();
    let client = installed(&env).await;
    let dirs = TestEnv::peer_crd_dirs().unwrap_or_else(|e| panic!("{e}"));
    for dir in &dirs {
        let dir = dir.to_str().expect("a UTF-8 path");
        env.kubectl(["apply", "--server-side", "--field-manager", MANAGER, "-f", dir])
            .unwrap_or_else(|e| panic!("the API server refuses the CRDs in {dir}: {e}"));
        env.kubectl(["wait", "--for=condition=Established", "--timeout=90s", "-f", dir])
            .unwrap_or_else(|e| panic!("the CRDs in {dir} are not established: {e}"));
    }

    let all = served(&client).await;
    for peer in ["karpenter.sh", "cluster.x-k8s.io", "metal3.io"] {
        assert!(all.iter().any(|s| s.group == peer), "{peer} is not served: the peers' CRDs did not install");
    }
    let (ours, theirs): (Vec<&Served>, Vec<&Served>) = all.iter().partition(|s| s.group == api::GROUP);
    assert_eq!(ours.len(), 3, "ironclaim serves {:?}", ours.iter().map(|s| &s.plural).collect::<Vec<_>>());
    let mut clashes = Vec::new();
    for mine in &ours {
        for name in &mine.names {
            for other in theirs.iter().filter(|o| o.names.contains(name)) {
                clashes.push(format!("`kubectl get {name}`: {}.{} and {}.{}", mine.plural, api::GROUP, other.plural, other.group));
            }
        }
        for category in &mine.categories {
            if let Some(other) = theirs.iter().find(|o| o.categories.contains(category)) {
                clashes.push(format!("category {category}: {}.{} and {}.{}", mine.plural, api::GROUP, other.plural, other.group));
            }
        }
    }
    assert!(clashes.is_empty(), "names that mean two resources:\n{}", clashes.join("\n"));

    // kubectl itself agrees: each of ironclaim's names explains ironclaim's
    // resource, and Karpenter's plurals still explain Karpenter's.
    let group_of = |name: &str| {
        let text = env.kubectl(["explain", name]).unwrap_or_else(|e| panic!("kubectl explain {name}: {e}"));
        text.lines().find_map(|l| l.strip_prefix("GROUP:").map(|g| g.trim().to_owned())).unwrap_or_default()
    };
    for name in ours.iter().flat_map(|s| &s.names) {
        assert_eq!(group_of(name), api::GROUP, "kubectl resolves `{name}` elsewhere");
    }
    for name in ["nodepools", "nodeclaims"] {
        assert_eq!(group_of(name), "karpenter.sh", "`{name}` no longer means Karpenter's");
    }
}
