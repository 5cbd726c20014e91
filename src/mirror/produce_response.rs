//! What a broker's Produce response says about the partitions a link
//! request is tracking, read by the one walk every Produce response gets
//! (`wire::produce_response_walk`), which allocates nothing per topic or
//! partition.
//!
//! The response half of a link Produce needs four numbers per tracked
//! partition (error code, base offset, log append time, the leader the
//! broker names). Pure: bytes in, answers out.

use kafka_protocol::messages::ApiKey;
use smallvec::SmallVec;
use uuid::Uuid;

use crate::mirror::produce::{ProduceError, TopicRef};
use crate::wire::produce_response_walk::{self, Partition, Walked};
use crate::wire::produce_walk::Topic;
use crate::wire::{header, ReadError};

/// What the broker answered for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionAnswer {
    pub error_code: i16,
    pub base_offset: i64,
    /// `-1` unless the topic uses log append time.
    pub log_append_time_ms: i64,
    /// The leader the broker names (KIP-951, v10+), `-1` if none.
    pub leader_id: i32,
}

/// A walk visitor that finds the answers to the partitions `asked`, in
/// their order. Topics are matched as the request named them: by name
/// before v13, by id from v13. The first answer for a partition counts.
pub(crate) struct Answers<'q> {
    /// Inline for the usual request of a partition or two: no allocation.
    asked: SmallVec<[Asked<'q>; 2]>,
}

/// One asked partition and what was found for it.
struct Asked<'q> {
    topic: &'q TopicRef,
    partition: i32,
    /// Whether it is of the topic being walked.
    in_topic: bool,
    found: Option<PartitionAnswer>,
}

impl<'q> Answers<'q> {
    /// A visitor for the answers to the partitions `asked` (none: the walk
    /// only checks the response).
    pub(crate) fn new(asked: impl IntoIterator<Item = (&'q TopicRef, i32)>) -> Answers<'q> {
        Answers {
            asked: asked
                .into_iter()
                .map(|(topic, partition)| Asked {
                    topic,
                    partition,
                    in_topic: false,
                    found: None,
                })
                .collect(),
        }
    }

    /// The answer to each asked partition, in the order asked (`None`: the
    /// response does not mention it). Inline, like `asked`.
    pub(crate) fn into_found(self) -> SmallVec<[Option<PartitionAnswer>; 2]> {
        self.asked.iter().map(|a| a.found).collect()
    }

    /// Walk the Produce response `frame` (header and body, no size prefix)
    /// of `version`. `NamesBrokers`: it names leader endpoints, and must be
    /// walked by its schema too (`filter::addresses::rewrite`), which checks
    /// what this walk left and rewrites them; every answer was read before.
    pub(crate) fn walk(&mut self, frame: &[u8], version: i16) -> Result<Walked, ProduceError> {
        let malformed = |cause: ReadError| ProduceError::Malformed { version, cause };
        let start =
            header::response_body_offset(frame, ApiKey::Produce.response_header_version(version))
                .ok_or_else(|| malformed(ReadError::TruncatedHeader))?;
        produce_response_walk::walk(version, frame, start, self).map_err(|e| malformed(e.into()))
    }
}

impl<'a> produce_response_walk::Visitor<'a> for Answers<'_> {
    fn topic(&mut self, topic: Topic<'a>) {
        match topic {
            Topic::Name(name) => {
                for a in &mut self.asked {
                    a.in_topic = a.topic.name.0.as_bytes() == name;
                }
            }
            Topic::Id(id) => {
                let id = Uuid::from_bytes(id);
                for a in &mut self.asked {
                    a.in_topic = a.topic.topic_id == id;
                }
            }
        }
    }

    fn partition(&mut self, p: Partition) {
        for a in &mut self.asked {
            if a.in_topic && a.partition == p.index && a.found.is_none() {
                a.found = Some(PartitionAnswer {
                    error_code: p.error_code,
                    base_offset: p.base_offset,
                    log_append_time_ms: p.log_append_time_ms,
                    leader_id: p.leader_id,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests;
