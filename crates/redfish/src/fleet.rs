//! One shared client per BMC endpoint, however many servers sit behind it.
//!
//! A chassis manager, an enclosure's BMC or the sushy-tools emulator serves
//! many systems at one address. Giving each server its own [`Bmc`] would
//! open one session per server (BMCs have few session slots), send resets
//! to one BMC at once from many clients, and bound nothing per BMC.
//! [`BmcFleet`] hands every caller that names the same endpoint and account
//! the same [`Bmc`], and every client of one endpoint the same gate: its
//! request bound, its single reset slot and its per-system sequence locks.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as SyncMutex, PoisonError};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard, Semaphore, SemaphorePermit};
use tokio::time::Instant;
use url::Url;

use crate::client::{AuthMode, Bmc, BmcConfig, Timing, http_client};
use crate::credentials::Credentials;
use crate::error::{Error, Result};
use crate::tls::TlsSettings;

/// What every client of one BMC endpoint shares, whatever its account:
/// the endpoint's request bound, its single reset slot, and one sequence
/// lock per system.
pub(crate) struct EndpointGate {
    requests: Semaphore,
    resets: Semaphore,
    sequences: SyncMutex<HashMap<String, Arc<Mutex<()>>>>,
}

impl EndpointGate {
    /// A gate letting `max_requests` requests in flight at once.
    pub(crate) fn new(max_requests: usize) -> Self {
        EndpointGate {
            requests: Semaphore::new(max_requests.clamp(1, Semaphore::MAX_PERMITS)),
            resets: Semaphore::new(1),
            sequences: SyncMutex::new(HashMap::new()),
        }
    }

    /// A permit for one request to this endpoint; `None` once closed.
    pub(crate) async fn request(&self) -> Option<SemaphorePermit<'_>> {
        self.requests.acquire().await.ok()
    }

    /// The endpoint's one reset slot, held while a reset is sent and its
    /// task monitor followed.
    pub(crate) async fn reset(&self) -> Option<SemaphorePermit<'_>> {
        self.resets.acquire().await.ok()
    }

    /// The lock under which one power sequence (read, reset, confirm) runs
    /// on the system at `path`, so two sequences on one system never
    /// interleave while sequences on other systems of the endpoint do.
    pub(crate) async fn sequence(&self, path: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut sequences = self.sequences.lock().unwrap_or_else(PoisonError::into_inner);
            // Locks nobody holds or waits for are dropped, so the map holds
            // at most one entry per system in a sequence right now.
            sequences.retain(|_, lock| Arc::strong_count(lock) > 1);
            sequences.entry(path.to_owned()).or_default().clone()
        };
        lock.lock_owned().await
    }
}

/// Knobs of a [`BmcFleet`].
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// HTTP requests in flight across every endpoint of the fleet.
    pub max_concurrent_requests: usize,
    /// HTTP requests in flight to any one endpoint (most BMCs serve few at once).
    pub max_requests_per_endpoint: usize,
    /// Endpoints kept at most; past it the least recently used idle ones go.
    pub max_endpoints: usize,
    /// An endpoint nobody asked for this long is dropped (and logged out of).
    pub idle_after: Duration,
    pub timing: Timing,
    pub auth: AuthMode,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            max_concurrent_requests: 32,
            max_requests_per_endpoint: 4,
            max_endpoints: 16_384,
            idle_after: Duration::from_secs(600),
            timing: Timing::default(),
            auth: AuthMode::Auto,
        }
    }
}

/// The client of one account on one endpoint, and what it was built from.
struct Account {
    credentials: Credentials,
    tls: TlsSettings,
    bmc: Bmc,
}

struct Endpoint {
    gate: Arc<EndpointGate>,
    /// By username: one client, hence one session, per account.
    accounts: HashMap<String, Account>,
    last_used: Instant,
}

impl Endpoint {
    /// True while a caller holds one of its clients (or a replaced one that
    /// still shares its gate): dropping it then would split the gate.
    fn in_use(&self) -> bool {
        Arc::strong_count(&self.gate) > 1 + self.accounts.len() || self.accounts.values().any(|a| a.bmc.is_shared())
    }
}

/// Clients of many BMCs, one per endpoint and account, shared by every
/// server behind that endpoint.
///
/// # Guarantees
/// - Every caller naming one endpoint (scheme, host and port, compared as a
///   URL origin, so `https://h/` and `https://h:443/` are one) with one
///   username gets the same [`Bmc`]: one Redfish session, opened on first
///   use and opened again once when the BMC answers 401.
/// - Clients with the same TLS settings send through one HTTP client,
///   whose pool keeps each endpoint's connections apart; different
///   settings never share a connection. A BMC costs its session and its
///   connections, not a pool of its own.
/// - A different password or TLS settings for that endpoint and username
///   builds a new client and replaces the old one; calls already running
///   finish on the old client, which logs out once dropped.
/// - All clients of one endpoint, whatever their account, share one gate:
///   at most [`FleetOptions::max_requests_per_endpoint`] requests in flight,
///   one reset at a time (a reset and the task monitor it starts), and one
///   power sequence at a time per system. Reads are held only by the
///   request bounds, never behind a power action.
/// - At most [`FleetOptions::max_concurrent_requests`] requests are in
///   flight across the fleet.
/// - Endpoints unused for [`FleetOptions::idle_after`] are dropped, and past
///   [`FleetOptions::max_endpoints`] the least recently used idle ones; an
///   endpoint a caller still holds a client of is never dropped (so its
///   gate is never split), which lets the count pass the bound by at most
///   the number of endpoints in use at once.
///
/// # Assumptions
/// A CA file is read when the first client with its settings is built, and
/// not again while any cached client has them: a changed bundle must come
/// under a new path to be seen (the controller names bundles by content).
pub struct BmcFleet {
    options: FleetOptions,
    limiter: Arc<Semaphore>,
    endpoints: SyncMutex<Endpoints>,
}

struct Endpoints {
    by_origin: HashMap<String, Endpoint>,
    /// One HTTP client per distinct TLS settings among the accounts, shared
    /// by all their endpoints (its pool keeps connections per origin).
    http: HashMap<TlsSettings, reqwest::Client>,
    last_pruned: Instant,
}

impl std::fmt::Debug for BmcFleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmcFleet").field("endpoints", &self.endpoint_count()).finish_non_exhaustive()
    }
}

impl Default for BmcFleet {
    fn default() -> Self {
        BmcFleet::new(FleetOptions::default())
    }
}

impl BmcFleet {
    pub fn new(options: FleetOptions) -> Self {
        let limiter = Arc::new(Semaphore::new(options.max_concurrent_requests.clamp(1, Semaphore::MAX_PERMITS)));
        let endpoints = SyncMutex::new(Endpoints { by_origin: HashMap::new(), http: HashMap::new(), last_pruned: Instant::now() });
        BmcFleet { options, limiter, endpoints }
    }

    pub fn options(&self) -> &FleetOptions {
        &self.options
    }

    /// The shared client for `credentials` on the BMC at `endpoint`.
    ///
    /// # Guarantees
    /// See [`BmcFleet`]. Cheap when the client exists: a map lookup and a
    /// comparison, no IO.
    ///
    /// # Errors
    /// [`Error::InvalidAddress`] for an endpoint that is not an HTTP(S)
    /// URL with a host; [`Error::TlsConfig`] when the TLS settings cannot be
    /// used (nothing is cached then, and a later call tries again).
    pub fn client(&self, endpoint: &Url, credentials: &Credentials, tls: &TlsSettings) -> Result<Bmc> {
        let origin = origin_of(endpoint)?;
        let now = Instant::now();
        let mut endpoints = self.endpoints.lock().unwrap_or_else(PoisonError::into_inner);
        if !endpoints.by_origin.contains_key(&origin) || now.duration_since(endpoints.last_pruned) >= self.options.idle_after / 4 {
            self.prune(&mut endpoints, now);
        }
        let existing = endpoints.by_origin.get_mut(&origin);
        let gate = match existing {
            Some(entry) => {
                entry.last_used = now;
                match entry.accounts.get(&credentials.username) {
                    Some(account) if account.credentials == *credentials && account.tls == *tls => {
                        return Ok(account.bmc.clone());
                    }
                    Some(account) => {
                        let what = if account.credentials != *credentials { "credentials" } else { "TLS settings" };
                        tracing::info!(endpoint = %origin, username = %credentials.username, "{what} changed; building a new client for this BMC");
                    }
                    None => {}
                }
                entry.gate.clone()
            }
            None => Arc::new(EndpointGate::new(self.options.max_requests_per_endpoint)),
        };
        let config = BmcConfig {
            endpoint: endpoint_root(endpoint),
            credentials: credentials.clone(),
            tls: tls.clone(),
            auth: self.options.auth,
            timing: self.options.timing.clone(),
        };
        // Built under the lock, so that two first calls build one client.
        let http = match endpoints.http.get(tls) {
            Some(http) => http.clone(),
            None => {
                let http = http_client(tls, &self.options.timing)?;
                endpoints.http.insert(tls.clone(), http.clone());
                http
            }
        };
        let bmc = Bmc::with_gate(config, http, self.limiter.clone(), gate.clone());
        let entry = endpoints.by_origin.entry(origin).or_insert_with(|| Endpoint { gate, accounts: HashMap::new(), last_used: now });
        let account = Account { credentials: credentials.clone(), tls: tls.clone(), bmc: bmc.clone() };
        entry.accounts.insert(credentials.username.clone(), account);
        Ok(bmc)
    }

    /// Drops idle endpoints: those unused for `idle_after`, then the least
    /// recently used until there is room for one more.
    fn prune(&self, endpoints: &mut Endpoints, now: Instant) {
        endpoints.last_pruned = now;
        let idle_after = self.options.idle_after;
        endpoints.by_origin.retain(|_, e| e.in_use() || now.duration_since(e.last_used) < idle_after);
        let bound = self.options.max_endpoints.max(1);
        while endpoints.by_origin.len() >= bound {
            let oldest = endpoints.by_origin.iter().filter(|(_, e)| !e.in_use()).min_by_key(|(_, e)| e.last_used).map(|(origin, _)| origin.clone());
            match oldest {
                Some(origin) => {
                    tracing::debug!(endpoint = %origin, "dropping the least recently used BMC client");
                    endpoints.by_origin.remove(&origin);
                }
                None => break,
            }
        }
        // The HTTP clients of TLS settings no cached account has any more.
        let Endpoints { by_origin, http, .. } = endpoints;
        http.retain(|tls, _| by_origin.values().any(|e| e.accounts.values().any(|a| a.tls == *tls)));
    }

    /// How many HTTP clients the fleet holds: one per distinct TLS settings
    /// among its cached clients.
    pub fn http_client_count(&self) -> usize {
        self.endpoints.lock().unwrap_or_else(PoisonError::into_inner).http.len()
    }

    /// How many endpoints have a cached client.
    pub fn endpoint_count(&self) -> usize {
        self.endpoints.lock().unwrap_or_else(PoisonError::into_inner).by_origin.len()
    }

    /// Closes every session of the fleet. Clients stay cached; their next
    /// request logs in again.
    pub async fn shutdown(&self) {
        let clients: Vec<Bmc> = {
            let endpoints = self.endpoints.lock().unwrap_or_else(PoisonError::into_inner);
            endpoints.by_origin.values().flat_map(|e| e.accounts.values().map(|a| a.bmc.clone())).collect()
        };
        for bmc in clients {
            if let Err(err) = bmc.logout().await {
                tracing::warn!(endpoint = %bmc.endpoint(), error = %err, "logout failed");
            }
        }
    }
}

/// `scheme://host[:port]`, the default port left out, as the key of an endpoint.
fn origin_of(endpoint: &Url) -> Result<String> {
    let invalid = |reason: &str| Error::InvalidAddress { address: endpoint.to_string(), reason: reason.into() };
    if !matches!(endpoint.scheme(), "http" | "https") {
        return Err(invalid("a BMC endpoint is an http or https URL"));
    }
    match endpoint.origin() {
        origin @ url::Origin::Tuple(..) => Ok(origin.ascii_serialization()),
        url::Origin::Opaque(_) => Err(invalid("a BMC endpoint needs a host")),
    }
}

/// The endpoint with any path, query or fragment removed.
fn endpoint_root(endpoint: &Url) -> Url {
    let mut root = endpoint.clone();
    root.set_path("/");
    root.set_query(None);
    root.set_fragment(None);
    root
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::Secret;

    fn url(text: &str) -> Url {
        Url::parse(text).unwrap()
    }

    fn admin(password: &str) -> Credentials {
        Credentials::new("admin", Secret::new(password))
    }

    #[test]
    fn one_endpoint_is_one_origin_whatever_the_default_port_or_path() {
        assert_eq!(origin_of(&url("https://10.0.0.1/")).unwrap(), origin_of(&url("https://10.0.0.1:443/redfish/v1")).unwrap());
        assert_ne!(origin_of(&url("https://10.0.0.1/")).unwrap(), origin_of(&url("http://10.0.0.1/")).unwrap());
        assert_ne!(origin_of(&url("https://10.0.0.1:8443/")).unwrap(), origin_of(&url("https://10.0.0.1/")).unwrap());
        assert_eq!(origin_of(&url("file:///tmp/x")).unwrap_err().metric_label(), "invalid_address");
    }

    #[tokio::test]
    async fn same_endpoint_and_account_get_the_same_client_and_a_new_password_a_new_one() {
        let fleet = BmcFleet::default();
        let tls = TlsSettings::default();
        let a = fleet.client(&url("http://127.0.0.1:9/"), &admin("one"), &tls).unwrap();
        let b = fleet.client(&url("http://127.0.0.1:9/redfish/v1/Systems/2"), &admin("one"), &tls).unwrap();
        assert!(a.is_same_client(&b));
        let rotated = fleet.client(&url("http://127.0.0.1:9/"), &admin("two"), &tls).unwrap();
        assert!(!rotated.is_same_client(&a));
        assert!(rotated.is_same_client(&fleet.client(&url("http://127.0.0.1:9/"), &admin("two"), &tls).unwrap()));
        let insecure = TlsSettings { ca_file: None, insecure_skip_verify: true };
        assert!(!rotated.is_same_client(&fleet.client(&url("http://127.0.0.1:9/"), &admin("two"), &insecure).unwrap()));
        assert_eq!(fleet.endpoint_count(), 1);
    }

    #[tokio::test]
    async fn unusable_tls_settings_cache_nothing() {
        let fleet = BmcFleet::default();
        let both = TlsSettings { ca_file: Some("/nonexistent.pem".into()), insecure_skip_verify: true };
        let err = fleet.client(&url("https://127.0.0.1:9/"), &admin("one"), &both).unwrap_err();
        assert_eq!(err.metric_label(), "tls_config");
        assert_eq!(fleet.endpoint_count(), 0);
        fleet.client(&url("https://127.0.0.1:9/"), &admin("one"), &TlsSettings::default()).unwrap();
        assert_eq!(fleet.endpoint_count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn idle_endpoints_are_dropped_past_the_bound_but_one_in_use_is_kept() {
        let options = FleetOptions { max_endpoints: 2, ..FleetOptions::default() };
        let fleet = BmcFleet::new(options);
        let tls = TlsSettings::default();
        let held = fleet.client(&url("http://127.0.0.1:1/"), &admin("x"), &tls).unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(fleet.client(&url("http://127.0.0.1:2/"), &admin("x"), &tls).unwrap());
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(fleet.client(&url("http://127.0.0.1:3/"), &admin("x"), &tls).unwrap());
        // Port 1 is the oldest but held; port 2 went to make room.
        assert_eq!(fleet.endpoint_count(), 2);
        assert!(held.is_same_client(&fleet.client(&url("http://127.0.0.1:1/"), &admin("x"), &tls).unwrap()));
        drop(held);
        tokio::time::advance(fleet.options().idle_after).await;
        drop(fleet.client(&url("http://127.0.0.1:4/"), &admin("x"), &tls).unwrap());
        assert_eq!(fleet.endpoint_count(), 1, "the idle endpoints are gone");
    }

    #[tokio::test(start_paused = true)]
    async fn endpoints_with_the_same_tls_settings_share_one_http_client_kept_while_one_of_them_is() {
        let fleet = BmcFleet::new(FleetOptions { max_endpoints: 3, ..FleetOptions::default() });
        let (tls, insecure) = (TlsSettings::default(), TlsSettings { ca_file: None, insecure_skip_verify: true });
        for port in 1..=2 {
            drop(fleet.client(&url(&format!("https://127.0.0.1:{port}/")), &admin("x"), &tls).unwrap());
        }
        assert_eq!((fleet.endpoint_count(), fleet.http_client_count()), (2, 1), "two BMCs, one HTTP client");
        tokio::time::advance(Duration::from_secs(1)).await;
        let held = fleet.client(&url("https://127.0.0.1:3/"), &admin("x"), &insecure).unwrap();
        assert_eq!(fleet.http_client_count(), 2, "other TLS settings never share a connection");
        // Past the bound the oldest endpoints go; their settings' client goes
        // with the last of them.
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(fleet.client(&url("https://127.0.0.1:4/"), &admin("x"), &insecure).unwrap());
        tokio::time::advance(Duration::from_secs(1)).await;
        drop(fleet.client(&url("https://127.0.0.1:5/"), &admin("x"), &insecure).unwrap());
        assert_eq!(fleet.endpoint_count(), 3);
        assert_eq!(fleet.http_client_count(), 1, "no endpoint left with the default settings");
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn sequences_on_one_system_wait_for_each_other_and_others_do_not() {
        let gate = Arc::new(EndpointGate::new(4));
        let first = gate.sequence("/redfish/v1/Systems/1").await;
        let other = tokio::time::timeout(Duration::from_millis(10), gate.sequence("/redfish/v1/Systems/2")).await;
        assert!(other.is_ok(), "another system is not held");
        let same = tokio::time::timeout(Duration::from_millis(10), gate.sequence("/redfish/v1/Systems/1")).await;
        assert!(same.is_err(), "the same system waits");
        drop(first);
        assert!(tokio::time::timeout(Duration::from_millis(10), gate.sequence("/redfish/v1/Systems/1")).await.is_ok());
    }
}
