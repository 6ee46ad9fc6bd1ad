//! CapacityBuffers end to end, with the upstream CRD (Karpenter v1.15's
//! `autoscaling.x-k8s.io_capacitybuffers.yaml`, from its Go module) on the
//! real control plane. A buffer of three 2-CPU chunks keeps 6 CPU free in
//! the pool whose servers would host a chunk: with every server off, a
//! spare is powered on for it, and the buffer's status says where it
//! stands, as the API defines it. Deleting the buffer lets the spare power
//! off after its break-even. A buffer naming a workload that does not
//! exist says so.

use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_k8s::capacity_buffer::CapacityBuffer;
use ironclaim_testenv::eventually;
use kube::Api;
use serde_json::json;

/// `type=status:reason` of each condition of the buffer.
async fn conditions(client: &kube::Client, name: &str) -> Result<(Vec<String>, Option<i32>), String> {
    let api: Api<CapacityBuffer> = Api::namespaced(client.clone(), NAMESPACE);
    let b = api.get(name).await.map_err(|e| e.to_string())?;
    let status = b.status.unwrap_or_default();
    Ok((status.conditions.iter().map(|c| format!("{}={}:{}", c.type_, c.status, c.reason)).collect(), status.replicas))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_keeps_its_room_in_the_pools_headroom_and_its_status_says_where_it_stands() {
    let (env, client) = setup().await;
    install_peer_crds(&env, "karpenter-", &["autoscaling.x-k8s.io_capacitybuffers.yaml"], &["capacitybuffers.autoscaling.x-k8s.io"]);
    let _ = env.kubectl(["-n", NAMESPACE, "delete", "capacitybuffers.autoscaling.x-k8s.io", "--all", "--ignore-not-found"]);
    let pool = "buf";
    let machines = machines("buf", pool, 2, 81);
    clean(&env, &client, &machines, pool).await;
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let sushy = start_sushy(machines.iter().map(|m| (m.uuid.clone(), SystemPower::Off)));
    // Break-even: 10 W x 15 s / 150 W = 1 s.
    apply_servers(&env, &sushy, &machines, 10);
    let _harness = Machines::start(client.clone(), &sushy, machines.clone());
    apply(
        &env,
        &json!({
            "apiVersion": "v1", "kind": "PodTemplate",
            "metadata": {"name": "chunk", "namespace": NAMESPACE},
            "template": {"spec": {"containers": [{"name": "c", "image": "registry.invalid/pause", "resources": {"requests": {"cpu": "2", "memory": "2Gi"}}}]}}
        }),
    );
    let buffer = |name: &str, spec: serde_json::Value| json!({"apiVersion": "autoscaling.x-k8s.io/v1beta1", "kind": "CapacityBuffer", "metadata": {"name": name, "namespace": NAMESPACE}, "spec": spec});
    apply(&env, &buffer("warm", json!({"podTemplateRef": {"name": "chunk"}, "replicas": 3})));
    apply(&env, &buffer("orphan", json!({"scalableRef": {"kind": "Deployment", "name": "nowhere"}, "percentage": 50})));
    let running = run(Controller::new(client.clone(), redfish(&client), settings("buffer")));

    // Every server off: a spare (8 CPU) is powered on for the 6 CPU.
    let bmcs = Bmcs::new(&sushy);
    let ms = machines.clone();
    eventually("a spare powered on for the buffer", Duration::from_secs(40), || {
        let (bmcs, ms) = (&bmcs, ms.clone());
        async move {
            let on = bmcs.on(&ms).await;
            if on.len() == 1 { Ok(()) } else { Err(format!("on: {on:?}")) }
        }
    })
    .await;
    let c = client.clone();
    let (kept, replicas) = eventually("the buffer's room in existing capacity", Duration::from_secs(40), || {
        let c = c.clone();
        async move {
            let (cs, n) = conditions(&c, "warm").await?;
            if cs.iter().any(|x| x == "Provisioning=True:FitsExistingCapacity") { Ok((cs, n)) } else { Err(format!("{cs:?}")) }
        }
    })
    .await;
    assert!(kept.contains(&"ReadyForProvisioning=True:Resolved".to_string()), "{kept:?}");
    assert_eq!(replicas, Some(3));
    let api: Api<CapacityBuffer> = Api::namespaced(client.clone(), NAMESPACE);
    let status = api.get("warm").await.expect("buffer").status.expect("status");
    assert_eq!(status.pod_template_ref.map(|r| r.name).as_deref(), Some("chunk"));
    assert_eq!(status.provisioning_strategy.as_deref(), Some("buffer.x-k8s.io/active-capacity"));
    let c = client.clone();
    let orphan = eventually("the orphan buffer says its workload is missing", Duration::from_secs(20), || {
        let c = c.clone();
        async move {
            let (cs, _) = conditions(&c, "orphan").await?;
            if cs.is_empty() { Err("no status yet".to_string()) } else { Ok(cs) }
        }
    })
    .await;
    assert_eq!(orphan, vec!["ReadyForProvisioning=False:ScalableRefNotFound".to_string()]);
    // One spare is enough: 8 CPU hold 6. (While the first spare's node
    // registers and is not Ready yet, a pass may find the pool short and
    // power the second on; past its break-even it goes off again.)
    let ms = machines.clone();
    eventually("one spare on, and only one, for 3 s", Duration::from_secs(60), || {
        let (bmcs, ms) = (&bmcs, ms.clone());
        async move {
            for _ in 0..3 {
                let now = bmcs.on(&ms).await;
                if now.len() != 1 {
                    return Err(format!("on: {now:?}"));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Ok(())
        }
    })
    .await;

    // Without the buffer, the spare is idle capacity like any other.
    env.kubectl(["-n", NAMESPACE, "delete", "capacitybuffers.autoscaling.x-k8s.io", "--all"]).expect("delete the buffers");
    let ms = machines.clone();
    eventually("the spare powered off once no buffer keeps it", Duration::from_secs(60), || {
        let (bmcs, ms) = (&bmcs, ms.clone());
        async move {
            let on = bmcs.on(&ms).await;
            if on.is_empty() { Ok(()) } else { Err(format!("on: {on:?}")) }
        }
    })
    .await;
    running.stop().await;
}
