//! Every command's errors as a user meets them: one line that names the
//! place (file, document, field, flag, server, object) and the fix; exit 2
//! for bad input, 1 for the outside world; never a panic.

use std::path::Path;
use std::process::Command;

use ironclaim_testenv::TempDir;

fn temp_dir() -> TempDir {
    let dir = TempDir::new("errors");
    std::fs::create_dir_all(dir.join("home")).unwrap();
    dir
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// A kubeconfig whose one context points at a port nothing listens on.
const UNREACHABLE: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"https://127.0.0.1:1\", insecure-skip-tls-verify: true}\nusers:\n- name: u\n  user: {token: t0ken-never-shown}\ncontexts:\n- name: lab\n  context: {cluster: c, user: u}\ncurrent-context: lab\n";

struct Case {
    args: Vec<String>,
    code: i32,
    /// What the error line must say: the place, and the fix where there is one.
    says: Vec<&'static str>,
}

fn case(args: &[&str], code: i32, says: &[&'static str]) -> Case {
    Case { args: args.iter().map(|a| a.to_string()).collect(), code, says: says.to_vec() }
}

#[test]
fn every_bad_input_and_every_failure_of_the_world_is_one_line_with_the_place_and_the_fix() {
    let dir = temp_dir();
    let kubeconfig = write(&dir, "unreachable.kubeconfig", UNREACHABLE);
    let broken_kubeconfig = write(&dir, "broken.kubeconfig", "clusters: [\n");
    let bad_yaml = write(&dir, "bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: [\n");
    let bad_field = write(
        &dir,
        "field.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    resources: {requests: {cpu: lots}}\n",
    );
    let unknown_field =
        write(&dir, "unknown.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n  nodeSelecter: {}\n");
    let inventory = write(&dir, "inventory.yaml", "- name: a\n  address: https://bmc\n  credentials: {}\n  colour: blue\n");
    let missing = dir.join("missing.yaml").to_str().unwrap().to_string();
    let providers = write(&dir, "providers.yaml", "providers:\n- name: ipmi\n  command: [ipmitool.sh]\n");
    let unsized_resize = write(&dir, "resize.csv", "name,cpu_milli,memory_mib,arrival_s,departure_s,resize_s\na,1000,100,0,600,60\n");
    let late_resize = write(
        &dir,
        "late.yaml",
        "pods:\n- {name: db, cpu_milli: 1000, memory_mib: 100, arrival_s: 0, departure_s: 600, resize_s: 900, resize_cpu_milli: 2000}\n",
    );
    let servers = write(&dir, "servers.csv", "name,cpu_milli,memory_mib\ns,8000,1000\n");
    let cases = [
        // Files and documents.
        case(&["plan", "-f", &missing], 2, &["missing.yaml"]),
        case(&["plan", "-f", &bad_yaml], 2, &["bad.yaml:3", "invalid YAML"]),
        case(&["plan", "-f", &bad_field], 2, &["field.yaml", "document 1", "Pod p", "spec.containers[0].resources.requests.cpu"]),
        case(&["plan", "-f", &unknown_field], 2, &["unknown.yaml", "spec.nodeSelecter", "nodeSelector"]),
        case(&["plan", "--vary", "colour=red"], 2, &["--vary", "warm, boot, stock, requests"]),
        case(&["simulate", "--trace", &missing, "--servers", &missing], 2, &["--trace", "missing.yaml"]),
        case(&["simulate", "--servers", &bad_yaml], 2, &["--servers needs --trace"]),
        case(&["simulate", "--trace", &unsized_resize, "--servers", &servers], 2, &["resize.csv:2:6", "resize_s without resize_cpu_milli"]),
        case(&["simulate", "--trace", &late_resize], 2, &["late.yaml", "pods[0] (db)", "resize_s 900 is not before the departure time 600"]),
        case(&["simulate", "--batch-idle", "10s", "--batch-max", "1s"], 2, &["--batch-max", "--batch-idle"]),
        case(&["bmc", "status", "--inventory", &missing], 2, &["inventory", "missing.yaml"]),
        case(&["bmc", "status", "--inventory", &inventory], 2, &["inventory.yaml:4:3", "unknown field"]),
        case(&["swarm", "--seeds", "0"], 2, &["--seeds"]),
        // Flags: clap's usage errors name the flag.
        case(&["simulate", "--duration", "2d"], 2, &["--duration", "unknown unit"]),
        case(&["controller", "--batch-idle", "soon"], 2, &["--batch-idle"]),
        case(&["controller", "--power-budget-watts", "0"], 2, &["--power-budget-watts", "a positive number of watts"]),
        case(&["controller", "--power-budget-watts", "-500"], 2, &["--power-budget-watts", "a positive number of watts"]),
        case(&["controller", "--power-budget-watts", "NaN"], 2, &["--power-budget-watts", "a positive number of watts"]),
        case(&["plan", "--power-budget-watts", "12kW"], 2, &["--power-budget-watts", "a positive number of watts"]),
        case(&["controller", "--transition-rate", "rack"], 2, &["--transition-rate", "SCOPE=N"]),
        case(&["controller", "--kube-api-qps", "0"], 2, &["--kube-api-qps", "a rate above zero"]),
        case(&["controller", "--kube-api-qps", "inf"], 2, &["--kube-api-qps", "a rate above zero"]),
        case(&["controller", "--kube-api-burst", "0"], 2, &["--kube-api-burst"]),
        case(
            &["controller", "--external-providers", &providers],
            2,
            &["--external-providers", "providers.yaml", "providers[0].command[0]", "absolute path"],
        ),
        case(&["controller", "--external-providers", &missing], 2, &["--external-providers", "missing.yaml", "cannot read"]),
        case(&["doctor", "--external-providers", &providers, "--kubeconfig", &kubeconfig], 2, &["providers[0].command[0]"]),
        case(&["plan", "--transition-rate", "fleet=0"], 2, &["--transition-rate", "SCOPE=N"]),
        case(&["simulate", "--max-cycles-per-day", "0"], 2, &["--max-cycles-per-day"]),
        case(&["bmc", "status", "--inventory", &inventory, "--request-timeout", "5x"], 2, &["--request-timeout"]),
        case(&["plan", "-o", "xml"], 2, &["--output", "table, json, yaml"]),
        case(&["bench", "scheduling", "--runs", "0"], 2, &["--runs"]),
        case(&["explain", "pod", "Shop/web", "--kubeconfig", &kubeconfig], 2, &["\"Shop\" is not a namespace name"]),
        // Kubeconfigs.
        case(&["servers"], 2, &["no kubeconfig", "--kubeconfig FILE"]),
        case(&["servers", "--kubeconfig", &missing], 2, &["missing.yaml does not exist", "--kubeconfig"]),
        case(&["servers", "--kubeconfig", &broken_kubeconfig], 2, &["broken.kubeconfig", "invalid kubeconfig YAML"]),
        case(&["servers", "--kubeconfig", &kubeconfig, "--context", "prod"], 2, &["no context \"prod\"", "--context (lab)"]),
        // The API server gone: the world, naming the server, with the fix.
        case(&["servers", "--kubeconfig", &kubeconfig], 1, &["https://127.0.0.1:1", "does not answer", "refused", "--kubeconfig, --context"]),
        case(&["explain", "pod", "shop/web", "--kubeconfig", &kubeconfig], 1, &["https://127.0.0.1:1", "does not answer"]),
        case(&["doctor", "--kubeconfig", &kubeconfig, "-o", "json"], 1, &["check(s) failed"]),
        case(&["controller", "--kubeconfig", &kubeconfig, "--metrics-address", "127.0.0.1:0"], 1, &["https://127.0.0.1:1", "does not answer"]),
        // servers discover: BMCs or Metal3, not both.
        case(&["servers", "discover", "-n", "fleet", "https://10.0.0.1"], 2, &["--namespace", "--metal3"]),
        case(&["servers", "discover", "--metal3", "--kubeconfig", &kubeconfig], 1, &["https://127.0.0.1:1", "does not answer", "refused"]),
    ];
    let mut wrong = Vec::new();
    for case in &cases {
        let out = Command::new(env!("CARGO_BIN_EXE_ironclaim"))
            .args(&case.args)
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env_remove("RUST_LOG")
            // The controller logs as a daemon does; its error line is what is checked.
            .env("IRONCLAIM_LOG", "off")
            .env("HOME", dir.join("home"))
            .output()
            .expect("run ironclaim");
        let err = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        // After the error line: only clap's indented detail (the possible
        // values, a tip) and its hint.
        let hint_only = lines.iter().skip(1).all(|l| l.starts_with(' ') || l.starts_with("For more information, try"));
        let problems = [
            (out.status.code() != Some(case.code), format!("exit {:?}, not {}", out.status.code(), case.code)),
            (lines.first().is_none_or(|l| !l.starts_with("error: ")), "no error line first".to_string()),
            (!hint_only, "more than one line".to_string()),
            (err.contains("panicked") || err.contains("backtrace"), "a panic".to_string()),
            (err.contains("t0ken-never-shown"), "the kubeconfig's token".to_string()),
        ];
        let missing_words: Vec<&str> = case.says.iter().copied().filter(|w| !err.contains(w)).collect();
        for (bad, what) in problems {
            if bad {
                wrong.push(format!("{:?}: {what}:\n{err}", case.args));
            }
        }
        if !missing_words.is_empty() {
            wrong.push(format!("{:?}: does not say {missing_words:?}:\n{err}", case.args));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// `--version` names the release and the commit the binary was built from,
/// the one `git` says HEAD is (or `unknown` outside a checkout).
#[test]
fn version_names_the_release_and_the_commit() {
    let out = Command::new(env!("CARGO_BIN_EXE_ironclaim")).arg("--version").output().expect("run ironclaim --version");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or_else(|| "unknown".to_string(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let commit = std::env::var("IRONCLAIM_COMMIT").ok().filter(|c| !c.is_empty()).unwrap_or(head);
    assert_eq!(text.trim(), format!("ironclaim {} (commit {commit})", env!("CARGO_PKG_VERSION")));
}
