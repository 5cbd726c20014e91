//! A link Produce whose answer was lost with its connection, appended by
//! the broker only after the proxy read the partition's log tail for the
//! retry (issue 26, item 4): the destination log must hold the batch once,
//! and the retry must be answered with the offset of that one copy.
//!
//! The destination broker advertises a fault-injecting relay
//! (`support::hold_relay`), so the proxy's connections to it go through the
//! relay. The relay holds one link Produce request on the network, cuts the
//! proxy's side of its connection, and delivers the held request to the
//! broker on the original broker-side connection only after the test saw
//! the retry answered once (so after the retry's rebuild read the tail): a
//! fault a real broker cannot be made to show on demand. The log is read
//! back with Kafka's DumpLogSegments.

mod support;

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use kafka_mirror_proxy::mirror::pid::ClusterId;
use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use support::crate_client::create_topics;
use support::hold_relay::HoldRelay;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{produce_request, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const TOPIC: &str = "w";
const NONE: i16 = 0;
const NOT_ENOUGH_REPLICAS: i16 = 19;

/// An idempotent batch of 10 records of source producer 5, epoch 0,
/// sequences `first..first + 10`.
fn batch(first: i32, tag: &str) -> Bytes {
    let values: Vec<String> = (0..10).map(|i| format!("{tag}-{i}")).collect();
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
        producer_epoch: 0,
        base_sequence: first,
        transactional: false,
        control: false,
    };
    Bytes::from(build(&header, &records).expect("a batch"))
}

/// (error code, base offset) of the single partition.
fn result(r: &ProduceResponse) -> (i16, i64) {
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

fn log(broker: &KafkaCluster) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in broker.segment_files(TOPIC, 0)? {
        out.extend(tools::dump_log_segments(&file, false)?);
    }
    Ok(out)
}

/// Wait (bounded) for `what`.
fn wait_for(what: &str, bound: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let until = Instant::now() + bound;
    while !done() {
        if Instant::now() > until {
            bail!("{what}: not within {} s", bound.as_secs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn a_lost_request_appended_after_the_retrys_tail_read_is_in_the_log_once() -> Result<()> {
    let relay = HoldRelay::start()?;
    let broker = KafkaCluster::start(KafkaOptions::default().property(
        "advertised.listeners",
        format!("PLAINTEXT://{}", relay.address()),
    ))?;
    relay.set_target(SocketAddr::from((Ipv4Addr::LOCALHOST, broker.port())));
    create_topics(&broker.bootstrap(), &[(TOPIC, 1)])?;
    let source = ClusterId::from_bytes(*b"unknown-outcome!").to_string();
    // Bootstrapped through the relay too: every connection of the proxy to
    // the broker passes it.
    let proxy = ProxyProcess::start(
        &relay.address(),
        &[
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
            ("LINK_X_TOPICS", TOPIC),
            // Well above the time the test takes to release the held
            // request (one retry's round trip).
            ("UNKNOWN_OUTCOME_WAIT_MS", "15000"),
        ],
    )?;
    let logs = || tools::tail_str(&proxy.logs(), 40);

    // A first batch: the partition's state is rebuilt and the producer known.
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    let first = result(&raw.produce(LINK_CLIENT, TOPIC, 0, batch(0, "a"))?);
    ensure!(
        first.0 == NONE,
        "first batch: {first:?}; proxy log:\n{}",
        logs()
    );

    // The next one is held on the network; the proxy's connection is cut.
    relay.hold_next_produce(LINK_CLIENT);
    let lost = batch(10, "b");
    let c = raw.send(
        ApiKey::Produce,
        9,
        LINK_CLIENT,
        &produce_request(TOPIC, 0, lost.clone()),
    )?;
    let answer = raw.recv_frame()?;
    ensure!(
        answer.is_none(),
        "the held request was answered (correlation {c}); proxy log:\n{}",
        logs()
    );
    ensure!(
        relay.held() == 1,
        "the relay held {} requests",
        relay.held()
    );

    // The retry, on a new connection: its partition's tail is read now,
    // without the held batch.
    let mut retry = RawClient::connect(&proxy.bootstrap)?;
    let mut answers = vec![result(&retry.produce(
        LINK_CLIENT,
        TOPIC,
        0,
        lost.clone(),
    )?)];
    // Only now does the broker get the lost request, and append it.
    relay.release();
    wait_for(
        "the broker's answer to the held request",
        Duration::from_secs(30),
        || relay.answered() == 1,
    )?;
    // The retry goes on (as a replicator's would) until it is acknowledged.
    let until = Instant::now() + Duration::from_secs(60);
    while answers.last().is_some_and(|a| a.0 == NOT_ENOUGH_REPLICAS) {
        ensure!(
            Instant::now() < until,
            "still refused after 60 s: {answers:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
        answers.push(result(&retry.produce(
            LINK_CLIENT,
            TOPIC,
            0,
            lost.clone(),
        )?));
    }
    let acked = *answers.last().context("an answer")?;
    ensure!(
        acked.0 == NONE,
        "the retry ended with {acked:?} ({answers:?}); proxy log:\n{}",
        logs()
    );

    let batches = log(&broker)?;
    let copies: Vec<&DumpedBatch> = batches.iter().filter(|b| b.base_sequence == 10).collect();
    assert_eq!(
        copies.len(),
        1,
        "the lost batch is in the log once: {batches:?}; retry answers {answers:?}"
    );
    assert_eq!(
        acked.1, copies[0].base_offset,
        "the retry is answered with the offset of the one copy ({answers:?})"
    );
    assert_eq!(batches.len(), 2, "nothing else appended: {batches:?}");
    println!(
        "retry answers: {answers:?}; held request appended at {}",
        copies[0].base_offset
    );
    Ok(())
}
