//! Warm-spare floors: how many idle, powered-on servers of a hardware class
//! a NodePool keeps, so that a burst lands in seconds instead of a cold boot.
//!
//! # The adaptive floor
//! Over a look-back window, count the arrivals that needed a server of the
//! class of their own (fresh demand) and whose deadline is shorter than the
//! class's cold path: only those would miss it waiting for a boot. With that
//! rate `r` and the cold path `t`, `m = r * t` fresh servers are expected
//! while a cold one boots. Arrivals are taken as a Poisson process, so the
//! floor is its mean plus `z` standard deviations: `ceil(m + z * sqrt(m))`,
//! 0 with no recent urgent demand, at most the servers the class has.
//!
//! # Guarantees
//! - The floor of a class is at least its static floor while that applies,
//!   and never below what the same arrivals gave with fewer of them.
//! - Arrivals outside the window, or in the future, count for nothing.

use crate::model::*;
use std::collections::BTreeMap;

/// A rate is measured over at least this long (or the whole window when it
/// is shorter): one burst right after the driver started would otherwise
/// read as an enormous rate.
pub const MIN_RATE_SPAN_S: Seconds = 3600;

/// The shortest look-back window honoured; shorter ones are read as this.
pub const MIN_WINDOW_S: Seconds = 60;

/// `ceil(m + z * sqrt(m))` with `m = urgent * cold_path_s / span_s`.
pub fn floor_for_rate(urgent: usize, cold_path_s: Seconds, span_s: Seconds, z: f64) -> u32 {
    if urgent == 0 {
        return 0;
    }
    let m = urgent as f64 * cold_path_s as f64 / span_s.max(1) as f64;
    let z = if z.is_finite() { z.max(0.0) } else { 0.0 };
    let floor = (m + z * m.sqrt()).ceil();
    if floor >= f64::from(u32::MAX) { u32::MAX } else { floor as u32 }
}

/// How long the arrivals were observed, within the window.
pub fn rate_span_s(window_s: Seconds, since_s: Seconds, now_s: Seconds) -> Seconds {
    let window_s = window_s.max(MIN_WINDOW_S);
    now_s.saturating_sub(since_s).min(window_s).max(MIN_RATE_SPAN_S.min(window_s))
}

/// The median cold path (power-on to Ready) of a class's servers; None for
/// an empty class.
pub fn cold_path_s(members: &[&Server]) -> Option<Seconds> {
    let mut paths: Vec<Seconds> = members.iter().map(|s| s.durations.cold_s()).collect();
    paths.sort_unstable();
    paths.get(paths.len() / 2).copied()
}

/// The adaptive floor of one class: `arrivals` are the class's fresh
/// demand as (time, deadline) pairs, the deadline already defaulted by the
/// caller (None: no deadline, which counts as urgent); `members` every
/// server of the class whatever its state; arrivals are complete since
/// `since_s`.
pub fn adaptive_floor(
    arrivals: impl IntoIterator<Item = (Seconds, Option<Seconds>)>,
    members: &[&Server],
    policy: &AdaptiveFloor,
    since_s: Seconds,
    now_s: Seconds,
) -> u32 {
    let Some(cold) = cold_path_s(members) else { return 0 };
    let window_s = policy.window_s.max(MIN_WINDOW_S);
    let horizon = now_s.saturating_sub(window_s);
    let urgent =
        arrivals.into_iter().filter(|&(at, _)| at >= horizon && at <= now_s).filter(|&(_, deadline)| deadline.is_none_or(|d| d < cold)).count();
    let floor = floor_for_rate(urgent, cold, rate_span_s(window_s, since_s, now_s), policy.z);
    floor.min(u32::try_from(members.len()).unwrap_or(u32::MAX))
}

/// The NodePool a server belongs to: its node's `ironclaim.dev/nodepool`
/// label when it is a node, else the heaviest pool that admits it.
pub(crate) fn pool_of<'a>(pools: &'a [NodePool], server: &Server, node: Option<&Node>) -> Option<&'a NodePool> {
    if let Some(name) = node.and_then(|n| n.labels.get(crate::provision::NODEPOOL_LABEL)) {
        return pools.iter().find(|p| &p.name == name);
    }
    let mut admitting: Vec<&NodePool> = pools.iter().filter(|p| p.admits(server)).collect();
    admitting.sort_by(|a, b| b.weight.cmp(&a.weight).then(a.name.cmp(&b.name)));
    admitting.first().copied()
}

/// A server's class under a pool: the value of the pool's class label, else
/// its capacity written out.
pub fn class_of(server: &Server, pool: Option<&NodePool>) -> String {
    let label = pool.and_then(|p| p.warm.class_label.as_deref()).unwrap_or(CLASS_LABEL);
    server.labels.get(label).cloned().unwrap_or_else(|| format!("{}", server.capacity))
}

/// The static floor of a class, zero outside the pool's schedule.
fn static_floor(pool: &NodePool, class: &str, now_s: Seconds) -> u32 {
    if pool.warm.window.as_ref().is_some_and(|w| !w.is_active(now_s)) {
        return 0;
    }
    pool.warm.floor.get(class).copied().unwrap_or(0)
}

/// The warm floor of every (NodePool, class) that has servers: the larger
/// of the static floor and, where the pool enables it, the adaptive floor
/// from `snapshot.arrivals`. Servers no pool admits have no floor.
pub fn floors(snapshot: &Snapshot, now_s: Seconds) -> BTreeMap<(String, String), u32> {
    let pools = &snapshot.pools;
    let mut members: BTreeMap<(String, String), Vec<&Server>> = BTreeMap::new();
    let mut key_of: BTreeMap<&str, (String, String)> = BTreeMap::new();
    for s in &snapshot.servers {
        let Some(pool) = pool_of(pools, s, None) else { continue };
        let key = (pool.name.clone(), class_of(s, Some(pool)));
        key_of.insert(s.name.as_str(), key.clone());
        members.entry(key).or_default().push(s);
    }
    let mut arrivals: BTreeMap<&(String, String), Vec<&Arrival>> = BTreeMap::new();
    for a in &snapshot.arrivals {
        if let Some(key) = key_of.get(a.server.as_str()) {
            arrivals.entry(key).or_default().push(a);
        }
    }
    let mut out = BTreeMap::new();
    for (key, servers) in &members {
        let Some(pool) = pools.iter().find(|p| p.name == key.0) else { continue };
        let mut floor = static_floor(pool, &key.1, now_s);
        if let Some(adaptive) = &pool.warm.adaptive {
            let seen = arrivals.get(key).map(Vec::as_slice).unwrap_or_default();
            let demand = seen.iter().map(|a| (a.at_s, a.deadline_s.or(pool.deadline_s)));
            floor = floor.max(adaptive_floor(demand, servers, adaptive, snapshot.arrivals_since_s, now_s));
        }
        out.insert(key.clone(), floor);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    fn class(n: usize) -> Vec<Server> {
        (0..n).map(|i| Server::new(&format!("s{i}"), Resources::new(32_000, 1 << 37))).collect()
    }

    #[test]
    fn no_urgent_demand_means_no_adaptive_floor() {
        let servers = class(4);
        let members: Vec<&Server> = servers.iter().collect();
        let cold = cold_path_s(&members).unwrap();
        let policy = AdaptiveFloor::new(4 * 3600);
        assert_eq!(adaptive_floor([], &members, &policy, 0, 7200), 0);
        // Patient pods would not miss their deadline waiting for a boot.
        let patient = (0..50).map(|t| (t * 60, Some(cold + 1)));
        assert_eq!(adaptive_floor(patient, &members, &policy, 0, 7200), 0);
    }

    #[test]
    fn the_floor_is_the_expected_burst_during_a_boot_plus_one_deviation() {
        let servers = class(40);
        let members: Vec<&Server> = servers.iter().collect();
        let cold = cold_path_s(&members).unwrap();
        let policy = AdaptiveFloor::new(4 * 3600);
        // 20 urgent servers in the first hour: the span is one hour.
        let demand = (0..20).map(|t| (t * 60, Some(60)));
        let m = 20.0 * cold as f64 / 3600.0;
        assert_eq!(adaptive_floor(demand, &members, &policy, 0, 3600), (m + m.sqrt()).ceil() as u32);
        // Past the window they count for nothing.
        let old = (0..20).map(|t| (t * 60, Some(60)));
        assert_eq!(adaptive_floor(old, &members, &policy, 0, 6 * 3600), 0);
    }

    #[test]
    fn the_floor_never_exceeds_the_class_and_survives_absurd_input() {
        let servers = class(3);
        let members: Vec<&Server> = servers.iter().collect();
        let policy = AdaptiveFloor { window_s: 0, z: f64::NAN };
        let flood = (0..10_000).map(|_| (100, None));
        assert_eq!(adaptive_floor(flood, &members, &policy, 100, 100), 3);
        assert_eq!(adaptive_floor([(1, None)], &[], &policy, 0, 1), 0);
        assert_eq!(floor_for_rate(usize::MAX, Seconds::MAX, 1, 1e300), u32::MAX);
    }
}
