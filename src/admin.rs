//! The admin HTTP endpoint: health, readiness, Prometheus metrics, and the
//! link control API (`GET /links`, `GET /links/{name}`,
//! `GET /links/{name}/partitions`,
//! `POST /links/{name}/failover?wait=SECONDS[&max_delay=SECONDS][&force=true]`,
//! `GET /links/{name}/failover[?max_delay=SECONDS]` (its dry run),
//! `POST /links/{name}/start`,
//! `GET /links/{name}/failback` (the divergence report) and
//! `POST /links/{name}/failback` (for a link with failback settings);
//! JSON in and out, errors as `{"error": "..."}`).
//!
//! Bound to loopback unless a bearer token is configured (the configuration
//! refuses anything else), so failover controls added later are never open
//! to the network by accident. Because it may face a network, the token is
//! checked in constant time and every connection is bounded in time: a
//! request head must arrive within `Timeouts::header_read` (an idle or
//! trickling connection is closed) and a request is answered within
//! `Timeouts::request`. `axum::serve` offers neither bound, so connections
//! are served with hyper's HTTP/1 builder directly.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Path;
use axum::extract::{Extension, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use futures_util::future::BoxFuture;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use ring::digest::{digest, Digest, SHA256};
use subtle::ConstantTimeEq;
use tokio::net::TcpListener;

use crate::control::api::{
    ApiError, FailbackDone, FailbackHeld, FailbackReport, LinkList, LinkPartitions, StartRequest,
};
use crate::control::links::{ControlError, Precheck};
use crate::mirror::link_state::LinkState;
use crate::proxy::Shared;
use crate::sync::error_chain;

/// Time bounds of the admin endpoint.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timeouts {
    /// From when the server waits for a request (a new connection, or the
    /// next request on a kept-alive one) until its whole head has arrived;
    /// then the connection is closed without an answer (slowloris).
    pub header_read: Duration,
    /// Handling one request; after that the answer is 503 with a message.
    /// `/readyz` tries each bootstrap broker for up to 2 s, so this leaves
    /// room for a few of them.
    pub request: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            header_read: Duration::from_secs(10),
            request: Duration::from_secs(10),
        }
    }
}

/// Bind the admin listener; the returned future serves it.
pub(crate) async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serve the admin API on `listener` until the process ends.
pub(crate) async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    failback: Option<Arc<dyn FailbackApi>>,
) -> std::io::Result<()> {
    serve_app(listener, router(shared, failback), Timeouts::default()).await
}

/// An error of the failback's work, with its chain.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// What a failback found.
pub(crate) enum FailbackAnswer {
    /// The divergence report and how many of its partitions are
    /// unresolved (nothing is written while any is).
    Report {
        report: FailbackReport,
        unresolved: usize,
    },
    /// Refused before any plan, e.g. the failed-over link has not failed
    /// over on the other cluster: the message the operator is answered.
    Refused(String),
}

/// The failback of a link (`GET`/`POST /links/{name}/failback`). Its work
/// reads both clusters with the replicator's code, a layer above this one,
/// so the binary supplies it (as `kafka-mirror-proxy failback` runs it).
pub(crate) trait FailbackApi: Send + Sync {
    /// The divergence report; with `apply`, and when every partition is
    /// resolved, also writes the link's translation history and its
    /// replicator's starting points (the caller has checked that the link
    /// is fenced).
    fn failback<'a>(
        &'a self,
        link: &'a str,
        apply: bool,
    ) -> BoxFuture<'a, Result<FailbackAnswer, BoxError>>;
}

#[derive(Clone)]
struct Failbacks(Option<Arc<dyn FailbackApi>>);

/// The admin routes, behind the bearer token check when one is configured.
pub(crate) fn router(shared: Arc<Shared>, failbacks: Option<Arc<dyn FailbackApi>>) -> Router {
    let token = shared
        .config
        .admin_token
        .as_ref()
        .map(|t| Token::new(t.expose()));
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/links", get(links))
        .route("/links/{name}", get(link))
        .route("/links/{name}/partitions", get(link_partitions))
        .route(
            "/links/{name}/failover",
            post(failover).get(failover_dry_run),
        )
        .route("/links/{name}/start", post(start))
        .route("/links/{name}/failback", get(failback).post(failback))
        .layer(Extension(Failbacks(failbacks)))
        .layer(middleware::from_fn_with_state(token, authorize))
        .with_state(shared)
}

/// Serve `app` on `listener` with `timeouts`, until the process ends.
pub(crate) async fn serve_app(
    listener: TcpListener,
    app: Router,
    timeouts: Timeouts,
) -> std::io::Result<()> {
    let app = app.layer(middleware::from_fn_with_state(timeouts.request, limit_time));
    loop {
        let (tcp, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                tracing::warn!(error = %e, "admin accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let service = TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let mut builder = http1::Builder::new();
            builder
                .timer(TokioTimer::new())
                .header_read_timeout(timeouts.header_read);
            if let Err(e) = builder.serve_connection(TokioIo::new(tcp), service).await {
                tracing::debug!(%peer, error = %e, "admin connection ended");
            }
        });
    }
}

/// The expected `Authorization` value, kept as its SHA-256 digest. Comparing
/// digests in constant time reveals through timing neither the token's
/// bytes nor its length.
#[derive(Clone)]
struct Token(Digest);

impl Token {
    fn new(token: &str) -> Token {
        Token(digest(&SHA256, format!("Bearer {token}").as_bytes()))
    }

    fn admits(&self, authorization: Option<&[u8]>) -> bool {
        let given = digest(&SHA256, authorization.unwrap_or_default());
        self.0.as_ref().ct_eq(given.as_ref()).into()
    }
}

async fn authorize(State(token): State<Option<Token>>, request: Request, next: Next) -> Response {
    if let Some(token) = token {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .map(|v| v.as_bytes());
        if !token.admits(given) {
            return (StatusCode::UNAUTHORIZED, "missing or wrong bearer token\n").into_response();
        }
    }
    next.run(request).await
}

/// How long `POST /links/{name}/failover` waits when `wait` is not given.
pub(crate) const FAILOVER_WAIT_DEFAULT: Duration = Duration::from_secs(60);
/// The longest `wait` honoured; a larger one is cut to this.
pub(crate) const FAILOVER_WAIT_MAX: Duration = Duration::from_secs(600);
/// Time beyond `wait` a failover request may take to answer (the state
/// writes before and the report after).
const FAILOVER_WAIT_SLACK: Duration = Duration::from_secs(15);

/// The `wait` of a failover request: seconds, bounded by
/// [`FAILOVER_WAIT_MAX`]; `None` when present but not a number.
fn failover_wait(query: Option<&str>) -> Option<Duration> {
    let Some(raw) = query
        .unwrap_or("")
        .split('&')
        .find_map(|kv| kv.strip_prefix("wait="))
    else {
        return Some(FAILOVER_WAIT_DEFAULT);
    };
    let secs: f64 = raw
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s >= 0.0)?;
    // Cut before converting: a number of seconds past what a Duration holds
    // (1e30) would panic in the conversion.
    Some(Duration::from_secs_f64(
        secs.min(FAILOVER_WAIT_MAX.as_secs_f64()),
    ))
}

/// The time a failback request may take: it reads A's records past the
/// divergence point, which may be many.
const FAILBACK_ALLOWANCE: Duration = Duration::from_secs(300);

/// The time a request may take: the server's bound, for a failover its
/// wait plus slack (so `wait` is never cut by the request timeout), for a
/// failback [`FAILBACK_ALLOWANCE`].
fn allowance(request: &Request, limit: Duration) -> Duration {
    if request.uri().path().ends_with("/failback") {
        return limit.max(FAILBACK_ALLOWANCE);
    }
    if request.method() == axum::http::Method::POST && request.uri().path().ends_with("/failover") {
        let wait = failover_wait(request.uri().query()).unwrap_or(Duration::ZERO);
        return limit.max(wait + FAILOVER_WAIT_SLACK);
    }
    limit
}

async fn limit_time(State(limit): State<Duration>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let limit = allowance(&request, limit);
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(%path, limit_ms = limit.as_millis(), "admin request timed out");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("request not handled within {} ms\n", limit.as_millis()),
            )
                .into_response()
        }
    }
}

/// Ready when at least one bootstrap broker accepts a connection, and not
/// while the process drains for shutdown: the listeners are closed then, so
/// a load balancer must stop sending new connections (the admin endpoint
/// itself is served until the drain ends).
async fn readyz(State(shared): State<Arc<Shared>>) -> Response {
    if *shared.ctx.shutdown.borrow() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: shutting down (draining connections)\n",
        )
            .into_response();
    }
    if let Some(why) = shared.ctx.state.as_ref().and_then(|s| s.not_ready_reason()) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response();
    }
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
        shared.ctx.metrics.render(),
    )
        .into_response()
}

/// `body` as the answer's JSON. Through a `serde_json::Value`, whose
/// object keys are sorted: the bytes on the wire stay those the API always
/// sent, whatever order a type declares its fields in.
pub(crate) fn json_response(status: StatusCode, body: impl serde::Serialize) -> Response {
    match serde_json::to_value(body) {
        Ok(value) => (
            status,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{value}\n"),
        )
            .into_response(),
        // The API's types all have string keys: not seen, but answered.
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "application/json")],
            format!(
                "{}\n",
                serde_json::json!({ "error": format!("encoding the answer: {e}") })
            ),
        )
            .into_response(),
    }
}

/// `{"error": message}` with `status`.
pub(crate) fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    json_response(
        status,
        ApiError {
            error: message.to_string(),
        },
    )
}

fn control_error(e: ControlError) -> Response {
    let status = match &e {
        ControlError::UnknownLink(_) => StatusCode::NOT_FOUND,
        ControlError::Conflict(_) => StatusCode::CONFLICT,
        ControlError::NotLoaded(_) | ControlError::Write(_) => StatusCode::SERVICE_UNAVAILABLE,
        ControlError::DelayTooHigh(_) => StatusCode::PRECONDITION_FAILED,
    };
    // With its causes: a failed write names what the state topic answered.
    error(status, error_chain(&e))
}

async fn links(State(shared): State<Arc<Shared>>) -> Response {
    json_response(
        StatusCode::OK,
        LinkList {
            links: shared.ctx.control.links(),
        },
    )
}

async fn link(State(shared): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    match shared.ctx.control.link(&name) {
        Ok(report) => json_response(StatusCode::OK, report),
        Err(e) => control_error(e),
    }
}

/// Every partition of a link this instance mirrored: its figures (last
/// offset and CreateTime timestamp mirrored, replication delay, records,
/// batches, bytes, duplicates answered) and the producers its mirrored
/// producer state holds.
async fn link_partitions(State(shared): State<Arc<Shared>>, Path(name): Path<String>) -> Response {
    let ctx = &shared.ctx;
    if let Err(e) = ctx.control.link(&name) {
        return control_error(e);
    }
    let figures = ctx
        .metrics
        .link_mirror(&name)
        .map(|m| m.partitions())
        .unwrap_or_default();
    let producers = ctx.dedupe.producers_by_partition();
    let topic_id = |topic: &str| {
        ctx.topics
            .id(topic)
            .or_else(|| ctx.state.as_ref().and_then(|s| s.topic_id(topic)))
            .unwrap_or_else(uuid::Uuid::nil)
    };
    let partitions = figures
        .iter()
        .map(|(topic, partition, f)| {
            let mut row = crate::control::links::partition_row(topic, *partition, Some(f));
            let id = crate::mirror::origins::PartitionId {
                topic_id: topic_id(topic),
                partition: *partition,
            };
            row.producers = Some(producers.get(&id).copied().unwrap_or(0) as u64);
            row
        })
        .collect();
    json_response(
        StatusCode::OK,
        LinkPartitions {
            link: name,
            now_ms: crate::state::now_ms(),
            partitions,
        },
    )
}

/// The value of `key` in a query string.
pub(crate) fn query_param<'q>(query: Option<&'q str>, key: &str) -> Option<&'q str> {
    query?.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, "true"));
        (k == key).then_some(v)
    })
}

/// A query parameter the admin API cannot take (answered 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum QueryError {
    #[error("{key} must be true or false, not {value:?}")]
    NotAFlag { key: String, value: String },
    #[error("{key} must be a number of seconds, not {value:?}")]
    NotSeconds { key: &'static str, value: String },
}

/// A boolean query parameter: absent false; `true`/`1`, `false`/`0`.
fn query_flag(query: Option<&str>, key: &str) -> Result<bool, QueryError> {
    match query_param(query, key) {
        None | Some("false" | "0") => Ok(false),
        Some("true" | "1" | "") => Ok(true),
        Some(v) => Err(QueryError::NotAFlag {
            key: key.to_string(),
            value: v.to_string(),
        }),
    }
}

/// The pre-check a failover request asks for (`max_delay`, `force`).
fn precheck(query: Option<&str>) -> Result<Precheck, QueryError> {
    let max_delay = match query_param(query, "max_delay") {
        None => None,
        Some(raw) => {
            let secs: f64 = raw
                .parse()
                .ok()
                .filter(|s: &f64| s.is_finite() && *s >= 0.0)
                .ok_or_else(|| QueryError::NotSeconds {
                    key: "max_delay",
                    value: raw.to_string(),
                })?;
            // Cut before converting, as for `wait`: 1e30 s would panic.
            Some(Duration::from_secs_f64(secs.min(1e9)))
        }
    };
    Ok(Precheck {
        max_delay,
        force: query_flag(query, "force")?,
    })
}

/// The dry run of a failover: 200 with what `POST` would do now (with the
/// same `max_delay` and `force`), changing nothing. A GET, so that a proxy
/// without pre-checks answers 405 instead of failing the link over.
async fn failover_dry_run(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let check = match precheck(request.uri().query()) {
        Ok(check) => check,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    match shared.ctx.control.failover_dry_run(&name, check).await {
        Ok(report) => json_response(StatusCode::OK, report),
        Err(e) => control_error(e),
    }
}

/// 200 with the per-partition results when the failover is complete, 202
/// with the progress so far when `wait` ran out first. With
/// `max_delay=SECONDS`, 412 (nothing changed) while a partition's
/// replication delay is above it, unless `force=true`.
async fn failover(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    request: Request,
) -> Response {
    let Some(wait) = failover_wait(request.uri().query()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "wait must be a number of seconds (e.g. ?wait=30)",
        );
    };
    let query = request.uri().query();
    // A POST never is a dry run: refused whole rather than taken for a
    // failover (or ignored).
    if query_param(query, "dry_run").is_some() {
        return error(
            StatusCode::BAD_REQUEST,
            format!("a dry run is GET /links/{name}/failover; this POST changed nothing"),
        );
    }
    let check = match precheck(query) {
        Ok(check) => check,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let control = &shared.ctx.control;
    if let Err(e) = control.check_failover(&name, check) {
        return control_error(e);
    }
    match control.failover(&name, wait).await {
        Ok((report, true)) => json_response(StatusCode::OK, report),
        Ok((report, false)) => json_response(StatusCode::ACCEPTED, report),
        Err(e) => control_error(e),
    }
}

/// Optional body `{"source_cluster_id": "..."}`.
async fn start(
    State(shared): State<Arc<Shared>>,
    Path(name): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let mut request = StartRequest::default();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(&body) else {
            return error(
                StatusCode::BAD_REQUEST,
                "the body must be JSON: {\"source_cluster_id\": \"...\"} or nothing",
            );
        };
        // JSON that is not an object names no source, as it always has.
        if value.is_object() {
            match serde_json::from_value(value) {
                Ok(read) => request = read,
                Err(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "source_cluster_id must be a string",
                    )
                }
            }
        }
    }
    let mut source = None;
    if let Some(s) = &request.source_cluster_id {
        match crate::mirror::pid::ClusterId::parse_canonical(s) {
            Ok(id) => source = Some(id),
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("source_cluster_id {s:?} is not a Kafka cluster id: {e}"),
                )
            }
        }
    }
    match shared.ctx.control.start_link(&name, source).await {
        Ok(report) => json_response(StatusCode::OK, report),
        Err(e) => control_error(e),
    }
}

/// The failback of `name`, or the answer saying why there is none.
fn failback_of(
    shared: &Shared,
    failbacks: &Failbacks,
    name: &str,
) -> Result<Arc<dyn FailbackApi>, Box<Response>> {
    shared
        .ctx
        .control
        .link(name)
        .map_err(|e| Box::new(control_error(e)))?;
    let configured = shared
        .config
        .links
        .iter()
        .any(|l| l.name() == name && l.failback().is_some());
    match &failbacks.0 {
        Some(api) if configured => Ok(Arc::clone(api)),
        _ => Err(Box::new(error(
            StatusCode::NOT_FOUND,
            format!(
                "link '{name}' has no failback settings: set MIRROR_PROXY_LINK_{}_REVERSE_OF and _SOURCE_BOOTSTRAP_SERVERS, or run `kafka-mirror-proxy failback`",
                crate::mirror::link::link_env_name(name)
            ),
        ))),
    }
}

fn failback_error(e: BoxError) -> Response {
    // The chain, so that the cause (a broker, a topic) is named.
    error(StatusCode::SERVICE_UNAVAILABLE, error_chain(&*e))
}

/// `GET`: the failback's divergence report (`kafka-mirror-proxy failback
/// --dry-run`), changing nothing: 200 with it. `POST`: the failback: 409
/// unless the link is PREPARING or STOPPED, or while a partition's
/// divergence cannot be told (the report says which; nothing is written);
/// else the history and the starting points are written and the link
/// starts: 200 with the report and the link. Either: 409 when the other
/// side's link has not failed over.
async fn failback(
    method: axum::http::Method,
    State(shared): State<Arc<Shared>>,
    Extension(failbacks): Extension<Failbacks>,
    Path(name): Path<String>,
) -> Response {
    let api = match failback_of(&shared, &failbacks, &name) {
        Ok(api) => api,
        Err(answer) => return *answer,
    };
    let control = &shared.ctx.control;
    let apply = method == axum::http::Method::POST;
    if apply {
        let state = match control.state_of(&name) {
            Ok(state) => state,
            Err(e) => return control_error(e),
        };
        // Nothing is written while the link could be copying.
        if !matches!(state, LinkState::Preparing | LinkState::Stopped) {
            return error(
                StatusCode::CONFLICT,
                format!(
                    "link '{name}' is {}: a failback starts a PREPARING (or STOPPED) link",
                    state.as_str()
                ),
            );
        }
    }
    let report = match api.failback(&name, apply).await {
        Ok(FailbackAnswer::Report { report, .. }) if !apply => {
            return json_response(StatusCode::OK, report)
        }
        Ok(FailbackAnswer::Report { report, unresolved }) if unresolved > 0 => {
            return json_response(
                StatusCode::CONFLICT,
                FailbackHeld {
                    error: format!("{unresolved} partition(s) unresolved: nothing written"),
                    failback: report,
                },
            )
        }
        Ok(FailbackAnswer::Report { report, .. }) => report,
        Ok(FailbackAnswer::Refused(why)) => return error(StatusCode::CONFLICT, why),
        Err(e) => return failback_error(e),
    };
    match control.start_link(&name, None).await {
        Ok(link) => json_response(
            StatusCode::OK,
            FailbackDone {
                failback: report,
                link,
            },
        ),
        Err(e) => control_error(e),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Instant;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;
    use crate::config::Config;
    use crate::metrics::Metrics;
    use crate::proxy::Proxy;

    const TOKEN: &str = "s3cret-token";

    /// A proxy (never connected to: nothing listens on its broker address)
    /// and its admin endpoint, served with `timeouts`.
    async fn admin(timeouts: Timeouts) -> (Proxy, SocketAddr) {
        let vars: HashMap<String, String> = [
            ("MIRROR_PROXY_BOOTSTRAP_SERVERS", "127.0.0.1:1"),
            ("MIRROR_PROXY_LISTEN", "127.0.0.1:0"),
            ("MIRROR_PROXY_ADMIN_TOKEN", TOKEN),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = Config::from_vars(&vars).expect("test configuration is valid");
        let proxy = Proxy::start(
            config,
            Arc::new(Metrics::default()),
            None,
            None,
            Default::default(),
        )
        .await
        .expect("proxy starts");
        let app = router(Arc::clone(&proxy.shared), None);
        (proxy, serve_in_background(app, timeouts).await)
    }

    async fn serve_in_background(app: Router, timeouts: Timeouts) -> SocketAddr {
        let listener = bind(([127, 0, 0, 1], 0).into()).await.expect("bind");
        let addr = listener.local_addr().expect("local addr");
        tokio::spawn(serve_app(listener, app, timeouts));
        addr
    }

    /// Send `raw` and read until the server closes (or 5 s pass).
    async fn exchange(addr: SocketAddr, raw: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(raw.as_bytes()).await.expect("write");
        let mut out = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        assert!(read.is_ok(), "no answer within 5 s to {raw:?}");
        String::from_utf8_lossy(&out).into_owned()
    }

    fn request(path: &str, authorization: Option<&str>) -> String {
        let auth = authorization
            .map(|a| format!("Authorization: {a}\r\n"))
            .unwrap_or_default();
        format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n")
    }

    #[tokio::test]
    async fn bearer_token_is_required_and_compared_whole() {
        let (_proxy, addr) = admin(Timeouts::default()).await;
        let bearer = format!("Bearer {TOKEN}");
        let longer = format!("{bearer}x");
        let shorter = &bearer[..bearer.len() - 1];
        for wrong in [
            None,
            Some("Bearer wrong"),
            Some(shorter),
            Some(longer.as_str()),
            Some(TOKEN),
        ] {
            let answer = exchange(addr, &request("/healthz", wrong)).await;
            assert!(
                answer.starts_with("HTTP/1.1 401"),
                "{wrong:?} gave {answer}"
            );
            assert!(answer.contains("missing or wrong bearer token"), "{answer}");
        }
        let answer = exchange(addr, &request("/healthz", Some(&bearer))).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");

        // /metrics served as Prometheus text with the names of before.
        let answer = exchange(addr, &request("/metrics", Some(&bearer))).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains("content-type: text/plain; version=0.0.4"),
            "{answer}"
        );
        assert!(
            answer.contains(
                "\nkafka_mirror_proxy_client_connections_total{listener=\"bootstrap\"} 0\n"
            ),
            "{answer}"
        );
    }

    fn post(path: &str, body: &str) -> String {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    }

    /// The body of an answer.
    fn body(answer: &str) -> &str {
        answer.split_once("\r\n\r\n").map_or("", |(_, b)| b)
    }

    /// The link API's answers, byte for byte: typed values written as the
    /// JSON the API always gave.
    #[tokio::test]
    async fn link_answers_and_errors_are_the_api_json() {
        let (_proxy, addr) = admin(Timeouts::default()).await;
        let bearer = format!("Bearer {TOKEN}");
        let answer = exchange(addr, &request("/links", Some(&bearer))).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            answer.contains("content-type: application/json"),
            "{answer}"
        );
        assert_eq!(body(&answer), "{\"links\":[]}\n");
        let answer = exchange(addr, &request("/links/x", Some(&bearer))).await;
        assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
        assert_eq!(body(&answer), "{\"error\":\"no mirror link named 'x'\"}\n");

        // The start body: checked before the link is looked up.
        for (sent, status, error) in [
            (
                "{",
                "400",
                Some("the body must be JSON: {\\\"source_cluster_id\\\": \\\"...\\\"} or nothing"),
            ),
            (
                "{\"source_cluster_id\": 5}",
                "400",
                Some("source_cluster_id must be a string"),
            ),
            ("{\"source_cluster_id\": \"short\"}", "400", None),
            // Absent, null, or JSON that is not an object: no new source.
            ("", "404", None),
            ("{\"source_cluster_id\": null}", "404", None),
            ("{\"other\": 1}", "404", None),
            ("5", "404", None),
        ] {
            let answer = exchange(addr, &post("/links/x/start", sent)).await;
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status}")),
                "{sent}: {answer}"
            );
            if let Some(error) = error {
                assert_eq!(
                    body(&answer),
                    format!("{{\"error\":\"{error}\"}}\n"),
                    "{sent}"
                );
            }
        }
        let answer = exchange(
            addr,
            &post("/links/x/start", "{\"source_cluster_id\": \"short\"}"),
        )
        .await;
        assert!(
            body(&answer).contains("source_cluster_id \\\"short\\\" is not a Kafka cluster id"),
            "{answer}"
        );

        // Query parameters: a typed error, its message answered.
        let answer = exchange(
            addr,
            &request("/links/x/failover?max_delay=soon", Some(&bearer)),
        )
        .await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
        assert_eq!(
            body(&answer),
            "{\"error\":\"max_delay must be a number of seconds, not \\\"soon\\\"\"}\n"
        );
    }

    #[tokio::test]
    async fn a_request_head_that_never_completes_is_closed() {
        let timeouts = Timeouts {
            header_read: Duration::from_millis(300),
            request: Duration::from_secs(10),
        };
        let (_proxy, addr) = admin(timeouts).await;
        for partial in ["GET /healthz HTTP/1.1\r\nHost: x\r\n", ""] {
            let started = Instant::now();
            let answer = exchange(addr, partial).await;
            assert_eq!(answer, "", "partial head {partial:?} got an answer");
            assert!(
                started.elapsed() >= Duration::from_millis(250),
                "closed after {:?}, before the header timeout",
                started.elapsed()
            );
        }
        // The server itself goes on answering complete requests.
        let bearer = format!("Bearer {TOKEN}");
        let answer = exchange(addr, &request("/healthz", Some(&bearer))).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    #[test]
    fn failover_wait_is_bounded() {
        assert_eq!(failover_wait(None), Some(FAILOVER_WAIT_DEFAULT));
        assert_eq!(failover_wait(Some("wait=5")), Some(Duration::from_secs(5)));
        assert_eq!(
            failover_wait(Some("x=1&wait=0.5")),
            Some(Duration::from_millis(500))
        );
        assert_eq!(failover_wait(Some("wait=100000")), Some(FAILOVER_WAIT_MAX));
        // Past what a Duration holds: cut, not a panic.
        assert_eq!(failover_wait(Some("wait=1e30")), Some(FAILOVER_WAIT_MAX));
        assert_eq!(failover_wait(Some("wait=inf")), None);
        assert_eq!(failover_wait(Some("wait=soon")), None);
        assert_eq!(failover_wait(Some("wait=-1")), None);
        let req = |m: &str, uri: &str| {
            Request::builder()
                .method(m)
                .uri(uri)
                .body(axum::body::Body::empty())
                .expect("request")
        };
        let limit = Duration::from_secs(10);
        assert_eq!(
            allowance(&req("POST", "/links/a/failover?wait=120"), limit),
            Duration::from_secs(120) + FAILOVER_WAIT_SLACK
        );
        assert_eq!(allowance(&req("GET", "/links/a"), limit), limit);
        assert_eq!(allowance(&req("POST", "/links/a/start"), limit), limit);
        // A failback reads A's records past the divergence: more time,
        // for its dry run as well.
        assert_eq!(
            allowance(&req("POST", "/links/a/failback"), limit),
            FAILBACK_ALLOWANCE
        );
        assert_eq!(
            allowance(&req("GET", "/links/a/failback"), limit),
            FAILBACK_ALLOWANCE
        );
    }

    #[test]
    fn failover_precheck_parameters() {
        assert_eq!(precheck(None), Ok(Precheck::default()));
        assert_eq!(
            precheck(Some("wait=0&max_delay=1.5&force=true")),
            Ok(Precheck {
                max_delay: Some(Duration::from_millis(1500)),
                force: true
            })
        );
        assert_eq!(
            precheck(Some("max_delay=60&force")),
            Ok(Precheck {
                max_delay: Some(Duration::from_secs(60)),
                force: true
            })
        );
        // Past what a Duration holds: cut, not a panic.
        assert!(precheck(Some("max_delay=1e300")).is_ok());
        for bad in ["max_delay=soon", "max_delay=-1", "max_delay=inf"] {
            assert_eq!(
                precheck(Some(bad)),
                Err(QueryError::NotSeconds {
                    key: "max_delay",
                    value: bad["max_delay=".len()..].to_string()
                }),
                "{bad}"
            );
        }
        let e = precheck(Some("force=maybe")).expect_err("not a flag");
        assert_eq!(e.to_string(), "force must be true or false, not \"maybe\"");
        assert_eq!(query_flag(Some("dry_run=0"), "dry_run"), Ok(false));
        assert_eq!(
            query_param(Some("a=1&dry_run=true"), "dry_run"),
            Some("true")
        );
    }

    #[tokio::test]
    async fn a_slow_request_is_answered_503() {
        let app = Router::new()
            .route(
                "/slow",
                get(|| async {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    "too late\n"
                }),
            )
            .route("/fast", get(|| async { "fast\n" }));
        let timeouts = Timeouts {
            header_read: Duration::from_secs(10),
            request: Duration::from_millis(200),
        };
        let addr = serve_in_background(app, timeouts).await;
        let answer = exchange(addr, &request("/slow", None)).await;
        assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
        assert!(
            answer.contains("request not handled within 200 ms"),
            "{answer}"
        );
        let answer = exchange(addr, &request("/fast", None)).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// A link's report (`GET /links`, `GET /links/{name}`, and so the CLI)
    /// shows the source cluster id as the operator configured it: Kafka
    /// accepts `...Qk` (unused trailing bits set) for the canonical `...Qg`,
    /// and the source broker reports the spelling it was formatted with.
    #[test]
    fn link_report_shows_the_configured_source_cluster_id() {
        for id in ["MkU3OEVBNTcwNTJENDM2Qk", "MkU3OEVBNTcwNTJENDM2Qg"] {
            let vars: HashMap<String, String> = [
                ("MIRROR_PROXY_BOOTSTRAP_SERVERS", "127.0.0.1:1"),
                ("MIRROR_PROXY_LISTEN", "127.0.0.1:0"),
                ("MIRROR_PROXY_LINKS", "a"),
                ("MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID", id),
                ("MIRROR_PROXY_LINK_A_TOPICS", "orders"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let config = Config::from_vars(&vars).expect("test configuration is valid");
            let control = crate::control::Control::new(
                config.links,
                None,
                None,
                Arc::new(Metrics::default()),
                config.read_only_error,
                Duration::from_secs(1),
                Default::default(),
            );
            let report = control.link("a").expect("link a");
            assert_eq!(report.source_cluster_id, id, "{report:?}");
            assert_eq!(control.links()[0].source_cluster_id, id);
        }
    }
}
