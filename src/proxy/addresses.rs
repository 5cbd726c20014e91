//! Keeping clients on the proxy: broker addresses in responses are replaced
//! by proxy addresses (node `n` → advertised host, port base + n), and the
//! ApiVersions response is clamped to what the proxy can parse.
//!
//! Pure: a response frame goes in, a re-encoded frame and what was learnt
//! (real broker addresses, topic ids) come out. Only the responses that carry
//! addresses are decoded at all.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, DescribeClusterResponse, FindCoordinatorResponse,
    MetadataResponse, ProduceResponse, ResponseHeader, ShareAcknowledgeResponse,
    ShareFetchResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, Message, StrBytes};
use uuid::Uuid;

/// Why a response could not be rewritten (the connection is closed).
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    #[error("cannot decode {api:?} v{version} response: {reason}")]
    Decode {
        api: ApiKey,
        version: i16,
        reason: String,
    },
    #[error("cannot encode {api:?} v{version} response: {reason}")]
    Encode {
        api: ApiKey,
        version: i16,
        reason: String,
    },
    #[error("broker node id {node} has no proxy port: MIRROR_PROXY_BROKER_PORT_BASE {base} + {node} is not a valid port")]
    NodePort { node: i32, base: u16 },
}

/// Where clients reach the proxy's per-broker listeners.
#[derive(Debug, Clone)]
pub struct Advertised {
    pub host: String,
    pub port_base: u16,
}

impl Advertised {
    pub fn port(&self, node: i32) -> Result<u16, RewriteError> {
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

/// Whether responses of this API and version carry broker addresses.
pub fn carries_addresses(api: ApiKey, version: i16) -> bool {
    match api {
        ApiKey::Metadata
        | ApiKey::FindCoordinator
        | ApiKey::DescribeCluster
        | ApiKey::ShareFetch
        | ApiKey::ShareAcknowledge => true,
        // KIP-951: leader endpoints on NOT_LEADER_OR_FOLLOWER.
        ApiKey::Produce => version >= 10,
        _ => false,
    }
}

/// The version range the proxy can parse for an API whose responses it
/// interprets; `None` for APIs it passes through untouched.
pub fn parseable_versions(api: ApiKey) -> Option<(i16, i16)> {
    let r = match api {
        ApiKey::Produce => {
            let (min, max) = crate::mirror::produce::supported_versions();
            return Some((min, max));
        }
        ApiKey::Metadata => MetadataResponse::VERSIONS,
        ApiKey::FindCoordinator => FindCoordinatorResponse::VERSIONS,
        ApiKey::DescribeCluster => DescribeClusterResponse::VERSIONS,
        ApiKey::ApiVersions => ApiVersionsResponse::VERSIONS,
        ApiKey::ShareFetch => ShareFetchResponse::VERSIONS,
        ApiKey::ShareAcknowledge => ShareAcknowledgeResponse::VERSIONS,
        // Fetch v16+ responses carry leader endpoints (KIP-951) at the end of
        // a body that holds the records; capping at v15 keeps fetches opaque.
        ApiKey::Fetch => return Some((i16::MIN, 15)),
        _ => return None,
    };
    Some((r.min, r.max))
}

fn decode<T: Decodable>(
    api: ApiKey,
    version: i16,
    frame: &Bytes,
) -> Result<(ResponseHeader, T), RewriteError> {
    let err = |e: anyhow::Error| RewriteError::Decode {
        api,
        version,
        reason: e.to_string(),
    };
    let mut buf = frame.clone();
    let header =
        ResponseHeader::decode(&mut buf, api.response_header_version(version)).map_err(err)?;
    let body = T::decode(&mut buf, version).map_err(err)?;
    Ok((header, body))
}

fn encode<T: Encodable>(
    api: ApiKey,
    version: i16,
    header: &ResponseHeader,
    body: &T,
) -> Result<BytesMut, RewriteError> {
    let err = |e: anyhow::Error| RewriteError::Encode {
        api,
        version,
        reason: e.to_string(),
    };
    let mut out = BytesMut::new();
    header
        .encode(&mut out, api.response_header_version(version))
        .map_err(err)?;
    body.encode(&mut out, version).map_err(err)?;
    Ok(out)
}

/// Replace one (node, host, port) triple, remembering the real address.
fn swap(
    adv: &Advertised,
    learnt: &mut Learnt,
    node: i32,
    host: &mut StrBytes,
    port: &mut i32,
) -> Result<(), RewriteError> {
    if node < 0 {
        return Ok(()); // "no node" (e.g. a coordinator lookup that failed)
    }
    learnt
        .brokers
        .push((node, host.as_str().to_string(), *port));
    *host = StrBytes::from_string(adv.host.clone());
    *port = i32::from(adv.port(node)?);
    Ok(())
}

/// Rewrite the addresses in a response frame (header + body, no size
/// prefix). `Produce` responses are handled by [`rewrite_produce`], which
/// the Produce filter shares.
pub fn rewrite(
    api: ApiKey,
    version: i16,
    frame: &Bytes,
    adv: &Advertised,
) -> Result<(BytesMut, Learnt), RewriteError> {
    let mut learnt = Learnt::default();
    let out = match api {
        ApiKey::Metadata => {
            let (header, mut body) = decode::<MetadataResponse>(api, version, frame)?;
            for b in &mut body.brokers {
                swap(adv, &mut learnt, b.node_id.0, &mut b.host, &mut b.port)?;
            }
            for t in &body.topics {
                if let Some(name) = &t.name {
                    if !t.topic_id.is_nil() {
                        learnt
                            .topics
                            .push((t.topic_id, name.0.as_str().to_string()));
                    }
                }
            }
            encode(api, version, &header, &body)?
        }
        ApiKey::FindCoordinator => {
            let (header, mut body) = decode::<FindCoordinatorResponse>(api, version, frame)?;
            if version <= 3 {
                swap(
                    adv,
                    &mut learnt,
                    body.node_id.0,
                    &mut body.host,
                    &mut body.port,
                )?;
            }
            for c in &mut body.coordinators {
                swap(adv, &mut learnt, c.node_id.0, &mut c.host, &mut c.port)?;
            }
            encode(api, version, &header, &body)?
        }
        ApiKey::DescribeCluster => {
            let (header, mut body) = decode::<DescribeClusterResponse>(api, version, frame)?;
            for b in &mut body.brokers {
                swap(adv, &mut learnt, b.broker_id.0, &mut b.host, &mut b.port)?;
            }
            encode(api, version, &header, &body)?
        }
        ApiKey::ShareFetch => {
            let (header, mut body) = decode::<ShareFetchResponse>(api, version, frame)?;
            for e in &mut body.node_endpoints {
                swap(adv, &mut learnt, e.node_id.0, &mut e.host, &mut e.port)?;
            }
            encode(api, version, &header, &body)?
        }
        ApiKey::ShareAcknowledge => {
            let (header, mut body) = decode::<ShareAcknowledgeResponse>(api, version, frame)?;
            for e in &mut body.node_endpoints {
                swap(adv, &mut learnt, e.node_id.0, &mut e.host, &mut e.port)?;
            }
            encode(api, version, &header, &body)?
        }
        _ => BytesMut::from(&frame[..]),
    };
    Ok((out, learnt))
}

/// Rewrite the leader endpoints of a decoded Produce response.
pub fn rewrite_produce(
    body: &mut ProduceResponse,
    adv: &Advertised,
    learnt: &mut Learnt,
) -> Result<(), RewriteError> {
    for e in &mut body.node_endpoints {
        swap(adv, learnt, e.node_id.0, &mut e.host, &mut e.port)?;
    }
    Ok(())
}

/// Clamp an ApiVersions response to the versions the proxy parses. A broker
/// that answers with an error (for instance UNSUPPORTED_VERSION, in the v0
/// layout) is passed through untouched.
pub fn clamp_api_versions(version: i16, frame: &Bytes) -> Result<BytesMut, RewriteError> {
    let api = ApiKey::ApiVersions;
    let Ok((header, mut body)) = decode::<ApiVersionsResponse>(api, version, frame) else {
        return Ok(BytesMut::from(&frame[..]));
    };
    if body.error_code != 0 {
        return Ok(BytesMut::from(&frame[..]));
    }
    body.api_keys.retain_mut(|entry| {
        let Ok(key) = ApiKey::try_from(entry.api_key) else {
            return true; // unknown to us: passed through byte for byte
        };
        match parseable_versions(key) {
            None => true,
            Some((min, max)) => {
                entry.min_version = entry.min_version.max(min);
                entry.max_version = entry.max_version.min(max);
                entry.min_version <= entry.max_version
            }
        }
    });
    encode(api, version, &header, &body)
}

/// The answer to an ApiVersions request newer than the proxy parses: what a
/// broker says in that case (UNSUPPORTED_VERSION, v0 layout, with the range
/// it supports), so the client retries with a version both understand.
pub fn unsupported_api_versions(correlation_id: i32) -> Result<BytesMut, RewriteError> {
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    let body = ApiVersionsResponse::default()
        .with_error_code(kafka_protocol::ResponseError::UnsupportedVersion.code())
        .with_api_keys(vec![ApiVersion::default()
            .with_api_key(ApiKey::ApiVersions as i16)
            .with_min_version(ApiVersionsResponse::VERSIONS.min)
            .with_max_version(ApiVersionsResponse::VERSIONS.max)]);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    encode(ApiKey::ApiVersions, 0, &header, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{BrokerId, TopicName};

    fn adv() -> Advertised {
        Advertised {
            host: "proxy.example".into(),
            port_base: 19000,
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
            let (header, decoded) =
                decode::<MetadataResponse>(ApiKey::Metadata, version, &out.freeze())
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
            let (_, d) =
                decode::<FindCoordinatorResponse>(ApiKey::FindCoordinator, version, &out.freeze())
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
    fn api_versions_are_clamped_to_what_the_proxy_parses() {
        let entry = |key: i16, min: i16, max: i16| {
            ApiVersion::default()
                .with_api_key(key)
                .with_min_version(min)
                .with_max_version(max)
        };
        let body = ApiVersionsResponse::default().with_api_keys(vec![
            entry(0, 0, 99),  // Produce: 4.x still advertises v0
            entry(1, 4, 18),  // Fetch
            entry(3, 0, 99),  // Metadata
            entry(9, 0, 9),   // OffsetFetch: not interpreted
            entry(999, 0, 3), // unknown key: untouched
        ]);
        let out = clamp_api_versions(3, &frame(ApiKey::ApiVersions, 3, &body)).expect("clamp");
        let (_, d) =
            decode::<ApiVersionsResponse>(ApiKey::ApiVersions, 3, &out.freeze()).expect("decode");
        let ranges: Vec<(i16, i16, i16)> = d
            .api_keys
            .iter()
            .map(|e| (e.api_key, e.min_version, e.max_version))
            .collect();
        assert_eq!(
            ranges,
            vec![
                (0, 3, 13),
                (1, 4, 15),
                (3, 0, MetadataResponse::VERSIONS.max),
                (9, 0, 9),
                (999, 0, 3)
            ]
        );
    }

    #[test]
    fn unsupported_api_versions_answer_uses_the_v0_layout() {
        let out = unsupported_api_versions(9).expect("encode").freeze();
        let (h, d) = decode::<ApiVersionsResponse>(ApiKey::ApiVersions, 0, &out).expect("decode");
        assert_eq!(h.correlation_id, 9);
        assert_eq!(d.error_code, 35);
        assert_eq!(d.api_keys[0].max_version, ApiVersionsResponse::VERSIONS.max);
    }
}
