//! The `kafka-mirror-proxy` binary: `run` (the default) starts the proxy from
//! `MIRROR_PROXY_*` variables and, on SIGTERM or SIGINT, drains it (no new
//! connections or requests, responses in flight delivered, bounded by
//! `SHUTDOWN_TIMEOUT_MS`) and exits 0; `map` and `unmap` read producer ids
//! the way the proxy writes them, for operators reading a log dump.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use kafka_mirror_proxy::cli;
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::config::replicator::DEFAULT_OFFSETS_TOPIC;
use kafka_mirror_proxy::config::{Config, LogFormat, DEFAULT_STATE_TOPIC};
use kafka_mirror_proxy::control::members::{self, Members};
use kafka_mirror_proxy::metrics::Metrics;
use kafka_mirror_proxy::mirror::pid::{cluster_hash, map_pid, unmap_pid, ClusterId, Mapping};
use kafka_mirror_proxy::net::tasks::Tasks;
use kafka_mirror_proxy::proxy::Proxy;
use kafka_mirror_proxy::state::StateStore;

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
    Failback {
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
    },
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
        Command::Failback {
            link,
            reverse_of,
            bootstrap_server,
            source_bootstrap_server,
            state_topic,
            offsets_topic,
            forward_group,
            progress_group,
            dry_run,
            json,
        } => {
            let args = FailbackArgs {
                forward_group: forward_group
                    .unwrap_or_else(|| format!("replicator.mirror-{reverse_of}")),
                progress_group: progress_group
                    .unwrap_or_else(|| format!("replicator.mirror-{link}")),
                link,
                reverse_of,
                bootstrap_server,
                source_bootstrap_server,
                state_topic,
                offsets_topic,
                dry_run,
                json,
            };
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
            progress_group: progress_group.unwrap_or_else(|| format!("replicator.mirror-{link}")),
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
                reason: format!("starting the runtime: {e}"),
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

/// A plain-TCP client of `bootstrap` (host:port,...).
fn plain_client(bootstrap: &str) -> Client {
    use kafka_mirror_proxy::net::upstream::Upstream;
    let bootstrap: Vec<String> = bootstrap.split(',').map(|s| s.trim().to_string()).collect();
    Client::new(ClientConfig::new(
        bootstrap,
        Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(10),
        },
    ))
}

/// `kafka-mirror-proxy offsets`: one line per partition, `topic partition
/// source-offset destination-offset` (and why, when it is not exact).
fn offsets(args: OffsetsArgs) -> anyhow::Result<()> {
    use kafka_mirror_proxy::mirror::translation::Translation;
    use kafka_mirror_proxy::replicate::translation;
    let destination = plain_client(&args.bootstrap_server);
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
                        &plain_client(source),
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

struct FailbackArgs {
    link: String,
    reverse_of: String,
    bootstrap_server: String,
    source_bootstrap_server: String,
    state_topic: String,
    offsets_topic: String,
    forward_group: String,
    progress_group: String,
    dry_run: bool,
    json: bool,
}

/// `kafka-mirror-proxy failback`: the report, then (without --dry-run)
/// the history, the starting points and the link's start.
fn failback(args: FailbackArgs) -> anyhow::Result<u8> {
    use kafka_mirror_proxy::replicate::failback::{self, Failback};
    let a = plain_client(&args.bootstrap_server);
    let b = plain_client(&args.source_bootstrap_server);
    let f = Failback {
        link: &args.link,
        reverse_of: &args.reverse_of,
        a: &a,
        b: &b,
        state_topic: &args.state_topic,
        offsets_topic: &args.offsets_topic,
        forward_group: &args.forward_group,
        progress_group: &args.progress_group,
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
        failback::apply(&f, &plan, now_ms()).await?;
        let code = cli::start(&admin, &args.link, None, args.json).await?;
        Ok(code)
    })
}

/// The admin API's failback (`GET`/`POST /links/{name}/failback`) for the
/// links with failback settings: A is this proxy's upstream cluster (its
/// TLS settings), B the link's source brokers over plain TCP; the topics
/// and groups are the defaults `kafka-mirror-proxy failback` uses, the
/// state topic this proxy's.
struct FailbackService {
    a: Client,
    /// Per failback link: the link it fails back, and B.
    links: std::collections::HashMap<String, (String, Client)>,
    state_topic: String,
}

impl FailbackService {
    fn new(config: &Config) -> anyhow::Result<Option<FailbackService>> {
        let links: std::collections::HashMap<String, (String, Client)> = config
            .links
            .iter()
            .filter_map(|l| {
                let f = l.failback()?;
                Some((
                    l.name().to_string(),
                    (
                        f.reverse_of.clone(),
                        plain_client(&f.source_bootstrap_servers.join(",")),
                    ),
                ))
            })
            .collect();
        if links.is_empty() {
            return Ok(None);
        }
        let mut a = ClientConfig::from_config(config).context("upstream TLS settings")?;
        a.client_id = "kafka-mirror-proxy-failback".into();
        Ok(Some(FailbackService {
            a: Client::new(a),
            links,
            state_topic: config.state_topic.clone(),
        }))
    }

    async fn run(
        &self,
        link: &str,
        apply: bool,
    ) -> Result<kafka_mirror_proxy::admin::FailbackAnswer, kafka_mirror_proxy::admin::BoxError>
    {
        use kafka_mirror_proxy::admin::FailbackAnswer;
        use kafka_mirror_proxy::replicate::failback::{self, Failback};
        let Some((reverse_of, b)) = self.links.get(link) else {
            return Ok(FailbackAnswer::Refused(format!(
                "link '{link}' has no failback settings"
            )));
        };
        let forward_group = format!("replicator.mirror-{reverse_of}");
        let progress_group = format!("replicator.mirror-{link}");
        let f = Failback {
            link,
            reverse_of,
            a: &self.a,
            b,
            state_topic: &self.state_topic,
            offsets_topic: DEFAULT_OFFSETS_TOPIC,
            forward_group: &forward_group,
            progress_group: &progress_group,
        };
        let plan = match failback::plan(&f).await {
            Ok(plan) => plan,
            Err(e) if e.is_refusal() => return Ok(FailbackAnswer::Refused(e.to_string())),
            Err(e) => return Err(e.into()),
        };
        let unresolved = plan.unresolved();
        if apply && unresolved == 0 {
            failback::apply(&f, &plan, now_ms()).await?;
            tracing::info!(
                link,
                reverse_of = reverse_of.as_str(),
                failover_id = plan.failover_id,
                partitions = plan.partitions.len(),
                "failback: history and starting points written"
            );
        }
        Ok(FailbackAnswer::Report {
            report: cli::failback_json(&plan),
            unresolved,
        })
    }
}

impl kafka_mirror_proxy::admin::FailbackApi for FailbackService {
    fn failback<'a>(
        &'a self,
        link: &'a str,
        apply: bool,
    ) -> futures_util::future::BoxFuture<
        'a,
        Result<kafka_mirror_proxy::admin::FailbackAnswer, kafka_mirror_proxy::admin::BoxError>,
    > {
        Box::pin(self.run(link, apply))
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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
    let result = runtime.block_on(serve(config));
    // Do not wait for a blocking task (a DNS lookup) past the drain.
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
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

async fn serve(config: Config) -> anyhow::Result<()> {
    tracing::info!(?config, "starting");
    for link in config.links.iter().filter(|l| l.tls_subject().is_none()) {
        tracing::warn!(
            link = link.name(),
            client_id = link.client_id(),
            "mirror link without a TLS client subject: any client that sets its client id can write its mirrored topics and act as its replicator; set MIRROR_PROXY_LINK_{}_TLS_SUBJECT",
            kafka_mirror_proxy::mirror::link::link_env_name(link.name())
        );
    }
    let admin_addr = config.admin_listen;
    let metrics = Arc::new(Metrics::new(config.links.names()));
    let admin = kafka_mirror_proxy::admin::bind(admin_addr)
        .await
        .with_context(|| {
            format!("binding the admin listener on {admin_addr} (MIRROR_PROXY_ADMIN_LISTEN)")
        })?;
    let admin_addr = admin.local_addr().unwrap_or(admin_addr);
    let tasks = Tasks::default();
    tasks.spawn(reload_tls());
    let state = if config.links.is_empty() {
        None
    } else {
        let state = StateStore::new(&config, Arc::clone(&metrics))
            .context("configuring the state topic client")?;
        state.start(&tasks);
        Some(state)
    };
    let members = if config.links.is_empty() {
        None
    } else {
        Some(start_members(&config, &metrics)?)
    };
    let proxy = Proxy::start(
        config,
        metrics,
        state.clone(),
        members.clone(),
        tasks.clone(),
    )
    .await?;
    let shared = Arc::clone(&proxy.shared);
    let failback = FailbackService::new(&proxy.shared.config)?
        .map(|s| Arc::new(s) as Arc<dyn kafka_mirror_proxy::admin::FailbackApi>);
    tasks.spawn(async move {
        if let Err(e) = kafka_mirror_proxy::admin::serve(admin, shared, failback).await {
            tracing::error!(error = %e, "admin endpoint stopped");
        }
    });
    tracing::info!(
        bootstrap = %proxy.bootstrap_addr,
        admin = %admin_addr,
        links = ?proxy.shared.config.links.names(),
        "proxy ready"
    );
    let fatal = async {
        match &state {
            Some(s) => s.fatal().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown_signal() => {}
        why = fatal => anyhow::bail!("{why}"),
    }
    let timeout = Duration::from_millis(proxy.shared.config.shutdown_timeout_ms);
    tracing::info!(
        open_connections = proxy.shared.open_connections(),
        timeout_ms = timeout.as_millis(),
        "shutting down: stopped accepting connections and reading requests; waiting for the requests in flight to be answered"
    );
    let started = Instant::now();
    tokio::select! {
        left = proxy.shutdown(timeout) => match left {
            0 => tracing::info!(
                elapsed_ms = started.elapsed().as_millis(),
                "every connection delivered its responses and closed; exiting"
            ),
            left => tracing::warn!(
                open_connections = left,
                timeout_ms = timeout.as_millis(),
                "shutdown timeout (MIRROR_PROXY_SHUTDOWN_TIMEOUT_MS) reached: closing the connections still waiting for broker responses; exiting"
            ),
        },
        // An operator who signals again does not want to wait.
        _ = shutdown_signal() => tracing::warn!(
            open_connections = proxy.shared.open_connections(),
            "second signal: closing every connection now; exiting"
        ),
    }
    // The background tasks (state topic, link control, probes, listeners,
    // admin endpoint) stop now that no connection needs them.
    let left = tasks.shutdown(Duration::from_secs(5)).await;
    if left > 0 {
        tracing::warn!(
            tasks = left,
            "background tasks still running after 5 s; exiting without them"
        );
    }
    if let Some(members) = &members {
        // Bounded: the coordinator drops a silent instance anyway.
        if tokio::time::timeout(Duration::from_secs(5), members.leave())
            .await
            .is_err()
        {
            tracing::warn!("leaving the instance group took over 5 s; exiting without");
        }
    }
    // Returning drops the runtime, which closes every remaining socket.
    Ok(())
}

/// Join the instances' group (`control::members`) with the state store's
/// connection settings.
fn start_members(config: &Config, metrics: &Arc<Metrics>) -> anyhow::Result<Arc<Members>> {
    let mut client =
        ClientConfig::from_config(config).context("configuring the instance group client")?;
    client.client_id = "kafka-mirror-proxy-instances".into();
    let instance_id = config
        .instance_id
        .clone()
        .unwrap_or_else(members::random_instance_id);
    let group = members::group_name(&config.state_topic);
    let mut options = members::MembersOptions::new(config.state_topic.clone());
    options.session_timeout = Duration::from_millis(config.instance_session_timeout_ms);
    options.member_gauge = Some(metrics.state.instance_group_member());
    tracing::info!(instance = %instance_id, group = %group, "joining the instance group");
    Ok(Members::start_with(
        Client::new(client),
        group,
        instance_id,
        options,
    ))
}

/// Reloads changed TLS files every `RELOAD_INTERVAL`, and at once on
/// SIGHUP (which therefore no longer ends the process).
async fn reload_tls() {
    use kafka_mirror_proxy::net::tls;
    #[cfg(unix)]
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot handle SIGHUP: TLS files are reloaded by polling only");
            None
        }
    };
    loop {
        #[cfg(unix)]
        {
            let hup = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(tls::RELOAD_INTERVAL) => {}
                Some(()) = hup => tracing::info!("SIGHUP: checking the TLS files"),
            }
        }
        #[cfg(not(unix))]
        tokio::time::sleep(tls::RELOAD_INTERVAL).await;
        // Small bounded file reads, off the async workers.
        let _ = tokio::task::spawn_blocking(tls::reload_all).await;
    }
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
