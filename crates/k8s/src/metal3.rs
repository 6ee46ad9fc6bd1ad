//! Metal3's `BareMetalHost` and `HardwareData` (`metal3.io/v1alpha1`) as
//! ironclaim reads them: whether a host can be a Server powered through
//! Metal3, and what its inspection found (CPUs, memory, serial number,
//! MAC addresses), for `ironclaim servers discover --metal3`.
//!
//! The objects are read as JSON, only the fields used here, so that a
//! field Metal3 adds in a later release changes nothing. What Metal3's API
//! cannot say is said too: HardwareData has no system UUID (the
//! provisioner's `status.provisioning.ID` is Ironic's node UUID, not the
//! machine's) and lists no PCI devices, so no GPU.

use serde::Deserialize;
use serde_json::Value;

/// The group and version of the resources read here.
pub const API_VERSION: &str = "metal3.io/v1alpha1";

/// The provisioning states in which a host runs its own image, so that
/// powering it on boots the node: `provisioned` (by Metal3) and
/// `externally provisioned` (by anything else; only its power is managed).
pub const POWERABLE_STATES: [&str; 2] = ["provisioned", "externally provisioned"];

/// The annotation under which the baremetal-operator leaves a host alone,
/// power included.
pub const DETACHED_ANNOTATION: &str = "baremetalhost.metal3.io/detached";

/// A fact about a host that discovery looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fact {
    Uuid,
    SerialNumber,
    Cpus,
    Memory,
    Gpus,
    MacAddresses,
}

/// A fact left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unknown {
    pub fact: Fact,
    pub reason: String,
}

/// A host that can be a Server, with what its HardwareData says.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveredHost {
    pub namespace: String,
    pub name: String,
    /// `provisioned` or `externally provisioned`.
    pub provisioning_state: String,
    /// `spec.hardware.cpu.count`: logical CPUs (hardware threads), as the
    /// inspection agent counts them and the kubelet does.
    pub cpus: Option<u64>,
    pub memory_mib: Option<u64>,
    /// `spec.hardware.systemVendor.serialNumber`.
    pub serial_number: Option<String>,
    /// The NICs' addresses, lowercase, sorted, each once.
    pub mac_addresses: Option<Vec<String>>,
    /// What could not be determined, in the order of [`Fact`].
    pub unknown: Vec<Unknown>,
}

/// Why a host cannot be a Server. Each names the step of the reading
/// that refused it; [`Unusable::metric_label`] is its kind.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("annotation {DETACHED_ANNOTATION}: the baremetal-operator does not act on spec.online of a detached host")]
    Detached,
    #[error("status.operationalStatus {operational_status:?}, {error_type}: {message}")]
    InError { operational_status: String, error_type: String, message: String },
    #[error("provisioning state {state:?}: only provisioned or externally provisioned hosts boot a node when powered on")]
    NotProvisioned { state: String },
    #[error("no HardwareData {namespace}/{name}: the host has not been inspected, or its inspection is disabled")]
    NoHardwareData { namespace: String, name: String },
    #[error("HardwareData {namespace}/{name} has no spec.hardware")]
    EmptyHardwareData { namespace: String, name: String },
    #[error("{what} {namespace}/{name}: {path}: {reason}")]
    Malformed { what: &'static str, namespace: String, name: String, path: String, reason: String },
}

impl Unusable {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Unusable::Detached => "detached",
            Unusable::InError { .. } => "host_error",
            Unusable::NotProvisioned { .. } => "not_provisioned",
            Unusable::NoHardwareData { .. } => "no_hardware_data",
            Unusable::EmptyHardwareData { .. } => "empty_hardware_data",
            Unusable::Malformed { .. } => "malformed",
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Metadata {
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HostStatus {
    operational_status: Option<String>,
    error_type: Option<String>,
    error_message: Option<String>,
    provisioning: Option<Provisioning>,
}

#[derive(Deserialize, Default)]
struct Provisioning {
    state: Option<String>,
}

#[derive(Deserialize, Default)]
struct Host {
    #[serde(default)]
    metadata: Metadata,
    #[serde(default)]
    status: Option<HostStatus>,
}

#[derive(Deserialize, Default)]
struct HardwareData {
    #[serde(default)]
    spec: Option<HardwareDataSpec>,
}

#[derive(Deserialize, Default)]
struct HardwareDataSpec {
    hardware: Option<HardwareDetails>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct HardwareDetails {
    system_vendor: Option<SystemVendor>,
    ram_mebibytes: Option<i64>,
    nics: Option<Vec<Nic>>,
    cpu: Option<Cpu>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct SystemVendor {
    serial_number: Option<String>,
}

#[derive(Deserialize, Default)]
struct Nic {
    mac: Option<String>,
}

#[derive(Deserialize, Default)]
struct Cpu {
    count: Option<i64>,
}

fn decode<T: serde::de::DeserializeOwned>(value: &Value, what: &'static str, namespace: &str, name: &str) -> Result<T, Unusable> {
    serde_path_to_error::deserialize(value).map_err(|err| Unusable::Malformed {
        what,
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        path: err.path().to_string(),
        reason: err.inner().to_string(),
    })
}

fn non_empty(text: Option<&String>) -> Option<String> {
    text.map(|t| t.trim()).filter(|t| !t.is_empty()).map(str::to_owned)
}

/// Reads one BareMetalHost and its HardwareData (the one of the same
/// namespace and name, when there is one).
///
/// # Guarantees
/// No IO; nothing is guessed: a fact HardwareData does not give is left
/// out and listed in [`DiscoveredHost::unknown`] with the reason. The
/// system UUID and the GPUs are always among them: Metal3 has no UUID
/// of the machine, and its HardwareData lists no PCI devices.
///
/// # Errors
/// Why the host cannot be a Server, checked in this order: detached, in
/// error (`status.operationalStatus: error` or a `status.errorType`), not
/// provisioned or externally provisioned, no HardwareData or none of its
/// `spec.hardware`, a field of the wrong type.
pub fn read_host(host: &Value, hardware_data: Option<&Value>) -> Result<DiscoveredHost, Unusable> {
    let metadata: Metadata = decode(host.get("metadata").unwrap_or(&Value::Null), "BareMetalHost", "", "")?;
    let (namespace, name) = (metadata.namespace.clone(), metadata.name.clone());
    let parsed: Host = decode(host, "BareMetalHost", &namespace, &name)?;
    if parsed.metadata.annotations.contains_key(DETACHED_ANNOTATION) {
        return Err(Unusable::Detached);
    }
    let status = parsed.status.unwrap_or_default();
    let operational_status = non_empty(status.operational_status.as_ref()).unwrap_or_default();
    let error_type = non_empty(status.error_type.as_ref());
    if operational_status == "error" || error_type.is_some() {
        return Err(Unusable::InError {
            operational_status,
            error_type: error_type.unwrap_or_else(|| "error".to_owned()),
            message: non_empty(status.error_message.as_ref()).unwrap_or_else(|| "no status.errorMessage".to_owned()),
        });
    }
    let state = status.provisioning.and_then(|p| p.state).unwrap_or_default();
    if !POWERABLE_STATES.contains(&state.as_str()) {
        return Err(Unusable::NotProvisioned { state });
    }
    let Some(hardware_data) = hardware_data else {
        return Err(Unusable::NoHardwareData { namespace, name });
    };
    let data: HardwareData = decode(hardware_data, "HardwareData", &namespace, &name)?;
    let Some(details) = data.spec.and_then(|s| s.hardware) else {
        return Err(Unusable::EmptyHardwareData { namespace, name });
    };

    let mut found = DiscoveredHost { namespace, name, provisioning_state: state, ..DiscoveredHost::default() };
    let mut unknown = |fact, reason: &str| found.unknown.push(Unknown { fact, reason: reason.to_owned() });
    unknown(Fact::Uuid, "Metal3 reports no system UUID (status.provisioning.ID is the provisioner's node ID, not the machine's)");
    let serial_number = non_empty(details.system_vendor.as_ref().and_then(|v| v.serial_number.as_ref()));
    if serial_number.is_none() {
        unknown(Fact::SerialNumber, "HardwareData reports no spec.hardware.systemVendor.serialNumber");
    }
    let cpus = details.cpu.as_ref().and_then(|c| c.count).filter(|&n| n > 0).map(|n| n as u64);
    if cpus.is_none() {
        unknown(Fact::Cpus, "HardwareData reports no spec.hardware.cpu.count");
    }
    let memory_mib = details.ram_mebibytes.filter(|&n| n > 0).map(|n| n as u64);
    if memory_mib.is_none() {
        unknown(Fact::Memory, "HardwareData reports no spec.hardware.ramMebibytes");
    }
    unknown(Fact::Gpus, "Metal3's HardwareData lists no PCI devices: GPUs cannot be discovered; set spec.hardware.gpus by hand");
    let macs = mac_addresses_of(details.nics.as_deref().unwrap_or_default());
    if macs.is_empty() {
        unknown(Fact::MacAddresses, "HardwareData lists no NIC with a MAC address (spec.hardware.nics)");
    }
    found.serial_number = serial_number;
    found.cpus = cpus;
    found.memory_mib = memory_mib;
    found.mac_addresses = (!macs.is_empty()).then_some(macs);
    found.unknown.sort_by_key(|u| u.fact);
    Ok(found)
}

/// The NICs' addresses, lowercase, each once; unset ones left out.
fn mac_addresses_of(nics: &[Nic]) -> Vec<String> {
    let mut macs: Vec<String> = nics
        .iter()
        .filter_map(|n| n.mac.as_deref())
        .map(|m| m.trim().to_ascii_lowercase())
        .filter(|m| !m.is_empty() && m != "00:00:00:00:00:00")
        .collect();
    macs.sort();
    macs.dedup();
    macs
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn host(state: &str) -> Value {
        json!({
            "apiVersion": API_VERSION, "kind": "BareMetalHost",
            "metadata": {"namespace": "metal3", "name": "worker-1"},
            "spec": {"online": true},
            "status": {"operationalStatus": "OK", "provisioning": {"state": state, "ID": "a3b1c9e2-0000-4000-8000-000000000001"}, "errorMessage": "", "poweredOn": true, "errorCount": 0}
        })
    }

    fn hardware(details: Value) -> Value {
        json!({"apiVersion": API_VERSION, "kind": "HardwareData", "metadata": {"namespace": "metal3", "name": "worker-1"}, "spec": {"hardware": details}})
    }

    #[test]
    fn a_provisioned_host_gives_its_threads_memory_serial_and_macs_and_never_gpus() {
        let details = json!({
            "cpu": {"arch": "x86_64", "count": 64, "clockMegahertz": 2100.5},
            "ramMebibytes": 262144,
            "systemVendor": {"manufacturer": "Dell Inc.", "productName": "PowerEdge R650", "serialNumber": " 7XK2M93 "},
            "nics": [{"name": "eno2", "mac": "B4:96:91:0A:00:02"}, {"name": "eno1", "mac": "b4:96:91:0a:00:01"}, {"name": "eno1v", "mac": "b4:96:91:0a:00:01"}, {"name": "ib0"}]
        });
        let found = read_host(&host("provisioned"), Some(&hardware(details))).unwrap();
        assert_eq!((found.cpus, found.memory_mib), (Some(64), Some(262144)));
        assert_eq!(found.serial_number.as_deref(), Some("7XK2M93"));
        assert_eq!(found.mac_addresses, Some(vec!["b4:96:91:0a:00:01".to_owned(), "b4:96:91:0a:00:02".to_owned()]));
        assert_eq!(found.unknown.iter().map(|u| u.fact).collect::<Vec<_>>(), vec![Fact::Uuid, Fact::Gpus]);
    }

    #[test]
    fn facts_hardware_data_lacks_are_left_out_with_their_reason() {
        let found = read_host(&host("externally provisioned"), Some(&hardware(json!({"cpu": {"count": 0}})))).unwrap();
        assert_eq!((found.cpus, found.memory_mib, found.serial_number, found.mac_addresses), (None, None, None, None));
        let facts: Vec<Fact> = found.unknown.iter().map(|u| u.fact).collect();
        assert_eq!(facts, vec![Fact::Uuid, Fact::SerialNumber, Fact::Cpus, Fact::Memory, Fact::Gpus, Fact::MacAddresses]);
        assert!(found.unknown[2].reason.contains("cpu.count"), "{:?}", found.unknown);
    }

    #[test]
    fn each_host_that_cannot_be_a_server_says_why_in_a_kind_of_its_own() {
        let data = hardware(json!({"cpu": {"count": 8}, "ramMebibytes": 16384}));
        let kind = |host: &Value, data: Option<&Value>| read_host(host, data).map(|_| ()).unwrap_err().metric_label();
        assert_eq!(kind(&host("available"), Some(&data)), "not_provisioned");
        assert_eq!(kind(&host("provisioned"), None), "no_hardware_data");
        assert_eq!(kind(&host("provisioned"), Some(&json!({"spec": {}}))), "empty_hardware_data");
        let mut failed = host("provisioned");
        failed["status"]["operationalStatus"] = json!("error");
        failed["status"]["errorType"] = json!("power management error");
        failed["status"]["errorMessage"] = json!("BMC unreachable");
        let err = read_host(&failed, Some(&data)).unwrap_err();
        assert_eq!(err.metric_label(), "host_error");
        assert!(err.to_string().contains("power management error: BMC unreachable"), "{err}");
        let mut detached = host("provisioned");
        detached["metadata"]["annotations"] = json!({DETACHED_ANNOTATION: ""});
        assert_eq!(kind(&detached, Some(&data)), "detached");
        let mut odd = host("provisioned");
        odd["status"]["provisioning"]["state"] = json!(7);
        let err = read_host(&odd, Some(&data)).unwrap_err();
        assert_eq!(err.metric_label(), "malformed");
        assert!(err.to_string().contains("status.provisioning.state"), "{err}");
    }

    #[test]
    fn a_host_without_a_status_is_not_provisioned() {
        let mut new = host("provisioned");
        new.as_object_mut().unwrap().remove("status");
        assert_eq!(read_host(&new, None), Err(Unusable::NotProvisioned { state: String::new() }));
    }
}
