//! What each link mirrored, as the destination broker acknowledged it:
//! records, batches and bytes (Prometheus counters per link), the
//! replication delay (a per-link histogram, and a per-link gauge of the
//! largest delay over its partitions), and per partition the figures the
//! admin API shows (`GET /links/{name}/partitions`) and the failover
//! pre-check reads. Per-partition figures never become Prometheus labels,
//! so the series stay bounded by the configured links.
//!
//! The replication delay of a partition is taken when the destination
//! broker acknowledges a link write: the time of that answer minus the
//! newest CreateTime timestamp of the write's batches (their `maxTimestamp`
//! header field: no record is decoded). Batches marked LogAppendTime carry
//! no producer time and do not count. Taken at acknowledgement, not at
//! scrape, so that a source that went quiet (as before a planned failover)
//! does not look like a lagging mirror.
//!
//! Memory: one entry per partition the broker acknowledged a link write
//! for (so a partition that exists in the destination cluster, of a topic
//! the link mirrors), at most [`MAX_PARTITIONS`] per link; past that, the
//! counters go on and new partitions are left out of the table.

// foldhash: looked up for every acknowledged link write, like the
// producer state's maps.
use foldhash::{HashMap, HashMapExt};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// Partitions one link keeps figures for, at most.
pub(crate) const MAX_PARTITIONS: usize = 100_000;

/// The timestamp-type bit of a record batch's attributes (set: LogAppendTime).
const LOG_APPEND_TIME_FLAG: i16 = 0x08;

/// What one partition entry of a link write holds, summed from its batch
/// headers as the Produce plan reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MirroredBatches {
    pub records: u64,
    pub batches: u64,
    /// Bytes of the record batches (their whole length).
    pub bytes: u64,
    /// Offsets the batches take (the last one is at the base offset plus
    /// this minus one).
    pub offsets: i64,
    /// The newest CreateTime `maxTimestamp` of its data batches; `-1`
    /// when none has one (LogAppendTime, control batches only).
    pub newest_create_ms: i64,
}

impl Default for MirroredBatches {
    fn default() -> Self {
        MirroredBatches {
            records: 0,
            batches: 0,
            bytes: 0,
            offsets: 0,
            newest_create_ms: -1,
        }
    }
}

impl MirroredBatches {
    /// Add one batch, from its header fields.
    #[inline]
    pub(crate) fn add(
        &mut self,
        len: usize,
        record_count: i32,
        last_offset_delta: i32,
        attributes: i16,
        control: bool,
        max_timestamp: i64,
    ) {
        self.batches += 1;
        self.records += u64::try_from(record_count).unwrap_or(0);
        self.bytes += len as u64;
        self.offsets += i64::from(last_offset_delta) + 1;
        if !control && attributes & LOG_APPEND_TIME_FLAG == 0 && max_timestamp >= 0 {
            self.newest_create_ms = self.newest_create_ms.max(max_timestamp);
        }
    }
}

/// One partition's figures on this instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartitionFigures {
    /// Offset of the last record the broker acknowledged (`-1`: none yet).
    pub last_offset: i64,
    /// The newest CreateTime timestamp mirrored (`-1`: none).
    pub newest_create_ms: i64,
    /// The replication delay when the newest CreateTime write was
    /// acknowledged, ms (`-1`: no CreateTime batch mirrored).
    pub delay_ms: i64,
    /// When the broker last acknowledged a write of the partition
    /// (`-1`: never).
    pub mirrored_at_ms: i64,
    pub records: u64,
    pub batches: u64,
    pub bytes: u64,
    /// Link batches answered as duplicates (already appended).
    pub duplicates_answered: u64,
}

impl Default for PartitionFigures {
    fn default() -> Self {
        PartitionFigures {
            last_offset: -1,
            newest_create_ms: -1,
            delay_ms: -1,
            mirrored_at_ms: -1,
            records: 0,
            batches: 0,
            bytes: 0,
            duplicates_answered: 0,
        }
    }
}

type Table = HashMap<Arc<str>, HashMap<i32, PartitionFigures>>;

/// One link's figures.
pub(crate) struct LinkMirror {
    records: Counter,
    batches: Counter,
    bytes: Counter,
    delay: Histogram,
    /// Set from the table when rendered.
    delay_max: Gauge<f64, AtomicU64>,
    /// topic → partition → figures. A std mutex, held for a few map
    /// operations per acknowledged write and never across an await.
    partitions: Mutex<Table>,
}

/// The handles [`LinkMirror::new`] registers, one per family.
pub(super) struct Families {
    records: prometheus_client::metrics::family::Family<super::LinkLabels, Counter>,
    batches: prometheus_client::metrics::family::Family<super::LinkLabels, Counter>,
    bytes: prometheus_client::metrics::family::Family<super::LinkLabels, Counter>,
    delay:
        prometheus_client::metrics::family::Family<super::LinkLabels, Histogram, fn() -> Histogram>,
    delay_max: prometheus_client::metrics::family::Family<super::LinkLabels, Gauge<f64, AtomicU64>>,
}

/// Buckets of the delay histogram, seconds: 5 ms to about 11.6 h.
pub(super) fn delay_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 24))
}

impl Families {
    pub(super) fn new() -> Families {
        Families {
            records: Default::default(),
            batches: Default::default(),
            bytes: Default::default(),
            delay: prometheus_client::metrics::family::Family::new_with_constructor(
                delay_histogram,
            ),
            delay_max: Default::default(),
        }
    }

    pub(super) fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "mirror_records",
            "Records of link writes the destination broker acknowledged, by link",
            self.records.clone(),
        );
        registry.register(
            "mirror_batches",
            "Record batches of link writes the destination broker acknowledged, by link",
            self.batches.clone(),
        );
        registry.register(
            "mirror_bytes",
            "Bytes of record batches of link writes the destination broker acknowledged, by link",
            self.bytes.clone(),
        );
        registry.register(
            "mirror_replication_delay_seconds",
            "Replication delay of each acknowledged link write of a partition: the broker's answer time minus the newest CreateTime timestamp of its batches, by link",
            self.delay.clone(),
        );
        registry.register(
            "mirror_replication_delay_max_seconds",
            "Largest replication delay over a link's partitions, each as of its latest acknowledged CreateTime write (0 before any), by link",
            self.delay_max.clone(),
        );
    }

    pub(super) fn link(&self, label: &super::LinkLabels) -> LinkMirror {
        LinkMirror {
            records: self.records.get_or_create_owned(label),
            batches: self.batches.get_or_create_owned(label),
            bytes: self.bytes.get_or_create_owned(label),
            delay: self.delay.get_or_create_owned(label),
            delay_max: self.delay_max.get_or_create_owned(label),
            partitions: Mutex::new(HashMap::new()),
        }
    }
}

impl LinkMirror {
    fn table(&self) -> MutexGuard<'_, Table> {
        crate::sync::lock(&self.partitions)
    }

    /// The broker acknowledged `m` of `topic`-`partition` (its name, when
    /// known) at `base_offset`, answering at `now_ms`.
    pub(crate) fn acknowledged(
        &self,
        topic: Option<&str>,
        partition: i32,
        m: &MirroredBatches,
        base_offset: i64,
        now_ms: i64,
    ) {
        self.records.inc_by(m.records);
        self.batches.inc_by(m.batches);
        self.bytes.inc_by(m.bytes);
        let delay_ms = match m.newest_create_ms {
            t if t >= 0 => {
                let d = now_ms.saturating_sub(t).max(0);
                self.delay.observe(d as f64 / 1000.0);
                d
            }
            _ => -1,
        };
        let Some(topic) = topic else {
            return;
        };
        self.with_partition(topic, partition, |f| {
            f.last_offset = f.last_offset.max(base_offset + m.offsets - 1);
            f.mirrored_at_ms = now_ms;
            f.records += m.records;
            f.batches += m.batches;
            f.bytes += m.bytes;
            if delay_ms >= 0 && m.newest_create_ms >= f.newest_create_ms {
                f.newest_create_ms = m.newest_create_ms;
                f.delay_ms = delay_ms;
            }
        });
    }

    /// `batches` of `topic`-`partition` were answered as duplicates.
    pub(crate) fn duplicates(&self, topic: &str, partition: i32, batches: u64) {
        self.with_partition(topic, partition, |f| f.duplicates_answered += batches);
    }

    fn with_partition(
        &self,
        topic: &str,
        partition: i32,
        update: impl FnOnce(&mut PartitionFigures),
    ) {
        let mut table = self.table();
        if let Some(f) = table.get_mut(topic).and_then(|t| t.get_mut(&partition)) {
            update(f);
            return;
        }
        // A new partition: the rare path, with the count checked.
        let known: usize = table.values().map(HashMap::len).sum();
        if known >= MAX_PARTITIONS {
            return;
        }
        let mut f = PartitionFigures::default();
        update(&mut f);
        match table.get_mut(topic) {
            Some(t) => {
                t.insert(partition, f);
            }
            None => {
                let mut t = HashMap::with_capacity(1);
                t.insert(partition, f);
                table.insert(Arc::from(topic), t);
            }
        }
    }

    /// Every partition's figures, by topic and partition.
    pub(crate) fn partitions(&self) -> Vec<(Arc<str>, i32, PartitionFigures)> {
        let table = self.table();
        let mut out: Vec<_> = table
            .iter()
            .flat_map(|(t, ps)| ps.iter().map(|(p, f)| (Arc::clone(t), *p, *f)))
            .collect();
        drop(table);
        out.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        out
    }

    /// Set the gauge of the largest delay from the table (before a render).
    pub(super) fn refresh_gauge(&self) {
        let max = self
            .table()
            .values()
            .flat_map(HashMap::values)
            .map(|f| f.delay_ms)
            .max()
            .unwrap_or(-1);
        self.delay_max.set(max.max(0) as f64 / 1000.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link() -> LinkMirror {
        Families::new().link(&crate::metrics::LinkLabels { link: "x".into() })
    }

    #[test]
    fn log_append_time_and_control_batches_carry_no_delay() {
        let mut m = MirroredBatches::default();
        m.add(100, 3, 2, 0, false, 5_000);
        m.add(80, 1, 0, LOG_APPEND_TIME_FLAG, false, 9_000);
        m.add(70, 1, 0, 0x20, true, 9_000);
        assert_eq!(
            m,
            MirroredBatches {
                records: 5,
                batches: 3,
                bytes: 250,
                offsets: 5,
                newest_create_ms: 5_000,
            }
        );
        let l = link();
        l.acknowledged(Some("t"), 0, &m, 10, 7_500);
        let only_lat = {
            let mut m = MirroredBatches::default();
            m.add(80, 1, 0, LOG_APPEND_TIME_FLAG, false, 1);
            m
        };
        l.acknowledged(Some("t"), 1, &only_lat, 0, 7_500);
        let p = l.partitions();
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].2.last_offset, 14);
        assert_eq!(p[0].2.delay_ms, 2_500);
        assert_eq!(p[1].2.delay_ms, -1);
        l.refresh_gauge();
        assert_eq!(l.delay_max.get(), 2.5);
    }

    #[test]
    fn the_table_is_bounded() {
        let l = link();
        let m = MirroredBatches::default();
        for p in 0..(MAX_PARTITIONS as i32 + 10) {
            l.acknowledged(Some("t"), p, &m, 0, 0);
        }
        assert_eq!(l.partitions().len(), MAX_PARTITIONS);
        assert_eq!(l.records.get(), 0);
    }
}
