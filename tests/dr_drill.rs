//! The disaster-recovery drill (issue 43), short form: applications move
//! A → B → A and two consumer groups, Kafka's own VerifiableConsumer
//! (read_committed, committing after every poll), each moving from its own
//! points, read every record once.
//!
//! Two clusters, a proxy in front of each, the replicator both ways one at
//! a time, idempotent and transactional (librdkafka) producers:
//!
//! 1. A's producers write A (a transaction aborted among them); the groups
//!    read parts of it on A; the replicator mirrors A into B and the
//!    groups' offsets follow (`GROUPS`);
//! 2. the replicator stops, A takes more (the link lags: B never gets
//!    those), link `a` fails over on B's proxy;
//! 3. producers move to B (a transaction aborted among them); the groups
//!    move to B and read on from their translated offsets;
//! 4. `failback --dry-run` names exactly A's records B never got;
//!    `failback`; the replicator mirrors B's own records into A and the
//!    groups' offsets follow back;
//! 5. link `b` fails over on A's proxy, producers move back to A, the groups
//!    move back and read to the end.
//!
//! At the end each group consumed every acknowledged record once, none
//! twice, except A's records past the divergence, which stay on A before
//! B's records and which, by the documented policy (docs/operations.md,
//! "Failing back"), no group reads after the move; and A holds every
//! acknowledged record exactly once; B every record once (A's up to the
//! divergence and its own, none of A's past it); each failover's barriers
//! are in its proxy's state topic, and Kafka's DumpLogSegments shows the
//! mirrored producers before each barrier in their source's region, none
//! past it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rdkafka::producer::{BaseProducer, Producer};
use serde_json::Value;
use tokio::runtime::Runtime;

use support::crate_client::{client, create_topic, runtime};
use support::failover::{barriers, batch_region, dump, preparing, region, ID_A, ID_B};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{link_env, start_with};
use support::records::{producer, Topic};
use support::tools::{self, DumpedBatch};

const TOPIC: &str = "payments";
const PARTITIONS: i32 = 2;
const T: Topic = Topic {
    name: TOPIC,
    partitions: PARTITIONS,
};
/// The consumer groups: each reads its own share of A's records (times
/// the scale) before the failover, so that each moves from other points.
const GROUPS: [(&str, usize); 2] = [("g-billing", 30), ("g-audit", 52)];
const WAIT: Duration = Duration::from_secs(90);

/// Records scale: `DR_DRILL_SCALE=100` runs the long form (7,400 records
/// of A's, ...); CI runs 1.
fn scale() -> usize {
    std::env::var("DR_DRILL_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .filter(|n| *n >= 1)
        .unwrap_or(1)
}

/// A committed transaction of `n` records per partition, then an aborted
/// one of `aborted`.
fn transactions(p: &BaseProducer, tag: &str, n: usize, aborted: usize) -> Result<()> {
    p.begin_transaction()?;
    T.send(p, tag, n)?;
    p.commit_transaction(WAIT)?;
    p.begin_transaction()?;
    T.send(p, &format!("aborted-{tag}"), aborted)?;
    p.abort_transaction(WAIT)?;
    Ok(())
}

/// What one run of the VerifiableConsumer consumed and committed.
#[derive(Debug, Default)]
struct Consumed {
    /// (partition, offset, value) in the order consumed.
    records: Vec<(i32, i64, String)>,
    /// The last successful commit per partition.
    committed: BTreeMap<i32, i64>,
}

/// Kafka's VerifiableConsumer in `group` (read_committed, a commit after
/// every poll) until it consumed `max` records.
fn verifiable_consumer(
    bootstrap: &str,
    config: &std::path::Path,
    group: &str,
    max: usize,
) -> Result<Consumed> {
    let out = tools::java_with_input(
        "org.apache.kafka.tools.VerifiableConsumer",
        &[
            "--bootstrap-server",
            bootstrap,
            "--topic",
            TOPIC,
            "--group-id",
            group,
            "--max-messages",
            &max.to_string(),
            "--verbose",
            "--reset-policy",
            "earliest",
            "--session-timeout",
            "10000",
            "--consumer.config",
            &config.display().to_string(),
        ],
        None,
        WAIT,
    )?;
    let mut consumed = Consumed::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(event) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        match event["name"].as_str() {
            Some("record_data") => consumed.records.push((
                event["partition"].as_i64().context("partition")? as i32,
                event["offset"].as_i64().context("offset")?,
                event["value"].as_str().context("value")?.to_string(),
            )),
            Some("offsets_committed") if event["success"] == true => {
                for o in event["offsets"].as_array().into_iter().flatten() {
                    consumed.committed.insert(
                        o["partition"].as_i64().context("partition")? as i32,
                        o["offset"].as_i64().context("offset")?,
                    );
                }
            }
            _ => {}
        }
    }
    ensure!(
        consumed.records.len() == max,
        "the VerifiableConsumer consumed {} of {max}: {}",
        consumed.records.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(consumed)
}

/// The replicator from `source` into `proxy` as link `link`, following
/// `GROUPS`, until `done` holds (then stopped cleanly).
fn replicate_until(
    rt: &tokio::runtime::Runtime,
    source: &str,
    proxy: &str,
    link: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<kafka_mirror_proxy::replicate::Report> {
    let mut config = support::replicator::config(source, proxy, TOPIC, &format!("mirror-{link}"));
    config.until_caught_up = false;
    config.groups = GROUPS
        .iter()
        .map(|(g, _)| regex::Regex::new(&format!("^{g}$")))
        .collect::<Result<_, _>>()?;
    config.group_sync_interval = Duration::from_millis(300);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let running = rt.spawn(kafka_mirror_proxy::replicate::run(config, shutdown));
    let deadline = Instant::now() + WAIT;
    while !done()? {
        ensure!(
            Instant::now() < deadline && !running.is_finished(),
            "link {link}: the replicator did not get there"
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.send(true)?;
    Ok(rt.block_on(running)??)
}

/// Whether every group on `bootstrap` has committed its `expected`: per
/// partition, the offset of the record with that value in `records` (the
/// log), or, for `None` (the group had read everything), the offset after
/// the log's last record.
fn group_at(
    rt: &tokio::runtime::Runtime,
    bootstrap: &str,
    records: &BTreeMap<i32, Vec<(i64, String)>>,
    expected: &[Resume],
) -> Result<bool> {
    let keys: Vec<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    for ((group, _), expected) in GROUPS.iter().zip(expected) {
        let committed = rt.block_on(client(bootstrap).committed_offsets(group, &keys))?;
        let there = expected.iter().all(|(p, value)| {
            let log = records.get(p).map(Vec::as_slice).unwrap_or_default();
            let want = match value {
                Some(value) => log.iter().find(|(_, v)| v == value).map(|(o, _)| *o),
                None => Some(log.last().map_or(0, |(o, _)| o + 1)),
            };
            committed.get(&(TOPIC.to_string(), *p)).copied() == want
        });
        if !there {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Per partition, the value of the group's next record (`None`: it had
/// read every record there).
type Resume = BTreeMap<i32, Option<String>>;

/// Per partition, the value of the record after `consumed`'s last commit
/// in `records` (the log it read); a partition it never committed starts
/// at the log's first record (`auto.offset.reset=earliest`).
fn next_after_commit(consumed: &Consumed, records: &BTreeMap<i32, Vec<(i64, String)>>) -> Resume {
    (0..PARTITIONS)
        .map(|p| {
            let log = records.get(&p).map(Vec::as_slice).unwrap_or_default();
            let next = match consumed.committed.get(&p) {
                Some(o) => log.iter().find(|(offset, _)| offset >= o),
                None => log.first(),
            };
            (p, next.map(|(_, v)| v.clone()))
        })
        .collect()
}

/// The part of `resume` a group offset sync commits: the partitions
/// `consumed` committed.
fn synced(resume: &Resume, consumed: &Consumed) -> Resume {
    resume
        .iter()
        .filter(|(p, _)| consumed.committed.contains_key(p))
        .map(|(p, v)| (*p, v.clone()))
        .collect()
}

/// For each group's consumption on one side: where it resumes on the
/// other (the record after its commit in `log`) and the offsets synced
/// there, in [`GROUPS`] order.
fn resumes(
    consumed: &[Consumed],
    log: &BTreeMap<i32, Vec<(i64, String)>>,
) -> (Vec<Resume>, Vec<Resume>) {
    let resume: Vec<Resume> = consumed.iter().map(|c| next_after_commit(c, log)).collect();
    let sync = resume
        .iter()
        .zip(consumed)
        .map(|(r, c)| synced(r, c))
        .collect();
    (resume, sync)
}

/// Per partition, the first value `consumed` read; where `resume` says the
/// group had read everything, the first record written after the move
/// (`<tag>-p<partition>-0`) stands in.
fn firsts(consumed: &Consumed, resume: &Resume, tag: &str) -> (Resume, Resume) {
    let got = (0..PARTITIONS)
        .map(|p| {
            let first = consumed
                .records
                .iter()
                .find(|(q, _, _)| *q == p)
                .map(|(_, _, v)| v.clone());
            (p, first)
        })
        .collect();
    let want = resume
        .iter()
        .map(|(p, v)| {
            (
                *p,
                Some(v.clone().unwrap_or_else(|| format!("{tag}-p{p}-0"))),
            )
        })
        .collect();
    (got, want)
}

/// Every record value of `T` on `cluster` (region `side`), checked to
/// stand there once each and `count` in all.
fn held_once(
    rt: &Runtime,
    cluster: &KafkaCluster,
    side: &str,
    count: usize,
) -> Result<BTreeSet<String>> {
    let all: Vec<String> = T
        .read(&cluster.bootstrap(), &T.ends(rt, &cluster.bootstrap())?)?
        .into_values()
        .flatten()
        .map(|(_, v)| v)
        .collect();
    let once: BTreeSet<String> = all.iter().cloned().collect();
    ensure!(
        once.len() == all.len() && all.len() == count,
        "{side} holds {} records, {} distinct",
        all.len(),
        once.len()
    );
    Ok(once)
}

#[test]
fn applications_move_a_to_b_to_a_and_the_groups_read_every_record_once() -> Result<()> {
    let n = scale();
    let rt = runtime()?;
    let a = KafkaCluster::start(KafkaOptions::default().cluster_id(ID_A))?;
    let b = KafkaCluster::start(KafkaOptions::default().cluster_id(ID_B))?;
    create_topic(&rt, &client(&a.bootstrap()), TOPIC, PARTITIONS, &[])?;
    let config = a.dir().join("read-committed.properties");
    std::fs::write(&config, "isolation.level=read_committed\n")?;
    let pb = start_with(&b.bootstrap(), &link_env("a", ID_A, TOPIC))?;

    // 1. On A.
    let idempotent = producer(&a.bootstrap(), &[])?;
    let tx = producer(&a.bootstrap(), &[("transactional.id", "drill-a")])?;
    tx.init_transactions(WAIT)?;
    T.send(&idempotent, "a1", 20 * n)?;
    transactions(&tx, "a-tx", 7 * n, 5 * n)?;
    T.send(&idempotent, "a2", 10 * n)?;
    let on_a: Vec<Consumed> = GROUPS
        .iter()
        .map(|(g, k)| verifiable_consumer(&a.bootstrap(), &config, g, k * n))
        .collect::<Result<_>>()?;
    let a_log = T.read(&a.bootstrap(), &T.ends(&rt, &a.bootstrap())?)?;
    let (resume_on_b, sync_on_b) = resumes(&on_a, &a_log);
    replicate_until(&rt, &a.bootstrap(), &pb.bootstrap, "a", || {
        let b_log = T.read(&b.bootstrap(), &T.ends(&rt, &b.bootstrap())?)?;
        let copied: usize = b_log.values().map(Vec::len).sum();
        Ok(copied == 74 * n && group_at(&rt, &b.bootstrap(), &b_log, &sync_on_b)?)
    })?;

    // 2. A goes on alone; failover.
    T.send(&idempotent, "a-tail", 6 * n)?;
    transactions(&tx, "a-tail-tx", 3 * n, 0)?;
    let (status, body) = pb.admin_post("/links/a/failover?wait=60", "")?;
    ensure!(status.contains("200"), "failover of a: {status} {body}");

    // 3. Producers and the groups move to B.
    let idempotent_b = producer(&pb.bootstrap, &[])?;
    let tx_b = producer(&pb.bootstrap, &[("transactional.id", "drill-b")])?;
    tx_b.init_transactions(WAIT)?;
    T.send(&idempotent_b, "b", 8 * n)?;
    transactions(&tx_b, "b-tx", 4 * n, 2 * n)?;
    // (74 - k)n of A's records and 24n of B's own remain for a group on
    // B; each leaves 8n of them for after the move home.
    let on_b: Vec<Consumed> = GROUPS
        .iter()
        .map(|(g, k)| verifiable_consumer(&pb.bootstrap, &config, g, (74 - k + 24 - 8) * n))
        .collect::<Result<_>>()?;
    let b_log = T.read(&b.bootstrap(), &T.ends(&rt, &b.bootstrap())?)?;
    for (((g, _), consumed), resume) in GROUPS.iter().zip(&on_b).zip(&resume_on_b) {
        let (firsts_on_b, want) = firsts(consumed, resume, "b");
        ensure!(
            firsts_on_b == want,
            "on B {g} resumed at {firsts_on_b:?}, after its commits on A: {want:?}"
        );
    }
    let (resume_on_a, sync_on_a) = resumes(&on_b, &b_log);

    // 4. Failback.
    let pa = start_with(&a.bootstrap(), &preparing(link_env("b", ID_B, TOPIC)))?;
    let failback = |dry_run: bool| -> Result<(i32, Value, String)> {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_kafka-mirror-proxy"));
        c.args(["failback", "--link", "b", "--reverse-of", "a", "--json"])
            .args(["--bootstrap-server", &a.bootstrap()])
            .args(["--source-bootstrap-server", &b.bootstrap()])
            .env("MIRROR_PROXY_ADMIN_URL", format!("http://{}", pa.admin));
        if dry_run {
            c.arg("--dry-run");
        }
        let out = c.output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let report = serde_json::Deserializer::from_str(&stdout)
            .into_iter::<Value>()
            .next()
            .transpose()?
            .unwrap_or(Value::Null);
        Ok((
            out.status.code().unwrap_or(-1),
            report,
            format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)),
        ))
    };
    let (code, report, out) = failback(true)?;
    ensure!(code == 0, "dry run: {out}");
    let a_log = T.read(&a.bootstrap(), &T.ends(&rt, &a.bootstrap())?)?;
    for part in report["partitions"].as_array().context("partitions")? {
        let p = part["partition"].as_i64().context("partition")? as i32;
        let tail: Vec<i64> = a_log[&p]
            .iter()
            .filter(|(_, v)| v.starts_with("a-tail"))
            .map(|(o, _)| *o)
            .collect();
        ensure!(
            part["past_divergence"]["records"] == tail.len() as u64
                && part["past_divergence"]["first_offset"] == tail[0]
                && part["past_divergence"]["last_offset"] == tail[tail.len() - 1],
            "partition {p}: the report names {part}, A's records B never got are at {tail:?}"
        );
    }
    let (code, _, out) = failback(false)?;
    ensure!(code == 0, "failback: {out}");
    let copied = replicate_until(&rt, &b.bootstrap(), &pa.bootstrap, "b", || {
        let a_log = T.read(&a.bootstrap(), &T.ends(&rt, &a.bootstrap())?)?;
        let own = a_log
            .values()
            .flatten()
            .filter(|(_, v)| v.starts_with("b"))
            .count();
        Ok(own == 24 * n && group_at(&rt, &a.bootstrap(), &a_log, &sync_on_a)?)
    })?;
    ensure!(
        copied.total_records == 24 * n as u64,
        "B's own records only: {copied:?}"
    );

    // 5. Home: link b fails over, producers and the groups move back.
    let (status, body) = pa.admin_post("/links/b/failover?wait=60", "")?;
    ensure!(status.contains("200"), "failover of b: {status} {body}");
    let idempotent_a = producer(&pa.bootstrap, &[])?;
    T.send(&idempotent_a, "a3", 5 * n)?;
    // 8n of B's own records and the 10n new ones remain.
    let back: Vec<Consumed> = GROUPS
        .iter()
        .map(|(g, _)| verifiable_consumer(&pa.bootstrap, &config, g, 18 * n))
        .collect::<Result<_>>()?;
    for (((g, _), consumed), resume) in GROUPS.iter().zip(&back).zip(&resume_on_a) {
        let (firsts_on_a, want) = firsts(consumed, resume, "a3");
        ensure!(
            firsts_on_a == want,
            "back on A {g} resumed at {firsts_on_a:?}, after its commits on B: {want:?}"
        );
    }

    let a_once = held_once(&rt, &a, "A", (74 + 18 + 24 + 10) * n)?;
    let expected: BTreeSet<&str> = a_once
        .iter()
        .map(String::as_str)
        .filter(|v| !v.starts_with("a-tail"))
        .collect();
    // Every group consumed every acknowledged record once; A's past the
    // divergence by the policy not at all.
    for (i, (g, _)) in GROUPS.iter().enumerate() {
        let consumed: Vec<&str> = [&on_a[i], &on_b[i], &back[i]]
            .iter()
            .flat_map(|c| c.records.iter().map(|(_, _, v)| v.as_str()))
            .collect();
        let once: BTreeSet<&str> = consumed.iter().copied().collect();
        ensure!(
            once.len() == consumed.len(),
            "{g} read {} records, {} of them twice",
            consumed.len(),
            consumed.len() - once.len()
        );
        ensure!(
            once == expected,
            "{g} skipped {:?} and read {:?} it should not have",
            expected.difference(&once).collect::<Vec<_>>(),
            once.difference(&expected).collect::<Vec<_>>()
        );
    }
    ensure!(
        !a_once.iter().any(|v| v.contains("aborted")),
        "no aborted record is read on A"
    );

    // B: every record once, A's before the divergence and B's own, none
    // of A's past it (the policy), nothing A does not also hold.
    let b_once = held_once(&rt, &b, "B", (74 + 24) * n)?;
    ensure!(
        b_once
            .iter()
            .all(|v| !v.starts_with("a-tail") && a_once.contains(v)),
        "B holds records A does not, or A's past the divergence: {:?}",
        b_once
            .iter()
            .filter(|v| v.starts_with("a-tail") || !a_once.contains(*v))
            .collect::<Vec<_>>()
    );

    // The barriers of both failovers, on both sides: a stock broker
    // refuses the MIRROR_PID_RESET control batch (INVALID_RECORD), so each
    // sits in its proxy's state topic with the log end it marks. Kafka's
    // DumpLogSegments then shows the regions on each side of it: before
    // it, the link's mirrored batches in their source's region (B's
    // producers on A in B's, A's on B in A's); at or past it, none.
    for (cluster, link, source) in [(&a, "b", ID_B), (&b, "a", ID_A)] {
        let source_region = region(source)?;
        let barriers = barriers(&rt, cluster, link)?;
        ensure!(
            barriers.len() == PARTITIONS as usize,
            "link {link}'s barriers: {barriers:?}"
        );
        for (p, barrier) in barriers {
            let batches = dump(cluster, TOPIC, p)?;
            let in_region = |x: &&DumpedBatch| batch_region(x) == Some(source_region);
            let before: Vec<&DumpedBatch> = batches
                .iter()
                .filter(|x| !x.is_control && x.producer_id < 0 && x.base_offset < barrier)
                .collect();
            ensure!(
                !before.is_empty() && before.iter().all(in_region),
                "link {link}, partition {p}: mirrored batches before the barrier at {barrier} outside {source}'s region: {before:?}"
            );
            let after: Vec<&DumpedBatch> = batches
                .iter()
                .filter(|x| x.base_offset >= barrier)
                .filter(in_region)
                .collect();
            ensure!(
                after.is_empty(),
                "link {link}, partition {p}: mirrored batches at or past the barrier at {barrier}: {after:?}"
            );
        }
    }
    Ok(())
}
