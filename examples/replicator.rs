//! Replicator: the tool that feeds kafka-mirror-proxy with mirrored traffic.
//!
//! It copies record batches byte for byte from a source Kafka cluster to a
//! destination cluster (normally through the proxy), keeping the source
//! producer IDs, epochs and sequences: exactly the traffic the proxy has to
//! remap (SPEC §1–§3). It talks to both clusters with the crate's own Kafka
//! client (`kafka_mirror_proxy::client`, the one the proxy uses), which moves
//! record batches as raw bytes; client libraries would re-encode batches and
//! assign their own producer IDs. The one field it changes is baseOffset,
//! zeroed because Kafka 4 brokers refuse anything else from a client; it lies
//! outside the CRC (see `RawBatch::produce_bytes`).
//!
//! Transactions: the source is read with `read_committed` by default, and
//! the batches of aborted transactions are dropped with the algorithm Kafka's
//! consumer uses (`wire::aborted`), from the aborted-transaction list of each
//! Fetch response. Control batches (transaction markers) are skipped: brokers
//! refuse them from clients. So the destination holds the committed
//! transactional batches (transactional attribute and CRC untouched) and
//! no markers; see docs/design.md ("Transactions") for why a read_committed
//! consumer of the destination still reads them. `--isolation-level
//! read_uncommitted` copies every data batch, aborted ones included.
//!
//! Each partition is copied in order, one Produce in flight at a time, each
//! request holding exactly one batch. The partitions are those the source
//! topics have at start.
//!
//! Progress: the replicator commits its source positions to a consumer
//! group on the *source* cluster (`--group-id`, by default
//! `replicator.<client id>`), and only positions the destination
//! acknowledged: a position moves past a batch once its Produce was
//! answered. On start it resumes from the committed offsets (a partition
//! without one starts at `--start-offset`). A kill therefore loses nothing
//! and re-sends the batches acknowledged since the last commit; the proxy
//! recognises those as duplicates (SPEC §6) and answers them with their
//! original offsets, so nothing is appended twice. It recognises the last 5
//! batches of each producer in a partition (Kafka's
//! `NUM_BATCHES_TO_RETAIN`), so a partition's position is committed at the
//! latest after 5 acknowledged batches (`--commit-every-batches`), besides
//! every `--commit-interval-ms` and when stopping.
//!
//! Run it against a source cluster and the proxy (or, for experiments, a
//! destination broker directly):
//!
//! ```text
//! cargo run --example replicator -- --source 127.0.0.1:9092 \
//!     --destination 127.0.0.1:19092 --topics t --client-id mirror-a
//! ```
//!
//! `--help` lists every flag. Integration tests include this file with
//! `#[path = "../examples/replicator.rs"] mod replicator;` and call
//! `replicate` directly; only `main` touches process arguments and exit codes.
//!
//! Protocol versions are the client's: the highest both sides know (Fetch
//! and Produce by topic id against Kafka 4). A broker verifies a
//! transactional batch against the transaction coordinator (KIP-890) only
//! when it has a producer id (`>= 0`); through the proxy every copied batch
//! has a mapped, negative producer id, which a broker treats as "no
//! producer", so none of that applies. Straight into a Kafka 4.4 broker,
//! without the proxy, a copied transactional batch is refused
//! (`NOT_ENOUGH_REPLICAS`, "Unable to verify the partition has been added
//! to the transaction"; see docs/design.md, "Transactions").

// The file is also compiled as a module of integration tests, which use only
// part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::{Bytes, BytesMut};
use kafka_mirror_proxy::client::error::error_name;
use kafka_mirror_proxy::client::offsets::Offsets;
use kafka_mirror_proxy::client::protocol::{IsolationLevel, OffsetSpec, Produced};
use kafka_mirror_proxy::client::{Client, ClientConfig, ClientError};
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_mirror_proxy::wire::aborted::{AbortedFilter, Decision};
use kafka_mirror_proxy::wire::batch::{BatchHeader, BATCH_LENGTH_OFFSET, HEADER_LEN, LOG_OVERHEAD};
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

/// Attribute bits of a magic-2 record batch.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;

const FETCH_MAX_WAIT: Duration = Duration::from_millis(500);
/// Connect timeout, and the client's bound on one request's round trip.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(45);
/// How long the client retries one operation before the replicator's own
/// retries (`max_retries`) take over.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(30);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The proxy remembers this many batches per mirrored producer and
/// partition (`mirror::producer_state::RETAINED_BATCHES`, Kafka's
/// `NUM_BATCHES_TO_RETAIN`): the most a restart may re-send and still have
/// every re-sent batch answered as a duplicate.
pub const MAX_UNCOMMITTED_BATCHES: u32 = 5;
/// Kafka's duplicate-sequence answer means an earlier attempt already landed.
const DUPLICATE_SEQUENCE_NUMBER: i16 = 46;

/// When `replicate` returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Stop once every partition's fetch position reached the source high
    /// watermark observed at start (for tests).
    UntilCaughtUp,
    /// Copy forever, until `shutdown` turns true.
    Follow,
}

#[derive(Debug, Clone)]
pub struct ReplicatorOptions {
    /// Source bootstrap, `host:port[,host:port...]`.
    pub source_bootstrap: String,
    /// Destination bootstrap: the proxy's address, treated like a broker.
    pub destination_bootstrap: String,
    /// Topics to copy; same name on both sides, the destination topic must
    /// exist with at least as many partitions.
    pub topics: Vec<String>,
    /// The mirror link's client id, sent in every request header to both sides.
    pub client_id: String,
    /// Sent on Produce requests that carry a transactional batch (brokers
    /// require one); defaults to `client_id`.
    pub transactional_id: Option<String>,
    /// First source offset to copy in every partition (clamped to the log
    /// start offset).
    pub start_offset: i64,
    /// First source offset per (topic, partition), overriding
    /// `start_offset` there: e.g. the barrier offsets of a failover, to copy
    /// back only what was written after it.
    pub start_offsets: BTreeMap<(String, i32), i64>,
    pub mode: Mode,
    /// How the source is read: `ReadCommitted` (the default) drops aborted
    /// transactions; `ReadUncommitted` copies every data batch.
    pub isolation: IsolationLevel,
    /// Retries of one operation before giving up (each one after the
    /// client's own retries of up to 30 s).
    pub max_retries: u32,
    /// Base of the exponential backoff between retries (capped at 5 s).
    pub retry_backoff: Duration,
    /// Fetch `max_bytes` and `partition_max_bytes`.
    pub fetch_max_bytes: i32,
    /// Set to `true` to stop (after the batch in flight).
    pub shutdown: Option<watch::Receiver<bool>>,
    /// Consumer group on the source cluster that keeps the progress:
    /// committed offsets are resumed from (they take precedence over
    /// `start_offset(s)`), and acknowledged positions committed. `None`:
    /// no progress kept.
    pub group_id: Option<String>,
    /// Commit when this long passed since the last commit.
    pub commit_interval: Duration,
    /// Commit once a partition has this many acknowledged batches past its
    /// committed offset (1 to [`MAX_UNCOMMITTED_BATCHES`]).
    pub commit_every_batches: u32,
}

/// The default progress group of a link's client id.
pub fn default_group_id(client_id: &str) -> String {
    format!("replicator.{client_id}")
}

impl ReplicatorOptions {
    /// Options with defaults: start offset 0, `Mode::UntilCaughtUp` (so a
    /// test that forgets the mode still terminates), read_committed, 20
    /// retries, 200 ms backoff, 1 MiB fetches, no shutdown channel, no
    /// progress group (the command line sets one by default).
    pub fn new(
        source_bootstrap: impl Into<String>,
        destination_bootstrap: impl Into<String>,
        topics: Vec<String>,
        client_id: impl Into<String>,
    ) -> Self {
        Self {
            source_bootstrap: source_bootstrap.into(),
            destination_bootstrap: destination_bootstrap.into(),
            topics,
            client_id: client_id.into(),
            transactional_id: None,
            start_offset: 0,
            start_offsets: BTreeMap::new(),
            mode: Mode::UntilCaughtUp,
            isolation: IsolationLevel::ReadCommitted,
            max_retries: 20,
            retry_backoff: Duration::from_millis(200),
            fetch_max_bytes: 1024 * 1024,
            shutdown: None,
            group_id: None,
            commit_interval: Duration::from_secs(5),
            commit_every_batches: MAX_UNCOMMITTED_BATCHES,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionReport {
    pub topic: String,
    pub partition: i32,
    pub batches_copied: u64,
    pub records_copied: u64,
    pub control_batches_skipped: u64,
    /// Data batches of aborted transactions dropped (read_committed).
    pub aborted_batches_skipped: u64,
    /// baseOffset of the first batch copied.
    pub first_offset: Option<i64>,
    /// Last offset (baseOffset + lastOffsetDelta) of the last batch copied.
    pub last_offset: Option<i64>,
    /// Source offset the next fetch would start from (a resume point).
    pub next_offset: i64,
    /// Source high watermark observed at start.
    pub start_high_watermark: i64,
    /// The group's committed offset found at start (where it resumed).
    pub resumed_from: Option<i64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationReport {
    /// Sorted by topic, then partition.
    pub partitions: Vec<PartitionReport>,
    pub total_batches: u64,
    pub total_records: u64,
    pub total_control_skipped: u64,
    pub total_aborted_skipped: u64,
    /// True when stopped by `shutdown` rather than by catching up.
    pub cancelled: bool,
    /// OffsetCommit requests that succeeded.
    pub commits: u64,
}

impl ReplicationReport {
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionReport> {
        self.partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
    }
}

impl fmt::Display for ReplicationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn opt(v: Option<i64>) -> String {
            v.map_or_else(|| "-".to_owned(), |v| v.to_string())
        }
        writeln!(
            f,
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
            "topic",
            "partition",
            "batches",
            "records",
            "control",
            "aborted",
            "first",
            "last",
            "next"
        )?;
        for p in &self.partitions {
            writeln!(
                f,
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
                p.topic,
                p.partition,
                p.batches_copied,
                p.records_copied,
                p.control_batches_skipped,
                p.aborted_batches_skipped,
                opt(p.first_offset),
                opt(p.last_offset),
                p.next_offset
            )?;
        }
        write!(
            f,
            "total: {} batches, {} records copied, {} control batches and {} aborted batches skipped{}",
            self.total_batches,
            self.total_records,
            self.total_control_skipped,
            self.total_aborted_skipped,
            if self.cancelled { " (cancelled)" } else { "" }
        )
    }
}

/// One whole magic-2 batch, as a zero-copy slice of the fetch response.
#[derive(Debug, Clone)]
pub struct RawBatch {
    pub bytes: Bytes,
    pub base_offset: i64,
    pub last_offset: i64,
    pub attributes: i16,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl RawBatch {
    /// The bytes to produce: the fetched batch with baseOffset set to 0.
    ///
    /// Kafka 4 brokers refuse a client append whose magic-2 batch has a
    /// non-zero baseOffset (`INVALID_RECORD`, "The baseOffset of the record
    /// batch in the append to ... should be 0", checked in
    /// `UnifiedLog.analyzeAndValidateRecords`). baseOffset lies outside the
    /// CRC and the broker assigns it anyway, so zeroing it is what every
    /// producer sends; all other bytes, CRC included, stay as fetched.
    pub fn produce_bytes(&self) -> Bytes {
        if self.bytes.len() < 8 || self.bytes[..8] == [0; 8] {
            return self.bytes.clone();
        }
        let mut b = BytesMut::from(&self.bytes[..]);
        b[..8].fill(0);
        b.freeze()
    }

    pub fn is_control(&self) -> bool {
        self.attributes & ATTR_CONTROL != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & ATTR_TRANSACTIONAL != 0
    }
}

#[derive(Debug, Default)]
pub struct SplitBatches {
    pub batches: Vec<RawBatch>,
    /// Bytes of an incomplete trailing batch (Fetch may cut the last one).
    pub partial_len: usize,
    /// Full size of that trailing batch, when its length field was complete.
    pub partial_needed: Option<usize>,
}

/// Splits a Fetch `records` blob into whole batches by their batchLength,
/// each header checked by `wire::batch`. A trailing partial batch is
/// reported, not returned: it is fetched again from its own offset.
pub fn split_batches(records: &Bytes) -> Result<SplitBatches> {
    let mut out = SplitBatches::default();
    let mut pos = 0usize;
    while pos < records.len() {
        let rest = &records[pos..];
        let Some(length) = rest.get(BATCH_LENGTH_OFFSET..LOG_OVERHEAD) else {
            out.partial_len = rest.len();
            break;
        };
        let batch_length = i32::from_be_bytes([length[0], length[1], length[2], length[3]]);
        let total = match usize::try_from(batch_length) {
            Ok(n) if n >= HEADER_LEN - LOG_OVERHEAD => LOG_OVERHEAD + n,
            _ => bail!("malformed record batch at byte {pos}: batchLength {batch_length}"),
        };
        if rest.len() < total {
            out.partial_len = rest.len();
            out.partial_needed = Some(total);
            break;
        }
        let h = BatchHeader::parse(&rest[..total])
            .map_err(|e| anyhow::anyhow!("record batch at byte {pos}: {e}"))?;
        out.batches.push(RawBatch {
            bytes: records.slice(pos..pos + total),
            base_offset: h.base_offset(),
            last_offset: h.base_offset() + i64::from(h.last_offset_delta()),
            attributes: h.attributes(),
            producer_id: h.producer_id(),
            producer_epoch: h.producer_epoch(),
            base_sequence: h.base_sequence(),
            record_count: h.record_count(),
        });
        pos += total;
    }
    Ok(out)
}

/// Copies batches as described in the module doc and returns what it did.
pub async fn replicate(opts: &ReplicatorOptions) -> Result<ReplicationReport> {
    if opts.topics.is_empty() {
        bail!("no topics to replicate");
    }
    if opts.start_offset < 0 {
        bail!("start offset must be >= 0, got {}", opts.start_offset);
    }
    if opts.fetch_max_bytes <= 0 {
        bail!("fetch max bytes must be > 0, got {}", opts.fetch_max_bytes);
    }
    if !(1..=MAX_UNCOMMITTED_BATCHES).contains(&opts.commit_every_batches) {
        bail!(
            "commit every batches must be 1 to {MAX_UNCOMMITTED_BATCHES} (the batches the proxy \
             recognises as duplicates per producer), got {}",
            opts.commit_every_batches
        );
    }
    if opts.group_id.as_deref() == Some("") {
        bail!("empty progress group id");
    }
    let mut replicator = Replicator {
        opts,
        source: client(opts, "source", &opts.source_bootstrap)?,
        destination: client(opts, "destination", &opts.destination_bootstrap)?,
        parts: BTreeMap::new(),
        shutdown: opts.shutdown.clone(),
        transactional_id: opts
            .transactional_id
            .clone()
            .unwrap_or_else(|| opts.client_id.clone()),
        last_commit: Instant::now(),
        commits: 0,
    };
    let cancelled = match replicator.run().await {
        Ok(()) => false,
        Err(e) if e.is::<Cancelled>() => true,
        Err(e) => return Err(e),
    };
    // Every position is acknowledged: keep it for the next start.
    replicator.commit_now().await?;
    Ok(replicator.report(cancelled))
}

/// The crate's client for one side, sending the link's client id.
fn client(opts: &ReplicatorOptions, role: &str, bootstrap: &str) -> Result<Client> {
    let bootstrap: Vec<String> = bootstrap
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect();
    if bootstrap.is_empty() {
        bail!("empty {role} bootstrap address");
    }
    let upstream = Upstream {
        tls: None,
        server_name: None,
        timeout: CONNECT_TIMEOUT,
    };
    let mut config = ClientConfig::new(bootstrap, upstream);
    config.client_id = opts.client_id.clone();
    config.request_timeout = REQUEST_TIMEOUT;
    config.operation_timeout = OPERATION_TIMEOUT;
    config.retry_backoff = opts.retry_backoff.min(MAX_BACKOFF);
    Ok(Client::new(config))
}

/// An error that retrying cannot fix.
#[derive(Debug)]
struct Fatal(String);

impl fmt::Display for Fatal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Fatal {}

/// Shutdown was signalled while waiting to retry.
#[derive(Debug)]
struct Cancelled;

impl fmt::Display for Cancelled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("cancelled")
    }
}

impl std::error::Error for Cancelled {}

fn fatal(msg: String) -> anyhow::Error {
    anyhow::Error::new(Fatal(msg))
}

/// Whether the replicator tries again after the client gave up: the
/// client's retriable errors, and its giving up on them (a broker restart
/// can take longer than one operation timeout).
fn worth_retrying(e: &ClientError) -> bool {
    match e {
        ClientError::GaveUp { last, .. } => last.is_retriable(),
        e => e.is_retriable(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Tp {
    topic: String,
    partition: i32,
}

impl fmt::Display for Tp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "topic {} partition {}", self.topic, self.partition)
    }
}

struct PartState {
    /// Next source offset to copy; moves past a batch only once the
    /// destination acknowledged it (or it was skipped).
    position: i64,
    /// What the progress group holds (-1: nothing).
    committed: i64,
    /// Batches acknowledged since `committed`.
    uncommitted_batches: u32,
    report: PartitionReport,
}

struct Replicator<'a> {
    opts: &'a ReplicatorOptions,
    source: Client,
    destination: Client,
    parts: BTreeMap<Tp, PartState>,
    shutdown: Option<watch::Receiver<bool>>,
    transactional_id: String,
    last_commit: Instant,
    commits: u64,
}

impl Replicator<'_> {
    fn report(&self, cancelled: bool) -> ReplicationReport {
        let mut report = ReplicationReport {
            cancelled,
            commits: self.commits,
            ..Default::default()
        };
        for state in self.parts.values() {
            let mut p = state.report.clone();
            p.next_offset = state.position;
            report.total_batches += p.batches_copied;
            report.total_records += p.records_copied;
            report.total_control_skipped += p.control_batches_skipped;
            report.total_aborted_skipped += p.aborted_batches_skipped;
            report.partitions.push(p);
        }
        report
    }

    fn cancelled(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|rx| *rx.borrow())
    }

    /// Sleeps before retry `attempt`; `Err(Cancelled)` if shutdown came first.
    async fn backoff(&mut self, attempt: u32) -> Result<()> {
        let delay = self
            .opts
            .retry_backoff
            .saturating_mul(1 << attempt.min(5))
            .min(MAX_BACKOFF);
        match &mut self.shutdown {
            None => tokio::time::sleep(delay).await,
            Some(rx) => {
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    // A dropped sender means "never cancelled", not "cancel now".
                    _ = async {
                        if rx.wait_for(|stop| *stop).await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    } => {}
                }
            }
        }
        if self.cancelled() {
            return Err(Cancelled.into());
        }
        Ok(())
    }

    /// Runs `op` on `client`, retrying what is worth retrying up to
    /// `max_retries` times; `what` names it in logs and errors.
    async fn with_retries<T, F, Fut>(&mut self, what: &str, mut op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let mut attempt = 0u32;
        loop {
            let error = match op().await {
                Ok(v) => return Ok(v),
                Err(e) if !worth_retrying(&e) => return Err(fatal(format!("{what}: {e}"))),
                Err(e) => e,
            };
            attempt += 1;
            if attempt > self.opts.max_retries {
                return Err(fatal(format!(
                    "{what}: giving up after {attempt} attempts: {error}"
                )));
            }
            warn!(attempt, error = %error, "{what} failed, retrying");
            self.backoff(attempt).await?;
        }
    }

    async fn run(&mut self) -> Result<()> {
        let (source, destination) = (self.source.clone(), self.destination.clone());
        let committed = self.committed_offsets().await?;
        for topic in &self.opts.topics {
            let src = self
                .with_retries(&format!("source metadata of {topic}"), || {
                    source.topic(topic)
                })
                .await?
                .partitions
                .len();
            let dst = self
                .with_retries(&format!("destination metadata of {topic}"), || {
                    destination.topic(topic)
                })
                .await?
                .partitions
                .len();
            if dst < src {
                bail!(
                    "destination topic {topic} has {dst} partitions, the source has {src}; \
                     create it with at least {src}"
                );
            }
            for partition in 0..src as i32 {
                let tp = Tp {
                    topic: topic.clone(),
                    partition,
                };
                let log_start = self
                    .with_retries(&format!("source log start of {tp}"), || {
                        source.list_offset(topic, partition, OffsetSpec::Earliest)
                    })
                    .await?
                    .offset;
                let high_watermark = self
                    .with_retries(&format!("source high watermark of {tp}"), || {
                        source.list_offset(topic, partition, OffsetSpec::Latest)
                    })
                    .await?
                    .offset;
                let resumed_from = committed.get(&(topic.clone(), partition)).copied();
                if let Some(offset) = resumed_from {
                    if offset > high_watermark {
                        // Resuming there would skip whatever the source
                        // writes up to it: the topic was recreated or
                        // truncated, and only the operator knows what to do.
                        bail!(
                            "group {} committed offset {offset} for {tp}, beyond the source log \
                             end {high_watermark}: the topic was recreated or truncated; reset \
                             the group's offsets (kafka-consumer-groups.sh --reset-offsets) or \
                             use another --group-id",
                            self.opts.group_id.as_deref().unwrap_or_default()
                        );
                    }
                }
                let start_offset = resumed_from.unwrap_or_else(|| {
                    self.opts
                        .start_offsets
                        .get(&(topic.clone(), partition))
                        .copied()
                        .unwrap_or(self.opts.start_offset)
                });
                let position = start_offset.max(log_start);
                if position > start_offset {
                    warn!(topic = %tp.topic, partition, start_offset, log_start,
                        "start offset is below the source log start; starting at the log start");
                }
                info!(topic = %tp.topic, partition, position, high_watermark,
                    resumed_from_commit = resumed_from.is_some(), "partition ready");
                self.parts.insert(
                    tp,
                    PartState {
                        position,
                        committed: resumed_from.unwrap_or(-1),
                        uncommitted_batches: 0,
                        report: PartitionReport {
                            topic: topic.clone(),
                            partition,
                            start_high_watermark: high_watermark,
                            resumed_from,
                            ..Default::default()
                        },
                    },
                );
            }
        }
        self.copy_loop().await
    }

    async fn copy_loop(&mut self) -> Result<()> {
        loop {
            if self.cancelled() {
                return Err(Cancelled.into());
            }
            let follow = self.opts.mode == Mode::Follow;
            let active: Vec<Tp> = self
                .parts
                .iter()
                .filter(|(_, s)| follow || s.position < s.report.start_high_watermark)
                .map(|(tp, _)| tp.clone())
                .collect();
            if active.is_empty() {
                info!("every partition reached the source high watermark seen at start");
                return Ok(());
            }
            // One partition at a time: a quiet one must not hold the others
            // up for long.
            let wait = FETCH_MAX_WAIT / u32::try_from(active.len()).unwrap_or(u32::MAX);
            for tp in active {
                self.fetch_and_copy(&tp, wait).await?;
                if self.cancelled() {
                    return Err(Cancelled.into());
                }
                if self.last_commit.elapsed() >= self.opts.commit_interval {
                    self.commit_now().await?;
                }
            }
        }
    }

    /// The progress group's committed offsets of every source partition
    /// (none without a group).
    async fn committed_offsets(&mut self) -> Result<Offsets> {
        let Some(group) = self.opts.group_id.clone() else {
            return Ok(Offsets::new());
        };
        let source = self.source.clone();
        let mut partitions = Vec::new();
        for topic in &self.opts.topics {
            let count = self
                .with_retries(&format!("source metadata of {topic}"), || {
                    source.topic(topic)
                })
                .await?
                .partitions
                .len();
            partitions.extend((0..count as i32).map(|p| (topic.clone(), p)));
        }
        let committed = self
            .with_retries(&format!("committed offsets of group {group}"), || {
                source.committed_offsets(&group, &partitions)
            })
            .await?;
        info!(
            group,
            partitions = partitions.len(),
            committed = committed.len(),
            "read the progress group's committed offsets"
        );
        Ok(committed)
    }

    /// Commit every partition's position that moved since its last commit
    /// (every position is acknowledged by construction).
    async fn commit_now(&mut self) -> Result<()> {
        self.last_commit = Instant::now();
        let Some(group) = self.opts.group_id.clone() else {
            return Ok(());
        };
        let offsets: Offsets = self
            .parts
            .iter()
            .filter(|(_, s)| s.position != s.committed)
            .map(|(tp, s)| ((tp.topic.clone(), tp.partition), s.position))
            .collect();
        if offsets.is_empty() {
            return Ok(());
        }
        let source = self.source.clone();
        // Not `with_retries`: a commit at shutdown must not be cancelled.
        let mut attempt = 0u32;
        loop {
            match source.commit_offsets(&group, &offsets).await {
                Ok(()) => break,
                Err(e) if worth_retrying(&e) && attempt < self.opts.max_retries => {
                    attempt += 1;
                    warn!(attempt, error = %e, group, "commit failed, retrying");
                    tokio::time::sleep(
                        self.opts
                            .retry_backoff
                            .saturating_mul(1 << attempt.min(5))
                            .min(MAX_BACKOFF),
                    )
                    .await;
                }
                Err(e) => return Err(fatal(format!("commit to group {group}: {e}"))),
            }
        }
        for ((topic, partition), offset) in &offsets {
            let tp = Tp {
                topic: topic.clone(),
                partition: *partition,
            };
            if let Some(state) = self.parts.get_mut(&tp) {
                state.committed = *offset;
                state.uncommitted_batches = 0;
            }
        }
        self.commits += 1;
        debug!(group, partitions = offsets.len(), "committed");
        Ok(())
    }

    /// One Fetch of one source partition, then every whole batch it
    /// returned copied (or skipped) in order.
    async fn fetch_and_copy(&mut self, tp: &Tp, wait: Duration) -> Result<()> {
        let Some(position) = self.parts.get(tp).map(|s| s.position) else {
            return Ok(());
        };
        let (source, isolation, max_bytes) = (
            self.source.clone(),
            self.opts.isolation,
            self.opts.fetch_max_bytes,
        );
        let fetched = self
            .with_retries(
                &format!("source fetch of {tp} at offset {position}"),
                || {
                    source.fetch_isolated(
                        &tp.topic,
                        tp.partition,
                        position,
                        max_bytes,
                        wait,
                        isolation,
                    )
                },
            )
            .await?;
        let split = split_batches(&fetched.records)
            .map_err(|e| fatal(format!("source {tp} at offset {position}: {e:#}")))?;
        let mut filter = AbortedFilter::new(fetched.aborted_transactions);
        let (mut copied, mut records, mut control, mut aborted) = (0u64, 0u64, 0u64, 0u64);
        let mut range: Option<(i64, i64)> = None;
        for batch in &split.batches {
            if self.cancelled() {
                break;
            }
            let decision = filter
                .decide(&batch.bytes)
                .map_err(|e| fatal(format!("source {tp} at offset {}: {e}", batch.base_offset)))?;
            // The broker starts at the batch that holds the fetch offset; a
            // batch wholly before it was already handled (it still went
            // through the filter, which needs every batch in order).
            if batch.last_offset < position {
                continue;
            }
            match decision {
                Decision::Control(kind) => {
                    control += 1;
                    debug!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                        producer_id = batch.producer_id, ?kind, "skipped control batch");
                }
                Decision::Aborted => {
                    aborted += 1;
                    debug!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                        producer_id = batch.producer_id, "skipped a batch of an aborted transaction");
                }
                Decision::Keep => {
                    let dest_offset = self.produce_batch(tp, batch).await?;
                    debug!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                        dest_offset, producer_id = batch.producer_id, records = batch.record_count,
                        "copied batch");
                    copied += 1;
                    records += u64::try_from(batch.record_count).unwrap_or(0);
                    range = Some((range.map_or(batch.base_offset, |r| r.0), batch.last_offset));
                }
            }
            let mut commit = false;
            if let Some(state) = self.parts.get_mut(tp) {
                state.position = batch.last_offset + 1;
                let r = &mut state.report;
                match decision {
                    Decision::Control(_) => r.control_batches_skipped += 1,
                    Decision::Aborted => r.aborted_batches_skipped += 1,
                    Decision::Keep => {
                        r.batches_copied += 1;
                        r.records_copied += u64::try_from(batch.record_count).unwrap_or(0);
                        r.first_offset.get_or_insert(batch.base_offset);
                        r.last_offset = Some(batch.last_offset);
                        state.uncommitted_batches += 1;
                    }
                }
                commit = state.uncommitted_batches >= self.opts.commit_every_batches;
            }
            if commit {
                self.commit_now().await?;
            }
        }
        if split.partial_len > 0 {
            // Refetched from the next offset in a later round.
            debug!(topic = %tp.topic, partition = tp.partition, bytes = split.partial_len,
                needed = split.partial_needed, "ignored a partial trailing batch");
        }
        if copied + control + aborted > 0 {
            let position = self.parts.get(tp).map_or(0, |s| s.position);
            info!(topic = %tp.topic, partition = tp.partition, batches = copied, records,
                control_skipped = control, aborted_skipped = aborted, first = range.map(|r| r.0),
                last = range.map(|r| r.1), next_offset = position,
                high_watermark = fetched.high_watermark,
                last_stable_offset = fetched.last_stable_offset, "copied");
        }
        Ok(())
    }

    /// Produces one batch, byte for byte, alone in its request; the client
    /// and this loop retry the same bytes on retriable failures. Returns
    /// the destination base offset.
    async fn produce_batch(&mut self, tp: &Tp, batch: &RawBatch) -> Result<i64> {
        let bytes = batch.produce_bytes();
        let destination = self.destination.clone();
        let transactional_id = batch
            .is_transactional()
            .then(|| self.transactional_id.clone());
        let what = format!(
            "produce of the batch of {tp} at source offset {}",
            batch.base_offset
        );
        let produced = self
            .with_retries(&what, || {
                destination.produce_transactional(
                    &tp.topic,
                    tp.partition,
                    bytes.clone(),
                    transactional_id.as_deref(),
                )
            })
            .await?;
        match produced {
            Produced::Appended { base_offset, .. } => Ok(base_offset),
            Produced::Refused { code, .. } if code == DUPLICATE_SEQUENCE_NUMBER => {
                warn!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                    "destination reports a duplicate: an earlier attempt already landed");
                Ok(-1)
            }
            Produced::Refused { code, message } => Err(fatal(format!(
                "destination refused the batch of {tp} at source offset {} \
                 (producerId {}, epoch {}, baseSequence {}, transactional {}): {} ({code}): {}",
                batch.base_offset,
                batch.producer_id,
                batch.producer_epoch,
                batch.base_sequence,
                batch.is_transactional(),
                error_name(code),
                message.as_deref().unwrap_or("(no error message)")
            ))),
        }
    }
}

pub const USAGE: &str = "\
usage: replicator --source HOST:PORT --destination HOST:PORT --topics T[,T...] --client-id ID [options]

  --source HOST:PORT[,...]       source cluster bootstrap
  --destination HOST:PORT[,...]  destination bootstrap (the proxy)
  --topics T[,T...]              topics to copy (repeatable)
  --client-id ID                 mirror link client id, sent to both sides
  --transactional-id ID          for transactional batches (default: the client id)
  --start-offset N               first source offset of a partition without a committed one (default 0)
  --group-id G                   source consumer group keeping the progress (default replicator.<client id>)
  --no-group                     keep no progress: start at --start-offset every time
  --commit-interval-ms N         commit acknowledged positions at least this often (default 5000)
  --commit-every-batches N       ... and after N acknowledged batches of a partition, 1 to 5 (default 5)
  --mode follow|until-caught-up  keep running, or stop at the start high watermark (default follow)
  --isolation-level L            read_committed (default: aborted transactions dropped) or read_uncommitted
  --max-retries N                retries per operation (default 20)
  --retry-backoff-ms N           base retry backoff (default 200)
  --fetch-max-bytes N            fetch size (default 1048576)
  --verbose, -v                  log every batch
  --help, -h                     this text";

/// Parsed command line.
#[derive(Debug, Clone)]
pub struct Cli {
    pub options: ReplicatorOptions,
    pub verbose: bool,
}

/// Parses `--flag value` (or `--flag=value`) arguments, without the program
/// name. `Ok(None)` means help was asked for.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Option<Cli>, String> {
    let mut opts = ReplicatorOptions::new("", "", Vec::new(), "");
    // A mirror normally runs until stopped; tests use the API or --mode.
    opts.mode = Mode::Follow;
    let mut verbose = false;
    let (mut group_id, mut no_group) = (None, false);
    let mut it = args.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg, None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        fn number<T: std::str::FromStr>(flag: &str, v: String) -> Result<T, String> {
            v.parse()
                .map_err(|_| format!("{flag}: not a valid number: {v}"))
        }
        match flag.as_str() {
            "--source" => opts.source_bootstrap = value()?,
            "--destination" => opts.destination_bootstrap = value()?,
            "--topics" => opts.topics.extend(
                value()?
                    .split(',')
                    .map(str::trim)
                    .filter(|t| !t.is_empty())
                    .map(str::to_owned),
            ),
            "--client-id" => opts.client_id = value()?,
            "--transactional-id" => opts.transactional_id = Some(value()?),
            "--start-offset" => opts.start_offset = number(&flag, value()?)?,
            "--mode" => {
                opts.mode = match value()?.as_str() {
                    "follow" => Mode::Follow,
                    "until-caught-up" => Mode::UntilCaughtUp,
                    other => {
                        return Err(format!(
                            "--mode: expected follow or until-caught-up, got {other}"
                        ))
                    }
                }
            }
            "--isolation-level" => {
                opts.isolation = match value()?.as_str() {
                    "read_committed" => IsolationLevel::ReadCommitted,
                    "read_uncommitted" => IsolationLevel::ReadUncommitted,
                    other => {
                        return Err(format!(
                    "--isolation-level: expected read_committed or read_uncommitted, got {other}"
                ))
                    }
                }
            }
            "--max-retries" => opts.max_retries = number(&flag, value()?)?,
            "--retry-backoff-ms" => {
                opts.retry_backoff = Duration::from_millis(number(&flag, value()?)?)
            }
            "--fetch-max-bytes" => opts.fetch_max_bytes = number(&flag, value()?)?,
            "--group-id" => group_id = Some(value()?),
            "--no-group" => no_group = true,
            "--commit-interval-ms" => {
                opts.commit_interval = Duration::from_millis(number(&flag, value()?)?)
            }
            "--commit-every-batches" => {
                opts.commit_every_batches = number(&flag, value()?)?;
                if !(1..=MAX_UNCOMMITTED_BATCHES).contains(&opts.commit_every_batches) {
                    return Err(format!(
                        "--commit-every-batches: 1 to {MAX_UNCOMMITTED_BATCHES}, got {}",
                        opts.commit_every_batches
                    ));
                }
            }
            "--verbose" | "-v" => verbose = true,
            "--help" | "-h" => return Ok(None),
            other => return Err(format!("unknown argument: {other}")),
        }
    }
    for (name, missing) in [
        ("--source", opts.source_bootstrap.is_empty()),
        ("--destination", opts.destination_bootstrap.is_empty()),
        ("--topics", opts.topics.is_empty()),
        ("--client-id", opts.client_id.is_empty()),
    ] {
        if missing {
            return Err(format!("{name} is required"));
        }
    }
    opts.group_id = match (no_group, group_id) {
        (true, Some(_)) => return Err("--group-id and --no-group exclude each other".into()),
        (true, None) => None,
        (false, Some(g)) if g.is_empty() => return Err("--group-id: empty".into()),
        (false, g) => Some(g.unwrap_or_else(|| default_group_id(&opts.client_id))),
    };
    Ok(Some(Cli {
        options: opts,
        verbose,
    }))
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let mut cli = match parse_args(std::env::args().skip(1)) {
        Ok(Some(cli)) => cli,
        Ok(None) => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("error: {e}\n\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    let level = if cli.verbose {
        tracing::Level::DEBUG
    } else {
        tracing::Level::INFO
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            info!("interrupted, stopping after the batch in flight");
            let _ = stop_tx.send(true);
        }
    });
    cli.options.shutdown = Some(stop_rx);

    match replicate(&cli.options).await {
        Ok(report) => {
            println!("{report}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            error!(error = format!("{e:#}"), "replication failed");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BufMut;

    const BATCH_HEADER_LEN: usize = HEADER_LEN;

    /// A batch header with the fields the replicator reads, plus `payload`.
    fn batch(
        base_offset: i64,
        last_delta: i32,
        attributes: i16,
        count: i32,
        payload: &[u8],
    ) -> Vec<u8> {
        let mut b = Vec::new();
        b.put_i64(base_offset);
        b.put_i32((BATCH_HEADER_LEN - LOG_OVERHEAD + payload.len()) as i32);
        b.put_i32(0); // partitionLeaderEpoch
        b.put_i8(2); // magic
        b.put_u32(0); // crc (not checked here)
        b.put_i16(attributes);
        b.put_i32(last_delta);
        b.put_i64(0);
        b.put_i64(0);
        b.put_i64(7); // producerId
        b.put_i16(0);
        b.put_i32(0);
        b.put_i32(count);
        b.extend_from_slice(payload);
        b
    }

    #[test]
    fn splits_whole_batches_and_reports_a_partial_tail() {
        let mut data = batch(10, 2, 0, 3, b"abc");
        data.extend(batch(13, 0, ATTR_CONTROL, 1, b"x"));
        let third = batch(14, 4, ATTR_TRANSACTIONAL, 5, b"hello");
        data.extend_from_slice(&third[..20]);
        let split = split_batches(&Bytes::from(data)).expect("valid input");
        assert_eq!(split.batches.len(), 2);
        assert_eq!(split.batches[0].base_offset, 10);
        assert_eq!(split.batches[0].last_offset, 12);
        assert_eq!(split.batches[0].record_count, 3);
        assert_eq!(split.batches[0].producer_id, 7);
        assert_eq!(split.batches[0].bytes.len(), BATCH_HEADER_LEN + 3);
        assert!(split.batches[1].is_control());
        assert_eq!(split.partial_len, 20);
        assert_eq!(split.partial_needed, Some(third.len()));
    }

    #[test]
    fn produce_bytes_only_zeroes_the_base_offset() {
        let original = batch(57, 1, ATTR_TRANSACTIONAL, 2, b"payload");
        let split = split_batches(&Bytes::from(original.clone())).expect("valid input");
        let sent = split.batches[0].produce_bytes();
        assert_eq!(&sent[..8], &[0u8; 8]);
        assert_eq!(&sent[8..], &original[8..]);
        assert_eq!(split.batches[0].base_offset, 57);
    }

    #[test]
    fn rejects_wrong_magic_and_short_length() {
        let mut b = batch(0, 0, 0, 1, b"");
        b[16] = 1;
        assert!(split_batches(&Bytes::from(b)).is_err());
        let mut b = batch(0, 0, 0, 1, b"");
        b[8..12].copy_from_slice(&10i32.to_be_bytes());
        assert!(split_batches(&Bytes::from(b)).is_err());
    }

    #[test]
    fn parses_flags() {
        let args = "--source a:1 --destination=b:2 --topics t,u --topics v --client-id mirror-a \
                    --mode until-caught-up --start-offset 5";
        let cli = parse_args(args.split_whitespace().map(str::to_owned))
            .expect("valid")
            .expect("not help");
        assert_eq!(cli.options.destination_bootstrap, "b:2");
        assert_eq!(cli.options.topics, ["t", "u", "v"]);
        assert_eq!(cli.options.mode, Mode::UntilCaughtUp);
        assert_eq!(cli.options.start_offset, 5);
        assert_eq!(cli.options.isolation, IsolationLevel::ReadCommitted);
        let cli = parse_args(
            "--source a:1 --destination b:2 --topics t --client-id c --isolation-level read_uncommitted"
                .split_whitespace()
                .map(str::to_owned),
        )
        .expect("valid")
        .expect("not help");
        assert_eq!(cli.options.isolation, IsolationLevel::ReadUncommitted);
        assert!(parse_args(
            "--source a:1 --destination b:2 --topics t --client-id c --isolation-level dirty"
                .split_whitespace()
                .map(str::to_owned)
        )
        .is_err());
        assert!(parse_args(["--source".to_owned()]).is_err());
        assert!(parse_args(Vec::new()).is_err());
    }

    #[test]
    fn progress_group_flags() {
        let parse = |extra: &str| {
            parse_args(
                format!("--source a:1 --destination b:2 --topics t --client-id mirror-a {extra}")
                    .split_whitespace()
                    .map(str::to_owned),
            )
            .map(|cli| cli.expect("not help").options)
        };
        let default = parse("").expect("valid");
        assert_eq!(default.group_id.as_deref(), Some("replicator.mirror-a"));
        assert_eq!(default.commit_every_batches, MAX_UNCOMMITTED_BATCHES);
        assert_eq!(default.commit_interval, Duration::from_secs(5));
        let set =
            parse("--group-id g --commit-interval-ms 100 --commit-every-batches 2").expect("valid");
        assert_eq!(set.group_id.as_deref(), Some("g"));
        assert_eq!(set.commit_interval, Duration::from_millis(100));
        assert_eq!(set.commit_every_batches, 2);
        assert_eq!(parse("--no-group").expect("valid").group_id, None);
        assert!(parse("--no-group --group-id g").is_err());
        assert!(parse("--group-id=").is_err());
        // More than the proxy recognises as duplicates per producer.
        assert!(parse("--commit-every-batches 6").is_err());
        assert!(parse("--commit-every-batches 0").is_err());
    }
}
