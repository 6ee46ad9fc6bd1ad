//! A pod waiting for an in-place resize is demand at its new size.

use ironclaim_core::*;

const GI: i64 = 1 << 30;

fn resized(node: &str, held_cpu: i64, desired_cpu: i64) -> Pod {
    let mut p = Pod::new("shop", "db-0", Resources::new(held_cpu, 4 * GI)).bound_to(node);
    p.owner = Some(Owner { kind: "StatefulSet".into(), name: "db".into() });
    p.resize = Some(Box::new(Resize {
        desired: Resources::new(desired_cpu, 4 * GI).with_pods(1),
        reason: ResizeReason::Infeasible,
        since_s: 100,
        given: None,
    }));
    p
}

fn snapshot(nodes: Vec<Node>, pods: Vec<Pod>, servers: Vec<Server>) -> Snapshot {
    Snapshot { nodes, pods: pods.into(), servers, pools: vec![ServerPool::new("general")], ..Default::default() }
}

#[test]
fn a_resize_no_ready_node_can_host_opens_a_server_and_says_which_resize() {
    let snap = snapshot(
        vec![Node::new("node-3", Resources::new(8000, 32 * GI))],
        vec![resized("node-3", 4000, 12_000)],
        vec![Server::new("r4-u02", Resources::new(16_000, 64 * GI)), Server::new("r4-u03", Resources::new(8000, 64 * GI))],
    );
    let plan = provision(&snap, 200);
    assert_eq!(plan.pods.len(), 1);
    let d = &plan.pods[0];
    assert_eq!(d.pod, "shop/db-0");
    assert_eq!(d.resize.as_ref().map(ToString::to_string).as_deref(), Some("resize to 12 CPU infeasible on node-3"));
    match &d.outcome {
        Outcome::NewClaim { server, .. } => assert_eq!(server, "r4-u02", "only the 16-core server fits 12 CPU"),
        other => panic!("{other:?}"),
    }
    assert_eq!(plan.claims[0].pods, vec!["shop/db-0".to_string()]);
    assert_eq!(plan.claims[0].requested.cpu_milli, 12_000);
}

#[test]
fn a_resize_another_ready_node_can_host_needs_no_server() {
    let snap = snapshot(
        vec![Node::new("node-3", Resources::new(16_000, 32 * GI)), Node::new("node-5", Resources::new(16_000, 32 * GI))],
        vec![resized("node-3", 4000, 12_000)],
        vec![Server::new("r4-u02", Resources::new(16_000, 64 * GI))],
    );
    let plan = provision(&snap, 200);
    // node-3 has the room on paper, but its kubelet said no: only node-5.
    assert_eq!(plan.pods[0].outcome, Outcome::Existing { node: "node-5".into() });
    assert!(plan.claims.is_empty());
}

#[test]
fn the_resized_pod_still_holds_its_room_where_it_runs() {
    // node-3 has 8 CPU: the pod holds 4 of them, so a pending 6-CPU pod
    // does not fit there and needs a server of its own.
    let mut waiting = Pod::new("shop", "web-0", Resources::new(6000, GI));
    waiting.created_s = 150;
    let snap = snapshot(
        vec![Node::new("node-3", Resources::new(8000, 32 * GI))],
        vec![resized("node-3", 4000, 12_000), waiting],
        vec![Server::new("a", Resources::new(16_000, 64 * GI)), Server::new("b", Resources::new(16_000, 64 * GI))],
    );
    let plan = provision(&snap, 200);
    let web = plan.decision("shop/web-0").unwrap();
    assert!(matches!(web.outcome, Outcome::NewClaim { .. }), "{web:?}");
    assert!(web.resize.is_none());
}

#[test]
fn a_resize_that_no_server_can_hold_says_so() {
    let snap = snapshot(
        vec![Node::new("node-3", Resources::new(8000, 32 * GI))],
        vec![resized("node-3", 4000, 64_000)],
        vec![Server::new("r4-u02", Resources::new(16_000, 64 * GI))],
    );
    let plan = provision(&snap, 200);
    assert!(matches!(&plan.pods[0].outcome, Outcome::Unschedulable { reason: Unschedulable::NoMatchingHardware { .. } }), "{:?}", plan.pods[0]);
}

#[test]
fn scale_down_keeps_the_room_a_resize_is_waiting_for() {
    use ironclaim_core::disruption::{Action, disrupt};
    // node-5 is empty and idle for hours: it is the room the resize waits
    // for, so it is not powered off while another empty node is.
    let mut snap = snapshot(
        vec![
            Node::new("node-3", Resources::new(8000, 32 * GI)),
            Node::new("node-5", Resources::new(16_000, 32 * GI)),
            Node::new("node-6", Resources::new(16_000, 32 * GI)),
        ],
        vec![resized("node-3", 4000, 12_000)],
        Vec::new(),
    );
    for name in ["node-3", "node-5", "node-6"] {
        let mut s = Server::new(name, Resources::new(16_000, 32 * GI));
        s.power_state = PowerState::On;
        s.node = Some(name.into());
        s.idle_since_s = Some(0);
        snap.servers.push(s);
        snap.nodes.iter_mut().find(|n| n.name == name).unwrap().server = Some(name.into());
    }
    let plan = disrupt(&snap, 100_000);
    let drained: Vec<&str> =
        plan.actions.iter().filter_map(|a| if let Action::Drain { node, .. } = a { Some(node.as_str()) } else { None }).collect();
    assert_eq!(drained, vec!["node-6"], "{:?}", plan.actions);
}
