//! Batching of pending pods: decide once pods stop arriving for the idle
//! window, or once the maximum window has passed since the first one, so a
//! burst of pods becomes one plan instead of one claim per pod.
//!
//! Time is an input (`now`, a [`Duration`] since any fixed epoch the
//! driver's runner chooses): the controller passes its monotonic clock,
//! the simulator its virtual one.

use std::collections::BTreeSet;
use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Windows {
    /// Decide once no new pending pod arrived for this long.
    pub idle: Duration,
    /// Decide at the latest this long after the first new pending pod.
    pub max: Duration,
}

impl Default for Windows {
    fn default() -> Self {
        Windows { idle: Duration::from_secs(1), max: Duration::from_secs(10) }
    }
}

/// The batch under way.
#[derive(Debug)]
pub struct Batcher {
    windows: Windows,
    /// Pending pods already decided on, so that only new ones open a batch.
    decided: BTreeSet<String>,
    first_new: Option<Duration>,
    last_new: Option<Duration>,
    /// How many undecided pods there were at the last observation.
    unseen_at_last: usize,
    /// When the first pod of the batch was seen, for decision latency.
    pub opened_at: Option<Duration>,
}

impl Batcher {
    pub fn new(windows: Windows) -> Self {
        Batcher { windows, decided: BTreeSet::new(), first_new: None, last_new: None, unseen_at_last: 0, opened_at: None }
    }

    /// Takes the pending pods seen now; new ones open or extend the batch.
    /// Pods no longer pending are forgotten, so a pod that returns to
    /// pending (its claim failed) counts as new again.
    pub fn observe<'a>(&mut self, pending: impl IntoIterator<Item = &'a String>, now: Duration) {
        let pending: BTreeSet<&String> = pending.into_iter().collect();
        self.decided.retain(|k| pending.contains(k));
        let unseen = pending.iter().filter(|k| !self.decided.contains(**k)).count();
        if unseen == 0 {
            return;
        }
        if self.first_new.is_none() {
            self.first_new = Some(now);
            self.opened_at = Some(now);
        }
        // Only a pod never seen before extends the idle window.
        if unseen != self.unseen_at_last {
            self.last_new = Some(now);
            self.unseen_at_last = unseen;
        }
    }

    /// Whether the batch should be decided now.
    pub fn due(&self, now: Duration) -> bool {
        match (self.first_new, self.last_new) {
            (Some(first), Some(last)) => now >= last + self.windows.idle || now >= first + self.windows.max,
            _ => false,
        }
    }

    /// When the batch falls due if no further pod arrives; None without one.
    pub fn due_at(&self) -> Option<Duration> {
        match (self.first_new, self.last_new) {
            (Some(first), Some(last)) => Some((last + self.windows.idle).min(first + self.windows.max)),
            _ => None,
        }
    }

    /// Closes the batch: the pods pending now are decided.
    pub fn decided<'a>(&mut self, pending: impl IntoIterator<Item = &'a String>) {
        self.decided.extend(pending.into_iter().cloned());
        self.first_new = None;
        self.last_new = None;
        self.unseen_at_last = 0;
    }

    /// Forgets every decision: all pending pods count as new (after a
    /// claim failed, or leadership was gained).
    pub fn forget(&mut self) {
        self.decided.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: u64) -> Duration {
        Duration::from_secs(x)
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_burst_is_decided_once_pods_stop_arriving_for_the_idle_window() {
        let mut b = Batcher::new(Windows { idle: s(1), max: s(10) });
        b.observe(&keys(&["a"]), s(0));
        b.observe(&keys(&["a", "b"]), s(0) + Duration::from_millis(600));
        assert!(!b.due(s(1)));
        assert!(b.due(s(2)));
        assert_eq!(b.due_at(), Some(Duration::from_millis(1600)));
        b.decided(&keys(&["a", "b"]));
        assert!(!b.due(s(3)));
        b.observe(&keys(&["a", "b"]), s(4));
        assert_eq!(b.due_at(), None, "decided pods open no batch");
    }

    #[test]
    fn a_steady_trickle_is_decided_at_the_maximum_window() {
        let mut b = Batcher::new(Windows { idle: s(1), max: s(10) });
        let mut pending = Vec::new();
        for t in 0..20u64 {
            pending.push(format!("p{t}"));
            b.observe(&pending, Duration::from_millis(t * 900));
            if b.due(Duration::from_millis(t * 900)) {
                assert!(t * 900 >= 10_000, "due at {t}");
                return;
            }
        }
        panic!("never due");
    }

    #[test]
    fn a_pod_back_to_pending_counts_as_new_and_forget_reopens_everything() {
        let mut b = Batcher::new(Windows { idle: s(1), max: s(10) });
        b.observe(&keys(&["a"]), s(0));
        b.decided(&keys(&["a"]));
        b.observe(&keys(&[]), s(5));
        b.observe(&keys(&["a"]), s(6));
        assert!(b.due(s(7)));
        b.decided(&keys(&["a"]));
        b.forget();
        b.observe(&keys(&["a"]), s(8));
        assert!(b.due(s(9)));
    }
}
