//! The pure decision core of ironclaim.
//!
//! No IO, no clock, no async: the core takes a [`Snapshot`] of the world and a
//! time, and returns a plan. Every driver (the controller, the simulator,
//! `ironclaim plan`) calls the same functions.
#![forbid(unsafe_code)]

pub mod buffer;
pub mod disruption;
pub mod duration;
pub mod ffd;
pub mod gang;
pub mod identity;
pub mod labels;
pub mod model;
pub mod outcome;
pub mod predicates;
pub mod provision;
pub mod quantity;
pub mod resize;
pub mod resources;
pub mod scenario;
pub mod schedule;
pub mod sensitivity;
pub mod shapes;
pub mod topology;
pub mod transitions;
pub mod warm;

pub use labels::{LabelSelector, Labels, NodeSelectorTerm, Operator, Requirement, Taint, TaintEffect, Toleration, TolerationOperator};
pub use model::*;
pub use outcome::{NewClaim, Outcome, PodDecision, Provisioning, SupplyPath, Unschedulable};
pub use provision::provision;
pub use resources::{GPU, GPU_MILLI, Resources};
