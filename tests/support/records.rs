//! One test topic's records as the drills write and check them: librdkafka
//! producers (idempotent, transactional with extra settings), values
//! `<tag>-p<partition>-<i>` so that a record is known by its value on
//! either cluster, the partitions' log ends, and every record read back
//! (read_committed, or with the isolation a test asks for).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use super::crate_client::{client, end_offsets};

/// (offset, value) of each committed record, per partition.
pub type Log = BTreeMap<i32, Vec<(i64, String)>>;

/// (offset, key, value) of each record read, per partition.
pub type KeyedLog = BTreeMap<i32, Vec<(i64, String, String)>>;

/// How long a flush or a read may take.
const WAIT: Duration = Duration::from_secs(90);

/// An idempotent producer (`linger.ms=0`), with `extra` settings (e.g. a
/// `transactional.id`).
pub fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<BaseProducer> {
    let mut c = RdConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("linger.ms", "0")
        .set("enable.idempotence", "true");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    Ok(c.create()?)
}

/// A topic of `partitions` partitions.
#[derive(Debug, Clone, Copy)]
pub struct Topic {
    pub name: &'static str,
    pub partitions: i32,
}

impl Topic {
    /// `n` records per partition, values `<tag>-p<partition>-<i>`, flushed.
    pub fn send(&self, p: &BaseProducer, tag: &str, n: usize) -> Result<()> {
        for partition in 0..self.partitions {
            for i in 0..n {
                let v = format!("{tag}-p{partition}-{i}");
                p.send(
                    BaseRecord::<(), _>::to(self.name)
                        .partition(partition)
                        .payload(&v),
                )
                .map_err(|(e, _)| anyhow!("queueing {v}: {e}"))?;
            }
        }
        p.flush(WAIT)?;
        Ok(())
    }

    /// Every partition's log end offset on `bootstrap`.
    pub fn ends(&self, rt: &tokio::runtime::Runtime, bootstrap: &str) -> Result<Vec<i64>> {
        end_offsets(rt, &client(bootstrap), self.name, self.partitions)
    }

    /// Every record a read_committed consumer sees on `bootstrap`, per
    /// partition, up to `ends`.
    pub fn read(&self, bootstrap: &str, ends: &[i64]) -> Result<Log> {
        let keyed = self.read_keyed(bootstrap, "read_committed", ends)?;
        Ok(keyed
            .into_iter()
            .map(|(p, records)| (p, records.into_iter().map(|(o, _, v)| (o, v)).collect()))
            .collect())
    }

    /// Every record a consumer with `isolation` (`read_committed` or
    /// `read_uncommitted`) sees on `bootstrap`, per partition, up to `ends`,
    /// with its key.
    pub fn read_keyed(&self, bootstrap: &str, isolation: &str, ends: &[i64]) -> Result<KeyedLog> {
        let mut config = RdConfig::new();
        config.set("isolation.level", isolation);
        read_with(config, bootstrap, self.name, ends)
    }
}

/// Every record of `topic` on `bootstrap`, per partition, with its key, up
/// to `ends` (the consumer's position reaching each end, so that a
/// trailing transaction marker, never delivered, does not stall it), read
/// by a consumer with `config`'s settings (isolation, security).
pub fn read_with(
    mut config: RdConfig,
    bootstrap: &str,
    topic: &str,
    ends: &[i64],
) -> Result<KeyedLog> {
    let consumer: BaseConsumer = config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "records-verifier")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..i32::try_from(ends.len())? {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out = KeyedLog::new();
    let mut position = vec![0i64; ends.len()];
    let deadline = Instant::now() + WAIT;
    loop {
        for e in consumer.position()?.elements() {
            if let Offset::Offset(o) = e.offset() {
                position[e.partition() as usize] = o;
            }
        }
        if position.iter().zip(ends).all(|(p, e)| p >= e) {
            return Ok(out);
        }
        ensure!(
            Instant::now() < deadline,
            "reading {topic} at {bootstrap}: at {position:?} of {ends:?}"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            let text =
                |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
            out.entry(m.partition()).or_default().push((
                m.offset(),
                text(m.key()),
                text(m.payload()),
            ));
        }
    }
}
