//! Walk tests: messages encoded by `kafka-protocol` at every version both
//! know are walked and re-emitted byte for byte; forged counts, lengths and
//! truncations are errors, never allocations or panics.

use super::*;
use crate::wire::schema::message;
use bytes::BytesMut;
use kafka_protocol::messages::{
    ApiVersionsResponse, DescribeClusterResponse, DescribeQuorumResponse, FetchResponse,
    FindCoordinatorResponse, MetadataResponse, ProduceRequest, ProduceResponse,
    ShareAcknowledgeResponse, ShareFetchResponse,
};
use kafka_protocol::protocol::{Encodable, Message as _};
use proptest::prelude::*;

fn encoded<T: Encodable>(body: &T, version: i16) -> Vec<u8> {
    let mut out = BytesMut::new();
    body.encode(&mut out, version).expect("encode");
    out.to_vec()
}

/// Every version both the schema and `kafka-protocol` know.
fn shared_versions(name: &str, theirs: (i16, i16)) -> std::ops::RangeInclusive<i16> {
    let m = message(name).expect("schema");
    m.valid.min.max(theirs.0)..=m.valid.max.min(theirs.1)
}

macro_rules! identity {
    ($name:literal, $ty:ty) => {{
        let v = <$ty>::VERSIONS;
        for version in shared_versions($name, (v.min, v.max)) {
            let bytes = encoded(&<$ty>::default(), version);
            let m = message($name).expect("schema");
            validate(m, version, &bytes, 0).unwrap_or_else(|e| panic!("{} v{version}: {e}", $name));
            let out = rewrite(m, version, &bytes, 0, &mut Validate).expect("rewrite");
            assert_eq!(out, bytes, "{} v{version} re-emitted differently", $name);
        }
    }};
}

#[test]
fn every_message_walks_and_re_emits_identically_at_every_shared_version() {
    identity!("ProduceRequest", ProduceRequest);
    identity!("ProduceResponse", ProduceResponse);
    identity!("FetchResponse", FetchResponse);
    identity!("MetadataResponse", MetadataResponse);
    identity!("FindCoordinatorResponse", FindCoordinatorResponse);
    identity!("DescribeClusterResponse", DescribeClusterResponse);
    identity!("ApiVersionsResponse", ApiVersionsResponse);
    identity!("ShareFetchResponse", ShareFetchResponse);
    identity!("ShareAcknowledgeResponse", ShareAcknowledgeResponse);
    identity!("DescribeQuorumResponse", DescribeQuorumResponse);
}

/// Produce v8 body: null transactional id, acks -1, timeout, and a topic
/// array of one topic "t" with one partition and 3 record bytes.
fn produce_v8() -> Vec<u8> {
    let mut b = vec![0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x75, 0x30];
    b.extend_from_slice(&[0, 0, 0, 1, 0, 1, b't', 0, 0, 0, 1, 0, 0, 0, 0]);
    b.extend_from_slice(&[0, 0, 0, 3, 1, 2, 3]);
    b
}

#[test]
fn a_hand_built_produce_body_reports_its_records() {
    struct Spans(Vec<Range<usize>>);
    impl Visitor for Spans {
        fn value(&mut self, f: &Field, v: Value<'_>) -> Edit {
            if let (Type::Records, Value::Bytes(Some(r))) = (&f.ty, v) {
                self.0.push(r);
            }
            Edit::Keep
        }
    }
    let body = produce_v8();
    let mut spans = Spans(Vec::new());
    walk(
        message("ProduceRequest").expect("schema"),
        8,
        &body,
        0,
        &mut spans,
    )
    .expect("walk");
    assert_eq!(spans.0, vec![body.len() - 3..body.len()]);
}

#[test]
fn forged_counts_are_refused_before_anything_is_reserved() {
    let m = message("ProduceRequest").expect("schema");
    // The first input: the topic count with one bit flipped.
    let mut b = produce_v8();
    b[8] = 0x10;
    assert!(matches!(
        validate(m, 8, &b, 0),
        Err(WalkError::Count {
            count: 0x1000_0001,
            ..
        })
    ));
    // v9: a compact topic array whose length is the varint 80 80 80 80 08.
    let b = [
        0, 0xFF, 0xFF, 0, 0, 0x75, 0x30, 0x80, 0x80, 0x80, 0x80, 0x08,
    ];
    assert!(validate(m, 9, &b, 0).is_err());
    // v3 with bytes deleted, so the topic count runs into the name.
    let mut b = produce_v8();
    b.drain(9..11);
    assert!(validate(m, 3, &b, 0).is_err());
    // A record set longer than the frame.
    let mut b = produce_v8();
    let n = b.len();
    b[n - 4] = 0x7F;
    assert!(matches!(
        validate(m, 8, &b, 0),
        Err(WalkError::Short { .. })
    ));
}

#[test]
fn varints_longer_than_five_bytes_or_over_32_bits_are_malformed() {
    let m = message("ProduceRequest").expect("schema");
    let b = [0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
    assert!(matches!(
        validate(m, 9, &b, 0),
        Err(WalkError::Varint { .. })
    ));
    let b = [0xFF, 0xFF, 0xFF, 0xFF, 0x1F];
    assert!(matches!(
        validate(m, 9, &b, 0),
        Err(WalkError::Varint { .. })
    ));
}

#[test]
fn trailing_bytes_and_unknown_versions_are_errors() {
    let m = message("ProduceRequest").expect("schema");
    let mut b = produce_v8();
    b.push(0);
    assert!(matches!(
        validate(m, 8, &b, 0),
        Err(WalkError::Trailing { count: 1, .. })
    ));
    assert!(matches!(
        validate(m, 2, &produce_v8(), 0),
        Err(WalkError::Version { .. })
    ));
}

#[test]
fn every_truncation_is_an_error() {
    let m = message("ProduceRequest").expect("schema");
    let b = produce_v8();
    for cut in 0..b.len() {
        assert!(validate(m, 8, &b[..cut], 0).is_err(), "cut at {cut}");
    }
}

#[test]
fn dropped_elements_fix_the_count_flexible_or_not() {
    struct DropOdd(i64);
    impl Visitor for DropOdd {
        fn value(&mut self, f: &Field, v: Value<'_>) -> Edit {
            if let ("ApiKeys.ApiKey", Value::Int(k)) = (f.path.as_str(), v) {
                self.0 = k;
            }
            Edit::Keep
        }
        fn leave(&mut self, f: &Field) -> bool {
            f.path != "ApiKeys" || self.0 % 2 == 0
        }
    }
    use kafka_protocol::messages::api_versions_response::ApiVersion;
    use kafka_protocol::protocol::Decodable;
    // 200 entries: the compact count shrinks from two varint bytes to one.
    let body = ApiVersionsResponse::default().with_api_keys(
        (0..200)
            .map(|k| ApiVersion::default().with_api_key(k).with_max_version(1))
            .collect(),
    );
    for version in [0, 3] {
        let bytes = encoded(&body, version);
        let m = message("ApiVersionsResponse").expect("schema");
        let out = rewrite(m, version, &bytes, 0, &mut DropOdd(0)).expect("rewrite");
        let d = ApiVersionsResponse::decode(&mut bytes::Bytes::from(out), version).expect("decode");
        assert_eq!(d.api_keys.len(), 100, "v{version}");
        assert!(d.api_keys.iter().all(|k| k.api_key % 2 == 0));
    }
}

proptest! {
    /// Arbitrary edits of a valid body never panic, and a body that still
    /// walks re-emits byte for byte.
    #[test]
    fn mutated_bodies_never_panic(
        edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..6),
        version in 3i16..=13,
    ) {
        let m = message("ProduceRequest").expect("schema");
        let mut b = encoded(
            &ProduceRequest::default().with_topic_data(vec![Default::default()]),
            version,
        );
        for (at, byte) in edits {
            let i = at % b.len();
            b[i] = byte;
        }
        if validate(m, version, &b, 0).is_ok() {
            let out = rewrite(m, version, &b, 0, &mut Validate).expect("rewrite");
            prop_assert_eq!(out, b);
        }
    }
}
