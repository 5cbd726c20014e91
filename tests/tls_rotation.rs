//! Certificate rotation without a restart, through the binary against a
//! real broker: the client-facing certificate (MIRROR_PROXY_TLS_CERT/KEY)
//! and the upstream CA (MIRROR_PROXY_UPSTREAM_TLS_CA) are replaced on disk
//! while the proxy runs; new connections use the new files, an open
//! connection keeps working, and files that do not parse keep the previous
//! certificates with one WARN line.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use support::certs::{Pem, TestCa};
use support::kafka::{KafkaCluster, KafkaOptions, Security};
use support::proxy::ProxyProcess;
use support::wire::RawClient;

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

/// A TLS connection to `addr` trusting every CA in `cas`; also returns the
/// certificate the server presented.
fn connect(addr: &str, cas: &[&str]) -> Result<(Tls, Vec<u8>)> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in cas {
        for c in CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(c?)?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let conn = rustls::ClientConnection::new(
        Arc::new(config),
        ServerName::try_from("localhost")?.to_owned(),
    )?;
    let tcp = TcpStream::connect(addr)?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        tls.conn.complete_io(&mut tls.sock)?;
    }
    let peer = tls
        .conn
        .peer_certificates()
        .and_then(|c| c.first())
        .context("no server certificate")?
        .as_ref()
        .to_vec();
    Ok((tls, peer))
}

/// One ApiVersions v0 round trip (answered by the broker behind the proxy).
fn api_versions(io: &mut impl ReadWrite, correlation: i32) -> Result<()> {
    // Header v1: api key 18, version 0, correlation id, null client id.
    let mut frame = vec![0, 0, 0, 10, 0, 18, 0, 0];
    frame.extend_from_slice(&correlation.to_be_bytes());
    frame.extend_from_slice(&[0xff, 0xff]);
    io.write_all(&frame)?;
    io.flush()?;
    let mut size = [0u8; 4];
    io.read_exact(&mut size)?;
    let size = u32::from_be_bytes(size) as usize;
    ensure!((6..1 << 20).contains(&size), "response size {size}");
    let mut body = vec![0u8; size];
    io.read_exact(&mut body)?;
    let got = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    ensure!(got == correlation, "correlation {got} != {correlation}");
    let error = i16::from_be_bytes([body[4], body[5]]);
    ensure!(error == 0, "ApiVersions error {error}");
    Ok(())
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

fn der(pem: &str) -> Result<Vec<u8>> {
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?
        .as_ref()
        .to_vec())
}

/// Replaces `path` at once (write aside, then rename), as deployment tools
/// and Kubernetes secret volumes do.
fn replace(path: &Path, contents: &str) -> Result<()> {
    let aside = path.with_extension("new");
    std::fs::write(&aside, contents)?;
    std::fs::rename(&aside, path)?;
    Ok(())
}

fn install(live_cert: &Path, live_key: &Path, pem: &Pem) -> Result<()> {
    replace(live_key, &pem.key)?;
    replace(live_cert, &pem.cert)
}

/// Dials until a new connection is served `want` (bounded).
fn wait_for_cert(addr: &str, cas: &[&str], want: &[u8], what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok((_, peer)) = connect(addr, cas) {
            if peer == want {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("new connections never got {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn count(logs: &str, needle: &str) -> usize {
    logs.lines().filter(|l| l.contains(needle)).count()
}

#[test]
fn a_rotated_client_certificate_is_served_to_new_connections_only() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (d1, d2) = (dir.path().join("one"), dir.path().join("two"));
    std::fs::create_dir_all(&d1)?;
    std::fs::create_dir_all(&d2)?;
    // Two unrelated CAs, so the two certificates cannot be confused.
    let (ca1, ca2) = (TestCa::new(&d1)?, TestCa::new(&d2)?);
    let (one, two) = (ca1.server("proxy")?, ca2.server("proxy")?);
    let (der1, der2) = (der(&one.cert)?, der(&two.cert)?);
    ensure!(der1 != der2, "test certificates are the same");
    let cas = [ca1.cert_pem.as_str(), ca2.cert_pem.as_str()];
    let live_cert = dir.path().join("server.pem");
    let live_key = dir.path().join("server.key");
    install(&live_cert, &live_key, &one)?;

    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("TLS_CERT", &live_cert.to_string_lossy()),
            ("TLS_KEY", &live_key.to_string_lossy()),
        ],
    )?;
    let (mut kept, peer) = connect(&proxy.bootstrap, &cas)?;
    ensure!(
        peer == der1,
        "the first connection did not get certificate 1"
    );
    api_versions(&mut kept, 1)?;

    // Rotated by the poll, without a signal.
    install(&live_cert, &live_key, &two)?;
    wait_for_cert(&proxy.bootstrap, &cas, &der2, "certificate 2 (by polling)")?;
    let (mut fresh, peer) = connect(&proxy.bootstrap, &cas)?;
    ensure!(
        peer == der2,
        "a new connection after the reload got another certificate"
    );
    api_versions(&mut fresh, 1)?;
    // The connection opened before the rotation was not cut.
    api_versions(&mut kept, 2).context("the connection opened before the rotation")?;
    ensure!(
        count(&proxy.logs(), "TLS files changed: reloaded") == 1,
        "one INFO line per reload:\n{}",
        proxy.logs()
    );

    // A file that does not parse: the previous certificate stays, one WARN.
    // (A poll between the key's and the certificate's rename above may have
    // warned about a key that does not match: counted from here.)
    let warned = count(&proxy.logs(), "cannot be used: keeping the previous");
    replace(
        &live_cert,
        "-----BEGIN CERTIFICATE-----\nnot base64 !\n-----END CERTIFICATE-----\n",
    )?;
    proxy.signal("HUP")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while count(&proxy.logs(), "cannot be used: keeping the previous") == warned {
        ensure!(
            Instant::now() < deadline,
            "no WARN for a bad file:\n{}",
            proxy.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Two more checks (each SIGHUP line is logged after the check before it
    // finished), still one WARN line.
    for n in 2..=3 {
        proxy.signal("HUP")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while count(&proxy.logs(), "SIGHUP: checking the TLS files") < n {
            ensure!(Instant::now() < deadline, "SIGHUP {n} not handled");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    ensure!(
        count(&proxy.logs(), "cannot be used: keeping the previous") == warned + 1,
        "a bad file is reported once:\n{}",
        proxy.logs()
    );
    let (mut during, peer) = connect(&proxy.bootstrap, &cas)?;
    ensure!(peer == der2, "a bad file replaced the working certificate");
    api_versions(&mut during, 1)?;

    // Back to certificate 1, on SIGHUP.
    install(&live_cert, &live_key, &one)?;
    proxy.signal("HUP")?;
    wait_for_cert(
        &proxy.bootstrap,
        &cas,
        &der1,
        "certificate 1 again (SIGHUP)",
    )?;
    api_versions(&mut kept, 3).context("the first connection, after two rotations")?;
    ensure!(
        count(&proxy.logs(), "TLS files changed: reloaded") == 2,
        "two reloads logged:\n{}",
        proxy.logs()
    );
    Ok(())
}

#[test]
fn a_rotated_upstream_ca_is_used_for_new_broker_connections() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (d1, d2) = (dir.path().join("broker"), dir.path().join("other"));
    std::fs::create_dir_all(&d1)?;
    std::fs::create_dir_all(&d2)?;
    let (broker_ca, other_ca) = (TestCa::new(&d1)?, TestCa::new(&d2)?);
    let broker_cert = broker_ca.server("broker")?;
    let broker = KafkaCluster::start(KafkaOptions::default().security(Security::Ssl {
        cert_chain_pem: format!("{}{}", broker_cert.cert, broker_ca.cert_pem),
        key_pem: broker_cert.key.clone(),
    }))?;
    // The proxy starts trusting the wrong CA: it cannot talk to the broker.
    let live_ca = dir.path().join("upstream-ca.pem");
    replace(&live_ca, &other_ca.cert_pem)?;
    let proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("UPSTREAM_TLS", "true"),
            ("UPSTREAM_TLS_CA", &live_ca.to_string_lossy()),
        ],
    )?;
    let mut client = RawClient::connect(&proxy.bootstrap)?;
    client.send_raw(&[0, 0, 0, 10, 0, 18, 0, 0, 0, 0, 0, 1, 0xff, 0xff])?;
    ensure!(
        client.recv_frame()?.is_none(),
        "answered through a broker whose certificate the proxy must not trust"
    );

    // The right CA on disk: new upstream connections verify with it.
    replace(&live_ca, &broker_ca.cert_pem)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answered = TcpStream::connect(&proxy.bootstrap)
            .map_err(anyhow::Error::from)
            .and_then(|mut tcp| {
                tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
                api_versions(&mut tcp, 1)
            });
        if answered.is_ok() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "never answered after the upstream CA was rotated: {answered:?}\n{}",
            proxy.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(
        proxy.logs().contains("upstream TLS") && proxy.logs().contains("reloaded"),
        "the upstream reload was not logged"
    );
    Ok(())
}
