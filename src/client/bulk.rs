//! The replicator's requests: one Fetch for every partition it reads from
//! one broker, one Produce for every partition it writes to one node, as
//! Kafka's own fetcher and producer send them. Record batches go out and
//! come back as raw bytes.
//!
//! Pure: builders and interpreters. The replicator does the I/O, on a
//! pipelined connection (`conn::Sender` and `conn::Receiver`).

use std::collections::HashMap;

use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse, ProduceRequest,
    ProduceResponse, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::error::ClientError;
use super::protocol::{
    missing, partition_fetched, partition_produced, topic_name, Fetched, IsolationLevel,
    OffsetSpec, PartitionRef, Produced,
};
use super::{lock, millis_i32, Client};

/// One partition of a Fetch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FetchPart<'a> {
    pub from: PartitionRef<'a>,
    pub offset: i64,
    /// This partition's share of the answer (`partition_max_bytes`).
    pub max_bytes: i32,
}

/// The request-wide settings of a Fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FetchSpec {
    pub max_wait_ms: i32,
    pub min_bytes: i32,
    pub max_bytes: i32,
    pub isolation: IsolationLevel,
}

/// Where a topic's entry is in a request being built: by id from v13 on
/// (Fetch and Produce name topics by id there), else by name.
fn topic_key(by_id: bool, to: &PartitionRef<'_>) -> TopicKey {
    if by_id {
        TopicKey::Id(to.topic_id)
    } else {
        TopicKey::Name(to.topic.to_string())
    }
}

/// How a new topic entry names its topic: by id (v13+) or by name.
enum TopicIs {
    Id(Uuid),
    Name(TopicName),
}

/// The index in `topics` of the entry for `to`'s topic, made with `make`
/// and pushed when it is the topic's first partition (topics stay in the
/// order they first appear); by id from v13 on, `api` naming the request
/// when the topic has no id.
fn topic_entry<T>(
    topics: &mut Vec<T>,
    index: &mut HashMap<TopicKey, usize>,
    by_id: bool,
    to: &PartitionRef<'_>,
    api: &str,
    make: impl FnOnce(TopicIs) -> T,
) -> Result<usize, ClientError> {
    let key = topic_key(by_id, to);
    if let Some(&at) = index.get(&key) {
        return Ok(at);
    }
    let topic = if by_id {
        make(TopicIs::Id(to.require_id(api)?))
    } else {
        make(TopicIs::Name(topic_name(to.topic)))
    };
    topics.push(topic);
    index.insert(key, topics.len() - 1);
    Ok(topics.len() - 1)
}

/// Each part's answer, in the order of `parts`: its partition's entry
/// among the response's `topics` (id, name, partitions; by id from v13
/// on, else by name) read with `read`, or a missing answer to `api`.
fn answers_in_order<'r, P: 'r, X, T>(
    by_id: bool,
    topics: impl Iterator<Item = (Uuid, &'r str, &'r [P])>,
    index_of: impl Fn(&P) -> i32,
    parts: &[X],
    part_ref: impl Fn(&X) -> &PartitionRef<'_>,
    api: &str,
    read: impl Fn(&P, &str) -> Result<T, ClientError>,
) -> Vec<Result<T, ClientError>> {
    let mut answers = HashMap::new();
    for (id, name, partitions) in topics {
        let key = if by_id {
            TopicKey::Id(id)
        } else {
            TopicKey::Name(name.to_string())
        };
        for p in partitions {
            answers.insert((key.clone(), index_of(p)), p);
        }
    }
    parts
        .iter()
        .map(|part| {
            let to = part_ref(part);
            let label = to.label();
            match answers.get(&(topic_key(by_id, to), to.partition)) {
                Some(p) => read(p, &label),
                None => Err(missing(api, &label)),
            }
        })
        .collect()
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TopicKey {
    Id(Uuid),
    Name(String),
}

/// A sessionless Fetch of `parts` (each partition at most once), topics
/// in the order they first appear.
pub(crate) fn fetch_request_many(
    version: i16,
    parts: &[FetchPart<'_>],
    spec: &FetchSpec,
) -> Result<FetchRequest, ClientError> {
    let by_id = version >= 13;
    let mut topics: Vec<FetchTopic> = Vec::new();
    let mut index: HashMap<TopicKey, usize> = HashMap::new();
    for part in parts {
        let mut partition = FetchPartition::default()
            .with_partition(part.from.partition)
            .with_fetch_offset(part.offset)
            .with_partition_max_bytes(part.max_bytes);
        if version >= 9 {
            partition = partition.with_current_leader_epoch(part.from.leader_epoch);
        }
        let at = topic_entry(
            &mut topics,
            &mut index,
            by_id,
            &part.from,
            "Fetch",
            |t| match t {
                TopicIs::Id(id) => FetchTopic::default().with_topic_id(id),
                TopicIs::Name(name) => FetchTopic::default().with_topic(name),
            },
        )?;
        topics[at].partitions.push(partition);
    }
    Ok(FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(spec.max_wait_ms)
        .with_min_bytes(spec.min_bytes)
        .with_max_bytes(spec.max_bytes)
        .with_isolation_level(spec.isolation.code())
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(topics))
}

/// Each part's answer, in the order of `parts`; a request-wide error as
/// the outer `Err`.
pub(crate) fn fetch_result_many(
    r: &FetchResponse,
    version: i16,
    parts: &[FetchPart<'_>],
) -> Result<Vec<Result<Fetched, ClientError>>, ClientError> {
    if r.error_code != 0 {
        return Err(ClientError::Kafka {
            context: "fetch".into(),
            code: r.error_code,
            message: None,
        });
    }
    Ok(answers_in_order(
        version >= 13,
        r.responses
            .iter()
            .map(|t| (t.topic_id, &*t.topic.0, &t.partitions[..])),
        |p| p.partition_index,
        parts,
        |part| &part.from,
        "Fetch",
        partition_fetched,
    ))
}

/// One partition of a Produce: exactly one record batch (Produce v3+).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProducePart<'a> {
    pub to: PartitionRef<'a>,
    pub records: Bytes,
}

/// A Produce of `parts` (each partition at most once) with `acks=all`,
/// carrying `transactional_id` when one of the batches is transactional
/// (brokers require one then, whatever the batch's producer id).
pub(crate) fn produce_request_many(
    version: i16,
    parts: &[ProducePart<'_>],
    timeout_ms: i32,
    transactional_id: Option<&str>,
) -> Result<ProduceRequest, ClientError> {
    let by_id = version >= 13;
    let mut topics: Vec<TopicProduceData> = Vec::new();
    let mut index: HashMap<TopicKey, usize> = HashMap::new();
    for part in parts {
        let at = topic_entry(
            &mut topics,
            &mut index,
            by_id,
            &part.to,
            "Produce",
            |t| match t {
                TopicIs::Id(id) => TopicProduceData::default().with_topic_id(id),
                TopicIs::Name(name) => TopicProduceData::default().with_name(name),
            },
        )?;
        topics[at].partition_data.push(
            PartitionProduceData::default()
                .with_index(part.to.partition)
                .with_records(Some(part.records.clone())),
        );
    }
    Ok(ProduceRequest::default()
        .with_transactional_id(
            transactional_id.map(|id| TransactionalId(StrBytes::from_string(id.to_string()))),
        )
        .with_acks(-1)
        .with_timeout_ms(timeout_ms)
        .with_topic_data(topics))
}

/// Each part's outcome, in the order of `parts`: retriable errors as
/// `Err`, the rest as [`Produced`].
pub(crate) fn produce_result_many(
    r: &ProduceResponse,
    version: i16,
    parts: &[ProducePart<'_>],
) -> Vec<Result<Produced, ClientError>> {
    answers_in_order(
        version >= 13,
        r.responses
            .iter()
            .map(|t| (t.topic_id, &*t.name.0, &t.partition_responses[..])),
        |p| p.index,
        parts,
        |part| &part.to,
        "Produce",
        partition_produced,
    )
}

/// One ListOffsets for many partitions of one leader (by name: every
/// version names topics).
pub(crate) fn list_offsets_request_many(
    version: i16,
    parts: &[PartitionRef<'_>],
    spec: OffsetSpec,
    timeout_ms: i32,
) -> ListOffsetsRequest {
    let mut topics: Vec<ListOffsetsTopic> = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for part in parts {
        let mut partition = ListOffsetsPartition::default()
            .with_partition_index(part.partition)
            .with_timestamp(spec.timestamp());
        if version >= 4 {
            partition = partition.with_current_leader_epoch(part.leader_epoch);
        }
        let at = *index.entry(part.topic).or_insert_with(|| {
            topics.push(ListOffsetsTopic::default().with_name(topic_name(part.topic)));
            topics.len() - 1
        });
        topics[at].partitions.push(partition);
    }
    let mut request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(0)
        .with_topics(topics);
    if version >= 10 {
        request = request.with_timeout_ms(timeout_ms);
    }
    request
}

/// Each part's offset, in the order of `parts`.
pub(crate) fn list_offsets_result_many(
    r: &ListOffsetsResponse,
    parts: &[PartitionRef<'_>],
) -> Vec<Result<i64, ClientError>> {
    let mut answers = HashMap::new();
    for t in &r.topics {
        for p in &t.partitions {
            answers.insert((t.name.0.as_str(), p.partition_index), p);
        }
    }
    parts
        .iter()
        .map(|part| match answers.get(&(part.topic, part.partition)) {
            None => Err(missing("ListOffsets", &part.label())),
            Some(p) if p.error_code != 0 => Err(ClientError::Kafka {
                context: format!("list offsets of {}", part.label()),
                code: p.error_code,
                message: None,
            }),
            Some(p) => Ok(p.offset),
        })
        .collect()
}

impl Client {
    /// The offset `spec` names in each of `partitions`: one request per
    /// leader, all retried until every partition is answered (or the
    /// operation timeout).
    pub(crate) async fn list_offsets(
        &self,
        partitions: &[(String, i32)],
        spec: OffsetSpec,
    ) -> Result<HashMap<(String, i32), i64>, ClientError> {
        let timeout_ms = millis_i32(self.config().request_timeout * 9 / 10);
        let found = std::sync::Mutex::new(HashMap::new());
        self.retrying("list offsets", || {
            let found = &found;
            async move {
                let mut by_leader: HashMap<String, Vec<(String, i32, super::metadata::Leader)>> =
                    HashMap::new();
                for (topic, partition) in partitions {
                    if lock(found).contains_key(&(topic.clone(), *partition)) {
                        continue;
                    }
                    let leader = self.leader(topic, *partition).await?;
                    by_leader.entry(leader.address.clone()).or_default().push((
                        topic.clone(),
                        *partition,
                        leader,
                    ));
                }
                let mut first_error = None;
                for (address, group) in by_leader {
                    let refs: Vec<PartitionRef<'_>> = group
                        .iter()
                        .map(|(topic, partition, leader)| PartitionRef {
                            topic,
                            topic_id: leader.topic_id,
                            partition: *partition,
                            leader_epoch: leader.leader_epoch,
                        })
                        .collect();
                    let (_, r) = self
                        .call(&address, std::time::Duration::ZERO, |v| {
                            Ok(list_offsets_request_many(v, &refs, spec, timeout_ms))
                        })
                        .await?;
                    for (part, answer) in refs.iter().zip(list_offsets_result_many(&r, &refs)) {
                        match answer {
                            Ok(offset) => {
                                lock(found)
                                    .insert((part.topic.to_string(), part.partition), offset);
                            }
                            Err(e) => {
                                if e.invalidates_metadata() {
                                    lock(&self.inner.cluster).invalidate();
                                }
                                first_error.get_or_insert(e);
                            }
                        }
                    }
                }
                match first_error {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        })
        .await?;
        Ok(found
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::produce_response::{
        PartitionProduceResponse, TopicProduceResponse,
    };

    fn at<'a>(topic: &'a str, id: u128, partition: i32) -> PartitionRef<'a> {
        PartitionRef {
            topic,
            topic_id: Uuid::from_u128(id),
            partition,
            leader_epoch: 7,
        }
    }

    const SPEC: FetchSpec = FetchSpec {
        max_wait_ms: 500,
        min_bytes: 1,
        max_bytes: 1 << 20,
        isolation: IsolationLevel::ReadCommitted,
    };

    #[test]
    fn one_fetch_groups_partitions_by_topic() {
        let parts = [
            FetchPart {
                from: at("a", 1, 0),
                offset: 10,
                max_bytes: 100,
            },
            FetchPart {
                from: at("b", 2, 3),
                offset: 20,
                max_bytes: 200,
            },
            FetchPart {
                from: at("a", 1, 1),
                offset: 30,
                max_bytes: 300,
            },
        ];
        let r = fetch_request_many(13, &parts, &SPEC).expect("builds");
        assert_eq!(r.topics.len(), 2);
        assert_eq!(r.topics[0].topic_id, Uuid::from_u128(1));
        let a: Vec<(i32, i64, i32, i32)> = r.topics[0]
            .partitions
            .iter()
            .map(|p| {
                (
                    p.partition,
                    p.fetch_offset,
                    p.partition_max_bytes,
                    p.current_leader_epoch,
                )
            })
            .collect();
        assert_eq!(a, [(0, 10, 100, 7), (1, 30, 300, 7)]);
        assert_eq!(r.isolation_level, 1);
        assert_eq!(r.max_bytes, 1 << 20);
        // By name below v13.
        let r = fetch_request_many(12, &parts, &SPEC).expect("builds");
        assert_eq!(r.topics[1].topic.0.as_str(), "b");
    }

    #[test]
    fn fetch_answers_come_back_in_the_order_asked() {
        let parts = [
            FetchPart {
                from: at("a", 1, 0),
                offset: 0,
                max_bytes: 1,
            },
            FetchPart {
                from: at("a", 1, 1),
                offset: 0,
                max_bytes: 1,
            },
            FetchPart {
                from: at("a", 1, 2),
                offset: 0,
                max_bytes: 1,
            },
        ];
        let r = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
            .with_topic_id(Uuid::from_u128(1))
            .with_partitions(vec![
                PartitionData::default()
                    .with_partition_index(1)
                    .with_error_code(6)
                    .with_high_watermark(-1),
                PartitionData::default()
                    .with_partition_index(0)
                    .with_high_watermark(42)
                    .with_records(Some(Bytes::from_static(b"xyz"))),
            ])]);
        let out = fetch_result_many(&r, 13, &parts).expect("no request-wide error");
        let first = out[0].as_ref().expect("partition 0 answered");
        assert_eq!(first.high_watermark, 42);
        assert_eq!(&first.records[..], b"xyz");
        assert!(matches!(out[1], Err(ClientError::Kafka { code: 6, .. })));
        // Not in the answer: an error of its own, not a shifted answer.
        assert!(matches!(out[2], Err(ClientError::Kafka { code: -1, .. })));
        let whole = FetchResponse::default().with_error_code(71);
        assert!(fetch_result_many(&whole, 13, &parts).is_err());
    }

    #[test]
    fn one_produce_carries_one_batch_per_partition() {
        let parts = [
            ProducePart {
                to: at("a", 1, 0),
                records: Bytes::from_static(b"one"),
            },
            ProducePart {
                to: at("a", 1, 4),
                records: Bytes::from_static(b"two"),
            },
        ];
        let r = produce_request_many(9, &parts, 1000, Some("mirror-a")).expect("builds");
        assert_eq!(r.acks, -1);
        assert_eq!(r.topic_data.len(), 1);
        assert_eq!(r.topic_data[0].name.0.as_str(), "a");
        let data: Vec<(i32, Option<Bytes>)> = r.topic_data[0]
            .partition_data
            .iter()
            .map(|p| (p.index, p.records.clone()))
            .collect();
        assert_eq!(
            data,
            [
                (0, Some(Bytes::from_static(b"one"))),
                (4, Some(Bytes::from_static(b"two")))
            ]
        );
        assert_eq!(
            r.transactional_id.as_ref().map(|t| t.0.as_str()),
            Some("mirror-a")
        );
        let answer =
            ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
                .with_name(topic_name("a"))
                .with_partition_responses(vec![
                    PartitionProduceResponse::default()
                        .with_index(4)
                        .with_error_code(90)
                        .with_error_message(Some(StrBytes::from_static_str("fenced"))),
                    PartitionProduceResponse::default()
                        .with_index(0)
                        .with_base_offset(17),
                ])]);
        let out = produce_result_many(&answer, 9, &parts);
        assert!(matches!(
            out[0],
            Ok(Produced::Appended {
                base_offset: 17,
                ..
            })
        ));
        assert_eq!(
            out[1].as_ref().ok(),
            Some(&Produced::Refused {
                code: 90,
                message: Some("fenced".into())
            })
        );
    }
}
