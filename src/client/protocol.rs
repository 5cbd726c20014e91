//! Requests the proxy's own client sends and what their responses mean:
//! version negotiation, framing, the schema walk before decoding, and one
//! builder and one interpreter per operation.
//!
//! Pure: bytes and messages in, bytes and results out. `client::conn` and
//! the `Client` in `client` do the I/O around it.
//!
//! Every response is first walked with Kafka's own schema
//! (`wire::walk::validate`): only a body whose every count and length has
//! been checked against the bytes actually received reaches `kafka-protocol`'s
//! decoder, which reserves memory from the counts it reads.

use std::collections::{BTreeMap, HashMap};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiVersionsRequest, ApiVersionsResponse, BrokerId, CreatePartitionsRequest,
    CreateTopicsRequest, CreateTopicsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    FetchRequest, FetchResponse, IncrementalAlterConfigsRequest, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, ProduceRequest, ProduceResponse, RequestHeader,
    SaslAuthenticateRequest, SaslHandshakeRequest, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};
use uuid::Uuid;

use super::error::{is_retriable_code, ClientError};
pub(crate) use crate::wire::aborted::AbortedTransaction;
use crate::wire::{header, schema, walk, ReadError};

/// A request the client sends: its name in errors, the schema its response
/// is walked with, and the oldest version the client is willing to use.
pub trait Rpc: Request {
    const NAME: &'static str;
    const RESPONSE_SCHEMA: &'static str;
    /// Older versions lack something the client relies on (named per impl).
    const MIN: i16;
}

macro_rules! rpc {
    ($req:ty, $name:literal, $min:literal) => {
        impl Rpc for $req {
            const NAME: &'static str = $name;
            const RESPONSE_SCHEMA: &'static str = concat!($name, "Response");
            const MIN: i16 = $min;
        }
    };
}

rpc!(ApiVersionsRequest, "ApiVersions", 0);
// v4: allow_auto_topic_creation=false (older versions create topics on read).
rpc!(MetadataRequest, "Metadata", 4);
rpc!(CreateTopicsRequest, "CreateTopics", 2);
// v1: `config_source` says which values are a topic's own.
rpc!(DescribeConfigsRequest, "DescribeConfigs", 1);
rpc!(CreatePartitionsRequest, "CreatePartitions", 0);
rpc!(IncrementalAlterConfigsRequest, "IncrementalAlterConfigs", 0);
rpc!(ProduceRequest, "Produce", 3);
rpc!(FetchRequest, "Fetch", 4);
rpc!(ListOffsetsRequest, "ListOffsets", 1);
// v1: the SASL exchange is wrapped in SaslAuthenticate requests.
rpc!(SaslHandshakeRequest, "SaslHandshake", 1);
rpc!(SaslAuthenticateRequest, "SaslAuthenticate", 0);

/// The versions of `R` the client can use: what `kafka-protocol` encodes
/// and decodes, what the compiled-in response schema walks, and `R::MIN`.
pub fn our_versions<R: Rpc>() -> Result<(i16, i16), ClientError> {
    let schema = schema::message(R::RESPONSE_SCHEMA).map_err(|e| ClientError::Encode {
        api: R::NAME,
        version: -1,
        cause: Box::new(e),
    })?;
    let min = R::MIN
        .max(R::VERSIONS.min)
        .max(<R::Response as kafka_protocol::protocol::Message>::VERSIONS.min)
        .max(schema.valid.min);
    let max = R::VERSIONS
        .max
        .min(<R::Response as kafka_protocol::protocol::Message>::VERSIONS.max)
        .min(schema.valid.max);
    Ok((min, max))
}

/// A broker's ApiVersions answer: api key → (min, max).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ApiVersionTable(HashMap<i16, (i16, i16)>);

impl ApiVersionTable {
    pub(crate) fn from_response(r: &ApiVersionsResponse) -> Self {
        ApiVersionTable(
            r.api_keys
                .iter()
                .map(|k| (k.api_key, (k.min_version, k.max_version)))
                .collect(),
        )
    }

    /// The highest version both sides know.
    pub(crate) fn pick<R: Rpc>(&self, broker: &str) -> Result<i16, ClientError> {
        let (ours_min, ours_max) = our_versions::<R>()?;
        let (broker_min, broker_max) = self.0.get(&R::KEY).copied().unwrap_or((0, -1));
        let version = ours_max.min(broker_max);
        if version < ours_min.max(broker_min) {
            return Err(ClientError::UnsupportedVersion {
                broker: broker.to_string(),
                api: R::NAME,
                broker_min,
                broker_max,
                ours_min,
                ours_max,
            });
        }
        Ok(version)
    }
}

/// One request frame (header and body, without the size prefix).
pub(crate) fn encode_request<R: Rpc>(
    body: &R,
    version: i16,
    correlation_id: i32,
    client_id: &str,
) -> Result<BytesMut, ClientError> {
    let err = |e: anyhow::Error| ClientError::Encode {
        api: R::NAME,
        version,
        cause: e.into(),
    };
    let mut out = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())))
        .encode(&mut out, R::header_version(version))
        .map_err(err)?;
    body.encode(&mut out, version).map_err(err)?;
    Ok(out)
}

/// Check a response frame's correlation id, walk its body with the schema,
/// and only then decode it.
pub fn decode_response<R: Rpc>(
    frame: &Bytes,
    version: i16,
    correlation_id: i32,
    broker: &str,
) -> Result<R::Response, ClientError> {
    let body = response_body::<R>(frame, version, correlation_id, broker)?;
    decode_walked::<R>(frame, body, version, broker)
}

fn malformed<R: Rpc>(broker: &str, version: i16, cause: impl Into<ReadError>) -> ClientError {
    ClientError::Malformed {
        broker: broker.to_string(),
        api: R::NAME,
        version,
        cause: Box::new(cause.into()),
    }
}

/// Where the body starts, after the correlation id check.
fn response_body<R: Rpc>(
    frame: &[u8],
    version: i16,
    correlation_id: i32,
    broker: &str,
) -> Result<usize, ClientError> {
    let got = frame
        .first_chunk::<4>()
        .map(|c| i32::from_be_bytes(*c))
        .ok_or_else(|| malformed::<R>(broker, version, ReadError::NoHeader))?;
    if got != correlation_id {
        return Err(malformed::<R>(
            broker,
            version,
            ReadError::CorrelationId {
                got,
                expected: correlation_id,
            },
        ));
    }
    header::response_body_offset(frame, R::Response::header_version(version))
        .ok_or_else(|| malformed::<R>(broker, version, ReadError::TruncatedHeader))
}

fn walk_body<R: Rpc>(
    frame: &[u8],
    body: usize,
    version: i16,
    broker: &str,
) -> Result<(), ClientError> {
    let msg =
        schema::message(R::RESPONSE_SCHEMA).map_err(|e| malformed::<R>(broker, version, e))?;
    walk::validate(msg, version, frame, body).map_err(|e| malformed::<R>(broker, version, e))
}

fn decode_walked<R: Rpc>(
    frame: &Bytes,
    body: usize,
    version: i16,
    broker: &str,
) -> Result<R::Response, ClientError> {
    walk_body::<R>(frame, body, version, broker)?;
    let mut buf = frame.slice(body..);
    R::Response::decode(&mut buf, version)
        .map_err(|e| malformed::<R>(broker, version, ReadError::decode(e)))
}

/// What an ApiVersions exchange yielded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ApiVersionsAnswer {
    Table(ApiVersionTable),
    /// The broker does not know the version asked for and answered in the
    /// v0 layout (as Kafka does); ask again at this version.
    RetryAt(i16),
}

/// Interpret an ApiVersions response to a request at `version`.
pub(crate) fn api_versions_answer(
    frame: &Bytes,
    version: i16,
    correlation_id: i32,
    broker: &str,
) -> Result<ApiVersionsAnswer, ClientError> {
    type R = ApiVersionsRequest;
    let body = response_body::<R>(frame, version, correlation_id, broker)?;
    let walked = walk_body::<R>(frame, body, version, broker);
    if walked.is_err() && version > 0 {
        // UNSUPPORTED_VERSION comes in the v0 layout whatever was asked.
        if let Ok(v0) = decode_walked::<R>(frame, body, 0, broker) {
            if v0.error_code == 35 {
                let theirs = v0.api_keys.iter().find(|k| k.api_key == R::KEY);
                return match theirs {
                    Some(k) if k.max_version < version && k.max_version >= 0 => {
                        Ok(ApiVersionsAnswer::RetryAt(k.max_version))
                    }
                    _ => Err(malformed::<R>(broker, version, ReadError::NoVersionRange)),
                };
            }
        }
    }
    walked?;
    let response = decode_walked::<R>(frame, body, version, broker)?;
    if response.error_code != 0 {
        return Err(ClientError::Kafka {
            context: format!("ApiVersions from {broker}"),
            code: response.error_code,
            message: None,
        });
    }
    Ok(ApiVersionsAnswer::Table(ApiVersionTable::from_response(
        &response,
    )))
}

pub(super) fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

pub(super) fn text(s: &Option<StrBytes>) -> Option<String> {
    s.as_ref().map(|s| s.as_str().to_string())
}

/// `topics`: `None` asks for every topic, `Some(&[])` for brokers only.
pub(crate) fn metadata_request(topics: Option<&[String]>) -> MetadataRequest {
    MetadataRequest::default()
        .with_topics(topics.map(|names| {
            names
                .iter()
                .map(|n| MetadataRequestTopic::default().with_name(Some(topic_name(n))))
                .collect()
        }))
        .with_allow_auto_topic_creation(false)
}

/// A topic for `create_topics_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTopic {
    pub name: String,
    pub partitions: i32,
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
}

pub(crate) fn create_topics_request(topic: &NewTopic, timeout_ms: i32) -> CreateTopicsRequest {
    let configs = topic
        .configs
        .iter()
        .map(|(k, v)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_string(k.clone()))
                .with_value(Some(StrBytes::from_string(v.clone())))
        })
        .collect();
    CreateTopicsRequest::default()
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(&topic.name))
            .with_num_partitions(topic.partitions)
            .with_replication_factor(topic.replication_factor)
            .with_configs(configs)])
        .with_timeout_ms(timeout_ms)
}

/// How a topic creation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// Created now; the id is nil before CreateTopics v7.
    Created { topic_id: Uuid },
    /// It was there already (possibly created by another proxy instance).
    AlreadyExists,
}

pub(crate) fn create_topics_result(
    r: &CreateTopicsResponse,
    name: &str,
) -> Result<Created, ClientError> {
    let t = r
        .topics
        .iter()
        .find(|t| t.name.0.as_str() == name)
        .ok_or_else(|| missing("CreateTopics", name))?;
    match t.error_code {
        0 => Ok(Created::Created {
            topic_id: t.topic_id,
        }),
        36 => Ok(Created::AlreadyExists), // TOPIC_ALREADY_EXISTS
        code => Err(ClientError::Kafka {
            context: format!("create topic {name}"),
            code,
            message: text(&t.error_message),
        }),
    }
}

pub(super) fn missing(api: &str, what: &str) -> ClientError {
    // A broker that leaves out what was asked for is not retried into.
    ClientError::Kafka {
        context: format!("{api} response does not mention {what}"),
        code: -1,
        message: None,
    }
}

/// Kafka's resource type for topics in DescribeConfigs.
const RESOURCE_TOPIC: i8 = 2;

pub(crate) fn describe_topic_config_request(topic: &str, keys: &[&str]) -> DescribeConfigsRequest {
    DescribeConfigsRequest::default().with_resources(vec![DescribeConfigsResource::default()
        .with_resource_type(RESOURCE_TOPIC)
        .with_resource_name(StrBytes::from_string(topic.to_string()))
        .with_configuration_keys(Some(
            keys.iter()
                .map(|k| StrBytes::from_string(k.to_string()))
                .collect(),
        ))])
}

/// The topic's result in a DescribeConfigs answer, its error as `Err`.
pub(super) fn topic_configs<'a>(
    r: &'a DescribeConfigsResponse,
    topic: &str,
) -> Result<
    &'a kafka_protocol::messages::describe_configs_response::DescribeConfigsResult,
    ClientError,
> {
    let res = r
        .results
        .iter()
        .find(|x| x.resource_type == RESOURCE_TOPIC && x.resource_name.as_str() == topic)
        .ok_or_else(|| missing("DescribeConfigs", topic))?;
    if res.error_code != 0 {
        return Err(ClientError::Kafka {
            context: format!("describe configs of topic {topic}"),
            code: res.error_code,
            message: text(&res.error_message),
        });
    }
    Ok(res)
}

/// The topic's configuration values by name (`None`: no value, e.g. sensitive).
pub(crate) fn describe_topic_config_result(
    r: &DescribeConfigsResponse,
    topic: &str,
) -> Result<BTreeMap<String, Option<String>>, ClientError> {
    Ok(topic_configs(r, topic)?
        .configs
        .iter()
        .map(|c| (c.name.as_str().to_string(), text(&c.value)))
        .collect())
}

/// Where a request for one partition goes, as metadata knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionRef<'a> {
    pub topic: &'a str,
    /// Nil when the broker did not say (Metadata below v10).
    pub topic_id: Uuid,
    pub partition: i32,
    /// -1 when unknown: the broker then does not check it.
    pub leader_epoch: i32,
}

impl PartitionRef<'_> {
    pub(super) fn label(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    /// Requests naming topics by id (Produce v13, Fetch v13+) need one.
    pub(super) fn require_id(&self, api: &str) -> Result<Uuid, ClientError> {
        if self.topic_id.is_nil() {
            return Err(ClientError::Kafka {
                context: format!("{api} to {} needs a topic id", self.label()),
                code: 100, // UNKNOWN_TOPIC_ID: retriable, refreshes metadata
                message: None,
            });
        }
        Ok(self.topic_id)
    }

    pub(super) fn same_topic(&self, by_id: bool, name: &TopicName, id: Uuid) -> bool {
        if by_id {
            id == self.topic_id
        } else {
            name.0.as_str() == self.topic
        }
    }
}

/// Produce `records` (one or more whole record batches, sent as they are)
/// to one partition with `acks=all`.
pub(crate) fn produce_request(
    version: i16,
    to: &PartitionRef<'_>,
    records: Bytes,
    timeout_ms: i32,
) -> Result<ProduceRequest, ClientError> {
    produce_request_transactional(version, to, records, timeout_ms, None)
}

/// [`produce_request`] carrying a transactional id, which a broker requires
/// of a request holding a transactional batch (whatever its producer id).
pub(crate) fn produce_request_transactional(
    version: i16,
    to: &PartitionRef<'_>,
    records: Bytes,
    timeout_ms: i32,
    transactional_id: Option<&str>,
) -> Result<ProduceRequest, ClientError> {
    let data = vec![PartitionProduceData::default()
        .with_index(to.partition)
        .with_records(Some(records))];
    let topic = if version >= 13 {
        TopicProduceData::default().with_topic_id(to.require_id("Produce")?)
    } else {
        TopicProduceData::default().with_name(topic_name(to.topic))
    };
    Ok(ProduceRequest::default()
        .with_transactional_id(
            transactional_id.map(|id| TransactionalId(StrBytes::from_string(id.to_string()))),
        )
        .with_acks(-1)
        .with_timeout_ms(timeout_ms)
        .with_topic_data(vec![topic.with_partition_data(data)]))
}

/// How a Produce ended for its partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Produced {
    /// Written (and replicated to the in-sync replicas).
    Appended {
        base_offset: i64,
        /// -1 unless the topic uses LogAppendTime.
        log_append_time_ms: i64,
        log_start_offset: i64,
    },
    /// The broker refused the records with an error that retrying the same
    /// bytes cannot fix (e.g. `INVALID_RECORD` for a client-written control
    /// batch, `CORRUPT_MESSAGE`, `MESSAGE_TOO_LARGE`).
    Refused { code: i16, message: Option<String> },
}

/// Retriable partition errors come back as `Err` (the caller retries);
/// other errors as [`Produced::Refused`].
pub(crate) fn produce_result(
    r: &ProduceResponse,
    version: i16,
    to: &PartitionRef<'_>,
) -> Result<Produced, ClientError> {
    let by_id = version >= 13;
    let p = r
        .responses
        .iter()
        .filter(|t| to.same_topic(by_id, &t.name, t.topic_id))
        .flat_map(|t| t.partition_responses.iter())
        .find(|p| p.index == to.partition)
        .ok_or_else(|| missing("Produce", &to.label()))?;
    partition_produced(p, &to.label())
}

/// One partition's Produce answer: retriable errors as `Err` (the caller
/// retries), other errors as [`Produced::Refused`].
pub(super) fn partition_produced(
    p: &kafka_protocol::messages::produce_response::PartitionProduceResponse,
    label: &str,
) -> Result<Produced, ClientError> {
    let message = text(&p.error_message).or_else(|| {
        p.record_errors
            .iter()
            .find_map(|e| text(&e.batch_index_error_message))
    });
    match p.error_code {
        0 => Ok(Produced::Appended {
            base_offset: p.base_offset,
            log_append_time_ms: p.log_append_time_ms,
            log_start_offset: p.log_start_offset,
        }),
        code if is_retriable_code(code) => Err(ClientError::Kafka {
            context: format!("produce to {label}"),
            code,
            message,
        }),
        code => Ok(Produced::Refused { code, message }),
    }
}

/// Which records a Fetch returns (Kafka's `isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IsolationLevel {
    /// Everything up to the high watermark, open and aborted transactions
    /// included.
    #[default]
    ReadUncommitted,
    /// Only up to the last stable offset, with the list of aborted
    /// transactions in that range ([`Fetched::aborted_transactions`]).
    ReadCommitted,
}

impl IsolationLevel {
    pub(super) fn code(self) -> i8 {
        match self {
            IsolationLevel::ReadUncommitted => 0,
            IsolationLevel::ReadCommitted => 1,
        }
    }
}

/// A sessionless, read-uncommitted Fetch of one partition from `offset`.
/// `max_bytes` bounds the answer (the broker still returns a first batch
/// larger than it, so that a consumer can make progress; the frame size
/// limit bounds that).
#[cfg(test)]
pub(crate) fn fetch_request(
    version: i16,
    from: &PartitionRef<'_>,
    offset: i64,
    max_bytes: i32,
    max_wait_ms: i32,
) -> Result<FetchRequest, ClientError> {
    fetch_request_isolated(
        version,
        from,
        offset,
        max_bytes,
        max_wait_ms,
        IsolationLevel::ReadUncommitted,
    )
}

/// [`fetch_request`] at an isolation level.
pub(crate) fn fetch_request_isolated(
    version: i16,
    from: &PartitionRef<'_>,
    offset: i64,
    max_bytes: i32,
    max_wait_ms: i32,
    isolation: IsolationLevel,
) -> Result<FetchRequest, ClientError> {
    let mut partition = FetchPartition::default()
        .with_partition(from.partition)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(max_bytes);
    if version >= 9 {
        partition = partition.with_current_leader_epoch(from.leader_epoch);
    }
    let topic = if version >= 13 {
        FetchTopic::default().with_topic_id(from.require_id("Fetch")?)
    } else {
        FetchTopic::default().with_topic(topic_name(from.topic))
    };
    Ok(FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(isolation.code())
        .with_session_id(0)
        .with_session_epoch(-1)
        .with_topics(vec![topic.with_partitions(vec![partition])]))
}

/// One partition's Fetch answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetched {
    /// The record batches exactly as the broker sent them (a slice of the
    /// response frame). The last one may be cut short by the size bound.
    pub records: Bytes,
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    pub log_start_offset: i64,
    /// The aborted transactions among the records (read_committed only;
    /// empty otherwise), in the broker's order.
    pub aborted_transactions: Vec<AbortedTransaction>,
}

pub(crate) fn fetch_result(
    r: &FetchResponse,
    version: i16,
    from: &PartitionRef<'_>,
) -> Result<Fetched, ClientError> {
    if r.error_code != 0 {
        return Err(ClientError::Kafka {
            context: format!("fetch from {}", from.label()),
            code: r.error_code,
            message: None,
        });
    }
    let by_id = version >= 13;
    let p = r
        .responses
        .iter()
        .filter(|t| from.same_topic(by_id, &t.topic, t.topic_id))
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == from.partition)
        .ok_or_else(|| missing("Fetch", &from.label()))?;
    partition_fetched(p, &from.label())
}

/// One partition's Fetch answer; its error code as `Err`.
pub(super) fn partition_fetched(
    p: &kafka_protocol::messages::fetch_response::PartitionData,
    label: &str,
) -> Result<Fetched, ClientError> {
    if p.error_code != 0 {
        return Err(ClientError::Kafka {
            context: format!("fetch from {label}"),
            code: p.error_code,
            message: None,
        });
    }
    Ok(Fetched {
        records: p.records.clone().unwrap_or_default(),
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        log_start_offset: p.log_start_offset,
        aborted_transactions: p
            .aborted_transactions
            .iter()
            .flatten()
            .map(|t| AbortedTransaction {
                producer_id: t.producer_id.0,
                first_offset: t.first_offset,
            })
            .collect(),
    })
}

/// Which offset ListOffsets looks up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    /// The log start offset.
    Earliest,
    /// The log end offset (the high watermark for read-uncommitted).
    Latest,
    /// The leader's log end offset itself, above the high watermark when
    /// the leader holds batches not yet replicated: what a debugging
    /// replica (`replica_id` -2) is answered, which Kafka serves without
    /// an isolation level (`ReplicaManager.fetchOffset`: `isolationLevelOpt`
    /// is `None` unless the request is a consumer's).
    LeaderLogEnd,
    /// The first offset whose timestamp is at least this (ms).
    Timestamp(i64),
}

impl OffsetSpec {
    pub(super) fn timestamp(self) -> i64 {
        match self {
            OffsetSpec::Earliest => -2,
            OffsetSpec::Latest | OffsetSpec::LeaderLogEnd => -1,
            OffsetSpec::Timestamp(t) => t,
        }
    }
}

pub(crate) fn list_offsets_request(
    version: i16,
    of: &PartitionRef<'_>,
    spec: OffsetSpec,
    timeout_ms: i32,
) -> ListOffsetsRequest {
    let mut partition = ListOffsetsPartition::default()
        .with_partition_index(of.partition)
        .with_timestamp(spec.timestamp());
    if version >= 4 {
        partition = partition.with_current_leader_epoch(of.leader_epoch);
    }
    let mut request = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(match spec {
            OffsetSpec::LeaderLogEnd => -2,
            _ => -1,
        }))
        .with_isolation_level(0)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(topic_name(of.topic))
            .with_partitions(vec![partition])]);
    if version >= 10 {
        request = request.with_timeout_ms(timeout_ms);
    }
    request
}

/// A ListOffsets answer: the offset (-1 when no record has a timestamp at
/// least the one asked for) and, for a timestamp lookup, that record's
/// timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListedOffset {
    pub offset: i64,
    pub timestamp: i64,
}

pub(crate) fn list_offsets_result(
    r: &ListOffsetsResponse,
    of: &PartitionRef<'_>,
) -> Result<ListedOffset, ClientError> {
    let p = r
        .topics
        .iter()
        .filter(|t| t.name.0.as_str() == of.topic)
        .flat_map(|t| t.partitions.iter())
        .find(|p| p.partition_index == of.partition)
        .ok_or_else(|| missing("ListOffsets", &of.label()))?;
    if p.error_code != 0 {
        return Err(ClientError::Kafka {
            context: format!("list offsets of {}", of.label()),
            code: p.error_code,
            message: None,
        });
    }
    Ok(ListedOffset {
        offset: p.offset,
        timestamp: p.timestamp,
    })
}

/// Replication settings for a compacted internal topic on a cluster of
/// `brokers` brokers: replication factor min(3, brokers), min.insync.replicas
/// min(2, replication factor).
pub(crate) fn compacted_topic_settings(brokers: usize) -> (i16, i16) {
    let rf = brokers.clamp(1, 3) as i16;
    (rf, rf.min(2))
}

/// Whether a `cleanup.policy` value includes compaction (`compact` or
/// `compact,delete` in either order).
pub(crate) fn is_compacted(policy: &str) -> bool {
    policy.split(',').any(|p| p.trim() == "compact")
}

#[cfg(test)]
mod tests;
