//! The proxy's own Kafka client: how the proxy talks to the destination
//! brokers on its own behalf (the `__mirror_state` topic, the failover
//! barrier, reading a partition's tail), never on behalf of a user.
//!
//! - `bulk`: the replicator's many-partition Fetch and Produce (pure).
//! - `conn`: one broker connection through `net::upstream::Upstream` (TCP,
//!   TLS with the upstream settings), ApiVersions negotiation, SASL.
//! - `protocol`: request builders and response interpreters (pure); every
//!   response is walked with Kafka's schema before `kafka-protocol` decodes it.
//! - `group`: group membership requests (FindCoordinator, JoinGroup,
//!   SyncGroup, Heartbeat, LeaveGroup, DescribeGroups; pure).
//! - `offsets`: a group's committed offsets (OffsetCommit, OffsetFetch).
//! - `metadata`: brokers and partition leaders, cached (pure).
//! - `topics`: a topic's own configs, partitions added, configs altered.
//! - `error`: [`ClientError`] and which errors are retried.
//!
//! The [`Client`] keeps one connection per broker address, sends one request
//! at a time on each, looks partition leaders up in its metadata cache
//! (refreshing it when a broker says it is not the leader, or a connection
//! breaks), and retries retriable errors with exponential backoff until the
//! operation timeout. Records go out and come back as raw bytes: the client
//! never builds, decompresses or re-encodes a record batch.

pub(crate) mod bulk;
pub mod conn;
pub(crate) mod error;
pub(crate) mod group;
pub mod metadata;
pub mod offsets;
pub mod protocol;
pub mod topics;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::Config;
use crate::net::backoff::Backoff;
use crate::net::tls::TlsSetupError;
use crate::net::upstream::{ConnectError, Upstream};
use conn::Connection;
pub use error::ClientError;
use metadata::{Broker, Cluster, ClusterInfo, Leader, Lookup, TopicInfo};
use protocol::{
    Created, Fetched, IsolationLevel, ListedOffset, NewTopic, OffsetSpec, PartitionRef, Produced,
    Rpc,
};

/// How the client connects and how patient it is.
#[derive(Clone)]
pub struct ClientConfig {
    /// host:port of brokers to ask first (the proxy's BOOTSTRAP_SERVERS).
    pub bootstrap: Vec<String>,
    /// TCP/TLS connection settings, shared with the proxy's forwarding.
    pub upstream: Upstream,
    pub sasl: Option<crate::wire::sasl::Credentials>,
    pub client_id: String,
    /// Largest response frame accepted.
    pub max_frame_bytes: usize,
    /// Bound on one request's round trip (a Fetch adds its max wait).
    pub request_timeout: Duration,
    /// No new attempt of an operation starts after this much time.
    pub operation_timeout: Duration,
    /// First pause before a retry; doubles up to `retry_backoff_max`
    /// (with jitter, `net::backoff`).
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
    /// Cached leaders older than this are looked up again.
    pub metadata_max_age: Duration,
}

impl ClientConfig {
    /// Defaults in the spirit of Kafka's clients: 30 s per request, 60 s
    /// per operation, backoff 100 ms to 1 s, metadata kept 5 minutes.
    pub fn new(bootstrap: Vec<String>, upstream: Upstream) -> ClientConfig {
        ClientConfig {
            bootstrap,
            upstream,
            sasl: None,
            client_id: "kafka-mirror-proxy".into(),
            max_frame_bytes: 100 * 1024 * 1024,
            request_timeout: Duration::from_secs(30),
            operation_timeout: Duration::from_secs(60),
            retry_backoff: Duration::from_millis(100),
            retry_backoff_max: Duration::from_secs(1),
            metadata_max_age: Duration::from_secs(300),
        }
    }

    /// From the proxy's configuration: its bootstrap servers, upstream TLS,
    /// connect timeout, frame limit and `UPSTREAM_SASL_*` credentials.
    pub fn from_config(config: &Config) -> Result<ClientConfig, TlsSetupError> {
        let mut c = ClientConfig::new(
            config.bootstrap_servers.clone(),
            Upstream::from_config(config)?,
        );
        c.sasl = config.upstream_sasl.clone();
        c.max_frame_bytes = config.max_frame_bytes;
        Ok(c)
    }

    /// Plain TCP to `bootstrap` (`host:port,...`), for the operator's
    /// commands and a failback's other cluster.
    pub(crate) fn plain(bootstrap: &str) -> ClientConfig {
        let bootstrap = bootstrap.split(',').map(|s| s.trim().to_string()).collect();
        ClientConfig::new(
            bootstrap,
            Upstream {
                tls: None,
                server_name: None,
                timeout: Duration::from_secs(10),
            },
        )
    }
}

type Slot = Arc<tokio::sync::Mutex<Option<Connection>>>;

struct Inner {
    config: ClientConfig,
    cluster: Mutex<Cluster>,
    /// One connection per broker address, opened on first use.
    connections: Mutex<HashMap<String, Slot>>,
    /// The address that last answered a request any broker can answer.
    last_good: Mutex<Option<String>>,
}

/// The client. Cheap to clone; clones share connections and metadata.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

/// What [`Client::ensure_compacted_topic`] found or did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompactedTopic {
    /// Created now (else it existed and its policy was checked).
    pub created: bool,
    pub cleanup_policy: String,
    /// Its effective `compression.type` (`producer`: batches kept as
    /// written).
    pub compression: String,
}

use crate::sync::{error_chain, lock};

fn millis_i32(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX)
}

impl Client {
    pub fn new(config: ClientConfig) -> Client {
        let cluster = Cluster::new(config.metadata_max_age);
        Client {
            inner: Arc::new(Inner {
                config,
                cluster: Mutex::new(cluster),
                connections: Mutex::new(HashMap::new()),
                last_good: Mutex::new(None),
            }),
        }
    }

    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.config
    }

    /// A client with the same settings and connections of its own. A
    /// connection carries one request at a time: a long poll (a tailer's
    /// Fetch) on a shared one would hold every other request to that broker
    /// for its whole wait.
    pub(crate) fn sibling(&self) -> Client {
        Client::new(self.inner.config.clone())
    }

    /// Metadata for `topics` (`None`: every topic), fresh from a broker.
    /// Topics the broker answers with an error are listed in
    /// `topic_errors`, not failed.
    pub async fn metadata(&self, topics: Option<&[&str]>) -> Result<ClusterInfo, ClientError> {
        let topics: Option<Vec<String>> = topics.map(|t| t.iter().map(|s| s.to_string()).collect());
        let topics = topics.as_deref();
        self.retrying("metadata", || self.refresh(topics)).await
    }

    /// The brokers of the cluster.
    pub async fn brokers(&self) -> Result<Vec<Broker>, ClientError> {
        Ok(self.metadata(Some(&[])).await?.brokers)
    }

    /// One topic's partitions and leaders; retried while the topic is
    /// unknown (e.g. just created) until the operation timeout.
    pub async fn topic(&self, name: &str) -> Result<TopicInfo, ClientError> {
        let asked = &[name.to_string()];
        self.retrying(&format!("metadata of {name}"), || async move {
            let info = self.refresh(Some(asked)).await?;
            if let Some((_, code)) = info.topic_errors.iter().find(|(n, _)| n == name) {
                return Err(ClientError::Kafka {
                    context: format!("metadata of {name}"),
                    code: *code,
                    message: None,
                });
            }
            info.topics
                .into_iter()
                .find(|t| t.name == name)
                .ok_or_else(|| ClientError::Kafka {
                    context: format!("metadata of {name}"),
                    code: 3,
                    message: None,
                })
        })
        .await
    }

    /// Create a topic. An existing topic is reported, not failed.
    pub async fn create_topic(&self, topic: &NewTopic) -> Result<Created, ClientError> {
        let timeout_ms = millis_i32(self.inner.config.request_timeout * 9 / 10);
        self.retrying(&format!("create topic {}", topic.name), || async move {
            // KRaft brokers forward to the controller; its own broker is
            // the shortest path when Metadata named it.
            let controller = lock(&self.inner.cluster).controller_address();
            let (_, r) = self
                .call_any(controller, |_| {
                    Ok(protocol::create_topics_request(topic, timeout_ms))
                })
                .await?;
            protocol::create_topics_result(&r, &topic.name)
        })
        .await
    }

    /// The values of `keys` in a topic's configuration (all when empty).
    pub async fn describe_topic_config(
        &self,
        topic: &str,
        keys: &[&str],
    ) -> Result<BTreeMap<String, Option<String>>, ClientError> {
        self.retrying(&format!("describe configs of {topic}"), || async move {
            let (_, r) = self
                .call_any(None, |_| {
                    Ok(protocol::describe_topic_config_request(topic, keys))
                })
                .await?;
            protocol::describe_topic_config_result(&r, topic)
        })
        .await
    }

    /// Make sure `name` exists and is compacted: create it with
    /// `cleanup.policy=compact`, `compression.type=producer` (a broker-wide
    /// `compression.type` would otherwise recompress every batch),
    /// replication factor min(3, brokers) and `min.insync.replicas` min(2,
    /// replication factor); if it exists, check that its cleanup policy
    /// includes `compact` and report its effective compression.
    pub async fn ensure_compacted_topic(
        &self,
        name: &str,
        partitions: i32,
    ) -> Result<CompactedTopic, ClientError> {
        let brokers = self.brokers().await?;
        let (replication_factor, min_isr) = protocol::compacted_topic_settings(brokers.len());
        let topic = NewTopic {
            name: name.to_string(),
            partitions,
            replication_factor,
            configs: vec![
                ("cleanup.policy".into(), "compact".into()),
                ("compression.type".into(), "producer".into()),
                ("min.insync.replicas".into(), min_isr.to_string()),
            ],
        };
        if let Created::Created { .. } = self.create_topic(&topic).await? {
            tracing::info!(
                topic = name,
                partitions,
                replication_factor,
                min_isr,
                "created compacted topic"
            );
            return Ok(CompactedTopic {
                created: true,
                cleanup_policy: "compact".into(),
                compression: "producer".into(),
            });
        }
        let configs = self
            .describe_topic_config(name, &["cleanup.policy", "compression.type"])
            .await?;
        let config = |key: &str| configs.get(key).cloned().flatten().unwrap_or_default();
        let policy = config("cleanup.policy");
        if !protocol::is_compacted(&policy) {
            return Err(ClientError::NotCompacted {
                topic: name.to_string(),
                policy,
            });
        }
        Ok(CompactedTopic {
            created: false,
            cleanup_policy: policy,
            compression: config("compression.type"),
        })
    }

    /// Write `records` (whole record batches, sent byte for byte) to one
    /// partition's leader with `acks=all`. Retriable errors are retried
    /// with the same bytes, so a retry after a lost answer can append them
    /// twice (as with any non-idempotent producer).
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> Result<Produced, ClientError> {
        self.produce_transactional(topic, partition, records, None)
            .await
    }

    /// [`produce`](Self::produce) with a transactional id in the request,
    /// which brokers require when a batch has the transactional attribute
    /// (the replicator copies such batches as they are).
    pub(crate) async fn produce_transactional(
        &self,
        topic: &str,
        partition: i32,
        records: Bytes,
        transactional_id: Option<&str>,
    ) -> Result<Produced, ClientError> {
        let timeout_ms = millis_i32(self.inner.config.request_timeout * 9 / 10);
        let records = &records;
        self.retrying(&format!("produce to {topic}-{partition}"), || async move {
            let leader = self.leader(topic, partition).await?;
            let to = partition_ref(topic, partition, &leader);
            let (version, r) = self
                .call(&leader.address, Duration::ZERO, |v| {
                    protocol::produce_request_transactional(
                        v,
                        &to,
                        records.clone(),
                        timeout_ms,
                        transactional_id,
                    )
                })
                .await?;
            protocol::produce_result(&r, version, &to)
        })
        .await
    }

    /// Read record batches of one partition from `offset`, at most about
    /// `max_bytes` (see `protocol::fetch_request`), waiting up to
    /// `max_wait` for data to arrive. The records come back untouched.
    pub async fn fetch(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        max_wait: Duration,
    ) -> Result<Fetched, ClientError> {
        self.fetch_isolated(
            topic,
            partition,
            offset,
            max_bytes,
            max_wait,
            IsolationLevel::ReadUncommitted,
        )
        .await
    }

    /// [`fetch`](Self::fetch) at an isolation level: read_committed stops
    /// at the last stable offset and lists the aborted transactions.
    pub async fn fetch_isolated(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        max_wait: Duration,
        isolation: IsolationLevel,
    ) -> Result<Fetched, ClientError> {
        let wait_ms = millis_i32(max_wait);
        self.retrying(&format!("fetch from {topic}-{partition}"), || async move {
            let leader = self.leader(topic, partition).await?;
            let from = partition_ref(topic, partition, &leader);
            let (version, r) = self
                .call(&leader.address, max_wait, |v| {
                    protocol::fetch_request_isolated(
                        v, &from, offset, max_bytes, wait_ms, isolation,
                    )
                })
                .await?;
            protocol::fetch_result(&r, version, &from)
        })
        .await
    }

    /// The earliest or latest offset of a partition, or the first at a time.
    pub async fn list_offset(
        &self,
        topic: &str,
        partition: i32,
        spec: OffsetSpec,
    ) -> Result<ListedOffset, ClientError> {
        let timeout_ms = millis_i32(self.inner.config.request_timeout * 9 / 10);
        self.retrying(
            &format!("list offsets of {topic}-{partition}"),
            || async move {
                let leader = self.leader(topic, partition).await?;
                let of = partition_ref(topic, partition, &leader);
                let (_, r) = self
                    .call(&leader.address, Duration::ZERO, |v| {
                        Ok(protocol::list_offsets_request(v, &of, spec, timeout_ms))
                    })
                    .await?;
                protocol::list_offsets_result(&r, &of)
            },
        )
        .await
    }

    /// The `host:port` of a group's coordinator (FindCoordinator to any
    /// broker, retried while the coordinator is not available).
    pub(crate) async fn group_coordinator(&self, group: &str) -> Result<String, ClientError> {
        self.retrying(&format!("find coordinator of {group}"), || async move {
            let (version, r) = self
                .call_any(None, |v| Ok(group::find_coordinator_request(v, group)))
                .await?;
            group::find_coordinator_result(&r, version, group)
        })
        .await
    }

    /// One JoinGroup to `coordinator` (not retried: the caller decides,
    /// see `control::members`). The coordinator answers when the rebalance
    /// completes, so the round trip may take up to the rebalance timeout.
    pub(crate) async fn join_group(
        &self,
        coordinator: &str,
        spec: &group::JoinSpec,
        member_id: &str,
    ) -> Result<group::JoinOutcome, ClientError> {
        let wait = Duration::from_millis(u64::try_from(spec.rebalance_timeout_ms).unwrap_or(0));
        let (_, r) = self
            .call(coordinator, wait, |_| {
                Ok(group::join_group_request(spec, member_id))
            })
            .await?;
        group::join_group_result(&r, &spec.group)
    }

    /// One SyncGroup to `coordinator`: this member's assignment (the
    /// leader sends everyone's, see `client::group`).
    pub(crate) async fn sync_group(
        &self,
        coordinator: &str,
        group_id: &str,
        generation: i32,
        member_id: &str,
        protocol: &str,
        assignments: &[(String, Bytes)],
    ) -> Result<Bytes, ClientError> {
        self.to_coordinator(
            coordinator,
            group::sync_group_request(group_id, generation, member_id, protocol, assignments),
            |r| group::sync_group_result(r, group_id),
        )
        .await
    }

    pub(crate) async fn heartbeat(
        &self,
        coordinator: &str,
        group_id: &str,
        generation: i32,
        member_id: &str,
    ) -> Result<(), ClientError> {
        self.to_coordinator(
            coordinator,
            group::heartbeat_request(group_id, generation, member_id),
            |r| group::heartbeat_result(r, group_id),
        )
        .await
    }

    /// One LeaveGroup to `coordinator`.
    pub(crate) async fn leave_group(
        &self,
        coordinator: &str,
        group_id: &str,
        member_id: &str,
    ) -> Result<(), ClientError> {
        self.to_coordinator(
            coordinator,
            group::leave_group_request(group_id, member_id),
            |r| group::leave_group_result(r, group_id, member_id),
        )
        .await
    }

    /// One request to a group's `coordinator` (no extra wait, not
    /// retried), its answer read by `result`: SyncGroup, Heartbeat and
    /// LeaveGroup differ only in the request and how the answer is read.
    async fn to_coordinator<R: Rpc, T>(
        &self,
        coordinator: &str,
        request: R,
        result: impl FnOnce(&R::Response) -> Result<T, ClientError>,
    ) -> Result<T, ClientError> {
        let (_, r) = self
            .call(coordinator, Duration::ZERO, |_| Ok(request))
            .await?;
        result(&r)
    }

    /// The group as its coordinator describes it (coordinator looked up
    /// each attempt; retried while it moves or loads).
    /// Every consumer group of the cluster: ListGroups to each broker
    /// (each lists the groups it coordinates).
    pub(crate) async fn list_groups(&self) -> Result<Vec<String>, ClientError> {
        let brokers = self.brokers().await?;
        let mut groups = Vec::new();
        for broker in brokers {
            let listed = self
                .retrying(&format!("list groups of {}", broker.address()), || {
                    let address = broker.address();
                    async move {
                        let (_, r) = self
                            .call(&address, Duration::ZERO, |_| {
                                Ok(kafka_protocol::messages::ListGroupsRequest::default())
                            })
                            .await?;
                        group::list_groups_result(&r)
                    }
                })
                .await?;
            groups.extend(listed);
        }
        groups.sort();
        groups.dedup();
        Ok(groups)
    }

    pub async fn describe_group(
        &self,
        group_id: &str,
    ) -> Result<group::GroupDescription, ClientError> {
        self.retrying(&format!("describe group {group_id}"), || async move {
            let coordinator = self.group_coordinator(group_id).await?;
            let (_, r) = self
                .call(&coordinator, Duration::ZERO, |_| {
                    Ok(group::describe_groups_request(group_id))
                })
                .await?;
            group::describe_groups_result(&r, group_id)
        })
        .await
    }

    /// Run `attempt` until it succeeds, fails for good, or the operation
    /// timeout leaves no room for another try.
    ///
    /// (A closure returning a future rather than an async closure: the
    /// futures of async closures are not provably `Send` yet, and the
    /// client's operations must run in spawned tasks.)
    async fn retrying<T, F, Fut>(&self, op: &str, mut attempt: F) -> Result<T, ClientError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, ClientError>>,
    {
        let config = &self.inner.config;
        let start = Instant::now();
        let mut backoff = Backoff::new(config.retry_backoff, config.retry_backoff_max);
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let error = match attempt().await {
                Ok(v) => return Ok(v),
                Err(e) => e,
            };
            if error.invalidates_metadata() {
                lock(&self.inner.cluster).invalidate();
            }
            if !error.is_retriable() {
                return Err(error);
            }
            let delay = backoff.next_delay();
            if start.elapsed() + delay >= config.operation_timeout {
                return Err(ClientError::GaveUp {
                    op: op.to_string(),
                    attempts,
                    elapsed_ms: u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX),
                    last: Box::new(error),
                });
            }
            tracing::debug!(op, attempts, error = %error_chain(&error), backoff_ms = delay.as_millis() as u64, "retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// Ask any broker for metadata and remember the answer.
    async fn refresh(&self, topics: Option<&[String]>) -> Result<ClusterInfo, ClientError> {
        let (_, r) = self
            .call_any(None, |_| Ok(protocol::metadata_request(topics)))
            .await?;
        if r.error_code != 0 {
            return Err(ClientError::Kafka {
                context: "metadata".into(),
                code: r.error_code,
                message: None,
            });
        }
        let info = ClusterInfo::from_response(&r);
        lock(&self.inner.cluster).apply(&info, topics.unwrap_or_default(), Instant::now());
        Ok(info)
    }

    /// The leader of a partition, from the cache or one metadata refresh.
    async fn leader(&self, topic: &str, partition: i32) -> Result<Leader, ClientError> {
        let error = |code| ClientError::Kafka {
            context: format!("leader of {topic}-{partition}"),
            code,
            message: None,
        };
        let mut refreshed = false;
        loop {
            let lookup = lock(&self.inner.cluster).leader(topic, partition, Instant::now());
            match lookup {
                Lookup::Found(leader) => return Ok(leader),
                Lookup::Error(code) => return Err(error(code)),
                Lookup::Refresh if refreshed => return Err(error(5)),
                Lookup::Refresh => {
                    self.refresh(Some(&[topic.to_string()])).await?;
                    refreshed = true;
                }
            }
        }
    }

    /// Send a request any broker can answer: to `prefer`, else the broker
    /// that answered last, else the known brokers, else the bootstrap list,
    /// moving on while connecting fails.
    async fn call_any<R: Rpc>(
        &self,
        prefer: Option<String>,
        build: impl Fn(i16) -> Result<R, ClientError>,
    ) -> Result<(i16, R::Response), ClientError> {
        let mut candidates: Vec<String> = prefer.into_iter().collect();
        candidates.extend(lock(&self.inner.last_good).clone());
        candidates.extend(lock(&self.inner.cluster).broker_addresses());
        candidates.extend(self.inner.config.bootstrap.iter().cloned());
        let mut seen = std::collections::HashSet::new();
        candidates.retain(|a| seen.insert(a.clone()));
        let mut tried = Vec::new();
        let mut all_unreachable = true;
        for addr in candidates {
            match self.call(&addr, Duration::ZERO, &build).await {
                Err(ClientError::Connect(e)) => {
                    all_unreachable &= e.is_unreachable();
                    tried.push(e);
                }
                Err(e) => return Err(e),
                Ok(answer) => {
                    *lock(&self.inner.last_good) = Some(addr);
                    return Ok(answer);
                }
            }
        }
        if tried.is_empty() {
            return Err(ClientError::NoBrokers);
        }
        Err(ClientError::Connect(ConnectError::NoneReachable {
            tried,
            all_unreachable,
        }))
    }

    /// One request on the connection to `addr`, opened if needed; a
    /// connection that failed mid-request is closed.
    async fn call<R: Rpc>(
        &self,
        addr: &str,
        extra_wait: Duration,
        build: impl FnOnce(i16) -> Result<R, ClientError>,
    ) -> Result<(i16, R::Response), ClientError> {
        let slot = lock(&self.inner.connections)
            .entry(addr.to_string())
            .or_default()
            .clone();
        let mut guard = slot.lock().await;
        if guard.as_ref().is_some_and(|c| c.expired(Instant::now())) {
            *guard = None;
        }
        // Out of the slot while in use: a caller that stops waiting (drops
        // this future, e.g. a JoinGroup given up at shutdown) closes the
        // connection instead of leaving its answer to the next request.
        let mut conn = match guard.take() {
            Some(conn) => conn,
            None => Connection::open(&self.inner.config, addr).await?,
        };
        let result = conn.call(extra_wait, build).await;
        match &result {
            Err(e) if e.breaks_connection() => {
                tracing::debug!(broker = addr, error = %error_chain(e), "dropping client connection");
            }
            _ => *guard = Some(conn),
        }
        result
    }
}

fn partition_ref<'a>(topic: &'a str, partition: i32, leader: &Leader) -> PartitionRef<'a> {
    PartitionRef {
        topic,
        topic_id: leader.topic_id,
        partition,
        leader_epoch: leader.leader_epoch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    #[test]
    fn configured_from_the_proxys_variables() {
        let vars: std::collections::HashMap<String, String> = [
            ("BOOTSTRAP_SERVERS", "b1:9092,b2:9092"),
            ("LISTEN", "127.0.0.1:19092"),
            ("MAX_FRAME_BYTES", "2048"),
            ("CONNECT_TIMEOUT_MS", "1500"),
            ("UPSTREAM_SASL_MECHANISM", "SCRAM-SHA-256"),
            ("UPSTREAM_SASL_USERNAME", "proxy"),
            ("UPSTREAM_SASL_PASSWORD", "secret"),
        ]
        .iter()
        .map(|(k, v)| (format!("{}{k}", crate::config::PREFIX), v.to_string()))
        .collect();
        let config = Config::from_vars(&vars).expect("valid");
        let c = ClientConfig::from_config(&config).expect("client config");
        assert_eq!(c.bootstrap, ["b1:9092", "b2:9092"]);
        assert_eq!(c.max_frame_bytes, 2048);
        assert_eq!(c.upstream.timeout, Duration::from_millis(1500));
        assert!(c.upstream.tls.is_none());
        assert_eq!(
            c.sasl,
            Some(crate::wire::sasl::Credentials {
                mechanism: crate::wire::sasl::Mechanism::ScramSha256,
                username: "proxy".into(),
                password: "secret".into(),
            })
        );
    }

    /// The operations can run in spawned tasks (the state store, the
    /// failover task).
    #[test]
    fn operation_futures_are_send() {
        let upstream = Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(1),
        };
        let client = Client::new(ClientConfig::new(vec!["127.0.0.1:1".into()], upstream));
        let topic = NewTopic {
            name: "t".into(),
            partitions: 1,
            replication_factor: 1,
            configs: Vec::new(),
        };
        assert_send(&client.metadata(None));
        assert_send(&client.topic("t"));
        assert_send(&client.create_topic(&topic));
        assert_send(&client.describe_topic_config("t", &[]));
        assert_send(&client.ensure_compacted_topic("t", 1));
        assert_send(&client.produce("t", 0, Bytes::new()));
        assert_send(&client.fetch("t", 0, 0, 1, Duration::ZERO));
        assert_send(&client.fetch_isolated(
            "t",
            0,
            0,
            1,
            Duration::ZERO,
            IsolationLevel::ReadCommitted,
        ));
        assert_send(&client.produce_transactional("t", 0, Bytes::new(), Some("x")));
        assert_send(&client.list_offset("t", 0, OffsetSpec::Latest));
        assert_send(&client.group_coordinator("g"));
        assert_send(&client.heartbeat("b:1", "g", 1, "m"));
        assert_send(&client.describe_group("g"));
    }
}
