//! Every response rewrite (`addresses::WALKED_RESPONSES`: Metadata,
//! FindCoordinator, DescribeCluster, ApiVersions, Produce, Fetch, ShareFetch,
//! ShareAcknowledge, DescribeQuorum). Input: one byte picking the API, one
//! the version, then the response frame.
//! Invariants: no panic; a rewritten frame walks again and needs no change.
#![no_main]

use kafka_mirror_proxy::proxy::addresses::{self, Advertised};
use kafka_protocol::messages::ApiKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [pick, version, frame @ ..] = data else {
        return;
    };
    let apis = addresses::WALKED_RESPONSES;
    let api = apis[usize::from(*pick) % apis.len()];
    let version = i16::from(*version % 20);
    let adv = Advertised {
        host: "proxy.example".into(),
        port_base: 20000,
    };
    if api == ApiKey::ApiVersions {
        if let Ok(Some(out)) = addresses::clamp_api_versions(version, frame) {
            let again = addresses::clamp_api_versions(version, &out).expect("walks again");
            assert!(again.is_none(), "clamping is idempotent");
        }
        return;
    }
    if let Ok((Some(out), _)) = addresses::rewrite(api, version, frame, &adv) {
        let (again, _) = addresses::rewrite(api, version, &out, &adv).expect("walks again");
        assert!(
            again.is_none(),
            "a rewritten response names only proxy addresses"
        );
    }
});
