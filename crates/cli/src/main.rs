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
mod doctor;
mod exit;
mod explain;
mod logging;
mod plan;
mod render;
mod secrets;
mod servers;
mod simulate;
mod swarm;

use clap::{Parser, Subcommand};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "ironclaim", version, about = "A node autoscaler for Kubernetes on bare metal")]
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
    /// The inventory: power, claim, node, watts, health.
    Servers(servers::Args),
    /// Print the CustomResourceDefinitions of the ironclaim.dev API.
    Crds(crds::Args),
    /// Check a cluster before the controller relies on it: CRDs, RBAC,
    /// every Server's BMC, every ServerPool; what is wrong, with the fix.
    Doctor(doctor::Args),
}

fn main() -> std::process::ExitCode {
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
