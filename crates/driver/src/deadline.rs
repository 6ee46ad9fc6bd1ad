//! Slow versus stuck: each stage of a server's path to Ready has a budget
//! from that server's own measured durations (median and tail), and a
//! stage past its budget is stuck.

use ironclaim_core::model::{Seconds, StageDurations};

use crate::Stage;

/// What a stage of one server usually takes, and when it is stuck.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// The median.
    pub usual_s: Seconds,
    /// The 90th percentile times the margin: past this the stage is stuck.
    pub stuck_after_s: Seconds,
}

/// Deadlines from the server's measured (or configured) durations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    /// Stuck once a stage runs this many percent of its p90 (200 = twice).
    pub margin_percent: u32,
    /// No stage is stuck sooner than this, whatever the measurements say.
    pub floor_s: Seconds,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines { margin_percent: 200, floor_s: 5 }
    }
}

impl Deadlines {
    /// The budget of `stage` on a server with durations `d`; `None` for
    /// stages that wait on nothing physical.
    pub fn budget(&self, stage: Stage, d: &StageDurations) -> Option<Budget> {
        let usual_s = match stage {
            Stage::PoweringOn => d.power_on_s,
            Stage::Booting => d.boot_s,
            Stage::Joined => d.join_s + d.ready_s,
            _ => return None,
        };
        let p90 = usual_s.saturating_mul(u64::from(d.tail_percent)) / 100;
        let stuck_after_s = (p90.saturating_mul(u64::from(self.margin_percent)) / 100).max(self.floor_s);
        Some(Budget { usual_s, stuck_after_s })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_that_boots_in_four_minutes_is_stuck_after_twice_its_tail() {
        let d = StageDurations { power_on_s: 30, boot_s: 240, join_s: 30, ready_s: 30, tail_percent: 150 };
        let budget = Deadlines::default().budget(Stage::Booting, &d).unwrap();
        assert_eq!(budget, Budget { usual_s: 240, stuck_after_s: 720 });
        let slow_server = StageDurations { boot_s: 1800, ..d };
        assert_eq!(Deadlines::default().budget(Stage::Booting, &slow_server).unwrap().stuck_after_s, 5400);
        assert_eq!(Deadlines::default().budget(Stage::Joined, &d).unwrap().usual_s, 60);
        assert_eq!(Deadlines::default().budget(Stage::Ready, &d), None);
        let instant = StageDurations { power_on_s: 0, ..d };
        assert_eq!(Deadlines::default().budget(Stage::PoweringOn, &instant).unwrap().stuck_after_s, 5, "the floor");
    }
}
