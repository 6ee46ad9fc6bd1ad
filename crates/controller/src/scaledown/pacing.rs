//! When a drain the core proposes may start: the driver's rules
//! ([`ironclaim_driver::pacing`]), with the abandonment read from the
//! Node's [`DRAIN_ABANDONED_ANNOTATION`](super::drain::DRAIN_ABANDONED_ANNOTATION),
//! so the cool-down survives a restart and a change of leader.

use std::collections::BTreeMap;

use ironclaim_core::model::Seconds;

pub use ironclaim_driver::pacing::{Settling, Waiting, drop_cooling, hold_cooling};

/// Nodes still cooling down after an abandoned drain, with the second
/// their cool-down ends, from `(node, annotation value)` pairs; a value
/// that is not a time is ignored.
pub fn cooling<'a>(nodes: impl IntoIterator<Item = (&'a str, &'a str)>, now: Seconds, cool_down_s: Seconds) -> BTreeMap<String, Seconds> {
    let abandoned: Vec<(&str, Seconds)> = nodes.into_iter().filter_map(|(node, value)| Some((node, abandoned_at(value)?))).collect();
    ironclaim_driver::pacing::cooling(abandoned, now, cool_down_s)
}

/// The second an annotation value says a drain was abandoned, rounded up
/// so that a cool-down never ends early; `None` when it is not a time.
pub fn abandoned_at(value: &str) -> Option<Seconds> {
    let at = value.parse::<jiff::Timestamp>().ok()?;
    let up = at.as_second().saturating_add(i64::from(at.subsec_nanosecond() > 0));
    Some(up.max(0) as Seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cooling_reads_the_annotation_and_ends_after_the_cool_down() {
        let at = "2026-11-30T08:00:00Z";
        let t0 = at.parse::<jiff::Timestamp>().unwrap().as_second() as Seconds;
        let annotated = [("n1", at), ("bad", "yesterday")];
        assert_eq!(cooling(annotated, t0 + 599, 600), BTreeMap::from([("n1".to_string(), t0 + 600)]));
        assert!(cooling(annotated, t0 + 600, 600).is_empty());
    }

    /// The stamp carries nanoseconds; read truncated, a cool-down ended up
    /// to a second early.
    #[test]
    fn a_stamp_within_a_second_is_read_up_to_the_next_second() {
        let t0 = "2026-11-30T08:00:00Z".parse::<jiff::Timestamp>().unwrap().as_second() as Seconds;
        assert_eq!(abandoned_at("2026-11-30T08:00:00.4Z"), Some(t0 + 1));
        assert_eq!(abandoned_at("2026-11-30T08:00:00Z"), Some(t0));
        assert_eq!(cooling([("n1", "2026-11-30T08:00:00.4Z")], t0 + 600, 600).len(), 1, "cooling until 08:10:00.4");
    }
}
