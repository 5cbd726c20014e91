//! Failback (SPEC §12): what `kafka-mirror-proxy failback` reads and
//! writes around the pure rules of `mirror::divergence`.
//!
//! Link `REVERSE_OF` mirrored A into B and failed over; link `LINK` of A's
//! proxy, `PREPARING`, is to mirror B back into A. The plan reads, on B,
//! the failed-over link's state and barriers (state topic), its
//! translation (offsets topic) and its replicator's resume points
//! (progress group), and on A each partition's log: per partition, where A
//! and B diverge and what A holds past that point (A's records B never
//! got: count, offsets, times). Applying it writes, on A, the failback
//! link's history into the offsets topic (so groups follow back exactly)
//! and its replicator's starting points (B's barriers) into its progress
//! group. A's records past the divergence point are left where they are:
//! nothing acknowledged is dropped, nothing is copied twice.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::client::protocol::{IsolationLevel, OffsetSpec};
use crate::client::{Client, ClientError};
use crate::control::api::PastDivergence;
use crate::mirror::divergence::{self, Barrier, Point, Unresolved};
use crate::mirror::link_state::{follows, LinkState, LinkStatus};
use crate::mirror::state_records::StateRecord;
use crate::mirror::translation::Segments;
use crate::wire::batch::BatchHeader;

use super::batches::{split, SplitError};
use super::members::RELEASED;
use super::partitions::{Item, Tp};
use super::translation::{self, TranslationError};

/// Bytes per fetch of A's log past the divergence point.
const FETCH_BYTES: i32 = 8 << 20;
/// The largest single batch the scan fetches again whole.
const MAX_BATCH_BYTES: usize = 64 << 20;

/// Why a failback could not be planned or applied.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FailbackError {
    #[error("{what}")]
    Client {
        what: String,
        #[source]
        source: ClientError,
    },
    #[error(transparent)]
    Translation(#[from] TranslationError),
    #[error("link '{link}' has no state in {topic} on B: it never failed over there (fail it over first: `kafka-mirror-proxy failover {link}` against B's proxy)")]
    NoState { link: String, topic: String },
    #[error("link '{link}' is {state} on B, not STOPPED: fail it over first (`kafka-mirror-proxy failover {link}` against B's proxy)")]
    NotFailedOver { link: String, state: &'static str },
    #[error("link '{link}' failed over (failover {failover_id}) but {topic} on B holds no barrier of it")]
    NoBarriers {
        link: String,
        failover_id: i64,
        topic: String,
    },
    #[error("{count} partition(s) have no divergence point that can be told (see the report); nothing was written")]
    Unresolved { count: usize },
    #[error("the records of A past the divergence point in {topic}-{partition} could not be read")]
    Scan {
        topic: String,
        partition: i32,
        #[source]
        source: SplitError,
    },
}

impl FailbackError {
    /// A refusal before any plan: the failed-over link's state on B says
    /// there is nothing to fail back (yet); not a failure to read.
    pub(crate) fn is_refusal(&self) -> bool {
        matches!(
            self,
            FailbackError::NoState { .. }
                | FailbackError::NotFailedOver { .. }
                | FailbackError::NoBarriers { .. }
        )
    }
}

fn client_err(what: impl Into<String>) -> impl FnOnce(ClientError) -> FailbackError {
    let what = what.into();
    move |source| FailbackError::Client { what, source }
}

/// Where to read and write.
pub(crate) struct Failback<'a> {
    /// The failback link (of A's proxy).
    pub link: &'a str,
    /// The link (of B's proxy) that mirrored A into B and failed over.
    pub reverse_of: &'a str,
    /// Cluster A (its brokers, or A's proxy).
    pub a: &'a Client,
    /// Cluster B.
    pub b: &'a Client,
    /// B's proxy's state topic.
    pub state_topic: &'a str,
    /// The replicators' offsets topic (on both clusters).
    pub offsets_topic: &'a str,
    /// `reverse_of`'s replicator's progress group (on B).
    pub forward_group: &'a str,
    /// `link`'s replicator's progress group (on A).
    pub progress_group: &'a str,
}

/// A's records past the divergence point, as the failback report shows
/// them (one type: the report's rows are these counts).
pub(crate) type Tail = PastDivergence;

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionPlan {
    pub topic: String,
    pub partition: i32,
    pub point: Result<Point, Unresolved>,
    /// A's log end offset when planned.
    pub a_end: i64,
    /// B's log end offset when planned: B's own records are
    /// `point.b_start..b_end`.
    pub b_end: i64,
    pub tail: Tail,
    /// The failed-over link's translation in this partition.
    pub translation: Option<Segments>,
}

/// What a failback finds and would do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The failover of `reverse_of` that the failback undoes.
    pub failover_id: i64,
    pub partitions: Vec<PartitionPlan>,
}

impl Plan {
    pub(crate) fn unresolved(&self) -> usize {
        self.partitions.iter().filter(|p| p.point.is_err()).count()
    }
}

/// Reads both clusters and works out every partition's divergence.
pub(crate) async fn plan(f: &Failback<'_>) -> Result<Plan, FailbackError> {
    // The failed-over link's state and barriers, in the state topic's
    // order (the rules every proxy instance applies).
    let mut status: Option<LinkStatus> = None;
    let mut barriers: HashMap<(uuid::Uuid, i32), (i64, Barrier)> = HashMap::new();
    crate::state::for_each_state_record(f.b, f.state_topic, None, |_, record| match record {
        StateRecord::LinkState(name, Some(next))
            if name == f.reverse_of
                && status
                    .as_ref()
                    .is_none_or(|current| follows(current, &next)) =>
        {
            status = Some(next);
        }
        StateRecord::Barrier(key, Some(value)) if key.link == f.reverse_of => {
            barriers.insert(
                (key.topic_id, key.partition),
                (
                    value.failover_id,
                    Barrier {
                        log_end_offset: value.log_end_offset,
                        accepted: value.accepted,
                    },
                ),
            );
        }
        _ => {}
    })
    .await
    .map_err(client_err(format!("reading {} on B", f.state_topic)))?;
    let status = status.ok_or_else(|| FailbackError::NoState {
        link: f.reverse_of.to_string(),
        topic: f.state_topic.to_string(),
    })?;
    if status.state != LinkState::Stopped {
        return Err(FailbackError::NotFailedOver {
            link: f.reverse_of.to_string(),
            state: status.state.as_str(),
        });
    }
    let names: HashMap<uuid::Uuid, String> =
        f.b.metadata(None)
            .await
            .map_err(client_err("metadata of B"))?
            .topics
            .into_iter()
            .map(|t| (t.topic_id, t.name))
            .collect();
    // This failover's barriers, by partition name (a topic deleted since
    // has nothing to fail back).
    let barriers: BTreeMap<(String, i32), Barrier> = barriers
        .into_iter()
        .filter(|(_, (id, _))| *id == status.failover_id)
        .filter_map(|((topic_id, p), (_, b))| names.get(&topic_id).map(|n| ((n.clone(), p), b)))
        .collect();
    if barriers.is_empty() {
        return Err(FailbackError::NoBarriers {
            link: f.reverse_of.to_string(),
            failover_id: status.failover_id,
            topic: f.state_topic.to_string(),
        });
    }
    let keys: Vec<(String, i32)> = barriers.keys().cloned().collect();
    let (mut translations, _) =
        translation::load(f.b, f.offsets_topic, f.reverse_of, usize::MAX).await?;
    let resume =
        f.b.committed_offsets(f.forward_group, &keys)
            .await
            .map_err(client_err(format!(
                "committed offsets of {} on B",
                f.forward_group
            )))?;
    let a_start =
        f.a.list_offsets(&keys, OffsetSpec::Earliest)
            .await
            .map_err(client_err("log start offsets of A"))?;
    let a_end =
        f.a.list_offsets(&keys, OffsetSpec::Latest)
            .await
            .map_err(client_err("log end offsets of A"))?;
    let b_end =
        f.b.list_offsets(&keys, OffsetSpec::Latest)
            .await
            .map_err(client_err("log end offsets of B"))?;
    let mut partitions = Vec::with_capacity(barriers.len());
    for (key, barrier) in barriers {
        let translation = translations.remove(&key);
        let point = divergence::divergence(
            translation.as_ref(),
            resume.get(&key).copied(),
            barrier,
            a_start.get(&key).copied().unwrap_or(0),
        );
        let a_end = a_end.get(&key).copied().unwrap_or(0);
        let b_end = b_end.get(&key).copied().unwrap_or(0);
        let tail = match &point {
            Ok(p) => scan(f.a, &key.0, key.1, p.a_next, a_end).await?,
            Err(_) => Tail::default(),
        };
        partitions.push(PartitionPlan {
            topic: key.0,
            partition: key.1,
            point,
            a_end,
            b_end,
            tail,
            translation,
        });
    }
    Ok(Plan {
        failover_id: status.failover_id,
        partitions,
    })
}

/// A's committed records at `from..end`.
async fn scan(
    a: &Client,
    topic: &str,
    partition: i32,
    from: i64,
    end: i64,
) -> Result<Tail, FailbackError> {
    let mut tail = Tail::default();
    let mut next = from;
    let mut max_bytes = FETCH_BYTES;
    while next < end {
        let fetched = a
            .fetch_isolated(
                topic,
                partition,
                next,
                max_bytes,
                Duration::ZERO,
                IsolationLevel::ReadCommitted,
            )
            .await
            .map_err(client_err(format!("reading {topic}-{partition} on A")))?;
        let split = split(&fetched.records, fetched.aborted_transactions).map_err(|source| {
            FailbackError::Scan {
                topic: topic.to_string(),
                partition,
                source,
            }
        })?;
        if split.items.is_empty() {
            if let Some(needed) = split.partial_needed.filter(|n| *n <= MAX_BATCH_BYTES) {
                max_bytes = i32::try_from(needed).unwrap_or(i32::MAX);
                continue;
            }
            // Up to the last stable offset: a transaction still open.
            tail.open_transaction = fetched.last_stable_offset < end;
            break;
        }
        for item in split.items {
            match item {
                Item::Data(b) if b.last_offset >= next => {
                    tail.records += u64::from(b.records);
                    tail.batches += 1;
                    tail.first_offset.get_or_insert(b.base_offset.max(from));
                    tail.last_offset = Some(b.last_offset);
                    if let Ok(h) = BatchHeader::parse(&b.bytes) {
                        tail.first_time_ms.get_or_insert(h.max_timestamp());
                        tail.last_time_ms = Some(h.max_timestamp());
                    }
                    next = b.last_offset + 1;
                }
                Item::Data(b) => next = next.max(b.last_offset + 1),
                Item::Skip {
                    last_offset,
                    aborted,
                } => {
                    if aborted && last_offset >= next {
                        tail.aborted_batches += 1;
                    }
                    next = next.max(last_offset + 1);
                }
            }
        }
        max_bytes = FETCH_BYTES;
    }
    Ok(tail)
}

/// Writes the failback link's history (offsets topic on A) and its
/// replicator's starting points (progress group on A). Refuses a plan with
/// an unresolved partition, before writing anything.
pub(crate) async fn apply(f: &Failback<'_>, plan: &Plan, now_ms: i64) -> Result<(), FailbackError> {
    let count = plan.unresolved();
    if count > 0 {
        return Err(FailbackError::Unresolved { count });
    }
    let writer = translation::client(f.a);
    translation::ensure_topic(&writer, f.offsets_topic).await?;
    let mut history = Vec::new();
    let mut starts = BTreeMap::new();
    for p in &plan.partitions {
        let Ok(point) = p.point else { continue };
        let tp = Tp {
            topic: p.topic.as_str().into(),
            partition: p.partition,
        };
        for s in divergence::failback_history(p.translation.as_ref(), point, p.a_end) {
            history.push((tp.clone(), s));
        }
        starts.insert((p.topic.clone(), p.partition), point.b_start);
    }
    // The history first: a replicator that finds its starting points finds
    // the history it extends.
    translation::save(&writer, f.offsets_topic, f.link, &history, now_ms).await?;
    f.a.commit_offsets_marked(f.progress_group, &starts, RELEASED)
        .await
        .map_err(client_err(format!(
            "committing the starting points to {} on A",
            f.progress_group
        )))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scan_failure_carries_why_the_records_could_not_be_split() {
        let e = FailbackError::Scan {
            topic: "orders".into(),
            partition: 2,
            source: split(&bytes::Bytes::from_static(&[0; 12]), Vec::new())
                .expect_err("a batch cut short"),
        };
        assert_eq!(
            e.to_string(),
            "the records of A past the divergence point in orders-2 could not be read"
        );
        let cause = std::error::Error::source(&e).expect("the split error");
        assert!(cause.is::<SplitError>());
        assert_eq!(crate::sync::error_chain(&e), format!("{e}: {cause}"));
        assert!(!e.is_refusal());
    }
}
