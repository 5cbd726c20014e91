//! `failback`'s report: where clusters A and B diverge, as a table and as
//! the admin API's JSON (SPEC §12).

use crate::control::api::{
    FailbackPartition, FailbackReport, PastDivergence, ResolvedPartition, UnresolvedPartition,
};
use crate::replicate::failback::Plan;

use super::render::{table, utc};

/// `failback --dry-run`'s report: per partition, where A and B diverge,
/// A's records past that point (A's records B never got) and B's own
/// records the failback link will copy.
pub fn render_failback(plan: &Plan) -> String {
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
pub fn failback_json(plan: &Plan) -> FailbackReport {
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
