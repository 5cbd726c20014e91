//! The state topic under the compression settings operators use, against a
//! real broker, through the proxy binary: with `compression.type` set on
//! the broker (gzip, snappy, lz4, zstd) the proxy creates its topic with
//! `compression.type=producer` and the link works from its first batch;
//! with the codec then set on the topic itself (the brokers recompress
//! every state batch), a new producer's mapping is read back, and after a
//! restart every mapping is read from the recompressed batches.

mod support;

use std::time::Duration;

use anyhow::{ensure, Context, Result};

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, DumpedBatch};
use support::wire::{partition_result, record_batch_at, RawClient};

const STATE: &str = "__mirror_state";
const LINK_CLIENT: &str = "mirror-x";

fn proxy(broker: &KafkaCluster) -> Result<ProxyProcess> {
    let source = ClusterId::from_bytes(*b"compressed-src!!");
    ProxyProcess::with_link_x(&broker.bootstrap(), &source, "m", &[])
}

/// One link batch of `pid` at `sequence` to `m`-0; it must be accepted.
fn mirror(p: &ProxyProcess, pid: i64, sequence: i32, value: &str) -> Result<()> {
    let mut raw = RawClient::connect(&p.bootstrap)?;
    let batch = record_batch_at(pid, sequence, &[value]);
    let (code, message) = partition_result(&raw.produce(LINK_CLIENT, "m", 0, batch)?);
    ensure!(
        code == 0,
        "pid {pid} seq {sequence}: error {code} ({message:?}); proxy log:\n{}",
        tools::tail_str(&p.logs(), 30)
    );
    Ok(())
}

fn batches(broker: &KafkaCluster, topic: &str) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in broker.segment_files(topic, 0)? {
        out.extend(tools::dump_log_segments(&file, true)?);
    }
    Ok(out)
}

/// The mapped producer id of the batch holding `value` in `m`-0.
fn mapped(broker: &KafkaCluster, value: &str) -> Result<i64> {
    batches(broker, "m")?
        .iter()
        .find(|b| {
            b.records
                .iter()
                .any(|r| r.payload.as_deref() == Some(value))
        })
        .map(|b| b.producer_id)
        .with_context(|| format!("no batch holds {value}"))
}

fn set_topic_compression(broker: &KafkaCluster, codec: &str) -> Result<()> {
    let bootstrap = broker.bootstrap();
    let config = format!("compression.type={codec}");
    let out = tools::java(
        "org.apache.kafka.tools.ConfigCommand",
        &[
            "--bootstrap-server",
            &bootstrap,
            "--alter",
            "--entity-type",
            "topics",
            "--entity-name",
            STATE,
            "--add-config",
            &config,
        ],
    )?;
    ensure!(
        out.status.success(),
        "kafka-configs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

fn survives(codec: &str) -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions {
        extra_properties: vec![("compression.type".into(), codec.into())],
        ..KafkaOptions::default()
    })?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let mut p = proxy(&broker)?;

    // The broker-wide codec does not reach the proxy's own topic: its
    // first mapping is persisted, read back, and the batch acknowledged.
    mirror(&p, 1, 0, "a")?;
    let state = batches(&broker, STATE)?;
    ensure!(
        !state.is_empty() && state.iter().all(|b| b.compresscodec == "none"),
        "state batches as written: {state:?}"
    );

    // The operator sets the codec on the topic: every state batch written
    // from now on is recompressed, and the proxy reads it back.
    set_topic_compression(&broker, codec)?;
    mirror(&p, 2, 0, "b")?;
    let state = batches(&broker, STATE)?;
    ensure!(
        state.last().map(|b| b.compresscodec.as_str()) == Some(codec),
        "the newest state batch is {codec}: {state:?}"
    );

    // A restart reads every mapping back, the compressed ones too: the
    // same producers' next batches get the same mapped PIDs and nothing
    // new is persisted or skipped.
    p.signal("TERM")?;
    p.wait_exit(Duration::from_secs(30))?;
    let p = proxy(&broker)?;
    mirror(&p, 1, 1, "c")?;
    mirror(&p, 2, 1, "d")?;
    ensure!(
        mapped(&broker, "c")? == mapped(&broker, "a")?
            && mapped(&broker, "d")? == mapped(&broker, "b")?,
        "mapped PIDs changed across the restart"
    );
    ensure!(
        mapped(&broker, "a")? != mapped(&broker, "b")?,
        "two origins, one PID"
    );
    ensure!(
        p.metric("kafka_mirror_proxy_state_origins_persisted_total")? == 0,
        "an origin was persisted again after the restart"
    );
    ensure!(
        p.metric("kafka_mirror_proxy_state_records_skipped_total")? == 0,
        "state records skipped:\n{}",
        tools::tail_str(&p.logs(), 30)
    );
    let logs = p.logs();
    ensure!(
        logs.contains("recompress") && logs.contains(&format!("compression={codec}")),
        "no WARN about the topic's compression.type:\n{}",
        tools::tail_str(&logs, 30)
    );
    Ok(())
}

#[test]
fn the_state_topic_survives_gzip() -> Result<()> {
    survives("gzip")
}

#[test]
fn the_state_topic_survives_snappy() -> Result<()> {
    survives("snappy")
}

#[test]
fn the_state_topic_survives_lz4() -> Result<()> {
    survives("lz4")
}

#[test]
fn the_state_topic_survives_zstd() -> Result<()> {
    survives("zstd")
}
