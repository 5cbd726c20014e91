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

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use tokio::io::{split, AsyncWrite, ReadHalf, WriteHalf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::addresses::{self, RewriteError};
use super::upstream::{BoxStream, ConnectError};
use super::{Shared, StartError, Target};
use crate::mirror::link::{CertSubject, Origin};
use crate::mirror::produce::{self, LocalOutcome, LocalPartition, ProduceError, Refusal};
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
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("no known address for broker node {0} (no Metadata response named it yet)")]
    UnknownNode(i32),
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
            SessionError::Connect(_) | SessionError::UnknownNode(_) => "upstream_unreachable",
            SessionError::ClientFrame(FrameError::TooLarge { .. }) => "frame_too_large",
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
    Produce(Vec<LocalPartition>),
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

/// Serve one accepted client connection until either side closes.
pub async fn serve(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr, target: Target) {
    let active = shared.metrics.connection_opened(target);
    tracing::debug!(%peer, listener = %target.label(), "client connected");
    let reason = match run(&shared, tcp, peer, target).await {
        Ok(()) => {
            tracing::debug!(%peer, "client closed the connection");
            "client_closed"
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
) -> Result<(), SessionError> {
    let (client, subject): (BoxStream, Option<CertSubject>) = match &shared.acceptor {
        None => (Box::new(tcp), None),
        Some(acceptor) => {
            let tls = acceptor
                .accept(tcp)
                .await
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
    let (upstream, broker) = match target {
        Target::Bootstrap => {
            shared
                .upstream
                .connect_any(&shared.config.bootstrap_servers)
                .await?
        }
        Target::Node(node) => {
            let addr = shared
                .node_address(node)
                .ok_or(SessionError::UnknownNode(node))?;
            (shared.upstream.connect(&addr).await?, addr)
        }
    };
    shared.metrics.upstream_connected(target, &broker);
    tracing::debug!(%peer, %broker, "connected upstream");

    let max = shared.config.max_frame_bytes;
    let (client_r, client_w) = split(client);
    let (up_r, up_w) = split(upstream);
    let (tx, rx) = mpsc::channel(MAX_IN_FLIGHT);
    let requests = requests(shared, subject, FrameReader::new(client_r, max), up_w, tx);
    let responses = responses(shared, FrameReader::new(up_r, max), client_w, rx);
    tokio::pin!(requests, responses);
    tokio::select! {
        // The client finished sending: deliver what it is still owed.
        r = &mut requests => match r {
            Ok(()) => responses.await,
            Err(e) => Err(e),
        },
        r = &mut responses => r,
    }
}

async fn requests(
    shared: &Arc<Shared>,
    subject: Option<CertSubject>,
    mut client: FrameReader<ReadHalf<BoxStream>>,
    mut upstream: WriteHalf<BoxStream>,
    tx: mpsc::Sender<Pending>,
) -> Result<(), SessionError> {
    while let Some(frame) = client
        .read_frame()
        .await
        .map_err(SessionError::ClientFrame)?
    {
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
        match api {
            ApiKey::Produce => {
                let action = produce(shared, subject.as_ref(), &h, frame.freeze())?;
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
    Ok(())
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

/// What to queue and what to forward for a Produce request.
struct ProduceAction {
    /// The response the client is owed, unless `acks=0`.
    pending: Option<Pending>,
    /// The frame for the broker, unless the proxy answered every partition.
    forward: Option<BytesMut>,
}

fn produce(
    shared: &Arc<Shared>,
    subject: Option<&CertSubject>,
    h: &RequestHeaderPeek,
    frame: Bytes,
) -> Result<ProduceAction, SessionError> {
    let version = h.api_version;
    let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
    let acks = produce_acks(&frame, body_offset, version)?;
    let expects_response = acks != 0;
    let broker = |local: Vec<LocalPartition>| {
        expects_response.then_some(Pending::Broker {
            correlation_id: h.correlation_id,
            api: ApiKey::Produce,
            version,
            handling: Handling::Produce(local),
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
    let origin = shared.config.links.classify(h.client_id(&frame), subject);
    let link = match origin {
        Origin::Local => {
            if addresses::carries_addresses(ApiKey::Produce, version) {
                check_parseable(ApiKey::Produce, version)?;
            }
            let frame = BytesMut::from(frame); // unique: no copy
            return Ok(ProduceAction {
                pending: broker(Vec::new()),
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
            let plan = produce::refuse_all(
                &frame,
                body_offset,
                version,
                Refusal::NotAuthorized,
                &message,
            )?;
            count_local(shared, link.name(), &plan.local);
            return Ok(ProduceAction {
                pending: local_only(&plan.local)?,
                forward: None,
            });
        }
        Origin::Link(link) => link,
    };
    let plan = produce::plan(&frame, body_offset, version, &link, &|id| {
        shared.topic_name(id)
    })?;
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
            pending: broker(Vec::new()),
            forward: Some(buf),
        });
    }
    let reduced =
        produce::without_local_partitions(&buf.freeze(), body_offset, version, &plan.local)?;
    Ok(ProduceAction {
        pending: broker(plan.local),
        forward: Some(reduced),
    })
}

fn count_local(shared: &Shared, link: &str, local: &[LocalPartition]) {
    for l in local {
        match &l.outcome {
            LocalOutcome::DroppedControl { batches } => shared
                .metrics
                .control_batches_dropped(link, *batches as u64),
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
        let (correlation_id, api, version, handling) = match pending {
            Pending::Local(frame) => {
                write_to(&mut client, &frame).await?;
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
            (Some(_), Handling::Produce(local)) => produce_response(shared, version, frame, local)?,
        };
        write_to(&mut client, &out).await?;
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
    if local.is_empty() {
        return Ok(frame);
    }
    let (correlation_id, mut response) = produce::decode_response(&frame.freeze(), version)?;
    produce::merge_local(&mut response, version, &local);
    Ok(produce::encode_response(
        correlation_id,
        version,
        &response,
    )?)
}
