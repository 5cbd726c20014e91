//! Failback (issue 43, SPEC §12), the short form, with real brokers, the
//! proxy binary in front of each cluster and the replicator both ways one
//! at a time:
//!
//! 1. A's topic (transactions committed and aborted, so offsets drift, and
//!    an idempotent producer) is mirrored into B by link `a`;
//! 2. the replicator stops; A takes more records (B never gets them); link
//!    `a` fails over; B's producers write B;
//! 3. A's proxy has link `b` (source B) `PREPARING`: fenced, read-only;
//! 4. `failback --dry-run` names exactly A's records B never got, per
//!    partition (count, first and last offset), and B's records to copy;
//!    A's admin API (`GET /links/b/failback`) reports the same;
//! 5. `POST /links/b/failback` on A's admin API writes the history and
//!    starting points and starts `b` (then refuses a second time, the link
//!    no longer fenced);
//!    the replicator copies exactly B's own records into A: A then holds
//!    every acknowledged record once (its own past the divergence stay
//!    where they were), and every B offset translates to the A offset of
//!    the same record.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use rdkafka::producer::Producer;
use serde_json::Value;

use support::crate_client::{client, create_topic, runtime};
use support::failover::{barriers, batch_region, dump, preparing, region, ID_A, ID_B};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{link_env, start_with};
use support::records::{producer, Log, Topic};
use support::tools::DumpedBatch;
use support::wire::{partition_result, record_batch, RawClient};

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 2;
const T: Topic = Topic {
    name: TOPIC,
    partitions: PARTITIONS,
};
const WAIT: Duration = Duration::from_secs(60);

fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_kafka-mirror-proxy"))
}

/// `failback ... --json`: exit code and the report.
fn failback(a: &str, b: &str, admin: Option<&str>, dry_run: bool) -> Result<(i32, Value, String)> {
    failback_link("b", "a", a, b, admin, dry_run)
}

/// `failback --link LINK --reverse-of REVERSE_OF ... --json`.
fn failback_link(
    link: &str,
    reverse_of: &str,
    a: &str,
    b: &str,
    admin: Option<&str>,
    dry_run: bool,
) -> Result<(i32, Value, String)> {
    let mut c = bin();
    c.args([
        "failback",
        "--link",
        link,
        "--reverse-of",
        reverse_of,
        "--json",
    ])
    .args(["--bootstrap-server", a, "--source-bootstrap-server", b]);
    if dry_run {
        c.arg("--dry-run");
    }
    if let Some(admin) = admin {
        c.env("MIRROR_PROXY_ADMIN_URL", format!("http://{admin}"));
    }
    let out = c.output().context("running failback")?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    // The report is the first JSON document of the output.
    let report = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .next()
        .transpose()
        .with_context(|| format!("failback output: {stdout}\n{stderr}"))?
        .unwrap_or(Value::Null);
    Ok((
        out.status.code().unwrap_or(-1),
        report,
        format!("{stdout}\n{stderr}"),
    ))
}

/// `offsets --link b`: the A offset of B offset `offset`, if exact.
fn translate_cli(a: &str, partition: i32, offset: i64) -> Result<Option<i64>> {
    let out = bin()
        .args(["offsets", "--bootstrap-server", a, "--link", "b"])
        .args(["--topic", TOPIC, "--partition", &partition.to_string()])
        .args(["--offset", &offset.to_string()])
        .output()?;
    ensure!(
        out.status.success(),
        "offsets: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(text.split_whitespace().nth(3).and_then(|s| s.parse().ok()))
}

fn local_produce(addr: &str, partition: i32) -> Result<(i16, String)> {
    let mut raw = RawClient::connect(addr)?;
    let r = raw.produce("local-app", TOPIC, partition, record_batch(-1, &["local"]))?;
    let (code, message) = partition_result(&r);
    Ok((code, message.unwrap_or_default()))
}

#[test]
fn failback_reports_what_b_never_got_then_copies_only_bs_records() -> Result<()> {
    let rt = runtime()?;
    let a = KafkaCluster::start(KafkaOptions::default().cluster_id(ID_A))?;
    let b = KafkaCluster::start(KafkaOptions::default().cluster_id(ID_B))?;
    create_topic(&rt, &client(&a.bootstrap()), TOPIC, PARTITIONS, &[])?;

    // 1. A's records, with transactions (one aborted) between idempotent
    // ones, mirrored into B by link a.
    let idempotent = producer(&a.bootstrap(), &[])?;
    T.send(&idempotent, "a1", 20)?;
    let tx = producer(&a.bootstrap(), &[("transactional.id", "failback-tx")])?;
    tx.init_transactions(WAIT)?;
    tx.begin_transaction()?;
    T.send(&tx, "aborted", 5)?;
    tx.abort_transaction(WAIT)?;
    tx.begin_transaction()?;
    T.send(&tx, "a-tx", 7)?;
    tx.commit_transaction(WAIT)?;
    T.send(&idempotent, "a2", 10)?;
    let pb = start_with(&b.bootstrap(), &link_env("a", ID_A, TOPIC))?;
    let forward = support::replicator::config(&a.bootstrap(), &pb.bootstrap, TOPIC, "mirror-a");
    support::replicator::run(&rt, forward)?;

    // 2. A goes on alone (the link lags: B never gets these), then the
    // failover; B's producers write B.
    T.send(&idempotent, "a-tail", 6)?;
    tx.begin_transaction()?;
    T.send(&tx, "a-tail-tx", 3)?;
    tx.commit_transaction(WAIT)?;
    let a_ends_at_failover = T.ends(&rt, &a.bootstrap())?;
    let (status, body) = pb.admin_post("/links/a/failover?wait=60", "")?;
    ensure!(status.contains("200"), "failover: {status} {body}");
    let on_b = producer(&pb.bootstrap, &[])?;
    T.send(&on_b, "b", 8)?;

    // 3. A's proxy: link b PREPARING, fenced and read-only.
    // With failback settings, its admin API runs the failback too.
    let mut pa_env = preparing(link_env("b", ID_B, TOPIC));
    pa_env.push(("LINK_B_REVERSE_OF".into(), "a".into()));
    pa_env.push(("LINK_B_SOURCE_BOOTSTRAP_SERVERS".into(), b.bootstrap()));
    let pa = start_with(&a.bootstrap(), &pa_env)?;
    let (code, message) = local_produce(&pa.bootstrap, 0)?;
    ensure!(
        code != 0 && message.contains("PREPARING"),
        "A read-only while preparing: {code} {message}"
    );
    let mut replicator = RawClient::connect(&pa.bootstrap)?;
    if let Ok(r) = replicator.produce("mirror-b", TOPIC, 0, record_batch(-1, &["early"])) {
        ensure!(partition_result(&r).0 != 0, "link b copied while PREPARING");
    }

    // 4. The dry run names exactly A's records past the divergence.
    let a_records = T.read(&a.bootstrap(), &a_ends_at_failover)?;
    let b_ends = T.ends(&rt, &b.bootstrap())?;
    let b_records = T.read(&b.bootstrap(), &b_ends)?;
    let (code, report, out) = failback(&a.bootstrap(), &b.bootstrap(), None, true)?;
    ensure!(code == 0, "dry run exit {code}: {out}");
    ensure!(report["unresolved"] == 0, "{out}");
    let parts = report["partitions"].as_array().context("partitions")?;
    ensure!(parts.len() == PARTITIONS as usize, "{out}");
    for part in parts {
        let p = part["partition"].as_i64().context("partition")? as i32;
        let mine = &a_records[&p];
        let tail: Vec<&(i64, String)> = mine
            .iter()
            .filter(|(_, v)| v.starts_with("a-tail"))
            .collect();
        ensure!(tail.len() == 9, "partition {p}: tail {tail:?}");
        let past = &part["past_divergence"];
        ensure!(
            past["records"] == tail.len() as u64,
            "partition {p}: {part}"
        );
        ensure!(past["first_offset"] == tail[0].0, "partition {p}: {part}");
        // The last record's offset (the batch ends there; the marker after).
        ensure!(
            past["last_offset"] == tail[tail.len() - 1].0,
            "partition {p}: {part}"
        );
        ensure!(part["diverges_at"] == tail[0].0, "partition {p}: {part}");
        // B's own records begin at the barrier.
        let b_first = b_records[&p]
            .iter()
            .find(|(_, v)| v.starts_with("b-"))
            .context("B's own record")?
            .0;
        ensure!(
            part["copy_from"] == b_first,
            "partition {p}: {part} (B's first own record at {b_first})"
        );
    }
    // The admin API's dry run says the same; a link without failback
    // settings has none.
    let (status, body) = pa.admin_get("/links/b/failback")?;
    ensure!(status.contains("200"), "GET failback: {status} {body}");
    let api_report: Value = serde_json::from_str(&body).context("GET failback body")?;
    ensure!(
        api_report == report,
        "the admin API's report differs from the CLI's:\n{api_report}\n{report}"
    );
    let (status, body) = pb.admin_get("/links/a/failback")?;
    ensure!(
        status.contains("404") && body.contains("REVERSE_OF"),
        "a link without failback settings: {status} {body}"
    );
    // Nothing was written by the dry runs.
    ensure!(
        T.ends(&rt, &a.bootstrap())? == a_ends_at_failover,
        "the dry run wrote A"
    );

    // 5. The failback through A's admin API, then the replicator B → A.
    let (status, body) = pa.admin_post("/links/b/failback", "")?;
    ensure!(status.contains("200"), "POST failback: {status} {body}");
    let answer: Value = serde_json::from_str(&body).context("POST failback body")?;
    let report = answer["failback"].clone();
    ensure!(report["unresolved"] == 0, "{body}");
    ensure!(
        answer["link"]["state"] == "MIRRORING",
        "link b started: {body}"
    );
    // Once started, the link is no longer fenced: a second failback would
    // write history under a copying replicator, and is refused.
    let (status, body) = pa.admin_post("/links/b/failback", "")?;
    ensure!(
        status.contains("409") && body.contains("MIRRORING"),
        "a failback of a running link: {status} {body}"
    );
    // Before anything is copied, B's barrier already translates to where
    // B's first own record will land: A's log end, after A's records past
    // the divergence (not into them).
    for p in 0..PARTITIONS {
        let barrier = report["partitions"][p as usize]["copy_from"]
            .as_i64()
            .context("copy_from")?;
        let got = translate_cli(&a.bootstrap(), p, barrier)?;
        ensure!(
            got == Some(a_ends_at_failover[p as usize]),
            "partition {p}: B's barrier {barrier} translates to {got:?} before the copy, not A's end {}",
            a_ends_at_failover[p as usize]
        );
    }

    // Groups that consumed on B: one inside B's own records (partition 0)
    // and exactly at the barrier (partition 1), one inside what B got from
    // A. Each names its next record on B.
    let cb = client(&b.bootstrap());
    let own = |p: i32, i: usize| -> Result<(i64, String)> {
        b_records[&p]
            .iter()
            .filter(|(_, v)| v.starts_with("b-"))
            .nth(i)
            .cloned()
            .context("B's own record")
    };
    let g_own: Vec<(i32, (i64, String))> = vec![(0, own(0, 3)?), (1, own(1, 0)?)];
    let g_mirrored: Vec<(i32, (i64, String))> = (0..PARTITIONS)
        .map(|p| (p, b_records[&p][25].clone()))
        .collect();
    for (group, at) in [("g-own", &g_own), ("g-mirrored", &g_mirrored)] {
        let offsets = at
            .iter()
            .map(|(p, (o, _))| ((TOPIC.to_string(), *p), *o))
            .collect();
        rt.block_on(cb.commit_offsets(group, &offsets))?;
    }
    let mut back = support::replicator::config(&b.bootstrap(), &pa.bootstrap, TOPIC, "mirror-b");
    back.until_caught_up = false;
    back.groups = vec![regex::Regex::new("^g-.*")?];
    back.group_sync_interval = Duration::from_millis(300);
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let running = rt.spawn(kafka_mirror_proxy::replicate::run(back, shutdown));
    // Until B's own records are on A and both groups followed back.
    let ca = client(&a.bootstrap());
    let keys: Vec<(String, i32)> = (0..PARTITIONS).map(|p| (TOPIC.to_string(), p)).collect();
    let deadline = Instant::now() + WAIT;
    let (a_after, followed) = loop {
        let a_end = T.ends(&rt, &a.bootstrap())?;
        let grown: i64 = a_end
            .iter()
            .zip(&a_ends_at_failover)
            .map(|(n, o)| n - o)
            .sum();
        let own = rt.block_on(ca.committed_offsets("g-own", &keys))?;
        let mirrored = rt.block_on(ca.committed_offsets("g-mirrored", &keys))?;
        if grown >= 8 * PARTITIONS as i64 && own.len() == keys.len() && mirrored.len() == keys.len()
        {
            break (
                T.read(&a.bootstrap(), &a_end)?,
                [
                    ("g-own", own, &g_own),
                    ("g-mirrored", mirrored, &g_mirrored),
                ],
            );
        }
        ensure!(
            Instant::now() < deadline,
            "A grew by {grown}; g-own {own:?}; g-mirrored {mirrored:?}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    stop.send(true)?;
    let copied = rt.block_on(running)??;
    ensure!(
        copied.total_records == 8 * PARTITIONS as u64,
        "exactly B's own records copied back: {copied:?}"
    );
    // Each group's offset on A names the same next record it had on B.
    for (group, committed, at) in &followed {
        for (p, (_, value)) in at.iter() {
            let on_a = committed[&(TOPIC.to_string(), *p)];
            let next = a_after[p]
                .iter()
                .find(|(o, _)| *o >= on_a)
                .map(|(_, v)| v.as_str());
            ensure!(
                next == Some(value.as_str()),
                "{group} partition {p}: committed {on_a} on A, whose next record is {next:?}, not {value}"
            );
        }
    }
    for p in 0..PARTITIONS {
        let values = distinct_values(&a_after, p, "A's")?;
        let expected = 20 + 7 + 10 + 9 + 8;
        ensure!(
            values.len() == expected,
            "partition {p}: {} records, {expected} expected",
            values.len()
        );
        // A's own first, then B's, in B's order.
        let b_own: Vec<&str> = values
            .iter()
            .copied()
            .filter(|v| v.starts_with("b-"))
            .collect();
        ensure!(
            values[values.len() - 8..] == b_own[..],
            "partition {p}: {values:?}"
        );
        // Every B offset translates to the A offset of the same record.
        let a_at: BTreeMap<&str, i64> = a_after[&p].iter().map(|(o, v)| (v.as_str(), *o)).collect();
        for (o, v) in &b_records[&p] {
            let got = translate_cli(&a.bootstrap(), p, *o)?;
            ensure!(
                got == Some(a_at[v.as_str()]),
                "partition {p}: B offset {o} ({v}) translated to {got:?}, A holds it at {}",
                a_at[v.as_str()]
            );
        }
    }

    // Kafka's DumpLogSegments: B's producers' batches sit in link b's
    // region on A (B's cluster id), A's own past the divergence keep
    // their ids; B holds A's records in link a's region.
    let region_a = region(ID_A)?;
    for p in 0..PARTITIONS {
        let on_a = dump(&a, TOPIC, p)?;
        let from_b: Vec<&DumpedBatch> = on_a
            .iter()
            .filter(|x| x.base_offset >= a_ends_at_failover[p as usize] && !x.is_control)
            .collect();
        ensure!(!from_b.is_empty(), "partition {p}: B's batches on A");
        for x in &from_b {
            ensure!(
                batch_region(x) == Some(region(ID_B)?),
                "partition {p}: B's batch on A not in B's region: {x:?}"
            );
        }
        ensure!(
            on_a.iter()
                .filter(|x| x.base_offset < a_ends_at_failover[p as usize] && !x.is_control)
                .all(|x| x.producer_id >= 0),
            "partition {p}: A's own batches keep their producer ids"
        );
        let barrier = report["partitions"][p as usize]["copy_from"]
            .as_i64()
            .context("copy_from")?;
        let mirrored: Vec<DumpedBatch> = dump(&b, TOPIC, p)?
            .into_iter()
            .filter(|x| x.base_offset < barrier && !x.is_control)
            .collect();
        ensure!(
            !mirrored.is_empty() && mirrored.iter().all(|x| batch_region(x) == Some(region_a)),
            "partition {p}: A's batches on B in A's region: {mirrored:?}"
        );
    }

    // 6. Everyone moves back to A: link b fails over on A's proxy, A's
    // producers write A again.
    let (status, body) = pa.admin_post("/links/b/failover?wait=60", "")?;
    ensure!(status.contains("200"), "failover of b: {status} {body}");
    let a_at_second_failover = T.ends(&rt, &a.bootstrap())?;
    let on_a = producer(&pa.bootstrap, &[])?;
    T.send(&on_a, "a3", 5)?;

    // 7. A → B again: link a (STOPPED on B's proxy) fails back from link
    // b's failover. B got nothing A lacks; A's records since go to B.
    let (code, report, out) = failback_link("a", "b", &b.bootstrap(), &a.bootstrap(), None, true)?;
    ensure!(code == 0, "dry run of a: exit {code}: {out}");
    for (p, part) in report["partitions"]
        .as_array()
        .context("partitions")?
        .iter()
        .enumerate()
    {
        ensure!(
            part["past_divergence"]["records"] == 0,
            "B holds nothing A lacks: {part}"
        );
        ensure!(
            part["copy_from"] == a_at_second_failover[p],
            "A's own records begin at link b's barrier: {part}"
        );
    }
    let (code, _, out) = failback_link(
        "a",
        "b",
        &b.bootstrap(),
        &a.bootstrap(),
        Some(&pb.admin),
        false,
    )?;
    ensure!(
        code == 0 && out.contains("MIRRORING"),
        "failback of a: exit {code}: {out}"
    );
    let (code, message) = local_produce(&pb.bootstrap, 0)?;
    ensure!(code != 0, "B is read-only again: {code} {message}");
    let forward = support::replicator::config(&a.bootstrap(), &pb.bootstrap, TOPIC, "mirror-a");
    let copied = support::replicator::run(&rt, forward)?;
    ensure!(
        copied.total_records == 5 * PARTITIONS as u64,
        "exactly A's new records copied to B: {copied:?}"
    );
    let b_final = T.read(&b.bootstrap(), &T.ends(&rt, &b.bootstrap())?)?;
    for p in 0..PARTITIONS {
        let values = distinct_values(&b_final, p, "B's")?;
        ensure!(
            values.len() == 20 + 7 + 10 + 8 + 5,
            "B's partition {p}: {values:?}"
        );
        ensure!(
            !values.iter().any(|v| v.starts_with("a-tail")),
            "A's records past the first divergence stay on A only: {values:?}"
        );
        ensure!(
            values[values.len() - 5..]
                .iter()
                .all(|v| v.starts_with("a3-")),
            "B's partition {p} ends with A's new records: {values:?}"
        );
    }
    // The barriers of both failovers, each in its proxy's state topic.
    for (cluster, link) in [(&b, "a"), (&a, "b")] {
        let barriers = barriers(&rt, cluster, link)?;
        ensure!(
            barriers.len() == PARTITIONS as usize,
            "link {link}'s barriers: {barriers:?}"
        );
    }
    Ok(())
}

/// The values of `log`'s partition `p` in order (`side`: whose, for the
/// message), checked to hold no record twice.
fn distinct_values<'a>(log: &'a Log, p: i32, side: &str) -> Result<Vec<&'a str>> {
    let values: Vec<&str> = log[&p].iter().map(|(_, v)| v.as_str()).collect();
    let unique: BTreeSet<&str> = values.iter().copied().collect();
    ensure!(
        unique.len() == values.len(),
        "{side} partition {p} holds a record twice: {values:?}"
    );
    Ok(values)
}
