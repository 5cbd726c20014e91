//! Every response the proxy's own client reads (`client::protocol`): walked,
//! decoded, then interpreted. Input: one byte picking the API, one the
//! version, then the response frame (correlation id first). The pick order
//! matches the `responses` target for Metadata, ApiVersions, Produce and
//! Fetch, so its seeds serve here too.
//! Invariants: no panic, no abort, bounded memory (the decoder reserves from
//! counts only after the walk checked them).

use crate::client::metadata::ClusterInfo;
use crate::client::protocol::{self as p, ApiVersionsAnswer, PartitionRef};
use bytes::Bytes;
use kafka_protocol::messages::{
    CreateTopicsRequest, DescribeConfigsRequest, FetchRequest, ListOffsetsRequest, MetadataRequest,
    ProduceRequest, SaslAuthenticateRequest, SaslHandshakeRequest,
};

/// One input of the `client_responses` fuzz target.
pub fn client_responses(data: &[u8]) {
    let [pick, version, frame @ ..] = data else {
        return;
    };
    let Some(correlation_id) = frame.first_chunk::<4>().map(|c| i32::from_be_bytes(*c)) else {
        return;
    };
    let version = i16::from(*version % 20);
    let frame = Bytes::copy_from_slice(frame);
    let at = PartitionRef {
        topic: "t",
        topic_id: Default::default(),
        partition: 0,
        leader_epoch: -1,
    };
    let b = "fuzz";
    match pick % 9 {
        0 => {
            if let Ok(r) = p::decode_response::<MetadataRequest>(&frame, version, correlation_id, b)
            {
                let _ = ClusterInfo::from_response(&r);
            }
        }
        1 => {
            if let Ok(r) =
                p::decode_response::<CreateTopicsRequest>(&frame, version, correlation_id, b)
            {
                let _ = p::create_topics_result(&r, "t");
            }
        }
        2 => {
            if let Ok(r) =
                p::decode_response::<DescribeConfigsRequest>(&frame, version, correlation_id, b)
            {
                let _ = p::describe_topic_config_result(&r, "t");
            }
        }
        3 => {
            if let Ok(ApiVersionsAnswer::Table(t)) =
                p::api_versions_answer(&frame, version, correlation_id, b)
            {
                let _ = t.pick::<ProduceRequest>(b);
            }
        }
        4 => {
            if let Ok(r) = p::decode_response::<ProduceRequest>(&frame, version, correlation_id, b)
            {
                let _ = p::produce_result(&r, version, &at);
            }
        }
        5 => {
            if let Ok(r) = p::decode_response::<FetchRequest>(&frame, version, correlation_id, b) {
                let _ = p::fetch_result(&r, version, &at);
            }
        }
        6 => {
            if let Ok(r) =
                p::decode_response::<ListOffsetsRequest>(&frame, version, correlation_id, b)
            {
                let _ = p::list_offsets_result(&r, &at);
            }
        }
        7 => {
            let _ =
                p::decode_response::<SaslAuthenticateRequest>(&frame, version, correlation_id, b);
        }
        _ => {
            let _ = p::decode_response::<SaslHandshakeRequest>(&frame, version, correlation_id, b);
        }
    }
}
