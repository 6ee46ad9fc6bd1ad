use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use crate::error::{Error, Result};

/// The annotation that makes kwok play the kubelet of a Node: it marks the
/// Node Ready and runs the Pods bound to it.
pub const FAKE_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// Use this kubeconfig instead of starting an environment (which is then
/// neither started nor stopped by the tests).
const KUBECONFIG_VAR: &str = "IRONCLAIM_KUBECONFIG";
/// The kubectl to use with [`KUBECONFIG_VAR`]; defaults to the one
/// `hack/testenv build` produced, then to `kubectl` on PATH.
const KUBECTL_VAR: &str = "IRONCLAIM_KUBECTL";
/// Use this helm instead of the one `hack/testenv helm` builds.
const HELM_VAR: &str = "IRONCLAIM_HELM";
/// The helm `hack/testenv helm` builds, under the cache root; keep in step
/// with HELM_VERSION there (a mismatch fails with [`Error::HelmNotBuilt`]).
const HELM_PATH: &str = "helm-v4.3.2/helm";
/// Exit code of `hack/testenv up` when the binaries are not built.
const NOT_BUILT_EXIT_CODE: i32 = 3;

/// State dirs of environments started by tests: `<prefix><pid>-<n>`.
const STATE_DIR_PREFIX: &str = "ironclaim-testenv-";
/// In a state dir, marks logs to keep for a post-mortem.
const KEEP_MARKER: &str = "keep";

/// The environment shared by the tests of this process, while any holds it.
static SHARED: Mutex<Weak<Inner>> = Mutex::new(Weak::new());
/// Distinguishes the state dirs of environments started one after another.
static STARTS: AtomicU32 = AtomicU32::new(0);

/// A handle on a running control plane. Cheap to clone; the environment
/// stops when the last handle of the process is dropped.
#[derive(Clone, Debug)]
pub struct TestEnv {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    kubeconfig: PathBuf,
    kubectl: PathBuf,
    /// `None` when the environment was started outside the tests.
    owned: Option<Owned>,
}

#[derive(Debug)]
struct Owned {
    script: PathBuf,
    state_dir: PathBuf,
    /// Set when a test holding the environment panicked: its logs are kept.
    keep_state: AtomicBool,
}

impl TestEnv {
    /// Starts the control plane, or joins the one another test of this
    /// process already holds.
    ///
    /// # Guarantees
    /// On `Ok`, kube-apiserver answers `/readyz`, and the controller manager
    /// (with the disruption controller), the scheduler and kwok are healthy.
    /// Every process started here is stopped when the last handle drops, also
    /// on panic; if the test process is killed outright, a watcher started by
    /// `hack/testenv up` stops them within a second or so.
    ///
    /// # Errors
    /// [`Error::NotBuilt`] when `hack/testenv build` has not been run: tests
    /// fail rather than skip, so a missing environment is never mistaken for
    /// passing tests. [`Error::StartFailed`] with the script's output when a
    /// component does not come up.
    pub fn shared() -> Result<TestEnv> {
        let mut shared = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(inner) = shared.upgrade() {
            return Ok(TestEnv { inner });
        }
        let inner = Arc::new(Inner::start()?);
        *shared = Arc::downgrade(&inner);
        Ok(TestEnv { inner })
    }

    /// Like [`TestEnv::shared`], but the environment then stays up until the
    /// test process exits, for test binaries whose tests take turns on one
    /// control plane: were it stopped whenever no test held it, the next
    /// test would wait for a fresh one.
    ///
    /// # Guarantees
    /// As [`TestEnv::shared`], except for the stop: when the process exits,
    /// the watcher started by `hack/testenv up` notices within a second and
    /// runs `hack/testenv down`. The next environment started on this
    /// machine removes the state dirs such stopped environments left, unless
    /// a test failed while holding one (its logs are kept, and their path is
    /// printed when that test fails).
    ///
    /// # Errors
    /// As [`TestEnv::shared`]; a later call tries to start again.
    pub fn for_process() -> Result<TestEnv> {
        static HELD: Mutex<Option<TestEnv>> = Mutex::new(None);
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(env) = held.as_ref() {
            return Ok(env.clone());
        }
        let env = TestEnv::shared()?;
        *held = Some(env.clone());
        Ok(env)
    }

    /// Path of an admin kubeconfig for the environment.
    pub fn kubeconfig(&self) -> &Path {
        &self.inner.kubeconfig
    }

    /// Runs kubectl against the environment and returns its stdout.
    ///
    /// # Errors
    /// [`Error::KubectlFailed`] with kubectl's stderr when it exits non-zero.
    pub fn kubectl<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        self.kubectl_with_stdin(args, "")
    }

    /// Waits up to 30 s until each CRD (`servers.ironclaim.dev`) is
    /// Established. A CRD just created has no conditions yet, and `kubectl
    /// wait` then fails at once ("accessor error") instead of waiting: it
    /// is asked again until the CRD is there.
    ///
    /// # Errors
    /// kubectl's last failure once the 30 s are over.
    pub fn wait_established<S: AsRef<str>>(&self, crds: &[S]) -> Result<()> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        for crd in crds {
            loop {
                match self.kubectl(["wait", "--for=condition=Established", &format!("crd/{}", crd.as_ref()), "--timeout=30s"]) {
                    Ok(_) => break,
                    Err(err) if std::time::Instant::now() >= deadline => return Err(err),
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(250)),
                }
            }
        }
        Ok(())
    }

    /// Applies `yaml` (server-side) and waits until `crds` are Established
    /// ([`TestEnv::wait_established`]).
    ///
    /// # Errors
    /// kubectl's failure to apply or the wait's.
    pub fn install_crds<S: AsRef<str>>(&self, yaml: &str, crds: &[S]) -> Result<()> {
        self.kubectl_with_stdin(["apply", "--server-side", "-f", "-"], yaml)?;
        self.wait_established(crds)
    }

    /// Like [`TestEnv::kubectl`], feeding `stdin` to it (for `apply -f -`).
    pub fn kubectl_with_stdin<I, S>(&self, args: I, stdin: &str) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
        let mut child = Command::new(&self.inner.kubectl)
            .arg("--kubeconfig")
            .arg(&self.inner.kubeconfig)
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::Spawn { program: self.inner.kubectl.clone(), source })?;
        if let Some(mut pipe) = child.stdin.take() {
            // kubectl may exit before reading everything; its exit status
            // then says why, so a broken pipe here is not the error to report.
            let _ = pipe.write_all(stdin.as_bytes());
        }
        let output = child.wait_with_output().map_err(|source| Error::Spawn { program: self.inner.kubectl.clone(), source })?;
        if !output.status.success() {
            return Err(Error::KubectlFailed {
                args: args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
                status: output.status,
                stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// The directories of the CustomResourceDefinitions that ironclaim's
    /// must coexist with, pinned in `hack/testenv` and made once, cached:
    /// Karpenter's and Cluster API's as their projects release them, and
    /// Metal3's (`metal3.io`: BareMetalHost, HardwareData, ...) generated by
    /// controller-gen from the API types of Metal3's Go module.
    ///
    /// # Errors
    /// [`Error::PeerCrdsFailed`] with the script's output when they cannot be
    /// made (no network to the Go module proxy and nothing cached, or no Go
    /// toolchain to build controller-gen with).
    pub fn peer_crd_dirs() -> Result<Vec<PathBuf>> {
        let script = script_path();
        let output = Command::new(&script).arg("peer-crds").output().map_err(|source| Error::Spawn { program: script, source })?;
        if !output.status.success() {
            return Err(Error::PeerCrdsFailed { status: output.status, stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned() });
        }
        Ok(String::from_utf8_lossy(&output.stdout).lines().filter(|l| !l.is_empty()).map(PathBuf::from).collect())
    }

    /// Runs helm against the environment (its kubeconfig) and returns its
    /// stdout. See [`helm_path`] for which helm.
    ///
    /// # Errors
    /// [`Error::HelmNotBuilt`] when there is no helm; [`Error::HelmFailed`]
    /// with helm's stderr when it exits non-zero.
    pub fn helm<I, S>(&self, args: I) -> Result<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut command = Command::new(helm_path()?);
        command.env("KUBECONFIG", &self.inner.kubeconfig);
        helm_output(command, args)
    }

    /// A typed client authenticated as the environment's admin.
    ///
    /// kube's default retry of 429/503/504 is off: tests must see the
    /// server's answers as they are. (With it on, an eviction refused by a
    /// PodDisruptionBudget is retried for minutes before the 429 surfaces.)
    pub async fn client(&self) -> Result<kube::Client> {
        let path = &self.inner.kubeconfig;
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| Error::ReadKubeconfig { path: path.clone(), source })?;
        let mut config = kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|source| Error::ReadKubeconfig { path: path.clone(), source })?;
        config.default_retry = false;
        kube::Client::try_from(config).map_err(|source| Error::BuildClient { path: path.clone(), source })
    }
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        if std::thread::panicking()
            && let Some(owned) = &self.inner.owned
            && !owned.keep_state.swap(true, Ordering::Relaxed)
        {
            // Also for an environment that outlives this process: the marker
            // keeps the state dir from the sweep of the next start.
            let _ = std::fs::write(owned.state_dir.join(KEEP_MARKER), "a test failed while holding this environment\n");
            eprintln!("testenv: a test failed; the control plane's logs are kept in {}", owned.state_dir.join("logs").display());
        }
    }
}

impl Inner {
    fn start() -> Result<Inner> {
        let script = script_path();
        if let Some(kubeconfig) = std::env::var_os(KUBECONFIG_VAR) {
            let kubectl =
                std::env::var_os(KUBECTL_VAR).map(PathBuf::from).or_else(|| built_kubectl(&script)).unwrap_or_else(|| PathBuf::from("kubectl"));
            return Ok(Inner { kubeconfig: kubeconfig.into(), kubectl, owned: None });
        }

        // A free port can be taken by another process between the moment
        // `up` picks it and the moment a component binds it: start again on
        // fresh ports, a bounded number of times.
        let mut attempt = 1;
        loop {
            match Self::start_owned(&script) {
                Err(Error::StartFailed { stderr, .. }) if attempt < 3 && stderr.contains("address already in use") => {
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    fn start_owned(script: &Path) -> Result<Inner> {
        remove_stale_state_dirs();
        let script = script.to_path_buf();
        let state_dir = std::env::temp_dir().join(format!("{STATE_DIR_PREFIX}{}-{}", std::process::id(), STARTS.fetch_add(1, Ordering::Relaxed)));
        let output = Command::new(&script)
            .arg("up")
            .env("IRONCLAIM_TESTENV_DIR", &state_dir)
            .env("IRONCLAIM_TESTENV_NO_BUILD", "1")
            .env("IRONCLAIM_TESTENV_OWNER_PID", std::process::id().to_string())
            .stdin(Stdio::null())
            .output()
            .map_err(|source| Error::Spawn { program: script.clone(), source })?;
        let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
        if output.status.code() == Some(NOT_BUILT_EXIT_CODE) {
            return Err(Error::NotBuilt { stderr });
        }
        if !output.status.success() {
            return Err(Error::StartFailed { status: output.status, stderr });
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let Some(kubeconfig) = stdout.lines().last().and_then(|line| line.strip_prefix("KUBECONFIG=")) else {
            return Err(Error::NoKubeconfigLine { stdout: stdout.into_owned() });
        };
        let kubectl = built_kubectl(&script).unwrap_or_else(|| PathBuf::from("kubectl"));
        Ok(Inner { kubeconfig: kubeconfig.into(), kubectl, owned: Some(Owned { script, state_dir, keep_state: AtomicBool::new(false) }) })
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        let Some(owned) = &self.owned else { return };
        let stopped = Command::new(&owned.script)
            .arg("down")
            .env("IRONCLAIM_TESTENV_DIR", &owned.state_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !stopped {
            eprintln!("testenv: hack/testenv down failed; the control plane's logs are in {}", owned.state_dir.join("logs").display());
        } else if !owned.keep_state.load(Ordering::Relaxed) {
            let _ = std::fs::remove_dir_all(&owned.state_dir);
        }
    }
}

/// Removes the state dirs of environments started by test processes that
/// are gone, once their watcher has stopped them (`down` removes `pids/`
/// last), unless a failed test marked them to keep.
///
/// # Assumptions
/// `/proc` lists the live processes; without it, nothing is removed.
fn remove_stale_state_dirs() {
    let proc = Path::new("/proc");
    if !proc.join("self").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some((pid, _start)) = name.to_str().and_then(|n| n.strip_prefix(STATE_DIR_PREFIX)).and_then(|rest| rest.split_once('-')) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        let dir = entry.path();
        let owner_alive = pid == std::process::id() || proc.join(pid.to_string()).exists();
        if owner_alive || dir.join("pids").exists() || dir.join(KEEP_MARKER).exists() {
            continue;
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// The helm the tests run: `$IRONCLAIM_HELM` when set, else the one
/// `hack/testenv helm` builds into
/// `${IRONCLAIM_CACHE:-$HOME/.cache/ironclaim}/helm-<version>/helm`.
///
/// # Errors
/// [`Error::HelmNotBuilt`], naming the command that builds it, when that
/// file is not there: the tests fail rather than skip.
pub fn helm_path() -> Result<PathBuf> {
    let path = match std::env::var_os(HELM_VAR) {
        Some(path) => PathBuf::from(path),
        None => crate::cache_root().join(HELM_PATH),
    };
    if path.is_file() { Ok(path) } else { Err(Error::HelmNotBuilt { path }) }
}

/// The headless Chromium the browser tests drive: `$IRONCLAIM_CHROMIUM`
/// when set, else `chromium-headless-shell` or `chromium` on `PATH`
/// (`hack/testenv browser` installs Debian's chromium-headless-shell).
///
/// # Errors
/// [`Error::BrowserMissing`], naming the command that installs it: the
/// tests fail rather than skip.
pub fn chromium_path() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("IRONCLAIM_CHROMIUM").map(PathBuf::from) {
        return if path.is_file() { Ok(path) } else { Err(Error::BrowserMissing { looked: path.display().to_string() }) };
    }
    let names = ["chromium-headless-shell", "chromium"];
    let dirs: Vec<PathBuf> = std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    names
        .iter()
        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
        .find(|path| path.is_file())
        .ok_or_else(|| Error::BrowserMissing { looked: format!("{} on PATH", names.join(" and ")) })
}

/// Runs helm without a cluster (lint, template) and returns its stdout.
///
/// # Errors
/// As [`TestEnv::helm`].
pub fn helm<I, S>(args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let mut command = Command::new(helm_path()?);
    // No kubeconfig of the developer's reaches a command that needs none.
    command.env("KUBECONFIG", "/dev/null");
    helm_output(command, args)
}

fn helm_output<I, S>(mut command: Command, args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let program = PathBuf::from(command.get_program());
    let output = command.args(&args).stdin(Stdio::null()).output().map_err(|source| Error::Spawn { program, source })?;
    if !output.status.success() {
        return Err(Error::HelmFailed {
            args: args.iter().map(|a| a.to_string_lossy()).collect::<Vec<_>>().join(" "),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../hack/testenv")
}

/// The kubectl built alongside the control plane, if it is there.
fn built_kubectl(script: &Path) -> Option<PathBuf> {
    let output = Command::new(script).arg("bin-dir").output().ok()?;
    let dir = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    let kubectl = Path::new(&dir).join("kubectl");
    kubectl.is_file().then_some(kubectl)
}

#[cfg(test)]
mod tests {
    /// The helm the tests look for is the one `hack/testenv helm` builds.
    #[test]
    fn the_helm_path_names_the_version_hack_testenv_builds() {
        let script = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../hack/testenv")).expect("hack/testenv");
        let version = script.lines().find_map(|l| l.strip_prefix("readonly HELM_VERSION=")).expect("hack/testenv pins HELM_VERSION").trim();
        assert_eq!(super::HELM_PATH, format!("helm-{version}/helm"), "change HELM_PATH with hack/testenv's HELM_VERSION");
    }
}
