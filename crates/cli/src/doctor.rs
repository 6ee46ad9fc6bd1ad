//! `ironclaim doctor`: the preflight against a cluster. Every Server's
//! BMC (reachability, credentials, system identity, power reading, TLS),
//! every ServerPool's references, the CRDs and RBAC of this version; a
//! table of what is wrong with the fix. Exit 1 when anything would stop
//! the controller or keep it from a server.

use std::sync::Arc;
use std::time::Duration;

use ironclaim_controller::doctor::{Finding, Identity, Verdict, examine};
use ironclaim_controller::{ClusterApiPower, Metal3Power, ProviderRouter, RedfishPower};

use crate::cluster::ClusterArgs;
use crate::exit::Failure;
use crate::output::{self, OutputArg};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cluster: ClusterArgs,
    /// The controller's namespace: its ServiceAccount and, by default, the BMC Secrets.
    #[arg(long, value_name = "NAMESPACE", default_value = "ironclaim-system")]
    controller_namespace: String,
    /// The controller's ServiceAccount, whose permissions are checked.
    #[arg(long, value_name = "NAME", default_value = "ironclaim")]
    service_account: String,
    #[command(flatten)]
    output: OutputArg,
    /// Show the checks that passed too.
    #[arg(long)]
    all: bool,
    /// The controller's external providers file, to check the Servers
    /// powered through them.
    #[arg(long, value_name = "FILE")]
    external_providers: Option<std::path::PathBuf>,
}

pub fn run(args: Args) -> Result<(), Failure> {
    // The findings say what failed; kube's own log of the same failure
    // would only repeat it.
    let external = crate::controller::external_providers(args.external_providers.as_deref())?;
    crate::logging::init(crate::logging::LogFormat::Text, "error,kube_client=off");
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    let findings = runtime.block_on(async {
        let client = crate::cluster::connect(&args.cluster).await?.client;
        let power = ProviderRouter {
            redfish: Arc::new(RedfishPower::new(client.clone(), ironclaim_redfish::Timing::default())),
            metal3: Arc::new(Metal3Power::new(client.clone(), Duration::from_secs(300))),
            external: Arc::new(external),
            cluster_api: Arc::new(ClusterApiPower::new(client.clone(), Duration::from_secs(1800))),
        };
        let identity = Identity { namespace: args.controller_namespace.clone(), service_account: args.service_account.clone() };
        Ok::<_, Failure>(examine(&client, &power, &identity).await)
    })?;
    let failed = findings.iter().filter(|f| f.verdict == Verdict::Fail).count();
    let warned = findings.iter().filter(|f| f.verdict == Verdict::Warn).count();
    // A reader gone from stdout does not hide a failed check.
    match output::print(args.output.output, &findings[..], |findings| table(findings, args.all, failed, warned)) {
        Ok(()) | Err(Failure::OutputClosed) => {}
        Err(other) => return Err(other),
    }
    if failed > 0 {
        return Err(Failure::world(anyhow::anyhow!("{failed} check(s) failed: fix them before the controller can rely on these objects")));
    }
    Ok(())
}

fn table(findings: &[Finding], all: bool, failed: usize, warned: usize) -> String {
    let mut out = String::new();
    let shown: Vec<&Finding> = findings.iter().filter(|f| all || f.verdict != Verdict::Ok).collect();
    if !shown.is_empty() {
        let mut t = crate::render::table(&["OBJECT", "CHECK", "RESULT", "DETAIL", "FIX"]);
        for f in shown {
            let verdict = match f.verdict {
                Verdict::Ok => "ok",
                Verdict::Warn => "warn",
                Verdict::Fail => "FAIL",
            };
            t.add_row(vec![f.object.as_str(), f.check, verdict, f.detail.as_str(), f.fix.as_deref().unwrap_or("")]);
        }
        out.push_str(&format!("{t}\n"));
    }
    let passed = findings.len() - failed - warned;
    out.push_str(&format!(
        "{} check{}: {passed} passed, {warned} warning{}, {failed} failed\n",
        findings.len(),
        plural(findings.len()),
        plural(warned)
    ));
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}
