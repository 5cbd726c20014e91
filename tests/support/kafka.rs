//! Real Apache Kafka 4.4 brokers (KRaft, combined broker and controller
//! nodes) run as local `java` processes from the jars that
//! `scripts/kafka-jars.sh` fetches, for integration tests: a single-node
//! [`KafkaCluster`], or a [`KafkaMultiCluster`] of several nodes with a static
//! controller quorum whose nodes can be stopped, killed and restarted one by
//! one.
//!
//! Each cluster has its own free ports, temp dirs (config, data, log) and
//! cluster id, so several can run at once. Every broker runs under a small
//! `sh` watchdog that kills it if the test process dies, so even an aborted
//! test run leaves no broker behind.
//!
//! There is no mode that points the tests at an already running cluster:
//! almost every test needs brokers of its own (chosen cluster ids, several
//! clusters, restarts, the segment files on disk), and a test that cannot run
//! must not be counted as passed. Set `KAFKA_TEST_KEEP_DIRS=1` to keep broker
//! temp dirs for inspection.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::ports::free_ports;
use super::tools;

/// The line Kafka logs once the broker is unfenced and its listeners accept.
const STARTED_MARKER: &str = "Kafka Server started";

/// C1-only JIT and the serial GC start a broker noticeably faster (measured
/// ~3.7-4.5 s instead of 5-8 s to "Kafka Server started" on 2 cores); the
/// brokers see little load in tests. Override through [`KafkaOptions::jvm_args`].
const BROKER_JVM_ARGS: &[&str] = &[
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:-UsePerfData",
    "-Djava.awt.headless=true",
];

/// Broker logging: INFO to stdout (which goes to the broker log file), minus
/// the per-request log and the long config dumps every client and server
/// component prints (they would push the useful lines out of a log excerpt).
const BROKER_LOG4J2: &str = "\
status = warn
appender.console.type = Console
appender.console.name = STDOUT
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = STDOUT
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.requestchannel.name = kafka.network.RequestChannel$
logger.requestchannel.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
";

/// Runs `scripts/kafka-jars.sh` once per process and returns the folder of
/// Kafka jars (the classpath is `<dir>/*`). The first call may take a while
/// on a fresh machine (Maven download); a failure is remembered, not retried.
pub fn jars_dir() -> Result<PathBuf> {
    static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(|| fetch_jars().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn fetch_jars() -> Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/kafka-jars.sh");
    let out = Command::new("sh")
        .arg(&script)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let dir = PathBuf::from(stdout.lines().last().unwrap_or("").trim());
    if !dir.join("kafka-clients-4.4.0.jar").is_file() {
        bail!(
            "{} printed {:?}, which holds no Kafka jars",
            script.display(),
            dir
        );
    }
    Ok(dir)
}

/// The `java` to run: `$JAVA_HOME/bin/java` if set, else `java` on PATH.
pub fn java_bin() -> PathBuf {
    match std::env::var_os("JAVA_HOME") {
        Some(home) if !home.is_empty() => Path::new(&home).join("bin/java"),
        _ => PathBuf::from("java"),
    }
}

/// The mechanisms a [`Security::SaslPlaintext`] listener enables.
pub const SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// Security of the broker's client listener. The controller listener is
/// always PLAINTEXT, and with SASL or SSL inter-broker traffic (e.g.
/// transaction markers the broker sends itself) uses a separate internal
/// PLAINTEXT listener, so only the client listener is advertised to clients.
#[derive(Clone, Debug, Default)]
pub enum Security {
    #[default]
    Plaintext,
    /// SASL with one user, who can authenticate with PLAIN, SCRAM-SHA-256
    /// and SCRAM-SHA-512 (the SCRAM credentials are written when the storage
    /// is formatted). Neither may contain `"` or `\` (JAAS quoting) nor `,`,
    /// `[` or `]` (the format tool's SCRAM syntax).
    SaslPlaintext { user: String, password: String },
    /// TLS with a PEM server certificate chain and an unencrypted PKCS#8 PEM
    /// key. Clients verify the host name, so the leaf certificate needs
    /// `127.0.0.1` as an IP subject alternative name.
    Ssl {
        cert_chain_pem: String,
        key_pem: String,
    },
}

impl Security {
    /// Listener name of the client listener, also its security protocol.
    fn listener(&self) -> &'static str {
        match self {
            Security::Plaintext => "PLAINTEXT",
            Security::SaslPlaintext { .. } => "SASL_PLAINTEXT",
            Security::Ssl { .. } => "SSL",
        }
    }

    /// Properties a Kafka client needs to connect to this listener: empty for
    /// PLAINTEXT; SASL/PLAIN credentials; or a PEM truststore holding the
    /// server's certificate chain (enough for a self-signed or
    /// chain-includes-root certificate).
    pub fn client_properties(&self) -> Vec<(String, String)> {
        let p = |k: &str, v: &str| (k.to_string(), v.to_string());
        match self {
            Security::Plaintext => vec![],
            Security::SaslPlaintext { user, password } => vec![
                p("security.protocol", "SASL_PLAINTEXT"),
                p("sasl.mechanism", "PLAIN"),
                p("sasl.jaas.config", &plain_jaas(user, password, false)),
            ],
            Security::Ssl { cert_chain_pem, .. } => vec![
                p("security.protocol", "SSL"),
                p("ssl.truststore.type", "PEM"),
                p("ssl.truststore.certificates", cert_chain_pem),
            ],
        }
    }
}

fn plain_jaas(user: &str, password: &str, server: bool) -> String {
    let mut s = format!(
        "org.apache.kafka.common.security.plain.PlainLoginModule required \
         username=\"{user}\" password=\"{password}\""
    );
    if server {
        s.push_str(&format!(" user_{user}=\"{password}\""));
    }
    s.push(';');
    s
}

/// How to start a [`KafkaCluster`]. Build with struct update syntax or the
/// chained setters: `KafkaOptions::default().cluster_id("...").property("k", "v")`.
#[derive(Clone, Debug)]
pub struct KafkaOptions {
    /// 22-character URL-safe base64 cluster id (16 bytes); random if `None`.
    pub cluster_id: Option<String>,
    pub node_id: u32,
    /// Appended to the generated `server.properties`, so they override it.
    pub extra_properties: Vec<(String, String)>,
    pub security: Security,
    /// How long [`KafkaCluster::start`] and [`KafkaCluster::restart`] wait for readiness.
    pub start_timeout: Duration,
    /// Extra JVM arguments, after the defaults (later HotSpot flags win).
    pub jvm_args: Vec<String>,
}

impl Default for KafkaOptions {
    fn default() -> Self {
        KafkaOptions {
            cluster_id: None,
            node_id: 1,
            extra_properties: Vec::new(),
            security: Security::Plaintext,
            start_timeout: Duration::from_secs(90),
            jvm_args: Vec::new(),
        }
    }
}

impl KafkaOptions {
    pub fn cluster_id(mut self, id: impl Into<String>) -> Self {
        self.cluster_id = Some(id.into());
        self
    }
    pub fn node_id(mut self, id: u32) -> Self {
        self.node_id = id;
        self
    }
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_properties.push((key.into(), value.into()));
        self
    }
    pub fn security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }
    pub fn sasl_plain(self, user: &str, password: &str) -> Self {
        self.security(Security::SaslPlaintext {
            user: user.into(),
            password: password.into(),
        })
    }
    pub fn start_timeout(mut self, timeout: Duration) -> Self {
        self.start_timeout = timeout;
        self
    }
}

/// A random 22-character URL-safe base64 Kafka cluster id.
pub fn random_cluster_id() -> String {
    let mut bytes = [0u8; 16];
    let filled = fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if filled.is_err() {
        // Fallback: std's per-process random hasher keys plus the time.
        use std::hash::{BuildHasher, Hasher};
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u128(Instant::now().elapsed().as_nanos());
            chunk.copy_from_slice(&h.finish().to_le_bytes()[..chunk.len()]);
        }
    }
    base64url_nopad(&bytes)
}

fn base64url_nopad(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
        }
    }
    out
}

/// One broker+controller node (KRaft, combined roles): its ports, temp dir
/// (config, data, log) and process. A [`KafkaCluster`] is one such node; a
/// [`KafkaMultiCluster`] is several sharing a cluster id and a static
/// controller quorum. Dropping a node kills it (SIGKILL) and deletes its
/// temp dir.
pub struct KafkaNode {
    /// This node's options; `opts.node_id` is its node id.
    opts: KafkaOptions,
    cluster_id: String,
    bootstrap: String,
    port: u16,
    /// Nodes in the cluster: replicas of the internal topics.
    cluster_size: usize,
    /// `controller.quorum.voters` of a multi-node cluster, set once every
    /// node has its ports; empty for a node of its own.
    voters: String,
    /// A broker-only node joining a running cluster whose controllers are
    /// `voters` ([`KafkaMultiCluster::add_broker`]).
    broker_only: bool,
    local: LocalBroker,
}

struct LocalBroker {
    dir: tempfile::TempDir,
    controller_port: u16,
    internal_port: Option<u16>,
    process: Option<BrokerProcess>,
}

/// The watchdog shell (our child) and the java broker (its child).
struct BrokerProcess {
    shell: Child,
    java_pid: u32,
}

/// What [`KafkaNode::wait_ready`] needs from [`KafkaNode::launch`].
struct Launch {
    /// Length of the broker log before this start.
    start_offset: u64,
    deadline: Instant,
}

/// The cluster id from the options, checked, or a random one.
fn chosen_cluster_id(opts: &KafkaOptions) -> Result<String> {
    match &opts.cluster_id {
        Some(id) => {
            validate_cluster_id(id)?;
            Ok(id.clone())
        }
        None => Ok(random_cluster_id()),
    }
}

/// Picks ports for every node, writes their configurations (each naming all
/// the controllers), formats their storage (once) and starts them all at
/// once, then waits until every one is ready. On any failure every node of
/// `nodes` is killed.
fn start_nodes(nodes: &mut [KafkaNode]) -> Result<()> {
    let libs = jars_dir()?;
    // Ports are found by binding port 0 and releasing it, so another
    // process can grab one before the broker binds it: retry on that.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let result = start_nodes_once(nodes, &libs, attempt == 1);
        match result {
            Ok(()) => return Ok(()),
            Err(e) => {
                for node in nodes.iter_mut() {
                    node.kill();
                }
                if attempt < 3 && format!("{e:#}").contains("Address already in use") {
                    eprintln!("kafka: port clash on start, retrying with new ports");
                } else {
                    return Err(e);
                }
            }
        }
    }
}

fn start_nodes_once(nodes: &mut [KafkaNode], libs: &Path, format: bool) -> Result<()> {
    for node in nodes.iter_mut() {
        node.pick_ports()?;
    }
    if nodes.len() > 1 {
        let voters: Vec<String> = nodes.iter().map(KafkaNode::voter).collect();
        let voters = voters.join(",");
        for node in nodes.iter_mut() {
            node.voters = voters.clone();
        }
    }
    for node in nodes.iter() {
        node.write_server_properties()?;
    }
    if format {
        // One JVM each: in parallel, so three nodes format in the time of one.
        thread::scope(|s| {
            let runs: Vec<_> = nodes
                .iter()
                .map(|node| s.spawn(move || node.format(libs)))
                .collect();
            runs.into_iter()
                .map(|run| {
                    run.join()
                        .unwrap_or_else(|_| bail!("storage format thread panicked"))
                })
                .collect::<Result<Vec<()>>>()
        })?;
    }
    // Launch every node before waiting for any: a node of a multi-node
    // cluster is ready only once a majority of the controllers runs.
    let mut launches = Vec::with_capacity(nodes.len());
    for node in nodes.iter_mut() {
        launches.push(node.launch(libs)?);
    }
    for (node, launch) in nodes.iter_mut().zip(launches) {
        node.wait_ready(launch)?;
    }
    Ok(())
}

impl KafkaNode {
    /// A node that is not started yet, with its own temp dir.
    fn new(opts: KafkaOptions, cluster_id: String, cluster_size: usize) -> Result<KafkaNode> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("kafka-test-n{}-", opts.node_id))
            .disable_cleanup(std::env::var_os("KAFKA_TEST_KEEP_DIRS").is_some())
            .tempdir()
            .context("creating broker temp dir")?;
        fs::write(dir.path().join("log4j2.properties"), BROKER_LOG4J2)?;
        Ok(KafkaNode {
            opts,
            cluster_id,
            bootstrap: String::new(),
            port: 0,
            cluster_size,
            voters: String::new(),
            broker_only: false,
            local: LocalBroker {
                dir,
                controller_port: 0,
                internal_port: None,
                process: None,
            },
        })
    }

    pub fn node_id(&self) -> u32 {
        self.opts.node_id
    }

    /// "127.0.0.1:port" of the client listener.
    pub fn bootstrap(&self) -> String {
        self.bootstrap.clone()
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// Port of the client listener.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Port of the (PLAINTEXT) KRaft controller listener.
    pub fn controller_port(&self) -> u16 {
        self.local.controller_port
    }

    /// "127.0.0.1:port" of the internal PLAINTEXT listener a SASL or SSL
    /// broker keeps for inter-broker traffic (`None` for a PLAINTEXT one):
    /// a listener of the same broker without SASL, for tests of a client
    /// pointed at the wrong one.
    pub fn internal_bootstrap(&self) -> Option<String> {
        self.local
            .internal_port
            .map(|port| format!("127.0.0.1:{port}"))
    }

    pub fn options(&self) -> &KafkaOptions {
        &self.opts
    }

    /// Client properties needed to connect (see [`Security::client_properties`]).
    pub fn client_properties(&self) -> Vec<(String, String)> {
        self.opts.security.client_properties()
    }

    /// The broker's temp dir (server.properties, broker.log, data/).
    pub fn dir(&self) -> &Path {
        self.local.dir.path()
    }

    /// The Kafka `log.dirs` folder.
    pub fn log_dirs(&self) -> PathBuf {
        self.dir().join("data")
    }

    /// The broker's stdout+stderr log file.
    pub fn log_path(&self) -> PathBuf {
        self.dir().join("broker.log")
    }

    /// Sorted `*.log` segment files of one partition.
    pub fn segment_files(&self, topic: &str, partition: i32) -> Result<Vec<PathBuf>> {
        let dir = self.log_dirs().join(format!("{topic}-{partition}"));
        let mut files: Vec<PathBuf> = fs::read_dir(&dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        files.sort();
        Ok(files)
    }

    /// The last `n` lines of the broker log (all starts appended).
    pub fn log_excerpt(&self, n: usize) -> String {
        tail_lines(&self.log_path(), 0, n)
    }

    /// SIGTERM, then wait up to 30 s for a clean exit, then SIGKILL.
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut p) = self.local.process.take() {
            signal(p.java_pid, "TERM");
            if wait_timeout(&mut p.shell, Duration::from_secs(30))?.is_none() {
                eprintln!("kafka: broker did not stop within 30 s, killing it");
                p.kill();
            }
        }
        Ok(())
    }

    /// SIGKILL, as a crash would: no clean shutdown, no leadership handed
    /// over. Returns once the process is gone; a no-op if it is not running.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.local.process.take() {
            p.kill();
        }
    }

    /// Stops the broker (if running) and starts it again on the same ports
    /// and data, waiting for readiness as the first start did.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        let libs = jars_dir()?;
        let launch = self.launch(&libs)?;
        self.wait_ready(launch)
    }

    /// True while the local broker process runs.
    pub fn is_running(&mut self) -> bool {
        match self.local.process.as_mut() {
            Some(p) => matches!(p.shell.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// This node's entry in `controller.quorum.voters`.
    fn voter(&self) -> String {
        format!(
            "{}@127.0.0.1:{}",
            self.opts.node_id, self.local.controller_port
        )
    }

    fn pick_ports(&mut self) -> Result<()> {
        let needs_internal = !matches!(self.opts.security, Security::Plaintext);
        let ports = free_ports(if needs_internal { 3 } else { 2 })?;
        self.port = ports[0];
        self.bootstrap = format!("127.0.0.1:{}", self.port);
        let local = &mut self.local;
        local.controller_port = ports[1];
        local.internal_port = ports.get(2).copied();
        Ok(())
    }

    fn write_server_properties(&self) -> Result<()> {
        let local = &self.local;
        let dir = local.dir.path();
        let (node, cport, port) = (self.opts.node_id, local.controller_port, self.port);
        // A node of its own forms a quorum of one; in a multi-node cluster
        // `voters` names every node's controller listener.
        let voters = if self.voters.is_empty() {
            self.voter()
        } else {
            self.voters.clone()
        };
        // Internal topics: one replica and one partition on a single node
        // (creating 50 slows the first group or transaction by seconds); on
        // several nodes, a replica and a partition on each, so coordinators
        // are spread and survive one node going down.
        let n = self.cluster_size.max(1).to_string();
        let min_isr = if self.cluster_size > 1 { "2" } else { "1" };
        let client = self.opts.security.listener();
        let mut listeners = if self.broker_only {
            format!("{client}://127.0.0.1:{port}")
        } else {
            format!("{client}://127.0.0.1:{port},CONTROLLER://127.0.0.1:{cport}")
        };
        let roles = if self.broker_only {
            "broker"
        } else {
            "broker,controller"
        };
        let mut advertised = format!("{client}://127.0.0.1:{port}");
        let mut protocol_map = format!("CONTROLLER:PLAINTEXT,{client}:{client}");
        let mut inter_broker = client.to_string();
        if let Some(iport) = local.internal_port {
            listeners.push_str(&format!(",INTERNAL://127.0.0.1:{iport}"));
            // Inter-broker listeners must be advertised; clients still only
            // see the listener they connected through in Metadata responses.
            advertised.push_str(&format!(",INTERNAL://127.0.0.1:{iport}"));
            protocol_map.push_str(",INTERNAL:PLAINTEXT");
            inter_broker = "INTERNAL".into();
        }
        let mut props: Vec<(String, String)> = [
            ("process.roles", roles.to_string()),
            ("node.id", node.to_string()),
            ("controller.quorum.voters", voters),
            ("controller.listener.names", "CONTROLLER".into()),
            ("listeners", listeners),
            ("advertised.listeners", advertised),
            ("listener.security.protocol.map", protocol_map),
            ("inter.broker.listener.name", inter_broker),
            ("log.dirs", dir.join("data").display().to_string()),
            ("default.replication.factor", n.clone()),
            ("offsets.topic.replication.factor", n.clone()),
            ("offsets.topic.num.partitions", n.clone()),
            ("transaction.state.log.replication.factor", n.clone()),
            ("transaction.state.log.min.isr", min_isr.into()),
            ("transaction.state.log.num.partitions", n.clone()),
            (
                "share.coordinator.state.topic.replication.factor",
                n.clone(),
            ),
            ("share.coordinator.state.topic.min.isr", min_isr.into()),
            ("share.coordinator.state.topic.num.partitions", n),
            ("group.initial.rebalance.delay.ms", "0".into()),
            // The tests write batches with fixed timestamps from 2023 (exact
            // byte vectors). Under the default 7-day retention the broker's
            // first retention check, 30 s after start, deleted every segment
            // holding only such batches, so a log read after it found
            // nothing (or a file gone between listing and dumping).
            ("log.retention.ms", "-1".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let listener = client.to_lowercase();
        match &self.opts.security {
            Security::Plaintext => {}
            Security::SaslPlaintext { user, password } => {
                props.push(("sasl.enabled.mechanisms".into(), SASL_MECHANISMS.join(",")));
                props.push((
                    format!("listener.name.{listener}.plain.sasl.jaas.config"),
                    plain_jaas(user, password, true),
                ));
                for scram in &SASL_MECHANISMS[1..] {
                    props.push((
                        format!(
                            "listener.name.{listener}.{}.sasl.jaas.config",
                            scram.to_lowercase()
                        ),
                        "org.apache.kafka.common.security.scram.ScramLoginModule required;".into(),
                    ));
                }
            }
            Security::Ssl {
                cert_chain_pem,
                key_pem,
            } => {
                props.push(("ssl.keystore.type".into(), "PEM".into()));
                props.push((
                    "ssl.keystore.certificate.chain".into(),
                    cert_chain_pem.clone(),
                ));
                props.push(("ssl.keystore.key".into(), key_pem.clone()));
                props.push(("ssl.client.auth".into(), "none".into()));
            }
        }
        props.extend(self.opts.extra_properties.iter().cloned());
        tools::write_properties(&dir.join("server.properties"), &tools::props_ref(&props))
    }

    fn format(&self, libs: &Path) -> Result<()> {
        let dir = self.local.dir.path();
        let cfg = dir.join("server.properties");
        let mut cmd = Command::new(java_bin());
        cmd.args(BROKER_JVM_ARGS)
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                dir.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg("kafka.tools.StorageTool")
            // `--cluster-id=ID` in one argument: a random id may start with
            // `-`, which the tool would otherwise read as an option.
            .arg("format")
            .arg(format!("--cluster-id={}", self.cluster_id))
            .arg("-c")
            .arg(&cfg);
        if let Security::SaslPlaintext { user, password } = &self.opts.security {
            // SCRAM credentials live in the cluster metadata; KRaft writes
            // the first ones at format time.
            for scram in &SASL_MECHANISMS[1..] {
                cmd.arg("--add-scram")
                    .arg(format!("{scram}=[name={user},password=\"{password}\"]"));
            }
        }
        let out = tools::run_with_timeout(cmd, None, Duration::from_secs(60))
            .context("running kafka.tools.StorageTool format")?;
        if !out.status.success() {
            bail!(
                "kafka.tools.StorageTool format failed ({}):\n{}{}",
                out.status,
                tools::tail_str(&String::from_utf8_lossy(&out.stdout), 40),
                tools::tail_str(&String::from_utf8_lossy(&out.stderr), 40),
            );
        }
        Ok(())
    }

    /// Launches java under the watchdog; returns the broker log's length
    /// before this start, for [`KafkaNode::wait_ready`].
    fn launch(&mut self, libs: &Path) -> Result<Launch> {
        let log = self.log_path();
        let start_offset = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let dir = self.dir().to_path_buf();
        let pid_file = dir.join("broker.pid");
        let _ = fs::remove_file(&pid_file);
        {
            let mut f = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)?;
            writeln!(f, "===== kafka-test harness: starting broker =====")?;
        }
        // The watchdog: java in the background, a subshell that SIGKILLs it
        // once the test process (our pid) is gone, and the shell itself exits
        // with java's status so `Child::try_wait` sees the broker exit.
        const WATCHDOG: &str = r#"parent=$1; pidfile=$2; log=$3; shift 3
"$@" >>"$log" 2>&1 </dev/null &
jpid=$!
echo "$jpid" >"$pidfile.tmp" && mv "$pidfile.tmp" "$pidfile"
( while kill -0 "$parent" 2>/dev/null && kill -0 "$jpid" 2>/dev/null; do sleep 1; done
  kill -9 "$jpid" 2>/dev/null ) </dev/null >/dev/null 2>&1 &
wpid=$!
wait "$jpid"; rc=$?
kill "$wpid" 2>/dev/null
exit $rc"#;
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(WATCHDOG)
            .arg("kafka-watchdog")
            .arg(std::process::id().to_string())
            .arg(&pid_file)
            .arg(&log)
            .arg(java_bin())
            .args(BROKER_JVM_ARGS)
            .args(&self.opts.jvm_args)
            .arg(format!(
                "-Dlog4j2.configurationFile={}",
                dir.join("log4j2.properties").display()
            ))
            .arg("-cp")
            .arg(format!("{}/*", libs.display()))
            .arg("kafka.Kafka")
            .arg(dir.join("server.properties"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut shell = cmd.spawn().context("spawning sh for the kafka broker")?;

        let deadline = Instant::now() + self.opts.start_timeout;
        let java_pid = loop {
            if let Some(pid) = fs::read_to_string(&pid_file)
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok())
            {
                break pid;
            }
            if let Some(status) = shell.try_wait()? {
                bail!("broker watchdog shell exited early ({status})");
            }
            if Instant::now() > deadline {
                let _ = shell.kill();
                let _ = shell.wait();
                bail!("broker watchdog shell never wrote {}", pid_file.display());
            }
            thread::sleep(Duration::from_millis(20));
        };
        self.local.process = Some(BrokerProcess { shell, java_pid });
        Ok(Launch {
            start_offset,
            deadline,
        })
    }

    /// Waits until the broker just launched is ready, or fails with its log
    /// once it exits or the start deadline passes (and then kills it).
    fn wait_ready(&mut self, launch: Launch) -> Result<()> {
        let Launch {
            start_offset,
            deadline,
        } = launch;
        let log = self.log_path();
        let started = Instant::now();
        loop {
            thread::sleep(Duration::from_millis(100));
            let Some(process) = self.local.process.as_mut() else {
                bail!("broker {} has no process to wait for", self.opts.node_id);
            };
            if let Some(status) = process.shell.try_wait()? {
                self.local.process = None;
                bail!(
                    "kafka broker exited during start ({status}); {}",
                    log_report(&log, start_offset, 60)
                );
            }
            if Instant::now() > deadline {
                if let Some(mut p) = self.local.process.take() {
                    p.kill();
                }
                bail!(
                    "kafka broker not ready within {:?}; {}",
                    self.opts.start_timeout,
                    log_report(&log, start_offset, 60)
                );
            }
            if log_contains(&log, start_offset, STARTED_MARKER) && self.probe() {
                eprintln!(
                    "kafka: broker {} at {} (cluster {}) ready in {:.1} s",
                    self.opts.node_id,
                    self.bootstrap,
                    self.cluster_id,
                    started.elapsed().as_secs_f64()
                );
                return Ok(());
            }
        }
    }

    /// Connects to the client port; for non-TLS listeners also checks that
    /// an ApiVersions v0 request is answered without error.
    fn probe(&self) -> bool {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
            return false;
        };
        if matches!(self.opts.security, Security::Ssl { .. }) {
            return true;
        }
        let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
        let client_id = b"probe";
        let mut req = Vec::new();
        req.extend_from_slice(&(10 + client_id.len() as i32).to_be_bytes());
        req.extend_from_slice(&18i16.to_be_bytes()); // ApiVersions
        req.extend_from_slice(&0i16.to_be_bytes()); // v0
        req.extend_from_slice(&7i32.to_be_bytes()); // correlation id
        req.extend_from_slice(&(client_id.len() as i16).to_be_bytes());
        req.extend_from_slice(client_id);
        let mut head = [0u8; 10]; // size, correlation id, error code
        stream.write_all(&req).is_ok()
            && stream.read_exact(&mut head).is_ok()
            && head[4..8] == 7i32.to_be_bytes()
            && head[8..10] == [0, 0]
    }
}

impl Drop for KafkaNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One single-node KRaft Kafka cluster: one [`KafkaNode`], which its methods
/// address. Dropping it kills the broker (SIGKILL) and deletes its temp dir.
pub struct KafkaCluster {
    node: KafkaNode,
}

impl KafkaCluster {
    /// Starts a broker and waits until it is ready (log says started, the
    /// client port accepts TCP and answers ApiVersions), or fails with the
    /// tail of the broker log once the process exits or `start_timeout` passes.
    pub fn start(opts: KafkaOptions) -> Result<KafkaCluster> {
        let cluster_id = chosen_cluster_id(&opts)?;
        let mut node = KafkaNode::new(opts, cluster_id, 1)?;
        start_nodes(std::slice::from_mut(&mut node))?;
        Ok(KafkaCluster { node })
    }

    /// The one node.
    pub fn node(&mut self) -> &mut KafkaNode {
        &mut self.node
    }

    /// "127.0.0.1:port" of the client listener.
    pub fn bootstrap(&self) -> String {
        self.node.bootstrap()
    }

    pub fn cluster_id(&self) -> &str {
        self.node.cluster_id()
    }

    /// Port of the client listener.
    pub fn port(&self) -> u16 {
        self.node.port()
    }

    /// Port of the (PLAINTEXT) KRaft controller listener.
    pub fn controller_port(&self) -> u16 {
        self.node.controller_port()
    }

    /// See [`KafkaNode::internal_bootstrap`].
    pub fn internal_bootstrap(&self) -> Option<String> {
        self.node.internal_bootstrap()
    }

    pub fn options(&self) -> &KafkaOptions {
        self.node.options()
    }

    /// Client properties needed to connect (see [`Security::client_properties`]).
    pub fn client_properties(&self) -> Vec<(String, String)> {
        self.node.client_properties()
    }

    /// The broker's temp dir (server.properties, broker.log, data/).
    pub fn dir(&self) -> &Path {
        self.node.dir()
    }

    /// The Kafka `log.dirs` folder.
    pub fn log_dirs(&self) -> PathBuf {
        self.node.log_dirs()
    }

    /// The broker's stdout+stderr log file.
    pub fn log_path(&self) -> PathBuf {
        self.node.log_path()
    }

    /// Sorted `*.log` segment files of one partition.
    pub fn segment_files(&self, topic: &str, partition: i32) -> Result<Vec<PathBuf>> {
        self.node.segment_files(topic, partition)
    }

    /// The last `n` lines of the broker log (all starts appended).
    pub fn log_excerpt(&self, n: usize) -> String {
        self.node.log_excerpt(n)
    }

    /// SIGTERM, then wait up to 30 s for a clean exit, then SIGKILL.
    pub fn stop(&mut self) -> Result<()> {
        self.node.stop()
    }

    /// Stops the broker (if running) and starts it again on the same ports
    /// and data, waiting for readiness as [`KafkaCluster::start`] does.
    pub fn restart(&mut self) -> Result<()> {
        self.node.restart()
    }

    /// True while the local broker process runs.
    pub fn is_running(&mut self) -> bool {
        self.node.is_running()
    }
}

/// A KRaft cluster of several combined broker+controller nodes with a static
/// quorum of all of them (three nodes survive one down), each node with its
/// own ports and temp dir. Internal topics get a replica on every node.
/// Dropping it kills every node (SIGKILL) and deletes their temp dirs; the
/// same watchdog as for one node kills them if the test process dies.
pub struct KafkaMultiCluster {
    cluster_id: String,
    nodes: Vec<KafkaNode>,
}

impl KafkaMultiCluster {
    /// Starts one node per id in `node_ids` (distinct, at least one; the
    /// ids are the Kafka node ids), all at once, and waits until every node
    /// is ready. `opts.node_id` is ignored; every other option applies to
    /// every node.
    pub fn start(opts: KafkaOptions, node_ids: &[u32]) -> Result<KafkaMultiCluster> {
        let mut ids = node_ids.to_vec();
        ids.sort_unstable();
        ids.dedup();
        if ids.is_empty() || ids.len() != node_ids.len() {
            bail!("node ids must be distinct and at least one: {node_ids:?}");
        }
        let cluster_id = chosen_cluster_id(&opts)?;
        let mut nodes = node_ids
            .iter()
            .map(|&id| {
                let opts = opts.clone().node_id(id);
                KafkaNode::new(opts, cluster_id.clone(), node_ids.len())
            })
            .collect::<Result<Vec<_>>>()?;
        let started = Instant::now();
        start_nodes(&mut nodes)?;
        eprintln!(
            "kafka: {} nodes {node_ids:?} (cluster {cluster_id}) ready in {:.1} s",
            nodes.len(),
            started.elapsed().as_secs_f64()
        );
        Ok(KafkaMultiCluster { cluster_id, nodes })
    }

    /// Every node's client listener, comma-separated, in node id order given.
    pub fn bootstrap(&self) -> String {
        let all: Vec<String> = self.nodes.iter().map(KafkaNode::bootstrap).collect();
        all.join(",")
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The node ids, in the order given to [`KafkaMultiCluster::start`].
    pub fn node_ids(&self) -> Vec<u32> {
        self.nodes.iter().map(KafkaNode::node_id).collect()
    }

    pub fn nodes(&self) -> &[KafkaNode] {
        &self.nodes
    }

    pub fn node(&self, id: u32) -> Result<&KafkaNode> {
        self.nodes
            .iter()
            .find(|n| n.node_id() == id)
            .with_context(|| format!("no node {id} in {:?}", self.node_ids()))
    }

    /// Starts a broker-only node `id` that joins the running cluster (its
    /// controllers stay the first nodes'), and waits until it is ready.
    pub fn add_broker(&mut self, id: u32) -> Result<()> {
        if self.nodes.iter().any(|n| n.node_id() == id) {
            bail!("node {id} is already in {:?}", self.node_ids());
        }
        let first = self.nodes.first().context("no nodes")?;
        let voters = if first.voters.is_empty() {
            first.voter()
        } else {
            first.voters.clone()
        };
        let opts = first.opts.clone().node_id(id);
        let mut node = KafkaNode::new(opts, self.cluster_id.clone(), self.nodes.len())?;
        node.voters = voters;
        node.broker_only = true;
        let started = Instant::now();
        start_nodes(std::slice::from_mut(&mut node))?;
        eprintln!(
            "kafka: broker {id} joined cluster {} in {:.1} s",
            self.cluster_id,
            started.elapsed().as_secs_f64()
        );
        self.nodes.push(node);
        Ok(())
    }

    /// One node, to stop, kill or restart it.
    pub fn node_mut(&mut self, id: u32) -> Result<&mut KafkaNode> {
        let ids = self.node_ids();
        self.nodes
            .iter_mut()
            .find(|n| n.node_id() == id)
            .with_context(|| format!("no node {id} in {ids:?}"))
    }
}

impl BrokerProcess {
    fn kill(&mut self) {
        signal(self.java_pid, "KILL");
        // The shell exits as soon as java does; kill it too in case it hangs.
        if wait_timeout(&mut self.shell, Duration::from_secs(10))
            .ok()
            .flatten()
            .is_none()
        {
            let _ = self.shell.kill();
            let _ = self.shell.wait();
        }
    }
}

fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

fn wait_timeout(child: &mut Child, timeout: Duration) -> Result<Option<std::process::ExitStatus>> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() > deadline {
            return Ok(None);
        }
        thread::sleep(Duration::from_millis(50));
    }
}

fn validate_cluster_id(id: &str) -> Result<()> {
    let ok = id.len() == 22
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        bail!("cluster id {id:?} is not 22 chars of URL-safe base64 encoding 16 bytes");
    }
    Ok(())
}

fn read_from(path: &Path, offset: u64) -> String {
    let mut s = Vec::new();
    if let Ok(mut f) = fs::File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = f.read_to_end(&mut s);
        }
    }
    String::from_utf8_lossy(&s).into_owned()
}

fn log_contains(path: &Path, offset: u64, needle: &str) -> bool {
    read_from(path, offset).contains(needle)
}

fn tail_lines(path: &Path, offset: u64, n: usize) -> String {
    tools::tail_str(&read_from(path, offset), n)
}

/// The last `n` lines of this start's log, plus its first ERROR lines if the
/// tail does not already hold them (the cause often precedes a long shutdown).
fn log_report(path: &Path, offset: u64, n: usize) -> String {
    let text = read_from(path, offset);
    let tail = tools::tail_str(&text, n);
    // Each error line with its exception messages ("Caused by: ...") but
    // not the stack frames.
    let mut errors = String::new();
    let (mut count, mut in_error) = (0, false);
    for line in text.lines() {
        if line.starts_with('[') {
            in_error = (line.contains("] ERROR ") || line.contains("] FATAL ")) && count < 5;
            if in_error {
                count += 1;
            }
        }
        let frame = line.trim_start().starts_with("at ") || line.trim_start().starts_with("... ");
        if in_error && !frame {
            errors.push_str(line);
            errors.push('\n');
        }
    }
    let mut report = String::new();
    if !errors.is_empty() {
        report.push_str("errors in broker log:\n");
        report.push_str(&errors);
    }
    report.push_str(&format!(
        "last {n} lines of broker log {}:\n{tail}",
        path.display()
    ));
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids() {
        validate_cluster_id("MkU3OEVBNTcwNTJENDM2Qk").unwrap();
        for _ in 0..50 {
            let id = random_cluster_id();
            assert_eq!(id.len(), 22, "{id}");
            validate_cluster_id(&id).unwrap();
        }
        assert_eq!(base64url_nopad(&[0xfb, 0xff, 0x00, 0x01]), "-_8AAQ");
        assert!(validate_cluster_id("MkU3OEVBNTcwNTJENDM2Q").is_err());
        assert!(validate_cluster_id("MkU3OEVBNTcwNTJENDM2Q+").is_err());
    }
}
