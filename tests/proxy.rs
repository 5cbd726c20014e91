//! Transparent proxying against real brokers and real clients: Kafka's own
//! Java tools and librdkafka (through `rdkafka`) talk to a local KRaft broker
//! only through the proxy binary.

mod support;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::client::ClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::statistics::Statistics;

use support::certs::TestCa;
use support::kafka::{KafkaCluster, KafkaOptions, Security};
use support::proxy::ProxyProcess;
use support::tools::{self, props_ref};
use support::wire::RawClient;

/// A local broker with the proxy in front of it.
fn local_broker_and_proxy(
    options: KafkaOptions,
    proxy_env: &[(&str, &str)],
) -> Result<(KafkaCluster, ProxyProcess)> {
    let broker = KafkaCluster::start(options)?;
    let proxy = ProxyProcess::start(&broker.bootstrap(), proxy_env)?;
    Ok((broker, proxy))
}

/// Remembers acknowledged keys and the broker addresses librdkafka reports.
#[derive(Default, Clone)]
struct Observer {
    acked: Arc<Mutex<Vec<String>>>,
    failed: Arc<AtomicUsize>,
    brokers: Arc<Mutex<BTreeSet<String>>>,
}

impl ClientContext for Observer {
    fn stats(&self, statistics: Statistics) {
        if let Ok(mut b) = self.brokers.lock() {
            // Logical brokers (e.g. the group coordinator handle) have no
            // address of their own.
            b.extend(
                statistics
                    .brokers
                    .values()
                    .filter(|b| b.source != "logical" && b.source != "internal")
                    .map(|b| b.nodename.clone()),
            );
        }
    }
}

impl ProducerContext for Observer {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                let key = m
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default();
                if let Ok(mut a) = self.acked.lock() {
                    a.push(key);
                }
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::SeqCst);
            }
        }
    }
}

impl rdkafka::consumer::ConsumerContext for Observer {}

fn rd_producer(
    bootstrap: &str,
    extra: &[(&str, &str)],
    observer: &Observer,
) -> Result<ThreadedProducer<Observer>> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("statistics.interval.ms", "200")
        .set("linger.ms", "5");
    for (k, v) in extra {
        config.set(*k, *v);
    }
    Ok(config.create_with_context(observer.clone())?)
}

/// An idempotent librdkafka producer writing unique keys (`<topic>-<n>`) to
/// `topic` on its own thread, a record every 2 ms, until finished.
struct BackgroundProducer {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<usize>>,
}

impl BackgroundProducer {
    fn start(bootstrap: &str, topic: &str, observer: &Observer) -> BackgroundProducer {
        let stop = Arc::new(AtomicBool::new(false));
        let (bootstrap, topic, observer, flag) = (
            bootstrap.to_string(),
            topic.to_string(),
            observer.clone(),
            Arc::clone(&stop),
        );
        let thread = std::thread::spawn(move || -> Result<usize> {
            let producer = rd_producer(
                &bootstrap,
                &[
                    ("enable.idempotence", "true"),
                    ("acks", "all"),
                    ("message.timeout.ms", "120000"),
                ],
                &observer,
            )?;
            let mut sent = 0usize;
            while !flag.load(Ordering::SeqCst) {
                let key = format!("{topic}-{sent:06}");
                producer
                    .send(BaseRecord::to(&topic).key(&key).payload("v"))
                    .map_err(|(e, _)| e)?;
                sent += 1;
                std::thread::sleep(Duration::from_millis(2));
            }
            producer.flush(Duration::from_secs(180))?;
            Ok(sent)
        });
        BackgroundProducer { stop, thread }
    }

    /// Stop, wait for every delivery, and return how many were sent.
    fn finish(self) -> Result<usize> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread
            .join()
            .map_err(|_| anyhow::anyhow!("producer thread panicked"))?
    }
}

/// Read `count` messages (key, value) from the start of a single-partition
/// topic.
fn rd_consume(
    bootstrap: &str,
    topic: &str,
    count: usize,
    observer: &Observer,
) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let consumer: BaseConsumer<Observer> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("check-{topic}-{}", std::process::id()))
        .set("auto.offset.reset", "earliest")
        .set("enable.auto.commit", "false")
        .set("statistics.interval.ms", "200")
        .create_with_context(observer.clone())?;
    consumer.subscribe(&[topic])?;
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while out.len() < count && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(500)) {
            let m = match m {
                // A connection that dropped (the broker restarted under
                // the proxy a moment ago) is reported, and librdkafka
                // reconnects: a consumer goes on polling.
                Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::BrokerTransportFailure | RDKafkaErrorCode::AllBrokersDown,
                )) => continue,
                m => m?,
            };
            out.push((
                m.key().unwrap_or_default().to_vec(),
                m.payload().unwrap_or_default().to_vec(),
            ));
        }
    }
    // One more stats interval so the observer has seen every connection.
    std::thread::sleep(Duration::from_millis(400));
    let _ = consumer.poll(Duration::from_millis(100));
    Ok(out)
}

/// Every established TCP connection to `port` on loopback, as the pids of
/// the processes that own the connecting sockets.
fn connection_owners(port: u16) -> Result<Vec<u32>> {
    let mut inodes = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "01" {
                continue; // not ESTABLISHED
            }
            let remote_port = f[2]
                .rsplit(':')
                .next()
                .and_then(|p| u16::from_str_radix(p, 16).ok());
            if remote_port == Some(port) {
                inodes.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    let mut owners = Vec::new();
    for entry in std::fs::read_dir("/proc")?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        for fd in fds.flatten() {
            if let Ok(target) = std::fs::read_link(fd.path()) {
                if inodes.iter().any(|i| target.to_string_lossy() == *i) {
                    owners.push(pid);
                }
            }
        }
    }
    Ok(owners)
}

fn kv(n: usize, tag: &str) -> Vec<(String, String)> {
    (0..n)
        .map(|i| {
            (
                format!("{tag}-key-{i:05}"),
                format!("{tag} value {i} with spaces"),
            )
        })
        .collect()
}

/// Threads of process `pid` whose name starts with `prefix`.
fn threads_named(pid: u32, prefix: &str) -> Result<usize> {
    let mut n = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let comm = std::fs::read_to_string(task?.path().join("comm")).unwrap_or_default();
        n += usize::from(comm.starts_with(prefix));
    }
    Ok(n)
}

/// Produced through a proxy with one worker thread (`WORKER_THREADS=1`),
/// consumed through a second proxy with three, so both a single worker and
/// workers that hand connections to each other carry real traffic (every
/// other test runs the default, one per core).
#[test]
fn java_console_clients_round_trip_10000_records_through_the_proxy() -> Result<()> {
    let (broker, proxy) =
        local_broker_and_proxy(KafkaOptions::default(), &[("WORKER_THREADS", "1")])?;
    let threaded = ProxyProcess::start(&broker.bootstrap(), &[("WORKER_THREADS", "3")])?;
    let (one, three) = (
        threads_named(proxy.pid(), "kmp-worker")?,
        threads_named(threaded.pid(), "kmp-worker")?,
    );
    ensure!(
        three >= 3 && one < three,
        "worker threads: {one} with WORKER_THREADS=1, {three} with WORKER_THREADS=3"
    );
    tools::create_topic(&proxy.bootstrap, "console", 1, &[], &[])?;
    let sent = kv(10_000, "console");
    tools::console_produce_kv(&proxy.bootstrap, "console", &sent, &[("acks", "all")])?;
    let lines = tools::console_consume(
        &threaded.bootstrap,
        "console",
        sent.len(),
        &[("print.key", "true")],
        Duration::from_secs(30),
    )?;
    let expected: Vec<String> = sent.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    ensure!(
        lines.len() == expected.len(),
        "consumed {} of {} records",
        lines.len(),
        expected.len()
    );
    ensure!(lines == expected, "records differ after the round trip");
    for p in [&proxy, &threaded] {
        ensure!(
            !p.logs().contains("closing client connection"),
            "a connection failed:\n{}",
            p.logs()
        );
    }
    Ok(())
}

#[test]
fn rdkafka_round_trips_binary_records_and_acks0_leaves_nothing_pending() -> Result<()> {
    let (_broker, proxy) = local_broker_and_proxy(KafkaOptions::default(), &[])?;
    tools::create_topic(&proxy.bootstrap, "rd", 1, &[], &[])?;
    tools::create_topic(&proxy.bootstrap, "rd-acks0", 1, &[], &[])?;
    let observer = Observer::default();

    // Binary values with every byte value, so nothing survives by accident of
    // text encoding.
    let values: Vec<Vec<u8>> = (0..10_000u32)
        .map(|i| (0..64u32).map(|j| ((i * 31 + j * 7) % 256) as u8).collect())
        .collect();
    let producer = rd_producer(
        &proxy.bootstrap,
        &[("enable.idempotence", "true"), ("acks", "all")],
        &observer,
    )?;
    for (i, v) in values.iter().enumerate() {
        let key = format!("rd-{i:05}");
        producer
            .send(BaseRecord::to("rd").key(&key).payload(v))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(120))?;
    ensure!(
        observer.failed.load(Ordering::SeqCst) == 0,
        "deliveries failed"
    );
    ensure!(
        observer.acked.lock().map(|a| a.len()).unwrap_or(0) == values.len(),
        "not every record was acknowledged"
    );

    // acks=0: the proxy must not wait for (or mis-assign) responses the broker never sends.
    let fire_and_forget = rd_producer(&proxy.bootstrap, &[("acks", "0")], &Observer::default())?;
    for i in 0..5_000 {
        let key = format!("f-{i:05}");
        fire_and_forget
            .send(BaseRecord::to("rd-acks0").key(&key).payload("x"))
            .map_err(|(e, _)| e)?;
    }
    fire_and_forget.flush(Duration::from_secs(60))?;
    // Metadata and ApiVersions requests still get the right answers on the
    // same connections after thousands of unanswered Produce requests.
    fire_and_forget
        .client()
        .fetch_metadata(Some("rd-acks0"), Duration::from_secs(10))?;

    let got = rd_consume(&proxy.bootstrap, "rd", values.len(), &observer)?;
    ensure!(
        got.len() == values.len(),
        "consumed {} of {}",
        got.len(),
        values.len()
    );
    for (i, (k, v)) in got.iter().enumerate() {
        ensure!(
            k == format!("rd-{i:05}").as_bytes() && v == &values[i],
            "record {i} differs"
        );
    }
    let fired = rd_consume(&proxy.bootstrap, "rd-acks0", 5_000, &observer)?;
    ensure!(
        fired.len() == 5_000,
        "acks=0 records readable: {} of 5000",
        fired.len()
    );
    let logs = proxy.logs();
    ensure!(
        !logs.contains("closing client connection"),
        "a connection was closed:\n{logs}"
    );
    Ok(())
}

#[test]
fn clients_only_ever_see_and_use_proxy_addresses() -> Result<()> {
    let (broker, proxy) = local_broker_and_proxy(KafkaOptions::default(), &[])?;
    let broker_port = broker.port().to_string();

    // Kafka's own view of the cluster through the proxy.
    let versions = tools::broker_api_versions(&proxy.bootstrap)?;
    ensure!(
        versions.contains(&format!("{} (id: 1", proxy.node_address(1))),
        "broker list:\n{versions}"
    );
    ensure!(
        !versions.contains(&format!(":{broker_port} ")),
        "real broker address leaked:\n{versions}"
    );
    // Every API at the broker's own range: the proxy walks every version of
    // the APIs it interprets, and never narrows a minimum (Kafka 4 still
    // advertises Produce v0 for old librdkafka, KAFKA-18659).
    let direct = tools::broker_api_versions(&broker.bootstrap())?;
    let ranges = |text: &str| -> Vec<String> {
        text.lines()
            .map(str::trim)
            .filter(|l| l.contains("): ") && (l.contains(" to ") || l.contains("UNSUPPORTED")))
            .map(|l| l.trim_end_matches(',').to_string())
            .collect()
    };
    ensure!(
        ranges(&direct).len() > 50,
        "too few APIs parsed from the direct answer:\n{direct}"
    );
    ensure!(
        ranges(&versions) == ranges(&direct),
        "ApiVersions through the proxy differ from the broker's:\nproxy:\n{versions}\ndirect:\n{direct}"
    );
    ensure!(
        versions.contains("Produce(0): 0 to 13") && versions.contains("Fetch(1): 4 to 18"),
        "Produce and Fetch ranges:\n{versions}"
    );

    // DescribeQuorum names the controllers' listeners, which no client can
    // reach through the proxy: direct they show, through the proxy they don't.
    let quorum = |bootstrap: &str| -> Result<String> {
        let out = tools::java(
            "org.apache.kafka.tools.MetadataQuorumCommand",
            &["--bootstrap-server", bootstrap, "describe", "--status"],
        )?;
        ensure!(
            out.status.success(),
            "MetadataQuorumCommand failed: {out:?}"
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let controller = format!(":{}", broker.controller_port());
    let direct_quorum = quorum(&broker.bootstrap())?;
    ensure!(
        direct_quorum.contains(&controller),
        "direct, the quorum names the controller listener:\n{direct_quorum}"
    );
    let proxied_quorum = quorum(&proxy.bootstrap)?;
    ensure!(
        proxied_quorum.contains("LeaderId") && !proxied_quorum.contains(&controller),
        "through the proxy, the quorum without controller endpoints:\n{proxied_quorum}"
    );

    // librdkafka: every broker it knows of, and every socket it opens.
    tools::create_topic(&proxy.bootstrap, "addr", 1, &[], &[])?;
    let observer = Observer::default();
    let producer = rd_producer(
        &proxy.bootstrap,
        &[("enable.idempotence", "true")],
        &observer,
    )?;
    for i in 0..100 {
        let key = format!("k{i}");
        producer
            .send(BaseRecord::to("addr").key(&key).payload("v"))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(60))?;
    let consumed = rd_consume(&proxy.bootstrap, "addr", 100, &observer)?;
    ensure!(consumed.len() == 100, "consumed {}", consumed.len());
    let seen = observer
        .brokers
        .lock()
        .map(|b| b.clone())
        .unwrap_or_default();
    let allowed: BTreeSet<String> = [proxy.bootstrap.clone(), proxy.node_address(1)].into();
    ensure!(
        !seen.is_empty() && seen.is_subset(&allowed),
        "librdkafka saw brokers {seen:?}, allowed {allowed:?}"
    );
    ensure!(
        seen.contains(&proxy.node_address(1)),
        "librdkafka never used the per-node listener: {seen:?}"
    );

    // While the clients are connected, every TCP connection to the broker's
    // client port belongs to the proxy process.
    let owners = connection_owners(broker.port())?;
    ensure!(!owners.is_empty(), "no connections to the broker at all");
    ensure!(
        owners.iter().all(|p| *p == proxy.pid()),
        "connections to the broker from pids {owners:?}; proxy is {}",
        proxy.pid()
    );

    // The proxy's own count of the connections it opened per broker.
    let opened = proxy.metric(&format!(
        "kafka_mirror_proxy_upstream_connections_total{{listener=\"node-1\",broker=\"{}\"}}",
        broker.bootstrap()
    ))?;
    ensure!(
        opened >= 2,
        "upstream connections to node 1 counted: {opened}"
    );
    drop(producer);
    Ok(())
}

#[test]
fn idempotent_producer_keeps_its_positive_producer_id() -> Result<()> {
    let (broker, proxy) = local_broker_and_proxy(KafkaOptions::default(), &[])?;
    tools::create_topic(&proxy.bootstrap, "idem", 1, &[], &[])?;
    tools::console_produce_kv(
        &proxy.bootstrap,
        "idem",
        &kv(500, "idem"),
        &[("enable.idempotence", "true"), ("acks", "all")],
    )?;
    let mut batches = Vec::new();
    for segment in broker.segment_files("idem", 0)? {
        batches.extend(tools::dump_log_segments(&segment, false)?);
    }
    ensure!(!batches.is_empty(), "no batches on disk");
    ensure!(
        batches.iter().map(|b| b.count).sum::<i64>() == 500,
        "record count on disk"
    );
    for b in &batches {
        ensure!(
            b.producer_id >= 0,
            "producer id {} at offset {} was changed",
            b.producer_id,
            b.base_offset
        );
        ensure!(b.is_valid, "invalid CRC at offset {}", b.base_offset);
    }
    Ok(())
}

#[test]
fn tls_from_clients_to_the_proxy_and_from_the_proxy_to_a_tls_broker() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new(dir.path())?;
    let broker_cert = ca.server("broker")?;
    let proxy_cert = ca.server("proxy")?;
    let broker = KafkaCluster::start(KafkaOptions::default().security(Security::Ssl {
        cert_chain_pem: format!("{}{}", broker_cert.cert, ca.cert_pem),
        key_pem: broker_cert.key.clone(),
    }))?;
    let ca_path = ca.cert_path.to_string_lossy().into_owned();
    let proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("TLS_CERT", &proxy_cert.cert_path.to_string_lossy()),
            ("TLS_KEY", &proxy_cert.key_path.to_string_lossy()),
            ("UPSTREAM_TLS", "true"),
            ("UPSTREAM_TLS_CA", &ca_path),
        ],
    )?;
    let client = [
        ("security.protocol", "SSL"),
        ("ssl.truststore.type", "PEM"),
        ("ssl.truststore.certificates", ca.cert_pem.as_str()),
    ];
    tools::create_topic(&proxy.bootstrap, "secure", 1, &[], &client)?;
    let sent = kv(200, "tls");
    let mut produce_props = client.to_vec();
    produce_props.push(("acks", "all"));
    tools::console_produce_kv(&proxy.bootstrap, "secure", &sent, &produce_props)?;
    let mut consume_props = client.to_vec();
    consume_props.push(("print.key", "true"));
    let lines = tools::console_consume(
        &proxy.bootstrap,
        "secure",
        sent.len(),
        &consume_props,
        Duration::from_secs(30),
    )?;
    let expected: Vec<String> = sent.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    ensure!(
        lines == expected,
        "TLS round trip: got {} records",
        lines.len()
    );

    // A plaintext client cannot talk to the TLS listener.
    let mut plain = RawClient::connect(&proxy.bootstrap)?;
    plain.send_raw(&[0, 0, 0, 12, 0, 18, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0])?;
    ensure!(
        plain.closed_by_peer(),
        "plaintext bytes on the TLS listener were accepted"
    );
    Ok(())
}

#[test]
fn sasl_plain_authenticates_through_the_proxy() -> Result<()> {
    let options = KafkaOptions::default().sasl_plain("alice", "alice-secret");
    let (broker, proxy) = local_broker_and_proxy(options, &[])?;
    let good = broker.client_properties();
    tools::create_topic(&proxy.bootstrap, "sasl", 1, &[], &props_ref(&good))?;
    let sent = kv(50, "sasl");
    tools::console_produce_kv(&proxy.bootstrap, "sasl", &sent, &props_ref(&good))?;
    let mut consume = props_ref(&good);
    consume.push(("print.key", "true"));
    let lines = tools::console_consume(
        &proxy.bootstrap,
        "sasl",
        sent.len(),
        &consume,
        Duration::from_secs(30),
    )?;
    ensure!(
        lines.len() == sent.len(),
        "SASL round trip: got {} of {}",
        lines.len(),
        sent.len()
    );

    // The broker, not the proxy, judges the credentials.
    let bad = Security::SaslPlaintext {
        user: "alice".into(),
        password: "wrong".into(),
    }
    .client_properties();
    let mut bad_props = props_ref(&bad);
    bad_props.push(("max.block.ms", "10000"));
    let refused = tools::console_produce_kv(&proxy.bootstrap, "sasl", &kv(1, "bad"), &bad_props);
    let message = match refused {
        Ok(()) => bail!("a wrong password was accepted through the proxy"),
        Err(e) => format!("{e:#}"),
    };
    ensure!(
        message.contains("Authentication failed"),
        "unexpected failure: {message}"
    );
    Ok(())
}

#[test]
fn bad_input_closes_only_that_connection() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let mut proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("MAX_FRAME_BYTES", "1048576"),
            ("LINKS", "a"),
            ("LINK_A_SOURCE_CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qk"),
            ("LINK_A_TOPICS", "mirrored"),
        ],
    )?;
    tools::create_topic(&proxy.bootstrap, "steady", 1, &[], &[])?;

    // A well-behaved client keeps producing the whole time.
    let observer = Observer::default();
    let background = BackgroundProducer::start(&proxy.bootstrap, "steady", &observer);

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "garbage frame",
            vec![0, 0, 0, 3, 0xde, 0xad, 0xbe],
            "malformed request header",
        ),
        ("negative size", vec![0xff, 0xff, 0xff, 0x00], "is negative"),
        (
            "frame over the maximum",
            (2u32 * 1024 * 1024).to_be_bytes().to_vec(),
            "exceeds the maximum of 1048576 bytes",
        ),
        (
            "unknown API key",
            // api key 9999, version 0, correlation 1, client id "x"
            vec![0, 0, 0, 11, 0x27, 0x0f, 0, 0, 0, 0, 0, 1, 0, 1, b'x'],
            "broker closed the connection",
        ),
        (
            "unparseable Produce body from a mirror link",
            // Produce v9, correlation 1, client id "mirror-a", empty tagged
            // fields, then a body that ends in the middle of the topic array.
            {
                let mut body = vec![0, 0, 0, 9, 0, 0, 0, 1, 0, 8];
                body.extend_from_slice(b"mirror-a");
                body.extend_from_slice(&[0, 0, 0xff, 0xff, 0, 0, 0x75, 0x30, 0x05, 0x02]);
                let mut framed = (body.len() as u32).to_be_bytes().to_vec();
                framed.extend(body);
                framed
            },
            "unparseable Produce v9 body",
        ),
    ];
    // Produce requests on the link's client id whose array counts are forged:
    // each of these aborted the whole process before the bounded walk.
    let link_produce = |version: u8, body: &[u8]| {
        let mut frame = vec![0, 0, 0, version, 0, 0, 0, 1, 0, 8];
        frame.extend_from_slice(b"mirror-a");
        if version >= 9 {
            frame.push(0); // request header v2: no tagged fields
        }
        frame.extend_from_slice(body);
        let mut framed = (frame.len() as u32).to_be_bytes().to_vec();
        framed.extend(frame);
        framed
    };
    // null transactional id, acks -1, timeout 30 s
    let head = [0xff, 0xff, 0xff, 0xff, 0, 0, 0x75, 0x30];
    let topic = [0, 8, b'm', b'i', b'r', b'r', b'o', b'r', b'e', b'd'];
    let one_partition = [0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    let forged_v8 = [&head[..], &[0x10, 0, 0, 1], &topic, &one_partition].concat();
    let forged_v9 = [&[0][..], &head[2..], &[0x80, 0x80, 0x80, 0x80, 0x08]].concat();
    // Valid v3 with three bytes of the topic count cut: it merges with the name.
    let cut_v3 = [
        &[0xff, 0xff][..],
        &head[2..],
        &[0, 1],
        &topic,
        &one_partition,
    ]
    .concat();
    let mut cases = cases;
    cases.push((
        "Produce v8 with topic count 0x10000001",
        link_produce(8, &forged_v8),
        "unparseable Produce v8 body",
    ));
    cases.push((
        "Produce v9 with topic count varint 2^31",
        link_produce(9, &forged_v9),
        "unparseable Produce v9 body",
    ));
    cases.push((
        "Produce v3 with bytes deleted",
        link_produce(3, &cut_v3),
        "unparseable Produce v3 body",
    ));
    for (what, bytes, logged) in &cases {
        let mut client = RawClient::connect(&proxy.bootstrap)?;
        client.send_raw(bytes)?;
        ensure!(
            client.closed_by_peer(),
            "{what}: the connection stayed open"
        );
        proxy
            .wait_for_log(logged, Duration::from_secs(30))
            .with_context(|| format!("{what}: no log line saying {logged:?}"))?;
    }
    let sent = background.finish()?;
    ensure!(
        observer.failed.load(Ordering::SeqCst) == 0,
        "the well-behaved producer saw failures"
    );
    let acked = observer.acked.lock().map(|a| a.len()).unwrap_or(0);
    ensure!(acked == sent, "acknowledged {acked} of {sent}");
    let got = rd_consume(&proxy.bootstrap, "steady", sent, &Observer::default())?;
    ensure!(got.len() == sent, "read back {} of {sent}", got.len());

    // An API key chosen on the wire gets no series of its own.
    let (_, metrics) = proxy.admin_get("/metrics")?;
    ensure!(
        proxy.metric("kafka_mirror_proxy_requests_total{api_key=\"unknown\"}")? == 1,
        "api key 9999 must count as unknown:\n{metrics}"
    );
    ensure!(!metrics.contains("api_key=\"9999\""), "{metrics}");
    ensure!(
        proxy.metric("kafka_mirror_proxy_connections_closed_total{reason=\"frame_too_large\"}")?
            == 1,
        "{metrics}"
    );
    Ok(())
}

#[test]
fn producer_recovers_through_the_proxy_when_the_broker_restarts() -> Result<()> {
    let mut broker = KafkaCluster::start(KafkaOptions::default())?;
    let proxy = ProxyProcess::start(&broker.bootstrap(), &[])?;
    tools::create_topic(&proxy.bootstrap, "restart", 1, &[], &[])?;
    let observer = Observer::default();
    let background = BackgroundProducer::start(&proxy.bootstrap, "restart", &observer);
    let wait_acked = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(120);
        while observer.acked.lock().map(|a| a.len()).unwrap_or(0) < n && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_acked(500);
    let before = observer.acked.lock().map(|a| a.len()).unwrap_or(0);
    broker.restart()?;
    wait_acked(before + 500);
    let sent = background.finish()?;
    let acked: Vec<String> = observer.acked.lock().map(|a| a.clone()).unwrap_or_default();
    ensure!(
        acked.len() > before + 500,
        "no progress after the restart: {} acked, {before} before",
        acked.len()
    );

    let got = rd_consume(
        &proxy.bootstrap,
        "restart",
        acked.len(),
        &Observer::default(),
    )?;
    let on_broker: HashMap<String, ()> = got
        .iter()
        .map(|(k, _)| (String::from_utf8_lossy(k).into_owned(), ()))
        .collect();
    let missing: Vec<&String> = acked
        .iter()
        .filter(|k| !on_broker.contains_key(*k))
        .collect();
    ensure!(
        missing.is_empty(),
        "{} acknowledged records lost, e.g. {:?}",
        missing.len(),
        missing.first()
    );
    eprintln!(
        "sent {sent}, acknowledged {}, read {}",
        acked.len(),
        got.len()
    );
    ensure!(
        proxy.logs().contains("broker closed the connection"),
        "the proxy did not log the broker going away"
    );
    Ok(())
}

/// What a client sees when it dials `addr` and asks for ApiVersions.
#[derive(Debug, PartialEq)]
enum Dial {
    Refused,
    /// Accepted, then closed without an answer.
    Dropped,
    Served,
}

fn dial(addr: &str) -> Dial {
    use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
    let mut client = match RawClient::connect(addr) {
        Ok(c) => c,
        Err(e) => {
            let refused = e
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
            return if refused {
                Dial::Refused
            } else {
                Dial::Dropped
            };
        }
    };
    let sent = client.send(
        ApiKey::ApiVersions,
        3,
        "dial",
        &ApiVersionsRequest::default(),
    );
    match (sent, client.recv_frame()) {
        (Ok(_), Ok(Some(_))) => Dial::Served,
        _ => Dial::Dropped,
    }
}

#[test]
fn a_dead_brokers_ports_refuse_connections_until_it_is_back() -> Result<()> {
    let mut broker = KafkaCluster::start(KafkaOptions::default())?;
    let proxy = ProxyProcess::start(&broker.bootstrap(), &[])?;
    // Opens node 1's listener.
    tools::create_topic(&proxy.bootstrap, "dead", 1, &[], &[])?;
    let node = proxy.node_address(1);
    ensure!(
        dial(&node) == Dial::Served,
        "node port not serving at first"
    );

    broker.node().kill();
    // The first dial finds the broker gone (accepted, then closed, as the
    // proxy learns it only then); every later one is refused by the kernel.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.last() != Some(&Dial::Refused) && Instant::now() < deadline {
        seen.push(dial(&node));
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(
        seen.last() == Some(&Dial::Refused),
        "node port never refused while its broker was down: {seen:?}"
    );
    ensure!(
        seen.len() <= 2,
        "more than one client was accepted and dropped before the port closed: {seen:?}"
    );
    for _ in 0..5 {
        let d = dial(&node);
        ensure!(
            d == Dial::Refused,
            "node port not refused while down: {d:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The bootstrap port follows the only bootstrap broker.
    let mut bootstrap = Vec::new();
    while bootstrap.last() != Some(&Dial::Refused) && bootstrap.len() < 3 {
        bootstrap.push(dial(&proxy.bootstrap));
    }
    ensure!(
        bootstrap.last() == Some(&Dial::Refused),
        "bootstrap port not refused while its only broker is down: {bootstrap:?}"
    );
    ensure!(
        proxy.metric("kafka_mirror_proxy_broker_unreachable{listener=\"node-1\"}")? == 1,
        "metrics do not show node 1 unreachable"
    );

    broker.restart()?;
    // Probes back off to 5 s at most: both ports serve again soon after.
    for addr in [&node, &proxy.bootstrap] {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut last = dial(addr);
        while last != Dial::Served && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(250));
            last = dial(addr);
        }
        ensure!(
            last == Dial::Served,
            "{addr} not served after the broker came back: {last:?}"
        );
    }
    ensure!(
        proxy.metric("kafka_mirror_proxy_broker_unreachable{listener=\"node-1\"}")? == 0,
        "metrics still show node 1 unreachable"
    );
    let logs = proxy.logs();
    ensure!(
        logs.contains("closing its proxy port") && logs.contains("reopening its proxy port"),
        "the proxy did not log the outage and the recovery"
    );
    Ok(())
}
