//! Where two clusters diverge after a failover, and the history a failback
//! link starts with (SPEC §12, "Failback"). Pure.
//!
//! Link `a` mirrored cluster A into B until it failed over. Its
//! translation (`mirror::translation`, on B) maps A's offsets to B's, and
//! its barrier on B records B's log end when the failover fenced it: every
//! B record from there on was written by B's own producers. A failback
//! link mirrors B back into A from that barrier. Two facts decide it:
//!
//! - **the divergence point**: the first A offset B never got (the end of
//!   the translation, or the replicator's resume point past it when it
//!   passed over markers). A's records from there on were acknowledged on
//!   A and never reached B;
//! - **the failback's history**: the translation read backwards (B's
//!   offsets of A's records to A's offsets), and a segment of no records
//!   at the barrier that says where B's own records begin on A (A's log
//!   end when the failback starts), so that a consumer group moving back
//!   from B translates exactly, wherever it committed.
//!
//! The divergence is resolved only when the translation ends exactly at
//! the barrier: otherwise B holds records of the link that the translation
//! does not cover (the replicator stopped without saving them) and nobody
//! can say which of A's records they are. Fail closed: the partition is
//! reported unresolved and the failback refused.

use super::translation::{Segment, Segments};

/// What the failover's barrier recorded in one partition of B.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Barrier {
    /// B's log end offset after the barrier was answered.
    pub log_end_offset: i64,
    /// Whether B's log appended the barrier batch (a stock broker refuses
    /// it; then nothing of the barrier is in the log).
    pub accepted: bool,
}

/// Where A and B diverge in one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Point {
    /// The first offset of A that B never got.
    pub a_next: i64,
    /// The first offset of B's own records: the failback copies from here.
    pub b_start: i64,
}

/// Why a partition's divergence cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Unresolved {
    #[error("B holds {missing} offset(s) of the link before its barrier at {barrier} that the translation does not cover (it ends at {translated}): the replicator stopped without saving them, so which of A's records they are is unknown")]
    Untranslated {
        barrier: i64,
        translated: i64,
        missing: i64,
    },
    #[error("the translation reaches B offset {translated}, past the barrier at {barrier}: the translation or the barrier belongs to another failover")]
    PastBarrier { barrier: i64, translated: i64 },
}

/// The divergence of one partition from the link's translation (`None`:
/// nothing of it was ever copied), the replicator's resume point on A
/// (`None`: none committed), the barrier, and A's log start offset.
pub(crate) fn divergence(
    translation: Option<&Segments>,
    resume: Option<i64>,
    barrier: Barrier,
    a_log_start: i64,
) -> Result<Point, Unresolved> {
    let b_start = barrier.log_end_offset;
    // Where the link's last copied record ends on B, and on A.
    let (translated, copied_to) = match translation.and_then(Segments::last) {
        Some(last) => (last.destination_end(), last.source_end),
        None => (0, a_log_start),
    };
    let expected = b_start - i64::from(barrier.accepted);
    if translated < expected {
        return Err(Unresolved::Untranslated {
            barrier: b_start,
            translated,
            missing: expected - translated,
        });
    }
    if translated > expected {
        return Err(Unresolved::PastBarrier {
            barrier: b_start,
            translated,
        });
    }
    // What the replicator passed over after its last copy (markers,
    // aborted batches) is no record that B lacks.
    let a_next = resume.map_or(copied_to, |r| r.max(copied_to));
    Ok(Point { a_next, b_start })
}

/// The history a failback link starts with in one partition: the link's
/// translation read backwards (B offsets of A's records → A offsets), then
/// a segment of no records at `point.b_start` placing B's own records at
/// `a_end` (A's log end: A's records past the divergence stay before them).
pub(crate) fn failback_history(
    translation: Option<&Segments>,
    point: Point,
    a_end: i64,
) -> Vec<Segment> {
    let mut out: Vec<Segment> = translation
        .into_iter()
        .flat_map(Segments::iter)
        .map(|s| Segment {
            source_start: s.destination_start,
            source_end: s.destination_end(),
            destination_start: s.source_start,
        })
        .collect();
    out.push(Segment {
        source_start: point.b_start,
        source_end: point.b_start,
        destination_start: a_end,
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::translation::Translation;

    /// A → B: A's records 0..=9 at B 0..=9, A's commit marker at 10, A's
    /// 11..=19 at B 10..=18; the failover's barrier at B's end, 19.
    fn forward() -> Segments {
        let mut s = Segments::new(16);
        s.record(0, 9, 0);
        s.record(11, 19, 10);
        s
    }

    const REFUSED: Barrier = Barrier {
        log_end_offset: 19,
        accepted: false,
    };

    #[test]
    fn the_point_is_where_the_translation_ends() {
        let p = divergence(Some(&forward()), Some(20), REFUSED, 0).unwrap();
        assert_eq!(
            p,
            Point {
                a_next: 20,
                b_start: 19
            }
        );
        // A resume point past the end: markers passed over.
        let p = divergence(Some(&forward()), Some(22), REFUSED, 0).unwrap();
        assert_eq!(p.a_next, 22);
        // No resume point: the end of the translation.
        assert_eq!(
            divergence(Some(&forward()), None, REFUSED, 0)
                .unwrap()
                .a_next,
            20
        );
        // A barrier the log took sits at 19; B's own records start at 20.
        let accepted = Barrier {
            log_end_offset: 20,
            accepted: true,
        };
        let p = divergence(Some(&forward()), Some(20), accepted, 0).unwrap();
        assert_eq!(
            p,
            Point {
                a_next: 20,
                b_start: 20
            }
        );
    }

    #[test]
    fn nothing_copied_diverges_at_the_log_start() {
        let empty = Barrier {
            log_end_offset: 0,
            accepted: false,
        };
        let p = divergence(None, None, empty, 7).unwrap();
        assert_eq!(
            p,
            Point {
                a_next: 7,
                b_start: 0
            }
        );
        let p = divergence(None, Some(12), empty, 7).unwrap();
        assert_eq!(p.a_next, 12);
    }

    #[test]
    fn a_translation_short_of_or_past_the_barrier_is_unresolved() {
        let later = Barrier {
            log_end_offset: 25,
            accepted: false,
        };
        let e = divergence(Some(&forward()), Some(20), later, 0).unwrap_err();
        assert_eq!(
            e,
            Unresolved::Untranslated {
                barrier: 25,
                translated: 19,
                missing: 6
            }
        );
        assert!(e.to_string().contains("6 offset(s)"), "{e}");
        let earlier = Barrier {
            log_end_offset: 15,
            accepted: false,
        };
        let e = divergence(Some(&forward()), Some(20), earlier, 0).unwrap_err();
        assert!(matches!(e, Unresolved::PastBarrier { .. }), "{e}");
        // B got records of the link but none were saved.
        let e = divergence(None, None, REFUSED, 0).unwrap_err();
        assert!(
            matches!(e, Unresolved::Untranslated { missing: 19, .. }),
            "{e}"
        );
    }

    #[test]
    fn the_failback_history_translates_every_b_offset_back() {
        let forward = forward();
        let p = divergence(Some(&forward), Some(20), REFUSED, 0).unwrap();
        // A holds 20..=24 past the divergence; A's log end is 25.
        let history = failback_history(Some(&forward), p, 25);
        assert_eq!(
            history,
            vec![
                Segment {
                    source_start: 0,
                    source_end: 10,
                    destination_start: 0
                },
                Segment {
                    source_start: 10,
                    source_end: 19,
                    destination_start: 11
                },
                Segment {
                    source_start: 19,
                    source_end: 19,
                    destination_start: 25
                },
            ]
        );
        let mut back = Segments::new(16);
        for s in history {
            back.restore(s);
        }
        // B's copies of A's records: back to the same A records.
        assert_eq!(back.translate(0, 19), Translation::Exact(0));
        assert_eq!(back.translate(9, 19), Translation::Exact(9));
        assert_eq!(back.translate(10, 19), Translation::Exact(11));
        assert_eq!(back.translate(18, 19), Translation::Exact(19));
        // A group that read all of A's records B got: its next record is
        // B's first own record, which lands at A's log end (A's records
        // past the divergence stay behind it).
        assert_eq!(back.translate(19, 19), Translation::Exact(25));
        // The failback copies B 19..=21 to A 25..=27: the empty segment
        // grows, and B's own records translate.
        assert!(!back.record(19, 21, 25));
        assert_eq!(back.translate(20, 22), Translation::Exact(26));
        assert_eq!(back.translate(22, 22), Translation::Exact(28));
        // A's log moved before the first copy (a direct producer): the
        // copy's own segment takes over from the empty one.
        let mut moved = Segments::new(16);
        for s in failback_history(Some(&forward), p, 25) {
            moved.restore(s);
        }
        assert!(moved.record(19, 21, 30));
        assert_eq!(moved.translate(19, 22), Translation::Exact(30));
        assert_eq!(moved.translate(21, 22), Translation::Exact(32));
    }
}
