//! Mirrored producer state (issue 9, SPEC §6) against a real broker,
//! through the proxy binary: a link batch sent again after it was
//! acknowledged is answered with its original offset and not appended
//! again; an epoch going backwards and an overlapping sequence are refused
//! (47, 45) with nothing appended; a barrier arriving mirrored expires
//! nothing.
//!
//! Batches are written by hand with the link's client id (the source
//! cluster id is only configuration, so no source broker is needed) and
//! read back from the destination log with DumpLogSegments.

mod support;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;

use kafka_mirror_proxy::mirror::barrier::barrier_batch;
use kafka_mirror_proxy::mirror::pid::ClusterId;
use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};
use kafka_protocol::messages::{ApiKey, ProduceResponse, ResponseHeader};
use kafka_protocol::protocol::Decodable;
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{produce_request, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const NONE: i16 = 0;
const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;

/// An idempotent batch of `n` records: producer 5 (on the source), `epoch`,
/// sequences `first..first + n`.
fn batch(epoch: i16, first: i32, n: usize, tag: &str) -> Bytes {
    let values: Vec<String> = (0..n).map(|i| format!("{tag}-{i}")).collect();
    let records: Vec<NewRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(i, v)| NewRecord {
            key: None,
            value: Some(v.as_bytes()),
            headers: &[],
            timestamp: 1_700_000_000_000 + i as i64,
        })
        .collect();
    let header = NewBatch {
        producer_id: 5,
        producer_epoch: epoch,
        base_sequence: first,
        transactional: false,
        control: false,
    };
    Bytes::from(build(&header, &records).expect("a batch"))
}

/// (error code, message, base offset) of the single partition.
fn result(r: &ProduceResponse) -> (i16, Option<String>, i64) {
    let p = &r.responses[0].partition_responses[0];
    (
        p.error_code,
        p.error_message.as_ref().map(|m| m.as_str().to_string()),
        p.base_offset,
    )
}

/// Send a v9 Produce of `records` to `topic`-0 without reading the answer.
fn send(raw: &mut RawClient, topic: &str, records: Bytes) -> Result<i32> {
    raw.send(
        ApiKey::Produce,
        9,
        LINK_CLIENT,
        &produce_request(topic, 0, records),
    )
}

fn recv(raw: &mut RawClient, correlation: i32) -> Result<ProduceResponse> {
    let mut frame = raw.recv_frame()?.context("closed instead of answering")?;
    let header = ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(9))?;
    ensure!(header.correlation_id == correlation, "correlation");
    ProduceResponse::decode(&mut frame, 9)
}

fn log(broker: &KafkaCluster, topic: &str) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in broker.segment_files(topic, 0)? {
        out.extend(tools::dump_log_segments(&file, false)?);
    }
    Ok(out)
}

#[test]
fn retries_are_answered_once_and_out_of_order_batches_refused() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(
        &broker.bootstrap(),
        &[("d", 1), ("e", 1), ("s", 1), ("f", 1)],
    )?;
    let source = ClusterId::from_bytes(*b"dedupe-test-src!").to_string();
    let proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
            ("LINK_X_TOPICS", "d,e,s,f"),
            // One worker: a request spinning while it waits for a batch in
            // flight would starve the attempt it waits for (it once did, for
            // the whole 10 s wait), where a second worker would hide it.
            ("WORKER_THREADS", "1"),
        ],
    )?;
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    let logs = || tools::tail_str(&proxy.logs(), 30);

    // The same batch twice, the second after the first was acknowledged.
    let first = result(&raw.produce(LINK_CLIENT, "d", 0, batch(0, 0, 10, "d"))?);
    ensure!(
        first.0 == NONE,
        "first append: {first:?}; proxy log:\n{}",
        logs()
    );
    let again = result(&raw.produce(LINK_CLIENT, "d", 0, batch(0, 0, 10, "d"))?);
    assert_eq!(again.0, NONE, "the retry: {again:?}");
    assert_eq!(again.2, first.2, "the retry gets the original base offset");
    let d = log(&broker, "d")?;
    assert_eq!(d.len(), 1, "one copy in the log: {d:?}");
    assert_eq!((d[0].base_offset, d[0].count), (first.2, 10));
    assert!(d[0].producer_id < -1, "mapped: {}", d[0].producer_id);
    assert_eq!(
        proxy.metric("kafka_mirror_proxy_mirror_duplicates_answered_total{link=\"x\"}")?,
        1
    );

    // A barrier arriving mirrored (copied from an upstream log into link
    // traffic) expires nothing: only this proxy's own failover does. It is
    // a control batch there like any other (dropped with CONTROL_BATCHES
    // =drop), and the retry after it is still answered from the state.
    let upstream = ClusterId::from_bytes(*b"upstream-cluster");
    let mirrored_barrier = Bytes::from(barrier_batch(&upstream, 1_700_000_000_000)?);
    let b = result(&raw.produce(LINK_CLIENT, "d", 0, mirrored_barrier)?);
    assert_eq!(b.0, NONE, "a mirrored control batch is acknowledged: {b:?}");
    let after_barrier = result(&raw.produce(LINK_CLIENT, "d", 0, batch(0, 0, 10, "d"))?);
    assert_eq!(
        (after_barrier.0, after_barrier.2),
        (NONE, first.2),
        "after a mirrored barrier the retry is still a duplicate"
    );
    assert_eq!(log(&broker, "d")?.len(), 1, "still one copy");
    assert!(
        !proxy.logs().contains("failover barrier applied"),
        "a mirrored barrier expired state:\n{}",
        logs()
    );

    // An epoch going backwards: 47, nothing appended.
    let e1 = result(&raw.produce(LINK_CLIENT, "e", 0, batch(1, 0, 10, "e1"))?);
    ensure!(e1.0 == NONE, "epoch 1: {e1:?}; proxy log:\n{}", logs());
    let e0 = result(&raw.produce(LINK_CLIENT, "e", 0, batch(0, 10, 10, "e0"))?);
    assert_eq!(e0.0, INVALID_PRODUCER_EPOCH, "epoch 0 after 1: {e0:?}");
    assert!(
        e0.1.as_deref()
            .is_some_and(|m| m.contains("mirror link 'x'")),
        "a message naming the link: {e0:?}"
    );
    let e = log(&broker, "e")?;
    assert_eq!(e.len(), 1, "only epoch 1's batch: {e:?}");
    assert_eq!(e[0].producer_epoch, 1);

    // An overlapping, non-identical sequence: 45, nothing appended; the
    // next batch in order still appends.
    let s1 = result(&raw.produce(LINK_CLIENT, "s", 0, batch(0, 0, 10, "s1"))?);
    ensure!(s1.0 == NONE, "0..9: {s1:?}; proxy log:\n{}", logs());
    let overlap = result(&raw.produce(LINK_CLIENT, "s", 0, batch(0, 5, 10, "s2"))?);
    assert_eq!(
        overlap.0, OUT_OF_ORDER_SEQUENCE_NUMBER,
        "5..14: {overlap:?}"
    );
    assert!(overlap.1.is_some(), "a message: {overlap:?}");
    assert_eq!(log(&broker, "s")?.len(), 1, "the overlap was not appended");
    let next = result(&raw.produce(LINK_CLIENT, "s", 0, batch(0, 10, 10, "s3"))?);
    assert_eq!(next.0, NONE, "10..19: {next:?}");
    assert_eq!(next.2, 10);
    assert_eq!(log(&broker, "s")?.len(), 2);

    // The same batch on a second connection while the first attempt is
    // (most likely) still in flight: it waits for that outcome, or finds
    // it appended; either way one copy and one base offset.
    let mut other = RawClient::connect(&proxy.bootstrap)?;
    let a = send(&mut raw, "f", batch(0, 0, 10, "f"))?;
    let b = send(&mut other, "f", batch(0, 0, 10, "f"))?;
    let second = result(&recv(&mut other, b)?);
    let first = result(&recv(&mut raw, a)?);
    ensure!(
        first.0 == NONE,
        "first attempt: {first:?}; proxy log:\n{}",
        logs()
    );
    ensure!(
        second.0 == NONE,
        "the concurrent retry: {second:?}; first {first:?}; proxy log:\n{}",
        logs()
    );
    assert_eq!(second.2, first.2, "one base offset");
    let f = log(&broker, "f")?;
    assert_eq!(f.len(), 1, "one copy in the log: {f:?}");
    assert_eq!(
        proxy.metric("kafka_mirror_proxy_mirror_duplicates_answered_total{link=\"x\"}")?,
        3,
        "the concurrent retry was answered as a duplicate"
    );
    assert_eq!(
        proxy.metric("kafka_mirror_proxy_mirror_partitions_refused_total{link=\"x\",reason=\"retry_in_flight\"}")?,
        0,
        "it waited for the first attempt rather than answering retriable"
    );

    for reason in ["invalid_producer_epoch", "out_of_order_sequence"] {
        assert_eq!(
            proxy.metric(&format!(
                "kafka_mirror_proxy_mirror_partitions_refused_total{{link=\"x\",reason=\"{reason}\"}}"
            ))?,
            1,
            "{reason}"
        );
    }
    let text = proxy.logs();
    assert!(
        text.contains("refused mirrored partitions") && text.contains("invalid_producer_epoch"),
        "a WARN line per refused request:\n{}",
        tools::tail_str(&text, 30)
    );
    Ok(())
}

/// The state is rebuilt from the log tail after a restart: a batch
/// acknowledged before the proxy was killed, resent to a new proxy, is
/// still one copy with its original offset, and an overlap is refused.
#[test]
fn after_a_restart_the_state_is_rebuilt_from_the_log_tail() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("r", 1)])?;
    let source = ClusterId::from_bytes(*b"dedupe-test-src!").to_string();
    let env = [
        ("LINKS", "x"),
        ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
        ("LINK_X_TOPICS", "r"),
    ];
    let mut proxy = ProxyProcess::start(&broker.bootstrap(), &env)?;
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    // Something before it in the log, from a plain producer and another
    // mapped one.
    let plain = result(&raw.produce(
        LINK_CLIENT,
        "r",
        0,
        support::wire::record_batch(-1, &["plain"]),
    )?);
    ensure!(
        plain.0 == NONE,
        "{plain:?}\n{}",
        tools::tail_str(&proxy.logs(), 30)
    );
    let first = result(&raw.produce(LINK_CLIENT, "r", 0, batch(0, 0, 10, "r"))?);
    ensure!(
        first.0 == NONE,
        "{first:?}\n{}",
        tools::tail_str(&proxy.logs(), 30)
    );
    drop(raw);
    proxy.signal("KILL")?;
    proxy.wait_exit(Duration::from_secs(30))?;

    let proxy = ProxyProcess::start(&broker.bootstrap(), &env)?;
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    let again = result(&raw.produce(LINK_CLIENT, "r", 0, batch(0, 0, 10, "r"))?);
    let logs = tools::tail_str(&proxy.logs(), 30);
    assert_eq!(again.0, NONE, "{again:?}\n{logs}");
    assert_eq!(again.2, first.2, "the original base offset\n{logs}");
    assert!(
        logs.contains("rebuilt the mirrored producer state from the log tail"),
        "{logs}"
    );
    let overlap = result(&raw.produce(LINK_CLIENT, "r", 0, batch(0, 5, 10, "o"))?);
    assert_eq!(overlap.0, OUT_OF_ORDER_SEQUENCE_NUMBER, "{overlap:?}");
    let r = log(&broker, "r")?;
    assert_eq!(r.len(), 2, "the plain batch and one copy: {r:?}");
    Ok(())
}
