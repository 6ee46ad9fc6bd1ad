//! Labels, selectors, node affinity terms, taints and tolerations, with the
//! matching rules of kube-scheduler.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// A value whose copies share one allocation until one of them is changed:
/// every snapshot copies the labels of every server, node and pod, and
/// nearly every pod carries the same tolerations.
pub struct Shared<T>(Arc<T>);

/// A set of labels: key to value, ordered by key. Cloning one is cheap.
pub type Labels = Shared<BTreeMap<String, String>>;

/// A pod's tolerations. Cloning is cheap; nearly every pod carries the same
/// two (the API server's `not-ready` and `unreachable`, for 300 s).
pub type Tolerations = Shared<Vec<Toleration>>;

impl Labels {
    pub fn new() -> Self {
        Labels::default()
    }
}

impl<T> Shared<T> {
    /// The value, taken from the allocation when this is its only copy.
    pub fn into_inner(self) -> T
    where
        T: Clone,
    {
        Arc::unwrap_or_clone(self.0)
    }

    /// Whether this copy is the only one of its allocation.
    pub fn unshared(&self) -> bool {
        Arc::strong_count(&self.0) == 1
    }

    /// Whether two copies share one allocation.
    pub fn same(&self, other: &Shared<T>) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<T: Default> Default for Shared<T> {
    fn default() -> Self {
        Shared(Arc::default())
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    /// For `T: Eq`, `Arc`'s own comparison finds copies of one allocation
    /// equal without a look inside.
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<T: Eq> Eq for Shared<T> {}

impl<T: PartialOrd> PartialOrd for Shared<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(&other.0)
    }
}

impl<T: Ord> Ord for Shared<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.cmp(&other.0)
    }
}

impl<T: std::hash::Hash> std::hash::Hash for Shared<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state)
    }
}

/// One allocation per distinct value among many copies: pods of one
/// ReplicaSet carry the same labels, nearly every pod the same two
/// tolerations, and a fleet's 150,000 pods would otherwise hold 150,000
/// copies of a few hundred values.
#[derive(Debug)]
pub struct Interner<T> {
    values: std::collections::HashSet<T>,
    /// How many values were kept after the last sweep of unused ones.
    kept: usize,
}

impl<T> Default for Interner<T> {
    fn default() -> Self {
        Interner { values: std::collections::HashSet::new(), kept: 0 }
    }
}

impl<T: Eq + std::hash::Hash> Interner<Shared<T>> {
    /// The shared copy of `value`, kept from now on if it is new.
    pub fn intern(&mut self, value: &mut Shared<T>) {
        if let Some(known) = self.values.get(value) {
            *value = known.clone();
            return;
        }
        self.values.insert(value.clone());
        // Values no one else holds any more are dropped once their number
        // could have doubled since the last sweep.
        if self.values.len() > 2 * self.kept + 1024 {
            self.values.retain(|v| !v.unshared());
            self.kept = self.values.len();
        }
    }

    /// How many distinct values are kept.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Clone> std::ops::DerefMut for Shared<T> {
    /// Copies the value first when another copy shares it.
    fn deref_mut(&mut self) -> &mut T {
        Arc::make_mut(&mut self.0)
    }
}

impl<T: Serialize> Serialize for Shared<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Shared<T> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Shared::from)
    }
}

impl<T: fmt::Debug> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<T> From<T> for Shared<T> {
    fn from(value: T) -> Self {
        Shared(Arc::new(value))
    }
}

impl<A, T: FromIterator<A>> FromIterator<A> for Shared<T> {
    fn from_iter<I: IntoIterator<Item = A>>(iter: I) -> Self {
        Shared(Arc::new(iter.into_iter().collect()))
    }
}

impl<A, T: Extend<A> + Clone> Extend<A> for Shared<T> {
    fn extend<I: IntoIterator<Item = A>>(&mut self, iter: I) {
        Arc::make_mut(&mut self.0).extend(iter)
    }
}

impl<'a, T> IntoIterator for &'a Shared<T>
where
    &'a T: IntoIterator,
{
    type Item = <&'a T as IntoIterator>::Item;
    type IntoIter = <&'a T as IntoIterator>::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        self.0.as_ref().into_iter()
    }
}

impl<T: IntoIterator + Clone> IntoIterator for Shared<T> {
    type Item = T::Item;
    type IntoIter = T::IntoIter;
    fn into_iter(self) -> Self::IntoIter {
        Arc::unwrap_or_clone(self.0).into_iter()
    }
}

/// The well-known label every node carries with its own name.
pub const HOSTNAME: &str = "kubernetes.io/hostname";
/// The well-known zone label.
pub const ZONE: &str = "topology.kubernetes.io/zone";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt,
    Lt,
}

/// One `key op values` expression, as in node selector terms and ServerPool
/// requirements (all six operators) and label selectors (the first four).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Requirement {
    pub key: String,
    pub operator: Operator,
    #[serde(default)]
    pub values: Vec<String>,
}

impl Requirement {
    pub fn new(key: &str, operator: Operator, values: &[&str]) -> Self {
        Requirement { key: key.to_string(), operator, values: values.iter().map(|v| v.to_string()).collect() }
    }

    /// Matches a single optional value. `NotIn` and `DoesNotExist` match an
    /// absent key; `Gt` and `Lt` need the value and the operand to parse as
    /// integers and match nothing otherwise.
    pub fn matches_value(&self, value: Option<&str>) -> bool {
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            Operator::NotIn => value.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
            Operator::Gt | Operator::Lt => {
                let (Some(v), Some(bound)) = (value, self.values.first()) else {
                    return false;
                };
                match (v.parse::<i64>(), bound.parse::<i64>()) {
                    (Ok(v), Ok(b)) if self.operator == Operator::Gt => v > b,
                    (Ok(v), Ok(b)) => v < b,
                    _ => false,
                }
            }
        }
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.matches_value(labels.get(&self.key).map(String::as_str))
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = self.values.join(",");
        match self.operator {
            Operator::In if self.values.len() == 1 => write!(f, "{}={}", self.key, values),
            Operator::In => write!(f, "{} in ({values})", self.key),
            Operator::NotIn => write!(f, "{} notin ({values})", self.key),
            Operator::Exists => write!(f, "{} exists", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::Gt => write!(f, "{} > {values}", self.key),
            Operator::Lt => write!(f, "{} < {values}", self.key),
        }
    }
}

/// A node selector term: expressions on labels and on fields
/// (`metadata.name`), all of which must match. The terms of a required node
/// affinity are ORed; an empty term matches nothing, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeSelectorTerm {
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
    #[serde(default)]
    pub match_fields: Vec<Requirement>,
}

impl NodeSelectorTerm {
    pub fn matches(&self, labels: &Labels, node_name: &str) -> bool {
        if self.match_expressions.is_empty() && self.match_fields.is_empty() {
            return false;
        }
        self.match_expressions.iter().all(|r| r.matches(labels))
            && self.match_fields.iter().all(|r| {
                // metadata.name is the only field selector Kubernetes supports here.
                r.key == "metadata.name" && r.matches_value(Some(node_name))
            })
    }
}

/// A label selector: `matchLabels` and `matchExpressions`, ANDed. An empty
/// selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LabelSelector {
    #[serde(default)]
    pub match_labels: Labels,
    #[serde(default)]
    pub match_expressions: Vec<Requirement>,
}

impl LabelSelector {
    pub fn matching(pairs: &[(&str, &str)]) -> Self {
        LabelSelector { match_labels: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(), match_expressions: Vec::new() }
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v)) && self.match_expressions.iter().all(|r| r.matches(labels))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Taint {
    pub key: String,
    #[serde(default)]
    pub value: String,
    pub effect: TaintEffect,
}

impl Taint {
    pub fn new(key: &str, value: &str, effect: TaintEffect) -> Self {
        Taint { key: key.to_string(), value: value.to_string(), effect }
    }

    /// PreferNoSchedule only lowers a node's score; it never blocks.
    pub fn blocks_scheduling(&self) -> bool {
        self.effect != TaintEffect::PreferNoSchedule
    }
}

impl fmt::Display for Taint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.value.is_empty() { write!(f, "{}:{:?}", self.key, self.effect) } else { write!(f, "{}={}:{:?}", self.key, self.value, self.effect) }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TolerationOperator {
    #[default]
    Equal,
    Exists,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Toleration {
    /// Empty with `Exists` tolerates every taint.
    #[serde(default)]
    pub key: String,
    #[serde(default)]
    pub operator: TolerationOperator,
    #[serde(default)]
    pub value: String,
    /// None tolerates every effect.
    #[serde(default)]
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if self.effect.is_some_and(|e| e != taint.effect) {
            return false;
        }
        match self.operator {
            TolerationOperator::Exists => self.key.is_empty() || self.key == taint.key,
            TolerationOperator::Equal => self.key == taint.key && self.value == taint.value,
        }
    }

    pub fn exists(key: &str) -> Self {
        Toleration { key: key.to_string(), operator: TolerationOperator::Exists, ..Default::default() }
    }
}

/// The first taint that blocks scheduling and is not tolerated.
pub fn untolerated_taint<'t>(taints: &'t [Taint], tolerations: &[Toleration]) -> Option<&'t Taint> {
    taints.iter().filter(|t| t.blocks_scheduling()).find(|t| !tolerations.iter().any(|tol| tol.tolerates(t)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn equal_maps_share_one_copy_and_unused_ones_are_dropped_in_time() {
        let make = |i: usize| -> Labels { [("app".to_string(), format!("a{i}"))].into_iter().collect() };
        let mut interner = Interner::<Labels>::default();
        let mut first = make(1);
        let mut second = make(1);
        interner.intern(&mut first);
        interner.intern(&mut second);
        assert!(first.same(&second), "equal labels share one map");
        assert_eq!(interner.len(), 1);
        drop((first, second));
        // 5,000 distinct maps, each dropped at once: the interner never
        // holds more than twice what is in use plus its slack.
        for i in 2..5000 {
            let mut l = make(i);
            interner.intern(&mut l);
        }
        assert!(interner.len() <= 1024 + 1, "kept {}", interner.len());
        let mut again = make(4999);
        let kept = interner.len();
        interner.intern(&mut again);
        assert!(interner.len() <= kept + 1);
    }

    #[test]
    fn equal_tolerations_share_one_list_until_one_copy_changes() {
        let make = || -> Tolerations { vec![Toleration::exists("node.kubernetes.io/not-ready"), Toleration::exists("x")].into() };
        let mut interner = Interner::<Tolerations>::default();
        let (mut first, mut second) = (make(), make());
        interner.intern(&mut first);
        interner.intern(&mut second);
        assert_eq!(interner.len(), 1);
        assert!(!first.unshared() && !second.unshared(), "both copies share the interned list");
        second.push(Toleration::exists("y"));
        assert_eq!((first.len(), second.len()), (2, 3), "a change copies the list first");
        assert_eq!(serde_json::to_value(&first).unwrap(), serde_json::to_value(&*first).unwrap(), "serialized as the list itself");
    }

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn node_affinity_operators_match_as_kubernetes_does() {
        use Operator::*;
        let node = labels(&[("zone", "a"), ("cores", "32"), ("gpu", "")]);
        let cases: &[(Requirement, bool)] = &[
            (Requirement::new("zone", In, &["a", "b"]), true),
            (Requirement::new("zone", In, &["b"]), false),
            (Requirement::new("missing", In, &["a"]), false),
            (Requirement::new("zone", NotIn, &["a"]), false),
            (Requirement::new("zone", NotIn, &["b"]), true),
            (Requirement::new("missing", NotIn, &["a"]), true),
            (Requirement::new("gpu", Exists, &[]), true),
            (Requirement::new("missing", Exists, &[]), false),
            (Requirement::new("gpu", DoesNotExist, &[]), false),
            (Requirement::new("missing", DoesNotExist, &[]), true),
            (Requirement::new("cores", Gt, &["16"]), true),
            (Requirement::new("cores", Gt, &["32"]), false),
            (Requirement::new("cores", Lt, &["33"]), true),
            (Requirement::new("cores", Lt, &["32"]), false),
            (Requirement::new("zone", Gt, &["1"]), false),
            (Requirement::new("missing", Lt, &["1"]), false),
            (Requirement::new("cores", Gt, &["x"]), false),
            (Requirement::new("cores", Gt, &[]), false),
        ];
        for (req, want) in cases {
            assert_eq!(req.matches(&node), *want, "{req}");
        }
    }

    #[test]
    fn empty_node_selector_term_matches_nothing_and_fields_match_the_name() {
        let node = labels(&[("zone", "a")]);
        assert!(!NodeSelectorTerm::default().matches(&node, "n1"));
        let by_name = NodeSelectorTerm { match_fields: vec![Requirement::new("metadata.name", Operator::In, &["n1"])], ..Default::default() };
        assert!(by_name.matches(&node, "n1"));
        assert!(!by_name.matches(&node, "n2"));
        let other_field = NodeSelectorTerm { match_fields: vec![Requirement::new("metadata.uid", Operator::In, &["n1"])], ..Default::default() };
        assert!(!other_field.matches(&node, "n1"));
    }

    #[test]
    fn tolerations_follow_kubernetes_rules() {
        use TaintEffect::*;
        let gpu = Taint::new("gpu", "true", NoSchedule);
        let cases: &[(Toleration, bool)] = &[
            (Toleration { operator: TolerationOperator::Exists, ..Default::default() }, true),
            (Toleration::exists("gpu"), true),
            (Toleration::exists("other"), false),
            (Toleration { key: "gpu".into(), value: "true".into(), ..Default::default() }, true),
            (Toleration { key: "gpu".into(), value: "false".into(), ..Default::default() }, false),
            (Toleration { key: "gpu".into(), value: "true".into(), effect: Some(NoExecute), ..Default::default() }, false),
            (Toleration { key: "gpu".into(), value: "true".into(), effect: Some(NoSchedule), ..Default::default() }, true),
        ];
        for (tol, want) in cases {
            assert_eq!(tol.tolerates(&gpu), *want, "{tol:?}");
        }
    }

    #[test]
    fn prefer_no_schedule_never_blocks() {
        let taints = [Taint::new("soft", "", TaintEffect::PreferNoSchedule)];
        assert!(untolerated_taint(&taints, &[]).is_none());
        let hard = [Taint::new("hard", "", TaintEffect::NoExecute)];
        assert_eq!(untolerated_taint(&hard, &[]).map(|t| t.key.as_str()), Some("hard"));
    }

    #[test]
    fn selectors_and_all_their_parts_must_match() {
        let pod = labels(&[("app", "web"), ("tier", "front")]);
        assert!(LabelSelector::default().matches(&pod));
        assert!(LabelSelector::matching(&[("app", "web")]).matches(&pod));
        let mut sel = LabelSelector::matching(&[("app", "web")]);
        sel.match_expressions.push(Requirement::new("tier", Operator::NotIn, &["front"]));
        assert!(!sel.matches(&pod));
    }
}
