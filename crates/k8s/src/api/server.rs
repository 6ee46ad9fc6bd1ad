//! `Server`: one physical machine in the inventory.

use super::schema;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::common::SecretReference;

/// The resource name GPUs are advertised under unless a GPU says otherwise.
pub const DEFAULT_GPU_RESOURCE: &str = ironclaim_core::GPU;

/// A physical machine ironclaim may power on to become a node. Which
/// ServerPools may use it follows from its labels and their requirements.
// clippy reads the repeated `type_ = ...` of the printcolumns as duplicated
// attributes; they are one column each.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "ironclaim.dev",
    version = "v1alpha1",
    kind = "Server",
    plural = "servers",
    shortname = "srv",
    category = "ironclaim",
    status = "ServerStatus",
    derive = "PartialEq",
    doc = "A physical machine in the inventory: its BMC, hardware, labels and power profile.",
    printcolumn(name = "Power", type_ = "string", json_path = ".status.powerState"),
    printcolumn(name = "Claim", type_ = "string", json_path = ".status.claim"),
    printcolumn(name = "Node", type_ = "string", json_path = ".status.node"),
    printcolumn(name = "CPU", type_ = "string", json_path = ".spec.hardware.cpu"),
    printcolumn(name = "Memory", type_ = "string", json_path = ".spec.hardware.memory"),
    printcolumn(name = "Maintenance", type_ = "boolean", json_path = ".spec.maintenance"),
    printcolumn(name = "Failures", type_ = "integer", json_path = ".status.failures", priority = 1),
    printcolumn(name = "Quarantined", type_ = "boolean", json_path = ".status.quarantined", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "has(self.bmc) || (has(self.provider) && self.provider.type in ['Metal3', 'External', 'ClusterAPI'])",
        "message": "bmc is required unless provider.type is Metal3, External or ClusterAPI"
    }
]))]
pub struct ServerSpec {
    /// The machine's own BMC, which the Redfish provider powers it through.
    /// Required unless `provider.type` is `Metal3`, `External` or
    /// `ClusterAPI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<Bmc>,
    /// What powers the machine on and off: its BMC over Redfish (the
    /// default), Metal3 through a BareMetalHost, an external provider (a
    /// command or an HTTPS endpoint the controller is configured with), or
    /// a Cluster API MachineDeployment.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<Provider>,
    pub hardware: Hardware,
    /// Zone, rack, class and anything else; ServerPool requirements match
    /// these, and the server's node gets them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::labels")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerProfile>,
    /// Expected duration of each stage, until measurements on the status
    /// replace them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_durations: Option<StageDurations>,
    /// Taken out by an operator: never claimed while set.
    #[serde(default)]
    pub maintenance: bool,
    /// What ironclaim may do with a server it finds on without having
    /// powered it on. `Auto` (the default): it is adopted once ironclaim
    /// knows what runs on it (a node is linked to it by system UUID,
    /// providerID or label, or it is off); until then it is neither
    /// claimed nor powered off. `PowerOffWhenIdle`: adopted now; the
    /// operator vouches that it runs nothing ironclaim cannot see.
    /// `Never`: never claimed, drained or powered off.
    #[serde(default, skip_serializing_if = "Adopt::is_auto")]
    pub adopt: Adopt,
}

/// See [`ServerSpec::adopt`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Adopt {
    #[default]
    Auto,
    PowerOffWhenIdle,
    Never,
}

impl Adopt {
    pub fn is_auto(&self) -> bool {
        *self == Adopt::Auto
    }

    pub fn to_core(self) -> ironclaim_core::identity::Adopt {
        match self {
            Adopt::Auto => ironclaim_core::identity::Adopt::Auto,
            Adopt::PowerOffWhenIdle => ironclaim_core::identity::Adopt::PowerOffWhenIdle,
            Adopt::Never => ironclaim_core::identity::Adopt::Never,
        }
    }
}

/// How to reach the machine's baseboard management controller.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "!(has(self.caBundle) && has(self.insecureSkipVerify) && self.insecureSkipVerify)",
        "message": "caBundle and insecureSkipVerify are mutually exclusive"
    }
]))]
pub struct Bmc {
    /// The Redfish system, e.g. `redfish+https://10.0.0.10/redfish/v1/Systems/1`
    /// or `https://10.0.0.10` (the first system).
    #[schemars(length(min = 1, max = 2048), pattern(r"^(redfish\+)?https?://[^\s]+$"))]
    pub address: String,
    /// A Secret with the keys `username` and `password`.
    pub credentials_secret_ref: SecretReference,
    /// Accept any certificate the BMC presents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// PEM certificates that sign the BMC's certificate, instead of the
    /// system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 65536))]
    pub ca_bundle: Option<String>,
}

/// What powers a machine on and off. `type` says which; a provider that
/// needs more says it in the member of its name (`metal3`), as a
/// Deployment's `strategy` does.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {
        "rule": "self.type == 'Metal3' ? has(self.metal3) : !has(self.metal3)",
        "message": "metal3 is required when type is Metal3, and only then"
    },
    {
        "rule": "self.type == 'External' ? has(self.external) : !has(self.external)",
        "message": "external is required when type is External, and only then"
    },
    {
        "rule": "self.type == 'ClusterAPI' ? has(self.clusterAPI) : !has(self.clusterAPI)",
        "message": "clusterAPI is required when type is ClusterAPI, and only then"
    }
]))]
pub struct Provider {
    /// `Redfish` (the default: the machine's own BMC, `spec.bmc`),
    /// `Metal3` (`spec.online` of the BareMetalHost `metal3` names),
    /// `External` (the external provider `external` names) or
    /// `ClusterAPI` (a Machine of the MachineDeployment `clusterAPI` names).
    #[serde(default, rename = "type")]
    pub type_: ProviderType,
    /// The BareMetalHost to power, with `type: Metal3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metal3: Option<Metal3Host>,
    /// The external provider and what it needs to know of this machine,
    /// with `type: External`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external: Option<ExternalProvider>,
    /// The MachineDeployment whose Machine this server is, with
    /// `type: ClusterAPI`.
    #[serde(default, rename = "clusterAPI", skip_serializing_if = "Option::is_none")]
    pub cluster_api: Option<MachineDeploymentRef>,
}

/// A Cluster API MachineDeployment (`cluster.x-k8s.io`), by namespace and
/// name. A Server of it is one of its Machines to be: powering it on adds
/// a replica and takes the new Machine; powering it off marks that Machine
/// for deletion and removes the replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MachineDeploymentRef {
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"))]
    pub machine_deployment: String,
}

/// Which provider powers a machine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ProviderType {
    /// The machine's own BMC (`spec.bmc`), over Redfish.
    #[default]
    Redfish,
    /// `spec.online` of an already provisioned Metal3 BareMetalHost; the
    /// baremetal-operator does the BMC work with its own credentials.
    Metal3,
    /// A provider named in the controller's `--external-providers` file:
    /// a command it runs, or an HTTPS endpoint it calls, for each power
    /// action and read (docs/providers.md).
    External,
    /// One Machine of a Cluster API MachineDeployment: powered on by
    /// adding a replica, off by marking the Machine for deletion and
    /// removing the replica (docs/providers.md).
    #[serde(rename = "ClusterAPI")]
    #[schemars(rename = "ClusterAPI")]
    ClusterApi,
}

/// A Server's external provider: which one, and the parameters it gets
/// with every call (an IPMI address, a Terraform workspace). Secrets do
/// not belong here: the provider has its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ExternalProvider {
    /// The name of a provider in the controller's `--external-providers`
    /// file.
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Passed as they are, under `server.parameters` of each request.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::parameters")]
    pub parameters: BTreeMap<String, String>,
}

/// A Metal3 BareMetalHost (`metal3.io/v1alpha1`), by namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Metal3Host {
    #[schemars(length(min = 1, max = 63), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: String,
    #[schemars(length(min = 1, max = 253), pattern(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"))]
    pub name: String,
}

impl ServerSpec {
    /// The BareMetalHost that powers this server, when its provider is Metal3.
    pub fn metal3_host(&self) -> Option<&Metal3Host> {
        self.provider.as_ref().filter(|p| p.type_ == ProviderType::Metal3).and_then(|p| p.metal3.as_ref())
    }

    /// The MachineDeployment whose Machine this server is, when its
    /// provider is ClusterAPI.
    pub fn machine_deployment(&self) -> Option<&MachineDeploymentRef> {
        self.provider.as_ref().filter(|p| p.type_ == ProviderType::ClusterApi).and_then(|p| p.cluster_api.as_ref())
    }

    /// The external provider that powers this server, when its provider
    /// is External.
    pub fn external_provider(&self) -> Option<&ExternalProvider> {
        self.provider.as_ref().filter(|p| p.type_ == ProviderType::External).and_then(|p| p.external.as_ref())
    }
}

/// What the machine offers pods once it is a node (its allocatable).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Hardware {
    #[schemars(schema_with = "schema::quantity")]
    pub cpu: Quantity,
    #[schemars(schema_with = "schema::quantity")]
    pub memory: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::quantity")]
    pub ephemeral_storage: Option<Quantity>,
    /// Pod slots (the kubelet's maxPods).
    #[serde(default = "default_pods")]
    #[schemars(range(min = 1, max = 10000))]
    pub pods: i64,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub gpus: Vec<Gpu>,
    /// Other extended resources the node will advertise, by resource name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "schema::quantity_map")]
    pub extended_resources: BTreeMap<String, Quantity>,
}

fn default_pods() -> i64 {
    110
}

/// GPUs of one model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Gpu {
    /// The model, as a label value: `A100`, `H100-SXM5-80GB`.
    #[schemars(length(min = 1, max = 63), pattern(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"))]
    pub model: String,
    #[schemars(range(min = 1, max = 64))]
    pub count: i64,
    /// The extended resource the device plugin advertises them under.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 316))]
    pub resource_name: Option<String>,
}

/// What the machine draws, in watts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.peakWatts >= self.idleWatts", "message": "peakWatts must be at least idleWatts"},
    {"rule": "!has(self.gpuWatts) || self.gpuWatts <= self.peakWatts - self.idleWatts", "message": "gpuWatts must be at most peakWatts - idleWatts"}
]))]
pub struct PowerProfile {
    /// Powered on, no load.
    #[schemars(range(min = 0, max = 100000))]
    pub idle_watts: i64,
    /// Fully loaded.
    #[schemars(range(min = 0, max = 100000))]
    pub peak_watts: i64,
    /// Average while powering on and booting; idleWatts when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub boot_watts: Option<i64>,
    /// Powered off with the BMC on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub off_watts: Option<i64>,
    /// Of peakWatts - idleWatts, what the GPUs add when all of them are
    /// busy; the rest follows the cpu in use. A new claim counts it for the
    /// GPUs its pods take, so that pods go where their GPUs draw least.
    /// Unset: 80 % of the range on a server with GPUs, not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub gpu_watts: Option<i64>,
}

/// The stages of a cold start, each as a typical duration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageDurations {
    /// Power-on requested until the BMC reports it on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub power_on: Option<String>,
    /// Powered on until the node registers: firmware, PXE, OS, kubelet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub boot: Option<String>,
    /// Registered until the node is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub join: Option<String>,
    /// Node Ready until the pool's readiness gates pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub ready: Option<String>,
    /// The 90th percentile as a percentage of the median: 150 means the
    /// slow tail takes 1.5 times as long.
    // schemars writes `format: uint32` for a u32, which kube-apiserver does
    // not recognize (every apply warns); the range fits an int32.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 100, max = 1000), extend("format" = "int32"))]
    pub tail_percent: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PowerState {
    On,
    Off,
    PoweringOn,
    PoweringOff,
    Unknown,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerStatus {
    /// As the BMC last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<PowerState>,
    /// The ServerClaim holding the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// When `claim` was written. The claim is written before its ServerClaim
    /// exists (the power-on waits for one write only); a claim whose
    /// ServerClaim is missing this soon after is being opened, not orphaned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claimed_at: Option<Time>,
    /// Since when the server's node has been idle, as the controller last
    /// saw it: kept here so break-even waits survive a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_since: Option<Time>,
    /// The node the server became.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Durations measured on this server's own starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_durations: Option<MeasuredDurations>,
    /// Failed claims in a row.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub failures: i64,
    /// Failed too often: not claimed until an operator clears this.
    #[serde(default)]
    pub quarantined: bool,
    /// The machine as its BMC described it on first contact.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    /// ironclaim powered the server on and has not seen it off since: it
    /// knows what runs on it. Set before its power-on, cleared once it
    /// reads the server off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub powered_on_by_ironclaim: bool,
    /// The last power reading from the BMC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub watts: Option<i64>,
    /// The power actions ironclaim sent this server in the last day, oldest
    /// first, at most 64: what its transition rates and its cap on power
    /// cycles a day count, kept here so they outlive a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub power_changes: Vec<PowerChangeRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,
}

/// One power action sent to a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PowerChangeRecord {
    /// When it was sent, in seconds since the Unix epoch.
    pub at: i64,
    /// A power-on (true) or a power-off (false).
    pub on: bool,
}

impl PowerChangeRecord {
    pub fn to_core(self) -> ironclaim_core::PowerChange {
        ironclaim_core::PowerChange { at_s: self.at.max(0) as u64, on: self.on }
    }
}

/// `changes` with one more sent at `at_s`, pruned to the last day and the
/// newest [`ironclaim_core::transitions::RECORDED_CHANGES`]: the status
/// value to write.
pub fn with_power_change(changes: &[PowerChangeRecord], at_s: u64, on: bool) -> Vec<PowerChangeRecord> {
    let mut core: Vec<ironclaim_core::PowerChange> = changes.iter().map(|c| c.to_core()).collect();
    core.push(ironclaim_core::PowerChange { at_s, on });
    ironclaim_core::transitions::prune(&mut core, at_s, ironclaim_core::transitions::RECORDED_CHANGES);
    core.into_iter().map(|c| PowerChangeRecord { at: c.at_s as i64, on: c.on }).collect()
}

/// A machine's hardware identity, recorded once. A node is linked to the
/// server whose `systemUUID` it reports (`nodeInfo.systemUUID`); a BMC
/// that later answers with another UUID puts the server in
/// `IdentityMismatch`. Clearing this record (after fixing the mapping)
/// has it read again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Identity {
    /// The Redfish System's `UUID`: the SMBIOS UUID the kubelet reports.
    #[serde(default, rename = "systemUUID", skip_serializing_if = "Option::is_none")]
    pub system_uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial_number: Option<String>,
    /// The BMC address it was read through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_address: Option<String>,
    /// The UUID the BMC at `spec.bmc.address` answered with when last read
    /// there, where it is not `systemUUID`.
    #[serde(default, rename = "reportedSystemUUID", skip_serializing_if = "Option::is_none")]
    pub reported_system_uuid: Option<String>,
}

/// Measured stage durations of one server.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MeasuredDurations {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_on: Option<MeasuredStage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot: Option<MeasuredStage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub join: Option<MeasuredStage>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<MeasuredStage>,
}

/// The median and 90th percentile of a stage over the last samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.p90Seconds >= self.p50Seconds", "message": "p90Seconds must be at least p50Seconds"}
]))]
pub struct MeasuredStage {
    #[schemars(range(min = 0))]
    pub p50_seconds: i64,
    #[schemars(range(min = 0))]
    pub p90_seconds: i64,
    #[schemars(range(min = 1))]
    pub samples: i64,
}

/// The condition on a Server that says whether its power provider's
/// configuration works: `False` (reason `BmcCredentialsMissing` or
/// `BmcConfigInvalid`) holds it back from every claim and power action
/// until a read through the same configuration succeeds.
pub const BMC_CONFIGURED_CONDITION: &str = "BmcConfigured";

impl ServerStatus {
    /// Why its power provider's configuration does not work, when its
    /// `BmcConfigured` condition says so.
    pub fn misconfigured(&self) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == BMC_CONFIGURED_CONDITION && c.status == "False")
    }
}
