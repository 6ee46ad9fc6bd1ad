//! `ironclaim servers`: the inventory as the cluster sees it: power, claim
//! and its stage, node, watts, health; what the fleet draws, and what
//! powering off saves.

use ironclaim_controller::inventory::{Inventory, Summary, inventory};

use crate::exit::Failure;
use crate::output::{self, OutputArg};
use crate::render;

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    cluster: crate::cluster::ClusterArgs,
    /// The controller's namespace, where its claim lock ledger lives.
    #[arg(long, value_name = "NAMESPACE", default_value = "ironclaim-system")]
    controller_namespace: String,
    #[command(flatten)]
    output: OutputArg,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Read BMCs over Redfish (or Metal3's BareMetalHosts, with --metal3)
    /// and print a Server manifest for each machine; what could not be
    /// determined goes to stderr.
    Discover(crate::discover::Args),
}

pub fn run(args: Args) -> Result<(), Failure> {
    if let Some(Action::Discover(discover)) = args.action {
        return crate::discover::run(discover, &args.cluster);
    }
    let runtime = tokio::runtime::Runtime::new().map_err(Failure::world)?;
    let inventory = runtime.block_on(async {
        let connection = crate::cluster::connect(&args.cluster).await?;
        let index = crate::cluster::read(&connection, &args.controller_namespace).await?;
        Ok::<_, Failure>(inventory(&index))
    })?;
    output::print(args.output.output, &inventory, table)
}

/// `5 servers: 2 on, 3 off; about 480 W: 430 W measured on 2 servers, 50 W for 3 powered off (their offWatts)`
fn summary_line(s: &Summary) -> String {
    let mut states = vec![format!("{} on", s.on), format!("{} off", s.off)];
    for (n, what) in [(s.powering_on, "powering on"), (s.powering_off, "powering off"), (s.unknown, "unknown")] {
        if n > 0 {
            states.push(format!("{n} {what}"));
        }
    }
    let mut parts = vec![format!("{} W measured on {} server{}", s.measured_watts, s.measured_servers, plural(s.measured_servers))];
    if s.unmeasured_servers > 0 {
        parts.push(format!(
            "{} W for {} powered without a reading (their idleWatts, bootWatts while powering on)",
            s.estimated_powered_watts, s.unmeasured_servers
        ));
    }
    if s.off > 0 {
        parts.push(format!("{} W for {} powered off (their offWatts)", s.estimated_off_watts, s.off));
    }
    let about = if s.unmeasured_servers > 0 || s.off > 0 { "about " } else { "" };
    format!("{} server{}: {}; {about}{} W: {}", s.servers, plural(s.servers), states.join(", "), s.total_watts, parts.join(", "))
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn table(inventory: &Inventory) -> String {
    let mut table = render::table(&["SERVER", "POWER", "CLAIM", "STAGE", "NODE", "WATTS", "HEALTH", "CPU", "MEMORY", "GPUS"]);
    for r in &inventory.servers {
        table.add_row(vec![
            r.name.clone(),
            r.power.to_string(),
            r.claim.clone().unwrap_or_default(),
            r.stage.clone().unwrap_or_default(),
            r.node.clone().unwrap_or_default(),
            r.watts.map(|w| format!("{w} W")).unwrap_or_else(|| "-".into()),
            r.health.clone(),
            r.cpu.clone(),
            r.memory.clone(),
            r.gpus.join(", "),
        ]);
    }
    format!("{table}\n{}\n{}\n", summary_line(&inventory.summary), inventory.energy.line)
}

#[cfg(test)]
mod tests {
    use super::{Summary, summary_line};
    use ironclaim_controller::inventory::failures;

    #[test]
    fn failures_are_counted_in_agreement() {
        assert_eq!(failures(1), "1 failure");
        assert_eq!(failures(3), "3 failures");
    }

    #[test]
    fn the_summary_says_what_is_measured_and_what_is_estimated() {
        let all_measured = Summary { servers: 2, on: 2, measured_watts: 400, measured_servers: 2, total_watts: 400, ..Summary::default() };
        assert_eq!(summary_line(&all_measured), "2 servers: 2 on, 0 off; 400 W: 400 W measured on 2 servers");
        let mixed = Summary {
            servers: 5,
            on: 2,
            off: 2,
            powering_on: 1,
            measured_watts: 430,
            measured_servers: 1,
            estimated_powered_watts: 300,
            unmeasured_servers: 2,
            estimated_off_watts: 30,
            total_watts: 760,
            ..Summary::default()
        };
        assert_eq!(
            summary_line(&mixed),
            "5 servers: 2 on, 2 off, 1 powering on; about 760 W: 430 W measured on 1 server, \
             300 W for 2 powered without a reading (their idleWatts, bootWatts while powering on), 30 W for 2 powered off (their offWatts)"
        );
    }
}
