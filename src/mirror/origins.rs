//! Origins of mapped producer ids, per destination partition: the view the
//! Produce path consults, built by applying the `__mirror_state` records
//! in topic order. Pure: records in, answers out.
//!
//! An *origin* is (source cluster id, PID as the source wrote it); for an
//! already-negative PID arriving through a chain it is (the link's source
//! cluster id, the PID as received). Every origin holds a *claim* on one
//! mapped PID (its *slot*) in a partition. When two origins claim one slot,
//! the claim with the lower effective claim offset owns it (its
//! `ClaimOffset`, or the offset of its own record when that is -1): the
//! state topic's order decides, the same way on every instance. The loser
//! is not [`Origins::lookup`]-able and re-resolves.
//!
//! Salt formula (SPEC §5, `docs/state-topic.md`):
//!
//! ```text
//! fold32(s)      = (s as u64 low 32 bits) XOR (s as u64 high 32 bits)
//! salted region  = cluster_hash(source) XOR fold32(salt), fold32(salt) != 0
//! mapped         = 1 << 63 | region << 31 | (pid & 0x7FFF_FFFF)
//! ```
//!
//! A salt is retried until the mapped PID is not -1, its slot is free in the
//! partition, and the region is not the natural region of any known cluster.

// foldhash: looked up for every mirrored batch; SipHash showed in profiles.
use foldhash::{HashMap, HashSet};
use smallvec::SmallVec;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicI64, Ordering};

use uuid::Uuid;

use crate::mirror::pid::{cluster_hash, map_pid, ClusterId, Mapping, Unplaceable, NO_PRODUCER_ID};
use crate::mirror::state_records::{CollisionValue, OriginKey, OriginValue, StateRecord};

const IDENTITY_MASK: i64 = 0x7FFF_FFFF;
const SIGN: u64 = 1 << 63;
/// Random salts tried before giving up on one origin (each try fails only
/// on a taken slot or a known region: practically never more than a few).
const SALT_ATTEMPTS: usize = 1000;

/// The claimants of one slot: (effective claim offset, origin), sorted.
type Claimants = SmallVec<[(i64, OriginId); 1]>;

/// A destination partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartitionId {
    pub topic_id: Uuid,
    pub partition: i32,
}

/// Who a mapped PID stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OriginId {
    pub source: ClusterId,
    pub pid: i64,
}

impl OriginId {
    pub fn key(&self, p: PartitionId) -> OriginKey {
        OriginKey {
            topic_id: p.topic_id,
            partition: p.partition,
            source: self.source,
            original_pid: self.pid,
        }
    }
}

/// `(s low 32 bits) XOR (s high 32 bits)`.
pub(crate) fn fold32(salt: i64) -> u32 {
    let s = salt as u64;
    (s as u32) ^ ((s >> 32) as u32)
}

/// The region a salt moves a cluster's PIDs to.
pub(crate) fn salted_region(hash: u32, salt: i64) -> u32 {
    hash ^ fold32(salt)
}

/// Whether `v` maps `k` as the proxy would: to the PID its salt gives
/// (without a salt, the natural mapping; a chain's own PID), below -1. A
/// record written by anything else (a forged one: any non-negative PID, -1,
/// another cluster's region) claims nothing.
pub(crate) fn is_valid_mapping(k: &OriginKey, v: &OriginValue) -> bool {
    let hash = cluster_hash(&k.source);
    let expected = match (v.salt, k.original_pid) {
        (0, pid) if pid < 0 => pid,
        (0, pid) => match map_pid(hash, pid) {
            Mapping::Mapped(m) => m,
            _ => return false,
        },
        (salt, pid) => compose(salted_region(hash, salt), pid),
    };
    v.mapped_pid == expected && expected < NO_PRODUCER_ID
}

/// `sign | region << 31 | identity`.
pub fn compose(region: u32, pid: i64) -> i64 {
    (SIGN | u64::from(region) << 31 | (pid & IDENTITY_MASK) as u64) as i64
}

/// What made an origin need a salt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    /// Its natural slot is held by another origin.
    Hash,
    /// PID >= 2^31: the identity field cannot hold it.
    OversizedPid,
    /// The natural mapping is -1 ("no producer").
    MinusOne,
}

impl Cause {
    pub(crate) fn label(self) -> &'static str {
        match self {
            Cause::Hash => "hash",
            Cause::OversizedPid => "oversized_pid",
            Cause::MinusOne => "minus_one",
        }
    }
}

/// A slot an origin may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proposal {
    pub mapped: i64,
    /// 0: natural (unsalted).
    pub salt: i64,
    /// A new collision (a salt record must be written), with the cluster
    /// that held the slot (the source itself for oversized/-1).
    pub collision: Option<(Cause, ClusterId)>,
    /// For a hash collision: the origin that owns the natural slot (none
    /// when another origin of the same write proposed it).
    pub held_by: Option<OriginId>,
}

/// No salt found a free slot in `SALT_ATTEMPTS` tries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "no free slot found for producer id {pid} of cluster {cluster} after {SALT_ATTEMPTS} salts"
)]
pub struct NoSlot {
    pub cluster: ClusterId,
    pub pid: i64,
}

/// One origin's claim.
#[derive(Debug)]
pub(crate) struct Claim {
    pub mapped: i64,
    pub salt: i64,
    /// Effective claim offset (never -1).
    pub claim_offset: i64,
    /// Last-seen time in the state topic.
    pub persisted_last_seen_ms: i64,
    /// Last-seen time here (coarse; touched by lookups).
    last_seen_ms: AtomicI64,
}

impl Claim {
    pub(crate) fn last_seen_ms(&self) -> i64 {
        self.last_seen_ms.load(Ordering::Relaxed)
    }
}

/// Tombstones remembered to ignore refreshes that raced them (about
/// 100 bytes each).
pub(crate) const MAX_TOMBSTONES: usize = 100_000;

/// The view.
#[derive(Debug, Default)]
pub struct Origins {
    claims: HashMap<(PartitionId, OriginId), Claim>,
    /// Claimants of each slot, sorted by effective claim offset: the first
    /// owns it. Nearly every slot has one claimant, held inline: a `Vec`
    /// would be a heap block of four per origin (a third of its memory).
    slots: HashMap<(PartitionId, i64), Claimants>,
    salts: HashMap<(PartitionId, OriginId), CollisionValue>,
    /// Offset of the last tombstone of an origin's claim, so that a refresh
    /// written before it was seen does not bring a dead claim back. Only
    /// the latest [`MAX_TOMBSTONES`] are kept: a refresh races a tombstone
    /// for the time an instance takes to read the topic, not for ever.
    tombstones: HashMap<(PartitionId, OriginId), i64>,
    /// The same tombstones in the order applied (offsets ascending), to
    /// forget the oldest.
    tombstone_order: VecDeque<(i64, (PartitionId, OriginId))>,
    /// Origins whose latest record is a refresh of a tombstoned claim. In
    /// the log, compaction would keep that refresh and drop the tombstone,
    /// bringing the dead claim back on the next load: they are tombstoned
    /// again (see [`Origins::take_stale_refreshes`]).
    stale_refreshes: HashSet<(PartitionId, OriginId)>,
    clusters: HashSet<ClusterId>,
    regions: HashSet<u32>,
}

impl Origins {
    /// A view that knows the configured links' source clusters.
    pub fn new(configured: impl IntoIterator<Item = ClusterId>) -> Origins {
        let mut o = Origins::default();
        for c in configured {
            o.know_cluster(c);
        }
        o
    }

    /// Count `c` among the known source clusters (its natural region is
    /// then never a salted origin's).
    pub(crate) fn know_cluster(&mut self, c: ClusterId) {
        if self.clusters.insert(c) {
            self.regions.insert(cluster_hash(&c));
        }
    }

    /// Whether `region` is the natural region of a known cluster.
    pub(crate) fn is_natural_region(&self, region: u32) -> bool {
        self.regions.contains(&region)
    }

    /// Claims held (owners and losers).
    pub fn len(&self) -> usize {
        self.claims.len()
    }

    pub fn is_empty(&self) -> bool {
        self.claims.is_empty()
    }

    /// Apply one state record found at `offset`.
    /// Returns `false` for a record it skipped: an origin whose mapped PID
    /// is not one the proxy could have written (see `is_valid_mapping`),
    /// or a salt that leaves the region unchanged (the proxy draws salts
    /// whose `fold32` is not 0).
    pub fn apply(&mut self, offset: i64, record: &StateRecord) -> bool {
        match *record {
            StateRecord::Origin(ref k, Some(ref v)) if !is_valid_mapping(k, v) => return false,
            StateRecord::Collision(_, Some(ref v)) if fold32(v.salt) == 0 => return false,
            StateRecord::Collision(k, Some(v)) => {
                self.know_cluster(k.source);
                self.know_cluster(v.colliding);
                self.salts.insert(split(&k), v);
            }
            StateRecord::Collision(k, None) => {
                self.know_cluster(k.source);
                self.salts.remove(&split(&k));
            }
            StateRecord::Origin(k, Some(v)) => {
                self.know_cluster(k.source);
                self.claim(offset, split(&k), &v);
            }
            StateRecord::Origin(k, None) => {
                self.know_cluster(k.source);
                let key = split(&k);
                self.unclaim(key);
                self.stale_refreshes.remove(&key);
                self.remember_tombstone(offset, key);
            }
            // Barriers and link control are the state store's, not the origins'.
            StateRecord::Barrier(..) | StateRecord::LinkState(..) | StateRecord::Drained(..) => {}
        }
        true
    }

    fn claim(&mut self, offset: i64, key: (PartitionId, OriginId), v: &OriginValue) {
        let refresh = v.claim_offset != -1;
        let effective = if refresh { v.claim_offset } else { offset };
        if refresh
            && !self.claims.contains_key(&key)
            && self
                .tombstones
                .get(&key)
                .is_some_and(|&t| t > v.claim_offset)
        {
            // A refresh of a claim tombstoned after it was made: ignored
            // here, and to be tombstoned again in the log.
            self.stale_refreshes.insert(key);
            return;
        }
        if let Some(c) = self.claims.get_mut(&key) {
            if c.mapped == v.mapped_pid && c.claim_offset == effective {
                c.persisted_last_seen_ms = c.persisted_last_seen_ms.max(v.last_seen_ms);
                c.last_seen_ms.fetch_max(v.last_seen_ms, Ordering::Relaxed);
                c.salt = v.salt;
                return;
            }
        }
        if !refresh {
            self.tombstones.remove(&key);
            self.stale_refreshes.remove(&key);
        }
        let previous = self.unclaim(key);
        let (p, o) = key;
        self.claims.insert(
            key,
            Claim {
                mapped: v.mapped_pid,
                salt: v.salt,
                claim_offset: effective,
                persisted_last_seen_ms: v.last_seen_ms,
                last_seen_ms: AtomicI64::new(v.last_seen_ms.max(previous.unwrap_or(i64::MIN))),
            },
        );
        let claimants = self.slots.entry((p, v.mapped_pid)).or_default();
        let at = claimants.partition_point(|&(e, _)| e <= effective);
        claimants.insert(at, (effective, o));
    }

    fn remember_tombstone(&mut self, offset: i64, key: (PartitionId, OriginId)) {
        self.tombstones.insert(key, offset);
        self.tombstone_order.push_back((offset, key));
        while self.tombstone_order.len() > MAX_TOMBSTONES {
            if let Some((o, k)) = self.tombstone_order.pop_front() {
                // Only if not tombstoned again since.
                if self.tombstones.get(&k) == Some(&o) {
                    self.tombstones.remove(&k);
                }
            }
        }
    }

    /// Origins whose latest record is a refresh of a claim tombstoned
    /// before it (an instance refreshed a claim another one was expiring),
    /// and which hold no claim now: their tombstones to write again, so
    /// that compaction, which keeps only the latest record of a key, never
    /// brings the dead claim back. Taken once: each instance that saw the
    /// refresh writes its own, which is harmless.
    pub(crate) fn take_stale_refreshes(&mut self) -> Vec<OriginKey> {
        let stale = std::mem::take(&mut self.stale_refreshes);
        stale
            .into_iter()
            .filter(|key| !self.claims.contains_key(key))
            .map(|(p, o)| o.key(p))
            .collect()
    }

    /// Tombstone offsets remembered (bounded by `MAX_TOMBSTONES`).
    #[cfg(test)]
    pub(crate) fn tombstones_remembered(&self) -> usize {
        self.tombstones.len()
    }

    /// Removes a claim; returns its in-memory last-seen time.
    fn unclaim(&mut self, key: (PartitionId, OriginId)) -> Option<i64> {
        let c = self.claims.remove(&key)?;
        let slot = (key.0, c.mapped);
        if let Some(claimants) = self.slots.get_mut(&slot) {
            claimants.retain(|&mut (_, o)| o != key.1);
            if claimants.is_empty() {
                self.slots.remove(&slot);
            }
        }
        Some(c.last_seen_ms())
    }

    /// The origin that owns `mapped` in `p`.
    pub(crate) fn owner(&self, p: PartitionId, mapped: i64) -> Option<OriginId> {
        self.slots
            .get(&(p, mapped))
            .and_then(|c| c.first())
            .map(|&(_, o)| o)
    }

    /// The mapped PID of a known origin that owns its slot, touching its
    /// last-seen time. No allocation.
    pub fn lookup(&self, p: PartitionId, o: OriginId, now_ms: i64) -> Option<i64> {
        let c = self.claims.get(&(p, o))?;
        if self.owner(p, c.mapped) != Some(o) {
            return None;
        }
        // Coarse: write only when a second has passed (no cache-line
        // ping-pong between connections on every batch).
        if now_ms - c.last_seen_ms.load(Ordering::Relaxed) >= 1000 {
            c.last_seen_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
        Some(c.mapped)
    }

    /// The claim of an origin, owner or not.
    #[cfg(test)]
    pub(crate) fn claim_of(&self, p: PartitionId, o: OriginId) -> Option<&Claim> {
        self.claims.get(&(p, o))
    }

    fn free_for(
        &self,
        p: PartitionId,
        mapped: i64,
        o: OriginId,
        taken: &std::collections::HashSet<(PartitionId, i64)>,
    ) -> bool {
        self.owner(p, mapped).is_none_or(|owner| owner == o) && !taken.contains(&(p, mapped))
    }

    /// A slot for `o` in `p`: its known salt, else its natural slot, else a
    /// new salt from `random`. `taken` holds slots proposed to other
    /// origins but not yet written.
    pub(crate) fn propose(
        &self,
        p: PartitionId,
        o: OriginId,
        taken: &std::collections::HashSet<(PartitionId, i64)>,
        random: &mut dyn FnMut() -> i64,
    ) -> Result<Proposal, NoSlot> {
        let hash = cluster_hash(&o.source);
        let natural = if o.pid >= 0 {
            map_pid(hash, o.pid)
        } else {
            // A chain: the PID as received is its natural slot.
            Mapping::Mapped(o.pid)
        };
        if let Some(s) = self.salts.get(&(p, o)) {
            let mapped = compose(salted_region(hash, s.salt), o.pid);
            if mapped != NO_PRODUCER_ID && self.free_for(p, mapped, o, taken) {
                return Ok(Proposal {
                    mapped,
                    salt: s.salt,
                    collision: None,
                    held_by: None,
                });
            }
        }
        let held_by = match natural {
            Mapping::Mapped(m) => self.owner(p, m).filter(|&w| w != o),
            _ => None,
        };
        let cause = match natural {
            Mapping::Mapped(m) if self.free_for(p, m, o, taken) => {
                return Ok(Proposal {
                    mapped: m,
                    salt: 0,
                    collision: None,
                    held_by: None,
                })
            }
            Mapping::Mapped(m) => (Cause::Hash, self.owner(p, m).map_or(o.source, |w| w.source)),
            Mapping::Unplaceable(Unplaceable::PidTooLarge { .. }) => {
                (Cause::OversizedPid, o.source)
            }
            Mapping::Unplaceable(Unplaceable::WouldBeNoProducer) | Mapping::Unchanged => {
                (Cause::MinusOne, o.source)
            }
        };
        for _ in 0..SALT_ATTEMPTS {
            let salt = random();
            if fold32(salt) == 0 {
                continue;
            }
            let region = salted_region(hash, salt);
            if self.is_natural_region(region) {
                continue;
            }
            let mapped = compose(region, o.pid);
            if mapped == NO_PRODUCER_ID || !self.free_for(p, mapped, o, taken) {
                continue;
            }
            return Ok(Proposal {
                mapped,
                salt,
                collision: Some(cause),
                held_by,
            });
        }
        Err(NoSlot {
            cluster: o.source,
            pid: o.pid,
        })
    }

    /// Owned claims whose last-seen time (here or persisted) is older than
    /// `now_ms - period_ms`, with whether they have a salt record.
    pub(crate) fn expired(
        &self,
        now_ms: i64,
        period_ms: i64,
    ) -> Vec<(PartitionId, OriginId, bool)> {
        let mut out: Vec<_> = self
            .claims
            .iter()
            .filter(|(_, c)| now_ms.saturating_sub(c.last_seen_ms()) > period_ms)
            .map(|(&(p, o), _)| (p, o, self.salts.contains_key(&(p, o))))
            .collect();
        // Salts without a claim expire with their timestamp.
        out.extend(
            self.salts
                .iter()
                .filter(|(k, v)| {
                    !self.claims.contains_key(k)
                        && now_ms.saturating_sub(v.timestamp_ms) > period_ms
                })
                .map(|(&(p, o), _)| (p, o, true)),
        );
        out
    }

    /// Claims seen here more than `interval_ms` after their persisted
    /// last-seen time: the refresh records to write.
    pub(crate) fn due_refresh(
        &self,
        interval_ms: i64,
    ) -> Vec<(PartitionId, OriginId, OriginValue)> {
        self.claims
            .iter()
            .filter(|(&(p, o), c)| {
                c.last_seen_ms() - c.persisted_last_seen_ms >= interval_ms
                    && self.owner(p, c.mapped) == Some(o)
            })
            .map(|(&(p, o), c)| {
                let v = OriginValue {
                    mapped_pid: c.mapped,
                    salt: c.salt,
                    claim_offset: c.claim_offset,
                    last_seen_ms: c.last_seen_ms(),
                };
                (p, o, v)
            })
            .collect()
    }

    /// Every origin of a mapped PID, in any partition (for `unmap`).
    pub(crate) fn origins_of(&self, mapped: i64) -> Vec<(PartitionId, OriginId, i64)> {
        let mut out: Vec<_> = self
            .claims
            .iter()
            .filter(|(_, c)| c.mapped == mapped)
            .map(|(&(p, o), c)| (p, o, c.salt))
            .collect();
        out.sort_by_key(|(p, _, _)| (p.topic_id, p.partition));
        out
    }
}

fn split(k: &OriginKey) -> (PartitionId, OriginId) {
    (
        PartitionId {
            topic_id: k.topic_id,
            partition: k.partition,
        },
        OriginId {
            source: k.source,
            pid: k.original_pid,
        },
    )
}

#[cfg(test)]
mod tests;
