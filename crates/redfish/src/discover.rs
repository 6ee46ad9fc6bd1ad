//! What a Redfish service says each of its systems is: identity, CPUs,
//! memory, GPUs, network ports, place in the rack and a power reading, for
//! an inventory written from the BMCs themselves (`ironclaim servers
//! discover`).
//!
//! Each fact is read on its own. One that cannot be read, or that the BMC
//! does not report, is left out and listed in [`DiscoveredSystem::unknown`]
//! with the reason; nothing is guessed. Only a system whose own resource
//! cannot be read fails as a whole, and only an endpoint that cannot be
//! reached, logged into or listed fails [`Bmc::inventory`].

use std::collections::BTreeMap;

use serde_json::Value;
use tokio::task::JoinSet;

use crate::address::SystemSelector;
use crate::client::{Bmc, malformed};
use crate::error::{Error, Result, Step};
use crate::payload::{self, ChassisLocation, PayloadResult};
use crate::power::PowerState;
use crate::provider::Watts;

/// The most members read from one collection (processors, DIMMs, ports):
/// more than any machine has, and a bound on what a broken BMC can cost.
const MAX_MEMBERS: usize = 1024;

/// A fact about a system that discovery looks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fact {
    Uuid,
    SerialNumber,
    Cpus,
    Memory,
    Gpus,
    MacAddresses,
    Location,
    Watts,
}

impl Fact {
    pub fn as_str(self) -> &'static str {
        match self {
            Fact::Uuid => "uuid",
            Fact::SerialNumber => "serial number",
            Fact::Cpus => "cpus",
            Fact::Memory => "memory",
            Fact::Gpus => "gpus",
            Fact::MacAddresses => "mac addresses",
            Fact::Location => "location",
            Fact::Watts => "watts",
        }
    }
}

/// A fact left out, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unknown {
    pub fact: Fact,
    pub reason: String,
}

/// GPUs of one model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuModel {
    pub model: String,
    pub count: u32,
}

/// One system as its BMC describes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DiscoveredSystem {
    /// The system's resource, `/redfish/v1/Systems/ID`.
    pub path: String,
    pub id: Option<String>,
    pub uuid: Option<String>,
    pub serial_number: Option<String>,
    pub host_name: Option<String>,
    pub power_state: Option<PowerState>,
    /// Hardware threads: what the kubelet counts as CPUs.
    pub cpus: Option<u64>,
    pub memory_mib: Option<u64>,
    /// `Some(empty)` when the processors were read and none is a GPU.
    pub gpus: Option<Vec<GpuModel>>,
    /// Lowercase, the burnt-in address where the BMC gives it, sorted.
    pub mac_addresses: Option<Vec<String>>,
    pub location: ChassisLocation,
    /// Read only while the system is on.
    pub watts: Option<Watts>,
    /// What could not be determined, in the order of [`Fact`].
    pub unknown: Vec<Unknown>,
}

impl DiscoveredSystem {
    fn unknown(&mut self, fact: Fact, reason: impl Into<String>) {
        self.unknown.push(Unknown { fact, reason: reason.into() });
    }
}

/// The outcome of one system of an endpoint.
#[derive(Debug)]
pub struct SystemOutcome {
    pub path: String,
    pub result: Result<DiscoveredSystem>,
}

/// An error as one reason: its kind, then its message.
fn failed(err: &Error) -> String {
    format!("{}: {err}", err.metric_label())
}

impl Bmc {
    /// Describes every system of the BMC, or only `only`.
    ///
    /// # Guarantees
    /// One outcome per member of the Systems collection (or the one system
    /// selected), sorted by path. Reads only; nothing is changed on the BMC.
    ///
    /// # Errors
    /// What stops the whole endpoint: unreachable, TLS, authentication, a
    /// Systems collection that cannot be read, a selected system not found.
    pub async fn inventory(&self, only: Option<&SystemSelector>) -> Result<Vec<SystemOutcome>> {
        let paths = match only {
            Some(selector) => vec![self.resolve(selector).await?],
            None => {
                let collection = self.systems_collection().await?;
                let members = payload::collection_members(&self.get_json(Step::ResolveSystem, &collection).await?)
                    .map_err(|err| malformed(&collection, err))?;
                members.into_iter().map(|m| m.trim_end_matches('/').to_owned()).collect()
            }
        };
        let mut tasks = JoinSet::new();
        for path in paths {
            let bmc = self.clone();
            tasks.spawn(async move {
                let result = discover_system(&bmc, &path).await;
                SystemOutcome { path, result }
            });
        }
        let mut outcomes = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            if let Ok(outcome) = joined {
                outcomes.push(outcome);
            }
        }
        outcomes.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(outcomes)
    }
}

/// Reads the members of a collection, each through `parse`.
async fn read_members<T>(bmc: &Bmc, collection: &str, parse: fn(&Value) -> PayloadResult<T>) -> Result<Vec<T>> {
    let members = payload::collection_members(&bmc.get_json(Step::ReadInventory, collection).await?).map_err(|err| malformed(collection, err))?;
    let mut parsed = Vec::with_capacity(members.len().min(MAX_MEMBERS));
    for member in members.iter().take(MAX_MEMBERS) {
        let value = bmc.get_json(Step::ReadInventory, member).await?;
        parsed.push(parse(&value).map_err(|err| malformed(member, err))?);
    }
    Ok(parsed)
}

async fn discover_system(bmc: &Bmc, path: &str) -> Result<DiscoveredSystem> {
    let value = bmc.get_json(Step::ReadSystem, path).await?;
    let system = payload::system(&value).map_err(|err| malformed(path, err))?;
    let hardware = payload::system_hardware(&value).map_err(|err| malformed(path, err))?;
    let mut found = DiscoveredSystem {
        path: path.to_owned(),
        id: system.id.clone(),
        uuid: system.uuid.clone().filter(|u| !u.trim().is_empty()),
        serial_number: system.serial_number.clone().filter(|s| !s.trim().is_empty()),
        host_name: hardware.host_name.clone().filter(|h| !h.trim().is_empty()),
        power_state: system.power_state.clone(),
        ..DiscoveredSystem::default()
    };
    if found.uuid.is_none() {
        found.unknown(Fact::Uuid, "the system reports no UUID");
    }
    if found.serial_number.is_none() {
        found.unknown(Fact::SerialNumber, "the system reports no SerialNumber");
    }

    let processors = match &hardware.processors {
        None => Err("the system links no Processors collection".to_owned()),
        Some(collection) => read_members(bmc, collection, payload::processor).await.map_err(|err| failed(&err)),
    };
    match (hardware.logical_processors, cpus_of(&processors)) {
        (Some(threads), _) => found.cpus = Some(threads.round() as u64),
        (None, Ok(threads)) => found.cpus = Some(threads),
        (None, Err(why)) => found.unknown(Fact::Cpus, format!("no ProcessorSummary.LogicalProcessorCount, and {why}")),
    }
    // The chassis: where the system sits, and (in newer schemas) its PCIe
    // devices.
    let chassis = match system.chassis.first() {
        None => Err("the system links no chassis".to_owned()),
        Some(path) => bmc.get_json(Step::ReadChassis, path).await.map(|value| (path.clone(), value)).map_err(|err| failed(&err)),
    };

    // GPUs: the Processors of type GPU; where there are none, the PCIe
    // devices, which is where many BMCs list them. Never both, so none is
    // counted twice.
    match processors.as_ref().map_err(Clone::clone).and_then(|p| gpus_of(p)) {
        Ok(gpus) if !gpus.is_empty() => found.gpus = Some(gpus),
        from_processors => {
            let collection = match &chassis {
                Ok((path, value)) => payload::chassis_pcie_devices(value).map_err(|err| failed(&malformed(path, err))),
                Err(_) => Ok(None),
            };
            let from_pcie = match collection {
                Ok(collection) => pcie_gpus(bmc, &hardware.pcie_devices, collection.as_deref()).await,
                Err(why) => Err(why),
            };
            match (from_processors, from_pcie) {
                (_, Ok(Some(gpus))) => found.gpus = Some(gpus),
                (Ok(none), Ok(None)) => found.gpus = Some(none),
                (Err(why), Ok(None)) => found.unknown(Fact::Gpus, format!("{why}, and the system lists no PCIe devices")),
                (Ok(_), Err(pcie)) => found.unknown(Fact::Gpus, format!("no GPU among the Processors, and {pcie}")),
                (Err(why), Err(pcie)) => found.unknown(Fact::Gpus, format!("{why}, and {pcie}")),
            }
        }
    }

    match hardware.memory_gib {
        Some(gib) => found.memory_mib = Some((gib * 1024.0).round() as u64),
        None => {
            let modules = match &hardware.memory {
                None => Err("the system links no Memory collection".to_owned()),
                Some(collection) => read_members(bmc, collection, payload::memory_module).await.map_err(|err| failed(&err)),
            };
            match modules.and_then(|m| memory_of(&m)) {
                Ok(mib) => found.memory_mib = Some(mib),
                Err(why) => found.unknown(Fact::Memory, format!("no MemorySummary.TotalSystemMemoryGiB, and {why}")),
            }
        }
    }

    let ports = match &hardware.ethernet_interfaces {
        None => Err("the system links no EthernetInterfaces collection".to_owned()),
        Some(collection) => read_members(bmc, collection, payload::ethernet_interface).await.map_err(|err| failed(&err)),
    };
    match ports.map(|p| mac_addresses_of(&p)) {
        Ok(macs) if macs.is_empty() => found.unknown(Fact::MacAddresses, "no network interface reports a MAC address"),
        Ok(macs) => found.mac_addresses = Some(macs),
        Err(why) => found.unknown(Fact::MacAddresses, why),
    }

    match &chassis {
        Err(why) => found.unknown(Fact::Location, why.clone()),
        Ok((path, value)) => match payload::chassis_location(value) {
            Ok(location) if location.is_empty() => {
                found.unknown(Fact::Location, format!("chassis {path} reports no Location.Placement or PartLocation"))
            }
            Ok(location) => found.location = location,
            Err(err) => found.unknown(Fact::Location, failed(&malformed(path, err))),
        },
    }

    match &found.power_state {
        Some(PowerState::On) => match bmc.watts(&SystemSelector::Path(path.to_owned())).await {
            Ok(watts) => found.watts = Some(watts),
            Err(err) => found.unknown(Fact::Watts, failed(&err)),
        },
        Some(state) => found.unknown(Fact::Watts, format!("the system is {state}: power is read only while it is on")),
        None => found.unknown(Fact::Watts, "the system reports no PowerState"),
    }
    found.unknown.sort_by_key(|u| u.fact);
    Ok(found)
}

/// A CPU, as opposed to a GPU, FPGA or other accelerator.
fn is_cpu(processor: &payload::Processor) -> bool {
    processor.processor_type.as_deref().is_none_or(|t| t == "CPU")
}

/// Hardware threads of the populated CPU sockets.
fn cpus_of(processors: &Result<Vec<payload::Processor>, String>) -> Result<u64, String> {
    let processors = processors.as_ref().map_err(Clone::clone)?;
    let present: Vec<_> = processors.iter().filter(|p| is_cpu(p) && !p.absent).collect();
    if present.is_empty() {
        return Err("the Processors collection lists no populated CPU".into());
    }
    present.iter().try_fold(0u64, |sum, p| match p.total_threads {
        Some(threads) => Ok(sum + threads.round() as u64),
        None => Err("a CPU in the Processors collection reports no TotalThreads".to_owned()),
    })
}

/// GPUs by model, from the processors whose ProcessorType is GPU.
fn gpus_of(processors: &[payload::Processor]) -> Result<Vec<GpuModel>, String> {
    let mut by_model: BTreeMap<String, u32> = BTreeMap::new();
    for gpu in processors.iter().filter(|p| p.processor_type.as_deref() == Some("GPU") && !p.absent) {
        let model = gpu.model.as_deref().map(str::trim).filter(|m| !m.is_empty()).ok_or("a GPU in the Processors collection reports no Model")?;
        *by_model.entry(model.to_owned()).or_default() += 1;
    }
    Ok(by_model.into_iter().map(|(model, count)| GpuModel { model, count }).collect())
}

/// GPUs by model among the PCIe devices: the system's own links, else the
/// chassis' collection. `Ok(None)` when neither lists any device.
async fn pcie_gpus(bmc: &Bmc, links: &[String], collection: Option<&str>) -> Result<Option<Vec<GpuModel>>, String> {
    let devices = if !links.is_empty() {
        links.to_vec()
    } else if let Some(collection) = collection {
        let value = bmc.get_json(Step::ReadInventory, collection).await.map_err(|err| failed(&err))?;
        payload::collection_members(&value).map_err(|err| failed(&malformed(collection, err)))?
    } else {
        return Ok(None);
    };
    let mut by_model: BTreeMap<String, u32> = BTreeMap::new();
    for path in devices.iter().take(MAX_MEMBERS) {
        let value = bmc.get_json(Step::ReadInventory, path).await.map_err(|err| failed(&err))?;
        let device = payload::pcie_device(&value).map_err(|err| failed(&malformed(path, err)))?;
        if device.absent {
            continue;
        }
        let functions = match &device.functions {
            Some(collection) => read_members(bmc, collection, payload::pcie_function).await.map_err(|err| failed(&err))?,
            None => {
                let mut functions = Vec::new();
                for link in device.function_links.iter().take(MAX_MEMBERS) {
                    let value = bmc.get_json(Step::ReadInventory, link).await.map_err(|err| failed(&err))?;
                    functions.push(payload::pcie_function(&value).map_err(|err| failed(&malformed(link, err)))?);
                }
                functions
            }
        };
        if functions.iter().any(is_gpu) {
            let model = [&device.model, &device.name]
                .into_iter()
                .flatten()
                .map(|m| m.trim())
                .find(|m| !m.is_empty())
                .ok_or_else(|| format!("the GPU {path} reports no Model or Name"))?;
            *by_model.entry(model.to_owned()).or_default() += 1;
        }
    }
    Ok(Some(by_model.into_iter().map(|(model, count)| GpuModel { model, count }).collect()))
}

/// PCI vendors whose display controllers are GPUs for pods: NVIDIA, AMD,
/// Intel. The onboard VGA of a server (ASPEED, Matrox) is one too, by class,
/// and is left out by vendor.
const GPU_VENDORS: [&str; 3] = ["0x10de", "0x1002", "0x8086"];

/// A GPU or accelerator function, as opposed to a NIC, a disk controller or
/// the onboard VGA.
fn is_gpu(function: &payload::PcieFunction) -> bool {
    match function.device_class.as_deref() {
        Some("ProcessingAccelerators") => true,
        Some("DisplayController") => function.vendor_id.as_deref().is_some_and(|v| GPU_VENDORS.iter().any(|g| v.trim().eq_ignore_ascii_case(g))),
        _ => false,
    }
}

/// Installed memory, from the populated modules.
fn memory_of(modules: &[payload::MemoryModule]) -> Result<u64, String> {
    let present: Vec<_> = modules.iter().filter(|m| !m.absent).collect();
    if present.is_empty() {
        return Err("the Memory collection lists no populated module".into());
    }
    present.iter().try_fold(0u64, |sum, m| match m.capacity_mib {
        Some(mib) => Ok(sum + mib.round() as u64),
        None => Err("a module in the Memory collection reports no CapacityMiB".to_owned()),
    })
}

/// The network ports' addresses: burnt-in where given, lowercase, each
/// once; the host's channel to its BMC and unset addresses left out.
fn mac_addresses_of(ports: &[payload::EthernetInterface]) -> Vec<String> {
    let mut macs: Vec<String> = ports
        .iter()
        .filter(|p| !p.host_interface && !p.absent)
        .filter_map(|p| p.permanent_mac_address.as_deref().filter(|m| !m.trim().is_empty()).or(p.mac_address.as_deref()))
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
    use crate::payload::{EthernetInterface, MemoryModule, Processor};

    fn cpu(threads: Option<f64>, absent: bool) -> Processor {
        Processor { processor_type: Some("CPU".into()), total_threads: threads, absent, ..Processor::default() }
    }

    fn gpu(model: &str) -> Processor {
        Processor { processor_type: Some("GPU".into()), model: Some(model.into()), ..Processor::default() }
    }

    #[test]
    fn cpus_count_the_threads_of_populated_sockets_only() {
        assert_eq!(cpus_of(&Ok(vec![cpu(Some(16.0), false), cpu(None, true), gpu("A100")])), Ok(16));
        assert!(cpus_of(&Ok(vec![cpu(Some(16.0), false), cpu(None, false)])).unwrap_err().contains("TotalThreads"));
        assert!(cpus_of(&Ok(vec![gpu("A100")])).unwrap_err().contains("no populated CPU"));
    }

    #[test]
    fn gpus_are_grouped_by_model_and_a_nameless_one_is_not_guessed() {
        let gpus = gpus_of(&[gpu("H100"), cpu(Some(8.0), false), gpu("A100"), gpu("H100")]).unwrap();
        assert_eq!(gpus, vec![GpuModel { model: "A100".into(), count: 1 }, GpuModel { model: "H100".into(), count: 2 }]);
        let nameless = Processor { processor_type: Some("GPU".into()), ..Processor::default() };
        assert!(gpus_of(&[nameless]).is_err());
        assert_eq!(gpus_of(&[cpu(Some(8.0), false)]), Ok(vec![]));
    }

    #[test]
    fn memory_sums_populated_modules_and_refuses_an_unsized_one() {
        let dimm = |mib: Option<f64>, absent| MemoryModule { capacity_mib: mib, absent };
        assert_eq!(memory_of(&[dimm(Some(32768.0), false), dimm(None, true), dimm(Some(32768.0), false)]), Ok(65536));
        assert!(memory_of(&[dimm(Some(32768.0), false), dimm(None, false)]).is_err());
        assert!(memory_of(&[dimm(None, true)]).is_err());
    }

    #[test]
    fn mac_addresses_prefer_the_burnt_in_one_and_skip_the_bmc_channel() {
        let port = |mac: &str, permanent: Option<&str>, host_interface| EthernetInterface {
            mac_address: Some(mac.into()),
            permanent_mac_address: permanent.map(str::to_owned),
            host_interface,
            absent: false,
        };
        let macs = mac_addresses_of(&[
            port("AA:BB:CC:DD:EE:00", Some("12:44:6A:3B:88:90"), false),
            port("12:44:6A:3B:04:11", None, false),
            port("12:44:6a:3b:04:11", Some(""), false),
            port("AA:BB:CC:DD:EE:FE", None, true),
            port("00:00:00:00:00:00", None, false),
        ]);
        assert_eq!(macs, vec!["12:44:6a:3b:04:11", "12:44:6a:3b:88:90"]);
    }
}
