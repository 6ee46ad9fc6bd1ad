//! `ironclaim bmc` exit codes as users meet them: bad input is 2, a BMC that
//! cannot be reached is 1, and secrets never reach the output, not even
//! from a malformed inventory or kubeconfig. (Power paths against a real
//! Redfish emulator are tested in crates/redfish.)

use std::process::Command;

fn ironclaim(args: &[&str]) -> (i32, String, String) {
    run(Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(args))
}

fn run(command: &mut Command) -> (i32, String, String) {
    let out = command.output().expect("run ironclaim");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ironclaim-bmc-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
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
