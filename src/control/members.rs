//! How proxy instances find each other: every instance is a member of one
//! Kafka consumer group, `<state topic>.instances`, kept by the brokers'
//! group coordinator. The coordinator drops a member that stops
//! heartbeating for the session timeout, or that leaves, so the group's
//! member list (DescribeGroups) is the set of live instances, without
//! liveness records of our own.
//!
//! A background task joins (JoinGroup, SyncGroup with no assignments),
//! heartbeats every third of the session timeout, rejoins on a rebalance or
//! a lost membership, retries failures with backoff (logged at WARN, never
//! fatal), and leaves (LeaveGroup) on [`Members::leave`] or when the
//! [`Members`] is dropped. Wire details in `client::group`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::client::group::{self, codes, JoinOutcome, JoinSpec};
use crate::client::{Client, ClientError};
use crate::net::backoff::Backoff;
use crate::sync::error_chain;

/// Default session timeout (`MIRROR_PROXY_INSTANCE_SESSION_TIMEOUT_MS`).
pub(crate) const DEFAULT_SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// The group of the instances sharing `state_topic`.
pub fn group_name(state_topic: &str) -> String {
    format!("{state_topic}.instances")
}

/// A random instance id (a version 4 UUID), when none is configured.
pub(crate) fn random_instance_id() -> String {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    if ring::rand::SystemRandom::new().fill(&mut b).is_err() {
        // Not expected; the time and process id still tell processes apart.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        b = (now ^ (u128::from(std::process::id()) << 96)).to_be_bytes();
    }
    uuid::Builder::from_random_bytes(b).into_uuid().to_string()
}

/// How a [`Members`] behaves beyond the group and instance id.
#[derive(Clone)]
pub struct MembersOptions {
    /// The coordinator drops this instance after this long without a
    /// heartbeat (also the rebalance timeout). Brokers accept 6 s to 5 min
    /// by default (`group.min/max.session.timeout.ms`).
    pub session_timeout: Duration,
    /// The topic named in the member's subscription (the state topic).
    pub topic: String,
    /// Set to 1 while this instance is a member, 0 otherwise.
    pub member_gauge: Option<Gauge>,
    pub retry_backoff: Duration,
    pub retry_backoff_max: Duration,
}

impl MembersOptions {
    pub fn new(topic: impl Into<String>) -> MembersOptions {
        MembersOptions {
            session_timeout: DEFAULT_SESSION_TIMEOUT,
            topic: topic.into(),
            member_gauge: None,
            retry_backoff: Duration::from_millis(200),
            retry_backoff_max: Duration::from_secs(5),
        }
    }
}

/// This instance's membership of the instances' group.
pub struct Members {
    instance_id: String,
    group: String,
    /// For DescribeGroups: not the membership connection, which a JoinGroup
    /// can hold for a whole rebalance.
    client: Client,
    member: Arc<AtomicBool>,
    stop: watch::Sender<bool>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Members {
    /// Join the group (background task: join, sync, heartbeat, rejoin on
    /// rebalance/errors with backoff, leave on shutdown/drop), with the
    /// session timeout and the metric of `options`.
    pub fn start_with(
        client: Client,
        group: String,
        instance_id: String,
        options: MembersOptions,
    ) -> Arc<Members> {
        // A client of its own: its client id names the instance (see
        // `client::group`), and its connection is not shared with the
        // state topic's long fetches.
        let mut config = client.config().clone();
        config.client_id = group::member_client_id(&instance_id);
        let member_client = Client::new(config);
        let (stop, stopped) = watch::channel(false);
        let member = Arc::new(AtomicBool::new(false));
        let task = Membership {
            client: member_client,
            group: group.clone(),
            instance_id: instance_id.clone(),
            member: Arc::clone(&member),
            options,
            stopped,
        };
        let handle = tokio::spawn(task.run());
        Arc::new(Members {
            instance_id,
            group,
            client,
            member,
            stop,
            task: Mutex::new(Some(handle)),
        })
    }

    pub fn instance_id(&self) -> &str {
        &self.instance_id
    }

    /// Whether this instance is a member now (joined and synced, and not
    /// told otherwise by the coordinator since).
    pub fn is_member(&self) -> bool {
        self.member.load(Ordering::Relaxed)
    }

    /// Instance ids of every live proxy in the group (this one included),
    /// from DescribeGroups (the coordinator's view).
    pub async fn live_instances(&self) -> Result<Vec<String>, ClientError> {
        Ok(self.client.describe_group(&self.group).await?.instances())
    }

    /// Leave the group and stop the task (waits for the LeaveGroup, which
    /// is bounded by the client's request timeout).
    pub async fn leave(&self) {
        let _ = self.stop.send(true);
        let handle = crate::sync::lock(&self.task).take();
        if let Some(handle) = handle {
            let _ = handle.await;
        }
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        // The task leaves the group on its own (if the runtime still runs).
        let _ = self.stop.send(true);
    }
}

/// A membership task's run of failed attempts: the wait before each next
/// attempt (doubling), and which failures are worth a WARN (the first of a
/// run, then one in ten). Shared with the replicator's instances group
/// (`replicate::members`).
pub(crate) struct FailureRun {
    backoff: Backoff,
    failures: u32,
}

/// One failure of a [`FailureRun`].
pub(crate) struct Failure {
    /// The failures of the run so far, this one included.
    pub(crate) failures: u32,
    /// How long to wait before the next attempt.
    pub(crate) delay: Duration,
    /// Whether to log this one at WARN.
    pub(crate) warn: bool,
}

impl FailureRun {
    pub(crate) fn new(backoff: Backoff) -> FailureRun {
        FailureRun {
            backoff,
            failures: 0,
        }
    }

    /// The run is over (a rebalance, not a failure): the next failure
    /// starts a new one, with the shortest wait.
    pub(crate) fn reset(&mut self) {
        self.backoff.reset();
        self.failures = 0;
    }

    /// One more failure.
    pub(crate) fn failed(&mut self) -> Failure {
        self.failures += 1;
        let failures = self.failures;
        Failure {
            failures,
            delay: self.backoff.next_delay(),
            warn: failures == 1 || failures.is_multiple_of(10),
        }
    }
}

/// The background task's state.
struct Membership {
    client: Client,
    group: String,
    instance_id: String,
    member: Arc<AtomicBool>,
    options: MembersOptions,
    stopped: watch::Receiver<bool>,
}

/// Why a membership ended.
enum Ended {
    Stop,
    /// Join again now (rebalance, new generation).
    Rejoin,
    /// Join again after a backoff.
    Failed(ClientError),
}

impl Membership {
    fn set_member(&self, on: bool) {
        self.member.store(on, Ordering::Relaxed);
        if let Some(g) = &self.options.member_gauge {
            g.set(i64::from(on));
        }
    }

    /// Wait `d`, or less if asked to stop; true when asked to stop.
    async fn pause(&mut self, d: Duration) -> bool {
        if *self.stopped.borrow() {
            return true;
        }
        tokio::select! {
            _ = tokio::time::sleep(d) => false,
            _ = self.stopped.changed() => true,
        }
    }

    async fn run(mut self) {
        let session_ms =
            i32::try_from(self.options.session_timeout.as_millis()).unwrap_or(i32::MAX);
        let metadata = match group::subscription_metadata(&self.options.topic, &self.instance_id) {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(error = %error_chain(&e), "cannot build the instance group's member metadata; not joining");
                return;
            }
        };
        let spec = JoinSpec {
            group: self.group.clone(),
            protocol: group::PROTOCOL_NAME.to_string(),
            session_timeout_ms: session_ms,
            rebalance_timeout_ms: session_ms,
            metadata,
        };
        let mut member_id = String::new();
        let mut coordinator: Option<String> = None;
        let mut retries = FailureRun::new(Backoff::new(
            self.options.retry_backoff,
            self.options.retry_backoff_max,
        ));
        loop {
            let ended = self
                .membership(&spec, &mut member_id, &mut coordinator)
                .await;
            match ended {
                Ended::Stop => break,
                Ended::Rejoin => retries.reset(),
                Ended::Failed(e) => {
                    self.set_member(false);
                    if matches!(
                        e.code(),
                        Some(codes::NOT_COORDINATOR | codes::COORDINATOR_NOT_AVAILABLE)
                    ) || e.is_retriable()
                    {
                        coordinator = None;
                    }
                    if e.code() == Some(codes::UNKNOWN_MEMBER_ID) {
                        member_id.clear();
                    }
                    let failure = retries.failed();
                    if failure.warn {
                        tracing::warn!(group = %self.group, instance = %self.instance_id, error = %error_chain(&e), failures = failure.failures, backoff_ms = failure.delay.as_millis() as u64, "instance group membership failed; retrying");
                    }
                    if self.pause(failure.delay).await {
                        break;
                    }
                }
            }
        }
        self.set_member(false);
        if let (false, Some(addr)) = (member_id.is_empty(), coordinator) {
            match self
                .client
                .leave_group(&addr, &self.group, &member_id)
                .await
            {
                Ok(()) => {
                    tracing::info!(group = %self.group, instance = %self.instance_id, "left the instance group")
                }
                Err(e) => {
                    tracing::warn!(group = %self.group, instance = %self.instance_id, error = %error_chain(&e), "could not leave the instance group; the coordinator drops this instance after the session timeout")
                }
            }
        }
    }

    /// Find the coordinator, join, sync, then heartbeat until something
    /// ends the membership.
    async fn membership(
        &mut self,
        spec: &JoinSpec,
        member_id: &mut String,
        coordinator: &mut Option<String>,
    ) -> Ended {
        let addr = match coordinator.clone() {
            Some(a) => a,
            None => {
                let found = tokio::select! {
                    r = self.client.group_coordinator(&self.group) => r,
                    _ = self.stopped.changed() => return Ended::Stop,
                };
                match found {
                    Ok(a) => {
                        *coordinator = Some(a.clone());
                        a
                    }
                    Err(e) => return Ended::Failed(e),
                }
            }
        };
        let joined = tokio::select! {
            r = self.client.join_group(&addr, spec, member_id) => r,
            _ = self.stopped.changed() => return Ended::Stop,
        };
        let (generation, leader) = match joined {
            Ok(JoinOutcome::MemberIdRequired(id)) => {
                *member_id = id;
                return Ended::Rejoin;
            }
            Ok(JoinOutcome::Joined {
                generation,
                member_id: id,
                leader,
                ..
            }) => {
                *member_id = id;
                (generation, leader)
            }
            Err(e) if e.code() == Some(codes::REBALANCE_IN_PROGRESS) => return Ended::Rejoin,
            Err(e) => return Ended::Failed(e),
        };
        let synced = tokio::select! {
            r = self.client.sync_group(&addr, &self.group, generation, member_id, group::PROTOCOL_NAME, &[]) => r,
            _ = self.stopped.changed() => return Ended::Stop,
        };
        match synced {
            Ok(_) => {}
            Err(e) if group::group_moved_on(&e) => return Ended::Rejoin,
            Err(e) => return Ended::Failed(e),
        }
        if !self.member.load(Ordering::Relaxed) {
            tracing::info!(group = %self.group, instance = %self.instance_id, member_id = %member_id, generation, leader, "member of the instance group");
        } else {
            tracing::debug!(group = %self.group, generation, "rejoined the instance group");
        }
        self.set_member(true);
        let interval = self.options.session_timeout / 3;
        let mut last_ok = Instant::now();
        loop {
            if self.pause(interval).await {
                return Ended::Stop;
            }
            let beat = tokio::select! {
                r = self.client.heartbeat(&addr, &self.group, generation, member_id) => r,
                _ = self.stopped.changed() => return Ended::Stop,
            };
            match beat {
                Ok(()) => last_ok = Instant::now(),
                Err(e) if e.code() == Some(codes::REBALANCE_IN_PROGRESS) => return Ended::Rejoin,
                Err(e) if e.code() == Some(codes::ILLEGAL_GENERATION) => return Ended::Rejoin,
                // The coordinator moved: find it again (the member id stays).
                Err(e)
                    if matches!(
                        e.code(),
                        Some(codes::NOT_COORDINATOR | codes::COORDINATOR_NOT_AVAILABLE)
                    ) =>
                {
                    return Ended::Failed(e)
                }
                Err(e) if e.is_retriable() && last_ok.elapsed() < self.options.session_timeout => {
                    tracing::debug!(group = %self.group, error = %error_chain(&e), "heartbeat failed; trying again");
                }
                Err(e) => return Ended::Failed(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_of_a_state_topic() {
        assert_eq!(group_name("__mirror_state"), "__mirror_state.instances");
    }

    #[test]
    fn random_ids_are_uuids_and_differ() {
        let (a, b) = (random_instance_id(), random_instance_id());
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(&a).expect("a uuid");
        assert_eq!(parsed.get_version_num(), 4);
    }
}
