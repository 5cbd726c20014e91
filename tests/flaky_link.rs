//! The replicator under a flaky proxy → broker connection (issue 9): the
//! replicator copies 50,000 records of an idempotent source (two
//! partitions, librdkafka with `enable.idempotence`) through the proxy
//! while a TCP relay between the proxy and the destination broker kills a
//! connection after every 10th request it delivers, before the answer
//! comes back: a fault a real broker cannot be made to show on demand (the
//! broker appended the batch, the proxy never hears so). The destination
//! must hold each source record exactly once, in source order per
//! partition, read back from its log with Kafka's DumpLogSegments.
//!
//! The destination broker advertises the relay's address, so every
//! connection the proxy makes to it (sessions and the proxy's own client:
//! state topic, producer-state rebuilds) goes through the relay.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use anyhow::{anyhow, ensure, Context, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use support::crate_client::{client, create_topic, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{link_env, start_with};
use support::relay::Relay;
use support::tools::{self, DumpedBatch};

const TOPIC: &str = "flaky";
const PARTITIONS: i32 = 2;
const RECORDS: usize = 50_000;
/// The relay kills the connection of every 10th request it delivers.
const CUT_EVERY: u64 = 10;

fn value(partition: i32, i: usize) -> String {
    format!("p{partition}-{i}")
}

/// The record values of `topic`-`partition` on `broker`, in log order.
fn log_values(broker: &KafkaCluster, partition: i32) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for file in broker.segment_files(TOPIC, partition)? {
        let batches: Vec<DumpedBatch> = tools::dump_log_segments(&file, true)?;
        for b in batches {
            ensure!(b.is_valid, "batch at {} has a bad CRC", b.base_offset);
            ensure!(!b.is_control, "a control batch at {}", b.base_offset);
            for r in b.records {
                out.push(r.payload.unwrap_or_default());
            }
        }
    }
    Ok(out)
}

#[test]
fn the_replicator_under_a_flaky_connection_copies_each_record_exactly_once() -> Result<()> {
    let rt = runtime()?;
    let relay = Relay::start()?;
    let source = KafkaCluster::start(KafkaOptions::default())?;
    let destination = KafkaCluster::start(KafkaOptions::default().property(
        "advertised.listeners",
        format!("PLAINTEXT://{}", relay.address()),
    ))?;
    relay.set_target(SocketAddr::from((Ipv4Addr::LOCALHOST, destination.port())));
    create_topic(&rt, &client(&source.bootstrap()), TOPIC, PARTITIONS, &[])?;
    create_topic(
        &rt,
        &client(&destination.bootstrap()),
        TOPIC,
        PARTITIONS,
        &[],
    )?;

    // The source: an idempotent producer, each partition in order.
    let producer: BaseProducer = RdConfig::new()
        .set("bootstrap.servers", source.bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.num.messages", "500")
        .set("message.timeout.ms", "60000")
        .create()?;
    let per_partition = RECORDS / PARTITIONS as usize;
    for i in 0..per_partition {
        for p in 0..PARTITIONS {
            let v = value(p, i);
            loop {
                match producer.send(BaseRecord::<(), _>::to(TOPIC).partition(p).payload(&v)) {
                    Ok(()) => break,
                    // Local queue full: let deliveries drain it.
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(
                            rdkafka::types::RDKafkaErrorCode::QueueFull,
                        ),
                        _,
                    )) => {
                        producer.poll(Duration::from_millis(50));
                    }
                    Err((e, _)) => return Err(anyhow!("queueing {v}: {e}")),
                }
            }
        }
    }
    producer.flush(Duration::from_secs(60))?;

    let proxy = start_with(&relay.address(), &link_env("a", source.cluster_id(), TOPIC))?;

    relay.cut_every(CUT_EVERY);
    let config =
        support::replicator::config(&source.bootstrap(), &proxy.bootstrap, TOPIC, "mirror-a");
    let report = support::replicator::run(&rt, config).with_context(|| {
        format!(
            "replicating through a flaky connection; proxy log:\n{}",
            tools::tail_str(&proxy.logs(), 40)
        )
    })?;
    relay.cut_every(0);
    eprintln!(
        "replicated {} records in {} batches; the relay cut {} connections",
        report.total_records,
        report.total_batches,
        relay.cuts()
    );

    // Exactly once, in order, per partition.
    for p in 0..PARTITIONS {
        let got = log_values(&destination, p)?;
        let first_wrong = (0..per_partition).find(|&i| got.get(i) != Some(&value(p, i)));
        ensure!(
            got.len() == per_partition && first_wrong.is_none(),
            "partition {p}: {} records for {per_partition}, first difference at {first_wrong:?} ({:?}); proxy log:\n{}",
            got.len(),
            first_wrong.and_then(|i| got.get(i)),
            tools::tail_str(&proxy.logs(), 40)
        );
    }
    ensure!(
        report.total_records == RECORDS as u64,
        "the replicator reports {} records",
        report.total_records
    );

    // The faults happened and were met by the producer state: answers lost
    // after an append (partitions marked, rebuilt from the log) and retries
    // answered as duplicates rather than appended again.
    ensure!(relay.cuts() > 0, "the relay cut no connection");
    let marked = proxy.metric(
        "kafka_mirror_proxy_mirror_producer_state_rebuild_marks_total{reason=\"unknown_outcome\"}",
    )?;
    let duplicates =
        proxy.metric("kafka_mirror_proxy_mirror_duplicates_answered_total{link=\"a\"}")?;
    eprintln!("partitions marked for a rebuild: {marked}; duplicates answered: {duplicates}");
    ensure!(marked > 0, "no outcome was lost");
    ensure!(duplicates > 0, "no retry was answered as a duplicate");
    Ok(())
}
