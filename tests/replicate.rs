//! `kafka-mirror-proxy replicate` as an operator runs it: the binary,
//! between a real source broker and a proxy in front of a real
//! destination broker, configured by flags and `MIRROR_REPLICATOR_*`
//! variables.
//!
//! One pair of clusters, in phases:
//! 1. the link's pattern (`orders\..*`) matches a source topic the
//!    destination lacks: the replicator creates it with the source's
//!    partition count and its replicated configs (and not the others), and
//!    copies its records;
//! 2. a new source topic, partitions added to the first one, and a config
//!    changed on the source are followed within a few discovery intervals;
//! 3. the metrics move (records, topics created, partitions added, configs
//!    altered, lag back to 0), `/healthz` and `/readyz` answer 200;
//! 4. SIGTERM: the replicator stops with exit code 0, and its progress on
//!    the destination is the source's end in every partition;
//! 5. started again, it copies what was written meanwhile and nothing
//!    twice; the link is failed over on the proxy: the replicator stops on
//!    its own with exit code 3 and a message naming the link.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use kafka_mirror_proxy::client::protocol::OffsetSpec;
use support::crate_client::{create_topic, end_offsets, runtime};
use support::http;
use support::kafka::KafkaCluster;
use support::replicator::{clusters, link_a_proxy, replicator_command, Replicator};

const WAIT: Duration = Duration::from_secs(90);
const GROUP: &str = "replicator.mirror-a";

/// A sample's value in a Prometheus text exposition (`None`: absent).
fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)
            .and_then(|rest| rest.trim().parse().ok())
    })
}

impl Replicator {
    fn start(source: &str, proxy: &str, dir: &Path, run: usize) -> Result<Replicator> {
        let mut command = replicator_command();
        command
            // Flags and variables mix: a flag wins over its variable.
            .env("MIRROR_REPLICATOR_SOURCE_BOOTSTRAP_SERVERS", source)
            .env("MIRROR_REPLICATOR_LINK", "not-this-one")
            .args(["--destination-bootstrap-servers", proxy])
            .args(["--link", "a"])
            .args(["--topics", "orders\\..*"]);
        Replicator::spawn(command, dir, run)
    }

    fn log(&self) -> String {
        self.p.log_tail()
    }

    fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.p.wait_exit(timeout)
    }

    fn signal(&self, name: &str) -> Result<()> {
        self.p.signal(name)
    }
}

fn producer(source: &KafkaCluster) -> Result<BaseProducer> {
    let mut c = RdConfig::new();
    c.set("bootstrap.servers", source.bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5");
    Ok(c.create()?)
}

/// `n` records to each listed partition of `topic`.
fn write(p: &BaseProducer, topic: &str, partitions: &[i32], n: usize, tag: &str) -> Result<()> {
    for i in 0..n {
        for &partition in partitions {
            let v = format!("{tag}-{partition}-{i}");
            p.send(
                BaseRecord::<(), _>::to(topic)
                    .partition(partition)
                    .payload(&v),
            )
            .map_err(|(e, _)| anyhow::anyhow!("queueing {v}: {e}"))?;
        }
    }
    p.flush(WAIT)?;
    Ok(())
}

/// Waits until `f` holds, failing with `what` and the replicator's log.
fn until(what: &str, r: &mut Replicator, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        if f().unwrap_or(false) {
            return Ok(());
        }
        r.p.still_waiting(what, deadline)?;
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_replicator_follows_the_source_and_stops_when_fenced() -> Result<()> {
    let rt = runtime()?;
    let (source, destination, src, dst) = clusters()?;
    let proxy = link_a_proxy(&source, &destination, "orders\\..*")?;
    let dir = tempfile::tempdir()?;

    // 1. A topic the destination lacks, with configs of its own.
    create_topic(
        &rt,
        &src,
        "orders.one",
        2,
        &[
            ("retention.ms", "86400000"),
            ("max.message.bytes", "2097152"),
            ("message.timestamp.type", "CreateTime"),
            // The destination's own durability: not copied.
            ("min.insync.replicas", "1"),
        ],
    )?;
    create_topic(&rt, &src, "other", 1, &[])?;
    let p = producer(&source)?;
    write(&p, "orders.one", &[0, 1], 200, "first")?;
    write(&p, "other", &[0], 10, "not-copied")?;

    let mut r = Replicator::start(&source.bootstrap(), &proxy.bootstrap, dir.path(), 0)?;
    until("orders.one copied", &mut r, || {
        Ok(end_offsets(&rt, &dst, "orders.one", 2)? == end_offsets(&rt, &src, "orders.one", 2)?)
    })?;
    let src_overrides = rt.block_on(src.topic_overrides("orders.one"))?;
    let dst_overrides = rt.block_on(dst.topic_overrides("orders.one"))?;
    for key in [
        "retention.ms",
        "max.message.bytes",
        "message.timestamp.type",
    ] {
        assert_eq!(
            dst_overrides.get(key),
            src_overrides.get(key),
            "{key}: created with the source's value"
        );
    }
    assert_eq!(
        dst_overrides.get("min.insync.replicas"),
        None,
        "not a replicated config: {dst_overrides:?}"
    );
    let dst_topics = rt.block_on(dst.metadata(None))?;
    assert!(
        dst_topics.topics.iter().all(|t| t.name != "other"),
        "a topic the pattern does not match was created"
    );

    // 2. A new topic, partitions added, a config changed.
    create_topic(&rt, &src, "orders.two", 1, &[])?;
    write(&p, "orders.two", &[0], 50, "two")?;
    assert!(rt.block_on(src.create_partitions("orders.one", 3))?);
    // A new producer: it learns of partition 2 in its first metadata.
    let p = producer(&source)?;
    write(&p, "orders.one", &[2], 30, "added")?;
    rt.block_on(src.alter_topic_configs(
        "orders.one",
        &[kafka_mirror_proxy::client::topics::ConfigChange::Set(
            "retention.ms".into(),
            "172800000".into(),
        )],
    ))?;
    until("orders.two created and copied", &mut r, || {
        Ok(end_offsets(&rt, &dst, "orders.two", 1)? == vec![50])
    })?;
    until("the added partition copied", &mut r, || {
        Ok(end_offsets(&rt, &dst, "orders.one", 3)?.get(2) == Some(&30))
    })?;
    until("retention.ms follows the source", &mut r, || {
        Ok(rt
            .block_on(dst.topic_overrides("orders.one"))?
            .get("retention.ms")
            .map(String::as_str)
            == Some("172800000"))
    })?;

    // 3. Metrics and health.
    let m = r.metrics()?;
    let series = |name: &str| format!("kafka_mirror_replicator_{name}");
    let copied = sample(
        &m,
        &series("records_copied_total{link=\"a\",topic=\"orders.one\"}"),
    );
    assert_eq!(copied, Some(430.0), "records of orders.one: {m}");
    assert_eq!(
        sample(&m, &series("topics_created_total{link=\"a\"}")),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        sample(&m, &series("partitions_added_total{link=\"a\"}")),
        Some(1.0),
        "{m}"
    );
    assert!(
        sample(&m, &series("configs_altered_total{link=\"a\"}")) >= Some(1.0),
        "{m}"
    );
    assert_eq!(sample(&m, &series("fenced{link=\"a\"}")), Some(0.0), "{m}");
    assert!(
        m.contains("kafka_mirror_replicator_errors_total{link=\"a\",kind=\"produce\"}"),
        "error series present before any error: {m}"
    );
    let admin = r.admin.clone();
    until("lag back to 0", &mut r, || {
        let m = http::get(&admin, "/metrics")?.body;
        Ok(sample(
            &m,
            &series("partition_lag_records{link=\"a\",topic=\"orders.one\",partition=\"2\"}"),
        ) == Some(0.0))
    })?;
    assert_eq!(http::get(&r.admin, "/healthz")?.code()?, 200);
    assert_eq!(http::get(&r.admin, "/readyz")?.code()?, 200);

    // 4. A clean stop commits what the destination acknowledged.
    r.signal("TERM")?;
    let status = r.wait_exit(WAIT)?;
    assert_eq!(status.code(), Some(0), "SIGTERM: {}", r.log());
    let parts: Vec<(String, i32)> = (0..3)
        .map(|p| ("orders.one".to_string(), p))
        .chain([("orders.two".to_string(), 0)])
        .collect();
    let committed = rt.block_on(dst.committed_offsets(GROUP, &parts))?;
    let mut source_ends = BTreeMap::new();
    for (t, p) in &parts {
        source_ends.insert(
            (t.clone(), *p),
            rt.block_on(src.list_offset(t, *p, OffsetSpec::Latest))?
                .offset,
        );
    }
    assert_eq!(committed, source_ends, "progress at the stop");

    // 5. Started again: only what is new; then fenced.
    write(&p, "orders.one", &[0, 1, 2], 20, "second")?;
    let before = end_offsets(&rt, &dst, "orders.one", 3)?;
    let mut r = Replicator::start(&source.bootstrap(), &proxy.bootstrap, dir.path(), 1)?;
    until("the second run copied", &mut r, || {
        Ok(end_offsets(&rt, &dst, "orders.one", 3)? == end_offsets(&rt, &src, "orders.one", 3)?)
    })?;
    let after = end_offsets(&rt, &dst, "orders.one", 3)?;
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(
            a - b,
            20,
            "exactly the new records: {before:?} -> {after:?}"
        );
    }
    let (status, body) = proxy.admin_post("/links/a/failover", "")?;
    ensure!(status.contains("200"), "failover: {status} {body}");
    // Something to send, so that the proxy tells the replicator.
    write(&p, "orders.one", &[0], 5, "after-failover")?;
    let status = r.wait_exit(WAIT)?;
    let log = std::fs::read_to_string(&r.p.log)?;
    assert_eq!(
        status.code(),
        Some(3),
        "fenced exit code; log:\n{}",
        r.log()
    );
    assert!(
        log.contains("fenced") && log.contains("'a'"),
        "the message names the fenced link:\n{}",
        r.log()
    );
    Ok(())
}
