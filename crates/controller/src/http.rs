//! `/metrics`, `/healthz` and `/readyz`.

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

/// Serves until `shutdown` resolves.
///
/// # Errors
/// [`Error::ServeFailed`] when the address cannot be bound.
pub async fn serve(
    address: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Readiness,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await.map_err(|source| Error::ServeFailed { address: address.to_string(), source })?;
    let bound = listener.local_addr().map_err(|source| Error::ServeFailed { address: address.to_string(), source })?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = metrics.clone();
                async move { ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], metrics.render()) }
            }),
        )
        .route("/healthz", get(|| async { "ok" }))
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
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
            tracing::warn!(error = %err, "the metrics server stopped");
        }
    });
    Ok(bound)
}
