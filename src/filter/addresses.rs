//! Keeping clients on the proxy: broker addresses in responses are replaced
//! by proxy addresses (node `n` → advertised host, port base + n; with SNI
//! routing, node `n` → its name from the pattern, the listener's port), and the
//! ApiVersions response is limited to the versions the proxy can walk.
//!
//! Pure: a response frame goes in; the frame to send (or `None` when nothing
//! changed) and what was learnt (real broker addresses, topic ids) come out.
//! `AddressesLayer` runs it as a filter on every response that can carry
//! addresses, except Produce: the Produce filter walks its own responses
//! once, and rewrites them only when that walk finds leader endpoints.
//! Responses are walked with Kafka's own schemas (`wire::walk`), so every
//! version the broker speaks is handled, nothing is reserved from a count on
//! the wire, and a response is re-emitted only when an address in it really
//! changes (a Produce or Fetch response names nodes only when a leader moved).

use bytes::BytesMut;
use kafka_protocol::messages::{ApiKey, ApiVersionsResponse, ResponseHeader};
use kafka_protocol::protocol::Encodable;
use uuid::Uuid;

use std::future::Future;

use super::{pass, FilterError, Outcome, Request, ResponseHalf, Service, Step, Then};
use crate::config::SniNames;
use crate::wire::header::response_body_offset;
use crate::wire::schema::{self, Field};
use crate::wire::walk::{self, Edit, Value, Visitor, WalkError};
use crate::wire::{CodecError, ReadError};

/// Why a response could not be rewritten (the connection is closed).
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("cannot read {api:?} v{version} response")]
    Decode {
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
    #[error("broker node id {node} has no proxy port: MIRROR_PROXY_BROKER_PORT_BASE {base} + {node} is not a valid port")]
    NodePort { node: i32, base: u16 },
}

/// Where clients reach the proxy's per-broker listeners.
#[derive(Debug, Clone)]
pub struct Advertised {
    pub host: String,
    pub port_base: u16,
    /// SNI routing: node `n` is its own name on this one port (`host` and
    /// `port_base` are not used).
    pub sni: Option<(SniNames, u16)>,
}

impl Advertised {
    /// The host clients are told broker `node` is at.
    pub(crate) fn host(&self, node: i32) -> std::borrow::Cow<'_, str> {
        match &self.sni {
            Some((names, _)) => names.node_host(node).into(),
            None => self.host.as_str().into(),
        }
    }

    pub(crate) fn port(&self, node: i32) -> Result<u16, RewriteError> {
        if let Some((_, port)) = &self.sni {
            return Ok(*port);
        }
        i32::from(self.port_base)
            .checked_add(node)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p > 0 && node >= 0)
            .ok_or(RewriteError::NodePort {
                node,
                base: self.port_base,
            })
    }
}

/// What a response taught the proxy.
#[derive(Debug, Default, PartialEq)]
pub struct Learnt {
    /// (node id, real host, real port) of every broker named.
    pub brokers: Vec<(i32, String, i32)>,
    /// (topic id, topic name) from Metadata responses.
    pub topics: Vec<(Uuid, String)>,
}

impl Learnt {
    pub(crate) fn is_empty(&self) -> bool {
        self.brokers.is_empty() && self.topics.is_empty()
    }

    /// Add what `other` taught.
    pub(crate) fn absorb(&mut self, other: Learnt) {
        self.brokers.extend(other.brokers);
        self.topics.extend(other.topics);
    }
}

/// Where a response names nodes.
struct Endpoints {
    /// The response schema.
    schema: &'static str,
    /// Structs holding a node's id, host and port, rewritten to the proxy's
    /// (by path; `""` is the body itself).
    swap: &'static [&'static str],
    /// Structs naming endpoints a client cannot reach through the proxy,
    /// left out of the response.
    hide: &'static [&'static str],
}

const fn swap(schema: &'static str, swap: &'static [&'static str]) -> Endpoints {
    Endpoints {
        schema,
        swap,
        hide: &[],
    }
}

fn endpoints(api: ApiKey) -> Option<Endpoints> {
    Some(match api {
        ApiKey::Metadata => swap("MetadataResponse", &["Brokers"]),
        // v0-3 name one coordinator in the body, v4+ a list.
        ApiKey::FindCoordinator => swap("FindCoordinatorResponse", &["", "Coordinators"]),
        ApiKey::DescribeCluster => swap("DescribeClusterResponse", &["Brokers"]),
        // KIP-951: leader endpoints when a leader moved.
        ApiKey::Produce => swap("ProduceResponse", &["NodeEndpoints"]),
        ApiKey::Fetch => swap("FetchResponse", &["NodeEndpoints"]),
        ApiKey::ShareFetch => swap("ShareFetchResponse", &["NodeEndpoints"]),
        ApiKey::ShareAcknowledge => swap("ShareAcknowledgeResponse", &["NodeEndpoints"]),
        // v2+ lists every controller's listeners. Controllers are not
        // brokers: the proxy has no port for them and a client could not
        // reach them through it, so the quorum is described without them.
        ApiKey::DescribeQuorum => Endpoints {
            schema: "DescribeQuorumResponse",
            swap: &[],
            hide: &["Nodes"],
        },
        _ => return None,
    })
}

/// Every API whose responses the proxy walks. The fuzz targets number them
/// by position (their seeds depend on it): append only.
pub const WALKED_RESPONSES: [ApiKey; 9] = [
    ApiKey::Metadata,
    ApiKey::FindCoordinator,
    ApiKey::DescribeCluster,
    ApiKey::ApiVersions,
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ShareFetch,
    ApiKey::ShareAcknowledge,
    ApiKey::DescribeQuorum,
];

/// The schema the proxy walks responses of `api` with, if it walks them.
pub fn response_schema(api: ApiKey) -> Option<&'static str> {
    match api {
        ApiKey::ApiVersions => Some("ApiVersionsResponse"),
        _ => endpoints(api).map(|e| e.schema),
    }
}

/// Whether responses of this API and version can carry broker addresses.
pub(crate) fn carries_addresses(api: ApiKey, version: i16) -> bool {
    match api {
        ApiKey::Produce => version >= 10,
        ApiKey::Fetch => version >= 16,
        ApiKey::DescribeQuorum => version >= 2,
        _ => endpoints(api).is_some(),
    }
}

/// The version range the proxy can walk for an API whose messages it
/// interprets; `None` for APIs it passes through untouched.
pub(crate) fn parseable_versions(api: ApiKey) -> Option<(i16, i16)> {
    // Asked for every request of an API that carries addresses (every local
    // Produce v10+): the schema table is searched by name once per API, not
    // per request (it showed in the passthrough profile).
    static BY_KEY: std::sync::OnceLock<Vec<Option<(i16, i16)>>> = std::sync::OnceLock::new();
    let table = BY_KEY.get_or_init(|| {
        let mut table = Vec::new();
        for api in ApiKey::iter() {
            let key = api as usize;
            if table.len() <= key {
                table.resize(key + 1, None);
            }
            table[key] = schema_versions(api);
        }
        table
    });
    table.get(api as usize).copied().flatten()
}

fn schema_versions(api: ApiKey) -> Option<(i16, i16)> {
    let m = schema::message(response_schema(api)?).ok()?;
    Some((m.valid.min, m.valid.max))
}

/// A request newer than the proxy parses for an API whose messages it
/// interprets: the proxy never advertised that version, so it closes the
/// connection rather than pass on what it cannot rewrite.
#[derive(Debug, thiserror::Error)]
#[error("{api:?} v{version} is newer than the proxy parses (up to v{max}); the proxy never advertised it")]
pub(crate) struct UnsupportedVersion {
    pub api: ApiKey,
    pub version: i16,
    pub max: i16,
}

/// Refuses `version` of `api` if it is newer than [`parseable_versions`]
/// allows; APIs the proxy passes through untouched always pass.
pub(crate) fn check_parseable(api: ApiKey, version: i16) -> Result<(), UnsupportedVersion> {
    match parseable_versions(api) {
        Some((_, max)) if version > max => Err(UnsupportedVersion { api, version, max }),
        _ => Ok(()),
    }
}

fn schema_for(
    api: ApiKey,
    version: i16,
    name: &str,
) -> Result<&'static schema::Message, RewriteError> {
    schema::message(name).map_err(|e| RewriteError::Decode {
        api,
        version,
        cause: e.into(),
    })
}

fn body_start(api: ApiKey, version: i16, frame: &[u8]) -> Result<usize, RewriteError> {
    response_body_offset(frame, api.response_header_version(version)).ok_or(RewriteError::Decode {
        api,
        version,
        cause: ReadError::TruncatedHeader,
    })
}

/// Replaces every (node id, host, port) of the listed structs.
struct SwapAddresses<'a> {
    adv: &'a Advertised,
    structs: &'static [&'static str],
    hide: &'static [&'static str],
    learnt: Learnt,
    node: i32,
    host: String,
    /// Some address differs from the proxy's.
    changes: bool,
    topic: (Option<String>, Uuid),
    error: Option<RewriteError>,
}

impl SwapAddresses<'_> {
    fn endpoint_field<'f>(&self, field: &'f Field) -> Option<&'f str> {
        self.structs.contains(&field.parent()).then(|| field.name())
    }
}

impl Visitor for SwapAddresses<'_> {
    fn value(&mut self, field: &Field, value: Value<'_>) -> Edit {
        if let Some(name) = self.endpoint_field(field) {
            match (name, value) {
                ("NodeId" | "BrokerId", Value::Int(id)) => self.node = id as i32,
                ("Host", Value::Str(host)) if self.node >= 0 => {
                    self.host = String::from_utf8_lossy(host.unwrap_or_default()).into_owned();
                    let advertised = self.adv.host(self.node);
                    if self.host != advertised {
                        self.changes = true;
                    }
                    return Edit::Str(advertised.into_owned());
                }
                ("Port", Value::Int(port)) if self.node >= 0 => {
                    self.learnt.brokers.push((
                        self.node,
                        std::mem::take(&mut self.host),
                        port as i32,
                    ));
                    match self.adv.port(self.node) {
                        Ok(p) => {
                            if i64::from(p) != port {
                                self.changes = true;
                            }
                            return Edit::Int(i64::from(p));
                        }
                        Err(e) => {
                            self.error.get_or_insert(e);
                        }
                    }
                }
                _ => {}
            }
            return Edit::Keep;
        }
        match (field.path.as_str(), value) {
            ("Topics.Name", Value::Str(Some(name))) => {
                self.topic.0 = std::str::from_utf8(name).ok().map(str::to_string)
            }
            ("Topics.TopicId", Value::Uuid(id)) => self.topic.1 = Uuid::from_bytes(id),
            _ => {}
        }
        Edit::Keep
    }

    fn enter(&mut self, field: &Field) {
        if self.structs.contains(&field.path.as_str()) {
            self.node = -1;
        }
        if field.path == "Topics" {
            self.topic = (None, Uuid::nil());
        }
    }

    fn leave(&mut self, field: &Field) -> bool {
        if self.hide.contains(&field.path.as_str()) {
            self.changes = true;
            return false;
        }
        if field.path == "Topics" {
            if let (Some(name), id) = std::mem::take(&mut self.topic) {
                if !id.is_nil() {
                    self.learnt.topics.push((id, name));
                }
            }
        }
        true
    }
}

/// Rewrite the addresses in a response frame (header + body, no size
/// prefix). Returns `None` for the frame when it names no broker, or only
/// at the proxy's own addresses: the caller forwards it untouched.
pub fn rewrite(
    api: ApiKey,
    version: i16,
    frame: &[u8],
    adv: &Advertised,
) -> Result<(Option<BytesMut>, Learnt), RewriteError> {
    let Some(spec) = endpoints(api) else {
        return Ok((None, Learnt::default()));
    };
    let msg = schema_for(api, version, spec.schema)?;
    let start = body_start(api, version, frame)?;
    let decode_err = |e: WalkError| RewriteError::Decode {
        api,
        version,
        cause: e.into(),
    };
    let mut v = SwapAddresses {
        adv,
        structs: spec.swap,
        hide: spec.hide,
        learnt: Learnt::default(),
        node: -1,
        host: String::new(),
        changes: false,
        topic: (None, Uuid::nil()),
        error: None,
    };
    // First a walk that only looks: most responses need no change.
    walk::walk(msg, version, frame, start, &mut v).map_err(decode_err)?;
    if let Some(e) = v.error.take() {
        return Err(e);
    }
    if !v.changes {
        return Ok((None, v.learnt));
    }
    let learnt = std::mem::take(&mut v.learnt);
    let out = walk::rewrite(msg, version, frame, start, &mut v).map_err(decode_err)?;
    Ok((Some(BytesMut::from(&out[..])), learnt))
}

/// Limits the advertised max version of the APIs the proxy walks.
struct ClampVersions {
    error_code: i64,
    key: i16,
    min: i64,
    drop: bool,
}

impl Visitor for ClampVersions {
    fn value(&mut self, field: &Field, value: Value<'_>) -> Edit {
        let Value::Int(v) = value else {
            return Edit::Keep;
        };
        match field.path.as_str() {
            "ErrorCode" => self.error_code = v,
            "ApiKeys.ApiKey" => self.key = v as i16,
            "ApiKeys.MinVersion" => self.min = v,
            "ApiKeys.MaxVersion" => {
                let Some((_, max)) = ApiKey::try_from(self.key).ok().and_then(parseable_versions)
                else {
                    return Edit::Keep; // not interpreted: passed as the broker says
                };
                // The broker's lower bound stays (Kafka 4 advertises Produce
                // v0 on purpose, KAFKA-18659); only the top is limited.
                self.drop = self.min > i64::from(max);
                if v > i64::from(max) {
                    return Edit::Int(i64::from(max));
                }
            }
            _ => {}
        }
        Edit::Keep
    }

    fn enter(&mut self, _: &Field) {
        self.drop = false;
    }

    fn leave(&mut self, field: &Field) -> bool {
        !(field.path == "ApiKeys" && self.drop)
    }
}

/// Limit an ApiVersions response to the versions the proxy walks. A broker
/// that answers with an error (for instance UNSUPPORTED_VERSION, in the v0
/// layout) is passed through untouched. Returns `None` when nothing changes.
pub fn clamp_api_versions(version: i16, frame: &[u8]) -> Result<Option<BytesMut>, RewriteError> {
    let api = ApiKey::ApiVersions;
    let msg = schema_for(api, version, "ApiVersionsResponse")?;
    let start = body_start(api, version, frame)?;
    let mut v = ClampVersions {
        error_code: 0,
        key: -1,
        min: 0,
        drop: false,
    };
    let Ok(out) = walk::rewrite(msg, version, frame, start, &mut v) else {
        return Ok(None); // e.g. the v0-layout error answer
    };
    if v.error_code != 0 || out == frame {
        return Ok(None);
    }
    Ok(Some(BytesMut::from(&out[..])))
}

/// The highest ApiVersions version the proxy walks.
pub(crate) fn api_versions_max() -> i16 {
    parseable_versions(ApiKey::ApiVersions).map_or(0, |(_, max)| max)
}

/// The answer to an ApiVersions request newer than the proxy walks: what a
/// broker says in that case (UNSUPPORTED_VERSION, v0 layout, with the range
/// it supports), so the client retries with a version both understand.
pub(crate) fn unsupported_api_versions(correlation_id: i32) -> Result<BytesMut, RewriteError> {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    let api = ApiKey::ApiVersions;
    let body = ApiVersionsResponse::default()
        .with_error_code(kafka_protocol::ResponseError::UnsupportedVersion.code())
        .with_api_keys(vec![ApiVersion::default()
            .with_api_key(api as i16)
            .with_min_version(0)
            .with_max_version(api_versions_max())]);
    let err = |e: anyhow::Error| RewriteError::Encode {
        api,
        version: 0,
        cause: e.into(),
    };
    let mut out = BytesMut::new();
    ResponseHeader::default()
        .with_correlation_id(correlation_id)
        .encode(&mut out, 0)
        .map_err(err)?;
    body.encode(&mut out, 0).map_err(err)?;
    Ok(out)
}

pub(crate) struct AddressesLayer<'a> {
    advertised: &'a Advertised,
}

impl<'a> AddressesLayer<'a> {
    pub(crate) fn new(advertised: &'a Advertised) -> AddressesLayer<'a> {
        AddressesLayer { advertised }
    }
}

impl<'a, S> tower::Layer<S> for AddressesLayer<'a> {
    type Service = Addresses<'a, S>;

    fn layer(&self, inner: S) -> Addresses<'a, S> {
        Addresses {
            advertised: self.advertised,
            inner,
        }
    }
}

/// The filter: responses that can name brokers are rewritten.
pub(crate) struct Addresses<'a, S> {
    advertised: &'a Advertised,
    inner: S,
}

impl<'a, S: Service> Service for Addresses<'a, S> {
    type Pending = Then<S::Pending, Rewrite<'a>>;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<Self::Pending>> {
        let version = request.header.api_version;
        let api = match request.api {
            Some(api) if api != ApiKey::Produce && carries_addresses(api, version) => api,
            _ => return pass(&mut self.inner, request, Then::inner),
        };
        if let Err(e) = check_parseable(api, version) {
            return Step::Ready(Err(e.into()));
        }
        let advertised = self.advertised;
        pass(&mut self.inner, request, move |p| {
            Then::new(
                p,
                Rewrite {
                    api,
                    version,
                    advertised,
                },
            )
        })
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

/// The response half: broker addresses replaced.
pub(crate) struct Rewrite<'a> {
    api: ApiKey,
    version: i16,
    advertised: &'a Advertised,
}

impl ResponseHalf for Rewrite<'_> {
    fn respond(self, frame: BytesMut, learnt: &mut Learnt) -> Result<BytesMut, FilterError> {
        let (out, named) = rewrite(self.api, self.version, &frame, self.advertised)?;
        learnt.absorb(named);
        Ok(out.unwrap_or(frame))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_walked_response_has_a_schema() {
        for api in super::WALKED_RESPONSES {
            let name = super::response_schema(api).unwrap_or_default();
            assert!(
                super::schema::message(name).is_ok(),
                "{api:?}: no schema {name:?}"
            );
        }
        assert_eq!(
            super::response_schema(kafka_protocol::messages::ApiKey::Heartbeat),
            None
        );
    }

    #[test]
    fn parseable_versions_are_the_schemas_for_every_api() {
        use kafka_protocol::messages::ApiKey;
        for api in ApiKey::iter() {
            assert_eq!(
                super::parseable_versions(api),
                super::schema_versions(api),
                "{api:?}"
            );
        }
        assert_eq!(super::parseable_versions(ApiKey::Heartbeat), None);
        let (_, max) = super::parseable_versions(ApiKey::Produce).unwrap_or_default();
        assert!(max >= 13, "Produce up to v{max}");
    }

    use super::*;
    use bytes::Bytes;
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{
        BrokerId, DescribeClusterResponse, FindCoordinatorResponse, MetadataResponse,
        ProduceResponse, TopicName,
    };
    use kafka_protocol::protocol::{Decodable, Message, StrBytes};

    fn encode<T: Encodable>(
        api: ApiKey,
        version: i16,
        header: &ResponseHeader,
        body: &T,
    ) -> anyhow::Result<BytesMut> {
        let mut out = BytesMut::new();
        header.encode(&mut out, api.response_header_version(version))?;
        body.encode(&mut out, version)?;
        Ok(out)
    }

    /// The tests' own decoder, to check what the walk wrote.
    fn decode<T: Decodable>(
        api: ApiKey,
        version: i16,
        frame: &Bytes,
    ) -> anyhow::Result<(ResponseHeader, T)> {
        let mut buf = frame.clone();
        let header = ResponseHeader::decode(&mut buf, api.response_header_version(version))?;
        let body = T::decode(&mut buf, version)?;
        anyhow::ensure!(buf.is_empty(), "{} bytes left over", buf.len());
        Ok((header, body))
    }

    fn adv() -> Advertised {
        Advertised {
            host: "proxy.example".into(),
            port_base: 19000,
            sni: None,
        }
    }

    fn frame<T: Encodable>(api: ApiKey, version: i16, body: &T) -> Bytes {
        encode(
            api,
            version,
            &ResponseHeader::default().with_correlation_id(7),
            body,
        )
        .expect("encode")
        .freeze()
    }

    #[test]
    fn metadata_brokers_point_at_the_proxy_at_every_version() {
        for version in MetadataResponse::VERSIONS.min..=MetadataResponse::VERSIONS.max {
            let body = MetadataResponse::default()
                .with_brokers(vec![
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(1))
                        .with_host(StrBytes::from_static_str("10.0.0.5"))
                        .with_port(9092),
                    MetadataResponseBroker::default()
                        .with_node_id(BrokerId(7))
                        .with_host(StrBytes::from_static_str("10.0.0.6"))
                        .with_port(9093),
                ])
                .with_topics(vec![MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("orders"))))
                    .with_topic_id(Uuid::from_u128(5))]);
            let (out, learnt) = rewrite(
                ApiKey::Metadata,
                version,
                &frame(ApiKey::Metadata, version, &body),
                &adv(),
            )
            .expect("rewrite");
            let (header, decoded) = decode::<MetadataResponse>(
                ApiKey::Metadata,
                version,
                &out.expect("rewritten").freeze(),
            )
            .expect("decode");
            assert_eq!(header.correlation_id, 7);
            let addrs: Vec<(String, i32)> = decoded
                .brokers
                .iter()
                .map(|b| (b.host.as_str().to_string(), b.port))
                .collect();
            assert_eq!(
                addrs,
                vec![
                    ("proxy.example".into(), 19001),
                    ("proxy.example".into(), 19007)
                ],
                "v{version}"
            );
            assert_eq!(
                learnt.brokers,
                vec![(1, "10.0.0.5".into(), 9092), (7, "10.0.0.6".into(), 9093)]
            );
            if version >= 10 {
                assert_eq!(learnt.topics, vec![(Uuid::from_u128(5), "orders".into())]);
            }
        }
    }

    #[test]
    fn sni_routing_advertises_one_name_per_node_on_one_port() {
        let names = SniNames::new("broker-$(nodeId).kafka.example", "bootstrap.kafka.example")
            .expect("valid");
        let adv = Advertised {
            host: "unused".into(),
            port_base: 1,
            sni: Some((names, 9092)),
        };
        // Node ids of any size: no port arithmetic.
        let body = MetadataResponse::default().with_brokers(vec![
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("10.0.0.5"))
                .with_port(9092),
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(100_000))
                .with_host(StrBytes::from_static_str("10.0.0.6"))
                .with_port(9093),
        ]);
        let version = 12;
        let (out, learnt) = rewrite(
            ApiKey::Metadata,
            version,
            &frame(ApiKey::Metadata, version, &body),
            &adv,
        )
        .expect("rewrite");
        let (_, decoded) = decode::<MetadataResponse>(
            ApiKey::Metadata,
            version,
            &out.expect("rewritten").freeze(),
        )
        .expect("decode");
        let addrs: Vec<(String, i32)> = decoded
            .brokers
            .iter()
            .map(|b| (b.host.as_str().to_string(), b.port))
            .collect();
        assert_eq!(
            addrs,
            vec![
                ("broker-1.kafka.example".into(), 9092),
                ("broker-100000.kafka.example".into(), 9092)
            ]
        );
        assert_eq!(
            learnt.brokers,
            vec![
                (1, "10.0.0.5".into(), 9092),
                (100_000, "10.0.0.6".into(), 9093)
            ]
        );
    }

    #[test]
    fn find_coordinator_single_and_batched() {
        for version in FindCoordinatorResponse::VERSIONS.min..=FindCoordinatorResponse::VERSIONS.max
        {
            let body = if version <= 3 {
                FindCoordinatorResponse::default()
                    .with_node_id(BrokerId(2))
                    .with_host(StrBytes::from_static_str("b2"))
                    .with_port(9092)
            } else {
                FindCoordinatorResponse::default().with_coordinators(vec![
                    Coordinator::default()
                        .with_key(StrBytes::from_static_str("g"))
                        .with_node_id(BrokerId(2))
                        .with_host(StrBytes::from_static_str("b2"))
                        .with_port(9092),
                    Coordinator::default()
                        .with_key(StrBytes::from_static_str("h"))
                        .with_node_id(BrokerId(-1))
                        .with_error_code(15),
                ])
            };
            let (out, learnt) = rewrite(
                ApiKey::FindCoordinator,
                version,
                &frame(ApiKey::FindCoordinator, version, &body),
                &adv(),
            )
            .expect("rewrite");
            let (_, d) = decode::<FindCoordinatorResponse>(
                ApiKey::FindCoordinator,
                version,
                &out.expect("rewritten").freeze(),
            )
            .expect("decode");
            if version <= 3 {
                assert_eq!((d.host.as_str(), d.port), ("proxy.example", 19002));
            } else {
                assert_eq!(
                    (d.coordinators[0].host.as_str(), d.coordinators[0].port),
                    ("proxy.example", 19002)
                );
                assert_eq!(d.coordinators[1].node_id.0, -1);
            }
            assert_eq!(learnt.brokers, vec![(2, "b2".into(), 9092)]);
        }
    }

    #[test]
    fn node_ports_that_do_not_fit_are_errors() {
        let adv = Advertised {
            host: "h".into(),
            port_base: 65535,
            sni: None,
        };
        assert!(matches!(
            adv.port(1),
            Err(RewriteError::NodePort {
                node: 1,
                base: 65535
            })
        ));
    }

    #[test]
    fn api_versions_keep_the_broker_minimum_and_cap_the_maximum() {
        let entry = |key: i16, min: i16, max: i16| {
            ApiVersion::default()
                .with_api_key(key)
                .with_min_version(min)
                .with_max_version(max)
        };
        let body = ApiVersionsResponse::default().with_api_keys(vec![
            entry(0, 0, 99),  // Produce: 4.x advertises v0 on purpose (KAFKA-18659)
            entry(1, 4, 18),  // Fetch: every 4.4 version is walked
            entry(3, 0, 99),  // Metadata from a newer broker
            entry(60, 0, 1),  // DescribeCluster, within range
            entry(9, 0, 99),  // OffsetFetch: not interpreted
            entry(999, 0, 3), // unknown key: untouched
        ]);
        for version in [0, 3, 4] {
            let out = clamp_api_versions(version, &frame(ApiKey::ApiVersions, version, &body))
                .expect("clamp")
                .expect("changed");
            let (h, d) = decode::<ApiVersionsResponse>(ApiKey::ApiVersions, version, &out.freeze())
                .expect("decode");
            assert_eq!(h.correlation_id, 7);
            let ranges: Vec<(i16, i16, i16)> = d
                .api_keys
                .iter()
                .map(|e| (e.api_key, e.min_version, e.max_version))
                .collect();
            assert_eq!(
                ranges,
                vec![
                    (0, 0, 13),
                    (1, 4, 18),
                    (3, 0, 13),
                    (60, 0, 1),
                    (9, 0, 99),
                    (999, 0, 3)
                ],
                "v{version}"
            );
        }
        // Nothing to change: the frame passes as it came.
        let within = ApiVersionsResponse::default().with_api_keys(vec![entry(0, 0, 13)]);
        assert!(
            clamp_api_versions(3, &frame(ApiKey::ApiVersions, 3, &within))
                .expect("clamp")
                .is_none()
        );
    }

    #[test]
    fn produce_responses_pass_untouched_without_leader_endpoints() {
        use kafka_protocol::messages::produce_response::{
            NodeEndpoint, PartitionProduceResponse, TopicProduceResponse,
        };
        let partitions = vec![TopicProduceResponse::default()
            .with_name(TopicName(StrBytes::from_static_str("orders")))
            .with_partition_responses(vec![PartitionProduceResponse::default()
                .with_index(3)
                .with_base_offset(42)])];
        for version in 10..=ProduceResponse::VERSIONS.max {
            let plain = ProduceResponse::default().with_responses(partitions.clone());
            let (out, learnt) = rewrite(
                ApiKey::Produce,
                version,
                &frame(ApiKey::Produce, version, &plain),
                &adv(),
            )
            .expect("walk");
            assert!(out.is_none() && learnt.brokers.is_empty(), "v{version}");

            // NOT_LEADER_OR_FOLLOWER with the new leader's endpoint, a
            // tagged field whose size changes with the host.
            let moved = plain.with_node_endpoints(vec![NodeEndpoint::default()
                .with_node_id(BrokerId(2))
                .with_host(StrBytes::from_static_str("b2.internal.example.com"))
                .with_port(9092)]);
            let (out, learnt) = rewrite(
                ApiKey::Produce,
                version,
                &frame(ApiKey::Produce, version, &moved),
                &adv(),
            )
            .expect("walk");
            let (_, d) = decode::<ProduceResponse>(
                ApiKey::Produce,
                version,
                &out.expect("rewritten").freeze(),
            )
            .expect("decode");
            assert_eq!(d.node_endpoints[0].host.as_str(), "proxy.example");
            assert_eq!(d.node_endpoints[0].port, 19002);
            assert_eq!(d.responses[0].partition_responses[0].base_offset, 42);
            assert_eq!(
                learnt.brokers,
                vec![(2, "b2.internal.example.com".into(), 9092)]
            );
        }
    }

    #[test]
    fn describe_cluster_brokers_point_at_the_proxy() {
        use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
        for version in 0..=DescribeClusterResponse::VERSIONS.max {
            let body = DescribeClusterResponse::default()
                .with_cluster_id(StrBytes::from_static_str("c"))
                .with_brokers(vec![DescribeClusterBroker::default()
                    .with_broker_id(BrokerId(0))
                    .with_host(StrBytes::from_static_str("10.1.1.1"))
                    .with_port(9092)]);
            let (out, _) = rewrite(
                ApiKey::DescribeCluster,
                version,
                &frame(ApiKey::DescribeCluster, version, &body),
                &adv(),
            )
            .expect("rewrite");
            let (_, d) = decode::<DescribeClusterResponse>(
                ApiKey::DescribeCluster,
                version,
                &out.expect("rewritten").freeze(),
            )
            .expect("decode");
            assert_eq!(
                (d.brokers[0].host.as_str(), d.brokers[0].port),
                ("proxy.example", 19000)
            );
        }
    }

    #[test]
    fn fetch_v16_and_later_leader_endpoints_point_at_the_proxy() {
        use kafka_protocol::messages::fetch_response::{
            FetchableTopicResponse, NodeEndpoint, PartitionData,
        };
        use kafka_protocol::messages::FetchResponse;
        for version in 16..=FetchResponse::VERSIONS.max {
            let body = FetchResponse::default()
                .with_responses(vec![FetchableTopicResponse::default()
                    .with_topic_id(Uuid::from_u128(9))
                    .with_partitions(vec![PartitionData::default()
                        .with_partition_index(0)
                        .with_error_code(6)
                        .with_records(Some(Bytes::from_static(b"opaque records")))])])
                .with_node_endpoints(vec![NodeEndpoint::default()
                    .with_node_id(BrokerId(3))
                    .with_host(StrBytes::from_static_str("b3"))
                    .with_port(9092)]);
            let (out, learnt) = rewrite(
                ApiKey::Fetch,
                version,
                &frame(ApiKey::Fetch, version, &body),
                &adv(),
            )
            .expect("rewrite");
            let (_, d) =
                decode::<FetchResponse>(ApiKey::Fetch, version, &out.expect("rewritten").freeze())
                    .expect("decode");
            assert_eq!(
                (d.node_endpoints[0].host.as_str(), d.node_endpoints[0].port),
                ("proxy.example", 19003),
                "v{version}"
            );
            assert_eq!(
                d.responses[0].partitions[0].records.as_deref(),
                Some(&b"opaque records"[..])
            );
            assert_eq!(learnt.brokers, vec![(3, "b3".into(), 9092)]);
        }
    }

    #[test]
    fn describe_quorum_hides_controller_endpoints() {
        use kafka_protocol::messages::describe_quorum_response::{
            Listener, Node, PartitionData, ReplicaState, TopicData,
        };
        use kafka_protocol::messages::DescribeQuorumResponse;
        let body = DescribeQuorumResponse::default()
            .with_topics(vec![TopicData::default()
                .with_topic_name(TopicName(StrBytes::from_static_str("__cluster_metadata")))
                .with_partitions(vec![PartitionData::default()
                    .with_leader_id(BrokerId(1))
                    .with_current_voters(vec![ReplicaState::default()
                        .with_replica_id(BrokerId(1))
                        .with_log_end_offset(77)])])])
            .with_nodes(vec![Node::default()
                .with_node_id(BrokerId(1))
                .with_listeners(vec![Listener::default()
                    .with_name(StrBytes::from_static_str("CONTROLLER"))
                    .with_host(StrBytes::from_static_str("10.9.9.9"))
                    .with_port(9093)])]);
        let (out, learnt) = rewrite(
            ApiKey::DescribeQuorum,
            2,
            &frame(ApiKey::DescribeQuorum, 2, &body),
            &adv(),
        )
        .expect("rewrite");
        let (_, d) = decode::<DescribeQuorumResponse>(
            ApiKey::DescribeQuorum,
            2,
            &out.expect("rewritten").freeze(),
        )
        .expect("decode");
        assert!(d.nodes.is_empty());
        assert_eq!(
            d.topics[0].partitions[0].current_voters[0].log_end_offset,
            77
        );
        assert!(learnt.brokers.is_empty(), "controllers get no proxy port");
        // v0-1 name no endpoints: nothing to do.
        assert!(!carries_addresses(ApiKey::DescribeQuorum, 1));
    }

    #[test]
    fn forged_counts_in_responses_are_errors_not_allocations() {
        // Metadata v12: throttle, then a brokers compact array whose length
        // varint says 2^31 - 1 entries.
        let mut f = vec![0, 0, 0, 7, 0, 0, 0, 0, 0];
        f.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0x07]);
        let e = rewrite(ApiKey::Metadata, 12, &f, &adv()).expect_err("forged count");
        assert!(
            matches!(
                &e,
                RewriteError::Decode {
                    cause: ReadError::Walk(_),
                    ..
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "cannot read Metadata v12 response");
        assert!(
            std::error::Error::source(&e).is_some_and(|c| c.is::<ReadError>()),
            "{e:?}"
        );
        // Metadata v5 (not flexible): brokers count 0x10000001.
        let f = [0, 0, 0, 7, 0, 0, 0, 0, 0x10, 0, 0, 1, 0, 0];
        assert!(rewrite(ApiKey::Metadata, 5, &f, &adv()).is_err());
    }

    #[test]
    fn unsupported_api_versions_answer_uses_the_v0_layout() {
        let out = unsupported_api_versions(9).expect("encode").freeze();
        let (h, d) = decode::<ApiVersionsResponse>(ApiKey::ApiVersions, 0, &out).expect("decode");
        assert_eq!(h.correlation_id, 9);
        assert_eq!(d.error_code, 35);
        assert_eq!(d.api_keys[0].max_version, api_versions_max());
    }
}
