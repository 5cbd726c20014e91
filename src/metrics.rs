//! Counters and gauges for the admin endpoint, kept and rendered in the
//! Prometheus text format (0.0.4) by the `prometheus-client` crate.
//!
//! Every label value comes from a bounded set, never from what a client
//! sends: API keys known to `kafka-protocol` (anything else is `unknown`),
//! listeners and broker addresses named by the configuration or by broker
//! responses, configured links, fixed reasons. The per-request counter is
//! resolved to one handle per API key the first time that key is seen, so a
//! request costs an atomic load and an atomic increment: no lock shared by
//! all connections, no allocation.

use std::fmt::Write;
use std::sync::{Arc, OnceLock};

use kafka_protocol::messages::ApiKey;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

pub(crate) mod mirrored;
use mirrored::LinkMirror;

/// `Content-Type` of [`Metrics::render`]'s output.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Value of the `api_key` label: the number of an API key `kafka-protocol`
/// knows (as a number, so queries need no table of names), or
/// `unknown` for any other value a client may put in a request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ApiKeyLabel {
    Known(ApiKey),
    Unknown,
}

impl From<i16> for ApiKeyLabel {
    fn from(key: i16) -> Self {
        ApiKey::try_from(key).map_or(ApiKeyLabel::Unknown, ApiKeyLabel::Known)
    }
}

impl EncodeLabelValue for ApiKeyLabel {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            ApiKeyLabel::Known(key) => write!(encoder, "{}", *key as i16),
            ApiKeyLabel::Unknown => encoder.write_str("unknown"),
        }
    }
}

/// Value of the `listener` label: `bootstrap` or `node-<id>`. Node ids come
/// from broker responses, not from clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Listener {
    Bootstrap,
    Node(i32),
}

impl EncodeLabelValue for Listener {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        match self {
            Listener::Bootstrap => encoder.write_str("bootstrap"),
            Listener::Node(n) => write!(encoder, "node-{n}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ListenerLabels {
    listener: Listener,
}

// Field order is label order in the output: listener, then broker.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct UpstreamLabels {
    listener: Listener,
    broker: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedConnectionLabels {
    listener: Listener,
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RequestLabels {
    api_key: ApiKeyLabel,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct LinkLabels {
    link: Arc<str>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FixedLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    result: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RefusedLabels {
    link: Arc<str>,
    reason: &'static str,
}

/// The handles of one configured link, resolved at start.
struct LinkMetrics {
    name: Arc<str>,
    remapped: Counter,
    dropped: Counter,
    /// What the link mirrored (counters, delay, per-partition figures).
    mirror: Arc<LinkMirror>,
}

/// Every metric the proxy exports.
pub struct Metrics {
    registry: Registry,
    client_connections: Family<ListenerLabels, Counter>,
    client_connections_active: Family<ListenerLabels, Gauge>,
    upstream_connections: Family<UpstreamLabels, Counter>,
    connections_closed: Family<ReasonLabels, Counter>,
    connections_refused: Family<RefusedConnectionLabels, Counter>,
    broker_unreachable: Family<ListenerLabels, Gauge>,
    broker_outages: Family<ListenerLabels, Counter>,
    requests: Family<RequestLabels, Counter>,
    /// Index: API key number; empty slots stand for gaps in the numbering
    /// and are never used (those numbers count as `unknown`).
    requests_by_key: Box<[OnceLock<Counter>]>,
    requests_unknown: OnceLock<Counter>,
    batches_remapped: Family<LinkLabels, Counter>,
    control_batches_dropped: Family<LinkLabels, Counter>,
    partitions_refused: Family<RefusedLabels, Counter>,
    duplicates_answered: Family<LinkLabels, Counter>,
    producer_state_evictions: Counter,
    buffered_request_bytes: Gauge,
    buffered_response_bytes: Gauge,
    producer_state_rebuilds: Family<ResultLabels, Counter>,
    producer_state_rebuild_marks: Family<FixedLabels, Counter>,
    producer_state_offsets_beyond_bound: Counter,
    /// Looked up for every link request (foldhash, as the other per-request
    /// maps).
    links: foldhash::HashMap<String, LinkMetrics>,
    /// The state topic (`state`).
    pub state: StateMetrics,
    /// Link control (failover).
    control: ControlMetrics,
}

/// Link states, failovers, barriers and fencing. Label values are link
/// names from the configuration and fixed results: bounded.
struct ControlMetrics {
    link_state: Family<LinkLabels, Gauge>,
    failovers: Family<LinkLabels, Counter>,
    failovers_completed: Family<LinkLabels, Counter>,
    failover_seconds: prometheus_client::metrics::histogram::Histogram,
    barriers: Family<ResultLabels, Counter>,
    local_writes_refused: Family<LinkLabels, Counter>,
    connections_fenced: Family<LinkLabels, Counter>,
    state_topic_requests_refused: Family<RequestLabels, Counter>,
}

impl ControlMetrics {
    fn register(registry: &mut Registry) -> ControlMetrics {
        let m = ControlMetrics {
            link_state: Family::default(),
            failovers: Family::default(),
            failovers_completed: Family::default(),
            failover_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.1, 2.0, 14),
            ),
            barriers: Family::default(),
            local_writes_refused: Family::default(),
            connections_fenced: Family::default(),
            state_topic_requests_refused: Family::default(),
        };
        registry.register(
            "state_topic_requests_refused",
            "Client requests refused because they would write, delete, grow or reconfigure the state topic, by API key",
            m.state_topic_requests_refused.clone(),
        );
        registry.register(
            "link_state",
            "Each link's state: 0 MIRRORING, 1 STOPPING, 2 STOPPED",
            m.link_state.clone(),
        );
        registry.register(
            "failovers",
            "Failovers started on this instance, by link",
            m.failovers.clone(),
        );
        registry.register(
            "failovers_completed",
            "Failovers this instance ran to STOPPED, by link",
            m.failovers_completed.clone(),
        );
        registry.register(
            "failover_duration_seconds",
            "Time a failover run took on this instance, from its start (or resumption) to STOPPED",
            m.failover_seconds.clone(),
        );
        registry.register(
            "failover_barriers",
            "Partition barriers placed by this instance, by result (accepted, refused, failed)",
            m.barriers.clone(),
        );
        registry.register(
            "local_writes_refused",
            "Partitions of local Produce requests refused because the topic is a read-only mirror, by link",
            m.local_writes_refused.clone(),
        );
        registry.register(
            "link_connections_fenced",
            "Client connections of a link closed or refused because the link is STOPPING or STOPPED, by link",
            m.connections_fenced.clone(),
        );
        for result in ["accepted", "refused", "failed"] {
            let _ = m.barriers.get_or_create(&ResultLabels { result });
        }
        m
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new([])
    }
}

/// A client connection counted as active until this is dropped, so the gauge
/// comes down on every path out of a session, panics included.
pub(crate) struct ActiveConnection {
    gauge: Gauge,
}

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.gauge.dec();
    }
}

impl Metrics {
    /// The registry, with the per-link series of `links` (the configured
    /// link names) resolved up front.
    pub(crate) fn new<'a>(links: impl IntoIterator<Item = &'a str>) -> Metrics {
        // Names without `_total`: prometheus-client appends it to counters.
        let mut registry = Registry::with_prefix("kafka_mirror_proxy");
        let client_connections = Family::default();
        registry.register(
            "client_connections",
            "Client connections accepted, by listener",
            Family::clone(&client_connections),
        );
        let client_connections_active = Family::default();
        registry.register(
            "client_connections_active",
            "Client connections open now, by listener",
            Family::clone(&client_connections_active),
        );
        let upstream_connections = Family::default();
        registry.register(
            "upstream_connections",
            "Connections the proxy opened to brokers, by listener and broker address",
            Family::clone(&upstream_connections),
        );
        let connections_closed = Family::default();
        registry.register(
            "connections_closed",
            "Client connections closed, by reason",
            Family::clone(&connections_closed),
        );
        let connections_refused = Family::default();
        registry.register(
            "connections_refused",
            "Client connections refused, by listener and reason (max_connections)",
            Family::clone(&connections_refused),
        );
        let broker_unreachable = Family::default();
        registry.register(
            "broker_unreachable",
            "1 while the broker behind a listener is unreachable and its port is closed, by listener",
            Family::clone(&broker_unreachable),
        );
        let broker_outages = Family::default();
        registry.register(
            "broker_outages",
            "Times a listener's port was closed because its broker became unreachable",
            Family::clone(&broker_outages),
        );
        let requests = Family::default();
        registry.register(
            "requests",
            "Requests received, by API key",
            Family::clone(&requests),
        );
        let batches_remapped = Family::default();
        registry.register(
            "mirror_batches_remapped",
            "Record batches whose producer id was remapped, by link",
            Family::clone(&batches_remapped),
        );
        let control_batches_dropped = Family::default();
        registry.register(
            "mirror_control_batches_dropped",
            "Control batches acknowledged without writing, by link",
            Family::clone(&control_batches_dropped),
        );
        let partitions_refused = Family::default();
        registry.register(
            "mirror_partitions_refused",
            "Partitions of link Produce requests refused by the proxy, by link and reason",
            Family::clone(&partitions_refused),
        );
        let duplicates_answered = Family::default();
        registry.register(
            "mirror_duplicates_answered",
            "Link batches already appended, answered with their original offset and not forwarded, by link",
            Family::clone(&duplicates_answered),
        );
        let buffered_request_bytes = Gauge::default();
        registry.register(
            "buffered_request_bytes",
            "Bytes of client request frames held now, under MAX_BUFFERED_BYTES (a frame finishing on the overdraft not included)",
            Gauge::clone(&buffered_request_bytes),
        );
        let buffered_response_bytes = Gauge::default();
        registry.register(
            "buffered_response_bytes",
            "Bytes of broker response frames held now, under MAX_BUFFERED_RESPONSE_BYTES (a frame finishing on the overdraft not included)",
            Gauge::clone(&buffered_response_bytes),
        );
        let producer_state_evictions = Counter::default();
        registry.register(
            "mirror_producer_state_evictions",
            "Mirrored producers evicted from the proxy's producer state to stay within PRODUCER_STATE_MAX_ENTRIES",
            Counter::clone(&producer_state_evictions),
        );
        let producer_state_rebuilds = Family::default();
        registry.register(
            "mirror_producer_state_rebuilds",
            "Rebuilds of a partition's mirrored producer state from its log tail, by result: complete (the whole log read), bounded (the tail that fits in PRODUCER_STATE_REBUILD_BYTES), caught_up (a connection new to the partition read what was appended past the log end known), failed (tail not read; the partition answered retriable)",
            Family::clone(&producer_state_rebuilds),
        );
        let producer_state_rebuild_marks = Family::default();
        registry.register(
            "mirror_producer_state_rebuild_marks",
            "Partitions marked for a new rebuild of their mirrored producer state, by reason: unknown_outcome (a link batch's answer was lost), leader_moved (the broker named another leader)",
            Family::clone(&producer_state_rebuild_marks),
        );
        let producer_state_offsets_beyond_bound = Counter::default();
        registry.register(
            "mirror_producer_state_offsets_beyond_bound",
            "Log offsets left unread by bounded rebuilds (between the log start and the tail read): link retries of batches there are not recognised as duplicates",
            Counter::clone(&producer_state_offsets_beyond_bound),
        );

        let mirrored = mirrored::Families::new();
        mirrored.register(&mut registry);

        let state = StateMetrics::register(&mut registry);
        let control = ControlMetrics::register(&mut registry);

        let slots = ApiKey::iter().map(|k| k as usize + 1).max().unwrap_or(0);
        let links = links
            .into_iter()
            .map(|name| {
                let label = LinkLabels {
                    link: Arc::from(name),
                };
                let link = LinkMetrics {
                    remapped: batches_remapped.get_or_create_owned(&label),
                    dropped: control_batches_dropped.get_or_create_owned(&label),
                    mirror: Arc::new(mirrored.link(&label)),
                    name: label.link,
                };
                (name.to_string(), link)
            })
            .collect();
        let metrics = Metrics {
            registry,
            client_connections,
            client_connections_active,
            upstream_connections,
            connections_closed,
            connections_refused,
            broker_unreachable,
            broker_outages,
            requests,
            requests_by_key: (0..slots).map(|_| OnceLock::new()).collect(),
            requests_unknown: OnceLock::new(),
            batches_remapped,
            control_batches_dropped,
            partitions_refused,
            duplicates_answered,
            producer_state_evictions,
            buffered_request_bytes,
            buffered_response_bytes,
            producer_state_rebuilds,
            producer_state_rebuild_marks,
            producer_state_offsets_beyond_bound,
            links,
            state,
            control,
        };
        // Every label set known at start is shown at zero before its first
        // event: `rate()` and `increase()` see nothing of a series that
        // appears at 1, so a first failover would never fire its alert.
        metrics.listener_known(Listener::Bootstrap);
        for link in metrics.links.values() {
            let label = LinkLabels {
                link: Arc::clone(&link.name),
            };
            let _ = metrics.duplicates_answered.get_or_create(&label);
            let _ = metrics.control.failovers.get_or_create(&label);
            let _ = metrics.control.failovers_completed.get_or_create(&label);
            let _ = metrics.control.local_writes_refused.get_or_create(&label);
            let _ = metrics.control.connections_fenced.get_or_create(&label);
        }
        metrics
    }

    /// A listener exists (the bootstrap one, or a node's once a response
    /// named it): its series are shown at zero from now on.
    pub(crate) fn listener_known(&self, listener: Listener) {
        let labels = ListenerLabels { listener };
        let _ = self.client_connections.get_or_create(&labels);
        let _ = self.broker_unreachable.get_or_create(&labels);
        let _ = self.broker_outages.get_or_create(&labels);
        self.refusal_reasons(listener, ["max_connections"]);
    }

    /// `reasons` (fixed labels) can refuse connections to `listener`: each
    /// is shown at zero from now on.
    pub(crate) fn refusal_reasons(
        &self,
        listener: Listener,
        reasons: impl IntoIterator<Item = &'static str>,
    ) {
        for reason in reasons {
            let _ = self
                .connections_refused
                .get_or_create(&RefusedConnectionLabels { listener, reason });
        }
    }

    /// `reasons` (fixed labels) can close a client connection: each is
    /// shown at zero from now on.
    pub(crate) fn close_reasons(&self, reasons: impl IntoIterator<Item = &'static str>) {
        for reason in reasons {
            let _ = self
                .connections_closed
                .get_or_create(&ReasonLabels { reason });
        }
    }

    /// `reasons` (fixed labels) can refuse a link's partitions: each is
    /// shown at zero for every configured link from now on.
    pub(crate) fn partition_refusal_reasons(
        &self,
        reasons: impl IntoIterator<Item = &'static str>,
    ) {
        for reason in reasons {
            for link in self.links.values() {
                let _ = self.partitions_refused.get_or_create(&RefusedLabels {
                    link: Arc::clone(&link.name),
                    reason,
                });
            }
        }
    }

    /// The gauge of request frame memory held (kept by `net::frame::Budget`).
    pub(crate) fn buffered_request_bytes(&self) -> Gauge {
        Gauge::clone(&self.buffered_request_bytes)
    }

    /// The gauge of response frame memory held (kept by `net::frame::Budget`).
    pub(crate) fn buffered_response_bytes(&self) -> Gauge {
        Gauge::clone(&self.buffered_response_bytes)
    }

    /// A client connection was accepted on `target`'s listener.
    pub(crate) fn connection_opened(&self, listener: Listener) -> ActiveConnection {
        let labels = ListenerLabels { listener };
        self.client_connections.get_or_create(&labels).inc();
        let gauge = self.client_connections_active.get_or_create_owned(&labels);
        gauge.inc();
        ActiveConnection { gauge }
    }

    /// A client connection ended, for `reason` (a fixed label).
    pub(crate) fn connection_closed(&self, reason: &'static str) {
        self.connections_closed
            .get_or_create(&ReasonLabels { reason })
            .inc();
    }

    /// A client connection to `target`'s listener was refused, for
    /// `reason` (a fixed label).
    pub(crate) fn connection_refused(&self, listener: Listener, reason: &'static str) {
        self.connections_refused
            .get_or_create(&RefusedConnectionLabels { listener, reason })
            .inc();
    }

    /// `target`'s broker became unreachable: its port is closed.
    pub(crate) fn broker_down(&self, listener: Listener) {
        let labels = ListenerLabels { listener };
        self.broker_unreachable.get_or_create(&labels).set(1);
        self.broker_outages.get_or_create(&labels).inc();
    }

    /// `target`'s broker answers again: its port is open.
    pub(crate) fn broker_up(&self, listener: Listener) {
        self.broker_unreachable
            .get_or_create(&ListenerLabels { listener })
            .set(0);
    }

    /// The proxy connected to `broker` for a client of `target`'s listener.
    pub(crate) fn upstream_connected(&self, listener: Listener, broker: &str) {
        self.upstream_connections
            .get_or_create(&UpstreamLabels {
                listener,
                broker: broker.to_string(),
            })
            .inc();
    }

    /// One request with this API key number from a request header: any i16,
    /// so numbers `kafka-protocol` does not know share the `unknown` series.
    pub(crate) fn request(&self, api_key: i16) {
        self.request_counter(api_key).inc();
    }

    fn request_counter(&self, api_key: i16) -> &Counter {
        let label = ApiKeyLabel::from(api_key);
        let slot = match label {
            ApiKeyLabel::Known(key) => self.requests_by_key.get(key as usize),
            ApiKeyLabel::Unknown => None,
        };
        match slot {
            Some(slot) => slot.get_or_init(|| {
                self.requests
                    .get_or_create_owned(&RequestLabels { api_key: label })
            }),
            None => self.requests_unknown.get_or_init(|| {
                self.requests.get_or_create_owned(&RequestLabels {
                    api_key: ApiKeyLabel::Unknown,
                })
            }),
        }
    }

    /// `n` batches of `link` got a new producer id.
    pub(crate) fn batches_remapped(&self, link: &str, n: u64) {
        match self.links.get(link) {
            Some(l) => l.remapped.inc_by(n),
            None => self
                .batches_remapped
                .get_or_create(&LinkLabels {
                    link: Arc::from(link),
                })
                .inc_by(n),
        };
    }

    /// `n` control batches of `link` were acknowledged without writing.
    pub(crate) fn control_batches_dropped(&self, link: &str, n: u64) {
        match self.links.get(link) {
            Some(l) => l.dropped.inc_by(n),
            None => self
                .control_batches_dropped
                .get_or_create(&LinkLabels {
                    link: Arc::from(link),
                })
                .inc_by(n),
        };
    }

    /// The proxy refused one partition of `link` for `reason` (a fixed label).
    /// Rare and logged anyway, so the family lookup here is fine.
    pub(crate) fn partition_refused(&self, link: &str, reason: &'static str) {
        let link = match self.links.get(link) {
            Some(l) => Arc::clone(&l.name),
            None => Arc::from(link),
        };
        self.partitions_refused
            .get_or_create(&RefusedLabels { link, reason })
            .inc();
    }

    /// `n` batches of `link` were answered as duplicates.
    pub(crate) fn duplicates_answered(&self, link: &str, n: u64) {
        self.duplicates_answered
            .get_or_create(&LinkLabels {
                link: Arc::from(link),
            })
            .inc_by(n);
    }

    fn link_label(&self, link: &str) -> LinkLabels {
        LinkLabels {
            link: match self.links.get(link) {
                Some(l) => Arc::clone(&l.name),
                None => Arc::from(link),
            },
        }
    }

    /// `link` is in the state with `code` (0 MIRRORING, 1 STOPPING, 2 STOPPED).
    pub(crate) fn link_state(&self, link: &str, code: i8) {
        self.control
            .link_state
            .get_or_create(&self.link_label(link))
            .set(i64::from(code));
    }

    pub(crate) fn failover_started(&self, link: &str) {
        self.control
            .failovers
            .get_or_create(&self.link_label(link))
            .inc();
    }

    pub(crate) fn failover_finished(&self, link: &str, seconds: f64) {
        self.control
            .failovers_completed
            .get_or_create(&self.link_label(link))
            .inc();
        self.control.failover_seconds.observe(seconds);
    }

    /// A partition barrier ended with `result` (a fixed label).
    pub(crate) fn barrier(&self, result: &'static str) {
        self.control
            .barriers
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    pub(crate) fn state_topic_request_refused(&self, api: ApiKey) {
        self.control
            .state_topic_requests_refused
            .get_or_create_owned(&RequestLabels {
                api_key: ApiKeyLabel::from(api as i16),
            })
            .inc();
    }

    pub(crate) fn local_writes_refused(&self, link: &str, partitions: usize) {
        self.control
            .local_writes_refused
            .get_or_create(&self.link_label(link))
            .inc_by(partitions as u64);
    }

    pub(crate) fn link_connection_fenced(&self, link: &str) {
        self.control
            .connections_fenced
            .get_or_create(&self.link_label(link))
            .inc();
    }

    /// `n` more mirrored producers were evicted from the producer state.
    pub(crate) fn producer_state_evicted(&self, n: u64) {
        self.producer_state_evictions.inc_by(n);
    }

    /// One rebuild of a partition's producer state ended with `result`
    /// (`complete`, `bounded`, `caught_up`, `failed`); a bounded one left
    /// `offsets_beyond_bound` log offsets unread.
    pub(crate) fn producer_state_rebuilt(&self, result: &'static str, offsets_beyond_bound: u64) {
        self.producer_state_rebuilds
            .get_or_create(&ResultLabels { result })
            .inc();
        self.producer_state_offsets_beyond_bound
            .inc_by(offsets_beyond_bound);
    }

    /// A partition was marked for a new rebuild, for `reason`
    /// (`unknown_outcome`, `leader_moved`, `truncated`, `new_writer`).
    pub(crate) fn producer_state_rebuild_marked(&self, reason: &'static str) {
        self.producer_state_rebuild_marks
            .get_or_create(&FixedLabels { reason })
            .inc();
    }

    /// What configured link `link` mirrored (`None`: no such link).
    pub(crate) fn link_mirror(&self, link: &str) -> Option<&Arc<LinkMirror>> {
        self.links.get(link).map(|l| &l.mirror)
    }

    /// Everything, in the Prometheus text format 0.0.4.
    pub(crate) fn render(&self) -> String {
        for link in self.links.values() {
            link.mirror.refresh_gauge();
        }
        let mut out = String::new();
        // Writing into a String does not fail; an encoding error would only
        // cut the output short.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of one sample line `name{labels}`, as tests/support/proxy.rs
    /// reads it from /metrics.
    fn sample(text: &str, series: &str) -> Option<i64> {
        text.lines().find_map(|l| {
            l.strip_prefix(series)
                .filter(|rest| rest.starts_with(' '))
                .and_then(|rest| rest.trim().parse().ok())
        })
    }

    fn series_of(text: &str, name: &str) -> usize {
        text.lines()
            .filter(|l| l.starts_with(&format!("{name}{{")))
            .count()
    }

    #[test]
    fn renders_prometheus_text_with_todays_names() {
        let m = Metrics::new(["a\"b", "east"]);
        m.request(0);
        m.request(0);
        m.batches_remapped("a\"b", 3);
        m.control_batches_dropped("east", 2);
        m.partition_refused("east", "topic_not_mirrored");
        m.upstream_connected(Listener::Node(1), "127.0.0.1:9092");
        let conn = m.connection_opened(Listener::Node(1));
        let text = m.render();
        for line in [
            "# HELP kafka_mirror_proxy_requests_total Requests received, by API key.\n",
            "# TYPE kafka_mirror_proxy_requests_total counter\n",
            "kafka_mirror_proxy_requests_total{api_key=\"0\"} 2\n",
            "kafka_mirror_proxy_mirror_batches_remapped_total{link=\"a\\\"b\"} 3\n",
            "kafka_mirror_proxy_mirror_batches_remapped_total{link=\"east\"} 0\n",
            "kafka_mirror_proxy_mirror_control_batches_dropped_total{link=\"east\"} 2\n",
            "kafka_mirror_proxy_mirror_partitions_refused_total{link=\"east\",reason=\"topic_not_mirrored\"} 1\n",
            "kafka_mirror_proxy_upstream_connections_total{listener=\"node-1\",broker=\"127.0.0.1:9092\"} 1\n",
            "kafka_mirror_proxy_client_connections_total{listener=\"bootstrap\"} 0\n",
            "kafka_mirror_proxy_client_connections_total{listener=\"node-1\"} 1\n",
            "# TYPE kafka_mirror_proxy_client_connections_active gauge\n",
            "kafka_mirror_proxy_client_connections_active{listener=\"node-1\"} 1\n",
            "# TYPE kafka_mirror_proxy_buffered_request_bytes gauge\n",
            "kafka_mirror_proxy_buffered_request_bytes 0\n",
            "kafka_mirror_proxy_buffered_response_bytes 0\n",
        ] {
            assert!(text.contains(line), "missing {line:?} in:\n{text}");
        }
        drop(conn);
        m.connection_closed("client_closed");
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "kafka_mirror_proxy_client_connections_active{listener=\"node-1\"}"
            ),
            Some(0),
            "{text}"
        );
        assert_eq!(
            sample(
                &text,
                "kafka_mirror_proxy_connections_closed_total{reason=\"client_closed\"}"
            ),
            Some(1),
            "{text}"
        );
        // No doubled suffix, no OpenMetrics trailer.
        assert!(!text.contains("_total_total"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn every_known_label_set_is_shown_at_zero_before_its_first_event() {
        let m = Metrics::new(["east"]);
        m.partition_refusal_reasons(["topic_not_mirrored", "read_only"]);
        m.close_reasons(["client_closed"]);
        let text = m.render();
        let at_zero = |series: &str| {
            assert_eq!(sample(&text, series), Some(0), "{series} in:\n{text}");
        };
        for name in [
            "failovers_total",
            "failovers_completed_total",
            "link_connections_fenced_total",
            "local_writes_refused_total",
            "mirror_duplicates_answered_total",
        ] {
            at_zero(&format!("kafka_mirror_proxy_{name}{{link=\"east\"}}"));
        }
        for reason in ["topic_not_mirrored", "read_only"] {
            at_zero(&format!(
                "kafka_mirror_proxy_mirror_partitions_refused_total{{link=\"east\",reason=\"{reason}\"}}"
            ));
        }
        at_zero("kafka_mirror_proxy_connections_closed_total{reason=\"client_closed\"}");
        at_zero("kafka_mirror_proxy_broker_unreachable{listener=\"bootstrap\"}");
        at_zero("kafka_mirror_proxy_connections_refused_total{listener=\"bootstrap\",reason=\"max_connections\"}");
        assert_eq!(
            series_of(&text, "kafka_mirror_proxy_broker_unreachable"),
            1,
            "{text}"
        );

        // A node named by a response.
        m.listener_known(Listener::Node(3));
        let text = m.render();
        for series in [
            "kafka_mirror_proxy_broker_unreachable{listener=\"node-3\"}",
            "kafka_mirror_proxy_broker_outages_total{listener=\"node-3\"}",
            "kafka_mirror_proxy_connections_refused_total{listener=\"node-3\",reason=\"max_connections\"}",
        ] {
            assert_eq!(sample(&text, series), Some(0), "{series} in:\n{text}");
        }
    }

    #[test]
    fn api_keys_unknown_to_kafka_protocol_share_one_series() {
        let m = Metrics::default();
        m.request(3);
        // 4..=7 are gaps in the numbering, 93 is past the end.
        for key in [9999, -5, i16::MIN, i16::MAX, 4, 7, 93] {
            m.request(key);
        }
        let text = m.render();
        let name = "kafka_mirror_proxy_requests_total";
        assert_eq!(
            sample(&text, &format!("{name}{{api_key=\"unknown\"}}")),
            Some(7),
            "{text}"
        );
        assert_eq!(
            sample(&text, &format!("{name}{{api_key=\"3\"}}")),
            Some(1),
            "{text}"
        );
        assert_eq!(series_of(&text, name), 2, "{text}");

        // Every i16 there is: at most one series per known key plus `unknown`.
        for key in i16::MIN..=i16::MAX {
            m.request(key);
        }
        let text = m.render();
        assert_eq!(series_of(&text, name), ApiKey::iter().count() + 1);
        assert_eq!(
            sample(&text, &format!("{name}{{api_key=\"unknown\"}}")),
            Some(7 + 65_536 - ApiKey::iter().count() as i64),
        );
    }

    #[test]
    fn links_not_configured_are_still_counted() {
        let m = Metrics::default();
        m.batches_remapped("late", 4);
        m.control_batches_dropped("late", 1);
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "kafka_mirror_proxy_mirror_batches_remapped_total{link=\"late\"}"
            ),
            Some(4)
        );
        assert_eq!(
            sample(
                &text,
                "kafka_mirror_proxy_mirror_control_batches_dropped_total{link=\"late\"}"
            ),
            Some(1)
        );
    }
}

/// `cause` label of resolved collisions.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    cause: &'static str,
}

/// Metrics of the state topic and the origins view.
pub struct StateMetrics {
    origins_known: Gauge,
    origins_persisted: Counter,
    collisions: Family<CauseLabels, Counter>,
    write_seconds: prometheus_client::metrics::histogram::Histogram,
    write_failures: Counter,
    records_skipped: Counter,
    load_seconds: prometheus_client::metrics::gauge::Gauge<f64, std::sync::atomic::AtomicU64>,
    instance_group_member: Gauge,
}

impl StateMetrics {
    fn register(registry: &mut Registry) -> StateMetrics {
        let m = StateMetrics {
            origins_known: Gauge::default(),
            origins_persisted: Counter::default(),
            collisions: Family::default(),
            write_seconds: prometheus_client::metrics::histogram::Histogram::new(
                prometheus_client::metrics::histogram::exponential_buckets(0.001, 2.0, 14),
            ),
            write_failures: Counter::default(),
            records_skipped: Counter::default(),
            load_seconds: Default::default(),
            instance_group_member: Gauge::default(),
        };
        registry.register(
            "state_origins_known",
            "Origins (source cluster, producer id) with a mapped producer id, over all partitions",
            m.origins_known.clone(),
        );
        registry.register(
            "state_origins_persisted",
            "Origin claims written to the state topic by this instance (new origins and salts)",
            m.origins_persisted.clone(),
        );
        registry.register(
            "state_collisions_resolved",
            "Collisions resolved with a salt, by cause (hash, oversized_pid, minus_one)",
            m.collisions.clone(),
        );
        registry.register(
            "state_write_seconds",
            "Latency of state-topic writes (acks=all) until applied by the tailer",
            m.write_seconds.clone(),
        );
        registry.register(
            "state_write_failures",
            "State-topic writes that failed",
            m.write_failures.clone(),
        );
        registry.register(
            "state_records_skipped",
            "State-topic records skipped because the proxy could not have written them there (an origin's mapping, a salt, a link state, barrier or drained record out of the link's history, or with MIRROR_PROXY_STATE_KEY a missing or wrong MAC): forged or corrupt",
            m.records_skipped.clone(),
        );
        registry.register(
            "state_load_seconds",
            "Time the last full load of the state topic took",
            m.load_seconds.clone(),
        );
        registry.register(
            "instance_group_member",
            "1 while this instance is a member of the instances' group (<state topic>.instances), else 0",
            m.instance_group_member.clone(),
        );
        for cause in ["hash", "oversized_pid", "minus_one"] {
            let _ = m.collisions.get_or_create(&CauseLabels { cause });
        }
        m
    }

    pub(crate) fn origins_known(&self, n: usize) {
        self.origins_known.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    pub(crate) fn origins_persisted(&self, n: u64) {
        self.origins_persisted.inc_by(n);
    }
    pub(crate) fn collision(&self, cause: &'static str) {
        self.collisions.get_or_create(&CauseLabels { cause }).inc();
    }
    pub(crate) fn write(&self, seconds: f64) {
        self.write_seconds.observe(seconds);
    }
    pub(crate) fn write_failed(&self) {
        self.write_failures.inc();
    }
    pub(crate) fn record_skipped(&self) {
        self.records_skipped.inc();
    }
    pub(crate) fn loaded(&self, seconds: f64) {
        self.load_seconds.set(seconds);
    }
    /// The gauge `control::members` keeps at 1 while a member.
    pub(crate) fn instance_group_member(&self) -> Gauge {
        self.instance_group_member.clone()
    }
}
