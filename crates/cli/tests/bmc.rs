//! `ironclaim bmc` exit codes as users meet them: bad input is 2, a BMC that
//! cannot be reached is 1, and secrets never reach the output. (Power paths
//! against a real Redfish emulator are tested in crates/redfish.)

use std::process::Command;

fn ironclaim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ironclaim")).args(args).output().expect("run ironclaim");
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
