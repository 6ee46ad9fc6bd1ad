//! The Metal3 provider end to end: a Server whose `spec.provider` names a
//! BareMetalHost is powered on and off through that host's `spec.online`,
//! on the real control plane and Metal3's own BareMetalHost CRD, with a
//! small stand-in for Metal3's baremetal-operator that follows `spec.online` into `status.poweredOn`
//! after a delay (and plays the machine: a powered-on host registers a
//! kwok Node for its server after a boot delay, a powered-off one loses it).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use ironclaim_controller::provider::{BAREMETALHOST_ANNOTATION, baremetalhost_resource, uses_metal3};
use ironclaim_controller::{Controller, Metal3Power, Power, ProviderRouter};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::serverclaim::Stage;
use ironclaim_testenv::{TestEnv, eventually};
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const HOSTS: &str = "metal3-hosts";

/// Metal3's own BareMetalHost CRD, generated from its API types by
/// `hack/testenv peer-crds`: what the operator writes must pass its schema.
async fn install_baremetalhost_crd(env: &TestEnv) {
    install_peer_crds(env, "metal3-", &["metal3.io_baremetalhosts.yaml"], &["baremetalhosts.metal3.io"]);
    let _ = env.kubectl(["create", "namespace", HOSTS]);
}

fn hosts(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), HOSTS, &baremetalhost_resource())
}

/// Creates a host powered off, with its status as the operator would
/// have written it.
async fn create_host(client: &Client, name: &str, provisioning: &str) {
    let api = hosts(client);
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "metal3.io/v1alpha1", "kind": "BareMetalHost",
        "metadata": {"name": name, "namespace": HOSTS},
        "spec": {"online": false, "bmc": {"address": "redfish://10.0.9.1/redfish/v1/Systems/1", "credentialsName": "bmc"}}
    }))
    .expect("host");
    // The discovery of a fresh CRD can lag its Established condition.
    let mut tries = 0;
    loop {
        match api.create(&PostParams::default(), &object).await {
            Ok(_) => break,
            Err(kube::Error::Api(s)) if s.code == 404 && tries < 50 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err) => panic!("create host {name}: {err}"),
        }
    }
    let status = json!({"status": {
        "poweredOn": false, "operationalStatus": "OK", "errorCount": 0, "errorMessage": "",
        "provisioning": {"state": provisioning, "ID": format!("ironic-{name}")}
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("host status");
}

async fn host(client: &Client, name: &str) -> serde_json::Value {
    serde_json::to_value(hosts(client).get(name).await.expect("host")).expect("json")
}

/// One host the stand-in plays, and the server it becomes.
#[derive(Clone)]
struct Played {
    host: String,
    server: String,
    cpu: u32,
    memory_gi: u32,
}

/// What the stand-in did: `(host, poweredOn written, when)`.
type Transitions = Arc<Mutex<Vec<(String, bool, Instant)>>>;

/// A stand-in for the baremetal-operator and the machines behind it.
struct Operator {
    task: tokio::task::JoinHandle<()>,
    transitions: Transitions,
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Operator {
    fn start(client: Client, played: Vec<Played>, settle: Duration, boot: Duration) -> Operator {
        let transitions: Transitions = Arc::default();
        let log = transitions.clone();
        let task = tokio::spawn(async move {
            let api = hosts(&client);
            let nodes: Api<Node> = Api::all(client.clone());
            // When a host's spec.online first differed from its poweredOn.
            let mut asked: BTreeMap<String, Instant> = BTreeMap::new();
            let mut on_since: BTreeMap<String, Instant> = BTreeMap::new();
            let mut registered: BTreeMap<String, bool> = BTreeMap::new();
            loop {
                let list = api.list(&ListParams::default()).await.map(|l| l.items).unwrap_or_default();
                for h in list {
                    let name = h.metadata.name.clone().unwrap_or_default();
                    let online = h.data["spec"]["online"].as_bool().unwrap_or(false);
                    let powered = h.data["status"]["poweredOn"].as_bool();
                    if powered != Some(online) {
                        let since = *asked.entry(name.clone()).or_insert_with(Instant::now);
                        if since.elapsed() >= settle {
                            let patch = json!({"status": {"poweredOn": online}});
                            if api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.is_ok() {
                                asked.remove(&name);
                                log.lock().unwrap_or_else(|p| p.into_inner()).push((name.clone(), online, Instant::now()));
                            }
                        }
                    } else {
                        asked.remove(&name);
                    }
                    let Some(p) = played.iter().find(|p| p.host == name) else { continue };
                    match powered {
                        Some(true) => {
                            let since = *on_since.entry(name.clone()).or_insert_with(Instant::now);
                            if since.elapsed() >= boot && !registered.get(&name).copied().unwrap_or(false) {
                                let mut node = existing_node(&p.server, p.cpu, p.memory_gi, &[], 0, &[]);
                                node["metadata"]["labels"]["ironclaim.dev/server"] = json!(p.server);
                                node["spec"]["providerID"] = json!(format!("ironclaim://{}", p.server));
                                let node: Node = serde_json::from_value(node).expect("node");
                                if matches!(nodes.create(&PostParams::default(), &node).await, Ok(_) | Err(kube::Error::Api(_))) {
                                    registered.insert(name.clone(), true);
                                }
                            }
                        }
                        _ => {
                            on_since.remove(&name);
                            if registered.remove(&name).is_some() {
                                let _ = nodes.delete(&p.server, &DeleteParams::default()).await;
                            }
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
        Operator { task, transitions }
    }

    fn transitions(&self, host: &str) -> Vec<(bool, Instant)> {
        self.transitions.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|t| t.0 == host).map(|t| (t.1, t.2)).collect()
    }
}

fn metal3_server(name: &str, host: &str, cpu: u32, memory_gi: u32, pool: &str) -> serde_json::Value {
    json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name},
        "spec": {
            "provider": {"type": "Metal3", "metal3": {"namespace": HOSTS, "name": host}},
            "hardware": {"cpu": cpu.to_string(), "memory": format!("{memory_gi}Gi")},
            "labels": {"e2e.ironclaim.dev/pool": pool, "ironclaim.dev/class": "metal3"},
            // Break-even: 50 W x 15 s / 150 W = 5 s idle before powering off.
            "power": {"idleWatts": 150, "peakWatts": 400, "bootWatts": 50, "offWatts": 0},
            "stageDurations": {"powerOn": "12s", "boot": "3s", "join": "2s", "ready": "3s", "tailPercent": 150}
        }
    })
}

fn router(client: &Client) -> Arc<ProviderRouter> {
    Arc::new(ProviderRouter {
        redfish: redfish(client),
        metal3: Arc::new(Metal3Power::new(client.clone(), Duration::from_secs(20)).with_poll(Duration::from_millis(200))),
        external: Arc::new(ironclaim_controller::ExternalPower::none()),
        cluster_api: Arc::new(ironclaim_controller::ClusterApiPower::new(client.clone(), Duration::from_secs(20))),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_pod_powers_a_baremetalhost_on_through_spec_online_and_idle_power_off_sets_it_false() {
    let (env, client) = setup().await;
    install_baremetalhost_crd(&env).await;
    create_host(&client, "worker-1", "provisioned").await;
    let played = vec![Played { host: "worker-1".into(), server: "m3-1".into(), cpu: 16, memory_gi: 32 }];
    apply(&env, &metal3_server("m3-1", "worker-1", 16, 32, "m3"));
    apply(&env, &labelled_pool("m3"));
    let operator = Operator::start(client.clone(), played, Duration::from_secs(1), Duration::from_secs(1));
    let controller = Controller::new(client.clone(), router(&client), settings("metal3"));
    let metrics = controller.metrics();
    let running = run(controller);

    let created = Instant::now();
    apply(&env, &pod("m3-app", "8", "8Gi", &[], 0));
    let c = client.clone();
    eventually("the pod bound to the Metal3 server", Duration::from_secs(45), || {
        let c = c.clone();
        async move { bound(&c, "m3-app").await }
    })
    .await;
    let bound_after = created.elapsed();
    assert_eq!(pod_node(&client, "m3-app").await.as_deref(), Some("m3-1"));

    // Powered on through the host: spec.online set, and the operator
    // followed it exactly once.
    let h = host(&client, "worker-1").await;
    assert_eq!(h["spec"]["online"], json!(true), "{h}");
    assert_eq!(h["status"]["poweredOn"], json!(true), "{h}");
    let on = operator.transitions("worker-1");
    assert_eq!(on.iter().map(|t| t.0).collect::<Vec<_>>(), [true], "one power-on");

    // The claim walked every stage to Serving.
    let status = served_claim(&client, "m3-1").await;
    // PoweringOn lasted at least the operator's delay: the claim waited for
    // status.poweredOn, not for the patch.
    let powering_on = status.stages.iter().find(|r| r.stage == Stage::PoweringOn).unwrap();
    assert!(powering_on.duration_seconds.unwrap_or(0) >= 1, "{powering_on:?}");
    let events = pod_events(&client, "m3-app").await;
    assert!(events.iter().any(|e| e.starts_with("ServerClaimed: claimed server m3-1 (cold)")), "{events:?}");
    let c = client.clone();
    eventually("the sweep reads the host's power", Duration::from_secs(10), || {
        let c = c.clone();
        async move {
            let s = server(&c, "m3-1").await.status.unwrap_or_default();
            if s.power_state == Some(PowerState::On) { Ok(()) } else { Err(format!("{s:?}")) }
        }
    })
    .await;

    // The workload leaves: after break-even the idle server is powered
    // off, through the host again.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.delete("m3-app", &DeleteParams::default().grace_period(0)).await.expect("delete pod");
    let emptied = Instant::now();
    let c = client.clone();
    eventually("the host set offline and powered off", Duration::from_secs(60), || {
        let c = c.clone();
        async move {
            let h = host(&c, "worker-1").await;
            if h["spec"]["online"] == json!(false) && h["status"]["poweredOn"] == json!(false) {
                Ok(())
            } else {
                Err(format!("online {} poweredOn {}", h["spec"]["online"], h["status"]["poweredOn"]))
            }
        }
    })
    .await;
    let off_after = emptied.elapsed();
    let c = client.clone();
    eventually("the server reads Off and its node is gone", Duration::from_secs(15), || {
        let c = c.clone();
        async move {
            let s = server(&c, "m3-1").await.status.unwrap_or_default();
            let node = Api::<Node>::all(c.clone()).get_opt("m3-1").await.ok().flatten();
            if s.power_state == Some(PowerState::Off) && node.is_none() { Ok(()) } else { Err(format!("{s:?}, node {}", node.is_some())) }
        }
    })
    .await;
    let all = operator.transitions("worker-1");
    assert_eq!(all.iter().map(|t| t.0).collect::<Vec<_>>(), [true, false], "one power-on, one power-off");
    let text = metrics.render();
    assert!(!text.contains("ironclaim_power_failures_total{"), "{text}");
    println!("metal3: pod bound {bound_after:?} after creation; host powered off {off_after:?} after the pod left");
    running.stop().await;
}

/// The admin's kubeconfig impersonating the controller's ServiceAccount,
/// after applying deploy/rbac.yaml.
async fn service_account_client(env: &TestEnv) -> Client {
    let rbac = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/rbac.yaml")).expect("rbac");
    env.kubectl_with_stdin(["apply", "-f", "-"], &rbac).expect("apply deploy/rbac.yaml");
    let kubeconfig = kube::config::Kubeconfig::read_from(env.kubeconfig()).expect("kubeconfig");
    let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.expect("config");
    config.auth_info.impersonate = Some("system:serviceaccount:ironclaim-system:ironclaim".into());
    config.auth_info.impersonate_groups =
        Some(vec!["system:serviceaccounts".into(), "system:serviceaccounts:ironclaim-system".into(), "system:authenticated".into()]);
    config.default_retry = false;
    Client::try_from(config).expect("client")
}

fn in_memory_server(value: serde_json::Value) -> Server {
    serde_json::from_value(value).expect("server")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metal3_provider_refuses_unprovisioned_hosts_reads_transitions_and_the_schema_types_the_provider() {
    let (env, client) = setup().await;
    install_baremetalhost_crd(&env).await;
    create_host(&client, "inspecting-1", "inspecting").await;
    create_host(&client, "legacy-1", "externally provisioned").await;
    let power = router(&client);

    // Not provisioned: refused, spec.online untouched.
    let server = in_memory_server(metal3_server("m3-unprovisioned", "inspecting-1", 8, 16, "none"));
    let err = power.power_on(&server).await.expect_err("an unprovisioned host is not powered on");
    assert_eq!(err.label, "host_not_provisioned", "{err}");
    assert!(err.message.contains("provisioning state \"inspecting\""), "{err}");
    assert_eq!(host(&client, "inspecting-1").await["spec"]["online"], json!(false));

    // A host still powering off (poweredOn, but spec.online false) is
    // asked back on: poweredOn alone is not the state asked for.
    create_host(&client, "draining-1", "provisioned").await;
    let on = json!({"status": {"poweredOn": true}});
    hosts(&client).patch_status("draining-1", &PatchParams::default(), &Patch::Merge(&on)).await.expect("status");
    // As the controller's ServiceAccount, with exactly deploy/rbac.yaml.
    let sa = router(&service_account_client(&env).await);
    let draining = in_memory_server(metal3_server("m3-draining", "draining-1", 8, 16, "none"));
    assert_eq!(sa.power_state(&draining).await.expect("state"), PowerState::PoweringOff);
    sa.power_on(&draining).await.expect("power on");
    assert_eq!(host(&client, "draining-1").await["spec"]["online"], json!(true));
    assert_eq!(sa.power_state(&draining).await.expect("state"), PowerState::On);

    // A missing host is typed as such.
    let missing = in_memory_server(metal3_server("m3-missing", "no-such-host", 8, 16, "none"));
    let err = power.power_state(&missing).await.expect_err("no host");
    assert_eq!(err.label, "host_not_found", "{err}");

    // The deprecated annotation still routes to Metal3 when spec.provider
    // is absent; spec.online asked but not yet followed reads PoweringOn.
    let mut legacy = metal3_server("m3-legacy", "legacy-1", 8, 16, "none");
    legacy["spec"].as_object_mut().unwrap().remove("provider");
    legacy["spec"]["bmc"] = json!({"address": "https://10.0.9.9", "credentialsSecretRef": {"name": "bmc", "namespace": NAMESPACE}});
    legacy["metadata"]["annotations"] = json!({BAREMETALHOST_ANNOTATION: format!("{HOSTS}/legacy-1")});
    let legacy = in_memory_server(legacy);
    assert!(uses_metal3(&legacy));
    assert_eq!(power.power_state(&legacy).await.expect("state"), PowerState::Off);
    let patch = json!({"spec": {"online": true}});
    hosts(&client).patch("legacy-1", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");
    assert_eq!(power.power_state(&legacy).await.expect("state"), PowerState::PoweringOn);
    // An explicit Redfish provider wins over the annotation.
    let mut explicit: serde_json::Value = serde_json::to_value(&legacy).unwrap();
    explicit["spec"]["provider"] = json!({"type": "Redfish"});
    assert!(!uses_metal3(&in_memory_server(explicit)));

    // The API server types spec.provider.
    let refused = [
        (json!({"type": "Metal3"}), "metal3 is required when type is Metal3, and only then"),
        (json!({"type": "Redfish", "metal3": {"namespace": HOSTS, "name": "x"}}), "metal3 is required when type is Metal3, and only then"),
        (json!({"type": "Ipmi"}), "spec.provider.type"),
        (json!({"type": "Metal3", "metal3": {"namespace": "Not_A_Namespace", "name": "x"}}), "spec.provider.metal3.namespace"),
    ];
    for (i, (provider, want)) in refused.into_iter().enumerate() {
        let mut s = metal3_server(&format!("m3-invalid-{i}"), "x", 8, 16, "none");
        s["spec"]["provider"] = provider.clone();
        let err = env.kubectl_with_stdin(["apply", "-f", "-"], &s.to_string()).expect_err(&format!("{provider} accepted"));
        assert!(err.to_string().contains(want), "{provider}: want {want:?}, got {err}");
    }
    let mut no_bmc = metal3_server("m3-no-bmc", "x", 8, 16, "none");
    no_bmc["spec"].as_object_mut().unwrap().remove("provider");
    let err = env.kubectl_with_stdin(["apply", "-f", "-"], &no_bmc.to_string()).expect_err("a Redfish server without bmc");
    assert!(err.to_string().contains("bmc is required unless provider.type is Metal3, External or ClusterAPI"), "{err}");
    // And valid: stored and read back typed (in maintenance, so nothing claims it).
    let mut ok = metal3_server("m3-valid", "x", 8, 16, "none");
    ok["spec"]["maintenance"] = json!(true);
    apply(&env, &ok);
    let stored = Api::<Server>::all(client.clone()).get("m3-valid").await.expect("stored");
    assert_eq!(stored.spec.metal3_host().map(|h| (h.namespace.as_str(), h.name.as_str())), Some((HOSTS, "x")));
    assert!(uses_metal3(&stored));
    let _ = env.kubectl(["delete", "server", "m3-valid", "--wait=false"]);
}
