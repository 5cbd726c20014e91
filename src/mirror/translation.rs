//! Offset translation (SPEC §12, issue 43): where a partition's source and
//! destination offsets stop moving together, and what a committed source
//! offset is on the destination. Pure.
//!
//! The replicator copies batches byte for byte, so within a run of batches
//! appended one after another the destination offset of a source record
//! is the source offset plus a constant, gaps inside compacted batches
//! included (a copied batch keeps its offset deltas). The constant changes
//! where the source holds something the destination does not (a
//! transaction marker, an aborted transaction's batch, a compaction gap
//! between batches), where the destination holds something the source does
//! not (a barrier, a marker the proxy wrote), and where a replicator
//! restarts. A [`Segment`] is one such run; the map keeps one per run, not
//! one per batch.
//!
//! A committed offset names the *next* record to read, so a source offset
//! in a gap (a marker, an aborted batch) translates to the destination
//! offset of the next record copied after it: a consumer moved there
//! skips nothing and reads nothing twice.

use std::collections::VecDeque;

/// A run of copied source offsets `source_start..source_end` whose
/// destination offsets start at `destination_start` and move with them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub source_start: i64,
    pub source_end: i64,
    pub destination_start: i64,
}

impl Segment {
    /// The destination offset after the segment's last record.
    pub fn destination_end(&self) -> i64 {
        self.destination_start + (self.source_end - self.source_start)
    }
}

/// What a source offset is on the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Translation {
    /// The destination offset of the same next record.
    Exact(i64),
    /// Not copied yet: the destination has no place for it so far.
    NotYet,
    /// Older than the history the map holds: no exact answer.
    Unknown,
}

/// One partition's map: segments in source order, at most `max` (the
/// oldest go first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments {
    segments: VecDeque<Segment>,
    max: usize,
    /// Holds every segment since the first copy, so an offset before the
    /// first segment is before every copied record.
    complete: bool,
}

impl Segments {
    /// A map holding the whole history (read back from the offsets topic).
    pub(crate) fn new(max: usize) -> Segments {
        Segments {
            segments: VecDeque::new(),
            max: max.max(1),
            complete: true,
        }
    }

    /// A map begun mid-history (a replicator's run): offsets before its
    /// first segment have no answer here.
    pub(crate) fn partial(max: usize) -> Segments {
        Segments {
            complete: false,
            ..Segments::new(max)
        }
    }

    /// A batch of source offsets `source_base..=source_last` is on the
    /// destination from `destination_base`. Returns whether a new segment
    /// began (false: the last one grew, or the batch was known already).
    pub(crate) fn record(
        &mut self,
        source_base: i64,
        source_last: i64,
        destination_base: i64,
    ) -> bool {
        let end = source_last.saturating_add(1);
        if let Some(last) = self.segments.back_mut() {
            if end <= last.source_end {
                // An earlier attempt's batch answered again (a duplicate).
                return false;
            }
            if source_base == last.source_end && destination_base == last.destination_end() {
                last.source_end = end;
                return false;
            }
        }
        self.segments.push_back(Segment {
            source_start: source_base,
            source_end: end,
            destination_start: destination_base,
        });
        if self.segments.len() > self.max {
            self.segments.pop_front();
            self.complete = false;
        }
        true
    }

    /// Adds a segment read back from storage, keeping source order.
    pub(crate) fn restore(&mut self, segment: Segment) {
        let at = self
            .segments
            .partition_point(|s| s.source_start < segment.source_start);
        match self.segments.get_mut(at) {
            Some(s) if s.source_start == segment.source_start => *s = segment,
            _ => self.segments.insert(at, segment),
        }
        while self.segments.len() > self.max {
            self.segments.pop_front();
            self.complete = false;
        }
    }

    pub(crate) fn last(&self) -> Option<&Segment> {
        self.segments.back()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter()
    }

    pub fn len(&self) -> usize {
        self.segments.len()
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// The destination offset of the next record at or after source offset
    /// `offset`, given that every source offset below `resume` is on the
    /// destination or was passed over (the replicator's resume point).
    pub(crate) fn translate(&self, offset: i64, resume: i64) -> Translation {
        let Some(first) = self.segments.front() else {
            return Translation::NotYet;
        };
        if offset < first.source_start {
            // Nothing copied before the first segment: its first record is
            // the next one, if the map has seen all there is.
            return if self.complete {
                Translation::Exact(first.destination_start)
            } else {
                Translation::Unknown
            };
        }
        // The last segment starting at or before `offset`.
        let at = self.segments.partition_point(|s| s.source_start <= offset);
        let Some(s) = at.checked_sub(1).and_then(|i| self.segments.get(i)) else {
            return Translation::NotYet;
        };
        if offset < s.source_end {
            return Translation::Exact(s.destination_start + (offset - s.source_start));
        }
        // In a gap: the next segment's first record, if copied already.
        match self.segments.get(at) {
            Some(next) => Translation::Exact(next.destination_start),
            // After the last copied record: what was passed over up to the
            // resume point is not on the destination; the next record
            // copied lands right after the last one.
            None if offset <= resume => Translation::Exact(s.destination_end()),
            None => Translation::NotYet,
        }
    }
}

/// The key of a segment in the offsets topic: version 0 (int16), link,
/// topic (int16 length, UTF-8), partition (int32), source start (int64).
pub(crate) fn encode_key(link: &str, topic: &str, partition: i32, source_start: i64) -> Vec<u8> {
    let mut k = Vec::with_capacity(2 + 2 + link.len() + 2 + topic.len() + 4 + 8);
    k.extend_from_slice(&0i16.to_be_bytes());
    for s in [link, topic] {
        let len = u16::try_from(s.len()).unwrap_or(u16::MAX);
        k.extend_from_slice(&len.to_be_bytes());
        k.extend_from_slice(&s.as_bytes()[..usize::from(len)]);
    }
    k.extend_from_slice(&partition.to_be_bytes());
    k.extend_from_slice(&source_start.to_be_bytes());
    k
}

/// The value of a segment: version 0 (int16), source end, destination
/// start (int64 each).
pub(crate) fn encode_value(segment: &Segment) -> Vec<u8> {
    let mut v = Vec::with_capacity(18);
    v.extend_from_slice(&0i16.to_be_bytes());
    v.extend_from_slice(&segment.source_end.to_be_bytes());
    v.extend_from_slice(&segment.destination_start.to_be_bytes());
    v
}

/// A key read back: (link, topic, partition, source start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentKey {
    pub link: String,
    pub topic: String,
    pub partition: i32,
    pub source_start: i64,
}

/// Why a record of the offsets topic was not understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SegmentRecordError {
    #[error("offsets record {0} of an unknown version")]
    Version(&'static str),
    #[error("offsets record {0} cut short or too long")]
    Length(&'static str),
    #[error("offsets record key with a name that is not UTF-8")]
    Utf8,
    #[error("offsets record whose segment ends before it starts")]
    Empty,
}

fn take<'a>(
    b: &mut &'a [u8],
    n: usize,
    what: &'static str,
) -> Result<&'a [u8], SegmentRecordError> {
    if b.len() < n {
        return Err(SegmentRecordError::Length(what));
    }
    let (head, rest) = b.split_at(n);
    *b = rest;
    Ok(head)
}

fn int<const N: usize>(b: &mut &[u8], what: &'static str) -> Result<[u8; N], SegmentRecordError> {
    let bytes = take(b, N, what)?;
    bytes
        .try_into()
        .map_err(|_| SegmentRecordError::Length(what))
}

pub(crate) fn decode_key(mut b: &[u8]) -> Result<SegmentKey, SegmentRecordError> {
    if i16::from_be_bytes(int(&mut b, "key")?) != 0 {
        return Err(SegmentRecordError::Version("key"));
    }
    let mut name = || -> Result<String, SegmentRecordError> {
        let len = u16::from_be_bytes(int(&mut b, "key")?);
        let bytes = take(&mut b, usize::from(len), "key")?;
        String::from_utf8(bytes.to_vec()).map_err(|_| SegmentRecordError::Utf8)
    };
    let link = name()?;
    let topic = name()?;
    let partition = i32::from_be_bytes(int(&mut b, "key")?);
    let source_start = i64::from_be_bytes(int(&mut b, "key")?);
    if !b.is_empty() {
        return Err(SegmentRecordError::Length("key"));
    }
    Ok(SegmentKey {
        link,
        topic,
        partition,
        source_start,
    })
}

pub(crate) fn decode_value(key: &SegmentKey, mut b: &[u8]) -> Result<Segment, SegmentRecordError> {
    if i16::from_be_bytes(int(&mut b, "value")?) != 0 {
        return Err(SegmentRecordError::Version("value"));
    }
    let source_end = i64::from_be_bytes(int(&mut b, "value")?);
    let destination_start = i64::from_be_bytes(int(&mut b, "value")?);
    if !b.is_empty() {
        return Err(SegmentRecordError::Length("value"));
    }
    // A segment of no records is where a failback places the first record
    // it will copy (`mirror::divergence`).
    if source_end < key.source_start {
        return Err(SegmentRecordError::Empty);
    }
    Ok(Segment {
        source_start: key.source_start,
        source_end,
        destination_start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy of a transactional partition: records 0..=9 in two
    /// batches, a commit marker at 10, an aborted batch 11..=14 and its
    /// marker at 15, records 16..=19; a replicator restart that re-sent
    /// 16..=19 (answered as duplicates), then 20..=24 after a barrier the
    /// destination holds at 10.
    fn copied() -> Segments {
        let mut m = Segments::new(100);
        assert!(m.record(0, 4, 0), "the first batch begins a segment");
        assert!(!m.record(5, 9, 5), "contiguous on both sides: it grows");
        assert!(m.record(16, 19, 10), "the markers and the aborted batch");
        assert!(!m.record(16, 19, 10), "a duplicate changes nothing");
        assert!(m.record(20, 24, 15), "a barrier at destination 14");
        m
    }

    #[test]
    fn one_segment_per_run_not_per_batch() {
        let m = copied();
        let runs: Vec<(i64, i64, i64)> = m
            .iter()
            .map(|s| (s.source_start, s.source_end, s.destination_start))
            .collect();
        assert_eq!(runs, [(0, 10, 0), (16, 20, 10), (20, 25, 15)]);
    }

    #[test]
    fn a_committed_offset_translates_to_the_same_next_record() {
        let m = copied();
        let resume = 25;
        let t = |o| m.translate(o, resume);
        assert_eq!(t(0), Translation::Exact(0));
        assert_eq!(t(7), Translation::Exact(7));
        // The marker, the aborted batch and its marker: next is 16 -> 10.
        for o in 10..=16 {
            assert_eq!(t(o), Translation::Exact(10), "source {o}");
        }
        assert_eq!(t(19), Translation::Exact(13));
        // Source 20 is destination 15 (the barrier sits at 14).
        assert_eq!(t(20), Translation::Exact(15));
        assert_eq!(t(24), Translation::Exact(19));
        // Everything copied: the next record lands after the last.
        assert_eq!(t(25), Translation::Exact(20));
        assert_eq!(t(26), Translation::NotYet);
        // A marker passed over at the end: still the next copied record.
        assert_eq!(m.translate(26, 27), Translation::Exact(20));
    }

    #[test]
    fn older_than_the_history_held_has_no_answer() {
        let mut m = Segments::new(2);
        m.record(2, 4, 0);
        // Before the first copy of a whole history: the first copied record.
        assert_eq!(m.translate(0, 5), Translation::Exact(0));
        m.record(6, 9, 3);
        m.record(11, 14, 7);
        assert_eq!(m.len(), 2);
        // The oldest segment went: offset 3 (destination 1) is unknown now,
        // not the first kept segment's start, which would skip records.
        assert_eq!(m.translate(3, 15), Translation::Unknown);
        assert_eq!(m.translate(0, 15), Translation::Unknown);
        assert_eq!(m.translate(7, 15), Translation::Exact(4));
        let mut run = Segments::partial(8);
        run.record(100, 104, 50);
        assert_eq!(run.translate(99, 105), Translation::Unknown);
        assert_eq!(run.translate(100, 105), Translation::Exact(50));
        assert_eq!(Segments::new(4).translate(0, 0), Translation::NotYet);
    }

    #[test]
    fn restored_segments_keep_source_order_and_the_latest_value() {
        let mut m = Segments::new(10);
        let s = |a, b, d| Segment {
            source_start: a,
            source_end: b,
            destination_start: d,
        };
        m.restore(s(16, 18, 10));
        m.restore(s(0, 10, 0));
        m.restore(s(16, 20, 10));
        assert_eq!(
            m.iter().copied().collect::<Vec<_>>(),
            [s(0, 10, 0), s(16, 20, 10)]
        );
        // Recording goes on from the restored tail.
        assert!(!m.record(20, 21, 14));
        assert_eq!(m.last().map(|s| s.source_end), Some(22));
    }

    #[test]
    fn records_of_the_offsets_topic_have_exact_bytes() {
        let key = encode_key("a", "t", 3, 16);
        assert_eq!(
            key,
            [
                0, 0, // version
                0, 1, b'a', // link
                0, 1, b't', // topic
                0, 0, 0, 3, // partition
                0, 0, 0, 0, 0, 0, 0, 16, // source start
            ]
        );
        let segment = Segment {
            source_start: 16,
            source_end: 20,
            destination_start: 10,
        };
        let value = encode_value(&segment);
        assert_eq!(
            value,
            [
                0, 0, // version
                0, 0, 0, 0, 0, 0, 0, 20, // source end
                0, 0, 0, 0, 0, 0, 0, 10, // destination start
            ]
        );
        let k = decode_key(&key).expect("decodes");
        assert_eq!(
            k,
            SegmentKey {
                link: "a".into(),
                topic: "t".into(),
                partition: 3,
                source_start: 16
            }
        );
        assert_eq!(decode_value(&k, &value), Ok(segment));
    }

    #[test]
    fn malformed_records_are_refused_not_guessed() {
        let key = encode_key("a", "t", 3, 16);
        assert_eq!(
            decode_key(&key[..key.len() - 1]),
            Err(SegmentRecordError::Length("key"))
        );
        let mut longer = key.clone();
        longer.push(0);
        assert_eq!(decode_key(&longer), Err(SegmentRecordError::Length("key")));
        let mut v1 = key.clone();
        v1[1] = 1;
        assert_eq!(decode_key(&v1), Err(SegmentRecordError::Version("key")));
        // A name length beyond the bytes present sizes nothing.
        assert_eq!(
            decode_key(&[0, 0, 0xff, 0xff, b'a']),
            Err(SegmentRecordError::Length("key"))
        );
        let k = decode_key(&key).expect("decodes");
        let backwards = Segment {
            source_start: 16,
            source_end: 15,
            destination_start: 0,
        };
        assert_eq!(
            decode_value(&k, &encode_value(&backwards)),
            Err(SegmentRecordError::Empty)
        );
        let empty = Segment {
            source_end: 16,
            ..backwards
        };
        assert_eq!(decode_value(&k, &encode_value(&empty)), Ok(empty));
    }
}
