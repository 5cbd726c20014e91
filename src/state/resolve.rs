//! Writing to the state topic and resolving new origins, apart from the
//! topic's I/O: a [`Log`] appends records (acks=all) and says when this
//! instance has applied them. [`super::StateStore`] is the real log; the
//! tests below use an in-memory one, so that what a resolve decides when
//! its claim wins, when another instance's claim lands first, when every
//! round is lost, and how concurrent requests share writes, is tested
//! without a broker.
//!
//! Resolves of different requests are grouped ([`Group`]): each request
//! queues its origins, and one of the waiting requests at a time (the one
//! holding the writer's lock) takes everything queued and resolves it in
//! one round of writes, so a burst of new producers costs a few state
//! writes rather than one write (and one read-back) per request.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Mutex, RwLockReadGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::{now_ms, ResolveError, APPLY_TIMEOUT, RESOLVE_ROUNDS};
use crate::metrics::StateMetrics;
use crate::mirror::origins::{OriginId, Origins, PartitionId, Proposal};
use crate::mirror::state_records::{CollisionValue, OriginValue, StateRecord};
use crate::sync::error_chain;

/// The state topic as one instance writes and follows it.
pub(crate) trait Log: Sync {
    /// Append `records` as one batch with acks=all; the offset of the first.
    fn append(
        &self,
        records: &[StateRecord],
    ) -> impl Future<Output = Result<i64, ResolveError>> + Send;

    /// Whether every record before offset `past` is applied to this
    /// instance's view within `timeout`.
    fn wait_applied(&self, past: i64, timeout: Duration) -> impl Future<Output = bool> + Send;

    /// The origins as applied so far (never held across an await).
    fn view(&self) -> RwLockReadGuard<'_, Origins>;
}

/// Write `records` in one batch and return once this instance has applied
/// them (so what it reads next includes them); the offset of the first.
/// Every write is timed, or counted and logged when it fails.
pub(crate) async fn write<L: Log>(
    log: &L,
    metrics: &StateMetrics,
    state_topic: &str,
    records: &[StateRecord],
) -> Result<i64, ResolveError> {
    let started = Instant::now();
    let result = append_applied(log, records).await;
    match &result {
        Ok(_) => metrics.write(started.elapsed().as_secs_f64()),
        Err(e) => {
            metrics.write_failed();
            tracing::warn!(topic = %state_topic, records = records.len(), error = %error_chain(e), "state topic write failed");
        }
    }
    result
}

async fn append_applied<L: Log>(log: &L, records: &[StateRecord]) -> Result<i64, ResolveError> {
    let base = log.append(records).await?;
    let past = base + records.len() as i64;
    if log.wait_applied(past, APPLY_TIMEOUT).await {
        Ok(base)
    } else {
        Err(ResolveError::Write(format!(
            "written at offset {base} but not read back within {} ms",
            APPLY_TIMEOUT.as_millis()
        )))
    }
}

/// One origin to resolve: its topic's name, its partition, the origin.
pub(crate) type Claim = (String, PartitionId, OriginId);

/// Claims (and salt records) per state-topic write: a write stays far
/// below the broker's default `max.message.bytes` (1 MiB), whatever a
/// burst of requests queued.
pub(crate) const CLAIMS_PER_WRITE: usize = 1000;

/// A request's origins waiting for a writer, and where its outcome goes.
struct Waiting {
    todo: Vec<Claim>,
    reply: oneshot::Sender<Vec<(Claim, ResolveError)>>,
}

/// The resolves of one instance: queued by every request, written by one
/// of them at a time. Two resolves of this instance never race with each
/// other (their proposals are made together, and never take one slot
/// twice), only with other instances'.
#[derive(Default)]
pub(crate) struct Group {
    queue: Mutex<Vec<Waiting>>,
    writing: tokio::sync::Mutex<()>,
}

impl Group {
    /// Held while this instance writes resolves; other writes of origin
    /// records (expiry) take it too, so they never interleave.
    pub(crate) async fn exclusive(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writing.lock().await
    }

    fn queue(&self) -> std::sync::MutexGuard<'_, Vec<Waiting>> {
        crate::sync::lock(&self.queue)
    }

    /// Resolve `todo` (see [`resolve`]) together with whatever other
    /// requests queued meanwhile; returns once this request's origins are
    /// persisted and applied, or with the ones that failed. Waits at most
    /// `bound` in all (then every origin fails, retriable).
    pub(crate) async fn resolve<L: Log>(
        &self,
        log: &L,
        metrics: &StateMetrics,
        state_topic: &str,
        todo: Vec<Claim>,
        random: impl FnMut() -> i64 + Send,
        bound: Duration,
    ) -> Vec<(String, i32, ResolveError)> {
        let mine: Vec<(String, i32)> = todo
            .iter()
            .map(|(t, p, _)| (t.clone(), p.partition))
            .collect();
        let outcome =
            tokio::time::timeout(bound, self.queued(log, metrics, state_topic, todo, random)).await;
        match outcome {
            Ok(failed) => failed
                .into_iter()
                .map(|((topic, p, _), e)| (topic, p.partition, e))
                .collect(),
            Err(_) => {
                let e = ResolveError::Write(format!(
                    "not resolved within {} ms (state writes queued ahead)",
                    bound.as_millis()
                ));
                mine.into_iter().map(|(t, p)| (t, p, e.clone())).collect()
            }
        }
    }

    async fn queued<L: Log>(
        &self,
        log: &L,
        metrics: &StateMetrics,
        state_topic: &str,
        todo: Vec<Claim>,
        mut random: impl FnMut() -> i64 + Send,
    ) -> Vec<(Claim, ResolveError)> {
        loop {
            let (reply, mut outcome) = oneshot::channel();
            self.queue().push(Waiting {
                todo: todo.clone(),
                reply,
            });
            loop {
                tokio::select! {
                    biased;
                    r = &mut outcome => match r {
                        Ok(failed) => return failed,
                        // The request writing it was cancelled before it
                        // answered: queue again (a claim it wrote is found
                        // applied, or proposed again).
                        Err(_) => break,
                    },
                    _writer = self.writing.lock() => {
                        if let Ok(failed) = outcome.try_recv() {
                            return failed;
                        }
                        let batch = std::mem::take(&mut *self.queue());
                        self.write_batch(log, metrics, state_topic, batch, &mut random).await;
                        // Ours was in the batch (or taken by an earlier
                        // writer): its outcome is sent, or its sender gone.
                    }
                }
            }
        }
    }

    /// Resolve every queued request's origins together, and answer each.
    async fn write_batch<L: Log>(
        &self,
        log: &L,
        metrics: &StateMetrics,
        state_topic: &str,
        batch: Vec<Waiting>,
        random: impl FnMut() -> i64 + Send,
    ) {
        if batch.is_empty() {
            return;
        }
        let mut all: Vec<Claim> = Vec::new();
        let mut seen = HashSet::new();
        for w in &batch {
            for c in &w.todo {
                if seen.insert((c.1, c.2)) {
                    all.push(c.clone());
                }
            }
        }
        let failed: HashMap<(PartitionId, OriginId), ResolveError> =
            resolve(log, metrics, state_topic, all, random)
                .await
                .into_iter()
                .map(|((_, p, o), e)| ((p, o), e))
                .collect();
        for w in batch {
            let mine = w
                .todo
                .into_iter()
                .filter_map(|c| {
                    let e = failed.get(&(c.1, c.2))?.clone();
                    Some((c, e))
                })
                .collect();
            // A waiter that gave up (timed out, cancelled) is not waiting.
            let _ = w.reply.send(mine);
        }
    }
}

/// Give every origin of `todo` (topic name, partition, origin) a mapped
/// PID: propose a slot (salted if its natural one is held), write the claim
/// and any salt record, wait until applied, and check that the claim owns
/// the slot; an origin whose claim lost to an earlier one is proposed again,
/// at most [`RESOLVE_ROUNDS`] times. The claims of a round go in writes of
/// at most [`CLAIMS_PER_WRITE`]. Returns the origins that could not be
/// resolved, with why. `random` draws salts. The caller makes sure no
/// other resolve of this instance runs meanwhile ([`Group`]).
pub(crate) async fn resolve<L: Log>(
    log: &L,
    metrics: &StateMetrics,
    state_topic: &str,
    mut todo: Vec<Claim>,
    mut random: impl FnMut() -> i64 + Send,
) -> Vec<(Claim, ResolveError)> {
    let mut failed = Vec::new();
    for _ in 0..RESOLVE_ROUNDS {
        // Propose under the read lock, write without it.
        let now = now_ms();
        let mut proposals: Vec<(String, PartitionId, OriginId, Proposal)> = Vec::new();
        {
            let view = log.view();
            let mut taken = HashSet::new();
            for (topic, p, o) in todo.drain(..) {
                if view.lookup(p, o, now).is_some() {
                    continue; // resolved meanwhile (another request, another instance)
                }
                match view.propose(p, o, &taken, &mut random) {
                    Ok(proposal) => {
                        taken.insert((p, proposal.mapped));
                        proposals.push((topic, p, o, proposal));
                    }
                    Err(e) => failed.push(((topic, p, o), ResolveError::NoSlot(e))),
                }
            }
        }
        if proposals.is_empty() {
            return failed;
        }
        // Written chunk by chunk; a failed write fails its chunk and every
        // later one (not written), and ends the resolve once the written
        // chunks are checked: the requests' clients retry.
        let mut written = Vec::new();
        let mut write_failed: Option<ResolveError> = None;
        let mut chunks = proposals.into_iter().peekable();
        while chunks.peek().is_some() {
            let chunk: Vec<_> = chunks.by_ref().take(CLAIMS_PER_WRITE).collect();
            if let Some(e) = &write_failed {
                for (topic, p, o, _) in chunk {
                    failed.push(((topic, p, o), e.clone()));
                }
                continue;
            }
            match write(log, metrics, state_topic, &claim_records(&chunk, now)).await {
                Ok(_) => {
                    metrics.origins_persisted(chunk.len() as u64);
                    written.extend(chunk);
                }
                Err(e) => {
                    for (topic, p, o, _) in chunk {
                        failed.push(((topic, p, o), e.clone()));
                    }
                    write_failed = Some(e);
                }
            }
        }
        let view = log.view();
        for (topic, p, o, proposal) in written {
            if view.lookup(p, o, now) == Some(proposal.mapped) {
                if let Some((cause, colliding)) = proposal.collision {
                    metrics.collision(cause.label());
                    tracing::info!(
                        topic = %topic,
                        partition = p.partition,
                        topic_id = %p.topic_id,
                        source_cluster = %o.source,
                        pid = o.pid,
                        colliding_cluster = %colliding,
                        colliding_pid = ?proposal.held_by.map(|w| w.pid),
                        cause = cause.label(),
                        salt = proposal.salt,
                        mapped_pid = proposal.mapped,
                        "producer id collision resolved with a salt"
                    );
                }
            } else {
                let owner = view.owner(p, proposal.mapped);
                tracing::info!(
                    topic = %topic,
                    partition = p.partition,
                    source_cluster = %o.source,
                    pid = o.pid,
                    mapped_pid = proposal.mapped,
                    owner = ?owner,
                    "lost the race for a mapped producer id to an earlier claim; resolving again"
                );
                todo.push((topic, p, o));
            }
        }
        if let Some(e) = write_failed {
            drop(view);
            for (topic, p, o) in todo {
                failed.push(((topic, p, o), e.clone()));
            }
            return failed;
        }
    }
    for c in todo {
        failed.push((c, ResolveError::TooManyRaces));
    }
    failed
}

/// The records of `proposals`: each claim, after its salt record if any.
fn claim_records(
    proposals: &[(String, PartitionId, OriginId, Proposal)],
    now: i64,
) -> Vec<StateRecord> {
    let mut records = Vec::new();
    for (_, p, o, proposal) in proposals {
        if let Some((_, colliding)) = proposal.collision {
            records.push(StateRecord::Collision(
                o.key(*p),
                Some(CollisionValue {
                    salt: proposal.salt,
                    colliding,
                    timestamp_ms: now,
                }),
            ));
        }
        records.push(StateRecord::Origin(
            o.key(*p),
            Some(OriginValue {
                mapped_pid: proposal.mapped,
                salt: proposal.salt,
                claim_offset: -1,
                last_seen_ms: now,
            }),
        ));
    }
    records
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Mutex, RwLock};

    use uuid::Uuid;

    use super::*;
    use crate::metrics::Metrics;
    use crate::mirror::origins::compose;
    use crate::mirror::pid::{cluster_hash, ClusterId};

    /// The state topic in memory: appends get the next offsets; what is
    /// appended reaches the view only when a writer waits for it, as with
    /// the real tailer. Another instance's claims can be scripted to land
    /// just before each of ours.
    struct MemoryLog {
        log: Mutex<Vec<StateRecord>>,
        view: RwLock<Origins>,
        applied: Mutex<usize>,
        /// Each of our appends, in order.
        ours: Mutex<Vec<Vec<StateRecord>>>,
        /// Origins of other instances: the next one claims the slot of our
        /// next claim just before it is appended.
        rivals: Mutex<VecDeque<OriginId>>,
        /// Whether the tailer catches up with a write (else it never does).
        tails: bool,
        /// If set, each append first takes a permit (the test releases
        /// writes one by one to hold one in flight).
        gate: Option<tokio::sync::Semaphore>,
        /// Appends from this one on (counting from 0) are refused.
        fail_from: usize,
        /// Appends started.
        appends: Mutex<usize>,
    }

    impl MemoryLog {
        fn new(rivals: Vec<OriginId>) -> MemoryLog {
            MemoryLog {
                log: Mutex::new(Vec::new()),
                view: RwLock::new(Origins::default()),
                applied: Mutex::new(0),
                ours: Mutex::new(Vec::new()),
                rivals: Mutex::new(rivals.into()),
                tails: true,
                gate: None,
                fail_from: usize::MAX,
                appends: Mutex::new(0),
            }
        }

        fn gated(rivals: Vec<OriginId>) -> MemoryLog {
            MemoryLog {
                gate: Some(tokio::sync::Semaphore::new(0)),
                ..MemoryLog::new(rivals)
            }
        }

        fn release(&self, writes: usize) {
            if let Some(g) = &self.gate {
                g.add_permits(writes);
            }
        }

        fn ours(&self) -> Vec<Vec<StateRecord>> {
            self.ours.lock().unwrap().clone()
        }
    }

    impl Log for MemoryLog {
        async fn append(&self, records: &[StateRecord]) -> Result<i64, ResolveError> {
            let n = {
                let mut appends = self.appends.lock().unwrap();
                *appends += 1;
                *appends - 1
            };
            if let Some(g) = &self.gate {
                g.acquire().await.unwrap().forget();
            }
            if n >= self.fail_from {
                return Err(ResolveError::Write("refused with error 7".into()));
            }
            let mut log = self.log.lock().unwrap();
            let claim = records.iter().find_map(|r| match r {
                StateRecord::Origin(k, Some(v)) => Some((*k, *v)),
                _ => None,
            });
            if let (Some((key, value)), Some(rival)) =
                (claim, self.rivals.lock().unwrap().pop_front())
            {
                let key = crate::mirror::state_records::OriginKey {
                    source: rival.source,
                    original_pid: rival.pid,
                    ..key
                };
                log.push(StateRecord::Origin(key, Some(value)));
            }
            let base = log.len() as i64;
            log.extend(records.iter().cloned());
            self.ours.lock().unwrap().push(records.to_vec());
            Ok(base)
        }

        async fn wait_applied(&self, past: i64, _timeout: Duration) -> bool {
            if !self.tails {
                return false;
            }
            let log = self.log.lock().unwrap();
            let mut applied = self.applied.lock().unwrap();
            let mut view = self.view.write().unwrap();
            while (*applied as i64) < past && *applied < log.len() {
                view.apply(*applied as i64, &log[*applied]);
                *applied += 1;
            }
            *applied as i64 >= past
        }

        fn view(&self) -> RwLockReadGuard<'_, Origins> {
            self.view.read().unwrap()
        }
    }

    fn cluster(n: u128) -> ClusterId {
        ClusterId::from_bytes(n.to_be_bytes())
    }

    const PARTITION: PartitionId = PartitionId {
        topic_id: Uuid::from_u128(7),
        partition: 3,
    };

    fn ours() -> OriginId {
        OriginId {
            source: cluster(0xA),
            pid: 5,
        }
    }

    fn todo() -> Vec<(String, PartitionId, OriginId)> {
        vec![("orders".to_string(), PARTITION, ours())]
    }

    /// Salts in order (none of them moves cluster 0xA into a region of a
    /// cluster the tests use).
    fn salts() -> impl FnMut() -> i64 + Send {
        let mut next = 0x100;
        move || {
            next += 0x100;
            next
        }
    }

    /// The value of the series `name` in the metrics text.
    fn sample(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    fn claims(batch: &[StateRecord]) -> Vec<(OriginId, i64, i64)> {
        batch
            .iter()
            .filter_map(|r| match r {
                StateRecord::Origin(k, Some(v)) => Some((
                    OriginId {
                        source: k.source,
                        pid: k.original_pid,
                    },
                    v.mapped_pid,
                    v.salt,
                )),
                _ => None,
            })
            .collect()
    }

    fn natural() -> i64 {
        compose(cluster_hash(&cluster(0xA)), 5)
    }

    /// Another origin whose every mapping is ours: a cluster of the same
    /// hash (the same bit flipped in two of the id's 32-bit words, which
    /// the hash folds together), the same PID. `n` picks one of eight.
    fn rival(n: usize) -> OriginId {
        let mut id = 0xAu128.to_be_bytes();
        id[n % 8] ^= 1;
        id[n % 8 + 8] ^= 1;
        let source = ClusterId::from_bytes(id);
        assert_eq!(cluster_hash(&source), cluster_hash(&cluster(0xA)));
        OriginId { source, pid: 5 }
    }

    #[tokio::test]
    async fn a_claim_that_wins_its_slot_takes_one_write() {
        let log = MemoryLog::new(Vec::new());
        let metrics = Metrics::default();
        let failed = resolve(&log, &metrics.state, "__mirror_state", todo(), salts()).await;
        assert!(failed.is_empty(), "{failed:?}");
        let writes = log.ours();
        assert_eq!(writes.len(), 1, "{writes:?}");
        // The natural slot, no salt, no collision record.
        assert_eq!(claims(&writes[0]), vec![(ours(), natural(), 0)]);
        assert_eq!(writes[0].len(), 1, "{writes:?}");
        assert_eq!(
            log.view().lookup(PARTITION, ours(), now_ms()),
            Some(natural())
        );
        let text = metrics.render();
        assert_eq!(
            sample(&text, "kafka_mirror_proxy_state_origins_persisted_total"),
            Some(1.0),
            "{text}"
        );
    }

    #[tokio::test]
    async fn a_claim_that_lost_the_race_is_proposed_again_with_a_salt() {
        let rival = rival(0);
        let log = MemoryLog::new(vec![rival]);
        let metrics = Metrics::default();
        let failed = resolve(&log, &metrics.state, "__mirror_state", todo(), salts()).await;
        assert!(failed.is_empty(), "{failed:?}");
        let writes = log.ours();
        assert_eq!(writes.len(), 2, "{writes:?}");
        assert_eq!(claims(&writes[0]), vec![(ours(), natural(), 0)]);
        // The second round sees the slot held by the rival: a salted slot,
        // with its collision record naming the rival's cluster.
        let [(origin, mapped, salt)] = claims(&writes[1])[..] else {
            panic!("one claim in {writes:?}");
        };
        assert_eq!(origin, ours());
        assert_ne!(salt, 0);
        assert_ne!(mapped, natural());
        assert!(
            writes[1].iter().any(|r| matches!(
                r,
                StateRecord::Collision(k, Some(v))
                    if k.original_pid == 5 && v.salt == salt && v.colliding == rival.source
            )),
            "{writes:?}"
        );
        let view = log.view();
        assert_eq!(view.lookup(PARTITION, ours(), now_ms()), Some(mapped));
        assert_eq!(view.owner(PARTITION, natural()), Some(rival));
        let text = metrics.render();
        assert_eq!(
            sample(
                &text,
                "kafka_mirror_proxy_state_collisions_resolved_total{cause=\"hash\"}"
            ),
            Some(1.0),
            "{text}"
        );
    }

    #[tokio::test]
    async fn every_round_lost_is_too_many_races() {
        let rivals = (0..RESOLVE_ROUNDS).map(rival).collect();
        let log = MemoryLog::new(rivals);
        let metrics = Metrics::default();
        let failed = resolve(&log, &metrics.state, "__mirror_state", todo(), salts()).await;
        assert_eq!(log.ours().len(), RESOLVE_ROUNDS);
        let [((topic, partition, _), e)] = &failed[..] else {
            panic!("one failure in {failed:?}");
        };
        assert_eq!((topic.as_str(), *partition), ("orders", PARTITION));
        assert!(matches!(e, ResolveError::TooManyRaces), "{e:?}");
        assert_eq!(e.to_string(), "lost the race for a slot 5 times");
        assert_eq!(log.view().lookup(PARTITION, ours(), now_ms()), None);
    }

    #[tokio::test]
    async fn an_origin_resolved_meanwhile_is_not_written_again() {
        let log = MemoryLog::new(Vec::new());
        let metrics = Metrics::default();
        // Another instance claimed it (with a salt of its own) first.
        let theirs = compose(
            crate::mirror::origins::salted_region(cluster_hash(&ours().source), 9),
            ours().pid,
        );
        log.log.lock().unwrap().push(StateRecord::Origin(
            ours().key(PARTITION),
            Some(OriginValue {
                mapped_pid: theirs,
                salt: 9,
                claim_offset: -1,
                last_seen_ms: now_ms(),
            }),
        ));
        assert!(log.wait_applied(1, APPLY_TIMEOUT).await);
        let failed = resolve(&log, &metrics.state, "__mirror_state", todo(), salts()).await;
        assert!(failed.is_empty(), "{failed:?}");
        assert!(log.ours().is_empty(), "{:?}", log.ours());
        assert_eq!(log.view().lookup(PARTITION, ours(), now_ms()), Some(theirs));
    }

    #[tokio::test]
    async fn a_write_never_read_back_fails_the_partition() {
        let log = MemoryLog {
            tails: false,
            ..MemoryLog::new(Vec::new())
        };
        let metrics = Metrics::default();
        let failed = resolve(&log, &metrics.state, "__mirror_state", todo(), salts()).await;
        let [((_, PARTITION, _), ResolveError::Write(why))] = &failed[..] else {
            panic!("one write failure in {failed:?}");
        };
        assert_eq!(why, "written at offset 0 but not read back within 10000 ms");
        // One write, not retried: the caller's client retries the request.
        assert_eq!(log.ours().len(), 1);
        let text = metrics.render();
        assert_eq!(
            sample(&text, "kafka_mirror_proxy_state_write_failures_total"),
            Some(1.0),
            "{text}"
        );
    }

    const BOUND: Duration = Duration::from_secs(60);

    /// Cluster 0xA's producer `pid` on [`PARTITION`].
    fn producer(pid: i64) -> Claim {
        let origin = OriginId {
            source: cluster(0xA),
            pid,
        };
        ("orders".to_string(), PARTITION, origin)
    }

    #[tokio::test]
    async fn requests_queued_during_a_write_share_the_next_one() {
        let log = MemoryLog::gated(Vec::new());
        let metrics = Metrics::default();
        let group = Group::default();
        let resolve = |todo| group.resolve(&log, &metrics.state, "s", todo, salts(), BOUND);
        let release = async {
            // The first request's write is in flight; the other two queued.
            assert_eq!(*log.appends.lock().unwrap(), 1);
            assert_eq!(group.queue().len(), 2);
            log.release(10);
        };
        let (x, a, b, ()) = tokio::join!(
            resolve(vec![producer(1)]),
            resolve(vec![producer(2)]),
            resolve(vec![producer(3), producer(4)]),
            release
        );
        assert!(
            x.is_empty() && a.is_empty() && b.is_empty(),
            "{x:?} {a:?} {b:?}"
        );
        let writes = log.ours();
        assert_eq!(writes.len(), 2, "{writes:?}");
        let second: Vec<i64> = claims(&writes[1]).iter().map(|(o, _, _)| o.pid).collect();
        assert_eq!(second, vec![2, 3, 4]);
        let view = log.view();
        for pid in 1..=4 {
            assert!(view.lookup(PARTITION, producer(pid).2, now_ms()).is_some());
        }
    }

    #[tokio::test]
    async fn a_failed_write_fails_every_request_in_it() {
        let log = MemoryLog {
            fail_from: 1,
            ..MemoryLog::gated(Vec::new())
        };
        let metrics = Metrics::default();
        let group = Group::default();
        let resolve = |todo| group.resolve(&log, &metrics.state, "s", todo, salts(), BOUND);
        let (x, a, b, ()) = tokio::join!(
            resolve(vec![producer(1)]),
            resolve(vec![producer(2)]),
            resolve(vec![producer(3)]),
            async { log.release(10) }
        );
        assert!(x.is_empty(), "{x:?}");
        for failed in [a, b] {
            let [(_, 3, ResolveError::Write(why))] = &failed[..] else {
                panic!("one write failure in {failed:?}");
            };
            assert_eq!(why, "refused with error 7");
        }
        // Two appends: the first request's, then one for both others.
        assert_eq!(*log.appends.lock().unwrap(), 2);
        let view = log.view();
        assert!(view.lookup(PARTITION, producer(2).2, now_ms()).is_none());
        assert!(view.lookup(PARTITION, producer(3).2, now_ms()).is_none());
    }

    #[tokio::test]
    async fn requests_written_together_never_share_a_slot() {
        let log = MemoryLog::gated(Vec::new());
        let metrics = Metrics::default();
        let group = Group::default();
        let resolve = |todo| group.resolve(&log, &metrics.state, "s", todo, salts(), BOUND);
        let theirs = ("orders".to_string(), PARTITION, rival(0));
        // Both want the natural slot of (0xA, 5); the second also asks for
        // the first one's origin, which is claimed once.
        let (x, a, b, ()) = tokio::join!(
            resolve(vec![producer(1)]),
            resolve(vec![producer(5)]),
            resolve(vec![theirs.clone(), producer(5)]),
            async { log.release(10) }
        );
        assert!(
            x.is_empty() && a.is_empty() && b.is_empty(),
            "{x:?} {a:?} {b:?}"
        );
        let writes = log.ours();
        assert_eq!(writes.len(), 2, "{writes:?}");
        let second = claims(&writes[1]);
        assert_eq!(second.len(), 2, "{writes:?}");
        assert_eq!(second[0], (ours(), natural(), 0));
        assert_eq!(second[1].0, rival(0));
        assert_ne!(second[1].1, natural());
        let view = log.view();
        assert_eq!(view.lookup(PARTITION, ours(), now_ms()), Some(natural()));
        assert_eq!(
            view.lookup(PARTITION, rival(0), now_ms()),
            Some(second[1].1)
        );
    }

    #[tokio::test]
    async fn a_request_whose_writer_was_cancelled_writes_its_own() {
        let log = MemoryLog::gated(Vec::new());
        let metrics = Metrics::default();
        let group = Group::default();
        let resolve = |todo| group.resolve(&log, &metrics.state, "s", todo, salts(), BOUND);
        let mut x = Box::pin(resolve(vec![producer(1)]));
        let mut a = Box::pin(resolve(vec![producer(2)]));
        let mut b = Box::pin(resolve(vec![producer(3)]));
        // x writes (held); a and b queue.
        for f in [&mut x, &mut a, &mut b] {
            assert!(futures_poll(f).await.is_none());
        }
        log.release(1);
        assert_eq!(futures_poll(&mut x).await, Some(()));
        // a takes both queued requests and is cancelled in its write.
        assert!(futures_poll(&mut a).await.is_none());
        assert_eq!(*log.appends.lock().unwrap(), 2);
        drop(a);
        log.release(10);
        let b = b.await;
        assert!(b.is_empty(), "{b:?}");
        assert!(log
            .view()
            .lookup(PARTITION, producer(3).2, now_ms())
            .is_some());
    }

    /// Poll `f` a few times (letting the others run between): `Some` once
    /// it is ready.
    async fn futures_poll<F: Future + Unpin>(f: &mut F) -> Option<()> {
        for _ in 0..10 {
            let ready = std::future::poll_fn(|cx| {
                std::task::Poll::Ready(std::pin::Pin::new(&mut *f).poll(cx).is_ready())
            })
            .await;
            if ready {
                return Some(());
            }
            tokio::task::yield_now().await;
        }
        None
    }
}
