//! The `__mirror_state` topic (`MIRROR_PROXY_STATE_TOPIC`): where every
//! proxy instance in front of one destination cluster keeps the origins of
//! the mapped producer ids and the salts of collisions, so that the mapping
//! survives restarts and is the same on every instance. Kafka is the only
//! store. `docs/state-topic.md` has every record's bytes.
//!
//! - `mirror::state_records`: the record codecs (pure).
//! - `topic`: records in and out of record batches (pure).
//! - `resolve`: writing records and resolving new origins, over the
//!   `resolve::Log` trait this store implements.
//! - `mac`: the optional state key's MACs (`MIRROR_PROXY_STATE_KEY`).
//! - this module: the I/O, on the proxy's own [`Client`].
//!
//! The topic has ONE partition: the order of its log decides which of two
//! racing claims on a slot wins (the lower claim offset, see
//! `mirror::origins`), and only a single partition gives every instance the
//! same total order of claims across all destination partitions.
//!
//! At start-up a loader task creates the topic if missing (compacted),
//! reads it from the log start to the end offset, then keeps tailing it
//! (Fetch with a 500 ms wait), so what other instances write applies here
//! within a second. Until the first load completes, link Produce requests
//! get a retriable error and `/readyz` says why; failures are retried with
//! backoff from 200 ms to 5 s (with jitter, `net::backoff`). A topic that exists with another cleanup
//! policy is fatal (`StateStore::fatal`).
//!
//! A new origin is resolved by `StateStore::resolve`: propose a slot
//! (salted if needed), write its claim (and the salt record) with acks=all,
//! wait until the tailer has applied past the write, and check that the
//! claim owns the slot; a loser proposes again (bounded). Concurrent
//! requests' origins are proposed and written together
//! (`resolve::Group`): one write carries the claims of every request
//! that queued while the previous write was in flight.
//!
//! Every record is checked before it is applied, and skipped (one WARN
//! line, `state_records_skipped_total`) when the proxy could not have
//! written it there: an origin's mapping (`mirror::origins`), a link
//! state, barrier or drained record out of the link's history
//! (`mirror::control_records`), or, with the state key, a record whose MAC
//! does not verify.
//!
//! The view is behind a std `RwLock`, never held across an await.

pub mod mac;
pub(crate) mod resolve;
pub mod topic;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tokio::sync::watch;
use uuid::Uuid;

use crate::client::protocol::{OffsetSpec, Produced};
use crate::client::{Client, ClientConfig, ClientError};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::mirror::control_records::{
    check_drained_tombstone, check_failover_record, check_link_state, Prior, Skip,
};
use crate::mirror::dedupe::Dedupe;
use crate::mirror::link::Links;
use crate::mirror::link_state::{LinkState, LinkStatus};
use crate::mirror::origins::{NoSlot, OriginId, Origins, PartitionId};
use crate::mirror::produce::Unresolved;
use crate::mirror::state_records::{
    BarrierKey, BarrierValue, DrainedKey, DrainedValue, StateRecord,
};
use crate::net::backoff::Backoff;
use crate::net::tasks::Tasks;
use crate::net::tls::TlsSetupError;
use crate::wire::batch::BuildError;
use mac::StateAuth;

/// Bytes asked for per Fetch of the state topic.
const FETCH_BYTES: i32 = 1024 * 1024;
/// How long a tailing Fetch waits for new records.
const TAIL_WAIT: Duration = Duration::from_millis(500);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How long a writer waits for the tailer to apply its write.
const APPLY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one state-topic operation (a write with its retries) may take.
const STATE_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
/// Proposals per origin before a resolve gives up (each lost race costs one).
const RESOLVE_ROUNDS: usize = 5;
/// How long a request waits for its origins, queued writes ahead included:
/// under the replicator's request timeout (30 s by default), so it gets a
/// retriable answer rather than none.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(25);

/// Why the state topic cannot be used at all (the proxy stops).
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    #[error("state topic {topic} (MIRROR_PROXY_STATE_TOPIC) has cleanup.policy={policy:?}; it must be compacted: fix the topic or choose another name")]
    NotCompacted { topic: String, policy: String },
}

/// Why a resolve failed for a partition (answered with a retriable error).
#[derive(Debug, Clone, thiserror::Error)]
pub enum ResolveError {
    #[error("the state topic is not loaded yet")]
    NotLoaded,
    /// A write that failed without an error of its own to carry (refused
    /// by the broker, not read back in time): what happened, in words.
    #[error("writing to the state topic failed: {0}")]
    Write(String),
    /// Shared, so that one failure can be reported for every partition it
    /// concerned.
    #[error("writing to the state topic failed")]
    Produce(#[source] Arc<ClientError>),
    #[error("writing to the state topic failed")]
    Encode(#[source] BuildError),
    #[error("looking up the topic id of {topic}")]
    TopicId {
        topic: String,
        #[source]
        cause: Arc<ClientError>,
    },
    #[error("looking up the topic id of {topic}: the broker reports no topic id")]
    NoTopicId { topic: String },
    #[error(transparent)]
    NoSlot(#[from] NoSlot),
    #[error("lost the race for a slot {RESOLVE_ROUNDS} times")]
    TooManyRaces,
}

/// The state store.
pub struct StateStore {
    client: Client,
    /// The tailer's own connections: its long-poll Fetch never holds the
    /// writes, rebuilds and barriers of `client` behind it.
    tail: Client,
    topic: String,
    metrics: Arc<Metrics>,
    view: RwLock<Origins>,
    /// The next offset the tailer will apply.
    applied: watch::Sender<i64>,
    loaded: AtomicBool,
    /// Why the store is not loaded yet (for `/readyz`).
    not_ready: Mutex<String>,
    fatal: watch::Sender<Option<String>>,
    /// Topic ids looked up with the client (topics a Produce named before
    /// any Metadata response through the proxy did). Looked up for every
    /// link Produce whose topics the proxy's own table lacks, hence foldhash.
    topic_ids: RwLock<foldhash::HashMap<String, Uuid>>,
    /// The resolves of this instance, grouped into shared writes: a
    /// resolve never races with itself, only with other instances.
    resolving: resolve::Group,
    expiration_ms: i64,
    /// The latest barrier of every (link, partition), with how many
    /// producers applying it expired on this instance.
    barriers: RwLock<HashMap<BarrierKey, AppliedBarrier>>,
    /// The producer state a barrier expires (set once the proxy has one).
    expires: OnceLock<Arc<Dedupe>>,
    /// Every link's latest applied state record (record type 5).
    links: RwLock<HashMap<String, LinkStatus>>,
    /// Which instance drained which link for which failover (type 7).
    drained: RwLock<HashMap<DrainedKey, DrainedValue>>,
    /// Bumped whenever a link state or drained record is applied.
    control_changed: watch::Sender<u64>,
    /// The configured links' initial statuses: what a link's first record
    /// must follow once the topic is loaded.
    initial: HashMap<String, LinkStatus>,
    /// The state key, if set: what is written is signed, what is read must
    /// verify.
    auth: Option<StateAuth>,
    /// The configured links, told their current source cluster as their
    /// state records are applied.
    configured: Links,
    /// How long a read of the whole topic (to its high watermark) lets
    /// this instance forward link traffic: see [`StateStore::lease_held`].
    lease: Duration,
    /// When the read that last renewed the lease was sent, in ms after
    /// `clock` (0: never).
    lease_renewed_ms: AtomicU64,
    clock: Instant,
}

/// A barrier record as this instance applied it.
#[derive(Debug, Clone)]
pub(crate) struct AppliedBarrier {
    pub value: BarrierValue,
    /// Mirrored producers of the partition this instance forgot on reading
    /// it (SPEC §7: the barrier expires the proxy's own state, on every
    /// instance that follows the state topic).
    pub expired_here: usize,
}

/// Wall-clock milliseconds.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

use crate::sync::{error_chain, lock, read, write};

/// A random salt from the operating system.
fn random_i64() -> i64 {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 8];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // Not expected; any value works as long as it is checked like others.
        b = now_ms().to_be_bytes();
    }
    i64::from_be_bytes(b)
}

impl StateStore {
    /// A store for `config` (not started).
    pub(crate) fn new(
        config: &Config,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<StateStore>, TlsSetupError> {
        let mut client = ClientConfig::from_config(config)?;
        client.client_id = "kafka-mirror-proxy-state".into();
        // A Produce waits on state writes: give up (retriable error to the
        // replicator) well before its own request timeout (30 s by default).
        client.operation_timeout = STATE_OPERATION_TIMEOUT;
        let clusters = config
            .links
            .iter()
            .map(|l| *l.source_cluster_id())
            .collect::<Vec<_>>();
        let initial = config
            .links
            .iter()
            .map(|l| {
                let status = LinkStatus::initial(l.initial_state(), *l.source_cluster_id());
                (l.name().to_string(), status)
            })
            .collect();
        let auth = config.state_key.as_ref().map(|key| {
            StateAuth::new(
                key.expose(),
                &config.state_topic,
                config.state_key_unsigned_before,
            )
        });
        let mut store = Self::build(
            Client::new(client),
            config.state_topic.clone(),
            clusters,
            metrics,
            i64::try_from(config.producer_expiration_ms).unwrap_or(i64::MAX),
        );
        store.initial = initial;
        store.auth = auth;
        store.configured = config.links.clone();
        store.lease = Duration::from_millis(config.instance_session_timeout_ms / 2);
        Ok(Arc::new(store))
    }

    /// A store without configured links or a state key (tests).
    pub fn with_client(
        client: Client,
        topic: String,
        clusters: Vec<crate::mirror::pid::ClusterId>,
        metrics: Arc<Metrics>,
        expiration_ms: i64,
    ) -> Arc<StateStore> {
        Arc::new(Self::build(client, topic, clusters, metrics, expiration_ms))
    }

    fn build(
        client: Client,
        topic: String,
        clusters: Vec<crate::mirror::pid::ClusterId>,
        metrics: Arc<Metrics>,
        expiration_ms: i64,
    ) -> StateStore {
        StateStore {
            tail: client.sibling(),
            client,
            not_ready: Mutex::new(format!("state topic {topic} not loaded yet")),
            topic,
            metrics,
            view: RwLock::new(Origins::new(clusters)),
            applied: watch::Sender::new(0),
            loaded: AtomicBool::new(false),
            fatal: watch::Sender::new(None),
            topic_ids: RwLock::new(foldhash::HashMap::default()),
            resolving: resolve::Group::default(),
            expiration_ms,
            barriers: RwLock::new(HashMap::new()),
            expires: OnceLock::new(),
            links: RwLock::new(HashMap::new()),
            drained: RwLock::new(HashMap::new()),
            control_changed: watch::Sender::new(0),
            initial: HashMap::new(),
            auth: None,
            configured: Links::default(),
            lease: Duration::MAX,
            lease_renewed_ms: AtomicU64::new(0),
            clock: Instant::now(),
        }
    }

    /// Whether this instance may forward link traffic: it has read the
    /// state topic to its high watermark with a Fetch sent less than the
    /// lease (half `INSTANCE_SESSION_TIMEOUT_MS`) ago. An instance cut off
    /// from the topic, or frozen, cannot see a failover begin; once its
    /// lease has run out it refuses link batches (retriable), and a
    /// failover that an instance did not confirm waits out the lease before
    /// its barriers, so nothing of the link lands after them.
    pub(crate) fn lease_held(&self) -> bool {
        let renewed = self.lease_renewed_ms.load(Ordering::Acquire);
        if renewed == 0 {
            return false;
        }
        let now = self.clock_ms();
        Duration::from_millis(now.saturating_sub(renewed)) <= self.lease
    }

    /// The lease (see [`StateStore::lease_held`]).
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Milliseconds after `clock`, at least 1.
    fn clock_ms(&self) -> u64 {
        u64::try_from(self.clock.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    fn renew_lease(&self, sent_ms: u64) {
        self.lease_renewed_ms.fetch_max(sent_ms, Ordering::AcqRel);
    }

    /// Start the loader/tailer and the expiry task.
    pub fn start(self: &Arc<Self>, tasks: &Tasks) {
        let me = Arc::clone(self);
        tasks.spawn(async move { me.load_and_tail().await });
        let me = Arc::clone(self);
        tasks.spawn(async move { me.expire_loop().await });
    }

    pub(crate) fn topic(&self) -> &str {
        &self.topic
    }

    /// The store's own client (acks=all, the state topic's connection
    /// settings), for the proxy's other requests of its own.
    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    /// From now on, every barrier record read from the topic (written by
    /// any instance) expires the mirrored producers of its partition in
    /// `dedupe`. Set once; later calls are ignored.
    pub(crate) fn expire_with(&self, dedupe: Arc<Dedupe>) {
        let _ = self.expires.set(dedupe);
    }

    /// The latest barrier of `key` read from the topic.
    pub(crate) fn barrier(&self, key: &BarrierKey) -> Option<AppliedBarrier> {
        read(&self.barriers).get(key).cloned()
    }

    /// Where the latest failover barrier of any link left `partition`: the
    /// log end offset it recorded. Mirrored batches below it belong to
    /// producers the barrier expired, so a rebuild of the producer state
    /// from the log starts there.
    pub(crate) fn barrier_floor(&self, partition: PartitionId) -> Option<i64> {
        read(&self.barriers)
            .iter()
            .filter(|(k, _)| k.topic_id == partition.topic_id && k.partition == partition.partition)
            .map(|(_, b)| b.value.log_end_offset)
            .max()
    }

    /// Persist a barrier (acks=all) and return once this instance has read
    /// it back and applied it (expiring the partition's producer state).
    pub(crate) async fn record_barrier(
        &self,
        key: BarrierKey,
        value: BarrierValue,
    ) -> Result<AppliedBarrier, ResolveError> {
        let failover_id = value.failover_id;
        self.write(&[StateRecord::Barrier(key.clone(), Some(value))])
            .await?;
        match self.barrier(&key) {
            Some(b) if b.value.failover_id == failover_id => Ok(b),
            _ => Err(ResolveError::Write(format!(
                "barrier of {} partition {} read back as another failover's",
                key.link, key.partition
            ))),
        }
    }

    /// Every barrier of `link` read from the topic.
    pub(crate) fn barriers_of(&self, link: &str) -> Vec<(BarrierKey, AppliedBarrier)> {
        read(&self.barriers)
            .iter()
            .filter(|(k, _)| k.link == link)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The latest state record of `link` applied, if the topic has one.
    pub fn link_status(&self, link: &str) -> Option<LinkStatus> {
        read(&self.links).get(link).copied()
    }

    /// The instances that drained `link` for failover `failover_id`.
    pub(crate) fn drained(&self, link: &str, failover_id: i64) -> Vec<String> {
        read(&self.drained)
            .iter()
            .filter(|(k, v)| k.link == link && v.failover_id == failover_id)
            .map(|(k, _)| k.instance.clone())
            .collect()
    }

    /// Tombstone the drained records of `link` (of failovers before the
    /// one about to begin), so that compaction removes them: one per
    /// instance and failover would otherwise stay for ever, and instance
    /// ids are new with every process by default. Returns how many.
    pub(crate) async fn forget_drained(&self, link: &str) -> Result<usize, ResolveError> {
        let records: Vec<StateRecord> = read(&self.drained)
            .keys()
            .filter(|k| k.link == link)
            .map(|k| StateRecord::Drained(k.clone(), None))
            .collect();
        if records.is_empty() {
            return Ok(0);
        }
        self.write(&records).await?;
        Ok(records.len())
    }

    /// Changes whenever a link state or drained record is applied.
    pub(crate) fn control_changes(&self) -> watch::Receiver<u64> {
        self.control_changed.subscribe()
    }

    /// Persist `status` for `link` (acks=all) and return once this instance
    /// has applied it; `Ok(false)` when it did not apply because another
    /// record won the race (the store's status is then the winner's).
    pub async fn write_link_state(
        &self,
        link: &str,
        status: LinkStatus,
    ) -> Result<bool, ResolveError> {
        self.write(&[StateRecord::LinkState(link.to_string(), Some(status))])
            .await?;
        Ok(self.link_status(link) == Some(status))
    }

    /// Persist that this instance drained `key.link` for a failover.
    pub(crate) async fn write_drained(
        &self,
        key: DrainedKey,
        value: DrainedValue,
    ) -> Result<(), ResolveError> {
        self.write(&[StateRecord::Drained(key, Some(value))])
            .await
            .map(|_| ())
    }

    /// What this instance knows of `link` before its next record: its
    /// latest applied status; once loaded, its configured initial status
    /// (a link not configured here starts MIRRORING, never failed over);
    /// while loading, nothing (earlier records may be compacted away).
    fn prior<'a>(
        &'a self,
        links: &'a HashMap<String, LinkStatus>,
        link: &str,
        never: &'a LinkStatus,
    ) -> Prior<'a> {
        match links.get(link) {
            Some(s) => Prior::Known(s),
            None if !self.is_loaded() => Prior::Unknown,
            None => Prior::Known(self.initial.get(link).unwrap_or(never)),
        }
    }

    /// One line and one count for a record skipped.
    fn skipped(&self, offset: i64, record: &str, link: &str, why: &dyn std::fmt::Display) {
        tracing::warn!(topic = %self.topic, offset, record, link = ?link, reason = %why, "skipped a state record the proxy could not have written there");
        self.metrics.state.record_skipped();
    }

    /// Apply link state, barrier and drained records in log order, each
    /// only if it fits the link's history (`mirror::control_records`).
    fn apply_control(&self, applied: Vec<(i64, StateRecord)>) {
        if applied.is_empty() {
            return;
        }
        let never = LinkStatus::initial(
            LinkState::Mirroring,
            crate::mirror::pid::ClusterId::from_bytes([0; 16]),
        );
        for (offset, record) in applied {
            match record {
                StateRecord::LinkState(link, next) => {
                    let mut links = write(&self.links);
                    let checked =
                        check_link_state(self.prior(&links, &link, &never), next.as_ref());
                    match (checked, next) {
                        (Ok(()), Some(next)) => {
                            tracing::info!(link = ?link, state = next.state.as_str(), failover_id = next.failover_id, "link state applied");
                            if let Some(l) = self.configured.iter().find(|l| l.name() == link) {
                                l.set_current_source(next.source);
                            }
                            links.insert(link, next);
                            drop(links);
                            // A source given to `start` maps from now on, on
                            // every instance (the link above), and its natural
                            // region is no salted origin's to take.
                            write(&self.view).know_cluster(next.source);
                        }
                        (Err(Skip::LostRace), Some(next)) => {
                            tracing::info!(link = ?link, offset, ignored_failover = next.failover_id, "link state record ignored: a STOPPING of another failover than the one in progress (a lost race)");
                        }
                        (Err(why), next) => {
                            drop(links);
                            let state = next.map_or("tombstone", |n| n.state.as_str());
                            self.skipped(offset, state, &link, &why);
                        }
                        (Ok(()), None) => {}
                    }
                }
                StateRecord::Drained(k, v) => {
                    let links = read(&self.links);
                    let prior = self.prior(&links, &k.link, &never);
                    let checked = match v {
                        Some(v) => check_failover_record(prior, v.failover_id, false),
                        None => check_drained_tombstone(prior),
                    };
                    drop(links);
                    match (checked, v) {
                        (Ok(()), Some(v)) => {
                            write(&self.drained).insert(k, v);
                        }
                        (Ok(()), None) => {
                            write(&self.drained).remove(&k);
                        }
                        (Err(why), _) => self.skipped(offset, "drained", &k.link, &why),
                    }
                }
                StateRecord::Barrier(k, v) => {
                    let links = read(&self.links);
                    let id = v.as_ref().map_or(-1, |v| v.failover_id);
                    let checked =
                        check_failover_record(self.prior(&links, &k.link, &never), id, v.is_none());
                    drop(links);
                    match (checked, v) {
                        (Ok(()), Some(v)) => self.apply_barrier(k, v),
                        (Err(why), _) => self.skipped(offset, "barrier", &k.link, &why),
                        (Ok(()), None) => {}
                    }
                }
                _ => {}
            }
        }
        self.control_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Apply one barrier record read from the topic: remember it, and
    /// expire the producer state of its partition.
    fn apply_barrier(&self, key: BarrierKey, value: BarrierValue) {
        let partition = PartitionId {
            topic_id: key.topic_id,
            partition: key.partition,
        };
        let expired_here = self
            .expires
            .get()
            .map_or(0, |d| d.expire_partition(partition));
        tracing::info!(
            link = ?key.link,
            topic_id = %key.topic_id,
            partition = key.partition,
            failover_id = value.failover_id,
            log_end_offset = value.log_end_offset,
            accepted = value.accepted,
            expired = expired_here,
            "failover barrier applied: mirrored producer state of the partition expired"
        );
        write(&self.barriers).insert(
            key,
            AppliedBarrier {
                value,
                expired_here,
            },
        );
    }

    /// Whether the first full load is done.
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Why the store is not ready, if it is not.
    pub fn not_ready_reason(&self) -> Option<String> {
        if self.is_loaded() {
            return None;
        }
        Some(lock(&self.not_ready).clone())
    }

    /// Resolves with the reason once the state topic turned out unusable.
    pub(crate) async fn fatal(&self) -> String {
        let mut rx = self.fatal.subscribe();
        let why = match rx.wait_for(|f| f.is_some()).await {
            Ok(f) => f.clone(),
            Err(_) => None,
        };
        match why {
            Some(why) => why,
            None => std::future::pending().await,
        }
    }

    /// The origins view (do not hold across an await).
    pub(crate) fn view(&self) -> RwLockReadGuard<'_, Origins> {
        read(&self.view)
    }

    /// The name of a topic id the store looked up itself.
    pub(crate) fn topic_name(&self, id: Uuid) -> Option<String> {
        read(&self.topic_ids)
            .iter()
            .find(|(_, v)| **v == id)
            .map(|(k, _)| k.clone())
    }

    /// Every topic's (id, name), fresh from a broker.
    pub(crate) async fn all_topic_ids(&self) -> Result<Vec<(Uuid, String)>, ClientError> {
        let info = self.client.metadata(None).await?;
        Ok(info
            .topics
            .into_iter()
            .filter(|t| !t.topic_id.is_nil())
            .map(|t| (t.topic_id, t.name))
            .collect())
    }

    /// A topic id the store looked up itself.
    pub(crate) fn topic_id(&self, name: &str) -> Option<Uuid> {
        read(&self.topic_ids).get(name).copied()
    }

    fn set_not_ready(&self, why: String) {
        *lock(&self.not_ready) = why;
    }

    async fn load_and_tail(self: Arc<Self>) {
        let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
        let started = Instant::now();
        let mut next = loop {
            // Loaded, the topic is read to the end listed after this.
            let sent = self.clock_ms();
            match self.load().await {
                Ok(next) => {
                    self.renew_lease(sent);
                    break next;
                }
                Err(ClientError::NotCompacted { topic, policy }) => {
                    let e = StateError::NotCompacted { topic, policy };
                    tracing::error!(error = %e, "state topic unusable");
                    self.set_not_ready(e.to_string());
                    self.fatal.send_replace(Some(e.to_string()));
                    return;
                }
                Err(e) => {
                    let reason =
                        format!("state topic {} not loaded: {}", self.topic, error_chain(&e));
                    let delay = backoff.next_delay();
                    tracing::warn!(topic = %self.topic, error = %error_chain(&e), retry_ms = delay.as_millis() as u64, "loading the state topic failed; retrying");
                    self.set_not_ready(reason);
                    tokio::time::sleep(delay).await;
                }
            }
        };
        let took = started.elapsed();
        self.metrics.state.loaded(took.as_secs_f64());
        self.loaded.store(true, Ordering::Release);
        tracing::info!(
            topic = %self.topic,
            origins = self.view().len(),
            next_offset = next,
            took_ms = took.as_millis() as u64,
            "state topic loaded"
        );
        backoff.reset();
        loop {
            // The lease runs from when the Fetch was sent: its answer says
            // nothing of what was written after that.
            let sent = self.clock_ms();
            match self
                .tail
                .fetch(&self.topic, 0, next, FETCH_BYTES, TAIL_WAIT)
                .await
            {
                Ok(f) => {
                    next = self.apply(&f.records, next);
                    if next >= f.high_watermark {
                        self.renew_lease(sent);
                    }
                    backoff.reset();
                }
                Err(e) => {
                    tracing::warn!(topic = %self.topic, offset = next, error = %error_chain(&e), "tailing the state topic failed; retrying");
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            }
        }
    }

    /// Create the topic if needed and read it whole; returns the next offset.
    async fn load(&self) -> Result<i64, ClientError> {
        let topic = self.client.ensure_compacted_topic(&self.topic, 1).await?;
        if !matches!(topic.compression.as_str(), "producer" | "uncompressed") {
            tracing::warn!(
                topic = %self.topic,
                compression = %topic.compression,
                "the state topic's compression.type (set on the topic or inherited from the brokers) makes the brokers recompress every state batch; the proxy reads them, but set compression.type=producer on the topic to keep them as written"
            );
        }
        let start = self
            .client
            .list_offset(&self.topic, 0, OffsetSpec::Earliest)
            .await?
            .offset;
        let end = self
            .client
            .list_offset(&self.topic, 0, OffsetSpec::Latest)
            .await?
            .offset;
        let mut next = start.max(*self.applied.borrow());
        while next < end {
            let f = self
                .client
                .fetch(&self.topic, 0, next, FETCH_BYTES, Duration::ZERO)
                .await?;
            let after = self.apply(&f.records, next);
            if after == next {
                // Nothing whole came back: the tailer goes on from here.
                break;
            }
            next = after;
        }
        Ok(next)
    }

    /// Apply fetched batches from `from`; returns the next offset.
    fn apply(&self, records: &Bytes, from: i64) -> i64 {
        if records.is_empty() {
            return from;
        }
        // Link control records in log order, applied once the view's lock
        // is released (a barrier expires producer state).
        let mut control = Vec::new();
        let next = {
            let mut view = write(&self.view);
            let next = topic::read_batches(
                records,
                from,
                self.auth.as_ref(),
                |offset, r| match r {
                    Ok(
                        r @ (StateRecord::Barrier(..)
                        | StateRecord::LinkState(..)
                        | StateRecord::Drained(..)),
                    ) => control.push((offset, r)),
                    Ok(record) => {
                        if !view.apply(offset, &record) {
                            tracing::warn!(topic = %self.topic, offset, record = ?record, "skipped a state record whose mapping the proxy could not have written");
                            self.metrics.state.record_skipped();
                        }
                    }
                    Err(e @ topic::SkipReason::Mac(_)) => {
                        tracing::warn!(topic = %self.topic, offset, reason = %error_chain(&e), "skipped a state record that is not signed with the state key");
                        self.metrics.state.record_skipped();
                    }
                    Err(e) => {
                        tracing::warn!(topic = %self.topic, offset, reason = %error_chain(&e), "skipped a state record")
                    }
                },
            );
            self.metrics.state.origins_known(view.len());
            next
        };
        self.apply_control(control);
        self.applied.send_if_modified(|a| {
            let moved = next > *a;
            if moved {
                *a = next;
            }
            moved
        });
        next
    }

    /// Write `records` in one batch; returns the offset of the first.
    async fn write(&self, records: &[StateRecord]) -> Result<i64, ResolveError> {
        resolve::write(self, &self.metrics.state, &self.topic, records).await
    }

    /// The id of topic `name` (cached).
    pub(crate) async fn lookup_topic_id(&self, name: &str) -> Result<Uuid, ResolveError> {
        if let Some(id) = self.topic_id(name) {
            return Ok(id);
        }
        let info = self
            .client
            .topic(name)
            .await
            .map_err(|e| ResolveError::TopicId {
                topic: name.to_string(),
                cause: Arc::new(e),
            })?;
        if info.topic_id.is_nil() {
            return Err(ResolveError::NoTopicId {
                topic: name.to_string(),
            });
        }
        write(&self.topic_ids).insert(name.to_string(), info.topic_id);
        Ok(info.topic_id)
    }

    /// Give every unresolved origin a mapped PID, persisted before this
    /// returns. Returns the partitions that could not be resolved (by topic
    /// name and partition index), with why.
    pub(crate) async fn resolve(
        &self,
        unresolved: &[Unresolved],
    ) -> Vec<(String, i32, ResolveError)> {
        let mut failed = Vec::new();
        if !self.is_loaded() {
            for u in unresolved {
                failed.push((
                    u.topic.clone(),
                    u.partition.partition,
                    ResolveError::NotLoaded,
                ));
            }
            return failed;
        }
        // Topic ids the plan did not know.
        let mut todo: Vec<(String, PartitionId, OriginId)> = Vec::new();
        for u in unresolved {
            let mut p = u.partition;
            if p.topic_id.is_nil() {
                match self.lookup_topic_id(&u.topic).await {
                    Ok(id) => p.topic_id = id,
                    Err(e) => {
                        failed.push((u.topic.clone(), p.partition, e));
                        continue;
                    }
                }
            }
            if !todo.iter().any(|(_, q, o)| *q == p && *o == u.origin) {
                todo.push((u.topic.clone(), p, u.origin));
            }
        }
        if todo.is_empty() {
            return failed;
        }
        failed.extend(
            self.resolving
                .resolve(
                    self,
                    &self.metrics.state,
                    &self.topic,
                    todo,
                    random_i64,
                    RESOLVE_TIMEOUT,
                )
                .await,
        );
        failed
    }

    /// Persist last-seen times (at most once per tenth of the expiration
    /// period per origin) and tombstone origins idle for the whole period.
    async fn expire_loop(self: Arc<Self>) {
        let period = self.expiration_ms.max(1);
        let interval = Duration::from_millis(u64::try_from(period / 10).unwrap_or(1).max(100));
        loop {
            tokio::time::sleep(interval).await;
            if !self.is_loaded() {
                continue;
            }
            let now = now_ms();
            let (refresh, expired) = {
                let view = self.view();
                (view.due_refresh(period / 10), view.expired(now, period))
            };
            let mut records: Vec<StateRecord> = Vec::new();
            let stale = write(&self.view).take_stale_refreshes();
            if !stale.is_empty() {
                tracing::info!(
                    origins = stale.len(),
                    "tombstoning again mirrored producers whose refresh raced their expiry, so compaction cannot revive them"
                );
            }
            records.extend(stale.into_iter().map(|k| StateRecord::Origin(k, None)));
            let expired_keys: HashSet<_> = expired.iter().map(|(p, o, _)| (*p, *o)).collect();
            for (p, o, v) in refresh {
                if !expired_keys.contains(&(p, o)) {
                    records.push(StateRecord::Origin(o.key(p), Some(v)));
                }
            }
            for (p, o, salted) in &expired {
                tracing::info!(partition = p.partition, topic_id = %p.topic_id, source_cluster = %o.source, pid = o.pid, "mirrored producer expired (MIRROR_PROXY_PRODUCER_EXPIRATION_MS): tombstoning its state");
                records.push(StateRecord::Origin(o.key(*p), None));
                if *salted {
                    records.push(StateRecord::Collision(o.key(*p), None));
                }
            }
            if records.is_empty() {
                continue;
            }
            let _one_at_a_time = self.resolving.exclusive().await;
            // Batches of at most 1000 records keep each write small.
            for chunk in records.chunks(1000) {
                if self.write(chunk).await.is_err() {
                    break;
                }
            }
        }
    }
}

impl resolve::Log for StateStore {
    async fn append(&self, records: &[StateRecord]) -> Result<i64, ResolveError> {
        let batch = topic::encode_batch(records, now_ms(), self.auth.as_ref())
            .map_err(ResolveError::Encode)?;
        let produced = self
            .client
            .produce(&self.topic, 0, Bytes::from(batch))
            .await
            .map_err(|e| ResolveError::Produce(Arc::new(e)))?;
        match produced {
            Produced::Appended { base_offset, .. } => Ok(base_offset),
            Produced::Refused { code, message } => Err(ResolveError::Write(format!(
                "refused with error {code}: {}",
                message.unwrap_or_default()
            ))),
        }
    }

    async fn wait_applied(&self, past: i64, timeout: Duration) -> bool {
        let mut rx = self.applied.subscribe();
        tokio::time::timeout(timeout, rx.wait_for(|a| *a >= past))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    fn view(&self) -> RwLockReadGuard<'_, Origins> {
        read(&self.view)
    }
}

/// Read a state topic whole into a view (for `kafka-mirror-proxy unmap`):
/// corrupt or unknown records, and with `auth` unsigned ones, are skipped,
/// as when the proxy loads it.
pub(crate) async fn read_view(
    client: &Client,
    topic: &str,
    auth: Option<&StateAuth>,
) -> Result<Origins, ClientError> {
    let mut view = Origins::default();
    for_each_state_record(client, topic, auth, |offset, record| {
        if !view.apply(offset, &record) {
            tracing::warn!(topic, offset, record = ?record, "skipped a state record whose mapping the proxy could not have written");
        }
    })
    .await?;
    Ok(view)
}

/// Every state record of `topic` (read from its start; with `auth`, only
/// those signed with the key), in log order.
pub(crate) async fn for_each_state_record(
    client: &Client,
    topic: &str,
    auth: Option<&StateAuth>,
    mut on: impl FnMut(i64, StateRecord),
) -> Result<(), ClientError> {
    let start = client
        .list_offset(topic, 0, OffsetSpec::Earliest)
        .await?
        .offset;
    let end = client
        .list_offset(topic, 0, OffsetSpec::Latest)
        .await?
        .offset;
    let mut next = start;
    while next < end {
        let f = client
            .fetch(topic, 0, next, FETCH_BYTES, Duration::ZERO)
            .await?;
        let after = topic::read_batches(&f.records, next, auth, |offset, r| {
            if let Ok(record) = r {
                on(offset, record);
            }
        });
        if after == next {
            break;
        }
        next = after;
    }
    Ok(())
}
