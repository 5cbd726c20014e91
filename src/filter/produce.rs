//! The Produce path of a connection as one object (SPEC §6, issue 9): the
//! request half ([`ProduceFilter::request`]: classify the client as local,
//! spoofed or a mirror link; refuse writes to read-only mirrored topics;
//! plan the request with [`produce`], resolve new origins in the state
//! store, begin the mirrored producer state with [`Dedupe`] and rebuild it
//! from the log where claimed) and the response half
//! ([`ProduceFilter::response`]: rewrite leader endpoints, record what the
//! broker appended, merge the partitions answered locally), with the
//! per-request state ([`ProduceState`]) that links them.
//!
//! The session keeps only framing and the ordered response queue; the pure
//! parts (planning in [`produce`], [`crate::mirror::producer_state`]) stay
//! pure.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;

use crate::filter::addresses::{self, Learnt, RewriteError, UnsupportedVersion};
use crate::filter::{rebuild, Context};
use crate::mirror::dedupe::{Begin, Dedupe, RebuildClaim, Tracked};
use crate::mirror::link::{CertSubject, Origin};
use crate::mirror::produce::{
    self, LocalOutcome, LocalPartition, ProduceError, ProducePlan, Refusal, TopicKey,
};
use crate::state::StateStore;
use crate::wire::header::{produce_acks, HeaderError, RequestHeaderPeek};
use crate::wire::produce_response_walk::Walked;

/// Why a Produce request or its response could not be handled; the session
/// closes the connection (each maps to the `SessionError` of the same name).
#[derive(Debug, thiserror::Error)]
pub enum ProducePathError {
    #[error("malformed request header: {0}")]
    Header(#[from] HeaderError),
    #[error(transparent)]
    Produce(#[from] ProduceError),
    #[error(transparent)]
    Rewrite(#[from] RewriteError),
    #[error(transparent)]
    UnsupportedVersion(#[from] UnsupportedVersion),
}

/// What to queue and what to forward for a Produce request.
pub struct ProduceAction {
    /// The response the client is owed, unless `acks=0`.
    pub answer: Option<Answer>,
    /// The frame for the broker, unless the proxy answered every partition.
    pub forward: Option<BytesMut>,
}

/// The response a Produce request is owed.
pub enum Answer {
    /// The proxy answered every partition itself.
    Local(BytesMut),
    /// The broker answers; its response goes through
    /// [`ProduceFilter::response`] with this state.
    Broker(ProduceState),
}

/// The per-request state between the two halves: the partitions the proxy
/// answered itself and the tracked batches to settle.
pub struct ProduceState {
    version: i16,
    local: Vec<LocalPartition>,
    tracked: Tracked,
}

/// The Produce filter of a connection: both halves of the Produce path.
pub struct ProduceFilter<'a> {
    ctx: &'a Context,
}

impl<'a> ProduceFilter<'a> {
    /// The Produce filter over the proxy's shared state.
    pub fn new(ctx: &'a Context) -> ProduceFilter<'a> {
        ProduceFilter { ctx }
    }

    /// Every partition of a Produce answered here with `refusal`.
    /// Every partition of a Produce answered here with `refusal` (a request
    /// of a fenced link); nothing is forwarded.
    pub fn refuse(
        &self,
        link: &str,
        h: &RequestHeaderPeek,
        frame: Bytes,
        refusal: Refusal,
        message: &str,
    ) -> Result<ProduceAction, ProducePathError> {
        let ctx = self.ctx;
        let version = h.api_version;
        let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
        let acks = produce_acks(&frame, body_offset, version)?;
        let plan = produce::refuse_all(&frame, body_offset, version, refusal, message)?;
        count_local(ctx, link, &plan.local);
        let answer = match acks != 0 {
            true => Some(Answer::Local(produce::local_response(
                h.correlation_id,
                version,
                &plan.local,
            )?)),
            false => None,
        };
        Ok(ProduceAction {
            answer,
            forward: None,
        })
    }

    /// The request half: what to answer and what to forward for a Produce
    /// request (`frame`, whose header is `h`).
    pub async fn request(
        &self,
        subject: Option<&CertSubject>,
        h: &RequestHeaderPeek,
        frame: Bytes,
    ) -> Result<ProduceAction, ProducePathError> {
        let ctx = self.ctx;
        let version = h.api_version;
        let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
        let acks = produce_acks(&frame, body_offset, version)?;
        let expects_response = acks != 0;
        // With acks=0 nothing is recorded without an answer: the tracked
        // batches are failed. No client retries what it never hears about, so
        // there is no retry to deduplicate and the partition is not re-read.
        let broker = |local: Vec<LocalPartition>, tracked: Tracked| {
            if !expects_response {
                tracked.unanswered();
                return None;
            }
            Some(Answer::Broker(ProduceState {
                version,
                local,
                tracked,
            }))
        };
        let local_only = |local: &[LocalPartition]| -> Result<Option<Answer>, ProducePathError> {
            Ok(match expects_response {
                true => Some(Answer::Local(produce::local_response(
                    h.correlation_id,
                    version,
                    local,
                )?)),
                false => None,
            })
        };
        // Every partition of the request answered here with `refusal`.
        let refuse_request = |link: &str, refusal: Refusal, message: &str| {
            let plan = produce::refuse_all(&frame, body_offset, version, refusal, message)?;
            count_local(ctx, link, &plan.local);
            Ok(ProduceAction {
                answer: local_only(&plan.local)?,
                forward: None,
            })
        };
        let origin = ctx.links.classify(h.client_id(&frame), subject);
        let link = match origin {
            Origin::Local => {
                if addresses::carries_addresses(ApiKey::Produce, version) {
                    addresses::check_parseable(ApiKey::Produce, version)?;
                }
                // Read-only mirrored topics: refused per partition. Planned
                // only for a request that names one (a walk that allocates
                // nothing answers that for all the others).
                let control = &ctx.control;
                if control.any_read_only()
                    && produce::any_topic(&frame, body_offset, version, |t| {
                        topic_name(ctx, t)
                            .is_some_and(|name| control.read_only(&name, version).is_some())
                    })?
                {
                    let plan = produce::refuse_where(&frame, body_offset, version, |t| {
                        let name = topic_name(ctx, t.key(version))?;
                        let refusal = control.read_only(&name, version)?;
                        control.local_write_refused(&name);
                        Some(refusal)
                    })?;
                    if !plan.local.is_empty() {
                        if let Some(LocalPartition {
                            outcome: LocalOutcome::Refused { message, .. },
                            ..
                        }) = plan.local.first()
                        {
                            tracing::debug!(partitions = plan.local.len(), %message, "refused a local write to a read-only mirrored topic");
                        }
                        if plan.forwarded_partitions == 0 {
                            return Ok(ProduceAction {
                                answer: local_only(&plan.local)?,
                                forward: None,
                            });
                        }
                        let reduced = produce::without_local_partitions(
                            &frame,
                            body_offset,
                            version,
                            &plan.local,
                        )?;
                        return Ok(ProduceAction {
                            answer: broker(plan.local, Tracked::none()),
                            forward: Some(reduced),
                        });
                    }
                }
                let frame = BytesMut::from(frame); // unique: no copy
                return Ok(ProduceAction {
                    answer: broker(Vec::new(), Tracked::none()),
                    forward: Some(frame),
                });
            }
            Origin::Spoofed(link) => {
                let message = format!(
                    "client id '{}' is reserved for mirror link '{}', which requires a TLS client certificate matching '{}'",
                    link.client_id(),
                    link.name(),
                    link.tls_subject().unwrap_or_default()
                );
                tracing::warn!(link = link.name(), subject = ?subject.map(|s| &s.full), "refused a Produce that claims a mirror link's client id");
                return refuse_request(link.name(), Refusal::NotAuthorized, &message);
            }
            Origin::Link(link) => link,
        };
        let state = match ctx.state.as_ref() {
            Some(state) if state.is_loaded() => state,
            _ => {
                let why = ctx
                    .state
                    .as_ref()
                    .and_then(|s| s.not_ready_reason())
                    .unwrap_or_else(|| "no state store".into());
                let message = format!(
                    "mirror link '{}': the proxy's producer id mapping state is not loaded yet ({why}); retry",
                    link.name()
                );
                return refuse_request(link.name(), Refusal::StateNotLoaded, &message);
            }
        };
        let plan_now = || {
            let view = state.view();
            produce::plan_with(
                &frame,
                body_offset,
                version,
                &link,
                &|id| ctx.topics.name(id),
                &|name| ctx.topics.id(name).or_else(|| state.topic_id(name)),
                &produce::AtTime(&view, crate::state::now_ms()),
            )
        };
        let mut plan = plan_now()?;
        if !plan.unresolved.is_empty() {
            // New origins: persisted before anything of them is forwarded.
            // Boxed, like the rebuild below: rare, and their futures would
            // otherwise size every connection's task for good.
            let resolved = Box::pin(state.resolve(&plan.unresolved)).await;
            for (topic, partition, error) in resolved {
                tracing::warn!(link = link.name(), topic, partition, %error, "could not persist a new mirrored producer's mapping");
            }
            plan = plan_now()?;
        }
        // Mirrored producer state: duplicates and refusals become local answers.
        // Nothing of a partition begins before its state is rebuilt from its
        // log tail (after start-up, an unknown outcome, a leader move); one
        // request rebuilds, the partition's others wait (bounded) for it. A
        // retry of a batch still in flight waits for that attempt's outcome
        // (bounded: then it is answered retriable), never a second append.
        let mut in_flight_deadline = None;
        let mut rebuild_deadline = None;
        let mut shutting_down = false;
        // Registered only once a request has to wait, so the common case
        // (begun at the first try) never touches the Notify's waiter list.
        let mut changed = None;
        let tracked = loop {
            let now = tokio::time::Instant::now();
            let wait = !shutting_down && in_flight_deadline.is_none_or(|d| now < d);
            let deadline = match ctx.dedupe.begin(&mut plan, link.name(), wait) {
                Begin::Begun(tracked) => break tracked,
                Begin::InFlight => *in_flight_deadline.get_or_insert(now + IN_FLIGHT_WAIT),
                Begin::Rebuild { claims, waiting } if claims.is_empty() => {
                    let d = *rebuild_deadline.get_or_insert(now + REBUILD_WAIT);
                    if shutting_down || now >= d {
                        for partition in waiting {
                            let message = format!(
                                "mirror link '{}': partition {}: the mirrored producer state is still being rebuilt from the log by another request; retry",
                                link.name(),
                                partition.partition
                            );
                            Dedupe::refuse_partition(&mut plan, partition, message);
                        }
                        continue;
                    }
                    d
                }
                Begin::Rebuild { claims, .. } => {
                    // Bounded too: a partition marked again during each of its
                    // rebuilds is not rebuilt forever by one request.
                    let d = *rebuild_deadline.get_or_insert(now + REBUILD_WAIT);
                    for claim in claims {
                        if shutting_down || tokio::time::Instant::now() >= d {
                            let message = format!(
                                "mirror link '{}': partition {}: the mirrored producer state was marked again while it was rebuilt; retry",
                                link.name(),
                                claim.partition().partition
                            );
                            Dedupe::refuse_partition(&mut plan, claim.partition(), message);
                            continue;
                        }
                        Box::pin(rebuild(ctx, state, link.name(), &mut plan, claim)).await;
                    }
                    continue;
                }
            };
            let Some(notified) = changed.as_mut() else {
                // Register, then look again: a change between that `begin`
                // and now is not missed.
                let mut notified = Box::pin(ctx.dedupe.changed());
                notified.as_mut().enable();
                changed = Some(notified);
                continue;
            };
            tokio::select! {
                _ = notified.as_mut() => changed = None,
                _ = tokio::time::sleep_until(deadline) => {}
                _ = ctx.shutting_down() => shutting_down = true,
            }
        };
        ctx.metrics
            .batches_remapped(link.name(), plan.remapped_batches as u64);
        count_local(ctx, link.name(), &plan.local);
        if plan.forwarded_partitions == 0 {
            return Ok(ProduceAction {
                answer: local_only(&plan.local)?,
                forward: None,
            });
        }
        // The plan holds no reference into the frame unless some partitions are
        // answered locally, so the fast path gets the frame back without a copy.
        let mut buf = frame
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        plan.apply(&mut buf)?;
        if plan.local.is_empty() {
            return Ok(ProduceAction {
                answer: broker(Vec::new(), tracked),
                forward: Some(buf),
            });
        }
        let reduced =
            produce::without_local_partitions(&buf.freeze(), body_offset, version, &plan.local)?;
        Ok(ProduceAction {
            answer: broker(plan.local, tracked),
            forward: Some(reduced),
        })
    }

    /// The response half: the frame for the client from the broker's
    /// Produce response and the request's state, and the brokers the
    /// response named (KIP-951: a leader moved), for the proxy to open
    /// listeners for before the client hears of them.
    pub fn response(
        &self,
        state: ProduceState,
        frame: BytesMut,
    ) -> Result<(BytesMut, Option<Learnt>), ProducePathError> {
        let ctx = self.ctx;
        let ProduceState {
            version,
            local,
            tracked,
        } = state;
        // Every response that can name brokers (v10+), or that answers
        // tracked partitions, gets one walk: it reads the answers and stops
        // at leader endpoints (KIP-951: only when a leader moved), which only
        // then are rewritten by a walk of the response's schema.
        let mut answers = tracked.answers();
        let walk = !tracked.is_empty() || addresses::carries_addresses(ApiKey::Produce, version);
        let mut learnt = None;
        let frame = match walk {
            true => match answers.walk(&frame, version)? {
                Walked::Whole => frame,
                Walked::NamesBrokers => {
                    let (out, named) =
                        addresses::rewrite(ApiKey::Produce, version, &frame, &ctx.advertised)?;
                    learnt = Some(named);
                    out.unwrap_or(frame)
                }
            },
            false => frame,
        };
        let found = answers.into_found();
        // A response that cannot be walked returned above and dropped
        // `tracked`: its batches fail.
        if !tracked.is_empty() {
            tracked.settle(&found, crate::state::now_ms());
        }
        if local.is_empty() {
            return Ok((frame, learnt));
        }
        let (correlation_id, mut response) = produce::decode_response(&frame.freeze(), version)?;
        produce::merge_local(&mut response, version, &local);
        let frame = produce::encode_response(correlation_id, version, &response)?;
        Ok((frame, learnt))
    }
}

/// How long a link retry waits for the same batch's attempt in flight
/// before it is answered with a retriable error instead.
const IN_FLIGHT_WAIT: Duration = Duration::from_secs(10);
/// How long a request rebuilding a partition's producer state may take to
/// read its log tail before the partition is answered retriable.
const REBUILD_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a request waits for another request's rebuild of a partition
/// before that partition is answered retriable (longer than a rebuild may
/// take, so a rebuild that ends in time is waited for).
const REBUILD_WAIT: Duration = Duration::from_secs(20);

/// Rebuild `claim`'s partition from its log tail (bounded by
/// [`REBUILD_TIMEOUT`]); if it cannot be read, its partition of `plan` is
/// answered retriable.
async fn rebuild(
    ctx: &Context,
    state: &StateStore,
    link: &str,
    plan: &mut ProducePlan,
    claim: RebuildClaim,
) {
    let partition = claim.partition();
    let name = ctx
        .topics
        .name(partition.topic_id)
        .map_or_else(|| claim.topic().name.0.to_string(), |n| n.to_string());
    let owner = |mapped: i64| state.view().owner(partition, mapped);
    let floor = state.barrier_floor(partition).unwrap_or(0);
    let read = rebuild::read_tail(
        state.client(),
        &name,
        partition.partition,
        floor,
        claim.rebuild_bytes(),
    );
    let error = match tokio::time::timeout(REBUILD_TIMEOUT, read).await {
        Ok(Ok(tail)) => {
            let r = claim.apply(tail.start, tail.end, tail.from, &tail.records, &owner);
            tracing::info!(
                link,
                topic = name,
                partition = partition.partition,
                from_offset = r.from_offset,
                log_start_offset = r.log_start_offset,
                log_end_offset = r.log_end_offset,
                batches = r.replayed.batches,
                taken = r.replayed.taken,
                "rebuilt the mirrored producer state from the log tail"
            );
            return;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("not read within {} s", REBUILD_TIMEOUT.as_secs()),
    };
    ctx.metrics.producer_state_rebuilt("failed", 0);
    let message = format!(
        "mirror link '{link}': {name}-{}: the mirrored producer state could not be rebuilt from the log ({error}); retry",
        partition.partition
    );
    Dedupe::refuse_partition(plan, partition, message);
}

/// A Produce topic's name: the request's own before v13, else looked up by
/// its id (`None` while the proxy has not seen the id in a response).
fn topic_name<'t>(ctx: &Context, topic: TopicKey<'t>) -> Option<TopicName<'t>> {
    match topic {
        TopicKey::Name(name) => Some(TopicName::Request(name)),
        TopicKey::Id(id) => ctx.topics.name(id).map(TopicName::Known),
    }
}

/// A topic name borrowed from the request or shared with the proxy's
/// table of topic ids: never copied per request.
enum TopicName<'t> {
    Request(&'t str),
    Known(Arc<str>),
}

impl std::ops::Deref for TopicName<'_> {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            TopicName::Request(name) => name,
            TopicName::Known(name) => name,
        }
    }
}

fn count_local(ctx: &Context, link: &str, local: &[LocalPartition]) {
    for l in local {
        match &l.outcome {
            LocalOutcome::DroppedControl { batches } => {
                ctx.metrics.control_batches_dropped(link, *batches as u64)
            }
            LocalOutcome::Duplicate { batches, .. } => {
                tracing::debug!(
                    link,
                    partition = l.partition,
                    batches,
                    "answered a mirrored retry as a duplicate"
                );
                ctx.metrics.duplicates_answered(link, *batches as u64);
            }
            LocalOutcome::Refused { refusal, message } => {
                tracing::warn!(link, partition = l.partition, reason = refusal.label(), %message, "refused a mirrored partition");
                ctx.metrics.partition_refused(link, refusal.label());
            }
        }
    }
}
