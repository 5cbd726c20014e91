//! Exact offset translation (issue 43, item 1): a source partition holding
//! transactions (committed and aborted, each ending in a marker) with an
//! idempotent producer writing in between is copied by the replicator
//! through the proxy. The destination's offsets then drift from the
//! source's (no markers, no aborted batches). For every source offset of
//! every partition, `kafka-mirror-proxy offsets` must name the destination
//! offset of the same next record (read with librdkafka on both sides), and
//! a source consumer group's committed offsets (`--group`) translate the
//! same way. The translation is saved compactly: one segment per run of
//! offsets that move together, not one per batch.

mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::Producer;

use kafka_mirror_proxy::client::offsets::Offsets;
use kafka_mirror_proxy::replicate::translation;
use support::crate_client::{client, create_topic, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{cli_output, http_request, link_env, start_with};
use support::records::{producer, Topic};

const TOPIC: &str = "tx";
const PARTITIONS: i32 = 2;
const T: Topic = Topic {
    name: TOPIC,
    partitions: PARTITIONS,
};
const TRANSACTIONS: usize = 9;
const WAIT: Duration = Duration::from_secs(60);

/// `kafka-mirror-proxy offsets ...`: (topic, partition, source) -> the
/// printed destination offset.
fn offsets_cli(args: &[&str]) -> Result<BTreeMap<(String, i32, i64), String>> {
    let text = cli_output(&[&["offsets"], args].concat())?;
    text.lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [t, p, s, d, ..] => Ok(((t.to_string(), p.parse()?, s.parse()?), d.to_string())),
                _ => bail!("unexpected line {l:?}"),
            }
        })
        .collect()
}

#[test]
fn every_source_offset_translates_to_the_same_next_record() -> Result<()> {
    let rt = runtime()?;
    let a = KafkaCluster::start(KafkaOptions::default())?;
    let b = KafkaCluster::start(KafkaOptions::default())?;
    let (ca, cb) = (client(&a.bootstrap()), client(&b.bootstrap()));
    create_topic(&rt, &ca, TOPIC, PARTITIONS, &[])?;
    let pb = start_with(&b.bootstrap(), &link_env("a", a.cluster_id(), TOPIC))?;

    // Transactions (every third aborted) with plain records between them.
    let plain = producer(&a.bootstrap(), &[])?;
    let txn = producer(&a.bootstrap(), &[("transactional.id", "offsets-txn")])?;
    txn.init_transactions(WAIT)?;
    T.send(&plain, "first", 3)?;
    for t in 0..TRANSACTIONS {
        txn.begin_transaction()?;
        T.send(&txn, &format!("txn{t}"), 4)?;
        if t % 3 == 2 {
            txn.abort_transaction(WAIT)?;
        } else {
            txn.commit_transaction(WAIT)?;
        }
        T.send(&plain, &format!("plain{t}"), 2)?;
    }
    let source_ends = T.ends(&rt, &a.bootstrap())?;
    let source = T.read(&a.bootstrap(), &source_ends)?;

    let config = support::replicator::config(&a.bootstrap(), &pb.bootstrap, TOPIC, "mirror-a");
    let report = support::replicator::run(&rt, config)?;
    ensure!(report.total_records > 0, "nothing copied: {report}");
    let destination_ends = T.ends(&rt, &b.bootstrap())?;
    let destination = T.read(&b.bootstrap(), &destination_ends)?;
    ensure!(
        destination_ends != source_ends,
        "the offsets should drift (markers and aborted batches stay behind)"
    );

    // Every source offset, one at a time.
    let bootstrap = b.bootstrap();
    for p in 0..PARTITIONS {
        let src = &source[&p];
        let dst = &destination[&p];
        for offset in 0..=source_ends[p as usize] {
            let printed = offsets_cli(&[
                "--bootstrap-server",
                &bootstrap,
                "--link",
                "a",
                "--topic",
                TOPIC,
                "--partition",
                &p.to_string(),
                "--offset",
                &offset.to_string(),
            ])?;
            let got: i64 = printed
                .get(&(TOPIC.to_string(), p, offset))
                .context("no line for the offset asked")?
                .parse()
                .with_context(|| format!("{TOPIC}-{p} at {offset}: {printed:?}"))?;
            match src.iter().find(|(o, _)| *o >= offset) {
                Some((_, value)) => {
                    let at = dst.iter().find(|(o, _)| *o == got);
                    ensure!(
                        at.map(|(_, v)| v) == Some(value),
                        "{TOPIC}-{p}: source offset {offset} (next record {value}) translated to \
                         {got}, where the destination holds {at:?}"
                    );
                }
                None => ensure!(
                    got == destination_ends[p as usize],
                    "{TOPIC}-{p}: source offset {offset} is past every record: {got}, \
                     the destination ends at {}",
                    destination_ends[p as usize]
                ),
            }
        }
    }

    // A source group's commits: one inside an aborted transaction, one on
    // a marker.
    let aborted_start = src_offset_of(&source[&0], "plain1-p0-1")? + 1;
    let committed: Offsets = [
        ((TOPIC.to_string(), 0), aborted_start + 2),
        (
            (TOPIC.to_string(), 1),
            src_offset_of(&source[&1], "txn0-p1-3")? + 1,
        ),
    ]
    .into_iter()
    .collect();
    rt.block_on(ca.commit_offsets("app", &committed))?;
    let printed = offsets_cli(&[
        "--bootstrap-server",
        &bootstrap,
        "--link",
        "a",
        "--group",
        "app",
        "--source-bootstrap-server",
        &a.bootstrap(),
    ])?;
    let next_of = |p: i32, value: &str| -> Result<String> {
        destination[&p]
            .iter()
            .find(|(_, v)| v == value)
            .map(|(o, _)| o.to_string())
            .with_context(|| format!("{value} on the destination"))
    };
    assert_eq!(
        printed.get(&(TOPIC.to_string(), 0, aborted_start + 2)),
        Some(&next_of(0, "plain2-p0-0")?),
        "inside transaction 2 (aborted): the next record is plain2's first; {printed:?}"
    );
    assert_eq!(
        printed.get(&(TOPIC.to_string(), 1, committed[&(TOPIC.to_string(), 1)])),
        Some(&next_of(1, "plain0-p1-0")?),
        "on transaction 0's marker: the next record is plain0's first; {printed:?}"
    );

    // Compact: a segment per run, not per batch.
    let (segments, skipped) = rt.block_on(translation::load(
        &client(&pb.bootstrap),
        "__mirror_offsets",
        "a",
        usize::MAX,
    ))?;
    assert_eq!(skipped, 0);
    for p in 0..PARTITIONS {
        let n = segments.get(&(TOPIC.to_string(), p)).map_or(0, |s| s.len());
        let batches = report.partition(TOPIC, p).map_or(0, |r| r.batches_copied);
        // A run ends only where the offsets stop moving together: at a
        // marker or an aborted batch (a marker may land after plain
        // records written meanwhile, so a transaction ends at most two).
        let runs: Vec<_> = segments
            .get(&(TOPIC.to_string(), p))
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        for pair in runs.windows(2) {
            assert!(
                pair[1].source_start > pair[0].source_end
                    || pair[1].destination_start != pair[0].destination_end(),
                "{TOPIC}-{p}: two segments that move together: {pair:?}"
            );
        }
        assert!(
            (1..=2 * TRANSACTIONS + 1).contains(&n) && (n as u64) < batches,
            "{TOPIC}-{p}: {n} segments for {batches} batches: {runs:?}"
        );
    }

    // The groups follow: `app` (no member on the destination) gets the
    // translated offsets; `busy` (a member on the destination) is not
    // touched. A second run of the replicator does it: its history before
    // it started comes from the offsets topic.
    rt.block_on(ca.commit_offsets("busy", &committed))?;
    let busy = destination_member(&b.bootstrap(), "busy")?;
    let mut config = support::replicator::config(&a.bootstrap(), &pb.bootstrap, TOPIC, "mirror-a");
    config.until_caught_up = false;
    config.groups = vec![regex::Regex::new("^(?:app|busy)$")?];
    config.group_sync_interval = Duration::from_millis(300);
    let admin = format!("127.0.0.1:{}", support::ports::free_port()?);
    config.admin_listen = Some(admin.parse()?);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = {
        let handle = rt.handle().clone();
        std::thread::spawn(move || {
            handle
                .block_on(kafka_mirror_proxy::replicate::run(config, stop_rx))
                .map_err(anyhow::Error::from)
        })
    };
    let parts: Vec<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    let expected: Offsets = [
        (
            (TOPIC.to_string(), 0),
            next_of(0, "plain2-p0-0")?.parse::<i64>()?,
        ),
        (
            (TOPIC.to_string(), 1),
            next_of(1, "plain0-p1-0")?.parse::<i64>()?,
        ),
    ]
    .into_iter()
    .collect();
    let deadline = Instant::now() + WAIT;
    loop {
        let there = rt.block_on(cb.committed_offsets("app", &parts))?;
        if there == expected {
            break;
        }
        ensure!(
            Instant::now() < deadline && !run.is_finished(),
            "app's offsets on the destination: {there:?}, expected {expected:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The replicator's admin API answers as the CLI does: the group's
    // translation, and one offset.
    let (status, body) = http_request(&admin, "GET", "/offsets?group=app", "")?;
    ensure!(status.contains("200"), "{status} {body}");
    let answered: serde_json::Value = serde_json::from_str(&body)?;
    let listed = answered["offsets"].as_array().context("offsets")?;
    ensure!(listed.len() == printed.len(), "{body} against {printed:?}");
    for o in listed {
        let key = (
            o["topic"].as_str().context("topic")?.to_string(),
            o["partition"].as_i64().context("partition")? as i32,
            o["source_offset"].as_i64().context("source_offset")?,
        );
        ensure!(
            o["translation"] == "exact"
                && Some(&o["destination_offset"].to_string()) == printed.get(&key),
            "admin {o} against the CLI's {:?}",
            printed.get(&key)
        );
    }
    let one = aborted_start + 2;
    let (status, body) = http_request(
        &admin,
        "GET",
        &format!("/offsets?topic={TOPIC}&partition=0&offset={one}"),
        "",
    )?;
    ensure!(status.contains("200"), "{status} {body}");
    let answered: serde_json::Value = serde_json::from_str(&body)?;
    ensure!(
        answered["offsets"][0]["destination_offset"]
            == next_of(0, "plain2-p0-0")?.parse::<i64>()?,
        "{body}"
    );
    let (status, body) = http_request(&admin, "GET", "/offsets?topic=tx&offset=1", "")?;
    ensure!(
        status.contains("400"),
        "a partial query is refused: {status} {body}"
    );

    // Several more sync intervals: the active group is still untouched.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        rt.block_on(cb.committed_offsets("busy", &parts))?,
        Offsets::new(),
        "a group with a member on the destination is not touched"
    );
    drop(busy);
    let _ = stop_tx.send(true);
    let report = run
        .join()
        .map_err(|_| anyhow!("the replicator panicked"))??;
    ensure!(report.cancelled, "stopped by the test: {report}");
    // A consumer of `app` on the destination starts at the same next records.
    let firsts = first_records(&b.bootstrap(), "app")?;
    assert_eq!(
        firsts,
        [
            (0, "plain2-p0-0".to_string()),
            (1, "plain0-p1-0".to_string())
        ]
        .into_iter()
        .collect::<BTreeMap<_, _>>(),
        "where app resumes on the destination"
    );
    Ok(())
}

/// A member of `group` on `bootstrap` that commits nothing, polling until
/// dropped.
struct Member {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn destination_member(bootstrap: &str, group: &str) -> Result<Member> {
    let consumer: BaseConsumer = RdConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "latest")
        .create()?;
    consumer.subscribe(&[TOPIC])?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let thread = std::thread::spawn(move || {
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let _ = consumer.poll(Duration::from_millis(100));
        }
    });
    // Joined once the group has it as a member.
    let c = client(bootstrap);
    let rt = runtime()?;
    let deadline = Instant::now() + WAIT;
    while rt
        .block_on(c.describe_group(group))
        .map_or(true, |d| d.members.is_empty())
    {
        ensure!(Instant::now() < deadline, "{group} never got its member");
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(Member {
        stop,
        thread: Some(thread),
    })
}

/// The first record each partition gives a consumer of `group`.
fn first_records(bootstrap: &str, group: &str) -> Result<BTreeMap<i32, String>> {
    let consumer: BaseConsumer = RdConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        // Without a committed offset it would fail, not start somewhere.
        .set("auto.offset.reset", "error")
        .create()?;
    consumer.subscribe(&[TOPIC])?;
    let mut out = BTreeMap::new();
    let deadline = Instant::now() + WAIT;
    while out.len() < PARTITIONS as usize {
        ensure!(
            Instant::now() < deadline,
            "first records of {group}: {out:?}"
        );
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m?;
            let v = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            out.entry(m.partition()).or_insert(v);
        }
    }
    Ok(out)
}

fn src_offset_of(records: &[(i64, String)], value: &str) -> Result<i64> {
    records
        .iter()
        .find(|(_, v)| v == value)
        .map(|(o, _)| *o)
        .with_context(|| format!("{value} on the source"))
}
