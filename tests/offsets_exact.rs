//! The offset translation stays exact through failures (issue 43: "The
//! translation stays exact across a replicator kill -9, a proxy restart and
//! a destination leader move"). Real brokers, the proxy binary and the
//! replicator binary throughout.
//!
//! Source A: one broker, topic `exact` (2 partitions). Destination B: three
//! brokers; the replicator creates `exact` there with replication factor 3,
//! through a proxy in front of B. A transactional producer writes A
//! continuously (every third transaction aborted, a few plain idempotent
//! records in between), so the destination's offsets drift from the
//! source's (no markers, no aborted batches there). While it writes:
//!
//! 1. the replicator is killed with SIGKILL mid-copy and started again
//!    (it resumes from its last commit: what it had acknowledged since is
//!    sent again and answered by the proxy as duplicates, and its history
//!    before that comes back from the offsets topic);
//! 2. the proxy is killed and started again on the same ports;
//! 3. the leader of every destination partition moves (Kafka's
//!    ReassignPartitionsCommand reorders the replicas, its
//!    LeaderElectionCommand elects the new preferred leader);
//! 4. the replicator is killed again and a third run takes over.
//!
//! Then the producer stops and the replicator catches up. Checked, per
//! partition, against the records read from both sides (key and value):
//!
//! - the destination holds every committed source record exactly once, in
//!   the source's order, and nothing else;
//! - every source offset from 0 to the log end translates (from the offsets
//!   topic, as `kafka-mirror-proxy offsets` reads it) to the destination
//!   offset of the same next record: a record's own offset o to that
//!   record, o + 1 (a committed consumer offset) to the next committed
//!   record, a marker or an aborted batch to the next committed record, the
//!   log end to the destination's log end. An off-by-one or a lost segment
//!   names another record;
//! - the command itself prints the same for the resume points at each kill;
//! - a source consumer group's commits at those points (and at the end)
//!   are translated by the running replicator (its in-memory history, most
//!   of it read back from the offsets topic) to the same destination
//!   offsets, and committed there.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use tokio::runtime::Runtime;

use kafka_mirror_proxy::client::offsets::Offsets;
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::mirror::translation::Translation;
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_mirror_proxy::replicate::translation;
use support::crate_client::{create_topic, end_offsets, runtime};
use support::kafka::{KafkaCluster, KafkaMultiCluster, KafkaOptions};
use support::proxy::{cli_output, ProxyProcess};
use support::records::Topic;
use support::replicator::{replicator_command, Replicator};
use support::tools;

const TOPIC: &str = "exact";
const PARTITIONS: i32 = 2;
const LINK: &str = "a";
const PROGRESS_GROUP: &str = "replicator.mirror-a";
const OFFSETS_TOPIC: &str = "__mirror_offsets";
/// The source group whose offsets follow.
const APP: &str = "app";
/// Bound on every wait: four brokers, the tools, the proxy and the
/// replicator share 2 cores.
const WAIT: Duration = Duration::from_secs(120);
/// Transactions started per second (each one a segment per partition:
/// the whole run stays well within the replicator's 1,024 in memory).
const TRANSACTIONS_PER_SECOND: u64 = 10;
/// The proxy's and the replicator's UNKNOWN_OUTCOME_WAIT_MS: short, so
/// that the restarts cost little time (one proxy instance: nothing can
/// land through another one meanwhile).
const OUTCOME_WAIT_MS: &str = "2000";
/// Records each destination partition gets between two failures.
const PER_PHASE: i64 = 50;
/// The proxy's count of the link's batches answered as duplicates.
const DUPLICATES: &str = "kafka_mirror_proxy_mirror_duplicates_answered_total{link=\"a\"}";
const LEADER_ELECTION: &str = "org.apache.kafka.tools.LeaderElectionCommand";
const REASSIGN: &str = "org.apache.kafka.tools.reassign.ReassignPartitionsCommand";

/// A plaintext client of every broker in `bootstrap` (host:port,...).
fn client(bootstrap: &str) -> Client {
    Client::new(ClientConfig::new(
        bootstrap.split(',').map(str::to_string).collect(),
        Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(10),
        },
    ))
}

/// One source record: offset, key, value.
type Rec = (i64, String, String);

/// Writes transactions (every third aborted) to every partition, with
/// plain idempotent records between some of them, until told to stop.
/// Returns (committed, aborted) transactions.
fn keep_writing(bootstrap: String, stop: Arc<AtomicBool>) -> Result<(u64, u64)> {
    let base = |extra: &[(&str, &str)]| -> Result<BaseProducer> {
        let mut c = RdConfig::new();
        c.set("bootstrap.servers", &bootstrap)
            .set("enable.idempotence", "true")
            .set("linger.ms", "2");
        for (k, v) in extra {
            c.set(*k, *v);
        }
        Ok(c.create()?)
    };
    let txn = base(&[("transactional.id", "exact-writer")])?;
    let plain = base(&[])?;
    txn.init_transactions(WAIT)?;
    let send = |p: &BaseProducer, key: &str, value: &str, partition: i32| -> Result<()> {
        p.send(
            BaseRecord::to(TOPIC)
                .partition(partition)
                .key(key)
                .payload(value),
        )
        .map_err(|(e, _)| anyhow!("queueing {value}: {e}"))
    };
    let (mut committed, mut aborted) = (0u64, 0u64);
    let every = Duration::from_millis(1000 / TRANSACTIONS_PER_SECOND);
    let mut t = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let started = Instant::now();
        let abort = t % 3 == 1;
        txn.begin_transaction()?;
        for partition in 0..PARTITIONS {
            for i in 0..=(t + partition as u64) % 4 {
                let what = if abort { "aborted" } else { "committed" };
                send(
                    &txn,
                    &format!("k-{t}-{partition}-{i}"),
                    &format!("txn {t} {what} p{partition} #{i}"),
                    partition,
                )?;
            }
        }
        if t.is_multiple_of(2) {
            // Inside the transaction's range: they land between its
            // batches and its marker.
            for partition in 0..PARTITIONS {
                send(
                    &plain,
                    &format!("plain-{t}-{partition}"),
                    &format!("plain {t} p{partition}"),
                    partition,
                )?;
            }
            plain.flush(WAIT)?;
        }
        // Every record delivered first (a BaseProducer serves its delivery
        // reports only when polled, and an abort waits for them).
        txn.flush(WAIT)?;
        if abort {
            txn.abort_transaction(WAIT)?;
            aborted += 1;
        } else {
            txn.commit_transaction(WAIT)?;
            committed += 1;
        }
        t += 1;
        if let Some(rest) = every.checked_sub(started.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    plain.flush(WAIT)?;
    Ok((committed, aborted))
}

/// Every partition's end offset of the test topic through `c`.
fn ends(rt: &Runtime, c: &Client) -> Result<Vec<i64>> {
    end_offsets(rt, c, TOPIC, PARTITIONS)
}

/// Every record of every partition up to `ends`, read with `isolation`;
/// one list a partition, each partition present.
fn read(bootstrap: &str, isolation: &str, ends: &[i64]) -> Result<Vec<Vec<Rec>>> {
    let topic = Topic {
        name: TOPIC,
        partitions: PARTITIONS,
    };
    let mut log = topic.read_keyed(bootstrap, isolation, ends)?;
    Ok((0..PARTITIONS)
        .map(|p| log.remove(&p).unwrap_or_default())
        .collect())
}

/// The replicator's committed resume points (-1: none).
fn progress(rt: &Runtime, b: &Client) -> Result<Vec<i64>> {
    let keys: Vec<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    let committed = rt.block_on(b.committed_offsets(PROGRESS_GROUP, &keys))?;
    Ok(keys
        .iter()
        .map(|k| committed.get(k).copied().unwrap_or(-1))
        .collect())
}

impl Replicator {
    fn start(source: &str, proxy: &str, dir: &Path, run: usize) -> Result<Replicator> {
        let mut command = replicator_command();
        command
            .env("RUST_LOG", "kafka_mirror_proxy=info")
            .args(["--source-bootstrap-servers", source])
            .args(["--destination-bootstrap-servers", proxy])
            .args(["--link", LINK])
            .args(["--topics", TOPIC])
            // One instance: a run started after a kill takes every
            // partition at once, without waiting out the killed member.
            .args(["--membership", "false"])
            .args(["--replication-factor", "3"])
            // Commits come every 4 acknowledged batches of a partition
            // (the proxy's duplicate window), rarely by the clock: a kill
            // finds batches acknowledged and not committed.
            .args(["--commit-interval-ms", "5000"])
            .args(["--unknown-outcome-wait-ms", OUTCOME_WAIT_MS])
            .args(["--groups", APP])
            .args(["--group-sync-interval-ms", "300"])
            .args(["--retry-backoff-max-ms", "1000"]);
        Replicator::spawn(command, dir, run)
    }

    /// SIGKILL mid-copy: right after a batch was acknowledged that no
    /// progress commit covers yet (the commit counter did not move since
    /// before it), so that the next run sends it again.
    fn kill_mid_copy(&mut self) -> Result<()> {
        // One page for both: it renders the batch counter before the
        // commit counter, so a commit after the batch shows.
        let scrape = |r: &Replicator| {
            // (empty when it cannot be read)
            let page = r.metrics().unwrap_or_default();
            let sum = |name: &str| -> f64 {
                page.lines()
                    .filter(|l| l.starts_with(name))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .sum()
            };
            (
                sum("kafka_mirror_replicator_commits_total"),
                sum("kafka_mirror_replicator_batches_copied_total"),
            )
        };
        let mut before = scrape(self);
        let deadline = Instant::now() + WAIT;
        loop {
            self.p.alive()?;
            ensure!(
                Instant::now() < deadline,
                "no batch acknowledged between two commits: {before:?}"
            );
            let now = scrape(self);
            if now.0 == before.0 && now.1 > before.1 {
                break;
            }
            before = now;
            std::thread::sleep(Duration::from_millis(10));
        }
        self.p.signal("KILL")?;
        self.p.wait_exit(WAIT)?;
        Ok(())
    }
}

/// Waits until `f` holds, failing with `what` if the replicator exits or
/// [`WAIT`] passes.
fn until(what: &str, r: &mut Replicator, f: impl FnMut() -> Result<bool>) -> Result<()> {
    until_within(what, r, WAIT, f)
}

/// [`until`] with its own bound.
fn until_within(
    what: &str,
    r: &mut Replicator,
    wait: Duration,
    mut f: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + wait;
    let mut last_error = None;
    loop {
        match f() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_error = Some(e),
        }
        r.p.alive().with_context(|| what.to_string())?;
        if Instant::now() > deadline {
            bail!(
                "{what}: not within {wait:?} (last error: {last_error:?}); the replicator's log:\n{}",
                r.p.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The writer's thread: (committed, aborted) transactions.
type Writer = std::thread::JoinHandle<Result<(u64, u64)>>;

/// Waits until every destination partition holds at least `more` records
/// beyond `from`, while the writer writes.
fn copying_on(
    what: &str,
    rt: &Runtime,
    b: &Client,
    r: &mut Replicator,
    writer: &Writer,
    from: &[i64],
    more: i64,
) -> Result<Vec<i64>> {
    let mut now = from.to_vec();
    let mut stopped = false;
    until(what, r, || {
        if writer.is_finished() {
            stopped = true;
            return Ok(true);
        }
        now = ends(rt, b)?;
        Ok(now.iter().zip(from).all(|(n, f)| *n >= f + more))
    })
    .with_context(|| format!("the destination at {now:?}, from {from:?}"))?;
    ensure!(!stopped, "{what}: the writer stopped");
    Ok(now)
}

/// Moves the leader of every partition of the destination topic to its
/// second replica: the replicas are reordered (ReassignPartitionsCommand)
/// and the new first one elected (LeaderElectionCommand, preferred).
/// Returns (old leader, new leader) per partition.
fn move_leaders(rt: &Runtime, b: &Client, bootstrap: &str, dir: &Path) -> Result<Vec<(i32, i32)>> {
    let info = rt.block_on(b.topic(TOPIC))?;
    let mut moves = Vec::new();
    let mut reassign = Vec::new();
    let mut elect = Vec::new();
    let mut wanted = BTreeMap::new();
    for p in &info.partitions {
        ensure!(
            p.replicas.len() == 3,
            "{TOPIC}-{}: replicas {:?}",
            p.partition,
            p.replicas
        );
        // The next replica after the leader that is in sync goes first
        // (the preferred leader), the others keep their order.
        let mut replicas = p.replicas.clone();
        let at = replicas.iter().position(|r| *r == p.leader).unwrap_or(0);
        replicas.rotate_left(at + 1);
        let next = replicas
            .iter()
            .position(|r| *r != p.leader && p.isr.contains(r))
            .with_context(|| format!("{TOPIC}-{}: no other replica in sync: {p:?}", p.partition))?;
        let target = replicas.remove(next);
        replicas.insert(0, target);
        moves.push((p.leader, replicas[0]));
        wanted.insert(p.partition, replicas.clone());
        reassign.push(serde_json::json!({
            "topic": TOPIC, "partition": p.partition, "replicas": replicas,
        }));
        elect.push(serde_json::json!({ "topic": TOPIC, "partition": p.partition }));
    }
    let reassign_file = dir.join("reassign.json");
    std::fs::write(
        &reassign_file,
        serde_json::json!({ "version": 1, "partitions": reassign }).to_string(),
    )?;
    let out = tools::java(
        REASSIGN,
        &[
            "--bootstrap-server",
            bootstrap,
            "--reassignment-json-file",
            &reassign_file.display().to_string(),
            "--execute",
        ],
    )?;
    ensure!(
        out.status.success(),
        "reassigning: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let reordered = |info: &kafka_mirror_proxy::client::metadata::TopicInfo| {
        info.partitions
            .iter()
            .all(|p| wanted.get(&p.partition) == Some(&p.replicas))
    };
    let deadline = Instant::now() + WAIT;
    while !reordered(&rt.block_on(b.topic(TOPIC))?) {
        ensure!(Instant::now() < deadline, "the replicas were not reordered");
        std::thread::sleep(Duration::from_millis(200));
    }
    let elect_file = dir.join("elect.json");
    std::fs::write(
        &elect_file,
        serde_json::json!({ "partitions": elect }).to_string(),
    )?;
    let elected = |info: &kafka_mirror_proxy::client::metadata::TopicInfo| {
        info.partitions
            .iter()
            .all(|p| wanted.get(&p.partition).map(|r| r[0]) == Some(p.leader))
    };
    let mut last = String::new();
    let deadline = Instant::now() + WAIT;
    while !elected(&rt.block_on(b.topic(TOPIC))?) {
        ensure!(
            Instant::now() < deadline,
            "the leaders did not move: {last}"
        );
        let out = tools::java(
            LEADER_ELECTION,
            &[
                "--bootstrap-server",
                bootstrap,
                "--election-type",
                "preferred",
                "--path-to-json-file",
                &elect_file.display().to_string(),
            ],
        )?;
        last = tools::output_text(&out);
    }
    Ok(moves)
}

/// Where `offset` of a source partition should land: the destination
/// offset of the first committed record at or after it (`src` and `dst`
/// hold the same records in the same order), or the destination's end.
fn expected(src: &[Rec], dst: &[Rec], dst_end: i64, offset: i64) -> i64 {
    let at = src.partition_point(|r| r.0 < offset);
    dst.get(at).map_or(dst_end, |r| r.0)
}

/// `kafka-mirror-proxy offsets` for one source offset: the printed
/// destination offset.
fn offsets_cli(bootstrap: &str, partition: i32, offset: i64) -> Result<String> {
    let (partition_arg, offset_arg) = (partition.to_string(), offset.to_string());
    let text = cli_output(&[
        "offsets",
        "--bootstrap-server",
        bootstrap,
        "--link",
        LINK,
        "--topic",
        TOPIC,
        "--partition",
        &partition_arg,
        "--offset",
        &offset_arg,
    ])?;
    let fields: Vec<&str> = text.split_whitespace().collect();
    match fields.as_slice() {
        [t, p, s, d, ..]
            if *t == TOPIC && *p == partition.to_string() && *s == offset.to_string() =>
        {
            Ok(d.to_string())
        }
        _ => bail!("unexpected output {text:?}"),
    }
}

#[test]
fn the_translation_stays_exact_across_kills_a_proxy_restart_and_a_leader_move() -> Result<()> {
    let started = Instant::now();
    let rt = runtime()?;
    // Both clusters start at once.
    let a = std::thread::spawn(|| KafkaCluster::start(KafkaOptions::default()));
    let b = KafkaMultiCluster::start(KafkaOptions::default(), &[1, 2, 3])?;
    let a = a
        .join()
        .map_err(|_| anyhow!("starting the source panicked"))??;
    let (ca, cb) = (client(&a.bootstrap()), client(&b.bootstrap()));
    create_topic(&rt, &ca, TOPIC, PARTITIONS, &[])?;
    let mut proxy = ProxyProcess::start_for_nodes(
        &b.bootstrap(),
        &[1, 2, 3],
        &[
            ("LINKS", LINK),
            ("LINK_A_SOURCE_CLUSTER_ID", a.cluster_id()),
            ("LINK_A_TOPICS", TOPIC),
            ("UNKNOWN_OUTCOME_WAIT_MS", OUTCOME_WAIT_MS),
        ],
    )?;
    let dir = tempfile::tempdir()?;
    eprintln!(
        "clusters and proxy up after {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (bootstrap, stop) = (a.bootstrap(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let written = keep_writing(bootstrap, stop);
            if let Err(e) = &written {
                eprintln!("the writer failed: {e:#}");
            }
            written
        })
    };
    let copying = |what: &str, r: &mut Replicator, from: &[i64]| {
        copying_on(what, &rt, &cb, r, &writer, from, PER_PHASE)
    };
    let elapsed = || started.elapsed().as_secs_f64();
    let mut r = Replicator::start(&a.bootstrap(), &proxy.bootstrap, dir.path(), 1)?;
    copying("the first run copies", &mut r, &[0; PARTITIONS as usize])?;
    // The resume points each later run started from.
    let mut resumed_from = Vec::new();
    // Step `step`: `r` killed mid-copy, the destination's ends and resume
    // points at the kill noted, and run `run` started in its place; the
    // ends at the kill.
    let destination = proxy.bootstrap.clone();
    let mut kill_and_rerun = |step: usize, r: &mut Replicator, run: usize| -> Result<Vec<i64>> {
        r.kill_mid_copy()?;
        let at = ends(&rt, &cb)?;
        let resume = progress(&rt, &cb)?;
        eprintln!(
            "{step}. replicator killed at destination {at:?}, resume points {resume:?} ({:.1} s)",
            elapsed()
        );
        resumed_from.push(resume);
        *r = Replicator::start(&a.bootstrap(), &destination, dir.path(), run)?;
        Ok(at)
    };

    // 1. Killed mid-copy; a second run takes over.
    let at = kill_and_rerun(1, &mut r, 2)?;
    let at = copying("the second run copies", &mut r, &at)?;
    let duplicates = proxy.metric(DUPLICATES)?;
    ensure!(
        duplicates > 0,
        "the second run sent again what the first had acknowledged and not committed, \
         answered as duplicates"
    );

    // 2. The proxy crashes and comes back on the same ports.
    proxy.kill()?;
    std::thread::sleep(Duration::from_millis(500));
    proxy.restart(WAIT)?;
    eprintln!(
        "2. proxy restarted at destination {at:?} ({:.1} s)",
        elapsed()
    );
    let at = copying("copying after the proxy restart", &mut r, &at)?;

    // 3. Every destination partition's leader moves while it is written.
    let moves = move_leaders(&rt, &cb, &b.bootstrap(), dir.path())?;
    eprintln!(
        "3. leaders (old, new) {moves:?} moved at destination {at:?} ({:.1} s)",
        elapsed()
    );
    copying("copying after the leader move", &mut r, &at)?;

    // 4. Killed again: the third run's history is the offsets topic's.
    let before = proxy.metric(DUPLICATES)?;
    let at = kill_and_rerun(4, &mut r, 3)?;
    copying("the third run copies", &mut r, &at)?;
    let again = proxy.metric(DUPLICATES)? - before;
    ensure!(
        again > 0,
        "the third run's first batches are duplicates too"
    );

    stop.store(true, Ordering::Relaxed);
    let (committed, aborted) = writer
        .join()
        .map_err(|_| anyhow!("the writer panicked"))??;
    // The coordinator writes the last transaction's markers after its
    // commit returned: the source's ends once they stay put.
    let mut source_ends = ends(&rt, &ca)?;
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let now = ends(&rt, &ca)?;
        if now == source_ends {
            break;
        }
        source_ends = now;
    }
    let mut resume = Vec::new();
    until("the replicator caught up", &mut r, || {
        resume = progress(&rt, &cb)?;
        Ok(resume == source_ends)
    })
    .with_context(|| format!("resume points {resume:?}, source ends {source_ends:?}"))?;
    let dest_ends = ends(&rt, &cb)?;
    eprintln!(
        "caught up: {committed} transactions committed, {aborted} aborted; source ends \
         {source_ends:?}, destination ends {dest_ends:?}; {duplicates} and {again} batches \
         answered as duplicates after the kills ({:.1} s)",
        started.elapsed().as_secs_f64()
    );

    // Every committed record once, in order, and nothing else.
    let source = read(&a.bootstrap(), "read_committed", &source_ends)?;
    let destination = read(&b.bootstrap(), "read_uncommitted", &dest_ends)?;
    for p in 0..PARTITIONS as usize {
        let (src, dst) = (&source[p], &destination[p]);
        let kv = |r: &[Rec]| -> Vec<(String, String)> {
            r.iter().map(|(_, k, v)| (k.clone(), v.clone())).collect()
        };
        let (want, got) = (kv(src), kv(dst));
        assert!(
            want == got,
            "{TOPIC}-{p}: the destination holds {} records, the source {} committed; first \
             difference at {:?}: {:?} vs {:?}",
            got.len(),
            want.len(),
            want.iter().zip(&got).position(|(a, b)| a != b),
            want.iter().zip(&got).find(|(a, b)| a != b),
            (want.len(), got.len())
        );
        assert_eq!(
            dest_ends[p],
            dst.len() as i64,
            "{TOPIC}-{p}: the destination holds nothing but the copies"
        );
        assert!(
            src.iter().all(|(_, _, v)| !v.contains("aborted")),
            "{TOPIC}-{p}: read_committed saw an aborted record"
        );
        ensure!(
            dest_ends[p] < source_ends[p],
            "{TOPIC}-{p}: the offsets should drift"
        );
    }

    // Every source offset, as `kafka-mirror-proxy offsets` reads the
    // translation (the offsets topic and the progress group).
    let wanted: Vec<((String, i32), i64)> = (0..PARTITIONS)
        .flat_map(|p| (0..=source_ends[p as usize]).map(move |o| ((TOPIC.to_string(), p), o)))
        .collect();
    let translated = rt.block_on(translation::translate(
        &cb,
        OFFSETS_TOPIC,
        LINK,
        PROGRESS_GROUP,
        &wanted,
    ))?;
    ensure!(translated.len() == wanted.len(), "one answer per offset");
    let mut wrong = Vec::new();
    let mut records_checked = 0usize;
    for t in &translated {
        let p = t.partition as usize;
        let (src, dst) = (&source[p], &destination[p]);
        let next = src.partition_point(|r| r.0 < t.source);
        let got = match t.destination {
            Translation::Exact(d) => d,
            other => {
                wrong.push(format!("{TOPIC}-{p} source {}: {other:?}", t.source));
                continue;
            }
        };
        if src.get(next).is_some_and(|r| r.0 == t.source) {
            records_checked += 1;
        }
        match src.get(next) {
            // The same record on both sides: key and value.
            Some((_, key, value)) => {
                let there = dst
                    .binary_search_by_key(&got, |r| r.0)
                    .ok()
                    .map(|i| &dst[i]);
                if there.map(|r| (&r.1, &r.2)) != Some((key, value)) {
                    let what = if next > 0 && src[next - 1].0 + 1 == t.source {
                        "o + 1 of the record before, next record"
                    } else if src[next].0 == t.source {
                        "a record's own offset"
                    } else {
                        "in a gap (marker or aborted), next record"
                    };
                    wrong.push(format!(
                        "{TOPIC}-{p} source {} ({what} {key}/{value:?} at source {}, \
                         destination {}): translated to {got}, which holds {there:?}",
                        t.source,
                        src[next].0,
                        expected(src, dst, dest_ends[p], t.source)
                    ));
                }
            }
            None if got != dest_ends[p] => wrong.push(format!(
                "{TOPIC}-{p} source {} (past the last record): translated to {got}, the \
                 destination ends at {}",
                t.source, dest_ends[p]
            )),
            None => {}
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} source offsets translate wrongly (resume points at the kills {resumed_from:?}); \
         the first:\n{}",
        wrong.len(),
        translated.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    let copied: usize = destination.iter().map(Vec::len).sum();
    assert_eq!(records_checked, copied, "every copied record checked");

    // The command prints the same, at the resume points of the kills.
    for points in &resumed_from {
        for (p, offset) in points.iter().enumerate() {
            let offset = (*offset).max(0);
            let want = expected(&source[p], &destination[p], dest_ends[p], offset);
            let printed = offsets_cli(&b.bootstrap(), p as i32, offset)?;
            assert_eq!(
                printed,
                want.to_string(),
                "kafka-mirror-proxy offsets for {TOPIC}-{p} at {offset}"
            );
        }
    }

    // A source group committed at those points, then in a gap near the
    // end, then at the end: the running replicator commits the same
    // translations on the destination.
    let gap_near_end = |p: usize| -> i64 {
        let src = &source[p];
        (src.len() / 2..src.len())
            .rev()
            .find(|&i| i > 0 && src[i].0 > src[i - 1].0 + 1)
            .map_or(source_ends[p], |i| src[i - 1].0 + 1)
    };
    let mut steps: Vec<Vec<i64>> = resumed_from
        .iter()
        .map(|points| points.iter().map(|o| (*o).max(0)).collect())
        .collect();
    steps.push((0..PARTITIONS as usize).map(gap_near_end).collect());
    steps.push(source_ends.clone());
    let keys: Vec<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    for step in &steps {
        let commit: Offsets = keys.iter().cloned().zip(step.iter().copied()).collect();
        rt.block_on(ca.commit_offsets(APP, &commit))?;
        let want: Offsets = keys
            .iter()
            .cloned()
            .enumerate()
            .map(|(p, k)| {
                let d = expected(&source[p], &destination[p], dest_ends[p], step[p]);
                (k, d)
            })
            .collect();
        let mut there = Offsets::new();
        // Many sync intervals.
        until_within(
            &format!("{APP} at source {step:?} committed on the destination as {want:?}"),
            &mut r,
            Duration::from_secs(20),
            || {
                there = rt.block_on(cb.committed_offsets(APP, &keys))?;
                Ok(there == want)
            },
        )
        .with_context(|| format!("last seen {there:?}"))?;
    }

    r.p.signal("TERM")?;
    let status = r.p.wait_exit(WAIT)?;
    assert_eq!(status.code(), Some(0), "SIGTERM:\n{}", r.p.log_tail());
    eprintln!(
        "{} offsets checked, {records_checked} records; done in {:.1} s",
        translated.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
