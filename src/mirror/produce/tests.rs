//! Produce rewrite tests: requests encoded by `kafka-protocol` at every
//! version, rewritten, and decoded again by its CRC-checking decoder.

use super::*;
use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::RequestHeader;
use kafka_protocol::protocol::Decodable;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use regex::Regex;

use crate::mirror::link::{ControlBatchPolicy, Link};
use crate::mirror::pid::ClusterId;
use crate::wire::header::RequestHeaderPeek;

const CLUSTER: &str = "MkU3OEVBNTcwNTJENDM2Qk"; // hash 0x71720375
const MAPPED_5: i64 = -5136071999516311547;
const TOPIC_ID: Uuid = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);

// The functions under test, called as the filter calls them: the request
// indexed once, then planned from the index.

fn plan(
    frame: &Bytes,
    offset: usize,
    version: i16,
    link: &Link,
    names: &dyn Fn(Uuid) -> Option<Arc<str>>,
) -> Result<ProducePlan, ProduceError> {
    let index = index(frame, offset, version)?;
    Ok(super::plan(frame, &index, link, names))
}

fn plan_with(
    frame: &Bytes,
    offset: usize,
    version: i16,
    link: &Link,
    names: &dyn Fn(Uuid) -> Option<Arc<str>>,
    ids: &dyn Fn(&str) -> Option<Uuid>,
    origins: &dyn OriginLookup,
) -> Result<ProducePlan, ProduceError> {
    let index = index(frame, offset, version)?;
    Ok(super::plan_with(frame, &index, link, names, ids, origins))
}

fn refuse_all(
    frame: &Bytes,
    offset: usize,
    version: i16,
    refusal: Refusal,
    message: &str,
) -> Result<ProducePlan, ProduceError> {
    let index = index(frame, offset, version)?;
    Ok(super::refuse_all(frame, &index, refusal, message))
}

fn refuse_where(
    frame: &Bytes,
    offset: usize,
    version: i16,
    mut decide: impl FnMut(TopicKey<'_>) -> Option<(Refusal, String)>,
) -> Result<ProducePlan, ProduceError> {
    let index = index(frame, offset, version)?;
    Ok(super::refuse_where(frame, &index, |t, _| {
        decide(t).map(|(r, m)| (r, m.into()))
    }))
}

fn any_topic(
    frame: &Bytes,
    offset: usize,
    version: i16,
    pred: impl FnMut(TopicKey<'_>) -> bool,
) -> Result<bool, ProduceError> {
    let index = index(frame, offset, version)?;
    Ok(super::any_topic(frame, &index, pred))
}

/// `frame` (perhaps patched: the layout is the same) without `local`.
fn without_local_partitions(
    frame: &Bytes,
    offset: usize,
    version: i16,
    local: &[LocalPartition],
) -> Result<BytesMut, ProduceError> {
    let index = index(frame, offset, version)?;
    Ok(super::without_local_partitions(frame, &index, local))
}

fn link(control: ControlBatchPolicy) -> Link {
    Link::new(
        "east".into(),
        CLUSTER.parse::<ClusterId>().expect("cluster id"),
        "mirror-east".into(),
        vec![Regex::new("^(?:orders)$").expect("regex")],
        None,
        control,
    )
}

fn batch(pid: i64, control: bool, values: &[&str]) -> Bytes {
    let records: Vec<Record> = values
        .iter()
        .enumerate()
        .map(|(i, v)| Record {
            transactional: false,
            control,
            partition_leader_epoch: 0,
            producer_id: pid,
            producer_epoch: if pid >= 0 { 3 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            sequence: if pid >= 0 { 10 + i as i32 } else { -1 },
            timestamp: 1_700_000_000_000 + i as i64,
            key: Some(Bytes::from(format!("k{i}"))),
            value: Some(Bytes::from(v.to_string())),
            headers: Default::default(),
            delete_horizon: false,
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encode batch");
    buf.freeze()
}

/// (topic, partition, records) → a Produce request frame at `version`.
fn request(version: i16, client_id: &str, parts: &[(&str, i32, Bytes)]) -> Bytes {
    let mut topics: Vec<TopicProduceData> = Vec::new();
    for (topic, index, records) in parts {
        let data = PartitionProduceData::default()
            .with_index(*index)
            .with_records(Some(records.clone()));
        match topics.iter_mut().find(|t| t.name.0.as_str() == *topic) {
            Some(t) => t.partition_data.push(data),
            None => topics.push(
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_topic_id(if version >= 13 { TOPIC_ID } else { Uuid::nil() })
                    .with_partition_data(vec![data]),
            ),
        }
    }
    let body = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(topics);
    let header = RequestHeader::default()
        .with_request_api_key(0)
        .with_request_api_version(version)
        .with_correlation_id(42)
        .with_client_id(Some(StrBytes::from_string(client_id.into())));
    let mut out = BytesMut::new();
    header
        .encode(&mut out, ApiKey::Produce.request_header_version(version))
        .expect("header");
    body.encode(&mut out, version).expect("body");
    out.freeze()
}

fn body_offset(frame: &Bytes, version: i16) -> usize {
    RequestHeaderPeek::parse(frame)
        .expect("peek")
        .body_offset(frame, ApiKey::Produce.request_header_version(version))
        .expect("body offset")
}

/// The test's own decoder (trusted input: the tests' own encodings).
fn decode(frame: &Bytes, offset: usize, version: i16) -> Result<ProduceRequest, anyhow::Error> {
    let mut body = frame.slice(offset..);
    ProduceRequest::decode(&mut body, version)
}

fn names(id: Uuid) -> Option<std::sync::Arc<str>> {
    (id == TOPIC_ID).then(|| "orders".into())
}

fn rewrite(frame: Bytes, version: i16, link: &Link) -> (ProducePlan, Bytes) {
    let offset = body_offset(&frame, version);
    let plan = plan(&frame, offset, version, link, &names).expect("plan");
    let mut bytes = BytesMut::from(&frame[..]);
    plan.apply(&mut bytes).expect("apply");
    (plan, bytes.freeze())
}

/// Decode every batch of a request frame, verifying CRCs.
fn decoded_pids(frame: &Bytes, version: i16) -> Vec<(i64, Vec<String>)> {
    let offset = body_offset(frame, version);
    let request = decode(frame, offset, version).expect("decode");
    let mut out = Vec::new();
    for t in request.topic_data {
        for p in t.partition_data {
            let mut records = p.records.expect("records");
            for set in RecordBatchDecoder::decode_all(&mut records).expect("crc-checked decode") {
                let values = set
                    .records
                    .iter()
                    .map(|r| {
                        String::from_utf8_lossy(r.value.as_deref().unwrap_or_default()).into_owned()
                    })
                    .collect();
                out.push((set.records[0].producer_id, values));
            }
        }
    }
    out
}

#[test]
fn every_produce_version_is_rewritten_with_valid_crcs() {
    let link = link(ControlBatchPolicy::Drop);
    let (min, max) = supported_versions();
    assert_eq!((min, max), (3, 13));
    for version in min..=max {
        let frame = request(
            version,
            "mirror-east",
            &[
                ("orders", 0, batch(5, false, &["a", "b"])),
                ("orders", 1, batch(-1, false, &["c"])),
            ],
        );
        let (plan, out) = rewrite(frame.clone(), version, &link);
        assert_eq!(plan.remapped_batches, 1, "v{version}");
        assert_eq!(plan.forwarded_partitions, 2, "v{version}");
        assert!(plan.local.is_empty(), "v{version}");
        assert_eq!(out.len(), frame.len(), "v{version}: patched in place");
        assert_eq!(
            decoded_pids(&out, version),
            vec![
                (MAPPED_5, vec!["a".into(), "b".into()]),
                (-1, vec!["c".into()])
            ],
            "v{version}"
        );
        // Only the 8 PID bytes and 4 CRC bytes of the first batch changed.
        let changed = frame.iter().zip(out.iter()).filter(|(a, b)| a != b).count();
        assert!(
            changed > 0 && changed <= 12,
            "v{version}: {changed} bytes changed"
        );
    }
}

#[test]
fn already_mapped_pids_are_left_alone() {
    let link = link(ControlBatchPolicy::Drop);
    let frame = request(
        9,
        "mirror-east",
        &[("orders", 0, batch(MAPPED_5, false, &["x"]))],
    );
    let (plan, out) = rewrite(frame.clone(), 9, &link);
    assert_eq!(plan.patches(), 0);
    assert_eq!(out, frame);
}

/// A topic the link does not mirror is refused once, whatever its number
/// of entries: its answers share one name and one message, so a request of
/// many entries costs a few words an entry, not a formatted message each.
#[test]
fn the_entries_of_a_refused_topic_share_one_name_and_one_message() {
    let link = link(ControlBatchPolicy::Drop);
    let parts: Vec<_> = (0..50)
        .map(|i| ("payments", i, batch(5, false, &["b"])))
        .collect();
    let frame = request(9, "mirror-east", &parts);
    let offset = body_offset(&frame, 9);
    let p = plan(&frame, offset, 9, &link, &names).expect("plan");
    assert_eq!(p.local.len(), 50);
    let message = |l: &LocalPartition| match &l.outcome {
        LocalOutcome::Refused { message, .. } => message.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    let (first, first_message) = (&p.local[0], message(&p.local[0]));
    for l in &p.local[1..] {
        assert!(
            Arc::ptr_eq(&l.topic, &first.topic),
            "topic copied per entry"
        );
        assert!(
            Arc::ptr_eq(&message(l), &first_message),
            "message built per entry"
        );
    }
}

#[test]
fn topics_outside_the_link_are_refused_by_name() {
    let link = link(ControlBatchPolicy::Drop);
    let frame = request(
        9,
        "mirror-east",
        &[
            ("orders", 0, batch(5, false, &["a"])),
            ("payments", 0, batch(5, false, &["b"])),
        ],
    );
    let offset = body_offset(&frame, 9);
    let p = plan(&frame, offset, 9, &link, &names).expect("plan");
    assert_eq!(p.forwarded_partitions, 1);
    assert_eq!(p.local.len(), 1);
    let LocalOutcome::Refused { refusal, message } = &p.local[0].outcome else {
        panic!("expected a refusal, got {:?}", p.local[0].outcome)
    };
    assert_eq!(*refusal, Refusal::TopicNotMirrored);
    assert!(
        message.contains("'east'") && message.contains("'payments'"),
        "{message}"
    );

    // The forwarded request keeps only the mirrored partition, patched.
    let mut patched = BytesMut::from(&frame[..]);
    p.apply(&mut patched).expect("apply");
    let reduced =
        without_local_partitions(&patched.freeze(), offset, 9, &p.local).expect("re-encode");
    let reduced = reduced.freeze();
    assert_eq!(
        decoded_pids(&reduced, 9),
        vec![(MAPPED_5, vec!["a".into()])]
    );

    // The merged response carries the refusal with its message.
    let broker = encode_response(42, 9, &ProduceResponse::default())
        .expect("encode")
        .freeze();
    let frame = merge_response(&broker, 9, &p.local)
        .expect("merge")
        .freeze();
    let (correlation, decoded) = decode_response(&frame, 9).expect("decode");
    assert_eq!(correlation, 42);
    let partition = &decoded.responses[0].partition_responses[0];
    assert_eq!(decoded.responses[0].name.0.as_str(), "payments");
    assert_eq!(partition.error_code, ResponseError::PolicyViolation.code());
    assert!(partition
        .error_message
        .as_ref()
        .is_some_and(|m| m.as_str().contains("does not mirror topic 'payments'")));
}

#[test]
fn v13_topic_ids_resolve_or_ask_for_a_metadata_refresh() {
    let link = link(ControlBatchPolicy::Drop);
    let frame = request(13, "mirror-east", &[("orders", 0, batch(5, false, &["a"]))]);
    let offset = body_offset(&frame, 13);
    let unknown = plan(&frame, offset, 13, &link, &|_| None).expect("plan");
    assert!(matches!(
        &unknown.local[0].outcome,
        LocalOutcome::Refused {
            refusal: Refusal::UnknownTopicId,
            ..
        }
    ));
    let known = plan(&frame, offset, 13, &link, &names).expect("plan");
    assert_eq!(known.remapped_batches, 1);
}

#[test]
fn oversized_pids_are_unresolved_never_truncated() {
    let link = link(ControlBatchPolicy::Drop);
    let frame = request(
        9,
        "mirror-east",
        &[("orders", 0, batch(1 << 31, false, &["a"]))],
    );
    let offset = body_offset(&frame, 9);
    let p = plan(&frame, offset, 9, &link, &names).expect("plan");
    assert_eq!(p.patches(), 0);
    assert_eq!(p.forwarded_partitions, 0);
    // Without a state store nothing resolves it: a retriable refusal.
    assert!(matches!(
        &p.local[0].outcome,
        LocalOutcome::Refused { refusal: Refusal::StateWriteFailed, message } if message.contains("orders-0")
    ));
    assert_eq!(p.unresolved.len(), 1);
    assert_eq!(p.unresolved[0].origin.pid, 1 << 31);
    assert_eq!(p.unresolved[0].topic, "orders");
}

#[test]
fn known_origins_come_from_the_state_view() {
    use crate::mirror::origins::{compose, salted_region, OriginId, Origins, PartitionId};
    use crate::mirror::pid::cluster_hash;
    use crate::mirror::state_records::{OriginValue, StateRecord};
    let link = link(ControlBatchPolicy::Forward);
    let source = *link.source_cluster_id();
    let topic_id = Uuid::from_u128(9);
    let at = PartitionId {
        topic_id,
        partition: 0,
    };
    let salted = compose(salted_region(cluster_hash(&source), 7), 1 << 31);
    let mut view = Origins::new([source]);
    let origin = OriginId {
        source,
        pid: 1 << 31,
    };
    view.apply(
        0,
        &StateRecord::Origin(
            origin.key(at),
            Some(OriginValue {
                mapped_pid: salted,
                salt: 7,
                claim_offset: -1,
                last_seen_ms: 0,
            }),
        ),
    );
    let frame = request(
        9,
        "mirror-east",
        &[("orders", 0, batch(1 << 31, false, &["a"]))],
    );
    let offset = body_offset(&frame, 9);
    let ids = |name: &str| (name == "orders").then_some(topic_id);
    let p = plan_with(
        &frame,
        offset,
        9,
        &link,
        &names,
        &ids,
        &AtTime(&view, 5_000),
    )
    .expect("plan");
    assert!(p.unresolved.is_empty() && p.local.is_empty());
    assert_eq!(p.patches(), 1);
    let mut buf = frame.to_vec();
    p.apply(&mut buf).expect("apply");
    let range = p.patched_batches().next().expect("one batch");
    assert_eq!(
        BatchHeader::parse(&buf[range])
            .expect("batch")
            .producer_id(),
        salted
    );
    // The lookup recorded the origin as seen.
    assert_eq!(
        view.claim_of(at, origin).expect("claim").last_seen_ms(),
        5_000
    );
    // Unknown topic id (not learnt yet): unresolved, even for a known origin.
    let p = plan_with(
        &frame,
        offset,
        9,
        &link,
        &names,
        &|_| None,
        &AtTime(&view, 5_000),
    )
    .expect("plan");
    assert_eq!(p.unresolved.len(), 1);
    assert!(p.unresolved[0].partition.topic_id.is_nil());
}

#[test]
fn control_batches_are_dropped_or_forwarded_by_policy() {
    let control = batch(5, true, &["marker"]);
    let frame = request(9, "mirror-east", &[("orders", 0, control)]);
    let offset = body_offset(&frame, 9);
    let dropped = plan(&frame, offset, 9, &link(ControlBatchPolicy::Drop), &names).expect("plan");
    assert_eq!(dropped.forwarded_partitions, 0);
    assert_eq!(
        dropped.local[0].outcome,
        LocalOutcome::DroppedControl { batches: 1 }
    );
    let response = local_response(42, 9, &dropped.local)
        .expect("encode")
        .freeze();
    let (_, decoded) = decode_response(&response, 9).expect("decode");
    assert_eq!(decoded.responses[0].partition_responses[0].error_code, 0);

    let (forwarded, out) = rewrite(frame, 9, &link(ControlBatchPolicy::Forward));
    assert_eq!(forwarded.forwarded_partitions, 1);
    assert_eq!(decoded_pids(&out, 9)[0].0, MAPPED_5);
}

#[test]
fn a_corrupt_batch_stays_corrupt() {
    let link = link(ControlBatchPolicy::Drop);
    let mut bad = BytesMut::from(&batch(5, false, &["a"])[..]);
    let last = bad.len() - 1;
    bad[last] ^= 0x01; // flip a payload bit: the CRC no longer matches
    let frame = request(9, "mirror-east", &[("orders", 0, bad.freeze())]);
    let (plan, out) = rewrite(frame, 9, &link);
    assert_eq!(plan.remapped_batches, 1);
    let offset = body_offset(&out, 9);
    let request = decode(&out, offset, 9).expect("decode");
    let mut records = request.topic_data[0].partition_data[0]
        .records
        .clone()
        .expect("records");
    assert!(
        RecordBatchDecoder::decode_all(&mut records).is_err(),
        "CRC must still fail"
    );
}

#[test]
fn truncated_bodies_are_errors() {
    let frame = request(9, "mirror-east", &[("orders", 0, batch(5, false, &["a"]))]);
    let cut = frame.slice(..frame.len() - 10);
    let offset = body_offset(&cut, 9);
    assert!(matches!(
        plan(&cut, offset, 9, &link(ControlBatchPolicy::Drop), &names),
        Err(ProduceError::Malformed { .. })
    ));
}

#[test]
fn spoofed_requests_are_refused_whole() {
    let frame = request(
        9,
        "mirror-east",
        &[
            ("orders", 0, batch(5, false, &["a"])),
            ("orders", 1, batch(5, false, &["b"])),
        ],
    );
    let offset = body_offset(&frame, 9);
    let p = refuse_all(&frame, offset, 9, Refusal::NotAuthorized, "no certificate").expect("plan");
    assert_eq!(p.local.len(), 2);
    let response = local_response(42, 9, &p.local).expect("encode").freeze();
    let (_, decoded) = decode_response(&response, 9).expect("decode");
    assert_eq!(decoded.responses.len(), 1);
    assert!(decoded.responses[0]
        .partition_responses
        .iter()
        .all(|p| p.error_code == ResponseError::TopicAuthorizationFailed.code()));
}

#[test]
fn a_data_batch_whose_control_bit_flipped_is_never_acknowledged() {
    let link = link(ControlBatchPolicy::Drop);
    let mut flipped = BytesMut::from(&batch(5, false, &["a", "b"])[..]);
    flipped[22] ^= 0x20; // attributes: now "control", CRC unchanged
    let frame = request(9, "mirror-east", &[("orders", 0, flipped.freeze())]);
    let offset = body_offset(&frame, 9);
    let p = plan(&frame, offset, 9, &link, &names).expect("plan");
    assert_eq!(p.forwarded_partitions, 0);
    let LocalOutcome::Refused { refusal, message } = &p.local[0].outcome else {
        panic!("expected a refusal, got {:?}", p.local[0].outcome)
    };
    assert_eq!(*refusal, Refusal::CorruptBatch);
    assert!(message.contains("CRC"), "{message}");
    let response = local_response(1, 9, &p.local).expect("encode").freeze();
    let (_, decoded) = decode_response(&response, 9).expect("decode");
    assert_eq!(
        decoded.responses[0].partition_responses[0].error_code,
        ResponseError::CorruptMessage.code()
    );

    // A genuine control batch with a valid CRC is still dropped.
    let frame = request(9, "mirror-east", &[("orders", 0, batch(-1, true, &["m"]))]);
    let offset = body_offset(&frame, 9);
    let p = plan(&frame, offset, 9, &link, &names).expect("plan");
    assert_eq!(
        p.local[0].outcome,
        LocalOutcome::DroppedControl { batches: 1 }
    );
}

/// Requests whose forged array counts would abort a decoder that reserves
/// `Vec::with_capacity(count)`, on the link and spoofed paths.
#[test]
fn forged_array_counts_are_malformed_requests_not_aborts() {
    let link = link(ControlBatchPolicy::Drop);
    let good = |version| {
        request(
            version,
            "mirror-east",
            &[("orders", 0, batch(5, false, &["a"]))],
        )
    };
    let mut forged = Vec::new();
    // v8: the topic count 0x00000001 with one bit flipped, 0x10000001.
    let f = good(8);
    let offset = body_offset(&f, 8);
    let mut v8 = BytesMut::from(&f[..]);
    let at = offset + 2 + 2 + 4; // null txn id, acks, timeout
    assert_eq!(&v8[at..at + 4], &[0, 0, 0, 1]);
    v8[at] = 0x10;
    forged.push((8, v8.freeze()));
    // v9: the compact topic array length is the varint 80 80 80 80 08.
    let f = good(9);
    let offset = body_offset(&f, 9);
    let at = offset + 1 + 2 + 4;
    let mut v9 = BytesMut::from(&f[..at]);
    v9.extend_from_slice(&[0x80, 0x80, 0x80, 0x80, 0x08]);
    v9.extend_from_slice(&f[at + 1..]);
    forged.push((9, v9.freeze()));
    // v3: a few bytes deleted so the topic count merges with the name.
    let f = good(3);
    let offset = body_offset(&f, 3);
    let at = offset + 2 + 2 + 4;
    let mut v3 = BytesMut::from(&f[..at + 2]);
    v3.extend_from_slice(&f[at + 5..]);
    forged.push((3, v3.freeze()));
    for (version, frame) in forged {
        let offset = body_offset(&frame, version);
        assert!(
            matches!(
                plan(&frame, offset, version, &link, &names),
                Err(ProduceError::Malformed { .. })
            ),
            "v{version} link path"
        );
        assert!(
            matches!(
                refuse_all(&frame, offset, version, Refusal::NotAuthorized, "x"),
                Err(ProduceError::Malformed { .. })
            ),
            "v{version} spoofed path"
        );
    }
}

#[test]
fn batches_with_a_sequence_are_tracked_with_their_mapped_pid_and_offset_delta() {
    let link = link(ControlBatchPolicy::Drop);
    let mut records = BytesMut::new();
    records.extend_from_slice(&batch(5, false, &["a", "b"]));
    records.extend_from_slice(&batch(-1, false, &["c"]));
    records.extend_from_slice(&batch(5, false, &["d"]));
    let frame = request(
        13,
        "mirror-east",
        &[
            ("orders", 0, records.freeze()),
            ("orders", 1, batch(-1, false, &["x"])),
        ],
    );
    let (plan, _) = rewrite(frame, 13, &link);
    assert_eq!(plan.forwarded_partitions, 2);
    // Partition 1 holds no batch with a sequence: not tracked.
    assert_eq!(plan.tracked.len(), 1);
    let t = &plan.tracked[0];
    assert_eq!(t.partition.partition, 0);
    assert_eq!(t.partition.topic_id, TOPIC_ID);
    assert_eq!(t.batch_count, 3);
    let got: Vec<_> = t
        .batches
        .iter()
        .map(|b| {
            (
                b.id.producer_id,
                b.id.epoch,
                b.id.first_seq,
                b.id.last_seq,
                b.offset_delta,
            )
        })
        .collect();
    // The third batch follows 2 + 1 records.
    assert_eq!(
        got,
        vec![(MAPPED_5, 3, 10, 11, 0), (MAPPED_5, 3, 10, 10, 3)]
    );
}

#[test]
fn every_forwarded_partition_carries_its_batch_figures() {
    use crate::metrics::mirrored::MirroredBatches;
    let link = link(ControlBatchPolicy::Drop);
    let (b1, b2, b3) = (
        batch(5, false, &["a", "b"]),
        batch(-1, false, &["c"]),
        batch(-1, false, &["x"]),
    );
    let mut records = BytesMut::new();
    records.extend_from_slice(&b1);
    records.extend_from_slice(&b2);
    let frame = request(
        13,
        "mirror-east",
        &[("orders", 0, records.freeze()), ("orders", 1, b3.clone())],
    );
    let (plan, _) = rewrite(frame, 13, &link);
    // Both partitions, the untracked one too, in request order, sharing
    // the tracked partition's topic.
    assert_eq!(plan.mirrored.len(), 2);
    assert!(Arc::ptr_eq(&plan.mirrored[0].topic, &plan.tracked[0].topic));
    assert_eq!(plan.mirrored[1].partition, 1);
    assert_eq!(
        plan.mirrored[0].batches,
        MirroredBatches {
            records: 3,
            batches: 2,
            bytes: (b1.len() + b2.len()) as u64,
            offsets: 3,
            newest_create_ms: 1_700_000_000_001,
        }
    );
    assert_eq!(plan.mirrored[1].batches.newest_create_ms, 1_700_000_000_000);
    // A dropped control batch is answered here: not mirrored.
    let frame = request(9, "mirror-east", &[("orders", 0, batch(5, true, &["m"]))]);
    let (plan, _) = rewrite(frame, 9, &link);
    assert!(plan.mirrored.is_empty());
}

#[test]
fn any_topic_sees_each_topic_once_by_name_or_by_id() {
    let parts = [
        ("orders", 0, batch(-1, false, &["a"])),
        ("orders", 1, batch(-1, false, &["b"])),
        ("other", 0, batch(-1, false, &["c"])),
    ];
    let frame = request(9, "app", &parts);
    let offset = body_offset(&frame, 9);
    let mut seen = Vec::new();
    let found = any_topic(&frame, offset, 9, |t| {
        seen.push(format!("{t:?}"));
        false
    })
    .expect("walk");
    assert!(!found);
    assert_eq!(seen, [r#"Name("orders")"#, r#"Name("other")"#]);
    // The first topic that holds ends the asking.
    let mut asked = 0;
    let found = any_topic(&frame, offset, 9, |t| {
        asked += 1;
        t == TopicKey::Name("orders")
    })
    .expect("walk");
    assert!(found);
    assert_eq!(asked, 1);
    assert!(any_topic(&frame, offset, 9, |t| t == TopicKey::Name("other")).expect("walk"));

    // v13 names topics by id only.
    let frame = request(13, "app", &parts[..1]);
    let offset = body_offset(&frame, 13);
    let mut seen = Vec::new();
    assert!(any_topic(&frame, offset, 13, |t| {
        seen.push(format!("{t:?}"));
        t == TopicKey::Id(TOPIC_ID)
    })
    .expect("walk"));
    assert_eq!(seen, [format!("Id({TOPIC_ID:?})")]);
}

#[test]
fn any_topic_fails_on_a_cut_frame_or_a_name_that_is_not_utf8() {
    let frame = request(9, "app", &[("orders", 0, batch(-1, false, &["a"]))]);
    let offset = body_offset(&frame, 9);
    let cut = frame.slice(..frame.len() - 3);
    assert!(matches!(
        any_topic(&cut, offset, 9, |_| false),
        Err(ProduceError::Malformed { version: 9, .. })
    ));
    let at = frame
        .windows(6)
        .position(|w| w == b"orders")
        .expect("topic name in frame");
    let mut bad = BytesMut::from(&frame[..]);
    bad[at] = 0xFF;
    let err = any_topic(&bad.freeze(), offset, 9, |_| false).expect_err("not UTF-8");
    assert!(
        matches!(
            &err,
            ProduceError::Malformed {
                version: 9,
                cause: ReadError::TopicNotUtf8
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "unparseable Produce v9 body");
    assert_eq!(
        crate::sync::error_chain(&err),
        "unparseable Produce v9 body: topic name is not UTF-8"
    );
}

#[test]
fn a_cut_request_carries_the_walk_error_as_its_source() {
    use std::error::Error as _;
    let frame = request(9, "app", &[("orders", 0, batch(-1, false, &["a"]))]);
    let offset = body_offset(&frame, 9);
    let cut = frame.slice(..frame.len() - 3);
    let err = any_topic(&cut, offset, 9, |_| false).expect_err("cut");
    let cause = err.source().expect("a cause");
    assert!(
        matches!(cause.downcast_ref::<ReadError>(), Some(ReadError::Walk(_))),
        "{err:?}"
    );
    let chain = crate::sync::error_chain(&err);
    assert!(
        chain.starts_with("unparseable Produce v9 body: "),
        "{chain}"
    );
    assert!(
        chain.len() > "unparseable Produce v9 body: ".len(),
        "{chain}"
    );
}

#[test]
fn local_writes_to_read_only_topics_are_refused_per_partition() {
    let frame = request(
        9,
        "app",
        &[
            ("orders", 0, batch(-1, false, &["a"])),
            ("orders", 1, batch(-1, false, &["b"])),
            ("other", 0, batch(-1, false, &["c"])),
        ],
    );
    let offset = body_offset(&frame, 9);
    let p = refuse_where(&frame, offset, 9, |t| {
        (t == TopicKey::Name("orders")).then(|| (Refusal::ReadOnly, "read-only".to_string()))
    })
    .expect("plan");
    assert_eq!(p.forwarded_partitions, 1);
    assert_eq!(
        p.local.iter().map(|l| l.partition).collect::<Vec<_>>(),
        [0, 1]
    );
    // The broker gets only the other topic, untouched.
    let reduced = without_local_partitions(&frame, offset, 9, &p.local)
        .expect("re-encode")
        .freeze();
    let decoded = decode(&reduced, offset, 9).expect("decode");
    assert_eq!(decoded.topic_data.len(), 1);
    assert_eq!(decoded.topic_data[0].name.0.as_str(), "other");
    // The client gets POLICY_VIOLATION with the message for both partitions.
    let broker = encode_response(7, 9, &ProduceResponse::default())
        .expect("encode")
        .freeze();
    let merged = merge_response(&broker, 9, &p.local)
        .expect("merge")
        .freeze();
    let (_, response) = decode_response(&merged, 9).expect("decode");
    let parts = &response.responses[0].partition_responses;
    assert_eq!(parts.len(), 2);
    assert!(parts
        .iter()
        .all(|p| p.error_code == ResponseError::PolicyViolation.code()
            && p.error_message
                .as_ref()
                .is_some_and(|m| m.as_str() == "read-only")));

    // READ_ONLY_TOPIC and PRODUCER_FENCED codes.
    let p = refuse_all(&frame, offset, 9, Refusal::ReadOnlyTopic, "x").expect("plan");
    let r = local_response(1, 9, &p.local).expect("encode").freeze();
    let (_, decoded) = decode_response(&r, 9).expect("decode");
    assert_eq!(decoded.responses[0].partition_responses[0].error_code, 134);
    let p = refuse_all(&frame, offset, 9, Refusal::LinkFenced, "x").expect("plan");
    let r = local_response(1, 9, &p.local).expect("encode").freeze();
    let (_, decoded) = decode_response(&r, 9).expect("decode");
    assert_eq!(decoded.responses[0].partition_responses[0].error_code, 90);
}

#[test]
fn a_partition_named_twice_refuses_the_whole_request() {
    // Found by the produce_plan fuzz target: partition 0 twice, one entry
    // forwarded and one refused; re-emitting the request without the
    // refused entry dropped both.
    let link = link(ControlBatchPolicy::Drop);
    let mut unreadable = BytesMut::from(&batch(6, false, &["b"])[..]);
    unreadable[16] = 111; // magic: no v2 batch header
    for version in [3, 9, 13] {
        let frame = request(
            version,
            "mirror-east",
            &[
                ("orders", 0, batch(5, false, &["a"])),
                ("orders", 0, unreadable.clone().freeze()),
                ("orders", 2, batch(7, false, &["c"])),
            ],
        );
        let offset = body_offset(&frame, version);
        let plan = plan(&frame, offset, version, &link, &names).expect("plan");
        assert_eq!(plan.patches(), 0, "v{version}: nothing patched");
        assert_eq!(
            plan.forwarded_partitions, 0,
            "v{version}: nothing forwarded"
        );
        assert!(plan.tracked.is_empty(), "v{version}: nothing tracked");
        let refusals: Vec<(i32, Refusal)> = plan
            .local
            .iter()
            .map(|l| match &l.outcome {
                LocalOutcome::Refused { refusal, message } => {
                    assert!(message.contains("partition 0"), "{message}");
                    (l.partition, *refusal)
                }
                other => panic!("v{version}: {other:?}"),
            })
            .collect();
        assert_eq!(
            refusals,
            vec![
                (0, Refusal::DuplicatePartition),
                (0, Refusal::DuplicatePartition),
                (2, Refusal::DuplicatePartition)
            ],
            "v{version}"
        );
        let response = local_response(6, version, &plan.local).expect("encode");
        assert!(!response.is_empty());
    }
    // The same index in two topics is two partitions: see
    // topics_outside_the_link_are_refused_by_name (partition 0 of "orders"
    // forwarded, of "payments" refused as not mirrored).
}

/// The answers the proxy writes directly are what kafka-protocol encodes
/// for the same answers, byte for byte, at every version; merged into a
/// broker's response, an answer joins the entry of a topic the broker
/// answered too, and the others come first.
#[test]
fn local_answers_are_encoded_as_kafka_protocol_encodes_them() {
    let answer = |topic: &str, partition: i32, outcome: LocalOutcome| LocalPartition {
        topic: TopicRef {
            name: TopicName(StrBytes::from_string(topic.to_string())),
            topic_id: Uuid::from_u128(topic.len() as u128),
        }
        .into(),
        partition,
        entry: 0,
        outcome,
    };
    let refused = |m: &str| LocalOutcome::Refused {
        refusal: Refusal::ReadOnly,
        message: m.into(),
    };
    let local = vec![
        answer("m", 0, refused("read-only")),
        answer(
            "other",
            3,
            LocalOutcome::Duplicate {
                base_offset: 42,
                batches: 1,
            },
        ),
        answer("m", 1, refused("read-only")),
        answer("other", 4, LocalOutcome::DroppedControl { batches: 2 }),
    ];
    for version in 3..=13 {
        let mut want = ProduceResponse::default();
        add_local(&mut want, version, &local);
        let want = encode_response(9, version, &want).expect("encode");
        let got = local_response(9, version, &local).expect("encode");
        assert_eq!(got, want, "v{version}");

        // Merged: "other" joins the broker's entry, "m" comes first.
        let mut broker = ProduceResponse::default().with_throttle_time_ms(5);
        broker.responses.push(
            TopicProduceResponse::default()
                .with_name(TopicName(StrBytes::from_static_str("other")))
                .with_topic_id(Uuid::from_u128(5))
                .with_partition_responses(vec![PartitionProduceResponse::default()
                    .with_index(0)
                    .with_base_offset(7)]),
        );
        let frame = encode_response(9, version, &broker)
            .expect("encode")
            .freeze();
        let merged = merge_response(&frame, version, &local)
            .expect("merge")
            .freeze();
        let (correlation, decoded) = decode_response(&merged, version).expect("decode");
        assert_eq!(correlation, 9);
        assert_eq!(decoded.throttle_time_ms, 5, "v{version}");
        let partitions = |t: &TopicProduceResponse| {
            t.partition_responses
                .iter()
                .map(|p| p.index)
                .collect::<Vec<_>>()
        };
        assert_eq!(decoded.responses.len(), 2, "v{version}");
        assert_eq!(
            partitions(&decoded.responses[0]),
            [0, 1],
            "v{version}: m first"
        );
        assert_eq!(
            partitions(&decoded.responses[1]),
            [0, 3, 4],
            "v{version}: other joined"
        );
    }
}

/// Past the first [`MESSAGES_PER_RESPONSE`] answers, an answer carries its
/// code alone: the answer to a request of many entries stays a few dozen
/// bytes an entry.
#[test]
fn only_the_first_answers_carry_their_message() {
    let local: Vec<LocalPartition> = (0..1_000)
        .map(|i| LocalPartition {
            topic: TopicRef {
                name: TopicName(StrBytes::from_static_str("m")),
                topic_id: Uuid::nil(),
            }
            .into(),
            partition: i,
            entry: i as u32,
            outcome: LocalOutcome::Refused {
                refusal: Refusal::ReadOnly,
                message: "x".repeat(200).into(),
            },
        })
        .collect();
    let r = local_response(1, 9, &local).expect("encode").freeze();
    let (_, decoded) = decode_response(&r, 9).expect("decode");
    let parts = &decoded.responses[0].partition_responses;
    let with_message = parts.iter().filter(|p| p.error_message.is_some()).count();
    assert_eq!(with_message, MESSAGES_PER_RESPONSE);
    assert!(parts
        .iter()
        .all(|p| p.error_code == ResponseError::PolicyViolation.code()));
    assert!(r.len() < 40 * 1_000 + 64 * 210, "{} bytes", r.len());
}
