//! Failover against link requests in flight (issue 25, item 6), with a
//! real broker and the proxy binary.
//!
//! A link request is held at the broker by the broker itself: the link's
//! client id gets a tiny produce quota, so a large Produce is answered at
//! once with a throttle time and the broker then stops reading that
//! connection until the time is up (KIP-219). The next Produce sent on the
//! connection sits unread at the broker meanwhile, and is appended when the
//! throttle ends. The state topic and the barriers use the proxy's own
//! client id and connections, which are not throttled.
//!
//! - `drained_waits_for_a_forwarded_batch_held_at_the_broker`: a link
//!   connection with a batch held at the broker when the failover starts.
//!   The instance may not report the link drained, and the barrier may not
//!   be placed, before that batch's response is in: the batch is in the log
//!   before the barrier's log end offset, never past it.
//! - `a_link_produce_that_waited_across_stopping_is_refused`: a link
//!   Produce that waits in the proxy (a retry of the held batch waits for
//!   that attempt's outcome) while the failover starts is refused
//!   PRODUCER_FENCED on every partition when its wait ends, like any
//!   request of a fenced link, and nothing of it is appended.
//! - `a_link_produce_that_waited_past_the_drain_timeout_is_refused`: the
//!   same with a drain timeout shorter than the wait, so the barriers are
//!   placed while the request still waits (a barrier, expiring the
//!   partition's producer state, ends the wait): it is refused all the
//!   same, not appended past the barrier.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, ApiKey, DescribeClientQuotasRequest,
    DescribeClientQuotasResponse, ProduceRequest, ProduceResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use serde_json::Value;

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::http;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{record_batch_at, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const TOPIC: &str = "m";
const NONE: i16 = 0;
const PRODUCER_FENCED: i16 = 90;
const PRODUCE_VERSION: i16 = 9;
/// The link's produce quota in bytes per second: a Produce of
/// [`THROTTLING_BYTES`] is throttled for about
/// `(THROTTLING_BYTES / 10 s / QUOTA - 1) * 10 s` (the broker measures a
/// new client's rate over its 11 one-second samples), here about 15 s.
const QUOTA: f64 = 1024.0;
const THROTTLING_BYTES: usize = 25 * 1024;
/// Generous: the broker, its tools and the proxy share 2 cores.
const WAIT: Duration = Duration::from_secs(60);

/// A proxy with link `x` mirroring topic `m`, whose failovers wait up to
/// `drain_timeout_ms` for the link to drain.
fn proxy(broker: &KafkaCluster, drain_timeout_ms: &str) -> Result<ProxyProcess> {
    let source = ClusterId::from_bytes(*b"failover-source!");
    ProxyProcess::with_link_x(
        &broker.bootstrap(),
        &source,
        TOPIC,
        &[("FAILOVER_DRAIN_TIMEOUT_MS", drain_timeout_ms)],
    )
}

/// Long enough that only draining decides when the barrier goes.
const LONG_DRAIN: &str = "120000";

/// Sets `producer_byte_rate` for client id `client` at the broker and waits
/// until the broker describes it (bounded).
fn set_produce_quota(broker: &KafkaCluster, client: &str, bytes_per_s: f64) -> Result<()> {
    let entity = || {
        vec![EntityData::default()
            .with_entity_type(StrBytes::from_static_str("client-id"))
            .with_entity_name(Some(StrBytes::from_string(client.to_string())))]
    };
    let request = AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
        .with_entity(entity())
        .with_ops(vec![OpData::default()
            .with_key(StrBytes::from_static_str("producer_byte_rate"))
            .with_value(bytes_per_s)])]);
    let mut raw = RawClient::connect(&broker.bootstrap())?;
    let version = 1;
    let correlation = raw.send(ApiKey::AlterClientQuotas, version, "test-admin", &request)?;
    let mut frame = response(&mut raw, ApiKey::AlterClientQuotas, version, correlation)?;
    let altered = AlterClientQuotasResponse::decode(&mut frame, version)?;
    for e in &altered.entries {
        ensure!(
            e.error_code == NONE,
            "AlterClientQuotas: {} {:?}",
            e.error_code,
            e.error_message
        );
    }
    let describe =
        DescribeClientQuotasRequest::default().with_components(vec![ComponentData::default()
            .with_entity_type(StrBytes::from_static_str("client-id"))
            .with_match_type(0)
            .with_match(Some(StrBytes::from_string(client.to_string())))]);
    let deadline = Instant::now() + WAIT;
    loop {
        let correlation = raw.send(
            ApiKey::DescribeClientQuotas,
            version,
            "test-admin",
            &describe,
        )?;
        let mut frame = response(&mut raw, ApiKey::DescribeClientQuotas, version, correlation)?;
        let described = DescribeClientQuotasResponse::decode(&mut frame, version)?;
        let set = described.entries.iter().flatten().any(|e| {
            e.values
                .iter()
                .any(|v| v.key.as_str() == "producer_byte_rate" && v.value == bytes_per_s)
        });
        if set {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "the broker did not describe the quota of {client} within {WAIT:?}: {described:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// The next response frame on `raw`, checked to answer `correlation`, with
/// its header read.
fn response(raw: &mut RawClient, api: ApiKey, version: i16, correlation: i32) -> Result<Bytes> {
    let Some(mut frame) = raw.recv_frame()? else {
        bail!("connection closed instead of a {api:?} response");
    };
    let header = ResponseHeader::decode(&mut frame, api.response_header_version(version))?;
    ensure!(
        header.correlation_id == correlation,
        "{api:?}: correlation {} != {correlation}",
        header.correlation_id
    );
    Ok(frame)
}

/// A link Produce (acks=all) of `batches`: (partition, records) of topic `m`.
fn link_produce(raw: &mut RawClient, batches: &[(i32, Bytes)]) -> Result<i32> {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(
                batches
                    .iter()
                    .map(|(p, records)| {
                        PartitionProduceData::default()
                            .with_index(*p)
                            .with_records(Some(records.clone()))
                    })
                    .collect(),
            )]);
    raw.send(ApiKey::Produce, PRODUCE_VERSION, LINK_CLIENT, &request)
}

fn produce_response(raw: &mut RawClient, correlation: i32) -> Result<ProduceResponse> {
    let mut frame = response(raw, ApiKey::Produce, PRODUCE_VERSION, correlation)?;
    ProduceResponse::decode(&mut frame, PRODUCE_VERSION)
}

/// (error code, base offset, message) of `partition` in a Produce response.
fn result_of(r: &ProduceResponse, partition: i32) -> Result<(i16, i64, String)> {
    let p = r
        .responses
        .iter()
        .flat_map(|t| &t.partition_responses)
        .find(|p| p.index == partition)
        .with_context(|| format!("no answer for partition {partition}: {r:?}"))?;
    let message = p
        .error_message
        .as_ref()
        .map(|m| m.to_string())
        .unwrap_or_default();
    Ok((p.error_code, p.base_offset, message))
}

/// A batch of mirrored producer `pid` (source side) at `sequence`.
fn batch(pid: i64, sequence: i32, value: &str) -> Bytes {
    record_batch_at(pid, sequence, &[value])
}

/// Produces a batch of [`THROTTLING_BYTES`] on a new link connection, which
/// the broker answers and then stops reading for the throttle time: the
/// connection, and the throttle time in ms.
fn throttled_link_connection(proxy: &ProxyProcess, pid: i64) -> Result<(RawClient, i32)> {
    let mut c = RawClient::connect(&proxy.bootstrap)?;
    let big = "x".repeat(THROTTLING_BYTES);
    let correlation = link_produce(&mut c, &[(0, batch(pid, 0, &big))])?;
    let r = produce_response(&mut c, correlation)?;
    let (code, _, message) = result_of(&r, 0)?;
    ensure!(code == NONE, "the large link batch: {code} {message}");
    // The hold below depends on it; the read timeout (30 s) bounds it.
    ensure!(
        (3_000..25_000).contains(&r.throttle_time_ms),
        "the broker throttled the link's connection for {} ms, not the 3 to 25 s the test needs",
        r.throttle_time_ms
    );
    Ok((c, r.throttle_time_ms))
}

/// `POST /links/x/failover?wait=100` in a thread: (status line, report).
fn start_failover(proxy: &ProxyProcess) -> thread::JoinHandle<Result<(String, Value)>> {
    let admin = proxy.admin.clone();
    thread::spawn(move || {
        let path = "/links/x/failover?wait=100";
        let answer = http::request(&admin, "POST", path, "", "", Duration::from_secs(120))?;
        Ok((answer.status.clone(), answer.json()?))
    })
}

fn finished_failover(
    running: thread::JoinHandle<Result<(String, Value)>>,
    proxy: &ProxyProcess,
) -> Result<Value> {
    let (status, report) = running
        .join()
        .map_err(|_| anyhow::anyhow!("failover thread panicked"))??;
    ensure!(
        status.contains(" 200 ") && report["state"] == "STOPPED",
        "failover: {status} {report:#}\n{}",
        tools::tail_str(&proxy.logs(), 40)
    );
    Ok(report)
}

/// The barrier's log end offset of `partition` in a failover report.
fn barrier_offset(report: &Value, partition: i32) -> Result<i64> {
    report["failover"]["partitions"]
        .as_array()
        .context("partitions")?
        .iter()
        .find(|p| p["partition"] == partition)
        .and_then(|p| p["log_end_offset"].as_i64())
        .with_context(|| format!("no barrier for partition {partition}: {report:#}"))
}

/// Batches of `topic`'s `partition` in the broker's log.
fn log(broker: &KafkaCluster, partition: i32) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in broker.segment_files(TOPIC, partition)? {
        out.extend(tools::dump_log_segments(&file, false)?);
    }
    Ok(out)
}

/// Until the proxy has taken `n` Produce requests in all (each one counted
/// before its link is checked for fencing).
fn wait_for_produce_requests(proxy: &ProxyProcess, n: i64) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    while proxy.metric("kafka_mirror_proxy_requests_total{api_key=\"0\"}")? < n {
        ensure!(
            Instant::now() < deadline,
            "the proxy did not take Produce request {n} within {WAIT:?}"
        );
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

#[test]
fn drained_waits_for_a_forwarded_batch_held_at_the_broker() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC, 1)])?;
    let p = proxy(&broker, LONG_DRAIN)?;
    set_produce_quota(&broker, LINK_CLIENT, QUOTA)?;

    // The link's connection is throttled; its next batch waits, unread, at
    // the broker while the failover starts.
    let (mut link, throttle_ms) = throttled_link_connection(&p, 7)?;
    let held = link_produce(&mut link, &[(0, batch(7, 1, "held at the broker"))])?;
    let failover = start_failover(&p);

    // The held batch was forwarded before the link was fenced: it is
    // appended once the broker reads it.
    let r = produce_response(&mut link, held)?;
    let (code, offset, message) = result_of(&r, 0)?;
    ensure!(code == NONE, "the held batch: {code} {message}");
    let report = finished_failover(failover, &p)?;
    let barrier = barrier_offset(&report, 0)?;
    eprintln!("throttled for {throttle_ms} ms; held batch at {offset}; barrier at {barrier}");

    // Drained means no mirrored batch at the broker: the barrier follows the
    // held batch, and nothing mirrored is past it.
    ensure!(
        offset < barrier,
        "the barrier (log end offset {barrier}) was placed while a forwarded link batch was still at the broker; it landed at {offset}, past the barrier\n{}",
        tools::tail_str(&p.logs(), 40)
    );
    let late: Vec<_> = log(&broker, 0)?
        .into_iter()
        .filter(|b| b.base_offset >= barrier && b.producer_id < -1)
        .collect();
    ensure!(
        late.is_empty(),
        "mirrored batches past the barrier at {barrier}: {late:?}"
    );
    Ok(())
}

/// A link request waiting in the proxy: `waiting` sent `retry`, a retry of
/// the batch `holding` has at the broker (request `held`) with a new batch
/// for partition 1.
struct Waiting {
    holding: RawClient,
    held: i32,
    waiting: RawClient,
    retry: i32,
    throttle_ms: i32,
}

/// Topic `m` with 2 partitions, partition 1 holding one mirrored batch; a
/// batch held at the broker on one link connection and, on another, a
/// request retrying it with a new batch for partition 1, which waits in the
/// proxy for the held attempt's outcome. Returns once that request is past
/// the fence (the link MIRRORING).
fn a_waiting_link_request(broker: &KafkaCluster, p: &ProxyProcess) -> Result<Waiting> {
    // Partition 1's producer state is read from its log now, before the
    // quota, not during the wait.
    let mut first = RawClient::connect(&p.bootstrap)?;
    let c = link_produce(&mut first, &[(1, batch(9, 0, "before"))])?;
    let (code, _, message) = result_of(&produce_response(&mut first, c)?, 1)?;
    ensure!(
        code == NONE,
        "the first batch of partition 1: {code} {message}"
    );
    set_produce_quota(broker, LINK_CLIENT, QUOTA)?;
    let (mut holding, throttle_ms) = throttled_link_connection(p, 7)?;
    let held_batch = batch(7, 1, "held at the broker");
    let held = link_produce(&mut holding, &[(0, held_batch.clone())])?;
    let before = p.metric("kafka_mirror_proxy_requests_total{api_key=\"0\"}")?;
    let mut waiting = RawClient::connect(&p.bootstrap)?;
    let retry = link_produce(
        &mut waiting,
        &[(0, held_batch), (1, batch(9, 1, "waited across the fence"))],
    )?;
    wait_for_produce_requests(p, before + 1)?;
    Ok(Waiting {
        holding,
        held,
        waiting,
        retry,
        throttle_ms,
    })
}

/// The waiting request's answers for partitions 0 and 1: (code, base
/// offset, message).
fn answers_to_the_waiting(w: &mut Waiting) -> Result<[(i16, i64, String); 2]> {
    let r = produce_response(&mut w.waiting, w.retry)?;
    let answers = [result_of(&r, 0)?, result_of(&r, 1)?];
    eprintln!("the waiting request's answers (code, offset, message): {answers:?}");
    Ok(answers)
}

/// PRODUCER_FENCED on every partition, then the connection closed.
fn refused(answers: &[(i16, i64, String)], w: &mut Waiting, p: &ProxyProcess) -> Result<()> {
    ensure!(
        answers.iter().all(|(code, ..)| *code == PRODUCER_FENCED),
        "a link request that waited across the failover's start was answered (code, offset, message) {answers:?}, not PRODUCER_FENCED on every partition\n{}",
        tools::tail_str(&p.logs(), 40)
    );
    ensure!(
        w.waiting.closed_by_peer(),
        "the refused link connection stayed open"
    );
    Ok(())
}

/// Mirrored batches of `partition` at or past its barrier in `report`.
fn past_the_barrier(
    broker: &KafkaCluster,
    report: &Value,
    partition: i32,
) -> Result<Vec<DumpedBatch>> {
    let barrier = barrier_offset(report, partition)?;
    Ok(log(broker, partition)?
        .into_iter()
        .filter(|b| b.base_offset >= barrier && b.producer_id < -1)
        .collect())
}

#[test]
fn a_link_produce_that_waited_across_stopping_is_refused() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC, 2)])?;
    let p = proxy(&broker, LONG_DRAIN)?;
    let mut w = a_waiting_link_request(&broker, &p)?;
    let failover = start_failover(&p);

    // Its wait ends (the held attempt's outcome, or the in-flight wait's
    // bound) after the link became STOPPING, and before the failover can
    // finish: the held batch is still at the broker.
    let answers = answers_to_the_waiting(&mut w)?;
    refused(&answers, &mut w, &p)?;
    let (code, _, message) = result_of(&produce_response(&mut w.holding, w.held)?, 0)?;
    ensure!(code == NONE, "the held batch: {code} {message}");
    let report = finished_failover(failover, &p)?;
    eprintln!("throttled for {} ms", w.throttle_ms);

    // Nothing of the refused request is in the log; nothing mirrored is past
    // a barrier.
    let p1 = log(&broker, 1)?;
    ensure!(
        p1.iter().filter(|b| b.producer_id < -1).count() == 1,
        "partition 1 holds a mirrored batch besides the first: {p1:?}"
    );
    for partition in [0, 1] {
        let late = past_the_barrier(&broker, &report, partition)?;
        ensure!(
            late.is_empty(),
            "partition {partition}: mirrored batches past the barrier: {late:?}"
        );
    }
    Ok(())
}

#[test]
fn a_link_produce_that_waited_past_the_drain_timeout_is_refused() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC, 2)])?;
    let p = proxy(&broker, "1000")?;
    let mut w = a_waiting_link_request(&broker, &p)?;

    // The instance cannot confirm the drain (both link connections are
    // busy): the failover places the barriers after the drain timeout and
    // says which instance did not confirm.
    let report = finished_failover(start_failover(&p), &p)?;
    let unconfirmed = &report["failover"]["unconfirmed_instances"];
    ensure!(
        unconfirmed.as_array().is_some_and(|u| !u.is_empty()),
        "the failover does not name the instance that did not drain: {report:#}"
    );

    // The waiting request is not appended past the barrier: it is refused.
    let answers = answers_to_the_waiting(&mut w)?;
    let late = past_the_barrier(&broker, &report, 1)?;
    ensure!(
        late.is_empty(),
        "partition 1: mirrored batches past the barrier: {late:?}; the waiting request was answered {answers:?}"
    );
    refused(&answers, &mut w, &p)?;
    eprintln!("throttled for {} ms", w.throttle_ms);
    Ok(())
}

/// Issue 26 item 6, split brain: one of two instances is frozen (SIGSTOP)
/// with a link batch waiting in its socket, the failover runs on the other
/// and cannot hear from it, and the frozen one is resumed after the
/// barriers. It must not forward the batch: its state-topic lease (half
/// the instances' session timeout) ran out while it was frozen, and the
/// failover waited that long before its barriers. It refuses with the
/// retriable NOT_ENOUGH_REPLICAS (19), and nothing of the link is past a
/// barrier. (Before the lease, the resumed instance still believed the
/// link MIRRORING and appended the batch after the barrier.)
#[test]
fn a_frozen_instance_resumed_after_the_barriers_forwards_nothing_of_the_link() -> Result<()> {
    const NOT_ENOUGH_REPLICAS: i16 = 19;
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC, 2)])?;
    let source = ClusterId::from_bytes(*b"failover-source!");
    let settings = [
        ("FAILOVER_DRAIN_TIMEOUT_MS", "1000"),
        ("INSTANCE_SESSION_TIMEOUT_MS", "8000"),
    ];
    let a = ProxyProcess::with_link_x(&broker.bootstrap(), &source, TOPIC, &settings)?;
    let b = ProxyProcess::with_link_x(&broker.bootstrap(), &source, TOPIC, &settings)?;

    // B serves the link, then freezes with the next batch in its socket.
    let mut through_b = RawClient::connect(&b.bootstrap)?;
    let c = link_produce(&mut through_b, &[(1, batch(9, 0, "before"))])?;
    let (code, _, message) = result_of(&produce_response(&mut through_b, c)?, 1)?;
    ensure!(code == NONE, "the first batch through B: {code} {message}");
    b.signal("STOP")?;
    wait_stopped(b.pid())?;
    let c = link_produce(
        &mut through_b,
        &[(1, batch(9, 1, "sent to the frozen instance"))],
    )?;

    // The failover runs on A; B is still in the instances' group but
    // cannot confirm its drain.
    let report = finished_failover(start_failover(&a), &a)?;
    let unconfirmed = &report["failover"]["unconfirmed_instances"];
    ensure!(
        unconfirmed.as_array().is_some_and(|u| u.len() == 1),
        "B is not named as unconfirmed: {report:#}"
    );
    b.signal("CONT")?;

    // Resumed, B either answers the batch with a refusal or, having seen the
    // link fenced first, closes the connection without reading it; either
    // way nothing of it may land past the barrier.
    let answer = produce_response(&mut through_b, c)
        .and_then(|r| result_of(&r, 1))
        .map(|(code, offset, message)| (code, format!("{code} {offset} {message}")));
    eprintln!("the frozen instance's answer: {answer:?}");
    let late = past_the_barrier(&broker, &report, 1)?;
    ensure!(
        late.is_empty(),
        "partition 1: mirrored batches past the barrier: {late:?}; B answered {answer:?}\n{}",
        tools::tail_str(&b.logs(), 30)
    );
    match answer {
        Ok((code, text)) => ensure!(
            code == NOT_ENOUGH_REPLICAS || code == PRODUCER_FENCED,
            "B answered {text}"
        ),
        Err(e) => ensure!(
            e.to_string().contains("connection closed"),
            "B neither answered nor closed: {e:#}"
        ),
    }
    Ok(())
}

/// Waits until every thread of `pid` is stopped (`T` in its stat): `kill
/// -STOP` returns before a thread busy on the other core has stopped, and a
/// batch written in that moment is forwarded before the freeze.
fn wait_stopped(pid: u32) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let mut all = true;
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            // A thread that exits between the listing and the read (tokio's
            // idle blocking threads do) is skipped, not an error.
            let Ok(stat) = task.and_then(|t| std::fs::read_to_string(t.path().join("stat"))) else {
                continue;
            };
            // The state follows the command name's closing parenthesis.
            let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
            if state != Some(Some('T')) && state != Some(Some('t')) {
                all = false;
            }
        }
        if all {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "process {pid} did not stop within 10 s of SIGSTOP"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
