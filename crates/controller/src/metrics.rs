//! Prometheus metrics, served at `/metrics` in the OpenMetrics text format.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{EncodeMetric, MetricEncoder};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// A family exported before its first child: the encoder leaves an empty
/// family out entirely, this keeps its `# HELP` and `# TYPE` lines, so
/// that a scrape always says which metrics exist and of what type.
#[derive(Debug)]
pub(crate) struct Declared<F>(pub F);

impl<F: EncodeMetric> EncodeMetric for Declared<F> {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.0.metric_type()
    }
}

fn stage_histogram() -> Histogram {
    // 0.5 s to about 2.3 h: an emulated boot and a slow PXE re-image alike.
    Histogram::new(exponential_buckets(0.5, 2.0, 15))
}

fn latency_histogram() -> Histogram {
    // 1 ms to about 16 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

fn watch_lag_histogram() -> Histogram {
    // The API stamps whole seconds, so a change seen at once reads 0 to 1 s:
    // 0.25 s to about 17 min.
    Histogram::new(exponential_buckets(0.25, 2.0, 13))
}

/// Every metric the controller exports.
pub struct Metrics {
    registry: Registry,
    /// Seconds each stage took, by stage, ServerPool and outcome.
    pub stage_duration: HistogramFamily,
    /// Claims that ended, by outcome (`ready`, `failed`) and reason.
    pub claims: Family<Labels, Counter>,
    /// Servers by power state as the provider last reported it.
    pub servers: Family<Labels, Gauge>,
    /// The sum of the power readings the BMCs reported.
    pub fleet_watts: Gauge<f64, AtomicU64>,
    /// Pending pods by what the core decided for them.
    pub pending_pods: Family<Labels, Gauge>,
    /// The decisions `pending_pods` has shown, each kept (at 0 once no pod
    /// has it) so that it never reads stale.
    pending_decisions: std::sync::Mutex<std::collections::BTreeSet<&'static str>>,
    /// From the start of a decision to the last power-on request it sent.
    pub decision_latency: Histogram,
    /// From the API's last stamp on an object to its change applied to the
    /// index, by kind.
    pub watch_lag: HistogramFamily,
    /// Failed steps, by error kind.
    pub errors: Family<Labels, Counter>,
    /// Power actions that failed, by provider error kind.
    pub power_failures: Family<Labels, Counter>,
    /// 1 while this replica holds the leader lease.
    pub leader: Gauge,
    /// Claim locks in the ledger, and by ledger ConfigMap (each shard and
    /// the legacy ledger) the bytes its entries take against
    /// [`crate::locks::LEDGER_CAP_BYTES`].
    pub claim_locks: Gauge,
    claim_lock_ledger_bytes: Family<Labels, Gauge>,
    /// The ledgers `claim_lock_ledger_bytes` has shown, each kept (at 0 once
    /// gone) so that it never reads stale.
    ledgers_shown: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Servers held back by identity: `unadopted`, `identity_mismatch`.
    pub servers_held: Family<Labels, Gauge>,
    /// What a dry run decided and did not carry out, by action.
    dry_run_actions: Family<Labels, Counter>,
    /// Scale-down: energy saved, warm spares, drains and evictions.
    pub scaledown: crate::scaledown::energy::ScaleDownMetrics,
    /// Events dropped because the queue they leave through was full.
    pub events_dropped: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        Metrics::counting(&crate::api::ApiRequests::default())
    }

    /// The metrics, with the counts of the layer under the client
    /// (`ironclaim_api_requests_total`, `ironclaim_api_throttled_seconds_total`).
    pub fn counting(api: &crate::api::ApiRequests) -> Self {
        let mut registry = Registry::with_prefix("ironclaim");
        registry.register("api_requests", "Requests sent to the API server, by verb and resource", Declared(api.requests.clone()));
        registry.register("api_throttled_seconds", "Seconds requests waited for --kube-api-qps", api.throttled_seconds.clone());
        let stage_duration = HistogramFamily::new_with_constructor(stage_histogram);
        let claims = Family::<Labels, Counter>::default();
        let servers = Family::<Labels, Gauge>::default();
        let fleet_watts = Gauge::<f64, AtomicU64>::default();
        let pending_pods = Family::<Labels, Gauge>::default();
        let decision_latency = latency_histogram();
        let errors = Family::<Labels, Counter>::default();
        let watch_lag = HistogramFamily::new_with_constructor(watch_lag_histogram);
        registry.register(
            "watch_lag_seconds",
            "From the API's last stamp on an object (whole seconds) to its change in the controller's index, by kind",
            Declared(watch_lag.clone()),
        );
        let power_failures = Family::<Labels, Counter>::default();
        let leader = Gauge::default();
        let (claim_locks, claim_lock_ledger_bytes, servers_held) =
            (Gauge::default(), Family::<Labels, Gauge>::default(), Family::<Labels, Gauge>::default());
        registry.register("stage_duration_seconds", "Seconds each claim stage took", Declared(stage_duration.clone()));
        registry.register("claims", "Claims that ended, by outcome and reason", Declared(claims.clone()));
        registry.register("servers", "Servers by power state", Declared(servers.clone()));
        registry.register("fleet_watts", "Sum of the BMCs' power readings", fleet_watts.clone());
        registry.register("pending_pods", "Pending pods by decision", Declared(pending_pods.clone()));
        registry.register("decision_latency_seconds", "From the start of a decision to its last power-on request", decision_latency.clone());
        registry.register("errors", "Failed controller steps by kind", Declared(errors.clone()));
        registry.register("power_failures", "Failed power actions by provider error", Declared(power_failures.clone()));
        registry.register("leader", "1 while this replica leads", leader.clone());
        registry.register("claim_locks", "Claim locks in the lock ledger", claim_locks.clone());
        registry.register(
            "claim_lock_ledger_bytes",
            format!("Bytes each lock ledger ConfigMap's entries take; takes are refused past {} in a shard", crate::locks::LEDGER_CAP_BYTES),
            Declared(claim_lock_ledger_bytes.clone()),
        );
        registry.register("servers_held", "Servers ironclaim keeps its hands off, by reason", Declared(servers_held.clone()));
        let dry_run_actions = Family::<Labels, Counter>::default();
        registry.register("dry_run_actions", "Actions a dry run decided and did not carry out, by action", Declared(dry_run_actions.clone()));
        let scaledown = crate::scaledown::energy::ScaleDownMetrics::register(&mut registry);
        let events_dropped = Counter::default();
        registry.register(
            "events_dropped",
            format!("Events dropped because {} were already waiting to be sent", crate::events::QUEUED_EVENTS),
            events_dropped.clone(),
        );
        Metrics {
            registry,
            stage_duration,
            claims,
            servers,
            fleet_watts,
            pending_pods,
            pending_decisions: Default::default(),
            decision_latency,
            watch_lag,
            errors,
            power_failures,
            leader,
            claim_locks,
            claim_lock_ledger_bytes,
            ledgers_shown: Default::default(),
            servers_held,
            dry_run_actions,
            scaledown,
            events_dropped,
        }
    }

    pub fn observe_stage(&self, stage: &str, pool: &str, outcome: &str, seconds: f64) {
        self.stage_duration
            .get_or_create(&vec![("stage".into(), stage.into()), ("serverpool".into(), pool.into()), ("outcome".into(), outcome.into())])
            .observe(seconds);
    }

    /// Pending pods by what the latest decision found for them; a
    /// decision no pod has any more reads 0.
    pub fn set_pending_pods(&self, by_decision: &std::collections::BTreeMap<&'static str, usize>) {
        let mut shown = self.pending_decisions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        shown.extend(by_decision.keys().copied());
        for decision in shown.iter() {
            let n = by_decision.get(decision).copied().unwrap_or(0);
            self.pending_pods.get_or_create(&vec![("decision".into(), (*decision).into())]).set(n as i64);
        }
    }

    /// The bytes each lock ledger ConfigMap's entries take, by name; one
    /// no longer there reads 0.
    pub fn set_ledger_bytes(&self, by_ledger: impl IntoIterator<Item = (String, usize)>) {
        let mut shown = self.ledgers_shown.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now: std::collections::BTreeMap<String, usize> = by_ledger.into_iter().collect();
        shown.extend(now.keys().cloned());
        for ledger in shown.iter() {
            let bytes = now.get(ledger).copied().unwrap_or(0);
            self.claim_lock_ledger_bytes.get_or_create(&vec![("ledger".into(), ledger.clone())]).set(bytes as i64);
        }
    }

    pub fn claim_ended(&self, outcome: &str, reason: &str) {
        self.claims.get_or_create(&vec![("outcome".into(), outcome.into()), ("reason".into(), reason.into())]).inc();
    }

    pub fn error(&self, label: &str) {
        self.errors.get_or_create(&vec![("error".into(), label.into())]).inc();
    }

    pub fn power_failure(&self, label: &str) {
        self.power_failures.get_or_create(&vec![("error".into(), label.into())]).inc();
    }

    /// One action a dry run decided and did not carry out: `claim`,
    /// `power_on`, `power_off`, `drain`.
    pub fn dry_run_action(&self, action: &str) {
        self.dry_run_actions.get_or_create(&vec![("action".into(), action.into())]).inc();
    }

    /// Servers by power state, as one sweep read them: a state no server
    /// is in any more is dropped.
    pub fn set_servers_by_power_state<'a>(&self, by_state: impl IntoIterator<Item = (&'a str, i64)>) {
        self.servers.clear();
        for (state, n) in by_state {
            self.servers.get_or_create(&vec![("power_state".into(), state.into())]).set(n);
        }
    }

    pub fn set_servers_held(&self, reason: &str, n: i64) {
        self.servers_held.get_or_create(&vec![("reason".into(), reason.into())]).set(n);
    }

    /// The registry in the OpenMetrics text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_family_with_no_child_yet_is_declared_by_its_type_line() {
        let text = Metrics::new().render();
        assert!(text.contains("# TYPE ironclaim_claims counter\n"), "{text}");
        assert!(!text.contains("ironclaim_claims_total"), "{text}");
        assert!(text.contains("# TYPE ironclaim_stranded gauge\n"), "{text}");
    }

    #[test]
    fn pending_pods_show_the_latest_decision_and_a_decision_gone_reads_zero() {
        let m = Metrics::new();
        m.set_pending_pods(&BTreeMap::from([("new_claim", 2), ("all_matching_busy", 1)]));
        let text = m.render();
        assert!(text.contains("ironclaim_pending_pods{decision=\"new_claim\"} 2"), "{text}");
        assert!(text.contains("ironclaim_pending_pods{decision=\"all_matching_busy\"} 1"), "{text}");
        m.set_pending_pods(&BTreeMap::from([("in_flight", 2)]));
        let text = m.render();
        assert!(text.contains("ironclaim_pending_pods{decision=\"new_claim\"} 0"), "{text}");
        assert!(text.contains("ironclaim_pending_pods{decision=\"in_flight\"} 2"), "{text}");
    }

    #[test]
    fn ledger_bytes_are_shown_per_ledger_configmap_and_one_gone_reads_zero() {
        let m = Metrics::new();
        m.set_ledger_bytes([("ironclaim-claim-locks-03".to_string(), 812), ("ironclaim-claim-locks".to_string(), 90)]);
        let text = m.render();
        assert!(text.contains("ironclaim_claim_lock_ledger_bytes{ledger=\"ironclaim-claim-locks-03\"} 812"), "{text}");
        m.set_ledger_bytes([("ironclaim-claim-locks-03".to_string(), 700)]);
        let text = m.render();
        assert!(text.contains("ironclaim_claim_lock_ledger_bytes{ledger=\"ironclaim-claim-locks\"} 0"), "{text}");
        assert!(text.contains("ironclaim_claim_lock_ledger_bytes{ledger=\"ironclaim-claim-locks-03\"} 700"), "{text}");
    }
}
