//! ironclaim against the real kube-scheduler, on seeded scenarios: the
//! default suite's share. `cargo run --release -p ironclaim-agree` runs
//! thousands (docs/plan.md).

use ironclaim_agree::cluster::Cluster;
use ironclaim_agree::generate::{Mode, scenario};
use ironclaim_agree::{check, decide};

/// Scenarios the default suite runs, a minute or so on two cores.
const SINGLE: u64 = 200;
const BATCH: u64 = 30;

#[test]
fn every_scenario_converts_and_plans_offline() {
    // The generator's output is what a user could write: every object
    // converts, and the plan names only the scenario's nodes.
    for seed in 0..500 {
        for mode in [Mode::Single, Mode::Batch] {
            let s = scenario(seed, mode);
            let fits = decide::feasible(&s, 0).unwrap_or_else(|e| panic!("seed {seed} {mode:?}: {e:#}"));
            assert!(fits.iter().all(|n| s.node_names().contains(n)));
            decide::placed(&s).unwrap_or_else(|e| panic!("seed {seed} {mode:?}: {e:#}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ironclaim_agrees_with_kube_scheduler() {
    let cluster = Cluster::start().await.expect("control plane");
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("agree");
    let mut found = Vec::new();
    for (mode, count) in [(Mode::Single, SINGLE), (Mode::Batch, BATCH)] {
        for seed in 0..count {
            if let Some(d) = check(&cluster, seed, mode).await.unwrap_or_else(|e| panic!("seed {seed} {mode:?}: {e:#}")).disagreement {
                let path = d.write(&dir).expect("write the disagreement");
                found.push(format!("{}\n{}", path.display(), d.what));
            }
        }
    }
    cluster.clear().await.expect("clear");
    assert!(found.is_empty(), "{} disagreements:\n\n{}", found.len(), found.join("\n\n"));
}
