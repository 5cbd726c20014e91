//! The replicator's Prometheus metrics, `kafka_mirror_replicator_*`, every
//! series labelled with the link. Each family a dashboard or alert reads is
//! present from the start at zero for every label set known then (error
//! kinds, and each partition once it is taken on), so that `increase()`
//! sees the first event.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(crate) use crate::metrics::CONTENT_TYPE;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct LinkLabels {
    pub link: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct TopicLabels {
    pub link: String,
    pub topic: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct PartitionLabels {
    pub link: String,
    pub topic: String,
    pub partition: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub link: String,
    pub kind: String,
}

/// What went wrong, as the `kind` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// A source Fetch or one partition's answer in it.
    Fetch,
    /// A Produce, or one partition's answer in it (retried).
    Produce,
    /// Metadata of either cluster.
    Metadata,
    /// Committing or reading the progress.
    Commit,
    /// Creating or changing a destination topic.
    Topics,
    /// A source offset no longer in the log (the copy resumes elsewhere).
    OffsetOutOfRange,
    /// The instances' group on the source (join, sync, heartbeat).
    Membership,
    /// Reading source groups' offsets or committing them on the destination.
    Groups,
}

impl ErrorKind {
    pub(crate) const ALL: [ErrorKind; 8] = [
        ErrorKind::Fetch,
        ErrorKind::Produce,
        ErrorKind::Metadata,
        ErrorKind::Commit,
        ErrorKind::Topics,
        ErrorKind::OffsetOutOfRange,
        ErrorKind::Membership,
        ErrorKind::Groups,
    ];

    fn label(self) -> &'static str {
        match self {
            ErrorKind::Fetch => "fetch",
            ErrorKind::Produce => "produce",
            ErrorKind::Metadata => "metadata",
            ErrorKind::Commit => "commit",
            ErrorKind::Topics => "topics",
            ErrorKind::OffsetOutOfRange => "offset_out_of_range",
            ErrorKind::Membership => "membership",
            ErrorKind::Groups => "groups",
        }
    }
}

/// The replicator's metrics.
pub(crate) struct Metrics {
    registry: Registry,
    link: String,
    records: Family<TopicLabels, Counter>,
    bytes: Family<TopicLabels, Counter>,
    batches: Family<TopicLabels, Counter>,
    duplicates: Family<LinkLabels, Counter>,
    lag_records: Family<PartitionLabels, Gauge>,
    lag_seconds: Family<PartitionLabels, Gauge<f64, AtomicU64>>,
    topics_created: Family<LinkLabels, Counter>,
    partitions_added: Family<LinkLabels, Counter>,
    configs_altered: Family<LinkLabels, Counter>,
    errors: Family<ErrorLabels, Counter>,
    fenced: Family<LinkLabels, Gauge>,
    partitions: Family<LinkLabels, Gauge>,
    buffered_bytes: Family<LinkLabels, Gauge>,
    commits: Family<LinkLabels, Counter>,
    rebalances: Family<LinkLabels, Counter>,
    member: Family<LinkLabels, Gauge>,
    group_offsets: Family<LinkLabels, Counter>,
}

impl Metrics {
    pub(crate) fn new(link: &str) -> Metrics {
        let mut registry = Registry::with_prefix("kafka_mirror_replicator");
        let m = Metrics {
            registry: Registry::default(),
            link: link.to_string(),
            records: Family::default(),
            bytes: Family::default(),
            batches: Family::default(),
            duplicates: Family::default(),
            lag_records: Family::default(),
            lag_seconds: Family::default(),
            topics_created: Family::default(),
            partitions_added: Family::default(),
            configs_altered: Family::default(),
            errors: Family::default(),
            fenced: Family::default(),
            partitions: Family::default(),
            buffered_bytes: Family::default(),
            commits: Family::default(),
            rebalances: Family::default(),
            member: Family::default(),
            group_offsets: Family::default(),
        };
        registry.register(
            "records_copied",
            "Records acknowledged by the destination",
            m.records.clone(),
        );
        registry.register(
            "bytes_copied",
            "Batch bytes acknowledged by the destination",
            m.bytes.clone(),
        );
        registry.register(
            "batches_copied",
            "Batches acknowledged by the destination",
            m.batches.clone(),
        );
        registry.register(
            "duplicates_answered",
            "Re-sent batches the destination already held (answered with their original offsets)",
            m.duplicates.clone(),
        );
        registry.register(
            "partition_lag_records",
            "Source high watermark minus the acknowledged position",
            m.lag_records.clone(),
        );
        registry.register(
            "partition_lag_seconds",
            "How long the destination partition has been behind the source (0 when caught up)",
            m.lag_seconds.clone(),
        );
        registry.register(
            "topics_created",
            "Destination topics created",
            m.topics_created.clone(),
        );
        registry.register(
            "partitions_added",
            "Destination topics grown to the source's partition count",
            m.partitions_added.clone(),
        );
        registry.register(
            "configs_altered",
            "Destination topic configurations changed to follow the source",
            m.configs_altered.clone(),
        );
        registry.register(
            "errors",
            "Errors by kind (each retried unless it stopped the replicator)",
            m.errors.clone(),
        );
        registry.register(
            "fenced",
            "1 once the proxy fenced the link (failed over)",
            m.fenced.clone(),
        );
        registry.register(
            "partitions",
            "Source partitions being copied",
            m.partitions.clone(),
        );
        registry.register(
            "buffered_bytes",
            "Fetched bytes not yet acknowledged by the destination",
            m.buffered_bytes.clone(),
        );
        registry.register("commits", "Progress commits", m.commits.clone());
        registry.register(
            "rebalances",
            "Times this instance gave its partitions back to a rebalance of the link's instances",
            m.rebalances.clone(),
        );
        registry.register(
            "member",
            "1 while this instance holds a slot in the link's instances group (or copies alone)",
            m.member.clone(),
        );
        registry.register(
            "group_offsets_synced",
            "Partition offsets of source consumer groups committed on the destination",
            m.group_offsets.clone(),
        );
        let l = m.link_labels();
        for family in [
            &m.duplicates,
            &m.topics_created,
            &m.partitions_added,
            &m.configs_altered,
            &m.commits,
            &m.rebalances,
            &m.group_offsets,
        ] {
            let _ = family.get_or_create(&l);
        }
        let _ = m.fenced.get_or_create(&l);
        let _ = m.member.get_or_create(&l);
        let _ = m.partitions.get_or_create(&l);
        let _ = m.buffered_bytes.get_or_create(&l);
        for kind in ErrorKind::ALL {
            let _ = m.errors.get_or_create(&m.error_labels(kind));
        }
        Metrics { registry, ..m }
    }

    fn link_labels(&self) -> LinkLabels {
        LinkLabels {
            link: self.link.clone(),
        }
    }

    fn error_labels(&self, kind: ErrorKind) -> ErrorLabels {
        ErrorLabels {
            link: self.link.clone(),
            kind: kind.label().to_string(),
        }
    }

    fn topic_labels(&self, topic: &str) -> TopicLabels {
        TopicLabels {
            link: self.link.clone(),
            topic: topic.to_string(),
        }
    }

    fn partition_labels(&self, topic: &str, partition: i32) -> PartitionLabels {
        PartitionLabels {
            link: self.link.clone(),
            topic: topic.to_string(),
            partition: partition.to_string(),
        }
    }

    /// A partition is taken on: its series start at zero.
    pub(crate) fn partition_added(&self, topic: &str, partition: i32) {
        let t = self.topic_labels(topic);
        let _ = self.records.get_or_create(&t);
        let _ = self.bytes.get_or_create(&t);
        let _ = self.batches.get_or_create(&t);
        let p = self.partition_labels(topic, partition);
        let _ = self.lag_records.get_or_create(&p);
        let _ = self.lag_seconds.get_or_create(&p);
    }

    /// A partition moved to another instance: its lag is theirs to say.
    pub(crate) fn partition_removed(&self, topic: &str, partition: i32) {
        let p = self.partition_labels(topic, partition);
        self.lag_records.remove(&p);
        self.lag_seconds.remove(&p);
    }

    pub(crate) fn group_offsets_synced(&self, partitions: usize) {
        let _ = self
            .group_offsets
            .get_or_create(&self.link_labels())
            .inc_by(partitions as u64);
    }

    pub(crate) fn rebalanced(&self) {
        let _ = self.rebalances.get_or_create(&self.link_labels()).inc();
    }

    pub(crate) fn set_member(&self, member: bool) {
        let _ = self
            .member
            .get_or_create(&self.link_labels())
            .set(i64::from(member));
    }

    pub(crate) fn copied(&self, topic: &str, records: u64, bytes: u64) {
        let t = self.topic_labels(topic);
        let _ = self.records.get_or_create(&t).inc_by(records);
        let _ = self.bytes.get_or_create(&t).inc_by(bytes);
        let _ = self.batches.get_or_create(&t).inc();
    }

    pub(crate) fn duplicate(&self) {
        let _ = self.duplicates.get_or_create(&self.link_labels()).inc();
    }

    pub(crate) fn lag(&self, topic: &str, partition: i32, records: i64, behind: Duration) {
        let p = self.partition_labels(topic, partition);
        let _ = self.lag_records.get_or_create(&p).set(records);
        let _ = self.lag_seconds.get_or_create(&p).set(behind.as_secs_f64());
    }

    pub(crate) fn error(&self, kind: ErrorKind) {
        let _ = self.errors.get_or_create(&self.error_labels(kind)).inc();
    }

    pub(crate) fn topic_created(&self) {
        let _ = self.topics_created.get_or_create(&self.link_labels()).inc();
    }

    pub(crate) fn partitions_added(&self) {
        let _ = self
            .partitions_added
            .get_or_create(&self.link_labels())
            .inc();
    }

    pub(crate) fn config_altered(&self) {
        let _ = self
            .configs_altered
            .get_or_create(&self.link_labels())
            .inc();
    }

    pub(crate) fn set_fenced(&self) {
        let _ = self.fenced.get_or_create(&self.link_labels()).set(1);
    }

    pub(crate) fn committed(&self) {
        let _ = self.commits.get_or_create(&self.link_labels()).inc();
    }

    pub(crate) fn gauges(&self, partitions: usize, buffered: usize) {
        let l = self.link_labels();
        self.partitions
            .get_or_create(&l)
            .set(i64::try_from(partitions).unwrap_or(i64::MAX));
        self.buffered_bytes
            .get_or_create(&l)
            .set(i64::try_from(buffered).unwrap_or(i64::MAX));
    }

    /// The Prometheus text exposition.
    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alert_series_are_there_at_zero_before_any_event() {
        let m = Metrics::new("east");
        let text = m.render();
        for series in [
            "kafka_mirror_replicator_errors_total{link=\"east\",kind=\"produce\"} 0",
            "kafka_mirror_replicator_fenced{link=\"east\"} 0",
            "kafka_mirror_replicator_duplicates_answered_total{link=\"east\"} 0",
            "kafka_mirror_replicator_topics_created_total{link=\"east\"} 0",
            "kafka_mirror_replicator_rebalances_total{link=\"east\"} 0",
            "kafka_mirror_replicator_member{link=\"east\"} 0",
            "kafka_mirror_replicator_errors_total{link=\"east\",kind=\"membership\"} 0",
        ] {
            assert!(text.contains(series), "{series} missing from:\n{text}");
        }
        m.partition_added("t", 3);
        m.copied("t", 10, 1000);
        m.lag("t", 3, 5, Duration::from_millis(1500));
        let text = m.render();
        assert!(text.contains(
            "kafka_mirror_replicator_records_copied_total{link=\"east\",topic=\"t\"} 10"
        ));
        assert!(text.contains(
            "kafka_mirror_replicator_partition_lag_seconds{link=\"east\",topic=\"t\",partition=\"3\"} 1.5"
        ));
        m.partition_removed("t", 3);
        assert!(!m.render().contains("partition=\"3\""));
    }
}
