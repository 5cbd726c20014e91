//! The known-origin path allocates nothing: a lookup in the origins view
//! (and the Produce plan's per-batch work for a known origin) is measured
//! with a counting global allocator. Alone in its binary, so no other test
//! allocates meanwhile.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use kafka_mirror_proxy::mirror::origins::{compose, OriginId, Origins, PartitionId};
use kafka_mirror_proxy::mirror::pid::{cluster_hash, ClusterId};
use kafka_mirror_proxy::mirror::state_records::{OriginValue, StateRecord};
use uuid::Uuid;

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

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
            let o = OriginId { source, pid };
            let v = OriginValue {
                mapped_pid: compose(cluster_hash(&source), pid),
                salt: 0,
                claim_offset: -1,
                last_seen_ms: 0,
            };
            view.apply(
                (n * 16) as i64 + pid,
                &StateRecord::Origin(o.key(*p), Some(v)),
            );
        }
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
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
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(found, 100 * 64 * 16);
    assert_eq!(allocated, 0, "lookups allocated {allocated} times");
}
