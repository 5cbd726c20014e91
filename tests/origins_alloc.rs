//! The known-origin path allocates nothing: a lookup in the origins view
//! (and the Produce plan's per-batch work for a known origin) is measured
//! with a global allocator that counts this thread's allocations
//! (`support/counting_alloc.rs`), so the test harness's own work on its
//! other threads (reporting the test before, starting the next) is not
//! counted.

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use kafka_mirror_proxy::mirror::origins::{compose, OriginId, Origins, PartitionId};
use kafka_mirror_proxy::mirror::pid::{cluster_hash, ClusterId};
use kafka_mirror_proxy::mirror::state_records::{OriginValue, StateRecord};
use uuid::Uuid;

use counting_alloc::allocations;

/// `source`'s PID `pid` claiming its natural slot in `p` (a new claim).
fn natural_claim(source: ClusterId, p: PartitionId, pid: i64) -> StateRecord {
    let v = OriginValue {
        mapped_pid: compose(cluster_hash(&source), pid),
        salt: 0,
        claim_offset: -1,
        last_seen_ms: 0,
    };
    StateRecord::Origin(OriginId { source, pid }.key(p), Some(v))
}

#[test]
fn a_known_origin_lookup_allocates_nothing() {
    let source = ClusterId::from_bytes(*b"alloc-test-clstr");
    let mut view = Origins::new([source]);
    let partitions: Vec<PartitionId> = (0..64)
        .map(|i| PartitionId {
            topic_id: Uuid::from_u128(42),
            partition: i,
        })
        .collect();
    for (n, p) in partitions.iter().enumerate() {
        for pid in 0..16 {
            view.apply((n * 16) as i64 + pid, &natural_claim(source, *p, pid));
        }
    }
    let before = allocations();
    let mut found = 0;
    for round in 0..100 {
        for p in &partitions {
            for pid in 0..16 {
                let o = OriginId { source, pid };
                if view.lookup(*p, o, 1_000 * round).is_some() {
                    found += 1;
                }
            }
        }
    }
    let allocated = allocations() - before;
    assert_eq!(found, 100 * 64 * 16);
    assert_eq!(allocated, 0, "lookups allocated {allocated} times");
}

/// A new origin's claim costs its two hash-map entries and nothing else:
/// a slot's claimants (nearly always one) are held inline. Memory per
/// origin is what bounds a link with a million producers (about 400 bytes
/// each, `docs/benchmark-log.md`); a heap block per slot added a third.
/// The maps are given room first, so any allocation counted is per claim.
#[test]
fn claiming_a_new_origin_allocates_nothing_beyond_the_maps() {
    let source = ClusterId::from_bytes(*b"alloc-test-clstr");
    let p = PartitionId {
        topic_id: Uuid::from_u128(7),
        partition: 0,
    };
    let claim = |view: &mut Origins, pid: i64| {
        assert!(view.apply(pid, &natural_claim(source, p, pid)));
    };
    let mut view = Origins::new([source]);
    // Grow both maps to hold 2,048 entries, then empty them by tombstones:
    // a hash map keeps its capacity.
    for pid in 0..2_048 {
        claim(&mut view, pid);
    }
    for pid in 0..2_048 {
        let o = OriginId { source, pid };
        view.apply(10_000 + pid, &StateRecord::Origin(o.key(p), None));
    }
    assert!(view.is_empty());
    let before = allocations();
    for pid in 0..1_000 {
        claim(&mut view, pid);
    }
    let allocated = allocations() - before;
    assert_eq!(view.len(), 1_000);
    assert_eq!(allocated, 0, "1,000 new claims allocated {allocated} times");
}
