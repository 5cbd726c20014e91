//! The proxy's I/O: listeners, the node registry that maps broker node ids
//! to proxy ports, and the state every connection shares.
//!
//! One bootstrap listener forwards to any of the configured brokers; one
//! listener per broker node forwards to that node. A node's listener is
//! opened the first time a response names the node, before that response
//! reaches the client.
//!
//! With SNI routing (`MIRROR_PROXY_SNI_HOST_PATTERN`) there is only the one
//! TLS listener: each connection's ClientHello names the bootstrap or a
//! node (`Shared::sni_target`), and a name that routes nowhere, or to a
//! broker that is unreachable, is refused during the handshake.
//!
//! Listeners enforce `MAX_CONNECTIONS`; `Proxy::shutdown` stops them and
//! waits for the connections to deliver what they owe. A listener is closed
//! while the proxy cannot reach its broker (see `health`).

pub(crate) mod queue;
pub(crate) mod session;
pub(crate) mod watch_wait;

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::config::{Config, SniRoute};
use crate::filter::addresses::{self, Advertised, Learnt};
use crate::filter::{Context, TopicTable};
use crate::metrics::Metrics;
use crate::net::frame::Budget;
use crate::net::health::{self, Health};
use crate::net::tasks::Tasks;
use crate::net::upstream::Upstream;
use crate::state::StateStore;
use crate::sync::error_chain;

/// Why the proxy could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("binding {what} listener on {addr}: {source}")]
    Bind {
        what: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] crate::net::tls::TlsSetupError),
    #[error(transparent)]
    NodePort(#[from] addresses::RewriteError),
    #[error("SNI routing (MIRROR_PROXY_SNI_HOST_PATTERN) needs TLS on the client listener: set MIRROR_PROXY_TLS_CERT and MIRROR_PROXY_TLS_KEY")]
    SniWithoutTls,
    #[error("broker node id {node} would be served at port {port}, which {taken_by} already uses: set MIRROR_PROXY_BROKER_PORT_BASE so that base + {node} is a free port")]
    NodePortTaken {
        node: i32,
        port: u16,
        taken_by: &'static str,
    },
}

/// Why a connection to the SNI listener was refused during its handshake
/// (the client got a TLS `access_denied` alert).
#[derive(Debug, thiserror::Error)]
pub(crate) enum SniRefusal {
    #[error("the ClientHello names no server (SNI): with SNI routing clients must connect by host name, not IP address")]
    NoName,
    #[error("server name {0:?} is neither MIRROR_PROXY_SNI_BOOTSTRAP_HOST nor a node name of MIRROR_PROXY_SNI_HOST_PATTERN")]
    UnknownName(String),
    #[error("server name {name:?} is broker node {node}, which no response has named yet")]
    UnknownNode { name: String, node: i32 },
    #[error("the broker behind {0} is unreachable (its name is refused until it answers again)")]
    BrokerDown(String),
}

impl SniRefusal {
    /// Every reason a connection to the SNI listener is refused for: the
    /// labels of [`label`](Self::label) and the handshake's failures.
    pub(crate) const LABELS: [&'static str; 6] = [
        "sni_missing",
        "sni_unknown_name",
        "sni_unknown_node",
        "broker_unreachable",
        "tls_handshake",
        "tls_handshake_timeout",
    ];

    /// Metric label (`connections_refused_total{reason}`).
    pub(crate) fn label(&self) -> &'static str {
        match self {
            SniRefusal::NoName => "sni_missing",
            SniRefusal::UnknownName(_) => "sni_unknown_name",
            SniRefusal::UnknownNode { .. } => "sni_unknown_node",
            SniRefusal::BrokerDown(_) => "broker_unreachable",
        }
    }
}

/// Which broker a listener stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// Any configured bootstrap broker.
    Bootstrap,
    /// Broker node `n`.
    Node(i32),
}

impl Target {
    pub(crate) fn label(self) -> String {
        match self {
            Target::Bootstrap => "bootstrap".to_string(),
            Target::Node(n) => format!("node-{n}"),
        }
    }
}

impl From<Target> for crate::metrics::Listener {
    fn from(target: Target) -> Self {
        match target {
            Target::Bootstrap => crate::metrics::Listener::Bootstrap,
            Target::Node(n) => crate::metrics::Listener::Node(n),
        }
    }
}

#[derive(Debug)]
struct NodeEntry {
    /// The broker's real address, as its own responses name it.
    address: String,
    listening: bool,
    health: Arc<Health>,
}

/// State shared by every listener and connection.
pub(crate) struct Shared {
    pub config: Config,
    /// What the filters of every connection see.
    pub ctx: Context,
    pub upstream: Upstream,
    /// Reloaded when its files change (see `crate::net::tls`).
    pub acceptor: Option<crate::net::tls::ServerTls>,
    /// Memory for client request frames, shared by every connection.
    pub budget: Arc<Budget>,
    /// Memory for broker response frames, shared by every connection.
    pub response_budget: Arc<Budget>,
    listen_ip: IpAddr,
    nodes: Mutex<HashMap<i32, NodeEntry>>,
    /// Whether any bootstrap broker is reachable.
    bootstrap_health: Arc<Health>,
    /// This instance's membership of the instances' group
    /// (`control::members`); `None` without mirror links (no state topic).
    #[allow(dead_code)] // held, not read: the membership lasts as long as the proxy
    pub members: Option<Arc<crate::control::members::Members>>,
    /// Background tasks (broker probes, listeners), stopped and joined at
    /// shutdown after the connections.
    pub tasks: Tasks,
    /// Client connections open now.
    connections: watch::Sender<usize>,
    shutdown: watch::Sender<bool>,
    refusals: Mutex<RefusalLog>,
}

/// Refused connections since the last WARN line about them.
#[derive(Default)]
struct RefusalLog {
    last_warned: Option<Instant>,
    unreported: u64,
}

/// At most one WARN line per this long about refused connections, so a
/// connection flood does not become a log flood.
const REFUSAL_WARN_INTERVAL: Duration = Duration::from_secs(10);

/// One client connection's place under `MAX_CONNECTIONS`, given back on drop.
struct ConnectionSlot(Arc<Shared>);

impl ConnectionSlot {
    fn take(shared: &Arc<Shared>) -> Option<ConnectionSlot> {
        let max = shared.config.max_connections;
        shared
            .connections
            .send_if_modified(|n| {
                let room = *n < max;
                if room {
                    *n += 1;
                }
                room
            })
            .then(|| ConnectionSlot(Arc::clone(shared)))
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connections.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// Which of the proxy's own ports `port` is, if any: a node listener there
/// could not bind, or would steal the port from the bootstrap or admin
/// listener.
fn own_port(config: &Config, port: u16) -> Option<&'static str> {
    if port == config.listen.port() {
        Some("the bootstrap listener (MIRROR_PROXY_LISTEN)")
    } else if port == config.admin_listen.port() {
        Some("the admin endpoint (MIRROR_PROXY_ADMIN_LISTEN)")
    } else {
        None
    }
}

impl Shared {
    /// The largest request a connection may read while the broker still
    /// holds one of its requests (and so reads nothing more from it): its
    /// share of `MAX_BUFFERED_BYTES` when every allowed connection is open.
    /// However many connections wait on their broker, together they cannot
    /// hold the whole budget; a larger frame waits, holding nothing, until
    /// the broker has answered.
    pub(crate) fn parked_share(&self) -> usize {
        self.budget.total() / self.config.max_connections.max(1)
    }

    /// The real address of broker `node`, once a response has named it.
    pub(crate) fn node_address(&self, node: i32) -> Option<String> {
        self.nodes
            .lock()
            .ok()?
            .get(&node)
            .map(|e| e.address.clone())
    }

    /// Reachability of the broker(s) behind `target`.
    pub(crate) fn health(&self, target: Target) -> Option<Arc<Health>> {
        match target {
            Target::Bootstrap => Some(Arc::clone(&self.bootstrap_health)),
            Target::Node(n) => self
                .nodes
                .lock()
                .ok()?
                .get(&n)
                .map(|e| Arc::clone(&e.health)),
        }
    }

    /// Where an SNI-routed connection goes: the node (or bootstrap) its
    /// ClientHello names, if that broker is known and reachable. Refused
    /// otherwise, as the node's own port would be in port-per-node mode.
    pub(crate) fn sni_target(&self, name: Option<&str>) -> Result<Target, SniRefusal> {
        let Some(names) = self.ctx.advertised.sni.as_ref().map(|(names, _)| names) else {
            return Err(SniRefusal::NoName);
        };
        let name = name.ok_or(SniRefusal::NoName)?;
        let target = match names.route(name) {
            None => return Err(SniRefusal::UnknownName(name.to_string())),
            Some(SniRoute::Bootstrap) => Target::Bootstrap,
            Some(SniRoute::Node(node)) => {
                if self.node_address(node).is_none() {
                    return Err(SniRefusal::UnknownNode {
                        name: name.to_string(),
                        node,
                    });
                }
                Target::Node(node)
            }
        };
        if self.health(target).is_some_and(|h| !h.is_up()) {
            return Err(SniRefusal::BrokerDown(target.label()));
        }
        Ok(target)
    }

    /// The broker addresses behind `target`.
    fn target_addresses(&self, target: Target) -> Vec<String> {
        match target {
            Target::Bootstrap => self.config.bootstrap_servers.clone(),
            Target::Node(n) => self.node_address(n).into_iter().collect(),
        }
    }

    /// A connect to `target`'s broker failed: its port closes until a probe
    /// reaches the broker again.
    pub(crate) fn upstream_unreachable(
        self: &Arc<Self>,
        target: Target,
        error: &dyn std::error::Error,
    ) {
        let Some(health) = self.health(target) else {
            return;
        };
        if health.mark_down() {
            tracing::warn!(listener = %target.label(), error = %error_chain(error), "broker unreachable: closing its proxy port until it answers again");
            self.ctx.metrics.broker_down(target.into());
        }
        self.spawn_probe(target, health, false);
    }

    /// An upstream connection to `target` ended unexpectedly: check at once
    /// whether the broker is still there, so the next client is refused
    /// rather than accepted and dropped. A dying broker may still accept
    /// for a moment: it must keep answering for a short while
    /// ([`health::confirmed_reachable`]) to count as there.
    pub(crate) fn upstream_lost(self: &Arc<Self>, target: Target) {
        if let Some(health) = self.health(target) {
            self.spawn_probe(target, health, true);
        }
    }

    /// One probe task per target: checks now, then with backoff while the
    /// broker stays unreachable; reopens the port when it answers.
    /// `after_loss`: the first check is [`health::confirmed_reachable`].
    fn spawn_probe(self: &Arc<Self>, target: Target, health: Arc<Health>, after_loss: bool) {
        if !health.start_probing() {
            return;
        }
        let shared = Arc::clone(self);
        self.tasks.spawn(async move {
            let timeout = shared.upstream.timeout;
            let mut backoff = health::probe_backoff();
            let mut confirm = after_loss;
            loop {
                let addrs = shared.target_addresses(target);
                let reachable = if std::mem::take(&mut confirm) {
                    health::confirmed_reachable(&addrs, timeout).await
                } else {
                    health::reachable(&addrs, timeout).await
                };
                if reachable {
                    if health.mark_up() {
                        tracing::info!(listener = %target.label(), "broker reachable again: reopening its proxy port");
                        shared.ctx.metrics.broker_up(target.into());
                    }
                    health.stop_probing();
                    // A failure reported while this task was finishing
                    // found the flag still set: take it over.
                    if health.is_up() || !health.start_probing() {
                        return;
                    }
                } else if health.mark_down() {
                    tracing::warn!(listener = %target.label(), "broker unreachable: closing its proxy port until it answers again");
                    shared.ctx.metrics.broker_down(target.into());
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_delay()) => {}
                    _ = shared.shutting_down() => {
                        health.stop_probing();
                        return;
                    }
                }
            }
        });
    }

    /// Resolves once shutdown has begun (at once if it already has).
    pub(crate) async fn shutting_down(&self) {
        self.ctx.shutting_down().await
    }

    /// [`Shared::shutting_down`], for a loop that polls it with every frame.
    pub(crate) fn shutdown_wait(
        &self,
    ) -> watch_wait::WatchWait<bool, impl Future<Output = ()> + '_> {
        watch_wait::WatchWait::new(self.shutdown.subscribe(), self.shutting_down())
    }

    /// Client connections open now.
    pub(crate) fn open_connections(&self) -> usize {
        *self.connections.borrow()
    }

    fn refuse(&self, peer: SocketAddr, target: Target) {
        self.ctx
            .metrics
            .connection_refused(target.into(), "max_connections");
        let mut log = crate::sync::lock(&self.refusals);
        log.unreported += 1;
        if log
            .last_warned
            .is_none_or(|t| t.elapsed() >= REFUSAL_WARN_INTERVAL)
        {
            tracing::warn!(
                %peer,
                listener = %target.label(),
                refused = log.unreported,
                max = self.config.max_connections,
                "refused client connection(s): MIRROR_PROXY_MAX_CONNECTIONS reached (at most one such line per 10 s)"
            );
            log.last_warned = Some(Instant::now());
            log.unreported = 0;
        }
    }

    /// Record what a response taught us and make sure every broker it named
    /// has a listener before the client hears of it.
    pub(crate) fn learn(self: &Arc<Self>, learnt: Learnt) -> Result<(), StartError> {
        self.ctx.topics.learn(learnt.topics);
        for (node, host, port) in learnt.brokers {
            let address = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            self.ensure_listener(node, address)?;
        }
        Ok(())
    }

    fn ensure_listener(self: &Arc<Self>, node: i32, address: String) -> Result<(), StartError> {
        let mut nodes = crate::sync::lock(&self.nodes);
        let entry = nodes.entry(node).or_insert_with(|| {
            self.ctx.metrics.listener_known(Target::Node(node).into());
            NodeEntry {
                address: address.clone(),
                listening: false,
                health: Health::new(),
            }
        });
        if entry.address != address {
            tracing::info!(node, old = %entry.address, new = %address, "broker address changed");
            entry.address = address;
        }
        // With SNI routing the node is reached through the one listener.
        if entry.listening || self.ctx.advertised.sni.is_some() {
            return Ok(());
        }
        let port = self.ctx.advertised.port(node)?;
        if let Some(taken_by) = own_port(&self.config, port) {
            return Err(StartError::NodePortTaken {
                node,
                port,
                taken_by,
            });
        }
        let addr = SocketAddr::new(self.listen_ip, port);
        let listener = bind_std(addr).map_err(|source| StartError::Bind {
            what: Target::Node(node).label(),
            addr,
            source,
        })?;
        tracing::info!(node, %addr, broker = %entry.address, "listening for broker node");
        entry.listening = true;
        let health = Arc::clone(&entry.health);
        spawn_accept_loop(Arc::clone(self), listener, addr, Target::Node(node), health);
        Ok(())
    }
}

fn bind_std(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::bind(addr)?;
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

/// Accepts on `listener` while the target's broker is reachable; closes the
/// port while it is not and binds `addr` again when it is back.
fn spawn_accept_loop(
    shared: Arc<Shared>,
    mut listener: TcpListener,
    addr: SocketAddr,
    target: Target,
    health: Arc<Health>,
) {
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        loop {
            // Dropping the listener closes it: new clients are refused by
            // the kernel, at shutdown while connections drain, and while
            // the broker is down.
            tokio::select! {
                biased;
                _ = shared.shutting_down() => break,
                _ = health.down() => {}
                _ = accept_while_open(&shared, &listener, Some(target)) => {}
            }
            drop(listener);
            tracing::info!(listener = %target.label(), %addr, "port closed while its broker is unreachable");
            tokio::select! {
                _ = shared.shutting_down() => break,
                _ = health.up() => {}
            }
            listener = loop {
                match bind_std(addr) {
                    Ok(l) => break l,
                    Err(e) => {
                        tracing::warn!(listener = %target.label(), %addr, error = %error_chain(&e), "cannot reopen the port for a reachable broker; retrying in 1 s");
                        tokio::select! {
                            _ = shared.shutting_down() => return,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                        }
                    }
                }
            };
            tracing::info!(listener = %target.label(), %addr, "port open again");
        }
        tracing::debug!(listener = %target.label(), "stopped accepting");
    });
}

/// The SNI listener: one port for every broker, open until shutdown (a
/// broker that is down is refused by name, in [`Shared::sni_target`]).
fn spawn_sni_accept_loop(shared: Arc<Shared>, listener: TcpListener) {
    let tasks = shared.tasks.clone();
    tasks.spawn(async move {
        tokio::select! {
            _ = shared.shutting_down() => {}
            _ = accept_while_open(&shared, &listener, None) => {}
        }
        tracing::debug!(listener = "sni", "stopped accepting");
    });
}

/// Accepts connections until the task is cancelled; `target` `None`: the
/// SNI listener, whose connections are routed by their ClientHello.
async fn accept_while_open(shared: &Arc<Shared>, listener: &TcpListener, target: Option<Target>) {
    loop {
        match listener.accept().await {
            Ok((tcp, peer)) => {
                let Some(slot) = ConnectionSlot::take(shared) else {
                    shared.refuse(peer, target.unwrap_or(Target::Bootstrap));
                    drop(tcp);
                    continue;
                };
                let _ = tcp.set_nodelay(true);
                let shared = Arc::clone(shared);
                // One task type per mode: an SNI connection's handshake
                // state must not size every port-mode connection's task.
                match target {
                    Some(target) => tokio::spawn(async move {
                        session::serve(shared, tcp, peer, target).await;
                        drop(slot);
                    }),
                    None => tokio::spawn(async move {
                        session::serve_sni(shared, tcp, peer).await;
                        drop(slot);
                    }),
                };
            }
            Err(e) => {
                // Usually out of file descriptors: back off instead of spinning.
                let listener = target.map_or_else(|| "sni".to_string(), Target::label);
                tracing::warn!(%listener, error = %error_chain(&e), "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A running proxy.
pub(crate) struct Proxy {
    pub shared: Arc<Shared>,
    pub bootstrap_addr: SocketAddr,
}

impl Proxy {
    /// Bind the bootstrap listener and start accepting. `state` is the
    /// state store (started by the caller), required for mirror links;
    /// `members` the instance's group membership (started by the caller).
    pub(crate) async fn start(
        config: Config,
        metrics: Arc<Metrics>,
        state: Option<Arc<StateStore>>,
        members: Option<Arc<crate::control::members::Members>>,
        tasks: Tasks,
    ) -> Result<Proxy, StartError> {
        let acceptor = config
            .client_tls
            .as_ref()
            .map(crate::net::tls::ServerTls::new)
            .transpose()?;
        if config.sni.is_some() && acceptor.is_none() {
            return Err(StartError::SniWithoutTls);
        }
        let upstream = Upstream::from_config(&config)?;
        let listener = bind_std(config.listen).map_err(|source| StartError::Bind {
            what: "bootstrap".into(),
            addr: config.listen,
            source,
        })?;
        let bootstrap_addr = listener.local_addr().map_err(|source| StartError::Bind {
            what: "bootstrap".into(),
            addr: config.listen,
            source,
        })?;
        let buffer_wait = Duration::from_millis(config.buffer_wait_timeout_ms);
        let budget = Budget::new(
            config.max_buffered_bytes,
            buffer_wait,
            "MIRROR_PROXY_MAX_BUFFERED_BYTES",
            metrics.buffered_request_bytes(),
        );
        let response_budget = Budget::new(
            config.max_buffered_response_bytes,
            buffer_wait,
            "MIRROR_PROXY_MAX_BUFFERED_RESPONSE_BYTES",
            metrics.buffered_response_bytes(),
        );
        let dedupe = crate::mirror::dedupe::Dedupe::new(
            config.producer_state_max_entries,
            config.producer_state_rebuild_bytes,
            Duration::from_millis(config.unknown_outcome_wait_ms),
            Arc::clone(&metrics),
        );
        if let Some(state) = &state {
            state.expire_with(Arc::clone(&dedupe));
        }
        let control = crate::control::Control::new(
            config.links.clone(),
            state.clone(),
            members.clone(),
            Arc::clone(&metrics),
            config.read_only_error,
            Duration::from_millis(config.failover_drain_timeout_ms),
            tasks.clone(),
        );
        let shutdown = watch::Sender::new(false);
        let ctx = Context {
            links: config.links.clone(),
            metrics,
            control,
            dedupe,
            state,
            advertised: Advertised {
                host: config.advertised_host.clone(),
                port_base: config.broker_port_base,
                sni: config.sni.as_ref().map(|sni| {
                    let port = sni.advertised_port.unwrap_or(bootstrap_addr.port());
                    (sni.names.clone(), port)
                }),
            },
            topics: TopicTable::default(),
            shutdown: shutdown.subscribe(),
        };
        let shared = Arc::new(Shared {
            budget,
            response_budget,
            ctx,
            connections: watch::Sender::new(0),
            shutdown,
            refusals: Mutex::new(RefusalLog::default()),
            listen_ip: config.listen.ip(),
            config,
            upstream,
            acceptor,
            nodes: Mutex::new(HashMap::new()),
            bootstrap_health: Health::new(),
            members,
            tasks,
        });
        shared.ctx.control.start();
        shared.ctx.metrics.close_reasons(session::CLOSE_REASONS);
        shared.ctx.metrics.partition_refusal_reasons(
            crate::mirror::produce::Refusal::ALL
                .iter()
                .map(|r| r.label()),
        );
        if let Some((names, port)) = &shared.ctx.advertised.sni {
            shared
                .ctx
                .metrics
                .refusal_reasons(crate::metrics::Listener::Bootstrap, SniRefusal::LABELS);
            tracing::info!(addr = %bootstrap_addr, bootstrap = names.bootstrap_host(), node0 = %names.node_host(0), advertised_port = port, "SNI routing: one TLS listener for the bootstrap and every broker node");
            spawn_sni_accept_loop(Arc::clone(&shared), listener);
        } else {
            let health = Arc::clone(&shared.bootstrap_health);
            spawn_accept_loop(
                Arc::clone(&shared),
                listener,
                bootstrap_addr,
                Target::Bootstrap,
                health,
            );
        }
        Ok(Proxy {
            shared,
            bootstrap_addr,
        })
    }

    /// Stop accepting connections and reading requests, and wait up to
    /// `timeout` for every connection to deliver the responses it owes and
    /// close. Returns how many connections were still open at the timeout.
    pub(crate) async fn shutdown(&self, timeout: Duration) -> usize {
        self.shared.shutdown.send_replace(true);
        let mut open = self.shared.connections.subscribe();
        let drained = tokio::time::timeout(timeout, open.wait_for(|n| *n == 0)).await;
        match drained {
            Ok(_) => 0,
            Err(_) => self.shared.open_connections(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap as Vars;

    #[test]
    fn node_ports_may_not_take_the_proxys_own_ports() {
        let vars: Vars<String, String> = [
            ("MIRROR_PROXY_BOOTSTRAP_SERVERS", "b:9092"),
            ("MIRROR_PROXY_LISTEN", "127.0.0.1:9092"),
            ("MIRROR_PROXY_ADMIN_LISTEN", "127.0.0.1:9190"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let config = Config::from_vars(&vars).expect("valid");
        // Default base 9093: node 97 lands on the admin port.
        assert_eq!(config.broker_port_base, 9093);
        assert!(own_port(&config, 9093 + 97).is_some_and(|w| w.contains("ADMIN_LISTEN")));
        assert!(own_port(&config, 9092).is_some_and(|w| w.contains("MIRROR_PROXY_LISTEN")));
        assert_eq!(own_port(&config, 9093), None);
        let e = StartError::NodePortTaken {
            node: 97,
            port: 9190,
            taken_by: "the admin endpoint (MIRROR_PROXY_ADMIN_LISTEN)",
        };
        let text = e.to_string();
        assert!(
            text.contains("node id 97") && text.contains("MIRROR_PROXY_BROKER_PORT_BASE"),
            "{text}"
        );
    }
}
