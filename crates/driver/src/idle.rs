//! Since when each server has idled, kept across restarts.
//!
//! Break-even is counted from the moment a server went idle. That moment
//! is written to the Server's `status.idleSince` when the server turns idle
//! and cleared when it is busy again, so a restarted controller (or a new
//! leader) carries on from it instead of waiting break-even out from zero.
//!
//! # Guarantees
//! - Writes happen on transitions only: idle to busy and back, and once for
//!   a recorded value that disagrees with what this process sees. A write
//!   already sent is not sent again while the watch catches up, unless the
//!   index still disagrees [`RESEND_AFTER_S`] later: the write was lost.
//! - A recorded value is read only when this process has no opinion yet
//!   (first sight after a start or after regaining the lease), never later
//!   than now, and never earlier than the latest thing known to have made
//!   the server busy since (its claim being written, its node registering).
//!
//! # Assumptions
//! A server that was busy and idle again while no controller watched it,
//! with no new claim and no new node, is taken to have idled since the
//! recorded time: its power-off can come that much early. That costs at
//! most one power cycle's energy, never capacity a pod is using.

use std::collections::{BTreeSet, HashMap};

use ironclaim_core::model::{PowerState, Seconds, Snapshot};

/// What one pass sees of one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub server: String,
    /// Idle now: on with no claim and no node, or a serving node running
    /// no workload pod.
    pub idle: bool,
    /// `status.idleSince` as the index has it.
    pub recorded: Option<Seconds>,
    /// The latest known start of business: its claim written, its node
    /// registered. A recorded idle time before it is stale.
    pub busy_at_least_until: Option<Seconds>,
}

/// A write of `status.idleSince` (`None` clears it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Write {
    pub server: String,
    pub idle_since: Option<Seconds>,
}

/// The idle clocks of one process.
#[derive(Debug, Default)]
pub struct IdleClock {
    since: HashMap<String, Seconds>,
    /// What this process last wrote and when, until the index shows it.
    sent: HashMap<String, (Option<Seconds>, Seconds)>,
}

/// A write the index has not shown this long after it was sent is taken
/// as lost (refused, or sent by a process that crashed) and sent again.
pub const RESEND_AFTER_S: Seconds = 60;

impl IdleClock {
    /// Forgets everything, as after losing the lease: whoever acts next
    /// starts from what is recorded.
    pub fn forget(&mut self) {
        self.since.clear();
        self.sent.clear();
    }

    /// Whether the clock holds anything of `server`.
    pub fn knows(&self, server: &str) -> bool {
        self.since.contains_key(server) || self.sent.contains_key(server)
    }

    /// A write that failed: it is sent again on the next pass.
    pub fn failed(&mut self, server: &str) {
        self.sent.remove(server);
    }

    /// One pass: since when each idle server has idled (by name), and the
    /// writes that bring `status.idleSince` in line with it.
    pub fn observe(&mut self, seen: &[Seen], now: Seconds) -> (HashMap<String, Seconds>, Vec<Write>) {
        let mut idle = HashMap::new();
        let mut writes = Vec::new();
        for s in seen {
            let wanted = if s.idle {
                let since = *self
                    .since
                    .entry(s.server.clone())
                    .or_insert_with(|| s.recorded.filter(|&r| r <= now).map_or(now, |r| r.max(s.busy_at_least_until.unwrap_or(0)).min(now)));
                idle.insert(s.server.clone(), since);
                Some(since)
            } else {
                self.since.remove(&s.server);
                None
            };
            if s.recorded == wanted {
                self.sent.remove(&s.server);
            } else if self.sent.get(&s.server).is_none_or(|&(sent, at)| sent != wanted || now >= at.saturating_add(RESEND_AFTER_S)) {
                self.sent.insert(s.server.clone(), (wanted, now));
                writes.push(Write { server: s.server.clone(), idle_since: wanted });
            }
        }
        let present: std::collections::HashSet<&str> = seen.iter().map(|s| s.server.as_str()).collect();
        self.since.retain(|k, _| present.contains(k.as_str()));
        self.sent.retain(|k, _| present.contains(k.as_str()));
        (idle, writes)
    }
}

/// Sets each server's `idle_since_s` in `snapshot` from `clock`: idle is
/// powered on and either unclaimed with no node, or a node with no
/// workload pod whose server's claim is not still on its way
/// (`not_serving`); a server in maintenance is never idle. `recorded` gives
/// a server's recorded idle time and its latest known start of business.
/// Returns the writes of `status.idleSince` that are due.
pub fn stamp(
    clock: &mut IdleClock,
    snapshot: &mut Snapshot,
    not_serving: &BTreeSet<&str>,
    recorded: impl Fn(&str) -> (Option<Seconds>, Option<Seconds>),
    now: Seconds,
) -> Vec<Write> {
    let mut busy_nodes: BTreeSet<&str> = BTreeSet::new();
    for p in &snapshot.pods {
        if p.occupies_node() && !p.terminating && !p.is_daemonset_pod() {
            busy_nodes.insert(p.node_name.as_deref().unwrap_or_default());
        }
    }
    let seen: Vec<Seen> = snapshot
        .servers
        .iter()
        .filter(|s| !s.unlimited)
        // A server off with no node is not idle; one the clock has no
        // opinion of and nothing recorded for needs nothing.
        .filter_map(|s| {
            let (recorded, busy_at_least_until) = recorded(&s.name);
            if s.power_state != PowerState::On && s.node.is_none() && recorded.is_none() && !clock.knows(&s.name) {
                return None;
            }
            let idle = !s.health.hands_off()
                && match &s.node {
                    Some(node) => !busy_nodes.contains(node.as_str()) && !not_serving.contains(s.name.as_str()),
                    None => s.power_state == PowerState::On && s.claim.is_none(),
                };
            Some(Seen { server: s.name.clone(), idle, recorded, busy_at_least_until })
        })
        .collect();
    let (idle, writes) = clock.observe(&seen, now);
    for s in snapshot.servers.iter_mut() {
        if let Some(&since) = idle.get(&s.name) {
            s.idle_since_s = Some(since);
        }
    }
    writes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(server: &str, idle: bool, recorded: Option<Seconds>) -> Seen {
        Seen { server: server.into(), idle, recorded, busy_at_least_until: None }
    }

    fn write(server: &str, idle_since: Option<Seconds>) -> Write {
        Write { server: server.into(), idle_since }
    }

    #[test]
    fn a_write_the_index_never_shows_is_sent_again_a_minute_on() {
        let mut clock = IdleClock::default();
        assert_eq!(clock.observe(&[seen("a", true, None)], 100).1, [write("a", Some(100))]);
        // Refused by the API: the index keeps showing nothing.
        assert!(clock.observe(&[seen("a", true, None)], 100 + RESEND_AFTER_S - 1).1.is_empty(), "the watch may still catch up");
        assert_eq!(clock.observe(&[seen("a", true, None)], 100 + RESEND_AFTER_S).1, [write("a", Some(100))]);
        assert!(clock.observe(&[seen("a", true, Some(100))], 100 + RESEND_AFTER_S + 2).1.is_empty(), "shown: nothing more");
    }

    #[test]
    fn idle_is_written_once_on_the_transition_and_cleared_once_when_busy() {
        let mut clock = IdleClock::default();
        let (idle, writes) = clock.observe(&[seen("a", true, None)], 100);
        assert_eq!(idle["a"], 100);
        assert_eq!(writes, [write("a", Some(100))]);
        // The watch has not caught up yet: nothing is sent twice.
        let (idle, writes) = clock.observe(&[seen("a", true, None)], 102);
        assert_eq!((idle["a"], writes), (100, vec![]));
        // It has: still nothing.
        assert!(clock.observe(&[seen("a", true, Some(100))], 104).1.is_empty());
        // Busy again: one clear, then quiet.
        let (idle, writes) = clock.observe(&[seen("a", false, Some(100))], 106);
        assert!(idle.is_empty());
        assert_eq!(writes, [write("a", None)]);
        assert!(clock.observe(&[seen("a", false, Some(100))], 108).1.is_empty());
        assert!(clock.observe(&[seen("a", false, None)], 110).1.is_empty());
        // Idle again: counted from now, not from the old record.
        let (idle, writes) = clock.observe(&[seen("a", true, None)], 112);
        assert_eq!((idle["a"], writes), (112, vec![write("a", Some(112))]));
    }

    #[test]
    fn a_restart_carries_on_from_the_recorded_time_without_writing() {
        let mut before = IdleClock::default();
        before.observe(&[seen("a", true, None)], 1000);
        // A new process, 300 s later, reads the record back.
        let mut after = IdleClock::default();
        let (idle, writes) = after.observe(&[seen("a", true, Some(1000))], 1300);
        assert_eq!(idle["a"], 1000);
        assert!(writes.is_empty());
    }

    #[test]
    fn a_record_older_than_the_last_claim_or_node_or_in_the_future_is_not_trusted() {
        let mut clock = IdleClock::default();
        let stale = Seen { busy_at_least_until: Some(1200), ..seen("claimed-since", true, Some(1000)) };
        let future = seen("future", true, Some(5000));
        let (idle, writes) = clock.observe(&[stale, future], 1300);
        assert_eq!(idle["claimed-since"], 1200);
        assert_eq!(idle["future"], 1300);
        assert_eq!(writes, [write("claimed-since", Some(1200)), write("future", Some(1300))]);
    }

    #[test]
    fn a_failed_write_is_sent_again_and_forgetting_starts_from_the_record() {
        let mut clock = IdleClock::default();
        assert_eq!(clock.observe(&[seen("a", true, None)], 10).1.len(), 1);
        clock.failed("a");
        assert_eq!(clock.observe(&[seen("a", true, None)], 12).1, [write("a", Some(10))]);
        // Losing the lease forgets; the next leader writes what it sees.
        clock.forget();
        let (idle, writes) = clock.observe(&[seen("a", true, None)], 20);
        assert_eq!((idle["a"], writes), (20, vec![write("a", Some(20))]));
        // A server gone from the inventory is forgotten too.
        clock.observe(&[], 22);
        assert_eq!(clock.observe(&[seen("a", true, None)], 24).1, [write("a", Some(24))]);
    }
}
