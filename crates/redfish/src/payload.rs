//! Tolerant parsers for the few Redfish payload fields ironclaim reads.
//!
//! Each parser reads only what it needs and ignores everything else, so one
//! vendor's odd OEM field never breaks a power read. Every failure names the
//! JSON path (`$.Actions["#ComputerSystem.Reset"].target`) of the field that
//! was missing or of the wrong type. Parsers never panic, whatever the input.

use serde_json::Value;

use crate::power::PowerState;

/// A payload that could not be read, with the JSON path of the culprit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PayloadError {
    pub path: String,
    pub reason: String,
}

pub type PayloadResult<T> = Result<T, PayloadError>;

/// Parses a response body. Empty or truncated bodies and invalid JSON are
/// errors at `$`.
pub fn parse_body(bytes: &[u8]) -> PayloadResult<Value> {
    serde_json::from_slice(bytes).map_err(|err| PayloadError { path: "$".into(), reason: err.to_string() })
}

/// A position inside a JSON document that remembers how it got there.
#[derive(Clone, Copy)]
struct At<'a> {
    value: &'a Value,
    path: &'a str,
}

fn child_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if plain { format!("{parent}.{key}") } else { format!("{parent}[{key:?}]") }
}

impl<'a> At<'a> {
    fn root(value: &'a Value) -> Self {
        At { value, path: "$" }
    }

    fn error(&self, path: String, reason: impl Into<String>) -> PayloadError {
        PayloadError { path, reason: reason.into() }
    }

    fn object(&self) -> PayloadResult<&'a serde_json::Map<String, Value>> {
        self.value.as_object().ok_or_else(|| self.error(self.path.to_owned(), format!("expected an object, found {}", kind(self.value))))
    }

    /// The field, or None when absent or null.
    fn get(&self, key: &str) -> PayloadResult<Option<(&'a Value, String)>> {
        Ok(self.object()?.get(key).filter(|v| !v.is_null()).map(|v| (v, child_path(self.path, key))))
    }

    fn str_field(&self, key: &str) -> PayloadResult<Option<&'a str>> {
        match self.get(key)? {
            None => Ok(None),
            Some((Value::String(s), _)) => Ok(Some(s.as_str())),
            Some((other, path)) => Err(self.error(path, format!("expected a string, found {}", kind(other)))),
        }
    }

    fn required_str(&self, key: &str) -> PayloadResult<&'a str> {
        self.str_field(key)?.ok_or_else(|| self.error(child_path(self.path, key), "missing"))
    }

    /// The `@odata.id` of a navigation link stored under `key`.
    fn link(&self, key: &str) -> PayloadResult<Option<String>> {
        match self.get(key)? {
            None => Ok(None),
            Some((value, path)) => At { value, path: &path }.odata_id().map(Some),
        }
    }

    fn odata_id(&self) -> PayloadResult<String> {
        self.required_str("@odata.id").map(str::to_owned)
    }

    fn number(&self, key: &str) -> PayloadResult<Option<f64>> {
        match self.get(key)? {
            None => Ok(None),
            Some((Value::Number(n), path)) => match n.as_f64() {
                Some(x) if x.is_finite() && x >= 0.0 => Ok(Some(x)),
                _ => Err(self.error(path, format!("expected a non-negative reading, found {n}"))),
            },
            Some((other, path)) => Err(self.error(path, format!("expected a number, found {}", kind(other)))),
        }
    }

    fn string_list(&self, key: &str) -> PayloadResult<Option<Vec<String>>> {
        match self.get(key)? {
            None => Ok(None),
            Some((Value::Array(items), path)) => items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(s.clone()),
                    other => Err(self.error(format!("{path}[{i}]"), format!("expected a string, found {}", kind(other)))),
                })
                .collect::<PayloadResult<Vec<_>>>()
                .map(Some),
            Some((other, path)) => Err(self.error(path, format!("expected an array, found {}", kind(other)))),
        }
    }

    /// Calls `f` on each element of the array under `key` (absent = empty).
    fn each<T>(&self, key: &str, mut f: impl FnMut(At<'_>) -> PayloadResult<T>) -> PayloadResult<Vec<T>> {
        match self.get(key)? {
            None => Ok(Vec::new()),
            Some((Value::Array(items), path)) => items
                .iter()
                .enumerate()
                .map(|(i, value)| {
                    let path = format!("{path}[{i}]");
                    f(At { value, path: &path })
                })
                .collect(),
            Some((other, path)) => Err(self.error(path, format!("expected an array, found {}", kind(other)))),
        }
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// What the service root tells us.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceRoot {
    pub systems: Option<String>,
    pub chassis: Option<String>,
    /// The session collection, when the service offers sessions.
    pub sessions: Option<String>,
}

pub fn service_root(value: &Value) -> PayloadResult<ServiceRoot> {
    let at = At::root(value);
    let mut sessions = match at.get("Links")? {
        Some((links, path)) => At { value: links, path: &path }.link("Sessions")?,
        None => None,
    };
    if sessions.is_none()
        && let Some(service) = at.link("SessionService")?
    {
        sessions = Some(format!("{}/Sessions", service.trim_end_matches('/')));
    }
    Ok(ServiceRoot { systems: at.link("Systems")?, chassis: at.link("Chassis")?, sessions })
}

/// The `@odata.id` of each member of a collection.
pub fn collection_members(value: &Value) -> PayloadResult<Vec<String>> {
    At::root(value).each("Members", |member| member.odata_id())
}

/// The `ComputerSystem.Reset` action as the system advertises it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResetAction {
    pub target: String,
    /// `ResetType@Redfish.AllowableValues`, when listed inline.
    pub allowable: Option<Vec<String>>,
    /// `@Redfish.ActionInfo`, when the values live in a separate resource.
    pub action_info: Option<String>,
}

/// The fields of a ComputerSystem that power control needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct System {
    pub odata_id: Option<String>,
    pub id: Option<String>,
    pub uuid: Option<String>,
    pub serial_number: Option<String>,
    pub power_state: Option<PowerState>,
    pub reset: Option<ResetAction>,
    /// `Links.Chassis`, where the power readings live.
    pub chassis: Vec<String>,
}

pub fn system(value: &Value) -> PayloadResult<System> {
    let at = At::root(value);
    let reset = match at.get("Actions")? {
        None => None,
        Some((actions, path)) => match (At { value: actions, path: &path }).get("#ComputerSystem.Reset")? {
            None => None,
            Some((reset, path)) => {
                let reset = At { value: reset, path: &path };
                Some(ResetAction {
                    target: reset.required_str("target")?.to_owned(),
                    allowable: reset.string_list("ResetType@Redfish.AllowableValues")?,
                    action_info: reset.str_field("@Redfish.ActionInfo")?.map(str::to_owned),
                })
            }
        },
    };
    let chassis = match at.get("Links")? {
        None => Vec::new(),
        Some((links, path)) => At { value: links, path: &path }.each("Chassis", |c| c.odata_id())?,
    };
    Ok(System {
        odata_id: at.str_field("@odata.id")?.map(str::to_owned),
        id: at.str_field("Id")?.map(str::to_owned),
        uuid: at.str_field("UUID")?.map(str::to_owned),
        serial_number: at.str_field("SerialNumber")?.map(str::to_owned),
        power_state: at.str_field("PowerState")?.map(PowerState::from_redfish),
        reset,
        chassis,
    })
}

/// The allowed values of the `ResetType` parameter in an ActionInfo.
/// `Ok(None)` when the ActionInfo does not constrain ResetType.
pub fn action_info_reset_types(value: &Value) -> PayloadResult<Option<Vec<String>>> {
    let params = At::root(value)
        .each("Parameters", |param| if param.str_field("Name")? == Some("ResetType") { param.string_list("AllowableValues") } else { Ok(None) })?;
    Ok(params.into_iter().flatten().next())
}

/// Links from a Chassis to its power readings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chassis {
    pub environment_metrics: Option<String>,
    pub power: Option<String>,
}

pub fn chassis(value: &Value) -> PayloadResult<Chassis> {
    let at = At::root(value);
    Ok(Chassis { environment_metrics: at.link("EnvironmentMetrics")?, power: at.link("Power")? })
}

/// `PowerControl[].PowerConsumedWatts` of a (deprecated but widespread)
/// Chassis Power resource: the first entry with a reading. The first entry
/// is the whole-chassis input on every vendor seen; later ones are domains
/// of it, so summing would double-count.
pub fn power_control_watts(value: &Value) -> PayloadResult<Option<f64>> {
    let readings = At::root(value).each("PowerControl", |control| control.number("PowerConsumedWatts"))?;
    Ok(readings.into_iter().flatten().next())
}

/// `PowerWatts.Reading` of an EnvironmentMetrics resource.
pub fn environment_metrics_watts(value: &Value) -> PayloadResult<Option<f64>> {
    match At::root(value).get("PowerWatts")? {
        None => Ok(None),
        Some((power, path)) => At { value: power, path: &path }.number("Reading"),
    }
}

/// A Redfish Task as a task monitor returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Task {
    pub state: Option<String>,
    pub message: Option<String>,
}

impl Task {
    /// Finished successfully (`Completed`).
    pub fn completed(&self) -> bool {
        self.state.as_deref() == Some("Completed")
    }

    /// Finished unsuccessfully (`Exception`, `Killed`, `Cancelled`).
    pub fn failed(&self) -> bool {
        matches!(self.state.as_deref(), Some("Exception" | "Killed" | "Cancelled"))
    }
}

pub fn task(value: &Value) -> PayloadResult<Task> {
    let at = At::root(value);
    let messages = at.each("Messages", |m| Ok(m.str_field("Message")?.map(str::to_owned)))?;
    Ok(Task { state: at.str_field("TaskState")?.map(str::to_owned), message: messages.into_iter().flatten().next() })
}

/// The human message of a Redfish error body, if there is one. Never fails:
/// it only decorates an error that is already being reported.
pub fn error_message(value: &Value) -> Option<String> {
    let error = value.get("error")?;
    let extended = error
        .get("@Message.ExtendedInfo")
        .and_then(Value::as_array)
        .and_then(|infos| infos.iter().find_map(|info| info.get("Message").and_then(Value::as_str)));
    let message = extended.or_else(|| error.get("message").and_then(Value::as_str))?;
    const MAX_CHARS: usize = 300;
    if message.chars().count() > MAX_CHARS { Some(message.chars().take(MAX_CHARS).chain(['…']).collect()) } else { Some(message.to_owned()) }
}

/// What a ComputerSystem says about its hardware, for an inventory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SystemHardware {
    pub host_name: Option<String>,
    /// `ProcessorSummary.LogicalProcessorCount`: hardware threads, what the
    /// kubelet counts as CPUs.
    pub logical_processors: Option<f64>,
    /// `MemorySummary.TotalSystemMemoryGiB`.
    pub memory_gib: Option<f64>,
    /// The `Processors`, `Memory` and `EthernetInterfaces` collections.
    pub processors: Option<String>,
    pub memory: Option<String>,
    pub ethernet_interfaces: Option<String>,
    /// `PCIeDevices`: links to the system's PCIe devices (deprecated in
    /// favour of the chassis' collection, still what many BMCs serve).
    pub pcie_devices: Vec<String>,
}

/// The object under `key`, or None when absent or null.
fn nested<T>(at: &At<'_>, key: &str, f: impl FnOnce(At<'_>) -> PayloadResult<T>) -> PayloadResult<Option<T>> {
    match at.get(key)? {
        None => Ok(None),
        Some((value, path)) => f(At { value, path: &path }).map(Some),
    }
}

/// True when `Status.State` says the part is not there or switched off.
fn absent(at: &At<'_>) -> PayloadResult<bool> {
    Ok(nested(at, "Status", |status| Ok(matches!(status.str_field("State")?, Some("Absent" | "Disabled"))))?.unwrap_or(false))
}

pub fn system_hardware(value: &Value) -> PayloadResult<SystemHardware> {
    let at = At::root(value);
    Ok(SystemHardware {
        host_name: at.str_field("HostName")?.map(str::to_owned),
        logical_processors: nested(&at, "ProcessorSummary", |s| s.number("LogicalProcessorCount"))?.flatten(),
        memory_gib: nested(&at, "MemorySummary", |s| s.number("TotalSystemMemoryGiB"))?.flatten(),
        processors: at.link("Processors")?,
        memory: at.link("Memory")?,
        ethernet_interfaces: at.link("EthernetInterfaces")?,
        pcie_devices: at.each("PCIeDevices", |d| d.odata_id())?,
    })
}

/// The chassis' `PCIeDevices` collection.
pub fn chassis_pcie_devices(value: &Value) -> PayloadResult<Option<String>> {
    At::root(value).link("PCIeDevices")
}

/// One PCIe device: a card or an onboard controller.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PcieDevice {
    pub name: Option<String>,
    pub model: Option<String>,
    /// The `PCIeFunctions` collection (PCIeDevice 1.4 and later).
    pub functions: Option<String>,
    /// `Links.PCIeFunctions`: the functions of older schemas, by link.
    pub function_links: Vec<String>,
    /// `Status.State` is `Absent` or `Disabled`: an empty slot.
    pub absent: bool,
}

pub fn pcie_device(value: &Value) -> PayloadResult<PcieDevice> {
    let at = At::root(value);
    let function_links = match at.get("Links")? {
        None => Vec::new(),
        Some((links, path)) => At { value: links, path: &path }.each("PCIeFunctions", |f| f.odata_id())?,
    };
    Ok(PcieDevice {
        name: at.str_field("Name")?.map(str::to_owned),
        model: at.str_field("Model")?.map(str::to_owned),
        functions: at.link("PCIeFunctions")?,
        function_links,
        absent: absent(&at)?,
    })
}

/// One function of a PCIe device: what class of device it is, and whose.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PcieFunction {
    /// `DisplayController`, `ProcessingAccelerators`, `NetworkController`, ...
    pub device_class: Option<String>,
    /// The PCI vendor ID, as `0x10de`.
    pub vendor_id: Option<String>,
}

pub fn pcie_function(value: &Value) -> PayloadResult<PcieFunction> {
    let at = At::root(value);
    Ok(PcieFunction { device_class: at.str_field("DeviceClass")?.map(str::to_owned), vendor_id: at.str_field("VendorId")?.map(str::to_owned) })
}

/// One member of a Processors collection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Processor {
    /// `CPU`, `GPU`, `FPGA`, `Accelerator`, ...
    pub processor_type: Option<String>,
    pub model: Option<String>,
    pub total_threads: Option<f64>,
    pub total_cores: Option<f64>,
    /// `Status.State` is `Absent` or `Disabled`: an empty socket.
    pub absent: bool,
}

pub fn processor(value: &Value) -> PayloadResult<Processor> {
    let at = At::root(value);
    Ok(Processor {
        processor_type: at.str_field("ProcessorType")?.map(str::to_owned),
        model: at.str_field("Model")?.map(str::to_owned),
        total_threads: at.number("TotalThreads")?,
        total_cores: at.number("TotalCores")?,
        absent: absent(&at)?,
    })
}

/// One member of a Memory collection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MemoryModule {
    pub capacity_mib: Option<f64>,
    /// An empty slot.
    pub absent: bool,
}

pub fn memory_module(value: &Value) -> PayloadResult<MemoryModule> {
    let at = At::root(value);
    Ok(MemoryModule { capacity_mib: at.number("CapacityMiB")?, absent: absent(&at)? })
}

/// One member of an EthernetInterfaces collection.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EthernetInterface {
    pub mac_address: Option<String>,
    pub permanent_mac_address: Option<String>,
    /// `Links.HostInterface`: the host's channel to its own BMC, not a
    /// network port.
    pub host_interface: bool,
    pub absent: bool,
}

pub fn ethernet_interface(value: &Value) -> PayloadResult<EthernetInterface> {
    let at = At::root(value);
    Ok(EthernetInterface {
        mac_address: at.str_field("MACAddress")?.map(str::to_owned),
        permanent_mac_address: at.str_field("PermanentMACAddress")?.map(str::to_owned),
        host_interface: nested(&at, "Links", |links| Ok(links.get("HostInterface")?.is_some()))?.unwrap_or(false),
        absent: absent(&at)?,
    })
}

/// Where a chassis is: `Location.Placement` and `Location.PartLocation`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChassisLocation {
    pub rack: Option<String>,
    pub row: Option<String>,
    /// `Placement.RackOffset`: the lowest rack unit it occupies.
    pub rack_offset: Option<String>,
    /// `PartLocation.ServiceLabel`: the slot or bay printed on the enclosure.
    pub slot: Option<String>,
}

impl ChassisLocation {
    pub fn is_empty(&self) -> bool {
        *self == ChassisLocation::default()
    }
}

pub fn chassis_location(value: &Value) -> PayloadResult<ChassisLocation> {
    let at = At::root(value);
    let location = nested(&at, "Location", |location| {
        let placement = nested(&location, "Placement", |p| {
            let offset = match p.get("RackOffset")? {
                Some((Value::String(s), _)) => Some(s.clone()),
                _ => p.number("RackOffset")?.map(|n| if n.fract() == 0.0 { format!("{n:.0}") } else { n.to_string() }),
            };
            Ok((p.str_field("Rack")?.map(str::to_owned), p.str_field("Row")?.map(str::to_owned), offset))
        })?;
        let slot = nested(&location, "PartLocation", |p| Ok(p.str_field("ServiceLabel")?.map(str::to_owned)))?.flatten();
        let (rack, row, rack_offset) = placement.unwrap_or_default();
        Ok(ChassisLocation { rack, row, rack_offset, slot })
    })?;
    Ok(location.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_reset_target_names_its_path() {
        let err = system(&json!({"Actions": {"#ComputerSystem.Reset": {}}})).unwrap_err();
        assert_eq!(err.path, r##"$.Actions["#ComputerSystem.Reset"].target"##);
    }

    #[test]
    fn wrong_type_in_power_control_names_the_index() {
        let err = power_control_watts(&json!({"PowerControl": [{"PowerConsumedWatts": null}, {"PowerConsumedWatts": "12"}]})).unwrap_err();
        assert_eq!(err.path, "$.PowerControl[1].PowerConsumedWatts");
    }

    #[test]
    fn null_readings_are_absent_not_errors() {
        assert_eq!(environment_metrics_watts(&json!({"PowerWatts": {"Reading": null}})).unwrap(), None);
        assert_eq!(power_control_watts(&json!({"PowerControl": [{"PowerConsumedWatts": null}, {"PowerConsumedWatts": 7}]})).unwrap(), Some(7.0));
    }

    #[test]
    fn action_info_yields_reset_type_values_only() {
        let info = json!({"Parameters": [
            {"Name": "Other", "AllowableValues": ["x"]},
            {"Name": "ResetType", "AllowableValues": ["ForceOn", "ForceOff"]}
        ]});
        assert_eq!(action_info_reset_types(&info).unwrap(), Some(vec!["ForceOn".into(), "ForceOff".into()]));
        assert_eq!(action_info_reset_types(&json!({})).unwrap(), None);
    }

    #[test]
    fn a_rack_place_is_read_from_placement_and_part_location() {
        let placed = json!({"Location": {"Placement": {"Rack": "R7", "Row": "B", "RackOffset": 42}, "PartLocation": {"ServiceLabel": "Bay 3"}}});
        let location = chassis_location(&placed).unwrap();
        assert_eq!(
            (location.rack.as_deref(), location.row.as_deref(), location.rack_offset.as_deref(), location.slot.as_deref()),
            (Some("R7"), Some("B"), Some("42"), Some("Bay 3"))
        );
        assert_eq!(chassis_location(&json!({"Location": {"Placement": {"RackOffset": "U12"}}})).unwrap().rack_offset.as_deref(), Some("U12"));
        assert!(chassis_location(&json!({"Id": "1U"})).unwrap().is_empty());
        assert_eq!(chassis_location(&json!({"Location": {"Placement": {"Rack": 7}}})).unwrap_err().path, "$.Location.Placement.Rack");
    }

    #[test]
    fn an_empty_socket_and_the_bmc_channel_are_told_apart() {
        assert!(processor(&json!({"ProcessorType": "CPU", "Status": {"State": "Absent"}})).unwrap().absent);
        assert!(!processor(&json!({"ProcessorType": "CPU", "TotalThreads": 8})).unwrap().absent);
        assert!(ethernet_interface(&json!({"Links": {"HostInterface": {"@odata.id": "/x"}}})).unwrap().host_interface);
        assert_eq!(processor(&json!({"TotalThreads": "8"})).unwrap_err().path, "$.TotalThreads");
    }

    #[test]
    fn error_message_prefers_extended_info() {
        let body = json!({"error": {"message": "generic", "@Message.ExtendedInfo": [{"Message": "specific"}]}});
        assert_eq!(error_message(&body).as_deref(), Some("specific"));
        assert_eq!(error_message(&json!([1])), None);
    }
}
