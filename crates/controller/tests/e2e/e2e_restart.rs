//! The controller dies between the power-on request and the status write,
//! and a new one starts: no second power-on, no orphaned server.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::*;
use ironclaim_controller::provider::PowerFuture;
use ironclaim_controller::{Controller, Power};
use ironclaim_k8s::api::Server;
use ironclaim_k8s::api::server::PowerState;
use ironclaim_k8s::api::serverclaim::Stage;
use ironclaim_testenv::eventually;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

/// Sends the power-on, then never comes back: the process "dies" before
/// it can write what happened.
struct DiesAfterPowerOn {
    inner: Arc<dyn Power>,
    sent: Arc<AtomicUsize>,
}

impl Power for DiesAfterPowerOn {
    fn power_on<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        Box::pin(async move {
            self.inner.power_on(server).await?;
            self.sent.fetch_add(1, Ordering::SeqCst);
            futures::future::pending::<()>().await;
            Ok(())
        })
    }
    fn power_off<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, ()> {
        self.inner.power_off(server)
    }
    fn power_state<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, PowerState> {
        self.inner.power_state(server)
    }
    fn watts<'a>(&'a self, server: &'a Server) -> PowerFuture<'a, Option<f64>> {
        self.inner.watts(server)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_between_power_on_and_status_write_then_restarted_powers_on_once_and_leaves_no_orphan() {
    let (env, client) = setup().await;
    // Generous stage deadlines: under a loaded CI machine a start that runs
    // past the default ones fails its claim and opens a second, which is
    // not what this test is about.
    let relaxed = |m: Machine| Machine { expected: ["30s", "30s", "20s", "20s"], ..m };
    let machines = vec![relaxed(Machine::new("r1-u01", 31, 16, 32)), relaxed(Machine::new("r1-u02", 32, 16, 32))];
    let sushy = start_sushy([(machines[0].uuid.clone(), SystemPower::Off), (machines[1].uuid.clone(), SystemPower::On)]);
    for m in &machines {
        apply(&env, &m.server_json(&sushy));
    }
    apply(&env, &serverpool("default", json!([]), json!({})));
    // r1-u02 is on and held by a claim that no longer exists: an orphan
    // left by an earlier run, which recorded its power-on as every run does.
    // It was claimed just now, so the first run (whose opening grace is an
    // hour) takes it for a claim still being opened and leaves it alone:
    // were the orphan released before the kill, the first run could claim
    // it for the pod, and this test would be about something else.
    let servers: Api<Server> = Api::all(client.clone());
    let now = jiff::Timestamp::now().to_string();
    let orphan = json!({"status": {"claim": "vanished-claim", "claimedAt": now, "powerState": "On", "poweredOnByIronclaim": true}});
    servers.patch_status("r1-u02", &PatchParams::default(), &Patch::Merge(&orphan)).await.unwrap();
    // Only the first server can play its part; the orphan must not boot into a node.
    let _harness = Machines::start(client.clone(), &sushy, vec![machines[0].clone()]);

    let sent = Arc::new(AtomicUsize::new(0));
    let dying = Arc::new(DiesAfterPowerOn { inner: redfish(&client), sent: sent.clone() });
    let mut first = settings("first");
    first.power_sweep_every = Duration::from_secs(3600);
    first.redecide_every = Duration::from_secs(3600);
    first.claims.opening_grace = Duration::from_secs(3600);
    let first_run = run(Controller::new(client.clone(), dying, first));

    apply(&env, &pod("app", "8", "8Gi", &[], 0));
    let s = sent.clone();
    eventually("the power-on sent", Duration::from_secs(30), || {
        let s = s.clone();
        async move { if s.load(Ordering::SeqCst) == 1 { Ok(()) } else { Err("not yet".to_string()) } }
    })
    .await;
    first_run.kill();
    let all = claims(&client).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].status.as_ref().unwrap().stage, Some(Stage::PoweringOn), "the confirmation was never written");

    let mut second = settings("second");
    second.claims.opening_grace = Duration::from_secs(2);
    let second = run(Controller::new(client.clone(), redfish(&client), second));
    await_bound(&client, "app", Duration::from_secs(40)).await;
    assert_eq!(pod_node(&client, "app").await.as_deref(), Some("r1-u01"));
    assert_eq!(claims(&client).await.len(), 1, "no second claim");
    assert_eq!(sushy.resets(&machines[0].uuid), 1, "exactly one power-on reached the BMC: {}", sushy.log_text());

    let c = client.clone();
    eventually("the orphan powered off and released", Duration::from_secs(40), || {
        let c = c.clone();
        async move {
            let s = server(&c, "r1-u02").await.status.unwrap_or_default();
            if s.claim.is_none() && s.power_state == Some(PowerState::Off) { Ok(()) } else { Err(format!("{s:?}")) }
        }
    })
    .await;
    assert_eq!(server(&client, "r1-u02").await.status.unwrap().failures, 0, "an orphan is not the server's failure");
    second.stop().await;
}
