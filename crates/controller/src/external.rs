//! External power providers: a command the controller runs, or an HTTPS
//! endpoint it calls, for each power action and read of a Server whose
//! `spec.provider.type` is `External`. An IPMI tool, a PDU script or an
//! OpenTofu workflow fulfils claims this way.
//!
//! The providers are named in one file (`controller --external-providers`),
//! never in a Server: whoever may write a Server may not choose what the
//! controller runs. A Server names its provider and gives it parameters.
//!
//! # The contract (docs/providers.md)
//! - One call per action: `power-on`, `power-off` or `status`. A command
//!   gets it as its last argument, a [`Request`] as JSON on stdin, and
//!   the server's name and parameters in its environment
//!   ([`parameter_variable`]); an endpoint gets the request as the JSON
//!   body of a POST.
//! - The answer is one JSON object ([`Answer`]): on stdout with exit 0, or
//!   a 2xx body; `{"error": {"reason": ..., "message": ...}}` with a
//!   non-zero exit, or a non-2xx body, says why it failed, in the
//!   ServerClaim's failure reasons.
//! - A call that outlives its `timeout` is killed (a command's whole
//!   process group) and fails as unreachable.
//!
//! # Guarantees
//! - Power actions on one server run one at a time, whatever asks; a read
//!   of a server whose action is in flight is answered from that action
//!   (powering on or off) without a call.
//! - At most `concurrency` actions and `readConcurrency` reads of one
//!   provider run at once.
//! - An action is idempotent: the state is read first, and an action is
//!   sent only when the server is not already in the state asked for. It
//!   returns once a read confirms the new state.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::serverclaim::FailureReason;
use kube::ResourceExt;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::provider::{Power, PowerError, PowerFuture, SystemIdentity};

/// The file of external providers, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct File {
    providers: Vec<ProviderSpec>,
}

/// One external provider, as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProviderSpec {
    name: String,
    /// The program and its first arguments; the action is appended.
    #[serde(default)]
    command: Option<Vec<String>>,
    /// An `https://` URL (or `http://` on loopback) that takes a POST.
    #[serde(default)]
    url: Option<String>,
    /// PEM certificates that sign the endpoint's certificate.
    #[serde(default)]
    ca_bundle_file: Option<PathBuf>,
    #[serde(default)]
    timeout: Option<String>,
    #[serde(default)]
    confirm_timeout: Option<String>,
    #[serde(default)]
    poll_interval: Option<String>,
    #[serde(default)]
    concurrency: Option<usize>,
    #[serde(default)]
    read_concurrency: Option<usize>,
}

/// Why the external providers file cannot be used: a fault of
/// configuration, named by file and field.
#[derive(Debug, thiserror::Error)]
#[error("{file}: {message}")]
pub struct ConfigError {
    pub file: String,
    pub message: String,
}

/// How a provider is reached.
enum Transport {
    Command { program: PathBuf, args: Vec<String> },
    Https { url: String, client: reqwest::Client },
}

/// One provider, ready to call.
struct Provider {
    name: String,
    transport: Transport,
    timeout: Duration,
    confirm_timeout: Duration,
    poll: Duration,
    actions: Semaphore,
    reads: Semaphore,
}

/// What a provider is asked, as JSON.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Request {
    pub api_version: String,
    pub kind: String,
    /// `power-on`, `power-off` or `status`.
    pub action: String,
    pub server: RequestServer,
}

/// The server a request is about.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RequestServer {
    pub name: String,
    /// `spec.provider.external.parameters`.
    pub parameters: BTreeMap<String, String>,
    /// `spec.labels`.
    pub labels: BTreeMap<String, String>,
}

/// What a provider answers, as JSON. Every field may be left out, but a
/// `status` answer without `powerState` is refused.
#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Answer {
    /// `On`, `Off`, `PoweringOn`, `PoweringOff` or `Unknown`.
    #[serde(default)]
    pub power_state: Option<String>,
    /// The machine's draw now, when the provider can read it.
    #[serde(default)]
    pub watts: Option<f64>,
    /// The machine's hardware identity, when the provider knows it.
    #[serde(default)]
    pub identity: Option<AnswerIdentity>,
    /// Set when the call failed.
    #[serde(default)]
    pub error: Option<AnswerError>,
}

#[derive(Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnswerIdentity {
    #[serde(default, rename = "systemUUID")]
    pub system_uuid: Option<String>,
    #[serde(default)]
    pub serial_number: Option<String>,
}

#[derive(Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct AnswerError {
    /// One of the power failure reasons of a ServerClaim.
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

/// The failure reasons a provider may give.
const REASONS: [FailureReason; 7] = [
    FailureReason::BmcUnreachable,
    FailureReason::BmcAuthenticationFailed,
    FailureReason::BmcCredentialsMissing,
    FailureReason::BmcConfigInvalid,
    FailureReason::PowerActionFailed,
    FailureReason::PowerOnTimedOut,
    FailureReason::ServerUnavailable,
];

/// The longest stretch of a provider's own words kept in a message.
const MESSAGE_LIMIT: usize = 512;
/// The most a provider may answer.
const ANSWER_LIMIT: usize = 1 << 20;
/// How long a status answer stands in for the watts and identity reads
/// that follow it in one sweep.
const READING_REUSE: Duration = Duration::from_secs(10);

/// A status answer and when it came.
struct Reading {
    at: Instant,
    watts: Option<f64>,
    identity: Option<SystemIdentity>,
}

/// Per server: the action in flight and the last status answer.
#[derive(Default)]
struct ServerSlot {
    action: Arc<tokio::sync::Mutex<()>>,
    in_flight: Option<Action>,
    reading: Option<Reading>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    PowerOn,
    PowerOff,
    Status,
}

impl Action {
    fn name(self) -> &'static str {
        match self {
            Action::PowerOn => "power-on",
            Action::PowerOff => "power-off",
            Action::Status => "status",
        }
    }
}

/// Clears a server's action in flight when dropped.
struct InFlight<'a> {
    power: &'a ExternalPower,
    server: &'a str,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.power.slot(self.server, |slot| slot.in_flight = None);
    }
}

/// Kills a command's whole process group when dropped armed: on a
/// timeout, and when the call is cancelled (a task aborted because the
/// lease was lost), so that nothing the command started acts on the
/// machine afterwards.
struct GroupKill {
    group: Option<rustix::process::Pid>,
    armed: bool,
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        if self.armed
            && let Some(group) = self.group
        {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
    }
}

/// Every external provider of the controller, by name.
pub struct ExternalPower {
    providers: BTreeMap<String, Provider>,
    servers: Mutex<HashMap<String, ServerSlot>>,
}

fn error(reason: FailureReason, label: &'static str, message: impl Into<String>) -> PowerError {
    PowerError { reason, label, message: message.into() }
}

/// `text` cut to [`MESSAGE_LIMIT`] bytes on a character boundary.
fn clip(text: &str) -> String {
    let text = text.trim();
    if text.len() <= MESSAGE_LIMIT {
        return text.to_string();
    }
    let mut end = MESSAGE_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

impl ExternalPower {
    /// No providers: every External server fails as misconfigured.
    pub fn none() -> Self {
        ExternalPower { providers: BTreeMap::new(), servers: Mutex::default() }
    }

    /// The providers of the YAML file at `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError { file: file.clone(), message: format!("cannot read: {err}") })?;
        ExternalPower::parse(&file, &text)
    }

    /// The providers of `text`, read from `file`.
    pub fn parse(file: &str, text: &str) -> Result<Self, ConfigError> {
        let fault = |message: String| ConfigError { file: file.to_string(), message };
        let value: serde_json::Value = serde_saphyr::from_str(text).map_err(|err| fault(format!("not YAML: {err}")))?;
        let spec: File = serde_path_to_error::deserialize(value).map_err(|err| {
            let path = err.path().to_string();
            fault(format!("{}: {}", if path == "." { "the document".into() } else { path }, err.into_inner()))
        })?;
        let mut providers = BTreeMap::new();
        for (i, p) in spec.providers.into_iter().enumerate() {
            let at = |field: &str| format!("providers[{i}].{field}");
            let valid_name = !p.name.is_empty()
                && p.name.len() <= 63
                && p.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !p.name.starts_with('-')
                && !p.name.ends_with('-');
            if !valid_name {
                return Err(fault(format!("{}: {:?} is not a name: lower-case letters, digits and '-', at most 63", at("name"), p.name)));
            }
            let duration = |field: &str, text: &Option<String>, default: Duration| -> Result<Duration, ConfigError> {
                match text {
                    None => Ok(default),
                    Some(t) => match ironclaim_core::duration::parse_duration(t) {
                        Ok(d) if !d.is_zero() => Ok(d),
                        Ok(_) => Err(fault(format!("{}: must be more than zero", at(field)))),
                        Err(why) => Err(fault(format!("{}: {why}; e.g. 90s, 5m", at(field)))),
                    },
                }
            };
            let bound = |field: &str, n: Option<usize>, default: usize| -> Result<usize, ConfigError> {
                match n {
                    None => Ok(default),
                    Some(n) if (1..=1024).contains(&n) => Ok(n),
                    Some(n) => Err(fault(format!("{}: {n} is not between 1 and 1024", at(field)))),
                }
            };
            let transport = match (p.command, p.url) {
                (Some(command), None) => {
                    let Some((program, args)) = command.split_first() else {
                        return Err(fault(format!("{}: is empty; give the program and its first arguments", at("command"))));
                    };
                    let program = PathBuf::from(program);
                    if !program.is_absolute() {
                        return Err(fault(format!("{}: {:?} is not an absolute path", at("command[0]"), program.display())));
                    }
                    if p.ca_bundle_file.is_some() {
                        return Err(fault(format!("{}: only with url", at("caBundleFile"))));
                    }
                    Transport::Command { program, args: args.to_vec() }
                }
                (None, Some(url)) => Transport::Https {
                    client: https_client(&url, p.ca_bundle_file.as_deref()).map_err(|why| fault(format!("{}: {why}", at("url"))))?,
                    url,
                },
                _ => return Err(fault(format!("providers[{i}] ({}): give exactly one of command and url", p.name))),
            };
            let provider = Provider {
                name: p.name.clone(),
                transport,
                timeout: duration("timeout", &p.timeout, Duration::from_secs(60))?,
                confirm_timeout: duration("confirmTimeout", &p.confirm_timeout, Duration::from_secs(300))?,
                poll: duration("pollInterval", &p.poll_interval, Duration::from_secs(5))?,
                actions: Semaphore::new(bound("concurrency", p.concurrency, 4)?),
                reads: Semaphore::new(bound("readConcurrency", p.read_concurrency, 16)?),
            };
            if providers.insert(p.name.clone(), provider).is_some() {
                return Err(fault(format!("{}: {:?} is named twice", at("name"), p.name)));
            }
        }
        Ok(ExternalPower { providers, servers: Mutex::default() })
    }

    /// The names of the providers, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.providers.keys().map(String::as_str)
    }

    fn provider(&self, server: &Server) -> Result<&Provider, PowerError> {
        let name = server.name_any();
        let Some(external) = server.spec.external_provider() else {
            return Err(error(
                FailureReason::BmcConfigInvalid,
                "no_external_provider",
                format!("server {name} has no spec.provider.external (type External needs one)"),
            ));
        };
        self.providers.get(&external.name).ok_or_else(|| {
            let known: Vec<&str> = self.names().collect();
            error(
                FailureReason::BmcConfigInvalid,
                "unknown_external_provider",
                format!(
                    "server {name} names the external provider {:?}, which the controller's --external-providers file does not have (it has: {})",
                    external.name,
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            )
        })
    }

    fn slot<T>(&self, server: &str, f: impl FnOnce(&mut ServerSlot) -> T) -> T {
        let mut servers = self.servers.lock().unwrap_or_else(PoisonError::into_inner);
        f(servers.entry(server.to_string()).or_default())
    }

    fn request(server: &Server, action: Action) -> Request {
        Request {
            api_version: "ironclaim.dev/v1alpha1".into(),
            kind: "PowerRequest".into(),
            action: action.name().into(),
            server: RequestServer {
                name: server.name_any(),
                parameters: server.spec.external_provider().map(|e| e.parameters.clone()).unwrap_or_default(),
                labels: server.spec.labels.clone(),
            },
        }
    }

    /// One call of `provider`, within its bound and timeout.
    async fn call(&self, provider: &Provider, server: &Server, action: Action) -> Result<Answer, PowerError> {
        let bound = if action == Action::Status { &provider.reads } else { &provider.actions };
        let _permit = bound.acquire().await.map_err(|_| error(FailureReason::PowerActionFailed, "closed", "the provider is shut down"))?;
        let request = ExternalPower::request(server, action);
        let what = format!("external provider {} ({} of server {})", provider.name, action.name(), request.server.name);
        let answer = match &provider.transport {
            Transport::Command { program, args } => run_command(program, args, action, &request, provider.timeout, &what).await?,
            Transport::Https { url, client } => post(client, url, &request, provider.timeout, &what).await?,
        };
        if let Some(failed) = answer.error {
            let reason = REASONS.iter().copied().find(|r| format!("{r:?}") == failed.reason).unwrap_or(FailureReason::PowerActionFailed);
            return Err(error(reason, "provider_error", format!("{what} failed ({}): {}", failed.reason, clip(&failed.message))));
        }
        if action == Action::Status && answer.power_state.is_none() {
            return Err(error(FailureReason::PowerActionFailed, "bad_answer", format!("{what} answered without powerState")));
        }
        if let Some(state) = &answer.power_state
            && parse_state(state).is_none()
        {
            return Err(error(
                FailureReason::PowerActionFailed,
                "bad_answer",
                format!(
                    "{what} answered a powerState of {} characters that is none of On, Off, PoweringOn, PoweringOff, Unknown",
                    state.chars().count()
                ),
            ));
        }
        if let Some(w) = answer.watts
            && !(w.is_finite() && w >= 0.0)
        {
            return Err(error(FailureReason::PowerActionFailed, "bad_answer", format!("{what} answered watts {w}: expected a number of at least 0")));
        }
        Ok(answer)
    }

    /// A status call, remembered for the watts and identity reads.
    async fn status(&self, provider: &Provider, server: &Server) -> Result<PowerState, PowerError> {
        let answer = self.call(provider, server, Action::Status).await?;
        let state = answer.power_state.as_deref().and_then(parse_state).unwrap_or(PowerState::Unknown);
        let identity = answer.identity.map(|i| SystemIdentity { uuid: i.system_uuid, serial_number: i.serial_number });
        let watts = if state == PowerState::On { answer.watts } else { None };
        self.slot(&server.name_any(), |slot| slot.reading = Some(Reading { at: Instant::now(), watts, identity }));
        Ok(state)
    }

    async fn set_power(&self, server: &Server, on: bool) -> Result<(), PowerError> {
        let provider = self.provider(server)?;
        let name = server.name_any();
        let (action, want) = if on { (Action::PowerOn, PowerState::On) } else { (Action::PowerOff, PowerState::Off) };
        let lock = self.slot(&name, |slot| slot.action.clone());
        let _one_at_a_time = lock.lock().await;
        if self.status(provider, server).await? == want {
            return Ok(());
        }
        self.slot(&name, |slot| slot.in_flight = Some(action));
        // Cleared however the action ends, a cancelled one included, so
        // that reads go back to asking the provider.
        let _clear = InFlight { power: self, server: &name };
        self.act_and_confirm(provider, server, action, want).await
    }

    async fn act_and_confirm(&self, provider: &Provider, server: &Server, action: Action, want: PowerState) -> Result<(), PowerError> {
        let answer = self.call(provider, server, action).await?;
        if answer.power_state.as_deref().and_then(parse_state) == Some(want) {
            return Ok(());
        }
        let deadline = Instant::now() + provider.confirm_timeout;
        loop {
            tokio::time::sleep(provider.poll).await;
            let state = self.status(provider, server).await?;
            if state == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(error(
                    if want == PowerState::On { FailureReason::PowerOnTimedOut } else { FailureReason::PowerActionFailed },
                    "timed_out_waiting_for_state",
                    format!(
                        "external provider {} did not report server {} {want:?} within {:?} of {} (last: {state:?})",
                        provider.name,
                        server.name_any(),
                        provider.confirm_timeout,
                        action.name()
                    ),
                ));
            }
        }
    }

    /// The last status answer of `server`, when it is recent.
    fn recent(&self, server: &str) -> Option<(Option<f64>, Option<SystemIdentity>)> {
        self.slot(server, |slot| slot.reading.as_ref().filter(|r| r.at.elapsed() < READING_REUSE).map(|r| (r.watts, r.identity.clone())))
    }
}

fn parse_state(text: &str) -> Option<PowerState> {
    Some(match text {
        "On" => PowerState::On,
        "Off" => PowerState::Off,
        "PoweringOn" => PowerState::PoweringOn,
        "PoweringOff" => PowerState::PoweringOff,
        "Unknown" => PowerState::Unknown,
        _ => return None,
    })
}

/// An answer's bytes as an [`Answer`], or why they are not one. The
/// provider's words are not repeated: they may hold anything.
fn parse_answer(bytes: &[u8], what: &str) -> Result<Answer, PowerError> {
    if bytes.len() > ANSWER_LIMIT {
        return Err(error(
            FailureReason::PowerActionFailed,
            "bad_answer",
            format!("{what} answered {} bytes, more than the 1 MiB allowed", bytes.len()),
        ));
    }
    serde_json::from_slice(bytes).map_err(|err| {
        // serde's own message may quote the answer's values or field
        // names: only its kind and place are said.
        let kind = match err.classify() {
            serde_json::error::Category::Io | serde_json::error::Category::Eof => "it ends too soon",
            serde_json::error::Category::Syntax => "it is not JSON",
            serde_json::error::Category::Data => "a field is unknown or of the wrong type",
        };
        error(
            FailureReason::PowerActionFailed,
            "bad_answer",
            format!(
                "{what} answered {} bytes that are not an answer ({kind}, line {} column {}): expected one JSON object, see docs/providers.md",
                bytes.len(),
                err.line(),
                err.column()
            ),
        )
    })
}

async fn run_command(
    program: &Path,
    args: &[String],
    action: Action,
    request: &Request,
    timeout: Duration,
    what: &str,
) -> Result<Answer, PowerError> {
    let mut variables: BTreeMap<String, &str> = BTreeMap::new();
    for key in request.server.parameters.keys() {
        if key.is_empty() {
            return Err(error(FailureReason::BmcConfigInvalid, "invalid_parameters", format!("{what}: a parameter has an empty name")));
        }
        let variable = parameter_variable(key);
        if let Some(other) = variables.insert(variable.clone(), key) {
            return Err(error(
                FailureReason::BmcConfigInvalid,
                "invalid_parameters",
                format!("{what}: parameters {other:?} and {key:?} are both {variable} in the environment: rename one"),
            ));
        }
    }
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .arg(action.name())
        .env("IRONCLAIM_ACTION", action.name())
        .env("IRONCLAIM_SERVER", &request.server.name)
        .envs(request.server.parameters.iter().map(|(k, v)| (parameter_variable(k), v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .map_err(|err| error(FailureReason::BmcConfigInvalid, "cannot_run", format!("{what}: cannot run {}: {err}", program.display())))?;
    let group = child.id().and_then(|pid| rustix::process::Pid::from_raw(pid as i32));
    let body = serde_json::to_vec(request).unwrap_or_default();
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let run = async move {
        let write = async {
            if let Some(mut stdin) = stdin {
                // A command that does not read its input may close it: not
                // a failure of the call.
                let _ = stdin.write_all(&body).await;
            }
        };
        // At most one byte past the limit is read: an answer that long is
        // refused, and the command, writing on, meets a closed pipe.
        let read = |pipe: Option<tokio::process::ChildStdout>| async move {
            let mut bytes = Vec::new();
            if let Some(pipe) = pipe {
                let _ = pipe.take(ANSWER_LIMIT as u64 + 1).read_to_end(&mut bytes).await;
            }
            bytes
        };
        let read_err = async move {
            let mut bytes = Vec::new();
            if let Some(pipe) = stderr {
                let _ = pipe.take(ANSWER_LIMIT as u64 + 1).read_to_end(&mut bytes).await;
            }
            bytes
        };
        let ((), out, err) = tokio::join!(write, read(stdout), read_err);
        child.wait().await.map(|status| (status, out, err))
    };
    let run = tokio::time::timeout(timeout, run);
    // Declared after the run, so dropped before it: the group is killed
    // while its leader is still there to hold the group's id.
    let mut kill = GroupKill { group, armed: true };
    let (status, stdout, stderr) = match run.await {
        Ok(Ok(output)) => {
            kill.armed = false;
            output
        }
        Ok(Err(err)) => return Err(error(FailureReason::PowerActionFailed, "cannot_run", format!("{what}: {err}"))),
        Err(_) => {
            // Dropping `kill` kills the group, the leader with it.
            return Err(error(FailureReason::BmcUnreachable, "timed_out", format!("{what} did not answer within {timeout:?}; it was killed")));
        }
    };
    let stderr = String::from_utf8_lossy(&stderr);
    if !stderr.trim().is_empty() {
        tracing::info!(provider = what, stderr = %clip(&stderr), "the external provider wrote to stderr");
    }
    if status.success() {
        return parse_answer(&stdout, what);
    }
    let code = status.code().map_or_else(|| "a signal".to_string(), |c| format!("exit code {c}"));
    match parse_answer(&stdout, what) {
        Ok(Answer { error: Some(e), .. }) => Ok(Answer { error: Some(e), ..Answer::default() }),
        _ => Err(error(FailureReason::PowerActionFailed, "failed", format!("{what} failed with {code} and no error answer"))),
    }
}

/// The environment variable that carries a parameter to a command:
/// `IRONCLAIM_PARAMETER_` and the key in capitals, every character but a
/// letter or digit as `_` (`bmc.address` is `IRONCLAIM_PARAMETER_BMC_ADDRESS`).
pub fn parameter_variable(key: &str) -> String {
    let key: String = key.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    format!("IRONCLAIM_PARAMETER_{key}")
}

fn https_client(url: &str, ca_bundle_file: Option<&Path>) -> Result<reqwest::Client, String> {
    let parsed = url::Url::parse(url).map_err(|err| format!("{url:?} is not a URL: {err}"))?;
    let loopback = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match parsed.scheme() {
        "https" => {}
        "http" if loopback => {}
        "http" => return Err(format!("{url:?} is plain http: use https (http only on loopback)")),
        other => return Err(format!("{url:?} has scheme {other:?}: use https")),
    }
    let tls = ironclaim_redfish::TlsSettings { ca_file: ca_bundle_file.map(Path::to_path_buf), insecure_skip_verify: false }
        .client_config()
        .map_err(|err| err.to_string())?;
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("ironclaim/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|err| format!("cannot build an HTTPS client: {err}"))
}

/// `url` without its query and fragment, for messages: a token there is
/// not repeated.
fn shown_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) => {
            u.set_query(None);
            u.set_fragment(None);
            let _ = u.set_password(None);
            let _ = u.set_username("");
            u.to_string()
        }
        Err(_) => "the endpoint".into(),
    }
}

async fn post(client: &reqwest::Client, url: &str, request: &Request, timeout: Duration, what: &str) -> Result<Answer, PowerError> {
    let shown = shown_url(url);
    let body = serde_json::to_vec(request).unwrap_or_default();
    let sent =
        client.post(url).timeout(timeout).header(reqwest::header::CONTENT_TYPE, "application/json").body(body).send().await.map_err(|err| {
            let label = if err.is_timeout() { "timed_out" } else { "unreachable" };
            error(FailureReason::BmcUnreachable, label, format!("{what}: {url} did not answer: {}", clip(&err.to_string())))
        })?;
    let status = sent.status();
    let bytes =
        sent.bytes().await.map_err(|err| error(FailureReason::BmcUnreachable, "unreachable", format!("{what}: reading the answer: {err}")))?;
    if status.is_success() {
        return parse_answer(&bytes, what);
    }
    match parse_answer(&bytes, what) {
        Ok(Answer { error: Some(e), .. }) => Ok(Answer { error: Some(e), ..Answer::default() }),
        _ => {
            // Without an error answer: a missing endpoint is configuration,
            // refused credentials are the endpoint's, a 5xx passes.
            let reason = match status.as_u16() {
                404 | 405 => FailureReason::BmcConfigInvalid,
                401 | 403 => FailureReason::BmcAuthenticationFailed,
                _ if status.is_server_error() => FailureReason::BmcUnreachable,
                _ => FailureReason::PowerActionFailed,
            };
            Err(error(reason, "failed", format!("{what}: {shown} answered HTTP {status} and no error answer")))
        }
    }
}

impl Power for ExternalPower {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(self.set_power(server, true))
    }

    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(self.set_power(server, false))
    }

    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        Box::pin(async move {
            let provider = self.provider(server)?;
            match self.slot(&server.name_any(), |slot| slot.in_flight) {
                Some(Action::PowerOn) => Ok(PowerState::PoweringOn),
                Some(Action::PowerOff) => Ok(PowerState::PoweringOff),
                _ => self.status(provider, server).await,
            }
        })
    }

    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        Box::pin(async move {
            if let Some((watts, _)) = self.recent(&server.name_any()) {
                return Ok(watts);
            }
            let provider = self.provider(server)?;
            self.status(provider, server).await?;
            Ok(self.recent(&server.name_any()).and_then(|(w, _)| w))
        })
    }

    fn identity<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<SystemIdentity>> {
        Box::pin(async move {
            if let Some((_, identity)) = self.recent(&server.name_any()) {
                return Ok(identity);
            }
            let provider = self.provider(server)?;
            self.status(provider, server).await?;
            Ok(self.recent(&server.name_any()).and_then(|(_, i)| i))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of its own for each test.
    pub(super) fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ironclaim-external-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a scratch directory");
        dir
    }

    /// A provider file running `script` (by /bin/sh, so that the file is
    /// never executed while another test's fork may hold it open).
    fn power(dir: &Path, script: &str, extra: &str) -> ExternalPower {
        let path = dir.join("provider.sh");
        std::fs::write(&path, script).expect("the script");
        let file = format!("providers:\n- name: test\n  command: [/bin/sh, {}]\n  pollInterval: 50ms\n  confirmTimeout: 2s\n{extra}", path.display());
        ExternalPower::parse("providers.yaml", &file).unwrap_or_else(|e| panic!("{e}"))
    }

    fn server(name: &str) -> Server {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name},
            "spec": {
                "provider": {"type": "External", "external": {"name": "test", "parameters": {"address": "10.0.0.7"}}},
                "hardware": {"cpu": "8", "memory": "16Gi"},
                "labels": {"rack": "r1"}
            }
        }))
        .expect("a Server")
    }

    /// A machine kept in files: `state-NAME` holds On or Off; each call is
    /// logged as `start|end NAME ACTION NANOS`; power-on takes `$DELAY`.
    const MACHINE: &str = r#"
dir="$(dirname "$0")"
name="$IRONCLAIM_SERVER"
echo "start $name $1 $(date +%s%N)" >> "$dir/log"
cat > "$dir/request-$name-$1.json"
[ "$IRONCLAIM_PARAMETER_ADDRESS" = 10.0.0.7 ] || exit 9
case "$1" in
  status) printf '{"powerState": "%s", "watts": 231.5, "identity": {"systemUUID": "uuid-%s"}}' "$(cat "$dir/state-$name" 2>/dev/null || echo Off)" "$name" ;;
  power-on) sleep "${DELAY:-0}"; echo On > "$dir/state-$name"; printf '{}' ;;
  power-off) echo Off > "$dir/state-$name"; printf '{"powerState": "Off"}' ;;
esac
echo "end $name $1 $(date +%s%N)" >> "$dir/log"
"#;

    fn log(dir: &Path) -> Vec<(String, String, String, u128)> {
        std::fs::read_to_string(dir.join("log"))
            .unwrap_or_default()
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                (f[0].to_string(), f[1].to_string(), f[2].to_string(), f[3].parse().expect("nanos"))
            })
            .collect()
    }

    /// The most calls of `action` the log shows running at once.
    fn most_at_once(dir: &Path, action: &str) -> usize {
        let (mut now, mut most) = (0usize, 0usize);
        let mut events: Vec<_> = log(dir).into_iter().filter(|e| e.2 == action).map(|e| (e.3, e.0 == "start")).collect();
        events.sort();
        for (_, start) in events {
            if start {
                now += 1;
                most = most.max(now);
            } else {
                now -= 1;
            }
        }
        most
    }

    #[tokio::test]
    async fn a_command_powers_a_server_on_and_off_and_reads_its_state_watts_and_identity() {
        let dir = scratch("machine");
        let power = power(&dir, MACHINE, "");
        let s = server("ext-1");
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off);
        power.power_on(&s).await.unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("state-ext-1")).unwrap().trim(), "On");
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::On);
        assert_eq!(power.watts(&s).await.unwrap(), Some(231.5));
        assert_eq!(power.identity(&s).await.unwrap().and_then(|i| i.uuid), Some("uuid-ext-1".into()));

        // The request on stdin names the server, its parameters and labels.
        let request: Request = serde_json::from_slice(&std::fs::read(dir.join("request-ext-1-power-on.json")).unwrap()).unwrap();
        assert_eq!(request.action, "power-on");
        assert_eq!(request.server.parameters.get("address").map(String::as_str), Some("10.0.0.7"));
        assert_eq!(request.server.labels.get("rack").map(String::as_str), Some("r1"));

        // Asking for the state it is in sends nothing.
        let ons = |dir: &Path| log(dir).iter().filter(|e| e.0 == "start" && e.2 == "power-on").count();
        power.power_on(&s).await.unwrap();
        assert_eq!(ons(&dir), 1);
        power.power_off(&s).await.unwrap();
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off);
        assert_eq!(power.watts(&s).await.unwrap(), None, "an Off server draws nothing the provider reads");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_typed_error_answer_is_the_claims_failure_reason_and_a_bare_exit_code_is_a_failed_action() {
        let dir = scratch("typed");
        let script = r#"
if [ "$1" = status ]; then printf '{"powerState": "Off"}'; exit 0; fi
if [ "$IRONCLAIM_SERVER" = locked-out ]; then
  printf '{"error": {"reason": "BmcAuthenticationFailed", "message": "ipmitool: unable to establish IPMI v2 session"}}'; exit 1
fi
echo "something went wrong" >&2; exit 7
"#;
        let power = power(&dir, script, "");
        let err = power.power_on(&server("locked-out")).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::BmcAuthenticationFailed);
        assert!(err.message.contains("unable to establish IPMI v2 session") && err.message.contains("external provider test"), "{}", err.message);
        let err = power.power_on(&server("other")).await.unwrap_err();
        assert_eq!((err.reason, err.label), (FailureReason::PowerActionFailed, "failed"));
        assert!(err.message.contains("exit code 7"), "{}", err.message);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn garbage_on_stdout_is_refused_without_repeating_it() {
        let dir = scratch("garbage");
        let power = power(&dir, "echo 'password=hunter2 and other words'\n", "");
        let err = power.power_state(&server("g")).await.unwrap_err();
        assert_eq!((err.reason, err.label), (FailureReason::PowerActionFailed, "bad_answer"));
        assert!(!err.message.contains("hunter2"), "the provider's words may hold a secret: {}", err.message);
        let power = super::ExternalPower::parse(
            "p.yaml",
            &format!("providers:\n- name: test\n  command: [/bin/sh, {}]\n", write(&dir, "s.sh", "printf '{\"powerState\": \"Sideways\"}'")),
        )
        .unwrap();
        let err = power.power_state(&server("g")).await.unwrap_err();
        assert!(!err.message.contains("Sideways") && err.message.contains("none of On, Off"), "{}", err.message);
        // JSON whose values or field names hold a secret: serde would quote
        // them; the message does not.
        for (i, answer) in
            [r#"{"watts": "password=hunter2"}"#, r#""hunter2""#, r#"{"hunter2": 1}"#, r#"{"powerState": "hunter2"}"#].iter().enumerate()
        {
            let script = write(&dir, &format!("secret-{i}.sh"), &format!("printf '%s' '{answer}'\n"));
            let power = super::ExternalPower::parse("p.yaml", &format!("providers:\n- name: test\n  command: [/bin/sh, {script}]\n")).unwrap();
            let err = power.power_state(&server("g")).await.unwrap_err();
            assert!(!err.message.contains("hunter2"), "{answer}: {}", err.message);
            assert_eq!(err.label, "bad_answer");
        }
        let power = super::ExternalPower::parse(
            "p.yaml",
            &format!("providers:\n- name: test\n  command: [/bin/sh, {}]\n", write(&dir, "t.sh", "printf '{\"watts\": 12}'")),
        )
        .unwrap();
        let err = power.power_state(&server("g")).await.unwrap_err();
        assert!(err.message.contains("without powerState"), "{}", err.message);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn write(dir: &Path, name: &str, text: &str) -> String {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        path.display().to_string()
    }

    /// A hung command is killed with everything it started: a workflow
    /// left running could power the machine after its call failed.
    #[tokio::test]
    async fn a_command_that_hangs_is_killed_with_its_children_at_the_timeout() {
        let dir = scratch("hang");
        let script = format!("sleep 30 &\necho $! > {}/child\nwait\n", dir.display());
        let power = power(&dir, &script, "  timeout: 300ms\n");
        let started = Instant::now();
        let err = power.power_state(&server("h")).await.unwrap_err();
        assert_eq!((err.reason, err.label), (FailureReason::BmcUnreachable, "timed_out"));
        assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
        assert_killed(&dir, "the hung command's").await;
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Asserts that the process whose pid the script wrote to `child` in
    /// `dir` is killed within 2 s: gone, or a zombie waiting for a reaper.
    async fn assert_killed(dir: &Path, whose: &str) {
        let child = std::fs::read_to_string(dir.join("child")).expect("the child's pid").trim().to_string();
        let alive = || {
            std::fs::read_to_string(format!("/proc/{child}/stat"))
                .ok()
                .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
                .unwrap_or(false)
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while alive() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!alive(), "{whose} child {child} still runs");
    }

    /// A call cancelled (its task aborted when the lease is lost) kills
    /// what the command started, and leaves no action in flight behind.
    #[tokio::test]
    async fn a_cancelled_call_kills_its_process_group_and_clears_the_action_in_flight() {
        let dir = scratch("cancel");
        let script = format!(
            "if [ \"$1\" = status ]; then printf '{{\"powerState\": \"Off\"}}'; exit 0; fi\nsleep 30 &\necho $! > {}/child\nwait\n",
            dir.display()
        );
        let power = Arc::new(power(&dir, &script, "  timeout: 60s\n"));
        let s = server("c");
        let call = {
            let (power, s) = (power.clone(), s.clone());
            tokio::spawn(async move { power.power_on(&s).await })
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !dir.join("child").exists() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::PoweringOn);
        call.abort();
        let _ = call.await;
        assert_killed(&dir, "the cancelled command's").await;
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off, "read from the provider again, not from a dead action");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn actions_are_bounded_per_provider_and_one_at_a_time_per_server() {
        let dir = scratch("bounded");
        let script = format!("DELAY=0.3\n{MACHINE}");
        let power = Arc::new(power(&dir, &script, "  concurrency: 2\n"));
        let servers: Vec<Server> = (0..6).map(|i| server(&format!("b-{i}"))).collect();
        let started = Instant::now();
        let results = futures::future::join_all(servers.iter().map(|s| power.power_on(s))).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        assert_eq!(most_at_once(&dir, "power-on"), 2, "{:?}", log(&dir));
        assert!(started.elapsed() >= Duration::from_millis(900), "6 actions of 0.3 s, 2 at a time: {:?}", started.elapsed());

        // Two asks for one server: the second waits for the first, finds the
        // server on and sends nothing.
        let one = server("same");
        let (a, b) = tokio::join!(power.power_on(&one), power.power_on(&one));
        assert!(a.is_ok() && b.is_ok());
        let ons = log(&dir).iter().filter(|e| e.0 == "start" && e.1 == "same" && e.2 == "power-on").count();
        assert_eq!(ons, 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// While an action is in flight, a read answers from it without a call.
    #[tokio::test]
    async fn a_read_during_an_action_says_powering_on() {
        let dir = scratch("inflight");
        let power = Arc::new(power(&dir, &format!("DELAY=0.5\n{MACHINE}"), ""));
        let s = server("f");
        let on = {
            let (power, s) = (power.clone(), s.clone());
            tokio::spawn(async move { power.power_on(&s).await })
        };
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::PoweringOn);
        on.await.unwrap().unwrap();
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::On);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_power_on_the_provider_never_confirms_times_out() {
        let dir = scratch("unconfirmed");
        let power = power(&dir, "if [ \"$1\" = status ]; then printf '{\"powerState\": \"Off\"}'; else printf '{}'; fi\n", "");
        let err = power.power_on(&server("u")).await.unwrap_err();
        assert_eq!((err.reason, err.label), (FailureReason::PowerOnTimedOut, "timed_out_waiting_for_state"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_providers_file_that_cannot_be_used_names_the_field() {
        let fails = |text: &str| ExternalPower::parse("providers.yaml", text).err().map(|e| e.to_string()).unwrap_or_default();
        let cases = [
            ("providers:\n- name: a\n  command: [/bin/true]\n  colour: red\n", "providers[0].colour: unknown field `colour`"),
            ("providers:\n- name: a\n  command: [tool]\n", "providers[0].command[0]: \"tool\" is not an absolute path"),
            ("providers:\n- name: a\n", "providers[0] (a): give exactly one of command and url"),
            ("providers:\n- name: a\n  command: [/bin/true]\n  url: https://x\n", "give exactly one of command and url"),
            ("providers:\n- name: a\n  command: [/bin/true]\n- name: a\n  command: [/bin/true]\n", "providers[1].name: \"a\" is named twice"),
            ("providers:\n- name: a\n  command: [/bin/true]\n  timeout: soon\n", "providers[0].timeout:"),
            ("providers:\n- name: a\n  command: [/bin/true]\n  concurrency: 0\n", "providers[0].concurrency: 0 is not between 1 and 1024"),
            ("providers:\n- name: A_B\n  command: [/bin/true]\n", "providers[0].name: \"A_B\" is not a name"),
            ("providers:\n- name: a\n  url: http://10.0.0.9/power\n", "providers[0].url: \"http://10.0.0.9/power\" is plain http"),
            ("providers:\n- name: a\n  command: []\n", "providers[0].command: is empty"),
            ("providers: 7\n", "providers: invalid type"),
        ];
        for (text, want) in cases {
            let got = fails(text);
            assert!(got.starts_with("providers.yaml: ") && got.contains(want), "{text:?}: {got:?} does not say {want:?}");
        }
        let power = ExternalPower::parse(
            "p.yaml",
            "providers:\n- name: ipmi\n  command: [/opt/ipmi.sh, --lan]\n- name: tofu\n  url: http://127.0.0.1:9/power\n",
        )
        .unwrap();
        assert_eq!(power.names().collect::<Vec<_>>(), ["ipmi", "tofu"]);
    }

    #[tokio::test]
    async fn a_server_naming_a_provider_the_file_lacks_is_a_fault_of_configuration() {
        let err = ExternalPower::none().power_on(&server("x")).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::BmcConfigInvalid);
        assert!(err.reason.is_configuration());
        assert!(err.message.contains("\"test\"") && err.message.contains("it has: none"), "{}", err.message);
    }

    /// The HTTPS transport, over plain HTTP on loopback: a POST per call,
    /// the same answers, a non-2xx error answer typed.
    #[tokio::test]
    async fn an_endpoint_answers_as_a_command_does() {
        use axum::routing::post;
        let state: Arc<Mutex<String>> = Arc::new(Mutex::new("Off".into()));
        let handler = {
            let state = state.clone();
            move |body: axum::Json<Request>| {
                let state = state.clone();
                async move {
                    let mut s = state.lock().unwrap();
                    match body.action.as_str() {
                        "status" => (axum::http::StatusCode::OK, format!("{{\"powerState\": \"{s}\"}}")),
                        "power-on" if body.server.name == "refused" => (
                            axum::http::StatusCode::CONFLICT,
                            "{\"error\": {\"reason\": \"ServerUnavailable\", \"message\": \"the workspace is locked\"}}".into(),
                        ),
                        "power-on" => {
                            *s = "On".into();
                            (axum::http::StatusCode::OK, "{}".into())
                        }
                        _ => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "oops".into()),
                    }
                }
            }
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let app = axum::Router::new().route("/power", post(handler));
        let serving = tokio::spawn(async move { axum::serve(listener, app).await });
        let power =
            ExternalPower::parse("p.yaml", &format!("providers:\n- name: test\n  url: http://{address}/power\n  pollInterval: 50ms\n")).unwrap();
        power.power_on(&server("w")).await.unwrap();
        assert_eq!(power.power_state(&server("w")).await.unwrap(), PowerState::On);
        *state.lock().unwrap() = "Off".into();
        let err = power.power_on(&server("refused")).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::ServerUnavailable);
        assert!(err.message.contains("the workspace is locked"), "{}", err.message);
        *state.lock().unwrap() = "On".into();
        let err = power.power_off(&server("w")).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::BmcUnreachable, "a 5xx without an answer passes: {}", err.message);
        serving.abort();
    }
}

/// The example providers of `examples/providers`, run against stand-ins
/// for the tools they drive (ipmitool and tofu are not on the test
/// machine): each stand-in keeps the machine's power in a file and checks
/// the arguments it is given.
#[cfg(test)]
mod examples {
    use super::*;

    fn example(name: &str) -> String {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/providers").join(name).display().to_string()
    }

    /// A stand-in for ipmitool: `-H ADDRESS -U USER -f FILE ... chassis
    /// power on|off|status`, `dcmi power reading`, `mc guid`; refuses any
    /// password but `secret` as a BMC does.
    const IPMITOOL: &str = r#"#!/bin/sh
while [ $# -gt 0 ]; do
  case "$1" in
    -H) host="$2"; shift 2 ;; -U) user="$2"; shift 2 ;; -f) pwfile="$2"; shift 2 ;;
    -I | -N | -R) shift 2 ;; *) break ;;
  esac
done
if [ "$(cat "$pwfile")" != secret ] || [ "$user" != admin ]; then
  echo "Error: Unable to establish IPMI v2 / RMCP+ session" >&2
  echo "RAKP 2 message indicates an error : unauthorized name" >&2; exit 1
fi
state="$FAKE/power-$host"
case "$*" in
  "chassis power status") if [ "$(cat "$state" 2>/dev/null)" = on ]; then echo "Chassis Power is on"; else echo "Chassis Power is off"; fi ;;
  "chassis power on") echo on > "$state"; echo "Chassis Power Control: Up/On" ;;
  "chassis power off") echo off > "$state"; echo "Chassis Power Control: Down/Off" ;;
  "dcmi power reading") printf '\n    Instantaneous power reading:                   187 Watts\n    Minimum during sampling period:                 90 Watts\n' ;;
  "mc guid") echo "System GUID  : 4c4c4544-0042-3510-8052-b2c04f4e3132" ; echo "Timestamp    : 01/01/1970" ;;
  *) echo "unknown command $*" >&2; exit 1 ;;
esac
"#;

    /// A stand-in for tofu: a workspace per server, `power` applied to a
    /// state file, `power_state` read back; every `-var` logged.
    const TOFU: &str = r#"#!/bin/sh
[ "${1#-chdir=}" != "$1" ] || { echo "no -chdir" >&2; exit 1; }
shift
case "$1 $2" in
  "workspace select") echo "$4" > "$FAKE/workspace"; exit 0 ;;
esac
ws="$(cat "$FAKE/workspace")"
case "$1" in
  apply)
    shift; power=""
    while [ $# -gt 0 ]; do
      case "$1" in -var) echo "$ws $2" >> "$FAKE/vars"; case "$2" in power=*) power="${2#power=}" ;; esac; shift 2 ;; *) shift ;; esac
    done
    [ -z "$power" ] || echo "$power" > "$FAKE/state-$ws" ;;
  output) if [ "$(cat "$FAKE/state-$ws" 2>/dev/null)" = on ]; then printf On; else printf Off; fi ;;
esac
"#;

    fn stand_in(dir: &Path, tool: &str, script: &str) {
        let bin = dir.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::write(bin.join(tool), script).unwrap();
        let mut perms = std::fs::metadata(bin.join(tool)).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
        std::fs::set_permissions(bin.join(tool), perms).unwrap();
    }

    fn server(name: &str, provider: &str, parameters: serde_json::Value) -> Server {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": name},
            "spec": {
                "provider": {"type": "External", "external": {"name": provider, "parameters": parameters}},
                "hardware": {"cpu": "8", "memory": "16Gi"}
            }
        }))
        .unwrap()
    }

    fn providers(dir: &Path, name: &str, script: &str, env: &[String]) -> ExternalPower {
        let mut command =
            vec!["/usr/bin/env".to_string(), format!("PATH={}:/usr/bin:/bin", dir.join("bin").display()), format!("FAKE={}", dir.display())];
        command.extend(env.iter().cloned());
        command.extend(["/bin/sh".to_string(), example(script)]);
        let file = serde_json::json!({"providers": [{"name": name, "command": command, "pollInterval": "50ms", "confirmTimeout": "3s"}]});
        ExternalPower::parse("providers.yaml", &file.to_string()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn the_ipmitool_example_powers_reads_watts_and_identity_and_types_a_refused_password() {
        let dir = super::tests::scratch("example-ipmi");
        stand_in(&dir, "ipmitool", IPMITOOL);
        std::fs::write(dir.join("password"), "secret").unwrap();
        std::fs::write(dir.join("wrong"), "guess").unwrap();
        let user = "IPMI_USERNAME=admin".to_string();
        let power = providers(&dir, "ipmi", "ipmitool.sh", &[user.clone(), format!("IPMI_PASSWORD_FILE={}", dir.join("password").display())]);
        let s = server("r1-u07", "ipmi", serde_json::json!({"address": "10.0.0.21"}));
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off);
        power.power_on(&s).await.unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("power-10.0.0.21")).unwrap().trim(), "on");
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::On);
        assert_eq!(power.watts(&s).await.unwrap(), Some(187.0));
        assert_eq!(power.identity(&s).await.unwrap().and_then(|i| i.uuid).as_deref(), Some("4c4c4544-0042-3510-8052-b2c04f4e3132"));
        power.power_off(&s).await.unwrap();
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off);

        let refused = providers(&dir, "ipmi", "ipmitool.sh", &[user.clone(), format!("IPMI_PASSWORD_FILE={}", dir.join("wrong").display())]);
        let err = refused.power_on(&s).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::BmcAuthenticationFailed, "{}", err.message);
        assert!(!err.message.contains("guess"), "{}", err.message);
        let no_address = server("r1-u08", "ipmi", serde_json::json!({}));
        assert_eq!(power.power_on(&no_address).await.unwrap_err().reason, FailureReason::BmcConfigInvalid);
        let no_password = providers(&dir, "ipmi", "ipmitool.sh", &[user]);
        assert_eq!(no_password.power_state(&s).await.unwrap_err().reason, FailureReason::BmcCredentialsMissing);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn the_opentofu_example_applies_power_in_the_servers_workspace_with_its_parameters() {
        let dir = super::tests::scratch("example-tofu");
        stand_in(&dir, "tofu", TOFU);
        let power = providers(&dir, "tofu", "opentofu.sh", &[format!("TOFU_MODULE_DIR={}", dir.display())]);
        let s = server("r2-u01", "tofu", serde_json::json!({"outlet": "pdu-3/12"}));
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off);
        power.power_on(&s).await.unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("state-r2-u01")).unwrap().trim(), "on");
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::On);
        let vars = std::fs::read_to_string(dir.join("vars")).unwrap();
        assert!(vars.contains("r2-u01 power=on") && vars.contains("r2-u01 outlet=pdu-3/12"), "{vars}");
        power.power_off(&s).await.unwrap();
        assert_eq!(power.power_state(&s).await.unwrap(), PowerState::Off);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
