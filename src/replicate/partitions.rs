//! The replicator's bookkeeping of every partition it copies: what was
//! fetched and not yet acknowledged by the destination, what may be
//! fetched and sent next, and where the progress stands. Pure: the
//! fetchers, the senders and the committer change it under one lock,
//! never held across an await.
//!
//! The rules that keep the copy exact:
//! - A partition's batches are sent in source order, one at a time
//!   (`IN_FLIGHT_PER_PARTITION`), while many partitions share each
//!   request and several requests are in flight per connection. Neither a
//!   broker (a mapped producer id is negative: no sequence checks) nor the
//!   proxy (it accepts forward sequence gaps, which compacted sources and
//!   mid-stream starts produce) would refuse batch k+1 appended after
//!   batch k failed; one batch in flight per partition makes that
//!   impossible.
//! - The resume point (`acked`) moves past a batch only once the
//!   destination acknowledged it; control batches and aborted batches move
//!   it when everything before them was acknowledged.
//! - A restart sends again everything after the last commit. The proxy
//!   recognises a re-sent batch as a duplicate only among the last
//!   `RETAINED_BATCHES` of its producer, so a partition never has more
//!   than that many batches acknowledged-and-uncommitted plus in flight:
//!   past it, the partition waits for the commit.
//! - Memory: fetched and unacknowledged bytes, plus what fetches in flight
//!   may bring, stay within `max_buffered_bytes`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use uuid::Uuid;

use crate::client::protocol::PartitionRef;
use crate::mirror::translation::{Segment, Segments};

pub(crate) use crate::mirror::producer_state::RETAINED_BATCHES;

/// Batches of one partition in flight to the destination at once (see the
/// module doc).
pub(crate) const IN_FLIGHT_PER_PARTITION: usize = 1;

/// Offset translation segments a partition keeps in memory (the offsets
/// topic keeps them all): 24 bytes each, a transaction's marker begins one.
pub(crate) const MAX_SEGMENTS: usize = 1024;

/// A source partition, named as on both clusters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Tp {
    pub topic: Arc<str>,
    pub partition: i32,
}

impl std::fmt::Display for Tp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// One data batch to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Batch {
    /// The bytes to produce (baseOffset zeroed, everything else as fetched).
    pub bytes: Bytes,
    pub base_offset: i64,
    pub last_offset: i64,
    pub records: u32,
    pub transactional: bool,
    pub producer_id: i64,
}

/// What a fetch yielded for a partition, in offset order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Item {
    Data(Batch),
    /// A control batch (transaction marker) or a batch of an aborted
    /// transaction: not copied, but passed.
    Skip {
        last_offset: i64,
        aborted: bool,
    },
}

impl Item {
    fn last_offset(&self) -> i64 {
        match self {
            Item::Data(b) => b.last_offset,
            Item::Skip { last_offset, .. } => *last_offset,
        }
    }
}

#[derive(Debug, Clone)]
struct Queued {
    batch: Batch,
    /// Where `acked` moves once the batch is acknowledged: past it and
    /// past what was skipped right after it.
    advance_to: i64,
}

/// Where a cluster serves a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Placement {
    /// -1 while unknown.
    pub leader: i32,
    pub leader_epoch: i32,
    pub topic_id: Uuid,
}

impl Placement {
    pub(crate) const UNKNOWN: Placement = Placement {
        leader: -1,
        leader_epoch: -1,
        topic_id: Uuid::nil(),
    };

    /// `tp` as the client names it in a request to the cluster placed so.
    pub(crate) fn partition_ref<'a>(&self, tp: &'a Tp) -> PartitionRef<'a> {
        PartitionRef {
            topic: &tp.topic,
            topic_id: self.topic_id,
            partition: tp.partition,
            leader_epoch: self.leader_epoch,
        }
    }
}

/// What the report says of a partition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PartitionReport {
    pub topic: String,
    pub partition: i32,
    pub batches_copied: u64,
    pub records_copied: u64,
    pub bytes_copied: u64,
    pub control_batches_skipped: u64,
    pub aborted_batches_skipped: u64,
    /// Source offsets of the first and last record copied.
    pub first_offset: Option<i64>,
    pub last_offset: Option<i64>,
    /// Source offset the next run resumes from.
    pub next_offset: i64,
    /// Source high watermark when the partition was taken on.
    pub start_high_watermark: i64,
    /// The committed offset it resumed from, if any.
    pub resumed_from: Option<i64>,
}

/// One partition's state.
#[derive(Debug, Clone)]
pub(crate) struct Partition {
    pub source: Placement,
    pub destination: Placement,
    /// The next source offset to fetch.
    pub fetch_offset: i64,
    /// This partition's share of a Fetch (grown for a batch larger than it).
    pub fetch_max_bytes: i32,
    queue: VecDeque<Queued>,
    queued_bytes: usize,
    /// How many batches at the front of `queue` are in flight.
    in_flight: usize,
    /// The resume point: every source offset below it is on the
    /// destination (or was skipped).
    pub acked: i64,
    /// The resume point the progress group holds (-1: none).
    pub committed: i64,
    acked_batches: u64,
    committed_batches: u64,
    pub high_watermark: i64,
    /// The destination offset after the last batch acknowledged in this
    /// run (-1: none yet): an answer below it was an earlier attempt's.
    dest_next: i64,
    /// When `acked` last reached the high watermark.
    caught_up_at: Instant,
    /// Until-caught-up: done once `acked` reaches it.
    pub target: Option<i64>,
    /// No fetch or send before this (after an error).
    pub paused_until: Option<Instant>,
    pub report: PartitionReport,
    /// Where source and destination offsets stop moving together.
    pub segments: Segments,
    /// The first segment changed since the offsets topic last had them
    /// (its source start).
    unsaved_from: Option<i64>,
}

impl Partition {
    /// A partition taken on at `position` (its first offset to copy).
    pub(crate) fn new(
        tp: &Tp,
        position: i64,
        high_watermark: i64,
        fetch_max_bytes: i32,
        now: Instant,
    ) -> Partition {
        Partition {
            source: Placement::UNKNOWN,
            destination: Placement::UNKNOWN,
            fetch_offset: position,
            fetch_max_bytes,
            queue: VecDeque::new(),
            queued_bytes: 0,
            in_flight: 0,
            acked: position,
            committed: -1,
            acked_batches: 0,
            committed_batches: 0,
            high_watermark,
            dest_next: -1,
            caught_up_at: now,
            target: None,
            paused_until: None,
            segments: Segments::partial(MAX_SEGMENTS),
            unsaved_from: None,
            report: PartitionReport {
                topic: tp.topic.to_string(),
                partition: tp.partition,
                start_high_watermark: high_watermark,
                next_offset: position,
                ..PartitionReport::default()
            },
        }
    }

    fn paused(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|t| now < t)
    }

    /// Acknowledged and not yet committed, plus in flight.
    fn exposed(&self) -> u64 {
        self.acked_batches - self.committed_batches + self.in_flight as u64
    }

    /// May its next batch be sent now?
    fn sendable(&self, now: Instant) -> bool {
        self.in_flight < IN_FLIGHT_PER_PARTITION
            && self.queue.len() > self.in_flight
            && self.exposed() < RETAINED_BATCHES as u64
            && !self.paused(now)
    }

    /// Records the source holds that the destination does not yet.
    pub(crate) fn lag_records(&self) -> i64 {
        (self.high_watermark - self.acked).max(0)
    }

    /// How long the destination has been behind (0 when caught up).
    pub(crate) fn lag(&self, now: Instant) -> Duration {
        if self.lag_records() == 0 {
            Duration::ZERO
        } else {
            now.saturating_duration_since(self.caught_up_at)
        }
    }

    pub(crate) fn done(&self) -> bool {
        self.target.is_some_and(|t| self.acked >= t)
    }

    fn note_acked(&mut self, now: Instant) {
        if self.acked >= self.high_watermark {
            self.caught_up_at = now;
        }
        self.report.next_offset = self.acked;
    }
}

/// One partition's part of a Fetch to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToFetch {
    pub tp: Tp,
    pub placement: Placement,
    pub offset: i64,
    pub max_bytes: i32,
}

/// One batch to put into a Produce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToSend {
    pub tp: Tp,
    pub placement: Placement,
    pub batch: Batch,
}

/// How a sent batch ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// On the destination at this base offset (appended now, or an
    /// earlier attempt's, answered as a duplicate); `None` when the answer
    /// said only that it is there.
    Acked { base_offset: Option<i64> },
    /// Not known to be on the destination: send it again after `retry_in`.
    Retry { retry_in: Duration },
}

/// What [`Table::settle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    Acked {
        duplicate: bool,
    },
    Requeued,
    /// The batch was no longer the partition's oldest in flight.
    Ignored,
}

/// Every partition copied, and the memory they hold.
#[derive(Debug, Default)]
pub(crate) struct Table {
    parts: BTreeMap<Tp, Partition>,
    /// Bytes fetched and not acknowledged.
    buffered: usize,
    /// Bytes fetches in flight may bring.
    reserved: usize,
    max_buffered: usize,
    /// Where each partition's turn starts, per destination node: every
    /// ready partition gets into a request in turn.
    cursors: HashMap<i32, usize>,
    /// Where each source broker's Fetch starts its list of partitions.
    fetch_cursors: HashMap<i32, usize>,
    /// Nothing new is fetched or sent: the partitions are being given
    /// back (a rebalance) once what is in flight is answered.
    halted: bool,
}

/// One Produce being filled by [`Table::next_sends`].
struct Pick {
    node: i32,
    max_bytes: usize,
    now: Instant,
    out: Vec<ToSend>,
    bytes: usize,
    next_start: usize,
    full: bool,
}

impl Pick {
    fn from<'a>(&mut self, parts: impl Iterator<Item = (usize, (&'a Tp, &'a mut Partition))>) {
        for (i, (tp, p)) in parts {
            if self.full {
                return;
            }
            if p.destination.leader != self.node || !p.sendable(self.now) {
                continue;
            }
            let Some(q) = p.queue.get(p.in_flight) else {
                continue;
            };
            if !self.out.is_empty() && self.bytes + q.batch.bytes.len() > self.max_bytes {
                self.next_start = i;
                self.full = true;
                return;
            }
            self.bytes += q.batch.bytes.len();
            self.out.push(ToSend {
                tp: tp.clone(),
                placement: p.destination,
                batch: q.batch.clone(),
            });
            p.in_flight += 1;
            self.next_start = i + 1;
        }
    }
}

/// A Fetch's reservation, returned with its answer ([`Table::fetched`]).
#[derive(Debug)]
#[must_use]
pub(crate) struct Reservation(usize);

impl Table {
    pub(crate) fn new(max_buffered: usize) -> Table {
        Table {
            max_buffered,
            ..Table::default()
        }
    }

    pub(crate) fn insert(&mut self, tp: Tp, partition: Partition) {
        self.parts.insert(tp, partition);
    }

    pub(crate) fn contains(&self, tp: &Tp) -> bool {
        self.parts.contains_key(tp)
    }

    pub(crate) fn get(&self, tp: &Tp) -> Option<&Partition> {
        self.parts.get(tp)
    }

    pub(crate) fn get_mut(&mut self, tp: &Tp) -> Option<&mut Partition> {
        self.parts.get_mut(tp)
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&Tp, &Partition)> {
        self.parts.iter()
    }

    pub(crate) fn len(&self) -> usize {
        self.parts.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    pub(crate) fn buffered(&self) -> usize {
        self.buffered
    }

    /// Partitions of source broker `leader` to fetch now, the bound on
    /// the whole answer (`max_bytes` of the Fetch: what the memory bound
    /// leaves room for, at most `max_request`), and the reservation that
    /// holds that room until the answer is in. Every partition with room
    /// in its own share is asked for, starting one further each time, as
    /// Kafka's fetcher rotates them: the broker fills the answer in the
    /// order asked.
    pub(crate) fn next_fetches(
        &mut self,
        leader: i32,
        max_request: i32,
        now: Instant,
    ) -> (Vec<ToFetch>, i32, Reservation) {
        if self.halted {
            return (Vec::new(), 0, Reservation(0));
        }
        let room = self
            .max_buffered
            .saturating_sub(self.buffered + self.reserved)
            .min(usize::try_from(max_request).unwrap_or(usize::MAX));
        let count = self.parts.len();
        let start = self.fetch_cursors.get(&leader).copied().unwrap_or(0) % count.max(1);
        let mut out = Vec::new();
        let mut smallest_share = usize::MAX;
        let ordered = self
            .parts
            .iter()
            .skip(start)
            .chain(self.parts.iter().take(start));
        for (tp, p) in ordered {
            if p.source.leader != leader || p.paused(now) || p.done() {
                continue;
            }
            // A partition holding a share already waits for the sender:
            // fetching more would only grow the queue.
            let share = usize::try_from(p.fetch_max_bytes).unwrap_or(0);
            if p.queued_bytes >= share {
                continue;
            }
            smallest_share = smallest_share.min(share);
            out.push(ToFetch {
                tp: tp.clone(),
                placement: p.source,
                offset: p.fetch_offset,
                max_bytes: p.fetch_max_bytes,
            });
        }
        // Less room than a share: the senders drain first (a broker
        // answers at least one whole batch, whatever the bound).
        if out.is_empty() || room < smallest_share {
            return (Vec::new(), 0, Reservation(0));
        }
        self.fetch_cursors.insert(leader, start + 1);
        self.reserved += room;
        (
            out,
            i32::try_from(room).unwrap_or(i32::MAX),
            Reservation(room),
        )
    }

    /// A Fetch is answered (or failed): its reservation ends.
    pub(crate) fn fetched(&mut self, reservation: Reservation) {
        self.reserved = self.reserved.saturating_sub(reservation.0);
    }

    /// What a Fetch from `offset` returned for `tp`. Items wholly before
    /// `offset` (the broker answers from the batch holding it) are passed
    /// over; an answer for a position the partition has left (reset,
    /// removed) is dropped. Returns whether anything was taken.
    pub(crate) fn push(
        &mut self,
        tp: &Tp,
        offset: i64,
        items: Vec<Item>,
        high_watermark: i64,
        now: Instant,
    ) -> bool {
        let Some(p) = self.parts.get_mut(tp) else {
            return false;
        };
        if p.fetch_offset != offset {
            return false;
        }
        p.high_watermark = p.high_watermark.max(high_watermark);
        let mut taken = false;
        for item in items {
            let last = item.last_offset();
            if last < p.fetch_offset {
                continue;
            }
            taken = true;
            p.fetch_offset = last + 1;
            match item {
                Item::Data(batch) => {
                    let len = batch.bytes.len();
                    p.queued_bytes += len;
                    self.buffered += len;
                    p.queue.push_back(Queued {
                        batch,
                        advance_to: last + 1,
                    });
                }
                Item::Skip {
                    last_offset,
                    aborted,
                } => {
                    if aborted {
                        p.report.aborted_batches_skipped += 1;
                    } else {
                        p.report.control_batches_skipped += 1;
                    }
                    match p.queue.back_mut() {
                        Some(q) => q.advance_to = last_offset + 1,
                        None => p.acked = last_offset + 1,
                    }
                }
            }
        }
        p.note_acked(now);
        taken
    }

    /// Fetches `tp` from `position` on (an offset reset). What it holds
    /// already is still sent; the resume point jumps only once that is
    /// acknowledged.
    pub(crate) fn reset(&mut self, tp: &Tp, position: i64, now: Instant) {
        if let Some(p) = self.parts.get_mut(tp) {
            p.fetch_offset = position;
            // Resume points only grow: a source truncated below them
            // (an unclean election) is copied from its new end on.
            match p.queue.back_mut() {
                Some(q) => q.advance_to = q.advance_to.max(position),
                None => p.acked = p.acked.max(position),
            }
            p.note_acked(now);
        }
    }

    /// The batches for one Produce to destination node `node`: the next
    /// batch of every sendable partition it leads, up to about
    /// `max_bytes` (at least one), starting where the last request of the
    /// node stopped. They are in flight from now on.
    pub(crate) fn next_sends(&mut self, node: i32, max_bytes: usize, now: Instant) -> Vec<ToSend> {
        let count = self.parts.len();
        if count == 0 || self.halted {
            return Vec::new();
        }
        let start = self.cursors.get(&node).copied().unwrap_or(0) % count;
        let mut pick = Pick {
            node,
            max_bytes,
            now,
            out: Vec::new(),
            bytes: 0,
            next_start: start,
            full: false,
        };
        pick.from(self.parts.iter_mut().enumerate().skip(start));
        pick.from(self.parts.iter_mut().enumerate().take(start));
        self.cursors.insert(node, pick.next_start);
        pick.out
    }

    /// How a batch sent to `tp` ended. A batch that is not the partition's
    /// oldest in flight (the partition was reset meanwhile) is ignored.
    pub(crate) fn settle(
        &mut self,
        tp: &Tp,
        batch: &Batch,
        outcome: Outcome,
        now: Instant,
    ) -> Settled {
        let Some(p) = self.parts.get_mut(tp) else {
            return Settled::Ignored;
        };
        let oldest = p.queue.front().map(|q| q.batch.base_offset);
        if p.in_flight == 0 || oldest != Some(batch.base_offset) {
            return Settled::Ignored;
        }
        match outcome {
            Outcome::Acked { base_offset } => {
                let Some(q) = p.queue.pop_front() else {
                    return Settled::Ignored;
                };
                let duplicate = match base_offset {
                    None => true,
                    Some(base) if base < p.dest_next => true,
                    Some(base) => {
                        p.dest_next = base + (q.batch.last_offset - q.batch.base_offset) + 1;
                        false
                    }
                };
                if let Some(base) = base_offset {
                    let before = p.segments.last().copied();
                    p.segments
                        .record(q.batch.base_offset, q.batch.last_offset, base);
                    if let Some(now) = p.segments.last().filter(|l| Some(**l) != before) {
                        let from = p
                            .unsaved_from
                            .map_or(now.source_start, |f| f.min(now.source_start));
                        p.unsaved_from = Some(from);
                    }
                }
                p.in_flight -= 1;
                p.queued_bytes -= q.batch.bytes.len();
                self.buffered -= q.batch.bytes.len();
                p.acked = q.advance_to;
                p.acked_batches += 1;
                let r = &mut p.report;
                r.batches_copied += 1;
                r.records_copied += u64::from(q.batch.records);
                r.bytes_copied += q.batch.bytes.len() as u64;
                r.first_offset.get_or_insert(q.batch.base_offset);
                r.last_offset = Some(q.batch.last_offset);
                p.note_acked(now);
                Settled::Acked { duplicate }
            }
            Outcome::Retry { retry_in } => {
                // Every batch in flight goes again, in order.
                p.in_flight = 0;
                p.paused_until = Some(now + retry_in);
                Settled::Requeued
            }
        }
    }

    /// Whether a partition waits for a commit to send again.
    pub(crate) fn commit_due(&self) -> bool {
        self.parts
            .values()
            .any(|p| p.acked_batches - p.committed_batches + 1 >= RETAINED_BATCHES as u64)
    }

    /// The resume points to commit, with what they cover.
    pub(crate) fn to_commit(&self) -> Vec<(Tp, i64, u64)> {
        self.parts
            .iter()
            .filter(|(_, p)| p.acked != p.committed)
            .map(|(tp, p)| (tp.clone(), p.acked, p.acked_batches))
            .collect()
    }

    /// Those resume points are committed.
    pub(crate) fn committed(&mut self, done: &[(Tp, i64, u64)]) {
        for (tp, offset, batches) in done {
            if let Some(p) = self.parts.get_mut(tp) {
                p.committed = *offset;
                p.committed_batches = *batches;
            }
        }
    }

    /// Every partition with a target reached it (and there is one).
    pub(crate) fn caught_up(&self) -> bool {
        !self.parts.is_empty() && self.parts.values().all(Partition::done)
    }

    /// Whether anything is in flight to the destination.
    pub(crate) fn in_flight(&self) -> bool {
        self.parts.values().any(|p| p.in_flight > 0)
    }

    /// The segments changed since they were last saved, taken: they are
    /// saved now ([`unsave`](Self::unsave) if that fails).
    pub(crate) fn take_unsaved(&mut self) -> Vec<(Tp, Segment)> {
        let mut out = Vec::new();
        for (tp, p) in &mut self.parts {
            if let Some(from) = p.unsaved_from.take() {
                out.extend(
                    p.segments
                        .iter()
                        .filter(|s| s.source_start >= from)
                        .map(|s| (tp.clone(), *s)),
                );
            }
        }
        out
    }

    /// Those segments were not saved: they are due again.
    pub(crate) fn unsave(&mut self, segments: &[(Tp, Segment)]) {
        for (tp, s) in segments {
            if let Some(p) = self.parts.get_mut(tp) {
                let from = p
                    .unsaved_from
                    .map_or(s.source_start, |f| f.min(s.source_start));
                p.unsaved_from = Some(from);
            }
        }
    }

    /// Fetch and send nothing more (what is in flight still settles):
    /// the partitions are about to be given back.
    pub(crate) fn halt(&mut self) {
        self.halted = true;
    }

    /// Every partition's resume point (for the commit that gives them
    /// back).
    pub(crate) fn resume_points(&self) -> Vec<(Tp, i64, u64)> {
        self.parts
            .iter()
            .map(|(tp, p)| (tp.clone(), p.acked, p.acked_batches))
            .collect()
    }

    /// Gives every partition back: the table is empty, and takes
    /// partitions on again. Answers still on their way find nothing to
    /// settle; Fetches in flight give their reservations back as usual.
    pub(crate) fn clear(&mut self) -> Vec<Tp> {
        let gone: Vec<Tp> = self.parts.keys().cloned().collect();
        self.parts.clear();
        self.buffered = 0;
        self.cursors.clear();
        self.fetch_cursors.clear();
        self.halted = false;
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tp(p: i32) -> Tp {
        Tp {
            topic: Arc::from("t"),
            partition: p,
        }
    }

    fn batch(base: i64, last: i64, len: usize) -> Batch {
        Batch {
            bytes: Bytes::from(vec![0u8; len]),
            base_offset: base,
            last_offset: last,
            records: u32::try_from(last - base + 1).unwrap_or(0),
            transactional: false,
            producer_id: 7,
        }
    }

    fn table(parts: i32, now: Instant) -> Table {
        let mut t = Table::new(1 << 20);
        for p in 0..parts {
            let mut part = Partition::new(&tp(p), 0, 100, 1000, now);
            part.source.leader = 1;
            part.destination.leader = 2;
            t.insert(tp(p), part);
        }
        t
    }

    #[test]
    fn skips_move_the_resume_point_only_past_acknowledged_data() {
        let now = Instant::now();
        let mut t = table(1, now);
        let items = vec![
            Item::Skip {
                last_offset: 1,
                aborted: false,
            },
            Item::Data(batch(2, 4, 10)),
            Item::Skip {
                last_offset: 5,
                aborted: true,
            },
        ];
        assert!(t.push(&tp(0), 0, items, 6, now));
        let p = t.get(&tp(0)).expect("there");
        assert_eq!((p.acked, p.fetch_offset), (2, 6));
        let sent = t.next_sends(2, 1 << 20, now);
        assert_eq!(sent.len(), 1);
        t.settle(
            &tp(0),
            &sent[0].batch,
            Outcome::Acked {
                base_offset: Some(0),
            },
            now,
        );
        let p = t.get(&tp(0)).expect("there");
        assert_eq!(p.acked, 6, "past the aborted batch after it");
        assert_eq!(p.report.control_batches_skipped, 1);
        assert_eq!(p.report.aborted_batches_skipped, 1);
        assert_eq!(t.buffered(), 0);
    }

    #[test]
    fn one_batch_of_a_partition_in_flight_and_retried_in_order() {
        let now = Instant::now();
        let mut t = table(1, now);
        t.push(
            &tp(0),
            0,
            vec![Item::Data(batch(0, 0, 10)), Item::Data(batch(1, 1, 10))],
            2,
            now,
        );
        let first = t.next_sends(2, 1 << 20, now);
        assert_eq!(first.len(), 1);
        assert!(t.next_sends(2, 1 << 20, now).is_empty(), "one in flight");
        t.settle(
            &tp(0),
            &first[0].batch,
            Outcome::Retry {
                retry_in: Duration::from_millis(100),
            },
            now,
        );
        assert!(t.next_sends(2, 1 << 20, now).is_empty(), "paused");
        let later = now + Duration::from_millis(100);
        let again = t.next_sends(2, 1 << 20, later);
        assert_eq!(again[0].batch.base_offset, 0, "the same batch again");
        // A stale answer (not the oldest in flight) changes nothing.
        t.settle(
            &tp(0),
            &batch(1, 1, 10),
            Outcome::Acked {
                base_offset: Some(0),
            },
            later,
        );
        assert_eq!(t.get(&tp(0)).map(|p| p.acked), Some(0));
    }

    #[test]
    fn a_partition_waits_for_the_commit_before_exceeding_what_the_proxy_retains() {
        let now = Instant::now();
        let mut t = table(1, now);
        let items = (0..8).map(|i| Item::Data(batch(i, i, 10))).collect();
        t.push(&tp(0), 0, items, 8, now);
        let mut acked = 0;
        while let Some(s) = t.next_sends(2, 1 << 20, now).pop() {
            t.settle(
                &tp(0),
                &s.batch,
                Outcome::Acked {
                    base_offset: Some(0),
                },
                now,
            );
            acked += 1;
        }
        assert_eq!(acked, RETAINED_BATCHES, "then it waits");
        assert!(t.commit_due());
        let commit = t.to_commit();
        assert_eq!(
            commit,
            [(tp(0), RETAINED_BATCHES as i64, RETAINED_BATCHES as u64)]
        );
        t.committed(&commit);
        assert!(!t.commit_due());
        assert_eq!(t.next_sends(2, 1 << 20, now).len(), 1);
    }

    #[test]
    fn requests_take_partitions_in_turn_within_the_size_bound() {
        let now = Instant::now();
        let mut t = table(3, now);
        for p in 0..3 {
            t.push(&tp(p), 0, vec![Item::Data(batch(0, 0, 600))], 1, now);
        }
        let a = t.next_sends(2, 1000, now);
        assert_eq!(a.len(), 1, "a second batch would pass the bound");
        let b = t.next_sends(2, 1000, now);
        assert_eq!(b[0].tp, tp(1), "the next request starts after it");
        assert!(
            t.next_sends(3, 1000, now).is_empty(),
            "another node leads none"
        );
    }

    #[test]
    fn fetches_stay_within_the_memory_bound_and_take_every_partition_in_turn() {
        let now = Instant::now();
        let mut t = table(3, now);
        t.max_buffered = 2500;
        let (parts, max_bytes, r1) = t.next_fetches(1, 1 << 20, now);
        assert_eq!(parts.len(), 3, "every partition is asked for");
        assert_eq!(max_bytes, 2500, "the answer is bounded by the room left");
        let (more, _, r2) = t.next_fetches(1, 1 << 20, now);
        assert!(more.is_empty(), "the reservation holds the room");
        t.fetched(r1);
        t.fetched(r2);
        let (parts, max_bytes, r3) = t.next_fetches(1, 1000, now);
        assert_eq!(max_bytes, 1000, "at most the request's bound");
        assert_eq!(parts[0].tp, tp(1), "the next Fetch starts one further");
        t.fetched(r3);
        t.push(&tp(0), 0, vec![Item::Data(batch(0, 0, 1000))], 1, now);
        let (parts, max_bytes, r4) = t.next_fetches(1, 1 << 20, now);
        let fetched: Vec<i32> = parts.iter().map(|p| p.tp.partition).collect();
        assert_eq!(fetched, [2, 1], "partition 0 holds a full share");
        assert_eq!(max_bytes, 1500);
        t.fetched(r4);
        t.max_buffered = 1500;
        assert!(
            t.next_fetches(1, 1 << 20, now).0.is_empty(),
            "less room than a share: the senders drain first"
        );
        // An answer for a position left behind is dropped.
        assert!(!t.push(&tp(1), 5, vec![Item::Data(batch(5, 5, 10))], 6, now));
    }

    #[test]
    fn an_answer_below_what_was_acknowledged_is_a_duplicate() {
        let now = Instant::now();
        let mut t = table(1, now);
        t.push(
            &tp(0),
            0,
            vec![Item::Data(batch(0, 2, 10)), Item::Data(batch(3, 3, 10))],
            4,
            now,
        );
        let s = t.next_sends(2, 1 << 20, now);
        let first = t.settle(
            &tp(0),
            &s[0].batch,
            Outcome::Acked {
                base_offset: Some(40),
            },
            now,
        );
        assert_eq!(first, Settled::Acked { duplicate: false });
        let s = t.next_sends(2, 1 << 20, now);
        // Answered with an offset inside the first batch's (40..=42).
        let again = t.settle(
            &tp(0),
            &s[0].batch,
            Outcome::Acked {
                base_offset: Some(41),
            },
            now,
        );
        assert_eq!(again, Settled::Acked { duplicate: true });
        assert_eq!(t.get(&tp(0)).map(|p| p.acked), Some(4));
    }

    #[test]
    fn a_halted_table_sends_nothing_new_and_gives_everything_back_once_settled() {
        let now = Instant::now();
        let mut t = table(2, now);
        t.push(
            &tp(0),
            0,
            vec![Item::Data(batch(0, 2, 10)), Item::Data(batch(3, 3, 10))],
            4,
            now,
        );
        let sent = t.next_sends(2, 10, now);
        assert_eq!(sent.len(), 1, "one batch in flight");
        t.halt();
        assert!(t.next_sends(2, 1 << 20, now).is_empty(), "nothing new sent");
        assert!(
            t.next_fetches(1, 1 << 20, now).0.is_empty(),
            "nothing fetched"
        );
        assert!(t.in_flight());
        // What was in flight still settles, and moves the resume point.
        let settled = t.settle(
            &tp(0),
            &sent[0].batch,
            Outcome::Acked {
                base_offset: Some(0),
            },
            now,
        );
        assert_eq!(settled, Settled::Acked { duplicate: false });
        assert!(!t.in_flight());
        let points: Vec<(i32, i64)> = t
            .resume_points()
            .iter()
            .map(|(tp, offset, _)| (tp.partition, *offset))
            .collect();
        assert_eq!(points, [(0, 3), (1, 0)]);
        let gone: Vec<i32> = t.clear().iter().map(|tp| tp.partition).collect();
        assert_eq!(gone, [0, 1]);
        assert!(t.is_empty());
        assert_eq!(t.buffered(), 0);
        // Taken on again, the table works as new.
        let mut again = Partition::new(&tp(0), 3, 4, 1000, now);
        again.source.leader = 1;
        t.insert(tp(0), again);
        assert_eq!(t.next_fetches(1, 1 << 20, now).0.len(), 1);
    }
}
