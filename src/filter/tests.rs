//! The stack's composition: a filter is one more layer, requests reach the
//! broker connection as the client sent them, and response halves run in
//! order. Exact bytes over an in-memory connection.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;
use tokio::io::AsyncReadExt;
use tower::{Layer, ServiceBuilder};

use super::addresses::Learnt;
use super::api_versions::ApiVersionsLayer;
use super::broker::Broker;
use super::metrics::CountLayer;
use super::*;
use crate::wire::header::RequestHeaderPeek;

/// A trivial filter: counts the requests and responses it sees.
#[derive(Default)]
struct Seen {
    requests: AtomicUsize,
    responses: AtomicUsize,
}

struct SeenLayer<'a>(&'a Seen);

impl<'a, S> Layer<S> for SeenLayer<'a> {
    type Service = SeenService<'a, S>;

    fn layer(&self, inner: S) -> SeenService<'a, S> {
        SeenService {
            seen: self.0,
            inner,
        }
    }
}

struct SeenService<'a, S> {
    seen: &'a Seen,
    inner: S,
}

impl<'a, S: Service> Service for SeenService<'a, S> {
    type Pending = Then<S::Pending, SeenHalf<'a>>;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<Self::Pending>> {
        self.seen.requests.fetch_add(1, Ordering::Relaxed);
        let seen = self.seen;
        pass(&mut self.inner, request, move |p| {
            Then::new(p, SeenHalf(seen))
        })
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

struct SeenHalf<'a>(&'a Seen);

impl ResponseHalf for SeenHalf<'_> {
    fn respond(self, frame: BytesMut, _: &mut Learnt) -> Result<BytesMut, FilterError> {
        self.0.responses.fetch_add(1, Ordering::Relaxed);
        Ok(frame)
    }
}

/// A request frame: header v1 (client id "c") and `body`.
fn frame(api: ApiKey, version: i16, correlation_id: i32, body: &[u8]) -> BytesMut {
    let mut f = BytesMut::new();
    f.extend_from_slice(&(api as i16).to_be_bytes());
    f.extend_from_slice(&version.to_be_bytes());
    f.extend_from_slice(&correlation_id.to_be_bytes());
    f.extend_from_slice(&1i16.to_be_bytes());
    f.extend_from_slice(b"c");
    f.extend_from_slice(body);
    f
}

fn request(frame: BytesMut) -> Request {
    let header = RequestHeaderPeek::parse(&frame).expect("header");
    Request {
        api: ApiKey::try_from(header.api_key).ok(),
        header,
        origin: Origin::Local,
        frame,
    }
}

#[tokio::test]
async fn a_trivial_extra_layer_composes_in() {
    let metrics = crate::metrics::Metrics::new([]);
    let seen = Seen::default();
    let (to_broker, mut broker_side) = tokio::io::duplex(1 << 16);
    let mut stack = ServiceBuilder::new()
        .layer(CountLayer::new(&metrics))
        .layer(SeenLayer(&seen))
        .layer(ApiVersionsLayer)
        .service(Broker::new(to_broker));

    // An opaque request goes to the broker byte for byte, after its size.
    let heartbeat = frame(ApiKey::Heartbeat, 4, 7, &[1, 2, 3, 0]);
    let Outcome::Owed(pending) = stack
        .call(request(heartbeat.clone()))
        .decided()
        .await
        .expect("call")
    else {
        panic!("a heartbeat is owed a response");
    };
    // Written by the flush after the call, not by the call.
    let mut byte = [0u8; 1];
    assert!(
        futures_util::FutureExt::now_or_never(broker_side.read(&mut byte)).is_none(),
        "nothing reaches the broker before the flush"
    );
    stack.flush().await.expect("written");
    assert_eq!(pending.awaits_broker(), Some(7));
    let mut written = vec![0u8; 4 + heartbeat.len()];
    broker_side.read_exact(&mut written).await.expect("written");
    assert_eq!(&written[..4], &(heartbeat.len() as i32).to_be_bytes());
    assert_eq!(&written[4..], &heartbeat[..]);
    // Its response passes every response half, unchanged.
    let response = BytesMut::from(&[0, 0, 0, 7, 0, 0][..]);
    let mut learnt = Learnt::default();
    let out = pending
        .respond(Some(response.clone()), &mut learnt)
        .expect("respond");
    assert_eq!(out, response);
    assert!(learnt.is_empty());

    // An ApiVersions newer than the proxy parses is answered inside the
    // stack: the broker sees nothing, the outer layers see it all the same.
    let newer = addresses::api_versions_max() + 1;
    let Outcome::Owed(pending) = stack
        .call(request(frame(ApiKey::ApiVersions, newer, 8, &[])))
        .decided()
        .await
        .expect("call")
    else {
        panic!("ApiVersions is owed a response");
    };
    assert_eq!(pending.awaits_broker(), None);
    stack.flush().await.expect("nothing to write");
    let out = pending.respond(None, &mut learnt).expect("respond");
    assert_eq!(&out[..4], &8i32.to_be_bytes(), "correlation id");
    // UNSUPPORTED_VERSION (35) in the v0 layout.
    assert_eq!(&out[4..6], &35i16.to_be_bytes());
    assert_eq!(seen.requests.load(Ordering::Relaxed), 2);
    assert_eq!(seen.responses.load(Ordering::Relaxed), 2);
    drop(stack);
    let mut rest = Vec::new();
    broker_side.read_to_end(&mut rest).await.expect("closed");
    assert!(rest.is_empty(), "nothing more reached the broker: {rest:?}");
    let rendered = metrics.render();
    assert!(
        rendered.contains("api_key=\"12\"} 1") && rendered.contains("api_key=\"18\"} 1"),
        "both requests counted:\n{rendered}"
    );
}

#[tokio::test]
async fn a_pending_response_without_its_broker_frame_is_an_error() {
    let (to_broker, _broker_side) = tokio::io::duplex(1 << 16);
    let mut broker = Broker::new(to_broker);
    let Outcome::Owed(pending) = broker
        .call(request(frame(ApiKey::Heartbeat, 4, 9, &[0])))
        .decided()
        .await
        .expect("call")
    else {
        panic!("owed");
    };
    let e = pending.respond(None, &mut Learnt::default());
    assert!(matches!(e, Err(FilterError::MissingResponse)), "{e:?}");
}

/// A panic while the table was held does not make known topics unknown
/// (which would refuse every link Produce naming them by id).
#[test]
fn a_poisoned_topic_table_still_knows_its_topics() {
    let table = std::sync::Arc::new(TopicTable::default());
    let id = uuid::Uuid::from_u128(7);
    table.learn(vec![(id, "orders".to_string())]);
    let poisoner = std::sync::Arc::clone(&table);
    let _ = std::thread::spawn(move || {
        let _ids = poisoner.ids.write();
        let _names = poisoner.names.write();
        panic!("poison the table");
    })
    .join();
    assert!(table.ids.is_poisoned() && table.names.is_poisoned());
    assert_eq!(table.id("orders"), Some(id));
    assert_eq!(table.name(id).as_deref(), Some("orders"));
    let other = uuid::Uuid::from_u128(8);
    table.learn(vec![(other, "payments".to_string())]);
    assert_eq!(table.id("payments"), Some(other));
}
