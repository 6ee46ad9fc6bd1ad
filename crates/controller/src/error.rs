//! The controller's errors, by the step that failed.

use crate::provider::PowerError;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("creating ServerClaim for server {server} failed")]
    CreateClaimFailed {
        server: String,
        #[source]
        source: kube::Error,
    },

    #[error("writing the claim of server {server} failed")]
    ClaimServerFailed {
        server: String,
        #[source]
        source: kube::Error,
    },

    #[error("the claim lock of server {server} in the lock ledger {ledger} could not be written: {reason}")]
    ClaimLockFailed { server: String, ledger: String, reason: String },

    #[error("server {server} is already held by claim {holder}")]
    ServerHeld { server: String, holder: String },

    #[error("writing the status of ServerClaim {claim} failed")]
    ApplyStatusFailed {
        claim: String,
        #[source]
        source: kube::Error,
    },

    #[error("writing the status of server {server} failed")]
    ServerStatusFailed {
        server: String,
        #[source]
        source: kube::Error,
    },

    #[error("labelling node {node} failed")]
    LabelNodeFailed {
        node: String,
        #[source]
        source: kube::Error,
    },

    #[error("powering server {server} failed")]
    PowerFailed {
        server: String,
        #[source]
        source: PowerError,
    },

    #[error("reading {what} failed")]
    ReadFailed {
        what: String,
        #[source]
        source: kube::Error,
    },

    #[error("the lease {lease} could not be read or written")]
    LeaseFailed {
        lease: String,
        #[source]
        source: kube::Error,
    },

    #[error("this replica does not hold a valid lease; it does not act")]
    NotLeading,

    #[error("writing {what} lost to other writers five times in a row")]
    WriteContended { what: String },

    #[error("serving metrics on {address} failed")]
    ServeFailed {
        address: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// A short, stable label for counting failures by kind.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::CreateClaimFailed { .. } => "create_claim_failed",
            Error::ClaimServerFailed { .. } => "claim_server_failed",
            Error::ClaimLockFailed { .. } => "claim_lock_failed",
            Error::ServerHeld { .. } => "server_held",
            Error::ApplyStatusFailed { .. } => "apply_status_failed",
            Error::ServerStatusFailed { .. } => "server_status_failed",
            Error::LabelNodeFailed { .. } => "label_node_failed",
            Error::PowerFailed { .. } => "power_failed",
            Error::ReadFailed { .. } => "read_failed",
            Error::LeaseFailed { .. } => "lease_failed",
            Error::NotLeading => "not_leading",
            Error::WriteContended { .. } => "write_contended",
            Error::ServeFailed { .. } => "serve_failed",
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
