//! The claim lock ledger against the real API server: its shards are made
//! by the first take that needs them, each refuses takes past its own cap,
//! and the single ledger of an earlier version still holds its locks until
//! they are given up there. With `--ignored`, the measurement of
//! docs/bench.md: write sizes and take latencies at 10,000 and 50,000 locks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::*;
use futures::{StreamExt, TryStreamExt};
use ironclaim_controller::Error;
use ironclaim_controller::locks::{LEDGER_CAP_BYTES, LEDGER_LABEL, LEGACY_LEDGER_NAME, Locks, SHARD_COUNT, Taken, ledger_of};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

/// A Server with only a name: all a take reads of it.
fn server(name: &str) -> ironclaim_k8s::api::Server {
    serde_json::from_value(json!({
        "apiVersion": "ironclaim.dev/v1alpha1", "kind": "Server",
        "metadata": {"name": name},
        "spec": {"hardware": {"cpu": "8", "memory": "8Gi"}}
    }))
    .unwrap()
}

fn entry(holder: &str) -> String {
    json!({"holder": holder, "acquired": "2026-12-01T00:00:00.000000Z"}).to_string()
}

fn ledgers(client: &Client) -> Api<ConfigMap> {
    Api::namespaced(client.clone(), NAMESPACE)
}

/// The names of the ledger ConfigMaps that exist.
async fn ledger_names(client: &Client) -> Vec<String> {
    let listed = ledgers(client).list(&ListParams::default().labels(LEDGER_LABEL)).await.unwrap();
    listed.items.iter().map(|l| l.name_any()).collect()
}

async fn holder_in(client: &Client, ledger: &str, server: &str) -> Option<String> {
    let read = ledgers(client).get_opt(ledger).await.unwrap();
    read.and_then(|l| l.data)
        .and_then(|mut d| d.remove(server))
        .map(|v| serde_json::from_str::<serde_json::Value>(&v).unwrap()["holder"].as_str().unwrap().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_in_the_single_ledger_of_an_earlier_version_holds_until_given_up_there() {
    let (_env, client) = setup().await;
    let legacy: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": LEGACY_LEDGER_NAME, "labels": {LEDGER_LABEL: "true"}},
        "data": {"old-1": entry("c-old"), "old-2": entry("c-gone")}
    }))
    .unwrap();
    ledgers(&client).create(&Default::default(), &legacy).await.unwrap();
    let (a, b) = (Locks::new(client.clone(), NAMESPACE), Locks::new(client.clone(), NAMESPACE));
    // A keeps the legacy ledger as it reads now: old-1 held.
    a.prepare().await.unwrap();
    assert_eq!(ledger_names(&client).await, [LEGACY_LEDGER_NAME], "preparing creates no shard");

    match b.take(&server("old-1"), "c-new").await {
        Err(Error::ServerHeld { holder, .. }) => assert_eq!(holder, "c-old"),
        other => panic!("old-1 is locked in the legacy ledger: {other:?}"),
    }
    assert_eq!(a.take(&server("old-1"), "c-old").await.unwrap(), Taken::Already);
    assert_eq!(a.read("old-1").await.unwrap().map(|l| l.holder).as_deref(), Some("c-old"));
    let all = b.all().await.unwrap();
    assert_eq!(all.keys().collect::<Vec<_>>(), ["old-1", "old-2"]);
    assert_eq!(ledger_names(&client).await, [LEGACY_LEDGER_NAME], "no answer above needed a write");

    b.give_up("old-1", "c-new").await.unwrap();
    assert_eq!(holder_in(&client, LEGACY_LEDGER_NAME, "old-1").await.as_deref(), Some("c-old"), "not c-new's to give up");
    b.give_up("old-1", "c-old").await.unwrap();
    assert_eq!(holder_in(&client, LEGACY_LEDGER_NAME, "old-1").await, None, "given up by its holder, in the legacy ledger");
    assert_eq!(holder_in(&client, LEGACY_LEDGER_NAME, "old-2").await.as_deref(), Some("c-gone"), "the other lock stays");

    // A's copy still shows old-1 held: its take reads the legacy ledger again.
    assert_eq!(a.take(&server("old-1"), "c-new").await.unwrap(), Taken::Now);
    assert_eq!(holder_in(&client, &ledger_of("old-1"), "old-1").await.as_deref(), Some("c-new"));
    assert_eq!(holder_in(&client, LEGACY_LEDGER_NAME, "old-1").await, None, "nothing is added to the legacy ledger");
    let mut names = ledger_names(&client).await;
    names.sort();
    assert_eq!(names, [LEGACY_LEDGER_NAME.to_string(), ledger_of("old-1")], "the first take made its shard, and only it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_past_a_full_shard_is_refused_naming_it_and_the_other_shards_take() {
    let (_env, client) = setup().await;
    let full = ledger_of("full-0");
    let other = (1..).map(|i| format!("full-{i}")).find(|s| ledger_of(s) != full).unwrap();
    // Filler entries up to some 100 bytes short of the cap.
    let value = "x".repeat(1000);
    let filler: std::collections::BTreeMap<String, String> =
        (0..LEDGER_CAP_BYTES / 1010).map(|i| (format!("filler-{i:04}"), value.clone())).collect();
    let shard: ConfigMap = serde_json::from_value(json!({"metadata": {"name": full, "labels": {LEDGER_LABEL: "true"}}, "data": filler})).unwrap();
    ledgers(&client).create(&Default::default(), &shard).await.unwrap();
    let locks = Locks::new(client.clone(), NAMESPACE);
    match locks.take(&server("full-0"), "a-claim-named-long-enough-to-pass-the-cap-of-the-shard").await {
        Err(Error::ClaimLockFailed { ledger, reason, .. }) => {
            assert_eq!(ledger, format!("{NAMESPACE}/{full}"));
            assert!(reason.contains("the claim lock ledger is full"), "{reason}");
        }
        other => panic!("the shard is full: {other:?}"),
    }
    assert_eq!(locks.take(&server(&other), "a-claim-named-long-enough-to-pass-the-cap-of-the-shard").await.unwrap(), Taken::Now);
}

/// What one fill of the ledger measured.
struct Fill {
    shards: usize,
    /// Locks written straight into the shards before the takes.
    preloaded: usize,
    asked: usize,
    /// Locks in the ledger at the end.
    held: usize,
    take_ms: Vec<f64>,
    total: Duration,
    /// Each write's object as the API server stored it and sent it to the
    /// watch, in bytes.
    write_bytes: Vec<usize>,
    largest_bytes: usize,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted.get(((sorted.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(f64::NAN)
}

impl Fill {
    fn report(&mut self) -> String {
        self.take_ms.sort_by(f64::total_cmp);
        self.write_bytes.sort_unstable();
        let taken = self.take_ms.len();
        let median_bytes = self.write_bytes.get(self.write_bytes.len() / 2).copied().unwrap_or(0);
        let refused = if taken < self.asked { format!("; the lock after the {}th refused (shard full)", self.held) } else { String::new() };
        format!(
            "{} shard(s): {} locks preloaded, {} takes asked, {taken} taken, {} held at the end{refused}\n  writes: {}, object per write median {} B, max {} B; largest object at the end {} B\n  take p50 {:.1} ms, p99 {:.1} ms; total {:.1} s ({:.0} takes/s)",
            self.shards,
            self.preloaded,
            self.asked,
            self.held,
            self.write_bytes.len(),
            median_bytes,
            self.write_bytes.last().copied().unwrap_or(0),
            self.largest_bytes,
            percentile(&self.take_ms, 0.5),
            percentile(&self.take_ms, 0.99),
            self.total.as_secs_f64(),
            taken as f64 / self.total.as_secs_f64(),
        )
    }
}

/// The `i`th server of a fleet: 40 to a rack.
fn server_name(i: usize) -> String {
    format!("r{:04}-u{:02}", i / 40, i % 40)
}

fn claim_of(server: &str) -> String {
    format!("general-{server}-x7k2p")
}

/// Empties the ledger, writes `preloaded` locks of the fleet's first
/// servers straight into its shards (what `preloaded` takes would leave,
/// in one write per shard), then takes the next `asked` through
/// [`Locks::take`], 32 at a time (the controller's `open_concurrency`);
/// stops at the first take refused for a full shard.
async fn fill(client: &Client, shards: usize, preloaded: usize, asked: usize) -> Fill {
    let api = ledgers(client);
    api.delete_collection(&DeleteParams::default(), &ListParams::default().labels(LEDGER_LABEL)).await.unwrap();
    while !ledger_names(client).await.is_empty() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let acquired = jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string();
    let mut preload: std::collections::BTreeMap<String, std::collections::BTreeMap<String, String>> = Default::default();
    for name in (0..preloaded).map(server_name) {
        // The shapes measured: every shard, or the single shard 00.
        let shard = if shards == SHARD_COUNT { ledger_of(&name) } else { format!("{LEGACY_LEDGER_NAME}-00") };
        let value = json!({"holder": claim_of(&name), "acquired": acquired}).to_string();
        preload.entry(shard).or_default().insert(name, value);
    }
    for (shard, data) in preload {
        let ledger: ConfigMap = serde_json::from_value(json!({"metadata": {"name": shard, "labels": {LEDGER_LABEL: "true"}}, "data": data})).unwrap();
        api.create(&Default::default(), &ledger).await.unwrap();
    }
    // Every write from here on, as the watch sees it.
    let written = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready) = tokio::sync::oneshot::channel();
    let watching = {
        let (api, written) = (api.clone(), written.clone());
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut events = watcher::watcher(api, watcher::Config::default().labels(LEDGER_LABEL)).boxed();
            while let Some(event) = events.try_next().await.unwrap() {
                match event {
                    watcher::Event::InitDone => {
                        if let Some(tx) = ready_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    watcher::Event::Apply(ledger) => written.lock().unwrap().push(serde_json::to_vec(&ledger).unwrap().len()),
                    _ => {}
                }
            }
        })
    };
    ready.await.unwrap();

    let locks = Locks::with_shard_count(client.clone(), NAMESPACE, shards);
    locks.prepare().await.unwrap();
    let servers: Vec<_> = (preloaded..preloaded + asked).map(|i| server(&server_name(i))).collect();
    let full = AtomicBool::new(false);
    let started = Instant::now();
    let outcomes: Vec<Option<f64>> = futures::stream::iter(&servers)
        .map(|s| {
            let (locks, full) = (&locks, &full);
            async move {
                if full.load(Ordering::Relaxed) {
                    return None;
                }
                let at = Instant::now();
                match locks.take(s, &claim_of(&s.name_any())).await {
                    Ok(Taken::Now) => Some(at.elapsed().as_secs_f64() * 1000.0),
                    Err(Error::ClaimLockFailed { reason, .. }) if reason.contains("is full") => {
                        full.store(true, Ordering::Relaxed);
                        None
                    }
                    other => panic!("{}: {other:?}", s.name_any()),
                }
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    let total = started.elapsed();
    let take_ms: Vec<f64> = outcomes.into_iter().flatten().collect();
    // The last writes reach the watch.
    tokio::time::sleep(Duration::from_secs(2)).await;
    watching.abort();
    let listed = api.list(&ListParams::default().labels(LEDGER_LABEL)).await.unwrap();
    let largest_bytes = listed.items.iter().map(|l| serde_json::to_vec(l).unwrap().len()).max().unwrap_or(0);
    let held: usize = listed.items.iter().map(|l| l.data.as_ref().map_or(0, |d| d.len())).sum();
    assert_eq!(held, preloaded + take_ms.len(), "every take answered Now is in the ledger");
    let write_bytes = std::mem::take(&mut *written.lock().unwrap());
    Fill { shards, preloaded, asked, held, take_ms, total, write_bytes, largest_bytes }
}

/// The measurement of docs/bench.md ("The claim lock ledger at scale"):
/// the last 2,000 takes to 10,000 and to 50,000 locks in 32 shards, and
/// takes into one shard (the single ledger's shape) from 6,000 locks until
/// it is full.
///
/// `cargo test -p ironclaim-controller --test e2e -- --ignored lock_ledger_at_scale --nocapture`
///
/// The locks before the measured takes are written straight into the
/// shards: taking all 50,000 one by one wrote several GB of object
/// versions to etcd within the API server's five-minute compaction, and
/// etcd refused writes past its 2 GiB quota at 43,749 locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement of some minutes; docs/bench.md"]
async fn lock_ledger_at_scale() {
    let (_env, client) = setup().await;
    println!("machine: {} cores, load average {}", std::thread::available_parallelism().map_or(0, |n| n.get()), load_average());
    for (shards, preloaded, asked) in [(SHARD_COUNT, 8_000, 2_000), (SHARD_COUNT, 48_000, 2_000), (1, 6_000, 4_000)] {
        let mut fill = fill(&client, shards, preloaded, asked).await;
        println!("{}", fill.report());
    }
}

/// A decision's burst: 59 claims' takes at once (32 in flight, the
/// controller's `open_concurrency`) on a ledger already holding 1,000
/// locks, five times; the time until the last is taken.
///
/// `cargo test -p ironclaim-controller --test e2e -- --ignored lock_ledger_burst --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; docs/bench.md"]
async fn lock_ledger_burst() {
    let (_env, client) = setup().await;
    println!("machine: {} cores, load average {}", std::thread::available_parallelism().map_or(0, |n| n.get()), load_average());
    for shards in [SHARD_COUNT, 1] {
        fill(&client, shards, 1000, 0).await;
        let locks = Locks::with_shard_count(client.clone(), NAMESPACE, shards);
        locks.prepare().await.unwrap();
        let mut last_ms = Vec::new();
        for run in 0..5 {
            let servers: Vec<_> = (0..59).map(|i| server(&format!("burst{run}-{i:02}"))).collect();
            let started = Instant::now();
            futures::stream::iter(&servers)
                .map(|s| {
                    let locks = &locks;
                    async move { assert_eq!(locks.take(s, &format!("general-{}-x7k2p", s.name_any())).await.unwrap(), Taken::Now) }
                })
                .buffer_unordered(32)
                .collect::<Vec<()>>()
                .await;
            last_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        last_ms.sort_by(f64::total_cmp);
        println!(
            "{shards} shard(s): 59 takes at once, the last after {:.0} / {:.0} / {:.0} ms (min / median / max of 5)",
            last_ms[0], last_ms[2], last_ms[4]
        );
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg").ok().and_then(|l| l.split_whitespace().next().map(str::to_string)).unwrap_or_else(|| "unknown".into())
}
