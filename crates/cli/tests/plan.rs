//! `ironclaim plan` as a user runs it: the binary, its output, its exit codes.

use serde_json::Value;
use std::process::Command;

use ironclaim_testenv::TempDir;

fn ironclaim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(args).output().expect("run ironclaim");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn repo_file(rel: &str) -> String {
    format!("{}/../../{rel}", env!("CARGO_MANIFEST_DIR"))
}

fn outcomes(json: &Value) -> Vec<(String, String, Option<String>)> {
    json["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|w| w["pods"].as_array().unwrap().iter())
        .map(|p| (p["name"].as_str().unwrap().to_string(), p["outcome"].as_str().unwrap().to_string(), p["server"].as_str().map(String::from)))
        .collect()
}

#[test]
fn plan_with_no_arguments_runs_the_worked_example() {
    let (code, out, err) = ironclaim(&["plan", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    let pods = outcomes(&json);
    assert_eq!(pods.len(), 9);
    assert_eq!(pods.iter().filter(|p| p.1 == "existing").count(), 7);
    let batch = pods.iter().find(|p| p.0 == "analytics/batch-job-0").unwrap();
    assert_eq!((batch.1.as_str(), batch.2.as_deref()), ("new_claim", Some("r1-u10")));
    assert_eq!(json["claims"].as_array().unwrap().len(), 2);
    for claim in json["claims"].as_array().unwrap() {
        for key in ["server", "pods", "path", "eta_s"] {
            assert!(!claim[key].is_null(), "claim lacks {key}: {claim}");
        }
    }
}

/// plan is a what-if on manifests: a pod that fits a Ready node needs no
/// server, which is not a sign of stale accounting there.
#[test]
fn the_table_says_a_pod_on_a_ready_node_needs_no_server_and_names_the_claims() {
    let (code, out, _) = ironclaim(&["plan"]);
    assert_eq!(code, 0);
    assert!(out.contains("fits Ready node general-a: no server needed"), "{out}");
    assert!(!out.contains("stale"), "{out}");
    assert!(out.contains("r1-u10 (warm)"), "{out}");
    assert!(out.contains("9 pending pods: 7 fit Ready nodes now, 2 go to 2 new claims (+480 W idle), 0 cannot be placed."), "{out}");
}

#[test]
fn the_worked_example_as_manifests_plans_like_the_embedded_one() {
    let (code, out, err) = ironclaim(&["plan", "-f", &repo_file("examples/worked-example.yaml"), "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    let (_, embedded, _) = ironclaim(&["plan", "--output", "json"]);
    let embedded: Value = serde_json::from_str(&embedded).unwrap();
    let summary = |j: &Value| {
        let mut s: Vec<(String, Option<String>)> = outcomes(j).into_iter().map(|(_, o, srv)| (o, srv)).collect();
        s.sort();
        s
    };
    assert_eq!(summary(&json), summary(&embedded));
}

/// The manifests are the embedded example written out: the same pods,
/// by the same names, in the same workloads, with the same outcomes.
#[test]
fn the_example_manifests_name_their_pods_as_the_embedded_example_does() {
    let (code, out, err) = ironclaim(&["plan", "-f", &repo_file("examples/worked-example.yaml"), "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let (_, embedded, _) = ironclaim(&["plan", "--output", "json"]);
    let pods = |json: &str| {
        let json: Value = serde_json::from_str(json).unwrap();
        let mut pods: Vec<(String, String, String, Option<String>)> = json["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|w| w["pods"].as_array().unwrap().iter().map(move |p| (w["name"].as_str().unwrap().to_string(), p)))
            .map(|(w, p)| {
                (w, p["name"].as_str().unwrap().to_string(), p["outcome"].as_str().unwrap().to_string(), p["server"].as_str().map(String::from))
            })
            .collect();
        pods.sort();
        pods
    };
    assert_eq!(pods(&out), pods(&embedded));
}

#[test]
fn the_sensitivity_table_has_a_row_per_combination() {
    let (code, out, err) = ironclaim(&["plan", "--vary", "warm=0,1", "--vary", "boot=5m,30m", "--vary", "requests=x0.5,x1,x1.5", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let rows: Value = serde_json::from_str(&out).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 12);
    // With no warm spare and a 30-minute path the batch job waits 30 minutes.
    let cold_slow = rows.iter().find(|r| r["variations"] == serde_json::json!(["warm=0", "boot=30m", "requests=x1"])).unwrap();
    let batch = cold_slow["workloads"].as_array().unwrap().iter().find(|w| w["name"] == "batch-job").unwrap();
    assert_eq!(batch["ready_in_s"], 1800);
}

/// The fleet's power budget: the A100 host the GPU pod needs draws 2.4 kW
/// at peak, more than 10 kW leaves room for and less than 1 kW does not.
#[test]
fn a_power_budget_too_low_for_the_cold_gpu_host_leaves_its_pod_unplaced() {
    let pod = |args: &[&str]| {
        let (code, out, err) = ironclaim(&[&["plan", "--output", "json"], args].concat());
        assert_eq!(code, 0, "{err}");
        let json: Value = serde_json::from_str(&out).unwrap();
        let pods = json["workloads"].as_array().unwrap().iter().flat_map(|w| w["pods"].as_array().unwrap().clone()).collect::<Vec<_>>();
        pods.into_iter().find(|p| p["name"] == "ml/gpu-inference-1").unwrap()
    };
    let capped = pod(&["--power-budget-watts", "1000"]);
    assert_eq!((capped["outcome"].as_str(), capped["reason_kind"].as_str()), (Some("unschedulable"), Some("power_budget")), "{capped}");
    assert!(capped["reason"].as_str().unwrap().starts_with("power budget reached: powering on needs "), "{capped}");
    assert!(capped["reason"].as_str().unwrap().ends_with("W more than the 1000 W budget allows"), "{capped}");
    for args in [&[][..], &["--power-budget-watts", "10000"][..]] {
        let placed = pod(args);
        assert_eq!((placed["outcome"].as_str(), placed["server"].as_str()), (Some("new_claim"), Some("r2-u20")), "{args:?}: {placed}");
    }
    let (code, out, _) = ironclaim(&["plan", "--power-budget-watts", "1000"]);
    assert_eq!(code, 0);
    assert!(out.contains("power budget reached"), "{out}");
}

#[test]
fn bad_input_exits_2_and_names_the_place() {
    let dir = TempDir::new("plan");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "apiVersion: v1\nkind: Pod\nmetadata: {name: x}\nspec:\n  containers:\n  - name: a\n    resources: {requests: {cpu: 1x}}\n")
        .unwrap();
    let (code, _, err) = ironclaim(&["plan", "-f", bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("bad.yaml") && err.contains("spec.containers[0].resources.requests.cpu"), "{err}");
    let (code, _, err) = ironclaim(&["plan", "--vary", "colour=red"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, _) = ironclaim(&["plan", "-f", "/nonexistent/ironclaim.yaml"]);
    assert_eq!(code, 2);
}

/// A Server as the API server would refuse it: `plan -f` refuses it too,
/// exit code 2, one line naming file, document, object and field.
#[test]
fn manifests_the_api_server_refuses_exit_2_naming_the_field() {
    let dir = TempDir::new("plan-strict");
    let server = "apiVersion: ironclaim.dev/v1alpha1
kind: Server
metadata: {name: r1-u10}
spec:
  bmc:
    address: https://10.0.1.10
    credentialsSecretRef: {name: bmc, namespace: ironclaim-system}
  hardware: {cpu: 32, memory: 128Gi}
";
    // The bad Server comes second, after a good one: the error names its
    // document and the line it starts on.
    let second = |bad: String| format!("---\n{}---\n{bad}", server.replace("r1-u10", "r1-u09"));
    let bmc = "  bmc:\n    address: https://10.0.1.10\n    credentialsSecretRef: {name: bmc, namespace: ironclaim-system}\n";
    let cases = [
        (
            second(format!("{server}  maintainance: true\n")),
            "inventory.yaml:11: document 2 (Server r1-u10): spec.maintainance: unknown field (did you mean maintenance?)",
        ),
        (
            second(server.replace(bmc, "")),
            "inventory.yaml:11: document 2 (Server r1-u10): spec: bmc is required unless provider.type is Metal3, External or ClusterAPI",
        ),
        (
            second(server.replace("https://", "ftp://")),
            "inventory.yaml:11: document 2 (Server r1-u10): spec.bmc.address: invalid value \"ftp://10.0.1.10\": must match",
        ),
        (
            second(format!("{server}  power: {{idleWatts: 500, peakWatts: 300}}\n")),
            "inventory.yaml:11: document 2 (Server r1-u10): spec.power: peakWatts must be at least idleWatts",
        ),
    ];
    for (text, want) in cases {
        let file = dir.join("inventory.yaml");
        std::fs::write(&file, &text).unwrap();
        let (code, out, err) = ironclaim(&["plan", "-f", file.to_str().unwrap()]);
        assert_eq!(code, 2, "{err}{out}");
        let line = err.lines().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("no error line: {err}"));
        assert!(line.starts_with(&format!("error: {}", dir.display())) && line.contains(want), "got {line}\nwant {want}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // The same Server without the typo plans.
    std::fs::write(dir.join("inventory.yaml"), server).unwrap();
    let (code, _, err) = ironclaim(&["plan", "-f", dir.join("inventory.yaml").to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
}

/// COLUMNS fits every table to the terminal: plan's and, run here too so
/// as not to build a test binary for one check, simulate's.
#[test]
fn tables_fit_the_width_columns_gives() {
    let table_widths =
        |out: &str| -> Vec<usize> { out.lines().filter(|l| l.starts_with(['┌', '│', '╞', '├', '└'])).map(|l| l.chars().count()).collect() };
    let dir = TempDir::new("columns");
    let trace = dir.join("one.yaml");
    std::fs::write(
        &trace,
        "servers:\n  - {name: r1, cpu_milli: 32000, memory_mib: 131072}\n\
         pods:\n  - {name: web, cpu_milli: 1000, memory_mib: 2048, arrival_s: 10, departure_s: 70}\n",
    )
    .unwrap();
    for args in [vec!["plan"], vec!["simulate", "--trace", trace.to_str().unwrap(), "--no-faults"]] {
        for columns in [80, 100] {
            let out = Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(&args).env("COLUMNS", columns.to_string()).output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let widths = table_widths(&stdout);
            assert!(!widths.is_empty() && widths.iter().all(|&w| w <= columns), "{args:?} COLUMNS={columns}: {widths:?}\n{stdout}");
        }
    }
}

#[test]
fn bench_reports_throughput_and_the_baseline() {
    let (code, out, err) = ironclaim(&["bench", "scheduling", "--pods", "200", "--runs", "1", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let json: Value = serde_json::from_str(&out).unwrap();
    let row = &json["rows"][0];
    assert_eq!(row["pods"], 200);
    assert!(row["pods_per_sec"].as_f64().unwrap() > 0.0);
    assert!(row["servers_opened"].as_u64().unwrap() <= row["ffd_servers_opened"].as_u64().unwrap());
}

/// A value in the wrong place (here an environment value, a token, given
/// as `valueFrom`) is a type error that names the file, the document and
/// the field, and never echoes what the field held.
#[test]
fn a_type_error_in_a_manifest_never_echoes_the_value() {
    let dir = TempDir::new("plan-secret");
    let file = dir.join("pod.yaml");
    let secret = "ghp_s3cr3tTokenValue42";
    std::fs::write(
        &file,
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: leaky, namespace: shop}}\nspec:\n  containers:\n  - name: app\n    env:\n    - name: API_TOKEN\n      valueFrom: {secret}\n"
        ),
    )
    .unwrap();
    let (code, out, err) = ironclaim(&["plan", "-f", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{out}{err}");
    assert!(!err.contains(secret), "the value leaked: {err}");
    assert!(err.contains("pod.yaml") && err.contains("document 1") && err.contains("spec.containers[0].env[0].valueFrom"), "{err}");
    assert!(err.contains("invalid type: string"), "{err}");
}

/// `bench scheduling -o json` is one document of one shape, for one size
/// or several.
#[test]
fn bench_json_has_one_shape_whatever_the_sizes() {
    let keys = |json: &Value| -> Vec<String> {
        let mut keys: Vec<String> = json.as_object().expect("an object").keys().cloned().collect();
        keys.sort();
        keys
    };
    let mut shapes = Vec::new();
    for pods in ["5", "5,10"] {
        let (code, out, err) = ironclaim(&["bench", "scheduling", "--pods", pods, "--runs", "1", "-o", "json"]);
        assert_eq!(code, 0, "{err}");
        let json: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(keys(&json), ["rows", "runs", "shape"], "{out}");
        let rows = json["rows"].as_array().unwrap();
        assert_eq!(rows.len(), pods.split(',').count());
        for row in rows {
            assert_eq!(keys(row), ["decision_ms", "ffd_servers_opened", "pods", "pods_per_sec", "servers_opened", "unschedulable"], "{row}");
        }
        shapes.push(keys(&json));
    }
    assert_eq!(shapes[0], shapes[1]);
    let (code, out, _) = ironclaim(&["bench", "scheduling", "--pods", "5", "--runs", "1", "-o", "yaml"]);
    assert_eq!(code, 0);
    assert!(out.starts_with("shape: reference\nruns: 1\nrows:\n"), "{out}");
}

/// A reader that stops reading (`| head -1`) ends the command quietly: no
/// panic, exit 0.
#[test]
fn a_closed_stdout_ends_plan_and_simulate_without_a_panic() {
    for args in [
        &["plan"][..],
        &["plan", "-o", "json"],
        &["simulate", "--duration", "1h", "--policies", "always-on"],
        &["bench", "scheduling", "--pods", "5", "--runs", "1"],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        // Closed before the command starts: its first write meets a broken pipe.
        drop(reader);
        let out = Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(args).stdout(writer).output().expect("run ironclaim");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
    }
}

/// `swarm -o json` is one document: the run and each failing seed with its
/// replay command; the table is the same summary as text.
#[test]
fn swarm_prints_its_summary_as_one_json_document() {
    let (code, out, err) = ironclaim(&["swarm", "--seeds", "2", "--from", "7", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let summary: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!((summary["seeds"].as_u64(), summary["from"].as_u64()), (Some(2), Some(7)), "{out}");
    assert_eq!(summary["failing"], serde_json::json!([]), "{out}");
    let (code, text, _) = ironclaim(&["swarm", "--seeds", "2", "--from", "7"]);
    assert_eq!(code, 0);
    assert!(text.starts_with("2 seeds in ") && text.contains(": 0 failing"), "{text}");
}

/// `crds -o json` is one List of the same CRDs the YAML stream holds.
#[test]
fn crds_print_the_same_definitions_as_yaml_or_as_one_json_list() {
    let (code, json, err) = ironclaim(&["crds", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let list: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(list["kind"], "List");
    let (code, yaml, _) = ironclaim(&["crds"]);
    assert_eq!(code, 0);
    let from_yaml: Vec<Value> = yaml.split("---\n").filter(|d| !d.trim().is_empty()).map(|d| serde_saphyr::from_str(d).expect("yaml")).collect();
    assert_eq!(list["items"].as_array().expect("items"), &from_yaml);
}

/// Every outcome the core can give a pod, reached from manifests through
/// `plan -f`: the worked example, plus the documents that make each one.
#[test]
fn every_outcome_is_reachable_from_manifests() {
    let example = std::fs::read_to_string(repo_file("examples/worked-example.yaml")).unwrap();
    let dir = TempDir::new("outcomes");
    let outcome_of = |manifests: &str, name: &str, args: &[&str]| -> (String, Option<String>) {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, manifests).unwrap();
        let (code, out, err) = ironclaim(&[&["plan", "-f", path.to_str().unwrap(), "--output", "json"], args].concat());
        assert_eq!(code, 0, "{name}: {err}");
        let json: Value = serde_json::from_str(&out).unwrap();
        let pods: Vec<Value> = json["workloads"].as_array().unwrap().iter().flat_map(|w| w["pods"].as_array().unwrap().clone()).collect();
        let p = pods.iter().find(|p| p["name"] == format!("default/{name}")).unwrap_or_else(|| panic!("{name} not planned: {out}"));
        (p["outcome"].as_str().unwrap().to_string(), p["reason_kind"].as_str().map(String::from))
    };
    let requests = |cpu: &str, gpus: u32| {
        let limits = if gpus > 0 { format!(", limits: {{nvidia.com/gpu: \"{gpus}\"}}") } else { String::new() };
        format!("  containers:\n  - {{name: c, image: x, resources: {{requests: {{cpu: \"{cpu}\", memory: 1Gi}}{limits}}}}}\n")
    };
    let pod_with = |name: &str, spec: &str, res: &str| {
        format!("---\napiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: default, labels: {{app: {name}}}}}\nspec:\n{spec}{res}")
    };
    let gpu_toleration = "  tolerations:\n  - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n";
    // Pod name, its document, extra flags, and the outcome and reason wanted.
    type Case<'a> = (&'a str, String, &'a [&'a str], (&'a str, Option<&'a str>));
    let cases: Vec<Case> = vec![
        ("fits", pod_with("fits", "", &requests("1", 0)), &[], ("existing", None)),
        ("needs-a-server", pod_with("needs-a-server", "", &requests("20", 0)), &[], ("new_claim", None)),
        ("too-big", pod_with("too-big", "", &requests("200", 0)), &[], ("unschedulable", Some("no_matching_hardware"))),
        (
            // Only r2-u20 is in zone-a with GPUs, and the GPU inference
            // pods take two of its four.
            "whole-gpu-host",
            pod_with(
                "whole-gpu-host",
                &format!("  nodeSelector: {{topology.kubernetes.io/zone: zone-a, accelerator: nvidia-a100}}\n{gpu_toleration}"),
                &requests("8", 4),
            ),
            &[],
            ("unschedulable", Some("all_matching_busy")),
        ),
        (
            "affine-to-nothing",
            pod_with(
                "affine-to-nothing",
                "  affinity:\n    podAffinity:\n      requiredDuringSchedulingIgnoredDuringExecution:\n      - {labelSelector: {matchLabels: {app: nowhere}}, topologyKey: kubernetes.io/hostname}\n",
                &requests("1", 0),
            ),
            &[],
            ("unschedulable", Some("topology")),
        ),
        ("over-budget", pod_with("over-budget", "", &requests("20", 0)), &["--power-budget-watts", "100"], ("unschedulable", Some("power_budget"))),
    ];
    for (name, doc, args, want) in cases {
        let got = outcome_of(&format!("{example}\n{doc}"), name, args);
        assert_eq!((got.0.as_str(), got.1.as_deref()), want, "{name}");
    }
    // A pool at its server limit.
    let limited = example.replace(
        "  - {key: ironclaim.dev/class, operator: In, values: [general-32]}\n  defaultDeadline: 1h",
        "  - {key: ironclaim.dev/class, operator: In, values: [general-32]}\n  defaultDeadline: 1h\n  limits: {servers: 0}",
    );
    assert_ne!(limited, example, "the general pool's spec moved; update the replacement");
    let got = outcome_of(&format!("{limited}\n{}", pod_with("no-room-in-pool", "", &requests("20", 0))), "no-room-in-pool", &[]);
    assert_eq!((got.0.as_str(), got.1.as_deref()), ("unschedulable", Some("pool_limit")));
    // A class allowed two power changes a minute: its warm spare was
    // powered off ten seconds ago (as its status records), and the batch
    // job's claim takes the second.
    let cooling = example
        .replace("  # Powered on and idle: a warm spare.\n  powerState: \"On\"", "  powerState: \"Off\"\n  powerChanges: [{at: 1000, on: false}]");
    assert_ne!(cooling, example, "the warm spare's status moved; update the replacement");
    let rate = ["--transition-rate", "ironclaim.dev/class=2", "--now", "1010"];
    let got = outcome_of(&format!("{cooling}\n{}", pod_with("rate-limited", "", &requests("20", 0))), "rate-limited", &rate);
    assert_eq!((got.0.as_str(), got.1.as_deref()), ("unschedulable", Some("transition_rate")));
    let later = ["--transition-rate", "ironclaim.dev/class=2", "--now", "1060"];
    let got = outcome_of(&format!("{cooling}\n{}", pod_with("rate-limited", "", &requests("20", 0))), "rate-limited", &later);
    assert_eq!((got.0.as_str(), got.1.as_deref()), ("new_claim", None), "a minute on, the rate allows one more");
    // A claim in flight for the pod.
    let claim = "---\napiVersion: ironclaim.dev/v1alpha1\nkind: ServerClaim\nmetadata: {name: general-r1-u11}\n\
                 spec: {server: r1-u11, pool: general, pods: [{namespace: default, name: waiting}]}\nstatus: {stage: Booting}\n";
    let got = outcome_of(&format!("{example}\n{}{claim}", pod_with("waiting", "", &requests("20", 0))), "waiting", &[]);
    assert_eq!((got.0.as_str(), got.1.as_deref()), ("in_flight", None));
}

#[test]
fn a_pod_waiting_for_an_in_place_resize_is_planned_at_its_new_size() {
    let example = std::fs::read_to_string(repo_file("examples/worked-example.yaml")).unwrap();
    let dir = TempDir::new("resize");
    // Runs on general-a with 1 CPU; its kubelet finds 20 CPU infeasible
    // (or 6, deferred: more than general-a has free, less than general-b).
    let resizing = |cpu: &str, reason: &str| {
        format!(
            "---\napiVersion: v1\nkind: Pod\nmetadata: {{name: db-0, namespace: default, ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, name: db, uid: u, controller: true}}]}}\nspec:\n  nodeName: general-a\n  containers:\n  - {{name: db, image: x, resources: {{requests: {{cpu: \"{cpu}\", memory: 1Gi}}}}}}\nstatus:\n  phase: Running\n  conditions:\n  - {{type: PodResizePending, status: \"True\", reason: {reason}}}\n  containerStatuses:\n  - {{name: db, image: x, imageID: \"\", ready: true, restartCount: 0, resources: {{requests: {{cpu: \"1\", memory: 1Gi}}}}, allocatedResources: {{cpu: \"1\", memory: 1Gi}}}}\n"
        )
    };
    let plan = |name: &str, doc: String| -> (Value, String) {
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, format!("{example}\n{doc}")).unwrap();
        let (code, out, err) = ironclaim(&["plan", "-f", path.to_str().unwrap(), "--output", "json"]);
        assert_eq!(code, 0, "{err}");
        let json: Value = serde_json::from_str(&out).unwrap();
        let pod =
            json["workloads"].as_array().unwrap().iter().flat_map(|w| w["pods"].as_array().unwrap().clone()).find(|p| p["name"] == "default/db-0");
        let (code, table, err) = ironclaim(&["plan", "-f", path.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
        (pod.unwrap_or_else(|| panic!("db-0 not planned: {out}")), table)
    };
    let (pod, table) = plan("infeasible", resizing("20", "Infeasible"));
    assert_eq!(pod["outcome"], "new_claim", "{pod}");
    assert_eq!(pod["resize"], "resize to 20 CPU infeasible on general-a");
    let server = pod["server"].as_str().unwrap();
    assert!(table.contains("resize to 20 CPU infeasible on general-a"), "{table}");
    assert!(pod["reason"].as_str().unwrap().ends_with(&format!("server {server} powering on")), "{pod}");
    // general-b has room for 6 CPU once the pod moves: no server.
    let (pod, _) = plan("deferred", resizing("6", "Deferred"));
    assert_eq!((pod["outcome"].as_str(), pod["node"].as_str()), (Some("existing"), Some("general-b")), "{pod}");
    assert_eq!(pod["resize"], "resize to 6 CPU deferred on general-a");
    // Without the condition, the same pod is just running.
    let (code, out, err) = ironclaim(&["plan", "-f", dir.join("infeasible.yaml").to_str().unwrap(), "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let plain = std::fs::read_to_string(dir.join("infeasible.yaml")).unwrap().replace("type: PodResizePending", "type: Ready");
    std::fs::write(dir.join("plain.yaml"), plain).unwrap();
    let (code, plain_out, err) = ironclaim(&["plan", "-f", dir.join("plain.yaml").to_str().unwrap(), "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("default/db-0") && !plain_out.contains("default/db-0"), "{plain_out}");
}
