//! The provider boundary and the Redfish fleet behind it.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use tokio::task::JoinSet;
use url::Url;

use crate::address::SystemSelector;
use crate::client::{AuthMode, Bmc, Timing, malformed};
use crate::credentials::Credentials;
use crate::error::{Error, Result, Step};
use crate::fleet::{BmcFleet, FleetOptions};
use crate::payload;
use crate::power::{self, PowerOutcome, PowerState, SystemHandle};
use crate::tls::TlsSettings;

/// An error a provider can count by kind.
pub trait LabeledError: std::error::Error + Send + Sync + 'static {
    /// A short, stable label for metrics (`auth_failed`, `unreachable`, ...).
    fn metric_label(&self) -> &'static str;
}

impl LabeledError for Error {
    fn metric_label(&self) -> &'static str {
        Error::metric_label(self)
    }
}

/// Where a power reading came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum WattsSource {
    /// `EnvironmentMetrics` `PowerWatts.Reading` (newer BMCs).
    EnvironmentMetrics,
    /// Chassis `Power` `PowerControl[].PowerConsumedWatts` (older BMCs).
    PowerControl,
    /// A simulated or otherwise derived reading.
    Other,
}

/// One power reading of one server.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Watts {
    pub watts: f64,
    pub source: WattsSource,
    /// The resource read, for audit (`/redfish/v1/Chassis/1U/EnvironmentMetrics`).
    pub resource: String,
}

/// The narrow boundary between ironclaim's controller (or simulator) and
/// whatever powers machines: a Redfish fleet, Metal3, a simulated rack.
///
/// # Contract
/// - Servers are named by the inventory name returned by [`list`](Self::list).
/// - [`power_on`](Self::power_on) and [`power_off`](Self::power_off) are
///   idempotent: asking for the state a server is already in succeeds
///   without acting ([`PowerOutcome::was_no_op`]). They return only once the
///   new state is confirmed, or with an error that says why not; a caller may
///   simply retry later.
/// - A provider sends one reset at a time per management endpoint, runs one
///   power sequence at a time per server, and bounds its own concurrency;
///   callers may fire many calls at once.
/// - Errors carry a [`LabeledError::metric_label`] so failures are counted
///   by kind; none of them carries credentials.
/// - Reads ([`power_state`](Self::power_state), [`watts`](Self::watts)) have
///   no side effects on the servers.
pub trait PowerProvider: Send + Sync {
    type Error: LabeledError;

    /// The names of every server this provider manages, sorted.
    fn list(&self) -> impl Future<Output = Result<Vec<String>, Self::Error>> + Send;

    /// The current power state, read from the source of truth.
    fn power_state(&self, server: &str) -> impl Future<Output = Result<PowerState, Self::Error>> + Send;

    /// Powers the server on and confirms it.
    fn power_on(&self, server: &str) -> impl Future<Output = Result<PowerOutcome, Self::Error>> + Send;

    /// Powers the server off, gracefully first, and confirms it.
    fn power_off(&self, server: &str) -> impl Future<Output = Result<PowerOutcome, Self::Error>> + Send;

    /// The server's present power draw.
    fn watts(&self, server: &str) -> impl Future<Output = Result<Watts, Self::Error>> + Send;
}

/// One server of a Redfish fleet, fully resolved (credentials loaded).
#[derive(Clone, Debug)]
pub struct ServerSpec {
    pub name: String,
    /// `scheme://host:port/` of the BMC.
    pub endpoint: Url,
    pub system: SystemSelector,
    pub credentials: Credentials,
    pub tls: TlsSettings,
}

/// Knobs of a [`RedfishProvider`].
#[derive(Clone, Debug)]
pub struct ProviderOptions {
    /// HTTP requests in flight across the whole fleet, and to any one BMC.
    pub max_concurrent_requests: usize,
    pub timing: Timing,
    pub auth: AuthMode,
}

impl Default for ProviderOptions {
    fn default() -> Self {
        ProviderOptions { max_concurrent_requests: 32, timing: Timing::default(), auth: AuthMode::Auto }
    }
}

/// The outcome of one read of a status sweep.
#[derive(Debug)]
pub struct ServerStatus {
    pub name: String,
    pub result: Result<PowerState>,
    pub latency: Duration,
}

/// Power readings of a fleet: each server's, and the sum of those read.
#[derive(Debug)]
pub struct FleetWatts {
    pub readings: Vec<(String, Result<Watts>, Duration)>,
    pub total_watts: f64,
}

/// A fleet of servers reached through their BMCs over Redfish.
///
/// Servers on the same endpoint with the same account and TLS settings
/// share one [`Bmc`] from a [`BmcFleet`]: one session, one reset at a time,
/// one request bound (see the fleet's guarantees).
#[derive(Debug)]
pub struct RedfishProvider {
    servers: BTreeMap<String, (Bmc, SystemSelector)>,
    bmcs: Vec<Bmc>,
}

impl RedfishProvider {
    /// A provider with a fleet of its own, in which
    /// `options.max_concurrent_requests` bounds the requests in flight both
    /// across all BMCs and to each one.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for a duplicate server name;
    /// [`Error::TlsConfig`] for unusable TLS settings.
    pub fn new(specs: Vec<ServerSpec>, options: ProviderOptions) -> Result<Self> {
        let fleet = BmcFleet::new(FleetOptions {
            max_concurrent_requests: options.max_concurrent_requests,
            max_requests_per_endpoint: options.max_concurrent_requests,
            // The provider holds every client it builds, so none is idle.
            max_endpoints: usize::MAX,
            idle_after: Duration::MAX,
            timing: options.timing,
            auth: options.auth,
        });
        RedfishProvider::with_fleet(specs, &fleet)
    }

    /// A provider whose servers take their clients from `fleet`, sharing
    /// them with every other user of the fleet.
    ///
    /// # Errors
    /// As [`RedfishProvider::new`], and [`Error::InvalidAddress`] for an
    /// endpoint that is not an HTTP(S) URL.
    pub fn with_fleet(specs: Vec<ServerSpec>, fleet: &BmcFleet) -> Result<Self> {
        let mut servers = BTreeMap::new();
        let mut bmcs: Vec<Bmc> = Vec::new();
        for spec in specs {
            let bmc = fleet.client(&spec.endpoint, &spec.credentials, &spec.tls)?;
            if !bmcs.iter().any(|known| known.is_same_client(&bmc)) {
                bmcs.push(bmc.clone());
            }
            if servers.insert(spec.name.clone(), (bmc, spec.system)).is_some() {
                return Err(Error::InvalidAddress { address: spec.name, reason: "duplicate server name".into() });
            }
        }
        Ok(RedfishProvider { servers, bmcs })
    }

    fn server(&self, name: &str) -> Result<&(Bmc, SystemSelector)> {
        self.servers.get(name).ok_or_else(|| Error::UnknownServer { name: name.to_owned() })
    }

    /// Reads every server's power state at once; the shared request bound
    /// keeps the BMCs from being flooded.
    pub async fn status_sweep(&self) -> Vec<ServerStatus> {
        let mut tasks = JoinSet::new();
        for (name, (bmc, selector)) in &self.servers {
            let (name, bmc, selector) = (name.clone(), bmc.clone(), selector.clone());
            tasks.spawn(async move {
                let started = tokio::time::Instant::now();
                let result = read_power_state(&bmc, &selector).await;
                ServerStatus { name, result, latency: started.elapsed() }
            });
        }
        let mut statuses = Vec::with_capacity(self.servers.len());
        while let Some(joined) = tasks.join_next().await {
            if let Ok(status) = joined {
                statuses.push(status);
            }
        }
        statuses.sort_by(|a, b| a.name.cmp(&b.name));
        statuses
    }

    /// Reads every server's watts and sums those that answered.
    pub async fn fleet_watts(&self) -> FleetWatts {
        let mut tasks = JoinSet::new();
        for (name, (bmc, selector)) in &self.servers {
            let (name, bmc, selector) = (name.clone(), bmc.clone(), selector.clone());
            tasks.spawn(async move {
                let started = tokio::time::Instant::now();
                let result = read_watts(&bmc, &selector).await;
                (name, result, started.elapsed())
            });
        }
        let mut readings = Vec::with_capacity(self.servers.len());
        while let Some(joined) = tasks.join_next().await {
            if let Ok(reading) = joined {
                readings.push(reading);
            }
        }
        readings.sort_by(|a, b| a.0.cmp(&b.0));
        let total_watts = readings.iter().filter_map(|(_, r, _)| r.as_ref().ok()).fold(0.0, |sum, w| sum + w.watts);
        FleetWatts { readings, total_watts }
    }

    /// Closes every BMC session. Later calls log in again.
    pub async fn shutdown(&self) {
        for bmc in &self.bmcs {
            if let Err(err) = bmc.logout().await {
                tracing::warn!(endpoint = %bmc.endpoint(), error = %err, "logout failed");
            }
        }
    }
}

/// What a BMC says a system is.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SystemIdentity {
    pub uuid: Option<String>,
    pub serial_number: Option<String>,
}

impl SystemIdentity {
    /// The System's `UUID` and `SerialNumber`, blank ones left out.
    fn of(system: &payload::System) -> Self {
        let given = |field: &Option<String>| field.clone().filter(|f| !f.trim().is_empty());
        SystemIdentity { uuid: given(&system.uuid), serial_number: given(&system.serial_number) }
    }
}

/// One system as a status sweep reads it ([`Bmc::status`]).
#[derive(Debug)]
pub struct SystemStatus {
    pub power_state: PowerState,
    pub identity: SystemIdentity,
    /// Its power draw, or why there is none; `None` when not asked or the
    /// system is not on.
    pub watts: Option<Result<Watts>>,
}

async fn read_power_state(bmc: &Bmc, selector: &SystemSelector) -> Result<PowerState> {
    let path = bmc.resolve(selector).await?;
    power::PowerApi::read_state(&SystemHandle::new(bmc, path), Step::ReadSystem).await
}

/// The power draw of a system: EnvironmentMetrics first, then the older
/// Chassis Power resource, on each chassis the system links.
async fn read_watts(bmc: &Bmc, selector: &SystemSelector) -> Result<Watts> {
    let path = bmc.resolve(selector).await?;
    let system = bmc.get_parsed(Step::ReadSystem, &path, payload::system).await?;
    watts_of(bmc, &path, system.chassis, false).await
}

/// The power draw of the system at `path`, which links `chassis_links`.
/// With `close`, the reading's read closes its connection.
async fn watts_of(bmc: &Bmc, path: &str, mut chassis_links: Vec<String>, close: bool) -> Result<Watts> {
    if chassis_links.is_empty()
        && let Some(collection) = bmc.chassis_collection().await?
    {
        let members = payload::collection_members(&bmc.get_json(Step::ReadChassis, &collection).await?).map_err(|err| malformed(&collection, err))?;
        // Only an unambiguous single chassis can be attributed to the system.
        if members.len() == 1 {
            chassis_links = members;
        }
    }
    if chassis_links.is_empty() {
        return Err(Error::WattsUnavailable { system: path.to_owned(), reason: "the system links no chassis".into() });
    }
    for chassis_path in &chassis_links {
        let chassis = bmc.get_parsed(Step::ReadChassis, chassis_path, payload::chassis).await?;
        if let Some(metrics) = &chassis.environment_metrics
            && let Some(watts) = bmc.read_parsed(Step::ReadWatts, metrics, payload::environment_metrics_watts, close).await?
        {
            return Ok(Watts { watts, source: WattsSource::EnvironmentMetrics, resource: metrics.clone() });
        }
        if let Some(power) = &chassis.power
            && let Some(watts) = bmc.read_parsed(Step::ReadWatts, power, payload::power_control_watts, close).await?
        {
            return Ok(Watts { watts, source: WattsSource::PowerControl, resource: power.clone() });
        }
    }
    Err(Error::WattsUnavailable {
        system: path.to_owned(),
        reason: "no chassis reports EnvironmentMetrics PowerWatts.Reading or PowerControl PowerConsumedWatts".into(),
    })
}

impl Bmc {
    /// The power state of one system on this BMC.
    pub async fn power_state(&self, selector: &SystemSelector) -> Result<PowerState> {
        read_power_state(self, selector).await
    }

    /// Powers one system on (see [`PowerProvider::power_on`]).
    ///
    /// # Guarantees
    /// One power sequence at a time per system: a second call for the same
    /// system waits, then finds it on and sends nothing. Each reset holds
    /// the endpoint's single reset slot while it is sent (and its task
    /// monitor followed), so resets to one BMC never overlap; confirming the
    /// new state does not hold it, so the sequences of several systems
    /// behind one endpoint wait for their states side by side.
    pub async fn power_on(&self, selector: &SystemSelector) -> Result<PowerOutcome> {
        let path = self.resolve(selector).await?;
        let _one_sequence_per_system = self.sequence_lock(&path).await;
        power::power_on(&SystemHandle::new(self, path), self.timing()).await
    }

    /// Powers one system off (see [`PowerProvider::power_off`]), with the
    /// guarantees of [`Bmc::power_on`].
    pub async fn power_off(&self, selector: &SystemSelector) -> Result<PowerOutcome> {
        let path = self.resolve(selector).await?;
        let _one_sequence_per_system = self.sequence_lock(&path).await;
        power::power_off(&SystemHandle::new(self, path), self.timing()).await
    }

    /// The system's hardware identity: its `UUID` (the SMBIOS UUID the
    /// node's kubelet reports as `systemUUID`) and `SerialNumber`.
    pub async fn identity(&self, selector: &SystemSelector) -> Result<SystemIdentity> {
        let path = self.resolve(selector).await?;
        let system = self.get_parsed(Step::ReadSystem, &path, payload::system).await?;
        Ok(SystemIdentity::of(&system))
    }

    /// What a status sweep reads of one system, in one read of the System
    /// and, when it is on and `with_watts`, the reads of its power draw.
    ///
    /// A BMC serving this one system (see [`Bmc::serves_one_system`]) has
    /// the connection closed after the reading's read: the next sweep comes
    /// back long after an idle connection would be dropped, and a fleet of
    /// BMCs answering within milliseconds would otherwise hold thousands of
    /// idle connections at the end of a sweep, some 25 KB each in the
    /// controller. A chassis manager's connection stays for its next system.
    pub async fn status(&self, selector: &SystemSelector, with_watts: bool) -> Result<SystemStatus> {
        let path = self.resolve(selector).await?;
        let (system, power_state) = power::read_system(self, &path, Step::ReadSystem).await?;
        let identity = SystemIdentity::of(&system);
        let watts = if with_watts && power_state == PowerState::On {
            let close = self.serves_one_system().await;
            Some(watts_of(self, &path, system.chassis, close).await)
        } else {
            None
        };
        Ok(SystemStatus { power_state, identity, watts })
    }

    /// The power draw of one system.
    pub async fn watts(&self, selector: &SystemSelector) -> Result<Watts> {
        read_watts(self, selector).await
    }
}

impl PowerProvider for RedfishProvider {
    type Error = Error;

    async fn list(&self) -> Result<Vec<String>> {
        Ok(self.servers.keys().cloned().collect())
    }

    async fn power_state(&self, server: &str) -> Result<PowerState> {
        let (bmc, selector) = self.server(server)?;
        bmc.power_state(selector).await
    }

    async fn power_on(&self, server: &str) -> Result<PowerOutcome> {
        let (bmc, selector) = self.server(server)?;
        bmc.power_on(selector).await
    }

    async fn power_off(&self, server: &str) -> Result<PowerOutcome> {
        let (bmc, selector) = self.server(server)?;
        bmc.power_off(selector).await
    }

    async fn watts(&self, server: &str) -> Result<Watts> {
        let (bmc, selector) = self.server(server)?;
        bmc.watts(selector).await
    }
}
