//! The `__mirror_state` topic against a real broker, through the proxy
//! binary: the topic is created compacted, colliding origins get distinct
//! mapped PIDs (one salted, with its collision record in the state topic),
//! oversized PIDs and chained PIDs are resolved, a restart maps every
//! origin the same way, two instances racing on one slot end with one
//! owner, idle origins expire, and a non-compacted state topic stops the
//! proxy.
//!
//! Batches are written by hand with the link's client id (the source
//! cluster ids are only configuration, so no source broker is needed) and
//! read back from the destination log with DumpLogSegments.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::thread;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};

use kafka_mirror_proxy::mirror::origins::compose;
use kafka_mirror_proxy::mirror::pid::{cluster_hash, ClusterId};
use kafka_mirror_proxy::mirror::state_records::StateRecord;
use support::crate_client::{client, create_topic, runtime, state_records};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{free_port, free_port_run, proxy_bin, ProxyProcess};
use support::tools::{self, DumpedBatch};
use support::wire::{partition_result, record_batch, record_batch_at, RawClient};

const STATE: &str = "__mirror_state";

/// SPEC §4's salt fold, written here rather than taken from the crate:
/// `(s low 32 bits) XOR (s high 32 bits)`.
fn fold32(salt: i64) -> u32 {
    let s = salt as u64;
    (s as u32) ^ ((s >> 32) as u32)
}

/// Two cluster ids with one 32-bit hash: the second flips bit 32 of both
/// 64-bit halves, which the XOR cancels.
fn colliding_ids() -> (ClusterId, ClusterId) {
    let x: [u8; 16] = *b"state-topic-test";
    let mut y = x;
    y[3] ^= 1;
    y[11] ^= 1;
    let (x, y) = (ClusterId::from_bytes(x), ClusterId::from_bytes(y));
    assert_eq!(cluster_hash(&x), cluster_hash(&y));
    assert_ne!(x, y);
    (x, y)
}

fn link_env<'a>(
    names: &'a str,
    links: &'a [(&'a str, String, &'a str)],
    extra: &[(&'a str, &'a str)],
) -> Vec<(String, String)> {
    let mut env = vec![("LINKS".to_string(), names.to_string())];
    for (name, id, topics) in links {
        let upper = name.to_uppercase();
        env.push((format!("LINK_{upper}_SOURCE_CLUSTER_ID"), id.clone()));
        env.push((format!("LINK_{upper}_TOPICS"), topics.to_string()));
    }
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    env
}

fn start_proxy(broker: &KafkaCluster, env: &[(String, String)]) -> Result<ProxyProcess> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ProxyProcess::start(&broker.bootstrap(), &env)
}

/// Produce one batch per (client id, pid, value) through the proxy; every
/// partition must be accepted.
fn send(proxy: &ProxyProcess, topic: &str, batches: &[(&str, i64, &str)]) -> Result<()> {
    send_at(proxy, topic, batches, 0)
}

/// [`send`] with each batch at `sequence` (producers with a sequence).
fn send_at(
    proxy: &ProxyProcess,
    topic: &str,
    batches: &[(&str, i64, &str)],
    sequence: i32,
) -> Result<()> {
    // One broker: the bootstrap listener reaches the leader.
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    for (client_id, pid, value) in batches {
        let batch = record_batch_at(*pid, sequence, &[value]);
        let (code, message) = partition_result(&raw.produce(client_id, topic, 0, batch)?);
        ensure!(
            code == 0,
            "{client_id} pid {pid} to {topic}-0: error {code} ({message:?}); proxy log:\n{}",
            tools::tail_str(&proxy.logs(), 30)
        );
    }
    Ok(())
}

/// (payload, producer id) of every batch of `topic`-0.
fn log_pids(broker: &KafkaCluster, topic: &str) -> Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    for file in broker.segment_files(topic, 0)? {
        let batches: Vec<DumpedBatch> = tools::dump_log_segments(&file, true)?;
        for b in batches {
            ensure!(
                b.is_valid,
                "{topic}: batch at {} has a bad CRC",
                b.base_offset
            );
            let payload = b
                .records
                .first()
                .and_then(|r| r.payload.clone())
                .unwrap_or_default();
            out.push((payload, b.producer_id));
        }
    }
    Ok(out)
}

fn region(pid: i64) -> u32 {
    (pid as u64 >> 31) as u32
}

/// The state topic is created compacted; colliding hashes, an oversized
/// PID and a chained PID all get distinct valid mapped PIDs; the collision
/// records decode to what happened; a restart maps every origin the same.
#[test]
fn collisions_are_salted_persisted_and_survive_a_restart() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let c = client(&broker.bootstrap());
    let (x, y) = colliding_ids();
    let w = ClusterId::from_bytes(*b"chain-source-id!");
    let h = cluster_hash(&x);
    let links = [
        ("x", x.to_string(), "m"),
        ("y", y.to_string(), "m"),
        ("w", w.to_string(), "m"),
    ];
    let env = link_env("x,y,w", &links, &[]);
    create_topic(&rt, &c, "m", 1, &[])?;

    let mut proxy = start_proxy(&broker, &env)?;

    // a) Created with the properties.
    let configs =
        rt.block_on(c.describe_topic_config(STATE, &["cleanup.policy", "min.insync.replicas"]))?;
    assert_eq!(
        configs.get("cleanup.policy").cloned().flatten().as_deref(),
        Some("compact")
    );
    assert_eq!(
        configs
            .get("min.insync.replicas")
            .cloned()
            .flatten()
            .as_deref(),
        Some("1")
    );
    let info = rt.block_on(c.topic(STATE))?;
    assert_eq!(
        info.partitions.len(),
        1,
        "the state topic has one partition"
    );

    // b) Two clusters sharing the hash, PID 0 each; c) PID 5 and 2^31+5;
    // f) a chain: an already-mapped PID arriving on link w that equals x's
    // natural slot for PID 9, which x claims first.
    let big = (1i64 << 31) + 5;
    let chained = compose(h, 9);
    let batches: [(&str, i64, &str); 6] = [
        ("mirror-x", 0, "x0"),
        ("mirror-y", 0, "y0"),
        ("mirror-x", 5, "x5"),
        ("mirror-x", big, "xbig"),
        ("mirror-x", 9, "x9"),
        ("mirror-w", chained, "w-chain"),
    ];
    send(&proxy, "m", &batches)?;
    let first: BTreeMap<String, i64> = log_pids(&broker, "m")?.into_iter().collect();
    assert_eq!(first.len(), 6, "{first:?}");
    let distinct: BTreeSet<i64> = first.values().copied().collect();
    assert_eq!(
        distinct.len(),
        6,
        "no two origins share a mapped PID: {first:?}"
    );
    assert!(first.values().all(|&p| p < -1), "all mapped: {first:?}");
    assert_eq!(
        first["x0"],
        compose(h, 0),
        "the first claimant keeps its natural slot"
    );
    assert_eq!(first["x5"], compose(h, 5));
    assert_eq!(first["x9"], compose(h, 9));
    let y0 = first["y0"];
    assert_eq!(y0 & 0x7FFF_FFFF, 0, "identity kept");
    assert_ne!(region(y0), h, "salted out of the shared region");
    let xbig = first["xbig"];
    assert_eq!(xbig & 0x7FFF_FFFF, 5);
    assert_ne!(region(xbig), h);
    let wchain = first["w-chain"];
    assert_ne!(wchain, chained, "the chained PID collides with x's PID 9");
    assert_eq!(wchain & 0x7FFF_FFFF, 9);
    assert_ne!(region(wchain), cluster_hash(&w));

    // The collision records read back from the state topic.
    let records = rt.block_on(state_records(&c, STATE))?;
    let m_id = rt.block_on(c.topic("m"))?.topic_id;
    let collision = |source: ClusterId, pid: i64| {
        records.iter().find_map(|(_, r)| match r {
            StateRecord::Collision(k, Some(v))
                if k.source == source
                    && k.original_pid == pid
                    && k.topic_id == m_id
                    && k.partition == 0 =>
            {
                Some(*v)
            }
            _ => None,
        })
    };
    let cy = collision(y, 0).context("collision record of y's PID 0")?;
    assert_eq!(cy.colliding, x, "y collided with x");
    assert_eq!(
        y0,
        compose(h ^ fold32(cy.salt), 0),
        "the salt gives y's mapped PID"
    );
    assert!(cy.timestamp_ms > 1_600_000_000_000);
    let cbig = collision(x, big).context("collision record of x's PID 2^31+5")?;
    assert_eq!(cbig.colliding, x);
    assert_eq!(xbig, compose(h ^ fold32(cbig.salt), 5));
    let cw = collision(w, chained).context("collision record of the chained PID")?;
    assert_eq!(cw.colliding, x);
    assert_eq!(wchain, compose(cluster_hash(&w) ^ fold32(cw.salt), 9));
    assert!(
        collision(x, 0).is_none() && collision(x, 5).is_none(),
        "natural slots need no salt"
    );
    let origins = records
        .iter()
        .filter(|(_, r)| matches!(r, StateRecord::Origin(_, Some(_))))
        .count();
    assert_eq!(origins, 6, "one claim per origin: {records:?}");
    let text = proxy.logs();
    assert!(
        text.contains("producer id collision resolved with a salt")
            && text.contains("oversized_pid")
            && text.contains(&format!(
                "source_cluster={y} pid=0 colliding_cluster={x} colliding_pid=Some(0)"
            )),
        "INFO lines for collisions:\n{}",
        tools::tail_str(&text, 30)
    );
    let collisions =
        proxy.metric("kafka_mirror_proxy_state_collisions_resolved_total{cause=\"hash\"}")?;
    assert_eq!(collisions, 2, "y0 and the chain");

    // `unmap` traces a salted PID back to its origin through the state topic.
    let mut cmd = Command::new(proxy_bin());
    cmd.args([
        "unmap",
        "--pid",
        &y0.to_string(),
        "--bootstrap-server",
        &broker.bootstrap(),
    ]);
    let out = tools::run_with_timeout(cmd, None, Duration::from_secs(60))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "unmap: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains(&format!(
            "origin   m-0: source cluster {y} producer id 0 (salt {})",
            cy.salt
        )),
        "unmap output:\n{stdout}"
    );

    // d) Restart: the same origins' next batches (sequence 1: the
    // identical batches would be answered as duplicates, the proxy's
    // producer state being rebuilt from the log) map to the same PIDs.
    proxy.signal("TERM")?;
    proxy.wait_exit(Duration::from_secs(30))?;
    let proxy = start_proxy(&broker, &env)?;
    send_at(&proxy, "m", &batches, 1)?;
    let all = log_pids(&broker, "m")?;
    assert_eq!(all.len(), 12);
    for (value, pid) in &all[6..] {
        assert_eq!(first[value], *pid, "{value} after the restart");
    }
    assert_eq!(
        proxy.metric("kafka_mirror_proxy_state_origins_persisted_total")?,
        0,
        "nothing new to persist"
    );
    Ok(())
}

/// Two instances on one state topic, links with colliding hashes, writing
/// the same PIDs into one partition at once: no mapped PID is shared.
#[test]
fn two_instances_racing_never_share_a_mapped_pid() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let c = client(&broker.bootstrap());
    let (x, y) = colliding_ids();
    create_topic(&rt, &c, "race", 1, &[])?;
    let px = start_proxy(
        &broker,
        &link_env("x", &[("x", x.to_string(), "race")], &[]),
    )?;
    let py = start_proxy(
        &broker,
        &link_env("y", &[("y", y.to_string(), "race")], &[]),
    )?;
    const N: i64 = 20;
    let values: Vec<(String, String)> =
        (0..N).map(|i| (format!("x{i}"), format!("y{i}"))).collect();
    thread::scope(|s| -> Result<()> {
        let tx = s.spawn(|| {
            let b: Vec<_> = (0..N)
                .map(|i| ("mirror-x", i, values[i as usize].0.as_str()))
                .collect();
            send(&px, "race", &b)
        });
        let ty = s.spawn(|| {
            let b: Vec<_> = (0..N)
                .map(|i| ("mirror-y", i, values[i as usize].1.as_str()))
                .collect();
            send(&py, "race", &b)
        });
        tx.join().map_err(|_| anyhow::anyhow!("x panicked"))??;
        ty.join().map_err(|_| anyhow::anyhow!("y panicked"))??;
        Ok(())
    })?;
    let log = log_pids(&broker, "race")?;
    assert_eq!(log.len(), 2 * N as usize);
    let mut owner: BTreeMap<i64, String> = BTreeMap::new();
    for (value, pid) in &log {
        assert!(*pid < -1, "{value}: {pid}");
        if let Some(other) = owner.insert(*pid, value.clone()) {
            bail!("mapped PID {pid} used by {other} and {value}");
        }
    }
    // Every pair (x i, y i) wanted the same natural slot: exactly one of
    // each holds it, the other is salted.
    let h = cluster_hash(&x);
    let natural = log.iter().filter(|(_, p)| region(*p) == h).count();
    assert_eq!(natural, N as usize, "{log:?}");
    let lost =
        px.logs().matches("lost the race").count() + py.logs().matches("lost the race").count();
    eprintln!("races lost and re-resolved: {lost}");
    Ok(())
}

/// Idle origins are tombstoned after PRODUCER_EXPIRATION_MS, and their slot
/// goes to the next claimant unsalted.
#[test]
fn idle_origins_expire_and_free_their_slot() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let c = client(&broker.bootstrap());
    let (x, y) = colliding_ids();
    let h = cluster_hash(&x);
    create_topic(&rt, &c, "exp", 1, &[])?;
    let env = link_env(
        "x,y",
        &[("x", x.to_string(), "exp"), ("y", y.to_string(), "exp")],
        &[("PRODUCER_EXPIRATION_MS", "3000")],
    );
    let proxy = start_proxy(&broker, &env)?;
    send(&proxy, "exp", &[("mirror-x", 7, "x7")])?;
    let tombstoned = |records: &[(i64, StateRecord)]| {
        records
            .iter()
            .any(|(_, r)| matches!(r, StateRecord::Origin(k, None) if k.source == x && k.original_pid == 7))
    };
    let mut waited = Duration::ZERO;
    while !tombstoned(&rt.block_on(state_records(&c, STATE))?) {
        ensure!(
            waited < Duration::from_secs(30),
            "no tombstone for x's PID 7"
        );
        thread::sleep(Duration::from_millis(500));
        waited += Duration::from_millis(500);
    }
    send(&proxy, "exp", &[("mirror-y", 7, "y7")])?;
    let log: BTreeMap<String, i64> = log_pids(&broker, "exp")?.into_iter().collect();
    assert_eq!(log["x7"], compose(h, 7));
    assert_eq!(
        log["y7"],
        compose(h, 7),
        "the expired slot is reused without a salt"
    );
    Ok(())
}

/// A state topic that exists with cleanup.policy=delete stops the proxy.
#[test]
fn a_state_topic_that_is_not_compacted_stops_the_proxy() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let c = client(&broker.bootstrap());
    create_topic(&rt, &c, "plain-state", 1, &[("cleanup.policy", "delete")])?;
    let mut cmd = Command::new(proxy_bin());
    cmd.arg("run")
        .env("MIRROR_PROXY_BOOTSTRAP_SERVERS", broker.bootstrap())
        .env(
            "MIRROR_PROXY_LISTEN",
            format!("127.0.0.1:{}", free_port_run(2)?),
        )
        .env(
            "MIRROR_PROXY_ADMIN_LISTEN",
            format!("127.0.0.1:{}", free_port()?),
        )
        .env("MIRROR_PROXY_STATE_TOPIC", "plain-state")
        .env("MIRROR_PROXY_LINKS", "x")
        .env(
            "MIRROR_PROXY_LINK_X_SOURCE_CLUSTER_ID",
            colliding_ids().0.to_string(),
        )
        .env("MIRROR_PROXY_LINK_X_TOPICS", "m");
    let out = tools::run_with_timeout(cmd, None, Duration::from_secs(60))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "exit status {}", out.status);
    assert!(
        stderr.contains("state topic plain-state") && stderr.contains("compacted"),
        "the error must name the topic:\n{stderr}"
    );
    Ok(())
}

/// The state topic cannot be read (the proxy's own connections fail SASL
/// against a plaintext broker): local traffic flows, link Produce gets a
/// retriable error, /readyz says why. A state topic that cannot be written
/// (max.message.bytes too small for any batch): the new origin's partition
/// gets a retriable error and nothing of it is forwarded.
#[test]
fn an_unusable_state_topic_refuses_only_link_traffic_with_retriable_errors() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let c = client(&broker.bootstrap());
    let (x, _) = colliding_ids();
    create_topic(&rt, &c, "m", 1, &[])?;
    create_topic(&rt, &c, "plain", 1, &[])?;
    let links = [("x", x.to_string(), "m")];

    let unreadable: Vec<(String, String)> = link_env(
        "x",
        &links,
        &[
            ("UPSTREAM_SASL_MECHANISM", "PLAIN"),
            ("UPSTREAM_SASL_USERNAME", "proxy"),
            ("UPSTREAM_SASL_PASSWORD", "secret"),
        ],
    );
    let env: Vec<(&str, &str)> = unreadable
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let mut proxy = ProxyProcess::start_unloaded(&broker.bootstrap(), &env)?;
    proxy.wait_for_log(
        "loading the state topic failed; retrying",
        Duration::from_secs(60),
    )?;
    let (status, body) = proxy.admin_get("/readyz")?;
    assert!(
        status.contains("503") && body.contains("state topic"),
        "{status} {body}"
    );
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    // Retrying UNKNOWN_TOPIC_OR_PARTITION (3) as a client would: a topic
    // just created may not be served by its leader yet.
    let mut tries = 0;
    let (code, message) = loop {
        tries += 1;
        let r = partition_result(&raw.produce("local", "plain", 0, record_batch(3, &["local"]))?);
        if r.0 != 3 || tries == 60 {
            break r;
        }
        thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(code, 0, "local traffic flows: {message:?}");
    // A local write to the link's topic waits for the link's state (it may
    // be a read-only mirror, or failed over): retriable.
    let (code, message) =
        partition_result(&raw.produce("local", "m", 0, record_batch(3, &["local"]))?);
    assert_eq!(code, 19, "NOT_ENOUGH_REPLICAS (retriable): {message:?}");
    assert!(message.unwrap_or_default().contains("link 'x'"));
    let (code, message) =
        partition_result(&raw.produce("mirror-x", "m", 0, record_batch(3, &["link"]))?);
    assert_eq!(code, 19, "NOT_ENOUGH_REPLICAS (retriable): {message:?}");
    assert!(message.unwrap_or_default().contains("not loaded"));
    drop(raw);
    proxy.signal("TERM")?;
    proxy.wait_exit(Duration::from_secs(30))?;

    create_topic(
        &rt,
        &c,
        "stuck-state",
        1,
        &[("cleanup.policy", "compact"), ("max.message.bytes", "16")],
    )?;
    let unwritable = link_env("x", &links, &[("STATE_TOPIC", "stuck-state")]);
    let proxy = start_proxy(&broker, &unwritable)?;
    let mut raw = RawClient::connect(&proxy.bootstrap)?;
    let (code, message) =
        partition_result(&raw.produce("mirror-x", "m", 0, record_batch(4, &["new origin"]))?);
    assert_eq!(
        code, 20,
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND (retriable): {message:?}"
    );
    let log: Vec<String> = log_pids(&broker, "m")?
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    assert!(
        log.is_empty(),
        "nothing of the refused partitions is forwarded: {log:?}"
    );
    assert!(proxy.metric("kafka_mirror_proxy_state_write_failures_total")? >= 1);
    Ok(())
}
