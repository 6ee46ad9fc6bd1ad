//! The sensitivity test of the product brief: the same workloads against
//! other supply, boot times, stock and request accuracy.

use crate::model::{PowerState, Seconds, Snapshot};
use std::collections::BTreeMap;
use std::fmt;
use thiserror::Error;

/// One change to a snapshot.
#[derive(Clone, Debug, PartialEq)]
pub enum Variation {
    /// Exactly this many free servers of each hardware class are warm.
    Warm(u32),
    /// Every server's cold path (power-on to Ready) takes this long; the
    /// boot stage absorbs the difference.
    ColdPathS(Seconds),
    /// At most this many servers of each hardware class are free; the rest
    /// are taken (in use elsewhere).
    Stock(u32),
    /// Pending pods' requests multiplied by this factor.
    Requests(f64),
    /// The fleet's power budget is this many watts; `None` lifts it.
    PowerBudgetWatts(Option<f64>),
}

impl fmt::Display for Variation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Variation::Warm(n) => write!(f, "warm={n}"),
            Variation::ColdPathS(s) => write!(f, "boot={}", format_duration(*s)),
            Variation::Stock(n) => write!(f, "stock={n}"),
            Variation::Requests(x) => write!(f, "requests=x{x}"),
            Variation::PowerBudgetWatts(None) => write!(f, "budget=none"),
            Variation::PowerBudgetWatts(Some(w)) => write!(f, "budget={w}W"),
        }
    }
}

#[derive(Debug, Error, PartialEq)]
pub enum VaryError {
    #[error("--vary {0:?}: expected KEY=V1,V2,... with KEY one of warm, boot, stock, requests, budget")]
    Shape(String),
    #[error("--vary {key}: value {value:?} is not {expected}")]
    Value { key: String, value: String, expected: &'static str },
}

/// A `boot=` value: a Go duration (`30s`, `5m`, `1h30m`), or a bare
/// number of seconds, in whole seconds rounded up.
pub fn parse_duration(text: &str) -> Option<Seconds> {
    crate::duration::parse_duration_or_seconds(text).ok().map(|d| d.as_nanos().div_ceil(1_000_000_000) as Seconds)
}

pub fn format_duration(s: Seconds) -> String {
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, sec) => format!("{m}m{sec:02}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, _) => format!("{h}h{m:02}m"),
    }
}

/// Parses one `--vary KEY=V1,V2` argument into its variations.
pub fn parse_vary(arg: &str) -> Result<Vec<Variation>, VaryError> {
    let (key, values) = arg.split_once('=').ok_or_else(|| VaryError::Shape(arg.to_string()))?;
    let bad = |value: &str, expected| VaryError::Value { key: key.to_string(), value: value.to_string(), expected };
    values
        .split(',')
        .map(|v| {
            let v = v.trim();
            match key.trim() {
                "warm" => v.parse().map(Variation::Warm).map_err(|_| bad(v, "a count")),
                "stock" => v.parse().map(Variation::Stock).map_err(|_| bad(v, "a count")),
                "boot" => parse_duration(v).map(Variation::ColdPathS).ok_or_else(|| bad(v, "a duration like 5m")),
                "requests" => v
                    .trim_start_matches('x')
                    .parse::<f64>()
                    .ok()
                    .filter(|x| x.is_finite() && *x > 0.0)
                    .map(Variation::Requests)
                    .ok_or_else(|| bad(v, "a positive factor like x1.5")),
                "budget" if v == "none" => Ok(Variation::PowerBudgetWatts(None)),
                "budget" => v
                    .parse::<f64>()
                    .ok()
                    .filter(|w| w.is_finite() && *w > 0.0)
                    .map(|w| Variation::PowerBudgetWatts(Some(w)))
                    .ok_or_else(|| bad(v, "a positive number of watts like 12000, or none")),
                _ => Err(VaryError::Shape(arg.to_string())),
            }
        })
        .collect()
}

/// Every combination of the given axes, in order (the first axis varies slowest).
pub fn combinations(axes: &[Vec<Variation>]) -> Vec<Vec<Variation>> {
    let mut out: Vec<Vec<Variation>> = vec![Vec::new()];
    for axis in axes {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                axis.iter().map(move |v| {
                    let mut row = prefix.clone();
                    row.push(v.clone());
                    row
                })
            })
            .collect();
    }
    out
}

fn hardware_class(s: &crate::model::Server) -> String {
    format!("{:?}|{:?}", s.capacity, s.labels.get("nvidia.com/gpu.product"))
}

/// Calls `f` on every free server with its index among the free servers of
/// its hardware class, in name order.
fn each_free_server_by_class(snap: &mut Snapshot, mut f: impl FnMut(&mut crate::model::Server, u32)) {
    let mut seen: BTreeMap<String, u32> = BTreeMap::new();
    let mut order: Vec<usize> = (0..snap.servers.len()).collect();
    order.sort_by(|&a, &b| snap.servers[a].name.cmp(&snap.servers[b].name));
    for i in order {
        let s = &mut snap.servers[i];
        if s.is_available() {
            let k = seen.entry(hardware_class(s)).or_default();
            f(s, *k);
            *k += 1;
        }
    }
}

/// The snapshot with the variations applied, in order.
pub fn apply(snapshot: &Snapshot, variations: &[Variation]) -> Snapshot {
    let mut snap = snapshot.clone();
    for v in variations {
        match v {
            Variation::Warm(n) => each_free_server_by_class(&mut snap, |s, k| {
                s.power_state = if k < *n { PowerState::On } else { PowerState::Off };
            }),
            Variation::ColdPathS(total) => {
                for s in &mut snap.servers {
                    let d = &mut s.durations;
                    d.boot_s = total.saturating_sub(d.power_on_s + d.join_s + d.ready_s);
                }
            }
            Variation::Stock(n) => each_free_server_by_class(&mut snap, |s, k| {
                if k >= *n {
                    s.claim = Some("taken-elsewhere".into());
                }
            }),
            Variation::Requests(x) => {
                for p in snap.pods.iter_mut_where(|p| p.is_pending_demand()) {
                    p.requests = p.requests.scaled(*x);
                }
            }
            Variation::PowerBudgetWatts(w) => snap.power_budget_watts = *w,
        }
    }
    snap
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::worked_example;

    #[test]
    fn durations_parse_in_the_usual_forms() {
        for (t, want) in [("90", Some(90)), ("30s", Some(30)), ("5m", Some(300)), ("1h30m", Some(5400)), ("48h", Some(172800)), ("1.5m", Some(90))] {
            assert_eq!(parse_duration(t), want, "{t}");
        }
        for bad in ["", "5x", "m", "5m3", "-1", "2d"] {
            assert_eq!(parse_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn vary_arguments_parse_or_name_what_is_wrong() {
        assert_eq!(parse_vary("warm=0,1,2").unwrap().len(), 3);
        assert_eq!(parse_vary("requests=x0.5,x1").unwrap(), vec![Variation::Requests(0.5), Variation::Requests(1.0)]);
        assert!(matches!(parse_vary("boot=5q"), Err(VaryError::Value { .. })));
        assert!(matches!(parse_vary("colour=red"), Err(VaryError::Shape(_))));
        assert!(matches!(parse_vary("warm"), Err(VaryError::Shape(_))));
        assert_eq!(parse_vary("budget=none,12000").unwrap(), vec![Variation::PowerBudgetWatts(None), Variation::PowerBudgetWatts(Some(12000.0))]);
        for bad in ["budget=0", "budget=-1", "budget=NaN", "budget=12kW"] {
            assert!(matches!(parse_vary(bad), Err(VaryError::Value { .. })), "{bad}");
        }
    }

    #[test]
    fn a_budget_row_caps_the_fleet_and_none_lifts_the_cap() {
        let mut capped = worked_example();
        capped.power_budget_watts = Some(500.0);
        let rows: Vec<String> = parse_vary("budget=none,1000").unwrap().iter().map(|v| v.to_string()).collect();
        assert_eq!(rows, ["budget=none", "budget=1000W"]);
        assert_eq!(apply(&capped, &[Variation::PowerBudgetWatts(None)]).power_budget_watts, None);
        let snap = apply(&capped, &[Variation::PowerBudgetWatts(Some(1000.0))]);
        assert_eq!(snap.power_budget_watts, Some(1000.0));
        let plan = crate::provision(&snap, 0);
        let gpu = plan.decision("ml/gpu-inference-1").expect("decided");
        assert!(matches!(gpu.outcome, crate::Outcome::Unschedulable { reason: crate::Unschedulable::PowerBudget { .. } }), "{:?}", gpu.outcome);
    }

    #[test]
    fn combinations_cover_the_cross_product() {
        let axes = vec![parse_vary("warm=0,1").unwrap(), parse_vary("boot=5m,30m,1h").unwrap()];
        let rows = combinations(&axes);
        assert_eq!(rows.len(), 6);
        assert_eq!(rows[1], vec![Variation::Warm(0), Variation::ColdPathS(1800)]);
    }

    #[test]
    fn warm_zero_makes_every_spare_cold_and_stock_zero_takes_them_all() {
        let snap = apply(&worked_example(), &[Variation::Warm(0)]);
        assert!(snap.servers.iter().all(|s| !s.is_warm()));
        let snap = apply(&worked_example(), &[Variation::Stock(0)]);
        assert!(snap.servers.iter().all(|s| !s.is_available()));
        let snap = apply(&worked_example(), &[Variation::ColdPathS(1800)]);
        assert!(snap.servers.iter().all(|s| s.durations.cold_s() == 1800));
    }
}
