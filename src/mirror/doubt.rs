//! Link batches whose outcome is unknown because their answer never came
//! (the broker connection was lost with the request sent), per partition:
//! the pure rule that decides when a log tail may be trusted to say such a
//! batch was never appended (SPEC §6, docs/design.md "Mirrored producer
//! state").
//!
//! A request the broker read before its connection dropped is still
//! handled: Kafka's `Selector.close` keeps a closing channel "until a send
//! fails or all outstanding receives are processed", one request at a time
//! (apache/kafka, clients/src/main/java/org/apache/kafka/common/network/Selector.java).
//! A request still on the network, or in the broker's request queue, is
//! appended later still. So a tail read after the loss that does not hold
//! the batch does not mean "never appended" yet: only a tail read once the
//! lost request's wait is over (its Produce `timeout_ms` from when its loss
//! was seen, capped by `MIRROR_PROXY_UNKNOWN_OUTCOME_WAIT_MS`), with a log
//! end that stayed the same across two reads, does. A tail that holds the
//! batch settles it at once. Until then that producer's batches on that
//! partition are answered retriable; other producers and partitions go on.

use std::hash::Hash;
use std::time::Instant;

use foldhash::{HashMap, HashMapExt};

use crate::mirror::origins::PartitionId;
use crate::mirror::producer_state::BatchId;

/// The doubted batches of one partition.
#[derive(Debug)]
struct PartitionDoubt<K> {
    /// (producer key, batch) of each lost batch.
    batches: Vec<(K, BatchId)>,
    /// Before this, a tail without the batches proves nothing.
    deadline: Instant,
}

/// What [`Doubts::check`] says of a producer's batch on a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// No batch of this producer is in doubt there: go on.
    Clear,
    /// A lost batch of this producer may still be appended, until
    /// `deadline`: answer retriable, append nothing of it.
    Wait { deadline: Instant },
    /// The wait is over, but no tail was read since: read the tail again
    /// (stable) before anything of the producer is begun.
    Confirm,
}

/// What a tail read did to a partition's doubts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Resolved {
    /// Found in the tail: appended after all.
    pub found: usize,
    /// Absent from a stable tail read after the deadline: never appended.
    pub absent: usize,
    /// Still in doubt.
    pub left: usize,
}

/// Every partition's doubted batches.
#[derive(Debug)]
pub(crate) struct Doubts<K> {
    partitions: HashMap<PartitionId, PartitionDoubt<K>>,
}

impl<K: Copy + Eq + Hash> Default for Doubts<K> {
    fn default() -> Self {
        Doubts {
            partitions: HashMap::new(),
        }
    }
}

impl<K: Copy + Eq + Hash> Doubts<K> {
    /// `batch` of producer `key` was sent on `partition` and its answer
    /// will never come; it may be appended until `deadline` (the latest of
    /// the partition's lost requests counts).
    pub(crate) fn lost(
        &mut self,
        partition: PartitionId,
        key: K,
        batch: BatchId,
        deadline: Instant,
    ) {
        let d = self
            .partitions
            .entry(partition)
            .or_insert_with(|| PartitionDoubt {
                batches: Vec::new(),
                deadline,
            });
        d.deadline = d.deadline.max(deadline);
        if !d.batches.contains(&(key, batch)) {
            d.batches.push((key, batch));
        }
    }

    /// Whether anything is in doubt on `partition`.
    pub(crate) fn any(&self, partition: &PartitionId) -> bool {
        self.partitions.contains_key(partition)
    }

    /// Whether producer `key` may begin a batch on `partition` at `now`.
    pub(crate) fn check(&self, partition: &PartitionId, key: &K, now: Instant) -> Verdict {
        let Some(d) = self.partitions.get(partition) else {
            return Verdict::Clear;
        };
        if !d.batches.iter().any(|(k, _)| k == key) {
            return Verdict::Clear;
        }
        if now < d.deadline {
            Verdict::Wait {
                deadline: d.deadline,
            }
        } else {
            Verdict::Confirm
        }
    }

    /// Whether a tail read of `partition` begun at `now` must be a stable
    /// one (its wait is over: what it does not hold is taken as never
    /// appended).
    pub(crate) fn confirming(&self, partition: &PartitionId, now: Instant) -> bool {
        self.partitions
            .get(partition)
            .is_some_and(|d| now >= d.deadline)
    }

    /// A tail of `partition` was read, its log end first read at
    /// `read_at`; `stable`: the log end was the same when read again after
    /// the records. `appended` says whether the state (just rebuilt from
    /// that tail) holds a batch as appended. Found batches are settled;
    /// the others are taken as never appended only if the read began at
    /// or after the deadline and was stable.
    pub(crate) fn after_tail(
        &mut self,
        partition: &PartitionId,
        read_at: Instant,
        stable: bool,
        appended: impl Fn(&K, &BatchId) -> bool,
    ) -> Resolved {
        let mut r = Resolved::default();
        let Some(d) = self.partitions.get_mut(partition) else {
            return r;
        };
        let trusted = stable && read_at >= d.deadline;
        d.batches.retain(|(k, b)| {
            if appended(k, b) {
                r.found += 1;
                false
            } else if trusted {
                r.absent += 1;
                false
            } else {
                true
            }
        });
        r.left = d.batches.len();
        if d.batches.is_empty() {
            self.partitions.remove(partition);
        }
        r
    }

    /// Forget `partition`'s doubts (its producers were expired by a
    /// failover barrier: nothing of them is deduplicated any more).
    pub(crate) fn clear(&mut self, partition: &PartitionId) {
        self.partitions.remove(partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn p(n: i32) -> PartitionId {
        PartitionId {
            topic_id: uuid::Uuid::from_u128(7),
            partition: n,
        }
    }

    fn b(first: i32) -> BatchId {
        BatchId {
            producer_id: -5,
            epoch: 0,
            first_seq: first,
            last_seq: first + 9,
        }
    }

    #[test]
    fn a_lost_batch_holds_its_producer_until_the_deadline_then_asks_for_a_stable_read() {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(5);
        let mut d = Doubts::default();
        d.lost(p(0), 1u8, b(0), deadline);
        assert_eq!(d.check(&p(0), &1, t0), Verdict::Wait { deadline });
        // Other producers and partitions go on.
        assert_eq!(d.check(&p(0), &2, t0), Verdict::Clear);
        assert_eq!(d.check(&p(1), &1, t0), Verdict::Clear);
        // A tail read before the deadline without the batch proves nothing,
        // stable or not.
        let r = d.after_tail(&p(0), t0 + Duration::from_secs(1), true, |_, _| false);
        assert_eq!(
            r,
            Resolved {
                found: 0,
                absent: 0,
                left: 1
            }
        );
        assert!(!d.confirming(&p(0), t0 + Duration::from_secs(1)));
        // Past it: a read is asked for, and one that is not stable proves
        // nothing either.
        let later = t0 + Duration::from_secs(6);
        assert_eq!(d.check(&p(0), &1, later), Verdict::Confirm);
        assert!(d.confirming(&p(0), later));
        let r = d.after_tail(&p(0), later, false, |_, _| false);
        assert_eq!(r.left, 1);
        // A stable read begun after the deadline: never appended.
        let r = d.after_tail(&p(0), later, true, |_, _| false);
        assert_eq!(
            r,
            Resolved {
                found: 0,
                absent: 1,
                left: 0
            }
        );
        assert!(!d.any(&p(0)));
        assert_eq!(d.check(&p(0), &1, later), Verdict::Clear);
    }

    #[test]
    fn a_tail_holding_the_batch_settles_it_at_once() {
        let t0 = Instant::now();
        let mut d = Doubts::default();
        d.lost(p(0), 1u8, b(0), t0 + Duration::from_secs(5));
        d.lost(p(0), 1u8, b(10), t0 + Duration::from_secs(5));
        // One of the two found, before the deadline, in an unstable read.
        let r = d.after_tail(&p(0), t0, false, |_, x| *x == b(0));
        assert_eq!(
            r,
            Resolved {
                found: 1,
                absent: 0,
                left: 1
            }
        );
        assert!(matches!(d.check(&p(0), &1, t0), Verdict::Wait { .. }));
        let r = d.after_tail(&p(0), t0, false, |_, x| *x == b(10));
        assert_eq!(
            r,
            Resolved {
                found: 1,
                absent: 0,
                left: 0
            }
        );
        assert_eq!(d.check(&p(0), &1, t0), Verdict::Clear);
    }

    #[test]
    fn the_latest_lost_request_sets_the_deadline() {
        let t0 = Instant::now();
        let mut d = Doubts::default();
        d.lost(p(0), 1u8, b(0), t0 + Duration::from_secs(5));
        d.lost(p(0), 2u8, b(0), t0 + Duration::from_secs(9));
        d.lost(p(0), 2u8, b(0), t0 + Duration::from_secs(1));
        let at = t0 + Duration::from_secs(6);
        assert_eq!(
            d.check(&p(0), &1, at),
            Verdict::Wait {
                deadline: t0 + Duration::from_secs(9)
            }
        );
        let r = d.after_tail(&p(0), at, true, |_, _| false);
        assert_eq!(
            r.left, 2,
            "the same batch lost twice is held once per producer"
        );
        d.clear(&p(0));
        assert_eq!(d.check(&p(0), &1, at), Verdict::Clear);
    }
}
