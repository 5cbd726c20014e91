//! Configuration from `MIRROR_PROXY_*` environment variables, parsed and
//! validated in one place before anything starts.
//!
//! Every problem is collected, so an operator fixing a deployment sees all of
//! them in one run instead of one per restart. Files named by the TLS settings
//! are read and parsed here too: a certificate that does not load is a
//! configuration error, not a runtime surprise on the first connection.

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::mirror::link::{Link, Links};
use crate::wire::sasl::Credentials;

pub mod replicator;
pub(crate) mod sni;
mod table;
mod variables;
pub(crate) use sni::{SniNames, SniRoute};
pub(crate) use table::process_vars;
use table::{from_env_and_vars, link_var, upstream_sasl, upstream_tls, Env, Var};
use variables as v;
pub use variables::VARIABLES;

/// The prefix shared by every variable the proxy reads.
pub(crate) const PREFIX: &str = "MIRROR_PROXY_";

/// One problem with one variable: what it should hold, and the error that
/// refused its value when there was one.
#[derive(Debug, Clone)]
pub struct ConfigProblem {
    pub variable: String,
    pub value: Option<String>,
    pub expected: String,
    pub source: Option<Arc<dyn Error + Send + Sync>>,
}

impl ConfigProblem {
    fn named(
        prefix: &str,
        name: &str,
        value: Option<String>,
        expected: &str,
        source: impl Error + Send + Sync + 'static,
    ) -> ConfigProblem {
        ConfigProblem {
            variable: format!("{prefix}{name}"),
            value,
            expected: expected.to_string(),
            source: Some(Arc::new(source)),
        }
    }
}

// The cause is shown too: the problems are what an operator reads, and
// most print no chain.
impl fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.value {
            Some(v) => write!(f, "{}={:?}: expected {}", self.variable, v, self.expected)?,
            None => write!(
                f,
                "{} is not set: expected {}",
                self.variable, self.expected
            )?,
        }
        match &self.source {
            Some(cause) => write!(f, " ({cause})"),
            None => Ok(()),
        }
    }
}

impl Error for ConfigProblem {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source
            .as_deref()
            .map(|cause| cause as &(dyn Error + 'static))
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

    pub(crate) fn expose(&self) -> &[u8] {
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
    pub(crate) fn expose(&self) -> &str {
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
pub(crate) const DEFAULT_STATE_TOPIC: &str = "__mirror_state";

impl Config {
    from_env_and_vars!(PREFIX);

    /// The configuration `env` holds; `None` beside a problem.
    fn read(env: &mut Env<'_>) -> Option<Config> {
        let bootstrap_servers = env.required(
            v::BOOTSTRAP_SERVERS.name,
            &v::BOOTSTRAP_SERVERS,
            "comma-separated host:port list of the destination brokers",
        );
        let listen = env.get(&v::LISTEN);
        let advertised_host = Self::advertised_host(env, listen);
        let broker_port_base = env.get(&v::BROKER_PORT_BASE);
        let broker_port_base =
            listen.and_then(|l| Self::broker_port_base(env, l, broker_port_base));
        let admin_token = env.get(&v::ADMIN_TOKEN);
        let admin_listen = env.get(&v::ADMIN_LISTEN);
        if let Some(admin_listen) = admin_listen {
            if !admin_listen.ip().is_loopback() && admin_token.is_none() {
                env.problem(
                    v::ADMIN_LISTEN.name,
                    Some(admin_listen.to_string()),
                    "a loopback address unless MIRROR_PROXY_ADMIN_TOKEN is set",
                );
            }
        }
        let max_frame_bytes = env.get(&v::MAX_FRAME_BYTES);
        let max_buffered_bytes =
            Self::budget(env, &v::MAX_BUFFERED_BYTES, max_frame_bytes, "a frame");
        let max_buffered_response_bytes = Self::budget(
            env,
            &v::MAX_BUFFERED_RESPONSE_BYTES,
            max_frame_bytes,
            "a response",
        );
        let max_connections = env.get(&v::MAX_CONNECTIONS);
        let worker_threads = env.get(&v::WORKER_THREADS);
        let producer_state_max_entries = env.get(&v::PRODUCER_STATE_MAX_ENTRIES);
        let producer_state_rebuild_bytes = env.get(&v::PRODUCER_STATE_REBUILD_BYTES);
        let connect_timeout_ms = env.get(&v::CONNECT_TIMEOUT_MS);
        let connections_max_idle_ms = env.get(&v::CONNECTIONS_MAX_IDLE_MS);
        let request_read_timeout_ms = env.get(&v::REQUEST_READ_TIMEOUT_MS);
        let response_read_timeout_ms = env.get(&v::RESPONSE_READ_TIMEOUT_MS);
        let buffer_wait_timeout_ms = env.get(&v::BUFFER_WAIT_TIMEOUT_MS);
        let write_timeout_ms = env.get(&v::WRITE_TIMEOUT_MS);
        let tls_handshake_timeout_ms = env.get(&v::TLS_HANDSHAKE_TIMEOUT_MS);
        let shutdown_timeout_ms = env.get(&v::SHUTDOWN_TIMEOUT_MS);
        let producer_expiration_ms = env.get(&v::PRODUCER_EXPIRATION_MS);
        let failover_drain_timeout_ms = env.get(&v::FAILOVER_DRAIN_TIMEOUT_MS);
        let unknown_outcome_wait_ms = env.get(&v::UNKNOWN_OUTCOME_WAIT_MS);
        let instance_session_timeout_ms = env.get(&v::INSTANCE_SESSION_TIMEOUT_MS);
        let read_only_error = env.get(&v::READ_ONLY_ERROR);
        let instance_id = env.get(&v::INSTANCE_ID);
        let state_topic = env.get(&v::STATE_TOPIC);
        let state_key = env.get(&v::STATE_KEY);
        let state_key_unsigned_before = env.get(&v::STATE_KEY_UNSIGNED_BEFORE);
        let log_format = env.get(&v::LOG_FORMAT);
        let client_tls = Self::client_tls(env);
        let sni = Self::sni(env, client_tls.is_some());
        let upstream_tls = upstream_tls(env, &v::UPSTREAM_TLS_VARS);
        let upstream_sasl = upstream_sasl(env, &v::UPSTREAM_SASL_VARS);
        let links = Self::links(env, client_tls.as_ref(), true);
        // A link that mirrored the state topic would let its replicator
        // write the records every instance applies.
        if let Some(state_topic) = &state_topic {
            for link in links.iter().filter(|l| l.mirrors_topic(state_topic)) {
                let name = link_var(v::LINK_TOPICS.name, link.name());
                let value = env.raw(&name);
                env.problem(
                    &name,
                    value,
                    format!("topics that do not include the state topic '{state_topic}'"),
                );
            }
        }

        // Every value the table gives is `Some` unless a problem was
        // recorded for it, so a `?` below returns only beside a problem.
        Some(Config {
            bootstrap_servers: bootstrap_servers?,
            listen: listen?,
            advertised_host: advertised_host?,
            broker_port_base: broker_port_base?,
            sni,
            admin_listen: admin_listen?,
            admin_token,
            max_frame_bytes: max_frame_bytes?,
            max_buffered_bytes: max_buffered_bytes?,
            max_buffered_response_bytes: max_buffered_response_bytes?,
            buffer_wait_timeout_ms: buffer_wait_timeout_ms?,
            write_timeout_ms: write_timeout_ms?,
            max_connections: max_connections?,
            worker_threads,
            connections_max_idle_ms: connections_max_idle_ms?,
            request_read_timeout_ms: request_read_timeout_ms?,
            response_read_timeout_ms: response_read_timeout_ms?,
            tls_handshake_timeout_ms: tls_handshake_timeout_ms?,
            shutdown_timeout_ms: shutdown_timeout_ms?,
            connect_timeout_ms: connect_timeout_ms?,
            log_format: log_format?,
            client_tls,
            upstream_tls,
            upstream_sasl,
            links,
            state_topic: state_topic?,
            producer_expiration_ms: producer_expiration_ms?,
            state_key,
            state_key_unsigned_before: state_key_unsigned_before?,
            producer_state_max_entries: producer_state_max_entries?,
            read_only_error: read_only_error?,
            failover_drain_timeout_ms: failover_drain_timeout_ms?,
            producer_state_rebuild_bytes: producer_state_rebuild_bytes?,
            unknown_outcome_wait_ms: unknown_outcome_wait_ms?,
            instance_id,
            instance_session_timeout_ms: instance_session_timeout_ms?,
        })
    }

    /// ADVERTISED_HOST, else the LISTEN host, which clients cannot reach
    /// when LISTEN binds all interfaces (SNI routing advertises names of
    /// its own).
    fn advertised_host(env: &mut Env<'_>, listen: Option<SocketAddr>) -> Option<String> {
        let set = env.get(&v::ADVERTISED_HOST);
        let sni = env.raw(v::SNI_HOST_PATTERN.name).is_some();
        match (set, listen) {
            (Some(host), _) => Some(host),
            // Set but refused: already a problem.
            (None, _) if env.raw(v::ADVERTISED_HOST.name).is_some() => Some(String::new()),
            (None, Some(listen)) if listen.ip().is_unspecified() && !sni => {
                env.problem(v::ADVERTISED_HOST.name, None, "the host clients reach the proxy at (required because MIRROR_PROXY_LISTEN binds all interfaces)");
                Some(String::new())
            }
            (None, listen) => listen.map(|l| l.ip().to_string()),
        }
    }

    /// A buffer budget. A frame is held whole before it is passed on: a
    /// budget smaller than the largest frame could never read it.
    fn budget(
        env: &mut Env<'_>,
        var: &Var<usize>,
        max_frame_bytes: Option<usize>,
        what: &str,
    ) -> Option<usize> {
        let bytes = env.get(var)?;
        if let Some(frame) = max_frame_bytes.filter(|frame| bytes < *frame) {
            env.problem(
                var.name,
                Some(bytes.to_string()),
                format!("at least MIRROR_PROXY_MAX_FRAME_BYTES ({frame}): {what} larger than the buffer budget could never be read"),
            );
        }
        Some(bytes)
    }

    /// Node ids start at 0, so the node ports are base..=65535: the
    /// bootstrap port must lie below them or node (port - base) would be
    /// served on the bootstrap listener.
    fn broker_port_base(env: &mut Env<'_>, listen: SocketAddr, set: Option<u16>) -> Option<u16> {
        let name = v::BROKER_PORT_BASE.name;
        match set {
            Some(base) if listen.port() != 0 && listen.port() >= base => {
                env.problem(
                    name,
                    Some(base.to_string()),
                    format!(
                        "a port above the MIRROR_PROXY_LISTEN port {}: node {} would be served on the bootstrap port",
                        listen.port(),
                        listen.port() - base
                    ),
                );
                Some(base)
            }
            Some(base) => Some(base),
            // Set but refused: already a problem.
            None if env.raw(name).is_some() => Some(0),
            None => match listen.port().checked_add(1) {
                Some(base) => Some(base),
                None => {
                    env.problem(
                        name,
                        None,
                        "a port for node 0, because the MIRROR_PROXY_LISTEN port 65535 leaves none above it",
                    );
                    Some(0)
                }
            },
        }
    }

    /// Only the mirror links (for the `unmap` subcommand, which needs no
    /// listener or TLS settings).
    pub(crate) fn links_from_env() -> Result<Links, ConfigError> {
        let vars = process_vars(PREFIX)?;
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
        let Some(pattern) = env.get(&v::SNI_HOST_PATTERN) else {
            for name in [v::SNI_BOOTSTRAP_HOST.name, v::SNI_ADVERTISED_PORT.name] {
                if let Some(value) = env.raw(name) {
                    env.problem(name, Some(value), "unset, because MIRROR_PROXY_SNI_HOST_PATTERN is not set (SNI routing is off)");
                }
            }
            return None;
        };
        if !tls && env.raw(v::TLS_CERT.name).is_none() {
            env.problem(
                v::TLS_CERT.name,
                None,
                "a server certificate: SNI routing (MIRROR_PROXY_SNI_HOST_PATTERN) reads the host name from the TLS ClientHello, so it needs TLS on the client listener",
            );
        }
        for name in [v::ADVERTISED_HOST.name, v::BROKER_PORT_BASE.name] {
            if let Some(value) = env.raw(name) {
                env.problem(name, Some(value), "unset with SNI routing: nodes are advertised by MIRROR_PROXY_SNI_HOST_PATTERN on the MIRROR_PROXY_LISTEN port");
            }
        }
        let advertised_port = env.get(&v::SNI_ADVERTISED_PORT);
        let bootstrap = env.required(
            v::SNI_BOOTSTRAP_HOST.name,
            &v::SNI_BOOTSTRAP_HOST,
            "the host name clients bootstrap at (required with MIRROR_PROXY_SNI_HOST_PATTERN)",
        )?;
        match SniNames::new(&pattern, &bootstrap) {
            Ok(names) => Some(SniRouting {
                names,
                advertised_port,
            }),
            Err(e) => {
                let (name, value) = if e.is_bootstrap() {
                    (v::SNI_BOOTSTRAP_HOST.name, bootstrap)
                } else {
                    (v::SNI_HOST_PATTERN.name, pattern)
                };
                let expected = if e.is_bootstrap() {
                    "an SNI bootstrap host name"
                } else {
                    "an SNI host name pattern"
                };
                env.problems.push(ConfigProblem::named(
                    env.prefix,
                    name,
                    Some(value),
                    expected,
                    e,
                ));
                None
            }
        }
    }

    fn client_tls(env: &mut Env<'_>) -> Option<ClientTls> {
        let cert = env.get(&v::TLS_CERT);
        let key = env.get(&v::TLS_KEY);
        let client_ca = env.get(&v::TLS_CLIENT_CA);
        let cert_set = env.raw(v::TLS_CERT.name).is_some();
        let key_set = env.raw(v::TLS_KEY.name).is_some();
        if cert_set != key_set {
            let missing = if cert_set {
                v::TLS_KEY.name
            } else {
                v::TLS_CERT.name
            };
            env.problem(missing, None, "set together with its partner: TLS needs both MIRROR_PROXY_TLS_CERT and MIRROR_PROXY_TLS_KEY");
        }
        if env.raw(v::TLS_CLIENT_CA.name).is_some() && !cert_set {
            env.problem(
                v::TLS_CERT.name,
                None,
                "a server certificate, because MIRROR_PROXY_TLS_CLIENT_CA is set",
            );
        }
        let files = [v::TLS_CERT.name, v::TLS_KEY.name, v::TLS_CLIENT_CA.name]
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

    /// The links of LINKS, each from its `LINK_<NAME>_*` variables.
    fn links(env: &mut Env<'_>, client_tls: Option<&ClientTls>, check_tls: bool) -> Links {
        let Some(raw) = env.get(&v::LINKS) else {
            return Links::default();
        };
        let mut links = Vec::new();
        let mut client_ids: BTreeMap<String, String> = BTreeMap::new();
        for name in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if !name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                env.problem(
                    v::LINKS.name,
                    Some(raw.clone()),
                    format!("link names made of [a-z0-9-]+ (found {name:?})"),
                );
                continue;
            }
            let var = |entry: &str| link_var(entry, name);

            let source_cluster_id = env.required(
                &var(v::LINK_SOURCE_CLUSTER_ID.name),
                &v::LINK_SOURCE_CLUSTER_ID,
                "the source cluster id: 22 characters of URL-safe base64 encoding 16 bytes",
            );
            let client_id = env.get_filled(
                &var(v::LINK_CLIENT_ID.name),
                &v::LINK_CLIENT_ID,
                &[("<name>", name)],
            );
            if let Some(other) = client_ids.insert(client_id.clone(), name.to_string()) {
                env.problem(
                    &var(v::LINK_CLIENT_ID.name),
                    Some(client_id.clone()),
                    format!("a client id no other link uses (link {other:?} has it)"),
                );
            }
            let topics = env.required(
                &var(v::LINK_TOPICS.name),
                &v::LINK_TOPICS,
                "comma-separated topic names or regular expressions",
            );
            let tls_subject = env.get_named(&var(v::LINK_TLS_SUBJECT.name), &v::LINK_TLS_SUBJECT);
            if check_tls
                && tls_subject.is_some()
                && client_tls.and_then(|t| t.client_ca.as_ref()).is_none()
            {
                env.problem(&var(v::LINK_TLS_SUBJECT.name), tls_subject.clone(), "client TLS with client certificates: set MIRROR_PROXY_TLS_CERT, MIRROR_PROXY_TLS_KEY and MIRROR_PROXY_TLS_CLIENT_CA");
            }
            let control_batches =
                env.get_named(&var(v::LINK_CONTROL_BATCHES.name), &v::LINK_CONTROL_BATCHES);
            let initial_state =
                env.get_named(&var(v::LINK_INITIAL_STATE.name), &v::LINK_INITIAL_STATE);
            let failback = match (
                env.get_named(&var(v::LINK_REVERSE_OF.name), &v::LINK_REVERSE_OF),
                env.get_named(
                    &var(v::LINK_SOURCE_BOOTSTRAP_SERVERS.name),
                    &v::LINK_SOURCE_BOOTSTRAP_SERVERS,
                ),
            ) {
                (Some(reverse_of), Some(source_bootstrap_servers)) => {
                    Some(crate::mirror::link::Failback {
                        reverse_of,
                        source_bootstrap_servers,
                    })
                }
                (None, None) => None,
                (Some(_), None) | (None, Some(_)) => {
                    let value = env
                        .raw(&var(v::LINK_REVERSE_OF.name))
                        .or_else(|| env.raw(&var(v::LINK_SOURCE_BOOTSTRAP_SERVERS.name)));
                    env.problem(
                        &var(v::LINK_REVERSE_OF.name),
                        value,
                        "both LINK_<NAME>_REVERSE_OF and LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS, or neither",
                    );
                    None
                }
            };
            if let (
                Some((source_cluster_id, source_cluster_spelling)),
                Some(topics),
                Some(control_batches),
                Some(initial_state),
            ) = (source_cluster_id, topics, control_batches, initial_state)
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

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::mirror::link::ControlBatchPolicy;
    use crate::mirror::link_state::LinkState;
    use crate::wire::sasl::Mechanism;
    use std::collections::BTreeSet;
    use table::docs::{documented, drift, render, Column};

    fn vars(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        crate::config::table::prefixed(PREFIX, pairs)
    }

    fn problems(pairs: &[(&str, &str)]) -> Vec<ConfigProblem> {
        match Config::from_vars(&vars(pairs)) {
            Ok(_) => Vec::new(),
            Err(e) => e.0,
        }
    }

    /// Each named field of `c` holds its variable's default.
    macro_rules! assert_defaults {
        ($c:expr, $($field:ident: $var:ident),+ $(,)?) => {
            $(assert_eq!($c.$field, default(&v::$var), stringify!($field));)+
        };
    }

    /// A variable's default, read from the table as `from_vars` reads it.
    fn default<T>(var: &Var<T>) -> T {
        match (var.parse)(var.default.text()) {
            Ok(value) => value,
            Err(e) => panic!("{}'s default: {e:?}", var.name),
        }
    }

    fn problem_for<'a>(p: &'a [ConfigProblem], var: &str) -> Option<&'a ConfigProblem> {
        p.iter().find(|p| p.variable == format!("{PREFIX}{var}"))
    }

    /// The startup log line shows every setting and no secret.
    #[test]
    fn debug_shows_every_setting_but_no_secret() {
        // The variables whose values are secrets; the table's meanings say
        // which are never logged, and each of those must be here.
        let secrets = [
            ("ADMIN_TOKEN", "admin-token-secret-value"),
            ("STATE_KEY", "state-key-secret-value-of-32-bytes-or-more"),
            ("UPSTREAM_SASL_PASSWORD", "sasl-password-secret-value"),
        ];
        for (name, _, meaning) in VARIABLES {
            if meaning.to_ascii_lowercase().contains("never logged") {
                assert!(
                    secrets.iter().any(|(secret, _)| secret == name),
                    "{name} is never logged, so this test must set it"
                );
            }
        }
        let mut set = vec![
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:9092"),
            ("UPSTREAM_SASL_MECHANISM", "PLAIN"),
            ("UPSTREAM_SASL_USERNAME", "proxy"),
            ("CONNECT_TIMEOUT_MS", "4321"),
            ("LOG_FORMAT", "json"),
            ("LINKS", "east"),
            ("LINK_EAST_SOURCE_CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qg"),
            ("LINK_EAST_TOPICS", "orders"),
        ];
        set.extend(secrets);
        let c = Config::from_vars(&vars(&set)).expect("valid");
        let shown = format!("{c:?}");
        for (name, secret) in secrets {
            assert!(!shown.contains(secret), "{name} shown: {shown}");
        }
        for setting in [
            "connect_timeout_ms: 4321",
            "log_format: Json",
            "admin_token: Some(Secret(..))",
            "state_key: Some(StateKey(..))",
            "links: [\"east\"]",
        ] {
            assert!(shown.contains(setting), "{setting} missing: {shown}");
        }
        // Every field of the struct, read from its declaration here.
        crate::config::table::docs::assert_shows_every_field(
            &shown,
            include_str!("config.rs"),
            "Config",
        );
    }

    #[test]
    fn a_refused_value_keeps_its_cause() {
        let p = problems(&[
            ("BOOTSTRAP_SERVERS", "b:9092"),
            ("LISTEN", "127.0.0.1:9092"),
            ("MAX_CONNECTIONS", "many"),
            ("MAX_FRAME_BYTES", "0"),
        ]);
        let many = problem_for(&p, "MAX_CONNECTIONS").expect("MAX_CONNECTIONS named");
        let cause = many.source().expect("the parse error");
        assert!(
            cause.downcast_ref::<std::num::ParseIntError>().is_some(),
            "{cause:?}"
        );
        assert_eq!(
            many.to_string(),
            format!("MIRROR_PROXY_MAX_CONNECTIONS=\"many\": expected a whole number of connections greater than 0 ({cause})")
        );
        // A number out of range has no cause beyond the expectation.
        let zero = problem_for(&p, "MAX_FRAME_BYTES").expect("MAX_FRAME_BYTES named");
        assert!(zero.source().is_none());
        assert_eq!(
            zero.to_string(),
            "MIRROR_PROXY_MAX_FRAME_BYTES=\"0\": expected a whole number of bytes from 1024 to 2147483647"
        );
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
        assert_defaults!(
            c,
            admin_listen: ADMIN_LISTEN,
            max_frame_bytes: MAX_FRAME_BYTES,
            max_buffered_bytes: MAX_BUFFERED_BYTES,
            max_buffered_response_bytes: MAX_BUFFERED_RESPONSE_BYTES,
            buffer_wait_timeout_ms: BUFFER_WAIT_TIMEOUT_MS,
            write_timeout_ms: WRITE_TIMEOUT_MS,
            max_connections: MAX_CONNECTIONS,
            connections_max_idle_ms: CONNECTIONS_MAX_IDLE_MS,
            request_read_timeout_ms: REQUEST_READ_TIMEOUT_MS,
            response_read_timeout_ms: RESPONSE_READ_TIMEOUT_MS,
            tls_handshake_timeout_ms: TLS_HANDSHAKE_TIMEOUT_MS,
            shutdown_timeout_ms: SHUTDOWN_TIMEOUT_MS,
            log_format: LOG_FORMAT,
            connect_timeout_ms: CONNECT_TIMEOUT_MS,
        );
        assert!(
            c.buffer_wait_timeout_ms > c.write_timeout_ms,
            "stuck writers must be closed before the frames waiting for their memory"
        );
        assert_eq!(c.worker_threads, None);
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
        assert_eq!(east.control_batches(), default(&v::LINK_CONTROL_BATCHES));
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

    #[test]
    fn the_documented_tables_are_the_table() {
        // docs/configuration.md's full table and the README's short one:
        // every row exactly as the table renders it, in its order.
        let rows = variables::rows();
        for (doc, text, column) in [
            (
                "docs/configuration.md",
                include_str!("../docs/configuration.md"),
                Column::Meaning,
            ),
            ("README.md", include_str!("../README.md"), Column::Summary),
        ] {
            let rendered = render(PREFIX, &rows, column);
            let drift = drift(&documented(text), &rendered);
            assert!(
                drift.is_empty(),
                "{doc}'s configuration table differs from config::VARIABLES:\n{}\n\nthe table renders as:\n{}",
                drift.join("\n"),
                rendered.join("\n")
            );
        }
    }

    #[test]
    fn a_drifted_table_is_reported() {
        let rendered = render(PREFIX, &variables::rows(), Column::Meaning);
        let doc = |lines: &[String]| {
            format!(
                "intro\n\n| variable | default | meaning |\n|---|---|---|\n{}\n\nafter | the table\n",
                lines.join("\n")
            )
        };
        assert_eq!(
            drift(&documented(&doc(&rendered)), &rendered),
            Vec::<String>::new()
        );
        // A default changed to a value found elsewhere in the table, a
        // meaning shortened, the last row dropped.
        let mut drifted = rendered.clone();
        drifted[1] = drifted[1].replace("`0.0.0.0:9092`", "`0`");
        drifted[2] = drifted[2].replace("every broker;", "every broker.");
        drifted.pop();
        let found = drift(&documented(&doc(&drifted)), &rendered);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(
            found[0].starts_with("row 2 (MIRROR_PROXY_LISTEN)"),
            "{found:?}"
        );
        assert!(
            found[1].starts_with("row 3 (MIRROR_PROXY_ADVERTISED_HOST)"),
            "{found:?}"
        );
        assert!(
            found[2].contains("no row for MIRROR_PROXY_LINK_<NAME>_CONTROL_BATCHES"),
            "{found:?}"
        );
    }

    #[test]
    fn every_default_is_a_value_its_parser_reads() {
        for row in variables::rows() {
            assert!(
                row.default_parses,
                "{}'s default {:?}",
                row.name, row.default
            );
        }
    }

    #[test]
    fn every_variable_read_is_in_the_table_and_every_entry_is_read() {
        let table: BTreeSet<String> = VARIABLES.iter().map(|(n, _, _)| n.to_string()).collect();
        let mut read = BTreeSet::new();
        // Plain, and with a link and SNI routing (whose variables only
        // then are read).
        for set in [
            vec![("BOOTSTRAP_SERVERS", "b:9092")],
            vec![
                ("BOOTSTRAP_SERVERS", "b:9092"),
                ("SNI_HOST_PATTERN", "broker-$(nodeId).example.com"),
                ("LINKS", "east-1"),
            ],
        ] {
            let vars = vars(&set);
            let mut env = Env::new(PREFIX, &vars);
            let _ = Config::read(&mut env);
            read.extend(
                env.read
                    .take()
                    .into_iter()
                    .map(|n| n.replace("LINK_EAST_1_", "LINK_<NAME>_")),
            );
        }
        assert_eq!(read, table);
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
        assert_defaults!(
            c,
            read_only_error: READ_ONLY_ERROR,
            failover_drain_timeout_ms: FAILOVER_DRAIN_TIMEOUT_MS,
            unknown_outcome_wait_ms: UNKNOWN_OUTCOME_WAIT_MS,
        );
        let east = c.links.iter().next().expect("one link");
        assert_eq!(east.initial_state(), default(&v::LINK_INITIAL_STATE));

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
        assert_eq!(c.state_topic, DEFAULT_STATE_TOPIC);
        assert_defaults!(
            c,
            producer_expiration_ms: PRODUCER_EXPIRATION_MS,
            producer_state_max_entries: PRODUCER_STATE_MAX_ENTRIES,
            producer_state_rebuild_bytes: PRODUCER_STATE_REBUILD_BYTES,
        );
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
        assert_eq!(
            c.state_key_unsigned_before,
            default(&v::STATE_KEY_UNSIGNED_BEFORE)
        );
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
        assert_eq!(
            c.instance_session_timeout_ms,
            default(&v::INSTANCE_SESSION_TIMEOUT_MS)
        );
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
