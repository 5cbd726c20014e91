//! `failback`: the report of where clusters A and B diverge, then the
//! failback link's history, starting points and start (SPEC §12).

use crate::client::{Client, ClientConfig};
use crate::config::replicator::{default_group_id, DEFAULT_OFFSETS_TOPIC};
use crate::config::DEFAULT_STATE_TOPIC;
use crate::control::api::{
    FailbackPartition, FailbackReport, PastDivergence, ResolvedPartition, UnresolvedPartition,
};
use crate::replicate::failback::{self, Failback, FailbackError, Plan};
use crate::sync::error_chain;

use super::admin_api::{AdminClient, CliError};
use super::links::{link_state, start};
use super::render::{table, utc};
use super::{EXIT_ERROR, EXIT_OK, EXIT_REFUSED};

/// What `failback` reads, writes and starts: the command's flags.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct FailbackArgs {
    /// The failback link on A's proxy.
    #[arg(long)]
    pub(crate) link: String,
    /// The link on B's proxy that mirrored A into B and failed over.
    #[arg(long)]
    pub(crate) reverse_of: String,
    /// Cluster A: its brokers (or A's proxy), host:port,...
    #[arg(long)]
    pub(crate) bootstrap_server: String,
    /// Cluster B, host:port,...
    #[arg(long)]
    pub(crate) source_bootstrap_server: String,
    /// B's proxy's state topic.
    #[arg(long, default_value = DEFAULT_STATE_TOPIC)]
    pub(crate) state_topic: String,
    /// The replicators' OFFSETS_TOPIC (on both clusters).
    #[arg(long, default_value = DEFAULT_OFFSETS_TOPIC)]
    pub(crate) offsets_topic: String,
    /// REVERSE_OF's replicator's GROUP_ID (default
    /// replicator.mirror-<REVERSE_OF>), on B.
    #[arg(long)]
    pub(crate) forward_group: Option<String>,
    /// LINK's replicator's GROUP_ID (default replicator.mirror-<LINK>),
    /// on A.
    #[arg(long)]
    pub(crate) progress_group: Option<String>,
    /// Report and change nothing (no admin API needed).
    #[arg(long)]
    pub(crate) dry_run: bool,
    #[arg(long)]
    pub(crate) json: bool,
}

/// Why `failback` failed (a refusal is an exit code, not an error).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FailbackCliError {
    /// A's proxy's admin API.
    #[error(transparent)]
    Admin(#[from] CliError),
    /// Reading the clusters, or writing A (boxed: the client's errors
    /// are large).
    #[error(transparent)]
    Failback(Box<FailbackError>),
    #[error("starting the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("encoding the report: {0}")]
    Json(#[source] serde_json::Error),
}

impl From<FailbackError> for FailbackCliError {
    fn from(e: FailbackError) -> FailbackCliError {
        FailbackCliError::Failback(Box::new(e))
    }
}

impl FailbackCliError {
    /// The process exit code for this error: 1, whatever went wrong
    /// (a refusal returns its own code instead).
    pub(crate) fn exit_code(&self) -> u8 {
        EXIT_ERROR
    }
}

/// `failback`: the report, then (without `dry_run`) the history, the
/// starting points and the link's start. Its exit code: 0 done (or would
/// proceed), 3 refused.
pub(crate) fn failback(args: &FailbackArgs) -> Result<u8, FailbackCliError> {
    let forward_group =
        (args.forward_group.clone()).unwrap_or_else(|| default_group_id(&args.reverse_of));
    let progress_group =
        (args.progress_group.clone()).unwrap_or_else(|| default_group_id(&args.link));
    let a = Client::new(ClientConfig::plain(&args.bootstrap_server));
    let b = Client::new(ClientConfig::plain(&args.source_bootstrap_server));
    let f = Failback {
        link: &args.link,
        reverse_of: &args.reverse_of,
        a: &a,
        b: &b,
        state_topic: &args.state_topic,
        offsets_topic: &args.offsets_topic,
        forward_group: &forward_group,
        progress_group: &progress_group,
    };
    let admin = if args.dry_run {
        None
    } else {
        Some(AdminClient::from_env()?)
    };
    let runtime = super::runtime().map_err(FailbackCliError::Runtime)?;
    runtime.block_on(async {
        // Nothing is written while the link could be copying: it must be
        // fenced (PREPARING, or STOPPED after a failover of its own).
        if let Some(admin) = &admin {
            let state = link_state(admin, &args.link).await?;
            if state != "PREPARING" && state != "STOPPED" {
                eprintln!(
                    "kafka-mirror-proxy: link '{}' is {state} on A's proxy: a failback starts a PREPARING (or STOPPED) link (MIRROR_PROXY_LINK_<NAME>_INITIAL_STATE=PREPARING)",
                    args.link
                );
                return Ok(EXIT_REFUSED);
            }
        }
        let plan = match failback::plan(&f).await {
            Ok(plan) => plan,
            Err(e) if e.is_refusal() => {
                eprintln!("kafka-mirror-proxy: {}", error_chain(&e));
                return Ok(EXIT_REFUSED);
            }
            Err(e) => return Err(e.into()),
        };
        if args.json {
            let report = serde_json::to_string_pretty(&failback_json(&plan))
                .map_err(FailbackCliError::Json)?;
            println!("{report}");
        } else {
            print!("{}", render_failback(&plan));
        }
        if plan.unresolved() > 0 {
            eprintln!(
                "kafka-mirror-proxy: {} partition(s) unresolved: nothing written",
                plan.unresolved()
            );
            return Ok(EXIT_REFUSED);
        }
        let Some(admin) = admin else {
            return Ok(EXIT_OK);
        };
        failback::apply(&f, &plan, crate::state::now_ms()).await?;
        Ok(start(&admin, &args.link, None, args.json).await?)
    })
}

/// `failback --dry-run`'s report: per partition, where A and B diverge,
/// A's records past that point (A's records B never got) and B's own
/// records the failback link will copy.
pub(crate) fn render_failback(plan: &Plan) -> String {
    let opt = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
    let rows: Vec<Vec<String>> = plan
        .partitions
        .iter()
        .map(|p| match &p.point {
            Ok(point) => {
                let t = &p.tail;
                vec![
                    p.topic.clone(),
                    p.partition.to_string(),
                    point.a_next.to_string(),
                    format!(
                        "{}{}",
                        t.records,
                        if t.open_transaction {
                            " (+open txn)"
                        } else {
                            ""
                        }
                    ),
                    format!("{}..{}", opt(t.first_offset), opt(t.last_offset)),
                    match (t.first_time_ms, t.last_time_ms) {
                        (Some(a), Some(b)) => format!("{} .. {}", utc(a), utc(b)),
                        _ => "-".to_string(),
                    },
                    format!("{}..{}", point.b_start, p.b_end),
                ]
            }
            Err(e) => vec![
                p.topic.clone(),
                p.partition.to_string(),
                "UNRESOLVED".to_string(),
                e.to_string(),
                String::new(),
                String::new(),
                String::new(),
            ],
        })
        .collect();
    let records: u64 = plan.partitions.iter().map(|p| p.tail.records).sum();
    format!(
        "failover {}: {} partition(s), {} record(s) of A past the divergence point, {} unresolved\n{}",
        plan.failover_id,
        plan.partitions.len(),
        records,
        plan.unresolved(),
        table(
            &[
                "TOPIC",
                "PARTITION",
                "A DIVERGES AT",
                "A RECORDS B NEVER GOT",
                "THEIR OFFSETS",
                "THEIR TIMES (UTC)",
                "B OFFSETS TO COPY",
            ],
            &rows,
        )
    )
}

/// The failback report, as the API and `failback --json` give it.
pub(crate) fn failback_json(plan: &Plan) -> FailbackReport {
    let partitions = plan
        .partitions
        .iter()
        .map(|p| {
            let t = &p.tail;
            match &p.point {
                Ok(point) => FailbackPartition::Resolved(ResolvedPartition {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    diverges_at: point.a_next,
                    a_log_end: p.a_end,
                    copy_from: point.b_start,
                    b_log_end: p.b_end,
                    past_divergence: PastDivergence {
                        records: t.records,
                        batches: t.batches,
                        first_offset: t.first_offset,
                        last_offset: t.last_offset,
                        first_time_ms: t.first_time_ms,
                        last_time_ms: t.last_time_ms,
                        aborted_batches: t.aborted_batches,
                        open_transaction: t.open_transaction,
                    },
                }),
                Err(e) => FailbackPartition::Unresolved(UnresolvedPartition {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    // Shown to the operator: why the partition is unresolved.
                    unresolved: e.to_string(),
                }),
            }
        })
        .collect();
    FailbackReport {
        failover_id: plan.failover_id,
        unresolved: plan.unresolved() as u64,
        partitions,
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    /// Every error is exit code 1; each keeps its cause as its source,
    /// and a wrapped one reads as it did unwrapped.
    #[test]
    fn errors_keep_their_cause() {
        let e = FailbackCliError::Runtime(std::io::Error::other("no threads"));
        assert_eq!(e.to_string(), "starting the tokio runtime: no threads");
        assert_eq!(e.source().map(|s| s.to_string()), Some("no threads".into()));
        assert_eq!(e.exit_code(), EXIT_ERROR);

        let refused = FailbackError::NoState {
            link: "east".into(),
            topic: "__mirror_state".into(),
        };
        let text = refused.to_string();
        let e = FailbackCliError::from(refused);
        assert_eq!(e.to_string(), text);
        assert_eq!(e.exit_code(), EXIT_ERROR);

        let admin = CliError::Status {
            status: 404,
            message: "no link 'east'".into(),
        };
        let e = FailbackCliError::from(admin);
        assert_eq!(e.to_string(), "admin API answered 404: no link 'east'");
        // Unlike `links`, `start` and `failover`, an API refusal here is 1.
        assert_eq!(e.exit_code(), EXIT_ERROR);

        let e = AdminClient::new("https://x:1", None)
            .map(|_| ())
            .map_err(FailbackCliError::from)
            .expect_err("https");
        assert_eq!(
            error_chain(&e),
            "MIRROR_PROXY_ADMIN_URL \"https://x:1\": only http:// is supported (the admin endpoint serves plain HTTP)"
        );
    }
}
