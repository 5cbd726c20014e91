//! Test certificates made with rcgen: a CA, a server certificate for
//! 127.0.0.1/localhost (and more names for SNI routing) and client
//! certificates, written as PEM files.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use anyhow::Result;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

/// A certificate and its key, as PEM text and as files.
pub struct Pem {
    pub cert: String,
    pub key: String,
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
}

/// A CA that signs everything a test needs.
pub struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    pub cert_pem: String,
    pub cert_path: PathBuf,
    dir: PathBuf,
}

impl TestCa {
    pub fn new(dir: &Path) -> Result<TestCa> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "kafka-mirror-proxy test CA");
        let key = KeyPair::generate()?;
        let cert = params.clone().self_signed(&key)?;
        let cert_pem = cert.pem();
        let cert_path = dir.join("ca.pem");
        std::fs::write(&cert_path, &cert_pem)?;
        Ok(TestCa {
            params,
            key,
            cert_pem,
            cert_path,
            dir: dir.to_path_buf(),
        })
    }

    fn issue(&self, name: &str, cn: &str, server: bool) -> Result<Pem> {
        self.issue_for(name, cn, server, &[])
    }

    fn issue_for(&self, name: &str, cn: &str, server: bool, dns: &[&str]) -> Result<Pem> {
        let mut params = if server {
            let mut names = vec!["localhost".to_string()];
            names.extend(dns.iter().map(|d| d.to_string()));
            CertificateParams::new(names)?
        } else {
            CertificateParams::new(Vec::<String>::new())?
        };
        if server {
            params
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        }
        params.distinguished_name.push(DnType::CommonName, cn);
        params
            .distinguished_name
            .push(DnType::OrganizationName, "kafka-mirror-proxy tests");
        let key = KeyPair::generate()?;
        let issuer = self.params.clone().self_signed(&self.key)?;
        let cert = params.signed_by(&key, &issuer, &self.key)?;
        let pem = Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
            cert_path: self.dir.join(format!("{name}.pem")),
            key_path: self.dir.join(format!("{name}.key")),
        };
        std::fs::write(&pem.cert_path, &pem.cert)?;
        std::fs::write(&pem.key_path, &pem.key)?;
        Ok(pem)
    }

    /// A server certificate valid for 127.0.0.1 and localhost.
    pub fn server(&self, name: &str) -> Result<Pem> {
        self.issue(name, "localhost", true)
    }

    /// A server certificate valid for 127.0.0.1, localhost and `dns` (host
    /// names or wildcards such as `*.kafka.test`), e.g. for SNI routing.
    pub fn server_for(&self, name: &str, dns: &[&str]) -> Result<Pem> {
        self.issue_for(name, "localhost", true, dns)
    }

    /// A client certificate with common name `cn`.
    pub fn client(&self, name: &str, cn: &str) -> Result<Pem> {
        self.issue(name, cn, false)
    }
}
