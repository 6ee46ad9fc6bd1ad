//! The controller's main loop: watches feed the index; the driver's
//! [`Autoscaler`] is stepped over it (batching, the core's decisions, each
//! claim's walk) on every change and whenever it asks to wake; its effects
//! are carried out by the [`Executor`] and answered back; servers whose
//! claim is gone are released; and the fleet's power is swept for status
//! and metrics.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Debug;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use ironclaim_core::model::Seconds;
use ironclaim_core::provision;
use ironclaim_driver::autoscaler::Autoscaler;
use ironclaim_driver::{Effect, Report, Settings as DriverSettings};
use ironclaim_k8s::api::server::{BMC_CONFIGURED_CONDITION, Identity, PowerState, ServerStatus};
use ironclaim_k8s::api::{Server, ServerClaim, ServerPool};
use ironclaim_k8s::server_to_core;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::batch::Windows;
use crate::claims::{ClaimSettings, Claims};
use crate::error::Result;
use crate::events::{Events, Sink};
use crate::executor::Executor;
use crate::index::{FailureBackoff, Index, Indexed};
use crate::leader::{self, Gate, LeaseSettings};
use crate::locks::{LEDGER_LABEL, Lock};
use crate::metrics::Metrics;
use crate::pools;
use crate::provider::Power;
use crate::scaledown::notes::Notes;
use crate::timeline;
use crate::world::IndexWorld;

/// Everything configurable about a controller.
#[derive(Clone, Debug)]
pub struct Settings {
    pub windows: Windows,
    pub claims: ClaimSettings,
    pub failure_backoff: FailureBackoff,
    /// The longest the loop sleeps when nothing changes.
    pub tick: Duration,
    /// Pods still pending are decided again this often, even if no new
    /// pod arrived (servers may have been freed or repaired).
    pub redecide_every: Duration,
    /// How often every server's power state and watts are read.
    pub power_sweep_every: Duration,
    /// Leader election; `None` acts without it.
    pub lease: Option<LeaseSettings>,
    /// Where `/metrics`, `/healthz` and `/readyz` are served.
    pub metrics_address: Option<SocketAddr>,
    /// This replica's name, for events and the lease.
    pub instance: String,
    /// Claims opened at once.
    pub open_concurrency: usize,
    /// Events on pods; off only for benchmarks.
    pub publish_events: bool,
    /// Scale-down: pacing, drains, stranded-resource repair.
    pub scaledown: crate::scaledown::ScaleDownSettings,
    /// Decide and tell (Events, logs, `ironclaim_dry_run_actions_total`),
    /// carry out nothing: no claim is written, no server powered, no node
    /// cordoned or drained, nothing repaired.
    pub dry_run: bool,
    /// Peak watts the powered fleet may draw (`Snapshot::power_budget_watts`);
    /// `None` leaves the fleet uncapped (ServerPool `limits.watts` still
    /// hold).
    pub power_budget_watts: Option<f64>,
    /// How often servers may change power (`Snapshot::transition_limits`).
    pub transition_limits: ironclaim_core::transitions::TransitionLimits,
    /// Serve `/ui` and `/ui/state` beside `/metrics`.
    pub dashboard: bool,
    /// What the client's [`crate::api::ApiLayer`] counts, exported with
    /// the metrics.
    pub api_requests: crate::api::ApiRequests,
    /// The client Events leave through (one that yields to the
    /// controller's, [`crate::api::ApiLayer::background`]); `None` sends
    /// them through the controller's.
    pub events_client: Option<crate::events::EventClient>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            windows: Windows::default(),
            claims: ClaimSettings::default(),
            failure_backoff: FailureBackoff { base_s: 60, max_s: 3600 },
            tick: Duration::from_millis(500),
            redecide_every: Duration::from_secs(30),
            power_sweep_every: Duration::from_secs(60),
            lease: None,
            metrics_address: None,
            instance: "ironclaim".into(),
            open_concurrency: 32,
            publish_events: true,
            scaledown: crate::scaledown::ScaleDownSettings::default(),
            dry_run: false,
            power_budget_watts: None,
            transition_limits: Default::default(),
            dashboard: true,
            api_requests: Default::default(),
            events_client: None,
        }
    }
}

/// A running decision, for benchmarks and tests: when it started and how
/// long until its last power-on request.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub pending_pods: usize,
    pub claims_opened: usize,
    pub claims_failed: usize,
    /// From the start of the decision to the last power-on request handed
    /// to the provider (once its take was answered).
    pub latency: Duration,
    /// From the start of the decision to the first power-on request sent.
    pub first_power_on: Option<Duration>,
    /// By when half of the pods that got a new claim had its power-on sent.
    pub median_pod: Option<Duration>,
    /// The driver's step that decided, the core's decision included.
    pub provision_time: Duration,
}

/// By when half of the pods that got a new claim had its power-on sent:
/// `sent` holds, per claim, when (from the decision) and for how many pods.
fn median_by_pods(sent: &[(Duration, usize)]) -> Option<Duration> {
    let mut by_time: Vec<(Duration, usize)> = sent.iter().map(|&(at, pods)| (at, pods.max(1))).collect();
    by_time.sort();
    let total: usize = by_time.iter().map(|(_, n)| n).sum();
    let mut seen = 0;
    by_time.into_iter().find_map(|(at, n)| {
        seen += n;
        (2 * seen >= total).then_some(at)
    })
}

/// A decision whose takes are still being answered.
struct Opening {
    started: Instant,
    pending_pods: usize,
    provision_time: Duration,
    /// Claims not answered yet, with their pods.
    waiting: HashMap<String, usize>,
    /// Power-ons sent: when, from the start, and for how many pods.
    sent: Vec<(Duration, usize)>,
    failed: usize,
}

impl Opening {
    fn finish(self) -> Decision {
        let times: Vec<Duration> = self.sent.iter().map(|(at, _)| *at).collect();
        Decision {
            pending_pods: self.pending_pods,
            claims_opened: self.sent.len(),
            claims_failed: self.failed,
            latency: times.iter().max().copied().unwrap_or(self.provision_time),
            first_power_on: times.iter().min().copied(),
            median_pod: median_by_pods(&self.sent),
            provision_time: self.provision_time,
        }
    }
}

/// The least time between two steps of the control loop.
const STEP_GAP: Duration = Duration::from_millis(100);

/// The driver's clock: wall time since the epoch, the clock the API's
/// timestamps are on.
fn clock() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

/// A seed for claim names that differs between processes.
fn name_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u128(clock().as_nanos());
    hasher.write_u32(std::process::id());
    hasher.finish()
}

pub struct Controller {
    client: Client,
    settings: Settings,
    metrics: Arc<Metrics>,
    index: Arc<Mutex<Index>>,
    claims: Arc<Claims>,
    ready: Arc<AtomicBool>,
    decisions: Arc<Mutex<Vec<Decision>>>,
    /// The last Events sent, for the dashboard.
    journal: crate::events::Journal,
    /// Where every Event leaves.
    sink: Sink,
}

fn now_s() -> Seconds {
    jiff::Timestamp::now().as_second().max(0) as Seconds
}

/// What every watch feeds: the index, the loop to wake, the count of
/// watches through their first list, and the lag metric.
#[derive(Clone)]
struct Feed {
    index: Arc<Mutex<Index>>,
    notify: Arc<Notify>,
    synced: Arc<AtomicUsize>,
    metrics: Arc<Metrics>,
}

/// The newest time the API stamped on an object (its creation, deletion,
/// or a field manager's last write), in whole seconds as the API keeps it.
fn last_stamped(meta: &kube::api::ObjectMeta) -> Option<jiff::Timestamp> {
    let managed = meta.managed_fields.iter().flatten().filter_map(|m| m.time.as_ref());
    meta.creation_timestamp.iter().chain(meta.deletion_timestamp.iter()).chain(managed).map(|t| t.0).max()
}

/// Feeds one kind from a watch into the index, forever.
async fn watch<K>(api: Api<K>, feed: Feed)
where
    K: Indexed + Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    watch_with(api, watcher::Config::default(), feed).await;
}

async fn watch_with<K>(api: Api<K>, config: watcher::Config, feed: Feed)
where
    K: Indexed + Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let Feed { index, notify, synced, metrics } = feed;
    let kind = K::kind(&Default::default()).to_string();
    let lag = metrics.watch_lag.get_or_create(&vec![("kind".into(), kind.clone())]).clone();
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    let mut relist = K::Relist::default();
    let mut first = true;
    let mut failures = Throttle::new(WATCH_REPORT_EVERY);
    loop {
        let next = stream.try_next().await;
        if next.is_ok()
            && let Some(failed) = failures.recovered()
        {
            tracing::info!(%kind, failed, "watch recovered");
        }
        match next {
            Ok(Some(Event::Init)) => relist = K::Relist::default(),
            Ok(Some(Event::InitApply(o))) => {
                let listed = o.listed();
                index.lock().unwrap_or_else(PoisonError::into_inner).relist_add::<K>(&mut relist, listed);
            }
            Ok(Some(Event::InitDone)) => {
                index.lock().unwrap_or_else(PoisonError::into_inner).relist_done::<K>(std::mem::take(&mut relist));
                if first {
                    first = false;
                    synced.fetch_add(1, Ordering::SeqCst);
                }
                notify.notify_one();
            }
            Ok(Some(Event::Apply(o))) => {
                let stamped = last_stamped(o.meta());
                index.lock().unwrap_or_else(PoisonError::into_inner).apply(o);
                if let Some(stamped) = stamped {
                    lag.observe(jiff::Timestamp::now().duration_since(stamped).as_secs_f64().max(0.0));
                }
                notify.notify_one();
            }
            Ok(Some(Event::Delete(o))) => {
                index.lock().unwrap_or_else(PoisonError::into_inner).delete(&o);
                notify.notify_one();
            }
            Ok(None) => return,
            Err(err) => {
                if let Some(suppressed) = failures.failed(std::time::Instant::now()) {
                    let error = watch_error(&err);
                    tracing::warn!(%kind, %error, suppressed, "watch failed; retrying (failures in between are counted, not logged)");
                }
            }
        }
    }
}

/// Servers a power sweep reads at once, and status writes it has in flight.
const SWEEP_IN_FLIGHT: usize = 16;

/// A watch that keeps failing is reported at most this often.
const WATCH_REPORT_EVERY: Duration = Duration::from_secs(60);

/// A watch error in one line, with the fix where there is one.
fn watch_error(err: &watcher::Error) -> String {
    match err {
        watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 404 => {
            "the ironclaim.dev CRDs are not installed: run `ironclaim crds | kubectl apply --server-side -f -`".into()
        }
        watcher::Error::InitialListFailed(kube::Error::Api(s)) | watcher::Error::WatchStartFailed(kube::Error::Api(s)) if s.code == 403 => {
            format!("forbidden ({}): apply this version's RBAC", s.message)
        }
        other => other.to_string().lines().next().unwrap_or_default().to_string(),
    }
}

/// Rate-limits the reports of a failure that repeats: the first at once,
/// then at most one per period, each with how many it stood for.
#[derive(Debug)]
struct Throttle {
    every: Duration,
    last: Option<std::time::Instant>,
    /// Failures since the last report.
    suppressed: u64,
    /// Failures since the last success.
    run: u64,
}

impl Throttle {
    fn new(every: Duration) -> Self {
        Throttle { every, last: None, suppressed: 0, run: 0 }
    }

    /// One more failure at `now`: Some(failures not reported since the
    /// last report) when this one is to be reported.
    fn failed(&mut self, now: std::time::Instant) -> Option<u64> {
        self.run += 1;
        match self.last {
            Some(at) if now.duration_since(at) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }

    /// A success: Some(failures in the run) when it ended a run of them.
    fn recovered(&mut self) -> Option<u64> {
        let run = std::mem::take(&mut self.run);
        self.last = None;
        self.suppressed = 0;
        (run > 0).then_some(run)
    }
}

const WATCHED_KINDS: usize = 9;

impl Controller {
    pub fn new(client: Client, power: Arc<dyn Power>, mut settings: Settings) -> Self {
        // Under a dry run no power action leaves, whoever asks for one.
        let power: Arc<dyn Power> = if settings.dry_run { Arc::new(crate::provider::DryRun(power)) } else { power };
        if settings.dry_run {
            tracing::warn!("dry run: every decision is told (Events, reason DryRun), none is carried out");
            settings.scaledown.repair = false;
        }
        let metrics = Arc::new(Metrics::counting(&settings.api_requests));
        let journal = crate::events::Journal::default();
        let through = settings.events_client.as_ref().map_or_else(|| client.clone(), |c| c.0.clone());
        let sink = Sink::new(through, "ironclaim", &settings.instance, metrics.events_dropped.clone());
        let events = if settings.publish_events { Events::new(sink.clone(), journal.clone()) } else { Events::disabled_into(journal.clone()) };
        let gate = if settings.lease.is_some() { Gate::closed() } else { Gate::always() };
        let claims = Arc::new(Claims::new(client.clone(), power, settings.claims.clone(), metrics.clone(), events).with_gate(gate));
        Controller { client, settings, metrics, index: Arc::default(), claims, ready: Arc::default(), decisions: Arc::default(), journal, sink }
    }

    /// Events on nodes, servers and pools, kept in the journal too.
    fn notes(&self) -> Notes {
        if self.settings.publish_events { Notes::new(self.sink.clone(), self.journal.clone()) } else { Notes::disabled_into(self.journal.clone()) }
    }

    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// The decisions taken so far (bounded to the last 100).
    pub fn decisions(&self) -> Arc<Mutex<Vec<Decision>>> {
        self.decisions.clone()
    }

    /// Runs until `shutdown` resolves, then stops its power tasks and gives
    /// up the lease. Whatever it announced is on the API for a successor.
    ///
    /// # Errors
    /// Only when the metrics address cannot be bound; every other failure
    /// is logged, counted and retried.
    pub async fn run(self, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> Result<()> {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        });
        // /healthz fails once the loop has not turned for this long.
        let heartbeat = Arc::new(crate::http::Heartbeat::new((self.settings.tick * 20).max(Duration::from_secs(120))));
        heartbeat.beat();
        if let Some(address) = self.settings.metrics_address {
            let mut rx = stop_rx.clone();
            let dashboard = self.settings.dashboard.then(|| {
                Arc::new(crate::dashboard::Source::new(
                    self.index.clone(),
                    self.decisions.clone(),
                    self.journal.clone(),
                    self.settings.power_budget_watts,
                ))
            });
            let serving = if dashboard.is_some() { "/metrics, /healthz, /readyz and /ui" } else { "/metrics, /healthz and /readyz" };
            let bound = crate::http::serve(address, self.metrics.clone(), self.ready.clone(), heartbeat.clone(), dashboard, async move {
                let _ = rx.wait_for(|s| *s).await;
            })
            .await?;
            tracing::info!(%bound, "serving {serving}");
        }
        let notify = Arc::new(Notify::new());
        let synced = Arc::new(AtomicUsize::new(0));
        let c = &self.client;
        let mut watches = tokio::task::JoinSet::new();
        let feed = Feed { index: self.index.clone(), notify: notify.clone(), synced: synced.clone(), metrics: self.metrics.clone() };
        watches.spawn(watch(Api::<Pod>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<Node>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<Namespace>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<DaemonSet>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<PodDisruptionBudget>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<Server>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<ServerPool>::all(c.clone()), feed.clone()));
        watches.spawn(watch(Api::<ServerClaim>::all(c.clone()), feed.clone()));
        let ledger = Api::<ConfigMap>::namespaced(c.clone(), &self.settings.claims.lock_namespace);
        let only_ledger = watcher::Config::default().labels(LEDGER_LABEL);
        watches.spawn(watch_with(ledger, only_ledger, feed));

        let mut stop = stop_rx.clone();
        while synced.load(Ordering::SeqCst) < WATCHED_KINDS {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => { watches.abort_all(); return Ok(()); }
                _ = notify.notified() => {}
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
        }
        self.ready.store(true, Ordering::Relaxed);
        tracing::info!("caches synced");
        let gate = self.claims.gate().clone();
        let renewal = self.settings.lease.clone().map(|lease| leader::spawn_renewal(self.client.clone(), lease, gate.clone(), self.metrics.clone()));
        let acting = gate.clone();
        let buffers =
            crate::upstream::spawn(crate::buffers::Buffers::new(self.client.clone(), self.index.clone(), Arc::new(move || acting.acting())));
        let acting = gate.clone();
        let requests = crate::upstream::spawn(crate::provisioning_requests::ProvisioningRequests::new(
            self.client.clone(),
            self.index.clone(),
            Arc::new(move || acting.acting()),
        ));
        let (maintenance_tx, mut maintenance_rx) = tokio::sync::mpsc::unbounded_channel();
        let _scaledown = Arc::new(crate::scaledown::ScaleDown::new(
            self.client.clone(),
            self.index.clone(),
            self.claims.clone(),
            self.metrics.clone(),
            self.settings.failure_backoff,
            if self.settings.scaledown.publish_events {
                Notes::new(self.sink.clone(), self.journal.clone())
            } else {
                Notes::disabled_into(self.journal.clone())
            },
            self.settings.scaledown.clone(),
            maintenance_tx,
        ))
        .spawn();

        let mut autoscaler = Autoscaler::new(self.driver_settings());
        let (report_tx, mut report_rx) = tokio::sync::mpsc::unbounded_channel();
        let notes = self.notes();
        let executor = Executor::new(self.claims.clone(), self.index.clone(), notes, report_tx, self.settings.open_concurrency)
            .with_eviction_timeout(self.settings.scaledown.drain.attempt_timeout)
            .with_dry_run(self.settings.dry_run);
        let mut tasks = tokio::task::JoinSet::new();
        let mut openings: Vec<Opening> = Vec::new();
        let mut was_leading = false;
        let mut next_sweep = Instant::now();
        let sweeping = Arc::new(AtomicBool::new(false));
        let mut last_step = Instant::now();
        loop {
            let until_wake = autoscaler.next_wake().saturating_sub(clock()).min(self.settings.tick);
            let mut reports = Vec::new();
            let mut maintenance = Vec::new();
            tokio::select! {
                _ = stop.wait_for(|s| *s) => break,
                _ = notify.notified() => {}
                Some(report) = report_rx.recv() => reports.push(report),
                Some(drain) = maintenance_rx.recv() => maintenance.push(drain),
                _ = gate.lost(), if was_leading => {}
                _ = tokio::time::sleep(until_wake) => {}
            }
            // A burst of watch events is one step, not one each: the
            // watches apply what arrives meanwhile without waiting for the
            // index.
            let since = last_step.elapsed();
            if since < STEP_GAP {
                tokio::select! {
                    _ = stop.wait_for(|s| *s) => break,
                    _ = tokio::time::sleep(STEP_GAP - since) => {}
                }
            }
            last_step = Instant::now();
            while let Ok(report) = report_rx.try_recv() {
                reports.push(report);
            }
            while let Ok(drain) = maintenance_rx.try_recv() {
                maintenance.push(drain);
            }
            while tasks.try_join_next().is_some() {}
            heartbeat.beat();
            let leading = gate.acting();
            self.metrics.leader.set(i64::from(leading));
            if !leading {
                if was_leading {
                    tracing::warn!("lost the lease; standing by");
                    tasks.abort_all();
                    executor.forget();
                    autoscaler.forget();
                    openings.clear();
                }
                was_leading = false;
                continue;
            }
            if !was_leading {
                tracing::info!(instance = %self.settings.instance, "acting");
                // Another replica may have written the ledger while this
                // one stood by; a failure here only costs the first claims
                // a read.
                if let Err(err) = self.claims.prepare_locks().await {
                    tracing::warn!(error = %err, "reading the claim lock ledger failed");
                    self.metrics.error(err.metric_label());
                }
                // Answers to what an earlier lease started are stale.
                reports.clear();
                next_sweep = Instant::now();
                was_leading = true;
            }

            let now = clock();
            let mut effects = Vec::new();
            for report in reports {
                self.answered(&mut openings, &report);
                effects.extend(autoscaler.report(report, now));
            }
            let started = Instant::now();
            let pending = {
                let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
                let world = IndexWorld {
                    index: &index,
                    now_s: now.as_secs(),
                    backoff: self.settings.failure_backoff,
                    power_budget_watts: self.settings.power_budget_watts,
                    transition_limits: &self.settings.transition_limits,
                };
                for d in maintenance {
                    effects.extend(autoscaler.drain_for_maintenance(&world, &d.node, &d.server, d.timeout, now));
                }
                let stepped = autoscaler.step(&world, now);
                let pending = index.pending_pod_keys().count();
                effects.extend(stepped);
                pending
            };
            self.metrics.set_pending_pods(autoscaler.pending_by_decision());
            for end in autoscaler.drain_ends() {
                let outcome = match end.ended {
                    ironclaim_driver::drain::Ended::Done { .. } => "done",
                    ironclaim_driver::drain::Ended::Abandoned { .. } => "abandoned",
                };
                self.metrics.scaledown.action("drain", &end.reason, outcome);
            }
            let waiting: HashMap<String, usize> = effects
                .iter()
                .filter_map(|e| if let Effect::TakeServer { claim } = e { Some((claim.name.clone(), claim.pods.len())) } else { None })
                .collect();
            if !waiting.is_empty() {
                tracing::info!(pending, opening = waiting.len(), "decided");
                openings.push(Opening { started, pending_pods: pending, provision_time: started.elapsed(), waiting, sent: Vec::new(), failed: 0 });
            }
            executor.execute(effects, &mut tasks);

            if Instant::now() >= next_sweep && !sweeping.swap(true, Ordering::SeqCst) {
                next_sweep = Instant::now() + self.settings.power_sweep_every;
                let this = self.sweeper();
                let flag = sweeping.clone();
                tokio::spawn(async move {
                    this.sweep().await;
                    flag.store(false, Ordering::SeqCst);
                });
            }
        }
        if let Some(renewal) = renewal {
            renewal.abort();
        }
        buffers.abort();
        requests.abort();
        gate.revoke();
        tasks.abort_all();
        watches.abort_all();
        if let Some(lease) = &self.settings.lease
            && was_leading
        {
            leader::release(&self.client, lease).await;
        }
        tracing::info!("stopped");
        Ok(())
    }

    /// The driver's settings of these.
    fn driver_settings(&self) -> DriverSettings {
        let s = &self.settings;
        DriverSettings {
            windows: s.windows,
            redecide_every: s.redecide_every,
            // Watches may miss a change between relists: pending pods are
            // decided again every `redecide_every`.
            redecide_quiet_max: None,
            // Stepped on every change: every step reconciles every claim.
            reconcile_every: Duration::ZERO,
            claims: s.claims.driver(),
            backoff: s.failure_backoff,
            scale_down: Some(s.scaledown.driver()),
            name_seed: name_seed(),
            held_notes: s.scaledown.publish_events,
            decision_notes: s.publish_events,
        }
    }

    /// Counts a take's answer into the decision it belongs to; a decision
    /// all of whose takes are answered is recorded.
    fn answered(&self, openings: &mut Vec<Opening>, report: &Report) {
        let (claim, sent) = match report {
            Report::Taken { claim, newly } => (claim, *newly),
            Report::Held { claim, .. } | Report::TakeFailed { claim, .. } => (claim, false),
            _ => return,
        };
        let Some(at) = openings.iter().position(|o| o.waiting.contains_key(claim)) else { return };
        let opening = &mut openings[at];
        let pods = opening.waiting.remove(claim).unwrap_or(0);
        if sent {
            opening.sent.push((opening.started.elapsed(), pods));
        } else if !matches!(report, Report::Taken { .. }) {
            opening.failed += 1;
            if let Report::TakeFailed { message, .. } = report {
                tracing::warn!(%claim, error = %message, "opening a claim failed");
            }
        }
        if !opening.waiting.is_empty() {
            return;
        }
        let decision = openings.remove(at).finish();
        if decision.claims_opened > 0 {
            self.metrics.decision_latency.observe(decision.latency.as_secs_f64());
        }
        tracing::info!(
            pending = decision.pending_pods,
            opened = decision.claims_opened,
            failed = decision.claims_failed,
            latency_ms = decision.latency.as_millis() as u64,
            "claims opened"
        );
        let mut decisions = self.decisions.lock().unwrap_or_else(PoisonError::into_inner);
        if decisions.len() >= 100 {
            decisions.remove(0);
        }
        decisions.push(decision);
    }

    fn sweeper(&self) -> Sweeper {
        Sweeper {
            client: self.client.clone(),
            backoff: self.settings.failure_backoff,
            index: self.index.clone(),
            claims: self.claims.clone(),
            metrics: self.metrics.clone(),
            notes: self.notes(),
        }
    }
}

/// Whether a claim lock was left by an opening that died between taking
/// it and writing the claim to its server, or outlived its server: the
/// server (if any) does not name its holder, and it was taken longer than
/// `grace` ago (or at a time not recorded).
fn stale_lock(lock: &Lock, server: Option<&Server>, now: jiff::Timestamp, grace: Duration) -> bool {
    let named = server.and_then(|s| s.status.as_ref()).and_then(|s| s.claim.as_deref()) == Some(lock.holder.as_str());
    !named && !lock.acquired.is_some_and(|at| within_grace(at, now, grace))
}

/// Whether something stamped `at` may still be opening: less than `grace`
/// ago, or ahead of our clock (another clock's, never counted as old).
fn within_grace(at: jiff::Timestamp, now: jiff::Timestamp, grace: Duration) -> bool {
    now.duration_since(at).unsigned_abs() < grace || at > now
}

/// The claim holding `server` when it is an orphan: its ServerClaim does not
/// exist (as far as `claims` knows) and it was written longer than `grace`
/// ago, or at a time not recorded.
fn orphaned_claim(server: &Server, claims: &BTreeMap<String, ServerClaim>, now: jiff::Timestamp, grace: Duration) -> Option<String> {
    let status = server.status.as_ref()?;
    let claim = status.claim.clone().filter(|c| !c.is_empty())?;
    if claims.contains_key(&claim) {
        return None;
    }
    let opening = status.claimed_at.as_ref().is_some_and(|at| within_grace(at.0, now, grace));
    (!opening).then_some(claim)
}

/// The condition on a Server that says whether ironclaim may act on it.
pub const ADOPTED_CONDITION: &str = "Adopted";
/// The condition on a Server whose identity is contradicted.
pub const IDENTITY_MISMATCH_CONDITION: &str = "IdentityMismatch";

/// What the sweep learnt of one server: its BMC's readings and where it
/// stands.
#[derive(Clone, Debug, Default)]
struct Reading {
    state: Option<PowerState>,
    watts: Option<f64>,
    /// The identity its BMC reported, when it was asked (first contact, or
    /// a BMC address that changed since).
    identity: Option<crate::provider::SystemIdentity>,
    /// What the read says of the server's power configuration: it works
    /// (the read succeeded), it is broken (a fault of configuration, with
    /// its reason and message), or nothing (another failure).
    configured: Option<Result<(), (String, String)>>,
}

/// What a power read says of the configuration it went through.
fn configured_by(read: &Result<PowerState, crate::provider::PowerError>) -> Option<Result<(), (String, String)>> {
    match read {
        Ok(_) => Some(Ok(())),
        Err(e) if e.reason.is_configuration() => Some(Err((format!("{:?}", e.reason), e.message.clone()))),
        Err(_) => None,
    }
}

/// The identity to record after a read: the first one, or the reported
/// UUID when a changed BMC address answers for another machine. None: no
/// change.
fn identity_patch(recorded: Option<&Identity>, address: Option<&str>, read: &crate::provider::SystemIdentity) -> Option<Identity> {
    let fresh = || Identity {
        system_uuid: read.uuid.clone(),
        serial_number: read.serial_number.clone(),
        bmc_address: address.map(str::to_string),
        reported_system_uuid: None,
    };
    let Some(recorded) = recorded.filter(|r| r.system_uuid.is_some()) else {
        return read.uuid.is_some().then(fresh);
    };
    let same = read.uuid.as_deref().zip(recorded.system_uuid.as_deref()).is_some_and(|(a, b)| ironclaim_core::identity::same_uuid(a, b));
    let next = if same {
        Identity { bmc_address: address.map(str::to_string), reported_system_uuid: None, ..recorded.clone() }
    } else {
        Identity { reported_system_uuid: read.uuid.clone().or_else(|| Some("none".into())), ..recorded.clone() }
    };
    (next != *recorded).then_some(next)
}

/// What the sweep writes on a server's status after reading its BMC, if
/// anything changed. A claimed server in `PoweringOn` or `PoweringOff`
/// keeps that state: the claim's power action writes where it ends, and a
/// reading taken just before the action reaches the BMC would say the
/// opposite. A server read off twice in a row (the first reading may
/// precede a power-on ironclaim recorded and sent) is no longer one
/// ironclaim powered on. `standing` is (adopted, why not; mismatch).
fn sweep_patch(
    status: &ServerStatus,
    resource_version: Option<&str>,
    address: Option<&str>,
    read: &Reading,
    standing: (Option<&str>, Option<&str>),
    now_s: Seconds,
) -> Option<serde_json::Value> {
    let state_read = read.state.unwrap_or(PowerState::Unknown);
    let in_transition = matches!(status.power_state, Some(PowerState::PoweringOn | PowerState::PoweringOff))
        && status.claim.as_deref().is_some_and(|c| !c.is_empty());
    let state = if in_transition { status.power_state } else { Some(state_read) };
    let rounded = read.watts.map(|w| w.round() as i64);
    let mut patch = serde_json::json!({"status": {}});
    if status.power_state != state {
        patch["status"]["powerState"] = serde_json::json!(state);
    }
    if state == Some(PowerState::Off) && status.power_state == Some(PowerState::Off) && status.powered_on_by_ironclaim {
        patch["status"]["poweredOnByIronclaim"] = serde_json::json!(false);
    }
    if rounded.is_some() && status.watts != rounded {
        patch["status"]["watts"] = serde_json::json!(rounded);
    }
    if let Some(identity) = read.identity.as_ref().and_then(|i| identity_patch(status.identity.as_ref(), address, i)) {
        patch["status"]["identity"] = serde_json::json!(identity);
    }
    let (unadopted, mismatch) = standing;
    let mut conditions = status.conditions.clone();
    match unadopted {
        None => timeline::set_condition(
            &mut conditions,
            ADOPTED_CONDITION,
            true,
            "Adopted",
            "ironclaim may claim it and power it off when idle",
            now_s,
            None,
        ),
        Some(why) => timeline::set_condition(&mut conditions, ADOPTED_CONDITION, false, "Unadopted", why, now_s, None),
    }
    match mismatch {
        None => {
            if conditions.iter().any(|c| c.type_ == IDENTITY_MISMATCH_CONDITION) {
                timeline::set_condition(
                    &mut conditions,
                    IDENTITY_MISMATCH_CONDITION,
                    false,
                    "IdentityConfirmed",
                    "nothing contradicts its identity",
                    now_s,
                    None,
                );
            }
        }
        Some(why) => timeline::set_condition(
            &mut conditions,
            IDENTITY_MISMATCH_CONDITION,
            true,
            "IdentityMismatch",
            &format!(
                "{why}; no power action, claim or drain reaches it until this is resolved (fix the node or the Server, then clear status.identity to have it read again)"
            ),
            now_s,
            None,
        ),
    }
    match &read.configured {
        Some(Err((reason, message))) => timeline::set_condition(
            &mut conditions,
            BMC_CONFIGURED_CONDITION,
            false,
            reason,
            &format!("{message}; no claim or power action reaches it until a read through its configuration succeeds"),
            now_s,
            None,
        ),
        Some(Ok(())) if conditions.iter().any(|c| c.type_ == BMC_CONFIGURED_CONDITION) => timeline::set_condition(
            &mut conditions,
            BMC_CONFIGURED_CONDITION,
            true,
            "Read",
            "its power state was read through its configuration",
            now_s,
            None,
        ),
        _ => {}
    }
    let same = |a: &[Condition], b: &[Condition]| {
        a.len() == b.len()
            && a.iter().zip(b).all(|(x, y)| x.type_ == y.type_ && x.status == y.status && x.reason == y.reason && x.message == y.message)
    };
    if !same(&conditions, &status.conditions) {
        // The list is written whole, from the copy read before the BMCs
        // were: on the version read only, so a condition another writer
        // set since (a server held back for its configuration) is never
        // erased. A conflict skips this server until the next sweep.
        patch["status"]["conditions"] = serde_json::json!(conditions);
        patch["metadata"] = serde_json::json!({"resourceVersion": resource_version});
    }
    (patch["status"].as_object().is_some_and(|o| !o.is_empty())).then_some(patch)
}

/// The background pass over every server: orphans released, power state
/// and watts read from the providers onto the status and into metrics.
struct Sweeper {
    client: Client,
    backoff: FailureBackoff,
    index: Arc<Mutex<Index>>,
    claims: Arc<Claims>,
    metrics: Arc<Metrics>,
    notes: Notes,
}

impl Sweeper {
    async fn sweep(&self) {
        let (servers, orphans, stale) = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            let servers: Vec<Arc<Server>> = index.servers.values().cloned().collect();
            let now = jiff::Timestamp::now();
            let grace = self.claims.opening_grace();
            let stale: Vec<(Lock, bool)> = index
                .locks
                .values()
                .filter(|lock| stale_lock(lock, index.servers.get(&lock.server).map(Arc::as_ref), now, grace))
                .map(|lock| (lock.clone(), index.node_of_server(&lock.server).is_some()))
                .collect();
            let orphans: Vec<(Arc<Server>, String, bool)> = servers
                .iter()
                .filter_map(|s| {
                    let claim = orphaned_claim(s, &index.claims, now, self.claims.opening_grace())?;
                    Some((s.clone(), claim, index.node_of_server(&s.name_any()).is_some()))
                })
                .collect();
            (servers, orphans, stale)
        };
        for (lock, has_node) in stale {
            if let Err(err) = self.claims.break_lock(&lock, has_node).await {
                tracing::warn!(server = %lock.server, error = %err, "breaking a stale claim lock failed");
                self.metrics.error(err.metric_label());
            }
        }
        let claims_api: Api<ServerClaim> = Api::all(self.client.clone());
        for (server, claim, has_node) in orphans {
            // The watch may lag a claim just created: ask the API itself.
            if !matches!(claims_api.get_opt(&claim).await, Ok(None)) {
                continue;
            }
            tracing::warn!(server = %server.name_any(), %claim, "the server's claim is gone; releasing it");
            if let Err(err) = self.claims.release_orphan(&server, &claim, has_node).await {
                tracing::warn!(server = %server.name_any(), error = %err, "releasing an orphaned server failed");
                self.metrics.error(err.metric_label());
            }
        }
        let power = self.claims.power();
        let readings: Vec<(Arc<Server>, Reading)> = crate::provider::as_sweep(
            futures::stream::iter(servers)
                .map(|server| {
                    let power = power.clone();
                    async move {
                        let recorded = server.status.as_ref().and_then(|s| s.identity.as_ref());
                        let address = server.spec.bmc.as_ref().map(|b| b.address.as_str());
                        let ask = recorded.is_none_or(|r| r.system_uuid.is_none() || r.bmc_address.as_deref() != address);
                        let survey = power.survey(&server, ask).await;
                        let configured = configured_by(&survey.state);
                        let reading = Reading { state: survey.state.ok(), watts: survey.watts, identity: survey.identity, configured };
                        (server, reading)
                    }
                })
                .buffer_unordered(SWEEP_IN_FLIGHT)
                .collect::<Vec<_>>(),
        )
        .await;
        let links = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            self.metrics.claim_locks.set(index.locks.len() as i64);
            self.metrics.set_ledger_bytes(index.ledgers.iter().map(|(name, ledger)| (name.clone(), ledger.bytes)));
            index.links().clone()
        };
        let mut held: HashMap<&'static str, i64> = HashMap::from([("unadopted", 0), ("identity_mismatch", 0)]);
        let api: Api<Server> = Api::all(self.client.clone());
        let mut by_state: HashMap<&'static str, i64> = HashMap::new();
        let mut writes = Vec::new();
        let mut fleet = 0.0;
        let now = now_s();
        for (server, read) in &readings {
            let state = &read.state;
            let label = match state {
                Some(PowerState::On) => "on",
                Some(PowerState::Off) => "off",
                Some(PowerState::PoweringOn) => "powering_on",
                Some(PowerState::PoweringOff) => "powering_off",
                Some(PowerState::Unknown) | None => "unknown",
            };
            *by_state.entry(label).or_default() += 1;
            let off_watts = server_to_core(server).map(|s| s.power.off_watts).unwrap_or(0.0);
            fleet += read.watts.unwrap_or(if *state == Some(PowerState::Off) { off_watts } else { 0.0 });
            let name = server.name_any();
            let status = server.status.clone().unwrap_or_default();
            let mut facts = crate::index::power_facts(server, links.node_of(&name).is_some());
            if let Some(read) = state {
                facts.on = *read != PowerState::Off;
            }
            let standing = (ironclaim_core::identity::unadopted(facts), links.mismatch(&name));
            if standing.1.is_some() {
                *held.entry("identity_mismatch").or_default() += 1;
            } else if standing.0.is_some() {
                *held.entry("unadopted").or_default() += 1;
            }
            let address = server.spec.bmc.as_ref().map(|b| b.address.as_str());
            if let Some(patch) = sweep_patch(&status, server.metadata.resource_version.as_deref(), address, read, standing, now) {
                writes.push((name, patch));
            }
        }
        // Written SWEEP_IN_FLIGHT at a time: one after another, a fleet of
        // 5,000 took ten minutes to record its first sweep.
        futures::stream::iter(writes)
            .for_each_concurrent(SWEEP_IN_FLIGHT, |(name, patch)| {
                let api = api.clone();
                async move {
                    match api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                        Ok(_) => {}
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            tracing::debug!(server = %name, "the server changed since the sweep read it; its status is written next sweep")
                        }
                        Err(err) => tracing::warn!(server = %name, error = %err, "writing the server's status failed"),
                    }
                }
            })
            .await;
        self.metrics.set_servers_by_power_state(by_state);
        self.metrics.fleet_watts.set(fleet);
        for (reason, n) in held {
            self.metrics.set_servers_held(reason, n);
        }
        self.write_pool_statuses().await;
    }

    /// Each ServerPool's status, written where it changed: its usage, and
    /// whether its spec could be read. A pool or pod the index could not
    /// read is said, not dropped: the pool's `Valid` condition and a
    /// Warning Event on it, a Warning Event on the pod.
    async fn write_pool_statuses(&self) {
        let now = now_s();
        let (changed, invalid_pods) = {
            let index = self.index.lock().unwrap_or_else(PoisonError::into_inner);
            let (snapshot, problems) = index.snapshot(now, self.backoff);
            let usage = provision::pool_usage(&snapshot);
            // The arrivals each pool's warm floors count, kept on its status.
            let membership = ironclaim_core::warm::Membership::of(&snapshot);
            let mut arrivals: BTreeMap<&str, Vec<ironclaim_core::Arrival>> = BTreeMap::new();
            for a in &snapshot.arrivals {
                if let Some(pool) = membership.index(&a.server).and_then(|i| membership.pool(i)) {
                    arrivals.entry(pool.name.as_str()).or_default().push(a.clone());
                }
            }
            let mut changed: Vec<(String, ironclaim_k8s::api::serverpool::ServerPoolStatus, Option<String>)> = Vec::new();
            for (name, pool) in &index.pools {
                let invalid = problems.iter().find(|p| p.object == format!("ServerPool {name}")).map(|p| p.error.clone());
                let mut status = match usage.iter().find(|u| u.pool == *name) {
                    Some(u) => pools::status_of(u, pool.status.as_ref(), pool.metadata.generation, now),
                    None => pool.status.clone().unwrap_or_default(),
                };
                let keep_s = pools::arrival_history_s(snapshot.pools.iter().find(|p| p.name == *name));
                status.arrivals =
                    pools::merge_arrivals(&status.arrivals, arrivals.get(name.as_str()).map(Vec::as_slice).unwrap_or_default(), now, keep_s);
                pools::set_valid(&mut status, invalid.as_deref(), pool.metadata.generation, now);
                if pool.status.as_ref() != Some(&status) {
                    changed.push((name.clone(), status, invalid));
                }
            }
            let invalid_pods: Vec<(String, String)> =
                problems.iter().filter_map(|p| Some((p.object.strip_prefix("Pod ")?.to_string(), p.error.clone()))).collect();
            (changed, invalid_pods)
        };
        let api: Api<ServerPool> = Api::all(self.client.clone());
        for (name, status, invalid) in changed {
            if let Some(error) = &invalid {
                tracing::warn!(pool = %name, %error, "the ServerPool cannot be read; its servers are claimed by no other pool");
                self.notes.warn(crate::scaledown::notes::Kind::ServerPool, &name, "InvalidSpec", error).await;
            }
            let patch = pools::status_patch(&status);
            if let Err(err) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                tracing::warn!(pool = %name, error = %err, "writing the pool's status failed");
            }
        }
        for (key, error) in invalid_pods {
            let (namespace, name) = key.split_once('/').unwrap_or(("default", &key));
            self.claims.events().warn(namespace, name, None, "InvalidPod", &format!("ironclaim cannot read this pod: {error}")).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn server(claim: Option<&str>, claimed_at: Option<jiff::Timestamp>) -> Server {
        let mut s: Server = serde_json::from_value(json!({
            "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server", "metadata": {"name": "r1-u01"},
            "spec": {"bmc": {"address": "https://10.0.0.1/redfish/v1/Systems/1", "credentialsSecretRef": {"name": "bmc", "namespace": "ns"}},
                     "hardware": {"cpu": "16", "memory": "64Gi"}}
        }))
        .unwrap();
        let status = s.status.get_or_insert_with(Default::default);
        status.claim = claim.map(str::to_string);
        status.claimed_at = claimed_at.map(Time);
        s
    }

    const GRACE: Duration = Duration::from_secs(60);

    #[test]
    fn a_claim_whose_serverclaim_is_missing_is_an_orphan_only_after_the_opening_grace() {
        let now: jiff::Timestamp = "2026-11-30T08:00:00Z".parse().unwrap();
        let claims = BTreeMap::new();
        let ago = |s: i64| now - jiff::SignedDuration::from_secs(s);
        assert_eq!(orphaned_claim(&server(Some("c1"), Some(ago(5))), &claims, now, GRACE), None, "still being opened");
        assert_eq!(orphaned_claim(&server(Some("c1"), Some(ago(59))), &claims, now, GRACE), None);
        assert_eq!(orphaned_claim(&server(Some("c1"), Some(ago(61))), &claims, now, GRACE).as_deref(), Some("c1"));
        assert_eq!(orphaned_claim(&server(Some("c1"), None), &claims, now, GRACE).as_deref(), Some("c1"), "no stamp: an old claim");
        // A clock ahead of ours is not old.
        assert_eq!(orphaned_claim(&server(Some("c1"), Some(now + jiff::SignedDuration::from_secs(300))), &claims, now, GRACE), None);
        assert_eq!(orphaned_claim(&server(None, None), &claims, now, GRACE), None);
        assert_eq!(orphaned_claim(&server(Some(""), None), &claims, now, GRACE), None);
        let mut held = BTreeMap::new();
        held.insert(
            "c1".to_string(),
            serde_json::from_value(json!({"apiVersion": "ironclaim.dev/v1alpha1", "kind": "ServerClaim",
            "metadata": {"name": "c1"}, "spec": {"server": "r1-u01", "pool": "p", "pods": []}}))
            .unwrap(),
        );
        assert_eq!(orphaned_claim(&server(Some("c1"), None), &held, now, GRACE), None, "its ServerClaim exists");
    }

    #[test]
    fn a_lock_is_stale_only_when_its_server_does_not_name_its_holder_or_is_gone_after_the_grace() {
        let now: jiff::Timestamp = "2026-11-30T08:00:00Z".parse().unwrap();
        let lock = |holder: &str, ago: Option<i64>| Lock {
            server: "r1-u01".into(),
            holder: holder.into(),
            acquired: ago.map(|s| now - jiff::SignedDuration::from_secs(s)),
        };
        assert!(!stale_lock(&lock("c1", Some(5)), Some(&server(None, None)), now, GRACE), "still being opened");
        assert!(!stale_lock(&lock("c1", Some(59)), Some(&server(None, None)), now, GRACE));
        assert!(stale_lock(&lock("c1", Some(61)), Some(&server(None, None)), now, GRACE));
        assert!(stale_lock(&lock("c1", None), Some(&server(None, None)), now, GRACE), "no stamp: an old lock");
        assert!(!stale_lock(&lock("c1", Some(3600)), Some(&server(Some("c1"), None)), now, GRACE), "the server names its holder");
        assert!(stale_lock(&lock("c1", Some(3600)), Some(&server(Some("c2"), None)), now, GRACE), "another claim on the server");
        assert!(!stale_lock(&lock("c1", Some(-300)), Some(&server(None, None)), now, GRACE), "a clock ahead of ours");
        assert!(!stale_lock(&lock("c1", Some(5)), None, now, GRACE), "a server deleted while it opens: after the grace");
        assert!(stale_lock(&lock("c1", Some(61)), None, now, GRACE), "the server is gone");
    }

    #[test]
    fn the_sweep_writes_changes_only_and_never_undoes_a_claimed_transition() {
        let adopted = |now_s| {
            let mut c = Vec::new();
            timeline::set_condition(&mut c, ADOPTED_CONDITION, true, "Adopted", "ironclaim may claim it and power it off when idle", now_s, None);
            c
        };
        let status = |power: Option<PowerState>, claim: Option<&str>, watts: Option<i64>| ServerStatus {
            power_state: power,
            claim: claim.map(str::to_string),
            watts,
            conditions: adopted(1),
            ..ServerStatus::default()
        };
        let read = |state: Option<PowerState>, watts: Option<f64>| Reading { state, watts, identity: None, configured: None };
        let patch = |s: &ServerStatus, state, watts| sweep_patch(s, Some("7"), None, &read(state, watts), (None, None), 2);
        use PowerState::*;
        assert_eq!(patch(&status(Some(On), None, Some(200)), Some(On), Some(200.2)), None);
        assert_eq!(patch(&status(Some(On), None, Some(200)), Some(On), Some(250.0)), Some(json!({"status": {"watts": 250}})));
        assert_eq!(patch(&status(Some(On), None, None), Some(Off), None), Some(json!({"status": {"powerState": "Off"}})));
        assert_eq!(patch(&status(None, None, None), None, None), Some(json!({"status": {"powerState": "Unknown"}})));
        // Claimed and powering on: the BMC still says Off until the power-on lands.
        assert_eq!(patch(&status(Some(PoweringOn), Some("c1"), None), Some(Off), None), None);
        assert_eq!(patch(&status(Some(PoweringOff), Some("c1"), None), Some(On), Some(90.0)), Some(json!({"status": {"watts": 90}})));
        // Unclaimed, a stale transition is corrected.
        assert_eq!(patch(&status(Some(PoweringOn), None, None), Some(Off), None), Some(json!({"status": {"powerState": "Off"}})));
        // A spare ironclaim recorded powering on and reads off: its power-on
        // may not have landed yet, so it stays ironclaim's; read off again,
        // it no longer is.
        let spare = ServerStatus { powered_on_by_ironclaim: true, ..status(Some(PoweringOn), None, None) };
        assert_eq!(patch(&spare, Some(Off), None), Some(json!({"status": {"powerState": "Off"}})));
        let spare = ServerStatus { powered_on_by_ironclaim: true, ..status(Some(Off), None, None) };
        assert_eq!(patch(&spare, Some(Off), None), Some(json!({"status": {"poweredOnByIronclaim": false}})));
        let spare = ServerStatus { powered_on_by_ironclaim: true, ..status(Some(On), None, None) };
        assert_eq!(patch(&spare, Some(On), None), None);
    }

    #[test]
    fn the_sweep_records_identity_once_and_a_bmc_answering_for_another_machine_as_reported() {
        let read = |uuid: &str| crate::provider::SystemIdentity { uuid: Some(uuid.into()), serial_number: Some("SN1".into()) };
        let first = identity_patch(None, Some("https://bmc/redfish/v1/Systems/1"), &read("AAAA")).expect("recorded on first contact");
        assert_eq!((first.system_uuid.as_deref(), first.serial_number.as_deref()), (Some("AAAA"), Some("SN1")));
        assert_eq!(identity_patch(Some(&first), Some("https://bmc/redfish/v1/Systems/1"), &read("aaaa")), None, "the same machine");
        let moved = identity_patch(Some(&first), Some("https://other/redfish/v1/Systems/1"), &read("BBBB")).expect("another machine");
        assert_eq!((moved.system_uuid.as_deref(), moved.reported_system_uuid.as_deref()), (Some("AAAA"), Some("BBBB")));
        assert_eq!(moved.bmc_address, first.bmc_address, "kept, so it is read again until resolved");
        let back = identity_patch(Some(&moved), Some("https://bmc/redfish/v1/Systems/1"), &read("AAAA")).expect("pointed back");
        assert_eq!(back, first);
        let none = crate::provider::SystemIdentity::default();
        assert_eq!(identity_patch(None, None, &none), None, "nothing to record");
    }

    /// Issue 16, item 9: an API server that is down for a minute gives
    /// two warnings, not one per retry, and the recovery says how many
    /// failures it ended.
    #[test]
    fn a_failure_that_repeats_is_reported_once_a_period_with_the_count() {
        let start = std::time::Instant::now();
        let mut t = Throttle::new(Duration::from_secs(60));
        let at = |s: u64| start + Duration::from_millis(s * 100);
        let reported: Vec<(u64, u64)> = (0..1200).filter_map(|i| t.failed(at(i)).map(|n| (i, n))).collect();
        assert_eq!(reported, [(0, 0), (600, 599)], "120 s of failures every 100 ms");
        assert_eq!(t.recovered(), Some(1200));
        assert_eq!(t.recovered(), None, "one success is told once");
        assert_eq!(t.failed(at(1201)), Some(0), "a new run is reported at once");
    }

    /// Issue 16, item 1: a server whose credentials Secret is missing is
    /// held back by its condition, which a read that passes clears.
    #[test]
    fn the_sweep_holds_back_a_server_whose_bmc_configuration_is_broken_until_a_read_passes() {
        let missing = crate::provider::PowerError {
            reason: ironclaim_k8s::api::serverclaim::FailureReason::BmcCredentialsMissing,
            label: "credentials_missing",
            message: "the BMC credentials Secret metal/bmc-r1 (spec.bmc.credentialsSecretRef of Server r1-u01) does not exist".into(),
        };
        let unreachable = crate::provider::PowerError {
            reason: ironclaim_k8s::api::serverclaim::FailureReason::BmcUnreachable,
            label: "unreachable",
            message: "connection refused".into(),
        };
        let read = |configured| Reading { state: None, watts: None, identity: None, configured };
        let status = ServerStatus::default();
        let patch = sweep_patch(&status, Some("7"), None, &read(configured_by(&Err(missing))), (None, None), 5).expect("a condition");
        assert_eq!(patch["metadata"]["resourceVersion"], "7", "the whole list is written on the version it was computed from");
        let mut held = status.clone();
        held.conditions = serde_json::from_value(patch["status"]["conditions"].clone()).unwrap();
        let c = held.misconfigured().expect("BmcConfigured False");
        assert_eq!(c.reason, "BmcCredentialsMissing");
        assert!(c.message.contains("metal/bmc-r1"), "{}", c.message);
        let core = server_to_core(&Server { status: Some(held.clone()), ..server(None, None) }).unwrap();
        assert_eq!(core.health, ironclaim_core::model::Health::Misconfigured);
        assert!(core.health.hands_off());
        // Another failure says nothing of the configuration: it stays.
        let patch = sweep_patch(&held, Some("7"), None, &read(configured_by(&Err(unreachable))), (None, None), 6);
        assert!(patch.is_none_or(|p| p["status"].get("conditions").is_none()));
        // A read that passes clears it.
        let patch = sweep_patch(&held, Some("7"), None, &read(configured_by(&Ok(PowerState::Off))), (None, None), 7).expect("cleared");
        held.conditions = serde_json::from_value(patch["status"]["conditions"].clone()).unwrap();
        assert!(held.misconfigured().is_none());
        assert_eq!(server_to_core(&Server { status: Some(held), ..server(None, None) }).unwrap().health, ironclaim_core::model::Health::Healthy);
        // A server that never had the condition does not get one.
        let patch = sweep_patch(&ServerStatus::default(), Some("7"), None, &read(configured_by(&Ok(PowerState::Off))), (None, None), 7);
        assert!(patch.is_none_or(|p| p["status"].get("conditions").is_none_or(|c| !c.to_string().contains("BmcConfigured"))));
    }

    #[test]
    fn the_sweep_says_on_the_server_why_it_is_held_back() {
        let status = ServerStatus { power_state: Some(PowerState::On), ..ServerStatus::default() };
        let read = Reading { state: Some(PowerState::On), watts: None, identity: None, configured: None };
        let patch =
            sweep_patch(&status, Some("7"), None, &read, (Some("it is on and not ironclaim's"), Some("node n says it is a")), 5).expect("conditions");
        let conditions: Vec<Condition> = serde_json::from_value(patch["status"]["conditions"].clone()).unwrap();
        let of = |t: &str| conditions.iter().find(|c| c.type_ == t).map(|c| (c.status.as_str(), c.reason.as_str(), c.message.clone()));
        assert_eq!(of(ADOPTED_CONDITION).map(|c| (c.0, c.1)), Some(("False", "Unadopted")));
        let (st, reason, message) = of(IDENTITY_MISMATCH_CONDITION).unwrap();
        assert_eq!((st, reason), ("True", "IdentityMismatch"));
        assert!(message.contains("node n says it is a"), "{message}");
    }

    #[test]
    fn the_median_pod_is_weighted_by_the_pods_of_each_claim() {
        let ms = Duration::from_millis;
        let sent = [(ms(10), 1), (ms(20), 1), (ms(90), 6)];
        assert_eq!(median_by_pods(&sent), Some(ms(90)));
        assert_eq!(median_by_pods(&sent[..2]), Some(ms(10)));
        assert_eq!(median_by_pods(&[]), None);
    }
}
