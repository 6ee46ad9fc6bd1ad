//! What every command that talks to a cluster shares: how it finds the
//! cluster (`--kubeconfig`, `--context`) and the controller's namespace.

use std::path::PathBuf;

use anyhow::anyhow;
use kube::config::KubeconfigError;

use crate::exit::Failure;

/// Where the cluster is.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ClusterArgs {
    /// A kubeconfig; without it, $KUBECONFIG, ~/.kube/config or the in-cluster service account.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; without it, the current context.
    #[arg(long, value_name = "NAME")]
    pub context: Option<String>,
}

/// A client for the cluster `args` name.
///
/// # Errors
/// Bad input (exit 2) when the kubeconfig cannot be read, names no such
/// context, or there is none at all; the world (exit 1) otherwise.
pub async fn connect(args: &ClusterArgs) -> Result<kube::Client, Failure> {
    ironclaim_redfish::install_crypto_provider();
    let options = kube::config::KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let config = match &args.kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Failure::bad_input(anyhow!("cannot read the kubeconfig {}: {}", path.display(), described(&e))))?;
            kube::Config::from_custom_kubeconfig(file, &options)
                .await
                .map_err(|e| Failure::bad_input(anyhow!("cannot use the kubeconfig {}: {}", path.display(), described(&e))))?
        }
        None if args.context.is_some() => kube::Config::from_kubeconfig(&options).await.map_err(|e| {
            Failure::bad_input(anyhow!("cannot use the context {:?}: {}", args.context.as_deref().unwrap_or_default(), described(&e)))
        })?,
        None => kube::Config::infer().await.map_err(|e| match std::error::Error::source(&e).and_then(|s| s.downcast_ref::<KubeconfigError>()) {
            // The in-cluster half of the error says only that this is not a pod.
            Some(KubeconfigError::Parse(yaml)) => Failure::bad_input(anyhow!("$KUBECONFIG or ~/.kube/config: {}", parse_error(yaml))),
            Some(other) if !matches!(other, KubeconfigError::ReadConfig(..) | KubeconfigError::FindPath) => {
                Failure::bad_input(anyhow!("$KUBECONFIG or ~/.kube/config: {}", described(other)))
            }
            _ => Failure::bad_input(anyhow!(
                "no cluster to talk to: no kubeconfig ($KUBECONFIG, ~/.kube/config) and not in a pod; pass --kubeconfig FILE"
            )),
        })?,
    };
    kube::Client::try_from(config).map_err(|e| Failure::bad_input(anyhow!("cannot build a client for the cluster: {}", first_line(&e))))
}

/// A kubeconfig holds tokens, passwords and keys, and kube's parse error
/// quotes the lines around a mistake: it is described again without them.
fn described(err: &KubeconfigError) -> String {
    match err {
        KubeconfigError::Parse(yaml) => parse_error(yaml),
        other => first_line(other),
    }
}

fn parse_error(yaml: &serde_saphyr::Error) -> String {
    format!("invalid kubeconfig YAML: {}", crate::secrets::describe_yaml(yaml, &[]))
}

fn first_line(err: &dyn std::fmt::Display) -> String {
    err.to_string().lines().next().unwrap_or_default().to_string()
}

/// The cluster as the controller sees it, read once. When the read fails
/// for what no retry mends (the API server gone, the ironclaim.dev CRDs
/// not installed), the error says so with the fix.
pub async fn read(client: &kube::Client, controller_namespace: &str) -> Result<ironclaim_controller::index::Index, Failure> {
    match ironclaim_controller::cluster::read(client, controller_namespace).await {
        Ok(index) => Ok(index),
        Err(err) => match ironclaim_controller::doctor::preflight(client).await {
            Err(failed) if !failed.is_empty() => {
                let first = &failed[0];
                Err(Failure::world(anyhow!("{}{}", first.detail, first.fix.as_deref().map(|f| format!(": {f}")).unwrap_or_default())))
            }
            _ => Err(Failure::world(err)),
        },
    }
}
