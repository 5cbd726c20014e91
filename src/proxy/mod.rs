//! The proxy's I/O: listeners, the node registry that maps broker node ids
//! to proxy ports, and the state every connection shares.
//!
//! One bootstrap listener forwards to any of the configured brokers; one
//! listener per broker node forwards to that node. A node's listener is
//! opened the first time a response names the node, before that response
//! reaches the client.

pub mod addresses;
pub mod session;
pub mod tls;
pub mod upstream;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use uuid::Uuid;

use crate::config::Config;
use crate::metrics::{labels, Metrics};
use addresses::{Advertised, Learnt};
use upstream::Upstream;

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
    Tls(#[from] tls::TlsSetupError),
    #[error(transparent)]
    NodePort(#[from] addresses::RewriteError),
    #[error("broker node id {node} would be served at port {port}, which {taken_by} already uses: set MIRROR_PROXY_BROKER_PORT_BASE so that base + {node} is a free port")]
    NodePortTaken {
        node: i32,
        port: u16,
        taken_by: &'static str,
    },
}

/// Which broker a listener stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Any configured bootstrap broker.
    Bootstrap,
    /// Broker node `n`.
    Node(i32),
}

impl Target {
    pub fn label(self) -> String {
        match self {
            Target::Bootstrap => "bootstrap".to_string(),
            Target::Node(n) => format!("node-{n}"),
        }
    }
}

#[derive(Debug)]
struct NodeEntry {
    /// The broker's real address, as its own responses name it.
    address: String,
    listening: bool,
}

/// State shared by every listener and connection.
pub struct Shared {
    pub config: Config,
    pub metrics: Arc<Metrics>,
    pub advertised: Advertised,
    pub upstream: Upstream,
    pub acceptor: Option<TlsAcceptor>,
    listen_ip: IpAddr,
    nodes: Mutex<HashMap<i32, NodeEntry>>,
    topic_names: RwLock<HashMap<Uuid, String>>,
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
    /// The real address of broker `node`, once a response has named it.
    pub fn node_address(&self, node: i32) -> Option<String> {
        self.nodes
            .lock()
            .ok()?
            .get(&node)
            .map(|e| e.address.clone())
    }

    /// The name of a topic id seen in a Metadata response.
    pub fn topic_name(&self, id: Uuid) -> Option<String> {
        self.topic_names.read().ok()?.get(&id).cloned()
    }

    /// Record what a response taught us and make sure every broker it named
    /// has a listener before the client hears of it.
    pub fn learn(self: &Arc<Self>, learnt: Learnt) -> Result<(), StartError> {
        if !learnt.topics.is_empty() {
            if let Ok(mut names) = self.topic_names.write() {
                names.extend(learnt.topics);
            }
        }
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
        let Ok(mut nodes) = self.nodes.lock() else {
            return Ok(());
        };
        let entry = nodes.entry(node).or_insert(NodeEntry {
            address: address.clone(),
            listening: false,
        });
        if entry.address != address {
            tracing::info!(node, old = %entry.address, new = %address, "broker address changed");
            entry.address = address;
        }
        if entry.listening {
            return Ok(());
        }
        let port = self.advertised.port(node)?;
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
        spawn_accept_loop(Arc::clone(self), listener, Target::Node(node));
        Ok(())
    }
}

fn bind_std(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let std = std::net::TcpListener::bind(addr)?;
    std.set_nonblocking(true)?;
    TcpListener::from_std(std)
}

fn spawn_accept_loop(shared: Arc<Shared>, listener: TcpListener, target: Target) {
    tokio::spawn(async move {
        loop {
            match listener.accept().await {
                Ok((tcp, peer)) => {
                    let _ = tcp.set_nodelay(true);
                    tokio::spawn(session::serve(Arc::clone(&shared), tcp, peer, target));
                }
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    tracing::warn!(listener = %target.label(), error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    });
}

/// A running proxy.
pub struct Proxy {
    pub shared: Arc<Shared>,
    pub bootstrap_addr: SocketAddr,
}

impl Proxy {
    /// Bind the bootstrap listener and start accepting.
    pub async fn start(config: Config, metrics: Arc<Metrics>) -> Result<Proxy, StartError> {
        let acceptor = config.client_tls.as_ref().map(tls::acceptor).transpose()?;
        let connector = config
            .upstream_tls
            .as_ref()
            .map(tls::connector)
            .transpose()?;
        let upstream = Upstream {
            tls: connector,
            server_name: config
                .upstream_tls
                .as_ref()
                .and_then(|t| t.server_name.clone()),
            timeout: Duration::from_millis(config.connect_timeout_ms),
        };
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
        let shared = Arc::new(Shared {
            advertised: Advertised {
                host: config.advertised_host.clone(),
                port_base: config.broker_port_base,
            },
            listen_ip: config.listen.ip(),
            config,
            metrics,
            upstream,
            acceptor,
            nodes: Mutex::new(HashMap::new()),
            topic_names: RwLock::new(HashMap::new()),
        });
        // Make the metric visible before the first connection.
        shared.metrics.add(
            "kafka_mirror_proxy_client_connections_total",
            labels(&[("listener", "bootstrap")]),
            0,
        );
        spawn_accept_loop(Arc::clone(&shared), listener, Target::Bootstrap);
        Ok(Proxy {
            shared,
            bootstrap_addr,
        })
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
