//! `ironclaim bmc status|power-on|power-off|watts`: talk to servers' BMCs
//! over Redfish, one server named by flags or a whole inventory file.
//!
//! Credentials come from files only (never from a flag value). Exit codes:
//! 0 every server succeeded, 1 a BMC failed or refused, 2 bad input.
//! The inventory format is documented in docs/redfish.md.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use ironclaim_redfish::client::AuthMode;
use ironclaim_redfish::provider::ProviderOptions;
use ironclaim_redfish::{BmcAddress, Credentials, Error, PowerProvider, RedfishProvider, ServerSpec, SystemSelector, Timing, TlsSettings};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use crate::exit::Failure;
use crate::output::{self, OutputArg};
use crate::secrets;

#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Print each server's power state (and watts, where the BMC reports them).
    Status(Target),
    /// Power on and wait until the BMC reports On. A server already on is left alone.
    PowerOn(Target),
    /// Shut down gracefully, force off after the grace period, wait for Off.
    PowerOff(Target),
    /// Print each server's power draw and the fleet total.
    Watts(Target),
}

#[derive(clap::Args)]
struct Target {
    /// A YAML or JSON list of servers (see docs/redfish.md).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["endpoint", "system", "username", "password_file", "credentials_dir", "ca_file", "insecure_skip_verify"])]
    inventory: Option<PathBuf>,
    /// The BMC: https://host[:port], or a Metal3 address such as
    /// redfish+https://host/redfish/v1/Systems/ID.
    #[arg(long, value_name = "URL", required_unless_present = "inventory")]
    endpoint: Option<String>,
    /// The system's Id, UUID or /redfish/v1/Systems/... path (optional when
    /// the endpoint names it).
    #[arg(long, value_name = "ID")]
    system: Option<String>,
    #[command(flatten)]
    access: BmcAccess,
    /// The name to show for the server given by flags.
    #[arg(long, value_name = "NAME")]
    name: Option<String>,
    /// HTTP requests in flight across all BMCs.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    concurrency: u32,
    /// How long one HTTP request may take: a duration (15s, 1m) or a
    /// number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = crate::duration::go_or_seconds)]
    request_timeout: Duration,
    /// How long to wait for a power state to be confirmed: a duration
    /// (90s, 2m) or a number of seconds.
    #[arg(long, value_name = "DURATION", default_value = "90s", value_parser = crate::duration::go_or_seconds)]
    confirm_timeout: Duration,
    /// How long a graceful shutdown may take before ForceOff: a duration
    /// (3m) or a number of seconds; 0 forces off at once.
    #[arg(long, value_name = "DURATION", default_value = "3m", value_parser = crate::duration::go_or_seconds)]
    graceful_timeout: Duration,
    #[command(flatten)]
    output: OutputArg,
}

/// The BMC account and how its certificate is checked: the same flags for
/// `bmc` and `servers discover`.
#[derive(clap::Args)]
pub(crate) struct BmcAccess {
    /// The BMC account name.
    #[arg(long, value_name = "NAME", requires = "password_file")]
    pub username: Option<String>,
    /// A file holding only the password.
    #[arg(long, value_name = "FILE", requires = "username")]
    pub password_file: Option<PathBuf>,
    /// A directory with `username` and `password` files (a mounted Secret).
    #[arg(long, value_name = "DIR", conflicts_with_all = ["username", "password_file"])]
    pub credentials_dir: Option<PathBuf>,
    /// A PEM bundle of the CAs that signed the BMCs' certificates
    /// (`servers discover` also writes it into each Server as
    /// spec.bmc.caBundle).
    #[arg(long, value_name = "FILE", conflicts_with = "insecure_skip_verify")]
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate; for lab use only (`servers discover` writes
    /// it into each Server as spec.bmc.insecureSkipVerify).
    #[arg(long)]
    pub insecure_skip_verify: bool,
    /// How to authenticate: auto (a session when offered), session, basic.
    #[arg(long, value_enum, default_value_t = Auth::Auto)]
    pub auth: Auth,
}

impl BmcAccess {
    /// The credentials the flags give.
    pub fn credentials(&self) -> anyhow::Result<Credentials> {
        credentials_from_flags(self.credentials_dir.as_deref(), self.username.as_deref(), self.password_file.as_deref())
    }

    pub fn tls(&self) -> TlsSettings {
        TlsSettings { ca_file: self.ca_file.clone(), insecure_skip_verify: self.insecure_skip_verify }
    }
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum Auth {
    /// A session when the BMC offers one, else basic.
    Auto,
    /// Always a Redfish session.
    Session,
    /// HTTP basic authentication on every request.
    Basic,
}

impl Auth {
    pub(crate) fn mode(self) -> AuthMode {
        match self {
            Auth::Auto => AuthMode::Auto,
            Auth::Session => AuthMode::Session,
            Auth::Basic => AuthMode::Basic,
        }
    }
}

/// The words an inventory error may quote: the format's field names, and
/// `password`, the field people write by mistake.
const INVENTORY_WORDS: &[&str] =
    &["name", "address", "system", "credentials", "tls", "username", "password", "password_file", "directory", "ca_file", "insecure_skip_verify"];

/// One entry of an inventory file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryEntry {
    name: String,
    /// Any accepted address form; may name the system.
    address: String,
    /// Id, UUID or path, when the address does not name the system.
    #[serde(default)]
    system: Option<String>,
    credentials: InventoryCredentials,
    #[serde(default)]
    tls: TlsSettings,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InventoryCredentials {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password_file: Option<PathBuf>,
    /// A directory holding `username` and `password` files.
    #[serde(default)]
    directory: Option<PathBuf>,
}

#[derive(Serialize)]
struct Row {
    server: String,
    power_state: Option<String>,
    watts: Option<f64>,
    /// Reset types sent by power-on / power-off, in order.
    #[serde(skip_serializing_if = "Option::is_none")]
    sent: Option<Vec<String>>,
    latency_ms: u64,
    error: Option<RowError>,
}

#[derive(Serialize)]
pub(crate) struct RowError {
    /// The error's metric label: unreachable, auth_failed, ...
    pub(crate) kind: &'static str,
    pub(crate) message: String,
}

#[derive(Serialize)]
struct Report {
    action: &'static str,
    servers: Vec<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    total_watts: Option<f64>,
    failed: usize,
}

pub fn run(args: Args) -> Result<(), Failure> {
    let (name, target) = match args.action {
        Action::Status(t) => ("status", t),
        Action::PowerOn(t) => ("power-on", t),
        Action::PowerOff(t) => ("power-off", t),
        Action::Watts(t) => ("watts", t),
    };
    crate::logging::init(crate::logging::LogFormat::Text, "warn");
    ironclaim_redfish::install_crypto_provider();
    for (flag, value) in [("--request-timeout", target.request_timeout), ("--confirm-timeout", target.confirm_timeout)] {
        if value.is_zero() {
            return Err(Failure::bad_input(anyhow!("{flag} must be longer than 0s")));
        }
    }
    let specs = resolve_servers(&target)?;
    let options = ProviderOptions {
        max_concurrent_requests: target.concurrency as usize,
        timing: Timing {
            request_timeout: target.request_timeout,
            confirm_timeout: target.confirm_timeout,
            graceful_timeout: target.graceful_timeout,
            ..Timing::default()
        },
        auth: target.access.auth.mode(),
    };
    let provider = Arc::new(RedfishProvider::new(specs, options).map_err(bad_or_world)?);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the async runtime").map_err(Failure::World)?;
    let report = runtime.block_on(async {
        let report = act(name, provider.clone()).await;
        provider.shutdown().await;
        report
    });
    // A reader gone from stdout does not hide a failed server.
    match output::print(target.output.output, &report, table) {
        Ok(()) | Err(Failure::OutputClosed) => {}
        Err(other) => return Err(other),
    }
    match report.servers.iter().filter_map(|row| row.error.as_ref().map(|e| (row, e))).collect::<Vec<_>>().as_slice() {
        [] => Ok(()),
        [(row, err)] if report.servers.len() == 1 => Err(Failure::World(anyhow!("{} {}: {} ({})", name, row.server, err.message, err.kind))),
        failures => {
            let (row, err) = failures[0];
            Err(Failure::World(anyhow!(
                "{name} failed on {} of {} servers; first: {}: {} ({})",
                failures.len(),
                report.servers.len(),
                row.server,
                err.message,
                err.kind
            )))
        }
    }
}

pub(crate) fn bad_or_world(err: Error) -> Failure {
    if err.is_bad_input() { Failure::BadInput(err.into()) } else { Failure::World(err.into()) }
}

pub(crate) fn row_error(err: &Error) -> RowError {
    // The error's own message plus its sources, for one table cell.
    let mut message = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    RowError { kind: err.metric_label(), message }
}

async fn act(action: &'static str, provider: Arc<RedfishProvider>) -> Report {
    let servers = provider.list().await.unwrap_or_default();
    let mut tasks = JoinSet::new();
    for server in servers {
        let provider = provider.clone();
        tasks.spawn(async move {
            let started = tokio::time::Instant::now();
            let mut row = Row { server: server.clone(), power_state: None, watts: None, sent: None, latency_ms: 0, error: None };
            match action {
                "status" => match provider.power_state(&server).await {
                    Ok(state) => {
                        row.power_state = Some(state.to_string());
                        // Watts are a bonus here: many BMCs have none.
                        row.watts = provider.watts(&server).await.ok().map(|w| w.watts);
                    }
                    Err(err) => row.error = Some(row_error(&err)),
                },
                "watts" => match provider.watts(&server).await {
                    Ok(watts) => row.watts = Some(watts.watts),
                    Err(err) => row.error = Some(row_error(&err)),
                },
                _ => {
                    let outcome = if action == "power-on" { provider.power_on(&server).await } else { provider.power_off(&server).await };
                    match outcome {
                        Ok(outcome) => {
                            row.power_state = Some(outcome.state.to_string());
                            row.sent = Some(outcome.sent.iter().map(|r| r.to_string()).collect());
                        }
                        Err(err) => row.error = Some(row_error(&err)),
                    }
                }
            }
            row.latency_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
            row
        });
    }
    let mut rows = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        if let Ok(row) = joined {
            rows.push(row);
        }
    }
    rows.sort_by(|a, b| a.server.cmp(&b.server));
    let failed = rows.iter().filter(|r| r.error.is_some()).count();
    let total_watts = (action == "watts").then(|| rows.iter().filter_map(|r| r.watts).fold(0.0, |sum, w| sum + w));
    Report { action, servers: rows, total_watts, failed }
}

fn table(report: &Report) -> String {
    let actions = report.action == "power-on" || report.action == "power-off";
    let mut header = vec!["server", "power state", "watts", "latency", "error"];
    if actions {
        header.insert(2, "sent");
    }
    let mut table = crate::render::table(&header);
    for row in &report.servers {
        let mut cells = vec![
            row.server.clone(),
            row.power_state.clone().unwrap_or_else(|| "-".into()),
            row.watts.map_or_else(|| "n/a".into(), |w| format!("{w:.0} W")),
            format!("{} ms", row.latency_ms),
            row.error.as_ref().map_or_else(String::new, |e| format!("{}: {}", e.kind, e.message)),
        ];
        if actions {
            let sent = row.sent.as_ref().map_or_else(String::new, |s| if s.is_empty() { "none".into() } else { s.join(", ") });
            cells.insert(2, sent);
        }
        table.add_row(cells);
    }
    let mut text = format!("{table}\n");
    if let Some(line) = total_line(report) {
        text.push_str(&line);
        text.push('\n');
    }
    text
}

/// `total: 830 W from 3 of 4 servers`, for `watts`.
fn total_line(report: &Report) -> Option<String> {
    let total = report.total_watts?;
    let read = report.servers.iter().filter(|r| r.watts.is_some()).count();
    Some(format!("total: {total:.0} W from {read} of {}", crate::render::count(report.servers.len() as u64, "server", "servers")))
}

fn resolve_servers(target: &Target) -> Result<Vec<ServerSpec>, Failure> {
    match &target.inventory {
        Some(path) => load_inventory(path).map_err(Failure::BadInput),
        None => one_server(target).map(|spec| vec![spec]).map_err(Failure::BadInput),
    }
}

fn one_server(target: &Target) -> anyhow::Result<ServerSpec> {
    let endpoint = target.endpoint.as_deref().ok_or_else(|| anyhow!("--endpoint or --inventory is required"))?;
    let address = BmcAddress::parse(endpoint)?;
    let system = pick_system(&address, target.system.as_deref())?;
    let credentials = target.access.credentials()?;
    let name = target.name.clone().unwrap_or_else(|| match &system {
        SystemSelector::Id(id) | SystemSelector::Uuid(id) => id.clone(),
        SystemSelector::Path(path) => path.rsplit('/').next().unwrap_or(path).to_owned(),
    });
    Ok(ServerSpec { name, endpoint: address.endpoint, system, credentials, tls: target.access.tls() })
}

/// The BMC account of `--credentials-dir DIR`, or of `--username NAME
/// --password-file FILE`.
fn credentials_from_flags(dir: Option<&Path>, username: Option<&str>, password_file: Option<&Path>) -> anyhow::Result<Credentials> {
    match (dir, username, password_file) {
        (Some(dir), _, _) => Ok(Credentials::from_directory(dir)?),
        (None, Some(username), Some(file)) => Ok(Credentials::from_password_file(username, file)?),
        _ => Err(anyhow!("credentials are required: --username NAME --password-file FILE, or --credentials-dir DIR")),
    }
}

fn pick_system(address: &BmcAddress, flag: Option<&str>) -> anyhow::Result<SystemSelector> {
    match (flag, &address.system) {
        (Some(text), None) => Ok(SystemSelector::parse(text)?),
        (None, Some(system)) => Ok(system.clone()),
        (Some(_), Some(_)) => Err(anyhow!("the system is named twice: by the address path and by --system")),
        (None, None) => Err(anyhow!("no system named: add --system ID or use an address ending in /redfish/v1/Systems/ID")),
    }
}

/// Reads an inventory file. Relative paths inside it are taken from the
/// file's own directory.
fn load_inventory(path: &Path) -> anyhow::Result<Vec<ServerSpec>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read inventory {}", path.display()))?;
    // An inventory names password files, but a mistaken one may hold a
    // password: its errors never quote it (see crate::secrets).
    let parsed = if path.extension().is_some_and(|e| e == "json") {
        secrets::from_json::<Vec<InventoryEntry>>(&text, INVENTORY_WORDS)
    } else {
        secrets::from_yaml::<Vec<InventoryEntry>>(&text, INVENTORY_WORDS)
    };
    let entries = parsed.map_err(|err| {
        let hint = if err.message.starts_with("unknown field `password`") {
            ": an inventory holds no password, only the file it is in (`password_file`) or a directory (see docs/redfish.md)"
        } else {
            ""
        };
        anyhow!("invalid inventory {}{hint}", err.at_file(path))
    })?;
    if entries.is_empty() {
        return Err(anyhow!("inventory {} lists no server", path.display()));
    }
    let base = path.parent().unwrap_or(Path::new("."));
    let relative = |p: &Path| if p.is_absolute() { p.to_owned() } else { base.join(p) };
    entries
        .into_iter()
        .map(|entry| {
            let context = || format!("server {:?} in {}", entry.name, path.display());
            let address = BmcAddress::parse(&entry.address).with_context(context)?;
            let system = pick_system(&address, entry.system.as_deref()).with_context(context)?;
            let creds = &entry.credentials;
            let credentials = match (&creds.directory, &creds.username, &creds.password_file) {
                (Some(dir), None, None) => Credentials::from_directory(&relative(dir)),
                (None, Some(username), Some(file)) => Credentials::from_password_file(username.clone(), &relative(file)),
                _ => {
                    return Err(anyhow!("credentials need either `directory`, or `username` and `password_file`")).with_context(context);
                }
            }
            .with_context(context)?;
            let mut tls = entry.tls.clone();
            tls.ca_file = tls.ca_file.as_deref().map(relative);
            Ok(ServerSpec { name: entry.name, endpoint: address.endpoint, system, credentials, tls })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(server: &str, watts: Option<f64>) -> Row {
        Row { server: server.into(), power_state: None, watts, sent: None, latency_ms: 1, error: None }
    }

    #[test]
    fn the_watts_total_counts_its_servers_in_agreement() {
        let one = Report { action: "watts", servers: vec![row("a", Some(210.0))], total_watts: Some(210.0), failed: 0 };
        assert_eq!(total_line(&one).as_deref(), Some("total: 210 W from 1 of 1 server"));
        let two = Report { action: "watts", servers: vec![row("a", Some(210.0)), row("b", None)], total_watts: Some(210.0), failed: 0 };
        assert_eq!(total_line(&two).as_deref(), Some("total: 210 W from 1 of 2 servers"));
        let status = Report { action: "status", servers: vec![row("a", None)], total_watts: None, failed: 0 };
        assert_eq!(total_line(&status), None);
    }
}
