//! The Pareto picture: energy against waiting.
//!
//! A run is a point with three costs, all to be kept low: energy (kWh),
//! deadline misses and the p99 of pending time. A point is dominated when
//! another is no worse on every cost and better on one; the points no
//! other dominates are the frontier. Policies are compared this way, and
//! `--sweep` runs the ironclaim policy over its knobs to draw its own
//! frontier: the best trade of watts for waiting each setting buys.

use crate::config::PolicySettings;
use ironclaim_core::Seconds;
use serde::Serialize;

/// The costs of one run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Costs {
    pub energy_kwh: f64,
    pub deadline_misses: u64,
    pub pending_p99_s: Seconds,
}

impl Costs {
    /// Whether `self` dominates `other`: no worse on every cost, better on
    /// at least one. Energy is compared to the watt-hour, so that two runs
    /// a rounding apart are taken as equal.
    pub fn dominates(&self, other: &Costs) -> bool {
        let (a, b) = (wh(self.energy_kwh), wh(other.energy_kwh));
        let no_worse = a <= b && self.deadline_misses <= other.deadline_misses && self.pending_p99_s <= other.pending_p99_s;
        let better = a < b || self.deadline_misses < other.deadline_misses || self.pending_p99_s < other.pending_p99_s;
        no_worse && better
    }
}

fn wh(kwh: f64) -> i64 {
    (kwh * 1000.0).round() as i64
}

/// For each point, the first other point that dominates it (None: it is on
/// the frontier). Points with equal costs do not dominate each other.
pub fn dominated_by(points: &[Costs]) -> Vec<Option<usize>> {
    points.iter().map(|p| points.iter().position(|q| q.dominates(p))).collect()
}

/// A knob of the ironclaim policy that `--sweep` can vary: the adaptive
/// floor's margin and look-back window, as a ServerPool writes them under
/// `spec.warmSpares.adaptive` (`z`, `window`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Knob {
    /// Standard deviations of margin above the expected demand.
    Z,
    /// How far back arrivals count, in seconds.
    Window,
}

impl Knob {
    pub fn name(self) -> &'static str {
        match self {
            Knob::Z => "z",
            Knob::Window => "window",
        }
    }

    /// Sets the knob in `settings`.
    pub fn set(self, settings: &mut PolicySettings, value: f64) {
        match self {
            Knob::Z => settings.floor_z = value,
            Knob::Window => settings.rate_window_s = value as Seconds,
        }
    }

    /// The knob's value as a person writes it (`1.5`, `4h`).
    pub fn show(self, value: f64) -> String {
        match self {
            Knob::Z => format!("{value}"),
            Knob::Window => {
                let s = value as Seconds;
                if s.is_multiple_of(3600) {
                    format!("{}h", s / 3600)
                } else if s.is_multiple_of(60) {
                    format!("{}m", s / 60)
                } else {
                    format!("{s}s")
                }
            }
        }
    }
}

/// A knob and the values a sweep gives it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Axis {
    pub knob: Knob,
    pub values: Vec<f64>,
}

/// Every combination of the axes' values, the first axis slowest; one
/// empty setting when there are no axes.
pub fn grid(axes: &[Axis]) -> Vec<Vec<(Knob, f64)>> {
    let mut out: Vec<Vec<(Knob, f64)>> = vec![Vec::new()];
    for axis in axes {
        out = out.into_iter().flat_map(|prefix| axis.values.iter().map(move |&v| [prefix.clone(), vec![(axis.knob, v)]].concat())).collect();
    }
    out
}

/// One run of a sweep: the knobs' values and what the run cost.
#[derive(Clone, Debug, Serialize)]
pub struct SweepPoint {
    pub settings: Vec<(Knob, f64)>,
    pub costs: Costs,
    /// On the sweep's frontier.
    pub frontier: bool,
}

impl SweepPoint {
    /// `z=1.5 window=4h`.
    pub fn label(&self) -> String {
        self.settings.iter().map(|(k, v)| format!("{}={}", k.name(), k.show(*v))).collect::<Vec<_>>().join(" ")
    }
}

/// The ironclaim policy over every combination of the axes.
#[derive(Clone, Debug, Serialize)]
pub struct Sweep {
    pub axes: Vec<Axis>,
    pub points: Vec<SweepPoint>,
}

impl Sweep {
    /// Builds the sweep from its points' settings and costs, marking the
    /// frontier.
    pub fn new(axes: Vec<Axis>, runs: Vec<(Vec<(Knob, f64)>, Costs)>) -> Sweep {
        let costs: Vec<Costs> = runs.iter().map(|(_, c)| *c).collect();
        let under = dominated_by(&costs);
        let points = runs.into_iter().zip(under).map(|((settings, costs), d)| SweepPoint { settings, costs, frontier: d.is_none() }).collect();
        Sweep { axes, points }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(e: f64, m: u64, p: Seconds) -> Costs {
        Costs { energy_kwh: e, deadline_misses: m, pending_p99_s: p }
    }

    #[test]
    fn a_point_better_on_one_cost_and_no_worse_on_the_others_dominates() {
        assert!(c(40.0, 5, 60).dominates(&c(41.0, 5, 60)));
        assert!(!c(40.0, 6, 60).dominates(&c(41.0, 5, 60)), "a trade is not domination");
        assert!(!c(40.0, 5, 60).dominates(&c(40.0, 5, 60)), "equal points do not dominate");
        assert!(!c(40.0, 5, 60).dominates(&c(40.0004, 5, 60)), "half a watt-hour apart is equal");
        assert_eq!(dominated_by(&[c(44.0, 27, 1230), c(52.2, 13, 1230), c(45.2, 15, 1230), c(46.0, 15, 1230)]), vec![None, None, None, Some(2)]);
    }

    #[test]
    fn the_grid_is_every_combination_first_axis_slowest() {
        let axes = [Axis { knob: Knob::Z, values: vec![0.0, 1.0] }, Axis { knob: Knob::Window, values: vec![3600.0, 7200.0, 14_400.0] }];
        let g = grid(&axes);
        assert_eq!(g.len(), 6);
        assert_eq!(g[0], vec![(Knob::Z, 0.0), (Knob::Window, 3600.0)]);
        assert_eq!(g[5], vec![(Knob::Z, 1.0), (Knob::Window, 14_400.0)]);
        assert_eq!(grid(&[]), vec![Vec::<(Knob, f64)>::new()]);
        assert_eq!(Knob::Window.show(14_400.0), "4h");
        assert_eq!(Knob::Window.show(5400.0), "90m");
        assert_eq!(Knob::Window.show(86_400.0), "24h", "as --sweep takes it back");
    }

    proptest! {
        /// Checked against the definition, pair by pair: a frontier point
        /// has no point strictly better, and a point off the frontier is
        /// dominated by the one named.
        #[test]
        fn the_frontier_is_exactly_the_undominated_points(raw in proptest::collection::vec((0u32..50, 0u64..6, 0u64..6), 0..30)) {
            let points: Vec<Costs> = raw.iter().map(|&(e, m, p)| c(f64::from(e), m, p * 60)).collect();
            let under = dominated_by(&points);
            for (i, p) in points.iter().enumerate() {
                let better = |q: &Costs| q.energy_kwh <= p.energy_kwh && q.deadline_misses <= p.deadline_misses && q.pending_p99_s <= p.pending_p99_s
                    && (q.energy_kwh, q.deadline_misses, q.pending_p99_s) != (p.energy_kwh, p.deadline_misses, p.pending_p99_s);
                match under[i] {
                    None => prop_assert!(!points.iter().any(better), "{i} is on the frontier but dominated"),
                    Some(j) => prop_assert!(better(&points[j]), "{j} does not dominate {i}"),
                }
            }
            // A set of points always has a frontier.
            if !points.is_empty() {
                prop_assert!(under.iter().any(Option::is_none));
            }
        }
    }
}
