//! Warm-spare floors: how many idle, powered-on servers of a hardware class
//! a ServerPool keeps, so that a burst lands in seconds instead of a cold boot.
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
//! # Pre-warming ahead of recurring demand
//! The same arrivals on past days, at this time of day, say what is coming:
//! for each of the last `history_days` days that were observed (with
//! `weekly`, those of today's kind: weekdays for a weekday, Saturday and
//! Sunday for a weekend day, in UTC; every day when fewer than
//! `min_days_seen` are of today's kind), count the urgent arrivals within two cold paths of this second
//! of that day, before or after. When that demand came on at least
//! `min_days_seen` of those days, the floor is raised to the mean count per
//! cold path, with the same margin: spares are powered on up to two boots
//! ahead of a ramp, and kept through it while it comes a little later than
//! it did. A day counts as observed when the arrivals are complete since
//! its window began. With `weekly`, a weekday's count is not thinned by a
//! quiet weekend before it, and with enough weekend days in view a weekday
//! ramp is not pre-warmed for on a weekend.
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

/// `ceil(m + z * sqrt(m))` with `m = urgent * cold_path_s / span_s`,
/// `urgent` in servers (whole arrivals, and shares of one).
pub fn floor_for_rate(urgent: f64, cold_path_s: Seconds, span_s: Seconds, z: f64) -> u32 {
    if urgent.is_nan() || urgent <= 0.0 {
        return 0;
    }
    let m = urgent * cold_path_s as f64 / span_s.max(1) as f64;
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
/// demand as (time, deadline, servers) triples, the deadline already
/// defaulted by the caller (None: no deadline, which counts as urgent), the
/// servers 1 for an arrival that needed a server and a share of one for a
/// pod that landed on a running node; `members` every server of the class
/// whatever its state; arrivals are complete since `since_s`.
pub fn adaptive_floor(
    arrivals: impl IntoIterator<Item = (Seconds, Option<Seconds>, f64)>,
    members: &[&Server],
    policy: &AdaptiveFloor,
    since_s: Seconds,
    now_s: Seconds,
) -> u32 {
    let Some(cold) = cold_path_s(members) else { return 0 };
    let window_s = policy.window_s.max(MIN_WINDOW_S);
    let horizon = now_s.saturating_sub(window_s);
    let urgent: f64 = arrivals
        .into_iter()
        .filter(|&(at, _, _)| at >= horizon && at <= now_s)
        .filter(|&(_, deadline, _)| deadline.is_none_or(|d| d < cold))
        .map(|(_, _, servers)| servers)
        .sum();
    let floor = floor_for_rate(urgent, cold, rate_span_s(window_s, since_s, now_s), policy.z);
    floor.min(u32::try_from(members.len()).unwrap_or(u32::MAX))
}

/// A day, for the daily profile.
pub const DAY_S: Seconds = 86_400;

/// Why a floor is above what recent demand gives: demand that came at this
/// time of day on past days.
#[derive(Clone, Debug, PartialEq)]
pub struct Prewarm {
    /// The floor the profile asks for.
    pub floor: u32,
    /// Second of the day the recurring demand starts (the first urgent
    /// arrival in the window, on the latest day it came).
    pub ramp_at_s: Seconds,
    pub days_seen: u32,
    pub days_observed: u32,
    /// Which of the past days were looked at.
    pub kind: DayKind,
}

/// The past days a daily profile looks at: with `weekly`, those of today's
/// kind when there are at least `minDaysSeen` of them; else every day.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DayKind {
    Any,
    Weekday,
    Weekend,
}

impl std::fmt::Display for Prewarm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tod = self.ramp_at_s % DAY_S;
        let days = match self.kind {
            DayKind::Any => "days",
            DayKind::Weekday => "weekdays",
            DayKind::Weekend => "weekend days",
        };
        write!(
            f,
            "pre-warmed for the {:02}:{:02} ramp, seen {} of the last {} {days}",
            tod / 3600,
            tod % 3600 / 60,
            self.days_seen,
            self.days_observed
        )
    }
}

/// Whether the day of `t` (Unix seconds, UTC) is a Saturday or a Sunday.
/// The Unix epoch was a Thursday.
pub fn is_weekend(t: Seconds) -> bool {
    matches!((t / DAY_S + 4) % 7, 0 | 6)
}

/// The daily profile's floor for one class (see the module's docs); None
/// when pre-warming is off, too few days were observed, or the demand did
/// not recur.
pub fn prewarm(
    arrivals: &[(Seconds, Option<Seconds>)],
    members: &[&Server],
    policy: &AdaptiveFloor,
    since_s: Seconds,
    now_s: Seconds,
) -> Option<Prewarm> {
    if policy.history_days == 0 || arrivals.is_empty() {
        return None;
    }
    let cold = cold_path_s(members)?.max(1);
    let lead = 2 * cold;
    // Each observed day, latest first: whether it was a weekend day, and
    // its urgent arrivals around this time of day.
    let mut days: Vec<(bool, Vec<Seconds>)> = Vec::new();
    for k in 1..=Seconds::from(policy.history_days) {
        let Some(from) = now_s.checked_sub(k * DAY_S) else { break };
        if from.saturating_sub(lead) < since_s {
            break;
        }
        let urgent: Vec<Seconds> = arrivals
            .iter()
            .filter(|&&(at, deadline)| at + lead >= from && at < from + lead && deadline.is_none_or(|d| d < cold))
            .map(|&(at, _)| at)
            .collect();
        days.push((is_weekend(from), urgent));
    }
    let min_days = policy.min_days_seen.max(1);
    let weekend = is_weekend(now_s);
    let same = days.iter().filter(|(w, _)| *w == weekend).count();
    let kind = if !policy.weekly || same < usize::try_from(min_days).unwrap_or(usize::MAX) {
        DayKind::Any
    } else if weekend {
        DayKind::Weekend
    } else {
        DayKind::Weekday
    };
    let (mut observed, mut seen, mut total) = (0u32, 0u32, 0usize);
    let mut ramp_at_s = None;
    for (_, urgent) in days.iter().filter(|(w, _)| kind == DayKind::Any || *w == weekend) {
        observed += 1;
        if let Some(&first) = urgent.iter().min() {
            seen += 1;
            total += urgent.len();
            ramp_at_s.get_or_insert(first);
        }
    }
    if observed == 0 || seen < min_days {
        return None;
    }
    let mean_per_cold_path = total as f64 / f64::from(observed) * cold as f64 / (2 * lead) as f64;
    let z = if policy.z.is_finite() { policy.z.max(0.0) } else { 0.0 };
    let floor = (mean_per_cold_path + z * mean_per_cold_path.sqrt()).ceil().min(f64::from(u32::MAX)) as u32;
    let floor = floor.min(u32::try_from(members.len()).unwrap_or(u32::MAX));
    (floor > 0).then(|| Prewarm { floor, ramp_at_s: ramp_at_s.unwrap_or(now_s), days_seen: seen, days_observed: observed, kind })
}

/// The ServerPool a server belongs to: its node's `ironclaim.dev/serverpool`
/// label when it is a node, else the heaviest pool that admits it.
pub(crate) fn pool_of<'a>(pools: &'a [ServerPool], server: &Server, node: Option<&Node>) -> Option<&'a ServerPool> {
    if let Some(name) = node.and_then(|n| n.labels.get(crate::provision::SERVERPOOL_LABEL)) {
        return pools.iter().find(|p| &p.name == name);
    }
    // The heaviest, ties to the first name.
    pools.iter().filter(|p| p.admits(server)).min_by(|a, b| b.weight.cmp(&a.weight).then(a.name.cmp(&b.name)))
}

/// A server's class under a pool: the value of the pool's class label, else
/// its capacity written out.
pub fn class_of(server: &Server, pool: Option<&ServerPool>) -> String {
    class_name(server, pool).into_owned()
}

/// [`class_of`], borrowed where the class is a label.
pub(crate) fn class_name<'s>(server: &'s Server, pool: Option<&ServerPool>) -> std::borrow::Cow<'s, str> {
    let label = pool.and_then(|p| p.warm.class_label.as_deref()).unwrap_or(CLASS_LABEL);
    match server.labels.get(label) {
        Some(v) => std::borrow::Cow::Borrowed(v.as_str()),
        None => std::borrow::Cow::Owned(format!("{}", server.capacity)),
    }
}

/// Which ServerPool each server of a snapshot belongs to as a server (the
/// heaviest pool that admits it, see [`pool_of`]) and its class under that
/// pool: worked out once per pass, and the one answer the floors and
/// scale-down share. Indexed like `snapshot.servers`.
pub struct Membership<'s> {
    pool: Vec<Option<&'s ServerPool>>,
    class: Vec<std::borrow::Cow<'s, str>>,
    index: foldhash::HashMap<&'s str, usize>,
}

impl<'s> Membership<'s> {
    pub fn of(snapshot: &'s Snapshot) -> Self {
        let pools = &snapshot.pools;
        let pool: Vec<Option<&ServerPool>> = snapshot.servers.iter().map(|s| pool_of(pools, s, None)).collect();
        let class = snapshot.servers.iter().zip(&pool).map(|(s, p)| class_name(s, *p)).collect();
        let index = snapshot.servers.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();
        Membership { pool, class, index }
    }

    /// The pool of the `i`th server.
    pub fn pool(&self, i: usize) -> Option<&'s ServerPool> {
        self.pool[i]
    }

    /// The class of the `i`th server under its pool.
    pub fn class(&self, i: usize) -> &str {
        &self.class[i]
    }

    /// Whether the `i`th server belongs to `pool`.
    pub fn in_pool(&self, i: usize, pool: &ServerPool) -> bool {
        self.pool[i].is_some_and(|p| p.name == pool.name)
    }

    /// The position of the server named `name`.
    pub fn index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }
}

/// The static floor of a class, zero outside the pool's schedule.
fn static_floor(pool: &ServerPool, class: &str, now_s: Seconds) -> u32 {
    if pool.warm.window.as_ref().is_some_and(|w| !w.is_active(now_s)) {
        return 0;
    }
    pool.warm.floor.get(class).copied().unwrap_or(0)
}

/// The warm floor of one (ServerPool, class), and the daily profile's
/// reason when that is what sets it.
#[derive(Clone, Debug, PartialEq)]
pub struct Floor {
    pub count: u32,
    pub prewarm: Option<Prewarm>,
    /// The floor is kept as Ready nodes, not servers that are only on: the
    /// pool has an adaptive floor (which counts the arrivals) and the
    /// class's demand has a deadline a warm server's join could miss (see
    /// [`needs_nodes`]).
    pub nodes: bool,
}

/// The slow end (p90) of a class's warm path, join to Ready, of its
/// median server; None for an empty class.
pub fn warm_tail_s(members: &[&Server]) -> Option<Seconds> {
    let mut tails: Vec<Seconds> = members.iter().map(|s| s.durations.warm_s() * Seconds::from(s.durations.tail_percent.max(100)) / 100).collect();
    tails.sort_unstable();
    tails.get(tails.len() / 2).copied()
}

/// Whether a class's spares must be Ready nodes: a server that is only on
/// still has to join and pass its gates, and some of the arrivals kept for
/// the class (the window's and the daily profile's) have a deadline
/// shorter than the slow end of that path, or none. Such a pod would miss
/// its deadline on a spare that is merely on.
pub fn needs_nodes(arrivals: &[(Seconds, Option<Seconds>)], members: &[&Server]) -> bool {
    let Some(tail) = warm_tail_s(members) else { return false };
    arrivals.iter().any(|&(_, deadline)| deadline.is_none_or(|d| d < tail))
}

/// The warm floor of every (ServerPool, class) that has servers: the larger
/// of the static floor and, where the pool enables it, the adaptive floor
/// from `snapshot.arrivals` and its daily profile. Servers no pool admits
/// have no floor.
pub fn floors(snapshot: &Snapshot, now_s: Seconds) -> BTreeMap<(String, String), u32> {
    let m = Membership::of(snapshot);
    floors_of(snapshot, &m, now_s).into_iter().map(|((p, c), f)| ((p.to_string(), c.to_string()), f.count)).collect()
}

/// The servers of each (ServerPool, class), whatever their state.
fn members_of<'s, 'm>(snapshot: &'s Snapshot, m: &'m Membership<'_>) -> BTreeMap<(&'m str, &'m str), Vec<&'s Server>> {
    let mut members: BTreeMap<(&str, &str), Vec<&Server>> = BTreeMap::new();
    for (i, s) in snapshot.servers.iter().enumerate() {
        if let Some(pool) = m.pool(i) {
            members.entry((pool.name.as_str(), m.class(i))).or_default().push(s);
        }
    }
    members
}

/// A pod that landed on a running node of a class with no claim of its
/// own, and whose deadline is shorter than the slow end of the class's
/// warm path: fresh demand the class absorbed, counted as the share of the
/// server it takes. Demand that running nodes still absorb today is the
/// demand that will need a server of its own tomorrow: a class whose
/// pods cannot wait even for a spare to join keeps one ready, as a node,
/// for the moment they no longer fit. Pods that can wait for a join are
/// left to the arrivals: counting them kept a spare in every class that
/// ever took one, for little (docs/simulate.md).
struct Absorbed {
    at_s: Seconds,
    deadline_s: Option<Seconds>,
    servers: f64,
}

/// The absorbed demand of each (pool, class) with an adaptive floor: the
/// workload pods bound to its servers' nodes, created within the pool's
/// window, on servers no urgent arrival of that window names (such a
/// claim's or spare's server counts whole already; one claimed for patient
/// pods took in the urgent ones as running capacity). `members` is the
/// pass's [`members_of`].
fn absorbed_of<'m>(
    snapshot: &Snapshot,
    m: &'m Membership<'_>,
    members: &BTreeMap<(&'m str, &'m str), Vec<&Server>>,
    now_s: Seconds,
) -> BTreeMap<(&'m str, &'m str), Vec<Absorbed>> {
    let mut out: BTreeMap<(&str, &str), Vec<Absorbed>> = BTreeMap::new();
    if !snapshot.pools.iter().any(|p| p.warm.adaptive.is_some()) {
        return out;
    }
    let by_node: foldhash::HashMap<&str, usize> = snapshot.servers.iter().enumerate().filter_map(|(i, s)| Some((s.node.as_deref()?, i))).collect();
    let horizon = |pool: &ServerPool| pool.warm.adaptive.as_ref().map(|a| now_s.saturating_sub(a.window_s.max(MIN_WINDOW_S)));
    // The cold path and the slow end of the warm path of each class, and
    // the latest urgent arrival of each server up to now.
    let cold: BTreeMap<(&str, &str), Seconds> = members.iter().filter_map(|(k, v)| Some((*k, cold_path_s(v)?))).collect();
    let warm_tail: BTreeMap<(&str, &str), Seconds> = members.iter().filter_map(|(k, v)| Some((*k, warm_tail_s(v)?))).collect();
    let mut latest: foldhash::HashMap<&str, Seconds> = foldhash::HashMap::default();
    for a in snapshot.arrivals.iter().filter(|a| a.at_s <= now_s) {
        let Some(i) = m.index(&a.server) else { continue };
        let Some(pool) = m.pool(i) else { continue };
        let Some(&cold) = cold.get(&(pool.name.as_str(), m.class(i))) else { continue };
        if a.deadline_s.or(pool.deadline_s).is_none_or(|d| d < cold) {
            let t = latest.entry(a.server.as_str()).or_insert(a.at_s);
            *t = (*t).max(a.at_s);
        }
    }
    for pod in &snapshot.pods {
        let Some(&i) = pod.node_name.as_deref().and_then(|n| by_node.get(n)) else { continue };
        let Some(pool) = m.pool(i) else { continue };
        let Some(from) = horizon(pool) else { continue };
        if pod.is_daemonset_pod() || pod.created_s < from || pod.created_s > now_s {
            continue;
        }
        let server = &snapshot.servers[i];
        if latest.get(server.name.as_str()).is_some_and(|&t| t >= from) {
            continue;
        }
        // Only a pod that could not wait even for a spare to join: those a
        // spare that is merely on would still make late.
        let tail = warm_tail.get(&(pool.name.as_str(), m.class(i))).copied().unwrap_or(0);
        let deadline_s = pod.deadline_s.or(pool.deadline_s);
        if deadline_s.is_some_and(|d| d >= tail) {
            continue;
        }
        let share = |used: i64, total: i64| if total > 0 { used as f64 / total as f64 } else { 0.0 };
        let servers =
            share(pod.requests.cpu_milli, server.capacity.cpu_milli).max(share(pod.requests.memory_bytes, server.capacity.memory_bytes)).min(1.0);
        out.entry((pool.name.as_str(), m.class(i))).or_default().push(Absorbed { at_s: pod.created_s, deadline_s, servers });
    }
    out
}

/// [`floors`] by (pool name, class), with the pass's [`Membership`] and the
/// pre-warming reasons.
pub fn floors_of<'m>(snapshot: &Snapshot, m: &'m Membership<'_>, now_s: Seconds) -> BTreeMap<(&'m str, &'m str), Floor> {
    let members = members_of(snapshot, m);
    let absorbed = absorbed_of(snapshot, m, &members, now_s);
    let mut arrivals: BTreeMap<(&str, &str), Vec<&Arrival>> = BTreeMap::new();
    for a in &snapshot.arrivals {
        if let Some(i) = m.index(&a.server)
            && let Some(pool) = m.pool(i)
        {
            arrivals.entry((pool.name.as_str(), m.class(i))).or_default().push(a);
        }
    }
    let mut out = BTreeMap::new();
    for (key, servers) in members {
        let Some(pool) = snapshot.pools.iter().find(|p| p.name == key.0) else { continue };
        let seen = arrivals.get(&key).map(Vec::as_slice).unwrap_or_default();
        let demand: Vec<(Seconds, Option<Seconds>)> = seen.iter().map(|a| (a.at_s, a.deadline_s.or(pool.deadline_s))).collect();
        let landed = absorbed.get(&key).map(Vec::as_slice).unwrap_or_default();
        let recent: Vec<(Seconds, Option<Seconds>)> = demand.iter().copied().chain(landed.iter().map(|a| (a.at_s, a.deadline_s))).collect();
        let nodes = pool.warm.adaptive.is_some() && needs_nodes(&recent, &servers);
        let mut floor = Floor { count: static_floor(pool, key.1, now_s), prewarm: None, nodes };
        if let Some(adaptive) = &pool.warm.adaptive {
            let counted = demand.iter().map(|&(at, d)| (at, d, 1.0)).chain(landed.iter().map(|a| (a.at_s, a.deadline_s, a.servers)));
            floor.count = floor.count.max(adaptive_floor(counted, &servers, adaptive, snapshot.arrivals_since_s, now_s));
            if let Some(p) = prewarm(&demand, &servers, adaptive, snapshot.arrivals_since_s, now_s)
                && p.floor > floor.count
            {
                floor.count = p.floor;
                floor.prewarm = Some(p);
            }
        }
        out.insert(key, floor);
    }
    out
}

/// The next second after `now_s` at which the floors can change with
/// nothing else changing: an arrival leaves the look-back window of its
/// pool's adaptive floor, or, a day or more later, enters or leaves the
/// window the daily profile looks at. None when no adaptive floor counts any.
pub fn next_change_s(snapshot: &Snapshot, now_s: Seconds) -> Option<Seconds> {
    if !snapshot.pools.iter().any(|p| p.warm.adaptive.is_some()) {
        return None;
    }
    let m = Membership::of(snapshot);
    // The cold path of each class that has arrivals, as `prewarm` takes it.
    let members = members_of(snapshot, &m);
    let cold: BTreeMap<(&str, &str), Seconds> = members.iter().filter_map(|(k, v)| Some((*k, cold_path_s(v)?.max(1)))).collect();
    let mut next: Option<Seconds> = None;
    let mut consider = |t: Seconds| {
        if t > now_s && next.is_none_or(|n| t < n) {
            next = Some(t);
        }
    };
    for landed in absorbed_of(snapshot, &m, &members, now_s).into_iter().flat_map(|((pool, _), v)| v.into_iter().map(move |a| (pool, a))) {
        if let Some(window_s) = snapshot.pools.iter().find(|p| p.name == landed.0).and_then(|p| p.warm.adaptive.as_ref()).map(|a| a.window_s) {
            consider(landed.1.at_s.saturating_add(window_s.max(MIN_WINDOW_S)).saturating_add(1));
        }
    }
    for a in &snapshot.arrivals {
        let Some(i) = m.index(&a.server) else { continue };
        let Some(pool) = m.pool(i) else { continue };
        let Some(adaptive) = pool.warm.adaptive.as_ref() else { continue };
        consider(a.at_s.saturating_add(adaptive.window_s.max(MIN_WINDOW_S)).saturating_add(1));
        let Some(&cold) = cold.get(&(pool.name.as_str(), m.class(i))) else { continue };
        for k in 1..=Seconds::from(adaptive.history_days) {
            let day = a.at_s.saturating_add(k * DAY_S);
            consider(day.saturating_sub(2 * cold).saturating_add(1));
            consider(day.saturating_add(2 * cold).saturating_add(1));
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    fn class(n: usize) -> Vec<Server> {
        (0..n).map(|i| Server::new(&format!("s{i}"), Resources::new(32_000, 1 << 37))).collect()
    }

    #[test]
    fn the_floor_can_fall_first_when_the_oldest_arrival_leaves_its_window() {
        let mut pool = ServerPool::new("general");
        pool.warm.adaptive = Some(AdaptiveFloor::new(4 * 3600));
        let servers = class(6);
        let arrival = |at_s| Arrival { at_s, server: "s0".into(), deadline_s: Some(60) };
        let mut snap = Snapshot { pools: vec![pool], servers, arrivals: vec![arrival(1_000), arrival(5_000)], ..Default::default() };
        let leaves = 1_000 + 4 * 3600 + 1;
        assert_eq!(next_change_s(&snap, 6_000), Some(leaves));
        assert_eq!(next_change_s(&snap, leaves), Some(5_000 + 4 * 3600 + 1));
        let one = Snapshot { arrivals: vec![arrival(1_000)], ..snap.clone() };
        let floor = |t| floors(&one, t).values().copied().max().unwrap_or(0);
        assert_eq!((floor(leaves - 1), floor(leaves)), (1, 0), "the floor falls at that second, not before");
        snap.pools[0].warm.adaptive = None;
        assert_eq!(next_change_s(&snap, 6_000), None, "no adaptive floor: arrivals change nothing");
    }

    #[test]
    fn urgent_pods_that_landed_on_running_nodes_keep_a_spare_for_when_they_no_longer_fit() {
        let mut pool = ServerPool::new("general");
        pool.warm.adaptive = Some(AdaptiveFloor::new(4 * 3600));
        let mut servers = class(4);
        servers[0].node = Some("n0".into());
        servers[0].power_state = PowerState::On;
        let now = 10 * 3600;
        let pod = |created_s, deadline_s| {
            let mut p = Pod::new("shop", "web-1", crate::resources::Resources::new(2000, 4 << 30));
            p.node_name = Some("n0".into());
            p.created_s = created_s;
            p.deadline_s = Some(deadline_s);
            p
        };
        let snap = |pods: Vec<Pod>, arrivals: Vec<Arrival>| Snapshot {
            pools: vec![pool.clone()],
            servers: servers.clone(),
            pods: pods.into(),
            arrivals,
            ..Default::default()
        };
        let floor = |s: &Snapshot| floors(s, now).values().copied().max().unwrap_or(0);
        let web = snap(vec![pod(now - 600, 120)], vec![]);
        assert_eq!(floor(&web), 1, "a web pod on a running node is urgent demand the class absorbed");
        assert_eq!(next_change_s(&web, now), Some(now - 600 + 4 * 3600 + 1), "and wakes the driver when it leaves the window");
        assert_eq!(floor(&snap(vec![pod(now - 600, 3 * 3600)], vec![])), 0, "a patient pod waits for a boot");
        assert_eq!(floor(&snap(vec![pod(now - 600, 300)], vec![])), 0, "one that can wait for a spare to join (180 s) is left to the arrivals");
        assert_eq!(floor(&snap(vec![pod(now - 5 * 3600, 120)], vec![])), 0, "out of the window");
        let own = Arrival { at_s: now - 900, server: "s0".into(), deadline_s: Some(60) };
        assert_eq!(floor(&snap(vec![pod(now - 600, 3 * 3600)], vec![own.clone()])), 1, "the urgent claim's server counts whole");
        let patient = Arrival { deadline_s: Some(3 * 3600), ..own.clone() };
        assert_eq!(floor(&snap(vec![pod(now - 600, 3 * 3600)], vec![patient.clone()])), 0, "nothing urgent");
        assert_eq!(floor(&snap(vec![pod(now - 600, 120)], vec![patient])), 1, "urgent pods on a server claimed for patient ones count");
        // Each pod is its share of the server: 160 pods of 2 of 32 cores,
        // ten servers' worth in the window, against one for the claim.
        let many: Vec<Pod> = (0..160).map(|k| Pod { name: format!("web-{k}"), ..pod(now - 600, 120) }).collect();
        assert_eq!(floor(&snap(many.clone(), vec![own])), 1, "the pods of an urgent claim's server are that one arrival");
        let m = 10.0 * 600.0 / (4.0 * 3600.0);
        assert_eq!(floor(&snap(many, vec![])), (m + f64::sqrt(m)).ceil() as u32);
        let mut ds = pod(now - 600, 120);
        ds.owner = Some(Owner { kind: "DaemonSet".into(), name: "node-exporter".into() });
        assert_eq!(floor(&snap(vec![ds], vec![])), 0, "a DaemonSet pod is no demand");
    }

    #[test]
    fn no_urgent_demand_means_no_adaptive_floor() {
        let servers = class(4);
        let members: Vec<&Server> = servers.iter().collect();
        let cold = cold_path_s(&members).unwrap();
        let policy = AdaptiveFloor::new(4 * 3600);
        assert_eq!(adaptive_floor([], &members, &policy, 0, 7200), 0);
        // Patient pods would not miss their deadline waiting for a boot.
        let patient = (0..50).map(|t| (t * 60, Some(cold + 1), 1.0));
        assert_eq!(adaptive_floor(patient, &members, &policy, 0, 7200), 0);
    }

    #[test]
    fn the_floor_is_the_expected_burst_during_a_boot_plus_one_deviation() {
        let servers = class(40);
        let members: Vec<&Server> = servers.iter().collect();
        let cold = cold_path_s(&members).unwrap();
        let policy = AdaptiveFloor::new(4 * 3600);
        // 20 urgent servers in the first hour: the span is one hour.
        let demand = (0..20).map(|t| (t * 60, Some(60), 1.0));
        let m = 20.0 * cold as f64 / 3600.0;
        assert_eq!(adaptive_floor(demand, &members, &policy, 0, 3600), (m + m.sqrt()).ceil() as u32);
        // Past the window they count for nothing.
        let old = (0..20).map(|t| (t * 60, Some(60), 1.0));
        assert_eq!(adaptive_floor(old, &members, &policy, 0, 6 * 3600), 0);
    }

    #[test]
    fn the_floor_never_exceeds_the_class_and_survives_absurd_input() {
        let servers = class(3);
        let members: Vec<&Server> = servers.iter().collect();
        let policy = AdaptiveFloor { window_s: 0, z: f64::NAN, ..AdaptiveFloor::new(0) };
        let flood = (0..10_000).map(|_| (100, None, 1.0));
        assert_eq!(adaptive_floor(flood, &members, &policy, 100, 100), 3);
        assert_eq!(adaptive_floor([(1, None, 1.0)], &[], &policy, 0, 1), 0);
        assert_eq!(floor_for_rate(f64::MAX, Seconds::MAX, 1, 1e300), u32::MAX);
        assert_eq!(floor_for_rate(f64::NAN, 600, 3600, 1.0), 0);
    }

    #[test]
    fn demand_that_recurs_at_this_time_of_day_on_days_of_its_kind_raises_the_floor_one_boot_ahead() {
        let servers = class(20);
        let members: Vec<&Server> = servers.iter().collect();
        let cold = cold_path_s(&members).unwrap();
        let policy = AdaptiveFloor { weekly: true, ..AdaptiveFloor::new(4 * 3600) };
        let ramp = 8 * 3600;
        let at_ramp = |days: &[u64]| -> Vec<(Seconds, Option<Seconds>)> {
            days.iter().flat_map(|&d| (0..6).map(move |i| (d * DAY_S + ramp + i * 10, Some(120)))).collect()
        };
        // Day 11 is a Monday (day 0, the Unix epoch, a Thursday): of the
        // seven days before it, 4 to 8 are weekdays and 9 and 10 a weekend.
        let today = 11 * DAY_S;
        assert!(!is_weekend(today) && !is_weekend(8 * DAY_S) && is_weekend(9 * DAY_S) && is_weekend(10 * DAY_S) && !is_weekend(11 * DAY_S));
        // Six urgent servers at 08:00 on four of those five weekdays.
        let demand = at_ramp(&[4, 5, 7, 8]);
        let at = |t: Seconds| prewarm(&demand, &members, &policy, 0, today + t);
        let p = at(ramp - cold).expect("a ramp seen on 4 of 5 weekdays is pre-warmed for");
        let mean = 24.0 / 5.0 / 4.0;
        assert_eq!(p.floor, (mean + f64::sqrt(mean)).ceil() as u32);
        assert_eq!(p.to_string(), "pre-warmed for the 08:00 ramp, seen 4 of the last 5 weekdays");
        assert_eq!(at(ramp - 2 * cold - 1), None, "more than two boots ahead is too early");
        assert!(at(ramp + cold).is_some(), "kept through a ramp that comes late");
        assert_eq!(at(ramp + 2 * cold + 61), None, "once the ramp is past");
        // Too few days seen, or observed, or pre-warming off: nothing.
        assert_eq!(prewarm(&at_ramp(&[7, 8]), &members, &policy, 0, today + ramp - cold), None);
        assert_eq!(prewarm(&demand, &members, &policy, 7 * DAY_S, today + ramp - cold), None, "two days observed");
        let off = AdaptiveFloor { history_days: 0, ..policy.clone() };
        assert_eq!(prewarm(&demand, &members, &off, 0, today + ramp - cold), None);
        // Patient demand would not miss its deadline waiting for a boot.
        let patient: Vec<_> = demand.iter().map(|&(t, _)| (t, Some(cold + 1))).collect();
        assert_eq!(prewarm(&patient, &members, &policy, 0, today + ramp - cold), None);

        // On a Saturday, a ramp that came every weekday of the last two
        // weeks is not pre-warmed for; one that came on three of the four
        // weekend days is.
        let saturday = 16 * DAY_S;
        assert!(is_weekend(saturday));
        let fortnight = AdaptiveFloor { history_days: 14, ..policy.clone() };
        let weekdays: Vec<u64> = (2..16).filter(|&d| !is_weekend(d * DAY_S)).collect();
        assert_eq!(prewarm(&at_ramp(&weekdays), &members, &fortnight, 0, saturday + ramp - cold), None);
        let mut both = at_ramp(&weekdays);
        both.extend(at_ramp(&[2, 3, 9]));
        let p = prewarm(&both, &members, &fortnight, 0, saturday + ramp - cold).expect("the weekend's own ramp");
        assert_eq!(p.to_string(), "pre-warmed for the 08:00 ramp, seen 3 of the last 4 weekend days");
        // A week holds two weekend days, fewer than three to be seen on:
        // then every day counts.
        let p = prewarm(&at_ramp(&weekdays), &members, &policy, 0, saturday + ramp - cold).expect("too few weekend days to tell");
        assert_eq!(p.to_string(), "pre-warmed for the 08:00 ramp, seen 5 of the last 7 days");
        // Without `weekly`, every day counts whatever its kind.
        let daily = AdaptiveFloor { weekly: false, ..fortnight.clone() };
        let p = prewarm(&at_ramp(&weekdays), &members, &daily, 0, saturday + ramp - cold).expect("every day counts");
        assert_eq!(p.to_string(), "pre-warmed for the 08:00 ramp, seen 10 of the last 14 days");
    }

    #[test]
    fn the_floors_wake_the_driver_when_a_past_day_ramp_comes_into_view() {
        let mut pool = ServerPool::new("general");
        pool.warm.adaptive = Some(AdaptiveFloor::new(3600));
        let servers = class(6);
        let members: Vec<&Server> = servers.iter().collect();
        let cold = cold_path_s(&members).unwrap();
        let arrival = Arrival { at_s: 8 * 3600, server: "s0".into(), deadline_s: Some(60) };
        let snap = Snapshot { pools: vec![pool], servers, arrivals: vec![arrival], ..Default::default() };
        let into_view = DAY_S + 8 * 3600 - 2 * cold + 1;
        assert_eq!(next_change_s(&snap, 10 * 3600), Some(into_view));
        assert_eq!(next_change_s(&snap, into_view), Some(DAY_S + 8 * 3600 + 2 * cold + 1), "and when it leaves");
    }
}
