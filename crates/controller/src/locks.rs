//! Claim locks: which claim holds which server, kept in one ConfigMap (the
//! lock ledger, [`LEDGER_NAME`]) in the controller's namespace.
//!
//! A lock is exclusive because every write to the ledger carries the
//! resourceVersion it was computed from: of two controllers writing from
//! one version, the API server takes one write and answers 409 to the
//! other, which reads the ledger again and finds the server held. An
//! answer that needs no write (held by another claim, already ours) is
//! given from a ledger read for it, never from a copy kept from earlier.
//!
//! One object, not one per server, because a decision takes its locks
//! together: a lock wanted while a write is in flight queues, and the next
//! write carries every queued change (a group commit). A burst of claims
//! costs a few writes instead of one each, and each power-on waits for the
//! write carrying its lock. An entry is about 100 bytes; the ledger's data
//! is capped at [`LEDGER_CAP_BYTES`] (some 8,000 locks), under the API
//! server's 1 MiB object limit. A take that would pass the cap is refused
//! on its own ([`Error::ClaimLockFailed`], "the claim lock ledger is
//! full"); the other changes of its write go through.
//!
//! # Invariant
//! The lock is held at least as long as the Server names the claim: it is
//! taken before `status.claim` is written and given up only after it is
//! cleared. So a server is free exactly when it has neither, and a
//! controller that died between the two writes leaves a lock whose holder
//! the Server does not name: the sweep breaks it once it is older than the
//! opening grace (powering the server off if it never became a node).

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use ironclaim_k8s::api::Server;

/// The ConfigMap holding every claim lock of a controller's namespace.
pub const LEDGER_NAME: &str = "ironclaim-claim-locks";
/// The label the ledger carries, for operators' selectors.
pub const LEDGER_LABEL: &str = "ironclaim.dev/claim-locks";
/// The most the ledger's entries (names and values) may add up to: room
/// under the API server's 1 MiB object limit for its metadata.
pub const LEDGER_CAP_BYTES: usize = 800 * 1024;

/// The size of a ledger's data, as counted against [`LEDGER_CAP_BYTES`].
pub fn ledger_bytes<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> usize {
    entries.into_iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A lock as the index holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct Lock {
    pub server: String,
    pub holder: String,
    /// When it was taken.
    pub acquired: Option<jiff::Timestamp>,
}

/// A ledger entry's value, keyed by the server's name.
#[derive(Serialize, Deserialize)]
struct Entry {
    holder: String,
    /// RFC 3339, to the microsecond.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    acquired: Option<String>,
}

impl Lock {
    /// The lock a ledger entry records. An entry that is not ours to read
    /// (edited by hand) still locks its server: its whole value is taken
    /// as the holder, with no time, so the sweep breaks it unless the
    /// server names that holder.
    pub fn from_entry(server: &str, value: &str) -> Lock {
        match serde_json::from_str::<Entry>(value) {
            Ok(e) => Lock { server: server.to_string(), holder: e.holder, acquired: e.acquired.and_then(|t| t.parse().ok()) },
            Err(_) => Lock { server: server.to_string(), holder: value.to_string(), acquired: None },
        }
    }

    fn entry(&self) -> String {
        let acquired = self.acquired.map(|t| t.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string());
        let entry = Entry { holder: self.holder.clone(), acquired };
        serde_json::to_string(&entry).unwrap_or_else(|_| self.holder.clone())
    }

    /// The bytes this lock takes in the ledger.
    pub fn bytes(&self) -> usize {
        self.server.len() + self.entry().len()
    }

    /// Every lock a ledger holds (nothing for any other ConfigMap).
    pub fn all_in(ledger: &ConfigMap) -> BTreeMap<String, Lock> {
        if ledger.metadata.name.as_deref() != Some(LEDGER_NAME) {
            return BTreeMap::new();
        }
        ledger.data.iter().flatten().map(|(server, value)| (server.clone(), Lock::from_entry(server, value))).collect()
    }
}

/// Whether taking a lock made this claim its holder or found it already was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    Now,
    Already,
}

/// One change asked of the ledger.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Change {
    /// Take `server` for `claim` unless another claim holds it.
    Take { server: String, claim: String },
    /// Give up `server` if `claim` holds it.
    GiveUp { server: String, claim: String },
}

/// What a change found: the holder of its server after it, and whether
/// the change is what made it so.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Outcome {
    holder: Option<String>,
    wrote: bool,
    /// A take refused because the ledger is at its cap.
    full: bool,
}

/// Applies `changes` in order to the ledger's `entries`: the values to
/// write (None deletes an entry) and each change's outcome. Pure, so the
/// rules are tested without an API server.
fn apply(entries: &BTreeMap<String, String>, changes: &[Change], now: jiff::Timestamp) -> (BTreeMap<String, Option<String>>, Vec<Outcome>) {
    let mut holders: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut writes: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut outcomes = Vec::with_capacity(changes.len());
    let mut bytes = ledger_bytes(entries);
    for change in changes {
        let (server, claim) = match change {
            Change::Take { server, claim } | Change::GiveUp { server, claim } => (server, claim),
        };
        let holder = holders.entry(server.clone()).or_insert_with(|| entries.get(server).map(|v| Lock::from_entry(server, v).holder)).clone();
        let outcome = match (change, holder) {
            (Change::Take { .. }, None) => {
                let lock = Lock { server: server.clone(), holder: claim.clone(), acquired: Some(now) };
                if bytes + lock.bytes() > LEDGER_CAP_BYTES {
                    Outcome { holder: None, wrote: false, full: true }
                } else {
                    bytes += lock.bytes();
                    writes.insert(server.clone(), Some(lock.entry()));
                    holders.insert(server.clone(), Some(claim.clone()));
                    Outcome { holder: Some(claim.clone()), wrote: true, full: false }
                }
            }
            (Change::GiveUp { .. }, Some(h)) if h == *claim => {
                let was = entries.get(server).map_or(0, |v| server.len() + v.len());
                let taken_now = writes.get(server).and_then(|w| w.as_ref()).map_or(0, |v| server.len() + v.len());
                bytes = bytes.saturating_sub(if taken_now > 0 { taken_now } else { was });
                writes.insert(server.clone(), None);
                holders.insert(server.clone(), None);
                Outcome { holder: None, wrote: true, full: false }
            }
            (_, holder) => Outcome { holder, wrote: false, full: false },
        };
        outcomes.push(outcome);
    }
    (writes, outcomes)
}

const ABANDONED: &str = "the write carrying this change was abandoned";

type Answer = oneshot::Sender<std::result::Result<Outcome, String>>;

/// Takes and gives up claim locks in one namespace's ledger.
pub struct Locks {
    api: Api<ConfigMap>,
    namespace: String,
    /// The ledger as last written or read, the base of the next write;
    /// holding this mutex is a writer's turn.
    ledger: tokio::sync::Mutex<Option<ConfigMap>>,
    /// Changes waiting for the next write.
    queue: Mutex<Vec<(Change, Answer)>>,
}

/// How many conflicting writes in a row a batch survives before its
/// changes fail (each conflict means another writer got in first).
const CONFLICT_RETRIES: usize = 8;

impl Locks {
    pub fn new(client: Client, namespace: &str) -> Self {
        Locks { api: Api::namespaced(client, namespace), namespace: namespace.to_string(), ledger: Default::default(), queue: Default::default() }
    }

    /// `NAMESPACE/NAME` of the ledger, for messages.
    fn ledger_ref(&self) -> String {
        format!("{}/{LEDGER_NAME}", self.namespace)
    }

    fn failed(&self, server: &str, reason: String) -> Error {
        Error::ClaimLockFailed { server: server.to_string(), ledger: self.ledger_ref(), reason }
    }

    fn read_failed(&self, source: kube::Error) -> Error {
        Error::ReadFailed { what: format!("the claim lock ledger {}", self.ledger_ref()), source }
    }

    /// Takes the lock of `server` for `claim`.
    ///
    /// # Errors
    /// [`Error::ServerHeld`] when another claim holds it;
    /// [`Error::ClaimLockFailed`] when the ledger could not be written, or
    /// is full ([`LEDGER_CAP_BYTES`]).
    pub async fn take(&self, server: &Server, claim: &str) -> Result<Taken> {
        let server = server.name_any();
        let outcome = self.submit(Change::Take { server: server.clone(), claim: claim.to_string() }).await.map_err(|r| self.failed(&server, r))?;
        if outcome.full {
            let reason =
                format!("the claim lock ledger is full: its entries would pass {LEDGER_CAP_BYTES} bytes; no server is claimed until claims end");
            return Err(self.failed(&server, reason));
        }
        match outcome.holder {
            Some(holder) if holder == claim => Ok(if outcome.wrote { Taken::Now } else { Taken::Already }),
            holder => Err(Error::ServerHeld { server, holder: holder.unwrap_or_default() }),
        }
    }

    /// Gives up the lock of `server` if `claim` holds it (a lock another
    /// claim took since is left alone).
    ///
    /// # Errors
    /// [`Error::ClaimLockFailed`] when the ledger could not be written.
    pub async fn give_up(&self, server: &str, claim: &str) -> Result<()> {
        self.submit(Change::GiveUp { server: server.to_string(), claim: claim.to_string() }).await.map_err(|r| self.failed(server, r))?;
        Ok(())
    }

    /// Every lock as the API holds it now (none without a ledger).
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn all(&self) -> Result<BTreeMap<String, Lock>> {
        let ledger = self.api.get_opt(LEDGER_NAME).await.map_err(|e| self.read_failed(e))?;
        Ok(ledger.as_ref().map(Lock::all_in).unwrap_or_default())
    }

    /// The lock of `server` as the API holds it now.
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn read(&self, server: &str) -> Result<Option<Lock>> {
        Ok(self.all().await?.remove(server))
    }

    /// Reads the ledger, creating it if it is missing, as the base of the
    /// next write: done when the controller starts acting, so the first
    /// claims wait for one write rather than a read, a create and a write.
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn prepare(&self) -> Result<()> {
        let mut ledger = self.ledger.lock().await;
        *ledger = Some(self.read_or_create().await.map_err(|e| self.read_failed(e))?);
        Ok(())
    }

    /// Queues `change` and waits for the write that carries it. Whoever
    /// gets the writer's turn writes everything queued by then, so changes
    /// asked together share one write.
    async fn submit(&self, change: Change) -> std::result::Result<Outcome, String> {
        let (answer, mut answered) = oneshot::channel();
        self.queue.lock().unwrap_or_else(PoisonError::into_inner).push((change, answer));
        // Lets the other openings of a decision queue theirs first.
        tokio::task::yield_now().await;
        tokio::select! {
            // Carried by a write that another caller made: no turn needed
            // (waiting for one would hold this caller behind every write).
            answer = &mut answered => return answer.unwrap_or_else(|_| Err(ABANDONED.into())),
            mut ledger = self.ledger.lock() => {
                let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
                if !batch.is_empty() {
                    self.commit(&mut ledger, batch).await;
                }
            }
        }
        answered.await.unwrap_or_else(|_| Err(ABANDONED.into()))
    }

    /// Writes `batch` to the ledger in one merge patch on the version it
    /// was computed from, computing again from a fresh read on a conflict,
    /// and answers each change.
    ///
    /// A batch that writes nothing ("held by another claim", "already
    /// ours", "not ours to give up") is answered only from a ledger read in
    /// this commit: the copy kept from an earlier write may be stale (another
    /// replica led meanwhile, or an operator edited it), and without a write
    /// no resourceVersion would catch that.
    async fn commit(&self, ledger: &mut Option<ConfigMap>, batch: Vec<(Change, Answer)>) {
        let (changes, answers): (Vec<Change>, Vec<Answer>) = batch.into_iter().unzip();
        let mut result = Err(String::new());
        for _ in 0..CONFLICT_RETRIES {
            let (base, fresh) = match ledger.take() {
                Some(base) => (base, false),
                None => match self.read_or_create().await {
                    Ok(base) => (base, true),
                    Err(e) => {
                        result = Err(e.to_string());
                        break;
                    }
                },
            };
            let entries = base.data.clone().unwrap_or_default();
            let (writes, outcomes) = apply(&entries, &changes, jiff::Timestamp::now());
            if writes.is_empty() {
                if !fresh {
                    continue;
                }
                *ledger = Some(base);
                result = Ok(outcomes);
                break;
            }
            let patch = serde_json::json!({
                "metadata": {"resourceVersion": base.metadata.resource_version},
                "data": writes,
            });
            match self.api.patch(LEDGER_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(written) => {
                    *ledger = Some(written);
                    result = Ok(outcomes);
                    break;
                }
                // Another writer got in first (409), or the ledger was
                // deleted (404): read it again and recompute.
                Err(kube::Error::Api(status)) if status.code == 409 || status.code == 404 => {
                    result = Err(format!("{} writes in a row conflicted; the last: {}", CONFLICT_RETRIES, status.message));
                }
                Err(e) => {
                    result = Err(e.to_string());
                    break;
                }
            }
        }
        match result {
            Ok(outcomes) => {
                for (answer, outcome) in answers.into_iter().zip(outcomes) {
                    let _ = answer.send(Ok(outcome));
                }
            }
            Err(reason) => {
                for answer in answers {
                    let _ = answer.send(Err(reason.clone()));
                }
            }
        }
    }

    async fn read_or_create(&self) -> std::result::Result<ConfigMap, kube::Error> {
        if let Some(ledger) = self.api.get_opt(LEDGER_NAME).await? {
            return Ok(ledger);
        }
        let empty = ConfigMap {
            metadata: ObjectMeta {
                name: Some(LEDGER_NAME.into()),
                labels: Some([(LEDGER_LABEL.to_string(), "true".to_string())].into()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        };
        match self.api.create(&PostParams::default(), &empty).await {
            Err(kube::Error::Api(status)) if status.code == 409 => self.api.get(LEDGER_NAME).await,
            created => created,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn take(server: &str, claim: &str) -> Change {
        Change::Take { server: server.into(), claim: claim.into() }
    }
    fn give_up(server: &str, claim: &str) -> Change {
        Change::GiveUp { server: server.into(), claim: claim.into() }
    }

    #[test]
    fn an_entry_round_trips_and_a_hand_written_one_still_locks() {
        let at: jiff::Timestamp = "2026-11-30T12:00:00.123456Z".parse().unwrap();
        let lock = Lock { server: "r1-u07".into(), holder: "gpu-r1-u07-x".into(), acquired: Some(at) };
        assert_eq!(Lock::from_entry("r1-u07", &lock.entry()), lock);
        let odd = Lock::from_entry("r1-u07", "someone");
        assert_eq!((odd.holder.as_str(), odd.acquired), ("someone", None));
    }

    #[test]
    fn only_the_ledger_holds_locks() {
        let mut cm = ConfigMap {
            metadata: ObjectMeta { name: Some("other".into()), ..ObjectMeta::default() },
            data: Some([("r1-u01".to_string(), "x".to_string())].into()),
            ..ConfigMap::default()
        };
        assert!(Lock::all_in(&cm).is_empty());
        cm.metadata.name = Some(LEDGER_NAME.into());
        assert_eq!(Lock::all_in(&cm)["r1-u01"].holder, "x");
    }

    #[test]
    fn a_batch_takes_free_servers_once_and_gives_up_only_its_own() {
        let now = jiff::Timestamp::now();
        let held = Lock { server: "b".into(), holder: "c2".into(), acquired: Some(now) };
        let entries: BTreeMap<String, String> = [("b".to_string(), held.entry())].into();
        let changes = [take("a", "c1"), take("a", "c3"), take("b", "c1"), take("b", "c2"), give_up("b", "c9"), give_up("a", "c1"), take("a", "c3")];
        let (writes, outcomes) = apply(&entries, &changes, now);
        let seen: Vec<(Option<&str>, bool)> = outcomes.iter().map(|o| (o.holder.as_deref(), o.wrote)).collect();
        assert_eq!(
            seen,
            [
                (Some("c1"), true),
                (Some("c1"), false),
                (Some("c2"), false),
                (Some("c2"), false),
                (Some("c2"), false),
                (None, true),
                (Some("c3"), true)
            ]
        );
        assert_eq!(writes.keys().collect::<Vec<_>>(), ["a"], "b untouched");
        assert_eq!(Lock::from_entry("a", writes["a"].as_deref().unwrap()).holder, "c3");
    }

    #[test]
    fn a_take_past_the_ledgers_cap_is_refused_alone_and_a_give_up_makes_room() {
        let now = jiff::Timestamp::now();
        let one = Lock { server: "r1-u00001".into(), holder: "general-r1-u00001-abcde".into(), acquired: Some(now) }.bytes();
        let room = LEDGER_CAP_BYTES / one;
        let entries: BTreeMap<String, String> = (0..room - 1)
            .map(|i| {
                let lock = Lock { server: format!("r1-u{i:05}"), holder: format!("general-r1-u{i:05}-abcde"), acquired: Some(now) };
                (lock.server.clone(), lock.entry())
            })
            .collect();
        assert!(ledger_bytes(&entries) + one <= LEDGER_CAP_BYTES);
        let last = format!("r1-u{:05}", room - 1);
        let batch = [
            take(&last, &format!("general-{last}-abcde")),
            take("r9-u99999", "general-r9-u99999-abcde"),
            give_up("r1-u00000", "general-r1-u00000-abcde"),
            take("r9-u99999", "general-r9-u99999-abcde"),
        ];
        let (writes, outcomes) = apply(&entries, &batch, now);
        let seen: Vec<(bool, bool)> = outcomes.iter().map(|o| (o.wrote, o.full)).collect();
        assert_eq!(seen, [(true, false), (false, true), (true, false), (true, false)], "the full take alone is refused; the rest land");
        assert_eq!(writes.len(), 3);
        let after: BTreeMap<String, String> = entries
            .into_iter()
            .chain(writes.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))))
            .filter(|(k, _)| writes.get(k) != Some(&None))
            .collect();
        assert!(ledger_bytes(&after) <= LEDGER_CAP_BYTES, "{} bytes", ledger_bytes(&after));
    }

    fn changes() -> impl Strategy<Value = Vec<Change>> {
        let change = (0..4usize, 0..4usize, any::<bool>()).prop_map(|(s, c, t)| {
            let (server, claim) = (format!("s{s}"), format!("c{c}"));
            if t { Change::Take { server, claim } } else { Change::GiveUp { server, claim } }
        });
        proptest::collection::vec(change, 0..24)
    }

    proptest! {
        /// Checked against a plain replay: each server has at most one
        /// holder, a take wins exactly when its server is free, and what
        /// is written leads to the holders the outcomes report.
        #[test]
        fn a_batch_agrees_with_a_replay_one_change_at_a_time(start in changes(), batch in changes()) {
            let now = jiff::Timestamp::now();
            let (first, _) = apply(&BTreeMap::new(), &start, now);
            let entries: BTreeMap<String, String> = first.into_iter().filter_map(|(k, v)| Some((k, v?))).collect();
            let (writes, outcomes) = apply(&entries, &batch, now);
            let mut holders: BTreeMap<String, String> =
                entries.iter().map(|(s, v)| (s.clone(), Lock::from_entry(s, v).holder)).collect();
            for (change, outcome) in batch.iter().zip(&outcomes) {
                match change {
                    Change::Take { server, claim } => {
                        let free = !holders.contains_key(server);
                        prop_assert_eq!(outcome.wrote, free);
                        holders.entry(server.clone()).or_insert_with(|| claim.clone());
                    }
                    Change::GiveUp { server, claim } => {
                        let ours = holders.get(server) == Some(claim);
                        prop_assert_eq!(outcome.wrote, ours);
                        if ours {
                            holders.remove(server);
                        }
                    }
                }
                let server = match change { Change::Take { server, .. } | Change::GiveUp { server, .. } => server };
                prop_assert_eq!(outcome.holder.as_ref(), holders.get(server));
            }
            let mut after = entries.clone();
            for (server, value) in writes {
                match value {
                    Some(v) => after.insert(server, v),
                    None => after.remove(&server),
                };
            }
            let written: BTreeMap<String, String> = after.iter().map(|(s, v)| (s.clone(), Lock::from_entry(s, v).holder)).collect();
            prop_assert_eq!(written, holders);
        }
    }
}
