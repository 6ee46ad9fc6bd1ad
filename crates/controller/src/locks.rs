//! Claim locks: which claim holds which server, kept in ConfigMaps in the
//! controller's namespace (the lock ledger): [`SHARD_COUNT`] shards named
//! `ironclaim-claim-locks-00` to `-31`, each server's lock in the shard its
//! name hashes to ([`shard_of`]).
//!
//! A lock is exclusive because every write to a shard carries the
//! resourceVersion it was computed from: of two controllers writing from
//! one version, the API server takes one write and answers 409 to the
//! other, which reads the shard again and finds the server held. A
//! server's lock lives in one shard only, so this guard on its shard is the
//! whole guarantee; no write spans two shards. An answer that needs no
//! write (held by another claim, already ours) is given from a read of the
//! shard for it, never from a copy kept from earlier.
//!
//! Shards because the API server stores, returns and sends to every
//! watcher the whole object on each write, however small the patch: one
//! ConfigMap under its 1 MiB limit holds some 8,000 locks, and each write
//! near that size moves 800 KB. At 50,000 locks a shard holds about 1,600
//! (160 KB); docs/bench.md has the measured sizes and times. A shard is
//! created by the first take that needs it, never ahead.
//!
//! Within a shard a decision's locks still go together: a lock wanted
//! while a write to its shard is in flight queues, and the next write
//! carries every queued change (a group commit, one writer per shard). A
//! burst of claims costs a few writes per shard instead of one each, and
//! each power-on waits for the write carrying its lock. An entry is about
//! 100 bytes; a shard's data is capped at [`LEDGER_CAP_BYTES`]. A take
//! that would pass the cap is refused on its own
//! ([`Error::ClaimLockFailed`] naming the shard, "the claim lock ledger is
//! full"); the other changes of its write go through.
//!
//! # The single ledger of earlier versions
//! Earlier versions kept every lock in one ConfigMap,
//! [`LEGACY_LEDGER_NAME`]. Its locks still hold: a take of a server locked
//! there is refused (or is "already ours"), reads and the index include
//! them, and giving such a lock up removes its entry there. Nothing is
//! ever added to it, so an entry missing from a copy of it stays missing
//! and a copy serves to find a server free; a take refused on its account
//! is answered from a read of it for that take. An earlier version acting
//! beside this one would lock in it alone, unseen by this one's takes: the
//! leader Lease keeps two replicas from acting at once, and every power-on
//! is fenced by it (docs/safety.md).
//!
//! # Invariant
//! The lock is held at least as long as the Server names the claim: it is
//! taken before `status.claim` is written and given up only after it is
//! cleared. So a server is free exactly when it has neither, and a
//! controller that died between the two writes leaves a lock whose holder
//! the Server does not name: the sweep breaks it once it is older than the
//! opening grace (powering the server off if it never became a node).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use crate::error::{Error, Result};
use ironclaim_k8s::api::Server;

/// How many ConfigMaps the locks are spread over. Every replica and the
/// index must agree on it: changing it moves most servers' locks to
/// another shard.
pub const SHARD_COUNT: usize = 32;
/// The single ConfigMap of earlier versions, still honoured (see the
/// module's docs); also the prefix of the shards' names.
pub const LEGACY_LEDGER_NAME: &str = "ironclaim-claim-locks";
/// The label every ledger ConfigMap carries; the index watches by it.
pub const LEDGER_LABEL: &str = "ironclaim.dev/claim-locks";
/// The most a shard's entries (names and values) may add up to: room
/// under the API server's 1 MiB object limit for its metadata.
pub const LEDGER_CAP_BYTES: usize = 800 * 1024;

// Shard names have two digits.
const _: () = assert!(SHARD_COUNT > 0 && SHARD_COUNT <= 100);

/// The size of a ledger's data, as counted against [`LEDGER_CAP_BYTES`].
pub fn ledger_bytes<'a>(entries: impl IntoIterator<Item = (&'a String, &'a String)>) -> usize {
    entries.into_iter().map(|(k, v)| k.len() + v.len()).sum()
}

/// A 64-bit hash of a server's name that no build, platform or Rust
/// release changes (std's hashers promise no such thing): FNV-1a, then
/// MurmurHash3's final mix. FNV-1a alone spreads badly over a few low
/// bits: a multiplication carries only upwards, so its low five bits
/// depend on nothing but the low five bits of each byte ("r1-u07" and
/// "r1mu07" would share a shard). The final mix brings every bit down.
fn name_hash(name: &str) -> u64 {
    let fnv = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3));
    let mut h = fnv;
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The shard of `server` among `count`.
fn shard_among(server: &str, count: usize) -> usize {
    (name_hash(server) % count as u64) as usize
}

/// The shard holding `server`'s lock, in `0..SHARD_COUNT`.
pub fn shard_of(server: &str) -> usize {
    shard_among(server, SHARD_COUNT)
}

/// The name of shard `shard`'s ConfigMap.
pub fn shard_name(shard: usize) -> String {
    format!("{LEGACY_LEDGER_NAME}-{shard:02}")
}

/// The name of the ConfigMap holding `server`'s lock.
pub fn ledger_of(server: &str) -> String {
    shard_name(shard_of(server))
}

/// Which part of the ledger a ConfigMap is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ledger {
    Shard(usize),
    /// [`LEGACY_LEDGER_NAME`].
    Legacy,
}

impl Ledger {
    /// The ledger a ConfigMap named `name` is, if any.
    pub fn named(name: &str) -> Option<Ledger> {
        if name == LEGACY_LEDGER_NAME {
            return Some(Ledger::Legacy);
        }
        let digits = name.strip_prefix(LEGACY_LEDGER_NAME)?.strip_prefix('-')?;
        if digits.len() != 2 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let shard: usize = digits.parse().ok()?;
        (shard < SHARD_COUNT).then_some(Ledger::Shard(shard))
    }

    /// Whether an entry for `server` found here locks it: in a shard only
    /// if it is the server's (a take looks nowhere else), in the legacy
    /// ledger always.
    pub fn locks(self, server: &str) -> bool {
        match self {
            Ledger::Shard(shard) => shard_of(server) == shard,
            Ledger::Legacy => true,
        }
    }
}

/// The locks of every ledger as one view: a server's lock is its shard's,
/// else the legacy ledger's, the order a take looks in.
pub fn merged(shards: BTreeMap<String, Lock>, legacy: BTreeMap<String, Lock>) -> BTreeMap<String, Lock> {
    let mut all = legacy;
    all.extend(shards);
    all
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

    /// Every lock a ledger ConfigMap holds ([`Ledger::locks`]); nothing
    /// for any other ConfigMap.
    pub fn all_in(ledger: &ConfigMap) -> BTreeMap<String, Lock> {
        let Some(which) = ledger.metadata.name.as_deref().and_then(Ledger::named) else {
            return BTreeMap::new();
        };
        ledger
            .data
            .iter()
            .flatten()
            .filter(|(server, _)| which.locks(server))
            .map(|(server, value)| (server.clone(), Lock::from_entry(server, value)))
            .collect()
    }
}

/// Whether taking a lock made this claim its holder or found it already was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    Now,
    Already,
}

/// One change asked of a shard.
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
    /// A take refused because the shard is at its cap.
    full: bool,
    /// `holder` is the legacy ledger's: the shard holds no lock of the
    /// server.
    legacy: bool,
}

/// Applies `changes` in order to a shard's `entries`, with `legacy` the
/// legacy ledger's (read only: a server locked there is held): the values
/// to write to the shard (None deletes an entry) and each change's
/// outcome. Pure, so the rules are tested without an API server.
fn apply(
    entries: &BTreeMap<String, String>,
    legacy: &BTreeMap<String, String>,
    changes: &[Change],
    now: jiff::Timestamp,
) -> (BTreeMap<String, Option<String>>, Vec<Outcome>) {
    let mut holders: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut writes: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut outcomes = Vec::with_capacity(changes.len());
    let mut bytes = ledger_bytes(entries);
    for change in changes {
        let (server, claim) = match change {
            Change::Take { server, claim } | Change::GiveUp { server, claim } => (server, claim),
        };
        let holder = holders.entry(server.clone()).or_insert_with(|| entries.get(server).map(|v| Lock::from_entry(server, v).holder)).clone();
        let old = legacy.get(server).map(|v| Lock::from_entry(server, v).holder);
        let from_legacy = |old: Option<String>| Outcome { legacy: old.is_some(), holder: old, wrote: false, full: false };
        let outcome = match (change, holder) {
            (Change::Take { .. }, None) if old.is_some() => from_legacy(old),
            (Change::Take { .. }, None) => {
                let lock = Lock { server: server.clone(), holder: claim.clone(), acquired: Some(now) };
                if bytes + lock.bytes() > LEDGER_CAP_BYTES {
                    Outcome { holder: None, wrote: false, full: true, legacy: false }
                } else {
                    bytes += lock.bytes();
                    writes.insert(server.clone(), Some(lock.entry()));
                    holders.insert(server.clone(), Some(claim.clone()));
                    Outcome { holder: Some(claim.clone()), wrote: true, full: false, legacy: false }
                }
            }
            (Change::GiveUp { .. }, Some(h)) if h == *claim => {
                let was = entries.get(server).map_or(0, |v| server.len() + v.len());
                let taken_now = writes.get(server).and_then(|w| w.as_ref()).map_or(0, |v| server.len() + v.len());
                bytes = bytes.saturating_sub(if taken_now > 0 { taken_now } else { was });
                writes.insert(server.clone(), None);
                holders.insert(server.clone(), None);
                Outcome { wrote: true, ..from_legacy(old) }
            }
            (_, Some(h)) => Outcome { holder: Some(h), wrote: false, full: false, legacy: false },
            (Change::GiveUp { .. }, None) => from_legacy(old),
        };
        outcomes.push(outcome);
    }
    (writes, outcomes)
}

/// Whether some take was refused (or found ours) on the legacy ledger's
/// word: such an answer must come from a read of it for this write.
fn rests_on_legacy(changes: &[Change], outcomes: &[Outcome]) -> bool {
    changes.iter().zip(outcomes).any(|(change, outcome)| matches!(change, Change::Take { .. }) && outcome.legacy)
}

const ABANDONED: &str = "the write carrying this change was abandoned";

type Answer = oneshot::Sender<std::result::Result<Outcome, String>>;

/// One ledger ConfigMap and its writer.
struct Writer {
    name: String,
    /// The ConfigMap as last written or read, the base of the next write;
    /// one without a resourceVersion when it did not exist. Holding this
    /// mutex is the writer's turn.
    copy: tokio::sync::Mutex<Option<ConfigMap>>,
    /// Changes waiting for the next write.
    queue: Mutex<Vec<(Change, Answer)>>,
}

impl Writer {
    fn new(name: String) -> Self {
        Writer { name, copy: Default::default(), queue: Default::default() }
    }
}

/// Takes and gives up claim locks in one namespace's ledger.
pub struct Locks {
    api: Api<ConfigMap>,
    namespace: String,
    shards: Vec<Writer>,
    /// The legacy ledger, written only to give its locks up (it is never
    /// asked to take, so never created).
    legacy: Writer,
    /// The legacy ledger's entries as last read (none when it did not
    /// exist); None before the first read.
    legacy_seen: Mutex<Option<Arc<BTreeMap<String, String>>>>,
}

/// How many conflicting writes in a row a batch survives before its
/// changes fail (each conflict means another writer got in first).
const CONFLICT_RETRIES: usize = 8;

/// How many ledger ConfigMaps are read at once.
const READ_CONCURRENCY: usize = 8;

impl Locks {
    pub fn new(client: Client, namespace: &str) -> Self {
        Locks::with_shard_count(client, namespace, SHARD_COUNT)
    }

    /// With `count` shards (1 to 100) instead of [`SHARD_COUNT`], to
    /// measure other shapes: one shard is the single ledger's. The index
    /// and [`Locks::all`] assume [`SHARD_COUNT`], and replicas disagreeing
    /// on the count would lock one server in two shards: a controller uses
    /// [`Locks::new`].
    pub fn with_shard_count(client: Client, namespace: &str, count: usize) -> Self {
        Locks {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            shards: (0..count.clamp(1, 100)).map(|i| Writer::new(shard_name(i))).collect(),
            legacy: Writer::new(LEGACY_LEDGER_NAME.into()),
            legacy_seen: Mutex::default(),
        }
    }

    fn shard(&self, server: &str) -> &Writer {
        &self.shards[shard_among(server, self.shards.len())]
    }

    /// `NAMESPACE/NAME` of a ledger ConfigMap, for messages.
    fn ledger_ref(&self, name: &str) -> String {
        format!("{}/{name}", self.namespace)
    }

    fn failed(&self, ledger: &Writer, server: &str, reason: String) -> Error {
        Error::ClaimLockFailed { server: server.to_string(), ledger: self.ledger_ref(&ledger.name), reason }
    }

    /// A failed read of the ledger ConfigMap `name`, or of their list.
    fn read_failed(&self, name: Option<&str>, source: kube::Error) -> Error {
        let what = match name {
            Some(name) => format!("the claim lock ledger {}", self.ledger_ref(name)),
            None => format!("the claim lock ledger's ConfigMaps in {}", self.namespace),
        };
        Error::ReadFailed { what, source }
    }

    /// Takes the lock of `server` for `claim`.
    ///
    /// # Errors
    /// [`Error::ServerHeld`] when another claim holds it (also in the
    /// legacy ledger); [`Error::ClaimLockFailed`] naming the server's shard
    /// when it could not be written, or is full ([`LEDGER_CAP_BYTES`]).
    pub async fn take(&self, server: &Server, claim: &str) -> Result<Taken> {
        let server = server.name_any();
        let shard = self.shard(&server);
        let change = Change::Take { server: server.clone(), claim: claim.to_string() };
        let outcome = self.submit(shard, change).await.map_err(|r| self.failed(shard, &server, r))?;
        if outcome.full {
            let reason = format!(
                "the claim lock ledger is full: this shard's entries would pass {LEDGER_CAP_BYTES} bytes; no server of this shard is claimed until some of its claims end"
            );
            return Err(self.failed(shard, &server, reason));
        }
        match outcome.holder {
            Some(holder) if holder == claim => Ok(if outcome.wrote { Taken::Now } else { Taken::Already }),
            holder => Err(Error::ServerHeld { server, holder: holder.unwrap_or_default() }),
        }
    }

    /// Gives up the lock of `server` if `claim` holds it (a lock another
    /// claim took since is left alone), in its shard and in the legacy
    /// ledger.
    ///
    /// # Errors
    /// [`Error::ClaimLockFailed`] naming the ledger that could not be
    /// written.
    pub async fn give_up(&self, server: &str, claim: &str) -> Result<()> {
        let shard = self.shard(server);
        let change = Change::GiveUp { server: server.to_string(), claim: claim.to_string() };
        let outcome = self.submit(shard, change.clone()).await.map_err(|r| self.failed(shard, server, r))?;
        if outcome.legacy && outcome.holder.as_deref() == Some(claim) {
            self.submit(&self.legacy, change).await.map_err(|r| self.failed(&self.legacy, server, r))?;
        }
        Ok(())
    }

    /// Every lock as the API holds it now, in every shard and the legacy
    /// ledger ([`merged`]): one list of the ConfigMaps with
    /// [`LEDGER_LABEL`], and a read of the legacy ledger if it lacks it.
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn all(&self) -> Result<BTreeMap<String, Lock>> {
        let listed = self.api.list(&ListParams::default().labels(LEDGER_LABEL)).await.map_err(|e| self.read_failed(None, e))?;
        let (mut shards, mut legacy) = (BTreeMap::new(), None);
        for ledger in listed.items {
            match Ledger::named(&ledger.name_any()) {
                Some(Ledger::Shard(_)) => shards.extend(Lock::all_in(&ledger)),
                Some(Ledger::Legacy) => legacy = Some(ledger),
                None => {}
            }
        }
        if legacy.is_none() {
            legacy = self.api.get_opt(LEGACY_LEDGER_NAME).await.map_err(|e| self.read_failed(Some(LEGACY_LEDGER_NAME), e))?;
        }
        Ok(merged(shards, legacy.as_ref().map(Lock::all_in).unwrap_or_default()))
    }

    /// The lock of `server` as the API holds it now: its shard's, else the
    /// legacy ledger's.
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn read(&self, server: &str) -> Result<Option<Lock>> {
        let shard = &self.shard(server).name;
        let (in_shard, legacy) = futures::join!(self.api.get_opt(shard), self.legacy_entries(true));
        let in_shard = in_shard.map_err(|e| self.read_failed(Some(shard), e))?;
        let legacy = legacy.map_err(|e| self.read_failed(Some(LEGACY_LEDGER_NAME), e))?;
        let value = in_shard.and_then(|l| l.data).and_then(|mut d| d.remove(server)).or_else(|| legacy.get(server).cloned());
        Ok(value.map(|v| Lock::from_entry(server, &v)))
    }

    /// Reads every shard (one that does not exist is remembered as such:
    /// the first take that needs it creates it) and the legacy ledger, as
    /// the bases of the next writes: done when the controller starts
    /// acting, so the first claims wait for one write rather than reads
    /// first. A legacy ledger without [`LEDGER_LABEL`] (made by hand) gets
    /// it, so that the index's watch sees it (a failure there is logged).
    ///
    /// # Errors
    /// [`Error::ReadFailed`] naming the ledger.
    pub async fn prepare(&self) -> Result<()> {
        let reads: Vec<_> = self.shards.iter().map(|shard| self.prepare_shard(shard)).collect();
        let mut reads = futures::stream::iter(reads).buffer_unordered(READ_CONCURRENCY);
        while let Some(read) = reads.next().await {
            read?;
        }
        let legacy = self.api.get_opt(LEGACY_LEDGER_NAME).await.map_err(|e| self.read_failed(Some(LEGACY_LEDGER_NAME), e))?;
        *self.legacy_seen.lock().unwrap_or_else(PoisonError::into_inner) =
            Some(Arc::new(legacy.as_ref().and_then(|l| l.data.clone()).unwrap_or_default()));
        if let Some(legacy) = legacy
            && !legacy.labels().contains_key(LEDGER_LABEL)
        {
            let patch = serde_json::json!({"metadata": {"labels": {LEDGER_LABEL: "true"}}});
            if let Err(error) = self.api.patch(LEGACY_LEDGER_NAME, &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::warn!(%error, ledger = %self.ledger_ref(LEGACY_LEDGER_NAME), "labelling the legacy claim lock ledger failed");
            }
        }
        Ok(())
    }

    async fn prepare_shard(&self, shard: &Writer) -> Result<()> {
        let mut copy = shard.copy.lock().await;
        *copy = Some(self.read_base(&shard.name).await.map_err(|e| self.read_failed(Some(&shard.name), e))?);
        Ok(())
    }

    /// Queues `change` for `ledger` and waits for the write that carries
    /// it. Whoever gets the writer's turn writes everything queued by
    /// then, so changes asked together share one write.
    async fn submit(&self, ledger: &Writer, change: Change) -> std::result::Result<Outcome, String> {
        let (answer, mut answered) = oneshot::channel();
        ledger.queue.lock().unwrap_or_else(PoisonError::into_inner).push((change, answer));
        // Lets the other openings of a decision queue theirs first.
        tokio::task::yield_now().await;
        tokio::select! {
            // Carried by a write that another caller made: no turn needed
            // (waiting for one would hold this caller behind every write).
            answer = &mut answered => return answer.unwrap_or_else(|_| Err(ABANDONED.into())),
            mut copy = ledger.copy.lock() => {
                let batch = std::mem::take(&mut *ledger.queue.lock().unwrap_or_else(PoisonError::into_inner));
                if !batch.is_empty() {
                    self.commit(ledger, &mut copy, batch).await;
                }
            }
        }
        answered.await.unwrap_or_else(|_| Err(ABANDONED.into()))
    }

    /// Writes `batch` to `ledger` in one merge patch on the version it was
    /// computed from (or creates it carrying the batch, if it did not
    /// exist), computing again from a fresh read on a conflict, and
    /// answers each change.
    ///
    /// A batch that writes nothing ("held by another claim", "already
    /// ours", "not ours to give up") is answered only from a read in this
    /// commit: the copy kept from an earlier write may be stale (another
    /// replica led meanwhile, or an operator edited it), and without a write
    /// no resourceVersion would catch that. Likewise a take answered from
    /// the legacy ledger.
    async fn commit(&self, ledger: &Writer, copy: &mut Option<ConfigMap>, batch: Vec<(Change, Answer)>) {
        let (changes, answers): (Vec<Change>, Vec<Answer>) = batch.into_iter().unzip();
        let is_legacy = ledger.name == LEGACY_LEDGER_NAME;
        let mut legacy_read = false;
        let mut result = Err(String::new());
        for _ in 0..CONFLICT_RETRIES {
            let (base, fresh) = match copy.take() {
                Some(base) => (base, false),
                None => match self.read_base(&ledger.name).await {
                    Ok(base) => (base, true),
                    Err(e) => {
                        result = Err(e.to_string());
                        break;
                    }
                },
            };
            let entries = base.data.clone().unwrap_or_default();
            let (writes, outcomes) = match self.apply_with_legacy(is_legacy, &entries, &changes, &mut legacy_read).await {
                Ok(computed) => computed,
                Err(e) => {
                    *copy = Some(base);
                    result = Err(e.to_string());
                    break;
                }
            };
            if writes.is_empty() {
                if !fresh {
                    continue;
                }
                *copy = Some(base);
                result = Ok(outcomes);
                break;
            }
            match self.write(&ledger.name, &base, writes).await {
                Ok(written) => {
                    *copy = Some(written);
                    result = Ok(outcomes);
                    break;
                }
                // Another writer got in first (409, also a create that
                // found the shard made), or the ledger was deleted (404):
                // read it again and recompute.
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

    /// [`apply`] with the legacy ledger as last read, and again with a read
    /// of it when a take's answer rests on it (once per commit:
    /// `legacy_read` says it was done). The legacy ledger's own writes
    /// apply alone.
    async fn apply_with_legacy(
        &self,
        is_legacy: bool,
        entries: &BTreeMap<String, String>,
        changes: &[Change],
        legacy_read: &mut bool,
    ) -> std::result::Result<(BTreeMap<String, Option<String>>, Vec<Outcome>), kube::Error> {
        let now = jiff::Timestamp::now();
        if is_legacy {
            return Ok(apply(entries, &BTreeMap::new(), changes, now));
        }
        let legacy = self.legacy_entries(false).await?;
        let computed = apply(entries, &legacy, changes, now);
        if *legacy_read || !rests_on_legacy(changes, &computed.1) {
            return Ok(computed);
        }
        *legacy_read = true;
        let legacy = self.legacy_entries(true).await?;
        Ok(apply(entries, &legacy, changes, now))
    }

    /// Writes `writes` onto `base`: a merge patch on its resourceVersion,
    /// or, when it did not exist, a create carrying them (of two creators
    /// one gets 409).
    async fn write(&self, name: &str, base: &ConfigMap, writes: BTreeMap<String, Option<String>>) -> std::result::Result<ConfigMap, kube::Error> {
        let labels = [(LEDGER_LABEL.to_string(), "true".to_string())].into();
        match &base.metadata.resource_version {
            Some(version) => {
                // The label rides along, for a shard someone made without it.
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": version, "labels": labels},
                    "data": writes,
                });
                self.api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await
            }
            None => {
                let created = ConfigMap {
                    metadata: ObjectMeta { name: Some(name.into()), labels: Some(labels), ..ObjectMeta::default() },
                    data: Some(writes.into_iter().filter_map(|(server, value)| Some((server, value?))).collect()),
                    ..ConfigMap::default()
                };
                self.api.create(&PostParams::default(), &created).await
            }
        }
    }

    /// The ledger ConfigMap `name` as the API holds it, or one without a
    /// resourceVersion (and no entries) when there is none.
    async fn read_base(&self, name: &str) -> std::result::Result<ConfigMap, kube::Error> {
        let read = self.api.get_opt(name).await?;
        Ok(read.unwrap_or_else(|| ConfigMap { metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() }, ..ConfigMap::default() }))
    }

    /// The legacy ledger's entries: read now when `fresh`, else as last
    /// read (see the module's docs for why a copy serves).
    async fn legacy_entries(&self, fresh: bool) -> std::result::Result<Arc<BTreeMap<String, String>>, kube::Error> {
        if !fresh && let Some(seen) = self.legacy_seen.lock().unwrap_or_else(PoisonError::into_inner).clone() {
            return Ok(seen);
        }
        let read = self.api.get_opt(LEGACY_LEDGER_NAME).await?;
        let entries = Arc::new(read.and_then(|l| l.data).unwrap_or_default());
        *self.legacy_seen.lock().unwrap_or_else(PoisonError::into_inner) = Some(entries.clone());
        Ok(entries)
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

    fn ledger(name: &str, entries: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta { name: Some(name.into()), ..ObjectMeta::default() },
            data: Some(entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..ConfigMap::default()
        }
    }

    #[test]
    fn only_the_ledgers_hold_locks_and_a_shard_only_those_of_its_servers() {
        let shard = shard_name(shard_of("r1-u07"));
        let elsewhere = (0..).map(|i| format!("r9-u{i:02}")).find(|s| shard_of(s) != shard_of("r1-u07")).unwrap();
        let entries = [("r1-u07", "x"), (elsewhere.as_str(), "y")];
        assert!(Lock::all_in(&ledger("other", &entries)).is_empty());
        assert!(Lock::all_in(&ledger(&format!("{LEGACY_LEDGER_NAME}-{SHARD_COUNT}"), &entries)).is_empty());
        let in_shard = Lock::all_in(&ledger(&shard, &entries));
        assert_eq!(in_shard.keys().collect::<Vec<_>>(), ["r1-u07"], "an entry in the wrong shard locks nothing: no take looks there");
        assert_eq!(Lock::all_in(&ledger(LEGACY_LEDGER_NAME, &entries)).len(), 2, "the legacy ledger holds every server's");
    }

    #[test]
    fn ledger_names_are_the_legacy_one_and_two_digit_shards_below_the_count() {
        assert_eq!(Ledger::named("ironclaim-claim-locks"), Some(Ledger::Legacy));
        assert_eq!(Ledger::named("ironclaim-claim-locks-00"), Some(Ledger::Shard(0)));
        assert_eq!(Ledger::named("ironclaim-claim-locks-31"), Some(Ledger::Shard(31)));
        for other in [
            "ironclaim-claim-locks-32",
            "ironclaim-claim-locks-1",
            "ironclaim-claim-locks-001",
            "ironclaim-claim-locks-+1",
            "ironclaim-claim-locksx00",
            "x",
        ] {
            assert_eq!(Ledger::named(other), None, "{other}");
        }
        assert!((0..SHARD_COUNT).all(|i| Ledger::named(&shard_name(i)) == Some(Ledger::Shard(i))));
    }

    /// The shard of a name is part of the stored state: a change here
    /// would strand every lock in a shard no take looks in.
    #[test]
    fn a_servers_shard_never_changes() {
        let shards: Vec<(&str, usize)> =
            ["r1-u07", "r12-u01", "node-00042", "gpu-a100-7", "ironclaim"].into_iter().map(|n| (n, shard_of(n))).collect();
        assert_eq!(shards, [("r1-u07", 6), ("r12-u01", 9), ("node-00042", 2), ("gpu-a100-7", 29), ("ironclaim", 13)]);
        assert_eq!(name_hash("r1-u07"), 0x15fa_4853_0d73_c666);
        assert_eq!(ledger_of("r1-u07"), "ironclaim-claim-locks-06");
    }

    /// The `i`th server's name in a naming scheme.
    type Naming = fn(usize) -> String;

    #[test]
    fn fifty_thousand_servers_spread_over_the_shards_within_ten_percent() {
        let shapes: [(&str, Naming); 3] = [
            ("rack-unit", |i| format!("r{}-u{:02}", i / 40, i % 40)),
            ("numbered", |i| format!("node-{i:05}")),
            ("model", |i| format!("gpu-a100-{i}")),
        ];
        for (shape, name) in shapes {
            let mut counts = [0usize; SHARD_COUNT];
            for i in 0..50_000 {
                counts[shard_of(&name(i))] += 1;
            }
            let mean = 50_000.0 / SHARD_COUNT as f64;
            let (least, most) = (*counts.iter().min().unwrap() as f64, *counts.iter().max().unwrap() as f64);
            assert!(least >= 0.9 * mean && most <= 1.1 * mean, "{shape}: {least}..{most} locks per shard, {mean} on average");
        }
    }

    /// FNV-1a's low bits see only the low bits of each byte: without the
    /// final mix, '-' and 'm' (0x2d, 0x6d) are one symbol to the shard.
    #[test]
    fn names_alike_in_their_low_bits_do_not_share_a_shard() {
        let names: Vec<String> = (0..4000).map(|i| format!("r{}-u{:02}", i / 40, i % 40)).collect();
        let together = names.iter().filter(|n| shard_of(n) == shard_of(&n.replace('-', "m"))).count();
        assert!(together < names.len() / 10, "{together} of {} pairs share a shard", names.len());
    }

    #[test]
    fn a_server_locked_in_the_legacy_ledger_is_held_and_never_taken() {
        let now = jiff::Timestamp::now();
        let old = Lock { server: "a".into(), holder: "c-old".into(), acquired: Some(now) };
        let legacy: BTreeMap<String, String> = [("a".to_string(), old.entry())].into();
        let batch = [take("a", "c1"), give_up("a", "c1"), take("a", "c-old"), take("b", "c2")];
        let (writes, outcomes) = apply(&BTreeMap::new(), &legacy, &batch, now);
        let seen: Vec<(Option<&str>, bool, bool)> = outcomes.iter().map(|o| (o.holder.as_deref(), o.wrote, o.legacy)).collect();
        assert_eq!(
            seen,
            [(Some("c-old"), false, true), (Some("c-old"), false, true), (Some("c-old"), false, true), (Some("c2"), true, false)],
            "held by c-old: refused to c1, not c1's to give up, already c-old's"
        );
        assert_eq!(writes.keys().collect::<Vec<_>>(), ["b"], "nothing of a is written to the shard");
        assert!(rests_on_legacy(&batch, &outcomes));
        assert!(!rests_on_legacy(&batch[1..2], &outcomes[1..2]), "a give-up's answer needs no read of it");
    }

    /// A lock in both (an earlier version acting beside this one) is the
    /// shard's while it holds it; given up there, the legacy one still
    /// holds, and the give-up's outcome points at it.
    #[test]
    fn a_lock_in_the_shard_comes_first_and_the_legacy_one_outlives_it() {
        let now = jiff::Timestamp::now();
        let entry = |holder: &str| Lock { server: "a".into(), holder: holder.into(), acquired: Some(now) }.entry();
        let entries: BTreeMap<String, String> = [("a".to_string(), entry("c-new"))].into();
        let legacy: BTreeMap<String, String> = [("a".to_string(), entry("c-old"))].into();
        let batch = [take("a", "c-new"), give_up("a", "c-new"), take("a", "c-new"), give_up("a", "c-old")];
        let (writes, outcomes) = apply(&entries, &legacy, &batch, now);
        let seen: Vec<(Option<&str>, bool, bool)> = outcomes.iter().map(|o| (o.holder.as_deref(), o.wrote, o.legacy)).collect();
        assert_eq!(seen, [(Some("c-new"), false, false), (Some("c-old"), true, true), (Some("c-old"), false, true), (Some("c-old"), false, true)]);
        assert_eq!(writes, [("a".to_string(), None)].into());
        let merged = merged(
            [("a".to_string(), Lock::from_entry("a", &entry("c-new")))].into(),
            [("a".to_string(), Lock::from_entry("a", &entry("c-old"))), ("b".to_string(), Lock::from_entry("b", &entry("c-b")))].into(),
        );
        let holders: Vec<(&str, &str)> = merged.iter().map(|(s, l)| (s.as_str(), l.holder.as_str())).collect();
        assert_eq!(holders, [("a", "c-new"), ("b", "c-b")]);
    }

    #[test]
    fn a_batch_takes_free_servers_once_and_gives_up_only_its_own() {
        let now = jiff::Timestamp::now();
        let held = Lock { server: "b".into(), holder: "c2".into(), acquired: Some(now) };
        let entries: BTreeMap<String, String> = [("b".to_string(), held.entry())].into();
        let changes = [take("a", "c1"), take("a", "c3"), take("b", "c1"), take("b", "c2"), give_up("b", "c9"), give_up("a", "c1"), take("a", "c3")];
        let (writes, outcomes) = apply(&entries, &BTreeMap::new(), &changes, now);
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
        let (writes, outcomes) = apply(&entries, &BTreeMap::new(), &batch, now);
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
        /// holder, a take wins exactly when its server is free in both the
        /// shard and the legacy ledger, and what is written leads to the
        /// holders the outcomes report; the legacy ledger is only read.
        #[test]
        fn a_batch_agrees_with_a_replay_one_change_at_a_time(start in changes(), old in changes(), batch in changes()) {
            let now = jiff::Timestamp::now();
            let settled = |changes: &[Change]| -> BTreeMap<String, String> {
                let (first, _) = apply(&BTreeMap::new(), &BTreeMap::new(), changes, now);
                first.into_iter().filter_map(|(k, v)| Some((k, v?))).collect()
            };
            let (entries, legacy) = (settled(&start), settled(&old));
            let (writes, outcomes) = apply(&entries, &legacy, &batch, now);
            let holders_in = |ledger: &BTreeMap<String, String>| -> BTreeMap<String, String> {
                ledger.iter().map(|(s, v)| (s.clone(), Lock::from_entry(s, v).holder)).collect()
            };
            let (mut holders, old_holders) = (holders_in(&entries), holders_in(&legacy));
            for (change, outcome) in batch.iter().zip(&outcomes) {
                match change {
                    Change::Take { server, claim } => {
                        let free = !holders.contains_key(server) && !old_holders.contains_key(server);
                        prop_assert_eq!(outcome.wrote, free);
                        if free {
                            holders.insert(server.clone(), claim.clone());
                        }
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
                let holder = holders.get(server).or(old_holders.get(server));
                prop_assert_eq!(outcome.holder.as_ref(), holder);
                prop_assert_eq!(outcome.legacy, !holders.contains_key(server) && old_holders.contains_key(server));
            }
            let mut after = entries.clone();
            for (server, value) in writes {
                match value {
                    Some(v) => after.insert(server, v),
                    None => after.remove(&server),
                };
            }
            prop_assert_eq!(holders_in(&after), holders);
        }
    }
}
