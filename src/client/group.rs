//! Classic group membership requests (FindCoordinator, JoinGroup,
//! SyncGroup, Heartbeat, LeaveGroup, DescribeGroups): one builder and one
//! interpreter each, as in `client::protocol`. Used by `control::members`,
//! where every proxy instance is a member of one group kept by Kafka's group
//! coordinator.
//!
//! Pure: messages in, messages and results out; `Client` sends them.
//!
//! The group is a *consumer* group (protocol type `consumer`) so that
//! Kafka's own tools describe it (`kafka-consumer-groups.sh --describe
//! --members`; Kafka's admin client refuses to describe groups of any other
//! protocol type). Its protocol metadata is therefore a valid
//! `ConsumerProtocolSubscription` (v0: the state topic, the instance id as
//! user data). A member's instance id is read back from its *client id*
//! (`kafka-mirror-proxy/<instance id>`), which DescribeGroups reports in
//! every group state, whereas member metadata is only reported while the
//! group is Stable. Static membership (`group.instance.id`) is not used: it
//! would keep a member through restarts and change how liveness is judged.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ConsumerProtocolSubscription, DescribeGroupsRequest, DescribeGroupsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatRequest, HeartbeatResponse,
    JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::error::ClientError;
use super::protocol::Rpc;

// Lowest versions: what Kafka 4 brokers still accept and what the fields
// used here need (JoinGroup v4: MEMBER_ID_REQUIRED; LeaveGroup v3: the
// members batch; FindCoordinator v1: the key type).
impl Rpc for FindCoordinatorRequest {
    const NAME: &'static str = "FindCoordinator";
    const RESPONSE_SCHEMA: &'static str = "FindCoordinatorResponse";
    const MIN: i16 = 1;
}
impl Rpc for JoinGroupRequest {
    const NAME: &'static str = "JoinGroup";
    const RESPONSE_SCHEMA: &'static str = "JoinGroupResponse";
    const MIN: i16 = 4;
}
impl Rpc for SyncGroupRequest {
    const NAME: &'static str = "SyncGroup";
    const RESPONSE_SCHEMA: &'static str = "SyncGroupResponse";
    const MIN: i16 = 3;
}
impl Rpc for HeartbeatRequest {
    const NAME: &'static str = "Heartbeat";
    const RESPONSE_SCHEMA: &'static str = "HeartbeatResponse";
    const MIN: i16 = 3;
}
impl Rpc for LeaveGroupRequest {
    const NAME: &'static str = "LeaveGroup";
    const RESPONSE_SCHEMA: &'static str = "LeaveGroupResponse";
    const MIN: i16 = 3;
}
impl Rpc for ListGroupsRequest {
    const NAME: &'static str = "ListGroups";
    const RESPONSE_SCHEMA: &'static str = "ListGroupsResponse";
    const MIN: i16 = 0;
}
impl Rpc for DescribeGroupsRequest {
    const NAME: &'static str = "DescribeGroups";
    const RESPONSE_SCHEMA: &'static str = "DescribeGroupsResponse";
    const MIN: i16 = 1;
}

/// The group's protocol type: Kafka's consumer protocol.
pub(crate) const PROTOCOL_TYPE: &str = "consumer";
/// The one protocol (for consumers: the assignor) every instance offers.
pub(crate) const PROTOCOL_NAME: &str = "kafka-mirror-proxy-instances";
/// Client ids of membership connections: this prefix, then the instance id.
pub(crate) const MEMBER_CLIENT_ID_PREFIX: &str = "kafka-mirror-proxy/";

/// Kafka error codes the membership loop acts on.
pub(crate) mod codes {
    pub(crate) const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub(crate) const NOT_COORDINATOR: i16 = 16;
    pub(crate) const ILLEGAL_GENERATION: i16 = 22;
    pub(crate) const UNKNOWN_MEMBER_ID: i16 = 25;
    pub(crate) const REBALANCE_IN_PROGRESS: i16 = 27;
    pub(crate) const MEMBER_ID_REQUIRED: i16 = 79;
}

/// Whether `e`, answering a SyncGroup or a Heartbeat, means the group has
/// moved on (a rebalance, a new generation): join again now, without a
/// backoff.
pub(crate) fn group_moved_on(e: &ClientError) -> bool {
    matches!(
        e.code(),
        Some(codes::REBALANCE_IN_PROGRESS | codes::ILLEGAL_GENERATION)
    )
}

/// The client id of an instance's membership connection.
pub(crate) fn member_client_id(instance_id: &str) -> String {
    format!("{MEMBER_CLIENT_ID_PREFIX}{instance_id}")
}

/// The instance id in a member's client id; `None` for members that are
/// not proxy instances.
pub(crate) fn instance_of_client_id(client_id: &str) -> Option<&str> {
    client_id
        .strip_prefix(MEMBER_CLIENT_ID_PREFIX)
        .filter(|id| !id.is_empty())
}

/// The member metadata: `ConsumerProtocolSubscription` v0 with its version
/// prefix, subscribed to `topic`, the instance id as user data.
pub(crate) fn subscription_metadata(topic: &str, instance_id: &str) -> Result<Bytes, ClientError> {
    let subscription = ConsumerProtocolSubscription::default()
        .with_topics(vec![StrBytes::from_string(topic.to_string())])
        .with_user_data(Some(Bytes::copy_from_slice(instance_id.as_bytes())));
    let mut out = BytesMut::new();
    out.put_i16(0);
    subscription
        .encode(&mut out, 0)
        .map_err(|e| ClientError::Encode {
            api: "ConsumerProtocolSubscription",
            version: 0,
            cause: e.into(),
        })?;
    Ok(out.freeze())
}

fn group_id(group: &str) -> GroupId {
    GroupId(StrBytes::from_string(group.to_string()))
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn kafka_error(context: String, code: i16, message: Option<&StrBytes>) -> ClientError {
    ClientError::Kafka {
        context,
        code,
        message: message.map(|m| m.as_str().to_string()),
    }
}

/// FindCoordinator for a group (key type 0), in the layout of `version`
/// (v4 and later batch the keys).
pub(crate) fn find_coordinator_request(version: i16, group: &str) -> FindCoordinatorRequest {
    let r = FindCoordinatorRequest::default().with_key_type(0);
    if version >= 4 {
        r.with_coordinator_keys(vec![s(group)])
    } else {
        r.with_key(s(group))
    }
}

/// The coordinator's `host:port`.
pub(crate) fn find_coordinator_result(
    r: &FindCoordinatorResponse,
    version: i16,
    group: &str,
) -> Result<String, ClientError> {
    let context = || format!("coordinator of group {group}");
    let (code, message, host, port) = if version >= 4 {
        let c = r
            .coordinators
            .iter()
            .find(|c| c.key.as_str() == group)
            .ok_or_else(|| kafka_error(context(), -1, None))?;
        (c.error_code, c.error_message.as_ref(), &c.host, c.port)
    } else {
        (r.error_code, r.error_message.as_ref(), &r.host, r.port)
    };
    if code != 0 {
        return Err(kafka_error(context(), code, message));
    }
    Ok(format!("{}:{}", host.as_str(), port))
}

/// What a member asks to join with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct JoinSpec {
    pub group: String,
    /// The one protocol offered (for consumers: the assignor's name).
    pub protocol: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    /// [`subscription_metadata`].
    pub metadata: Bytes,
}

pub(crate) fn join_group_request(spec: &JoinSpec, member_id: &str) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(group_id(&spec.group))
        .with_session_timeout_ms(spec.session_timeout_ms)
        .with_rebalance_timeout_ms(spec.rebalance_timeout_ms)
        .with_member_id(s(member_id))
        .with_protocol_type(s(PROTOCOL_TYPE))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s(&spec.protocol))
            .with_metadata(spec.metadata.clone())])
}

/// How a JoinGroup ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JoinOutcome {
    /// A member of generation `generation`.
    Joined {
        generation: i32,
        member_id: String,
        leader: bool,
        /// The leader's view: every member's id and metadata (empty for
        /// the others).
        members: Vec<(String, Bytes)>,
    },
    /// First contact (JoinGroup v4+): join again with this member id.
    MemberIdRequired(String),
}

pub(crate) fn join_group_result(
    r: &JoinGroupResponse,
    group: &str,
) -> Result<JoinOutcome, ClientError> {
    match r.error_code {
        0 => Ok(JoinOutcome::Joined {
            generation: r.generation_id,
            member_id: r.member_id.as_str().to_string(),
            leader: r.leader.as_str() == r.member_id.as_str(),
            members: r
                .members
                .iter()
                .map(|m| (m.member_id.as_str().to_string(), m.metadata.clone()))
                .collect(),
        }),
        codes::MEMBER_ID_REQUIRED if !r.member_id.is_empty() => Ok(JoinOutcome::MemberIdRequired(
            r.member_id.as_str().to_string(),
        )),
        code => Err(kafka_error(format!("join group {group}"), code, None)),
    }
}

/// SyncGroup: the leader hands out `assignments` (member id, bytes); the
/// others send none. With none at all every member gets an empty
/// assignment (the coordinator fills in those the leader leaves out):
/// membership is all the proxy wants from its group.
pub(crate) fn sync_group_request(
    group: &str,
    generation: i32,
    member_id: &str,
    protocol: &str,
    assignments: &[(String, Bytes)],
) -> SyncGroupRequest {
    SyncGroupRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id(generation)
        .with_member_id(s(member_id))
        .with_protocol_type(Some(s(PROTOCOL_TYPE)))
        .with_protocol_name(Some(s(protocol)))
        .with_assignments(
            assignments
                .iter()
                .map(|(member, bytes)| {
                    SyncGroupRequestAssignment::default()
                        .with_member_id(s(member))
                        .with_assignment(bytes.clone())
                })
                .collect(),
        )
}

/// This member's assignment.
pub(crate) fn sync_group_result(r: &SyncGroupResponse, group: &str) -> Result<Bytes, ClientError> {
    match r.error_code {
        0 => Ok(r.assignment.clone()),
        code => Err(kafka_error(format!("sync group {group}"), code, None)),
    }
}

pub(crate) fn heartbeat_request(group: &str, generation: i32, member_id: &str) -> HeartbeatRequest {
    HeartbeatRequest::default()
        .with_group_id(group_id(group))
        .with_generation_id(generation)
        .with_member_id(s(member_id))
}

pub(crate) fn heartbeat_result(r: &HeartbeatResponse, group: &str) -> Result<(), ClientError> {
    match r.error_code {
        0 => Ok(()),
        code => Err(kafka_error(
            format!("heartbeat in group {group}"),
            code,
            None,
        )),
    }
}

pub(crate) fn leave_group_request(group: &str, member_id: &str) -> LeaveGroupRequest {
    LeaveGroupRequest::default()
        .with_group_id(group_id(group))
        .with_members(vec![MemberIdentity::default()
            .with_member_id(s(member_id))
            .with_reason(Some(s("proxy instance shutting down")))])
}

/// Left, or already gone (UNKNOWN_MEMBER_ID: the session had expired).
pub(crate) fn leave_group_result(
    r: &LeaveGroupResponse,
    group: &str,
    member_id: &str,
) -> Result<(), ClientError> {
    let context = || format!("leave group {group}");
    if r.error_code != 0 {
        return Err(kafka_error(context(), r.error_code, None));
    }
    match r
        .members
        .iter()
        .find(|m| m.member_id.as_str() == member_id)
        .map(|m| m.error_code)
    {
        None | Some(0) | Some(codes::UNKNOWN_MEMBER_ID) => Ok(()),
        Some(code) => Err(kafka_error(context(), code, None)),
    }
}

/// The groups one broker coordinates (every state, every type).
pub(crate) fn list_groups_result(r: &ListGroupsResponse) -> Result<Vec<String>, ClientError> {
    if r.error_code != 0 {
        return Err(kafka_error("list groups".to_string(), r.error_code, None));
    }
    Ok(r.groups
        .iter()
        .map(|g| g.group_id.0.as_str().to_string())
        .collect())
}

pub(crate) fn describe_groups_request(group: &str) -> DescribeGroupsRequest {
    DescribeGroupsRequest::default().with_groups(vec![group_id(group)])
}

/// One member as the coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupMember {
    pub member_id: String,
    pub client_id: String,
    pub client_host: String,
}

/// A group as the coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    /// `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Empty`, `Dead`.
    pub state: String,
    pub protocol_type: String,
    pub members: Vec<GroupMember>,
}

impl GroupDescription {
    /// Instance ids of the members that are proxy instances, sorted, once each.
    pub fn instances(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .members
            .iter()
            .filter_map(|m| instance_of_client_id(&m.client_id))
            .map(str::to_string)
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

pub(crate) fn describe_groups_result(
    r: &DescribeGroupsResponse,
    group: &str,
) -> Result<GroupDescription, ClientError> {
    let g = r
        .groups
        .iter()
        .find(|g| g.group_id.0.as_str() == group)
        .ok_or_else(|| {
            kafka_error(
                format!("DescribeGroups response does not mention {group}"),
                -1,
                None,
            )
        })?;
    if g.error_code != 0 {
        return Err(kafka_error(
            format!("describe group {group}"),
            g.error_code,
            g.error_message.as_ref(),
        ));
    }
    Ok(GroupDescription {
        state: g.group_state.as_str().to_string(),
        protocol_type: g.protocol_type.as_str().to_string(),
        members: g
            .members
            .iter()
            .map(|m| GroupMember {
                member_id: m.member_id.as_str().to_string(),
                client_id: m.client_id.as_str().to_string(),
                client_host: m.client_host.as_str().to_string(),
            })
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::protocol::{decode_response, encode_request};
    use kafka_protocol::messages::describe_groups_response::{
        DescribedGroup, DescribedGroupMember,
    };
    use kafka_protocol::messages::find_coordinator_response::Coordinator;
    use kafka_protocol::messages::leave_group_response::MemberResponse;
    use kafka_protocol::messages::{ApiKey, ResponseHeader};

    fn response_frame<T: Encodable>(
        api: ApiKey,
        version: i16,
        correlation_id: i32,
        body: &T,
    ) -> Bytes {
        let mut out = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut out, api.response_header_version(version))
            .expect("header");
        body.encode(&mut out, version).expect("body");
        out.freeze()
    }

    #[test]
    fn subscription_metadata_is_consumer_protocol_v0() {
        let bytes = subscription_metadata("st", "i1").expect("encodes");
        assert_eq!(
            bytes.as_ref(),
            [
                0, 0, // version 0
                0, 0, 0, 1, // one topic
                0, 2, b's', b't', // "st"
                0, 0, 0, 2, b'i', b'1', // user data "i1"
            ]
        );
    }

    #[test]
    fn client_ids_carry_the_instance_id() {
        assert_eq!(member_client_id("abc"), "kafka-mirror-proxy/abc");
        assert_eq!(instance_of_client_id("kafka-mirror-proxy/abc"), Some("abc"));
        assert_eq!(instance_of_client_id("kafka-mirror-proxy/"), None);
        assert_eq!(instance_of_client_id("console-consumer"), None);
        assert_eq!(instance_of_client_id("kafka-mirror-proxy-state"), None);
    }

    #[test]
    fn heartbeat_request_bytes() {
        // Heartbeat v3 (not flexible): group, generation, member, instance id.
        let frame = encode_request(&heartbeat_request("g", 7, "m"), 3, 9, "c").expect("encode");
        assert_eq!(
            frame.as_ref(),
            [
                0, 12, 0, 3, 0, 0, 0, 9, 0, 1, b'c', // header v1
                0, 1, b'g', // group
                0, 0, 0, 7, // generation
                0, 1, b'm', // member id
                0xff, 0xff, // no group instance id
            ]
        );
    }

    #[test]
    fn leave_group_request_bytes() {
        let mut r = leave_group_request("g", "m");
        r.members[0].reason = None;
        // LeaveGroup v3 (not flexible): group, [member id, instance id].
        let frame = encode_request(&r, 3, 1, "c").expect("encode");
        assert_eq!(
            frame.as_ref(),
            [
                0, 13, 0, 3, 0, 0, 0, 1, 0, 1, b'c', // header v1
                0, 1, b'g', // group
                0, 0, 0, 1, // one member
                0, 1, b'm', 0xff, 0xff, // member id, no instance id
            ]
        );
    }

    #[test]
    fn join_request_offers_the_consumer_protocol() {
        let spec = JoinSpec {
            group: "st.instances".into(),
            protocol: PROTOCOL_NAME.into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 10_000,
            metadata: subscription_metadata("st", "i1").expect("encodes"),
        };
        let r = join_group_request(&spec, "");
        assert_eq!(r.protocol_type.as_str(), "consumer");
        assert_eq!(r.protocols.len(), 1);
        assert_eq!(r.protocols[0].name.as_str(), PROTOCOL_NAME);
        assert_eq!(r.protocols[0].metadata, spec.metadata);
        assert_eq!(r.session_timeout_ms, 10_000);
        assert!(r.group_instance_id.is_none(), "no static membership");
    }

    #[test]
    fn join_results() {
        let first = JoinGroupResponse::default()
            .with_error_code(79)
            .with_member_id(s("m-1"));
        assert_eq!(
            join_group_result(&first, "g").expect("ok"),
            JoinOutcome::MemberIdRequired("m-1".into())
        );
        let joined = JoinGroupResponse::default()
            .with_generation_id(3)
            .with_member_id(s("m-1"))
            .with_leader(s("m-1"));
        assert_eq!(
            join_group_result(&joined, "g").expect("ok"),
            JoinOutcome::Joined {
                generation: 3,
                member_id: "m-1".into(),
                leader: true,
                members: vec![],
            }
        );
        let rebalancing = JoinGroupResponse::default().with_error_code(27);
        assert_eq!(
            join_group_result(&rebalancing, "g").map_err(|e| e.code()),
            Err(Some(27))
        );
    }

    #[test]
    fn coordinator_from_old_and_batched_responses() {
        assert_eq!(find_coordinator_request(3, "g").key.as_str(), "g");
        assert_eq!(
            find_coordinator_request(4, "g").coordinator_keys,
            vec![s("g")]
        );
        let v3 = FindCoordinatorResponse::default()
            .with_host(s("b1"))
            .with_port(9092);
        assert_eq!(find_coordinator_result(&v3, 3, "g").expect("ok"), "b1:9092");
        let v4 = FindCoordinatorResponse::default().with_coordinators(vec![Coordinator::default()
            .with_key(s("g"))
            .with_error_code(15)]);
        assert_eq!(
            find_coordinator_result(&v4, 4, "g").map_err(|e| e.code()),
            Err(Some(15))
        );
    }

    #[test]
    fn the_leader_hands_out_assignments_and_each_member_reads_its_own() {
        let r = sync_group_request(
            "g",
            4,
            "m-1",
            "slots",
            &[
                ("m-1".to_string(), Bytes::from_static(b"a")),
                ("m-2".to_string(), Bytes::from_static(b"b")),
            ],
        );
        assert_eq!(r.protocol_name.as_ref().map(|p| p.as_str()), Some("slots"));
        let given: Vec<(&str, &[u8])> = r
            .assignments
            .iter()
            .map(|a| (a.member_id.as_str(), a.assignment.as_ref()))
            .collect();
        assert_eq!(given, [("m-1", &b"a"[..]), ("m-2", &b"b"[..])]);
        assert!(sync_group_request("g", 4, "m-2", "slots", &[])
            .assignments
            .is_empty());
        let mine = SyncGroupResponse::default().with_assignment(Bytes::from_static(b"b"));
        assert_eq!(sync_group_result(&mine, "g").expect("ok").as_ref(), b"b");
        let late = SyncGroupResponse::default().with_error_code(27);
        assert_eq!(
            sync_group_result(&late, "g").map_err(|e| e.code()),
            Err(Some(27))
        );
    }

    #[test]
    fn leave_tolerates_an_expired_member() {
        let gone = LeaveGroupResponse::default().with_members(vec![MemberResponse::default()
            .with_member_id(s("m"))
            .with_error_code(25)]);
        assert!(leave_group_result(&gone, "g", "m").is_ok());
        let refused = LeaveGroupResponse::default().with_error_code(16);
        assert_eq!(
            leave_group_result(&refused, "g", "m").map_err(|e| e.code()),
            Err(Some(16))
        );
    }

    #[test]
    fn described_members_walked_decoded_and_named() {
        let body = DescribeGroupsResponse::default().with_groups(vec![DescribedGroup::default()
            .with_group_id(group_id("g"))
            .with_group_state(s("PreparingRebalance"))
            .with_protocol_type(s("consumer"))
            .with_members(vec![
                DescribedGroupMember::default()
                    .with_member_id(s("m2"))
                    .with_client_id(s("kafka-mirror-proxy/b")),
                DescribedGroupMember::default()
                    .with_member_id(s("m1"))
                    .with_client_id(s("kafka-mirror-proxy/a")),
                DescribedGroupMember::default()
                    .with_member_id(s("m3"))
                    .with_client_id(s("someone-else")),
            ])]);
        for version in [1, 5] {
            let frame = response_frame(ApiKey::DescribeGroups, version, 4, &body);
            let r = decode_response::<DescribeGroupsRequest>(&frame, version, 4, "b")
                .expect("walks and decodes");
            let d = describe_groups_result(&r, "g").expect("described");
            assert_eq!(d.instances(), ["a", "b"]);
            assert_eq!(d.state, "PreparingRebalance");
            assert_eq!(d.members.len(), 3);
        }
        // Truncated: refused by the schema walk before decoding.
        let frame = response_frame(ApiKey::DescribeGroups, 5, 4, &body);
        let cut = frame.slice(..frame.len() - 3);
        assert!(decode_response::<DescribeGroupsRequest>(&cut, 5, 4, "b").is_err());
        let missing = DescribeGroupsResponse::default();
        assert!(describe_groups_result(&missing, "g").is_err());
    }
}
