//! Connection hardening against real brokers, through the proxy binary:
//! frame memory (announced sizes, the shared budget), timeouts (stalled
//! frames, idle connections, TLS handshakes), the connection limit, the
//! default node ports (node 0), graceful shutdown on SIGTERM, and what an
//! idle connection costs.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, FetchRequest, FetchResponse,
    MetadataRequest, MetadataResponse, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use support::certs::TestCa;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{produce_request, record_batch, RawClient};

/// What a read from the proxy gave.
enum Recv {
    Frame(Bytes),
    Closed,
    /// Nothing within the wait.
    Silent,
}

/// A plain TCP Kafka client with exact control over bytes and read waits.
struct Conn {
    s: TcpStream,
    correlation: i32,
}

impl Conn {
    fn connect(addr: &str) -> Result<Conn> {
        let s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        Ok(Conn { s, correlation: 0 })
    }

    fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.s.write_all(bytes)?;
        Ok(())
    }

    /// Send a request; returns its correlation id.
    fn send<T: Encodable>(&mut self, api: ApiKey, version: i16, body: &T) -> Result<i32> {
        self.correlation += 1;
        let framed = encode(api, version, self.correlation, body)?;
        self.send_raw(&framed)?;
        Ok(self.correlation)
    }

    fn recv(&mut self, wait: Duration) -> Result<Recv> {
        use std::io::ErrorKind::*;
        self.s.set_read_timeout(Some(wait))?;
        let mut size = [0u8; 4];
        let mut got = 0;
        while got < 4 {
            match self.s.read(&mut size[got..]) {
                Ok(0) => return Ok(Recv::Closed),
                Ok(n) => got += n,
                Err(e) if matches!(e.kind(), WouldBlock | TimedOut) && got == 0 => {
                    return Ok(Recv::Silent)
                }
                Err(e) if matches!(e.kind(), ConnectionReset | ConnectionAborted) => {
                    return Ok(Recv::Closed)
                }
                Err(e) => return Err(e.into()),
            }
        }
        self.s.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
        self.s.read_exact(&mut body)?;
        Ok(Recv::Frame(Bytes::from(body)))
    }

    /// The response to request `correlation`, decoded.
    fn response<T: Decodable>(&mut self, api: ApiKey, version: i16, correlation: i32) -> Result<T> {
        let mut frame = match self.recv(Duration::from_secs(60))? {
            Recv::Frame(f) => f,
            Recv::Closed => bail!("connection closed instead of the {api:?} response"),
            Recv::Silent => bail!("no {api:?} response within 60 s"),
        };
        let header = ResponseHeader::decode(&mut frame, api.response_header_version(version))?;
        ensure!(
            header.correlation_id == correlation,
            "{api:?} response with correlation id {} while {correlation} was expected",
            header.correlation_id
        );
        T::decode(&mut frame, version)
    }

    /// How long until the proxy closes the connection, or `None` if it is
    /// still open after `limit`.
    fn closed_within(&mut self, limit: Duration) -> Result<Option<Duration>> {
        let start = Instant::now();
        loop {
            let left = limit.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            match self.recv(left)? {
                Recv::Closed => return Ok(Some(start.elapsed())),
                Recv::Frame(_) => continue,
                Recv::Silent => return Ok(None),
            }
        }
    }

    fn api_versions(&mut self) -> Result<()> {
        let c = self.send(ApiKey::ApiVersions, 3, &api_versions_request())?;
        let r: ApiVersionsResponse = self.response(ApiKey::ApiVersions, 3, c)?;
        ensure!(r.error_code == 0, "ApiVersions error {}", r.error_code);
        Ok(())
    }
}

fn encode<T: Encodable>(api: ApiKey, version: i16, correlation: i32, body: &T) -> Result<Vec<u8>> {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("hardening")));
    let mut buf = BytesMut::new();
    header.encode(&mut buf, api.request_header_version(version))?;
    body.encode(&mut buf, version)?;
    let mut framed = (buf.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&buf);
    Ok(framed)
}

fn api_versions_request() -> ApiVersionsRequest {
    ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("hardening"))
        .with_client_software_version(StrBytes::from_static_str("1"))
}

/// A Fetch from the start of partition 0 that the broker holds for
/// `wait_ms` (it asks for more bytes than the partition has).
fn long_fetch(topic: &str, wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(50_000_000)
        .with_max_bytes(52_428_800)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_current_leader_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1_048_576)])])
}

const FETCH_VERSION: i16 = 12;
const PRODUCE_VERSION: i16 = 9;

/// Create `topic` through the proxy by asking for its metadata (the broker
/// auto-creates topics), and wait until partition 0 has a leader.
fn auto_create_topic(proxy: &str, topic: &str) -> Result<()> {
    let mut c = Conn::connect(proxy)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let request = MetadataRequest::default()
            .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(
                TopicName(StrBytes::from_string(topic.to_string())),
            ))]))
            .with_allow_auto_topic_creation(true);
        let id = c.send(ApiKey::Metadata, 12, &request)?;
        let r: MetadataResponse = c.response(ApiKey::Metadata, 12, id)?;
        let ready = r.topics.first().is_some_and(|t| {
            t.error_code == 0 && t.partitions.first().is_some_and(|p| p.leader_id.0 >= 0)
        });
        if ready {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "topic {topic} never got a leader"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A framed Produce request of exactly `size` bytes after the size prefix.
fn produce_frame_of_size(topic: &str, size: usize, correlation: i32) -> Result<Vec<u8>> {
    let mut value_len = size.saturating_sub(200);
    for _ in 0..20 {
        let value = "x".repeat(value_len);
        let framed = encode(
            ApiKey::Produce,
            PRODUCE_VERSION,
            correlation,
            &produce_request(topic, 0, record_batch(-1, &[&value])),
        )?;
        let len = framed.len() - 4;
        if len == size {
            return Ok(framed);
        }
        value_len = (value_len + size).checked_sub(len).context("frame size")?;
    }
    bail!("could not build a Produce frame of {size} bytes")
}

fn closed_metric(proxy: &ProxyProcess, reason: &str) -> Result<i64> {
    proxy.metric(&format!(
        "kafka_mirror_proxy_connections_closed_total{{reason=\"{reason}\"}}"
    ))
}

/// Wait until `f` holds (polling), or fail saying `what`.
fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !f()? {
        ensure!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

#[test]
fn announced_sizes_allocate_only_a_first_chunk_and_a_used_up_budget_pauses_reading() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;

    // 1. Twenty clients each announce a 90 MB frame and send 100 bytes. The
    // proxy used to allocate the 90 MB for each at once.
    let proxy = ProxyProcess::start(&broker.bootstrap(), &[])?;
    Conn::connect(&proxy.bootstrap)?.api_versions()?;
    let before = proxy.status_kb("VmData")?;
    let mut announcers = Vec::new();
    for _ in 0..20 {
        let mut c = Conn::connect(&proxy.bootstrap)?;
        c.send_raw(&90_000_000u32.to_be_bytes())?;
        c.send_raw(&[0; 100])?;
        announcers.push(c);
    }
    std::thread::sleep(Duration::from_secs(2));
    let grown_mb = (proxy.status_kb("VmData")?.saturating_sub(before)) / 1024;
    eprintln!("VmData grew by {grown_mb} MB for 20 announced 90 MB frames");
    ensure!(
        grown_mb < 200,
        "20 announced (not sent) 90 MB frames grew the proxy's data by {grown_mb} MB"
    );
    // The announcers are waiting, not closed, and others are served.
    Conn::connect(&proxy.bootstrap)?.api_versions()?;
    ensure!(
        matches!(
            announcers[0].recv(Duration::from_millis(200))?,
            Recv::Silent
        ),
        "an announcer's connection was closed early"
    );
    drop(announcers);
    drop(proxy);

    // 2. A budget of two maximal frames: two clients that stop one byte
    // short of a whole maximal frame hold all of it. A third client's
    // request then waits (its connection stays open) until one of them
    // finishes and its frame has been forwarded.
    let max = 1_048_576;
    let proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("MAX_FRAME_BYTES", "1048576"),
            ("MAX_BUFFERED_BYTES", "2097152"),
        ],
    )?;
    auto_create_topic(&proxy.bootstrap, "budget")?;
    let frame_a = produce_frame_of_size("budget", max, 1)?;
    let frame_b = produce_frame_of_size("budget", max, 1)?;
    let mut a = Conn::connect(&proxy.bootstrap)?;
    let mut b = Conn::connect(&proxy.bootstrap)?;
    a.send_raw(&frame_a[..frame_a.len() - 1])?;
    b.send_raw(&frame_b[..frame_b.len() - 1])?;
    // Let the proxy read both (2 MB on loopback).
    std::thread::sleep(Duration::from_secs(2));
    let mut c = Conn::connect(&proxy.bootstrap)?;
    let c_id = c.send(ApiKey::ApiVersions, 3, &api_versions_request())?;
    ensure!(
        matches!(c.recv(Duration::from_secs(3))?, Recv::Silent),
        "a request was read although the frame budget was used up"
    );
    a.send_raw(&frame_a[frame_a.len() - 1..])?;
    let r: ProduceResponse = a.response(ApiKey::Produce, PRODUCE_VERSION, 1)?;
    let code = r.responses[0].partition_responses[0].error_code;
    ensure!(code == 0, "A's Produce failed with {code}");
    let r: ApiVersionsResponse = c.response(ApiKey::ApiVersions, 3, c_id)?;
    ensure!(r.error_code == 0, "C's ApiVersions failed");
    b.send_raw(&frame_b[frame_b.len() - 1..])?;
    let r: ProduceResponse = b.response(ApiKey::Produce, PRODUCE_VERSION, 1)?;
    let code = r.responses[0].partition_responses[0].error_code;
    ensure!(code == 0, "B's Produce failed with {code}");
    let logs = proxy.logs();
    ensure!(
        !logs.contains("closing client connection"),
        "backpressure closed a connection:\n{logs}"
    );
    Ok(())
}

#[test]
fn stalled_frames_idle_connections_and_slow_tls_handshakes_are_closed() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let mut proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("CONNECTIONS_MAX_IDLE_MS", "2000"),
            ("REQUEST_READ_TIMEOUT_MS", "2000"),
        ],
    )?;
    auto_create_topic(&proxy.bootstrap, "idle")?;

    // A frame that stops after 14 of its 104 bytes: closed 2 s after its
    // first byte, although the idle timeout alone would also be 2 s — the
    // idle clock does not run while a frame is partly read.
    let mut stalled = Conn::connect(&proxy.bootstrap)?;
    stalled.send_raw(&[0, 0, 0, 100, 0, 18, 0, 3, 0, 0, 0, 1, 0, 0])?;
    let after = stalled.closed_within(Duration::from_secs(20))?;
    let after = after.context("a frame stopped mid-way was never timed out")?;
    ensure!(
        after >= Duration::from_millis(1500),
        "closed after {after:?}"
    );
    proxy.wait_for_log(
        "MIRROR_PROXY_REQUEST_READ_TIMEOUT_MS",
        Duration::from_secs(10),
    )?;
    // (Counted just after the socket closes.)
    wait_until(
        "request_timeout is counted",
        Duration::from_secs(10),
        || Ok(closed_metric(&proxy, "request_timeout")? == 1),
    )?;

    // Idle after a request: closed about 2 s later.
    let mut idle = Conn::connect(&proxy.bootstrap)?;
    idle.api_versions()?;
    let after = idle.closed_within(Duration::from_secs(20))?;
    let after = after.context("an idle connection was never closed")?;
    ensure!(
        after >= Duration::from_millis(1500),
        "closed after {after:?}"
    );

    // A request in flight for longer than the idle timeout (a Fetch the
    // broker holds for 5 s) is not idleness: its response arrives.
    let mut waiting = Conn::connect(&proxy.bootstrap)?;
    let id = waiting.send(ApiKey::Fetch, FETCH_VERSION, &long_fetch("idle", 5000))?;
    let sent = Instant::now();
    let r: FetchResponse = waiting.response(ApiKey::Fetch, FETCH_VERSION, id)?;
    ensure!(r.error_code == 0, "Fetch error {}", r.error_code);
    ensure!(
        sent.elapsed() >= Duration::from_millis(4000),
        "the broker did not hold the Fetch"
    );

    // A client that sends a request every 700 ms stays connected.
    let mut busy = Conn::connect(&proxy.bootstrap)?;
    for _ in 0..7 {
        busy.api_versions()?;
        std::thread::sleep(Duration::from_millis(700));
    }
    busy.api_versions()?;

    proxy.wait_for_log("closing idle client connection", Duration::from_secs(10))?;
    // `idle`, and `waiting` 2 s after its response.
    wait_until(
        "both idle closes are counted",
        Duration::from_secs(10),
        || Ok(closed_metric(&proxy, "idle_timeout")? == 2),
    )?;

    // TLS: a client that connects and never finishes the handshake.
    let dir = tempfile::tempdir()?;
    let ca = TestCa::new(dir.path())?;
    let cert = ca.server("proxy")?;
    let tls = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("TLS_CERT", &cert.cert_path.to_string_lossy()),
            ("TLS_KEY", &cert.key_path.to_string_lossy()),
            ("TLS_HANDSHAKE_TIMEOUT_MS", "1000"),
        ],
    )?;
    let mut silent = Conn::connect(&tls.bootstrap)?;
    let after = silent.closed_within(Duration::from_secs(20))?;
    let after = after.context("a client that never handshakes was never closed")?;
    ensure!(
        after >= Duration::from_millis(700),
        "closed after {after:?}"
    );
    wait_until(
        "the handshake timeout is counted",
        Duration::from_secs(10),
        || Ok(closed_metric(&tls, "tls_handshake_timeout")? == 1),
    )?;
    // The close is counted before its log line is written, and the line
    // reaches the test through a reader thread: wait for it too.
    wait_until(
        "a log line names the handshake timeout",
        Duration::from_secs(10),
        || Ok(tls.logs().contains("MIRROR_PROXY_TLS_HANDSHAKE_TIMEOUT_MS")),
    )?;
    // A client that does handshake is served.
    let mut good = RawClient::connect_tls(&tls.bootstrap, &ca.cert_pem, None)?;
    good.send(ApiKey::ApiVersions, 3, "hardening", &api_versions_request())?;
    ensure!(
        good.recv_frame()?.is_some(),
        "no ApiVersions response over TLS"
    );
    Ok(())
}

#[test]
fn connections_over_max_connections_are_refused_and_counted() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let mut proxy = ProxyProcess::start(&broker.bootstrap(), &[("MAX_CONNECTIONS", "3")])?;
    let mut open = Vec::new();
    for _ in 0..3 {
        let mut c = Conn::connect(&proxy.bootstrap)?;
        c.api_versions()?;
        open.push(c);
    }
    for i in 0..2 {
        let mut extra = Conn::connect(&proxy.bootstrap)?;
        // Closed without an answer.
        let _ = extra.send(ApiKey::ApiVersions, 3, &api_versions_request());
        let closed = extra.closed_within(Duration::from_secs(10))?;
        ensure!(
            closed.is_some(),
            "connection {} over the limit was served",
            4 + i
        );
    }
    let refused = proxy.metric(
        "kafka_mirror_proxy_connections_refused_total{listener=\"bootstrap\",reason=\"max_connections\"}",
    )?;
    ensure!(refused == 2, "refusals counted: {refused}");
    // Two refusals within 10 s: one WARN line. The log is read from the
    // proxy's stderr by a thread that can lag the metric (a clean-clone CI
    // run saw the count before the line), so wait for the first line.
    let warned = proxy.log_lines_once_logged(
        "MIRROR_PROXY_MAX_CONNECTIONS reached",
        Duration::from_secs(10),
    )?;
    ensure!(
        warned == 1,
        "{warned} WARN lines for 2 refusals:\n{}",
        proxy.logs()
    );
    // The ones already open are unaffected, and a freed slot is usable.
    open[0].api_versions()?;
    drop(open.pop());
    wait_until("a slot is free", Duration::from_secs(10), || {
        Ok(
            proxy.metric("kafka_mirror_proxy_client_connections_active{listener=\"bootstrap\"}")?
                == 2,
        )
    })?;
    // The slot is given back just after the gauge drops.
    std::thread::sleep(Duration::from_millis(200));
    Conn::connect(&proxy.bootstrap)?.api_versions()?;
    Ok(())
}

#[test]
fn node_0_is_served_with_the_default_ports() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default().node_id(0))?;
    // No MIRROR_PROXY_BROKER_PORT_BASE: node 0 is served at LISTEN port + 1.
    let proxy = ProxyProcess::start_default_ports(&broker.bootstrap(), &[])?;
    let node0 = proxy.node_address(0);
    ensure!(
        node0 != proxy.bootstrap,
        "node 0 is advertised at the bootstrap address"
    );
    tools::create_topic(&proxy.bootstrap, "zero", 1, &[], &[])?;
    let sent: Vec<(String, String)> = (0..200)
        .map(|i| (format!("k{i:03}"), format!("value {i}")))
        .collect();
    tools::console_produce_kv(&proxy.bootstrap, "zero", &sent, &[("acks", "all")])?;
    let lines = tools::console_consume(
        &proxy.bootstrap,
        "zero",
        sent.len(),
        &[("print.key", "true")],
        Duration::from_secs(30),
    )?;
    let expected: Vec<String> = sent.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    ensure!(
        lines == expected,
        "consumed {} of {} records",
        lines.len(),
        sent.len()
    );
    let through_node0 = proxy.metric(&format!(
        "kafka_mirror_proxy_upstream_connections_total{{listener=\"node-0\",broker=\"{}\"}}",
        broker.bootstrap()
    ))?;
    ensure!(through_node0 >= 1, "no client used the node 0 listener");
    let versions = tools::broker_api_versions(&proxy.bootstrap)?;
    ensure!(
        versions.contains(&format!("{node0} (id: 0")),
        "node 0 not advertised at {node0}:\n{versions}"
    );
    ensure!(
        !proxy.logs().contains("closing client connection"),
        "a connection failed:\n{}",
        proxy.logs()
    );
    Ok(())
}

#[test]
fn sigterm_answers_the_requests_in_flight_then_exits_0() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let mut proxy = ProxyProcess::start(&broker.bootstrap(), &[("SHUTDOWN_TIMEOUT_MS", "30000")])?;
    auto_create_topic(&proxy.bootstrap, "drain")?;
    let requests = |api: &str| -> Result<i64> {
        proxy.metric(&format!(
            "kafka_mirror_proxy_requests_total{{api_key=\"{api}\"}}"
        ))
    };
    let (fetches, produces) = (requests("1")?, requests("0")?);

    let mut idle = Conn::connect(&proxy.bootstrap)?;
    idle.api_versions()?;
    // One connection, seven requests pipelined: a broker answers the
    // requests of a connection one at a time, and holds each Fetch for
    // 2 s, so the last answer comes about 4 s after the first request.
    let mut pipeline = Conn::connect(&proxy.bootstrap)?;
    let mut sent = Vec::new();
    sent.push((
        ApiKey::Fetch,
        pipeline.send(ApiKey::Fetch, FETCH_VERSION, &long_fetch("drain", 2000))?,
    ));
    for i in 0..5 {
        let value = format!("record {i}");
        let request = produce_request("drain", 0, record_batch(-1, &[&value]));
        sent.push((
            ApiKey::Produce,
            pipeline.send(ApiKey::Produce, PRODUCE_VERSION, &request)?,
        ));
    }
    sent.push((
        ApiKey::Fetch,
        pipeline.send(ApiKey::Fetch, FETCH_VERSION, &long_fetch("drain", 2000))?,
    ));
    // Every request has been read by the proxy (so it is in flight) ...
    wait_until(
        "the proxy has read the pipeline",
        Duration::from_secs(10),
        || Ok(requests("1")? == fetches + 2 && requests("0")? == produces + 5),
    )?;
    // ... before the signal.
    proxy.signal("TERM")?;
    let signalled = Instant::now();

    // New connections are refused once the listener is closed.
    wait_until(
        "new connections are refused",
        Duration::from_secs(10),
        || Ok(TcpStream::connect(&proxy.bootstrap).is_err()),
    )?;
    // A connection with nothing in flight is closed at once.
    ensure!(
        idle.closed_within(Duration::from_secs(10))?.is_some(),
        "an idle connection stayed open during shutdown"
    );
    // Every request written before the signal gets its response, in order.
    for (api, id) in &sent {
        match api {
            ApiKey::Produce => {
                let r: ProduceResponse = pipeline.response(*api, PRODUCE_VERSION, *id)?;
                let code = r.responses[0].partition_responses[0].error_code;
                ensure!(code == 0, "Produce {id} failed with {code}");
            }
            _ => {
                let r: FetchResponse = pipeline.response(*api, FETCH_VERSION, *id)?;
                ensure!(r.error_code == 0, "Fetch {id} failed with {}", r.error_code);
            }
        }
    }
    let answered = signalled.elapsed();
    ensure!(
        pipeline.closed_within(Duration::from_secs(10))?.is_some(),
        "the connection stayed open after its last response"
    );
    let status = proxy
        .wait_exit(Duration::from_secs(30))?
        .context("the proxy did not exit within the shutdown timeout")?;
    ensure!(status.success(), "exit status {status}:\n{}", proxy.logs());
    ensure!(
        answered >= Duration::from_millis(1500),
        "the responses came too early ({answered:?}) to show anything was in flight"
    );
    for line in ["shutting down", "every connection delivered its responses"] {
        ensure!(
            logged_after_exit(&proxy, line),
            "no log line {line:?}:\n{}",
            proxy.logs()
        );
    }

    // The bound: a Fetch held for 20 s against a 1.5 s shutdown timeout.
    let mut proxy = ProxyProcess::start(&broker.bootstrap(), &[("SHUTDOWN_TIMEOUT_MS", "1500")])?;
    let mut held = Conn::connect(&proxy.bootstrap)?;
    held.send(ApiKey::Fetch, FETCH_VERSION, &long_fetch("drain", 20_000))?;
    wait_until(
        "the proxy has read the Fetch",
        Duration::from_secs(10),
        || Ok(proxy.metric("kafka_mirror_proxy_requests_total{api_key=\"1\"}")? == 1),
    )?;
    proxy.signal("TERM")?;
    let signalled = Instant::now();
    let status = proxy
        .wait_exit(Duration::from_secs(15))?
        .context("the proxy ignored its shutdown timeout")?;
    let took = signalled.elapsed();
    ensure!(status.success(), "exit status {status}");
    ensure!(
        took >= Duration::from_millis(1000),
        "exited after {took:?}, before the shutdown timeout"
    );
    ensure!(
        matches!(held.recv(Duration::from_secs(5))?, Recv::Closed),
        "the held connection was not closed"
    );
    ensure!(
        logged_after_exit(&proxy, "shutdown timeout"),
        "no log line about the shutdown timeout:\n{}",
        proxy.logs()
    );
    Ok(())
}

/// Whether an exited proxy logged `needle`. The log is captured by a reader
/// thread that may still be copying the last lines when the exit is seen
/// (a clean-clone CI run missed the final line once), so look for a while.
fn logged_after_exit(proxy: &ProxyProcess, needle: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if proxy.logs().contains(needle) {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn idle_connections_cost_little_memory() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let n: u64 = std::env::var("IDLE_CONNECTIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let proxy = ProxyProcess::start(&broker.bootstrap(), &[])?;
    // Warm up: the runtime's threads and allocator arenas exist before
    // the baseline.
    let mut conns = Vec::new();
    for _ in 0..20 {
        let mut c = Conn::connect(&proxy.bootstrap)?;
        c.api_versions()?;
        conns.push(c);
    }
    std::thread::sleep(Duration::from_millis(500));
    let (rss0, data0) = (proxy.status_kb("VmRSS")?, proxy.status_kb("VmData")?);
    for _ in 0..n {
        // Like a client: ApiVersions first, then nothing.
        let mut c = Conn::connect(&proxy.bootstrap)?;
        c.api_versions()?;
        conns.push(c);
    }
    std::thread::sleep(Duration::from_secs(1));
    let (rss1, data1) = (proxy.status_kb("VmRSS")?, proxy.status_kb("VmData")?);
    let rss = rss1.saturating_sub(rss0) as f64 / n as f64;
    let data = data1.saturating_sub(data0) as f64 / n as f64;
    eprintln!(
        "{n} idle connections: VmRSS {rss0} -> {rss1} kB ({rss:.1} kB each), \
         VmData {data0} -> {data1} kB ({data:.1} kB each)"
    );
    // Two 64 KiB read buffers alone used to be 128 KiB per connection; a
    // session task sized by its rare paths (TLS handshake, state rebuild)
    // 12.8 kB. Now about 7.4 kB (issue 11: under 32 MiB at 1,000).
    ensure!(data < 10.0, "{data:.1} kB of heap per idle connection");
    ensure!(rss < 10.0, "{rss:.1} kB resident per idle connection");
    if n >= 1000 {
        ensure!(
            rss1 < 32 * 1024,
            "{rss1} kB resident with {n} idle connections (bound: 32 MiB)"
        );
    }
    Ok(())
}

#[test]
fn port_and_budget_misconfigurations_stop_the_start() -> Result<()> {
    let run = |vars: &[(&str, &str)]| -> Result<(Option<i32>, String)> {
        let mut cmd = std::process::Command::new(support::proxy::proxy_bin());
        cmd.arg("run")
            .env("MIRROR_PROXY_BOOTSTRAP_SERVERS", "127.0.0.1:9")
            .env("MIRROR_PROXY_LISTEN", "127.0.0.1:19092");
        for (k, v) in vars {
            cmd.env(format!("MIRROR_PROXY_{k}"), v);
        }
        // A proxy that accepts the configuration runs until killed.
        let mut child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while child.try_wait()?.is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let out = child.wait_with_output()?;
        Ok((
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (code, err) = run(&[("BROKER_PORT_BASE", "19000")])?;
    ensure!(code == Some(2), "exit {code:?}: {err}");
    ensure!(
        err.contains("MIRROR_PROXY_BROKER_PORT_BASE=\"19000\"")
            && err.contains("node 92 would be served on the bootstrap port"),
        "{err}"
    );
    let (code, err) = run(&[
        ("MAX_FRAME_BYTES", "2000000"),
        ("MAX_BUFFERED_BYTES", "1000000"),
    ])?;
    ensure!(code == Some(2), "exit {code:?}: {err}");
    ensure!(
        err.contains("MIRROR_PROXY_MAX_BUFFERED_BYTES=\"1000000\"")
            && err.contains("MIRROR_PROXY_MAX_FRAME_BYTES (2000000)"),
        "{err}"
    );
    Ok(())
}
