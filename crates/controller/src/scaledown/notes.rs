//! Events on Nodes and Servers: what scale-down did, and why it held back.
//! The same note for the same object and reason is sent once, and a
//! changing note for one object and reason at most once a minute, so a
//! countdown ("idle 3 s of 10 s") does not flood the API.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

use crate::events::Sink;

/// The shortest interval between two different notes of one key.
const NOTE_INTERVAL: Duration = Duration::from_secs(60);
/// Keys remembered at most; the oldest half is forgotten beyond it.
const MAX_KEYS: usize = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Node,
    Server,
    ServerPool,
}

/// The last note sent per (object, reason), and when.
type Sent = HashMap<(String, String), (String, Instant)>;

#[derive(Clone)]
pub struct Notes {
    sink: Option<Sink>,
    last: Arc<Mutex<Sent>>,
    journal: crate::events::Journal,
}

impl Notes {
    pub fn new(sink: Sink, journal: crate::events::Journal) -> Self {
        Notes { sink: Some(sink), last: Arc::default(), journal }
    }

    /// Notes that go nowhere but into `journal`.
    pub fn disabled_into(journal: crate::events::Journal) -> Self {
        Notes { sink: None, last: Arc::default(), journal }
    }

    pub fn disabled() -> Self {
        Notes::disabled_into(crate::events::Journal::default())
    }

    pub async fn normal(&self, kind: Kind, name: &str, reason: &str, note: &str) {
        self.publish(kind, name, reason, note, EventType::Normal).await;
    }

    pub async fn warn(&self, kind: Kind, name: &str, reason: &str, note: &str) {
        self.publish(kind, name, reason, note, EventType::Warning).await;
    }

    async fn publish(&self, kind: Kind, name: &str, reason: &str, note: &str, type_: EventType) {
        tracing::info!(object = %format!("{kind:?}/{name}"), reason, note, "scale-down");
        let key = (format!("{kind:?}/{name}"), reason.to_string());
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((text, at)) = last.get(&key)
                && (text == note || at.elapsed() < NOTE_INTERVAL)
            {
                return;
            }
            if last.len() >= MAX_KEYS {
                let mut ages: Vec<Instant> = last.values().map(|(_, at)| *at).collect();
                ages.sort();
                let cut = ages[ages.len() / 2];
                last.retain(|_, (_, at)| *at > cut);
            }
            last.insert(key.clone(), (note.to_string(), Instant::now()));
        }
        let kind_name = match kind {
            Kind::Node => "Node",
            Kind::Server => "Server",
            Kind::ServerPool => "ServerPool",
        };
        self.journal.record(kind_name, name, reason, note, type_ == EventType::Warning);
        let Some(sink) = &self.sink else { return };
        let reference = match kind {
            Kind::Node => {
                ObjectReference { api_version: Some("v1".into()), kind: Some("Node".into()), name: Some(name.into()), ..Default::default() }
            }
            Kind::Server | Kind::ServerPool => ObjectReference {
                api_version: Some("ironclaim.dev/v1alpha1".into()),
                kind: Some(format!("{kind:?}")),
                name: Some(name.into()),
                ..Default::default()
            },
        };
        let event =
            Event { type_, reason: reason.to_string(), note: Some(note.chars().take(1000).collect()), action: "ScaleDown".into(), secondary: None };
        sink.send(event, reference, Some(crate::events::forget_unsent(self.last.clone(), key, note.to_string(), |(text, _)| text)));
    }
}
