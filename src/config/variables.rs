//! The proxy's table: every `MIRROR_PROXY_*` variable once, with its
//! default, parser and meaning (and the README's one-line summary).
//! `Config::from_vars` reads these entries, docs/configuration.md and the
//! README show them (a test holds both tables to this one, row by row).

use std::net::SocketAddr;

use regex::Regex;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::table::{
    boolean, host_ports, log_format, millis, patterns, pem_certs, pem_key, port, sasl_mechanism,
    socket_addr, text, variables, whole, Invalid, SaslVars, TlsVars,
    Unset::{Described, Template, Value},
};
use super::{LogFormat, ReadOnlyError, Secret, StateKey, DEFAULT_STATE_TOPIC};
use crate::mirror::link::ControlBatchPolicy;
use crate::mirror::link_state::LinkState;
use crate::mirror::pid::ClusterId;
use crate::wire::sasl::Mechanism;

variables! {
    /// Every variable: (name without the prefix, default, meaning), in the
    /// order of the documented tables.
    pub const VARIABLES;
    rows: rows;
    BOOTSTRAP_SERVERS: Vec<String> {
        default: Described("(required)"),
        parse: host_ports,
        summary: "destination brokers, host:port,...",
        meaning: "Comma-separated host:port of the destination brokers the proxy bootstraps from.",
    }
    LISTEN: SocketAddr {
        default: Value("0.0.0.0:9092"),
        parse: |s| socket_addr(s, "host:port with an IP address, e.g. 0.0.0.0:9092"),
        summary: "bootstrap listener",
        meaning: "Bootstrap listener address (host:port).",
    }
    ADVERTISED_HOST: String {
        default: Described("host of LISTEN"),
        parse: advertised_host,
        summary: "host clients are told for every broker",
        meaning: "Host name clients are told to connect to for every broker; required when LISTEN binds all interfaces. Port-per-node routing only (not with SNI_HOST_PATTERN).",
    }
    BROKER_PORT_BASE: u16 {
        default: Described("port of LISTEN + 1"),
        parse: |s| whole(s, |p: &u16| *p > 0, "a port number (1-65535); node n is served at base + n"),
        summary: "node n is served at ADVERTISED_HOST:(BASE + n)",
        meaning: "Broker node n is served at ADVERTISED_HOST:(BROKER_PORT_BASE + n). Must be above the LISTEN port, so that no node id maps onto the bootstrap listener. Port-per-node routing only (not with SNI_HOST_PATTERN).",
    }
    SNI_HOST_PATTERN: String {
        default: Described("(none)"),
        parse: text,
        summary: "SNI routing on one TLS port: node n is advertised as this name with `$(nodeId)` = n",
        meaning: "Enables SNI routing instead of a port per node: broker node n is advertised as this host name with `$(nodeId)` replaced by n (e.g. `broker-$(nodeId).kafka.example.com`), on the one LISTEN port, and each client connection goes to the node its TLS ClientHello names. Requires TLS_CERT (a certificate valid for the bootstrap name and every node name, e.g. a wildcard) and SNI_BOOTSTRAP_HOST; ADVERTISED_HOST and BROKER_PORT_BASE must not be set. A connection without SNI, or naming neither the bootstrap nor a known node, is refused with a TLS access_denied alert.",
    }
    SNI_BOOTSTRAP_HOST: String {
        default: Described("(required with SNI_HOST_PATTERN)"),
        parse: text,
        summary: "host name clients bootstrap at, with SNI routing",
        meaning: "With SNI routing: the host name clients bootstrap at; a connection naming it goes to any of BOOTSTRAP_SERVERS.",
    }
    SNI_ADVERTISED_PORT: u16 {
        default: Described("port of LISTEN"),
        parse: port,
        summary: "port advertised for every node, with SNI routing",
        meaning: "With SNI routing: the port advertised for every node, when clients reach the listener through another port (a load balancer's).",
    }
    ADMIN_LISTEN: SocketAddr {
        default: Value("127.0.0.1:9190"),
        parse: |s| socket_addr(s, "host:port with an IP address, e.g. 127.0.0.1:9190"),
        summary: "admin HTTP; loopback unless ADMIN_TOKEN",
        meaning: "Admin HTTP address (/healthz, /readyz, /metrics). Must be loopback unless ADMIN_TOKEN is set.",
    }
    ADMIN_TOKEN: Secret {
        default: Described("(none)"),
        parse: |s| Ok(Secret(s.to_string())),
        summary: "bearer token for the admin endpoint",
        meaning: "Bearer token required by the admin endpoint; allows a non-loopback ADMIN_LISTEN.",
    }
    MAX_FRAME_BYTES: usize {
        default: Value("104857600"),
        parse: |s| whole(s, |n: &usize| (1024..=i32::MAX as usize).contains(n), "a whole number of bytes from 1024 to 2147483647"),
        summary: "largest frame accepted",
        meaning: "Largest request or response frame accepted, in bytes; a larger one closes that connection.",
    }
    MAX_BUFFERED_BYTES: usize {
        default: Value("536870912"),
        parse: budget_bytes,
        summary: "request memory shared by all connections (backpressure)",
        meaning: "Memory for client request frames, in bytes, shared by all connections (frames are allocated as their bytes arrive). When it is used up, the proxy stops reading requests until forwarded frames free some. A connection holds at most one request frame of it at a time, and while the broker holds one of its requests (a long poll) at most MAX_BUFFERED_BYTES / MAX_CONNECTIONS: a larger request waits unread until the broker has answered. At least MAX_FRAME_BYTES.",
    }
    MAX_BUFFERED_RESPONSE_BYTES: usize {
        default: Value("536870912"),
        parse: budget_bytes,
        summary: "response memory shared by all connections (backpressure on the brokers)",
        meaning: "Memory for broker response frames, in bytes, shared by all connections. When it is used up, the proxy stops reading responses from the brokers until responses written to their clients free some. A connection holds at most one response frame of it at a time. At least MAX_FRAME_BYTES.",
    }
    BUFFER_WAIT_TIMEOUT_MS: u64 {
        default: Value("60000"),
        parse: millis,
        summary: "a frame waiting longer for memory closes its connection",
        meaning: "A request or response frame that cannot get memory under MAX_BUFFERED_BYTES or MAX_BUFFERED_RESPONSE_BYTES within this time closes its connection (WARN; counted as `buffer_wait_timeout`); the client retries on a new connection. Longer than WRITE_TIMEOUT_MS, so that connections whose writes are stuck are closed, and give their memory back, before the ones waiting for it.",
    }
    WRITE_TIMEOUT_MS: u64 {
        default: Value("30000"),
        parse: millis,
        summary: "a write to a broker or client without progress for this long closes the connection",
        meaning: "A write of a request to its broker, or of a response to its client, that makes no progress for this long closes the connection (WARN; counted as `upstream_write_timeout` or `client_write_timeout`), giving back the memory its frame holds. A broker reads nothing more from a connection while it holds a request there (a Fetch long poll, a Produce waiting for acks), and a client may stop reading: without this bound such a connection would hold its frame's memory for as long as it liked. Clients that pipeline more than the socket buffers hold behind a request the broker may keep longer than this (a Produce timeout_ms, a Fetch max_wait_ms above 30 s) need it raised.",
    }
    MAX_CONNECTIONS: usize {
        default: Value("4096"),
        parse: |s| whole(s, |n: &usize| *n > 0, "a whole number of connections greater than 0"),
        summary: "client connections open at once",
        meaning: "Client connections open at once; a connection over it is accepted and closed at once (WARN, at most one line per 10 s; counted). Each client connection also holds one broker connection, so the process needs about twice as many file descriptors.",
    }
    WORKER_THREADS: usize {
        default: Described("number of cores"),
        parse: |s| whole(s, |n: &usize| (1..=1024).contains(n), "a whole number of threads from 1 to 1024"),
        summary: "tokio worker threads",
        meaning: "Worker threads of tokio's runtime, which run the proxy's connections. On the 2-core machines the benchmarks run on, 1 cost 1-19% less CPU per GB than 2 in the same runs, with as much throughput (see [benchmarks.md](benchmarks.md) and the [benchmark log](benchmark-log.md)); the default stays one per core so that no proxy is capped at one core unasked.",
    }
    CONNECTIONS_MAX_IDLE_MS: u64 {
        default: Value("600000"),
        parse: millis,
        summary: "idle client connections are closed",
        meaning: "A client connection with no request in flight that sends nothing for this long is closed (like the broker's connections.max.idle.ms).",
    }
    REQUEST_READ_TIMEOUT_MS: u64 {
        default: Value("30000"),
        parse: millis,
        summary: "a started frame must arrive whole within it",
        meaning: "Once the first byte of a request frame has arrived, the whole frame must arrive within this time, or the connection is closed.",
    }
    RESPONSE_READ_TIMEOUT_MS: u64 {
        default: Value("30000"),
        parse: millis,
        summary: "a started broker response must arrive whole within it",
        meaning: "Once the first byte of a broker's response frame has arrived, the whole frame must arrive within this time (time it waits for memory under MAX_BUFFERED_RESPONSE_BYTES does not count), or the broker connection and its client's connection are closed (WARN; counted as `upstream_read_timeout`), giving back the memory the frame holds. A broker that stalls or trickles in the middle of a response would otherwise hold that memory for as long as it liked. Kafka clients give up on a response after their own request.timeout.ms (30 s by default), counted from before its first byte, so a response slower than this is one they no longer wait for; raise it with theirs.",
    }
    TLS_HANDSHAKE_TIMEOUT_MS: u64 {
        default: Value("10000"),
        parse: millis,
        summary: "client TLS handshake",
        meaning: "Time a client has to complete the TLS handshake (with TLS_CERT set).",
    }
    SHUTDOWN_TIMEOUT_MS: u64 {
        default: Value("30000"),
        parse: millis,
        summary: "drain time on SIGTERM/SIGINT",
        meaning: "On SIGTERM or SIGINT, how long requests in flight may take to be answered before the remaining connections are closed.",
    }
    CONNECT_TIMEOUT_MS: u64 {
        default: Value("10000"),
        parse: millis,
        summary: "connect (and TLS) to a broker",
        meaning: "Timeout for connecting (and TLS handshaking) to a broker.",
    }
    LOG_FORMAT: LogFormat {
        default: Value("text"),
        parse: log_format,
        summary: "`text` or `json`; filter with `RUST_LOG` (default `info`)",
        meaning: "`text` or `json` (one JSON object per line). Filter with RUST_LOG (default info).",
    }
    TLS_CERT: Vec<CertificateDer<'static>> {
        default: Described("(none)"),
        parse: pem_certs,
        summary: "PEM chain served to clients: TLS on every client listener",
        meaning: "PEM certificate chain served to clients; enables TLS on every client listener.",
    }
    TLS_KEY: PrivateKeyDer<'static> {
        default: Described("(none)"),
        parse: pem_key,
        summary: "its PEM private key",
        meaning: "PEM private key for TLS_CERT (PKCS#8, PKCS#1 or SEC1).",
    }
    TLS_CLIENT_CA: Vec<CertificateDer<'static>> {
        default: Described("(none)"),
        parse: pem_certs,
        summary: "CA for client certificates (links with TLS_SUBJECT)",
        meaning: "PEM CA bundle for client certificates. Clients may still connect without one; links with TLS_SUBJECT require one.",
    }
    UPSTREAM_TLS: bool {
        default: Value("false"),
        parse: boolean,
        summary: "TLS to the brokers",
        meaning: "`true` to connect to the brokers with TLS.",
    }
    UPSTREAM_TLS_CA: Vec<CertificateDer<'static>> {
        default: Described("(required with UPSTREAM_TLS)"),
        parse: pem_certs,
        summary: "CA of the broker certificates",
        meaning: "PEM CA bundle that signs the broker certificates.",
    }
    UPSTREAM_TLS_CERT: Vec<CertificateDer<'static>> {
        default: Described("(none)"),
        parse: pem_certs,
        summary: "PEM client certificate chain for the brokers",
        meaning: "PEM client certificate chain presented to the brokers.",
    }
    UPSTREAM_TLS_KEY: PrivateKeyDer<'static> {
        default: Described("(none)"),
        parse: pem_key,
        summary: "its PEM private key",
        meaning: "PEM private key for UPSTREAM_TLS_CERT.",
    }
    UPSTREAM_TLS_SERVER_NAME: String {
        default: Described("(broker host)"),
        parse: text,
        summary: "name broker certificates are verified against",
        meaning: "Name the broker certificates are verified against, instead of the advertised broker host.",
    }
    UPSTREAM_SASL_MECHANISM: Mechanism {
        default: Described("(none)"),
        parse: sasl_mechanism,
        summary: "`PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512` for the proxy's own connections",
        meaning: "SASL for the proxy's own connections to the brokers (state topic, failover barrier): `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`. Client connections always pass their own SASL through.",
    }
    UPSTREAM_SASL_USERNAME: String {
        default: Described("(required with UPSTREAM_SASL_MECHANISM)"),
        parse: text,
        summary: "its user name",
        meaning: "User name for UPSTREAM_SASL_MECHANISM.",
    }
    UPSTREAM_SASL_PASSWORD: String {
        default: Described("(required with UPSTREAM_SASL_MECHANISM)"),
        parse: text,
        summary: "its password, never logged",
        meaning: "Password for UPSTREAM_SASL_MECHANISM, taken as is (not trimmed); never logged or echoed in errors.",
    }
    STATE_TOPIC: String {
        default: Value(DEFAULT_STATE_TOPIC),
        parse: topic_name,
        summary: "compacted topic of the mapping state, shared by all instances",
        meaning: "Compacted topic on the destination cluster holding the producer-id mapping state (origins, salts), shared by every proxy instance. Created when missing (one partition, cleanup.policy=compact, compression.type=producer, replication factor min(3, brokers), min.insync.replicas min(2, RF)); an existing topic that is not compacted stops the proxy; one whose batches the brokers recompress is read (every codec), with a WARN.",
    }
    STATE_KEY: StateKey {
        default: Described("(none)"),
        parse: state_key,
        summary: "shared secret signing the state records (HMAC-SHA256), never logged",
        meaning: "Shared secret (at least 32 bytes, e.g. `openssl rand -base64 32`) with which every instance signs the records it writes to the state topic (HMAC-SHA256 in a `kmp-mac` header) and without which it applies none: records written around the proxy, without the key, are skipped (logged, `state_records_skipped_total`). Every instance sharing the state topic needs the same key. Never logged. Enabling it on a topic written without it: see STATE_KEY_UNSIGNED_BEFORE.",
    }
    STATE_KEY_UNSIGNED_BEFORE: i64 {
        default: Value("0"),
        parse: |s| whole(s, |n: &i64| *n >= 0, "an offset from 0 to 9223372036854775807"),
        summary: "records below this offset apply unchecked (rolling the key out)",
        meaning: "With STATE_KEY: records at offsets below this one are applied without checking their MAC (written before every instance signed with the key). To enable or change the key on a running deployment: roll every instance with the key and 9223372036854775807 (they sign, and still accept the records of instances not yet rolled), then roll them again with the state topic's end offset read after the first roll (docs/state-topic.md).",
    }
    PRODUCER_EXPIRATION_MS: u64 {
        default: Value("86400000"),
        parse: millis,
        summary: "an unseen mirrored producer is forgotten",
        meaning: "A mirrored producer (origin) not seen for this long is forgotten: its state-topic records are tombstoned and its mapped PID may be reused. Last-seen times are persisted at most once per tenth of it. Until then each instance holds its claim: about 400 bytes of memory an origin (a million origins: about 400 MiB). Origins are bounded by this expiration, not by a count: a claim dropped while its producer may still write would let another origin take its mapped PID.",
    }
    PRODUCER_STATE_MAX_ENTRIES: usize {
        default: Value("100000"),
        parse: |s| whole(s, |n: &usize| *n > 0, "a whole number of producers greater than 0"),
        summary: "mirrored producers whose state is kept (LRU)",
        meaning: "Mirrored producers (destination partition and mapped producer id) whose state the proxy keeps to answer link retries without duplicates and refuse out-of-order batches; the least recently used with no batch in flight is evicted first (counted); one with a batch in flight never is, and when every producer held has one a new producer's batch is refused with the retriable NOT_ENOUGH_REPLICAS (`producer_state_full`). About 250 bytes each: the default bounds it near 25 MiB, room for e.g. 1,000 partitions with 100 producers each.",
    }
    READ_ONLY_ERROR: ReadOnlyError {
        default: Value("policy_violation"),
        parse: read_only_error,
        summary: "how local writes to a mirrored topic are refused",
        meaning: "How a local Produce to a topic of a link that is not STOPPED is refused (per partition, non-retriable, with a message naming the link and the failover command): `policy_violation` (POLICY_VIOLATION, 44) or `read_only_topic` (READ_ONLY_TOPIC, 134, only at Produce versions whose clients know it; Kafka 4.4.0 defines no such error (its code 134 is GROUP_DELETION_FAILED) and Produce only up to v13, so today every version falls back to POLICY_VIOLATION).",
    }
    FAILOVER_DRAIN_TIMEOUT_MS: u64 {
        default: Value("30000"),
        parse: millis,
        summary: "wait for every instance to drain the link",
        meaning: "How long a failover waits for every live proxy instance to confirm it closed the link's connections before placing the barriers anyway; instances that did not confirm are named in the failover's result.",
    }
    PRODUCER_STATE_REBUILD_BYTES: i32 {
        default: Value("4194304"),
        parse: |s| whole(s, |n: &i32| *n >= 1024, "a whole number of bytes from 1024 to 2147483647"),
        summary: "log tail read to rebuild producer state",
        meaning: "Bytes of a mirrored partition's log tail the proxy reads, on the first link Produce to it after start-up (and after an unknown outcome, a leader move or a truncation), to rebuild the producer state (so that a retry of a batch appended before a restart or a lost answer is still answered as a duplicate). Batches older than the tail that fits are not deduplicated (counted: `mirror_producer_state_offsets_beyond_bound`).",
    }
    UNKNOWN_OUTCOME_WAIT_MS: u64 {
        default: Value("10000"),
        parse: millis,
        summary: "wait out a link request whose answer was lost before trusting a log tail without it",
        meaning: "A link Produce sent to the broker whose answer never came (the connection was lost) may still be appended later: the broker handles a request it read even after the connection closed, and one may wait in its queue or on the network. Until the request's own `timeout_ms`, capped by this, has passed since the loss was seen, its producer's batches on that partition are answered with the retriable NOT_ENOUGH_REPLICAS (`outcome_unknown`) unless the log tail shows the lost batch (then the retry is answered as a duplicate); after it, a stable re-read of the tail without the batch is taken to mean it was never appended. A lost request the broker appends later than this is appended twice: raise it where requests can sit longer (a loaded broker, a slow network).",
    }
    INSTANCE_ID: String {
        default: Described("a random UUID per process"),
        parse: instance_id,
        summary: "this instance's name",
        meaning: "This process's name among the proxy instances sharing the state topic (1 to 200 characters of [a-zA-Z0-9._-]); it appears in the instances' group as the member client id `kafka-mirror-proxy/<id>`. Two running processes must not share one.",
    }
    INSTANCE_SESSION_TIMEOUT_MS: u64 {
        default: Value("10000"),
        parse: millis,
        summary: "a silent instance is dropped after it",
        meaning: "With links: the instances' group coordinator drops an instance that has not heartbeaten for this long (a killed proxy stops being counted as live within it). Must lie within the brokers' `group.min.session.timeout.ms` (6000) and `group.max.session.timeout.ms` (1800000). Half of it is each instance's state-topic lease: an instance that has not read the state topic to its end for that long forwards no link batch (retriable NOT_ENOUGH_REPLICAS), and a failover that an instance did not confirm waits that long before its barriers.",
    }
    LINKS: String {
        default: Described("(none)"),
        parse: text,
        summary: "mirror link names",
        meaning: "Comma-separated mirror link names ([a-z0-9-]+). Each link has the LINK_<NAME>_* variables below, <NAME> upper-cased with - as _.",
    }
    LINK_SOURCE_CLUSTER_ID = "LINK_<NAME>_SOURCE_CLUSTER_ID": (ClusterId, String) {
        default: Described("(required per link)"),
        parse: cluster_id,
        summary: "the source cluster id (22 base64 characters)",
        meaning: "The link's source cluster id: 22 characters of URL-safe base64 (16 bytes).",
    }
    LINK_CLIENT_ID = "LINK_<NAME>_CLIENT_ID": String {
        default: Template("mirror-<name>"),
        parse: text,
        summary: "the replicator's client.id",
        meaning: "The client.id the link's replicator uses; its Produce requests are remapped.",
    }
    LINK_TOPICS = "LINK_<NAME>_TOPICS": Vec<Regex> {
        default: Described("(required per link)"),
        parse: patterns,
        summary: "mirrored topics: names or regular expressions",
        meaning: "Comma-separated mirrored topics: names or regular expressions, each matched against the whole topic name.",
    }
    LINK_TLS_SUBJECT = "LINK_<NAME>_TLS_SUBJECT": String {
        default: Described("(none)"),
        parse: text,
        summary: "certificate subject the link's client must present",
        meaning: "When set, only a TLS client whose certificate subject matches may act as the link (`CN=name` matches the common name; anything else the full subject, e.g. `CN=replicator,O=acme`, compared attribute by attribute as RFC 4514 parses it: write a comma inside a value as `\\,`). Unset, the client id alone identifies the link (a WARN at start says so). The link's topics may not include the state topic.",
    }
    LINK_INITIAL_STATE = "LINK_<NAME>_INITIAL_STATE": LinkState {
        default: Value("MIRRORING"),
        parse: initial_state,
        summary: "state until the state topic records one",
        meaning: "The link's state while the state topic has no record of it (a record, once written by a failover or start, always wins): `MIRRORING`, `STOPPING`, `STOPPED` or `PREPARING` (a failback link: fenced and read-only until `kafka-mirror-proxy failback` starts it).",
    }
    LINK_REVERSE_OF = "LINK_<NAME>_REVERSE_OF": String {
        default: Described("(none)"),
        parse: text,
        summary: "a failback link: the link it fails back",
        meaning: "For a failback link (SPEC §12): the link of the source cluster's proxy that mirrored this cluster into the source and failed over. With `LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS` it enables `GET /links/<name>/failback` (the divergence report) and `POST /links/<name>/failback` on the admin API, as `kafka-mirror-proxy failback` does.",
    }
    LINK_SOURCE_BOOTSTRAP_SERVERS = "LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS": Vec<String> {
        default: Described("(none)"),
        parse: list,
        summary: "a failback link: the source's brokers",
        meaning: "For a failback link: the source cluster's brokers (host:port,...), read by the failback API over plain TCP (its state topic under this proxy's STATE_TOPIC name, the replicators' `__mirror_offsets`, their groups `replicator.mirror-<link>`).",
    }
    LINK_CONTROL_BATCHES = "LINK_<NAME>_CONTROL_BATCHES": ControlBatchPolicy {
        default: Value("drop"),
        parse: control_batches,
        summary: "`drop` or `forward` control batches",
        meaning: "Control batches arriving on the link: `drop` (acknowledge without writing, counted) or `forward` (send on, remapped, for the broker to decide).",
    }
}

/// The proxy's TLS to its brokers.
pub(crate) const UPSTREAM_TLS_VARS: TlsVars = TlsVars {
    tls: &UPSTREAM_TLS,
    ca: &UPSTREAM_TLS_CA,
    cert: &UPSTREAM_TLS_CERT,
    key: &UPSTREAM_TLS_KEY,
    server_name: &UPSTREAM_TLS_SERVER_NAME,
};

/// The proxy's own SASL towards its brokers.
pub(crate) const UPSTREAM_SASL_VARS: SaslVars = SaslVars {
    mechanism: &UPSTREAM_SASL_MECHANISM,
    username: &UPSTREAM_SASL_USERNAME,
    password: &UPSTREAM_SASL_PASSWORD,
};

fn advertised_host(h: &str) -> Result<String, Invalid> {
    if h.contains(':') && !h.starts_with('[') && h.parse::<std::net::Ipv6Addr>().is_err() {
        return Err(Invalid::expected(
            "a host name or IP address without a port",
        ));
    }
    Ok(h.to_string())
}

/// A buffer budget. A frame is held whole before it is passed on, so a
/// budget smaller than the largest frame could never read it: that check
/// is `Config::from_vars`'s, across the two variables.
fn budget_bytes(s: &str) -> Result<usize, Invalid> {
    whole(
        s,
        |n: &usize| *n >= 1024,
        "a whole number of bytes from 1024 up",
    )
}

fn topic_name(s: &str) -> Result<String, Invalid> {
    let ok = s.len() <= 249
        && s != "."
        && s != ".."
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(Invalid::expected(
            "a Kafka topic name: 1 to 249 characters of [a-zA-Z0-9._-]",
        ));
    }
    Ok(s.to_string())
}

/// The key is never echoed, not even in a configuration error.
fn state_key(s: &str) -> Result<StateKey, Invalid> {
    if s.len() < StateKey::MIN_LEN {
        return Err(Invalid::expected(
            "a secret of at least 32 bytes (the value given is shorter; it is not shown)",
        )
        .secret());
    }
    Ok(StateKey(s.as_bytes().to_vec()))
}

fn read_only_error(s: &str) -> Result<ReadOnlyError, Invalid> {
    super::table::one_of(
        s,
        &[
            ("policy_violation", ReadOnlyError::PolicyViolation),
            ("read_only_topic", ReadOnlyError::ReadOnlyTopic),
        ],
        "`policy_violation` or `read_only_topic`",
    )
}

fn instance_id(s: &str) -> Result<String, Invalid> {
    let ok = s.len() <= 200
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !ok {
        return Err(Invalid::expected("1 to 200 characters of [a-zA-Z0-9._-]"));
    }
    Ok(s.to_string())
}

/// The id, and its spelling as written (kept for the link's reports).
fn cluster_id(s: &str) -> Result<(ClusterId, String), Invalid> {
    match s.parse::<ClusterId>() {
        Ok(id) => Ok((id, s.to_string())),
        Err(e) => Err(Invalid::expected(
            "a Kafka cluster id, 22 characters of URL-safe base64 encoding 16 bytes",
        )
        .because(e)),
    }
}

fn initial_state(s: &str) -> Result<LinkState, Invalid> {
    LinkState::parse(s)
        .ok_or_else(|| Invalid::expected("`MIRRORING`, `STOPPING`, `STOPPED` or `PREPARING`"))
}

/// A comma-separated list, as written (the failback API checks the
/// servers when it connects).
fn list(s: &str) -> Result<Vec<String>, Invalid> {
    Ok(s.split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect())
}

fn control_batches(s: &str) -> Result<ControlBatchPolicy, Invalid> {
    super::table::one_of(
        s,
        &[
            ("drop", ControlBatchPolicy::Drop),
            ("forward", ControlBatchPolicy::Forward),
        ],
        "`drop` or `forward`",
    )
}
