//! Bytes in and out of sockets: Kafka frames read under a shared memory
//! budget and written (`frame`), connections to the brokers over TCP or TLS
//! (`upstream`), TLS on both sides (`tls`), and whether a broker is
//! reachable (`health`),
//! the backoff of every retry loop (`backoff`), the background tasks,
//! owned and joined at shutdown (`tasks`), and the bound on writes that
//! make no progress (`write_timeout`); a client's socket shared with the
//! watch for its reset (`client_socket`).

pub(crate) mod backoff;
pub(crate) mod client_socket;
pub mod frame;
pub(crate) mod health;
pub(crate) mod tasks;
pub(crate) mod tls;
pub mod upstream;
pub(crate) mod write_timeout;
