//! Mirrored producer state at the proxy (SPEC §6): per destination partition
//! and mapped producer id, what a broker would keep in its
//! `ProducerStateEntry` for an idempotent producer, which a stock broker does
//! not keep for negative (mapped) PIDs.
//!
//! For each producer: its last epoch and the last `RETAINED_BATCHES`
//! appended batches (first and last sequence, the base offset the broker
//! assigned, the append time), plus the batches currently in flight to the
//! broker. From it, [`ProducerStates::check`] decides what to do with an
//! incoming batch:
//!
//! - [`Check::Duplicate`]: same epoch and the same first and last sequence as
//!   one of the retained batches (Kafka's `ProducerStateEntry.findDuplicateBatch`);
//!   answer with the original base offset, do not forward;
//! - [`Check::InFlight`]: the same batch is in flight; wait for that outcome;
//! - [`Check::Refuse`]: an epoch lower than the producer's
//!   (`INVALID_PRODUCER_EPOCH`), or a sequence that is not after the last one
//!   of the same epoch without being an exact duplicate
//!   (`OUT_OF_ORDER_SEQUENCE_NUMBER`);
//! - [`Check::Append`]: anything else. Unlike a broker, forward *gaps* are
//!   accepted (a compacted or truncated source, a replicator starting
//!   mid-stream), and a new epoch may start at any sequence.
//!
//! Sequences are int32 values from 0 to `i32::MAX` that wrap to 0 (Kafka's
//! `DefaultRecordBatch.incrementSequence`). With gaps allowed, "after" is
//! serial-number arithmetic in that 2^31 space: `first` is after `last` when
//! `(first - last - 1) mod 2^31 < 2^30`. So a gap of up to 2^30 - 1 sequences
//! is a gap, anything further ahead counts as going backwards.
//!
//! The state is updated only from what the broker really appended
//! ([`ProducerStates::appended`]), or rebuilt from a partition's log tail
//! (`ProducerStates::replay`). The number of producers kept is bounded; the
//! least recently used producer *with no batch in flight* is evicted first,
//! and evictions are counted. A producer with a batch in flight is never
//! evicted: forgotten, the retry of that batch would be appended again. When
//! the bound is reached and every producer held has a batch in flight, a
//! new producer's batch is refused, retriable ([`RefusalKind::StateFull`]),
//! and counted (`ProducerStates::full_refusals`): fail closed, never forget.
//!
//! Pure: no I/O, no clock (callers pass times), no async. Checking a batch of
//! a known producer does not allocate (the retained and in-flight batches are
//! fixed arrays); only a refusal builds its message.

use lru::LruCache;
use std::hash::Hash;

use crate::wire::batch::{BatchHeader, Batches};

/// Batches kept per producer, as Kafka does (`NUM_BATCHES_TO_RETAIN`).
pub(crate) const RETAINED_BATCHES: usize = 5;
/// Batches of one producer in one partition that may be in flight at once:
/// Kafka's idempotent producers send at most 5
/// (`max.in.flight.requests.per.connection`).
pub(crate) const MAX_IN_FLIGHT: usize = 5;

/// A producer has [`MAX_IN_FLIGHT`] batches in flight already: one more is
/// out of order (the refusal's message to the client is this text).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("producer {producer_id} has {MAX_IN_FLIGHT} batches in flight already")]
struct InFlightFull {
    producer_id: i64,
}
/// Kafka's "no epoch" / "no sequence".
pub(crate) const NO_EPOCH: i16 = -1;
pub(crate) const NO_SEQUENCE: i32 = -1;

/// Kafka error codes of the refusals.
#[cfg(test)]
pub(crate) const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
#[cfg(test)]
pub(crate) const INVALID_PRODUCER_EPOCH: i16 = 47;
/// Retriable for every Kafka client: the answer when the state is full of
/// producers with batches in flight.
#[cfg(test)]
pub(crate) const NOT_ENOUGH_REPLICAS: i16 = 19;

/// Half of the 2^31 sequence space: how far ahead still counts as "after".
const HALF_SEQUENCE_SPACE: i64 = 1 << 30;
const SEQUENCE_SPACE: i64 = 1 << 31;

/// The identity of one batch as far as deduplication goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BatchId {
    /// The mapped (destination) producer id.
    pub producer_id: i64,
    pub epoch: i16,
    pub first_seq: i32,
    pub last_seq: i32,
}

impl BatchId {
    /// From a batch header; the last sequence wraps like Kafka's.
    pub(crate) fn from_header(h: &BatchHeader<'_>) -> BatchId {
        BatchId {
            producer_id: h.producer_id(),
            epoch: h.producer_epoch(),
            first_seq: h.base_sequence(),
            last_seq: last_sequence(h.base_sequence(), h.last_offset_delta()),
        }
    }
}

/// `base_seq + last_offset_delta`, wrapping past `i32::MAX` to 0 like
/// Kafka's `DefaultRecordBatch.incrementSequence`. `NO_SEQUENCE` stays.
pub(crate) fn last_sequence(base_seq: i32, last_offset_delta: i32) -> i32 {
    if base_seq == NO_SEQUENCE {
        return NO_SEQUENCE;
    }
    let delta = last_offset_delta.max(0);
    if base_seq > i32::MAX - delta {
        delta - (i32::MAX - base_seq) - 1
    } else {
        base_seq + delta
    }
}

/// Whether `next` comes after `last` in the wrapping sequence space, gaps
/// allowed (see the module doc).
pub(crate) fn is_after(last: i32, next: i32) -> bool {
    let d = (i64::from(next) - i64::from(last) - 1).rem_euclid(SEQUENCE_SPACE);
    d < HALF_SEQUENCE_SPACE
}

/// Why a batch is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalKind {
    InvalidProducerEpoch,
    OutOfOrderSequence,
    /// The bound on producers held is reached and every producer held has a
    /// batch in flight: none may be evicted. Retriable: batches settle.
    StateFull,
}

impl RefusalKind {
    /// The Kafka error code to answer with.
    #[cfg(test)]
    pub(crate) fn error_code(self) -> i16 {
        match self {
            RefusalKind::InvalidProducerEpoch => INVALID_PRODUCER_EPOCH,
            RefusalKind::OutOfOrderSequence => OUT_OF_ORDER_SEQUENCE_NUMBER,
            RefusalKind::StateFull => NOT_ENOUGH_REPLICAS,
        }
    }
}

/// What to do with an incoming batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// Forward it.
    Append,
    /// Already appended at `base_offset`: answer that, do not forward.
    Duplicate { base_offset: i64 },
    /// The same batch is in flight: wait for that attempt's outcome.
    InFlight,
    /// Refuse it with `kind.error_code()` and `message`.
    Refuse { kind: RefusalKind, message: String },
}

/// One appended batch, as Kafka's `BatchMetadata`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AppendedBatch {
    pub first_seq: i32,
    pub last_seq: i32,
    /// Base offset the broker assigned.
    pub base_offset: i64,
    /// When it was appended (ms; the broker's log append time, or the
    /// batch's max timestamp when rebuilt from the log).
    pub append_time_ms: i64,
}

const EMPTY_BATCH: AppendedBatch = AppendedBatch {
    first_seq: NO_SEQUENCE,
    last_seq: NO_SEQUENCE,
    base_offset: -1,
    append_time_ms: -1,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InFlightBatch {
    epoch: i16,
    first_seq: i32,
    last_seq: i32,
}

/// What the proxy knows of one mapped producer in one partition, like
/// Kafka's `ProducerStateEntry`.
#[derive(Debug, Clone)]
pub(crate) struct ProducerStateEntry {
    /// Epoch of the appended batches; `NO_EPOCH` before the first append.
    epoch: i16,
    /// Oldest first; `batches[..len]` are valid.
    batches: [AppendedBatch; RETAINED_BATCHES],
    len: usize,
    in_flight: [Option<InFlightBatch>; MAX_IN_FLIGHT],
}

impl ProducerStateEntry {
    fn new() -> ProducerStateEntry {
        ProducerStateEntry {
            epoch: NO_EPOCH,
            batches: [EMPTY_BATCH; RETAINED_BATCHES],
            len: 0,
            in_flight: [None; MAX_IN_FLIGHT],
        }
    }

    /// The epoch of the appended batches (`NO_EPOCH` if none yet).
    #[cfg(test)]
    pub(crate) fn epoch(&self) -> i16 {
        self.epoch
    }

    /// The retained appended batches, oldest first.
    pub(crate) fn batches(&self) -> &[AppendedBatch] {
        &self.batches[..self.len]
    }

    /// Batches in flight.
    pub(crate) fn in_flight_count(&self) -> usize {
        self.in_flight.iter().flatten().count()
    }

    fn is_empty(&self) -> bool {
        self.len == 0 && self.in_flight.iter().all(Option::is_none)
    }

    fn find_duplicate(&self, b: &BatchId) -> Option<&AppendedBatch> {
        if b.epoch != self.epoch {
            return None;
        }
        self.batches()
            .iter()
            .find(|m| m.first_seq == b.first_seq && m.last_seq == b.last_seq)
    }

    /// Marks `b` in flight (see [`ProducerStates::mark_in_flight`]).
    fn mark_in_flight(&mut self, b: &BatchId) -> Result<(), InFlightFull> {
        if self.in_flight_slot(b).is_some() {
            return Ok(());
        }
        let Some(slot) = self.in_flight.iter_mut().find(|s| s.is_none()) else {
            return Err(InFlightFull {
                producer_id: b.producer_id,
            });
        };
        *slot = Some(InFlightBatch {
            epoch: b.epoch,
            first_seq: b.first_seq,
            last_seq: b.last_seq,
        });
        Ok(())
    }

    fn in_flight_slot(&self, b: &BatchId) -> Option<usize> {
        self.in_flight.iter().position(|f| {
            f.is_some_and(|f| {
                f.epoch == b.epoch && f.first_seq == b.first_seq && f.last_seq == b.last_seq
            })
        })
    }

    /// The highest epoch appended or in flight.
    fn current_epoch(&self) -> i16 {
        self.in_flight
            .iter()
            .flatten()
            .map(|f| f.epoch)
            .fold(self.epoch, i16::max)
    }

    /// The last sequence of `epoch`, appended or in flight, if any.
    fn last_seq_of(&self, epoch: i16) -> Option<i32> {
        let mut last = (epoch == self.epoch)
            .then(|| self.batches().last().map(|m| m.last_seq))
            .flatten();
        for f in self.in_flight.iter().flatten().filter(|f| f.epoch == epoch) {
            last = Some(match last {
                Some(l) if !is_after(l, f.first_seq) => l,
                _ => f.last_seq,
            });
        }
        last
    }

    fn check(&self, b: &BatchId) -> Check {
        if let Some(m) = self.find_duplicate(b) {
            return Check::Duplicate {
                base_offset: m.base_offset,
            };
        }
        if self.in_flight_slot(b).is_some() {
            return Check::InFlight;
        }
        let current = self.current_epoch();
        if b.epoch < current {
            return Check::Refuse {
                kind: RefusalKind::InvalidProducerEpoch,
                message: format!(
                    "producer {} epoch {} is older than its current epoch {current}",
                    b.producer_id, b.epoch
                ),
            };
        }
        if b.epoch > current {
            return Check::Append;
        }
        match self.last_seq_of(b.epoch) {
            Some(last) if !is_after(last, b.first_seq) => Check::Refuse {
                kind: RefusalKind::OutOfOrderSequence,
                message: format!(
                    "producer {} epoch {}: sequences {}..={} overlap earlier batches \
                     (last sequence {last}) without being one of the last {RETAINED_BATCHES} appended",
                    b.producer_id, b.epoch, b.first_seq, b.last_seq
                ),
            },
            _ => Check::Append,
        }
    }

    fn record(&mut self, b: &BatchId, base_offset: i64, append_time_ms: i64) {
        if b.epoch < self.epoch {
            return;
        }
        if b.epoch > self.epoch {
            self.epoch = b.epoch;
            self.len = 0;
        }
        if self.find_duplicate(b).is_some() {
            return;
        }
        // Kept in log order (by base offset), whatever order they are
        // recorded in: a rebuild replays older batches after a live
        // response may have recorded newer ones, and merges, never
        // reorders or overwrites. The oldest falls out past five.
        let at = self.batches[..self.len]
            .iter()
            .position(|m| m.base_offset > base_offset)
            .unwrap_or(self.len);
        let new = AppendedBatch {
            first_seq: b.first_seq,
            last_seq: b.last_seq,
            base_offset,
            append_time_ms,
        };
        if self.len == RETAINED_BATCHES {
            if at == 0 {
                // Older than every retained batch: not one of the last five.
                return;
            }
            self.batches.copy_within(1..at, 0);
            self.batches[at - 1] = new;
        } else {
            self.batches.copy_within(at..self.len, at + 1);
            self.batches[at] = new;
            self.len += 1;
        }
    }

    fn clear_in_flight(&mut self, b: &BatchId) -> bool {
        match self.in_flight_slot(b) {
            Some(i) => {
                self.in_flight[i] = None;
                true
            }
            None => false,
        }
    }
}

/// What [`ProducerStates::replay_records`] walked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Replayed {
    /// Whole batches read.
    pub batches: usize,
    /// Of those, batches of mapped producers taken into the state.
    pub taken: usize,
    /// The offset after the last whole batch.
    pub next_offset: Option<i64>,
    /// The records ended in a partial or malformed batch.
    pub truncated: bool,
    /// Batches of mapped producers that could not be taken: the bound was
    /// reached and every producer held had a batch in flight. The state
    /// then misses part of the log and must not be trusted.
    pub untaken: usize,
}

/// Producer state of every mirrored partition, bounded in entries.
///
/// `P` names a destination partition: a small `Copy` key (e.g. topic id and
/// partition index), so that a lookup builds its key without allocating.
/// One map over (partition, producer id), kept in order of use (the `lru`
/// crate's map and list): one hash lookup per access, and eviction at the
/// bound takes the least recently used producer with nothing in flight,
/// skipping at most the producers that have batches in flight (found at
/// once when that is all of them).
pub struct ProducerStates<P> {
    /// Hashed with foldhash: looked up for every mirrored batch, where
    /// SipHash showed in profiles.
    entries: LruCache<(P, i64), ProducerStateEntry, foldhash::fast::RandomState>,
    max_entries: usize,
    evictions: u64,
    /// Producers held with at least one batch in flight (never evicted).
    busy: usize,
    /// New producers refused because every producer held was busy.
    full_refusals: u64,
}

impl<P: Hash + Eq + Copy + std::fmt::Debug> std::fmt::Debug for ProducerStates<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerStates")
            .field("len", &self.entries.len())
            .field("max_entries", &self.max_entries)
            .field("evictions", &self.evictions)
            .field("busy", &self.busy)
            .field("full_refusals", &self.full_refusals)
            .finish()
    }
}

impl<P: Hash + Eq + Copy> ProducerStates<P> {
    /// At most `max_entries` producers (at least 1) over all partitions.
    /// Nothing is reserved up front: memory follows the producers held.
    pub fn new(max_entries: usize) -> ProducerStates<P> {
        ProducerStates {
            entries: LruCache::unbounded_with_hasher(foldhash::fast::RandomState::default()),
            max_entries: max_entries.max(1),
            evictions: 0,
            busy: 0,
            full_refusals: 0,
        }
    }

    /// The partition key of every producer held (a scan: for the admin
    /// API, not the hot path).
    pub(crate) fn partition_keys(&self) -> impl Iterator<Item = &P> + '_ {
        self.entries.iter().map(|(k, _)| &k.0)
    }

    /// Producers held.
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Producers evicted to stay within the bound, since creation.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// New producers refused (or replayed batches not taken) since
    /// creation because the bound was reached with every producer held
    /// having a batch in flight.
    pub(crate) fn full_refusals(&self) -> u64 {
        self.full_refusals
    }

    /// Producers held with at least one batch in flight.
    #[cfg(test)]
    pub(crate) fn busy(&self) -> usize {
        self.busy
    }

    /// The state of one producer, if held (does not count as a use).
    pub(crate) fn entry(&self, partition: &P, producer_id: i64) -> Option<&ProducerStateEntry> {
        self.entries.peek(&(*partition, producer_id))
    }

    /// Whether `batch` is one of the producer's retained appended batches
    /// (does not count as a use).
    pub(crate) fn holds_appended(&self, partition: &P, batch: &BatchId) -> bool {
        self.entry(partition, batch.producer_id)
            .is_some_and(|e| e.find_duplicate(batch).is_some())
    }

    fn touch(&mut self, partition: &P, producer_id: i64) -> Option<&mut ProducerStateEntry> {
        self.entries.get_mut(&(*partition, producer_id))
    }

    /// The entry, created if new (evicting the least recently used
    /// producer with nothing in flight when full). `None` when it is new,
    /// the bound is reached and every producer held has a batch in flight
    /// (counted in [`full_refusals`](Self::full_refusals)).
    fn entry_mut(&mut self, partition: &P, producer_id: i64) -> Option<&mut ProducerStateEntry> {
        let key = (*partition, producer_id);
        if !self.entries.contains(&key)
            && self.entries.len() >= self.max_entries
            && !self.evict_idle()
        {
            self.full_refusals += 1;
            return None;
        }
        Some(self.entries.get_or_insert_mut(key, ProducerStateEntry::new))
    }

    /// Evicts the least recently used producer that has no batch in flight.
    /// False if every producer held has one (then nothing is scanned).
    fn evict_idle(&mut self) -> bool {
        if self.busy >= self.entries.len() {
            return false;
        }
        // From the least recently used; a busy producer is skipped, never
        // evicted: its retry must still find its batch in flight.
        let victim = self
            .entries
            .iter()
            .rev()
            .find(|(_, e)| e.in_flight_count() == 0)
            .map(|(k, _)| *k);
        match victim {
            Some(k) => {
                self.entries.pop(&k);
                self.evictions += 1;
                true
            }
            None => false,
        }
    }

    fn remove(&mut self, partition: &P, producer_id: i64) {
        if let Some(e) = self.entries.pop(&(*partition, producer_id)) {
            if e.in_flight_count() > 0 {
                self.busy -= 1;
            }
        }
    }

    /// What to do with `batch` (see [`Check`]). Counts as a use of the
    /// producer; changes nothing else. A batch without a sequence
    /// (`NO_SEQUENCE`: not idempotent) is not tracked and always appends.
    pub fn check(&mut self, partition: &P, batch: &BatchId) -> Check {
        if batch.first_seq < 0 {
            return Check::Append;
        }
        match self.touch(partition, batch.producer_id) {
            Some(e) => e.check(batch),
            None => Check::Append,
        }
    }

    /// [`check`](Self::check), and on `Append` mark the batch in flight.
    /// More than `MAX_IN_FLIGHT` batches of one producer in flight is
    /// refused as out of order.
    ///
    /// A producer already held is found once for both (this runs for every
    /// mirrored batch).
    pub fn begin(&mut self, partition: &P, batch: &BatchId) -> Check {
        if batch.first_seq < 0 {
            return Check::Append;
        }
        let verdict = match self.touch(partition, batch.producer_id) {
            Some(e) => {
                let verdict = e.check(batch);
                if verdict != Check::Append {
                    return verdict;
                }
                // Held with a free slot, or full of batches in flight: not
                // empty either way, so never removed here.
                let was_idle = e.in_flight_count() == 0;
                let marked = e.mark_in_flight(batch);
                if was_idle && marked.is_ok() {
                    self.busy += 1;
                }
                marked.map_err(|m| (RefusalKind::OutOfOrderSequence, m.to_string()))
            }
            None => self.mark_in_flight(partition, batch),
        };
        match verdict {
            Ok(()) => Check::Append,
            Err((kind, message)) => Check::Refuse { kind, message },
        }
    }

    /// Marks `batch` in flight, so that a retry of it waits
    /// ([`Check::InFlight`]). Err when the producer has
    /// [`MAX_IN_FLIGHT`] batches in flight already (out of order), or is new
    /// while the bound is reached and every producer held has a batch in
    /// flight ([`RefusalKind::StateFull`]).
    pub(crate) fn mark_in_flight(
        &mut self,
        partition: &P,
        batch: &BatchId,
    ) -> Result<(), (RefusalKind, String)> {
        if batch.first_seq < 0 {
            return Ok(());
        }
        let max = self.max_entries;
        let Some(e) = self.entry_mut(partition, batch.producer_id) else {
            return Err((
                RefusalKind::StateFull,
                format!(
                    "producer {}: the mirrored producer state holds {max} producers \
                     (PRODUCER_STATE_MAX_ENTRIES), each with a batch in flight; retry",
                    batch.producer_id
                ),
            ));
        };
        let was_idle = e.in_flight_count() == 0;
        let marked = e.mark_in_flight(batch);
        let empty = e.is_empty();
        match &marked {
            Ok(()) if was_idle => self.busy += 1,
            Ok(()) => {}
            Err(_) if empty => self.remove(partition, batch.producer_id),
            Err(_) => {}
        }
        marked.map_err(|m| (RefusalKind::OutOfOrderSequence, m.to_string()))
    }

    /// The broker appended `batch` at `base_offset`: remember it (as one of
    /// the last five) and end its flight. An epoch higher than the
    /// producer's resets its batches; a lower one, and a batch without a
    /// sequence, are ignored.
    pub fn appended(
        &mut self,
        partition: &P,
        batch: &BatchId,
        base_offset: i64,
        append_time_ms: i64,
    ) {
        if batch.first_seq < 0 {
            return;
        }
        // Held (it was in flight, and busy producers are not evicted) unless
        // its partition was cleared meanwhile; then it may find no room.
        let Some(e) = self.entry_mut(partition, batch.producer_id) else {
            return;
        };
        let settled = e.clear_in_flight(batch) && e.in_flight_count() == 0;
        e.record(batch, base_offset, append_time_ms);
        if settled {
            self.busy -= 1;
        }
    }

    /// The attempt to append `batch` failed (or its outcome is unknown):
    /// end its flight, so that a retry is checked afresh.
    pub fn failed(&mut self, partition: &P, batch: &BatchId) {
        let Some(e) = self.entries.peek_mut(&(*partition, batch.producer_id)) else {
            return;
        };
        let settled = e.clear_in_flight(batch) && e.in_flight_count() == 0;
        let empty = e.is_empty();
        if settled {
            self.busy -= 1;
        }
        if empty {
            self.remove(partition, batch.producer_id);
        }
    }

    /// Rebuilding from a partition's log: feed its batches in log order.
    /// Only data batches of mapped producers count (negative PIDs other
    /// than -1, with a sequence); others are ignored. Returns whether the
    /// batch was taken.
    #[cfg(test)]
    pub(crate) fn replay(&mut self, partition: &P, header: &BatchHeader<'_>) -> bool {
        self.replay_keyed(header, |_| Some(*partition)) == Replay::Taken
    }

    /// [`replay`](Self::replay) with the key chosen per batch from its
    /// (mapped) producer id; `None` skips the batch.
    fn replay_keyed(&mut self, header: &BatchHeader<'_>, key: impl Fn(i64) -> Option<P>) -> Replay {
        let id = BatchId::from_header(header);
        if id.producer_id >= -1 || header.is_control() || id.first_seq < 0 {
            return Replay::Skipped;
        }
        let Some(partition) = key(id.producer_id) else {
            return Replay::Skipped;
        };
        let Some(e) = self.entry_mut(&partition, id.producer_id) else {
            return Replay::NoRoom;
        };
        e.record(&id, header.base_offset(), header.max_timestamp());
        Replay::Taken
    }

    /// Rebuilding from a Fetch of a partition's tail: every whole batch of
    /// `records` (as the broker returned them, baseOffsets set) replayed in
    /// order. A trailing partial batch (the Fetch size bound cuts one) or a
    /// malformed one ends the walk.
    #[cfg(test)]
    pub(crate) fn replay_records(&mut self, partition: &P, records: &[u8]) -> Replayed {
        self.replay_records_keyed(records, |_| Some(*partition))
    }

    /// [`replay_records`](Self::replay_records) with the key chosen per
    /// batch from its (mapped) producer id; `None` skips the batch.
    pub(crate) fn replay_records_keyed(
        &mut self,
        records: &[u8],
        key: impl Fn(i64) -> Option<P>,
    ) -> Replayed {
        let mut out = Replayed::default();
        for batch in Batches::new(records) {
            let Ok(b) = batch else {
                out.truncated = true;
                break;
            };
            let Ok(header) = BatchHeader::parse(&records[b.range()]) else {
                out.truncated = true;
                break;
            };
            out.batches += 1;
            match self.replay_keyed(&header, &key) {
                Replay::Taken => out.taken += 1,
                Replay::NoRoom => out.untaken += 1,
                Replay::Skipped => {}
            }
            out.next_offset =
                Some(header.base_offset() + i64::from(header.last_offset_delta()) + 1);
        }
        out
    }

    /// Forgets every producer of a partition (e.g. at the failover
    /// barrier, or when its leader moved and the state is rebuilt).
    /// Returns how many were dropped. (A scan over every producer: this
    /// happens once per partition at a failover or a leader change.)
    #[cfg(test)]
    pub(crate) fn clear_partition(&mut self, partition: &P) -> usize {
        self.clear_where(|p| p == partition)
    }

    /// Forgets what was appended by every producer whose partition key
    /// matches `which` (its epoch and retained batches), keeping only the
    /// batches in flight: a rebuild from the log then *replaces* what was
    /// held instead of merging into it, so a batch the log lost in a
    /// truncation is no longer answered as a duplicate. A producer left with
    /// nothing is dropped. Returns how many producers had batches forgotten.
    pub(crate) fn forget_appended_where(&mut self, mut which: impl FnMut(&P) -> bool) -> usize {
        let mut forgot = 0;
        let mut gone: Vec<(P, i64)> = Vec::new();
        for (k, e) in self.entries.iter_mut() {
            if !which(&k.0) {
                continue;
            }
            if e.len > 0 || e.epoch != NO_EPOCH {
                forgot += 1;
            }
            e.epoch = NO_EPOCH;
            e.len = 0;
            if e.is_empty() {
                gone.push(*k);
            }
        }
        for (p, pid) in &gone {
            self.remove(p, *pid);
        }
        forgot
    }

    /// Forgets every producer whose partition key matches `which` (for a
    /// partition key that is a partition plus more, like an origin).
    /// Returns how many were dropped.
    pub(crate) fn clear_where(&mut self, mut which: impl FnMut(&P) -> bool) -> usize {
        let gone: Vec<(P, i64)> = self
            .entries
            .iter()
            .filter(|((p, _), _)| which(p))
            .map(|(k, _)| *k)
            .collect();
        for (p, pid) in &gone {
            self.remove(p, *pid);
        }
        gone.len()
    }
}

/// What became of one replayed batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replay {
    Taken,
    /// Not a mapped producer's data batch, or of no known origin.
    Skipped,
    /// The bound is reached and every producer held has a batch in flight.
    NoRoom,
}

#[cfg(test)]
mod tests;
