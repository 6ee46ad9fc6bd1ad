//! `ironclaim bmc` exit codes as users meet them: bad input is 2, a BMC that
//! cannot be reached is 1, and secrets never reach the output, not even
//! from a malformed inventory or kubeconfig. (Power paths against a real
//! Redfish emulator are tested in crates/redfish.) `ironclaim servers
//! discover` against the DMTF mockup served by the redfish crate's mock
//! BMC, and against sushy-tools.

// The redfish crate's harnesses: the mock BMC and the sushy-tools setup.
#[path = "../../redfish/tests/common/mod.rs"]
mod common;

use std::process::Command;

use common::mock::{MockBmc, SYSTEM_UUID};
use common::{PASSWORD, SystemPower, USERNAME, ca_pem, fake_system, password_file, sushy_with};
use ironclaim_testenv::TempDir;
use serde_json::Value;

fn ironclaim(args: &[&str]) -> (i32, String, String) {
    run(Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(args))
}

fn run(command: &mut Command) -> (i32, String, String) {
    let out = command.output().expect("run ironclaim");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn temp_dir(tag: &str) -> TempDir {
    TempDir::new(&format!("bmc-{tag}"))
}

#[test]
fn a_missing_password_file_is_bad_input() {
    let (code, _, err) = ironclaim(&[
        "bmc",
        "status",
        "--endpoint",
        "https://127.0.0.1:1",
        "--system",
        "1",
        "--username",
        "admin",
        "--password-file",
        "/nonexistent/password",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/password"), "{err}");
}

#[test]
fn an_unreachable_bmc_fails_with_exit_1_and_says_so_without_the_password() {
    let dir = temp_dir("unreachable");
    let password = dir.join("password");
    std::fs::write(&password, "s3cret-value").unwrap();
    // Port 9 on loopback: nothing listens, the connection is refused at once.
    let (code, out, err) = ironclaim(&[
        "bmc",
        "status",
        "--endpoint",
        "http://127.0.0.1:9",
        "--system",
        "1",
        "--username",
        "admin",
        "--password-file",
        password.to_str().unwrap(),
        "--request-timeout",
        "2",
        "--output",
        "json",
    ]);
    assert_eq!(code, 1, "{out}{err}");
    let all = format!("{out}{err}");
    assert!(all.to_lowercase().contains("unreachable"), "{all}");
    assert!(!all.contains("s3cret-value"), "the password leaked: {all}");
}

#[test]
fn flags_that_contradict_each_other_are_bad_input() {
    let dir = temp_dir("contradict");
    let password = dir.join("password");
    std::fs::write(&password, "pw").unwrap();
    let ca = dir.join("ca.pem");
    std::fs::write(&ca, "not a certificate").unwrap();
    let (code, _, err) = ironclaim(&[
        "bmc",
        "status",
        "--endpoint",
        "https://127.0.0.1:9",
        "--system",
        "1",
        "--username",
        "admin",
        "--password-file",
        password.to_str().unwrap(),
        "--ca-file",
        ca.to_str().unwrap(),
        "--insecure-skip-verify",
    ]);
    assert_eq!(code, 2, "{err}");
}

const SECRET: &str = "hunter2-s3cret";

/// Malformed inventories with a password written in them, at each place a
/// parser quotes the input: the lines around a mistake, a value of the
/// wrong type, an unknown key, an address. The error names the file, never
/// the password.
#[test]
fn a_malformed_inventory_never_shows_the_password_it_holds() {
    let dir = temp_dir("inline-password");
    let entry = "- name: a\n  address: https://10.0.0.1/redfish/v1/Systems/1\n";
    let cases = [
        // An unknown key, in the credentials and at the top of an entry.
        ("yaml", format!("{entry}  credentials:\n    username: admin\n    password: {SECRET}\n")),
        ("yaml", format!("- name: a\n  password: {SECRET}\n  address: https://10.0.0.1\n")),
        // Syntax errors on and after the password's line.
        ("yaml", format!("{entry}  credentials: {{username: admin, password: {SECRET}\n")),
        ("yaml", format!("{entry}  credentials:\n    username: admin\n    password: '{SECRET}\n")),
        ("yaml", format!("{entry}  credentials:\n    password: {SECRET}\n   username: [admin\n")),
        ("yaml", format!("{entry}  credentials:\n    username: admin\n\tpassword: {SECRET}\n")),
        // The password as a value of the wrong type, and as a key.
        ("yaml", format!("{entry}  credentials: {SECRET}\n")),
        ("yaml", format!("{entry}  credentials: {{username: admin, password_file: [{SECRET}]}}\n")),
        ("yaml", format!("{entry}  credentials: {{username: admin, password_file: pw}}\n  tls: {{insecure_skip_verify: {SECRET}}}\n")),
        ("yaml", format!("{entry}  credentials: {{admin, {SECRET}}}\n")),
        ("yaml", format!("password: {SECRET}\n")),
        // In the address.
        ("yaml", format!("- name: a\n  address: https://admin:{SECRET}@10.0.0.1\n  credentials: {{username: admin, password_file: pw}}\n")),
        ("yaml", format!("- name: a\n  address: admin:{SECRET}@10.0.0.1\n  credentials: {{username: admin, password_file: pw}}\n")),
        // The same in JSON.
        ("json", format!(r#"[{{"name": "a", "address": "https://10.0.0.1", "credentials": {{"username": "admin", "password": "{SECRET}"}}}}]"#)),
        ("json", format!(r#"[{{"name": "a", "address": "https://10.0.0.1", "credentials": "{SECRET}"}}]"#)),
        ("json", format!(r#"[{{"name": "a", "address": "https://10.0.0.1", "credentials": {{"username": "admin", "{SECRET}": 1}}}}]"#)),
        ("json", format!(r#"[{{"name": "a", "credentials": {{"username": "admin", "password": "{SECRET}" }}"#)),
        ("json", format!(r#"[{{"name": "a", "tls": {{"insecure_skip_verify": "{SECRET}"}}}}]"#)),
    ];
    for (i, (ext, text)) in cases.iter().enumerate() {
        let file = dir.join(format!("inventory-{i}.{ext}"));
        std::fs::write(&file, text).unwrap();
        let (code, out, err) = ironclaim(&["bmc", "status", "--inventory", file.to_str().unwrap()]);
        assert_eq!(code, 2, "case {i}: {out}{err}");
        assert!(err.contains(&format!("inventory-{i}.{ext}")), "case {i}: {err}");
        assert!(!out.contains(SECRET) && !err.contains(SECRET), "case {i} shows the password: {out}{err}");
    }
    // The usual mistake is told how to do it right.
    let (_, _, err) = ironclaim(&["bmc", "status", "--inventory", dir.join("inventory-0.yaml").to_str().unwrap()]);
    assert!(err.contains("unknown field `password`") && err.contains("password_file"), "{err}");
}

/// A kubeconfig holds tokens: `servers` (given --kubeconfig) and `explain`
/// (reading $KUBECONFIG) say where it is malformed without quoting it.
#[test]
fn a_malformed_kubeconfig_never_shows_its_token() {
    let dir = temp_dir("kubeconfig");
    let user = "apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n";
    let cases = [
        format!("{user}    token: {SECRET}\n    password: [{SECRET}\n"),
        format!("{user}    token: [{SECRET}]\n"),
        format!("{user}    token: {SECRET}\n   username: {{a\n"),
        format!("{user}    token: '{SECRET}\n"),
        format!("{user}    {SECRET}\n    token: x\n"),
    ];
    for (i, text) in cases.iter().enumerate() {
        let file = dir.join(format!("kubeconfig-{i}"));
        std::fs::write(&file, text).unwrap();
        let (code, out, err) = ironclaim(&["servers", "--kubeconfig", file.to_str().unwrap()]);
        assert_ne!(code, 0, "case {i}");
        assert!(err.contains("line"), "case {i}: {err}");
        assert!(!out.contains(SECRET) && !err.contains(SECRET), "case {i} shows the token: {out}{err}");
        let (code, out, err) = run(Command::new(env!("CARGO_BIN_EXE_ironclaim"))
            .args(["explain", "pod", "default/web"])
            .env("KUBECONFIG", &file)
            .env_remove("KUBERNETES_SERVICE_HOST"));
        assert_ne!(code, 0, "case {i}");
        assert!(!out.contains(SECRET) && !err.contains(SECRET), "case {i} shows the token: {out}{err}");
    }
}

/// The mock BMC serving the DMTF mockup, on a runtime of its own while the
/// test runs the binary.
fn mockup_bmc() -> (tokio::runtime::Runtime, MockBmc) {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let mock = runtime.block_on(MockBmc::start());
    (runtime, mock)
}

/// `servers discover` with the test account, `extra` arguments after.
fn discover(endpoints: &[&str], password: &str, extra: &[&str]) -> (i32, String, String) {
    let dir = TempDir::new("discover");
    let file = password_file(dir.path(), password);
    let mut args = vec!["servers", "discover"];
    args.extend_from_slice(endpoints);
    args.extend_from_slice(&["--username", USERNAME, "--password-file", file.to_str().unwrap(), "--request-timeout", "3s"]);
    args.extend_from_slice(extra);
    ironclaim(&args)
}

fn items(json: &str) -> Vec<Value> {
    let list: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(list["kind"], "List", "{json}");
    list["items"].as_array().cloned().unwrap_or_default()
}

#[test]
fn discover_writes_the_mockup_system_as_a_server_the_strict_loader_accepts() {
    let (_runtime, mock) = mockup_bmc();
    let (code, out, err) = discover(&[&mock.endpoint()], PASSWORD, &["--credentials-secret", "bmc/rack-1", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let servers = items(&out);
    assert_eq!(servers.len(), 1, "{out}");
    let server = &servers[0];
    assert_eq!(server["metadata"]["name"], "437xr1138r2", "named after the serial number");
    let annotations = &server["metadata"]["annotations"];
    assert_eq!(annotations["ironclaim.dev/system-uuid"], SYSTEM_UUID);
    assert_eq!(annotations["ironclaim.dev/serial-number"], "437XR1138R2");
    assert_eq!(annotations["ironclaim.dev/mac-addresses"], "12:44:6a:3b:04:11,12:44:6a:3b:88:90");
    let spec = &server["spec"];
    assert_eq!(spec["hardware"], serde_json::json!({"cpu": "16", "memory": "96Gi"}));
    assert_eq!(spec["labels"], serde_json::json!({"ironclaim.dev/rack": "WEB43", "ironclaim.dev/row": "North", "ironclaim.dev/rack-unit": "12"}));
    assert_eq!(spec.get("power"), None, "a reading under unknown load is no power profile");
    assert_eq!(annotations["ironclaim.dev/discovered-watts"], "374");
    assert_eq!(spec["bmc"]["address"], format!("redfish+{}/redfish/v1/Systems/437XR1138R2", mock.endpoint()));
    assert_eq!(spec["bmc"]["credentialsSecretRef"], serde_json::json!({"name": "rack-1", "namespace": "bmc"}));
    // The one thing Redfish cannot say is said on stderr.
    assert!(err.contains("spec.power") && err.contains("374 W"), "{err}");
    assert!(!err.contains("spec.hardware"), "{err}");

    // The YAML is what `plan -f` reads, under the CRD's own schema.
    let (code, yaml, err) = discover(&[&mock.endpoint()], PASSWORD, &[]);
    assert_eq!(code, 0, "{yaml}{err}");
    let manifests = ironclaim_k8s::load::load_str("discovered.yaml", &yaml).unwrap_or_else(|e| panic!("{e}\n{yaml}"));
    let servers = &manifests.snapshot.servers;
    assert_eq!(servers.len(), 1, "{yaml}");
    assert_eq!(servers[0].name, "437xr1138r2");
    assert_eq!(servers[0].labels.get("ironclaim.dev/rack").map(String::as_str), Some("WEB43"));
}

#[test]
fn discover_reports_a_refused_endpoint_and_wrong_credentials_by_kind_and_prints_the_rest() {
    let (_runtime, mock) = mockup_bmc();
    // Port 9 on loopback: nothing listens, the connection is refused.
    let dir = TempDir::new("endpoints");
    let file = dir.path().join("bmcs.txt");
    std::fs::write(&file, format!("# rack 1\n{}\n\nhttp://127.0.0.1:9\n", mock.endpoint())).unwrap();
    let (code, out, err) = discover(&[], PASSWORD, &["--endpoints-file", file.to_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 1, "{out}{err}");
    assert_eq!(items(&out).len(), 1, "the answering BMC's server is printed: {out}");
    let row = err.lines().find(|l| l.contains("127.0.0.1:9")).unwrap_or_else(|| panic!("no row for the refused endpoint: {err}"));
    assert!(row.contains("unreachable"), "{err}");
    assert!(err.contains("error: discover: 1 endpoint failed; 1 Server printed"), "{err}");

    let (code, out, err) = discover(&[&mock.endpoint()], "not the password", &["-o", "json"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(items(&out).is_empty(), "{out}");
    let row = err.lines().find(|l| l.contains(&mock.endpoint())).unwrap_or_else(|| panic!("no row for the endpoint: {err}"));
    assert!(row.contains("auth_failed"), "{err}");
    assert!(!err.contains("not the password"), "the password leaked: {err}");

    // An address that does not parse is bad input, before any BMC is asked,
    // named by its line in the file.
    std::fs::write(&file, format!("{}\nftp://bmc\n", mock.endpoint())).unwrap();
    let (code, out, err) = discover(&[], PASSWORD, &["--endpoints-file", file.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bmcs.txt:2") && err.contains("ftp://bmc"), "{err}");
    assert!(out.is_empty(), "{out}");
    // So is a cluster to apply to that cannot be used.
    let asked = mock.world().requests.len();
    let (code, out, err) = discover(&[&mock.endpoint()], PASSWORD, &["--apply", "--kubeconfig", "/nonexistent/kubeconfig"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/kubeconfig") && out.is_empty(), "{out}{err}");
    assert_eq!(mock.world().requests.len(), asked, "no BMC is asked before the kubeconfig is read");
}

/// Every system behind one emulator becomes a Server of its own, for a
/// rack of 50. The fake driver reports no CPUs or memory: those are left
/// out, the table says why, and the exit code says the manifests are not
/// complete.
#[test]
fn discover_makes_one_server_per_sushy_system() {
    let systems: Vec<_> = (0..50).map(|i| fake_system(i, if i == 0 { SystemPower::On } else { SystemPower::Off })).collect();
    let sushy = sushy_with(&systems).start().unwrap();
    let ca = ca_pem(&sushy);
    let (code, out, err) = discover(&[&sushy.endpoint()], PASSWORD, &["--ca-file", ca.to_str().unwrap(), "-o", "json"]);
    assert_eq!(code, 1, "{out}{err}");
    let servers = items(&out);
    assert_eq!(servers.len(), systems.len(), "{out}");
    let ca_text = std::fs::read_to_string(&ca).unwrap();
    for ((uuid, _), server) in systems.iter().zip(&servers) {
        assert_eq!(server["metadata"]["name"], uuid.as_str(), "no serial number: named after the UUID");
        assert_eq!(server["metadata"]["annotations"]["ironclaim.dev/system-uuid"], uuid.as_str());
        assert_eq!(server["spec"]["bmc"]["address"], sushy.metal3_address(uuid));
        assert_eq!(server["spec"]["bmc"]["caBundle"], ca_text.as_str());
        assert_eq!(server["spec"]["bmc"]["credentialsSecretRef"]["namespace"], "ironclaim-system");
        assert!(server["spec"]["hardware"].as_object().is_some_and(|h| h.is_empty()), "{server}");
        let rows: Vec<&str> = err.lines().filter(|l| l.contains(uuid.as_str()) && l.contains("spec.hardware.cpu")).collect();
        assert_eq!(rows.len(), 1, "one row for the missing CPUs of {uuid}: {err}");
    }
    assert!(err.contains("error: discover: 50 manifests the CRD refuses; 50 Servers printed"), "{err}");
}
