//! CapacityBuffers (`autoscaling.x-k8s.io`) as ServerPool headroom.
//!
//! A buffer asks for room for a number of *chunks*, each the size of a pod
//! template, kept free so that pods of that shape schedule at once. On a
//! bare-metal fleet that room is the headroom of the ServerPool the chunk
//! would be opened in: free capacity on its Ready nodes and warm spares,
//! which scale-down keeps and, when short, restores by powering spares on
//! ([`crate::disruption`]). A buffer adds its chunks' requests to that
//! pool's own headroom; both apply.
//!
//! # Guarantees
//! - A chunk's pool is the one [`crate::provision`] would open a claim in
//!   for it with the whole inventory free: the pool's requirements, labels
//!   and taints and the chunk's selectors, affinity and tolerations decide,
//!   as they do for a pod.
//! - A buffer no server of any pool could host adds nothing, and says why.
//! - Pure: the same snapshot and buffers give the same rooms.

use crate::model::{Health, PowerState, Snapshot};
use crate::outcome::Outcome;
use crate::resources::Resources;
use crate::{Pod, provision};
use serde::{Deserialize, Serialize};

/// A CapacityBuffer resolved to its chunk and how many chunks it keeps.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub namespace: String,
    pub name: String,
    /// One chunk: the pod its template would make.
    pub chunk: Pod,
    pub chunks: u32,
}

/// Where a buffer's room goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Room {
    /// `namespace/name` of the buffer.
    pub buffer: String,
    /// The ServerPool whose headroom holds it; None when no pool can.
    pub pool: Option<String>,
    /// What it adds to that headroom: the chunk's requests times the chunks.
    pub adds: Resources,
    /// Why no pool holds it, when none does.
    pub unplaceable: Option<String>,
}

/// The pool each buffer's chunk would be opened in, and the room it adds.
pub fn rooms(snapshot: &Snapshot, buffers: &[Buffer]) -> Vec<Room> {
    // The whole inventory free and off: where a claim for the chunk would
    // go, whatever runs now.
    let mut empty = Snapshot { pools: snapshot.pools.clone(), daemonsets: snapshot.daemonsets.clone(), ..Default::default() };
    empty.servers = snapshot
        .servers
        .iter()
        .map(|s| {
            let mut s = s.clone();
            s.power_state = PowerState::Off;
            s.health = Health::Healthy;
            s.claim = None;
            s.node = None;
            s.failures = 0;
            s
        })
        .collect();
    buffers
        .iter()
        .map(|b| {
            let buffer = format!("{}/{}", b.namespace, b.name);
            let n = i64::from(b.chunks);
            let each = &b.chunk.requests;
            let adds = Resources {
                cpu_milli: each.cpu_milli.saturating_mul(n),
                memory_bytes: each.memory_bytes.saturating_mul(n),
                ephemeral_bytes: each.ephemeral_bytes.saturating_mul(n),
                pods: 0,
                extended: each.extended.iter().map(|(k, v)| (k.clone(), v.saturating_mul(n))).collect(),
            };
            if b.chunks == 0 {
                return Room { buffer, pool: None, adds, unplaceable: None };
            }
            let mut chunk = b.chunk.clone();
            chunk.node_name = None;
            chunk.phase = crate::PodPhase::Pending;
            let mut trial = empty.clone();
            trial.pods = vec![chunk].into();
            let plan = provision(&trial, 0);
            let pool = plan.claims.first().map(|c| c.pool.clone());
            let unplaceable = match plan.pods.first().map(|d| &d.outcome) {
                Some(Outcome::Unschedulable { reason }) => Some(reason.to_string()),
                _ if pool.is_none() => Some("no ServerPool opens a server for it".to_string()),
                _ => None,
            };
            Room { buffer, pool, adds, unplaceable }
        })
        .collect()
}

/// Adds each room to its pool's headroom.
pub fn apply(snapshot: &mut Snapshot, rooms: &[Room]) {
    for room in rooms {
        let Some(pool) = room.pool.as_deref().and_then(|p| snapshot.pools.iter_mut().find(|x| x.name == p)) else { continue };
        pool.warm.headroom.get_or_insert_with(Resources::default).add(&room.adds);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::labels::{Taint, TaintEffect, Toleration};
    use crate::model::{Server, ServerPool};

    const GI: i64 = 1 << 30;

    fn fleet() -> Snapshot {
        let mut gpu = ServerPool::new("gpu");
        gpu.weight = 10;
        gpu.requirements = vec![crate::Requirement::new("class", crate::Operator::In, &["gpu"])];
        gpu.taints = vec![Taint::new(crate::GPU, "true", TaintEffect::NoSchedule)];
        let mut general = ServerPool::new("general");
        general.requirements = vec![crate::Requirement::new("class", crate::Operator::In, &["general"])];
        general.warm.headroom = Some(Resources::new(2000, 0));
        let mut busy = Server::new("g1", Resources::new(32_000, 128 * GI)).with_labels(&[("class", "general")]);
        busy.power_state = PowerState::On;
        busy.claim = Some("c".into());
        Snapshot {
            pools: vec![gpu, general],
            servers: vec![busy, Server::new("a1", Resources::new(64_000, 256 * GI)).with_labels(&[("class", "gpu")]).with_gpus("A100", 4)],
            ..Default::default()
        }
    }

    fn buffer(name: &str, chunk: Pod, chunks: u32) -> Buffer {
        Buffer { namespace: "ml".into(), name: name.into(), chunk, chunks }
    }

    #[test]
    fn a_chunk_goes_to_the_pool_that_would_open_a_server_for_it() {
        let mut snap = fleet();
        let web = Pod::new("ml", "web", Resources::new(4000, 8 * GI));
        let mut train = Pod::new("ml", "train", Resources::new(8000, 32 * GI).with_extended(crate::GPU, 1));
        train.tolerations.push(Toleration::exists(crate::GPU));
        let rooms = rooms(&snap, &[buffer("web", web, 3), buffer("train", train, 2)]);
        // The general server is claimed now: the buffer's pool is where a
        // claim would go with the inventory free, not where room is today.
        assert_eq!(rooms[0].pool.as_deref(), Some("general"));
        assert_eq!((rooms[0].adds.cpu_milli, rooms[0].adds.memory_bytes, rooms[0].adds.pods), (12_000, 24 * GI, 0));
        assert_eq!(rooms[1].pool.as_deref(), Some("gpu"));
        assert_eq!(rooms[1].adds.extended(crate::GPU), 2);
        apply(&mut snap, &rooms);
        let headroom = |pool: &str| snap.pools.iter().find(|p| p.name == pool).unwrap().warm.headroom.clone().unwrap();
        assert_eq!(headroom("general").cpu_milli, 14_000, "the pool's own 2 CPU and the buffer's 12");
        assert_eq!(headroom("gpu").extended(crate::GPU), 2);
    }

    #[test]
    fn a_chunk_no_server_can_host_adds_nothing_and_says_why() {
        let mut snap = fleet();
        let huge = Pod::new("ml", "huge", Resources::new(512_000, GI));
        let rooms = rooms(&snap, &[buffer("huge", huge.clone(), 1), buffer("none", huge, 0)]);
        assert_eq!(rooms[0].pool, None);
        assert!(rooms[0].unplaceable.as_deref().is_some_and(|w| w.contains("no hardware")), "{rooms:?}");
        assert_eq!((rooms[1].pool.as_deref(), rooms[1].unplaceable.as_deref()), (None, None), "an empty buffer asks for nothing");
        let before = snap.clone();
        apply(&mut snap, &rooms);
        assert_eq!(snap, before);
    }
}
