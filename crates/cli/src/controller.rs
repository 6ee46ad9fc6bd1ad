//! `ironclaim controller`: run the controller against a cluster, from a
//! kubeconfig or in-cluster. Stops gracefully on SIGTERM or Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use ironclaim_controller::batch::Windows;
use ironclaim_controller::leader::LeaseSettings;
use ironclaim_controller::{Controller, Metal3Power, ProviderRouter, RedfishPower, Settings};
use kube::config::KubeconfigError;

use crate::exit::Failure;

#[derive(clap::Args)]
pub struct Args {
    /// A kubeconfig; without it, $KUBECONFIG, ~/.kube/config or the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(long, default_value = "0.0.0.0:8080")]
    metrics_address: SocketAddr,
    /// Decide once no new pending pod arrived for this long (e.g. 1s, 500ms).
    #[arg(long, default_value = "1s", value_parser = duration)]
    batch_idle: Duration,
    /// Decide at the latest this long after the first new pending pod.
    #[arg(long, default_value = "10s", value_parser = duration)]
    batch_max: Duration,
    /// A stage is stuck after this percentage of the server's p90 duration.
    #[arg(long, default_value_t = 200)]
    stuck_margin_percent: u32,
    /// Quarantine a server after this many failed claims in a row.
    #[arg(long, default_value_t = 3)]
    quarantine_after: u32,
    /// Decide again for pods still pending this often.
    #[arg(long, default_value = "30s", value_parser = duration)]
    redecide_every: Duration,
    /// Read every server's power state and watts this often.
    #[arg(long, default_value = "60s", value_parser = duration)]
    power_sweep_every: Duration,
    /// Elect a leader through a Lease: only the holder acts.
    #[arg(long)]
    leader_elect: bool,
    /// The controller's namespace: the leader Lease and the claim lock
    /// ledger (the ConfigMap ironclaim-claim-locks) live there.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ironclaim-system")]
    lease_namespace: String,
    #[arg(long, default_value = LEASE_NAME)]
    lease_name: String,
    #[arg(long, default_value = "15s", value_parser = duration)]
    lease_duration: Duration,
    /// This replica's name; the pod name in a Deployment.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
}

/// The leader Lease's name, unless `--lease-name` says otherwise.
pub const LEASE_NAME: &str = "ironclaim-controller";

/// `1s`, `500ms`, `2m`, `1h30m`.
fn duration(text: &str) -> Result<Duration, String> {
    if let Some(ms) = text.strip_suffix("ms")
        && let Ok(ms) = ms.parse::<u64>()
    {
        return Ok(Duration::from_millis(ms));
    }
    ironclaim_k8s::duration::parse_duration_s(text).map(Duration::from_secs).map_err(|e| e.to_string())
}

pub async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    ironclaim_redfish::install_crypto_provider();
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path).map_err(without_secrets).with_context(|| format!("reading {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(without_secrets)
                .with_context(|| format!("using {}", path.display()))?
        }
        None => {
            kube::Config::infer().await.map_err(|err| match std::error::Error::source(&err).and_then(|s| s.downcast_ref::<KubeconfigError>()) {
                // The in-cluster half of the error says only that this is not a pod.
                Some(KubeconfigError::Parse(yaml)) => anyhow!("$KUBECONFIG or ~/.kube/config: {}", parse_error(yaml)),
                _ => anyhow::Error::new(err).context("no kubeconfig and not in a cluster"),
            })?
        }
    };
    kube::Client::try_from(config).context("building the Kubernetes client")
}

/// A kubeconfig holds tokens, passwords and keys, and kube's parse error
/// quotes the lines around a mistake: it is described again without them.
fn without_secrets(err: KubeconfigError) -> anyhow::Error {
    match err {
        KubeconfigError::Parse(yaml) => anyhow!(parse_error(&yaml)),
        other => other.into(),
    }
}

fn parse_error(yaml: &serde_saphyr::Error) -> String {
    format!("invalid kubeconfig YAML: {}", crate::secrets::describe_yaml(yaml, &[]))
}

pub fn run(args: Args) -> Result<(), Failure> {
    if args.batch_idle > args.batch_max {
        return Err(Failure::bad_input(anyhow!("--batch-idle must not exceed --batch-max")));
    }
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into())).init();
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    runtime.block_on(async move {
        let client = client(args.kubeconfig.as_ref()).await.map_err(Failure::world)?;
        let identity =
            args.identity.clone().or_else(|| std::env::var("HOSTNAME").ok()).unwrap_or_else(|| format!("ironclaim-{}", std::process::id()));
        let mut settings = Settings {
            windows: Windows { idle: args.batch_idle, max: args.batch_max },
            redecide_every: args.redecide_every,
            power_sweep_every: args.power_sweep_every,
            metrics_address: Some(args.metrics_address),
            instance: identity.clone(),
            ..Settings::default()
        };
        settings.claims.deadlines.margin_percent = args.stuck_margin_percent;
        settings.claims.quarantine_after = args.quarantine_after;
        settings.claims.lock_namespace = args.lease_namespace.clone();
        if args.leader_elect {
            settings.lease = Some(LeaseSettings {
                namespace: args.lease_namespace.clone(),
                name: args.lease_name.clone(),
                identity,
                duration: args.lease_duration,
            });
        }
        let power = Arc::new(ProviderRouter {
            redfish: Arc::new(RedfishPower::new(client.clone(), ironclaim_redfish::Timing::default())),
            metal3: Arc::new(Metal3Power::new(client.clone(), Duration::from_secs(300))),
        });
        let controller = Controller::new(client, power, settings);
        controller.run(shutdown_signal()).await.map_err(Failure::world)
    })
}

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
