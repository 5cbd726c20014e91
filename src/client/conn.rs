//! One connection of the proxy's own client to one broker: connect through
//! `net::upstream::Upstream` (TCP, TLS when configured), negotiate API
//! versions, authenticate with SASL when configured, then one request at a
//! time, each bounded by a timeout.
//!
//! A connection that fails in the middle of a request (timeout, I/O error,
//! malformed response) is dropped by its owner: a late answer would
//! otherwise be read as the answer to the next request.

use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{ApiVersionsRequest, SaslAuthenticateRequest, SaslHandshakeRequest};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{ReadHalf, WriteHalf};

use super::error::{error_name, ClientError};
use super::protocol::{self, ApiVersionTable, ApiVersionsAnswer, Rpc};
use super::ClientConfig;
use crate::net::frame::{write_frame, FrameReader};
use crate::net::upstream::BoxStream;
use crate::wire::sasl::{self, Credentials, Mechanism, SaslError, Scram};
use crate::wire::ReadError;

/// An open, negotiated and authenticated broker connection.
pub struct Connection {
    broker: String,
    reader: FrameReader<ReadHalf<BoxStream>>,
    writer: WriteHalf<BoxStream>,
    correlation_id: i32,
    versions: ApiVersionTable,
    /// When the broker ends the SASL session (KIP-368); reconnect before.
    expires_at: Option<Instant>,
    client_id: String,
    request_timeout: Duration,
}

impl Connection {
    /// Connect to `addr` and make the connection ready for requests.
    pub async fn open(config: &ClientConfig, addr: &str) -> Result<Connection, ClientError> {
        let stream = config.upstream.connect(addr).await?;
        let (read, write) = tokio::io::split(stream);
        let mut conn = Connection {
            broker: addr.to_string(),
            reader: FrameReader::new(read, config.max_frame_bytes),
            writer: write,
            correlation_id: 0,
            versions: ApiVersionTable::default(),
            expires_at: None,
            client_id: config.client_id.clone(),
            request_timeout: config.request_timeout,
        };
        conn.negotiate().await?;
        if let Some(credentials) = &config.sasl {
            conn.authenticate(credentials).await?;
        }
        tracing::debug!(broker = %addr, "client connection ready");
        Ok(conn)
    }

    /// The SASL session is over or about to be: open a new connection.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.expires_at.is_some_and(|t| now >= t)
    }

    /// Send one request built for the negotiated version of `R` and return
    /// that version with the (walked, then decoded) response.
    pub async fn call<R: Rpc>(
        &mut self,
        extra_wait: Duration,
        build: impl FnOnce(i16) -> Result<R, ClientError>,
    ) -> Result<(i16, R::Response), ClientError> {
        let version = self.versions.pick::<R>(&self.broker)?;
        let body = build(version)?;
        let (frame, correlation_id) = self.round_trip(&body, version, extra_wait).await?;
        let response =
            protocol::decode_response::<R>(&frame, version, correlation_id, &self.broker)?;
        Ok((version, response))
    }

    async fn round_trip<R: Rpc>(
        &mut self,
        body: &R,
        version: i16,
        extra_wait: Duration,
    ) -> Result<(Bytes, i32), ClientError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let correlation_id = self.correlation_id;
        let request = protocol::encode_request(body, version, correlation_id, &self.client_id)?;
        let timeout = self.request_timeout + extra_wait;
        let broker = self.broker.clone();
        let exchange = async {
            write_frame(&mut self.writer, &request)
                .await
                .map_err(|source| ClientError::Io {
                    broker: broker.clone(),
                    source,
                })?;
            match self.reader.read_frame().await {
                Ok(Some(frame)) => Ok(frame.freeze()),
                Ok(None) => Err(ClientError::Closed {
                    broker: broker.clone(),
                }),
                Err(source) => Err(ClientError::Frame {
                    broker: broker.clone(),
                    source,
                }),
            }
        };
        let frame = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| ClientError::Timeout {
                broker: self.broker.clone(),
                api: R::NAME,
                ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            })??;
        Ok((frame, correlation_id))
    }

    /// ApiVersions at the newest version the client knows, or at the one
    /// the broker names when it does not know that one.
    async fn negotiate(&mut self) -> Result<(), ClientError> {
        let (_, mut version) = protocol::our_versions::<ApiVersionsRequest>()?;
        for _ in 0..2 {
            let body = if version >= 3 {
                ApiVersionsRequest::default()
                    .with_client_software_name(StrBytes::from_static_str("kafka-mirror-proxy"))
                    .with_client_software_version(StrBytes::from_static_str(env!(
                        "CARGO_PKG_VERSION"
                    )))
            } else {
                ApiVersionsRequest::default()
            };
            let (frame, correlation_id) = self.round_trip(&body, version, Duration::ZERO).await?;
            match protocol::api_versions_answer(&frame, version, correlation_id, &self.broker)? {
                ApiVersionsAnswer::Table(table) => {
                    self.versions = table;
                    return Ok(());
                }
                ApiVersionsAnswer::RetryAt(v) => version = v,
            }
        }
        Err(ClientError::Malformed {
            broker: self.broker.clone(),
            api: "ApiVersions",
            version,
            cause: Box::new(ReadError::VersionRefused),
        })
    }

    async fn authenticate(&mut self, c: &Credentials) -> Result<(), ClientError> {
        let broker = self.broker.clone();
        let refused = |message: String| ClientError::Authentication {
            broker: broker.clone(),
            mechanism: c.mechanism.name(),
            message,
        };
        let fail = |cause: SaslError| ClientError::Sasl {
            broker: broker.clone(),
            mechanism: c.mechanism.name(),
            cause,
        };
        let (_, handshake) = self
            .call(Duration::ZERO, |_| {
                Ok(SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_static_str(c.mechanism.name())))
            })
            .await?;
        if handshake.error_code != 0 {
            let enabled: Vec<&str> = handshake.mechanisms.iter().map(|m| m.as_str()).collect();
            return Err(refused(handshake_refused(handshake.error_code, &enabled)));
        }
        let lifetime_ms = match c.mechanism {
            Mechanism::Plain => {
                self.sasl_step(c, sasl::plain_message(&c.username, &c.password))
                    .await?
                    .1
            }
            Mechanism::ScramSha256 | Mechanism::ScramSha512 => {
                let nonce = sasl::random_nonce().map_err(|_| fail(SaslError::NoRandom))?;
                let mut scram = Scram::new(c.mechanism, &c.username, &c.password, &nonce)
                    .ok_or_else(|| fail(SaslError::NotScram))?;
                let (server_first, _) =
                    self.sasl_step(c, scram.client_first().into_bytes()).await?;
                let client_final = scram.client_final(&server_first).map_err(fail)?;
                let (server_final, lifetime) = self.sasl_step(c, client_final.into_bytes()).await?;
                scram.verify_server_final(&server_final).map_err(fail)?;
                lifetime
            }
        };
        if lifetime_ms > 0 {
            // Reconnect when 90% of the session has passed, as Kafka's
            // clients re-authenticate then.
            let ms = u64::try_from(lifetime_ms).unwrap_or(0) / 10 * 9;
            self.expires_at = Some(Instant::now() + Duration::from_millis(ms));
        }
        tracing::debug!(broker = %self.broker, mechanism = %c.mechanism, user = %c.username, "authenticated");
        Ok(())
    }

    /// One SaslAuthenticate round: (server's bytes, session lifetime ms).
    async fn sasl_step(
        &mut self,
        c: &Credentials,
        auth_bytes: Vec<u8>,
    ) -> Result<(Bytes, i64), ClientError> {
        let (_, r) = self
            .call(Duration::ZERO, |_| {
                Ok(SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(auth_bytes)))
            })
            .await?;
        if r.error_code != 0 {
            return Err(ClientError::Authentication {
                broker: self.broker.clone(),
                mechanism: c.mechanism.name(),
                message: format!(
                    "{} ({}){}",
                    error_name(r.error_code),
                    r.error_code,
                    r.error_message
                        .as_ref()
                        .map(|m| format!(": {}", m.as_str()))
                        .unwrap_or_default()
                ),
            });
        }
        Ok((r.auth_bytes, r.session_lifetime_ms))
    }
}

/// Kafka's error code for a SaslHandshake that is not expected here.
const ILLEGAL_SASL_STATE: i16 = 34;

/// Why the broker refused the SaslHandshake, in words an operator can act
/// on. A listener without SASL (PLAINTEXT or SSL) does not fail the
/// handshake as "mechanism not enabled": its request handler answers every
/// SaslHandshake with ILLEGAL_SASL_STATE and no mechanisms at all, which
/// read as "the broker enables []" sends one looking for a mechanism
/// mismatch instead of at the listener the bootstrap servers name.
fn handshake_refused(code: i16, enabled: &[&str]) -> String {
    let refused = format!("{} ({code})", error_name(code));
    if code == ILLEGAL_SASL_STATE && enabled.is_empty() {
        format!(
            "{refused}: this listener does not speak SASL (a PLAINTEXT or SSL listener \
             answers SaslHandshake so); name the cluster's SASL_PLAINTEXT or SASL_SSL \
             listener in the bootstrap servers, or configure no SASL mechanism for it"
        )
    } else {
        format!("{refused}; the broker enables [{}]", enabled.join(", "))
    }
}

/// The write half of a pipelined connection ([`Connection::pipeline`]):
/// requests go out one after another without waiting for answers; the
/// broker answers them in the order they were written.
pub(crate) struct Sender {
    broker: String,
    writer: WriteHalf<BoxStream>,
    correlation_id: i32,
    versions: ApiVersionTable,
    client_id: String,
}

/// A request written by a [`Sender`], for its [`Receiver`] to read the
/// answer of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sent {
    pub version: i16,
    pub correlation_id: i32,
}

/// The read half of a pipelined connection: answers in request order.
pub(crate) struct Receiver {
    broker: String,
    reader: FrameReader<ReadHalf<BoxStream>>,
    request_timeout: Duration,
}

impl Connection {
    /// Split into halves that keep several requests in flight, as Kafka's
    /// producers do (`max.in.flight.requests.per.connection`). The caller
    /// keeps the [`Sent`] tickets in order and bounds how many are out.
    pub(crate) fn pipeline(self) -> (Sender, Receiver) {
        let writer = self.writer;
        let reader = self.reader;
        (
            Sender {
                broker: self.broker.clone(),
                writer,
                correlation_id: self.correlation_id,
                versions: self.versions,
                client_id: self.client_id,
            },
            Receiver {
                broker: self.broker,
                reader,
                request_timeout: self.request_timeout,
            },
        )
    }
}

impl Sender {
    /// The version of `R` this connection speaks.
    pub(crate) fn version<R: Rpc>(&self) -> Result<i16, ClientError> {
        self.versions.pick::<R>(&self.broker)
    }

    /// Write one request built at `version` (from [`Sender::version`]).
    pub(crate) async fn send<R: Rpc>(
        &mut self,
        body: &R,
        version: i16,
    ) -> Result<Sent, ClientError> {
        self.correlation_id = self.correlation_id.wrapping_add(1);
        let correlation_id = self.correlation_id;
        let request = protocol::encode_request(body, version, correlation_id, &self.client_id)?;
        write_frame(&mut self.writer, &request)
            .await
            .map_err(|source| ClientError::Io {
                broker: self.broker.clone(),
                source,
            })?;
        Ok(Sent {
            version,
            correlation_id,
        })
    }
}

impl Receiver {
    /// The answer to `sent`, which must be the oldest request not yet
    /// answered; bounded by the request timeout plus `extra_wait`.
    pub(crate) async fn recv<R: Rpc>(
        &mut self,
        sent: Sent,
        extra_wait: Duration,
    ) -> Result<R::Response, ClientError> {
        let timeout = self.request_timeout + extra_wait;
        let frame = match tokio::time::timeout(timeout, self.reader.read_frame()).await {
            Err(_) => {
                return Err(ClientError::Timeout {
                    broker: self.broker.clone(),
                    api: R::NAME,
                    ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
                })
            }
            Ok(Ok(Some(frame))) => frame.freeze(),
            Ok(Ok(None)) => {
                return Err(ClientError::Closed {
                    broker: self.broker.clone(),
                })
            }
            Ok(Err(source)) => {
                return Err(ClientError::Frame {
                    broker: self.broker.clone(),
                    source,
                })
            }
        };
        protocol::decode_response::<R>(&frame, sent.version, sent.correlation_id, &self.broker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_without_sasl_is_named_as_such() {
        // What a PLAINTEXT listener of Kafka 3.x/4.x answers.
        let r = handshake_refused(ILLEGAL_SASL_STATE, &[]);
        assert!(
            r.starts_with("ILLEGAL_SASL_STATE (34): this listener does not speak SASL"),
            "{r}"
        );
        assert!(!r.contains("enables"), "{r}");
        // A SASL listener without the mechanism lists what it has.
        assert_eq!(
            handshake_refused(33, &["PLAIN", "SCRAM-SHA-256"]),
            "UNSUPPORTED_SASL_MECHANISM (33); the broker enables [PLAIN, SCRAM-SHA-256]"
        );
        // ILLEGAL_SASL_STATE with mechanisms is not the listener's fault.
        assert_eq!(
            handshake_refused(ILLEGAL_SASL_STATE, &["PLAIN"]),
            "ILLEGAL_SASL_STATE (34); the broker enables [PLAIN]"
        );
    }
}
