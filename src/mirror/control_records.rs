//! Which link-control records of the state topic (types 5, 6 and 7) an
//! instance applies. Pure. Every instance reads the same records in the
//! same order, so every instance skips the same ones.
//!
//! A record is applied only if the proxy could have written it at that
//! point of the link's history: a link state must [`follows`] the link's
//! current status (the configured initial one before any record); a
//! barrier or drained record belongs to the failover the link is STOPPING
//! under, because only then does the proxy write one. The proxy deletes
//! only drained records, of earlier failovers, as a new failover begins
//! (while the link is still MIRRORING): a drained tombstone applies while
//! no failover is in progress; every other tombstone is skipped.
//!
//! While an instance loads the topic, the records that came before a
//! link's first one may have been compacted away (compaction keeps only
//! the latest record of each key): until that first record, what came
//! before is [`Prior::Unknown`] and only the record's own consistency is
//! checked. Forged records that are consistent with the history (written
//! by a client with Write on the topic) are what the state key and the
//! topic's ACLs are for (`docs/state-topic.md`).

use crate::mirror::link_state::{consistent, follows, LinkState, LinkStatus};

/// What an instance knows of a link when one of its records arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Prior<'a> {
    /// The link's current status: its latest applied record, or its
    /// initial status when none was applied after a full load.
    Known(&'a LinkStatus),
    /// Loading, no record of the link applied yet: earlier ones may have
    /// been compacted away.
    Unknown,
}

/// Why a link-control record is skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Skip {
    #[error("a tombstone: the proxy never deletes link state or barrier records, nor drained records during a failover")]
    Tombstone,
    #[error("a link state the proxy could not have written (its fields contradict each other)")]
    Inconsistent,
    #[error("a STOPPING of another failover than the one in progress (a lost race)")]
    LostRace,
    #[error("a link state that does not follow the current one")]
    DoesNotFollow,
    #[error("a barrier or drained record of a failover the link is not STOPPING under")]
    NotFailingOver,
}

/// Whether a link state record (`None`: a tombstone) applies after `prior`.
pub(crate) fn check_link_state(prior: Prior<'_>, next: Option<&LinkStatus>) -> Result<(), Skip> {
    let next = next.ok_or(Skip::Tombstone)?;
    if !consistent(next) {
        return Err(Skip::Inconsistent);
    }
    match prior {
        Prior::Unknown => Ok(()),
        Prior::Known(current) if follows(current, next) => Ok(()),
        Prior::Known(current)
            if current.state == LinkState::Stopping && next.state == LinkState::Stopping =>
        {
            Err(Skip::LostRace)
        }
        Prior::Known(_) => Err(Skip::DoesNotFollow),
    }
}

/// Whether a barrier or drained record of failover `failover_id` (`None`
/// value: a tombstone) applies after `prior`: the link must be STOPPING
/// under that failover.
pub(crate) fn check_failover_record(
    prior: Prior<'_>,
    failover_id: i64,
    tombstone: bool,
) -> Result<(), Skip> {
    if tombstone {
        return Err(Skip::Tombstone);
    }
    let ok = match prior {
        Prior::Unknown => failover_id >= 0,
        Prior::Known(s) => s.state == LinkState::Stopping && s.failover_id == failover_id,
    };
    if ok && failover_id >= 0 {
        Ok(())
    } else {
        Err(Skip::NotFailingOver)
    }
}

/// Whether a drained tombstone applies after `prior`: not while the link
/// is STOPPING, when it would erase a confirmation the failover waits for.
pub(crate) fn check_drained_tombstone(prior: Prior<'_>) -> Result<(), Skip> {
    match prior {
        Prior::Known(s) if s.state == LinkState::Stopping => Err(Skip::Tombstone),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mirror::pid::ClusterId;

    fn source() -> ClusterId {
        ClusterId::from_bytes(*b"source-cluster!!")
    }

    /// As the proxy writes them: failover 1700000000000, started then,
    /// finished 5 s later.
    fn mirroring() -> LinkStatus {
        LinkStatus {
            since_ms: 1_699_000_000_000,
            ..LinkStatus::initial(LinkState::Mirroring, source())
        }
    }
    fn stopping(id: i64) -> LinkStatus {
        LinkStatus {
            state: LinkState::Stopping,
            since_ms: id,
            source: source(),
            failover_id: id,
            failover_started_ms: id,
            failover_finished_ms: -1,
        }
    }
    fn stopped(id: i64) -> LinkStatus {
        LinkStatus {
            state: LinkState::Stopped,
            since_ms: id + 5_000,
            failover_finished_ms: id + 5_000,
            ..stopping(id)
        }
    }
    const F: i64 = 1_700_000_000_000;

    #[test]
    fn link_states_follow_the_state_machine() {
        let initial = LinkStatus::initial(LinkState::Mirroring, source());
        // The forgery: the link MIRRORING (its initial state), then
        // STOPPED under a failover nobody started.
        assert_eq!(
            check_link_state(Prior::Known(&initial), Some(&stopped(F))),
            Err(Skip::DoesNotFollow)
        );
        assert_eq!(
            check_link_state(Prior::Known(&initial), Some(&stopping(F))),
            Ok(())
        );
        assert_eq!(
            check_link_state(Prior::Known(&stopping(F)), Some(&stopped(F))),
            Ok(())
        );
        assert_eq!(
            check_link_state(Prior::Known(&stopping(F)), Some(&stopped(F + 1))),
            Err(Skip::DoesNotFollow)
        );
        assert_eq!(
            check_link_state(Prior::Known(&stopping(F)), Some(&stopping(F + 1))),
            Err(Skip::LostRace)
        );
        let started = LinkStatus {
            state: LinkState::Mirroring,
            since_ms: F + 9_000,
            ..stopped(F)
        };
        assert_eq!(
            check_link_state(Prior::Known(&stopped(F)), Some(&started)),
            Ok(())
        );
        // A STOPPED of that failover again, after the link was started.
        assert_eq!(
            check_link_state(Prior::Known(&started), Some(&stopped(F))),
            Err(Skip::DoesNotFollow)
        );
        // STOPPING again under an old id.
        assert_eq!(
            check_link_state(Prior::Known(&started), Some(&stopping(F))),
            Err(Skip::DoesNotFollow)
        );
        assert_eq!(
            check_link_state(Prior::Known(&mirroring()), None),
            Err(Skip::Tombstone)
        );
    }

    #[test]
    fn while_loading_a_first_record_is_checked_on_its_own() {
        for s in [mirroring(), stopping(F), stopped(F)] {
            assert_eq!(check_link_state(Prior::Unknown, Some(&s)), Ok(()), "{s:?}");
        }
        let no_id = LinkStatus {
            failover_id: -1,
            ..stopped(F)
        };
        assert_eq!(
            check_link_state(Prior::Unknown, Some(&no_id)),
            Err(Skip::Inconsistent)
        );
        let unfinished = LinkStatus {
            failover_finished_ms: -1,
            ..stopped(F)
        };
        assert_eq!(
            check_link_state(Prior::Unknown, Some(&unfinished)),
            Err(Skip::Inconsistent)
        );
        assert_eq!(check_link_state(Prior::Unknown, None), Err(Skip::Tombstone));
    }

    #[test]
    fn barriers_and_drains_belong_to_the_failover_in_progress() {
        let initial = LinkStatus::initial(LinkState::Mirroring, source());
        assert_eq!(
            check_failover_record(Prior::Known(&stopping(F)), F, false),
            Ok(())
        );
        for (prior, id) in [
            (initial, F),
            (stopping(F), F + 1),
            (stopping(F), -1),
            (stopped(F), F),
            (mirroring(), -1),
        ] {
            assert_eq!(
                check_failover_record(Prior::Known(&prior), id, false),
                Err(Skip::NotFailingOver),
                "{prior:?} {id}"
            );
        }
        // INITIAL_STATE=STOPPING: barriers only once a failover has an id.
        let initial_stopping = LinkStatus::initial(LinkState::Stopping, source());
        assert_eq!(
            check_failover_record(Prior::Known(&initial_stopping), -1, false),
            Err(Skip::NotFailingOver)
        );
        assert_eq!(check_failover_record(Prior::Unknown, F, false), Ok(()));
        assert_eq!(
            check_failover_record(Prior::Unknown, -7, false),
            Err(Skip::NotFailingOver)
        );
        assert_eq!(
            check_failover_record(Prior::Known(&stopping(F)), F, true),
            Err(Skip::Tombstone)
        );
    }
}
