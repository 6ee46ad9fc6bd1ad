//! The worked example of PROBLEM.md, end to end: a real API server and
//! scheduler, kwok kubelets, sushy-tools BMCs, and the controller.

use std::time::Duration;

use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_k8s::api::serverclaim::{Stage, StageOutcome};
use ironclaim_testenv::eventually;
use kube::ResourceExt;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn web_burst_opens_no_claim_batch_and_second_gpu_pod_power_on_their_servers_and_bind() {
    let (env, client) = setup().await;
    let machines = vec![
        Machine::new("gen-32", 1, 32, 64).label("ironclaim.dev/class", "general"),
        Machine::new("gen-16", 2, 16, 32).label("ironclaim.dev/class", "general-small"),
        Machine::new("a100-1", 3, 32, 256).label("accelerator", "nvidia-a100").gpus("A100", 1, Duration::from_secs(3)).taint("nvidia.com/gpu"),
    ];
    let sushy = start_sushy_for(&machines, SystemPower::Off);
    for m in &machines {
        apply(&env, &m.server_json(&sushy));
    }
    apply(&env, &serverpool("general", json!([{"key": "accelerator", "operator": "DoesNotExist"}]), json!({})));
    apply(
        &env,
        &tainted_serverpool(
            "gpu",
            json!([{"key": "accelerator", "operator": "In", "values": ["nvidia-a100"]}]),
            json!({"extendedResources": ["nvidia.com/gpu"]}),
            "nvidia.com/gpu",
        ),
    );
    apply(&env, &existing_node("general-a", 8, 28, &[], 0, &[]));
    apply(&env, &existing_node("general-b", 8, 28, &[], 0, &[]));
    apply(&env, &existing_node("gpu-a", 16, 120, &[("accelerator", "nvidia-a100")], 1, &["nvidia.com/gpu"]));
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());

    let controller = Controller::new(client.clone(), redfish(&client), settings("worked-example"));
    let metrics = controller.metrics();
    let running = run(controller);

    // The three demands arrive together.
    for i in 0..6 {
        apply(&env, &pod(&format!("web-{i}"), "1", "2Gi", &[], 0));
    }
    apply(&env, &pod("batch", "20", "40Gi", &[], 0));
    for i in 0..2 {
        apply(&env, &pod(&format!("gpu-{i}"), "8", "32Gi", &[("accelerator", "nvidia-a100")], 1));
    }

    // While they wait, the gauge counts them by what the decision found.
    let gauge = |text: &str, decision: &str| -> Option<i64> {
        let key = format!("ironclaim_pending_pods{{decision=\"{decision}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(key.as_str())).and_then(|v| v.trim().parse().ok())
    };
    let m = metrics.clone();
    eventually("pending pods counted by decision", Duration::from_secs(30), || {
        let text = m.render();
        let n = gauge(&text, "new_claim");
        async move { if n.is_some_and(|n| n >= 1) { Ok(()) } else { Err(format!("new_claim: {n:?}")) } }
    })
    .await;

    let c = client.clone();
    eventually("every pod bound", Duration::from_secs(50), || {
        let c = c.clone();
        async move {
            let mut where_ = Vec::new();
            for name in ["web-0", "web-1", "web-2", "web-3", "web-4", "web-5", "batch", "gpu-0", "gpu-1"] {
                match pod_node(&c, name).await {
                    Some(node) => where_.push((name, node)),
                    None => return Err(format!("{name} pending; claims: {:?}", names(&claims(&c).await))),
                }
            }
            Ok(where_)
        }
    })
    .await;

    for i in 0..6 {
        let node = pod_node(&client, &format!("web-{i}")).await.unwrap();
        assert!(["general-a", "general-b"].contains(&node.as_str()), "web-{i} is on {node}");
    }
    assert_eq!(pod_node(&client, "batch").await.as_deref(), Some("gen-32"), "the batch pod runs on the 32-vCPU server");
    let gpu_nodes = [pod_node(&client, "gpu-0").await.unwrap(), pod_node(&client, "gpu-1").await.unwrap()];
    assert!(gpu_nodes.contains(&"gpu-a".to_string()) && gpu_nodes.contains(&"a100-1".to_string()), "{gpu_nodes:?}");

    // Exactly two claims, both walked through every stage.
    let c = client.clone();
    let all = eventually("both claims serving", Duration::from_secs(10), || {
        let c = c.clone();
        async move {
            let all = claims(&c).await;
            let serving = all.iter().filter(|c| c.status.as_ref().and_then(|s| s.stage) == Some(Stage::Serving)).count();
            if serving == 2 { Ok(all) } else { Err(format!("{:?}", names(&all))) }
        }
    })
    .await;
    let mut servers: Vec<&str> = all.iter().map(|c| c.spec.server.as_str()).collect();
    servers.sort();
    assert_eq!(servers, ["a100-1", "gen-32"], "the web burst opened no claim");
    for claim in &all {
        let status = claim.status.as_ref().unwrap();
        let stages: Vec<Stage> = status.stages.iter().map(|r| r.stage).collect();
        assert_eq!(stages, [Stage::Selected, Stage::PoweringOn, Stage::Booting, Stage::Joined, Stage::Ready, Stage::Serving], "{}", claim.name_any());
        assert!(status.stages.iter().all(|r| r.outcome == StageOutcome::Succeeded && r.duration_seconds.is_some()));
        assert_eq!(status.node_name.as_deref(), Some(claim.spec.server.as_str()));
    }
    // The GPU claim waited in Joined for its gate: the driver took 3 s.
    let gpu = all.iter().find(|c| c.spec.server == "a100-1").unwrap();
    let joined = gpu.status.as_ref().unwrap().stages.iter().find(|r| r.stage == Stage::Joined).unwrap();
    assert!(joined.duration_seconds.unwrap() >= 2, "ready before the GPUs were advertised: {joined:?}");

    // One power-on each, none for the server nobody needed.
    assert_eq!(sushy.resets(&machines[0].uuid), 1, "{}", sushy.log_text());
    assert_eq!(sushy.resets(&machines[2].uuid), 1);
    assert_eq!(sushy.resets(&machines[1].uuid), 0);

    let general = server(&client, "gen-32").await;
    let status = general.status.unwrap();
    assert_eq!(status.node.as_deref(), Some("gen-32"));
    assert!(status.claim.is_some());
    assert!(status.measured_durations.is_some_and(|m| m.boot.is_some_and(|b| b.samples == 1)));

    let events = pod_events(&client, "batch").await;
    assert!(events.iter().any(|e| e.starts_with("ServerClaimed: claimed server gen-32 (cold)")), "{events:?}");
    // Sent on the BMC's confirmation itself, not on a later pass of the
    // loop: the server was on for no time yet, whatever the load.
    assert!(
        events
            .iter()
            .any(|e| e == "WaitingForServer: waiting for server gen-32: powered on 0s ago, node not registered yet, usually registers in 3s"),
        "{events:?}"
    );

    // The pools' status counts the servers they hold, as their limits do.
    let c = client.clone();
    eventually("the pools' status written", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let pools: kube::Api<ironclaim_k8s::api::ServerPool> = kube::Api::all(c);
            let gpu = pools.get_status("gpu").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
            let general = pools.get_status("general").await.map_err(|e| e.to_string())?.status.unwrap_or_default();
            let limit = gpu.conditions.iter().find(|c| c.type_ == "LimitReached").map(|c| c.status.clone());
            let gpus = gpu.resources.get("nvidia.com/gpu").map(|q| q.0.clone());
            if gpu.servers == 1 && gpus.as_deref() == Some("1") && general.servers == 1 && limit.as_deref() == Some("False") {
                Ok(())
            } else {
                Err(format!("gpu {gpu:?}, general {general:?}"))
            }
        }
    })
    .await;

    let m = metrics.clone();
    eventually("no pod counted pending once all are bound", Duration::from_secs(30), || {
        let n = gauge(&m.render(), "new_claim");
        async move { if n == Some(0) { Ok(()) } else { Err(format!("new_claim: {n:?}")) } }
    })
    .await;
    let text = metrics.render();
    assert!(text.contains("ironclaim_stage_duration_seconds_count{stage=\"booting\",serverpool=\"gpu\",outcome=\"succeeded\"} 1"), "{text}");
    assert!(text.contains("ironclaim_claims_total{outcome=\"ready\",reason=\"\"} 2"), "{text}");
    running.stop().await;
}
