use std::path::PathBuf;
use std::process::ExitStatus;

/// What went wrong while starting, using or stopping the test environment.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `hack/testenv up` refused to start because the binaries are missing.
    #[error(
        "the Kubernetes control-plane binaries are not built: run `hack/testenv build` \
         (about 10-15 minutes on 2 cores the first time, seconds afterwards)\n{stderr}"
    )]
    NotBuilt { stderr: String },

    #[error("failed to run {program}")]
    Spawn {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("hack/testenv up failed ({status}); its output:\n{stderr}")]
    StartFailed { status: ExitStatus, stderr: String },

    /// `hack/testenv peer-crds` could not fetch the peers' CRDs.
    #[error("hack/testenv peer-crds failed ({status}); its output:\n{stderr}")]
    PeerCrdsFailed { status: ExitStatus, stderr: String },

    /// The pinned helm is not built.
    #[error("helm is not built: run `hack/testenv helm` (a few minutes on 2 cores the first time); looked for {path}")]
    HelmNotBuilt { path: PathBuf },

    /// No headless Chromium for the browser tests.
    #[error("no headless Chromium: run `hack/testenv browser` (Debian's chromium-headless-shell), or set IRONCLAIM_CHROMIUM; looked for {looked}")]
    BrowserMissing { looked: String },

    /// helm ran and exited non-zero.
    #[error("helm {args} failed ({status}): {stderr}")]
    HelmFailed { args: String, status: ExitStatus, stderr: String },

    #[error("hack/testenv up succeeded but printed no KUBECONFIG= line; stdout:\n{stdout}")]
    NoKubeconfigLine { stdout: String },

    #[error("kubectl {args} failed ({status}): {stderr}")]
    KubectlFailed { args: String, status: ExitStatus, stderr: String },

    #[error("failed to read kubeconfig {path}")]
    ReadKubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },

    #[error("failed to build a client for kubeconfig {path}")]
    BuildClient {
        path: PathBuf,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// A short, stable name for the failed step, for counting failures by kind.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::NotBuilt { .. } => "not_built",
            Error::Spawn { .. } => "spawn",
            Error::StartFailed { .. } => "start_failed",
            Error::PeerCrdsFailed { .. } => "peer_crds_failed",
            Error::HelmNotBuilt { .. } => "helm_not_built",
            Error::HelmFailed { .. } => "helm_failed",
            Error::BrowserMissing { .. } => "browser_missing",
            Error::NoKubeconfigLine { .. } => "no_kubeconfig_line",
            Error::KubectlFailed { .. } => "kubectl_failed",
            Error::ReadKubeconfig { .. } => "read_kubeconfig",
            Error::BuildClient { .. } => "build_client",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
