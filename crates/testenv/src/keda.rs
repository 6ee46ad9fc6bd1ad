//! The KEDA operator (`keda-operator`, built from KEDA's Go module by
//! `hack/testenv keda`) in a child process against a test control plane,
//! for the tests of the replicas axis: a ScaledObject takes a workload from
//! zero to N and back, and ironclaim powers servers on and off for it.
//!
//! ```no_run
//! # async fn f(env: &ironclaim_testenv::TestEnv) -> Result<(), Box<dyn std::error::Error>> {
//! let keda = ironclaim_testenv::keda::Keda::start(env)?;
//! // ... apply a ScaledObject; KEDA scales its target. Killed on drop.
//! # drop(keda); Ok(()) }
//! ```
//!
//! It runs outside the cluster with the environment's admin kubeconfig, its
//! endpoints on free loopback ports, no leader election, and the TLS files
//! of its metrics gRPC service made for the test. What it does not run:
//! KEDA's metrics API server (the `external.metrics.k8s.io` adapter the HPA
//! reads to go from 1 to N replicas) and its admission webhooks. A
//! ScaledObject with `idleReplicaCount: 0` and `minReplicaCount: N` is
//! scaled between 0 and N by the operator alone, with no HPA involved.
//!
//! The operator is found in `$IRONCLAIM_KEDA` (a directory holding
//! `keda-operator` and `crds/`), else in the cache `hack/testenv keda`
//! fills. A missing operator is an error, never a skipped test.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::TestEnv;

/// Overrides where the operator and its CRDs are.
pub const KEDA_VAR: &str = "IRONCLAIM_KEDA";
/// The directory `hack/testenv keda` builds into, under the cache root;
/// keep in step with KEDA_VERSION there.
const KEDA_DIR: &str = "keda-v2.21.0";
/// The namespace KEDA keeps its own objects in (`KEDA_CLUSTER_OBJECT_NAMESPACE`).
pub const KEDA_NAMESPACE: &str = "keda";
/// How long the operator may take to report ready: it starts its caches
/// for ScaledObjects, ScaledJobs, HPAs and the rest first.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// What went wrong while starting the operator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the KEDA operator is not built at {path}: run `hack/testenv keda` (or set {KEDA_VAR} to a directory with keda-operator and crds/)")]
    NotBuilt { path: PathBuf },

    #[error("failed to prepare the operator's files in {path}")]
    WriteFiles {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("failed to find a free loopback port")]
    NoFreePort {
        #[source]
        source: std::io::Error,
    },

    #[error("failed to make the operator's test certificates")]
    Certificates {
        #[source]
        source: rcgen::Error,
    },

    #[error("failed to install KEDA's CRDs: {source}")]
    Crds {
        #[source]
        source: crate::Error,
    },

    #[error("failed to start {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("keda-operator exited with {status} before it was ready; its log:\n{log}")]
    Exited { status: ExitStatus, log: String },

    #[error("keda-operator was not ready within {timeout:?}; its log:\n{log}")]
    NotReady { timeout: Duration, log: String },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The directory with `keda-operator` and `crds/`: `$IRONCLAIM_KEDA`, else
/// `${IRONCLAIM_CACHE:-$HOME/.cache/ironclaim}/keda-<version>`.
pub fn keda_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(KEDA_VAR) {
        return PathBuf::from(dir);
    }
    crate::cache_root().join(KEDA_DIR)
}

/// A running KEDA operator; killed on drop (its ScaledObjects stay).
#[derive(Debug)]
pub struct Keda {
    child: Option<Child>,
    log: Arc<Mutex<Vec<String>>>,
    dir: PathBuf,
}

impl Keda {
    /// Installs KEDA's CRDs (server-side apply, so again is harmless), then
    /// starts the operator and waits until its `/readyz` answers 200.
    ///
    /// # Errors
    /// [`Error::NotBuilt`] without the operator; [`Error::Crds`] when the
    /// CRDs do not apply or establish; [`Error::Exited`] or
    /// [`Error::NotReady`] with the operator's log when it does not come up.
    pub fn start(env: &TestEnv) -> Result<Keda> {
        let home = keda_dir();
        let program = home.join("keda-operator");
        if !program.is_file() {
            return Err(Error::NotBuilt { path: program });
        }
        let crds = home.join("crds");
        env.kubectl(["apply", "--server-side", "--force-conflicts", "-f"].map(PathBuf::from).into_iter().chain([crds]))
            .map_err(|source| Error::Crds { source })?;
        env.wait_established(&["scaledobjects.keda.sh"]).map_err(|source| Error::Crds { source })?;
        let _ = env.kubectl(["create", "namespace", KEDA_NAMESPACE]);

        let dir = std::env::temp_dir().join(format!("ironclaim-keda-{}-{}", std::process::id(), free_port()?));
        std::fs::create_dir_all(&dir).map_err(|source| Error::WriteFiles { path: dir.clone(), source })?;
        let certs = dir.join("certs");
        std::fs::create_dir_all(&certs).map_err(|source| Error::WriteFiles { path: certs.clone(), source })?;
        make_certificates(&certs)?;
        let cas = dir.join("ca");
        std::fs::create_dir_all(&cas).map_err(|source| Error::WriteFiles { path: cas.clone(), source })?;

        let probe = free_port()?;
        let arg = |name: &str, value: String| format!("--{name}={value}");
        let mut child = Command::new(&program)
            .args([
                arg("metrics-bind-address", format!("127.0.0.1:{}", free_port()?)),
                arg("health-probe-bind-address", format!("127.0.0.1:{probe}")),
                arg("metrics-service-bind-address", format!("127.0.0.1:{}", free_port()?)),
                arg("cert-dir", certs.display().to_string()),
                arg("ca-dir", cas.display().to_string()),
                arg("leader-elect", "false".into()),
                arg("enable-webhook-patching", "false".into()),
                arg("enable-apiservice-patching", "false".into()),
                arg("zap-log-level", "info".into()),
            ])
            .env("KUBECONFIG", env.kubeconfig())
            .env("KEDA_CLUSTER_OBJECT_NAMESPACE", KEDA_NAMESPACE)
            .env("POD_NAMESPACE", KEDA_NAMESPACE)
            .env("WATCH_NAMESPACE", "")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| Error::Spawn { program: program.clone(), source })?;
        let log: Arc<Mutex<Vec<String>>> = Arc::default();
        for pipe in
            [child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>), child.stderr.take().map(|p| Box::new(p) as _)].into_iter().flatten()
        {
            let sink = log.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines().map_while(std::result::Result::ok) {
                    sink.lock().unwrap_or_else(PoisonError::into_inner).push(line);
                }
            });
        }
        let mut keda = Keda { child: Some(child), log, dir };
        keda.wait_until_ready(probe)?;
        Ok(keda)
    }

    /// Everything the operator logged so far.
    pub fn log_text(&self) -> String {
        self.log.lock().unwrap_or_else(PoisonError::into_inner).join("\n")
    }

    fn wait_until_ready(&mut self, port: u16) -> Result<()> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if ready(port) {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                std::thread::sleep(Duration::from_millis(100));
                return Err(Error::Exited { status, log: self.log_text() });
            }
            if Instant::now() >= deadline {
                self.kill();
                return Err(Error::NotReady { timeout: READY_TIMEOUT, log: self.log_text() });
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Keda {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `GET /readyz` on the operator's health port answers 200.
fn ready(port: u16) -> bool {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b" 200")
}

fn free_port() -> Result<u16> {
    let port = || -> std::io::Result<u16> { Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
    port().map_err(|source| Error::NoFreePort { source })
}

/// The files KEDA's metrics gRPC service serves with (`ca.crt`, `tls.crt`,
/// `tls.key` in `--cert-dir`), from a CA made for the test.
fn make_certificates(dir: &Path) -> Result<()> {
    let (ca, cert, key) = crate::sushy::test_pki("ironclaim test KEDA CA").map_err(|source| Error::Certificates { source })?;
    for (name, text) in [("ca.crt", ca), ("tls.crt", cert), ("tls.key", key)] {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|source| Error::WriteFiles { path, source })?;
    }
    Ok(())
}
