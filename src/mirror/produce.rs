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

use std::ops::Range;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use uuid::Uuid;

use crate::mirror::link::{ControlBatchPolicy, Link};
use crate::mirror::pid::{map_pid, Mapping};
use crate::wire::batch::{plan_producer_id_patch, BatchHeader, Batches, PidPatch};

/// Why a Produce request could not be handled at all (the connection is
/// closed: nothing of it is forwarded).
#[derive(Debug, thiserror::Error)]
pub enum ProduceError {
    #[error("unparseable Produce v{version} body: {reason}")]
    Malformed { version: i16, reason: String },
    #[error("Produce v{0} is not supported (the proxy parses v3 to v13)")]
    UnsupportedVersion(i16),
    #[error("a Produce rewrite plan does not match the frame it is applied to")]
    StalePlan,
    #[error("could not encode Produce v{version}: {reason}")]
    Encode { version: i16, reason: String },
}

/// A topic as the request names it: by name before v13, by id from v13.
#[derive(Debug, Clone, PartialEq)]
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
    /// A producer id the bit-field mapping cannot place safely.
    UnplaceablePid,
    /// A record batch whose header cannot be read.
    MalformedBatch,
    /// A client that used a link's client id without the link's certificate.
    NotAuthorized,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::TopicNotMirrored => "topic_not_mirrored",
            Refusal::UnknownTopicId => "unknown_topic_id",
            Refusal::UnplaceablePid => "unplaceable_pid",
            Refusal::MalformedBatch => "malformed_batch",
            Refusal::NotAuthorized => "not_authorized",
        }
    }

    fn error(self) -> ResponseError {
        match self {
            Refusal::TopicNotMirrored => ResponseError::PolicyViolation,
            Refusal::UnknownTopicId => ResponseError::UnknownTopicId,
            Refusal::UnplaceablePid => ResponseError::InvalidRecord,
            Refusal::MalformedBatch => ResponseError::CorruptMessage,
            Refusal::NotAuthorized => ResponseError::TopicAuthorizationFailed,
        }
    }
}

/// What the proxy answers for a partition the broker does not see.
#[derive(Debug, Clone, PartialEq)]
pub enum LocalOutcome {
    Refused {
        refusal: Refusal,
        message: String,
    },
    /// Control batches acknowledged without writing (`drop` policy).
    DroppedControl {
        batches: usize,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct LocalPartition {
    pub topic: TopicRef,
    pub partition: i32,
    pub outcome: LocalOutcome,
}

impl LocalPartition {
    fn response(&self) -> PartitionProduceResponse {
        let mut r = PartitionProduceResponse::default()
            .with_index(self.partition)
            .with_base_offset(-1)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(-1);
        if let LocalOutcome::Refused { refusal, message } = &self.outcome {
            r = r
                .with_error_code(refusal.error().code())
                .with_error_message(Some(StrBytes::from_string(message.clone())));
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
}

impl ProducePlan {
    pub fn patches(&self) -> usize {
        self.patches.len()
    }

    /// Patch every planned batch in the frame the plan was made from. Each
    /// patch re-checks the batch it lands on, so a plan applied to the wrong
    /// frame fails instead of corrupting it.
    pub fn apply(&self, frame: &mut [u8]) -> Result<(), ProduceError> {
        for (range, patch) in &self.patches {
            let batch = frame
                .get_mut(range.clone())
                .ok_or(ProduceError::StalePlan)?;
            patch.apply(batch).map_err(|_| ProduceError::StalePlan)?;
        }
        Ok(())
    }
}

/// The Produce versions the proxy parses (every one `kafka-protocol` knows
/// from v3, the first that Kafka 4.x accepts).
pub fn supported_versions() -> (i16, i16) {
    use kafka_protocol::protocol::Message;
    (
        3.max(ProduceRequest::VERSIONS.min),
        ProduceRequest::VERSIONS.max,
    )
}

fn check_version(version: i16) -> Result<(), ProduceError> {
    let (min, max) = supported_versions();
    if (min..=max).contains(&version) {
        Ok(())
    } else {
        Err(ProduceError::UnsupportedVersion(version))
    }
}

fn decode(frame: &Bytes, body_offset: usize, version: i16) -> Result<ProduceRequest, ProduceError> {
    check_version(version)?;
    let malformed = |reason: String| ProduceError::Malformed { version, reason };
    let mut body = frame.slice(body_offset.min(frame.len())..);
    let request =
        ProduceRequest::decode(&mut body, version).map_err(|e| malformed(e.to_string()))?;
    if !body.is_empty() {
        return Err(malformed(format!("{} bytes after the body", body.len())));
    }
    Ok(request)
}

/// Where `part` lies inside `whole`, when it is a zero-copy slice of it.
fn offset_in(whole: &Bytes, part: &Bytes) -> Option<usize> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    (start + part.len() <= whole.len()).then_some(start)
}

/// Plan the rewrite of a Produce request sent on `link`. `frame` is the
/// request without its size prefix; `topic_name` resolves v13 topic ids.
pub fn plan(
    frame: &Bytes,
    body_offset: usize,
    version: i16,
    link: &Link,
    topic_name: &dyn Fn(Uuid) -> Option<String>,
) -> Result<ProducePlan, ProduceError> {
    let request = decode(frame, body_offset, version)?;
    let mut plan = ProducePlan::default();
    for topic in &request.topic_data {
        let topic_ref = TopicRef {
            name: topic.name.clone(),
            topic_id: topic.topic_id,
        };
        let name = if version >= 13 {
            topic_name(topic.topic_id)
        } else {
            Some(topic.name.0.as_str().to_string())
        };
        for partition in &topic.partition_data {
            let refuse = |refusal: Refusal, message: String| LocalPartition {
                topic: topic_ref.clone(),
                partition: partition.index,
                outcome: LocalOutcome::Refused { refusal, message },
            };
            let Some(name) = name.as_deref() else {
                plan.local.push(refuse(
                    Refusal::UnknownTopicId,
                    format!(
                        "mirror link '{}': topic id {} is not known to the proxy yet; refresh metadata and retry",
                        link.name(),
                        topic.topic_id
                    ),
                ));
                continue;
            };
            if !link.mirrors_topic(name) {
                plan.local.push(refuse(
                    Refusal::TopicNotMirrored,
                    format!(
                        "mirror link '{}' does not mirror topic '{name}' (not in MIRROR_PROXY_LINK_{}_TOPICS)",
                        link.name(),
                        crate::config::link_env_name(link.name())
                    ),
                ));
                continue;
            }
            let Some(records) = &partition.records else {
                plan.forwarded_partitions += 1;
                continue;
            };
            let base = offset_in(frame, records).ok_or_else(|| ProduceError::Malformed {
                version,
                reason: "records are not a slice of the request".into(),
            })?;
            match plan_partition(records, base, link, name, partition.index) {
                Ok(PartitionPlan::Forward(patches)) => {
                    plan.forwarded_partitions += 1;
                    plan.remapped_batches += patches.len();
                    plan.patches.extend(patches);
                }
                Ok(PartitionPlan::DropControl(batches)) => plan.local.push(LocalPartition {
                    topic: topic_ref.clone(),
                    partition: partition.index,
                    outcome: LocalOutcome::DroppedControl { batches },
                }),
                Err((refusal, message)) => plan.local.push(refuse(refusal, message)),
            }
        }
    }
    Ok(plan)
}

enum PartitionPlan {
    Forward(Vec<(Range<usize>, PidPatch)>),
    DropControl(usize),
}

fn plan_partition(
    records: &[u8],
    base: usize,
    link: &Link,
    topic: &str,
    partition: i32,
) -> Result<PartitionPlan, (Refusal, String)> {
    let mut patches = Vec::new();
    let mut batches = 0;
    let mut control = 0;
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
        match map_pid(link.region(), header.producer_id()) {
            Mapping::Unchanged => {}
            Mapping::Mapped(new_pid) => {
                let patch = plan_producer_id_patch(bytes, new_pid).map_err(|e| {
                    (
                        Refusal::MalformedBatch,
                        format!("mirror link '{}': {topic}-{partition}: {e}", link.name()),
                    )
                })?;
                patches.push((base + batch.offset..base + batch.offset + batch.len, patch));
            }
            Mapping::Unplaceable(why) => {
                return Err((
                    Refusal::UnplaceablePid,
                    format!(
                        "mirror link '{}': {topic}-{partition}: producer id {}: {why}",
                        link.name(),
                        header.producer_id()
                    ),
                ))
            }
        }
    }
    if batches > 0 && control == batches && link.control_batches() == ControlBatchPolicy::Drop {
        Ok(PartitionPlan::DropControl(control))
    } else {
        Ok(PartitionPlan::Forward(patches))
    }
}

/// Plan that answers every partition of the request with `refusal`.
pub fn refuse_all(
    frame: &Bytes,
    body_offset: usize,
    version: i16,
    refusal: Refusal,
    message: &str,
) -> Result<ProducePlan, ProduceError> {
    let request = decode(frame, body_offset, version)?;
    let mut plan = ProducePlan::default();
    for topic in &request.topic_data {
        for partition in &topic.partition_data {
            plan.local.push(LocalPartition {
                topic: TopicRef {
                    name: topic.name.clone(),
                    topic_id: topic.topic_id,
                },
                partition: partition.index,
                outcome: LocalOutcome::Refused {
                    refusal,
                    message: message.to_string(),
                },
            });
        }
    }
    Ok(plan)
}

fn same_topic(version: i16, a: &TopicRef, name: &TopicName, topic_id: Uuid) -> bool {
    if version >= 13 {
        a.topic_id == topic_id
    } else {
        &a.name == name
    }
}

/// Re-encode `frame` (already patched) without the partitions the proxy
/// answers itself.
pub fn without_local_partitions(
    frame: &Bytes,
    version: i16,
    local: &[LocalPartition],
) -> Result<BytesMut, ProduceError> {
    let malformed = |reason: String| ProduceError::Malformed { version, reason };
    let header_version = ApiKey::Produce.request_header_version(version);
    let mut buf = frame.clone();
    let header =
        RequestHeader::decode(&mut buf, header_version).map_err(|e| malformed(e.to_string()))?;
    let mut request =
        ProduceRequest::decode(&mut buf, version).map_err(|e| malformed(e.to_string()))?;
    for topic in &mut request.topic_data {
        let (name, id) = (topic.name.clone(), topic.topic_id);
        topic.partition_data.retain(|p| {
            !local
                .iter()
                .any(|l| l.partition == p.index && same_topic(version, &l.topic, &name, id))
        });
    }
    request.topic_data.retain(|t| !t.partition_data.is_empty());
    let encode_err = |e: anyhow::Error| ProduceError::Encode {
        version,
        reason: e.to_string(),
    };
    let mut out = BytesMut::with_capacity(frame.len());
    header
        .encode(&mut out, header_version)
        .map_err(encode_err)?;
    request.encode(&mut out, version).map_err(encode_err)?;
    Ok(out)
}

fn add_local(response: &mut ProduceResponse, version: i16, local: &[LocalPartition]) {
    for l in local {
        let existing = response
            .responses
            .iter_mut()
            .find(|t| same_topic(version, &l.topic, &t.name, t.topic_id));
        match existing {
            Some(t) => t.partition_responses.push(l.response()),
            None => response.responses.push(
                TopicProduceResponse::default()
                    .with_name(l.topic.name.clone())
                    .with_topic_id(l.topic.topic_id)
                    .with_partition_responses(vec![l.response()]),
            ),
        }
    }
}

/// Encode a response frame (header + body, no size prefix).
pub fn encode_response(
    correlation_id: i32,
    version: i16,
    response: &ProduceResponse,
) -> Result<BytesMut, ProduceError> {
    let encode_err = |e: anyhow::Error| ProduceError::Encode {
        version,
        reason: e.to_string(),
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

/// The whole response when the proxy answers every partition.
pub fn local_response(
    correlation_id: i32,
    version: i16,
    local: &[LocalPartition],
) -> Result<BytesMut, ProduceError> {
    let mut response = ProduceResponse::default();
    add_local(&mut response, version, local);
    encode_response(correlation_id, version, &response)
}

/// Decode a broker's Produce response frame (header + body).
pub fn decode_response(
    frame: &Bytes,
    version: i16,
) -> Result<(i32, ProduceResponse), ProduceError> {
    let malformed = |reason: String| ProduceError::Malformed { version, reason };
    let mut buf = frame.clone();
    let header = ResponseHeader::decode(&mut buf, ApiKey::Produce.response_header_version(version))
        .map_err(|e| malformed(e.to_string()))?;
    let response =
        ProduceResponse::decode(&mut buf, version).map_err(|e| malformed(e.to_string()))?;
    Ok((header.correlation_id, response))
}

/// Add the proxy's answers to a broker's decoded response.
pub fn merge_local(response: &mut ProduceResponse, version: i16, local: &[LocalPartition]) {
    add_local(response, version, local);
}

#[cfg(test)]
mod tests;
