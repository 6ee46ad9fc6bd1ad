//! Leader election, sans IO: whether this replica may take the lease, and
//! whether it may act, judged by its own monotonic clock alone.
//!
//! The controller runs it against a `coordination.k8s.io/v1` Lease; the
//! simulator runs it for each of its replicas against the rack's record.
//! `now` is always the replica's own monotonic time.
//!
//! # Guarantees
//! - A candidate takes a held lease only once the record (holder, renew
//!   time, version) has not changed for the lease's duration **as measured
//!   on the candidate's own clock** from the moment it first saw that
//!   record ([`Observer`]). The writer's renew time is compared for
//!   equality only, never with the reader's clock: a holder whose wall
//!   clock runs ahead or behind is still seen renewing, because each
//!   renewal changes the record.
//! - A holder acts only until [`LeaseTimes::renew_deadline`] (two thirds of
//!   the duration) after it *sent* its last successful renewal, and stops
//!   at once when a renewal fails or is refused ([`Tenure`]). So it stops
//!   before any candidate could have watched the record stand still for
//!   the whole duration: two replicas never act at once, whatever their
//!   wall clocks say.
//!
//! # Assumptions
//! The replicas' monotonic clocks run at about the same rate (a third of
//! the duration of drift is allowed for, with the renewal's round trip).

use std::time::Duration;

/// The timings of a lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimes {
    /// How long a holder that stopped renewing keeps the lease.
    pub duration: Duration,
}

impl LeaseTimes {
    /// How often the holder renews: a third of the duration.
    pub fn renew_every(&self) -> Duration {
        self.duration / 3
    }

    /// How long after a renewal was sent this replica may act on it: two
    /// thirds of the duration, leaving a third for clock drift and for the
    /// renewal's own round trip.
    pub fn renew_deadline(&self) -> Duration {
        self.duration * 2 / 3
    }
}

/// The parts of a lease record that change with every renewal. Compared
/// for equality only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Who holds it; empty when nobody does (released).
    pub holder: String,
    /// The writer's renew time (microseconds, by the writer's wall clock).
    pub renew_time: Option<i64>,
    /// The record's version (a resourceVersion).
    pub version: Option<String>,
}

/// What one round of election does with the record it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// There is no lease yet: create it, held by this replica.
    Create,
    /// This replica holds it: renew it.
    Renew,
    /// Nobody holds it, or its holder stopped renewing: take it over.
    Take,
    /// Another replica holds it and renews it: wait.
    Wait,
}

impl Round {
    /// Whether the round writes the record (and, written, holds the lease).
    pub fn writes(self) -> bool {
        self != Round::Wait
    }
}

/// What this replica has seen of the lease record, and since when by its
/// own clock: the only clock a takeover is judged by.
#[derive(Clone, Debug, Default)]
pub struct Observer {
    seen: Option<(Record, Duration)>,
}

impl Observer {
    /// Takes the record read at `now`; returns how long it has stood
    /// unchanged by this replica's clock (zero for a record not seen before).
    pub fn observe(&mut self, record: &Record, now: Duration) -> Duration {
        match &self.seen {
            Some((seen, since)) if seen == record => now.saturating_sub(*since),
            _ => {
                self.seen = Some((record.clone(), now));
                Duration::ZERO
            }
        }
    }

    /// Whether a candidate may take the lease: nobody holds it, or the
    /// record has stood still for `held_for` as this replica measured it.
    pub fn expired(&mut self, record: &Record, held_for: Duration, now: Duration) -> bool {
        let still_for = self.observe(record, now);
        record.holder.is_empty() || still_for >= held_for
    }

    /// The round for `identity` that read `record` (None: no lease yet) at
    /// `now`; `held_for` is the duration the record states.
    pub fn round(&mut self, identity: &str, record: Option<&Record>, held_for: Duration, now: Duration) -> Round {
        let Some(record) = record else { return Round::Create };
        let expired = self.expired(record, held_for, now);
        if record.holder == identity {
            Round::Renew
        } else if expired {
            Round::Take
        } else {
            Round::Wait
        }
    }
}

/// Whether this replica may act: open until the renew deadline after its
/// last successful renewal was sent, shut at once when one fails, is
/// refused or the replica stops.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tenure {
    until: Option<Duration>,
}

impl Tenure {
    /// A renewal (or a take) sent at `sent` succeeded.
    pub fn granted(&mut self, sent: Duration, times: &LeaseTimes) {
        self.until = Some(sent + times.renew_deadline());
    }

    /// A renewal failed or was refused, or this replica stops.
    pub fn revoked(&mut self) {
        self.until = None;
    }

    /// True while this replica holds the lease by its own clock.
    pub fn acting(&self, now: Duration) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    /// When acting ends unless a renewal succeeds first.
    pub fn until(&self) -> Option<Duration> {
        self.until
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn record(holder: &str, renew_s: i64, version: u64) -> Record {
        Record { holder: holder.into(), renew_time: Some(renew_s * 1_000_000), version: Some(version.to_string()) }
    }

    #[test]
    fn a_replica_stops_acting_a_third_of_the_lease_before_another_may_take_it() {
        let times = LeaseTimes { duration: S(15) };
        assert_eq!(times.renew_deadline(), S(10));
        assert!(times.renew_every() < times.renew_deadline());
        let mut tenure = Tenure::default();
        assert!(!tenure.acting(S(0)));
        tenure.granted(S(100), &times);
        assert!(tenure.acting(S(109)));
        assert!(!tenure.acting(S(110)), "shut by its own clock with no renewal");
        tenure.granted(S(110), &times);
        tenure.revoked();
        assert!(!tenure.acting(S(111)), "shut at once when a renewal fails");
        // The holder stopped renewing at 100: a candidate that saw the
        // record at 100 takes it at 115, after the holder shut at 110.
        let mut candidate = Observer::default();
        let held = record("a", 100, 7);
        assert_eq!(candidate.round("b", Some(&held), S(15), S(100)), Round::Wait);
        assert_eq!(candidate.round("b", Some(&held), S(15), S(114)), Round::Wait);
        assert_eq!(candidate.round("b", Some(&held), S(15), S(115)), Round::Take);
    }

    /// Issue 14, hole 3: with a holder whose wall clock runs an hour ahead
    /// or behind, its renew time lies in the candidate's future or far in
    /// its past; judged by wall clocks (`|now - renewTime| >= duration`)
    /// that counted as expired, and both replicas led. Judged by the
    /// candidate's own observation, a holder that keeps renewing is never
    /// taken over, whatever its clock says.
    #[test]
    fn a_holder_whose_clock_runs_ahead_or_behind_keeps_the_lease_while_it_renews() {
        for skew in [3600, -3600] {
            let mut candidate = Observer::default();
            for round in 0..10u64 {
                let now = S(1000 + round * 5);
                let seen = record("a", 1000 + skew + round as i64 * 5, 100 + round);
                assert_eq!(candidate.round("b", Some(&seen), S(15), now), Round::Wait, "taken over at round {round}, skew {skew}");
            }
        }
    }

    #[test]
    fn every_round_by_what_was_read() {
        let mut o = Observer::default();
        assert_eq!(o.round("a", None, S(15), S(0)), Round::Create);
        assert_eq!(o.round("a", Some(&record("a", 0, 1)), S(15), S(1)), Round::Renew);
        assert_eq!(o.round("a", Some(&record("", 0, 2)), S(15), S(2)), Round::Take, "released: taken at once");
        assert_eq!(o.round("a", Some(&record("b", 0, 3)), S(15), S(3)), Round::Wait, "a new record: not expired");
        assert_eq!(o.round("a", Some(&record("b", 0, 3)), S(15), S(18)), Round::Take);
        assert!(!Round::Wait.writes() && Round::Take.writes() && Round::Renew.writes() && Round::Create.writes());
    }
}
