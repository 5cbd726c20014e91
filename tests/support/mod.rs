//! Shared support for the integration tests: real Apache Kafka brokers
//! (`kafka`), Kafka's own Java command-line tools (`tools`), the proxy binary
//! (`proxy`), test certificates (`certs`) and a raw wire client (`wire`).
//!
//! Each test binary compiles this module separately and uses only part of it.
#![allow(dead_code)]

pub mod capture;
pub mod certs;
pub mod kafka;
pub mod proxy;
pub mod tools;
pub mod wire;
