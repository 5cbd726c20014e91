//! Consumer group offsets follow (SPEC §12, issue 43): every
//! `GROUP_SYNC_INTERVAL_MS` the source groups that `GROUPS` matches have
//! their committed offsets of this instance's partitions translated
//! (`mirror::translation`, the segments this run recorded) and committed
//! on the destination, through the proxy, so that a consumer moved there
//! after a failover resumes at the same next record.
//!
//! - A group with a member on the destination is never touched: its
//!   consumers own their offsets there.
//! - Only exact translations are committed: an offset past what was copied
//!   waits for the copy; one older than this run's history is left alone
//!   (its partition is synced once the group commits past it).
//! - A translated offset is at most the destination offset after the last
//!   copied record: never past the destination's high watermark.
//! - Each instance syncs the partitions it copies (its slot), so instances
//!   share this work as they share the copy.

use std::collections::HashMap;
use std::sync::Arc;

use crate::client::offsets::Offsets;
use crate::client::{Client, ClientError};
use crate::mirror::translation::Translation;
use crate::sync::error_chain;

use super::metrics::ErrorKind;
use super::partitions::Tp;
use super::Shared;

/// DescribeGroups of a group the coordinator does not know (Kafka 4).
const GROUP_ID_NOT_FOUND: i16 = 69;

/// Offsets last committed on the destination, by (group, topic, partition).
type Synced = HashMap<(String, String, i32), i64>;

pub(super) async fn sync(shared: Arc<Shared>, source: Client, destination: Client) {
    if shared.config.groups.is_empty() {
        return;
    }
    let mut synced = Synced::new();
    loop {
        tokio::time::sleep(shared.config.group_sync_interval).await;
        if shared.stopping() {
            return;
        }
        if let Err(e) = round(&shared, &source, &destination, &mut synced).await {
            shared.metrics.error(ErrorKind::Groups);
            tracing::warn!(error = %error_chain(&e), "consumer group offset sync failed; trying again next interval");
        }
    }
}

/// What to commit for `committed` (a source group's offsets): the exact
/// translations that differ from what was committed last.
fn translate(shared: &Shared, group: &str, committed: &Offsets, synced: &Synced) -> Offsets {
    let table = shared.table();
    committed
        .iter()
        .filter_map(|((topic, partition), offset)| {
            let tp = Tp {
                topic: Arc::from(topic.as_str()),
                partition: *partition,
            };
            let p = table.get(&tp)?;
            let Translation::Exact(d) = p.segments.translate(*offset, p.acked) else {
                return None;
            };
            let key = (group.to_string(), topic.clone(), *partition);
            (synced.get(&key) != Some(&d)).then(|| ((topic.clone(), *partition), d))
        })
        .collect()
}

async fn round(
    shared: &Shared,
    source: &Client,
    destination: &Client,
    synced: &mut Synced,
) -> Result<(), ClientError> {
    let owned: Vec<(String, i32)> = shared
        .table()
        .iter()
        .map(|(tp, _)| (tp.topic.to_string(), tp.partition))
        .collect();
    if owned.is_empty() {
        return Ok(());
    }
    let groups: Vec<String> = source
        .list_groups()
        .await?
        .into_iter()
        .filter(|g| shared.config.syncs_group(g))
        .collect();
    for group in groups {
        let committed = match source.committed_offsets(&group, &owned).await {
            Ok(c) if c.is_empty() => continue,
            Ok(c) => c,
            Err(e) => {
                tracing::debug!(%group, error = %error_chain(&e), "committed offsets of a source group");
                continue;
            }
        };
        match destination.describe_group(&group).await {
            Ok(there) if !there.members.is_empty() => {
                tracing::debug!(%group, members = there.members.len(), "active on the destination: not touched");
                continue;
            }
            Ok(_) => {}
            // Not there yet: the commit creates it.
            Err(e) if e.code() == Some(GROUP_ID_NOT_FOUND) => {}
            Err(e) => return Err(e),
        }
        let due = translate(shared, &group, &committed, synced);
        if due.is_empty() {
            continue;
        }
        match destination.commit_offsets(&group, &due).await {
            Ok(()) => {}
            // A member joined meanwhile: its offsets are its own now.
            Err(e) if e.code().is_some() => {
                tracing::debug!(%group, error = %error_chain(&e), "the destination group refused the commit");
                continue;
            }
            Err(e) => return Err(e),
        }
        let first = !synced.keys().any(|(g, _, _)| *g == group);
        for ((topic, partition), offset) in &due {
            synced.insert((group.clone(), topic.clone(), *partition), *offset);
        }
        shared.metrics.group_offsets_synced(due.len());
        if first {
            tracing::info!(%group, partitions = due.len(), "consumer group offsets follow onto the destination");
        }
    }
    Ok(())
}
