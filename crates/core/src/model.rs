//! The world as the core sees it: a snapshot of nodes, pods, servers,
//! ServerPools and claims in flight. Drivers build it; the core only reads it.

use crate::labels::{LabelSelector, Labels, NodeSelectorTerm, Requirement, Shared, Taint, Tolerations};
use crate::resources::Resources;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Seconds since an arbitrary epoch chosen by the driver (the Unix epoch in
/// the controller, zero at the start of a simulation).
pub type Seconds = u64;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PodPhase {
    #[default]
    Pending,
    Running,
    Succeeded,
    Failed,
}

/// A required inter-pod affinity or anti-affinity term.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PodAffinityTerm {
    /// None matches no pod, as a nil selector does in Kubernetes.
    pub label_selector: Option<LabelSelector>,
    /// Namespaces named outright. With neither names nor a selector, the
    /// pod's own namespace.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// Namespaces by their labels (see [`Snapshot::namespaces`]), ORed
    /// with `namespaces`. An empty selector (`{}`) selects every namespace;
    /// None (nil) selects none.
    #[serde(default)]
    pub namespace_selector: Option<LabelSelector>,
    pub topology_key: String,
}

/// Whether a spread constraint's domains count only the nodes that pass the
/// pod's node affinity (or its taints): `nodeAffinityPolicy` and
/// `nodeTaintsPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum InclusionPolicy {
    Honor,
    Ignore,
}

fn honor() -> InclusionPolicy {
    InclusionPolicy::Honor
}

fn ignore() -> InclusionPolicy {
    InclusionPolicy::Ignore
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WhenUnsatisfiable {
    #[default]
    DoNotSchedule,
    ScheduleAnyway,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TopologySpread {
    pub max_skew: u32,
    pub topology_key: String,
    #[serde(default)]
    pub when_unsatisfiable: WhenUnsatisfiable,
    pub label_selector: Option<LabelSelector>,
    #[serde(default)]
    pub min_domains: Option<u32>,
    /// Kubernetes' default: Honor.
    #[serde(default = "honor")]
    pub node_affinity_policy: InclusionPolicy,
    /// Kubernetes' default: Ignore (tainted nodes are domains too).
    #[serde(default = "ignore")]
    pub node_taints_policy: InclusionPolicy,
}

impl TopologySpread {
    /// A constraint with Kubernetes' defaults: DoNotSchedule, minDomains 1,
    /// node affinity honoured, taints ignored.
    pub fn new(max_skew: u32, topology_key: &str, label_selector: Option<LabelSelector>) -> Self {
        TopologySpread {
            max_skew,
            topology_key: topology_key.to_string(),
            when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
            label_selector,
            min_domains: None,
            node_affinity_policy: InclusionPolicy::Honor,
            node_taints_policy: InclusionPolicy::Ignore,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HostPort {
    pub port: u16,
    #[serde(default = "tcp")]
    pub protocol: String,
    /// Empty or 0.0.0.0 conflicts with every address (`::` does not: only
    /// the IPv4 wildcard is one to kube-scheduler's NodePorts).
    #[serde(default)]
    pub host_ip: String,
}

fn tcp() -> String {
    "TCP".to_string()
}

impl HostPort {
    pub fn conflicts(&self, other: &HostPort) -> bool {
        let wildcard = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == other.port
            && self.protocol == other.protocol
            && (wildcard(&self.host_ip) || wildcard(&other.host_ip) || self.host_ip == other.host_ip)
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Owner {
    pub kind: String,
    pub name: String,
}

/// A pod, reduced to what scheduling and disruption decisions read: what
/// is its own (name, node, phase, age) and, shared with the other pods of
/// its template, its [`PodShape`].
///
/// The shape's fields read as the pod's own (`pod.requests`), through
/// `Deref`. Writing one through the pod (`pod.priority = 5`) first copies
/// the shape if other pods share it, so a change never reaches another pod.
/// A fleet's 150,000 pods come from a few hundred templates: the index keeps
/// one shape for each ([`crate::labels::Interner`]), and a pod takes about a
/// quarter of what it would whole.
///
/// Its serialized form is flat, every field at the top level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(from = "PodFields", into = "PodFields")]
pub struct Pod {
    pub namespace: String,
    pub name: String,
    pub node_name: Option<String>,
    pub phase: PodPhase,
    /// Has a deletion timestamp: still holds its node's resources.
    pub terminating: bool,
    /// Has `spec.schedulingGates`: kube-scheduler does not try it, so it is
    /// not demand until the gates are lifted.
    pub scheduling_gated: bool,
    pub created_s: Seconds,
    /// `karpenter.sh/do-not-disrupt` given as a duration (`"30m"`): not
    /// disrupted before this second, the pod's start plus the duration.
    pub do_not_disrupt_until_s: Option<Seconds>,
    /// An in-place resize its node has not applied (`PodResizePending`):
    /// `requests` are what it holds there now, as kube-scheduler counts
    /// them; the resize is demand for a node that can host it whole.
    pub resize: Option<Box<Resize>>,
    /// `metadata.uid`, for a pod read from the API: a pod recreated under
    /// the same name has another.
    pub uid: Option<String>,
    pub shape: Shared<PodShape>,
}

/// What the pods of one template share: what they ask of a node, and how
/// they may be placed, scheduled and disrupted.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodShape {
    pub labels: Labels,
    /// Effective requests: max(sum of containers, largest init container)
    /// plus pod overhead, with one pod slot.
    pub requests: Resources,
    pub node_selector: Labels,
    /// Required node affinity terms, ORed. Empty means no constraint.
    pub node_affinity: Vec<NodeSelectorTerm>,
    pub tolerations: Tolerations,
    pub pod_affinity: Vec<PodAffinityTerm>,
    pub pod_anti_affinity: Vec<PodAffinityTerm>,
    pub topology_spread: Vec<TopologySpread>,
    pub host_ports: Vec<HostPort>,
    pub priority: i32,
    pub owner: Option<Owner>,
    /// How long after creation the pod should be running (the
    /// `ironclaim.dev/deadline` annotation), else the ServerPool default.
    pub deadline_s: Option<Seconds>,
    /// `ironclaim.dev/do-not-disrupt`, `karpenter.sh/do-not-disrupt` or
    /// `cluster-autoscaler.kubernetes.io/safe-to-evict: "false"`.
    pub do_not_disrupt: bool,
    /// The workload this pod belongs to, for reports (a Deployment's name).
    pub workload: Option<String>,
    /// A gang it belongs to (`namespace/name` of a ProvisioningRequest):
    /// servers are powered on for all of a gang's pending pods or for none
    /// ([`crate::gang`]).
    pub gang: Option<String>,
}

impl std::ops::Deref for Pod {
    type Target = PodShape;
    fn deref(&self) -> &PodShape {
        &self.shape
    }
}

impl std::ops::DerefMut for Pod {
    /// Copies the shape first when another pod shares it.
    fn deref_mut(&mut self) -> &mut PodShape {
        &mut self.shape
    }
}

/// A [`Pod`] as it is written and read: flat.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct PodFields {
    namespace: String,
    name: String,
    #[serde(default)]
    labels: Labels,
    requests: Resources,
    #[serde(default)]
    node_name: Option<String>,
    #[serde(default)]
    phase: PodPhase,
    #[serde(default)]
    terminating: bool,
    #[serde(default)]
    scheduling_gated: bool,
    #[serde(default)]
    node_selector: Labels,
    #[serde(default)]
    node_affinity: Vec<NodeSelectorTerm>,
    #[serde(default)]
    tolerations: Tolerations,
    #[serde(default)]
    pod_affinity: Vec<PodAffinityTerm>,
    #[serde(default)]
    pod_anti_affinity: Vec<PodAffinityTerm>,
    #[serde(default)]
    topology_spread: Vec<TopologySpread>,
    #[serde(default)]
    host_ports: Vec<HostPort>,
    #[serde(default)]
    priority: i32,
    #[serde(default)]
    owner: Option<Owner>,
    #[serde(default)]
    deadline_s: Option<Seconds>,
    #[serde(default)]
    created_s: Seconds,
    #[serde(default)]
    do_not_disrupt: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    do_not_disrupt_until_s: Option<Seconds>,
    #[serde(default)]
    workload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resize: Option<Box<Resize>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gang: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    uid: Option<String>,
}

impl From<PodFields> for Pod {
    fn from(f: PodFields) -> Pod {
        let shape = PodShape {
            labels: f.labels,
            requests: f.requests,
            node_selector: f.node_selector,
            node_affinity: f.node_affinity,
            tolerations: f.tolerations,
            pod_affinity: f.pod_affinity,
            pod_anti_affinity: f.pod_anti_affinity,
            topology_spread: f.topology_spread,
            host_ports: f.host_ports,
            priority: f.priority,
            owner: f.owner,
            deadline_s: f.deadline_s,
            do_not_disrupt: f.do_not_disrupt,
            workload: f.workload,
            gang: f.gang,
        };
        Pod {
            namespace: f.namespace,
            name: f.name,
            node_name: f.node_name,
            phase: f.phase,
            terminating: f.terminating,
            scheduling_gated: f.scheduling_gated,
            created_s: f.created_s,
            do_not_disrupt_until_s: f.do_not_disrupt_until_s,
            resize: f.resize,
            uid: f.uid,
            shape: Shared::from(shape),
        }
    }
}

impl From<Pod> for PodFields {
    fn from(pod: Pod) -> PodFields {
        let shape = pod.shape.into_inner();
        PodFields {
            namespace: pod.namespace,
            name: pod.name,
            labels: shape.labels,
            requests: shape.requests,
            node_name: pod.node_name,
            phase: pod.phase,
            terminating: pod.terminating,
            scheduling_gated: pod.scheduling_gated,
            node_selector: shape.node_selector,
            node_affinity: shape.node_affinity,
            tolerations: shape.tolerations,
            pod_affinity: shape.pod_affinity,
            pod_anti_affinity: shape.pod_anti_affinity,
            topology_spread: shape.topology_spread,
            host_ports: shape.host_ports,
            priority: shape.priority,
            owner: shape.owner,
            deadline_s: shape.deadline_s,
            created_s: pod.created_s,
            do_not_disrupt: shape.do_not_disrupt,
            do_not_disrupt_until_s: pod.do_not_disrupt_until_s,
            workload: shape.workload,
            resize: pod.resize,
            gang: shape.gang,
            uid: pod.uid,
        }
    }
}

/// Why the kubelet has not applied a pod's in-place resize: the reason of
/// its `PodResizePending` condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResizeReason {
    /// The node can never give it (more than the node's allocatable).
    Infeasible,
    /// The node cannot give it now (its other pods hold the room).
    Deferred,
}

impl ResizeReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResizeReason::Infeasible => "infeasible",
            ResizeReason::Deferred => "deferred",
        }
    }
}

/// An in-place resize waiting on the node a pod runs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Resize {
    /// The pod's effective requests once resized, one pod slot included.
    pub desired: Resources,
    pub reason: ResizeReason,
    /// Since when the resize has waited (the condition's last transition):
    /// its deadline runs from here.
    #[serde(default)]
    pub since_s: Seconds,
    /// What the kubelet applied or allocated, when it differs from what
    /// the pod is counted at (a deferred resize is counted at its new size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub given: Option<Resources>,
}

/// Pods with a priority below this neither trigger scale-up nor block
/// scale-down. Overprovisioning pause pods conventionally sit at exactly
/// -10, so they still count as (headroom) demand.
pub const EXPENDABLE_PRIORITY_BELOW: i32 = -10;

impl Pod {
    pub fn new(namespace: &str, name: &str, requests: Resources) -> Self {
        let shape = PodShape { requests: Resources { pods: 1, ..requests }, ..PodShape::default() };
        Pod { namespace: namespace.to_string(), name: name.to_string(), shape: Shared::from(shape), ..Default::default() }
    }

    /// `namespace/name`, built without the formatting machinery: plans
    /// name every pending pod.
    pub fn key(&self) -> String {
        let mut key = String::with_capacity(self.namespace.len() + 1 + self.name.len());
        key.push_str(&self.namespace);
        key.push('/');
        key.push_str(&self.name);
        key
    }

    /// Whether nothing may evict the pod at `now_s`: do-not-disrupt, or a
    /// do-not-disrupt duration that has not run out.
    pub fn protected_at(&self, now_s: Seconds) -> bool {
        self.do_not_disrupt || self.do_not_disrupt_until_s.is_some_and(|t| now_s < t)
    }

    pub fn is_daemonset_pod(&self) -> bool {
        self.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet")
    }

    /// Holds resources on its node: bound, not finished. Terminating pods
    /// still count until they are gone, as kube-scheduler counts them.
    pub fn occupies_node(&self) -> bool {
        self.node_name.is_some() && !matches!(self.phase, PodPhase::Succeeded | PodPhase::Failed)
    }

    /// Waiting for a node and wanted: the demand the core plans for.
    pub fn is_pending_demand(&self) -> bool {
        self.node_name.is_none()
            && self.phase == PodPhase::Pending
            && !self.terminating
            && !self.scheduling_gated
            && !self.is_daemonset_pod()
            && self.priority >= EXPENDABLE_PRIORITY_BELOW
    }

    /// Running, wanted, and waiting for an in-place resize its node cannot
    /// give: demand for a node that can host it at its desired size (see
    /// [`crate::resize`]).
    /// Only a pod a controller makes again (VPA acts on those) can move to
    /// where the room is.
    pub fn is_resize_demand(&self) -> bool {
        self.resize.is_some()
            && self.owner.is_some()
            && self.occupies_node()
            && !self.terminating
            && !self.is_daemonset_pod()
            && self.priority >= EXPENDABLE_PRIORITY_BELOW
    }

    /// Demand the core plans for: waiting for a node, or for a resize.
    pub fn is_demand(&self) -> bool {
        self.is_pending_demand() || self.is_resize_demand()
    }

    pub fn with_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        self.labels.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    pub fn with_node_selector(mut self, pairs: &[(&str, &str)]) -> Self {
        self.node_selector.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    pub fn bound_to(mut self, node: &str) -> Self {
        self.node_name = Some(node.to_string());
        self.phase = PodPhase::Running;
        self
    }
}

/// A Kubernetes Node as the scheduler sees it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub taints: Vec<Taint>,
    pub allocatable: Resources,
    /// Cordoned (`spec.unschedulable`).
    #[serde(default)]
    pub unschedulable: bool,
    #[serde(default = "yes")]
    pub ready: bool,
    /// The inventory server behind this node, when ironclaim knows it.
    #[serde(default)]
    pub server: Option<String>,
    /// ironclaim has started draining it.
    #[serde(default)]
    pub disrupting: bool,
    /// The Node says not to consolidate it: `karpenter.sh/do-not-disrupt:
    /// "true"` or `cluster-autoscaler.kubernetes.io/scale-down-disabled:
    /// "true"`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub do_not_disrupt: bool,
}

fn yes() -> bool {
    true
}

impl Node {
    /// A Ready node; `allocatable` without pod slots gets the kubelet's
    /// default.
    pub fn new(name: &str, allocatable: Resources) -> Self {
        let allocatable = allocatable.with_default_pods();
        let mut labels = Labels::new();
        labels.insert(crate::labels::HOSTNAME.to_string(), name.to_string());
        Node {
            name: name.to_string(),
            labels,
            taints: Vec::new(),
            allocatable,
            unschedulable: false,
            ready: true,
            server: None,
            disrupting: false,
            do_not_disrupt: false,
        }
    }

    pub fn with_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        self.labels.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }
}

/// What a server draws, in watts.
///
/// Between idle and peak the draw is linear in what is allocated: the GPUs'
/// part of the range ([`PowerProfile::gpu_watts`]) in proportion to the
/// GPUs in use, the rest in proportion to the cpu in use.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PowerProfile {
    /// Powered on, no load.
    pub idle_watts: f64,
    /// Fully loaded.
    pub peak_watts: f64,
    /// Average draw while powering on and booting.
    pub boot_watts: f64,
    /// Powered off, BMC still on.
    pub off_watts: f64,
    /// Of `peak_watts - idle_watts`, what the GPUs add when all of them are
    /// busy. Unset: [`DEFAULT_GPU_SHARE`] of the range on a server with
    /// GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_watts: Option<f64>,
}

/// The share of a GPU server's idle-to-peak range its GPUs draw, when its
/// power profile does not say.
pub const DEFAULT_GPU_SHARE: f64 = 0.8;

impl Default for PowerProfile {
    fn default() -> Self {
        PowerProfile { idle_watts: 200.0, peak_watts: 450.0, boot_watts: 300.0, off_watts: 10.0, gpu_watts: None }
    }
}

impl PowerProfile {
    /// The profile with the given draws and no word on the GPUs' part.
    pub fn new(idle_watts: f64, peak_watts: f64, boot_watts: f64, off_watts: f64) -> Self {
        PowerProfile { idle_watts, peak_watts, boot_watts, off_watts, gpu_watts: None }
    }

    /// The part of the idle-to-peak range the GPUs of a server of
    /// `capacity` draw at full use: none without GPUs.
    pub fn gpu_range_watts(&self, capacity: &Resources) -> f64 {
        let range = (self.peak_watts - self.idle_watts).max(0.0);
        if capacity.gpu_milli() <= 0 {
            return 0.0;
        }
        self.gpu_watts.unwrap_or(DEFAULT_GPU_SHARE * range).clamp(0.0, range)
    }

    /// What the core counts a server of `capacity` as drawing with
    /// `gpu_milli` thousandths of its GPUs in use: its idle watts, plus
    /// those GPUs' draw where `gpu_watts` is stated. This is how the core
    /// compares servers (a claim's server, a replacement).
    /// A core's draw, and that of GPUs whose draw is unstated, is taken as
    /// the same on every server: a profile left unstated is the same
    /// whatever the server's size, and would make a larger server look
    /// frugal.
    pub fn compared_watts(&self, capacity: &Resources, gpu_milli: i64) -> f64 {
        self.idle_watts + self.stated_gpu_watts(capacity, gpu_milli)
    }

    /// What `gpu_milli` thousandths of the GPUs of a server of `capacity`
    /// draw when `gpu_watts` states it; nothing otherwise.
    pub fn stated_gpu_watts(&self, capacity: &Resources, gpu_milli: i64) -> f64 {
        if self.gpu_watts.is_some() { self.load_watts(capacity, 0, gpu_milli) } else { 0.0 }
    }

    /// What a booted server of `capacity` draws above idle with `cpu_milli`
    /// of its cpu and `gpu_milli` thousandths of its GPUs allocated to pods.
    pub fn load_watts(&self, capacity: &Resources, cpu_milli: i64, gpu_milli: i64) -> f64 {
        let range = (self.peak_watts - self.idle_watts).max(0.0);
        let gpu = self.gpu_range_watts(capacity);
        let share = |a: i64, c: i64| if c > 0 { (a as f64 / c as f64).clamp(0.0, 1.0) } else { 0.0 };
        (range - gpu) * share(cpu_milli, capacity.cpu_milli) + gpu * share(gpu_milli, capacity.gpu_milli())
    }
}

/// Measured durations of each stage of a server's path to Ready, median and
/// 90th percentile, in seconds. ETAs use the median; "slow versus stuck"
/// uses the tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageDurations {
    pub power_on_s: Seconds,
    pub boot_s: Seconds,
    pub join_s: Seconds,
    pub ready_s: Seconds,
    /// Ratio of p90 to p50, in percent (150 = the tail is 1.5x the median).
    #[serde(default = "default_tail_percent")]
    pub tail_percent: u32,
}

fn default_tail_percent() -> u32 {
    150
}

impl Default for StageDurations {
    fn default() -> Self {
        StageDurations { power_on_s: 60, boot_s: 420, join_s: 60, ready_s: 60, tail_percent: 150 }
    }
}

impl StageDurations {
    /// Time to Ready from powered off.
    pub fn cold_s(&self) -> Seconds {
        self.power_on_s + self.boot_s + self.join_s + self.ready_s
    }
    /// Time to Ready from powered on and prepared (a warm spare).
    pub fn warm_s(&self) -> Seconds {
        self.join_s + self.ready_s
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PowerState {
    #[default]
    Off,
    On,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Health {
    #[default]
    Healthy,
    /// The last attempt failed and the server waits out its backoff.
    Failed,
    /// Failed repeatedly; an operator must release it.
    Quarantined,
    /// Taken out by an operator.
    Maintenance,
    /// On, not powered on by ironclaim, and no node is linked to it: what
    /// runs on it is unknown (see [`crate::identity`]).
    Unadopted,
    /// What its nodes or its BMC say contradicts its recorded identity.
    IdentityMismatch,
    /// Its power provider's configuration is broken (a missing Secret or
    /// key, an unusable address or TLS setting): no power request can be
    /// sent until it is fixed.
    Misconfigured,
}

impl Health {
    /// Kept as it is: never idle, never given up as a spare, never powered
    /// off for idling.
    pub fn hands_off(self) -> bool {
        matches!(self, Health::Maintenance | Health::Unadopted | Health::IdentityMismatch | Health::Misconfigured)
    }
}

/// One physical machine in the inventory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Server {
    pub name: String,
    /// Zone, rack, accelerator and anything else; copied onto its Node.
    #[serde(default)]
    pub labels: Labels,
    /// Allocatable capacity once it is a node (GPUs as `nvidia.com/gpu`).
    pub capacity: Resources,
    #[serde(default)]
    pub power: PowerProfile,
    #[serde(default)]
    pub durations: StageDurations,
    #[serde(default)]
    pub power_state: PowerState,
    #[serde(default)]
    pub health: Health,
    /// Failed attempts so far; flaky servers are chosen last.
    #[serde(default)]
    pub failures: u32,
    /// The claim that holds it, if any.
    #[serde(default)]
    pub claim: Option<String>,
    /// The node it became, if it has joined.
    #[serde(default)]
    pub node: Option<String>,
    /// Since when it has been powered on with nothing to do: no node, or a
    /// node with only DaemonSet pods. Set by the driver.
    #[serde(default)]
    pub idle_since_s: Option<Seconds>,
    /// A power-on of this unclaimed server is under way: it counts toward
    /// its class's warm floor (no second one is powered on for it), but not
    /// as warm capacity a confirmed spare may be given up for.
    #[serde(default)]
    pub powering_on: bool,
    /// A machine template rather than one machine: any number of identical
    /// machines can be made from it (a VM pool, a Cluster API
    /// MachineDeployment, a cloud instance type in benchmarks).
    #[serde(default)]
    pub unlimited: bool,
    /// Its power changes of the last day, oldest first, as the driver
    /// recorded them: for transition rates and the cap on power cycles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub power_changes: Vec<PowerChange>,
}

/// A power-on (`on`) or power-off a driver carried out, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerChange {
    pub at_s: Seconds,
    pub on: bool,
}

impl Server {
    pub fn new(name: &str, capacity: Resources) -> Self {
        Server {
            name: name.to_string(),
            labels: Labels::new(),
            capacity,
            power: PowerProfile::default(),
            durations: StageDurations::default(),
            power_state: PowerState::Off,
            health: Health::Healthy,
            failures: 0,
            claim: None,
            node: None,
            idle_since_s: None,
            powering_on: false,
            unlimited: false,
            power_changes: Vec::new(),
        }
    }

    pub fn with_labels(mut self, pairs: &[(&str, &str)]) -> Self {
        self.labels.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        self
    }

    pub fn with_gpus(mut self, model: &str, count: i64) -> Self {
        self.capacity.set_extended(crate::resources::GPU, count);
        self.labels.insert("nvidia.com/gpu.product".to_string(), model.to_string());
        self
    }

    pub fn warm(mut self) -> Self {
        self.power_state = PowerState::On;
        self
    }

    pub fn cold(mut self) -> Self {
        self.power_state = PowerState::Off;
        self
    }

    /// Free to be claimed now.
    pub fn is_available(&self) -> bool {
        self.health == Health::Healthy && self.claim.is_none() && self.node.is_none()
    }

    /// Powered on, prepared and idle: joins in minutes.
    pub fn is_warm(&self) -> bool {
        self.power_state == PowerState::On
    }

    pub fn eta_s(&self) -> Seconds {
        if self.is_warm() { self.durations.warm_s() } else { self.durations.cold_s() }
    }
}

/// Upper bounds on what a ServerPool may hold; None is unbounded.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    #[serde(default)]
    pub cpu_milli: Option<i64>,
    #[serde(default)]
    pub memory_bytes: Option<i64>,
    #[serde(default)]
    pub gpus: Option<i64>,
    #[serde(default)]
    pub servers: Option<i64>,
    /// Peak watts of the pool's powered servers.
    #[serde(default)]
    pub watts: Option<f64>,
}

/// The taint ironclaim puts on a node it drains; its presence marks the node
/// as being disrupted.
pub const DISRUPTING_TAINT: &str = "ironclaim.dev/disrupting";

/// The server label that names a hardware class for warm-spare floors.
pub const CLASS_LABEL: &str = "ironclaim.dev/class";

/// Servers kept powered on and idle so that a burst lands in seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct WarmPolicy {
    /// The label naming a server's class; [`CLASS_LABEL`] when None.
    #[serde(default)]
    pub class_label: Option<String>,
    /// Idle powered-on servers (or empty nodes) to keep, per class.
    #[serde(default)]
    pub floor: BTreeMap<String, u32>,
    /// Capacity to keep free on the pool's nodes and warm spares (cpu,
    /// memory, GPUs), so that a burst of pods this size schedules at once.
    #[serde(default)]
    pub headroom: Option<crate::resources::Resources>,
    /// When the static floor and the headroom apply; always when None.
    #[serde(default)]
    pub window: Option<crate::schedule::Window>,
    /// Sizes the floor from recent fresh demand as well
    /// ([`crate::warm::adaptive_floor`]); the static floor stays a minimum.
    #[serde(default)]
    pub adaptive: Option<AdaptiveFloor>,
}

/// The floor of a class follows the fresh demand of a look-back window, and
/// is raised ahead of demand that recurs at this time of day
/// ([`crate::warm::prewarm`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdaptiveFloor {
    /// How far back arrivals count.
    pub window_s: Seconds,
    /// Standard deviations of margin above the demand expected during one
    /// cold boot.
    #[serde(default = "one")]
    pub z: f64,
    /// How many past days the daily profile looks at; 0 turns pre-warming off.
    #[serde(default = "seven")]
    pub history_days: u32,
    /// On how many of those days the demand must have come at this time of
    /// day for servers to be powered on ahead of it.
    #[serde(default = "three")]
    pub min_days_seen: u32,
    /// The daily profile tells weekdays from weekend days: it looks at the
    /// past days of today's kind when at least `min_days_seen` are.
    #[serde(default)]
    pub weekly: bool,
}

fn one() -> f64 {
    1.0
}

fn three() -> u32 {
    3
}

fn seven() -> u32 {
    7
}

impl AdaptiveFloor {
    /// The look-back window when a pool sets none (the embedded day's sweep
    /// over 1h to 24h, docs/simulate.md: no window buys fewer misses, and
    /// longer ones cost more energy).
    pub const DEFAULT_WINDOW_S: Seconds = 4 * 3600;

    pub fn new(window_s: Seconds) -> Self {
        AdaptiveFloor { window_s, z: 1.0, history_days: 7, min_days_seen: 3, weekly: false }
    }

    /// How far back the floor looks at arrivals: its window, and with a
    /// daily profile its days and one more (a past day's window reaches
    /// two cold paths before its time of day).
    pub fn history_s(&self) -> Seconds {
        if self.history_days == 0 { self.window_s } else { self.window_s.max((Seconds::from(self.history_days) + 1) * 86_400) }
    }
}

/// A pod that needed a server of its own when it arrived: nothing already
/// running workload pods had room for it. One server's worth of fresh
/// demand, which adaptive warm floors are sized from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Arrival {
    /// When the pod was created.
    pub at_s: Seconds,
    /// The server its demand opened; its ServerPool and class are that
    /// server's.
    pub server: String,
    /// From the pod's creation; None: its ServerPool's default deadline.
    #[serde(default)]
    pub deadline_s: Option<Seconds>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DisruptionReason {
    Empty,
    Underutilized,
    Drifted,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BudgetNodes {
    Count(u32),
    /// Of the pool's nodes, rounded up.
    Percent(u32),
}

/// How many of a pool's nodes may be disrupted at once.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Budget {
    pub nodes: BudgetNodes,
    /// When it applies; always when None.
    #[serde(default)]
    pub window: Option<crate::schedule::Window>,
    /// The reasons it limits; all when empty.
    #[serde(default)]
    pub reasons: Vec<DisruptionReason>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DisruptionPolicy {
    /// How long a node must be empty or underused first; it can only
    /// lengthen a server's break-even time. None: break-even alone.
    #[serde(default)]
    pub consolidate_after_s: Option<Seconds>,
    /// `consolidateAfter: Never`: the pool's nodes are never consolidated.
    #[serde(default)]
    pub never: bool,
    /// The most restrictive active budget wins; none means 10% of nodes.
    #[serde(default)]
    pub budgets: Vec<Budget>,
    /// A drain that takes longer is abandoned and the node uncordoned.
    #[serde(default)]
    pub drain_timeout_s: Option<Seconds>,
    /// What becomes of a node once its server is powered off.
    #[serde(default)]
    pub node_after_power_off: NodeAfterPowerOff,
    /// Mark an underutilized node so that new pods go elsewhere and it
    /// empties with no eviction ([`crate::disruption::EMPTYING_TAINT`]).
    #[serde(default = "yes")]
    pub empty_by_attrition: bool,
}

impl Default for DisruptionPolicy {
    fn default() -> Self {
        DisruptionPolicy {
            consolidate_after_s: None,
            never: false,
            budgets: Vec::new(),
            drain_timeout_s: None,
            node_after_power_off: NodeAfterPowerOff::default(),
            empty_by_attrition: true,
        }
    }
}

/// What becomes of a node once its server is powered off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeAfterPowerOff {
    /// The Node object is deleted; the kubelet registers a new one when
    /// the server boots again.
    #[default]
    Delete,
    /// The Node object is kept, parked: marked suspended for other
    /// controllers, cordoned, and counted as no node until its kubelet is
    /// back from a new boot.
    Park,
}

/// Which servers a class of workloads may use, and how they become nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerPool {
    pub name: String,
    /// Higher weight is tried first.
    #[serde(default)]
    pub weight: i32,
    /// On the server's labels: which servers belong to this pool.
    #[serde(default)]
    pub requirements: Vec<Requirement>,
    /// Added to the node's labels.
    #[serde(default)]
    pub labels: Labels,
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Taints the node starts with and a readiness agent removes; pods
    /// need not tolerate them.
    #[serde(default)]
    pub startup_taints: Vec<Taint>,
    #[serde(default)]
    pub limits: Limits,
    /// Default deadline for pods that carry none.
    #[serde(default)]
    pub deadline_s: Option<Seconds>,
    #[serde(default)]
    pub warm: WarmPolicy,
    #[serde(default)]
    pub disruption: DisruptionPolicy,
}

impl ServerPool {
    pub fn new(name: &str) -> Self {
        ServerPool { name: name.to_string(), ..Default::default() }
    }

    pub fn admits(&self, server: &Server) -> bool {
        self.requirements.iter().all(|r| r.matches(&server.labels))
    }
}

/// The stage a claim in flight has reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Stage {
    Selected,
    PoweringOn,
    Booting,
    Joined,
    Ready,
}

/// A ServerClaim opened earlier and not yet Ready.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimInFlight {
    pub name: String,
    pub server: String,
    pub pool: String,
    pub stage: Stage,
    /// When the claim entered its current stage.
    pub stage_started_s: Seconds,
    /// The pods (`namespace/name`) it was opened for: while they wait, the
    /// room they need on it is theirs, not a later pod's.
    #[serde(default)]
    pub pods: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DaemonSet {
    pub namespace: String,
    pub name: String,
    /// The pod template: requests, node selector, affinity, tolerations.
    pub template: Pod,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PodDisruptionBudget {
    pub namespace: String,
    pub name: String,
    pub selector: LabelSelector,
    /// How many more matching pods may be evicted now
    /// (`status.disruptionsAllowed`, or computed from min/max).
    pub disruptions_allowed: i64,
}

/// The pods of a snapshot. Cloning is cheap: each pod is shared with the
/// copies until one of them changes it, so a driver that keeps its pods
/// (the controller's index, the simulator's cluster) gives every step a
/// snapshot without copying each pod of the cluster.
#[derive(Clone, Default, PartialEq)]
pub struct Pods(Vec<Arc<Pod>>);

/// The pods of a [`Pods`], in order.
pub type PodsIter<'a> = std::iter::Map<std::slice::Iter<'a, Arc<Pod>>, fn(&'a Arc<Pod>) -> &'a Pod>;

impl Pods {
    /// Adds a pod, or a pod shared with its keeper.
    pub fn push(&mut self, pod: impl Into<Arc<Pod>>) {
        self.0.push(pod.into());
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn get(&self, i: usize) -> Option<&Pod> {
        self.0.get(i).map(|p| &**p)
    }

    /// The last pod, to change: copied first when shared.
    pub fn last_mut(&mut self) -> Option<&mut Pod> {
        self.0.last_mut().map(Arc::make_mut)
    }

    pub fn iter(&self) -> PodsIter<'_> {
        fn read(pod: &Arc<Pod>) -> &Pod {
            pod
        }
        self.0.iter().map(read as fn(&Arc<Pod>) -> &Pod)
    }

    /// Each pod to change: a pod shared with another copy is copied first.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Pod> {
        self.0.iter_mut().map(Arc::make_mut)
    }

    /// The pods `pick` chooses, to change: only those are copied when
    /// shared.
    pub fn iter_mut_where(&mut self, mut pick: impl FnMut(&Pod) -> bool) -> impl Iterator<Item = &mut Pod> {
        self.0.iter_mut().filter(move |p| pick(p)).map(Arc::make_mut)
    }

    pub fn clear(&mut self) {
        self.0.clear();
    }

    pub fn retain(&mut self, mut keep: impl FnMut(&Pod) -> bool) {
        self.0.retain(|p| keep(p));
    }
}

impl std::ops::Index<usize> for Pods {
    type Output = Pod;
    fn index(&self, i: usize) -> &Pod {
        &self.0[i]
    }
}

impl std::ops::IndexMut<usize> for Pods {
    /// Copies the pod first when another copy shares it.
    fn index_mut(&mut self, i: usize) -> &mut Pod {
        Arc::make_mut(&mut self.0[i])
    }
}

impl<'a> IntoIterator for &'a Pods {
    type Item = &'a Pod;
    type IntoIter = PodsIter<'a>;
    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl From<Vec<Pod>> for Pods {
    fn from(pods: Vec<Pod>) -> Self {
        pods.into_iter().collect()
    }
}

impl<P: Into<Arc<Pod>>> FromIterator<P> for Pods {
    fn from_iter<I: IntoIterator<Item = P>>(iter: I) -> Self {
        Pods(iter.into_iter().map(Into::into).collect())
    }
}

impl<P: Into<Arc<Pod>>> Extend<P> for Pods {
    fn extend<I: IntoIterator<Item = P>>(&mut self, iter: I) {
        self.0.extend(iter.into_iter().map(Into::into));
    }
}

impl Serialize for Pods {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> Deserialize<'de> for Pods {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<Pod>::deserialize(deserializer).map(Pods::from)
    }
}

impl std::fmt::Debug for Pods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Everything the core decides from.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    #[serde(default)]
    pub nodes: Vec<Node>,
    /// Namespace labels by namespace name, for `namespaceSelector`. A
    /// namespace missing here has no labels, as kube-scheduler reads one
    /// it does not know.
    #[serde(default)]
    pub namespaces: BTreeMap<String, Labels>,
    #[serde(default)]
    pub pods: Pods,
    #[serde(default)]
    pub daemonsets: Vec<DaemonSet>,
    #[serde(default)]
    pub pdbs: Vec<PodDisruptionBudget>,
    #[serde(default)]
    pub pools: Vec<ServerPool>,
    #[serde(default)]
    pub servers: Vec<Server>,
    #[serde(default)]
    pub claims: Vec<ClaimInFlight>,
    /// Peak watts the whole fleet may draw, if capped.
    #[serde(default)]
    pub power_budget_watts: Option<f64>,
    /// How often servers may change power: per minute per group, and power
    /// cycles per server per day ([`crate::transitions`]).
    #[serde(default)]
    pub transition_limits: crate::transitions::TransitionLimits,
    /// Recent fresh demand, for adaptive warm floors, and the days before
    /// for their daily profile. Drivers may pass more than any window needs;
    /// older arrivals are ignored.
    #[serde(default)]
    pub arrivals: Vec<Arrival>,
    /// Since when `arrivals` is complete (the driver's start, or 0): a rate
    /// is measured over no longer than that.
    #[serde(default)]
    pub arrivals_since_s: Seconds,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pod's shape is shared until one pod writes to it: the write gives
    /// that pod its own copy, and the others keep theirs. The written form
    /// is flat, and reads back equal.
    #[test]
    fn a_write_through_one_pod_never_reaches_another_of_its_shape() {
        let mut a = Pod::new("ns", "a", Resources::new(1000, 1 << 30)).with_labels(&[("app", "web")]);
        let mut b = a.clone();
        b.name = "b".into();
        assert!(a.shape.same(&b.shape));
        b.priority = 7;
        assert!(!a.shape.same(&b.shape));
        assert_eq!((a.priority, b.priority, &a.labels, &b.labels), (0, 7, &b.labels, &a.labels));
        a.requests.cpu_milli = 2000;
        assert_eq!((a.requests.cpu_milli, b.requests.cpu_milli), (2000, 1000));

        let written = serde_json::to_value(&b).expect("written");
        assert_eq!(written["priority"], 7, "flat: {written}");
        assert_eq!(written["labels"]["app"], "web");
        assert!(written.get("shape").is_none());
        let read: Pod = serde_json::from_value(written).expect("read");
        assert_eq!(read, b);
    }

    /// The GPUs take their stated part of the range, or 80 % of it unstated;
    /// a server without GPUs draws the whole range with its cpu.
    #[test]
    fn a_server_draws_its_range_in_proportion_to_the_cpu_and_gpus_in_use() {
        let mut gpu_server = Resources::new(100_000, 1 << 40);
        gpu_server.set_extended(crate::resources::GPU, 4);
        let stated = PowerProfile { gpu_watts: Some(800.0), ..PowerProfile::new(200.0, 1200.0, 300.0, 10.0) };
        assert_eq!(stated.load_watts(&gpu_server, 50_000, 2_000), 100.0 + 400.0);
        assert_eq!(stated.load_watts(&gpu_server, 200_000, 9_000), 1000.0, "no more than the range");
        let unstated = PowerProfile::new(200.0, 1200.0, 300.0, 10.0);
        assert_eq!(unstated.gpu_range_watts(&gpu_server), 800.0);
        let too_much = PowerProfile { gpu_watts: Some(5000.0), ..unstated };
        assert_eq!(too_much.gpu_range_watts(&gpu_server), 1000.0);
        let cpu_server = Resources::new(100_000, 1 << 40);
        assert_eq!(stated.gpu_range_watts(&cpu_server), 0.0);
        assert_eq!(stated.load_watts(&cpu_server, 25_000, 0), 250.0);
        assert_eq!(stated.compared_watts(&gpu_server, 2_000), 200.0 + 400.0, "idle and the stated GPUs' draw");
        assert_eq!(unstated.compared_watts(&gpu_server, 2_000), 200.0, "unstated GPUs draw alike everywhere");
    }
}
