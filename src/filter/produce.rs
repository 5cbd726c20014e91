//! The Produce filter (SPEC §6): the request half
//! ([`ProduceFilter::request`]: refuse writes to read-only mirrored topics,
//! refuse a spoofed link; for a link, plan the request with
//! `mirror::produce`, resolve new origins in the state store, begin the
//! mirrored producer state with `mirror::dedupe` and rebuild it from the log
//! where claimed) and the response half ([`ProduceFilter::response`]:
//! rewrite leader endpoints, record what the broker appended, merge the
//! partitions answered locally), with the per-request state
//! ([`ProduceState`]) that links them. [`ProduceLayer`] puts it in the
//! stack; the rules themselves stay pure in `mirror`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures_util::stream::{FuturesUnordered, StreamExt};
use kafka_protocol::messages::ApiKey;

use std::future::Future;
use tower::Layer;

use super::addresses::{self, Learnt};
use super::{
    pass, rebuild, Context, FilterError, Outcome, Pending, Request, ResponseHalf, Service, Step,
    Then,
};
use crate::client::ClientError;
use crate::metrics::mirrored::LinkMirror;
use crate::mirror::dedupe::{
    Begin, Dedupe, DuplicateAnswer, RebuildClaim, RebuildReason, Tracked, Writer,
};
use crate::mirror::link::{CertSubject, Origin};
use crate::mirror::origins::PartitionId;
use crate::mirror::produce::{
    self, LocalOutcome, LocalPartition, MirroredPartition, ProducePlan, Refusal, TopicKey, TopicRef,
};
use crate::mirror::produce_response::{Answers, PartitionAnswer};
use crate::state::StateStore;
use crate::wire::header::{produce_acks, produce_timeout_ms, RequestHeaderPeek};
use crate::wire::produce_response_walk::Walked;
use smallvec::SmallVec;

/// What becomes of a Produce request.
pub(crate) enum ProduceAction {
    /// The proxy answered every partition itself: the response, unless
    /// `acks=0`.
    Answered(Option<BytesMut>),
    /// `frame` goes to the broker; its response goes through
    /// [`ProduceFilter::response`] with `state` (`None` with `acks=0`).
    Forward {
        frame: BytesMut,
        state: Option<ProduceState>,
    },
    /// The link was fenced while the request waited: every partition is
    /// refused (the answer, unless `acks=0`) and the connection closes, as
    /// for any request of a fenced link.
    Fenced {
        answer: Option<BytesMut>,
        link: String,
    },
}

/// The per-request state between the two halves: the partitions the proxy
/// answered itself and the tracked batches to settle.
pub(crate) struct ProduceState {
    version: i16,
    local: Vec<LocalPartition>,
    /// What a link write (or a local one with tracked batches) settles once
    /// answered. Boxed: every request's pending response is moved into and
    /// out of the connection's queue, and a local write has none of it.
    link: Option<Box<LinkWrite>>,
}

/// The part of a Produce request's state that only a link write has.
struct LinkWrite {
    tracked: Tracked,
    /// A link write's forwarded partitions, for its figures once answered.
    mirrored: Vec<MirroredPartition>,
    link: Option<Arc<LinkMirror>>,
}

/// The Produce filter of a connection: both halves of the Produce path.
pub(crate) struct ProduceFilter<'a> {
    ctx: &'a Context,
}

impl<'a> ProduceFilter<'a> {
    /// The Produce filter over the proxy's shared state.
    pub(crate) fn new(ctx: &'a Context) -> ProduceFilter<'a> {
        ProduceFilter { ctx }
    }

    /// The request half: what to answer and what to forward for a Produce
    /// request (`frame`, whose header is `h`).
    pub(crate) async fn request(
        &self,
        writer: Writer,
        origin: &Origin,
        subject: Option<&CertSubject>,
        h: &RequestHeaderPeek,
        frame: Bytes,
    ) -> Result<ProduceAction, FilterError> {
        let ctx = self.ctx;
        let (link, spoofed) = match origin {
            Origin::Link(link) => (link, false),
            Origin::Spoofed(link) => (link, true),
            // `local_now` reads the header itself.
            Origin::Local => {
                return match self.local_now(h, frame, false)? {
                    LocalStep::Done(action) => Ok(action),
                    LocalStep::LearnIds(frame) => {
                        // Boxed: rare, and it would size every request's future.
                        Box::pin(learn_topic_ids(ctx)).await;
                        match self.local_now(h, frame, true)? {
                            LocalStep::Done(action) => Ok(action),
                            // Not returned once the ids were asked for.
                            LocalStep::LearnIds(_) => Err(FilterError::MissingResponse),
                        }
                    }
                };
            }
        };
        let version = h.api_version;
        let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
        let replies = Replies::new(h, &frame, body_offset)?;
        let link_mirror = ctx.metrics.link_mirror(link.name());
        let forward = |frame, local, tracked, mirrored| {
            replies.forward(frame, local, tracked, mirrored, link_mirror.cloned())
        };
        let answered = |local: &[LocalPartition]| replies.answered(local);
        // Every partition of the request answered here with `refusal`.
        let refuse_request = |link: &str, refusal: Refusal, message: &str| {
            let index = produce::index(&frame, body_offset, version)?;
            let plan = produce::refuse_all(&frame, &index, refusal, message);
            count_local(ctx, link, &plan.local);
            answered(&plan.local)
        };
        if spoofed {
            let message = format!(
                    "client id '{}' is reserved for mirror link '{}', which requires a TLS client certificate matching '{}'",
                    link.client_id(),
                    link.name(),
                    link.tls_subject().unwrap_or_default()
                );
            tracing::warn!(link = link.name(), subject = ?subject.map(|s| &s.full), "refused a Produce that claims a mirror link's client id");
            return refuse_request(link.name(), Refusal::NotAuthorized, &message);
        }
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
        let index = produce::index(&frame, body_offset, version)?;
        let timeout_ms = produce_timeout_ms(&frame, body_offset, version)?;
        if produce::any_topic(&frame, &index, |t| unknown_id(ctx, t)) {
            Box::pin(learn_topic_ids(ctx)).await;
        }
        let plan_now = || {
            let view = state.view();
            produce::plan_with(
                &frame,
                &index,
                link,
                &|id| ctx.topics.name(id),
                &|name| ctx.topics.id(name).or_else(|| state.topic_id(name)),
                &produce::AtTime(&view, crate::state::now_ms()),
            )
        };
        let mut plan = plan_now();
        if !plan.unresolved.is_empty() {
            // New origins: persisted before anything of them is forwarded.
            // Boxed, like the rebuild below: rare, and their futures would
            // otherwise size every connection's task for good.
            let resolved = Box::pin(state.resolve(&plan.unresolved)).await;
            for (topic, partition, error) in resolved {
                tracing::warn!(link = link.name(), topic, partition, error = %crate::sync::error_chain(&error), "could not persist a new mirrored producer's mapping");
            }
            plan = plan_now();
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
        // A duplicate answer must name a batch the log still holds: checked
        // once per request (rare: only retries are duplicates); a partition
        // whose log lost it (truncated) is rebuilt and the request begun
        // again, after which what the state says comes from the log.
        let mut duplicates_checked = false;
        let tracked = loop {
            let now = tokio::time::Instant::now();
            let wait = !shutting_down && in_flight_deadline.is_none_or(|d| now < d);
            let deadline = match ctx.dedupe.begin(&mut plan, link.name(), wait, writer) {
                Begin::Begun(mut tracked) => {
                    // If its answer never comes, the broker may still append
                    // it until its own timeout (capped) has passed.
                    tracked.set_timeout_ms(timeout_ms);
                    if duplicates_checked || tracked.duplicates().is_empty() {
                        break tracked;
                    }
                    duplicates_checked = true;
                    // Held as not sent while the log is read: the session
                    // drops this wait when its client resets.
                    let unsent = Unsent(tracked);
                    let lost = Box::pin(lost_duplicates(
                        ctx,
                        state,
                        link.name(),
                        &mut plan,
                        &unsent.0,
                    ))
                    .await;
                    let tracked = unsent.sent();
                    if lost.is_empty() {
                        break tracked;
                    }
                    // Begin again from the frame: nothing of this
                    // attempt was sent.
                    tracked.unanswered();
                    for partition in lost {
                        ctx.dedupe
                            .mark_for_rebuild(partition, RebuildReason::Truncated);
                    }
                    plan = plan_now();
                    continue;
                }
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

        // The link may have been fenced while the request waited above
        // (learning topic ids, a resolve, a rebuild, a batch in flight): it
        // is looked at again here, after the last wait and with nothing
        // awaited before the frame is written to the broker. The connection
        // counts among the link's (for draining) since before the fence
        // layer's check and until its last response is in, so either this
        // sees the fence, or the drain waits for this request's response.
        if let Some(message) = ctx.control.fenced(link) {
            // Never sent: the batches' flight ends unrecorded, as with acks=0.
            tracked.unanswered();
            ctx.control.link_request_refused(link.name());
            let refused = produce::refuse_all(&frame, &index, Refusal::LinkFenced, &message);
            count_local(ctx, link.name(), &refused.local);
            let answer = replies.answer(&refused.local)?;
            tracing::debug!(
                link = link.name(),
                "refused a link Produce whose link was fenced while it waited; closing its connection"
            );
            return Ok(ProduceAction::Fenced {
                answer,
                link: link.name().to_string(),
            });
        }
        // Split brain: an instance that lost touch with the state topic may
        // have missed a failover's STOPPING; past its lease it forwards
        // nothing of the link (the failover waits the lease out).
        if !state.lease_held() {
            tracked.unanswered();
            let message = format!(
                "mirror link '{}': this proxy instance has not read the state topic within its lease ({} ms, half MIRROR_PROXY_INSTANCE_SESSION_TIMEOUT_MS), so it cannot know the link's state; retry",
                link.name(),
                state.lease().as_millis()
            );
            tracing::debug!(
                link = link.name(),
                "refused a link Produce: the state topic lease has run out"
            );
            let refused = produce::refuse_all(&frame, &index, Refusal::StateNotLoaded, &message);
            count_local(ctx, link.name(), &refused.local);
            return answered(&refused.local);
        }
        ctx.metrics
            .batches_remapped(link.name(), plan.remapped_batches as u64);
        count_local(ctx, link.name(), &plan.local);
        if plan.forwarded_partitions == 0 {
            return answered(&plan.local);
        }
        // The plan holds no reference into the frame unless some partitions are
        // answered locally, so the fast path gets the frame back without a copy.
        let mut buf = frame
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        plan.apply(&mut buf)?;
        let mirrored = std::mem::take(&mut plan.mirrored);
        if plan.local.is_empty() {
            return Ok(forward(buf, Vec::new(), tracked, mirrored));
        }
        let reduced = produce::without_local_partitions(&buf, &index, &plan.local);
        Ok(forward(reduced, plan.local, tracked, mirrored))
    }

    /// A local Produce (not a link's), as far as it goes without waiting:
    /// the state topic and read-only mirrored topics refused per partition,
    /// decided once per topic entry; everything else forwarded as it came.
    /// Without links (no state topic, nothing read-only) the request is not
    /// even walked. A topic id the proxy has not seen may name a read-only
    /// topic: unless `learnt` (the broker was just asked), the frame comes
    /// back for the caller to learn the ids first; after that, what stays
    /// unknown is refused (retriable).
    pub(crate) fn local_now(
        &self,
        h: &RequestHeaderPeek,
        frame: Bytes,
        learnt: bool,
    ) -> Result<LocalStep, FilterError> {
        let ctx = self.ctx;
        let version = h.api_version;
        let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
        let replies = Replies::new(h, &frame, body_offset)?;
        if addresses::carries_addresses(ApiKey::Produce, version) {
            addresses::check_parseable(ApiKey::Produce, version)?;
        }
        let control = &ctx.control;
        if let Some(state) = ctx.state.as_ref() {
            let index = produce::index(&frame, body_offset, version)?;
            if !learnt && produce::any_topic(&frame, &index, |t| unknown_id(ctx, t)) {
                return Ok(LocalStep::LearnIds(frame));
            }
            // The last topic's refusal, reused while entries repeat it: a
            // request of many entries to one topic builds one message.
            let mut last: Option<(String, Refusal, Arc<str>)> = None;
            let plan = produce::refuse_where(&frame, &index, |t, partitions| {
                let Some(name) = topic_name(ctx, t) else {
                    return Some((
                        Refusal::UnknownTopicId,
                        "the topic id is not known to the proxy yet; refresh metadata and retry"
                            .into(),
                    ));
                };
                let refusal = match &last {
                    Some((n, refusal, message)) if **n == *name => (*refusal, message.clone()),
                    _ if *name == *state.topic() => {
                        (Refusal::StateTopic, state_topic_message(&name).into())
                    }
                    _ => {
                        let (refusal, message) = control.read_only(&name, version)?;
                        (refusal, message.into())
                    }
                };
                last = Some((name.to_string(), refusal.0, refusal.1.clone()));
                if refusal.0 != Refusal::StateTopic {
                    control.local_writes_refused(&name, partitions);
                }
                Some(refusal)
            });
            if !plan.local.is_empty() {
                let state_topic = |l: &LocalPartition| {
                    matches!(
                        l.outcome,
                        LocalOutcome::Refused {
                            refusal: Refusal::StateTopic,
                            ..
                        }
                    )
                };
                if plan.local.iter().any(state_topic) {
                    ctx.metrics.state_topic_request_refused(ApiKey::Produce);
                    tracing::warn!(client_id = ?h.client_id(&frame), topic = state.topic(), "refused a client's Produce to the proxy's state topic");
                }
                if let Some(LocalPartition {
                    outcome: LocalOutcome::Refused { message, .. },
                    ..
                }) = plan.local.first()
                {
                    tracing::debug!(partitions = plan.local.len(), message = ?message, "refused a local write");
                }
                if plan.forwarded_partitions == 0 {
                    return replies.answered(&plan.local).map(LocalStep::Done);
                }
                let reduced = produce::without_local_partitions(&frame, &index, &plan.local);
                return Ok(LocalStep::Done(replies.forward(
                    reduced,
                    plan.local,
                    Tracked::none(),
                    Vec::new(),
                    None,
                )));
            }
        }
        let frame = BytesMut::from(frame); // unique: no copy
        Ok(LocalStep::Done(replies.forward(
            frame,
            Vec::new(),
            Tracked::none(),
            Vec::new(),
            None,
        )))
    }

    /// The response half: the frame for the client from the broker's
    /// Produce response and the request's state, and the brokers the
    /// response named (KIP-951: a leader moved), for the proxy to open
    /// listeners for before the client hears of them.
    pub(crate) fn response(
        &self,
        state: ProduceState,
        frame: BytesMut,
    ) -> Result<(BytesMut, Option<Learnt>), FilterError> {
        let ctx = self.ctx;
        let ProduceState {
            version,
            local,
            link,
        } = state;
        // A local write with nothing to settle reads no answers: its
        // response is walked only where it can name brokers.
        let Some(write) = link else {
            let (frame, learnt) = self.walked(
                &mut Answers::new([]),
                frame,
                version,
                addresses::carries_addresses(ApiKey::Produce, version),
            )?;
            return merged(frame, version, &local, learnt);
        };
        let LinkWrite {
            tracked,
            mirrored,
            link,
        } = *write;
        // Every response that can name brokers (v10+), or that answers
        // tracked partitions, gets one walk. A link write's answers are
        // looked for in every forwarded partition (the tracked ones among
        // them), for its figures.
        let mut answers = match mirrored.is_empty() {
            true => tracked.answers(),
            false => Answers::new(mirrored.iter().map(|m| (&*m.topic, m.partition))),
        };
        let walk = !tracked.is_empty()
            || !mirrored.is_empty()
            || addresses::carries_addresses(ApiKey::Produce, version);
        let (frame, learnt) = self.walked(&mut answers, frame, version, walk)?;
        let found = answers.into_found();
        let now = crate::state::now_ms();
        // A response that cannot be walked returned above and dropped
        // `tracked`: its batches fail.
        if mirrored.is_empty() {
            if !tracked.is_empty() {
                tracked.settle(&found, now);
            }
        } else {
            if let Some(link) = &link {
                acknowledged(ctx, link, &mirrored, &found, now);
            }
            if !tracked.is_empty() {
                let of_tracked = tracked_answers(&tracked, &mirrored, &found);
                tracked.settle(&of_tracked, now);
            }
        }
        merged(frame, version, &local, learnt)
    }

    /// `frame` walked by `answers` when `walk`: the walk reads the answers
    /// and stops at leader endpoints (KIP-951: only when a leader moved),
    /// which only then are rewritten by a walk of the response's schema.
    fn walked(
        &self,
        answers: &mut Answers<'_>,
        frame: BytesMut,
        version: i16,
        walk: bool,
    ) -> Result<(BytesMut, Option<Learnt>), FilterError> {
        if !walk {
            return Ok((frame, None));
        }
        match answers.walk(&frame, version)? {
            Walked::Whole => Ok((frame, None)),
            Walked::NamesBrokers => {
                let (out, named) =
                    addresses::rewrite(ApiKey::Produce, version, &frame, &self.ctx.advertised)?;
                Ok((out.unwrap_or(frame), Some(named)))
            }
        }
    }
}

/// The broker's response with the partitions the proxy answered itself
/// merged in.
fn merged(
    frame: BytesMut,
    version: i16,
    local: &[LocalPartition],
    learnt: Option<Learnt>,
) -> Result<(BytesMut, Option<Learnt>), FilterError> {
    if local.is_empty() {
        return Ok((frame, learnt));
    }
    let frame = produce::merge_response(&frame.freeze(), version, local)?;
    Ok((frame, learnt))
}

/// What becomes of a local Produce without waiting.
pub(crate) enum LocalStep {
    Done(ProduceAction),
    /// The request names topic ids the proxy has not seen: learn them
    /// from the broker, then decide (the frame, untouched).
    LearnIds(Bytes),
}

/// How a Produce request is answered: its version, correlation id and
/// whether it expects an answer at all (`acks != 0`).
struct Replies {
    version: i16,
    correlation_id: i32,
    expects_response: bool,
}

impl Replies {
    fn new(
        h: &RequestHeaderPeek,
        frame: &[u8],
        body_offset: usize,
    ) -> Result<Replies, FilterError> {
        let acks = produce_acks(frame, body_offset, h.api_version)?;
        Ok(Replies {
            version: h.api_version,
            correlation_id: h.correlation_id,
            expects_response: acks != 0,
        })
    }

    /// `frame` to the broker. With acks=0 nothing is recorded without an
    /// answer: the tracked batches are failed. No client retries what it
    /// never hears about, so there is no retry to deduplicate and the
    /// partition is not re-read.
    #[inline]
    fn forward(
        &self,
        frame: BytesMut,
        local: Vec<LocalPartition>,
        tracked: Tracked,
        mirrored: Vec<MirroredPartition>,
        link: Option<Arc<LinkMirror>>,
    ) -> ProduceAction {
        let state = match self.expects_response {
            true => Some(ProduceState {
                version: self.version,
                local,
                link: match tracked.is_empty()
                    && tracked.duplicates().is_empty()
                    && mirrored.is_empty()
                    && link.is_none()
                {
                    true => None,
                    false => Some(Box::new(LinkWrite {
                        tracked,
                        mirrored,
                        link,
                    })),
                },
            }),
            false => {
                tracked.unanswered();
                None
            }
        };
        ProduceAction::Forward { frame, state }
    }

    /// Every partition answered here.
    fn answered(&self, local: &[LocalPartition]) -> Result<ProduceAction, FilterError> {
        self.answer(local).map(ProduceAction::Answered)
    }

    /// The response when the proxy answers every partition (`None` with
    /// acks=0).
    fn answer(&self, local: &[LocalPartition]) -> Result<Option<BytesMut>, FilterError> {
        Ok(match self.expects_response {
            true => Some(produce::local_response(
                self.correlation_id,
                self.version,
                local,
            )?),
            false => None,
        })
    }
}

pub(crate) struct ProduceLayer<'a> {
    ctx: &'a Context,
    subject: Option<&'a CertSubject>,
}

impl<'a> ProduceLayer<'a> {
    /// The Produce filter of a connection whose client presented `subject`.
    pub(crate) fn new(ctx: &'a Context, subject: Option<&'a CertSubject>) -> ProduceLayer<'a> {
        ProduceLayer { ctx, subject }
    }
}

impl<'a, S> Layer<S> for ProduceLayer<'a> {
    type Service = Produce<'a, S>;

    fn layer(&self, inner: S) -> Produce<'a, S> {
        Produce {
            filter: ProduceFilter::new(self.ctx),
            writer: self.ctx.dedupe.writer(),
            subject: self.subject,
            inner,
        }
    }
}

/// The filter: Produce requests go through [`ProduceFilter`].
pub(crate) struct Produce<'a, S> {
    filter: ProduceFilter<'a>,
    /// This connection, for the mirrored partitions it may write without
    /// a rebuild.
    writer: Writer,
    subject: Option<&'a CertSubject>,
    inner: S,
}

impl<'a, S: Service> Service for Produce<'a, S> {
    type Pending = Then<S::Pending, ProduceHalf<'a>>;

    fn call(&mut self, request: Request) -> Step<'_, Outcome<Self::Pending>> {
        if request.api != Some(ApiKey::Produce) {
            return pass(&mut self.inner, request, Then::inner);
        }
        // A local Produce is decided without waiting. A link's (which may
        // wait on the state topic or a rebuild) and a local one naming
        // unknown topic ids are boxed.
        let request = match request.origin {
            Origin::Local => {
                let Request {
                    header,
                    api,
                    origin,
                    frame,
                } = request;
                match self.filter.local_now(&header, frame.freeze(), false) {
                    Ok(LocalStep::Done(action)) => {
                        return self.act(header, api, origin, action);
                    }
                    Ok(LocalStep::LearnIds(frame)) => Request {
                        header,
                        api,
                        origin,
                        frame: BytesMut::from(frame),
                    },
                    Err(e) => return Step::Ready(Err(e)),
                }
            }
            _ => request,
        };
        Step::Wait(Box::pin(self.produce(request)))
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

impl<'a, S: Service> Produce<'a, S> {
    /// A Produce request whose request half may wait: the request half,
    /// then what it decided.
    async fn produce(
        &mut self,
        request: Request,
    ) -> Result<Outcome<Then<S::Pending, ProduceHalf<'a>>>, FilterError> {
        let Request {
            header,
            api,
            origin,
            frame,
        } = request;
        let action = self
            .filter
            .request(self.writer, &origin, self.subject, &header, frame.freeze())
            .await?;
        self.act(header, api, origin, action).decided().await
    }

    /// What the request half decided: the proxy's own answer, or the broker
    /// for what is left to forward, with the response half to run.
    #[inline]
    fn act(
        &mut self,
        header: RequestHeaderPeek,
        api: Option<ApiKey>,
        origin: Origin,
        action: ProduceAction,
    ) -> Step<'_, Outcome<Then<S::Pending, ProduceHalf<'a>>>> {
        let (frame, state) = match action {
            ProduceAction::Answered(Some(answer)) => {
                return Step::Ready(Ok(Outcome::Owed(Then::local(answer))))
            }
            ProduceAction::Answered(None) => return Step::Ready(Ok(Outcome::NotOwed)),
            ProduceAction::Fenced { answer, link } => {
                return Step::Ready(Ok(Outcome::Fenced {
                    owed: answer.map(Then::local),
                    link,
                }))
            }
            ProduceAction::Forward { frame, state } => (frame, state),
        };
        let forwarded = Request {
            header,
            api,
            origin,
            frame,
        };
        let ctx = self.filter.ctx;
        self.inner.call(forwarded).map(move |outcome| match state {
            Some(state) => outcome.map(|p| Then::new(p, ProduceHalf { ctx, state })),
            // acks=0: the broker sends nothing back.
            None => outcome.discard(),
        })
    }
}

/// The response half of one Produce request.
pub(crate) struct ProduceHalf<'a> {
    ctx: &'a Context,
    state: ProduceState,
}

impl ResponseHalf for ProduceHalf<'_> {
    #[inline]
    fn respond(self, frame: BytesMut, learnt: &mut Learnt) -> Result<BytesMut, FilterError> {
        let (out, named) = ProduceFilter::new(self.ctx).response(self.state, frame)?;
        if let Some(named) = named {
            learnt.absorb(named);
        }
        Ok(out)
    }
}

/// Every partition of a Produce answered here with `refusal` (a request of
/// a fenced link): the response, unless `acks=0`.
pub(crate) fn refuse_every_partition(
    ctx: &Context,
    link: &str,
    h: &RequestHeaderPeek,
    frame: Bytes,
    refusal: Refusal,
    message: &str,
) -> Result<Option<BytesMut>, FilterError> {
    let version = h.api_version;
    let body_offset = h.body_offset(&frame, ApiKey::Produce.request_header_version(version))?;
    let acks = produce_acks(&frame, body_offset, version)?;
    let index = produce::index(&frame, body_offset, version)?;
    let plan = produce::refuse_all(&frame, &index, refusal, message);
    count_local(ctx, link, &plan.local);
    Ok(match acks != 0 {
        true => Some(produce::local_response(
            h.correlation_id,
            version,
            &plan.local,
        )?),
        false => None,
    })
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
    mut claim: RebuildClaim,
) {
    let partition = claim.partition();
    let name = ctx
        .topics
        .name(partition.topic_id)
        .map_or_else(|| claim.topic().name.0.to_string(), |n| n.to_string());
    let owner = |mapped: i64| state.view().owner(partition, mapped);
    let floor = state.barrier_floor(partition).unwrap_or(0);
    // Batches whose answer never came and whose wait is over: what this
    // read does not hold of them is taken as never appended, so the read
    // must be stable (the log end the same when read again after it).
    let confirming = claim.confirming();
    let client = state.client();
    let bytes = claim.rebuild_bytes();
    let read = async {
        // A writer new to a ready partition catches up from the log end
        // known here, unless lost batches must be confirmed (a stable
        // tail) or that cannot be read (then the tail, as after start-up).
        if let (Some(since), false) = (claim.since(), confirming) {
            let since = since.max(floor);
            let read_at = Instant::now();
            if let Some(tail) =
                rebuild::read_since(client, &name, partition.partition, since, bytes).await?
            {
                return Ok((tail, read_at, false));
            }
        }
        claim.full();
        rebuild::read_tail_stable(
            client,
            &name,
            partition.partition,
            floor,
            bytes,
            if confirming { STABLE_READS } else { 0 },
        )
        .await
    };
    let error = match tokio::time::timeout(REBUILD_TIMEOUT, read).await {
        Ok(Ok((_, _, false))) if confirming => format!(
            "its log end kept moving over {STABLE_READS} reads, so whether a request whose answer was lost was appended cannot be told yet"
        ),
        Ok(Ok((tail, read_at, stable))) => {
            let r = claim.apply(
                tail.start,
                tail.end,
                tail.from,
                &tail.records,
                &owner,
                read_at,
                stable,
            );
            if r.replayed.untaken > 0 {
                // Not made ready: the state would miss batches the log holds.
                ctx.metrics.producer_state_rebuilt("failed", 0);
                tracing::warn!(
                    link,
                    topic = name,
                    partition = partition.partition,
                    untaken = r.replayed.untaken,
                    "could not rebuild the mirrored producer state: it is full of producers with batches in flight; the partition is answered retriable"
                );
                let message = format!(
                    "mirror link '{link}': {name}-{}: the mirrored producer state is full of producers with batches in flight (PRODUCER_STATE_MAX_ENTRIES); retry",
                    partition.partition
                );
                Dedupe::refuse_partition(plan, partition, message);
                return;
            }
            tracing::info!(
                link,
                topic = name,
                partition = partition.partition,
                from_offset = r.from_offset,
                log_start_offset = r.log_start_offset,
                log_end_offset = r.log_end_offset,
                batches = r.replayed.batches,
                taken = r.replayed.taken,
                lost_found = r.doubts.found,
                lost_absent = r.doubts.absent,
                lost_in_doubt = r.doubts.left,
                stable,
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

/// How many times a rebuild that must settle lost batches reads the tail
/// for a log end that stays put before the partition is answered
/// retriable.
const STABLE_READS: u32 = 3;

/// How long a duplicate's check waits for its batch to become readable
/// (past the high watermark) before taking it as not held.
const HOLDS_WAIT: Duration = Duration::from_secs(2);

/// How many of one request's duplicate checks run at once. The proxy's
/// client carries one request at a time per broker, so checks of
/// partitions led by one broker queue there anyway, ahead of the state
/// topic's own requests: a few at once lets partitions on different
/// brokers overlap without one request queueing all its checks in front
/// of everyone else's.
const DUPLICATE_CHECKS_AT_ONCE: usize = 4;

/// Checks that the log still holds each batch `tracked` answers as a
/// duplicate. Returns the partitions whose log does not (truncated: they
/// need a rebuild). One that cannot be checked (an error, or not done
/// when the request's [`REBUILD_TIMEOUT`] is up) is answered retriable in
/// `plan` instead.
async fn lost_duplicates(
    ctx: &Context,
    state: &StateStore,
    link: &str,
    plan: &mut ProducePlan,
    tracked: &Tracked,
) -> Vec<PartitionId> {
    let client = state.client();
    let name = |d: &DuplicateAnswer| {
        ctx.topics
            .name(d.partition.topic_id)
            .map_or_else(|| d.topic.name.0.to_string(), |n| n.to_string())
    };
    check_duplicates(link, &mut plan.local, tracked.duplicates(), &name, |d| {
        let topic = name(d);
        async move {
            rebuild::holds(
                client,
                &topic,
                d.partition.partition,
                d.base_offset,
                &d.batch,
                HOLDS_WAIT,
            )
            .await
        }
    })
    .await
}

/// [`lost_duplicates`] with the one check (`check`, a Fetch of the batch
/// in the proxy; anything in the tests) and the topic's name (`name`) given.
///
/// One deadline, [`REBUILD_TIMEOUT`] from now, bounds all of a request's
/// checks together: a check per partition, each with a bound of its own,
/// would hold the request's frame (and its client's retry) for as many
/// bounds as the request has duplicate partitions. A check not done by
/// then is answered as one that timed out always was (retriable), while
/// those done keep what they found. Cancel-safe: dropping this (the
/// client reset) drops the checks in flight, whose client connections
/// then close rather than carry a late answer.
async fn check_duplicates<'d, C, F>(
    link: &str,
    local: &mut [LocalPartition],
    duplicates: &'d [DuplicateAnswer],
    name: &(dyn Fn(&DuplicateAnswer) -> String + Sync),
    check: C,
) -> Vec<PartitionId>
where
    C: Fn(&'d DuplicateAnswer) -> F,
    F: Future<Output = Result<rebuild::Held, ClientError>>,
{
    let deadline = tokio::time::Instant::now() + REBUILD_TIMEOUT;
    // By the duplicate's place, so the answers below follow the request's
    // order whichever check ends first; `None`: not done in time.
    let mut found: Vec<Option<Result<rebuild::Held, ClientError>>> =
        std::iter::repeat_with(|| None)
            .take(duplicates.len())
            .collect();
    let mut waiting = duplicates.iter().enumerate();
    let mut running = FuturesUnordered::new();
    let all = async {
        loop {
            // Topped up as checks end: at most a few at once, each begun
            // once, so the cost stays linear in the request.
            while running.len() < DUPLICATE_CHECKS_AT_ONCE {
                let Some((at, d)) = waiting.next() else {
                    break;
                };
                let check = check(d);
                running.push(async move { (at, check.await) });
            }
            let Some((at, result)) = running.next().await else {
                break;
            };
            if let Some(slot) = found.get_mut(at) {
                *slot = Some(result);
            }
        }
    };
    // Timed out or not, `found` holds what ended by the deadline.
    let _ = tokio::time::timeout_at(deadline, all).await;
    let mut lost = Vec::new();
    for (d, found) in duplicates.iter().zip(found) {
        let error = match found {
            Some(Ok(rebuild::Held::Yes | rebuild::Held::BelowLogStart)) => continue,
            Some(Ok(rebuild::Held::No)) => {
                tracing::warn!(
                    link,
                    topic = name(d),
                    partition = d.partition.partition,
                    offset = d.base_offset,
                    producer_id = d.batch.producer_id,
                    epoch = d.batch.epoch,
                    first_sequence = d.batch.first_seq,
                    "a batch remembered as appended is not in the log (truncated): its partition's mirrored producer state is rebuilt from the log"
                );
                lost.push(d.partition);
                continue;
            }
            Some(Err(e)) => e.to_string(),
            None => format!(
                "not read within {} s, the bound of all the request's checks",
                REBUILD_TIMEOUT.as_secs()
            ),
        };
        let message = format!(
            "mirror link '{link}': {}-{}: could not check that the log still holds the duplicate batch at offset {} ({error}); retry",
            name(d),
            d.partition.partition,
            d.base_offset
        );
        let message: Arc<str> = message.into();
        for l in local.iter_mut().filter(|l| {
            l.partition == d.partition.partition
                && Arc::ptr_eq(&l.topic, &d.topic)
                && matches!(l.outcome, LocalOutcome::Duplicate { .. })
        }) {
            l.outcome = LocalOutcome::Refused {
                refusal: Refusal::StateNotRebuilt,
                message: message.clone(),
            };
        }
    }
    lost
}

/// A Produce topic's name: the request's own before v13, else looked up by
/// its id (`None` while the proxy has not seen the id in a response).
/// Why a client may not write the state topic.
fn state_topic_message(topic: &str) -> String {
    format!("'{topic}' is the kafka-mirror-proxy state topic, which only the proxy writes")
}

/// Whether `topic` is an id the proxy has not seen.
fn unknown_id(ctx: &Context, topic: TopicKey<'_>) -> bool {
    matches!(topic, TopicKey::Id(id) if ctx.topics.name(id).is_none())
}

/// Learn every topic's id from the broker (at most once a second, bounded
/// in time): a client may name a topic by an id it learnt elsewhere (from
/// another instance, or before this proxy restarted).
async fn learn_topic_ids(ctx: &Context) {
    let Some(state) = ctx.state.as_ref() else {
        return;
    };
    if !ctx.topics.may_ask(std::time::Instant::now()) {
        return;
    }
    match tokio::time::timeout(TOPIC_IDS_TIMEOUT, state.all_topic_ids()).await {
        Ok(Ok(topics)) => ctx.topics.learn(topics),
        Ok(Err(error)) => {
            tracing::warn!(error = %crate::sync::error_chain(&error), "could not learn topic ids from the broker")
        }
        Err(_) => tracing::warn!(
            timeout_ms = TOPIC_IDS_TIMEOUT.as_millis() as u64,
            "could not learn topic ids from the broker in time"
        ),
    }
}

/// A request's begun batches while its request half still waits, before
/// anything of it is written to the broker. The session drops that wait
/// when its client resets: the batches' flight then ends unrecorded, as
/// with `acks=0` (nothing was sent, so their outcome is known: not
/// appended), not as an unknown outcome, which would hold the producer's
/// next batches back and have the partition read again for nothing.
struct Unsent(Tracked);

impl Unsent {
    /// The wait is over: the batches go on with the request.
    fn sent(mut self) -> Tracked {
        std::mem::replace(&mut self.0, Tracked::none())
    }
}

impl Drop for Unsent {
    fn drop(&mut self) {
        std::mem::replace(&mut self.0, Tracked::none()).unanswered();
    }
}

/// How long a request naming an unknown topic id waits for the broker to
/// name every topic's id.
const TOPIC_IDS_TIMEOUT: Duration = Duration::from_secs(5);

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
    // One log line per request, whatever the number of its partitions.
    let (mut refused, mut first_refused) = (0usize, None);
    let (mut duplicates, mut duplicate_batches) = (0usize, 0usize);
    for l in local {
        match &l.outcome {
            LocalOutcome::DroppedControl { batches } => {
                ctx.metrics.control_batches_dropped(link, *batches as u64)
            }
            LocalOutcome::Duplicate { batches, .. } => {
                duplicates += 1;
                duplicate_batches += batches;
                ctx.metrics.duplicates_answered(link, *batches as u64);
                if let (Some(m), Some(topic)) =
                    (ctx.metrics.link_mirror(link), topic_of(ctx, &l.topic))
                {
                    m.duplicates(&topic, l.partition, *batches as u64);
                }
            }
            LocalOutcome::Refused { refusal, message } => {
                refused += 1;
                first_refused.get_or_insert((l.partition, *refusal, message));
                ctx.metrics.partition_refused(link, refusal.label());
            }
        }
    }
    if let Some((partition, refusal, message)) = first_refused {
        tracing::warn!(link, partitions = refused, first_partition = partition, reason = refusal.label(), message = ?message, "refused mirrored partitions");
    }
    if duplicates > 0 {
        tracing::debug!(
            link,
            partitions = duplicates,
            batches = duplicate_batches,
            "answered mirrored retries as duplicates"
        );
    }
}

/// The name of a topic as a request names it: its own before v13, else
/// looked up by its id (`None` while unknown).
fn topic_of<'t>(ctx: &Context, topic: &'t TopicRef) -> Option<TopicName<'t>> {
    match topic.topic_id.is_nil() {
        true => Some(TopicName::Request(topic.name.0.as_str())),
        false => ctx.topics.name(topic.topic_id).map(TopicName::Known),
    }
}

/// Record the link write's partitions the broker appended (error NONE) in
/// the link's figures, answered at `now_ms`.
fn acknowledged(
    ctx: &Context,
    link: &LinkMirror,
    mirrored: &[MirroredPartition],
    found: &[Option<PartitionAnswer>],
    now_ms: i64,
) {
    for (m, answer) in mirrored.iter().zip(found) {
        let Some(a) = answer.filter(|a| a.error_code == 0 && a.base_offset >= 0) else {
            continue;
        };
        let topic = topic_of(ctx, &m.topic);
        link.acknowledged(
            topic.as_deref(),
            m.partition,
            &m.batches,
            a.base_offset,
            now_ms,
        );
    }
}

/// The answers of `tracked`'s partitions, in its order, out of those found
/// for `mirrored` (every forwarded partition, the tracked ones among them,
/// in the same order: found by one forward scan).
fn tracked_answers(
    tracked: &Tracked,
    mirrored: &[MirroredPartition],
    found: &[Option<PartitionAnswer>],
) -> SmallVec<[Option<PartitionAnswer>; 2]> {
    let mut from = 0;
    tracked
        .asked()
        .map(|(topic, partition)| {
            let at = (from..mirrored.len())
                .chain(0..from.min(mirrored.len()))
                .find(|&k| {
                    std::ptr::eq(&*mirrored[k].topic, topic) && mirrored[k].partition == partition
                })?;
            from = at + 1;
            found.get(at).copied().flatten()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use kafka_protocol::messages::TopicName;
    use kafka_protocol::protocol::StrBytes;
    use tokio::time::{sleep, Instant};
    use uuid::Uuid;

    use super::rebuild::Held;
    use super::*;
    use crate::mirror::producer_state::BatchId;

    /// When each check's future ended (finished or dropped), by partition.
    type Ends = Arc<Mutex<Vec<(i32, Instant)>>>;

    /// Records, when dropped, that its check ended: a check cut off at
    /// the deadline is dropped there, not left running.
    struct Ended(Ends, i32);

    impl Drop for Ended {
        fn drop(&mut self) {
            if let Ok(mut ends) = self.0.lock() {
                ends.push((self.1, Instant::now()));
            }
        }
    }

    fn topic() -> Arc<TopicRef> {
        Arc::new(TopicRef {
            name: TopicName(StrBytes::from_static_str("mirrored")),
            topic_id: Uuid::from_u128(7),
        })
    }

    fn duplicate(topic: &Arc<TopicRef>, partition: i32) -> DuplicateAnswer {
        DuplicateAnswer {
            topic: topic.clone(),
            partition: PartitionId {
                topic_id: topic.topic_id,
                partition,
            },
            batch: BatchId {
                producer_id: 1000,
                epoch: 0,
                first_seq: partition * 10,
                last_seq: partition * 10 + 9,
            },
            base_offset: 100 + i64::from(partition),
        }
    }

    fn answered_duplicate(topic: &Arc<TopicRef>, partition: i32) -> LocalPartition {
        LocalPartition {
            topic: topic.clone(),
            partition,
            entry: partition as u32,
            outcome: LocalOutcome::Duplicate {
                base_offset: 100 + i64::from(partition),
                batches: 1,
            },
        }
    }

    fn name(d: &DuplicateAnswer) -> String {
        d.topic.name.0.to_string()
    }

    /// How long the check of each partition takes and what it finds
    /// (`None`: it never answers). Partitions 1, 3 and 5 are slower than
    /// the bound; 4 fails, 2 finds the batch lost, 6 ends shortly before
    /// the deadline (begun at 3 s, done at 13 s: four run at once).
    fn scripted(partition: i32) -> (Duration, Option<Result<Held, ClientError>>) {
        let s = Duration::from_secs;
        match partition {
            0 => (s(0), Some(Ok(Held::Yes))),
            1 => (s(0), None),
            2 => (s(1), Some(Ok(Held::No))),
            3 => (s(40), Some(Ok(Held::Yes))),
            4 => (
                s(3),
                Some(Err(ClientError::Closed {
                    broker: "broker:9092".into(),
                })),
            ),
            5 => (s(16), Some(Ok(Held::Yes))),
            _ => (s(10), Some(Ok(Held::BelowLogStart))),
        }
    }

    /// A check that follows [`scripted`], recording when it ends in `ends`.
    fn check(
        ends: &Ends,
    ) -> impl Fn(
        &DuplicateAnswer,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Held, ClientError>> + Send>>
           + '_ {
        move |d| {
            let ended = Ended(ends.clone(), d.partition.partition);
            let (after, answer) = scripted(d.partition.partition);
            Box::pin(async move {
                let _ended = ended;
                sleep(after).await;
                match answer {
                    Some(answer) => answer,
                    None => std::future::pending().await,
                }
            })
        }
    }

    fn refused_message(l: &LocalPartition) -> Option<&str> {
        match &l.outcome {
            LocalOutcome::Refused {
                refusal: Refusal::StateNotRebuilt,
                message,
            } => Some(message),
            _ => None,
        }
    }

    /// A request with many duplicate partitions whose checks are slow
    /// waits one bound for all of them, not one per partition: the slow
    /// ones are cut off together at the deadline and answered retriable as
    /// a timed-out check is, and those done by then keep their answers.
    #[tokio::test(start_paused = true)]
    async fn duplicate_checks_share_one_deadline() {
        let topic = topic();
        let duplicates: Vec<_> = (0..7).map(|p| duplicate(&topic, p)).collect();
        let mut local: Vec<_> = (0..7).map(|p| answered_duplicate(&topic, p)).collect();
        // Not a duplicate: left alone.
        local.push(LocalPartition {
            topic: topic.clone(),
            partition: 9,
            entry: 9,
            outcome: LocalOutcome::DroppedControl { batches: 1 },
        });
        let ends = Ends::default();
        let start = Instant::now();

        let lost = check_duplicates("link-a", &mut local, &duplicates, &name, check(&ends)).await;

        assert_eq!(
            Instant::now() - start,
            REBUILD_TIMEOUT,
            "three checks slower than the bound end at the one deadline, not after three bounds"
        );
        let mut ends = ends.lock().map(|e| e.clone()).unwrap_or_default();
        ends.sort_by_key(|(partition, _)| *partition);
        let ended = |p: i32| {
            ends.iter()
                .find(|(q, _)| *q == p)
                .map(|(_, at)| *at - start)
        };
        let s = Duration::from_secs;
        // Each check began once and ended (done, or cut off at the deadline).
        assert_eq!(ends.len(), 7, "{ends:?}");
        assert_eq!(ended(0), Some(s(0)));
        assert_eq!(ended(2), Some(s(1)));
        assert_eq!(ended(4), Some(s(3)));
        // Begun once the check of partition 4 ended (four at once).
        assert_eq!(ended(6), Some(s(13)));
        for slow in [1, 3, 5] {
            assert_eq!(ended(slow), Some(REBUILD_TIMEOUT), "partition {slow}");
        }

        // Not in the log: rebuilt, its duplicate answer left to the rebuild.
        assert_eq!(
            lost,
            vec![PartitionId {
                topic_id: topic.topic_id,
                partition: 2
            }]
        );
        for kept in [0, 2, 6] {
            assert!(
                matches!(local[kept].outcome, LocalOutcome::Duplicate { base_offset, batches: 1 } if base_offset == 100 + kept as i64),
                "partition {kept}: {:?}",
                local[kept].outcome
            );
        }
        // The retriable answer of a check that could not be done.
        let failed = refused_message(&local[4]).unwrap_or_default();
        assert!(
            failed.contains("broker:9092 closed the connection"),
            "{failed}"
        );
        assert!(failed.ends_with("; retry"), "{failed}");
        for slow in [1, 3, 5] {
            let message = refused_message(&local[slow]).unwrap_or_default();
            assert!(
                message.contains(&format!(
                    "mirrored-{slow}: could not check that the log still holds the duplicate batch at offset {}",
                    100 + slow
                )) && message.contains("not read within 15 s"),
                "partition {slow}: {message}"
            );
        }
        assert!(matches!(
            local[7].outcome,
            LocalOutcome::DroppedControl { batches: 1 }
        ));
    }

    /// Cancel-safe: a request dropped while its checks run (its client
    /// reset) drops every check in flight at once and begins no more.
    #[tokio::test(start_paused = true)]
    async fn dropped_duplicate_checks_end_at_once() {
        let topic = topic();
        let duplicates: Vec<_> = (0..7).map(|p| duplicate(&topic, p)).collect();
        let mut local: Vec<_> = (0..7).map(|p| answered_duplicate(&topic, p)).collect();
        let ends = Ends::default();
        let start = Instant::now();
        let checks = check_duplicates("link-a", &mut local, &duplicates, &name, check(&ends));
        let reset = Duration::from_secs(2);
        assert!(tokio::time::timeout(reset, checks).await.is_err());

        let ends = ends.lock().map(|e| e.clone()).unwrap_or_default();
        let at = |p: i32| {
            ends.iter()
                .find(|(q, _)| *q == p)
                .map(|(_, at)| *at - start)
        };
        // Ended by 2 s: 0 and 2 done; 1, 3, 4 and 5 running, dropped then.
        assert_eq!(ends.len(), 6, "{ends:?}");
        for p in [1, 3, 4, 5] {
            assert_eq!(at(p), Some(reset), "partition {p}");
        }
        assert_eq!(at(6), None, "not begun: four were running");
        assert!(local
            .iter()
            .all(|l| matches!(l.outcome, LocalOutcome::Duplicate { .. })));
    }
}
