//! How long the link path takes to acknowledge what is new to it, beside
//! the same writes straight to the broker in the same run: the first batch
//! of a new partition and producer, that producer's next batch, and a new
//! producer on a known partition, over 20 partitions. Through the proxy
//! binary against a real broker; every batch must be acknowledged. The
//! times are printed (median and max), never asserted:
//! `PROXY_TEST_BIN=target/release/kafka-mirror-proxy scripts/test.sh --test first_ack -- --nocapture`.

mod support;

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{partition_result, record_batch_at, RawClient};

const PARTITIONS: i32 = 20;

/// One batch of `pid` at `sequence` to `topic`-`partition` on `c`, as
/// `client_id`; it must be acknowledged. How long the answer took.
fn timed(
    c: &mut RawClient,
    client_id: &str,
    topic: &str,
    partition: i32,
    pid: i64,
    sequence: i32,
) -> Result<Duration> {
    let started = Instant::now();
    let batch = record_batch_at(pid, sequence, &["v"]);
    let (code, message) = partition_result(&c.produce(client_id, topic, partition, batch)?);
    let took = started.elapsed();
    ensure!(
        code == 0,
        "{topic}-{partition} pid {pid}: error {code} ({message:?})"
    );
    Ok(took)
}

fn summary(times: &mut [Duration]) -> String {
    times.sort();
    format!(
        "median {:.1} ms, max {:.1} ms",
        times[times.len() / 2].as_secs_f64() * 1e3,
        times[times.len() - 1].as_secs_f64() * 1e3
    )
}

#[test]
fn new_partitions_and_producers_are_acknowledged() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", PARTITIONS), ("d", PARTITIONS)])?;
    let source = ClusterId::from_bytes(*b"first-ack-source");
    let p = ProxyProcess::with_link_x(&broker.bootstrap(), &source, "m", &[])?;
    let mut direct = RawClient::connect(&broker.bootstrap())?;
    let mut link = RawClient::connect(&p.bootstrap)?;
    // (what, direct times, link times)
    let mut rows: Vec<(&str, Vec<Duration>, Vec<Duration>)> = vec![
        ("new partition and producer", vec![], vec![]),
        ("the producer's next batch", vec![], vec![]),
        ("new producer, known partition", vec![], vec![]),
    ];
    for partition in 0..PARTITIONS {
        for (row, pid, sequence) in [(0, 10, 0), (1, 10, 1), (2, 11, 0)] {
            rows[row]
                .1
                .push(timed(&mut direct, "direct", "d", partition, pid, sequence)?);
            let took = timed(&mut link, "mirror-x", "m", partition, pid, sequence);
            let took = took.map_err(|e| {
                e.context(format!("proxy log:\n{}", tools::tail_str(&p.logs(), 30)))
            })?;
            rows[row].2.push(took);
        }
    }
    for (what, direct, link) in &mut rows {
        eprintln!(
            "first_ack: {what}: direct {}; link {}",
            summary(direct),
            summary(link)
        );
    }
    Ok(())
}
