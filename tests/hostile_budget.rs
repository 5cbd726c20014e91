//! The proxy's memory budgets tried as a hostile or careless client would
//! try them, against a real broker, through the proxy binary: connections
//! whose frames cannot be written (a broker sitting on a long poll, a
//! client that never reads, a broker that trickles a response) must not
//! freeze the others, nor grow the proxy's memory past its bounds, and
//! closing them gives the memory back.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, BrokerId, FetchRequest, MetadataRequest, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use kafka_mirror_proxy::client::protocol::OffsetSpec;
use support::crate_client::{client, create_topics, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::relay::Relay;
use support::wire::{linger_zero, partition_result, record_batch, small_receive_buffer, RawClient};

const MIB: usize = 1024 * 1024;

/// Create the one-partition topic `topic` and wait until its leader
/// answers for it: a Fetch of it then parks at the broker and a Produce is
/// appended (sent before, either may be answered at once with an error).
fn topic_ready(bootstrap: &str, topic: &str) -> Result<()> {
    create_topics(bootstrap, &[(topic, 1)])?;
    runtime()?.block_on(client(bootstrap).list_offset(topic, 0, OffsetSpec::Latest))?;
    Ok(())
}

/// A broker with the empty topic the long polls wait on, and a proxy in
/// front of it with `settings` (its budgets): the broker is returned to be
/// kept alive as long as the proxy.
fn behind_a_broker(settings: &[(&str, &str)]) -> Result<(KafkaCluster, ProxyProcess)> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    topic_ready(&broker.bootstrap(), "empty")?;
    let p = ProxyProcess::start(&broker.bootstrap(), settings)?;
    Ok((broker, p))
}

/// ApiVersions v0 requests, framed back to back, one for each correlation
/// id in `correlations`: what a connection pipelines behind a long poll.
fn api_versions(correlations: std::ops::Range<i32>) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    for c in correlations {
        out.extend(framed(
            ApiKey::ApiVersions,
            0,
            c,
            &ApiVersionsRequest::default(),
        )?);
    }
    Ok(out)
}

/// One request, framed: size, header, body.
fn framed<T: Encodable>(api: ApiKey, version: i16, correlation: i32, body: &T) -> Result<Vec<u8>> {
    let header = RequestHeader::default()
        .with_request_api_key(api as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_static_str("hostile-budget")));
    let mut buf = BytesMut::new();
    header.encode(&mut buf, api.request_header_version(version))?;
    body.encode(&mut buf, version)?;
    let mut out = u32::try_from(buf.len())?.to_be_bytes().to_vec();
    out.extend_from_slice(&buf);
    Ok(out)
}

/// A request frame of exactly `size` bytes after the size prefix: an
/// ApiVersions header followed by padding (the broker would refuse it, but
/// it never gets that far).
fn padded_frame(correlation: i32, size: usize) -> Result<Vec<u8>> {
    let mut f = framed(
        ApiKey::ApiVersions,
        0,
        correlation,
        &ApiVersionsRequest::default(),
    )?;
    f.resize(4 + size, 0);
    f[..4].copy_from_slice(&u32::try_from(size)?.to_be_bytes());
    Ok(f)
}

/// A Fetch v12 of partition 0 of `topic` from offset 0.
fn fetch(topic: &str, max_wait_ms: i32, max_bytes: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(max_bytes)
        .with_isolation_level(0)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(max_bytes)])])
}

/// Close `s` with a reset (SO_LINGER 0), as a killed client would.
fn reset(s: TcpStream) -> Result<()> {
    linger_zero(&s)?;
    // Wakes a thread blocked writing on a clone of the socket.
    let _ = s.shutdown(std::net::Shutdown::Both);
    drop(s);
    Ok(())
}

/// Read one response frame on `s` before `deadline`.
fn recv_by(s: &mut TcpStream, deadline: Instant) -> Result<Bytes> {
    let left = deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .context("deadline passed")?;
    s.set_read_timeout(Some(left))?;
    let mut size = [0u8; 4];
    s.read_exact(&mut size)?;
    let mut body = vec![0u8; u32::from_be_bytes(size) as usize];
    s.read_exact(&mut body)?;
    Ok(Bytes::from(body))
}

/// The correlation id of a response frame with a header of `version`.
fn correlation_of(mut frame: Bytes, api: ApiKey, version: i16) -> Result<i32> {
    Ok(ResponseHeader::decode(&mut frame, api.response_header_version(version))?.correlation_id)
}

/// Wait (up to `timeout`) until the metric `sample` is `want`.
fn wait_for_metric(p: &ProxyProcess, sample: &str, want: i64, timeout: Duration) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        let got = p.metric(sample)?;
        if got == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{sample} is {got}, not {want}, after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits (each at most `timeout`) until the request budget holds nothing
/// and `connections` client connections are open on the bootstrap listener.
fn budget_released(p: &ProxyProcess, connections: i64, timeout: Duration) -> Result<()> {
    wait_for_metric(p, "kafka_mirror_proxy_buffered_request_bytes", 0, timeout)?;
    wait_for_metric(
        p,
        "kafka_mirror_proxy_client_connections_active{listener=\"bootstrap\"}",
        connections,
        timeout,
    )
}

/// An ordinary client's first request: ApiVersions v3, correlation id 1,
/// naming its software.
fn ordinary_api_versions() -> Result<Vec<u8>> {
    framed(
        ApiKey::ApiVersions,
        3,
        1,
        &ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("t"))
            .with_client_software_version(StrBytes::from_static_str("1")),
    )
}

/// An ApiVersions v3 request frame of exactly `size` bytes after the size
/// prefix, padded with an unknown tagged field (which a broker skips).
fn tagged_api_versions(correlation: i32, size: usize) -> Result<Vec<u8>> {
    let request = |pad: usize| {
        let mut r = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("hostile"))
            .with_client_software_version(StrBytes::from_static_str("1"));
        r.unknown_tagged_fields
            .insert(1000, Bytes::from(vec![0u8; pad]));
        framed(ApiKey::ApiVersions, 3, correlation, &r)
    };
    // The padding's length prefix is a varint: find the pad that lands on
    // `size` exactly.
    let base = request(0)?.len() - 4;
    let mut pad = size.saturating_sub(base + 8);
    loop {
        let f = request(pad)?;
        match (f.len() - 4).cmp(&size) {
            std::cmp::Ordering::Equal => return Ok(f),
            std::cmp::Ordering::Less => pad += 1,
            std::cmp::Ordering::Greater => bail!("no padding gives a frame of {size} bytes"),
        }
    }
}

/// Send ApiVersions v0 then Metadata v1 on a new connection, each answered
/// within 2 s of being sent.
fn ordinary_client_answered(p: &ProxyProcess, when: &str) -> Result<()> {
    let bound = Duration::from_secs(2);
    let mut c = TcpStream::connect(&p.bootstrap)?;
    let exchanges = [
        (
            ApiKey::ApiVersions,
            0,
            1,
            framed(ApiKey::ApiVersions, 0, 1, &ApiVersionsRequest::default())?,
        ),
        (
            ApiKey::Metadata,
            1,
            2,
            framed(ApiKey::Metadata, 1, 2, &MetadataRequest::default())?,
        ),
    ];
    for (api, version, correlation, frame) in exchanges {
        c.write_all(&frame)?;
        let answer = recv_by(&mut c, Instant::now() + bound).with_context(|| {
            format!(
                "no {api:?} answer within {bound:?} {when}; request budget held: {:?}",
                p.metric("kafka_mirror_proxy_buffered_request_bytes")
            )
        })?;
        ensure!(correlation_of(answer, api, version)? == correlation);
    }
    Ok(())
}

/// Issue 44, item 1: four connections that never read park a Fetch long
/// poll (60 s) at the broker, pipeline 200 ApiVersions behind it and then
/// two ApiVersions of 4 MiB each, with a budget of two such frames and the
/// default write timeout (30 s, longer than the test waits). A new client
/// is answered within 2 s during the attack and 2 s after the attackers
/// are reset, and the request budget is then all free: a connection whose
/// request the broker holds may not read a frame larger than its share
/// of the budget until the broker has answered.
#[test]
fn connections_parked_behind_a_long_poll_do_not_starve_new_clients() -> Result<()> {
    let (_broker, p) = behind_a_broker(&[
        ("MAX_FRAME_BYTES", "4194304"),
        ("MAX_BUFFERED_BYTES", "8388608"),
    ])?;
    let long_poll = framed(
        ApiKey::Fetch,
        11,
        1,
        &fetch("empty", 60_000, 100 * MIB as i32),
    )?;
    let pipelined = api_versions(2..202)?;
    let big = [
        tagged_api_versions(202, 4 * MIB - 64)?,
        tagged_api_versions(203, 4 * MIB - 64)?,
    ];
    let mut attackers = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..4 {
        let s = TcpStream::connect(&p.bootstrap)?;
        small_receive_buffer(&s)?;
        let mut w = s.try_clone()?;
        w.write_all(&long_poll)?;
        attackers.push(s);
        let pipelined = pipelined.clone();
        let big = big.clone();
        writers.push(std::thread::spawn(move || -> Result<()> {
            // Let the broker take the Fetch first.
            std::thread::sleep(Duration::from_millis(500));
            w.write_all(&pipelined)?;
            for f in &big {
                w.write_all(f)?;
            }
            Ok(())
        }));
    }
    std::thread::sleep(Duration::from_secs(5));
    ordinary_client_answered(&p, "during the attack")?;

    for s in attackers {
        reset(s)?;
    }
    for w in writers {
        // Their writes end in an error (the reset) or were taken whole.
        let _ = w.join();
    }
    std::thread::sleep(Duration::from_secs(2));
    ordinary_client_answered(&p, "2 s after the attackers were reset")?;
    // The probes' frames were written before they were answered, so
    // nothing the proxy still holds is theirs.
    let held = p.metric("kafka_mirror_proxy_buffered_request_bytes")?;
    ensure!(
        held == 0,
        "{held} bytes of the request budget still held after the attackers left"
    );
    Ok(())
}

/// Issue 25, item 4, as it stands since issue 44: four connections each
/// park a Fetch long poll at the broker (which then reads nothing more
/// from them) and pipeline frames of their whole share of the budget
/// behind it (512 KiB: 8 MiB over `MAX_CONNECTIONS` 16), more than the
/// socket buffers take, so each ends with a frame it cannot write. They
/// hold at most a share each; a new client's ApiVersions and Metadata
/// are answered; the stuck writes time out and their connections close;
/// once the attackers are gone every byte of the budget is back.
#[test]
fn connections_whose_writes_are_stuck_do_not_freeze_the_others() -> Result<()> {
    const SHARE: usize = 512 * 1024;
    let (_broker, mut p) = behind_a_broker(&[
        ("MAX_FRAME_BYTES", "4194304"),
        ("MAX_BUFFERED_BYTES", "8388608"),
        ("MAX_CONNECTIONS", "16"),
        ("WRITE_TIMEOUT_MS", "3000"),
    ])?;

    let long_poll = framed(ApiKey::Fetch, 12, 1, &fetch("empty", 120_000, MIB as i32))?;
    let mut attackers = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..4 {
        let s = TcpStream::connect(&p.bootstrap)?;
        let mut w = s.try_clone()?;
        w.write_all(&long_poll)?;
        attackers.push(s);
        writers.push(std::thread::spawn(move || -> Result<()> {
            // Let the broker take the Fetch (it then reads nothing more
            // from this connection until it answers, in 120 s).
            std::thread::sleep(Duration::from_millis(500));
            for c in 2..5 {
                w.write_all(&framed(
                    ApiKey::ApiVersions,
                    0,
                    c,
                    &ApiVersionsRequest::default(),
                )?)?;
            }
            for c in 5..69 {
                w.write_all(&padded_frame(c, SHARE)?)?;
            }
            Ok(())
        }));
    }
    // The attack holds what it can once the writes are stuck.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut peak = 0;
    while peak < 2 * SHARE as i64 {
        ensure!(
            Instant::now() < deadline,
            "the attackers' frames were never held (request budget peak {peak})"
        );
        peak = peak.max(p.metric("kafka_mirror_proxy_buffered_request_bytes")?);
        std::thread::sleep(Duration::from_millis(20));
    }
    ensure!(
        peak <= 4 * SHARE as i64,
        "four parked connections held {peak} bytes, more than their shares"
    );

    // A new client is answered within a bound (on e872c55 it waited until
    // the long polls ended, 120 s).
    let started = Instant::now();
    let bound = started + Duration::from_secs(20);
    let mut fresh = TcpStream::connect(&p.bootstrap)?;
    fresh.write_all(&ordinary_api_versions()?)?;
    let versions = recv_by(&mut fresh, bound).with_context(|| {
        format!(
            "no ApiVersions answer within {:?} while four connections were stuck:\n{}",
            started.elapsed(),
            p.logs()
        )
    })?;
    ensure!(correlation_of(versions, ApiKey::ApiVersions, 3)? == 1);
    fresh.write_all(&framed(
        ApiKey::Metadata,
        12,
        2,
        &MetadataRequest::default(),
    )?)?;
    let metadata = recv_by(&mut fresh, bound).with_context(|| {
        format!(
            "no Metadata answer within {:?} while four connections were stuck",
            started.elapsed()
        )
    })?;
    ensure!(correlation_of(metadata, ApiKey::Metadata, 12)? == 2);
    eprintln!(
        "a new client was answered {:?} into the attack",
        started.elapsed()
    );

    // Each stuck write times out and closes its connection (a reset would
    // close it at once: the attackers stay until then).
    wait_for_metric(
        &p,
        "kafka_mirror_proxy_connections_closed_total{reason=\"upstream_write_timeout\"}",
        4,
        Duration::from_secs(30),
    )?;
    // Whatever they held comes back.
    for s in attackers {
        reset(s)?;
    }
    for w in writers {
        // Their writes end in an error (the proxy closed, or the reset).
        let _ = w.join();
    }
    let (_, text) = p.admin_get("/metrics")?;
    ensure!(
        text.contains("kafka_mirror_proxy_buffered_request_bytes "),
        "no request budget gauge in:\n{text}"
    );
    budget_released(&p, 1, Duration::from_secs(30))?;
    p.wait_for_log("no progress writing to the broker", Duration::from_secs(5))?;

    // A frame of the whole per-connection share goes through again.
    let mut c = RawClient::connect(&p.bootstrap)?;
    let value = "x".repeat(4 * MIB - 1024);
    let r = c.produce("hostile-budget", "empty", 0, record_batch(-1, &[&value]))?;
    let (code, _) = partition_result(&r);
    ensure!(
        code != 0,
        "a 4 MiB batch over the broker's limit was appended"
    );
    drop(fresh);
    Ok(())
}

/// A client that resets its connection while the broker holds its Fetch
/// (120 s) and its last frame is stuck on the way to the broker gives that
/// frame's memory back at once, not when the write times out (300 s here)
/// or the long poll ends: the session watches its client's socket while it
/// waits on the broker.
#[test]
fn a_reset_client_gives_its_memory_back_while_the_broker_holds_its_fetch() -> Result<()> {
    const SHARE: usize = 512 * 1024;
    let (_broker, p) = behind_a_broker(&[
        ("MAX_FRAME_BYTES", "4194304"),
        ("MAX_BUFFERED_BYTES", "8388608"),
        ("MAX_CONNECTIONS", "16"),
        ("WRITE_TIMEOUT_MS", "300000"),
    ])?;
    let s = TcpStream::connect(&p.bootstrap)?;
    let mut w = s.try_clone()?;
    w.write_all(&framed(
        ApiKey::Fetch,
        12,
        1,
        &fetch("empty", 120_000, MIB as i32),
    )?)?;
    let writer = std::thread::spawn(move || -> Result<()> {
        std::thread::sleep(Duration::from_millis(500));
        for c in 2..66 {
            w.write_all(&padded_frame(c, SHARE)?)?;
        }
        Ok(())
    });
    // A frame stuck on its way to the broker holds its memory.
    wait_for_metric(
        &p,
        "kafka_mirror_proxy_buffered_request_bytes",
        SHARE as i64,
        Duration::from_secs(30),
    )?;
    reset(s)?;
    let _ = writer.join();
    budget_released(&p, 0, Duration::from_secs(60))?;
    Ok(())
}

/// A frame that was written whole (into the socket buffers) while the
/// connection's queue of responses owed is full (512 requests behind a
/// long poll) must not keep its memory until the queue has room, which
/// here is when the long poll ends: its write made progress, so the write
/// timeout does not see it.
#[test]
fn a_frame_written_behind_a_full_queue_does_not_keep_its_memory() -> Result<()> {
    let (_broker, p) =
        behind_a_broker(&[("MAX_FRAME_BYTES", "4096"), ("MAX_BUFFERED_BYTES", "8192")])?;
    let long_poll = framed(ApiKey::Fetch, 12, 1, &fetch("empty", 120_000, 1024))?;
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(&p.bootstrap)?;
        s.write_all(&long_poll)?;
        std::thread::sleep(Duration::from_millis(200));
        // While the response loop waits for the Fetch's answer, 512 small
        // requests fill the queue of responses owed (they fit in the socket
        // buffers); the next, a frame of the whole per-connection share, is
        // written and then waits for room.
        let mut pipelined = api_versions(2..514)?;
        pipelined.extend(padded_frame(514, 4096)?);
        s.write_all(&pipelined)?;
        attackers.push(s);
    }
    // Let the proxy read what it will.
    std::thread::sleep(Duration::from_secs(2));

    let started = Instant::now();
    let bound = started + Duration::from_secs(20);
    let mut fresh = TcpStream::connect(&p.bootstrap)?;
    fresh.write_all(&framed(
        ApiKey::Metadata,
        12,
        1,
        &MetadataRequest::default(),
    )?)?;
    let metadata = recv_by(&mut fresh, bound).with_context(|| {
        format!(
            "no Metadata answer within {:?} while four connections had full queues; request budget held: {:?}",
            started.elapsed(),
            p.metric("kafka_mirror_proxy_buffered_request_bytes")
        )
    })?;
    ensure!(correlation_of(metadata, ApiKey::Metadata, 12)? == 1);
    eprintln!(
        "a new client was answered {:?} into the attack",
        started.elapsed()
    );
    for s in attackers {
        reset(s)?;
    }
    Ok(())
}

/// Broker responses are held under their own budget: forty clients that
/// send Fetches for 8 MiB each and never read their sockets make the proxy
/// hold at most the response budget (16 MiB here) plus one frame on the
/// overdraft, not 40 × 8 MiB; the rest wait at the broker. When the
/// clients go, the budget is back.
#[test]
fn clients_that_never_read_their_fetches_do_not_grow_the_proxy_past_the_response_budget(
) -> Result<()> {
    const CLIENTS: usize = 40;
    const BUDGET: usize = 16 * MIB;
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    topic_ready(&broker.bootstrap(), "big")?;
    // About 8 MiB in the partition, written straight to the broker.
    let value = "v".repeat(900_000);
    let mut writer = RawClient::connect(&broker.bootstrap())?;
    for _ in 0..9 {
        let r = writer.produce("writer", "big", 0, record_batch(-1, &[&value]))?;
        ensure!(partition_result(&r).0 == 0, "{:?}", partition_result(&r));
    }
    let p = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("MAX_FRAME_BYTES", "10485760"),
            ("MAX_BUFFERED_RESPONSE_BYTES", &BUDGET.to_string()),
            // Long enough that no stuck write is closed while we measure.
            ("WRITE_TIMEOUT_MS", "300000"),
            ("BUFFER_WAIT_TIMEOUT_MS", "300000"),
        ],
    )?;
    let request = framed(ApiKey::Fetch, 12, 1, &fetch("big", 0, 16 * MIB as i32))?;
    // Warm up: one Fetch read whole through the proxy.
    let mut warm = TcpStream::connect(&p.bootstrap)?;
    warm.write_all(&request)?;
    let answer = recv_by(&mut warm, Instant::now() + Duration::from_secs(30))?;
    ensure!(
        answer.len() > 8_000_000,
        "Fetch answered {} bytes",
        answer.len()
    );
    drop(warm);
    let before = p.status_kb("VmRSS")?;

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut s = TcpStream::connect(&p.bootstrap)?;
        small_receive_buffer(&s)?;
        s.write_all(&request)?;
        s.write_all(&request)?;
        clients.push(s);
    }
    // Watch the proxy's memory while the responses come in and stay
    // unread.
    let mut peak = before;
    let mut peak_gauge = 0;
    let until = Instant::now() + Duration::from_secs(15);
    while Instant::now() < until {
        peak = peak.max(p.status_kb("VmRSS")?);
        peak_gauge = peak_gauge.max(p.metric("kafka_mirror_proxy_buffered_response_bytes")?);
        std::thread::sleep(Duration::from_millis(100));
    }
    let grown_kb = peak.saturating_sub(before);
    eprintln!(
        "{CLIENTS} clients not reading: proxy RSS {before} kB -> peak {peak} kB (+{} MiB); response gauge peak {peak_gauge} bytes",
        grown_kb / 1024
    );
    // The budget, one frame on the overdraft (at most MAX_FRAME_BYTES), and
    // slack for the allocator and the connections themselves.
    let bound_kb = (BUDGET + 10 * MIB + 32 * MIB) / 1024;
    ensure!(
        grown_kb <= bound_kb as u64,
        "proxy RSS grew by {} MiB with {CLIENTS} clients not reading (bound {} MiB)",
        grown_kb / 1024,
        bound_kb / 1024
    );
    ensure!(
        peak_gauge > 0 && peak_gauge <= BUDGET as i64,
        "response budget gauge peaked at {peak_gauge}"
    );

    for s in clients {
        reset(s)?;
    }
    wait_for_metric(
        &p,
        "kafka_mirror_proxy_buffered_response_bytes",
        0,
        Duration::from_secs(60),
    )?;
    Ok(())
}

/// A broker that stalls or trickles in the middle of a response (the relay
/// stands in for it: the answers come from a real broker, passed on whole
/// until armed, then the first 40 KiB of a 1 MiB Fetch answer at once and
/// the rest a byte every 200 ms; a real broker cannot be made to do this on
/// demand). The response frame holds the response budget while it is read;
/// `RESPONSE_READ_TIMEOUT_MS` (3 s here) bounds that: the broker connection
/// and the client's are closed, counted as `upstream_read_timeout`, logged,
/// and the budget is all back. A timeout on progress alone would never
/// fire: a byte comes every 200 ms. Before the bound the proxy read the
/// trickle for as long as it lasted, holding the frame's memory.
#[test]
fn a_broker_that_trickles_a_response_does_not_keep_its_memory() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    topic_ready(&broker.bootstrap(), "big")?;
    let value = "v".repeat(900_000);
    let mut writer = RawClient::connect(&broker.bootstrap())?;
    let r = writer.produce("writer", "big", 0, record_batch(-1, &[&value]))?;
    ensure!(partition_result(&r).0 == 0, "{:?}", partition_result(&r));
    let relay = Relay::start()?;
    relay.set_target(([127, 0, 0, 1], broker.port()).into());
    let mut p = ProxyProcess::start(
        &relay.address(),
        &[
            ("RESPONSE_READ_TIMEOUT_MS", "3000"),
            // Longer than the test: only the read timeout may close it.
            ("WRITE_TIMEOUT_MS", "300000"),
            ("BUFFER_WAIT_TIMEOUT_MS", "300000"),
            ("CONNECTIONS_MAX_IDLE_MS", "300000"),
        ],
    )?;
    let timeouts = "kafka_mirror_proxy_connections_closed_total{reason=\"upstream_read_timeout\"}";
    let gauge = "kafka_mirror_proxy_buffered_response_bytes";
    ensure!(p.metric(timeouts)? == 0, "the series is there at zero");

    // An ordinary client: ApiVersions and Metadata answered whole.
    let mut c = TcpStream::connect(&p.bootstrap)?;
    let bound = Duration::from_secs(30);
    c.write_all(&ordinary_api_versions()?)?;
    let versions = recv_by(&mut c, Instant::now() + bound)?;
    ensure!(correlation_of(versions, ApiKey::ApiVersions, 3)? == 1);
    c.write_all(&framed(
        ApiKey::Metadata,
        12,
        2,
        &MetadataRequest::default(),
    )?)?;
    let metadata = recv_by(&mut c, Instant::now() + bound)?;
    ensure!(correlation_of(metadata, ApiKey::Metadata, 12)? == 2);

    // Its Fetch's answer is trickled.
    relay.trickle_next_answer(40 * 1024, Duration::from_millis(200));
    c.write_all(&framed(ApiKey::Fetch, 12, 3, &fetch("big", 0, MIB as i32))?)?;
    let started = Instant::now();
    // The frame holds memory while it trickles in.
    let deadline = started + Duration::from_secs(30);
    let mut held = 0;
    while held == 0 {
        ensure!(
            Instant::now() < deadline,
            "the trickled answer never held memory"
        );
        held = p.metric(gauge)?;
        std::thread::sleep(Duration::from_millis(20));
    }
    // The client's connection is closed within a bound (the 3 s timeout,
    // with room for a loaded machine); without one it would stay open
    // while the trickle lasts (about 2 days for 1 MiB).
    c.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut rest = Vec::new();
    let closed = c.read_to_end(&mut rest);
    let after = started.elapsed();
    ensure!(
        after < Duration::from_secs(60),
        "the client's connection was not closed within 60 s of a trickled answer ({closed:?}); response budget held: {:?}",
        p.metric(gauge)
    );
    ensure!(
        rest.is_empty(),
        "the client got {} bytes of the trickled answer",
        rest.len()
    );
    wait_for_metric(&p, timeouts, 1, Duration::from_secs(10))?;
    wait_for_metric(&p, gauge, 0, Duration::from_secs(10))?;
    let lines = p.log_lines_once_logged(
        "MIRROR_PROXY_RESPONSE_READ_TIMEOUT_MS",
        Duration::from_secs(10),
    )?;
    ensure!(lines == 1, "logged {lines} times:\n{}", p.logs());
    // The broker connection was closed too: the relay's next byte finds
    // its client (the proxy) gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    let cut = loop {
        if let Some(cut) = relay.trickle_cut() {
            break cut;
        }
        ensure!(
            Instant::now() < deadline,
            "the proxy's broker connection is still open"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!(
        "trickled answer: {held} bytes of the response budget held; client closed {after:?} after its Fetch; the relay found the broker connection closed {:?} after it",
        cut.saturating_duration_since(started)
    );
    // A new client is served as before.
    ordinary_client_answered(&p, "after the trickling broker connection was closed")?;
    Ok(())
}
