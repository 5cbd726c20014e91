//! Source transactions mirrored faithfully (issue 9): a source partition
//! holding a committed, an aborted and another committed transaction with an
//! idempotent, non-transactional producer writing in between is copied by the
//! replicator (read_committed, its default) through the proxy; a
//! read_committed consumer of the destination then sees exactly the committed
//! and the non-transactional records, in source order.
//!
//! It also records what a stock broker does with what arrives: transactional
//! batches under a mapped (negative) producer id and no transaction markers.
//! The destination's last stable offset stays at the high watermark (the
//! broker keeps no transaction state for a producer id below 0), so nothing
//! waits for markers that never come.

mod support;

use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use kafka_mirror_proxy::client::protocol::{IsolationLevel, OffsetSpec};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use support::crate_client::{client, create_topic, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;

/// SPEC §4's example id (hash 0x71720375).
const ID_A: &str = "MkU3OEVBNTcwNTJENDM2Qk";
const ID_B: &str = "q1Zx7Kd8Tj2m4Wf0hYvRsA";
const TOPIC: &str = "tx";
const WAIT: Duration = Duration::from_secs(60);

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseProducer> {
    let mut config = RdConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .set("enable.idempotence", "true");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    Ok(config.create()?)
}

/// Sends `keys` (value `value of <key>`) to partition 0 and waits until
/// they are written.
fn send(p: &BaseProducer, keys: &[&str]) -> Result<()> {
    for key in keys {
        let value = format!("value of {key}");
        p.send(BaseRecord::to(TOPIC).partition(0).key(*key).payload(&value))
            .map_err(|(e, _)| anyhow!("queueing {key}: {e}"))?;
    }
    p.flush(WAIT)?;
    Ok(())
}

/// `key<TAB>value` lines of a read_committed console consumer; asks for one
/// record more than expected so that an extra record would show.
fn read_committed(bootstrap: &str, expected: usize) -> Result<Vec<String>> {
    tools::console_consume(
        bootstrap,
        TOPIC,
        expected + 1,
        &[("isolation.level", "read_committed"), ("print.key", "true")],
        Duration::from_secs(10),
    )
}

#[test]
fn a_read_committed_consumer_of_the_destination_sees_exactly_the_committed_records() -> Result<()> {
    let a = KafkaCluster::start(KafkaOptions::default().cluster_id(ID_A))?;
    let b = KafkaCluster::start(KafkaOptions::default().cluster_id(ID_B))?;
    let rt = runtime()?;
    let (source, destination) = (client(&a.bootstrap()), client(&b.bootstrap()));
    create_topic(&rt, &source, TOPIC, 1, &[])?;
    create_topic(&rt, &destination, TOPIC, 1, &[])?;
    let pb = ProxyProcess::start(
        &b.bootstrap(),
        &[
            ("LINKS", "a"),
            ("LINK_A_SOURCE_CLUSTER_ID", ID_A),
            ("LINK_A_TOPICS", TOPIC),
        ],
    )?;

    // The source: transactions with an idempotent producer in between.
    let idempotent = producer(&a.bootstrap(), &[])?;
    let txn = producer(&a.bootstrap(), &[("transactional.id", "source-txn")])?;
    txn.init_transactions(WAIT)?;
    send(&idempotent, &["idem-0", "idem-1"])?;
    txn.begin_transaction()?;
    send(&txn, &["commit1-0", "commit1-1", "commit1-2"])?;
    send(&idempotent, &["idem-2", "idem-3"])?;
    send(&txn, &["commit1-3"])?;
    txn.commit_transaction(WAIT)?;
    txn.begin_transaction()?;
    send(&txn, &["abort-0", "abort-1", "abort-2"])?;
    send(&idempotent, &["idem-4"])?;
    send(&txn, &["abort-3"])?;
    txn.abort_transaction(WAIT)?;
    txn.begin_transaction()?;
    send(&txn, &["commit2-0", "commit2-1"])?;
    send(&idempotent, &["idem-5"])?;
    txn.commit_transaction(WAIT)?;
    send(&idempotent, &["idem-6"])?;
    drop((idempotent, txn));
    let expected: Vec<String> = [
        "idem-0",
        "idem-1",
        "commit1-0",
        "commit1-1",
        "commit1-2",
        "idem-2",
        "idem-3",
        "commit1-3",
        "idem-4",
        "commit2-0",
        "commit2-1",
        "idem-5",
        "idem-6",
    ]
    .iter()
    .map(|k| format!("{k}\tvalue of {k}"))
    .collect();
    // Kafka's own consumer agrees on the source.
    assert_eq!(
        read_committed(&a.bootstrap(), expected.len())?,
        expected,
        "read_committed on the source"
    );

    // Copy through the proxy, read_committed (the replicator's default).
    let config = support::replicator::config(&a.bootstrap(), &pb.bootstrap, TOPIC, "mirror-a");
    assert_eq!(
        config.isolation,
        kafka_mirror_proxy::config::replicator::Isolation::ReadCommitted
    );
    let report = support::replicator::run(&rt, config).with_context(|| {
        format!(
            "replicating; proxy log:\n{}",
            tools::tail_str(&pb.logs(), 30)
        )
    })?;
    eprintln!("{report}");
    assert_eq!(
        report.total_control_skipped, 3,
        "two COMMIT and one ABORT marker"
    );
    assert!(
        report.total_aborted_skipped >= 2,
        "the aborted transaction's batches (at least two sends) were dropped: {report}"
    );
    assert_eq!(report.total_records, expected.len() as u64);

    // A read_committed consumer of the destination: exactly the committed
    // and non-transactional records, in source order.
    assert_eq!(
        read_committed(&b.bootstrap(), expected.len())?,
        expected,
        "read_committed on the destination"
    );

    // What the destination broker made of it: transactional batches under
    // mapped (negative) producer ids, no markers, and no open transaction:
    // the last stable offset is the high watermark.
    let segments = b.segment_files(TOPIC, 0)?;
    let mut batches = Vec::new();
    for s in &segments {
        batches.extend(tools::dump_log_segments(s, false)?);
    }
    for batch in &batches {
        eprintln!(
            "destination batch: offsets {}..={} producerId {} transactional {} control {} valid {}",
            batch.base_offset,
            batch.last_offset,
            batch.producer_id,
            batch.is_transactional,
            batch.is_control,
            batch.is_valid
        );
    }
    ensure!(
        batches.iter().all(|b| !b.is_control && b.is_valid),
        "no control batch, every CRC valid"
    );
    ensure!(
        batches
            .iter()
            .any(|b| b.is_transactional && b.producer_id < -1),
        "committed transactional batches arrive with the transactional bit and a mapped id"
    );
    let fetched = rt.block_on(destination.fetch_isolated(
        TOPIC,
        0,
        0,
        1024 * 1024,
        Duration::from_millis(100),
        IsolationLevel::ReadCommitted,
    ))?;
    let end = rt
        .block_on(destination.list_offset(TOPIC, 0, OffsetSpec::Latest))?
        .offset;
    eprintln!(
        "destination: high watermark {} last stable offset {} log end {end} aborted transactions {:?}",
        fetched.high_watermark, fetched.last_stable_offset, fetched.aborted_transactions
    );
    assert_eq!(
        fetched.last_stable_offset, fetched.high_watermark,
        "no open transaction holds the destination's last stable offset back"
    );
    assert_eq!(fetched.high_watermark, expected.len() as i64);
    assert!(fetched.aborted_transactions.is_empty());
    Ok(())
}
