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
    #[arg(long, value_name = "FILE", global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use; without it, the current context.
    #[arg(long, value_name = "NAME", global = true)]
    pub context: Option<String>,
}

/// A client for the cluster `args` name.
///
/// # Errors
/// Bad input (exit 2) when the kubeconfig cannot be read, names no such
/// context, or there is none at all; the world (exit 1) otherwise.
pub async fn connect(args: &ClusterArgs) -> Result<Connection, Failure> {
    connect_through(args, None).await
}

/// [`connect`], every request passing through `layer` (the controller's
/// count and rate of requests).
pub async fn connect_through(args: &ClusterArgs, layer: Option<ironclaim_controller::api::ApiLayer>) -> Result<Connection, Failure> {
    ironclaim_redfish::install_crypto_provider();
    let options = kube::config::KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let config = match &args.kubeconfig {
        Some(path) => {
            if !path.exists() {
                return Err(Failure::bad_input(anyhow!("the kubeconfig {} does not exist: pass an existing file to --kubeconfig", path.display())));
            }
            let file = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| Failure::bad_input(anyhow!("cannot read the kubeconfig {}: {}", path.display(), described(&e))))?;
            if let Some(context) = &args.context
                && !file.contexts.iter().any(|c| &c.name == context)
            {
                let known: Vec<&str> = file.contexts.iter().map(|c| c.name.as_str()).collect();
                return Err(Failure::bad_input(anyhow!(
                    "the kubeconfig {} has no context {context:?}: pass one of its contexts to --context ({})",
                    path.display(),
                    if known.is_empty() { "it has none".to_string() } else { known.join(", ") }
                )));
            }
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
    let server = config.cluster_url.to_string();
    let client = client_of(config.clone(), &server, layer.as_ref())?;
    Ok(Connection { client, server, config })
}

/// A client of `config` (the cluster at `server`), through `layer`.
fn client_of(config: kube::Config, server: &str, layer: Option<&ironclaim_controller::api::ApiLayer>) -> Result<kube::Client, Failure> {
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| Failure::bad_input(anyhow!("cannot build a client for the cluster {server}: {}", first_line(&e))))?;
    Ok(match layer {
        Some(layer) => builder.with_layer(layer).build(),
        None => builder.build(),
    })
}

/// A client, and the API server it talks to, for the errors to name.
#[derive(Clone)]
pub struct Connection {
    pub client: kube::Client,
    /// The API server's URL, as the kubeconfig gives it.
    pub server: String,
    /// What the client was made of, for another client of the same cluster.
    config: kube::Config,
}

impl Connection {
    /// Another client of the same cluster, as the kubeconfig was read
    /// once, through `layer`.
    pub fn client_through(&self, layer: &ironclaim_controller::api::ApiLayer) -> Result<kube::Client, Failure> {
        client_of(self.config.clone(), &self.server, Some(layer))
    }
}

/// What no retry mends, checked before a command relies on the cluster:
/// the API server answers, the ironclaim.dev CRDs are installed. Fails with
/// one line per problem, naming the server or the objects, with the fix.
pub async fn preflight(connection: &Connection) -> Result<(), Failure> {
    let Err(failed) = ironclaim_controller::doctor::preflight(&connection.client).await else { return Ok(()) };
    if failed.iter().any(|f| f.check == "api") {
        // The check's message is kube's outermost error; the cause (refused,
        // no route, a certificate) is at the bottom of the chain.
        let cause = match connection.client.apiserver_version().await {
            Err(err) => root_cause(&err),
            Ok(_) => "it answered only on a second try".to_string(),
        };
        return Err(Failure::world(anyhow!(
            "the API server {} does not answer ({cause}): check --kubeconfig, --context and the network path to it",
            connection.server
        )));
    }
    // One line per problem, naming every object it touches.
    let mut lines: Vec<(String, Vec<&str>)> = Vec::new();
    for f in &failed {
        let line = format!("{}{}", f.detail, f.fix.as_deref().map(|x| format!(": {x}")).unwrap_or_default());
        match lines.iter_mut().find(|(l, _)| *l == line) {
            Some((_, objects)) => objects.push(&f.object),
            None => lines.push((line, vec![&f.object])),
        }
    }
    let text: Vec<String> = lines.into_iter().map(|(line, objects)| format!("{line} ({})", objects.join(", "))).collect();
    Err(Failure::world(anyhow!("{}", text.join("\n"))))
}

/// The last error of a chain, on one line: what actually went wrong.
pub(crate) fn root_cause(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &dyn std::error::Error = err;
    while let Some(source) = last.source() {
        last = source;
    }
    first_line(&last)
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
pub async fn read(connection: &Connection, controller_namespace: &str) -> Result<ironclaim_controller::index::Index, Failure> {
    match ironclaim_controller::cluster::read(&connection.client, controller_namespace).await {
        Ok(index) => Ok(index),
        Err(err) => {
            preflight(connection).await?;
            Err(Failure::world(anyhow!("cannot read the cluster at {}: {}", connection.server, first_line(&format!("{err:#}")))))
        }
    }
}
