//! The Produce response's walk, written out by hand like the request's
//! (`wire::produce_walk`, which says why), for every response to a Produce.
//!
//! It reads what the proxy needs of a response: per partition, the answer
//! to a mirrored batch (error code, base offset, log append time, the
//! leader the broker names). It stops at the one part it does not read:
//! leader endpoints (`NodeEndpoints`, KIP-951, v10+), which a broker sends
//! only when a leader moved and which the proxy must rewrite to its own
//! addresses. Then it says so, and the caller walks the response by its
//! schema (`proxy::addresses`), which checks and rewrites them.
//!
//! Up to that point it is held to the schema walk the same way as the
//! request's walk: a property test compares both, byte for byte, on every
//! version of the compiled-in schema, whole and damaged.
//!
//! Pure: bytes in, events out.

use super::produce_walk::{self, check_version, Reader, Topic, TAGGED};
use super::walk::WalkError;

/// The Produce response versions this walk knows: those of the schema.
pub(crate) const VERSIONS: (i16, i16) = (3, 13);
const FIRST_FLEXIBLE: i16 = 9;
const FIRST_BY_ID: i16 = 13;
const FIRST_LOG_START_OFFSET: i16 = 5;
const FIRST_RECORD_ERRORS: i16 = 8;
/// `CurrentLeader` and `NodeEndpoints` are tag 0 of their sections from here.
const FIRST_LEADERS: i16 = 10;

const RESPONSES: &str = "Responses";
const NAME: &str = "Responses.Name";
const TOPIC_ID: &str = "Responses.TopicId";
const PARTITIONS: &str = "Responses.PartitionResponses";
const INDEX: &str = "Responses.PartitionResponses.Index";
const ERROR_CODE: &str = "Responses.PartitionResponses.ErrorCode";
const BASE_OFFSET: &str = "Responses.PartitionResponses.BaseOffset";
const LOG_APPEND_TIME: &str = "Responses.PartitionResponses.LogAppendTimeMs";
const LOG_START_OFFSET: &str = "Responses.PartitionResponses.LogStartOffset";
const RECORD_ERRORS: &str = "Responses.PartitionResponses.RecordErrors";
const BATCH_INDEX: &str = "Responses.PartitionResponses.RecordErrors.BatchIndex";
const BATCH_ERROR: &str = "Responses.PartitionResponses.RecordErrors.BatchIndexErrorMessage";
const ERROR_MESSAGE: &str = "Responses.PartitionResponses.ErrorMessage";
const CURRENT_LEADER: &str = "Responses.PartitionResponses.CurrentLeader";
const LEADER_ID: &str = "Responses.PartitionResponses.CurrentLeader.LeaderId";
const LEADER_EPOCH: &str = "Responses.PartitionResponses.CurrentLeader.LeaderEpoch";
const THROTTLE: &str = "ThrottleTimeMs";

/// What the broker answered for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Partition {
    pub index: i32,
    pub error_code: i16,
    pub base_offset: i64,
    pub log_append_time_ms: i64,
    /// The leader the broker names (KIP-951, v10+), `-1` if none.
    pub leader_id: i32,
}

/// Receives what the walk reads, in response order.
pub(crate) trait Visitor<'a> {
    /// A topic entry starts; its partitions follow.
    fn topic(&mut self, topic: Topic<'a>);
    /// A partition entry of the last topic, once all of it has been read.
    fn partition(&mut self, partition: Partition);
}

/// How far the walk got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Walked {
    /// The whole response, which names no broker.
    Whole,
    /// Every partition, then leader endpoints: the response must be walked
    /// by its schema, which checks the rest and rewrites them.
    NamesBrokers,
}

/// Walk `input[start..]`, a Produce response body at `version`. Where it
/// returns `Whole` or an error, `wire::walk::walk` returns `Ok` or the same
/// error on the same bytes; the visitor sees the same values either way.
pub(crate) fn walk<'a, V: Visitor<'a>>(
    version: i16,
    input: &'a [u8],
    start: usize,
    visitor: &mut V,
) -> Result<Walked, WalkError> {
    check_version("ProduceResponse", version, VERSIONS)?;
    let mut r = Reader::new(input, start, version >= FIRST_FLEXIBLE);
    for _ in 0..r.count(RESPONSES)? {
        let topic = if version >= FIRST_BY_ID {
            Topic::Id(r.fixed(TOPIC_ID)?)
        } else {
            Topic::Name(r.string(NAME, false)?.unwrap_or_default())
        };
        visitor.topic(topic);
        for _ in 0..r.count(PARTITIONS)? {
            let partition = partition(&mut r, version)?;
            visitor.partition(partition);
        }
        r.tagged()?;
    }
    r.fixed::<4>(THROTTLE)?;
    for _ in 0..r.tagged_count()? {
        let (tag, size) = r.tag()?;
        if tag == 0 && version >= FIRST_LEADERS {
            return Ok(Walked::NamesBrokers);
        }
        r.take(TAGGED, u64::from(size))?;
    }
    r.finish("ProduceResponse")?;
    Ok(Walked::Whole)
}

fn partition(r: &mut Reader<'_>, version: i16) -> Result<Partition, WalkError> {
    let mut p = Partition {
        index: i32::from_be_bytes(r.fixed(INDEX)?),
        error_code: i16::from_be_bytes(r.fixed(ERROR_CODE)?),
        base_offset: i64::from_be_bytes(r.fixed(BASE_OFFSET)?),
        log_append_time_ms: i64::from_be_bytes(r.fixed(LOG_APPEND_TIME)?),
        leader_id: -1,
    };
    if version >= FIRST_LOG_START_OFFSET {
        r.fixed::<8>(LOG_START_OFFSET)?;
    }
    if version >= FIRST_RECORD_ERRORS {
        for _ in 0..r.count(RECORD_ERRORS)? {
            r.fixed::<4>(BATCH_INDEX)?;
            r.string(BATCH_ERROR, true)?;
            r.tagged()?;
        }
        r.string(ERROR_MESSAGE, true)?;
    }
    for _ in 0..r.tagged_count()? {
        let (tag, size) = r.tag()?;
        if tag != 0 || version < FIRST_LEADERS {
            r.take(TAGGED, u64::from(size))?;
            continue;
        }
        // CurrentLeader, read inside its declared size only.
        let data = r.take(CURRENT_LEADER, u64::from(size))?;
        let (read, used) = r.inside(data.clone(), current_leader);
        p.leader_id = read?;
        if used != data.len() {
            return Err(WalkError::TaggedSize {
                path: CURRENT_LEADER.into(),
                tag,
                size: data.len(),
                used,
            });
        }
    }
    Ok(p)
}

fn current_leader(r: &mut Reader<'_>) -> Result<i32, WalkError> {
    let leader = i32::from_be_bytes(r.fixed(LEADER_ID)?);
    r.fixed::<4>(LEADER_EPOCH)?;
    r.tagged()?;
    Ok(leader)
}

/// What a walk reported, recorded: to hold this walk to the schema walk.
pub(crate) type Event = produce_walk::Event<Partition>;

/// This walk's events and result.
pub(crate) fn events(
    version: i16,
    input: &[u8],
    start: usize,
) -> (Vec<Event>, Result<Walked, WalkError>) {
    struct Record(Vec<Event>);
    impl Visitor<'_> for Record {
        fn topic(&mut self, topic: Topic<'_>) {
            self.0.push(topic.into());
        }
        fn partition(&mut self, partition: Partition) {
            self.0.push(Event::Partition(partition));
        }
    }
    let mut r = Record(Vec::new());
    let result = walk(version, input, start, &mut r);
    (r.0, result)
}

/// The schema walk's events and result on the same input.
pub(crate) fn schema_events(
    version: i16,
    input: &[u8],
    start: usize,
) -> (Vec<Event>, Result<(), WalkError>) {
    use super::schema::{self, Field};
    use super::walk::{self, Edit, Value};
    struct Record {
        events: Vec<Event>,
        current: Partition,
    }
    impl walk::Visitor for Record {
        fn value(&mut self, field: &Field, value: Value<'_>) -> Edit {
            let p = &mut self.current;
            match (field.path.as_str(), value) {
                (NAME, Value::Str(Some(n))) => self.events.push(Event::Name(n.to_vec())),
                (TOPIC_ID, Value::Uuid(id)) => self.events.push(Event::Id(id)),
                (INDEX, Value::Int(i)) => p.index = i as i32,
                (ERROR_CODE, Value::Int(e)) => p.error_code = e as i16,
                (BASE_OFFSET, Value::Int(o)) => p.base_offset = o,
                (LOG_APPEND_TIME, Value::Int(t)) => p.log_append_time_ms = t,
                (LEADER_ID, Value::Int(l)) => p.leader_id = l as i32,
                _ => {}
            }
            Edit::Keep
        }
        fn enter(&mut self, field: &Field) {
            if field.path == PARTITIONS {
                self.current.leader_id = -1;
            }
        }
        fn leave(&mut self, field: &Field) -> bool {
            if field.path == PARTITIONS {
                self.events.push(Event::Partition(self.current));
            }
            true
        }
    }
    let Ok(msg) = schema::message("ProduceResponse") else {
        let e = produce_walk::version_error("ProduceResponse", version, VERSIONS);
        return (Vec::new(), Err(e));
    };
    let mut r = Record {
        events: Vec::new(),
        current: Partition {
            index: -1,
            error_code: 0,
            base_offset: -1,
            log_append_time_ms: -1,
            leader_id: -1,
        },
    };
    let result = walk::walk(msg, version, input, start, &mut r);
    (r.events, result)
}

#[cfg(test)]
mod tests;
