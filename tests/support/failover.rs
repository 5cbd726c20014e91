//! Two regions, A and B, each a cluster behind a proxy, and what a
//! failover and a failback leave in them: the barriers in a proxy's state
//! topic and the producer-id regions of the batches in a partition's log.

use std::collections::BTreeMap;

use anyhow::Result;
use kafka_mirror_proxy::mirror::pid::{cluster_hash, unmap_pid, ClusterId};
use kafka_mirror_proxy::mirror::state_records::StateRecord;
use tokio::runtime::Runtime;

use super::crate_client::{client, state_records};
use super::kafka::KafkaCluster;
use super::tools::{self, DumpedBatch};

/// Region A's cluster id.
pub const ID_A: &str = "MkU3OEVBNTcwNTJENDM2Qk";
/// Region B's cluster id.
pub const ID_B: &str = "q1Zx7Kd8Tj2m4Wf0hYvRsA";

/// `env` with link `b` starting PREPARING (a failback link).
pub fn preparing(mut env: Vec<(String, String)>) -> Vec<(String, String)> {
    env.push(("LINK_B_INITIAL_STATE".into(), "PREPARING".into()));
    env
}

/// The producer-id region of the cluster with id `id`.
pub fn region(id: &str) -> Result<u32> {
    Ok(cluster_hash(&ClusterId::parse(id)?))
}

/// The region a batch's producer id was mirrored into (`None`: a
/// producer id of the cluster's own).
pub fn batch_region(batch: &DumpedBatch) -> Option<u32> {
    unmap_pid(batch.producer_id).map(|(r, _)| r)
}

/// Link `link`'s barriers in `cluster`'s proxy state topic: partition to
/// the log end offset each marks.
pub fn barriers(rt: &Runtime, cluster: &KafkaCluster, link: &str) -> Result<BTreeMap<i32, i64>> {
    let records = rt.block_on(state_records(
        &client(&cluster.bootstrap()),
        "__mirror_state",
    ))?;
    Ok(records
        .iter()
        .filter_map(|(_, r)| match r {
            StateRecord::Barrier(k, Some(v)) if k.link == link => {
                Some((k.partition, v.log_end_offset))
            }
            _ => None,
        })
        .collect())
}

/// Every batch of `topic`-`partition` in `cluster`'s log (DumpLogSegments).
pub fn dump(cluster: &KafkaCluster, topic: &str, partition: i32) -> Result<Vec<DumpedBatch>> {
    let mut out = Vec::new();
    for file in cluster.segment_files(topic, partition)? {
        out.extend(tools::dump_log_segments(&file, false)?);
    }
    Ok(out)
}
