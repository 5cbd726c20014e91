//! The Produce filter on the link path and the spoofed path. Input: a whole
//! request frame (header and body). Invariants: no panic; the hand-written
//! Produce walk reports what the schema walk reports; applying the plan
//! changes at most 12 bytes per patched batch; a batch whose CRC was wrong
//! stays wrong and a right one stays right; a request re-emitted without
//! some partitions still walks.

use crate::mirror::link::{ControlBatchPolicy, Link};
use crate::mirror::produce::{self, Refusal};
use crate::wire::batch::crc_is_valid;
use crate::wire::header::{produce_acks, RequestHeaderPeek};
use crate::wire::produce_walk;
use bytes::{Bytes, BytesMut};
use std::sync::OnceLock;

/// Built once: compiling the topic regex per input would cost more than
/// the whole plan.
fn links() -> &'static [Link; 2] {
    static LINKS: OnceLock<[Link; 2]> = OnceLock::new();
    LINKS.get_or_init(|| {
        [
            link(ControlBatchPolicy::Drop),
            link(ControlBatchPolicy::Forward),
        ]
    })
}

fn link(policy: ControlBatchPolicy) -> Link {
    Link::new(
        "east".into(),
        "MkU3OEVBNTcwNTJENDM2Qk".parse().expect("cluster id"),
        "mirror-east".into(),
        vec![regex::Regex::new("^(?:orders|t.*)$").expect("regex")],
        None,
        policy,
    )
}

/// One input of the `produce_plan` fuzz target.
pub fn produce_plan(data: &[u8]) {
    let frame = Bytes::copy_from_slice(data);
    let Ok(h) = RequestHeaderPeek::parse(&frame) else {
        return;
    };
    let version = h.api_version;
    let header_version = if version >= 9 { 2 } else { 1 };
    let Ok(offset) = h.body_offset(&frame, header_version) else {
        return;
    };
    assert_eq!(
        produce_walk::events(version, &frame, offset),
        produce_walk::schema_events(version, &frame, offset),
        "the two Produce walks disagree"
    );
    let _ = produce_acks(&frame, offset, version);
    let Ok(index) = produce::index(&frame, offset, version) else {
        return;
    };
    let plan = produce::refuse_all(&frame, &index, Refusal::NotAuthorized, "m");
    // An answer the proxy builds itself is a small multiple of the request:
    // a partition's answer is a few dozen bytes, its entry at least six.
    if let Ok(answer) = produce::local_response(h.correlation_id, version, &plan.local) {
        assert!(
            answer.len() <= 8 * frame.len() + 1024,
            "an answer of {} bytes to a request of {}",
            answer.len(),
            frame.len()
        );
    }
    let topic_name = |_| Some(std::sync::Arc::from("orders"));
    for link in links() {
        let plan = produce::plan(&frame, &index, link, &topic_name);
        let mut patched = BytesMut::from(&frame[..]);
        plan.apply(&mut patched)
            .expect("a fresh plan applies to its own frame");
        let changed = frame
            .iter()
            .zip(patched.iter())
            .filter(|(a, b)| a != b)
            .count();
        assert!(
            changed <= 12 * plan.patches(),
            "{changed} bytes for {} batches",
            plan.patches()
        );
        for range in plan.patched_batches() {
            assert_eq!(
                crc_is_valid(&frame[range.clone()]),
                crc_is_valid(&patched[range]),
                "a patch changed whether a batch's CRC holds"
            );
        }
        if !plan.local.is_empty() && plan.forwarded_partitions > 0 {
            let reduced = produce::without_local_partitions(&patched, &index, &plan.local).freeze();
            let again =
                produce::index(&reduced, offset, version).expect("the re-emitted request walks");
            assert_eq!(again.partitions().len(), plan.forwarded_partitions);
        }
    }
}
