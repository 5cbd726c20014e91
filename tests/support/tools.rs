//! Kafka's own Java command-line tools (console producer and consumer,
//! producer perf test, topics, API versions, cluster id, log dump), run as
//! processes on the classpath of [`super::kafka::jars_dir`], with timeouts
//! and parsers for their output.
//!
//! Client properties (`props`) are written to a temp file passed with
//! `--command-config`; an empty slice means a plain PLAINTEXT client.
//! [`props_ref`] turns `KafkaCluster::client_properties()` into that form.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};

use super::kafka::{jars_dir, java_bin};

pub const CONSOLE_PRODUCER: &str = "org.apache.kafka.tools.ConsoleProducer";
pub const CONSOLE_CONSUMER: &str = "org.apache.kafka.tools.consumer.ConsoleConsumer";
pub const PRODUCER_PERFORMANCE: &str = "org.apache.kafka.tools.ProducerPerformance";
pub const TOPIC_COMMAND: &str = "org.apache.kafka.tools.TopicCommand";
pub const BROKER_API_VERSIONS: &str = "org.apache.kafka.tools.BrokerApiVersionsCommand";
pub const DUMP_LOG_SEGMENTS: &str = "org.apache.kafka.tools.DumpLogSegments";
pub const CLUSTER_TOOL: &str = "org.apache.kafka.tools.ClusterTool";
pub const CONSUMER_GROUP_COMMAND: &str =
    "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand";

/// Default limit for one tool run.
pub const TOOL_TIMEOUT: Duration = Duration::from_secs(120);

/// Tools start a fresh JVM each time; C1-only JIT and serial GC shave start-up.
const FAST_JVM_ARGS: &[&str] = &[
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
];
/// The perf test measures throughput, so it gets the full JIT.
const PERF_JVM_ARGS: &[&str] = &["-Xmx512m", "-XX:-UsePerfData"];

/// Tool logging: WARN and above to stderr, so stdout carries only tool output.
const TOOLS_LOG4J2: &str = "\
status = warn
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
";

/// Producer reader properties (`--reader-property`) rather than producer configs.
const READER_KEYS: &[&str] = &[
    "parse.key",
    "parse.headers",
    "key.separator",
    "headers.delimiter",
    "headers.separator",
    "headers.key.separator",
    "null.marker",
    "ignore.error",
];

/// Consumer formatter properties (`--formatter-property`) rather than consumer configs.
const FORMATTER_KEYS: &[&str] = &[
    "key.separator",
    "line.separator",
    "headers.separator",
    "null.literal",
    "key.deserializer",
    "value.deserializer",
    "header.deserializer",
];

/// Borrows owned property pairs as the `&[(&str, &str)]` the helpers take.
pub fn props_ref(props: &[(String, String)]) -> Vec<(&str, &str)> {
    props
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// A finished command's stdout then stderr, as text (for messages).
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs a tool class with the default timeout and no stdin; any exit status.
pub fn java(class: &str, args: &[&str]) -> Result<Output> {
    java_with_input(class, args, None, TOOL_TIMEOUT)
}

/// Runs a tool class, feeding `stdin` (then closing it) and killing it after
/// `timeout` (an error carrying its output so far). Any exit status is Ok.
pub fn java_with_input(
    class: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output> {
    run_java(FAST_JVM_ARGS, class, args, stdin, timeout)
}

/// JVM arguments every tool run of this test process gets after its own
/// (e.g. `-Djdk.net.hosts.file=…` so that the tools resolve test host
/// names without a system file being edited). Set once per process.
static TOOLS_EXTRA_JVM_ARGS: OnceLock<Vec<String>> = OnceLock::new();

/// Sets [`TOOLS_EXTRA_JVM_ARGS`]; fails if it was set to something else.
pub fn set_tools_jvm_args(args: &[&str]) -> Result<()> {
    let want: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    let set = TOOLS_EXTRA_JVM_ARGS.get_or_init(|| want.clone());
    ensure!(*set == want, "tool JVM arguments already set to {set:?}");
    Ok(())
}

fn run_java(
    jvm_args: &[&str],
    class: &str,
    args: &[&str],
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output> {
    let libs = jars_dir()?;
    let mut cmd = Command::new(java_bin());
    cmd.args(jvm_args)
        .args(TOOLS_EXTRA_JVM_ARGS.get().into_iter().flatten())
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            tools_log_config(&libs)?.display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", libs.display()))
        .arg(class)
        .args(args);
    run_with_timeout(cmd, stdin, timeout)
        .with_context(|| format!("running {class} {}", args.join(" ")))
}

/// Writes the tools' log4j2 config next to the jars once per process
/// (temp file + rename, so concurrent test processes never see half a file).
fn tools_log_config(libs: &Path) -> Result<PathBuf> {
    static PATH: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    PATH.get_or_init(|| {
        let parent = libs.parent().unwrap_or(libs);
        let path = parent.join("log4j2-tools.properties");
        let tmp = parent.join(format!(".log4j2-tools.{}.tmp", std::process::id()));
        fs::write(&tmp, TOOLS_LOG4J2)
            .and_then(|_| fs::rename(&tmp, &path))
            .map(|_| path)
            .map_err(|e| format!("writing tools log config in {}: {e}", parent.display()))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}

/// Runs `cmd` with piped stdout/stderr, optional stdin, and a deadline; on
/// timeout kills it and returns an error with the tail of its output.
pub fn run_with_timeout(
    mut cmd: Command,
    stdin: Option<&[u8]>,
    timeout: Duration,
) -> Result<Output> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("spawning {:?}", cmd.get_program()))?;
    // Feed stdin and drain both pipes on threads so no pipe can fill and block.
    let writer = match (stdin, child.stdin.take()) {
        (Some(input), Some(mut pipe)) => {
            let input = input.to_vec();
            Some(thread::spawn(move || {
                let _ = pipe.write_all(&input);
            }))
        }
        _ => None,
    };
    let drain = |r: Option<Box<dyn Read + Send>>| {
        thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out_reader = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err_reader = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        thread::sleep(Duration::from_millis(25));
    };
    if let Some(w) = writer {
        let _ = w.join();
    }
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => bail!(
            "timed out after {timeout:?} and was killed; stdout:\n{}\nstderr:\n{}",
            tail_str(&String::from_utf8_lossy(&stdout), 40),
            tail_str(&String::from_utf8_lossy(&stderr), 40)
        ),
    }
}

/// The last `n` lines of `text`.
pub fn tail_str(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut s = lines[lines.len().saturating_sub(n)..].join("\n");
    s.push('\n');
    s
}

/// Java `.properties` text: escapes backslashes, line breaks (so PEM and JAAS
/// values fit on one line), leading blanks and key separators.
pub fn properties_text(props: &[(&str, &str)]) -> String {
    fn escape(s: &str, is_key: bool) -> String {
        let mut out = String::new();
        for (i, c) in s.chars().enumerate() {
            match c {
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                ' ' if is_key || i == 0 => out.push_str("\\ "),
                '=' | ':' | '#' | '!' if is_key => {
                    out.push('\\');
                    out.push(c);
                }
                c => out.push(c),
            }
        }
        out
    }
    props
        .iter()
        .map(|(k, v)| format!("{}={}\n", escape(k, true), escape(v, false)))
        .collect()
}

pub fn write_properties(path: &Path, props: &[(&str, &str)]) -> Result<()> {
    fs::write(path, properties_text(props)).with_context(|| format!("writing {}", path.display()))
}

/// `--command-config <file>` arguments for `props` (none if empty); keep the
/// returned file alive until the tool has run.
fn command_config(
    props: &[(&str, &str)],
) -> Result<(Option<tempfile::NamedTempFile>, Vec<String>)> {
    if props.is_empty() {
        return Ok((None, vec![]));
    }
    let mut file = tempfile::Builder::new()
        .prefix("kafka-client-")
        .suffix(".properties")
        .tempfile()?;
    file.write_all(properties_text(props).as_bytes())?;
    file.flush()?;
    let args = vec![
        "--command-config".to_string(),
        file.path().display().to_string(),
    ];
    Ok((Some(file), args))
}

fn check(class: &str, out: &Output) -> Result<String> {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{class} failed ({}); stdout:\n{}\nstderr:\n{}",
            out.status,
            tail_str(&stdout, 40),
            tail_str(&String::from_utf8_lossy(&out.stderr), 40)
        );
    }
    Ok(stdout)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Creates a topic (replication factor 1) with topic `configs`; `client`
/// holds client security properties (empty for PLAINTEXT).
pub fn create_topic(
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    configs: &[(&str, &str)],
    client: &[(&str, &str)],
) -> Result<()> {
    create_topic_replicated(bootstrap, topic, partitions, 1, configs, client)
}

/// [`create_topic`] with `replication_factor` replicas of each partition.
pub fn create_topic_replicated(
    bootstrap: &str,
    topic: &str,
    partitions: u32,
    replication_factor: u32,
    configs: &[(&str, &str)],
    client: &[(&str, &str)],
) -> Result<()> {
    let (_file, mut args) = command_config(client)?;
    args.extend(
        [
            "--bootstrap-server",
            bootstrap,
            "--create",
            "--topic",
            topic,
            "--partitions",
            &partitions.to_string(),
            "--replication-factor",
            &replication_factor.to_string(),
        ]
        .map(String::from),
    );
    for (k, v) in configs {
        args.push("--config".into());
        args.push(format!("{k}={v}"));
    }
    check(TOPIC_COMMAND, &java(TOPIC_COMMAND, &strs(&args))?)?;
    Ok(())
}

/// Topic names, internal ones included.
pub fn list_topics(bootstrap: &str, client: &[(&str, &str)]) -> Result<Vec<String>> {
    let (_file, mut args) = command_config(client)?;
    args.extend(["--bootstrap-server", bootstrap, "--list"].map(String::from));
    let out = check(TOPIC_COMMAND, &java(TOPIC_COMMAND, &strs(&args))?)?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect())
}

/// The client ids of a consumer group's members, via
/// `kafka-consumer-groups.sh --describe --members` (empty when the tool
/// says the group has no active members).
pub fn consumer_group_member_client_ids(
    bootstrap: &str,
    group: &str,
    client: &[(&str, &str)],
) -> Result<Vec<String>> {
    let (_file, mut args) = command_config(client)?;
    args.extend(
        [
            "--bootstrap-server",
            bootstrap,
            "--describe",
            "--members",
            "--group",
            group,
        ]
        .map(String::from),
    );
    let out = check(
        CONSUMER_GROUP_COMMAND,
        &java(CONSUMER_GROUP_COMMAND, &strs(&args))?,
    )?;
    parse_group_members(&out)
}

/// The CLIENT-ID column of ConsumerGroupCommand's `--members` table.
pub fn parse_group_members(out: &str) -> Result<Vec<String>> {
    let mut lines = out.lines().map(str::trim).filter(|l| !l.is_empty());
    let Some(header) = lines.find(|l| l.starts_with("GROUP")) else {
        ensure!(
            out.contains("has no active members"),
            "no member table in ConsumerGroupCommand output:\n{out}"
        );
        return Ok(Vec::new());
    };
    let column = header
        .split_whitespace()
        .position(|c| c == "CLIENT-ID")
        .ok_or_else(|| anyhow!("no CLIENT-ID column in {header:?}"))?;
    lines
        .map(|l| {
            l.split_whitespace()
                .nth(column)
                .map(String::from)
                .ok_or_else(|| anyhow!("short member line {l:?}"))
        })
        .collect()
}

/// The cluster id, via `ClusterTool cluster-id`.
pub fn cluster_id(bootstrap: &str, client: &[(&str, &str)]) -> Result<String> {
    let (_file, mut args) = command_config(client)?;
    let mut full = vec![
        "cluster-id".to_string(),
        "--bootstrap-server".into(),
        bootstrap.into(),
    ];
    full.append(&mut args);
    let out = check(CLUSTER_TOOL, &java(CLUSTER_TOOL, &strs(&full))?)?;
    out.lines()
        .find_map(|l| l.trim().strip_prefix("Cluster ID:"))
        .map(|id| id.trim().to_string())
        .ok_or_else(|| anyhow!("no \"Cluster ID:\" in ClusterTool output:\n{out}"))
}

/// Sends `lines` (one record each) through the console producer.
///
/// `props` are producer configs (e.g. `enable.idempotence`, `acks`,
/// `compression.type`, security) except the reader keys `parse.key`,
/// `parse.headers`, `key.separator` (default tab), `headers.*`,
/// `null.marker`, `ignore.error`, which go to the line reader. With
/// `parse.key=true` a line is `key<TAB>value`. Fails if the tool fails or
/// logs a send error (it exits 0 after async send failures).
pub fn console_produce(
    bootstrap: &str,
    topic: &str,
    lines: &[String],
    props: &[(&str, &str)],
) -> Result<()> {
    let (reader, producer): (Vec<_>, Vec<_>) =
        props.iter().partition(|(k, _)| READER_KEYS.contains(k));
    let (_file, mut args) = command_config(&producer)?;
    args.extend(["--bootstrap-server", bootstrap, "--topic", topic].map(String::from));
    // ConsoleProducer overwrites `compression.type` from the command config
    // with its own `--compression-codec` (default `none`): pass it there.
    if let Some((_, codec)) = producer.iter().find(|(k, _)| *k == "compression.type") {
        args.push("--compression-codec".into());
        args.push(codec.to_string());
    }
    // ConsoleProducer also overwrites `request.timeout.ms` with its own
    // `--request-timeout-ms`, default 1.5 s: on a loaded 2-core machine
    // that times out healthy brokers. Kafka's producer default is 30 s.
    let request_timeout = producer
        .iter()
        .find(|(k, _)| *k == "request.timeout.ms")
        .map_or("30000", |(_, v)| *v);
    args.push("--request-timeout-ms".into());
    args.push(request_timeout.to_string());
    for (k, v) in reader {
        args.push("--reader-property".into());
        args.push(format!("{k}={v}"));
    }
    let mut input = lines.join("\n");
    input.push('\n');
    let out = java_with_input(
        CONSOLE_PRODUCER,
        &strs(&args),
        Some(input.as_bytes()),
        TOOL_TIMEOUT,
    )?;
    check(CONSOLE_PRODUCER, &out)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if let Some(line) = stderr.lines().find(|l| l.contains(" ERROR ")) {
        bail!(
            "{CONSOLE_PRODUCER} reported an error: {line}\nstderr:\n{}",
            tail_str(&stderr, 40)
        );
    }
    Ok(())
}

/// Sends key/value records (`parse.key=true`, tab separator) plus `props`.
pub fn console_produce_kv(
    bootstrap: &str,
    topic: &str,
    records: &[(String, String)],
    props: &[(&str, &str)],
) -> Result<()> {
    let lines: Vec<String> = records.iter().map(|(k, v)| format!("{k}\t{v}")).collect();
    let mut all = vec![("parse.key", "true")];
    all.extend_from_slice(props);
    console_produce(bootstrap, topic, &lines, &all)
}

/// Reads records from the beginning (fresh group) until `expected_count`
/// arrive or none arrives for `timeout`; returns the printed lines, which may
/// be fewer than expected (compare them in the test).
///
/// `props` are consumer configs (e.g. `isolation.level`, `group.id`,
/// security) except `print.*` (e.g. `print.key=true` gives `key<TAB>value`)
/// and the formatter keys `key.separator`, `line.separator`,
/// `headers.separator`, `null.literal`, `*.deserializer`, which go to the formatter.
pub fn console_consume(
    bootstrap: &str,
    topic: &str,
    expected_count: usize,
    props: &[(&str, &str)],
    timeout: Duration,
) -> Result<Vec<String>> {
    let (formatter, consumer): (Vec<_>, Vec<_>) = props
        .iter()
        .partition(|(k, _)| k.starts_with("print.") || FORMATTER_KEYS.contains(k));
    let (_file, mut args) = command_config(&consumer)?;
    args.extend(
        [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--from-beginning",
            "--max-messages",
            &expected_count.to_string(),
            "--timeout-ms",
            &timeout.as_millis().to_string(),
        ]
        .map(String::from),
    );
    for (k, v) in formatter {
        args.push("--formatter-property".into());
        args.push(format!("{k}={v}"));
    }
    // Allow for JVM start and group join on top of the idle timeout.
    let limit = timeout + Duration::from_secs(60);
    let out = java_with_input(CONSOLE_CONSUMER, &strs(&args), None, limit)?;
    let stdout = check(CONSOLE_CONSUMER, &out)?;
    Ok(stdout.lines().map(String::from).collect())
}

/// One batch as `DumpLogSegments` prints it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DumpedBatch {
    pub base_offset: i64,
    pub last_offset: i64,
    /// -1 if printed as `null` (magic < 2).
    pub count: i64,
    pub base_sequence: i32,
    pub last_sequence: i32,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub partition_leader_epoch: i32,
    pub is_transactional: bool,
    pub is_control: bool,
    /// `Some(ms)` for `OptionalLong[ms]`, `None` for `OptionalLong.empty`.
    pub delete_horizon_ms: Option<i64>,
    pub position: u64,
    /// `CreateTime`, `LogAppendTime` or `NoTimestampType`.
    pub timestamp_type: String,
    /// The batch's max timestamp.
    pub timestamp: i64,
    pub size: u64,
    pub magic: u8,
    pub compresscodec: String,
    pub crc: u32,
    pub is_valid: bool,
    /// Only with `deep`.
    pub records: Vec<DumpedRecord>,
}

/// One record of a deep dump. DumpLogSegments prints header keys but not
/// header values; key and payload are decoded as UTF-8 strings.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DumpedRecord {
    pub offset: i64,
    pub timestamp_type: String,
    pub timestamp: i64,
    /// -1 for a null key.
    pub key_size: i32,
    /// -1 for a null value.
    pub value_size: i32,
    pub sequence: i32,
    pub header_keys: Vec<String>,
    pub key: Option<String>,
    pub payload: Option<String>,
    /// For control records, the rest of the line, e.g.
    /// `endTxnMarker: COMMIT coordinatorEpoch: 0`.
    pub control: Option<String>,
}

impl DumpedRecord {
    /// `COMMIT` or `ABORT` for a transaction marker.
    pub fn end_txn_marker(&self) -> Option<&str> {
        let rest = self.control.as_deref()?.split("endTxnMarker: ").nth(1)?;
        rest.split_whitespace().next()
    }
}

/// Dumps one segment file with `DumpLogSegments --files` (and with `deep`,
/// `--deep-iteration --print-data-log`) and parses the batches.
pub fn dump_log_segments(path: &Path, deep: bool) -> Result<Vec<DumpedBatch>> {
    let file = path.display().to_string();
    let mut args = vec!["--files", file.as_str()];
    if deep {
        args.extend(["--deep-iteration", "--print-data-log"]);
    }
    let out = check(DUMP_LOG_SEGMENTS, &java(DUMP_LOG_SEGMENTS, &args)?)?;
    parse_dump_log_segments(&out)
}

/// Parses `DumpLogSegments` output: `baseOffset: ...` batch lines, each
/// followed (deep) by `| offset: ...` record lines; other lines are ignored.
pub fn parse_dump_log_segments(text: &str) -> Result<Vec<DumpedBatch>> {
    let mut batches: Vec<DumpedBatch> = Vec::new();
    for line in text.lines() {
        if line.starts_with("baseOffset: ") {
            batches.push(
                parse_batch_line(line).with_context(|| format!("parsing batch line {line:?}"))?,
            );
        } else if let Some(rest) = line.strip_prefix("| offset: ") {
            let record =
                parse_record_line(rest).with_context(|| format!("parsing record line {line:?}"))?;
            batches
                .last_mut()
                .ok_or_else(|| anyhow!("record line before any batch line: {line:?}"))?
                .records
                .push(record);
        }
    }
    Ok(batches)
}

/// `name: value` pairs of single-token values.
fn pairs(text: &str) -> Result<Vec<(&str, &str)>> {
    let tokens: Vec<&str> = text.split_whitespace().collect();
    tokens
        .chunks(2)
        .map(|c| match c {
            [k, v] if k.ends_with(':') => Ok((k.trim_end_matches(':'), *v)),
            _ => bail!("expected `name: value`, got {c:?}"),
        })
        .collect()
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T> {
    v.parse().map_err(|_| anyhow!("bad {name}: {v:?}"))
}

const TIMESTAMP_TYPES: &[&str] = &["CreateTime", "LogAppendTime", "NoTimestampType"];

fn parse_batch_line(line: &str) -> Result<DumpedBatch> {
    let mut b = DumpedBatch::default();
    for (k, v) in pairs(line)? {
        match k {
            "baseOffset" => b.base_offset = num(k, v)?,
            "lastOffset" => b.last_offset = num(k, v)?,
            "count" => b.count = if v == "null" { -1 } else { num(k, v)? },
            "baseSequence" => b.base_sequence = num(k, v)?,
            "lastSequence" => b.last_sequence = num(k, v)?,
            "producerId" => b.producer_id = num(k, v)?,
            "producerEpoch" => b.producer_epoch = num(k, v)?,
            "partitionLeaderEpoch" => b.partition_leader_epoch = num(k, v)?,
            "isTransactional" => b.is_transactional = num(k, v)?,
            "isControl" => b.is_control = num(k, v)?,
            "deleteHorizonMs" => {
                b.delete_horizon_ms = match v.strip_prefix("OptionalLong[") {
                    Some(n) => Some(num(k, n.trim_end_matches(']'))?),
                    None => None,
                }
            }
            "position" => b.position = num(k, v)?,
            "size" => b.size = num(k, v)?,
            "magic" => b.magic = num(k, v)?,
            "compresscodec" => b.compresscodec = v.to_string(),
            "crc" => b.crc = num(k, v)?,
            "isvalid" => b.is_valid = num(k, v)?,
            t if TIMESTAMP_TYPES.contains(&t) => {
                b.timestamp_type = t.to_string();
                b.timestamp = num(k, v)?;
            }
            _ => {} // fields newer versions may add
        }
    }
    Ok(b)
}

/// Parses what follows `| offset: `:
/// `<n> CreateTime: <ts> keySize: <k> valueSize: <v> sequence: <s> headerKeys: [a,b]`
/// then ` key: <key>` if the key is non-null, ` payload: <value>` if the value
/// is non-null, or control-record fields.
fn parse_record_line(rest: &str) -> Result<DumpedRecord> {
    let (head, after_head) = rest
        .split_once(" headerKeys: [")
        .ok_or_else(|| anyhow!("no headerKeys"))?;
    let (offset, fields) = head
        .split_once(' ')
        .ok_or_else(|| anyhow!("no fields after offset"))?;
    let mut r = DumpedRecord {
        offset: num("offset", offset)?,
        ..Default::default()
    };
    for (k, v) in pairs(fields)? {
        match k {
            "keySize" => r.key_size = num(k, v)?,
            "valueSize" => r.value_size = num(k, v)?,
            "sequence" => r.sequence = num(k, v)?,
            t if TIMESTAMP_TYPES.contains(&t) => {
                r.timestamp_type = t.to_string();
                r.timestamp = num(k, v)?;
            }
            _ => {}
        }
    }
    let (headers, mut tail) = after_head
        .split_once(']')
        .ok_or_else(|| anyhow!("unclosed headerKeys"))?;
    r.header_keys = headers
        .split(',')
        .filter(|h| !h.is_empty())
        .map(String::from)
        .collect();
    if let Some(after_key) = tail.strip_prefix(" key: ") {
        // The key is keySize bytes when it is valid UTF-8 (so a key containing
        // " payload: " still parses); otherwise split at the payload label.
        let by_size = usize::try_from(r.key_size)
            .ok()
            .filter(|&n| after_key.is_char_boundary(n))
            .filter(|&n| after_key[n..].is_empty() || after_key[n..].starts_with(" payload: "));
        let split =
            by_size.unwrap_or_else(|| after_key.find(" payload: ").unwrap_or(after_key.len()));
        r.key = Some(after_key[..split].to_string());
        tail = &after_key[split..];
    }
    if let Some(payload) = tail.strip_prefix(" payload: ") {
        r.payload = Some(payload.to_string());
    } else if !tail.trim().is_empty() {
        r.control = Some(tail.trim().to_string());
    }
    Ok(r)
}

/// ProducerPerformance's final summary line.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PerfResult {
    pub records_sent: u64,
    pub records_per_sec: f64,
    pub mb_per_sec: f64,
    pub avg_latency_ms: f64,
    pub max_latency_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub p999_ms: f64,
}

/// Runs ProducerPerformance as fast as it can (`--throughput -1`) with
/// producer configs `props` and returns its final summary.
pub fn producer_perf(
    bootstrap: &str,
    topic: &str,
    num_records: u64,
    record_size: usize,
    props: &[(&str, &str)],
) -> Result<PerfResult> {
    producer_perf_with(bootstrap, topic, num_records, record_size, props, &[])
}

/// As [`producer_perf`], with extra tool arguments (e.g.
/// `["--transactional-id", "tx", "--transaction-duration-ms", "100"]`).
pub fn producer_perf_with(
    bootstrap: &str,
    topic: &str,
    num_records: u64,
    record_size: usize,
    props: &[(&str, &str)],
    extra_args: &[&str],
) -> Result<PerfResult> {
    let (_file, mut args) = command_config(props)?;
    args.extend(
        [
            "--bootstrap-server",
            bootstrap,
            "--topic",
            topic,
            "--num-records",
            &num_records.to_string(),
            "--record-size",
            &record_size.to_string(),
            "--throughput",
            "-1",
        ]
        .map(String::from),
    );
    args.extend(extra_args.iter().map(|s| s.to_string()));
    let out = run_java(
        PERF_JVM_ARGS,
        PRODUCER_PERFORMANCE,
        &strs(&args),
        None,
        Duration::from_secs(600),
    )?;
    let stdout = check(PRODUCER_PERFORMANCE, &out)?;
    stdout
        .lines()
        .rev()
        .find(|l| l.contains(" 50th"))
        .ok_or_else(|| {
            anyhow!(
                "no summary line in ProducerPerformance output:\n{}\nstderr:\n{}",
                tail_str(&stdout, 20),
                tail_str(&String::from_utf8_lossy(&out.stderr), 20)
            )
        })
        .and_then(parse_perf_summary)
}

/// Parses e.g. `2000 records sent, 5602.240896 records/sec (0.53 MB/sec),
/// 21.03 ms avg latency, 214.00 ms max latency, 13 ms 50th, 66 ms 95th,
/// 83 ms 99th, 86 ms 99.9th.`
pub fn parse_perf_summary(line: &str) -> Result<PerfResult> {
    let mut r = PerfResult::default();
    let cleaned = line.trim().trim_end_matches('.').replace(['(', ')'], ",");
    for part in cleaned.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (n, label) = part
            .split_once(' ')
            .ok_or_else(|| anyhow!("bad part {part:?} in {line:?}"))?;
        let n: f64 = num(label, n)?;
        match label {
            "records sent" => r.records_sent = n as u64,
            "records/sec" => r.records_per_sec = n,
            "MB/sec" => r.mb_per_sec = n,
            "ms avg latency" => r.avg_latency_ms = n,
            "ms max latency" => r.max_latency_ms = n,
            "ms 50th" => r.p50_ms = n,
            "ms 95th" => r.p95_ms = n,
            "ms 99th" => r.p99_ms = n,
            "ms 99.9th" => r.p999_ms = n,
            _ => {}
        }
    }
    if r.records_sent == 0 && r.records_per_sec == 0.0 {
        bail!("not a ProducerPerformance summary: {line:?}");
    }
    Ok(r)
}

/// BrokerApiVersionsCommand's output (one block per broker, one line per API).
pub fn broker_api_versions(bootstrap: &str) -> Result<String> {
    broker_api_versions_with(bootstrap, &[])
}

pub fn broker_api_versions_with(bootstrap: &str, client: &[(&str, &str)]) -> Result<String> {
    let (_file, mut args) = command_config(client)?;
    args.extend(["--bootstrap-server", bootstrap].map(String::from));
    check(
        BROKER_API_VERSIONS,
        &java(BROKER_API_VERSIONS, &strs(&args))?,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from Kafka 4.4.0 `DumpLogSegments --deep-iteration --print-data-log`.
    const SAMPLE: &str = "\
Dumping data/t1-0/00000000000000000000.log
Log starting offset: 0
baseOffset: 0 lastOffset: 2 count: 3 baseSequence: 0 lastSequence: 2 producerId: 0 producerEpoch: 0 partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty position: 0 CreateTime: 1796014427278 size: 94 magic: 2 compresscodec: none crc: 1510943371 isvalid: true
| offset: 0 CreateTime: 1796014427255 keySize: 2 valueSize: 2 sequence: 0 headerKeys: [] key: k1 payload: v1
| offset: 1 CreateTime: 1796014427278 keySize: 2 valueSize: 2 sequence: 1 headerKeys: [] key: k2 payload: v2
| offset: 2 CreateTime: 1796014427278 keySize: 2 valueSize: 2 sequence: 2 headerKeys: [] key: k3 payload: v3
baseOffset: 3 lastOffset: 3 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1 producerEpoch: -1 partitionLeaderEpoch: 0 isTransactional: false isControl: false deleteHorizonMs: OptionalLong.empty position: 94 CreateTime: 1796014428831 size: 102 magic: 2 compresscodec: gzip crc: 3551970908 isvalid: true
| offset: 3 CreateTime: 1796014428831 keySize: 2 valueSize: 2 sequence: -1 headerKeys: [h1,h2] key: k4 payload: v4
baseOffset: 2000 lastOffset: 2000 count: 1 baseSequence: -1 lastSequence: -1 producerId: 1 producerEpoch: 1 partitionLeaderEpoch: 0 isTransactional: true isControl: true deleteHorizonMs: OptionalLong.empty position: 220015 CreateTime: 1796014528169 size: 78 magic: 2 compresscodec: none crc: 2937078863 isvalid: true
| offset: 2000 CreateTime: 1796014528169 keySize: 4 valueSize: 6 sequence: -1 headerKeys: [] endTxnMarker: COMMIT coordinatorEpoch: 0
";

    #[test]
    fn parses_dump_log_segments() {
        let b = parse_dump_log_segments(SAMPLE).unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(
            (
                b[0].base_offset,
                b[0].last_offset,
                b[0].count,
                b[0].producer_id,
                b[0].producer_epoch
            ),
            (0, 2, 3, 0, 0)
        );
        assert_eq!((b[0].base_sequence, b[0].last_sequence), (0, 2));
        assert!(b[0].is_valid && !b[0].is_transactional && !b[0].is_control);
        assert_eq!(b[0].crc, 1510943371);
        assert_eq!(b[0].timestamp_type, "CreateTime");
        assert_eq!((b[0].position, b[0].size, b[0].magic), (0, 94, 2));
        assert_eq!(b[0].delete_horizon_ms, None);
        assert_eq!(b[0].records.len(), 3);
        assert_eq!(b[0].records[1].key.as_deref(), Some("k2"));
        assert_eq!(b[0].records[1].payload.as_deref(), Some("v2"));
        assert_eq!(b[0].records[1].sequence, 1);
        assert_eq!(b[1].compresscodec, "gzip");
        assert_eq!(b[1].crc, 3551970908);
        assert_eq!(b[1].producer_id, -1);
        assert_eq!(b[1].records[0].header_keys, vec!["h1", "h2"]);
        assert!(b[2].is_control && b[2].is_transactional);
        assert_eq!(b[2].records[0].end_txn_marker(), Some("COMMIT"));
        assert_eq!(b[2].records[0].payload, None);
    }

    #[test]
    fn parses_null_key_and_key_containing_payload_label() {
        // Synthetic lines in the captured format.
        let r = parse_record_line("4 CreateTime: 1 keySize: -1 valueSize: 12 sequence: -1 headerKeys: [] payload: a payload: b")
            .unwrap();
        assert_eq!((r.key.as_deref(), r.key_size), (None, -1));
        assert_eq!(r.payload.as_deref(), Some("a payload: b"));
        let r = parse_record_line(
            "7 LogAppendTime: 5 keySize: 12 valueSize: 1 sequence: 3 headerKeys: [] key: a payload: b payload: c",
        )
        .unwrap();
        assert_eq!(r.key.as_deref(), Some("a payload: b"));
        assert_eq!(r.payload.as_deref(), Some("c"));
        assert_eq!(
            (r.offset, r.timestamp_type.as_str(), r.timestamp),
            (7, "LogAppendTime", 5)
        );
    }

    #[test]
    fn parses_perf_summary() {
        let r = parse_perf_summary(
            "2000 records sent, 5602.240896 records/sec (0.53 MB/sec), 21.03 ms avg latency, \
             214.00 ms max latency, 13 ms 50th, 66 ms 95th, 83 ms 99th, 86 ms 99.9th.",
        )
        .unwrap();
        assert_eq!(r.records_sent, 2000);
        assert_eq!((r.records_per_sec, r.mb_per_sec), (5602.240896, 0.53));
        assert_eq!((r.avg_latency_ms, r.max_latency_ms), (21.03, 214.0));
        assert_eq!(
            (r.p50_ms, r.p95_ms, r.p99_ms, r.p999_ms),
            (13.0, 66.0, 83.0, 86.0)
        );
    }

    #[test]
    fn parses_group_members() {
        let out = "\nGROUP  CONSUMER-ID  HOST  CLIENT-ID  #PARTITIONS\n\
                   g.instances kafka-mirror-proxy/a-1b /127.0.0.1 kafka-mirror-proxy/a 0\n\
                   g.instances kafka-mirror-proxy/b-2c /127.0.0.1 kafka-mirror-proxy/b 0\n";
        assert_eq!(
            parse_group_members(out).expect("table"),
            ["kafka-mirror-proxy/a", "kafka-mirror-proxy/b"]
        );
        let empty = "\nConsumer group 'g' has no active members.\n";
        assert!(parse_group_members(empty).expect("none").is_empty());
        assert!(parse_group_members("Error: something").is_err());
    }

    #[test]
    fn escapes_properties() {
        let text = properties_text(&[("a b", " x\\y\nz"), ("k=", "v=1:2")]);
        assert_eq!(text, "a\\ b=\\ x\\\\y\\nz\nk\\==v=1:2\n");
    }
}
