//! A node with a volume still attached is drained but not powered off:
//! the power-off is refused, said on the node's server, and asked again
//! with a growing wait; once the volume is detached it goes off.

use std::time::Duration;

use crate::scaledown_support::*;
use crate::support::*;
use ironclaim_controller::Controller;
use ironclaim_testenv::eventually;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_still_attached_keeps_the_power_on_until_it_is_detached() {
    let (env, client) = setup().await;
    let pool = "sd-vol";
    let machines = machines("sd-vol", pool, 2, 1);
    let attached = machines[0].name.clone();
    clean(&env, &client, &machines, pool).await;
    let _ = env.kubectl(["delete", "volumeattachment", "sd-vol-va", "--ignore-not-found"]);
    apply_pool(&env, pool, 0, json!({"budgets": [{"nodes": "100%"}]}));
    let (sushy, _harness) = powered_fleet(&env, &client, &machines, 10).await;
    // A CSI attacher's record of a volume on the first node; nothing
    // detaches it here, as nothing would while its writes are in flight.
    apply(
        &env,
        &json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "VolumeAttachment",
            "metadata": {"name": "sd-vol-va"},
            "spec": {"attacher": "csi.example.com", "nodeName": attached, "source": {"persistentVolumeName": "sd-vol-pv"}}
        }),
    );

    let controller = Controller::new(client.clone(), redfish(&client), settings("sd-vol"));
    let running = run(controller);
    let bmcs = Bmcs::new(&sushy);
    let (bm, free) = (&bmcs, machines[1].clone());
    eventually("the other empty server powered off", Duration::from_secs(40), || async {
        if bm.is_on(&free).await == Some(false) { Ok(()) } else { Err(format!("{} still on", free.name)) }
    })
    .await;
    let c = client.clone();
    let said = eventually("the refusal said", Duration::from_secs(30), || {
        let (c, attached) = (c.clone(), attached.clone());
        async move {
            let mut events = object_events(&c, "Server", &attached).await;
            events.extend(object_events(&c, "Node", &attached).await);
            match events.into_iter().find(|e| e.contains("volume sd-vol-pv") && e.contains("VolumeAttachment sd-vol-va")) {
                Some(e) => Ok(e),
                None => Err("no event names the volume".to_string()),
            }
        }
    })
    .await;
    assert!(said.starts_with("PowerOffFailed:"), "{said}");
    sleep_s(4).await;
    assert_eq!(bmcs.is_on(&machines[0]).await, Some(true), "powered off with a volume attached");

    env.kubectl(["delete", "volumeattachment", "sd-vol-va"]).expect("delete the attachment");
    let (bm, first) = (&bmcs, machines[0].clone());
    eventually("the detached server powered off", Duration::from_secs(60), || async {
        if bm.is_on(&first).await == Some(false) { Ok(()) } else { Err(format!("{} still on", first.name)) }
    })
    .await;
    running.stop().await;
    clean(&env, &client, &machines, pool).await;
}
