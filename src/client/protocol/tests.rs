use super::*;

use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::ResponseHeader;
use kafka_protocol::messages::{ApiKey, RequestHeader};

const TOPIC_ID: Uuid = Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);

fn to_t0() -> PartitionRef<'static> {
    PartitionRef {
        topic: "t",
        topic_id: TOPIC_ID,
        partition: 0,
        leader_epoch: 4,
    }
}

/// A response frame as a broker sends it (without the size prefix).
fn response_frame<T: Encodable>(api: ApiKey, version: i16, correlation_id: i32, body: &T) -> Bytes {
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut out, api.response_header_version(version))
        .expect("header");
    body.encode(&mut out, version).expect("body");
    out.freeze()
}

/// Decode a request frame the way a broker would, to check what was built.
fn request_body<T: Decodable>(frame: &BytesMut, api: ApiKey, version: i16) -> T {
    let mut buf = Bytes::copy_from_slice(frame);
    let header =
        RequestHeader::decode(&mut buf, api.request_header_version(version)).expect("header");
    assert_eq!(
        (header.request_api_key, header.request_api_version),
        (api as i16, version)
    );
    T::decode(&mut buf, version).expect("body")
}

#[test]
fn produce_request_v9_bytes() {
    let body = produce_request(9, &to_t0(), Bytes::from_static(b"xyz"), 1000).expect("build");
    let frame = encode_request(&body, 9, 7, "c").expect("encode");
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0, 0, 0, 9, 0, 0, 0, 7, 0, 1, b'c', 0, // header v2: Produce v9, correlation 7, "c", no tags
        0,                // transactional id: null
        0xFF, 0xFF,       // acks -1
        0, 0, 0x03, 0xE8, // timeout 1000 ms
        2,                // one topic
        2, b't',          // name "t"
        2,                // one partition
        0, 0, 0, 0,       // index 0
        4, b'x', b'y', b'z', // records, 3 bytes
        0, 0, 0,          // tagged fields: partition, topic, request
    ];
    assert_eq!(&frame[..], expected);
}

#[test]
fn metadata_request_v12_bytes() {
    let frame = encode_request(&metadata_request(Some(&["t".into()])), 12, 1, "c").expect("encode");
    #[rustfmt::skip]
    let expected: &[u8] = &[
        0, 3, 0, 12, 0, 0, 0, 1, 0, 1, b'c', 0, // header v2: Metadata v12
        2,                // one topic
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // topic id: none
        2, b't', 0,       // name "t", tagged fields
        0,                // allow auto topic creation: false
        0,                // include topic authorized operations: false
        0,                // tagged fields
    ];
    assert_eq!(&frame[..], expected);
    // Brokers only: an empty list, not null (which means every topic).
    let frame = encode_request(&metadata_request(Some(&[])), 12, 1, "c").expect("encode");
    assert_eq!(&frame[12..], &[1, 0, 0, 0]);
    let frame = encode_request(&metadata_request(None), 12, 1, "c").expect("encode");
    assert_eq!(&frame[12..], &[0, 0, 0, 0]);
}

/// ProduceResponse v9 for "t"-0 with the given error and message.
#[rustfmt::skip]
fn produce_response_v9(error: i16, base_offset: i64, message: Option<&str>) -> Vec<u8> {
    let mut f = vec![
        0, 0, 0, 7, 0,    // correlation 7, no tagged fields
        2, 2, b't',       // one topic, "t"
        2, 0, 0, 0, 0,    // one partition, index 0
    ];
    f.extend_from_slice(&error.to_be_bytes());
    f.extend_from_slice(&base_offset.to_be_bytes());
    f.extend_from_slice(&(-1i64).to_be_bytes()); // log append time
    f.extend_from_slice(&3i64.to_be_bytes());    // log start offset
    f.push(1);                                    // no record errors
    match message {
        None => f.push(0),
        Some(m) => {
            f.push(m.len() as u8 + 1);
            f.extend_from_slice(m.as_bytes());
        }
    }
    f.extend_from_slice(&[0, 0]);                 // tagged fields: partition, topic
    f.extend_from_slice(&[0, 0, 0, 0, 0]);        // throttle 0, tagged fields
    f
}

#[test]
fn produce_responses_are_interpreted() {
    let decode = |bytes: Vec<u8>| {
        decode_response::<ProduceRequest>(&Bytes::from(bytes), 9, 7, "b:1").expect("decode")
    };
    let r = decode(produce_response_v9(0, 42, None));
    assert_eq!(
        produce_result(&r, 9, &to_t0()).expect("result"),
        Produced::Appended {
            base_offset: 42,
            log_append_time_ms: -1,
            log_start_offset: 3
        }
    );
    let r = decode(produce_response_v9(87, -1, Some("no control")));
    assert_eq!(
        produce_result(&r, 9, &to_t0()).expect("result"),
        Produced::Refused {
            code: 87,
            message: Some("no control".into())
        }
    );
    // Retriable: an error for the retry loop, which refreshes the leader.
    let r = decode(produce_response_v9(6, -1, None));
    let e = produce_result(&r, 9, &to_t0()).expect_err("retriable");
    assert!(e.is_retriable() && e.invalidates_metadata(), "{e}");
    // A response about another partition is not taken for ours.
    let other = PartitionRef {
        partition: 1,
        ..to_t0()
    };
    assert!(produce_result(&r, 9, &other).is_err());
}

#[test]
fn responses_are_walked_before_they_are_decoded() {
    // A forged topic count (2^28) in an otherwise valid frame: the walk
    // refuses it, so kafka-protocol never reserves memory for it.
    let mut forged = produce_response_v9(0, 1, None);
    forged.splice(5..6, [0x80, 0x80, 0x80, 0x80, 0x01]);
    let e = decode_response::<ProduceRequest>(&Bytes::from(forged), 9, 7, "b:1")
        .expect_err("forged count");
    assert!(
        matches!(
            &e,
            ClientError::Malformed {
                api: "Produce",
                version: 9,
                cause,
                ..
            } if matches!(**cause, ReadError::Walk(_))
        ),
        "{e:?}"
    );
    assert!(crate::sync::error_chain(&e).contains("count"), "{e:?}");
    assert!(!e.is_retriable());

    // Trailing bytes, a truncated body, another correlation id.
    let mut trailing = produce_response_v9(0, 1, None);
    trailing.push(0);
    let mut short = produce_response_v9(0, 1, None);
    short.truncate(20);
    for (frame, correlation_id) in [
        (trailing, 7),
        (short, 7),
        (produce_response_v9(0, 1, None), 8),
    ] {
        let r = decode_response::<ProduceRequest>(&Bytes::from(frame), 9, correlation_id, "b:1");
        assert!(matches!(r, Err(ClientError::Malformed { .. })), "{r:?}");
    }
}

#[test]
fn versions_are_negotiated_within_what_both_sides_know() {
    let table =
        ApiVersionTable::from_response(&ApiVersionsResponse::default().with_api_keys(vec![
            ApiVersion::default()
                .with_api_key(0)
                .with_min_version(0)
                .with_max_version(13),
            ApiVersion::default()
                .with_api_key(1)
                .with_min_version(4)
                .with_max_version(99),
            ApiVersion::default()
                .with_api_key(2)
                .with_min_version(1)
                .with_max_version(11),
            ApiVersion::default()
                .with_api_key(3)
                .with_min_version(0)
                .with_max_version(3),
        ]));
    assert_eq!(table.pick::<ProduceRequest>("b:1").expect("produce"), 13);
    // Capped by the schema and by kafka-protocol (Fetch 18, ListOffsets 10).
    assert_eq!(table.pick::<FetchRequest>("b:1").expect("fetch"), 18);
    assert_eq!(table.pick::<ListOffsetsRequest>("b:1").expect("list"), 10);
    // Metadata below v4 would let a lookup create topics: refused.
    let e = table.pick::<MetadataRequest>("b:1").expect_err("too old");
    assert_eq!(
        e.to_string(),
        "broker b:1 supports Metadata versions 0..=3, the proxy 4..=13: no common version"
    );
    // An API the broker does not list.
    assert!(table.pick::<CreateTopicsRequest>("b:1").is_err());
}

#[test]
fn api_versions_falls_back_to_the_version_the_broker_names() {
    #[rustfmt::skip]
    let v0_unsupported: &[u8] = &[
        0, 0, 0, 1,       // correlation 1 (ApiVersions responses: header v0)
        0, 35,            // UNSUPPORTED_VERSION
        0, 0, 0, 1,       // one api key
        0, 18, 0, 0, 0, 3, // ApiVersions 0..3
    ];
    let answer = api_versions_answer(&Bytes::from_static(v0_unsupported), 4, 1, "b:1");
    assert_eq!(answer.expect("answer"), ApiVersionsAnswer::RetryAt(3));

    let body = ApiVersionsResponse::default().with_api_keys(vec![ApiVersion::default()
        .with_api_key(0)
        .with_min_version(3)
        .with_max_version(12)]);
    let frame = response_frame(ApiKey::ApiVersions, 3, 2, &body);
    let ApiVersionsAnswer::Table(table) = api_versions_answer(&frame, 3, 2, "b:1").expect("answer")
    else {
        panic!("a table")
    };
    assert_eq!(table.pick::<ProduceRequest>("b:1").expect("produce"), 12);
}

fn fetch_response(version: i16, records: &Bytes) -> FetchResponse {
    let mut topic =
        FetchableTopicResponse::default().with_partitions(vec![PartitionData::default()
            .with_partition_index(0)
            .with_high_watermark(10)
            .with_last_stable_offset(10)
            .with_log_start_offset(2)
            .with_records(Some(records.clone()))]);
    topic = if version >= 13 {
        topic.with_topic_id(TOPIC_ID)
    } else {
        topic.with_topic(TopicName(StrBytes::from_static_str("t")))
    };
    FetchResponse::default().with_responses(vec![topic])
}

#[test]
fn fetch_by_name_and_by_id_returns_the_records_untouched() {
    let records = Bytes::from_static(b"\x00\x01 any bytes, even a partial batch");
    for version in [4, 12, 13, 16, 18] {
        let req = fetch_request(version, &to_t0(), 5, 4096, 500).expect("build");
        let frame = encode_request(&req, version, 3, "c").expect("encode");
        let sent: FetchRequest = request_body(&frame, ApiKey::Fetch, version);
        let (topic, partition) = (&sent.topics[0], &sent.topics[0].partitions[0]);
        if version >= 13 {
            assert_eq!(topic.topic_id, TOPIC_ID);
        } else {
            assert_eq!(topic.topic.0.as_str(), "t");
        }
        assert_eq!(
            (partition.fetch_offset, partition.partition_max_bytes),
            (5, 4096)
        );
        assert_eq!(
            partition.current_leader_epoch,
            if version >= 9 { 4 } else { -1 }
        );
        assert_eq!(
            (sent.max_wait_ms, sent.max_bytes, sent.min_bytes),
            (500, 4096, 1)
        );

        let frame = response_frame(
            ApiKey::Fetch,
            version,
            3,
            &fetch_response(version, &records),
        );
        let r = decode_response::<FetchRequest>(&frame, version, 3, "b:1").expect("decode");
        let fetched = fetch_result(&r, version, &to_t0()).expect("result");
        assert_eq!(fetched.records, records, "v{version}");
        // A slice of the received frame, not a copy.
        let span = frame.as_ptr() as usize..frame.as_ptr() as usize + frame.len();
        assert!(span.contains(&(fetched.records.as_ptr() as usize)));
        // The log start offset is in the response from v5 on.
        let log_start = if version >= 5 { 2 } else { -1 };
        assert_eq!(
            (fetched.high_watermark, fetched.log_start_offset),
            (10, log_start)
        );
    }
}

/// read_committed goes out as isolation level 1, and the aborted
/// transactions of the answer come back (read_uncommitted: level 0, none).
#[test]
fn a_read_committed_fetch_returns_the_aborted_transactions() {
    use kafka_protocol::messages::fetch_response::AbortedTransaction as Wire;
    use kafka_protocol::messages::ProducerId;
    let records = Bytes::from_static(b"batches");
    for version in [4, 12, 18] {
        for (isolation, level) in [
            (IsolationLevel::ReadCommitted, 1),
            (IsolationLevel::ReadUncommitted, 0),
        ] {
            let req =
                fetch_request_isolated(version, &to_t0(), 5, 4096, 500, isolation).expect("build");
            let frame = encode_request(&req, version, 3, "c").expect("encode");
            let sent: FetchRequest = request_body(&frame, ApiKey::Fetch, version);
            assert_eq!(sent.isolation_level, level, "v{version}");
        }
        let mut response = fetch_response(version, &records);
        response.responses[0].partitions[0].last_stable_offset = 7;
        response.responses[0].partitions[0].aborted_transactions = Some(vec![
            Wire::default()
                .with_producer_id(ProducerId(9))
                .with_first_offset(6),
            Wire::default()
                .with_producer_id(ProducerId(4))
                .with_first_offset(2),
        ]);
        let frame = response_frame(ApiKey::Fetch, version, 3, &response);
        let r = decode_response::<FetchRequest>(&frame, version, 3, "b:1").expect("decode");
        let fetched = fetch_result(&r, version, &to_t0()).expect("result");
        assert_eq!(fetched.last_stable_offset, 7);
        assert_eq!(
            fetched.aborted_transactions,
            [
                AbortedTransaction {
                    producer_id: 9,
                    first_offset: 6
                },
                AbortedTransaction {
                    producer_id: 4,
                    first_offset: 2
                },
            ],
            "v{version}"
        );
    }
    // No list (read_uncommitted answers null): none.
    let frame = response_frame(ApiKey::Fetch, 12, 3, &fetch_response(12, &records));
    let r = decode_response::<FetchRequest>(&frame, 12, 3, "b:1").expect("decode");
    let fetched = fetch_result(&r, 12, &to_t0()).expect("result");
    assert!(fetched.aborted_transactions.is_empty());
}

#[test]
fn a_transactional_id_goes_into_the_produce_request() {
    for version in [3, 9, 12, 13] {
        let req =
            produce_request_transactional(version, &to_t0(), Bytes::new(), 1, Some("mirror-a"))
                .expect("build");
        let frame = encode_request(&req, version, 1, "c").expect("encode");
        let sent: ProduceRequest = request_body(&frame, ApiKey::Produce, version);
        assert_eq!(
            sent.transactional_id.as_ref().map(|t| t.0.as_str()),
            Some("mirror-a"),
            "v{version}"
        );
        let req = produce_request(version, &to_t0(), Bytes::new(), 1).expect("build");
        assert_eq!(req.transactional_id, None);
    }
}

#[test]
fn fetch_and_produce_by_id_need_an_id() {
    let no_id = PartitionRef {
        topic_id: Uuid::nil(),
        ..to_t0()
    };
    let e = fetch_request(13, &no_id, 0, 1, 0).expect_err("no id");
    assert_eq!(e.code(), Some(100));
    assert!(e.is_retriable() && e.invalidates_metadata());
    assert!(produce_request(13, &no_id, Bytes::new(), 1).is_err());
    assert!(produce_request(12, &no_id, Bytes::new(), 1).is_ok());
}

#[test]
fn list_offsets_requests_and_answers() {
    for (spec, timestamp) in [
        (OffsetSpec::Earliest, -2),
        (OffsetSpec::Latest, -1),
        (OffsetSpec::Timestamp(1_700_000_000_000), 1_700_000_000_000),
    ] {
        let req = list_offsets_request(10, &to_t0(), spec, 900);
        let frame = encode_request(&req, 10, 1, "c").expect("encode");
        let sent: ListOffsetsRequest = request_body(&frame, ApiKey::ListOffsets, 10);
        assert_eq!((sent.replica_id.0, sent.timeout_ms), (-1, 900));
        let p = &sent.topics[0].partitions[0];
        assert_eq!((p.timestamp, p.current_leader_epoch), (timestamp, 4));
    }
    // v1 has neither a leader epoch nor a timeout: both left out.
    let req = list_offsets_request(1, &to_t0(), OffsetSpec::Latest, 900);
    assert!(encode_request(&req, 1, 1, "c").is_ok());

    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    let r = |code: i16| {
        ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
            .with_name(TopicName(StrBytes::from_static_str("t")))
            .with_partitions(vec![ListOffsetsPartitionResponse::default()
                .with_partition_index(0)
                .with_error_code(code)
                .with_offset(17)
                .with_timestamp(-1)])])
    };
    let frame = response_frame(ApiKey::ListOffsets, 10, 9, &r(0));
    let decoded = decode_response::<ListOffsetsRequest>(&frame, 10, 9, "b:1").expect("decode");
    assert_eq!(
        list_offsets_result(&decoded, &to_t0()).expect("result"),
        ListedOffset {
            offset: 17,
            timestamp: -1
        }
    );
    let e = list_offsets_result(&r(75), &to_t0()).expect_err("epoch");
    assert!(e.is_retriable() && e.invalidates_metadata());
}

#[test]
fn create_topics_and_configs() {
    let topic = NewTopic {
        name: "__mirror_state".into(),
        partitions: 1,
        replication_factor: 3,
        configs: vec![("cleanup.policy".into(), "compact".into())],
    };
    let frame = encode_request(&create_topics_request(&topic, 5000), 7, 1, "c").expect("encode");
    let sent: CreateTopicsRequest = request_body(&frame, ApiKey::CreateTopics, 7);
    let t = &sent.topics[0];
    assert_eq!(
        (t.name.0.as_str(), t.num_partitions, t.replication_factor),
        ("__mirror_state", 1, 3)
    );
    assert_eq!(t.configs[0].name.as_str(), "cleanup.policy");
    assert_eq!(
        t.configs[0].value.as_ref().map(|v| v.as_str()),
        Some("compact")
    );
    assert_eq!(sent.timeout_ms, 5000);

    let answer = |code: i16| {
        CreateTopicsResponse::default().with_topics(vec![CreatableTopicResult::default()
            .with_name(TopicName(StrBytes::from_static_str("__mirror_state")))
            .with_topic_id(TOPIC_ID)
            .with_error_code(code)])
    };
    let frame = response_frame(ApiKey::CreateTopics, 7, 1, &answer(0));
    let r = decode_response::<CreateTopicsRequest>(&frame, 7, 1, "b:1").expect("decode");
    assert_eq!(
        create_topics_result(&r, "__mirror_state").expect("created"),
        Created::Created { topic_id: TOPIC_ID }
    );
    assert_eq!(
        create_topics_result(&answer(36), "__mirror_state").expect("exists"),
        Created::AlreadyExists
    );
    let e = create_topics_result(&answer(38), "__mirror_state").expect_err("bad rf");
    assert_eq!(e.code(), Some(38));
    assert!(!e.is_retriable());

    let frame = encode_request(
        &describe_topic_config_request("t", &["cleanup.policy"]),
        4,
        1,
        "c",
    )
    .expect("encode");
    let sent: DescribeConfigsRequest = request_body(&frame, ApiKey::DescribeConfigs, 4);
    assert_eq!(sent.resources[0].resource_type, 2);
    assert_eq!(sent.resources[0].resource_name.as_str(), "t");
}

#[test]
fn compacted_topic_rules() {
    let settings: Vec<(i16, i16)> = (0..6).map(compacted_topic_settings).collect();
    assert_eq!(settings, [(1, 1), (1, 1), (2, 2), (3, 2), (3, 2), (3, 2)]);
    assert!(is_compacted("compact"));
    assert!(is_compacted("delete,compact"));
    assert!(is_compacted("compact, delete"));
    assert!(!is_compacted("delete"));
    assert!(!is_compacted(""));
    assert!(!is_compacted("compacted"));
}
