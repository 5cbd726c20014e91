//! kafka-mirror-proxy: a Kafka wire-protocol proxy placed in front of the
//! destination brokers of a cross-cluster mirror.
//!
//! Pure modules first (`wire`, `mirror`), I/O last (`proxy`, `client`,
//! `admin`). See the README's architecture section for a request's path
//! through them.

pub mod admin;
pub mod cli;
pub mod client;
pub mod config;
pub mod control;
pub mod metrics;
pub mod mirror;
pub mod proxy;
pub mod state;
pub mod wire;
