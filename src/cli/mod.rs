//! The operator's commands ([`Command`]): `map` and `unmap` read producer
//! ids the way the proxy writes them; `links`, `failover NAME` and `start
//! NAME` drive a running proxy through its admin API (plain HTTP/1.1 to
//! `MIRROR_PROXY_ADMIN_URL` with the bearer token
//! `MIRROR_PROXY_ADMIN_TOKEN`; tables, or the API's JSON with `--json`);
//! `offsets` reads the replicator's offset translation; `failback` fails
//! a link back (SPEC §12); and `replicate`'s flags and report
//! ([`replicator_config`], [`replicate`]), around the replicator the
//! binary runs. The binary parses the command line and calls
//! [`Command::run`]; each command prints its own output and errors and
//! gives its exit code.
//!
//! The admin API's answers are read into the API's own types
//! (`control::api`, the ones the proxy writes them from); rendering and
//! exit codes are pure functions of them (unit tested with fixed
//! documents); `AdminClient` does the I/O. `--json` prints the answer as
//! it came.
//!
//! Exit codes of the admin API commands: 0 every partition of the failover
//! completed (accepted, or refused and recorded), or a `--dry-run` found
//! nothing holding the failover back; 2 a partition failed, an instance
//! did not confirm, or the failover had not finished when `--wait` ran
//! out; 3 the API answered 404, 409 or 412 (`--max-delay` exceeded), or a
//! `--dry-run` found the failover would be refused or held back; 1 any
//! other error (connection, auth). `map`, `unmap` and `offsets` exit 2 on
//! any error; `failback` 3 when refused, 1 on an error.

use std::future::Future;
use std::time::Duration;

use crate::config::replicator::{default_group_id, DEFAULT_OFFSETS_TOPIC};
use crate::config::DEFAULT_STATE_TOPIC;
use crate::sync::error_chain;

mod admin_api;
mod failback;
mod failover;
mod links;
mod offsets;
mod pid;
mod render;
mod replicate;

pub(crate) use failback::failback_json;
pub use replicate::{replicate, replicator_config};

use admin_api::{AdminClient, CliError, HttpError};
pub use failback::FailbackArgs;
use failover::FailoverChecks;
use offsets::OffsetsArgs;

pub(crate) const EXIT_OK: u8 = 0;
pub(crate) const EXIT_ERROR: u8 = 1;
pub(crate) const EXIT_INCOMPLETE: u8 = 2;
pub(crate) const EXIT_REFUSED: u8 = 3;
/// Any error of `map`, `unmap` and `offsets`, and a bad configuration.
pub(crate) const EXIT_FAILED: u8 = 2;

/// The operator's commands, as the binary's subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Print the producer id the proxy writes for a source PID.
    Map {
        /// Source cluster id (22 characters of URL-safe base64).
        #[arg(long)]
        source_cluster_id: String,
        /// Producer id on the source cluster.
        #[arg(long, allow_hyphen_values = true)]
        pid: i64,
    },
    /// Split a mapped producer id into region and identity, and name the
    /// configured link (MIRROR_PROXY_LINKS...) whose region it is.
    Unmap {
        #[arg(long, allow_hyphen_values = true)]
        pid: i64,
        /// Destination brokers (host:port,...): also read the state topic,
        /// so a salted mapped id resolves to its origin (plain TCP; TLS and
        /// SASL from MIRROR_PROXY_UPSTREAM_* when set).
        #[arg(long)]
        bootstrap_server: Option<String>,
        /// The state topic to read with --bootstrap-server.
        #[arg(long, default_value = DEFAULT_STATE_TOPIC)]
        state_topic: String,
    },
    /// List the mirror links of a running proxy (admin API at
    /// MIRROR_PROXY_ADMIN_URL, token MIRROR_PROXY_ADMIN_TOKEN).
    Links {
        /// Print the admin API's JSON.
        #[arg(long)]
        json: bool,
    },
    /// Fail a link over and follow it until it completes. Exit code 0 when
    /// every partition completed, 2 when one failed, an instance did not
    /// confirm or --wait ran out, 3 for an unknown link, a refused
    /// transition or a replication delay above --max-delay, 1 for other
    /// errors.
    Failover {
        name: String,
        /// Seconds to follow the failover before giving up waiting (it
        /// goes on in the proxy).
        #[arg(long, default_value_t = 300)]
        wait: u64,
        /// Report what a failover would do (partitions, live instances,
        /// each partition's replication delay) and change nothing; exit 0
        /// when it would proceed, 3 when it would not.
        #[arg(long)]
        dry_run: bool,
        /// Refuse to start the failover while a partition's replication
        /// delay (as the instance asked measured it) is above this many
        /// seconds.
        #[arg(long)]
        max_delay: Option<f64>,
        /// Start the failover even with a delay above --max-delay.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
    },
    /// Translate source offsets to destination offsets: the replicator's
    /// offset translation, read from its offsets topic on the destination.
    /// Either one offset (--topic, --partition, --offset) or a source
    /// consumer group's committed offsets (--group,
    /// --source-bootstrap-server). Plain TCP.
    Offsets {
        /// Destination brokers (or the proxy), host:port,...
        #[arg(long)]
        bootstrap_server: String,
        /// The link whose translation to read.
        #[arg(long)]
        link: String,
        /// The replicator's OFFSETS_TOPIC.
        #[arg(long, default_value = DEFAULT_OFFSETS_TOPIC)]
        offsets_topic: String,
        /// The replicator's GROUP_ID (default replicator.mirror-<link>):
        /// its progress says how far the copy went.
        #[arg(long)]
        progress_group: Option<String>,
        #[arg(long)]
        topic: Option<String>,
        #[arg(long)]
        partition: Option<i32>,
        #[arg(long)]
        offset: Option<i64>,
        /// A consumer group on the source: translate its committed offsets.
        #[arg(long)]
        group: Option<String>,
        /// Source brokers, host:port,... (with --group).
        #[arg(long)]
        source_bootstrap_server: Option<String>,
    },
    /// Fail back (SPEC §12): LINK, a PREPARING link of A's proxy that is
    /// to mirror B into A, after REVERSE_OF (B's proxy's link that mirrored
    /// A into B) failed over. Reports, per partition, where A and B
    /// diverge and A's records past that point (A's records B never got:
    /// they stay in A's log, before B's records; nothing is dropped or
    /// copied twice); then writes LINK's translation history and its
    /// replicator's starting points (B's barriers) on A and starts LINK
    /// through A's admin API (MIRROR_PROXY_ADMIN_URL). Exit code 0 done (or
    /// would proceed), 3 refused (a partition's divergence cannot be told,
    /// or LINK is not PREPARING or STOPPED), 1 other errors. Plain TCP.
    Failback(FailbackArgs),
    /// Start mirroring a stopped link again.
    Start {
        name: String,
        /// Mirror from this source cluster from now on.
        #[arg(long)]
        source_cluster_id: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

impl Command {
    /// Runs the command to its end: its output on stdout, its errors on
    /// stderr (`kafka-mirror-proxy: ...`); its exit code.
    pub fn run(self) -> u8 {
        match self {
            Command::Map {
                source_cluster_id,
                pid,
            } => finish(pid::map(&source_cluster_id, pid).map(|()| EXIT_OK), |e| {
                e.exit_code()
            }),
            Command::Unmap {
                pid,
                bootstrap_server,
                state_topic,
            } => finish(
                pid::unmap(pid)
                    .and_then(|()| match bootstrap_server {
                        Some(b) => pid::unmap_from_state(pid, &b, &state_topic),
                        None => Ok(()),
                    })
                    .map(|()| EXIT_OK),
                |e| e.exit_code(),
            ),
            Command::Links { json } => admin(|c| async move { links::links(&c, json).await }),
            Command::Failover {
                name,
                wait,
                dry_run,
                max_delay,
                force,
                json,
            } => {
                if max_delay.is_some_and(|d| !d.is_finite() || d < 0.0) {
                    eprintln!(
                        "kafka-mirror-proxy: --max-delay must be a number of seconds, 0 or more"
                    );
                    return EXIT_ERROR;
                }
                let checks = FailoverChecks {
                    dry_run,
                    max_delay,
                    force,
                };
                admin(|c| async move {
                    failover::failover(&c, &name, Duration::from_secs(wait), checks, json).await
                })
            }
            Command::Start {
                name,
                source_cluster_id,
                json,
            } => admin(|c| async move {
                links::start(&c, &name, source_cluster_id.as_deref(), json).await
            }),
            Command::Offsets {
                bootstrap_server,
                link,
                offsets_topic,
                progress_group,
                topic,
                partition,
                offset,
                group,
                source_bootstrap_server,
            } => {
                let args = OffsetsArgs {
                    bootstrap_server,
                    progress_group: progress_group.unwrap_or_else(|| default_group_id(&link)),
                    link,
                    offsets_topic,
                    one: topic.zip(partition).zip(offset),
                    group: group.zip(source_bootstrap_server),
                };
                finish(offsets::offsets(&args).map(|()| EXIT_OK), |e| e.exit_code())
            }
            Command::Failback(args) => finish(failback::failback(&args), |e| e.exit_code()),
        }
    }
}

/// A command's exit code: its own, or its error's, the error printed
/// whole (each cause once).
fn finish<E: std::error::Error>(result: Result<u8, E>, exit_code: impl Fn(&E) -> u8) -> u8 {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kafka-mirror-proxy: {}", error_chain(&e));
            exit_code(&e)
        }
    }
}

/// The runtime of a command: one thread, the command's own.
fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
}

/// Runs one admin API command, with the client `MIRROR_PROXY_ADMIN_URL`
/// and `MIRROR_PROXY_ADMIN_TOKEN` describe; its exit code.
fn admin<F, Fut>(command: F) -> u8
where
    F: FnOnce(AdminClient) -> Fut,
    Fut: Future<Output = Result<u8, CliError>>,
{
    let result = AdminClient::from_env().and_then(|client| {
        runtime()
            .map_err(|e| CliError::Http {
                method: String::new(),
                path: String::new(),
                source: HttpError::Runtime(e),
            })?
            .block_on(command(client))
    });
    match result {
        Ok(code) => code,
        Err(e) => {
            // The admin API's errors quote their causes.
            eprintln!("kafka-mirror-proxy: {e}");
            e.exit_code()
        }
    }
}

/// Documents as the admin API answers them, for the tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    use crate::control::api::LinkReport;

    /// A link as the proxy answers it, finished.
    pub(crate) fn done_link_json() -> Value {
        json!({
            "name": "east", "state": "STOPPED", "since_ms": 1_700_000_000_000i64,
            "source_cluster_id": "MkU3OEVBNTcwNTJENDM2Qg",
            "failover": {
                "id": 1_700_000_000_000i64, "started_ms": 1_700_000_000_000i64,
                "finished_ms": 1_700_000_001_000i64,
                "complete": true, "partitions_total": 2, "partitions_done": 2,
                "partitions": [
                    {"topic": "orders", "partition": 0, "result": "refused", "error_code": 87,
                     "message": "INVALID_RECORD", "log_end_offset": 42, "expired_producers": 3},
                    {"topic": "orders", "partition": 1, "result": "accepted", "error_code": 0,
                     "message": null, "log_end_offset": 7, "expired_producers": 0}
                ],
                "unconfirmed_instances": [], "error": null
            },
            "counters": {"local_writes_refused": 5, "link_requests_refused": 0,
                "connections_fenced": 1, "open_link_connections": 0}
        })
    }

    /// `doc` read as the CLI reads an answer.
    pub(crate) fn read<T: DeserializeOwned>(doc: Value) -> T {
        T::deserialize(&doc).expect("the document reads as the API's type")
    }

    pub(crate) fn done_link() -> LinkReport {
        read(done_link_json())
    }
}
