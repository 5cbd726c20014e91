//! The finish line of `scripts/replicate-bench.sh` (issue 42): watches a
//! destination topic's end offsets until it holds every record of the
//! source topic (or a given count), and says how long the copy took and
//! how much CPU the copying processes spent meanwhile.
//!
//!   copy_watch --destination HOST:PORT --topic T (--source HOST:PORT | --records N)
//!              [--pids PID,...] [--pid-file FILE] [--poll-ms 50] [--timeout-s 600]
//!
//! With `--source`, the target is the source topic's end offsets, read
//! once at start, partition by partition; with `--records`, the sum over
//! the destination's partitions. Every `--poll-ms` one ListOffsets request
//! per destination leader asks for every partition's end offset (a Java
//! tool would take a second or more to start, each poll).
//!
//! The copy starts when the first record is seen on the destination, not
//! when the copier was launched: a JVM copier (MirrorMaker 2) spends
//! seconds starting, which is not its copy rate. The copy ends at the poll
//! that finds every record there. At both moments the CPU time (utime +
//! stime, from /proc/PID/stat) of `--pids` and of the pids in `--pid-file`
//! (read when the first record is seen: the copier is started after this
//! tool says it is ready) is read, so the CPU counted is what those
//! processes spent while copying.
//!
//! Prints `ready` on stderr once the target is known and the destination
//! is empty (a destination that already holds records is an error), then
//! one line on stdout when done:
//!   `seconds=S cpu_seconds=C records=R`
//! Exit codes: 0 done, 1 timed out or failed, 2 usage.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kafka_mirror_proxy::client::conn::Connection;
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::net::upstream::Upstream;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{BrokerId, ListOffsetsRequest, TopicName};
use kafka_protocol::protocol::StrBytes;

const USAGE: &str =
    "usage: copy_watch --destination HOST:PORT --topic T (--source HOST:PORT | --records N) \
[--pids PID,...] [--pid-file FILE] [--poll-ms 50] [--timeout-s 600]";

struct Args {
    destination: String,
    topic: String,
    source: Option<String>,
    records: Option<i64>,
    pids: Vec<u32>,
    pid_file: Option<String>,
    poll: Duration,
    timeout: Duration,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        destination: String::new(),
        topic: String::new(),
        source: None,
        records: None,
        pids: Vec::new(),
        pid_file: None,
        poll: Duration::from_millis(50),
        timeout: Duration::from_secs(600),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: not a number: {v}"))
        };
        match flag.as_str() {
            "--destination" => a.destination = value,
            "--topic" => a.topic = value,
            "--source" => a.source = Some(value),
            "--records" => a.records = Some(number(&value)? as i64),
            "--pids" => {
                for p in value.split(',').filter(|p| !p.is_empty()) {
                    a.pids.push(number(p)? as u32);
                }
            }
            "--pid-file" => a.pid_file = Some(value),
            "--poll-ms" => a.poll = Duration::from_millis(number(&value)?),
            "--timeout-s" => a.timeout = Duration::from_secs(number(&value)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if a.destination.is_empty() || a.topic.is_empty() || a.source.is_some() == a.records.is_some() {
        return Err("--destination, --topic and one of --source, --records are required".into());
    }
    Ok(a)
}

/// One topic's partitions, grouped by the address of their leader, with a
/// connection to each leader.
struct Watched {
    leaders: Vec<(Connection, Vec<i32>)>,
    topic: String,
}

impl Watched {
    async fn open(bootstrap: &str, topic: &str) -> Result<Watched> {
        let config = ClientConfig::new(
            vec![bootstrap.to_string()],
            Upstream {
                tls: None,
                server_name: None,
                timeout: Duration::from_secs(10),
            },
        );
        let client = Client::new(config.clone());
        let info = client
            .topic(topic)
            .await
            .with_context(|| format!("metadata of {topic} at {bootstrap}"))?;
        let brokers = client.brokers().await?;
        let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for p in &info.partitions {
            let leader = brokers
                .iter()
                .find(|b| b.node_id == p.leader)
                .ok_or_else(|| anyhow!("{topic}-{}: no leader", p.partition))?;
            by_leader
                .entry(leader.address())
                .or_default()
                .push(p.partition);
        }
        let mut leaders = Vec::new();
        for (address, partitions) in by_leader {
            leaders.push((Connection::open(&config, &address).await?, partitions));
        }
        Ok(Watched {
            leaders,
            topic: topic.to_string(),
        })
    }

    /// Every partition's end offset (the high watermark).
    async fn end_offsets(&mut self) -> Result<BTreeMap<i32, i64>> {
        let mut out = BTreeMap::new();
        for (conn, partitions) in &mut self.leaders {
            let topic = &self.topic;
            let (_, response) = conn
                .call(Duration::ZERO, |version| {
                    let mut request = ListOffsetsRequest::default()
                        .with_replica_id(BrokerId(-1))
                        .with_isolation_level(0)
                        .with_topics(vec![ListOffsetsTopic::default()
                            .with_name(TopicName(StrBytes::from_string(topic.clone())))
                            .with_partitions(
                                partitions
                                    .iter()
                                    .map(|&p| {
                                        ListOffsetsPartition::default()
                                            .with_partition_index(p)
                                            .with_current_leader_epoch(-1)
                                            .with_timestamp(-1) // latest
                                    })
                                    .collect(),
                            )]);
                    if version >= 10 {
                        request = request.with_timeout_ms(10_000);
                    }
                    Ok(request)
                })
                .await?;
            for t in &response.topics {
                for p in &t.partitions {
                    if p.error_code != 0 {
                        bail!(
                            "end offset of {topic}-{}: error {}",
                            p.partition_index,
                            p.error_code
                        );
                    }
                    out.insert(p.partition_index, p.offset);
                }
            }
        }
        Ok(out)
    }
}

/// A topic's end offsets, through a `Watched` opened on first use and
/// opened again after any error (a topic just created may answer
/// NOT_LEADER_OR_FOLLOWER or LEADER_NOT_AVAILABLE for a while, more so with
/// 1,000 partitions), until `deadline`.
struct Offsets {
    bootstrap: String,
    topic: String,
    watched: Option<Watched>,
    deadline: Instant,
}

impl Offsets {
    fn new(bootstrap: &str, topic: &str, deadline: Instant) -> Offsets {
        Offsets {
            bootstrap: bootstrap.to_string(),
            topic: topic.to_string(),
            watched: None,
            deadline,
        }
    }

    async fn end_offsets(&mut self) -> Result<BTreeMap<i32, i64>> {
        loop {
            let attempt = async {
                if self.watched.is_none() {
                    self.watched = Some(Watched::open(&self.bootstrap, &self.topic).await?);
                }
                match &mut self.watched {
                    Some(w) => w.end_offsets().await,
                    None => unreachable!(),
                }
            };
            match attempt.await {
                Ok(offsets) => return Ok(offsets),
                Err(e) if Instant::now() < self.deadline => {
                    eprintln!("copy_watch: {e:#}; retrying");
                    self.watched = None;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("process {pid} is gone"))?;
    // Fields after the command name, which is in parentheses and may hold
    // spaces: state is the first, utime the 12th, stime the 13th.
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11) + ticks(12)) as f64 / hz)
}

fn cpu_of(pids: &[u32]) -> Result<f64> {
    pids.iter().map(|&p| cpu_seconds(p)).sum()
}

fn pids_of_file(path: &Option<String>) -> Result<Vec<u32>> {
    let Some(path) = path else {
        return Ok(Vec::new());
    };
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("pid file {path}: the copier should have been started"))?;
    text.split_whitespace()
        .map(|p| {
            p.parse::<u32>()
                .with_context(|| format!("pid file {path}: {p}"))
        })
        .collect()
}

async fn watch(a: Args) -> Result<()> {
    let deadline = Instant::now() + a.timeout;
    let target: BTreeMap<i32, i64> = match &a.source {
        Some(source) => {
            Offsets::new(source, &a.topic, deadline)
                .end_offsets()
                .await?
        }
        None => BTreeMap::new(),
    };
    let records: i64 = a.records.unwrap_or_else(|| target.values().sum());
    let mut destination = Offsets::new(&a.destination, &a.topic, deadline);
    let done = |offsets: &BTreeMap<i32, i64>| match a.source {
        Some(_) => target
            .iter()
            .all(|(p, end)| offsets.get(p).is_some_and(|o| o >= end)),
        None => offsets.values().sum::<i64>() >= records,
    };
    let first = destination.end_offsets().await?;
    if first.values().any(|&o| o > 0) {
        bail!("{} already holds records on the destination", a.topic);
    }
    eprintln!(
        "ready: waiting for {records} records in {} on {}",
        a.topic, a.destination
    );

    let mut started: Option<(Instant, f64, Vec<u32>)> = None;
    let mut last_report = Instant::now();
    loop {
        let now = Instant::now();
        if now > deadline {
            let held: i64 = destination.end_offsets().await?.values().sum();
            bail!(
                "timed out after {:?}: {held} of {records} records on the destination",
                a.timeout
            );
        }
        let offsets = destination.end_offsets().await?;
        let held: i64 = offsets.values().sum();
        if started.is_none() && held > 0 {
            let mut pids = a.pids.clone();
            pids.extend(pids_of_file(&a.pid_file)?);
            let cpu = cpu_of(&pids)?;
            started = Some((now, cpu, pids));
        }
        if let Some((t0, cpu0, pids)) = &started {
            if done(&offsets) {
                let cpu = cpu_of(pids)? - cpu0;
                println!(
                    "seconds={:.3} cpu_seconds={:.2} records={held}",
                    now.duration_since(*t0).as_secs_f64(),
                    cpu
                );
                return Ok(());
            }
        }
        if last_report.elapsed() >= Duration::from_secs(10) {
            eprintln!("{held} of {records} records on the destination");
            last_report = Instant::now();
        }
        tokio::time::sleep_until((now + a.poll).into()).await;
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("copy_watch: {e}\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    match watch(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("copy_watch: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
