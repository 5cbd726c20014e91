//! The Produce filter of a mirror link: find every record batch in a Produce
//! request, decide per partition what happens to it, and patch the producer
//! IDs in place.
//!
//! Pure: it takes the request frame as received and returns a plan. The
//! common case (every partition accepted) is applied as an 8-byte patch plus
//! a CRC update per batch on the frame itself, which is then forwarded: no
//! re-encoding, no copy of records, no decompression. Only when some
//! partitions are answered by the proxy itself (refused, or control batches
//! dropped) is the request re-encoded without them, and the broker's response
//! merged with the proxy's answers.

use std::collections::hash_map::{Entry, HashMap};
use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use smallvec::SmallVec;
use uuid::Uuid;

use crate::metrics::mirrored::MirroredBatches;
use crate::mirror::link::{ControlBatchPolicy, Link};
use crate::mirror::origins::{OriginId, Origins, PartitionId};
use crate::mirror::pid::{cluster_hash, map_pid, Mapping, NO_PRODUCER_ID};
use crate::mirror::producer_state::{BatchId, RefusalKind};
use crate::wire::batch::{crc_is_valid, plan_producer_id_patch, BatchHeader, Batches, PidPatch};
pub(crate) use crate::wire::produce_walk::Index;
use crate::wire::produce_walk::{IndexedPartition, IndexedTopic, Topic};
use crate::wire::write;
use crate::wire::{produce_walk, schema, walk, CodecError, ReadError};

/// Why a Produce request could not be handled at all (the connection is
/// closed: nothing of it is forwarded).
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("unparseable Produce v{version} body")]
    Malformed {
        version: i16,
        #[source]
        cause: ReadError,
    },
    #[error("Produce v{0} is not supported (the proxy parses v3 to v13)")]
    UnsupportedVersion(i16),
    #[error("a Produce rewrite plan does not match the frame it is applied to")]
    StalePlan,
    #[error("could not encode Produce v{version}")]
    Encode {
        version: i16,
        #[source]
        cause: CodecError,
    },
}

/// A topic as the request names it: by name before v13, by id from v13
/// (the other field empty: the default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopicRef {
    pub name: TopicName,
    pub topic_id: Uuid,
}

/// Why the proxy answered a partition itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The topic is not one of the link's mirrored topics.
    TopicNotMirrored,
    /// A v13 topic id the proxy has not seen in any Metadata response yet.
    UnknownTopicId,
    /// A record batch whose header cannot be read.
    MalformedBatch,
    /// A record batch whose CRC does not match its bytes.
    CorruptBatch,
    /// A client that used a link's client id without the link's certificate.
    NotAuthorized,
    /// The state topic is not loaded yet (start-up, or unreachable).
    StateNotLoaded,
    /// A new origin's mapping could not be persisted to the state topic.
    StateWriteFailed,
    /// Mirrored producer state (SPEC §6): an epoch lower than the
    /// producer's last one.
    InvalidProducerEpoch,
    /// Mirrored producer state: a sequence overlapping an appended batch
    /// without being an exact duplicate (or a partition mixing duplicates
    /// with new batches, which the proxy cannot split).
    OutOfOrderSequence,
    /// Mirrored producer state: the same batch is in flight to the broker
    /// on another request; answered retriable rather than appended twice.
    RetryInFlight,
    /// A local write to a topic of a link that is not `STOPPED` (read-only
    /// mirrored topic): POLICY_VIOLATION.
    ReadOnly,
    /// The same, answered READ_ONLY_TOPIC (`MIRROR_PROXY_READ_ONLY_ERROR`).
    ReadOnlyTopic,
    /// A Produce of a link that is failing over or failed over.
    LinkFenced,
    /// Mirrored producer state: the partition's state could not be rebuilt
    /// from its log tail (unreadable, or still being rebuilt by another
    /// request past the wait), so its batches cannot be checked yet.
    StateNotRebuilt,
    /// Mirrored producer state: a new producer while the state holds its
    /// bound of producers, each with a batch in flight (none may be
    /// evicted); retriable.
    ProducerStateFull,
    /// A link Produce naming one partition more than once: the whole
    /// request is refused (INVALID_REQUEST). No producer sends one, the
    /// broker would keep only one entry per partition, and the proxy tracks
    /// each partition once per request.
    DuplicatePartition,
    /// A client's write to the proxy's state topic, which only the proxy
    /// writes: TOPIC_AUTHORIZATION_FAILED.
    StateTopic,
    /// Mirrored producer state: an earlier batch of the same producer was
    /// sent and its answer lost; the broker may still append it, so the
    /// producer waits (retriable) until the log shows whether it did.
    OutcomeUnknown,
}

/// READ_ONLY_TOPIC as the issue names it. Not in Kafka 4.4.0's `Errors`
/// (nor in kafka-protocol 0.18), where code 134 is GROUP_DELETION_FAILED:
/// a Java client reading 134 from a Produce would report that.
pub(crate) const READ_ONLY_TOPIC: i16 = 134;
/// The first Produce version whose clients know READ_ONLY_TOPIC. Kafka
/// 4.4.0 defines Produce up to v13 (ProduceRequest.json, "3-13") and no
/// READ_ONLY_TOPIC: no KIP or Produce version introduced it there, so
/// every version the proxy parses falls back to POLICY_VIOLATION.
pub(crate) const READ_ONLY_TOPIC_MIN_PRODUCE_VERSION: i16 = 14;

impl From<RefusalKind> for Refusal {
    fn from(kind: RefusalKind) -> Refusal {
        match kind {
            RefusalKind::InvalidProducerEpoch => Refusal::InvalidProducerEpoch,
            RefusalKind::OutOfOrderSequence => Refusal::OutOfOrderSequence,
            RefusalKind::StateFull => Refusal::ProducerStateFull,
        }
    }
}

impl Refusal {
    /// Every refusal, so that each reason's series can be shown at zero
    /// before it first happens (a new variant belongs here and in
    /// [`label`](Self::label)).
    pub(crate) const ALL: &[Refusal] = &[
        Refusal::TopicNotMirrored,
        Refusal::UnknownTopicId,
        Refusal::MalformedBatch,
        Refusal::CorruptBatch,
        Refusal::NotAuthorized,
        Refusal::StateNotLoaded,
        Refusal::StateWriteFailed,
        Refusal::InvalidProducerEpoch,
        Refusal::OutOfOrderSequence,
        Refusal::RetryInFlight,
        Refusal::ReadOnly,
        Refusal::ReadOnlyTopic,
        Refusal::LinkFenced,
        Refusal::StateNotRebuilt,
        Refusal::ProducerStateFull,
        Refusal::DuplicatePartition,
        Refusal::StateTopic,
        Refusal::OutcomeUnknown,
    ];

    pub(crate) fn label(self) -> &'static str {
        match self {
            Refusal::TopicNotMirrored => "topic_not_mirrored",
            Refusal::UnknownTopicId => "unknown_topic_id",
            Refusal::MalformedBatch => "malformed_batch",
            Refusal::CorruptBatch => "corrupt_batch",
            Refusal::NotAuthorized => "not_authorized",
            Refusal::StateNotLoaded => "state_not_loaded",
            Refusal::StateWriteFailed => "state_write_failed",
            Refusal::InvalidProducerEpoch => "invalid_producer_epoch",
            Refusal::OutOfOrderSequence => "out_of_order_sequence",
            Refusal::RetryInFlight => "retry_in_flight",
            Refusal::ReadOnly | Refusal::ReadOnlyTopic => "read_only",
            Refusal::LinkFenced => "link_fenced",
            Refusal::StateNotRebuilt => "producer_state_not_rebuilt",
            Refusal::ProducerStateFull => "producer_state_full",
            Refusal::DuplicatePartition => "duplicate_partition",
            Refusal::StateTopic => "state_topic",
            Refusal::OutcomeUnknown => "outcome_unknown",
        }
    }

    fn error(self) -> ResponseError {
        match self {
            Refusal::TopicNotMirrored => ResponseError::PolicyViolation,
            Refusal::UnknownTopicId => ResponseError::UnknownTopicId,
            Refusal::MalformedBatch | Refusal::CorruptBatch => ResponseError::CorruptMessage,
            Refusal::NotAuthorized | Refusal::StateTopic => ResponseError::TopicAuthorizationFailed,
            // Both retriable for every Kafka client (Java: RetriableException;
            // librdkafka retries them), and neither makes a client refresh
            // anything it should not.
            Refusal::StateNotLoaded
            | Refusal::StateNotRebuilt
            | Refusal::ProducerStateFull
            | Refusal::OutcomeUnknown => ResponseError::NotEnoughReplicas,
            Refusal::StateWriteFailed => ResponseError::NotEnoughReplicasAfterAppend,
            Refusal::InvalidProducerEpoch => ResponseError::InvalidProducerEpoch,
            Refusal::OutOfOrderSequence => ResponseError::OutOfOrderSequenceNumber,
            // Retriable (Java: TimeoutException is a RetriableException; an
            // idempotent producer resends the batch with the same epoch and
            // sequence), and by then the first attempt has an outcome.
            Refusal::RetryInFlight => ResponseError::RequestTimedOut,
            // Non-retriable for every client (Java: PolicyViolationException).
            Refusal::ReadOnly => ResponseError::PolicyViolation,
            Refusal::ReadOnlyTopic => ResponseError::Unknown(READ_ONLY_TOPIC),
            // Fatal for an idempotent or transactional producer (Java and
            // librdkafka stop it: it must be closed), non-retriable for any
            // other: the replicator is fenced, not paused.
            Refusal::LinkFenced => ResponseError::ProducerFenced,
            Refusal::DuplicatePartition => ResponseError::InvalidRequest,
        }
    }
}

/// What the proxy answers for a partition the broker does not see.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalOutcome {
    Refused {
        refusal: Refusal,
        /// Shared by every partition refused for the same reason: a
        /// request of many entries costs one message, not one per entry.
        message: Arc<str>,
    },
    /// Control batches acknowledged without writing (`drop` policy).
    DroppedControl { batches: usize },
    /// Every batch of the partition was already appended (mirrored producer
    /// state): answered with error NONE and the first one's base offset.
    Duplicate { base_offset: i64, batches: usize },
}

#[derive(Debug, Clone, PartialEq)]
pub struct LocalPartition {
    /// Shared by the answers to one topic entry: a request of many entries
    /// costs a few words an entry here, not a copy of the name.
    pub topic: Arc<TopicRef>,
    pub partition: i32,
    /// Its entry's place in the request's `Index`.
    pub entry: u32,
    pub outcome: LocalOutcome,
}

/// How many of the partitions a response answers locally carry their
/// refusal's message; the others carry the error code alone. A request of
/// many entries (a client's mistake, or a hostile one) then costs an answer
/// of a few dozen bytes an entry, never a copy of the message per entry.
const MESSAGES_PER_RESPONSE: usize = 64;

impl LocalPartition {
    fn response(&self, with_message: bool) -> PartitionProduceResponse {
        let mut r = PartitionProduceResponse::default()
            .with_index(self.partition)
            .with_base_offset(-1)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(-1);
        match &self.outcome {
            LocalOutcome::Refused { refusal, message } => {
                r = r
                    .with_error_code(refusal.error().code())
                    .with_error_message(
                        with_message.then(|| StrBytes::from_string(message.to_string())),
                    );
            }
            LocalOutcome::Duplicate { base_offset, .. } => r = r.with_base_offset(*base_offset),
            LocalOutcome::DroppedControl { .. } => {}
        }
        r
    }
}

/// The decision for one Produce request.
#[derive(Debug, Default)]
pub struct ProducePlan {
    /// (where the batch is in the frame, patch) for every batch to remap.
    patches: Vec<(Range<usize>, PidPatch)>,
    /// Partitions the proxy answers itself.
    pub local: Vec<LocalPartition>,
    /// Partitions that go to the broker.
    pub forwarded_partitions: usize,
    /// Batches whose producer id changes.
    pub remapped_batches: usize,
    /// Origins with no mapped PID yet, with their partition (answered with
    /// [`Refusal::StateWriteFailed`] in `local` unless resolved and planned
    /// again).
    pub unresolved: Vec<Unresolved>,
    /// Forwarded partitions holding batches with a sequence, for the
    /// mirrored producer state (their batches with the mapped PID).
    pub tracked: Vec<TrackedPartition>,
    /// Every forwarded partition entry with records, in request order (the
    /// tracked ones among them), with what its batch headers say, for the
    /// link's figures once the broker acknowledges it.
    pub mirrored: Vec<MirroredPartition>,
}

/// A forwarded partition entry of a link write and its batches' figures.
#[derive(Debug, Clone, PartialEq)]
pub struct MirroredPartition {
    /// The same `Arc` as its [`TrackedPartition`]'s, if it has one.
    pub topic: Arc<TopicRef>,
    pub partition: i32,
    pub batches: MirroredBatches,
}

/// The tracked batches of one partition: inline room for one, as a
/// producer sends at most one batch per partition per request. (The plan
/// itself keeps its vectors on the heap: it lives in every connection's
/// task, whose size idle connections pay for.)
pub(crate) type TrackedBatches = SmallVec<[TrackedBatch; 1]>;

/// A forwarded partition whose batches the mirrored producer state checks.
#[derive(Debug, Clone, PartialEq)]
pub struct TrackedPartition {
    pub topic: Arc<TopicRef>,
    pub partition: PartitionId,
    /// Its entry's place in the request's `Index`.
    pub entry: u32,
    /// Every batch of the partition entry (tracked or not).
    pub batch_count: usize,
    /// The batches with a producer id and a sequence, in order.
    pub batches: TrackedBatches,
}

/// One batch with a sequence, as it will reach the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TrackedBatch {
    /// With the mapped producer id.
    pub id: BatchId,
    /// Whom the mapped producer id stands for: the state is kept per
    /// origin, so an expired origin's mapped PID, reused by another, starts
    /// afresh.
    pub origin: OriginId,
    /// Offsets taken by the partition entry's batches before this one: its
    /// base offset is the partition's (the first batch's) plus this.
    pub offset_delta: i64,
}

/// An origin the plan found no mapped PID for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unresolved {
    /// The topic's name (its id may still be unknown: nil).
    pub topic: String,
    pub partition: PartitionId,
    pub origin: OriginId,
}

/// Where the Produce filter gets mapped PIDs from.
pub(crate) trait OriginLookup {
    /// The mapped PID of `origin` in `partition`, or `None` when it must
    /// first be resolved (and persisted).
    fn mapped(&self, partition: PartitionId, origin: OriginId) -> Option<i64>;
}

/// The bit-field mapping alone, with no collision detection: every PID
/// maps to its natural slot; unplaceable ones are unresolved. For tests.
pub(crate) struct Natural;

impl OriginLookup for Natural {
    fn mapped(&self, _: PartitionId, o: OriginId) -> Option<i64> {
        if o.pid < 0 {
            return Some(o.pid);
        }
        match map_pid(cluster_hash(&o.source), o.pid) {
            Mapping::Mapped(m) => Some(m),
            _ => None,
        }
    }
}

/// The state topic's view at a time (ms), which a lookup records as the
/// origin's last-seen time.
pub(crate) struct AtTime<'a>(pub &'a Origins, pub i64);

impl OriginLookup for AtTime<'_> {
    fn mapped(&self, p: PartitionId, o: OriginId) -> Option<i64> {
        if p.topic_id.is_nil() {
            return None; // resolved with the topic's id from metadata
        }
        self.0.lookup(p, o, self.1)
    }
}

impl ProducePlan {
    pub fn patches(&self) -> usize {
        self.patches.len()
    }

    /// Where the batches the plan patches are in the frame.
    pub fn patched_batches(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        self.patches.iter().map(|(range, _)| range.clone())
    }

    /// Patch every planned batch in the frame the plan was made from. Each
    /// patch re-checks the batch it lands on, so a plan applied to the wrong
    /// frame fails instead of corrupting it.
    pub(crate) fn apply(&self, frame: &mut [u8]) -> Result<(), ProduceError> {
        for (range, patch) in &self.patches {
            let batch = frame
                .get_mut(range.clone())
                .ok_or(ProduceError::StalePlan)?;
            patch.apply(batch).map_err(|_| ProduceError::StalePlan)?;
        }
        Ok(())
    }
}

/// The Produce versions of Kafka's own definition (v3 to v13 for Kafka
/// 4.4; v0 to v2 are refused by 4.x brokers): the hand walk's
/// (`produce_walk::VERSIONS`) must be these.
#[cfg(test)]
pub(crate) fn supported_versions() -> (i16, i16) {
    match schema::message("ProduceRequest") {
        Ok(m) => (m.valid.min, m.valid.max),
        Err(_) => (1, 0),
    }
}

/// Refuse a version the proxy does not parse, before walking it.
fn check_version(version: i16) -> Result<(), ProduceError> {
    let (min, max) = produce_walk::VERSIONS;
    match (min..=max).contains(&version) {
        true => Ok(()),
        false => Err(ProduceError::UnsupportedVersion(version)),
    }
}

/// Index the Produce request in `frame` (its body at `body_offset`): the
/// one walk that every decision about the request then reads. A request
/// that cannot be walked, or names a topic whose name is not UTF-8, is
/// malformed: nothing of it is forwarded.
pub fn index(frame: &[u8], body_offset: usize, version: i16) -> Result<Index, ProduceError> {
    check_version(version)?;
    let malformed = |cause: ReadError| ProduceError::Malformed { version, cause };
    let index = Index::new(version, frame, body_offset).map_err(|e| malformed(e.into()))?;
    let not_utf8 = |t: &IndexedTopic| match index.topic(frame, t) {
        Topic::Name(name) => std::str::from_utf8(name).is_err(),
        Topic::Id(_) => false,
    };
    if index.topics().iter().any(not_utf8) {
        return Err(malformed(ReadError::TopicNotUtf8));
    }
    Ok(index)
}

/// A topic entry as the request names it, borrowed from the frame.
fn topic_key<'f>(frame: &'f [u8], index: &Index, topic: &IndexedTopic) -> TopicKey<'f> {
    match index.topic(frame, topic) {
        // UTF-8 was checked when the request was indexed.
        Topic::Name(name) => TopicKey::Name(std::str::from_utf8(name).unwrap_or_default()),
        Topic::Id(id) => TopicKey::Id(Uuid::from_bytes(id)),
    }
}

/// A topic entry as the proxy's answers name it. The name is copied: a
/// plan that kept a slice of the frame would make the frame shared, and the
/// patched frame a copy of the whole request instead of the frame itself.
fn topic_ref(frame: &[u8], index: &Index, topic: &IndexedTopic) -> TopicRef {
    match index.topic(frame, topic) {
        Topic::Name(name) => TopicRef {
            name: TopicName(StrBytes::from_string(
                String::from_utf8_lossy(name).into_owned(),
            )),
            ..TopicRef::default()
        },
        Topic::Id(id) => TopicRef {
            topic_id: Uuid::from_bytes(id),
            ..TopicRef::default()
        },
    }
}

/// A partition named twice in the request (by the same topic, in one
/// topic entry or two): its topic and index. Sorted, not scanned, so a
/// request of many entries costs `n log n`.
fn named_twice<'f>(frame: &'f [u8], index: &Index) -> Option<(TopicKey<'f>, i32)> {
    let topics = index.topics();
    let mut entries: SmallVec<[(&[u8], i32, u32); 8]> = index
        .partitions()
        .iter()
        .map(|p| {
            let t = &topics[p.topic as usize];
            (index.key(frame, t), p.index, p.topic)
        })
        .collect();
    entries.sort_unstable_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
    let w = entries
        .windows(2)
        .find(|w| (w[0].0, w[0].1) == (w[1].0, w[1].1))?;
    let (_, partition, topic) = w[0];
    Some((topic_key(frame, index, &topics[topic as usize]), partition))
}

/// Plan the rewrite of a Produce request sent on `link` with the natural
/// bit-field mapping and no state (tests, benchmarks).
pub fn plan(
    frame: &Bytes,
    index: &Index,
    link: &Link,
    topic_name: &dyn Fn(Uuid) -> Option<Arc<str>>,
) -> ProducePlan {
    plan_with(frame, index, link, topic_name, &|_| None, &Natural)
}

/// Plan the rewrite of a Produce request sent on `link`. `frame` is the
/// request without its size prefix and `index` its index; `topic_name`
/// resolves v13 topic ids, `topic_id` the ids of topics named by older
/// versions; `origins` gives the mapped PID of every known origin.
///
/// Runs on every link request, between two of which the broker and the
/// producer have had the cores and their caches: it resolves each topic
/// entry once and allocates only what the plan keeps (the patches, the
/// tracked partitions; a partition's first tracked batch is kept inline).
pub(crate) fn plan_with(
    frame: &Bytes,
    index: &Index,
    link: &Link,
    topic_name: &dyn Fn(Uuid) -> Option<Arc<str>>,
    topic_id: &dyn Fn(&str) -> Option<Uuid>,
    origins: &dyn OriginLookup,
) -> ProducePlan {
    let version = index.version();
    if index.partitions().len() > 1 {
        if let Some((topic, partition)) = named_twice(frame, index) {
            let topic = match topic {
                TopicKey::Id(id) => id.to_string(),
                TopicKey::Name(name) => name.to_string(),
            };
            return refuse_all(
                frame,
                index,
                Refusal::DuplicatePartition,
                &format!(
                    "mirror link '{}': the request names partition {partition} of topic {topic} more than once; refused whole",
                    link.name()
                ),
            );
        }
    }
    let mut plan = ProducePlan::default();
    for t in index.topics() {
        let topic =
            RequestTopic::resolve(topic_ref(frame, index, t), version, topic_name, topic_id);
        // A topic refused whole costs one message, shared by its entries.
        if let Some((refusal, message)) = topic.refused(version, link) {
            refuse_entries(&mut plan, index, t, &topic.topic, refusal, message);
            continue;
        }
        for entry in t.partitions() {
            let p = &index.partitions()[entry];
            plan_entry(&mut plan, frame, &topic, entry, p, version, link, origins);
        }
    }
    plan
}

/// Answer every partition entry of topic entry `t` with `refusal`.
fn refuse_entries(
    plan: &mut ProducePlan,
    index: &Index,
    t: &IndexedTopic,
    topic: &Arc<TopicRef>,
    refusal: Refusal,
    message: Arc<str>,
) {
    let entries = t.partitions();
    plan.local.reserve_exact(entries.len());
    for entry in entries {
        plan.local.push(LocalPartition {
            topic: topic.clone(),
            partition: index.partitions()[entry].index,
            entry: entry as u32,
            outcome: LocalOutcome::Refused {
                refusal,
                message: message.clone(),
            },
        });
    }
}

/// Plan one partition entry of a link request into `plan`.
#[allow(clippy::too_many_arguments)]
fn plan_entry(
    plan: &mut ProducePlan,
    frame: &[u8],
    topic: &RequestTopic,
    entry: usize,
    p: &IndexedPartition,
    version: i16,
    link: &Link,
    origins: &dyn OriginLookup,
) {
    let entry = entry as u32;
    let refuse = |refusal: Refusal, message: String| LocalPartition {
        topic: topic.topic.clone(),
        partition: p.index,
        entry,
        outcome: LocalOutcome::Refused {
            refusal,
            message: message.into(),
        },
    };
    let Some(name) = topic.name(version) else {
        // `plan_with` refuses a topic it cannot name before its entries.
        return;
    };
    let Some(records) = p.records() else {
        plan.forwarded_partitions += 1;
        return;
    };
    let base = records.start;
    let partition = PartitionId {
        topic_id: topic.id,
        partition: p.index,
    };
    let (unresolved, patches) = (plan.unresolved.len(), plan.patches.len());
    let planned = plan_partition(
        &frame[records],
        base,
        link,
        name,
        partition,
        origins,
        &mut plan.patches,
        &mut plan.unresolved,
    );
    let new_origins = plan.unresolved.len() > unresolved;
    if new_origins || !matches!(planned, Ok(PartitionPlan::Forward { .. })) {
        // Nothing of a partition answered here is patched.
        plan.patches.truncate(patches);
    }
    if new_origins {
        plan.local.push(refuse(
            Refusal::StateWriteFailed,
            format!(
                "mirror link '{}': {name}-{}: the producer id mapping of a new mirrored producer could not be persisted to the state topic; retry",
                link.name(),
                p.index
            ),
        ));
        return;
    }
    match planned {
        Ok(PartitionPlan::Forward {
            batch_count,
            tracked,
            mirrored,
        }) => {
            plan.forwarded_partitions += 1;
            plan.remapped_batches += plan.patches.len() - patches;
            plan.mirrored.push(MirroredPartition {
                topic: topic.topic.clone(),
                partition: p.index,
                batches: mirrored,
            });
            if !tracked.is_empty() {
                plan.tracked.push(TrackedPartition {
                    topic: topic.topic.clone(),
                    partition,
                    entry,
                    batch_count,
                    batches: tracked,
                });
            }
        }
        Ok(PartitionPlan::DropControl(batches)) => plan.local.push(LocalPartition {
            topic: topic.topic.clone(),
            partition: p.index,
            entry,
            outcome: LocalOutcome::DroppedControl { batches },
        }),
        Err((refusal, message)) => plan.local.push(refuse(refusal, message)),
    }
}

/// A topic of a link request, resolved once per request.
struct RequestTopic {
    /// As the request names it; shared by every answer to its entries.
    topic: Arc<TopicRef>,
    /// A v13 topic id's name (`None`: not known to the proxy yet).
    looked_up: Option<Arc<str>>,
    /// The topic's id (nil: not known yet).
    id: Uuid,
}

impl RequestTopic {
    fn resolve(
        topic: TopicRef,
        version: i16,
        topic_name: &dyn Fn(Uuid) -> Option<Arc<str>>,
        topic_id: &dyn Fn(&str) -> Option<Uuid>,
    ) -> RequestTopic {
        let (looked_up, id) = match version >= 13 {
            true => (topic_name(topic.topic_id), topic.topic_id),
            false => (
                None,
                topic_id(topic.name.0.as_str()).unwrap_or_else(Uuid::nil),
            ),
        };
        RequestTopic {
            topic: Arc::new(topic),
            looked_up,
            id,
        }
    }

    /// Why every entry of this topic is refused, if it is: its id is not
    /// known yet, or the link does not mirror it.
    fn refused(&self, version: i16, link: &Link) -> Option<(Refusal, Arc<str>)> {
        let Some(name) = self.name(version) else {
            return Some((
                Refusal::UnknownTopicId,
                format!(
                    "mirror link '{}': topic id {} is not known to the proxy yet; refresh metadata and retry",
                    link.name(),
                    self.topic.topic_id
                )
                .into(),
            ));
        };
        (!link.mirrors_topic(name)).then(|| {
            (
                Refusal::TopicNotMirrored,
                format!(
                    "mirror link '{}' does not mirror topic '{name}' (not in MIRROR_PROXY_LINK_{}_TOPICS)",
                    link.name(),
                    crate::mirror::link::link_env_name(link.name())
                )
                .into(),
            )
        })
    }

    /// The topic's name: the request's own before v13.
    fn name(&self, version: i16) -> Option<&str> {
        match version >= 13 {
            true => self.looked_up.as_deref(),
            false => Some(self.topic.name.0.as_str()),
        }
    }
}

enum PartitionPlan {
    /// Its patches were added to the plan's.
    Forward {
        batch_count: usize,
        tracked: TrackedBatches,
        mirrored: MirroredBatches,
    },
    DropControl(usize),
}

/// Plan one partition's records, adding its patches to `patches` (the
/// caller drops them again unless the partition is forwarded).
#[allow(clippy::too_many_arguments)]
fn plan_partition(
    records: &[u8],
    base: usize,
    link: &Link,
    topic: &str,
    at: PartitionId,
    origins: &dyn OriginLookup,
    patches: &mut Vec<(Range<usize>, PidPatch)>,
    unresolved: &mut Vec<Unresolved>,
) -> Result<PartitionPlan, (Refusal, String)> {
    let partition = at.partition;
    let mut tracked = TrackedBatches::new();
    let mut offset_delta: i64 = 0;
    let mut batches = 0;
    let mut control = 0;
    // From the headers parsed here anyway: a few additions per batch.
    let mut mirrored = MirroredBatches::default();
    let source = link.current_source();
    for batch in Batches::new(records) {
        let batch = batch.map_err(|e| {
            (
                Refusal::MalformedBatch,
                format!("mirror link '{}': {topic}-{partition}: {e}", link.name()),
            )
        })?;
        let bytes = &records[batch.range()];
        let header = BatchHeader::parse(bytes).map_err(|e| {
            (
                Refusal::MalformedBatch,
                format!("mirror link '{}': {topic}-{partition}: {e}", link.name()),
            )
        })?;
        batches += 1;
        if header.is_control() {
            control += 1;
        }
        mirrored.add(
            header.total_len(),
            header.record_count(),
            header.last_offset_delta(),
            header.attributes(),
            header.is_control(),
            header.max_timestamp(),
        );
        let delta = offset_delta;
        offset_delta += i64::from(header.last_offset_delta()) + 1;
        let pid = header.producer_id();
        if pid == NO_PRODUCER_ID {
            continue;
        }
        // A negative PID arrived mapped (a chain): its origin is the link's
        // source cluster and the PID as received.
        let origin = OriginId { source, pid };
        let new_pid = match origins.mapped(at, origin) {
            Some(m) => m,
            None => {
                let u = Unresolved {
                    topic: topic.to_string(),
                    partition: at,
                    origin,
                };
                if !unresolved.contains(&u) {
                    unresolved.push(u);
                }
                continue;
            }
        };
        if !header.is_control() && header.base_sequence() >= 0 {
            let mut id = BatchId::from_header(&header);
            id.producer_id = new_pid;
            tracked.push(TrackedBatch {
                id,
                origin,
                offset_delta: delta,
            });
        }
        if new_pid != pid {
            let patch = plan_producer_id_patch(bytes, new_pid).map_err(|e| {
                (
                    Refusal::MalformedBatch,
                    format!("mirror link '{}': {topic}-{partition}: {e}", link.name()),
                )
            })?;
            patches.push((base + batch.offset..base + batch.offset + batch.len, patch));
        }
    }
    if batches > 0 && control == batches && link.control_batches() == ControlBatchPolicy::Drop {
        // Answered here with success, so never without checking the batch:
        // a data batch whose control bit flipped in transit must not vanish.
        for batch in Batches::new(records).flatten() {
            if !crc_is_valid(&records[batch.range()]) {
                return Err((
                    Refusal::CorruptBatch,
                    format!(
                        "mirror link '{}': {topic}-{partition}: record batch at byte {} fails its CRC-32C check",
                        link.name(),
                        batch.offset
                    ),
                ));
            }
        }
        Ok(PartitionPlan::DropControl(control))
    } else {
        Ok(PartitionPlan::Forward {
            batch_count: batches,
            tracked,
            mirrored,
        })
    }
}

/// Plan that answers every partition of the request with `refusal`.
pub(crate) fn refuse_all(
    frame: &Bytes,
    index: &Index,
    refusal: Refusal,
    message: &str,
) -> ProducePlan {
    let message: Arc<str> = message.into();
    refuse_where(frame, index, |_, _| Some((refusal, message.clone())))
}

/// Plan that answers the partitions of the topic entries `decide` refuses
/// and forwards the rest (`forwarded_partitions` counts those). `decide`
/// is asked once per topic entry, with its number of partitions; its
/// message is shared by the entry's partitions.
pub(crate) fn refuse_where(
    frame: &Bytes,
    index: &Index,
    mut decide: impl FnMut(TopicKey<'_>, usize) -> Option<(Refusal, Arc<str>)>,
) -> ProducePlan {
    let mut plan = ProducePlan::default();
    for t in index.topics() {
        let entries = t.partitions().len();
        match decide(topic_key(frame, index, t), entries) {
            None => plan.forwarded_partitions += entries,
            Some((refusal, message)) => {
                let topic = Arc::new(topic_ref(frame, index, t));
                refuse_entries(&mut plan, index, t, &topic, refusal, message);
            }
        }
    }
    plan
}

/// A topic of a Produce request as the frame names it, borrowed from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum TopicKey<'a> {
    /// Before v13.
    Name(&'a str),
    /// From v13.
    Id(Uuid),
}

/// Whether `pred` holds for some topic entry of the indexed request.
/// Allocates nothing: the local path asks this of every Produce while some
/// topic is read-only, and plans refusals (`refuse_where`) only on a yes.
pub(crate) fn any_topic(
    frame: &[u8],
    index: &Index,
    mut pred: impl FnMut(TopicKey<'_>) -> bool,
) -> bool {
    index
        .topics()
        .iter()
        .any(|t| pred(topic_key(frame, index, t)))
}

/// Re-emit `frame` (the indexed request, perhaps patched in place since)
/// without the partitions the proxy answers itself, and without topics
/// left empty. The header and every kept partition entry are copied as
/// they are; only array counts change.
pub(crate) fn without_local_partitions(
    frame: &[u8],
    index: &Index,
    local: &[LocalPartition],
) -> BytesMut {
    let mut answered = vec![false; index.partitions().len()];
    for l in local {
        if let Some(a) = answered.get_mut(l.entry as usize) {
            *a = true;
        }
    }
    let out = Bytes::from(index.without(frame, |entry| !answered[entry]));
    out.try_into_mut()
        .unwrap_or_else(|shared| BytesMut::from(&shared[..]))
}

/// Add the proxy's answers to `response`, each under its topic's entry
/// (the first, where the broker answered a topic twice), or a new one.
/// Looked up, not scanned: an answer of many topics costs what it holds.
fn add_local<'l>(
    response: &mut ProduceResponse,
    version: i16,
    local: impl IntoIterator<Item = &'l LocalPartition>,
) {
    let key = |name: &TopicName, id: Uuid| TopicKeyOwned::of(version, name, id);
    let mut at: HashMap<TopicKeyOwned, usize> = HashMap::with_capacity(response.responses.len());
    for (i, t) in response.responses.iter().enumerate() {
        at.entry(key(&t.name, t.topic_id)).or_insert(i);
    }
    for (i, l) in local.into_iter().enumerate() {
        let answer = l.response(i < MESSAGES_PER_RESPONSE);
        match at.entry(key(&l.topic.name, l.topic.topic_id)) {
            Entry::Occupied(e) => response.responses[*e.get()]
                .partition_responses
                .push(answer),
            Entry::Vacant(e) => {
                e.insert(response.responses.len());
                response.responses.push(
                    TopicProduceResponse::default()
                        .with_name(l.topic.name.clone())
                        .with_topic_id(l.topic.topic_id)
                        .with_partition_responses(vec![answer]),
                );
            }
        }
    }
}

/// Encode a response frame (header + body, no size prefix).
pub(crate) fn encode_response(
    correlation_id: i32,
    version: i16,
    response: &ProduceResponse,
) -> Result<BytesMut, ProduceError> {
    let encode_err = |e: anyhow::Error| ProduceError::Encode {
        version,
        cause: e.into(),
    };
    let header_version = ApiKey::Produce.response_header_version(version);
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut out, header_version)
        .map_err(encode_err)?;
    response.encode(&mut out, version).map_err(encode_err)?;
    Ok(out)
}

/// The whole response when the proxy answers every partition, written
/// directly: a few dozen bytes an answer and a list of places, never a
/// decoded response (whose structures cost several times the bytes).
pub(crate) fn local_response(
    correlation_id: i32,
    version: i16,
    local: &[LocalPartition],
) -> Result<BytesMut, ProduceError> {
    let mut out = BytesMut::new();
    encode_header(&mut out, correlation_id, version)?;
    let topics = by_topic(version, local, |_| true);
    write::put_count(&mut out, topics.len(), version >= 9);
    put_local_topics(&mut out, version, local, &topics, 0);
    if version >= 1 {
        out.extend_from_slice(&0i32.to_be_bytes()); // throttle_time_ms
    }
    if version >= 9 {
        out.extend_from_slice(&[0]); // no tagged fields
    }
    Ok(out)
}

/// A broker's response frame (the partitions it was sent) with the proxy's
/// answers added: an answer to a topic the broker answered too joins that
/// topic's entry; the others are entries of their own, written directly
/// ahead of the broker's (only the topic count of the broker's body
/// changes), so they cost no decoded structures.
pub(crate) fn merge_response(
    frame: &Bytes,
    version: i16,
    local: &[LocalPartition],
) -> Result<BytesMut, ProduceError> {
    let (correlation_id, mut response) = decode_response(frame, version)?;
    let key = |name: &TopicName, id: Uuid| TopicKeyOwned::of(version, name, id);
    let answered: std::collections::HashSet<TopicKeyOwned> = response
        .responses
        .iter()
        .map(|t| key(&t.name, t.topic_id))
        .collect();
    let joins = |l: &LocalPartition| answered.contains(&key(&l.topic.name, l.topic.topic_id));
    let joined = local.iter().filter(|l| joins(l)).count();
    add_local(&mut response, version, local.iter().filter(|l| joins(l)));
    let encode_err = |e: anyhow::Error| ProduceError::Encode {
        version,
        cause: e.into(),
    };
    let mut body = BytesMut::new();
    response.encode(&mut body, version).map_err(encode_err)?;
    // The body starts with the topic count: skip it, write the sum.
    let flexible = version >= 9;
    let mut c = crate::wire::cursor::Cursor::at(&body, 0);
    let broker_topics = match flexible {
        true => c.uvarint().map(|n| n.saturating_sub(1) as usize),
        false => c.i32().map(|n| n.max(0) as usize),
    }
    .map_err(|e| ProduceError::Encode {
        version,
        cause: e.into(),
    })?;
    let rest = c.position();
    let topics = by_topic(version, local, |l| !joins(l));
    let mut out = BytesMut::with_capacity(body.len() + 32 * (local.len() - joined) + 64);
    encode_header(&mut out, correlation_id, version)?;
    write::put_count(&mut out, broker_topics + topics.len(), flexible);
    put_local_topics(&mut out, version, local, &topics, joined);
    out.extend_from_slice(&body[rest..]);
    Ok(out)
}

/// A topic as a key, owned: its id from v13, its name before.
#[derive(PartialEq, Eq, Hash)]
enum TopicKeyOwned {
    Name(TopicName),
    Id(Uuid),
}

impl TopicKeyOwned {
    fn of(version: i16, name: &TopicName, id: Uuid) -> TopicKeyOwned {
        match version >= 13 {
            true => TopicKeyOwned::Id(id),
            false => TopicKeyOwned::Name(name.clone()),
        }
    }
}

/// The answers of `local` that `take` holds for, grouped by topic in the
/// order each topic first appears: per topic, the places of its answers in
/// `local`.
fn by_topic(
    version: i16,
    local: &[LocalPartition],
    take: impl Fn(&LocalPartition) -> bool,
) -> Vec<Vec<u32>> {
    let mut at: HashMap<TopicKeyOwned, usize> = HashMap::new();
    let mut topics: Vec<Vec<u32>> = Vec::new();
    for (i, l) in local.iter().enumerate().filter(|(_, l)| take(l)) {
        let key = TopicKeyOwned::of(version, &l.topic.name, l.topic.topic_id);
        let slot = *at.entry(key).or_insert_with(|| {
            topics.push(Vec::new());
            topics.len() - 1
        });
        topics[slot].push(i as u32);
    }
    topics
}

fn encode_header(
    out: &mut BytesMut,
    correlation_id: i32,
    version: i16,
) -> Result<(), ProduceError> {
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(out, ApiKey::Produce.response_header_version(version))
        .map_err(|e| ProduceError::Encode {
            version,
            cause: e.into(),
        })
}

/// The topic entries of `topics` (places in `local`), as kafka-protocol
/// encodes a `TopicProduceResponse` with these answers and no tagged
/// fields. `answered_before` answers precede these in the response (their
/// count is what [`MESSAGES_PER_RESPONSE`] has used up).
fn put_local_topics(
    out: &mut BytesMut,
    version: i16,
    local: &[LocalPartition],
    topics: &[Vec<u32>],
    answered_before: usize,
) {
    let flexible = version >= 9;
    let mut n = answered_before;
    for places in topics {
        let Some(first) = places.first().and_then(|i| local.get(*i as usize)) else {
            continue;
        };
        match version >= 13 {
            true => out.extend_from_slice(first.topic.topic_id.as_bytes()),
            false => write::put_string(out, Some(first.topic.name.0.as_str()), flexible),
        }
        write::put_count(out, places.len(), flexible);
        for l in places.iter().filter_map(|i| local.get(*i as usize)) {
            let (code, base_offset, message) = match &l.outcome {
                LocalOutcome::Refused { refusal, message } => {
                    (refusal.error().code(), -1, Some(&**message))
                }
                LocalOutcome::Duplicate { base_offset, .. } => (0, *base_offset, None),
                LocalOutcome::DroppedControl { .. } => (0, -1, None),
            };
            out.extend_from_slice(&l.partition.to_be_bytes());
            out.extend_from_slice(&code.to_be_bytes());
            out.extend_from_slice(&base_offset.to_be_bytes());
            if version >= 2 {
                out.extend_from_slice(&(-1i64).to_be_bytes()); // log_append_time_ms
            }
            if version >= 5 {
                out.extend_from_slice(&(-1i64).to_be_bytes()); // log_start_offset
            }
            if version >= 8 {
                write::put_count(out, 0, flexible); // record_errors
                write::put_string(out, message.filter(|_| n < MESSAGES_PER_RESPONSE), flexible);
            }
            if flexible {
                out.extend_from_slice(&[0]); // tagged fields
            }
            n += 1;
        }
        if flexible {
            out.extend_from_slice(&[0]);
        }
    }
}

/// Decode a broker's Produce response frame (header + body), after a
/// bounded walk has checked every count in it: the decoder reserves memory
/// from the counts it reads.
pub(crate) fn decode_response(
    frame: &Bytes,
    version: i16,
) -> Result<(i32, ProduceResponse), ProduceError> {
    let malformed = |cause: ReadError| ProduceError::Malformed { version, cause };
    let msg = schema::message("ProduceResponse").map_err(|e| malformed(e.into()))?;
    let header_version = ApiKey::Produce.response_header_version(version);
    let start = crate::wire::header::response_body_offset(frame, header_version)
        .ok_or_else(|| malformed(ReadError::TruncatedHeader))?;
    walk::validate(msg, version, frame, start).map_err(|e| malformed(e.into()))?;
    let mut buf = frame.clone();
    let header = ResponseHeader::decode(&mut buf, header_version)
        .map_err(|e| malformed(ReadError::decode(e)))?;
    let response =
        ProduceResponse::decode(&mut buf, version).map_err(|e| malformed(ReadError::decode(e)))?;
    Ok((header.correlation_id, response))
}

#[cfg(test)]
mod tests;
