//! Records the commit the binary is built from, for `ironclaim --version`:
//! `IRONCLAIM_COMMIT` when set (a build from a tarball), else git's HEAD,
//! else `unknown`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (out.status.success() && !text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-env-changed=IRONCLAIM_COMMIT");
    let commit = std::env::var("IRONCLAIM_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=IRONCLAIM_COMMIT={commit}");
    // Built again when HEAD moves: HEAD itself, the branch it names, and
    // the packed refs (only those that exist: a missing one would rerun
    // this on every build).
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for name in ["HEAD", "packed-refs"].into_iter().map(str::to_string).chain(branch) {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]).filter(|p| Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
