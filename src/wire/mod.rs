//! The Kafka wire format as far as the proxy needs it: frames, a peek at
//! request headers, record batch headers and their CRC. All pure.

pub mod aborted;
pub mod batch;
pub mod crc32c;
pub mod frame;
pub mod header;
pub mod produce_response_walk;
pub mod produce_walk;
pub mod schema;
pub mod walk;
