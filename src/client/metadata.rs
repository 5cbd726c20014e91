//! What the client knows about the cluster: brokers and their addresses,
//! the controller, and per topic its id and each partition's leader and
//! leader epoch. Filled from Metadata responses, consulted before every
//! partition request, and marked stale when a broker says the client asked
//! the wrong one (or the connection to it broke).
//!
//! Pure: the `Client` in `client` holds one behind a mutex and refreshes it.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use kafka_protocol::messages::MetadataResponse;
use uuid::Uuid;

/// A broker as Metadata names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Broker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub rack: Option<String>,
}

impl Broker {
    /// `host:port`, with brackets around an IPv6 host.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// One partition's placement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: i32,
    /// -1 while there is none.
    pub leader: i32,
    pub leader_epoch: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    /// The partition's own error, e.g. LEADER_NOT_AVAILABLE (5).
    pub error_code: i16,
}

/// A topic and its partitions, ordered by partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicInfo {
    pub name: String,
    /// Nil before Metadata v10.
    pub topic_id: Uuid,
    pub is_internal: bool,
    pub partitions: Vec<PartitionInfo>,
}

/// A Metadata answer, as returned by `Client::metadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterInfo {
    pub cluster_id: Option<String>,
    pub controller_id: i32,
    pub brokers: Vec<Broker>,
    pub topics: Vec<TopicInfo>,
    /// Topics the broker answered with an error: (name, error code).
    pub topic_errors: Vec<(String, i16)>,
}

impl ClusterInfo {
    pub(crate) fn from_response(r: &MetadataResponse) -> ClusterInfo {
        let mut topics = Vec::new();
        let mut topic_errors = Vec::new();
        for t in &r.topics {
            let name = t
                .name
                .as_ref()
                .map(|n| n.0.as_str().to_string())
                .unwrap_or_default();
            if t.error_code != 0 {
                topic_errors.push((name, t.error_code));
                continue;
            }
            let mut partitions: Vec<PartitionInfo> = t
                .partitions
                .iter()
                .map(|p| PartitionInfo {
                    partition: p.partition_index,
                    leader: p.leader_id.0,
                    leader_epoch: p.leader_epoch,
                    replicas: p.replica_nodes.iter().map(|b| b.0).collect(),
                    isr: p.isr_nodes.iter().map(|b| b.0).collect(),
                    error_code: p.error_code,
                })
                .collect();
            partitions.sort_by_key(|p| p.partition);
            topics.push(TopicInfo {
                name,
                topic_id: t.topic_id,
                is_internal: t.is_internal,
                partitions,
            });
        }
        let mut brokers: Vec<Broker> = r
            .brokers
            .iter()
            .map(|b| Broker {
                node_id: b.node_id.0,
                host: b.host.as_str().to_string(),
                port: b.port,
                rack: b.rack.as_ref().map(|r| r.as_str().to_string()),
            })
            .collect();
        brokers.sort_by_key(|b| b.node_id);
        ClusterInfo {
            cluster_id: r.cluster_id.as_ref().map(|c| c.as_str().to_string()),
            controller_id: r.controller_id.0,
            brokers,
            topics,
            topic_errors,
        }
    }
}

/// Where to send a request for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leader {
    pub node_id: i32,
    pub address: String,
    pub topic_id: Uuid,
    pub leader_epoch: i32,
}

/// The answer of a cache lookup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lookup {
    Found(Leader),
    /// Not known, or known too long ago, or marked stale: ask a broker.
    Refresh,
    /// Freshly known, and the answer is an error code (e.g.
    /// UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE).
    Error(i16),
}

#[derive(Debug, Clone)]
struct Cached {
    info: Option<TopicInfo>,
    /// Error code from the last answer about this topic (0 when none).
    error: i16,
    fetched: Instant,
    stale: bool,
}

/// The cache.
#[derive(Debug, Clone)]
pub(crate) struct Cluster {
    max_age: Duration,
    controller_id: i32,
    brokers: BTreeMap<i32, Broker>,
    topics: HashMap<String, Cached>,
}

impl Cluster {
    pub(crate) fn new(max_age: Duration) -> Cluster {
        Cluster {
            max_age,
            controller_id: -1,
            brokers: BTreeMap::new(),
            topics: HashMap::new(),
        }
    }

    /// Learn from a Metadata answer; `asked` are the topics it was for.
    pub(crate) fn apply(&mut self, info: &ClusterInfo, asked: &[String], now: Instant) {
        if !info.brokers.is_empty() {
            self.brokers = info
                .brokers
                .iter()
                .map(|b| (b.node_id, b.clone()))
                .collect();
        }
        self.controller_id = info.controller_id;
        for t in &info.topics {
            self.topics.insert(
                t.name.clone(),
                Cached {
                    info: Some(t.clone()),
                    error: 0,
                    fetched: now,
                    stale: false,
                },
            );
        }
        for (name, code) in &info.topic_errors {
            self.topics.insert(
                name.clone(),
                Cached {
                    info: None,
                    error: *code,
                    fetched: now,
                    stale: false,
                },
            );
        }
        // A topic asked for and not answered at all is as good as unknown.
        for name in asked {
            self.topics.entry(name.clone()).or_insert(Cached {
                info: None,
                error: 3,
                fetched: now,
                stale: false,
            });
        }
    }

    /// The leader of `topic`-`partition`, if known well enough.
    pub(crate) fn leader(&self, topic: &str, partition: i32, now: Instant) -> Lookup {
        let Some(cached) = self.topics.get(topic) else {
            return Lookup::Refresh;
        };
        if cached.stale || now.saturating_duration_since(cached.fetched) > self.max_age {
            return Lookup::Refresh;
        }
        let Some(info) = &cached.info else {
            return Lookup::Error(if cached.error != 0 { cached.error } else { 3 });
        };
        let Some(p) = info.partitions.iter().find(|p| p.partition == partition) else {
            return Lookup::Error(3); // UNKNOWN_TOPIC_OR_PARTITION
        };
        if p.leader < 0 {
            return Lookup::Error(if p.error_code != 0 { p.error_code } else { 5 });
        }
        match self.brokers.get(&p.leader) {
            Some(b) => Lookup::Found(Leader {
                node_id: p.leader,
                address: b.address(),
                topic_id: info.topic_id,
                leader_epoch: p.leader_epoch,
            }),
            // A leader not among the brokers: the answer was inconsistent.
            None => Lookup::Error(5),
        }
    }

    /// Forget what is known about every topic's leaders (brokers stay, as
    /// places to ask).
    pub(crate) fn invalidate(&mut self) {
        for c in self.topics.values_mut() {
            c.stale = true;
        }
    }

    /// Known broker addresses, the controller first.
    pub(crate) fn broker_addresses(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .brokers
            .get(&self.controller_id)
            .map(Broker::address)
            .into_iter()
            .collect();
        out.extend(
            self.brokers
                .values()
                .filter(|b| b.node_id != self.controller_id)
                .map(Broker::address),
        );
        out
    }

    pub(crate) fn controller_address(&self) -> Option<String> {
        self.brokers.get(&self.controller_id).map(Broker::address)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{BrokerId, TopicName};
    use kafka_protocol::protocol::StrBytes;

    const ID: Uuid = Uuid::from_u128(0x1234);

    fn response(leader: i32, epoch: i32) -> MetadataResponse {
        let broker = |id: i32, host: &str| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(id))
                .with_host(StrBytes::from_string(host.to_string()))
                .with_port(9092 + id)
        };
        MetadataResponse::default()
            .with_controller_id(BrokerId(2))
            .with_brokers(vec![broker(2, "::1"), broker(1, "b1")])
            .with_topics(vec![
                MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("t"))))
                    .with_topic_id(ID)
                    .with_partitions(vec![
                        MetadataResponsePartition::default()
                            .with_partition_index(1)
                            .with_leader_id(BrokerId(-1))
                            .with_error_code(5),
                        MetadataResponsePartition::default()
                            .with_partition_index(0)
                            .with_leader_id(BrokerId(leader))
                            .with_leader_epoch(epoch),
                    ]),
                MetadataResponseTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_static_str("gone"))))
                    .with_error_code(3),
            ])
    }

    #[test]
    fn leaders_are_looked_up_and_refreshed() {
        let now = Instant::now();
        let mut c = Cluster::new(Duration::from_secs(60));
        assert_eq!(c.leader("t", 0, now), Lookup::Refresh);
        let info = ClusterInfo::from_response(&response(1, 7));
        assert_eq!(info.topic_errors, vec![("gone".to_string(), 3)]);
        assert_eq!(
            info.topics[0]
                .partitions
                .iter()
                .map(|p| p.partition)
                .collect::<Vec<_>>(),
            [0, 1]
        );
        c.apply(&info, &["t".into(), "silent".into()], now);
        assert_eq!(
            c.leader("t", 0, now),
            Lookup::Found(Leader {
                node_id: 1,
                address: "b1:9093".into(),
                topic_id: ID,
                leader_epoch: 7
            })
        );
        assert_eq!(c.leader("t", 1, now), Lookup::Error(5));
        assert_eq!(c.leader("t", 2, now), Lookup::Error(3));
        assert_eq!(c.leader("gone", 0, now), Lookup::Error(3));
        assert_eq!(c.leader("silent", 0, now), Lookup::Error(3));
        assert_eq!(c.broker_addresses(), ["[::1]:9094", "b1:9093"]);
        assert_eq!(c.controller_address().as_deref(), Some("[::1]:9094"));

        // Too old, or marked stale: ask again.
        assert_eq!(
            c.leader("t", 0, now + Duration::from_secs(61)),
            Lookup::Refresh
        );
        c.invalidate();
        assert_eq!(c.leader("t", 0, now), Lookup::Refresh);
        c.apply(&ClusterInfo::from_response(&response(2, 8)), &[], now);
        assert!(matches!(
            c.leader("t", 0, now),
            Lookup::Found(Leader {
                node_id: 2,
                leader_epoch: 8,
                ..
            })
        ));
    }

    #[test]
    fn a_leader_missing_from_the_brokers_is_not_used() {
        let now = Instant::now();
        let mut c = Cluster::new(Duration::from_secs(60));
        c.apply(&ClusterInfo::from_response(&response(9, 1)), &[], now);
        assert_eq!(c.leader("t", 0, now), Lookup::Error(5));
    }
}
