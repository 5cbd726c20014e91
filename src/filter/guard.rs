//! The state topic is the proxy's own: every instance applies what it
//! holds, so a client that could write it could switch a link's state or
//! forge a mapping. A client's Produce to it is refused per partition by
//! the Produce filter; this layer answers, itself, every request that
//! would delete its records, delete it, add partitions to it or change its
//! configuration (DeleteRecords, DeleteTopics, CreatePartitions,
//! AlterConfigs, IncrementalAlterConfigs) when it names the state topic:
//! each entry of such a request is refused with TOPIC_AUTHORIZATION_FAILED
//! (a request is refused whole: nothing of it reaches the broker), and the
//! refusal is logged once per request. Requests that do not name it pass
//! untouched; they are decoded only for these rare APIs.

use std::future::Future;

use bytes::BytesMut;
use kafka_protocol::messages::{
    alter_configs_response, create_partitions_response, delete_records_response,
    delete_topics_response, incremental_alter_configs_response, AlterConfigsRequest,
    AlterConfigsResponse, ApiKey, CreatePartitionsRequest, CreatePartitionsResponse,
    DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::ResponseError;
use tower::Layer;
use uuid::Uuid;

use super::{Context, FilterError, Outcome, Pending, Request, Service, Step};
use crate::wire::{schema, walk, CodecError, ReadError};

/// A request this layer had to read and could not, or an answer it could
/// not encode: the connection closes, nothing is forwarded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GuardError {
    #[error("cannot read {api:?} v{version} request")]
    Request {
        api: ApiKey,
        version: i16,
        #[source]
        cause: ReadError,
    },
    #[error("cannot encode {api:?} v{version} response")]
    Encode {
        api: ApiKey,
        version: i16,
        #[source]
        cause: CodecError,
    },
}

/// A config resource of type TOPIC.
const TOPIC_RESOURCE: i8 = 2;

/// Whether a config resource is the topic `topic`.
fn is_topic(resource_type: i8, name: &StrBytes, topic: &str) -> bool {
    resource_type == TOPIC_RESOURCE && name.as_str() == topic
}

pub(crate) struct GuardLayer<'a> {
    ctx: &'a Context,
}

impl<'a> GuardLayer<'a> {
    pub(crate) fn new(ctx: &'a Context) -> GuardLayer<'a> {
        GuardLayer { ctx }
    }
}

impl<'a, S> Layer<S> for GuardLayer<'a> {
    type Service = Guard<'a, S>;

    fn layer(&self, inner: S) -> Guard<'a, S> {
        Guard {
            ctx: self.ctx,
            inner,
        }
    }
}

pub(crate) struct Guard<'a, S> {
    ctx: &'a Context,
    inner: S,
}

/// Whether `api` can delete, grow or reconfigure a topic.
fn guarded(api: Option<ApiKey>) -> bool {
    matches!(
        api,
        Some(
            ApiKey::DeleteRecords
                | ApiKey::DeleteTopics
                | ApiKey::CreatePartitions
                | ApiKey::AlterConfigs
                | ApiKey::IncrementalAlterConfigs
        )
    )
}

impl<S: Service> Service for Guard<'_, S> {
    type Pending = S::Pending;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<S::Pending>> {
        match self.ctx.state.is_some() && guarded(request.api) {
            false => self.inner.call(request),
            // Boxed: admin requests are rare.
            true => Step::Wait(Box::pin(self.check(request))),
        }
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

impl<S: Service> Guard<'_, S> {
    async fn check(&mut self, request: Request) -> Result<Outcome<S::Pending>, FilterError> {
        let Some(state) = self.ctx.state.as_ref() else {
            return self.inner.call(request).decided().await;
        };
        let Some(api) = request.api else {
            return self.inner.call(request).decided().await;
        };
        let h = &request.header;
        let body_offset =
            h.body_offset(&request.frame, api.request_header_version(h.api_version))?;
        let topic = state.topic();
        // DeleteTopics names topics by id from v6: the state topic's id is
        // looked up (cached after the first time). Unknown, every id is
        // taken for it: refused rather than risked.
        let id = match api == ApiKey::DeleteTopics && h.api_version >= 6 {
            true => state.lookup_topic_id(topic).await.ok(),
            false => None,
        };
        let asked = Asked {
            api,
            version: h.api_version,
            correlation_id: h.correlation_id,
        };
        match refusal(asked, &request.frame, body_offset, topic, id)? {
            None => self.inner.call(request).decided().await,
            Some(answer) => {
                self.ctx.metrics.state_topic_request_refused(api);
                tracing::warn!(api = ?api, client_id = ?h.client_id(&request.frame), topic, "refused a client request that names the proxy's state topic");
                Ok(Outcome::Owed(S::Pending::local(answer)))
            }
        }
    }
}

/// A request as its header names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked {
    pub api: ApiKey,
    pub version: i16,
    pub correlation_id: i32,
}

/// The answer that refuses the request in `frame` (body at `body_offset`)
/// if it names the state topic `topic` (or, for DeleteTopics by id, its id
/// `id`; `None`: unknown, so any id), every entry refused; `None` when the
/// request does not name it. A request that cannot be read is an error:
/// the connection closes, nothing is forwarded.
pub(crate) fn refusal(
    asked: Asked,
    frame: &[u8],
    body_offset: usize,
    topic: &str,
    id: Option<Uuid>,
) -> Result<Option<BytesMut>, GuardError> {
    let Asked { api, version, .. } = asked;
    let decode_err = |cause: ReadError| GuardError::Request {
        api,
        version,
        cause,
    };
    // The decoder reserves memory from the counts it reads: a bounded walk
    // checks every count against the bytes first.
    let name = format!("{api:?}Request");
    let msg = schema::message(&name).map_err(|e| decode_err(e.into()))?;
    walk::validate(msg, version, frame, body_offset).map_err(|e| decode_err(e.into()))?;
    let mut body = bytes::Bytes::copy_from_slice(frame.get(body_offset..).unwrap_or_default());
    let is_state = |n: &TopicName| n.0.as_str() == topic;
    let message = || {
        Some(StrBytes::from_string(format!(
            "the request names '{topic}', the kafka-mirror-proxy state topic, which only the proxy writes; it was refused whole: send it again without that topic"
        )))
    };
    let code = ResponseError::TopicAuthorizationFailed.code();
    let answer = match api {
        ApiKey::DeleteRecords => {
            let r = DeleteRecordsRequest::decode(&mut body, version)
                .map_err(|e| decode_err(ReadError::decode(e)))?;
            if !r.topics.iter().any(|t| is_state(&t.name)) {
                return Ok(None);
            }
            encode(asked, &DeleteRecordsResponse::default().with_topics(
                r.topics
                    .into_iter()
                    .map(|t| {
                        delete_records_response::DeleteRecordsTopicResult::default()
                            .with_name(t.name)
                            .with_partitions(
                                t.partitions
                                    .iter()
                                    .map(|p| {
                                        delete_records_response::DeleteRecordsPartitionResult::default()
                                            .with_partition_index(p.partition_index)
                                            .with_low_watermark(-1)
                                            .with_error_code(code)
                                    })
                                    .collect(),
                            )
                    })
                    .collect(),
            ))
        }
        ApiKey::DeleteTopics => {
            let r = DeleteTopicsRequest::decode(&mut body, version)
                .map_err(|e| decode_err(ReadError::decode(e)))?;
            let by_id = |t: Uuid| !t.is_nil() && id.is_none_or(|id| id == t);
            let named = r.topic_names.iter().any(is_state)
                || r.topics
                    .iter()
                    .any(|t| t.name.as_ref().is_some_and(is_state) || by_id(t.topic_id));
            if !named {
                return Ok(None);
            }
            let mut results: Vec<_> = r
                .topic_names
                .into_iter()
                .map(|n| delete_topics_response::DeletableTopicResult::default().with_name(Some(n)))
                .collect();
            results.extend(r.topics.into_iter().map(|t| {
                delete_topics_response::DeletableTopicResult::default()
                    .with_name(t.name)
                    .with_topic_id(t.topic_id)
            }));
            encode(
                asked,
                &DeleteTopicsResponse::default().with_responses(
                    results
                        .into_iter()
                        .map(|t| t.with_error_code(code).with_error_message(message()))
                        .collect(),
                ),
            )
        }
        ApiKey::CreatePartitions => {
            let r = CreatePartitionsRequest::decode(&mut body, version)
                .map_err(|e| decode_err(ReadError::decode(e)))?;
            if !r.topics.iter().any(|t| is_state(&t.name)) {
                return Ok(None);
            }
            encode(
                asked,
                &CreatePartitionsResponse::default().with_results(
                    r.topics
                        .into_iter()
                        .map(|t| {
                            create_partitions_response::CreatePartitionsTopicResult::default()
                                .with_name(t.name)
                                .with_error_code(code)
                                .with_error_message(message())
                        })
                        .collect(),
                ),
            )
        }
        ApiKey::AlterConfigs => {
            let r = AlterConfigsRequest::decode(&mut body, version)
                .map_err(|e| decode_err(ReadError::decode(e)))?;
            let named = r
                .resources
                .iter()
                .any(|c| is_topic(c.resource_type, &c.resource_name, topic));
            if !named {
                return Ok(None);
            }
            encode(
                asked,
                &AlterConfigsResponse::default().with_responses(
                    r.resources
                        .into_iter()
                        .map(|c| {
                            alter_configs_response::AlterConfigsResourceResponse::default()
                                .with_resource_type(c.resource_type)
                                .with_resource_name(c.resource_name)
                                .with_error_code(code)
                                .with_error_message(message())
                        })
                        .collect(),
                ),
            )
        }
        ApiKey::IncrementalAlterConfigs => {
            let r = IncrementalAlterConfigsRequest::decode(&mut body, version)
                .map_err(|e| decode_err(ReadError::decode(e)))?;
            let named = r
                .resources
                .iter()
                .any(|c| is_topic(c.resource_type, &c.resource_name, topic));
            if !named {
                return Ok(None);
            }
            encode(asked, &
                IncrementalAlterConfigsResponse::default().with_responses(
                    r.resources
                        .into_iter()
                        .map(|c| {
                            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                                .with_resource_type(c.resource_type)
                                .with_resource_name(c.resource_name)
                                .with_error_code(code)
                                .with_error_message(message())
                        })
                        .collect(),
                ),
            )
        }
        _ => return Ok(None),
    };
    answer.map(Some)
}

fn encode<T: Encodable>(asked: Asked, body: &T) -> Result<BytesMut, GuardError> {
    let encode_err = |e: anyhow::Error| GuardError::Encode {
        api: asked.api,
        version: asked.version,
        cause: e.into(),
    };
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(asked.correlation_id)
        .encode(&mut out, asked.api.response_header_version(asked.version))
        .map_err(encode_err)?;
    body.encode(&mut out, asked.version).map_err(encode_err)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_request_cut_short_is_refused_with_the_walk_error_as_its_cause() {
        let asked = Asked {
            api: ApiKey::DeleteRecords,
            version: 1,
            correlation_id: 7,
        };
        // v1 is not flexible: a topic count of one, and nothing after it.
        let frame = [0u8, 0, 0, 1];
        let e = refusal(asked, &frame, 0, "__mirror_state", None).expect_err("cut short");
        assert_eq!(e.to_string(), "cannot read DeleteRecords v1 request");
        let cause = e.source().and_then(|c| c.downcast_ref::<ReadError>());
        assert!(matches!(cause, Some(ReadError::Walk(_))), "{e:?}");
        let chain = crate::sync::error_chain(&e);
        assert!(
            chain.starts_with("cannot read DeleteRecords v1 request: "),
            "{chain}"
        );
    }
}
