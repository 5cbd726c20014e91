//! The `kafka-mirror-proxy` binary: `run` (the default) starts the proxy from
//! `MIRROR_PROXY_*` variables and, on SIGTERM or SIGINT, drains it (no new
//! connections or requests, responses in flight delivered, bounded by
//! `SHUTDOWN_TIMEOUT_MS`) and exits 0; `map` and `unmap` read producer ids
//! the way the proxy writes them, for operators reading a log dump.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use kafka_mirror_proxy::cli;
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::config::replicator::{default_group_id, DEFAULT_OFFSETS_TOPIC};
use kafka_mirror_proxy::config::{Config, LogFormat, DEFAULT_STATE_TOPIC};
use kafka_mirror_proxy::mirror::pid::{cluster_hash, map_pid, unmap_pid, ClusterId, Mapping};

#[derive(Parser)]
#[command(
    name = "kafka-mirror-proxy",
    version,
    about = "Kafka proxy that remaps mirrored producer ids"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (configured from MIRROR_PROXY_* variables; see README).
    Run,
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
    /// Copy a source cluster's topics through the proxy (configured from
    /// MIRROR_REPLICATOR_* variables or flags: `replicate --help`). Exit
    /// code 0 when stopped or caught up, 1 on an error, 2 for the
    /// configuration, 3 when the proxy fenced the link.
    #[command(disable_help_flag = true)]
    Replicate {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command.unwrap_or(Command::Run) {
        Command::Links { json } => {
            return admin_command(|c| async move { cli::links(&c, json).await })
        }
        Command::Failover {
            name,
            wait,
            dry_run,
            max_delay,
            force,
            json,
        } => {
            if max_delay.is_some_and(|d| !d.is_finite() || d < 0.0) {
                eprintln!("kafka-mirror-proxy: --max-delay must be a number of seconds, 0 or more");
                return ExitCode::from(cli::EXIT_ERROR);
            }
            let checks = cli::FailoverChecks {
                dry_run,
                max_delay,
                force,
            };
            return admin_command(|c| async move {
                cli::failover(&c, &name, Duration::from_secs(wait), checks, json).await
            });
        }
        Command::Start {
            name,
            source_cluster_id,
            json,
        } => {
            return admin_command(|c| async move {
                cli::start(&c, &name, source_cluster_id.as_deref(), json).await
            })
        }
        Command::Failback(args) => {
            return match failback(args) {
                Ok(code) => ExitCode::from(code),
                Err(e) => {
                    eprintln!("kafka-mirror-proxy: {e:#}");
                    ExitCode::from(cli::EXIT_ERROR)
                }
            };
        }
        Command::Run => run(),
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
        } => offsets(OffsetsArgs {
            bootstrap_server,
            progress_group: progress_group.unwrap_or_else(|| default_group_id(&link)),
            link,
            offsets_topic,
            one: topic.zip(partition).zip(offset),
            group: group.zip(source_bootstrap_server),
        }),
        Command::Replicate { args } => return replicate(args),
        Command::Map {
            source_cluster_id,
            pid,
        } => map(&source_cluster_id, pid),
        Command::Unmap {
            pid,
            bootstrap_server,
            state_topic,
        } => unmap(pid).and_then(|()| match bootstrap_server {
            Some(b) => unmap_from_state(pid, &b, &state_topic),
            None => Ok(()),
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kafka-mirror-proxy: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Run one admin API command; its exit code (see `cli`).
fn admin_command<F, Fut>(command: F) -> ExitCode
where
    F: FnOnce(cli::AdminClient) -> Fut,
    Fut: std::future::Future<Output = Result<u8, cli::CliError>>,
{
    let result = cli::AdminClient::from_env().and_then(|client| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| cli::CliError::Http {
                method: String::new(),
                path: String::new(),
                source: cli::HttpError::Runtime(e),
            })?
            .block_on(command(client))
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("kafka-mirror-proxy: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn map(source_cluster_id: &str, pid: i64) -> anyhow::Result<()> {
    let id: ClusterId = source_cluster_id
        .parse()
        .with_context(|| format!("--source-cluster-id {source_cluster_id:?}"))?;
    let region = cluster_hash(&id);
    match map_pid(region, pid) {
        Mapping::Mapped(mapped) => println!("{mapped}"),
        Mapping::Unchanged => println!("{pid}"),
        Mapping::Unplaceable(why) => anyhow::bail!("producer id {pid} cannot be mapped: {why}"),
    }
    Ok(())
}

fn unmap(pid: i64) -> anyhow::Result<()> {
    let Some((region, identity)) = unmap_pid(pid) else {
        println!("producer id {pid} is not a mapped id (mapped ids are negative and not -1)");
        return Ok(());
    };
    println!("region   0x{region:08x}");
    println!("identity {identity}");
    let links = Config::links_from_env().context("reading the link configuration")?;
    match links.by_region(region) {
        Some(link) => println!(
            "link     {} (source cluster {})",
            link.name(),
            link.configured_source_cluster_id()
        ),
        None if links.is_empty() => {
            println!("link     (no links configured in MIRROR_PROXY_LINKS)")
        }
        None => println!(
            "link     none of the configured links ({})",
            links.names().join(", ")
        ),
    }
    Ok(())
}

struct OffsetsArgs {
    bootstrap_server: String,
    link: String,
    offsets_topic: String,
    progress_group: String,
    /// ((topic, partition), offset)
    one: Option<((String, i32), i64)>,
    /// (group, source bootstrap)
    group: Option<(String, String)>,
}

/// `kafka-mirror-proxy offsets`: one line per partition, `topic partition
/// source-offset destination-offset` (and why, when it is not exact).
fn offsets(args: OffsetsArgs) -> anyhow::Result<()> {
    use kafka_mirror_proxy::mirror::translation::Translation;
    use kafka_mirror_proxy::replicate::translation;
    let destination = Client::new(ClientConfig::plain(&args.bootstrap_server));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let wanted: Vec<((String, i32), i64)> = match (&args.one, &args.group) {
        (Some(one), None) => vec![one.clone()],
        (None, Some(_)) => Vec::new(),
        _ => anyhow::bail!(
            "give either --topic, --partition and --offset, or --group and --source-bootstrap-server"
        ),
    };
    let translated = runtime
        .block_on(async {
            match &args.group {
                Some((group, source)) => {
                    translation::translate_group(
                        &destination,
                        &Client::new(ClientConfig::plain(source)),
                        &args.offsets_topic,
                        &args.link,
                        &args.progress_group,
                        group,
                    )
                    .await
                }
                None => {
                    translation::translate(
                        &destination,
                        &args.offsets_topic,
                        &args.link,
                        &args.progress_group,
                        &wanted,
                    )
                    .await
                }
            }
        })
        .with_context(|| format!("reading {}", args.offsets_topic))?;
    for t in translated {
        let (offset, note) = match t.destination {
            Translation::Exact(o) => (o.to_string(), ""),
            Translation::Unknown => ("-".to_string(), " (older than the translation holds)"),
            Translation::NotYet => ("-".to_string(), " (not copied yet)"),
        };
        println!("{} {} {} {offset}{note}", t.topic, t.partition, t.source);
    }
    Ok(())
}

#[derive(clap::Args)]
struct FailbackArgs {
    /// The failback link on A's proxy.
    #[arg(long)]
    link: String,
    /// The link on B's proxy that mirrored A into B and failed over.
    #[arg(long)]
    reverse_of: String,
    /// Cluster A: its brokers (or A's proxy), host:port,...
    #[arg(long)]
    bootstrap_server: String,
    /// Cluster B, host:port,...
    #[arg(long)]
    source_bootstrap_server: String,
    /// B's proxy's state topic.
    #[arg(long, default_value = DEFAULT_STATE_TOPIC)]
    state_topic: String,
    /// The replicators' OFFSETS_TOPIC (on both clusters).
    #[arg(long, default_value = DEFAULT_OFFSETS_TOPIC)]
    offsets_topic: String,
    /// REVERSE_OF's replicator's GROUP_ID (default
    /// replicator.mirror-<REVERSE_OF>), on B.
    #[arg(long)]
    forward_group: Option<String>,
    /// LINK's replicator's GROUP_ID (default replicator.mirror-<LINK>),
    /// on A.
    #[arg(long)]
    progress_group: Option<String>,
    /// Report and change nothing (no admin API needed).
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    json: bool,
}

/// `kafka-mirror-proxy failback`: the report, then (without --dry-run)
/// the history, the starting points and the link's start.
fn failback(args: FailbackArgs) -> anyhow::Result<u8> {
    use kafka_mirror_proxy::replicate::failback::{self, Failback};
    let forward_group =
        (args.forward_group.clone()).unwrap_or_else(|| default_group_id(&args.reverse_of));
    let progress_group =
        (args.progress_group.clone()).unwrap_or_else(|| default_group_id(&args.link));
    let a = Client::new(ClientConfig::plain(&args.bootstrap_server));
    let b = Client::new(ClientConfig::plain(&args.source_bootstrap_server));
    let f = Failback {
        link: &args.link,
        reverse_of: &args.reverse_of,
        a: &a,
        b: &b,
        state_topic: &args.state_topic,
        offsets_topic: &args.offsets_topic,
        forward_group: &forward_group,
        progress_group: &progress_group,
    };
    let admin = if args.dry_run {
        None
    } else {
        Some(cli::AdminClient::from_env()?)
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    runtime.block_on(async {
        // Nothing is written while the link could be copying: it must be
        // fenced (PREPARING, or STOPPED after a failover of its own).
        if let Some(admin) = &admin {
            let state = cli::link_state(admin, &args.link).await?;
            if state != "PREPARING" && state != "STOPPED" {
                eprintln!(
                    "kafka-mirror-proxy: link '{}' is {state} on A's proxy: a failback starts a PREPARING (or STOPPED) link (MIRROR_PROXY_LINK_<NAME>_INITIAL_STATE=PREPARING)",
                    args.link
                );
                return Ok(cli::EXIT_REFUSED);
            }
        }
        let plan = match failback::plan(&f).await {
            Ok(plan) => plan,
            Err(e) if e.is_refusal() => {
                eprintln!("kafka-mirror-proxy: {}", kafka_mirror_proxy::error_chain(&e));
                return Ok(cli::EXIT_REFUSED);
            }
            Err(e) => return Err(e.into()),
        };
        if args.json {
            println!("{}", serde_json::to_string_pretty(&cli::failback_json(&plan))?);
        } else {
            print!("{}", cli::render_failback(&plan));
        }
        if plan.unresolved() > 0 {
            eprintln!(
                "kafka-mirror-proxy: {} partition(s) unresolved: nothing written",
                plan.unresolved()
            );
            return Ok(cli::EXIT_REFUSED);
        }
        let Some(admin) = admin else {
            return Ok(cli::EXIT_OK);
        };
        failback::apply(&f, &plan, kafka_mirror_proxy::state::now_ms()).await?;
        let code = cli::start(&admin, &args.link, None, args.json).await?;
        Ok(code)
    })
}

/// The origins of `pid` recorded in the state topic.
fn unmap_from_state(pid: i64, bootstrap: &str, topic: &str) -> anyhow::Result<()> {
    use kafka_mirror_proxy::net::upstream::Upstream;
    let bootstrap: Vec<String> = bootstrap.split(',').map(|s| s.trim().to_string()).collect();
    // The upstream settings when the MIRROR_PROXY_* variables describe them.
    let config = {
        let mut vars: std::collections::HashMap<String, String> = std::env::vars().collect();
        vars.insert("MIRROR_PROXY_BOOTSTRAP_SERVERS".into(), bootstrap.join(","));
        Config::from_vars(&vars).ok()
    };
    // With the state key, only records signed with it are read, as the
    // proxy reads them.
    let auth = config.as_ref().and_then(|c| {
        c.state_key.as_ref().map(|k| {
            kafka_mirror_proxy::state::mac::StateAuth::new(
                k.expose(),
                topic,
                c.state_key_unsigned_before,
            )
        })
    });
    let client_config = match config {
        Some(c) => ClientConfig::from_config(&c).context("upstream TLS settings")?,
        None => ClientConfig::new(
            bootstrap,
            Upstream {
                tls: None,
                server_name: None,
                timeout: Duration::from_secs(10),
            },
        ),
    };
    let client = Client::new(client_config);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let (view, names) = runtime
        .block_on(async {
            let view = kafka_mirror_proxy::state::read_view(&client, topic, auth.as_ref()).await?;
            let names: std::collections::HashMap<_, _> = client
                .metadata(None)
                .await
                .map(|m| m.topics.into_iter().map(|t| (t.topic_id, t.name)).collect())
                .unwrap_or_default();
            anyhow::Ok((view, names))
        })
        .with_context(|| format!("reading the state topic {topic}"))?;
    let origins = view.origins_of(pid);
    if origins.is_empty() {
        println!("origin   none recorded in {topic}");
    }
    for (p, o, salt) in origins {
        let topic_name = names
            .get(&p.topic_id)
            .cloned()
            .unwrap_or_else(|| p.topic_id.to_string());
        let salt = match salt {
            0 => "natural region".to_string(),
            s => format!("salt {s}"),
        };
        println!(
            "origin   {topic_name}-{}: source cluster {} producer id {} ({salt})",
            p.partition, o.source, o.pid
        );
    }
    Ok(())
}

fn run() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    init_logging(config.log_format);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.worker_threads {
        runtime.worker_threads(n);
    }
    let runtime = runtime
        .thread_name("kmp-worker")
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(kafka_mirror_proxy::run(config, signals()));
    // Do not wait for a blocking task (a DNS lookup) past the drain.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(result?)
}

/// The replicator's flags, one per variable of its table.
fn replicate_command() -> clap::Command {
    use kafka_mirror_proxy::config::replicator::{flag_name, PREFIX, VARIABLES};
    let mut command = clap::Command::new("kafka-mirror-proxy replicate").about(
        "Copy a source cluster's topics, batch by batch, through kafka-mirror-proxy into the \
         destination. Every flag is also an environment variable; a flag wins.",
    );
    for (name, default, meaning) in VARIABLES {
        let mut arg = clap::Arg::new(*name)
            .long(flag_name(name))
            .value_name("VALUE")
            .help(format!(
                "{meaning} [env: {PREFIX}{name}] [default: {default}]"
            ));
        if matches!(*default, "true" | "false") {
            arg = arg.num_args(0..=1).default_missing_value("true");
        }
        command = command.arg(arg);
    }
    command
}

fn replicate(args: Vec<String>) -> ExitCode {
    use kafka_mirror_proxy::config::replicator::{ReplicatorConfig, PREFIX, VARIABLES};
    let matches = match replicate_command()
        .try_get_matches_from(std::iter::once("replicate".to_string()).chain(args))
    {
        Ok(m) => m,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let mut vars: std::collections::HashMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .collect();
    for (name, _, _) in VARIABLES {
        if let Some(v) = matches.get_one::<String>(name) {
            vars.insert(format!("{PREFIX}{name}"), v.clone());
        }
    }
    let config = match ReplicatorConfig::from_vars(&vars) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("kafka-mirror-proxy replicate: {e}");
            return ExitCode::from(2);
        }
    };
    init_logging(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_name("kmp-replicate")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kafka-mirror-proxy replicate: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("stopping: what is in flight is answered, then the progress committed");
            let _ = stop_tx.send(true);
        });
        kafka_mirror_proxy::replicate::run(config, stop_rx).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(report) => {
            println!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            let chain = kafka_mirror_proxy::error_chain(&e);
            tracing::error!(error = %chain, "replicator stopped");
            eprintln!("kafka-mirror-proxy replicate: {chain}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| OneLine(std::io::stderr()))
        .with_ansi(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// A text log event is one line: a newline or other control character in
/// a field (a topic name or client id a client chose, an error quoting one)
/// is escaped, so that no client can forge a log line. The fmt layer writes
/// each event whole, with one `write_all`, ending in its own newline.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        let control = |b: &u8| b.is_ascii_control() && *b != b'\t';
        if !body.iter().any(control) {
            return self.0.write_all(buf);
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b if control(&b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                b => out.push(b),
            }
        }
        out.extend_from_slice(end);
        self.0.write_all(&out)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Each SIGTERM or SIGINT, as a stream: the first drains the proxy, a
/// second closes every connection at once.
fn signals() -> impl futures_util::Stream<Item = ()> {
    futures_util::stream::unfold((), |()| async {
        shutdown_signal().await;
        Some(((), ()))
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::OneLine;
    use std::io::Write;

    fn written(event: &[u8]) -> Vec<u8> {
        let mut out = OneLine(Vec::new());
        out.write_all(event).expect("write to a Vec");
        out.0
    }

    #[test]
    fn an_event_stays_one_line() {
        assert_eq!(written(b"plain line\tok\n"), b"plain line\tok\n");
        assert_eq!(
            written(b"topic 'a\nFORGED\r\n\x1b[31m'\n"),
            b"topic 'a\\nFORGED\\r\\n\\x1b[31m'\n"
        );
        assert_eq!(written(b"no newline at the end"), b"no newline at the end");
    }
}
