//! The autoscaler: batching and the core's scale-up decision, each claim's
//! walk, the core's scale-down decision paced and carried out, and the
//! idle clocks, over one [`World`], as effects.
//!
//! # How a runner drives it
//! Call [`Autoscaler::step`] whenever the world changed or
//! [`Autoscaler::next_wake`] has come; carry out every [`Effect`] it
//! returns, and hand each answer back with [`Autoscaler::report`]. What the
//! autoscaler keeps between steps is soft: power actions under way, retry
//! times, the batch, idle clocks, drains. A runner that restarts builds a
//! new one, and it carries on from what the world records.
//!
//! # Guarantees
//! - One power action per server at a time: a server with an action under
//!   way (a claim's, a spare's or a drain's) is given no other.
//! - What is under way counts in the next decision: a drained node is
//!   disrupting, a spare being powered on or off is in its new state, a
//!   server being taken is claimed.
//! - A drain that evicts workload starts only when re-proposed after
//!   [`ScaleDownSettings::revalidate_after`]; a node whose drain was
//!   abandoned is held for [`ScaleDownSettings::cool_down`], counted from
//!   the world's stamp or from this autoscaler's own record, whichever ends
//!   later: a stamp not yet seen, or lost with its write, shortens nothing.
//! - A node tainted as disrupting that no drain of this autoscaler owns
//!   (a drain cut short by a restart) is uncordoned only once its server's
//!   BMC, read fresh, says it is on: a power-off that may be under way (a
//!   BMC cut off in the middle of it) keeps it cordoned, read again every
//!   [`UNCORDON_READ_AGAIN_S`] seconds. A drain this autoscaler abandoned
//!   is not one cut short: its own uncordon is on its way, and the node is
//!   left to it for [`UNCORDON_IN_FLIGHT_S`] seconds.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// How long a node left cordoned by a drain cut short waits before its
/// server's power is read again, after a read that did not find it on.
pub const UNCORDON_READ_AGAIN_S: u64 = 30;

/// How long the node of a drain abandoned here is left to that drain's own
/// uncordon before, still cordoned, it is taken for one cut short.
pub const UNCORDON_IN_FLIGHT_S: u64 = 60;

use ironclaim_core::disruption::{Action, disrupt};
use ironclaim_core::model::{ClaimInFlight, NodeAfterPowerOff, Pod, PowerChange, PowerState, Seconds, Snapshot};
use ironclaim_core::provision;
use ironclaim_core::provision::SPARE_TAINT;
use ironclaim_core::transitions::RATE_WINDOW_S;

use crate::backoff::FailureBackoff;
use crate::batch::{Batcher, Windows};
use crate::claim::{self, ClaimIo, ClaimRecord, ClaimSettings, ClaimView, Io};
use crate::drain::{Drain, DrainSettings, Ended};
use crate::idle::IdleClock;
use crate::pacing::{self, Settling};
use crate::{Effect, Mark, Report, Stage};

/// What the autoscaler reads of the world. Every method is a read of what
/// the runner holds now (an index fed by watches, or the simulated rack).
pub trait World {
    /// Keys (`namespace/name`) of the pods waiting for a node, or for a
    /// node that can give them an in-place resize ([`Pod::is_demand`]).
    fn pending(&self) -> Vec<String>;
    /// The core's snapshot: nodes, pods, pools, PDBs, servers (power
    /// state, health as recorded: healthy, quarantined or maintenance;
    /// failures in a row; claim and node), claims in flight and recent
    /// arrivals. `scale_up` is Some(pods to place) when the snapshot is
    /// for [`provision`] alone, which lets a runner pass only as many free
    /// servers of each kind as it could open claims on.
    fn snapshot(&self, scale_up: Option<usize>) -> Snapshot;
    /// Every claim the world records, failed ones included.
    fn claims(&self) -> Vec<ClaimView>;
    /// When the server's last claim failed.
    fn last_failure_s(&self, server: &str) -> Option<Seconds>;
    /// Nodes whose last drain was abandoned, and when.
    fn abandoned_drains(&self) -> Vec<(String, Seconds)>;
    /// Per server: its recorded idle time, and the latest known start of
    /// business (its claim written, its node registered).
    fn recorded_idle(&self, server: &str) -> (Option<Seconds>, Option<Seconds>);
    /// The pods on a node, as fresh as the runner can read them.
    fn pods_on(&self, node: &str) -> Vec<Pod>;
}

/// The knobs of scale-down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScaleDownSettings {
    /// How often the core's scale-down is asked.
    pub every: Duration,
    /// A drain that evicts workload starts only when proposed again at
    /// least this long after its first proposal.
    pub revalidate_after: Duration,
    /// A node whose drain was abandoned is not drained again for this long.
    pub cool_down: Duration,
    pub drain: DrainSettings,
    /// Some(cap): a runner that calls [`Autoscaler::changed`] on every
    /// change of the world. After a pass that started nothing, the next is
    /// due at the next change or answer, when an idle server passes its
    /// threshold, a cool-down ends, a proposal is due again or an arrival
    /// leaves its warm floor's window, and at the latest `cap` later.
    /// None: a pass every `every`.
    pub quiet_max: Option<Duration>,
}

impl Default for ScaleDownSettings {
    fn default() -> Self {
        ScaleDownSettings {
            every: Duration::from_secs(2),
            revalidate_after: Duration::from_secs(15),
            cool_down: Duration::from_secs(600),
            drain: DrainSettings::default(),
            quiet_max: None,
        }
    }
}

/// The knobs of the autoscaler.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub windows: Windows,
    /// Pending pods are decided again this often even with no new one.
    pub redecide_every: Duration,
    /// Some(cap): a runner that calls [`Autoscaler::changed`] on every
    /// change of the world. Pods the last decision found no server for, or
    /// only one already on its way, wait for a change, an answer or the end
    /// of a server's failure backoff before they are decided again (at
    /// least `redecide_every` and at most `cap` after the last decision):
    /// nothing else can change that answer. None: every `redecide_every`.
    pub redecide_quiet_max: Option<Duration>,
    /// How often every claim is reconciled without a change. Zero: every
    /// step reconciles every claim, and [`Autoscaler::next_wake`] is the
    /// next time a claim has something due (for a runner that steps on
    /// every change of the world).
    pub reconcile_every: Duration,
    pub claims: ClaimSettings,
    pub backoff: FailureBackoff,
    /// None: no scale-down (a runner that powers servers off its own way).
    pub scale_down: Option<ScaleDownSettings>,
    /// Seeds claim names, so two runs never share one.
    pub name_seed: u64,
    /// Whether [`Effect::Note`]s are emitted for held scale-down.
    pub held_notes: bool,
    /// Whether each decision tells every pending pod what was decided for
    /// it (a server claimed, one already on its way, none that fits), as
    /// [`Effect::Note`]s on the pod.
    pub decision_notes: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            windows: Windows::default(),
            redecide_every: Duration::from_secs(30),
            redecide_quiet_max: None,
            reconcile_every: Duration::from_secs(1),
            claims: ClaimSettings::default(),
            backoff: FailureBackoff::default(),
            scale_down: Some(ScaleDownSettings::default()),
            name_seed: 0,
            held_notes: true,
            decision_notes: false,
        }
    }
}

/// A warm-spare power action under way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SpareOp {
    On,
    Off,
}

/// What the autoscaler counts, for reports and metrics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub decisions: u64,
    /// Scale-down passes: the core's `disrupt` asked.
    pub scale_down_passes: u64,
    pub claims_opened: u64,
    pub drains_started: u64,
    pub drains_done: u64,
    pub drains_abandoned: u64,
    /// Spares powered on, and those opened a claim of no pods to be Ready
    /// nodes (counted when the claim is opened).
    pub spares_powered_on: u64,
    pub spares_powered_off: u64,
}

impl Counters {
    /// Both counts added: what two processes did between them.
    pub fn plus(&self, o: &Counters) -> Counters {
        Counters {
            decisions: self.decisions + o.decisions,
            scale_down_passes: self.scale_down_passes + o.scale_down_passes,
            claims_opened: self.claims_opened + o.claims_opened,
            drains_started: self.drains_started + o.drains_started,
            drains_done: self.drains_done + o.drains_done,
            drains_abandoned: self.drains_abandoned + o.drains_abandoned,
            spares_powered_on: self.spares_powered_on + o.spares_powered_on,
            spares_powered_off: self.spares_powered_off + o.spares_powered_off,
        }
    }
}

/// A drain that ended, for a runner's metrics: the node, why it was
/// drained (`empty`, `underutilized`, `maintenance`) and how it ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DrainEnd {
    pub node: String,
    pub reason: String,
    pub ended: Ended,
}

/// The autoscaler's soft state. See the module docs.
#[derive(Debug)]
pub struct Autoscaler {
    settings: Settings,
    batcher: Batcher,
    last_decision: Option<Duration>,
    /// Claims being taken: not in the world yet, already the core's.
    taking: BTreeMap<String, ClaimRecord>,
    claims: BTreeMap<String, ClaimIo>,
    /// The live claims at the last step: one gone or failed re-plans.
    live: BTreeSet<String>,
    /// The stage (and failure) each claim was last written at, until the
    /// world shows it: an older view is stale and waits.
    written: BTreeMap<String, (bool, Stage)>,
    /// Each claim's record writes refused in a row (an API outage, a
    /// conflict), and when it is stepped again to write once more.
    write_failures: BTreeMap<String, (u32, Duration, (bool, Stage))>,
    /// Nodes left cordoned by a drain cut short, by server: whether a read
    /// of its power is under way, and when it may be read again.
    uncordon_reads: BTreeMap<String, UncordonRead>,
    spares: BTreeMap<String, SpareOp>,
    drains: BTreeMap<String, Drain>,
    /// Nodes whose drain this autoscaler abandoned, and the second it did
    /// (rounded up), kept until their cool-down is over.
    abandoned: BTreeMap<String, Seconds>,
    /// Drains ended since the runner last took them ([`Autoscaler::drain_ends`]).
    ended: Vec<DrainEnd>,
    /// Servers whose drain's power-off was confirmed.
    confirmed_off: BTreeSet<String>,
    /// The claim each server's claim actions belong to.
    server_claims: BTreeMap<String, String>,
    /// When each claim next has something due with nothing changed.
    claim_due: BTreeMap<String, Duration>,
    idle: IdleClock,
    settling: Settling,
    next_scale_down: Duration,
    last_scale_down: Option<Duration>,
    next_reconcile: Duration,
    names: u64,
    /// Pods were pending at the last step: they are decided again
    /// `redecide_every` after the last decision.
    waiting: bool,
    /// At the last decision every pending pod was waiting for a claim in
    /// flight or had one opened: asking again, with no new pod and no
    /// claim lost, would decide the same.
    settled: bool,
    /// At the last decision no pending pod could be helped but by a change
    /// of the world or the end of a backoff: every one was unschedulable,
    /// waiting for a claim in flight or given one.
    quiet: bool,
    /// Nothing changed and no answer came since the last decision.
    unchanged: bool,
    /// The first end of a failure backoff after the last decision.
    backoff_ends: Option<Seconds>,
    pub counters: Counters,
    /// Pending pods by what the latest decision found for them.
    pending_by_decision: BTreeMap<&'static str, usize>,
    /// Power actions sent in the last minute, by server: they count toward
    /// the transition rates until the world's record shows them.
    sent: BTreeMap<String, Vec<PowerChange>>,
}

/// What a pending pod is told of the decision about it.
fn decision_note(d: &ironclaim_core::outcome::PodDecision) -> Option<Effect> {
    use ironclaim_core::outcome::Outcome;
    let (reason, message, warning) = match (&d.outcome, &d.resize) {
        (Outcome::Existing { .. }, None) => return None,
        (Outcome::Existing { node }, Some(_)) => ("ResizeFits", format!("node {node} has the room once the pod is moved"), false),
        (Outcome::Unschedulable { reason }, _) => ("NotProvisionable", reason.to_string(), true),
        (Outcome::NewClaim { server, path, eta_s, .. }, None) => {
            ("ServerClaimed", format!("claimed server {server} ({path}); usually ready in {}", claim::human(*eta_s)), false)
        }
        (Outcome::NewClaim { server, path, eta_s, .. }, Some(_)) => {
            ("ServerClaimed", format!("server {server} powering on ({path}); usually ready in {}", claim::human(*eta_s)), false)
        }
        (Outcome::InFlight { server, eta_s, .. }, _) => {
            ("WaitingForServer", format!("waiting for server {server}, already on its way; ready in about {}", claim::human(*eta_s)), false)
        }
    };
    // A pod waiting for a resize: which one, first.
    let message = match &d.resize {
        Some(wait) => format!("{wait}; {message}"),
        None => message,
    };
    Some(Effect::Note { subject: d.pod.clone(), reason, message, warning })
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A node left cordoned by a drain cut short, waiting for its server's
/// power to be read on.
#[derive(Clone, Debug)]
struct UncordonRead {
    node: String,
    asked: bool,
    again_at: Duration,
}

impl Autoscaler {
    pub fn new(settings: Settings) -> Self {
        Autoscaler {
            batcher: Batcher::new(settings.windows),
            settings,
            last_decision: None,
            taking: BTreeMap::new(),
            claims: BTreeMap::new(),
            live: BTreeSet::new(),
            written: BTreeMap::new(),
            write_failures: BTreeMap::new(),
            uncordon_reads: BTreeMap::new(),
            spares: BTreeMap::new(),
            drains: BTreeMap::new(),
            ended: Vec::new(),
            confirmed_off: BTreeSet::new(),
            server_claims: BTreeMap::new(),
            claim_due: BTreeMap::new(),
            idle: IdleClock::default(),
            settling: Settling::default(),
            abandoned: BTreeMap::new(),
            next_scale_down: Duration::ZERO,
            last_scale_down: None,
            next_reconcile: Duration::ZERO,
            names: 0,
            waiting: false,
            settled: false,
            quiet: false,
            unchanged: false,
            backoff_ends: None,
            counters: Counters::default(),
            pending_by_decision: BTreeMap::new(),
            sent: BTreeMap::new(),
        }
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Drops what this process believed while it acted (it lost the lease):
    /// whoever acts next starts from what the world records.
    pub fn forget(&mut self) {
        let settings = self.settings.clone();
        let counters = std::mem::take(&mut self.counters);
        let names = self.names;
        *self = Autoscaler::new(settings);
        self.names = names;
        self.counters = counters;
    }

    /// Pending pods by what the latest decision found for them: an
    /// outcome's label (`existing`, `in_flight`, `new_claim`) or the reason
    /// a pod cannot be placed (`all_matching_busy`, ...). Empty while no
    /// pod is pending.
    pub fn pending_by_decision(&self) -> &BTreeMap<&'static str, usize> {
        &self.pending_by_decision
    }

    /// The next time a step is due with no change in the world.
    pub fn next_wake(&self) -> Duration {
        let mut at = if self.settings.reconcile_every.is_zero() { Duration::MAX } else { self.next_reconcile };
        if let Some(due) = self.claim_due.values().min() {
            at = at.min(*due);
        }
        if let Some(due) = self.batcher.due_at() {
            at = at.min(due);
        }
        if let Some(due) = self.redecide_at() {
            at = at.min(due);
        }
        if self.settings.scale_down.is_some() {
            at = at.min(self.next_scale_down);
        }
        for d in self.drains.values() {
            at = at.min(d.next_at());
        }
        at
    }

    /// Tells the autoscaler the world changed (see
    /// [`ScaleDownSettings::quiet_max`]): a scale-down pass is due `every`
    /// after the last one, or now.
    pub fn changed(&mut self, now: Duration) {
        self.unchanged = false;
        let every = self.settings.scale_down.map_or(Duration::ZERO, |sd| sd.every);
        let due = self.last_scale_down.map_or(now, |at| (at + every).max(now));
        self.next_scale_down = self.next_scale_down.min(due);
    }

    /// The drains that ended since the last call, oldest first. Kept at
    /// most 1024 deep: a runner that never asks loses the oldest.
    pub fn drain_ends(&mut self) -> Vec<DrainEnd> {
        std::mem::take(&mut self.ended)
    }

    fn record_end(&mut self, node: &str, reason: &str, ended: Ended) {
        if self.ended.len() >= 1024 {
            self.ended.remove(0);
        }
        self.ended.push(DrainEnd { node: node.to_string(), reason: reason.to_string(), ended });
    }

    /// Starts draining `node`, whose server is in maintenance, for the
    /// runner's repair of a claim stranded on it: cordoned, its pods
    /// evicted as in any drain, then its server released and the node left
    /// cordoned, the server on (the operator's). Returns false, doing
    /// nothing, when scale-down is off, the node is already being drained
    /// or its server has a power action under way.
    pub fn drain_for_maintenance(&mut self, world: &dyn World, node: &str, server: &str, timeout: Duration, now: Duration) -> Vec<Effect> {
        let Some(sd) = self.settings.scale_down else { return Vec::new() };
        if self.drains.contains_key(node) || self.busy(server) {
            return Vec::new();
        }
        let mut d = Drain::new(node, Some(server), "maintenance", BTreeSet::new(), timeout, &sd.drain, now).without_power_off();
        let (effects, _) = d.step(&world.pods_on(node), None, false, now);
        self.drains.insert(node.to_string(), d);
        self.counters.drains_started += 1;
        effects
    }

    /// Whether the server has a power action under way here.
    pub fn busy(&self, server: &str) -> bool {
        self.spares.contains_key(server) || self.drains.values().any(|d| d.server.as_deref() == Some(server) && d.powering_off())
    }

    /// A fresh claim name, `POOL-SERVER-xxxxx`.
    fn claim_name(&mut self, pool: &str, server: &str, now: Duration) -> String {
        self.names += 1;
        claim::claim_name(pool, server, mix(self.settings.name_seed ^ mix(now.as_nanos() as u64 ^ mix(self.names))))
    }

    /// Takes the answer to an effect.
    pub fn report(&mut self, report: Report, now: Duration) -> Vec<Effect> {
        let out = self.report_inner(report, now);
        self.note_sent(&out, now.as_secs());
        out
    }

    fn report_inner(&mut self, report: Report, now: Duration) -> Vec<Effect> {
        let mut out = Vec::new();
        self.unchanged = false;
        if matches!(
            report,
            Report::Taken { .. } | Report::Held { .. } | Report::TakeFailed { .. } | Report::PoweredOn { .. } | Report::PoweredOff { .. }
        ) {
            // A server is free of what was under way here: scale-down may
            // look at it again.
            self.changed(now);
        }
        match report {
            Report::Taken { claim, newly } => {
                if let Some(record) = self.taking.remove(&claim) {
                    let io = self.claims.entry(claim.clone()).or_default();
                    if newly {
                        io.running = Some(Io::PowerOn);
                        out.push(Effect::PowerOn { server: record.server.clone(), claim: Some(claim.clone()) });
                    }
                    out.push(Effect::EnterStage {
                        claim: claim.clone(),
                        stage: Stage::PoweringOn,
                        message: format!("server {} taken", record.server),
                    });
                    self.written.insert(claim, (false, Stage::PoweringOn));
                }
            }
            Report::Held { claim, holder } => {
                if self.taking.remove(&claim).is_some() {
                    out.push(Effect::FailClaim {
                        claim: claim.clone(),
                        reason: crate::FailureReason::ClaimConflict,
                        message: format!("the server is held by {holder}"),
                        timed_out: false,
                    });
                    self.written.insert(claim, (true, Stage::Selected));
                    self.batcher.forget();
                }
            }
            Report::TakeFailed { claim, .. } => {
                self.taking.remove(&claim);
                self.batcher.forget();
            }
            Report::PoweredOn { server, result } => {
                if self.spares.get(&server) == Some(&SpareOp::On) {
                    self.spares.remove(&server);
                    if result.is_ok() {
                        self.counters.spares_powered_on += 1;
                    }
                } else if let Some(io) = self.claim_io_of(&server) {
                    io.running = None;
                    io.finished = Some((Io::PowerOn, result.map(|()| true)));
                }
            }
            Report::PoweredOff { server, result, refused } => {
                if self.spares.get(&server) == Some(&SpareOp::Off) {
                    self.spares.remove(&server);
                    if result.is_ok() && refused.is_none() {
                        self.counters.spares_powered_off += 1;
                    }
                } else if let Some(d) = self.drains.values_mut().find(|d| d.server.as_deref() == Some(server.as_str()) && d.powering_off()) {
                    let drain_settings = self.settings.scale_down.map(|s| s.drain).unwrap_or_default();
                    if let Some(note) = d.powered_off(&result, refused.as_deref(), &drain_settings, now) {
                        out.push(Effect::Note { subject: server.clone(), reason: "PowerOffFailed", message: note, warning: true });
                    }
                    if result.is_ok() && refused.is_none() {
                        self.confirmed_off.insert(server);
                    }
                } else if let Some(io) = self.claim_io_of(&server) {
                    io.running = None;
                    let result = match (result, refused) {
                        (Ok(()), None) => Ok(false),
                        (Err(e), _) => Err(e),
                        (Ok(()), Some(why)) => {
                            Err(crate::PowerFailure { reason: crate::FailureReason::PowerActionFailed, message: format!("power-off refused: {why}") })
                        }
                    };
                    io.finished = Some((Io::PowerOff, result));
                }
            }
            Report::PowerRead { server, result } => {
                if let Some(read) = self.uncordon_reads.get_mut(&server).filter(|r| r.asked) {
                    read.asked = false;
                    if result == Ok(true) {
                        let node = read.node.clone();
                        self.uncordon_reads.remove(&server);
                        out.push(Effect::Uncordon { node: node.clone(), abandoned: false });
                        out.push(Effect::Note {
                            subject: node,
                            reason: "DrainAbandoned",
                            message: format!("a drain cut short by a restart: uncordoned, server {server} read on"),
                            warning: false,
                        });
                    } else {
                        read.again_at = now + Duration::from_secs(UNCORDON_READ_AGAIN_S);
                    }
                } else if let Some(io) = self.claim_io_of(&server) {
                    io.running = None;
                    io.finished = Some((Io::Read, result));
                }
            }
            Report::Evicted { node, pod, answer } => {
                let drain_settings = self.settings.scale_down.map(|s| s.drain).unwrap_or_default();
                if let Some(d) = self.drains.get_mut(&node) {
                    d.evicted(&pod, &answer, &drain_settings);
                }
            }
            Report::WriteFailed { claim: Some(claim), .. } => {
                // The write will never show in the world: step the claim
                // again from what the world does show, after a wait that
                // doubles while writes keep failing (an API outage).
                if let Some(wanted) = self.written.remove(&claim) {
                    let w = self.write_failures.entry(claim.clone()).or_insert((0, now, wanted));
                    w.0 += 1;
                    w.1 = now + claim::write_again_after(w.0);
                    w.2 = wanted;
                    self.claim_due.insert(claim, w.1);
                }
            }
            Report::WriteFailed { claim: None, .. } => {}
        }
        out
    }

    /// The soft state of the live claim on `server` whose action is under
    /// way; an answer to it is due at the next step.
    fn claim_io_of(&mut self, server: &str) -> Option<&mut ClaimIo> {
        let name = self.server_claims.get(server)?.clone();
        self.claim_due.insert(name.clone(), Duration::ZERO);
        self.claims.get_mut(&name)
    }

    /// When pending pods are next decided again with nothing new pending:
    /// `redecide_every` after the last decision, or, stepped on change
    /// after a quiet decision with nothing changed since, when a backoff
    /// ends or `cap` has passed. None while nothing waits.
    fn redecide_at(&self) -> Option<Duration> {
        let last = self.last_decision.filter(|_| self.waiting)?;
        let every = last + self.settings.redecide_every;
        match self.settings.redecide_quiet_max {
            Some(cap) if self.quiet && self.unchanged => {
                let backoff = self.backoff_ends.map_or(Duration::MAX, Duration::from_secs);
                Some(every.max(backoff.min(last + cap)))
            }
            _ => Some(every),
        }
    }

    /// Marks in `snap` what is under way here: servers being taken are
    /// claimed (their pods the claim's), spares being powered on or off
    /// are in their new state, drained nodes are disrupting; and servers
    /// still waiting out a failure's backoff are not chosen. Returns when
    /// the first of those backoffs ends.
    fn prepare(&self, snap: &mut Snapshot, world: &dyn World, now_s: Seconds) -> Option<Seconds> {
        let backoff_ends = self.settings.backoff.apply(snap, |s| world.last_failure_s(s), now_s);
        for s in snap.servers.iter_mut() {
            if let Some(record) = self.taking.values().find(|r| r.server == s.name) {
                s.claim = Some(record.name.clone());
            }
            match self.spares.get(&s.name) {
                Some(SpareOp::On) => {
                    s.power_state = PowerState::On;
                    s.powering_on = true;
                }
                Some(SpareOp::Off) => s.power_state = PowerState::Off,
                None => {}
            }
        }
        for r in self.taking.values() {
            if !snap.claims.iter().any(|c| c.name == r.name) {
                snap.claims.push(ClaimInFlight {
                    name: r.name.clone(),
                    server: r.server.clone(),
                    pool: r.pool.clone(),
                    stage: ironclaim_core::Stage::Selected,
                    stage_started_s: r.stage_started_s,
                    pods: r.pods.clone(),
                });
            }
        }
        if !snap.transition_limits.is_empty() {
            self.count_changes(snap);
        }
        let draining: BTreeSet<&str> = self.drains.values().filter_map(|d| d.server.as_deref()).collect();
        for n in snap.nodes.iter_mut() {
            if self.drains.contains_key(&n.name) || n.server.as_deref().is_some_and(|s| draining.contains(s)) {
                n.disrupting = true;
            }
        }
        backoff_ends
    }

    /// Adds to each server's recorded power changes those the world does
    /// not show yet: actions sent here in the last minute, and changes
    /// decided and not sent (a cold server being taken, a drain that will
    /// power its server off), at the time they were decided.
    fn count_changes(&self, snap: &mut Snapshot) {
        let mut planned: BTreeMap<&str, PowerChange> = BTreeMap::new();
        for r in self.taking.values() {
            planned.insert(r.server.as_str(), PowerChange { at_s: r.created_s, on: true });
        }
        for d in self.drains.values().filter(|d| d.power_off && !d.powering_off()) {
            if let Some(server) = d.server.as_deref() {
                planned.insert(server, PowerChange { at_s: d.started.as_secs(), on: false });
            }
        }
        for s in snap.servers.iter_mut() {
            let shown = |c: &PowerChange, record: &[PowerChange]| record.iter().any(|w| w.on == c.on && w.at_s + 5 >= c.at_s);
            let mut add: Vec<PowerChange> = Vec::new();
            for c in self.sent.get(&s.name).into_iter().flatten() {
                if !shown(c, &s.power_changes) {
                    add.push(*c);
                }
            }
            if let Some(c) = planned.get(s.name.as_str()) {
                let is_on = s.power_state == PowerState::On && !s.powering_on;
                if c.on != is_on && !add.iter().any(|a| a.on == c.on) && !shown(c, &s.power_changes) {
                    add.push(*c);
                }
            }
            if !add.is_empty() {
                s.power_changes.extend(add);
                s.power_changes.sort_by_key(|c| c.at_s);
            }
        }
    }

    /// Notes the power actions among `effects`, sent at `now_s`.
    fn note_sent(&mut self, effects: &[Effect], now_s: Seconds) {
        self.sent.retain(|_, v| {
            v.retain(|c| now_s.saturating_sub(c.at_s) < RATE_WINDOW_S);
            !v.is_empty()
        });
        for e in effects {
            let (server, on) = match e {
                Effect::PowerOn { server, .. } => (server, true),
                Effect::PowerOff { server, .. } => (server, false),
                _ => continue,
            };
            self.sent.entry(server.clone()).or_default().push(PowerChange { at_s: now_s, on });
        }
    }

    /// One step at `now`. See the module docs.
    pub fn step(&mut self, world: &dyn World, now: Duration) -> Vec<Effect> {
        let out = self.step_inner(world, now);
        self.note_sent(&out, now.as_secs());
        out
    }

    fn step_inner(&mut self, world: &dyn World, now: Duration) -> Vec<Effect> {
        let now_s = now.as_secs();
        let mut out = Vec::new();

        // Each claim a step further.
        let views = world.claims();
        let mut live = BTreeSet::new();
        let mut holders: BTreeMap<String, String> = BTreeMap::new();
        let mut present = BTreeSet::new();
        let reconcile = now >= self.next_reconcile;
        if reconcile {
            self.next_reconcile = now + self.settings.reconcile_every;
        }
        for v in &views {
            let name = v.record.name.clone();
            present.insert(name.clone());
            if v.record.failure.is_none() {
                live.insert(name.clone());
                if v.server.as_ref().is_some_and(|s| s.holder.as_deref() == Some(name.as_str())) {
                    holders.insert(v.record.server.clone(), name.clone());
                }
            }
            if let Some(&written) = self.written.get(&name) {
                if (v.record.failure.is_some(), v.record.stage) < written {
                    continue;
                }
                self.written.remove(&name);
                self.write_failures.remove(&name);
            }
            if self.taking.contains_key(&name) {
                continue;
            }
            if let Some(&(_, at, wanted)) = self.write_failures.get(&name) {
                if (v.record.failure.is_some(), v.record.stage) >= wanted {
                    self.write_failures.remove(&name);
                } else if now < at {
                    self.claim_due.insert(name.clone(), at);
                    continue;
                }
            }
            let io = self.claims.entry(name.clone()).or_default();
            if !reconcile && io.finished.is_none() {
                continue;
            }
            // Power answers for a server go to the claim that holds it, not
            // to a failed claim of the same server kept for its record.
            if v.server.as_ref().is_some_and(|s| s.holder.as_deref() == Some(name.as_str())) {
                self.server_claims.insert(v.record.server.clone(), name.clone());
            }
            let effects = claim::step(v, io, &self.settings.claims, now);
            match claim::due_at(v, io, &self.settings.claims) {
                Some(due) => self.claim_due.insert(name.clone(), due.max(now)),
                None => self.claim_due.remove(&name),
            };
            for e in &effects {
                match e {
                    Effect::EnterStage { stage, .. } => {
                        self.written.insert(name.clone(), (false, *stage));
                    }
                    Effect::FailClaim { .. } => {
                        self.written.insert(name.clone(), (true, v.record.stage));
                    }
                    Effect::Release { server, .. } => {
                        self.server_claims.remove(server);
                    }
                    _ => {}
                }
            }
            out.extend(effects);
        }
        self.claims.retain(|k, _| present.contains(k) || self.taking.contains_key(k));
        self.claim_due.retain(|k, _| present.contains(k));
        self.written.retain(|k, _| present.contains(k) || self.taking.contains_key(k));
        self.write_failures.retain(|k, _| present.contains(k));
        if self.live.iter().any(|c| !live.contains(c)) {
            // Claims that failed or vanished hand their pods back.
            self.batcher.forget();
        }
        self.live = live;

        // Scale-up: a batch due, or pods pending long enough to ask again.
        let pending = world.pending();
        if pending.is_empty() {
            self.pending_by_decision.clear();
        }
        self.batcher.observe(pending.iter(), now);
        // The first step counts as a decision: pods already pending wait
        // for the batch window like any others.
        self.last_decision.get_or_insert(now);
        self.waiting = !pending.is_empty() && !self.settled;
        let periodic = self.redecide_at().is_some_and(|at| now >= at);
        if self.batcher.due(now) || periodic {
            let mut snap = world.snapshot(Some(pending.len()));
            let backoff_ends = self.prepare(&mut snap, world, now_s);
            // A pod waiting for a transition rate is decided again when a
            // change leaves its minute, as when a backoff ends.
            let rate_ends = ironclaim_core::transitions::next_change_s(&snap, now_s);
            self.backoff_ends = backoff_ends.into_iter().chain(rate_ends).min();
            self.unchanged = true;
            let plan = provision(&snap, now_s);
            self.counters.decisions += 1;
            self.pending_by_decision.clear();
            for d in &plan.pods {
                let label = match &d.outcome {
                    ironclaim_core::Outcome::Unschedulable { reason } => reason.metric_label(),
                    other => other.label(),
                };
                *self.pending_by_decision.entry(label).or_default() += 1;
            }
            let mut opened = BTreeSet::new();
            // A gang's claims open together or not at all: one whose server
            // is busy holds back the gang's others until the next decision.
            let gang_of: BTreeMap<String, &str> =
                snap.pods.iter().filter(|p| p.is_demand()).filter_map(|p| p.gang.as_deref().map(|g| (p.key(), g))).collect();
            let held_gangs: BTreeSet<&str> =
                plan.claims.iter().filter(|c| self.busy(&c.server)).flat_map(|c| c.pods.iter().filter_map(|k| gang_of.get(k).copied())).collect();
            for c in &plan.claims {
                if self.busy(&c.server) || c.pods.iter().any(|k| gang_of.get(k).is_some_and(|g| held_gangs.contains(g))) {
                    continue;
                }
                opened.insert(c.server.clone());
                self.open_claim(&c.pool, &c.server, c.pods.clone(), now, &mut out);
            }
            let on_its_way = |o: &ironclaim_core::Outcome| match o {
                ironclaim_core::Outcome::InFlight { .. } => true,
                ironclaim_core::Outcome::NewClaim { server, .. } => opened.contains(server),
                _ => false,
            };
            // A pending pod the decision did not cover (its snapshot lagged
            // the list of pending pods) is decided again, not taken as settled.
            let covered: BTreeSet<&str> = plan.pods.iter().map(|d| d.pod.as_str()).collect();
            let all_covered = pending.iter().all(|k| covered.contains(k.as_str()));
            self.settled = all_covered && plan.pods.iter().all(|d| on_its_way(&d.outcome));
            // A pod waiting for a resize that fits a Ready node waits for
            // whoever moves it: nothing to decide again until a change.
            self.quiet = all_covered
                && plan.pods.iter().all(|d| {
                    on_its_way(&d.outcome)
                        || matches!(d.outcome, ironclaim_core::Outcome::Unschedulable { .. })
                        || (d.resize.is_some() && matches!(d.outcome, ironclaim_core::Outcome::Existing { .. }))
                });
            self.waiting = !self.settled;
            if self.settings.decision_notes {
                out.extend(plan.pods.iter().filter_map(decision_note));
            }
            self.batcher.decided(pending.iter());
            self.last_decision = Some(now);
        }

        // Scale-down.
        let Some(sd) = self.settings.scale_down else { return out };
        let pass = now >= self.next_scale_down;
        if !pass && self.drains.values().all(|d| now < d.next_at()) {
            return out;
        }
        let mut snap = world.snapshot(None);
        self.prepare(&mut snap, world, now_s);
        // A spare that runs work now is a node like any other: its soft
        // taint comes off, so it is not the last to get pods.
        let spares: Vec<&str> = snap.nodes.iter().filter(|n| n.taints.iter().any(|t| t.key == SPARE_TAINT)).map(|n| n.name.as_str()).collect();
        if !spares.is_empty() {
            let working: BTreeSet<&str> = snap
                .pods
                .iter()
                .filter(|p| p.occupies_node() && !p.is_daemonset_pod())
                .filter_map(|p| p.node_name.as_deref())
                .filter(|n| spares.contains(n))
                .collect();
            out.extend(working.into_iter().map(|n| Effect::Mark { node: n.to_string(), mark: Mark::Spare, on: false }));
        }
        for s in &snap.servers {
            if let Some(c) = &s.claim {
                holders.entry(s.name.clone()).or_insert_with(|| c.clone());
            }
        }
        // A drain that ends in this step still shows its node disrupting:
        // it is not one cut short by a restart.
        let owned: BTreeSet<String> = self.drains.keys().cloned().collect();
        self.run_drains(world, &holders, now, &mut out);
        if !pass {
            return out;
        }
        self.next_scale_down = now + sd.every;
        self.last_scale_down = Some(now);
        self.counters.scale_down_passes += 1;
        self.stamp_idle(&mut snap, &views, world, now_s, &mut out);

        // Drains cut short by a restart: uncordoned once the machine is
        // read on, fresh; one that may be shutting down stays cordoned.
        let power: BTreeMap<&str, PowerState> = snap.servers.iter().map(|s| (s.name.as_str(), s.power_state)).collect();
        let mut cut_short: BTreeSet<String> = BTreeSet::new();
        // Drains abandoned here: their own uncordon is on its way.
        let uncordoning: BTreeSet<String> =
            self.abandoned.iter().filter(|&(_, &at)| now_s < at.saturating_add(UNCORDON_IN_FLIGHT_S)).map(|(n, _)| n.clone()).collect();
        for n in snap.nodes.iter().filter(|n| n.disrupting && !owned.contains(&n.name) && !uncordoning.contains(&n.name)) {
            let Some(server) = n.server.as_deref() else {
                out.push(Effect::Uncordon { node: n.name.clone(), abandoned: false });
                out.push(Effect::Note {
                    subject: n.name.clone(),
                    reason: "DrainAbandoned",
                    message: "a drain cut short by a restart: uncordoned".into(),
                    warning: false,
                });
                continue;
            };
            cut_short.insert(server.to_string());
            if power.get(server) != Some(&PowerState::On) || self.busy(server) {
                continue;
            }
            let read = self.uncordon_reads.entry(server.to_string()).or_insert(UncordonRead { node: n.name.clone(), asked: false, again_at: now });
            if read.asked || now < read.again_at {
                continue;
            }
            read.asked = true;
            read.node = n.name.clone();
            out.push(Effect::ReadPower { server: server.to_string() });
        }
        self.uncordon_reads.retain(|s, _| cut_short.contains(s));

        let cool_down_s = sd.cool_down.as_secs();
        self.abandoned.retain(|_, at| now_s < at.saturating_add(cool_down_s.max(UNCORDON_IN_FLIGHT_S)));
        let mut abandoned: BTreeMap<String, Seconds> = world.abandoned_drains().into_iter().collect();
        for (node, at) in &self.abandoned {
            let seen = abandoned.entry(node.clone()).or_insert(*at);
            *seen = (*seen).max(*at);
        }
        let cooling = pacing::cooling(abandoned.iter().map(|(n, at)| (n.as_str(), *at)), now_s, cool_down_s);
        // Pods of cooling nodes are held as must-not-disrupt; the snapshot
        // serves only for pool settings after this.
        pacing::hold_cooling(&mut snap, &cooling);
        let mut plan = disrupt(&snap, now_s);
        let next_candidate_s = plan.next_candidate_s;
        // Underutilized nodes empty by attrition: marked, new pods prefer
        // other nodes; a node no longer chosen is unmarked. A node being
        // drained is left as it is.
        let emptying = std::mem::take(&mut plan.emptying);
        for n in snap.nodes.iter().filter(|n| n.server.is_some() && !n.disrupting && !n.unschedulable) {
            let marked = n.taints.iter().any(|t| t.key == Mark::Emptying.taint());
            match emptying.get(&n.name) {
                Some(why) if !marked => {
                    out.push(Effect::Mark { node: n.name.clone(), mark: Mark::Emptying, on: true });
                    let message = format!("{why}: new pods prefer other nodes, so it may empty with no eviction");
                    out.push(Effect::Note { subject: n.name.clone(), reason: "Emptying", message, warning: false });
                }
                None if marked => out.push(Effect::Mark { node: n.name.clone(), mark: Mark::Emptying, on: false }),
                _ => {}
            }
        }
        pacing::drop_cooling(&mut plan.actions, &mut plan.held, &cooling, now_s);
        let (go, waiting) = self.settling.settle(plan.actions, now_s, sd.revalidate_after.as_secs());
        if let Some(cap) = sd.quiet_max
            && go.is_empty()
        {
            // Stepped on change: nothing but time can change the answer
            // before an idle server passes its threshold, a cool-down ends,
            // a proposal is due again or an arrival leaves its floor's
            // window. What is under way (spares, takes, drains) ends in an
            // answer or a change, each of which brings the pass forward.
            let cool_ends = cooling.values().copied();
            let proposals = waiting.iter().map(|w| now_s.saturating_add(w.left_s));
            let next_s = next_candidate_s
                .into_iter()
                .chain(ironclaim_core::warm::next_change_s(&snap, now_s))
                .chain(ironclaim_core::transitions::next_change_s(&snap, now_s))
                .chain(cool_ends)
                .chain(proposals)
                .min();
            let next = next_s.map_or(now + cap, |t| Duration::from_secs(t).min(now + cap));
            self.next_scale_down = next.max(now + sd.every);
        }
        for action in go {
            self.act(action, &snap, &holders, &sd, world, now, &mut out);
        }
        if self.settings.held_notes {
            for h in plan.held {
                out.push(Effect::Note { subject: h.subject, reason: "ScaleDownHeld", message: h.why, warning: false });
            }
            for w in waiting {
                let message = format!("proposed for consolidation; drained only if still proposed {}s later", sd.revalidate_after.as_secs());
                out.push(Effect::Note { subject: w.node, reason: "ConsolidationProposed", message, warning: false });
            }
        }
        out
    }

    fn run_drains(&mut self, world: &dyn World, holders: &BTreeMap<String, String>, now: Duration, out: &mut Vec<Effect>) {
        let nodes: Vec<String> = self.drains.keys().cloned().collect();
        for node in nodes {
            let Some(d) = self.drains.get_mut(&node) else { continue };
            let pods = world.pods_on(&node);
            let holder = d.server.as_ref().and_then(|s| holders.get(s)).map(String::as_str);
            let off = d.server.as_ref().is_some_and(|s| self.confirmed_off.remove(s));
            let (effects, ended) = d.step(&pods, holder, off, now);
            out.extend(effects);
            let Some(ended) = ended else { continue };
            match ended {
                Ended::Done { .. } => self.counters.drains_done += 1,
                Ended::Abandoned { .. } => {
                    self.counters.drains_abandoned += 1;
                    let at = now.as_secs() + u64::from(now.subsec_nanos() > 0);
                    self.abandoned.insert(node.clone(), at);
                }
            }
            if let Some(d) = self.drains.remove(&node) {
                self.record_end(&node, &d.reason, ended);
            }
            // Its budget is free again.
            self.changed(now);
        }
    }

    /// Opens a claim on `server` for `pods` (none: a spare that is to be a
    /// Ready node): it is taken first, against every other claimer.
    fn open_claim(&mut self, pool: &str, server: &str, pods: Vec<String>, now: Duration, out: &mut Vec<Effect>) {
        let now_s = now.as_secs();
        let name = self.claim_name(pool, server, now);
        let record = ClaimRecord {
            name: name.clone(),
            server: server.to_string(),
            pool: pool.to_string(),
            pods,
            stage: Stage::Selected,
            stage_started_s: now_s,
            failure: None,
            node: None,
            created_s: now_s,
            history: vec![(Stage::Selected, now_s)],
        };
        self.taking.insert(name.clone(), record.clone());
        self.server_claims.insert(server.to_string(), name);
        self.counters.claims_opened += 1;
        out.push(Effect::TakeServer { claim: record });
    }

    #[allow(clippy::too_many_arguments)]
    fn act(
        &mut self,
        action: Action,
        snap: &Snapshot,
        holders: &BTreeMap<String, String>,
        sd: &ScaleDownSettings,
        world: &dyn World,
        now: Duration,
        out: &mut Vec<Effect>,
    ) {
        let claimed = |server: &str| {
            self.taking.values().any(|r| r.server == server) || self.server_claims.contains_key(server) && holders.contains_key(server)
        };
        match action {
            Action::PowerOff { server, .. } => {
                if self.busy(&server) || claimed(&server) {
                    return;
                }
                self.spares.insert(server.clone(), SpareOp::Off);
                out.push(Effect::PowerOff { server, claim: None, node: None });
            }
            Action::PowerOn { .. } | Action::PowerOnForHeadroom { .. } | Action::PowerOnForReplacement { .. } => {
                let mut join = None;
                let (server, why) = match action {
                    Action::PowerOn { server, pool, class, floor, on, prewarm, join: as_node } => {
                        join = as_node.then_some(pool);
                        let prewarm = prewarm.map(|p| format!(", {p}")).unwrap_or_default();
                        let what = if as_node { "a warm spare, to be a Ready node" } else { "a warm spare" };
                        (server, format!("powered on as {what}: floor {floor} for {class}{prewarm}, {on} on"))
                    }
                    Action::PowerOnForHeadroom { server, pool, short } => {
                        (server, format!("powered on for the headroom of ServerPool {pool}, short by {short}"))
                    }
                    Action::PowerOnForReplacement { server, replaces, watts_saved, .. } => {
                        (server, format!("powered on to take over {} (saves {watts_saved:.0} W)", replaces.join(", ")))
                    }
                    Action::PowerOff { .. } | Action::Drain { .. } => return,
                };
                if self.busy(&server) || claimed(&server) {
                    return;
                }
                if self.settings.held_notes {
                    out.push(Effect::Note { subject: server.clone(), reason: "SparePoweredOn", message: why, warning: false });
                }
                if let Some(pool) = join {
                    // A claim of no pods: the claim's path powers it on (if
                    // it is not yet), and it joins and passes its gates.
                    self.open_claim(&pool, &server, Vec::new(), now, out);
                    self.counters.spares_powered_on += 1;
                    return;
                }
                self.spares.insert(server.clone(), SpareOp::On);
                out.push(Effect::PowerOn { server, claim: None });
            }
            Action::Drain { node, server, pool, reason, evict, .. } => {
                if self.drains.contains_key(&node) || server.as_deref().is_some_and(|s| self.busy(s)) {
                    return;
                }
                let policy = snap.pools.iter().find(|p| p.name == pool).map(|p| &p.disruption);
                let timeout = policy.and_then(|p| p.drain_timeout_s).map_or(sd.drain.default_timeout, Duration::from_secs);
                let reason = format!("{reason:?}").to_lowercase();
                let mut d = Drain::new(&node, server.as_deref(), &reason, evict.into_iter().collect(), timeout, &sd.drain, now);
                if policy.is_some_and(|p| p.node_after_power_off == NodeAfterPowerOff::Park) {
                    d = d.parking_node();
                }
                let holder = server.as_ref().and_then(|s| holders.get(s)).map(String::as_str);
                let (effects, _) = d.step(&world.pods_on(&node), holder, false, now);
                out.extend(effects);
                self.drains.insert(node, d);
                self.counters.drains_started += 1;
            }
        }
    }

    /// Stamps each server's `idle_since_s` from the idle clocks: idle is
    /// powered on and either unclaimed with no node, or a serving node with
    /// no workload pod; a server in maintenance is never idle.
    fn stamp_idle(&mut self, snap: &mut Snapshot, views: &[ClaimView], world: &dyn World, now_s: Seconds, out: &mut Vec<Effect>) {
        let not_serving: BTreeSet<&str> =
            views.iter().filter(|v| v.record.failure.is_none() && v.record.stage != Stage::Serving).map(|v| v.record.server.as_str()).collect();
        let writes = crate::idle::stamp(&mut self.idle, snap, &not_serving, |s| world.recorded_idle(s), now_s);
        out.extend(writes.into_iter().map(|w| Effect::RecordIdle { server: w.server, since: w.idle_since }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_core::Resources;
    use ironclaim_core::model::{Server, ServerPool};

    /// A world of one pool, two servers and whatever pods and claims a test puts in.
    #[derive(Default)]
    struct Toy {
        snap: Snapshot,
        claims: Vec<ClaimView>,
    }

    impl World for Toy {
        fn pending(&self) -> Vec<String> {
            self.snap.pods.iter().filter(|p| p.is_demand()).map(Pod::key).collect()
        }
        fn snapshot(&self, _scale_up: Option<usize>) -> Snapshot {
            self.snap.clone()
        }
        fn claims(&self) -> Vec<ClaimView> {
            self.claims.clone()
        }
        fn last_failure_s(&self, _server: &str) -> Option<Seconds> {
            Some(1_000)
        }
        fn abandoned_drains(&self) -> Vec<(String, Seconds)> {
            Vec::new()
        }
        fn recorded_idle(&self, _server: &str) -> (Option<Seconds>, Option<Seconds>) {
            (None, None)
        }
        fn pods_on(&self, node: &str) -> Vec<Pod> {
            self.snap.pods.iter().filter(|p| p.node_name.as_deref() == Some(node)).cloned().collect()
        }
    }

    fn toy() -> Toy {
        let mut t = Toy::default();
        t.snap.pools.push(ServerPool::new("general"));
        t.snap.servers.push(Server::new("s1", Resources::new(16_000, 64 << 30)));
        t.snap.servers.push(Server::new("s2", Resources::new(16_000, 64 << 30)));
        t
    }

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    #[test]
    fn a_pending_pod_opens_one_claim_after_the_batch_and_its_take_sends_one_power_on() {
        let mut world = toy();
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        let mut a = Autoscaler::new(Settings { scale_down: None, ..Settings::default() });
        // The batch opens, and is decided once no pod came for its idle window.
        assert!(a.step(&world, s(2_000)).is_empty());
        let effects = a.step(&world, s(2_001));
        let takes: Vec<&ClaimRecord> = effects.iter().filter_map(|e| if let Effect::TakeServer { claim } = e { Some(claim) } else { None }).collect();
        assert_eq!(takes.len(), 1, "{effects:?}");
        let claim = takes[0].clone();
        assert_eq!(claim.pods, ["ns/web"]);
        assert_eq!(a.pending_by_decision(), &BTreeMap::from([("new_claim", 1)]));
        // Asked again while the take is under way: no second claim.
        assert!(!a.step(&world, s(2_002)).iter().any(|e| matches!(e, Effect::TakeServer { .. })));
        let answer = a.report(Report::Taken { claim: claim.name.clone(), newly: true }, s(2_001));
        assert_eq!(
            answer,
            [
                Effect::PowerOn { server: claim.server.clone(), claim: Some(claim.name.clone()) },
                Effect::EnterStage { claim: claim.name.clone(), stage: Stage::PoweringOn, message: format!("server {} taken", claim.server) },
            ]
        );
        // A take that loses to another claimer fails the claim as a conflict.
        let mut b = Autoscaler::new(Settings { scale_down: None, ..Settings::default() });
        b.step(&world, s(2_000));
        let effects = b.step(&world, s(2_001));
        let Some(Effect::TakeServer { claim }) = effects.into_iter().find(|e| matches!(e, Effect::TakeServer { .. })) else { panic!("no take") };
        let answer = b.report(Report::Held { claim: claim.name.clone(), holder: "other".into() }, s(2_001));
        assert!(matches!(&answer[..], [Effect::FailClaim { reason: crate::FailureReason::ClaimConflict, .. }]), "{answer:?}");
    }

    #[test]
    fn a_transition_rate_counts_the_power_on_sent_before_the_world_records_it() {
        let mut world = toy();
        world.snap.transition_limits.rates.push(ironclaim_core::transitions::parse_rate("fleet=1").unwrap());
        for name in ["a", "b"] {
            world.snap.pods.push(Pod::new("ns", name, Resources::new(16_000, 1 << 30)));
        }
        let mut a = Autoscaler::new(Settings { scale_down: None, ..Settings::default() });
        let takes = |effects: &[Effect]| -> Vec<ClaimRecord> {
            effects.iter().filter_map(|e| if let Effect::TakeServer { claim } = e { Some(claim.clone()) } else { None }).collect()
        };
        a.step(&world, s(2_000));
        let first = takes(&a.step(&world, s(2_001)));
        assert_eq!(first.len(), 1, "one power change a minute: one cold server");
        assert_eq!(a.pending_by_decision().get("transition_rate"), Some(&1));
        let on = a.report(Report::Taken { claim: first[0].name.clone(), newly: true }, s(2_001));
        assert!(on.iter().any(|e| matches!(e, Effect::PowerOn { .. })));
        // The world shows the server taken and on, but has recorded no
        // power change yet: the one sent here still counts.
        world.snap.servers[0].claim = Some(first[0].name.clone());
        world.snap.servers[0].power_state = PowerState::On;
        assert!(takes(&a.step(&world, s(2_031))).is_empty(), "the minute of the first power-on is not over");
        let second = takes(&a.step(&world, s(2_062)));
        assert_eq!(second.iter().map(|c| c.server.as_str()).collect::<Vec<_>>(), ["s2"]);
    }

    #[test]
    fn a_spare_powered_on_for_its_floor_says_why_on_the_server() {
        let mut world = toy();
        let class = ironclaim_core::warm::class_of(&world.snap.servers[0], Some(&world.snap.pools[0]));
        world.snap.pools[0].warm.floor.insert(class.clone(), 1);
        let mut a = Autoscaler::new(Settings::default());
        let effects = a.step(&world, s(10_000));
        let notes: Vec<(&str, &str, &str)> = effects
            .iter()
            .filter_map(|e| {
                if let Effect::Note { subject, reason, message, .. } = e { Some((subject.as_str(), *reason, message.as_str())) } else { None }
            })
            .collect();
        assert!(effects.contains(&Effect::PowerOn { server: "s1".into(), claim: None }), "{effects:?}");
        assert_eq!(notes, [("s1", "SparePoweredOn", format!("powered on as a warm spare: floor 1 for {class}, 0 on").as_str())]);
    }

    #[test]
    fn a_spare_for_pods_that_cannot_wait_for_a_join_is_claimed_to_be_a_node_and_unmarked_once_it_runs_work() {
        let mut world = toy();
        let class = ironclaim_core::warm::class_of(&world.snap.servers[0], Some(&world.snap.pools[0]));
        world.snap.pools[0].warm.floor.insert(class, 1);
        world.snap.pools[0].warm.adaptive = Some(ironclaim_core::AdaptiveFloor { history_days: 0, ..ironclaim_core::AdaptiveFloor::new(3_600) });
        world.snap.arrivals.push(ironclaim_core::Arrival { at_s: 9_000, server: "s2".into(), deadline_s: Some(60) });
        let mut a = Autoscaler::new(Settings::default());
        let effects = a.step(&world, s(10_000));
        let takes: Vec<&ClaimRecord> = effects.iter().filter_map(|e| if let Effect::TakeServer { claim } = e { Some(claim) } else { None }).collect();
        assert_eq!(takes.len(), 1, "{effects:?}");
        assert!(takes[0].pods.is_empty(), "a claim of no pods: {:?}", takes[0]);
        assert!(!effects.iter().any(|e| matches!(e, Effect::PowerOn { claim: None, .. })), "not a bare power-on: {effects:?}");
        assert_eq!(a.counters.spares_powered_on, 1);

        // A node marked as a spare that runs a workload pod is unmarked.
        let mut busy = toy();
        let mut node = ironclaim_core::Node::new("s1", Resources::new(16_000, 64 << 30));
        node.server = Some("s1".into());
        node.taints.push(ironclaim_core::labels::Taint::new(SPARE_TAINT, "", ironclaim_core::labels::TaintEffect::PreferNoSchedule));
        busy.snap.nodes.push(node);
        busy.snap.servers[0].node = Some("s1".into());
        busy.snap.servers[0].power_state = PowerState::On;
        let mut b = Autoscaler::new(Settings::default());
        let unmark = Effect::Mark { node: "s1".into(), mark: Mark::Spare, on: false };
        assert!(!b.step(&busy, s(10_000)).contains(&unmark), "an empty spare keeps its mark");
        busy.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)).bound_to("s1"));
        let mut c = Autoscaler::new(Settings::default());
        assert!(c.step(&busy, s(10_000)).contains(&unmark));
    }

    /// The node the plan chooses to empty is marked, and says why; a mark
    /// the plan no longer wants comes off; a node being drained is left as
    /// it is.
    #[test]
    fn the_node_chosen_to_empty_is_marked_and_unmarked_when_no_longer_chosen() {
        let mut world = toy();
        for (name, cpu) in [("s1", 10_000), ("s2", 1_000)] {
            let mut node = ironclaim_core::Node::new(name, Resources::new(16_000, 64 << 30));
            node.server = Some(name.into());
            world.snap.nodes.push(node);
            let server = world.snap.servers.iter_mut().find(|s| s.name == name).unwrap();
            server.node = Some(name.into());
            server.power_state = PowerState::On;
            world.snap.pods.push(Pod::new("ns", &format!("on-{name}"), Resources::new(cpu, 1 << 30)).bound_to(name));
        }
        let mark = |on| Effect::Mark { node: "s2".into(), mark: Mark::Emptying, on };
        let effects = Autoscaler::new(Settings::default()).step(&world, s(10_000));
        assert!(effects.contains(&mark(true)), "{effects:?}");
        assert!(
            effects
                .iter()
                .any(|e| matches!(e, Effect::Note { subject, reason: "Emptying", message, .. } if subject == "s2" && message.contains("6 % used"))),
            "{effects:?}"
        );
        assert!(!effects.iter().any(|e| matches!(e, Effect::Mark { node, .. } if node == "s1")), "{effects:?}");

        // Marked already: nothing to write.
        let taint = ironclaim_core::labels::Taint::new(Mark::Emptying.taint(), "", ironclaim_core::labels::TaintEffect::PreferNoSchedule);
        world.snap.nodes[1].taints.push(taint.clone());
        let effects = Autoscaler::new(Settings::default()).step(&world, s(10_000));
        assert!(!effects.iter().any(|e| matches!(e, Effect::Mark { .. } | Effect::Note { reason: "Emptying", .. })), "{effects:?}");

        // Busier now, it is no longer chosen: unmarked. While drained, left alone.
        world.snap.pods.push(Pod::new("ns", "more", Resources::new(8_000, 1 << 30)).bound_to("s2"));
        assert!(Autoscaler::new(Settings::default()).step(&world, s(10_000)).contains(&mark(false)));
        world.snap.nodes[1].disrupting = true;
        assert!(!Autoscaler::new(Settings::default()).step(&world, s(10_000)).contains(&mark(false)));
    }

    #[test]
    fn with_decision_notes_each_pending_pod_is_told_what_was_decided_for_it() {
        let mut world = toy();
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        world.snap.pods.push(Pod::new("ns", "huge", Resources::new(1_000_000, 1 << 30)));
        let notes = |a: &mut Autoscaler| {
            a.step(&world, s(2_000));
            let effects = a.step(&world, s(2_001));
            let mut notes: Vec<(String, &'static str, bool)> = effects
                .into_iter()
                .filter_map(|e| if let Effect::Note { subject, reason, warning, .. } = e { Some((subject, reason, warning)) } else { None })
                .collect();
            notes.sort();
            notes
        };
        let mut told = Autoscaler::new(Settings { scale_down: None, decision_notes: true, ..Settings::default() });
        assert_eq!(notes(&mut told), [("ns/huge".to_string(), "NotProvisionable", true), ("ns/web".to_string(), "ServerClaimed", false)]);
        let mut quiet = Autoscaler::new(Settings { scale_down: None, ..Settings::default() });
        assert!(notes(&mut quiet).is_empty(), "off by default");
    }

    #[test]
    fn a_server_in_its_failure_backoff_is_not_chosen() {
        let mut world = toy();
        world.snap.servers[0].failures = 1;
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        let mut a = Autoscaler::new(Settings { scale_down: None, ..Settings::default() });
        // Failed at 1000 s: 60 s of backoff; at 1030 s s1 is skipped, s2 taken.
        a.step(&world, s(1_029));
        let effects = a.step(&world, s(1_030));
        let servers: Vec<&str> =
            effects.iter().filter_map(|e| if let Effect::TakeServer { claim } = e { Some(claim.server.as_str()) } else { None }).collect();
        assert_eq!(servers, ["s2"]);
    }

    #[test]
    fn an_idle_warm_spare_past_break_even_is_powered_off_once_and_a_second_pass_sends_nothing_more() {
        let mut world = toy();
        world.snap.servers[0].power_state = PowerState::On;
        let settings = Settings { scale_down: Some(ScaleDownSettings { every: s(1), ..ScaleDownSettings::default() }), ..Settings::default() };
        let mut a = Autoscaler::new(settings);
        // First sight starts its idle clock; break-even (300 W x 480 s / 190 W) is 758 s.
        let first = a.step(&world, s(10_000));
        assert!(first.iter().any(|e| matches!(e, Effect::RecordIdle { server, since: Some(10_000) } if server == "s1")), "{first:?}");
        assert!(!first.iter().any(|e| matches!(e, Effect::PowerOff { .. })));
        let later = a.step(&world, s(10_800));
        let offs: Vec<&Effect> = later.iter().filter(|e| matches!(e, Effect::PowerOff { .. })).collect();
        assert_eq!(offs, [&Effect::PowerOff { server: "s1".into(), claim: None, node: None }]);
        assert!(a.busy("s1"));
        assert!(!a.step(&world, s(10_802)).iter().any(|e| matches!(e, Effect::PowerOff { .. })), "one power action at a time");
        a.report(Report::PoweredOff { server: "s1".into(), result: Ok(()), refused: None }, s(10_803));
        assert!(!a.busy("s1"));
        assert_eq!(a.counters.spares_powered_off, 1);
    }

    /// A ServerPool set to park its nodes gets its empty node parked once
    /// the server is confirmed off, not deleted; any other pool's node is
    /// deleted as before.
    #[test]
    fn an_empty_node_of_a_parking_pool_is_parked_once_its_server_is_off_and_others_are_deleted() {
        for park in [false, true] {
            let mut world = toy();
            if park {
                world.snap.pools[0].disruption.node_after_power_off = NodeAfterPowerOff::Park;
            }
            world.snap.servers[0].power_state = PowerState::On;
            world.snap.servers[0].node = Some("n1".into());
            let mut node = ironclaim_core::model::Node::new("n1", Resources::new(16_000, 64 << 30));
            node.server = Some("s1".into());
            world.snap.nodes.push(node);
            let settings = Settings { scale_down: Some(ScaleDownSettings { every: s(1), ..ScaleDownSettings::default() }), ..Settings::default() };
            let mut a = Autoscaler::new(settings);
            a.step(&world, s(10_000));
            let mut ended = Vec::new();
            for t in (10_800..10_900).step_by(2) {
                let mut effects = a.step(&world, s(t));
                if effects.iter().any(|e| matches!(e, Effect::Cordon { .. })) {
                    world.snap.nodes[0].disrupting = true;
                    world.snap.nodes[0].unschedulable = true;
                }
                if effects.iter().any(|e| matches!(e, Effect::PowerOff { .. })) {
                    world.snap.servers[0].power_state = PowerState::Off;
                    effects.extend(a.report(Report::PoweredOff { server: "s1".into(), result: Ok(()), refused: None }, s(t)));
                }
                ended.extend(effects.into_iter().filter(|e| matches!(e, Effect::DeleteNode { .. } | Effect::ParkNode { .. })));
                if !ended.is_empty() {
                    break;
                }
            }
            let want = if park { Effect::ParkNode { node: "n1".into(), server: "s1".into() } } else { Effect::DeleteNode { node: "n1".into() } };
            assert_eq!(ended, [want], "park {park}");
        }
    }

    /// Issue 14, hole 7 after a restart: a node left cordoned by a drain
    /// this process does not own was uncordoned while its server's
    /// recorded power said On, even when a power-off cut off with its BMC
    /// may have been under way. It is uncordoned only once the BMC, read
    /// fresh, says on.
    #[test]
    fn a_drain_cut_short_by_a_restart_is_uncordoned_only_once_its_server_is_read_on() {
        let mut world = toy();
        world.snap.servers[0].power_state = PowerState::On;
        world.snap.servers[0].node = Some("n1".into());
        let mut node = ironclaim_core::model::Node::new("n1", Resources::new(16_000, 64 << 30));
        node.server = Some("s1".into());
        node.disrupting = true;
        node.unschedulable = true;
        world.snap.nodes.push(node);
        let settings = Settings { scale_down: Some(ScaleDownSettings { every: s(1), ..ScaleDownSettings::default() }), ..Settings::default() };
        let mut a = Autoscaler::new(settings);
        let uncordons = |effects: &[Effect]| effects.iter().filter(|e| matches!(e, Effect::Uncordon { .. })).count();
        let first = a.step(&world, s(5_000));
        assert_eq!(uncordons(&first), 0, "uncordoned on the recorded power alone: {first:?}");
        assert!(first.contains(&Effect::ReadPower { server: "s1".into() }), "{first:?}");
        assert!(!a.step(&world, s(5_002)).contains(&Effect::ReadPower { server: "s1".into() }), "one read at a time");
        // The BMC does not answer (cut off mid power-off): still cordoned, read again later.
        let after = a.report(
            Report::PowerRead {
                server: "s1".into(),
                result: Err(crate::PowerFailure { reason: crate::FailureReason::BmcUnreachable, message: "timeout".into() }),
            },
            s(5_010),
        );
        assert_eq!(uncordons(&after), 0);
        assert!(!a.step(&world, s(5_020)).contains(&Effect::ReadPower { server: "s1".into() }), "waits before reading again");
        let again = a.step(&world, s(5_010 + UNCORDON_READ_AGAIN_S));
        assert!(again.contains(&Effect::ReadPower { server: "s1".into() }), "{again:?}");
        // Read off (the power-off went through): still cordoned.
        assert_eq!(uncordons(&a.report(Report::PowerRead { server: "s1".into(), result: Ok(false) }, s(5_041))), 0);
        a.step(&world, s(5_041 + UNCORDON_READ_AGAIN_S));
        // Read on: uncordoned, once.
        let on = a.report(Report::PowerRead { server: "s1".into(), result: Ok(true) }, s(5_080));
        assert_eq!(on.first(), Some(&Effect::Uncordon { node: "n1".into(), abandoned: false }), "{on:?}");
        // With the server recorded off, nothing is asked at all.
        let mut a =
            Autoscaler::new(Settings { scale_down: Some(ScaleDownSettings { every: s(1), ..ScaleDownSettings::default() }), ..Settings::default() });
        world.snap.servers[0].power_state = PowerState::Off;
        let off = a.step(&world, s(6_000));
        assert!(uncordons(&off) == 0 && !off.iter().any(|e| matches!(e, Effect::ReadPower { .. })), "{off:?}");
    }

    /// An abandoned drain's cool-down hung on the world showing its stamp:
    /// while the stamp was not yet seen (or its write was lost), the node
    /// was taken for a drain cut short by a restart and, once uncordoned
    /// and empty, drained again at once.
    #[test]
    fn an_abandoned_drain_cools_down_from_its_own_record_before_the_world_shows_the_stamp() {
        let mut world = toy();
        world.snap.servers[0].power_state = PowerState::On;
        world.snap.servers[0].node = Some("n1".into());
        let mut node = ironclaim_core::model::Node::new("n1", Resources::new(16_000, 64 << 30));
        node.server = Some("s1".into());
        world.snap.nodes.push(node);
        // A bare pod: the drain is abandoned at its first round.
        world.snap.pods.push(Pod::new("ns", "bare", Resources::new(1_000, 1 << 30)).bound_to("n1"));
        let sd = ScaleDownSettings { every: s(1), cool_down: s(2_000), ..ScaleDownSettings::default() };
        let mut a = Autoscaler::new(Settings { scale_down: Some(sd), ..Settings::default() });
        let started = a.drain_for_maintenance(&world, "n1", "s1", s(600), s(1_000));
        assert!(matches!(started.first(), Some(Effect::Cordon { .. })), "{started:?}");
        world.snap.nodes[0].disrupting = true;
        let ended = a.step(&world, s(1_001));
        assert!(ended.contains(&Effect::Uncordon { node: "n1".into(), abandoned: true }), "{ended:?}");
        // The world has not caught up: still cordoned, no stamp. Not a drain cut short.
        let stale = a.step(&world, s(1_003));
        assert!(!stale.iter().any(|e| matches!(e, Effect::ReadPower { .. } | Effect::Uncordon { .. })), "{stale:?}");
        assert!(!stale.iter().any(|e| matches!(e, Effect::Note { message, .. } if message.contains("cut short"))), "{stale:?}");
        // Uncordoned, empty, idle past break-even (758 s), and the stamp never shown: still cooling.
        world.snap.nodes[0].disrupting = false;
        world.snap.pods.clear();
        for t in [1_005, 1_900, 2_900] {
            let effects = a.step(&world, s(t));
            assert!(!effects.iter().any(|e| matches!(e, Effect::Cordon { .. })), "drained again at {t} s: {effects:?}");
        }
        // The cool-down over, the empty node is drained.
        let after = a.step(&world, s(3_002));
        assert!(after.iter().any(|e| matches!(e, Effect::Cordon { node, .. } if node == "n1")), "{after:?}");
    }

    #[test]
    fn a_maintenance_drain_evicts_releases_and_leaves_its_node_cordoned_and_its_end_is_told_once() {
        let mut world = toy();
        world.snap.servers[0].power_state = PowerState::On;
        world.snap.servers[0].claim = Some("c1".into());
        let mut node = ironclaim_core::model::Node::new("n1", Resources::new(16_000, 64 << 30));
        node.server = Some("s1".into());
        world.snap.nodes.push(node);
        let mut web = Pod::new("ns", "web", Resources::new(1_000, 1 << 30)).bound_to("n1");
        web.owner = Some(ironclaim_core::model::Owner { kind: "ReplicaSet".into(), name: "web".into() });
        world.snap.pods.push(web);
        let mut a = Autoscaler::new(Settings::default());
        let started = a.drain_for_maintenance(&world, "n1", "s1", s(600), s(1_000));
        assert!(
            matches!(&started[..], [Effect::Cordon { node, reason }, Effect::Note { .. }] if node == "n1" && reason == "maintenance"),
            "{started:?}"
        );
        assert!(a.drain_for_maintenance(&world, "n1", "s1", s(600), s(1_000)).is_empty(), "one drain per node");
        let evicting = a.step(&world, s(1_001));
        assert!(evicting.contains(&Effect::Evict { node: "n1".into(), pod: "ns/web".into() }), "{evicting:?}");
        a.report(Report::Evicted { node: "n1".into(), pod: "ns/web".into(), answer: crate::Eviction::Evicted }, s(1_001));
        assert!(a.drain_ends().is_empty(), "not over yet");
        world.snap.pods.clear();
        let done = a.step(&world, s(1_003));
        assert!(done.contains(&Effect::KeepCordoned { node: "n1".into() }), "{done:?}");
        assert!(done.iter().any(|e| matches!(e, Effect::Release { server, claim, .. } if server == "s1" && claim == "c1")), "{done:?}");
        assert!(!done.iter().any(|e| matches!(e, Effect::PowerOff { .. } | Effect::Uncordon { .. } | Effect::DeleteNode { .. })), "{done:?}");
        assert_eq!(a.drain_ends(), [DrainEnd { node: "n1".into(), reason: "maintenance".into(), ended: Ended::Done { evicted: 1 } }]);
        assert!(a.drain_ends().is_empty(), "told once");
    }

    #[test]
    fn stepped_on_change_a_quiet_scale_down_wakes_at_the_break_even_and_a_change_brings_it_forward() {
        let mut world = toy();
        world.snap.servers[0].power_state = PowerState::On;
        let quiet = ScaleDownSettings { quiet_max: Some(s(3_600)), ..ScaleDownSettings::default() };
        let settings = Settings { reconcile_every: Duration::ZERO, scale_down: Some(quiet), ..Settings::default() };
        let mut a = Autoscaler::new(settings.clone());
        a.step(&world, s(10_000));
        // Idle since 10000 with a 758 s break-even: nothing can change before 10758.
        assert_eq!(a.next_wake(), s(10_758));
        assert_eq!(a.counters.scale_down_passes, 1);
        assert!(a.step(&world, s(10_500)).is_empty(), "not due: no pass");
        assert_eq!(a.counters.scale_down_passes, 1);
        let offs = a.step(&world, s(10_758));
        assert!(offs.iter().any(|e| matches!(e, Effect::PowerOff { server, .. } if server == "s1")), "{offs:?}");

        // A change is looked at by the next step, `every` after the last pass.
        let mut b = Autoscaler::new(settings);
        b.step(&world, s(10_000));
        b.changed(s(10_001));
        assert_eq!(b.next_wake(), s(10_002));
        b.step(&world, s(10_002));
        assert_eq!(b.counters.scale_down_passes, 2);
    }

    #[test]
    fn pending_pods_are_counted_by_decision_until_none_is_pending() {
        let mut world = toy();
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        world.snap.pods.push(Pod::new("ns", "huge", Resources::new(64_000, 1 << 30)));
        let mut a = Autoscaler::new(Settings { scale_down: None, ..Settings::default() });
        a.step(&world, s(2_000));
        a.step(&world, s(2_001));
        assert_eq!(a.pending_by_decision(), &BTreeMap::from([("new_claim", 1), ("no_matching_hardware", 1)]));
        world.snap.pods.clear();
        a.step(&world, s(2_002));
        assert!(a.pending_by_decision().is_empty(), "{:?}", a.pending_by_decision());
    }

    #[test]
    fn a_pending_pod_its_snapshot_did_not_show_yet_is_decided_again_soon() {
        // The list of pending pods names `ns/late` before the snapshot
        // holds it: the decision covers only `ns/web`.
        struct Lagging(Toy);
        impl World for Lagging {
            fn pending(&self) -> Vec<String> {
                let mut keys = self.0.pending();
                if !keys.iter().any(|k| k == "ns/late") {
                    keys.push("ns/late".into());
                }
                keys
            }
            fn snapshot(&self, scale_up: Option<usize>) -> Snapshot {
                self.0.snapshot(scale_up)
            }
            fn claims(&self) -> Vec<ClaimView> {
                self.0.claims()
            }
            fn last_failure_s(&self, server: &str) -> Option<Seconds> {
                self.0.last_failure_s(server)
            }
            fn abandoned_drains(&self) -> Vec<(String, Seconds)> {
                Vec::new()
            }
            fn recorded_idle(&self, server: &str) -> (Option<Seconds>, Option<Seconds>) {
                self.0.recorded_idle(server)
            }
            fn pods_on(&self, node: &str) -> Vec<Pod> {
                self.0.pods_on(node)
            }
        }
        let mut world = Lagging(toy());
        world.0.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        let quiet = Settings { scale_down: None, redecide_quiet_max: Some(s(3_600)), ..Settings::default() };
        let mut a = Autoscaler::new(quiet);
        let mut taken: Vec<Vec<String>> = Vec::new();
        let take = |effects: Vec<Effect>, taken: &mut Vec<Vec<String>>| {
            taken.extend(effects.into_iter().filter_map(|e| if let Effect::TakeServer { claim } = e { Some(claim.pods) } else { None }));
        };
        take(a.step(&world, s(2_000)), &mut taken);
        take(a.step(&world, s(2_001)), &mut taken);
        assert_eq!(taken, vec![vec!["ns/web".to_string()]]);
        // The snapshot catches up; nothing else changes.
        // Too big to join web on its server.
        world.0.snap.pods.push(Pod::new("ns", "late", Resources::new(16_000, 1 << 30)));
        // Decided again at the next periodic decision, not only at the cap.
        for t in 2_002..2_040 {
            take(a.step(&world, s(t)), &mut taken);
        }
        assert_eq!(taken.len(), 2, "ns/late waited for the cap: {taken:?}");
        assert_eq!(taken[1], vec!["ns/late".to_string()]);
    }

    #[test]
    fn stepped_on_change_a_spare_on_its_way_costs_no_pass_until_its_answer() {
        let mut world = toy();
        let class = ironclaim_core::warm::class_of(&world.snap.servers[0], Some(&world.snap.pools[0]));
        world.snap.pools[0].warm.floor.insert(class, 1);
        let on_change = ScaleDownSettings { quiet_max: Some(s(3_600)), ..ScaleDownSettings::default() };
        let mut a = Autoscaler::new(Settings { reconcile_every: Duration::ZERO, scale_down: Some(on_change), ..Settings::default() });
        let first = a.step(&world, s(10_000));
        assert!(first.iter().any(|e| matches!(e, Effect::PowerOn { claim: None, .. })), "the floor asks for a spare: {first:?}");
        assert_eq!(a.next_wake(), s(10_002), "a pass that started something looks again soon");
        let second = a.step(&world, s(10_002));
        assert!(!second.iter().any(|e| matches!(e, Effect::PowerOn { .. } | Effect::PowerOff { .. })), "{second:?}");
        // Nothing but the spare's answer, or its idling past break-even,
        // can change the next answer.
        let break_even = ironclaim_core::disruption::break_even_s(&world.snap.servers[0]);
        assert_eq!(a.next_wake(), s(10_002 + break_even));
        let server = first.iter().find_map(|e| if let Effect::PowerOn { server, .. } = e { Some(server.clone()) } else { None }).unwrap();
        a.report(Report::PoweredOn { server, result: Ok(()) }, s(10_030));
        assert_eq!(a.next_wake(), s(10_030), "the answer brings the pass forward");
        assert_eq!(a.counters.scale_down_passes, 2);
    }

    fn record(name: &str, server: &str, stage: Stage, failure: Option<crate::FailureReason>) -> ClaimRecord {
        ClaimRecord {
            name: name.into(),
            server: server.into(),
            pool: "general".into(),
            pods: vec!["ns/web".into()],
            stage,
            stage_started_s: 2_000,
            failure,
            node: None,
            created_s: 2_000,
            history: vec![(stage, 2_000)],
        }
    }

    fn facts(holder: &str) -> Option<crate::ServerFacts> {
        Some(crate::ServerFacts { holder: Some(holder.into()), ..Default::default() })
    }

    #[test]
    fn a_power_answer_goes_to_the_claim_that_holds_the_server_not_to_a_failed_one_kept_for_its_record() {
        let (mut world, mut a, claim) = one_claim_taken();
        // The world: the live claim powering on, and an older failed claim
        // of the same server (released, kept for its TTL) whose name sorts after.
        let live = ClaimView {
            record: record(&claim.name, &claim.server, Stage::PoweringOn, None),
            server: facts(&claim.name),
            node: None,
            pods_pending: vec!["ns/web".into()],
            pods_bound: 0,
        };
        let old = ClaimView {
            record: record("zzz-old", &claim.server, Stage::Booting, Some(crate::FailureReason::RegistrationTimedOut)),
            server: facts(&claim.name),
            node: None,
            pods_pending: Vec::new(),
            pods_bound: 0,
        };
        world.claims = vec![live, old];
        a.step(&world, s(2_002));
        a.report(Report::PoweredOn { server: claim.server.clone(), result: Ok(()) }, s(2_060));
        assert!(a.next_wake() <= s(2_060), "the answer makes the claim due");
        let next = a.step(&world, s(2_060));
        assert!(
            next.iter().any(|e| matches!(e, Effect::EnterStage { claim: c, stage: Stage::Booting, .. } if *c == claim.name)),
            "the live claim moves on: {next:?}"
        );
    }

    /// A pending pod, stepped on change, whose claim's take was answered.
    fn one_claim_taken() -> (Toy, Autoscaler, ClaimRecord) {
        let mut world = toy();
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        let settings = Settings { reconcile_every: Duration::ZERO, scale_down: None, ..Settings::default() };
        let mut a = Autoscaler::new(settings);
        a.step(&world, s(2_000));
        let effects = a.step(&world, s(2_001));
        let Some(Effect::TakeServer { claim }) = effects.into_iter().find(|e| matches!(e, Effect::TakeServer { .. })) else { panic!("no take") };
        a.report(Report::Taken { claim: claim.name.clone(), newly: true }, s(2_001));
        (world, a, claim)
    }

    /// The world's view of a taken claim whose server is powering on.
    fn powering_on(claim: &ClaimRecord) -> ClaimView {
        ClaimView {
            record: record(&claim.name, &claim.server, Stage::PoweringOn, None),
            server: facts(&claim.name),
            node: None,
            pods_pending: vec!["ns/web".into()],
            pods_bound: 0,
        }
    }

    #[test]
    fn a_stage_write_that_failed_has_its_claim_stepped_again_from_what_the_world_shows() {
        let (mut world, mut a, claim) = one_claim_taken();
        world.claims = vec![powering_on(&claim)];
        a.step(&world, s(2_002));
        a.report(Report::PoweredOn { server: claim.server.clone(), result: Ok(()) }, s(2_060));
        let booting = a.step(&world, s(2_060));
        assert!(booting.iter().any(|e| matches!(e, Effect::EnterStage { stage: Stage::Booting, .. })), "{booting:?}");
        // The write of Booting fails: the world keeps showing PoweringOn.
        a.report(
            Report::WriteFailed { claim: Some(claim.name.clone()), effect: "EnterStage".into(), message: "the API server is unavailable".into() },
            s(2_060),
        );
        assert!(a.next_wake() <= s(2_061), "the claim is due again");
        let again = a.step(&world, s(2_061));
        assert_eq!(again, [Effect::ReadPower { server: claim.server.clone() }], "the power is read again, then the stage written again");
        a.report(Report::PowerRead { server: claim.server.clone(), result: Ok(true) }, s(2_062));
        let rewritten = a.step(&world, s(2_062));
        assert!(
            rewritten.iter().any(|e| matches!(e, Effect::EnterStage { claim: c, stage: Stage::Booting, .. } if *c == claim.name)),
            "{rewritten:?}"
        );
    }

    /// Issue 13: during an API outage a claim's record write was sent
    /// again at every reconcile, once a second.
    #[test]
    fn a_claim_write_that_keeps_failing_is_sent_again_after_a_doubling_wait_not_every_second() {
        let (mut world, mut a, claim) = one_claim_taken();
        world.claims = vec![powering_on(&claim)];
        a.step(&world, s(2_002));
        a.report(Report::PoweredOn { server: claim.server.clone(), result: Ok(()) }, s(2_060));
        // Two minutes of an API that refuses every write, stepped each second.
        let mut writes = Vec::new();
        for t in 2_060..2_180 {
            let mut effects = a.step(&world, s(t));
            while let Some(e) = effects.pop() {
                let more = match e {
                    Effect::ReadPower { server } => a.report(Report::PowerRead { server, result: Ok(true) }, s(t)),
                    Effect::EnterStage { stage: Stage::Booting, .. } => {
                        writes.push(t);
                        let failed =
                            Report::WriteFailed { claim: Some(claim.name.clone()), effect: "EnterStage".into(), message: "unavailable".into() };
                        a.report(failed, s(t))
                    }
                    _ => Vec::new(),
                };
                effects.extend(more);
            }
        }
        let gaps: Vec<u64> = writes.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(writes.len() <= 9, "{} writes in two minutes at {writes:?}", writes.len());
        assert!(gaps.windows(2).all(|g| g[1] >= g[0]), "the wait never shortens while writes fail: {gaps:?}");
        assert!(gaps.iter().all(|&g| g <= 32), "and is at most 30 s (and a read of the power): {gaps:?}");
        // The write lands: the next failure waits a second again.
        world.claims[0].record.stage = Stage::Booting;
        a.step(&world, s(2_200));
        assert!(a.write_failures.is_empty(), "{:?}", a.write_failures);
    }

    #[test]
    fn a_taken_claim_whose_first_stage_write_failed_writes_it_again_and_sends_no_second_power_on() {
        let (mut world, mut a, claim) = one_claim_taken();
        // The world: the claim recorded at Selected, its server held by it.
        world.claims = vec![ClaimView {
            record: record(&claim.name, &claim.server, Stage::Selected, None),
            server: facts(&claim.name),
            node: None,
            pods_pending: vec!["ns/web".into()],
            pods_bound: 0,
        }];
        assert!(a.step(&world, s(2_002)).is_empty(), "the PoweringOn write is awaited");
        a.report(Report::WriteFailed { claim: Some(claim.name.clone()), effect: "EnterStage".into(), message: "timeout".into() }, s(2_002));
        let again = a.step(&world, s(2_003));
        assert_eq!(
            again,
            [Effect::EnterStage { claim: claim.name.clone(), stage: Stage::PoweringOn, message: format!("server {} taken", claim.server) }]
        );
    }

    #[test]
    fn pods_that_all_wait_for_claims_in_flight_are_not_decided_again_until_something_changes() {
        let mut world = toy();
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        world.snap.servers[0].claim = Some("c1".into());
        world.snap.claims.push(ClaimInFlight {
            name: "c1".into(),
            server: "s1".into(),
            pool: "general".into(),
            stage: ironclaim_core::Stage::Booting,
            stage_started_s: 990,
            pods: vec!["ns/web".into()],
        });
        let settings = Settings { reconcile_every: Duration::ZERO, scale_down: None, ..Settings::default() };
        let mut a = Autoscaler::new(settings);
        a.step(&world, s(1_000));
        let effects = a.step(&world, s(1_001));
        assert!(!effects.iter().any(|e| matches!(e, Effect::TakeServer { .. })), "{effects:?}");
        assert_eq!(a.counters.decisions, 1);
        // Its claim is on its way: no wake to ask again, and asking later decides nothing.
        assert_eq!(a.next_wake(), Duration::MAX, "no wake for a settled decision");
        a.step(&world, s(1_031));
        assert_eq!(a.counters.decisions, 1, "nothing new to decide");
        // A new pod opens a batch and is decided.
        world.snap.pods.push(Pod::new("ns", "api", Resources::new(1_000, 1 << 30)));
        a.step(&world, s(1_040));
        a.step(&world, s(1_041));
        assert_eq!(a.counters.decisions, 2);
    }

    #[test]
    fn stepped_on_change_pods_still_pending_are_decided_again_after_redecide_every() {
        let mut world = toy();
        // Both servers wait out a failure's backoff: nothing can be claimed now.
        world.snap.servers[0].failures = 1;
        world.snap.servers[1].failures = 1;
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        let settings = Settings { reconcile_every: Duration::ZERO, scale_down: None, ..Settings::default() };
        let mut a = Autoscaler::new(settings);
        a.step(&world, s(1_010));
        let effects = a.step(&world, s(1_011));
        assert!(!effects.iter().any(|e| matches!(e, Effect::TakeServer { .. })), "{effects:?}");
        assert_eq!(a.next_wake(), s(1_011 + 30));
    }

    #[test]
    fn told_every_change_pods_no_server_can_take_wait_for_a_change_or_the_end_of_a_backoff() {
        let mut world = toy();
        // Both servers wait out a failure's backoff until 1,060 s.
        world.snap.servers[0].failures = 1;
        world.snap.servers[1].failures = 1;
        world.snap.pods.push(Pod::new("ns", "web", Resources::new(1_000, 1 << 30)));
        let settings = Settings { reconcile_every: Duration::ZERO, redecide_quiet_max: Some(s(3_600)), scale_down: None, ..Settings::default() };
        let mut quiet = Autoscaler::new(settings.clone());
        quiet.step(&world, s(1_010));
        quiet.step(&world, s(1_011));
        assert_eq!(quiet.counters.decisions, 1);
        assert_eq!(quiet.next_wake(), s(1_060), "nothing but the end of the backoff can change the answer");
        quiet.step(&world, s(1_041));
        assert_eq!(quiet.counters.decisions, 1, "not decided again with nothing changed");
        let effects = quiet.step(&world, s(1_060));
        assert_eq!(quiet.counters.decisions, 2);
        assert!(effects.iter().any(|e| matches!(e, Effect::TakeServer { .. })), "a server out of its backoff is claimed: {effects:?}");

        // A change brings the re-decision back to `redecide_every`.
        let mut told = Autoscaler::new(settings.clone());
        told.step(&world, s(1_010));
        told.step(&world, s(1_011));
        told.changed(s(1_020));
        assert_eq!(told.next_wake(), s(1_041));
        told.step(&world, s(1_041));
        assert_eq!(told.counters.decisions, 2);

        // With no server in backoff the cap bounds the wait.
        world.snap.servers.iter_mut().for_each(|s| s.health = ironclaim_core::model::Health::Quarantined);
        let mut capped = Autoscaler::new(settings);
        capped.step(&world, s(1_010));
        capped.step(&world, s(1_011));
        assert_eq!(capped.next_wake(), s(1_011 + 3_600));
    }
}
