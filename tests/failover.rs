//! Link control (issue 10) against a real broker, through the proxy binary:
//! read-only mirrored topics while MIRRORING (a raw local Produce and
//! Kafka's console producer refused with the message), a failover through
//! the admin API with per-partition barrier results, the link's connection
//! closed and its reconnect refused with PRODUCER_FENCED, local writes
//! accepted after; the state restored after a restart; start; the admin
//! API's 404/409 and JSON shape; INITIAL_STATE honoured only while the state
//! topic has no record of the link.

mod support;

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::http;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{partition_result, record_batch, RawClient};

const LINK_CLIENT: &str = "mirror-x";
const LOCAL_CLIENT: &str = "local-app";
const NONE: i16 = 0;
const POLICY_VIOLATION: i16 = 44;
const INVALID_RECORD: i16 = 87;
const PRODUCER_FENCED: i16 = 90;

/// One admin request; returns (status code, JSON body).
fn admin(proxy: &ProxyProcess, method: &str, path: &str, body: &str) -> Result<(u16, Value)> {
    let answer = http::request(
        &proxy.admin,
        method,
        path,
        "",
        body,
        Duration::from_secs(120),
    )?;
    Ok((answer.code()?, answer.json()?))
}

fn produce(
    proxy: &ProxyProcess,
    client: &str,
    topic: &str,
    partition: i32,
) -> Result<(i16, Option<String>)> {
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    let pid = if client == LINK_CLIENT { 7 } else { -1 };
    let r = raw.produce(client, topic, partition, record_batch(pid, &["v"]))?;
    Ok(partition_result(&r))
}

fn proxy(broker: &KafkaCluster, extra: &[(&str, &str)]) -> Result<ProxyProcess> {
    let source = ClusterId::from_bytes(*b"failover-source!");
    ProxyProcess::with_link_x(&broker.bootstrap(), &source, "m", extra)
}

#[test]
fn read_only_until_failover_then_fenced_and_restored_after_restart() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 3), ("plain", 1)])?;
    let p = proxy(&broker, &[])?;
    let logs = |p: &ProxyProcess| tools::tail_str(&p.logs(), 40);

    // The API's shape, 404 and 409.
    let (code, all) = admin(&p, "GET", "/links", "")?;
    assert_eq!(code, 200, "{all}");
    let x = &all["links"][0];
    assert_eq!(x["name"], "x");
    assert_eq!(x["state"], "MIRRORING");
    assert_eq!(x["failover"], Value::Null);
    assert!(x["counters"].is_object(), "{x}");
    let (code, e) = admin(&p, "GET", "/links/nope", "")?;
    assert_eq!(code, 404, "{e}");
    assert!(
        e["error"].as_str().is_some_and(|m| m.contains("nope")),
        "{e}"
    );
    let (code, e) = admin(&p, "POST", "/links/x/start", "")?;
    assert_eq!(code, 409, "{e}");
    assert!(
        e["error"].as_str().is_some_and(|m| m.contains("MIRRORING")),
        "{e}"
    );

    // MIRRORING: the link writes, a local producer may not; other topics
    // are untouched.
    let mut link_conn = RawClient::connect(&p.bootstrap)?;
    let r = partition_result(&link_conn.produce(LINK_CLIENT, "m", 0, record_batch(7, &["a"]))?);
    ensure!(r.0 == NONE, "link produce: {r:?}\n{}", logs(&p));
    let (code, message) = produce(&p, LOCAL_CLIENT, "m", 1)?;
    assert_eq!(code, POLICY_VIOLATION, "{message:?}");
    let message = message.unwrap_or_default();
    assert!(
        message.contains("link 'x'") && message.contains("/links/x/failover"),
        "{message}"
    );
    assert_eq!(produce(&p, LOCAL_CLIENT, "plain", 0)?.0, NONE);
    let console = tools::console_produce(&p.bootstrap, "m", &["refused".to_string()], &[]);
    let e = format!(
        "{:#}",
        console
            .err()
            .context("the console producer was not refused")?
    );
    assert!(e.contains("read-only mirror of link 'x'"), "{e}");
    ensure!(
        p.metric("kafka_mirror_proxy_local_writes_refused_total{link=\"x\"}")? >= 2,
        "refusals counted"
    );

    // Failover: every partition's barrier, refused by the stock broker.
    let (code, f) = admin(&p, "POST", "/links/x/failover?wait=90", "")?;
    ensure!(code == 200, "failover answered {code}: {f:#}\n{}", logs(&p));
    assert_eq!(f["state"], "STOPPED", "{f:#}");
    let fo = &f["failover"];
    assert_eq!(fo["complete"], true, "{fo:#}");
    assert_eq!(fo["partitions_total"], 3);
    assert_eq!(fo["partitions_done"], 3);
    assert!(fo["finished_ms"].as_i64().is_some_and(|t| t > 0), "{fo:#}");
    assert_eq!(fo["unconfirmed_instances"], Value::Array(vec![]));
    for (i, part) in fo["partitions"]
        .as_array()
        .context("partitions")?
        .iter()
        .enumerate()
    {
        assert_eq!(part["topic"], "m", "{part}");
        assert_eq!(part["partition"], i as i64, "{part}");
        assert_eq!(part["result"], "refused", "{part}");
        assert_eq!(part["error_code"], INVALID_RECORD, "{part}");
        assert!(
            part["log_end_offset"].as_i64().is_some_and(|o| o >= 0),
            "{part}"
        );
    }
    // Partition 0 holds the link's one record: nothing lands past it.
    assert_eq!(fo["partitions"][0]["log_end_offset"], 1);

    // The link's open connection was closed; a reconnect is refused.
    assert!(
        link_conn.closed_by_peer(),
        "the link connection stayed open"
    );
    let mut again = RawClient::connect(&p.bootstrap)?;
    // A reconnecting client negotiates first: ApiVersions is answered, so
    // that its Produce can be told it is fenced.
    again.send(
        kafka_protocol::messages::ApiKey::ApiVersions,
        0,
        LINK_CLIENT,
        &kafka_protocol::messages::ApiVersionsRequest::default(),
    )?;
    assert!(
        again.recv_frame()?.is_some(),
        "a fenced link's ApiVersions was not answered"
    );
    let r = partition_result(&again.produce(LINK_CLIENT, "m", 0, record_batch(7, &["b"]))?);
    assert_eq!(r.0, PRODUCER_FENCED, "{r:?}");
    assert!(
        r.1.as_deref().is_some_and(|m| m.contains("STOPPED")),
        "{r:?}"
    );
    assert!(
        again.closed_by_peer(),
        "the refused link connection stayed open"
    );

    // STOPPED: local writes accepted.
    assert_eq!(produce(&p, LOCAL_CLIENT, "m", 1)?.0, NONE);
    assert_eq!(p.metric("kafka_mirror_proxy_link_state{link=\"x\"}")?, 2);
    assert_eq!(
        p.metric("kafka_mirror_proxy_failover_barriers_total{result=\"refused\"}")?,
        3
    );
    // Both link connections were closed by fencing (the open one and the
    // reconnect), not by a read timeout of the test.
    assert_eq!(
        p.metric("kafka_mirror_proxy_link_connections_fenced_total{link=\"x\"}")?,
        2
    );
    let (code, e) = admin(&p, "POST", "/links/x/failover", "")?;
    assert_eq!(code, 409, "{e}");
    assert!(
        e["error"]
            .as_str()
            .is_some_and(|m| m.contains("already STOPPED")),
        "{e}"
    );

    // Restart: the state comes back from the state topic.
    drop(p);
    let p = proxy(&broker, &[])?;
    let (code, x) = admin(&p, "GET", "/links/x", "")?;
    assert_eq!(code, 200, "{x}");
    assert_eq!(x["state"], "STOPPED", "{x:#}");
    assert_eq!(x["failover"]["partitions_total"], 3, "{x:#}");
    assert_eq!(produce(&p, LOCAL_CLIENT, "m", 2)?.0, NONE);
    assert_eq!(produce(&p, LINK_CLIENT, "m", 2)?.0, PRODUCER_FENCED);

    // Start: MIRRORING again, read-only again, the link writes again.
    let (code, x) = admin(&p, "POST", "/links/x/start", "")?;
    assert_eq!(code, 200, "{x}");
    assert_eq!(x["state"], "MIRRORING");
    assert_eq!(produce(&p, LOCAL_CLIENT, "m", 2)?.0, POLICY_VIOLATION);
    let r = produce(&p, LINK_CLIENT, "m", 2)?;
    assert_eq!(r.0, NONE, "{r:?}\n{}", logs(&p));
    Ok(())
}

#[test]
fn initial_state_applies_only_while_the_topic_has_no_record() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let stopped = [("LINK_X_INITIAL_STATE", "STOPPED")];
    let p = proxy(&broker, &stopped)?;
    let (_, x) = admin(&p, "GET", "/links/x", "")?;
    assert_eq!(x["state"], "STOPPED", "{x}");
    assert_eq!(
        produce(&p, LOCAL_CLIENT, "m", 0)?.0,
        NONE,
        "STOPPED: local writes"
    );
    assert_eq!(produce(&p, LINK_CLIENT, "m", 0)?.0, PRODUCER_FENCED);
    // A bad body is a 400; a new source cluster id is taken.
    let (code, e) = admin(
        &p,
        "POST",
        "/links/x/start",
        "{\"source_cluster_id\": \"short\"}",
    )?;
    assert_eq!(code, 400, "{e}");
    let other = ClusterId::from_bytes(*b"another-source!!").to_string();
    let body = format!("{{\"source_cluster_id\": \"{other}\"}}");
    let (code, x) = admin(&p, "POST", "/links/x/start", &body)?;
    assert_eq!(code, 200, "{x}");
    assert_eq!(x["source_cluster_id"], other.as_str());
    drop(p);

    // The record written by start wins over INITIAL_STATE from now on.
    let p = proxy(&broker, &stopped)?;
    let (_, x) = admin(&p, "GET", "/links/x", "")?;
    assert_eq!(x["state"], "MIRRORING", "{x}");
    assert_eq!(x["source_cluster_id"], other.as_str());
    assert_eq!(produce(&p, LOCAL_CLIENT, "m", 0)?.0, POLICY_VIOLATION);
    drop(p);

    // A link found STOPPING at start-up (as after a proxy killed during a
    // failover; here from INITIAL_STATE on a fresh state topic) has its
    // failover run to the end without anyone asking.
    let p = proxy(
        &broker,
        &[
            ("LINK_X_INITIAL_STATE", "STOPPING"),
            ("STATE_TOPIC", "__mirror_state_resume"),
        ],
    )?;
    let mut p = p;
    p.wait_for_log("failover complete", Duration::from_secs(90))
        .with_context(|| tools::tail_str(&p.logs(), 40))?;
    let (_, x) = admin(&p, "GET", "/links/x", "")?;
    assert_eq!(x["state"], "STOPPED", "{x:#}");
    let fo = &x["failover"];
    assert_eq!(fo["partitions_total"], 1, "{fo:#}");
    assert_eq!(fo["partitions"][0]["result"], "refused", "{fo:#}");
    assert_eq!(fo["partitions"][0]["error_code"], INVALID_RECORD, "{fo:#}");
    // Started again and failed over with no wait: 202 with the progress.
    let (code, x) = admin(&p, "POST", "/links/x/start", "")?;
    assert_eq!(code, 200, "{x}");
    let (code, x) = admin(&p, "POST", "/links/x/failover?wait=0", "")?;
    assert_eq!(code, 202, "{x:#}");
    assert_eq!(x["state"], "STOPPING", "{x:#}");
    assert_eq!(x["failover"]["complete"], false, "{x:#}");
    Ok(())
}

/// `GET /links/x` on `p` until its state is `state` (bounded: 30 s).
fn wait_state(p: &ProxyProcess, state: &str) -> Result<Value> {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (_, x) = admin(p, "GET", "/links/x", "")?;
        if x["state"] == state {
            return Ok(x);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "link never became {state}: {x:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_failover_on_one_instance_fences_the_link_on_another() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 2)])?;
    let a = proxy(&broker, &[])?;
    let b = proxy(&broker, &[])?;
    // The replicator writes through B; local producers are refused on both.
    let mut link_conn = RawClient::connect(&b.bootstrap)?;
    let r = partition_result(&link_conn.produce(LINK_CLIENT, "m", 0, record_batch(7, &["a"]))?);
    ensure!(r.0 == NONE, "link produce on B: {r:?}");
    assert_eq!(produce(&a, LOCAL_CLIENT, "m", 1)?.0, POLICY_VIOLATION);
    assert_eq!(produce(&b, LOCAL_CLIENT, "m", 1)?.0, POLICY_VIOLATION);

    let (code, f) = admin(&a, "POST", "/links/x/failover?wait=90", "")?;
    ensure!(code == 200, "failover on A answered {code}: {f:#}");
    // B follows the state topic: STOPPED there too, with the barriers A
    // recorded, its link connection closed and a reconnect refused.
    let x = wait_state(&b, "STOPPED")?;
    assert_eq!(x["failover"]["id"], f["failover"]["id"], "{x:#}");
    let parts = x["failover"]["partitions"]
        .as_array()
        .context("partitions")?;
    assert_eq!(parts.len(), 2, "{x:#}");
    for p in parts {
        assert_eq!(p["result"], "refused", "{p}");
        assert_eq!(p["error_code"], INVALID_RECORD, "{p}");
    }
    assert!(
        link_conn.closed_by_peer(),
        "B kept the link connection open"
    );
    assert_eq!(produce(&b, LINK_CLIENT, "m", 0)?.0, PRODUCER_FENCED);
    assert_eq!(
        b.metric("kafka_mirror_proxy_link_connections_fenced_total{link=\"x\"}")?,
        2,
        "both of B's link connections were closed by fencing"
    );
    assert_eq!(produce(&b, LOCAL_CLIENT, "m", 1)?.0, NONE);
    Ok(())
}

#[test]
fn a_failover_killed_midway_finishes_after_a_restart() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 50)])?;
    let mut p = proxy(&broker, &[])?;
    let (code, started) = admin(&p, "POST", "/links/x/failover?wait=0", "")?;
    assert_eq!(code, 202, "{started:#}");
    // Killed once the first barrier is recorded (SIGKILL: nothing finishes).
    p.wait_for_log(
        "failover barrier placed and recorded",
        Duration::from_secs(60),
    )?;
    p.signal("KILL")?;
    p.wait_exit(Duration::from_secs(10))?;
    // Lines still in the pipe may be missed: an undercount only loosens
    // the bound below.
    let placed_before = p
        .logs()
        .matches("failover barrier placed and recorded")
        .count();
    drop(p);
    ensure!(placed_before < 50, "the whole failover ran before the kill");

    // The restarted proxy finds the link STOPPING and finishes the same
    // failover: every partition recorded, those done before not placed again.
    let mut p = proxy(&broker, &[])?;
    p.wait_for_log("failover complete", Duration::from_secs(120))
        .with_context(|| tools::tail_str(&p.logs(), 40))?;
    let (_, x) = admin(&p, "GET", "/links/x", "")?;
    assert_eq!(x["state"], "STOPPED", "{x:#}");
    let fo = &x["failover"];
    assert_eq!(fo["id"], started["failover"]["id"], "the same failover");
    assert_eq!(fo["partitions_total"], 50, "{fo:#}");
    assert_eq!(fo["partitions_done"], 50, "{fo:#}");
    for part in fo["partitions"].as_array().context("partitions")? {
        assert_eq!(part["result"], "refused", "{part}");
        assert_eq!(part["error_code"], INVALID_RECORD, "{part}");
    }
    let placed_after = p
        .logs()
        .matches("failover barrier placed and recorded")
        .count();
    assert!(
        placed_after >= 1 && placed_before + placed_after <= 50,
        "the barriers recorded before the kill were not placed again: {placed_before} before, {placed_after} after"
    );
    Ok(())
}

/// Issue 26 item 7: `start` with a new source cluster id maps that
/// source's producers into its own region, on every restart too; failing
/// back to the first source maps its producers as before. The same source
/// PID (7) from two clusters never shares a mapped PID (mapped with the
/// configured source, all four batches went out under one mapped PID).
#[test]
fn start_with_a_new_source_maps_its_producers_apart_from_the_old_ones() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let first = ClusterId::from_bytes(*b"failover-source!");
    let second = ClusterId::from_bytes(*b"another-source!!");
    let mut p = proxy(&broker, &[])?;
    let logs = |p: &ProxyProcess| tools::tail_str(&p.logs(), 40);
    let send = |p: &ProxyProcess, sequence: i32, value: &str| -> Result<()> {
        let mut link = RawClient::connect(&p.bootstrap)?;
        let batch = support::wire::record_batch_at(7, sequence, &[value]);
        let r = partition_result(&link.produce(LINK_CLIENT, "m", 0, batch)?);
        ensure!(r.0 == NONE, "link produce of {value}: {r:?}\n{}", logs(p));
        Ok(())
    };
    let fail_over = |p: &ProxyProcess| -> Result<()> {
        let (code, f) = admin(p, "POST", "/links/x/failover?wait=90", "")?;
        ensure!(code == 200, "failover answered {code}: {f:#}\n{}", logs(p));
        Ok(())
    };
    let start = |p: &ProxyProcess, source: &ClusterId| -> Result<()> {
        let body = format!("{{\"source_cluster_id\": \"{source}\"}}");
        let (code, s) = admin(p, "POST", "/links/x/start", &body)?;
        ensure!(code == 200, "start answered {code}: {s:#}\n{}", logs(p));
        ensure!(s["source_cluster_id"] == source.to_string(), "{s:#}");
        Ok(())
    };

    send(&p, 0, "first-0")?;
    fail_over(&p)?;
    start(&p, &second)?;
    send(&p, 0, "second-0")?;
    // Persisted with the link state: a restarted instance maps the same.
    drop(p);
    p = proxy(&broker, &[])?;
    send(&p, 1, "second-1")?;
    // And back to the first source, whose producer goes on where it was.
    fail_over(&p)?;
    start(&p, &first)?;
    send(&p, 1, "first-1")?;

    let mut pids: std::collections::BTreeMap<String, i64> = Default::default();
    for file in broker.segment_files("m", 0)? {
        for batch in tools::dump_log_segments(&file, true)? {
            for r in &batch.records {
                if let Some(v) = &r.payload {
                    pids.insert(v.clone(), batch.producer_id);
                }
            }
        }
    }
    let pid = |v: &str| {
        pids.get(v)
            .copied()
            .with_context(|| format!("{v} is not in the log: {pids:?}"))
    };
    ensure!(pid("first-0")? < 0, "mapped: {pids:?}");
    ensure!(
        pid("first-0")? == pid("first-1")?,
        "the first source keeps its mapping: {pids:?}"
    );
    ensure!(
        pid("second-0")? == pid("second-1")?,
        "the second source's mapping survives a restart: {pids:?}"
    );
    ensure!(
        pid("first-0")? != pid("second-0")?,
        "two origins share a mapped PID: {pids:?}"
    );
    Ok(())
}
