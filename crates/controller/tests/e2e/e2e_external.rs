//! The external provider end to end: a Server whose `spec.provider` names
//! an external provider is powered on and off by the controller running
//! that provider's command, on the real control plane. The command is a
//! real shell script speaking the contract of docs/providers.md; it keeps
//! the machine's power in a file. A small stand-in plays the machine
//! behind it: a server whose file says On registers a kwok Node (with the
//! system UUID the script reports) after a boot delay, and loses it when
//! the file says Off.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::*;
use ironclaim_controller::{Controller, ExternalPower, Metal3Power, ProviderRouter};
use ironclaim_k8s::api::server::PowerState;
use ironclaim_testenv::eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const UUID: &str = "4c4c4544-0031-3010-8030-b4c04f4e3132";

/// The provider: power in `state-NAME`, every action logged in `log`.
const SCRIPT: &str = r#"#!/bin/sh
set -eu
dir="$(dirname "$0")"
request="$(cat)"
name="$IRONCLAIM_SERVER"
case "$request" in *'"address":"10.0.9.7"'*) ;; *) printf '{"error": {"reason": "BmcConfigInvalid", "message": "no address parameter"}}'; exit 1 ;; esac
case "$1" in
  status) printf '{"powerState": "%s", "watts": 212, "identity": {"systemUUID": "%s"}}' "$(cat "$dir/state-$name" 2>/dev/null || echo Off)" "$UUID" ;;
  power-on) echo "$1 $name" >> "$dir/log"; sleep 1; echo On > "$dir/state-$name"; printf '{"powerState": "On"}' ;;
  power-off) echo "$1 $name" >> "$dir/log"; echo Off > "$dir/state-$name"; printf '{}' ;;
  *) exit 2 ;;
esac
"#;

/// Plays the machine: a Node while the state file says On, after `boot`.
fn machine(client: Client, dir: PathBuf, server: &'static str, boot: Duration) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(client);
        let mut on_since: Option<Instant> = None;
        let mut registered = false;
        loop {
            let on = std::fs::read_to_string(dir.join(format!("state-{server}"))).is_ok_and(|s| s.trim() == "On");
            if on {
                let since = *on_since.get_or_insert_with(Instant::now);
                if !registered && since.elapsed() >= boot {
                    let mut node = existing_node(server, 16, 32, &[], 0, &[]);
                    node["metadata"]["labels"]["ironclaim.dev/server"] = json!(server);
                    node["status"]["nodeInfo"] = json!({
                        "systemUUID": UUID, "machineID": "m", "bootID": "b", "kernelVersion": "6.1.0-amd64", "osImage": "Debian",
                        "containerRuntimeVersion": "containerd://2", "kubeletVersion": "v1.37.2", "kubeProxyVersion": "",
                        "operatingSystem": "linux", "architecture": "amd64"
                    });
                    let node: Node = serde_json::from_value(node).expect("node");
                    registered = matches!(nodes.create(&PostParams::default(), &node).await, Ok(_) | Err(kube::Error::Api(_)));
                }
            } else {
                on_since = None;
                if registered {
                    let _ = nodes.delete(server, &DeleteParams::default()).await;
                    registered = false;
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

fn actions(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("log")).unwrap_or_default().lines().map(str::to_string).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_pod_powers_a_server_on_through_an_external_command_and_idle_power_off_runs_it_again() {
    let (env, client) = setup().await;
    let dir = std::env::temp_dir().join(format!("ironclaim-e2e-external-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let script = dir.join("provider.sh");
    std::fs::write(&script, SCRIPT.replace("\"$UUID\"", &format!("\"{UUID}\""))).expect("script");
    let file = dir.join("providers.yaml");
    std::fs::write(&file, format!("providers:\n- name: shell\n  command: [/bin/sh, {}]\n  timeout: 20s\n  pollInterval: 200ms\n", script.display()))
        .expect("providers file");
    let external = ExternalPower::load(&file).unwrap_or_else(|e| panic!("{e}"));

    // The API server types spec.provider.external.
    let refused = [
        (json!({"type": "External"}), "external is required when type is External, and only then"),
        (
            json!({"type": "Metal3", "metal3": {"namespace": "h", "name": "x"}, "external": {"name": "shell"}}),
            "external is required when type is External",
        ),
        (json!({"type": "External", "external": {"name": "Shell_1"}}), "spec.provider.external.name"),
    ];
    for (i, (provider, want)) in refused.into_iter().enumerate() {
        let s = json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": format!("ext-invalid-{i}")},
            "spec": {"provider": provider, "hardware": {"cpu": "1", "memory": "1Gi"}}
        });
        let err = env.kubectl_with_stdin(["apply", "-f", "-"], &s.to_string()).expect_err(&format!("{provider} accepted"));
        assert!(err.to_string().contains(want), "{provider}: want {want:?}, got {err}");
    }

    apply(
        &env,
        &json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
            "metadata": {"name": "ext-1"},
            "spec": {
                "provider": {"type": "External", "external": {"name": "shell", "parameters": {"address": "10.0.9.7"}}},
                "hardware": {"cpu": "16", "memory": "32Gi"},
                "labels": {"e2e.ironclaim.dev/pool": "ext", "ironclaim.dev/class": "external"},
                // Break-even: 50 W x 15 s / 150 W = 5 s idle before powering off.
                "power": {"idleWatts": 150, "peakWatts": 400, "bootWatts": 50, "offWatts": 0},
                "stageDurations": {"powerOn": "12s", "boot": "3s", "join": "2s", "ready": "3s", "tailPercent": 150}
            }
        }),
    );
    apply(&env, &labelled_pool("ext"));
    let playing = machine(client.clone(), dir.clone(), "ext-1", Duration::from_secs(1));
    let power = Arc::new(ProviderRouter {
        redfish: redfish(&client),
        metal3: Arc::new(Metal3Power::new(client.clone(), Duration::from_secs(20))),
        external: Arc::new(external),
        cluster_api: Arc::new(ironclaim_controller::ClusterApiPower::new(client.clone(), Duration::from_secs(20))),
    });
    let port = free_port();
    let mut settings = settings("external");
    settings.metrics_address = Some(([127, 0, 0, 1], port).into());
    let controller = Controller::new(client.clone(), power, settings);
    let metrics = controller.metrics();
    let running = run(controller);

    let created = Instant::now();
    apply(&env, &pod("ext-app", "8", "8Gi", &[], 0));
    let c = client.clone();
    eventually("the pod bound to the externally powered server", Duration::from_secs(45), || {
        let c = c.clone();
        async move { bound(&c, "ext-app").await }
    })
    .await;
    let bound_after = created.elapsed();
    assert_eq!(pod_node(&client, "ext-app").await.as_deref(), Some("ext-1"));
    assert_eq!(actions(&dir), ["power-on ext-1"], "one power-on, through the command");

    served_claim(&client, "ext-1").await;

    // The sweep reads power, watts and identity through the command.
    let c = client.clone();
    eventually("the sweep reads the provider's power, watts and identity", Duration::from_secs(10), || {
        let c = c.clone();
        async move {
            let s = server(&c, "ext-1").await.status.unwrap_or_default();
            let uuid = s.identity.as_ref().and_then(|i| i.system_uuid.clone());
            if s.power_state == Some(PowerState::On) && s.watts == Some(212) && uuid.as_deref() == Some(UUID) {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        }
    })
    .await;

    // The dashboard shows what the API holds: the server on and serving.
    assert!(http_get(port, "/ui").await.expect("the page").contains("ironclaim: the rack"));
    let tile = dashboard_tile(port, "ext-1").await;
    assert_eq!((tile.0.as_str(), tile.1.as_str()), ("on", "serving"), "power and tile of ext-1 on /ui/state");

    // The workload leaves: after break-even the idle server is powered off
    // by the command.
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    pods.delete("ext-app", &DeleteParams::default().grace_period(0)).await.expect("delete pod");
    let emptied = Instant::now();
    let c = client.clone();
    let d = dir.clone();
    eventually("the server powered off by the command and read Off", Duration::from_secs(60), || {
        let (c, d) = (c.clone(), d.clone());
        async move {
            let s = server(&c, "ext-1").await.status.unwrap_or_default();
            if actions(&d).len() == 2 && s.power_state == Some(PowerState::Off) { Ok(()) } else { Err(format!("{:?}, {s:?}", actions(&d))) }
        }
    })
    .await;
    let off_after = emptied.elapsed();
    assert_eq!(actions(&dir), ["power-on ext-1", "power-off ext-1"]);
    let tile = dashboard_tile(port, "ext-1").await;
    assert_eq!((tile.0.as_str(), tile.1.as_str()), ("off", "off"), "the dashboard follows the API");
    let text = metrics.render();
    assert!(!text.contains("ironclaim_power_failures_total{"), "{text}");
    println!("external: pod bound {bound_after:?} after creation; server powered off {off_after:?} after the pod left");
    running.stop().await;
    playing.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// The inventory's power and the tile's state of `server` on the running
/// controller's `/ui/state` (read again after its one-second cache).
async fn dashboard_tile(port: u16, server: &str) -> (String, String) {
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let body = http_get(port, "/ui/state").await.expect("/ui/state answers");
    let state: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let at = state["tiles"].as_array().expect("tiles").iter().position(|t| t["name"] == server).expect("a tile for the server");
    (state["inventory"]["servers"][at]["power"].as_str().unwrap_or_default().into(), state["tiles"][at]["state"].as_str().unwrap_or_default().into())
}
