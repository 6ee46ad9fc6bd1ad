//! The boundary between the controller and whatever powers machines.
//!
//! One narrow trait, [`Power`], with two implementations: [`RedfishPower`]
//! (the server's own BMC, credentials from the Secret its spec references)
//! and [`Metal3Power`] (`spec.online` on a Metal3 BareMetalHost that is
//! already provisioned). [`ProviderRouter`] picks one per server: a Server
//! with `spec.provider.type: Metal3` goes through Metal3, every other
//! through Redfish. The annotation `ironclaim.dev/baremetalhost:
//! NAMESPACE/NAME` on a Server without `spec.provider` is still read, with
//! a warning: it is deprecated.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use ironclaim_k8s::api::nodeclaim::FailureReason;
use ironclaim_k8s::api::server::{PowerState, ProviderType};
use ironclaim_k8s::api::Server;
use ironclaim_redfish::provider::ProviderOptions;
use ironclaim_redfish::{BmcAddress, Credentials, PowerProvider, RedfishProvider, SecretRef, ServerSpec, Timing, TlsSettings};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// The annotation that handed a Server's power to a Metal3 BareMetalHost
/// before `spec.provider`. Deprecated: read only when `spec.provider` is
/// absent.
pub const BAREMETALHOST_ANNOTATION: &str = "ironclaim.dev/baremetalhost";

/// Whether Metal3 powers this server: `spec.provider.type: Metal3`, or,
/// without `spec.provider`, the deprecated annotation.
pub fn uses_metal3(server: &Server) -> bool {
    match &server.spec.provider {
        Some(provider) => provider.type_ == ProviderType::Metal3,
        None => server.annotations().contains_key(BAREMETALHOST_ANNOTATION),
    }
}

/// Why a power action or read failed, typed for the claim's status.
#[derive(Clone, Debug, thiserror::Error)]
#[error("{message}")]
pub struct PowerError {
    /// The failure as the NodeClaim names it.
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
        let reason = match label {
            "unreachable" | "request_timed_out" | "tls_handshake_failed" => FailureReason::BmcUnreachable,
            "auth_failed" | "credentials_unreadable" => FailureReason::BmcAuthenticationFailed,
            "timed_out_waiting_for_state" => FailureReason::PowerOnTimedOut,
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

/// What a cached Redfish client was built from; a change rebuilds it.
#[derive(Clone, PartialEq, Eq)]
struct BmcKey {
    address: String,
    secret: (String, String),
    secret_version: Option<String>,
    ca_bundle: Option<String>,
    insecure: bool,
}

/// Each server's own BMC over Redfish.
pub struct RedfishPower {
    client: Client,
    timing: Timing,
    /// Where CA bundles from Server specs are written for the TLS layer.
    ca_dir: PathBuf,
    cache: Mutex<HashMap<String, (BmcKey, Arc<RedfishProvider>)>>,
}

impl RedfishPower {
    pub fn new(client: Client, timing: Timing) -> Self {
        let ca_dir = std::env::temp_dir().join(format!("ironclaim-bmc-ca-{}", std::process::id()));
        RedfishPower { client, timing, ca_dir, cache: Mutex::new(HashMap::new()) }
    }

    async fn provider(&self, server: &Server) -> Result<Arc<RedfishProvider>, PowerError> {
        let name = server.name_any();
        let Some(bmc) = &server.spec.bmc else {
            return Err(PowerError::new(
                FailureReason::PowerActionFailed,
                "no_bmc",
                format!("server {name} has no spec.bmc to power it through Redfish (or set spec.provider.type: Metal3)"),
            ));
        };
        let secret_ref = &bmc.credentials_secret_ref;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &secret_ref.namespace);
        let secret = secrets.get(&secret_ref.name).await.map_err(|err| {
            PowerError::new(
                FailureReason::BmcAuthenticationFailed,
                "credentials_unreadable",
                format!("cannot read the BMC credentials Secret {}/{}: {err}", secret_ref.namespace, secret_ref.name),
            )
        })?;
        let key = BmcKey {
            address: bmc.address.clone(),
            secret: (secret_ref.namespace.clone(), secret_ref.name.clone()),
            secret_version: secret.metadata.resource_version.clone(),
            ca_bundle: bmc.ca_bundle.clone(),
            insecure: bmc.insecure_skip_verify.unwrap_or(false),
        };
        if let Some((cached, provider)) = self.cache.lock().unwrap_or_else(PoisonError::into_inner).get(&name)
            && *cached == key
        {
            return Ok(provider.clone());
        }
        let data: BTreeMap<String, Vec<u8>> =
            secret.data.unwrap_or_default().into_iter().map(|(k, v)| (k, v.0)).collect();
        let credentials = Credentials::from_secret_data(
            &SecretRef { namespace: secret_ref.namespace.clone(), name: secret_ref.name.clone() },
            &data,
        )?;
        let address = BmcAddress::parse(&bmc.address)?;
        let system = address.system.clone().ok_or_else(|| {
            PowerError::new(
                FailureReason::PowerActionFailed,
                "invalid_address",
                format!("the BMC address of server {name} names no system: end it in /redfish/v1/Systems/ID"),
            )
        })?;
        let ca_file = match &bmc.ca_bundle {
            None => None,
            Some(pem) => {
                let io = |err: std::io::Error| {
                    PowerError::new(FailureReason::PowerActionFailed, "tls_config", format!("cannot store the CA bundle of {name}: {err}"))
                };
                std::fs::create_dir_all(&self.ca_dir).map_err(io)?;
                let path = self.ca_dir.join(format!("{name}.pem"));
                std::fs::write(&path, pem).map_err(io)?;
                Some(path)
            }
        };
        let spec = ServerSpec {
            name: name.clone(),
            endpoint: address.endpoint,
            system,
            credentials,
            tls: TlsSettings { ca_file, insecure_skip_verify: key.insecure },
        };
        let options = ProviderOptions { timing: self.timing.clone(), ..ProviderOptions::default() };
        let provider = Arc::new(RedfishProvider::new(vec![spec], options)?);
        self.cache.lock().unwrap_or_else(PoisonError::into_inner).insert(name, (key, provider.clone()));
        Ok(provider)
    }
}

impl Power for RedfishPower {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            let provider = self.provider(server).await?;
            provider.power_on(&server.name_any()).await?;
            Ok(())
        })
    }

    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            let provider = self.provider(server).await?;
            provider.power_off(&server.name_any()).await?;
            Ok(())
        })
    }

    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        Box::pin(async move {
            let provider = self.provider(server).await?;
            Ok(state_from_redfish(provider.power_state(&server.name_any()).await?))
        })
    }

    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async move {
            let provider = self.provider(server).await?;
            match provider.watts(&server.name_any()).await {
                Ok(w) => Ok(Some(w.watts)),
                Err(err) if err.metric_label() == "watts_unavailable" => Ok(None),
                Err(err) => Err(err.into()),
            }
        })
    }
}

/// The `metal3.io/v1alpha1` BareMetalHost resource.
pub fn baremetalhost_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("metal3.io", "v1alpha1", "BareMetalHost"), "baremetalhosts")
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
/// powering it on boots the node: `provisioned` (by Metal3) and
/// `externally provisioned` (by anything else; only its power is managed).
pub const METAL3_POWERABLE_STATES: [&str; 2] = ["provisioned", "externally provisioned"];

/// The annotation under which the baremetal-operator leaves a host alone,
/// power included.
const METAL3_DETACHED_ANNOTATION: &str = "baremetalhost.metal3.io/detached";
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
                let host = server.spec.metal3_host().ok_or_else(|| {
                    invalid(format!("server {} has no spec.provider.metal3 host (type Metal3 needs one)", server.name_any()))
                })?;
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

/// Metal3 for servers whose provider is Metal3 (see [`uses_metal3`]),
/// Redfish for every other.
pub struct ProviderRouter {
    pub redfish: Arc<dyn Power>,
    pub metal3: Arc<dyn Power>,
}

impl ProviderRouter {
    fn pick(&self, server: &Server) -> &dyn Power {
        if uses_metal3(server) { &*self.metal3 } else { &*self.redfish }
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
}
