//! A deterministic discrete-event simulator for ironclaim.
//!
//! It runs the autoscaler that ships, [`ironclaim_driver::Autoscaler`]
//! (batching, the core's decisions, each claim's walk, drains, scale-down),
//! against a simulated rack on a virtual clock: servers boot through stages
//! with drawn durations and injected faults, and a model of kube-scheduler
//! binds pods. The power policies compared are ServerPool settings of that
//! one autoscaler. One `u64` seed drives a whole run; the same seed gives the
//! same report, byte for byte.
//!
//! Entry points: [`compare::compare`] runs every policy on one workload and
//! returns a [`report::Report`]; [`embedded::default_day`] and
//! [`trace`] build workloads; [`packing::compare_packing`] packs a static
//! trace (no times) in arrival order under every policy.
#![forbid(unsafe_code)]

pub mod check;
pub mod compare;
pub mod config;
pub mod embedded;
pub mod engine;
pub mod fit;
pub mod html;
pub mod oracle;
pub mod packing;
pub mod pareto;
pub mod policy;
pub mod report;
pub mod rng;
pub mod sample;
pub mod swarm;
pub mod trace;
pub mod workload;

pub use config::{Broken, Faults, PolicySettings, Scoring, SimConfig};
pub use engine::{FailureReason, Prepared, RunStats, run_policy};
pub use policy::PolicyKind;
pub use workload::{TracePod, TraceResize, VPA_DEFERRED_EVICT_S, Workload};
