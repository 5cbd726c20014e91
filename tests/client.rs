//! The proxy's own Kafka client (`kafka_mirror_proxy::client`) against real
//! KRaft brokers: a compacted topic, raw batches produced and fetched back
//! byte for byte, offsets, a broker restart ridden out with retries, SASL
//! PLAIN and SCRAM with right and wrong credentials. Small scripted brokers
//! cover what one real broker cannot show: a partition leader moving to
//! another broker, a broker that never answers, a forged response.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsResponse, BrokerId, MetadataResponse, ProduceResponse, ResponseHeader,
    TopicName,
};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use uuid::Uuid;

use kafka_mirror_proxy::client::protocol::{OffsetSpec, Produced};
use kafka_mirror_proxy::client::{Client, ClientConfig, ClientError, CompactedTopic};
use kafka_mirror_proxy::config::Config;
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_mirror_proxy::wire::batch::{self, NewBatch, NewRecord};
use kafka_mirror_proxy::wire::sasl::{Credentials, Mechanism};
use support::certs::TestCa;
use support::crate_client::{new_topic, runtime};
use support::kafka::{KafkaCluster, KafkaOptions, Security};

const T0: i64 = 1_700_000_000_000;

fn config(bootstrap: &str, sasl: Option<Credentials>) -> ClientConfig {
    let upstream = Upstream {
        tls: None,
        server_name: None,
        timeout: Duration::from_secs(5),
    };
    let mut c = ClientConfig::new(vec![bootstrap.to_string()], upstream);
    c.sasl = sasl;
    c
}

fn credentials(mechanism: Mechanism, user: &str, password: &str) -> Credentials {
    Credentials {
        mechanism,
        username: user.into(),
        password: password.into(),
    }
}

/// A batch of keyed records (compacted topics refuse records without a
/// key), the i-th at `timestamp + i`.
fn keyed_batch(records: &[(&str, &str)], timestamp: i64) -> Bytes {
    let records: Vec<NewRecord> = records
        .iter()
        .enumerate()
        .map(|(i, (k, v))| NewRecord {
            key: Some(k.as_bytes()),
            value: Some(v.as_bytes()),
            headers: &[],
            timestamp: timestamp + i as i64,
        })
        .collect();
    Bytes::from(batch::build(&NewBatch::NO_PRODUCER, &records).expect("batch"))
}

fn base_offset(p: Produced) -> Result<i64> {
    match p {
        Produced::Appended { base_offset, .. } => Ok(base_offset),
        other => bail!("not appended: {other:?}"),
    }
}

#[test]
fn compacted_topic_raw_batches_and_offsets() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    runtime()?.block_on(async {
        let client = Client::new(config(&broker.bootstrap(), None));
        let brokers = client.brokers().await?;
        ensure!(
            brokers.len() == 1 && brokers[0].address() == broker.bootstrap(),
            "{brokers:?}"
        );

        // Created compacted, then found compacted.
        let state = "__mirror_state";
        let created = client.ensure_compacted_topic(state, 1).await?;
        ensure!(
            created
                == CompactedTopic {
                    created: true,
                    cleanup_policy: "compact".into(),
                    compression: "producer".into(),
                },
            "{created:?}"
        );
        let found = client.ensure_compacted_topic(state, 1).await?;
        ensure!(
            !found.created && found.cleanup_policy == "compact" && found.compression == "producer",
            "{found:?}"
        );
        let configs = client
            .describe_topic_config(
                state,
                &["cleanup.policy", "min.insync.replicas", "compression.type"],
            )
            .await?;
        ensure!(
            configs.get("cleanup.policy") == Some(&Some("compact".into()))
                && configs.get("min.insync.replicas") == Some(&Some("1".into()))
                && configs.get("compression.type") == Some(&Some("producer".into())),
            "{configs:?}"
        );
        // An existing topic that is not compacted is reported, not used.
        client
            .create_topic(&new_topic("plain", 1, &[("cleanup.policy", "delete")]))
            .await?;
        match client.ensure_compacted_topic("plain", 1).await {
            Err(ClientError::NotCompacted { topic, policy })
                if topic == "plain" && policy == "delete" => {}
            other => bail!("expected NotCompacted for a delete topic, got {other:?}"),
        }

        // Raw batches in, base offsets out.
        let sent = [
            keyed_batch(&[("k1", "a"), ("k2", "b")], T0),
            keyed_batch(&[("k3", "c")], T0 + 10),
            keyed_batch(&[("k1", "d"), ("k4", "e")], T0 + 20),
        ];
        let mut offsets = Vec::new();
        for b in &sent {
            offsets.push(base_offset(client.produce(state, 0, b.clone()).await?)?);
        }
        ensure!(offsets == [0, 2, 3], "base offsets {offsets:?}");

        // Fetched back byte for byte, but for the two fields outside the CRC
        // that the broker stamps: baseOffset and partitionLeaderEpoch.
        let epoch = client.topic(state).await?.partitions[0].leader_epoch;
        let mut expected = Vec::new();
        for (b, offset) in sent.iter().zip(&offsets) {
            let mut b = b.to_vec();
            b[0..8].copy_from_slice(&offset.to_be_bytes());
            b[12..16].copy_from_slice(&epoch.to_be_bytes());
            expected.extend_from_slice(&b);
        }
        let all = client.fetch(state, 0, 0, 1 << 20, Duration::ZERO).await?;
        ensure!(all.records[..] == expected[..], "fetched records differ");
        ensure!(
            (all.high_watermark, all.log_start_offset) == (5, 0),
            "{all:?}"
        );

        // The byte bound: the broker cuts the answer at max_bytes, through
        // the middle of a batch if need be, and returns at least one whole
        // batch even under a smaller bound.
        let (first, second) = (sent[0].len(), sent[1].len());
        let bound = first + second - 1;
        let cut = client
            .fetch(state, 0, 0, i32::try_from(bound)?, Duration::ZERO)
            .await?;
        ensure!(
            cut.records[..] == expected[..bound],
            "{} bytes under a bound of {bound}",
            cut.records.len()
        );
        let one = client.fetch(state, 0, 0, 1, Duration::ZERO).await?;
        ensure!(
            one.records[..] == expected[..first],
            "{} bytes",
            one.records.len()
        );
        let middle = client.fetch(state, 0, 2, 1 << 20, Duration::ZERO).await?;
        ensure!(
            middle.records[..] == expected[first..],
            "fetch from offset 2"
        );
        // At the end: nothing, after waiting for data that does not come.
        let start = Instant::now();
        let end = client
            .fetch(state, 0, 5, 1 << 20, Duration::from_millis(400))
            .await?;
        ensure!(
            end.records.is_empty() && start.elapsed() >= Duration::from_millis(300),
            "{end:?} after {:?}",
            start.elapsed()
        );

        // Offsets.
        let earliest = client.list_offset(state, 0, OffsetSpec::Earliest).await?;
        let latest = client.list_offset(state, 0, OffsetSpec::Latest).await?;
        let at = client
            .list_offset(state, 0, OffsetSpec::Timestamp(T0 + 5))
            .await?;
        let after = client
            .list_offset(state, 0, OffsetSpec::Timestamp(T0 + 1000))
            .await?;
        ensure!(
            (earliest.offset, latest.offset) == (0, 5),
            "{earliest:?} {latest:?}"
        );
        ensure!((at.offset, at.timestamp) == (2, T0 + 10), "{at:?}");
        ensure!(after.offset == -1, "{after:?}");

        // A client-written control batch (the failover barrier's shape) is
        // answered, not retried: a stock broker refuses it.
        let barrier = batch::build(
            &NewBatch {
                control: true,
                ..NewBatch::NO_PRODUCER
            },
            &[NewRecord {
                key: Some(&[0, 0, 0, 7]),
                value: Some(b"\0\0\x17MkU3OEVBNTcwNTJENDM2Qk\0"),
                headers: &[],
                timestamp: T0,
            }],
        )?;
        match client.produce(state, 0, Bytes::from(barrier)).await? {
            // (Kafka 4.4 sends no error message with it.)
            Produced::Refused { code: 87, .. } => {}
            other => bail!("expected INVALID_RECORD, got {other:?}"),
        }
        let latest = client.list_offset(state, 0, OffsetSpec::Latest).await?;
        ensure!(
            latest.offset == 5,
            "the refused batch was written: {latest:?}"
        );

        // An unknown partition is retried until the operation timeout, then
        // reported with the broker's error.
        let mut impatient = config(&broker.bootstrap(), None);
        impatient.operation_timeout = Duration::from_secs(1);
        let impatient = Client::new(impatient);
        let e = impatient
            .produce("no-such-topic", 0, sent[0].clone())
            .await
            .expect_err("unknown topic");
        ensure!(
            matches!(e, ClientError::GaveUp { attempts, .. } if attempts > 1)
                && e.code() == Some(3),
            "{e}"
        );
        Ok(())
    })
}

#[test]
fn a_broker_restart_is_ridden_out_with_retries() -> Result<()> {
    let mut broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let mut c = config(&broker.bootstrap(), None);
    c.operation_timeout = Duration::from_secs(120);
    let client = Client::new(c);
    rt.block_on(async {
        client.create_topic(&new_topic("restart", 1, &[])).await?;
        let first = client
            .produce("restart", 0, keyed_batch(&[("a", "1")], T0))
            .await?;
        ensure!(base_offset(first)? == 0);
        Ok(())
    })?;

    broker.stop()?;
    let c = client.clone();
    let pending = rt.spawn(async move {
        c.produce("restart", 0, keyed_batch(&[("b", "2")], T0 + 1))
            .await
    });
    std::thread::sleep(Duration::from_secs(2));
    ensure!(
        !pending.is_finished(),
        "the produce ended while the broker was down"
    );
    broker.restart()?;
    let produced = rt
        .block_on(async { tokio::time::timeout(Duration::from_secs(120), pending).await })
        .context("produce still pending two minutes after the restart")???;
    ensure!(base_offset(produced)? == 1);
    let fetched = rt.block_on(client.fetch("restart", 0, 0, 1 << 20, Duration::ZERO))?;
    let batches = batch::Batches::new(&fetched.records).count();
    ensure!(batches == 2, "{batches} batches after the restart");
    Ok(())
}

#[test]
fn sasl_plain_and_scram_with_right_and_wrong_credentials() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default().sasl_plain("alice", "alice-secret"))?;
    runtime()?.block_on(async {
        for mechanism in [
            Mechanism::Plain,
            Mechanism::ScramSha256,
            Mechanism::ScramSha512,
        ] {
            let good = Client::new(config(
                &broker.bootstrap(),
                Some(credentials(mechanism, "alice", "alice-secret")),
            ));
            let name = format!("sasl-{}", mechanism.name().to_lowercase());
            good.create_topic(&new_topic(&name, 1, &[])).await?;
            let sent = keyed_batch(&[("k", mechanism.name())], T0);
            ensure!(base_offset(good.produce(&name, 0, sent.clone()).await?)? == 0);
            let fetched = good.fetch(&name, 0, 0, 1 << 20, Duration::ZERO).await?;
            ensure!(
                fetched.records.len() == sent.len() && fetched.records[16..] == sent[16..],
                "{mechanism}: fetched records differ"
            );

            for (user, password) in [("alice", "wrong"), ("mallory", "alice-secret")] {
                let bad = Client::new(config(
                    &broker.bootstrap(),
                    Some(credentials(mechanism, user, password)),
                ));
                let start = Instant::now();
                match bad.brokers().await {
                    Err(e @ ClientError::Authentication { .. })
                        if matches!(&e, ClientError::Authentication { mechanism: m, message, .. }
                            if *m == mechanism.name() && message.contains("SASL_AUTHENTICATION_FAILED")) =>
                    {
                        eprintln!("{mechanism} as {user}: {e}");
                    }
                    other => bail!("{mechanism} as {user}: expected an authentication error, got {other:?}"),
                }
                // Not retried: wrong credentials stay wrong.
                ensure!(start.elapsed() < Duration::from_secs(10), "{:?}", start.elapsed());
            }
        }

        // Without SASL the broker hangs up at the first request after
        // ApiVersions; the client retries that (a broker may be restarting)
        // and then says what happened.
        let mut plain = config(&broker.bootstrap(), None);
        plain.operation_timeout = Duration::from_secs(1);
        match Client::new(plain).brokers().await {
            Err(ClientError::GaveUp { last, .. })
                if matches!(*last, ClientError::Closed { .. } | ClientError::Io { .. } | ClientError::Frame { .. }) => {}
            other => bail!("expected the broker to hang up, got {other:?}"),
        }
        Ok(())
    })
}

#[test]
fn tls_to_the_brokers_from_the_proxys_configuration() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new(dir.path())?;
    let cert = ca.server("broker")?;
    let broker = KafkaCluster::start(KafkaOptions::default().security(Security::Ssl {
        cert_chain_pem: format!("{}{}", cert.cert, ca.cert_pem),
        key_pem: cert.key.clone(),
    }))?;
    let vars = |tls: bool| {
        let mut v: std::collections::HashMap<String, String> = [
            ("MIRROR_PROXY_BOOTSTRAP_SERVERS", broker.bootstrap()),
            ("MIRROR_PROXY_LISTEN", "127.0.0.1:0".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        if tls {
            v.insert("MIRROR_PROXY_UPSTREAM_TLS".into(), "true".into());
            v.insert(
                "MIRROR_PROXY_UPSTREAM_TLS_CA".into(),
                ca.cert_path.to_string_lossy().into_owned(),
            );
        }
        v
    };
    let config = Config::from_vars(&vars(true)).map_err(|e| anyhow::anyhow!("{e}"))?;
    let client = Client::new(ClientConfig::from_config(&config)?);
    runtime()?.block_on(async {
        client.create_topic(&new_topic("secure", 1, &[])).await?;
        let sent = keyed_batch(&[("k", "over TLS")], T0);
        ensure!(base_offset(client.produce("secure", 0, sent.clone()).await?)? == 0);
        let fetched = client
            .fetch("secure", 0, 0, 1 << 20, Duration::ZERO)
            .await?;
        ensure!(
            fetched.records.len() == sent.len() && fetched.records[16..] == sent[16..],
            "fetched records differ"
        );

        // Without UPSTREAM_TLS the broker never answers in Kafka's framing.
        let plain = Config::from_vars(&vars(false)).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut plain = ClientConfig::from_config(&plain)?;
        plain.request_timeout = Duration::from_secs(2);
        plain.operation_timeout = Duration::from_secs(1);
        let e = Client::new(plain)
            .brokers()
            .await
            .expect_err("plaintext to TLS");
        ensure!(matches!(e, ClientError::GaveUp { .. }), "{e}");
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Scripted brokers.

/// Answer one request: `None` sends nothing back.
type Script = Arc<dyn Fn(ApiKey, i16) -> Option<Vec<u8>> + Send + Sync>;

/// A listener that answers every request of every connection with `script`
/// (the response body; the header is added). Returns its address and a
/// count of connections accepted.
async fn scripted_broker(script: Script) -> Result<(String, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr: SocketAddr = listener.local_addr()?;
    let connections = Arc::new(AtomicUsize::new(0));
    let accepted = Arc::clone(&connections);
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            accepted.fetch_add(1, Ordering::SeqCst);
            let script = Arc::clone(&script);
            tokio::spawn(async move {
                loop {
                    let Ok(size) = socket.read_i32().await else {
                        return;
                    };
                    let mut frame = vec![0u8; size as usize];
                    if socket.read_exact(&mut frame).await.is_err() {
                        return;
                    }
                    let mut buf = Bytes::from(frame);
                    let Ok(header) = decode_request_header_from_buffer(&mut buf) else {
                        return;
                    };
                    let Ok(api) = ApiKey::try_from(header.request_api_key) else {
                        return;
                    };
                    let version = header.request_api_version;
                    let Some(body) = script(api, version) else {
                        continue;
                    };
                    let mut out = BytesMut::new();
                    ResponseHeader::default()
                        .with_correlation_id(header.correlation_id)
                        .encode(&mut out, api.response_header_version(version))
                        .expect("header");
                    out.extend_from_slice(&body);
                    let mut framed = (out.len() as i32).to_be_bytes().to_vec();
                    framed.extend_from_slice(&out);
                    if socket.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Ok((addr.to_string(), connections))
}

fn encode<T: Encodable>(body: &T, version: i16) -> Vec<u8> {
    let mut out = BytesMut::new();
    body.encode(&mut out, version).expect("encode");
    out.to_vec()
}

fn api_versions(version: i16) -> Vec<u8> {
    let key = |k: ApiKey, min: i16, max: i16| {
        ApiVersion::default()
            .with_api_key(k as i16)
            .with_min_version(min)
            .with_max_version(max)
    };
    encode(
        &ApiVersionsResponse::default().with_api_keys(vec![
            key(ApiKey::ApiVersions, 0, 4),
            key(ApiKey::Metadata, 0, 12),
            key(ApiKey::Produce, 3, 11),
        ]),
        version,
    )
}

#[test]
fn a_moved_leader_is_followed() -> Result<()> {
    runtime()?.block_on(async {
        // Two brokers; partition t-0 is led by node `leader`.
        let leader = Arc::new(AtomicI32::new(1));
        let addresses: Arc<std::sync::Mutex<Vec<(i32, String)>>> = Arc::default();
        let produced: Arc<[AtomicUsize; 3]> = Arc::default();
        let metadata_asked = Arc::new(AtomicUsize::new(0));
        let mut nodes = Vec::new();
        for node in 1..=2 {
            let (leader, known, produced, metadata_asked) = (
                Arc::clone(&leader),
                Arc::clone(&addresses),
                Arc::clone(&produced),
                Arc::clone(&metadata_asked),
            );
            let script: Script = Arc::new(move |api, version| match api {
                ApiKey::ApiVersions => Some(api_versions(version)),
                ApiKey::Metadata => {
                    metadata_asked.fetch_add(1, Ordering::SeqCst);
                    let brokers = known
                        .lock()
                        .expect("addresses")
                        .iter()
                        .map(|(id, addr)| {
                            let (host, port) = addr.rsplit_once(':').expect("host:port");
                            MetadataResponseBroker::default()
                                .with_node_id(BrokerId(*id))
                                .with_host(StrBytes::from_string(host.into()))
                                .with_port(port.parse().expect("port"))
                        })
                        .collect();
                    let now = leader.load(Ordering::SeqCst);
                    Some(encode(
                        &MetadataResponse::default()
                            .with_controller_id(BrokerId(1))
                            .with_brokers(brokers)
                            .with_topics(vec![MetadataResponseTopic::default()
                                .with_name(Some(TopicName(StrBytes::from_static_str("t"))))
                                .with_topic_id(Uuid::from_u128(7))
                                .with_partitions(vec![MetadataResponsePartition::default()
                                    .with_partition_index(0)
                                    .with_leader_id(BrokerId(now))
                                    .with_leader_epoch(now * 10)])]),
                        version,
                    ))
                }
                ApiKey::Produce => {
                    produced[node as usize].fetch_add(1, Ordering::SeqCst);
                    let is_leader = leader.load(Ordering::SeqCst) == node;
                    let partition = PartitionProduceResponse::default()
                        .with_index(0)
                        .with_error_code(if is_leader { 0 } else { 6 })
                        .with_base_offset(if is_leader { 40 + i64::from(node) } else { -1 });
                    Some(encode(
                        &ProduceResponse::default().with_responses(vec![
                            TopicProduceResponse::default()
                                .with_name(TopicName(StrBytes::from_static_str("t")))
                                .with_partition_responses(vec![partition]),
                        ]),
                        version,
                    ))
                }
                _ => None,
            });
            let (addr, _) = scripted_broker(script).await?;
            addresses
                .lock()
                .expect("addresses")
                .push((node, addr.clone()));
            nodes.push(addr);
        }

        let client = Client::new(config(&nodes[0], None));
        let records = keyed_batch(&[("k", "v")], T0);
        ensure!(base_offset(client.produce("t", 0, records.clone()).await?)? == 41);
        // The leader moves to node 2; node 1 now answers NOT_LEADER_OR_FOLLOWER.
        leader.store(2, Ordering::SeqCst);
        ensure!(base_offset(client.produce("t", 0, records).await?)? == 42);
        let counts = [
            produced[1].load(Ordering::SeqCst),
            produced[2].load(Ordering::SeqCst),
        ];
        ensure!(counts == [2, 1], "produce requests per node: {counts:?}");
        // One lookup for the first produce, one after NOT_LEADER_OR_FOLLOWER.
        let asked = metadata_asked.load(Ordering::SeqCst);
        ensure!(asked == 2, "{asked} metadata requests");
        Ok(())
    })
}

#[test]
fn a_silent_broker_times_out_and_a_forged_answer_is_refused() -> Result<()> {
    runtime()?.block_on(async {
        // Never answers.
        let (silent, _) = scripted_broker(Arc::new(|_, _| None)).await?;
        let mut c = config(&silent, None);
        c.request_timeout = Duration::from_millis(300);
        c.operation_timeout = Duration::from_secs(1);
        let start = Instant::now();
        match Client::new(c).brokers().await {
            Err(ClientError::GaveUp { last, attempts, .. })
                if attempts > 1
                    && matches!(
                        *last,
                        ClientError::Timeout {
                            api: "ApiVersions",
                            ms: 300,
                            ..
                        }
                    ) => {}
            other => bail!("expected ApiVersions timeouts, got {other:?}"),
        }
        ensure!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );

        // Answers ApiVersions with an api_keys count of 2^28 in a 20-byte
        // body: refused by the schema walk, never decoded, not retried.
        let (forged, connections) = scripted_broker(Arc::new(|api, _| {
            (api == ApiKey::ApiVersions).then(|| {
                let mut body = vec![0, 0, 0x80, 0x80, 0x80, 0x80, 0x01];
                body.extend_from_slice(&[0; 13]);
                body
            })
        }))
        .await?;
        match Client::new(config(&forged, None)).brokers().await {
            Err(ClientError::Malformed {
                api: "ApiVersions",
                cause,
                ..
            }) if cause.to_string().contains("count") => {}
            other => bail!("expected a malformed ApiVersions response, got {other:?}"),
        }
        ensure!(connections.load(Ordering::SeqCst) == 1);
        Ok(())
    })
}
