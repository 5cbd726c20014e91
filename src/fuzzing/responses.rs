//! Every response rewrite (`addresses::WALKED_RESPONSES`: Metadata,
//! FindCoordinator, DescribeCluster, ApiVersions, Produce, Fetch, ShareFetch,
//! ShareAcknowledge, DescribeQuorum). Input: one byte picking the API, one
//! the version, then the response frame.
//! Invariants: no panic; a rewritten frame walks again and needs no change;
//! the hand-written Produce response walk reports what the schema walk does.

use crate::filter::addresses::{self, Advertised};
use crate::wire::header::response_body_offset;
use crate::wire::produce_response_walk::{self, Walked};
use kafka_protocol::messages::ApiKey;

/// One input of the `responses` fuzz target.
pub fn responses(data: &[u8]) {
    let [pick, version, frame @ ..] = data else {
        return;
    };
    let apis = addresses::WALKED_RESPONSES;
    let api = apis[usize::from(*pick) % apis.len()];
    let version = i16::from(*version % 20);
    let adv = Advertised {
        host: "proxy.example".into(),
        port_base: 20000,
        sni: None,
    };
    if api == ApiKey::ApiVersions {
        if let Ok(Some(out)) = addresses::clamp_api_versions(version, frame) {
            let again = addresses::clamp_api_versions(version, &out).expect("walks again");
            assert!(again.is_none(), "clamping is idempotent");
        }
        return;
    }
    if api == ApiKey::Produce {
        let header_version = ApiKey::Produce.response_header_version(version);
        if let Some(start) = response_body_offset(frame, header_version) {
            let (ours, walked) = produce_response_walk::events(version, frame, start);
            let (theirs, schema) = produce_response_walk::schema_events(version, frame, start);
            assert_eq!(ours, theirs, "the two Produce response walks disagree");
            match walked {
                Ok(Walked::Whole) => assert_eq!(schema, Ok(())),
                Err(e) => assert_eq!(schema, Err(e)),
                Ok(Walked::NamesBrokers) => {}
            }
        }
    }
    if let Ok((Some(out), _)) = addresses::rewrite(api, version, frame, &adv) {
        let (again, _) = addresses::rewrite(api, version, &out, &adv).expect("walks again");
        assert!(
            again.is_none(),
            "a rewritten response names only proxy addresses"
        );
    }
}
