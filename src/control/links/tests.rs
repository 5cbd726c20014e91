//! The link control's decisions over an in-memory store, a fake instances'
//! group and a barrier placer with scripted results. Every write and
//! barrier is an event with its time on tokio's paused clock, so the tests
//! check what happened in which order, and when.

use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;

use regex::Regex;
use uuid::Uuid;

use super::*;
use crate::client::ClientError;
use crate::mirror::link::ControlBatchPolicy;
use crate::mirror::state_records::BarrierKey;
use crate::state::{AppliedBarrier, ResolveError};

const LINK: &str = "east";

/// The failover of a link's report, which the test expects there.
fn failover_of(report: &LinkReport) -> &FailoverReport {
    report.failover.as_ref().expect("the report has a failover")
}

#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// A link state persisted by this instance, with the state in effect
    /// when it was written (`None`: no record yet, the initial state).
    Wrote {
        state: LinkState,
        failover_id: i64,
        in_effect: Option<LinkState>,
    },
    Drained {
        instance: String,
        failover_id: i64,
    },
    /// Drained records of earlier failovers deleted.
    ForgotDrained(usize),
    /// One attempt at a barrier, with the link's state in effect then.
    Placed {
        topic: String,
        partition: i32,
        failover_id: i64,
        in_effect: Option<LinkState>,
        result: BarrierResult,
    },
}

/// Events with when they happened since the test started.
#[derive(Clone)]
struct Events {
    start: tokio::time::Instant,
    list: Arc<Mutex<Vec<(Duration, Event)>>>,
}

impl Events {
    fn push(&self, e: Event) {
        lock(&self.list).push((self.start.elapsed(), e));
    }

    fn all(&self) -> Vec<Event> {
        lock(&self.list).iter().map(|(_, e)| e.clone()).collect()
    }

    fn timed(&self) -> Vec<(Duration, Event)> {
        lock(&self.list).clone()
    }

    fn placed(&self) -> Vec<(Duration, String, i32, BarrierResult)> {
        self.timed()
            .into_iter()
            .filter_map(|(at, e)| match e {
                Event::Placed {
                    topic,
                    partition,
                    result,
                    ..
                } => Some((at, topic, partition, result)),
                _ => None,
            })
            .collect()
    }
}

/// The state topic as followed by this instance, in memory: a write applies
/// at once, by the same `follows` rule as the real store.
struct FakeStore {
    loaded: AtomicBool,
    links: Mutex<HashMap<String, LinkStatus>>,
    drained: Mutex<HashMap<DrainedKey, DrainedValue>>,
    changed: watch::Sender<u64>,
    events: Events,
    /// Whether each next link-state write fails (none left: it succeeds).
    failing_writes: Mutex<VecDeque<bool>>,
    /// Another instance's link-state records, landing just before our next
    /// link-state write.
    foreign: Mutex<Vec<LinkStatus>>,
}

impl FakeStore {
    fn status(&self, link: &str) -> Option<LinkStatus> {
        lock(&self.links).get(link).copied()
    }

    /// Apply a link-state record (ours or another instance's).
    fn apply_link(&self, link: &str, next: LinkStatus) {
        {
            let mut links = lock(&self.links);
            let current = links.get(link).copied();
            if current.is_none_or(|c| link_state::follows(&c, &next)) {
                links.insert(link.to_string(), next);
            }
        }
        self.changed.send_modify(|n| *n += 1);
    }

    /// Apply another instance's drained record.
    fn apply_drained(&self, instance: &str, failover_id: i64) {
        lock(&self.drained).insert(
            DrainedKey {
                link: LINK.to_string(),
                instance: instance.to_string(),
            },
            DrainedValue {
                failover_id,
                timestamp_ms: now_ms(),
            },
        );
        self.changed.send_modify(|n| *n += 1);
    }
}

impl Store for FakeStore {
    fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    fn not_ready_reason(&self) -> Option<String> {
        (!self.is_loaded()).then(|| "state topic __mirror_state not loaded yet".to_string())
    }

    fn link_status(&self, link: &str) -> Option<LinkStatus> {
        self.status(link)
    }

    fn drained(&self, link: &str, failover_id: i64) -> Vec<String> {
        lock(&self.drained)
            .iter()
            .filter(|(k, v)| k.link == link && v.failover_id == failover_id)
            .map(|(k, _)| k.instance.clone())
            .collect()
    }

    fn barriers_of(&self, _link: &str) -> Vec<(BarrierKey, AppliedBarrier)> {
        Vec::new()
    }

    fn topic_name(&self, _id: Uuid) -> Option<String> {
        None
    }

    fn control_changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    async fn write_link_state(&self, link: &str, status: LinkStatus) -> Result<bool, ResolveError> {
        if lock(&self.failing_writes).pop_front().unwrap_or(false) {
            return Err(ResolveError::Write("broker down".into()));
        }
        let in_effect = self.status(link).map(|s| s.state);
        self.events.push(Event::Wrote {
            state: status.state,
            failover_id: status.failover_id,
            in_effect,
        });
        let foreign = std::mem::take(&mut *lock(&self.foreign));
        for f in foreign {
            self.apply_link(link, f);
        }
        self.apply_link(link, status);
        Ok(self.status(link) == Some(status))
    }

    async fn write_drained(
        &self,
        key: DrainedKey,
        value: DrainedValue,
    ) -> Result<(), ResolveError> {
        self.events.push(Event::Drained {
            instance: key.instance.clone(),
            failover_id: value.failover_id,
        });
        lock(&self.drained).insert(key, value);
        self.changed.send_modify(|n| *n += 1);
        Ok(())
    }

    fn lease(&self) -> Duration {
        LEASE
    }

    async fn forget_drained(&self, link: &str) -> Result<usize, ResolveError> {
        let mut drained = lock(&self.drained);
        let before = drained.len();
        drained.retain(|k, _| k.link != link);
        let n = before - drained.len();
        if n > 0 {
            self.events.push(Event::ForgotDrained(n));
        }
        Ok(n)
    }
}

struct FakeGroup {
    live: Vec<String>,
}

impl Group for FakeGroup {
    fn instance_id(&self) -> &str {
        "me"
    }

    async fn live_instances(&self) -> Result<Vec<String>, ClientError> {
        Ok(self.live.clone())
    }
}

/// Places barriers in `orders` 0 and 1 with scripted results (accepted
/// once a partition's script is used up).
struct FakePlacer {
    store: Arc<FakeStore>,
    events: Events,
    script: Mutex<HashMap<i32, VecDeque<BarrierResult>>>,
}

impl FakePlacer {
    fn script(&self, partition: i32, results: &[BarrierResult]) {
        lock(&self.script).insert(partition, results.iter().copied().collect());
    }
}

impl BarrierPlacer for FakePlacer {
    async fn partitions(&self, _link: &Link) -> Result<Vec<(String, i32)>, ClientError> {
        Ok(vec![("orders".into(), 1), ("orders".into(), 0)])
    }

    async fn place(
        &self,
        _link: &str,
        _source: &ClusterId,
        failover_id: i64,
        topic: &str,
        partition: i32,
    ) -> BarrierOutcome {
        let result = lock(&self.script)
            .get_mut(&partition)
            .and_then(VecDeque::pop_front)
            .unwrap_or(BarrierResult::Accepted);
        self.events.push(Event::Placed {
            topic: topic.to_string(),
            partition,
            failover_id,
            in_effect: self.store.status(LINK).map(|s| s.state),
            result,
        });
        let failed = result == BarrierResult::Failed;
        BarrierOutcome {
            topic: topic.to_string(),
            partition,
            result,
            error_code: if failed { -1 } else { 0 },
            message: failed.then(|| "scripted failure".to_string()),
            log_end_offset: if failed { -1 } else { 10 },
            expired_producers: 0,
            recorded_at_ms: if failed { -1 } else { now_ms() },
        }
    }
}

fn source() -> ClusterId {
    ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qk").unwrap()
}

/// A status as the proxy persists it (`link_state::consistent`).
fn status(state: LinkState, failover_id: i64) -> LinkStatus {
    let none = failover_id < 0;
    LinkStatus {
        state,
        since_ms: 1,
        source: source(),
        failover_id,
        failover_started_ms: if none { -1 } else { 1 },
        failover_finished_ms: if none || state == LinkState::Stopping {
            -1
        } else {
            2
        },
    }
}

struct Setup {
    control: Arc<Control<FakeStore, FakeGroup, FakePlacer>>,
    store: Arc<FakeStore>,
    placer: Arc<FakePlacer>,
    events: Events,
    link: Arc<Link>,
}

/// A control of link `east` (topic `orders`, initially MIRRORING) over a
/// loaded store holding `records`, with `live` instances ("me" is this one).
fn setup(live: &[&str], drain_timeout: Duration, records: &[LinkStatus]) -> Setup {
    let events = Events {
        start: tokio::time::Instant::now(),
        list: Arc::default(),
    };
    let store = Arc::new(FakeStore {
        loaded: AtomicBool::new(true),
        links: Mutex::default(),
        drained: Mutex::default(),
        changed: watch::Sender::new(0),
        events: events.clone(),
        failing_writes: Mutex::default(),
        foreign: Mutex::default(),
    });
    for r in records {
        store.apply_link(LINK, *r);
    }
    let group = Arc::new(FakeGroup {
        live: live.iter().map(|s| s.to_string()).collect(),
    });
    let placer = Arc::new(FakePlacer {
        store: Arc::clone(&store),
        events: events.clone(),
        script: Mutex::default(),
    });
    let link = Link::new(
        LINK.into(),
        source(),
        "mirror-east".into(),
        vec![Regex::new("^(?:orders)$").unwrap()],
        None,
        ControlBatchPolicy::Drop,
    );
    let links = Links::new(vec![link]);
    let link = Arc::clone(links.iter().next().unwrap());
    let control = Control::with(
        links,
        Some(Arc::clone(&store)),
        Some(group),
        Some(Arc::clone(&placer)),
        Arc::new(Metrics::new([LINK])),
        ReadOnlyError::PolicyViolation,
        drain_timeout,
        crate::net::tasks::Tasks::default(),
    );
    Setup {
        control,
        store,
        placer,
        events,
        link,
    }
}

const DRAIN: Duration = Duration::from_secs(30);
/// The fake store's lease: shorter than the drain timeouts of the tests
/// that do not look at it.
const LEASE: Duration = Duration::from_secs(3);
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn failover_writes_stopping_drains_places_barriers_then_writes_stopped() {
    let t = setup(&["me"], DRAIN, &[]);
    assert!(t.control.fenced(&t.link).is_none());
    let (_, message) = t.control.read_only("orders", 9).unwrap();
    assert!(message.contains("(MIRRORING)"), "{message}");
    t.control.start();

    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();

    assert!(complete, "{report:?}");
    let events = t.events.all();
    let [Event::Wrote {
        state: LinkState::Stopping,
        failover_id: id,
        in_effect: None,
    }, Event::Drained {
        instance,
        failover_id: drained_id,
    }, placed @ .., Event::Wrote {
        state: LinkState::Stopped,
        failover_id: stopped_id,
        in_effect: Some(LinkState::Stopping),
    }] = &events[..]
    else {
        panic!("STOPPING, drained, barriers, STOPPED expected: {events:#?}");
    };
    assert_eq!(
        (instance.as_str(), *drained_id, *stopped_id),
        ("me", *id, *id)
    );
    // Both partitions, once each, while STOPPING was in effect.
    let mut partitions: Vec<i32> = placed
        .iter()
        .map(|e| match e {
            Event::Placed {
                partition,
                failover_id,
                in_effect: Some(LinkState::Stopping),
                result: BarrierResult::Accepted,
                ..
            } if failover_id == id => *partition,
            other => panic!("a barrier of failover {id} while STOPPING expected: {other:?}"),
        })
        .collect();
    partitions.sort();
    assert_eq!(partitions, vec![0, 1]);

    assert_eq!(report.state, LinkState::Stopped);
    assert_eq!(failover_of(&report).id, *id);
    assert_eq!(failover_of(&report).partitions_done, 2);
    assert_eq!(
        failover_of(&report).unconfirmed_instances,
        Vec::<String>::new()
    );
    assert_eq!(failover_of(&report).error, None);
    assert!(t.control.read_only("orders", 9).is_none());
    let fenced = t.control.fenced(&t.link).unwrap();
    assert!(fenced.contains("(STOPPED)"), "{fenced}");
}

#[tokio::test(start_paused = true)]
async fn the_drain_wait_ends_when_every_live_instance_has_confirmed() {
    let t = setup(&["me", "peer"], DRAIN, &[]);
    t.control.start();
    let control = Arc::clone(&t.control);
    let failover = tokio::spawn(async move { control.failover(LINK, WAIT).await });

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(t.events.placed().is_empty(), "{:#?}", t.events.all());
    let id = t.store.status(LINK).unwrap().failover_id;
    t.store.apply_drained("peer", id);
    let (report, complete) = failover.await.unwrap().unwrap();

    assert!(complete, "{report:?}");
    let placed = t.events.placed();
    assert_eq!(placed.len(), 2, "{placed:?}");
    // Placed as the peer confirmed, long before the drain timeout.
    assert!(
        placed.iter().all(|(at, ..)| *at == Duration::from_secs(2)),
        "{placed:?}"
    );
    assert_eq!(
        failover_of(&report).unconfirmed_instances,
        Vec::<String>::new()
    );
}

#[tokio::test(start_paused = true)]
async fn the_drain_wait_ends_at_the_timeout_naming_the_unconfirmed() {
    let drain = Duration::from_secs(5);
    let t = setup(&["me", "peer"], drain, &[]);
    t.control.start();

    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();

    // The barriers are placed anyway, once the timeout is over.
    assert!(complete, "{report:?}");
    let placed = t.events.placed();
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert!(placed.iter().all(|(at, ..)| *at == drain), "{placed:?}");
    assert_eq!(failover_of(&report).unconfirmed_instances, vec!["peer"]);
}

#[tokio::test(start_paused = true)]
async fn failed_barriers_are_retried_then_reported_and_the_link_stays_stopping() {
    use BarrierResult::{Accepted, Failed};
    let t = setup(&["me"], DRAIN, &[]);
    t.placer.script(0, &[Failed, Failed, Accepted]);
    t.placer.script(1, &[Failed; 10]);
    t.control.start();

    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();

    assert!(!complete, "{report:?}");
    let attempts = |p: i32| -> Vec<(Duration, BarrierResult)> {
        t.events
            .placed()
            .into_iter()
            .filter(|(_, _, q, _)| *q == p)
            .map(|(at, _, _, r)| (at, r))
            .collect()
    };
    let p0 = attempts(0);
    assert_eq!(
        p0.iter().map(|a| a.1).collect::<Vec<_>>(),
        vec![Failed, Failed, Accepted]
    );
    let p1 = attempts(1);
    assert_eq!(p1.len(), BARRIER_ATTEMPTS as usize, "{p1:?}");
    assert!(p1.iter().all(|a| a.1 == Failed));
    for pair in p1.windows(2) {
        assert_eq!(pair[1].0 - pair[0].0, BARRIER_RETRY, "{p1:?}");
    }
    assert_eq!(
        failover_of(&report).error.as_deref(),
        Some("1 of 2 partition barrier(s) failed after 5 attempts each; the link stays STOPPING")
    );
    let results: Vec<BarrierState> = failover_of(&report)
        .partitions
        .iter()
        .map(|p| p.result)
        .collect();
    assert_eq!(results, vec![BarrierState::Accepted, BarrierState::Failed]);
    assert_eq!(report.state, LinkState::Stopping);
    assert!(!t.events.all().iter().any(|e| matches!(
        e,
        Event::Wrote {
            state: LinkState::Stopped,
            ..
        }
    )));
    let (_, message) = t.control.read_only("orders", 9).unwrap();
    assert!(message.contains("(STOPPING)"), "{message}");

    // Called again once the partition takes barriers, the same failover
    // resumes and finishes.
    t.placer.script(1, &[]);
    let id = t.store.status(LINK).unwrap().failover_id;
    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();
    assert!(complete, "{report:?}");
    assert_eq!(failover_of(&report).id, id);
    let stopping_writes = t
        .events
        .all()
        .iter()
        .filter(|e| {
            matches!(
                e,
                Event::Wrote {
                    state: LinkState::Stopping,
                    ..
                }
            )
        })
        .count();
    assert_eq!(stopping_writes, 1);
}

#[tokio::test(start_paused = true)]
async fn a_new_control_that_finds_a_link_stopping_resumes_its_failover() {
    // A previous process wrote STOPPING (failover 42) and died.
    let t = setup(&["me"], DRAIN, &[status(LinkState::Stopping, 42)]);
    t.store.loaded.store(false, Ordering::Release);
    t.control.start();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(t.events.all().is_empty(), "{:#?}", t.events.all());

    t.store.loaded.store(true, Ordering::Release);
    let mut waited = Duration::ZERO;
    while t.store.status(LINK).map(|s| s.state) != Some(LinkState::Stopped) {
        assert!(waited < WAIT, "not resumed: {:#?}", t.events.all());
        tokio::time::sleep(Duration::from_millis(100)).await;
        waited += Duration::from_millis(100);
    }

    let events = t.events.all();
    // The same failover, not a new one.
    assert!(
        events.contains(&Event::Drained {
            instance: "me".into(),
            failover_id: 42
        }),
        "{events:#?}"
    );
    for e in &events {
        match e {
            Event::Wrote {
                state: LinkState::Stopped,
                failover_id: 42,
                ..
            }
            | Event::Drained {
                failover_id: 42, ..
            }
            | Event::Placed {
                failover_id: 42,
                in_effect: Some(LinkState::Stopping),
                ..
            } => {}
            other => panic!("only failover 42's drain, barriers and STOPPED expected: {other:?}"),
        }
    }
    assert_eq!(t.events.placed().len(), 2, "{events:#?}");
    assert!(t.events.timed()[0].0 >= Duration::from_secs(1));
    assert!(t.control.read_only("orders", 9).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_failover_begun_after_this_instance_started_is_left_to_its_runner() {
    // Another instance begins failover 42 while this one loads the state
    // topic: it runs the failover; this one only drains.
    let t = setup(&["me"], DRAIN, &[]);
    t.store.loaded.store(false, Ordering::Release);
    t.control.start();
    let mut begun = status(LinkState::Stopping, 42);
    begun.failover_started_ms = crate::state::now_ms();
    t.store.apply_link(LINK, begun);
    t.store.loaded.store(true, Ordering::Release);
    tokio::time::sleep(Duration::from_secs(10)).await;

    let events = t.events.all();
    assert!(t.events.placed().is_empty(), "{events:#?}");
    assert!(
        !events.iter().any(|e| matches!(e, Event::Wrote { .. })),
        "{events:#?}"
    );
    assert!(
        events.contains(&Event::Drained {
            instance: "me".into(),
            failover_id: 42
        }),
        "{events:#?}"
    );
    assert_eq!(
        t.store.status(LINK).map(|s| s.state),
        Some(LinkState::Stopping)
    );
}

#[tokio::test(start_paused = true)]
async fn failover_and_start_are_refused_on_unknown_links_and_conflicting_states() {
    let t = setup(&["me"], DRAIN, &[]);
    let e = t.control.failover("west", WAIT).await.unwrap_err();
    assert!(matches!(e, ControlError::UnknownLink(_)), "{e:?}");
    assert_eq!(e.to_string(), "no mirror link named 'west'");
    let e = t.control.start_link(LINK, None).await.unwrap_err();
    assert!(
        matches!(
            e,
            ControlError::Conflict(Conflict::NotStopped {
                state: "MIRRORING",
                ..
            })
        ),
        "{e:?}"
    );

    t.store.loaded.store(false, Ordering::Release);
    let e = t.control.failover(LINK, WAIT).await.unwrap_err();
    assert!(matches!(e, ControlError::NotLoaded(_)), "{e:?}");
    assert!(e.to_string().contains("not loaded yet"), "{e}");

    let stopped = setup(&["me"], DRAIN, &[status(LinkState::Stopped, 7)]);
    let e = stopped.control.failover(LINK, WAIT).await.unwrap_err();
    assert!(
        matches!(
            e,
            ControlError::Conflict(Conflict::AlreadyStopped { failover_id: 7, .. })
        ),
        "{e:?}"
    );

    assert!(t.events.all().is_empty(), "{:#?}", t.events.all());
    assert!(
        stopped.events.all().is_empty(),
        "{:#?}",
        stopped.events.all()
    );
}

#[tokio::test(start_paused = true)]
async fn a_transition_not_written_does_not_take_effect() {
    let t = setup(&["me"], DRAIN, &[]);
    t.control.start();
    lock(&t.store.failing_writes).push_back(true);
    let e = t.control.failover(LINK, WAIT).await.unwrap_err();
    assert_eq!(
        e.to_string(),
        "writing the link state to the state topic failed: writing to the state topic failed: broker down"
    );
    assert!(t.events.all().is_empty(), "{:#?}", t.events.all());
    assert_eq!(t.control.status(&t.link).state, LinkState::Mirroring);
    assert!(t.control.fenced(&t.link).is_none());

    // STOPPING written, STOPPED not: the link stays STOPPING.
    lock(&t.store.failing_writes).extend([false, true]);
    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();
    assert!(!complete, "{report:?}");
    assert_eq!(report.state, LinkState::Stopping);
    assert_eq!(
        failover_of(&report).error.as_deref(),
        Some("persisting STOPPED: writing to the state topic failed: broker down")
    );
    assert_eq!(t.events.placed().len(), 2);
    assert!(t.control.read_only("orders", 9).is_some());
}

#[tokio::test(start_paused = true)]
async fn a_failover_that_loses_the_race_joins_the_winner_or_is_refused() {
    // Another instance's STOPPING lands first: this one runs that failover.
    let t = setup(&["me"], DRAIN, &[]);
    t.control.start();
    lock(&t.store.foreign).push(status(LinkState::Stopping, 99));
    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();
    assert!(complete, "{report:?}");
    assert_eq!(failover_of(&report).id, 99);
    let now = t.store.status(LINK).unwrap();
    assert_eq!((now.state, now.failover_id), (LinkState::Stopped, 99));
    assert_eq!(t.events.placed().len(), 2);

    // Another instance's whole failover lands first: a conflict.
    let t = setup(&["me"], DRAIN, &[]);
    lock(&t.store.foreign).extend([
        status(LinkState::Stopping, 99),
        status(LinkState::Stopped, 99),
    ]);
    let e = t.control.failover(LINK, WAIT).await.unwrap_err();
    assert!(
        matches!(
            e,
            ControlError::Conflict(Conflict::Raced {
                state: "STOPPED",
                ..
            })
        ),
        "{e:?}"
    );
    assert!(t.events.placed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_drained_record_waits_for_the_links_connections() {
    let t = setup(&["me"], DRAIN, &[]);
    let connection = t.control.link_session(LINK);
    t.control.start();
    t.store.apply_link(LINK, status(LinkState::Stopping, 5));

    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(t.events.all().is_empty(), "{:#?}", t.events.all());
    let report = t.control.link(LINK).unwrap();
    assert_eq!(report.counters.open_link_connections, 1);

    // The failover (resumed by this control: it found the link STOPPING)
    // goes on once the drained record is written, when the connection
    // closes.
    drop(connection);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let first = t.events.timed().into_iter().next();
    assert_eq!(
        first,
        Some((
            Duration::from_secs(2),
            Event::Drained {
                instance: "me".into(),
                failover_id: 5
            }
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn start_makes_a_stopped_link_mirroring_with_a_new_source() {
    let t = setup(&["me"], DRAIN, &[status(LinkState::Stopped, 7)]);
    let other = ClusterId::from_bytes([9; 16]);

    let report = t.control.start_link(LINK, Some(other)).await.unwrap();

    assert_eq!(report.state, LinkState::Mirroring);
    assert_eq!(report.source_cluster_id, other.to_string());
    assert_eq!(
        t.events.all(),
        vec![Event::Wrote {
            state: LinkState::Mirroring,
            failover_id: 7,
            in_effect: Some(LinkState::Stopped),
        }]
    );
    assert!(t.control.fenced(&t.link).is_none());
    assert!(t.control.read_only("orders", 9).is_some());
}

/// Issue 26 item 8: a drained record per instance and failover would stay
/// in the state topic for ever (instance ids are new with each process):
/// a new failover deletes the earlier ones' before it writes STOPPING.
#[tokio::test(start_paused = true)]
async fn a_new_failover_deletes_the_drained_records_of_the_last_one_first() {
    let t = setup(&["me"], DRAIN, &[]);
    t.control.start();
    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();
    assert!(complete, "{report:?}");
    t.control.start_link(LINK, None).await.unwrap();
    let first = t.events.all().len();

    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();

    assert!(complete, "{report:?}");
    let events = t.events.all();
    let [Event::ForgotDrained(1), Event::Wrote {
        state: LinkState::Stopping,
        in_effect: Some(LinkState::Mirroring),
        ..
    }, Event::Drained { instance, .. }, ..] = &events[first..]
    else {
        panic!("drained records deleted, then STOPPING and a drain: {events:#?}");
    };
    assert_eq!(instance, "me");
}

/// Issue 26 item 6: an instance that did not confirm the drain may be cut
/// off from the state topic; the barriers wait until its lease is out.
#[tokio::test(start_paused = true)]
async fn barriers_wait_out_the_lease_when_an_instance_did_not_confirm() {
    let t = setup(&["me", "peer"], Duration::from_secs(1), &[]);
    t.control.start();

    let (report, complete) = t.control.failover(LINK, WAIT).await.unwrap();

    assert!(complete, "{report:?}");
    let placed = t.events.placed();
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert!(placed.iter().all(|(at, ..)| *at == LEASE), "{placed:?}");
    assert_eq!(failover_of(&report).unconfirmed_instances, vec!["peer"]);
}

/// A failover that stopped short reports its cause, not only its context.
#[test]
fn a_failover_error_keeps_its_cause() {
    let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "broker 2 refused");
    let e = FailoverError::Partitions(crate::client::ClientError::Io {
        broker: "b2:9092".into(),
        source: io,
    });
    assert!(std::error::Error::source(&e).is_some());
    let chain = error_chain(&e);
    assert!(chain.starts_with("listing the link's topics: "), "{chain}");
    assert!(chain.contains("broker 2 refused"), "{chain}");
    // The cause is quoted once, not once per level.
    assert_eq!(chain.matches("broker 2 refused").count(), 1, "{chain}");
}

/// `orders`-`partition` mirrored with a delay of `delay_ms` on this instance.
fn mirrored(t: &Setup, partition: i32, delay_ms: i64) {
    let now = now_ms();
    let mut m = crate::metrics::mirrored::MirroredBatches::default();
    m.add(100, 5, 4, 0, false, now - delay_ms);
    t.control
        .metrics
        .link_mirror(LINK)
        .expect("the link's figures")
        .acknowledged(Some("orders"), partition, &m, 40, now);
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_reports_what_a_failover_would_do_and_changes_nothing() {
    use crate::control::api::{FailoverAction, LiveInstances, PartitionDelay};
    let t = setup(&["me", "peer"], DRAIN, &[]);
    mirrored(&t, 0, 90_000);
    let check = Precheck {
        max_delay: Some(Duration::from_secs(60)),
        force: false,
    };

    let dry = t.control.failover_dry_run(LINK, check).await.unwrap();

    assert_eq!(dry.state, LinkState::Mirroring);
    assert_eq!(dry.action, FailoverAction::Start);
    assert_eq!(dry.refused, None);
    assert!(!dry.would_proceed, "held back by max_delay: {dry:?}");
    assert_eq!(dry.max_delay_seconds, Some(60.0));
    assert_eq!(
        dry.over_max_delay,
        vec![PartitionDelay {
            topic: "orders".into(),
            partition: 0,
            delay_seconds: 90.0
        }]
    );
    assert_eq!(
        dry.live_instances,
        LiveInstances::Listed(vec!["me".into(), "peer".into()])
    );
    assert_eq!((dry.partitions_total, dry.partitions_without_delay), (2, 1));
    let rows: Vec<(i32, Option<f64>, Option<u64>)> = dry
        .partitions
        .iter()
        .map(|p| (p.partition, p.delay_seconds, p.records))
        .collect();
    assert_eq!(rows, vec![(0, Some(90.0), Some(5)), (1, None, None)]);
    assert_eq!(dry.partitions[0].last_offset, Some(44));
    assert!(t.events.all().is_empty(), "{:#?}", t.events.all());

    // Forced, it would proceed; a real failover is refused with the delays.
    let forced = Precheck {
        force: true,
        ..check
    };
    let dry = t.control.failover_dry_run(LINK, forced).await.unwrap();
    assert!(dry.would_proceed, "{dry:?}");
    assert!(t.control.check_failover(LINK, forced).is_ok());
    let e = t.control.check_failover(LINK, check).unwrap_err();
    assert!(matches!(e, ControlError::DelayTooHigh(_)), "{e:?}");
    assert_eq!(
        e.to_string(),
        "failover of link 'east' not started: 1 partition(s) have a replication delay above max_delay 60 s: orders-0 (90.000 s); retry once the replicator has caught up, or force it (force=true, --force)"
    );
}

#[tokio::test(start_paused = true)]
async fn a_dry_run_of_a_stopped_link_would_be_refused() {
    use crate::control::api::FailoverAction;
    let t = setup(&["me"], DRAIN, &[status(LinkState::Stopped, 7)]);
    let dry = t
        .control
        .failover_dry_run(LINK, Precheck::default())
        .await
        .unwrap();
    assert_eq!(dry.action, FailoverAction::Refuse);
    assert!(!dry.would_proceed);
    let why = dry.refused.expect("the reason it would be refused");
    assert!(why.contains("STOPPED"), "{why}");
}

#[test]
fn a_delay_refusal_names_twenty_partitions_and_counts_the_rest() {
    let over = (0..22).map(|p| (Arc::from("t"), p, 61.5)).collect();
    let e = DelayTooHigh {
        link: "east".into(),
        max: Duration::from_secs(60),
        over,
    };
    let message = e.to_string();
    assert!(
        message.contains(": t-0 (61.500 s), t-1 (61.500 s), "),
        "{message}"
    );
    assert!(
        message.contains("t-19 (61.500 s) and 2 more; retry"),
        "{message}"
    );
    assert!(!message.contains("t-20"), "{message}");
}

/// A failed state write keeps the store's error as its source.
#[test]
fn a_failed_link_state_write_keeps_its_cause() {
    let e = ControlError::Write(ResolveError::Write("broker down".into()));
    let source = std::error::Error::source(&e).expect("a source");
    assert_eq!(
        source.to_string(),
        "writing to the state topic failed: broker down"
    );
    assert_eq!(
        error_chain(&e),
        "writing the link state to the state topic failed: writing to the state topic failed: broker down"
    );
}
