//! `ironclaim explain pod` and `ironclaim servers` against a real API
//! server (the control plane of `hack/testenv`): the inventory, a ServerPool,
//! ServerClaims and pods in known states, statuses written through the status
//! subresource as the controller writes them, and the built binary run
//! with KUBECONFIG pointing at it. `servers discover --apply` against the
//! redfish crate's mock BMC, over a Server an operator wrote.

// The redfish crate's mock BMC, serving the DMTF mockup.
#[path = "../../redfish/tests/common/mod.rs"]
mod common;

use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ironclaim_controller::index::FailureBackoff;
use ironclaim_controller::timeline;
use ironclaim_core::outcome::Outcome;
use ironclaim_k8s::api::{Server, ServerClaim};
use ironclaim_testenv::{FAKE_NODE_ANNOTATION, TestEnv, eventually};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use common::mock::{MockBmc, SYSTEM_UUID};
use common::{PASSWORD, USERNAME, password_file};
use ironclaim_testenv::TempDir;

const NS: &str = "cli";

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn ironclaim(env: &TestEnv, args: &[&str]) -> Run {
    let started = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(args).env("KUBECONFIG", env.kubeconfig()).output().expect("run ironclaim");
    // Shown with --nocapture: what a user waits for one command.
    println!("ironclaim {}: {:?}", args.join(" "), started.elapsed());
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn json_of(run: &Run) -> Value {
    assert_eq!(run.code, 0, "{}", run.stderr);
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.stdout))
}

fn now_s() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("clock").as_secs()
}

fn at(s: u64) -> Value {
    serde_json::to_value(timeline::time(s)).expect("time")
}

fn apply(env: &TestEnv, value: &Value) {
    env.kubectl_with_stdin(["apply", "-f", "-"], &value.to_string()).unwrap_or_else(|e| panic!("apply {value}: {e}"));
}

fn server(name: &str, cpu: u32, extra: Value) -> Value {
    let mut spec = json!({
        "bmc": {"address": format!("redfish+https://10.0.3.{}/redfish/v1/Systems/1", name.len()), "credentialsSecretRef": {"name": "bmc", "namespace": NS}},
        "hardware": {"cpu": cpu.to_string(), "memory": format!("{}Gi", cpu * 2)},
        "labels": {"ironclaim.dev/class": format!("c{cpu}")},
        "power": {"idleWatts": 150, "peakWatts": 400, "bootWatts": 200, "offWatts": 10},
        "stageDurations": {"powerOn": "20s", "boot": "4m", "join": "30s", "ready": "30s", "tailPercent": 150}
    });
    if let (Some(spec), Value::Object(extra)) = (spec.as_object_mut(), extra) {
        spec.extend(extra);
    }
    json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": name}, "spec": spec})
}

fn pod(name: &str, cpu: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"containers": [{"name": "c", "image": "registry.invalid/app", "resources": {"requests": {"cpu": cpu, "memory": "1Gi"}}}]}
    })
}

fn claim(name: &str, server: &str, pods: &[&str]) -> Value {
    json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim",
        "metadata": {"name": name},
        "spec": {"server": server, "pool": "general", "pods": pods.iter().map(|p| json!({"namespace": NS, "name": p})).collect::<Vec<_>>()}
    })
}

async fn server_status(client: &Client, name: &str, status: Value) {
    Api::<Server>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .unwrap_or_else(|e| panic!("status of server {name}: {e}"));
}

async fn claim_status(client: &Client, name: &str, status: Value) {
    Api::<ServerClaim>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&json!({"status": status})))
        .await
        .unwrap_or_else(|e| panic!("status of claim {name}: {e}"));
}

/// The cluster: six servers in every state `servers` distinguishes, a kwok
/// node one of them became, a claim booting for `waiting`, a failed claim
/// for `retry`, a pod nothing can hold, and a pod the scheduler binds.
async fn setup() -> (TestEnv, Client) {
    let env = TestEnv::shared().expect("test environment");
    let client = env.client().await.expect("client");
    let crds = ironclaim_k8s::api::crds_yaml().expect("crds");
    env.install_crds(&crds, &ironclaim_k8s::api::crd_names()).expect("ironclaim's CRDs");
    let _ = env.kubectl(["create", "namespace", NS]);
    apply(
        &env,
        &json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool", "metadata": {"name": "general"}, "spec": {"requirements": [], "defaultDeadline": "1h"}}),
    );
    apply(&env, &server("s-on", 4, json!({})));
    apply(&env, &server("s-booting", 16, json!({})));
    apply(&env, &server("s-off", 24, json!({})));
    apply(&env, &server("s-quarantined", 16, json!({})));
    apply(&env, &server("s-maint", 16, json!({"maintenance": true})));
    let mut metal3 = server("s-metal3", 8, json!({"provider": {"type": "Metal3", "metal3": {"namespace": "hosts", "name": "worker-9"}}}));
    metal3["spec"].as_object_mut().unwrap().remove("bmc");
    apply(&env, &metal3);
    // The node s-on became: kwok plays its kubelet.
    apply(
        &env,
        &json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": "n-general",
                "labels": {"kubernetes.io/hostname": "n-general", "ironclaim.dev/server": "s-on", "ironclaim.dev/class": "c4"},
                "annotations": {FAKE_NODE_ANNOTATION.0: FAKE_NODE_ANNOTATION.1}
            },
            "status": {"capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"}, "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"}}
        }),
    );
    apply(&env, &pod("bound", "1"));
    apply(&env, &pod("waiting", "8"));
    // Too big for s-booting: it needs a claim of its own, on s-off.
    apply(&env, &pod("retry", "20"));
    apply(&env, &pod("huge", "1000"));
    apply(&env, &claim("c-wait", "s-booting", &["waiting"]));
    apply(&env, &claim("c-failed", "s-quarantined", &["retry"]));

    let now = now_s();
    server_status(&client, "s-on", json!({"powerState": "On", "node": "n-general", "watts": 210})).await;
    server_status(
        &client,
        "s-booting",
        json!({"powerState": "On", "poweredOnByIronclaim": true, "claim": "c-wait", "claimedAt": at(now - 90), "watts": 180}),
    )
    .await;
    server_status(&client, "s-off", json!({"powerState": "Off"})).await;
    server_status(&client, "s-quarantined", json!({"powerState": "Off", "failures": 3, "quarantined": true})).await;
    // A reading from before it was powered off: stale, not shown.
    server_status(&client, "s-maint", json!({"powerState": "Off", "watts": 300})).await;
    server_status(&client, "s-metal3", json!({"powerState": "Off"})).await;
    claim_status(
        &client,
        "c-wait",
        json!({
            "stage": "Booting",
            "stages": [
                {"stage": "Selected", "startTime": at(now - 90), "durationSeconds": 1, "outcome": "Succeeded"},
                {"stage": "PoweringOn", "startTime": at(now - 89), "durationSeconds": 19, "outcome": "Succeeded"},
                {"stage": "Booting", "startTime": at(now - 70), "outcome": "InProgress", "message": "power on confirmed"}
            ]
        }),
    )
    .await;
    claim_status(
        &client,
        "c-failed",
        json!({
            "stage": "Booting",
            "stages": [
                {"stage": "Selected", "startTime": at(now - 900), "durationSeconds": 1, "outcome": "Succeeded"},
                {"stage": "PoweringOn", "startTime": at(now - 899), "durationSeconds": 20, "outcome": "Succeeded"},
                {"stage": "Booting", "startTime": at(now - 879), "durationSeconds": 720, "outcome": "TimedOut", "message": "no node registered"}
            ],
            "failureReason": "RegistrationTimedOut",
            "failureMessage": "no node registered; it usually registers in 4m (stuck after 12m)"
        }),
    )
    .await;
    // s-metal3 is locked by a claim being opened: its lock is in the
    // controller's ledger, its status does not name it yet.
    let _ = env.kubectl(["create", "namespace", "ironclaim-system"]);
    let entry = json!({"holder": "c-opening", "acquired": at(now_s())}).to_string();
    let ledger = json!({"name": "ironclaim-claim-locks", "namespace": "ironclaim-system"});
    apply(&env, &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": ledger, "data": {"s-metal3": entry}}));
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NS);
    eventually("the small pod bound by the scheduler", Duration::from_secs(30), || {
        let pods = pods.clone();
        async move {
            let p = pods.get("bound").await.map_err(|e| e.to_string())?;
            p.spec.and_then(|s| s.node_name).ok_or_else(|| "pending".to_string())
        }
    })
    .await;
    (env, client)
}

/// The core's decision for a pod, computed here as the controller would.
async fn core_decision(client: &Client, pod: &str) -> Outcome {
    let index = ironclaim_controller::cluster::read(client, "ironclaim-system").await.expect("read the cluster");
    let now = now_s();
    let (snapshot, _) = index.snapshot(now, FailureBackoff { base_s: 60, max_s: 3600 });
    let plan = ironclaim_core::provision(&snapshot, now);
    plan.decision(&format!("{NS}/{pod}")).map(|d| d.outcome.clone()).expect("a decision")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_and_servers_read_the_cluster() {
    let (env, client) = setup().await;

    // A pod waiting for a claim in flight: the claim, its server, its
    // stage, the timeline, and when it should be ready.
    let run = ironclaim(&env, &["explain", "pod", "cli/waiting"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    let first = out.lines().next().unwrap_or_default();
    assert!(first.starts_with("waiting for server s-booting: powered on 7"), "{out}");
    assert!(first.ends_with("node not registered yet, usually registers in 4m"), "{out}");
    assert!(out.contains("claim c-wait (pool general):"), "{out}");
    for row in ["selected", "powering on", "booting", "InProgress", "power on confirmed"] {
        assert!(out.contains(row), "no {row:?} in {out}");
    }
    assert!(out.lines().any(|l| l.starts_with("it waits for claim c-wait on server s-booting: ready in about ")), "{out}");
    // Its deadline, from its claim's ServerPool, and no controller to act.
    assert!(
        out.lines().any(|l| l.starts_with("deadline: 60m after it was created (ServerPool general's defaultDeadline): ") && l.ends_with("m left")),
        "{out}"
    );
    let last = out.lines().last().unwrap_or_default();
    assert!(last.starts_with("no controller is running, as far as can be seen: there is no lease ironclaim-system/ironclaim-controller"), "{out}");
    let json = json_of(&ironclaim(&env, &["explain", "pod", "cli/waiting", "-o", "json"]));
    assert_eq!((json["deadline"]["after_creation_s"].as_u64(), json["deadline"]["pool"].as_str()), (Some(3600), Some("general")), "{json}");
    assert_eq!(json["controller"]["state"], "no_lease", "{json}");
    assert_eq!(json["state"], "waiting");
    assert_eq!(json["claims"][0]["name"], "c-wait");
    assert_eq!(json["claims"][0]["stage"], "booting");
    assert_eq!(json["claims"][0]["stages"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["claims"][0]["stages"][1]["took_s"], 19);
    assert_eq!(json["decision"]["outcome"], "in_flight");
    assert_eq!(json["decision"]["claim"], "c-wait");
    assert_eq!(json["decision"]["server"], "s-booting");
    // The core's ETA: what is left of boot, then join and ready.
    let Outcome::InFlight { eta_s, .. } = core_decision(&client, "waiting").await else { panic!("not in flight") };
    let shown = json["decision"]["eta_s"].as_u64().expect("eta");
    assert!(shown.abs_diff(eta_s) <= 2, "{shown} vs the core's {eta_s}");

    // A pod nothing can hold: the core's exact reason.
    let Outcome::Unschedulable { reason } = core_decision(&client, "huge").await else { panic!("huge is placeable") };
    let reason = reason.to_string();
    assert!(reason.starts_with("no hardware in the inventory matches: 0 of 6 servers"), "{reason}");
    let run = ironclaim(&env, &["explain", "pod", "cli/huge"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.stdout.lines().next(), Some(format!("nothing can be provisioned for it: {reason}").as_str()), "{}", run.stdout);
    let json = json_of(&ironclaim(&env, &["explain", "pod", "cli/huge", "--output", "json"]));
    assert_eq!(json["decision"]["outcome"], "unschedulable");
    assert_eq!(json["decision"]["reason"], reason.as_str());
    assert_eq!(json["decision"]["reason_detail"]["kind"], "no_matching_hardware");

    // A pod whose claim failed: the failure, then the next decision.
    let run = ironclaim(&env, &["explain", "pod", "cli/retry"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stdout.starts_with(
            "claim c-failed on server s-quarantined failed: RegistrationTimedOut: no node registered; it usually registers in 4m (stuck after 12m)"
        ),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("TimedOut"), "{}", run.stdout);
    let json = json_of(&ironclaim(&env, &["explain", "pod", "cli/retry", "-o", "json"]));
    assert_eq!(json["decision"]["outcome"], "new_claim", "{json}");
    assert_eq!(json["decision"]["path"], "cold", "{json}");
    // The only free server it fits.
    assert_eq!(json["decision"]["server"], "s-off", "{json}");
    let Outcome::NewClaim { eta_s, .. } = core_decision(&client, "retry").await else { panic!("no new claim") };
    assert_eq!(json["decision"]["eta_s"], eta_s, "{json}");
    let want = format!("the next decision claims server s-off (cold) for it: ready in about {}", timeline::human(eta_s));
    assert!(run.stdout.lines().any(|l| l == want), "{}", run.stdout);

    // With a controller holding its lease, nothing is said of it.
    let renewed = serde_json::to_value(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(timeline::time(now_s()).0)).expect("time");
    apply(
        &env,
        &json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "ironclaim-controller", "namespace": "ironclaim-system"},
            "spec": {"holderIdentity": "ironclaim-test", "leaseDurationSeconds": 300, "renewTime": renewed}
        }),
    );
    let run = ironclaim(&env, &["explain", "pod", "cli/retry"]);
    assert!(!run.stdout.contains("controller"), "{}", run.stdout);
    let json = json_of(&ironclaim(&env, &["explain", "pod", "cli/retry", "-o", "json"]));
    assert_eq!((json["controller"]["state"].as_str(), json["controller"]["holder"].as_str()), (Some("running"), Some("ironclaim-test")), "{json}");

    // A bound pod.
    let run = ironclaim(&env, &["explain", "pod", "cli/bound"]);
    assert_eq!((run.code, run.stdout.trim_end()), (0, "pod cli/bound is bound to node n-general"), "{}", run.stderr);

    // A missing pod: exit code 1, said plainly.
    let run = ironclaim(&env, &["explain", "pod", "cli/nope"]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.stderr.trim_end(), "error: pod cli/nope not found");
    assert!(run.stdout.is_empty(), "{}", run.stdout);

    // `servers`: power, claim and stage, node, watts, health.
    let run = ironclaim(&env, &["servers"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let out = &run.stdout;
    // SERVER, POWER, CLAIM, STAGE, NODE, WATTS, HEALTH, CPU, MEMORY, GPUS.
    let row = |name: &str| -> Vec<String> {
        let cells = |l: &str| -> Vec<String> {
            let all: Vec<String> = l.split(['│', '┆']).map(|c| c.trim().to_string()).collect();
            all[1..all.len().saturating_sub(1).max(1)].to_vec()
        };
        out.lines().map(cells).find(|c| c.first().is_some_and(|c| c == name)).unwrap_or_else(|| panic!("no row {name}: {out}"))
    };
    assert_eq!(row("s-on"), ["s-on", "on", "", "", "n-general", "210 W", "healthy", "4", "8Gi", ""], "{out}");
    assert_eq!(row("s-booting"), ["s-booting", "on", "c-wait", "booting", "", "180 W", "healthy", "16", "32Gi", ""], "{out}");
    assert_eq!(row("s-metal3")[..7], ["s-metal3", "off", "c-opening", "opening (locked)", "", "-", "healthy"], "{out}");
    assert_eq!(row("s-maint")[..7], ["s-maint", "off", "", "", "", "-", "maintenance"], "{out}");
    assert_eq!(row("s-quarantined")[..7], ["s-quarantined", "off", "", "", "", "-", "quarantined (3 failures)"], "{out}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[lines.len().saturating_sub(2)..],
        [
            "6 servers: 2 on, 4 off; about 430 W: 390 W measured on 2 servers, 40 W for 4 powered off (their offWatts)",
            // (150 idle - 10 off) W x 4; s-on runs a pod, s-booting is claimed.
            "4 servers off, saving 560 W; 0 warm spares on",
        ],
        "{out}"
    );
    let json = json_of(&ironclaim(&env, &["servers", "-o", "json"]));
    let servers = json["servers"].as_array().expect("servers");
    assert_eq!(servers.len(), 6);
    let by_name = |name: &str| servers.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no {name}: {json}"));
    assert_eq!(by_name("s-metal3")["provider"], "metal3 hosts/worker-9");
    assert_eq!(by_name("s-on")["provider"], "redfish");
    assert_eq!(by_name("s-on")["node"], "n-general");
    assert_eq!(by_name("s-booting")["stage"], "booting");
    assert!(by_name("s-maint").get("watts").is_none(), "a stale reading shown: {json}");
    assert_eq!(json["summary"]["measured_watts"], 390);
    assert_eq!(json["summary"]["estimated_off_watts"], 40);
    assert_eq!(json["summary"]["total_watts"], 430);
    assert_eq!(json["energy"]["off"], 4);
    assert_eq!(json["energy"]["saving_watts"], 560.0);
    assert_eq!(json["energy"]["warm_spares"], 0);

    discover_applies_what_the_operator_did_not_set(&env, &client).await;
}

/// `servers discover --apply` against the DMTF mockup: a Server an operator
/// wrote keeps every value they set; what they did not set is added.
async fn discover_applies_what_the_operator_did_not_set(env: &TestEnv, client: &Client) {
    let mock = MockBmc::start().await;
    let mut operator = server("437xr1138r2", 12, json!({"labels": {"ironclaim.dev/rack": "R-OPERATOR"}}));
    operator["spec"]["hardware"]["memory"] = json!("96Gi");
    operator["spec"].as_object_mut().expect("spec").remove("power");
    apply(env, &operator);
    let dir = TempDir::new("discover-apply");
    let password = password_file(dir.path(), PASSWORD);
    let run = ironclaim(
        env,
        &["servers", "discover", &mock.endpoint(), "--username", USERNAME, "--password-file", password.to_str().unwrap(), "--apply", "-o", "json"],
    );
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("applied 1 Server (field manager ironclaim-discover)"), "{}", run.stderr);
    let kept = |field: &str| run.stderr.lines().any(|l| l.contains(field) && l.contains("left as it is"));
    assert!(kept("spec.hardware.cpu") && kept("spec.labels.ironclaim.dev/rack") && kept("spec.bmc.address"), "{}", run.stderr);

    let stored = Api::<Server>::all(client.clone()).get("437xr1138r2").await.expect("the Server");
    assert_eq!(stored.spec.hardware.cpu.0, "12", "the operator's value stays");
    assert_eq!(stored.spec.labels.get("ironclaim.dev/rack").map(String::as_str), Some("R-OPERATOR"));
    assert_eq!(stored.spec.bmc.as_ref().map(|b| b.address.as_str()), Some("redfish+https://10.0.3.11/redfish/v1/Systems/1"));
    assert_eq!(stored.spec.labels.get("ironclaim.dev/rack-unit").map(String::as_str), Some("12"), "what the operator left out is added");
    assert_eq!(stored.metadata.annotations.as_ref().and_then(|a| a.get("ironclaim.dev/discovered-watts")).map(String::as_str), Some("374"));
    assert_eq!(stored.metadata.annotations.as_ref().and_then(|a| a.get("ironclaim.dev/system-uuid")).map(String::as_str), Some(SYSTEM_UUID));
    env.kubectl(["delete", "server", "437xr1138r2"]).expect("delete the discovered Server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_refuses_a_malformed_pod_reference_with_exit_code_2() {
    let env = TestEnv::shared().expect("test environment");
    for bad in ["cli/", "/waiting", "cli/a/b", "CLI/waiting", "cli/Waiting", "cli/x_y"] {
        let run = ironclaim(&env, &["explain", "pod", bad]);
        assert_eq!(run.code, 2, "{bad}: {}{}", run.stdout, run.stderr);
        assert!(run.stderr.starts_with("error: "), "{bad}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{bad}: {}", run.stdout);
    }
    let run = ironclaim(&env, &["explain", "pod", "cli/"]);
    assert_eq!(run.stderr.trim_end(), "error: expected NAMESPACE/NAME (or NAME in the default namespace), found \"cli/\"");
    let run = ironclaim(&env, &["explain", "pod", "CLI/waiting"]);
    assert!(run.stderr.contains("\"CLI\" is not a namespace name"), "{}", run.stderr);
}
