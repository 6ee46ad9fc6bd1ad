//! Inter-pod constraints: required pod affinity and anti-affinity (both
//! directions) and topology spread, counted per topology domain, as
//! kube-scheduler's InterPodAffinity and PodTopologySpread filters count
//! them (`pkg/scheduler/framework/plugins/{interpodaffinity,podtopologyspread}`).
//!
//! Every distinct term (namespaces, selectors, topology key) gets an id.
//! For affinity terms the index keeps, per term and domain, how many placed
//! pods match it, and where pods owning an anti-affinity term sit; for
//! spread terms it keeps the count per slot (node or claim), because which
//! nodes a spread constraint counts depends on the pod that asks (see
//! [`SpreadTerm`]). Placing a pod updates the counts in O(terms it
//! matches), so a check is a few array reads.
//!
//! # The rules, as kube-scheduler v1.37 applies them
//! - A pod's required affinity terms are satisfied by pods that match
//!   *all* of them: each term then needs such a pod in the node's domain
//!   of its key. The first pod of a self-affine group may go to any node
//!   with every key, when no pod anywhere matches all terms.
//! - An anti-affinity term is broken by a pod matching that one term.
//! - A term's namespaces are those it lists and those its
//!   `namespaceSelector` selects (`{}`: all); with neither, the pod's own.
//! - Spread counts pods of the pod's own namespace, not terminating, on the
//!   nodes that have every key of the pod's constraints and pass its
//!   inclusion policies; an empty selector (`{}`) counts none.
//! - Pods count wherever they run: NotReady, cordoned and tainted nodes too.

use crate::labels::{LabelSelector, Labels};
use crate::model::{InclusionPolicy, Pod, PodAffinityTerm, TopologySpread, WhenUnsatisfiable};
use foldhash::HashMap;
use std::collections::BTreeMap;

/// A domain value interned per topology key, e.g. "zone-a" for the zone key.
pub type DomainId = u32;

/// One (namespaces, selector) pair a pod must match.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Conjunct {
    /// Sorted and deduplicated.
    namespaces: Vec<String>,
    namespace_selector: Option<LabelSelector>,
    selector: Option<LabelSelector>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    /// Counted per domain, on every node.
    Affinity,
    /// Counted per slot; terminating pods and empty selectors count none.
    Spread,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TermSpec {
    kind: Kind,
    /// A pod matches when it matches every conjunct: one for an
    /// anti-affinity or spread term, all of the owner's affinity terms for
    /// an affinity term.
    conjuncts: Vec<Conjunct>,
    key: usize,
}

#[derive(Default)]
pub struct TopologyIndex {
    keys: Vec<String>,
    key_ids: HashMap<String, usize>,
    domains: HashMap<String, DomainId>,
    domain_names: Vec<String>,
    namespace_labels: BTreeMap<String, Labels>,
    terms: Vec<TermSpec>,
    term_ids: HashMap<TermSpec, usize>,
    /// counts[term][domain]: placed pods matching an affinity term there.
    counts: Vec<Vec<u32>>,
    /// Placed pods matching an affinity term on a node with its key.
    totals: Vec<u32>,
    /// anti_owners[term][domain]: placed pods owning this anti-affinity term.
    anti_owners: Vec<Vec<u32>>,
    /// slot_counts[term][slot]: placed pods counted by a spread term.
    slot_counts: Vec<Vec<u32>>,
    /// The terms a pod can match, found from its labels: see [`Anchors`].
    anchors: Anchors,
}

/// Terms by a label a pod must carry to match them: the first conjunct's
/// first `matchLabels` pair, else its first `In` expression (a term with
/// several values is under each). A term with neither (an empty selector,
/// `Exists`, `NotIn`, ...) is `loose`: every pod is checked against it.
/// So a pod is checked only against the terms under one of its own labels,
/// and the loose ones, not against every term.
#[derive(Default)]
struct Anchors {
    /// label key, then value: the terms anchored there.
    by_label: HashMap<String, HashMap<String, Vec<usize>>>,
    loose: Vec<usize>,
    /// Terms `0..indexed` are in the index.
    indexed: usize,
}

/// The terms one kind of pod carries, resolved to ids.
#[derive(Clone, Debug, Default)]
pub struct PodTerms {
    pub affinity: Vec<usize>,
    pub anti_affinity: Vec<usize>,
    pub spread: Vec<SpreadTerm>,
    /// Terms whose selector matches this pod: counted when it is placed.
    pub matched_by: Vec<usize>,
    /// Anti-affinity terms of other pods that this pod matches.
    pub repelled_by: Vec<usize>,
    /// The pod matches all of its own affinity terms (the first pod of such
    /// a group may go anywhere).
    pub self_affine: bool,
}

/// A DoNotSchedule spread constraint of a pod.
#[derive(Clone, Copy, Debug)]
pub struct SpreadTerm {
    pub term: usize,
    pub max_skew: u32,
    pub min_domains: u32,
    /// The pod's own labels match the selector (an empty selector too).
    pub self_match: bool,
    /// The pod is counted once placed (its namespace, a non-empty selector).
    pub counts_self: bool,
    pub node_affinity_policy: InclusionPolicy,
    pub node_taints_policy: InclusionPolicy,
}

/// Per spread term of a pod, the matching pods per domain over the nodes
/// that term counts: `counts[i][domain]`.
pub type SpreadCounts = Vec<Vec<u32>>;

/// Which inter-pod constraint failed, for reasons and for the scheduler's
/// bookkeeping (affinity and spread can become satisfiable later; the
/// others cannot). `key` is the topology key's id in its index, which
/// [`TopologyIndex::describe`] names: the scheduler's hot path meets
/// mismatches by the million and reads few of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TopologyMismatch {
    AntiAffinity {
        key: usize,
    },
    RepelledByExisting {
        key: usize,
    },
    Affinity {
        key: usize,
    },
    /// `index` is the position of the failing term in `PodTerms::spread`.
    Spread {
        key: usize,
        max_skew: u32,
        index: usize,
    },
    MissingTopologyKey {
        key: usize,
    },
}

impl TopologyMismatch {
    /// Adding pods can only make these worse.
    pub fn is_permanent(&self) -> bool {
        matches!(self, TopologyMismatch::AntiAffinity { .. } | TopologyMismatch::RepelledByExisting { .. })
    }
}

fn conjunct(term: &PodAffinityTerm, own: &str) -> Conjunct {
    let mut namespaces = term.namespaces.clone();
    if namespaces.is_empty() && term.namespace_selector.is_none() {
        namespaces.push(own.to_string());
    }
    namespaces.sort();
    namespaces.dedup();
    Conjunct { namespaces, namespace_selector: term.namespace_selector.clone(), selector: term.label_selector.clone() }
}

fn is_empty(selector: &LabelSelector) -> bool {
    selector.match_labels.is_empty() && selector.match_expressions.is_empty()
}

impl TopologyIndex {
    pub fn key_id(&mut self, key: &str) -> usize {
        if let Some(&id) = self.key_ids.get(key) {
            return id;
        }
        self.keys.push(key.into());
        self.key_ids.insert(key.to_string(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn domain_id(&mut self, value: &str) -> DomainId {
        if let Some(&id) = self.domains.get(value) {
            return id;
        }
        self.domain_names.push(value.to_string());
        let id = (self.domain_names.len() - 1) as DomainId;
        self.domains.insert(value.to_string(), id);
        id
    }

    /// How many domains there are: every id is below it.
    pub fn domain_count(&self) -> usize {
        self.domain_names.len()
    }

    pub fn domain_name(&self, id: DomainId) -> &str {
        &self.domain_names[id as usize]
    }

    /// The domain of a node with these labels, for every known key.
    pub fn domains_of(&mut self, labels: &Labels) -> Vec<Option<DomainId>> {
        let mut domains = Vec::with_capacity(self.keys.len());
        for k in 0..self.keys.len() {
            let value = labels.get(&self.keys[k]);
            domains.push(value.map(|v| self.domain_id(v)));
        }
        domains
    }

    /// Namespace labels, for `namespaceSelector`; set before `register`.
    pub fn set_namespaces(&mut self, namespaces: &BTreeMap<String, Labels>) {
        self.namespace_labels = namespaces.clone();
    }

    fn term_id(&mut self, spec: TermSpec) -> usize {
        if let Some(&id) = self.term_ids.get(&spec) {
            return id;
        }
        self.terms.push(spec.clone());
        self.term_ids.insert(spec, self.terms.len() - 1);
        self.counts.push(Vec::new());
        self.anti_owners.push(Vec::new());
        self.slot_counts.push(Vec::new());
        self.totals.push(0);
        self.terms.len() - 1
    }

    /// One id per affinity term of the pod, each needing a pod that matches
    /// all of the pod's affinity terms.
    fn affinity_terms(&mut self, pod: &Pod) -> Vec<usize> {
        let conjuncts: Vec<Conjunct> = pod.pod_affinity.iter().map(|t| conjunct(t, &pod.namespace)).collect();
        pod.pod_affinity
            .iter()
            .map(|t| {
                let key = self.key_id(&t.topology_key);
                self.term_id(TermSpec { kind: Kind::Affinity, conjuncts: conjuncts.clone(), key })
            })
            .collect()
    }

    fn anti_affinity_term(&mut self, term: &PodAffinityTerm, own_namespace: &str) -> usize {
        let key = self.key_id(&term.topology_key);
        self.term_id(TermSpec { kind: Kind::Affinity, conjuncts: vec![conjunct(term, own_namespace)], key })
    }

    fn spread_term(&mut self, spread: &TopologySpread, own_namespace: &str) -> usize {
        let key = self.key_id(&spread.topology_key);
        let c = Conjunct { namespaces: vec![own_namespace.to_string()], namespace_selector: None, selector: spread.label_selector.clone() };
        self.term_id(TermSpec { kind: Kind::Spread, conjuncts: vec![c], key })
    }

    /// Registers the terms a pod carries. Call for every pod before the
    /// first `resolve`, so that `matched_by` sees all terms.
    pub fn register(&mut self, pod: &Pod) {
        self.affinity_terms(pod);
        for t in &pod.pod_anti_affinity {
            self.anti_affinity_term(t, &pod.namespace);
        }
        for s in &pod.topology_spread {
            if s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule {
                self.spread_term(s, &pod.namespace);
            }
        }
    }

    fn conjunct_matches(&self, c: &Conjunct, pod: &Pod) -> bool {
        let in_namespace = c.namespaces.iter().any(|n| n == &pod.namespace)
            || c.namespace_selector.as_ref().is_some_and(|s| match self.namespace_labels.get(&pod.namespace) {
                Some(labels) => s.matches(labels),
                None => s.matches(&Labels::new()),
            });
        in_namespace && c.selector.as_ref().is_some_and(|s| s.matches(&pod.labels))
    }

    fn term_matches(&self, term: usize, pod: &Pod) -> bool {
        let spec = &self.terms[term];
        if spec.kind == Kind::Spread && spec.conjuncts.iter().any(|c| c.selector.as_ref().is_none_or(is_empty)) {
            return false;
        }
        spec.conjuncts.iter().all(|c| self.conjunct_matches(c, pod))
    }

    /// Resolves a pod's terms to ids and finds the terms it matches. Terms
    /// must all be registered first.
    pub fn resolve(&mut self, pod: &Pod, anti_terms_in_use: &[usize]) -> PodTerms {
        let affinity = self.affinity_terms(pod);
        let self_affine = affinity.first().is_some_and(|&t| self.terms[t].conjuncts.iter().all(|c| self.conjunct_matches(c, pod)));
        let anti_affinity = pod.pod_anti_affinity.iter().map(|t| self.anti_affinity_term(t, &pod.namespace)).collect();
        let spread = pod
            .topology_spread
            .iter()
            .filter(|s| s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule)
            .map(|s| {
                let term = self.spread_term(s, &pod.namespace);
                SpreadTerm {
                    term,
                    max_skew: s.max_skew.max(1),
                    min_domains: s.min_domains.unwrap_or(1),
                    self_match: s.label_selector.as_ref().is_some_and(|sel| sel.matches(&pod.labels)),
                    counts_self: self.term_matches(term, pod),
                    node_affinity_policy: s.node_affinity_policy,
                    node_taints_policy: s.node_taints_policy,
                }
            })
            .collect();
        let matched_by: Vec<usize> = self.candidate_terms(pod).into_iter().filter(|&t| self.term_matches(t, pod)).collect();
        let repelled_by = anti_terms_in_use.iter().copied().filter(|t| matched_by.binary_search(t).is_ok()).collect();
        PodTerms { affinity, anti_affinity, spread, matched_by, repelled_by, self_affine }
    }

    /// The terms `pod` may match, ascending: those anchored under one of
    /// its labels, and the loose ones. Indexes the terms registered since
    /// the last call first.
    fn candidate_terms(&mut self, pod: &Pod) -> Vec<usize> {
        for t in self.anchors.indexed..self.terms.len() {
            let selector = self.terms[t].conjuncts.first().and_then(|c| c.selector.as_ref());
            let anchored: Vec<(String, String)> = match selector {
                Some(sel) => match sel.match_labels.iter().next() {
                    Some((k, v)) => vec![(k.clone(), v.clone())],
                    None => sel
                        .match_expressions
                        .iter()
                        .find(|r| r.operator == crate::labels::Operator::In)
                        .map(|r| r.values.iter().map(|v| (r.key.clone(), v.clone())).collect())
                        .unwrap_or_default(),
                },
                None => Vec::new(),
            };
            if anchored.is_empty() {
                self.anchors.loose.push(t);
            }
            for (k, v) in anchored {
                let under = self.anchors.by_label.entry(k).or_default().entry(v).or_default();
                if under.last() != Some(&t) {
                    under.push(t);
                }
            }
        }
        self.anchors.indexed = self.terms.len();
        let mut candidates = self.anchors.loose.clone();
        for (k, v) in pod.labels.iter() {
            if let Some(under) = self.anchors.by_label.get(k.as_str()).and_then(|values| values.get(v.as_str())) {
                candidates.extend_from_slice(under);
            }
        }
        candidates.sort_unstable();
        candidates.dedup();
        candidates
    }

    pub fn key_of_term(&self, term: usize) -> usize {
        self.terms[term].key
    }

    pub fn count(&self, term: usize, domain: DomainId) -> u32 {
        self.counts[term].get(domain as usize).copied().unwrap_or(0)
    }

    /// Pods counted by spread term `term` on slot `slot`.
    pub fn slot_count(&self, term: usize, slot: usize) -> u32 {
        self.slot_counts[term].get(slot).copied().unwrap_or(0)
    }

    fn bump(table: &mut Vec<u32>, i: usize) {
        if table.len() <= i {
            table.resize(i + 1, 0);
        }
        table[i] += 1;
    }

    /// Records a pod placed on slot `slot`, a node whose domains (per key)
    /// are `domains`. A terminating pod counts for affinity, not for spread.
    pub fn place(&mut self, terms: &PodTerms, domains: &[Option<DomainId>], slot: usize, terminating: bool) {
        for &t in &terms.matched_by {
            match self.terms[t].kind {
                Kind::Affinity => {
                    if let Some(d) = domains[self.terms[t].key] {
                        Self::bump(&mut self.counts[t], d as usize);
                        self.totals[t] += 1;
                    }
                }
                Kind::Spread if !terminating => Self::bump(&mut self.slot_counts[t], slot),
                Kind::Spread => {}
            }
        }
        for &t in &terms.anti_affinity {
            if let Some(d) = domains[self.terms[t].key] {
                Self::bump(&mut self.anti_owners[t], d as usize);
            }
        }
    }

    /// Checks affinity and anti-affinity (both directions) for a node in
    /// `domains`, and spread against the pod's counts and minimums.
    pub fn check(&self, terms: &PodTerms, domains: &[Option<DomainId>], spread: &SpreadCounts, spread_min: &[u32]) -> Result<(), TopologyMismatch> {
        let key_of = |t: usize| self.terms[t].key;
        for &t in &terms.anti_affinity {
            if let Some(d) = domains[self.terms[t].key]
                && self.count(t, d) > 0
            {
                return Err(TopologyMismatch::AntiAffinity { key: key_of(t) });
            }
        }
        for &t in &terms.repelled_by {
            if let Some(d) = domains[self.terms[t].key]
                && self.anti_owners[t].get(d as usize).copied().unwrap_or(0) > 0
            {
                return Err(TopologyMismatch::RepelledByExisting { key: key_of(t) });
            }
        }
        let mut unmet = None;
        for &t in &terms.affinity {
            let Some(d) = domains[self.terms[t].key] else {
                return Err(TopologyMismatch::MissingTopologyKey { key: key_of(t) });
            };
            if unmet.is_none() && self.count(t, d) == 0 {
                unmet = Some(t);
            }
        }
        if let Some(t) = unmet {
            let first_of_its_kind = terms.self_affine && terms.affinity.iter().all(|&t| self.totals[t] == 0);
            if !first_of_its_kind {
                return Err(TopologyMismatch::Affinity { key: key_of(t) });
            }
        }
        for (index, (s, &min)) in terms.spread.iter().zip(spread_min).enumerate() {
            let Some(d) = domains[self.terms[s.term].key] else {
                return Err(TopologyMismatch::MissingTopologyKey { key: key_of(s.term) });
            };
            let count = spread.get(index).and_then(|c| c.get(d as usize)).copied().unwrap_or(0);
            if count + u32::from(s.self_match) > min + s.max_skew {
                return Err(TopologyMismatch::Spread { key: key_of(s.term), max_skew: s.max_skew, index });
            }
        }
        Ok(())
    }

    /// A mismatch in words, with its topology key named.
    pub fn describe(&self, m: &TopologyMismatch) -> String {
        match *m {
            TopologyMismatch::AntiAffinity { key } => format!("pod anti-affinity on {}", self.keys[key]),
            TopologyMismatch::RepelledByExisting { key } => format!("anti-affinity of a running pod on {}", self.keys[key]),
            TopologyMismatch::Affinity { key } => format!("pod affinity on {}", self.keys[key]),
            TopologyMismatch::Spread { key, max_skew, .. } => format!("topology spread on {} (maxSkew {max_skew})", self.keys[key]),
            TopologyMismatch::MissingTopologyKey { key } => format!("node lacks topology key {}", self.keys[key]),
        }
    }

    /// The smallest count of spread term `i` over the given eligible
    /// domains, zero when there are fewer domains than minDomains.
    pub fn spread_min(spread: &SpreadTerm, counts: &[u32], eligible: impl Iterator<Item = DomainId>) -> u32 {
        let mut n = 0u32;
        let mut min = u32::MAX;
        for d in eligible {
            n += 1;
            min = min.min(counts.get(d as usize).copied().unwrap_or(0));
        }
        if n == 0 || n < spread.min_domains { 0 } else { min }
    }

    pub fn anti_terms_owned_by(&mut self, pod: &Pod) -> Vec<usize> {
        pod.pod_anti_affinity.iter().map(|t| self.anti_affinity_term(t, &pod.namespace)).collect()
    }
}
