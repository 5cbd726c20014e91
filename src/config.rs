//! Configuration from `MIRROR_PROXY_*` environment variables, parsed and
//! validated in one place before anything starts.
//!
//! Every problem is collected, so an operator fixing a deployment sees all of
//! them in one run instead of one per restart. Files named by the TLS settings
//! are read and parsed here too: a certificate that does not load is a
//! configuration error, not a runtime surprise on the first connection.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use regex::Regex;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::mirror::link::{link_env_name, ControlBatchPolicy, Link, Links};
use crate::mirror::link_state::LinkState;
use crate::mirror::pid::ClusterId;
use crate::wire::sasl::{Credentials, Mechanism};

pub mod replicator;
pub(crate) mod sni;
pub(crate) use sni::{SniNames, SniRoute};

/// The prefix shared by every variable the proxy reads.
pub(crate) const PREFIX: &str = "MIRROR_PROXY_";

/// One problem with one variable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub variable: String,
    pub value: Option<String>,
    pub expected: String,
}

impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={:?}: expected {}", self.variable, v, self.expected),
            None => write!(
                f,
                "{} is not set: expected {}",
                self.variable, self.expected
            ),
        }
    }
}

/// All problems found in the environment, reported together.
#[derive(Debug, thiserror::Error)]
pub struct ConfigError(pub Vec<ConfigProblem>);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for p in &self.0 {
            writeln!(f, "  - {p}")?;
        }
        Ok(())
    }
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// TLS towards clients: our certificate, and optionally the CA that signs
/// client certificates (needed for links bound to a TLS subject).
#[derive(Clone)]
pub struct ClientTls {
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: Arc<PrivateKeyDer<'static>>,
    pub client_ca: Option<Vec<CertificateDer<'static>>>,
    /// The files these were read from (certificate, key, client CA), read
    /// again when they change (`net::tls` reloads them).
    pub files: Vec<PathBuf>,
}

/// TLS towards the brokers.
#[derive(Clone)]
pub struct UpstreamTls {
    pub ca: Vec<CertificateDer<'static>>,
    pub client_cert: Option<(Vec<CertificateDer<'static>>, Arc<PrivateKeyDer<'static>>)>,
    /// Name to verify the broker certificate against, instead of the host the
    /// proxy connects to.
    pub server_name: Option<String>,
    /// The files these were read from (CA, then certificate and key if
    /// set), read again when they change (`net::tls` reloads them).
    pub files: Vec<PathBuf>,
}

/// The state key's bytes; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct StateKey(Vec<u8>);

impl StateKey {
    /// Shortest key accepted: as long as the HMAC-SHA256 output.
    pub(crate) const MIN_LEN: usize = 32;

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for StateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StateKey(..)")
    }
}

/// A secret string (the admin token); never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

// The files, not the keys.
impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for UpstreamTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamTls")
            .field("server_name", &self.server_name)
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

/// The validated configuration. Its `Debug` is the startup log line: every
/// setting, no secret (keys, certificates and the admin token print as
/// set or not).
#[derive(Clone, Debug)]
pub struct Config {
    pub bootstrap_servers: Vec<String>,
    pub listen: SocketAddr,
    pub advertised_host: String,
    pub broker_port_base: u16,
    /// SNI routing on the one TLS listener instead of a port per node;
    /// `None`: a port per node (ADVERTISED_HOST, BROKER_PORT_BASE).
    pub sni: Option<SniRouting>,
    pub admin_listen: SocketAddr,
    pub admin_token: Option<Secret>,
    pub max_frame_bytes: usize,
    /// Bytes of client request frames held at once, over all connections.
    pub max_buffered_bytes: usize,
    /// Bytes of broker response frames held at once, over all connections.
    pub max_buffered_response_bytes: usize,
    /// How long a frame may wait for buffer memory before its connection
    /// is closed.
    pub buffer_wait_timeout_ms: u64,
    /// How long a write to a broker or a client may make no progress
    /// before the connection is closed.
    pub write_timeout_ms: u64,
    pub max_connections: usize,
    /// Worker threads of the runtime; `None`: one per core.
    pub worker_threads: Option<usize>,
    pub connections_max_idle_ms: u64,
    pub request_read_timeout_ms: u64,
    /// Once a broker's response frame has begun, how long it may take to
    /// arrive whole before the broker connection is closed.
    pub response_read_timeout_ms: u64,
    pub tls_handshake_timeout_ms: u64,
    pub shutdown_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    pub log_format: LogFormat,
    pub client_tls: Option<ClientTls>,
    pub upstream_tls: Option<UpstreamTls>,
    /// SASL for the proxy's own broker connections (`client`); user
    /// connections authenticate themselves through the proxy.
    pub upstream_sasl: Option<Credentials>,
    pub links: Links,
    /// The compacted topic holding the mapping state (`__mirror_state`).
    pub state_topic: String,
    /// Mirrored producers idle this long are forgotten (tombstoned).
    pub producer_expiration_ms: u64,
    /// The shared secret every instance signs its state records with
    /// (`MIRROR_PROXY_STATE_KEY`); `None`: records are neither signed nor
    /// checked.
    pub state_key: Option<StateKey>,
    /// Records at offsets below this one are applied without checking
    /// their MAC (written before the key was rolled out); 0 by default.
    pub state_key_unsigned_before: i64,
    /// Bound on the mirrored producer state (SPEC §6).
    pub producer_state_max_entries: usize,
    /// How a local write to a read-only mirrored topic is refused.
    pub read_only_error: ReadOnlyError,
    /// How long a failover waits for every live instance to drain the link.
    pub failover_drain_timeout_ms: u64,
    /// Bytes of a partition's tail read to rebuild that state.
    pub producer_state_rebuild_bytes: i32,
    /// The longest a link batch whose answer never came is waited out
    /// before a log tail without it is taken to mean it was never appended.
    pub unknown_outcome_wait_ms: u64,
    /// This process's id in the instances' group (`control::members`);
    /// `None`: a random UUID per process.
    pub instance_id: Option<String>,
    /// The group coordinator drops an instance silent for this long.
    pub instance_session_timeout_ms: u64,
}

/// SNI routing: every broker node is advertised as its own host name on
/// one port, and each TLS connection is routed by its ClientHello's name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniRouting {
    pub names: SniNames,
    /// The port advertised for every node; `None`: the LISTEN port (as bound).
    pub advertised_port: Option<u16>,
}

/// The error a local Produce to a read-only mirrored topic gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadOnlyError {
    /// POLICY_VIOLATION (44), known to every client.
    PolicyViolation,
    /// READ_ONLY_TOPIC (134) at the Produce versions whose clients know it,
    /// POLICY_VIOLATION below.
    ReadOnlyTopic,
}

/// `STATE_TOPIC`'s default.
pub const DEFAULT_STATE_TOPIC: &str = "__mirror_state";

/// Documentation of every variable: (name without prefix, default, meaning).
/// The configuration tables of the README and docs/configuration.md are
/// written from this list; a test holds their variables and defaults to it.
pub const VARIABLES: &[(&str, &str, &str)] = &[
    ("BOOTSTRAP_SERVERS", "(required)", "Comma-separated host:port of the destination brokers the proxy bootstraps from."),
    ("LISTEN", "0.0.0.0:9092", "Bootstrap listener address (host:port)."),
    ("ADVERTISED_HOST", "host of LISTEN", "Host name clients are told to connect to for every broker; required when LISTEN binds all interfaces. Port-per-node routing only (not with SNI_HOST_PATTERN)."),
    ("BROKER_PORT_BASE", "port of LISTEN + 1", "Broker node n is served at ADVERTISED_HOST:(BROKER_PORT_BASE + n). Must be above the LISTEN port, so that no node id maps onto the bootstrap listener. Port-per-node routing only (not with SNI_HOST_PATTERN)."),
    ("SNI_HOST_PATTERN", "(none)", "Enables SNI routing instead of a port per node: broker node n is advertised as this host name with `$(nodeId)` replaced by n (e.g. `broker-$(nodeId).kafka.example.com`), on the one LISTEN port, and each client connection goes to the node its TLS ClientHello names. Requires TLS_CERT (a certificate valid for the bootstrap name and every node name, e.g. a wildcard) and SNI_BOOTSTRAP_HOST; ADVERTISED_HOST and BROKER_PORT_BASE must not be set. A connection without SNI, or naming neither the bootstrap nor a known node, is refused with a TLS access_denied alert."),
    ("SNI_BOOTSTRAP_HOST", "(required with SNI_HOST_PATTERN)", "With SNI routing: the host name clients bootstrap at; a connection naming it goes to any of BOOTSTRAP_SERVERS."),
    ("SNI_ADVERTISED_PORT", "port of LISTEN", "With SNI routing: the port advertised for every node, when clients reach the listener through another port (a load balancer's)."),
    ("ADMIN_LISTEN", "127.0.0.1:9190", "Admin HTTP address (/healthz, /readyz, /metrics). Must be loopback unless ADMIN_TOKEN is set."),
    ("ADMIN_TOKEN", "(none)", "Bearer token required by the admin endpoint; allows a non-loopback ADMIN_LISTEN."),
    ("MAX_FRAME_BYTES", "104857600", "Largest request or response frame accepted, in bytes; a larger one closes that connection."),
    ("MAX_BUFFERED_BYTES", "536870912", "Memory for client request frames, in bytes, shared by all connections (frames are allocated as their bytes arrive). When it is used up, the proxy stops reading requests until forwarded frames free some. A connection holds at most one request frame of it at a time. At least MAX_FRAME_BYTES."),
    ("MAX_BUFFERED_RESPONSE_BYTES", "536870912", "Memory for broker response frames, in bytes, shared by all connections. When it is used up, the proxy stops reading responses from the brokers until responses written to their clients free some. A connection holds at most one response frame of it at a time. At least MAX_FRAME_BYTES."),
    ("BUFFER_WAIT_TIMEOUT_MS", "60000", "A request or response frame that cannot get memory under MAX_BUFFERED_BYTES or MAX_BUFFERED_RESPONSE_BYTES within this time closes its connection (WARN; counted as `buffer_wait_timeout`); the client retries on a new connection. Longer than WRITE_TIMEOUT_MS, so that connections whose writes are stuck are closed, and give their memory back, before the ones waiting for it."),
    ("WRITE_TIMEOUT_MS", "30000", "A write of a request to its broker, or of a response to its client, that makes no progress for this long closes the connection (WARN; counted as `upstream_write_timeout` or `client_write_timeout`), giving back the memory its frame holds. A broker reads nothing more from a connection while it holds a request there (a Fetch long poll, a Produce waiting for acks), and a client may stop reading: without this bound such a connection would hold its frame's memory for as long as it liked. Clients that pipeline more than the socket buffers hold behind a request the broker may keep longer than this (a Produce timeout_ms, a Fetch max_wait_ms above 30 s) need it raised."),
    ("MAX_CONNECTIONS", "4096", "Client connections open at once; a connection over it is accepted and closed at once (WARN, at most one line per 10 s; counted). Each client connection also holds one broker connection, so the process needs about twice as many file descriptors."),
    ("CONNECTIONS_MAX_IDLE_MS", "600000", "A client connection with no request in flight that sends nothing for this long is closed (like the broker's connections.max.idle.ms)."),
    ("REQUEST_READ_TIMEOUT_MS", "30000", "Once the first byte of a request frame has arrived, the whole frame must arrive within this time, or the connection is closed."),
    ("RESPONSE_READ_TIMEOUT_MS", "30000", "Once the first byte of a broker's response frame has arrived, the whole frame must arrive within this time (time it waits for memory under MAX_BUFFERED_RESPONSE_BYTES does not count), or the broker connection and its client's connection are closed (WARN; counted as `upstream_read_timeout`), giving back the memory the frame holds. A broker that stalls or trickles in the middle of a response would otherwise hold that memory for as long as it liked. Kafka clients give up on a response after their own request.timeout.ms (30 s by default), counted from before its first byte, so a response slower than this is one they no longer wait for; raise it with theirs."),
    ("TLS_HANDSHAKE_TIMEOUT_MS", "10000", "Time a client has to complete the TLS handshake (with TLS_CERT set)."),
    ("SHUTDOWN_TIMEOUT_MS", "30000", "On SIGTERM or SIGINT, how long requests in flight may take to be answered before the remaining connections are closed."),
    ("CONNECT_TIMEOUT_MS", "10000", "Timeout for connecting (and TLS handshaking) to a broker."),
    ("WORKER_THREADS", "number of cores", "Worker threads of tokio's runtime, which run the proxy's connections. On the 2-core machines the benchmarks run on, 1 cost 1-19% less CPU per GB than 2 in the same runs, with as much throughput (README, Benchmarks); the default stays one per core so that no proxy is capped at one core unasked."),
    ("LOG_FORMAT", "text", "`text` or `json` (one JSON object per line). Filter with RUST_LOG (default info)."),
    ("TLS_CERT", "(none)", "PEM certificate chain served to clients; enables TLS on every client listener."),
    ("TLS_KEY", "(none)", "PEM private key for TLS_CERT (PKCS#8, PKCS#1 or SEC1)."),
    ("TLS_CLIENT_CA", "(none)", "PEM CA bundle for client certificates. Clients may still connect without one; links with TLS_SUBJECT require one."),
    ("UPSTREAM_TLS", "false", "`true` to connect to the brokers with TLS."),
    ("UPSTREAM_TLS_CA", "(required with UPSTREAM_TLS)", "PEM CA bundle that signs the broker certificates."),
    ("UPSTREAM_TLS_CERT", "(none)", "PEM client certificate chain presented to the brokers."),
    ("UPSTREAM_TLS_KEY", "(none)", "PEM private key for UPSTREAM_TLS_CERT."),
    ("UPSTREAM_TLS_SERVER_NAME", "(broker host)", "Name the broker certificates are verified against, instead of the advertised broker host."),
    ("UPSTREAM_SASL_MECHANISM", "(none)", "SASL for the proxy's own connections to the brokers (state topic, failover barrier): `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`. Client connections always pass their own SASL through."),
    ("UPSTREAM_SASL_USERNAME", "(required with UPSTREAM_SASL_MECHANISM)", "User name for UPSTREAM_SASL_MECHANISM."),
    ("UPSTREAM_SASL_PASSWORD", "(required with UPSTREAM_SASL_MECHANISM)", "Password for UPSTREAM_SASL_MECHANISM, taken as is (not trimmed); never logged or echoed in errors."),
    ("STATE_TOPIC", DEFAULT_STATE_TOPIC, "Compacted topic on the destination cluster holding the producer-id mapping state (origins, salts), shared by every proxy instance. Created when missing (one partition, cleanup.policy=compact, compression.type=producer, replication factor min(3, brokers), min.insync.replicas min(2, RF)); an existing topic that is not compacted stops the proxy; one whose batches the brokers recompress is read (every codec), with a WARN."),
    ("STATE_KEY", "(none)", "Shared secret (at least 32 bytes, e.g. `openssl rand -base64 32`) with which every instance signs the records it writes to the state topic (HMAC-SHA256 in a `kmp-mac` header) and without which it applies none: records written around the proxy, without the key, are skipped (logged, `state_records_skipped_total`). Every instance sharing the state topic needs the same key. Never logged. Enabling it on a topic written without it: see STATE_KEY_UNSIGNED_BEFORE."),
    ("STATE_KEY_UNSIGNED_BEFORE", "0", "With STATE_KEY: records at offsets below this one are applied without checking their MAC (written before every instance signed with the key). To enable or change the key on a running deployment: roll every instance with the key and 9223372036854775807 (they sign, and still accept the records of instances not yet rolled), then roll them again with the state topic's end offset read after the first roll (docs/state-topic.md)."),
    ("PRODUCER_EXPIRATION_MS", "86400000", "A mirrored producer (origin) not seen for this long is forgotten: its state-topic records are tombstoned and its mapped PID may be reused. Last-seen times are persisted at most once per tenth of it. Until then each instance holds its claim: about 400 bytes of memory an origin (a million origins: about 400 MiB). Origins are bounded by this expiration, not by a count: a claim dropped while its producer may still write would let another origin take its mapped PID."),
    ("PRODUCER_STATE_MAX_ENTRIES", "100000", "Mirrored producers (destination partition and mapped producer id) whose state the proxy keeps to answer link retries without duplicates and refuse out-of-order batches; the least recently used with no batch in flight is evicted first (counted); one with a batch in flight never is, and when every producer held has one a new producer's batch is refused with the retriable NOT_ENOUGH_REPLICAS (`producer_state_full`). About 250 bytes each: the default bounds it near 25 MiB, room for e.g. 1,000 partitions with 100 producers each."),
    ("READ_ONLY_ERROR", "policy_violation", "How a local Produce to a topic of a link that is not STOPPED is refused (per partition, non-retriable, with a message naming the link and the failover command): `policy_violation` (POLICY_VIOLATION, 44) or `read_only_topic` (READ_ONLY_TOPIC, 134, only at Produce versions whose clients know it; Kafka 4.4.0 defines no such error (its code 134 is GROUP_DELETION_FAILED) and Produce only up to v13, so today every version falls back to POLICY_VIOLATION)."),
    ("FAILOVER_DRAIN_TIMEOUT_MS", "30000", "How long a failover waits for every live proxy instance to confirm it closed the link's connections before placing the barriers anyway; instances that did not confirm are named in the failover's result."),
    ("PRODUCER_STATE_REBUILD_BYTES", "4194304", "Bytes of a mirrored partition's log tail the proxy reads, on the first link Produce to it after start-up (and after an unknown outcome, a leader move or a truncation), to rebuild the producer state (so that a retry of a batch appended before a restart or a lost answer is still answered as a duplicate). Batches older than the tail that fits are not deduplicated (counted: `mirror_producer_state_offsets_beyond_bound`)."),
    ("UNKNOWN_OUTCOME_WAIT_MS", "10000", "A link Produce sent to the broker whose answer never came (the connection was lost) may still be appended later: the broker handles a request it read even after the connection closed, and one may wait in its queue or on the network. Until the request's own `timeout_ms`, capped by this, has passed since the loss was seen, its producer's batches on that partition are answered with the retriable NOT_ENOUGH_REPLICAS (`outcome_unknown`) unless the log tail shows the lost batch (then the retry is answered as a duplicate); after it, a stable re-read of the tail without the batch is taken to mean it was never appended. A lost request the broker appends later than this is appended twice: raise it where requests can sit longer (a loaded broker, a slow network)."),
    ("INSTANCE_ID", "a random UUID per process", "This process's name among the proxy instances sharing the state topic (1 to 200 characters of [a-zA-Z0-9._-]); it appears in the instances' group as the member client id `kafka-mirror-proxy/<id>`. Two running processes must not share one."),
    ("INSTANCE_SESSION_TIMEOUT_MS", "10000", "With links: the instances' group coordinator drops an instance that has not heartbeaten for this long (a killed proxy stops being counted as live within it). Must lie within the brokers' `group.min.session.timeout.ms` (6000) and `group.max.session.timeout.ms` (1800000). Half of it is each instance's state-topic lease: an instance that has not read the state topic to its end for that long forwards no link batch (retriable NOT_ENOUGH_REPLICAS), and a failover that an instance did not confirm waits that long before its barriers."),
    ("LINKS", "(none)", "Comma-separated mirror link names ([a-z0-9-]+). Each link has the LINK_<NAME>_* variables below, <NAME> upper-cased with - as _."),
    ("LINK_<NAME>_SOURCE_CLUSTER_ID", "(required per link)", "The link's source cluster id: 22 characters of URL-safe base64 (16 bytes)."),
    ("LINK_<NAME>_CLIENT_ID", "mirror-<name>", "The client.id the link's replicator uses; its Produce requests are remapped."),
    ("LINK_<NAME>_TOPICS", "(required per link)", "Comma-separated mirrored topics: names or regular expressions, each matched against the whole topic name."),
    ("LINK_<NAME>_TLS_SUBJECT", "(none)", "When set, only a TLS client whose certificate subject matches may act as the link (`CN=name` matches the common name; anything else the full subject, e.g. `CN=replicator,O=acme`)."),
    ("LINK_<NAME>_INITIAL_STATE", "MIRRORING", "The link's state while the state topic has no record of it (a record, once written by a failover or start, always wins): `MIRRORING`, `STOPPING`, `STOPPED` or `PREPARING` (a failback link: fenced and read-only until `kafka-mirror-proxy failback` starts it)."),
    ("LINK_<NAME>_REVERSE_OF", "(none)", "For a failback link (SPEC §12): the link of the source cluster's proxy that mirrored this cluster into the source and failed over. With `LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS` it enables `GET /links/<name>/failback` (the divergence report) and `POST /links/<name>/failback` on the admin API, as `kafka-mirror-proxy failback` does."),
    ("LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS", "(none)", "For a failback link: the source cluster's brokers (host:port,...), read by the failback API over plain TCP (its state topic under this proxy's STATE_TOPIC name, the replicators' `__mirror_offsets`, their groups `replicator.mirror-<link>`)."),
    ("LINK_<NAME>_CONTROL_BATCHES", "drop", "Control batches arriving on the link: `drop` (acknowledge without writing, counted) or `forward` (send on, remapped, for the broker to decide)."),
];

/// The variables of one program (the proxy's `MIRROR_PROXY_*`, the
/// replicator's `MIRROR_REPLICATOR_*`) and the problems found in them.
struct Env<'a> {
    prefix: &'static str,
    vars: &'a HashMap<String, String>,
    problems: Vec<ConfigProblem>,
}

impl<'a> Env<'a> {
    fn new(prefix: &'static str, vars: &'a HashMap<String, String>) -> Env<'a> {
        Env {
            prefix,
            vars,
            problems: Vec::new(),
        }
    }

    fn raw(&self, name: &str) -> Option<String> {
        self.vars
            .get(&format!("{}{name}", self.prefix))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    fn problem(&mut self, name: &str, value: Option<String>, expected: impl Into<String>) {
        self.problems.push(ConfigProblem {
            variable: format!("{}{name}", self.prefix),
            value,
            expected: expected.into(),
        });
    }

    /// Parse an optional variable; a bad value is recorded and yields `None`.
    fn parse<T>(
        &mut self,
        name: &str,
        expected: &str,
        parse: impl FnOnce(&str) -> Option<T>,
    ) -> Option<T> {
        let raw = self.raw(name)?;
        match parse(&raw) {
            Some(v) => Some(v),
            None => {
                self.problem(name, Some(raw), expected);
                None
            }
        }
    }

    fn certs(&mut self, name: &str) -> Option<Vec<CertificateDer<'static>>> {
        let path = self.raw(name)?;
        let loaded = CertificateDer::pem_file_iter(&path)
            .map_err(|e| e.to_string())
            .and_then(|it| it.collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string()));
        match loaded {
            Ok(certs) if !certs.is_empty() => Some(certs),
            Ok(_) => {
                self.problem(
                    name,
                    Some(path),
                    "a PEM file holding at least one CERTIFICATE",
                );
                None
            }
            Err(e) => {
                self.problem(
                    name,
                    Some(path),
                    format!("a readable PEM certificate file ({e})"),
                );
                None
            }
        }
    }

    /// Required: a comma-separated `host:port` list.
    fn host_ports(&mut self, name: &str, what: &str) -> Vec<String> {
        let Some(raw) = self.raw(name) else {
            self.problem(
                name,
                None,
                format!("comma-separated host:port list of {what}"),
            );
            return Vec::new();
        };
        let list: Vec<String> = raw
            .split(',')
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect();
        if list.is_empty() || !list.iter().all(|s| valid_host_port(s)) {
            self.problem(
                name,
                Some(raw),
                "comma-separated host:port list, e.g. broker1:9092,broker2:9092",
            );
        }
        list
    }

    /// Required: comma-separated topic names or regular expressions, each
    /// anchored at both ends (a link's topics, in the proxy and the
    /// replicator alike).
    fn topic_patterns(&mut self, name: &str) -> Option<Vec<Regex>> {
        let Some(v) = self.raw(name) else {
            self.problem(
                name,
                None,
                "comma-separated topic names or regular expressions",
            );
            return None;
        };
        let mut patterns = Vec::new();
        let mut ok = true;
        for p in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match Regex::new(&format!("^(?:{p})$")) {
                Ok(re) => patterns.push(re),
                Err(e) => {
                    ok = false;
                    self.problem(
                        name,
                        Some(v.clone()),
                        format!("valid regular expressions ({p:?}: {e})"),
                    );
                }
            }
        }
        if ok && patterns.is_empty() {
            self.problem(
                name,
                Some(v),
                "at least one topic name or regular expression",
            );
            return None;
        }
        ok.then_some(patterns)
    }

    fn key(&mut self, name: &str) -> Option<PrivateKeyDer<'static>> {
        let path = self.raw(name)?;
        match PrivateKeyDer::from_pem_file(PathBuf::from(&path)) {
            Ok(k) => Some(k),
            Err(e) => {
                self.problem(
                    name,
                    Some(path),
                    format!("a readable PEM private key file ({e})"),
                );
                None
            }
        }
    }
}

fn parse_socket_addr(s: &str) -> Option<SocketAddr> {
    s.parse().ok()
}

/// The process environment's variables named with `prefix`.
fn process_vars(prefix: &str) -> HashMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with(prefix))
        .collect()
}

fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Some(true),
        "false" | "0" | "no" => Some(false),
        _ => None,
    }
}

fn valid_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

impl Config {
    /// Read the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_vars(&process_vars(PREFIX))
    }

    /// Validate a map of variables (full names, with the prefix).
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<Config, ConfigError> {
        let mut env = Env::new(PREFIX, vars);

        let bootstrap_servers = env.host_ports("BOOTSTRAP_SERVERS", "the destination brokers");

        let listen_default: SocketAddr = ([0, 0, 0, 0], 9092).into();
        let listen = env
            .parse(
                "LISTEN",
                "host:port with an IP address, e.g. 0.0.0.0:9092",
                parse_socket_addr,
            )
            .unwrap_or(listen_default);

        let sni_pattern = env.raw("SNI_HOST_PATTERN");
        let advertised_host = match env.raw("ADVERTISED_HOST") {
            Some(h)
                if h.contains(':')
                    && !h.starts_with('[')
                    && h.parse::<std::net::Ipv6Addr>().is_err() =>
            {
                env.problem(
                    "ADVERTISED_HOST",
                    Some(h),
                    "a host name or IP address without a port",
                );
                String::new()
            }
            Some(h) => h,
            None if listen.ip().is_unspecified() && sni_pattern.is_none() => {
                env.problem("ADVERTISED_HOST", None, "the host clients reach the proxy at (required because MIRROR_PROXY_LISTEN binds all interfaces)");
                String::new()
            }
            None => listen.ip().to_string(),
        };

        // Node ids start at 0, so the node ports are base..=65535: the
        // bootstrap port must lie below them or node (port - base) would be
        // served on the bootstrap listener.
        let broker_port_base = match env.parse(
            "BROKER_PORT_BASE",
            "a port number (1-65535); node n is served at base + n",
            |s| s.parse::<u16>().ok().filter(|p| *p > 0),
        ) {
            Some(base) if listen.port() != 0 && listen.port() >= base => {
                env.problem(
                    "BROKER_PORT_BASE",
                    Some(base.to_string()),
                    format!(
                        "a port above the MIRROR_PROXY_LISTEN port {}: node {} would be served on the bootstrap port",
                        listen.port(),
                        listen.port() - base
                    ),
                );
                base
            }
            Some(base) => base,
            None => match listen.port().checked_add(1) {
                Some(base) => base,
                None => {
                    env.problem(
                        "BROKER_PORT_BASE",
                        None,
                        "a port for node 0, because the MIRROR_PROXY_LISTEN port 65535 leaves none above it",
                    );
                    0
                }
            },
        };

        let admin_token = env.raw("ADMIN_TOKEN");
        let admin_default: SocketAddr = ([127, 0, 0, 1], 9190).into();
        let admin_listen = env
            .parse(
                "ADMIN_LISTEN",
                "host:port with an IP address, e.g. 127.0.0.1:9190",
                parse_socket_addr,
            )
            .unwrap_or(admin_default);
        if !admin_listen.ip().is_loopback() && admin_token.is_none() {
            env.problem(
                "ADMIN_LISTEN",
                Some(admin_listen.to_string()),
                "a loopback address unless MIRROR_PROXY_ADMIN_TOKEN is set",
            );
        }

        let max_frame_bytes = env
            .parse(
                "MAX_FRAME_BYTES",
                "a whole number of bytes from 1024 to 2147483647",
                |s| {
                    s.parse::<usize>()
                        .ok()
                        .filter(|n| (1024..=i32::MAX as usize).contains(n))
                },
            )
            .unwrap_or(100 * 1024 * 1024);

        // A frame is held whole before it is passed on: a budget smaller
        // than the largest frame could never read it.
        let budget = |env: &mut Env, name: &str, what: &str| {
            let bytes = env
                .parse(name, "a whole number of bytes from 1024 up", |s| {
                    s.parse::<usize>().ok().filter(|n| *n >= 1024)
                })
                .unwrap_or(512 * 1024 * 1024);
            if bytes < max_frame_bytes {
                env.problem(
                    name,
                    Some(bytes.to_string()),
                    format!("at least MIRROR_PROXY_MAX_FRAME_BYTES ({max_frame_bytes}): {what} larger than the buffer budget could never be read"),
                );
            }
            bytes
        };
        let max_buffered_bytes = budget(&mut env, "MAX_BUFFERED_BYTES", "a frame");
        let max_buffered_response_bytes =
            budget(&mut env, "MAX_BUFFERED_RESPONSE_BYTES", "a response");
        let max_connections = env
            .parse(
                "MAX_CONNECTIONS",
                "a whole number of connections greater than 0",
                |s| s.parse::<usize>().ok().filter(|n| *n > 0),
            )
            .unwrap_or(4096);
        let worker_threads = env.parse(
            "WORKER_THREADS",
            "a whole number of threads from 1 to 1024",
            |s| s.parse::<usize>().ok().filter(|n| (1..=1024).contains(n)),
        );
        let producer_state_max_entries = env
            .parse(
                "PRODUCER_STATE_MAX_ENTRIES",
                "a whole number of producers greater than 0",
                |s| s.parse::<usize>().ok().filter(|n| *n > 0),
            )
            .unwrap_or(100_000);
        let producer_state_rebuild_bytes = env
            .parse(
                "PRODUCER_STATE_REBUILD_BYTES",
                "a whole number of bytes from 1024 to 2147483647",
                |s| s.parse::<i32>().ok().filter(|n| *n >= 1024),
            )
            .unwrap_or(4 * 1024 * 1024);
        let mut ms = |name: &str, default: u64| {
            env.parse(name, "a whole number of milliseconds greater than 0", |s| {
                s.parse::<u64>().ok().filter(|n| *n > 0)
            })
            .unwrap_or(default)
        };
        let connect_timeout_ms = ms("CONNECT_TIMEOUT_MS", 10_000);
        let connections_max_idle_ms = ms("CONNECTIONS_MAX_IDLE_MS", 600_000);
        let request_read_timeout_ms = ms("REQUEST_READ_TIMEOUT_MS", 30_000);
        let response_read_timeout_ms = ms("RESPONSE_READ_TIMEOUT_MS", 30_000);
        let buffer_wait_timeout_ms = ms("BUFFER_WAIT_TIMEOUT_MS", 60_000);
        let write_timeout_ms = ms("WRITE_TIMEOUT_MS", 30_000);
        let tls_handshake_timeout_ms = ms("TLS_HANDSHAKE_TIMEOUT_MS", 10_000);
        let shutdown_timeout_ms = ms("SHUTDOWN_TIMEOUT_MS", 30_000);
        let producer_expiration_ms = ms("PRODUCER_EXPIRATION_MS", 86_400_000);
        let failover_drain_timeout_ms = ms("FAILOVER_DRAIN_TIMEOUT_MS", 30_000);
        let unknown_outcome_wait_ms = ms("UNKNOWN_OUTCOME_WAIT_MS", 10_000);
        let instance_session_timeout_ms = ms("INSTANCE_SESSION_TIMEOUT_MS", 10_000);
        let read_only_error = env
            .parse(
                "READ_ONLY_ERROR",
                "`policy_violation` or `read_only_topic`",
                |s| match s {
                    "policy_violation" => Some(ReadOnlyError::PolicyViolation),
                    "read_only_topic" => Some(ReadOnlyError::ReadOnlyTopic),
                    _ => None,
                },
            )
            .unwrap_or(ReadOnlyError::PolicyViolation);
        let instance_id = env.parse(
            "INSTANCE_ID",
            "1 to 200 characters of [a-zA-Z0-9._-]",
            |s| {
                let ok = !s.is_empty()
                    && s.len() <= 200
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                ok.then(|| s.to_string())
            },
        );
        let state_topic = env
            .parse(
                "STATE_TOPIC",
                "a Kafka topic name: 1 to 249 characters of [a-zA-Z0-9._-]",
                |s| {
                    let ok = !s.is_empty()
                        && s.len() <= 249
                        && s != "."
                        && s != ".."
                        && s.chars()
                            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
                    ok.then(|| s.to_string())
                },
            )
            .unwrap_or_else(|| DEFAULT_STATE_TOPIC.to_string());

        // The key is never echoed, not even in a configuration error.
        let state_key = match env.raw("STATE_KEY") {
            Some(k) if k.len() >= StateKey::MIN_LEN => Some(StateKey(k.into_bytes())),
            Some(_) => {
                env.problem(
                    "STATE_KEY",
                    None,
                    "a secret of at least 32 bytes (the value given is shorter; it is not shown)",
                );
                None
            }
            None => None,
        };
        let state_key_unsigned_before = env
            .parse(
                "STATE_KEY_UNSIGNED_BEFORE",
                "an offset from 0 to 9223372036854775807",
                |s| s.parse::<i64>().ok().filter(|n| *n >= 0),
            )
            .unwrap_or(0);

        let log_format = env
            .parse("LOG_FORMAT", "`text` or `json`", |s| match s {
                "text" => Some(LogFormat::Text),
                "json" => Some(LogFormat::Json),
                _ => None,
            })
            .unwrap_or(LogFormat::Text);

        let client_tls = Self::client_tls(&mut env);
        let sni = Self::sni(&mut env, client_tls.is_some());
        let upstream_tls = upstream_tls(&mut env, "UPSTREAM");
        let upstream_sasl = upstream_sasl(&mut env, "UPSTREAM");
        let links = Self::links(&mut env, client_tls.as_ref(), true);
        // A link that mirrored the state topic would let its replicator
        // write the records every instance applies.
        for link in links.iter().filter(|l| l.mirrors_topic(&state_topic)) {
            let name = format!(
                "LINK_{}_TOPICS",
                crate::mirror::link::link_env_name(link.name())
            );
            let value = env.raw(&name);
            env.problem(
                &name,
                value,
                format!("topics that do not include the state topic '{state_topic}'"),
            );
        }

        if env.problems.is_empty() {
            Ok(Config {
                bootstrap_servers,
                listen,
                advertised_host,
                broker_port_base,
                sni,
                admin_listen,
                admin_token: admin_token.map(Secret),
                max_frame_bytes,
                max_buffered_bytes,
                max_buffered_response_bytes,
                buffer_wait_timeout_ms,
                write_timeout_ms,
                max_connections,
                worker_threads,
                connections_max_idle_ms,
                request_read_timeout_ms,
                response_read_timeout_ms,
                tls_handshake_timeout_ms,
                shutdown_timeout_ms,
                connect_timeout_ms,
                log_format,
                client_tls,
                upstream_tls,
                upstream_sasl,
                links,
                state_topic,
                producer_expiration_ms,
                state_key,
                state_key_unsigned_before,
                producer_state_max_entries,
                read_only_error,
                failover_drain_timeout_ms,
                producer_state_rebuild_bytes,
                unknown_outcome_wait_ms,
                instance_id,
                instance_session_timeout_ms,
            })
        } else {
            Err(ConfigError(env.problems))
        }
    }

    /// Only the mirror links (for the `unmap` subcommand, which needs no
    /// listener or TLS settings).
    pub fn links_from_env() -> Result<Links, ConfigError> {
        let vars: HashMap<String, String> = std::env::vars()
            .filter(|(k, _)| k.starts_with(PREFIX))
            .collect();
        let mut env = Env::new(PREFIX, &vars);
        let links = Self::links(&mut env, None, false);
        if env.problems.is_empty() {
            Ok(links)
        } else {
            Err(ConfigError(env.problems))
        }
    }

    /// SNI routing, when SNI_HOST_PATTERN is set. The port-per-node
    /// variables are refused beside it: an operator who set them expects
    /// ports the proxy would not open.
    fn sni(env: &mut Env<'_>, tls: bool) -> Option<SniRouting> {
        let Some(pattern) = env.raw("SNI_HOST_PATTERN") else {
            for name in ["SNI_BOOTSTRAP_HOST", "SNI_ADVERTISED_PORT"] {
                if let Some(v) = env.raw(name) {
                    env.problem(name, Some(v), "unset, because MIRROR_PROXY_SNI_HOST_PATTERN is not set (SNI routing is off)");
                }
            }
            return None;
        };
        if !tls && env.raw("TLS_CERT").is_none() {
            env.problem(
                "TLS_CERT",
                None,
                "a server certificate: SNI routing (MIRROR_PROXY_SNI_HOST_PATTERN) reads the host name from the TLS ClientHello, so it needs TLS on the client listener",
            );
        }
        for name in ["ADVERTISED_HOST", "BROKER_PORT_BASE"] {
            if let Some(v) = env.raw(name) {
                env.problem(name, Some(v), "unset with SNI routing: nodes are advertised by MIRROR_PROXY_SNI_HOST_PATTERN on the MIRROR_PROXY_LISTEN port");
            }
        }
        let advertised_port = env.parse("SNI_ADVERTISED_PORT", "a port number (1-65535)", |s| {
            s.parse::<u16>().ok().filter(|p| *p > 0)
        });
        let Some(bootstrap) = env.raw("SNI_BOOTSTRAP_HOST") else {
            env.problem(
                "SNI_BOOTSTRAP_HOST",
                None,
                "the host name clients bootstrap at (required with MIRROR_PROXY_SNI_HOST_PATTERN)",
            );
            return None;
        };
        match SniNames::new(&pattern, &bootstrap) {
            Ok(names) => Some(SniRouting {
                names,
                advertised_port,
            }),
            Err(e) if e.is_bootstrap() => {
                env.problem("SNI_BOOTSTRAP_HOST", Some(bootstrap), e.to_string());
                None
            }
            Err(e) => {
                env.problem("SNI_HOST_PATTERN", Some(pattern), e.to_string());
                None
            }
        }
    }

    fn client_tls(env: &mut Env<'_>) -> Option<ClientTls> {
        let cert = env.certs("TLS_CERT");
        let key = env.key("TLS_KEY");
        let client_ca = env.certs("TLS_CLIENT_CA");
        let cert_set = env.raw("TLS_CERT").is_some();
        let key_set = env.raw("TLS_KEY").is_some();
        if cert_set != key_set {
            let missing = if cert_set { "TLS_KEY" } else { "TLS_CERT" };
            env.problem(missing, None, "set together with its partner: TLS needs both MIRROR_PROXY_TLS_CERT and MIRROR_PROXY_TLS_KEY");
        }
        if env.raw("TLS_CLIENT_CA").is_some() && !cert_set {
            env.problem(
                "TLS_CERT",
                None,
                "a server certificate, because MIRROR_PROXY_TLS_CLIENT_CA is set",
            );
        }
        let files = ["TLS_CERT", "TLS_KEY", "TLS_CLIENT_CA"]
            .iter()
            .filter_map(|name| env.raw(name).map(PathBuf::from))
            .collect();
        Some(ClientTls {
            cert_chain: cert?,
            key: Arc::new(key?),
            client_ca,
            files,
        })
    }

    fn links(env: &mut Env<'_>, client_tls: Option<&ClientTls>, check_tls: bool) -> Links {
        let Some(raw) = env.raw("LINKS") else {
            return Links::default();
        };
        let name_re = Regex::new("^[a-z0-9-]+$").ok();
        let mut links = Vec::new();
        let mut client_ids: BTreeMap<String, String> = BTreeMap::new();
        for name in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !name_re.as_ref().is_some_and(|re| re.is_match(name)) {
                env.problem(
                    "LINKS",
                    Some(raw.clone()),
                    format!("link names made of [a-z0-9-]+ (found {name:?})"),
                );
                continue;
            }
            let var = |suffix: &str| format!("LINK_{}_{suffix}", link_env_name(name));

            let source_cluster_id = match env.raw(&var("SOURCE_CLUSTER_ID")) {
                None => {
                    env.problem(
                        &var("SOURCE_CLUSTER_ID"),
                        None,
                        "the source cluster id: 22 characters of URL-safe base64 encoding 16 bytes",
                    );
                    None
                }
                Some(v) => match v.parse::<ClusterId>() {
                    Ok(id) => Some((id, v)),
                    Err(e) => {
                        env.problem(
                            &var("SOURCE_CLUSTER_ID"),
                            Some(v),
                            format!("a Kafka cluster id, 22 characters of URL-safe base64 encoding 16 bytes ({e})"),
                        );
                        None
                    }
                },
            };
            let client_id = env
                .raw(&var("CLIENT_ID"))
                .unwrap_or_else(|| format!("mirror-{name}"));
            if let Some(other) = client_ids.insert(client_id.clone(), name.to_string()) {
                env.problem(
                    &var("CLIENT_ID"),
                    Some(client_id.clone()),
                    format!("a client id no other link uses (link {other:?} has it)"),
                );
            }
            let topics = env.topic_patterns(&var("TOPICS"));
            let tls_subject = env.raw(&var("TLS_SUBJECT"));
            if check_tls
                && tls_subject.is_some()
                && client_tls.and_then(|t| t.client_ca.as_ref()).is_none()
            {
                env.problem(&var("TLS_SUBJECT"), tls_subject.clone(), "client TLS with client certificates: set MIRROR_PROXY_TLS_CERT, MIRROR_PROXY_TLS_KEY and MIRROR_PROXY_TLS_CLIENT_CA");
            }
            let control_batches = env
                .parse(
                    &var("CONTROL_BATCHES"),
                    "`drop` or `forward`",
                    |s| match s {
                        "drop" => Some(ControlBatchPolicy::Drop),
                        "forward" => Some(ControlBatchPolicy::Forward),
                        _ => None,
                    },
                )
                .unwrap_or(ControlBatchPolicy::Drop);
            let initial_state = env
                .parse(
                    &var("INITIAL_STATE"),
                    "`MIRRORING`, `STOPPING`, `STOPPED` or `PREPARING`",
                    LinkState::parse,
                )
                .unwrap_or(LinkState::Mirroring);
            let failback = match (
                env.raw(&var("REVERSE_OF")),
                env.raw(&var("SOURCE_BOOTSTRAP_SERVERS")),
            ) {
                (Some(reverse_of), Some(servers)) => Some(crate::mirror::link::Failback {
                    reverse_of,
                    source_bootstrap_servers: servers
                        .split(',')
                        .map(|s| s.trim().to_string())
                        .filter(|s| !s.is_empty())
                        .collect(),
                }),
                (None, None) => None,
                (Some(v), None) | (None, Some(v)) => {
                    env.problem(
                        &var("REVERSE_OF"),
                        Some(v),
                        "both LINK_<NAME>_REVERSE_OF and LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS, or neither",
                    );
                    None
                }
            };
            if let (Some((source_cluster_id, source_cluster_spelling)), Some(topics)) =
                (source_cluster_id, topics)
            {
                links.push(
                    Link::new(
                        name.to_string(),
                        source_cluster_id,
                        client_id,
                        topics,
                        tls_subject,
                        control_batches,
                    )
                    .with_initial_state(initial_state)
                    .with_failback(failback)
                    .with_source_cluster_spelling(&source_cluster_spelling),
                );
            }
        }
        Links::new(links)
    }
}

/// TLS to brokers from `<STEM>_TLS`, `_TLS_CA`, `_TLS_CERT`, `_TLS_KEY` and
/// `_TLS_SERVER_NAME` (the proxy's stem is `UPSTREAM`, the replicator's
/// `SOURCE` and `DESTINATION`).
fn upstream_tls(env: &mut Env<'_>, stem: &str) -> Option<UpstreamTls> {
    let var = |name: &str| format!("{stem}_{name}");
    let enabled = env
        .parse(&var("TLS"), "`true` or `false`", parse_bool)
        .unwrap_or(false);
    let ca = env.certs(&var("TLS_CA"));
    let cert = env.certs(&var("TLS_CERT"));
    let key = env.key(&var("TLS_KEY"));
    let server_name = env.raw(&var("TLS_SERVER_NAME"));
    if !enabled {
        return None;
    }
    if env.raw(&var("TLS_CA")).is_none() {
        env.problem(
            &var("TLS_CA"),
            None,
            format!(
                "a PEM CA bundle, because {}{} is true",
                env.prefix,
                var("TLS")
            ),
        );
    }
    let cert_set = env.raw(&var("TLS_CERT")).is_some();
    if cert_set != env.raw(&var("TLS_KEY")).is_some() {
        let missing = if cert_set {
            var("TLS_KEY")
        } else {
            var("TLS_CERT")
        };
        env.problem(
            &missing,
            None,
            "set together with its partner (client certificate and key)",
        );
    }
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, Arc::new(k))),
        _ => None,
    };
    let files = [var("TLS_CA"), var("TLS_CERT"), var("TLS_KEY")]
        .iter()
        .filter_map(|name| env.raw(name).map(PathBuf::from))
        .collect();
    Some(UpstreamTls {
        ca: ca?,
        client_cert,
        server_name,
        files,
    })
}

/// SASL credentials from `<STEM>_SASL_MECHANISM`, `_USERNAME` and
/// `_PASSWORD`.
fn upstream_sasl(env: &mut Env<'_>, stem: &str) -> Option<Credentials> {
    let var = |name: &str| format!("{stem}_{name}");
    let mechanism = env.parse(
        &var("SASL_MECHANISM"),
        "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`",
        |s| s.parse::<Mechanism>().ok(),
    );
    let mechanism_set = env.raw(&var("SASL_MECHANISM")).is_some();
    let username = env.raw(&var("SASL_USERNAME"));
    // Untrimmed: spaces may belong to a password. Its value never goes
    // into a problem report.
    let password = env
        .vars
        .get(&format!("{}{}", env.prefix, var("SASL_PASSWORD")))
        .filter(|p| !p.is_empty())
        .cloned();
    if !mechanism_set {
        if username.is_some() || password.is_some() {
            env.problem(
                &var("SASL_MECHANISM"),
                None,
                format!(
                    "a SASL mechanism (`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`), because {}{} or _PASSWORD is set",
                    env.prefix,
                    var("SASL_USERNAME")
                ),
            );
        }
        return None;
    }
    if username.is_none() {
        env.problem(
            &var("SASL_USERNAME"),
            None,
            format!(
                "the SASL user name, because {}{} is set",
                env.prefix,
                var("SASL_MECHANISM")
            ),
        );
    }
    if password.is_none() {
        env.problem(
            &var("SASL_PASSWORD"),
            None,
            format!(
                "the SASL password, because {}{} is set",
                env.prefix,
                var("SASL_MECHANISM")
            ),
        );
    }
    Some(Credentials {
        mechanism: mechanism?,
        username: username?,
        password: password?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
            .collect()
    }

    fn problems(pairs: &[(&str, &str)]) -> Vec<ConfigProblem> {
        match Config::from_vars(&vars(pairs)) {
            Ok(_) => Vec::new(),
            Err(e) => e.0,
        }
    }

    fn problem_for<'a>(p: &'a [ConfigProblem], var: &str) -> Option<&'a ConfigProblem> {
        p.iter().find(|p| p.variable == format!("{PREFIX}{var}"))
    }

    /// The startup log line shows every setting and no secret.
    #[test]
    fn debug_shows_every_setting_but_no_secret() {
        let c = Config::from_vars(&vars(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:9092"),
            ("ADMIN_TOKEN", "admin-token-secret-value"),
            ("UPSTREAM_SASL_MECHANISM", "PLAIN"),
            ("UPSTREAM_SASL_USERNAME", "proxy"),
            ("UPSTREAM_SASL_PASSWORD", "sasl-password-secret-value"),
            ("CONNECT_TIMEOUT_MS", "4321"),
            ("LOG_FORMAT", "json"),
            ("LINKS", "east"),
            ("LINK_EAST_SOURCE_CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qg"),
            ("LINK_EAST_TOPICS", "orders"),
        ]))
        .expect("valid");
        let shown = format!("{c:?}");
        for secret in ["admin-token-secret-value", "sasl-password-secret-value"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        for setting in [
            "connect_timeout_ms: 4321",
            "log_format: Json",
            "admin_token: Some(Secret(..))",
            "links: [\"east\"]",
        ] {
            assert!(shown.contains(setting), "{setting} missing: {shown}");
        }
    }

    #[test]
    fn sni_routing_without_tls_is_a_startup_error() {
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "0.0.0.0:9092"),
            ("SNI_HOST_PATTERN", "broker-$(nodeId).kafka.example.com"),
            ("SNI_BOOTSTRAP_HOST", "bootstrap.kafka.example.com"),
        ]);
        let tls = problem_for(&p, "TLS_CERT").expect("TLS_CERT named");
        assert!(tls.expected.contains("SNI routing"), "{tls:?}");
        // Not required in SNI mode, even on all interfaces.
        assert!(problem_for(&p, "ADVERTISED_HOST").is_none(), "{p:?}");
        assert_eq!(p.len(), 1, "{p:?}");
    }

    #[test]
    fn sni_routing_refuses_port_per_node_settings_and_bad_names() {
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("SNI_HOST_PATTERN", "broker.kafka.example.com"),
            ("SNI_BOOTSTRAP_HOST", "bootstrap.kafka.example.com"),
            ("BROKER_PORT_BASE", "19100"),
            ("ADVERTISED_HOST", "proxy.example.com"),
            ("SNI_ADVERTISED_PORT", "0"),
        ]);
        for var in [
            "SNI_HOST_PATTERN",
            "BROKER_PORT_BASE",
            "ADVERTISED_HOST",
            "SNI_ADVERTISED_PORT",
            "TLS_CERT",
        ] {
            assert!(problem_for(&p, var).is_some(), "{var} not named: {p:?}");
        }
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("SNI_HOST_PATTERN", "broker-$(nodeId).kafka.example.com"),
        ]);
        assert!(problem_for(&p, "SNI_BOOTSTRAP_HOST").is_some(), "{p:?}");
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("SNI_BOOTSTRAP_HOST", "bootstrap.kafka.example.com"),
        ]);
        assert!(problem_for(&p, "SNI_BOOTSTRAP_HOST").is_some(), "{p:?}");
    }

    #[test]
    fn a_response_budget_below_the_largest_frame_is_refused() {
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:19092"),
            ("MAX_FRAME_BYTES", "2000000"),
            ("MAX_BUFFERED_BYTES", "2000000"),
            ("MAX_BUFFERED_RESPONSE_BYTES", "1000000"),
            ("WRITE_TIMEOUT_MS", "0"),
        ]);
        let names: Vec<&str> = p.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(
            names,
            [
                "MIRROR_PROXY_MAX_BUFFERED_RESPONSE_BYTES",
                "MIRROR_PROXY_WRITE_TIMEOUT_MS"
            ]
        );
        assert!(p[0].expected.contains("MAX_FRAME_BYTES (2000000)"), "{p:?}");
    }

    #[test]
    fn minimal_configuration_has_documented_defaults() {
        let c = Config::from_vars(&vars(&[
            ("BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            ("LISTEN", "127.0.0.1:19092"),
        ]))
        .expect("valid");
        assert_eq!(c.bootstrap_servers, vec!["127.0.0.1:9092"]);
        assert_eq!(c.advertised_host, "127.0.0.1");
        // Node 0 must not land on the bootstrap port.
        assert_eq!(c.broker_port_base, 19093);
        assert_eq!(c.admin_listen.to_string(), "127.0.0.1:9190");
        assert_eq!(c.max_frame_bytes, 100 * 1024 * 1024);
        assert_eq!(c.max_buffered_bytes, 512 * 1024 * 1024);
        assert_eq!(c.max_buffered_response_bytes, 512 * 1024 * 1024);
        assert_eq!(c.buffer_wait_timeout_ms, 60_000);
        assert_eq!(c.write_timeout_ms, 30_000);
        assert!(
            c.buffer_wait_timeout_ms > c.write_timeout_ms,
            "stuck writers must be closed before the frames waiting for their memory"
        );
        assert_eq!(c.max_connections, 4096);
        assert_eq!(c.connections_max_idle_ms, 600_000);
        assert_eq!(c.worker_threads, None);
        assert_eq!(c.request_read_timeout_ms, 30_000);
        assert_eq!(c.response_read_timeout_ms, 30_000);
        assert_eq!(c.tls_handshake_timeout_ms, 10_000);
        assert_eq!(c.shutdown_timeout_ms, 30_000);
        assert_eq!(c.log_format, LogFormat::Text);
        assert!(c.client_tls.is_none() && c.upstream_tls.is_none());
        assert!(c.links.is_empty());
    }

    #[test]
    fn every_problem_is_reported_at_once_with_variable_and_value() {
        let p = problems(&[
            ("LISTEN", "not-an-address"),
            ("MAX_FRAME_BYTES", "12"),
            ("LOG_FORMAT", "xml"),
            ("ADMIN_LISTEN", "0.0.0.0:9190"),
            ("TLS_CERT", "/nonexistent/cert.pem"),
        ]);
        let vars: Vec<&str> = p.iter().map(|p| p.variable.as_str()).collect();
        for expected in [
            "MIRROR_PROXY_BOOTSTRAP_SERVERS",
            "MIRROR_PROXY_LISTEN",
            "MIRROR_PROXY_MAX_FRAME_BYTES",
            "MIRROR_PROXY_LOG_FORMAT",
            "MIRROR_PROXY_ADMIN_LISTEN",
            "MIRROR_PROXY_TLS_CERT",
            "MIRROR_PROXY_TLS_KEY",
        ] {
            assert!(vars.contains(&expected), "{expected} missing from {vars:?}");
        }
        let text = ConfigError(p).to_string();
        assert!(
            text.contains("MIRROR_PROXY_LOG_FORMAT=\"xml\": expected `text` or `json`"),
            "{text}"
        );
    }

    #[test]
    fn links_are_parsed_with_defaults() {
        let c = Config::from_vars(&vars(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:19092"),
            ("LINKS", "east-1,west"),
            ("LINK_EAST_1_SOURCE_CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qk"),
            ("LINK_EAST_1_TOPICS", "orders,audit\\..*"),
            ("LINK_WEST_SOURCE_CLUSTER_ID", "AAAAAAAAAAAAAAAAAAAAAA"),
            ("LINK_WEST_TOPICS", "x"),
            ("LINK_WEST_CLIENT_ID", "west-replicator"),
            ("LINK_WEST_CONTROL_BATCHES", "forward"),
        ]))
        .expect("valid");
        let east = c.links.by_client_id("mirror-east-1").expect("east");
        assert_eq!(east.name(), "east-1");
        assert_eq!(east.region(), 0x71720375);
        assert!(east.mirrors_topic("orders"));
        assert!(east.mirrors_topic("audit.2024"));
        assert!(!east.mirrors_topic("orders2"));
        assert_eq!(east.control_batches(), ControlBatchPolicy::Drop);
        let west = c.links.by_client_id("west-replicator").expect("west");
        assert_eq!(west.control_batches(), ControlBatchPolicy::Forward);
    }

    #[test]
    fn bad_links_name_the_variable() {
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:19092"),
            ("LINKS", "a,B_ad"),
            ("LINK_A_SOURCE_CLUSTER_ID", "too-short"),
            ("LINK_A_TOPICS", "("),
            ("LINK_A_TLS_SUBJECT", "CN=x"),
            ("LINK_A_CONTROL_BATCHES", "keep"),
        ]);
        let mut vars: Vec<&str> = p.iter().map(|p| p.variable.as_str()).collect();
        vars.sort();
        assert_eq!(
            vars,
            vec![
                "MIRROR_PROXY_LINKS",
                "MIRROR_PROXY_LINK_A_CONTROL_BATCHES",
                "MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID",
                "MIRROR_PROXY_LINK_A_TLS_SUBJECT",
                "MIRROR_PROXY_LINK_A_TOPICS",
            ]
        );
        let id = p
            .iter()
            .find(|p| p.variable.ends_with("SOURCE_CLUSTER_ID"))
            .expect("id problem");
        assert!(id.expected.contains("22 characters"), "{}", id.expected);
    }

    /// The rows of the configuration table in `doc` (the table under the
    /// `| variable | default | meaning |` header): each row's variable and
    /// default, without their backticks.
    fn documented_table(doc: &str) -> Vec<(String, String)> {
        doc.lines()
            .skip_while(|l| l.trim() != "| variable | default | meaning |")
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let mut cells = l.trim_start_matches('|').split(" | ");
                let mut cell = || cells.next().unwrap_or("").trim().trim_matches('`');
                (cell().to_string(), cell().to_string())
            })
            .collect()
    }

    /// How the configuration table in `doc` differs from [`VARIABLES`]:
    /// a variable without exactly one row, a row whose default is not
    /// exactly the variable's, a row for no variable.
    fn table_drift(doc: &str) -> Vec<String> {
        let rows = documented_table(doc);
        let mut drift = Vec::new();
        for (name, default, _) in VARIABLES {
            let name = format!("{PREFIX}{name}");
            let documented: Vec<&String> = rows
                .iter()
                .filter(|(n, _)| *n == name)
                .map(|(_, d)| d)
                .collect();
            match documented[..] {
                [] => drift.push(format!("no row for {name}")),
                [d] if d == default => {}
                [d] => drift.push(format!(
                    "{name}: the row says {d:?}, the default is {default:?}"
                )),
                _ => drift.push(format!("{} rows for {name}", documented.len())),
            }
        }
        for (name, _) in &rows {
            if !VARIABLES
                .iter()
                .any(|(n, _, _)| format!("{PREFIX}{n}") == *name)
            {
                drift.push(format!("a row for {name}, which is no variable"));
            }
        }
        drift
    }

    #[test]
    fn the_documented_tables_are_the_variables() {
        // The README's short table and docs/configuration.md's full one
        // name every variable with exactly its default, and nothing else.
        for (doc, text) in [
            ("README.md", include_str!("../README.md")),
            (
                "docs/configuration.md",
                include_str!("../docs/configuration.md"),
            ),
        ] {
            let drift = table_drift(text);
            assert!(
                drift.is_empty(),
                "{doc}'s configuration table differs from config::VARIABLES:\n{}",
                drift.join("\n")
            );
        }
    }

    #[test]
    fn a_drifted_table_is_reported() {
        let row = |name: &str, default: &str| format!("| `{PREFIX}{name}` | `{default}` | x |\n");
        let table = |rows: &mut dyn Iterator<Item = String>| {
            let mut doc = "intro\n\n| variable | default | meaning |\n|---|---|---|\n".to_string();
            doc.extend(rows);
            doc + "\nafter | the table\n"
        };
        let exact = table(&mut VARIABLES.iter().map(|(n, d, _)| row(n, d)));
        assert_eq!(table_drift(&exact), Vec::<String>::new());
        // One default changed (to a value found elsewhere in the table),
        // one row dropped, one row for a variable that does not exist.
        let drifted = table(
            &mut VARIABLES
                .iter()
                .filter(|(n, _, _)| *n != "LISTEN")
                .map(|(n, d, _)| {
                    if *n == "UPSTREAM_TLS" {
                        row(n, "0")
                    } else {
                        row(n, d)
                    }
                })
                .chain([row("LISTEN_TWICE", "0.0.0.0:9092")]),
        );
        assert_eq!(
            table_drift(&drifted),
            [
                format!("no row for {PREFIX}LISTEN"),
                format!("{PREFIX}UPSTREAM_TLS: the row says \"0\", the default is \"false\""),
                format!("a row for {PREFIX}LISTEN_TWICE, which is no variable"),
            ]
        );
    }

    #[test]
    fn upstream_sasl_credentials() {
        let base = [
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:19092"),
        ];
        let with = |extra: &[(&str, &str)]| {
            let mut all = base.to_vec();
            all.extend_from_slice(extra);
            vars(&all)
        };
        let c = Config::from_vars(&with(&[
            ("UPSTREAM_SASL_MECHANISM", "scram-sha-512"),
            ("UPSTREAM_SASL_USERNAME", "proxy"),
            ("UPSTREAM_SASL_PASSWORD", " pass word "),
        ]))
        .expect("valid");
        assert_eq!(
            c.upstream_sasl,
            Some(Credentials {
                mechanism: Mechanism::ScramSha512,
                username: "proxy".into(),
                password: " pass word ".into(),
            })
        );
        assert!(!format!("{c:?}").contains("pass word"));
        assert!(Config::from_vars(&with(&[]))
            .expect("valid")
            .upstream_sasl
            .is_none());

        // Every problem at once, and the password is never echoed.
        let p = match Config::from_vars(&with(&[
            ("UPSTREAM_SASL_MECHANISM", "GSSAPI"),
            ("UPSTREAM_SASL_PASSWORD", "hunter2"),
        ])) {
            Ok(_) => panic!("accepted"),
            Err(e) => e,
        };
        let vars: Vec<&str> = p.0.iter().map(|p| p.variable.as_str()).collect();
        assert_eq!(
            vars,
            [
                "MIRROR_PROXY_UPSTREAM_SASL_MECHANISM",
                "MIRROR_PROXY_UPSTREAM_SASL_USERNAME"
            ]
        );
        assert!(p.0[0].expected.contains("SCRAM-SHA-256"));
        assert!(!p.to_string().contains("hunter2"), "{p}");

        let p = match Config::from_vars(&with(&[("UPSTREAM_SASL_USERNAME", "proxy")])) {
            Ok(_) => panic!("accepted"),
            Err(e) => e,
        };
        assert_eq!(p.0.len(), 1);
        assert_eq!(p.0[0].variable, "MIRROR_PROXY_UPSTREAM_SASL_MECHANISM");
    }

    #[test]
    fn the_bootstrap_port_may_not_fall_among_the_node_ports() {
        for base in ["19092", "9000"] {
            let p = problems(&[
                ("BOOTSTRAP_SERVERS", "b:9092"),
                ("LISTEN", "127.0.0.1:19092"),
                ("BROKER_PORT_BASE", base),
            ]);
            assert_eq!(p.len(), 1, "{p:?}");
            assert_eq!(p[0].variable, "MIRROR_PROXY_BROKER_PORT_BASE");
            assert!(p[0].expected.contains("bootstrap port"), "{}", p[0]);
        }
        let ok = Config::from_vars(&vars(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:19092"),
            ("BROKER_PORT_BASE", "19100"),
        ]))
        .expect("valid");
        assert_eq!(ok.broker_port_base, 19100);
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:65535"),
        ]);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].variable, "MIRROR_PROXY_BROKER_PORT_BASE");
    }

    #[test]
    fn limits_and_timeouts_are_validated_together() {
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:19092"),
            ("MAX_FRAME_BYTES", "2097152"),
            ("MAX_BUFFERED_BYTES", "1048576"),
            ("MAX_CONNECTIONS", "0"),
            ("WORKER_THREADS", "0"),
            ("CONNECTIONS_MAX_IDLE_MS", "soon"),
            ("REQUEST_READ_TIMEOUT_MS", "-1"),
            ("RESPONSE_READ_TIMEOUT_MS", "0"),
            ("TLS_HANDSHAKE_TIMEOUT_MS", "0"),
            ("SHUTDOWN_TIMEOUT_MS", "1.5"),
        ]);
        let mut vars: Vec<&str> = p.iter().map(|p| p.variable.as_str()).collect();
        vars.sort();
        assert_eq!(
            vars,
            vec![
                "MIRROR_PROXY_CONNECTIONS_MAX_IDLE_MS",
                "MIRROR_PROXY_MAX_BUFFERED_BYTES",
                "MIRROR_PROXY_MAX_CONNECTIONS",
                "MIRROR_PROXY_REQUEST_READ_TIMEOUT_MS",
                "MIRROR_PROXY_RESPONSE_READ_TIMEOUT_MS",
                "MIRROR_PROXY_SHUTDOWN_TIMEOUT_MS",
                "MIRROR_PROXY_TLS_HANDSHAKE_TIMEOUT_MS",
                "MIRROR_PROXY_WORKER_THREADS",
            ]
        );
        let budget = p
            .iter()
            .find(|p| p.variable.ends_with("MAX_BUFFERED_BYTES"))
            .expect("budget problem");
        assert!(
            budget
                .expected
                .contains("MIRROR_PROXY_MAX_FRAME_BYTES (2097152)"),
            "{budget}"
        );
    }

    #[test]
    fn advertised_host_is_required_when_listening_on_all_interfaces() {
        let p = problems(&[("BOOTSTRAP_SERVERS", "b:9092")]);
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].variable, "MIRROR_PROXY_ADVERTISED_HOST");
    }

    #[test]
    fn failover_settings_are_validated_together() {
        let base = [
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:9092"),
            ("LINKS", "east"),
            ("LINK_EAST_SOURCE_CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qk"),
            ("LINK_EAST_TOPICS", "orders"),
        ];
        let c = Config::from_vars(&vars(&base)).expect("valid");
        assert_eq!(c.read_only_error, ReadOnlyError::PolicyViolation);
        assert_eq!(c.failover_drain_timeout_ms, 30_000);
        assert_eq!(c.unknown_outcome_wait_ms, 10_000);
        let east = c.links.iter().next().expect("one link");
        assert_eq!(east.initial_state(), LinkState::Mirroring);

        let mut set = base.to_vec();
        set.extend([
            ("READ_ONLY_ERROR", "read_only_topic"),
            ("FAILOVER_DRAIN_TIMEOUT_MS", "5000"),
            ("LINK_EAST_INITIAL_STATE", "stopped"),
        ]);
        let c = Config::from_vars(&vars(&set)).expect("valid");
        assert_eq!(c.read_only_error, ReadOnlyError::ReadOnlyTopic);
        assert_eq!(c.failover_drain_timeout_ms, 5000);
        let east = c.links.iter().next().expect("one link");
        assert_eq!(east.initial_state(), LinkState::Stopped);

        let mut bad = base.to_vec();
        bad.extend([
            ("READ_ONLY_ERROR", "read_only"),
            ("FAILOVER_DRAIN_TIMEOUT_MS", "0"),
            ("LINK_EAST_INITIAL_STATE", "paused"),
        ]);
        let names: Vec<String> = problems(&bad).into_iter().map(|p| p.variable).collect();
        for want in [
            "MIRROR_PROXY_READ_ONLY_ERROR",
            "MIRROR_PROXY_FAILOVER_DRAIN_TIMEOUT_MS",
            "MIRROR_PROXY_LINK_EAST_INITIAL_STATE",
        ] {
            assert!(
                names.iter().any(|n| n == want),
                "{want} missing from {names:?}"
            );
        }
    }

    #[test]
    fn state_topic_and_producer_expiration() {
        let base = [
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:9092"),
        ];
        let c = Config::from_vars(&vars(&base)).expect("valid");
        assert_eq!(c.state_topic, "__mirror_state");
        assert_eq!(c.producer_expiration_ms, 86_400_000);
        assert_eq!(c.producer_state_max_entries, 100_000);
        assert_eq!(c.producer_state_rebuild_bytes, 4 * 1024 * 1024);
        let mut set = base.to_vec();
        set.extend([
            ("STATE_TOPIC", "mirror.state-2"),
            ("PRODUCER_EXPIRATION_MS", "5000"),
            ("PRODUCER_STATE_MAX_ENTRIES", "7"),
        ]);
        let c = Config::from_vars(&vars(&set)).expect("valid");
        assert_eq!(c.state_topic, "mirror.state-2");
        assert_eq!(c.producer_expiration_ms, 5000);
        assert_eq!(c.producer_state_max_entries, 7);
        assert_eq!(c.state_key, None);
        assert_eq!(c.state_key_unsigned_before, 0);
        let key = "k".repeat(32);
        let mut keyed = base.to_vec();
        keyed.extend([
            ("STATE_KEY", key.as_str()),
            ("STATE_KEY_UNSIGNED_BEFORE", "120"),
        ]);
        let c = Config::from_vars(&vars(&keyed)).expect("valid");
        assert_eq!(
            c.state_key.as_ref().map(StateKey::expose),
            Some(key.as_bytes())
        );
        assert_eq!(c.state_key_unsigned_before, 120);
        assert!(
            !format!("{c:?} {:?}", c.state_key).contains(&key),
            "never printed"
        );
        let short = "s3cret-but-only-31-bytes-long!!";
        assert_eq!(short.len(), 31);
        let mut set = base.to_vec();
        set.push(("STATE_KEY", short));
        let p = problems(&set);
        assert_eq!(p[0].variable, "MIRROR_PROXY_STATE_KEY");
        assert!(!p[0].to_string().contains(short), "{}", p[0]);
        let mut set = base.to_vec();
        set.push(("STATE_KEY_UNSIGNED_BEFORE", "-1"));
        assert_eq!(
            problems(&set)[0].variable,
            "MIRROR_PROXY_STATE_KEY_UNSIGNED_BEFORE"
        );
        let mut zero = base.to_vec();
        zero.push(("PRODUCER_STATE_MAX_ENTRIES", "0"));
        let p = problems(&zero);
        assert_eq!(p[0].variable, "MIRROR_PROXY_PRODUCER_STATE_MAX_ENTRIES");
        let mut small = base.to_vec();
        small.push(("PRODUCER_STATE_REBUILD_BYTES", "100"));
        let p = problems(&small);
        assert_eq!(p[0].variable, "MIRROR_PROXY_PRODUCER_STATE_REBUILD_BYTES");
        for bad in ["has space", "..", "a/b", &"x".repeat(250)] {
            let mut set = base.to_vec();
            set.push(("STATE_TOPIC", bad));
            let p = problems(&set);
            assert_eq!(p.len(), 1, "{bad}");
            assert_eq!(p[0].variable, "MIRROR_PROXY_STATE_TOPIC");
        }
        let mut set = base.to_vec();
        set.push(("PRODUCER_EXPIRATION_MS", "0"));
        assert_eq!(
            problems(&set)[0].variable,
            "MIRROR_PROXY_PRODUCER_EXPIRATION_MS"
        );
    }

    #[test]
    fn instance_id_and_session_timeout() {
        let base = [
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:9092"),
        ];
        let c = Config::from_vars(&vars(&base)).expect("valid");
        assert_eq!(c.instance_id, None);
        assert_eq!(c.instance_session_timeout_ms, 10_000);
        let mut set = base.to_vec();
        set.extend([
            ("INSTANCE_ID", "proxy-a.1"),
            ("INSTANCE_SESSION_TIMEOUT_MS", "6000"),
        ]);
        let c = Config::from_vars(&vars(&set)).expect("valid");
        assert_eq!(c.instance_id.as_deref(), Some("proxy-a.1"));
        assert_eq!(c.instance_session_timeout_ms, 6000);
        let mut bad = base.to_vec();
        bad.extend([("INSTANCE_ID", "a/b"), ("INSTANCE_SESSION_TIMEOUT_MS", "0")]);
        let p = problems(&bad);
        let mut names: Vec<&str> = p.iter().map(|p| p.variable.as_str()).collect();
        names.sort();
        assert_eq!(
            names,
            [
                "MIRROR_PROXY_INSTANCE_ID",
                "MIRROR_PROXY_INSTANCE_SESSION_TIMEOUT_MS"
            ]
        );
    }
}
