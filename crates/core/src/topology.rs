//! Inter-pod constraints: required pod affinity and anti-affinity (both
//! directions) and topology spread, counted per topology domain.
//!
//! Every distinct term (namespaces, selector, topology key) gets an id; the
//! index keeps, per term and domain, how many placed pods match it, and
//! where pods owning an anti-affinity term sit. Placing a pod updates the
//! counts in O(terms it matches), so a check is a few array reads.

use crate::labels::{LabelSelector, Labels};
use crate::model::{Pod, PodAffinityTerm, TopologySpread, WhenUnsatisfiable};
use foldhash::HashMap;

/// A domain value interned per topology key, e.g. "zone-a" for the zone key.
pub type DomainId = u32;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Namespaces {
    All,
    Listed(Vec<String>),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct TermSpec {
    namespaces: Namespaces,
    selector: Option<LabelSelector>,
    key: usize,
}

#[derive(Default)]
pub struct TopologyIndex {
    keys: Vec<String>,
    key_ids: HashMap<String, usize>,
    domains: HashMap<String, DomainId>,
    domain_names: Vec<String>,
    terms: Vec<TermSpec>,
    term_ids: HashMap<TermSpec, usize>,
    /// counts[term][domain]: placed pods matching the term in that domain.
    counts: Vec<Vec<u32>>,
    totals: Vec<u32>,
    /// anti_owners[term][domain]: placed pods owning this anti-affinity term.
    anti_owners: Vec<Vec<u32>>,
}

/// The terms one kind of pod carries, resolved to ids.
#[derive(Clone, Debug, Default)]
pub struct PodTerms {
    pub affinity: Vec<usize>,
    pub anti_affinity: Vec<usize>,
    /// (term, max skew, min domains, whether the pod matches its own selector)
    pub spread: Vec<SpreadTerm>,
    /// Terms whose selector matches this pod: counted when it is placed.
    pub matched_by: Vec<usize>,
    /// Anti-affinity terms of other pods that this pod matches.
    pub repelled_by: Vec<usize>,
    /// Affinity terms the pod matches itself (the first pod of a group may
    /// go anywhere).
    pub self_affine: Vec<bool>,
}

#[derive(Clone, Copy, Debug)]
pub struct SpreadTerm {
    pub term: usize,
    pub max_skew: u32,
    pub min_domains: u32,
    pub self_match: bool,
}

/// Which inter-pod constraint failed, for reasons and for the scheduler's
/// bookkeeping (affinity and spread can become satisfiable later; the
/// others cannot).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopologyMismatch {
    AntiAffinity {
        key: String,
    },
    RepelledByExisting {
        key: String,
    },
    Affinity {
        key: String,
    },
    /// `index` is the position of the failing term in `PodTerms::spread`.
    Spread {
        key: String,
        max_skew: u32,
        index: usize,
    },
    MissingTopologyKey {
        key: String,
    },
}

impl TopologyMismatch {
    /// Adding pods can only make these worse.
    pub fn is_permanent(&self) -> bool {
        matches!(self, TopologyMismatch::AntiAffinity { .. } | TopologyMismatch::RepelledByExisting { .. })
    }
}

impl std::fmt::Display for TopologyMismatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TopologyMismatch::AntiAffinity { key } => write!(f, "pod anti-affinity on {key}"),
            TopologyMismatch::RepelledByExisting { key } => {
                write!(f, "anti-affinity of a running pod on {key}")
            }
            TopologyMismatch::Affinity { key } => write!(f, "pod affinity on {key}"),
            TopologyMismatch::Spread { key, max_skew, .. } => {
                write!(f, "topology spread on {key} (maxSkew {max_skew})")
            }
            TopologyMismatch::MissingTopologyKey { key } => write!(f, "node lacks topology key {key}"),
        }
    }
}

fn resolve_namespaces(term: &PodAffinityTerm, own: &str) -> Namespaces {
    if term.all_namespaces {
        Namespaces::All
    } else if term.namespaces.is_empty() {
        Namespaces::Listed(vec![own.to_string()])
    } else {
        let mut ns = term.namespaces.clone();
        ns.sort();
        ns.dedup();
        Namespaces::Listed(ns)
    }
}

impl TopologyIndex {
    pub fn key_id(&mut self, key: &str) -> usize {
        if let Some(&id) = self.key_ids.get(key) {
            return id;
        }
        self.keys.push(key.to_string());
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

    pub fn domain_name(&self, id: DomainId) -> &str {
        &self.domain_names[id as usize]
    }

    /// The domain of a node with these labels, for every known key.
    pub fn domains_of(&mut self, labels: &Labels) -> Vec<Option<DomainId>> {
        let keys = self.keys.clone();
        keys.iter().map(|k| labels.get(k).map(|v| self.domain_id(v))).collect()
    }

    fn term_id(&mut self, spec: TermSpec) -> usize {
        if let Some(&id) = self.term_ids.get(&spec) {
            return id;
        }
        self.terms.push(spec.clone());
        self.term_ids.insert(spec, self.terms.len() - 1);
        self.counts.push(Vec::new());
        self.anti_owners.push(Vec::new());
        self.totals.push(0);
        self.terms.len() - 1
    }

    fn affinity_term(&mut self, term: &PodAffinityTerm, own_namespace: &str) -> usize {
        let key = self.key_id(&term.topology_key);
        let spec = TermSpec { namespaces: resolve_namespaces(term, own_namespace), selector: term.label_selector.clone(), key };
        self.term_id(spec)
    }

    fn spread_term(&mut self, spread: &TopologySpread, own_namespace: &str) -> usize {
        let key = self.key_id(&spread.topology_key);
        let spec = TermSpec { namespaces: Namespaces::Listed(vec![own_namespace.to_string()]), selector: spread.label_selector.clone(), key };
        self.term_id(spec)
    }

    /// Registers the terms a pod carries. Call for every pod before the
    /// first `resolve`, so that `matched_by` sees all terms.
    pub fn register(&mut self, pod: &Pod) {
        for t in pod.pod_affinity.iter().chain(&pod.pod_anti_affinity) {
            self.affinity_term(t, &pod.namespace);
        }
        for s in &pod.topology_spread {
            if s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule {
                self.spread_term(s, &pod.namespace);
            }
        }
    }

    fn term_matches(&self, term: usize, pod: &Pod) -> bool {
        let spec = &self.terms[term];
        let ns_ok = match &spec.namespaces {
            Namespaces::All => true,
            Namespaces::Listed(list) => list.iter().any(|n| n == &pod.namespace),
        };
        ns_ok && spec.selector.as_ref().is_some_and(|s| s.matches(&pod.labels))
    }

    /// Resolves a pod's terms to ids and finds the terms it matches. Terms
    /// must all be registered first.
    pub fn resolve(&mut self, pod: &Pod, anti_terms_in_use: &[usize]) -> PodTerms {
        let affinity: Vec<usize> = pod.pod_affinity.iter().map(|t| self.affinity_term(t, &pod.namespace)).collect();
        let self_affine = affinity.iter().map(|&t| self.term_matches(t, pod)).collect();
        let anti_affinity = pod.pod_anti_affinity.iter().map(|t| self.affinity_term(t, &pod.namespace)).collect();
        let spread = pod
            .topology_spread
            .iter()
            .filter(|s| s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule)
            .map(|s| {
                let term = self.spread_term(s, &pod.namespace);
                SpreadTerm { term, max_skew: s.max_skew.max(1), min_domains: s.min_domains.unwrap_or(1), self_match: self.term_matches(term, pod) }
            })
            .collect();
        let matched_by = (0..self.terms.len()).filter(|&t| self.term_matches(t, pod)).collect();
        let repelled_by = anti_terms_in_use.iter().copied().filter(|&t| self.term_matches(t, pod)).collect();
        PodTerms { affinity, anti_affinity, spread, matched_by, repelled_by, self_affine }
    }

    pub fn key_of_term(&self, term: usize) -> usize {
        self.terms[term].key
    }

    pub fn count(&self, term: usize, domain: DomainId) -> u32 {
        self.counts[term].get(domain as usize).copied().unwrap_or(0)
    }

    fn bump(table: &mut Vec<u32>, domain: DomainId) {
        let i = domain as usize;
        if table.len() <= i {
            table.resize(i + 1, 0);
        }
        table[i] += 1;
    }

    /// Records a pod placed on a node whose domains (per key) are `domains`.
    pub fn place(&mut self, terms: &PodTerms, domains: &[Option<DomainId>]) {
        for &t in &terms.matched_by {
            if let Some(d) = domains[self.terms[t].key] {
                Self::bump(&mut self.counts[t], d);
            }
            self.totals[t] += 1;
        }
        for &t in &terms.anti_affinity {
            if let Some(d) = domains[self.terms[t].key] {
                Self::bump(&mut self.anti_owners[t], d);
            }
        }
    }

    /// Checks affinity and anti-affinity (both directions) for a node in
    /// `domains`, and spread against the precomputed minimum counts.
    pub fn check(&self, terms: &PodTerms, domains: &[Option<DomainId>], spread_min: &[u32]) -> Result<(), TopologyMismatch> {
        let key_name = |t: usize| self.keys[self.terms[t].key].clone();
        for &t in &terms.anti_affinity {
            if let Some(d) = domains[self.terms[t].key]
                && self.count(t, d) > 0
            {
                return Err(TopologyMismatch::AntiAffinity { key: key_name(t) });
            }
        }
        for &t in &terms.repelled_by {
            if let Some(d) = domains[self.terms[t].key]
                && self.anti_owners[t].get(d as usize).copied().unwrap_or(0) > 0
            {
                return Err(TopologyMismatch::RepelledByExisting { key: key_name(t) });
            }
        }
        for (i, &t) in terms.affinity.iter().enumerate() {
            let Some(d) = domains[self.terms[t].key] else {
                return Err(TopologyMismatch::MissingTopologyKey { key: key_name(t) });
            };
            let first_of_its_kind = self.totals[t] == 0 && terms.self_affine[i];
            if self.count(t, d) == 0 && !first_of_its_kind {
                return Err(TopologyMismatch::Affinity { key: key_name(t) });
            }
        }
        for (index, (s, &min)) in terms.spread.iter().zip(spread_min).enumerate() {
            let Some(d) = domains[self.terms[s.term].key] else {
                return Err(TopologyMismatch::MissingTopologyKey { key: key_name(s.term) });
            };
            let after = self.count(s.term, d) + u32::from(s.self_match);
            if after > min + s.max_skew {
                return Err(TopologyMismatch::Spread { key: key_name(s.term), max_skew: s.max_skew, index });
            }
        }
        Ok(())
    }

    /// The smallest count of a spread term over the given eligible domains,
    /// zero when there are fewer domains than minDomains.
    pub fn spread_min(&self, spread: &SpreadTerm, eligible: impl Iterator<Item = DomainId>) -> u32 {
        let mut n = 0u32;
        let mut min = u32::MAX;
        for d in eligible {
            n += 1;
            min = min.min(self.count(spread.term, d));
        }
        if n == 0 || n < spread.min_domains { 0 } else { min }
    }

    pub fn anti_terms_owned_by(&mut self, pod: &Pod) -> Vec<usize> {
        pod.pod_anti_affinity.iter().map(|t| self.affinity_term(t, &pod.namespace)).collect()
    }
}
