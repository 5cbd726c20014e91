//! The admin API's bodies, typed once: the proxy serializes them
//! (`admin`, `control::links`), the operator's CLI reads them back (`cli`).
//!
//! Their field names and shapes are the API (docs/operations.md shows each
//! one); the tests below pin every type's JSON, so a renamed field fails
//! here before it reaches an operator's script.

use serde::{Deserialize, Serialize};

use crate::mirror::link_state::LinkState;

/// Every error answer: `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ApiError {
    /// What went wrong, for the operator.
    pub error: String,
}

/// `GET /links`: every link's report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LinkList {
    pub links: Vec<LinkReport>,
}

/// One link (`GET /links/{name}`; also the answer of a failover and of a
/// start).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LinkReport {
    pub name: String,
    #[serde(with = "state_name")]
    pub state: LinkState,
    /// When the link entered its state; -1 while the state topic holds no
    /// record of the link.
    pub since_ms: i64,
    /// As the operator configured it (Kafka accepts two spellings of an id).
    pub source_cluster_id: String,
    /// The link's latest failover; `null` if it never failed over.
    pub failover: Option<FailoverReport>,
    pub counters: LinkCounters,
}

/// A link's counters on this instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LinkCounters {
    pub local_writes_refused: u64,
    pub link_requests_refused: u64,
    pub connections_fenced: u64,
    pub open_link_connections: u64,
}

impl LinkCounters {
    /// Each counter with its name, in the order of their names (as the
    /// CLI lists them).
    pub(crate) fn named(&self) -> [(&'static str, u64); 4] {
        [
            ("connections_fenced", self.connections_fenced),
            ("link_requests_refused", self.link_requests_refused),
            ("local_writes_refused", self.local_writes_refused),
            ("open_link_connections", self.open_link_connections),
        ]
    }
}

/// A link's failover: its progress while it runs, its outcome after.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FailoverReport {
    pub id: i64,
    pub started_ms: i64,
    /// `null` until the link is `STOPPED`.
    pub finished_ms: Option<i64>,
    pub complete: bool,
    pub partitions_total: u64,
    /// The partitions whose barrier is no longer pending.
    pub partitions_done: u64,
    pub partitions: Vec<BarrierRow>,
    /// Live instances that did not confirm draining the link (empty on an
    /// instance that did not run the failover).
    pub unconfirmed_instances: Vec<String>,
    /// Why the run stopped short, with its causes; another failover call
    /// resumes it.
    pub error: Option<String>,
}

/// One partition's barrier in a failover.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BarrierRow {
    pub topic: String,
    pub partition: i32,
    pub result: BarrierState,
    /// The broker's answer to the barrier (0: appended); -1 if none came.
    pub error_code: i16,
    /// The broker's or the proxy's message about it, if any.
    pub message: Option<String>,
    /// The partition's log end offset after the barrier; -1 unknown.
    pub log_end_offset: i64,
    /// Mirrored producers of the partition this instance forgot.
    pub expired_producers: u64,
}

/// Where a partition's barrier is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum BarrierState {
    Pending,
    /// The log appended it; recorded.
    Accepted,
    /// The broker refused it (INVALID_RECORD from a stock broker); recorded.
    Refused,
    /// Not sent or not recorded: placing it again is safe.
    Failed,
}

impl BarrierState {
    /// As the API spells it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            BarrierState::Pending => "pending",
            BarrierState::Accepted => "accepted",
            BarrierState::Refused => "refused",
            BarrierState::Failed => "failed",
        }
    }

    /// Whether the barrier's outcome is recorded (the failover may finish).
    pub(crate) fn recorded(self) -> bool {
        matches!(self, BarrierState::Accepted | BarrierState::Refused)
    }
}

/// `GET /links/{name}/failover`: what a failover would do now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FailoverDryRun {
    pub link: String,
    /// Always true: says what the document is.
    pub dry_run: bool,
    #[serde(with = "state_name")]
    pub state: LinkState,
    pub action: FailoverAction,
    /// Why a failover would be refused (the link's state forbids it).
    pub refused: Option<String>,
    /// Neither refused nor held back by `max_delay` (without `force`).
    pub would_proceed: bool,
    pub max_delay_seconds: Option<f64>,
    pub force: bool,
    /// The partitions whose delay is above `max_delay`.
    pub over_max_delay: Vec<PartitionDelay>,
    pub live_instances: LiveInstances,
    pub partitions_total: u64,
    /// Partitions with no delay measured on this instance.
    pub partitions_without_delay: u64,
    pub partitions: Vec<PartitionRow>,
    /// Why `partitions` is empty, when the link's topics could not be listed.
    pub partitions_error: Option<String>,
}

/// What a failover call would do to the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum FailoverAction {
    /// `MIRRORING`: a new failover.
    Start,
    /// `STOPPING`: the failover in progress goes on.
    Resume,
    /// The link's state forbids a failover.
    Refuse,
}

/// The instances a failover would wait for, or why they are unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum LiveInstances {
    Listed(Vec<String>),
    /// `{"error": "..."}`: the instances' group could not be read.
    Unknown {
        error: String,
    },
}

/// A partition above `max_delay`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct PartitionDelay {
    pub topic: String,
    pub partition: i32,
    pub delay_seconds: f64,
}

/// One partition as this instance mirrored it (the dry run's rows, and
/// `GET /links/{name}/partitions`). The counts are absent for a partition
/// this instance mirrored nothing of; `producers` only in the latter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PartitionRow {
    pub topic: String,
    pub partition: i32,
    pub delay_seconds: Option<f64>,
    pub last_offset: Option<i64>,
    pub last_timestamp_ms: Option<i64>,
    pub last_mirrored_ms: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub records: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duplicates_answered: Option<u64>,
    /// The mirrored producers the proxy's producer state holds for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producers: Option<u64>,
}

/// `GET /links/{name}/partitions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct LinkPartitions {
    pub link: String,
    pub now_ms: i64,
    pub partitions: Vec<PartitionRow>,
}

/// The optional body of `POST /links/{name}/start`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct StartRequest {
    /// The source cluster the link mirrors from now on.
    #[serde(default)]
    pub source_cluster_id: Option<String>,
}

/// The failback's divergence report (`GET /links/{name}/failback`,
/// `failback --dry-run --json`).
///
/// The failback types declare their fields in the order of their names:
/// `failback --json` prints them directly, and has always listed the keys
/// sorted (the API's answers are sorted by `admin::json_response`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FailbackReport {
    /// The failover the failback undoes.
    pub failover_id: i64,
    pub partitions: Vec<FailbackPartition>,
    /// Partitions whose divergence cannot be told: nothing is written
    /// while any is.
    pub unresolved: u64,
}

/// One partition of a failback report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub(crate) enum FailbackPartition {
    Resolved(ResolvedPartition),
    Unresolved(UnresolvedPartition),
}

/// A partition whose divergence point is known.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ResolvedPartition {
    pub a_log_end: i64,
    pub b_log_end: i64,
    /// The first offset of B's own records: the failback copies from here.
    pub copy_from: i64,
    /// The first offset of A that B never got.
    pub diverges_at: i64,
    pub partition: i32,
    pub past_divergence: PastDivergence,
    pub topic: String,
}

/// A's records past the divergence point (B never got them), read
/// committed: aborted transactions and markers are not records anyone was
/// acknowledged. `replicate::failback` counts them (its `Tail`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PastDivergence {
    /// Batches of aborted transactions passed over.
    pub aborted_batches: u64,
    pub batches: u64,
    /// A's offsets of the first and last record.
    pub first_offset: Option<i64>,
    /// The batches' max timestamps: the first and last.
    pub first_time_ms: Option<i64>,
    pub last_offset: Option<i64>,
    pub last_time_ms: Option<i64>,
    /// A transaction still open on A (its records are not counted until it
    /// ends: A's `transaction.timeout.ms` aborts it).
    pub open_transaction: bool,
    pub records: u64,
}

/// A partition whose divergence cannot be told, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct UnresolvedPartition {
    pub partition: i32,
    pub topic: String,
    /// Why, for the operator.
    pub unresolved: String,
}

/// `POST /links/{name}/failback` done: the report and the started link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct FailbackDone {
    pub failback: FailbackReport,
    pub link: LinkReport,
}

/// `POST /links/{name}/failback` refused (409) while a partition is
/// unresolved: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct FailbackHeld {
    pub error: String,
    pub failback: FailbackReport,
}

/// A link state as the API spells it (`MIRRORING`, ...).
mod state_name {
    use serde::{de::Error as _, Deserialize, Deserializer, Serializer};

    use crate::mirror::link_state::LinkState;

    pub(super) fn serialize<S: Serializer>(state: &LinkState, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(state.as_str())
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<LinkState, D::Error> {
        let name = String::deserialize(d)?;
        LinkState::parse(&name)
            .ok_or_else(|| D::Error::custom(format!("{name:?} is not a link state")))
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;

    /// `value` serializes to exactly `expected`, and `expected` reads back
    /// as `value`.
    fn pinned<T>(value: &T, expected: serde_json::Value)
    where
        T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let json = serde_json::to_value(value).expect("serializes");
        assert_eq!(json, expected);
        let back: T = serde_json::from_value(expected).expect("reads back");
        assert_eq!(&back, value);
    }

    fn barrier(partition: i32, result: BarrierState) -> BarrierRow {
        BarrierRow {
            topic: "orders".into(),
            partition,
            result,
            error_code: 87,
            message: Some("INVALID_RECORD".into()),
            log_end_offset: 42,
            expired_producers: 3,
        }
    }

    fn stopped_link() -> LinkReport {
        LinkReport {
            name: "east".into(),
            state: LinkState::Stopped,
            since_ms: 1_700_000_000_000,
            source_cluster_id: "MkU3OEVBNTcwNTJENDM2Qg".into(),
            failover: Some(FailoverReport {
                id: 1_700_000_000_000,
                started_ms: 1_700_000_000_000,
                finished_ms: Some(1_700_000_001_234),
                complete: true,
                partitions_total: 1,
                partitions_done: 1,
                partitions: vec![barrier(0, BarrierState::Refused)],
                unconfirmed_instances: vec![],
                error: None,
            }),
            counters: LinkCounters {
                connections_fenced: 1,
                ..LinkCounters::default()
            },
        }
    }

    /// Partition 0 of `orders` as docs/operations.md shows it measured
    /// (the dry run's row and the partitions' row differ only in these).
    fn measured_row(duplicates_answered: u64, producers: Option<u64>) -> PartitionRow {
        PartitionRow {
            topic: "orders".into(),
            partition: 0,
            delay_seconds: Some(94.2),
            last_offset: Some(41),
            last_timestamp_ms: Some(1_700_000_000_000),
            last_mirrored_ms: Some(1_700_000_094_200),
            records: Some(42),
            batches: Some(7),
            bytes: Some(6020),
            duplicates_answered: Some(duplicates_answered),
            producers,
        }
    }

    /// The link of docs/operations.md.
    #[test]
    fn a_link_report_is_the_documented_json() {
        pinned(
            &stopped_link(),
            json!({"name": "east", "state": "STOPPED", "since_ms": 1_700_000_000_000_i64,
             "source_cluster_id": "MkU3OEVBNTcwNTJENDM2Qg",
             "failover": {"id": 1_700_000_000_000_i64, "started_ms": 1_700_000_000_000_i64,
               "finished_ms": 1_700_000_001_234_i64, "complete": true,
               "partitions_total": 1, "partitions_done": 1,
               "partitions": [{"topic": "orders", "partition": 0, "result": "refused",
                 "error_code": 87, "message": "INVALID_RECORD", "log_end_offset": 42,
                 "expired_producers": 3}],
               "unconfirmed_instances": [], "error": null},
             "counters": {"local_writes_refused": 0, "link_requests_refused": 0,
               "connections_fenced": 1, "open_link_connections": 0}}),
        );
        let never = LinkReport {
            state: LinkState::Mirroring,
            since_ms: -1,
            failover: None,
            ..stopped_link()
        };
        let json = serde_json::to_value(&never).expect("serializes");
        assert_eq!(json["failover"], serde_json::Value::Null);
        assert_eq!(json["state"], "MIRRORING");
        pinned(
            &LinkList {
                links: vec![never.clone()],
            },
            json!({ "links": [json] }),
        );
    }

    #[test]
    fn barrier_states_and_link_states_are_spelled_as_documented() {
        for (state, name) in [
            (BarrierState::Pending, "pending"),
            (BarrierState::Accepted, "accepted"),
            (BarrierState::Refused, "refused"),
            (BarrierState::Failed, "failed"),
        ] {
            pinned(&state, json!(name));
            assert_eq!(state.as_str(), name);
        }
        let report = serde_json::to_value(stopped_link()).expect("serializes");
        for state in ["MIRRORING", "STOPPING", "STOPPED", "PREPARING"] {
            let mut doc = report.clone();
            doc["state"] = json!(state);
            let read: LinkReport = serde_json::from_value(doc).expect("a link state");
            assert_eq!(read.state.as_str(), state);
        }
        let mut doc = report;
        doc["state"] = json!("FLYING");
        let e = serde_json::from_value::<LinkReport>(doc).expect_err("not a state");
        assert!(
            e.to_string().contains("\"FLYING\" is not a link state"),
            "{e}"
        );
    }

    /// The dry run of docs/operations.md.
    #[test]
    fn a_dry_run_is_the_documented_json() {
        let measured = measured_row(0, None);
        let unmeasured = PartitionRow {
            topic: "orders".into(),
            partition: 1,
            ..PartitionRow::default()
        };
        let dry_run = FailoverDryRun {
            link: "east".into(),
            dry_run: true,
            state: LinkState::Mirroring,
            action: FailoverAction::Start,
            refused: None,
            would_proceed: false,
            max_delay_seconds: Some(60.0),
            force: false,
            over_max_delay: vec![PartitionDelay {
                topic: "orders".into(),
                partition: 0,
                delay_seconds: 94.2,
            }],
            live_instances: LiveInstances::Listed(vec!["a".into(), "b".into()]),
            partitions_total: 2,
            partitions_without_delay: 1,
            partitions: vec![measured, unmeasured],
            partitions_error: None,
        };
        pinned(
            &dry_run,
            json!({"link": "east", "dry_run": true, "state": "MIRRORING",
             "action": "start", "refused": null, "would_proceed": false,
             "max_delay_seconds": 60.0, "force": false,
             "over_max_delay": [{"topic": "orders", "partition": 0, "delay_seconds": 94.2}],
             "live_instances": ["a", "b"],
             "partitions_total": 2, "partitions_without_delay": 1,
             "partitions": [{"topic": "orders", "partition": 0, "delay_seconds": 94.2,
               "last_offset": 41, "last_timestamp_ms": 1_700_000_000_000_i64,
               "last_mirrored_ms": 1_700_000_094_200_i64, "records": 42, "batches": 7,
               "bytes": 6020, "duplicates_answered": 0},
              {"topic": "orders", "partition": 1, "delay_seconds": null,
               "last_offset": null, "last_timestamp_ms": null, "last_mirrored_ms": null}],
             "partitions_error": null}),
        );
        pinned(
            &LiveInstances::Unknown {
                error: "no group".into(),
            },
            json!({"error": "no group"}),
        );
        for (action, name) in [
            (FailoverAction::Start, "start"),
            (FailoverAction::Resume, "resume"),
            (FailoverAction::Refuse, "refuse"),
        ] {
            pinned(&action, json!(name));
        }
    }

    /// The partitions of docs/operations.md.
    #[test]
    fn link_partitions_are_the_documented_json() {
        let row = measured_row(1, Some(2));
        pinned(
            &LinkPartitions {
                link: "east".into(),
                now_ms: 1_700_000_100_000,
                partitions: vec![row],
            },
            json!({"link": "east", "now_ms": 1_700_000_100_000_i64,
             "partitions": [{"topic": "orders", "partition": 0, "delay_seconds": 94.2,
               "last_offset": 41, "last_timestamp_ms": 1_700_000_000_000_i64,
               "last_mirrored_ms": 1_700_000_094_200_i64, "records": 42, "batches": 7,
               "bytes": 6020, "duplicates_answered": 1, "producers": 2}]}),
        );
    }

    #[test]
    fn a_failback_report_and_its_answers_are_pinned() {
        let report = FailbackReport {
            failover_id: 7,
            unresolved: 1,
            partitions: vec![
                FailbackPartition::Resolved(ResolvedPartition {
                    topic: "orders".into(),
                    partition: 0,
                    diverges_at: 10,
                    a_log_end: 12,
                    copy_from: 9,
                    b_log_end: 15,
                    past_divergence: PastDivergence {
                        records: 2,
                        batches: 1,
                        first_offset: Some(10),
                        last_offset: Some(11),
                        first_time_ms: Some(5),
                        last_time_ms: Some(6),
                        aborted_batches: 0,
                        open_transaction: false,
                    },
                }),
                FailbackPartition::Unresolved(UnresolvedPartition {
                    topic: "orders".into(),
                    partition: 1,
                    unresolved: "no barrier".into(),
                }),
            ],
        };
        let json = json!({"failover_id": 7, "unresolved": 1, "partitions": [
            {"topic": "orders", "partition": 0, "diverges_at": 10, "a_log_end": 12,
             "copy_from": 9, "b_log_end": 15,
             "past_divergence": {"records": 2, "batches": 1, "first_offset": 10,
               "last_offset": 11, "first_time_ms": 5, "last_time_ms": 6,
               "aborted_batches": 0, "open_transaction": false}},
            {"topic": "orders", "partition": 1, "unresolved": "no barrier"}]});
        pinned(&report, json.clone());
        // Printed directly by `failback --json`: keys sorted, as always.
        assert_eq!(
            serde_json::to_string(&report).expect("serializes"),
            json.to_string()
        );
        pinned(
            &FailbackHeld {
                error: "1 partition(s) unresolved: nothing written".into(),
                failback: report.clone(),
            },
            json!({"error": "1 partition(s) unresolved: nothing written", "failback": json}),
        );
        pinned(
            &FailbackDone {
                failback: report,
                link: stopped_link(),
            },
            json!({"failback": json, "link": serde_json::to_value(stopped_link()).expect("link")}),
        );
    }

    #[test]
    fn errors_and_the_start_body_are_pinned() {
        pinned(
            &ApiError {
                error: "no mirror link named 'x'".into(),
            },
            json!({"error": "no mirror link named 'x'"}),
        );
        pinned(
            &StartRequest {
                source_cluster_id: Some("MkU3OEVBNTcwNTJENDM2Qg".into()),
            },
            json!({"source_cluster_id": "MkU3OEVBNTcwNTJENDM2Qg"}),
        );
        // The field may be left out, or null.
        for body in [json!({}), json!({"source_cluster_id": null})] {
            let read: StartRequest = serde_json::from_value(body).expect("a start body");
            assert_eq!(read, StartRequest::default());
        }
    }
}
