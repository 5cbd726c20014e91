//! What [`Control`](super::Control) needs from outside itself, as traits:
//! the state store ([`Store`]), the instances' group ([`Group`]) and the
//! placing of barriers ([`BarrierPlacer`]). The real implementations,
//! [`StateStore`] and [`Members`], are here too; the control's tests use
//! fakes, so that its decisions (transitions, drain waits, barrier retries,
//! resumption) are tested without brokers.
//!
//! `Control` is generic over these traits, not holding trait objects:
//! `fenced` and `read_only` ask the store on every request and stay direct
//! calls.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use uuid::Uuid;

use super::barriers::{self, BarrierOutcome};
use super::members::Members;
use crate::client::ClientError;
use crate::mirror::link::Link;
use crate::mirror::link_state::LinkStatus;
use crate::mirror::pid::ClusterId;
use crate::mirror::state_records::{BarrierKey, DrainedKey, DrainedValue};
use crate::state::{AppliedBarrier, ResolveError, StateStore};

/// The state topic as the link control reads and writes it. Reads answer
/// from what this instance has applied; writes return once applied here.
pub(crate) trait Store: Send + Sync + 'static {
    /// Whether the first full load is done.
    fn is_loaded(&self) -> bool;

    /// Why the store is not ready, if it is not.
    fn not_ready_reason(&self) -> Option<String>;

    /// The latest state record of `link` applied, if the topic has one.
    fn link_status(&self, link: &str) -> Option<LinkStatus>;

    /// The instances that drained `link` for failover `failover_id`.
    fn drained(&self, link: &str, failover_id: i64) -> Vec<String>;

    /// Every barrier of `link` read from the topic.
    fn barriers_of(&self, link: &str) -> Vec<(BarrierKey, AppliedBarrier)>;

    /// The name of a topic id the store looked up.
    fn topic_name(&self, id: Uuid) -> Option<String>;

    /// Changes whenever a link state or drained record is applied.
    fn control_changes(&self) -> watch::Receiver<u64>;

    /// Persist `status` for `link`; `Ok(false)` when it did not apply
    /// because another record won the race.
    fn write_link_state(
        &self,
        link: &str,
        status: LinkStatus,
    ) -> impl Future<Output = Result<bool, ResolveError>> + Send;

    /// Persist that an instance drained a link for a failover.
    fn write_drained(
        &self,
        key: DrainedKey,
        value: DrainedValue,
    ) -> impl Future<Output = Result<(), ResolveError>> + Send;

    /// How long an instance out of touch with the store may still forward
    /// link traffic (`StateStore::lease_held`).
    fn lease(&self) -> Duration;

    /// Delete the drained records of `link`'s earlier failovers; returns
    /// how many.
    fn forget_drained(
        &self,
        link: &str,
    ) -> impl Future<Output = Result<usize, ResolveError>> + Send;
}

/// The live proxy instances.
pub(crate) trait Group: Send + Sync + 'static {
    /// This instance's id.
    fn instance_id(&self) -> &str;

    /// Every live instance's id, this one included.
    fn live_instances(&self) -> impl Future<Output = Result<Vec<String>, ClientError>> + Send;
}

/// Where a failover places barriers, and the placing of one.
pub(crate) trait BarrierPlacer: Send + Sync + 'static {
    /// Every partition of `link`'s topics on the destination cluster, in
    /// any order.
    fn partitions(
        &self,
        link: &Link,
    ) -> impl Future<Output = Result<Vec<(String, i32)>, ClientError>> + Send;

    /// Place, record and apply one partition's barrier of failover
    /// `failover_id` (idempotent per failover; `Failed` may be retried).
    fn place(
        &self,
        link: &str,
        source: &ClusterId,
        failover_id: i64,
        topic: &str,
        partition: i32,
    ) -> impl Future<Output = BarrierOutcome> + Send;
}

impl Store for StateStore {
    fn is_loaded(&self) -> bool {
        StateStore::is_loaded(self)
    }

    fn not_ready_reason(&self) -> Option<String> {
        StateStore::not_ready_reason(self)
    }

    fn link_status(&self, link: &str) -> Option<LinkStatus> {
        StateStore::link_status(self, link)
    }

    fn drained(&self, link: &str, failover_id: i64) -> Vec<String> {
        StateStore::drained(self, link, failover_id)
    }

    fn barriers_of(&self, link: &str) -> Vec<(BarrierKey, AppliedBarrier)> {
        StateStore::barriers_of(self, link)
    }

    fn topic_name(&self, id: Uuid) -> Option<String> {
        StateStore::topic_name(self, id)
    }

    fn control_changes(&self) -> watch::Receiver<u64> {
        StateStore::control_changes(self)
    }

    fn write_link_state(
        &self,
        link: &str,
        status: LinkStatus,
    ) -> impl Future<Output = Result<bool, ResolveError>> + Send {
        StateStore::write_link_state(self, link, status)
    }

    fn write_drained(
        &self,
        key: DrainedKey,
        value: DrainedValue,
    ) -> impl Future<Output = Result<(), ResolveError>> + Send {
        StateStore::write_drained(self, key, value)
    }

    fn lease(&self) -> Duration {
        StateStore::lease(self)
    }

    fn forget_drained(
        &self,
        link: &str,
    ) -> impl Future<Output = Result<usize, ResolveError>> + Send {
        StateStore::forget_drained(self, link)
    }
}

impl Group for Members {
    fn instance_id(&self) -> &str {
        Members::instance_id(self)
    }

    fn live_instances(&self) -> impl Future<Output = Result<Vec<String>, ClientError>> + Send {
        Members::live_instances(self)
    }
}

/// The state store places the barriers: it holds the proxy's own client
/// and records each barrier it places.
impl BarrierPlacer for StateStore {
    async fn partitions(&self, link: &Link) -> Result<Vec<(String, i32)>, ClientError> {
        let cluster = self.client().metadata(None).await?;
        Ok(cluster
            .topics
            .iter()
            .filter(|t| !t.is_internal && link.mirrors_topic(&t.name))
            .flat_map(|t| t.partitions.iter().map(|p| (t.name.clone(), p.partition)))
            .collect())
    }

    fn place(
        &self,
        link: &str,
        source: &ClusterId,
        failover_id: i64,
        topic: &str,
        partition: i32,
    ) -> impl Future<Output = BarrierOutcome> + Send {
        barriers::place(self, link, source, failover_id, topic, partition)
    }
}
