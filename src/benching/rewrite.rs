//! The criterion cases of `benches/rewrite.rs`, which says what each
//! group compares.

use std::cell::RefCell;
use std::hint::black_box;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, RequestHeader, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use uuid::Uuid;

use super::{Case, Per, Work, ORDERS_ID};
use crate::mirror::link::ControlBatchPolicy;
use crate::mirror::produce::{self, ProducePlan};
use crate::mirror::produce_response::Answers;
use crate::mirror::producer_state::{BatchId, Check, ProducerStates};
use crate::wire::crc32c;
use crate::wire::header::RequestHeaderPeek;
use crate::wire::produce_response_walk::Walked;
use crate::wire::produce_walk::Index;

/// Every case, in the order the bench runs them.
pub fn cases() -> Vec<Case> {
    let mut all = Vec::new();
    rewrite(&mut all);
    produce_response(&mut all);
    producer_state(&mut all);
    producer_state_cycling(&mut all);
    local_read_only_check(&mut all);
    all
}

fn case(group: &'static str, id: impl Into<String>, per: Option<Per>, work: Work) -> Case {
    Case {
        group,
        id: id.into(),
        per,
        work,
        report: None,
    }
}

fn repeat(f: impl FnMut() + 'static) -> Work {
    Work::Repeat(Box::new(f))
}

const VERSION: i16 = 9;

/// One batch of about `size` bytes from [`super::PRODUCER`].
fn batch(size: usize) -> Bytes {
    super::batch((size / 1020).max(1), 1000)
}

fn request(partitions: usize, batch_size: usize) -> (Bytes, Bytes) {
    request_at(VERSION, partitions, batch_size)
}

/// Topic "orders" (by id from v13) with `partitions` batches of about
/// `batch_size` bytes, at `version`.
fn request_at(version: i16, partitions: usize, batch_size: usize) -> (Bytes, Bytes) {
    let b = batch(batch_size);
    let data = (0..partitions as i32)
        .map(|i| {
            PartitionProduceData::default()
                .with_index(i)
                .with_records(Some(b.clone()))
        })
        .collect();
    let body = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![match version >= 13 {
            true => TopicProduceData::default().with_topic_id(ORDERS_ID),
            false => TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_static_str("orders"))),
        }
        .with_partition_data(data)]);
    let header = RequestHeader::default()
        .with_request_api_key(0)
        .with_request_api_version(version)
        .with_correlation_id(1)
        .with_client_id(Some(StrBytes::from_static_str("mirror-east")));
    let mut out = BytesMut::new();
    header
        .encode(&mut out, ApiKey::Produce.request_header_version(version))
        .expect("header");
    body.encode(&mut out, version).expect("body");
    (out.freeze(), b)
}

/// A plan made by `plan` over a fresh copy of `frame`, applied.
fn plan_and_patch(
    frame: &Bytes,
    body_offset: usize,
    plan: impl Fn(&Bytes, &Index) -> ProducePlan + 'static,
) -> Work {
    Work::Fresh {
        input: frame.clone(),
        run: Box::new(move |f| {
            let index = produce::index(&f, body_offset, VERSION).expect("index");
            let plan = plan(&f, &index);
            let mut m = BytesMut::from(f);
            plan.apply(&mut m).expect("apply");
            m
        }),
    }
}

fn rewrite(all: &mut Vec<Case>) {
    let link = Rc::new(super::orders_link(ControlBatchPolicy::Drop));
    let cases = [
        ("1KiB", 1, 1024),
        ("64KiB", 1, 64 * 1024),
        ("1MiB", 1, 1024 * 1024),
        ("16x64KiB", 16, 64 * 1024),
    ];
    const GROUP: &str = "produce_rewrite";
    for (name, partitions, size) in cases {
        let (frame, batch) = request(partitions, size);
        let h = RequestHeaderPeek::parse(&frame).expect("peek");
        let body_offset = h
            .body_offset(&frame, ApiKey::Produce.request_header_version(VERSION))
            .expect("offset");
        let bytes = frame.len() as u64;
        let l = Rc::clone(&link);
        all.push(case(
            GROUP,
            format!("plan_and_patch/{name}"),
            Some(Per::Bytes(bytes)),
            plan_and_patch(&frame, body_offset, move |f, index| {
                produce::plan(f, index, &l, &|_| None)
            }),
        ));
        // The state-backed path: every origin known (lookup in the origins
        // view, last-seen touch, patch), as for a link in steady state.
        let topic_id = Uuid::from_u128(0x5eed);
        let view = super::known_origins(&link, topic_id, partitions as i32);
        let l = Rc::clone(&link);
        all.push(case(
            GROUP,
            format!("known_origin_plan_and_patch/{name}"),
            Some(Per::Bytes(bytes)),
            plan_and_patch(&frame, body_offset, move |f, index| {
                let plan = produce::plan_with(
                    f,
                    index,
                    &l,
                    &|_| None,
                    &|_| Some(topic_id),
                    &produce::AtTime(&view, 1_000_000),
                );
                assert!(plan.unresolved.is_empty());
                plan
            }),
        ));
        all.push(case(
            GROUP,
            format!("full_crc_pass/{name}"),
            Some(Per::Bytes(bytes)),
            repeat(move || {
                black_box(
                    (0..partitions)
                        .map(|_| crc32c::checksum(&batch[21..]))
                        .fold(0, |a, c| a ^ c),
                );
            }),
        ));
    }

    // The CRC update alone, by the number of bytes after the patched field.
    for (name, after) in [
        ("1KiB", 1024u64),
        ("64KiB", 64 * 1024),
        ("1MiB", 1024 * 1024),
    ] {
        all.push(case(
            "crc_patch",
            name,
            None,
            repeat(move || {
                black_box(crc32c::patch(
                    0x1234_5678,
                    5i64.to_be_bytes(),
                    (-5i64).to_be_bytes(),
                    black_box(after),
                ));
            }),
        ));
    }
}

/// A local client's Produce v10+ response: before, decoded and re-encoded
/// to look for KIP-951 leader endpoints; now walked, and passed untouched
/// when it names no broker (issue 6, defect 9).
fn produce_response(all: &mut Vec<Case>) {
    use crate::filter::addresses::{self, Advertised};
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };
    use kafka_protocol::messages::{ProduceResponse, ResponseHeader};
    use kafka_protocol::protocol::Decodable;
    let version = 11;
    let body = ProduceResponse::default().with_responses(
        (0..4)
            .map(|t| {
                TopicProduceResponse::default()
                    .with_name(TopicName(StrBytes::from_string(format!("topic-{t}"))))
                    .with_partition_responses(
                        (0..8)
                            .map(|p| {
                                PartitionProduceResponse::default()
                                    .with_index(p)
                                    .with_base_offset(1_000_000 + i64::from(p))
                            })
                            .collect(),
                    )
            })
            .collect(),
    );
    let frame = produce::encode_response(9, version, &body)
        .expect("response")
        .freeze();
    let adv = Rc::new(Advertised {
        host: "proxy".into(),
        port_base: 19093,
        sni: None,
    });
    const GROUP: &str = "produce_response_v11_32_partitions";
    let walk_and_pass = |f: Bytes, a: Rc<Advertised>| {
        move || {
            let (out, _) = addresses::rewrite(ApiKey::Produce, version, &f, &a).expect("walk");
            assert!(
                out.is_none(),
                "a response naming no broker passes untouched"
            );
        }
    };
    all.push(case(
        GROUP,
        "walk_and_pass",
        None,
        repeat(walk_and_pass(frame.clone(), Rc::clone(&adv))),
    ));
    all.push(case(
        GROUP,
        "decode_and_encode",
        None,
        repeat(move || {
            let mut buf = frame.clone();
            let h = ResponseHeader::decode(&mut buf, 1).expect("header");
            let r = ProduceResponse::decode(&mut buf, version).expect("decode");
            let mut out = BytesMut::new();
            h.encode(&mut out, 1).expect("header");
            r.encode(&mut out, version).expect("encode");
            black_box(out);
        }),
    ));

    // A link Produce response (one partition) as the response half reads
    // it: the answers found on the leader-endpoint walk, against that walk
    // followed by the validation and decode it used to get.
    let topic = TopicName(StrBytes::from_static_str("orders"));
    let one = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
        .with_name(topic.clone())
        .with_partition_responses(vec![PartitionProduceResponse::default()
            .with_index(0)
            .with_base_offset(1_000_000)
            .with_log_append_time_ms(-1)])]);
    let frame = produce::encode_response(9, version, &one)
        .expect("response")
        .freeze();
    let tracked = produce::TopicRef {
        name: topic,
        topic_id: Uuid::nil(),
    };
    const LINK_GROUP: &str = "link_produce_response_v11_1_partition";
    let f = frame.clone();
    all.push(case(
        LINK_GROUP,
        "answers_on_the_response_walk",
        None,
        repeat(move || {
            let mut answers = Answers::new(vec![(&tracked, 0)]);
            let walked = answers.walk(&f, version).expect("walk");
            assert_eq!(walked, Walked::Whole);
            black_box(answers.into_found());
        }),
    ));
    all.push(case(
        LINK_GROUP,
        "schema_endpoint_walk_alone",
        None,
        repeat(walk_and_pass(frame.clone(), Rc::clone(&adv))),
    ));
    let walk = walk_and_pass(frame.clone(), adv);
    all.push(case(
        LINK_GROUP,
        "endpoint_walk_then_validate_and_decode",
        None,
        repeat(move || {
            walk();
            black_box(produce::decode_response(&frame, version).expect("decode"));
        }),
    ));
}

fn producer_state(all: &mut Vec<Case>) {
    let mut states: ProducerStates<(u128, i32)> = ProducerStates::new(20_000);
    let topic = 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10u128;
    for p in 0..100 {
        for i in 0..100 {
            let id = BatchId {
                producer_id: -1_000_000 - i64::from(p * 100 + i),
                epoch: 0,
                first_seq: 0,
                last_seq: 9,
            };
            states.appended(&(topic, p), &id, 0, 0);
        }
    }
    let partition = (topic, 42);
    let producer_id = -1_000_000 - 4_217;
    let states = Rc::new(RefCell::new(states));
    let last = Rc::new(RefCell::new(BatchId {
        producer_id,
        epoch: 0,
        first_seq: 0,
        last_seq: 9,
    }));
    let (mut seq, mut offset) = (10i32, 1i64);
    let (s, l) = (Rc::clone(&states), Rc::clone(&last));
    all.push(case(
        "producer_state",
        "known_producer_check_and_record",
        None,
        repeat(move || {
            let id = BatchId {
                producer_id,
                epoch: 0,
                first_seq: seq,
                last_seq: seq + 9,
            };
            let mut states = s.borrow_mut();
            let verdict = states.begin(black_box(&partition), &id);
            assert_eq!(verdict, Check::Append);
            states.appended(&partition, &id, offset, 0);
            *l.borrow_mut() = id;
            seq = if seq > i32::MAX - 20 { 0 } else { seq + 10 };
            offset += 10;
        }),
    ));
    all.push(case(
        "producer_state",
        "known_producer_duplicate",
        None,
        repeat(move || {
            let verdict = states
                .borrow_mut()
                .check(black_box(&partition), &last.borrow());
            assert!(matches!(verdict, Check::Duplicate { .. }));
        }),
    ));
}

/// A local client's Produce while some topic is a read-only mirror: the
/// per-partition refusal plan it used to get (names copied out, a closure
/// per partition), against the question "does it name a read-only topic"
/// asked on a walk that allocates nothing. Both look the name up the same
/// way (v13: the topic-id table first).
fn local_read_only_check(all: &mut Vec<Case>) {
    use std::collections::{HashMap, HashSet};
    use std::sync::RwLock;
    let read_only: Rc<HashSet<String>> = Rc::new(HashSet::from(["mirrored".to_string()]));
    let names: Rc<RwLock<HashMap<Uuid, String>>> = Rc::new(RwLock::new(HashMap::from([(
        ORDERS_ID,
        "orders".to_string(),
    )])));
    const GROUP: &str = "local_produce_read_only_check_16KiB";
    for version in [9i16, 13] {
        let (frame, _) = request_at(version, 1, 16 * 1024);
        let h = RequestHeaderPeek::parse(&frame).expect("peek");
        let body_offset = h
            .body_offset(&frame, ApiKey::Produce.request_header_version(version))
            .expect("offset");
        let (f, n, r) = (frame.clone(), Rc::clone(&names), Rc::clone(&read_only));
        all.push(case(
            GROUP,
            format!("refusal_plan/{version}"),
            None,
            repeat(move || {
                let name_of = |id: Uuid| n.read().ok()?.get(&id).cloned();
                let index = produce::index(&f, body_offset, version).expect("index");
                let plan = produce::refuse_where(&f, &index, |t, _| {
                    let name = match t {
                        produce::TopicKey::Id(id) => name_of(id)?,
                        produce::TopicKey::Name(n) => n.to_string(),
                    };
                    r.contains(&name)
                        .then(|| (produce::Refusal::ReadOnly, Default::default()))
                });
                assert_eq!(plan.forwarded_partitions, 1);
            }),
        ));
        let (n, r) = (Rc::clone(&names), Rc::clone(&read_only));
        all.push(case(
            GROUP,
            format!("any_topic/{version}"),
            None,
            repeat(move || {
                let name_of = |id: Uuid| n.read().ok()?.get(&id).cloned();
                let index = produce::index(&frame, body_offset, version).expect("index");
                let any = produce::any_topic(&frame, &index, |t| match t {
                    produce::TopicKey::Name(n) => r.contains(n),
                    produce::TopicKey::Id(id) => name_of(id).is_some_and(|n| r.contains(&n)),
                });
                assert!(!any);
            }),
        ));
    }
}

/// Producers cycling through the state at the default bound: 1,000 stay
/// held; 1,000,000 evict one producer per batch.
fn producer_state_cycling(all: &mut Vec<Case>) {
    const BOUND: usize = 100_000;
    for producers in [1_000i64, 1_000_000] {
        let mut states: ProducerStates<(u128, i32)> = ProducerStates::new(BOUND);
        let partition = (0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10u128, 0);
        // Fill to the bound (or to every producer) first.
        let warm = producers.min(BOUND as i64);
        for i in 0..warm {
            let id = BatchId {
                producer_id: -2 - i,
                epoch: 0,
                first_seq: 0,
                last_seq: 0,
            };
            states.appended(&partition, &id, i, 0);
        }
        let states = Rc::new(RefCell::new(states));
        let s = Rc::clone(&states);
        let mut i = warm;
        all.push(Case {
            group: "producer_state_cycling",
            id: producers.to_string(),
            per: Some(Per::Element),
            work: repeat(move || {
                let n = i % producers;
                // A producer's next batch continues its sequence; one just
                // evicted (or never seen) starts wherever it is.
                let seq = i32::try_from((i / producers) % 1_000_000).unwrap_or(0);
                let id = BatchId {
                    producer_id: -2 - n,
                    epoch: 0,
                    first_seq: seq,
                    last_seq: seq,
                };
                let mut states = s.borrow_mut();
                let verdict = states.begin(black_box(&partition), &id);
                if verdict == Check::Append {
                    states.appended(&partition, &id, i, 0);
                } else {
                    states.failed(&partition, &id);
                }
                i += 1;
            }),
            report: Some(Box::new(move || {
                let states = states.borrow();
                format!(
                    "producer_state_cycling/{producers}: {} held, {} evicted",
                    states.len(),
                    states.evictions()
                )
            })),
        });
    }
}
