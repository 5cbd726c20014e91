//! Connections from the proxy to a broker: TCP, then TLS when configured.
//! Each client connection gets its own upstream connection, which is what
//! lets SASL authentication pass through untouched.

use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use super::tls::{TlsSetupError, UpstreamConnector};
use crate::sync::error_chain;

/// Either side of the proxy, plain or TLS.
pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
pub(crate) type BoxStream = Box<dyn Stream>;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("connecting to broker {addr}: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("TLS handshake with broker {addr}: {source}")]
    Tls {
        addr: String,
        source: std::io::Error,
    },
    #[error("connecting to broker {addr}: timed out after {ms} ms")]
    Timeout { addr: String, ms: u64 },
    #[error("broker address {addr} has no valid TLS server name")]
    ServerName { addr: String },
    #[error("no broker reachable (tried {})", each_chain(tried))]
    NoneReachable {
        /// Why each broker tried could not be used, in order.
        tried: Vec<ConnectError>,
        /// Every attempt failed to reach its broker.
        all_unreachable: bool,
    },
}

/// Each error with its causes, `; `-separated: a list has no one source.
fn each_chain(errors: &[ConnectError]) -> String {
    let chains: Vec<String> = errors.iter().map(|e| error_chain(e)).collect();
    chains.join("; ")
}

impl ConnectError {
    /// The broker could not be reached at all (as opposed to reached and
    /// failing a TLS handshake, which a closed port would not explain).
    pub(crate) fn is_unreachable(&self) -> bool {
        match self {
            ConnectError::Io { .. } | ConnectError::Timeout { .. } => true,
            ConnectError::Tls { .. } | ConnectError::ServerName { .. } => false,
            ConnectError::NoneReachable {
                all_unreachable, ..
            } => *all_unreachable,
        }
    }
}

/// How to reach brokers.
#[derive(Clone)]
pub struct Upstream {
    /// Reloaded when its files change (see `super::tls`).
    pub tls: Option<UpstreamConnector>,
    pub server_name: Option<String>,
    pub timeout: Duration,
}

impl Upstream {
    /// From the proxy's configuration: upstream TLS (if enabled) and the
    /// connect timeout.
    pub(crate) fn from_config(config: &crate::config::Config) -> Result<Upstream, TlsSetupError> {
        Ok(Upstream {
            tls: config
                .upstream_tls
                .as_ref()
                .map(UpstreamConnector::new)
                .transpose()?,
            server_name: config
                .upstream_tls
                .as_ref()
                .and_then(|t| t.server_name.clone()),
            timeout: Duration::from_millis(config.connect_timeout_ms),
        })
    }

    /// Connect to one broker at `addr` (host:port).
    pub(crate) async fn connect(&self, addr: &str) -> Result<BoxStream, ConnectError> {
        let ms = self.timeout.as_millis() as u64;
        let attempt = async {
            let tcp = TcpStream::connect(addr)
                .await
                .map_err(|source| ConnectError::Io {
                    addr: addr.to_string(),
                    source,
                })?;
            let _ = tcp.set_nodelay(true);
            let Some(tls) = &self.tls else {
                return Ok(Box::new(tcp) as BoxStream);
            };
            let host = match &self.server_name {
                Some(name) => name.clone(),
                None => addr
                    .rsplit_once(':')
                    .map(|(h, _)| h.trim_start_matches('[').trim_end_matches(']').to_string())
                    .unwrap_or_default(),
            };
            let name = ServerName::try_from(host).map_err(|_| ConnectError::ServerName {
                addr: addr.to_string(),
            })?;
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|source| ConnectError::Tls {
                    addr: addr.to_string(),
                    source,
                })?;
            Ok(Box::new(stream) as BoxStream)
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .map_err(|_| ConnectError::Timeout {
                addr: addr.to_string(),
                ms,
            })?
    }

    /// Connect to the first reachable of `addrs`, in order.
    pub(crate) async fn connect_any(
        &self,
        addrs: &[String],
    ) -> Result<(BoxStream, String), ConnectError> {
        let mut errors = Vec::new();
        let mut all_unreachable = true;
        for addr in addrs {
            match self.connect(addr).await {
                Ok(s) => return Ok((s, addr.clone())),
                Err(e) => {
                    all_unreachable &= e.is_unreachable();
                    errors.push(e);
                }
            }
        }
        Err(ConnectError::NoneReachable {
            tried: errors,
            all_unreachable,
        })
    }
}
