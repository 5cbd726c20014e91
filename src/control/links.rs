//! [`Control`]: every link's state as this instance follows it from the
//! state topic, what the Produce path asks of it (is this topic read-only,
//! is this link fenced), the link connections it tracks for draining, and
//! the failover runner the admin API starts.
//!
//! Every instance, for a link found `STOPPING`: its sessions of the link
//! refuse new requests and close once their in-flight requests are
//! answered; when none is left it writes its drained record (type 7). The
//! instance running the failover (the one the operator called, or the one
//! that finds the link `STOPPING` at start-up and resumes): waits for every
//! live instance's drained record (bounded by
//! `MIRROR_PROXY_FAILOVER_DRAIN_TIMEOUT_MS`), places every partition's
//! barrier (`barriers::place`, idempotent, retried), then persists
//! `STOPPED`. Every transition is written (acks=all) before it takes effect:
//! it takes effect when the state topic's tailer applies it, on every
//! instance alike.
//!
//! The store, the instances' group and the barrier placing are behind the
//! traits of `control::io`: in production the state store and
//! [`Members`]; in `links/tests.rs`, fakes.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::api::{BarrierRow, BarrierState, FailoverReport, LinkCounters, LinkReport};
use super::barriers::{BarrierOutcome, BarrierResult};
use super::io::{BarrierPlacer, Group, Store};
use super::members::Members;
use crate::config::ReadOnlyError;
use crate::metrics::Metrics;
use crate::mirror::link::{Link, Links};
use crate::mirror::link_state::{self, Conflict, LinkState, LinkStatus};
use crate::mirror::pid::ClusterId;
use crate::mirror::produce::{Refusal, READ_ONLY_TOPIC_MIN_PRODUCE_VERSION};
use crate::mirror::state_records::{DrainedKey, DrainedValue};
use crate::net::tasks::Tasks;
use crate::state::{now_ms, ResolveError, StateStore};

mod precheck;
pub(crate) use precheck::{partition_row, DelayTooHigh, Precheck};

#[cfg(test)]
mod tests;

/// Attempts per partition before its barrier is reported failed.
const BARRIER_ATTEMPTS: u32 = 5;
/// Partitions whose barriers are placed at once.
const BARRIER_CONCURRENCY: usize = 16;
/// Pause between two attempts of a failed barrier.
const BARRIER_RETRY: Duration = Duration::from_millis(500);
/// How often the drain wait asks the group for its live members again.
const MEMBERS_POLL: Duration = Duration::from_millis(500);

/// Why a control operation failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    #[error("no mirror link named '{0}'")]
    UnknownLink(String),
    #[error(transparent)]
    Conflict(#[from] Conflict),
    #[error("the state topic is not loaded yet ({0}); retry")]
    NotLoaded(String),
    #[error("writing the link state to the state topic failed: {0}")]
    Write(#[source] ResolveError),
    /// `max_delay` held a new failover back (the message names the
    /// partitions and their delays).
    #[error(transparent)]
    DelayTooHigh(#[from] DelayTooHigh),
}

/// Why a failover run stopped short; the next `POST
/// /links/{name}/failover` resumes it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FailoverError {
    #[error(transparent)]
    Control(#[from] ControlError),
    #[error("listing the link's topics: {0}")]
    Partitions(#[source] crate::client::ClientError),
    #[error("{failed} of {total} partition barrier(s) failed after {attempts} attempts each; the link stays STOPPING")]
    Barriers {
        failed: usize,
        total: usize,
        attempts: u32,
    },
    #[error("persisting STOPPED: {0}")]
    PersistStopped(#[source] crate::state::ResolveError),
    #[error("persisting STOPPED lost to another record: the link is {0}")]
    LostStopped(&'static str),
}

/// One partition of a failover, as the operator sees it.
#[derive(Debug, Clone)]
pub(crate) enum PartitionProgress {
    Pending { topic: String, partition: i32 },
    Done(BarrierOutcome),
}

/// A failover this instance runs (or ran): its progress in memory.
#[derive(Debug, Default, Clone)]
struct Progress {
    partitions: Vec<PartitionProgress>,
    unconfirmed: Vec<String>,
    /// Why the run stopped short (it can be resumed with another failover call).
    error: Option<String>,
    finished: bool,
}

struct Run {
    id: i64,
    progress: Mutex<Progress>,
    finished: watch::Sender<bool>,
}

/// Per-link counters reported by the admin API.
#[derive(Default)]
struct Counters {
    local_writes_refused: AtomicU64,
    link_requests_refused: AtomicU64,
    connections_fenced: AtomicU64,
}

/// The link control of this instance: in production over the state store
/// (which also places the barriers) and the instances' group [`Members`].
pub(crate) struct Control<S = StateStore, G = Members, B = StateStore> {
    links: Links,
    state: Option<Arc<S>>,
    /// This instance's membership of the instances' group; `None`
    /// without links (no state topic, no failover).
    pub members: Option<Arc<G>>,
    /// Places the failover barriers; `None` without a state store.
    barriers: Option<Arc<B>>,
    metrics: Arc<Metrics>,
    read_only_error: ReadOnlyError,
    drain_timeout: Duration,
    /// Open client connections that spoke as each link.
    sessions: Arc<watch::Sender<HashMap<String, usize>>>,
    runs: Mutex<HashMap<String, Arc<Run>>>,
    counters: HashMap<String, Counters>,
    /// Where the drain loop and the failover runs are spawned.
    tasks: Tasks,
}

/// One connection's place among a link's connections, given back on drop.
pub(crate) struct LinkSession {
    sessions: Arc<watch::Sender<HashMap<String, usize>>>,
    link: String,
}

impl Drop for LinkSession {
    fn drop(&mut self) {
        self.sessions.send_modify(|m| {
            if let Some(n) = m.get_mut(&self.link) {
                *n = n.saturating_sub(1);
            }
        });
    }
}

use crate::sync::{error_chain, lock};

impl Control {
    /// The control over the state store (started by the caller, `None`
    /// without links), which also places the barriers, and this instance's
    /// membership of the instances' group.
    /// Background work (the drain loop, failover runs) goes to `tasks`.
    pub(crate) fn new(
        links: Links,
        state: Option<Arc<StateStore>>,
        members: Option<Arc<Members>>,
        metrics: Arc<Metrics>,
        read_only_error: ReadOnlyError,
        drain_timeout: Duration,
        tasks: Tasks,
    ) -> Arc<Control> {
        let barriers = state.clone();
        Control::with(
            links,
            state,
            members,
            barriers,
            metrics,
            read_only_error,
            drain_timeout,
            tasks,
        )
    }
}

impl<S: Store, G: Group, B: BarrierPlacer> Control<S, G, B> {
    /// The control over any store, group and barrier placer; background
    /// work goes to `tasks`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn with(
        links: Links,
        state: Option<Arc<S>>,
        members: Option<Arc<G>>,
        barriers: Option<Arc<B>>,
        metrics: Arc<Metrics>,
        read_only_error: ReadOnlyError,
        drain_timeout: Duration,
        tasks: Tasks,
    ) -> Arc<Self> {
        let counters = links
            .iter()
            .map(|l| (l.name().to_string(), Counters::default()))
            .collect();
        Arc::new(Control {
            links,
            state,
            members,
            barriers,
            metrics,
            read_only_error,
            drain_timeout,
            sessions: Arc::new(watch::Sender::new(HashMap::new())),
            runs: Mutex::new(HashMap::new()),
            counters,
            tasks,
        })
    }

    /// This instance's id in the instances' group ("" without one).
    fn instance_id(&self) -> &str {
        self.members.as_deref().map_or("", G::instance_id)
    }

    /// The live instances (none to wait for without a group).
    async fn live_instances(&self) -> Result<Vec<String>, crate::client::ClientError> {
        match &self.members {
            Some(m) => m.live_instances().await,
            None => Ok(Vec::new()),
        }
    }

    fn link_by_name(&self, name: &str) -> Result<&Arc<Link>, ControlError> {
        self.links
            .iter()
            .find(|l| l.name() == name)
            .ok_or_else(|| ControlError::UnknownLink(name.to_string()))
    }

    /// The state of the link named `name`.
    pub(crate) fn state_of(&self, name: &str) -> Result<LinkState, ControlError> {
        Ok(self.status(self.link_by_name(name)?).state)
    }

    /// The link's status: its latest state record, or its initial state
    /// (`MIRROR_PROXY_LINK_<NAME>_INITIAL_STATE`) while there is none.
    pub(crate) fn status(&self, link: &Link) -> LinkStatus {
        self.state
            .as_ref()
            .and_then(|s| s.link_status(link.name()))
            .unwrap_or_else(|| LinkStatus::initial(link.initial_state(), *link.source_cluster_id()))
    }

    /// Changes whenever a link state is applied (sessions watch it to fence).
    pub(crate) fn changes(&self) -> Option<watch::Receiver<u64>> {
        self.state.as_ref().map(|s| s.control_changes())
    }

    // ---- the Produce path (no await, no allocation unless refusing) ----

    /// Whether `link`'s own requests are refused now, with the message.
    pub(crate) fn fenced(&self, link: &Link) -> Option<String> {
        let status = self.status(link);
        if !status.state.fences_link() {
            return None;
        }
        let what = match status.state {
            LinkState::Stopping => "is failing over (STOPPING)",
            LinkState::Preparing => {
                return Some(format!(
                    "mirror link '{}' is PREPARING a failback: its replicator may copy once `kafka-mirror-proxy failback` has started the link",
                    link.name()
                ))
            }
            _ => "is failed over (STOPPED)",
        };
        Some(format!(
            "mirror link '{}' {what}: its replicator is fenced; `POST /links/{}/start` on the proxy's admin API makes it MIRRORING again",
            link.name(),
            link.name()
        ))
    }

    /// A local Produce to `topic` at `version`: the refusal if the topic is
    /// a read-only mirrored topic (of a link that is not `STOPPED`).
    pub(crate) fn read_only(&self, topic: &str, version: i16) -> Option<(Refusal, String)> {
        let link = self.links.iter().find(|l| l.mirrors_topic(topic))?;
        // Until the state topic is loaded the link's state is unknown (it
        // may be STOPPED, or MIRRORING): a retriable refusal either way.
        if let Some(why) = self.state.as_ref().and_then(|s| s.not_ready_reason()) {
            return Some((
                Refusal::StateNotLoaded,
                format!(
                    "topic '{topic}' is mirrored by link '{}', whose state is not loaded yet ({why}); retry",
                    link.name()
                ),
            ));
        }
        let status = self.status(link);
        if !status.state.read_only() {
            return None;
        }
        let refusal = match self.read_only_error {
            ReadOnlyError::ReadOnlyTopic if version >= READ_ONLY_TOPIC_MIN_PRODUCE_VERSION => {
                Refusal::ReadOnlyTopic
            }
            _ => Refusal::ReadOnly,
        };
        let message = match status.state {
            LinkState::Stopping => format!(
                "topic '{topic}' is mirrored by link '{}', which is failing over (STOPPING): local writes are accepted once it is STOPPED",
                link.name()
            ),
            LinkState::Preparing => format!(
                "topic '{topic}' is read-only while link '{}' prepares a failback (PREPARING): its producers write the cluster the link mirrors from until the link fails over",
                link.name()
            ),
            _ => format!(
                "topic '{topic}' is a read-only mirror of link '{}' (MIRRORING): fail the link over first (`POST /links/{}/failover` on the proxy's admin API, or `kafka-mirror-proxy failover {}`)",
                link.name(),
                link.name(),
                link.name()
            ),
        };
        Some((refusal, message))
    }

    /// Count `partitions` refused local partition writes to `topic`.
    pub(crate) fn local_writes_refused(&self, topic: &str, partitions: usize) {
        if let Some(link) = self.links.iter().find(|l| l.mirrors_topic(topic)) {
            if let Some(c) = self.counters.get(link.name()) {
                c.local_writes_refused
                    .fetch_add(partitions as u64, Ordering::Relaxed);
            }
            self.metrics.local_writes_refused(link.name(), partitions);
        }
    }

    /// Count a refused request of a fenced link.
    pub(crate) fn link_request_refused(&self, link: &str) {
        if let Some(c) = self.counters.get(link) {
            c.link_requests_refused.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A connection of `link` was closed by fencing.
    pub(crate) fn connection_fenced(&self, link: &str) {
        if let Some(c) = self.counters.get(link) {
            c.connections_fenced.fetch_add(1, Ordering::Relaxed);
        }
        self.metrics.link_connection_fenced(link);
    }

    /// Count a connection as one of `link`'s until the guard is dropped.
    /// A session takes it before its first request of the link is checked
    /// against the fence and drops it once its last response is in: the
    /// count and the link state sit behind locks, so a request that found
    /// the link not fenced is one the drain loop (which reads the state,
    /// then the count) waits for.
    pub(crate) fn link_session(&self, link: &str) -> LinkSession {
        self.sessions
            .send_modify(|m| *m.entry(link.to_string()).or_insert(0) += 1);
        LinkSession {
            sessions: Arc::clone(&self.sessions),
            link: link.to_string(),
        }
    }

    fn open_sessions(&self, link: &str) -> usize {
        self.sessions.borrow().get(link).copied().unwrap_or(0)
    }

    // ---- every instance: draining, resuming ----

    /// Start the instance's background work: drained records for every
    /// fenced link, and (once the state topic is loaded) the resumption of
    /// any failover found `STOPPING` that began before this instance did.
    pub(crate) fn start(self: &Arc<Self>) {
        let Some(state) = self.state.clone() else {
            return;
        };
        // A failover begun after this instance started has a runner that is
        // alive (the instance the operator called); joining it would place
        // every barrier a second time. One whose runner died is resumed by
        // the next instance to start, or by `POST /links/{link}/failover`.
        let started_ms = now_ms();
        let me = Arc::clone(self);
        let store = Arc::clone(&state);
        self.tasks.spawn(async move { me.drain_loop(store).await });
        let me = Arc::clone(self);
        self.tasks.spawn(async move {
            while !state.is_loaded() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            for link in me.links.iter() {
                let status = me.status(link);
                me.metrics.link_state(link.name(), status.state.code());
                if status.state == LinkState::Stopping {
                    if status.failover_started_ms >= started_ms {
                        tracing::info!(
                            link = link.name(),
                            failover_id = status.failover_id,
                            "link STOPPING by a failover begun after this instance started: left to the instance running it"
                        );
                        continue;
                    }
                    tracing::info!(
                        link = link.name(),
                        failover_id = status.failover_id,
                        "link found STOPPING at start-up: resuming its failover"
                    );
                    // A failover id of -1 (STOPPING from INITIAL_STATE, never
                    // persisted): `failover` gives it an id first.
                    if let Err(e) = me.failover(link.name(), Duration::ZERO).await {
                        tracing::warn!(link = link.name(), error = %e, "could not resume the failover");
                    }
                }
            }
        });
    }

    /// For every link that is `STOPPING`: once this instance has no open
    /// connection of it, write its drained record for the failover.
    async fn drain_loop(self: Arc<Self>, state: Arc<S>) {
        let mut changes = state.control_changes();
        let mut sessions = self.sessions.subscribe();
        loop {
            if state.is_loaded() {
                for link in self.links.iter() {
                    let status = self.status(link);
                    self.metrics.link_state(link.name(), status.state.code());
                    if status.state != LinkState::Stopping || status.failover_id < 0 {
                        continue;
                    }
                    let me = self.instance_id();
                    if state
                        .drained(link.name(), status.failover_id)
                        .iter()
                        .any(|i| i == me)
                    {
                        continue;
                    }
                    if self.open_sessions(link.name()) > 0 {
                        continue; // the sessions change when they close
                    }
                    let key = DrainedKey {
                        link: link.name().to_string(),
                        instance: me.to_string(),
                    };
                    let value = DrainedValue {
                        failover_id: status.failover_id,
                        timestamp_ms: now_ms(),
                    };
                    match state.write_drained(key, value).await {
                        Ok(()) => tracing::info!(
                            link = link.name(),
                            failover_id = status.failover_id,
                            instance = me,
                            "link drained on this instance: every connection of the link is closed"
                        ),
                        Err(e) => {
                            tracing::warn!(link = link.name(), error = %e, "could not record that the link is drained; retrying");
                            tokio::time::sleep(Duration::from_millis(500)).await;
                            continue;
                        }
                    }
                }
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                r = sessions.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        }
    }

    // ---- the operator's operations ----

    fn loaded_state(&self) -> Result<&Arc<S>, ControlError> {
        match &self.state {
            Some(s) if s.is_loaded() => Ok(s),
            Some(s) => Err(ControlError::NotLoaded(
                s.not_ready_reason().unwrap_or_default(),
            )),
            None => Err(ControlError::NotLoaded("no state store".into())),
        }
    }

    /// Every link's report.
    pub(crate) fn links(&self) -> Vec<LinkReport> {
        self.links.iter().map(|l| self.report(l)).collect()
    }

    /// One link's report.
    pub(crate) fn link(&self, name: &str) -> Result<LinkReport, ControlError> {
        Ok(self.report(self.link_by_name(name)?))
    }

    /// Fail `name` over (or resume its failover) and wait up to `wait` for
    /// it to finish. Returns the report and whether the failover is complete.
    pub(crate) async fn failover(
        self: &Arc<Self>,
        name: &str,
        wait: Duration,
    ) -> Result<(LinkReport, bool), ControlError> {
        let link = Arc::clone(self.link_by_name(name)?);
        let state = self.loaded_state()?;
        let current = self.status(&link);
        let new = link_state::failover_from(name, &current)?;
        let status = if new || current.failover_id < 0 {
            // The drains of earlier failovers are history: deleted before
            // this one begins (while the link is MIRRORING, when a drained
            // tombstone applies), so the topic holds one failover's worth.
            if new {
                match state.forget_drained(name).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(
                        link = name,
                        records = n,
                        "deleted the drained records of earlier failovers"
                    ),
                    Err(e) => {
                        tracing::warn!(link = name, error = %e, "could not delete the drained records of earlier failovers; they stay in the state topic until the next failover")
                    }
                }
            }
            let now = now_ms();
            let id = link_state::next_failover_id(&current, now);
            let next = LinkStatus {
                state: LinkState::Stopping,
                since_ms: now,
                source: current.source,
                failover_id: id,
                failover_started_ms: now,
                failover_finished_ms: -1,
            };
            let won = state
                .write_link_state(name, next)
                .await
                .map_err(ControlError::Write)?;
            let now_status = self.status(&link);
            if !won && now_status.state != LinkState::Stopping {
                return Err(Conflict::Raced {
                    link: name.to_string(),
                    state: now_status.state.as_str(),
                }
                .into());
            }
            if won {
                tracing::info!(
                    link = name,
                    failover_id = id,
                    "failover started: link STOPPING"
                );
                self.metrics.failover_started(name);
            }
            // A lost race to another STOPPING joins that failover.
            now_status
        } else {
            current
        };
        let run = self.ensure_failover(&link, status).await?;
        let mut finished = run.finished.subscribe();
        let _ = tokio::time::timeout(wait, finished.wait_for(|f| *f)).await;
        let report = self.report(&link);
        let complete = self.status(&link).state == LinkState::Stopped;
        Ok((report, complete))
    }

    /// The run of `status`'s failover on this instance, started if needed.
    async fn ensure_failover(
        self: &Arc<Self>,
        link: &Arc<Link>,
        status: LinkStatus,
    ) -> Result<Arc<Run>, ControlError> {
        let mut runs = lock(&self.runs);
        if let Some(run) = runs.get(link.name()) {
            if run.id == status.failover_id && !*run.finished.borrow() {
                return Ok(Arc::clone(run));
            }
        }
        let run = Arc::new(Run {
            id: status.failover_id,
            progress: Mutex::new(Progress::default()),
            finished: watch::Sender::new(false),
        });
        runs.insert(link.name().to_string(), Arc::clone(&run));
        drop(runs);
        let me = Arc::clone(self);
        let link = Arc::clone(link);
        let r = Arc::clone(&run);
        self.tasks.spawn(async move {
            let started = Instant::now();
            let outcome = me.run_failover(&link, &r, status).await;
            if let Err(e) = &outcome {
                tracing::warn!(link = link.name(), failover_id = r.id, error = %e, "failover stopped short; `POST /links/{}/failover` resumes it", link.name());
                // The report shows the whole chain.
                lock(&r.progress).error = Some(error_chain(e));
            } else {
                me.metrics
                    .failover_finished(link.name(), started.elapsed().as_secs_f64());
            }
            lock(&r.progress).finished = true;
            r.finished.send_replace(true);
        });
        Ok(run)
    }

    async fn run_failover(
        &self,
        link: &Link,
        run: &Run,
        status: LinkStatus,
    ) -> Result<(), FailoverError> {
        let state = self.loaded_state()?;
        let Some(placer) = &self.barriers else {
            return Err(ControlError::NotLoaded("no state store".into()).into());
        };
        let name = link.name();
        // 1. Every live instance drains the link (bounded).
        let started = tokio::time::Instant::now();
        let deadline = started + self.drain_timeout;
        let mut changes = state.control_changes();
        let unconfirmed = loop {
            let live = match self.live_instances().await {
                Ok(live) => live,
                Err(e) => {
                    tracing::warn!(link = name, error = %e, "could not list the live proxy instances; retrying");
                    vec![self.instance_id().to_string()]
                }
            };
            let drained = state.drained(name, run.id);
            let missing: Vec<String> = live.into_iter().filter(|i| !drained.contains(i)).collect();
            lock(&run.progress).unconfirmed = missing.clone();
            if missing.is_empty() || tokio::time::Instant::now() >= deadline {
                break missing;
            }
            tokio::select! {
                _ = changes.changed() => {}
                _ = tokio::time::sleep(MEMBERS_POLL) => {}
                _ = tokio::time::sleep_until(deadline) => {}
            }
        };
        if !unconfirmed.is_empty() {
            // An instance that did not confirm may be cut off from the state
            // topic, blind to STOPPING: its lease runs out at the latest a
            // lease after STOPPING was written (before this run began), and
            // then it forwards nothing of the link.
            let lease = state.lease();
            tracing::warn!(link = name, failover_id = run.id, unconfirmed = ?unconfirmed, lease_ms = lease.as_millis() as u64, "instances did not confirm draining the link within MIRROR_PROXY_FAILOVER_DRAIN_TIMEOUT_MS; placing the barriers once their state-topic lease has run out");
            tokio::time::sleep_until(started + lease).await;
        }
        // 2. Every partition of the link's topics.
        let mut partitions = placer
            .partitions(link)
            .await
            .map_err(FailoverError::Partitions)?;
        partitions.sort();
        lock(&run.progress).partitions = partitions
            .iter()
            .map(|(topic, partition)| PartitionProgress::Pending {
                topic: topic.clone(),
                partition: *partition,
            })
            .collect();
        // Up to BARRIER_CONCURRENCY partitions at a time: each waits for a
        // Produce, a ListOffsets and a state-topic write read back.
        let mut failed = 0usize;
        let mut tasks = tokio::task::JoinSet::new();
        let mut todo = partitions.iter().cloned().enumerate();
        loop {
            while tasks.len() < BARRIER_CONCURRENCY {
                let Some((i, (topic, partition))) = todo.next() else {
                    break;
                };
                let placer = Arc::clone(placer);
                let link = name.to_string();
                let (source, id) = (status.source, run.id);
                tasks.spawn(async move {
                    let mut attempt = 1;
                    loop {
                        let o = placer.place(&link, &source, id, &topic, partition).await;
                        if o.result != BarrierResult::Failed || attempt >= BARRIER_ATTEMPTS {
                            return (i, o);
                        }
                        attempt += 1;
                        tokio::time::sleep(BARRIER_RETRY).await;
                    }
                });
            }
            let Some(joined) = tasks.join_next().await else {
                break;
            };
            let Ok((i, outcome)) = joined else {
                failed += 1; // a panicked task: its partition stays pending
                continue;
            };
            self.metrics.barrier(outcome.result.as_str());
            if outcome.result == BarrierResult::Failed {
                failed += 1;
            }
            if let Some(slot) = lock(&run.progress).partitions.get_mut(i) {
                *slot = PartitionProgress::Done(outcome);
            }
        }
        if failed > 0 {
            return Err(FailoverError::Barriers {
                failed,
                total: partitions.len(),
                attempts: BARRIER_ATTEMPTS,
            });
        }
        // 3. STOPPED: the topics take local writes.
        let now = now_ms();
        let stopped = LinkStatus {
            state: LinkState::Stopped,
            since_ms: now,
            failover_finished_ms: now,
            ..status
        };
        let won = state
            .write_link_state(name, stopped)
            .await
            .map_err(FailoverError::PersistStopped)?;
        if !won && self.status(link).state != LinkState::Stopped {
            return Err(FailoverError::LostStopped(self.status(link).state.as_str()));
        }
        tracing::info!(
            link = name,
            failover_id = run.id,
            partitions = partitions.len(),
            "failover complete: link STOPPED, its topics take local writes"
        );
        Ok(())
    }

    /// `STOPPED` → `MIRRORING`, optionally with a new source cluster id.
    pub(crate) async fn start_link(
        &self,
        name: &str,
        new_source: Option<ClusterId>,
    ) -> Result<LinkReport, ControlError> {
        let link = self.link_by_name(name)?;
        let state = self.loaded_state()?;
        let current = self.status(link);
        link_state::start_from(name, &current)?;
        let next = LinkStatus {
            state: LinkState::Mirroring,
            since_ms: now_ms(),
            source: new_source.unwrap_or(current.source),
            ..current
        };
        let won = state
            .write_link_state(name, next)
            .await
            .map_err(ControlError::Write)?;
        if !won {
            return Err(Conflict::Raced {
                link: name.to_string(),
                state: self.status(link).state.as_str(),
            }
            .into());
        }
        if next.source != *link.source_cluster_id() {
            tracing::warn!(link = name, configured = %link.configured_source_cluster_id(), persisted = %next.source, "link started with a source cluster id other than MIRROR_PROXY_LINK_<NAME>_SOURCE_CLUSTER_ID: the producer id mapping and barriers use the new one on every instance (it is persisted with the link state)");
        }
        tracing::info!(link = name, source_cluster = %link.show_source_cluster(&next.source), "link started: MIRRORING");
        Ok(self.report(link))
    }

    // ---- reports ----

    fn report(&self, link: &Link) -> LinkReport {
        let status = self.status(link);
        let run = lock(&self.runs).get(link.name()).cloned();
        let failover = if status.failover_id < 0 && run.is_none() {
            None
        } else {
            let progress = run
                .as_ref()
                .filter(|r| r.id == status.failover_id)
                .map(|r| lock(&r.progress).clone());
            let partitions: Vec<BarrierRow> = match &progress {
                Some(p) => p.partitions.iter().map(barrier_row).collect(),
                None => self.recorded_partitions(link, status.failover_id),
            };
            let done = partitions
                .iter()
                .filter(|p| p.result != BarrierState::Pending)
                .count();
            let (unconfirmed_instances, error) = match progress {
                Some(p) => (p.unconfirmed, p.error),
                None => (Vec::new(), None),
            };
            Some(FailoverReport {
                id: status.failover_id,
                started_ms: status.failover_started_ms,
                finished_ms: (status.failover_finished_ms >= 0)
                    .then_some(status.failover_finished_ms),
                complete: status.state == LinkState::Stopped,
                partitions_total: partitions.len() as u64,
                partitions_done: done as u64,
                partitions,
                unconfirmed_instances,
                error,
            })
        };
        let c = self.counters.get(link.name());
        let count = |f: fn(&Counters) -> &AtomicU64| c.map_or(0, |c| f(c).load(Ordering::Relaxed));
        LinkReport {
            name: link.name().to_string(),
            state: status.state,
            since_ms: status.since_ms,
            source_cluster_id: link.show_source_cluster(&status.source),
            failover,
            counters: LinkCounters {
                local_writes_refused: count(|c| &c.local_writes_refused),
                link_requests_refused: count(|c| &c.link_requests_refused),
                connections_fenced: count(|c| &c.connections_fenced),
                open_link_connections: self.open_sessions(link.name()) as u64,
            },
        }
    }

    /// The barriers of failover `id` as recorded in the state topic (for a
    /// failover another instance ran).
    fn recorded_partitions(&self, link: &Link, id: i64) -> Vec<BarrierRow> {
        let Some(state) = &self.state else {
            return Vec::new();
        };
        let mut out: Vec<BarrierRow> = state
            .barriers_of(link.name())
            .into_iter()
            .filter(|(_, b)| b.value.failover_id == id)
            .map(|(k, b)| BarrierRow {
                topic: state
                    .topic_name(k.topic_id)
                    .unwrap_or_else(|| k.topic_id.to_string()),
                partition: k.partition,
                result: if b.value.accepted {
                    BarrierState::Accepted
                } else {
                    BarrierState::Refused
                },
                error_code: b.value.error_code,
                message: None,
                log_end_offset: b.value.log_end_offset,
                expired_producers: b.expired_here as u64,
            })
            .collect();
        out.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
        out
    }
}

fn barrier_row(p: &PartitionProgress) -> BarrierRow {
    match p {
        PartitionProgress::Pending { topic, partition } => BarrierRow {
            topic: topic.clone(),
            partition: *partition,
            result: BarrierState::Pending,
            error_code: -1,
            message: None,
            log_end_offset: -1,
            expired_producers: 0,
        },
        PartitionProgress::Done(o) => BarrierRow {
            topic: o.topic.clone(),
            partition: o.partition,
            result: match o.result {
                BarrierResult::Accepted => BarrierState::Accepted,
                BarrierResult::Refused => BarrierState::Refused,
                BarrierResult::Failed => BarrierState::Failed,
            },
            error_code: o.error_code,
            message: o.message.clone(),
            log_end_offset: o.log_end_offset,
            expired_producers: o.expired_producers as u64,
        },
    }
}
