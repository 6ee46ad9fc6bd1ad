//! The in-memory index of the cluster: every object the controller decides
//! from, kept current by watches, turned into a core [`Snapshot`] on demand.
//!
//! The index does no IO. Watches call [`Index::apply`], [`Index::delete`]
//! and [`Index::reset`]; everything is synchronous, so tests drive it with
//! plain objects.

use std::collections::{BTreeMap, HashMap};

use ironclaim_core::identity::{self, Links};
use ironclaim_core::model::{self as core, Health, Seconds, Snapshot};
use ironclaim_k8s::api::{Server, ServerClaim, ServerPool};
use ironclaim_k8s::node::{CLUSTER_API_SERVER_LABEL, Parking, SERVER_LABEL, parking};
use ironclaim_k8s::pod::{pod_from_k8s, pod_from_template};
use ironclaim_k8s::{node_from_k8s, pdb_from_k8s, server_to_core, serverclaim_in_flight, serverpool_to_core};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;

use crate::gates;
use crate::locks::{self, LEGACY_LEDGER_NAME, Ledger, Lock};

/// The prefix of a node's `spec.providerID` that names its server.
pub const PROVIDER_ID_PREFIX: &str = "ironclaim://";

/// The condition on a Server whose last transition is its last failed claim.
pub const CLAIM_FAILED_CONDITION: &str = "ClaimFailed";

/// A pod as the index keeps it: converted once, when it changes, and
/// shared with every snapshot taken while it stays unchanged.
#[derive(Clone, Debug)]
pub struct PodEntry {
    pub pod: std::sync::Arc<core::Pod>,
}

/// One object that could not be read, for logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    pub object: String,
    pub error: String,
}

/// Everything watched, by kind.
#[derive(Default, Debug)]
pub struct Index {
    /// Pods by key; changed only through [`Indexed`], which keeps
    /// `demand` in step.
    pub pods: BTreeMap<String, PodEntry>,
    /// The keys of `pods` the core plans for ([`core::Pod::is_demand`]):
    /// a step reads them without walking every pod of the cluster.
    demand: std::collections::BTreeSet<String>,
    /// Pods that could not be read, with why, and the node each is bound
    /// to: such a pod still holds its node (see [`Index::snapshot`]).
    pub bad_pods: BTreeMap<String, BadPod>,
    pub nodes: BTreeMap<String, Box<Node>>,
    /// For their labels: `namespaceSelector` in pod affinity terms.
    pub namespaces: BTreeMap<String, Namespace>,
    pub daemonsets: BTreeMap<String, DaemonSet>,
    pub pdbs: BTreeMap<String, PodDisruptionBudget>,
    /// Shared: a power sweep holds every Server while it reads their BMCs.
    pub servers: BTreeMap<String, std::sync::Arc<Server>>,
    pub pools: BTreeMap<String, ServerPool>,
    pub claims: BTreeMap<String, ServerClaim>,
    /// Claim locks by server, from every ledger ConfigMap as a take reads
    /// them: a server's shard first, then the legacy ledger (see
    /// [`crate::locks`]).
    pub locks: BTreeMap<String, Lock>,
    /// Each ledger ConfigMap by name, as the locks it holds and the bytes
    /// its entries take (against [`crate::locks::LEDGER_CAP_BYTES`]): what
    /// `locks` is made from.
    pub ledgers: BTreeMap<String, LedgerContents>,
    /// [`Index::links`], made once per change of what the index holds.
    links: std::sync::OnceLock<Links>,
    /// What the CapacityBuffers add to the pools' headroom, as
    /// [`crate::buffers`] last resolved them.
    pub buffer_rooms: Vec<ironclaim_core::buffer::Room>,
    /// The pods of ProvisioningRequests, by key: pending stand-ins of a
    /// gang, in every snapshot (shared, as the other pods) and among the
    /// pending pods, kept by [`crate::provisioning_requests`].
    pub gang_pods: BTreeMap<String, std::sync::Arc<core::Pod>>,
    /// One copy of each distinct set of pod labels and node selectors.
    labels: ironclaim_core::labels::Interner<ironclaim_core::labels::Labels>,
    tolerations: ironclaim_core::labels::Interner<ironclaim_core::labels::Tolerations>,
    /// One copy of each distinct [`core::PodShape`]: pods of one template.
    shapes: ironclaim_core::labels::Interner<ironclaim_core::labels::Shared<core::PodShape>>,
}

/// One ledger ConfigMap as the index keeps it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LedgerContents {
    pub locks: BTreeMap<String, Lock>,
    pub bytes: usize,
}

/// A kind the index holds.
pub trait Indexed: Sized {
    /// What the index keeps of one object while a relist is under way:
    /// what [`Indexed::apply`] would store, made at once, so that a list of
    /// 150,000 pods is never held whole as API objects.
    type Listed;
    fn listed(self) -> Self::Listed;
    /// Whether a change of an object of the kind can change
    /// [`Index::links`] (only Nodes and Servers say which runs on which).
    const LINKS: bool = false;
    fn apply(self, index: &mut Index);
    fn delete(&self, index: &mut Index);
    /// What a watch relist gathers until its end. Most kinds gather the
    /// listed objects and replace theirs with them at the end, at once.
    /// Pods, too many to hold twice, go into the index as they arrive, and
    /// the relist gathers only their keys: at its end the pods it did not
    /// bring are dropped.
    type Relist: Default + Send;
    fn relist_add(relist: &mut Self::Relist, listed: Self::Listed, index: &mut Index);
    /// Ends a relist: the index then holds exactly what it brought.
    fn relist_done(relist: Self::Relist, index: &mut Index);
}

fn object_key<K: kube::Resource>(object: &K, namespaced: bool) -> String {
    if namespaced { format!("{}/{}", object.namespace().unwrap_or_else(|| "default".to_string()), object.name_any()) } else { object.name_any() }
}

/// The object as the index keeps it: without `metadata.managedFields`,
/// which nothing here reads and which can be a third of an object, nor
/// what [`Trimmed`] drops of its kind.
fn kept<K: kube::Resource + Trimmed>(mut object: K) -> K {
    object.meta_mut().managed_fields = None;
    object.trim();
    object
}

/// What the index drops of an object of a kind, beyond its managed fields:
/// parts nothing here reads.
trait Trimmed {
    fn trim(&mut self) {}
}

impl Trimmed for Node {
    /// A kubelet lists up to 50 of the node's container images, each with
    /// its names by tag and by digest: some 10 KB a node, more than the
    /// rest of it (about 4 KB). kube-scheduler scores nodes by them;
    /// ironclaim's decisions do not read them.
    fn trim(&mut self) {
        if let Some(status) = self.status.as_mut() {
            status.images = None;
        }
    }
}

impl Trimmed for Namespace {}
impl Trimmed for DaemonSet {}
impl Trimmed for PodDisruptionBudget {}
impl Trimmed for Server {}
impl Trimmed for ServerPool {}
impl Trimmed for ServerClaim {}
impl Trimmed for ConfigMap {}

macro_rules! keyed {
    ($kind:ty, $field:ident, $namespaced:expr) => {
        keyed!($kind, $field, $namespaced, false);
    };
    ($kind:ty, $field:ident, $namespaced:expr, $links:expr) => {
        impl Indexed for $kind {
            type Listed = Self;
            const LINKS: bool = $links;
            fn listed(self) -> Self {
                kept(self)
            }
            fn apply(self, index: &mut Index) {
                index.$field.insert(object_key(&self, $namespaced), kept(self).into());
            }
            fn delete(&self, index: &mut Index) {
                index.$field.remove(&object_key(self, $namespaced));
            }
            type Relist = Vec<Self>;
            fn relist_add(relist: &mut Vec<Self>, listed: Self, _: &mut Index) {
                relist.push(listed);
            }
            fn relist_done(relist: Vec<Self>, index: &mut Index) {
                index.$field.clear();
                for o in relist {
                    o.apply(index);
                }
            }
        }
    };
}

keyed!(Node, nodes, false, true);
keyed!(Namespace, namespaces, false);
keyed!(DaemonSet, daemonsets, true);
keyed!(PodDisruptionBudget, pdbs, true);
keyed!(Server, servers, false, true);
keyed!(ServerPool, pools, false);
keyed!(ServerClaim, claims, false);

/// Only the lock ledger's ConfigMaps are kept, as their locks keyed by
/// server (the watch selects them by label; anything else is ignored all
/// the same).
impl Indexed for ConfigMap {
    type Listed = Self;
    fn listed(self) -> Self {
        kept(self)
    }
    fn apply(self, index: &mut Index) {
        let name = self.name_any();
        if Ledger::named(&name).is_none() {
            return;
        }
        let contents = LedgerContents { locks: Lock::all_in(&self), bytes: locks::ledger_bytes(self.data.iter().flatten()) };
        let before = index.ledgers.insert(name.clone(), contents).unwrap_or_default();
        let servers: Vec<String> = before.locks.into_keys().chain(index.ledgers[&name].locks.keys().cloned()).collect();
        index.relock(servers);
    }
    fn delete(&self, index: &mut Index) {
        if let Some(before) = index.ledgers.remove(&self.name_any()) {
            index.relock(before.locks.into_keys().collect());
        }
    }
    type Relist = Vec<Self>;
    fn relist_add(relist: &mut Vec<Self>, listed: Self, _: &mut Index) {
        relist.push(listed);
    }
    fn relist_done(relist: Vec<Self>, index: &mut Index) {
        index.ledgers.clear();
        index.locks.clear();
        for o in relist {
            o.apply(index);
        }
    }
}

/// A pod as the index keeps it, by key: converted, or refused with why.
pub type ListedPod = (String, Result<PodEntry, BadPod>);

impl Indexed for Pod {
    type Listed = ListedPod;
    fn listed(self) -> ListedPod {
        let k = object_key(&self, true);
        let entry = match pod_from_k8s(&self) {
            Ok(mut pod) => {
                let consumes = self.annotations().get(ironclaim_k8s::provisioning_request::CONSUME_ANNOTATION).cloned();
                // A pod that consumes a ProvisioningRequest is one of its
                // gang: it takes the place of a stand-in, and is given a
                // server only with the rest of the request's pods.
                pod.gang = consumes.as_ref().map(|request| format!("{}/{request}", pod.namespace));
                Ok(PodEntry { pod: pod.into() })
            }
            Err(err) => {
                let status = self.status.as_ref();
                let finished = status.and_then(|s| s.phase.as_deref()).is_some_and(|p| p == "Succeeded" || p == "Failed");
                let node = self.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty());
                Err(BadPod { error: err.to_string(), node, finished })
            }
        };
        (k, entry)
    }
    fn apply(self, index: &mut Index) {
        let (k, entry) = self.listed();
        index.put_pod(k, entry);
    }
    fn delete(&self, index: &mut Index) {
        index.drop_pod(&object_key(self, true));
    }
    type Relist = std::collections::HashSet<String>;
    fn relist_add(seen: &mut Self::Relist, (k, entry): ListedPod, index: &mut Index) {
        seen.insert(k.clone());
        index.put_pod(k, entry);
    }
    fn relist_done(seen: Self::Relist, index: &mut Index) {
        let gone: Vec<String> = index.pods.keys().chain(index.bad_pods.keys()).filter(|k| !seen.contains(*k)).cloned().collect();
        for k in gone {
            index.drop_pod(&k);
        }
    }
}

/// A pod the conversion refused.
#[derive(Clone, Debug)]
pub struct BadPod {
    pub error: String,
    pub node: Option<String>,
    /// Succeeded or Failed: it holds nothing.
    pub finished: bool,
}

/// The server a node says it is: `spec.providerID` `ironclaim://NAME`, else
/// the `ironclaim.dev/server` label its bootstrap set, else the label a
/// Cluster API Machine taken for a server passes to its Node.
pub fn node_server(node: &Node) -> Option<String> {
    node_says(node).server.map(str::to_string)
}

/// The prefix of a Cluster API Metal3 node's `spec.providerID`:
/// `metal3://NAMESPACE/BAREMETALHOST/MACHINE`.
pub const METAL3_PROVIDER_ID_PREFIX: &str = "metal3://";

/// The BareMetalHost (namespace, name) a Metal3 providerID names.
pub fn metal3_host_of(provider_id: &str) -> Option<(&str, &str)> {
    let mut parts = provider_id.strip_prefix(METAL3_PROVIDER_ID_PREFIX)?.split('/');
    let (namespace, host) = (parts.next()?, parts.next()?);
    (!namespace.is_empty() && !host.is_empty()).then_some((namespace, host))
}

/// What a node says of itself: the server it names, and the firmware UUID
/// its kubelet reported.
pub fn node_says(node: &Node) -> identity::NodeSays<'_> {
    node_says_with(node, |_, _| None)
}

/// [`node_says`], with a Metal3 providerID resolved by `metal3_server`
/// (BareMetalHost namespace and name to the Server it powers).
pub fn node_says_with<'a>(node: &'a Node, metal3_server: impl Fn(&str, &str) -> Option<&'a str>) -> identity::NodeSays<'a> {
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref());
    let named = provider_id.and_then(|id| id.strip_prefix(PROVIDER_ID_PREFIX)).filter(|s| !s.is_empty());
    let metal3 = || provider_id.and_then(metal3_host_of).and_then(|(ns, host)| metal3_server(ns, host));
    identity::NodeSays {
        node: node.metadata.name.as_deref().unwrap_or_default(),
        server: named
            .or_else(metal3)
            .or_else(|| node.labels().get(SERVER_LABEL).or_else(|| node.labels().get(CLUSTER_API_SERVER_LABEL)).map(String::as_str)),
        system_uuid: node.status.as_ref().and_then(|s| s.node_info.as_ref()).map(|i| i.system_uuid.as_str()).filter(|u| !u.trim().is_empty()),
    }
}

/// The power facts of a server as its status records them; `linked` as
/// given.
pub fn power_facts(server: &Server, linked: bool) -> identity::PowerFacts {
    use ironclaim_k8s::api::server::PowerState as P;
    let status = server.status.as_ref();
    identity::PowerFacts {
        // Unknown is an unreadable BMC: nothing is powered through it, and
        // a power-on reads it first (see `Claims::power_on`).
        on: status.and_then(|s| s.power_state).is_some_and(|p| matches!(p, P::On | P::PoweringOn | P::PoweringOff)),
        powered_on_by_ironclaim: status.is_some_and(|s| s.powered_on_by_ironclaim),
        linked,
        adopt: server.spec.adopt.to_core(),
    }
}

/// The identity a server's status recorded: (recorded UUID, the UUID its
/// BMC answered with last where that differs).
pub fn recorded_identity(server: &Server) -> (Option<&str>, Option<&str>) {
    let id = server.status.as_ref().and_then(|s| s.identity.as_ref());
    (id.and_then(|i| i.system_uuid.as_deref()), id.and_then(|i| i.reported_system_uuid.as_deref()))
}

/// How long a server that failed a claim waits before it is tried again:
/// the driver's rule.
pub use ironclaim_driver::backoff::FailureBackoff;

/// The second of the server's last failed claim, from its condition.
pub fn last_failure_s(server: &Server) -> Option<Seconds> {
    server
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CLAIM_FAILED_CONDITION && c.status == "True")
        .map(|c| c.last_transition_time.0.as_second().max(0) as Seconds)
}

impl Index {
    /// Throws away [`Index::links`] when a change of a `K` can change them.
    fn changing<K: Indexed>(&mut self) {
        if K::LINKS {
            self.links.take();
        }
    }

    pub fn apply<K: Indexed>(&mut self, object: K) {
        self.changing::<K>();
        object.apply(self);
    }

    pub fn delete<K: Indexed>(&mut self, object: &K) {
        self.changing::<K>();
        object.delete(self);
    }

    fn put_pod(&mut self, key: String, entry: Result<PodEntry, BadPod>) {
        match entry {
            Ok(mut entry) => {
                let pod = std::sync::Arc::make_mut(&mut entry.pod);
                self.labels.intern(&mut pod.labels);
                self.labels.intern(&mut pod.node_selector);
                self.tolerations.intern(&mut pod.tolerations);
                self.shapes.intern(&mut pod.shape);
                self.bad_pods.remove(&key);
                if entry.pod.is_demand() {
                    self.demand.insert(key.clone());
                } else {
                    self.demand.remove(&key);
                }
                self.pods.insert(key, entry);
            }
            Err(bad) => {
                self.drop_pod(&key);
                self.bad_pods.insert(key, bad);
            }
        }
    }

    fn drop_pod(&mut self, key: &str) {
        self.pods.remove(key);
        self.bad_pods.remove(key);
        self.demand.remove(key);
    }

    /// One object of a relist under way (see [`Indexed::Relist`]).
    pub fn relist_add<K: Indexed>(&mut self, relist: &mut K::Relist, listed: K::Listed) {
        self.changing::<K>();
        K::relist_add(relist, listed, self);
    }

    /// The end of a relist: the kind now holds exactly what it brought.
    pub fn relist_done<K: Indexed>(&mut self, relist: K::Relist) {
        self.changing::<K>();
        K::relist_done(relist, self);
    }

    /// A whole relist at once: replaces every object of the kind.
    pub fn reset<K: Indexed>(&mut self, objects: Vec<K::Listed>) {
        let mut relist = K::Relist::default();
        for listed in objects {
            self.relist_add::<K>(&mut relist, listed);
        }
        self.relist_done::<K>(relist);
    }

    /// Makes `locks` agree with `ledgers` for `servers`: each one's lock is
    /// its shard's, else the legacy ledger's.
    fn relock(&mut self, servers: Vec<String>) {
        for server in servers {
            let in_ledger = |name: &str| self.ledgers.get(name).and_then(|l| l.locks.get(&server));
            match in_ledger(&locks::ledger_of(&server)).or_else(|| in_ledger(LEGACY_LEDGER_NAME)).cloned() {
                Some(lock) => self.locks.insert(server, lock),
                None => self.locks.remove(&server),
            };
        }
    }

    /// Which node runs on which server, and which servers are in doubt
    /// (see [`identity::link`]): made once until the index changes, since
    /// every claim view and scale-down pass asks it server by server.
    pub fn links(&self) -> &Links {
        self.links.get_or_init(|| self.make_links())
    }

    fn make_links(&self) -> Links {
        let mut inventory = identity::Servers::default();
        for (name, server) in &self.servers {
            let (recorded, reported) = recorded_identity(server);
            inventory.add(name, recorded, reported);
        }
        let hosts: HashMap<(&str, &str), &str> = self
            .servers
            .iter()
            .filter_map(|(name, s)| s.spec.metal3_host().map(|h| ((h.namespace.as_str(), h.name.as_str()), name.as_str())))
            .collect();
        // A parked node is no node until its kubelet is back: its server
        // is off and free, as if the node had been deleted.
        let nodes = self.nodes.values().filter(|n| parking(n) != Parking::Parked);
        identity::link(nodes.map(|n| node_says_with(n, |ns, host| hosts.get(&(ns, host)).copied())), &inventory)
    }

    /// The node registered for a server, if any, and nothing contradicts
    /// it: by providerID, label or system UUID.
    pub fn node_of_server(&self, server: &str) -> Option<&Node> {
        self.links().node_of(server).and_then(|n| self.nodes.get(n)).map(Box::as_ref)
    }

    /// The claim that holds a node through its server, if any.
    fn claim_of_server(&self) -> HashMap<&str, &ServerClaim> {
        self.claims.values().filter(|c| c.status.as_ref().is_none_or(|s| s.failure_reason.is_none())).map(|c| (c.spec.server.as_str(), c)).collect()
    }

    /// The pods the core will plan for, by key: pending, or waiting for an
    /// in-place resize ([`ironclaim_core::Pod::is_demand`]).
    pub fn pending_pod_keys(&self) -> impl Iterator<Item = &String> {
        self.demand.iter().chain(self.gang_pods.keys())
    }

    /// The world as the core sees it at `now_s`.
    ///
    /// # Guarantees
    /// - A server that failed a claim counts as [`Health::Failed`] until its
    ///   backoff has passed since the failure.
    /// - A node whose claim has not yet passed its pool's readiness gates is
    ///   not ready, so pods wait for the claim rather than count as placed.
    /// - Objects that cannot be converted are left out and reported.
    /// - `arrivals` holds the fresh demand of live claims within the
    ///   longest adaptive warm-floor window (eight days with a daily
    ///   profile) or consolidation quiet time, and the history the ServerPools'
    ///   statuses keep of claims gone since.
    pub fn snapshot(&self, now_s: Seconds, backoff: FailureBackoff) -> (Snapshot, Vec<Problem>) {
        let mut problems = Vec::new();
        let mut snap = Snapshot {
            pods: self.pods.values().map(|e| e.pod.clone()).chain(self.gang_pods.values().cloned()).collect(),
            namespaces: self.namespaces.iter().map(|(name, ns)| (name.clone(), ns.metadata.labels.clone().unwrap_or_default().into())).collect(),
            ..Snapshot::default()
        };
        for (k, bad) in &self.bad_pods {
            problems.push(Problem { object: format!("Pod {k}"), error: bad.error.clone() });
            // Unread, a bound pod still runs: it stays on its node as a pod
            // nothing may evict, so the node never looks empty or drainable.
            // Pending, it is left out (the problem says why it waits).
            if let Some(node) = &bad.node
                && !bad.finished
            {
                let (namespace, name) = k.split_once('/').unwrap_or(("default", k));
                let mut holder = core::Pod::new(namespace, name, ironclaim_core::Resources::default());
                holder.node_name = Some(node.clone());
                holder.phase = core::PodPhase::Running;
                holder.do_not_disrupt = true;
                snap.pods.push(holder);
            }
        }
        let claims = self.claim_of_server();
        let links = self.links();
        snap.nodes.reserve_exact(self.nodes.len());
        for node in self.nodes.values().filter(|n| parking(n) != Parking::Parked) {
            match node_from_k8s(node) {
                Ok(mut n) => {
                    // Booted again, not yet brought back (its parking marks
                    // and cordon still on): no drain starts on it until
                    // they are cleared.
                    if parking(node) != Parking::No {
                        n.do_not_disrupt = true;
                    }
                    // Only a link nothing contradicts: a node in doubt is
                    // no server's, so nothing drains it to power one off.
                    n.server = links.server_of(&n.name).map(str::to_string);
                    if let Some(claim) = n.server.as_deref().and_then(|s| claims.get(s))
                        && !gates::claim_passed_gates(claim)
                    {
                        n.ready = false;
                    }
                    snap.nodes.push(n);
                }
                Err(err) => problems.push(Problem { object: format!("Node {}", node.name_any()), error: err.to_string() }),
            }
        }
        for (k, ds) in &self.daemonsets {
            let (namespace, name) = k.split_once('/').unwrap_or(("default", k));
            match pod_from_template(&ds.spec.template, namespace, name, "spec.template") {
                Ok(mut template) => {
                    template.owner = Some(core::Owner { kind: "DaemonSet".into(), name: name.to_string() });
                    template.workload = Some(name.to_string());
                    snap.daemonsets.push(core::DaemonSet { namespace: namespace.to_string(), name: name.to_string(), template });
                }
                Err(err) => problems.push(Problem { object: format!("DaemonSet {k}"), error: err.to_string() }),
            }
        }
        let pod_health: Vec<(&core::Pod, bool)> = snap.pods.iter().map(|p| (p, p.phase == core::PodPhase::Running && !p.terminating)).collect();
        for (k, pdb) in &self.pdbs {
            match pdb_from_k8s(pdb, &pod_health) {
                Ok(Some(p)) => snap.pdbs.push(p),
                Ok(None) => {}
                Err(err) => problems.push(Problem { object: format!("PodDisruptionBudget {k}"), error: err.to_string() }),
            }
        }
        for pool in self.pools.values() {
            match serverpool_to_core(pool) {
                Ok(p) => snap.pools.push(p),
                Err(err) => problems.push(Problem { object: format!("ServerPool {}", pool.name_any()), error: err.to_string() }),
            }
        }
        for server in self.servers.values() {
            match server_to_core(server) {
                Ok(mut s) => {
                    if s.health == Health::Healthy && backoff.waiting(s.failures, last_failure_s(server), now_s) {
                        s.health = Health::Failed;
                    }
                    // Locked but not yet written: taken all the same.
                    if s.claim.is_none()
                        && let Some(lock) = self.locks.get(&s.name)
                    {
                        s.claim = Some(lock.holder.clone());
                    }
                    let linked = links.node_of(&s.name);
                    if s.node.is_none() {
                        s.node = linked.map(str::to_string);
                    }
                    s.health = identity::health(s.health, links.mismatch(&s.name).is_some(), power_facts(server, linked.is_some()));
                    snap.servers.push(s);
                }
                Err(err) => problems.push(Problem { object: format!("Server {}", server.name_any()), error: err.to_string() }),
            }
        }
        for claim in self.claims.values() {
            match serverclaim_in_flight(claim) {
                Ok(Some(c)) => snap.claims.push(c),
                Ok(None) => {}
                Err(err) => problems.push(Problem { object: format!("ServerClaim {}", claim.name_any()), error: err.to_string() }),
            }
        }
        let mut arrivals = self.recent_arrivals(&snap.pools, now_s);
        if !arrivals.is_empty() || snap.pools.iter().any(|p| p.warm.adaptive.as_ref().is_some_and(|a| a.history_days > 0)) {
            // The history the pools' statuses keep, from claims gone since.
            arrivals.extend(self.pools.values().flat_map(|p| crate::pools::arrivals_of(p.status.as_ref())).filter(|a| a.at_s <= now_s));
            arrivals.sort_by(|a, b| a.at_s.cmp(&b.at_s).then(a.server.cmp(&b.server)));
            arrivals.dedup_by(|a, b| a.at_s == b.at_s && a.server == b.server);
        }
        snap.arrivals = arrivals;
        ironclaim_core::buffer::apply(&mut snap, &self.buffer_rooms);
        (snap, problems)
    }

    /// Fresh demand for adaptive warm floors and consolidation's quiet time
    /// after growth: per live claim, the earliest pod it was opened for
    /// that was created within the longest adaptive window or quiet time
    /// (pending or bound alike), as an arrival on the claim's
    /// server; for a spare's claim (one of no pods), the earliest workload
    /// pod on its node, the demand it was kept for. A pod that landed on
    /// other capacity already there opened nothing and is not counted.
    ///
    /// # Assumptions
    /// Claims are deleted once their server is released: demand whose
    /// servers have gone off again is seen only through the history the
    /// leader keeps on each ServerPool's status (`status.arrivals`).
    fn recent_arrivals(&self, pools: &[core::ServerPool], now_s: Seconds) -> Vec<core::Arrival> {
        // A pool with a daily profile looks back days, not just its window;
        // every pool looks back as far as its consolidation waits after
        // growth.
        let Some(window_s) = pools
            .iter()
            .map(|p| p.warm.adaptive.as_ref().map_or(0, core::AdaptiveFloor::history_s).max(ironclaim_core::disruption::growth_quiet_s(p)))
            .max()
        else {
            return Vec::new();
        };
        let horizon = now_s.saturating_sub(window_s);
        let mut arrivals = Vec::new();
        for claim in self.claims.values() {
            if claim.status.as_ref().is_some_and(|s| s.failure_reason.is_some()) {
                continue;
            }
            let first = claim
                .spec
                .pods
                .iter()
                .filter_map(|r| {
                    let e = self.pods.get(&format!("{}/{}", r.namespace, r.name))?;
                    // A pod recreated under the same name is not the one the claim was for.
                    (r.uid.is_none() || e.pod.uid.is_none() || r.uid == e.pod.uid).then_some(e)
                })
                .filter(|e| e.pod.created_s >= horizon && e.pod.created_s <= now_s)
                .min_by_key(|e| (e.pod.created_s, e.pod.key()));
            let node = claim.status.as_ref().and_then(|s| s.node_name.as_deref()).filter(|_| claim.spec.pods.is_empty());
            let first = first.or_else(|| {
                self.pods
                    .values()
                    .filter(|e| node.is_some() && e.pod.node_name.as_deref() == node && !e.pod.is_daemonset_pod())
                    .filter(|e| e.pod.created_s >= horizon && e.pod.created_s <= now_s)
                    .min_by_key(|e| (e.pod.created_s, e.pod.key()))
            });
            if let Some(e) = first {
                arrivals.push(core::Arrival { at_s: e.pod.created_s, server: claim.spec.server.clone(), deadline_s: e.pod.deadline_s });
            }
        }
        arrivals.sort_by(|a, b| a.at_s.cmp(&b.at_s).then(a.server.cmp(&b.server)));
        arrivals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A pool with an adaptive floor over `adaptive`, without a daily profile.
    /// A pool whose consolidation waits 30 minutes after growth, so that
    /// the adaptive window is the longest look back.
    fn pool(adaptive: Option<&str>) -> ServerPool {
        let warm = adaptive.map(|w| json!({"adaptive": {"window": w, "historyDays": 0}}));
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": "general"},
            "spec": {"warmSpares": warm, "disruption": {"consolidateAfter": "30m"}}
        }))
        .expect("serverpool")
    }

    fn pod(name: &str, created: &str, node: Option<&str>) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "app", "uid": format!("uid-{name}"), "creationTimestamp": created,
                         "annotations": {"ironclaim.dev/deadline": "2m"}},
            "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"cpu": "1"}}}]},
            "status": {"phase": if node.is_some() { "Running" } else { "Pending" }}
        }))
        .expect("pod")
    }

    /// The index keeps a Node without the images its kubelet lists.
    #[test]
    fn a_node_is_kept_without_its_images() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1"},
            "status": {"images": [{"names": ["registry.invalid/app@sha256:0123", "registry.invalid/app:1"], "sizeBytes": 1234567}],
                       "capacity": {"cpu": "8"}}
        }))
        .expect("node");
        let mut index = Index::default();
        index.apply(node.clone());
        let status = index.nodes["n1"].status.clone().expect("status");
        assert_eq!((status.images, status.capacity.map(|c| c.len())), (None, Some(1)));
        node.status.as_mut().expect("status").images = None;
        assert_eq!(*index.nodes["n1"], node, "nothing else is dropped");
    }

    /// Pods of one template keep one shape between them; a pod that differs
    /// keeps its own.
    #[test]
    fn pods_of_one_template_share_one_shape() {
        let mut index = Index::default();
        index.apply(pod("a", NOW, Some("n1")));
        index.apply(pod("b", NOW, Some("n2")));
        let mut other = pod("c", NOW, Some("n1"));
        other.metadata.annotations = None;
        index.apply(other);
        let shape = |name: &str| index.pods[&format!("app/{name}")].pod.shape.clone();
        assert!(shape("a").same(&shape("b")));
        assert!(!shape("a").same(&shape("c")), "c has no deadline");
        assert_eq!(index.pods["app/b"].pod.node_name.as_deref(), Some("n2"));
        assert_eq!(index.pods["app/b"].pod.uid.as_deref(), Some("uid-b"));
    }

    fn claim(name: &str, server: &str, pods: &[&str], failed: bool) -> ServerClaim {
        let refs: Vec<_> = pods.iter().map(|p| json!({"namespace": "app", "name": p, "uid": format!("uid-{p}")})).collect();
        let status = if failed { json!({"failureReason": "RegistrationTimedOut"}) } else { json!({"stage": "Booting"}) };
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": name},
            "spec": {"server": server, "pool": "general", "pods": refs},
            "status": status
        }))
        .expect("serverclaim")
    }

    const NOW: &str = "2026-01-05T12:00:00Z";
    const NOW_S: Seconds = 1_767_614_400;

    /// One change a watch can bring to pod `name`.
    #[derive(Clone, Debug)]
    enum PodChange {
        /// Created or updated: pending (no node) or bound, maybe being
        /// deleted, or unreadable (a request no quantity parses).
        Apply {
            name: u8,
            node: bool,
            terminating: bool,
            unreadable: bool,
        },
        Delete {
            name: u8,
        },
        /// A relist that finds these.
        Relist(Vec<(u8, bool)>),
    }

    fn watched_pod(name: u8, node: bool, terminating: bool, unreadable: bool) -> Pod {
        let mut p = pod(&format!("p{name}"), NOW, node.then_some("n1"));
        if terminating {
            p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(NOW.parse().expect("time")));
        }
        if unreadable {
            let c = &mut p.spec.as_mut().expect("spec").containers[0];
            c.resources
                .as_mut()
                .expect("resources")
                .requests
                .as_mut()
                .expect("requests")
                .insert("cpu".into(), k8s_openapi::apimachinery::pkg::api::resource::Quantity("lots".into()));
        }
        p
    }

    fn pod_change() -> impl proptest::strategy::Strategy<Value = PodChange> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0u8..12, any::<bool>(), proptest::bool::weighted(0.2), proptest::bool::weighted(0.1))
                .prop_map(|(name, node, terminating, unreadable)| PodChange::Apply { name, node, terminating, unreadable }),
            2 => (0u8..12).prop_map(|name| PodChange::Delete { name }),
            1 => proptest::collection::vec((0u8..12, any::<bool>()), 0..8).prop_map(PodChange::Relist),
        ]
    }

    /// A size `/proc/self/status` gives in KiB (`VmRSS`, `VmHWM`).
    fn status_kib(field: &str) -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':')).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap_or(0)
    }

    fn rss_kib() -> u64 {
        status_kib("VmRSS")
    }

    /// What 150,000 bound pods cost in the index and in one snapshot, as
    /// the fleet-scale test's pods are (docs/bench.md): run with
    /// `cargo test --release -p ironclaim-controller --lib -- --ignored
    /// --nocapture the_memory_of_150000_pods`.
    #[test]
    #[ignore = "a measurement, printed"]
    fn the_memory_of_150000_pods() {
        let bulk = |n: usize, k: usize| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": format!("bulk-srv-{n:05}-{k:02}"), "namespace": "scale", "uid": "0f6f8a1e-2b3c-4d5e-8f90-123456789abc",
                             "labels": {"app": "bulk"}, "creationTimestamp": NOW, "resourceVersion": "123456"},
                "spec": {"nodeName": format!("srv-{n:05}"),
                         "containers": [{"name": "c", "image": "registry.invalid/app", "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}],
                         "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                                         {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}]},
                "status": {"phase": "Running"}
            }))
            .expect("pod")
        };
        let all = || (0..5000).flat_map(|n| (0..30).map(move |k| (n, k)));
        let before = rss_kib();
        let mut index = Index::default();
        for (n, k) in all() {
            index.apply(bulk(n, k));
        }
        let indexed = rss_kib().saturating_sub(before);
        let snapshot = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 3600 });
        let both = rss_kib().saturating_sub(before);
        println!(
            "150,000 pods: index {} MiB, with one snapshot {} MiB; core::Pod {} bytes inline, PodEntry {}",
            indexed / 1024,
            both / 1024,
            std::mem::size_of::<core::Pod>(),
            std::mem::size_of::<PodEntry>()
        );
        assert_eq!(snapshot.0.pods.len(), 150_000);
        drop(snapshot);

        // A relist of them all, as a watch brings it after losing its
        // place: how far above its resident size it takes the process, as
        // the watch does it (each pod in as it arrives) and held whole
        // until its end (as the watch did before).
        let peak_above = |relist: &mut dyn FnMut(&mut Index), index: &mut Index| {
            let _ = std::fs::write("/proc/self/clear_refs", "5");
            let base = rss_kib();
            relist(index);
            status_kib("VmHWM").saturating_sub(base) / 1024
        };
        let streamed = peak_above(
            &mut |index| {
                let mut relist = <Pod as Indexed>::Relist::default();
                for (n, k) in all() {
                    index.relist_add::<Pod>(&mut relist, bulk(n, k).listed());
                }
                index.relist_done::<Pod>(relist);
            },
            &mut index,
        );
        let whole = peak_above(&mut |index| index.reset::<Pod>(all().map(|(n, k)| bulk(n, k).listed()).collect()), &mut index);
        println!("a relist of them: {streamed} MiB above the index as they arrive, {whole} MiB held whole until its end");
        assert_eq!(index.pods.len(), 150_000);
    }

    #[test]
    fn a_relist_of_pods_goes_in_as_it_arrives_and_drops_what_it_did_not_bring_at_its_end() {
        let mut index = Index::default();
        for name in 0..3 {
            index.apply(watched_pod(name, name != 0, false, false));
        }
        let mut relist = <Pod as Indexed>::Relist::default();
        index.relist_add::<Pod>(&mut relist, watched_pod(1, false, false, false).listed());
        index.relist_add::<Pod>(&mut relist, watched_pod(7, false, false, false).listed());
        // Under way: what it brought is in, what it has not brought yet stays.
        let keys = |index: &Index| index.pods.keys().cloned().collect::<Vec<_>>();
        assert_eq!(keys(&index), ["app/p0", "app/p1", "app/p2", "app/p7"]);
        assert!(index.pending_pod_keys().any(|k| k == "app/p1"), "p1 is pending now");
        index.relist_done::<Pod>(relist);
        assert_eq!(keys(&index), ["app/p1", "app/p7"]);
        let pending: Vec<&String> = index.pending_pod_keys().collect();
        assert_eq!(pending, ["app/p1", "app/p7"], "p0 left the demand with its pod");
    }

    proptest::proptest! {
        /// The pods a step plans for, read from the index's own record, are
        /// always those a walk of every pod finds, whatever the watch brought.
        #[test]
        fn the_demand_the_index_keeps_is_what_a_walk_of_every_pod_finds(changes in proptest::collection::vec(pod_change(), 1..60)) {
            let mut index = Index::default();
            for change in changes {
                match change {
                    PodChange::Apply { name, node, terminating, unreadable } => index.apply(watched_pod(name, node, terminating, unreadable)),
                    PodChange::Delete { name } => index.delete(&watched_pod(name, false, false, false)),
                    PodChange::Relist(pods) => {
                        index.reset::<Pod>(pods.into_iter().map(|(name, node)| watched_pod(name, node, false, false).listed()).collect())
                    }
                }
                let walked: Vec<&String> = index.pods.iter().filter(|(_, e)| e.pod.is_demand()).map(|(k, _)| k).collect();
                let kept: Vec<&String> = index.pending_pod_keys().collect();
                proptest::prop_assert_eq!(kept, walked);
                proptest::prop_assert!(index.pods.keys().all(|k| !index.bad_pods.contains_key(k)));
            }
        }
    }

    #[test]
    fn each_live_claim_is_one_arrival_at_its_earliest_pod_within_the_window() {
        let mut index = Index::default();
        index.apply(pool(Some("1h")));
        index.apply(pod("early", "2026-01-05T11:30:00Z", Some("s1")));
        index.apply(pod("late", "2026-01-05T11:40:00Z", None));
        index.apply(pod("old", "2026-01-05T10:00:00Z", Some("s2")));
        index.apply(pod("failed", "2026-01-05T11:50:00Z", None));
        index.apply(pod("no-claim", "2026-01-05T11:55:00Z", Some("s1")));
        index.apply(claim("c1", "s1", &["late", "early"], false));
        index.apply(claim("c2", "s2", &["old"], false));
        index.apply(claim("c3", "s3", &["failed"], true));
        let backoff = FailureBackoff { base_s: 60, max_s: 600 };
        let (snap, problems) = index.snapshot(NOW_S, backoff);
        assert!(problems.is_empty(), "{problems:?}");
        assert_eq!(NOW_S, NOW.parse::<jiff::Timestamp>().unwrap().as_second() as Seconds);
        assert_eq!(snap.arrivals, vec![core::Arrival { at_s: NOW_S - 1800, server: "s1".into(), deadline_s: Some(120) }]);

        // Without an adaptive pool, the look back is consolidation's quiet
        // time after growth: 30 minutes holds c1 alone...
        index.apply(pool(None));
        assert_eq!(index.snapshot(NOW_S, backoff).0.arrivals, vec![core::Arrival { at_s: NOW_S - 1800, server: "s1".into(), deadline_s: Some(120) }]);
        // ...and 4 hours, when consolidateAfter is unset, holds both claims.
        let mut plain = pool(None);
        plain.spec.disruption = None;
        index.apply(plain);
        let servers: Vec<String> = index.snapshot(NOW_S, backoff).0.arrivals.into_iter().map(|a| a.server).collect();
        assert_eq!(servers, ["s2", "s1"]);
    }

    #[test]
    fn a_spare_claim_arrives_with_the_first_workload_pod_on_its_node() {
        let mut index = Index::default();
        index.apply(pool(Some("1h")));
        let mut spare = claim("spare", "s4", &[], false);
        spare.status.as_mut().unwrap().node_name = Some("s4".into());
        index.apply(spare);
        let backoff = FailureBackoff { base_s: 60, max_s: 600 };
        assert!(index.snapshot(NOW_S, backoff).0.arrivals.is_empty(), "an empty spare is no demand");
        index.apply(pod("second", "2026-01-05T11:50:00Z", Some("s4")));
        index.apply(pod("first", "2026-01-05T11:45:00Z", Some("s4")));
        index.apply(pod("elsewhere", "2026-01-05T11:30:00Z", Some("s1")));
        let (snap, _) = index.snapshot(NOW_S, backoff);
        assert_eq!(snap.arrivals, vec![core::Arrival { at_s: NOW_S - 900, server: "s4".into(), deadline_s: Some(120) }]);
    }

    #[test]
    fn with_a_daily_profile_the_arrivals_reach_back_days_and_take_the_history_the_pool_keeps() {
        let mut index = Index::default();
        let mut general: ServerPool = serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerPool",
            "metadata": {"name": "general"},
            "spec": {"warmSpares": {"adaptive": {"window": "1h"}}},
            "status": {"arrivals": [
                {"at": NOW_S - 86_400, "server": "s9", "deadlineSeconds": 120},
                {"at": NOW_S - 7200, "server": "s2", "deadlineSeconds": 120}
            ]}
        }))
        .expect("serverpool");
        index.apply(general.clone());
        index.apply(pod("old", "2026-01-05T10:00:00Z", Some("s2")));
        index.apply(claim("c2", "s2", &["old"], false));
        let backoff = FailureBackoff { base_s: 60, max_s: 600 };
        let (snap, _) = index.snapshot(NOW_S, backoff);
        let arrival = |at_s, server: &str| core::Arrival { at_s, server: server.into(), deadline_s: Some(120) };
        assert_eq!(snap.arrivals, vec![arrival(NOW_S - 86_400, "s9"), arrival(NOW_S - 7200, "s2")], "the live claim's and the kept one are one");
        // With the claim gone (a restarted controller sees none), the pool's
        // history alone; without a daily profile, none of it.
        let mut restarted = Index::default();
        restarted.apply(general.clone());
        assert_eq!(restarted.snapshot(NOW_S, backoff).0.arrivals, snap.arrivals);
        general.spec.warm_spares.as_mut().and_then(|w| w.adaptive.as_mut()).expect("adaptive").history_days = Some(0);
        restarted.apply(general);
        assert!(restarted.snapshot(NOW_S, backoff).0.arrivals.is_empty());
    }

    #[test]
    fn a_bound_pod_that_cannot_be_read_still_holds_its_node_and_a_pending_one_is_only_reported() {
        let unreadable = |name: &str, node: Option<&str>, phase: &str| -> Pod {
            let mut p = pod(name, NOW, node);
            p.metadata.annotations = Some([("ironclaim.dev/deadline".to_string(), "soon".to_string())].into());
            p.status.as_mut().unwrap().phase = Some(phase.into());
            p
        };
        let mut index = Index::default();
        index.apply(unreadable("bound", Some("n1"), "Running"));
        index.apply(unreadable("waiting", None, "Pending"));
        index.apply(unreadable("done", Some("n2"), "Succeeded"));
        let (snap, problems) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        let reported: Vec<&str> = problems.iter().map(|p| p.object.as_str()).collect();
        assert_eq!(reported, ["Pod app/bound", "Pod app/done", "Pod app/waiting"]);
        assert!(problems.iter().all(|p| p.error.contains("deadline")), "{problems:?}");
        assert_eq!(snap.pods.len(), 1, "{:?}", snap.pods);
        let holder = &snap.pods[0];
        assert_eq!((holder.key().as_str(), holder.node_name.as_deref()), ("app/bound", Some("n1")));
        assert!(holder.do_not_disrupt && holder.occupies_node());

        // Read again once fixed: the real pod replaces the holder.
        index.apply(pod("bound", NOW, Some("n1")));
        let (snap, _) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        let bound = snap.pods.iter().find(|p| p.name == "bound").unwrap();
        assert!(!bound.do_not_disrupt && bound.requests.cpu_milli == 1000);
        assert_eq!(snap.pods.iter().filter(|p| p.name == "bound").count(), 1);
    }

    fn server(name: &str, uuid: Option<&str>, power: &str, ours: bool) -> Server {
        let identity = uuid.map(|u| json!({"systemUUID": u}));
        serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name},
            "spec": {"bmc": {"address": "https://10.0.0.1/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}},
                     "hardware": {"cpu": "16", "memory": "64Gi"}},
            "status": {"powerState": power, "poweredOnByIronclaim": ours, "identity": identity}
        }))
        .expect("server")
    }

    fn node(name: &str, server_label: Option<&str>, uuid: &str) -> Node {
        let labels = server_label.map(|s| json!({ "ironclaim.dev/server": s }));
        serde_json::from_value(json!({
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "nodeInfo": {"systemUUID": uuid, "machineID": "", "bootID": "", "kernelVersion": "", "osImage": "",
                                    "containerRuntimeVersion": "", "kubeletVersion": "", "kubeProxyVersion": "",
                                    "operatingSystem": "linux", "architecture": "amd64"}}
        }))
        .expect("node")
    }

    fn planned_power_offs(index: &Index) -> Vec<String> {
        let (mut snap, problems) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        assert!(problems.is_empty(), "{problems:?}");
        snap.pools.push(core::ServerPool::new("general"));
        // Idle for a day: past any break-even.
        snap.servers.iter_mut().for_each(|s| s.idle_since_s = Some(NOW_S - 86_400));
        ironclaim_core::disruption::disrupt(&snap, NOW_S)
            .actions
            .iter()
            .filter_map(|a| match a {
                ironclaim_core::disruption::Action::PowerOff { server, .. } => Some(server.clone()),
                _ => None,
            })
            .collect()
    }

    const UUID_A: &str = "4c4c4544-0041-1010-8000-b1c04f000001";
    const UUID_B: &str = "4c4c4544-0042-1010-8000-b1c04f000002";

    #[test]
    fn hole_1_a_running_worker_ironclaim_cannot_link_is_never_powered_off_as_an_idle_spare() {
        let mut index = Index::default();
        // An existing worker listed as a Server: on, not powered on by
        // ironclaim, its Node carrying no ironclaim label.
        index.apply(server("worker-1", None, "On", false));
        index.apply(node("w1.example", None, UUID_A));
        index.apply(pod("app", NOW, Some("w1.example")));
        // A spare ironclaim powered on itself, with nothing on it.
        index.apply(server("spare-1", Some(UUID_B), "On", true));
        assert_eq!(planned_power_offs(&index), ["spare-1"], "the worker is unadopted: what runs on it is unknown");
        let (snap, _) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        let worker = snap.servers.iter().find(|s| s.name == "worker-1").unwrap();
        assert_eq!(worker.health, Health::Unadopted);

        // Once its identity is read, the Node links to it by system UUID:
        // a node with a pod, not a spare.
        index.apply(server("worker-1", Some(UUID_A), "On", false));
        let (snap, _) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        let worker = snap.servers.iter().find(|s| s.name == "worker-1").unwrap();
        assert_eq!((worker.node.as_deref(), worker.health), (Some("w1.example"), Health::Healthy));
        assert_eq!(planned_power_offs(&index), ["spare-1"]);
    }

    /// A parked node is no node until its kubelet reports from a new boot:
    /// its server is off and free, and a Ready condition left over from
    /// before the power-off does not bring it back.
    #[test]
    fn a_parked_node_counts_as_none_until_its_kubelet_is_back_from_a_new_boot() {
        let mut index = Index::default();
        index.apply(server("a", Some(UUID_A), "Off", true));
        let mut n = node("na", Some("a"), UUID_A);
        n.status.as_mut().unwrap().node_info.as_mut().unwrap().boot_id = "boot-1".into();
        n.metadata.annotations = Some(
            [(ironclaim_k8s::node::PARKED_AT_ANNOTATION, "2026-01-05T12:00:00Z"), (ironclaim_k8s::node::PARKED_BOOT_ID_ANNOTATION, "boot-1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        index.apply(n.clone());
        let seen = |index: &Index| {
            let (snap, problems) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
            assert!(problems.is_empty(), "{problems:?}");
            let server = snap.servers.iter().find(|s| s.name == "a").unwrap().node.clone();
            (server, snap.nodes.iter().map(|n| n.name.clone()).collect::<Vec<_>>(), index.node_of_server("a").is_some())
        };
        assert_eq!(seen(&index), (None, vec![], false), "parked, still showing Ready from before the power-off");
        // A new boot not Ready yet: its machine runs, so it is a node again
        // (nothing that runs is hidden), not yet brought back.
        n.status.as_mut().unwrap().node_info.as_mut().unwrap().boot_id = "boot-2".into();
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "Unknown".into();
        index.apply(n.clone());
        assert_eq!(seen(&index), (Some("na".into()), vec!["na".to_string()], true));
        assert!(crate::scaledown::parking::back(&index.nodes).is_empty());
        // Ready from the new boot: a node again.
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].status = "True".into();
        index.apply(n.clone());
        assert_eq!(seen(&index), (Some("na".into()), vec!["na".to_string()], true));
        assert_eq!(crate::scaledown::parking::back(&index.nodes), ["na"]);
    }

    #[test]
    fn hole_2_a_node_that_names_one_server_and_runs_on_another_puts_both_in_doubt() {
        let mut index = Index::default();
        index.apply(server("a", Some(UUID_A), "On", true));
        index.apply(server("b", Some(UUID_B), "On", true));
        // A cloned image: the node on machine b says it is server a.
        index.apply(node("n", Some("a"), UUID_B));
        let (snap, _) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        let health: Vec<(&str, Health)> = snap.servers.iter().map(|s| (s.name.as_str(), s.health)).collect();
        assert_eq!(health, [("a", Health::IdentityMismatch), ("b", Health::IdentityMismatch)]);
        assert_eq!(snap.nodes[0].server, None, "a node in doubt is no server's: nothing drains it to power one off");
        assert!(planned_power_offs(&index).is_empty());

        // A stale node of a reinstall beside the live one: the server is in doubt.
        let mut index = Index::default();
        index.apply(server("a", Some(UUID_A), "On", true));
        index.apply(node("a-old", Some("a"), UUID_A));
        index.apply(node("a", Some("a"), UUID_A));
        let (snap, _) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        assert_eq!(snap.servers[0].health, Health::IdentityMismatch);
        assert!(snap.nodes.iter().all(|n| n.server.is_none()));
        assert!(planned_power_offs(&index).is_empty());
    }

    #[test]
    fn a_cluster_api_metal3_node_links_to_the_server_of_its_baremetalhost_by_provider_id() {
        assert_eq!(metal3_host_of("metal3://hosts/bmh-1/m3m-x"), Some(("hosts", "bmh-1")));
        assert_eq!(metal3_host_of("metal3://4f2a"), None, "the older uid form names no host");
        let mut index = Index::default();
        let server: Server = serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": "m1"},
            "spec": {"provider": {"type": "Metal3", "metal3": {"namespace": "hosts", "name": "bmh-1"}}, "hardware": {"cpu": "16", "memory": "64Gi"}},
            "status": {"powerState": "On"}
        }))
        .expect("server");
        index.apply(server);
        let mut n = node("w-7", None, "");
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec { provider_id: Some("metal3://hosts/bmh-1/m3m-x".into()), ..Default::default() });
        index.apply(n);
        let (snap, _) = index.snapshot(NOW_S, FailureBackoff { base_s: 60, max_s: 600 });
        assert_eq!((snap.servers[0].node.as_deref(), snap.servers[0].health), (Some("w-7"), Health::Healthy), "linked, so adopted");
        assert_eq!(snap.nodes[0].server.as_deref(), Some("m1"));
    }

    fn ledger(name: &str, locks: &[(&str, &str)]) -> ConfigMap {
        let data: BTreeMap<String, String> =
            locks.iter().map(|(server, holder)| (server.to_string(), json!({"holder": holder}).to_string())).collect();
        ConfigMap { metadata: kube::api::ObjectMeta { name: Some(name.into()), ..Default::default() }, data: Some(data), ..Default::default() }
    }

    fn holders(index: &Index) -> Vec<(&str, &str)> {
        index.locks.iter().map(|(s, l)| (s.as_str(), l.holder.as_str())).collect()
    }

    #[test]
    fn the_locks_come_from_every_shard_and_the_legacy_ledger_a_shards_first() {
        let (a, b) = ("r1-u01", "r1-u02");
        assert_ne!(locks::ledger_of(a), locks::ledger_of(b), "the test needs two shards");
        let mut index = Index::default();
        index.reset::<ConfigMap>(vec![ledger(&locks::ledger_of(a), &[(a, "c-a")]), ledger(LEGACY_LEDGER_NAME, &[(a, "c-old"), (b, "c-old")])]);
        assert_eq!(holders(&index), [(a, "c-a"), (b, "c-old")]);
        index.apply(ledger(&locks::ledger_of(b), &[(b, "c-b")]));
        assert_eq!(holders(&index), [(a, "c-a"), (b, "c-b")]);
        index.apply(ledger(&locks::ledger_of(a), &[]));
        assert_eq!(holders(&index), [(a, "c-old"), (b, "c-b")], "a given up in its shard: the legacy lock still holds it");
        index.apply(ledger(LEGACY_LEDGER_NAME, &[(b, "c-old")]));
        assert_eq!(holders(&index), [(b, "c-b")]);
        index.delete(&ledger(&locks::ledger_of(b), &[]));
        assert_eq!(holders(&index), [(b, "c-old")]);
        index.apply(ledger("some-configmap", &[(a, "x")]));
        assert_eq!(holders(&index), [(b, "c-old")], "not a ledger");
        assert_eq!(index.ledgers.keys().map(String::as_str).collect::<Vec<_>>(), [LEGACY_LEDGER_NAME, locks::ledger_of(a).as_str()]);
        assert_eq!(index.ledgers[LEGACY_LEDGER_NAME].bytes, b.len() + json!({"holder": "c-old"}).to_string().len());
    }
}
