//! Several instances of one link share its partitions (issue 42, item 4):
//! three `kafka-mirror-proxy replicate` processes of link `a`, between a
//! real source broker and a proxy in front of a real destination broker,
//! while an idempotent librdkafka producer keeps writing to the source.
//!
//! 1. The three join `replicator.mirror-a.instances` on the source (Kafka's
//!    own tool lists three members) and each copies a share.
//! 2. One is killed with SIGKILL under load: after the session timeout the
//!    other two take its partitions over, and every partition moves on.
//! 3. A fourth is started under load: it takes a share without a stop of
//!    the others.
//! 4. The producer stops; the destination ends up with exactly the source's
//!    records, in the source's order, in every partition: nothing lost
//!    (the killed instance's unacknowledged batches are fetched again by
//!    their next owner) and nothing doubled (what it had acknowledged and
//!    not committed is answered by the proxy as a duplicate, and hand-overs
//!    between live instances leave nothing in flight).
//! 5. SIGTERM: the three left exit 0 and leave the group.
//!
//! The source topics are written by an idempotent producer without
//! transactions, so the destination's offsets equal the source's and "the
//! same records" is checked record by record with a consumer of the
//! destination.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use kafka_mirror_proxy::client::Client;
use support::crate_client::{create_topic, end_offsets, runtime};
use support::http;
use support::replicator::{clusters, link_a_proxy, replicator_command, Process};
use support::tools;

/// Bound on every wait (brokers, JVMs and four replicators share 2 cores).
const WAIT: Duration = Duration::from_secs(120);
const INSTANCES: &str = "replicator.mirror-a.instances";
/// (topic, partitions): 9 partitions over 3 instances.
const TOPICS: [(&str, i32); 2] = [("scale.a", 6), ("scale.b", 3)];

fn value(topic: &str, partition: i32, i: u64) -> String {
    format!("{topic}-{partition}-{i}")
}

/// Starts instance `n` of link `a`; returns it and its admin address.
fn start(source: &str, proxy: &str, dir: &Path, n: usize) -> Result<(Process, String)> {
    let mut command = replicator_command();
    command
        .args(["--source-bootstrap-servers", source])
        .args(["--destination-bootstrap-servers", proxy])
        .args(["--link", "a"])
        .args(["--topics", "scale\\..*"])
        // The brokers' smallest session timeout: a killed instance's
        // partitions move after 6 s.
        .args(["--session-timeout-ms", "6000"])
        .args(["--commit-interval-ms", "1000"])
        .args(["--retry-backoff-ms", "50"]);
    let (process, admin) = Process::spawn_with_admin(command, dir, &format!("replicator-{n}"))?;
    Ok((process, admin))
}

/// Records an instance copied (all topics), from its /metrics at `admin`.
fn copied(admin: &str) -> Result<f64> {
    Ok(http::get(admin, "/metrics")?
        .text
        .lines()
        .filter(|l| l.starts_with("kafka_mirror_replicator_records_copied_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// Writes records to every partition, in rounds, until told to stop;
/// returns how many each partition got.
fn keep_writing(bootstrap: String, stop: Arc<AtomicBool>) -> Result<BTreeMap<(String, i32), u64>> {
    let p: BaseProducer = RdConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let mut written: BTreeMap<(String, i32), u64> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..20 {
            for (topic, partitions) in TOPICS {
                for partition in 0..partitions {
                    let n = written.entry((topic.to_string(), partition)).or_insert(0);
                    let v = value(topic, partition, *n);
                    p.send(
                        BaseRecord::<(), _>::to(topic)
                            .partition(partition)
                            .payload(&v),
                    )
                    .map_err(|(e, _)| anyhow!("queueing {v}: {e}"))?;
                    *n += 1;
                }
            }
        }
        p.flush(WAIT)?;
        std::thread::sleep(Duration::from_millis(20));
    }
    p.flush(WAIT)?;
    Ok(written)
}

fn ends(rt: &tokio::runtime::Runtime, c: &Client) -> Result<BTreeMap<(String, i32), i64>> {
    let mut out = BTreeMap::new();
    for (topic, partitions) in TOPICS {
        for (p, end) in (0..).zip(end_offsets(rt, c, topic, partitions)?) {
            out.insert((topic.to_string(), p), end);
        }
    }
    Ok(out)
}

/// The group's members, once it is stable.
fn stable_members(rt: &tokio::runtime::Runtime, src: &Client) -> Result<Option<usize>> {
    let d = rt.block_on(src.describe_group(INSTANCES))?;
    Ok((d.state == "Stable").then_some(d.members.len()))
}

/// Waits until `f` holds, checking that every replicator still runs.
fn until(what: &str, rs: &mut [&mut Process], mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        if f().unwrap_or(false) {
            return Ok(());
        }
        for r in rs.iter_mut() {
            r.alive().with_context(|| what.to_string())?;
        }
        if Instant::now() > deadline {
            let logs: Vec<String> = rs.iter().map(|r| r.log_tail()).collect();
            bail!(
                "{what}: not within {WAIT:?}; logs:\n{}",
                logs.join("\n----\n")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Every value of every partition on the destination, in log order, up to
/// `ends`.
fn consume(
    bootstrap: &str,
    ends: &BTreeMap<(String, i32), i64>,
) -> Result<BTreeMap<(String, i32), Vec<String>>> {
    let consumer: BaseConsumer = RdConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "replicate-scale-verifier")
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for (topic, p) in ends.keys() {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;
    let mut out: BTreeMap<(String, i32), Vec<String>> = BTreeMap::new();
    let mut read: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    while ends
        .iter()
        .any(|(k, end)| read.get(k).copied().unwrap_or(0) < *end)
    {
        ensure!(
            Instant::now() < deadline,
            "consuming the destination: {read:?} of {ends:?}"
        );
        let Some(m) = consumer.poll(Duration::from_millis(500)) else {
            continue;
        };
        let m = m?;
        let key = (m.topic().to_string(), m.partition());
        read.insert(key.clone(), m.offset() + 1);
        let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
        out.entry(key).or_default().push(v);
    }
    Ok(out)
}

#[test]
fn instances_of_one_link_share_its_partitions_through_a_kill_and_an_addition() -> Result<()> {
    let rt = runtime()?;
    let (source, destination, src, dst) = clusters()?;
    let proxy = link_a_proxy(&source, &destination, "scale\\..*")?;
    for (topic, partitions) in TOPICS {
        create_topic(&rt, &src, topic, partitions, &[])?;
    }
    let dir = tempfile::tempdir()?;
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (bootstrap, stop) = (source.bootstrap(), Arc::clone(&stop));
        std::thread::spawn(move || keep_writing(bootstrap, stop))
    };

    // 1. Three instances, each with a share.
    let start = |n| start(&source.bootstrap(), &proxy.bootstrap, dir.path(), n);
    let ((mut r0, a0), (mut r1, a1), (mut r2, a2)) = (start(0)?, start(1)?, start(2)?);
    let admins = [a0, a1, a2];
    until(
        "three members, each copying",
        &mut [&mut r0, &mut r1, &mut r2],
        || {
            Ok(stable_members(&rt, &src)? == Some(3)
                && admins.iter().all(|a| copied(a).is_ok_and(|n| n > 0.0)))
        },
    )?;
    let members = tools::consumer_group_member_client_ids(&source.bootstrap(), INSTANCES, &[])?;
    assert_eq!(
        members,
        ["mirror-a", "mirror-a", "mirror-a"],
        "Kafka's tool lists the three instances"
    );

    // 2. One killed under load: its partitions move to the other two.
    r1.child.kill()?;
    r1.child.wait()?;
    let at_kill = ends(&rt, &dst)?;
    until(
        "two members after the kill",
        &mut [&mut r0, &mut r2],
        || Ok(stable_members(&rt, &src)? == Some(2)),
    )?;
    until(
        "every partition moves on after the kill",
        &mut [&mut r0, &mut r2],
        || {
            let now = ends(&rt, &dst)?;
            Ok(now.iter().all(|(k, end)| *end > at_kill[k]))
        },
    )?;

    // 3. A fourth started under load takes a share.
    let (mut r3, added) = start(3)?;
    until(
        "three members again, the new one copying",
        &mut [&mut r0, &mut r2, &mut r3],
        || Ok(stable_members(&rt, &src)? == Some(3) && copied(&added)? > 0.0),
    )?;
    let at_add = ends(&rt, &dst)?;
    until(
        "every partition moves on after the addition",
        &mut [&mut r0, &mut r2, &mut r3],
        || {
            let now = ends(&rt, &dst)?;
            Ok(now.iter().all(|(k, end)| *end > at_add[k]))
        },
    )?;

    // 4. Exactly the source's records, in order.
    stop.store(true, Ordering::Relaxed);
    let written = writer
        .join()
        .map_err(|_| anyhow!("the writer panicked"))??;
    let source_ends = ends(&rt, &src)?;
    for (k, n) in &written {
        assert_eq!(
            source_ends[k], *n as i64,
            "{k:?}: the source holds what was written"
        );
    }
    until(
        "the destination caught up",
        &mut [&mut r0, &mut r2, &mut r3],
        || Ok(ends(&rt, &dst)? == source_ends),
    )?;
    let copied = consume(&destination.bootstrap(), &source_ends)?;
    for ((topic, partition), n) in &written {
        let expected: Vec<String> = (0..*n).map(|i| value(topic, *partition, i)).collect();
        let got = copied
            .get(&(topic.clone(), *partition))
            .cloned()
            .unwrap_or_default();
        assert!(
            got == expected,
            "{topic}-{partition}: {} records on the destination, {} written; first difference at {:?}",
            got.len(),
            expected.len(),
            got.iter().zip(&expected).position(|(a, b)| a != b)
        );
    }
    // Nothing more arrives later (a duplicate landing after the check).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        ends(&rt, &dst)?,
        source_ends,
        "nothing appended after catching up"
    );

    // 5. A clean stop leaves the group.
    for r in [&r0, &r2, &r3] {
        r.signal("TERM")?;
    }
    for r in [&mut r0, &mut r2, &mut r3] {
        let status = r.wait_exit(WAIT)?;
        assert_eq!(status.code(), Some(0), "SIGTERM:\n{}", r.log_tail());
    }
    let left = rt.block_on(src.describe_group(INSTANCES))?;
    assert!(left.members.is_empty(), "members after the stop: {left:?}");
    Ok(())
}
