//! Exactly once under chaos (issue 26, the acceptance test): real brokers,
//! the proxy binary and its `replicate` subcommand, with processes
//! killed at random points.
//!
//! - The destination: three KRaft nodes (combined broker and controller),
//!   topics `idem` (3 partitions) and `txn` (2 partitions) with three
//!   replicas and `min.insync.replicas=2`; two proxy instances on it,
//!   sharing the state topic, with link `a` mirroring both topics.
//! - The source: one broker, written continuously by two idempotent
//!   librdkafka producers (`idem`) and a transactional one (`txn`; about a
//!   third of the transactions aborted, and the producer re-created every
//!   so often, which bumps its epoch).
//! - The replicator copies through the proxies: its destination bootstrap
//!   lists both, in a random order per start. Its client keeps using the
//!   instance that answered (Metadata through a proxy names that proxy's
//!   ports) and moves on to the next bootstrap address when that instance
//!   cannot be reached, so killing the instance in use fails the
//!   replicator over to the other one.
//!
//! While it runs, at random points from a seeded RNG (`CHAOS_SEED`, printed;
//! random by default) for `CHAOS_SECS` seconds (90 by default: about 4
//! minutes in all on 2 cores): the
//! replicator is killed with SIGKILL and started again (it resumes from its
//! progress group on the source); a proxy instance (the one in use, two
//! times in three) is killed with SIGKILL and started again on the same
//! ports; the leader of a random mirrored partition is killed with SIGKILL
//! and started again a few seconds later (only once every replica of the
//! mirrored and state topics is back in sync, so a kill never takes a
//! partition's last in-sync replica). Every kind happens at least once.
//!
//! Then the writers stop, the replicator catches up (its committed source
//! offsets reach the source's end offsets), the writers start again, and
//! during that tail the link is failed over through the admin API of one
//! instance; the replicator, fenced, stops. A local producer then writes a
//! record to every partition through a proxy. Asserted:
//!
//! - per partition, the destination read `read_committed` (straight from
//!   the brokers) is the source read `read_committed`, record for record, up
//!   to where the failover cut the tail: every committed record written
//!   before the tail exactly once, in source order, none twice, nothing that
//!   is not in the source (so no aborted record either, checked separately);
//! - no link batch (mapped, negative producer id) lies at or past the
//!   barrier's log end offset in any partition, in the leader's log as
//!   DumpLogSegments reads it, while the local records do.
//!
//! It prints one summary line (`chaos summary: ...`): the seed, kills of each
//! kind, duplicates the proxies answered (their `/metrics`, scraped before
//! each proxy kill and at the end), link batches each instance forwarded,
//! and records compared. On a failure the working directory (replicator and
//! proxy logs) is kept and named. `scripts/chaos.sh SECONDS [SEED]` runs it
//! for longer.

mod support;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use serde_json::Value;

use kafka_mirror_proxy::client::protocol::OffsetSpec;
use kafka_mirror_proxy::client::Client;
use support::crate_client::{client, create_topic, runtime};
use support::kafka::{KafkaCluster, KafkaMultiCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::replicator::replicator_command;
use support::tools;

/// Mirrored topics and their partitions (the same on both sides).
const TOPICS: [(&str, i32); 2] = [("idem", 3), ("txn", 2)];
const STATE_TOPIC: &str = "__mirror_state";
const LINK: &str = "a";
const GROUP: &str = "chaos.mirror-a";
const DUPLICATES: &str = "kafka_mirror_proxy_mirror_duplicates_answered_total{link=\"a\"}";
const FORWARDED: &str = "kafka_mirror_proxy_mirror_batches_remapped_total{link=\"a\"}";
const NODES: [u32; 3] = [1, 2, 3];
/// Bound on every single wait (three brokers, a source broker, two
/// proxies, the replicator and the writers share 2 cores).
const WAIT: Duration = Duration::from_secs(180);
/// Bound on the replicator catching up after the chaos.
const CATCH_UP: Duration = Duration::from_secs(900);

/// SplitMix64: small, seedable, good enough to pick kill points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(low + self.below(high.saturating_sub(low) + 1))
    }
}

fn env_u64(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Ok(v) => {
            Ok(Some(v.trim().parse().with_context(|| {
                format!("{name}={v:?} is not a number")
            })?))
        }
        Err(_) => Ok(None),
    }
}

/// Every mirrored (topic, partition).
fn partitions() -> Vec<(String, i32)> {
    TOPICS
        .iter()
        .flat_map(|(t, n)| (0..*n).map(move |p| (t.to_string(), p)))
        .collect()
}

// ---------------------------------------------------------------------
// Source writers

/// What one run of the writers wrote (queued; the source is read back for
/// what it holds).
#[derive(Debug, Default, Clone, Copy)]
struct Written {
    idem: u64,
    committed_txns: u64,
    aborted_txns: u64,
    txn_producers: u64,
}

/// Writers running in a thread until stopped.
struct Writers {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<Result<Written>>,
}

impl Writers {
    /// Starts the writers of `phase` (its name prefixes every value).
    fn start(source: &str, phase: &'static str, seed: u64) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let source = source.to_string();
        let handle = thread::spawn(move || write_source(&source, phase, seed, &flag));
        Writers { stop, handle }
    }

    /// Fails if the writers ended (on an error) while they should run.
    fn check_running(&self) -> Result<()> {
        ensure!(
            !self.handle.is_finished(),
            "the source writers stopped by themselves"
        );
        Ok(())
    }

    fn stop(self) -> Result<Written> {
        self.stop.store(true, Ordering::SeqCst);
        match self.handle.join() {
            Ok(r) => r,
            Err(_) => bail!("the source writers panicked"),
        }
    }
}

fn idem_producer(source: &str) -> Result<BaseProducer> {
    Ok(RdConfig::new()
        .set("bootstrap.servers", source)
        .set("enable.idempotence", "true")
        .set("linger.ms", "100")
        .set("message.timeout.ms", "120000")
        .create()?)
}

fn txn_producer(source: &str) -> Result<BaseProducer> {
    let p: BaseProducer = RdConfig::new()
        .set("bootstrap.servers", source)
        .set("transactional.id", "chaos-source-txn")
        .set("linger.ms", "20")
        .set("message.timeout.ms", "60000")
        .create()?;
    p.init_transactions(WAIT)?;
    Ok(p)
}

/// Two idempotent producers write a record to every `idem` partition each
/// round (about 150 records a second in all); every fourth round one
/// transaction writes 3 records to each `txn` partition and is committed,
/// or aborted (one in three, by the RNG). Every 40 transactions the
/// transactional producer is created again: a new epoch.
fn write_source(source: &str, phase: &str, seed: u64, stop: &AtomicBool) -> Result<Written> {
    let mut rng = Rng(seed);
    let idem = [idem_producer(source)?, idem_producer(source)?];
    let mut txn = txn_producer(source)?;
    let mut w = Written {
        txn_producers: 1,
        ..Written::default()
    };
    let (idem_topic, idem_parts) = TOPICS[0];
    let (txn_topic, txn_parts) = TOPICS[1];
    let mut round = 0u64;
    let mut t = 0u64;
    while !stop.load(Ordering::SeqCst) {
        for (k, producer) in idem.iter().enumerate() {
            for p in 0..idem_parts {
                let v = format!("{phase}-i{k}-p{p}-{round}");
                send(producer, idem_topic, p, &v)?;
                w.idem += 1;
            }
            producer.poll(Duration::ZERO);
        }
        if round % 4 == 3 {
            if t > 0 && t.is_multiple_of(40) {
                txn = txn_producer(source)?;
                w.txn_producers += 1;
            }
            let commit = rng.below(3) != 0;
            let kind = if commit { "committed" } else { "aborted" };
            txn.begin_transaction()?;
            for p in 0..txn_parts {
                for i in 0..3 {
                    send(&txn, txn_topic, p, &format!("{phase}-t{t}-{kind}-p{p}-{i}"))?;
                }
            }
            // Delivered before the outcome (librdkafka's abort wants its
            // delivery reports polled first).
            txn.flush(WAIT)?;
            if commit {
                txn.commit_transaction(WAIT)?;
                w.committed_txns += 1;
            } else {
                txn.abort_transaction(WAIT)?;
                w.aborted_txns += 1;
            }
            t += 1;
        }
        round += 1;
        thread::sleep(Duration::from_millis(40));
    }
    for producer in &idem {
        producer.flush(WAIT)?;
    }
    Ok(w)
}

/// Queues one record, waiting (bounded) while librdkafka's queue is full.
fn send(producer: &BaseProducer, topic: &str, partition: i32, value: &str) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        match producer.send(
            BaseRecord::<(), _>::to(topic)
                .partition(partition)
                .payload(value),
        ) {
            Ok(()) => return Ok(()),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                if Instant::now() < deadline =>
            {
                producer.poll(Duration::from_millis(100));
            }
            Err((e, _)) => bail!("queueing {value}: {e}"),
        }
    }
}

// ---------------------------------------------------------------------
// Reading both sides

/// (offset, value) of every record per (topic, partition), in log order.
type Records = BTreeMap<(String, i32), Vec<(i64, String)>>;

/// Every record of every mirrored partition, `read_committed`, as
/// (offset, value) in log order, up to the end (every partition reported
/// EOF; nothing writes meanwhile). One consumer per topic: librdkafka's
/// EOF names the partition only.
fn read_all(bootstrap: &str, group: &str) -> Result<Records> {
    let mut out = BTreeMap::new();
    for (topic, n) in TOPICS {
        let consumer: BaseConsumer = RdConfig::new()
            .set("bootstrap.servers", bootstrap)
            .set("group.id", group)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .create()?;
        let mut tpl = TopicPartitionList::new();
        for p in 0..n {
            tpl.add_partition_offset(topic, p, Offset::Beginning)?;
            out.insert((topic.to_string(), p), Vec::new());
        }
        consumer.assign(&tpl)?;
        let mut at_end = vec![false; n as usize];
        let deadline = Instant::now() + WAIT;
        while at_end.iter().any(|e| !e) {
            ensure!(
                Instant::now() < deadline,
                "reading {topic} from {bootstrap}: partitions at their end {at_end:?} after {WAIT:?}"
            );
            match consumer.poll(Duration::from_millis(200)) {
                None => {}
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    if let Some(e) = usize::try_from(p).ok().and_then(|p| at_end.get_mut(p)) {
                        *e = true;
                    }
                }
                Some(Err(e)) => bail!("reading {topic} from {bootstrap}: {e}"),
                Some(Ok(m)) => {
                    let value =
                        String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
                    out.entry((topic.to_string(), m.partition()))
                        .or_default()
                        .push((m.offset(), value));
                }
            }
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------
// Processes

/// One replicator process, its log in the work directory.
struct Replicator {
    child: Child,
    log: PathBuf,
}

impl Replicator {
    fn start(source: &str, destinations: &str, dir: &Path, run: usize) -> Result<Replicator> {
        let log = dir.join(format!("replicator-{run}.log"));
        let child = replicator_command()
            .args(["--source-bootstrap-servers", source])
            .args(["--destination-bootstrap-servers", destinations])
            .args(["--topics", "idem,txn"])
            .args(["--link", "a"])
            .args(["--group-id", GROUP])
            .args(["--commit-interval-ms", "1000"])
            .args(["--retry-backoff-ms", "100"])
            .args(["--admin-listen", "127.0.0.1:0"])
            .stdout(File::create(dir.join(format!("replicator-{run}.out")))?)
            .stderr(File::create(&log)?)
            .spawn()
            .context("starting the replicator")?;
        Ok(Replicator { child, log })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        tools::tail_str(&text, 40)
    }

    /// Fails when the process is gone (it runs until killed).
    fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "the replicator exited ({status}); its log ({}):\n{}",
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Replicator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One proxy instance and its counters summed over its lifetimes.
struct Instance {
    name: &'static str,
    proxy: ProxyProcess,
    lifetimes: usize,
    /// Counters of the lifetimes that ended (scraped before each kill).
    duplicates_before: i64,
    forwarded_before: i64,
    /// The current lifetime's counters as last scraped.
    duplicates: i64,
    forwarded: i64,
}

impl Instance {
    /// Scrapes the counters; returns how many batches it forwarded since
    /// the last scrape. A proxy that does not answer keeps its last values.
    fn scrape(&mut self) -> i64 {
        let before = self.forwarded;
        if let (Ok(d), Ok(f)) = (self.proxy.metric(DUPLICATES), self.proxy.metric(FORWARDED)) {
            self.duplicates = d;
            self.forwarded = f;
        }
        self.forwarded - before
    }

    fn duplicates_total(&self) -> i64 {
        self.duplicates_before + self.duplicates
    }

    fn forwarded_total(&self) -> i64 {
        self.forwarded_before + self.forwarded
    }

    /// Saves this lifetime's log to the work directory.
    fn save_log(&self, dir: &Path) {
        let path = dir.join(format!("proxy-{}-{}.log", self.name, self.lifetimes));
        let _ = std::fs::write(path, self.proxy.logs());
    }

    fn kill_and_restart(&mut self, dir: &Path, pause: Duration) -> Result<()> {
        self.scrape();
        self.proxy.kill()?;
        self.save_log(dir);
        self.duplicates_before += self.duplicates;
        self.forwarded_before += self.forwarded;
        self.duplicates = 0;
        self.forwarded = 0;
        thread::sleep(pause);
        self.lifetimes += 1;
        self.proxy
            .restart(WAIT)
            .with_context(|| format!("restarting proxy {}", self.name))
    }
}

// ---------------------------------------------------------------------
// The destination cluster

/// Waits until every replica of the mirrored topics and the state topic
/// is in sync (bounded).
fn wait_in_sync(rt: &tokio::runtime::Runtime, dest: &Client) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let mut lagging = Vec::new();
        for topic in TOPICS.iter().map(|(t, _)| *t).chain([STATE_TOPIC]) {
            match rt.block_on(dest.topic(topic)) {
                Ok(info) => {
                    for p in &info.partitions {
                        if p.isr.len() < p.replicas.len() || p.leader < 0 {
                            lagging.push(format!("{topic}-{} isr {:?}", p.partition, p.isr));
                        }
                    }
                }
                Err(e) => lagging.push(format!("{topic}: {e}")),
            }
        }
        if lagging.is_empty() {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "replicas not in sync within {WAIT:?}: {lagging:?}"
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// The leader of one partition of the destination.
fn leader(rt: &tokio::runtime::Runtime, dest: &Client, topic: &str, partition: i32) -> Result<u32> {
    let info = rt.block_on(dest.topic(topic))?;
    let p = info
        .partitions
        .iter()
        .find(|p| p.partition == partition)
        .with_context(|| format!("no partition {partition} of {topic}"))?;
    u32::try_from(p.leader).with_context(|| format!("{topic}-{partition} has no leader"))
}

/// The source's end offsets of every mirrored partition.
fn source_ends(rt: &tokio::runtime::Runtime, src: &Client) -> Result<BTreeMap<(String, i32), i64>> {
    partitions()
        .into_iter()
        .map(|(t, p)| {
            let end = rt
                .block_on(src.list_offset(&t, p, OffsetSpec::Latest))?
                .offset;
            Ok(((t, p), end))
        })
        .collect()
}

/// Waits until the replicator's progress group (on the destination)
/// committed the source's end offsets in every partition (so the
/// destination acknowledged everything).
fn wait_caught_up(
    rt: &tokio::runtime::Runtime,
    (src, dest): (&Client, &Client),
    replicator: &mut Replicator,
) -> Result<BTreeMap<(String, i32), i64>> {
    let ends = source_ends(rt, src)?;
    let parts = partitions();
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let committed = rt.block_on(dest.committed_offsets(GROUP, &parts))?;
        let behind: Vec<String> = ends
            .iter()
            .filter(|(k, e)| committed.get(*k).copied().unwrap_or(-1) < **e)
            .map(|((t, p), e)| {
                format!(
                    "{t}-{p} {} of {e}",
                    committed.get(&(t.clone(), *p)).copied().unwrap_or(-1)
                )
            })
            .collect();
        if behind.is_empty() {
            return Ok(ends);
        }
        replicator.check_running()?;
        ensure!(
            Instant::now() < deadline,
            "the replicator did not catch up within {CATCH_UP:?}: {behind:?}; its log:\n{}",
            replicator.log_tail()
        );
        thread::sleep(Duration::from_millis(500));
    }
}

/// `POST /links/a/failover?wait=...` on `proxy`; returns the JSON answer.
fn failover(proxy: &ProxyProcess) -> Result<Value> {
    let (status, body) = proxy.admin_post(&format!("/links/{LINK}/failover?wait=150"), "")?;
    let json: Value =
        serde_json::from_str(&body).with_context(|| format!("{status}: not JSON: {body}"))?;
    ensure!(
        status.contains(" 200"),
        "failover answered {status}: {json:#}"
    );
    ensure!(json["state"] == "STOPPED", "after the failover: {json:#}");
    ensure!(
        json["failover"]["complete"] == true,
        "failover not complete: {json:#}"
    );
    Ok(json)
}

/// The barrier's log end offset of every partition from a failover answer.
fn barrier_offsets(failover: &Value) -> Result<BTreeMap<(String, i32), i64>> {
    let mut out = BTreeMap::new();
    for part in failover["failover"]["partitions"]
        .as_array()
        .context("no partitions in the failover answer")?
    {
        let topic = part["topic"].as_str().context("topic")?.to_string();
        let partition = i32::try_from(part["partition"].as_i64().context("partition")?)?;
        ensure!(
            part["result"] == "refused" || part["result"] == "accepted",
            "barrier of {topic}-{partition}: {part}"
        );
        let leo = part["log_end_offset"]
            .as_i64()
            .with_context(|| format!("no log end offset: {part}"))?;
        out.insert((topic, partition), leo);
    }
    ensure!(
        out.len() == partitions().len(),
        "barriers for {out:?}, partitions {:?}",
        partitions()
    );
    Ok(out)
}

/// One record to every mirrored partition through `proxy`, by a local
/// (non-link) producer: allowed once the link is STOPPED.
fn write_locally(proxy: &ProxyProcess) -> Result<()> {
    let producer: BaseProducer = RdConfig::new()
        .set("bootstrap.servers", &proxy.bootstrap)
        .set("client.id", "local-app")
        .set("message.timeout.ms", "60000")
        .create()?;
    for (t, p) in partitions() {
        send(&producer, &t, p, &format!("local-{t}-{p}"))?;
    }
    producer.flush(WAIT)?;
    ensure!(
        producer.in_flight_count() == 0,
        "local records not delivered"
    );
    Ok(())
}

// ---------------------------------------------------------------------
// The checks

/// Where `value` occurs in `records` (offsets).
fn offsets_of(records: &[(i64, String)], value: &str) -> Vec<i64> {
    records
        .iter()
        .filter(|(_, v)| v == value)
        .map(|(o, _)| *o)
        .collect()
}

/// The destination partition is a prefix of the source partition that
/// holds at least every record below `pre_end`: every difference named
/// with offsets on both sides.
fn check_partition(
    key: &(String, i32),
    source: &[(i64, String)],
    dest: &[(i64, String)],
    pre_end: i64,
) -> Result<()> {
    let (t, p) = key;
    let pre = source.iter().filter(|(o, _)| *o < pre_end).count();
    if let Some(i) = (0..dest.len().min(source.len())).find(|&i| dest[i].1 != source[i].1) {
        let (d_off, d_val) = &dest[i];
        let (s_off, s_val) = &source[i];
        bail!(
            "{t}-{p}: destination record {i} (offset {d_off}) is {d_val:?} (source offset(s) \
             {:?}, destination offset(s) {:?}); the source's record {i} (offset {s_off}) is \
             {s_val:?} (destination offset(s) {:?}); {} destination records, {} source records",
            offsets_of(source, d_val),
            offsets_of(dest, d_val),
            offsets_of(dest, s_val),
            dest.len(),
            source.len()
        );
    }
    ensure!(
        dest.len() <= source.len(),
        "{t}-{p}: {} destination records, the source has {}; the first extra one: {:?}",
        dest.len(),
        source.len(),
        dest.get(source.len())
    );
    ensure!(
        dest.len() >= pre,
        "{t}-{p}: {} destination records, but the source had {pre} before the tail; the \
         first missing one: {:?}",
        dest.len(),
        source.get(dest.len())
    );
    Ok(())
}

/// No link batch (negative mapped producer id) at or past the barrier's
/// log end offset in the leader's log, and the local records past it.
fn check_barrier(
    kafka: &KafkaMultiCluster,
    node: u32,
    (t, p): &(String, i32),
    barrier: i64,
) -> Result<usize> {
    let mut batches = Vec::new();
    for file in kafka.node(node)?.segment_files(t, *p)? {
        batches.extend(tools::dump_log_segments(&file, false)?);
    }
    let after: Vec<_> = batches
        .iter()
        .filter(|b| b.last_offset >= barrier)
        .collect();
    let link: Vec<_> = after.iter().filter(|b| b.producer_id < -1).collect();
    ensure!(
        link.is_empty(),
        "{t}-{p}: link batches at or past the barrier's log end offset {barrier}: {link:?}"
    );
    ensure!(
        !after.is_empty(),
        "{t}-{p}: the local record is not past the barrier at {barrier} (the check would see \
         nothing there); last batches: {:?}",
        &batches[batches.len().saturating_sub(2)..]
    );
    Ok(batches.len())
}

#[derive(Debug, Default)]
struct Kills {
    replicator: u32,
    proxy: u32,
    broker: u32,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Event {
    Replicator,
    Proxy,
    Broker,
}

#[test]
fn every_committed_record_lands_once_in_order_through_kills_and_a_failover() -> Result<()> {
    let seed = match env_u64("CHAOS_SEED")? {
        Some(s) => s,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)?
            .as_nanos()
            .try_into()
            .unwrap_or(1),
    };
    let secs = env_u64("CHAOS_SECS")?.unwrap_or(90);
    eprintln!("chaos: seed {seed} (CHAOS_SEED={seed} repeats the kill points), {secs} s of chaos");
    let mut rng = Rng(seed);
    let work = tempfile::Builder::new().prefix("chaos-").tempdir()?;
    let dir = work.path().to_path_buf();
    // Kept on failure (the logs are the evidence) or with CHAOS_KEEP_DIR,
    // deleted otherwise.
    let result = run(&mut rng, seed, secs, &dir);
    match &result {
        Ok(()) if std::env::var_os("CHAOS_KEEP_DIR").is_none() => drop(work),
        _ => {
            let kept = work.keep();
            eprintln!("chaos: seed {seed}: logs kept in {}", kept.display());
        }
    }
    result
}

fn run(rng: &mut Rng, seed: u64, secs: u64, dir: &Path) -> Result<()> {
    let rt = runtime()?;
    let source = KafkaCluster::start(KafkaOptions::default())?;
    let mut kafka = KafkaMultiCluster::start(KafkaOptions::default(), &NODES)?;
    let src = client(&source.bootstrap());
    let dest = Client::new({
        let mut c = kafka_mirror_proxy::client::ClientConfig::new(
            kafka.nodes().iter().map(|n| n.bootstrap()).collect(),
            kafka_mirror_proxy::net::upstream::Upstream {
                tls: None,
                server_name: None,
                timeout: Duration::from_secs(10),
            },
        );
        c.operation_timeout = Duration::from_secs(60);
        c
    });
    for (topic, n) in TOPICS {
        create_topic(&rt, &src, topic, n, &[])?;
        tools::create_topic_replicated(
            &kafka.bootstrap(),
            topic,
            n as u32,
            3,
            &[("min.insync.replicas", "2")],
            &[],
        )?;
    }
    let link = [
        ("LINKS", LINK),
        ("LINK_A_SOURCE_CLUSTER_ID", source.cluster_id()),
        ("LINK_A_TOPICS", "idem,txn"),
    ];
    let node_ids: Vec<i32> = NODES.iter().map(|&n| n as i32).collect();
    let mut instances = Vec::new();
    for name in ["A", "B"] {
        instances.push(Instance {
            name,
            proxy: ProxyProcess::start_for_nodes(&kafka.bootstrap(), &node_ids, &link)?,
            lifetimes: 0,
            duplicates_before: 0,
            forwarded_before: 0,
            duplicates: 0,
            forwarded: 0,
        });
    }
    wait_in_sync(&rt, &dest)?;
    let destinations = |rng: &mut Rng, instances: &[Instance]| {
        let mut list: Vec<&str> = instances
            .iter()
            .map(|i| i.proxy.bootstrap.as_str())
            .collect();
        if rng.below(2) == 1 {
            list.reverse();
        }
        list.join(",")
    };

    let writers = Writers::start(&source.bootstrap(), "w", seed ^ 0x5752_4954);
    let mut runs = 0;
    let mut replicator = Replicator::start(
        &source.bootstrap(),
        &destinations(rng, &instances),
        dir,
        runs,
    )?;

    // The chaos: every kind once first (in a random order), then at random.
    let mut kills = Kills::default();
    let mut first = vec![Event::Replicator, Event::Proxy, Event::Broker];
    for i in (1..first.len()).rev() {
        first.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let mut down: Option<(u32, Instant)> = None;
    let mut in_use = 0usize;
    let chaos_start = Instant::now();
    let chaos_end = chaos_start + Duration::from_secs(secs);
    let log = |what: String| {
        eprintln!(
            "chaos: {:>6.1} s: {what}",
            chaos_start.elapsed().as_secs_f64()
        );
    };
    while Instant::now() < chaos_end {
        // Quiet time: the replicator copies; the instance in use is the one
        // whose forwarded count grows; a broker down comes back when due.
        let quiet_until = Instant::now() + rng.millis(2_000, 9_000);
        while Instant::now() < quiet_until.min(chaos_end) {
            thread::sleep(Duration::from_millis(500));
            replicator.check_running()?;
            if writers.check_running().is_err() {
                writers.stop()?;
                bail!("the source writers stopped without an error");
            }
            let grew: Vec<i64> = instances.iter_mut().map(Instance::scrape).collect();
            if let Some(i) = (0..grew.len()).max_by_key(|&i| grew[i]) {
                if grew[i] > 0 {
                    in_use = i;
                }
            }
            if let Some((node, at)) = down {
                if Instant::now() >= at {
                    kafka.node_mut(node)?.restart()?;
                    log(format!("broker {node} restarted"));
                    down = None;
                }
            }
        }
        if Instant::now() >= chaos_end {
            break;
        }
        let mut event = first.pop().unwrap_or(match rng.below(3) {
            0 => Event::Replicator,
            1 => Event::Proxy,
            _ => Event::Broker,
        });
        if event == Event::Broker && down.is_some() {
            event = if rng.below(2) == 0 {
                Event::Replicator
            } else {
                Event::Proxy
            };
        }
        match event {
            Event::Replicator => {
                replicator.check_running()?;
                replicator.kill()?;
                kills.replicator += 1;
                thread::sleep(rng.millis(0, 2_000));
                runs += 1;
                let to = destinations(rng, &instances);
                replicator = Replicator::start(&source.bootstrap(), &to, dir, runs)?;
                log(format!(
                    "replicator killed and started again (run {runs}, through {to})"
                ));
            }
            Event::Proxy => {
                let i = if rng.below(3) < 2 {
                    in_use
                } else {
                    rng.below(2) as usize
                };
                let pause = rng.millis(0, 3_000);
                let instance = &mut instances[i];
                instance.kill_and_restart(dir, pause)?;
                kills.proxy += 1;
                log(format!(
                    "proxy {} killed{} and started again after {pause:?}",
                    instance.name,
                    if i == in_use { " (in use)" } else { "" }
                ));
            }
            Event::Broker => {
                wait_in_sync(&rt, &dest)?;
                let (t, p) = {
                    let all = partitions();
                    all[rng.below(all.len() as u64) as usize].clone()
                };
                let node = leader(&rt, &dest, &t, p)?;
                kafka.node_mut(node)?.kill();
                kills.broker += 1;
                let back = rng.millis(1_000, 12_000);
                down = Some((node, Instant::now() + back));
                log(format!(
                    "broker {node} (leader of {t}-{p}) killed, back in {back:?}"
                ));
            }
        }
    }
    if let Some((node, _)) = down.take() {
        kafka.node_mut(node)?.restart()?;
        log(format!("broker {node} restarted"));
    }
    ensure!(
        kills.replicator > 0 && kills.proxy > 0 && kills.broker > 0,
        "CHAOS_SECS={secs} too short for a kill of each kind: {kills:?}"
    );

    // Catch up, then the tail with the failover in it.
    replicator.check_running()?;
    let written = writers.stop()?;
    log(format!("writers stopped: {written:?}"));
    wait_in_sync(&rt, &dest)?;
    let pre_ends = wait_caught_up(&rt, (&src, &dest), &mut replicator)?;
    log(format!("the replicator caught up with {pre_ends:?}"));
    let tail = Writers::start(&source.bootstrap(), "tail", seed ^ 0x5441_494c);
    thread::sleep(rng.millis(1_000, 4_000));
    replicator.check_running()?;
    let via = rng.below(2) as usize;
    let answer = failover(&instances[via].proxy).with_context(|| {
        format!(
            "failover through proxy {}; its log:\n{}",
            instances[via].name,
            tools::tail_str(&instances[via].proxy.logs(), 40)
        )
    })?;
    let tail_written = tail.stop()?;
    log(format!(
        "failed over through proxy {} (unconfirmed instances: {}); tail {tail_written:?}",
        instances[via].name, answer["failover"]["unconfirmed_instances"]
    ));
    let barriers = barrier_offsets(&answer)?;
    // More source records: the replicator tries them and is fenced.
    let post = Writers::start(&source.bootstrap(), "post", seed ^ 0x504f_5354);
    thread::sleep(Duration::from_secs(2));
    post.stop()?;
    // Not asserted (the checks below are what matters): the replicator
    // normally gives up on the refusal; if it still retries, it is killed.
    let deadline = Instant::now() + Duration::from_secs(30);
    let fenced = loop {
        if let Some(status) = replicator.child.try_wait()? {
            break format!("the replicator stopped ({status})");
        }
        if Instant::now() > deadline {
            replicator.kill()?;
            break "the replicator was still running after 30 s (killed)".to_string();
        }
        thread::sleep(Duration::from_millis(200));
    };
    log(format!(
        "{fenced}; its last lines:\n{}",
        tools::tail_str(&replicator.log_tail(), 3)
    ));
    write_locally(&instances[rng.below(2) as usize].proxy)?;
    for instance in instances.iter_mut() {
        instance.scrape();
        instance.save_log(dir);
    }

    // The checks: every partition checked (each failure kept), the summary
    // printed, then the failures, if any.
    let source_records = read_all(&source.bootstrap(), "chaos-verify-source")?;
    let dest_records = read_all(&kafka.bootstrap(), "chaos-verify-destination")?;
    let mut failures: Vec<String> = Vec::new();
    let mut compared = 0usize;
    let mut aborted_seen = 0usize;
    for key in partitions() {
        let s = source_records
            .get(&key)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let d: Vec<(i64, String)> = dest_records
            .get(&key)
            .into_iter()
            .flatten()
            .filter(|(_, v)| !v.starts_with("local-"))
            .cloned()
            .collect();
        aborted_seen += d.iter().filter(|(_, v)| v.contains("-aborted-")).count();
        if s.iter().any(|(_, v)| v.contains("-aborted-")) {
            failures.push(format!(
                "{key:?}: the source read read_committed shows aborted records"
            ));
        }
        let pre_end = pre_ends.get(&key).copied().unwrap_or(0);
        if let Err(e) = check_partition(&key, s, &d, pre_end) {
            failures.push(format!("{e:#}"));
        }
        compared += d.len();
    }
    if aborted_seen > 0 {
        failures.push(format!(
            "{aborted_seen} aborted records visible read_committed on the destination"
        ));
    }
    let mut dumped = 0;
    for (key, leo) in &barriers {
        let checked = leader(&rt, &dest, &key.0, key.1)
            .and_then(|node| check_barrier(&kafka, node, key, *leo));
        match checked {
            Ok(n) => dumped += n,
            Err(e) => failures.push(format!("{e:#}")),
        }
    }

    let source_total: usize = source_records.values().map(Vec::len).sum();
    let aborted_txns = written.aborted_txns + tail_written.aborted_txns;
    if aborted_txns == 0 {
        failures.push(format!("no transaction was aborted: {written:?}"));
    }
    let duplicates: i64 = instances.iter().map(Instance::duplicates_total).sum();
    let per_instance: Vec<String> = instances
        .iter()
        .map(|i| {
            format!(
                "{}: {} forwarded, {} duplicates, {} restarts",
                i.name,
                i.forwarded_total(),
                i.duplicates_total(),
                i.lifetimes
            )
        })
        .collect();
    eprintln!(
        "chaos summary: seed {seed}, {secs} s of chaos, kills: replicator {}, proxy {}, \
         broker {}, failover 1; duplicates answered {duplicates} ({}); records compared \
         {compared} of {source_total} committed in the source ({} written before the tail); \
         transactions committed {} aborted {} by {} producers; batches dumped {dumped}",
        kills.replicator,
        kills.proxy,
        kills.broker,
        per_instance.join("; "),
        pre_ends_count(&source_records, &pre_ends),
        written.committed_txns + tail_written.committed_txns,
        aborted_txns,
        written.txn_producers + tail_written.txn_producers,
    );
    ensure!(
        failures.is_empty(),
        "seed {seed}: {} check(s) failed:\n{}",
        failures.len(),
        failures.join("\n")
    );
    Ok(())
}

/// Committed source records below the ends seen when the replicator had
/// caught up.
fn pre_ends_count(records: &Records, pre_ends: &BTreeMap<(String, i32), i64>) -> usize {
    records
        .iter()
        .map(|(k, r)| {
            let end = pre_ends.get(k).copied().unwrap_or(0);
            r.iter().filter(|(o, _)| *o < end).count()
        })
        .sum()
}
