//! Settings of one simulation run: the clock, the fault model, the
//! scheduler's scoring and the policies' knobs. Every fault probability is
//! a named field, printed at the start of a run, so that seed + settings
//! replay a run exactly.

use ironclaim_core::Seconds;
use ironclaim_core::transitions::TransitionLimits;
use ironclaim_driver::backoff::FailureBackoff;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How kube-scheduler scores the nodes that pass its filters
/// (`NodeResourcesFit` scoring strategy, on cpu and memory).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scoring {
    /// The Kubernetes default: prefer the emptiest node (spreads).
    #[default]
    LeastAllocated,
    /// Prefer the fullest node that fits (packs).
    MostAllocated,
}

impl Scoring {
    pub fn name(self) -> &'static str {
        match self {
            Scoring::LeastAllocated => "least-allocated",
            Scoring::MostAllocated => "most-allocated",
        }
    }
    pub fn other(self) -> Scoring {
        match self {
            Scoring::LeastAllocated => Scoring::MostAllocated,
            Scoring::MostAllocated => Scoring::LeastAllocated,
        }
    }
}

impl fmt::Display for Scoring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The injected faults. Probabilities are per claim attempt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Faults {
    /// The BMC refuses or drops the power-on request.
    pub bmc_error_probability: f64,
    /// The boot (PXE or local) fails.
    pub boot_failure_probability: f64,
    /// The server boots but its kubelet never registers a node.
    pub never_joins_probability: f64,
    /// A GPU server's driver validation gate fails (GPU servers only).
    pub gpu_gate_failure_probability: f64,
    /// A boot lands in the slow tail: it takes `slow_boot_factor` times
    /// its drawn duration.
    pub slow_boot_probability: f64,
    pub slow_boot_factor: f64,
    /// The BMC fails a power-off request: the server stays as it was.
    #[serde(default)]
    pub bmc_off_error_probability: f64,
    /// The BMC is cut off in the middle of a power-off: the answer is lost
    /// (an unreachable BMC), and the power-off happened or not, evenly.
    #[serde(default)]
    pub bmc_partition_probability: f64,
    /// A BMC's answer comes `slow_bmc_s` late.
    #[serde(default)]
    pub slow_bmc_probability: f64,
    #[serde(default)]
    pub slow_bmc_s: Seconds,
    /// A serving node is lost at a random time of its life: its kubelet
    /// stops (NotReady; its pods are evicted by the taint manager 300 s
    /// later), or, evenly, the Node is deleted (its pods with it).
    #[serde(default)]
    pub node_lost_probability: f64,
    /// After each effect, the controller crashes: what it held in memory is
    /// lost, answers under way go nowhere, and it restarts 5 to 60 s later
    /// from what the rack records.
    #[serde(default)]
    pub crash_probability: f64,
    /// The autoscaler's view of the pods (its watch) lags the rack by this
    /// long: binds, departures and evictions show up late. The fresh
    /// checks before a power-off read the rack itself.
    #[serde(default)]
    pub watch_lag_s: Seconds,
    /// A write to the API fails (a conflict, a refused request) and
    /// nothing is written: a take (lock, Server claim and ServerClaim), a
    /// claim's status (stage, failure, node), a server's idle record.
    #[serde(default)]
    pub api_write_failure_probability: f64,
    /// Outages of the API server start this often on average (per hour)
    /// and last up to `api_outage_max_s`: no write lands, no fresh read
    /// answers, the watch shows nothing new until it is back, and no
    /// lease is renewed.
    #[serde(default)]
    pub api_outages_per_hour: f64,
    #[serde(default)]
    pub api_outage_max_s: Seconds,
    /// With two replicas, each is cut off from the API this often on
    /// average (per hour), for up to `partition_max_s`: its renewals fail
    /// and it must stop acting; the other may take over.
    #[serde(default)]
    pub partitions_per_hour: f64,
    #[serde(default)]
    pub partition_max_s: Seconds,
    /// Each replica's wall clock is off by up to this much either way (it
    /// writes the lease's renew time by it).
    #[serde(default)]
    pub clock_skew_s: Seconds,
    /// Machines of the inventory that are already on when the run starts,
    /// not powered on by ironclaim: existing workers whose Node carries no
    /// ironclaim label (tainted, running pods nothing may disrupt). They
    /// stay for the whole run: faults that stop do not undo them.
    #[serde(default)]
    pub foreign_workers: u32,
    /// Each existing worker's image was cloned from another machine: its
    /// Node names another server of the inventory by label.
    #[serde(default)]
    pub cloned_label_probability: f64,
    /// A server's BMC reports no system UUID, so no Node links to it by
    /// its firmware.
    #[serde(default)]
    pub identity_unread_probability: f64,
    /// A node that turns Ready gets a stale twin: a NotReady Node left by
    /// an earlier install, naming the same server, with its UUID.
    #[serde(default)]
    pub stale_node_probability: f64,
    /// Faults stop at this time (liveness checks start then); None: never.
    pub faults_until_s: Option<Seconds>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            bmc_error_probability: 0.01,
            boot_failure_probability: 0.01,
            never_joins_probability: 0.005,
            gpu_gate_failure_probability: 0.02,
            slow_boot_probability: 0.02,
            slow_boot_factor: 3.0,
            ..Faults::none()
        }
    }
}

impl Faults {
    pub fn none() -> Self {
        Faults {
            bmc_error_probability: 0.0,
            boot_failure_probability: 0.0,
            never_joins_probability: 0.0,
            gpu_gate_failure_probability: 0.0,
            slow_boot_probability: 0.0,
            slow_boot_factor: 1.0,
            bmc_off_error_probability: 0.0,
            bmc_partition_probability: 0.0,
            slow_bmc_probability: 0.0,
            slow_bmc_s: 0,
            node_lost_probability: 0.0,
            crash_probability: 0.0,
            watch_lag_s: 0,
            api_write_failure_probability: 0.0,
            api_outages_per_hour: 0.0,
            api_outage_max_s: 0,
            partitions_per_hour: 0.0,
            partition_max_s: 0,
            clock_skew_s: 0,
            foreign_workers: 0,
            cloned_label_probability: 0.0,
            identity_unread_probability: 0.0,
            stale_node_probability: 0.0,
            faults_until_s: None,
        }
    }

    pub fn active_at(&self, now_s: Seconds) -> bool {
        self.faults_until_s.is_none_or(|until| now_s < until)
    }
}

impl fmt::Display for Faults {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bmc_error_probability={} boot_failure_probability={} never_joins_probability={} \
             gpu_gate_failure_probability={} slow_boot_probability={} slow_boot_factor={}",
            self.bmc_error_probability,
            self.boot_failure_probability,
            self.never_joins_probability,
            self.gpu_gate_failure_probability,
            self.slow_boot_probability,
            self.slow_boot_factor
        )?;
        // The faults the default run does not draw are printed when set.
        let extra = [
            ("bmc_off_error_probability", self.bmc_off_error_probability),
            ("bmc_partition_probability", self.bmc_partition_probability),
            ("slow_bmc_probability", self.slow_bmc_probability),
            ("node_lost_probability", self.node_lost_probability),
            ("crash_probability", self.crash_probability),
            ("api_write_failure_probability", self.api_write_failure_probability),
            ("cloned_label_probability", self.cloned_label_probability),
            ("identity_unread_probability", self.identity_unread_probability),
            ("stale_node_probability", self.stale_node_probability),
        ];
        for (name, p) in extra {
            if p > 0.0 {
                write!(f, " {name}={p}")?;
            }
        }
        if self.slow_bmc_probability > 0.0 {
            write!(f, " slow_bmc_s={}", self.slow_bmc_s)?;
        }
        if self.watch_lag_s > 0 {
            write!(f, " watch_lag_s={}", self.watch_lag_s)?;
        }
        if self.api_outages_per_hour > 0.0 {
            write!(f, " api_outages_per_hour={} api_outage_max_s={}", self.api_outages_per_hour, self.api_outage_max_s)?;
        }
        if self.partitions_per_hour > 0.0 {
            write!(f, " partitions_per_hour={} partition_max_s={}", self.partitions_per_hour, self.partition_max_s)?;
        }
        if self.clock_skew_s > 0 {
            write!(f, " clock_skew_s={}", self.clock_skew_s)?;
        }
        if self.foreign_workers > 0 {
            write!(f, " foreign_workers={}", self.foreign_workers)?;
        }
        if let Some(until) = self.faults_until_s {
            write!(f, " faults_until_s={until}")?;
        }
        Ok(())
    }
}

/// Knobs of the power policies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PolicySettings {
    /// Reactive and fixed-spares policies power a server off after it has
    /// been idle this long (cluster-autoscaler's scale-down-unneeded-time).
    pub idle_timeout_s: Seconds,
    /// Idle servers the fixed warm-spares policy keeps on.
    pub warm_spares: u32,
    /// The window over which ironclaim measures the recent arrival rate.
    pub rate_window_s: Seconds,
    /// How many standard deviations of headroom the ironclaim floor keeps
    /// above the expected demand during one cold boot.
    pub floor_z: f64,
    /// Past days the ironclaim floor's daily profile looks at; 0: none.
    #[serde(default = "default_history_days")]
    pub history_days: u32,
    /// The ironclaim floor's daily profile tells weekdays from weekends.
    #[serde(default)]
    pub weekly: bool,
}

fn default_history_days() -> u32 {
    7
}

impl Default for PolicySettings {
    fn default() -> Self {
        PolicySettings {
            idle_timeout_s: 600,
            warm_spares: 2,
            rate_window_s: ironclaim_core::AdaptiveFloor::DEFAULT_WINDOW_S,
            floor_z: 1.0,
            history_days: default_history_days(),
            weekly: false,
        }
    }
}

/// A deliberately broken rack, for showing that the checkers catch what
/// they are meant to catch. Never set by the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Broken {
    /// The rack shows the autoscaler every node as empty (a stale cache)
    /// and powers servers off without its fresh checks.
    StaleEmptyNodes,
    /// The rack shows the autoscaler no claim (servers unclaimed, no
    /// claims in flight) and grants every take, held or not.
    UnfencedTakes,
    /// The replicas judge the lease's expiry by their own wall clock
    /// against the writer's renew time, not by what they observed.
    WallClockLease,
    /// Nodes are linked to servers by their label alone, and a server on
    /// that ironclaim did not power on counts as adopted.
    LabelOnlyIdentity,
}

/// Everything that shapes a run besides the workload and the policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    pub seed: u64,
    /// The autoscaler steps on every change of the rack; with nothing
    /// changing, its scale-down looks again at the next idle threshold, at
    /// the latest this long after its last look.
    #[serde(default = "default_quiet_max_s")]
    pub quiet_max_s: Seconds,
    /// A scale-up batch closes once no pod has arrived for this long...
    pub batch_idle_s: Seconds,
    /// ...or once it has been open this long (Karpenter: 1 s and 10 s).
    pub batch_max_s: Seconds,
    pub scoring: Scoring,
    pub faults: Faults,
    /// Consecutive failures after which a server is quarantined.
    pub quarantine_after_failures: u32,
    /// First backoff after a failed attempt; doubles on each failure in a
    /// row up to `failure_backoff_max_s` (the controller's defaults).
    pub failure_backoff_s: Seconds,
    #[serde(default = "default_failure_backoff_max_s")]
    pub failure_backoff_max_s: Seconds,
    /// Time from power-off command to off.
    pub power_off_s: Seconds,
    /// Drawn durations are cut at this many times their median; longer
    /// is a fault, drawn on its own.
    pub stuck_factor: f64,
    /// End of the run; None: the workload's own end.
    pub duration_s: Option<Seconds>,
    pub policy: PolicySettings,
    /// Samples kept per time series for plots.
    pub timeline_points: usize,
    /// Also keep each server's state at each sample, for the report's
    /// replay ([`crate::engine::Timeline::states`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub record_states: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broken: Option<Broken>,
    /// Controller replicas. With more than one they elect a leader
    /// through a lease of `lease_s` and only the holder acts, as the
    /// controller does with `--leader-elect`.
    #[serde(default = "one")]
    pub replicas: u32,
    #[serde(default = "default_lease_s")]
    pub lease_s: Seconds,
    /// How often servers may change power, for every policy: the limits
    /// of the building, not of a policy.
    #[serde(default, skip_serializing_if = "TransitionLimits::is_empty")]
    pub transition_limits: TransitionLimits,
}

fn one() -> u32 {
    1
}

fn default_lease_s() -> Seconds {
    15
}

fn default_quiet_max_s() -> Seconds {
    3600
}

fn default_failure_backoff_max_s() -> Seconds {
    FailureBackoff::default().max_s
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            quiet_max_s: default_quiet_max_s(),
            batch_idle_s: 1,
            batch_max_s: 10,
            scoring: Scoring::LeastAllocated,
            faults: Faults::default(),
            quarantine_after_failures: 3,
            failure_backoff_s: FailureBackoff::default().base_s,
            failure_backoff_max_s: FailureBackoff::default().max_s,
            power_off_s: 30,
            stuck_factor: 4.0,
            duration_s: None,
            policy: PolicySettings::default(),
            timeline_points: 480,
            record_states: false,
            broken: None,
            transition_limits: TransitionLimits::default(),
            replicas: 1,
            lease_s: default_lease_s(),
        }
    }
}
