//! Batching of pending pods: decide once pods stop arriving for the idle
//! window, or once the maximum window has passed since the first one, so a
//! burst of pods becomes one plan instead of one claim per pod.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Clone, Copy, Debug)]
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
    first_new: Option<Instant>,
    last_new: Option<Instant>,
    /// How many undecided pods there were at the last observation.
    unseen_at_last: usize,
    /// When the first pod of the batch was seen, for decision latency.
    pub opened_at: Option<Instant>,
}

impl Batcher {
    pub fn new(windows: Windows) -> Self {
        Batcher { windows, decided: BTreeSet::new(), first_new: None, last_new: None, unseen_at_last: 0, opened_at: None }
    }

    /// Takes the pending pods seen now; new ones open or extend the batch.
    /// Pods no longer pending are forgotten, so a pod that returns to
    /// pending (its claim failed) counts as new again.
    pub fn observe<'a>(&mut self, pending: impl IntoIterator<Item = &'a String>, now: Instant) {
        let pending: BTreeSet<&String> = pending.into_iter().collect();
        self.decided.retain(|k| pending.contains(k));
        let new = pending.iter().any(|k| !self.decided.contains(*k));
        if new && self.first_new.is_none() {
            self.first_new = Some(now);
            self.opened_at = Some(now);
        }
        if new {
            // Only a pod never seen before extends the idle window.
            let unseen = pending.iter().filter(|k| !self.decided.contains(**k)).count();
            if unseen != self.unseen_at_last {
                self.last_new = Some(now);
                self.unseen_at_last = unseen;
            }
        }
    }

    /// Whether the batch should be decided now.
    pub fn due(&self, now: Instant) -> bool {
        match (self.first_new, self.last_new) {
            (Some(first), Some(last)) => now >= last + self.windows.idle || now >= first + self.windows.max,
            _ => false,
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
