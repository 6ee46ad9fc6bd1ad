//! `ironclaim controller`: run the controller against a cluster, from a
//! kubeconfig or in-cluster. Stops gracefully on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::anyhow;
use ironclaim_controller::api::{ApiLayer, ApiRequests, RateLimit};
use ironclaim_controller::batch::Windows;
use ironclaim_controller::leader::LeaseSettings;
use ironclaim_controller::{ClusterApiPower, Controller, ExternalPower, Metal3Power, ProviderRouter, RedfishPower, Settings};

use crate::cluster::ClusterArgs;
use crate::exit::Failure;
use crate::logging::LogFormat;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// How log lines are written: text (coloured only on a terminal) or json.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    /// Decide once no new pending pod arrived for this long (e.g. 1s, 500ms).
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = crate::duration::go)]
    batch_idle: Duration,
    /// Decide at the latest this long after the first new pending pod.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = crate::duration::go)]
    batch_max: Duration,
    /// A stage is stuck after this percentage of the server's p90 duration.
    #[arg(long, value_name = "PERCENT", default_value_t = 200)]
    stuck_margin_percent: u32,
    /// Quarantine a server after this many failed claims in a row.
    #[arg(long, default_value_t = 3)]
    quarantine_after: u32,
    /// Decide again for pods still pending this often.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::duration::go)]
    redecide_every: Duration,
    /// Read every server's power state and watts this often.
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::duration::go)]
    power_sweep_every: Duration,
    /// Elect a leader through a Lease: only the holder acts.
    #[arg(long)]
    leader_elect: bool,
    /// The controller's namespace: the leader Lease and the claim lock
    /// ledger (the ConfigMaps ironclaim-claim-locks-00 to -31) live there.
    #[arg(long, visible_alias = "lease-namespace", env = "POD_NAMESPACE", default_value = "ironclaim-system")]
    controller_namespace: String,
    /// The leader Lease's name.
    #[arg(long, default_value = LEASE_NAME)]
    lease_name: String,
    /// How long a leader's Lease lasts without renewal.
    #[arg(long, value_name = "DURATION", default_value = "15s", value_parser = crate::duration::go)]
    lease_duration: Duration,
    /// This replica's name; the pod name in a Deployment.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Decide and tell, carry out nothing: every claim, power-on, power-off
    /// and drain it would make is an Event (reason DryRun), a log line and
    /// a count in ironclaim_dry_run_actions_total; no claim is written, no
    /// server powered, no node cordoned, drained or repaired.
    #[arg(long)]
    dry_run: bool,
    /// Peak watts the powered fleet may draw: a server whose power-on would
    /// cross it stays off (the pod's reason is `power budget reached`).
    /// Unset, the fleet is uncapped.
    #[arg(long, value_name = "WATTS", allow_negative_numbers = true, value_parser = crate::watts::budget)]
    power_budget_watts: Option<f64>,
    /// At most N power changes (power-ons and power-offs) per minute in each
    /// group: `fleet=N`, `pool=N`, or `LABEL=N` per value of a server label
    /// (`topology.kubernetes.io/rack=4`, a PDU label). Repeat for several.
    /// A pod waiting for one is told `transition rate reached`.
    #[arg(long, value_name = "SCOPE=N", value_parser = crate::simulate::transition_rate)]
    transition_rate: Vec<ironclaim_core::transitions::TransitionRate>,
    /// A server powered off this many times in the last 24 hours is kept on
    /// (neither powered off as a spare nor drained) until the oldest of
    /// those leaves the day. Unset: no cap.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_cycles_per_day: Option<u32>,
    /// A YAML file of external providers (a command or an HTTPS endpoint
    /// each), for the Servers whose `spec.provider.type` is External; see
    /// docs/providers.md. Unset: such Servers are held, misconfigured.
    #[arg(long, value_name = "FILE")]
    external_providers: Option<std::path::PathBuf>,
    /// Requests per second the controller may send to the API server, over
    /// all it does (watches count once, when opened); more wait their turn.
    #[arg(long, value_name = "QPS", default_value_t = RateLimit::DEFAULT.qps, value_parser = api_qps)]
    kube_api_qps: f64,
    /// Requests that may leave at once before --kube-api-qps holds them.
    #[arg(long, value_name = "N", default_value_t = RateLimit::DEFAULT.burst, value_parser = clap::value_parser!(u32).range(1..))]
    kube_api_burst: u32,
    /// Serve the dashboard, /ui (and its data, /ui/state), read-only on
    /// the metrics address (docs/dashboard.md).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    dashboard: bool,
}

/// The external providers of `--external-providers`, or none; a file that
/// cannot be used is bad input (exit 2), named by file and field.
pub fn external_providers(path: Option<&std::path::Path>) -> Result<ExternalPower, Failure> {
    match path {
        Some(path) => ExternalPower::load(path).map_err(|err| Failure::bad_input(anyhow!("--external-providers {err}"))),
        None => Ok(ExternalPower::none()),
    }
}

/// `--kube-api-qps`: a rate above zero.
fn api_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps > 0.0 => Ok(qps),
        _ => Err(format!("{text:?} is not a rate above zero (requests per second, e.g. 100 or 12.5)")),
    }
}

/// The leader Lease's name, unless `--lease-name` says otherwise.
pub const LEASE_NAME: &str = "ironclaim-controller";

pub fn run(args: Args) -> Result<(), Failure> {
    if args.batch_idle > args.batch_max {
        return Err(Failure::bad_input(anyhow!("--batch-idle must not exceed --batch-max")));
    }
    let external = external_providers(args.external_providers.as_deref())?;
    crate::logging::init(args.log_format, "info");
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    let ran = runtime.block_on(async move {
        let api_requests = ApiRequests::default();
        let limit = RateLimit { qps: args.kube_api_qps, burst: args.kube_api_burst };
        let layer = ApiLayer::new(api_requests.clone(), Some(limit));
        let connection = crate::cluster::connect_through(&args.cluster, Some(layer.clone())).await?;
        // Fail fast, with the fix, on what no retry mends.
        crate::cluster::preflight(&connection).await?;
        // Events leave through a client of their own, which yields to the
        // controller's within the same rate.
        let events_client = connection.client_through(&layer.background())?;
        let client = connection.client;
        let identity =
            args.identity.clone().or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_else(|| format!("ironclaim-{}", std::process::id()));
        let mut settings = Settings {
            windows: Windows { idle: args.batch_idle, max: args.batch_max },
            redecide_every: args.redecide_every,
            power_sweep_every: args.power_sweep_every,
            metrics_address: Some(args.metrics_address),
            instance: identity.clone(),
            dry_run: args.dry_run,
            power_budget_watts: args.power_budget_watts,
            dashboard: args.dashboard,
            api_requests,
            events_client: Some(ironclaim_controller::events::EventClient(events_client)),
            transition_limits: ironclaim_core::transitions::TransitionLimits {
                rates: args.transition_rate.clone(),
                max_cycles_per_day: args.max_cycles_per_day,
            },
            ..Settings::default()
        };
        settings.claims.deadlines.margin_percent = args.stuck_margin_percent;
        settings.claims.quarantine_after = args.quarantine_after;
        settings.claims.lock_namespace = args.controller_namespace.clone();
        if args.leader_elect {
            settings.lease = Some(LeaseSettings {
                namespace: args.controller_namespace.clone(),
                name: args.lease_name.clone(),
                identity,
                duration: args.lease_duration,
                power_budget_watts: args.power_budget_watts,
                transition_limits: settings.transition_limits.clone(),
            });
        }
        let power = Arc::new(ProviderRouter {
            redfish: Arc::new(RedfishPower::new(client.clone(), ironclaim_redfish::Timing::default())),
            metal3: Arc::new(Metal3Power::new(client.clone(), Duration::from_secs(300))),
            external: Arc::new(external),
            cluster_api: Arc::new(ClusterApiPower::new(client.clone(), Duration::from_secs(1800))),
        });
        let controller = Controller::new(client, power, settings);
        controller.run(shutdown_signal()).await.map_err(Failure::world)
    });
    // The run has stopped its power tasks and given up the lease; what is
    // left (a sweep's status writes, a scale-down pass) is retried by a
    // successor, so it is not waited for past a pod's grace period.
    runtime.shutdown_timeout(SHUTDOWN_WAIT);
    ran
}

/// How long a stopping controller waits for its last tasks: well inside
/// a pod's default termination grace period (30 s).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);

async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}
