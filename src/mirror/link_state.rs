//! A link's state machine (pure): `MIRRORING` → `STOPPING` → `STOPPED` →
//! (start) `MIRRORING`, a failback link's `PREPARING` → (start)
//! `MIRRORING`, and which persisted record may follow which.
//!
//! The state topic orders every instance's writes; each instance applies the
//! records in that order with `follows`, so all of them end up in the same
//! state even when two operators act at once on two instances.

use crate::mirror::pid::ClusterId;

/// Where a link is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkState {
    /// Mirrored traffic flows; local producers may not write the link's topics.
    Mirroring,
    /// Failing over: the link is fenced on every instance; barriers are
    /// being placed.
    Stopping,
    /// Failed over: the link is fenced, its topics take local writes.
    Stopped,
    /// A failback link (SPEC §12) before the operator's word: the link is
    /// fenced and its topics are read-only, so that neither the replicator
    /// nor a local producer writes them while the divergence is reported.
    Preparing,
}

impl LinkState {
    /// As persisted (int8 of `MirrorLinkStateValue`).
    pub(crate) fn code(self) -> i8 {
        match self {
            LinkState::Mirroring => 0,
            LinkState::Stopping => 1,
            LinkState::Stopped => 2,
            LinkState::Preparing => 3,
        }
    }

    pub(crate) fn from_code(code: i8) -> Option<LinkState> {
        match code {
            0 => Some(LinkState::Mirroring),
            1 => Some(LinkState::Stopping),
            2 => Some(LinkState::Stopped),
            3 => Some(LinkState::Preparing),
            _ => None,
        }
    }

    /// As the admin API and the configuration spell it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LinkState::Mirroring => "MIRRORING",
            LinkState::Stopping => "STOPPING",
            LinkState::Stopped => "STOPPED",
            LinkState::Preparing => "PREPARING",
        }
    }

    /// `MIRRORING`, `STOPPING`, `STOPPED` or `PREPARING`, any case.
    pub(crate) fn parse(s: &str) -> Option<LinkState> {
        match s.to_ascii_uppercase().as_str() {
            "MIRRORING" => Some(LinkState::Mirroring),
            "STOPPING" => Some(LinkState::Stopping),
            "STOPPED" => Some(LinkState::Stopped),
            "PREPARING" => Some(LinkState::Preparing),
            _ => None,
        }
    }

    /// Whether the link's own traffic is refused (and its connections closed).
    pub(crate) fn fences_link(self) -> bool {
        self != LinkState::Mirroring
    }

    /// Whether local producers may not write the link's topics.
    pub(crate) fn read_only(self) -> bool {
        self != LinkState::Stopped
    }
}

/// `MirrorLinkStateValue` v0: a link's persisted status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStatus {
    pub state: LinkState,
    /// When the link entered `state` (wall-clock ms).
    pub since_ms: i64,
    /// The source cluster the link mirrors (`start` may change it).
    pub source: ClusterId,
    /// The current or last failover; -1 if none.
    pub failover_id: i64,
    /// When that failover started; -1 if none.
    pub failover_started_ms: i64,
    /// When that failover finished (the link became `STOPPED`); -1 if not.
    pub failover_finished_ms: i64,
}

impl LinkStatus {
    /// The status a link has before any record names it.
    pub(crate) fn initial(state: LinkState, source: ClusterId) -> LinkStatus {
        LinkStatus {
            state,
            since_ms: -1,
            source,
            failover_id: -1,
            failover_started_ms: -1,
            failover_finished_ms: -1,
        }
    }
}

/// Why an operator's transition cannot happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Conflict {
    #[error("link '{link}' is already STOPPED (failover {failover_id} finished); `POST /links/{link}/start` makes it MIRRORING again")]
    AlreadyStopped { link: String, failover_id: i64 },
    #[error("link '{link}' is {state}; only a STOPPED or PREPARING link can be started (`POST /links/{link}/failover` first)")]
    NotStopped { link: String, state: &'static str },
    #[error("link '{link}' is PREPARING a failback: it has nothing to fail over; `kafka-mirror-proxy failback` starts it")]
    Preparing { link: String },
    #[error("link '{link}' changed meanwhile (another instance or operator): it is now {state}")]
    Raced { link: String, state: &'static str },
}

/// What `failover` does from `current`: `Ok(true)` start a new failover,
/// `Ok(false)` resume the one in progress.
pub(crate) fn failover_from(link: &str, current: &LinkStatus) -> Result<bool, Conflict> {
    match current.state {
        LinkState::Mirroring => Ok(true),
        LinkState::Stopping => Ok(false),
        LinkState::Stopped => Err(Conflict::AlreadyStopped {
            link: link.to_string(),
            failover_id: current.failover_id,
        }),
        LinkState::Preparing => Err(Conflict::Preparing {
            link: link.to_string(),
        }),
    }
}

/// Whether `start` may leave `current` (for `PREPARING`: the operator's
/// word that the failback's divergence is handled).
pub(crate) fn start_from(link: &str, current: &LinkStatus) -> Result<(), Conflict> {
    match current.state {
        LinkState::Stopped | LinkState::Preparing => Ok(()),
        state => Err(Conflict::NotStopped {
            link: link.to_string(),
            state: state.as_str(),
        }),
    }
}

/// A failover id for a failover starting at `now_ms` after `current`:
/// its start time, strictly greater than any id the link had.
pub(crate) fn next_failover_id(current: &LinkStatus, now_ms: i64) -> i64 {
    now_ms.max(current.failover_id.saturating_add(1))
}

/// Whether a persisted status is one the proxy could have written, on its
/// own: every persisted record has a time, a PREPARING one no failover, a
/// STOPPING or STOPPED one the
/// failover (id and start time) it belongs to, only a STOPPED one (or a
/// MIRRORING one after it) a finish time, and no failover id is below -1.
pub(crate) fn consistent(s: &LinkStatus) -> bool {
    use LinkState::*;
    let failover = s.failover_id >= 0 && s.failover_started_ms >= 0;
    let none = s.failover_id == -1 && s.failover_started_ms == -1 && s.failover_finished_ms == -1;
    s.since_ms >= 0
        && match s.state {
            Mirroring => none || (failover && s.failover_finished_ms >= 0),
            Stopping => failover && s.failover_finished_ms == -1,
            Stopped => failover && s.failover_finished_ms >= 0,
            Preparing => none,
        }
}

/// Whether a persisted `next` applies on top of `current` (every instance
/// decides the same, in log order): MIRRORING → STOPPING under a higher
/// failover id, STOPPING → STOPPED under the same one, STOPPED (or
/// PREPARING) → MIRRORING keeping it; a rewrite of the same state under the same id (two
/// operators acting at once) is harmless. A STOPPING that was never
/// persisted (`INITIAL_STATE`, id -1) takes its failover's id. The first
/// STOPPING of a failover wins a race: a second one with another id, or a
/// STOPPED of another failover, is ignored; so is any `next` that is not
/// [`consistent`].
pub(crate) fn follows(current: &LinkStatus, next: &LinkStatus) -> bool {
    use LinkState::*;
    if !consistent(next) {
        return false;
    }
    let same = next.failover_id == current.failover_id;
    match (current.state, next.state) {
        (Mirroring, Stopping) => next.failover_id > current.failover_id,
        (Stopping, Stopping) if current.failover_id == -1 => true,
        (Stopping, Stopping) | (Stopping, Stopped) => same,
        (Stopped, Mirroring) | (Mirroring, Mirroring) | (Stopped, Stopped) => same,
        (Preparing, Mirroring) | (Preparing, Preparing) => same,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status as the proxy persists it: a failover's id is its start.
    fn status(state: LinkState, failover_id: i64) -> LinkStatus {
        let finished = match state {
            LinkState::Stopping => -1,
            _ if failover_id < 0 => -1,
            _ => failover_id + 5,
        };
        LinkStatus {
            failover_id,
            since_ms: 1,
            failover_started_ms: failover_id,
            failover_finished_ms: finished,
            ..LinkStatus::initial(state, ClusterId::parse("AAAAAAAAAAAAAAAAAAAAAA").unwrap())
        }
    }

    #[test]
    fn operator_transitions() {
        use LinkState::*;
        assert_eq!(failover_from("a", &status(Mirroring, -1)), Ok(true));
        assert_eq!(failover_from("a", &status(Stopping, 5)), Ok(false));
        let e = failover_from("a", &status(Stopped, 5)).unwrap_err();
        assert!(e.to_string().contains("already STOPPED"), "{e}");
        assert!(e.to_string().contains("/links/a/start"), "{e}");
        assert_eq!(start_from("a", &status(Stopped, 5)), Ok(()));
        for s in [Mirroring, Stopping] {
            let e = start_from("a", &status(s, 5)).unwrap_err();
            assert!(e.to_string().contains(s.as_str()), "{e}");
        }
    }

    #[test]
    fn records_follow_in_order_and_the_first_stopping_wins() {
        use LinkState::*;
        assert!(follows(&status(Mirroring, -1), &status(Stopping, 10)));
        assert!(!follows(&status(Mirroring, 10), &status(Stopping, 10)));
        assert!(!follows(&status(Mirroring, 10), &status(Stopping, 9)));
        assert!(follows(&status(Stopping, 10), &status(Stopping, 10)));
        assert!(!follows(&status(Stopping, 10), &status(Stopping, 11)));
        assert!(follows(&status(Stopping, 10), &status(Stopped, 10)));
        assert!(!follows(&status(Stopping, 10), &status(Stopped, 11)));
        assert!(!follows(&status(Stopping, 10), &status(Mirroring, 10)));
        assert!(follows(&status(Stopped, 10), &status(Mirroring, 10)));
        assert!(!follows(&status(Stopped, 10), &status(Mirroring, 11)));
        assert!(!follows(&status(Stopped, 10), &status(Stopping, 11)));
        assert!(follows(&status(Stopped, 10), &status(Stopped, 10)));
        assert!(!follows(&status(Stopped, 10), &status(Stopped, 12)));
        assert!(follows(&status(Mirroring, 10), &status(Mirroring, 10)));
        assert!(!follows(&status(Mirroring, 10), &status(Mirroring, 12)));
        // Straight to STOPPED, whatever the id.
        assert!(!follows(&status(Mirroring, -1), &status(Stopped, 10)));
        assert!(!follows(&status(Mirroring, -1), &status(Stopped, -1)));
        // INITIAL_STATE=STOPPING: the failover gives it an id; STOPPED
        // needs it first.
        let initial = LinkStatus::initial(Stopping, status(Stopping, 1).source);
        assert!(follows(&initial, &status(Stopping, 10)));
        assert!(!follows(&initial, &status(Stopped, 10)));
        // INITIAL_STATE=STOPPED: `start` keeps the id -1.
        let stopped = LinkStatus::initial(Stopped, initial.source);
        assert!(follows(
            &stopped,
            &LinkStatus {
                since_ms: 5,
                state: Mirroring,
                ..stopped
            }
        ));
    }

    /// Each field a forger could get wrong, one at a time.
    #[test]
    fn a_status_must_be_consistent_on_its_own() {
        use LinkState::*;
        for s in [Mirroring, Stopping, Stopped] {
            assert!(consistent(&status(s, 10)), "{s:?}");
        }
        assert!(consistent(&status(Mirroring, -1)));
        assert!(!consistent(&status(Stopping, -1)));
        assert!(!consistent(&status(Stopped, -1)));
        let unset = |s: LinkStatus| LinkStatus { since_ms: -1, ..s };
        assert!(
            !consistent(&unset(status(Mirroring, -1))),
            "never persisted"
        );
        let stopped = status(Stopped, 10);
        assert!(!consistent(&LinkStatus {
            failover_started_ms: -1,
            ..stopped
        }));
        assert!(!consistent(&LinkStatus {
            failover_finished_ms: -1,
            ..stopped
        }));
        assert!(!consistent(&LinkStatus {
            failover_id: -2,
            ..stopped
        }));
        let stopping = status(Stopping, 10);
        assert!(!consistent(&LinkStatus {
            failover_finished_ms: 20,
            ..stopping
        }));
        let mirroring = status(Mirroring, 10);
        assert!(!consistent(&LinkStatus {
            failover_finished_ms: -1,
            ..mirroring
        }));
        assert!(!consistent(&LinkStatus {
            failover_started_ms: 3,
            ..status(Mirroring, -1)
        }));
    }

    #[test]
    fn failover_ids_only_grow() {
        assert_eq!(
            next_failover_id(&status(LinkState::Mirroring, -1), 1000),
            1000
        );
        assert_eq!(
            next_failover_id(&status(LinkState::Mirroring, 5000), 1000),
            5001
        );
    }

    #[test]
    fn states_round_trip() {
        for s in [
            LinkState::Mirroring,
            LinkState::Stopping,
            LinkState::Stopped,
            LinkState::Preparing,
        ] {
            assert_eq!(LinkState::from_code(s.code()), Some(s));
            assert_eq!(LinkState::parse(&s.as_str().to_lowercase()), Some(s));
        }
        assert_eq!(LinkState::from_code(4), None);
        assert_eq!(LinkState::parse("paused"), None);
        assert!(LinkState::Mirroring.read_only() && LinkState::Stopping.read_only());
        assert!(!LinkState::Stopped.read_only());
        assert!(!LinkState::Mirroring.fences_link() && LinkState::Stopping.fences_link());
    }

    #[test]
    fn a_failback_link_prepares_then_starts() {
        use LinkState::*;
        let prep = LinkStatus::initial(Preparing, status(Mirroring, -1).source);
        assert!(prep.state.fences_link() && prep.state.read_only());
        let e = failover_from("b", &prep).unwrap_err();
        assert!(e.to_string().contains("PREPARING"), "{e}");
        assert_eq!(start_from("b", &prep), Ok(()));
        let started = LinkStatus {
            state: Mirroring,
            since_ms: 9,
            ..prep
        };
        assert!(follows(&prep, &started));
        // Never back into PREPARING, nor from it to a failover's states.
        assert!(!follows(
            &started,
            &LinkStatus {
                since_ms: 10,
                ..prep
            }
        ));
        assert!(!follows(&prep, &status(Stopping, 10)));
        assert!(!follows(&prep, &status(Stopped, 10)));
        // A persisted PREPARING carries no failover.
        assert!(consistent(&LinkStatus {
            since_ms: 1,
            ..prep
        }));
        assert!(!consistent(&LinkStatus {
            state: Preparing,
            ..status(Stopped, 10)
        }));
        assert_eq!(LinkState::from_code(3), Some(Preparing));
        assert_eq!(LinkState::parse("preparing"), Some(Preparing));
    }
}
