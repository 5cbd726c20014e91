//! The crate's own Kafka client (`kafka_mirror_proxy::client`) as the
//! integration tests use it to set up and inspect a broker: a tokio runtime,
//! a plaintext client, topic creation, partitions' end offsets, and the
//! records of a state topic read back.

use std::time::Duration;

use anyhow::{ensure, Result};
use tokio::runtime::Runtime;

use kafka_mirror_proxy::client::protocol::{NewTopic, OffsetSpec};
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::mirror::state_records::StateRecord;
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_mirror_proxy::state::topic::read_batches;

/// A multi-threaded runtime with two workers (the test machines' cores).
pub fn runtime() -> Result<Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// A plaintext client of `bootstrap` (no TLS, no SASL), 10 s per request.
pub fn client(bootstrap: &str) -> Client {
    Client::new(ClientConfig::new(
        vec![bootstrap.to_string()],
        Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(10),
        },
    ))
}

/// A topic of `partitions` partitions, replication factor 1, with `configs`.
pub fn new_topic(name: &str, partitions: i32, configs: &[(&str, &str)]) -> NewTopic {
    NewTopic {
        name: name.into(),
        partitions,
        replication_factor: 1,
        configs: configs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

/// Creates one topic (see [`new_topic`]) through `c`.
pub fn create_topic(
    rt: &Runtime,
    c: &Client,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> Result<()> {
    rt.block_on(c.create_topic(&new_topic(name, partitions, configs)))?;
    Ok(())
}

/// Creates `(name, partitions)` topics on `bootstrap` with a runtime and a
/// client of their own.
pub fn create_topics(bootstrap: &str, topics: &[(&str, i32)]) -> Result<()> {
    let rt = runtime()?;
    let c = client(bootstrap);
    for (name, partitions) in topics {
        create_topic(&rt, &c, name, *partitions, &[])?;
    }
    Ok(())
}

/// The end offset of partitions `0..partitions` of `topic`, in order.
pub fn end_offsets(rt: &Runtime, c: &Client, topic: &str, partitions: i32) -> Result<Vec<i64>> {
    (0..partitions)
        .map(|p| {
            Ok(rt
                .block_on(c.list_offset(topic, p, OffsetSpec::Latest))?
                .offset)
        })
        .collect()
}

/// Every record of partition 0 of the state topic `topic` up to its
/// current end, with its offset; records that do not parse are skipped.
pub async fn state_records(c: &Client, topic: &str) -> Result<Vec<(i64, StateRecord)>> {
    let end = c.list_offset(topic, 0, OffsetSpec::Latest).await?.offset;
    let mut out = Vec::new();
    let mut next = 0;
    while next < end {
        let f = c
            .fetch(topic, 0, next, 1 << 20, Duration::from_millis(100))
            .await?;
        let after = read_batches(&f.records, next, None, |o, r| {
            if let Ok(r) = r {
                out.push((o, r));
            }
        });
        ensure!(
            after > next,
            "no progress reading the state topic at {next}"
        );
        next = after;
    }
    Ok(out)
}
