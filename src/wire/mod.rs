//! The Kafka wire format as far as the proxy needs it, as pure functions
//! over byte slices: one cursor that every reader reads through (with
//! Kafka's varints), a peek at request headers, schema walks of whole
//! messages and hand walks of Produce, record batch headers with their CRC
//! and its constant-time patch, one iterator over the records inside a
//! batch, the aborted transaction filter, and the SASL messages of the
//! proxy's own client.
//! No I/O: the frames these bytes arrive in are read by `net::frame`.

pub(crate) mod aborted;
pub mod batch;
pub(crate) mod compression;
pub mod crc32c;
pub(crate) mod cursor;
pub mod header;
pub(crate) mod produce_response_walk;
pub(crate) mod produce_walk;
pub(crate) mod records;
pub mod sasl;
pub mod schema;
pub mod walk;
pub(crate) mod write;

/// kafka-protocol's encode and decode errors, as a cause this crate's
/// errors carry: kafka-protocol returns `anyhow::Error`, which is not a
/// `std::error::Error` itself but converts into this with its chain.
pub(crate) type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// Why the bytes of a message could not be read: its schema, the bounded
/// walk over it, or kafka-protocol's decoder refused them.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Boxed: only a broken build has one, and it would make every
    /// result carrying this error larger.
    #[error(transparent)]
    Schema(Box<schema::SchemaError>),
    #[error(transparent)]
    Walk(#[from] walk::WalkError),
    #[error(transparent)]
    Decode(CodecError),
    #[error("truncated response header")]
    TruncatedHeader,
    #[error("shorter than a response header")]
    NoHeader,
    #[error("correlation id {got}, expected {expected}")]
    CorrelationId { got: i32, expected: i32 },
    #[error("broker refused the version it named")]
    VersionRefused,
    #[error("UNSUPPORTED_VERSION without a usable ApiVersions range")]
    NoVersionRange,
    #[error("topic name is not UTF-8")]
    TopicNotUtf8,
}

impl From<schema::SchemaError> for ReadError {
    fn from(e: schema::SchemaError) -> Self {
        ReadError::Schema(Box::new(e))
    }
}

impl ReadError {
    /// kafka-protocol's decode error, with its chain.
    pub(crate) fn decode(e: anyhow::Error) -> Self {
        ReadError::Decode(e.into())
    }
}
