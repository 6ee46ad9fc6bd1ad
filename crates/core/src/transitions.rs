//! How often servers may change power: transition rates per group, and a
//! cap on power cycles per server per day.
//!
//! A power-on draws inrush current on its PDU and work from its BMC; a
//! rack of servers switched at once can trip a breaker. A
//! [`TransitionRate`] caps the power changes (power-ons and power-offs)
//! a group of servers may start per minute: the fleet, each ServerPool, or
//! the servers sharing a label's value (a rack, a PDU). A power cycle
//! wears disks, fans and power supplies: `max_cycles_per_day` caps how
//! often one server is powered off in a day.
//!
//! # Guarantees
//! - Within any 60 s, the power changes recorded and decided for one group
//!   never exceed its rate: a decision counts the changes of the last
//!   minute (the servers' [`PowerChange`]s) and the ones it plans itself.
//! - A server powered off `max_cycles_per_day` times in the last day is not
//!   powered off again (neither as a spare nor after a drain) until the
//!   oldest of those leaves the day. Power-ons are never refused for wear:
//!   a pod waits for no cap.
//! - With a cap on power cycles set, among servers that could equally be
//!   powered on the least worn goes first ([`wear`]): fewest power-offs in
//!   the last day, then the one whose power has been unchanged longest, so
//!   which servers work and which stay warm rotates.
//! - Pure: the same snapshot and time give the same answers.

use crate::model::{Node, PowerChange, Seconds, Server, ServerPool, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The window of a transition rate.
pub const RATE_WINDOW_S: Seconds = 60;
/// The window of the cap on power cycles.
pub const CYCLE_WINDOW_S: Seconds = 86_400;
/// The most power changes a driver keeps per server: the newest of the
/// last day.
pub const RECORDED_CHANGES: usize = 64;

/// The limits on power changes. The default limits nothing.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionLimits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rates: Vec<TransitionRate>,
    /// A server powered off this many times in the last day stays on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_cycles_per_day: Option<u32>,
}

impl TransitionLimits {
    pub fn is_empty(&self) -> bool {
        self.rates.is_empty() && self.max_cycles_per_day.is_none()
    }
}

/// At most `per_minute` power changes per minute in each group of `scope`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransitionRate {
    pub scope: RateScope,
    pub per_minute: u32,
}

/// How servers are grouped for a rate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RateScope {
    /// Every server together.
    Fleet,
    /// The servers of each ServerPool (the pool of its node, else the
    /// heaviest pool that admits it).
    Pool,
    /// The servers that share this label's value; a server without the
    /// label is not limited by the rate.
    Label(String),
}

impl std::fmt::Display for TransitionRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.scope {
            RateScope::Fleet => write!(f, "fleet={}", self.per_minute),
            RateScope::Pool => write!(f, "pool={}", self.per_minute),
            RateScope::Label(key) => write!(f, "{key}={}", self.per_minute),
        }
    }
}

/// A rate as flags and values write it: `fleet=N`, `pool=N`, or
/// `LABEL=N` for the servers sharing each value of the label `LABEL`
/// (e.g. `topology.kubernetes.io/rack=4`), N power changes per minute.
pub fn parse_rate(text: &str) -> Result<TransitionRate, String> {
    let shape = "expected SCOPE=N with SCOPE fleet, pool or a label key, and N power changes per minute, at least 1";
    let (scope, n) = text.rsplit_once('=').ok_or_else(|| format!("{text:?}: {shape}"))?;
    let per_minute: u32 = n.trim().parse().ok().filter(|&n| n >= 1).ok_or_else(|| format!("{text:?}: {shape}"))?;
    let scope = match scope.trim() {
        "" => return Err(format!("{text:?}: {shape}")),
        "fleet" => RateScope::Fleet,
        "pool" => RateScope::Pool,
        key if label_key(key) => RateScope::Label(key.to_string()),
        key => return Err(format!("{text:?}: {key:?} is not a valid label key; {shape}")),
    };
    Ok(TransitionRate { scope, per_minute })
}

/// A label key as Kubernetes writes one: `[prefix/]name` of letters,
/// digits, `-`, `_` and `.`.
fn label_key(key: &str) -> bool {
    let name = key.rsplit_once('/').map_or(key, |(prefix, name)| if prefix.is_empty() { "" } else { name });
    let ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    !name.is_empty() && key.len() <= 316 && key.chars().filter(|&c| c == '/').count() <= 1 && key.chars().all(|c| ok(c) || c == '/')
}

/// `5h02m`, `12m`, `40s`.
fn human(s: Seconds) -> String {
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m", s.div_ceil(60)),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600).div_ceil(60).min(59)),
    }
}

/// Why a power change may not start now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Refusal {
    /// The group's rate is used up for this minute.
    Rate { group: String, changes: u32, per_minute: u32, free_in_s: Seconds },
    /// The server was powered off as often as its daily cap allows.
    Cycles { offs: u32, cap: u32, free_in_s: Seconds },
}

impl Refusal {
    /// Seconds until the refusal may lift, with nothing else changed.
    pub fn free_in_s(&self) -> Seconds {
        match self {
            Refusal::Rate { free_in_s, .. } | Refusal::Cycles { free_in_s, .. } => *free_in_s,
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Rate { group, changes, per_minute, free_in_s } => write!(
                f,
                "transition rate of {group} reached: {changes} power {} in the last minute, {per_minute} allowed; the next may start in {free_in_s}s",
                if *changes == 1 { "change" } else { "changes" }
            ),
            Refusal::Cycles { offs, cap, free_in_s } => {
                write!(f, "powered off {offs} times in the last day, its cap of {cap} power cycles a day: kept on for another {}", human(*free_in_s))
            }
        }
    }
}

/// The changes of `server` within `window_s` before `now_s`.
fn within(changes: &[PowerChange], now_s: Seconds, window_s: Seconds) -> impl Iterator<Item = &PowerChange> {
    changes.iter().filter(move |c| c.at_s <= now_s && now_s - c.at_s < window_s)
}

/// How worn a server is, least first: its power-offs in the last day, then
/// how recently its power last changed (never changed sorts first).
pub fn wear(server: &Server, now_s: Seconds) -> (usize, Seconds) {
    let offs = within(&server.power_changes, now_s, CYCLE_WINDOW_S).filter(|c| !c.on).count();
    let last = server.power_changes.iter().map(|c| c.at_s).max().unwrap_or(0);
    (offs, last)
}

/// The power changes of a decision: those of the last minute, by group,
/// and those the decision plans.
pub struct Gate<'s> {
    limits: &'s TransitionLimits,
    pools: &'s [ServerPool],
    nodes: BTreeMap<&'s str, &'s Node>,
    now_s: Seconds,
    /// Per rate and group: the times of its changes in the window, planned
    /// ones at `now_s`.
    recent: BTreeMap<(usize, String), Vec<Seconds>>,
}

impl<'s> Gate<'s> {
    pub fn new(snap: &'s Snapshot, now_s: Seconds) -> Self {
        let nodes = snap.nodes.iter().filter_map(|n| Some((n.server.as_deref()?, n))).collect();
        let mut gate = Gate { limits: &snap.transition_limits, pools: &snap.pools, nodes, now_s, recent: BTreeMap::new() };
        if gate.limits.rates.is_empty() {
            return gate;
        }
        for s in &snap.servers {
            let times: Vec<Seconds> = within(&s.power_changes, now_s, RATE_WINDOW_S).map(|c| c.at_s).collect();
            if times.is_empty() {
                continue;
            }
            for key in gate.groups(s) {
                gate.recent.entry(key).or_default().extend(&times);
            }
        }
        gate
    }

    /// The groups `server` is in: per rate, its group's name.
    fn groups(&self, server: &Server) -> Vec<(usize, String)> {
        self.limits
            .rates
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                let group = match &r.scope {
                    RateScope::Fleet => "the fleet".to_string(),
                    RateScope::Pool => {
                        let pool = crate::warm::pool_of(self.pools, server, self.nodes.get(server.name.as_str()).copied())?;
                        format!("ServerPool {}", pool.name)
                    }
                    RateScope::Label(key) => format!("{key}={}", server.labels.get(key)?),
                };
                Some((i, group))
            })
            .collect()
    }

    /// Why `server` may not be powered on (`on`) or off now, if it may not.
    pub fn refusal(&self, server: &Server, on: bool) -> Option<Refusal> {
        if !on && let Some(cap) = self.limits.max_cycles_per_day {
            let offs: Vec<Seconds> = within(&server.power_changes, self.now_s, CYCLE_WINDOW_S).filter(|c| !c.on).map(|c| c.at_s).collect();
            if offs.len() as u32 >= cap {
                // The day must lose enough of them for one more.
                let mut sorted = offs.clone();
                sorted.sort_unstable();
                let leaves = sorted[offs.len() - cap as usize] + CYCLE_WINDOW_S;
                return Some(Refusal::Cycles { offs: offs.len() as u32, cap, free_in_s: leaves.saturating_sub(self.now_s) });
            }
        }
        for (i, group) in self.groups(server) {
            let per_minute = self.limits.rates[i].per_minute;
            let times = self.recent.get(&(i, group.clone())).map_or(&[][..], Vec::as_slice);
            if times.len() as u32 >= per_minute {
                let mut sorted = times.to_vec();
                sorted.sort_unstable();
                let leaves = sorted[times.len() - per_minute as usize] + RATE_WINDOW_S;
                return Some(Refusal::Rate { group, changes: times.len() as u32, per_minute, free_in_s: leaves.saturating_sub(self.now_s) });
            }
        }
        None
    }

    /// Counts a change of `server` the decision plans now.
    pub fn take(&mut self, server: &Server) {
        for key in self.groups(server) {
            self.recent.entry(key).or_default().push(self.now_s);
        }
    }

    /// Takes back a change counted by [`Gate::take`].
    pub fn give(&mut self, server: &Server) {
        for key in self.groups(server) {
            if let Some(times) = self.recent.get_mut(&key)
                && let Some(at) = times.iter().rposition(|&t| t == self.now_s)
            {
                times.remove(at);
            }
        }
    }

    /// Whether any limit is set: when none is, every answer is None.
    pub fn limits(&self) -> bool {
        !self.limits.is_empty()
    }
}

/// The first time after `now_s` at which a change the limits refuse now
/// may be allowed: a group's oldest change of the last minute leaves it,
/// or a server's oldest power-off of the last day leaves the day. A
/// runner that decides only on change decides again by then.
pub fn next_change_s(snap: &Snapshot, now_s: Seconds) -> Option<Seconds> {
    let limits = &snap.transition_limits;
    if limits.is_empty() {
        return None;
    }
    let gate = Gate::new(snap, now_s);
    let rates = gate.recent.iter().filter(|((i, _), times)| times.len() as u32 >= limits.rates[*i].per_minute);
    let rate_ends = rates.filter_map(|(_, times)| times.iter().min().map(|t| t + RATE_WINDOW_S));
    let cycle_ends = limits.max_cycles_per_day.into_iter().flat_map(|cap| {
        snap.servers.iter().filter_map(move |s| {
            let offs: Vec<Seconds> = within(&s.power_changes, now_s, CYCLE_WINDOW_S).filter(|c| !c.on).map(|c| c.at_s).collect();
            (offs.len() as u32 >= cap).then(|| offs.iter().min().map(|t| t + CYCLE_WINDOW_S)).flatten()
        })
    });
    rate_ends.chain(cycle_ends).filter(|&t| t > now_s).min()
}

/// Keeps of `changes` those of the last day at `now_s`, at most `keep`
/// of the newest: what a driver needs to record.
pub fn prune(changes: &mut Vec<PowerChange>, now_s: Seconds, keep: usize) {
    changes.retain(|c| now_s.saturating_sub(c.at_s) < CYCLE_WINDOW_S);
    changes.sort_by_key(|c| c.at_s);
    if changes.len() > keep {
        changes.drain(..changes.len() - keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Resources;

    fn server(name: &str, rack: &str, changes: &[(Seconds, bool)]) -> Server {
        let mut s = Server::new(name, Resources::new(1000, 1 << 30)).with_labels(&[("rack", rack)]);
        s.power_changes = changes.iter().map(|&(at_s, on)| PowerChange { at_s, on }).collect();
        s
    }

    #[test]
    fn rates_parse_from_their_flag_form_and_bad_ones_say_what_is_expected() {
        assert_eq!(parse_rate("fleet=20").unwrap(), TransitionRate { scope: RateScope::Fleet, per_minute: 20 });
        assert_eq!(parse_rate("pool=3").unwrap().scope, RateScope::Pool);
        let rack = parse_rate("topology.kubernetes.io/rack=4").unwrap();
        assert_eq!(rack.scope, RateScope::Label("topology.kubernetes.io/rack".into()));
        assert_eq!(rack.to_string(), "topology.kubernetes.io/rack=4");
        for bad in ["fleet", "fleet=0", "fleet=-1", "=4", "pool=x", "bad key!=3"] {
            let err = parse_rate(bad).unwrap_err();
            assert!(err.contains("SCOPE=N"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_rack_at_its_rate_refuses_a_change_until_its_oldest_leaves_the_minute_and_other_racks_are_free() {
        let mut snap = Snapshot::default();
        snap.transition_limits.rates.push(parse_rate("rack=2").unwrap());
        snap.servers = vec![server("a", "r1", &[(950, true)]), server("b", "r1", &[(980, false)]), server("c", "r1", &[]), server("d", "r2", &[])];
        let gate = Gate::new(&snap, 1_000);
        let refused = gate.refusal(&snap.servers[2], true).expect("r1 has had 2 changes in the minute");
        assert_eq!(refused, Refusal::Rate { group: "rack=r1".into(), changes: 2, per_minute: 2, free_in_s: 10 });
        assert_eq!(gate.refusal(&snap.servers[3], true), None);
        assert_eq!(next_change_s(&snap, 1_000), Some(1_010));
        // At 1010 the 950 change has left the window.
        assert_eq!(Gate::new(&snap, 1_010).refusal(&snap.servers[2], true), None);
        // Changes the decision plans count: r2's one change uses its rate up
        // after a second, and giving it back frees it.
        let mut gate = Gate::new(&snap, 1_010);
        gate.take(&snap.servers[3]);
        assert_eq!(gate.refusal(&snap.servers[3], false), None);
        gate.take(&snap.servers[3]);
        assert!(matches!(gate.refusal(&snap.servers[3], true), Some(Refusal::Rate { free_in_s: 60, .. })));
        gate.give(&snap.servers[3]);
        assert_eq!(gate.refusal(&snap.servers[3], true), None);
    }

    #[test]
    fn a_server_at_its_cycle_cap_is_not_powered_off_but_may_always_be_powered_on() {
        let mut snap = Snapshot::default();
        snap.transition_limits.max_cycles_per_day = Some(2);
        let day = CYCLE_WINDOW_S;
        snap.servers = vec![server("a", "r1", &[(100, false), (200, true), (300, false), (400, true)])];
        let gate = Gate::new(&snap, 1_000);
        let refused = gate.refusal(&snap.servers[0], false).unwrap();
        assert_eq!(refused, Refusal::Cycles { offs: 2, cap: 2, free_in_s: 100 + day - 1_000 });
        assert!(refused.to_string().contains("cap of 2 power cycles a day"), "{refused}");
        assert_eq!(gate.refusal(&snap.servers[0], true), None);
        assert_eq!(next_change_s(&snap, 1_000), Some(100 + day));
        assert_eq!(Gate::new(&snap, 100 + day).refusal(&snap.servers[0], false), None);
    }

    #[test]
    fn wear_orders_the_fewest_power_offs_first_then_the_longest_unchanged() {
        let now = 100_000;
        let fresh = server("fresh", "r", &[]);
        let old = server("old", "r", &[(now - 5_000, false)]);
        let recent = server("recent", "r", &[(now - 50, false)]);
        let twice = server("twice", "r", &[(now - 9_000, false), (now - 8_000, true), (now - 7_000, false)]);
        let mut all = [&twice, &recent, &old, &fresh];
        all.sort_by_key(|s| wear(s, now));
        let names: Vec<&str> = all.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["fresh", "old", "recent", "twice"]);
    }

    #[test]
    fn prune_keeps_the_last_day_and_at_most_the_newest_few() {
        let mut changes: Vec<PowerChange> = (0..10).map(|i| PowerChange { at_s: i * 10_000, on: i % 2 == 0 }).collect();
        prune(&mut changes, 100_000, 5);
        let times: Vec<Seconds> = changes.iter().map(|c| c.at_s).collect();
        assert_eq!(times, [50_000, 60_000, 70_000, 80_000, 90_000]);
        // A day after 50,000 s, that change has left it.
        prune(&mut changes, 50_000 + CYCLE_WINDOW_S, 5);
        assert_eq!(changes.len(), 4);
    }
}
