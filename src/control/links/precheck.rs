//! Failover pre-checks: what a failover of a link would do, without doing
//! it (the link's partitions, the live instances that would drain it, each
//! partition's replication delay as this instance measured it), and the
//! `max_delay` guard that refuses to start a failover while a partition's
//! delay is above it, unless forced.
//!
//! The delays are this instance's (`metrics::mirrored`): with several
//! instances, a partition whose link writes went through another one has no
//! delay here (`null`), and does not hold a failover back.

use std::sync::Arc;
use std::time::Duration;

use super::{Control, ControlError};
use crate::control::api::{
    FailoverAction, FailoverDryRun, LiveInstances, PartitionDelay, PartitionRow,
};
use crate::control::io::{BarrierPlacer, Group, Store};
use crate::metrics::mirrored::PartitionFigures;
use crate::mirror::link_state;
use crate::sync::error_chain;

/// What the operator asked of a failover's pre-check.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Precheck {
    /// Refuse to start while a partition's delay is above this.
    pub max_delay: Option<Duration>,
    /// Start even so.
    pub force: bool,
}

/// Partitions named in a refusal's message, at most.
const NAMED_IN_MESSAGE: usize = 20;

/// A new failover held back by `max_delay`: the partitions above it.
#[derive(Debug, thiserror::Error)]
#[error("failover of link '{link}' not started: {} partition(s) have a replication delay above max_delay {} s: {}; retry once the replicator has caught up, or force it (force=true, --force)", over.len(), max.as_secs_f64(), named(over))]
pub(crate) struct DelayTooHigh {
    pub link: String,
    pub max: Duration,
    /// Every partition above `max`, as (topic, partition, delay in seconds).
    pub over: Vec<(Arc<str>, i32, f64)>,
}

/// The first [`NAMED_IN_MESSAGE`] partitions with their delays, and how
/// many more.
fn named(over: &[(Arc<str>, i32, f64)]) -> String {
    let named: Vec<String> = over
        .iter()
        .take(NAMED_IN_MESSAGE)
        .map(|(t, p, d)| format!("{t}-{p} ({d:.3} s)"))
        .collect();
    let more = over.len().saturating_sub(NAMED_IN_MESSAGE);
    if more > 0 {
        format!("{} and {more} more", named.join(", "))
    } else {
        named.join(", ")
    }
}

impl<S: Store, G: Group, B: BarrierPlacer> Control<S, G, B> {
    /// This instance's figures of `link`'s partitions.
    fn figures(&self, link: &str) -> Vec<(Arc<str>, i32, PartitionFigures)> {
        self.metrics
            .link_mirror(link)
            .map(|m| m.partitions())
            .unwrap_or_default()
    }

    /// The partitions of `link` whose delay is above `max`, as (topic,
    /// partition, delay in seconds).
    fn over(&self, link: &str, max: Duration) -> Vec<(Arc<str>, i32, f64)> {
        let max_ms = i64::try_from(max.as_millis()).unwrap_or(i64::MAX);
        self.figures(link)
            .into_iter()
            .filter(|(_, _, f)| f.delay_ms > max_ms)
            .map(|(t, p, f)| (t, p, f.delay_ms as f64 / 1000.0))
            .collect()
    }

    /// Refuses (412) to start a new failover of `name` while a partition's
    /// delay is above `check.max_delay`, unless forced. Resuming a failover
    /// in progress is never held back: the link is STOPPING already.
    pub(crate) fn check_failover(&self, name: &str, check: Precheck) -> Result<(), ControlError> {
        let link = self.link_by_name(name)?;
        let (Some(max), false) = (check.max_delay, check.force) else {
            return Ok(());
        };
        if !link_state::failover_from(name, &self.status(link))? {
            return Ok(());
        }
        let over = self.over(name, max);
        if over.is_empty() {
            return Ok(());
        }
        tracing::warn!(
            link = name,
            partitions = over.len(),
            max_delay_s = max.as_secs_f64(),
            "refused to start a failover: replication delay above max_delay"
        );
        Err(ControlError::DelayTooHigh(DelayTooHigh {
            link: name.to_string(),
            max,
            over,
        }))
    }

    /// What a failover of `name` would do now, changing nothing: whether it
    /// would start (or resume, or be refused, and why), the live instances
    /// that would have to drain the link, and every partition of the link's
    /// topics with its replication delay on this instance.
    pub(crate) async fn failover_dry_run(
        &self,
        name: &str,
        check: Precheck,
    ) -> Result<FailoverDryRun, ControlError> {
        let link = Arc::clone(self.link_by_name(name)?);
        let status = self.status(&link);
        let (action, refused) = match link_state::failover_from(name, &status) {
            Ok(true) => (FailoverAction::Start, None),
            Ok(false) => (FailoverAction::Resume, None),
            // The reason is shown, not handled: its message is the answer.
            Err(conflict) => (FailoverAction::Refuse, Some(conflict.to_string())),
        };
        let live = match self.live_instances().await {
            Ok(live) => LiveInstances::Listed(live),
            Err(e) => LiveInstances::Unknown {
                error: error_chain(&e),
            },
        };
        let figures = self.figures(name);
        let figure = |topic: &str, partition: i32| {
            figures
                .iter()
                .find(|(t, p, _)| &**t == topic && *p == partition)
                .map(|(_, _, f)| *f)
        };
        let (partitions, partitions_error) = match &self.barriers {
            Some(placer) => match placer.partitions(&link).await {
                Ok(mut all) => {
                    all.sort();
                    (all, None)
                }
                Err(e) => (
                    Vec::new(),
                    Some(format!("listing the link's topics: {}", error_chain(&e))),
                ),
            },
            None => (Vec::new(), Some("no state store".to_string())),
        };
        let rows: Vec<PartitionRow> = partitions
            .iter()
            .map(|(topic, partition)| {
                let f = figure(topic, *partition);
                partition_row(topic, *partition, f.as_ref())
            })
            .collect();
        let over: Vec<PartitionDelay> = check
            .max_delay
            .map(|max| self.over(name, max))
            .unwrap_or_default()
            .into_iter()
            .map(|(t, p, d)| PartitionDelay {
                topic: t.to_string(),
                partition: p,
                delay_seconds: d,
            })
            .collect();
        let held_back = action == FailoverAction::Start && !over.is_empty() && !check.force;
        let unknown = rows.iter().filter(|r| r.delay_seconds.is_none()).count();
        Ok(FailoverDryRun {
            link: name.to_string(),
            dry_run: true,
            state: status.state,
            action,
            would_proceed: refused.is_none() && !held_back,
            refused,
            max_delay_seconds: check.max_delay.map(|d| d.as_secs_f64()),
            force: check.force,
            over_max_delay: over,
            live_instances: live,
            partitions_total: rows.len() as u64,
            partitions_without_delay: unknown as u64,
            partitions: rows,
            partitions_error,
        })
    }
}

/// One partition's row, as the pre-check and `GET /links/{name}/partitions`
/// show it.
pub(crate) fn partition_row(
    topic: &str,
    partition: i32,
    f: Option<&PartitionFigures>,
) -> PartitionRow {
    let known = |v: i64| (v >= 0).then_some(v);
    match f {
        None => PartitionRow {
            topic: topic.to_string(),
            partition,
            ..PartitionRow::default()
        },
        Some(f) => PartitionRow {
            topic: topic.to_string(),
            partition,
            delay_seconds: known(f.delay_ms).map(|d| d as f64 / 1000.0),
            last_offset: known(f.last_offset),
            last_timestamp_ms: known(f.newest_create_ms),
            last_mirrored_ms: known(f.mirrored_at_ms),
            records: Some(f.records),
            batches: Some(f.batches),
            bytes: Some(f.bytes),
            duplicates_answered: Some(f.duplicates_answered),
            producers: None,
        },
    }
}
