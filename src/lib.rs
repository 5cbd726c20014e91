//! kafka-mirror-proxy: a Kafka wire-protocol proxy placed in front of the
//! destination brokers of a cross-cluster mirror.
//!
//! The modules are layers. Each may use only the layers before it in this
//! list, so the code reads bottom up and a request's path top down;
//! `tests/layers.rs` reads `src/` and fails on any `crate::` path that
//! points up or sideways:
//!
//! layers: sync > wire > metrics > mirror > config > net > client > state > control > filter > proxy > admin > replicate > cli > server > benching > fuzzing
//!
//! - `wire`: Kafka bytes, pure (headers, walks, record batches, CRC).
//! - `metrics`: the Prometheus registry and its bounded label types.
//! - `mirror`: the mirror's rules, pure (PID mapping, links, origins, the
//!   Produce plan, producer state, barrier bytes).
//! - `config`: `MIRROR_PROXY_*` parsed and checked once.
//! - `net`: frames on sockets, dialing brokers, TLS, broker health.
//! - `client`: the proxy's own Kafka client.
//! - `state`: the state topic, loaded, tailed and written.
//! - `control`: link states, failover, instance membership.
//! - `filter`: the per-request filters (Produce path, address rewriting).
//! - `proxy`: listeners, the node registry, the session of a connection.
//! - `admin`: the proxy's HTTP API (and the bounded HTTP server the
//!   replicator's endpoint uses too).
//! - `replicate`: the replicator (SPEC §12), a peer of `proxy` that talks
//!   to it over the wire.
//! - `cli`: the operator's commands.
//! - `server`: the proxy as a program, [`run`]: every layer composed from
//!   one [`Config`]; `main.rs` adds signals and logging.
//! - `benching`, `fuzzing`: the benchmarks' workloads and the fuzz
//!   targets' bodies, so `benches/`, `examples/cold_cost.rs` and `fuzz/`
//!   reach the parts they time or feed without their being public (both
//!   hidden from the docs).

pub(crate) mod admin;
#[doc(hidden)]
pub mod benching;
pub mod cli;
pub mod client;
pub mod config;
pub mod control;
pub mod filter;
#[doc(hidden)]
pub mod fuzzing;
pub mod metrics;
pub mod mirror;
pub mod net;
pub(crate) mod proxy;
pub mod replicate;
pub mod server;
pub mod state;
mod sync;
pub use sync::error_chain;
pub mod wire;

pub use config::Config;
pub use server::run;
