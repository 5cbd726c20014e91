//! One client connection and its upstream connection to a broker.
//!
//! Two loops run side by side. The request loop reads client frames, peeks
//! at their headers, lets the Produce filter rewrite mirror traffic, and
//! forwards; for every request that expects an answer it first queues a
//! `Pending` entry. The response loop takes those entries in order: a broker
//! entry waits for the broker's next frame (brokers answer in order on a
//! connection), a local entry is the proxy's own answer. So responses reach
//! the client in request order with their correlation ids, however many are
//! in flight, and a request that gets no response (`acks=0`) leaves nothing
//! behind.
//!
//! The request loop is also where a connection ends on its own: after
//! `CONNECTIONS_MAX_IDLE_MS` with nothing in flight and nothing received,
//! and at shutdown, when it stops reading and lets the response loop
//! deliver what is owed before the connection closes.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use tokio::io::{split, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::addresses::{self, RewriteError};
use super::upstream::{BoxStream, ConnectError};
use super::{Shared, StartError, Target};
use crate::mirror::link::{CertSubject, Origin};
use crate::mirror::produce::{
    self, LocalOutcome, LocalPartition, ProduceError, ProducePlan, Refusal,
};
use crate::mirror::produce_filter::{Begin, Dedupe, RebuildClaim, Tracked};
use crate::state::StateStore;
use crate::wire::frame::{write_frame, FrameError, FrameReader};
use crate::wire::header::{produce_acks, HeaderError, RequestHeaderPeek};

/// Requests in flight per connection before the proxy stops reading from
/// the client (backpressure).
const MAX_IN_FLIGHT: usize = 512;

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("TLS handshake with client failed: {0}")]
    TlsHandshake(std::io::Error),
    #[error("client did not complete the TLS handshake within {ms} ms (MIRROR_PROXY_TLS_HANDSHAKE_TIMEOUT_MS)")]
    TlsHandshakeTimeout { ms: u64 },
    #[error("idle for {ms} ms with no request in flight (MIRROR_PROXY_CONNECTIONS_MAX_IDLE_MS)")]
    Idle { ms: u64 },
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("no known address for broker node {0} (no Metadata response named it yet)")]
    UnknownNode(i32),
    #[error("the broker is unreachable (found by another connection); its port is closed until it answers again")]
    BrokerDown,
    #[error("bad frame from client: {0}")]
    ClientFrame(FrameError),
    #[error("malformed request header: {0}")]
    Header(#[from] HeaderError),
    #[error(transparent)]
    Produce(#[from] ProduceError),
    #[error(transparent)]
    Rewrite(#[from] RewriteError),
    #[error("{api:?} v{version} is newer than the proxy parses (up to v{max}); the proxy never advertised it")]
    UnsupportedVersion { api: ApiKey, version: i16, max: i16 },
    #[error("broker closed the connection with {in_flight} request(s) in flight")]
    UpstreamClosed { in_flight: usize },
    #[error("bad frame from broker: {0}")]
    UpstreamFrame(FrameError),
    #[error("broker sent a response with correlation id {got} while {expected} was expected")]
    CorrelationMismatch { expected: i32, got: i32 },
    #[error("broker sent a response nobody asked for")]
    UnexpectedResponse,
    #[error("opening a listener for a broker: {0}")]
    Listener(#[from] StartError),
    #[error("writing to the broker: {0}")]
    UpstreamWrite(std::io::Error),
    #[error("writing to the client: {0}")]
    ClientWrite(std::io::Error),
}

impl SessionError {
    /// Metric label for why the connection ended.
    fn label(&self) -> &'static str {
        match self {
            SessionError::TlsHandshake(_) => "tls_handshake",
            SessionError::TlsHandshakeTimeout { .. } => "tls_handshake_timeout",
            SessionError::Idle { .. } => "idle_timeout",
            SessionError::Connect(_) | SessionError::UnknownNode(_) | SessionError::BrokerDown => {
                "upstream_unreachable"
            }
            SessionError::ClientFrame(FrameError::TooLarge { .. })
            | SessionError::ClientFrame(FrameError::OverBudget { .. }) => "frame_too_large",
            SessionError::ClientFrame(FrameError::Timeout { .. }) => "request_timeout",
            SessionError::ClientFrame(_) => "bad_client_frame",
            SessionError::Header(_) => "malformed_header",
            SessionError::Produce(_) => "malformed_produce",
            SessionError::Rewrite(_) => "bad_response",
            SessionError::UnsupportedVersion { .. } => "unsupported_version",
            SessionError::UpstreamClosed { .. } => "upstream_closed",
            SessionError::UpstreamFrame(_) => "bad_upstream_frame",
            SessionError::CorrelationMismatch { .. } | SessionError::UnexpectedResponse => {
                "upstream_protocol"
            }
            SessionError::Listener(_) => "listener",
            SessionError::UpstreamWrite(_) => "upstream_write",
            SessionError::ClientWrite(_) => "client_write",
        }
    }
}

/// What to do with the broker's answer to a request.
enum Handling {
    /// Pass it through untouched.
    Opaque,
    /// Clamp to the versions the proxy parses.
    ApiVersions,
    /// Replace broker addresses.
    Addresses,
    /// A Produce response: rewrite leader endpoints (v10+) and add the
    /// partitions the proxy answered itself.
    Produce(Vec<LocalPartition>, Tracked),
}

/// A response the client is owed, in request order.
enum Pending {
    Broker {
        correlation_id: i32,
        api: ApiKey,
        version: i16,
        handling: Handling,
    },
    /// Opaque request of an API key the proxy does not know.
    BrokerUnknownApi {
        correlation_id: i32,
    },
    Local(BytesMut),
}

/// How a session ended without an error.
enum End {
    ClientClosed,
    Shutdown,
    /// A connection of a link that is STOPPING or STOPPED, closed once its
    /// in-flight requests were answered.
    Fenced(String),
}

/// What the idle timeout needs from the response loop.
struct Activity {
    start: Instant,
    /// A response is being prepared or written.
    answering: AtomicBool,
    /// When the last response was written, in ms after `start`.
    last_answer_ms: AtomicU64,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            start: Instant::now(),
            answering: AtomicBool::new(false),
            last_answer_ms: AtomicU64::new(0),
        }
    }

    fn answered(&self) {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_answer_ms.store(ms, Ordering::Relaxed);
        self.answering.store(false, Ordering::Relaxed);
    }

    /// When the connection stops being busy, so the idle clock starts: the
    /// later of the last bytes from the client and the last response.
    /// `None` while a request is in flight or partly read.
    fn idle_since<R>(&self, client: &FrameReader<R>, tx: &mpsc::Sender<Pending>) -> Option<Instant>
    where
        R: tokio::io::AsyncRead + Unpin,
    {
        let queued = tx.max_capacity() - tx.capacity();
        if queued > 0 || self.answering.load(Ordering::Relaxed) || client.mid_frame() {
            return None;
        }
        let answered =
            self.start + Duration::from_millis(self.last_answer_ms.load(Ordering::Relaxed));
        Some(client.last_read().max(answered))
    }
}

/// Serve one accepted client connection until either side closes.
pub async fn serve(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr, target: Target) {
    let active = shared.metrics.connection_opened(target);
    tracing::debug!(%peer, listener = %target.label(), "client connected");
    let reason = match run(&shared, tcp, peer, target).await {
        Ok(End::ClientClosed) => {
            tracing::debug!(%peer, "client closed the connection");
            "client_closed"
        }
        Ok(End::Shutdown) => {
            tracing::debug!(%peer, "closed for shutdown after delivering every response owed");
            "shutdown"
        }
        Ok(End::Fenced(link)) => {
            tracing::info!(%peer, link, "closed a connection of a fenced link (STOPPING or STOPPED) after answering its requests in flight");
            shared.control.connection_fenced(&link);
            "link_fenced"
        }
        // Routine: clients reconnect when they need to.
        Err(e @ SessionError::Idle { .. }) => {
            tracing::info!(%peer, listener = %target.label(), reason = %e, "closing idle client connection");
            e.label()
        }
        // A client may hang up with responses still owed (librdkafka closes
        // its bootstrap connection as soon as it knows the brokers).
        Err(SessionError::ClientWrite(e) | SessionError::ClientFrame(FrameError::Io(e)))
            if is_disconnect(&e) =>
        {
            tracing::debug!(%peer, error = %e, "client went away before its responses were written");
            "client_closed"
        }
        Err(e) => {
            if matches!(
                e,
                SessionError::UpstreamClosed { .. }
                    | SessionError::UpstreamFrame(FrameError::Io(_))
                    | SessionError::UpstreamWrite(_)
            ) {
                shared.upstream_lost(target);
            }
            tracing::warn!(%peer, listener = %target.label(), reason = %e, "closing client connection");
            e.label()
        }
    };
    drop(active);
    shared.metrics.connection_closed(reason);
}

fn is_disconnect(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        e.kind(),
        BrokenPipe | ConnectionReset | ConnectionAborted | UnexpectedEof
    )
}

async fn run(
    shared: &Arc<Shared>,
    tcp: TcpStream,
    peer: SocketAddr,
    target: Target,
) -> Result<End, SessionError> {
    // Nothing is owed yet: shutdown need not wait for a handshake or a
    // broker connection.
    let connected = tokio::select! {
        c = connect(shared, tcp, peer, target) => c?,
        _ = shared.shutting_down() => return Ok(End::Shutdown),
    };
    let (client, subject, upstream) = connected;
    let max = shared.config.max_frame_bytes;
    let (client_r, client_w) = split(client);
    let (up_r, up_w) = split(upstream);
    let (tx, rx) = mpsc::channel(MAX_IN_FLIGHT);
    let client_r = FrameReader::new(client_r, max)
        .with_budget(Arc::clone(&shared.budget))
        .with_frame_timeout(Duration::from_millis(shared.config.request_read_timeout_ms));
    let activity = Activity::new();
    let requests = requests(shared, subject, client_r, up_w, tx, &activity);
    let responses = responses(shared, FrameReader::new(up_r, max), client_w, rx, &activity);
    tokio::pin!(requests, responses);
    tokio::select! {
        // The client finished sending, or shutdown stopped reading: deliver
        // what is still owed.
        r = &mut requests => match r {
            Ok(end) => responses.await.map(|()| end),
            Err(e) => Err(e),
        },
        r = &mut responses => r.map(|()| End::ClientClosed),
    }
}

/// The client's TLS handshake (bounded by `TLS_HANDSHAKE_TIMEOUT_MS`) and
/// the connection to the broker.
async fn connect(
    shared: &Arc<Shared>,
    tcp: TcpStream,
    peer: SocketAddr,
    target: Target,
) -> Result<(BoxStream, Option<CertSubject>, BoxStream), SessionError> {
    let (client, subject): (BoxStream, Option<CertSubject>) = match &shared.acceptor {
        None => (Box::new(tcp), None),
        Some(acceptor) => {
            let ms = shared.config.tls_handshake_timeout_ms;
            let tls = tokio::time::timeout(Duration::from_millis(ms), acceptor.accept(tcp))
                .await
                .map_err(|_| SessionError::TlsHandshakeTimeout { ms })?
                .map_err(SessionError::TlsHandshake)?;
            let subject = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(super::tls::subject);
            (Box::new(tls), subject)
        }
    };
    let dial = async {
        match target {
            Target::Bootstrap => Ok(shared
                .upstream
                .connect_any(&shared.config.bootstrap_servers)
                .await?),
            Target::Node(node) => {
                let addr = shared
                    .node_address(node)
                    .ok_or(SessionError::UnknownNode(node))?;
                Ok((shared.upstream.connect(&addr).await?, addr))
            }
        }
    };
    // A connect still waiting when another found the broker unreachable
    // fails at once instead of holding the client for the whole timeout.
    let health = shared.health(target);
    let dialled: Result<_, SessionError> = tokio::select! {
        d = dial => d,
        _ = async { match &health { Some(h) => h.down().await, None => std::future::pending().await } } => {
            Err(SessionError::BrokerDown)
        }
    };
    let (upstream, broker) = match dialled {
        Ok(connected) => connected,
        Err(e) => {
            if let SessionError::Connect(c) = &e {
                if c.is_unreachable() {
                    shared.upstream_unreachable(target, c);
                }
            }
            return Err(e);
        }
    };
    shared.metrics.upstream_connected(target, &broker);
    tracing::debug!(%peer, %broker, "connected upstream");
    Ok((client, subject, upstream))
}

async fn requests(
    shared: &Arc<Shared>,
    subject: Option<CertSubject>,
    mut client: FrameReader<ReadHalf<BoxStream>>,
    mut upstream: WriteHalf<BoxStream>,
    tx: mpsc::Sender<Pending>,
    activity: &Activity,
) -> Result<End, SessionError> {
    let idle_ms = shared.config.connections_max_idle_ms;
    let idle = Duration::from_millis(idle_ms);
    // Set once a request speaks as a link: the connection counts as the
    // link's (for draining) and closes when the link is fenced.
    let mut link_session: Option<(
        Arc<crate::mirror::link::Link>,
        crate::control::links::LinkSession,
    )> = None;
    let mut changes = shared.control.changes();
    loop {
        // Frames are only ever taken whole: a frame cut short by shutdown
        // was never forwarded, so nothing is left half-answered.
        let wake = match activity.idle_since(&client, &tx) {
            Some(since) => since + idle,
            None => Instant::now() + idle,
        };
        let frame = tokio::select! {
            biased;
            _ = shared.shutting_down() => return Ok(End::Shutdown),
            // A link connection stops reading when its link is fenced; what
            // is in flight is still answered.
            _ = link_state_changed(&mut changes, link_session.is_some()) => {
                if let Some((link, _)) = &link_session {
                    if shared.control.fenced(link).is_some() {
                        return Ok(End::Fenced(link.name().to_string()));
                    }
                }
                continue;
            }
            f = client.read_frame() => f.map_err(SessionError::ClientFrame)?,
            _ = tokio::time::sleep_until(wake) => {
                match activity.idle_since(&client, &tx) {
                    Some(since) if since + idle <= Instant::now() => {
                        return Err(SessionError::Idle { ms: idle_ms })
                    }
                    _ => continue,
                }
            }
        };
        let Some(frame) = frame else {
            return Ok(End::ClientClosed);
        };
        let h = RequestHeaderPeek::parse(&frame)?;
        shared.metrics.request(h.api_key);
        let Ok(api) = ApiKey::try_from(h.api_key) else {
            // Not ours to judge: the broker answers (or closes) as it sees fit.
            send(
                &tx,
                Pending::BrokerUnknownApi {
                    correlation_id: h.correlation_id,
                },
            )
            .await;
            write_frame(&mut upstream, &frame)
                .await
                .map_err(SessionError::UpstreamWrite)?;
            continue;
        };
        let broker = |handling| Pending::Broker {
            correlation_id: h.correlation_id,
            api,
            version: h.api_version,
            handling,
        };
        if let Some(link) = shared
            .config
            .links
            .by_client_id(h.client_id(&frame).unwrap_or(""))
        {
            // A client without the link's certificate is not the link: its
            // Produce is refused as spoofed further on.
            let admitted = link.admits(subject.as_ref());
            if link_session.is_none() && admitted {
                let guard = shared.control.link_session(link.name());
                link_session = Some((Arc::clone(link), guard));
            }
            if let Some(message) = admitted.then(|| shared.control.fenced(link)).flatten() {
                shared.control.link_request_refused(link.name());
                if api == ApiKey::Produce {
                    let action = refuse_produce(
                        shared,
                        link.name(),
                        &h,
                        frame.freeze(),
                        Refusal::LinkFenced,
                        &message,
                    )?;
                    if let Some(p) = action.pending {
                        send(&tx, p).await;
                    }
                }
                tracing::debug!(link = link.name(), api = ?api, "refused a request of a fenced link; closing its connection");
                return Ok(End::Fenced(link.name().to_string()));
            }
        }
        match api {
            ApiKey::Produce => {
                let action = produce(shared, subject.as_ref(), &h, frame.freeze()).await?;
                if let Some(p) = action.pending {
                    send(&tx, p).await;
                }
                if let Some(frame) = action.forward {
                    write_frame(&mut upstream, &frame)
                        .await
                        .map_err(SessionError::UpstreamWrite)?;
                }
            }
            ApiKey::ApiVersions if h.api_version > addresses::api_versions_max() => {
                send(
                    &tx,
                    Pending::Local(addresses::unsupported_api_versions(h.correlation_id)?),
                )
                .await;
            }
            ApiKey::ApiVersions => {
                send(&tx, broker(Handling::ApiVersions)).await;
                write_frame(&mut upstream, &frame)
                    .await
                    .map_err(SessionError::UpstreamWrite)?;
            }
            _ if addresses::carries_addresses(api, h.api_version) => {
                check_parseable(api, h.api_version)?;
                send(&tx, broker(Handling::Addresses)).await;
                write_frame(&mut upstream, &frame)
                    .await
                    .map_err(SessionError::UpstreamWrite)?;
            }
            _ => {
                send(&tx, broker(Handling::Opaque)).await;
                write_frame(&mut upstream, &frame)
                    .await
                    .map_err(SessionError::UpstreamWrite)?;
            }
        }
    }
}

/// Resolves when the link states change, for a link connection; never
/// otherwise.
async fn link_state_changed(
    changes: &mut Option<tokio::sync::watch::Receiver<u64>>,
    watching: bool,
) {
    match changes {
        Some(rx) if watching => {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
        _ => std::future::pending().await,
    }
}

/// Every partition of a Produce answered here with `refusal`.
fn refuse_produce(
    shared: &Arc<Shared>,
    link: &str,
    h: &RequestHeaderPeek,
    frame: Bytes,
    refusal: Refusal,
    message: &str,
) -> Result<ProduceAction, SessionError> {
    let version = h.api_version;
    let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
    let acks = produce_acks(&frame, body_offset, version)?;
    let plan = produce::refuse_all(&frame, body_offset, version, refusal, message)?;
    count_local(shared, link, &plan.local);
    let pending = match acks != 0 {
        true => Some(Pending::Local(produce::local_response(
            h.correlation_id,
            version,
            &plan.local,
        )?)),
        false => None,
    };
    Ok(ProduceAction {
        pending,
        forward: None,
    })
}

async fn send(tx: &mpsc::Sender<Pending>, p: Pending) {
    // Fails only when the response loop has ended, which ends the session.
    let _ = tx.send(p).await;
}

fn check_parseable(api: ApiKey, version: i16) -> Result<(), SessionError> {
    match addresses::parseable_versions(api) {
        Some((_, max)) if version > max => {
            Err(SessionError::UnsupportedVersion { api, version, max })
        }
        _ => Ok(()),
    }
}

/// How long a link retry waits for the same batch's attempt in flight
/// before it is answered with a retriable error instead.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// How long a request rebuilding a partition's producer state may take to
/// read its log tail before the partition is answered retriable.
const REBUILD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request waits for another request's rebuild of a partition
/// before that partition is answered retriable (longer than a rebuild may
/// take, so a rebuild that ends in time is waited for).
const REBUILD_WAIT: Duration = Duration::from_secs(20);

/// What to queue and what to forward for a Produce request.
struct ProduceAction {
    /// The response the client is owed, unless `acks=0`.
    pending: Option<Pending>,
    /// The frame for the broker, unless the proxy answered every partition.
    forward: Option<BytesMut>,
}

async fn produce(
    shared: &Arc<Shared>,
    subject: Option<&CertSubject>,
    h: &RequestHeaderPeek,
    frame: Bytes,
) -> Result<ProduceAction, SessionError> {
    let version = h.api_version;
    let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
    let acks = produce_acks(&frame, body_offset, version)?;
    let expects_response = acks != 0;
    // With acks=0 nothing is recorded without an answer: the tracked
    // batches are failed. No client retries what it never hears about, so
    // there is no retry to deduplicate and the partition is not re-read.
    let broker = |local: Vec<LocalPartition>, tracked: Tracked| {
        if !expects_response {
            tracked.unanswered();
            return None;
        }
        Some(Pending::Broker {
            correlation_id: h.correlation_id,
            api: ApiKey::Produce,
            version,
            handling: Handling::Produce(local, tracked),
        })
    };
    let local_only = |local: &[LocalPartition]| -> Result<Option<Pending>, SessionError> {
        Ok(match expects_response {
            true => Some(Pending::Local(produce::local_response(
                h.correlation_id,
                version,
                local,
            )?)),
            false => None,
        })
    };
    // Every partition of the request answered here with `refusal`.
    let refuse_request = |link: &str, refusal: Refusal, message: &str| {
        let plan = produce::refuse_all(&frame, body_offset, version, refusal, message)?;
        count_local(shared, link, &plan.local);
        Ok(ProduceAction {
            pending: local_only(&plan.local)?,
            forward: None,
        })
    };
    let origin = shared.config.links.classify(h.client_id(&frame), subject);
    let link = match origin {
        Origin::Local => {
            if addresses::carries_addresses(ApiKey::Produce, version) {
                check_parseable(ApiKey::Produce, version)?;
            }
            // Read-only mirrored topics: refused per partition.
            if shared.control.any_read_only() {
                let control = &shared.control;
                let plan = produce::refuse_where(&frame, body_offset, version, |t| {
                    let name = match version >= 13 {
                        true => shared.topic_name(t.topic_id)?,
                        false => t.name.to_string(),
                    };
                    let refusal = control.read_only(&name, version)?;
                    control.local_write_refused(&name);
                    Some(refusal)
                })?;
                if !plan.local.is_empty() {
                    if let Some(LocalPartition {
                        outcome: LocalOutcome::Refused { message, .. },
                        ..
                    }) = plan.local.first()
                    {
                        tracing::debug!(partitions = plan.local.len(), %message, "refused a local write to a read-only mirrored topic");
                    }
                    if plan.forwarded_partitions == 0 {
                        return Ok(ProduceAction {
                            pending: local_only(&plan.local)?,
                            forward: None,
                        });
                    }
                    let reduced = produce::without_local_partitions(
                        &frame,
                        body_offset,
                        version,
                        &plan.local,
                    )?;
                    return Ok(ProduceAction {
                        pending: broker(plan.local, Tracked::none()),
                        forward: Some(reduced),
                    });
                }
            }
            let frame = BytesMut::from(frame); // unique: no copy
            return Ok(ProduceAction {
                pending: broker(Vec::new(), Tracked::none()),
                forward: Some(frame),
            });
        }
        Origin::Spoofed(link) => {
            let message = format!(
                "client id '{}' is reserved for mirror link '{}', which requires a TLS client certificate matching '{}'",
                link.client_id(),
                link.name(),
                link.tls_subject().unwrap_or_default()
            );
            tracing::warn!(link = link.name(), subject = ?subject.map(|s| &s.full), "refused a Produce that claims a mirror link's client id");
            return refuse_request(link.name(), Refusal::NotAuthorized, &message);
        }
        Origin::Link(link) => link,
    };
    let state = match shared.state.as_ref() {
        Some(state) if state.is_loaded() => state,
        _ => {
            let why = shared
                .state
                .as_ref()
                .and_then(|s| s.not_ready_reason())
                .unwrap_or_else(|| "no state store".into());
            let message = format!(
                "mirror link '{}': the proxy's producer id mapping state is not loaded yet ({why}); retry",
                link.name()
            );
            return refuse_request(link.name(), Refusal::StateNotLoaded, &message);
        }
    };
    let plan_now = || {
        let view = state.view();
        produce::plan_with(
            &frame,
            body_offset,
            version,
            &link,
            &|id| shared.topic_name(id),
            &|name| shared.topic_id(name).or_else(|| state.topic_id(name)),
            &produce::AtTime(&view, crate::state::now_ms()),
        )
    };
    let mut plan = plan_now()?;
    if !plan.unresolved.is_empty() {
        // New origins: persisted before anything of them is forwarded.
        for (topic, partition, error) in state.resolve(&plan.unresolved).await {
            tracing::warn!(link = link.name(), topic, partition, %error, "could not persist a new mirrored producer's mapping");
        }
        plan = plan_now()?;
    }
    // Mirrored producer state: duplicates and refusals become local answers.
    // Nothing of a partition begins before its state is rebuilt from its
    // log tail (after start-up, an unknown outcome, a leader move); one
    // request rebuilds, the partition's others wait (bounded) for it. A
    // retry of a batch still in flight waits for that attempt's outcome
    // (bounded: then it is answered retriable), never a second append.
    let mut in_flight_deadline = None;
    let mut rebuild_deadline = None;
    let mut shutting_down = false;
    let tracked = loop {
        let changed = shared.dedupe.changed();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let now = tokio::time::Instant::now();
        let wait = !shutting_down && in_flight_deadline.is_none_or(|d| now < d);
        let deadline = match shared.dedupe.begin(&mut plan, link.name(), wait) {
            Begin::Begun(tracked) => break tracked,
            Begin::InFlight => *in_flight_deadline.get_or_insert(now + IN_FLIGHT_WAIT),
            Begin::Rebuild { claims, waiting } if claims.is_empty() => {
                let d = *rebuild_deadline.get_or_insert(now + REBUILD_WAIT);
                if shutting_down || now >= d {
                    for partition in waiting {
                        let message = format!(
                            "mirror link '{}': partition {}: the mirrored producer state is still being rebuilt from the log by another request; retry",
                            link.name(),
                            partition.partition
                        );
                        Dedupe::refuse_partition(&mut plan, partition, message);
                    }
                    continue;
                }
                d
            }
            Begin::Rebuild { claims, .. } => {
                // Bounded too: a partition marked again during each of its
                // rebuilds is not rebuilt forever by one request.
                let d = *rebuild_deadline.get_or_insert(now + REBUILD_WAIT);
                for claim in claims {
                    if shutting_down || tokio::time::Instant::now() >= d {
                        let message = format!(
                            "mirror link '{}': partition {}: the mirrored producer state was marked again while it was rebuilt; retry",
                            link.name(),
                            claim.partition().partition
                        );
                        Dedupe::refuse_partition(&mut plan, claim.partition(), message);
                        continue;
                    }
                    rebuild(shared, state, link.name(), &mut plan, claim).await;
                }
                continue;
            }
        };
        tokio::select! {
            _ = changed => {}
            _ = tokio::time::sleep_until(deadline) => {}
            _ = shared.shutting_down() => shutting_down = true,
        }
    };
    shared
        .metrics
        .batches_remapped(link.name(), plan.remapped_batches as u64);
    count_local(shared, link.name(), &plan.local);
    if plan.forwarded_partitions == 0 {
        return Ok(ProduceAction {
            pending: local_only(&plan.local)?,
            forward: None,
        });
    }
    // The plan holds no reference into the frame unless some partitions are
    // answered locally, so the fast path gets the frame back without a copy.
    let mut buf = frame
        .try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
    plan.apply(&mut buf)?;
    if plan.local.is_empty() {
        return Ok(ProduceAction {
            pending: broker(Vec::new(), tracked),
            forward: Some(buf),
        });
    }
    let reduced =
        produce::without_local_partitions(&buf.freeze(), body_offset, version, &plan.local)?;
    Ok(ProduceAction {
        pending: broker(plan.local, tracked),
        forward: Some(reduced),
    })
}

/// Rebuild `claim`'s partition from its log tail (bounded by
/// [`REBUILD_TIMEOUT`]); if it cannot be read, its partition of `plan` is
/// answered retriable.
async fn rebuild(
    shared: &Shared,
    state: &StateStore,
    link: &str,
    plan: &mut ProducePlan,
    claim: RebuildClaim,
) {
    let partition = claim.partition();
    let name = shared
        .topic_name(partition.topic_id)
        .unwrap_or_else(|| claim.topic().name.0.to_string());
    let owner = |mapped: i64| state.view().owner(partition, mapped);
    let floor = state.barrier_floor(partition).unwrap_or(0);
    let run = claim.run(state.client(), &name, floor, &owner);
    let error = match tokio::time::timeout(REBUILD_TIMEOUT, run).await {
        Ok(Ok(r)) => {
            tracing::info!(
                link,
                topic = name,
                partition = partition.partition,
                from_offset = r.from_offset,
                log_start_offset = r.log_start_offset,
                log_end_offset = r.log_end_offset,
                batches = r.replayed.batches,
                taken = r.replayed.taken,
                "rebuilt the mirrored producer state from the log tail"
            );
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => {
            shared.metrics.producer_state_rebuilt("failed", 0);
            format!("not read within {} s", REBUILD_TIMEOUT.as_secs())
        }
    };
    let message = format!(
        "mirror link '{link}': {name}-{}: the mirrored producer state could not be rebuilt from the log ({error}); retry",
        partition.partition
    );
    Dedupe::refuse_partition(plan, partition, message);
}

fn count_local(shared: &Shared, link: &str, local: &[LocalPartition]) {
    for l in local {
        match &l.outcome {
            LocalOutcome::DroppedControl { batches } => shared
                .metrics
                .control_batches_dropped(link, *batches as u64),
            LocalOutcome::Duplicate { batches, .. } => {
                tracing::debug!(
                    link,
                    partition = l.partition,
                    batches,
                    "answered a mirrored retry as a duplicate"
                );
                shared.metrics.duplicates_answered(link, *batches as u64);
            }
            LocalOutcome::Refused { refusal, message } => {
                tracing::warn!(link, partition = l.partition, reason = refusal.label(), %message, "refused a mirrored partition");
                shared.metrics.partition_refused(link, refusal.label());
            }
        }
    }
}

async fn responses(
    shared: &Arc<Shared>,
    mut upstream: FrameReader<ReadHalf<BoxStream>>,
    mut client: WriteHalf<BoxStream>,
    mut rx: mpsc::Receiver<Pending>,
    activity: &Activity,
) -> Result<(), SessionError> {
    loop {
        let pending = tokio::select! {
            // Entries are queued before their request is written upstream, so
            // a response is only ever ready after its entry: check rx first.
            biased;
            p = rx.recv() => match p {
                Some(p) => p,
                None => return Ok(()),
            },
            // Nothing owed: the broker should be silent. Notice it leaving.
            f = upstream.read_frame() => return Err(match f {
                Ok(None) => SessionError::UpstreamClosed { in_flight: 0 },
                Ok(Some(_)) => SessionError::UnexpectedResponse,
                Err(e) => SessionError::UpstreamFrame(e),
            }),
        };
        activity.answering.store(true, Ordering::Relaxed);
        let (correlation_id, api, version, handling) = match pending {
            Pending::Local(frame) => {
                write_to(&mut client, &frame).await?;
                activity.answered();
                continue;
            }
            Pending::BrokerUnknownApi { correlation_id } => {
                (correlation_id, None, 0, Handling::Opaque)
            }
            Pending::Broker {
                correlation_id,
                api,
                version,
                handling,
            } => (correlation_id, Some(api), version, handling),
        };
        let frame = upstream
            .read_frame()
            .await
            .map_err(SessionError::UpstreamFrame)?
            .ok_or(SessionError::UpstreamClosed {
                in_flight: 1 + rx.len(),
            })?;
        let got = frame
            .get(..4)
            .map(|b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or(SessionError::UnexpectedResponse)?;
        if got != correlation_id {
            return Err(SessionError::CorrelationMismatch {
                expected: correlation_id,
                got,
            });
        }
        let out = match (api, handling) {
            (_, Handling::Opaque) | (None, _) => frame,
            (Some(_), Handling::ApiVersions) => {
                addresses::clamp_api_versions(version, &frame)?.unwrap_or(frame)
            }
            (Some(api), Handling::Addresses) => {
                let (out, learnt) = addresses::rewrite(api, version, &frame, &shared.advertised)?;
                shared.learn(learnt)?;
                out.unwrap_or(frame)
            }
            (Some(_), Handling::Produce(local, tracked)) => {
                produce_response(shared, version, frame, local, tracked)?
            }
        };
        write_to(&mut client, &out).await?;
        activity.answered();
    }
}

async fn write_to<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> Result<(), SessionError> {
    write_frame(w, frame)
        .await
        .map_err(SessionError::ClientWrite)
}

fn produce_response(
    shared: &Arc<Shared>,
    version: i16,
    frame: BytesMut,
    local: Vec<LocalPartition>,
    tracked: Tracked,
) -> Result<BytesMut, SessionError> {
    // Leader endpoints (KIP-951) are rare: the walk only looks, and the
    // frame passes untouched unless it names a broker.
    let frame = if addresses::carries_addresses(ApiKey::Produce, version) {
        let (out, learnt) =
            addresses::rewrite(ApiKey::Produce, version, &frame, &shared.advertised)?;
        shared.learn(learnt)?;
        out.unwrap_or(frame)
    } else {
        frame
    };
    if local.is_empty() && tracked.is_empty() {
        return Ok(frame);
    }
    let frame = frame.freeze();
    // A response that cannot be decoded drops `tracked`: its batches fail.
    let (correlation_id, mut response) = produce::decode_response(&frame, version)?;
    if !tracked.is_empty() {
        tracked.settle(&response, version, crate::state::now_ms());
    }
    if local.is_empty() {
        return Ok(frame
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..])));
    }
    produce::merge_local(&mut response, version, &local);
    Ok(produce::encode_response(
        correlation_id,
        version,
        &response,
    )?)
}
