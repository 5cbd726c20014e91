//! TLS on both sides, with rustls: the acceptor for client listeners (with
//! optional client certificates) and the connector towards brokers.

use std::sync::Arc;

use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::CertificateDer;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use crate::config::{ClientTls, UpstreamTls};
use crate::mirror::link::CertSubject;

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("invalid CA certificate: {0}")]
    Ca(String),
    #[error("TLS configuration rejected: {0}")]
    Config(#[from] rustls::Error),
    #[error("client certificate verifier: {0}")]
    Verifier(String),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn roots(certs: &[CertificateDer<'static>]) -> Result<RootCertStore, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for c in certs {
        roots
            .add(c.clone())
            .map_err(|e| TlsSetupError::Ca(e.to_string()))?;
    }
    Ok(roots)
}

/// The acceptor for every client listener.
pub fn acceptor(tls: &ClientTls) -> Result<TlsAcceptor, TlsSetupError> {
    let builder =
        ServerConfig::builder_with_provider(provider()).with_safe_default_protocol_versions()?;
    let builder = match &tls.client_ca {
        // Client certificates are optional: local clients connect without
        // one; links bound to a TLS subject check it per request.
        Some(ca) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| TlsSetupError::Verifier(e.to_string()))?,
        ),
        None => builder.with_no_client_auth(),
    };
    let config = builder.with_single_cert(tls.cert_chain.clone(), tls.key.clone_key())?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The connector towards the brokers.
pub fn connector(tls: &UpstreamTls) -> Result<TlsConnector, TlsSetupError> {
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
pub fn subject(cert: &CertificateDer<'_>) -> Option<CertSubject> {
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
