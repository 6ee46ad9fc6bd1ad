//! A mock BMC on loopback that serves the DMTF public-rackmount1 mockup
//! payloads verbatim, plus the behaviour a static mockup cannot show:
//! sessions, ETags, power changes, task monitors, ActionInfo and faults,
//! more systems behind the one endpoint (a chassis manager), and a record
//! of every request and of when each reset was in flight.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::time::Instant;

use super::{PASSWORD, USERNAME};

pub const SYSTEM: &str = "/redfish/v1/Systems/437XR1138R2";
pub const SYSTEM_UUID: &str = "38947555-7742-3448-3784-823347823834";
pub const RESET_TARGET: &str = "/redfish/v1/Systems/437XR1138R2/Actions/ComputerSystem.Reset";
pub const ACTION_INFO: &str = "/redfish/v1/Systems/437XR1138R2/ResetActionInfo";
const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
const TASK_MONITOR: &str = "/redfish/v1/TaskService/TaskMonitors/";
const SYSTEMS: &str = "/redfish/v1/Systems";
const RESET_SUFFIX: &str = "/Actions/ComputerSystem.Reset";

/// A system served besides the mockup's own, as a copy of it under
/// `/redfish/v1/Systems/{id}`.
pub struct OtherSystem {
    pub power: String,
    pub pending: Option<(String, Instant)>,
}

/// One reset the mock received: which system, what, and when it arrived
/// and was answered.
#[derive(Clone, Debug)]
pub struct ResetSeen {
    pub system: String,
    pub reset: String,
    pub arrived: Instant,
    pub answered: Instant,
}

impl ResetSeen {
    /// True when the two were in flight at the same moment.
    pub fn overlaps(&self, other: &ResetSeen) -> bool {
        self.arrived < other.answered && other.arrived < self.answered
    }
}

/// What the mock does and what it saw. Tests change and read it freely.
pub struct World {
    pub power: String,
    pub pending: Option<(String, Instant)>,
    pub apply_delay: Duration,
    /// Resets answered 204 and then ignored.
    pub drop_resets: u32,
    /// Reset types answered with 400.
    pub reject_resets: Vec<String>,
    /// Answer resets with 202 and a task monitor that needs this many polls.
    pub task_polls: Option<u32>,
    pub task_fails: bool,
    /// Replace the inline AllowableValues with an ActionInfo listing these.
    pub action_info: Option<Vec<String>>,
    /// Answer the next N non-root requests with 500.
    pub fail_next: u32,
    /// Delay answers to GETs of this path.
    pub slow: Option<(String, Duration)>,
    /// Cut the body of this path in half.
    pub truncate: Option<String>,
    /// Serve this body for this path instead of the mockup.
    pub replace: HashMap<String, Value>,
    /// Pretend the chassis has no EnvironmentMetrics (an older BMC).
    pub hide_environment_metrics: bool,
    /// No SessionService: Basic auth only.
    pub basic_only: bool,
    pub tokens: HashSet<String>,
    pub next_session: u32,
    pub logins: u32,
    pub logouts: u32,
    pub resets: Vec<String>,
    pub task_polls_seen: u32,
    pub action_info_reads: u32,
    pub not_modified: u32,
    pub basic_requests: u32,
    pub token_requests: u32,
    /// Systems besides the mockup's, by Id (see [`World::add_system`]).
    pub other_systems: BTreeMap<String, OtherSystem>,
    /// How long every reset takes to be answered (held outside the world,
    /// so other requests go on meanwhile).
    pub reset_delay: Duration,
    /// Every request, as `METHOD /path`, in arrival order.
    pub requests: Vec<String>,
    /// Every reset, of any system, with when it was in flight.
    pub reset_log: Vec<ResetSeen>,
    pub resets_in_flight: u32,
    /// The most resets ever in flight at once.
    pub max_resets_in_flight: u32,
}

impl World {
    fn new() -> Self {
        World {
            power: "On".into(),
            pending: None,
            apply_delay: Duration::from_millis(100),
            drop_resets: 0,
            reject_resets: Vec::new(),
            task_polls: None,
            task_fails: false,
            action_info: None,
            fail_next: 0,
            slow: None,
            truncate: None,
            replace: HashMap::new(),
            hide_environment_metrics: false,
            basic_only: false,
            tokens: HashSet::new(),
            next_session: 0,
            logins: 0,
            logouts: 0,
            resets: Vec::new(),
            task_polls_seen: 0,
            action_info_reads: 0,
            not_modified: 0,
            basic_requests: 0,
            token_requests: 0,
            other_systems: BTreeMap::new(),
            reset_delay: Duration::ZERO,
            requests: Vec::new(),
            reset_log: Vec::new(),
            resets_in_flight: 0,
            max_resets_in_flight: 0,
        }
    }

    /// Serves one more system, `/redfish/v1/Systems/{id}`, in `power`.
    pub fn add_system(&mut self, id: &str, power: &str) {
        self.other_systems.insert(id.to_owned(), OtherSystem { power: power.to_owned(), pending: None });
    }

    /// The power state of the mockup's system or of another one.
    pub fn power_of(&mut self, system: &str) -> String {
        self.settle();
        if system == SYSTEM {
            return self.power.clone();
        }
        let id = system.rsplit('/').next().unwrap_or(system);
        self.other_systems.get(id).map(|s| s.power.clone()).unwrap_or_default()
    }

    /// Every open session token stops working, as after a session timeout.
    pub fn expire_sessions(&mut self) {
        self.tokens.clear();
    }

    fn settle(&mut self) {
        let now = Instant::now();
        if let Some((state, at)) = self.pending.clone()
            && now >= at
        {
            self.power = state;
            self.pending = None;
        }
        for system in self.other_systems.values_mut() {
            if let Some((state, at)) = system.pending.clone()
                && now >= at
            {
                system.power = state;
                system.pending = None;
            }
        }
    }
}

/// Connections opened to a [`MockBmc::counted_endpoint`], and closed.
#[derive(Debug, Default)]
pub struct Connections {
    pub opened: std::sync::atomic::AtomicUsize,
    pub closed: std::sync::atomic::AtomicUsize,
}

impl Connections {
    /// (opened, closed) so far.
    pub fn now(&self) -> (usize, usize) {
        (self.opened.load(std::sync::atomic::Ordering::SeqCst), self.closed.load(std::sync::atomic::Ordering::SeqCst))
    }
}

pub struct MockBmc {
    pub addr: SocketAddr,
    pub world: Arc<Mutex<World>>,
    server: tokio::task::JoinHandle<()>,
    root: Arc<PathBuf>,
    /// The listeners of [`MockBmc::listen_again`].
    more: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Drop for MockBmc {
    fn drop(&mut self) {
        self.server.abort();
        for more in self.more.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            more.abort();
        }
    }
}

fn app(world: Arc<Mutex<World>>, root: Arc<PathBuf>) -> axum::Router {
    let state = (world, root);
    axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
        let (world, root) = state.clone();
        async move { handle(world, root, method, uri, headers, body).await }
    })
}

impl MockBmc {
    pub async fn start() -> MockBmc {
        let world = Arc::new(Mutex::new(World::new()));
        let root = Arc::new(super::mockup_dir());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind mock");
        let addr = listener.local_addr().expect("mock addr");
        let app = app(world.clone(), root.clone());
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        MockBmc { addr, world, server, root, more: Mutex::default() }
    }

    /// One more endpoint serving the same world, as a BMC of its own: a
    /// client keeps one session and one reset at a time per endpoint, so a
    /// fleet with a BMC per server needs an endpoint per server.
    pub async fn listen_again(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind mock");
        let addr = listener.local_addr().expect("mock addr");
        let app = app(self.world.clone(), self.root.clone());
        let serving = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        self.more.lock().unwrap_or_else(|p| p.into_inner()).push(serving);
        format!("http://{addr}")
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// An endpoint in front of this one that counts the connections
    /// clients open to it and close.
    pub async fn counted_endpoint(&self) -> (String, Arc<Connections>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let counts = Arc::new(Connections::default());
        let (target, seen) = (self.addr, counts.clone());
        let relay = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                seen.opened.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let seen = seen.clone();
                tokio::spawn(async move {
                    if let Ok(mut upstream) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                    seen.closed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                });
            }
        });
        self.more.lock().unwrap_or_else(|p| p.into_inner()).push(relay);
        (format!("http://{addr}"), counts)
    }

    pub fn world(&self) -> std::sync::MutexGuard<'_, World> {
        self.world.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn redfish_error(status: StatusCode, message: &str) -> Response {
    let body = json!({"error": {"code": "Base.1.0.GeneralError", "message": message,
        "@Message.ExtendedInfo": [{"MessageId": "Base.1.0.GeneralError", "Message": message}]}});
    (status, [("Content-Type", "application/json")], body.to_string()).into_response()
}

fn basic_ok(headers: &HeaderMap) -> Option<bool> {
    let value = headers.get("Authorization")?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ")?;
    let decoded = decode_base64(encoded)?;
    Some(decoded == format!("{USERNAME}:{PASSWORD}").into_bytes())
}

fn decode_base64(text: &str) -> Option<Vec<u8>> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = Vec::new();
    for c in text.trim_end_matches('=').bytes() {
        let v = ALPHABET.iter().position(|&a| a == c)? as u32;
        bits = (bits << 6) | v;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            out.push((bits >> nbits) as u8);
            bits &= (1 << nbits) - 1;
        }
    }
    Some(out)
}

fn read_mockup(root: &std::path::Path, path: &str) -> Option<Value> {
    let relative = path.trim_start_matches("/redfish/v1").trim_matches('/');
    let file = if relative.is_empty() { root.join("index.json") } else { root.join(relative).join("index.json") };
    let text = std::fs::read_to_string(file).ok()?;
    serde_json::from_str(&text).ok()
}

fn etag_of(body: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    body.hash(&mut hasher);
    format!("W/\"{:016x}\"", hasher.finish())
}

/// Records the request and, for a reset, holds it `reset_delay` and notes
/// when it was in flight.
async fn handle(world: Arc<Mutex<World>>, root: Arc<PathBuf>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().trim_end_matches('/').to_owned();
    let reset = (method == Method::POST && path.ends_with(RESET_SUFFIX)).then(|| {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        (path.trim_end_matches(RESET_SUFFIX).to_owned(), request["ResetType"].as_str().unwrap_or_default().to_owned())
    });
    let delay = {
        let mut w = world.lock().unwrap_or_else(|p| p.into_inner());
        w.requests.push(format!("{method} {path}"));
        if reset.is_some() {
            w.resets_in_flight += 1;
            w.max_resets_in_flight = w.max_resets_in_flight.max(w.resets_in_flight);
        }
        w.reset_delay
    };
    let Some((system, reset)) = reset else {
        return respond(world, root, method, uri, headers, body).await;
    };
    let arrived = Instant::now();
    tokio::time::sleep(delay).await;
    let response = respond(world.clone(), root, method, uri, headers, body).await;
    let mut w = world.lock().unwrap_or_else(|p| p.into_inner());
    w.resets_in_flight -= 1;
    w.reset_log.push(ResetSeen { system, reset, arrived, answered: Instant::now() });
    response
}

/// The copy of the mockup's system that stands for another one.
fn other_system_body(mut value: Value, id: &str, power: &str) -> Value {
    let path = format!("{SYSTEMS}/{id}");
    value["@odata.id"] = json!(path);
    value["Id"] = json!(id);
    value["Name"] = json!(format!("system {id}"));
    let tag = id.bytes().fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b))) & 0xffff_ffff_ffff;
    value["UUID"] = json!(format!("00000000-0000-4000-8000-{tag:012x}"));
    value["PowerState"] = json!(power);
    value["Actions"]["#ComputerSystem.Reset"]["target"] = json!(format!("{path}{RESET_SUFFIX}"));
    value
}

async fn respond(world: Arc<Mutex<World>>, root: Arc<PathBuf>, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let path = uri.path().trim_end_matches('/').to_owned();
    let path = if path.is_empty() { "/redfish/v1".to_owned() } else { path };
    let is_root = path == "/redfish/v1";

    let slow = {
        let w = world.lock().unwrap_or_else(|p| p.into_inner());
        w.slow.clone().filter(|(p, _)| *p == path).map(|(_, d)| d)
    };
    if let Some(delay) = slow {
        tokio::time::sleep(delay).await;
    }

    let mut w = world.lock().unwrap_or_else(|p| p.into_inner());
    w.settle();

    if is_root && method == Method::GET {
        let mut value = read_mockup(&root, &path).unwrap_or(Value::Null);
        if w.basic_only
            && let Some(obj) = value.as_object_mut()
        {
            obj.remove("SessionService");
            obj.remove("Links");
        }
        return json_response(&value, &headers, &mut w);
    }
    if w.fail_next > 0 {
        w.fail_next -= 1;
        return redfish_error(StatusCode::INTERNAL_SERVER_ERROR, "internal error injected by the test");
    }

    // Session creation needs no prior authentication.
    if method == Method::POST && path == SESSIONS && !w.basic_only {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if request["UserName"] != USERNAME || request["Password"] != PASSWORD {
            return redfish_error(StatusCode::UNAUTHORIZED, "invalid credentials");
        }
        w.next_session += 1;
        w.logins += 1;
        let id = w.next_session;
        let token = format!("token-{id}-{:x}", fastrand::u64(..));
        w.tokens.insert(token.clone());
        let location = format!("{SESSIONS}/{id}");
        let body = json!({"@odata.id": location, "Id": id.to_string(), "UserName": USERNAME});
        return (
            StatusCode::CREATED,
            [("X-Auth-Token", token.as_str()), ("Location", location.as_str()), ("Content-Type", "application/json")],
            body.to_string(),
        )
            .into_response();
    }

    let token = headers.get("X-Auth-Token").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let authorized = match (&token, basic_ok(&headers)) {
        (Some(token), _) => {
            w.token_requests += 1;
            w.tokens.contains(token)
        }
        (None, Some(ok)) => {
            w.basic_requests += 1;
            ok
        }
        (None, None) => false,
    };
    if !authorized {
        return redfish_error(StatusCode::UNAUTHORIZED, "authentication required");
    }

    if method == Method::DELETE && path.starts_with(&format!("{SESSIONS}/")) {
        if let Some(token) = token {
            w.tokens.remove(&token);
        }
        w.logouts += 1;
        return StatusCode::NO_CONTENT.into_response();
    }

    if method == Method::POST
        && let Some(id) = path.strip_suffix(RESET_SUFFIX).and_then(|p| p.strip_prefix(&format!("{SYSTEMS}/")))
        && w.other_systems.contains_key(id)
    {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(reset) = request["ResetType"].as_str().map(str::to_owned) else {
            return redfish_error(StatusCode::BAD_REQUEST, "ResetType missing");
        };
        let apply_at = Instant::now() + w.apply_delay;
        let system = w.other_systems.get_mut(id).expect("checked above");
        let target = if matches!(reset.as_str(), "GracefulShutdown" | "ForceOff") { "Off" } else { "On" };
        if system.power != target {
            system.pending = Some((target.to_owned(), apply_at));
        }
        return StatusCode::NO_CONTENT.into_response();
    }

    if method == Method::POST && path == RESET_TARGET {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let Some(reset) = request["ResetType"].as_str().map(str::to_owned) else {
            return redfish_error(StatusCode::BAD_REQUEST, "ResetType missing");
        };
        w.resets.push(reset.clone());
        if w.reject_resets.contains(&reset) {
            return redfish_error(StatusCode::BAD_REQUEST, &format!("{reset} is not possible now"));
        }
        if w.drop_resets > 0 {
            w.drop_resets -= 1;
            return StatusCode::NO_CONTENT.into_response();
        }
        let target = if matches!(reset.as_str(), "GracefulShutdown" | "ForceOff") { "Off" } else { "On" };
        if w.power != target {
            w.pending = Some((target.to_owned(), Instant::now() + w.apply_delay));
        }
        if w.task_polls.is_some() {
            w.task_polls_seen = 0;
            let monitor = format!("{TASK_MONITOR}1");
            return (StatusCode::ACCEPTED, [("Location", monitor.as_str())], "").into_response();
        }
        return StatusCode::NO_CONTENT.into_response();
    }

    if method != Method::GET {
        return redfish_error(StatusCode::METHOD_NOT_ALLOWED, "not supported by the mock");
    }

    if path.starts_with(TASK_MONITOR) {
        w.task_polls_seen += 1;
        let needed = w.task_polls.unwrap_or(0);
        if w.task_polls_seen < needed {
            let task = json!({"@odata.id": "/redfish/v1/TaskService/Tasks/545", "TaskState": "Running"});
            return (StatusCode::ACCEPTED, [("Location", path.as_str())], task.to_string()).into_response();
        }
        let state = if w.task_fails { "Exception" } else { "Completed" };
        let task = json!({"@odata.id": "/redfish/v1/TaskService/Tasks/545", "TaskState": state,
            "Messages": [{"Message": format!("reset task {state}")}]});
        return (StatusCode::OK, [("Content-Type", "application/json")], task.to_string()).into_response();
    }

    if path == ACTION_INFO {
        w.action_info_reads += 1;
        let Some(values) = w.action_info.clone() else {
            return redfish_error(StatusCode::NOT_FOUND, "no such resource");
        };
        let info = json!({
            "@odata.type": "#ActionInfo.v1_3_0.ActionInfo",
            "@odata.id": ACTION_INFO,
            "Id": "ResetActionInfo",
            "Name": "Reset Action Info",
            "Parameters": [{"Name": "ResetType", "Required": true, "DataType": "String", "AllowableValues": values}]
        });
        return json_response(&info, &headers, &mut w);
    }

    if let Some(value) = w.replace.get(&path).cloned() {
        return json_response(&value, &headers, &mut w);
    }
    if let Some(id) = path.strip_prefix(&format!("{SYSTEMS}/"))
        && let Some(power) = w.other_systems.get(id).map(|s| s.power.clone())
    {
        let Some(value) = read_mockup(&root, SYSTEM) else {
            return redfish_error(StatusCode::NOT_FOUND, "no such resource");
        };
        return json_response(&other_system_body(value, id, &power), &headers, &mut w);
    }
    let Some(mut value) = read_mockup(&root, &path) else {
        return redfish_error(StatusCode::NOT_FOUND, "no such resource");
    };
    if path == SYSTEMS && !w.other_systems.is_empty() {
        let members: Vec<Value> = std::iter::once(SYSTEM.to_owned())
            .chain(w.other_systems.keys().map(|id| format!("{SYSTEMS}/{id}")))
            .map(|path| json!({"@odata.id": path}))
            .collect();
        value["Members@odata.count"] = json!(members.len());
        value["Members"] = json!(members);
    }
    if path == SYSTEM {
        value["PowerState"] = json!(w.power);
        if w.action_info.is_some() {
            let reset = &mut value["Actions"]["#ComputerSystem.Reset"];
            if let Some(obj) = reset.as_object_mut() {
                obj.remove("ResetType@Redfish.AllowableValues");
                obj.insert("@Redfish.ActionInfo".into(), json!(ACTION_INFO));
            }
        }
    }
    if path == "/redfish/v1/Chassis/1U"
        && w.hide_environment_metrics
        && let Some(obj) = value.as_object_mut()
    {
        obj.remove("EnvironmentMetrics");
    }
    json_response(&value, &headers, &mut w)
}

fn json_response(value: &Value, headers: &HeaderMap, w: &mut World) -> Response {
    let text = value.to_string();
    let etag = etag_of(&text);
    let path_truncated = w.truncate.as_deref().is_some_and(|p| value["@odata.id"] == p);
    if headers.get("If-None-Match").and_then(|v| v.to_str().ok()) == Some(etag.as_str()) {
        w.not_modified += 1;
        return (StatusCode::NOT_MODIFIED, [("ETag", etag.as_str())]).into_response();
    }
    let text = if path_truncated { text[..text.len() / 2].to_owned() } else { text };
    (StatusCode::OK, [("Content-Type", "application/json"), ("ETag", etag.as_str())], text).into_response()
}
