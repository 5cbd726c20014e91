//! The admin HTTP endpoint: health, readiness and Prometheus metrics.
//!
//! Bound to loopback unless a bearer token is configured (the configuration
//! refuses anything else), so failover controls added later are never open
//! to the network by accident.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use crate::proxy::Shared;

/// Bind the admin listener; the returned future serves it.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serve the admin API on `listener` until the process ends.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>) -> std::io::Result<()> {
    let token = shared.config.admin_token.clone();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .layer(middleware::from_fn_with_state(token, authorize))
        .with_state(shared);
    axum::serve(listener, app).await
}

async fn authorize(State(token): State<Option<String>>, request: Request, next: Next) -> Response {
    if let Some(token) = token {
        let expected = format!("Bearer {token}");
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok());
        if given != Some(expected.as_str()) {
            return (StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n").into_response();
        }
    }
    next.run(request).await
}

/// Ready when at least one bootstrap broker accepts a connection.
async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    for addr in &shared.config.bootstrap_servers {
        let attempt =
            tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
                .await;
        if matches!(attempt, Ok(Ok(_))) {
            return (StatusCode::OK, format!("ready: broker {addr} reachable\n")).into_response();
        }
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "not ready: no bootstrap broker reachable\n",
    )
        .into_response()
}

async fn metrics(State(shared): State<Arc<Shared>>) -> Response {
    (
        [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
        shared.metrics.render(),
    )
        .into_response()
}
