//! The replicator (SPEC §12): `kafka-mirror-proxy replicate` copies record
//! batches byte for byte from a source cluster through the proxy into the
//! destination, keeping the source producer ids, epochs and sequences, the
//! traffic the proxy remaps. It is a peer of `proxy`: it talks to the
//! proxy over the wire, never through its types.
//!
//! Shaped like Kafka's own fetcher and producer:
//! - `fetcher`: one task per source broker, one Fetch at a time for every
//!   partition that broker leads (Kafka's fetcher sends one per broker);
//!   many megabytes per round trip hide a long one.
//! - `sender`: one task per destination node, one Produce holding the next
//!   batch of every ready partition that node leads, several Produce
//!   requests in flight on its connection.
//! - `partitions`: the bookkeeping between them (pure): order, resume
//!   points, the memory bound, the commit bound.
//! - `topics`: the source's topics matched by the link's patterns, found
//!   at start and again every discovery interval; destination topics
//!   created, grown and reconfigured to follow (never deleted).
//! - `progress`: acknowledged resume points committed to a consumer group
//!   on the destination, and read back at start.
//! - `groups`: source consumer groups' offsets translated and committed on
//!   the destination while the group is not active there.
//! - `members`: the link's instances share its partitions through a
//!   consumer group on the source (a slot each, eager hand-over).
//! - `translation`: where source and destination offsets stop moving
//!   together, saved to a compacted topic on the destination before each
//!   commit.
//! - `batches`: fetched records cut into batches, control batches and
//!   aborted transactions passed over (pure).
//! - `metrics`, `admin`: Prometheus metrics, `/healthz`, `/readyz`.
//!
//! A fenced link (the proxy failed it over) answers the replicator's
//! Produce with PRODUCER_FENCED naming the link: the replicator stops at
//! once with [`ReplicateError::Fenced`] (exit code 3).

mod admin;
mod batches;
pub(crate) mod failback;
mod fetcher;
mod groups;
pub(crate) mod members;
pub(crate) mod metrics;
pub(crate) mod partitions;
mod progress;
mod sender;
mod topics;
pub mod translation;

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;

use crate::client::{Client, ClientConfig, ClientError};
use crate::config::replicator::{ReplicatorConfig, Side};
use crate::net::tls::{TlsSetupError, UpstreamConnector};
use crate::net::upstream::Upstream;
pub(crate) use batches::SplitError;
use members::{Assigned, Slot};
use metrics::Metrics;
pub(crate) use partitions::PartitionReport;
use partitions::{Table, Tp};

/// Exit code of a replicator the proxy fenced.
pub(crate) const EXIT_FENCED: u8 = 3;

/// Why the replicator stopped on its own.
#[derive(Debug, thiserror::Error)]
pub enum ReplicateError {
    #[error("the proxy fenced link '{link}' (it failed over): {message}")]
    Fenced { link: String, message: String },
    #[error("{context}")]
    Client {
        context: String,
        #[source]
        source: ClientError,
    },
    #[error(
        "the destination refused the batch of {tp} at source offset {offset} \
         (producer id {producer_id}): {name} ({code}): {message}"
    )]
    Refused {
        tp: String,
        offset: i64,
        producer_id: i64,
        code: i16,
        name: String,
        message: String,
    },
    #[error("source {tp} at offset {offset}")]
    Records {
        tp: String,
        offset: i64,
        #[source]
        source: SplitError,
    },
    #[error(
        "group {group} on the destination holds offset {offset} for {tp}, beyond the source \
         log end {end}: the source topic was recreated or truncated; reset the group's offsets \
         (kafka-consumer-groups.sh --reset-offsets on the destination) or use another GROUP_ID"
    )]
    ResumeBeyondEnd {
        group: String,
        tp: String,
        offset: i64,
        end: i64,
    },
    #[error(
        "destination topic {topic} has {destination} partitions, the source {in_source}; \
         create them, or let the replicator (CREATE_TOPICS=true)"
    )]
    TooFewPartitions {
        topic: String,
        destination: usize,
        in_source: usize,
    },
    #[error("TLS to the {side}")]
    Tls {
        side: &'static str,
        #[source]
        source: TlsSetupError,
    },
    #[error(transparent)]
    Translation(Box<translation::TranslationError>),
    #[error("admin listener {addr}")]
    Admin {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

impl ReplicateError {
    pub fn exit_code(&self) -> u8 {
        match self {
            ReplicateError::Fenced { .. } => EXIT_FENCED,
            _ => 1,
        }
    }

    fn client(context: impl Into<String>, source: ClientError) -> ReplicateError {
        ReplicateError::Client {
            context: context.into(),
            source,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Sorted by topic, then partition.
    pub partitions: Vec<PartitionReport>,
    pub total_batches: u64,
    pub total_records: u64,
    pub total_control_skipped: u64,
    pub total_aborted_skipped: u64,
    /// Stopped by the shutdown signal rather than by catching up.
    pub cancelled: bool,
    /// Progress commits that succeeded.
    pub commits: u64,
}

impl Report {
    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionReport> {
        self.partitions
            .iter()
            .find(|p| p.topic == topic && p.partition == partition)
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn opt(v: Option<i64>) -> String {
            v.map_or_else(|| "-".to_owned(), |v| v.to_string())
        }
        writeln!(
            f,
            "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
            "topic",
            "partition",
            "batches",
            "records",
            "control",
            "aborted",
            "first",
            "last",
            "next"
        )?;
        for p in &self.partitions {
            writeln!(
                f,
                "{:<24} {:>9} {:>9} {:>9} {:>9} {:>9} {:>12} {:>12} {:>12}",
                p.topic,
                p.partition,
                p.batches_copied,
                p.records_copied,
                p.control_batches_skipped,
                p.aborted_batches_skipped,
                opt(p.first_offset),
                opt(p.last_offset),
                p.next_offset
            )?;
        }
        write!(
            f,
            "total: {} batches, {} records copied, {} control batches and {} aborted batches \
             skipped, {} commits{}",
            self.total_batches,
            self.total_records,
            self.total_control_skipped,
            self.total_aborted_skipped,
            self.commits,
            if self.cancelled { " (cancelled)" } else { "" }
        )
    }
}

/// Why the run ends.
#[derive(Debug)]
enum Stop {
    Shutdown,
    CaughtUp,
    Failed(ReplicateError),
}

/// Broker addresses by node id, of one cluster.
type Nodes = HashMap<i32, String>;

/// What the tasks share.
struct Shared {
    config: ReplicatorConfig,
    table: Mutex<Table>,
    /// The table changed: fetchers and senders look again.
    changed: Notify,
    /// A partition waits for its progress to be committed.
    commit_wanted: Notify,
    /// A broker said a leader moved, or a connection broke.
    metadata_stale: Notify,
    source_nodes: Mutex<Nodes>,
    destination_nodes: Mutex<Nodes>,
    metrics: Metrics,
    /// No new Fetch or Produce: the run is ending.
    stopping: AtomicBool,
    /// Every discovered partition has a position and a placement.
    ready: AtomicBool,
    /// Why the run ends, once a task said so; `stopped` wakes the run.
    stop: Mutex<Option<Stop>>,
    stopped: Notify,
    commits: std::sync::atomic::AtomicU64,
    /// What this instance copies: a slot of the link's partitions, none
    /// while the instances' group rebalances (see `members`).
    assigned: Mutex<Option<Assigned>>,
    /// The assignment changed: discovery takes partitions on at once.
    assignment_changed: Notify,
    /// This instance in the instances' group: (coordinator, member id).
    member: Mutex<Option<(String, String)>>,
    /// The member's name in logs and in the group's metadata.
    instance_id: String,
    /// Writes the offset translation (see `translation`).
    offsets: Client,
    offsets_topic_ready: AtomicBool,
    /// Held by a commit from taking the unsaved translation until its
    /// resume points are committed: two commits at once would let the
    /// last one commit resume points whose segments the other still
    /// holds unsaved (and loses, if the run ends and aborts it).
    committing: tokio::sync::Mutex<()>,
}

use crate::sync::{error_chain, lock};

impl Shared {
    fn table(&self) -> MutexGuard<'_, Table> {
        lock(&self.table)
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// End the run (the first reason wins).
    fn finish(&self, why: Stop) {
        let mut stop = lock(&self.stop);
        if stop.is_none() {
            *stop = Some(why);
            // Stored for the run if it is not waiting yet.
            self.stopped.notify_one();
        }
    }

    fn fail(&self, e: ReplicateError) {
        tracing::error!(error = %error_chain(&e), "replicator stopping");
        self.finish(Stop::Failed(e));
    }

    fn assigned(&self) -> Option<Assigned> {
        *lock(&self.assigned)
    }

    /// A new slot: discovery takes its partitions on.
    fn assign(&self, a: Assigned) {
        *lock(&self.assigned) = Some(a);
        self.metrics.set_member(true);
        self.assignment_changed.notify_one();
    }

    /// No slot (a rebalance): what was taken on for the old one is not
    /// kept. Returns what was held.
    fn unassign(&self) -> Option<Assigned> {
        self.metrics.set_member(false);
        lock(&self.assigned).take()
    }

    /// Still the assignment of `generation`?
    fn holds(&self, generation: i32) -> bool {
        self.assigned().is_some_and(|a| a.generation == generation)
    }

    fn member(&self) -> Option<(String, String)> {
        lock(&self.member).clone()
    }

    fn set_member(&self, m: Option<(String, String)>) {
        *lock(&self.member) = m;
    }

    /// A backoff for retries of this run's settings.
    fn backoff(&self) -> crate::net::backoff::Backoff {
        crate::net::backoff::Backoff::new(self.config.retry_backoff, self.config.retry_backoff_max)
    }
}

/// The crate's client for one cluster, sending the link's client id.
fn client(
    config: &ReplicatorConfig,
    side: &Side,
    name: &'static str,
) -> Result<Client, ReplicateError> {
    let tls = side
        .tls
        .as_ref()
        .map(UpstreamConnector::new)
        .transpose()
        .map_err(|source| ReplicateError::Tls { side: name, source })?;
    let upstream = Upstream {
        server_name: side.tls.as_ref().and_then(|t| t.server_name.clone()),
        tls,
        timeout: config.connect_timeout,
    };
    let mut c = ClientConfig::new(side.bootstrap.clone(), upstream);
    c.sasl = side.sasl.clone();
    c.client_id = config.client_id.clone();
    c.request_timeout = config.request_timeout;
    c.retry_backoff = config.retry_backoff;
    c.retry_backoff_max = config.retry_backoff_max;
    // Bounded by the largest answer it asks for, with room for headers.
    c.max_frame_bytes = usize::try_from(config.fetch_max_bytes)
        .unwrap_or(usize::MAX)
        .saturating_add(1 << 20)
        .max(c.max_frame_bytes);
    Ok(Client::new(c))
}

/// Copies until `shutdown` turns true, the proxy fences the link, an
/// error no retry can fix, or (`until_caught_up`) every partition reached
/// the source high watermark it had when it was taken on.
pub async fn run(
    config: ReplicatorConfig,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Report, ReplicateError> {
    let source = client(&config, &config.source, "source")?;
    // The link's client id goes only on Produce: the proxy fences the
    // link's connections at a failover, and the Produce answered
    // PRODUCER_FENCED is how the replicator learns of it. Its other
    // requests (metadata, topics, progress commits, groups) use a client
    // id of their own, so that a fenced link cannot refuse the commit a
    // partition waits for before its next Produce, which would leave the
    // replicator waiting for ever instead of stopping.
    let producer = client(&config, &config.destination, "destination")?;
    let destination = {
        let mut c = producer.config().clone();
        c.client_id = format!("{}.control", c.client_id);
        Client::new(c)
    };
    let shared = Arc::new(Shared {
        table: Mutex::new(Table::new(config.max_buffered_bytes)),
        changed: Notify::new(),
        commit_wanted: Notify::new(),
        metadata_stale: Notify::new(),
        source_nodes: Mutex::new(HashMap::new()),
        destination_nodes: Mutex::new(HashMap::new()),
        metrics: Metrics::new(&config.link),
        stopping: AtomicBool::new(false),
        ready: AtomicBool::new(false),
        stop: Mutex::new(None),
        stopped: Notify::new(),
        commits: std::sync::atomic::AtomicU64::new(0),
        assigned: Mutex::new(None),
        assignment_changed: Notify::new(),
        member: Mutex::new(None),
        instance_id: crate::control::members::random_instance_id(),
        offsets: translation::client(&producer),
        offsets_topic_ready: AtomicBool::new(false),
        committing: tokio::sync::Mutex::new(()),
        config,
    });
    if !shared.config.membership {
        shared.assign(Assigned {
            generation: 0,
            slot: Slot::ALONE,
            at: Instant::now(),
        });
    }
    let mut tasks = JoinSet::new();
    if let Some(addr) = shared.config.admin_listen {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| ReplicateError::Admin { addr, source })?;
        tracing::info!(%addr, "admin listening");
        tasks.spawn(admin::serve(
            listener,
            admin::Admin {
                shared: Arc::clone(&shared),
                source: source.clone(),
                destination: destination.clone(),
            },
        ));
    }
    tracing::info!(
        link = %shared.config.link,
        client_id = %shared.config.client_id,
        group = %shared.config.group_id,
        instance = %shared.instance_id,
        membership = shared.config.membership,
        topics = ?shared.config.topics.iter().map(|r| r.as_str()).collect::<Vec<_>>(),
        "replicator starting"
    );
    if shared.config.membership {
        tasks.spawn(members::run(
            Arc::clone(&shared),
            source.clone(),
            destination.clone(),
        ));
    }
    tasks.spawn(topics::discover(
        Arc::clone(&shared),
        source.clone(),
        destination.clone(),
    ));
    tasks.spawn(placement(
        Arc::clone(&shared),
        source.clone(),
        destination.clone(),
        producer,
    ));
    tasks.spawn(progress::commit_loop(
        Arc::clone(&shared),
        destination.clone(),
    ));
    tasks.spawn(observe(Arc::clone(&shared)));
    tasks.spawn(groups::sync(
        Arc::clone(&shared),
        source.clone(),
        destination.clone(),
    ));

    let why = tokio::select! {
        _ = async {
            if shutdown.wait_for(|stop| *stop).await.is_err() {
                // A dropped sender means "never", not "now".
                std::future::pending::<()>().await;
            }
        } => Stop::Shutdown,
        _ = shared.stopped.notified() => {
            lock(&shared.stop).take().unwrap_or(Stop::Shutdown)
        }
    };
    shared.stopping.store(true, Ordering::Release);
    shared.changed.notify_waiters();
    let fenced = matches!(&why, Stop::Failed(ReplicateError::Fenced { .. }));
    if fenced || !matches!(why, Stop::Failed(_)) {
        // What is in flight is answered (or times out) before the last
        // commit, which then covers it. A fenced link's proxy answers what
        // it holds before closing the link's connections.
        let drained = tokio::time::timeout(shared.config.request_timeout, async {
            while shared.table().in_flight() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                "batches still in flight at the stop; they are sent again at the next start"
            );
        }
    }
    // After a failover too (the commits go out under a client id the
    // fence does not refuse): the translation and the resume points then
    // end exactly at the barrier, which is where a failback finds the
    // point A and B diverge.
    {
        // Marked as given back cleanly when nothing is left in flight: the
        // next owner (another instance, or this one started again) need
        // not wait for an answer that may still come.
        let clean = !shared.table().in_flight();
        let marked = if clean { members::RELEASED } else { "" };
        if let Err(e) = progress::commit_all(&shared, &destination, marked).await {
            tracing::warn!(error = %error_chain(&e), "last progress commit failed; the next start re-sends what it covered");
        }
    }
    members::leave(&shared, &source).await;
    tasks.abort_all();
    while tasks.join_next().await.is_some() {}
    let report = report(&shared, matches!(why, Stop::Shutdown));
    match why {
        Stop::Failed(e) => Err(e),
        Stop::Shutdown | Stop::CaughtUp => Ok(report),
    }
}

fn report(shared: &Shared, cancelled: bool) -> Report {
    let table = shared.table();
    let mut report = Report {
        cancelled,
        commits: shared.commits.load(Ordering::Relaxed),
        ..Report::default()
    };
    for (_, p) in table.iter() {
        let r = p.report.clone();
        report.total_batches += r.batches_copied;
        report.total_records += r.records_copied;
        report.total_control_skipped += r.control_batches_skipped;
        report.total_aborted_skipped += r.aborted_batches_skipped;
        report.partitions.push(r);
    }
    report
}

/// Gauges every second, and the until-caught-up end.
async fn observe(shared: Arc<Shared>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shared.changed.notified() => {}
        }
        let now = Instant::now();
        let (caught_up, count, buffered) = {
            let table = shared.table();
            for (tp, p) in table.iter() {
                shared
                    .metrics
                    .lag(&tp.topic, tp.partition, p.lag_records(), p.lag(now));
            }
            (table.caught_up(), table.len(), table.buffered())
        };
        shared.metrics.gauges(count, buffered);
        if shared.config.until_caught_up && caught_up && shared.ready.load(Ordering::Acquire) {
            tracing::info!(
                "every partition reached the source high watermark seen when it was taken on"
            );
            shared.finish(Stop::CaughtUp);
        }
    }
}

/// Leaders of every partition on both clusters, looked up at start, when
/// a task says one moved, and every half minute; a fetcher for every
/// source broker that leads one, a sender for every destination node.
async fn placement(shared: Arc<Shared>, source: Client, destination: Client, producer: Client) {
    let mut fetchers: HashMap<i32, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut senders: HashMap<i32, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut backoff = shared.backoff();
    loop {
        let stale = shared.metadata_stale.notified();
        tokio::pin!(stale);
        stale.as_mut().enable();
        let ok = refresh_placement(&shared, &source, &destination).await;
        if ok {
            backoff.reset();
        }
        let (leaders, nodes) = {
            let table = shared.table();
            let mut leaders: Vec<i32> = table.iter().map(|(_, p)| p.source.leader).collect();
            let mut nodes: Vec<i32> = table.iter().map(|(_, p)| p.destination.leader).collect();
            leaders.sort_unstable();
            leaders.dedup();
            nodes.sort_unstable();
            nodes.dedup();
            (leaders, nodes)
        };
        for id in leaders.into_iter().filter(|id| *id >= 0) {
            fetchers.entry(id).or_insert_with(|| {
                tokio::spawn(fetcher::run(Arc::clone(&shared), source.clone(), id))
            });
        }
        for id in nodes.into_iter().filter(|id| *id >= 0) {
            senders.entry(id).or_insert_with(|| {
                tokio::spawn(sender::run(Arc::clone(&shared), producer.clone(), id))
            });
        }
        shared.changed.notify_waiters();
        // A destination topic another instance is creating has no leader
        // yet: look again soon rather than in half a minute.
        let unplaced = shared
            .table()
            .iter()
            .any(|(_, p)| p.source.leader < 0 || p.destination.leader < 0);
        let wait = if ok && !unplaced {
            Duration::from_secs(30)
        } else {
            backoff.next_delay()
        };
        tokio::select! {
            _ = &mut stale => {
                // Let the other partitions of a moved leader report too.
                tokio::time::sleep(shared.config.retry_backoff).await;
            }
            _ = tokio::time::sleep(wait) => {}
        }
        if shared.stopping() {
            for (_, h) in fetchers.drain().chain(senders.drain()) {
                h.abort();
            }
            // The senders' answers in flight settle before the stop.
            std::future::pending::<()>().await;
        }
    }
}

/// One metadata round on both clusters for the partitions in the table.
async fn refresh_placement(shared: &Shared, source: &Client, destination: &Client) -> bool {
    let topics: Vec<String> = {
        let table = shared.table();
        let mut t: Vec<String> = table.iter().map(|(tp, _)| tp.topic.to_string()).collect();
        t.dedup();
        t
    };
    if topics.is_empty() {
        return true;
    }
    let names: Vec<&str> = topics.iter().map(String::as_str).collect();
    let (src, dst) = tokio::join!(
        source.metadata(Some(&names)),
        destination.metadata(Some(&names))
    );
    let mut ok = true;
    for (info, nodes, is_source) in [
        (src, &shared.source_nodes, true),
        (dst, &shared.destination_nodes, false),
    ] {
        let info = match info {
            Ok(info) => info,
            Err(e) => {
                ok = false;
                shared.metrics.error(metrics::ErrorKind::Metadata);
                tracing::warn!(error = %error_chain(&e), cluster = if is_source { "source" } else { "destination" }, "metadata");
                continue;
            }
        };
        *lock(nodes) = info
            .brokers
            .iter()
            .map(|b| (b.node_id, b.address()))
            .collect();
        let mut table = shared.table();
        for t in &info.topics {
            for p in &t.partitions {
                let tp = Tp {
                    topic: Arc::from(t.name.as_str()),
                    partition: p.partition,
                };
                if let Some(part) = table.get_mut(&tp) {
                    let placement = partitions::Placement {
                        leader: if p.error_code == 0 { p.leader } else { -1 },
                        leader_epoch: p.leader_epoch,
                        topic_id: t.topic_id,
                    };
                    if is_source {
                        part.source = placement;
                    } else {
                        part.destination = placement;
                    }
                }
            }
        }
    }
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopping_error_prints_its_context_then_its_cause_once() {
        let e = ReplicateError::client(
            "metadata of orders",
            ClientError::Closed {
                broker: "b:9092".into(),
            },
        );
        assert_eq!(e.to_string(), "metadata of orders");
        let cause = std::error::Error::source(&e).expect("the client error");
        assert!(cause.is::<ClientError>());
        // What the binary prints (the text it printed when the Display
        // quoted the cause itself).
        assert_eq!(
            error_chain(&e),
            "metadata of orders: broker b:9092 closed the connection"
        );
        assert_eq!(e.exit_code(), 1);
    }
}
