//! The replicator's HTTP endpoint, on the admin API's bounded server:
//! `/metrics` (Prometheus), `/healthz` (the process answers), `/readyz`
//! (every discovered partition is taken on and the link is not fenced),
//! `/offsets` (the link's offset translation, as `kafka-mirror-proxy
//! offsets` answers it: one source offset, or a source group's).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use super::metrics::CONTENT_TYPE;
use super::{translation, Shared};
use crate::admin::{error, json_response, query_param, serve_app, Timeouts};
use crate::client::Client;
use crate::sync::error_chain;

/// What the endpoint reads.
#[derive(Clone)]
pub(super) struct Admin {
    pub shared: Arc<Shared>,
    pub source: Client,
    pub destination: Client,
}

pub(super) async fn serve(listener: TcpListener, admin: Admin) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/offsets", get(offsets))
        .with_state(admin);
    if let Err(e) = serve_app(listener, app, Timeouts::default()).await {
        tracing::error!(error = %crate::sync::error_chain(&e), "admin listener failed");
    }
}

async fn readyz(State(Admin { shared, .. }): State<Admin>) -> impl IntoResponse {
    if shared.stopping() {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping\n")
    } else if !shared.ready.load(Ordering::Acquire) {
        (StatusCode::SERVICE_UNAVAILABLE, "taking partitions on\n")
    } else {
        (StatusCode::OK, "ready\n")
    }
}

async fn metrics(State(Admin { shared, .. }): State<Admin>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, CONTENT_TYPE)],
        shared.metrics.render(),
    )
}

/// `/offsets?topic=T&partition=P&offset=O`, or `/offsets?group=G` (the
/// group id percent-encoded).
async fn offsets(State(admin): State<Admin>, request: Request) -> axum::response::Response {
    let config = &admin.shared.config;
    let query = request.uri().query();
    let number = |key: &str| query_param(query, key).map(str::parse::<i64>);
    let group: Option<String> = query_param(query, "group").map(|g| {
        percent_encoding::percent_decode_str(g)
            .decode_utf8_lossy()
            .into_owned()
    });
    let answer = match (
        query_param(query, "topic"),
        number("partition"),
        number("offset"),
        group,
    ) {
        (Some(topic), Some(Ok(partition)), Some(Ok(offset)), None) => {
            let Ok(partition) = i32::try_from(partition) else {
                return error(StatusCode::BAD_REQUEST, "partition out of range");
            };
            translation::translate(
                &admin.destination,
                &config.offsets_topic,
                &config.link,
                &config.group_id,
                &[((topic.to_string(), partition), offset)],
            )
            .await
        }
        (None, None, None, Some(group)) => {
            translation::translate_group(
                &admin.destination,
                &admin.source,
                &config.offsets_topic,
                &config.link,
                &config.group_id,
                &group,
            )
            .await
        }
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "give either topic, partition and offset (numbers), or group",
            )
        }
    };
    match answer {
        Ok(translated) => json_response(
            StatusCode::OK,
            serde_json::json!({
                "link": config.link,
                "offsets": translated.iter().map(translation::Translated::to_json).collect::<Vec<_>>(),
            }),
        ),
        // With every cause: which broker, which request.
        Err(e) => error(StatusCode::SERVICE_UNAVAILABLE, error_chain(&e)),
    }
}
