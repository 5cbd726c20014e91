//! SNI routing on one TLS port, through the binary against real brokers
//! with real clients: Kafka's Java client (console producer and consumer,
//! topic tool) and librdkafka (rdkafka crate, with OpenSSL) reach the
//! bootstrap and every broker node through one listener, each by its own
//! host name (`broker-$(nodeId).kafka.test`), including a broker that joins
//! the cluster while the clients run, with a node id (70000) no port per
//! node could serve. Names that route nowhere, and a ClientHello without a
//! name, are refused with a TLS alert.
//!
//! The test names resolve to 127.0.0.1 without any system file edited: the
//! Java tools get `-Djdk.net.hosts.file`, and librdkafka resolves through
//! the `getaddrinfo` defined below (see there).

mod support;

use std::ffi::{c_char, c_int, CStr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig as RdConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName};

use support::certs::TestCa;
use support::kafka::{KafkaMultiCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools::{self, console_consume, console_produce};

const PATTERN: &str = "broker-$(nodeId).kafka.test";
const BOOTSTRAP: &str = "bootstrap.kafka.test";
/// The suffix every test name has; the resolvers map these to 127.0.0.1.
const TEST_DOMAIN: &str = ".kafka.test";
/// The broker that joins: a node id above any port number.
const JOINER: u32 = 70000;

/// librdkafka resolves broker host names with getaddrinfo(3). This test
/// binary defines that symbol, so the (statically linked) librdkafka calls
/// this one: names under `.kafka.test` resolve as `127.0.0.1`, every other
/// name goes to the C library's own getaddrinfo. It stands in for the DNS
/// records an operator creates for the SNI names (as `jdk.net.hosts.file`
/// does for the Java tools); it is not a stand-in for anything Kafka or the
/// proxy does.
///
/// # Safety
///
/// The C library's contract for getaddrinfo(3).
#[no_mangle]
pub unsafe extern "C" fn getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const libc::addrinfo,
    res: *mut *mut libc::addrinfo,
) -> c_int {
    type Real = unsafe extern "C" fn(
        *const c_char,
        *const c_char,
        *const libc::addrinfo,
        *mut *mut libc::addrinfo,
    ) -> c_int;
    static REAL: OnceLock<usize> = OnceLock::new();
    let real = *REAL.get_or_init(|| {
        // SAFETY: a symbol lookup with a NUL-terminated name.
        unsafe { libc::dlsym(libc::RTLD_NEXT, c"getaddrinfo".as_ptr()) as usize }
    });
    if real == 0 {
        return libc::EAI_FAIL;
    }
    // SAFETY: `real` is the C library's getaddrinfo, of type `Real`.
    let real: Real = unsafe { std::mem::transmute::<usize, Real>(real) };
    let mut node = node;
    // SAFETY: a non-null `node` is a NUL-terminated string (the contract).
    if !node.is_null()
        && unsafe { CStr::from_ptr(node) }
            .to_bytes()
            .ends_with(TEST_DOMAIN.as_bytes())
    {
        node = c"127.0.0.1".as_ptr();
    }
    // SAFETY: the caller's arguments, passed on.
    unsafe { real(node, service, hints, res) }
}

/// Removes the hosts file when the test ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The hosts file the Java tools of this process resolve with.
fn java_hosts_file(names: &[String]) -> Result<RemoveOnDrop> {
    let path = std::env::temp_dir().join(format!("kmp-sni-hosts-{}", std::process::id()));
    let mut text = String::from("127.0.0.1 localhost\n");
    if let Ok(host) = std::fs::read_to_string("/etc/hostname") {
        text.push_str(&format!("127.0.0.1 {}\n", host.trim()));
    }
    for n in names {
        text.push_str(&format!("127.0.0.1 {n}\n"));
    }
    std::fs::write(&path, text)?;
    tools::set_tools_jvm_args(&[&format!("-Djdk.net.hosts.file={}", path.display())])?;
    Ok(RemoveOnDrop(path))
}

fn node_name(node: u32) -> String {
    PATTERN.replace("$(nodeId)", &node.to_string())
}

/// A proxy in SNI mode in front of `upstream`, with a certificate for every
/// test name; returns it and the client bootstrap (`bootstrap.kafka.test:port`).
fn sni_proxy(dir: &Path, upstream: &str) -> Result<(ProxyProcess, String, TestCa)> {
    let ca = TestCa::new(dir)?;
    let cert = ca.server_for("proxy", &["*.kafka.test"])?;
    let proxy = ProxyProcess::start_default_ports(
        upstream,
        &[
            ("TLS_CERT", &cert.cert_path.to_string_lossy()),
            ("TLS_KEY", &cert.key_path.to_string_lossy()),
            ("SNI_HOST_PATTERN", PATTERN),
            ("SNI_BOOTSTRAP_HOST", BOOTSTRAP),
        ],
    )?;
    let port = proxy
        .bootstrap
        .rsplit(':')
        .next()
        .context("proxy port")?
        .to_string();
    let bootstrap = format!("{BOOTSTRAP}:{port}");
    Ok((proxy, bootstrap, ca))
}

fn java_tls(ca: &TestCa) -> Vec<(String, String)> {
    vec![
        ("security.protocol".into(), "SSL".into()),
        ("ssl.truststore.type".into(), "PEM".into()),
        (
            "ssl.truststore.location".into(),
            ca.cert_path.display().to_string(),
        ),
    ]
}

fn rd_config(bootstrap: &str, ca: &TestCa) -> RdConfig {
    let mut c = RdConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", ca.cert_path.display().to_string())
        .set("socket.timeout.ms", "30000");
    c
}

/// Sends `values` to partition 0 of `topic` and waits for every
/// acknowledgement (an error if any is refused).
fn rd_produce(p: &BaseProducer, topic: &str, values: &[String]) -> Result<()> {
    for v in values {
        p.send(BaseRecord::<(), String>::to(topic).partition(0).payload(v))
            .map_err(|(e, _)| e)?;
    }
    p.flush(Duration::from_secs(60))?;
    Ok(())
}

/// Reads partition 0 of `topic` from the start until `n` values arrived
/// (or 60 s passed); returns them.
fn rd_consume(bootstrap: &str, ca: &TestCa, topic: &str, n: usize) -> Result<Vec<String>> {
    let c: BaseConsumer = rd_config(bootstrap, ca)
        .set("group.id", format!("sni-{topic}"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)?;
    c.assign(&tpl)?;
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < n && Instant::now() < deadline {
        if let Some(m) = c.poll(Duration::from_millis(500)) {
            let m = m?;
            got.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    Ok(got)
}

/// The brokers a client's Metadata shows, as (id, host, port), sorted.
fn rd_brokers(p: &BaseProducer) -> Result<Vec<(i32, String, i32)>> {
    let md = p.client().fetch_metadata(None, Duration::from_secs(30))?;
    let mut brokers: Vec<_> = md
        .brokers()
        .iter()
        .map(|b| (b.id(), b.host().to_string(), b.port()))
        .collect();
    brokers.sort();
    Ok(brokers)
}

fn values(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

#[test]
fn java_and_librdkafka_reach_every_node_through_one_sni_port_also_one_that_joins() -> Result<()> {
    let _hosts = java_hosts_file(&[BOOTSTRAP.to_string(), node_name(1), node_name(JOINER)])?;
    let dir = tempfile::tempdir()?;
    let mut cluster = KafkaMultiCluster::start(KafkaOptions::default(), &[1])?;
    let (proxy, bootstrap, ca) = sni_proxy(dir.path(), &cluster.bootstrap())?;
    let port: i32 = bootstrap.rsplit(':').next().unwrap_or_default().parse()?;
    let java = java_tls(&ca);
    let java = tools::props_ref(&java);

    // A librdkafka producer that stays up across the join.
    let producer: BaseProducer = rd_config(&bootstrap, &ca).create()?;
    let brokers = rd_brokers(&producer)?;
    ensure!(
        brokers == vec![(1, node_name(1), port)],
        "librdkafka's metadata should name node 1 at {}:{port}: {brokers:?}",
        node_name(1)
    );

    // Round trip before the join: Java in, Java and librdkafka out, and
    // librdkafka in.
    tools::create_topic(&bootstrap, "before", 1, &[], &java)?;
    let java_values = values("java", 5);
    console_produce(&bootstrap, "before", &java_values, &java)?;
    let rd_values = values("rd", 5);
    rd_produce(&producer, "before", &rd_values)?;
    let all: Vec<String> = java_values.iter().chain(&rd_values).cloned().collect();
    let read = console_consume(
        &bootstrap,
        "before",
        all.len(),
        &java,
        Duration::from_secs(30),
    )?;
    ensure!(read == all, "Java read {read:?}, expected {all:?}");
    let read = rd_consume(&bootstrap, &ca, "before", all.len())?;
    ensure!(read == all, "librdkafka read {read:?}, expected {all:?}");

    // A broker joins while the producer runs; a topic only it holds.
    cluster.add_broker(JOINER)?;
    let admin: AdminClient<DefaultClientContext> = rd_config(&bootstrap, &ca).create()?;
    let rt = support::crate_client::runtime()?;
    let assignment: &[&[i32]] = &[&[JOINER as i32]];
    let created = rt.block_on(admin.create_topics(
        &[NewTopic::new(
            "joined",
            1,
            TopicReplication::Variable(assignment),
        )],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))?;
    for r in created {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    let expected = vec![
        (1, node_name(1), port),
        (JOINER as i32, node_name(JOINER), port),
    ];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let brokers = rd_brokers(&producer)?;
        if brokers == expected {
            break;
        }
        if Instant::now() > deadline {
            bail!("the running producer's metadata never named {expected:?}: {brokers:?}");
        }
        std::thread::sleep(Duration::from_millis(500));
    }

    // The running producer reaches the new leader by its own name.
    let rd_joined = values("rd-joined", 5);
    rd_produce(&producer, "joined", &rd_joined)?;
    let java_joined = values("java-joined", 5);
    console_produce(&bootstrap, "joined", &java_joined, &java)?;
    let all: Vec<String> = rd_joined.iter().chain(&java_joined).cloned().collect();
    let read = console_consume(
        &bootstrap,
        "joined",
        all.len(),
        &java,
        Duration::from_secs(30),
    )?;
    ensure!(read == all, "Java read {read:?}, expected {all:?}");
    let read = rd_consume(&bootstrap, &ca, "joined", all.len())?;
    ensure!(read == all, "librdkafka read {read:?}, expected {all:?}");

    // Those connections really went to node 70000, through the one port.
    let sample =
        format!("kafka_mirror_proxy_client_connections_total{{listener=\"node-{JOINER}\"}}");
    let routed = proxy.metric(&sample)?;
    ensure!(routed > 0, "{sample} is {routed}");
    let logs = proxy.logs();
    ensure!(
        !logs.contains("refused client connection"),
        "a connection was refused:\n{}",
        tools::tail_str(&logs, 40)
    );
    Ok(())
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, std::net::TcpStream>;

/// A TLS handshake with the proxy at `addr`, sending `name` as SNI (an IP
/// address sends none), trusting `ca`.
fn handshake(addr: &str, name: &str, ca: &TestCa) -> std::result::Result<Tls, rustls::Error> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(ca.cert_pem.as_bytes()).flatten() {
        let _ = roots.add(c);
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = ServerName::try_from(name.to_string())
        .map_err(|e| rustls::Error::General(e.to_string()))?;
    let conn = rustls::ClientConnection::new(Arc::new(config), server)?;
    let tcp =
        std::net::TcpStream::connect(addr).map_err(|e| rustls::Error::General(e.to_string()))?;
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(30)));
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    while tls.conn.is_handshaking() {
        if let Err(e) = tls.conn.complete_io(&mut tls.sock) {
            // The alert, if the server sent one, is the error to report.
            return Err(
                match e
                    .into_inner()
                    .and_then(|i| i.downcast::<rustls::Error>().ok())
                {
                    Some(e) => *e,
                    None => rustls::Error::General("connection closed during the handshake".into()),
                },
            );
        }
    }
    Ok(tls)
}

#[test]
fn names_that_route_nowhere_and_a_missing_name_are_refused_with_a_tls_alert() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = KafkaMultiCluster::start(KafkaOptions::default(), &[1])?;
    let (proxy, _, ca) = sni_proxy(dir.path(), &cluster.bootstrap())?;
    let addr = proxy.bootstrap.clone();

    // The bootstrap name is served (and teaches the proxy node 1)...
    let producer: BaseProducer = rd_config(
        &format!(
            "{BOOTSTRAP}:{}",
            addr.rsplit(':').next().unwrap_or_default()
        ),
        &ca,
    )
    .create()?;
    let brokers = rd_brokers(&producer)?;
    ensure!(
        brokers.len() == 1 && brokers[0].1 == node_name(1),
        "{brokers:?}"
    );
    drop(producer);
    for served in [BOOTSTRAP.to_string(), node_name(1)] {
        handshake(&addr, &served, &ca)
            .map_err(|e| anyhow::anyhow!("{served} should be served: {e}"))?;
    }

    // ...anything else is refused during the handshake.
    let refused = [
        (node_name(9), "sni_unknown_node"),
        ("other.kafka.test".to_string(), "sni_unknown_name"),
        ("broker-01.kafka.test".to_string(), "sni_unknown_name"),
        ("127.0.0.1".to_string(), "sni_missing"),
    ];
    for (name, reason) in &refused {
        match handshake(&addr, name, &ca) {
            Ok(_) => bail!("{name}: the handshake succeeded; it should be refused"),
            Err(rustls::Error::AlertReceived(rustls::AlertDescription::AccessDenied)) => {}
            Err(e) => bail!("{name}: expected the alert access_denied, got {e}"),
        }
        let sample = format!(
            "kafka_mirror_proxy_connections_refused_total{{listener=\"bootstrap\",reason=\"{reason}\"}}"
        );
        proxy.wait_metric(&sample, 1, Duration::from_secs(10))?;
    }
    // The log line, like the count, follows the alert: wait for the last.
    let count_lines = |logs: &str| {
        logs.lines()
            .filter(|l| l.contains("refused client connection: sent TLS alert access_denied"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while count_lines(&proxy.logs()) < refused.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let logs = proxy.logs();
    let lines = count_lines(&logs);
    ensure!(
        lines == refused.len(),
        "expected one log line per refused connection ({}), got {lines}:\n{}",
        refused.len(),
        tools::tail_str(&logs, 30)
    );
    Ok(())
}

#[test]
fn sni_routing_without_tls_is_a_startup_error() -> Result<()> {
    let mut cmd = std::process::Command::new(support::proxy::proxy_bin());
    cmd.arg("run")
        .env("MIRROR_PROXY_BOOTSTRAP_SERVERS", "127.0.0.1:1")
        .env("MIRROR_PROXY_LISTEN", "127.0.0.1:0")
        .env("MIRROR_PROXY_ADMIN_LISTEN", "127.0.0.1:0")
        .env("MIRROR_PROXY_SNI_HOST_PATTERN", PATTERN)
        .env("MIRROR_PROXY_SNI_BOOTSTRAP_HOST", BOOTSTRAP);
    // A proxy that starts anyway runs until killed: bounded.
    let out = tools::run_with_timeout(cmd, None, Duration::from_secs(30))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success(),
        "the proxy started without TLS: {stderr}"
    );
    ensure!(
        stderr.contains("MIRROR_PROXY_TLS_CERT") && stderr.contains("SNI routing"),
        "the error should name MIRROR_PROXY_TLS_CERT and SNI routing: {stderr}"
    );
    Ok(())
}

/// Writes `contents` to `path` through a temp file and a rename, so the
/// proxy never reads half a file.
fn replace_file(path: &Path, contents: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The DER of the first certificate in `pem`.
fn der(pem: &str) -> Result<Vec<u8>> {
    let cert = CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .context("no certificate")??;
    Ok(cert.as_ref().to_vec())
}

#[test]
fn the_sni_listener_serves_a_rotated_certificate_and_still_refuses_unknown_names() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = KafkaMultiCluster::start(KafkaOptions::default(), &[1])?;
    let (proxy, _, ca) = sni_proxy(dir.path(), &cluster.bootstrap())?;
    let addr = proxy.bootstrap.clone();
    // The second certificate, from another CA, for the same names.
    let dir2 = tempfile::tempdir()?;
    let ca2 = TestCa::new(dir2.path())?;
    let next = ca2.server_for("proxy", &["*.kafka.test"])?;
    let want = der(&next.cert)?;
    let peer = |tls: &Tls| {
        tls.conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.as_ref().to_vec())
    };
    let first = handshake(&addr, BOOTSTRAP, &ca).map_err(|e| anyhow::anyhow!("{e}"))?;
    ensure!(
        peer(&first) != Some(want.clone()),
        "served the new certificate already"
    );

    // The files the proxy was started with (sni_proxy's, in `dir`).
    replace_file(&dir.path().join("proxy.key"), &next.key)?;
    replace_file(&dir.path().join("proxy.pem"), &next.cert)?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Trusting the new CA only: the handshake succeeds once it is served.
        if let Ok(tls) = handshake(&addr, BOOTSTRAP, &ca2) {
            ensure!(peer(&tls) == Some(want.clone()), "unexpected certificate");
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the new certificate was not served within 30 s:\n{}",
                tools::tail_str(&proxy.logs(), 20)
            );
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(first);
    match handshake(&addr, "other.kafka.test", &ca2) {
        Err(rustls::Error::AlertReceived(rustls::AlertDescription::AccessDenied)) => Ok(()),
        Ok(_) => bail!("an unknown name was served after the rotation"),
        Err(e) => bail!("expected the alert access_denied, got {e}"),
    }
}
