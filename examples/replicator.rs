//! Replicator: the tool that feeds kafka-mirror-proxy with mirrored traffic.
//!
//! It copies record batches byte for byte from a source Kafka cluster to a
//! destination cluster (normally through the proxy), keeping the source
//! producer IDs, epochs and sequences: exactly the traffic the proxy has to
//! remap (SPEC §1–§3). It speaks the Kafka wire protocol itself because client
//! libraries re-encode batches and assign their own producer IDs. The one
//! field it changes is baseOffset, zeroed because Kafka 4 brokers refuse
//! anything else from a client; it lies outside the CRC (see
//! `RawBatch::produce_bytes`).
//!
//! Control batches (transaction markers) are skipped: brokers refuse them
//! from clients. Each partition is copied in order, one Produce in flight at
//! a time, each request holding exactly one batch. The partitions are those
//! the source topics have at start.
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
//! Protocol versions: ApiVersions v3 (checked on every new connection),
//! Metadata v12, ListOffsets v7, Fetch v12 (the last version that names
//! topics instead of topic ids), Produce v9. Produce stays below v12 on
//! purpose: from v12 a broker with transaction version 2 adds partitions to a
//! transaction implicitly, which must never happen for mirrored batches.

// The file is also compiled as a module of integration tests, which use only
// part of it.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, BrokerId, FetchRequest, ListOffsetsRequest, MetadataRequest,
    ProduceRequest, RequestHeader, ResponseHeader, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tracing::{debug, error, info, warn};

pub const API_VERSIONS_VERSION: i16 = 3;
pub const METADATA_VERSION: i16 = 12;
pub const LIST_OFFSETS_VERSION: i16 = 7;
/// v13+ addresses topics by id; names keep the replicator simple.
pub const FETCH_VERSION: i16 = 12;
/// See the module doc for why not v12+.
pub const PRODUCE_VERSION: i16 = 9;

/// Attribute bits of a magic-2 record batch.
pub const ATTR_TRANSACTIONAL: i16 = 0x10;
pub const ATTR_CONTROL: i16 = 0x20;

/// baseOffset + batchLength: the bytes not counted by batchLength.
const LOG_OVERHEAD: usize = 12;
/// Fixed header of a magic-2 batch, up to and including recordCount.
const BATCH_HEADER_LEN: usize = 61;

const PRODUCE_TIMEOUT_MS: i32 = 30_000;
const FETCH_MAX_WAIT_MS: i32 = 500;
/// Longer than the produce timeout, so the broker answers first.
const IO_TIMEOUT: Duration = Duration::from_secs(45);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// Sanity bound on a response frame, to fail loudly on a garbled length.
const MAX_FRAME_BYTES: i32 = 512 * 1024 * 1024;
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
    pub mode: Mode,
    /// Retries of one operation before giving up.
    pub max_retries: u32,
    /// Base of the exponential backoff between retries (capped at 5 s).
    pub retry_backoff: Duration,
    /// Fetch `max_bytes` and `partition_max_bytes`.
    pub fetch_max_bytes: i32,
    /// Set to `true` to stop (after the batch in flight).
    pub shutdown: Option<watch::Receiver<bool>>,
}

impl ReplicatorOptions {
    /// Options with defaults: start offset 0, `Mode::UntilCaughtUp` (so a
    /// test that forgets the mode still terminates), 20 retries, 200 ms
    /// backoff, 1 MiB fetches, no shutdown channel.
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
            mode: Mode::UntilCaughtUp,
            max_retries: 20,
            retry_backoff: Duration::from_millis(200),
            fetch_max_bytes: 1024 * 1024,
            shutdown: None,
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
    /// baseOffset of the first batch copied.
    pub first_offset: Option<i64>,
    /// Last offset (baseOffset + lastOffsetDelta) of the last batch copied.
    pub last_offset: Option<i64>,
    /// Source offset the next fetch would start from (a resume point).
    pub next_offset: i64,
    /// Source high watermark observed at start.
    pub start_high_watermark: i64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationReport {
    /// Sorted by topic, then partition.
    pub partitions: Vec<PartitionReport>,
    pub total_batches: u64,
    pub total_records: u64,
    pub total_control_skipped: u64,
    /// True when stopped by `shutdown` rather than by catching up.
    pub cancelled: bool,
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
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
            "topic", "partition", "batches", "records", "control", "first", "last", "next"
        )?;
        for p in &self.partitions {
            writeln!(
                f,
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
                p.topic,
                p.partition,
                p.batches_copied,
                p.records_copied,
                p.control_batches_skipped,
                opt(p.first_offset),
                opt(p.last_offset),
                p.next_offset
            )?;
        }
        write!(
            f,
            "total: {} batches, {} records copied, {} control batches skipped{}",
            self.total_batches,
            self.total_records,
            self.total_control_skipped,
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

/// Splits a Fetch `records` blob into whole batches by walking the batch
/// headers. A trailing partial batch is reported, not returned: it is fetched
/// again from its own offset.
pub fn split_batches(records: &Bytes) -> Result<SplitBatches> {
    let mut out = SplitBatches::default();
    let mut pos = 0usize;
    while pos < records.len() {
        let rest = &records[pos..];
        if rest.len() < LOG_OVERHEAD {
            out.partial_len = rest.len();
            break;
        }
        let batch_length = (&rest[8..12]).get_i32();
        if batch_length < (BATCH_HEADER_LEN - LOG_OVERHEAD) as i32 {
            bail!("malformed record batch at byte {pos}: batchLength {batch_length}");
        }
        let total = LOG_OVERHEAD + batch_length as usize;
        if rest.len() < total {
            out.partial_len = rest.len();
            out.partial_needed = Some(total);
            break;
        }
        let magic = rest[16] as i8;
        if magic != 2 {
            bail!("record batch at byte {pos} has magic {magic}, only magic 2 is supported");
        }
        let mut h = &rest[..BATCH_HEADER_LEN];
        let base_offset = h.get_i64();
        h.advance(4 + 4 + 1 + 4); // batchLength, partitionLeaderEpoch, magic, crc
        let attributes = h.get_i16();
        let last_offset_delta = h.get_i32();
        h.advance(8 + 8); // baseTimestamp, maxTimestamp
        let producer_id = h.get_i64();
        let producer_epoch = h.get_i16();
        let base_sequence = h.get_i32();
        let record_count = h.get_i32();
        out.batches.push(RawBatch {
            bytes: records.slice(pos..pos + total),
            base_offset,
            last_offset: base_offset + i64::from(last_offset_delta),
            attributes,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
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
    let mut replicator = Replicator {
        opts,
        pool: Pool {
            client_id: opts.client_id.clone(),
            conns: HashMap::new(),
        },
        source: ClusterView::new("source", &opts.source_bootstrap)?,
        destination: ClusterView::new("destination", &opts.destination_bootstrap)?,
        parts: BTreeMap::new(),
        shutdown: opts.shutdown.clone(),
        round: 0,
        transactional_id: TransactionalId(StrBytes::from_string(
            opts.transactional_id
                .clone()
                .unwrap_or_else(|| opts.client_id.clone()),
        )),
    };
    match replicator.run().await {
        Ok(()) => Ok(replicator.report(false)),
        Err(e) if e.is::<Cancelled>() => Ok(replicator.report(true)),
        Err(e) => Err(e),
    }
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

fn is_fatal(e: &anyhow::Error) -> bool {
    e.is::<Fatal>() || e.is::<Cancelled>()
}

fn is_retriable(code: i16) -> bool {
    match ResponseError::try_from_code(code) {
        None => false,
        // Kafka calls a CRC failure retriable because a resend may fix a bit
        // flip in transit; we resend the very same bytes, so it cannot help.
        Some(ResponseError::CorruptMessage) => false,
        Some(e) => e.is_retriable(),
    }
}

fn error_name(code: i16) -> String {
    match ResponseError::try_from_code(code) {
        None => "NONE".to_owned(),
        Some(e) => e.to_string(),
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

/// A Produce request holding exactly one partition and exactly one batch.
/// Brokers require a transactional id when the batch is transactional; it is
/// left out otherwise so plain batches never touch transaction checks.
fn produce_request(
    topic: &str,
    partition: i32,
    batch: &RawBatch,
    transactional_id: &TransactionalId,
) -> ProduceRequest {
    ProduceRequest::default()
        .with_transactional_id(batch.is_transactional().then(|| transactional_id.clone()))
        .with_acks(-1)
        .with_timeout_ms(PRODUCE_TIMEOUT_MS)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch.produce_bytes()))])])
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_owned()))
}

/// One connection to one broker (or proxy) address.
struct Connection {
    stream: TcpStream,
    next_correlation_id: i32,
}

impl Connection {
    /// One request, one response; the caller drops the connection on error
    /// because a half-finished exchange leaves the stream out of step.
    async fn call<R: Request>(
        &mut self,
        client_id: &str,
        version: i16,
        req: &R,
    ) -> Result<R::Response> {
        let api_key =
            ApiKey::try_from(R::KEY).map_err(|_| anyhow!("unknown API key {}", R::KEY))?;
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let header = RequestHeader::default()
            .with_request_api_key(R::KEY)
            .with_request_api_version(version)
            .with_correlation_id(correlation_id)
            .with_client_id(Some(StrBytes::from_string(client_id.to_owned())));

        let mut buf = BytesMut::new();
        buf.put_i32(0); // length, patched below
        header.encode(&mut buf, api_key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        let len = i32::try_from(buf.len() - 4).context("request too large")?;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        self.stream.write_all(&buf).await?;

        let len = self.stream.read_i32().await?;
        if !(4..=MAX_FRAME_BYTES).contains(&len) {
            bail!("invalid response frame length {len}");
        }
        let mut frame = BytesMut::zeroed(len as usize);
        self.stream.read_exact(&mut frame).await?;
        let mut frame = frame.freeze();
        let response_header =
            ResponseHeader::decode(&mut frame, api_key.response_header_version(version))?;
        if response_header.correlation_id != correlation_id {
            bail!(
                "correlation id mismatch: sent {correlation_id}, got {}",
                response_header.correlation_id
            );
        }
        R::Response::decode(&mut frame, version)
            .with_context(|| format!("decoding {api_key:?} v{version} response"))
    }
}

/// Connections by address, reused across requests.
struct Pool {
    client_id: String,
    conns: HashMap<String, Connection>,
}

impl Pool {
    async fn call<R: Request>(&mut self, addr: &str, version: i16, req: &R) -> Result<R::Response> {
        let result =
            match tokio::time::timeout(IO_TIMEOUT, self.call_inner(addr, version, req)).await {
                Ok(r) => r,
                Err(_) => Err(anyhow!("no response within {IO_TIMEOUT:?}")),
            };
        if result.is_err() {
            self.conns.remove(addr);
        }
        result.with_context(|| format!("request to {addr}"))
    }

    async fn call_inner<R: Request>(
        &mut self,
        addr: &str,
        version: i16,
        req: &R,
    ) -> Result<R::Response> {
        if !self.conns.contains_key(addr) {
            let conn = self.open(addr).await?;
            self.conns.insert(addr.to_owned(), conn);
        }
        let conn = self
            .conns
            .get_mut(addr)
            .ok_or_else(|| anyhow!("connection vanished"))?;
        conn.call(&self.client_id, version, req).await
    }

    /// Connects and checks that the peer speaks the versions we use, so a
    /// mismatch fails with a clear message instead of a decode error.
    async fn open(&self, addr: &str) -> Result<Connection> {
        let stream = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        stream.set_nodelay(true)?;
        let mut conn = Connection {
            stream,
            next_correlation_id: 1,
        };
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("kafka-mirror-replicator"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let resp = conn
            .call(&self.client_id, API_VERSIONS_VERSION, &req)
            .await?;
        if resp.error_code != 0 {
            return Err(fatal(format!(
                "{addr} refused ApiVersions v{API_VERSIONS_VERSION}: {} ({})",
                error_name(resp.error_code),
                resp.error_code
            )));
        }
        for (key, version) in [
            (ApiKey::Metadata, METADATA_VERSION),
            (ApiKey::ListOffsets, LIST_OFFSETS_VERSION),
            (ApiKey::Fetch, FETCH_VERSION),
            (ApiKey::Produce, PRODUCE_VERSION),
        ] {
            match resp.api_keys.iter().find(|k| k.api_key == key as i16) {
                Some(k) if (k.min_version..=k.max_version).contains(&version) => {}
                Some(k) => {
                    return Err(fatal(format!(
                        "{addr} supports {key:?} v{}..v{}, the replicator needs v{version}",
                        k.min_version, k.max_version
                    )))
                }
                // A broker need not offer every API (a proxy may hide some);
                // only the ones actually used on that side matter, and those
                // fail clearly on first use.
                None => debug!(%addr, api = ?key, "API not advertised"),
            }
        }
        debug!(%addr, "connected");
        Ok(conn)
    }
}

/// What the replicator knows about one cluster.
struct ClusterView {
    role: &'static str,
    bootstrap: Vec<String>,
    brokers: HashMap<i32, String>,
    leaders: HashMap<Tp, String>,
    partition_counts: HashMap<String, i32>,
    topic_errors: HashMap<String, i16>,
}

impl ClusterView {
    fn new(role: &'static str, bootstrap: &str) -> Result<Self> {
        let bootstrap: Vec<String> = bootstrap
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if bootstrap.is_empty() {
            bail!("empty {role} bootstrap address");
        }
        Ok(Self {
            role,
            bootstrap,
            brokers: HashMap::new(),
            leaders: HashMap::new(),
            partition_counts: HashMap::new(),
            topic_errors: HashMap::new(),
        })
    }
}

#[derive(Debug, Clone, Copy)]
enum Side {
    Source,
    Destination,
}

struct PartState {
    position: i64,
    report: PartitionReport,
}

struct Replicator<'a> {
    opts: &'a ReplicatorOptions,
    pool: Pool,
    source: ClusterView,
    destination: ClusterView,
    parts: BTreeMap<Tp, PartState>,
    shutdown: Option<watch::Receiver<bool>>,
    transactional_id: TransactionalId,
    /// Fetch rounds so far, to rotate the partition order.
    round: usize,
}

impl Replicator<'_> {
    fn report(&self, cancelled: bool) -> ReplicationReport {
        let mut report = ReplicationReport {
            cancelled,
            ..Default::default()
        };
        for state in self.parts.values() {
            let mut p = state.report.clone();
            p.next_offset = state.position;
            report.total_batches += p.batches_copied;
            report.total_records += p.records_copied;
            report.total_control_skipped += p.control_batches_skipped;
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

    async fn run(&mut self) -> Result<()> {
        self.wait_for_topics(Side::Source).await?;
        self.wait_for_topics(Side::Destination).await?;
        for topic in &self.opts.topics {
            let src = self
                .source
                .partition_counts
                .get(topic)
                .copied()
                .unwrap_or(0);
            let dst = self
                .destination
                .partition_counts
                .get(topic)
                .copied()
                .unwrap_or(0);
            if dst < src {
                bail!(
                    "destination topic {topic} has {dst} partitions, the source has {src}; \
                     create it with at least {src}"
                );
            }
            for partition in 0..src {
                let tp = Tp {
                    topic: topic.clone(),
                    partition,
                };
                self.parts.insert(
                    tp,
                    PartState {
                        position: 0,
                        report: PartitionReport {
                            topic: topic.clone(),
                            partition,
                            ..Default::default()
                        },
                    },
                );
            }
        }

        let earliest = self.list_offsets(-2).await?;
        let latest = self.list_offsets(-1).await?;
        for (tp, state) in &mut self.parts {
            let log_start = earliest.get(tp).copied().unwrap_or(0);
            let high_watermark = latest.get(tp).copied().unwrap_or(0);
            state.position = self.opts.start_offset.max(log_start);
            if state.position > self.opts.start_offset {
                warn!(topic = %tp.topic, partition = tp.partition, start_offset = self.opts.start_offset, log_start,
                    "start offset is below the source log start; starting at the log start");
            }
            state.report.start_high_watermark = high_watermark;
            info!(topic = %tp.topic, partition = tp.partition, position = state.position, high_watermark,
                "partition ready");
        }

        self.copy_loop().await
    }

    /// Refreshes metadata until every topic is known on that side.
    async fn wait_for_topics(&mut self, side: Side) -> Result<()> {
        let mut attempt = 0u32;
        loop {
            let last = match self.refresh(side).await {
                Ok(()) => {
                    let view = self.view(side);
                    let missing: Vec<String> = self
                        .opts
                        .topics
                        .iter()
                        .filter(|t| !view.partition_counts.contains_key(*t))
                        .map(|t| {
                            let code = view.topic_errors.get(t).copied().unwrap_or(0);
                            format!("{t} ({} {code})", error_name(code))
                        })
                        .collect();
                    if missing.is_empty() {
                        return Ok(());
                    }
                    format!("topic(s) not available: {}", missing.join(", "))
                }
                Err(e) if is_fatal(&e) => return Err(e),
                Err(e) => format!("{e:#}"),
            };
            attempt += 1;
            let role = self.view(side).role;
            if attempt > self.opts.max_retries {
                bail!("{role} metadata: giving up after {attempt} attempts: {last}");
            }
            warn!(role, attempt, error = %last, "metadata not ready, retrying");
            self.backoff(attempt).await?;
        }
    }

    fn view(&self, side: Side) -> &ClusterView {
        match side {
            Side::Source => &self.source,
            Side::Destination => &self.destination,
        }
    }

    /// One Metadata round trip, trying the bootstrap addresses and then every
    /// broker we already know.
    async fn refresh(&mut self, side: Side) -> Result<()> {
        let view = match side {
            Side::Source => &mut self.source,
            Side::Destination => &mut self.destination,
        };
        let req = MetadataRequest::default()
            .with_topics(Some(
                self.opts
                    .topics
                    .iter()
                    .map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t))))
                    .collect(),
            ))
            .with_allow_auto_topic_creation(false);
        let mut candidates = view.bootstrap.clone();
        for addr in view.brokers.values() {
            if !candidates.contains(addr) {
                candidates.push(addr.clone());
            }
        }
        let mut last_err = None;
        for addr in &candidates {
            let resp = match self.pool.call(addr, METADATA_VERSION, &req).await {
                Ok(resp) => resp,
                Err(e) if is_fatal(&e) => return Err(e),
                Err(e) => {
                    warn!(
                        role = view.role,
                        error = format!("{e:#}"),
                        "metadata request failed"
                    );
                    last_err = Some(e);
                    continue;
                }
            };
            view.brokers = resp
                .brokers
                .iter()
                .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
                .collect();
            view.leaders.clear();
            view.partition_counts.clear();
            view.topic_errors.clear();
            for topic in &resp.topics {
                let Some(name) = topic.name.as_ref().map(|n| n.0.as_str().to_owned()) else {
                    continue;
                };
                if topic.error_code != 0 {
                    if !is_retriable(topic.error_code) {
                        return Err(fatal(format!(
                            "{} metadata for topic {name}: {} ({})",
                            view.role,
                            error_name(topic.error_code),
                            topic.error_code
                        )));
                    }
                    view.topic_errors.insert(name, topic.error_code);
                    continue;
                }
                view.partition_counts
                    .insert(name.clone(), topic.partitions.len() as i32);
                for p in &topic.partitions {
                    // Partitions without a usable leader stay unmapped; using
                    // them triggers another refresh.
                    if let Some(addr) = view.brokers.get(&p.leader_id.0) {
                        view.leaders.insert(
                            Tp {
                                topic: name.clone(),
                                partition: p.partition_index,
                            },
                            addr.clone(),
                        );
                    }
                }
            }
            debug!(role = view.role, broker = %addr, leaders = view.leaders.len(), "metadata refreshed");
            return Ok(());
        }
        Err(last_err.unwrap_or_else(|| anyhow!("no {} address to ask", view.role)))
    }

    /// ListOffsets on the source for every partition; `timestamp` -2 gives
    /// the log start offset, -1 the high watermark (read_uncommitted).
    async fn list_offsets(&mut self, timestamp: i64) -> Result<HashMap<Tp, i64>> {
        let mut attempt = 0u32;
        loop {
            let last = match self.list_offsets_once(timestamp).await {
                Ok(offsets) => return Ok(offsets),
                Err(e) if is_fatal(&e) => return Err(e),
                Err(e) => e,
            };
            attempt += 1;
            if attempt > self.opts.max_retries {
                return Err(last.context(format!(
                    "source ListOffsets: giving up after {attempt} attempts"
                )));
            }
            warn!(
                attempt,
                error = format!("{last:#}"),
                "source ListOffsets failed, retrying"
            );
            self.backoff(attempt).await?;
            if let Err(e) = self.refresh(Side::Source).await {
                if is_fatal(&e) {
                    return Err(e);
                }
            }
        }
    }

    async fn list_offsets_once(&mut self, timestamp: i64) -> Result<HashMap<Tp, i64>> {
        let mut by_leader: BTreeMap<String, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
        for tp in self.parts.keys() {
            let addr = self
                .source
                .leaders
                .get(tp)
                .ok_or_else(|| anyhow!("no known source leader for {tp}"))?;
            by_leader
                .entry(addr.clone())
                .or_default()
                .entry(tp.topic.clone())
                .or_default()
                .push(tp.partition);
        }
        let mut offsets = HashMap::new();
        for (addr, topics) in by_leader {
            let req = ListOffsetsRequest::default()
                .with_replica_id(BrokerId(-1))
                .with_isolation_level(0)
                .with_topics(
                    topics
                        .iter()
                        .map(|(topic, partitions)| {
                            ListOffsetsTopic::default()
                                .with_name(topic_name(topic))
                                .with_partitions(
                                    partitions
                                        .iter()
                                        .map(|p| {
                                            ListOffsetsPartition::default()
                                                .with_partition_index(*p)
                                                .with_timestamp(timestamp)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                );
            let resp = self.pool.call(&addr, LIST_OFFSETS_VERSION, &req).await?;
            for topic in &resp.topics {
                for p in &topic.partitions {
                    let tp = Tp {
                        topic: topic.name.0.as_str().to_owned(),
                        partition: p.partition_index,
                    };
                    if p.error_code != 0 {
                        let msg = format!(
                            "source ListOffsets for {tp}: {} ({})",
                            error_name(p.error_code),
                            p.error_code
                        );
                        return Err(if is_retriable(p.error_code) {
                            anyhow!(msg)
                        } else {
                            fatal(msg)
                        });
                    }
                    offsets.insert(tp, p.offset);
                }
            }
        }
        for tp in self.parts.keys() {
            if !offsets.contains_key(tp) {
                bail!("source ListOffsets response lacks {tp}");
            }
        }
        Ok(offsets)
    }

    async fn copy_loop(&mut self) -> Result<()> {
        // Consecutive rounds with a failure; a round without one resets it.
        let mut failed_rounds = 0u32;
        loop {
            if self.cancelled() {
                return Err(Cancelled.into());
            }
            let follow = self.opts.mode == Mode::Follow;
            let mut by_leader: BTreeMap<String, Vec<Tp>> = BTreeMap::new();
            let mut failure: Option<String> = None;
            for (tp, state) in &self.parts {
                if !follow && state.position >= state.report.start_high_watermark {
                    continue;
                }
                match self.source.leaders.get(tp) {
                    Some(addr) => by_leader.entry(addr.clone()).or_default().push(tp.clone()),
                    None => failure = Some(format!("no known source leader for {tp}")),
                }
            }
            if by_leader.is_empty() && failure.is_none() {
                info!("every partition reached the source high watermark seen at start");
                return Ok(());
            }
            self.round = self.round.wrapping_add(1);
            for (addr, mut tps) in by_leader {
                // The broker fills a response in request order and only the
                // first partition is sure to get a whole batch, so a busy
                // partition must not always come first.
                let len = tps.len();
                tps.rotate_left(self.round % len);
                match self.fetch_and_copy(&addr, &tps).await {
                    Ok(None) => {}
                    Ok(Some(reason)) => failure = Some(reason),
                    Err(e) if is_fatal(&e) => return Err(e),
                    Err(e) => failure = Some(format!("{e:#}")),
                }
                if self.cancelled() {
                    return Err(Cancelled.into());
                }
            }
            let Some(reason) = failure else {
                failed_rounds = 0;
                continue;
            };
            failed_rounds += 1;
            if failed_rounds > self.opts.max_retries {
                bail!("source fetch: giving up after {failed_rounds} failed attempts: {reason}");
            }
            warn!(attempt = failed_rounds, error = %reason, "source fetch failed, refreshing metadata and retrying");
            self.backoff(failed_rounds).await?;
            if let Err(e) = self.refresh(Side::Source).await {
                if is_fatal(&e) {
                    return Err(e);
                }
                warn!(error = format!("{e:#}"), "source metadata refresh failed");
            }
        }
    }

    /// One Fetch from one source leader, then every whole batch it returned
    /// copied in order. Returns a reason when some partition needs a retry.
    async fn fetch_and_copy(&mut self, addr: &str, tps: &[Tp]) -> Result<Option<String>> {
        // Grouped by topic, keeping the (rotated) order of first appearance.
        let mut topics: Vec<(&str, Vec<FetchPartition>)> = Vec::new();
        for tp in tps {
            let Some(state) = self.parts.get(tp) else {
                continue;
            };
            let partition = FetchPartition::default()
                .with_partition(tp.partition)
                .with_fetch_offset(state.position)
                .with_partition_max_bytes(self.opts.fetch_max_bytes);
            match topics.iter_mut().find(|(t, _)| *t == tp.topic) {
                Some((_, partitions)) => partitions.push(partition),
                None => topics.push((&tp.topic, vec![partition])),
            }
        }
        let req = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(FETCH_MAX_WAIT_MS)
            .with_min_bytes(1)
            .with_max_bytes(self.opts.fetch_max_bytes)
            .with_isolation_level(0) // read_uncommitted: copy transactional data as it is
            .with_session_id(0)
            .with_session_epoch(-1) // no fetch session: every request is a full fetch
            .with_topics(
                topics
                    .into_iter()
                    .map(|(topic, partitions)| {
                        FetchTopic::default()
                            .with_topic(topic_name(topic))
                            .with_partitions(partitions)
                    })
                    .collect(),
            );
        let resp = self.pool.call(addr, FETCH_VERSION, &req).await?;
        if resp.error_code != 0 {
            let msg = format!(
                "source fetch from {addr}: {} ({})",
                error_name(resp.error_code),
                resp.error_code
            );
            return if is_retriable(resp.error_code) {
                Ok(Some(msg))
            } else {
                Err(fatal(msg))
            };
        }

        let mut retry_reason = None;
        for topic in resp.responses {
            for p in topic.partitions {
                let tp = Tp {
                    topic: topic.topic.0.as_str().to_owned(),
                    partition: p.partition_index,
                };
                let Some(position) = self.parts.get(&tp).map(|s| s.position) else {
                    warn!(topic = %tp.topic, partition = tp.partition, "fetch response for a partition not asked for");
                    continue;
                };
                if p.error_code != 0 {
                    let msg = format!(
                        "source fetch of {tp} at offset {position} from {addr}: {} ({})",
                        error_name(p.error_code),
                        p.error_code
                    );
                    if is_retriable(p.error_code) {
                        warn!(topic = %tp.topic, partition = tp.partition, error = %msg, "retriable fetch error");
                        retry_reason = Some(msg);
                        continue;
                    }
                    return Err(fatal(msg));
                }
                let records = p.records.unwrap_or_default();
                let split = split_batches(&records)
                    .map_err(|e| fatal(format!("source {tp} at offset {position}: {e:#}")))?;
                self.copy_batches(&tp, &split, p.high_watermark).await?;
            }
        }
        Ok(retry_reason)
    }

    async fn copy_batches(
        &mut self,
        tp: &Tp,
        split: &SplitBatches,
        high_watermark: i64,
    ) -> Result<()> {
        let (mut copied, mut records, mut skipped) = (0u64, 0u64, 0u64);
        let mut range: Option<(i64, i64)> = None;
        for batch in &split.batches {
            if self.cancelled() {
                break;
            }
            let Some(position) = self.parts.get(tp).map(|s| s.position) else {
                return Ok(());
            };
            // The broker starts at the batch that holds the fetch offset; a
            // batch wholly before it was already handled.
            if batch.last_offset < position {
                continue;
            }
            if batch.is_control() {
                skipped += 1;
                debug!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                    producer_id = batch.producer_id, "skipped control batch");
            } else {
                let dest_offset = self.produce_batch(tp, batch).await?;
                debug!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                    dest_offset, producer_id = batch.producer_id, records = batch.record_count,
                    "copied batch");
                copied += 1;
                records += u64::try_from(batch.record_count).unwrap_or(0);
                range = Some((range.map_or(batch.base_offset, |r| r.0), batch.last_offset));
            }
            if let Some(state) = self.parts.get_mut(tp) {
                state.position = batch.last_offset + 1;
                let r = &mut state.report;
                if batch.is_control() {
                    r.control_batches_skipped += 1;
                } else {
                    r.batches_copied += 1;
                    r.records_copied += u64::try_from(batch.record_count).unwrap_or(0);
                    r.first_offset.get_or_insert(batch.base_offset);
                    r.last_offset = Some(batch.last_offset);
                }
            }
        }
        if split.partial_len > 0 {
            // Refetched from the next offset in a later round.
            debug!(topic = %tp.topic, partition = tp.partition, bytes = split.partial_len,
                needed = split.partial_needed, "ignored a partial trailing batch");
        }
        if copied > 0 || skipped > 0 {
            let position = self.parts.get(tp).map_or(0, |s| s.position);
            info!(topic = %tp.topic, partition = tp.partition, batches = copied, records,
                control_skipped = skipped, first = range.map(|r| r.0), last = range.map(|r| r.1),
                next_offset = position, high_watermark, "copied");
        }
        Ok(())
    }

    /// Produces one batch, byte for byte, alone in its request; retries the
    /// same bytes on retriable failures. Returns the destination base offset.
    async fn produce_batch(&mut self, tp: &Tp, batch: &RawBatch) -> Result<i64> {
        // Built once: every retry sends the very same bytes.
        let req = produce_request(&tp.topic, tp.partition, batch, &self.transactional_id);
        let mut attempt = 0u32;
        loop {
            let reason = match self.destination.leaders.get(tp).cloned() {
                None => format!("no known destination leader for {tp}"),
                Some(addr) => match self.pool.call(&addr, PRODUCE_VERSION, &req).await {
                    Err(e) if is_fatal(&e) => return Err(e),
                    Err(e) => format!("{e:#}"),
                    Ok(resp) => {
                        let partition = resp
                            .responses
                            .iter()
                            .filter(|t| t.name.0.as_str() == tp.topic)
                            .flat_map(|t| t.partition_responses.iter())
                            .find(|p| p.index == tp.partition);
                        match partition {
                            None => format!("produce response from {addr} lacks {tp}"),
                            Some(p) if p.error_code == 0 => return Ok(p.base_offset),
                            Some(p) if p.error_code == DUPLICATE_SEQUENCE_NUMBER => {
                                warn!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset,
                                    "destination reports a duplicate: an earlier attempt already landed");
                                return Ok(p.base_offset);
                            }
                            Some(p) => {
                                let mut msg = format!(
                                    "{} ({}): {}",
                                    error_name(p.error_code),
                                    p.error_code,
                                    p.error_message
                                        .as_ref()
                                        .map_or("(no error message)", |m| m.as_str())
                                );
                                for e in &p.record_errors {
                                    if let Some(m) = &e.batch_index_error_message {
                                        msg.push_str(&format!(
                                            "; record {}: {}",
                                            e.batch_index,
                                            m.as_str()
                                        ));
                                    }
                                }
                                if !is_retriable(p.error_code) {
                                    return Err(fatal(format!(
                                        "destination {addr} refused the batch of {tp} at source offset {} \
                                         (producerId {}, epoch {}, baseSequence {}, transactional {}): error {msg}",
                                        batch.base_offset,
                                        batch.producer_id,
                                        batch.producer_epoch,
                                        batch.base_sequence,
                                        batch.is_transactional()
                                    )));
                                }
                                msg
                            }
                        }
                    }
                },
            };
            attempt += 1;
            if attempt > self.opts.max_retries {
                // Fatal, so the fetch loop does not start the retries over.
                return Err(fatal(format!(
                    "giving up on the batch of {tp} at source offset {} after {} attempts: {reason}",
                    batch.base_offset, attempt
                )));
            }
            warn!(topic = %tp.topic, partition = tp.partition, offset = batch.base_offset, attempt,
                error = %reason, "produce failed, retrying the same bytes");
            self.backoff(attempt).await?;
            if let Err(e) = self.refresh(Side::Destination).await {
                if is_fatal(&e) {
                    return Err(e);
                }
                warn!(
                    error = format!("{e:#}"),
                    "destination metadata refresh failed"
                );
            }
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
  --start-offset N               first source offset per partition (default 0)
  --mode follow|until-caught-up  keep running, or stop at the start high watermark (default follow)
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
            "--max-retries" => opts.max_retries = number(&flag, value()?)?,
            "--retry-backoff-ms" => {
                opts.retry_backoff = Duration::from_millis(number(&flag, value()?)?)
            }
            "--fetch-max-bytes" => opts.fetch_max_bytes = number(&flag, value()?)?,
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
    fn produce_request_sets_transactional_id_only_for_transactional_batches() {
        let mut data = batch(0, 0, ATTR_TRANSACTIONAL, 1, b"t");
        data.extend(batch(1, 0, 0, 1, b"p"));
        let split = split_batches(&Bytes::from(data)).expect("valid input");
        let id = TransactionalId(StrBytes::from_static_str("mirror-a"));
        let txn = produce_request("t", 3, &split.batches[0], &id);
        assert_eq!(txn.transactional_id, Some(id.clone()));
        assert_eq!(txn.acks, -1);
        assert_eq!(txn.topic_data.len(), 1);
        assert_eq!(txn.topic_data[0].partition_data.len(), 1);
        assert_eq!(txn.topic_data[0].partition_data[0].index, 3);
        let plain = produce_request("t", 3, &split.batches[1], &id);
        assert_eq!(plain.transactional_id, None);
        assert_eq!(
            plain.topic_data[0].partition_data[0].records,
            Some(split.batches[1].produce_bytes())
        );
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
        assert!(parse_args(["--source".to_owned()]).is_err());
        assert!(parse_args(Vec::new()).is_err());
    }
}
