//! The one error type of the crate. Variants name the step that failed;
//! messages never carry credentials or session tokens.

use std::path::PathBuf;
use std::time::Duration;

use crate::power::{PowerState, ResetType};

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The step of a BMC conversation during which something failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Discover,
    Login,
    Logout,
    ResolveSystem,
    ReadSystem,
    ReadActionInfo,
    Reset,
    PollTask,
    ConfirmState,
    ReadChassis,
    ReadWatts,
    ReadInventory,
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Step::Discover => "discovering the service root",
            Step::Login => "logging in",
            Step::Logout => "logging out",
            Step::ResolveSystem => "resolving the system",
            Step::ReadSystem => "reading the system",
            Step::ReadActionInfo => "reading the reset action info",
            Step::Reset => "sending the reset action",
            Step::PollTask => "polling the task monitor",
            Step::ConfirmState => "confirming the power state",
            Step::ReadChassis => "reading the chassis",
            Step::ReadWatts => "reading power consumption",
            Step::ReadInventory => "reading the hardware inventory",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The BMC address or system selector cannot be used.
    #[error("invalid BMC address {address:?}: {reason}")]
    InvalidAddress { address: String, reason: String },

    /// A credentials file or Secret could not be read or lacks a key.
    #[error("cannot read credentials from {}: {reason}", .path.display())]
    CredentialsUnreadable { path: PathBuf, reason: String },

    /// The TLS settings (CA bundle, ...) cannot be turned into a client.
    #[error("invalid TLS settings: {reason}")]
    TlsConfig { reason: String },

    /// No HTTP answer: connection refused or reset, DNS, TLS handshake.
    #[error("BMC unreachable while {step} ({url})")]
    Unreachable {
        step: Step,
        url: String,
        #[source]
        source: reqwest::Error,
    },

    /// The TLS handshake failed: an untrusted or mismatched certificate,
    /// or no common protocol. Not retried: it will not pass by itself.
    #[error("TLS handshake with the BMC failed while {step} ({url}): {reason}")]
    TlsHandshake { step: Step, url: String, reason: String },

    /// The BMC did not answer within the request timeout.
    #[error("BMC did not answer within {timeout:?} while {step} ({url})")]
    RequestTimedOut { step: Step, url: String, timeout: Duration },

    /// The BMC rejected the credentials (HTTP 401 or 403).
    #[error("authentication failed while {step}: the BMC answered HTTP {status}")]
    AuthFailed { step: Step, status: u16 },

    /// No system on the BMC matches the selector.
    #[error("system {selector} not found on the BMC")]
    SystemNotFound { selector: String },

    /// The BMC offers none of the reset types that would do the job.
    #[error("the BMC offers none of {wanted:?} for ComputerSystem.Reset (allowed: {allowed:?})")]
    ActionNotSupported { wanted: Vec<ResetType>, allowed: Vec<String> },

    /// The BMC answered the reset action with a client error (400, 409, ...).
    #[error("the BMC refused ResetType {reset_type} with HTTP {status}: {message}")]
    ActionRejected { reset_type: ResetType, status: u16, message: String },

    /// Any other unexpected HTTP status, after retries where they apply.
    #[error("HTTP {status} while {step} ({url}): {message}")]
    HttpStatus { step: Step, url: String, status: u16, message: String },

    /// A task monitor reported that the action failed.
    #[error("task {task} for ResetType {reset_type} ended in state {state}: {message}")]
    TaskFailed { task: String, reset_type: ResetType, state: String, message: String },

    /// A task monitor did not finish in time.
    #[error("task {task} for ResetType {reset_type} still running after {waited:?}")]
    TaskTimedOut { task: String, reset_type: ResetType, waited: Duration },

    /// The action was accepted, but the system never reached the state,
    /// even after the action was sent again.
    #[error(
        "timed out after {waited:?} waiting for power state {expected} \
         (last seen {last_seen}, {reset_type} sent {sends} time(s))"
    )]
    TimedOutWaitingForState { expected: PowerState, last_seen: PowerState, reset_type: ResetType, sends: u32, waited: Duration },

    /// The system is in a state from which the request cannot proceed safely.
    #[error("system is in power state {state}; cannot {doing}")]
    UnexpectedState { state: PowerState, doing: &'static str },

    /// A payload is not valid JSON or lacks a field of the right type.
    #[error("malformed payload from {url} at {path}: {reason}")]
    MalformedPayload { url: String, path: String, reason: String },

    /// The chassis of the system reports no power reading.
    #[error("no power reading for system {system}: {reason}")]
    WattsUnavailable { system: String, reason: String },

    /// The provider was asked about a server it does not know.
    #[error("server {name} is not in the inventory")]
    UnknownServer { name: String },
}

impl Error {
    /// A short, stable label for counting failures by kind.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::InvalidAddress { .. } => "invalid_address",
            Error::CredentialsUnreadable { .. } => "credentials_unreadable",
            Error::TlsConfig { .. } => "tls_config",
            Error::Unreachable { .. } => "unreachable",
            Error::TlsHandshake { .. } => "tls_handshake_failed",
            Error::RequestTimedOut { .. } => "request_timed_out",
            Error::AuthFailed { .. } => "auth_failed",
            Error::SystemNotFound { .. } => "system_not_found",
            Error::ActionNotSupported { .. } => "action_not_supported",
            Error::ActionRejected { .. } => "action_rejected",
            Error::HttpStatus { .. } => "http_status",
            Error::TaskFailed { .. } => "task_failed",
            Error::TaskTimedOut { .. } => "task_timed_out",
            Error::TimedOutWaitingForState { .. } => "timed_out_waiting_for_state",
            Error::UnexpectedState { .. } => "unexpected_state",
            Error::MalformedPayload { .. } => "malformed_payload",
            Error::WattsUnavailable { .. } => "watts_unavailable",
            Error::UnknownServer { .. } => "unknown_server",
        }
    }

    /// True when the error comes from the caller's input (address,
    /// credentials file, TLS files, unknown server) rather than the BMC.
    pub fn is_bad_input(&self) -> bool {
        matches!(self, Error::InvalidAddress { .. } | Error::CredentialsUnreadable { .. } | Error::TlsConfig { .. } | Error::UnknownServer { .. })
    }

    /// True for failures worth retrying the same request for: no answer,
    /// a timeout, or a server-side status that usually passes (429, 5xx).
    pub(crate) fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } | Error::RequestTimedOut { .. } => true,
            Error::HttpStatus { status, .. } => *status == 429 || *status >= 500,
            _ => false,
        }
    }
}
