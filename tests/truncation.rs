//! A duplicate answer must name a batch the log still holds (issue 26,
//! item 3): after an unclean leader election truncated a mirrored
//! partition, the retry of a batch the old leader acknowledged and the
//! cluster then lost is appended, not answered "duplicate" with an offset
//! the log no longer has. Real brokers and the proxy binary throughout.
//!
//! Three KRaft nodes (combined broker and controller: three voters, so that
//! a quorum exists whenever two run); topic `t` has one partition on nodes
//! 1 (leader) and 2, `unclean.leader.election.enable=true`,
//! `min.insync.replicas=1`:
//!
//! 1. batch A (sequences 0) is appended with `acks=all` on both replicas;
//! 2. node 2 (the follower) is stopped; batch B (sequence 1) is appended
//!    with `acks=1` on node 1 alone, and acknowledged through the proxy;
//! 3. node 1 is killed (SIGKILL); node 2 is started, and once node 1 is
//!    fenced an unclean election (Kafka's LeaderElectionCommand
//!    `--election-type unclean`) makes node 2 the leader: its log has A only;
//! 4. node 1 is started again and truncates its log to node 2's;
//! 5. the replicator retries B through the proxy (to node 2): it must be
//!    appended, and the log (DumpLogSegments, on both nodes) holds A and B
//!    exactly once each.
//!
//! Before the fix the proxy still remembered B at offset 1 and answered the
//! retry as its duplicate: acknowledged, and not in the log.

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
const PRODUCE_VERSION: i16 = 9;
/// Generous: three brokers, their tools and the proxy share 2 cores.
const WAIT: Duration = Duration::from_secs(120);
const LEADER_ELECTION: &str = "org.apache.kafka.tools.LeaderElectionCommand";

/// A link Produce of `records` to `t`-0 with `acks`: (error code, base
/// offset, message).
fn link_produce(
    proxy: &ProxyProcess,
    node: i32,
    acks: i16,
    records: Bytes,
) -> Result<(i16, i64, String)> {
    let mut raw = RawClient::connect(&proxy.node_address(node))?;
    let request = ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let correlation = raw.send(ApiKey::Produce, PRODUCE_VERSION, LINK_CLIENT, &request)?;
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

/// The leader of `t`-0 as Kafka's TopicCommand describes it.
fn leader(bootstrap: &str) -> Result<Option<i32>> {
    let out = tools::java(
        tools::TOPIC_COMMAND,
        &[
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--topic",
            TOPIC,
        ],
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text
        .split("Leader:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|l| l.parse().ok()))
}

/// Polls `done` (every 500 ms, up to [`WAIT`]).
fn until(what: &str, mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        if done()? {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "{what}: not within {WAIT:?}");
        thread::sleep(Duration::from_millis(500));
    }
}

#[test]
fn a_batch_lost_in_an_unclean_election_is_appended_again_not_answered_duplicate() -> Result<()> {
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
            "1:2",
            "--config",
            "unclean.leader.election.enable=true",
            "--config",
            "min.insync.replicas=1",
        ],
    )?;
    ensure!(out.status.success(), "create topic: {out:?}");
    let source = ClusterId::from_bytes(*b"truncate-source!").to_string();
    let proxy = ProxyProcess::start_for_nodes(
        &bootstrap,
        &[1, 2, 3],
        &[
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
            ("LINK_X_TOPICS", TOPIC),
        ],
    )?;
    let logs = || tools::tail_str(&proxy.logs(), 40);
    // The proxy serves a node once a Metadata response named it: Kafka's
    // BrokerApiVersionsCommand asks for it, through the proxy.
    let versions = tools::broker_api_versions(&proxy.bootstrap)?;
    for node in 1..=3 {
        ensure!(
            versions.contains(&format!("{} (id: {node}", proxy.node_address(node))),
            "node {node} not served by the proxy: {versions}"
        );
    }

    // 1. A on both replicas.
    let a = link_produce(&proxy, 1, -1, record_batch_at(5, 0, &["a"]))?;
    ensure!(a.0 == NONE, "A: {a:?}\n{}", logs());
    until("A replicated to node 2", || {
        Ok(copies(&log(kafka.node(2)?)?, 0).len() == 1)
    })?;

    // 2. The follower stops; B on the leader alone (acks=1).
    kafka.node_mut(2)?.stop()?;
    let b = link_produce(&proxy, 1, 1, record_batch_at(5, 1, &["b"]))?;
    ensure!(b.0 == NONE, "B: {b:?}\n{}", logs());
    ensure!(b.1 == a.1 + 1, "B right after A: {a:?} {b:?}");

    // 3. The leader crashes; the follower comes back and is elected
    // uncleanly once the controller has fenced the old leader.
    kafka.node_mut(1)?.kill();
    kafka.node_mut(2)?.restart()?;
    let n2 = kafka.node(2)?.bootstrap();
    let mut last = String::new();
    until("an unclean election of node 2", || {
        // The controller may elect it by itself (the topic allows unclean
        // elections) once node 1 is fenced; else ask for one.
        if leader(&n2)? == Some(2) {
            return Ok(true);
        }
        let out = tools::java(
            LEADER_ELECTION,
            &[
                "--bootstrap-server",
                &n2,
                "--election-type",
                "unclean",
                "--topic",
                TOPIC,
                "--partition",
                "0",
            ],
        )?;
        last = tools::output_text(&out);
        Ok(false)
    })
    .with_context(|| format!("last LeaderElectionCommand output: {last}"))?;
    ensure!(
        copies(&log(kafka.node(2)?)?, 1).is_empty(),
        "node 2 never had B"
    );

    // 4. The old leader returns and truncates to the new leader's log.
    kafka.node_mut(1)?.restart()?;
    until("node 1 truncated B away", || {
        Ok(copies(&log(kafka.node(1)?)?, 1).is_empty())
    })?;

    // 5. The replicator retries B, now to node 2.
    let retry = link_produce(&proxy, 2, 1, record_batch_at(5, 1, &["b"]))?;
    let leader_log = log(kafka.node(2)?)?;
    let held = copies(&leader_log, 1);
    assert_eq!(
        held.len(),
        1,
        "the retry of B is in the log once (answered {retry:?}): {leader_log:?}\n{}",
        logs()
    );
    assert_eq!(retry.0, NONE, "{retry:?}");
    assert_eq!(
        retry.1, held[0].base_offset,
        "answered with its real offset"
    );
    assert_eq!(copies(&leader_log, 0).len(), 1, "A once: {leader_log:?}");
    // A retry of B now is the duplicate of that append.
    let again = link_produce(&proxy, 2, 1, record_batch_at(5, 1, &["b"]))?;
    assert_eq!((again.0, again.1), (NONE, retry.1), "{again:?}");
    // And of A, which the log held throughout, too.
    let a_again = link_produce(&proxy, 2, 1, record_batch_at(5, 0, &["a"]))?;
    assert_eq!((a_again.0, a_again.1), (NONE, a.1), "{a_again:?}");
    until("node 1 replicated B once", || {
        Ok(copies(&log(kafka.node(1)?)?, 1).len() == 1)
    })?;
    assert_eq!(copies(&log(kafka.node(2)?)?, 1).len(), 1, "still once");
    Ok(())
}
