//! Shared support for the integration tests: real Apache Kafka brokers
//! (`kafka`), Kafka's own Java command-line tools (`tools`), the proxy binary
//! (`proxy`), test certificates (`certs`), a raw wire client (`wire`), the
//! crate's own client set up for tests (`crate_client`), a TCP relay that
//! breaks connections (`relay`), one that holds a request (`hold_relay`),
//! the replicator (`replicator`), a test topic's records (`records`),
//! hand-written admin requests (`http`), free ports (`ports`) and what a
//! failover leaves in two regions (`failover`).
//!
//! Each test binary compiles this module separately and uses only part of it.
#![allow(dead_code)]

pub mod capture;
pub mod certs;
pub mod crate_client;
pub mod failover;
pub mod hold_relay;
pub mod http;
pub mod kafka;
pub mod ports;
pub mod proxy;
pub mod records;
pub mod relay;
pub mod replicator;
pub mod tools;
pub mod wire;
