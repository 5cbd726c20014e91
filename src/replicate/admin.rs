//! The replicator's HTTP endpoint, on the admin API's bounded server:
//! `/metrics` (Prometheus), `/healthz` (the process answers), `/readyz`
//! (every discovered partition is taken on and the link is not fenced).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::metrics::CONTENT_TYPE;
use super::Shared;
use crate::admin::{serve_app, Timeouts};

pub(super) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(shared);
    if let Err(e) = serve_app(listener, app, Timeouts::default()).await {
        tracing::error!(error = %e, "admin listener failed");
    }
}

async fn readyz(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    if shared.stopping() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else if !shared.ready.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "taking partitions on\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(shared): State<Arc<Shared>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        shared.metrics.render(),
    )
}
