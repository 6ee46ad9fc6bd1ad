//! One Redfish conversation per BMC endpoint: discovery, authentication,
//! retries, ETags and the global request bound.
//!
//! A [`Bmc`] is cheap to clone (an `Arc` inside) and shared by every system
//! it manages, so a chassis of blades holds one session, not one per blade.
//! [`crate::fleet::BmcFleet`] hands out one per endpoint and account.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex as SyncMutex};
use std::time::Duration;

use reqwest::header::{HeaderMap, HeaderValue};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::sync::{Mutex, OwnedMutexGuard, Semaphore, SemaphorePermit};
use url::Url;

use crate::address::SystemSelector;
use crate::credentials::{Credentials, Secret};
use crate::error::{Error, Result, Step};
use crate::fleet::EndpointGate;
use crate::payload::{self, PayloadError, PayloadResult, ServiceRoot};
use crate::tls::TlsSettings;

const SERVICE_ROOT: &str = "/redfish/v1/";
const DEFAULT_SYSTEMS: &str = "/redfish/v1/Systems";
/// ETag cache bound: past it the cache starts over, which costs one full
/// read per resource and nothing else.
const MAX_CACHED_ETAGS: usize = 4096;

/// Timeouts, retries and polling for one BMC. Every wait is bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Timing {
    /// One HTTP request, from connect to the last body byte.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    /// Extra attempts for a request that failed transiently.
    pub retries: u32,
    /// Base of the exponential, fully jittered backoff between attempts.
    pub retry_backoff: Duration,
    /// First and largest delay between two reads while waiting for a state.
    pub poll_initial: Duration,
    pub poll_max: Duration,
    /// How long to wait for a sent action to show before sending it again.
    pub resend_after: Duration,
    /// How long to wait, from the first send, for the state to be confirmed.
    pub confirm_timeout: Duration,
    /// How long a graceful shutdown may take before ForceOff.
    pub graceful_timeout: Duration,
    /// How long a task monitor may keep answering "running".
    pub task_timeout: Duration,
    /// How long a connection to a BMC stays open after its last answer.
    /// Longer than the gap between the requests of one step, so a read and
    /// its follow-up share a connection; far shorter than the power sweep's
    /// period, so a fleet does not hold a connection per BMC between
    /// sweeps.
    pub idle_connection: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            request_timeout: Duration::from_secs(15),
            connect_timeout: Duration::from_secs(5),
            retries: 2,
            retry_backoff: Duration::from_millis(250),
            poll_initial: Duration::from_millis(500),
            poll_max: Duration::from_secs(5),
            resend_after: Duration::from_secs(20),
            confirm_timeout: Duration::from_secs(90),
            graceful_timeout: Duration::from_secs(180),
            task_timeout: Duration::from_secs(120),
            idle_connection: Duration::from_secs(2),
        }
    }
}

/// How to authenticate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuthMode {
    /// A session when the service root links a session collection, Basic otherwise.
    #[default]
    Auto,
    Session,
    Basic,
}

/// Everything needed to talk to one BMC.
#[derive(Clone, Debug)]
pub struct BmcConfig {
    /// `scheme://host:port/` (see [`crate::BmcAddress`]).
    pub endpoint: Url,
    pub credentials: Credentials,
    pub tls: TlsSettings,
    pub auth: AuthMode,
    pub timing: Timing,
}

impl BmcConfig {
    pub fn new(endpoint: Url, credentials: Credentials) -> Self {
        BmcConfig { endpoint, credentials, tls: TlsSettings::default(), auth: AuthMode::Auto, timing: Timing::default() }
    }
}

#[derive(Clone)]
pub(crate) enum Auth {
    Anonymous,
    Basic,
    Session { token: Secret, location: Option<String> },
}

struct Conversation {
    root: ServiceRoot,
    auth: Auth,
}

/// An HTTP answer, body read in full.
pub(crate) struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub url: String,
}

impl Reply {
    /// The Redfish error message of a non-success body, or the status text.
    pub fn message(&self) -> String {
        payload::parse_body(&self.body)
            .ok()
            .and_then(|v| payload::error_message(&v))
            .unwrap_or_else(|| self.status.canonical_reason().unwrap_or("no reason given").to_owned())
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// How one request is sent, besides its method, URL and body.
#[derive(Clone, Copy, Debug, Default)]
struct Sending<'a> {
    /// `If-None-Match`: the ETag of the cached copy.
    if_none_match: Option<&'a str>,
    /// `Connection: close`: the connection ends with the answer instead of
    /// waiting in the pool for a next request.
    close: bool,
}

/// A resource's ETag and what its reader kept of it: the few fields a
/// parser took ([`Bmc::get_parsed`]), or the whole body as compact JSON
/// ([`Bmc::get_json`]). A reader only uses an entry of its own type.
type Tagged = (String, Arc<dyn Any + Send + Sync>);

/// A client for one BMC endpoint.
#[derive(Clone)]
pub struct Bmc {
    inner: Arc<Inner>,
}

struct Inner {
    endpoint: Url,
    http: reqwest::Client,
    credentials: Credentials,
    auth_mode: AuthMode,
    timing: Timing,
    limiter: Arc<Semaphore>,
    /// Shared by every client of this endpoint (see [`crate::fleet`]).
    gate: Arc<EndpointGate>,
    conversation: Mutex<Option<Conversation>>,
    /// By URL: the ETag of the last full read and what its reader kept of
    /// the body. A sweep reads a System, a Chassis and its power readings
    /// from every BMC; kept as the parsed fields, the three take a few
    /// hundred bytes (their compact JSON was 5.5 KB, a parsed `Value` of a
    /// System alone some 24 KiB).
    etags: SyncMutex<HashMap<String, Tagged>>,
    systems: Mutex<HashMap<SystemSelector, String>>,
}

impl std::fmt::Debug for Bmc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bmc")
            .field("endpoint", &self.inner.endpoint.as_str())
            .field("username", &self.inner.credentials.username)
            .finish_non_exhaustive()
    }
}

/// Backoff before attempt `attempt` (1-based): full jitter over an
/// exponentially growing window, so a fleet of clients does not retry in step.
pub(crate) fn jittered_backoff(base: Duration, attempt: u32) -> Duration {
    let window = base.saturating_mul(1u32 << attempt.min(10));
    let millis = u64::try_from(window.as_millis()).unwrap_or(u64::MAX).max(1);
    Duration::from_millis(fastrand::u64(millis / 2..=millis))
}

impl Bmc {
    /// A client for one BMC. `limiter` bounds the requests in flight across
    /// every BMC that shares it. The client has its own reset slot and no
    /// request bound of its own; clients from a [`crate::fleet::BmcFleet`]
    /// share both with every other client of their endpoint.
    ///
    /// # Errors
    /// [`Error::TlsConfig`] when the TLS settings cannot be used.
    pub fn new(config: BmcConfig, limiter: Arc<Semaphore>) -> Result<Self> {
        let http = http_client(&config.tls, &config.timing)?;
        Ok(Bmc::with_gate(config, http, limiter, Arc::new(EndpointGate::new(Semaphore::MAX_PERMITS))))
    }

    /// A client that shares `gate` with the other clients of its endpoint,
    /// and sends through `http` (see [`http_client`]), which clients of
    /// other endpoints may share.
    pub(crate) fn with_gate(config: BmcConfig, http: reqwest::Client, limiter: Arc<Semaphore>, gate: Arc<EndpointGate>) -> Self {
        if config.tls.insecure_skip_verify {
            tracing::warn!(endpoint = %config.endpoint, "TLS certificate verification is DISABLED for this BMC (insecure_skip_verify)");
        }
        Bmc {
            inner: Arc::new(Inner {
                endpoint: config.endpoint,
                http,
                credentials: config.credentials,
                auth_mode: config.auth,
                timing: config.timing,
                limiter,
                gate,
                conversation: Mutex::new(None),
                etags: SyncMutex::new(HashMap::new()),
                systems: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn endpoint(&self) -> &Url {
        &self.inner.endpoint
    }

    pub fn timing(&self) -> &Timing {
        &self.inner.timing
    }

    /// True when both are one client: one session, one connection pool.
    pub fn is_same_client(&self, other: &Bmc) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// True while another handle to this client exists.
    pub(crate) fn is_shared(&self) -> bool {
        Arc::strong_count(&self.inner) > 1
    }

    /// The endpoint's one reset slot: held while a reset is sent and its
    /// task monitor followed, so resets reach one BMC one at a time.
    pub(crate) async fn reset_slot(&self) -> Result<SemaphorePermit<'_>> {
        self.inner.gate.reset().await.ok_or_else(|| shutting_down(Step::Reset, &self.inner.endpoint))
    }

    /// Serializes power sequences on the system at `path`.
    pub(crate) async fn sequence_lock(&self, path: &str) -> OwnedMutexGuard<()> {
        self.inner.gate.sequence(path).await
    }

    /// An absolute URL on this BMC. Links that leave the BMC's origin are
    /// refused so a session token is never sent elsewhere.
    pub(crate) fn url(&self, step: Step, path: &str) -> Result<Url> {
        let url = self.inner.endpoint.join(path).map_err(|err| Error::MalformedPayload {
            url: self.inner.endpoint.to_string(),
            path: format!("link {path:?}"),
            reason: err.to_string(),
        })?;
        if url.origin() != self.inner.endpoint.origin() {
            return Err(Error::MalformedPayload {
                url: self.inner.endpoint.to_string(),
                path: format!("link {path:?}"),
                reason: format!("points outside the BMC while {step}"),
            });
        }
        Ok(url)
    }

    /// One HTTP exchange, holding a permit of its endpoint and then one of
    /// the global bound while it runs (in that order, so that a request
    /// waiting for a busy BMC holds no permit other BMCs could use).
    async fn send(&self, step: Step, method: Method, url: &Url, body: Option<&Value>, auth: &Auth, how: Sending<'_>) -> Result<Reply> {
        let _endpoint_permit = self.inner.gate.request().await.ok_or_else(|| shutting_down(step, url))?;
        let _permit = self.inner.limiter.acquire().await.map_err(|_| shutting_down(step, url))?;
        let mut request = self.inner.http.request(method, url.clone()).header("Accept", "application/json");
        request = match auth {
            Auth::Anonymous => request,
            Auth::Basic => request.basic_auth(&self.inner.credentials.username, Some(self.inner.credentials.password.expose())),
            Auth::Session { token, .. } => {
                let mut value = HeaderValue::from_str(token.expose()).map_err(|_| Error::MalformedPayload {
                    url: url.to_string(),
                    path: "X-Auth-Token header".into(),
                    reason: "the session token is not a valid header value".into(),
                })?;
                value.set_sensitive(true);
                request.header("X-Auth-Token", value)
            }
        };
        if let Some(etag) = how.if_none_match {
            request = request.header("If-None-Match", etag);
        }
        if how.close {
            request = request.header(reqwest::header::CONNECTION, "close");
        }
        if let Some(body) = body {
            let bytes = serde_json::to_vec(body).map_err(|err| Error::MalformedPayload {
                url: url.to_string(),
                path: "$".into(),
                reason: format!("cannot encode the request body: {err}"),
            })?;
            request = request.header("Content-Type", "application/json").body(bytes);
        }
        let classify = |err: reqwest::Error| {
            if err.is_timeout() {
                Error::RequestTimedOut { step, url: url.to_string(), timeout: self.inner.timing.request_timeout }
            } else if let Some(tls) = tls_failure(&err) {
                Error::TlsHandshake { step, url: url.to_string(), reason: tls.to_string() }
            } else {
                Error::Unreachable { step, url: url.to_string(), source: err.without_url() }
            }
        };
        let response = request.send().await.map_err(classify)?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(classify)?.to_vec();
        tracing::trace!(%url, status = status.as_u16(), step = %step, "redfish exchange");
        Ok(Reply { status, headers, body, url: url.to_string() })
    }

    /// A request with authentication, one re-login on a 401 of an expired
    /// session, and retries with jitter on transient failures.
    ///
    /// `idempotent` requests retry on any transient failure; others only
    /// when the request surely did not arrive (connect failure) or the BMC
    /// said it was busy (429, 503).
    pub(crate) async fn request(&self, step: Step, method: Method, path: &str, body: Option<&Value>, idempotent: bool) -> Result<Reply> {
        let url = self.url(step, path)?;
        self.exchange(step, method, &url, body, idempotent, Sending::default()).await
    }

    /// [`Bmc::request`] to a resolved URL, sent `how`.
    async fn exchange(&self, step: Step, method: Method, url: &Url, body: Option<&Value>, idempotent: bool, how: Sending<'_>) -> Result<Reply> {
        let mut attempt = 0;
        let mut relogged = false;
        loop {
            let auth = self.auth(step).await?;
            let outcome = self.send(step, method.clone(), url, body, &auth, how).await;
            let err = match outcome {
                Ok(reply) if reply.status == StatusCode::UNAUTHORIZED || reply.status == StatusCode::FORBIDDEN => {
                    if let Auth::Session { token, .. } = &auth
                        && reply.status == StatusCode::UNAUTHORIZED
                        && !relogged
                    {
                        tracing::debug!(endpoint = %self.inner.endpoint, "session rejected; logging in again");
                        self.relogin(token).await?;
                        relogged = true;
                        continue;
                    }
                    return Err(Error::AuthFailed { step, status: reply.status.as_u16() });
                }
                Ok(reply) if reply.status == StatusCode::TOO_MANY_REQUESTS || reply.status.is_server_error() => {
                    Error::HttpStatus { step, url: url.to_string(), status: reply.status.as_u16(), message: reply.message() }
                }
                Ok(reply) => return Ok(reply),
                Err(err) => err,
            };
            let retry = if idempotent {
                err.is_transient()
            } else {
                match &err {
                    Error::Unreachable { source, .. } => source.is_connect(),
                    Error::HttpStatus { status, .. } => *status == 429 || *status == 503,
                    _ => false,
                }
            };
            if !retry || attempt >= self.inner.timing.retries {
                return Err(err);
            }
            attempt += 1;
            let delay = jittered_backoff(self.inner.timing.retry_backoff, attempt);
            tracing::debug!(error = %err, attempt, ?delay, "retrying a redfish request");
            tokio::time::sleep(delay).await;
        }
    }

    /// GET a resource as JSON, using and refreshing the ETag cache.
    pub(crate) async fn get_json(&self, step: Step, path: &str) -> Result<Value> {
        self.get_cached(
            step,
            path,
            false,
            |value| {
                let body = serde_json::to_vec(&value).ok();
                Ok((value, body))
            },
            |body: &Vec<u8>| serde_json::from_slice(body).ok(),
        )
        .await
    }

    /// GET a resource and parse it, using and refreshing the ETag cache,
    /// which keeps the parsed value rather than the body.
    pub(crate) async fn get_parsed<T>(&self, step: Step, path: &str, parse: fn(&Value) -> PayloadResult<T>) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
    {
        self.read_parsed(step, path, parse, false).await
    }

    /// [`Bmc::get_parsed`], closing the connection after the answer when
    /// `close`: for the last read of a visit that will not come back
    /// before the connection would have idled out.
    pub(crate) async fn read_parsed<T>(&self, step: Step, path: &str, parse: fn(&Value) -> PayloadResult<T>, close: bool) -> Result<T>
    where
        T: Clone + Send + Sync + 'static,
    {
        self.get_cached(
            step,
            path,
            close,
            |value| {
                let parsed = parse(&value).map_err(|err| malformed(path, err))?;
                Ok((parsed.clone(), Some(parsed)))
            },
            |parsed: &T| Some(parsed.clone()),
        )
        .await
    }

    /// A GET through the ETag cache: `If-None-Match` is sent only when the
    /// cache holds a `K` for the URL, which a 304 then answers through
    /// `reuse`; a full answer is turned by `keep` into what to return and
    /// what to cache, if anything. With `close`, the connection is closed
    /// after the answer.
    async fn get_cached<T, K>(
        &self,
        step: Step,
        path: &str,
        close: bool,
        keep: impl FnOnce(Value) -> Result<(T, Option<K>)>,
        reuse: impl FnOnce(&K) -> Option<T>,
    ) -> Result<T>
    where
        K: Send + Sync + 'static,
    {
        let url = self.url(step, path)?;
        let cached = self.cached::<K>(url.as_str());
        let how = Sending { if_none_match: cached.as_ref().map(|(etag, _)| etag.as_str()), close };
        let reply = self.exchange(step, Method::GET, &url, None, true, how).await?;
        if reply.status == StatusCode::NOT_MODIFIED
            && let Some(value) = cached.as_ref().and_then(|(_, kept)| reuse(kept))
        {
            return Ok(value);
        }
        if !reply.status.is_success() {
            return Err(Error::HttpStatus { step, url: reply.url.clone(), status: reply.status.as_u16(), message: reply.message() });
        }
        let value = payload::parse_body(&reply.body).map_err(|err| malformed(&reply.url, err))?;
        let (value, kept) = keep(value)?;
        if let (Some(etag), Some(kept)) = (reply.header("ETag"), kept) {
            self.remember(&reply.url, etag.to_owned(), Arc::new(kept));
        }
        Ok(value)
    }

    fn cached<K: Send + Sync + 'static>(&self, url: &str) -> Option<(String, Arc<K>)> {
        let cache = self.inner.etags.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (etag, kept) = cache.get(url)?;
        Some((etag.clone(), kept.clone().downcast::<K>().ok()?))
    }

    fn remember(&self, url: &str, etag: String, kept: Arc<dyn Any + Send + Sync>) {
        let mut cache = self.inner.etags.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if cache.len() >= MAX_CACHED_ETAGS {
            cache.clear();
        }
        cache.insert(url.to_owned(), (etag, kept));
    }

    /// Forgets the cached copy of a resource, so the next read is a full one.
    pub(crate) fn forget(&self, path: &str) {
        if let Ok(url) = self.url(Step::ReadSystem, path) {
            let mut cache = self.inner.etags.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            cache.remove(url.as_str());
        }
    }

    /// The current authentication, discovering the service and logging in
    /// on first use.
    async fn auth(&self, step: Step) -> Result<Auth> {
        let mut conversation = self.inner.conversation.lock().await;
        if let Some(conversation) = conversation.as_ref() {
            return Ok(conversation.auth.clone());
        }
        let root = self.discover().await?;
        let auth = self.login(&root).await.map_err(|err| match err {
            Error::AuthFailed { status, .. } if step != Step::Login => Error::AuthFailed { step: Step::Login, status },
            other => other,
        })?;
        *conversation = Some(Conversation { root, auth: auth.clone() });
        Ok(auth)
    }

    /// The service root, read without credentials as the specification
    /// allows, or with Basic auth for BMCs that demand it.
    async fn discover(&self) -> Result<ServiceRoot> {
        let url = self.url(Step::Discover, SERVICE_ROOT)?;
        let mut attempt = 0;
        let mut auth = Auth::Anonymous;
        loop {
            let err = match self.send(Step::Discover, Method::GET, &url, None, &auth, Sending::default()).await {
                Ok(reply) if reply.status == StatusCode::UNAUTHORIZED || reply.status == StatusCode::FORBIDDEN => {
                    if matches!(auth, Auth::Anonymous) {
                        auth = Auth::Basic;
                        continue;
                    }
                    return Err(Error::AuthFailed { step: Step::Discover, status: reply.status.as_u16() });
                }
                Ok(reply) if reply.status.is_success() => {
                    let value = payload::parse_body(&reply.body).map_err(|err| malformed(&reply.url, err))?;
                    return payload::service_root(&value).map_err(|err| malformed(&reply.url, err));
                }
                Ok(reply) => unexpected_status(Step::Discover, &reply),
                Err(err) => err,
            };
            self.pause_before_retry(err, &mut attempt).await?;
        }
    }

    /// Waits out a jittered backoff before the next attempt, or gives the
    /// error back when it is not transient or the retries are spent.
    async fn pause_before_retry(&self, err: Error, attempt: &mut u32) -> Result<()> {
        if !err.is_transient() || *attempt >= self.inner.timing.retries {
            return Err(err);
        }
        *attempt += 1;
        tokio::time::sleep(jittered_backoff(self.inner.timing.retry_backoff, *attempt)).await;
        Ok(())
    }

    async fn login(&self, root: &ServiceRoot) -> Result<Auth> {
        let sessions = match (self.inner.auth_mode, &root.sessions) {
            (AuthMode::Basic, _) | (AuthMode::Auto, None) => return Ok(Auth::Basic),
            (AuthMode::Session, None) => {
                return Err(Error::HttpStatus {
                    step: Step::Login,
                    url: self.inner.endpoint.to_string(),
                    status: 0,
                    message: "sessions were required but the service root links no session collection".into(),
                });
            }
            (_, Some(sessions)) => sessions.clone(),
        };
        let url = self.url(Step::Login, &sessions)?;
        let body = serde_json::json!({
            "UserName": self.inner.credentials.username,
            "Password": self.inner.credentials.password.expose(),
        });
        let mut attempt = 0;
        loop {
            let err = match self.send(Step::Login, Method::POST, &url, Some(&body), &Auth::Anonymous, Sending::default()).await {
                Ok(reply) if reply.status.is_success() => {
                    let token = reply.header("X-Auth-Token").filter(|t| !t.is_empty()).ok_or_else(|| Error::MalformedPayload {
                        url: reply.url.clone(),
                        path: "X-Auth-Token header".into(),
                        reason: "the session was created without a token".into(),
                    })?;
                    let location = reply.header("Location").map(str::to_owned).or_else(|| {
                        payload::parse_body(&reply.body).ok().and_then(|v| v.get("@odata.id").and_then(Value::as_str).map(str::to_owned))
                    });
                    tracing::debug!(endpoint = %self.inner.endpoint, "redfish session opened");
                    return Ok(Auth::Session { token: Secret::new(token), location });
                }
                Ok(reply) if reply.status == StatusCode::UNAUTHORIZED || reply.status == StatusCode::FORBIDDEN => {
                    return Err(Error::AuthFailed { step: Step::Login, status: reply.status.as_u16() });
                }
                Ok(reply) if self.inner.auth_mode == AuthMode::Auto && matches!(reply.status.as_u16(), 400 | 404 | 405 | 501) => {
                    tracing::debug!(endpoint = %self.inner.endpoint, status = reply.status.as_u16(), "sessions unavailable; using Basic auth");
                    return Ok(Auth::Basic);
                }
                Ok(reply) => unexpected_status(Step::Login, &reply),
                Err(err) => err,
            };
            self.pause_before_retry(err, &mut attempt).await?;
        }
    }

    /// Logs in again unless another task already replaced `stale`.
    async fn relogin(&self, stale: &Secret) -> Result<()> {
        let mut conversation = self.inner.conversation.lock().await;
        let Some(current) = conversation.as_mut() else { return Ok(()) };
        if let Auth::Session { token, .. } = &current.auth
            && token != stale
        {
            return Ok(());
        }
        let root = current.root.clone();
        current.auth = self.login(&root).await?;
        Ok(())
    }

    /// Closes the session, if one is open. Later requests log in again.
    ///
    /// # Errors
    /// Only unreachable BMCs are reported; a session the BMC already
    /// forgot (401, 404) counts as closed.
    pub async fn logout(&self) -> Result<()> {
        let taken = self.inner.conversation.lock().await.take();
        let Some(Conversation { auth: Auth::Session { token, location: Some(location) }, .. }) = taken else {
            return Ok(());
        };
        let url = self.url(Step::Logout, &location)?;
        let auth = Auth::Session { token, location: None };
        let reply = self.send(Step::Logout, Method::DELETE, &url, None, &auth, Sending::default()).await?;
        if reply.status.is_success() || matches!(reply.status.as_u16(), 401 | 404) {
            tracing::debug!(endpoint = %self.inner.endpoint, "redfish session closed");
            Ok(())
        } else {
            Err(Error::HttpStatus { step: Step::Logout, url: reply.url.clone(), status: reply.status.as_u16(), message: reply.message() })
        }
    }

    pub(crate) async fn systems_collection(&self) -> Result<String> {
        self.auth(Step::ResolveSystem).await?;
        let conversation = self.inner.conversation.lock().await;
        Ok(conversation.as_ref().and_then(|c| c.root.systems.clone()).unwrap_or_else(|| DEFAULT_SYSTEMS.to_owned()))
    }

    pub(crate) async fn chassis_collection(&self) -> Result<Option<String>> {
        self.auth(Step::ReadChassis).await?;
        let conversation = self.inner.conversation.lock().await;
        Ok(conversation.as_ref().and_then(|c| c.root.chassis.clone()))
    }

    /// True unless this client has resolved systems at more than one path:
    /// a BMC of one machine, as most rack servers have, rather than a
    /// chassis manager or an emulator serving many.
    pub(crate) async fn serves_one_system(&self) -> bool {
        let known = self.inner.systems.lock().await;
        let mut paths = known.values();
        let first = paths.next();
        paths.all(|path| Some(path) == first)
    }

    /// The resource path of a system.
    ///
    /// # Errors
    /// [`Error::SystemNotFound`] when no member of the Systems collection
    /// has that last path segment, `Id` or `UUID`.
    pub async fn resolve(&self, selector: &SystemSelector) -> Result<String> {
        // Held across the lookup so that a sweep of many systems on one BMC
        // reads the collection once, not once per system.
        let mut known = self.inner.systems.lock().await;
        if let Some(path) = known.get(selector) {
            return Ok(path.clone());
        }
        let path = match selector {
            SystemSelector::Path(path) => path.clone(),
            SystemSelector::Id(wanted) | SystemSelector::Uuid(wanted) => {
                let collection = self.systems_collection().await?;
                let members = payload::collection_members(&self.get_json(Step::ResolveSystem, &collection).await?)
                    .map_err(|err| malformed(&collection, err))?;
                for member in &members {
                    let path = member.trim_end_matches('/');
                    known.insert(SystemSelector::Path(path.to_owned()), path.to_owned());
                    if let Some(last) = path.rsplit('/').next() {
                        known.insert(SystemSelector::Id(last.to_owned()), path.to_owned());
                    }
                }
                match self.find_member(selector, wanted, &members).await? {
                    Some(path) => path,
                    None => return Err(Error::SystemNotFound { selector: selector.to_string() }),
                }
            }
        };
        known.insert(selector.clone(), path.clone());
        Ok(path)
    }

    async fn find_member(&self, selector: &SystemSelector, wanted: &str, members: &[String]) -> Result<Option<String>> {
        let same = |a: &str, b: &str| match selector {
            SystemSelector::Uuid(_) => a.eq_ignore_ascii_case(b),
            _ => a == b,
        };
        if let Some(member) = members.iter().find(|m| m.trim_end_matches('/').rsplit('/').next().is_some_and(|last| same(last, wanted))) {
            return Ok(Some(member.trim_end_matches('/').to_owned()));
        }
        // Ids usually equal the last segment; UUIDs need a look inside.
        for member in members {
            let system = self.get_parsed(Step::ResolveSystem, member, payload::system).await?;
            let field = match selector {
                SystemSelector::Uuid(_) => system.uuid,
                _ => system.id,
            };
            if field.is_some_and(|f| same(&f, wanted)) {
                return Ok(Some(member.trim_end_matches('/').to_owned()));
            }
        }
        Ok(None)
    }
}

/// The rustls error somewhere in a request error's chain, if any. rustls
/// errors travel inside `std::io::Error`, whose `source` skips them.
fn tls_failure(err: &reqwest::Error) -> Option<&rustls::Error> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    // Bounded: error chains are short, and a cycle must not hang us.
    for _ in 0..16 {
        let e = current?;
        if let Some(tls) = e.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        current = match e.downcast_ref::<std::io::Error>() {
            Some(io) => io.get_ref().map(|inner| inner as &(dyn std::error::Error + 'static)),
            None => e.source(),
        };
    }
    None
}

pub(crate) fn malformed(url: &str, err: PayloadError) -> Error {
    Error::MalformedPayload { url: url.to_owned(), path: err.path, reason: err.reason }
}

impl Drop for Inner {
    /// Best-effort logout so a dropped client does not hold one of the few
    /// session slots a BMC has. Needs a running tokio runtime; without one
    /// the session simply expires on the BMC.
    fn drop(&mut self) {
        let Some(Conversation { auth: Auth::Session { token, location: Some(location) }, .. }) = self.conversation.get_mut().take() else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        let Ok(url) = self.endpoint.join(&location) else { return };
        if url.origin() != self.endpoint.origin() {
            return;
        }
        let http = self.http.clone();
        handle.spawn(async move {
            let Ok(mut value) = HeaderValue::from_str(token.expose()) else { return };
            value.set_sensitive(true);
            let _ = http.delete(url).header("X-Auth-Token", value).send().await;
        });
    }
}

fn shutting_down(step: Step, url: &Url) -> Error {
    Error::HttpStatus { step, url: url.to_string(), status: 0, message: "the client is shutting down".into() }
}

/// An answer that is neither success nor a case the step handles.
fn unexpected_status(step: Step, reply: &Reply) -> Error {
    Error::HttpStatus { step, url: reply.url.clone(), status: reply.status.as_u16(), message: reply.message() }
}

/// The HTTP client for BMCs with these TLS settings and timing. Its pool
/// keeps connections per origin, so one client serves any number of BMCs:
/// a fleet builds one per distinct TLS settings, not one per BMC (each
/// costs about 12 KiB built, and its own pool).
///
/// # Errors
/// [`Error::TlsConfig`] when the TLS settings cannot be used.
pub(crate) fn http_client(tls: &crate::TlsSettings, timing: &Timing) -> Result<reqwest::Client> {
    let tls = tls.client_config()?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .timeout(timing.request_timeout)
        .connect_timeout(timing.connect_timeout)
        .pool_idle_timeout(timing.idle_connection)
        .user_agent(concat!("ironclaim/", env!("CARGO_PKG_VERSION")))
        // A redirect is followed only within the BMC's own origin: the
        // session token (X-Auth-Token) and Basic credentials must never
        // reach another host, port or scheme.
        .redirect(reqwest::redirect::Policy::custom(|attempt| {
            let same_origin = attempt.previous().first().is_some_and(|first| first.origin() == attempt.url().origin());
            if same_origin && attempt.previous().len() < 5 { attempt.follow() } else { attempt.stop() }
        }))
        .build()
        .map_err(|err| Error::TlsConfig { reason: format!("cannot build the HTTP client: {err}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_stays_within_its_growing_window() {
        let base = Duration::from_millis(100);
        for attempt in 1..=12 {
            let window = base.saturating_mul(1 << attempt.min(10));
            for _ in 0..50 {
                let d = jittered_backoff(base, attempt);
                assert!(d <= window && d >= window / 2, "attempt {attempt}: {d:?} outside {window:?}");
            }
        }
    }
}
