//! The replicator's configuration (`kafka-mirror-proxy replicate`, SPEC
//! §12): one table of variables, `MIRROR_REPLICATOR_*`, each also a flag
//! (`SOURCE_BOOTSTRAP_SERVERS` is `--source-bootstrap-servers`), validated
//! in one pass that reports every problem at once, as the proxy's are.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use regex::Regex;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::table::{
    boolean, from_env_and_vars, host_ports, log_format, millis, one_of, patterns, pem_certs,
    pem_key, prefixed, sasl_mechanism, socket_addr, text, upstream_sasl, upstream_tls, variables,
    whole, Env, Invalid, SaslVars, TlsVars,
    Unset::{Described, Template, Value},
};
use super::{LogFormat, UpstreamTls};
use crate::wire::sasl::{Credentials, Mechanism};

pub(crate) const PREFIX: &str = "MIRROR_REPLICATOR_";

/// `OFFSETS_TOPIC`'s default.
pub(crate) const DEFAULT_OFFSETS_TOPIC: &str = "__mirror_offsets";

variables! {
    /// Every variable: (name without the prefix, default, meaning). The
    /// flags, the parser below and docs/replicator.md come from this table.
    pub const VARIABLES;
    rows: rows;
    SOURCE_BOOTSTRAP_SERVERS: Vec<String> {
        default: Described("(required)"),
        parse: host_ports,
        meaning: "Source cluster brokers, host:port,...",
    }
    DESTINATION_BOOTSTRAP_SERVERS: Vec<String> {
        default: Described("(required)"),
        parse: host_ports,
        meaning: "The proxy in front of the destination cluster, host:port,...",
    }
    LINK: String {
        default: Described("(required)"),
        parse: link_name,
        meaning: "The link's name, as in the proxy's MIRROR_PROXY_LINKS ([a-z0-9-]+).",
    }
    CLIENT_ID: String {
        default: Template("mirror-<link>"),
        parse: text,
        meaning: "The client.id of the Produce requests through the proxy (must equal the proxy's MIRROR_PROXY_LINK_<NAME>_CLIENT_ID) and of every request to the source; the replicator's other requests to the destination send <client id>.control (metadata, topics, progress, groups) and <client id>.offsets (the offsets topic).",
    }
    TOPICS: Vec<Regex> {
        default: Described("(required)"),
        parse: patterns,
        meaning: "Comma-separated topic names or regular expressions, each matched against the whole name (the proxy's LINK_<NAME>_TOPICS syntax).",
    }
    TRANSACTIONAL_ID: String {
        default: Template("<client id>"),
        parse: text,
        meaning: "Sent on Produce requests that carry a transactional batch (brokers require one).",
    }
    GROUP_ID: String {
        default: Template("replicator.<client id>"),
        parse: text,
        meaning: "Consumer group on the destination cluster holding the replicator's progress (acknowledged source positions).",
    }
    OFFSETS_TOPIC: String {
        default: Value(DEFAULT_OFFSETS_TOPIC),
        parse: text,
        meaning: "Compacted topic on the destination cluster (written through the proxy) holding the offset translation: where each partition's source and destination offsets stop moving together. Saved before every progress commit; read by `kafka-mirror-proxy offsets`.",
    }
    GROUPS: Vec<Regex> {
        default: Described("(none)"),
        parse: patterns,
        meaning: "Consumer groups of the source (names or regular expressions, as TOPICS) whose committed offsets are translated and committed on the destination while the group has no active member there.",
    }
    GROUP_SYNC_INTERVAL_MS: Duration {
        default: Value("10000"),
        parse: duration,
        meaning: "How often the GROUPS' offsets are read on the source and committed on the destination.",
    }
    MEMBERSHIP: bool {
        default: Value("true"),
        parse: boolean,
        meaning: "Share the link's partitions with its other instances: each instance joins the consumer group <GROUP_ID>.instances on the source cluster and copies the partitions its slot owns; `false`: this instance copies every partition alone.",
    }
    SESSION_TIMEOUT_MS: Duration {
        default: Value("10000"),
        parse: duration,
        meaning: "Membership: an instance that stops heartbeating for this long loses its partitions to the others (the source brokers' group.min/max.session.timeout.ms bound it).",
    }
    ADMIN_LISTEN: SocketAddr {
        default: Value("127.0.0.1:9191"),
        parse: |s| socket_addr(s, "host:port with an IP address, e.g. 127.0.0.1:9191"),
        meaning: "HTTP listener for /metrics, /healthz, /readyz and /offsets.",
    }
    DISCOVERY_INTERVAL_MS: Duration {
        default: Value("30000"),
        parse: duration,
        meaning: "How often the source's topics, partitions and configs are read again.",
    }
    START_OFFSET: StartOffset {
        default: Value("earliest"),
        parse: start_offset,
        meaning: "Where a partition without progress starts: `earliest`, `latest` or an offset.",
    }
    ISOLATION_LEVEL: Isolation {
        default: Value("read_committed"),
        parse: isolation,
        meaning: "`read_committed` (aborted transactions dropped) or `read_uncommitted` (every data batch copied).",
    }
    FETCH_MAX_BYTES: i32 {
        default: Value("52428800"),
        parse: fetch_bytes,
        meaning: "Bound on one Fetch response (all partitions of one source broker).",
    }
    PARTITION_FETCH_MAX_BYTES: i32 {
        default: Value("1048576"),
        parse: fetch_bytes,
        meaning: "One partition's share of a Fetch response.",
    }
    FETCH_MAX_WAIT_MS: Duration {
        default: Value("500"),
        parse: duration,
        meaning: "How long a source broker may hold a Fetch while it has no new records.",
    }
    MAX_BUFFERED_BYTES: usize {
        default: Value("268435456"),
        parse: |s| whole(s, |n: &usize| *n >= 1024 * 1024, "a whole number of bytes, at least 1048576"),
        meaning: "Fetched and not yet acknowledged bytes, all partitions together: the replicator's memory bound.",
    }
    MAX_IN_FLIGHT_REQUESTS: usize {
        default: Value("5"),
        parse: |s| whole(s, |n: &usize| (1..=5).contains(n), "a number from 1 to 5"),
        meaning: "Produce requests in flight on each destination connection (1 to 5).",
    }
    COMMIT_INTERVAL_MS: Duration {
        default: Value("5000"),
        parse: duration,
        meaning: "Acknowledged positions are committed at least this often (and after every 4 acknowledged batches of a partition).",
    }
    CREATE_TOPICS: bool {
        default: Value("true"),
        parse: boolean,
        meaning: "Create missing destination topics, add partitions the source added, and follow the source's replicated topic configs.",
    }
    REPLICATION_FACTOR: i16 {
        default: Value("-1"),
        parse: |s| whole(s, |n: &i16| *n == -1 || *n >= 1, "-1 (the cluster's default) or a replication factor from 1 to 32767"),
        meaning: "Replication factor of created topics (-1: the destination cluster's default).",
    }
    UNTIL_CAUGHT_UP: bool {
        default: Value("false"),
        parse: boolean,
        meaning: "Stop once every partition reached the source high watermark seen at start, and print a report.",
    }
    CONNECT_TIMEOUT_MS: Duration {
        default: Value("10000"),
        parse: duration,
        meaning: "Connecting (and TLS) to a broker of either cluster.",
    }
    REQUEST_TIMEOUT_MS: Duration {
        default: Value("30000"),
        parse: duration,
        meaning: "Bound on one request's round trip (a Fetch adds its wait).",
    }
    RETRY_BACKOFF_MS: Duration {
        default: Value("100"),
        parse: duration,
        meaning: "First wait before retrying a failed request; doubles up to RETRY_BACKOFF_MAX_MS.",
    }
    UNKNOWN_OUTCOME_WAIT_MS: Duration {
        default: Value("10000"),
        parse: duration,
        meaning: "A batch whose answer was lost with its connection is sent again after this long, and a partition resumed from a commit sends nothing for this long after start: a request a proxy instance still holds from before lands first, and the retry is its duplicate (the proxy's own UNKNOWN_OUTCOME_WAIT_MS).",
    }
    RETRY_BACKOFF_MAX_MS: Duration {
        default: Value("5000"),
        parse: duration,
        meaning: "Longest wait between retries. Retriable errors are retried for as long as the replicator runs.",
    }
    LOG_FORMAT: LogFormat {
        default: Value("text"),
        parse: log_format,
        meaning: "`text` or `json`; filter with RUST_LOG (default `info`).",
    }
    SOURCE_TLS: bool {
        default: Value("false"),
        parse: boolean,
        meaning: "TLS to the source brokers.",
    }
    SOURCE_TLS_CA: Vec<CertificateDer<'static>> {
        default: Described("(required with SOURCE_TLS)"),
        parse: pem_certs,
        meaning: "PEM CA bundle for the source brokers' certificates.",
    }
    SOURCE_TLS_CERT: Vec<CertificateDer<'static>> {
        default: Described("(none)"),
        parse: pem_certs,
        meaning: "PEM client certificate chain for the source brokers.",
    }
    SOURCE_TLS_KEY: PrivateKeyDer<'static> {
        default: Described("(none)"),
        parse: pem_key,
        meaning: "Its PEM private key.",
    }
    SOURCE_TLS_SERVER_NAME: String {
        default: Described("(broker host)"),
        parse: text,
        meaning: "Name the source brokers' certificates are verified against.",
    }
    SOURCE_SASL_MECHANISM: Mechanism {
        default: Described("(none)"),
        parse: sasl_mechanism,
        meaning: "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` for the source cluster.",
    }
    SOURCE_SASL_USERNAME: String {
        default: Described("(required with SOURCE_SASL_MECHANISM)"),
        parse: text,
        meaning: "Its user name.",
    }
    SOURCE_SASL_PASSWORD: String {
        default: Described("(required with SOURCE_SASL_MECHANISM)"),
        parse: text,
        meaning: "Its password, never logged.",
    }
    DESTINATION_TLS: bool {
        default: Value("false"),
        parse: boolean,
        meaning: "TLS to the proxy.",
    }
    DESTINATION_TLS_CA: Vec<CertificateDer<'static>> {
        default: Described("(required with DESTINATION_TLS)"),
        parse: pem_certs,
        meaning: "PEM CA bundle for the proxy's certificate.",
    }
    DESTINATION_TLS_CERT: Vec<CertificateDer<'static>> {
        default: Described("(none)"),
        parse: pem_certs,
        meaning: "PEM client certificate chain (the proxy's LINK_<NAME>_TLS_SUBJECT checks it).",
    }
    DESTINATION_TLS_KEY: PrivateKeyDer<'static> {
        default: Described("(none)"),
        parse: pem_key,
        meaning: "Its PEM private key.",
    }
    DESTINATION_TLS_SERVER_NAME: String {
        default: Described("(proxy host)"),
        parse: text,
        meaning: "Name the proxy's certificate is verified against.",
    }
    DESTINATION_SASL_MECHANISM: Mechanism {
        default: Described("(none)"),
        parse: sasl_mechanism,
        meaning: "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` for the destination (passed through the proxy).",
    }
    DESTINATION_SASL_USERNAME: String {
        default: Described("(required with DESTINATION_SASL_MECHANISM)"),
        parse: text,
        meaning: "Its user name.",
    }
    DESTINATION_SASL_PASSWORD: String {
        default: Described("(required with DESTINATION_SASL_MECHANISM)"),
        parse: text,
        meaning: "Its password, never logged.",
    }
}

const SOURCE_TLS_VARS: TlsVars = TlsVars {
    tls: &SOURCE_TLS,
    ca: &SOURCE_TLS_CA,
    cert: &SOURCE_TLS_CERT,
    key: &SOURCE_TLS_KEY,
    server_name: &SOURCE_TLS_SERVER_NAME,
};

const SOURCE_SASL_VARS: SaslVars = SaslVars {
    mechanism: &SOURCE_SASL_MECHANISM,
    username: &SOURCE_SASL_USERNAME,
    password: &SOURCE_SASL_PASSWORD,
};

const DESTINATION_TLS_VARS: TlsVars = TlsVars {
    tls: &DESTINATION_TLS,
    ca: &DESTINATION_TLS_CA,
    cert: &DESTINATION_TLS_CERT,
    key: &DESTINATION_TLS_KEY,
    server_name: &DESTINATION_TLS_SERVER_NAME,
};

const DESTINATION_SASL_VARS: SaslVars = SaslVars {
    mechanism: &DESTINATION_SASL_MECHANISM,
    username: &DESTINATION_SASL_USERNAME,
    password: &DESTINATION_SASL_PASSWORD,
};

fn duration(s: &str) -> Result<Duration, Invalid> {
    millis(s).map(Duration::from_millis)
}

fn link_name(s: &str) -> Result<String, Invalid> {
    if !s
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Err(Invalid::expected("a link name made of a-z, 0-9 and -"));
    }
    Ok(s.to_string())
}

fn start_offset(s: &str) -> Result<StartOffset, Invalid> {
    let expected = "`earliest`, `latest` or an offset (0 or more)";
    match s {
        "earliest" => Ok(StartOffset::Earliest),
        "latest" => Ok(StartOffset::Latest),
        n => whole(n, |n: &i64| *n >= 0, expected).map(StartOffset::At),
    }
}

fn isolation(s: &str) -> Result<Isolation, Invalid> {
    one_of(
        s,
        &[
            ("read_committed", Isolation::ReadCommitted),
            ("read_uncommitted", Isolation::ReadUncommitted),
        ],
        "`read_committed` or `read_uncommitted`",
    )
}

fn fetch_bytes(s: &str) -> Result<i32, Invalid> {
    whole(
        s,
        |n: &i32| *n >= 1024,
        "a whole number of bytes from 1024 to 2147483647",
    )
}

/// The flag of a variable: `SOURCE_TLS_CA` is `source-tls-ca`.
pub(crate) fn flag_name(variable: &str) -> String {
    variable.to_ascii_lowercase().replace('_', "-")
}

/// Where a partition without progress starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartOffset {
    Earliest,
    Latest,
    /// This offset, clamped to the log's range.
    At(i64),
}

/// How the source is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isolation {
    ReadCommitted,
    ReadUncommitted,
}

/// One cluster's connection settings. Its `Debug` shows no secret: the
/// TLS settings print their files, the credentials no password.
#[derive(Clone, Debug, Default)]
pub struct Side {
    pub bootstrap: Vec<String>,
    pub tls: Option<UpstreamTls>,
    pub sasl: Option<Credentials>,
}

/// The replicator's validated settings. Its `Debug` is the startup log
/// line: every setting, no secret (see [`Side`]).
#[derive(Clone, Debug)]
pub struct ReplicatorConfig {
    pub source: Side,
    pub destination: Side,
    pub link: String,
    pub client_id: String,
    pub transactional_id: String,
    /// Anchored at both ends.
    pub topics: Vec<Regex>,
    pub group_id: String,
    /// Source groups whose offsets follow (none: no group sync).
    pub groups: Vec<Regex>,
    pub group_sync_interval: Duration,
    /// The offset translation's topic on the destination.
    pub offsets_topic: String,
    /// Share partitions through `<group_id>.instances` on the source.
    pub membership: bool,
    pub session_timeout: Duration,
    pub admin_listen: Option<SocketAddr>,
    pub discovery_interval: Duration,
    pub start_offset: StartOffset,
    /// Per (topic, partition): where to start when there is no progress,
    /// over `start_offset` (tests, and a failback's start after B's
    /// barrier). Not a variable.
    pub start_offsets: BTreeMap<(String, i32), i64>,
    pub isolation: Isolation,
    pub fetch_max_bytes: i32,
    pub partition_fetch_max_bytes: i32,
    pub fetch_max_wait: Duration,
    pub max_buffered_bytes: usize,
    pub max_in_flight_requests: usize,
    pub commit_interval: Duration,
    pub create_topics: bool,
    pub replication_factor: i16,
    pub until_caught_up: bool,
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    pub unknown_outcome_wait: Duration,
    pub log_format: LogFormat,
}

/// The replicator's default GROUP_ID for `link` (`replicator.mirror-<link>`),
/// for the commands that find a replicator's progress without its settings.
pub(crate) fn default_group_id(link: &str) -> String {
    let client_id = CLIENT_ID.default.fill(&[("<link>", link)]);
    GROUP_ID.default.fill(&[("<client id>", &client_id)])
}

impl ReplicatorConfig {
    /// Settings for a program that builds them itself (tests, benchmarks):
    /// the defaults of [`VARIABLES`], no admin listener, no TLS or SASL.
    pub fn new(source: &str, destination: &str, link: &str, topics: &str) -> ReplicatorConfig {
        let vars = prefixed(
            PREFIX,
            &[
                ("SOURCE_BOOTSTRAP_SERVERS", source),
                ("DESTINATION_BOOTSTRAP_SERVERS", destination),
                ("LINK", link),
                ("TOPICS", topics),
            ],
        );
        let mut config = match ReplicatorConfig::from_vars(&vars) {
            Ok(config) => config,
            Err(e) => {
                panic!("ReplicatorConfig::new({source}, {destination}, {link}, {topics}): {e}")
            }
        };
        config.admin_listen = None;
        config
    }

    from_env_and_vars!(PREFIX);

    /// The settings `env` holds; `None` beside a problem.
    fn read(env: &mut Env<'_>) -> Option<ReplicatorConfig> {
        let source_bootstrap = env.required(
            SOURCE_BOOTSTRAP_SERVERS.name,
            &SOURCE_BOOTSTRAP_SERVERS,
            "comma-separated host:port list of the source brokers",
        );
        let destination_bootstrap = env.required(
            DESTINATION_BOOTSTRAP_SERVERS.name,
            &DESTINATION_BOOTSTRAP_SERVERS,
            "comma-separated host:port list of the proxy in front of the destination",
        );
        let link = env
            .required(
                LINK.name,
                &LINK,
                "the link's name, as in MIRROR_PROXY_LINKS",
            )
            .unwrap_or_default();
        let client_id = env.get_filled(CLIENT_ID.name, &CLIENT_ID, &[("<link>", &link)]);
        let transactional_id = env.get_filled(
            TRANSACTIONAL_ID.name,
            &TRANSACTIONAL_ID,
            &[("<client id>", &client_id)],
        );
        let group_id = env.get_filled(GROUP_ID.name, &GROUP_ID, &[("<client id>", &client_id)]);
        let topics = env.required(
            TOPICS.name,
            &TOPICS,
            "comma-separated topic names or regular expressions",
        );
        let groups = env.get(&GROUPS).unwrap_or_default();
        let admin_listen = env.get(&ADMIN_LISTEN);
        let discovery_interval = env.get(&DISCOVERY_INTERVAL_MS);
        let fetch_max_wait = env.get(&FETCH_MAX_WAIT_MS);
        let commit_interval = env.get(&COMMIT_INTERVAL_MS);
        let connect_timeout = env.get(&CONNECT_TIMEOUT_MS);
        let request_timeout = env.get(&REQUEST_TIMEOUT_MS);
        let retry_backoff = env.get(&RETRY_BACKOFF_MS);
        let retry_backoff_max = env.get(&RETRY_BACKOFF_MAX_MS);
        let unknown_outcome_wait = env.get(&UNKNOWN_OUTCOME_WAIT_MS);
        let session_timeout = env.get(&SESSION_TIMEOUT_MS);
        let group_sync_interval = env.get(&GROUP_SYNC_INTERVAL_MS);
        let start_offset = env.get(&START_OFFSET);
        let isolation = env.get(&ISOLATION_LEVEL);
        let fetch_max_bytes = env.get(&FETCH_MAX_BYTES);
        let partition_fetch_max_bytes = env.get(&PARTITION_FETCH_MAX_BYTES);
        let max_buffered_bytes = env.get(&MAX_BUFFERED_BYTES);
        let max_in_flight_requests = env.get(&MAX_IN_FLIGHT_REQUESTS);
        let create_topics = env.get(&CREATE_TOPICS);
        let replication_factor = env.get(&REPLICATION_FACTOR);
        let until_caught_up = env.get(&UNTIL_CAUGHT_UP);
        let membership = env.get(&MEMBERSHIP);
        let offsets_topic = env.get(&OFFSETS_TOPIC);
        let log_format = env.get(&LOG_FORMAT);
        let source_tls = upstream_tls(env, &SOURCE_TLS_VARS);
        let source_sasl = upstream_sasl(env, &SOURCE_SASL_VARS);
        let destination_tls = upstream_tls(env, &DESTINATION_TLS_VARS);
        let destination_sasl = upstream_sasl(env, &DESTINATION_SASL_VARS);
        // Every value the table gives is `Some` unless a problem was
        // recorded for it, so a `?` below returns only beside a problem.
        Some(ReplicatorConfig {
            source: Side {
                bootstrap: source_bootstrap?,
                tls: source_tls,
                sasl: source_sasl,
            },
            destination: Side {
                bootstrap: destination_bootstrap?,
                tls: destination_tls,
                sasl: destination_sasl,
            },
            link,
            client_id,
            transactional_id,
            topics: topics?,
            group_id,
            groups,
            group_sync_interval: group_sync_interval?,
            offsets_topic: offsets_topic?,
            membership: membership?,
            session_timeout: session_timeout?,
            admin_listen: Some(admin_listen?),
            discovery_interval: discovery_interval?,
            start_offset: start_offset?,
            start_offsets: BTreeMap::new(),
            isolation: isolation?,
            fetch_max_bytes: fetch_max_bytes?,
            partition_fetch_max_bytes: partition_fetch_max_bytes?,
            fetch_max_wait: fetch_max_wait?,
            max_buffered_bytes: max_buffered_bytes?,
            max_in_flight_requests: max_in_flight_requests?,
            commit_interval: commit_interval?,
            create_topics: create_topics?,
            replication_factor: replication_factor?,
            until_caught_up: until_caught_up?,
            connect_timeout: connect_timeout?,
            request_timeout: request_timeout?,
            retry_backoff: retry_backoff?,
            retry_backoff_max: retry_backoff_max?,
            unknown_outcome_wait: unknown_outcome_wait?,
            log_format: log_format?,
        })
    }

    /// Whether `topic` is one of the link's topics.
    /// The group on the source through which the link's instances share
    /// its partitions.
    pub(crate) fn instances_group(&self) -> String {
        format!("{}.instances", self.group_id)
    }

    /// Whether `group`'s offsets follow onto the destination (never the
    /// replicator's own groups).
    pub(crate) fn syncs_group(&self, group: &str) -> bool {
        group != self.group_id
            && group != self.instances_group()
            && self.groups.iter().any(|re| re.is_match(group))
    }

    pub(crate) fn copies_topic(&self, topic: &str) -> bool {
        self.topics.iter().any(|re| re.is_match(topic))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::config::table::Var;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        crate::config::table::prefixed(PREFIX, pairs)
    }

    /// A variable's default, read from the table as `from_vars` reads it.
    fn default<T>(var: &Var<T>) -> T {
        match (var.parse)(var.default.text()) {
            Ok(value) => value,
            Err(e) => panic!("{}'s default: {e:?}", var.name),
        }
    }

    const REQUIRED: &[(&str, &str)] = &[
        ("SOURCE_BOOTSTRAP_SERVERS", "a:9092"),
        ("DESTINATION_BOOTSTRAP_SERVERS", "proxy:9092,proxy2:9092"),
        ("LINK", "east"),
        ("TOPICS", "orders,audit\\..*"),
    ];

    #[test]
    fn defaults_follow_the_link_name() {
        let c = ReplicatorConfig::from_vars(&vars(REQUIRED)).expect("valid");
        assert_eq!(c.client_id, "mirror-east");
        assert_eq!(c.transactional_id, "mirror-east");
        assert_eq!(c.group_id, "replicator.mirror-east");
        assert_eq!(default_group_id("east"), c.group_id);
        assert_eq!(c.offsets_topic, DEFAULT_OFFSETS_TOPIC);
        assert_eq!(c.destination.bootstrap, ["proxy:9092", "proxy2:9092"]);
        assert!(c.copies_topic("orders") && c.copies_topic("audit.x"));
        assert!(!c.copies_topic("orders2") && !c.copies_topic("xaudit.x"));
        assert_eq!(c.start_offset, default(&START_OFFSET));
        assert_eq!(c.isolation, default(&ISOLATION_LEVEL));
        assert_eq!(c.max_in_flight_requests, default(&MAX_IN_FLIGHT_REQUESTS));
        assert_eq!(c.admin_listen, Some(default(&ADMIN_LISTEN)));
        assert_eq!(c.create_topics, default(&CREATE_TOPICS));
        assert_eq!(c.until_caught_up, default(&UNTIL_CAUGHT_UP));
        assert_eq!(c.fetch_max_wait, default(&FETCH_MAX_WAIT_MS));
        assert!(c.source.tls.is_none() && c.destination.sasl.is_none());
    }

    #[test]
    fn debug_shows_every_setting_but_no_secret() {
        let mut set = REQUIRED.to_vec();
        set.extend([
            ("SOURCE_SASL_MECHANISM", "PLAIN"),
            ("SOURCE_SASL_USERNAME", "replicator"),
            ("SOURCE_SASL_PASSWORD", "source-password-secret"),
            ("DESTINATION_SASL_MECHANISM", "PLAIN"),
            ("DESTINATION_SASL_USERNAME", "replicator"),
            ("DESTINATION_SASL_PASSWORD", "destination-password-secret"),
        ]);
        for (name, _, meaning) in VARIABLES {
            if meaning.contains("never logged") {
                assert!(
                    set.iter().any(|(set, _)| set == name),
                    "{name} is never logged, so this test must set it"
                );
            }
        }
        let c = ReplicatorConfig::from_vars(&vars(&set)).expect("valid");
        let shown = format!("{c:?}");
        for secret in ["source-password-secret", "destination-password-secret"] {
            assert!(!shown.contains(secret), "{shown}");
        }
        crate::config::table::docs::assert_shows_every_field(
            &shown,
            include_str!("replicator.rs"),
            "ReplicatorConfig",
        );
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let e = ReplicatorConfig::from_vars(&vars(&[
            ("SOURCE_BOOTSTRAP_SERVERS", "no-port"),
            ("LINK", "East"),
            ("TOPICS", "("),
            ("MAX_IN_FLIGHT_REQUESTS", "6"),
            ("START_OFFSET", "-3"),
            ("SOURCE_SASL_MECHANISM", "PLAIN"),
            ("DESTINATION_TLS", "true"),
        ]))
        .expect_err("invalid");
        let named: Vec<&str> = e.0.iter().map(|p| p.variable.as_str()).collect();
        for v in [
            "MIRROR_REPLICATOR_SOURCE_BOOTSTRAP_SERVERS",
            "MIRROR_REPLICATOR_DESTINATION_BOOTSTRAP_SERVERS",
            "MIRROR_REPLICATOR_LINK",
            "MIRROR_REPLICATOR_TOPICS",
            "MIRROR_REPLICATOR_MAX_IN_FLIGHT_REQUESTS",
            "MIRROR_REPLICATOR_START_OFFSET",
            "MIRROR_REPLICATOR_SOURCE_SASL_USERNAME",
            "MIRROR_REPLICATOR_SOURCE_SASL_PASSWORD",
            "MIRROR_REPLICATOR_DESTINATION_TLS_CA",
        ] {
            assert!(named.contains(&v), "{v} not reported in {named:?}");
        }
        let sasl =
            e.0.iter()
                .find(|p| p.variable == "MIRROR_REPLICATOR_SOURCE_SASL_USERNAME")
                .expect("reported");
        assert!(
            sasl.expected
                .contains("MIRROR_REPLICATOR_SOURCE_SASL_MECHANISM"),
            "{sasl}"
        );
    }

    #[test]
    fn every_variable_has_a_flag_of_its_own() {
        let mut flags: Vec<String> = VARIABLES.iter().map(|(n, _, _)| flag_name(n)).collect();
        assert!(flags.contains(&"source-bootstrap-servers".to_string()));
        flags.sort();
        flags.dedup();
        assert_eq!(flags.len(), VARIABLES.len());
    }

    #[test]
    fn every_variable_read_is_in_the_table_and_every_entry_is_read() {
        // A name read that the table lacks would be a variable without a
        // flag or a doc row; an entry never read, a flag that does nothing.
        let mut with_groups = REQUIRED.to_vec();
        with_groups.push(("GROUPS", "g.*"));
        let vars = vars(&with_groups);
        let mut env = Env::new(PREFIX, &vars);
        let read = ReplicatorConfig::read(&mut env);
        assert!(read.is_some(), "{:?}", env.problems);
        let table: std::collections::BTreeSet<String> =
            VARIABLES.iter().map(|(n, _, _)| n.to_string()).collect();
        assert_eq!(env.read.take(), table);
    }

    #[test]
    fn every_default_is_a_value_its_parser_reads() {
        for row in rows() {
            assert!(
                row.default_parses,
                "{}'s default {:?}",
                row.name, row.default
            );
        }
    }

    #[test]
    fn the_documented_table_is_the_table() {
        use crate::config::table::docs::{documented, drift, render, Column};
        let rendered = render(PREFIX, &rows(), Column::Meaning);
        let drift = drift(
            &documented(include_str!("../../docs/replicator.md")),
            &rendered,
        );
        assert!(
            drift.is_empty(),
            "docs/replicator.md's table differs from VARIABLES:\n{}\n\nthe table renders as:\n{}",
            drift.join("\n"),
            rendered.join("\n")
        );
    }
}
