//! `ironclaim`: a node autoscaler for Kubernetes on bare metal.
//!
//! The binary is thin: it parses arguments, resolves configuration and hands
//! off to the library crates. Each subcommand lives in its own module.
#![forbid(unsafe_code)]

mod bench;
mod bmc;
mod cluster;
mod controller;
mod crds;
mod discover;
mod doctor;
mod duration;
mod exit;
mod explain;
mod logging;
mod output;
mod plan;
mod render;
mod secrets;
mod servers;
mod simulate;
mod swarm;
mod watts;

use clap::{Parser, Subcommand};

/// jemalloc: at full fleet size it holds the controller's memory closer
/// to what is in use than mimalloc did (docs/bench.md, runs 24 to 26); the
/// decision's speed differs by less than this machine's noise.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// `ironclaim --version`: the release and the commit it was built from.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("IRONCLAIM_COMMIT"), ")");

#[derive(Parser)]
#[command(name = "ironclaim", version = VERSION, about = "A node autoscaler for Kubernetes on bare metal")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decide where pending pods go: the worked example, or your manifests.
    Plan(plan::Args),
    /// Measure decision speed on the standard benchmark shapes.
    Bench(bench::Args),
    /// Talk to servers' BMCs over Redfish: status, power-on, power-off, watts.
    Bmc(bmc::Args),
    /// Replay a day on an embedded rack, or a trace, against every power policy.
    Simulate(simulate::Args),
    /// Hunt for faults: many seeds of small racks under random faults,
    /// every policy under the simulator's checkers, in parallel.
    Swarm(swarm::Args),
    /// Run the controller against a cluster (kubeconfig or in-cluster).
    Controller(controller::Args),
    /// Why a pod waits: its claim, server, stage and ETA, or the exact reason.
    Explain(explain::Args),
    /// The inventory: power, claim, node, watts, health; `servers discover`
    /// writes it from the BMCs or from Metal3.
    Servers(servers::Args),
    /// Print the CustomResourceDefinitions of the ironclaim.dev API.
    Crds(crds::Args),
    /// Check a cluster before the controller relies on it: CRDs, RBAC,
    /// every Server's BMC, every ServerPool; what is wrong, with the fix.
    Doctor(doctor::Args),
}

fn main() -> std::process::ExitCode {
    // A background thread returns freed memory to the system on a timer,
    // not only when the process next allocates. Without it (an error here)
    // jemalloc still works, and returns memory as it allocates.
    #[cfg(not(feature = "system-allocator"))]
    let _ = tikv_jemalloc_ctl::background_thread::write(true);
    let cli = Cli::parse();
    let result: Result<(), exit::Failure> = match cli.command {
        Command::Plan(args) => plan::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Bmc(args) => bmc::run(args),
        Command::Simulate(args) => simulate::run(args),
        Command::Swarm(args) => swarm::run(args),
        Command::Controller(args) => controller::run(args),
        Command::Explain(args) => explain::run(args),
        Command::Servers(args) => servers::run(args),
        Command::Crds(args) => crds::run(args),
        Command::Doctor(args) => doctor::run(args),
    };
    exit::report(result)
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{CommandFactory, Parser};

    /// Every argument (clap's own --help and --version aside) and every
    /// subcommand says in `--help` what it is for.
    #[test]
    fn every_argument_and_subcommand_has_help_text() {
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let id = arg.get_id().as_str();
                if matches!(id, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_long().map_or_else(|| id.to_uppercase(), |l| format!("--{l}"))));
                }
            }
            for sub in command.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_name() != "help" && sub.get_about().is_none() && sub.get_long_about().is_none() {
                    missing.push(sub_path.clone());
                }
                walk(sub, &sub_path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "ironclaim", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:#?}");
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn servers_discover_reads_bmcs_metal3_or_cluster_api_one_at_a_time() {
        use clap::error::ErrorKind;
        let parse = |args: &[&str]| Cli::try_parse_from(["ironclaim", "servers", "discover"].iter().chain(args)).map(|_| ()).map_err(|e| e.kind());
        assert_eq!(parse(&["--metal3", "-A", "-l", "rack=r7", "--apply"]), Ok(()));
        assert_eq!(parse(&["--metal3", "https://10.0.0.1"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(parse(&["--metal3", "--username", "a", "--password-file", "p"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(parse(&["--metal3", "--request-timeout", "5s"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(parse(&["--metal3", "-n", "fleet", "-A"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(parse(&["--cluster-api", "-n", "lab", "--apply"]), Ok(()));
        assert_eq!(parse(&["--cluster-api", "--metal3"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(parse(&["--cluster-api", "https://10.0.0.1"]), Err(ErrorKind::ArgumentConflict));
        assert_eq!(parse(&[]), Err(ErrorKind::MissingRequiredArgument), "an endpoint, --metal3 or --cluster-api");
    }
}
