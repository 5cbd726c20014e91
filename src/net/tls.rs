//! TLS on both sides, with rustls: the acceptor for client listeners (with
//! optional client certificates) and the connector towards brokers.
//!
//! With SNI routing the client listener reads the ClientHello first
//! ([`ServerTls::accept_routed`]): its server name picks the broker, and a
//! name that routes nowhere gets a TLS `access_denied` alert.
//!
//! Both are reloaded from their files without a restart: [`reload_all`]
//! (called every [`RELOAD_INTERVAL`] and on SIGHUP) reads the files again and,
//! when their contents changed, builds a new acceptor or connector that new
//! connections use; open connections keep the one they started with. Files
//! that do not make a valid configuration (a certificate written before its
//! key, say) leave the previous one in place, with one WARN line per change.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::{LazyConfigAcceptor, TlsAcceptor, TlsConnector};

use crate::config::{ClientTls, UpstreamTls};
use crate::mirror::link::CertSubject;
use crate::sync::error_chain;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("invalid CA certificate")]
    Ca(#[source] rustls::Error),
    #[error("TLS configuration rejected")]
    Config(#[from] rustls::Error),
    #[error("client certificate verifier")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// Why certificate files could not be loaded again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReloadError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is larger than {MAX_PEM_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path}: not a PEM file holding at least one CERTIFICATE")]
    Certs {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error("{path}: not a PEM file holding at least one CERTIFICATE (none found)")]
    NoCerts { path: PathBuf },
    #[error("{path}: not a PEM private key")]
    Key {
        path: PathBuf,
        source: rustls_pki_types::pem::Error,
    },
    #[error(transparent)]
    Setup(#[from] TlsSetupError),
}

/// How often the TLS files are checked for changes (SIGHUP checks at once).
pub(crate) const RELOAD_INTERVAL: Duration = Duration::from_secs(3);
/// A certificate or key file larger than this is refused, not read whole.
const MAX_PEM_BYTES: u64 = 1 << 20;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(certs: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots.add(c.clone()).map_err(TlsSetupError::Ca)?;
    }
    Ok(roots)
}

/// The acceptor for every client listener.
pub(crate) fn acceptor(tls: &ClientTls) -> Result<TlsAcceptor, TlsSetupError> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &tls.client_ca {
        // Client certificates are optional: local clients connect without
        // one; links bound to a TLS subject check it per request.
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                .allow_unauthenticated()
                .build()?,
        ),
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(tls.cert_chain.clone(), tls.key.clone_key())?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The connector towards the brokers.
pub(crate) fn connector(tls: &UpstreamTls) -> Result<TlsConnector, TlsSetupError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(&tls.ca)?);
    let config = match &tls.client_cert {
        Some((chain, key)) => builder.with_client_auth_cert(chain.clone(), key.clone_key())?,
        None => builder.with_no_client_auth(),
    };
    Ok(TlsConnector::from(Arc::new(config)))
}

/// The subject of a (verified) client certificate.
pub(crate) fn subject(cert: &CertificateDer<'_>) -> Option<CertSubject> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let name = parsed.subject();
    let registry = x509_parser::objects::oid_registry();
    let attributes = name
        .iter_rdn()
        .flat_map(|rdn| rdn.iter())
        .map(|a| {
            let ty = x509_parser::objects::oid2abbrev(a.attr_type(), registry)
                .map(str::to_string)
                .unwrap_or_else(|_| a.attr_type().to_id_string());
            let value = match a.as_str() {
                Ok(v) => v.to_string(),
                // Another string type (BMPString, …): its bytes, which no
                // configured subject of ordinary text can equal by chance.
                Err(_) => String::from_utf8_lossy(a.attr_value().data).into_owned(),
            };
            (ty, value)
        })
        .collect();
    let subject = CertSubject {
        full: name.to_string(),
        common_name: name
            .iter_common_name()
            .next()
            .and_then(|cn| cn.as_str().ok())
            .map(str::to_string),
        attributes,
    };
    Some(subject)
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, ReloadError> {
    let read = |source| ReloadError::Read {
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(read)?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(ReloadError::TooLarge {
            path: path.to_path_buf(),
        });
    }
    Ok(bytes)
}

fn parse_certs(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, ReloadError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ReloadError::Certs {
            path: path.to_path_buf(),
            source,
        })?;
    if certs.is_empty() {
        return Err(ReloadError::NoCerts {
            path: path.to_path_buf(),
        });
    }
    Ok(certs)
}

fn parse_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, ReloadError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| ReloadError::Key {
        path: path.to_path_buf(),
        source,
    })
}

/// The acceptor for client listeners, replaced when its files change.
#[derive(Clone)]
pub(crate) struct ServerTls(Arc<Reloading<TlsAcceptor>>);

impl ServerTls {
    /// From the configuration (files already read once); reloaded by
    /// [`reload_all`] from then on.
    pub(crate) fn new(tls: &ClientTls) -> Result<ServerTls, TlsSetupError> {
        let first = acceptor(tls)?;
        let template = tls.clone();
        let build = move |contents: &[Vec<u8>]| -> Result<TlsAcceptor, ReloadError> {
            let files = &template.files;
            let (Some(cert), Some(key)) = (contents.first(), contents.get(1)) else {
                return Ok(acceptor(&template)?);
            };
            let mut next = template.clone();
            next.cert_chain = parse_certs(&files[0], cert)?;
            next.key = Arc::new(parse_key(&files[1], key)?);
            if let (Some(path), Some(ca)) = (files.get(2), contents.get(2)) {
                next.client_ca = Some(parse_certs(path, ca)?);
            }
            Ok(acceptor(&next)?)
        };
        Ok(ServerTls(Reloading::register(
            "client-facing TLS (MIRROR_PROXY_TLS_*)",
            tls.files.clone(),
            first,
            Box::new(build),
        )))
    }

    /// A TLS handshake with the certificate current now.
    pub(crate) fn accept<IO: AsyncRead + AsyncWrite + Unpin>(
        &self,
        io: IO,
    ) -> tokio_rustls::Accept<IO> {
        self.0.current().accept(io)
    }

    /// A TLS handshake routed by the ClientHello's server name: `route`
    /// sees the name (`None`: the client sent none) before any certificate
    /// is chosen. A name it accepts completes the handshake with the
    /// certificate current now (so rotation applies); one it refuses gets a
    /// fatal `access_denied` alert and the connection ends.
    pub(crate) async fn accept_routed<IO, T, R>(
        &self,
        io: IO,
        route: impl FnOnce(Option<&str>) -> Result<T, R>,
    ) -> Result<(tokio_rustls::server::TlsStream<IO>, T), SniFailure<R>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let start = LazyConfigAcceptor::new(rustls::server::Acceptor::default(), io)
            .await
            .map_err(SniFailure::Handshake)?;
        match route(start.client_hello().server_name()) {
            Ok(routed) => {
                let config = Arc::clone(self.0.current().config());
                let stream = start
                    .into_stream(config)
                    .await
                    .map_err(SniFailure::Handshake)?;
                Ok((stream, routed))
            }
            Err(refused) => {
                // The handshake fails by design (no certificate resolves):
                // what matters is the alert it sends on its way.
                if let Some(config) = refusing_config() {
                    let _ = start.into_stream(config).await;
                }
                Err(SniFailure::Refused(refused))
            }
        }
    }
}

/// Why [`ServerTls::accept_routed`] gave no connection.
#[derive(Debug)]
pub(crate) enum SniFailure<R> {
    /// Not a ClientHello, or the handshake failed after routing.
    Handshake(std::io::Error),
    /// `route` refused the name; the client was sent `access_denied`.
    Refused(R),
}

/// Resolves no certificate, so that rustls refuses the handshake with a
/// fatal alert (access_denied) instead of the connection just closing.
#[derive(Debug)]
struct NoCertificate;

impl rustls::server::ResolvesServerCert for NoCertificate {
    fn resolve(
        &self,
        _: rustls::server::ClientHello<'_>,
    ) -> Option<Arc<rustls::sign::CertifiedKey>> {
        None
    }
}

/// The configuration a refused ClientHello is answered with (built once).
fn refusing_config() -> Option<Arc<ServerConfig>> {
    static CONFIG: std::sync::OnceLock<Option<Arc<ServerConfig>>> = std::sync::OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let builder = ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .ok()?;
            let config = builder
                .with_no_client_auth()
                .with_cert_resolver(Arc::new(NoCertificate));
            Some(Arc::new(config))
        })
        .clone()
}

/// The connector towards brokers, replaced when its files change.
#[derive(Clone)]
pub struct UpstreamConnector(Arc<Reloading<TlsConnector>>);

impl UpstreamConnector {
    /// From the configuration (files already read once); reloaded by
    /// [`reload_all`] from then on.
    pub(crate) fn new(tls: &UpstreamTls) -> Result<UpstreamConnector, TlsSetupError> {
        let first = connector(tls)?;
        let template = tls.clone();
        let build = move |contents: &[Vec<u8>]| -> Result<TlsConnector, ReloadError> {
            let files = &template.files;
            let Some(ca) = contents.first() else {
                return Ok(connector(&template)?);
            };
            let mut next = template.clone();
            next.ca = parse_certs(&files[0], ca)?;
            if let (Some(cert), Some(key)) = (contents.get(1), contents.get(2)) {
                next.client_cert = Some((
                    parse_certs(&files[1], cert)?,
                    Arc::new(parse_key(&files[2], key)?),
                ));
            }
            Ok(connector(&next)?)
        };
        Ok(UpstreamConnector(Reloading::register(
            "upstream TLS (MIRROR_PROXY_UPSTREAM_TLS_*)",
            tls.files.clone(),
            first,
            Box::new(build),
        )))
    }

    /// A TLS handshake with the CA and client certificate current now.
    pub(crate) fn connect<IO: AsyncRead + AsyncWrite + Unpin>(
        &self,
        name: ServerName<'static>,
        io: IO,
    ) -> tokio_rustls::Connect<IO> {
        self.0.current().connect(name, io)
    }
}

type Build<T> = Box<dyn Fn(&[Vec<u8>]) -> Result<T, ReloadError> + Send + Sync>;

/// A TLS configuration and the files it is built from.
struct Reloading<T> {
    what: &'static str,
    files: Vec<PathBuf>,
    current: RwLock<T>,
    build: Build<T>,
    seen: Mutex<Seen>,
}

/// What [`Reload::check`] found last time.
struct Seen {
    /// The files' contents last acted on (loaded, or refused with a WARN).
    contents: Option<Vec<Vec<u8>>>,
    /// Reading a file failed (and was reported).
    read_failed: bool,
}

/// Everything [`reload_all`] checks; entries go when their owners do.
static RELOADING: Mutex<Vec<Weak<dyn Reload>>> = Mutex::new(Vec::new());

trait Reload: Send + Sync {
    fn check(&self);
}

impl<T: Clone + Send + Sync + 'static> Reloading<T> {
    fn register(
        what: &'static str,
        files: Vec<PathBuf>,
        first: T,
        build: Build<T>,
    ) -> Arc<Reloading<T>> {
        // What was just loaded (read again: the first read was config's).
        let seen = Seen {
            contents: files
                .iter()
                .map(|f| read_bounded(f))
                .collect::<Result<Vec<_>, _>>()
                .ok(),
            read_failed: false,
        };
        let this = Arc::new(Reloading {
            what,
            files,
            current: RwLock::new(first),
            build,
            seen: Mutex::new(seen),
        });
        {
            let mut all = crate::sync::lock(&RELOADING);
            all.retain(|w| w.strong_count() > 0);
            let weak: Weak<dyn Reload> = Arc::downgrade(&this) as Weak<dyn Reload>;
            all.push(weak);
        }
        this
    }

    fn current(&self) -> T {
        crate::sync::read(&self.current).clone()
    }
}

impl<T: Clone + Send + Sync + 'static> Reload for Reloading<T> {
    fn check(&self) {
        let mut seen = crate::sync::lock(&self.seen);
        let contents = match self
            .files
            .iter()
            .map(|f| read_bounded(f))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(contents) => contents,
            Err(e) => {
                // Retried every poll, reported once until readable again.
                if !std::mem::replace(&mut seen.read_failed, true) {
                    tracing::warn!(what = self.what, error = %error_chain(&e), "cannot read the TLS files: keeping the previous certificates");
                }
                return;
            }
        };
        seen.read_failed = false;
        if seen.contents.as_ref() == Some(&contents) {
            return;
        }
        let built = (self.build)(&contents);
        // Acted on either way: a bad set is reported once, not every poll.
        seen.contents = Some(contents);
        match built {
            Ok(next) => {
                *crate::sync::write(&self.current) = next;
                tracing::info!(what = self.what, files = ?self.files, "TLS files changed: reloaded; new connections use them, open ones keep theirs");
            }
            Err(e) => {
                tracing::warn!(what = self.what, error = %error_chain(&e), "TLS files changed but cannot be used: keeping the previous certificates");
            }
        }
    }
}

/// Checks every TLS configuration's files and reloads those that changed.
/// Blocking file reads (small, bounded): call from a blocking thread.
pub(crate) fn reload_all() {
    let live: Vec<Arc<dyn Reload>> = {
        let mut all = crate::sync::lock(&RELOADING);
        all.retain(|w| w.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).collect()
    };
    for r in live {
        r.check();
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_bad_pem_file_names_its_path_and_carries_the_pem_error() {
        let path = Path::new("/etc/kmp/cert.pem");
        let none = parse_certs(path, b"no PEM here").expect_err("no certificate");
        assert!(matches!(none, ReloadError::NoCerts { .. }), "{none:?}");
        assert_eq!(
            none.to_string(),
            "/etc/kmp/cert.pem: not a PEM file holding at least one CERTIFICATE (none found)"
        );
        let cut = b"-----BEGIN CERTIFICATE-----\nAAAA\n";
        let e = parse_certs(path, cut).expect_err("cut short");
        assert_eq!(
            e.to_string(),
            "/etc/kmp/cert.pem: not a PEM file holding at least one CERTIFICATE"
        );
        let cause = e.source().expect("the PEM error");
        assert!(cause
            .downcast_ref::<rustls_pki_types::pem::Error>()
            .is_some());
        assert_eq!(error_chain(&e), format!("{e}: {cause}"));
        let key = parse_key(Path::new("/k.pem"), cut).expect_err("no key");
        assert!(key.source().is_some(), "{key:?}");
    }

    #[test]
    fn a_rejected_ca_certificate_carries_the_rustls_error() {
        let e = roots(&[CertificateDer::from(vec![1u8, 2, 3])]).expect_err("not DER");
        assert_eq!(e.to_string(), "invalid CA certificate");
        let cause = e.source().expect("the rustls error");
        assert!(cause.downcast_ref::<rustls::Error>().is_some());
    }
}
