//! The controller end to end, as one test binary: the real control plane of
//! `hack/testenv` (started once for the whole binary), a sushy-tools
//! Redfish emulator per test, and a harness that plays the machines.
//!
//! Servers, Nodes, ServerPools and ServerClaims are cluster-scoped and the
//! controller acts on every one it sees, so the tests that use the cluster
//! take turns: [`support::setup`] waits for the cluster to be free, then
//! removes what earlier tests left, and the test holds the cluster until it
//! ends. Tests that need no cluster (`deploy_crds`, the chart's rendering in
//! `deploy_helm`) run alongside.
//!
//! One module per scenario; run one with
//! `cargo test -p ironclaim-controller --test e2e -- <module or test name>`.

mod support;

mod scaledown_support;

mod deploy_crds;
mod deploy_helm;
mod deploy_rbac;
mod e2e_bmc_config;
mod e2e_bmc_failure;
mod e2e_capacity_buffer;
mod e2e_claim_race;
mod e2e_cluster_api;
mod e2e_dashboard;
mod e2e_dry_run;
mod e2e_external;
mod e2e_keda;
mod e2e_leader;
mod e2e_lock_ledger;
mod e2e_metal3;
mod e2e_provisioning_request;
mod e2e_resize;
mod e2e_restart;
mod e2e_restart_lock;
mod e2e_restart_opening;
mod e2e_stuck;
mod e2e_worked_example;
mod safety_unlinked_worker;
mod scaledown_budget;
mod scaledown_do_not_disrupt;
mod scaledown_floor;
mod scaledown_idle_restart;
mod scaledown_park;
mod scaledown_pdb;
mod scaledown_revalidate;
mod scaledown_stranded;
mod scaledown_volume;
