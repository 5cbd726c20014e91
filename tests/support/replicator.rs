//! The replicator, `kafka-mirror-proxy replicate`: in-process through the
//! library's `replicate::run` (for tests that only need its report), or as
//! the binary's subcommand (for tests that kill it).

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use kafka_mirror_proxy::client::Client;
use kafka_mirror_proxy::config::replicator::ReplicatorConfig;
use kafka_mirror_proxy::replicate::{self, Report};

use super::crate_client::client;
use super::kafka::{KafkaCluster, KafkaOptions};
use super::proxy::{link_env, start_with, ProxyProcess};

/// The binary, ready for `replicate` flags.
pub fn replicator_command() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_kafka-mirror-proxy"));
    c.arg("replicate");
    c
}

/// Settings copying `topics` (names or patterns, comma-separated) from
/// `source` into `destination` as the link whose replicator sends
/// `client_id` (`mirror-<link>`), until caught up, with quick retries and
/// no admin listener.
pub fn config(source: &str, destination: &str, topics: &str, client_id: &str) -> ReplicatorConfig {
    // Its log lines go with the test's output (shown when it fails).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("kafka_mirror_proxy=info")),
        )
        .with_test_writer()
        .try_init();
    let link = client_id.strip_prefix("mirror-").unwrap_or(client_id);
    let mut c = ReplicatorConfig::new(source, destination, link, topics);
    c.client_id = client_id.to_string();
    c.transactional_id = client_id.to_string();
    c.group_id = format!("replicator.{client_id}");
    c.until_caught_up = true;
    c.retry_backoff = Duration::from_millis(50);
    c.retry_backoff_max = Duration::from_secs(1);
    c.discovery_interval = Duration::from_secs(2);
    c
}

/// What a replicator drill copies between: a source and a destination
/// broker (default settings) and the crate's client of each, as (source,
/// destination, source client, destination client).
pub fn clusters() -> Result<(KafkaCluster, KafkaCluster, Client, Client)> {
    let source = KafkaCluster::start(KafkaOptions::default())?;
    let destination = KafkaCluster::start(KafkaOptions::default())?;
    let (src, dst) = (
        client(&source.bootstrap()),
        client(&destination.bootstrap()),
    );
    Ok((source, destination, src, dst))
}

/// A proxy in front of `destination` whose link `a` mirrors `topics`
/// from `source`: where a drill's replicator writes.
pub fn link_a_proxy(
    source: &KafkaCluster,
    destination: &KafkaCluster,
    topics: &str,
) -> Result<ProxyProcess> {
    start_with(
        &destination.bootstrap(),
        &link_env("a", source.cluster_id(), topics),
    )
}

/// Runs the replicator until it returns.
pub fn run(rt: &tokio::runtime::Runtime, config: ReplicatorConfig) -> Result<Report> {
    let (_never, shutdown) = tokio::sync::watch::channel(false);
    let what = format!("{config:?}");
    rt.block_on(replicate::run(config, shutdown))
        .with_context(|| format!("replicating with {what}"))
}

/// A replicator process whose output goes to `<name>.log` and
/// `<name>.out` in a test's folder; killed when dropped.
pub struct Process {
    pub child: std::process::Child,
    pub log: std::path::PathBuf,
}

impl Process {
    /// Starts `command` (a [`replicator_command`] with its flags).
    pub fn spawn(mut command: Command, dir: &std::path::Path, name: &str) -> Result<Process> {
        let log = dir.join(format!("{name}.log"));
        let child = command
            .stdout(std::fs::File::create(dir.join(format!("{name}.out")))?)
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting replicator {name}"))?;
        Ok(Process { child, log })
    }

    /// Starts `command` with an admin listener on a free loopback port:
    /// the process and that address (for its /metrics and probes).
    pub fn spawn_with_admin(
        mut command: Command,
        dir: &std::path::Path,
        name: &str,
    ) -> Result<(Process, String)> {
        let admin = format!("127.0.0.1:{}", super::ports::free_port()?);
        command.args(["--admin-listen", &admin]);
        Ok((Process::spawn(command, dir, name)?, admin))
    }

    /// The last 40 lines of its log.
    pub fn log_tail(&self) -> String {
        super::tools::tail_str(&std::fs::read_to_string(&self.log).unwrap_or_default(), 40)
    }

    /// An error (with its log) if it exited.
    pub fn alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "the replicator exited ({status}); its log:\n{}",
                self.log_tail()
            );
        }
        Ok(())
    }

    /// While waiting for `what` until `deadline`: an error, with its log, if
    /// it exited or the deadline passed.
    pub fn still_waiting(&mut self, what: &str, deadline: std::time::Instant) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{what}: the replicator exited ({status}); its log:\n{}",
                self.log_tail()
            );
        }
        anyhow::ensure!(
            std::time::Instant::now() <= deadline,
            "{what}: not in time; the replicator's log:\n{}",
            self.log_tail()
        );
        Ok(())
    }

    /// SIGKILL, and reaped.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// `kill -<name>`.
    pub fn signal(&self, name: &str) -> Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()?;
        anyhow::ensure!(status.success(), "kill -{name}: {status}");
        Ok(())
    }

    /// Its exit status, waiting at most `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<std::process::ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the replicator did not exit within {timeout:?}; its log:\n{}",
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A replicator process with an admin listener (for its /metrics and
/// probes), its output in `replicator-<run>.log` and `.out` in a test's
/// folder.
pub struct Replicator {
    pub p: Process,
    pub admin: String,
}

impl Replicator {
    /// Starts `command` (a [`replicator_command`] with the test's flags) at
    /// the pace the broker-backed tests share: topics discovered every
    /// second, a failed request retried after 50 ms.
    pub fn spawn(mut command: Command, dir: &std::path::Path, run: usize) -> Result<Replicator> {
        command
            .args(["--discovery-interval-ms", "1000"])
            .args(["--retry-backoff-ms", "50"]);
        let (p, admin) = Process::spawn_with_admin(command, dir, &format!("replicator-{run}"))?;
        Ok(Replicator { p, admin })
    }

    /// Its `/metrics` page (an error unless answered 200).
    pub fn metrics(&self) -> Result<String> {
        let answer = super::http::get(&self.admin, "/metrics")?;
        let code = answer.code()?;
        anyhow::ensure!(code == 200, "/metrics answered {code}");
        Ok(answer.body)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
