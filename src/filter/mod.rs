//! The per-request path of a connection as a stack of filters, each one
//! concern, composed statically with `tower::Layer` (outermost first):
//!
//! ```text
//! metrics -> fence -> produce -> api_versions -> addresses -> broker
//! ```
//!
//! A `Service` takes a `Request` (its header peeked and its client
//! classified once, by the session) and either answers it itself or passes
//! it on; the innermost service, `broker::Broker`, keeps it for the
//! session to write to the pipelined broker connection
//! (`Service::flush`). What it returns is the request's `Pending`
//! response: the session queues it in request order and, when its turn
//! comes, hands it the broker's response frame (if it awaits one); each
//! layer's response half then runs, innermost first, and yields the frame
//! for the client. Frames stay raw bytes unless a filter must read or
//! change them.
//!
//! Why not `tower::Service` itself: its `Future` must be a nameable type,
//! which for the Produce filter's waits (resolves, rebuilds) means a boxed
//! future per request and layer, and a chain of futures each layer wraps
//! and moves. Here a call decides synchronously where it can and boxes a
//! future only where it must wait (`Step`), so the common path is plain
//! function calls, statically dispatched, allocating nothing;
//! `tower::Layer` and `ServiceBuilder` compose it all the same. A filter
//! without a response half returns its inner service's pending response
//! as it is; one with a half adds one field (`Then`). A response half is
//! a plain function of the broker's frame, so no future, channel or task
//! wake-up is spent per response either.
//!
//! A filter sees a `Context`: what a request may read or change of the
//! process, and nothing of its listeners or connections. What a response
//! teaches the proxy (brokers, topic ids) is collected in a
//! [`addresses::Learnt`] for the session, so opening a listener for a new
//! broker stays the proxy's job.

pub mod addresses;
pub(crate) mod api_versions;
pub(crate) mod broker;
pub(crate) mod fence;
pub(crate) mod guard;
pub(crate) mod metrics;
pub(crate) mod produce;
pub(crate) mod rebuild;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::FutureExt;
use kafka_protocol::messages::ApiKey;
use tokio::io::AsyncWrite;
use tokio::sync::watch;
use tower::ServiceBuilder;
use uuid::Uuid;

use crate::control::Control;
use crate::metrics::Metrics;
use crate::mirror::dedupe::Dedupe;
use crate::mirror::link::{CertSubject, Links, Origin};
use crate::mirror::produce::ProduceError;
use crate::state::StateStore;
use crate::wire::header::{HeaderError, RequestHeaderPeek};
use addresses::{Advertised, Learnt, RewriteError, UnsupportedVersion};

/// One client request on its way through the filters.
pub(crate) struct Request {
    /// The header, peeked once.
    pub header: RequestHeaderPeek,
    /// `None` for an API key this proxy does not know: passed on untouched.
    pub api: Option<ApiKey>,
    /// Whose request it is (local, a mirror link's, or a spoofed link's),
    /// classified once from the client id and the TLS subject.
    pub origin: Origin,
    /// The whole frame, without its size prefix.
    pub frame: BytesMut,
}

/// What became of a request.
pub(crate) enum Outcome<P> {
    /// The client is owed a response: `P` produces it.
    Owed(P),
    /// Nothing is owed (Produce with `acks=0`).
    NotOwed,
    /// The request's link is fenced: answer what is owed, then close the
    /// connection.
    Fenced { owed: Option<P>, link: String },
}

impl<P> Outcome<P> {
    /// The same outcome with nothing owed (the client expects no answer).
    #[inline]
    pub(crate) fn discard<Q>(self) -> Outcome<Q> {
        match self {
            Outcome::Owed(_) | Outcome::NotOwed => Outcome::NotOwed,
            Outcome::Fenced { link, .. } => Outcome::Fenced { owed: None, link },
        }
    }

    /// The same outcome with the pending response mapped by `f`.
    #[inline]
    pub(crate) fn map<Q>(self, f: impl FnOnce(P) -> Q) -> Outcome<Q> {
        match self {
            Outcome::Owed(p) => Outcome::Owed(f(p)),
            Outcome::NotOwed => Outcome::NotOwed,
            Outcome::Fenced { owed, link } => Outcome::Fenced {
                owed: owed.map(f),
                link,
            },
        }
    }
}

/// One stage of the stack: takes a request, passes it on or answers it.
///
/// `call` decides at once where it can and returns a [`Step`]; a filter
/// that must wait (a link Produce resolving origins, an admin request
/// naming the state topic) returns a boxed future, so the common path
/// builds no future and moves none from layer to layer. The innermost
/// service keeps the frame it was handed; [`flush`](Self::flush) writes it
/// to the broker. The session calls them for one request at a time, in the
/// order they came, so requests reach the broker in that order.
pub(crate) trait Service: Send {
    type Pending: Pending;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<Self::Pending>>;

    /// Writes to the broker what the last `call` forwarded, if anything.
    /// A layer passes this on to its inner service.
    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_;
}

/// What a filter's `call` gives back: its outcome, decided now, or a future
/// that decides it after waiting.
pub(crate) enum Step<'s, T> {
    Ready(Result<T, FilterError>),
    Wait(Pin<Box<dyn Future<Output = Result<T, FilterError>> + Send + 's>>),
}

impl<'s, T: 's> Step<'s, T> {
    /// The step's outcome mapped by `f` (a waiting step is boxed anew: only
    /// waits pay for it).
    #[inline]
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U + Send + 's) -> Step<'s, U> {
        match self {
            Step::Ready(r) => Step::Ready(r.map(f)),
            Step::Wait(w) => Step::Wait(Box::pin(w.map(|r| r.map(f)))),
        }
    }

    /// The outcome, once decided.
    pub(crate) async fn decided(self) -> Result<T, FilterError> {
        match self {
            Step::Ready(r) => r,
            Step::Wait(w) => w.await,
        }
    }
}

/// `inner`'s step for `request`, its pending response wrapped by `wrap`:
/// how a filter with a response half passes a request on.
#[inline]
fn pass<'s, S: Service, Q: 's>(
    inner: &'s mut S,
    request: Request,
    wrap: impl FnOnce(S::Pending) -> Q + Send + 's,
) -> Step<'s, Outcome<Q>> {
    inner.call(request).map(|outcome| outcome.map(wrap))
}

/// A response the client is owed, queued in request order.
pub(crate) trait Pending: Send + Sized {
    /// A response the proxy made itself: no response half runs on it.
    fn local(frame: BytesMut) -> Self;

    /// The correlation id of the broker response this waits for; `None`
    /// when the proxy answered the request itself.
    fn awaits_broker(&self) -> Option<i32>;

    /// The frame for the client, from the broker's response frame when
    /// [`awaits_broker`](Self::awaits_broker) said so. What the response
    /// named (brokers, topic ids) is added to `learnt`.
    fn respond(
        self,
        broker: Option<BytesMut>,
        learnt: &mut Learnt,
    ) -> Result<BytesMut, FilterError>;
}

/// The pending response of a filter with a response half: the inner
/// service's, then `half` on it (none on a response made above the inner
/// service, or one the filter leaves alone).
pub(crate) struct Then<P, H> {
    inner: P,
    half: Option<H>,
}

impl<P, H> Then<P, H> {
    /// `inner`'s response, then `half` on it.
    #[inline]
    pub(crate) fn new(inner: P, half: H) -> Then<P, H> {
        Then {
            inner,
            half: Some(half),
        }
    }

    /// `inner`'s response, as it comes.
    #[inline]
    pub(crate) fn inner(inner: P) -> Then<P, H> {
        Then { inner, half: None }
    }
}

/// A filter's response half: runs on the inner service's response.
pub(crate) trait ResponseHalf: Send {
    fn respond(self, frame: BytesMut, learnt: &mut Learnt) -> Result<BytesMut, FilterError>;
}

impl<P: Pending, H: ResponseHalf> Pending for Then<P, H> {
    fn local(frame: BytesMut) -> Self {
        Then::inner(P::local(frame))
    }

    fn awaits_broker(&self) -> Option<i32> {
        self.inner.awaits_broker()
    }

    #[inline]
    fn respond(
        self,
        broker: Option<BytesMut>,
        learnt: &mut Learnt,
    ) -> Result<BytesMut, FilterError> {
        let frame = self.inner.respond(broker, learnt)?;
        match self.half {
            Some(half) => half.respond(frame, learnt),
            None => Ok(frame),
        }
    }
}

/// Why a request or its response could not be handled: the session closes
/// the connection.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FilterError {
    #[error("malformed request header")]
    Header(#[from] HeaderError),
    #[error(transparent)]
    Produce(#[from] ProduceError),
    #[error(transparent)]
    Rewrite(#[from] RewriteError),
    #[error(transparent)]
    Guard(#[from] guard::GuardError),
    #[error(transparent)]
    UnsupportedVersion(#[from] UnsupportedVersion),
    #[error("writing to the broker")]
    UpstreamWrite(#[source] std::io::Error),
    #[error("no broker response was read for a request that awaits one")]
    MissingResponse,
}

/// The filter stack of one connection (whose client presented `subject`),
/// over the write half of its broker connection.
pub(crate) fn stack<'a, W>(
    ctx: &'a Context,
    subject: Option<&'a CertSubject>,
    upstream: W,
) -> impl Service + 'a
where
    W: AsyncWrite + Unpin + Send + 'a,
{
    ServiceBuilder::new()
        .layer(metrics::CountLayer::new(&ctx.metrics))
        .layer(fence::FenceLayer::new(ctx))
        .layer(guard::GuardLayer::new(ctx))
        .layer(produce::ProduceLayer::new(ctx, subject))
        .layer(api_versions::ApiVersionsLayer)
        .layer(addresses::AddressesLayer::new(&ctx.advertised))
        .service(broker::Broker::new(upstream))
}

/// What the filters of every connection share.
pub(crate) struct Context {
    pub links: Links,
    pub metrics: Arc<Metrics>,
    /// Link states, fencing and failovers.
    pub control: Arc<Control>,
    /// Mirrored producer state (SPEC §6), for link Produce requests.
    pub dedupe: Arc<Dedupe>,
    /// The state topic; `None` without mirror links.
    pub state: Option<Arc<StateStore>>,
    /// The proxy's address for each broker.
    pub advertised: Advertised,
    pub topics: TopicTable,
    /// Becomes `true` when the proxy begins to shut down.
    pub shutdown: watch::Receiver<bool>,
}

impl Context {
    /// Resolves once shutdown has begun (at once if it already has).
    pub(crate) async fn shutting_down(&self) {
        let mut rx = self.shutdown.clone();
        if rx.wait_for(|stop| *stop).await.is_err() {
            // The sender lives as long as the proxy: not reached.
            std::future::pending::<()>().await;
        }
    }
}

/// Topic ids and names seen in Metadata responses, both ways. Names are
/// shared: looked up for every link Produce v13, where a copy would be an
/// allocation per request.
#[derive(Default)]
pub(crate) struct TopicTable {
    names: RwLock<foldhash::HashMap<Uuid, Arc<str>>>,
    ids: RwLock<foldhash::HashMap<String, Uuid>>,
    /// When the broker was last asked for every topic's id.
    asked: Mutex<Option<Instant>>,
}

/// How often at most the broker is asked for every topic's id, however
/// many requests name ids the proxy does not know.
const ASK_INTERVAL: Duration = Duration::from_secs(1);

impl TopicTable {
    /// The id of a topic named in a Metadata response (no allocation).
    pub(crate) fn id(&self, name: &str) -> Option<Uuid> {
        crate::sync::read(&self.ids).get(name).copied()
    }

    /// The name of a topic id seen in a Metadata response.
    pub(crate) fn name(&self, id: Uuid) -> Option<Arc<str>> {
        crate::sync::read(&self.names).get(&id).cloned()
    }

    /// Whether the broker may be asked for every topic's id now (at most
    /// once per [`ASK_INTERVAL`]); if so, the asking is counted as done.
    pub(crate) fn may_ask(&self, now: Instant) -> bool {
        let mut asked = crate::sync::lock(&self.asked);
        match *asked {
            Some(at) if now.saturating_duration_since(at) < ASK_INTERVAL => false,
            _ => {
                *asked = Some(now);
                true
            }
        }
    }

    /// Remember `topics` (id, name).
    pub(crate) fn learn(&self, topics: Vec<(Uuid, String)>) {
        if topics.is_empty() {
            return;
        }
        crate::sync::write(&self.ids).extend(topics.iter().map(|(id, name)| (name.clone(), *id)));
        crate::sync::write(&self.names)
            .extend(topics.into_iter().map(|(id, name)| (id, Arc::from(name))));
    }
}

#[cfg(test)]
mod tests;
