//! A replicator restart is a supported event (issue 26, item 2): the
//! replicator, run as the binary's `replicate` subcommand through the proxy binary between
//! two real brokers, is killed with SIGKILL twice while it copies and
//! started again. It keeps its progress in a consumer group on the destination
//! cluster, committed only for acknowledged batches, and resumes from it;
//! the batches acknowledged between its last commit and the kill are sent
//! again and the proxy answers them as duplicates (its duplicate counter
//! grows) instead of appending them again.
//!
//! The source has two topics: `idem`, written by an idempotent librdkafka
//! producer in three phases (one per replicator run), and `txn`, written by
//! a transactional one (committed and aborted transactions, read
//! read_committed by the replicator). At the end a read_committed consumer
//! of the destination must see every committed source record exactly once,
//! in source order per partition, and no aborted one.
//!
//! The replicator runs with a commit interval far longer than the test, so
//! only its batch bound (a commit after 5 acknowledged batches of a
//! partition) commits while it runs. The test kills it only while the
//! destination is ahead of the commit (checked with the replicator frozen
//! by SIGSTOP), so the kill lands between an acknowledgement and its
//! commit. For each kill the test compares the
//! destination's end offsets of `idem` (equal to source offsets: the
//! batches are copied as they are into an empty topic) with the committed
//! offsets, so it knows how many partitions must see re-sent batches.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use kafka_mirror_proxy::client::Client;
use support::crate_client::{create_topic, end_offsets, runtime};
use support::kafka::KafkaCluster;
use support::proxy::ProxyProcess;
use support::records;
use support::replicator::{clusters, link_a_proxy, replicator_command, Process};
use support::tools;

const IDEM: &str = "idem";
const IDEM_PARTITIONS: i32 = 3;
const TXN: &str = "txn";
const TXN_PARTITIONS: i32 = 2;
/// Records per partition of `idem` written in each of the three phases.
const PER_PHASE: usize = 400;
/// Transactions per phase (every third one aborted), records per partition
/// in each.
const TXNS_PER_PHASE: usize = 12;
const PER_TXN: usize = 5;
const GROUP: &str = "replicator.mirror-a";
const DUPLICATES: &str = "kafka_mirror_proxy_mirror_duplicates_answered_total{link=\"a\"}";
/// Bound on every wait (brokers and JVMs share 2 cores).
const WAIT: Duration = Duration::from_secs(120);

fn idem_value(partition: i32, i: usize) -> String {
    format!("idem-p{partition}-{i}")
}

fn txn_value(committed: bool, t: usize, partition: i32, i: usize) -> String {
    let kind = if committed { "committed" } else { "aborted" };
    format!("txn-{kind}-{t}-p{partition}-{i}")
}

/// Starts run `run` of the replicator, its output in files of the test's
/// directory.
fn start_replicator(
    source: &KafkaCluster,
    proxy: &ProxyProcess,
    dir: &Path,
    run: usize,
    until_caught_up: bool,
) -> Result<Process> {
    let mut command = replicator_command();
    command
        .args(["--source-bootstrap-servers", &source.bootstrap()])
        .args(["--destination-bootstrap-servers", &proxy.bootstrap])
        .args(["--topics", &format!("{IDEM},{TXN}")])
        .args(["--link", "a"])
        .args(["--until-caught-up", &until_caught_up.to_string()])
        // Only the batch bound commits while it runs (see the module
        // doc); the default group is replicator.<client id>.
        .args(["--commit-interval-ms", "3600000"])
        .args(["--retry-backoff-ms", "50"])
        .args(["--admin-listen", "127.0.0.1:0"]);
    Process::spawn(command, dir, &format!("replicator-{run}"))
}

/// Writes phase `phase` of both topics to the source: `PER_PHASE` records
/// per partition of `idem` in batches of about 10, and `TXNS_PER_PHASE`
/// transactions of `txn`.
fn write_phase(idem: &BaseProducer, txn: &BaseProducer, phase: usize) -> Result<()> {
    for i in phase * PER_PHASE..(phase + 1) * PER_PHASE {
        for p in 0..IDEM_PARTITIONS {
            let v = idem_value(p, i);
            idem.send(BaseRecord::<(), _>::to(IDEM).partition(p).payload(&v))
                .map_err(|(e, _)| anyhow!("queueing {v}: {e}"))?;
        }
        if i % 10 == 9 {
            idem.flush(WAIT)?;
        }
    }
    idem.flush(WAIT)?;
    for t in phase * TXNS_PER_PHASE..(phase + 1) * TXNS_PER_PHASE {
        let committed = t % 3 != 2;
        txn.begin_transaction()?;
        for p in 0..TXN_PARTITIONS {
            for i in 0..PER_TXN {
                let v = txn_value(committed, t, p, i);
                txn.send(BaseRecord::<(), _>::to(TXN).partition(p).payload(&v))
                    .map_err(|(e, _)| anyhow!("queueing {v}: {e}"))?;
            }
        }
        // Delivered before the outcome (librdkafka's abort wants its
        // delivery reports polled first).
        txn.flush(WAIT)?;
        if committed {
            txn.commit_transaction(WAIT)?;
        } else {
            txn.abort_transaction(WAIT)?;
        }
    }
    Ok(())
}

/// The group's committed offsets of `idem` (0 where none), on the
/// destination cluster.
fn committed(rt: &tokio::runtime::Runtime, dest: &Client) -> Result<Vec<i64>> {
    let parts: Vec<(String, i32)> = (0..IDEM_PARTITIONS)
        .map(|p| (IDEM.to_string(), p))
        .collect();
    let committed = rt.block_on(dest.committed_offsets(GROUP, &parts))?;
    Ok(parts
        .iter()
        .map(|k| committed.get(k).copied().unwrap_or(0))
        .collect())
}

/// Waits until the destination's `idem` holds at least `records` records
/// in all and one of its partitions holds more than the group committed,
/// then leaves the replicator frozen (SIGSTOP, so it cannot commit between
/// the check and the kill); or fails if the replicator exits. Checked while
/// frozen; thawed again when nothing was ahead (it commits every 5 batches,
/// so something is, most of the time).
fn wait_for_copied(
    rt: &tokio::runtime::Runtime,
    dest: &Client,
    replicator: &mut Process,
    records: i64,
) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let copied: i64 = end_offsets(rt, dest, IDEM, IDEM_PARTITIONS)?.iter().sum();
        if copied >= records {
            replicator.signal("STOP")?;
            let ends = end_offsets(rt, dest, IDEM, IDEM_PARTITIONS)?;
            if ends.iter().zip(committed(rt, dest)?).any(|(&e, k)| e > k) {
                return Ok(());
            }
            replicator.signal("CONT")?;
        }
        replicator.still_waiting(&format!("{copied} of {records} records copied"), deadline)?;
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Every record value of `topic` on the destination, per partition in log
/// order, read by a read_committed consumer up to the end offsets.
fn consume(bootstrap: &str, topic: &str, ends: &[i64]) -> Result<BTreeMap<i32, Vec<String>>> {
    let mut c = RdConfig::new();
    c.set("isolation.level", "read_committed");
    Ok(records::read_with(c, bootstrap, topic, ends)?
        .into_iter()
        .map(|(p, log)| (p, log.into_iter().map(|(_, _, v)| v).collect()))
        .collect())
}

#[test]
fn a_killed_replicator_resumes_from_its_commits_and_copies_each_record_once() -> Result<()> {
    let rt = runtime()?;
    let (source, destination, src, dest) = clusters()?;
    for c in [&src, &dest] {
        create_topic(&rt, c, IDEM, IDEM_PARTITIONS, &[])?;
        create_topic(&rt, c, TXN, TXN_PARTITIONS, &[])?;
    }
    let proxy = link_a_proxy(&source, &destination, &format!("{IDEM},{TXN}"))?;
    let dir = tempfile::tempdir()?;

    let idem: BaseProducer = RdConfig::new()
        .set("bootstrap.servers", source.bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create()?;
    let txn: BaseProducer = RdConfig::new()
        .set("bootstrap.servers", source.bootstrap())
        .set("transactional.id", "restart-source-txn")
        .set("message.timeout.ms", "60000")
        .create()?;
    txn.init_transactions(WAIT)?;

    let per_phase_total = (PER_PHASE as i64) * i64::from(IDEM_PARTITIONS);
    let total = 3 * per_phase_total;
    // (partitions where the destination was ahead of the commit, their
    // batches) per kill.
    let mut ahead_partitions = 0;
    let mut kills = Vec::new();
    for phase in 0..2 {
        write_phase(&idem, &txn, phase)?;
        let mut r = start_replicator(&source, &proxy, dir.path(), phase, false)?;
        // Kill once about half of this phase is copied: some records of
        // the whole stream copied, never all (phase 3 is not written yet).
        let target = phase as i64 * per_phase_total + per_phase_total / 2;
        wait_for_copied(&rt, &dest, &mut r, target)?;
        r.kill()?;
        let copied = end_offsets(&rt, &dest, IDEM, IDEM_PARTITIONS)?;
        let committed = committed(&rt, &dest)?;
        eprintln!(
            "kill {}: destination ends {copied:?}, committed {committed:?}",
            phase + 1
        );
        ensure!(
            copied.iter().sum::<i64>() < total,
            "killed after everything was copied"
        );
        ensure!(
            copied.iter().zip(&committed).all(|(c, k)| k <= c),
            "a commit ahead of what the destination holds: {committed:?} > {copied:?}"
        );
        ahead_partitions += copied.iter().zip(&committed).filter(|(c, k)| c > k).count();
        kills.push((copied, committed));
    }
    ensure!(
        kills
            .iter()
            .any(|(_, committed)| committed.iter().any(|&k| k > 0)),
        "the replicator committed nothing before it was killed"
    );

    // The last run copies the rest and stops once caught up.
    write_phase(&idem, &txn, 2)?;
    let mut last = start_replicator(&source, &proxy, dir.path(), 2, true)?;
    let status = last.child.wait()?;
    ensure!(
        status.success(),
        "the last replicator run failed ({status}); its log:\n{}\nproxy log:\n{}",
        last.log_tail(),
        tools::tail_str(&proxy.logs(), 30)
    );
    let run_log = std::fs::read_to_string(&last.log).unwrap_or_default();
    ensure!(
        run_log.contains(&format!(
            "topic=\"{IDEM}\" partitions=[0, 1, 2] resumed={IDEM_PARTITIONS}"
        )),
        "the last run did not resume from the group's commits:\n{}",
        last.log_tail()
    );

    // Exactly once, in source order per partition.
    let ends = end_offsets(&rt, &dest, IDEM, IDEM_PARTITIONS)?;
    ensure!(
        ends.iter().sum::<i64>() == total,
        "destination idem ends {ends:?}, {total} records written"
    );
    let got = consume(&destination.bootstrap(), IDEM, &ends)?;
    for p in 0..IDEM_PARTITIONS {
        let want: Vec<String> = (0..3 * PER_PHASE).map(|i| idem_value(p, i)).collect();
        let have = got.get(&p).cloned().unwrap_or_default();
        let first_wrong = (0..want.len().max(have.len())).find(|&i| have.get(i) != want.get(i));
        ensure!(
            first_wrong.is_none(),
            "idem-{p}: {} records for {}, first difference at {first_wrong:?}: {:?}",
            have.len(),
            want.len(),
            first_wrong.and_then(|i| have.get(i))
        );
    }
    let txn_ends = end_offsets(&rt, &dest, TXN, TXN_PARTITIONS)?;
    let got = consume(&destination.bootstrap(), TXN, &txn_ends)?;
    for p in 0..TXN_PARTITIONS {
        let want: Vec<String> = (0..3 * TXNS_PER_PHASE)
            .filter(|t| t % 3 != 2)
            .flat_map(|t| (0..PER_TXN).map(move |i| txn_value(true, t, p, i)))
            .collect();
        let have = got.get(&p).cloned().unwrap_or_default();
        ensure!(
            have == want,
            "txn-{p}: {} records for {} committed ones (aborted ones seen: {})",
            have.len(),
            want.len(),
            have.iter().filter(|v| v.contains("aborted")).count()
        );
    }

    // What the kills left between acknowledgement and commit came back as
    // duplicates: each such partition re-sent at least one batch.
    let duplicates = proxy.metric(DUPLICATES)?;
    eprintln!(
        "kills: {}; partitions re-sending acknowledged batches: {ahead_partitions}; \
         duplicates answered: {duplicates}; idem records compared: {total}",
        kills.len()
    );
    ensure!(
        ahead_partitions > 0,
        "no kill landed between an acknowledgement and its commit: {kills:?}"
    );
    ensure!(
        duplicates >= ahead_partitions as i64,
        "{duplicates} duplicates answered for {ahead_partitions} partitions that re-sent batches"
    );
    Ok(())
}
