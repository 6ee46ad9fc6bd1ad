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
    let abandoned: Vec<(&str, Seconds)> =
        nodes.into_iter().filter_map(|(node, value)| Some((node, value.parse::<jiff::Timestamp>().ok()?.as_second().max(0) as Seconds))).collect();
    ironclaim_driver::pacing::cooling(abandoned, now, cool_down_s)
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
}
