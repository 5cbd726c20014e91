//! The proxy under test, run as the real binary (`kafka-mirror-proxy run`)
//! configured through its environment, with its log captured so tests can
//! assert on what it says.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

pub use super::ports::free_port;

/// The proxy binary under test: this build, or `PROXY_TEST_BIN` (to run the
/// tests against another build, e.g. an older one).
pub fn proxy_bin() -> String {
    std::env::var("PROXY_TEST_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_kafka-mirror-proxy").to_string())
}

/// A free loopback port p with p+1..=p+n free as well.
pub fn free_port_run(n: u16) -> Result<u16> {
    for _ in 0..500 {
        let port = free_port()?;
        if port.checked_add(n).is_none() {
            continue;
        }
        let held: Vec<_> = (0..=n)
            .map_while(|i| TcpListener::bind(("127.0.0.1", port + i)).ok())
            .collect();
        if held.len() == usize::from(n) + 1 {
            return Ok(port);
        }
    }
    bail!("no run of {} free ports", n + 1)
}

/// A port base above `above` such that `base + n` is a free loopback port
/// for every node id `n` in `nodes` (checked by binding them all at once,
/// then released). The proxy requires the base above its bootstrap port.
fn free_port_base(nodes: &[i32], above: u16) -> Result<u16> {
    let (Some(&low), Some(&high)) = (nodes.iter().min(), nodes.iter().max()) else {
        bail!("no node ids");
    };
    for _ in 0..500 {
        // Anchor the lowest node at a free port.
        let first = i32::from(free_port()?);
        let base = first - low;
        if base <= i32::from(above) || base + high > i32::from(u16::MAX) {
            continue;
        }
        let held: std::io::Result<Vec<TcpListener>> = nodes
            .iter()
            .map(|n| TcpListener::bind(("127.0.0.1", (base + n) as u16)))
            .collect();
        if held.is_ok() {
            return u16::try_from(base).context("port base");
        }
    }
    // The free ports can all lie below `above` (a bootstrap port near the
    // top of the range): scan upwards from it instead.
    for base in (i32::from(above) + 1)..=(i32::from(u16::MAX) - high) {
        if base + low <= i32::from(above) {
            continue;
        }
        let held: std::io::Result<Vec<TcpListener>> = nodes
            .iter()
            .map(|n| TcpListener::bind(("127.0.0.1", (base + n) as u16)))
            .collect();
        if held.is_ok() {
            return u16::try_from(base).context("port base");
        }
    }
    bail!("found no port base with free ports for nodes {nodes:?}")
}

/// A running proxy process; killed on drop.
pub struct ProxyProcess {
    child: Child,
    pub bootstrap: String,
    pub admin: String,
    pub port_base: u16,
    logs: Arc<Mutex<Vec<String>>>,
    /// How it was started, so [`ProxyProcess::restart`] can start it again
    /// on the same ports.
    spec: Spec,
}

/// Everything [`ProxyProcess::spawn_with`] needs to start a proxy.
#[derive(Clone)]
struct Spec {
    upstream: String,
    extra: Vec<(String, String)>,
    listen: u16,
    port_base: Option<u16>,
    admin: u16,
    wait_for_state: bool,
}

/// One link's variables (names without the prefix): link `name` (client
/// id `mirror-<name>`) mirroring `topics` from the cluster `source`.
pub fn link_env(name: &str, source: &str, topics: &str) -> Vec<(String, String)> {
    let upper = name.to_uppercase();
    vec![
        ("LINKS".into(), name.into()),
        (format!("LINK_{upper}_SOURCE_CLUSTER_ID"), source.into()),
        (format!("LINK_{upper}_TOPICS"), topics.into()),
    ]
}

/// [`ProxyProcess::start`] with variables built as owned strings (e.g. by
/// [`link_env`]).
pub fn start_with(upstream: &str, env: &[(String, String)]) -> Result<ProxyProcess> {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    ProxyProcess::start(upstream, &env)
}

impl ProxyProcess {
    /// Start a proxy in front of `upstream`, with extra `MIRROR_PROXY_*`
    /// variables (names without the prefix). Node 1 (the harness's broker)
    /// gets a free proxy port.
    pub fn start(upstream: &str, extra: &[(&str, &str)]) -> Result<ProxyProcess> {
        ProxyProcess::start_for_nodes(upstream, &[1], extra)
    }

    /// [`ProxyProcess::start`] with one link, `x` (client id `mirror-x`),
    /// mirroring `topics` from the cluster `source`, and `extra` settings.
    pub fn with_link_x(
        upstream: &str,
        source: &kafka_mirror_proxy::mirror::pid::ClusterId,
        topics: &str,
        extra: &[(&str, &str)],
    ) -> Result<ProxyProcess> {
        let source = source.to_string();
        let mut vars = vec![
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", source.as_str()),
            ("LINK_X_TOPICS", topics),
        ];
        vars.extend_from_slice(extra);
        ProxyProcess::start(upstream, &vars)
    }

    /// [`ProxyProcess::start`] for brokers with the node ids `nodes`: the
    /// port base is chosen so that every one of them gets a free proxy port
    /// (`upstream` may list several brokers, comma-separated).
    pub fn start_for_nodes(
        upstream: &str,
        nodes: &[i32],
        extra: &[(&str, &str)],
    ) -> Result<ProxyProcess> {
        // A bootstrap port at the very top leaves no room above it for the
        // nodes: pick another one then.
        let mut last = None;
        for _ in 0..20 {
            let listen = free_port()?;
            match free_port_base(nodes, listen) {
                Ok(port_base) => return Self::spawn(upstream, extra, listen, Some(port_base)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("no ports for nodes {nodes:?}")))
    }

    /// Like [`ProxyProcess::start`], but with links does not wait for the
    /// state topic to load (for tests of an unloaded state topic).
    /// Default port layout (node n at the bootstrap port + 1 + n).
    pub fn start_unloaded(upstream: &str, extra: &[(&str, &str)]) -> Result<ProxyProcess> {
        let listen = free_port_run(2)?;
        Self::spawn_with(upstream, extra, listen, None, false)
    }

    /// Start a proxy that leaves `MIRROR_PROXY_BROKER_PORT_BASE` at its
    /// default (node n at the bootstrap port + 1 + n; nodes 0 and 1 free).
    pub fn start_default_ports(upstream: &str, extra: &[(&str, &str)]) -> Result<ProxyProcess> {
        let listen = free_port_run(2)?;
        Self::spawn(upstream, extra, listen, None)
    }

    fn spawn(
        upstream: &str,
        extra: &[(&str, &str)],
        listen: u16,
        port_base: Option<u16>,
    ) -> Result<ProxyProcess> {
        Self::spawn_with(upstream, extra, listen, port_base, true)
    }

    fn spawn_with(
        upstream: &str,
        extra: &[(&str, &str)],
        listen: u16,
        port_base: Option<u16>,
        wait_for_state: bool,
    ) -> Result<ProxyProcess> {
        // Not a port the proxy is about to bind for its listeners: the OS
        // may hand out a port freed a moment ago twice.
        let base = port_base.unwrap_or(listen.saturating_add(1));
        let mut admin = free_port()?;
        for _ in 0..100 {
            let clashes = admin == listen || (base..=base.saturating_add(16)).contains(&admin);
            if !clashes {
                break;
            }
            admin = free_port()?;
        }
        let spec = Spec {
            upstream: upstream.to_string(),
            extra: extra
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            listen,
            port_base,
            admin,
            wait_for_state,
        };
        Self::launch(spec, Duration::from_secs(30), Duration::from_secs(60))
    }

    /// Starts the process `spec` describes and waits up to `ready` for
    /// "proxy ready" and, with links, up to `loaded` for the state topic.
    fn launch(spec: Spec, ready: Duration, loaded: Duration) -> Result<ProxyProcess> {
        let mut cmd = Command::new(proxy_bin());
        cmd.arg("run")
            .env("MIRROR_PROXY_BOOTSTRAP_SERVERS", &spec.upstream)
            .env("MIRROR_PROXY_LISTEN", format!("127.0.0.1:{}", spec.listen))
            .env(
                "MIRROR_PROXY_ADMIN_LISTEN",
                format!("127.0.0.1:{}", spec.admin),
            )
            .env("RUST_LOG", "info,kafka_mirror_proxy=debug")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some(base) = spec.port_base {
            cmd.env("MIRROR_PROXY_BROKER_PORT_BASE", base.to_string());
        }
        for (k, v) in &spec.extra {
            cmd.env(format!("MIRROR_PROXY_{k}"), v);
        }
        let mut child = cmd.spawn().context("spawning kafka-mirror-proxy")?;
        let logs = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().context("proxy stderr")?;
        let sink = Arc::clone(&logs);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if std::env::var_os("PROXY_TEST_ECHO").is_some() {
                    eprintln!("[proxy] {line}");
                }
                if let Ok(mut l) = sink.lock() {
                    l.push(line);
                }
            }
        });
        let mut proxy = ProxyProcess {
            child,
            bootstrap: format!("127.0.0.1:{}", spec.listen),
            admin: format!("127.0.0.1:{}", spec.admin),
            port_base: spec.port_base.unwrap_or(spec.listen + 1),
            logs,
            spec,
        };
        proxy.wait_for_log("proxy ready", ready)?;
        if proxy.spec.wait_for_state && proxy.spec.extra.iter().any(|(k, _)| k == "LINKS") {
            // Link Produce requests get a retriable error until then.
            proxy.wait_for_log("state topic loaded", loaded)?;
        }
        Ok(proxy)
    }

    /// SIGKILL, as a crash would, and reap the process.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Starts the proxy again with the same configuration and ports
    /// (bootstrap, node ports, admin), after [`ProxyProcess::kill`] or an
    /// exit; waits up to `timeout` for it to be ready and, with links, for
    /// its state topic. The log starts empty.
    pub fn restart(&mut self, timeout: Duration) -> Result<()> {
        if self.child.try_wait()?.is_none() {
            self.kill()?;
        }
        *self = Self::launch(self.spec.clone(), timeout, timeout)?;
        Ok(())
    }

    /// The proxy address clients are told for broker `node`.
    pub fn node_address(&self, node: i32) -> String {
        format!("127.0.0.1:{}", i32::from(self.port_base) + node)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal (`TERM`, `INT`, ...) to the process.
    pub fn signal(&self, name: &str) -> Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()?;
        if !status.success() {
            bail!("kill -{name} {} failed: {status}", self.child.id());
        }
        Ok(())
    }

    /// The exit status, once the process has exited within `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<Option<ExitStatus>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A line of /proc/PID/status in kB (`VmRSS`, `VmData`, ...).
    pub fn status_kb(&self, field: &str) -> Result<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))?;
        text.lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("no {field} in /proc/{}/status", self.child.id()))
    }

    pub fn logs(&self) -> String {
        self.logs.lock().map(|l| l.join("\n")).unwrap_or_default()
    }

    /// Wait until a log line contains `needle`; fail with the log if the
    /// process exits or the time runs out.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.logs().contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.child.try_wait()? {
                std::thread::sleep(Duration::from_millis(200));
                bail!(
                    "proxy exited ({status}) before logging {needle:?}:\n{}",
                    self.logs()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "proxy did not log {needle:?} within {timeout:?}:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// How many of its log lines hold `needle`, once one does (waiting at
    /// most `timeout`: the log is read from stderr by a thread that can lag
    /// what the proxy already counts in its metrics).
    pub fn log_lines_once_logged(&mut self, needle: &str, timeout: Duration) -> Result<usize> {
        self.wait_for_log(needle, timeout)?;
        Ok(self.logs().lines().filter(|l| l.contains(needle)).count())
    }

    /// GET a path of the admin endpoint; returns (status line, body).
    pub fn admin_get(&self, path: &str) -> Result<(String, String)> {
        self.admin_request("GET", path, "")
    }

    /// POST `body` (JSON, may be empty) to a path of the admin endpoint;
    /// returns (status line, body).
    pub fn admin_post(&self, path: &str, body: &str) -> Result<(String, String)> {
        self.admin_request("POST", path, body)
    }

    fn admin_request(&self, method: &str, path: &str, body: &str) -> Result<(String, String)> {
        http_request(&self.admin, method, path, body)
    }

    /// Value of one metric sample (`name{labels}`), 0 when absent.
    pub fn metric(&self, sample: &str) -> Result<i64> {
        let (_, body) = self.admin_get("/metrics")?;
        Ok(body
            .lines()
            .find_map(|l| {
                l.strip_prefix(sample)
                    .and_then(|rest| rest.trim().parse().ok())
            })
            .unwrap_or(0))
    }

    /// Wait until a metric sample reaches `at_least`, returning its value;
    /// fail when `timeout` passes first. The proxy counts an event after it
    /// acted on it (an alert sent, a connection closed), so a client can
    /// see the act before the count.
    pub fn wait_metric(&self, sample: &str, at_least: i64, timeout: Duration) -> Result<i64> {
        let deadline = Instant::now() + timeout;
        loop {
            let v = self.metric(sample)?;
            if v >= at_least {
                return Ok(v);
            }
            if Instant::now() > deadline {
                bail!("{sample} is {v} after {timeout:?}, expected at least {at_least}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kafka-mirror-proxy ARGS...` (this build's binary) run to its end: its
/// standard output, or an error with its status and standard error.
pub fn cli_output(args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kafka-mirror-proxy"))
        .args(args)
        .output()
        .with_context(|| format!("running kafka-mirror-proxy {args:?}"))?;
    anyhow::ensure!(
        out.status.success(),
        "kafka-mirror-proxy {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// One HTTP/1.1 request to `addr` (an admin endpoint), a JSON `body`;
/// returns (status line, body).
pub fn http_request(addr: &str, method: &str, path: &str, body: &str) -> Result<(String, String)> {
    let answer = super::http::request(
        addr,
        method,
        path,
        "Content-Type: application/json\r\n",
        body,
        Duration::from_secs(120),
    )?;
    Ok((answer.status, answer.body))
}
