//! What the core decided for each pending pod, and the claims it opens.

use crate::model::Seconds;
use crate::resources::Resources;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How a claim's server reaches Ready.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SupplyPath {
    /// Powered on and prepared: join and readiness only.
    Warm,
    /// Powered off: power-on, boot (PXE or local), join, readiness.
    Cold,
}

impl fmt::Display for SupplyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SupplyPath::Warm => "warm",
            SupplyPath::Cold => "cold",
        })
    }
}

/// Why a pod cannot be placed on anything the inventory can offer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Unschedulable {
    /// No server in the inventory could ever host the pod, whatever its
    /// state. `constraints` counts servers by the first constraint that
    /// rules them out, most common first.
    NoMatchingHardware { servers: usize, constraints: Vec<(String, usize)> },
    /// Servers match, but none is free now.
    AllMatchingBusy {
        matching: usize,
        in_use: usize,
        claimed_now: usize,
        failed: usize,
        quarantined: usize,
        maintenance: usize,
        unadopted: usize,
        mismatched: usize,
        /// Servers whose power provider's configuration is broken.
        misconfigured: usize,
    },
    /// A free matching server exists, but opening it would cross a ServerPool
    /// limit.
    PoolLimit { pool: String, limit: String },
    /// A free matching server exists, but powering it on would cross the
    /// fleet's power budget.
    PowerBudget { budget_watts: f64, needed_watts: f64 },
    /// A free matching server exists, but its group has started as many
    /// power changes this minute as its transition rate allows: the pod is
    /// decided again once one leaves the minute.
    TransitionRate { refusal: crate::transitions::Refusal },
    /// A free matching server exists, but an inter-pod constraint rules
    /// every one of them out.
    Topology { constraint: String },
    /// A member of a gang that cannot be placed whole: `unplaced` of its
    /// `of` pending pods fit nowhere, the first for `why`.
    Gang { gang: String, unplaced: usize, of: usize, why: String },
}

impl Unschedulable {
    /// A stable label for metrics and grouping.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Unschedulable::NoMatchingHardware { .. } => "no_matching_hardware",
            Unschedulable::AllMatchingBusy { .. } => "all_matching_busy",
            Unschedulable::PoolLimit { .. } => "pool_limit",
            Unschedulable::PowerBudget { .. } => "power_budget",
            Unschedulable::TransitionRate { .. } => "transition_rate",
            Unschedulable::Topology { .. } => "topology",
            Unschedulable::Gang { .. } => "gang",
        }
    }
}

impl fmt::Display for Unschedulable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unschedulable::NoMatchingHardware { servers: 0, .. } => {
                write!(f, "fits no Ready node, and the inventory has no server to open")
            }
            Unschedulable::NoMatchingHardware { servers, constraints } => {
                write!(f, "no hardware in the inventory matches: 0 of {servers} servers")?;
                let parts: Vec<String> = constraints.iter().map(|(c, n)| format!("{n} fail {c}")).collect();
                if !parts.is_empty() {
                    write!(f, " ({})", parts.join("; "))?;
                }
                Ok(())
            }
            Unschedulable::AllMatchingBusy {
                matching,
                in_use,
                claimed_now,
                failed,
                quarantined,
                maintenance,
                unadopted,
                mismatched,
                misconfigured,
            } => {
                write!(f, "no matching spare: 0 of {matching} matching servers free (")?;
                let mut parts = Vec::new();
                for (n, what) in [
                    (*in_use, "in use"),
                    (*claimed_now, "claimed by this plan"),
                    (*failed, "failed"),
                    (*quarantined, "quarantined"),
                    (*maintenance, "in maintenance"),
                    (*unadopted, "not adopted"),
                    (*mismatched, "in identity mismatch"),
                    (*misconfigured, "with a broken BMC configuration"),
                ] {
                    if n > 0 {
                        parts.push(format!("{n} {what}"));
                    }
                }
                write!(f, "{})", parts.join(", "))
            }
            Unschedulable::PoolLimit { pool, limit } => write!(f, "ServerPool {pool} limit reached: {limit}"),
            Unschedulable::PowerBudget { budget_watts, needed_watts } => {
                write!(f, "power budget reached: powering on needs {needed_watts:.0} W more than the {budget_watts:.0} W budget allows")
            }
            Unschedulable::TransitionRate { refusal } => write!(f, "{refusal}"),
            Unschedulable::Topology { constraint } => {
                write!(f, "free servers match, but {constraint} rules them all out")
            }
            Unschedulable::Gang { gang, unplaced, of, why } => {
                write!(f, "all or nothing for {gang}: {unplaced} of its {of} pods cannot be placed ({why}); no server is powered on for it")
            }
        }
    }
}

/// Where one pending pod goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// It fits a Ready node now: it should already schedule, so capacity or
    /// request accounting is stale. No hardware is bought for it.
    Existing {
        node: String,
    },
    /// It fits a claim already in flight.
    InFlight {
        claim: String,
        server: String,
        eta_s: Seconds,
    },
    /// It needs a new claim: this server, on this path.
    NewClaim {
        claim: String,
        server: String,
        path: SupplyPath,
        eta_s: Seconds,
        deadline_missed: bool,
    },
    Unschedulable {
        reason: Unschedulable,
    },
}

impl Outcome {
    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Existing { .. } => "existing",
            Outcome::InFlight { .. } => "in_flight",
            Outcome::NewClaim { .. } => "new_claim",
            Outcome::Unschedulable { .. } => "unschedulable",
        }
    }

    pub fn eta_s(&self) -> Option<Seconds> {
        match self {
            Outcome::Existing { .. } => Some(0),
            Outcome::InFlight { eta_s, .. } | Outcome::NewClaim { eta_s, .. } => Some(*eta_s),
            Outcome::Unschedulable { .. } => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodDecision {
    /// namespace/name
    pub pod: String,
    pub workload: Option<String>,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// The pod runs and waits for an in-place resize its node did not
    /// apply: the decision is for the pod at its new size, elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<crate::resize::ResizeWait>,
}

/// A ServerClaim the plan opens: one server for a set of pending pods.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NewClaim {
    pub name: String,
    pub server: String,
    pub pool: String,
    pub pods: Vec<String>,
    pub path: SupplyPath,
    pub eta_s: Seconds,
    /// What its pods request, DaemonSet overhead included.
    pub requested: Resources,
    pub capacity: Resources,
    /// Added draw once it idles: zero for a warm server already on.
    pub added_idle_watts: f64,
    pub deadline_missed: bool,
}

/// The scale-up half of a plan.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Provisioning {
    pub pods: Vec<PodDecision>,
    pub claims: Vec<NewClaim>,
}

impl Provisioning {
    pub fn decision(&self, pod_key: &str) -> Option<&PodDecision> {
        self.pods.iter().find(|d| d.pod == pod_key)
    }
}
