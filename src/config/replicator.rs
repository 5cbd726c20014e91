//! The replicator's configuration (`kafka-mirror-proxy replicate`, SPEC
//! §12): one table of variables, `MIRROR_REPLICATOR_*`, each also a flag
//! (`SOURCE_BOOTSTRAP_SERVERS` is `--source-bootstrap-servers`), validated
//! in one pass that reports every problem at once, as the proxy's are.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use regex::Regex;

use super::{
    parse_bool, parse_socket_addr, process_vars, upstream_sasl, upstream_tls, ConfigError, Env,
    LogFormat, UpstreamTls,
};
use crate::wire::sasl::Credentials;

pub const PREFIX: &str = "MIRROR_REPLICATOR_";

/// `OFFSETS_TOPIC`'s default.
pub const DEFAULT_OFFSETS_TOPIC: &str = "__mirror_offsets";

/// Every variable: (name without the prefix, default, meaning). The flags,
/// the parser below and docs/replicator.md come from this table.
pub const VARIABLES: &[(&str, &str, &str)] = &[
    ("SOURCE_BOOTSTRAP_SERVERS", "(required)", "Source cluster brokers, host:port,..."),
    ("DESTINATION_BOOTSTRAP_SERVERS", "(required)", "The proxy in front of the destination cluster, host:port,..."),
    ("LINK", "(required)", "The link's name, as in the proxy's MIRROR_PROXY_LINKS ([a-z0-9-]+)."),
    ("CLIENT_ID", "mirror-<link>", "The client.id of the Produce requests through the proxy (must equal the proxy's MIRROR_PROXY_LINK_<NAME>_CLIENT_ID) and of every request to the source; the replicator's other requests to the destination send <client id>.control (metadata, topics, progress, groups) and <client id>.offsets (the offsets topic)."),
    ("TOPICS", "(required)", "Comma-separated topic names or regular expressions, each matched against the whole name (the proxy's LINK_<NAME>_TOPICS syntax)."),
    ("TRANSACTIONAL_ID", "<client id>", "Sent on Produce requests that carry a transactional batch (brokers require one)."),
    ("GROUP_ID", "replicator.<client id>", "Consumer group on the destination cluster holding the replicator's progress (acknowledged source positions)."),
    ("OFFSETS_TOPIC", DEFAULT_OFFSETS_TOPIC, "Compacted topic on the destination cluster (written through the proxy) holding the offset translation: where each partition's source and destination offsets stop moving together. Saved before every progress commit; read by `kafka-mirror-proxy offsets`."),
    ("GROUPS", "(none)", "Consumer groups of the source (names or regular expressions, as TOPICS) whose committed offsets are translated and committed on the destination while the group has no active member there."),
    ("GROUP_SYNC_INTERVAL_MS", "10000", "How often the GROUPS' offsets are read on the source and committed on the destination."),
    ("MEMBERSHIP", "true", "Share the link's partitions with its other instances: each instance joins the consumer group <GROUP_ID>.instances on the source cluster and copies the partitions its slot owns; `false`: this instance copies every partition alone."),
    ("SESSION_TIMEOUT_MS", "10000", "Membership: an instance that stops heartbeating for this long loses its partitions to the others (the source brokers' group.min/max.session.timeout.ms bound it)."),
    ("ADMIN_LISTEN", "127.0.0.1:9191", "HTTP listener for /metrics, /healthz, /readyz and /offsets."),
    ("DISCOVERY_INTERVAL_MS", "30000", "How often the source's topics, partitions and configs are read again."),
    ("START_OFFSET", "earliest", "Where a partition without progress starts: `earliest`, `latest` or an offset."),
    ("ISOLATION_LEVEL", "read_committed", "`read_committed` (aborted transactions dropped) or `read_uncommitted` (every data batch copied)."),
    ("FETCH_MAX_BYTES", "52428800", "Bound on one Fetch response (all partitions of one source broker)."),
    ("PARTITION_FETCH_MAX_BYTES", "1048576", "One partition's share of a Fetch response."),
    ("FETCH_MAX_WAIT_MS", "500", "How long a source broker may hold a Fetch while it has no new records."),
    ("MAX_BUFFERED_BYTES", "268435456", "Fetched and not yet acknowledged bytes, all partitions together: the replicator's memory bound."),
    ("MAX_IN_FLIGHT_REQUESTS", "5", "Produce requests in flight on each destination connection (1 to 5)."),
    ("COMMIT_INTERVAL_MS", "5000", "Acknowledged positions are committed at least this often (and after every 4 acknowledged batches of a partition)."),
    ("CREATE_TOPICS", "true", "Create missing destination topics, add partitions the source added, and follow the source's replicated topic configs."),
    ("REPLICATION_FACTOR", "-1", "Replication factor of created topics (-1: the destination cluster's default)."),
    ("UNTIL_CAUGHT_UP", "false", "Stop once every partition reached the source high watermark seen at start, and print a report."),
    ("CONNECT_TIMEOUT_MS", "10000", "Connecting (and TLS) to a broker of either cluster."),
    ("REQUEST_TIMEOUT_MS", "30000", "Bound on one request's round trip (a Fetch adds its wait)."),
    ("RETRY_BACKOFF_MS", "100", "First wait before retrying a failed request; doubles up to RETRY_BACKOFF_MAX_MS."),
    ("UNKNOWN_OUTCOME_WAIT_MS", "10000", "A batch whose answer was lost with its connection is sent again after this long, and a partition resumed from a commit sends nothing for this long after start: a request a proxy instance still holds from before lands first, and the retry is its duplicate (the proxy's own UNKNOWN_OUTCOME_WAIT_MS)."),
    ("RETRY_BACKOFF_MAX_MS", "5000", "Longest wait between retries. Retriable errors are retried for as long as the replicator runs."),
    ("LOG_FORMAT", "text", "`text` or `json`; filter with RUST_LOG (default `info`)."),
    ("SOURCE_TLS", "false", "TLS to the source brokers."),
    ("SOURCE_TLS_CA", "(required with SOURCE_TLS)", "PEM CA bundle for the source brokers' certificates."),
    ("SOURCE_TLS_CERT", "(none)", "PEM client certificate chain for the source brokers."),
    ("SOURCE_TLS_KEY", "(none)", "Its PEM private key."),
    ("SOURCE_TLS_SERVER_NAME", "(broker host)", "Name the source brokers' certificates are verified against."),
    ("SOURCE_SASL_MECHANISM", "(none)", "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` for the source cluster."),
    ("SOURCE_SASL_USERNAME", "(required with SOURCE_SASL_MECHANISM)", "Its user name."),
    ("SOURCE_SASL_PASSWORD", "(required with SOURCE_SASL_MECHANISM)", "Its password, never logged."),
    ("DESTINATION_TLS", "false", "TLS to the proxy."),
    ("DESTINATION_TLS_CA", "(required with DESTINATION_TLS)", "PEM CA bundle for the proxy's certificate."),
    ("DESTINATION_TLS_CERT", "(none)", "PEM client certificate chain (the proxy's LINK_<NAME>_TLS_SUBJECT checks it)."),
    ("DESTINATION_TLS_KEY", "(none)", "Its PEM private key."),
    ("DESTINATION_TLS_SERVER_NAME", "(proxy host)", "Name the proxy's certificate is verified against."),
    ("DESTINATION_SASL_MECHANISM", "(none)", "`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512` for the destination (passed through the proxy)."),
    ("DESTINATION_SASL_USERNAME", "(required with DESTINATION_SASL_MECHANISM)", "Its user name."),
    ("DESTINATION_SASL_PASSWORD", "(required with DESTINATION_SASL_MECHANISM)", "Its password, never logged."),
];

/// The flag of a variable: `SOURCE_TLS_CA` is `source-tls-ca`.
pub fn flag_name(variable: &str) -> String {
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

/// One cluster's connection settings.
#[derive(Clone, Default)]
pub struct Side {
    pub bootstrap: Vec<String>,
    pub tls: Option<UpstreamTls>,
    pub sasl: Option<Credentials>,
}

/// The replicator's validated settings.
#[derive(Clone)]
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

impl std::fmt::Debug for ReplicatorConfig {
    // By hand: no TLS key or password is printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicatorConfig")
            .field("source", &self.source.bootstrap)
            .field("destination", &self.destination.bootstrap)
            .field("link", &self.link)
            .field("client_id", &self.client_id)
            .field(
                "topics",
                &self.topics.iter().map(Regex::as_str).collect::<Vec<_>>(),
            )
            .field("group_id", &self.group_id)
            .field("membership", &self.membership)
            .finish_non_exhaustive()
    }
}

impl ReplicatorConfig {
    /// Settings for a program that builds them itself (tests, benchmarks):
    /// the defaults of [`VARIABLES`], no admin listener, no TLS or SASL.
    pub fn new(source: &str, destination: &str, link: &str, topics: &str) -> ReplicatorConfig {
        let vars: HashMap<String, String> = [
            ("SOURCE_BOOTSTRAP_SERVERS", source),
            ("DESTINATION_BOOTSTRAP_SERVERS", destination),
            ("LINK", link),
            ("TOPICS", topics),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
        .collect();
        let mut config = match ReplicatorConfig::from_vars(&vars) {
            Ok(config) => config,
            Err(e) => {
                panic!("ReplicatorConfig::new({source}, {destination}, {link}, {topics}): {e}")
            }
        };
        config.admin_listen = None;
        config
    }

    /// Read the process environment.
    pub fn from_env() -> Result<ReplicatorConfig, ConfigError> {
        Self::from_vars(&process_vars(PREFIX))
    }

    /// Validate a map of variables (full names, with the prefix).
    pub fn from_vars(vars: &HashMap<String, String>) -> Result<ReplicatorConfig, ConfigError> {
        let mut env = Env::new(PREFIX, vars);
        let source_bootstrap = env.host_ports("SOURCE_BOOTSTRAP_SERVERS", "the source brokers");
        let destination_bootstrap = env.host_ports(
            "DESTINATION_BOOTSTRAP_SERVERS",
            "the proxy in front of the destination",
        );
        let link = match env.raw("LINK") {
            None => {
                env.problem("LINK", None, "the link's name, as in MIRROR_PROXY_LINKS");
                String::new()
            }
            Some(l)
                if l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
            {
                l
            }
            Some(l) => {
                env.problem("LINK", Some(l), "a link name made of a-z, 0-9 and -");
                String::new()
            }
        };
        let client_id = env
            .raw("CLIENT_ID")
            .unwrap_or_else(|| format!("mirror-{link}"));
        let transactional_id = env
            .raw("TRANSACTIONAL_ID")
            .unwrap_or_else(|| client_id.clone());
        let group_id = env
            .raw("GROUP_ID")
            .unwrap_or_else(|| format!("replicator.{client_id}"));
        let topics = env.topic_patterns("TOPICS").unwrap_or_default();
        let groups = if env.raw("GROUPS").is_some() {
            env.topic_patterns("GROUPS").unwrap_or_default()
        } else {
            Vec::new()
        };
        let admin_listen = env
            .parse(
                "ADMIN_LISTEN",
                "host:port with an IP address, e.g. 127.0.0.1:9191",
                parse_socket_addr,
            )
            .unwrap_or(([127, 0, 0, 1], 9191).into());
        let mut ms = |name: &str, default: u64| {
            Duration::from_millis(
                env.parse(name, "a whole number of milliseconds greater than 0", |s| {
                    s.parse::<u64>().ok().filter(|n| *n > 0)
                })
                .unwrap_or(default),
            )
        };
        let discovery_interval = ms("DISCOVERY_INTERVAL_MS", 30_000);
        let fetch_max_wait = ms("FETCH_MAX_WAIT_MS", 500);
        let commit_interval = ms("COMMIT_INTERVAL_MS", 5_000);
        let connect_timeout = ms("CONNECT_TIMEOUT_MS", 10_000);
        let request_timeout = ms("REQUEST_TIMEOUT_MS", 30_000);
        let retry_backoff = ms("RETRY_BACKOFF_MS", 100);
        let retry_backoff_max = ms("RETRY_BACKOFF_MAX_MS", 5_000);
        let unknown_outcome_wait = ms("UNKNOWN_OUTCOME_WAIT_MS", 10_000);
        let session_timeout = ms("SESSION_TIMEOUT_MS", 10_000);
        let group_sync_interval = ms("GROUP_SYNC_INTERVAL_MS", 10_000);
        let start_offset = env
            .parse(
                "START_OFFSET",
                "`earliest`, `latest` or an offset (0 or more)",
                |s| match s {
                    "earliest" => Some(StartOffset::Earliest),
                    "latest" => Some(StartOffset::Latest),
                    n => n
                        .parse::<i64>()
                        .ok()
                        .filter(|n| *n >= 0)
                        .map(StartOffset::At),
                },
            )
            .unwrap_or(StartOffset::Earliest);
        let isolation = env
            .parse(
                "ISOLATION_LEVEL",
                "`read_committed` or `read_uncommitted`",
                |s| match s {
                    "read_committed" => Some(Isolation::ReadCommitted),
                    "read_uncommitted" => Some(Isolation::ReadUncommitted),
                    _ => None,
                },
            )
            .unwrap_or(Isolation::ReadCommitted);
        let mut bytes = |name: &str, default: i32| {
            env.parse(
                name,
                "a whole number of bytes from 1024 to 2147483647",
                |s| s.parse::<i32>().ok().filter(|n| *n >= 1024),
            )
            .unwrap_or(default)
        };
        let fetch_max_bytes = bytes("FETCH_MAX_BYTES", 50 * 1024 * 1024);
        let partition_fetch_max_bytes = bytes("PARTITION_FETCH_MAX_BYTES", 1024 * 1024);
        let max_buffered_bytes = env
            .parse(
                "MAX_BUFFERED_BYTES",
                "a whole number of bytes, at least 1048576",
                |s| s.parse::<usize>().ok().filter(|n| *n >= 1024 * 1024),
            )
            .unwrap_or(256 * 1024 * 1024);
        let max_in_flight_requests = env
            .parse("MAX_IN_FLIGHT_REQUESTS", "a number from 1 to 5", |s| {
                s.parse::<usize>().ok().filter(|n| (1..=5).contains(n))
            })
            .unwrap_or(5);
        let create_topics = env
            .parse("CREATE_TOPICS", "`true` or `false`", parse_bool)
            .unwrap_or(true);
        let replication_factor = env
            .parse(
                "REPLICATION_FACTOR",
                "-1 (the cluster's default) or a replication factor from 1 to 32767",
                |s| s.parse::<i16>().ok().filter(|n| *n == -1 || *n >= 1),
            )
            .unwrap_or(-1);
        let until_caught_up = env
            .parse("UNTIL_CAUGHT_UP", "`true` or `false`", parse_bool)
            .unwrap_or(false);
        let membership = env
            .parse("MEMBERSHIP", "`true` or `false`", parse_bool)
            .unwrap_or(true);
        let offsets_topic = env
            .raw("OFFSETS_TOPIC")
            .unwrap_or_else(|| DEFAULT_OFFSETS_TOPIC.to_string());
        let log_format = env
            .parse("LOG_FORMAT", "`text` or `json`", |s| match s {
                "text" => Some(LogFormat::Text),
                "json" => Some(LogFormat::Json),
                _ => None,
            })
            .unwrap_or(LogFormat::Text);
        let source = Side {
            bootstrap: source_bootstrap,
            tls: upstream_tls(&mut env, "SOURCE"),
            sasl: upstream_sasl(&mut env, "SOURCE"),
        };
        let destination = Side {
            bootstrap: destination_bootstrap,
            tls: upstream_tls(&mut env, "DESTINATION"),
            sasl: upstream_sasl(&mut env, "DESTINATION"),
        };
        if !env.problems.is_empty() {
            return Err(ConfigError(env.problems));
        }
        Ok(ReplicatorConfig {
            source,
            destination,
            link,
            client_id,
            transactional_id,
            topics,
            group_id,
            groups,
            group_sync_interval,
            offsets_topic,
            membership,
            session_timeout,
            admin_listen: Some(admin_listen),
            discovery_interval,
            start_offset,
            start_offsets: BTreeMap::new(),
            isolation,
            fetch_max_bytes,
            partition_fetch_max_bytes,
            fetch_max_wait,
            max_buffered_bytes,
            max_in_flight_requests,
            commit_interval,
            create_topics,
            replication_factor,
            until_caught_up,
            connect_timeout,
            request_timeout,
            retry_backoff,
            retry_backoff_max,
            unknown_outcome_wait,
            log_format,
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
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (format!("{PREFIX}{k}"), v.to_string()))
            .collect()
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
        assert_eq!(c.destination.bootstrap, ["proxy:9092", "proxy2:9092"]);
        assert!(c.copies_topic("orders") && c.copies_topic("audit.x"));
        assert!(!c.copies_topic("orders2") && !c.copies_topic("xaudit.x"));
        assert_eq!(c.start_offset, StartOffset::Earliest);
        assert_eq!(c.isolation, Isolation::ReadCommitted);
        assert_eq!(c.max_in_flight_requests, 5);
        assert_eq!(c.admin_listen, Some(([127, 0, 0, 1], 9191).into()));
        assert!(c.create_topics && !c.until_caught_up);
        assert!(c.source.tls.is_none() && c.destination.sasl.is_none());
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
    fn every_variable_read_is_in_the_table() {
        // The parser reads only names of the table: a name it reads that
        // the table lacks would be a variable without a flag or a doc row.
        let source = include_str!("replicator.rs");
        let table: Vec<&str> = VARIABLES.iter().map(|(n, _, _)| *n).collect();
        let parser = &source[..source.find("#[cfg(test)]").unwrap_or(source.len())];
        for quoted in parser.split('"').skip(1).step_by(2) {
            let is_name = !quoted.is_empty()
                && quoted.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !quoted.ends_with('_');
            // The two stems of the TLS and SASL variables.
            if is_name && !["SOURCE", "DESTINATION"].contains(&quoted) {
                assert!(
                    table.contains(&quoted),
                    "{quoted} is read but not in VARIABLES"
                );
            }
        }
    }

    #[test]
    fn the_documented_table_is_the_table() {
        let doc = include_str!("../../docs/replicator.md");
        let rows: Vec<(String, String)> = doc
            .lines()
            .filter_map(|l| l.strip_prefix("| `MIRROR_REPLICATOR_"))
            .filter_map(|l| {
                let mut cells = l.split(" | ");
                let name = cells.next()?.strip_suffix('`')?.to_string();
                let default = cells.next()?.trim_matches('`').to_string();
                Some((name, default))
            })
            .collect();
        let table: Vec<(String, String)> = VARIABLES
            .iter()
            .map(|(n, d, _)| (n.to_string(), d.to_string()))
            .collect();
        assert_eq!(
            rows, table,
            "docs/replicator.md's table and VARIABLES differ"
        );
    }
}
