use super::*;
// `propose` takes the std set of slots taken this round; the parent's
// `HashSet` is foldhash's.
use std::collections::HashSet;

/// Two cluster ids with the same 32-bit hash (1): msb ^ lsb differ only
/// above bit 31.
fn a() -> ClusterId {
    let mut b = [0u8; 16];
    b[7] = 1;
    ClusterId::from_bytes(b)
}
fn b() -> ClusterId {
    let mut b = [0u8; 16];
    b[3] = 1;
    b[15] = 1;
    ClusterId::from_bytes(b)
}
const P: PartitionId = PartitionId {
    topic_id: Uuid::from_u128(7),
    partition: 0,
};

fn claim(o: OriginId, mapped: i64, salt: i64, claim_offset: i64, last_seen_ms: i64) -> StateRecord {
    StateRecord::Origin(
        o.key(P),
        Some(OriginValue {
            mapped_pid: mapped,
            salt,
            claim_offset,
            last_seen_ms,
        }),
    )
}

fn no_taken() -> HashSet<(PartitionId, i64)> {
    HashSet::new()
}

fn counter(start: i64) -> impl FnMut() -> i64 {
    let mut n = start;
    move || {
        n += 1;
        n
    }
}

#[test]
fn formula() {
    assert_eq!(cluster_hash(&a()), 1);
    assert_eq!(cluster_hash(&b()), 1);
    assert_eq!(fold32(0x0123_4567_89ab_cdef), 0x8888_8888);
    assert_eq!(fold32(0x0000_0001_0000_0001), 0);
    assert_eq!(salted_region(1, 0x0000_0000_0000_0002), 3);
    assert_eq!(compose(42, 5), -9_223_371_946_660_462_587);
    assert_eq!(compose(0xFFFF_FFFF, 0x7FFF_FFFF), -1);
    // Only the identity bits of the pid are used.
    assert_eq!(compose(42, (1 << 31) + 5), compose(42, 5));
    assert_eq!(compose(3, -9_223_371_946_660_462_587), compose(3, 5));
}

#[test]
fn natural_claim_is_looked_up() {
    let mut v = Origins::new([a()]);
    let o = OriginId {
        source: a(),
        pid: 5,
    };
    let p = v.propose(P, o, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!(
        p,
        Proposal {
            mapped: compose(1, 5),
            salt: 0,
            collision: None,
            held_by: None
        }
    );
    assert_eq!(v.lookup(P, o, 0), None);
    v.apply(10, &claim(o, p.mapped, 0, -1, 100));
    assert_eq!(v.lookup(P, o, 100), Some(compose(1, 5)));
    assert_eq!(v.claim_of(P, o).unwrap().claim_offset, 10);
    // Another partition knows nothing of it.
    let q = PartitionId { partition: 1, ..P };
    assert_eq!(v.lookup(q, o, 100), None);
}

#[test]
fn hash_collision_is_salted_out_of_every_natural_region() {
    let mut v = Origins::new([a(), b()]);
    let oa = OriginId {
        source: a(),
        pid: 0,
    };
    let ob = OriginId {
        source: b(),
        pid: 0,
    };
    v.apply(0, &claim(oa, compose(1, 0), 0, -1, 0));
    // Salts 1, 2, ...: salt 1 gives region 0 (1 ^ 1); mark region 0 as a
    // known cluster's natural region so the first try is refused.
    let zero = ClusterId::from_bytes([0; 16]);
    v.apply(
        1,
        &StateRecord::Origin(
            OriginId {
                source: zero,
                pid: 9,
            }
            .key(P),
            None,
        ),
    );
    assert!(v.is_natural_region(0));
    let p = v.propose(P, ob, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!(p.salt, 2);
    assert_eq!(p.mapped, compose(1 ^ 2, 0));
    assert_eq!(p.collision, Some((Cause::Hash, a())));
    assert_eq!(p.held_by, Some(oa));
    v.apply(2, &claim(ob, p.mapped, p.salt, -1, 0));
    assert_eq!(v.lookup(P, oa, 0), Some(compose(1, 0)));
    assert_eq!(v.lookup(P, ob, 0), Some(compose(3, 0)));
    // A slot proposed in the same round to someone else is not reused.
    let oc = OriginId {
        source: b(),
        pid: 1,
    };
    let taken: HashSet<_> = [(P, compose(1, 1))].into();
    let p = v.propose(P, oc, &taken, &mut counter(2)).unwrap();
    assert_eq!(p.mapped, compose(1 ^ 3, 1));
}

#[test]
fn a_known_salt_is_applied_directly() {
    let mut v = Origins::new([a(), b()]);
    let ob = OriginId {
        source: b(),
        pid: 0,
    };
    v.apply(
        0,
        &StateRecord::Collision(
            ob.key(P),
            Some(CollisionValue {
                salt: 0x77,
                colliding: a(),
                timestamp_ms: 0,
            }),
        ),
    );
    let p = v.propose(P, ob, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!(
        p,
        Proposal {
            mapped: compose(1 ^ 0x77, 0),
            salt: 0x77,
            collision: None,
            held_by: None
        }
    );
    // Tombstoned salt: back to the natural slot.
    v.apply(1, &StateRecord::Collision(ob.key(P), None));
    assert_eq!(
        v.propose(P, ob, &no_taken(), &mut counter(0)).unwrap().salt,
        0
    );
}

#[test]
fn oversized_and_minus_one_are_collisions() {
    let v = Origins::new([a()]);
    let big = OriginId {
        source: a(),
        pid: (1 << 31) + 5,
    };
    let p = v.propose(P, big, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!(p.collision, Some((Cause::OversizedPid, a())));
    assert_eq!(p.mapped, compose(1 ^ 1, 5));
    assert_ne!(p.mapped, compose(1, 5));
    // Hash 0xffffffff with identity 0x7fffffff would be -1.
    let mut ff = [0u8; 16];
    ff[4..8].copy_from_slice(&[0xff; 4]);
    let ff = ClusterId::from_bytes(ff);
    assert_eq!(cluster_hash(&ff), 0xFFFF_FFFF);
    let o = OriginId {
        source: ff,
        pid: 0x7FFF_FFFF,
    };
    let p = v.propose(P, o, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!(p.collision, Some((Cause::MinusOne, ff)));
    assert_ne!(p.mapped, -1);
    assert!(p.mapped < 0);
}

#[test]
fn lower_claim_offset_owns_the_slot() {
    let mut v = Origins::new([a(), b()]);
    let oa = OriginId {
        source: a(),
        pid: 0,
    };
    let ob = OriginId {
        source: b(),
        pid: 0,
    };
    let slot = compose(1, 0);
    // Two instances raced: both claimed the natural slot.
    v.apply(4, &claim(ob, slot, 0, -1, 0));
    v.apply(5, &claim(oa, slot, 0, -1, 0));
    assert_eq!(v.owner(P, slot), Some(ob));
    assert_eq!(v.lookup(P, ob, 0), Some(slot));
    assert_eq!(v.lookup(P, oa, 0), None, "the loser must re-resolve");
    // The loser re-resolves: a salt.
    let p = v.propose(P, oa, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!(p.collision, Some((Cause::Hash, b())));
    v.apply(6, &claim(oa, p.mapped, p.salt, -1, 0));
    assert_eq!(v.lookup(P, oa, 0), Some(p.mapped));
    assert_eq!(v.owner(P, slot), Some(ob));
    // A refresh keeps the original claim offset, so ownership stays.
    v.apply(7, &claim(ob, slot, 0, 4, 50));
    assert_eq!(v.claim_of(P, ob).unwrap().claim_offset, 4);
    assert_eq!(v.claim_of(P, ob).unwrap().persisted_last_seen_ms, 50);
    // Tombstone of the owner frees the slot.
    v.apply(8, &StateRecord::Origin(ob.key(P), None));
    assert_eq!(v.owner(P, slot), None);
    assert_eq!(v.lookup(P, ob, 0), None);
    // A late refresh of the tombstoned claim does not revive it.
    v.apply(9, &claim(ob, slot, 0, 4, 60));
    assert_eq!(v.owner(P, slot), None);
    assert_eq!(v.len(), 1);
}

#[test]
fn ownership_passes_to_the_next_claimant() {
    let mut v = Origins::new([a(), b()]);
    let oa = OriginId {
        source: a(),
        pid: 0,
    };
    let ob = OriginId {
        source: b(),
        pid: 0,
    };
    let slot = compose(1, 0);
    v.apply(1, &claim(oa, slot, 0, -1, 0));
    v.apply(2, &claim(ob, slot, 0, -1, 0));
    v.apply(3, &StateRecord::Origin(oa.key(P), None));
    assert_eq!(v.lookup(P, ob, 0), Some(slot));
}

#[test]
fn chain_origins_keep_the_pid_as_received_unless_it_is_held() {
    let mut v = Origins::new([a(), b()]);
    // PID 0 of a cluster with hash 1, already mapped upstream.
    let received = compose(1, 0);
    let chain = OriginId {
        source: b(),
        pid: received,
    };
    let p = v.propose(P, chain, &no_taken(), &mut counter(0)).unwrap();
    assert_eq!((p.mapped, p.salt, p.collision), (received, 0, None));
    // Now a local link's cluster a (hash 1) holds that slot first.
    let oa = OriginId {
        source: a(),
        pid: 0,
    };
    v.apply(0, &claim(oa, received, 0, -1, 0));
    let p = v.propose(P, chain, &no_taken(), &mut counter(4)).unwrap();
    assert_eq!(p.collision, Some((Cause::Hash, a())));
    assert_eq!(p.salt, 5);
    assert_eq!(p.mapped, compose(cluster_hash(&b()) ^ 5, 0));
}

#[test]
fn expiry_and_refresh_due() {
    let mut v = Origins::new([a()]);
    let o = OriginId {
        source: a(),
        pid: 1,
    };
    v.apply(0, &claim(o, compose(1, 1), 0, -1, 1_000));
    assert!(v.due_refresh(100).is_empty());
    assert_eq!(v.lookup(P, o, 5_000), Some(compose(1, 1)));
    let due = v.due_refresh(100);
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].2.claim_offset, 0);
    assert_eq!(due[0].2.last_seen_ms, 5_000);
    assert!(v.expired(5_000 + 10_000, 10_000).is_empty());
    assert_eq!(v.expired(5_001 + 10_000, 10_000), vec![(P, o, false)]);
}

/// Only the mapping the proxy itself would write for a key (its salt's, a
/// chain's own PID) is applied: a forged record claims nothing.
#[test]
fn only_a_mapping_the_proxy_could_write_is_applied() {
    let key = |pid| OriginKey {
        topic_id: Uuid::nil(),
        partition: 0,
        source: a(),
        original_pid: pid,
    };
    let value = |mapped, salt| OriginValue {
        mapped_pid: mapped,
        salt,
        claim_offset: -1,
        last_seen_ms: 0,
    };
    let hash = cluster_hash(&a());
    let natural = compose(hash, 7);
    assert!(is_valid_mapping(&key(7), &value(natural, 0)));
    let salted = compose(salted_region(hash, 99), 7);
    assert!(is_valid_mapping(&key(7), &value(salted, 99)));
    assert!(is_valid_mapping(&key(-9), &value(-9, 0)), "a chain");
    for forged in [5, 0, -1, natural + 1, compose(hash ^ 1, 7), salted] {
        assert!(!is_valid_mapping(&key(7), &value(forged, 0)), "{forged}");
    }
    assert!(
        !is_valid_mapping(&key(7), &value(natural, 99)),
        "another salt's"
    );
    assert!(!is_valid_mapping(&key(-1), &value(-1, 0)), "no producer");

    let mut view = Origins::new([a()]);
    let at = PartitionId {
        topic_id: Uuid::nil(),
        partition: 0,
    };
    let origin = OriginId {
        source: a(),
        pid: 7,
    };
    assert!(!view.apply(10, &StateRecord::Origin(key(7), Some(value(5, 0)))));
    assert!(view.claim_of(at, origin).is_none(), "nothing claimed");
    assert!(view.apply(11, &StateRecord::Origin(key(7), Some(value(natural, 0)))));
    assert_eq!(view.claim_of(at, origin).map(|c| c.mapped), Some(natural));
}

/// A salt the proxy never draws (its fold is 0: the natural region) is
/// skipped; any other is remembered.
#[test]
fn a_salt_that_changes_nothing_is_skipped() {
    use crate::mirror::state_records::CollisionValue;
    let key = OriginKey {
        topic_id: Uuid::nil(),
        partition: 0,
        source: a(),
        original_pid: 7,
    };
    let salt = |salt| {
        StateRecord::Collision(
            key,
            Some(CollisionValue {
                salt,
                colliding: a(),
                timestamp_ms: 0,
            }),
        )
    };
    let mut view = Origins::new([a()]);
    for s in [0, 0x0000_0001_0000_0001, -1] {
        assert_eq!(fold32(s), 0, "{s:#x}");
        assert!(!view.apply(1, &salt(s)), "{s:#x}");
    }
    assert!(view.apply(2, &salt(99)));
    assert!(
        view.apply(3, &StateRecord::Collision(key, None)),
        "a tombstone"
    );
}

/// The revive race (issue 26 item 9): instance X refreshes a claim while Y
/// expires it; the refresh lands after the tombstone. Live instances ignore
/// it, but compaction keeps only the latest record of a key: the refresh.
/// A load after compaction would bring the dead claim back, owning its slot
/// before any later claimant. The refresh is tombstoned again, so the
/// compacted log holds a tombstone.
#[test]
fn a_refresh_that_raced_a_tombstone_is_tombstoned_again_before_compaction_can_revive_it() {
    let o = OriginId {
        source: a(),
        pid: 5,
    };
    let mapped = compose(1, 5);
    let mut log: Vec<(i64, StateRecord)> = vec![
        (10, claim(o, mapped, 0, -1, 100)),
        (20, StateRecord::Origin(o.key(P), None)),
        (30, claim(o, mapped, 0, 10, 200)),
    ];
    let mut live = Origins::new([a()]);
    for (offset, r) in &log {
        live.apply(*offset, r);
    }
    assert_eq!(live.lookup(P, o, 0), None, "ignored live");
    // What compaction keeps: the latest record of each key.
    let reload = |log: &[(i64, StateRecord)]| {
        let mut latest = std::collections::HashMap::new();
        for (offset, r) in log {
            let StateRecord::Origin(k, _) = r else {
                continue;
            };
            latest.insert(*k, (*offset, r.clone()));
        }
        let mut kept: Vec<_> = latest.into_values().collect();
        kept.sort_by_key(|(offset, _)| *offset);
        let mut v = Origins::new([a()]);
        for (offset, r) in &kept {
            v.apply(*offset, r);
        }
        v.lookup(P, o, 0)
    };
    assert_eq!(
        reload(&log),
        Some(mapped),
        "the race: revived without the fix"
    );
    let again = live.take_stale_refreshes();
    assert_eq!(again, vec![o.key(P)]);
    assert!(live.take_stale_refreshes().is_empty(), "taken once");
    log.extend(
        again
            .into_iter()
            .map(|k| (40, StateRecord::Origin(k, None))),
    );
    assert_eq!(reload(&log), None, "the compacted log keeps the tombstone");
}

/// A new claim after the tombstone is the origin's latest record: nothing
/// to tombstone again (that would kill the new claim).
#[test]
fn a_new_claim_after_a_raced_refresh_is_not_tombstoned() {
    let o = OriginId {
        source: a(),
        pid: 5,
    };
    let mapped = compose(1, 5);
    let mut v = Origins::new([a()]);
    v.apply(10, &claim(o, mapped, 0, -1, 100));
    v.apply(20, &StateRecord::Origin(o.key(P), None));
    v.apply(30, &claim(o, mapped, 0, 10, 200));
    v.apply(40, &claim(o, mapped, 0, -1, 300));
    assert_eq!(v.lookup(P, o, 0), Some(mapped));
    assert!(v.take_stale_refreshes().is_empty());
}

/// Tombstone offsets are remembered up to a bound (issue 26 item 8: state
/// that only grows), the oldest forgotten first.
#[test]
fn tombstones_remembered_are_bounded() {
    let mut v = Origins::new([a()]);
    let n = MAX_TOMBSTONES as i64 + 10;
    for pid in 0..n {
        let o = OriginId { source: a(), pid };
        v.apply(pid, &StateRecord::Origin(o.key(P), None));
    }
    assert_eq!(v.tombstones_remembered(), MAX_TOMBSTONES);
    // The newest still guards against a raced refresh; the oldest no more.
    let newest = OriginId {
        source: a(),
        pid: n - 1,
    };
    v.apply(n + 1, &claim(newest, compose(1, n - 1), 0, 0, 1));
    assert_eq!(v.lookup(P, newest, 0), None);
    assert!(v.take_stale_refreshes().contains(&newest.key(P)));
}
