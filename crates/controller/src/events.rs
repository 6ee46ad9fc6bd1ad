//! Events on pods: what a waiting pod waits for, and why a pod cannot be
//! placed, in the words of the core; and the [`Sink`] every Event of the
//! controller leaves through.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as ApiEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType};
use kube::{Api, Client};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;

/// Tries to publish one event this many times.
const PUBLISH_ATTEMPTS: u32 = 3;
/// Events that may wait to be sent; past it, new ones are dropped and
/// counted (`ironclaim_events_dropped_total`).
pub const QUEUED_EVENTS: usize = 4096;
/// Events sent at once.
const SENDING: usize = 4;

/// The client Events leave through, when it is not the controller's.
#[derive(Clone)]
pub struct EventClient(pub Client);

impl std::fmt::Debug for EventClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventClient")
    }
}

/// What to do when an Event could not be sent (so that the same note may
/// be sent again later).
pub type OnFailure = Box<dyn FnOnce() + Send>;

/// What to do when a note could not be sent: forget it in `last` (keyed by
/// object and reason) if it is still the note last sent there, so that
/// the same note may be sent again.
pub fn forget_unsent<V: Send + 'static>(
    last: Arc<Mutex<HashMap<(String, String), V>>>,
    key: (String, String),
    note: String,
    text: fn(&V) -> &str,
) -> OnFailure {
    Box::new(move || {
        let mut last = last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.get(&key).is_some_and(|v| text(v) == note) {
            last.remove(&key);
        }
    })
}

/// The Event `event` about `reference` sent by `controller`/`instance`,
/// as the API stores it: named after the object and the time, in the
/// object's namespace (`default` for cluster-scoped objects).
fn api_event(event: &Event, reference: &ObjectReference, controller: &str, instance: &str, now: jiff::Timestamp) -> ApiEvent {
    let named = reference.name.as_deref().unwrap_or(controller);
    ApiEvent {
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        event_time: Some(MicroTime(now)),
        regarding: Some(reference.clone()),
        related: event.secondary.clone(),
        metadata: ObjectMeta {
            namespace: Some(reference.namespace.clone().unwrap_or_else(|| "default".to_string())),
            name: Some(format!("{named}.{:x}", now.as_nanosecond())),
            ..ObjectMeta::default()
        },
        reporting_controller: Some(controller.to_string()),
        reporting_instance: Some(instance.to_string()),
        type_: Some(match event.type_ {
            EventType::Normal => "Normal".to_string(),
            EventType::Warning => "Warning".to_string(),
        }),
        ..ApiEvent::default()
    }
}

/// A sink's publisher and queue before its task starts.
type Idle = (Publisher, mpsc::Receiver<Queued>);

/// Creates each Event as a new `events.k8s.io/v1` object. It keeps
/// nothing of what it sent: the callers send a note once per object and
/// reason ([`Events`], [`crate::scaledown::Notes`]), so there is no
/// series to fold repeats into, and a fleet's worth of Events is not held
/// in memory for minutes.
#[derive(Clone)]
struct Publisher {
    client: Client,
    controller: String,
    instance: String,
}

impl Publisher {
    async fn publish(&self, event: &Event, reference: &ObjectReference) -> kube::Result<()> {
        let event = api_event(event, reference, &self.controller, &self.instance, jiff::Timestamp::now());
        let namespace = event.metadata.namespace.as_deref().unwrap_or("default");
        Api::<ApiEvent>::namespaced(self.client.clone(), namespace).create(&PostParams::default(), &event).await.map(drop)
    }
}

struct Queued {
    event: Event,
    reference: ObjectReference,
    failed: Option<OnFailure>,
}

/// Where the controller's Events leave: one bounded queue, sent in the
/// background a few at a time. A write never waits for the Event that
/// tells of it, and a burst of Events waits in the queue, not in front of
/// the claims' writes (the client that sends them yields to the
/// controller's, see [`crate::api::ApiLayer::background`]).
#[derive(Clone)]
pub struct Sink {
    queue: mpsc::Sender<Queued>,
    /// The publisher and the queue's far end, until the first Event starts
    /// the task that sends them.
    idle: Arc<Mutex<Option<Idle>>>,
    dropped: Counter,
}

impl Sink {
    /// Events sent through `client` as `controller`/`instance`; those the
    /// queue has no room for counted in `dropped`.
    pub fn new(client: Client, controller: &str, instance: &str, dropped: Counter) -> Self {
        let publisher = Publisher { client, controller: controller.to_string(), instance: instance.to_string() };
        let (queue, rx) = mpsc::channel(QUEUED_EVENTS);
        Sink { queue, idle: Arc::new(Mutex::new(Some((publisher, rx)))), dropped }
    }

    /// Queues one Event; `failed` runs if it is dropped or cannot be sent.
    pub fn send(&self, event: Event, reference: ObjectReference, failed: Option<OnFailure>) {
        if let Some((publisher, rx)) = self.idle.lock().unwrap_or_else(PoisonError::into_inner).take() {
            tokio::spawn(deliver(publisher, rx));
        }
        if let Err(err) = self.queue.try_send(Queued { event, reference, failed }) {
            self.dropped.inc();
            let queued = match err {
                mpsc::error::TrySendError::Full(q) | mpsc::error::TrySendError::Closed(q) => q,
            };
            tracing::debug!(object = ?queued.reference.name, reason = %queued.event.reason, "the Event queue is full; the Event is dropped");
            if let Some(failed) = queued.failed {
                failed();
            }
        }
    }
}

/// Sends what is queued, [`SENDING`] at a time, each tried
/// [`PUBLISH_ATTEMPTS`] times: a busy API server may time out.
async fn deliver(publisher: Publisher, rx: mpsc::Receiver<Queued>) {
    let queued = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|q| (q, rx)) });
    queued
        .for_each_concurrent(SENDING, |q| {
            let publisher = publisher.clone();
            async move {
                for attempt in 1..=PUBLISH_ATTEMPTS {
                    match publisher.publish(&q.event, &q.reference).await {
                        Ok(()) => return,
                        Err(err) if attempt == PUBLISH_ATTEMPTS => {
                            tracing::warn!(object = ?q.reference.name, error = %err, "publishing an event failed");
                            if let Some(failed) = q.failed {
                                failed();
                            }
                            return;
                        }
                        Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200 * u64::from(attempt))).await,
                    }
                }
            }
        })
        .await;
}

/// The last Events this controller sent, newest last, for the dashboard.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<std::collections::VecDeque<Recorded>>>);

/// One Event as the journal keeps it.
#[derive(Clone, Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    /// Seconds since the epoch.
    pub at: u64,
    /// `Pod`, `Node`, `Server` or `ServerPool`.
    pub kind: &'static str,
    /// `NAMESPACE/NAME` for a pod, else the name.
    pub object: String,
    pub reason: String,
    pub note: String,
    pub warning: bool,
}

impl Journal {
    /// How many Events it keeps.
    pub const KEPT: usize = 50;

    pub fn record(&self, kind: &'static str, object: &str, reason: &str, note: &str, warning: bool) {
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() >= Journal::KEPT {
            kept.pop_front();
        }
        kept.push_back(Recorded {
            at,
            kind,
            object: object.to_string(),
            reason: reason.to_string(),
            note: note.chars().take(300).collect(),
            warning,
        });
    }

    /// The Events kept, newest first.
    pub fn newest_first(&self) -> Vec<Recorded> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).iter().rev().cloned().collect()
    }
}

/// Publishes Events; the same note for the same pod and reason is sent once.
#[derive(Clone)]
pub struct Events {
    sink: Option<Sink>,
    last: Arc<Mutex<HashMap<(String, String), String>>>,
    journal: Journal,
}

impl Events {
    pub fn new(sink: Sink, journal: Journal) -> Self {
        Events { sink: Some(sink), last: Arc::default(), journal }
    }

    /// Events that go nowhere (benchmarks) but into `journal`.
    pub fn disabled_into(journal: Journal) -> Self {
        Events { sink: None, last: Arc::default(), journal }
    }

    /// Events that go nowhere.
    pub fn disabled() -> Self {
        Events::disabled_into(Journal::default())
    }

    pub async fn pod(&self, namespace: &str, name: &str, uid: Option<&str>, reason: &str, note: &str) {
        self.publish(namespace, name, uid, reason, note, EventType::Normal).await;
    }

    pub async fn warn(&self, namespace: &str, name: &str, uid: Option<&str>, reason: &str, note: &str) {
        self.publish(namespace, name, uid, reason, note, EventType::Warning).await;
    }

    async fn publish(&self, namespace: &str, name: &str, uid: Option<&str>, reason: &str, note: &str, type_: EventType) {
        let key = (format!("{namespace}/{name}"), reason.to_string());
        {
            let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
            if last.get(&key).map(String::as_str) == Some(note) {
                return;
            }
            last.insert(key.clone(), note.to_string());
        }
        self.journal.record("Pod", &key.0, reason, note, type_ == EventType::Warning);
        let Some(sink) = &self.sink else { return };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            namespace: Some(namespace.to_string()),
            name: Some(name.to_string()),
            uid: uid.map(str::to_string),
            ..ObjectReference::default()
        };
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: "Provisioning".into(),
            secondary: None,
        };
        sink.send(event, reference, Some(forget_unsent(self.last.clone(), key, note.to_string(), String::as_str)));
    }

    /// Forgets pods that are gone, so the memory stays bounded.
    pub fn retain_pods(&self, alive: impl Fn(&str) -> bool) {
        self.last.lock().unwrap_or_else(PoisonError::into_inner).retain(|(pod, _), _| alive(pod));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_a_new_object_in_its_objects_namespace_saying_who_sent_it() {
        let event =
            Event { type_: EventType::Warning, reason: "Held".into(), note: Some("in use".into()), action: "ScaleDown".into(), secondary: None };
        let server = ObjectReference { kind: Some("Server".into()), name: Some("rack1-s01".into()), ..ObjectReference::default() };
        let at = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let sent = api_event(&event, &server, "ironclaim", "pod-a", at);
        assert_eq!(sent.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(sent.metadata.name, Some(format!("rack1-s01.{:x}", at.as_nanosecond())));
        assert_eq!((sent.reason.as_deref(), sent.note.as_deref(), sent.type_.as_deref()), (Some("Held"), Some("in use"), Some("Warning")));
        assert_eq!((sent.reporting_controller.as_deref(), sent.reporting_instance.as_deref()), (Some("ironclaim"), Some("pod-a")));
        assert_eq!(sent.regarding.as_ref(), Some(&server));
        assert!(sent.series.is_none());
        let pod = ObjectReference { namespace: Some("team".into()), name: Some("web-0".into()), ..ObjectReference::default() };
        let later = api_event(&event, &pod, "ironclaim", "pod-a", at + jiff::SignedDuration::from_micros(1));
        assert_eq!(later.metadata.namespace.as_deref(), Some("team"));
        assert_ne!(later.metadata.name, sent.metadata.name.map(|n| n.replace("rack1-s01", "web-0")));
    }

    #[test]
    fn the_journal_keeps_the_last_events_newest_first() {
        let journal = Journal::default();
        for i in 0..(Journal::KEPT + 5) {
            journal.record("Server", &format!("s{i}"), "SparePoweredOn", "floor 1", false);
        }
        let kept = journal.newest_first();
        assert_eq!(kept.len(), Journal::KEPT);
        assert_eq!(kept[0].object, format!("s{}", Journal::KEPT + 4));
        assert_eq!(kept.last().map(|r| r.object.as_str()), Some("s5"));
    }
}
