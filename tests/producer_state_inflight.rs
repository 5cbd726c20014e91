//! The producer-state bound never forgets a producer with a batch in
//! flight (issue 26, item 5), with a real broker and the proxy binary.
//!
//! The proxy holds one mirrored producer at most
//! (`PRODUCER_STATE_MAX_ENTRIES=1`). A link batch of producer 7 is held at
//! the broker as in `tests/failover_races.rs`: the link's client id gets a
//! tiny produce quota, a large Produce throttles its connection (KIP-219),
//! and the next Produce on that connection sits unread at the broker until
//! the throttle ends. Meanwhile:
//!
//! - a new producer (8) comes: the only producer held has a batch in flight,
//!   so none may be evicted; the new one is refused retriable
//!   (NOT_ENOUGH_REPLICAS), counted and logged, and nothing of it appended;
//! - producer 7 retries the held batch on a new connection: it waits for the
//!   held attempt (answered REQUEST_TIMED_OUT, retriable, if that takes
//!   longer than the proxy's wait), and once the held batch is appended the
//!   retry is answered as a duplicate with its offset.
//!
//! The log (DumpLogSegments) then holds the held batch exactly once. Before
//! the fix the bound evicted producer 7 for producer 8, the retry found no
//! trace of the batch in flight and was appended, and the held attempt was
//! appended again when the throttle ended.
//!
//! The same held batch makes a retry wait in the Produce filter, to show
//! that such a wait ends, and gives its memory back, when its client resets
//! (issue 44), and that the dropped request is never forwarded.

mod support;

use std::net::TcpStream;
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

use kafka_mirror_proxy::client::protocol::OffsetSpec;
use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::{client, create_topics, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{linger_zero, record_batch_at, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const TOPIC: &str = "m";
const NONE: i16 = 0;
const REQUEST_TIMED_OUT: i16 = 7;
const NOT_ENOUGH_REPLICAS: i16 = 19;
const PRODUCE_VERSION: i16 = 9;
/// As in `tests/failover_races.rs`: a Produce of [`THROTTLING_BYTES`]
/// throttles the link's connection for about 15 s.
const QUOTA: f64 = 1024.0;
const THROTTLING_BYTES: usize = 25 * 1024;
/// Generous: the broker, its tools and the proxy share 2 cores.
const WAIT: Duration = Duration::from_secs(60);

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

/// Sets `producer_byte_rate` for client id `client` and waits until the
/// broker describes it (bounded).
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
        ensure!(e.error_code == NONE, "AlterClientQuotas: {e:?}");
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
            "the broker did not describe the quota within {WAIT:?}"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

/// Sends a link Produce (acks=all) of `records` to partition 0.
fn link_produce(raw: &mut RawClient, records: Bytes) -> Result<i32> {
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    raw.send(ApiKey::Produce, PRODUCE_VERSION, LINK_CLIENT, &request)
}

/// (error code, base offset, message) of the answer to `correlation`.
fn produce_result(raw: &mut RawClient, correlation: i32) -> Result<(i16, i64, String)> {
    let mut frame = response(raw, ApiKey::Produce, PRODUCE_VERSION, correlation)?;
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

fn log(broker: &KafkaCluster) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in broker.segment_files(TOPIC, 0)? {
        out.extend(tools::dump_log_segments(&file, false)?);
    }
    Ok(out)
}

#[test]
fn a_producer_with_a_batch_held_at_the_broker_is_not_evicted() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC, 1)])?;
    let source = ClusterId::from_bytes(*b"inflight-source!");
    let proxy = ProxyProcess::with_link_x(
        &broker.bootstrap(),
        &source,
        TOPIC,
        &[("PRODUCER_STATE_MAX_ENTRIES", "1")],
    )?;
    let logs = || tools::tail_str(&proxy.logs(), 40);
    set_produce_quota(&broker, LINK_CLIENT, QUOTA)?;

    let mut link = RawClient::connect(&proxy.bootstrap)?;
    let held = hold_a_batch(&proxy, &mut link)?;

    // A new producer while the only producer held has a batch in flight.
    let mut other = RawClient::connect(&proxy.bootstrap)?;
    let c = link_produce(&mut other, record_batch_at(8, 0, &["new producer"]))?;
    let new_producer = produce_result(&mut other, c)?;

    // Producer 7 retries the held batch on a new connection, then again
    // once the held attempt is answered.
    let mut retry = RawClient::connect(&proxy.bootstrap)?;
    let c = link_produce(&mut retry, record_batch_at(7, 1, &["held"]))?;
    let first_retry = produce_result(&mut retry, c)?;
    let held = produce_result(&mut link, held)?;
    ensure!(held.0 == NONE, "the held batch: {held:?}\n{}", logs());
    let c = link_produce(&mut retry, record_batch_at(7, 1, &["held"]))?;
    let again = produce_result(&mut retry, c)?;

    let batches = log(&broker)?;
    let held_copies: Vec<&DumpedBatch> = batches
        .iter()
        .filter(|b| b.base_sequence == 1 && b.producer_id < -1)
        .collect();
    assert_eq!(
        held_copies.len(),
        1,
        "the held batch is in the log once: {batches:?}\nnew producer: {new_producer:?}, first retry: {first_retry:?}, held: {held:?}, again: {again:?}"
    );
    assert_eq!(held_copies[0].base_offset, held.1);
    assert_eq!(
        batches.len(),
        2,
        "the large batch and the held one, nothing of producer 8: {batches:?}"
    );
    assert_eq!(
        new_producer.0,
        NOT_ENOUGH_REPLICAS,
        "the new producer is refused retriable: {new_producer:?}\n{}",
        logs()
    );
    assert!(new_producer.2.contains("in flight"), "{new_producer:?}");
    assert!(
        first_retry.0 == REQUEST_TIMED_OUT || (first_retry.0, first_retry.1) == (NONE, held.1),
        "a retry while the batch is in flight waits for it, never appends: {first_retry:?}, held {held:?}"
    );
    assert_eq!(
        (again.0, again.1),
        (NONE, held.1),
        "the retry after the held batch was appended is its duplicate"
    );
    assert!(
        proxy.metric(
            "kafka_mirror_proxy_mirror_partitions_refused_total{link=\"x\",reason=\"producer_state_full\"}"
        )? >= 1
    );
    let full_lines = proxy
        .logs()
        .lines()
        .filter(|l| l.contains("mirrored producer state full"))
        .count();
    assert_eq!(full_lines, 1, "logged once\n{}", logs());
    Ok(())
}

/// Producer 7's large batch throttles the `link` connection (the produce
/// quota set); its next batch (sequence 1) is then held, unread, at the
/// broker. Returns the held request's correlation id once the proxy has
/// forwarded it (begun: in flight).
fn hold_a_batch(proxy: &ProxyProcess, link: &mut RawClient) -> Result<i32> {
    let big = "x".repeat(THROTTLING_BYTES);
    let c = link_produce(link, record_batch_at(7, 0, &[&big]))?;
    let (code, _, message) = produce_result(link, c)?;
    ensure!(
        code == NONE,
        "the large batch: {code} {message}\n{}",
        tools::tail_str(&proxy.logs(), 40)
    );
    let held = link_produce(link, record_batch_at(7, 1, &["held"]))?;
    let deadline = Instant::now() + WAIT;
    while proxy.metric("kafka_mirror_proxy_requests_total{api_key=\"0\"}")? < 2 {
        ensure!(
            Instant::now() < deadline,
            "the held batch never reached the proxy"
        );
        thread::sleep(Duration::from_millis(20));
    }
    Ok(held)
}

/// Close `s` with a reset (SO_LINGER 0), as a killed client would; every
/// other handle on the socket must be closed already.
fn reset(s: TcpStream) -> Result<()> {
    linger_zero(&s)?;
    drop(s);
    Ok(())
}

/// A link Produce that waits in the proxy's Produce filter (a retry of a
/// batch still in flight on another connection waits up to 10 s for that
/// attempt's outcome, holding its frame) gives its memory back at once when
/// its client resets the connection, and nothing of it is forwarded after:
/// the proxy appends nothing its client is no longer there to hear about.
///
/// Producer 7's batch is held at the broker as above (throttled link
/// connection, about 15 s). Another connection of the link sends one
/// request with producer 7's retry of that batch (partition 0) and a new
/// batch of producer 9 (partition 1): nothing of it may begin while the
/// retry is in flight, so it waits, its frame charged to the request
/// budget. Its client resets 1 s in. Before the fix the wait went on: the
/// budget was held until the wait ended, and then the request was forwarded
/// to the broker over the dead client's session and producer 9's batch
/// appended.
#[test]
fn a_produce_waiting_in_the_filter_ends_when_its_client_resets() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC, 2)])?;
    let source = ClusterId::from_bytes(*b"inflight-source!");
    let proxy = ProxyProcess::with_link_x(&broker.bootstrap(), &source, TOPIC, &[])?;
    let logs = || tools::tail_str(&proxy.logs(), 40);
    let gauge = "kafka_mirror_proxy_buffered_request_bytes";
    set_produce_quota(&broker, LINK_CLIENT, QUOTA)?;

    let mut link = RawClient::connect(&proxy.bootstrap)?;
    let held = hold_a_batch(&proxy, &mut link)?;
    ensure!(proxy.metric(gauge)? == 0, "the held batch was written on");

    // The retry of the held batch, with a new batch of another producer.
    let (mut retry, socket) = RawClient::connect_with_socket(&proxy.bootstrap)?;
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
            .with_partition_data(vec![
                PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(record_batch_at(7, 1, &["held"]))),
                PartitionProduceData::default()
                    .with_index(1)
                    .with_records(Some(record_batch_at(9, 0, &["dropped"]))),
            ])]);
    retry.send(ApiKey::Produce, PRODUCE_VERSION, LINK_CLIENT, &request)?;
    let sent = Instant::now();
    let deadline = sent + WAIT;
    let mut waiting = 0;
    while waiting == 0 {
        ensure!(
            Instant::now() < deadline,
            "the retry never held its frame\n{}",
            logs()
        );
        waiting = proxy.metric(gauge)?;
        thread::sleep(Duration::from_millis(20));
    }
    // Well into the wait (the filter rebuilds the partitions for this new
    // connection first, then waits for the attempt in flight).
    thread::sleep(Duration::from_secs(1));
    ensure!(
        proxy.metric(gauge)? > 0,
        "the retry was answered before its client reset (the held batch settled too soon?)\n{}",
        logs()
    );
    drop(retry);
    let reset_at = Instant::now();
    reset(socket)?;
    // Back well before the wait's own end (10 s after it began).
    let bound = Duration::from_secs(4);
    while proxy.metric(gauge)? != 0 {
        ensure!(
            reset_at.elapsed() < bound,
            "{} bytes of the request budget still held {bound:?} after the client reset while its Produce waited in the filter\n{}",
            proxy.metric(gauge)?,
            logs()
        );
        thread::sleep(Duration::from_millis(20));
    }
    let freed = reset_at.elapsed();
    let bootstrap = "kafka_mirror_proxy_client_connections_active{listener=\"bootstrap\"}";
    while proxy.metric(bootstrap)? != 1 {
        ensure!(
            reset_at.elapsed() < bound,
            "the reset client's connection is still open"
        );
        thread::sleep(Duration::from_millis(20));
    }

    // The held batch is appended once its throttle ends; the dropped
    // request's wait would have ended by then too (10 s), and it would
    // have been forwarded.
    let held = produce_result(&mut link, held)?;
    ensure!(held.0 == NONE, "the held batch: {held:?}\n{}", logs());
    let past_wait = sent + Duration::from_secs(15);
    thread::sleep(past_wait.saturating_duration_since(Instant::now()));
    let end = runtime()?.block_on(client(&broker.bootstrap()).list_offset(
        TOPIC,
        1,
        OffsetSpec::Latest,
    ))?;
    ensure!(
        end.offset == 0,
        "partition 1 ends at {}: the reset client's request was forwarded\n{}",
        end.offset,
        logs()
    );
    eprintln!(
        "{waiting} bytes held while the retry waited in the filter; back to 0 {freed:?} after its client reset; partition 1 empty {:?} after the request was sent",
        sent.elapsed()
    );
    Ok(())
}
