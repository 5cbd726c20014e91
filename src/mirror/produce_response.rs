//! What a broker's Produce response says about the partitions a link
//! request is tracking, read by one walk of the response that allocates
//! nothing per topic or partition.
//!
//! The response half of a link Produce needs four numbers per tracked
//! partition (error code, base offset, log append time, the leader the
//! broker names). Decoding the whole response for them cost a validation
//! pass, a decode pass and an allocation per topic and partition, on every
//! link response; this visitor rides along the walk the response already
//! gets for its leader endpoints (v10+), or walks it once itself (older
//! versions). Pure: bytes in, answers out.

use kafka_protocol::messages::ApiKey;
use smallvec::SmallVec;
use uuid::Uuid;

use crate::mirror::produce::{ProduceError, TopicRef};
use crate::wire::schema::Field;
use crate::wire::walk::{self, Edit, Value, Visitor};
use crate::wire::{header, schema};

/// What the broker answered for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionAnswer {
    pub error_code: i16,
    pub base_offset: i64,
    /// `-1` unless the topic uses log append time.
    pub log_append_time_ms: i64,
    /// The leader the broker names (KIP-951, v10+), `-1` if none.
    pub leader_id: i32,
}

impl PartitionAnswer {
    /// The values a partition response starts from before its fields are
    /// read (the tagged `CurrentLeader` may be absent).
    const UNSET: PartitionAnswer = PartitionAnswer {
        error_code: 0,
        base_offset: -1,
        log_append_time_ms: -1,
        leader_id: -1,
    };
}

/// A walk visitor that finds the answers to the partitions `asked`, in
/// their order. Topics are matched as the request named them: by name
/// before v13, by id from v13. The first answer for a partition counts.
pub struct Answers<'q> {
    by_id: bool,
    /// Inline for the usual request of a partition or two: no allocation.
    asked: SmallVec<[Asked<'q>; 2]>,
    index: i32,
    current: PartitionAnswer,
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
    /// A visitor for a response of `version` to the partitions `asked`.
    pub fn new(version: i16, asked: impl IntoIterator<Item = (&'q TopicRef, i32)>) -> Answers<'q> {
        Answers {
            by_id: version >= 13,
            asked: asked
                .into_iter()
                .map(|(topic, partition)| Asked {
                    topic,
                    partition,
                    in_topic: false,
                    found: None,
                })
                .collect(),
            index: -1,
            current: PartitionAnswer::UNSET,
        }
    }

    /// The answer to each asked partition, in the order asked (`None`: the
    /// response does not mention it).
    pub fn into_found(self) -> Vec<Option<PartitionAnswer>> {
        self.asked.iter().map(|a| a.found).collect()
    }

    /// Walk the Produce response `frame` (header and body, no size prefix)
    /// with this visitor alone: for versions whose response carries no
    /// broker address, which nothing else walks.
    pub fn walk(&mut self, frame: &[u8], version: i16) -> Result<(), ProduceError> {
        let malformed = |reason: String| ProduceError::Malformed { version, reason };
        let msg = schema::message("ProduceResponse").map_err(|e| malformed(e.to_string()))?;
        let start =
            header::response_body_offset(frame, ApiKey::Produce.response_header_version(version))
                .ok_or_else(|| malformed("truncated response header".into()))?;
        walk::walk(msg, version, frame, start, self).map_err(|e| malformed(e.to_string()))
    }
}

impl Visitor for Answers<'_> {
    fn value(&mut self, field: &Field, value: Value<'_>) -> Edit {
        match (field.path.as_str(), value) {
            ("Responses.Name", Value::Str(name)) if !self.by_id => {
                let name = name.unwrap_or_default();
                for a in &mut self.asked {
                    a.in_topic = a.topic.name.0.as_bytes() == name;
                }
            }
            ("Responses.TopicId", Value::Uuid(id)) if self.by_id => {
                let id = Uuid::from_bytes(id);
                for a in &mut self.asked {
                    a.in_topic = a.topic.topic_id == id;
                }
            }
            ("Responses.PartitionResponses.Index", Value::Int(i)) => self.index = i as i32,
            ("Responses.PartitionResponses.ErrorCode", Value::Int(e)) => {
                self.current.error_code = e as i16
            }
            ("Responses.PartitionResponses.BaseOffset", Value::Int(o)) => {
                self.current.base_offset = o
            }
            ("Responses.PartitionResponses.LogAppendTimeMs", Value::Int(t)) => {
                self.current.log_append_time_ms = t
            }
            ("Responses.PartitionResponses.CurrentLeader.LeaderId", Value::Int(l)) => {
                self.current.leader_id = l as i32
            }
            _ => {}
        }
        Edit::Keep
    }

    fn enter(&mut self, field: &Field) {
        match field.path.as_str() {
            "Responses" => self.asked.iter_mut().for_each(|a| a.in_topic = false),
            "Responses.PartitionResponses" => {
                self.index = -1;
                self.current = PartitionAnswer::UNSET;
            }
            _ => {}
        }
    }

    fn leave(&mut self, field: &Field) -> bool {
        if field.path == "Responses.PartitionResponses" {
            for a in &mut self.asked {
                if a.in_topic && a.partition == self.index && a.found.is_none() {
                    a.found = Some(self.current);
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;
