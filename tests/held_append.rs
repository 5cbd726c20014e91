//! Duplicates across proxy instances, as `tests/chaos.rs` found them,
//! made deterministic. Both failed on main before the fix (0614d1c): the
//! retry was appended a second time.
//!
//! The first: a link batch the partition leader has appended but not yet
//! committed (an `acks=all` Produce waiting for a follower that died,
//! until the controller drops it from the ISR), whose proxy instance is
//! killed meanwhile; the replicator's retry reaches the other instance.
//! Real brokers and the proxy binary throughout: three KRaft nodes, topic
//! `t` with one partition on nodes 1 (leader), 2 and 3,
//! `min.insync.replicas=2`; two proxy instances on one state topic.
//!
//! 1. batch A (sequence 0) through instance P1, acknowledged (`acks=all`);
//! 2. node 3 (a follower) is killed: an `acks=all` append now waits at the
//!    leader until node 3 is out of the ISR (the controller fences it after
//!    its session timeout);
//! 3. batch B (sequence 1) is sent through P1 (`acks=all`), its answer not
//!    awaited; once node 1's log holds it (DumpLogSegments), P1 is killed
//!    (SIGKILL);
//! 4. B is sent again through P2, as the replicator's retry would be,
//!    again while answered retriable;
//! 5. once answered, node 1's log must hold B once.
//!
//! Before the fix P2's rebuild read the log to its high watermark, below
//! the held batch, and forwarded the retry (B at offsets 1 and 2). Now a
//! rebuild reads only once the high watermark covers the leader's log end
//! (`filter::rebuild`): until the ISR shrinks, the retry is answered
//! retriable; then it is B's duplicate.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::kafka::{KafkaMultiCluster, KafkaNode, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{record_batch_at, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const TOPIC: &str = "t";
const NONE: i16 = 0;
const NOT_ENOUGH_REPLICAS: i16 = 19;
const PRODUCE_VERSION: i16 = 9;
/// Generous: three brokers, their tools and two proxies share 2 cores.
const WAIT: Duration = Duration::from_secs(120);

/// Sends a link Produce of `records` to `t`-0 (`acks=all`, 60 s timeout)
/// on a new connection to the proxy's port for `node`; returns the
/// connection and the correlation id, the answer unread.
fn send_link(proxy: &ProxyProcess, node: i32, records: Bytes) -> Result<(RawClient, i32)> {
    let mut raw = RawClient::connect(&proxy.node_address(node))?;
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(60_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let correlation = raw.send(ApiKey::Produce, PRODUCE_VERSION, LINK_CLIENT, &request)?;
    Ok((raw, correlation))
}

/// The answer to [`send_link`]: (error code, base offset, message).
fn answer(raw: &mut RawClient, correlation: i32) -> Result<(i16, i64, String)> {
    let Some(mut frame) = raw.recv_frame()? else {
        bail!("connection closed instead of a Produce response");
    };
    let header = ResponseHeader::decode(
        &mut frame,
        ApiKey::Produce.response_header_version(PRODUCE_VERSION),
    )?;
    ensure!(header.correlation_id == correlation, "correlation");
    let r = ProduceResponse::decode(&mut frame, PRODUCE_VERSION)?;
    let p = r
        .responses
        .iter()
        .flat_map(|t| &t.partition_responses)
        .next()
        .context("no partition answered")?;
    let message = p.error_message.as_ref().map(|m| m.to_string());
    Ok((p.error_code, p.base_offset, message.unwrap_or_default()))
}

fn log(node: &KafkaNode) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in node.segment_files(TOPIC, 0)? {
        out.extend(tools::dump_log_segments(&file, false)?);
    }
    Ok(out)
}

/// The batches of mirrored producer sequence `seq` in `batches`.
fn copies(batches: &[DumpedBatch], seq: i32) -> Vec<&DumpedBatch> {
    batches
        .iter()
        .filter(|b| b.producer_id < -1 && b.base_sequence == seq)
        .collect()
}

#[test]
fn a_retry_through_another_instance_of_a_batch_held_for_acks_all_is_not_appended_again(
) -> Result<()> {
    let mut kafka = KafkaMultiCluster::start(KafkaOptions::default(), &[1, 2, 3])?;
    let bootstrap = kafka.bootstrap();
    let out = tools::java(
        tools::TOPIC_COMMAND,
        &[
            "--bootstrap-server",
            &bootstrap,
            "--create",
            "--topic",
            TOPIC,
            "--replica-assignment",
            "1:2:3",
            "--config",
            "min.insync.replicas=2",
        ],
    )?;
    ensure!(out.status.success(), "create topic: {out:?}");
    let source = ClusterId::from_bytes(*b"held-app-source!").to_string();
    let link = [
        ("LINKS", "x"),
        ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
        ("LINK_X_TOPICS", TOPIC),
    ];
    let mut p1 = ProxyProcess::start_for_nodes(&bootstrap, &[1, 2, 3], &link)?;
    let p2 = ProxyProcess::start_for_nodes(&bootstrap, &[1, 2, 3], &link)?;
    // A proxy serves a node once a Metadata response named it.
    for p in [&p1, &p2] {
        let versions = tools::broker_api_versions(&p.bootstrap)
            .with_context(|| tools::tail_str(&p.logs(), 30))?;
        ensure!(
            versions.contains(&format!("{} (id: 1", p.node_address(1))),
            "node 1 not served: {versions}"
        );
    }

    // 1. A, acknowledged by all three replicas.
    let (mut c, k) = send_link(&p1, 1, record_batch_at(5, 0, &["a"]))?;
    let a = answer(&mut c, k)?;
    ensure!(a.0 == NONE, "A: {a:?}\n{}", tools::tail_str(&p1.logs(), 30));

    // 2. A follower dies: acks=all appends wait for the ISR to shrink.
    kafka.node_mut(3)?.kill();

    // 3. B through P1, held at the leader; P1 dies once the leader has it.
    let b = record_batch_at(5, 1, &["b"]);
    let (_held, _) = send_link(&p1, 1, b.clone())?;
    let deadline = Instant::now() + WAIT;
    while copies(&log(kafka.node(1)?)?, 1).is_empty() {
        ensure!(Instant::now() < deadline, "B never reached node 1's log");
        thread::sleep(Duration::from_millis(100));
    }
    p1.kill()?;

    // 4. The retry through P2, again while answered retriable: until the
    //    ISR drops node 3, B is above the high watermark and P2 cannot
    //    read whether it is in the log.
    let deadline = Instant::now() + WAIT;
    let mut retriable = 0;
    let retry = loop {
        let (mut c, k) = send_link(&p2, 1, b.clone())?;
        let retry = answer(&mut c, k)?;
        if retry.0 != NOT_ENOUGH_REPLICAS || Instant::now() > deadline {
            break retry;
        }
        retriable += 1;
        thread::sleep(Duration::from_millis(500));
    };

    // 5. B once in the leader's log.
    let leader_log = log(kafka.node(1)?)?;
    let held = copies(&leader_log, 1);
    assert_eq!(
        held.len(),
        1,
        "B is in node 1's log {} times (the retry through the other instance answered \
         {retry:?}, after {retriable} retriable answers): {leader_log:?}\n{}",
        held.len(),
        tools::tail_str(&p2.logs(), 30)
    );
    assert_eq!(retry.0, NONE, "{retry:?}");
    assert_eq!(retry.1, held[0].base_offset, "answered with B's offset");
    Ok(())
}

/// The other duplicate the chaos test found (seed 1796395440120354679,
/// idem-0 offsets 2659 and 2662): producer state is each instance's own
/// memory, and a forward gap in sequences is accepted. An instance that
/// was not in use while the other one appended a producer's batches still
/// holds that producer's older batches; the retry of a batch the other
/// instance appended (its answer lost when that instance was killed, or a
/// replicator's re-send after a restart) was a forward gap for it, and was
/// appended again. Now a connection new to a partition rebuilds it first
/// (`mirror::dedupe`). One broker, two instances, a connection per request:
///
/// 1. A (sequence 0) through P2: P2 knows the producer up to sequence 0;
/// 2. B (sequence 1) through P1, acknowledged;
/// 3. B again through P2, as a retry after a switch: answered as B's
///    duplicate, B once in the log.
#[test]
fn a_retry_through_an_instance_with_older_state_of_the_producer_is_not_appended_again() -> Result<()>
{
    let kafka = support::kafka::KafkaCluster::start(KafkaOptions::default())?;
    let bootstrap = kafka.bootstrap();
    support::crate_client::create_topics(&bootstrap, &[(TOPIC, 1)])?;
    let source = ClusterId::from_bytes(*b"stale-st-source!").to_string();
    let link = [
        ("LINKS", "x"),
        ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
        ("LINK_X_TOPICS", TOPIC),
    ];
    let p1 = ProxyProcess::start_for_nodes(&bootstrap, &[1], &link)?;
    let p2 = ProxyProcess::start_for_nodes(&bootstrap, &[1], &link)?;
    for p in [&p1, &p2] {
        tools::broker_api_versions(&p.bootstrap).with_context(|| tools::tail_str(&p.logs(), 30))?;
    }
    let produce = |p: &ProxyProcess, seq: i32, value: &str| -> Result<(i16, i64, String)> {
        let (mut c, k) = send_link(p, 1, record_batch_at(5, seq, &[value]))?;
        answer(&mut c, k)
    };
    let a = produce(&p2, 0, "a")?;
    ensure!(a.0 == NONE, "A: {a:?}\n{}", tools::tail_str(&p2.logs(), 30));
    let b = produce(&p1, 1, "b")?;
    ensure!(b.0 == NONE, "B: {b:?}\n{}", tools::tail_str(&p1.logs(), 30));
    let retry = produce(&p2, 1, "b")?;
    let mut batches = Vec::new();
    for file in kafka.segment_files(TOPIC, 0)? {
        batches.extend(tools::dump_log_segments(&file, false)?);
    }
    let held = copies(&batches, 1);
    assert_eq!(
        held.len(),
        1,
        "B is in the log {} times (through P1: {b:?}; the retry through P2: {retry:?}): \
         {batches:?}\n{}",
        held.len(),
        tools::tail_str(&p2.logs(), 20)
    );
    assert_eq!(
        (retry.0, retry.1),
        (NONE, b.1),
        "the retry answered with B's offset"
    );
    Ok(())
}
