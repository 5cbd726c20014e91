//! How long the link path takes to acknowledge what is new to it: a new
//! partition with a new producer, the same producer's next batch, a new
//! producer on a known partition. Through the proxy binary against a real
//! broker; every batch must be acknowledged. The times are printed, never
//! asserted (`scripts/test.sh --test first_ack -- --nocapture`).

mod support;

use std::time::Instant;

use anyhow::{ensure, Result};

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{partition_result, record_batch_at, RawClient};

#[test]
fn new_partitions_and_producers_are_acknowledged() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 3)])?;
    let source = ClusterId::from_bytes(*b"first-ack-source").to_string();
    let p = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
            ("LINK_X_TOPICS", "m"),
        ],
    )?;
    let mut raw = RawClient::connect(&p.bootstrap)?;
    let mut send = |what: &str, partition: i32, pid: i64, sequence: i32| -> Result<()> {
        let started = Instant::now();
        let batch = record_batch_at(pid, sequence, &["v"]);
        let (code, message) = partition_result(&raw.produce("mirror-x", "m", partition, batch)?);
        eprintln!(
            "first_ack: {what}, m-{partition} pid {pid}: {} ms",
            started.elapsed().as_millis()
        );
        ensure!(
            code == 0,
            "m-{partition} pid {pid}: error {code} ({message:?}); proxy log:\n{}",
            tools::tail_str(&p.logs(), 30)
        );
        Ok(())
    };
    for partition in 0..3 {
        send("new partition, new producer", partition, 10, 0)?;
        send("next batch", partition, 10, 1)?;
        send("new producer, known partition", partition, 11, 0)?;
    }
    Ok(())
}
