//! What can go wrong when the proxy talks to the brokers on its own behalf,
//! and which of it is worth retrying.

use kafka_protocol::ResponseError;

use crate::net::frame::FrameError;
use crate::net::upstream::ConnectError;
use crate::wire::sasl::SaslError;
use crate::wire::{CodecError, ReadError};

/// An error of the proxy's own Kafka client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error(transparent)]
    Connect(#[from] ConnectError),
    #[error("broker {broker}: {source}")]
    Io {
        broker: String,
        source: std::io::Error,
    },
    #[error("broker {broker}: {source}")]
    Frame { broker: String, source: FrameError },
    #[error("broker {broker} closed the connection")]
    Closed { broker: String },
    #[error("broker {broker}: no {api} response within {ms} ms")]
    Timeout {
        broker: String,
        api: &'static str,
        ms: u64,
    },
    /// The cause boxed: it would double the size of every client result.
    #[error("broker {broker}: malformed {api} v{version} response")]
    Malformed {
        broker: String,
        api: &'static str,
        version: i16,
        #[source]
        cause: Box<ReadError>,
    },
    #[error("cannot encode {api} v{version} request")]
    Encode {
        api: &'static str,
        version: i16,
        #[source]
        cause: CodecError,
    },
    #[error(
        "broker {broker} supports {api} versions {broker_min}..={broker_max}, \
         the proxy {ours_min}..={ours_max}: no common version"
    )]
    UnsupportedVersion {
        broker: String,
        api: &'static str,
        broker_min: i16,
        broker_max: i16,
        ours_min: i16,
        ours_max: i16,
    },
    /// The broker refused the authentication; `message` is its refusal
    /// as it named it (error name and code, and its message if any).
    #[error("broker {broker}: SASL {mechanism} authentication failed: {message}")]
    Authentication {
        broker: String,
        mechanism: &'static str,
        message: String,
    },
    /// The exchange failed on this side: the broker's SCRAM messages do
    /// not verify or do not parse, or no nonce could be made.
    #[error("broker {broker}: SASL {mechanism} authentication failed")]
    Sasl {
        broker: String,
        mechanism: &'static str,
        #[source]
        cause: SaslError,
    },
    /// An error code from the broker, for the whole request or for the
    /// partition or topic it concerned.
    #[error("{context}: {} ({code}){}", error_name(*.code), .message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Kafka {
        context: String,
        code: i16,
        message: Option<String>,
    },
    #[error("topic {topic} has cleanup.policy={policy:?}; the proxy needs it compacted")]
    NotCompacted { topic: String, policy: String },
    #[error("{op}: gave up after {attempts} attempt(s) in {elapsed_ms} ms; last error")]
    GaveUp {
        op: String,
        attempts: u32,
        elapsed_ms: u64,
        #[source]
        last: Box<ClientError>,
    },
    #[error("no broker known: the bootstrap list is empty")]
    NoBrokers,
}

/// Kafka's name for an error code, e.g. `NOT_LEADER_OR_FOLLOWER`.
pub(crate) fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        Some(ResponseError::Unknown(_)) | None => format!("error {code}"),
        Some(e) => screaming_snake(&format!("{e:?}")),
    }
}

fn screaming_snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// Error codes retried by the client. Kafka's own list (`RetriableException`
/// subclasses, as `kafka-protocol` records them), except `CORRUPT_MESSAGE`:
/// the client sends raw bytes, and the same bytes get the same answer.
pub(crate) fn is_retriable_code(code: i16) -> bool {
    code != 2 && ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

/// Error codes after which the cached leader of a partition is not to be
/// trusted (Kafka's `InvalidMetadataException` subclasses).
pub(crate) fn invalidates_metadata(code: i16) -> bool {
    matches!(
        code,
        3   // UNKNOWN_TOPIC_OR_PARTITION
        | 5   // LEADER_NOT_AVAILABLE
        | 6   // NOT_LEADER_OR_FOLLOWER
        | 9   // REPLICA_NOT_AVAILABLE
        | 41  // NOT_CONTROLLER
        | 56  // KAFKA_STORAGE_ERROR
        | 74  // FENCED_LEADER_EPOCH
        | 75  // UNKNOWN_LEADER_EPOCH
        | 100 // UNKNOWN_TOPIC_ID
        | 103 // INCONSISTENT_TOPIC_ID
    )
}

impl ClientError {
    /// Worth another attempt, after a backoff and (see
    /// [`ClientError::invalidates_metadata`]) a metadata refresh.
    pub(crate) fn is_retriable(&self) -> bool {
        match self {
            ClientError::Connect(_)
            | ClientError::Io { .. }
            | ClientError::Frame { .. }
            | ClientError::Closed { .. }
            | ClientError::Timeout { .. } => true,
            ClientError::Kafka { code, .. } => is_retriable_code(*code),
            _ => false,
        }
    }

    /// The cached metadata (leaders, broker addresses) may be what is wrong.
    pub(crate) fn invalidates_metadata(&self) -> bool {
        match self {
            ClientError::Kafka { code, .. } => invalidates_metadata(*code),
            // A broker that went away may have moved or lost its leaderships.
            ClientError::Connect(_)
            | ClientError::Io { .. }
            | ClientError::Frame { .. }
            | ClientError::Closed { .. }
            | ClientError::Timeout { .. } => true,
            _ => false,
        }
    }

    /// The broker error code this error carries, also when it ended retries.
    pub fn code(&self) -> Option<i16> {
        match self {
            ClientError::Kafka { code, .. } => Some(*code),
            ClientError::GaveUp { last, .. } => last.code(),
            _ => None,
        }
    }

    /// The broker refused this client's SASL authentication (wrong
    /// credentials, a mechanism or listener without SASL), also when it
    /// ended retries. Kafka never retries it (SASL_AUTHENTICATION_FAILED is
    /// not retriable): the same credentials get the same answer, so a
    /// long-running caller stops instead of trying forever.
    pub(crate) fn is_authentication(&self) -> bool {
        match self {
            ClientError::Authentication { .. } | ClientError::Sasl { .. } => true,
            // SASL_AUTHENTICATION_FAILED, should a broker name it elsewhere.
            ClientError::Kafka { code: 58, .. } => true,
            ClientError::GaveUp { last, .. } => last.is_authentication(),
            _ => false,
        }
    }

    /// The connection this error came from cannot be used again.
    pub(crate) fn breaks_connection(&self) -> bool {
        matches!(
            self,
            ClientError::Io { .. }
                | ClientError::Frame { .. }
                | ClientError::Closed { .. }
                | ClientError::Timeout { .. }
                | ClientError::Malformed { .. }
                | ClientError::Authentication { .. }
                | ClientError::Sasl { .. }
                | ClientError::UnsupportedVersion { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_classes_of_error_codes() {
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(87), "INVALID_RECORD");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(30000), "error 30000");
        for retriable in [3, 5, 6, 7, 19, 20] {
            assert!(is_retriable_code(retriable), "{retriable}");
        }
        for fatal in [0, 1, 2, 10, 29, 36, 44, 58, 87, 30000] {
            assert!(!is_retriable_code(fatal), "{fatal}");
        }
        assert!(invalidates_metadata(6) && !invalidates_metadata(7));
    }

    #[test]
    fn kafka_errors_read_well() {
        let e = ClientError::Kafka {
            context: "produce to t-0".into(),
            code: 87,
            message: Some("Clients are not allowed to write control records".into()),
        };
        assert_eq!(
            e.to_string(),
            "produce to t-0: INVALID_RECORD (87): Clients are not allowed to write control records"
        );
        let gave_up = ClientError::GaveUp {
            op: "produce".into(),
            attempts: 3,
            elapsed_ms: 1200,
            last: Box::new(ClientError::Kafka {
                context: "t-0".into(),
                code: 6,
                message: None,
            }),
        };
        assert_eq!(gave_up.code(), Some(6));
        assert!(!gave_up.is_authentication());
        assert!(!gave_up.is_retriable());
        assert_eq!(
            crate::sync::error_chain(&gave_up),
            "produce: gave up after 3 attempt(s) in 1200 ms; last error: t-0: NOT_LEADER_OR_FOLLOWER (6)"
        );
    }

    #[test]
    fn authentication_failures_are_final() {
        let refused = || ClientError::Authentication {
            broker: "b:9092".into(),
            mechanism: "SCRAM-SHA-512",
            message: "SASL_AUTHENTICATION_FAILED (58)".into(),
        };
        assert!(refused().is_authentication() && !refused().is_retriable());
        let gave_up = ClientError::GaveUp {
            op: "metadata".into(),
            attempts: 1,
            elapsed_ms: 0,
            last: Box::new(refused()),
        };
        assert!(gave_up.is_authentication());
        let code_58 = ClientError::Kafka {
            context: "x".into(),
            code: 58,
            message: None,
        };
        assert!(code_58.is_authentication() && !code_58.is_retriable());
    }

    #[test]
    fn a_scram_failure_on_this_side_is_final_and_carries_its_cause() {
        use std::error::Error as _;
        let e = ClientError::Sasl {
            broker: "b:9092".into(),
            mechanism: "SCRAM-SHA-256",
            cause: SaslError::ServerSignature,
        };
        assert!(e.is_authentication() && !e.is_retriable() && e.breaks_connection());
        assert_eq!(
            e.to_string(),
            "broker b:9092: SASL SCRAM-SHA-256 authentication failed"
        );
        assert!(matches!(
            e.source().and_then(|c| c.downcast_ref::<SaslError>()),
            Some(SaslError::ServerSignature)
        ));
        assert!(crate::sync::error_chain(&e).ends_with("the broker does not know this password"));
    }

    #[test]
    fn none_reachable_lists_each_broker_with_its_cause() {
        let e = ClientError::Connect(ConnectError::NoneReachable {
            tried: vec![
                ConnectError::Timeout {
                    addr: "a:1".into(),
                    ms: 5,
                },
                ConnectError::Io {
                    addr: "b:2".into(),
                    source: std::io::Error::other("refused"),
                },
            ],
            all_unreachable: true,
        });
        assert_eq!(
            e.to_string(),
            "no broker reachable (tried connecting to broker a:1: timed out after 5 ms; \
             connecting to broker b:2: refused)"
        );
    }
}
