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
pub mod produce_response_walk;
pub mod produce_walk;
pub(crate) mod records;
pub mod sasl;
pub mod schema;
pub mod walk;
pub(crate) mod write;
