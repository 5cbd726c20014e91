//! The proxy's promises tried as a hostile or careless client would try
//! them, against a real broker, through the proxy binary: each test sends
//! the request that would break a promise and checks that it holds.

mod support;

use std::collections::HashMap;

use anyhow::{bail, ensure, Context, Result};
use bytes::Bytes;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use uuid::Uuid;

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{record_batch, RawClient};

const LOCAL_CLIENT: &str = "local-app";
const NONE: i16 = 0;
const POLICY_VIOLATION: i16 = 44;
const UNKNOWN_TOPIC_ID: i16 = 100;

/// A proxy whose link `x` mirrors topic `m`.
fn proxy(broker: &KafkaCluster) -> Result<ProxyProcess> {
    let source = ClusterId::from_bytes(*b"hostile-source!!");
    ProxyProcess::with_link_x(&broker.bootstrap(), &source, "m", &[])
}

/// Every topic's id, asked of `bootstrap` (the broker itself, so that no
/// Metadata response passes through the proxy).
fn topic_ids(bootstrap: &str, topics: &[&str]) -> Result<HashMap<String, Uuid>> {
    let mut c = RawClient::connect(bootstrap)?;
    let request = MetadataRequest::default().with_topics(Some(
        topics
            .iter()
            .map(|t| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(t.to_string()))))
            })
            .collect(),
    ));
    let correlation = c.send(ApiKey::Metadata, 12, "test", &request)?;
    let mut frame = c.recv_frame()?.context("no Metadata response")?;
    let header = ResponseHeader::decode(&mut frame, ApiKey::Metadata.response_header_version(12))?;
    ensure!(header.correlation_id == correlation, "correlation");
    let r = MetadataResponse::decode(&mut frame, 12)?;
    Ok(r.topics
        .iter()
        .filter_map(|t| Some((t.name.as_ref()?.0.to_string(), t.topic_id)))
        .collect())
}

/// A Produce v13 (topics named by id) of `records` to partition 0 of
/// `topic_id`, on `c`: the (error code, message) of the partition.
fn produce_by_id(c: &mut RawClient, topic_id: Uuid, records: Bytes) -> Result<(i16, String)> {
    let version = 13;
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_topic_id(topic_id)
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(records))])]);
    let correlation = c.send(ApiKey::Produce, version, LOCAL_CLIENT, &request)?;
    let Some(mut frame) = c.recv_frame()? else {
        bail!("connection closed instead of a Produce response");
    };
    let header =
        ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(version))?;
    ensure!(header.correlation_id == correlation, "correlation");
    let r = ProduceResponse::decode(&mut frame, version)?;
    let p = r
        .responses
        .first()
        .and_then(|t| t.partition_responses.first())
        .context("no partition in the response")?;
    let message = p.error_message.as_ref().map(|m| m.to_string());
    Ok((p.error_code, message.unwrap_or_default()))
}

/// Records on disk in `topic`'s partition 0, as DumpLogSegments reads them.
fn records_on_disk(broker: &KafkaCluster, topic: &str) -> Result<i64> {
    let mut n = 0;
    for file in broker.segment_files(topic, 0)? {
        n += tools::dump_log_segments(&file, false)?
            .iter()
            .map(|b| b.count)
            .sum::<i64>();
    }
    Ok(n)
}

/// Produce v13 names topics by id. An id the proxy never saw in a Metadata
/// response (a client that learnt it elsewhere, or before the proxy
/// restarted) must not make a read-only topic writable: the proxy asks the
/// broker, and refuses what stays unknown with a retriable error.
#[test]
fn a_produce_by_an_id_the_proxy_never_saw_does_not_write_a_read_only_topic() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1), ("plain", 1)])?;
    let p = proxy(&broker)?;
    let ids = topic_ids(&broker.bootstrap(), &["m", "plain"])?;
    let id = |t: &str| ids.get(t).copied().context("topic id");

    // A fresh connection: nothing of the topics has passed through the proxy.
    let mut c = RawClient::connect(&p.bootstrap)?;
    let (code, message) = produce_by_id(&mut c, id("m")?, record_batch(-1, &["forged"]))?;
    ensure!(
        code == POLICY_VIOLATION && message.contains("link 'x'"),
        "a write by id to the mirrored topic: {code} {message:?}\n{}",
        tools::tail_str(&p.logs(), 20)
    );
    // Other topics by id are written as before.
    let (code, message) = produce_by_id(&mut c, id("plain")?, record_batch(-1, &["fine"]))?;
    ensure!(
        code == NONE,
        "a write by id to a plain topic: {code} {message:?}"
    );
    // An id no topic has: UNKNOWN_TOPIC_ID, which a client retries after
    // refreshing its metadata.
    let (code, _) = produce_by_id(&mut c, Uuid::from_u128(0xdead), record_batch(-1, &["x"]))?;
    assert_eq!(code, UNKNOWN_TOPIC_ID);

    assert_eq!(records_on_disk(&broker, "m")?, 0, "nothing landed in m");
    assert_eq!(records_on_disk(&broker, "plain")?, 1);
    Ok(())
}

/// Send `body` as `api` v`version` on `c` and decode the answer.
fn call<Req: kafka_protocol::protocol::Encodable, Resp: Decodable>(
    c: &mut RawClient,
    api: ApiKey,
    version: i16,
    body: &Req,
) -> Result<Resp> {
    let correlation = c.send(api, version, LOCAL_CLIENT, body)?;
    let Some(mut frame) = c.recv_frame()? else {
        bail!("connection closed instead of a {api:?} response");
    };
    let header = ResponseHeader::decode(&mut frame, api.response_header_version(version))?;
    ensure!(header.correlation_id == correlation, "correlation");
    Resp::decode(&mut frame, version)
}

/// Every instance applies what the state topic holds: a client that could
/// write it could switch a link to STOPPED (and its topics writable) or
/// forge a mapping. Through the proxy, no client request may write,
/// delete, grow or reconfigure it; requests naming other topics pass.
#[test]
fn a_client_cannot_write_delete_grow_or_reconfigure_the_state_topic() -> Result<()> {
    use kafka_protocol::messages::{
        alter_configs_request, delete_records_request, delete_topics_request,
        incremental_alter_configs_request, AlterConfigsRequest, AlterConfigsResponse,
        CreatePartitionsRequest, CreatePartitionsResponse, DeleteRecordsRequest,
        DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
        IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
    };
    use support::wire::partition_result;
    const STATE: &str = "__mirror_state";
    const DENIED: i16 = 29; // TOPIC_AUTHORIZATION_FAILED
    let name = |t: &str| TopicName(StrBytes::from_string(t.to_string()));

    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(
        &broker.bootstrap(),
        &[("m", 1), ("plain", 1), ("doomed", 1)],
    )?;
    let p = proxy(&broker)?;
    let state_id = topic_ids(&broker.bootstrap(), &[STATE])?
        .get(STATE)
        .copied()
        .context("the state topic's id")?;
    let mut c = RawClient::connect(&p.bootstrap)?;

    // Produce: the forged records never reach the log.
    let before = records_on_disk(&broker, STATE)?;
    let r = c.produce(LOCAL_CLIENT, STATE, 0, record_batch(-1, &["forged"]))?;
    let (code, message) = partition_result(&r);
    ensure!(
        code == DENIED
            && message
                .as_deref()
                .is_some_and(|m| m.contains("state topic")),
        "a Produce to the state topic: {code} {message:?}"
    );
    assert_eq!(records_on_disk(&broker, STATE)?, before, "nothing appended");
    // By id too (v13).
    let (code, _) = produce_by_id(&mut c, state_id, record_batch(-1, &["forged"]))?;
    assert_eq!(code, DENIED);

    // DeleteRecords.
    let delete_records = |topic: &str| {
        DeleteRecordsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![delete_records_request::DeleteRecordsTopic::default()
                .with_name(name(topic))
                .with_partitions(vec![
                    delete_records_request::DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(-1),
                ])])
    };
    let r: DeleteRecordsResponse = call(&mut c, ApiKey::DeleteRecords, 2, &delete_records(STATE))?;
    assert_eq!(r.topics[0].partitions[0].error_code, DENIED, "{r:?}");
    let r: DeleteRecordsResponse =
        call(&mut c, ApiKey::DeleteRecords, 2, &delete_records("plain"))?;
    assert_eq!(r.topics[0].partitions[0].error_code, NONE, "{r:?}");

    // CreatePartitions.
    let grow = |topic: &str| {
        CreatePartitionsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![
            kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic::default()
                .with_name(name(topic))
                .with_count(8)
                .with_assignments(None),
        ])
    };
    let r: CreatePartitionsResponse = call(&mut c, ApiKey::CreatePartitions, 3, &grow(STATE))?;
    assert_eq!(r.results[0].error_code, DENIED, "{r:?}");
    let r: CreatePartitionsResponse = call(&mut c, ApiKey::CreatePartitions, 3, &grow("plain"))?;
    assert_eq!(r.results[0].error_code, NONE, "{r:?}");

    // AlterConfigs and IncrementalAlterConfigs.
    let alter = AlterConfigsRequest::default().with_resources(vec![
        alter_configs_request::AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str(STATE))
            .with_configs(vec![alter_configs_request::AlterableConfig::default()
                .with_name(StrBytes::from_static_str("cleanup.policy"))
                .with_value(Some(StrBytes::from_static_str("delete")))]),
    ]);
    let r: AlterConfigsResponse = call(&mut c, ApiKey::AlterConfigs, 2, &alter)?;
    assert_eq!(r.responses[0].error_code, DENIED, "{r:?}");
    let incremental = |topic: &str| {
        IncrementalAlterConfigsRequest::default().with_resources(vec![
            incremental_alter_configs_request::AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.to_string()))
                .with_configs(vec![
                    incremental_alter_configs_request::AlterableConfig::default()
                        .with_name(StrBytes::from_static_str("retention.ms"))
                        .with_config_operation(0)
                        .with_value(Some(StrBytes::from_static_str("1"))),
                ]),
        ])
    };
    let r: IncrementalAlterConfigsResponse = call(
        &mut c,
        ApiKey::IncrementalAlterConfigs,
        1,
        &incremental(STATE),
    )?;
    assert_eq!(r.responses[0].error_code, DENIED, "{r:?}");
    let r: IncrementalAlterConfigsResponse = call(
        &mut c,
        ApiKey::IncrementalAlterConfigs,
        1,
        &incremental("plain"),
    )?;
    assert_eq!(r.responses[0].error_code, NONE, "{r:?}");

    // DeleteTopics by name (v5) and by id (v6).
    let by_name = |topic: &str| {
        DeleteTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topic_names(vec![name(topic)])
    };
    let r: DeleteTopicsResponse = call(&mut c, ApiKey::DeleteTopics, 5, &by_name(STATE))?;
    assert_eq!(r.responses[0].error_code, DENIED, "{r:?}");
    let by_id = DeleteTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![
            delete_topics_request::DeleteTopicState::default().with_topic_id(state_id)
        ]);
    let r: DeleteTopicsResponse = call(&mut c, ApiKey::DeleteTopics, 6, &by_id)?;
    assert_eq!(r.responses[0].error_code, DENIED, "{r:?}");
    let r: DeleteTopicsResponse = call(&mut c, ApiKey::DeleteTopics, 5, &by_name("doomed"))?;
    assert_eq!(r.responses[0].error_code, NONE, "{r:?}");

    // The state topic is whole, the link still read-only.
    ensure!(
        topic_ids(&broker.bootstrap(), &[STATE])?.get(STATE) == Some(&state_id),
        "the state topic is gone"
    );
    let (_, links) = p.admin_get("/links/x")?;
    ensure!(links.contains("MIRRORING"), "{links}");
    assert_eq!(
        p.metric("kafka_mirror_proxy_state_topic_requests_refused_total{api_key=\"0\"}")?,
        2
    );
    Ok(())
}

/// The admin API reads a request's `wait` before the bearer token is
/// checked (to bound the request's time): a number of seconds past what a
/// duration holds must not panic there, with or without a token.
#[test]
fn an_absurd_failover_wait_is_cut_not_a_panic_and_the_token_is_still_asked() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let source = ClusterId::from_bytes(*b"hostile-source!!").to_string();
    let p = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
            ("LINK_X_TOPICS", "m"),
            ("ADMIN_TOKEN", "s3cret-admin-token"),
        ],
    )?;
    let send = |method: &str, path: &str, auth: &str| -> Result<String> {
        let answer = support::http::request(
            &p.admin,
            method,
            path,
            auth,
            "",
            std::time::Duration::from_secs(30),
        )?;
        Ok(answer.text)
    };
    let failover = "/links/x/failover?wait=1e30";
    let answer = send("POST", failover, "")?;
    ensure!(
        answer.starts_with("HTTP/1.1 401"),
        "without a token: {answer}"
    );
    let answer = send("POST", failover, "Authorization: Bearer wrong\r\n")?;
    ensure!(
        answer.starts_with("HTTP/1.1 401"),
        "with a wrong token: {answer}"
    );
    ensure!(
        !p.logs().contains("panicked"),
        "{}",
        tools::tail_str(&p.logs(), 20)
    );
    // The link was not failed over by the refused requests.
    let answer = send(
        "GET",
        "/links/x",
        "Authorization: Bearer s3cret-admin-token\r\n",
    )?;
    ensure!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("MIRRORING"),
        "{answer}"
    );
    Ok(())
}

/// One Produce v9 of `entries` partition entries of `topic` (null records)
/// and one real batch to partition 0 of `other`, framed, and its size.
fn many_entries(client_id: &str, topic: &str, entries: i32, other: &str) -> Result<Vec<u8>> {
    use kafka_protocol::messages::RequestHeader;
    use kafka_protocol::protocol::Encodable;
    let request = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(
                    (0..entries)
                        .map(|i| PartitionProduceData::default().with_index(i))
                        .collect(),
                ),
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(other.to_string())))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(record_batch(-1, &["fine"])))]),
        ]);
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Produce as i16)
        .with_request_api_version(9)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut buf = bytes::BytesMut::new();
    header.encode(&mut buf, ApiKey::Produce.request_header_version(9))?;
    request.encode(&mut buf, 9)?;
    let mut framed = (buf.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&buf);
    Ok(framed)
}

/// A request the proxy answers itself costs memory and log lines in
/// proportion to the request, not per entry times a message: one Produce
/// of 200,000 partition entries (HOSTILE_ENTRIES) to a read-only topic plus
/// one partition of another topic, and the same on the link's client id
/// to a topic the link does not mirror. Each is answered (the other
/// topic's batch written), the proxy's peak memory grows in proportion to
/// the request (about 18 times it for 200,000 entries, 13 times for
/// 2,000,000; e872c55 grew 165 times it and took minutes), and the refusal is one log
/// line (e872c55: one per entry).
#[test]
fn a_request_of_many_entries_costs_in_proportion_to_its_bytes() -> Result<()> {
    let entries: i32 = std::env::var("HOSTILE_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200_000);
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1), ("plain", 1)])?;
    let p = proxy(&broker)?;
    for (client_id, topic, line) in [
        (LOCAL_CLIENT, "m", "refused a local write"),
        ("mirror-x", "plain", "refused mirrored partitions"),
    ] {
        let framed = many_entries(client_id, topic, entries, "plain")?;
        let before_kib = p.status_kb("VmHWM")?;
        let lines_before = p.logs().matches(line).count();
        let started = std::time::Instant::now();
        let mut c = RawClient::connect(&p.bootstrap)?;
        c.send_raw(&framed)?;
        let answer = c
            .recv_frame()?
            .context("no answer: the connection closed")?;
        let took = started.elapsed();
        let grown_kib = p.status_kb("VmHWM")?.saturating_sub(before_kib);
        let lines = p.logs().matches(line).count() - lines_before;
        eprintln!(
            "{client_id} -> {topic}: {entries} entries, request {} KiB, answer {} KiB, peak RSS +{grown_kib} KiB, {lines} log line(s), {} ms",
            framed.len() / 1024,
            answer.len() / 1024,
            took.as_millis()
        );
        let mut frame = answer;
        let header =
            ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(9))?;
        ensure!(header.correlation_id == 1, "correlation");
        let r = ProduceResponse::decode(&mut frame, 9)?;
        let answered: usize = r
            .responses
            .iter()
            .map(|t| t.partition_responses.len())
            .sum();
        assert_eq!(answered, entries as usize + 1, "every entry answered");
        let plain = r.responses.iter().find(|t| {
            t.name.0.as_str() == "plain"
                && t.partition_responses.iter().any(|p| p.error_code == NONE)
        });
        ensure!(
            plain.is_some() || topic == "plain",
            "the other topic's batch was written: {:?}",
            r.responses.len()
        );
        ensure!(lines == 1, "{lines} log lines for one request");
        let request_kib = framed.len() as u64 / 1024;
        ensure!(
            grown_kib <= 24 * request_kib + 16 * 1024,
            "peak RSS grew {grown_kib} KiB for a request of {request_kib} KiB"
        );
    }
    Ok(())
}

/// A write that does not pass through the proxy cannot be stopped by it
/// (that is the state topic's ACLs' job), but what every instance applies
/// is checked: an origin record whose mapped PID is not the one its salt
/// gives (here a plain producer id, 5) claims nothing, is counted and
/// logged, and the link's batches of that origin are mapped as before.
#[test]
fn a_forged_mapping_written_around_the_proxy_claims_nothing() -> Result<()> {
    use kafka_mirror_proxy::mirror::state_records::{OriginKey, OriginValue, StateRecord};
    use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};
    const STATE: &str = "__mirror_state";
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let p = proxy(&broker)?;
    let id = topic_ids(&broker.bootstrap(), &["m"])?
        .get("m")
        .copied()
        .context("topic id of m")?;
    let forged = StateRecord::Origin(
        OriginKey {
            topic_id: id,
            partition: 0,
            source: ClusterId::from_bytes(*b"hostile-source!!"),
            original_pid: 7,
        },
        Some(OriginValue {
            mapped_pid: 5,
            salt: 0,
            claim_offset: -1,
            last_seen_ms: 1_700_000_000_000,
        }),
    );
    let (key, value) = (forged.encode_key(), forged.encode_value());
    let batch = build(
        &NewBatch::NO_PRODUCER,
        &[NewRecord {
            key: Some(&key),
            value: value.as_deref(),
            headers: &[],
            timestamp: 1_700_000_000_000,
        }],
    )?;
    let rt = support::crate_client::runtime()?;
    let client = support::crate_client::client(&broker.bootstrap());
    rt.block_on(client.produce(STATE, 0, Bytes::from(batch)))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while p.metric("kafka_mirror_proxy_state_records_skipped_total")? < 1 {
        ensure!(
            std::time::Instant::now() < deadline,
            "the forged record was not skipped:\n{}",
            tools::tail_str(&p.logs(), 20)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let mut c = RawClient::connect(&p.bootstrap)?;
    let r = c.produce("mirror-x", "m", 0, record_batch(7, &["mirrored"]))?;
    let (code, message) = support::wire::partition_result(&r);
    ensure!(code == NONE, "the link's batch: {code} {message:?}");
    let mut pids = Vec::new();
    for file in broker.segment_files("m", 0)? {
        pids.extend(
            tools::dump_log_segments(&file, false)?
                .iter()
                .map(|b| b.producer_id),
        );
    }
    ensure!(
        pids.len() == 1 && pids[0] < -1,
        "the link's batch was mapped to {pids:?}, not into the link's region"
    );
    ensure!(p.logs().contains("skipped a state record"), "logged");
    Ok(())
}

/// A client chooses its topic names: one with a newline must not forge a
/// line of the proxy's text log. The link's client id writing a topic the
/// link does not mirror is refused and logged, with the name.
#[test]
fn a_topic_name_with_a_newline_does_not_forge_a_log_line() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let p = proxy(&broker)?;
    let forged = "2026-12-03T00:00:00.000000Z  INFO kafka_mirror_proxy: FORGED";
    let topic = format!("plain\n{forged}\r\n{forged}");
    let mut c = RawClient::connect(&p.bootstrap)?;
    for client_id in ["mirror-x", LOCAL_CLIENT] {
        let r = c.produce(client_id, &topic, 0, record_batch(5, &["a"]))?;
        let (code, _) = support::wire::partition_result(&r);
        ensure!(
            code != NONE,
            "{client_id}: a write to {topic:?} was accepted"
        );
    }
    // The link's refusal is logged once; wait for it, then look at every line.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let logged = |l: &str| {
        l.contains("refused mirrored partitions") || l.contains("refused a mirrored partition")
    };
    while !logged(&p.logs()) {
        ensure!(
            std::time::Instant::now() < deadline,
            "no log line for the refusal:\n{}",
            tools::tail_str(&p.logs(), 20)
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let logs = p.logs();
    let bad: Vec<&str> = logs
        .lines()
        .filter(|l| l.contains("FORGED") && !l.contains("refused"))
        .collect();
    ensure!(bad.is_empty(), "forged log lines: {bad:?}\n{logs}");
    Ok(())
}

/// A link without TLS_SUBJECT is its client id alone: any client that sets
/// it acts as the replicator. The proxy says so at start, naming the link.
#[test]
fn a_link_without_a_certificate_subject_is_warned_about_at_start() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let p = proxy(&broker)?;
    let logs = p.logs();
    let warned = logs
        .lines()
        .find(|l| l.contains("WARN") && l.contains("without a TLS client subject"));
    ensure!(
        warned.is_some_and(|l| l.contains("\"x\"") || l.contains("link=x")),
        "no WARN naming link x:\n{}",
        tools::tail_str(&logs, 20)
    );
    // With the call to set TLS_SUBJECT in it.
    ensure!(
        warned.is_some_and(|l| l.contains("MIRROR_PROXY_LINK_X_TLS_SUBJECT")),
        "{warned:?}"
    );
    Ok(())
}

/// A Produce whose transactional id announces a length near `u64::MAX`
/// (an unsigned varint of ten bytes) must be refused as malformed, not
/// overflow the arithmetic that looks for `acks` behind it (a panic in a
/// debug build of e872c55). The proxy goes on serving.
#[test]
fn a_transactional_id_length_near_u64_max_is_malformed_not_a_panic() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("plain", 1)])?;
    let p = proxy(&broker)?;
    let client_id = LOCAL_CLIENT.as_bytes();
    let mut body = vec![0, 0, 0, 9, 0, 0, 0, 1]; // Produce v9, correlation 1
    body.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
    body.extend_from_slice(client_id);
    body.push(0); // no tagged fields
                  // transactional_id: a length that ends 1 byte short of usize::MAX once
                  // added to its place (the ten-byte varint ends at body.len() + 10), so
                  // the 2 bytes of acks after it overflow; then acks, timeout, no topics.
    let end = body.len() as u64 + 10;
    let mut len_plus_one = u64::MAX - end;
    for _ in 0..9 {
        body.push((len_plus_one as u8 & 0x7f) | 0x80);
        len_plus_one >>= 7;
    }
    body.push(len_plus_one as u8);
    body.extend_from_slice(&[0xff, 0xff, 0, 0, 0x75, 0x30, 1, 0]);
    let mut framed = (body.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&body);
    let mut c = RawClient::connect(&p.bootstrap)?;
    c.send_raw(&framed)?;
    // Closed (malformed) or answered, but never left hanging.
    let answer = c.recv_frame();
    ensure!(
        matches!(answer, Ok(None) | Err(_)),
        "a response to a malformed request: {answer:?}"
    );
    // The proxy still serves, and nothing panicked.
    let mut again = RawClient::connect(&p.bootstrap)?;
    let r = again.produce(LOCAL_CLIENT, "plain", 0, record_batch(-1, &["after"]))?;
    let (code, message) = support::wire::partition_result(&r);
    ensure!(
        code == NONE,
        "after the crafted request: {code} {message:?}"
    );
    let logs = p.logs();
    ensure!(
        !logs.contains("panicked"),
        "the proxy panicked:\n{}",
        tools::tail_str(&logs, 20)
    );
    Ok(())
}
