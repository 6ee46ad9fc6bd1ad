//! The driver's effects carried out against the Kubernetes API and the
//! power provider, each answered (when the driver asks for an answer) with
//! a [`Report`] on a channel the control loop reads.
//!
//! What an effect needs from the cluster (the server's BMC, the claim's
//! waiting pods, the node) is copied out of the index when the effect is
//! handed over; what must be fresh is read from the API by the step that
//! acts on it ([`Claims::power_off`] reads the server and lists the node's
//! pods again).
//!
//! # Guarantees
//! - Power actions, reads and takes run each as their own task, so a slow
//!   BMC holds up nothing else, and concurrent takes share one write of
//!   the lock ledger; at most `open_concurrency` takes run at once.
//! - The other effects of one batch (stage and status writes, events) that
//!   touch the same claim, server or node run in order in one task: a node
//!   is linked before its claim records it joined, a stage is written
//!   before the measurements it ended. Writes about different objects run
//!   side by side, at most [`WRITES_IN_FLIGHT`] tasks at once, so a burst
//!   of claims is not written one after another.
//! - Every task stops when the loop aborts them (the lease was lost); the
//!   provider refuses any action that reaches it after that anyway
//!   ([`crate::leader::FencedPower`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ironclaim_driver::{ClaimRecord, Effect, Eviction, FailureReason, PowerFailure, Report};
use ironclaim_k8s::api::{Server, ServerClaim, ServerPool};
use k8s_openapi::api::core::v1::Node;
use tokio::sync::Semaphore;
use tokio::sync::mpsc::UnboundedSender;
use tokio::task::JoinSet;

use crate::claims::{Claims, PodKey};
use crate::index::Index;
use crate::scaledown::drain::{self, Evicted};
use crate::scaledown::notes::{Kind, Notes};

/// A write with what it needs copied out of the index. The copies are
/// boxed: most writes (notes) carry none, and a burst queues thousands.
struct WriteJob {
    effect: Effect,
    pods: Vec<PodKey>,
    /// The claim the effect names, as the index holds it.
    claim: Option<Box<ServerClaim>>,
    server: Option<Arc<Server>>,
    node: Option<Box<Node>>,
    pool: Option<Box<ServerPool>>,
    subject: Option<Kind>,
}

impl WriteJob {
    /// The write of `effect`, with nothing copied out of the index yet.
    fn of(effect: Effect) -> Self {
        WriteJob { effect, pods: Vec::new(), claim: None, server: None, node: None, pool: None, subject: None }
    }
}

/// Tasks of writes that run at once (each carries one group of
/// [`write_groups`] in order).
pub const WRITES_IN_FLIGHT: usize = 16;

/// What a write touches, as keys: the claim, server and node it names or
/// carries.
fn touches(job: &WriteJob) -> Vec<String> {
    let mut keys = Vec::new();
    let mut claim = |c: &str| keys.push(format!("claim/{c}"));
    match &job.effect {
        Effect::EnterStage { claim: c, .. } | Effect::FailClaim { claim: c, .. } | Effect::DeleteClaim { claim: c } => claim(c),
        Effect::LinkNode { claim: c, server, node, .. } => {
            claim(c);
            keys.push(format!("server/{server}"));
            keys.push(format!("node/{node}"));
        }
        Effect::Release { server, claim: c, .. } => {
            claim(c);
            keys.push(format!("server/{server}"));
        }
        Effect::Measure { server, .. } | Effect::RecordIdle { server, .. } => keys.push(format!("server/{server}")),
        Effect::ParkNode { node, server } => {
            keys.push(format!("node/{node}"));
            keys.push(format!("server/{server}"));
        }
        Effect::Cordon { node, .. }
        | Effect::Uncordon { node, .. }
        | Effect::KeepCordoned { node }
        | Effect::DeleteNode { node }
        | Effect::Mark { node, .. } => keys.push(format!("node/{node}")),
        // A note's subject is `claim NAME`, or a server or node by name:
        // it goes after the writes about it.
        Effect::Note { subject, .. } => match subject.strip_prefix("claim ") {
            Some(name) => claim(name),
            None => {
                keys.push(format!("server/{subject}"));
                keys.push(format!("node/{subject}"));
            }
        },
        Effect::TakeServer { .. } | Effect::PowerOn { .. } | Effect::PowerOff { .. } | Effect::ReadPower { .. } | Effect::Evict { .. } => {}
    }
    if let Some(s) = &job.server {
        keys.push(format!("server/{}", kube::ResourceExt::name_any(&**s)));
    }
    if let Some(n) = &job.node {
        keys.push(format!("node/{}", kube::ResourceExt::name_any(&**n)));
    }
    keys
}

/// The writes of one batch in groups: two writes that touch a claim,
/// server or node in common are in the same group, in the order given.
fn write_groups(writes: Vec<WriteJob>) -> Vec<Vec<WriteJob>> {
    // Union-find over the writes, joined through the keys they touch.
    let mut parent: Vec<usize> = (0..writes.len()).collect();
    fn root(parent: &mut [usize], mut i: usize) -> usize {
        while parent[i] != i {
            parent[i] = parent[parent[i]];
            i = parent[i];
        }
        i
    }
    let mut first: HashMap<String, usize> = HashMap::new();
    for (i, job) in writes.iter().enumerate() {
        for key in touches(job) {
            let j = *first.entry(key).or_insert(i);
            let (a, b) = (root(&mut parent, i), root(&mut parent, j));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut groups: Vec<Vec<WriteJob>> = Vec::new();
    let mut slot: HashMap<usize, usize> = HashMap::new();
    for (i, job) in writes.into_iter().enumerate() {
        let r = root(&mut parent, i);
        let g = *slot.entry(r).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(job);
    }
    groups
}

/// An effect with what it needs copied out of the index.
enum Prepared {
    Take { claim: Box<ClaimRecord>, uids: HashMap<String, String>, server: Option<Arc<Server>> },
    PowerOn { server: Option<Arc<Server>>, name: String, claim: Option<String>, pods: Vec<PodKey> },
    ReadPower { server: Option<Arc<Server>>, name: String },
    PowerOff { server: String, claim: Option<String>, node: Option<String> },
    Evict { node: String, pod: String, cordon: Option<tokio::sync::watch::Receiver<Option<bool>>> },
    Write(WriteJob),
}

/// Carries out effects. Cheap to share.
#[derive(Clone)]
pub struct Executor {
    claims: Arc<Claims>,
    index: Arc<Mutex<Index>>,
    notes: Notes,
    reports: UnboundedSender<Report>,
    /// The pods of each claim being taken, until its power-on is handed
    /// over: the index may not hold the new ServerClaim by then.
    opening: Arc<Mutex<HashMap<String, Vec<PodKey>>>>,
    /// Takes under way at once are bounded by its permits.
    takes: Arc<Semaphore>,
    /// Groups of writes under way at once are bounded by its permits.
    writes: Arc<Semaphore>,
    /// Cordons handed over and not yet written (None), or failed
    /// (Some(false)), by node: an eviction waits for its node's, and none
    /// is sent from a node that could not be cordoned, so nothing new
    /// lands where pods leave. Written ones are dropped.
    cordons: Arc<Mutex<HashMap<String, tokio::sync::watch::Sender<Option<bool>>>>>,
    /// One eviction request, at most.
    eviction_timeout: std::time::Duration,
    /// `controller --dry-run`: see [`Executor::dry`].
    dry_run: bool,
    /// Under a dry run, what each subject was told and when: the same
    /// words are told again only after [`DRY_RUN_RETELL`].
    told: Arc<Mutex<HashMap<(String, String), std::time::Instant>>>,
}

/// How long a dry run waits before it tells a subject the same again.
const DRY_RUN_RETELL: std::time::Duration = std::time::Duration::from_secs(600);

/// Under a dry run, the notes that would tell of actions not taken.
const UNTRUE_IN_A_DRY_RUN: [&str; 6] = ["Draining", "DrainWaiting", "DrainAbandoned", "Drained", "ServerClaimed", "WaitingForServer"];

/// The pods of a claim still waiting for a node, as events address them.
fn waiting_pods(index: &Index, claim: &str) -> Vec<PodKey> {
    let Some(c) = index.claims.get(claim) else { return Vec::new() };
    c.spec
        .pods
        .iter()
        .filter(|p| {
            index
                .pods
                .get(&format!("{}/{}", p.namespace, p.name))
                .is_some_and(|e| e.pod.is_pending_demand() && (p.uid.is_none() || e.pod.uid.is_none() || p.uid == e.pod.uid))
        })
        .map(|p| (p.namespace.clone(), p.name.clone(), p.uid.clone()))
        .collect()
}

fn claim_server<'a>(index: &'a Index, claim: &str) -> Option<&'a Arc<Server>> {
    index.servers.get(&index.claims.get(claim)?.spec.server)
}

/// What a dry run makes of one effect.
enum DryRun {
    /// A read, or a note that stays true: carried out.
    Pass(Effect),
    /// A write told of by nothing, or a note of an action not taken.
    Drop,
    /// An action not taken: its count (none when empty), the `DryRun`
    /// notes that tell of it, and the answer the driver gets.
    Told { action: &'static str, told: Vec<Effect>, answer: Option<Report> },
}

/// The dry run of one effect: see [`Executor::dry`].
fn dry_run_of(effect: Effect) -> DryRun {
    let note = |subject: &str, message: String| Effect::Note { subject: subject.to_string(), reason: "DryRun", message, warning: false };
    let not_sent = || "dry run: not sent".to_string();
    let (action, told, answer) = match effect {
        // The mark is not written: its note tells what would be.
        Effect::Note { subject, reason: "Emptying", message, .. } => {
            let message = format!("dry run: would mark {}:PreferNoSchedule: {message}", ironclaim_driver::Mark::Emptying.taint());
            ("", vec![note(&subject, message)], None)
        }
        Effect::Note { reason, .. } if UNTRUE_IN_A_DRY_RUN.contains(&reason) => return DryRun::Drop,
        Effect::Note { .. } | Effect::ReadPower { .. } => return DryRun::Pass(effect),
        Effect::TakeServer { claim } if claim.pods.is_empty() => {
            let message = format!("dry run: would claim server {} as a warm spare and power it on to be a Ready node", claim.server);
            ("claim", vec![note(&claim.server, message)], Some(Report::Held { claim: claim.name, holder: "dry-run".into() }))
        }
        Effect::TakeServer { claim } => {
            let message =
                format!("dry run: would claim server {} and power it on for {} pod(s): {}", claim.server, claim.pods.len(), claim.pods.join(", "));
            let told = claim.pods.iter().chain([&claim.server]).map(|s| note(s, message.clone())).collect();
            ("claim", told, Some(Report::Held { claim: claim.name, holder: "dry-run".into() }))
        }
        Effect::PowerOn { server, .. } => {
            let told = vec![note(&server, "dry run: would power on (a warm spare)".into())];
            let failure = PowerFailure { reason: FailureReason::PowerActionFailed, message: not_sent() };
            ("power_on", told, Some(Report::PoweredOn { server, result: Err(failure) }))
        }
        Effect::PowerOff { server, node, .. } => {
            let after = node.map(|n| format!(" once node {n} is drained")).unwrap_or_default();
            let told = vec![note(&server, format!("dry run: would power off{after}"))];
            ("power_off", told, Some(Report::PoweredOff { server, result: Ok(()), refused: Some(not_sent()) }))
        }
        Effect::Cordon { node, reason } => ("drain", vec![note(&node, format!("dry run: would cordon and drain ({reason})"))], None),
        Effect::Evict { node, pod } => ("", Vec::new(), Some(Report::Evicted { node, pod, answer: Eviction::Blocked(not_sent()) })),
        other => {
            tracing::debug!(effect = ?other, "dry run: not carried out");
            return DryRun::Drop;
        }
    };
    DryRun::Told { action, told, answer }
}

impl Executor {
    /// At most `open_concurrency` takes run at once.
    pub fn new(claims: Arc<Claims>, index: Arc<Mutex<Index>>, notes: Notes, reports: UnboundedSender<Report>, open_concurrency: usize) -> Self {
        let takes = Arc::new(Semaphore::new(open_concurrency.max(1)));
        let eviction_timeout = drain::DrainSettings::default().attempt_timeout;
        Executor {
            claims,
            index,
            notes,
            reports,
            opening: Arc::default(),
            takes,
            writes: Arc::new(Semaphore::new(WRITES_IN_FLIGHT)),
            cordons: Arc::default(),
            eviction_timeout,
            dry_run: false,
            told: Arc::default(),
        }
    }

    /// Carries out nothing that changes the world: see [`Executor::dry`].
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// A dry run's effects: each action that would change the world (a
    /// claim, a power-on or power-off, a drain) becomes a `DryRun` Event on
    /// what it concerns, a log line and a count, and is answered as not
    /// done, so the driver goes on deciding from the world as it is. Reads
    /// and notes pass, but for the notes of actions that were not taken;
    /// every other write is dropped.
    fn dry(&self, effects: Vec<Effect>) -> Vec<Effect> {
        let mut out = Vec::new();
        for effect in effects {
            let (action, told, answer) = match dry_run_of(effect) {
                DryRun::Pass(effect) => {
                    out.push(effect);
                    continue;
                }
                DryRun::Drop => continue,
                DryRun::Told { action, told, answer } => (action, told, answer),
            };
            if !action.is_empty() {
                self.claims.metrics().dry_run_action(action);
            }
            // Counted each time; told (Event and log line) once per
            // DRY_RUN_RETELL while the words stay the same.
            let mut last = self.told.lock().unwrap_or_else(PoisonError::into_inner);
            let now = std::time::Instant::now();
            last.retain(|_, at| now.duration_since(*at) < DRY_RUN_RETELL);
            let mut logged = false;
            for t in told {
                if let Effect::Note { subject, message, .. } = &t {
                    let key = (subject.clone(), message.clone());
                    if last.contains_key(&key) {
                        continue;
                    }
                    last.insert(key, now);
                    if !logged {
                        tracing::info!(%subject, action, "{message}");
                        logged = true;
                    }
                }
                out.push(t);
            }
            drop(last);
            if let Some(report) = answer {
                self.answer(report);
            }
        }
        out
    }

    /// Each eviction request waits at most `timeout` for its answer.
    pub fn with_eviction_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.eviction_timeout = timeout;
        self
    }

    fn prepare(&self, index: &Index, effect: Effect) -> Prepared {
        let write = Prepared::Write;
        match effect {
            Effect::TakeServer { claim } => {
                let uids: HashMap<String, String> =
                    claim.pods.iter().filter_map(|k| Some((k.clone(), index.pods.get(k)?.pod.uid.clone()?))).collect();
                let pods = claim
                    .pods
                    .iter()
                    .map(|k| {
                        let (namespace, name) = k.split_once('/').unwrap_or(("default", k));
                        (namespace.to_string(), name.to_string(), uids.get(k).cloned())
                    })
                    .collect();
                self.opening.lock().unwrap_or_else(PoisonError::into_inner).insert(claim.name.clone(), pods);
                let server = index.servers.get(&claim.server).cloned();
                Prepared::Take { claim: Box::new(claim), uids, server }
            }
            Effect::PowerOn { server, claim } => {
                let opened = claim.as_deref().and_then(|c| self.opening.lock().unwrap_or_else(PoisonError::into_inner).remove(c));
                let pods = match (&claim, opened) {
                    (Some(c), _) if index.claims.contains_key(c) => waiting_pods(index, c),
                    (_, opened) => opened.unwrap_or_default(),
                };
                Prepared::PowerOn { server: index.servers.get(&server).cloned(), name: server, claim, pods }
            }
            Effect::ReadPower { server } => Prepared::ReadPower { server: index.servers.get(&server).cloned(), name: server },
            Effect::PowerOff { server, claim, node } => Prepared::PowerOff { server, claim, node },
            Effect::Evict { node, pod } => {
                let cordon = self.cordons.lock().unwrap_or_else(PoisonError::into_inner).get(&node).map(|tx| tx.subscribe());
                Prepared::Evict { node, pod, cordon }
            }
            Effect::Cordon { ref node, .. } => {
                let (tx, _) = tokio::sync::watch::channel(None);
                self.cordons.lock().unwrap_or_else(PoisonError::into_inner).insert(node.clone(), tx);
                write(WriteJob::of(effect))
            }
            Effect::EnterStage { ref claim, .. } | Effect::FailClaim { ref claim, .. } => {
                let (pods, server, known) =
                    (waiting_pods(index, claim), claim_server(index, claim).cloned(), index.claims.get(claim).cloned().map(Box::new));
                write(WriteJob { pods, claim: known, server, ..WriteJob::of(effect) })
            }
            Effect::LinkNode { ref server, ref node, ref pool, .. } => write(WriteJob {
                server: index.servers.get(server).cloned(),
                node: index.nodes.get(node).cloned(),
                pool: index.pools.get(pool).cloned().map(Box::new),
                ..WriteJob::of(effect)
            }),
            Effect::Note { ref subject, reason, .. } => {
                // A drain's notes are about its node, which may be gone by
                // the last of them (a machine powered off deregisters).
                let drain = matches!(reason, "Draining" | "DrainWaiting" | "Drained" | "DrainAbandoned" | "ConsolidationProposed");
                let kind = if drain || index.nodes.contains_key(subject) { Kind::Node } else { Kind::Server };
                write(WriteJob { subject: Some(kind), ..WriteJob::of(effect) })
            }
            other => write(WriteJob::of(other)),
        }
    }

    /// Hands the effects over: each power action, read and take to a task
    /// of its own, the rest to one task that carries them out in order.
    pub fn execute(&self, effects: Vec<Effect>, tasks: &mut JoinSet<()>) {
        let effects = if self.dry_run { self.dry(effects) } else { effects };
        if effects.is_empty() {
            return;
        }
        let prepared: Vec<Prepared> = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            effects.into_iter().map(|e| self.prepare(&index, e)).collect()
        };
        let mut writes = Vec::new();
        for p in prepared {
            let this = self.clone();
            match p {
                Prepared::Take { claim, uids, server } => {
                    tasks.spawn(this.run_take(claim, uids, server));
                }
                Prepared::PowerOn { server, name, claim, pods } => {
                    tasks.spawn(async move {
                        let spare = claim.is_none();
                        let report = match this.power_target(server, &name, spare).await {
                            Ok(server) => this.claims.power_on(server, &pods).await,
                            Err(failure) => Report::PoweredOn { server: name, result: Err(failure) },
                        };
                        if spare {
                            this.spare_powered_on(&report).await;
                        }
                        this.answer(report);
                    });
                }
                Prepared::ReadPower { server, name } => {
                    tasks.spawn(async move {
                        let report = match this.power_target(server, &name, false).await {
                            Ok(server) => this.claims.read_power(server).await,
                            Err(failure) => Report::PowerRead { server: name, result: Err(failure) },
                        };
                        this.answer(report);
                    });
                }
                Prepared::PowerOff { server, claim, node } => {
                    tasks.spawn(async move {
                        let report = this.power_off(&server, claim.as_deref(), node.as_deref()).await;
                        this.answer(report);
                    });
                }
                Prepared::Evict { node, pod, cordon } => {
                    tasks.spawn(async move {
                        // Nothing is evicted from a node whose cordon failed:
                        // the drain asks again, and is abandoned past its timeout.
                        let cordoned = match cordon {
                            Some(mut written) => written.wait_for(Option::is_some).await.is_ok_and(|done| *done == Some(true)),
                            None => true,
                        };
                        let answer = if cordoned { this.evict(&pod).await } else { Eviction::Failed(format!("node {node} could not be cordoned")) };
                        this.answer(Report::Evicted { node, pod, answer });
                    });
                }
                Prepared::Write(job) => writes.push(job),
            }
        }
        for group in write_groups(writes) {
            tasks.spawn(self.clone().run_group(group));
        }
    }

    /// A take, in its turn among [`Executor::takes`]. The take's own
    /// state (some 12 KB) is made only once its turn comes, so the takes
    /// of a burst wait as small tasks.
    async fn run_take(self, claim: Box<ClaimRecord>, uids: HashMap<String, String>, server: Option<Arc<Server>>) {
        // Never closed: a permit is always granted in turn.
        let _permit = self.takes.acquire().await;
        let report = Box::pin(self.claims.take(&claim, &uids, server.map(Arc::unwrap_or_clone))).await;
        let taken = matches!(report, Report::Taken { newly: true, .. });
        if !taken {
            self.opening.lock().unwrap_or_else(PoisonError::into_inner).remove(&claim.name);
        }
        if claim.pods.is_empty() {
            // A spare brought up as a node: its claim's path powers it on.
            self.claims.metrics().scaledown.action("power_on", "spare", if taken { "done" } else { "claimed" });
        }
        self.answer(report);
    }

    /// One group of writes, in order, in its turn among
    /// [`Executor::writes`]. Each write's state (some 17 KB) is made only
    /// when it runs: a burst's thousands of groups wait as small tasks.
    async fn run_group(self, group: Vec<WriteJob>) {
        // Never closed: a permit is always granted in turn.
        let _permit = self.writes.acquire().await;
        for w in group {
            Box::pin(self.write(w)).await;
        }
    }

    /// Drops what was kept for takes under way (their tasks were aborted:
    /// the lease was lost).
    pub fn forget(&self) {
        self.opening.lock().unwrap_or_else(PoisonError::into_inner).clear();
    }

    /// A power-off: checked fresh by [`Claims::power_off`]. A spare's or a
    /// drained node's is then confirmed off by reading the power back, and
    /// the state recorded on the server; a spare's is counted.
    async fn power_off(&self, server: &str, claim: Option<&str>, node: Option<&str>) -> Report {
        let report = self.claims.power_off(server, claim, node).await;
        let scale_down = claim.is_none() || node.is_some();
        if !scale_down {
            return report;
        }
        let report = match report {
            Report::PoweredOff { server, result: Ok(()), refused: None } => {
                let result = self.confirm(&server, ironclaim_k8s::api::server::PowerState::Off).await;
                Report::PoweredOff { server, result, refused: None }
            }
            other => other,
        };
        if node.is_none() {
            let outcome = match &report {
                Report::PoweredOff { result: Ok(()), refused: None, .. } => "done",
                Report::PoweredOff { refused: Some(_), .. } => "refused",
                _ => "power_off_failed",
            };
            self.claims.metrics().scaledown.action("power_off", "idle", outcome);
        }
        report
    }

    /// A spare's power-on: recorded on the server, and counted. A failed
    /// one leaves the power Unknown, for the sweep to read again.
    async fn spare_powered_on(&self, report: &Report) {
        use ironclaim_k8s::api::server::PowerState;
        let Report::PoweredOn { server, result } = report else { return };
        let (outcome, state) = match result {
            Ok(()) => ("done", Some(PowerState::On)),
            Err(failure) if failure.reason == FailureReason::ServerUnavailable => ("claimed", None),
            Err(_) => ("power_on_failed", Some(PowerState::Unknown)),
        };
        if let Some(state) = state {
            let patch = serde_json::json!({"status": {"powerState": state}});
            let api = kube::Api::<Server>::all(self.claims_client());
            if let Err(err) = api.patch_status(server, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
                tracing::warn!(%server, error = %err, "writing the power state failed; the sweep will");
            }
        }
        self.claims.metrics().scaledown.action("power_on", "spare", outcome);
    }

    /// Reads the server's power back and records it on its status; an
    /// answer other than `want` is a failure.
    async fn confirm(&self, name: &str, want: ironclaim_k8s::api::server::PowerState) -> Result<(), PowerFailure> {
        let failed = |message: String| PowerFailure { reason: FailureReason::PowerActionFailed, message };
        let api = kube::Api::<Server>::all(self.claims_client());
        let server = api.get(name).await.map_err(|err| failed(format!("server {name} could not be read: {err}")))?;
        let state = self.claims.power().power_state(&server).await.map_err(|err| failed(format!("reading the power of {name} failed: {err}")))?;
        if state != want {
            return Err(failed(format!("server {name} still reports {state:?} after its power action")));
        }
        let mut patch = serde_json::json!({"status": {"powerState": state}});
        if state == ironclaim_k8s::api::server::PowerState::Off {
            patch["status"]["poweredOnByIronclaim"] = serde_json::json!(false);
        }
        if let Err(err) = api.patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await {
            tracing::warn!(server = %name, error = %err, "writing the power state failed; the sweep will");
        }
        Ok(())
    }

    /// One eviction through the Eviction API, counted by its answer.
    async fn evict(&self, pod: &str) -> Eviction {
        let (namespace, name) = pod.split_once('/').unwrap_or(("default", pod));
        let answer = drain::evict(&self.claims_client(), namespace, name, self.eviction_timeout).await;
        let (label, answer) = match answer {
            Evicted::Yes => ("evicted", Eviction::Evicted),
            Evicted::Gone => ("gone", Eviction::Gone),
            Evicted::Blocked(why) => ("blocked", Eviction::Blocked(why)),
            Evicted::Failed(why) => {
                tracing::warn!(%pod, %why, "eviction failed; it is sent again");
                ("failed", Eviction::Failed(why))
            }
        };
        self.claims.metrics().scaledown.eviction(label);
        answer
    }

    /// The node and server writes of scale-down; a failure is logged and
    /// counted, and the driver's next step sees the world as it is.
    async fn scale_down_write(&self, effect: &Effect) {
        let client = self.claims_client();
        let result = match effect {
            Effect::Cordon { node, reason } => {
                let result = drain::cordon(&client, node, reason).await;
                let mut cordons = self.cordons.lock().unwrap_or_else(PoisonError::into_inner);
                if result.is_ok() {
                    if let Some(tx) = cordons.remove(node) {
                        tx.send_replace(Some(true));
                    }
                } else if let Some(tx) = cordons.get(node) {
                    tx.send_replace(Some(false));
                }
                result
            }
            Effect::Uncordon { node, abandoned } => {
                self.cordons.lock().unwrap_or_else(PoisonError::into_inner).remove(node);
                drain::uncordon_noting(&client, node, abandoned.then(jiff::Timestamp::now)).await
            }
            Effect::KeepCordoned { node } => drain::leave_cordoned(&client, node).await,
            Effect::Mark { node, mark, on } => drain::mark(&client, node, mark.taint(), *on).await,
            Effect::DeleteNode { node } => match kube::Api::<Node>::all(client).delete(node, &kube::api::DeleteParams::default()).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(source) => Err(drain::DrainError::DeleteNodeFailed { node: node.clone(), source }),
            },
            Effect::ParkNode { node, server } => crate::scaledown::parking::park(&client, node, server).await,
            Effect::RecordIdle { server, since } => {
                let value =
                    since.map(|s| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::from_second(s as i64).unwrap_or_default()));
                let patch = serde_json::json!({"status": {"idleSince": value}});
                match kube::Api::<Server>::all(client)
                    .patch_status(server, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                    .await
                {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(source) => Err(drain::DrainError::ReadServerFailed { server: server.clone(), source }),
                }
            }
            other => {
                tracing::error!(effect = ?other, "an effect this controller does not carry out");
                Ok(())
            }
        };
        if let Err(err) = result {
            tracing::warn!(effect = ?effect, error = %err, "carrying out a scale-down effect failed; the driver will see the world as it is");
            self.claims.metrics().error(err.metric_label());
        }
    }

    fn answer(&self, report: Report) {
        // The loop is gone only when the controller stops.
        let _ = self.reports.send(report);
    }

    /// The server a power action is for: the index's copy, or read. A
    /// warm spare's (`spare`) is read fresh and must still be unclaimed.
    async fn power_target(&self, known: Option<Arc<Server>>, name: &str, spare: bool) -> Result<Arc<Server>, PowerFailure> {
        let unavailable = |message: String| PowerFailure { reason: ironclaim_driver::FailureReason::ServerUnavailable, message };
        let server = match known.filter(|_| !spare) {
            Some(s) => s,
            None => kube::Api::<Server>::all(self.claims_client())
                .get(name)
                .await
                .map(Arc::new)
                .map_err(|err| unavailable(format!("server {name} could not be read: {err}")))?,
        };
        if spare && let Some(holder) = server.status.as_ref().and_then(|s| s.claim.as_deref()).filter(|c| !c.is_empty()) {
            return Err(unavailable(format!("server {name} is held by {holder}; a spare is powered on only while unclaimed")));
        }
        Ok(server)
    }

    fn claims_client(&self) -> kube::Client {
        self.claims.client()
    }

    /// Carries out one write; a failed one is logged, counted and, when
    /// it was a claim's record, reported so the driver steps the claim
    /// again.
    async fn write(&self, job: WriteJob) {
        let WriteJob { effect, pods, claim: known, server, node, pool, subject } = job;
        let claims = &self.claims;
        let (result, claim): (crate::Result<()>, Option<String>) = match &effect {
            Effect::EnterStage { claim, stage, message } => {
                (claims.enter_stage(claim, *stage, message, &pods, server.as_deref(), known.map(|k| *k)).await, Some(claim.clone()))
            }
            Effect::FailClaim { claim, reason, message, timed_out } => {
                // Held back before the claim is failed: once it is, its pods
                // are demand again, and the next decision must not move on
                // to another server behind the same broken reference.
                if reason.is_configuration() {
                    let name = match &server {
                        Some(s) => Some(kube::ResourceExt::name_any(&**s)),
                        None => claims.server_of_claim(claim).await,
                    };
                    if let Some(name) = name {
                        self.hold_back_misconfigured(&name, *reason, message).await;
                    }
                }
                (claims.fail(claim, *reason, message, *timed_out, &pods, known.map(|k| *k)).await, Some(claim.clone()))
            }
            Effect::LinkNode { claim, server: name, node: node_name, .. } => {
                (claims.link(claim, name, node_name, node.map(|n| *n), pool.as_deref(), server.map(Arc::unwrap_or_clone)).await, Some(claim.clone()))
            }
            Effect::Measure { server, sample } => (claims.measure(server, *sample).await, None),
            Effect::Release { server, claim, count_failure, quarantine, untouched } => {
                (claims.release(server, claim, *count_failure, *quarantine, *untouched).await, None)
            }
            Effect::DeleteClaim { claim } => (claims.delete_claim(claim).await, None),
            Effect::Note { subject: s, reason, message, warning } => {
                self.note(s, reason, message, *warning, subject).await;
                (Ok(()), None)
            }
            other => {
                self.scale_down_write(other).await;
                (Ok(()), None)
            }
        };
        if let Err(err) = result {
            tracing::warn!(effect = ?effect, error = %err, "carrying out an effect failed; the driver will see the world as it is");
            self.claims.metrics().error(err.metric_label());
            if claim.is_some() {
                let label = format!("{effect:?}").split([' ', '{']).next().unwrap_or_default().to_string();
                self.answer(Report::WriteFailed { claim, effect: label, message: format!("{err:#}") });
            }
        }
    }

    /// A claim failed by a fault of configuration: its server, and every
    /// server behind the same broken reference, is held back with a
    /// condition that says why, a Warning Event and a log line.
    async fn hold_back_misconfigured(&self, server: &str, reason: ironclaim_driver::FailureReason, message: &str) {
        match self.claims.mark_misconfigured(server, reason, message).await {
            Ok(marked) => {
                for (name, note) in marked {
                    tracing::warn!(server = %name, reason = %reason, message = %note, "the server's BMC configuration is broken; it is held back until a read through it succeeds");
                    self.notes.warn(Kind::Server, &name, &format!("{reason:?}"), &note).await;
                }
            }
            Err(err) => {
                tracing::warn!(%server, error = %err, "marking a server whose BMC configuration is broken failed");
                self.claims.metrics().error(err.metric_label());
            }
        }
    }

    /// An Event on a pod (`namespace/name`), node or server; a note about a
    /// claim (`claim NAME`) goes onto its conditions.
    async fn note(&self, subject: &str, reason: &str, message: &str, warning: bool, kind: Option<Kind>) {
        if let Some(claim) = subject.strip_prefix("claim ") {
            if let Err(err) = self.claims.note_on_claim(claim, reason, message).await {
                tracing::warn!(%claim, error = %err, "writing a claim's condition failed");
                self.claims.metrics().error(err.metric_label());
            }
            return;
        }
        if let Some((namespace, name)) = subject.split_once('/') {
            let uid = {
                let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
                // A ProvisioningRequest's stand-in is no pod: its request's
                // status says where it stands.
                if index.gang_pods.contains_key(subject) {
                    return;
                }
                index.pods.get(subject).and_then(|e| e.pod.uid.clone())
            };
            let events = self.claims.events();
            if warning {
                events.warn(namespace, name, uid.as_deref(), reason, message).await;
            } else {
                events.pod(namespace, name, uid.as_deref(), reason, message).await;
            }
            return;
        }
        let kind = kind.unwrap_or(Kind::Server);
        if warning {
            self.notes.warn(kind, subject, reason, message).await;
        } else {
            self.notes.normal(kind, subject, reason, message).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ironclaim_driver::Stage;
    use proptest::prelude::*;

    fn job(effect: Effect) -> WriteJob {
        WriteJob::of(effect)
    }

    fn future_size<A, B, F: std::future::Future>(_: impl Fn(A, B) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    fn future_size3<A, B, C, D, F: std::future::Future>(_: impl Fn(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    #[test]
    fn takes_and_writes_that_wait_their_turn_are_small_tasks() {
        // A burst of 5,000 pods queues thousands of groups of writes and a
        // thousand takes at once; each waits as a task of this size.
        let group = future_size::<Executor, Vec<WriteJob>, _>(Executor::run_group);
        let take = future_size3::<Executor, Box<ClaimRecord>, HashMap<String, String>, Option<Arc<Server>>, _>(Executor::run_take);
        assert!(group <= 1024 && take <= 1024, "a waiting group of writes takes {group} bytes, a waiting take {take}");
        assert!(std::mem::size_of::<WriteJob>() <= 1024, "a queued write takes {} bytes", std::mem::size_of::<WriteJob>());
    }

    /// One of a few writes over three claims, servers and nodes.
    fn effect() -> impl Strategy<Value = Effect> {
        let name = |p: &'static str| (0..3u8).prop_map(move |i| format!("{p}{i}"));
        prop_oneof![
            name("c").prop_map(|claim| Effect::EnterStage { claim, stage: Stage::PoweringOn, message: String::new() }),
            (name("c"), name("s"), name("n")).prop_map(|(claim, server, node)| Effect::LinkNode { claim, server, node, pool: "p".into() }),
            name("s").prop_map(|server| Effect::Measure { server, sample: [1, 2, 3, 4] }),
            name("n").prop_map(|node| Effect::Uncordon { node, abandoned: false }),
            (name("s"), name("c")).prop_map(|(server, claim)| Effect::Release {
                server,
                claim,
                count_failure: false,
                quarantine: false,
                untouched: false
            }),
        ]
    }

    #[test]
    fn a_burst_of_claims_is_written_side_by_side_and_one_claims_writes_in_order() {
        let mut writes: Vec<WriteJob> =
            (0..50).map(|i| job(Effect::EnterStage { claim: format!("c{i}"), stage: Stage::PoweringOn, message: String::new() })).collect();
        writes.push(job(Effect::Note { subject: "claim c7".into(), reason: "GatesWaiting", message: "m".into(), warning: false }));
        let groups = write_groups(writes);
        assert_eq!(groups.len(), 50);
        let c7: Vec<String> =
            groups.iter().find(|g| g.len() == 2).expect("c7's stage and note together").iter().map(|j| format!("{:?}", j.effect)).collect();
        assert!(c7[0].starts_with("EnterStage") && c7[1].starts_with("Note"), "{c7:?}");
    }

    /// A dry run writes no mark, and says what it would mark instead of
    /// telling a node it is marked.
    #[test]
    fn a_dry_run_tells_the_mark_it_would_make_and_writes_none() {
        let emptying = Effect::Note { subject: "n1".into(), reason: "Emptying", message: "6 % used".into(), warning: false };
        match dry_run_of(emptying) {
            DryRun::Told { action: "", told, answer: None } => match &told[..] {
                [Effect::Note { subject, reason: "DryRun", message, .. }] => {
                    assert_eq!(subject, "n1");
                    assert_eq!(message, "dry run: would mark ironclaim.dev/emptying:PreferNoSchedule: 6 % used");
                }
                other => panic!("{other:?}"),
            },
            _ => panic!("the Emptying note was not turned into a DryRun one"),
        }
        let mark = Effect::Mark { node: "n1".into(), mark: ironclaim_driver::Mark::Emptying, on: true };
        assert!(matches!(dry_run_of(mark), DryRun::Drop));
        let held = Effect::Note { subject: "n1".into(), reason: "ScaleDownHeld", message: "m".into(), warning: false };
        assert!(matches!(dry_run_of(held), DryRun::Pass(_)));
    }

    proptest! {
        /// Writes that touch an object in common share a group, and every
        /// group keeps the order the writes were given in.
        #[test]
        fn writes_touching_one_object_stay_in_order(effects in proptest::collection::vec(effect(), 0..30)) {
            let writes: Vec<WriteJob> = effects.iter().cloned().map(job).collect();
            let keys: Vec<Vec<String>> = writes.iter().map(touches).collect();
            let tagged: Vec<WriteJob> = writes.into_iter().enumerate().map(|(i, mut j)| { j.pods = vec![(i.to_string(), String::new(), None)]; j }).collect();
            let groups = write_groups(tagged);
            let mut group_of = vec![usize::MAX; effects.len()];
            for (g, group) in groups.iter().enumerate() {
                let order: Vec<usize> = group.iter().map(|j| j.pods[0].0.parse().unwrap()).collect();
                prop_assert!(order.windows(2).all(|w| w[0] < w[1]), "group {g} out of order: {order:?}");
                for i in order {
                    group_of[i] = g;
                }
            }
            prop_assert!(group_of.iter().all(|&g| g != usize::MAX), "every write is in a group");
            for a in 0..effects.len() {
                for b in a + 1..effects.len() {
                    if keys[a].iter().any(|k| keys[b].contains(k)) {
                        prop_assert_eq!(group_of[a], group_of[b], "{:?} and {:?} touch the same object", effects[a], effects[b]);
                    }
                }
            }
        }
    }
}
