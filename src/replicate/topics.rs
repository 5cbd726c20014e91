//! Topics follow the source: the source's topics that the link's patterns
//! match are found at start and every discovery interval; a missing
//! destination topic is created with the source's partition count and its
//! replicated configs, partitions the source added are added, replicated
//! configs the source changed are changed; nothing is ever deleted on the
//! destination. New partitions are taken on where the progress group says,
//! or at the start offset.
//!
//! The replicated configs ([`REPLICATED_CONFIGS`]) are those that shape
//! what a topic keeps and accepts: a copy should behave like its source.
//! Settings of the destination cluster's own durability and placement
//! (`min.insync.replicas`, `unclean.leader.election.enable`, throttles,
//! tiered storage) stay the destination's.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use crate::client::metadata::TopicInfo;
use crate::client::protocol::{NewTopic, OffsetSpec};
use crate::client::topics::ConfigChange;
use crate::client::{Client, ClientError};
use crate::config::replicator::StartOffset;
use crate::sync::error_chain;

use super::members::{Assigned, RELEASED};
use super::metrics::ErrorKind;
use super::partitions::{Partition, Tp};
use super::{progress, ReplicateError, Shared};

/// Topic configs copied from the source, and kept equal to it.
pub(crate) const REPLICATED_CONFIGS: &[&str] = &[
    "cleanup.policy",
    "compression.type",
    "delete.retention.ms",
    "max.compaction.lag.ms",
    "max.message.bytes",
    "message.timestamp.after.max.ms",
    "message.timestamp.before.max.ms",
    "message.timestamp.type",
    "min.cleanable.dirty.ratio",
    "min.compaction.lag.ms",
    "retention.bytes",
    "retention.ms",
    "segment.bytes",
    "segment.ms",
];

/// The changes that make `destination`'s replicated overrides those of
/// `source`: set what differs, delete what the source does not set.
pub(crate) fn config_changes(
    source: &BTreeMap<String, String>,
    destination: &BTreeMap<String, String>,
) -> Vec<ConfigChange> {
    let mut changes = Vec::new();
    for key in REPLICATED_CONFIGS {
        match (source.get(*key), destination.get(*key)) {
            (Some(v), d) if d != Some(v) => {
                changes.push(ConfigChange::Set(key.to_string(), v.clone()))
            }
            (None, Some(_)) => changes.push(ConfigChange::Delete(key.to_string())),
            _ => {}
        }
    }
    changes
}

/// The source's replicated overrides, as a created topic's configs.
fn replicated(overrides: &BTreeMap<String, String>) -> Vec<(String, String)> {
    overrides
        .iter()
        .filter(|(k, _)| REPLICATED_CONFIGS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// An error no retry fixes (authorization, a refused config): the run
/// stops and says so.
fn fatal(e: &ClientError) -> bool {
    let e = match e {
        ClientError::GaveUp { last, .. } => last,
        e => e,
    };
    !e.is_retriable()
}

pub(super) async fn discover(shared: Arc<Shared>, source: Client, destination: Client) {
    let mut known: HashMap<String, usize> = HashMap::new();
    let mut backoff = shared.backoff();
    loop {
        let Some(assigned) = shared.assigned() else {
            // A rebalance: nothing to take on until a slot is given.
            shared.assignment_changed.notified().await;
            continue;
        };
        match round(&shared, &source, &destination, &mut known, &assigned).await {
            Ok(()) => {
                if !shared.ready.swap(true, Ordering::AcqRel) {
                    tracing::info!(
                        partitions = shared.table().len(),
                        "every partition taken on"
                    );
                }
                backoff.reset();
                tokio::select! {
                    _ = tokio::time::sleep(shared.config.discovery_interval) => {}
                    _ = shared.assignment_changed.notified() => {}
                }
            }
            Err(e) => {
                let stop = match &e {
                    ReplicateError::Client { source, .. } => fatal(source),
                    ReplicateError::Translation(t) => match t.as_ref() {
                        super::translation::TranslationError::Client { source, .. } => {
                            fatal(source)
                        }
                        _ => true,
                    },
                    _ => true,
                };
                if stop {
                    shared.fail(e);
                    return;
                }
                shared.metrics.error(ErrorKind::Topics);
                let delay = backoff.next_delay();
                tracing::warn!(error = %error_chain(&e), retry_in_ms = delay.as_millis() as u64, "topic discovery failed");
                tokio::time::sleep(delay).await;
            }
        }
    }
}

/// One discovery round: the source's matching topics; the destination
/// follows them (slot 0 only); the slot's partitions not yet copied are
/// taken on.
async fn round(
    shared: &Shared,
    source: &Client,
    destination: &Client,
    known: &mut HashMap<String, usize>,
    assigned: &Assigned,
) -> Result<(), ReplicateError> {
    let info = source
        .metadata(None)
        .await
        .map_err(|e| ReplicateError::client("source topics", e))?;
    let mut topics: Vec<&TopicInfo> = info
        .topics
        .iter()
        .filter(|t| {
            !t.is_internal && !t.name.starts_with("__") && shared.config.copies_topic(&t.name)
        })
        .collect();
    topics.sort_by(|a, b| a.name.cmp(&b.name));
    // The translation saved so far, read once per round that takes
    // partitions on.
    let mut history: Option<Loaded> = None;
    for t in topics {
        let count = t.partitions.len();
        let had = known.get(&t.name).copied().unwrap_or(0);
        if shared.config.create_topics {
            if assigned.slot.follows_topics() {
                follow(shared, source, destination, &t.name, count).await?;
            }
        } else if had < count {
            let dst = destination
                .topic(&t.name)
                .await
                .map_err(|e| ReplicateError::client(format!("destination topic {}", t.name), e))?;
            if dst.partitions.len() < count {
                return Err(ReplicateError::TooFewPartitions {
                    topic: t.name.clone(),
                    destination: dst.partitions.len(),
                    in_source: count,
                });
            }
        }
        known.insert(t.name.clone(), count);
        let wanted: Vec<i32> = {
            let table = shared.table();
            (0..count)
                .filter_map(|p| i32::try_from(p).ok())
                .filter(|p| assigned.slot.owns(&t.name, *p))
                .filter(|p| {
                    !table.contains(&Tp {
                        topic: Arc::from(t.name.as_str()),
                        partition: *p,
                    })
                })
                .collect()
        };
        if !wanted.is_empty() {
            let history = match &mut history {
                Some(h) => h,
                None => history.insert(load_history(shared).await?),
            };
            take_on(
                shared,
                source,
                destination,
                &t.name,
                &wanted,
                assigned,
                history,
            )
            .await?;
        }
    }
    Ok(())
}

/// Makes the destination topic follow the source's: created, grown,
/// reconfigured.
async fn follow(
    shared: &Shared,
    source: &Client,
    destination: &Client,
    topic: &str,
    count: usize,
) -> Result<(), ReplicateError> {
    let context = |what: &str| format!("{what} of topic {topic}");
    let overrides = source
        .topic_overrides(topic)
        .await
        .map_err(|e| ReplicateError::client(context("source configs"), e))?;
    let partitions = i32::try_from(count).unwrap_or(i32::MAX);
    let existing = destination
        .metadata(Some(&[topic]))
        .await
        .map_err(|e| ReplicateError::client(context("destination metadata"), e))?
        .topics
        .into_iter()
        .find(|t| t.name == topic);
    let Some(existing) = existing else {
        let new = NewTopic {
            name: topic.to_string(),
            partitions,
            replication_factor: shared.config.replication_factor,
            configs: replicated(&overrides),
        };
        destination
            .create_topic(&new)
            .await
            .map_err(|e| ReplicateError::client(context("creating the destination"), e))?;
        shared.metrics.topic_created();
        tracing::info!(topic, partitions, configs = ?new.configs, "created the destination topic");
        return Ok(());
    };
    if existing.partitions.len() < count {
        let added = destination
            .create_partitions(topic, partitions)
            .await
            .map_err(|e| {
                ReplicateError::client(context("adding partitions to the destination"), e)
            })?;
        if added {
            shared.metrics.partitions_added();
            tracing::info!(
                topic,
                from = existing.partitions.len(),
                to = count,
                "added partitions to the destination topic"
            );
        }
    }
    let current = destination
        .topic_overrides(topic)
        .await
        .map_err(|e| ReplicateError::client(context("destination configs"), e))?;
    let changes = config_changes(&overrides, &current);
    if !changes.is_empty() {
        destination
            .alter_topic_configs(topic, &changes)
            .await
            .map_err(|e| {
                ReplicateError::client(context("changing the destination's configs"), e)
            })?;
        shared.metrics.config_altered();
        tracing::info!(
            topic,
            ?changes,
            "destination topic configs follow the source"
        );
    }
    Ok(())
}

/// Segments of the link's partitions saved by earlier runs.
type Loaded = std::collections::BTreeMap<(String, i32), crate::mirror::translation::Segments>;

/// The offsets topic's segments of this link (none while the topic does
/// not exist).
async fn load_history(shared: &Shared) -> Result<Loaded, ReplicateError> {
    let topic = shared.config.offsets_topic.as_str();
    let exists = shared
        .offsets
        .metadata(Some(&[topic]))
        .await
        .map_err(|e| ReplicateError::client(format!("metadata of {topic}"), e))?
        .topics
        .iter()
        .any(|t| t.name == topic);
    if !exists {
        return Ok(Loaded::new());
    }
    match super::translation::load(
        &shared.offsets,
        topic,
        &shared.config.link,
        super::partitions::MAX_SEGMENTS,
    )
    .await
    {
        Ok((loaded, skipped)) => {
            if skipped > 0 {
                tracing::warn!(
                    topic,
                    skipped,
                    "records of the offsets topic not understood; passed over"
                );
            }
            Ok(loaded)
        }
        Err(e) => Err(ReplicateError::Translation(Box::new(e))),
    }
}

/// Takes `partitions` of `topic` on: where the progress group says, else
/// at the start offset, never below the source log start. Dropped if the
/// assignment changed meanwhile.
async fn take_on(
    shared: &Shared,
    source: &Client,
    destination: &Client,
    topic: &str,
    partitions: &[i32],
    assigned: &Assigned,
    history: &mut Loaded,
) -> Result<(), ReplicateError> {
    let keys: Vec<(String, i32)> = partitions.iter().map(|p| (topic.to_string(), *p)).collect();
    let committed = progress::committed(shared, destination, &keys).await;
    let (earliest, latest) = tokio::join!(
        source.list_offsets(&keys, OffsetSpec::Earliest),
        source.list_offsets(&keys, OffsetSpec::Latest)
    );
    let earliest =
        earliest.map_err(|e| ReplicateError::client(format!("log starts of {topic}"), e))?;
    let latest = latest.map_err(|e| ReplicateError::client(format!("log ends of {topic}"), e))?;
    let now = Instant::now();
    let config = &shared.config;
    let mut taken = Vec::with_capacity(keys.len());
    for key in &keys {
        let start = earliest.get(key).copied().unwrap_or(0);
        let end = latest.get(key).copied().unwrap_or(start);
        let (resumed, released) = match committed.get(key) {
            Some((offset, metadata)) => (Some(*offset), metadata == RELEASED),
            None => (None, false),
        };
        if let Some(offset) = resumed.filter(|o| *o > end) {
            return Err(ReplicateError::ResumeBeyondEnd {
                group: config.group_id.clone(),
                tp: format!("{}-{}", key.0, key.1),
                offset,
                end,
            });
        }
        let wanted = resumed.unwrap_or_else(|| match config.start_offsets.get(key) {
            Some(offset) => *offset,
            None => match config.start_offset {
                StartOffset::Earliest => start,
                StartOffset::Latest => end,
                StartOffset::At(offset) => offset.min(end),
            },
        });
        let position = wanted.max(start);
        if position > wanted {
            tracing::warn!(
                topic,
                partition = key.1,
                wanted,
                log_start = start,
                "the source log starts after the position; starting at the log start"
            );
        }
        let tp = Tp {
            topic: Arc::from(topic),
            partition: key.1,
        };
        let mut p = Partition::new(&tp, position, end, config.partition_fetch_max_bytes, now);
        // What earlier runs recorded: group offsets before this run's
        // first copy still translate.
        if let Some(saved) = history.remove(key) {
            p.segments = saved;
        }
        p.committed = resumed.unwrap_or(-1);
        p.report.resumed_from = resumed;
        // Its last owner (a previous run, another instance) may have died
        // with requests still at a proxy instance; re-sent through another
        // instance before they land, they would be appended twice. The
        // proxy waits as long for an answer that never came. An owner that
        // gave it back cleanly left nothing in flight (see `members`).
        let hold = assigned.at + config.unknown_outcome_wait;
        if resumed.is_some() && !released && hold > now {
            p.paused_until = Some(hold);
        }
        if config.until_caught_up {
            p.target = Some(end);
        }
        taken.push((tp, p));
    }
    let resumed = taken.iter().filter(|(_, p)| p.committed >= 0).count();
    let held = taken
        .iter()
        .filter(|(_, p)| p.paused_until.is_some())
        .count();
    {
        let mut table = shared.table();
        // Given back meanwhile: the next slot takes them on afresh.
        if !shared.holds(assigned.generation) {
            return Ok(());
        }
        for (tp, p) in taken {
            shared.metrics.partition_added(&tp.topic, tp.partition);
            table.insert(tp, p);
        }
    }
    tracing::info!(
        topic,
        partitions = ?partitions,
        resumed,
        held,
        "partitions taken on"
    );
    shared.metadata_stale.notify_one();
    shared.changed.notify_waiters();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn replicated_configs_follow_the_source_and_nothing_else() {
        let source = map(&[
            ("retention.ms", "1000"),
            ("cleanup.policy", "compact"),
            ("min.insync.replicas", "3"),
        ]);
        let destination = map(&[
            ("retention.ms", "5000"),
            ("segment.ms", "60000"),
            ("cleanup.policy", "compact"),
            ("min.insync.replicas", "1"),
        ]);
        assert_eq!(
            config_changes(&source, &destination),
            [
                ConfigChange::Set("retention.ms".into(), "1000".into()),
                ConfigChange::Delete("segment.ms".into()),
            ]
        );
        assert!(config_changes(&source, &source).is_empty());
        assert_eq!(
            replicated(&source),
            [
                ("cleanup.policy".to_string(), "compact".to_string()),
                ("retention.ms".to_string(), "1000".to_string())
            ]
        );
    }
}
