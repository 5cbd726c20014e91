//! `kafka-mirror-proxy replicate` with security on both sides, as the
//! binary an operator runs: a real source broker whose client listener is
//! SASL_PLAINTEXT (PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 enabled), and a
//! proxy serving TLS (a test CA's certificate) in front of a real
//! destination broker whose client listener is SASL_PLAINTEXT too, with a
//! user of its own; the proxy passes the replicator's SASL through.
//!
//! One pair of clusters, in phases:
//! 1. SCRAM-SHA-512 to the source; TLS (DESTINATION_TLS_CA) and
//!    SCRAM-SHA-256 to the destination: the replicator copies a
//!    two-partition topic until caught up and exits 0; then PLAIN to the
//!    source copies a second topic the same way. The destination holds
//!    exactly the source's records, in order, per partition.
//! 2. A wrong source password: the replicator exits 1 at once with a
//!    message naming SASL and the failed authentication, rather than
//!    retrying for ever (SASL_AUTHENTICATION_FAILED is not retriable).
//! 3. SASL settings against a listener without SASL, the source broker's
//!    own PLAINTEXT inter-broker listener (the mistake of the first attempt
//!    at this test, whose "SASL source" was a PLAINTEXT broker): exit 1,
//!    and the message says the listener does not speak SASL instead of
//!    "the broker enables []".

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_mirror_proxy::wire::sasl::{Credentials, Mechanism};
use support::certs::TestCa;
use support::crate_client::{create_topic, end_offsets, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::records;
use support::replicator::replicator_command;
use support::tools;

const WAIT: Duration = Duration::from_secs(120);
const USER: &str = "mirror";
const PASSWORD: &str = "mirror-secret";
const DEST_USER: &str = "mirror-dst";
const DEST_PASSWORD: &str = "mirror-dst-secret";
const SCRAM_TOPIC: &str = "secure.scram";
const PLAIN_TOPIC: &str = "secure.plain";

/// The crate's client for a SASL cluster.
fn sasl_client(bootstrap: &str, mechanism: Mechanism, user: &str, password: &str) -> Client {
    let mut c = ClientConfig::new(
        vec![bootstrap.to_string()],
        Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(10),
        },
    );
    c.sasl = Some(Credentials {
        mechanism,
        username: user.into(),
        password: password.into(),
    });
    Client::new(c)
}

/// librdkafka's settings for a SASL cluster (it takes the credentials as
/// properties, not as the harness's JAAS line).
fn sasl_properties(cluster: &KafkaCluster, user: &str, password: &str) -> RdConfig {
    let mut c = RdConfig::new();
    for (k, v) in cluster.client_properties() {
        if k != "sasl.jaas.config" {
            c.set(k, v);
        }
    }
    c.set("sasl.username", user).set("sasl.password", password);
    c
}

fn producer(source: &KafkaCluster) -> Result<BaseProducer> {
    Ok(sasl_properties(source, USER, PASSWORD)
        .set("bootstrap.servers", source.bootstrap())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?)
}

/// `n` records to each partition `0..partitions` of `topic`.
fn write(p: &BaseProducer, topic: &str, partitions: i32, n: usize) -> Result<()> {
    for i in 0..n {
        for partition in 0..partitions {
            let v = format!("{topic}-{partition}-{i}");
            p.send(
                BaseRecord::to(topic)
                    .partition(partition)
                    .key(&format!("k{i}"))
                    .payload(&v),
            )
            .map_err(|(e, _)| anyhow::anyhow!("queueing {v}: {e}"))?;
        }
    }
    p.flush(WAIT)?;
    Ok(())
}

/// Every record (key, value) of `topic`, per partition in log order, up
/// to `ends`, read with `c`'s settings plus a bootstrap.
fn consume(
    c: RdConfig,
    bootstrap: &str,
    topic: &str,
    ends: &[i64],
) -> Result<BTreeMap<i32, Vec<(String, String)>>> {
    Ok(records::read_with(c, bootstrap, topic, ends)?
        .into_iter()
        .map(|(p, log)| (p, log.into_iter().map(|(_, k, v)| (k, v)).collect()))
        .collect())
}

/// Runs the replicator (extra `MIRROR_REPLICATOR_*` variables, names
/// without the prefix) until it exits within `timeout`: its status and
/// its stderr. Killed, and an error, if it does not.
fn replicate(
    dir: &Path,
    name: &str,
    vars: &[(&str, &str)],
    timeout: Duration,
) -> Result<(ExitStatus, String)> {
    let log = dir.join(format!("{name}.log"));
    let mut cmd: Command = replicator_command();
    for (k, v) in vars {
        cmd.env(format!("MIRROR_REPLICATOR_{k}"), v);
    }
    let mut child = cmd
        .args(["--link", "a"])
        .args(["--retry-backoff-ms", "50"])
        .args(["--discovery-interval-ms", "1000"])
        .stdout(std::fs::File::create(dir.join(format!("{name}.out")))?)
        .stderr(std::fs::File::create(&log)?)
        .spawn()
        .context("starting the replicator")?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "replicator {name}: still running after {timeout:?}; its log:\n{}",
                tools::tail_str(&std::fs::read_to_string(&log).unwrap_or_default(), 40)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    Ok((status, std::fs::read_to_string(&log)?))
}

#[test]
fn a_sasl_source_and_a_tls_proxy_copy_exactly_and_bad_credentials_exit_1() -> Result<()> {
    let rt = runtime()?;
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new(dir.path())?;
    let cert = ca.server("proxy")?;
    let source = KafkaCluster::start(KafkaOptions::default().sasl_plain(USER, PASSWORD))?;
    let destination =
        KafkaCluster::start(KafkaOptions::default().sasl_plain(DEST_USER, DEST_PASSWORD))?;
    let src = sasl_client(&source.bootstrap(), Mechanism::ScramSha256, USER, PASSWORD);
    let dst = sasl_client(
        &destination.bootstrap(),
        Mechanism::ScramSha512,
        DEST_USER,
        DEST_PASSWORD,
    );
    let proxy = ProxyProcess::start(
        &destination.bootstrap(),
        &[
            ("LINKS", "a"),
            ("LINK_A_SOURCE_CLUSTER_ID", source.cluster_id()),
            ("LINK_A_TOPICS", "secure\\..*"),
            ("TLS_CERT", &cert.cert_path.to_string_lossy()),
            ("TLS_KEY", &cert.key_path.to_string_lossy()),
            // The proxy's own connections (its state topic).
            ("UPSTREAM_SASL_MECHANISM", "PLAIN"),
            ("UPSTREAM_SASL_USERNAME", DEST_USER),
            ("UPSTREAM_SASL_PASSWORD", DEST_PASSWORD),
        ],
    )?;

    create_topic(&rt, &src, SCRAM_TOPIC, 2, &[])?;
    create_topic(&rt, &src, PLAIN_TOPIC, 1, &[])?;
    let p = producer(&source)?;
    write(&p, SCRAM_TOPIC, 2, 150)?;
    write(&p, PLAIN_TOPIC, 1, 80)?;
    let ca_path = ca.cert_path.to_string_lossy().into_owned();
    let source_bootstrap = source.bootstrap();
    let secured = |mechanism: &'static str, password: &'static str, topics: &'static str| {
        vec![
            ("SOURCE_BOOTSTRAP_SERVERS", source_bootstrap.clone()),
            ("SOURCE_SASL_MECHANISM", mechanism.to_string()),
            ("SOURCE_SASL_USERNAME", USER.to_string()),
            ("SOURCE_SASL_PASSWORD", password.to_string()),
            ("DESTINATION_BOOTSTRAP_SERVERS", proxy.bootstrap.clone()),
            ("DESTINATION_TLS", "true".to_string()),
            ("DESTINATION_TLS_CA", ca_path.clone()),
            ("DESTINATION_SASL_MECHANISM", "SCRAM-SHA-256".to_string()),
            ("DESTINATION_SASL_USERNAME", DEST_USER.to_string()),
            ("DESTINATION_SASL_PASSWORD", DEST_PASSWORD.to_string()),
            ("TOPICS", topics.to_string()),
        ]
    };
    let run = |name: &str, vars: Vec<(&str, String)>, extra: &[(&str, &str)]| {
        let mut all: Vec<(&str, &str)> = vars.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(extra);
        replicate(dir.path(), name, &all, WAIT)
    };

    // 1. SCRAM-SHA-512, then PLAIN; TLS to the proxy both times.
    for (name, mechanism, topic, partitions) in [
        ("scram-sha-512", "SCRAM-SHA-512", SCRAM_TOPIC, 2),
        ("plain", "PLAIN", PLAIN_TOPIC, 1),
    ] {
        let (status, log) = run(
            name,
            secured(mechanism, PASSWORD, topic),
            &[("UNTIL_CAUGHT_UP", "true")],
        )?;
        ensure!(
            status.code() == Some(0),
            "{name}: exit {status}; log:\n{}",
            tools::tail_str(&log, 40)
        );
        ensure!(
            !log.contains(PASSWORD) && !log.contains(DEST_PASSWORD),
            "{name}: a password was logged:\n{log}"
        );
        let source_ends = end_offsets(&rt, &src, topic, partitions)?;
        let destination_ends = end_offsets(&rt, &dst, topic, partitions)?;
        assert_eq!(
            destination_ends, source_ends,
            "{topic}: the destination's log ends are the source's"
        );
        let copied = consume(
            sasl_properties(&destination, DEST_USER, DEST_PASSWORD),
            &destination.bootstrap(),
            topic,
            &destination_ends,
        )?;
        let original = consume(
            sasl_properties(&source, USER, PASSWORD),
            &source.bootstrap(),
            topic,
            &source_ends,
        )?;
        let per_partition = if topic == SCRAM_TOPIC { 150 } else { 80 };
        for part in 0..partitions {
            assert_eq!(
                original.get(&part).map(Vec::len),
                Some(per_partition),
                "{topic}-{part}: what was written"
            );
        }
        assert_eq!(copied, original, "{topic}: exactly the source's records");
    }

    // 2. A wrong password: exit 1, naming SASL and the failed
    // authentication; no retrying for ever. Not until caught up, so only
    // the failure can end it.
    let (status, log) = run(
        "wrong-password",
        secured("SCRAM-SHA-512", "not-the-password", "secure\\..*"),
        &[],
    )?;
    assert_failed(
        "a refused password",
        status,
        &log,
        &[
            "SASL SCRAM-SHA-512 authentication failed",
            "SASL_AUTHENTICATION_FAILED",
        ],
        "the message names SASL and the authentication",
    );
    assert!(
        !log.contains("not-the-password"),
        "the password was logged:\n{log}"
    );

    // 3. SASL settings, but a listener without SASL (the source broker's
    // PLAINTEXT inter-broker one): exit 1, and the message says so.
    let plaintext = source
        .internal_bootstrap()
        .context("a SASL broker has an internal PLAINTEXT listener")?;
    let mut vars = secured("PLAIN", PASSWORD, "secure\\..*");
    for (k, v) in vars.iter_mut() {
        if *k == "SOURCE_BOOTSTRAP_SERVERS" {
            *v = plaintext.clone();
        }
    }
    let (status, log) = run("no-sasl-listener", vars, &[])?;
    assert_failed(
        "SASL against a PLAINTEXT listener",
        status,
        &log,
        &[
            "SASL PLAIN authentication failed",
            "this listener does not speak SASL",
        ],
        "the message names the listener",
    );
    Ok(())
}

/// A replicator run that ended with exit code 1 (`what` went wrong) and a
/// log holding every one of `needles` (`named`: what they show).
fn assert_failed(what: &str, status: ExitStatus, log: &str, needles: &[&str], named: &str) {
    assert_eq!(
        status.code(),
        Some(1),
        "{what}: {status}; log:\n{}",
        tools::tail_str(log, 40)
    );
    assert!(
        needles.iter().all(|n| log.contains(n)),
        "{named}:\n{}",
        tools::tail_str(log, 40)
    );
}
