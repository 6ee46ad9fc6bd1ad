//! Which machine a node runs on, and whether ironclaim may act on a server
//! at all.
//!
//! A node says which server it is by its providerID (`ironclaim://NAME`) or
//! the `ironclaim.dev/server` label. Both are written by whoever set the
//! machine up, so a cloned image or a wrong mapping makes them lie. The
//! kubelet also reports the machine's firmware UUID (`nodeInfo.systemUUID`),
//! which the BMC reports as the Redfish System's `UUID`: where ironclaim has
//! recorded a server's UUID, the two must agree.
//!
//! # Guarantees
//! - A node is linked to a server when it names the server, or carries its
//!   recorded UUID, and nothing contradicts it.
//! - A contradiction (a node that names one server and carries another's
//!   UUID, or a UUID other than its server's; two nodes on one server; a
//!   BMC that now answers with another machine's UUID) is a
//!   [`Health::IdentityMismatch`] on every server it touches, and none of
//!   their nodes is linked: no power action, claim or drain reaches them.
//! - A server that is on, that ironclaim did not power on, and that no node
//!   is linked to, is [`Health::Unadopted`]: what runs on it is unknown, so
//!   it is neither claimed nor powered off until a node links to it or an
//!   operator adopts it ([`Adopt`]).
//! - [`refuse_power_off`] is the last check before a power-off, on what was
//!   just read from the API: the controller and the simulator both ask it.

use std::collections::{BTreeMap, HashMap};

use crate::model::Health;

/// What an operator says about a server ironclaim did not power on
/// (`spec.adopt`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Adopt {
    /// Adopted once ironclaim knows what runs on it: it is off, ironclaim
    /// powered it on, or a node is linked to it.
    #[default]
    Auto,
    /// Adopted now: the operator vouches that an idle server runs nothing
    /// ironclaim cannot see, so it may be claimed or powered off.
    PowerOffWhenIdle,
    /// Never adopted: ironclaim never claims, drains or powers it off.
    Never,
}

/// A node as it describes itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeSays<'a> {
    pub node: &'a str,
    /// The server its providerID or `ironclaim.dev/server` label names.
    pub server: Option<&'a str>,
    /// `nodeInfo.systemUUID`, as the kubelet read it from the firmware.
    pub system_uuid: Option<&'a str>,
}

/// The servers of the inventory, as far as identity goes.
pub trait Inventory {
    /// `None` when there is no such server; `Some(None)` when it has no
    /// UUID recorded.
    fn uuid_of(&self, server: &str) -> Option<Option<&str>>;
    /// The server whose recorded UUID this is (compared with [`same_uuid`]'s
    /// rule: `uuid` is lowercase).
    fn server_with_uuid(&self, uuid: &str) -> Option<&str>;
    /// Servers whose BMC now answers with another machine's UUID, with why.
    fn moved(&self) -> &BTreeMap<String, String>;
}

/// An inventory as two maps, built once.
#[derive(Clone, Debug, Default)]
pub struct Servers {
    uuids: HashMap<String, Option<String>>,
    by_uuid: HashMap<String, String>,
    /// Servers whose BMC answers with a UUID other than the recorded one.
    moved: BTreeMap<String, String>,
}

impl Servers {
    /// Adds a server with its recorded UUID, and the UUID its BMC reports
    /// now when it differs (the BMC address was pointed at another machine).
    pub fn add(&mut self, server: &str, recorded: Option<&str>, reported: Option<&str>) {
        let recorded = recorded.map(normal);
        if let Some(u) = &recorded {
            // Two Servers for one machine: a power action on either reaches
            // the other's node.
            if let Some(other) = self.by_uuid.get(u).filter(|o| *o != server) {
                let why = format!("servers {other} and {server} both record system UUID {u}: they are one machine");
                self.moved.insert(other.clone(), why.clone());
                self.moved.insert(server.to_string(), why);
            }
            self.by_uuid.insert(u.clone(), server.to_string());
            if let Some(now) = reported
                && !same_uuid(u, now)
            {
                self.moved.insert(server.to_string(), format!("its BMC now reports system UUID {now}, not the recorded {u}"));
            }
        }
        self.uuids.insert(server.to_string(), recorded);
    }
}

impl Inventory for Servers {
    fn uuid_of(&self, server: &str) -> Option<Option<&str>> {
        self.uuids.get(server).map(|u| u.as_deref())
    }
    fn server_with_uuid(&self, uuid: &str) -> Option<&str> {
        self.by_uuid.get(uuid).map(String::as_str)
    }
    fn moved(&self) -> &BTreeMap<String, String> {
        &self.moved
    }
}

fn normal(uuid: &str) -> String {
    uuid.trim().to_ascii_lowercase()
}

/// Two UUIDs name one machine: compared without regard to case or
/// surrounding space.
pub fn same_uuid(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

/// Which node runs on which server, and which servers are in doubt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Links {
    /// Node to server, for the links nothing contradicts.
    pub node_server: HashMap<String, String>,
    /// Server to node, the same links the other way.
    pub server_node: HashMap<String, String>,
    /// Servers whose identity is contradicted, with why.
    pub mismatches: BTreeMap<String, String>,
}

impl Links {
    pub fn server_of(&self, node: &str) -> Option<&str> {
        self.node_server.get(node).map(String::as_str)
    }
    pub fn node_of(&self, server: &str) -> Option<&str> {
        self.server_node.get(server).map(String::as_str)
    }
    pub fn mismatch(&self, server: &str) -> Option<&str> {
        self.mismatches.get(server).map(String::as_str)
    }
}

/// Links nodes to servers (see the module's guarantees).
pub fn link<'a, I: Inventory>(nodes: impl IntoIterator<Item = NodeSays<'a>>, inventory: &I) -> Links {
    let mut mismatches: BTreeMap<String, String> = inventory.moved().clone();
    let mut claimed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    fn doubt(mismatches: &mut BTreeMap<String, String>, server: &str, why: String) {
        mismatches.entry(server.to_string()).or_insert(why);
    }
    for n in nodes {
        let named = n.server.filter(|s| inventory.uuid_of(s).is_some());
        let uuid = n.system_uuid.map(normal).filter(|u| !u.is_empty());
        let by_uuid = uuid.as_deref().and_then(|u| inventory.server_with_uuid(u));
        let server = match (named, by_uuid) {
            (Some(s), Some(t)) if s != t => {
                let why = format!("node {} says it is server {s}, but its system UUID is server {t}'s", n.node);
                doubt(&mut mismatches, s, why.clone());
                doubt(&mut mismatches, t, why);
                continue;
            }
            (Some(s), _) => {
                if let (Some(u), Some(Some(recorded))) = (&uuid, inventory.uuid_of(s))
                    && !same_uuid(u, recorded)
                {
                    doubt(
                        &mut mismatches,
                        s,
                        format!("node {} says it is server {s}, but its system UUID {u} is not the recorded {recorded}", n.node),
                    );
                    continue;
                }
                s
            }
            (None, Some(t)) => {
                if let Some(other) = n.server {
                    doubt(&mut mismatches, t, format!("node {} says it is {other}, but its system UUID is server {t}'s", n.node));
                    continue;
                }
                t
            }
            (None, None) => continue,
        };
        claimed.entry(server.to_string()).or_default().push(n.node.to_string());
    }
    let mut links = Links::default();
    for (server, nodes) in claimed {
        if nodes.len() > 1 {
            doubt(&mut mismatches, &server, format!("nodes {} all say they are server {server}", nodes.join(", ")));
        }
        if mismatches.contains_key(&server) {
            continue;
        }
        let node = nodes.into_iter().next().unwrap_or_default();
        links.node_server.insert(node.clone(), server.clone());
        links.server_node.insert(server, node);
    }
    links.mismatches = mismatches;
    links
}

/// What is known of a server's power and who turned it on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PowerFacts {
    /// Recorded or read as on (or powering on).
    pub on: bool,
    /// ironclaim powered it on and has not seen it off since.
    pub powered_on_by_ironclaim: bool,
    /// A node is linked to it.
    pub linked: bool,
    pub adopt: Adopt,
}

/// Why ironclaim keeps its hands off a server that is not in doubt: None
/// when it is adopted.
pub fn unadopted(facts: PowerFacts) -> Option<&'static str> {
    match facts.adopt {
        Adopt::Never => Some("spec.adopt is Never: ironclaim never claims, drains or powers it off"),
        Adopt::PowerOffWhenIdle => None,
        Adopt::Auto if !facts.on || facts.powered_on_by_ironclaim || facts.linked => None,
        Adopt::Auto => Some(
            "it is on, ironclaim did not power it on, and no node is linked to it (by system UUID, providerID or label): \
             what runs on it is unknown; set spec.adopt: PowerOffWhenIdle once it runs nothing",
        ),
    }
}

/// The health a server is given once identity and adoption are known: a
/// mismatch or an unadopted server overrides what was recorded.
pub fn health(recorded: Health, mismatch: bool, facts: PowerFacts) -> Health {
    if mismatch {
        Health::IdentityMismatch
    } else if unadopted(facts).is_some() {
        Health::Unadopted
    } else {
        recorded
    }
}

/// The last check before a power-off of `server`, on what was just read
/// from the API: the nodes, the server's recorded UUID (and the one its BMC
/// answers with, when read), and its power facts. `node` is the node the
/// power-off drains, if any: it must be the only node on the server, and
/// its identity must hold. Some(why) refuses.
pub fn refuse_power_off<'a>(
    server: &str,
    recorded_uuid: Option<&str>,
    reported_uuid: Option<&str>,
    facts: PowerFacts,
    nodes: impl IntoIterator<Item = NodeSays<'a>>,
    node: Option<&str>,
) -> Option<String> {
    let mut inventory = Servers::default();
    inventory.add(server, recorded_uuid, reported_uuid);
    // Only the nodes that name this server or carry its UUID bear on it;
    // the inventory of one makes any other name count as no server.
    let mine = nodes.into_iter().filter(|n| n.server == Some(server) || n.system_uuid.zip(recorded_uuid).is_some_and(|(a, b)| same_uuid(a, b)));
    let links = link(mine, &inventory);
    if let Some(why) = links.mismatch(server) {
        return Some(format!("server {server}: identity mismatch: {why}"));
    }
    match (links.node_of(server), node) {
        (Some(other), Some(expected)) if other != expected => Some(format!("server {server} is node {other}, not {expected}")),
        (Some(other), None) => Some(format!("server {server} is node {other}")),
        (linked, _) => {
            let facts = PowerFacts { linked: facts.linked || linked.is_some(), ..facts };
            unadopted(facts).map(|why| format!("server {server} is not adopted: {why}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "4c4c4544-0041-1010-8000-b1c04f000001";
    const B: &str = "4c4c4544-0042-1010-8000-b1c04f000002";

    fn inventory() -> Servers {
        let mut s = Servers::default();
        s.add("a", Some(A), None);
        s.add("b", Some(B), None);
        s.add("c", None, None);
        s
    }

    fn says<'a>(node: &'a str, server: Option<&'a str>, uuid: Option<&'a str>) -> NodeSays<'a> {
        NodeSays { node, server, system_uuid: uuid }
    }

    fn linked(links: &Links) -> Vec<(&str, &str)> {
        let mut v: Vec<(&str, &str)> = links.node_server.iter().map(|(n, s)| (n.as_str(), s.as_str())).collect();
        v.sort();
        v
    }

    #[test]
    fn every_case_of_what_a_node_says_against_what_was_recorded() {
        let inv = inventory();
        // (nodes, links, servers in doubt)
        let upper = A.to_ascii_uppercase();
        type Case<'a> = (&'a str, Vec<NodeSays<'a>>, Vec<(&'a str, &'a str)>, Vec<&'a str>);
        let cases: Vec<Case> = vec![
            ("label and UUID agree", vec![says("n", Some("a"), Some(A))], vec![("n", "a")], vec![]),
            ("UUIDs compare without case", vec![says("n", Some("a"), Some(&upper))], vec![("n", "a")], vec![]),
            ("a label alone", vec![says("n", Some("a"), None)], vec![("n", "a")], vec![]),
            ("a label on a server with no UUID recorded", vec![says("n", Some("c"), Some(B))], vec![], vec!["b", "c"]),
            ("an unlabelled worker found by its UUID", vec![says("w", None, Some(B))], vec![("w", "b")], vec![]),
            ("a label naming no server of the inventory, with b's UUID", vec![says("m", Some("metal3-x"), Some(B))], vec![], vec!["b"]),
            ("a cloned image: names a, runs on b", vec![says("n", Some("a"), Some(B))], vec![], vec!["a", "b"]),
            ("names a, with a UUID no server has", vec![says("n", Some("a"), Some("ffff"))], vec![], vec!["a"]),
            ("names c (no UUID recorded) with an unknown UUID", vec![says("n", Some("c"), Some("ffff"))], vec![("n", "c")], vec![]),
            ("a reinstall left a stale node", vec![says("old", Some("a"), Some(A)), says("new", Some("a"), Some(A))], vec![], vec!["a"]),
            ("nothing to go by", vec![says("x", None, None), says("y", Some("zz"), Some("ffff"))], vec![], vec![]),
        ];
        for (what, nodes, want_links, want_doubt) in cases {
            let links = link(nodes, &inv);
            assert_eq!(linked(&links), want_links, "{what}");
            assert_eq!(links.mismatches.keys().map(String::as_str).collect::<Vec<_>>(), want_doubt, "{what}: {:?}", links.mismatches);
        }
    }

    #[test]
    fn a_bmc_that_answers_for_another_machine_puts_its_server_in_doubt() {
        let mut inv = Servers::default();
        inv.add("a", Some(A), Some(&A.to_ascii_uppercase()));
        assert!(inv.moved.is_empty());
        inv.add("a", Some(A), Some(B));
        let links = link([says("n", Some("a"), Some(A))], &inv);
        assert!(links.node_server.is_empty());
        assert!(links.mismatch("a").is_some_and(|w| w.contains(B)), "{links:?}");
    }

    #[test]
    fn two_servers_that_record_one_machine_are_both_in_doubt() {
        let mut inv = Servers::default();
        inv.add("a", Some(A), None);
        inv.add("a-again", Some(&A.to_ascii_uppercase()), None);
        inv.add("b", Some(B), None);
        let links = link([says("n", Some("a"), Some(A)), says("m", Some("b"), Some(B))], &inv);
        assert_eq!(links.mismatches.keys().map(String::as_str).collect::<Vec<_>>(), ["a", "a-again"]);
        assert_eq!(linked(&links), [("m", "b")]);
    }

    fn facts(on: bool, ours: bool, linked: bool, adopt: Adopt) -> PowerFacts {
        PowerFacts { on, powered_on_by_ironclaim: ours, linked, adopt }
    }

    #[test]
    fn a_server_is_adopted_once_ironclaim_knows_what_runs_on_it() {
        use Adopt::*;
        let cases = [
            (facts(false, false, false, Auto), false, "off: nothing runs on it"),
            (facts(true, true, false, Auto), false, "ironclaim powered it on"),
            (facts(true, false, true, Auto), false, "a node is linked to it"),
            (facts(true, false, false, Auto), true, "on, not ours, no node: unknown"),
            (facts(true, false, false, PowerOffWhenIdle), false, "the operator vouches for it"),
            (facts(false, true, true, Never), true, "never, whatever it is"),
        ];
        for (f, held, what) in cases {
            assert_eq!(unadopted(f).is_some(), held, "{what}");
            assert_eq!(health(Health::Healthy, false, f) == Health::Unadopted, held, "{what}");
        }
        assert_eq!(health(Health::Quarantined, true, facts(false, false, false, Auto)), Health::IdentityMismatch);
    }

    #[test]
    fn the_last_check_before_a_power_off_refuses_every_machine_running_work_it_cannot_rule_out() {
        let ours = facts(true, true, false, Adopt::Auto);
        let on_unknown = facts(true, false, false, Adopt::Auto);
        type Case<'a> = (&'a str, Option<&'a str>, PowerFacts, Vec<NodeSays<'a>>, Option<&'a str>, Option<&'a str>);
        let cases: Vec<Case> = vec![
            ("a spare ironclaim powered on, no node", Some(A), ours, vec![says("x", Some("b"), Some(B))], None, None),
            ("an unlabelled worker on the spare", Some(A), ours, vec![says("w", None, Some(A))], None, Some("is node w")),
            ("a node that names it", None, ours, vec![says("n", Some("a"), None)], None, Some("is node n")),
            ("on, not ours, no node", Some(A), on_unknown, vec![], None, Some("not adopted")),
            ("the drained node is the only one", Some(A), ours, vec![says("n", Some("a"), Some(A))], Some("n"), None),
            ("the drained node is gone", Some(A), ours, vec![], Some("n"), None),
            (
                "the drained node is a stale twin of the live one",
                Some(A),
                ours,
                vec![says("old", Some("a"), Some(A)), says("new", Some("a"), Some(A))],
                Some("old"),
                Some("identity mismatch"),
            ),
            ("the drained node runs on another machine", Some(A), ours, vec![says("n", Some("a"), Some(B))], Some("n"), Some("identity mismatch")),
            (
                "another node carries its UUID but names b",
                Some(A),
                ours,
                vec![says("n", Some("a"), Some(A)), says("imp", Some("b"), Some(A))],
                Some("n"),
                Some("identity mismatch"),
            ),
            ("the drained node is another's", Some(A), ours, vec![says("m", None, Some(A))], Some("n"), Some("is node m, not n")),
        ];
        for (what, uuid, f, nodes, node, want) in cases {
            let got = refuse_power_off("a", uuid, None, f, nodes, node);
            match want {
                None => assert_eq!(got, None, "{what}"),
                Some(w) => assert!(got.as_deref().is_some_and(|g| g.contains(w)), "{what}: {got:?}"),
            }
        }
        let moved = refuse_power_off("a", Some(A), Some(B), ours, [], None);
        assert!(moved.is_some_and(|w| w.contains("identity mismatch")));
    }
}
