//! The proxy as a program: [`run`] composes the layers below (metrics, the
//! state store, the instances' group, the listeners, the admin endpoint)
//! from one [`Config`], serves until asked to stop, then drains. The binary
//! is this plus signals and logging; a test or an embedding program calls
//! [`start`] to learn the bound addresses first.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::{Stream, StreamExt};

use crate::admin::{BoxError, FailbackAnswer, FailbackApi};
use crate::client::{Client, ClientConfig};
use crate::config::replicator::{default_group_id, DEFAULT_OFFSETS_TOPIC};
use crate::config::Config;
use crate::control::members::{self, Members};
use crate::metrics::Metrics;
use crate::net::tasks::Tasks;
use crate::net::tls::{self, TlsSetupError};
use crate::proxy::{Proxy, StartError};
use crate::state::StateStore;

/// How long the background tasks, and leaving the instances' group, may
/// take once the connections are closed.
const TASKS_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the proxy could not start, or stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("binding the admin listener on {addr} (MIRROR_PROXY_ADMIN_LISTEN)")]
    AdminBind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("configuring the {what} client")]
    Client {
        what: &'static str,
        #[source]
        source: TlsSetupError,
    },
    #[error(transparent)]
    Start(#[from] StartError),
    /// The state store's own account of why the state topic is unusable
    /// (it is shared with the readiness probe and the admin API).
    #[error("the state topic is unusable: {0}")]
    StateTopic(String),
}

/// A proxy that is accepting connections.
pub struct Running {
    proxy: Proxy,
    tasks: Tasks,
    state: Option<Arc<StateStore>>,
    members: Option<Arc<Members>>,
    admin_addr: SocketAddr,
}

/// Start the proxy configured by `config` and serve until `stop` yields:
/// its first item stops accepting connections and requests and waits, up
/// to `SHUTDOWN_TIMEOUT_MS`, for the requests in flight to be answered; a
/// second closes every connection at once. Returns when the proxy is
/// down, or early with the reason the state topic became unusable.
pub async fn run(config: Config, stop: impl Stream<Item = ()>) -> Result<(), RunError> {
    start(config).await?.serve(stop).await
}

/// Bind every listener and start the background tasks; the proxy accepts
/// connections when this returns.
pub async fn start(config: Config) -> Result<Running, RunError> {
    tracing::info!(?config, "starting");
    for link in config.links.iter().filter(|l| l.tls_subject().is_none()) {
        tracing::warn!(
            link = link.name(),
            client_id = link.client_id(),
            "mirror link without a TLS client subject: any client that sets its client id can write its mirrored topics and act as its replicator; set MIRROR_PROXY_LINK_{}_TLS_SUBJECT",
            crate::mirror::link::link_env_name(link.name())
        );
    }
    let metrics = Arc::new(Metrics::new(config.links.names()));
    let addr = config.admin_listen;
    let admin = crate::admin::bind(addr)
        .await
        .map_err(|source| RunError::AdminBind { addr, source })?;
    let admin_addr = admin.local_addr().unwrap_or(addr);
    let tasks = Tasks::default();
    tasks.spawn(reload_tls());
    let (state, members) = if config.links.is_empty() {
        (None, None)
    } else {
        let state =
            StateStore::new(&config, Arc::clone(&metrics)).map_err(|source| RunError::Client {
                what: "state topic",
                source,
            })?;
        state.start(&tasks);
        (Some(state), Some(start_members(&config, &metrics)?))
    };
    let failback = FailbackService::new(&config)?.map(|s| Arc::new(s) as Arc<dyn FailbackApi>);
    let proxy = Proxy::start(
        config,
        metrics,
        state.clone(),
        members.clone(),
        tasks.clone(),
    )
    .await?;
    let shared = Arc::clone(&proxy.shared);
    tasks.spawn(async move {
        if let Err(e) = crate::admin::serve(admin, shared, failback).await {
            tracing::error!(error = %e, "admin endpoint stopped");
        }
    });
    tracing::info!(
        bootstrap = %proxy.bootstrap_addr,
        admin = %admin_addr,
        links = ?proxy.shared.config.links.names(),
        "proxy ready"
    );
    Ok(Running {
        proxy,
        tasks,
        state,
        members,
        admin_addr,
    })
}

impl Running {
    /// Where clients bootstrap.
    pub fn bootstrap_addr(&self) -> SocketAddr {
        self.proxy.bootstrap_addr
    }

    /// Where the admin API and the probes listen.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Serve until `stop` yields, then drain (see [`run`]).
    pub async fn serve(self, stop: impl Stream<Item = ()>) -> Result<(), RunError> {
        let Running {
            proxy,
            tasks,
            state,
            members,
            ..
        } = self;
        let mut stop = std::pin::pin!(stop);
        let fatal = async {
            match &state {
                Some(s) => s.fatal().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.next() => {}
            why = fatal => return Err(RunError::StateTopic(why)),
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
            // An operator who asks again does not want to wait. A stream
            // that ended asks nothing more.
            Some(()) = stop.next() => tracing::warn!(
                open_connections = proxy.shared.open_connections(),
                "second signal: closing every connection now; exiting"
            ),
        }
        // The background tasks (state topic, link control, probes,
        // listeners, admin endpoint) stop now that no connection needs them.
        let left = tasks.shutdown(TASKS_TIMEOUT).await;
        if left > 0 {
            tracing::warn!(
                tasks = left,
                "background tasks still running after 5 s; exiting without them"
            );
        }
        if let Some(members) = &members {
            // Bounded: the coordinator drops a silent instance anyway.
            if tokio::time::timeout(TASKS_TIMEOUT, members.leave())
                .await
                .is_err()
            {
                tracing::warn!("leaving the instance group took over 5 s; exiting without");
            }
        }
        // Dropping the proxy closes every remaining socket.
        Ok(())
    }
}

/// Join the instances' group (`control::members`) with the state store's
/// connection settings.
fn start_members(config: &Config, metrics: &Arc<Metrics>) -> Result<Arc<Members>, RunError> {
    let mut client = ClientConfig::from_config(config).map_err(|source| RunError::Client {
        what: "instance group",
        source,
    })?;
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

/// The admin API's failback (`admin::FailbackApi`) with `replicate`, for
/// links with failback settings: A is this proxy's upstream cluster (its
/// TLS settings), B the link's source brokers over plain TCP; the topics
/// and groups are the defaults `kafka-mirror-proxy failback` uses, the
/// state topic this proxy's.
struct FailbackService {
    a: Client,
    /// Per failback link: the link it fails back, and B.
    links: HashMap<String, (String, Client)>,
    state_topic: String,
}

impl FailbackService {
    fn new(config: &Config) -> Result<Option<FailbackService>, RunError> {
        let links: HashMap<String, (String, Client)> = config
            .links
            .iter()
            .filter_map(|l| {
                let f = l.failback()?;
                let b = ClientConfig::plain(&f.source_bootstrap_servers.join(","));
                Some((l.name().to_string(), (f.reverse_of.clone(), Client::new(b))))
            })
            .collect();
        if links.is_empty() {
            return Ok(None);
        }
        let mut a = ClientConfig::from_config(config).map_err(|source| RunError::Client {
            what: "failback",
            source,
        })?;
        a.client_id = "kafka-mirror-proxy-failback".into();
        Ok(Some(FailbackService {
            a: Client::new(a),
            links,
            state_topic: config.state_topic.clone(),
        }))
    }

    async fn run(&self, link: &str, apply: bool) -> Result<FailbackAnswer, BoxError> {
        use crate::replicate::failback::{self, Failback};
        let Some((reverse_of, b)) = self.links.get(link) else {
            return Ok(FailbackAnswer::Refused(format!(
                "link '{link}' has no failback settings"
            )));
        };
        let forward_group = default_group_id(reverse_of);
        let progress_group = default_group_id(link);
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
            failback::apply(&f, &plan, crate::state::now_ms()).await?;
            tracing::info!(
                link,
                reverse_of = reverse_of.as_str(),
                failover_id = plan.failover_id,
                partitions = plan.partitions.len(),
                "failback: history and starting points written"
            );
        }
        Ok(FailbackAnswer::Report {
            report: crate::cli::failback_json(&plan),
            unresolved,
        })
    }
}

impl FailbackApi for FailbackService {
    fn failback<'a>(
        &'a self,
        link: &'a str,
        apply: bool,
    ) -> BoxFuture<'a, Result<FailbackAnswer, BoxError>> {
        Box::pin(self.run(link, apply))
    }
}
