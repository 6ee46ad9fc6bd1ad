//! `/metrics`, `/healthz` and `/readyz`; `/ui` and `/ui/state`, the
//! dashboard ([`crate::dashboard`]), when it is on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::error::{Error, Result};
use crate::metrics::Metrics;

/// Whether the caches have synced: `/readyz` answers 200 only then.
pub type Readiness = Arc<AtomicBool>;

/// The control loop's heartbeat: `/healthz` fails once the loop has not
/// turned for longer than its bound, so a wedged controller is restarted
/// rather than left holding its lease and acting on nothing.
#[derive(Debug)]
pub struct Heartbeat {
    started: std::time::Instant,
    /// Milliseconds since `started` of the last turn.
    last_ms: std::sync::atomic::AtomicU64,
    bound: std::time::Duration,
}

impl Heartbeat {
    pub fn new(bound: std::time::Duration) -> Self {
        Heartbeat { started: std::time::Instant::now(), last_ms: std::sync::atomic::AtomicU64::new(0), bound }
    }

    /// The loop turned.
    pub fn beat(&self) {
        self.last_ms.store(self.started.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long the loop has not turned, if longer than the bound.
    pub fn stalled(&self) -> Option<std::time::Duration> {
        stalled_for(self.last_ms.load(Ordering::Relaxed), self.started.elapsed().as_millis() as u64, self.bound)
    }
}

/// How long since the last turn at `last_ms`, seen at `now_ms`, when that
/// exceeds `bound`.
fn stalled_for(last_ms: u64, now_ms: u64, bound: std::time::Duration) -> Option<std::time::Duration> {
    let since = std::time::Duration::from_millis(now_ms.saturating_sub(last_ms));
    (since > bound).then_some(since)
}

/// Serves until `shutdown` resolves.
///
/// # Errors
/// [`Error::ServeFailed`] when the address cannot be bound.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Readiness,
    heartbeat: Arc<Heartbeat>,
    dashboard: Option<Arc<crate::dashboard::Source>>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|source| Error::ServeFailed { address: address.to_string(), source })?;
    let bound = listener.local_addr().map_err(|source| Error::ServeFailed { address: address.to_string(), source })?;
    let mut app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render()) }
            }),
        )
        .route(
            "/healthz",
            get(move || {
                let heartbeat = heartbeat.clone();
                async move {
                    match heartbeat.stalled() {
                        None => (StatusCode::OK, "ok".to_string()).into_response(),
                        Some(since) => {
                            (StatusCode::SERVICE_UNAVAILABLE, format!("the control loop has not turned for {}s", since.as_secs())).into_response()
                        }
                    }
                }
            }),
        )
        .route(
            "/readyz",
            get(move || {
                let ready = ready.clone();
                async move {
                    if ready.load(Ordering::Relaxed) {
                        (StatusCode::OK, "ok").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced").into_response()
                    }
                }
            }),
        );
    if let Some(source) = dashboard {
        app = app
            .route(
                "/ui",
                get(|| async {
                    (
                        [
                            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                            // The page loads nothing from anywhere else.
                            (header::CONTENT_SECURITY_POLICY, "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"),
                        ],
                        crate::dashboard::PAGE,
                    )
                }),
            )
            .route(
                "/ui/state",
                get(move || {
                    let source = source.clone();
                    async move {
                        let json = tokio::task::spawn_blocking(move || source.json()).await.map(|j| (*j).clone()).unwrap_or_default();
                        ([(header::CONTENT_TYPE, "application/json"), (header::CACHE_CONTROL, "no-store")], json)
                    }
                }),
            );
    }
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %err, "the metrics server stopped");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn healthz_fails_once_the_loop_has_not_turned_for_longer_than_its_bound() {
        let bound = Duration::from_secs(120);
        assert_eq!(stalled_for(1_000, 121_000, bound), None);
        assert_eq!(stalled_for(1_000, 121_001, bound), Some(Duration::from_millis(120_001)));
        let heartbeat = Heartbeat::new(Duration::from_millis(50));
        heartbeat.beat();
        assert_eq!(heartbeat.stalled(), None);
        std::thread::sleep(Duration::from_millis(80));
        assert!(heartbeat.stalled().is_some());
        heartbeat.beat();
        assert_eq!(heartbeat.stalled(), None);
    }
}
