//! The sans-IO autoscaler of ironclaim: everything that happens between
//! the core's decisions, as a state machine that takes observations and
//! returns effects.
//!
//! The core ([`ironclaim_core`]) decides from a snapshot: which servers to
//! claim ([`ironclaim_core::provision`]), what to power off or drain
//! ([`ironclaim_core::disruption::disrupt`]). This crate owns the rest:
//!
//! - [`batch`]: pending pods batched by an idle and a maximum window;
//! - [`claim`]: each claim's walk from its server taken to a serving node,
//!   power retries, stuck detection from the server's measured durations,
//!   failure, power-off and release;
//! - [`backoff`]: power retries, the failed server's backoff, quarantine;
//! - [`deadline`]: slow versus stuck, per stage and server;
//! - [`drain`]: a drain from cordon to power-off, evictions paced by the
//!   API's answers, abandoned past its timeout;
//! - [`idle`], [`pacing`]: since when a server idles, re-validation of
//!   drains that evict, cool-downs after abandoned drains;
//! - [`autoscaler`]: the [`Autoscaler`] that ties them together.
//!
//! No tokio, no kube, no clock, no randomness: `now` is an input, the
//! world is read through the [`World`] trait, and every action is an
//! [`Effect`] the runner carries out and answers with a [`Report`]. The
//! controller runs it against the Kubernetes API and the BMCs; the
//! simulator runs it against a simulated rack. Both run this code.
#![forbid(unsafe_code)]

pub mod autoscaler;
pub mod backoff;
pub mod batch;
pub mod claim;
pub mod deadline;
pub mod drain;
pub mod idle;
pub mod lease;
pub mod pacing;

pub use autoscaler::{Autoscaler, DrainEnd, ScaleDownSettings, Settings};
pub use claim::{ClaimRecord, ClaimView, NodeFacts, ServerFacts};

use ironclaim_core::model::Seconds;
use serde::{Deserialize, Serialize};

/// The path from a decision to a serving node. One name per stage
/// everywhere: the variant in the API (`PoweringOn`), [`Stage::label`] in
/// metrics, logs, reports and the simulator (`powering_on`), and that with
/// spaces in prose (`powering on`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum Stage {
    /// The server is chosen; its claim is being taken.
    Selected,
    /// Power-on was requested from the BMC.
    PoweringOn,
    /// The BMC confirms the power is on; firmware, PXE and OS are running.
    Booting,
    /// The node registered with the API server.
    Joined,
    /// The node is Ready and the pool's readiness gates passed.
    Ready,
    /// The pods it was opened for are bound to it.
    Serving,
}

impl Stage {
    /// Every stage, in order.
    pub const ALL: [Stage; 6] = [Stage::Selected, Stage::PoweringOn, Stage::Booting, Stage::Joined, Stage::Ready, Stage::Serving];

    /// The stage as metrics, logs and reports name it.
    pub fn label(self) -> &'static str {
        match self {
            Stage::Selected => "selected",
            Stage::PoweringOn => "powering_on",
            Stage::Booting => "booting",
            Stage::Joined => "joined",
            Stage::Ready => "ready",
            Stage::Serving => "serving",
        }
    }

    /// The stage as the core's claims in flight know it; None once serving.
    pub fn in_flight(self) -> Option<ironclaim_core::Stage> {
        use ironclaim_core::Stage as C;
        Some(match self {
            Stage::Selected => C::Selected,
            Stage::PoweringOn => C::PoweringOn,
            Stage::Booting => C::Booting,
            Stage::Joined => C::Joined,
            Stage::Ready => C::Ready,
            Stage::Serving => return None,
        })
    }
}

/// Why a claim failed, by the step that failed. One name per reason
/// everywhere, as for [`Stage`]: the variant in the API, conditions and
/// Events, [`FailureReason::label`] in metrics and reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, schemars::JsonSchema)]
pub enum FailureReason {
    /// The server is gone, in maintenance, quarantined or held elsewhere.
    ServerUnavailable,
    /// Another claim took the server first.
    ClaimConflict,
    /// The BMC did not answer: no connection, or no answer in time.
    BmcUnreachable,
    /// The BMC refused the credentials.
    BmcAuthenticationFailed,
    /// The BMC credentials cannot be had: their Secret, or a key of it, is
    /// missing or unreadable. Configuration: not retried.
    BmcCredentialsMissing,
    /// The server's power configuration cannot work: no BMC, an unusable
    /// address, a system the BMC does not have, TLS settings that cannot
    /// connect. Configuration: not retried.
    BmcConfigInvalid,
    /// The BMC refused or failed the power action.
    PowerActionFailed,
    /// The BMC never reported the power on.
    PowerOnTimedOut,
    /// Powered on, but no node registered in time: boot, PXE or join is stuck.
    RegistrationTimedOut,
    /// The node registered but did not become Ready in time, or a serving
    /// node stayed NotReady past its grace.
    NodeNotReady,
    /// Ready, but a readiness gate did not pass in time.
    ReadinessGateFailed,
    /// The node went away after it registered.
    NodeLost,
    /// The pods it was opened for no longer need it.
    Cancelled,
}

impl FailureReason {
    /// Every reason.
    pub const ALL: [FailureReason; 13] = [
        FailureReason::ServerUnavailable,
        FailureReason::ClaimConflict,
        FailureReason::BmcUnreachable,
        FailureReason::BmcAuthenticationFailed,
        FailureReason::BmcCredentialsMissing,
        FailureReason::BmcConfigInvalid,
        FailureReason::PowerActionFailed,
        FailureReason::PowerOnTimedOut,
        FailureReason::RegistrationTimedOut,
        FailureReason::NodeNotReady,
        FailureReason::ReadinessGateFailed,
        FailureReason::NodeLost,
        FailureReason::Cancelled,
    ];

    /// A fault of configuration rather than of the machine or the network:
    /// it will not pass by itself, so it is not retried, nothing was sent
    /// to the machine, and the machine is not blamed for it.
    pub fn is_configuration(self) -> bool {
        matches!(self, FailureReason::BmcCredentialsMissing | FailureReason::BmcConfigInvalid)
    }

    /// The reason as metrics and reports label it.
    pub fn label(self) -> &'static str {
        match self {
            FailureReason::ServerUnavailable => "server_unavailable",
            FailureReason::ClaimConflict => "claim_conflict",
            FailureReason::BmcUnreachable => "bmc_unreachable",
            FailureReason::BmcAuthenticationFailed => "bmc_authentication_failed",
            FailureReason::BmcCredentialsMissing => "bmc_credentials_missing",
            FailureReason::BmcConfigInvalid => "bmc_config_invalid",
            FailureReason::PowerActionFailed => "power_action_failed",
            FailureReason::PowerOnTimedOut => "power_on_timed_out",
            FailureReason::RegistrationTimedOut => "registration_timed_out",
            FailureReason::NodeNotReady => "node_not_ready",
            FailureReason::ReadinessGateFailed => "readiness_gate_failed",
            FailureReason::NodeLost => "node_lost",
            FailureReason::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// A power action or read that failed, typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PowerFailure {
    pub reason: FailureReason,
    pub message: String,
}

/// How the API answered an eviction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Eviction {
    /// Accepted: the pod is on its way out.
    Evicted,
    /// Already gone.
    Gone,
    /// Refused for now (429: a PodDisruptionBudget says no).
    Blocked(String),
    /// The request failed; it is sent again.
    Failed(String),
}

/// A soft taint (`PreferNoSchedule`) ironclaim puts on a node, so
/// kube-scheduler puts new pods there only when no other node has room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// A node kept as a warm spare stays whole for the burst it is kept
    /// for ([`ironclaim_core::provision::SPARE_TAINT`]).
    Spare,
    /// An underutilized node empties by attrition
    /// ([`ironclaim_core::disruption::EMPTYING_TAINT`]).
    Emptying,
}

impl Mark {
    /// The key of its taint.
    pub fn taint(self) -> &'static str {
        match self {
            Mark::Spare => ironclaim_core::provision::SPARE_TAINT,
            Mark::Emptying => ironclaim_core::disruption::EMPTYING_TAINT,
        }
    }
}

/// What the runner is asked to do. Each carries what the runner needs to
/// check before it acts, so a stale decision is refused at the boundary.
#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Take `claim.server` for the claim, atomically against every other
    /// claimer, and record the claim (at [`Stage::Selected`]). Answered
    /// with [`Report::Taken`] or [`Report::Held`].
    TakeServer { claim: ClaimRecord },
    /// Power the server on. `claim` is the claim it is for; None for a
    /// warm spare, which the runner powers on only while it is unclaimed.
    /// Answered with [`Report::PoweredOn`].
    PowerOn { server: String, claim: Option<String> },
    /// Power the server off. The runner acts only if, read fresh, the
    /// server's claim is `claim` (None: unclaimed) and, when `node` is
    /// given, that node holds no pod but DaemonSet and finished ones.
    /// Answered with [`Report::PoweredOff`].
    PowerOff { server: String, claim: Option<String>, node: Option<String> },
    /// Read the server's power state. Answered with [`Report::PowerRead`].
    ReadPower { server: String },
    /// Record that the claim entered `stage`.
    EnterStage { claim: String, stage: Stage, message: String },
    /// Record the node the claim's server became, and give it its pool's labels.
    LinkNode { claim: String, server: String, node: String, pool: String },
    /// Fold one start's stage durations (power-on, boot, join, ready) into
    /// the server's measurements; its failure streak ends.
    Measure { server: String, sample: [Seconds; 4] },
    /// Record that the claim failed.
    FailClaim { claim: String, reason: FailureReason, message: String, timed_out: bool },
    /// Clear the server's claim (only if `claim` still holds it); with
    /// `count_failure`, count one more failure in a row and quarantine the
    /// server when `quarantine`. `untouched`: no power-on was ever sent for
    /// it (a fault of configuration stopped the claim first), so the
    /// `PoweringOn` its claim recorded is not so.
    Release { server: String, claim: String, count_failure: bool, quarantine: bool, untouched: bool },
    /// Delete a failed claim's record once it has been kept long enough.
    DeleteClaim { claim: String },
    /// Cordon the node and taint it as being disrupted.
    Cordon { node: String, reason: String },
    /// Evict the pod (`namespace/name`) through the Eviction API.
    /// Answered with [`Report::Evicted`].
    Evict { node: String, pod: String },
    /// Uncordon the node; `abandoned` stamps when its drain was abandoned.
    Uncordon { node: String, abandoned: bool },
    /// Drop the disrupting taint but keep the node unschedulable: its drain
    /// is over and the node is the operator's (a server in maintenance).
    KeepCordoned { node: String },
    /// Delete the Node of a server confirmed off.
    DeleteNode { node: String },
    /// Park the Node of `server`, confirmed off, instead of deleting it
    /// (its ServerPool's `nodeAfterPowerOff: Park`): it stays, cordoned
    /// and marked suspended, and counts as no node until the server boots
    /// again.
    ParkNode { node: String, server: String },
    /// Put on (`on`) or take off one of ironclaim's soft taints.
    Mark { node: String, mark: Mark, on: bool },
    /// Record since when the server idles (None clears it).
    RecordIdle { server: String, since: Option<Seconds> },
    /// Tell people: an Event on the subject (a pod `namespace/name`, a
    /// node or a server).
    Note { subject: String, reason: &'static str, message: String, warning: bool },
}

/// The answer to an effect.
#[derive(Clone, Debug, PartialEq)]
pub enum Report {
    /// The server is the claim's; `newly` when this take made it so (only
    /// then may a power-on follow).
    Taken {
        claim: String,
        newly: bool,
    },
    /// Another claim (or maintenance, quarantine) holds the server.
    Held {
        claim: String,
        holder: String,
    },
    /// Taking the server failed for another reason; nothing was taken.
    TakeFailed {
        claim: String,
        message: String,
    },
    PoweredOn {
        server: String,
        result: Result<(), PowerFailure>,
    },
    /// `refused` when the runner's fresh checks said no: nothing was sent.
    PoweredOff {
        server: String,
        result: Result<(), PowerFailure>,
        refused: Option<String>,
    },
    PowerRead {
        server: String,
        result: Result<bool, PowerFailure>,
    },
    Evicted {
        node: String,
        pod: String,
        answer: Eviction,
    },
    /// A record could not be written; the driver's next step sees the
    /// world as it is and does what is still due. `claim` names the claim
    /// whose record it was (a stage, a failure, a node link), so that claim
    /// is stepped again from what the world shows rather than waiting for a
    /// write that will never land.
    WriteFailed {
        claim: Option<String>,
        effect: String,
        message: String,
    },
}
