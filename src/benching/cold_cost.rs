//! The phases of one link Produce and one local Produce, for
//! `examples/cold_cost.rs`, which says what it measures and why.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use uuid::Uuid;

use super::ORDERS_ID;
use crate::client::protocol::{self, PartitionRef};
use crate::metrics::Metrics;
use crate::mirror::dedupe::{Begin, Dedupe, Writer};
use crate::mirror::link::{ControlBatchPolicy, Link};
use crate::mirror::origins::{Origins, PartitionId};
use crate::mirror::produce;
use crate::mirror::produce_response::Answers;
use crate::wire::batch::BASE_SEQUENCE_OFFSET;
use crate::wire::header::RequestHeaderPeek;
use crate::wire::produce_response_walk::Walked;

const VERSION: i16 = 13;
/// Records in the request's one batch (of 1 KiB each: 16 KiB in all).
const RECORDS: usize = 15;

/// A 16 KiB v13 request of one partition, one batch, from a known origin,
/// and what the Produce path looks it up in: the link, the topic-id table
/// and the origins view behind their locks, the dedupe.
pub struct ColdCost {
    link: Link,
    names: RwLock<HashMap<Uuid, Arc<str>>>,
    read_only: HashSet<String>,
    view: RwLock<Origins>,
    dedupe: Arc<Dedupe>,
    writer: Writer,
    template: BytesMut,
    batch_at: usize,
    body_offset: usize,
}

impl ColdCost {
    /// The phases, in the order a request runs them.
    pub const PHASES: [&'static str; 7] = [
        "plan",
        "apply",
        "begin",
        "answers",
        "settle",
        "any_topic",
        "response_walk",
    ];
    /// The first `LINK_PHASES` are the link's, the rest the local path's.
    pub const LINK_PHASES: usize = 5;

    #[allow(clippy::new_without_default)] // built once, at some cost
    pub fn new() -> ColdCost {
        let link = super::orders_link(ControlBatchPolicy::Forward);
        let at = PartitionId {
            topic_id: ORDERS_ID,
            partition: 0,
        };
        let view = super::known_origins(&link, ORDERS_ID, 1);
        let dedupe = Dedupe::new(
            10_000,
            1 << 20,
            std::time::Duration::from_secs(10),
            Arc::new(Metrics::new(["east"])),
        );
        let writer = dedupe.writer();
        dedupe.assume_rebuilt(at, writer);
        let b = super::batch(RECORDS, 1024);
        let template = request(&b);
        let batch_at = template
            .windows(b.len())
            .position(|w| w == &b[..])
            .expect("batch in frame");
        let body_offset = RequestHeaderPeek::parse(&template)
            .expect("peek")
            .body_offset(&template, ApiKey::Produce.request_header_version(VERSION))
            .expect("offset");
        ColdCost {
            link,
            names: RwLock::new(HashMap::from([(ORDERS_ID, Arc::from("orders"))])),
            read_only: HashSet::from(["mirrored".to_string()]),
            view: RwLock::new(view),
            dedupe,
            writer,
            template,
            batch_at,
            body_offset,
        }
    }

    /// Request `n` (new sequences, new offsets) through every phase: phase
    /// `k`'s work is run inside `phase(k, work)`, which times it.
    pub fn request(&self, n: usize, phase: &mut dyn FnMut(usize, &mut dyn FnMut())) {
        let seq = i32::try_from(n * RECORDS).expect("sequence");
        let mut frame = self.template.clone();
        let at = self.batch_at + BASE_SEQUENCE_OFFSET;
        frame[at..at + 4].copy_from_slice(&seq.to_be_bytes());
        let frame = frame.freeze();
        let resp = response(i64::from(seq));
        let now = 1_700_000_000_000 + n as i64;

        let mut plan = None;
        phase(0, &mut || {
            let v = self.view.read().expect("view");
            let index = produce::index(&frame, self.body_offset, VERSION).expect("index");
            plan = Some(produce::plan_with(
                &frame,
                &index,
                &self.link,
                &|id| self.names.read().ok()?.get(&id).cloned(),
                &|_| None,
                &produce::AtTime(&v, now),
            ));
        });
        let mut plan = plan.expect("planned");
        let mut frame = Some(frame);
        let mut buf = None;
        phase(1, &mut || {
            let mut b = frame.take().expect("once").try_into_mut().expect("unique");
            plan.apply(&mut b).expect("apply");
            buf = Some(b);
        });
        let mut tracked = None;
        phase(
            2,
            &mut || match self.dedupe.begin(&mut plan, "east", false, self.writer) {
                Begin::Begun(t) => tracked = Some(t),
                _ => panic!("not begun"),
            },
        );
        let tracked = tracked.expect("begun");
        assert!(!tracked.is_empty(), "request {n}: nothing begun");
        let mut tracked = Some(tracked);
        let mut found = None;
        phase(3, &mut || {
            let mut answers = tracked.as_ref().expect("begun").answers();
            let walked = answers.walk(&resp, VERSION).expect("walk");
            assert_eq!(walked, Walked::Whole);
            found = Some(answers.into_found());
        });
        let found = found.expect("walked");
        assert!(found[0].is_some());
        phase(4, &mut || tracked.take().expect("once").settle(&found, now));

        let frame = buf.expect("applied").freeze();
        phase(5, &mut || {
            let index = produce::index(&frame, self.body_offset, VERSION).expect("index");
            let hit = produce::any_topic(&frame, &index, |t| match t {
                produce::TopicKey::Id(id) => self
                    .names
                    .read()
                    .ok()
                    .and_then(|n| n.get(&id).cloned())
                    .is_some_and(|n| self.read_only.contains(&*n)),
                produce::TopicKey::Name(n) => self.read_only.contains(n),
            });
            assert!(!hit);
        });
        phase(6, &mut || {
            let walked = Answers::new(std::iter::empty())
                .walk(&resp, VERSION)
                .expect("walk");
            assert_eq!(walked, Walked::Whole);
        });
    }
}

/// A v13 Produce of `b` to partition 0 of `orders`, as the link sends it.
fn request(b: &Bytes) -> BytesMut {
    let to = PartitionRef {
        topic: "orders",
        topic_id: ORDERS_ID,
        partition: 0,
        leader_epoch: -1,
    };
    let body = protocol::produce_request(VERSION, &to, b.clone(), 30_000).expect("request");
    protocol::encode_request(&body, VERSION, 1, "mirror-east").expect("frame")
}

/// The broker's answer to [`request`]: appended at `base_offset`.
fn response(base_offset: i64) -> Bytes {
    let body = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
        .with_topic_id(ORDERS_ID)
        .with_partition_responses(vec![PartitionProduceResponse::default()
            .with_index(0)
            .with_base_offset(base_offset)
            .with_log_append_time_ms(-1)])]);
    produce::encode_response(1, VERSION, &body)
        .expect("response")
        .freeze()
}

#[cfg(test)]
mod tests {
    use super::ColdCost;

    /// Every phase runs, once each and in order, and the request's own
    /// asserts (an origin known, a batch begun, an answer found) hold.
    #[test]
    fn a_request_runs_every_phase_once_in_order() {
        let cost = ColdCost::new();
        for n in 1..=3 {
            let mut seen = Vec::new();
            cost.request(n, &mut |k, work| {
                seen.push(k);
                work();
            });
            assert_eq!(seen, (0..ColdCost::PHASES.len()).collect::<Vec<_>>());
        }
    }
}
