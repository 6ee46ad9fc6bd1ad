//! Pods and pod templates as the core sees them.

use crate::duration::parse_duration_s;
use crate::error::{ConvertError, Result};
use crate::resources::Amounts;
use crate::selector::{label_selector, node_selector_term, taint_effect};
use ironclaim_core::labels::TolerationOperator;
use ironclaim_core::model::{HostPort, InclusionPolicy, Owner, PodAffinityTerm, PodPhase, TopologySpread, WhenUnsatisfiable};
use ironclaim_core::{Labels, Operator, Requirement, Resources, Toleration};
use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// How long after creation the pod should be running: `10m`, `1h`, `90s`.
pub const DEADLINE_ANNOTATION: &str = "ironclaim.dev/deadline";
/// `"true"`: never evict the pod to consolidate or power off its node.
pub const DO_NOT_DISRUPT_ANNOTATION: &str = "ironclaim.dev/do-not-disrupt";
/// Karpenter's spelling, honoured the same way.
pub const KARPENTER_DO_NOT_DISRUPT_ANNOTATION: &str = "karpenter.sh/do-not-disrupt";
/// Cluster Autoscaler's spelling: `"false"` means do not disrupt.
pub const SAFE_TO_EVICT_ANNOTATION: &str = "cluster-autoscaler.kubernetes.io/safe-to-evict";
/// The label a Deployment's ReplicaSets and pods carry with the template hash.
pub const POD_TEMPLATE_HASH_LABEL: &str = "pod-template-hash";

/// Converts a pod as the API server or `kubectl get -o yaml` gives it.
///
/// # Guarantees
/// - `requests` are the pod's effective requests as kube-scheduler computes
///   them: the larger of (containers + sidecars) and the largest init
///   container (plus the sidecars started before it), then pod overhead;
///   a container's limit stands in for a request it does not set; pod-level
///   `spec.resources` replace the containers' cpu and memory; one pod slot.
/// - `workload` names the owning controller, a Deployment's name for pods of
///   its ReplicaSets (from the `pod-template-hash` label).
///
/// # Errors
/// The first field that cannot be read, with its path in the object.
pub fn pod_from_k8s(pod: &k8s::Pod) -> Result<ironclaim_core::Pod> {
    let meta = &pod.metadata;
    let name = meta.name.clone().ok_or(ConvertError::Missing { path: "metadata.name".into() })?;
    let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_string());
    let spec = pod.spec.as_ref().ok_or(ConvertError::Missing { path: "spec".into() })?;
    let mut out = convert(&namespace, &name, meta, spec, "metadata", "spec")?;
    out.uid = meta.uid.clone();
    let status = pod.status.as_ref();
    out.phase = match status.and_then(|s| s.phase.as_deref()) {
        None | Some("Pending") => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        // The node stopped reporting: the pod still holds its place there.
        Some("Unknown") if out.node_name.is_some() => PodPhase::Running,
        Some("Unknown") => PodPhase::Pending,
        Some(other) => {
            return Err(ConvertError::UnknownValue { path: "status.phase".into(), what: "pod phase", value: other.into() });
        }
    };
    out.terminating = meta.deletion_timestamp.is_some();
    if out.node_name.is_some() {
        let (holds, resize) = held_and_resize(spec, status, &out.requests, out.created_s)?;
        out.requests = holds;
        out.resize = resize.map(Box::new);
    }
    // A do-not-disrupt duration runs from the pod's start, once it has one.
    if let (Some(until), Some(started)) = (out.do_not_disrupt_until_s, status.and_then(|s| s.start_time.as_ref())) {
        let started = started.0.as_second().max(0) as u64;
        out.do_not_disrupt_until_s = Some(until - out.created_s + started);
    }
    Ok(out)
}

/// Converts a controller's pod template into the pod it would create,
/// pending and unbound. `path` is where the template sits (`spec.template`).
///
/// # Errors
/// The first field that cannot be read, with its path in the controller.
pub fn pod_from_template(template: &k8s::PodTemplateSpec, namespace: &str, name: &str, path: &str) -> Result<ironclaim_core::Pod> {
    let spec = template.spec.as_ref().ok_or(ConvertError::Missing { path: format!("{path}.spec") })?;
    let empty = ObjectMeta::default();
    let meta = template.metadata.as_ref().unwrap_or(&empty);
    convert(namespace, name, meta, spec, &format!("{path}.metadata"), &format!("{path}.spec"))
}

fn convert(namespace: &str, name: &str, meta: &ObjectMeta, spec: &k8s::PodSpec, meta_path: &str, spec_path: &str) -> Result<ironclaim_core::Pod> {
    let labels: Labels = meta.labels.clone().unwrap_or_default().into();
    let mut pod = ironclaim_core::Pod::new(namespace, name, effective_requests(spec, spec_path)?);
    pod.node_name = spec.node_name.clone().filter(|n| !n.is_empty());
    pod.scheduling_gated = spec.scheduling_gates.as_ref().is_some_and(|g| !g.is_empty());
    pod.node_selector = spec.node_selector.clone().unwrap_or_default().into();
    pod.tolerations = tolerations(spec.tolerations.as_deref().unwrap_or_default(), &format!("{spec_path}.tolerations"))?.into();
    if let Some(affinity) = &spec.affinity {
        let at = format!("{spec_path}.affinity");
        if let Some(required) = affinity.node_affinity.as_ref().and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()) {
            let at = format!("{at}.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms");
            pod.node_affinity =
                required.node_selector_terms.iter().enumerate().map(|(i, t)| node_selector_term(t, &format!("{at}[{i}]"))).collect::<Result<_>>()?;
        }
        if let Some(terms) = affinity.pod_affinity.as_ref().and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()) {
            let at = format!("{at}.podAffinity.requiredDuringSchedulingIgnoredDuringExecution");
            pod.pod_affinity = affinity_terms(terms, &labels, &at)?;
        }
        if let Some(terms) = affinity.pod_anti_affinity.as_ref().and_then(|a| a.required_during_scheduling_ignored_during_execution.as_ref()) {
            let at = format!("{at}.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution");
            pod.pod_anti_affinity = affinity_terms(terms, &labels, &at)?;
        }
    }
    pod.topology_spread = spread_constraints(
        spec.topology_spread_constraints.as_deref().unwrap_or_default(),
        &labels,
        &format!("{spec_path}.topologySpreadConstraints"),
    )?;
    pod.host_ports = host_ports(spec, spec_path)?;
    pod.priority = spec.priority.unwrap_or(0);
    pod.owner = owner(meta.owner_references.as_deref().unwrap_or_default()).map(|o| Owner { kind: o.kind.clone(), name: o.name.clone() });
    pod.workload = pod.owner.as_ref().map(|o| workload_name(o, &labels));
    pod.created_s = meta.creation_timestamp.as_ref().map_or(0, |t| t.0.as_second().max(0) as u64);
    let annotations = meta.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let annotation_path = |key: &str| format!("{meta_path}.annotations[{key:?}]");
    if let Some(text) = annotation(DEADLINE_ANNOTATION) {
        let seconds = parse_duration_s(text).map_err(|why| ConvertError::Duration {
            path: annotation_path(DEADLINE_ANNOTATION),
            text: text.to_string(),
            why,
        })?;
        pod.deadline_s = Some(seconds);
    }
    let own = match annotation(DO_NOT_DISRUPT_ANNOTATION) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(ConvertError::invalid(
                annotation_path(DO_NOT_DISRUPT_ANNOTATION),
                format!("expected \"true\" or \"false\", found {other:?}"),
            ));
        }
    };
    // Karpenter's: "true", or on a pod a duration after its start at which
    // the protection ends (re-based on the start time by `pod_from_k8s`).
    let karpenter = match annotation(KARPENTER_DO_NOT_DISRUPT_ANNOTATION) {
        None | Some("false") => false,
        Some("true") => true,
        Some(text) => {
            let seconds = parse_duration_s(text).map_err(|why| ConvertError::Duration {
                path: annotation_path(KARPENTER_DO_NOT_DISRUPT_ANNOTATION),
                text: text.to_string(),
                why: format!("expected \"true\" or a duration such as \"30m\": {why}"),
            })?;
            pod.do_not_disrupt_until_s = Some(pod.created_s.saturating_add(seconds));
            false
        }
    };
    pod.do_not_disrupt = own || karpenter || annotation(SAFE_TO_EVICT_ANNOTATION) == Some("false");
    pod.labels = labels;
    Ok(pod)
}

/// The pod's effective requests as kube-scheduler computes them, with one
/// pod slot. `spec_path` is where the pod spec sits, for errors.
///
/// # Errors
/// A quantity that does not parse, or sums beyond any machine.
pub fn effective_requests(spec: &k8s::PodSpec, spec_path: &str) -> Result<Resources> {
    effective(spec, spec_path, &[])
}

/// The effective requests with the containers of `held` (by index) at the
/// amounts given there instead of their spec's.
fn effective(spec: &k8s::PodSpec, spec_path: &str, held: &[Option<Amounts>]) -> Result<Resources> {
    let mut sum = Amounts::default();
    for (i, c) in spec.containers.iter().enumerate() {
        let at = format!("{spec_path}.containers[{i}]");
        let requests = match held.get(i) {
            Some(Some(amounts)) => amounts.clone(),
            _ => container_requests(c, &at)?,
        };
        sum.add(&requests, &format!("{spec_path}.containers"))?;
    }
    // Sidecars (restartable init containers) run beside everything started
    // after them; a plain init container runs alone with the sidecars
    // started before it.
    let mut sidecars = Amounts::default();
    let mut init_peak = Amounts::default();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        let at = format!("{spec_path}.initContainers[{i}]");
        let requests = container_requests(c, &at)?;
        if is_sidecar(c) {
            sum.add(&requests, &format!("{spec_path}.initContainers"))?;
            sidecars.add(&requests, &format!("{spec_path}.initContainers"))?;
            init_peak.max_with(&sidecars);
        } else {
            let mut alone = requests;
            alone.add(&sidecars, &format!("{spec_path}.initContainers"))?;
            init_peak.max_with(&alone);
        }
    }
    sum.max_with(&init_peak);
    if let Some(pod_level) = &spec.resources {
        let at = format!("{spec_path}.resources");
        let mut requests = Amounts::parse(pod_level.requests.as_ref(), &format!("{at}.requests"))?;
        requests.default_from(&Amounts::parse(pod_level.limits.as_ref(), &format!("{at}.limits"))?);
        for name in ["cpu", "memory"] {
            if let Some(amount) = requests.get(name) {
                sum.set(name, amount);
            }
        }
    }
    let overhead = Amounts::parse(spec.overhead.as_ref(), &format!("{spec_path}.overhead"))?;
    sum.add(&overhead, &format!("{spec_path}.overhead"))?;
    Ok(Resources { pods: 1, ..sum.to_resources(false) })
}

/// A container's requests, a limit standing in for a request it does not set.
fn container_requests(c: &k8s::Container, at: &str) -> Result<Amounts> {
    let resources = c.resources.as_ref();
    let mut requests = Amounts::parse(resources.and_then(|r| r.requests.as_ref()), &format!("{at}.resources.requests"))?;
    let limits = Amounts::parse(resources.and_then(|r| r.limits.as_ref()), &format!("{at}.resources.limits"))?;
    requests.default_from(&limits);
    Ok(requests)
}

/// The kubelet's condition on a pod whose in-place resize it has not
/// applied.
pub const RESIZE_PENDING_CONDITION: &str = "PodResizePending";

/// What a bound pod holds on its node, and the resize it waits for, as
/// kube-scheduler reads them: per container, while the resize is
/// infeasible, the larger of what the kubelet reports applied and
/// allocated; otherwise the larger of those and the spec (a resize that
/// can still be applied is counted at its new size). A resize waits when
/// the pod's `PodResizePending` condition is True with reason `Infeasible`
/// or `Deferred` and the spec asks for more than the kubelet applied or
/// allocated.
fn held_and_resize(
    spec: &k8s::PodSpec,
    status: Option<&k8s::PodStatus>,
    desired: &Resources,
    created_s: u64,
) -> Result<(Resources, Option<ironclaim_core::model::Resize>)> {
    use ironclaim_core::model::{Resize, ResizeReason};
    let Some(status) = status else { return Ok((desired.clone(), None)) };
    let pending = status.conditions.iter().flatten().find(|c| c.type_ == RESIZE_PENDING_CONDITION);
    let reason = pending.filter(|c| c.status == "True").and_then(|c| match c.reason.as_deref() {
        Some("Infeasible") => Some(ResizeReason::Infeasible),
        Some("Deferred") => Some(ResizeReason::Deferred),
        _ => None,
    });
    let infeasible = pending.is_some_and(|c| c.reason.as_deref() == Some("Infeasible"));
    let statuses = status.container_statuses.as_deref().unwrap_or_default();
    // What the kubelet applied or allocated, and what kube-scheduler counts.
    let mut applied_or_allocated: Vec<Option<Amounts>> = Vec::with_capacity(spec.containers.len());
    let mut held: Vec<Option<Amounts>> = Vec::with_capacity(spec.containers.len());
    for (i, c) in spec.containers.iter().enumerate() {
        let Some(cs) = statuses.iter().find(|cs| cs.name == c.name) else {
            applied_or_allocated.push(None);
            held.push(None);
            continue;
        };
        let at = format!("status.containerStatuses[{}]", statuses.iter().position(|x| x.name == c.name).unwrap_or(i));
        let applied = cs.resources.as_ref().and_then(|r| r.requests.as_ref());
        let allocated = cs.allocated_resources.as_ref();
        if applied.is_none() && allocated.is_none() {
            applied_or_allocated.push(None);
            held.push(None);
            continue;
        }
        let mut amounts = Amounts::parse(applied, &format!("{at}.resources.requests"))?;
        amounts.max_with(&Amounts::parse(allocated, &format!("{at}.allocatedResources"))?);
        applied_or_allocated.push(Some(amounts.clone()));
        if !infeasible {
            amounts.max_with(&container_requests(c, &format!("spec.containers[{i}]"))?);
        }
        held.push(Some(amounts));
    }
    if held.iter().all(Option::is_none) {
        return Ok((desired.clone(), None));
    }
    let holds = effective(spec, "spec", &held)?;
    let given = effective(spec, "spec", &applied_or_allocated)?;
    let resize = reason.filter(|_| desired.fits_in(&given).is_err()).map(|reason| Resize {
        desired: desired.clone(),
        reason,
        since_s: pending.and_then(|c| c.last_transition_time.as_ref()).map_or(created_s, |t| t.0.as_second().max(0) as u64),
        given: (given != holds).then(|| given.clone()),
    });
    Ok((holds, resize))
}

fn is_sidecar(c: &k8s::Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

fn tolerations(list: &[k8s::Toleration], path: &str) -> Result<Vec<Toleration>> {
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("{path}[{i}]");
            let operator = match t.operator.as_deref() {
                None | Some("") | Some("Equal") => TolerationOperator::Equal,
                Some("Exists") => TolerationOperator::Exists,
                Some(other) => {
                    return Err(ConvertError::UnknownValue { path: format!("{at}.operator"), what: "toleration operator", value: other.into() });
                }
            };
            let effect = match t.effect.as_deref() {
                None | Some("") => None,
                Some(e) => Some(taint_effect(e, &format!("{at}.effect"))?),
            };
            Ok(Toleration { key: t.key.clone().unwrap_or_default(), operator, value: t.value.clone().unwrap_or_default(), effect })
        })
        .collect()
}

/// Required pod (anti-)affinity terms. `matchLabelKeys` and
/// `mismatchLabelKeys` become `In` and `NotIn` requirements on the pod's own
/// label values, as the API server merges them.
fn affinity_terms(terms: &[k8s::PodAffinityTerm], own_labels: &Labels, path: &str) -> Result<Vec<PodAffinityTerm>> {
    terms
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let at = format!("{path}[{i}]");
            let mut selector = t.label_selector.as_ref().map(|s| label_selector(s, &format!("{at}.labelSelector"))).transpose()?;
            if let Some(selector) = selector.as_mut() {
                merge_label_keys(selector, t.match_label_keys.as_deref().unwrap_or_default(), Operator::In, own_labels);
                merge_label_keys(selector, t.mismatch_label_keys.as_deref().unwrap_or_default(), Operator::NotIn, own_labels);
            }
            if t.topology_key.is_empty() {
                return Err(ConvertError::Missing { path: format!("{at}.topologyKey") });
            }
            let namespace_selector = t.namespace_selector.as_ref().map(|s| label_selector(s, &format!("{at}.namespaceSelector"))).transpose()?;
            Ok(PodAffinityTerm {
                label_selector: selector,
                namespaces: t.namespaces.clone().unwrap_or_default(),
                namespace_selector,
                topology_key: t.topology_key.clone(),
            })
        })
        .collect()
}

fn merge_label_keys(selector: &mut ironclaim_core::LabelSelector, keys: &[String], op: Operator, own_labels: &Labels) {
    for key in keys {
        if let Some(value) = own_labels.get(key) {
            selector.match_expressions.push(Requirement { key: key.clone(), operator: op, values: vec![value.clone()] });
        }
    }
}

fn spread_constraints(list: &[k8s::TopologySpreadConstraint], own_labels: &Labels, path: &str) -> Result<Vec<TopologySpread>> {
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let at = format!("{path}[{i}]");
            let max_skew = u32::try_from(c.max_skew)
                .ok()
                .filter(|s| *s > 0)
                .ok_or_else(|| ConvertError::invalid(format!("{at}.maxSkew"), format!("must be greater than 0, found {}", c.max_skew)))?;
            let when_unsatisfiable = match c.when_unsatisfiable.as_str() {
                "DoNotSchedule" => WhenUnsatisfiable::DoNotSchedule,
                "ScheduleAnyway" => WhenUnsatisfiable::ScheduleAnyway,
                other => {
                    return Err(ConvertError::UnknownValue {
                        path: format!("{at}.whenUnsatisfiable"),
                        what: "whenUnsatisfiable",
                        value: other.into(),
                    });
                }
            };
            let min_domains = c
                .min_domains
                .map(|m| {
                    u32::try_from(m)
                        .ok()
                        .filter(|m| *m > 0)
                        .ok_or_else(|| ConvertError::invalid(format!("{at}.minDomains"), format!("must be greater than 0, found {m}")))
                })
                .transpose()?;
            let mut selector = c.label_selector.as_ref().map(|s| label_selector(s, &format!("{at}.labelSelector"))).transpose()?;
            if let Some(selector) = selector.as_mut() {
                merge_label_keys(selector, c.match_label_keys.as_deref().unwrap_or_default(), Operator::In, own_labels);
            }
            if c.topology_key.is_empty() {
                return Err(ConvertError::Missing { path: format!("{at}.topologyKey") });
            }
            let policy = |value: Option<&str>, field: &'static str, default: InclusionPolicy| match value {
                None => Ok(default),
                Some("Honor") => Ok(InclusionPolicy::Honor),
                Some("Ignore") => Ok(InclusionPolicy::Ignore),
                Some(other) => Err(ConvertError::UnknownValue { path: format!("{at}.{field}"), what: field, value: other.into() }),
            };
            Ok(TopologySpread {
                max_skew,
                topology_key: c.topology_key.clone(),
                when_unsatisfiable,
                label_selector: selector,
                min_domains,
                node_affinity_policy: policy(c.node_affinity_policy.as_deref(), "nodeAffinityPolicy", InclusionPolicy::Honor)?,
                node_taints_policy: policy(c.node_taints_policy.as_deref(), "nodeTaintsPolicy", InclusionPolicy::Ignore)?,
            })
        })
        .collect()
}

/// Host ports of the containers and sidecars. With `hostNetwork` every
/// container port is a host port, as the API server defaults it.
fn host_ports(spec: &k8s::PodSpec, spec_path: &str) -> Result<Vec<HostPort>> {
    let host_network = spec.host_network == Some(true);
    let containers = spec.containers.iter().enumerate().map(|(i, c)| (format!("{spec_path}.containers[{i}]"), c));
    let sidecars = spec
        .init_containers
        .iter()
        .flatten()
        .enumerate()
        .filter(|(_, c)| is_sidecar(c))
        .map(|(i, c)| (format!("{spec_path}.initContainers[{i}]"), c));
    let mut out = Vec::new();
    for (at, c) in containers.chain(sidecars) {
        for (j, p) in c.ports.iter().flatten().enumerate() {
            let port = match p.host_port {
                Some(port) if port != 0 => port,
                _ if host_network => p.container_port,
                _ => continue,
            };
            let port = u16::try_from(port)
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| ConvertError::invalid(format!("{at}.ports[{j}].hostPort"), format!("not a port number: {port}")))?;
            out.push(HostPort {
                port,
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_string()),
                host_ip: p.host_ip.clone().unwrap_or_default(),
            });
        }
    }
    Ok(out)
}

/// The controller among the owners, else the first owner.
pub(crate) fn owner(refs: &[OwnerReference]) -> Option<&OwnerReference> {
    refs.iter().find(|r| r.controller == Some(true)).or_else(|| refs.first())
}

/// The workload a pod belongs to: its owner, or the Deployment behind a
/// ReplicaSet named `<deployment>-<pod-template-hash>`.
pub(crate) fn workload_name(owner: &Owner, labels: &Labels) -> String {
    if owner.kind == "ReplicaSet"
        && let Some(hash) = labels.get(POD_TEMPLATE_HASH_LABEL)
        && let Some(deployment) = owner.name.strip_suffix(hash.as_str()).and_then(|n| n.strip_suffix('-'))
        && !deployment.is_empty()
    {
        return deployment.to_string();
    }
    owner.name.clone()
}
