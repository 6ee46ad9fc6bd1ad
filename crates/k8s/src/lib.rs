//! The Kubernetes adapter of ironclaim.
//!
//! - [`api`]: the `ironclaim.dev/v1alpha1` resources (`Server`, `ServerPool`,
//!   `ServerClaim`), their CRDs, and [`convert`] into the core's model.
//! - [`pod`], [`node`]: Pods, pod templates, Nodes and
//!   PodDisruptionBudgets as the core sees them; the controller reuses these.
//! - [`load`]: manifests (`ironclaim plan -f`) into a core `Snapshot`:
//!   multi-document YAML, JSON and `kind: List`, controllers expanded to the
//!   pods the input does not hold, every error located by file, document
//!   and field. Objects are decoded strictly (an unknown field
//!   is an error), and ironclaim.dev objects checked against their CRD
//!   ([`api::validate`]).
//!
//! - [`metal3`]: Metal3's BareMetalHost and HardwareData, read for
//!   `servers discover --metal3`.
//!
//! Nothing here talks to an API server: conversions are pure functions the
//! controller and the CLI share.
#![forbid(unsafe_code)]
#![deny(warnings)]

pub mod api;
pub mod capacity_buffer;
pub mod convert;
pub mod duration;
pub mod error;
pub mod load;
pub mod metal3;
pub mod node;
pub mod pod;
pub mod provisioning_request;
pub mod redact;
pub mod resources;
mod selector;
mod strict;

pub use convert::{server_to_core, serverclaim_in_flight, serverpool_to_core};
pub use error::ConvertError;
pub use load::{LoadError, Loader, Location, MAX_DOCUMENTS, Manifests, Warning, load_files, load_str};
pub use node::{node_from_k8s, pdb_from_k8s};
pub use pod::{effective_requests, pod_from_k8s, pod_from_template};
