//! Smoke tests of the real-Kafka test harness itself (tests/support): local
//! KRaft brokers with chosen cluster ids, PLAINTEXT, SASL/PLAIN and TLS client
//! listeners, restart, a three-node cluster losing and regaining a node,
//! start failures, and Kafka's Java tools with their output parsers.

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use support::kafka::{KafkaCluster, KafkaMultiCluster, KafkaOptions, Security};
use support::tools::{self, props_ref};

const ID_A: &str = "MkU3OEVBNTcwNTJENDM2Qk";
/// Starts with `-`, as about one random id in 64 does: the harness must not
/// let the storage tool read it as an option.
const ID_B: &str = "-1Zx7Kd8Tj2m4Wf0hYvRsA";

fn records(n: usize) -> Vec<(String, String)> {
    (0..n)
        .map(|i| (format!("key-{i}"), format!("value {i} with spaces")))
        .collect()
}

#[test]
fn two_clusters_produce_consume_dump_restart() -> Result<()> {
    // Start both at once, as chained-cluster tests will.
    let (a, b) = thread::scope(|s| {
        let a = s.spawn(|| KafkaCluster::start(KafkaOptions::default().cluster_id(ID_A)));
        let b = s.spawn(|| KafkaCluster::start(KafkaOptions::default().cluster_id(ID_B)));
        (a.join().unwrap(), b.join().unwrap())
    });
    let (a, mut b) = (a?, b?);
    assert_ne!(a.port(), b.port());
    assert_ne!(a.log_dirs(), b.log_dirs());
    assert_eq!(a.bootstrap(), format!("127.0.0.1:{}", a.port()));
    assert_eq!(a.cluster_id(), ID_A);
    assert_eq!(tools::cluster_id(&a.bootstrap(), &[])?, ID_A);
    assert_eq!(tools::cluster_id(&b.bootstrap(), &[])?, ID_B);

    // A: idempotent key/value round trip, then the log on disk.
    let topic = "smoke";
    tools::create_topic(
        &a.bootstrap(),
        topic,
        1,
        &[("segment.bytes", "1048576")],
        &[],
    )?;
    let sent = records(100);
    tools::console_produce_kv(
        &a.bootstrap(),
        topic,
        &sent,
        &[("enable.idempotence", "true"), ("acks", "all")],
    )?;
    let got = tools::console_consume(
        &a.bootstrap(),
        topic,
        100,
        &[("print.key", "true")],
        Duration::from_secs(20),
    )?;
    let expected: Vec<String> = sent.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    assert_eq!(got, expected);

    let segments = a.segment_files(topic, 0)?;
    assert_eq!(segments.len(), 1, "{segments:?}");
    let batches = tools::dump_log_segments(&segments[0], true)?;
    assert!(!batches.is_empty());
    let mut offset = 0;
    for batch in &batches {
        assert!(batch.producer_id >= 0, "{batch:?}");
        assert!(
            batch.is_valid && !batch.is_control && !batch.is_transactional,
            "{batch:?}"
        );
        assert_eq!(batch.base_offset, offset);
        assert_eq!(batch.records.len() as i64, batch.count);
        for r in &batch.records {
            let (k, v) = &sent[r.offset as usize];
            assert_eq!(
                (r.key.as_deref(), r.payload.as_deref()),
                (Some(k.as_str()), Some(v.as_str()))
            );
            assert_eq!(
                i64::from(r.sequence),
                r.offset,
                "one producer session, sequence = offset"
            );
        }
        offset = batch.last_offset + 1;
    }
    assert_eq!(batches.iter().map(|b| b.count).sum::<i64>(), 100);

    // B: the other tools, and a restart keeping ports, id and data.
    let versions = tools::broker_api_versions(&b.bootstrap())?;
    ensure!(
        versions.contains("Produce(0)") && versions.contains(&b.bootstrap()),
        "{versions}"
    );
    let perf = tools::producer_perf(&b.bootstrap(), "perf", 5000, 100, &[("acks", "all")])?;
    assert_eq!(perf.records_sent, 5000);
    assert!(
        perf.records_per_sec > 0.0 && perf.p99_ms >= perf.p50_ms,
        "{perf:?}"
    );
    let port = b.port();
    let t = Instant::now();
    b.restart()?;
    eprintln!("restart took {:?}", t.elapsed());
    assert_eq!(b.port(), port);
    assert!(b.is_running());
    let topics = tools::list_topics(&b.bootstrap(), &[])?;
    assert!(topics.contains(&"perf".to_string()), "{topics:?}");
    let first = tools::dump_log_segments(&b.segment_files("perf", 0)?[0], false)?;
    assert_eq!(first.iter().map(|b| b.count).sum::<i64>(), 5000);
    assert!(first.iter().all(|b| b.records.is_empty()), "not deep");
    b.stop()?;
    assert!(!b.is_running());
    Ok(())
}

/// Three nodes with ids chosen here: all of them in the cluster, a
/// replicated topic that stays writable and readable with one node killed,
/// and the node back after a restart, caught up with what it missed.
#[test]
fn three_nodes_survive_a_kill_and_restart() -> Result<()> {
    let ids = [4, 7, 9];
    let mut kafka = KafkaMultiCluster::start(KafkaOptions::default().cluster_id(ID_A), &ids)?;
    assert_eq!(kafka.node_ids(), ids);
    let each: Vec<String> = kafka.nodes().iter().map(|n| n.bootstrap()).collect();
    assert_eq!(kafka.bootstrap(), each.join(","));
    assert_eq!(tools::cluster_id(&kafka.bootstrap(), &[])?, ID_A);
    let versions = tools::broker_api_versions(&kafka.bootstrap())?;
    for id in ids {
        ensure!(versions.contains(&format!("(id: {id} ")), "{versions}");
    }

    let topic = "replicated";
    tools::create_topic_replicated(&kafka.bootstrap(), topic, 3, 3, &[], &[])?;
    let acks = [("acks", "all"), ("enable.idempotence", "true")];
    let sent = records(200);
    tools::console_produce_kv(&kafka.bootstrap(), topic, &sent[..100], &acks)?;

    // A crash: the port refuses, the other two carry on (data and quorum).
    let victim = kafka.node_mut(7)?;
    let victim_port = victim.port();
    victim.kill();
    assert!(!victim.is_running());
    assert!(TcpStream::connect(("127.0.0.1", victim_port)).is_err());
    tools::console_produce_kv(&kafka.bootstrap(), topic, &sent[100..], &acks)?;
    tools::create_topic_replicated(&kafka.bootstrap(), "created-while-down", 1, 2, &[], &[])?;
    let got = tools::console_consume(&kafka.bootstrap(), topic, 200, &[], Duration::from_secs(30))?;
    assert_eq!(got.len(), 200, "{got:?}");

    // Back on the same port and data; it sees the others and catches up.
    let victim = kafka.node_mut(7)?;
    victim.restart()?;
    assert!(victim.is_running());
    assert_eq!(victim.port(), victim_port);
    let versions = tools::broker_api_versions(&victim.bootstrap())?;
    for id in ids {
        ensure!(versions.contains(&format!("(id: {id} ")), "{versions}");
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut count = 0;
        for partition in 0..3 {
            for segment in victim.segment_files(topic, partition)? {
                count += tools::dump_log_segments(&segment, false)?
                    .iter()
                    .map(|b| b.count)
                    .sum::<i64>();
            }
        }
        if count == 200 {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "node 7 holds {count} of 200 records a minute after its restart"
        );
        thread::sleep(Duration::from_secs(1));
    }
    ensure!(kafka.node_mut(5).is_err(), "node 5 was never started");
    Ok(())
}

#[test]
fn sasl_plaintext_needs_the_right_password() -> Result<()> {
    let security = Security::SaslPlaintext {
        user: "alice".into(),
        password: "alice-secret".into(),
    };
    let kafka = KafkaCluster::start(KafkaOptions::default().security(security))?;
    let client = kafka.client_properties();
    let client = props_ref(&client);
    tools::create_topic(&kafka.bootstrap(), "secure", 1, &[], &client)?;
    let sent = records(10);
    tools::console_produce_kv(&kafka.bootstrap(), "secure", &sent, &client)?;
    let mut props = client.clone();
    props.push(("print.key", "true"));
    let got = tools::console_consume(
        &kafka.bootstrap(),
        "secure",
        10,
        &props,
        Duration::from_secs(20),
    )?;
    let expected: Vec<String> = sent.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    assert_eq!(got, expected);

    let wrong = Security::SaslPlaintext {
        user: "alice".into(),
        password: "wrong".into(),
    }
    .client_properties();
    let mut wrong = props_ref(&wrong);
    wrong.push(("max.block.ms", "5000"));
    // One record: the producer retries authentication once per record.
    let err = tools::console_produce_kv(&kafka.bootstrap(), "secure", &sent[..1], &wrong)
        .expect_err("a wrong password must not produce");
    let err = format!("{err:#}");
    assert!(err.contains("Authentication failed"), "{err}");
    // A client without SASL gets nothing either (the listener drops it).
    let plain = [
        ("default.api.timeout.ms", "3000"),
        ("request.timeout.ms", "2000"),
    ];
    let err = tools::list_topics(&kafka.bootstrap(), &plain).expect_err("no SASL, no topics");
    assert!(
        format!("{err:#}").contains("TopicCommand failed"),
        "{err:#}"
    );
    Ok(())
}

#[test]
fn ssl_listener_with_pem_certificate() -> Result<()> {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])?;
    let security = Security::Ssl {
        cert_chain_pem: cert.cert.pem(),
        key_pem: cert.key_pair.serialize_pem(),
    };
    let kafka = KafkaCluster::start(KafkaOptions::default().security(security))?;
    let client = kafka.client_properties();
    let client = props_ref(&client);
    tools::create_topic(&kafka.bootstrap(), "tls", 1, &[], &client)?;
    tools::console_produce(
        &kafka.bootstrap(),
        "tls",
        &["one".into(), "two".into()],
        &client,
    )?;
    let got = tools::console_consume(
        &kafka.bootstrap(),
        "tls",
        2,
        &client,
        Duration::from_secs(20),
    )?;
    assert_eq!(got, ["one", "two"]);
    Ok(())
}

#[test]
fn failed_start_reports_the_broker_log() -> Result<()> {
    // Passes `format`, then fails inside the broker while it starts.
    let t = Instant::now();
    let err = KafkaCluster::start(
        KafkaOptions::default().property("metric.reporters", "com.example.NoSuchReporter"),
    )
    .err()
    .context("start must fail")?;
    let err = format!("{err:#}");
    // Printed for `kafka_test_bootstrap_does_not_skip_anything` below.
    eprintln!("first start failed as expected: {err}");
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    assert!(err.contains("exited during start"), "{err}");
    assert!(err.contains("lines of broker log"), "{err}");
    assert!(
        err.contains("ClassNotFoundException: com.example.NoSuchReporter"),
        "{err}"
    );

    // Rejected by `kafka.tools.StorageTool format` already.
    let err = KafkaCluster::start(KafkaOptions::default().property("process.roles", "nonsense"))
        .err()
        .context("start must fail")?;
    let err = format!("{err:#}");
    assert!(
        err.contains("StorageTool format failed") && err.contains("nonsense"),
        "{err}"
    );
    Ok(())
}

/// `KAFKA_TEST_BOOTSTRAP` once pointed the suite at an external cluster, and
/// every broker test then returned early and was counted as passed. With it
/// set, a test must still start its own broker: the child run can only show
/// the broker's own log excerpt if it did.
#[test]
fn kafka_test_bootstrap_does_not_skip_anything() -> Result<()> {
    let test = "failed_start_reports_the_broker_log";
    let out = Command::new(std::env::current_exe()?)
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env("KAFKA_TEST_BOOTSTRAP", "127.0.0.1:1")
        .output()
        .context("running the harness test binary again")?;
    let text = tools::output_text(&out);
    ensure!(
        out.status.success(),
        "{test} failed ({}):\n{text}",
        out.status
    );
    ensure!(text.contains("1 passed"), "{test} did not run:\n{text}");
    ensure!(
        text.contains("ClassNotFoundException: com.example.NoSuchReporter"),
        "{test} passed without starting its own broker:\n{text}"
    );
    Ok(())
}
