//! Committed offsets of a consumer group (OffsetCommit, OffsetFetch): how a
//! copier keeps its progress in Kafka itself. Commits are made as a
//! standalone consumer (generation -1, no member id), which Kafka's group
//! coordinator accepts for a group without members, so no membership is
//! needed; Kafka's own tools (`kafka-consumer-groups.sh --describe`) show
//! and reset the offsets.
//!
//! The builders and interpreters are pure, as in `client::protocol`; the
//! [`Client`] methods at the end send them to the group's coordinator,
//! looked up again on every attempt (a coordinator moves with the leader of
//! its `__consumer_offsets` partition).

use std::collections::BTreeMap;
use std::time::Duration;

use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::{
    OffsetFetchRequestGroup, OffsetFetchRequestTopics,
};
use kafka_protocol::messages::{
    GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::error::ClientError;
use super::protocol::Rpc;
use super::Client;

// OffsetCommit v2: the oldest Kafka 4 accepts. OffsetFetch v8: groups
// batched in one request, the only layout built here.
impl Rpc for OffsetCommitRequest {
    const NAME: &'static str = "OffsetCommit";
    const RESPONSE_SCHEMA: &'static str = "OffsetCommitResponse";
    const MIN: i16 = 2;
}
impl Rpc for OffsetFetchRequest {
    const NAME: &'static str = "OffsetFetch";
    const RESPONSE_SCHEMA: &'static str = "OffsetFetchResponse";
    const MIN: i16 = 8;
}

/// Offsets by (topic, partition): the next offset to read.
pub type Offsets = BTreeMap<(String, i32), i64>;

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn kafka_error(context: String, code: i16) -> ClientError {
    ClientError::Kafka {
        context,
        code,
        message: None,
    }
}

/// Committed offsets with the metadata string committed beside them.
pub(crate) type Marked = BTreeMap<(String, i32), (i64, String)>;

/// A standalone commit of `offsets` to `group`.
#[cfg(test)]
pub(crate) fn offset_commit_request(group: &str, offsets: &Offsets) -> OffsetCommitRequest {
    offset_commit_request_marked(group, offsets, "")
}

/// [`offset_commit_request`] with `metadata` beside every offset (empty:
/// none sent).
pub(crate) fn offset_commit_request_marked(
    group: &str,
    offsets: &Offsets,
    metadata: &str,
) -> OffsetCommitRequest {
    let mut topics: BTreeMap<&str, Vec<OffsetCommitRequestPartition>> = BTreeMap::new();
    for ((topic, partition), offset) in offsets {
        let mut p = OffsetCommitRequestPartition::default()
            .with_partition_index(*partition)
            .with_committed_offset(*offset)
            .with_committed_leader_epoch(-1);
        if !metadata.is_empty() {
            p.committed_metadata = Some(s(metadata));
        }
        topics.entry(topic).or_default().push(p);
    }
    OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(-1)
        .with_member_id(s(""))
        .with_retention_time_ms(-1)
        .with_topics(
            topics
                .into_iter()
                .map(|(name, partitions)| {
                    OffsetCommitRequestTopic::default()
                        .with_name(TopicName(s(name)))
                        .with_partitions(partitions)
                })
                .collect(),
        )
}

/// Every partition of the request committed; the first error otherwise
/// (a partition the answer leaves out counts as not committed).
pub(crate) fn offset_commit_result(
    r: &OffsetCommitResponse,
    group: &str,
    offsets: &Offsets,
) -> Result<(), ClientError> {
    for (topic, partition) in offsets.keys() {
        let code = r
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == *partition)
            .map_or(-1, |p| p.error_code);
        if code != 0 {
            return Err(kafka_error(
                format!("commit offset of {topic}-{partition} to group {group}"),
                code,
            ));
        }
    }
    Ok(())
}

/// The committed offsets of `partitions` in `group` (v8+ layout).
pub(crate) fn offset_fetch_request(
    group: &str,
    partitions: &[(String, i32)],
) -> OffsetFetchRequest {
    let mut topics: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    for (topic, partition) in partitions {
        topics.entry(topic).or_default().push(*partition);
    }
    OffsetFetchRequest::default()
        // Pending transactional commits are waited for, not read past.
        .with_require_stable(true)
        .with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(GroupId(s(group)))
            .with_member_epoch(-1)
            .with_topics(Some(
                topics
                    .into_iter()
                    .map(|(name, partition_indexes)| {
                        OffsetFetchRequestTopics::default()
                            .with_name(TopicName(s(name)))
                            .with_partition_indexes(partition_indexes)
                    })
                    .collect(),
            ))])
}

/// The committed offset of each partition asked that has one (Kafka
/// answers -1 for none; such partitions are left out).
#[cfg(test)]
pub(crate) fn offset_fetch_result(
    r: &OffsetFetchResponse,
    group: &str,
    partitions: &[(String, i32)],
) -> Result<Offsets, ClientError> {
    Ok(offset_fetch_marked(r, group, partitions)?
        .into_iter()
        .map(|(k, (offset, _))| (k, offset))
        .collect())
}

/// [`offset_fetch_result`] with each offset's metadata string.
pub(crate) fn offset_fetch_marked(
    r: &OffsetFetchResponse,
    group: &str,
    partitions: &[(String, i32)],
) -> Result<Marked, ClientError> {
    let g = r
        .groups
        .iter()
        .find(|g| g.group_id.0.as_str() == group)
        .ok_or_else(|| kafka_error(format!("OffsetFetch answer without group {group}"), -1))?;
    if g.error_code != 0 {
        return Err(kafka_error(
            format!("committed offsets of group {group}"),
            g.error_code,
        ));
    }
    let mut out = Marked::new();
    for (topic, partition) in partitions {
        let Some(p) = g
            .topics
            .iter()
            .filter(|t| t.name.0.as_str() == topic)
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == *partition)
        else {
            continue;
        };
        if p.error_code != 0 {
            return Err(kafka_error(
                format!("committed offset of {topic}-{partition} in group {group}"),
                p.error_code,
            ));
        }
        if p.committed_offset >= 0 {
            let metadata = p
                .metadata
                .as_ref()
                .map(|m| m.as_str().to_string())
                .unwrap_or_default();
            out.insert((topic.clone(), *partition), (p.committed_offset, metadata));
        }
    }
    Ok(out)
}

impl Client {
    /// Commit `offsets` to `group` (retried while the coordinator moves or
    /// loads, until the operation timeout).
    pub async fn commit_offsets(&self, group: &str, offsets: &Offsets) -> Result<(), ClientError> {
        self.commit_offsets_marked(group, offsets, "").await
    }

    /// [`commit_offsets`](Self::commit_offsets) with `metadata` beside
    /// every offset.
    pub(crate) async fn commit_offsets_marked(
        &self,
        group: &str,
        offsets: &Offsets,
        metadata: &str,
    ) -> Result<(), ClientError> {
        if offsets.is_empty() {
            return Ok(());
        }
        self.retrying(&format!("commit offsets to group {group}"), || async move {
            let coordinator = self.group_coordinator(group).await?;
            let (_, r) = self
                .call(&coordinator, Duration::ZERO, |_| {
                    Ok(offset_commit_request_marked(group, offsets, metadata))
                })
                .await?;
            offset_commit_result(&r, group, offsets)
        })
        .await
    }

    /// The offsets `group` committed for `partitions` (those without one
    /// left out).
    pub async fn committed_offsets(
        &self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<Offsets, ClientError> {
        Ok(self
            .committed_marked(group, partitions)
            .await?
            .into_iter()
            .map(|(k, (offset, _))| (k, offset))
            .collect())
    }

    /// [`committed_offsets`](Self::committed_offsets) with each offset's
    /// metadata string.
    pub(crate) async fn committed_marked(
        &self,
        group: &str,
        partitions: &[(String, i32)],
    ) -> Result<Marked, ClientError> {
        self.retrying(
            &format!("committed offsets of group {group}"),
            || async move {
                let coordinator = self.group_coordinator(group).await?;
                let (_, r) = self
                    .call(&coordinator, Duration::ZERO, |_| {
                        Ok(offset_fetch_request(group, partitions))
                    })
                    .await?;
                offset_fetch_marked(&r, group, partitions)
            },
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::offset_commit_response::{
        OffsetCommitResponsePartition, OffsetCommitResponseTopic,
    };
    use kafka_protocol::messages::offset_fetch_response::{
        OffsetFetchResponseGroup, OffsetFetchResponsePartitions, OffsetFetchResponseTopics,
    };

    fn offsets() -> Offsets {
        [
            (("t".to_string(), 0), 10),
            (("t".to_string(), 1), 20),
            (("u".to_string(), 0), 5),
        ]
        .into_iter()
        .collect()
    }

    #[test]
    fn commit_request_groups_partitions_by_topic_as_a_standalone_consumer() {
        let r = offset_commit_request("g", &offsets());
        assert_eq!(r.group_id.0.as_str(), "g");
        assert_eq!(r.generation_id_or_member_epoch, -1);
        assert!(r.member_id.is_empty());
        assert_eq!(r.topics.len(), 2);
        assert_eq!(r.topics[0].name.0.as_str(), "t");
        let t: Vec<(i32, i64)> = r.topics[0]
            .partitions
            .iter()
            .map(|p| (p.partition_index, p.committed_offset))
            .collect();
        assert_eq!(t, [(0, 10), (1, 20)]);
        assert!(r.topics[0].partitions[0]
            .committed_metadata
            .as_ref()
            .is_none_or(|m| m.is_empty()));
        let marked = offset_commit_request_marked("g", &offsets(), "released");
        assert!(marked
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .all(|p| p.committed_metadata.as_ref().map(|m| m.as_str()) == Some("released")));
    }

    #[test]
    fn fetched_offsets_keep_their_metadata() {
        let asked = vec![("t".to_string(), 0), ("t".to_string(), 1)];
        let r = fetch_answer(vec![
            OffsetFetchResponsePartitions::default()
                .with_partition_index(0)
                .with_committed_offset(7)
                .with_metadata(Some(s("released"))),
            OffsetFetchResponsePartitions::default()
                .with_partition_index(1)
                .with_committed_offset(9)
                .with_metadata(None),
        ]);
        let got = offset_fetch_marked(&r, "g", &asked).expect("answered");
        assert_eq!(got[&("t".to_string(), 0)], (7, "released".to_string()));
        assert_eq!(got[&("t".to_string(), 1)], (9, String::new()));
    }

    /// Group `g`'s answer to an OffsetFetch: `partitions` of topic `t`.
    fn fetch_answer(partitions: Vec<OffsetFetchResponsePartitions>) -> OffsetFetchResponse {
        OffsetFetchResponse::default().with_groups(vec![OffsetFetchResponseGroup::default()
            .with_group_id(GroupId(s("g")))
            .with_topics(vec![OffsetFetchResponseTopics::default()
                .with_name(TopicName(s("t")))
                .with_partitions(partitions)])])
    }

    fn commit_answer(codes: &[(&str, i32, i16)]) -> OffsetCommitResponse {
        OffsetCommitResponse::default().with_topics(
            codes
                .iter()
                .map(|(t, p, c)| {
                    OffsetCommitResponseTopic::default()
                        .with_name(TopicName(s(t)))
                        .with_partitions(vec![OffsetCommitResponsePartition::default()
                            .with_partition_index(*p)
                            .with_error_code(*c)])
                })
                .collect(),
        )
    }

    #[test]
    fn a_commit_succeeds_only_when_every_partition_did() {
        let all = commit_answer(&[("t", 0, 0), ("t", 1, 0), ("u", 0, 0)]);
        assert!(offset_commit_result(&all, "g", &offsets()).is_ok());
        let one_failed = commit_answer(&[("t", 0, 0), ("t", 1, 16), ("u", 0, 0)]);
        assert_eq!(
            offset_commit_result(&one_failed, "g", &offsets()).map_err(|e| e.code()),
            Err(Some(16))
        );
        let one_missing = commit_answer(&[("t", 0, 0), ("u", 0, 0)]);
        assert!(offset_commit_result(&one_missing, "g", &offsets()).is_err());
    }

    #[test]
    fn fetched_offsets_leave_out_partitions_without_a_commit() {
        let asked = vec![
            ("t".to_string(), 0),
            ("t".to_string(), 1),
            ("u".to_string(), 0),
        ];
        let r = fetch_answer(vec![
            OffsetFetchResponsePartitions::default()
                .with_partition_index(0)
                .with_committed_offset(42),
            OffsetFetchResponsePartitions::default()
                .with_partition_index(1)
                .with_committed_offset(-1),
        ]);
        let got = offset_fetch_result(&r, "g", &asked).expect("ok");
        assert_eq!(got, [(("t".to_string(), 0), 42)].into_iter().collect());
        let request = offset_fetch_request("g", &asked);
        assert_eq!(request.groups.len(), 1);
        assert_eq!(request.groups[0].topics.as_ref().map(Vec::len), Some(2));
        let loading =
            OffsetFetchResponse::default().with_groups(vec![OffsetFetchResponseGroup::default()
                .with_group_id(GroupId(s("g")))
                .with_error_code(14)]);
        assert_eq!(
            offset_fetch_result(&loading, "g", &asked).map_err(|e| e.code()),
            Err(Some(14))
        );
    }
}
