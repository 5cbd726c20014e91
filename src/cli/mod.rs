//! The operator's commands against a running proxy's admin API: `links`, `failover NAME`, `start NAME`. Talks plain HTTP/1.1
//! to `MIRROR_PROXY_ADMIN_URL` with the bearer token
//! `MIRROR_PROXY_ADMIN_TOKEN`; prints tables, or the API's JSON with
//! `--json`.
//!
//! The answers are read into the API's own types (`control::api`, the
//! ones the proxy writes them from); rendering and exit codes are pure
//! functions of them (unit tested with fixed documents); `AdminClient` does
//! the I/O. `--json` prints the answer as it came.
//!
//! Exit codes: 0 every partition of the failover completed (accepted, or
//! refused and recorded), or a `--dry-run` found nothing holding the
//! failover back; 2 a partition failed, an instance did not confirm, or
//! the failover had not finished when `--wait` ran out; 3 the API answered
//! 404, 409 or 412 (`--max-delay` exceeded), or a `--dry-run` found the
//! failover would be refused or held back; 1 any other error (connection,
//! auth).

mod admin_api;
mod failback;
mod failover;
mod links;
mod render;

pub use admin_api::{AdminClient, CliError, HttpError};
pub use failback::{failback_json, render_failback};
pub use failover::{failover, FailoverChecks};
pub use links::{link_state, links, start};

pub const EXIT_OK: u8 = 0;
pub const EXIT_ERROR: u8 = 1;
pub(crate) const EXIT_INCOMPLETE: u8 = 2;
pub const EXIT_REFUSED: u8 = 3;

/// Documents as the admin API answers them, for the tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use serde::de::DeserializeOwned;
    use serde_json::{json, Value};

    use crate::control::api::LinkReport;

    /// A link as the proxy answers it, finished.
    pub(crate) fn done_link_json() -> Value {
        json!({
            "name": "east", "state": "STOPPED", "since_ms": 1_700_000_000_000i64,
            "source_cluster_id": "MkU3OEVBNTcwNTJENDM2Qg",
            "failover": {
                "id": 1_700_000_000_000i64, "started_ms": 1_700_000_000_000i64,
                "finished_ms": 1_700_000_001_000i64,
                "complete": true, "partitions_total": 2, "partitions_done": 2,
                "partitions": [
                    {"topic": "orders", "partition": 0, "result": "refused", "error_code": 87,
                     "message": "INVALID_RECORD", "log_end_offset": 42, "expired_producers": 3},
                    {"topic": "orders", "partition": 1, "result": "accepted", "error_code": 0,
                     "message": null, "log_end_offset": 7, "expired_producers": 0}
                ],
                "unconfirmed_instances": [], "error": null
            },
            "counters": {"local_writes_refused": 5, "link_requests_refused": 0,
                "connections_fenced": 1, "open_link_connections": 0}
        })
    }

    /// `doc` read as the CLI reads an answer.
    pub(crate) fn read<T: DeserializeOwned>(doc: Value) -> T {
        T::deserialize(&doc).expect("the document reads as the API's type")
    }

    pub(crate) fn done_link() -> LinkReport {
        read(done_link_json())
    }
}
