//! The benchmarks' workloads: `benches/rewrite.rs` (criterion) and
//! `examples/cold_cost.rs` time what is built here, so the Produce path's
//! parts they reach stay crate-private. Each case is set up once and
//! handed over as a closure; the timing, the allocation counting and the
//! printing stay with the benchmark. Not part of the interface.

mod cold_cost;
mod rewrite;

pub use cold_cost::ColdCost;
pub use rewrite::cases;

use bytes::{Bytes, BytesMut};

use regex::Regex;
use uuid::Uuid;

use crate::mirror::link::{ControlBatchPolicy, Link};
use crate::mirror::origins::{compose, OriginId, Origins, PartitionId};
use crate::mirror::state_records::{OriginValue, StateRecord};
use crate::wire::batch::{build, NewBatch, NewRecord};

/// Topic `orders`' id, where a request or the topic-id table names it by id.
const ORDERS_ID: Uuid = Uuid::from_u128(0x5eed_0001);
/// The source producer of every batch the workloads build.
const PRODUCER: i64 = 5;

/// One measured case: criterion's group and id, and the work.
pub struct Case {
    pub group: &'static str,
    pub id: String,
    /// What one run counts for, when the group reports a throughput.
    pub per: Option<Per>,
    pub work: Work,
    /// Printed after the case ran (what the work's state ended as).
    pub report: Option<Box<dyn Fn() -> String>>,
}

/// What one run counts for.
pub enum Per {
    Bytes(u64),
    Element,
}

/// What one run does.
pub enum Work {
    /// The same work, again and again.
    Repeat(Box<dyn FnMut()>),
    /// Work on a fresh copy of `input` each run, the copy made (and the
    /// output dropped) outside the timing.
    Fresh {
        input: Bytes,
        run: Box<dyn FnMut(Bytes) -> BytesMut>,
    },
}

/// One batch of `records` records of `value_len` incompressible bytes each
/// (a xorshift stream), from [`PRODUCER`], built by the library's own batch
/// builder.
fn batch(records: usize, value_len: usize) -> Bytes {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let values: Vec<Vec<u8>> = (0..records)
        .map(|_| {
            (0..value_len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        })
        .collect();
    let records: Vec<NewRecord<'_>> = values
        .iter()
        .map(|v| NewRecord {
            key: None,
            value: Some(v),
            headers: &[],
            timestamp: 1_700_000_000_000,
        })
        .collect();
    let producer = NewBatch {
        producer_id: PRODUCER,
        producer_epoch: 0,
        base_sequence: 0,
        transactional: false,
        control: false,
    };
    Bytes::from(build(&producer, &records).expect("a batch of valid records"))
}

/// Link `east` (a fixed source cluster id) over topic `orders`.
fn orders_link(control_batches: ControlBatchPolicy) -> Link {
    Link::new(
        "east".into(),
        "MkU3OEVBNTcwNTJENDM2Qk"
            .parse()
            .expect("a valid cluster id"),
        "mirror-east".into(),
        vec![Regex::new("^(?:orders)$").expect("a valid pattern")],
        None,
        control_batches,
    )
}

/// The origins view of a link in steady state: [`PRODUCER`] of `link`'s
/// source known in partitions `0..partitions` of `topic_id`, mapped
/// without a salt.
fn known_origins(link: &Link, topic_id: Uuid, partitions: i32) -> Origins {
    let mut view = Origins::new([*link.source_cluster_id()]);
    let origin = OriginId {
        source: *link.source_cluster_id(),
        pid: PRODUCER,
    };
    for partition in 0..partitions {
        let value = OriginValue {
            mapped_pid: compose(link.region(), PRODUCER),
            salt: 0,
            claim_offset: -1,
            last_seen_ms: 0,
        };
        let at = PartitionId {
            topic_id,
            partition,
        };
        view.apply(
            i64::from(partition),
            &StateRecord::Origin(origin.key(at), Some(value)),
        );
    }
    view
}
