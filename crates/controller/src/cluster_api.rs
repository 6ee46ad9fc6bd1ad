//! Cluster API: a Server of `spec.provider.type: ClusterAPI` is one Machine
//! of a MachineDeployment, to be. Powering it on adds a replica and takes
//! the new Machine for the server (the annotation `ironclaim.dev/server`
//! on the Machine); powering it off marks exactly that Machine with
//! `cluster.x-k8s.io/delete-machine` and then removes the replica, so the
//! MachineSet deletes that Machine and no other. The Cluster API
//! controllers and the infrastructure provider under them (CAPM3, ...) do
//! the rest.
//!
//! # Guarantees
//! - A replica is added or removed only on the MachineDeployment's
//!   resourceVersion just read (a 409 reads again), never past the
//!   node-group bounds the Cluster Autoscaler annotations set
//!   (`cluster.x-k8s.io/cluster-api-autoscaler-node-group-{min,max}-size`).
//! - A Machine is taken for a server on its own resourceVersion, so two
//!   servers never take one Machine; a Machine nobody took and not yet
//!   running (a replica added before a restart) is taken by the next
//!   power-on of the deployment instead of adding another. A running
//!   Machine no server took is never taken, so never removed.
//! - Scaling one MachineDeployment is one at a time in this controller.
//! - The Machine taken also gets the label
//!   `node.cluster.x-k8s.io/ironclaim-server`, which Cluster API's Machine
//!   controller copies onto the Machine's Node: it links the node to its
//!   server as a bootstrap's label would, with no write of ironclaim's to
//!   the Node and nothing lost to a restart.
//! - A power-off marks its Machine only once the node group may shrink,
//!   and a mark whose replica was not removed (a restart in between) is
//!   finished by the next power-off or taken back by the next power-on;
//!   never is a Machine left marked for the MachineSet to take later.
//!
//! Machine phases: `Pending` and `Provisioning` read as `PoweringOn`,
//! `Provisioned`, `Running` and `Updating` as `On` (a power-on is
//! confirmed once the infrastructure is provisioned: boot and join are
//! the claim's next stages), `Deleting` as `PoweringOff`, no Machine as
//! `Off`; `Failed` fails a power-on with the Machine's failure reason and
//! conditions.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::{MachineDeploymentRef, PowerState};
use ironclaim_k8s::api::serverclaim::FailureReason;
use ironclaim_k8s::node::CLUSTER_API_SERVER_LABEL;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::provider::{Power, PowerError, PowerFuture};

/// The annotation on a Machine that names the Server it is.
pub const MACHINE_SERVER_ANNOTATION: &str = "ironclaim.dev/server";
/// The annotation that makes a MachineSet delete this Machine first when
/// it has too many.
pub const DELETE_MACHINE_ANNOTATION: &str = "cluster.x-k8s.io/delete-machine";
/// The label Cluster API puts on a MachineDeployment's Machines.
pub const DEPLOYMENT_NAME_LABEL: &str = "cluster.x-k8s.io/deployment-name";
/// The node-group bounds of the Cluster Autoscaler's Cluster API provider.
pub const MIN_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-min-size";
pub const MAX_SIZE_ANNOTATION: &str = "cluster.x-k8s.io/cluster-api-autoscaler-node-group-max-size";

/// `cluster.x-k8s.io/v1beta2` MachineDeployment.
pub fn machinedeployment_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "MachineDeployment"), "machinedeployments")
}

/// `cluster.x-k8s.io/v1beta2` Machine.
pub fn machine_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("cluster.x-k8s.io", "v1beta2", "Machine"), "machines")
}

/// Power through Cluster API MachineDeployments.
pub struct ClusterApiPower {
    client: Client,
    /// How long a power-on waits for its Machine's infrastructure, and a
    /// power-off for its Machine to go.
    confirm_timeout: Duration,
    poll: Duration,
    /// One scaling at a time per MachineDeployment.
    scaling: Mutex<HashMap<(String, String), ScaleLock>>,
}

/// Held while one MachineDeployment is scaled.
type ScaleLock = Arc<tokio::sync::Mutex<()>>;

fn error(reason: FailureReason, label: &'static str, message: impl Into<String>) -> PowerError {
    PowerError { reason, label, message: message.into() }
}

fn api_error(err: &kube::Error, message: String) -> PowerError {
    let (reason, label) = match err {
        kube::Error::Api(status) if status.code == 404 => (FailureReason::ServerUnavailable, "not_found"),
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => (FailureReason::PowerActionFailed, "forbidden"),
        kube::Error::Api(status) if status.code == 409 => (FailureReason::PowerActionFailed, "conflict"),
        kube::Error::Api(status) if status.code == 422 => (FailureReason::PowerActionFailed, "refused"),
        _ => (FailureReason::BmcUnreachable, "api_unreachable"),
    };
    PowerError { reason, label, message }
}

fn conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 409)
}

/// What a Machine says, for power.
#[derive(Debug, Clone, PartialEq)]
pub struct MachineView {
    pub name: String,
    pub resource_version: String,
    pub server: Option<String>,
    pub phase: String,
    pub deleting: bool,
    pub marked_for_deletion: bool,
    pub node: Option<String>,
    /// Why it failed, from its deprecated failure fields and its False
    /// conditions.
    pub failure: Option<String>,
}

impl MachineView {
    pub fn of(machine: &DynamicObject) -> Self {
        let annotations = machine.annotations();
        let status = &machine.data["status"];
        let phase = status["phase"].as_str().unwrap_or("Pending").to_string();
        let mut why = Vec::new();
        let failed = &status["deprecated"]["v1beta1"];
        for field in ["failureReason", "failureMessage"] {
            if let Some(text) = failed[field].as_str().filter(|t| !t.is_empty()) {
                why.push(text.to_string());
            }
        }
        for condition in status["conditions"].as_array().into_iter().flatten() {
            if condition["status"] == "False" && matches!(condition["type"].as_str(), Some("InfrastructureReady" | "BootstrapConfigReady" | "Ready"))
            {
                let message = condition["message"].as_str().unwrap_or_default();
                why.push(format!(
                    "{} {}: {message}",
                    condition["type"].as_str().unwrap_or_default(),
                    condition["reason"].as_str().unwrap_or_default()
                ));
            }
        }
        MachineView {
            name: machine.name_any(),
            resource_version: machine.resource_version().unwrap_or_default(),
            server: annotations.get(MACHINE_SERVER_ANNOTATION).cloned(),
            deleting: machine.metadata.deletion_timestamp.is_some() || phase == "Deleting" || phase == "Deleted",
            marked_for_deletion: annotations.contains_key(DELETE_MACHINE_ANNOTATION),
            node: status["nodeRef"]["name"].as_str().map(str::to_string),
            failure: (!why.is_empty()).then(|| why.join("; ")),
            phase,
        }
    }

    /// The power state its phase reads as.
    pub fn power_state(&self) -> PowerState {
        if self.deleting {
            return PowerState::PoweringOff;
        }
        match self.phase.as_str() {
            "Pending" | "Provisioning" => PowerState::PoweringOn,
            "Provisioned" | "Running" | "Updating" => PowerState::On,
            _ => PowerState::Unknown,
        }
    }
}

/// The replicas and node-group bounds of a MachineDeployment.
#[derive(Debug, Clone, PartialEq)]
pub struct Scale {
    pub replicas: i64,
    pub min: i64,
    pub max: Option<i64>,
    pub resource_version: String,
}

impl Scale {
    pub fn of(deployment: &DynamicObject) -> Result<Self, String> {
        let annotations = deployment.annotations();
        let bound = |key: &str| -> Result<Option<i64>, String> {
            annotations
                .get(key)
                .map(|v| v.trim().parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| format!("annotation {key} is {v:?}, not a whole number")))
                .transpose()
        };
        let min = bound(MIN_SIZE_ANNOTATION)?.unwrap_or(0);
        let max = bound(MAX_SIZE_ANNOTATION)?;
        if let Some(max) = max
            && max < min
        {
            return Err(format!("annotation {MAX_SIZE_ANNOTATION} ({max}) is below {MIN_SIZE_ANNOTATION} ({min})"));
        }
        Ok(Scale {
            // The API server defaults replicas (to 1, or to the min size
            // with the autoscaler annotations) before it is stored.
            replicas: deployment.data["spec"]["replicas"].as_i64().unwrap_or(1),
            min,
            max,
            resource_version: deployment.resource_version().unwrap_or_default(),
        })
    }
}

impl ClusterApiPower {
    pub fn new(client: Client, confirm_timeout: Duration) -> Self {
        ClusterApiPower { client, confirm_timeout, poll: Duration::from_secs(2), scaling: Mutex::default() }
    }

    /// The same, reading the Machine this often while waiting for it.
    pub fn with_poll(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    fn deployment<'s>(&self, server: &'s Server) -> Result<&'s MachineDeploymentRef, PowerError> {
        server.spec.machine_deployment().ok_or_else(|| {
            error(
                FailureReason::BmcConfigInvalid,
                "no_machine_deployment",
                format!("server {} has no spec.provider.clusterAPI (type ClusterAPI needs one)", server.name_any()),
            )
        })
    }

    fn apis(&self, md: &MachineDeploymentRef) -> (Api<DynamicObject>, Api<DynamicObject>) {
        (
            Api::namespaced_with(self.client.clone(), &md.namespace, &machinedeployment_resource()),
            Api::namespaced_with(self.client.clone(), &md.namespace, &machine_resource()),
        )
    }

    fn lock(&self, md: &MachineDeploymentRef) -> ScaleLock {
        let mut scaling = self.scaling.lock().unwrap_or_else(PoisonError::into_inner);
        scaling.entry((md.namespace.clone(), md.machine_deployment.clone())).or_default().clone()
    }

    async fn machines(&self, api: &Api<DynamicObject>, md: &MachineDeploymentRef) -> Result<Vec<MachineView>, PowerError> {
        let params = ListParams::default().labels(&format!("{DEPLOYMENT_NAME_LABEL}={}", md.machine_deployment));
        let list = api.list(&params).await.map_err(|err| {
            api_error(&err, format!("cannot list the Machines of MachineDeployment {}/{}: {err}", md.namespace, md.machine_deployment))
        })?;
        Ok(list.items.iter().map(MachineView::of).collect())
    }

    async fn scale(&self, api: &Api<DynamicObject>, md: &MachineDeploymentRef, by: i64) -> Result<(), PowerError> {
        let key = format!("{}/{}", md.namespace, md.machine_deployment);
        for _ in 0..5 {
            let deployment =
                api.get(&md.machine_deployment).await.map_err(|err| api_error(&err, format!("cannot read MachineDeployment {key}: {err}")))?;
            let scale = Scale::of(&deployment)
                .map_err(|why| error(FailureReason::BmcConfigInvalid, "invalid_node_group_size", format!("MachineDeployment {key}: {why}")))?;
            let replicas = scale.replicas + by;
            if by > 0 && scale.max.is_some_and(|max| replicas > max) {
                return Err(error(
                    FailureReason::ServerUnavailable,
                    "at_max_size",
                    format!("MachineDeployment {key} is at its maximum size ({} replicas, {MAX_SIZE_ANNOTATION})", scale.replicas),
                ));
            }
            if by < 0 && replicas < scale.min {
                return Err(error(
                    FailureReason::ServerUnavailable,
                    "at_min_size",
                    format!("MachineDeployment {key} is at its minimum size ({} replicas, {MIN_SIZE_ANNOTATION})", scale.replicas),
                ));
            }
            let patch = json!({"metadata": {"resourceVersion": scale.resource_version}, "spec": {"replicas": replicas}});
            match api.patch(&md.machine_deployment, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(deployment = %key, from = scale.replicas, to = replicas, "scaled the MachineDeployment");
                    return Ok(());
                }
                Err(err) if conflict(&err) => continue,
                Err(err) => return Err(api_error(&err, format!("cannot scale MachineDeployment {key} to {replicas}: {err}"))),
            }
        }
        Err(error(FailureReason::PowerActionFailed, "conflict", format!("MachineDeployment {key} kept changing while it was scaled")))
    }

    /// Takes `machine` for `server`; false when it changed first.
    async fn take(&self, api: &Api<DynamicObject>, machine: &MachineView, server: &str) -> Result<bool, PowerError> {
        if server.len() > 63 {
            return Err(error(
                FailureReason::BmcConfigInvalid,
                "server_name_too_long",
                format!(
                    "server {server} has a name of more than 63 characters: it cannot be the label {CLUSTER_API_SERVER_LABEL} of its Machine's Node"
                ),
            ));
        }
        let patch = json!({"metadata": {
            "resourceVersion": machine.resource_version,
            "annotations": {MACHINE_SERVER_ANNOTATION: server},
            "labels": {CLUSTER_API_SERVER_LABEL: server}
        }});
        match api.patch(&machine.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(true),
            Err(err) if conflict(&err) => Ok(false),
            Err(err) => Err(api_error(&err, format!("cannot take Machine {} for server {server}: {err}", machine.name))),
        }
    }

    /// The MachineDeployment's replicas and bounds, read now.
    async fn read_scale(&self, api: &Api<DynamicObject>, md: &MachineDeploymentRef) -> Result<Scale, PowerError> {
        let key = format!("{}/{}", md.namespace, md.machine_deployment);
        let deployment =
            api.get(&md.machine_deployment).await.map_err(|err| api_error(&err, format!("cannot read MachineDeployment {key}: {err}")))?;
        Scale::of(&deployment)
            .map_err(|why| error(FailureReason::BmcConfigInvalid, "invalid_node_group_size", format!("MachineDeployment {key}: {why}")))
    }

    /// Takes the delete mark off `machine`, on its resourceVersion.
    async fn unmark(&self, api: &Api<DynamicObject>, machine: &MachineView) -> Result<(), PowerError> {
        let patch = json!({"metadata": {"resourceVersion": machine.resource_version, "annotations": {DELETE_MACHINE_ANNOTATION: Value::Null}}});
        api.patch(&machine.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|err| api_error(&err, format!("cannot take the delete mark off Machine {}: {err}", machine.name)))
    }

    /// The Machine of `server`, taking one (and adding a replica for it
    /// when none is free). The scale lock is held for each look and
    /// change, never across the wait for the MachineSet.
    async fn machine_for(&self, server: &str, md: &MachineDeploymentRef) -> Result<String, PowerError> {
        let (deployments, machines) = self.apis(md);
        let lock = self.lock(md);
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            {
                let _one_at_a_time = lock.lock().await;
                let all = self.machines(&machines, md).await?;
                let live = all.iter().filter(|m| !m.deleting).count() as i64;
                if let Some(mine) = all.iter().find(|m| m.server.as_deref() == Some(server) && !m.deleting) {
                    if !mine.marked_for_deletion {
                        return Ok(mine.name.clone());
                    }
                    // Marked by a power-off that did not finish: if its
                    // replica was not removed, the mark is taken back and
                    // the Machine kept; if it was, the MachineSet is about
                    // to delete it, and a new one is waited for.
                    if self.read_scale(&deployments, md).await?.replicas >= live {
                        self.unmark(&machines, mine).await?;
                        tracing::info!(server, machine = %mine.name, "took back the delete mark of a power-off that did not finish");
                        return Ok(mine.name.clone());
                    }
                } else {
                    // A free Machine not yet running is a replica added for
                    // a server that never took it (a restart, a timed-out
                    // power-on): take it rather than add another. A running
                    // one that no server took is left alone: its work is not
                    // ironclaim's to end.
                    let fresh = |m: &&MachineView| matches!(m.phase.as_str(), "Pending" | "Provisioning" | "Provisioned");
                    if let Some(free) = all.iter().filter(fresh).find(|m| m.server.is_none() && !m.deleting && !m.marked_for_deletion) {
                        if self.take(&machines, free, server).await? {
                            tracing::info!(server, machine = %free.name, "took a Machine for the server");
                            return Ok(free.name.clone());
                        }
                    } else if self.read_scale(&deployments, md).await?.replicas <= live {
                        // No replica on its way: add one. One already added
                        // (replicas above the Machines) is waited for.
                        self.scale(&deployments, md, 1).await?;
                    }
                }
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(error(
                    FailureReason::PowerOnTimedOut,
                    "no_machine",
                    format!(
                        "MachineDeployment {}/{} gave server {server} no Machine within {:?}",
                        md.namespace, md.machine_deployment, self.confirm_timeout
                    ),
                ));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn power_on_machine(&self, server: &Server) -> Result<(), PowerError> {
        let md = self.deployment(server)?;
        let name = server.name_any();
        let machine = self.machine_for(&name, md).await?;
        let (_, machines) = self.apis(md);
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            let view = match machines.get_opt(&machine).await {
                Ok(Some(m)) => MachineView::of(&m),
                Ok(None) => {
                    return Err(error(
                        FailureReason::PowerActionFailed,
                        "machine_gone",
                        format!("Machine {}/{machine} of server {name} was deleted while it was provisioned", md.namespace),
                    ));
                }
                Err(err) => return Err(api_error(&err, format!("cannot read Machine {}/{machine}: {err}", md.namespace))),
            };
            if view.phase == "Failed" {
                return Err(error(
                    FailureReason::PowerActionFailed,
                    "machine_failed",
                    format!("Machine {}/{machine} of server {name} failed: {}", md.namespace, view.failure.as_deref().unwrap_or("no reason given")),
                ));
            }
            if view.power_state() == PowerState::On {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let why = view.failure.map(|f| format!("; {f}")).unwrap_or_default();
                return Err(error(
                    FailureReason::PowerOnTimedOut,
                    "timed_out_waiting_for_state",
                    format!("Machine {}/{machine} of server {name} was still {} after {:?}{why}", md.namespace, view.phase, self.confirm_timeout),
                ));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn power_off_machine(&self, server: &Server) -> Result<(), PowerError> {
        let md = self.deployment(server)?;
        let name = server.name_any();
        let (deployments, machines) = self.apis(md);
        let machine = {
            let lock = self.lock(md);
            let _one_at_a_time = lock.lock().await;
            let all = self.machines(&machines, md).await?;
            let live = all.iter().filter(|m| !m.deleting).count() as i64;
            let Some(mine) = all.into_iter().find(|m| m.server.as_deref() == Some(&*name)) else {
                return Ok(());
            };
            if !mine.deleting {
                let scale = self.read_scale(&deployments, md).await?;
                if !mine.marked_for_deletion {
                    // The bounds first: a Machine is marked only when the
                    // group may shrink, so no mark waits for a scale-down
                    // that is refused.
                    if scale.replicas - 1 < scale.min {
                        return Err(error(
                            FailureReason::ServerUnavailable,
                            "at_min_size",
                            format!(
                                "MachineDeployment {}/{} is at its minimum size ({} replicas, {MIN_SIZE_ANNOTATION})",
                                md.namespace, md.machine_deployment, scale.replicas
                            ),
                        ));
                    }
                    // Mark, then lower replicas: a MachineSet deletes a
                    // marked Machine before any other, so the one removed
                    // is this one.
                    let patch =
                        json!({"metadata": {"resourceVersion": mine.resource_version, "annotations": {DELETE_MACHINE_ANNOTATION: "ironclaim"}}});
                    let marked = machines.patch(&mine.name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|err| {
                        api_error(&err, format!("cannot mark Machine {}/{} of server {name} for deletion: {err}", md.namespace, mine.name))
                    })?;
                    if let Err(err) = self.scale(&deployments, md, -1).await {
                        // Unmark: a Machine left marked would be the next one
                        // removed whatever scaled the deployment down.
                        return match self.unmark(&machines, &MachineView::of(&marked)).await {
                            Ok(()) => Err(err),
                            Err(unmark) => Err(PowerError {
                                message: format!(
                                    "{}; and the mark could not be taken back ({}): the next power-off of this server finishes it",
                                    err.message, unmark.message
                                ),
                                ..err
                            }),
                        };
                    }
                } else if scale.replicas >= live {
                    // Marked by a power-off that did not finish: its
                    // replica was never removed.
                    self.scale(&deployments, md, -1).await?;
                }
            }
            mine.name
        };
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            match machines.get_opt(&machine).await {
                Ok(None) => return Ok(()),
                Ok(Some(m)) if m.data["status"]["phase"] == "Deleted" => return Ok(()),
                Ok(Some(_)) => {}
                Err(err) => return Err(api_error(&err, format!("cannot read Machine {}/{machine}: {err}", md.namespace))),
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(error(
                    FailureReason::PowerActionFailed,
                    "timed_out_waiting_for_state",
                    format!("Machine {}/{machine} of server {name} was not deleted within {:?}", md.namespace, self.confirm_timeout),
                ));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    async fn state(&self, server: &Server) -> Result<PowerState, PowerError> {
        let md = self.deployment(server)?;
        let name = server.name_any();
        let (_, machines) = self.apis(md);
        let all = self.machines(&machines, md).await?;
        let mine: Vec<&MachineView> = all.iter().filter(|m| m.server.as_deref() == Some(&*name)).collect();
        match mine.as_slice() {
            [] => Ok(PowerState::Off),
            [one] => Ok(one.power_state()),
            many => {
                // One server, two Machines: someone copied the annotation.
                // Unknown holds the server until a person looks.
                let names: Vec<&str> = many.iter().map(|m| m.name.as_str()).collect();
                tracing::warn!(server = %name, machines = ?names, "several Machines say they are this server");
                Ok(PowerState::Unknown)
            }
        }
    }
}

impl Power for ClusterApiPower {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(self.power_on_machine(server))
    }

    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(self.power_off_machine(server))
    }

    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        Box::pin(self.state(server))
    }

    fn watts<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async { Ok(None) })
    }
}

/// The capacity a MachineDeployment's nodes will have, from the
/// annotations the Cluster Autoscaler reads to scale a node group from
/// zero (`capacity.cluster-autoscaler.kubernetes.io/*`): resource name to
/// quantity, and the node labels and taints they list.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct ScaleFromZero {
    pub resources: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<String>,
}

/// The prefix of the scale-from-zero annotations.
pub const CAPACITY_ANNOTATION_PREFIX: &str = "capacity.cluster-autoscaler.kubernetes.io/";

impl ScaleFromZero {
    /// The annotations of `deployment`, or why they cannot be read.
    pub fn of(annotations: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut out = ScaleFromZero::default();
        for (key, value) in annotations {
            let Some(name) = key.strip_prefix(CAPACITY_ANNOTATION_PREFIX) else { continue };
            let value = value.trim();
            match name {
                "cpu" | "memory" | "ephemeral-disk" => {
                    let resource = if name == "ephemeral-disk" { "ephemeral-storage" } else { name };
                    out.resources.insert(resource.to_string(), value.to_string());
                }
                "maxPods" => {
                    value.parse::<u32>().map_err(|_| format!("annotation {key} is {value:?}, not a number of pods"))?;
                    out.resources.insert("pods".into(), value.to_string());
                }
                "gpu-count" => {
                    value.parse::<u32>().map_err(|_| format!("annotation {key} is {value:?}, not a number of GPUs"))?;
                    let gpu = annotations.get(&format!("{CAPACITY_ANNOTATION_PREFIX}gpu-type")).map(String::as_str).unwrap_or("nvidia.com/gpu");
                    out.resources.insert(gpu.to_string(), value.to_string());
                }
                "gpu-type" => {}
                "labels" => {
                    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                        let (k, v) = pair.split_once('=').ok_or_else(|| format!("annotation {key}: {pair:?} is not KEY=VALUE"))?;
                        out.labels.insert(k.trim().to_string(), v.trim().to_string());
                    }
                }
                "taints" => {
                    out.taints = value.split(',').map(str::trim).filter(|t| !t.is_empty()).map(str::to_string).collect();
                }
                _ => {}
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn machine(value: Value) -> DynamicObject {
        serde_json::from_value(value).expect("a Machine")
    }

    #[test]
    fn a_machines_phase_reads_as_power_and_its_failure_names_the_reason_and_the_false_conditions() {
        let of = |phase: &str| {
            MachineView::of(&machine(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
                "metadata": {"name": "m", "resourceVersion": "7", "annotations": {MACHINE_SERVER_ANNOTATION: "capi-1"}},
                "status": {"phase": phase, "nodeRef": {"name": "node-a"}}
            })))
        };
        let states: Vec<PowerState> = ["Pending", "Provisioning", "Provisioned", "Running", "Updating", "Deleting", "Failed", "Unknown"]
            .iter()
            .map(|p| of(p).power_state())
            .collect();
        use PowerState::*;
        assert_eq!(states, [PoweringOn, PoweringOn, On, On, On, PoweringOff, Unknown, Unknown]);
        let running = of("Running");
        assert_eq!((running.server.as_deref(), running.node.as_deref(), running.resource_version.as_str()), (Some("capi-1"), Some("node-a"), "7"));

        let failed = MachineView::of(&machine(json!({
            "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Machine",
            "metadata": {"name": "m", "deletionTimestamp": null},
            "status": {
                "phase": "Failed",
                "deprecated": {"v1beta1": {"failureReason": "CreateError", "failureMessage": "no BareMetalHost matches the hostSelector"}},
                "conditions": [
                    {"type": "InfrastructureReady", "status": "False", "reason": "NoHost", "message": "0 of 4 hosts available"},
                    {"type": "BootstrapConfigReady", "status": "True", "reason": "Ready", "message": ""}
                ]
            }
        })));
        assert_eq!(
            failed.failure.as_deref(),
            Some("CreateError; no BareMetalHost matches the hostSelector; InfrastructureReady NoHost: 0 of 4 hosts available")
        );
    }

    #[test]
    fn the_node_group_bounds_come_from_the_autoscaler_annotations() {
        let deployment = |annotations: Value, replicas: Value| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineDeployment",
                "metadata": {"name": "md", "resourceVersion": "3", "annotations": annotations},
                "spec": {"replicas": replicas}
            }))
            .unwrap()
        };
        let scale = Scale::of(&deployment(json!({MIN_SIZE_ANNOTATION: "1", MAX_SIZE_ANNOTATION: "6"}), json!(2))).unwrap();
        assert_eq!(scale, Scale { replicas: 2, min: 1, max: Some(6), resource_version: "3".into() });
        let unbounded = Scale::of(&deployment(json!({}), json!(0))).unwrap();
        assert_eq!((unbounded.min, unbounded.max), (0, None));
        let bad = Scale::of(&deployment(json!({MAX_SIZE_ANNOTATION: "lots"}), json!(0))).unwrap_err();
        assert!(bad.contains("node-group-max-size") && bad.contains("\"lots\""), "{bad}");
        let inverted = Scale::of(&deployment(json!({MIN_SIZE_ANNOTATION: "5", MAX_SIZE_ANNOTATION: "2"}), json!(0))).unwrap_err();
        assert!(inverted.contains("below"), "{inverted}");
    }

    #[test]
    fn the_scale_from_zero_annotations_give_resources_labels_and_taints() {
        let annotations: BTreeMap<String, String> = [
            ("cpu", "64"),
            ("memory", "512G"),
            ("ephemeral-disk", "1Ti"),
            ("maxPods", "200"),
            ("gpu-count", "8"),
            ("gpu-type", "nvidia.com/gpu"),
            ("labels", "topology.kubernetes.io/zone=z1, ironclaim.dev/class=gpu-a100"),
            ("taints", "nvidia.com/gpu=present:NoSchedule"),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{CAPACITY_ANNOTATION_PREFIX}{k}"), v.to_string()))
        .collect();
        let read = ScaleFromZero::of(&annotations).unwrap();
        let resources: Vec<(&str, &str)> = read.resources.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(resources, [("cpu", "64"), ("ephemeral-storage", "1Ti"), ("memory", "512G"), ("nvidia.com/gpu", "8"), ("pods", "200")]);
        assert_eq!(read.labels.get("ironclaim.dev/class").map(String::as_str), Some("gpu-a100"));
        assert_eq!(read.taints, ["nvidia.com/gpu=present:NoSchedule"]);
        let bad: BTreeMap<String, String> = [(format!("{CAPACITY_ANNOTATION_PREFIX}labels"), "zone".to_string())].into();
        assert!(ScaleFromZero::of(&bad).unwrap_err().contains("not KEY=VALUE"));
    }
}
