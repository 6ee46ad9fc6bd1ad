//! The ironclaim controller: from a pending pod to a powered-on, Ready
//! server, with every step on the record.
//!
//! - [`index`]: the in-memory index of the cluster, fed by watches, that
//!   builds the core's snapshot. No IO.
//! - [`world`]: the driver's `World` read from the index.
//! - [`batch`]: pending pods batched by an idle and a maximum window.
//! - [`claims`]: the claim effects of the driver carried out: claiming
//!   servers atomically, powering on, recording each stage.
//! - [`executor`]: every effect of the driver handed to the API or the
//!   power provider, and answered.
//! - [`locks`]: the claim lock ledger, ConfigMaps sharded by server name
//!   whose writes take a decision's locks together: the atomic token a
//!   power-on waits for.
//! - [`timeline`]: the stage records, per-server deadlines (slow versus
//!   stuck) and the notes pods are told.
//! - [`gates`]: readiness gates per ServerPool.
//! - [`provider`]: the power boundary: Redfish and Metal3 BareMetalHost;
//!   [`external`]: a user's command or HTTPS endpoint; [`cluster_api`]: a
//!   Machine of a Cluster API MachineDeployment.
//! - [`scaledown`]: drains, warm-spare power, stranded resources and
//!   energy, carrying out the core's scale-down decisions.
//! - [`controller`]: the loop that ties them together, with leader
//!   election ([`leader`]) and `/metrics` ([`metrics`], [`http`]).
#![forbid(unsafe_code)]
#![deny(warnings)]

pub mod api;
pub mod batch;
pub mod buffers;
pub mod claims;
pub mod cluster;
pub mod cluster_api;
pub mod controller;
pub mod dashboard;
pub mod doctor;
pub mod error;
pub mod events;
pub mod executor;
pub mod external;
pub mod gates;
pub mod http;
pub mod index;
pub mod inventory;
pub mod leader;
pub mod locks;
pub mod metrics;
pub mod pools;
pub mod provider;
pub mod provisioning_requests;
pub mod scaledown;
pub mod timeline;
pub mod upstream;
pub mod world;

pub use cluster_api::ClusterApiPower;
pub use controller::{Controller, Decision, Settings};
pub use error::{Error, Result};
pub use external::ExternalPower;
pub use provider::{Metal3Power, Power, PowerError, ProviderRouter, RedfishPower};
