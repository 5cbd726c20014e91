//! The offset translation on the destination cluster: the replicator saves
//! every partition's new and grown segments (`mirror::translation`) to a
//! compacted topic, `OFFSETS_TOPIC` (`__mirror_offsets`), before each
//! progress commit, and `kafka-mirror-proxy offsets` reads them back.
//!
//! Saved before the commit, so a commit never covers a segment the topic
//! lacks: after a kill, what the next owner sends again (from the commit)
//! is answered as duplicates at their original offsets and rebuilds the
//! same segments, under the same keys. One key per segment (link, topic,
//! partition, source start): a grown segment overwrites itself, and
//! compaction keeps one record of each.
//!
//! Written through the proxy with a client id of its own
//! (`<CLIENT_ID>.offsets`), as a local producer of a local topic: the
//! proxy passes it on untouched.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::client::{Client, ClientError};
use crate::mirror::translation::{self, Segment, Segments};
use crate::state::topic::for_each_record;
use crate::wire::batch::{build, NewBatch, NewRecord};

use super::partitions::Tp;

/// Records per batch written (about 60 bytes each).
const RECORDS_PER_BATCH: usize = 4096;

/// Why saving or reading the translation failed.
#[derive(Debug, thiserror::Error)]
pub enum TranslationError {
    #[error("offsets topic {topic}")]
    Client {
        topic: String,
        #[source]
        source: ClientError,
    },
    #[error("building a batch of the offsets topic")]
    Build(#[from] crate::wire::batch::BuildError),
}

/// The client that writes the offsets topic: the destination's settings
/// with a client id of its own (not the link's: its writes are local).
pub(crate) fn client(destination: &Client) -> Client {
    let mut config = destination.config().clone();
    config.client_id = format!("{}.offsets", config.client_id);
    Client::new(config)
}

/// Creates the offsets topic if it is missing (compacted, one partition).
pub(crate) async fn ensure_topic(client: &Client, topic: &str) -> Result<(), TranslationError> {
    client
        .ensure_compacted_topic(topic, 1)
        .await
        .map(|_| ())
        .map_err(|source| TranslationError::Client {
            topic: topic.to_string(),
            source,
        })
}

/// Writes `segments` of `link` to the offsets topic.
pub(crate) async fn save(
    client: &Client,
    topic: &str,
    link: &str,
    segments: &[(Tp, Segment)],
    now_ms: i64,
) -> Result<(), TranslationError> {
    for chunk in segments.chunks(RECORDS_PER_BATCH) {
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = chunk
            .iter()
            .map(|(tp, s)| {
                (
                    translation::encode_key(link, &tp.topic, tp.partition, s.source_start),
                    translation::encode_value(s),
                )
            })
            .collect();
        let records: Vec<NewRecord<'_>> = encoded
            .iter()
            .map(|(k, v)| NewRecord {
                key: Some(k),
                value: Some(v),
                headers: &[],
                timestamp: now_ms,
            })
            .collect();
        let batch = build(&NewBatch::NO_PRODUCER, &records)?;
        client
            .produce(topic, 0, Bytes::from(batch))
            .await
            .map_err(|source| TranslationError::Client {
                topic: topic.to_string(),
                source,
            })?;
    }
    Ok(())
}

/// Every segment of `link` in the offsets topic, per (topic, partition),
/// keeping at most `max` per partition (the latest). Records that are not
/// understood are counted and passed over.
pub async fn load(
    client: &Client,
    topic: &str,
    link: &str,
    max: usize,
) -> Result<(BTreeMap<(String, i32), Segments>, usize), TranslationError> {
    let err = |source| TranslationError::Client {
        topic: topic.to_string(),
        source,
    };
    let end = client
        .list_offset(topic, 0, crate::client::protocol::OffsetSpec::Latest)
        .await
        .map_err(err)?
        .offset;
    let mut out: BTreeMap<(String, i32), Segments> = BTreeMap::new();
    let mut skipped = 0usize;
    let mut next = 0i64;
    while next < end {
        let fetched = client
            .fetch(topic, 0, next, 4 << 20, Duration::ZERO)
            .await
            .map_err(err)?;
        if fetched.records.is_empty() {
            // Compaction or retention moved the start past `next`.
            if fetched.log_start_offset > next {
                next = fetched.log_start_offset;
                continue;
            }
            break;
        }
        let after = for_each_record(&fetched.records, next, |_, record| {
            let Ok(r) = record else {
                skipped += 1;
                return;
            };
            let decoded = r.key.ok_or(()).and_then(|k| {
                let key = translation::decode_key(k).map_err(|_| ())?;
                let value = r.value.ok_or(())?;
                let segment = translation::decode_value(&key, value).map_err(|_| ())?;
                Ok((key, segment))
            });
            match decoded {
                Ok((key, segment)) if key.link == link => out
                    .entry((key.topic, key.partition))
                    .or_insert_with(|| Segments::new(max))
                    .restore(segment),
                Ok(_) => {}
                Err(()) => skipped += 1,
            }
        });
        if after <= next {
            break;
        }
        next = after;
    }
    Ok((out, skipped))
}

/// A source offset and what it is on the destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Translated {
    pub topic: String,
    pub partition: i32,
    pub source: i64,
    pub destination: translation::Translation,
}

/// Translates `offsets` (committed source offsets) of `link`: the segments
/// from the offsets topic, and the replicator's resume points from its
/// progress group (`progress_group`) on the destination.
pub async fn translate(
    destination: &Client,
    offsets_topic: &str,
    link: &str,
    progress_group: &str,
    offsets: &[((String, i32), i64)],
) -> Result<Vec<Translated>, TranslationError> {
    let (segments, _) = load(destination, offsets_topic, link, usize::MAX).await?;
    let keys: Vec<(String, i32)> = offsets.iter().map(|(k, _)| k.clone()).collect();
    let resume = destination
        .committed_offsets(progress_group, &keys)
        .await
        .map_err(|source| TranslationError::Client {
            topic: offsets_topic.to_string(),
            source,
        })?;
    Ok(offsets
        .iter()
        .map(|((topic, partition), source)| {
            let key = (topic.clone(), *partition);
            let destination = segments
                .get(&key)
                .map_or(translation::Translation::NotYet, |s| {
                    s.translate(*source, resume.get(&key).copied().unwrap_or(-1))
                });
            Translated {
                topic: topic.clone(),
                partition: *partition,
                source: *source,
                destination,
            }
        })
        .collect())
}

/// Translates the committed offsets of `group` on the source: every
/// partition the link's translation knows.
pub(crate) async fn translate_group(
    destination: &Client,
    source: &Client,
    offsets_topic: &str,
    link: &str,
    progress_group: &str,
    group: &str,
) -> Result<Vec<Translated>, TranslationError> {
    let (segments, _) = load(destination, offsets_topic, link, 1).await?;
    let keys: Vec<(String, i32)> = segments.into_keys().collect();
    let committed = source
        .committed_offsets(group, &keys)
        .await
        .map_err(|source| TranslationError::Client {
            topic: format!("committed offsets of {group} on the source"),
            source,
        })?;
    let wanted: Vec<((String, i32), i64)> = committed.into_iter().collect();
    translate(destination, offsets_topic, link, progress_group, &wanted).await
}

impl Translated {
    /// As the replicator's admin API answers it.
    pub(crate) fn to_json(&self) -> serde_json::Value {
        let (destination, translation) = match self.destination {
            translation::Translation::Exact(o) => (Some(o), "exact"),
            translation::Translation::NotYet => (None, "not_copied_yet"),
            translation::Translation::Unknown => (None, "older_than_the_history"),
        };
        serde_json::json!({
            "topic": self.topic,
            "partition": self.partition,
            "source_offset": self.source,
            "destination_offset": destination,
            "translation": translation,
        })
    }
}
