//! The Produce decision over request frames built byte for byte (batches
//! by `wire::batch::build`, requests and expected responses encoded by
//! `kafka-protocol`), with what the proxy knows faked.

use std::cell::RefCell;
use std::collections::HashMap;

use kafka_protocol::messages::produce_request::{
    PartitionProduceData, ProduceRequest, TopicProduceData,
};
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::TopicName as WireName;
use kafka_protocol::protocol::StrBytes;
use regex::Regex;

use super::*;
use crate::client::protocol::encode_request;
use crate::mirror::link::ControlBatchPolicy;
use crate::mirror::pid::ClusterId;
use crate::mirror::produce::LocalOutcome;
use crate::wire::batch::{build, NewBatch, NewRecord};

pub(crate) const ORDERS_ID: Uuid = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
const PAYMENTS_ID: Uuid = Uuid::from_u128(0xfedc_ba98_7654_3210_fedc_ba98_7654_3210);
const CORRELATION_ID: i32 = 42;
const READ_ONLY: &str = "topic 'orders' is read-only";

/// One batch of one record, without a producer.
pub fn batch() -> Bytes {
    let record = NewRecord {
        key: None,
        value: Some(b"v"),
        headers: &[],
        timestamp: 1_700_000_000_000,
    };
    Bytes::from(build(&NewBatch::NO_PRODUCER, &[record]).expect("one record"))
}

/// A topic as a request names it: by name before v13, by id from v13.
#[derive(Clone, Copy)]
pub(crate) struct Topic(pub(crate) &'static str, pub(crate) Uuid);

pub(crate) const ORDERS: Topic = Topic("orders", ORDERS_ID);
pub(crate) const PAYMENTS: Topic = Topic("payments", PAYMENTS_ID);

/// A Produce request frame (header and body, no size prefix) at
/// `version` from client `client_id`, writing one batch to each partition.
pub(crate) fn request(
    version: i16,
    acks: i16,
    client_id: &str,
    topics: &[(Topic, &[i32])],
) -> Bytes {
    let topic_data = topics
        .iter()
        .map(|(Topic(name, id), partitions)| {
            let t = TopicProduceData::default().with_partition_data(
                partitions
                    .iter()
                    .map(|&p| {
                        PartitionProduceData::default()
                            .with_index(p)
                            .with_records(Some(batch()))
                    })
                    .collect(),
            );
            match version >= 13 {
                true => t.with_topic_id(*id),
                false => t.with_name(WireName(StrBytes::from_static_str(name))),
            }
        })
        .collect();
    let body = ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(30_000)
        .with_topic_data(topic_data);
    encode_request(&body, version, CORRELATION_ID, client_id)
        .expect("encode")
        .freeze()
}

/// The head of a request built by [`request`].
pub(crate) fn head(frame: &Bytes) -> Head {
    let h = RequestHeaderPeek::parse(frame).expect("peek");
    Head::new(&h, frame).expect("head")
}

/// A partition's answer: partition, error code, base offset, message.
pub(crate) type Answer<'m> = (i32, i16, i64, Option<&'m str>);

/// The response a client expects: each topic's partitions answered.
pub(crate) fn response(version: i16, topics: &[(Topic, &[Answer<'_>])]) -> BytesMut {
    let responses = topics
        .iter()
        .map(|(Topic(name, id), partitions)| {
            let t = TopicProduceResponse::default().with_partition_responses(
                partitions
                    .iter()
                    .map(|&(p, code, offset, message)| {
                        PartitionProduceResponse::default()
                            .with_index(p)
                            .with_error_code(code)
                            .with_base_offset(offset)
                            .with_log_append_time_ms(-1)
                            .with_log_start_offset(-1)
                            .with_error_message(message.map(|m| StrBytes::from_string(m.into())))
                    })
                    .collect(),
            );
            match version >= 13 {
                true => t.with_topic_id(*id),
                false => t.with_name(WireName(StrBytes::from_static_str(name))),
            }
        })
        .collect();
    let body = ProduceResponse::default().with_responses(responses);
    produce::encode_response(CORRELATION_ID, version, &body).expect("encode")
}

/// What the proxy knows, faked: the ids it has seen, its state topic
/// (`None`: no links), the topics read-only now; what it counted.
#[derive(Default)]
struct Fake {
    names: HashMap<Uuid, Arc<str>>,
    state_topic: Option<&'static str>,
    read_only: Vec<&'static str>,
    counted: RefCell<Vec<(String, usize)>>,
}

impl Fake {
    /// With links, `orders` read-only, both topic ids known.
    fn read_only_orders() -> Fake {
        Fake {
            names: [
                (ORDERS_ID, "orders".into()),
                (PAYMENTS_ID, "payments".into()),
            ]
            .into(),
            state_topic: Some("__mirror_state"),
            read_only: vec!["orders"],
            ..Fake::default()
        }
    }
}

impl TopicNames for Fake {
    fn topic_name(&self, id: Uuid) -> Option<Arc<str>> {
        self.names.get(&id).cloned()
    }
}

impl Known for Fake {
    fn state_topic(&self) -> Option<&str> {
        self.state_topic
    }

    fn read_only(&self, topic: &str, _version: i16) -> Option<(Refusal, String)> {
        self.read_only
            .contains(&topic)
            .then(|| (Refusal::ReadOnly, format!("topic '{topic}' is read-only")))
    }

    fn count_refused(&self, topic: &str, partitions: usize) {
        self.counted.borrow_mut().push((topic.into(), partitions));
    }
}

/// POLICY_VIOLATION, TOPIC_AUTHORIZATION_FAILED, UNKNOWN_TOPIC_ID.
const POLICY_VIOLATION: i16 = 44;
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const UNKNOWN_TOPIC_ID: i16 = 100;

fn refused(decision: LocalDecision) -> (ProducePlan, Index) {
    match decision {
        LocalDecision::Refuse(refused) => (refused.plan, refused.index),
        LocalDecision::Forward => panic!("forwarded, not refused"),
        LocalDecision::LearnIds(_) => panic!("asked to learn ids, not refused"),
    }
}

#[test]
fn the_head_is_read_from_the_frame() {
    let frame = request(9, 0, "client-a", &[(ORDERS, &[0])]);
    let head = head(&frame);
    // Header v2 from Produce v9: api key, version, correlation id, client
    // id (2 + 8 bytes), no tagged fields; then the body.
    assert_eq!(
        head,
        Head {
            version: 9,
            correlation_id: CORRELATION_ID,
            body_offset: 2 + 2 + 4 + 2 + 8 + 1,
            acks: 0,
        }
    );
    assert!(!head.expects_response());
    assert_eq!(head.timeout_ms(&frame).expect("timeout"), 30_000);
}

#[test]
fn a_local_write_to_a_read_only_topic_is_refused() {
    let frame = request(9, -1, "client-a", &[(ORDERS, &[0, 1])]);
    let head = head(&frame);
    let known = Fake::read_only_orders();
    let (plan, _) = refused(decide_local(&head, &frame, None, &known).expect("decide"));
    assert_eq!(plan.forwarded_partitions, 0);
    assert_eq!(
        head.answer(&plan.local).expect("answer").as_deref(),
        Some(
            &response(
                9,
                &[(
                    ORDERS,
                    &[
                        (0, POLICY_VIOLATION, -1, Some(READ_ONLY)),
                        (1, POLICY_VIOLATION, -1, Some(READ_ONLY)),
                    ]
                )]
            )[..]
        )
    );
    assert_eq!(*known.counted.borrow(), vec![("orders".to_string(), 2)]);
}

#[test]
fn a_local_write_to_the_state_topic_is_refused_and_not_counted_read_only() {
    const STATE: Topic = Topic("__mirror_state", Uuid::from_u128(9));
    let frame = request(9, -1, "client-a", &[(STATE, &[0])]);
    let head = head(&frame);
    let known = Fake::read_only_orders();
    let (plan, _) = refused(decide_local(&head, &frame, None, &known).expect("decide"));
    let message =
        "'__mirror_state' is the kafka-mirror-proxy state topic, which only the proxy writes";
    assert_eq!(
        head.answer(&plan.local).expect("answer").as_deref(),
        Some(
            &response(
                9,
                &[(STATE, &[(0, TOPIC_AUTHORIZATION_FAILED, -1, Some(message))])]
            )[..]
        )
    );
    assert!(known.counted.borrow().is_empty());
}

#[test]
fn a_local_write_to_a_free_topic_is_forwarded() {
    let frame = request(9, -1, "client-a", &[(PAYMENTS, &[0])]);
    let known = Fake::read_only_orders();
    let decision = decide_local(&head(&frame), &frame, None, &known).expect("decide");
    assert!(matches!(decision, LocalDecision::Forward));
}

/// Without links nothing is read-only: the request is not walked at all
/// (a body the walk would refuse is forwarded as it came).
#[test]
fn without_links_a_local_write_is_not_walked() {
    let whole = request(9, -1, "client-a", &[(ORDERS, &[0])]);
    let head = head(&whole);
    let cut = whole.slice(..whole.len() - 10);
    let decision = decide_local(&head, &cut, None, &Fake::default()).expect("not walked");
    assert!(matches!(decision, LocalDecision::Forward));
    assert!(decide_local(&head, &cut, None, &Fake::read_only_orders()).is_err());
}

/// One request, a read-only topic and a free one: the read-only one is
/// answered here, the free one forwarded, byte for byte as a request
/// naming only it.
#[test]
fn a_local_write_mixing_read_only_and_free_topics_forwards_the_free_one() {
    let frame = request(9, -1, "client-a", &[(ORDERS, &[0]), (PAYMENTS, &[3])]);
    let head = head(&frame);
    let (plan, index) =
        refused(decide_local(&head, &frame, None, &Fake::read_only_orders()).expect("decide"));
    assert_split(
        &frame,
        &index,
        &plan,
        ("orders", 0),
        Refusal::ReadOnly,
        &request(9, -1, "client-a", &[(PAYMENTS, &[3])]),
    );
}

/// `plan` answers one partition here, `(topic, partition)`, refused as
/// `refusal`, and forwards the rest of `frame` as exactly `forwarded`.
fn assert_split(
    frame: &Bytes,
    index: &Index,
    plan: &ProducePlan,
    answered: (&str, i32),
    refusal: Refusal,
    forwarded: &[u8],
) {
    assert_eq!(plan.forwarded_partitions, 1);
    assert_eq!(plan.local.len(), 1, "{:?}", plan.local);
    let local = &plan.local[0];
    assert_eq!((&*local.topic.name.0, local.partition), answered);
    assert!(
        matches!(local.outcome, LocalOutcome::Refused { refusal: r, .. } if r == refusal),
        "{:?}",
        local.outcome
    );
    let reduced = produce::without_local_partitions(frame, index, &plan.local);
    assert_eq!(&reduced[..], forwarded);
}

/// Produce v13 names topics by id (KIP-516): a known id is refused as its
/// topic is, answered by id; an id not seen is learnt first, then refused
/// retriable if still unknown.
#[test]
fn v13_topic_ids_are_looked_up_and_answered_by_id() {
    let frame = request(13, -1, "client-a", &[(ORDERS, &[0])]);
    let head = head(&frame);
    let (plan, _) =
        refused(decide_local(&head, &frame, None, &Fake::read_only_orders()).expect("decide"));
    assert_eq!(
        head.answer(&plan.local).expect("answer").as_deref(),
        Some(
            &response(
                13,
                &[(ORDERS, &[(0, POLICY_VIOLATION, -1, Some(READ_ONLY))])]
            )[..]
        )
    );
    // The id is in the frame, the name is not.
    let at = frame.len()
        - frame
            .windows(16)
            .rev()
            .position(|w| w == ORDERS_ID.as_bytes())
            .expect("id")
        - 16;
    assert!(at > head.body_offset);
    assert!(!frame.windows(6).any(|w| w == b"orders"));
}

#[test]
fn an_unknown_topic_id_is_learnt_then_refused() {
    let frame = request(13, -1, "client-a", &[(ORDERS, &[0]), (PAYMENTS, &[1])]);
    let head = head(&frame);
    let mut known = Fake::read_only_orders();
    known.names.remove(&PAYMENTS_ID);
    let LocalDecision::LearnIds(index) = decide_local(&head, &frame, None, &known).expect("decide")
    else {
        panic!("an unknown id is learnt before anything is decided");
    };
    assert!(known.counted.borrow().is_empty());
    let (plan, _) = refused(decide_local(&head, &frame, Some(index), &known).expect("decide"));
    let unknown = "the topic id is not known to the proxy yet; refresh metadata and retry";
    assert_eq!(plan.forwarded_partitions, 0);
    assert_eq!(
        head.answer(&plan.local).expect("answer").as_deref(),
        Some(
            &response(
                13,
                &[
                    (ORDERS, &[(0, POLICY_VIOLATION, -1, Some(READ_ONLY))]),
                    (PAYMENTS, &[(1, UNKNOWN_TOPIC_ID, -1, Some(unknown))]),
                ]
            )[..]
        )
    );
}

#[test]
fn acks_0_is_refused_without_a_response() {
    let frame = request(9, 0, "client-a", &[(ORDERS, &[0])]);
    let head = head(&frame);
    let (plan, _) =
        refused(decide_local(&head, &frame, None, &Fake::read_only_orders()).expect("decide"));
    assert_eq!(plan.local.len(), 1);
    assert_eq!(head.answer(&plan.local).expect("answer"), None);
}

pub fn link() -> Link {
    Link::new(
        "east".into(),
        "MkU3OEVBNTcwNTJENDM2Qk"
            .parse::<ClusterId>()
            .expect("cluster id"),
        "mirror-east".into(),
        vec![Regex::new("^(?:orders)$").expect("regex")],
        Some("CN=replicator".into()),
        ControlBatchPolicy::Drop,
    )
}

/// A client using a link's client id without its certificate is refused
/// whole, whatever the state; a link's is refused while the state is not
/// loaded, and planned once it is.
#[test]
fn a_spoofed_link_is_refused_whole() {
    let link = link();
    let (refusal, message) = admit(&link, true, Ok(())).expect_err("spoofed");
    assert_eq!(refusal, Refusal::NotAuthorized);
    assert_eq!(
        message,
        "client id 'mirror-east' is reserved for mirror link 'east', which requires a TLS client certificate matching 'CN=replicator'"
    );
    let frame = request(9, -1, "mirror-east", &[(ORDERS, &[0]), (PAYMENTS, &[1])]);
    let head = head(&frame);
    let index = head.index(&frame).expect("index");
    let plan = produce::refuse_all(&frame, &index, refusal, &message);
    assert_eq!(
        head.answer(&plan.local).expect("answer").as_deref(),
        Some(
            &response(
                9,
                &[
                    (
                        ORDERS,
                        &[(0, TOPIC_AUTHORIZATION_FAILED, -1, Some(&message))]
                    ),
                    (
                        PAYMENTS,
                        &[(1, TOPIC_AUTHORIZATION_FAILED, -1, Some(&message))]
                    ),
                ]
            )[..]
        )
    );

    let (refusal, message) =
        admit(&link, false, Err::<(), _>("loading".into())).expect_err("not loaded");
    assert_eq!(refusal, Refusal::StateNotLoaded);
    assert!(message.contains("(loading); retry"), "{message}");
    assert_eq!(admit(&link, false, Ok(7)), Ok(7));
}

/// A link's request naming its mirrored topic and another: the other is
/// refused here (not mirrored), the mirrored one forwarded.
#[test]
fn a_link_write_mixing_mirrored_and_other_topics_refuses_the_other() {
    let frame = request(9, -1, "mirror-east", &[(ORDERS, &[0]), (PAYMENTS, &[1])]);
    let head = head(&frame);
    let index = head.index(&frame).expect("index");
    let known = Fake::read_only_orders();
    let plan = plan_link(
        &frame,
        &index,
        &link(),
        &known,
        &|_| None,
        &produce::Natural,
    );
    assert_split(
        &frame,
        &index,
        &plan,
        ("payments", 1),
        Refusal::TopicNotMirrored,
        &request(9, -1, "mirror-east", &[(ORDERS, &[0])]),
    );
}

/// After its waits a link's request goes on only if its link was not
/// fenced meanwhile and this instance still holds its lease.
#[test]
fn a_link_write_is_released_only_unfenced_within_the_lease() {
    let link = link();
    assert!(matches!(release(&link, None, None), Release::Go));
    assert!(matches!(
        release(&link, Some("fenced".into()), Some(std::time::Duration::from_secs(5))),
        Release::Fenced(m) if m == "fenced"
    ));
    assert!(matches!(
        release(&link, None, Some(std::time::Duration::from_millis(5000))),
        Release::LeaseLapsed(m) if m.contains("within its lease (5000 ms")
    ));
}
