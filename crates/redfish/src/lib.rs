//! Redfish client and power provider for ironclaim.
//!
//! Scale-up on bare metal is a Redfish power-on, scale-down a graceful
//! shutdown, and the saving is the watts the BMC reports. This crate speaks
//! just enough Redfish to do those three things against real BMCs:
//!
//! - [`address`]: BMC addresses, including Metal3's
//!   `redfish+https://host/redfish/v1/Systems/ID`, and system selectors
//!   (Id, UUID or full path).
//! - [`credentials`]: usernames and passwords read from files or from the
//!   data of a Kubernetes Secret; never printed.
//! - [`tls`]: verification on by default, a CA bundle per server, and an
//!   explicit, loudly logged escape hatch.
//! - [`client`]: one [`client::Bmc`] per BMC endpoint: discovery, sessions
//!   or Basic auth, retries with jitter, ETags, a global request bound.
//! - [`fleet`]: [`fleet::BmcFleet`], one shared client per endpoint and
//!   account, with one session, one reset at a time and one request bound
//!   per endpoint, however many servers sit behind it.
//! - [`power`]: the power-on / power-off sequences with confirmation, task
//!   monitors and a single re-send when a BMC silently drops an action.
//! - [`discover`]: what each system of a BMC is (identity, CPUs, memory,
//!   GPUs, MACs, rack place, watts), every fact it cannot read named.
//! - [`payload`]: tolerant parsers for the few payload fields we read; every
//!   failure names the JSON path.
//! - [`provider`]: the [`provider::PowerProvider`] boundary the controller
//!   and the simulator share, and [`provider::RedfishProvider`], a fleet of
//!   servers behind it.
//!
//! Errors are one enum, [`Error`], whose variants name the step that failed
//! and carry a [`Error::metric_label`].
#![forbid(unsafe_code)]

pub mod address;
pub mod client;
pub mod credentials;
pub mod discover;
mod error;
pub mod fleet;
pub mod payload;
pub mod power;
pub mod provider;
pub mod tls;

pub use address::{BmcAddress, SystemSelector};
pub use client::{AuthMode, Bmc, BmcConfig, Timing};
pub use credentials::{Credentials, SecretRef};
pub use error::{Error, Result, Step};
pub use fleet::{BmcFleet, FleetOptions};
pub use power::{PowerOutcome, PowerState, ResetType};
pub use provider::{
    FleetWatts, LabeledError, PowerProvider, ProviderOptions, RedfishProvider, ServerSpec, ServerStatus, SystemIdentity, SystemStatus, Watts,
    WattsSource,
};
pub use tls::{TlsSettings, ca_bundle_file, install_crypto_provider};
