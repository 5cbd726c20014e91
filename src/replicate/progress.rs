//! The replicator's progress: the acknowledged resume point of every
//! partition, committed as a standalone consumer to `GROUP_ID` on the
//! destination cluster (through the proxy, which passes group requests
//! on), and read back when a partition is taken on. Kafka's own tools
//! show and reset it (`kafka-consumer-groups.sh --describe --group
//! replicator.mirror-<link>` against the destination).
//!
//! Why the destination: a partition may not have more than the proxy's
//! duplicate window of acknowledged batches uncommitted (see
//! `partitions`), so commits are frequent; a disaster-recovery replicator
//! sits next to the destination, and a commit across the region would cap
//! every partition at a few batches per round trip. Kafka's MirrorMaker 2
//! keeps its source offsets in the target cluster too.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::client::offsets::{Marked, Offsets};
use crate::client::{Client, ClientError};
use crate::sync::error_chain;

use super::metrics::ErrorKind;
use super::translation::{self, TranslationError};
use super::Shared;

/// Commits every commit interval, and at once when a partition waits for
/// it.
pub(super) async fn commit_loop(shared: Arc<Shared>, destination: Client) {
    let mut backoff = shared.backoff();
    loop {
        tokio::select! {
            _ = shared.commit_wanted.notified() => {}
            _ = tokio::time::sleep(shared.config.commit_interval) => {}
        }
        if shared.stopping() {
            // The run commits last itself.
            std::future::pending::<()>().await;
        }
        match commit(&shared, &destination).await {
            Ok(()) => backoff.reset(),
            Err(e) => {
                shared.metrics.error(ErrorKind::Commit);
                let delay = backoff.next_delay();
                tracing::warn!(group = %shared.config.group_id, error = %error_chain(&e),
                    retry_in_ms = delay.as_millis() as u64, "progress commit failed");
                tokio::time::sleep(delay).await;
                // A partition may still be waiting.
                shared.commit_wanted.notify_one();
            }
        }
    }
}

/// Why a commit did not happen.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CommitError {
    #[error("saving the offset translation first")]
    Translation(#[from] TranslationError),
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// Saves the translation segments that changed, before a commit covers
/// them (see `translation`); on failure they are due again.
async fn save_translation(shared: &Shared) -> Result<(), TranslationError> {
    let unsaved = shared.table().take_unsaved();
    if unsaved.is_empty() {
        return Ok(());
    }
    let topic = &shared.config.offsets_topic;
    let saved = async {
        if !shared.offsets_topic_ready.load(Ordering::Acquire) {
            translation::ensure_topic(&shared.offsets, topic).await?;
            shared.offsets_topic_ready.store(true, Ordering::Release);
        }
        translation::save(
            &shared.offsets,
            topic,
            &shared.config.link,
            &unsaved,
            crate::state::now_ms(),
        )
        .await
    }
    .await;
    if saved.is_err() {
        shared.table().unsave(&unsaved);
    }
    saved
}

/// One commit of every resume point that moved. Once the run is stopping
/// it commits nothing: the run's last commit ([`commit_all`]) covers
/// everything, marked, and must not be overtaken by an unmarked one.
pub(super) async fn commit(shared: &Shared, destination: &Client) -> Result<(), CommitError> {
    let _one_at_a_time = shared.committing.lock().await;
    if shared.stopping() {
        return Ok(());
    }
    let due = shared.table().to_commit();
    if due.is_empty() {
        return Ok(());
    }
    save_translation(shared).await?;
    let offsets: Offsets = due
        .iter()
        .map(|(tp, offset, _)| ((tp.topic.to_string(), tp.partition), *offset))
        .collect();
    destination
        .commit_offsets(&shared.config.group_id, &offsets)
        .await?;
    shared.table().committed(&due);
    shared.commits.fetch_add(1, Ordering::Relaxed);
    shared.metrics.committed();
    shared.changed.notify_waiters();
    tracing::debug!(partitions = due.len(), "progress committed");
    Ok(())
}

/// Commits the resume point of every partition, moved or not, with
/// `metadata` beside it (see `members`: the commit that gives partitions
/// back).
pub(super) async fn commit_all(
    shared: &Shared,
    destination: &Client,
    metadata: &str,
) -> Result<(), CommitError> {
    // After a commit under way: what it took unsaved is saved (or due
    // again) before these resume points go out.
    let _one_at_a_time = shared.committing.lock().await;
    save_translation(shared).await?;
    let all = shared.table().resume_points();
    let offsets: Offsets = all
        .iter()
        .map(|(tp, offset, _)| ((tp.topic.to_string(), tp.partition), *offset))
        .collect();
    destination
        .commit_offsets_marked(&shared.config.group_id, &offsets, metadata)
        .await?;
    shared.table().committed(&all);
    shared.commits.fetch_add(1, Ordering::Relaxed);
    shared.metrics.committed();
    Ok(())
}

/// What the group holds for `partitions`, with each commit's metadata,
/// retried until it answers (a
/// coordinator still loading, a proxy restarting).
pub(super) async fn committed(
    shared: &Shared,
    destination: &Client,
    partitions: &[(String, i32)],
) -> Marked {
    let mut backoff = shared.backoff();
    loop {
        match destination
            .committed_marked(&shared.config.group_id, partitions)
            .await
        {
            Ok(offsets) => return offsets,
            Err(e) => {
                shared.metrics.error(ErrorKind::Commit);
                let delay = backoff.next_delay().max(Duration::from_millis(100));
                tracing::warn!(group = %shared.config.group_id, error = %error_chain(&e),
                    retry_in_ms = delay.as_millis() as u64, "reading the progress failed");
                tokio::time::sleep(delay).await;
            }
        }
    }
}
