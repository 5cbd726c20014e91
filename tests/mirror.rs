//! End-to-end tests of mirroring through the proxy, against real Kafka
//! brokers: real producers (librdkafka and Kafka's Java console producer)
//! write to source clusters, the raw-batch replicator (`replicate`)
//! copies their batches through the proxy, and the destination logs are read
//! back from disk (DumpLogSegments and the raw segment bytes).
//!
//! To keep the run short, one set of clusters serves several scenarios, each
//! on its own topics:
//!
//! | cluster | id        | role                                                          |
//! |---------|-----------|---------------------------------------------------------------|
//! | A       | [`ID_A`]  | source: `fan`, `t`, `codecs`                                  |
//! | B       | [`ID_B`]  | destination of A and C through proxy PB; source of the chain  |
//! | C       | [`ID_C`]  | source of `fan` (fan-in); destination of B through proxy PC   |
//!
//! The spoofing test runs alone with its own broker and a TLS proxy.
//!
//! Expected producer ids are computed here, from the SPEC's definition
//! (`f` and `cluster_hash` below), not with the crate's own mapping code.

mod support;

use std::collections::BTreeSet;
use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{Offset, TopicPartitionList};

use kafka_mirror_proxy::config::replicator::Isolation;
use kafka_mirror_proxy::replicate::Report as ReplicationReport;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{partition_result, record_batch, RawClient};

/// SPEC §4's example id: hash 0x71720375, PID 5 maps to [`MAPPED_A_5`].
const ID_A: &str = "MkU3OEVBNTcwNTJENDM2Qk";
const MAPPED_A_5: i64 = -5136071999516311547;
/// Random ids, fixed so failures are reproducible.
const ID_B: &str = "q1Zx7Kd8Tj2m4Wf0hYvRsA";
/// base64url("foobarbazqux1234").
const ID_C: &str = "Zm9vYmFyYmF6cXV4MTIzNA";

const REMAPPED: &str = "kafka_mirror_proxy_mirror_batches_remapped_total";
const CODECS: [&str; 4] = ["gzip", "snappy", "lz4", "zstd"];
/// Generous: brokers and JVM tools share 2 cores.
const WAIT: Duration = Duration::from_secs(60);

// Kafka error codes.
const NONE: i16 = 0;
const CORRUPT_MESSAGE: i16 = 2;
const TOPIC_AUTHORIZATION_FAILED: i16 = 29;
const POLICY_VIOLATION: i16 = 44;

// ---------------------------------------------------------------------------
// The mapping, computed independently of the crate.

/// SPEC §4: decode the 22-character URL-safe base64 id into 16 bytes, XOR the
/// big-endian 64-bit halves, keep the low 32 bits.
fn cluster_hash(id: &str) -> u32 {
    let mut bytes = Vec::new();
    let (mut acc, mut bits) = (0u32, 0u32);
    for c in id.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => panic!("{id:?} is not URL-safe base64"),
        };
        acc = acc << 6 | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            bytes.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    assert!(id.len() == 22 && bytes.len() == 16, "cluster id {id:?}");
    let half = |b: &[u8]| b.iter().fold(0u64, |n, &x| n << 8 | u64::from(x));
    (half(&bytes[..8]) ^ half(&bytes[8..])) as u32
}

/// F(hash, pid) = sign | hash << 31 | pid, for a source pid in 0..2^31.
fn f(hash: u32, pid: i64) -> i64 {
    assert!(
        (0..1 << 31).contains(&pid),
        "source pid {pid} outside 0..2^31"
    );
    (1u64 << 63 | u64::from(hash) << 31 | pid as u64) as i64
}

/// (region, identity) of a mapped pid.
fn split(pid: i64) -> (u32, i64) {
    ((pid as u64 >> 31) as u32, pid & 0x7FFF_FFFF)
}

#[test]
fn the_mapping_matches_the_spec_constant() {
    assert_eq!(cluster_hash(ID_A), 0x7172_0375, "SPEC §4 hash of {ID_A}");
    assert_eq!(f(cluster_hash(ID_A), 5), MAPPED_A_5, "SPEC §4 F({ID_A}, 5)");
    assert_eq!(split(MAPPED_A_5), (0x7172_0375, 5));
    // The fixed ids of this file must not share a region.
    let regions: BTreeSet<u32> = [ID_A, ID_B, ID_C].map(cluster_hash).into();
    assert_eq!(regions.len(), 3, "regions of A, B and C: {regions:x?}");
}

// ---------------------------------------------------------------------------
// Clusters, topics, producers, replication.

/// Starts one broker per id, concurrently.
fn start_clusters<const N: usize>(ids: [Option<&str>; N]) -> Result<[KafkaCluster; N]> {
    let started: Vec<Result<KafkaCluster>> = thread::scope(|s| {
        let handles: Vec<_> = ids
            .iter()
            .map(|id| {
                s.spawn(move || {
                    let mut opts = KafkaOptions::default();
                    if let Some(id) = id {
                        opts = opts.cluster_id(*id);
                    }
                    KafkaCluster::start(opts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("broker start panicked")))
            })
            .collect()
    });
    let clusters = started.into_iter().collect::<Result<Vec<_>>>()?;
    clusters
        .try_into()
        .map_err(|_| anyhow!("wrong number of clusters"))
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?)
}

/// Creates `(name, partitions)` topics (replication factor 1) with librdkafka,
/// which is much quicker than a JVM per topic.
fn create_topics(
    rt: &tokio::runtime::Runtime,
    cluster: &KafkaCluster,
    topics: &[(&str, i32)],
) -> Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap())
        .create()?;
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(name, n)| NewTopic::new(name, *n, TopicReplication::Fixed(1)))
        .collect();
    let opts = AdminOptions::new().operation_timeout(Some(WAIT));
    for r in rt.block_on(admin.create_topics(&new, &opts))? {
        r.map_err(|(topic, code)| {
            anyhow!(
                "creating topic {topic} on {}: {code:?}",
                cluster.bootstrap()
            )
        })?;
    }
    Ok(())
}

/// Collects librdkafka delivery failures, so a lost record fails loudly.
#[derive(Default)]
struct Deliveries {
    errors: Mutex<Vec<String>>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, m)) = result {
            if let Ok(mut errors) = self.errors.lock() {
                errors.push(format!(
                    "{e} (key {:?})",
                    m.key().map(String::from_utf8_lossy)
                ));
            }
        }
    }
}

type RdProducer = BaseProducer<Deliveries>;

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> Result<RdProducer> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "20")
        .set("message.timeout.ms", "60000");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    Ok(config.create_with_context(Deliveries::default())?)
}

/// The headers every produced record carries, derived from its key, so the
/// destination's header values can be checked record by record.
fn headers_for(key: &str) -> [(String, String); 2] {
    [
        ("origin".into(), "source-producer".into()),
        ("key-echo".into(), format!("echo of {key}")),
    ]
}

/// Sends one record per key to `partition` and waits for all of them.
fn send_all(p: &RdProducer, topic: &str, partition: i32, keys: &[String]) -> Result<()> {
    for key in keys {
        let value = format!("value of {key}");
        let mut headers = OwnedHeaders::new();
        for (k, v) in headers_for(key) {
            headers = headers.insert(Header {
                key: &k,
                value: Some(&v),
            });
        }
        let record = BaseRecord::to(topic)
            .partition(partition)
            .key(key)
            .payload(&value)
            .headers(headers);
        p.send(record)
            .map_err(|(e, _)| anyhow!("queueing {key} for {topic}-{partition}: {e}"))?;
    }
    flush(p)
}

fn flush(p: &RdProducer) -> Result<()> {
    p.flush(WAIT)?;
    let errors = p
        .context()
        .errors
        .lock()
        .map(|e| e.clone())
        .unwrap_or_default();
    ensure!(errors.is_empty(), "delivery failures: {errors:?}");
    Ok(())
}

fn keys(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Copies `topic` from `source` into the proxy at `destination` with the
/// link's client id, until caught up, reading the source read_committed
/// (the replicator's default).
fn replicate(
    rt: &tokio::runtime::Runtime,
    source: &KafkaCluster,
    destination: &ProxyProcess,
    topic: &str,
    client_id: &str,
) -> Result<ReplicationReport> {
    replicate_at(
        rt,
        source,
        destination,
        topic,
        client_id,
        Isolation::ReadCommitted,
    )
}

/// [`replicate`] reading the source at `isolation`.
fn replicate_at(
    rt: &tokio::runtime::Runtime,
    source: &KafkaCluster,
    destination: &ProxyProcess,
    topic: &str,
    client_id: &str,
    isolation: Isolation,
) -> Result<ReplicationReport> {
    let mut config = support::replicator::config(
        &source.bootstrap(),
        &destination.bootstrap,
        topic,
        client_id,
    );
    config.isolation = isolation;
    support::replicator::run(rt, config).with_context(|| {
        format!(
            "replicating {topic} from {} to the proxy as {client_id}; proxy log:\n{}",
            source.bootstrap(),
            tools::tail_str(&destination.logs(), 30)
        )
    })
}

/// Runs `f` and returns how much the proxy's remap counter of `link` grew.
fn remapped_during<T>(
    proxy: &ProxyProcess,
    link: &str,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, i64)> {
    let sample = format!("{REMAPPED}{{link=\"{link}\"}}");
    let before = proxy.metric(&sample)?;
    let out = f()?;
    Ok((out, proxy.metric(&sample)? - before))
}

// ---------------------------------------------------------------------------
// Reading logs back.

/// A partition of a cluster, for dumping.
struct Part<'a> {
    cluster: &'a KafkaCluster,
    topic: &'a str,
    partition: i32,
}

fn part<'a>(cluster: &'a KafkaCluster, topic: &'a str, partition: i32) -> Part<'a> {
    Part {
        cluster,
        topic,
        partition,
    }
}

/// Deep DumpLogSegments of several partitions in one JVM run (`--files`
/// takes a comma-separated list); one batch list per partition, in order.
fn dump(parts: &[Part<'_>]) -> Result<Vec<Vec<DumpedBatch>>> {
    let mut files: Vec<Vec<PathBuf>> = Vec::new();
    for p in parts {
        files.push(p.cluster.segment_files(p.topic, p.partition)?);
    }
    let all: Vec<String> = files
        .iter()
        .flatten()
        .map(|f| f.display().to_string())
        .collect();
    ensure!(
        all.iter().all(|f| !f.contains(',')),
        "segment paths with commas: {all:?}"
    );
    let joined = all.join(",");
    let out = tools::java(
        tools::DUMP_LOG_SEGMENTS,
        &["--files", &joined, "--deep-iteration", "--print-data-log"],
    )?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    ensure!(
        out.status.success(),
        "DumpLogSegments failed ({}): {}\n{}",
        out.status,
        tools::tail_str(&stdout, 20),
        tools::tail_str(&String::from_utf8_lossy(&out.stderr), 20)
    );
    // Each file's output starts with "Dumping <path>".
    let mut sections: Vec<(String, String)> = Vec::new();
    for line in stdout.lines() {
        if let Some(path) = line.strip_prefix("Dumping ") {
            sections.push((path.trim().to_string(), String::new()));
        } else if let Some((_, text)) = sections.last_mut() {
            text.push_str(line);
            text.push('\n');
        }
    }
    let mut result = Vec::new();
    for (p, files) in parts.iter().zip(&files) {
        let mut batches = Vec::new();
        for file in files {
            let file = file.display().to_string();
            let (_, text) = sections
                .iter()
                .find(|(path, _)| *path == file)
                .ok_or_else(|| anyhow!("no DumpLogSegments section for {file}:\n{stdout}"))?;
            batches.extend(tools::parse_dump_log_segments(text)?);
        }
        eprintln!(
            "dumped {}-{} on {}: {} batches",
            p.topic,
            p.partition,
            p.cluster.cluster_id(),
            batches.len()
        );
        result.push(batches);
    }
    Ok(result)
}

/// The raw bytes of every batch in a partition's segment files, in order.
fn raw_batches(cluster: &KafkaCluster, topic: &str, partition: i32) -> Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for file in cluster.segment_files(topic, partition)? {
        let bytes = fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
        let mut pos = 0;
        while pos + 12 <= bytes.len() {
            let len = i32::from_be_bytes(bytes[pos + 8..pos + 12].try_into()?);
            ensure!(len > 0, "{}: batchLength {len} at {pos}", file.display());
            let end = pos + 12 + len as usize;
            ensure!(
                end <= bytes.len(),
                "{}: truncated batch at {pos}",
                file.display()
            );
            out.push(bytes[pos..end].to_vec());
            pos = end;
        }
    }
    Ok(out)
}

fn is_control(raw: &[u8]) -> bool {
    raw[22] & 0x20 != 0 // attributes (int16 at 21), bit 5
}

fn raw_pid(raw: &[u8]) -> i64 {
    i64::from_be_bytes(raw[43..51].try_into().expect("8 bytes"))
}

/// Whether the stored CRC-32C (at 17) covers bytes 21.. correctly.
fn crc_ok(raw: &[u8]) -> bool {
    let stored = u32::from_be_bytes(raw[17..21].try_into().expect("4 bytes"));
    crc32c::crc32c(&raw[21..]) == stored
}

/// Byte positions where a destination batch differs from its source batch
/// outside the fields a mirror may change: baseOffset (0..8),
/// partitionLeaderEpoch (12..16), crc (17..21) and producerId (43..51).
fn unexpected_differences(source: &[u8], dest: &[u8]) -> Vec<usize> {
    let allowed =
        |i: usize| i < 8 || (12..16).contains(&i) || (17..21).contains(&i) || (43..51).contains(&i);
    if source.len() != dest.len() {
        return vec![usize::MAX];
    }
    (0..source.len())
        .filter(|&i| !allowed(i) && source[i] != dest[i])
        .collect()
}

fn data_batches(batches: &[DumpedBatch]) -> Vec<&DumpedBatch> {
    batches.iter().filter(|b| !b.is_control).collect()
}

/// A batch's header fields on one line (records left out).
fn summary(b: &DumpedBatch) -> String {
    format!(
        "offset {}..={} producerId {} epoch {} seq {}..={} count {} txn {} control {} codec {} valid {} records {}",
        b.base_offset,
        b.last_offset,
        b.producer_id,
        b.producer_epoch,
        b.base_sequence,
        b.last_sequence,
        b.count,
        b.is_transactional,
        b.is_control,
        b.compresscodec,
        b.is_valid,
        b.records.len()
    )
}

type RecordView = (Option<String>, Option<String>, Vec<String>);

fn records(b: &DumpedBatch) -> Vec<RecordView> {
    b.records
        .iter()
        .map(|r| (r.key.clone(), r.payload.clone(), r.header_keys.clone()))
        .collect()
}

/// Checks that `dest` holds exactly `source`'s data batches, in order, each
/// with `expected_pid(source pid)`, a valid CRC, and the same records,
/// header keys, epoch, sequence and flags. Returns the number checked.
fn assert_mirrored(
    what: &str,
    source: &[DumpedBatch],
    dest: &[DumpedBatch],
    expected_pid: impl Fn(i64) -> i64,
) -> usize {
    let source = data_batches(source);
    assert!(!source.is_empty(), "{what}: no data batches on the source");
    assert_eq!(
        dest.len(),
        source.len(),
        "{what}: the destination must hold exactly the source's data batches (control batches skipped)"
    );
    for (i, (s, d)) in source.iter().zip(dest).enumerate() {
        let ctx = format!(
            "{what}, batch #{i}\n  source: {}\n  dest:   {}",
            summary(s),
            summary(d)
        );
        assert_eq!(
            d.producer_id,
            expected_pid(s.producer_id),
            "producerId: {ctx}"
        );
        assert!(d.is_valid, "isvalid: {ctx}");
        assert!(!d.is_control, "control: {ctx}");
        assert_eq!(d.count, s.count, "count: {ctx}");
        assert_eq!(
            (d.producer_epoch, d.base_sequence, d.last_sequence),
            (s.producer_epoch, s.base_sequence, s.last_sequence),
            "epoch and sequences: {ctx}"
        );
        assert_eq!(
            d.is_transactional, s.is_transactional,
            "transactional: {ctx}"
        );
        assert_eq!(d.compresscodec, s.compresscodec, "compresscodec: {ctx}");
        assert_eq!(records(d), records(s), "records: {ctx}");
    }
    source.len()
}

/// Checks the raw bytes: each destination batch equals its source data batch
/// except baseOffset, partitionLeaderEpoch, crc and producerId; the producer
/// id is `expected_pid(source pid)` and the CRC is valid.
fn assert_raw_mirrored(
    what: &str,
    source: &KafkaCluster,
    dest: &KafkaCluster,
    topic: &str,
    partition: i32,
    expected_pid: impl Fn(i64) -> i64,
) -> Result<()> {
    let s: Vec<Vec<u8>> = raw_batches(source, topic, partition)?
        .into_iter()
        .filter(|b| !is_control(b))
        .collect();
    let d = raw_batches(dest, topic, partition)?;
    assert_eq!(
        d.len(),
        s.len(),
        "{what}: raw batch count of {topic}-{partition}"
    );
    for (i, (s, d)) in s.iter().zip(&d).enumerate() {
        let diff = unexpected_differences(s, d);
        assert!(
            diff.is_empty(),
            "{what}: {topic}-{partition} batch #{i} differs at bytes {diff:?} (lengths {} and {})",
            s.len(),
            d.len()
        );
        assert_eq!(
            raw_pid(d),
            expected_pid(raw_pid(s)),
            "{what}: {topic}-{partition} batch #{i} producerId bytes"
        );
        assert!(
            crc_ok(d),
            "{what}: {topic}-{partition} batch #{i}: the destination CRC must be valid"
        );
    }
    Ok(())
}

/// (partition, key, value, headers) of a consumed record.
type Consumed = (i32, String, String, Vec<(String, String)>);

/// Consumes `n` records of `topic` (partitions `0..partitions`) from the
/// beginning, through `bootstrap`, without a consumer group.
fn consume(bootstrap: &str, topic: &str, partitions: i32, n: usize) -> Result<Vec<Consumed>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "mirror-test-verifier")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_uncommitted")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let text = |b: Option<&[u8]>| String::from_utf8_lossy(b.unwrap_or_default()).into_owned();
    let mut out = Vec::new();
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        if Instant::now() > deadline {
            bail!(
                "consumed {} of {n} records of {topic} within {WAIT:?}",
                out.len()
            );
        }
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m?;
        let headers = m
            .headers()
            .map(|h| {
                h.iter()
                    .map(|h| (h.key.to_string(), text(h.value)))
                    .collect()
            })
            .unwrap_or_default();
        out.push((m.partition(), text(m.key()), text(m.payload()), headers));
    }
    Ok(out)
}

fn start_proxy(upstream: &KafkaCluster, env: &[(&str, &str)]) -> Result<ProxyProcess> {
    ProxyProcess::start(&upstream.bootstrap(), env)
        .with_context(|| format!("starting the proxy in front of {}", upstream.bootstrap()))
}

// ---------------------------------------------------------------------------
// The scenarios.

/// A → B (idempotent, transactional committed and aborted), local traffic on
/// B, fan-in of A and C into B, every codec, the chain A → B → C, and
/// corrupt, oversized and off-link input.
#[test]
fn mirror_end_to_end() -> Result<()> {
    let started = Instant::now();
    let [a, b, c] = start_clusters([Some(ID_A), Some(ID_B), Some(ID_C)])?;
    let (ha, hb, hc) = (cluster_hash(ID_A), cluster_hash(ID_B), cluster_hash(ID_C));
    let rt = runtime()?;
    create_topics(&rt, &a, &[("fan", 1), ("t", 2), ("codecs", 1)])?;
    create_topics(
        &rt,
        &b,
        &[
            ("fan", 1),
            ("t", 2),
            ("codecs", 1),
            ("local", 1),
            ("corrupt", 1),
        ],
    )?;
    create_topics(&rt, &c, &[("fan", 1), ("t", 2)])?;

    // PB in front of B: link a (from A) and link c (from C, fan-in only).
    // `corr.*` checks that topics are patterns matched against the whole name.
    let pb = start_proxy(
        &b,
        &[
            ("LINKS", "a,c"),
            ("LINK_A_SOURCE_CLUSTER_ID", ID_A),
            ("LINK_A_TOPICS", "t,fan,codecs,corr.*"),
            ("LINK_C_SOURCE_CLUSTER_ID", ID_C),
            ("LINK_C_TOPICS", "fan"),
        ],
    )?;
    // PC in front of C: link b (from B), the second hop of the chain.
    let pc = start_proxy(
        &c,
        &[
            ("LINKS", "b"),
            ("LINK_B_SOURCE_CLUSTER_ID", ID_B),
            ("LINK_B_TOPICS", "t"),
        ],
    )?;
    eprintln!("setup took {:.1} s", started.elapsed().as_secs_f64());

    // --- Source data. The fan-in producers come first, so each is the first
    // idempotent producer of its cluster.
    let fan_a = producer(&a.bootstrap(), &[("enable.idempotence", "true")])?;
    let fan_c = producer(&c.bootstrap(), &[("enable.idempotence", "true")])?;
    for round in 0..3 {
        send_all(&fan_a, "fan", 0, &keys(&format!("fan-a-{round}"), 4))?;
        send_all(&fan_c, "fan", 0, &keys(&format!("fan-c-{round}"), 3))?;
    }
    drop((fan_a, fan_c));

    let idempotent = producer(&a.bootstrap(), &[("enable.idempotence", "true")])?;
    let txn = producer(
        &a.bootstrap(),
        &[
            ("transactional.id", "source-txn"),
            ("enable.idempotence", "true"),
        ],
    )?;
    txn.init_transactions(WAIT)?;
    let mut sent_t = 0;
    for round in 0..2 {
        for p in 0..2 {
            let k = keys(&format!("idem-r{round}-p{p}"), 5);
            send_all(&idempotent, "t", p, &k)?;
            sent_t += k.len();
        }
    }
    for (outcome, n) in [("commit", 4), ("abort", 3)] {
        txn.begin_transaction()?;
        for p in 0..2 {
            let k = keys(&format!("txn-{outcome}-p{p}"), n);
            send_all(&txn, "t", p, &k)?;
            sent_t += k.len();
        }
        match outcome {
            "commit" => txn.commit_transaction(WAIT)?,
            _ => txn.abort_transaction(WAIT)?,
        }
    }
    // One more plain idempotent round after the transactions.
    for p in 0..2 {
        let k = keys(&format!("idem-after-p{p}"), 2);
        send_all(&idempotent, "t", p, &k)?;
        sent_t += k.len();
    }
    drop((idempotent, txn));

    // Java producers, one per codec, concurrently.
    thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = CODECS
            .iter()
            .map(|codec| {
                let bootstrap = a.bootstrap();
                s.spawn(move || {
                    let records: Vec<(String, String)> = (0..20)
                        .map(|i| {
                            (
                                format!("{codec}-key-{i}"),
                                format!("{codec} value {i}: {}", "compressible ".repeat(8)),
                            )
                        })
                        .collect();
                    tools::console_produce_kv(
                        &bootstrap,
                        "codecs",
                        &records,
                        &[
                            ("enable.idempotence", "true"),
                            ("acks", "all"),
                            ("compression.type", codec),
                            ("linger.ms", "100"),
                        ],
                    )
                    .with_context(|| format!("console producer with {codec}"))
                })
            })
            .collect();
        for h in handles {
            h.join()
                .map_err(|_| anyhow!("producer thread panicked"))??;
        }
        Ok(())
    })?;
    eprintln!(
        "source data written at {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // --- Replication through PB (A and C into B), then B into C through PC.
    let (fan_report_a, fan_remapped_a) =
        remapped_during(&pb, "a", || replicate(&rt, &a, &pb, "fan", "mirror-a"))?;
    let (fan_report_c, fan_remapped_c) =
        remapped_during(&pb, "c", || replicate(&rt, &c, &pb, "fan", "mirror-c"))?;
    // read_uncommitted: this scenario checks that every data batch, those
    // of the aborted transaction included, crosses byte for byte
    // (tests/transactions.rs covers the read_committed default).
    let (t_report, t_remapped) = remapped_during(&pb, "a", || {
        replicate_at(&rt, &a, &pb, "t", "mirror-a", Isolation::ReadUncommitted)
    })?;
    let (codecs_report, codecs_remapped) =
        remapped_during(&pb, "a", || replicate(&rt, &a, &pb, "codecs", "mirror-a"))?;

    // --- Local traffic through PB: another client id, so never remapped.
    let (_, local_remapped) = remapped_during(&pb, "a", || {
        let local = producer(
            &pb.bootstrap,
            &[("enable.idempotence", "true"), ("client.id", "local-app")],
        )?;
        send_all(&local, "local", 0, &keys("local", 6))
    })?;

    let (chain_report, chain_remapped) =
        remapped_during(&pc, "b", || replicate(&rt, &b, &pc, "t", "mirror-b"))?;
    eprintln!(
        "replication done at {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // --- Corrupt, unplaceable and off-link input, by hand on the wire.
    let mut raw = RawClient::connect(&pb.node_address(1))?;
    let mut corrupt = record_batch(7, &["will", "be", "corrupted"]).to_vec();
    // Flip a letter of a record value: the batch still parses, only the CRC
    // tells, so a proxy that recomputed the CRC would get it appended.
    let at = corrupt
        .windows(9)
        .position(|w| w == b"corrupted")
        .context("value bytes in the batch")?;
    corrupt[at] = b'C';
    assert!(!crc_ok(&corrupt), "the flipped batch must have a bad CRC");
    let (code, message) =
        partition_result(&raw.produce("mirror-a", "corrupt", 0, corrupt.into())?);
    assert_eq!(
        code, CORRUPT_MESSAGE,
        "a corrupt batch on the link must be refused as CORRUPT_MESSAGE, not laundered (message {message:?})"
    );
    // A data batch whose control bit flipped in transit, CRC untouched: it
    // looks like a control batch, which the default policy answers without
    // writing. Answering it with success would lose its records.
    let mut flipped = record_batch(7, &["not", "a", "control", "batch"]).to_vec();
    flipped[22] ^= 0x20;
    assert!(is_control(&flipped) && !crc_ok(&flipped));
    let (code, message) =
        partition_result(&raw.produce("mirror-a", "corrupt", 0, flipped.into())?);
    assert_eq!(
        code, CORRUPT_MESSAGE,
        "a data batch with a flipped control bit must get CORRUPT_MESSAGE, never a silent success (message {message:?})"
    );
    // (A PID of 2^31 or more is resolved with a salt now: tests/state.rs.)
    let (code, message) =
        partition_result(&raw.produce("mirror-a", "local", 0, record_batch(7, &["off link"]))?);
    assert_eq!(
        code, POLICY_VIOLATION,
        "topic not in the link (message {message:?})"
    );
    let message = message.unwrap_or_default();
    assert!(
        message.contains("'a'") && message.contains("local"),
        "the POLICY_VIOLATION message must name link a and topic local: {message:?}"
    );
    // The same connection still mirrors a good batch.
    let (code, message) =
        partition_result(&raw.produce("mirror-a", "corrupt", 0, record_batch(7, &["good"]))?);
    assert_eq!(code, NONE, "a valid batch after the refusals ({message:?})");
    drop(raw);

    // --- Read every log back (one DumpLogSegments run).
    let dumps = dump(&[
        part(&a, "fan", 0),
        part(&c, "fan", 0),
        part(&b, "fan", 0),
        part(&a, "t", 0),
        part(&a, "t", 1),
        part(&b, "t", 0),
        part(&b, "t", 1),
        part(&c, "t", 0),
        part(&c, "t", 1),
        part(&a, "codecs", 0),
        part(&b, "codecs", 0),
        part(&b, "local", 0),
        part(&b, "corrupt", 0),
    ])?;
    let [a_fan, c_fan, b_fan, a_t0, a_t1, b_t0, b_t1, c_t0, c_t1, a_codecs, b_codecs, b_local, b_corrupt] =
        <[Vec<DumpedBatch>; 13]>::try_from(dumps).map_err(|_| anyhow!("dump count"))?;
    eprintln!("logs read at {:.1} s", started.elapsed().as_secs_f64());

    // 1. Fan-in: both sources' first producer is PID 0; on B they are two
    // producers, each in its own cluster's region.
    for (name, dumped) in [("A", &a_fan), ("C", &c_fan)] {
        let pids: BTreeSet<i64> = data_batches(dumped).iter().map(|b| b.producer_id).collect();
        assert_eq!(
            pids,
            BTreeSet::from([0]),
            "fan on {name}: the first idempotent producer of a fresh cluster has PID 0"
        );
    }
    let n_a = data_batches(&a_fan).len();
    assert!(
        b_fan.len() > n_a,
        "fan on B: {} batches, A alone has {n_a}",
        b_fan.len()
    );
    let checked_a = assert_mirrored("fan-in from A", &a_fan, &b_fan[..n_a], |p| f(ha, p));
    let checked_c = assert_mirrored("fan-in from C", &c_fan, &b_fan[n_a..], |p| f(hc, p));
    let b_fan_pids: BTreeSet<i64> = b_fan.iter().map(|b| b.producer_id).collect();
    assert_eq!(
        b_fan_pids.len(),
        2,
        "fan on B: two distinct producers, {b_fan_pids:?}"
    );
    assert_eq!(split(b_fan[0].producer_id), (ha, 0), "A's producer on B");
    assert_eq!(split(b_fan[n_a].producer_id), (hc, 0), "C's producer on B");
    assert_eq!(
        (fan_report_a.total_batches, fan_report_c.total_batches),
        (checked_a as u64, checked_c as u64),
        "fan: batches the replicator copied"
    );
    assert_eq!(
        (fan_remapped_a, fan_remapped_c),
        (checked_a as i64, checked_c as i64),
        "fan: remap metrics of links a and c"
    );

    // 2. A → B on t: idempotent and transactional producers.
    let mut t_batches = 0;
    let mut source_pids = BTreeSet::new();
    for (p, a_t, b_t) in [(0, &a_t0, &b_t0), (1, &a_t1, &b_t1)] {
        t_batches += assert_mirrored(&format!("t-{p} A → B"), a_t, b_t, |pid| f(ha, pid));
        assert_raw_mirrored(&format!("t-{p} A → B"), &a, &b, "t", p, |pid| f(ha, pid))?;
        // Both transactions reached A's log: one COMMIT and one ABORT marker.
        let markers: Vec<&str> = a_t
            .iter()
            .filter(|b| b.is_control)
            .filter_map(|b| b.records.first()?.end_txn_marker())
            .collect();
        assert_eq!(
            markers,
            ["COMMIT", "ABORT"],
            "transaction markers on A t-{p}"
        );
        assert!(
            data_batches(a_t).iter().any(|b| b.is_transactional)
                && data_batches(a_t).iter().any(|b| !b.is_transactional),
            "A t-{p} must hold transactional and plain idempotent batches"
        );
        source_pids.extend(data_batches(a_t).iter().map(|b| b.producer_id));
    }
    assert_eq!(
        source_pids.len(),
        2,
        "t on A: one idempotent and one transactional producer, {source_pids:?}"
    );
    assert!(
        source_pids.iter().all(|&p| p > 0),
        "t on A: real, non-zero PIDs (0 was the fan producer): {source_pids:?}"
    );
    let a_records: usize = [&a_t0, &a_t1]
        .iter()
        .flat_map(|d| data_batches(d))
        .map(|b| b.records.len())
        .sum();
    assert_eq!(a_records, sent_t, "records on A's t (all sent)");
    assert_eq!(
        t_report.total_batches, t_batches as u64,
        "t: batches copied"
    );
    assert_eq!(
        t_report.total_control_skipped, 4,
        "t: one COMMIT and one ABORT marker per partition skipped"
    );
    assert_eq!(
        t_remapped, t_batches as i64,
        "metric {REMAPPED}{{link=\"a\"}} must count every batch copied"
    );
    // Header values (DumpLogSegments prints keys only), read through PB.
    let consumed = consume(&pb.bootstrap, "t", 2, sent_t)?;
    let mut seen = BTreeSet::new();
    for (partition, key, value, headers) in &consumed {
        assert_eq!(value, &format!("value of {key}"), "value of {key} on B");
        assert_eq!(
            headers.as_slice(),
            headers_for(key).as_slice(),
            "headers of {key} on B t-{partition}"
        );
        seen.insert(key.clone());
    }
    assert_eq!(seen.len(), sent_t, "distinct records consumed from B's t");

    // 3. Local traffic through PB keeps its own, positive PID.
    let local = data_batches(&b_local);
    assert!(!local.is_empty(), "local producer wrote nothing to B");
    let local_pids: BTreeSet<i64> = local.iter().map(|b| b.producer_id).collect();
    assert_eq!(local_pids.len(), 1, "one local producer: {local_pids:?}");
    assert!(
        local_pids.iter().all(|&p| p >= 0),
        "a local idempotent producer keeps B's PID: {local_pids:?}"
    );
    assert_eq!(
        local_remapped, 0,
        "local traffic must not count as remapped"
    );
    assert_eq!(
        local.iter().map(|b| b.count).sum::<i64>(),
        6,
        "local records on B"
    );

    // 4. Codecs: byte-identical apart from the four allowed fields.
    let codecs_on_a: BTreeSet<&str> = data_batches(&a_codecs)
        .iter()
        .map(|b| b.compresscodec.as_str())
        .collect();
    assert_eq!(
        codecs_on_a,
        BTreeSet::from(CODECS),
        "A's codecs topic must hold a batch of every codec"
    );
    let codec_batches = assert_mirrored("codecs A → B", &a_codecs, &b_codecs, |p| f(ha, p));
    assert_raw_mirrored("codecs A → B", &a, &b, "codecs", 0, |p| f(ha, p))?;
    assert_eq!(
        codecs_report.total_batches, codec_batches as u64,
        "codecs: copied"
    );
    assert_eq!(
        codecs_remapped, codec_batches as i64,
        "codecs: remap metric"
    );

    // 5. Chain A → B → C: already-mapped PIDs pass the second hop unchanged.
    let mut chain_batches = 0;
    for (p, b_t, c_t) in [(0, &b_t0, &c_t0), (1, &b_t1, &c_t1)] {
        chain_batches += assert_mirrored(&format!("t-{p} B → C"), b_t, c_t, |pid| {
            assert!(pid < -1, "every PID on B's t is mapped, found {pid}");
            pid
        });
        assert_raw_mirrored(&format!("t-{p} B → C"), &b, &c, "t", p, |pid| pid)?;
        for batch in c_t {
            assert_eq!(
                split(batch.producer_id).0,
                ha,
                "t-{p} on C keeps A's region, not B's ({hb:#x}): {}",
                summary(batch)
            );
        }
    }
    assert_eq!(
        chain_report.total_batches, chain_batches as u64,
        "chain: copied"
    );
    assert_eq!(
        chain_report.total_control_skipped, 0,
        "B's t has no markers"
    );
    assert_eq!(
        chain_remapped, 0,
        "nothing may be mapped twice on the second hop"
    );

    // 6. Corrupt input never lands; the good batch after it does, remapped.
    assert_eq!(
        b_corrupt.len(),
        1,
        "corrupt-0 on B must hold only the valid batch: {b_corrupt:?}"
    );
    let good = &b_corrupt[0];
    assert_eq!(good.producer_id, f(ha, 7), "the valid batch's PID on B");
    assert!(good.is_valid, "{good:?}");
    assert_eq!(
        good.records
            .iter()
            .map(|r| r.payload.as_deref())
            .collect::<Vec<_>>(),
        [Some("good")],
        "corrupt-0 on B"
    );
    let raw_corrupt = raw_batches(&b, "corrupt", 0)?;
    assert!(
        raw_corrupt.len() == 1 && raw_corrupt.iter().all(|r| crc_ok(r)),
        "corrupt-0 on B: exactly one batch, with a valid CRC; found {:?}",
        raw_corrupt
            .iter()
            .map(|r| (raw_pid(r), crc_ok(r), r.len()))
            .collect::<Vec<_>>()
    );
    eprintln!("total {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}

/// A client that uses the link's client id needs the link's certificate.
#[test]
fn the_link_client_id_needs_the_link_certificate() -> Result<()> {
    let [d] = start_clusters([None])?;
    let rt = runtime()?;
    create_topics(&rt, &d, &[("t", 1), ("tb", 1)])?;
    let dir = tempfile::tempdir()?;
    let ca = support::certs::TestCa::new(dir.path())?;
    let server = ca.server("proxy")?;
    let replicator = ca.client("replicator", "replicator")?;
    let intruder = ca.client("intruder", "intruder")?;
    let path = |p: &PathBuf| p.display().to_string();
    let (cert, key, ca_path) = (
        path(&server.cert_path),
        path(&server.key_path),
        path(&ca.cert_path),
    );
    let proxy = start_proxy(
        &d,
        &[
            ("TLS_CERT", &cert),
            ("TLS_KEY", &key),
            ("TLS_CLIENT_CA", &ca_path),
            ("LINKS", "a,b"),
            ("LINK_A_SOURCE_CLUSTER_ID", ID_A),
            ("LINK_A_TOPICS", "t"),
            ("LINK_A_TLS_SUBJECT", "CN=replicator"),
            ("LINK_B_SOURCE_CLUSTER_ID", ID_B),
            ("LINK_B_TOPICS", "tb"),
            (
                "LINK_B_TLS_SUBJECT",
                "CN=replicator,O=acme,O=kafka-mirror-proxy tests",
            ),
        ],
    )?;
    let produce = |client: Option<(&str, &str)>, client_id: &str, pid: i64, value: &str| {
        let mut c = RawClient::connect_tls(&proxy.bootstrap, &ca.cert_pem, client)?;
        anyhow::Ok(partition_result(&c.produce(
            client_id,
            "t",
            0,
            record_batch(pid, &[value]),
        )?))
    };

    let (code, message) = produce(None, "mirror-a", 5, "no certificate")?;
    assert_eq!(
        code, TOPIC_AUTHORIZATION_FAILED,
        "link client id without a certificate ({message:?})"
    );
    let message = message.unwrap_or_default();
    assert!(
        message.contains("'a'") && message.contains("mirror-a"),
        "the refusal must name link a and its client id: {message:?}"
    );

    let (code, message) = produce(
        Some((&replicator.cert, &replicator.key)),
        "mirror-a",
        5,
        "replicator",
    )?;
    assert_eq!(code, NONE, "CN=replicator may act as link a ({message:?})");

    let (code, message) = produce(
        Some((&intruder.cert, &intruder.key)),
        "mirror-a",
        5,
        "intruder",
    )?;
    assert_eq!(
        code, TOPIC_AUTHORIZATION_FAILED,
        "CN=intruder may not act as link a ({message:?})"
    );
    assert!(
        message.unwrap_or_default().contains("'a'"),
        "the refusal names the link"
    );

    // A common name that reads like a subject's attributes is one
    // attribute: a CN of `replicator, O=acme` is not CN=replicator plus
    // O=acme, which link b requires.
    let lookalike = ca.client("lookalike", "replicator, O=acme")?;
    let mut c = RawClient::connect_tls(
        &proxy.bootstrap,
        &ca.cert_pem,
        Some((&lookalike.cert, &lookalike.key)),
    )?;
    let (code, message) =
        partition_result(&c.produce("mirror-b", "tb", 0, record_batch(5, &["lookalike"]))?);
    assert_eq!(
        code, TOPIC_AUTHORIZATION_FAILED,
        "CN='replicator, O=acme' may not act as link b ({message:?})"
    );

    // Other client ids are local traffic, certificate or not: not the
    // link's, so refused as local writes to a read-only mirrored topic
    // (issue 10), not as a spoofed link.
    let (code, message) = produce(None, "some-app", 3, "local")?;
    assert_eq!(
        code, POLICY_VIOLATION,
        "local client without a certificate ({message:?})"
    );
    assert!(
        message
            .unwrap_or_default()
            .contains("read-only mirror of link 'a'"),
        "the refusal names the link"
    );

    let [log] = <[Vec<DumpedBatch>; 1]>::try_from(dump(&[part(&d, "t", 0)])?)
        .map_err(|_| anyhow!("dump count"))?;
    let got: Vec<(i64, Option<String>)> = log
        .iter()
        .map(|b| {
            (
                b.producer_id,
                b.records.first().and_then(|r| r.payload.clone()),
            )
        })
        .collect();
    assert_eq!(
        got,
        [(MAPPED_A_5, Some("replicator".to_string())),],
        "t-0 on the destination: only the replicator's batch (mapped)"
    );
    assert!(log.iter().all(|b| b.is_valid), "{log:?}");
    Ok(())
}

/// Kafka's own Java producer acting as the link: it speaks the newest Produce
/// version (v13 names topics by id, which the proxy resolves from the
/// Metadata responses it forwards), and every batch it writes is remapped
/// into A's region with a valid CRC.
#[test]
fn a_java_producer_using_the_link_client_id_is_remapped() -> Result<()> {
    let [d] = start_clusters([None])?;
    let proxy = start_proxy(
        &d,
        &[
            ("LINKS", "a"),
            ("LINK_A_SOURCE_CLUSTER_ID", ID_A),
            ("LINK_A_TOPICS", "java"),
        ],
    )?;
    tools::create_topic(&proxy.bootstrap, "java", 1, &[], &[])?;
    let records: Vec<(String, String)> = (0..300)
        .map(|i| (format!("k{i}"), format!("v{i}")))
        .collect();
    tools::console_produce_kv(
        &proxy.bootstrap,
        "java",
        &records,
        &[
            ("client.id", "mirror-a"),
            ("enable.idempotence", "true"),
            ("acks", "all"),
            ("batch.size", "1024"),
        ],
    )?;
    let batches: Vec<DumpedBatch> = dump(&[part(&d, "java", 0)])?.concat();
    ensure!(
        batches.iter().map(|b| b.count).sum::<i64>() == 300,
        "records on disk: {batches:?}"
    );
    let hash_a = cluster_hash(ID_A);
    for b in &batches {
        let (region, _) = split(b.producer_id);
        ensure!(
            b.producer_id < -1 && region == hash_a,
            "batch at {} has producer id {}, not in A's region {hash_a:#x}",
            b.base_offset,
            b.producer_id
        );
        ensure!(b.is_valid, "batch at {} has an invalid CRC", b.base_offset);
    }
    let remapped = proxy.metric(&format!("{REMAPPED}{{link=\"a\"}}"))?;
    ensure!(
        remapped == batches.len() as i64,
        "remapped {remapped} batches, {} on disk",
        batches.len()
    );
    let versions = tools::broker_api_versions(&proxy.bootstrap)?;
    ensure!(
        versions.contains("Produce(0): 0 to 13 [usable: 13]"),
        "the Java client should use Produce v13:\n{versions}"
    );
    Ok(())
}
