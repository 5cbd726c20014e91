//! What the link costs a replicator when everything is new to it, beside
//! the same writes straight to the broker, in one run (issue 27):
//!
//! 1. first contact: the first batch of a new partition and producer, that
//!    producer's next batch, and a new producer on a known partition, one
//!    at a time over `--first` partitions (median and max);
//! 2. fan-out: the first `--batches` batches of P partitions x M producers
//!    (the same M source producers write every partition), as
//!    mode A, batched like a real producer: one connection, each request
//!    carrying the next batch of every partition that has one, at most 5
//!    requests in flight; mode B, one partition per request, as the
//!    example replicator sends them: `--connections` connections, one
//!    request in flight on each; the time until every batch of every
//!    partition is acknowledged (a retriable refusal is sent again, after
//!    100 ms);
//! 3. many producers: batches/s of `--rate-batches` idempotent batches
//!    spread over `--few` distinct producers, then over `--many` (each of
//!    whose first batch needs a state-topic claim through the link), then
//!    the `--many` producers' next batches on the same topics (their
//!    origins claimed: what many producers cost past first contact); with
//!    `--proxy-pid`, the proxy's RSS growth per new producer.
//!
//! Link batches are what the replicator sends: the source producer ids,
//! epochs and sequences, and the link's client id (`--client-id`). Every
//! case writes to topics of its own, made for this run (`--prefix`, which
//! must match the link's topics, `MIRROR_PROXY_LINK_<NAME>_TOPICS`, e.g.
//! `fan-.*`). With `--admin`, the proxy's state-topic writes during each
//! case (count, total time, claims) are read from its `/metrics`.
//!
//! ```text
//! cargo run --release --example fanout -- --broker 127.0.0.1:9092 \
//!     --link 127.0.0.1:19092 --client-id mirror-fan [--admin 127.0.0.1:9100] \
//!     [--proxy-pid PID] [--sizes 1x1,50x10,500x10,1000x10] [--cases 1,2,3]
//! ```
//!
//! `scripts/fanout.sh` starts a broker and the proxy (and, with
//! `BASELINE_BIN`, an older build beside it) and runs this.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use kafka_mirror_proxy::client::protocol::NewTopic;
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};

const VERSION: i16 = 9;
/// A Produce response to a thousand partitions is a few tens of KiB.
const MAX_RESPONSE: usize = 16 << 20;
/// Kafka's answers that a batch is in (an earlier attempt landed).
const DUPLICATE_SEQUENCE: i16 = 46;
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// Requests in flight on one connection in mode A and case 3 (a Kafka
/// producer's max.in.flight.requests.per.connection with idempotence).
const WINDOW: usize = 5;
const VALUE: [u8; 100] = [b'v'; 100];

struct Options {
    broker: String,
    link: String,
    client_id: String,
    prefix: String,
    admin: Option<String>,
    proxy_pid: Option<u32>,
    first: i32,
    sizes: Vec<(i32, i64)>,
    batches: usize,
    connections: usize,
    rate_partitions: i32,
    rate_batches: usize,
    few: usize,
    many: usize,
    cases: Vec<u8>,
    timeout: Duration,
}

fn options() -> Result<Options> {
    let mut o = Options {
        broker: String::new(),
        link: String::new(),
        client_id: "mirror-fan".into(),
        prefix: "fan".into(),
        admin: None,
        proxy_pid: None,
        first: 20,
        sizes: vec![(1, 1), (50, 10), (500, 10), (1000, 10)],
        batches: 5,
        connections: 5,
        rate_partitions: 10,
        rate_batches: 100_000,
        few: 1_000,
        many: 100_000,
        cases: vec![1, 2, 3],
        timeout: Duration::from_secs(300),
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        let value = args
            .get(i + 1)
            .with_context(|| format!("{flag} needs a value"))?
            .clone();
        i += 2;
        match flag {
            "--broker" => o.broker = value,
            "--link" => o.link = value,
            "--client-id" => o.client_id = value,
            "--prefix" => o.prefix = value,
            "--admin" => o.admin = Some(value),
            "--proxy-pid" => o.proxy_pid = Some(value.parse()?),
            "--first" => o.first = value.parse()?,
            "--sizes" => {
                o.sizes = value
                    .split(',')
                    .map(|s| {
                        let (p, m) = s.split_once('x').context("a size is PxM")?;
                        Ok((p.parse()?, m.parse()?))
                    })
                    .collect::<Result<_>>()?
            }
            "--batches" => o.batches = value.parse()?,
            "--connections" => o.connections = value.parse()?,
            "--rate-partitions" => o.rate_partitions = value.parse()?,
            "--rate-batches" => o.rate_batches = value.parse()?,
            "--few" => o.few = value.parse()?,
            "--many" => o.many = value.parse()?,
            "--cases" => {
                o.cases = value
                    .split(',')
                    .map(|c| c.parse())
                    .collect::<Result<_, _>>()?
            }
            "--timeout" => o.timeout = Duration::from_secs(value.parse()?),
            _ => bail!("unknown flag {flag}"),
        }
    }
    ensure!(
        !o.broker.is_empty() && !o.link.is_empty(),
        "usage: fanout --broker ADDR --link ADDR [--client-id ID] [--prefix P] [--admin ADDR] [--proxy-pid PID] [--first N] [--sizes PxM,...] [--batches N] [--connections N] [--rate-partitions N] [--rate-batches N] [--few N] [--many N] [--cases 1,2,3] [--timeout S]"
    );
    ensure!(
        o.few.is_multiple_of(o.rate_partitions as usize)
            && o.many.is_multiple_of(o.rate_partitions as usize),
        "--few and --many must be multiples of --rate-partitions"
    );
    ensure!(
        o.rate_batches.is_multiple_of(o.many) && o.rate_batches.is_multiple_of(o.few),
        "--rate-batches must be a multiple of --few and --many (every producer sends as many batches)"
    );
    Ok(o)
}

fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("fanout: {e}");
            return ExitCode::FAILURE;
        }
    };
    match options().and_then(|o| rt.block_on(run(&o))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fanout: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One connection, requests pipelined, responses read in order.
struct Conn {
    r: BufReader<OwnedReadHalf>,
    w: OwnedWriteHalf,
    client_id: String,
    next: i32,
    owed: std::collections::VecDeque<i32>,
}

impl Conn {
    async fn connect(addr: &str, client_id: &str) -> Result<Conn> {
        let s = TcpStream::connect(addr)
            .await
            .with_context(|| format!("connecting to {addr}"))?;
        s.set_nodelay(true)?;
        let (r, w) = s.into_split();
        Ok(Conn {
            r: BufReader::with_capacity(64 << 10, r),
            w,
            client_id: client_id.into(),
            next: 0,
            owed: Default::default(),
        })
    }

    async fn send(&mut self, body: &ProduceRequest) -> Result<()> {
        let header = RequestHeader::default()
            .with_request_api_key(ApiKey::Produce as i16)
            .with_request_api_version(VERSION)
            .with_correlation_id(self.next)
            .with_client_id(Some(StrBytes::from_string(self.client_id.clone())));
        let mut buf = BytesMut::with_capacity(4096);
        buf.extend_from_slice(&[0; 4]);
        header.encode(&mut buf, ApiKey::Produce.request_header_version(VERSION))?;
        body.encode(&mut buf, VERSION)?;
        let len = u32::try_from(buf.len() - 4)?;
        buf[..4].copy_from_slice(&len.to_be_bytes());
        self.w.write_all(&buf).await?;
        self.owed.push_back(self.next);
        self.next += 1;
        Ok(())
    }

    /// The next response: partition index -> error code (one topic).
    async fn recv(&mut self) -> Result<HashMap<i32, i16>> {
        let correlation = self.owed.pop_front().context("no request in flight")?;
        let size = self.r.read_u32().await? as usize;
        ensure!(size <= MAX_RESPONSE, "a response of {size} bytes announced");
        let mut frame = vec![0u8; size];
        self.r.read_exact(&mut frame).await?;
        let mut frame = Bytes::from(frame);
        let header =
            ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(VERSION))?;
        ensure!(
            header.correlation_id == correlation,
            "correlation {} != {correlation}",
            header.correlation_id
        );
        let response = ProduceResponse::decode(&mut frame, VERSION)?;
        Ok(response
            .responses
            .iter()
            .flat_map(|t| t.partition_responses.iter())
            .map(|p| (p.index, p.error_code))
            .collect())
    }

    /// One request, its answer.
    async fn produce(
        &mut self,
        topic: &str,
        parts: Vec<(i32, Bytes)>,
    ) -> Result<HashMap<i32, i16>> {
        self.send(&request(topic, parts)).await?;
        self.recv().await
    }
}

fn request(topic: &str, parts: Vec<(i32, Bytes)>) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(30_000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(
                parts
                    .into_iter()
                    .map(|(index, records)| {
                        PartitionProduceData::default()
                            .with_index(index)
                            .with_records(Some(records))
                    })
                    .collect(),
            )])
}

/// One 100-byte record from `pid` at `sequence` (epoch 0, idempotent).
fn batch(pid: i64, sequence: i32) -> Bytes {
    let records = [NewRecord {
        key: None,
        value: Some(&VALUE),
        headers: &[],
        timestamp: 1_700_000_000_000,
    }];
    let header = NewBatch {
        producer_id: pid,
        producer_epoch: 0,
        base_sequence: sequence,
        transactional: false,
        control: false,
    };
    Bytes::from(build(&header, &records).expect("a one-record batch"))
}

fn client(broker: &str) -> Client {
    Client::new(ClientConfig::new(
        vec![broker.to_string()],
        Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(10),
        },
    ))
}

/// Create `name` with `partitions` and wait until every partition has a
/// leader (bounded), so the first Produce measures the write, not the
/// topic's creation.
async fn create(c: &Client, name: &str, partitions: i32) -> Result<()> {
    c.create_topic(&NewTopic {
        name: name.into(),
        partitions,
        replication_factor: 1,
        configs: Vec::new(),
    })
    .await
    .with_context(|| format!("creating {name}"))?;
    for _ in 0..300 {
        if let Ok(t) = c.topic(name).await {
            if t.partitions.len() == partitions as usize
                && t.partitions.iter().all(|p| p.leader >= 0)
            {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("{name}: partitions without a leader after 30 s")
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn median_max(v: &mut [Duration]) -> String {
    v.sort();
    format!("{:.1} / {:.1} ms", ms(v[v.len() / 2]), ms(v[v.len() - 1]))
}

/// The proxy's counters that say where a case's time went.
#[derive(Clone, Copy, Default)]
struct ProxySample {
    writes: f64,
    write_seconds: f64,
    claims: f64,
    cpu_ticks: f64,
    rss_kib: f64,
}

async fn sample(o: &Options) -> ProxySample {
    let mut s = ProxySample::default();
    if let Some(admin) = &o.admin {
        if let Ok(text) = http_get(admin, "/metrics").await {
            let value = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                    .unwrap_or(0.0)
            };
            s.writes = value("kafka_mirror_proxy_state_write_seconds_count");
            s.write_seconds = value("kafka_mirror_proxy_state_write_seconds_sum");
            s.claims = value("kafka_mirror_proxy_state_origins_persisted_total");
        }
    }
    if let Some(pid) = o.proxy_pid {
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The fields after the parenthesised command name.
            let fields: Vec<&str> = stat
                .rsplit_once(") ")
                .map_or("", |(_, f)| f)
                .split_whitespace()
                .collect();
            let tick = |i: usize| {
                fields
                    .get(i)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or(0.0)
            };
            s.cpu_ticks = tick(11) + tick(12);
        }
        if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
            s.rss_kib = status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0.0);
        }
    }
    s
}

/// What the proxy did between two samples, for the table's notes.
fn proxy_note(o: &Options, a: ProxySample, b: ProxySample) -> String {
    let mut parts = Vec::new();
    if o.admin.is_some() {
        let writes = b.writes - a.writes;
        parts.push(format!(
            "state writes {writes:.0} ({:.0} claims, {:.2} s in writes, {:.1} ms each)",
            b.claims - a.claims,
            b.write_seconds - a.write_seconds,
            if writes > 0.0 {
                (b.write_seconds - a.write_seconds) * 1e3 / writes
            } else {
                0.0
            }
        ));
    }
    if o.proxy_pid.is_some() {
        parts.push(format!(
            "proxy CPU {:.2} s",
            (b.cpu_ticks - a.cpu_ticks) / 100.0
        ));
    }
    parts.join(", ")
}

async fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), TcpStream::connect(addr)).await??;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut body = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(5),
        (&mut s).take(64 << 20).read_to_end(&mut body),
    )
    .await??;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

async fn run(o: &Options) -> Result<()> {
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis()
        % 100_000_000;
    let admin = client(&o.broker);
    let topic = |path: &str, case: &str| format!("{}-{path}-{run_id}-{case}", o.prefix);
    let paths = [
        ("direct", o.broker.as_str(), "fanout-direct"),
        ("link", o.link.as_str(), o.client_id.as_str()),
    ];
    println!(
        "fanout: broker {}, link {} as {}, run {run_id}",
        o.broker, o.link, o.client_id
    );

    if o.cases.contains(&1) {
        println!(
            "\n1. first contact, {} partitions, one request at a time (median / max)",
            o.first
        );
        let mut rows: Vec<(&str, Vec<Duration>, Vec<Duration>)> = vec![
            ("new partition and producer", vec![], vec![]),
            ("the producer's next batch", vec![], vec![]),
            ("new producer, known partition", vec![], vec![]),
        ];
        let mut conns = Vec::new();
        for (path, addr, client_id) in paths {
            let t = topic(path, "first");
            create(&admin, &t, o.first).await?;
            conns.push((t, Conn::connect(addr, client_id).await?));
        }
        let before = sample(o).await;
        for partition in 0..o.first {
            for (row, pid, sequence) in [(0, 10, 0), (1, 10, 1), (2, 11, 0)] {
                for (k, (t, c)) in conns.iter_mut().enumerate() {
                    let started = Instant::now();
                    let codes = c
                        .produce(t, vec![(partition, batch(pid, sequence))])
                        .await?;
                    let took = started.elapsed();
                    let code = codes.get(&partition).copied().unwrap_or(-1);
                    ensure!(code == 0, "{t}-{partition} pid {pid}: error {code}");
                    if k == 0 {
                        rows[row].1.push(took);
                    } else {
                        rows[row].2.push(took);
                    }
                }
            }
        }
        let after = sample(o).await;
        println!("| first Produce of | direct | link |\n|---|---|---|");
        for (what, d, l) in &mut rows {
            println!("| {what} | {} | {} |", median_max(d), median_max(l));
        }
        println!("proxy: {}", proxy_note(o, before, after));
    }

    if o.cases.contains(&2) {
        println!(
            "\n2. fan-out: the first {} batches of each partition x producer, until every partition is acknowledged",
            o.batches
        );
        println!("| P x M | mode | direct | link | link / direct | link retries | proxy during the link run |\n|---|---|---|---|---|---|---|");
        for &(p, m) in &o.sizes {
            for mode in [Mode::Batched, Mode::PerPartition] {
                let mut times = Vec::new();
                let mut note = String::new();
                let mut retries = 0;
                for (path, addr, client_id) in paths {
                    let t = topic(path, &format!("{p}x{m}{}", mode.short()));
                    create(&admin, &t, p).await?;
                    let before = sample(o).await;
                    let r = fan(o, addr, client_id, &t, p, m, mode).await?;
                    let after = sample(o).await;
                    if path == "link" {
                        note = proxy_note(o, before, after);
                        retries = r.retries;
                    }
                    times.push(r);
                }
                let shown = |r: &Fanned| match r.unfinished {
                    0 => format!("{:.3} s", r.took.as_secs_f64()),
                    n => format!(
                        "{n} of {p} partitions unfinished after {:.0} s",
                        r.took.as_secs_f64()
                    ),
                };
                println!(
                    "| {p} x {m} | {} | {} | {} | {:.1}x | {retries} | {note} |",
                    mode.name(),
                    shown(&times[0]),
                    shown(&times[1]),
                    times[1].took.as_secs_f64() / times[0].took.as_secs_f64().max(1e-6)
                );
            }
        }
    }

    if o.cases.contains(&3) {
        println!(
            "\n3. many producers: {} batches over {} partitions, {} connections x {WINDOW} in flight",
            o.rate_batches, o.rate_partitions, o.connections
        );
        println!("| distinct producers | direct batches/s | link batches/s | link / direct | errors (direct, link) | proxy during the link run |\n|---|---|---|---|---|---|");
        let mut link_rates = Vec::new();
        // The last pass sends `--many` producers their next batches on the
        // same topics: every origin is claimed, so it measures what a
        // million producers cost past their first contact.
        for (producers, pass) in [(o.few, 0), (o.many, 0), (o.many, 1)] {
            let again = pass > 0;
            let mut rates = Vec::new();
            let mut errors = Vec::new();
            let mut note = String::new();
            for (path, addr, client_id) in paths {
                let t = topic(path, &format!("rate{producers}"));
                if !again {
                    create(&admin, &t, o.rate_partitions).await?;
                }
                let first_round = pass * o.rate_batches / producers;
                let before = sample(o).await;
                let (rate, errs) = rate(o, addr, client_id, &t, producers, first_round).await?;
                let after = sample(o).await;
                if path == "link" {
                    note = proxy_note(o, before, after);
                    if o.proxy_pid.is_some() && !again {
                        note.push_str(&format!(
                            ", RSS {:.0} -> {:.0} MiB ({:.0} bytes per new producer)",
                            before.rss_kib / 1024.0,
                            after.rss_kib / 1024.0,
                            (after.rss_kib - before.rss_kib) * 1024.0 / producers as f64
                        ));
                    }
                    link_rates.push(rate);
                }
                rates.push(rate);
                errors.push(errs);
            }
            let label = if again {
                format!("{producers}, each one's next batch")
            } else {
                producers.to_string()
            };
            println!(
                "| {label} | {:.0} | {:.0} | {:.2}x | {}, {} | {note} |",
                rates[0],
                rates[1],
                rates[1] / rates[0].max(1e-9),
                errors[0],
                errors[1]
            );
        }
        if let [few, many, known] = link_rates[..] {
            println!(
                "link: {} producers at {:.2}x the rate of {} on their first batches, {:.2}x on their next",
                o.many,
                many / few,
                o.few,
                known / few
            );
        }
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// One connection, every ready partition per request, 5 in flight.
    Batched,
    /// One partition per request, `--connections` connections, one in
    /// flight on each.
    PerPartition,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Batched => "A batched",
            Mode::PerPartition => "B one partition per request",
        }
    }
    fn short(self) -> &'static str {
        match self {
            Mode::Batched => "a",
            Mode::PerPartition => "b",
        }
    }
}

struct Fanned {
    took: Duration,
    unfinished: usize,
    retries: usize,
}

/// The first `--batches` batches of each of `m` producers on every
/// partition of `topic`: batch k of a partition is producer k % m's
/// (k / m)-th.
async fn fan(
    o: &Options,
    addr: &str,
    client_id: &str,
    topic: &str,
    p: i32,
    m: i64,
    mode: Mode,
) -> Result<Fanned> {
    let total = o.batches * m as usize;
    let (conns, window) = match mode {
        Mode::Batched => (1, WINDOW),
        Mode::PerPartition => (o.connections.max(1), 1),
    };
    let started = Instant::now();
    let deadline = started + o.timeout;
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conns {
        let partitions: Vec<i32> = (0..p).filter(|q| *q as usize % conns == c).collect();
        let conn = Conn::connect(addr, client_id).await?;
        let topic = topic.to_string();
        let per_request = if mode == Mode::Batched { usize::MAX } else { 1 };
        tasks.spawn(fan_one(
            conn,
            topic,
            partitions,
            m,
            total,
            window,
            per_request,
            deadline,
        ));
    }
    let mut out = Fanned {
        took: Duration::ZERO,
        unfinished: 0,
        retries: 0,
    };
    while let Some(r) = tasks.join_next().await {
        let (unfinished, retries) = r??;
        out.unfinished += unfinished;
        out.retries += retries;
    }
    out.took = started.elapsed();
    Ok(out)
}

/// One connection's share of [`fan`]: (partitions unfinished at the
/// deadline, batches sent again).
#[allow(clippy::too_many_arguments)]
async fn fan_one(
    mut c: Conn,
    topic: String,
    partitions: Vec<i32>,
    m: i64,
    total: usize,
    window: usize,
    per_request: usize,
    deadline: Instant,
) -> Result<(usize, usize)> {
    struct Part {
        index: i32,
        next: usize,
        acked: usize,
        generation: u32,
        ready_at: Instant,
    }
    let now = Instant::now();
    let mut parts: Vec<Part> = partitions
        .iter()
        .map(|&index| Part {
            index,
            next: 0,
            acked: 0,
            generation: 0,
            ready_at: now,
        })
        .collect();
    // Per request in flight: (slot in `parts`, batch, generation).
    let mut in_flight: std::collections::VecDeque<Vec<(usize, usize, u32)>> = Default::default();
    let mut cursor = 0;
    let mut retries = 0;
    loop {
        if parts.iter().all(|q| q.acked == total) {
            return Ok((0, retries));
        }
        if Instant::now() >= deadline {
            return Ok((parts.iter().filter(|q| q.acked < total).count(), retries));
        }
        // Send while there is room and something is ready.
        while in_flight.len() < window {
            let now = Instant::now();
            let mut carried = Vec::new();
            let mut data = Vec::new();
            for step in 0..parts.len() {
                if data.len() >= per_request {
                    break;
                }
                let slot = (cursor + step) % parts.len();
                let q = &mut parts[slot];
                // (Mode B has one request in flight: nothing of a
                // partition is in flight when it is picked.)
                if q.next >= total || q.ready_at > now {
                    continue;
                }
                let k = q.next;
                q.next += 1;
                let pid = 1_000 + (k as i64 % m);
                let sequence = (k as i64 / m) as i32;
                data.push((q.index, batch(pid, sequence)));
                carried.push((slot, k, q.generation));
            }
            if data.is_empty() {
                break;
            }
            if per_request == 1 {
                cursor = (carried[0].0 + 1) % parts.len();
            }
            c.send(&request(&topic, data)).await?;
            in_flight.push_back(carried);
        }
        if in_flight.is_empty() {
            // Everything left waits to be retried.
            tokio::time::sleep(RETRY_AFTER / 4).await;
            continue;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let codes = match tokio::time::timeout(left, c.recv()).await {
            Ok(codes) => codes?,
            Err(_) => continue,
        };
        let carried = in_flight
            .pop_front()
            .context("a response without a request")?;
        for (slot, k, generation) in carried {
            let q = &mut parts[slot];
            if generation != q.generation {
                continue; // sent before a refusal of an earlier batch
            }
            match codes.get(&q.index).copied() {
                Some(0 | DUPLICATE_SEQUENCE) if k == q.acked => q.acked += 1,
                _ => {
                    // Refused (or out of order after one): send again from
                    // the first unacknowledged batch.
                    retries += 1;
                    q.generation += 1;
                    q.next = q.acked;
                    q.ready_at = Instant::now() + RETRY_AFTER;
                }
            }
        }
    }
}

/// Batches/s of `--rate-batches` batches over `producers` distinct
/// producers, from their batch `first_round` on (an earlier pass sent the
/// ones before): producer `g * P + r` writes partition r; connection c sends
/// the requests of the producer groups g with g % connections == c, each
/// request one batch of each of the group's producers (so a producer's
/// batches stay in order on one connection). Returns (batches/s, batches
/// refused).
async fn rate(
    o: &Options,
    addr: &str,
    client_id: &str,
    topic: &str,
    producers: usize,
    first_round: usize,
) -> Result<(f64, usize)> {
    let p = o.rate_partitions as usize;
    let groups = producers / p;
    let requests = o.rate_batches / p;
    let conns = o.connections.max(1);
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for c in 0..conns {
        let mut conn = Conn::connect(addr, client_id).await?;
        let topic = topic.to_string();
        let deadline = started + o.timeout;
        // Request j (of all) is group j % groups, round j / groups.
        let mine: Vec<usize> = (0..requests)
            .filter(|j| (j % groups) % conns == c)
            .collect();
        tasks.spawn(async move {
            let mut refused = 0usize;
            let mut acked = 0usize;
            let mut owed = 0usize;
            let mut next = 0usize;
            while next < mine.len() || owed > 0 {
                while owed < WINDOW && next < mine.len() {
                    let j = mine[next];
                    let (g, round) = (j % groups, first_round + j / groups);
                    let data = (0..p)
                        .map(|r| {
                            let pid = 1_000 + (g * p + r) as i64;
                            (r as i32, batch(pid, round as i32))
                        })
                        .collect();
                    conn.send(&request(&topic, data)).await?;
                    owed += 1;
                    next += 1;
                }
                let left = deadline.saturating_duration_since(Instant::now());
                let codes = tokio::time::timeout(left, conn.recv())
                    .await
                    .context("case 3 timed out")??;
                owed -= 1;
                for code in codes.values() {
                    if *code == 0 {
                        acked += 1;
                    } else {
                        refused += 1;
                    }
                }
            }
            anyhow::Ok((acked, refused))
        });
    }
    let (mut acked, mut refused) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        let (a, f) = r??;
        acked += a;
        refused += f;
    }
    Ok((acked as f64 / started.elapsed().as_secs_f64(), refused))
}
