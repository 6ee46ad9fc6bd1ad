//! The controller's requests to the API server, as one layer under its
//! client: each is counted by verb (`ironclaim_api_requests_total`), and
//! all are held to a rate (`--kube-api-qps`, `--kube-api-burst`), so that
//! a burst of claims cannot flood the API server.
//!
//! The rate is a token bucket: `burst` requests may leave at once, then
//! one per `1/qps` seconds. A request over the rate waits its turn; none
//! is refused. The wait is counted (`ironclaim_api_throttled_seconds_total`).
//! A watch counts once, when it is opened.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

type Labels = Vec<(String, String)>;

/// The counts the layer keeps; cheap to clone (every clone counts into
/// the same metrics).
#[derive(Clone, Debug, Default)]
pub struct ApiRequests {
    /// Requests sent, by verb (`get`, `list`, `watch`, `create`,
    /// `update`, `patch`, `delete`) and resource (see [`resource`]).
    pub requests: Family<Labels, Counter>,
    /// Seconds requests waited for the rate, summed.
    pub throttled_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
}

impl ApiRequests {
    /// Requests sent so far with this verb to this resource.
    pub fn sent(&self, verb: &str, resource: &str) -> u64 {
        self.requests.get_or_create(&vec![("verb".into(), verb.into()), ("resource".into(), resource.into())]).get()
    }
}

/// How many requests per second may leave, and how many at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateLimit {
    pub qps: f64,
    pub burst: u32,
}

impl RateLimit {
    /// `--kube-api-qps`'s and `--kube-api-burst`'s defaults.
    pub const DEFAULT: RateLimit = RateLimit { qps: 100.0, burst: 200 };
}

/// A token bucket that hands out turns: [`Bucket::turn`] says how long
/// the caller waits before its request may leave. Turns are never refused
/// and come in the order asked, so a waiting request cannot starve.
#[derive(Debug)]
pub struct Bucket {
    limit: RateLimit,
    /// Tokens at `at`; below zero when turns are booked ahead.
    state: Mutex<(f64, Instant)>,
}

impl Bucket {
    pub fn new(limit: RateLimit, now: Instant) -> Self {
        Bucket { limit, state: Mutex::new((f64::from(limit.burst), now)) }
    }

    /// Tokens a background request leaves in the bucket: half the burst,
    /// for the controller's own requests.
    fn reserve(&self) -> f64 {
        f64::from(self.limit.burst / 2)
    }

    /// Takes a token at `now` for a background request, only if more than
    /// [`Bucket::reserve`] are there, never booking ahead: zero when taken,
    /// else how long until one may be.
    pub fn spare_turn(&self, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (tokens, at) = *state;
        let refilled = (tokens + now.saturating_duration_since(at).as_secs_f64() * self.limit.qps).min(f64::from(self.limit.burst));
        let short = self.reserve() + 1.0 - refilled;
        if short <= 0.0 {
            *state = (refilled - 1.0, now.max(at));
            Duration::ZERO
        } else {
            *state = (refilled, now.max(at));
            // Never zero: that is a token taken.
            Duration::from_secs_f64(short / self.limit.qps).max(Duration::from_nanos(1))
        }
    }

    /// Takes a token at `now`: how long to wait until it is there.
    pub fn turn(&self, now: Instant) -> Duration {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let (tokens, at) = *state;
        let refilled = tokens + now.saturating_duration_since(at).as_secs_f64() * self.limit.qps;
        let tokens = refilled.min(f64::from(self.limit.burst)) - 1.0;
        *state = (tokens, now.max(at));
        if tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-tokens / self.limit.qps) }
    }
}

/// The layer: counts every request, and with a [`RateLimit`], holds each
/// to its turn.
#[derive(Clone, Debug)]
pub struct ApiLayer {
    requests: ApiRequests,
    bucket: Option<Arc<Bucket>>,
    /// Its requests yield to the others of the bucket.
    background: bool,
}

impl ApiLayer {
    /// Counts into `requests`; with `limit`, no faster than it.
    ///
    /// # Panics
    /// When `limit` allows no request (qps not above zero, burst zero):
    /// the command line refuses those first.
    pub fn new(requests: ApiRequests, limit: Option<RateLimit>) -> Self {
        if let Some(limit) = limit {
            assert!(limit.qps > 0.0 && limit.burst > 0, "a rate limit must allow requests: {limit:?}");
        }
        ApiLayer { requests, bucket: limit.map(|l| Arc::new(Bucket::new(l, Instant::now()))), background: false }
    }

    /// The same count and rate for a client whose requests can wait (the
    /// Events'): each takes a token only while more than half the burst
    /// is left, and never books one ahead, so the controller's own
    /// requests always find half the burst and are never queued behind
    /// them. Both clients together stay within the one rate.
    pub fn background(&self) -> Self {
        ApiLayer { background: true, ..self.clone() }
    }
}

impl<S> tower::Layer<S> for ApiLayer {
    type Service = ApiService<S>;
    fn layer(&self, inner: S) -> ApiService<S> {
        ApiService { inner, requests: self.requests.clone(), bucket: self.bucket.clone(), background: self.background, turn: Turn::None }
    }
}

/// The service [`ApiLayer`] wraps the client's in. The client calls it
/// from one task, one request at a time (kube buffers its stack), so
/// waiting in `poll_ready` holds every later request behind this one, in
/// order.
pub struct ApiService<S> {
    inner: S,
    requests: ApiRequests,
    bucket: Option<Arc<Bucket>>,
    background: bool,
    turn: Turn,
}

/// Where the next request stands with the bucket.
enum Turn {
    /// No turn taken yet.
    None,
    /// Taken; the request may leave when this ends.
    Waiting(Pin<Box<tokio::time::Sleep>>),
    /// Its time has come.
    Granted,
}

/// The verb of a request, as the API server's audit log names it.
pub fn verb<B>(request: &::http::Request<B>) -> &'static str {
    let query = request.uri().query().unwrap_or_default();
    let watching = query.split('&').any(|pair| pair == "watch=true" || pair == "watch=1");
    match *request.method() {
        ::http::Method::GET if watching => "watch",
        // A collection's path ends in its plural; an object's in its name.
        // Without discovery, tell them by what the query asks: only lists
        // page, select and resume.
        ::http::Method::GET if is_list(request.uri().path(), query) => "list",
        ::http::Method::GET => "get",
        ::http::Method::POST => "create",
        ::http::Method::PUT => "update",
        ::http::Method::PATCH => "patch",
        ::http::Method::DELETE => "delete",
        _ => "other",
    }
}

/// The resource a request is about, as its plural with the subresource:
/// `pods`, `pods/eviction`, `serverclaims/status`, `configmaps`; `other`
/// for a path outside `/api` and `/apis`.
pub fn resource<B>(request: &::http::Request<B>) -> String {
    let Some(rest) = below_version(request.uri().path()) else { return "other".into() };
    // In a namespace: namespaces/NS/PLURAL/...; `namespaces/NS` alone is
    // a Namespace.
    let rest = match rest.as_slice() {
        ["namespaces", _ns, plural, more @ ..] => [&[*plural][..], more].concat(),
        _ => rest,
    };
    match rest.as_slice() {
        [] => "other".into(),
        [plural] | [plural, _] => (*plural).to_string(),
        [plural, _, sub, ..] => format!("{plural}/{sub}"),
    }
}

/// The segments of an API path after `/api/v1` or `/apis/GROUP/VERSION`;
/// None for any other path.
fn below_version(path: &str) -> Option<Vec<&str>> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match segments.as_slice() {
        ["api", _version, rest @ ..] | ["apis", _, _version, rest @ ..] => Some(rest.to_vec()),
        _ => None,
    }
}

/// A GET of a collection: `/api/v1/pods`, `/api/v1/namespaces/x/pods`,
/// `/apis/g/v/namespaces/x/kind`, or one that asks what only a list takes.
fn is_list(path: &str, query: &str) -> bool {
    if query.split('&').any(|pair| ["limit=", "continue=", "labelSelector=", "fieldSelector="].iter().any(|p| pair.starts_with(p))) {
        return true;
    }
    let Some(rest) = below_version(path) else { return false };
    match rest.as_slice() {
        // `namespaces` itself, a plural at cluster scope, or one in a namespace.
        [_plural] => true,
        ["namespaces", _ns, _plural] => true,
        _ => false,
    }
}

impl<S, B> tower::Service<::http::Request<B>> for ApiService<S>
where
    S: tower::Service<::http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        if let Some(bucket) = &self.bucket {
            loop {
                if matches!(self.turn, Turn::None) {
                    let wait = if self.background { bucket.spare_turn(Instant::now()) } else { bucket.turn(Instant::now()) };
                    self.requests.throttled_seconds.inc_by(wait.as_secs_f64());
                    self.turn = if wait.is_zero() { Turn::Granted } else { Turn::Waiting(Box::pin(tokio::time::sleep(wait))) };
                }
                if let Turn::Waiting(sleep) = &mut self.turn {
                    if sleep.as_mut().poll(cx).is_pending() {
                        return Poll::Pending;
                    }
                    // A background request asks again once the wait is
                    // over; the others' token was booked with it.
                    self.turn = if self.background { Turn::None } else { Turn::Granted };
                    continue;
                }
                break;
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: ::http::Request<B>) -> Self::Future {
        self.requests.requests.get_or_create(&vec![("verb".into(), verb(&request).into()), ("resource".into(), resource(&request))]).inc();
        self.turn = Turn::None;
        self.inner.call(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn get(uri: &str) -> ::http::Request<()> {
        ::http::Request::get(uri).body(()).expect("request")
    }

    #[test]
    fn resources_are_named_by_plural_and_subresource() {
        assert_eq!(resource(&get("/api/v1/pods?watch=true")), "pods");
        assert_eq!(resource(&get("/api/v1/namespaces/x/pods/p")), "pods");
        assert_eq!(resource(&get("/api/v1/namespaces/x/pods/p/eviction")), "pods/eviction");
        assert_eq!(resource(&get("/api/v1/namespaces/x")), "namespaces");
        assert_eq!(resource(&get("/api/v1/namespaces")), "namespaces");
        assert_eq!(resource(&get("/api/v1/namespaces/x/events")), "events");
        assert_eq!(resource(&get("/apis/ironclaim.dev/v1alpha1/serverclaims/c/status")), "serverclaims/status");
        assert_eq!(resource(&get("/apis/ironclaim.dev/v1alpha1/servers")), "servers");
        assert_eq!(resource(&get("/api/v1/nodes/n")), "nodes");
        assert_eq!(resource(&get("/version")), "other");
    }

    #[test]
    fn verbs_are_named_as_the_audit_log_names_them() {
        assert_eq!(verb(&get("/api/v1/pods?watch=true&resourceVersion=5")), "watch");
        assert_eq!(verb(&get("/api/v1/pods?limit=500")), "list");
        assert_eq!(verb(&get("/api/v1/namespaces/x/configmaps")), "list");
        assert_eq!(verb(&get("/apis/ironclaim.dev/v1alpha1/servers")), "list");
        assert_eq!(verb(&get("/apis/ironclaim.dev/v1alpha1/servers/r1-u01")), "get");
        assert_eq!(verb(&get("/api/v1/namespaces/x/configmaps/ledger")), "get");
        assert_eq!(verb(&get("/api/v1/namespaces")), "list");
        assert_eq!(verb(&get("/api/v1/namespaces/x")), "get");
        assert_eq!(verb(&get("/version")), "get");
        let patch = ::http::Request::patch("/apis/ironclaim.dev/v1alpha1/servers/a/status").body(()).expect("request");
        assert_eq!(verb(&patch), "patch");
    }

    #[test]
    fn a_burst_leaves_at_once_and_the_rest_one_per_period() {
        let t0 = Instant::now();
        let bucket = Bucket::new(RateLimit { qps: 10.0, burst: 3 }, t0);
        let waits: Vec<Duration> = (0..5).map(|_| bucket.turn(t0)).collect();
        assert_eq!(&waits[..3], &[Duration::ZERO; 3]);
        assert_eq!(waits[3], Duration::from_millis(100));
        assert_eq!(waits[4], Duration::from_millis(200));
        // A second later, the bucket has refilled past the booked turns.
        assert_eq!(bucket.turn(t0 + Duration::from_secs(1)), Duration::ZERO);
    }

    /// The layer under a service: every request counted by verb, and the
    /// ones past the burst held to the rate, in order.
    #[tokio::test(start_paused = true)]
    async fn the_layer_counts_each_request_and_holds_those_past_the_burst() {
        use tower::{Layer, Service, ServiceExt};
        let requests = ApiRequests::default();
        let layer = ApiLayer::new(requests.clone(), Some(RateLimit { qps: 10.0, burst: 2 }));
        let start = tokio::time::Instant::now();
        let inner = tower::service_fn(move |_: ::http::Request<()>| async move { Ok::<_, std::convert::Infallible>(start.elapsed()) });
        let mut service = layer.layer(inner);
        let mut left = Vec::new();
        for uri in ["/api/v1/pods?watch=true", "/api/v1/nodes", "/api/v1/nodes/a", "/api/v1/nodes/b", "/api/v1/nodes/c"] {
            left.push(service.ready().await.expect("ready").call(get(uri)).await.expect("call"));
        }
        let ms: Vec<u128> = left.iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [0, 0, 100, 200, 300]);
        assert_eq!((requests.sent("watch", "pods"), requests.sent("list", "nodes"), requests.sent("get", "nodes")), (1, 1, 3));
        assert!((requests.throttled_seconds.get() - 0.3).abs() < 1e-9, "{}", requests.throttled_seconds.get());
        // Without a limit, nothing waits.
        let mut free = ApiLayer::new(ApiRequests::default(), None)
            .layer(tower::service_fn(move |_: ::http::Request<()>| async move { Ok::<_, std::convert::Infallible>(start.elapsed()) }));
        let before = start.elapsed();
        for _ in 0..10 {
            assert_eq!(free.ready().await.expect("ready").call(get("/version")).await.expect("call"), before);
        }
    }

    proptest! {
        /// Whatever the arrivals, the requests that leave in any window of
        /// length w number at most burst + qps * w (the bound the flags
        /// promise), and no request waits longer than the queue ahead of it
        /// needs.
        #[test]
        fn no_window_sees_more_than_the_burst_and_the_rate(
            qps in 1u32..200,
            burst in 1u32..50,
            gaps_ms in proptest::collection::vec(0u64..50, 1..400),
        ) {
            let t0 = Instant::now();
            let limit = RateLimit { qps: f64::from(qps), burst };
            let bucket = Bucket::new(limit, t0);
            let mut now = t0;
            let mut leaves = Vec::new();
            for gap in gaps_ms {
                now += Duration::from_millis(gap);
                leaves.push(now + bucket.turn(now));
            }
            // Turns are handed out in order.
            prop_assert!(leaves.windows(2).all(|w| w[0] <= w[1]));
            window_bound(&leaves, qps, burst)?;
        }

        /// Background requests mixed in (each asking again when told to
        /// wait): all the requests together keep the bound, and a
        /// controller request that arrives to a bucket untouched for a
        /// second leaves at once, however many background ones wait.
        #[test]
        fn background_requests_keep_the_bound_and_leave_the_reserve(
            qps in 1u32..200,
            burst in 1u32..50,
            arrivals in proptest::collection::vec((0u64..50, proptest::bool::ANY), 1..300),
        ) {
            let t0 = Instant::now();
            let bucket = Bucket::new(RateLimit { qps: f64::from(qps), burst }, t0);
            // (when, background, arrived after a quiet second)
            let mut waiting: std::collections::BinaryHeap<std::cmp::Reverse<(Instant, bool, bool)>> = Default::default();
            let mut now = t0;
            let mut last_foreground = t0;
            for (gap, background) in arrivals {
                now += Duration::from_millis(gap);
                waiting.push(std::cmp::Reverse((now, background, false)));
            }
            let mut leaves = Vec::new();
            let mut asks = 0;
            while let Some(std::cmp::Reverse((at, background, _))) = waiting.pop() {
                asks += 1;
                prop_assert!(asks < 1_000_000, "background requests never leave");
                if background {
                    let wait = bucket.spare_turn(at);
                    if wait.is_zero() {
                        leaves.push(at);
                    } else {
                        waiting.push(std::cmp::Reverse((at + wait, true, false)));
                    }
                } else {
                    let quiet = at.duration_since(last_foreground) >= Duration::from_secs(1) && at > t0;
                    let wait = bucket.turn(at);
                    if quiet {
                        prop_assert_eq!(wait, Duration::ZERO, "a controller request after a quiet second waited");
                    }
                    last_foreground = at + wait;
                    leaves.push(at + wait);
                }
            }
            leaves.sort();
            window_bound(&leaves, qps, burst)?;
        }
    }

    /// No window of `leaves` (sorted) holds more than burst + qps * its
    /// length.
    fn window_bound(leaves: &[Instant], qps: u32, burst: u32) -> Result<(), proptest::test_runner::TestCaseError> {
        for (i, start) in leaves.iter().enumerate() {
            for (j, end) in leaves.iter().enumerate().skip(i) {
                let window = end.duration_since(*start).as_secs_f64();
                let allowed = f64::from(burst) + f64::from(qps) * window + 1e-6;
                prop_assert!((j - i + 1) as f64 <= allowed, "{} requests in {window} s", j - i + 1);
            }
        }
        Ok(())
    }
}
