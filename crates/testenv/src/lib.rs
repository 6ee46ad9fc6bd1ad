//! A real Kubernetes control plane for ironclaim's integration tests.
//!
//! [`TestEnv::shared`] starts `hack/testenv up` (etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and kwok on loopback) or joins the
//! one already started by another test in the same process, and stops it with
//! `hack/testenv down` when the last test holding it is done, including when
//! that test panics. Set `IRONCLAIM_KUBECONFIG` to run the tests against an
//! environment you started yourself; it is then left running.
//!
//! The binaries are built once by `hack/testenv build`; the tests never build
//! them, they fail and say so instead.
//!
//! [`helm`] and [`TestEnv::helm`] run the helm `hack/testenv helm` builds,
//! for the chart's tests.
//!
//! [`sushy`] runs the sushy-tools Redfish emulator for the tests that power
//! servers through a real BMC endpoint.
//!
//! [`keda`] runs the KEDA operator against the control plane, for the
//! tests of scaling replicas from zero.

#![forbid(unsafe_code)]
#![deny(warnings)]

mod env;
mod error;
pub mod keda;
pub mod sushy;
mod tempdir;
mod wait;

pub use env::{FAKE_NODE_ANNOTATION, TestEnv, chromium_path, helm, helm_path};
pub use error::{Error, Result};
pub use tempdir::TempDir;
pub use wait::eventually;

/// The cache the `hack/` scripts fill: `$IRONCLAIM_CACHE`, else
/// `$HOME/.cache/ironclaim`.
pub fn cache_root() -> std::path::PathBuf {
    match std::env::var_os("IRONCLAIM_CACHE") {
        Some(dir) => std::path::PathBuf::from(dir),
        None => std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ironclaim"),
    }
}
