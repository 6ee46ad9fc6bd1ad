//! How failures are paced: a claim's power attempts are retried with a
//! doubling delay up to a number of attempts; a server whose claim failed
//! waits out a doubling backoff before it is chosen again, and is
//! quarantined after a number of failures in a row.

use std::time::Duration;

use ironclaim_core::model::{Health, Seconds, Snapshot};

/// How a claim's power actions are retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    pub base: Duration,
    pub max: Duration,
    /// After this many failed attempts the claim fails with the last reason.
    pub attempts: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Retry { base: Duration::from_secs(2), max: Duration::from_secs(60), attempts: 6 }
    }
}

impl Retry {
    /// The wait after the `attempt`-th failure in a row (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        self.base.saturating_mul(1 << attempt.saturating_sub(1).min(16)).min(self.max)
    }
}

/// How long a server that failed a claim waits before it is tried again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureBackoff {
    pub base_s: Seconds,
    pub max_s: Seconds,
}

impl Default for FailureBackoff {
    fn default() -> Self {
        FailureBackoff { base_s: 60, max_s: 3600 }
    }
}

impl FailureBackoff {
    /// Doubling with each failure in a row, capped.
    pub fn after(&self, failures: u32) -> Seconds {
        let doublings = failures.saturating_sub(1).min(20);
        self.base_s.saturating_mul(1 << doublings).min(self.max_s)
    }

    /// Whether a server with `failures` in a row, the last at
    /// `last_failure_s`, still waits out its backoff at `now_s`.
    pub fn waiting(&self, failures: u32, last_failure_s: Option<Seconds>, now_s: Seconds) -> bool {
        self.ends_at(failures, last_failure_s).is_some_and(|end| now_s < end)
    }

    /// When the backoff of a server with `failures` in a row, the last at
    /// `last_failure_s`, ends; None with no failure or no time recorded.
    pub fn ends_at(&self, failures: u32, last_failure_s: Option<Seconds>) -> Option<Seconds> {
        let at = last_failure_s.filter(|_| failures > 0)?;
        Some(at.saturating_add(self.after(failures)))
    }

    /// Marks the healthy servers of `snapshot` that still wait out their
    /// backoff [`Health::Failed`], so the core chooses them not at all.
    /// `last_failure_s` gives each server's last failed claim. Returns
    /// when the first of the servers it marked may be chosen again.
    pub fn apply(&self, snapshot: &mut Snapshot, last_failure_s: impl Fn(&str) -> Option<Seconds>, now_s: Seconds) -> Option<Seconds> {
        let mut first_end: Option<Seconds> = None;
        for s in snapshot.servers.iter_mut() {
            if s.health != Health::Healthy || s.failures == 0 {
                continue;
            }
            if let Some(end) = self.ends_at(s.failures, last_failure_s(&s.name))
                && now_s < end
            {
                s.health = Health::Failed;
                first_end = Some(first_end.map_or(end, |f| f.min(end)));
            }
        }
        first_end
    }
}

/// Whether a server with `failures` in a row (this one counted) is
/// quarantined: taken out until an operator releases it.
pub fn quarantines(failures: u32, quarantine_after: u32) -> bool {
    quarantine_after > 0 && failures >= quarantine_after
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retries_double_from_the_base_up_to_the_cap() {
        let r = Retry { base: Duration::from_secs(2), max: Duration::from_secs(60), attempts: 6 };
        let delays: Vec<u64> = (1..=7).map(|a| r.delay(a).as_secs()).collect();
        assert_eq!(delays, [2, 4, 8, 16, 32, 60, 60]);
        assert_eq!(r.delay(u32::MAX), Duration::from_secs(60));
    }

    #[test]
    fn a_failed_server_waits_a_doubling_backoff_capped_and_then_is_chosen_again() {
        let b = FailureBackoff { base_s: 60, max_s: 3600 };
        assert_eq!((1..=8).map(|f| b.after(f)).collect::<Vec<_>>(), [60, 120, 240, 480, 960, 1920, 3600, 3600]);
        assert!(b.waiting(2, Some(1000), 1119));
        assert!(!b.waiting(2, Some(1000), 1120));
        assert!(!b.waiting(0, Some(1000), 1001), "no failure, no backoff");
        assert!(!b.waiting(3, None, 0), "a failure with no time recorded is not waited for");
    }

    #[test]
    fn quarantine_comes_with_the_nth_failure_in_a_row_and_zero_disables_it() {
        assert!(!quarantines(2, 3));
        assert!(quarantines(3, 3));
        assert!(!quarantines(100, 0));
    }
}
