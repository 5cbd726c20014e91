//! One client connection and its upstream connection to a broker.
//!
//! Two loops run side by side. The request loop reads client frames, peeks
//! at their headers, classifies the client once, and hands each request to
//! the connection's filter stack (`filter::stack`), which answers it or
//! writes it to the broker; for every request that expects an answer it
//! queues the stack's pending response. The response loop takes those in
//! order: one that awaits the broker gets the broker's next frame (brokers
//! answer in order on a connection), then the filters' response halves
//! make the client's frame. So responses reach the client in request order
//! with their correlation ids, however many are in flight, and a request
//! that gets no response (`acks=0`) leaves nothing behind.
//!
//! The request loop is also where a connection ends on its own: after
//! `CONNECTIONS_MAX_IDLE_MS` with nothing in flight and nothing received,
//! and at shutdown, when it stops reading and lets the response loop
//! deliver what is owed before the connection closes.
//!
//! What a connection holds while it waits on its broker is bounded: while
//! the broker holds one of its requests the request loop reads no frame
//! larger than the connection's share of the request budget
//! (`next_frame`), a client that resets its connection meanwhile, or while
//! a filter waits, ends the session at once (`unless_reset`), and a broker
//! response must arrive whole within `RESPONSE_READ_TIMEOUT_MS` of its
//! first byte.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;
use tokio::io::{split, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Instant;

use super::queue::{CloseOnDrop, Queue};
use super::watch_wait::WatchWait;
use super::{Shared, StartError, Target};
use crate::filter::addresses::{Learnt, RewriteError, UnsupportedVersion};
use crate::filter::guard::GuardError;
use crate::filter::{self, FilterError, Outcome, Pending, Request, Service, Step};
use crate::mirror::link::{CertSubject, Origin};
use crate::mirror::produce::ProduceError;
use crate::net::client_socket::{ClientSocket, ResetWatch};
use crate::net::frame::{write_frame, FrameError, FrameReader};
use crate::net::upstream::{BoxStream, ConnectError};
use crate::net::write_timeout::{is_stalled, WriteTimeout};
use crate::sync::error_chain;
use crate::wire::header::{HeaderError, RequestHeaderPeek};

/// Requests in flight per connection before the proxy stops reading from
/// the client (backpressure).
const MAX_IN_FLIGHT: usize = 512;

/// Why a connection was closed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SessionError {
    #[error("TLS handshake with client failed")]
    TlsHandshake(#[source] std::io::Error),
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
    #[error("bad frame from client")]
    ClientFrame(#[source] FrameError),
    #[error("malformed request header")]
    Header(#[from] HeaderError),
    #[error(transparent)]
    Produce(#[from] ProduceError),
    #[error(transparent)]
    Rewrite(#[from] RewriteError),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error(transparent)]
    UnsupportedVersion(#[from] UnsupportedVersion),
    #[error("broker closed the connection with {in_flight} request(s) in flight")]
    UpstreamClosed { in_flight: usize },
    #[error("reading a frame from the broker")]
    UpstreamFrame(#[source] FrameError),
    #[error("broker sent a response with correlation id {got} while {expected} was expected")]
    CorrelationMismatch { expected: i32, got: i32 },
    #[error("broker sent a response nobody asked for")]
    UnexpectedResponse,
    #[error("opening a listener for a broker")]
    Listener(#[from] StartError),
    #[error("writing to the broker")]
    UpstreamWrite(#[source] std::io::Error),
    #[error("writing to the client")]
    ClientWrite(#[source] std::io::Error),
}

impl From<FilterError> for SessionError {
    fn from(e: FilterError) -> SessionError {
        match e {
            FilterError::Header(e) => SessionError::Header(e),
            FilterError::Produce(e) => SessionError::Produce(e),
            FilterError::Rewrite(e) => SessionError::Rewrite(e),
            FilterError::Guard(e) => SessionError::Guard(e),
            FilterError::UnsupportedVersion(e) => SessionError::UnsupportedVersion(e),
            FilterError::UpstreamWrite(e) => SessionError::UpstreamWrite(e),
            FilterError::MissingResponse => SessionError::UnexpectedResponse,
        }
    }
}

/// Every reason a connection is closed for (`connections_closed_total`):
/// the labels of [`SessionError::label`] and of the ends without an error.
pub(crate) const CLOSE_REASONS: [&str; 25] = [
    "client_closed",
    "shutdown",
    "link_fenced",
    "tls_handshake",
    "tls_handshake_timeout",
    "idle_timeout",
    "upstream_unreachable",
    "frame_too_large",
    "request_timeout",
    "buffer_wait_timeout",
    "bad_client_frame",
    "malformed_header",
    "malformed_produce",
    "bad_response",
    "malformed_request",
    "unsupported_version",
    "upstream_closed",
    "upstream_read_timeout",
    "bad_upstream_frame",
    "upstream_protocol",
    "listener",
    "upstream_write_timeout",
    "upstream_write",
    "client_write_timeout",
    "client_write",
];

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
            SessionError::ClientFrame(FrameError::BudgetWait { .. })
            | SessionError::UpstreamFrame(FrameError::BudgetWait { .. }) => "buffer_wait_timeout",
            SessionError::ClientFrame(_) => "bad_client_frame",
            SessionError::Header(_) => "malformed_header",
            SessionError::Produce(_) => "malformed_produce",
            SessionError::Rewrite(_) => "bad_response",
            SessionError::Guard(GuardError::Request { .. }) => "malformed_request",
            SessionError::Guard(GuardError::Encode { .. }) => "bad_response",
            SessionError::UnsupportedVersion(_) => "unsupported_version",
            SessionError::UpstreamClosed { .. } => "upstream_closed",
            SessionError::UpstreamFrame(FrameError::Timeout { .. }) => "upstream_read_timeout",
            SessionError::UpstreamFrame(_) => "bad_upstream_frame",
            SessionError::CorrelationMismatch { .. } | SessionError::UnexpectedResponse => {
                "upstream_protocol"
            }
            SessionError::Listener(_) => "listener",
            SessionError::UpstreamWrite(e) if is_stalled(e) => "upstream_write_timeout",
            SessionError::UpstreamWrite(_) => "upstream_write",
            SessionError::ClientWrite(e) if is_stalled(e) => "client_write_timeout",
            SessionError::ClientWrite(_) => "client_write",
        }
    }
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
    fn idle_since<R, P>(&self, client: &FrameReader<R>, owed: &Queue<P>) -> Option<Instant>
    where
        R: tokio::io::AsyncRead + Unpin,
    {
        if !owed.is_empty() || self.answering.load(Ordering::Relaxed) || client.mid_frame() {
            return None;
        }
        let answered =
            self.start + Duration::from_millis(self.last_answer_ms.load(Ordering::Relaxed));
        Some(client.last_read().max(answered))
    }
}

/// A client connection as accepted.
enum ClientIo {
    /// TCP, to be TLS-accepted if the client listener has TLS.
    Tcp(TcpStream),
    /// TLS, already accepted (routed by its ClientHello).
    Tls(
        Box<tokio_rustls::server::TlsStream<ClientSocket>>,
        ResetWatch,
    ),
}

/// Serve one connection of the SNI listener: route it by its ClientHello,
/// then serve it as a connection to that broker. A connection that cannot
/// be routed is refused during its handshake (one WARN line, counted).
pub(crate) async fn serve_sni(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr) {
    use crate::metrics::Listener;
    use crate::net::tls::SniFailure;
    let Some(tls) = shared.acceptor.clone() else {
        // Proxy::start refuses SNI routing without TLS.
        return;
    };
    let ms = shared.config.tls_handshake_timeout_ms;
    let (socket, reset) = ClientSocket::new(tcp);
    let handshake = tokio::time::timeout(
        Duration::from_millis(ms),
        tls.accept_routed(socket, |name| shared.sni_target(name)),
    );
    let routed = tokio::select! {
        r = handshake => r,
        _ = shared.shutting_down() => return,
    };
    let refused = |reason: &'static str| {
        shared
            .ctx
            .metrics
            .connection_refused(Listener::Bootstrap, reason)
    };
    match routed {
        Ok(Ok((stream, target))) => {
            serve_io(shared, ClientIo::Tls(Box::new(stream), reset), peer, target).await
        }
        Ok(Err(SniFailure::Refused(why))) => {
            tracing::warn!(%peer, listener = "sni", reason = %why, "refused client connection: sent TLS alert access_denied");
            refused(why.label());
        }
        Ok(Err(SniFailure::Handshake(e))) => {
            let e = SessionError::TlsHandshake(e);
            tracing::warn!(%peer, listener = "sni", reason = %error_chain(&e), "closing client connection");
            refused(e.label());
        }
        Err(_) => {
            let e = SessionError::TlsHandshakeTimeout { ms };
            tracing::warn!(%peer, listener = "sni", reason = %error_chain(&e), "closing client connection");
            refused(e.label());
        }
    }
}

/// Serve one accepted client connection until either side closes.
pub(crate) async fn serve(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr, target: Target) {
    serve_io(shared, ClientIo::Tcp(tcp), peer, target).await
}

async fn serve_io(shared: Arc<Shared>, client: ClientIo, peer: SocketAddr, target: Target) {
    let active = shared.ctx.metrics.connection_opened(target.into());
    tracing::debug!(%peer, listener = %target.label(), "client connected");
    let reason = match run(&shared, client, peer, target).await {
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
            tracing::info!(%peer, listener = %target.label(), reason = %error_chain(&e), "closing idle client connection");
            e.label()
        }
        // A client may hang up with responses still owed (librdkafka closes
        // its bootstrap connection as soon as it knows the brokers).
        Err(SessionError::ClientWrite(e) | SessionError::ClientFrame(FrameError::Io(e)))
            if is_disconnect(&e) =>
        {
            tracing::debug!(%peer, error = %error_chain(&e), "client went away before its responses were written");
            "client_closed"
        }
        Err(e) => {
            // A write that timed out found the broker there, just not reading.
            if matches!(
                &e,
                SessionError::UpstreamClosed { .. }
                    | SessionError::UpstreamFrame(FrameError::Io(_))
            ) || matches!(&e, SessionError::UpstreamWrite(w) if !is_stalled(w))
            {
                shared.upstream_lost(target);
            }
            tracing::warn!(%peer, listener = %target.label(), reason = %error_chain(&e), "closing client connection");
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
    tcp: ClientIo,
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
    let (client, subject, reset, upstream) = connected;
    let max = shared.config.max_frame_bytes;
    let (client_r, client_w) = split(client);
    let (up_r, up_w) = split(upstream);
    // A frame being written holds budget: no write may stall for ever.
    let stall = Duration::from_millis(shared.config.write_timeout_ms);
    let setting = "MIRROR_PROXY_WRITE_TIMEOUT_MS";
    let client_w = WriteTimeout::new(client_w, stall, "client", setting);
    let up_w = WriteTimeout::new(up_w, stall, "broker", setting);
    let owed = Queue::new(MAX_IN_FLIGHT);
    let client_r = FrameReader::new(client_r, max)
        .with_budget(Arc::clone(&shared.budget))
        .with_frame_timeout(
            Duration::from_millis(shared.config.request_read_timeout_ms),
            "MIRROR_PROXY_REQUEST_READ_TIMEOUT_MS",
        );
    // A response frame holds the response budget while it is read: a
    // broker that stalls or trickles in the middle of one may not keep it.
    let up_r = FrameReader::new(up_r, max)
        .with_budget(Arc::clone(&shared.response_budget))
        .with_frame_timeout(
            Duration::from_millis(shared.config.response_read_timeout_ms),
            "MIRROR_PROXY_RESPONSE_READ_TIMEOUT_MS",
        );
    let activity = Activity::new();
    // Declared before the loops, so dropped after both: the connection
    // counts as its link's until every response it owes is in.
    let mut link_session = None;
    let stack = filter::stack(&shared.ctx, subject.as_ref(), up_w);
    let requests = requests(
        shared,
        subject.as_ref(),
        ClientIn {
            frames: client_r,
            reset: reset.clone(),
        },
        stack,
        &owed,
        &activity,
        &mut link_session,
    );
    let responses = responses(shared, up_r, client_w, &owed, &activity);
    tokio::pin!(requests, responses);
    tokio::select! {
        // The client finished sending, or shutdown stopped reading: deliver
        // what is still owed.
        r = &mut requests => match r {
            Ok(end) => unless_reset(&reset, responses).await?.map(|()| end),
            Err(e) => Err(e),
        },
        r = &mut responses => r.map(|()| End::ClientClosed),
    }
}

/// The client's TLS handshake (bounded by `TLS_HANDSHAKE_TIMEOUT_MS`) and
/// the connection to the broker.
async fn connect(
    shared: &Arc<Shared>,
    client: ClientIo,
    peer: SocketAddr,
    target: Target,
) -> Result<(BoxStream, Option<CertSubject>, ResetWatch, BoxStream), SessionError> {
    let subject_of = |tls: &tokio_rustls::server::TlsStream<ClientSocket>| {
        tls.get_ref()
            .1
            .peer_certificates()
            .and_then(|certs| certs.first())
            .and_then(crate::net::tls::subject)
    };
    let (client, subject, reset): (BoxStream, Option<CertSubject>, ResetWatch) =
        match (client, &shared.acceptor) {
            (ClientIo::Tls(tls, reset), _) => {
                let subject = subject_of(&tls);
                (tls, subject, reset)
            }
            (ClientIo::Tcp(tcp), None) => {
                let (socket, reset) = ClientSocket::new(tcp);
                (Box::new(socket), None, reset)
            }
            (ClientIo::Tcp(tcp), Some(acceptor)) => {
                let (socket, reset) = ClientSocket::new(tcp);
                let ms = shared.config.tls_handshake_timeout_ms;
                let tls = tokio::time::timeout(Duration::from_millis(ms), acceptor.accept(socket))
                    .await
                    .map_err(|_| SessionError::TlsHandshakeTimeout { ms })?
                    .map_err(SessionError::TlsHandshake)?;
                let subject = subject_of(&tls);
                (Box::new(tls), subject, reset)
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
    Ok((client, subject, reset, upstream))
}

/// What the request loop reads from: the client's frames, and the watch
/// for its reset while the loop waits on the broker instead.
struct ClientIn {
    frames: FrameReader<ReadHalf<BoxStream>>,
    reset: ResetWatch,
}

/// A connection's link, once a request spoke as it, and its place among
/// the link's connections.
type LinkSessionSlot = Option<(
    Arc<crate::mirror::link::Link>,
    crate::control::links::LinkSession,
)>;

async fn requests<S: Service>(
    shared: &Arc<Shared>,
    subject: Option<&CertSubject>,
    client: ClientIn,
    mut stack: S,
    owed: &Queue<S::Pending>,
    activity: &Activity,
    link_session: &mut LinkSessionSlot,
) -> Result<End, SessionError> {
    // However this loop ends, the response loop delivers what is queued
    // and then ends too.
    let _close = CloseOnDrop(owed);
    let ClientIn {
        frames: mut client,
        reset,
    } = client;
    let reset = &reset;
    let idle_ms = shared.config.connections_max_idle_ms;
    let idle = Duration::from_millis(idle_ms);
    let share = shared.parked_share();
    // Set once a request speaks as a link: the connection counts as the
    // link's (for draining) and closes when the link is fenced. The slot
    // outlives this loop: a link's forwarded request is at the broker
    // until its response is in, so the connection is drained only once the
    // response loop has ended too.
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
                if let Some((link, _)) = &*link_session {
                    if shared.ctx.control.fenced(link).is_some() {
                        return Ok(End::Fenced(link.name().to_string()));
                    }
                }
                continue;
            }
            f = next_frame(&mut client, owed, share, reset) => f.map_err(SessionError::ClientFrame)?,
            _ = &mut idle_timer => {
                let now = Instant::now();
                match activity.idle_since(&client, owed) {
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
        let header = RequestHeaderPeek::parse(&frame)?;
        let origin = shared.ctx.links.classify(header.client_id(&frame), subject);
        // A connection that speaks as a link counts as the link's, for
        // draining and fencing, from its first such request on: before the
        // request is checked against the fence, so a request that passes
        // the check (at the fence layer, or again after it waited) is
        // always one the drain waits for.
        if let (Origin::Link(link), None) = (&origin, &*link_session) {
            let guard = shared.ctx.control.link_session(link.name());
            *link_session = Some((Arc::clone(link), guard));
        }
        let request = Request {
            api: ApiKey::try_from(header.api_key).ok(),
            header,
            origin,
            frame,
        };
        // Matched here rather than `Step::decided`, which would move a ready
        // outcome into a future of its own on every request.
        // A filter's wait (a producer state rebuild, a batch in flight on
        // another request, a new origin persisted: each bounded, together
        // tens of seconds) holds the request's frame; a client that resets
        // meanwhile must not keep it. Dropping the wait is safe: nothing
        // of the request has been written to the broker yet, so it is
        // never forwarded (batches it had begun end as not sent, a rebuild
        // it had claimed passes to the partition's next request).
        let outcome = match stack.call(request) {
            Step::Ready(outcome) => outcome?,
            Step::Wait(decided) => unless_reset(reset, decided).await??,
        };
        // A broker holding an earlier request of this connection takes no
        // more of it: the write may wait as long as that. Pinned here and
        // lent to `unless_reset`, not moved into its future: a copy of the
        // whole write on every request otherwise.
        {
            let flush = std::pin::pin!(stack.flush());
            unless_reset(reset, flush).await??;
        }
        // Written on: its memory must not wait for room in the queue.
        client.release();
        match outcome {
            Outcome::Owed(pending) => {
                if let Err(pending) = try_queue(owed, pending) {
                    queue(owed, pending, reset).await?;
                }
            }
            Outcome::NotOwed => {}
            Outcome::Fenced {
                owed: fenced_owed,
                link,
            } => {
                if let Some(pending) = fenced_owed.and_then(|p| try_queue(owed, p).err()) {
                    queue(owed, pending, reset).await?;
                }
                return Ok(End::Fenced(link));
            }
        }
    }
}

/// The client's next frame. One larger than `share` waits, before any of
/// it is read or charged, until the broker has answered every request
/// this connection sent it: a broker reads nothing more from a connection
/// while it holds one of its requests (a Fetch long poll, a Produce
/// waiting for acks), so the frame could not be written and would hold
/// shared memory for as long as the broker holds the request. Cancel-safe:
/// what was read stays in the reader, and a wait begun again counts from
/// its first start. The reader's own future, not one wrapped around it:
/// the request loop polls it on every wake-up.
fn next_frame<'a, P>(
    client: &'a mut FrameReader<ReadHalf<BoxStream>>,
    owed: &'a Queue<P>,
    share: usize,
    reset: &'a ResetWatch,
) -> impl Future<Output = Result<Option<BytesMut>, FrameError>> + 'a {
    client.read_frame_held(move |size| {
        (size > share && owed.at_broker() > 0).then(|| {
            // Boxed: rare, and its future would size the reader's.
            Box::pin(async move {
                tokio::select! {
                    biased;
                    () = owed.broker_quiet() => Ok(()),
                    () = reset.reset() => Err(FrameError::Io(reset_error())),
                }
            })
        })
    })
}

/// Queue `pending` for the response loop if the queue has room (the usual
/// case), else give it back for [`queue`]. Not async: the usual case makes
/// no future (one would move `pending` into it and out again).
fn try_queue<P: Pending>(owed: &Queue<P>, pending: P) -> Result<(), P> {
    let at_broker = pending.awaits_broker().is_some();
    owed.try_push(pending, at_broker)
}

/// Queue `pending` for the response loop once the queue has room, unless
/// the client resets first.
async fn queue<P: Pending>(
    owed: &Queue<P>,
    pending: P,
    reset: &ResetWatch,
) -> Result<(), SessionError> {
    let at_broker = pending.awaits_broker().is_some();
    // Boxed: rare, and its future would size the request loop's.
    unless_reset(reset, Box::pin(owed.push(pending, at_broker))).await
}

/// `wait`, unless the client resets its connection first. A session that
/// waits on its broker reads nothing from its client and would not see it
/// go; what it holds (a frame's memory, the broker connection and the
/// request the broker holds there) would then wait for no one.
async fn unless_reset<F: Future>(reset: &ResetWatch, wait: F) -> Result<F::Output, SessionError> {
    // Pinned where it is (not moved into a tuple of branches, as
    // `select!` would), and polled first: a wait that is over at once
    // never starts the watch.
    let mut wait = std::pin::pin!(wait);
    let mut watch = std::pin::pin!(reset.reset());
    std::future::poll_fn(|cx| {
        if let Poll::Ready(out) = wait.as_mut().poll(cx) {
            return Poll::Ready(Ok(out));
        }
        match watch.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(SessionError::ClientFrame(FrameError::Io(
                reset_error(),
            )))),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

fn reset_error() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the client reset the connection",
    )
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

async fn responses<P: Pending>(
    shared: &Arc<Shared>,
    mut upstream: FrameReader<ReadHalf<BoxStream>>,
    mut client: WriteTimeout<WriteHalf<BoxStream>>,
    owed: &Queue<P>,
    activity: &Activity,
) -> Result<(), SessionError> {
    loop {
        let pending = tokio::select! {
            // An entry is queued in the same poll of this task that wrote
            // its request's last byte (both loops run in one task), so a
            // response is only ever ready after its entry: check it first.
            biased;
            p = owed.pop() => match p {
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
        let broker = match pending.awaits_broker() {
            None => None,
            Some(correlation_id) => {
                let frame = upstream
                    .read_frame()
                    .await
                    .map_err(SessionError::UpstreamFrame)?
                    .ok_or(SessionError::UpstreamClosed {
                        in_flight: 1 + owed.len(),
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
                owed.broker_answered();
                Some(frame)
            }
        };
        let mut learnt = Learnt::default();
        let out = pending.respond(broker, &mut learnt)?;
        // Listeners for the brokers a response names open before the client
        // hears of them.
        if !learnt.is_empty() {
            shared.learn(learnt)?;
        }
        write_to(&mut client, &out).await?;
        upstream.release();
        activity.answered();
    }
}

async fn write_to<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> Result<(), SessionError> {
    write_frame(w, frame)
        .await
        .map_err(SessionError::ClientWrite)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closing_reason_keeps_its_cause_and_logs_the_text_it_always_did() {
        let e = SessionError::UpstreamWrite(std::io::Error::other("broken pipe"));
        assert_eq!(e.to_string(), "writing to the broker");
        let cause = std::error::Error::source(&e).expect("the I/O error");
        assert!(cause.is::<std::io::Error>());
        // What the log line says, as before the cause became a source.
        assert_eq!(error_chain(&e), "writing to the broker: broken pipe");
        assert_eq!(e.label(), "upstream_write");
    }
}
