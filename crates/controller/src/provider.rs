//! The boundary between the controller and whatever powers machines.
//!
//! One narrow trait, [`Power`], with two implementations: [`RedfishPower`]
//! (the server's own BMC, credentials from the Secret its spec references)
//! and [`Metal3Power`] (`spec.online` on a Metal3 BareMetalHost that is
//! already provisioned). [`ProviderRouter`] picks one per server: a Server
//! annotated `ironclaim.dev/baremetalhost: NAMESPACE/NAME` goes through
//! Metal3, every other through Redfish.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use ironclaim_k8s::api::nodeclaim::FailureReason;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::Server;
use ironclaim_redfish::provider::ProviderOptions;
use ironclaim_redfish::{BmcAddress, Credentials, PowerProvider, RedfishProvider, SecretRef, ServerSpec, Timing, TlsSettings};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

/// The annotation that hands a Server's power to a Metal3 BareMetalHost.
pub const BAREMETALHOST_ANNOTATION: &str = "ironclaim.dev/baremetalhost";

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
        let bmc = &server.spec.bmc;
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
}

impl Metal3Power {
    pub fn new(client: Client, confirm_timeout: std::time::Duration) -> Self {
        Metal3Power { client, confirm_timeout }
    }

    fn host(&self, server: &Server) -> Result<(Api<DynamicObject>, String), PowerError> {
        let reference = server.annotations().get(BAREMETALHOST_ANNOTATION).cloned().unwrap_or_default();
        let Some((namespace, name)) = reference.split_once('/').filter(|(ns, n)| !ns.is_empty() && !n.is_empty()) else {
            return Err(PowerError::new(
                FailureReason::PowerActionFailed,
                "invalid_host_reference",
                format!("annotation {BAREMETALHOST_ANNOTATION} of server {} must be NAMESPACE/NAME, found {reference:?}", server.name_any()),
            ));
        };
        Ok((Api::namespaced_with(self.client.clone(), namespace, &baremetalhost_resource()), name.to_string()))
    }

    async fn read(&self, api: &Api<DynamicObject>, name: &str) -> Result<DynamicObject, PowerError> {
        api.get(name).await.map_err(|err| {
            let (reason, label) = match &err {
                kube::Error::Api(status) if status.code == 404 => (FailureReason::ServerUnavailable, "host_not_found"),
                _ => (FailureReason::BmcUnreachable, "api_unreachable"),
            };
            PowerError::new(reason, label, format!("cannot read BareMetalHost {name}: {err}"))
        })
    }

    async fn set_online(&self, server: &Server, online: bool) -> Result<(), PowerError> {
        let (api, name) = self.host(server)?;
        let host = self.read(&api, &name).await?;
        if powered_on(&host) == Some(online) {
            return Ok(());
        }
        let patch = serde_json::json!({"spec": {"online": online}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|err| {
            PowerError::new(FailureReason::PowerActionFailed, "patch_failed", format!("cannot set BareMetalHost {name} online={online}: {err}"))
        })?;
        let deadline = tokio::time::Instant::now() + self.confirm_timeout;
        loop {
            let host = self.read(&api, &name).await?;
            if powered_on(&host) == Some(online) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(PowerError::new(
                    if online { FailureReason::PowerOnTimedOut } else { FailureReason::PowerActionFailed },
                    "timed_out_waiting_for_state",
                    format!("BareMetalHost {name} did not report poweredOn={online} within {:?}", self.confirm_timeout),
                ));
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    }
}

fn powered_on(host: &DynamicObject) -> Option<bool> {
    host.data.get("status").and_then(|s| s.get("poweredOn")).and_then(serde_json::Value::as_bool)
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
            let host = self.read(&api, &name).await?;
            Ok(match powered_on(&host) {
                Some(true) => PowerState::On,
                Some(false) => PowerState::Off,
                None => PowerState::Unknown,
            })
        })
    }

    fn watts<'a>(&'a self, _server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async { Ok(None) })
    }
}

/// Redfish for every server, Metal3 for those annotated with a host.
pub struct ProviderRouter {
    pub redfish: Arc<dyn Power>,
    pub metal3: Arc<dyn Power>,
}

impl ProviderRouter {
    fn pick(&self, server: &Server) -> &dyn Power {
        if server.annotations().contains_key(BAREMETALHOST_ANNOTATION) { &*self.metal3 } else { &*self.redfish }
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
