//! Issue 16, item 1: a server whose BMC credentials Secret is missing.
//! Its claim fails at once with a typed reason naming the Secret, the
//! untouched server is released, every server behind the same Secret is
//! held back with a condition (no claim moves on to the next), and once
//! the Secret exists a read clears the condition and the pod is served.

use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_k8s::api::serverclaim::FailureReason;
use ironclaim_k8s::api::server::BMC_CONFIGURED_CONDITION;
use ironclaim_testenv::eventually;
use kube::ResourceExt;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_bmc_secret_fails_its_claim_at_once_holds_back_every_server_behind_it_and_clears_once_created() {
    let (env, client) = setup().await;
    let machines = vec![Machine::new("cfg-a", 41, 16, 32), Machine::new("cfg-b", 42, 16, 32), Machine::new("cfg-c", 43, 16, 32)];
    let sushy = start_sushy_for(&machines, SystemPower::Off);
    let create_secret = || {
        env.kubectl([
            "-n",
            NAMESPACE,
            "create",
            "secret",
            "generic",
            "bmc-rack",
            "--from-literal=username=admin",
            "--from-literal=password=password",
        ])
        .expect("create the Secret");
    };
    create_secret();
    for m in &machines {
        let mut server = m.server_json(&sushy);
        server["spec"]["bmc"]["credentialsSecretRef"]["name"] = json!("bmc-rack");
        apply(&env, &server);
    }
    apply(&env, &serverpool("default", json!([]), json!({})));
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    // One sweep, at the start, while the Secret still exists: what follows
    // is the claim's own doing.
    let mut settings = settings("bmc-config");
    settings.power_sweep_every = Duration::from_secs(3600);
    let running = run(Controller::new(client.clone(), redfish(&client), settings));
    let c = client.clone();
    eventually("the first sweep read every server", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let mut read = 0;
            for name in ["cfg-a", "cfg-b", "cfg-c"] {
                read += usize::from(server(&c, name).await.status.is_some_and(|s| s.power_state.is_some()));
            }
            if read == 3 { Ok(()) } else { Err(format!("{read} of 3 read")) }
        }
    })
    .await;
    env.kubectl(["-n", NAMESPACE, "delete", "secret", "bmc-rack"]).expect("delete the Secret");

    apply(&env, &pod("app", "8", "8Gi", &[], 0));
    let started = std::time::Instant::now();
    let c = client.clone();
    let failed = eventually("the claim failed and every server is held back", Duration::from_secs(10), || {
        let c = c.clone();
        async move {
            let all = claims(&c).await;
            let Some(claim) = all.first() else { return Err("no claim yet".to_string()) };
            let status = claim.status.clone().unwrap_or_default();
            if status.failure_reason.is_none() {
                return Err(format!("claim {} not failed yet", claim.name_any()));
            }
            for name in ["cfg-a", "cfg-b", "cfg-c"] {
                let s = server(&c, name).await.status.unwrap_or_default();
                if s.claim.as_deref().is_some_and(|c| !c.is_empty()) || s.misconfigured().is_none() {
                    return Err(format!("server {name}: claim {:?}, held back {:?}", s.claim, s.misconfigured().map(|c| &c.message)));
                }
            }
            Ok((claim.clone(), status))
        }
    })
    .await;
    let (claim, status) = failed;
    assert!(started.elapsed() < Duration::from_secs(10), "within 10 s: {:?}", started.elapsed());
    assert_eq!(status.failure_reason, Some(FailureReason::BmcCredentialsMissing), "{status:?}");
    let message = status.failure_message.clone().unwrap_or_default();
    assert!(message.contains(&format!("Secret {NAMESPACE}/bmc-rack")) && message.contains("does not exist"), "{message}");
    assert!(!message.contains("attempt"), "failed at once, not retried: {message}");
    for name in ["cfg-a", "cfg-b", "cfg-c"] {
        let s = server(&client, name).await.status.unwrap_or_default();
        let held = s.misconfigured().expect("held back");
        assert_eq!(held.reason, "BmcCredentialsMissing", "{name}");
        assert!(held.message.contains("bmc-rack"), "{name}: {}", held.message);
        assert_eq!(s.failures, 0, "{name}: a fault of configuration is not the machine's");
        assert!(!s.quarantined, "{name}");
        assert_ne!(s.power_state, Some(ironclaim_k8s::api::server::PowerState::PoweringOn), "{name}: no power request went out");
    }
    let resets: usize = machines.iter().map(|m| sushy.resets(&m.uuid)).sum();
    assert_eq!(resets, 0, "no power request reached a BMC");
    // It does not move on to the next server behind the same Secret.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let all = claims(&client).await;
    let detail = |c: &ironclaim_k8s::api::ServerClaim| format!("{}: {:?}", c.name_any(), c.status.as_ref().map(|s| (&s.failure_reason, &s.stages)));
    assert_eq!(
        names(&all),
        names(std::slice::from_ref(&claim)),
        "one claim, the failed one: {:?}; cfg-a {:?}",
        all.iter().map(detail).collect::<Vec<_>>(),
        server(&client, "cfg-a").await.status
    );
    let events = crate::scaledown_support::object_events(&client, "Server", "cfg-a").await;
    assert!(events.iter().any(|e| e.starts_with("BmcCredentialsMissing:")), "{events:?}");
    running.stop().await;

    // The preflight names the missing Secret on every server behind it.
    let findings = ironclaim_controller::doctor::examine(&client, redfish(&client).as_ref(), &Default::default()).await;
    use ironclaim_controller::doctor::Verdict;
    for name in ["cfg-a", "cfg-b", "cfg-c"] {
        let bmc = findings.iter().find(|f| f.object == format!("Server {name}") && f.check == "bmc").expect("a BMC check");
        assert_eq!(bmc.verdict, Verdict::Fail, "{bmc:?}");
        assert!(bmc.detail.starts_with("BmcCredentialsMissing") && bmc.detail.contains("bmc-rack"), "{bmc:?}");
        assert!(bmc.fix.as_deref().is_some_and(|f| f.contains(&format!("create the Secret {NAMESPACE}/bmc-rack"))), "{bmc:?}");
    }
    let crds: Vec<_> = findings.iter().filter(|f| f.object.starts_with("CustomResourceDefinition")).collect();
    assert_eq!(crds.len(), 3, "{findings:?}");
    assert!(crds.iter().all(|f| f.verdict == Verdict::Ok), "the test's CRDs are this version's: {crds:?}");

    // The Secret created, a read passes: the servers are claimed again.
    create_secret();
    let running = run(Controller::new(client.clone(), redfish(&client), crate::support::settings("bmc-config-fixed")));
    let node = await_bound(&client, "app", Duration::from_secs(60)).await;
    assert!(node.starts_with("cfg-"), "{node}");
    for name in ["cfg-a", "cfg-b", "cfg-c"] {
        let s = server(&client, name).await.status.unwrap_or_default();
        let c = s.conditions.iter().find(|c| c.type_ == BMC_CONFIGURED_CONDITION).expect("still told");
        assert_eq!(c.status, "True", "{name}: {c:?}");
    }
    running.stop().await;
}
