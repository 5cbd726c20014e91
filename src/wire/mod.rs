//! The Kafka wire format as far as the proxy needs it, as pure functions
//! over byte slices: one cursor that every reader reads through (with
//! Kafka's varints), a peek at request headers, schema walks of whole
//! messages and hand walks of Produce, record batch headers with their CRC
//! and its constant-time patch, one iterator over the records inside a
//! batch, the aborted transaction filter, and the SASL messages of the
//! proxy's own client.
//! No I/O: the frames these bytes arrive in are read by `net::frame`.

pub mod aborted;
pub mod batch;
pub mod compression;
pub mod crc32c;
pub mod cursor;
pub mod header;
pub mod produce_response_walk;
pub mod produce_walk;
pub mod records;
pub mod sasl;
pub mod schema;
pub mod walk;
pub mod write;
