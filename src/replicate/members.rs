//! Several instances of one link share its partitions through a consumer
//! group on the source cluster, `<GROUP_ID>.instances`, kept by Kafka's
//! group coordinator (the classic protocol, as the proxy's instances use
//! for `__mirror_state`): Kafka says who is alive and when the set
//! changed, the replicator keeps no liveness of its own.
//!
//! The leader of each generation gives every member a *slot*, its index
//! among the members sorted by id, and the count; a slot owns the
//! partitions `Slot::owns` gives it, the same answer on every instance
//! without any of them listing partitions, so a topic found later by one
//! instance's discovery is owned by exactly one of them too. Only slot 0
//! creates, grows and reconfigures destination topics.
//!
//! Rebalances are eager, as Kafka's consumer's were: when the coordinator
//! says the group changes (a member joined, left, or stopped
//! heartbeating), every member gives its partitions back before it joins
//! again: it fetches and sends nothing new, lets what is in flight be
//! answered (bounded by the request timeout), commits every resume point,
//! and forgets them. The coordinator completes the rebalance only once
//! every member joined again (or the rebalance timeout dropped it), so no
//! partition has two owners sending at once. The commit that gives a
//! partition back cleanly carries `RELEASED` as its metadata: the next
//! owner starts at once. A partition whose last owner died (or could not
//! finish) has no such mark: its next owner waits `UNKNOWN_OUTCOME_WAIT_MS`
//! first, so that a request the dead one left at a proxy instance lands
//! before its retry, which the proxy then answers as a duplicate.
//!
//! Kafka's tools show the group (`kafka-consumer-groups.sh --describe
//! --members --group <GROUP_ID>.instances` against the source): members'
//! client ids are the link's, their assignments list no partitions (the
//! slot is in the assignment's user data).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::ConsumerProtocolAssignment;
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::client::group::{self, codes, JoinOutcome, JoinSpec};
use crate::client::{Client, ClientError};
use crate::control::members::FailureRun;
use crate::sync::error_chain;

use super::metrics::ErrorKind;
use super::{progress, Shared};

/// The protocol (for consumers: the assignor) every instance offers.
pub(crate) const PROTOCOL: &str = "kafka-mirror-replicator-slots";

/// The commit metadata of a partition given back cleanly.
pub(crate) const RELEASED: &str = "released";

/// One instance's share of the link: slot `index` of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub index: u32,
    pub count: u32,
}

impl Slot {
    /// Without membership: every partition.
    pub(crate) const ALONE: Slot = Slot { index: 0, count: 1 };

    /// Whether this slot copies `partition` of `topic`. Within a topic the
    /// partitions go round the slots (counts differ by one at most),
    /// starting at a slot chosen by the topic's name, so that topics with
    /// fewer partitions than slots spread too.
    pub(crate) fn owns(&self, topic: &str, partition: i32) -> bool {
        let Ok(partition) = u64::try_from(partition) else {
            return false;
        };
        let count = u64::from(self.count.max(1));
        (u64::from(crc32c::crc32c(topic.as_bytes())) + partition) % count == u64::from(self.index)
    }

    /// The one instance that makes destination topics follow the source.
    pub(crate) fn follows_topics(&self) -> bool {
        self.index == 0
    }
}

/// The assignment of `slot`: `ConsumerProtocolAssignment` v0 (with its
/// version prefix) assigning no partitions, the slot as user data (index,
/// count: two big-endian int32).
pub(crate) fn assignment(slot: Slot) -> Result<Bytes, ClientError> {
    let mut user = BytesMut::with_capacity(8);
    user.put_u32(slot.index);
    user.put_u32(slot.count);
    let a = ConsumerProtocolAssignment::default().with_user_data(Some(user.freeze()));
    let mut out = BytesMut::new();
    out.put_i16(0);
    a.encode(&mut out, 0).map_err(|e| ClientError::Encode {
        api: "ConsumerProtocolAssignment",
        version: 0,
        cause: e.into(),
    })?;
    Ok(out.freeze())
}

/// The slot in an assignment; `None` for anything else (an empty
/// assignment, a member of another kind, a cut or unknown layout).
pub(crate) fn slot_of(assignment: &[u8]) -> Option<Slot> {
    let mut buf = Bytes::copy_from_slice(assignment);
    if buf.len() < 2 {
        return None;
    }
    let version = i16::from_be_bytes([buf[0], buf[1]]);
    let _ = buf.split_to(2);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)).ok()?;
    let user = a.user_data?;
    let index = u32::from_be_bytes(user.get(0..4)?.try_into().ok()?);
    let count = u32::from_be_bytes(user.get(4..8)?.try_into().ok()?);
    (index < count).then_some(Slot { index, count })
}

/// The leader's assignments: members sorted by id, each its index.
pub(crate) fn assignments(
    members: &[(String, Bytes)],
) -> Result<Vec<(String, Bytes)>, ClientError> {
    let mut ids: Vec<&str> = members.iter().map(|(id, _)| id.as_str()).collect();
    ids.sort_unstable();
    ids.dedup();
    let count = u32::try_from(ids.len()).unwrap_or(u32::MAX);
    ids.iter()
        .zip(0u32..)
        .map(|(id, index)| Ok((id.to_string(), assignment(Slot { index, count })?)))
        .collect()
}

/// What this instance holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Assigned {
    /// The group generation (0 without membership): partitions taken on
    /// for an older one are not kept.
    pub generation: i32,
    pub slot: Slot,
    /// When it was given: a partition without a clean hand-over waits
    /// from here.
    pub at: Instant,
}

/// Why one membership ended.
/// Why a membership failed (it is tried again).
#[derive(Debug, thiserror::Error)]
enum MembershipError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(
        "generation {0} gave this instance no slot (is every instance of the link the same \
         version?)"
    )]
    NoSlot(i32),
}

enum Ended {
    /// The run is ending.
    Stop,
    /// Join again now (a rebalance).
    Rejoin,
    /// Join again after a backoff.
    Failed(MembershipError),
    /// The source refused the credentials: no retry fixes that.
    Refused(ClientError),
}

/// How a membership ends on `e`.
fn failed(e: ClientError) -> Ended {
    if e.is_authentication() {
        Ended::Refused(e)
    } else {
        Ended::Failed(e.into())
    }
}

/// The membership loop: join, take the slot, heartbeat, give everything
/// back and join again when the group changes, until the run stops.
pub(super) async fn run(shared: Arc<Shared>, source: Client, destination: Client) {
    // A connection of its own: heartbeats do not queue behind Fetches.
    let client = Client::new(source.config().clone());
    let group = shared.config.instances_group();
    let metadata = match group::subscription_metadata(&shared.config.link, &shared.instance_id) {
        Ok(m) => m,
        Err(e) => {
            shared.fail(super::ReplicateError::client(
                "the instances group's metadata",
                e,
            ));
            return;
        }
    };
    let session = shared.config.session_timeout;
    let ms = |d: Duration| i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
    let spec = JoinSpec {
        group: group.clone(),
        protocol: PROTOCOL.to_string(),
        session_timeout_ms: ms(session),
        // Giving partitions back waits for what is in flight and commits.
        rebalance_timeout_ms: ms(session + shared.config.request_timeout * 2),
        metadata,
    };
    let mut retries = FailureRun::new(shared.backoff());
    loop {
        let ended = membership(&shared, &client, &spec).await;
        if shared.stopping() {
            return;
        }
        give_back(&shared, &destination).await;
        match ended {
            Ended::Stop => return,
            Ended::Rejoin => retries.reset(),
            Ended::Refused(e) => {
                shared.fail(super::ReplicateError::client(
                    format!("instances group {group} on the source"),
                    e,
                ));
                return;
            }
            Ended::Failed(e) => {
                shared.metrics.error(ErrorKind::Membership);
                let failure = retries.failed();
                if failure.warn {
                    tracing::warn!(%group, error = %error_chain(&e), failures = failure.failures, retry_in_ms = failure.delay.as_millis() as u64, "instances group membership failed; joining again");
                }
                tokio::time::sleep(failure.delay).await;
            }
        }
    }
}

/// One membership: coordinator, join, sync, heartbeats.
async fn membership(shared: &Shared, client: &Client, spec: &JoinSpec) -> Ended {
    let group = &spec.group;
    let addr = match client.group_coordinator(group).await {
        Ok(a) => a,
        Err(e) => return failed(e),
    };
    let mut member_id = shared.member().map(|m| m.1).unwrap_or_default();
    let (generation, leader, members) = loop {
        match client.join_group(&addr, spec, &member_id).await {
            Ok(JoinOutcome::MemberIdRequired(id)) => member_id = id,
            Ok(JoinOutcome::Joined {
                generation,
                member_id: id,
                leader,
                members,
            }) => {
                member_id = id;
                break (generation, leader, members);
            }
            Err(e) if e.code() == Some(codes::REBALANCE_IN_PROGRESS) => {}
            Err(e) => {
                if e.code() == Some(codes::UNKNOWN_MEMBER_ID) {
                    shared.set_member(None);
                }
                return failed(e);
            }
        }
        if shared.stopping() {
            return Ended::Stop;
        }
    };
    shared.set_member(Some((addr.clone(), member_id.clone())));
    let given = if leader {
        match assignments(&members) {
            Ok(a) => a,
            Err(e) => return Ended::Failed(e.into()),
        }
    } else {
        Vec::new()
    };
    let mine = match client
        .sync_group(&addr, group, generation, &member_id, PROTOCOL, &given)
        .await
    {
        Ok(bytes) => bytes,
        Err(e) if group::group_moved_on(&e) => return Ended::Rejoin,
        Err(e) => return failed(e),
    };
    let Some(slot) = slot_of(&mine) else {
        return Ended::Failed(MembershipError::NoSlot(generation));
    };
    tracing::info!(%group, generation, slot = slot.index, of = slot.count, leader, "took a slot of the link's partitions");
    shared.assign(Assigned {
        generation,
        slot,
        at: Instant::now(),
    });
    let interval = spec_session(spec) / 3;
    let mut last_ok = Instant::now();
    loop {
        tokio::time::sleep(interval).await;
        if shared.stopping() {
            return Ended::Stop;
        }
        match client.heartbeat(&addr, group, generation, &member_id).await {
            Ok(()) => last_ok = Instant::now(),
            Err(e) if group::group_moved_on(&e) => {
                tracing::info!(%group, generation, "the link's instances change; giving the partitions back");
                return Ended::Rejoin;
            }
            Err(e) if e.code() == Some(codes::UNKNOWN_MEMBER_ID) => {
                shared.set_member(None);
                return Ended::Failed(e.into());
            }
            // Still a member until the session runs out: the others take
            // the partitions over only then.
            Err(e) if e.is_retriable() && last_ok.elapsed() < spec_session(spec) => {
                tracing::debug!(%group, error = %error_chain(&e), "heartbeat failed; trying again");
            }
            Err(e) => return failed(e),
        }
    }
}

fn spec_session(spec: &JoinSpec) -> Duration {
    Duration::from_millis(u64::try_from(spec.session_timeout_ms).unwrap_or(10_000))
}

/// Gives every partition back: nothing new is fetched or sent, what is in
/// flight is answered (bounded by the request timeout), every resume
/// point is committed (marked [`RELEASED`] when nothing was left in
/// flight), and the table is emptied.
pub(super) async fn give_back(shared: &Shared, destination: &Client) {
    let held = shared.unassign();
    if held.is_none() && shared.table().is_empty() {
        return;
    }
    shared.metrics.rebalanced();
    shared.table().halt();
    shared.changed.notify_waiters();
    let drained = tokio::time::timeout(shared.config.request_timeout, async {
        while shared.table().in_flight() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok();
    let marked = if drained { RELEASED } else { "" };
    if let Err(e) = progress::commit_all(shared, destination, marked).await {
        shared.metrics.error(ErrorKind::Commit);
        tracing::warn!(error = %error_chain(&e), "could not commit the partitions given back; their next owner re-sends what this commit would have covered");
    }
    let gone = shared.table().clear();
    for tp in &gone {
        shared.metrics.partition_removed(&tp.topic, tp.partition);
    }
    shared.changed.notify_waiters();
    tracing::info!(
        partitions = gone.len(),
        clean = drained,
        "gave the partitions back"
    );
}

/// Leaves the group (the run's last act): the others take the partitions
/// over at once instead of after the session timeout.
pub(super) async fn leave(shared: &Shared, source: &Client) {
    let Some((coordinator, member_id)) = shared.member() else {
        return;
    };
    let group = shared.config.instances_group();
    match source.leave_group(&coordinator, &group, &member_id).await {
        Ok(()) => tracing::info!(%group, "left the link's instances group"),
        Err(e) => {
            tracing::warn!(%group, error = %error_chain(&e), "could not leave the instances group; the others take the partitions over after the session timeout")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_a_consumer_assignment_with_the_slot_as_user_data() {
        let bytes = assignment(Slot { index: 1, count: 3 }).expect("encodes");
        assert_eq!(
            bytes.as_ref(),
            [
                0, 0, // version 0
                0, 0, 0, 0, // no partitions
                0, 0, 0, 8, // user data: 8 bytes
                0, 0, 0, 1, // index
                0, 0, 0, 3, // count
            ]
        );
        assert_eq!(slot_of(&bytes), Some(Slot { index: 1, count: 3 }));
    }

    #[test]
    fn anything_but_a_slot_is_no_slot() {
        // The coordinator's empty assignment, cut bytes, an index out of range.
        assert_eq!(slot_of(&[]), None);
        assert_eq!(slot_of(&[0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]), None);
        let bytes = assignment(Slot { index: 1, count: 3 }).expect("encodes");
        assert_eq!(slot_of(&bytes[..bytes.len() - 1]), None);
        let bad = assignment(Slot { index: 3, count: 3 }).expect("encodes");
        assert_eq!(slot_of(&bad), None);
    }

    #[test]
    fn the_leader_gives_slots_in_member_id_order() {
        let members = vec![
            ("c".to_string(), Bytes::new()),
            ("a".to_string(), Bytes::new()),
            ("b".to_string(), Bytes::new()),
        ];
        let given: Vec<(String, Option<Slot>)> = assignments(&members)
            .expect("assigned")
            .into_iter()
            .map(|(id, bytes)| (id, slot_of(&bytes)))
            .collect();
        assert_eq!(
            given,
            [
                ("a".to_string(), Some(Slot { index: 0, count: 3 })),
                ("b".to_string(), Some(Slot { index: 1, count: 3 })),
                ("c".to_string(), Some(Slot { index: 2, count: 3 })),
            ]
        );
    }

    #[test]
    fn every_partition_has_exactly_one_owner_and_the_shares_are_even() {
        for count in 1..=5u32 {
            let slots: Vec<Slot> = (0..count).map(|index| Slot { index, count }).collect();
            for topic in ["orders", "payments", "t"] {
                let mut per_slot = vec![0u32; count as usize];
                for partition in 0..12 {
                    let owners: Vec<u32> = slots
                        .iter()
                        .filter(|s| s.owns(topic, partition))
                        .map(|s| s.index)
                        .collect();
                    assert_eq!(
                        owners.len(),
                        1,
                        "{topic}-{partition} of {count}: {owners:?}"
                    );
                    per_slot[owners[0] as usize] += 1;
                }
                let (min, max) = (per_slot.iter().min(), per_slot.iter().max());
                assert!(
                    max.zip(min).is_some_and(|(max, min)| max - min <= 1),
                    "{topic} over {count}: {per_slot:?}"
                );
            }
        }
        assert!(Slot::ALONE.owns("t", 7));
        assert!(!Slot::ALONE.owns("t", -1));
    }
}
