//! The boundary between the controller and whatever powers machines.
//!
//! One narrow trait, [`Power`], with four implementations:
//! [`RedfishPower`] (the server's own BMC, credentials from the Secret its
//! spec references, one shared client per BMC endpoint), [`Metal3Power`]
//! (`spec.online` on a Metal3 BareMetalHost that is already provisioned),
//! [`crate::ExternalPower`] (a user's command or HTTPS endpoint) and
//! [`crate::ClusterApiPower`] (a Machine of a Cluster API
//! MachineDeployment).
//! [`ProviderRouter`] picks one per server by `spec.provider.type`;
//! Redfish when it is unset. The annotation `ironclaim.dev/baremetalhost:
//! NAMESPACE/NAME` on a Server without `spec.provider` is still read, with
//! a warning: it is deprecated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::{Bmc as ServerBmc, PowerState, ProviderType};
use ironclaim_k8s::api::serverclaim::FailureReason;
use ironclaim_k8s::metal3::DETACHED_ANNOTATION as METAL3_DETACHED_ANNOTATION;
use ironclaim_redfish::{
    Bmc as RedfishBmc, BmcAddress, BmcFleet, Credentials, FleetOptions, SecretRef, SystemSelector, Timing, TlsSettings, ca_bundle_file,
};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// The annotation that handed a Server's power to a Metal3 BareMetalHost
/// before `spec.provider`. Deprecated: read only when `spec.provider` is
/// absent.
pub const BAREMETALHOST_ANNOTATION: &str = "ironclaim.dev/baremetalhost";

/// Which provider powers this server: `spec.provider.type`, or, without
/// `spec.provider`, Metal3 when the deprecated annotation names a host and
/// Redfish otherwise.
pub fn provider_type(server: &Server) -> ProviderType {
    match &server.spec.provider {
        Some(provider) => provider.type_,
        None if server.annotations().contains_key(BAREMETALHOST_ANNOTATION) => ProviderType::Metal3,
        None => ProviderType::Redfish,
    }
}

/// Whether Metal3 powers this server (see [`provider_type`]).
pub fn uses_metal3(server: &Server) -> bool {
    provider_type(server) == ProviderType::Metal3
}

/// Whether the server's own BMC powers it, over Redfish (see
/// [`provider_type`]).
pub fn uses_redfish(server: &Server) -> bool {
    provider_type(server) == ProviderType::Redfish
}

/// Why a power action or read failed, typed for the claim's status.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct PowerError {
    /// The failure as the ServerClaim names it.
    pub reason: FailureReason,
    /// The provider's own label for metrics (`unreachable`, `auth_failed`).
    pub label: &'static str,
    pub message: String,
}

impl PowerError {
    pub fn metric_label(&self) -> &'static str {
        self.label
    }

    fn new(reason: FailureReason, label: &'static str, message: impl Into<String>) -> Self {
        PowerError { reason, label, message: message.into() }
    }
}

impl From<ironclaim_redfish::Error> for PowerError {
    fn from(err: ironclaim_redfish::Error) -> Self {
        let label = err.metric_label();
        use ironclaim_redfish::Error as E;
        let reason = match &err {
            // A handshake can fail mid-restart of a BMC: retried, not held
            // as configuration.
            E::Unreachable { .. } | E::RequestTimedOut { .. } | E::TlsHandshake { .. } => FailureReason::BmcUnreachable,
            E::AuthFailed { .. } => FailureReason::BmcAuthenticationFailed,
            E::CredentialsUnreadable { .. } => FailureReason::BmcCredentialsMissing,
            // Faults of the Server's spec: they will not pass by themselves.
            E::InvalidAddress { .. } | E::TlsConfig { .. } | E::SystemNotFound { .. } => FailureReason::BmcConfigInvalid,
            E::TimedOutWaitingForState { .. } => FailureReason::PowerOnTimedOut,
            _ => FailureReason::PowerActionFailed,
        };
        // The whole chain: "BMC unreachable while ...: connection refused".
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        PowerError::new(reason, label, message)
    }
}

/// Why the credentials Secret of server `server` could not be read, in
/// one line: missing or forbidden is a fault of configuration (the
/// Secret must be created, or the controller allowed to read it); any
/// other error is the API's, and passes.
fn secret_unreadable(server: &str, namespace: &str, name: &str, err: &kube::Error) -> PowerError {
    let what = format!("the BMC credentials Secret {namespace}/{name} (spec.bmc.credentialsSecretRef of Server {server})");
    match err {
        kube::Error::Api(status) if status.code == 404 => PowerError::new(
            FailureReason::BmcCredentialsMissing,
            "credentials_missing",
            format!("{what} does not exist: create it with keys username and password"),
        ),
        kube::Error::Api(status) if status.code == 403 => PowerError::new(
            FailureReason::BmcCredentialsMissing,
            "credentials_forbidden",
            format!("{what} may not be read by the controller: {}", status.message),
        ),
        kube::Error::Api(status) => {
            PowerError::new(FailureReason::PowerActionFailed, "credentials_unreadable", format!("cannot read {what}: {}", status.message))
        }
        other => PowerError::new(FailureReason::PowerActionFailed, "credentials_unreadable", format!("cannot read {what}: {other}")),
    }
}

pub type PowerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, PowerError>> + Send + 'a>>;

/// Powers servers on and off and reads their state.
///
/// # Contract
/// - `power_on` and `power_off` are idempotent: asking for the state a
///   server is already in sends nothing. They return once the provider has
///   confirmed the new state, or with a typed error; callers retry.
/// - `power_state` has no side effect.
/// - `watts` is `Ok(None)` when the provider has no reading.
pub trait Power: Send + Sync {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()>;
    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()>;
    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState>;
    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>>;
    /// The machine's hardware identity, as its provider reports it; None
    /// where the provider has none to give.
    fn identity<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, Option<SystemIdentity>> {
        Box::pin(async { Ok(None) })
    }
    /// The power sweep's read of a server: its state, its watts when it is
    /// on, and its identity when `identity` is asked. By default the three
    /// calls above; a provider that can reads them together.
    fn survey<'a>(&'a self, server: &'a Server, identity: bool) -> Pin<Box<dyn Future<Output = Survey> + Send + 'a>> {
        Box::pin(async move {
            let state = self.power_state(server).await;
            let watts = if matches!(state, Ok(PowerState::On)) { self.watts(server).await.ok().flatten() } else { None };
            let identity = if identity { self.identity(server).await.ok().flatten() } else { None };
            Survey { state, watts, identity }
        })
    }
}

/// What the power sweep read of one server ([`Power::survey`]).
#[derive(Debug)]
pub struct Survey {
    pub state: Result<PowerState, PowerError>,
    /// Its draw, when it is on and the provider had a reading.
    pub watts: Option<f64>,
    /// Its identity, when asked and the provider gave one.
    pub identity: Option<SystemIdentity>,
}

pub use ironclaim_redfish::SystemIdentity;

/// `controller --dry-run`'s power: reads pass through to the provider; a
/// power-on or power-off is never sent, whoever asks, and fails saying so.
pub struct DryRun(pub Arc<dyn Power>);

impl DryRun {
    fn refuse<'a>(action: &str, server: &Server) -> PowerFuture<'a, ()> {
        let message = format!("dry run: the {action} of server {} was not sent", server.name_any());
        Box::pin(async move { Err(PowerError::new(FailureReason::PowerActionFailed, "dry_run", message)) })
    }
}

impl Power for DryRun {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        DryRun::refuse("power-on", server)
    }
    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        DryRun::refuse("power-off", server)
    }
    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        self.0.power_state(server)
    }
    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        self.0.watts(server)
    }
    fn identity<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<SystemIdentity>> {
        self.0.identity(server)
    }
    fn survey<'a>(&'a self, server: &'a Server, identity: bool) -> Pin<Box<dyn Future<Output = Survey> + Send + 'a>> {
        self.0.survey(server, identity)
    }
}

fn state_from_redfish(state: ironclaim_redfish::PowerState) -> PowerState {
    use ironclaim_redfish::PowerState as R;
    match state {
        R::On => PowerState::On,
        R::Off => PowerState::Off,
        R::PoweringOn => PowerState::PoweringOn,
        R::PoweringOff => PowerState::PoweringOff,
        _ => PowerState::Unknown,
    }
}

/// How long a credentials Secret, once read, serves the power sweep's reads
/// of power, watts and identity that name it: a sweep of thousands of
/// servers sharing one Secret reads it once. Everything else (a claim's
/// reads, every power action) reads it anew.
pub const SECRET_FRESH_FOR: std::time::Duration = std::time::Duration::from_secs(10);

tokio::task_local! {
    /// Set while the power sweep reads: its reads may share a Secret read.
    static SWEEPING: ();
    /// The Secrets one action has read so far ([`one_action`]).
    static ACTION: std::cell::RefCell<HashMap<(String, String), Secret>>;
}

/// Runs `calls` as one action: the calls it makes to one server's BMC
/// (the power read before a power-on, and the power-on) share one read of
/// its credentials Secret, made for that action.
pub async fn one_action<F: std::future::Future>(calls: F) -> F::Output {
    ACTION.scope(Default::default(), calls).await
}

/// Runs `reads` as the power sweep's: their Redfish reads share each
/// credentials Secret's read for [`SECRET_FRESH_FOR`].
pub async fn as_sweep<F: std::future::Future>(reads: F) -> F::Output {
    SWEEPING.scope((), reads).await
}

/// Each server's own BMC over Redfish, through one [`BmcFleet`] shared by
/// every server.
///
/// # Guarantees
/// Servers behind one BMC endpoint (a chassis manager, an enclosure, an
/// emulator) with one account share one client: one session, one reset at
/// a time on that endpoint, one bound on the requests in flight to it (see
/// [`BmcFleet`]). Each call reads the server's credentials Secret (the
/// power sweep's reads share a read for [`SECRET_FRESH_FOR`]), so a
/// changed password (compared by value: a
/// Secret rewritten with the same values keeps the session, and servers
/// with separate Secrets holding one account share it), CA bundle or TLS
/// setting takes effect on the next action, by a new client for that
/// endpoint, and a deleted Secret fails it.
pub struct RedfishPower {
    client: Client,
    fleet: Arc<BmcFleet>,
    /// Credentials Secrets by namespace and name, with when each was read
    /// (fresh for [`SECRET_FRESH_FOR`]). Held across a read, so that a
    /// sweep's calls wait for one read rather than each making its own.
    secrets: tokio::sync::Mutex<HashMap<(String, String), (tokio::time::Instant, Secret)>>,
    /// Where CA bundles from Server specs are stored (named by content) for
    /// the TLS layer.
    ca_dir: PathBuf,
}

impl RedfishPower {
    /// Power through a fleet of its own, with the default bounds and
    /// `timing` for every BMC.
    pub fn new(client: Client, timing: Timing) -> Self {
        RedfishPower::with_fleet(client, Arc::new(BmcFleet::new(FleetOptions { timing, ..FleetOptions::default() })))
    }

    /// Power through `fleet`, shared with whoever else holds it.
    pub fn with_fleet(client: Client, fleet: Arc<BmcFleet>) -> Self {
        let ca_dir = std::env::temp_dir().join(format!("ironclaim-bmc-ca-{}", std::process::id()));
        RedfishPower { client, fleet, ca_dir, secrets: Default::default() }
    }

    pub fn fleet(&self) -> &Arc<BmcFleet> {
        &self.fleet
    }

    /// The shared client of the server's BMC and the system it names. An
    /// action (`fresh`) reads the credentials Secret from the API, and so
    /// does a read outside the power sweep; the sweep's reads take one
    /// read less than [`SECRET_FRESH_FOR`] ago ([`as_sweep`]).
    async fn target(&self, server: &Server, fresh: bool) -> Result<(RedfishBmc, SystemSelector), PowerError> {
        let name = server.name_any();
        let Some(bmc) = &server.spec.bmc else {
            return Err(PowerError::new(
                FailureReason::BmcConfigInvalid,
                "no_bmc",
                format!("server {name} has no spec.bmc to power it through Redfish (or set spec.provider.type: Metal3)"),
            ));
        };
        let secret_ref = &bmc.credentials_secret_ref;
        let key = (secret_ref.namespace.clone(), secret_ref.name.clone());
        let read = || async {
            let api: Api<Secret> = Api::namespaced(self.client.clone(), &secret_ref.namespace);
            api.get(&secret_ref.name).await.map_err(|err| secret_unreadable(&name, &key.0, &key.1, &err))
        };
        let in_action = ACTION.try_with(|a| a.borrow().get(&key).cloned()).ok().flatten();
        let secret = match in_action {
            Some(secret) => secret,
            // The sweep's calls wait for one read rather than each making
            // their own.
            None if !fresh && SWEEPING.try_with(|_| ()).is_ok() => {
                let mut secrets = self.secrets.lock().await;
                match secrets.get(&key) {
                    Some((read_at, secret)) if read_at.elapsed() <= SECRET_FRESH_FOR => secret.clone(),
                    _ => {
                        let secret = read().await?;
                        secrets.insert(key.clone(), (tokio::time::Instant::now(), secret.clone()));
                        secret
                    }
                }
            }
            // Anything else reads anew and keeps it to itself: a burst of
            // power-ons is not one read after another behind the sweep's
            // lock, and a slow read never overwrites a newer one there.
            None => read().await?,
        };
        let _ = ACTION.try_with(|a| a.borrow_mut().insert(key, secret.clone()));
        self.target_with(&name, bmc, secret)
    }

    /// [`Self::target`] once the Secret is read: no IO but storing a new CA
    /// bundle.
    fn target_with(&self, name: &str, bmc: &ServerBmc, secret: Secret) -> Result<(RedfishBmc, SystemSelector), PowerError> {
        let secret_ref = &bmc.credentials_secret_ref;
        let data: BTreeMap<String, Vec<u8>> = secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
        let credentials =
            Credentials::from_secret_data(&SecretRef { namespace: secret_ref.namespace.clone(), name: secret_ref.name.clone() }, &data)?;
        let address = BmcAddress::parse(&bmc.address)?;
        let system = address.system.clone().ok_or_else(|| {
            PowerError::new(
                FailureReason::BmcConfigInvalid,
                "invalid_address",
                format!("the BMC address of server {name} names no system: end it in /redfish/v1/Systems/ID"),
            )
        })?;
        let ca_file = bmc.ca_bundle.as_deref().map(|pem| ca_bundle_file(&self.ca_dir, pem)).transpose()?;
        let tls = TlsSettings { ca_file, insecure_skip_verify: bmc.insecure_skip_verify.unwrap_or(false) };
        Ok((self.fleet.client(&address.endpoint, &credentials, &tls)?, system))
    }
}

impl Power for RedfishPower {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            let (bmc, system) = self.target(server, true).await?;
            bmc.power_on(&system).await?;
            Ok(())
        })
    }

    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            let (bmc, system) = self.target(server, true).await?;
            bmc.power_off(&system).await?;
            Ok(())
        })
    }

    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        Box::pin(async move {
            let (bmc, system) = self.target(server, false).await?;
            Ok(state_from_redfish(bmc.power_state(&system).await?))
        })
    }

    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async move {
            let (bmc, system) = self.target(server, false).await?;
            match bmc.watts(&system).await {
                Ok(w) => Ok(Some(w.watts)),
                Err(err) if err.metric_label() == "watts_unavailable" => Ok(None),
                Err(err) => Err(err.into()),
            }
        })
    }

    fn identity<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<SystemIdentity>> {
        Box::pin(async move {
            let (bmc, system) = self.target(server, false).await?;
            Ok(Some(bmc.identity(&system).await?))
        })
    }

    /// One read of the System gives the state and the identity; its chassis
    /// and power readings follow when it is on (see
    /// [`RedfishBmc::status`], which also ends the connection of a BMC of
    /// one machine).
    fn survey<'a>(&'a self, server: &'a Server, identity: bool) -> Pin<Box<dyn Future<Output = Survey> + Send + 'a>> {
        Box::pin(async move {
            let read = async {
                let (bmc, system) = self.target(server, false).await?;
                Ok::<_, PowerError>(bmc.status(&system, true).await?)
            };
            match read.await {
                Ok(status) => Survey {
                    state: Ok(state_from_redfish(status.power_state)),
                    watts: status.watts.and_then(Result::ok).map(|w| w.watts),
                    identity: identity.then_some(status.identity),
                },
                Err(err) => Survey { state: Err(err), watts: None, identity: None },
            }
        })
    }
}

/// The `metal3.io/v1alpha1` BareMetalHost resource.
pub fn baremetalhost_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("metal3.io", "v1alpha1", "BareMetalHost"), "baremetalhosts")
}

/// The `metal3.io/v1alpha1` HardwareData resource: what a BareMetalHost's
/// inspection found, under the host's namespace and name.
pub fn hardwaredata_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("metal3.io", "v1alpha1", "HardwareData"), "hardwaredata")
}

/// Power through Metal3: `spec.online` on an already provisioned
/// BareMetalHost, confirmed by `status.poweredOn`. Metal3's
/// baremetal-operator does the BMC work; its credentials stay with it.
pub struct Metal3Power {
    client: Client,
    /// How long to wait for `status.poweredOn` to follow `spec.online`.
    confirm_timeout: std::time::Duration,
    /// How often the host is read while waiting.
    poll: std::time::Duration,
    /// Servers already warned about for the deprecated annotation.
    warned: Mutex<HashSet<String>>,
}

/// The provisioning states in which a host runs its own image, so that
/// powering it on boots the node.
pub use ironclaim_k8s::metal3::POWERABLE_STATES as METAL3_POWERABLE_STATES;
/// The annotation that pauses the baremetal-operator's reconciling of a host.
const METAL3_PAUSED_ANNOTATION: &str = "baremetalhost.metal3.io/paused";

/// What a BareMetalHost says about its power.
#[derive(Debug, Default)]
struct HostPower {
    /// `spec.online`: what was asked.
    online: Option<bool>,
    /// `status.poweredOn`: what the operator last saw.
    powered_on: Option<bool>,
    /// `status.provisioning.state`.
    provisioning: Option<String>,
    /// `status.errorType` and `status.errorMessage`, when set.
    error: Option<String>,
    /// Why the operator would not act on `spec.online`, when it would not.
    ignored: Option<&'static str>,
}

impl HostPower {
    fn of(host: &DynamicObject) -> Self {
        let spec = host.data.get("spec");
        let status = host.data.get("status");
        let text = |v: Option<&serde_json::Value>| v.and_then(serde_json::Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
        let error = match (text(status.and_then(|s| s.get("errorType"))), text(status.and_then(|s| s.get("errorMessage")))) {
            (None, None) => None,
            (kind, message) => Some(format!("{}: {}", kind.unwrap_or_else(|| "error".into()), message.unwrap_or_default())),
        };
        let annotations = host.annotations();
        let ignored = if annotations.contains_key(METAL3_DETACHED_ANNOTATION) {
            Some("detached")
        } else if annotations.contains_key(METAL3_PAUSED_ANNOTATION) {
            Some("paused")
        } else {
            None
        };
        HostPower {
            online: spec.and_then(|s| s.get("online")).and_then(serde_json::Value::as_bool),
            powered_on: status.and_then(|s| s.get("poweredOn")).and_then(serde_json::Value::as_bool),
            provisioning: text(status.and_then(|s| s.get("provisioning")).and_then(|p| p.get("state"))),
            error,
            ignored,
        }
    }

    /// The server's power as the host shows it: `spec.online` not yet
    /// followed by `status.poweredOn` is a transition.
    fn state(&self) -> PowerState {
        match (self.powered_on, self.online) {
            (Some(true), Some(false)) => PowerState::PoweringOff,
            (Some(false), Some(true)) => PowerState::PoweringOn,
            (Some(true), _) => PowerState::On,
            (Some(false), _) => PowerState::Off,
            (None, _) => PowerState::Unknown,
        }
    }
}

impl Metal3Power {
    pub fn new(client: Client, confirm_timeout: std::time::Duration) -> Self {
        Metal3Power { client, confirm_timeout, poll: std::time::Duration::from_millis(500), warned: Mutex::default() }
    }

    /// The same, reading the host this often while waiting for it.
    pub fn with_poll(mut self, poll: std::time::Duration) -> Self {
        self.poll = poll;
        self
    }

    /// The host's API and name: `spec.provider.metal3`, else the
    /// deprecated annotation.
    fn host(&self, server: &Server) -> Result<(Api<DynamicObject>, String), PowerError> {
        let invalid = |message: String| PowerError::new(FailureReason::PowerActionFailed, "invalid_host_reference", message);
        let (namespace, name) = match &server.spec.provider {
            Some(_) => {
                let host = server
                    .spec
                    .metal3_host()
                    .ok_or_else(|| invalid(format!("server {} has no spec.provider.metal3 host (type Metal3 needs one)", server.name_any())))?;
                (host.namespace.clone(), host.name.clone())
            }
            None => {
                let reference = server.annotations().get(BAREMETALHOST_ANNOTATION).cloned().unwrap_or_default();
                let Some((namespace, name)) = reference.split_once('/').filter(|(ns, n)| !ns.is_empty() && !n.is_empty()) else {
                    return Err(invalid(format!(
                        "annotation {BAREMETALHOST_ANNOTATION} of server {} must be NAMESPACE/NAME, found {reference:?}",
                        server.name_any()
                    )));
                };
                if self.warned.lock().unwrap_or_else(PoisonError::into_inner).insert(server.name_any()) {
                    tracing::warn!(
                        server = %server.name_any(),
                        "the annotation {BAREMETALHOST_ANNOTATION} is deprecated: set spec.provider {{type: Metal3, metal3: {{namespace: {namespace}, name: {name}}}}}"
                    );
                }
                (namespace.to_string(), name.to_string())
            }
        };
        Ok((Api::namespaced_with(self.client.clone(), &namespace, &baremetalhost_resource()), name))
    }

    async fn read(&self, api: &Api<DynamicObject>, name: &str) -> Result<DynamicObject, PowerError> {
        api.get(name).await.map_err(|err| api_error(&err, format!("cannot read BareMetalHost {}/{name}: {err}", namespace_of(api))))
    }

    async fn set_online(&self, server: &Server, online: bool) -> Result<(), PowerError> {
        let (api, name) = self.host(server)?;
        let key = format!("{}/{name}", namespace_of(&api));
        let host = HostPower::of(&self.read(&api, &name).await?);
        if let Some(why) = host.ignored {
            return Err(PowerError::new(
                FailureReason::PowerActionFailed,
                "host_not_managed",
                format!("BareMetalHost {key} is {why}: the baremetal-operator does not act on spec.online"),
            ));
        }
        if online && !host.provisioning.as_deref().is_some_and(|s| METAL3_POWERABLE_STATES.contains(&s)) {
            // Powering on a host that is not provisioned boots no node (or
            // disturbs the operator's inspection or provisioning).
            return Err(PowerError::new(
                FailureReason::ServerUnavailable,
                "host_not_provisioned",
                format!(
                    "BareMetalHost {key} is not provisioned (provisioning state {:?}): only provisioned or externally provisioned hosts are powered on",
                    host.provisioning.as_deref().unwrap_or("")
                ),
            ));
        }
        if host.online == Some(online) && host.powered_on == Some(online) {
            return Ok(());
        }
        if host.online != Some(online) {
            let patch = serde_json::json!({"spec": {"online": online}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|err| api_error(&err, format!("cannot set BareMetalHost {key} online={online}: {err}")))?;
        }
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            let host = HostPower::of(&self.read(&api, &name).await?);
            if host.online != Some(online) {
                // Someone else (an operator, another controller) changed
                // it back: do not fight over it.
                return Err(PowerError::new(
                    FailureReason::PowerActionFailed,
                    "online_overridden",
                    format!("BareMetalHost {key}: spec.online was set to {:?} while waiting for poweredOn={online}", host.online),
                ));
            }
            if host.powered_on == Some(online) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                let error = host.error.map(|e| format!("; the host reports {e}")).unwrap_or_default();
                return Err(PowerError::new(
                    if online { FailureReason::PowerOnTimedOut } else { FailureReason::PowerActionFailed },
                    "timed_out_waiting_for_state",
                    format!("BareMetalHost {key} did not report poweredOn={online} within {:?}{error}", self.confirm_timeout),
                ));
            }
            tokio::time::sleep(self.poll).await;
        }
    }
}

fn namespace_of(api: &Api<DynamicObject>) -> &str {
    api.namespace().unwrap_or_default()
}

/// A failed read or write of a BareMetalHost, typed.
fn api_error(err: &kube::Error, message: String) -> PowerError {
    let (reason, label) = match err {
        kube::Error::Api(status) if status.code == 404 => (FailureReason::ServerUnavailable, "host_not_found"),
        kube::Error::Api(status) if status.code == 401 || status.code == 403 => (FailureReason::PowerActionFailed, "forbidden"),
        kube::Error::Api(status) if status.code == 409 || status.code == 422 => (FailureReason::PowerActionFailed, "refused"),
        _ => (FailureReason::BmcUnreachable, "api_unreachable"),
    };
    PowerError::new(reason, label, message)
}

impl Power for Metal3Power {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(self.set_online(server, true))
    }

    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(self.set_online(server, false))
    }

    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        Box::pin(async move {
            let (api, name) = self.host(server)?;
            Ok(HostPower::of(&self.read(&api, &name).await?).state())
        })
    }

    fn watts<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async { Ok(None) })
    }
}

/// Each server's provider, by [`provider_type`].
pub struct ProviderRouter {
    pub redfish: Arc<dyn Power>,
    pub metal3: Arc<dyn Power>,
    pub external: Arc<dyn Power>,
    pub cluster_api: Arc<dyn Power>,
}

impl ProviderRouter {
    fn pick(&self, server: &Server) -> &dyn Power {
        match provider_type(server) {
            ProviderType::Redfish => &*self.redfish,
            ProviderType::Metal3 => &*self.metal3,
            ProviderType::External => &*self.external,
            ProviderType::ClusterApi => &*self.cluster_api,
        }
    }
}

impl Power for ProviderRouter {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        self.pick(server).power_on(server)
    }
    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        self.pick(server).power_off(server)
    }
    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        self.pick(server).power_state(server)
    }
    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        self.pick(server).watts(server)
    }
    fn identity<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<SystemIdentity>> {
        self.pick(server).identity(server)
    }
    fn survey<'a>(&'a self, server: &'a Server, identity: bool) -> Pin<Box<dyn Future<Output = Survey> + Send + 'a>> {
        self.pick(server).survey(server, identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_k8s::api::common::SecretReference;
    use k8s_openapi::ByteString;

    /// A controller's Redfish power with an API client that is never called.
    fn redfish_power() -> RedfishPower {
        ironclaim_redfish::install_crypto_provider();
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("a URL"));
        RedfishPower::new(Client::try_from(config).expect("a client"), Timing::default())
    }

    fn server_bmc(address: &str, secret: &str) -> ServerBmc {
        ServerBmc {
            address: address.into(),
            credentials_secret_ref: SecretReference { name: secret.into(), namespace: "metal".into() },
            insecure_skip_verify: None,
            ca_bundle: None,
        }
    }

    /// Server `i` of a rack whose BMCs all take the Secret metal/bmc-shared.
    fn sharing_a_secret(i: usize) -> Server {
        let spec = serde_json::json!({
            "bmc": {"address": format!("https://10.0.0.5/redfish/v1/Systems/{i}"), "credentialsSecretRef": {"name": "bmc-shared", "namespace": "metal"}},
            "hardware": {"cpu": "1", "memory": "1Gi"}
        });
        Server::new(&format!("r1-u{i:02}"), serde_json::from_value(spec).expect("spec"))
    }

    fn secret(version: &str, password: &str) -> Secret {
        let mut secret = Secret::default();
        secret.metadata.resource_version = Some(version.into());
        secret.data = Some(BTreeMap::from([
            ("username".to_owned(), ByteString(b"admin".to_vec())),
            ("password".to_owned(), ByteString(password.as_bytes().to_vec())),
        ]));
        secret
    }

    /// A sweep of many servers that share one credentials Secret reads it
    /// once, not once per server and call; a read older than
    /// [`SECRET_FRESH_FOR`] is read again, and a power action always reads
    /// it, so a rotated or deleted Secret takes effect at once there.
    #[tokio::test(start_paused = true)]
    async fn servers_sharing_a_secret_read_it_once_while_it_is_fresh() {
        ironclaim_redfish::install_crypto_provider();
        let reads = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = reads.clone();
        let api = tower::service_fn(move |request: ::http::Request<kube::client::Body>| {
            let counted = counted.clone();
            async move {
                assert!(request.uri().path().ends_with("/namespaces/metal/secrets/bmc-shared"), "{}", request.uri());
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let body = serde_json::to_vec(&secret("1", "pw")).expect("json");
                Ok::<_, std::convert::Infallible>(::http::Response::new(kube::client::Body::from(body)))
            }
        });
        let power = RedfishPower::new(Client::new(api, "default"), Timing::default());
        let servers: Vec<Server> = (0..50).map(sharing_a_secret).collect();
        as_sweep(async {
            for server in &servers {
                power.target(server, false).await.expect("target");
                power.target(server, false).await.expect("target");
            }
        })
        .await;
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 1, "one read for the sweep's 100 reads of state");
        tokio::time::advance(SECRET_FRESH_FOR + std::time::Duration::from_millis(1)).await;
        as_sweep(power.target(&servers[0], false)).await.expect("target");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 2, "read again once stale");
        // A claim's read, outside the sweep, reads it.
        power.target(&servers[0], false).await.expect("target");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 3, "a read outside the sweep reads the Secret");
        // A power action never trusts an earlier read: a Secret deleted or
        // changed a moment ago fails or changes the next action.
        as_sweep(power.target(&servers[1], true)).await.expect("target");
        power.target(&servers[2], true).await.expect("target");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 5, "each action reads the Secret");
        // One action's calls (the power read before a power-on, and the
        // power-on) share its read; the next action reads again.
        one_action(async {
            power.target(&servers[3], false).await.expect("target");
            power.target(&servers[3], true).await.expect("target");
        })
        .await;
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 6, "one read for one action's two calls");
        one_action(power.target(&servers[3], true)).await.expect("target");
        assert_eq!(reads.load(std::sync::atomic::Ordering::SeqCst), 7, "the next action reads anew");
    }

    /// Power actions read their Secrets side by side: a read in flight
    /// (slow behind the API rate) holds up no other action.
    #[tokio::test(start_paused = true)]
    async fn actions_read_their_secrets_side_by_side() {
        ironclaim_redfish::install_crypto_provider();
        let in_flight = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (i, m) = (in_flight.clone(), most.clone());
        let api = tower::service_fn(move |_: ::http::Request<kube::client::Body>| {
            let (i, m) = (i.clone(), m.clone());
            async move {
                let now = i.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                m.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                i.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                let body = serde_json::to_vec(&secret("1", "pw")).expect("json");
                Ok::<_, std::convert::Infallible>(::http::Response::new(kube::client::Body::from(body)))
            }
        });
        let power = RedfishPower::new(Client::new(api, "default"), Timing::default());
        let (a, b, c) = (sharing_a_secret(1), sharing_a_secret(2), sharing_a_secret(3));
        let (ra, rb, rc) = tokio::join!(power.target(&a, true), power.target(&b, true), power.target(&c, true));
        assert!(ra.is_ok() && rb.is_ok() && rc.is_ok());
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 3, "the three actions' reads were in flight together");
    }

    /// Issue 16, item 1: a missing Secret is a fault of configuration,
    /// said in one line naming the Secret and the Server, not retried.
    #[tokio::test]
    async fn a_missing_or_forbidden_secret_is_a_fault_of_configuration_named_in_one_line() {
        let status = |code: u16, message: &str| kube::Error::Api(kube::core::Status::failure(message, "NotFound").with_code(code).boxed());
        let missing = secret_unreadable("r1-u01", "metal", "bmc-r1", &status(404, "secrets \"bmc-r1\" not found"));
        assert_eq!(missing.reason, FailureReason::BmcCredentialsMissing);
        assert_eq!(
            missing.message,
            "the BMC credentials Secret metal/bmc-r1 (spec.bmc.credentialsSecretRef of Server r1-u01) does not exist: create it with keys username and password"
        );
        let forbidden = secret_unreadable("r1-u01", "metal", "bmc-r1", &status(403, "secrets \"bmc-r1\" is forbidden"));
        assert_eq!(forbidden.reason, FailureReason::BmcCredentialsMissing);
        assert!(!forbidden.message.contains("ErrorResponse") && !forbidden.message.contains("Status {"), "{}", forbidden.message);
        let down = secret_unreadable("r1-u01", "metal", "bmc-r1", &status(503, "the server is currently unable to handle the request"));
        assert!(!down.reason.is_configuration(), "an API failure passes: retried");
        assert!(missing.reason.is_configuration());
        let no_key = PowerError::from(ironclaim_redfish::Error::CredentialsUnreadable {
            path: "secret metal/bmc-r1".into(),
            reason: "key \"password\" is missing".into(),
        });
        assert_eq!(no_key.reason, FailureReason::BmcCredentialsMissing);
        let address = PowerError::from(ironclaim_redfish::Error::InvalidAddress { address: "ftp://x".into(), reason: "scheme".into() });
        assert_eq!(address.reason, FailureReason::BmcConfigInvalid);
        let power = redfish_power();
        let err = power.target_with("r1-u01", &server_bmc("https://10.0.0.5/redfish/v1/Systems/1", "bmc-r1"), Secret::default()).unwrap_err();
        assert_eq!((err.reason, err.message.contains("bmc-r1")), (FailureReason::BmcCredentialsMissing, true), "{}", err.message);
        let err = power.target_with("r1-u01", &server_bmc("https://10.0.0.5/redfish/v1", "bmc-r1"), secret("1", "pw")).unwrap_err();
        assert_eq!(err.reason, FailureReason::BmcConfigInvalid, "no system named: {}", err.message);
    }

    #[tokio::test]
    async fn servers_behind_one_bmc_endpoint_share_one_client_even_with_separate_secrets() {
        let power = redfish_power();
        let one = server_bmc("redfish+http://10.0.0.5:8000/redfish/v1/Systems/1", "rack1-node01");
        let two = server_bmc("redfish+http://10.0.0.5:8000/redfish/v1/Systems/2", "rack1-node02");
        let (a, system_a) = power.target_with("node01", &one, secret("7", "pw")).unwrap();
        let (b, system_b) = power.target_with("node02", &two, secret("9", "pw")).unwrap();
        assert!(a.is_same_client(&b), "one endpoint, one account: one client, one session");
        assert_ne!(system_a, system_b);
        let elsewhere = server_bmc("redfish+http://10.0.0.6:8000/redfish/v1/Systems/1", "rack1-node01");
        let (c, _) = power.target_with("node03", &elsewhere, secret("7", "pw")).unwrap();
        assert!(!c.is_same_client(&a));
        assert_eq!(power.fleet().endpoint_count(), 2);
    }

    #[tokio::test]
    async fn a_changed_password_or_ca_bundle_rebuilds_the_endpoint_client() {
        let power = redfish_power();
        let mut bmc = server_bmc("redfish+https://10.0.0.5/redfish/v1/Systems/1", "rack1-node01");
        let (first, _) = power.target_with("node01", &bmc, secret("7", "old")).unwrap();
        let (same, _) = power.target_with("node01", &bmc, secret("8", "old")).unwrap();
        assert!(same.is_same_client(&first), "a Secret rewritten with the same values keeps its session");
        let (rotated, _) = power.target_with("node01", &bmc, secret("9", "new")).unwrap();
        assert!(!rotated.is_same_client(&first));

        // The bundle is stored under its content's name and read when the
        // client is built: a new bundle means a new client (here, a refused
        // one, since this bundle holds no certificate).
        bmc.ca_bundle = Some("not a certificate\n".into());
        let err = power.target_with("node01", &bmc, secret("9", "new")).unwrap_err();
        assert_eq!(err.label, "tls_config");
        assert!(err.message.contains("/ca-") && err.message.contains("holds no certificate"), "{}", err.message);
        let _ = std::fs::remove_dir_all(&power.ca_dir);
    }

    #[tokio::test]
    async fn an_address_without_a_system_is_a_typed_error() {
        let power = redfish_power();
        let err = power.target_with("node01", &server_bmc("https://10.0.0.5", "s"), secret("1", "pw")).unwrap_err();
        assert_eq!((err.label, err.reason), ("invalid_address", FailureReason::BmcConfigInvalid));
    }
}
