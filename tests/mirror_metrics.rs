//! Mirror-aware metrics and failover pre-checks (issue 28 items 5 and 6),
//! through the proxy binary in front of a real broker: link writes as a
//! replicator sends them (idempotent and not, CreateTime and
//! LogAppendTime batches), the per-link counters and replication delay in
//! `/metrics`, the per-partition figures of `GET /links/x/partitions`, and
//! `failover --dry-run` / `--max-delay` / `--force` through the CLI and the
//! admin API.

mod support;

use std::process::{Command, Output};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use serde_json::Value;

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::http;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{proxy_bin, ProxyProcess};
use support::tools;
use support::wire::{partition_result, record_batch, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const LOCAL_CLIENT: &str = "local-app";
const NONE: i16 = 0;
const POLICY_VIOLATION: i16 = 44;
/// `record_batch` stamps its records 1_700_000_000_000 + i (CreateTime).
const BATCH_TIME_MS: i64 = 1_700_000_000_000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// One admin request; returns (status code, JSON body).
fn admin(proxy: &ProxyProcess, method: &str, path: &str) -> Result<(u16, Value)> {
    let answer = http::request(&proxy.admin, method, path, "", "", Duration::from_secs(120))?;
    // A route the binary does not have answers 404 with no JSON body.
    let json = answer
        .json()
        .unwrap_or_else(|_| Value::String(answer.body.clone()));
    Ok((answer.code()?, json))
}

/// A sample of `/metrics` as a float (`None`: absent).
fn sample(proxy: &ProxyProcess, name: &str) -> Result<Option<f64>> {
    let (_, body) = proxy.admin_get("/metrics")?;
    Ok(body.lines().find_map(|l| {
        l.strip_prefix(name)
            .filter(|rest| rest.starts_with(' '))
            .and_then(|rest| rest.trim().parse().ok())
    }))
}

/// `record_batch` with the LogAppendTime bit set in its attributes (and the
/// CRC made right again): a batch whose timestamps are not the producer's.
fn log_append_time_batch(values: &[&str]) -> Bytes {
    // The v2 batch layout (KIP-98), written here rather than taken from
    // the crate: attributes at 21, the CRC at 17, covering from 21 on.
    const ATTRIBUTES_OFFSET: usize = 21;
    const CRC_OFFSET: usize = 17;
    const CRC_START: usize = 21;
    let mut b = record_batch(-1, values).to_vec();
    b[ATTRIBUTES_OFFSET + 1] |= 0x08;
    let crc = kafka_mirror_proxy::wire::crc32c::checksum(&b[CRC_START..]);
    b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    Bytes::from(b)
}

fn link_produce(p: &ProxyProcess, partition: i32, batch: Bytes) -> Result<(i16, Option<String>)> {
    let mut raw = RawClient::connect(&p.bootstrap)?;
    Ok(partition_result(&raw.produce(
        LINK_CLIENT,
        "m",
        partition,
        batch,
    )?))
}

fn proxy(broker: &KafkaCluster) -> Result<ProxyProcess> {
    let source = ClusterId::from_bytes(*b"metrics-source!!");
    ProxyProcess::with_link_x(&broker.bootstrap(), &source, "m", &[])
}

#[test]
fn link_writes_are_counted_with_their_delay_per_link_and_per_partition() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 3)])?;
    let p = proxy(&broker)?;
    let logs = |p: &ProxyProcess| tools::tail_str(&p.logs(), 40);

    // m-0: an idempotent producer's batch of 3 records; m-1: a producer
    // without an id, 2 records; m-2: one LogAppendTime batch. All CreateTime
    // stamps of `record_batch` are from November 2023.
    let idempotent = record_batch(7, &["a", "b", "c"]);
    let plain = record_batch(-1, &["d", "e"]);
    let lat = log_append_time_batch(&["f"]);
    let before = now_ms();
    for (partition, batch) in [(0, &idempotent), (1, &plain), (2, &lat)] {
        let r = link_produce(&p, partition, batch.clone())?;
        ensure!(
            r.0 == NONE,
            "link write to m-{partition}: {r:?}\n{}",
            logs(&p)
        );
    }
    let after = now_ms();

    let total = |name: &str| sample(&p, &format!("kafka_mirror_proxy_{name}{{link=\"x\"}}"));
    assert_eq!(total("mirror_records_total")?, Some(6.0));
    assert_eq!(total("mirror_batches_total")?, Some(3.0));
    let bytes = (idempotent.len() + plain.len() + lat.len()) as f64;
    assert_eq!(total("mirror_bytes_total")?, Some(bytes));
    // The delay: at least the age of the newest CreateTime record when it
    // was written; the LogAppendTime batch (stamped the same) observed
    // nothing: two writes in the histogram, not three.
    let newest = BATCH_TIME_MS + 2;
    let max = total("mirror_replication_delay_max_seconds")?.context("no delay gauge")?;
    ensure!(
        max >= (before - newest) as f64 / 1000.0 && max <= (after - BATCH_TIME_MS) as f64 / 1000.0,
        "delay gauge {max} s, expected the age of {newest} ms between {before} and {after}"
    );
    assert_eq!(
        total("mirror_replication_delay_seconds_count")?,
        Some(2.0),
        "CreateTime writes observed"
    );

    // Per partition: offsets, timestamps, producers, no Prometheus labels.
    let (code, doc) = admin(&p, "GET", "/links/x/partitions")?;
    assert_eq!(code, 200, "{doc}");
    let parts = doc["partitions"].as_array().context("partitions")?;
    assert_eq!(parts.len(), 3, "{doc:#}");
    let part = |i: usize| &parts[i];
    assert_eq!(part(0)["topic"], "m");
    assert_eq!(part(0)["partition"], 0);
    assert_eq!(part(0)["last_offset"], 2, "{doc:#}");
    assert_eq!(part(0)["last_timestamp_ms"], newest, "{doc:#}");
    assert_eq!(part(0)["records"], 3);
    assert_eq!(part(0)["batches"], 1);
    assert_eq!(part(0)["bytes"], idempotent.len());
    assert_eq!(part(0)["producers"], 1, "the idempotent producer: {doc:#}");
    assert_eq!(part(0)["duplicates_answered"], 0);
    let delay0 = part(0)["delay_seconds"].as_f64().context("m-0 delay")?;
    ensure!(delay0 >= (before - newest) as f64 / 1000.0, "{doc:#}");
    assert_eq!(part(1)["last_offset"], 1, "{doc:#}");
    assert_eq!(part(1)["producers"], 0, "no producer id: {doc:#}");
    assert_eq!(part(1)["last_timestamp_ms"], BATCH_TIME_MS + 1);
    assert_eq!(part(2)["last_offset"], 0, "{doc:#}");
    assert_eq!(part(2)["records"], 1);
    assert_eq!(part(2)["last_timestamp_ms"], Value::Null, "{doc:#}");
    assert_eq!(part(2)["delay_seconds"], Value::Null, "{doc:#}");
    ensure!(
        part(2)["last_mirrored_ms"]
            .as_i64()
            .is_some_and(|t| t >= before && t <= now_ms()),
        "{doc:#}"
    );
    let (_, metrics) = p.admin_get("/metrics")?;
    assert!(
        !metrics.contains("partition=\""),
        "no per-partition Prometheus label"
    );

    // A retry of m-0's batch is a duplicate: answered, counted for its
    // partition, not mirrored again.
    let r = link_produce(&p, 0, idempotent.clone())?;
    assert_eq!(r.0, NONE, "{r:?}");
    let (_, doc) = admin(&p, "GET", "/links/x/partitions")?;
    assert_eq!(doc["partitions"][0]["duplicates_answered"], 1, "{doc:#}");
    assert_eq!(doc["partitions"][0]["records"], 3, "{doc:#}");
    assert_eq!(total("mirror_records_total")?, Some(6.0));

    // An unknown link has no partitions to show.
    let (code, e) = admin(&p, "GET", "/links/nope/partitions")?;
    assert_eq!(code, 404, "{e}");
    Ok(())
}

/// The CLI against `p`'s admin API.
fn cli(p: &ProxyProcess, args: &[&str]) -> Output {
    let mut cmd = Command::new(proxy_bin());
    cmd.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("MIRROR_PROXY_") {
            cmd.env_remove(k);
        }
    }
    cmd.env("MIRROR_PROXY_ADMIN_URL", format!("http://{}", p.admin));
    cmd.output()
        .unwrap_or_else(|e| panic!("running {} {args:?}: {e}", proxy_bin()))
}

fn out_text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Nothing changed: the link MIRRORING with no failover, its topic
/// read-only, the link's writes accepted.
fn unchanged(p: &ProxyProcess, partition: i32, sequence: i32) -> Result<()> {
    let (code, x) = admin(p, "GET", "/links/x")?;
    assert_eq!(code, 200, "{x}");
    assert_eq!(x["state"], "MIRRORING", "{x:#}");
    assert_eq!(x["failover"], Value::Null, "{x:#}");
    assert_eq!(
        p.metric("kafka_mirror_proxy_failovers_total{link=\"x\"}")?,
        0
    );
    let batch = support::wire::record_batch_at(7, sequence, &["later"]);
    let r = link_produce(p, partition, batch)?;
    assert_eq!(r.0, NONE, "link write after: {r:?}");
    let mut raw = RawClient::connect(&p.bootstrap)?;
    let r = partition_result(&raw.produce(LOCAL_CLIENT, "m", 1, record_batch(-1, &["l"]))?);
    assert_eq!(r.0, POLICY_VIOLATION, "local write still refused: {r:?}");
    Ok(())
}

#[test]
fn failover_dry_run_changes_nothing_and_max_delay_refuses_unless_forced() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 2)])?;
    let p = proxy(&broker)?;
    // m-0 mirrored with records from November 2023: years of delay.
    let before = now_ms();
    let r = link_produce(&p, 0, record_batch(7, &["old"]))?;
    ensure!(r.0 == NONE, "{r:?}");
    let age = (before - BATCH_TIME_MS) as f64 / 1000.0;

    // The API's dry run: what would happen, with the delays. Until the
    // instance group has answered once, `live_instances` holds the error
    // (a loaded machine can take seconds): ask again, for up to 30 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (code, d) = loop {
        let (code, d) = admin(&p, "GET", "/links/x/failover?max_delay=60")?;
        if code != 200 || d["live_instances"].is_array() || std::time::Instant::now() > deadline {
            break (code, d);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["dry_run"], true);
    assert_eq!(d["state"], "MIRRORING");
    assert_eq!(d["action"], "start", "{d:#}");
    assert_eq!(d["would_proceed"], false, "held back by max_delay: {d:#}");
    assert_eq!(d["partitions_total"], 2, "{d:#}");
    assert_eq!(d["partitions_without_delay"], 1, "{d:#}");
    let live = d["live_instances"]
        .as_array()
        .with_context(|| format!("live instances: {d:#}"))?;
    assert_eq!(live.len(), 1, "this instance: {d:#}");
    let d0 = d["partitions"][0]["delay_seconds"]
        .as_f64()
        .context("m-0")?;
    ensure!(d0 >= age, "m-0 delay {d0} < {age}: {d:#}");
    assert_eq!(d["partitions"][1]["delay_seconds"], Value::Null);
    assert_eq!(d["over_max_delay"][0]["topic"], "m", "{d:#}");
    assert_eq!(d["over_max_delay"][0]["partition"], 0, "{d:#}");
    unchanged(&p, 0, 1)?;

    // The CLI's dry run: exit 0 without a threshold, 3 above one.
    let o = cli(&p, &["failover", "x", "--dry-run"]);
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("would start a new failover"),
        "{}",
        out_text(&o)
    );
    assert!(text.contains("DELAY(S)"), "{}", out_text(&o));
    let o = cli(&p, &["failover", "x", "--dry-run", "--max-delay", "60"]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("held back"),
        "{}",
        out_text(&o)
    );
    unchanged(&p, 0, 2)?;

    // --max-delay refuses (412), naming the partition and its delay.
    let o = cli(&p, &["failover", "x", "--max-delay", "60"]);
    assert_eq!(o.status.code(), Some(3), "{}", out_text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("412") && err.contains("m-0 (") && err.contains("--force"),
        "{}",
        out_text(&o)
    );
    let (code, e) = admin(&p, "POST", "/links/x/failover?max_delay=60")?;
    assert_eq!(code, 412, "{e}");
    assert!(
        e["error"].as_str().is_some_and(|m| m.contains("m-0 (")),
        "{e}"
    );
    unchanged(&p, 0, 3)?;
    // A threshold above every delay does not hold it back (dry run).
    let (_, d) = admin(&p, "GET", "/links/x/failover?max_delay=1e12")?;
    assert_eq!(d["would_proceed"], true, "{d:#}");
    let (code, e) = admin(&p, "POST", "/links/x/failover?max_delay=soon")?;
    assert_eq!(code, 400, "{e}");
    // A POST is never taken for a dry run.
    let (code, e) = admin(&p, "POST", "/links/x/failover?dry_run=true")?;
    assert_eq!(code, 400, "{e}");
    unchanged(&p, 0, 4)?;

    // --force proceeds: the failover runs to STOPPED.
    let o = cli(
        &p,
        &[
            "failover",
            "x",
            "--max-delay",
            "60",
            "--force",
            "--wait",
            "120",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{}", out_text(&o));
    let (_, x) = admin(&p, "GET", "/links/x")?;
    assert_eq!(x["state"], "STOPPED", "{x:#}");
    // Once STOPPED, a dry run says a failover would be refused.
    let (code, d) = admin(&p, "GET", "/links/x/failover")?;
    assert_eq!(code, 200, "{d}");
    assert_eq!(d["action"], "refuse", "{d:#}");
    assert_eq!(d["would_proceed"], false, "{d:#}");
    Ok(())
}
