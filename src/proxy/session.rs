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

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;
use tokio::io::{split, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::watch_wait::WatchWait;
use super::{Shared, StartError, Target};
use crate::filter::addresses::{self, RewriteError, UnsupportedVersion};
use crate::filter::produce::{Answer, ProduceFilter, ProducePathError, ProduceState};
use crate::mirror::link::CertSubject;
use crate::mirror::produce::{ProduceError, Refusal};
use crate::net::frame::{write_frame, FrameError, FrameReader};
use crate::net::upstream::{BoxStream, ConnectError};
use crate::wire::header::{HeaderError, RequestHeaderPeek};

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
    #[error(transparent)]
    UnsupportedVersion(#[from] UnsupportedVersion),
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

impl From<ProducePathError> for SessionError {
    fn from(e: ProducePathError) -> SessionError {
        match e {
            ProducePathError::Header(e) => SessionError::Header(e),
            ProducePathError::Produce(e) => SessionError::Produce(e),
            ProducePathError::Rewrite(e) => SessionError::Rewrite(e),
            ProducePathError::UnsupportedVersion(e) => SessionError::UnsupportedVersion(e),
        }
    }
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
            SessionError::UnsupportedVersion(_) => "unsupported_version",
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
    /// A Produce response: the Produce filter's response half rewrites
    /// leader endpoints (v10+) and adds the partitions the proxy answered
    /// itself.
    Produce(ProduceState),
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
    let active = shared.ctx.metrics.connection_opened(target.into());
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
            shared.ctx.control.connection_fenced(&link);
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
    shared.ctx.metrics.connection_closed(reason);
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
    // Boxed: a TLS handshake's future is large and needed only once.
    let connected = tokio::select! {
        c = Box::pin(connect(shared, tcp, peer, target)) => c?,
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
                .and_then(crate::net::tls::subject);
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
    shared
        .ctx
        .metrics
        .upstream_connected(target.into(), &broker);
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
    let mut changes = shared.ctx.control.changes();
    // What the loop waits on besides the client lives across frames: each
    // of these registers with a timer or a waiter list shared by every
    // connection when it first waits, and made anew per frame that was a
    // registration and a removal per request. The idle timer is not moved
    // by activity; when it fires it looks at the activity and re-arms.
    let mut shutdown = shared.shutdown_wait();
    let idle_timer = tokio::time::sleep(idle);
    tokio::pin!(idle_timer);
    // The link's state changes, watched once the connection speaks as a
    // link (boxed: only link connections pay for it).
    let mut link_changed = None;
    let filter = ProduceFilter::new(&shared.ctx);
    loop {
        if link_changed.is_none() && link_session.is_some() {
            link_changed = changes.take().map(watch_link_state);
        }
        // Frames are only ever taken whole: a frame cut short by shutdown
        // was never forwarded, so nothing is left half-answered.
        let frame = tokio::select! {
            biased;
            _ = &mut shutdown => return Ok(End::Shutdown),
            // A link connection stops reading when its link is fenced; what
            // is in flight is still answered.
            rx = next_link_change(&mut link_changed) => {
                link_changed = rx.map(watch_link_state);
                if let Some((link, _)) = &link_session {
                    if shared.ctx.control.fenced(link).is_some() {
                        return Ok(End::Fenced(link.name().to_string()));
                    }
                }
                continue;
            }
            f = client.read_frame() => f.map_err(SessionError::ClientFrame)?,
            _ = &mut idle_timer => {
                let now = Instant::now();
                match activity.idle_since(&client, &tx) {
                    Some(since) if since + idle <= now => {
                        return Err(SessionError::Idle { ms: idle_ms })
                    }
                    Some(since) => idle_timer.as_mut().reset(since + idle),
                    None => idle_timer.as_mut().reset(now + idle),
                }
                continue;
            }
        };
        let Some(frame) = frame else {
            return Ok(End::ClientClosed);
        };
        let h = RequestHeaderPeek::parse(&frame)?;
        shared.ctx.metrics.request(h.api_key);
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
        let pending = |answer| match answer {
            Answer::Local(frame) => Pending::Local(frame),
            Answer::Broker(state) => broker(Handling::Produce(state)),
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
                let guard = shared.ctx.control.link_session(link.name());
                link_session = Some((Arc::clone(link), guard));
            }
            if let Some(message) = admitted.then(|| shared.ctx.control.fenced(link)).flatten() {
                shared.ctx.control.link_request_refused(link.name());
                if api == ApiKey::Produce {
                    let action = filter.refuse(
                        link.name(),
                        &h,
                        frame.freeze(),
                        Refusal::LinkFenced,
                        &message,
                    )?;
                    if let Some(answer) = action.answer {
                        send(&tx, pending(answer)).await;
                    }
                }
                tracing::debug!(link = link.name(), api = ?api, "refused a request of a fenced link; closing its connection");
                return Ok(End::Fenced(link.name().to_string()));
            }
        }
        match api {
            ApiKey::Produce => {
                let action = filter.request(subject.as_ref(), &h, frame.freeze()).await?;
                if let Some(answer) = action.answer {
                    send(&tx, pending(answer)).await;
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
                addresses::check_parseable(api, h.api_version)?;
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

/// The next change of the link states, with the receiver to watch on
/// (`None` once the states can no longer change).
fn watch_link_state(
    mut rx: watch::Receiver<u64>,
) -> WatchWait<u64, impl Future<Output = Option<watch::Receiver<u64>>> + Send> {
    WatchWait::new(
        rx.clone(),
        async move { rx.changed().await.ok().map(|()| rx) },
    )
}

/// Waits for the watched change; forever when nothing is watched.
async fn next_link_change<F: Future + Unpin>(changed: &mut Option<F>) -> F::Output {
    match changed {
        Some(f) => f.await,
        None => std::future::pending().await,
    }
}

async fn send(tx: &mpsc::Sender<Pending>, p: Pending) {
    // Fails only when the response loop has ended, which ends the session.
    let _ = tx.send(p).await;
}

async fn responses(
    shared: &Arc<Shared>,
    mut upstream: FrameReader<ReadHalf<BoxStream>>,
    mut client: WriteHalf<BoxStream>,
    mut rx: mpsc::Receiver<Pending>,
    activity: &Activity,
) -> Result<(), SessionError> {
    let filter = ProduceFilter::new(&shared.ctx);
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
                let (out, learnt) =
                    addresses::rewrite(api, version, &frame, &shared.ctx.advertised)?;
                shared.learn(learnt)?;
                out.unwrap_or(frame)
            }
            (Some(_), Handling::Produce(state)) => {
                let (out, learnt) = filter.response(state, frame)?;
                if let Some(learnt) = learnt {
                    shared.learn(learnt)?;
                }
                out
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
