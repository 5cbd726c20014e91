//! Counters and gauges for the admin endpoint, rendered in the Prometheus
//! text format.
//!
//! A small hand-rolled registry: a handful of labelled counters does not
//! justify a metrics framework, and every update happens at most once per
//! request or connection, so one mutex is plenty.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// Every metric the proxy exports: (name, type, help).
const METRICS: &[(&str, &str, &str)] = &[
    (
        "kafka_mirror_proxy_client_connections_total",
        "counter",
        "Client connections accepted, by listener.",
    ),
    (
        "kafka_mirror_proxy_client_connections_active",
        "gauge",
        "Client connections open now, by listener.",
    ),
    (
        "kafka_mirror_proxy_upstream_connections_total",
        "counter",
        "Connections the proxy opened to brokers, by listener and broker address.",
    ),
    (
        "kafka_mirror_proxy_connections_closed_total",
        "counter",
        "Client connections closed, by reason.",
    ),
    (
        "kafka_mirror_proxy_connections_refused_total",
        "counter",
        "Client connections refused, by listener and reason (max_connections).",
    ),
    (
        "kafka_mirror_proxy_requests_total",
        "counter",
        "Requests received, by API key.",
    ),
    (
        "kafka_mirror_proxy_mirror_batches_remapped_total",
        "counter",
        "Record batches whose producer id was remapped, by link.",
    ),
    (
        "kafka_mirror_proxy_mirror_control_batches_dropped_total",
        "counter",
        "Control batches acknowledged without writing, by link.",
    ),
    (
        "kafka_mirror_proxy_mirror_partitions_refused_total",
        "counter",
        "Partitions of link Produce requests refused by the proxy, by link and reason.",
    ),
];

/// The registry: (metric name, rendered label set) → value.
#[derive(Default)]
pub struct Metrics {
    values: Mutex<BTreeMap<(&'static str, String), i64>>,
}

/// Render `[("link", "a")]` as `link="a"`, escaping as Prometheus requires.
pub fn labels(pairs: &[(&str, &str)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            let v = v
                .replace('\\', "\\\\")
                .replace('"', "\\\"")
                .replace('\n', "\\n");
            format!("{k}=\"{v}\"")
        })
        .collect::<Vec<_>>()
        .join(",")
}

impl Metrics {
    pub fn add(&self, name: &'static str, labels: String, delta: i64) {
        if let Ok(mut values) = self.values.lock() {
            *values.entry((name, labels)).or_insert(0) += delta;
        }
    }

    pub fn inc(&self, name: &'static str, labels: String) {
        self.add(name, labels, 1);
    }

    /// Current value (0 when never touched).
    pub fn get(&self, name: &str, labels: &str) -> i64 {
        self.values
            .lock()
            .map(|v| {
                v.iter()
                    .find(|((n, l), _)| *n == name && l == labels)
                    .map_or(0, |(_, v)| *v)
            })
            .unwrap_or(0)
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let Ok(values) = self.values.lock() else {
            return out;
        };
        for (name, kind, help) in METRICS {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((n, labels), value) in values.iter() {
                if n == name {
                    if labels.is_empty() {
                        let _ = writeln!(out, "{name} {value}");
                    } else {
                        let _ = writeln!(out, "{name}{{{labels}}} {value}");
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        m.inc(
            "kafka_mirror_proxy_requests_total",
            labels(&[("api_key", "0")]),
        );
        m.add(
            "kafka_mirror_proxy_mirror_batches_remapped_total",
            labels(&[("link", "a\"b")]),
            3,
        );
        let text = m.render();
        assert!(
            text.contains("kafka_mirror_proxy_requests_total{api_key=\"0\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kafka_mirror_proxy_mirror_batches_remapped_total{link=\"a\\\"b\"} 3\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE kafka_mirror_proxy_client_connections_active gauge\n"));
        assert_eq!(
            m.get("kafka_mirror_proxy_requests_total", "api_key=\"0\""),
            1
        );
    }
}
