//! The `ironclaim.dev/v1alpha1` API: `Server`, `ServerPool` and `ServerClaim`,
//! and their CustomResourceDefinitions.

pub mod common;
mod schema;
pub mod server;
pub mod serverclaim;
pub mod serverpool;
pub mod validate;

pub use common::{NodeRequirement, NodeTaint, RequirementOperator, SecretReference, TaintEffect};
pub use server::{Server, ServerSpec, ServerStatus};
pub use serverclaim::{ServerClaim, ServerClaimSpec, ServerClaimStatus};
pub use serverpool::{ServerPool, ServerPoolSpec, ServerPoolStatus};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub const GROUP: &str = "ironclaim.dev";
pub const VERSION: &str = "v1alpha1";
pub const API_VERSION: &str = "ironclaim.dev/v1alpha1";

/// The CustomResourceDefinitions of the API, in the order they should be
/// applied.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![Server::crd(), ServerPool::crd(), ServerClaim::crd()]
}

/// The CRDs as one multi-document YAML stream, as `ironclaim crds` prints it.
///
/// # Errors
/// Only if the YAML serializer fails, which a well-formed CRD never makes it do.
pub fn crds_yaml() -> Result<String, serde_saphyr::SerializeError> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

/// The names of the CRDs [`crds_yaml`] holds (`servers.ironclaim.dev`, ...).
pub fn crd_names() -> Vec<String> {
    crds().into_iter().filter_map(|c| c.metadata.name).collect()
}
