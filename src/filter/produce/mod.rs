//! The Produce filter (SPEC §6), the glue around two halves. The request
//! half decides what to answer and what to forward: the decision itself is
//! pure, in `decide` (refuse writes to read-only mirrored topics and the
//! state topic, refuse a spoofed link, plan a link's request with
//! `mirror::produce`); the waits of a link write (new origins resolved in
//! the state store, its mirrored producer state begun with `mirror::dedupe`
//! and rebuilt from the log where claimed) are in `wait`. The response
//! half (`ProduceFilter::response`) rewrites leader endpoints, records
//! what the broker appended and merges in the partitions answered locally,
//! with the per-request state (`ProduceState`) that links the two.
//! `ProduceLayer` puts it in the stack.

pub(crate) mod decide;
pub(crate) mod wait;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use smallvec::SmallVec;
use tower::Layer;
use uuid::Uuid;

use super::addresses::{self, Learnt};
use super::{
    pass, Context, FilterError, Outcome, Pending, Request, ResponseHalf, Service, Step, Then,
};
use crate::metrics::mirrored::LinkMirror;
use crate::mirror::dedupe::{Tracked, Writer};
use crate::mirror::link::{CertSubject, Link, Origin};
use crate::mirror::produce::{
    self, Index, LocalOutcome, LocalPartition, MirroredPartition, Refusal,
};
use crate::mirror::produce_response::{Answers, PartitionAnswer};
use crate::wire::header::RequestHeaderPeek;
use crate::wire::produce_response_walk::Walked;
use decide::{Head, LocalDecision, Release};

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

impl decide::TopicNames for Context {
    fn topic_name(&self, id: Uuid) -> Option<Arc<str>> {
        self.topics.name(id)
    }
}

impl decide::Known for Context {
    fn state_topic(&self) -> Option<&str> {
        self.state.as_deref().map(|s| s.topic())
    }

    fn read_only(&self, topic: &str, version: i16) -> Option<(Refusal, String)> {
        self.control.read_only(topic, version)
    }

    fn count_refused(&self, topic: &str, partitions: usize) {
        self.control.local_writes_refused(topic, partitions);
    }
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

    /// The request half of a link's Produce (`frame`, whose head is
    /// `head`), or of a client claiming a link's id without its certificate
    /// (`spoofed`): what to answer and what to forward.
    pub(crate) async fn link_request(
        &self,
        writer: Writer,
        link: &Link,
        spoofed: bool,
        subject: Option<&CertSubject>,
        head: Head,
        frame: Bytes,
    ) -> Result<ProduceAction, FilterError> {
        let ctx = self.ctx;
        let loaded = match ctx.state.as_deref() {
            Some(state) if state.is_loaded() => Ok(state),
            other => Err(other
                .and_then(|s| s.not_ready_reason())
                .unwrap_or_else(|| "no state store".into())),
        };
        let state = match decide::admit(link, spoofed, loaded) {
            Ok(state) => state,
            Err((refusal, message)) => {
                if spoofed {
                    tracing::warn!(link = link.name(), subject = ?subject.map(|s| &s.full), "refused a Produce that claims a mirror link's client id");
                }
                let index = head.index(&frame)?;
                return refuse_whole(ctx, link.name(), &head, &frame, &index, refusal, &message)
                    .map(ProduceAction::Answered);
            }
        };
        let link_mirror = ctx.metrics.link_mirror(link.name());
        let index = head.index(&frame)?;
        let timeout_ms = head.timeout_ms(&frame)?;
        if decide::names_unknown_id(&frame, &index, &ctx.topics) {
            // Boxed: rare, and it would size every request's future.
            Box::pin(learn_topic_ids(ctx)).await;
        }
        let plan_now = || {
            let view = state.view();
            decide::plan_link(
                &frame,
                &index,
                link,
                &ctx.topics,
                &|name| ctx.topics.id(name).or_else(|| state.topic_id(name)),
                &produce::AtTime(&view, crate::state::now_ms()),
            )
        };
        let mut plan = plan_now();
        if !plan.unresolved.is_empty() {
            // New origins: persisted before anything of them is forwarded.
            // Boxed, like the waits below: rare, and their futures would
            // otherwise size every connection's task for good.
            let resolved = Box::pin(state.resolve(&plan.unresolved)).await;
            for (topic, partition, error) in resolved {
                tracing::warn!(link = link.name(), topic, partition, error = %crate::sync::error_chain(&error), "could not persist a new mirrored producer's mapping");
            }
            plan = plan_now();
        }
        let recovery = wait::LogRecovery {
            ctx,
            state,
            link: link.name(),
            replan: &plan_now,
        };
        let tracked = wait::begin(
            &ctx.dedupe,
            &recovery,
            link.name(),
            writer,
            timeout_ms,
            &mut plan,
        )
        .await;

        // The link may have been fenced while the request waited above
        // (learning topic ids, a resolve, a rebuild, a batch in flight): it
        // is looked at again here, after the last wait and with nothing
        // awaited before the frame is written to the broker. The connection
        // counts among the link's (for draining) since before the fence
        // layer's check and until its last response is in, so either this
        // sees the fence, or the drain waits for this request's response.
        // Split brain: an instance that lost touch with the state topic may
        // have missed a failover's STOPPING; past its lease it forwards
        // nothing of the link (the failover waits the lease out).
        let fenced = ctx.control.fenced(link);
        let lapsed = match fenced.is_none() && !state.lease_held() {
            true => Some(state.lease()),
            false => None,
        };
        match decide::release(link, fenced, lapsed) {
            Release::Go => {}
            Release::Fenced(message) => {
                // Never sent: the batches' flight ends unrecorded, as with
                // acks=0.
                tracked.unanswered();
                ctx.control.link_request_refused(link.name());
                let answer = refuse_whole(
                    ctx,
                    link.name(),
                    &head,
                    &frame,
                    &index,
                    Refusal::LinkFenced,
                    &message,
                )?;
                tracing::debug!(
                    link = link.name(),
                    "refused a link Produce whose link was fenced while it waited; closing its connection"
                );
                return Ok(ProduceAction::Fenced {
                    answer,
                    link: link.name().to_string(),
                });
            }
            Release::LeaseLapsed(message) => {
                tracked.unanswered();
                tracing::debug!(
                    link = link.name(),
                    "refused a link Produce: the state topic lease has run out"
                );
                return refuse_whole(
                    ctx,
                    link.name(),
                    &head,
                    &frame,
                    &index,
                    Refusal::StateNotLoaded,
                    &message,
                )
                .map(ProduceAction::Answered);
            }
        }
        ctx.metrics
            .batches_remapped(link.name(), plan.remapped_batches as u64);
        count_local(ctx, link.name(), &plan.local);
        if plan.forwarded_partitions == 0 {
            return head.answer(&plan.local).map(ProduceAction::Answered);
        }
        // The plan holds no reference into the frame unless some partitions are
        // answered locally, so the fast path gets the frame back without a copy.
        let mut buf = frame
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
        plan.apply(&mut buf)?;
        let mirrored = std::mem::take(&mut plan.mirrored);
        let link_mirror = link_mirror.cloned();
        if plan.local.is_empty() {
            return Ok(forward(
                &head,
                buf,
                Vec::new(),
                tracked,
                mirrored,
                link_mirror,
            ));
        }
        let reduced = produce::without_local_partitions(&buf, &index, &plan.local);
        Ok(forward(
            &head,
            reduced,
            plan.local,
            tracked,
            mirrored,
            link_mirror,
        ))
    }

    /// A local Produce (not a link's), decided without waiting
    /// ([`decide::decide_local`]): refused partitions answered here, the
    /// rest forwarded as it came. `learnt`: the request's index once the
    /// topic ids it named were asked of the broker.
    pub(crate) fn local_now(
        &self,
        h: &RequestHeaderPeek,
        head: &Head,
        frame: Bytes,
        learnt: Option<Box<Index>>,
    ) -> Result<LocalStep, FilterError> {
        let ctx = self.ctx;
        if addresses::carries_addresses(ApiKey::Produce, head.version) {
            addresses::check_parseable(ApiKey::Produce, head.version)?;
        }
        let (plan, index) = match decide::decide_local(head, &frame, learnt, ctx)? {
            LocalDecision::Forward => {
                let frame = BytesMut::from(frame); // unique: no copy
                return Ok(LocalStep::Done(forward(
                    head,
                    frame,
                    Vec::new(),
                    Tracked::none(),
                    Vec::new(),
                    None,
                )));
            }
            LocalDecision::LearnIds(index) => return Ok(LocalStep::LearnIds(frame, index)),
            LocalDecision::Refuse(refused) => {
                let decide::Refused { plan, index } = *refused;
                (plan, index)
            }
        };
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
            tracing::warn!(client_id = ?h.client_id(&frame), topic = decide::Known::state_topic(ctx), "refused a client's Produce to the proxy's state topic");
        }
        if let Some(LocalPartition {
            outcome: LocalOutcome::Refused { message, .. },
            ..
        }) = plan.local.first()
        {
            tracing::debug!(partitions = plan.local.len(), message = ?message, "refused a local write");
        }
        if plan.forwarded_partitions == 0 {
            return head
                .answer(&plan.local)
                .map(|answer| LocalStep::Done(ProduceAction::Answered(answer)));
        }
        let reduced = produce::without_local_partitions(&frame, &index, &plan.local);
        Ok(LocalStep::Done(forward(
            head,
            reduced,
            plan.local,
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
    /// from the broker, then decide (the frame, untouched, and its index).
    LearnIds(Bytes, Box<Index>),
}

/// `frame` to the broker. With acks=0 nothing is recorded without an
/// answer: the tracked batches are failed. No client retries what it never
/// hears about, so there is no retry to deduplicate and the partition is
/// not re-read.
#[inline]
fn forward(
    head: &Head,
    frame: BytesMut,
    local: Vec<LocalPartition>,
    tracked: Tracked,
    mirrored: Vec<MirroredPartition>,
    link: Option<Arc<LinkMirror>>,
) -> ProduceAction {
    let state = match head.expects_response() {
        true => Some(ProduceState {
            version: head.version,
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
        let head = match Head::new(&request.header, &request.frame) {
            Ok(head) => head,
            Err(e) => return Step::Ready(Err(e)),
        };
        let Request {
            header,
            api,
            origin,
            frame,
        } = request;
        // A local Produce is decided without waiting. A link's (which may
        // wait on the state topic or a rebuild) and a local one naming
        // unknown topic ids are boxed.
        let (link, spoofed) = match origin {
            Origin::Local => {
                return match self.filter.local_now(&header, &head, frame.freeze(), None) {
                    Ok(LocalStep::Done(action)) => self.act(header, api, Origin::Local, action),
                    Ok(LocalStep::LearnIds(frame, index)) => {
                        Step::Wait(Box::pin(self.learn_ids(header, api, head, frame, index)))
                    }
                    Err(e) => Step::Ready(Err(e)),
                };
            }
            Origin::Link(link) => (link, false),
            Origin::Spoofed(link) => (link, true),
        };
        Step::Wait(Box::pin(self.link(header, api, link, spoofed, head, frame)))
    }

    fn flush(&mut self) -> impl Future<Output = Result<(), FilterError>> + Send + '_ {
        self.inner.flush()
    }
}

impl<'a, S: Service> Produce<'a, S> {
    /// A local Produce naming topic ids the proxy has not seen: the ids
    /// learnt from the broker, then the request decided (what stays
    /// unknown is refused).
    async fn learn_ids(
        &mut self,
        header: RequestHeaderPeek,
        api: Option<ApiKey>,
        head: Head,
        frame: Bytes,
        index: Box<Index>,
    ) -> Result<Outcome<Then<S::Pending, ProduceHalf<'a>>>, FilterError> {
        learn_topic_ids(self.filter.ctx).await;
        let action = match self.filter.local_now(&header, &head, frame, Some(index))? {
            LocalStep::Done(action) => action,
            // Not returned once the ids were asked for.
            LocalStep::LearnIds(..) => return Err(FilterError::MissingResponse),
        };
        self.act(header, api, Origin::Local, action).decided().await
    }

    /// A link's Produce (or a spoofed link's): the request half, which may
    /// wait, then what it decided.
    async fn link(
        &mut self,
        header: RequestHeaderPeek,
        api: Option<ApiKey>,
        link: Arc<Link>,
        spoofed: bool,
        head: Head,
        frame: BytesMut,
    ) -> Result<Outcome<Then<S::Pending, ProduceHalf<'a>>>, FilterError> {
        let action = self
            .filter
            .link_request(
                self.writer,
                &link,
                spoofed,
                self.subject,
                head,
                frame.freeze(),
            )
            .await?;
        let origin = match spoofed {
            true => Origin::Spoofed(link),
            false => Origin::Link(link),
        };
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
    let head = Head::new(h, &frame)?;
    let index = head.index(&frame)?;
    refuse_whole(ctx, link, &head, &frame, &index, refusal, message)
}

/// Every partition of `link`'s request answered here with `refusal`, and
/// counted: the response, unless `acks=0`.
fn refuse_whole(
    ctx: &Context,
    link: &str,
    head: &Head,
    frame: &Bytes,
    index: &Index,
    refusal: Refusal,
    message: &str,
) -> Result<Option<BytesMut>, FilterError> {
    let plan = produce::refuse_all(frame, index, refusal, message);
    count_local(ctx, link, &plan.local);
    head.answer(&plan.local)
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

/// How long a request naming an unknown topic id waits for the broker to
/// name every topic's id.
const TOPIC_IDS_TIMEOUT: Duration = Duration::from_secs(5);

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
                if let (Some(m), Some(topic)) = (
                    ctx.metrics.link_mirror(link),
                    decide::name_of(&ctx.topics, &l.topic),
                ) {
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
        let topic = decide::name_of(&ctx.topics, &m.topic);
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
