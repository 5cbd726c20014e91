//! A Produce request decided from what it says and what the proxy knows,
//! with no I/O and no waiting: the request's [`Head`] (version, body
//! offset, acks), worked out once; the refusals of a local write (the state
//! topic, read-only mirrored topics, topic ids not seen); the gates of a
//! link write (a spoofed link, the state not loaded, a fence or a lapsed
//! lease once it has waited); and the one lookup of a topic's name. What
//! the proxy knows comes in through [`Known`], so the decisions are tested
//! here with exact bytes; the filter (`mod.rs`) waits, counts and logs
//! around them.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::ApiKey;
use uuid::Uuid;

use crate::filter::FilterError;
use crate::mirror::link::Link;
use crate::mirror::produce::{
    self, Index, LocalPartition, OriginLookup, ProducePlan, Refusal, TopicKey, TopicRef,
};
use crate::wire::header::{produce_acks, produce_timeout_ms, RequestHeaderPeek};

/// What a Produce request says of itself that every step needs, read from
/// its frame once per request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Head {
    pub(crate) version: i16,
    pub(crate) correlation_id: i32,
    /// Where the request body begins in the frame.
    pub(crate) body_offset: usize,
    /// `acks`: 0 asks for no response at all.
    pub(crate) acks: i16,
}

impl Head {
    /// The head of the Produce request `frame`, whose header is `h`.
    pub(crate) fn new(h: &RequestHeaderPeek, frame: &[u8]) -> Result<Head, FilterError> {
        let version = h.api_version;
        let body_offset = h.body_offset(frame, ApiKey::Produce.request_header_version(version))?;
        let acks = produce_acks(frame, body_offset, version)?;
        Ok(Head {
            version,
            correlation_id: h.correlation_id,
            body_offset,
            acks,
        })
    }

    /// Whether the client expects a response (`acks != 0`).
    pub(crate) fn expects_response(&self) -> bool {
        self.acks != 0
    }

    /// The request's topic and partition entries, found by one walk.
    pub(crate) fn index(&self, frame: &[u8]) -> Result<Index, FilterError> {
        Ok(produce::index(frame, self.body_offset, self.version)?)
    }

    /// The request's `timeout_ms`.
    pub(crate) fn timeout_ms(&self, frame: &[u8]) -> Result<i32, FilterError> {
        Ok(produce_timeout_ms(frame, self.body_offset, self.version)?)
    }

    /// The response when the proxy answers every partition itself (`None`
    /// with `acks=0`).
    pub(crate) fn answer(&self, local: &[LocalPartition]) -> Result<Option<BytesMut>, FilterError> {
        Ok(match self.expects_response() {
            true => Some(produce::local_response(
                self.correlation_id,
                self.version,
                local,
            )?),
            false => None,
        })
    }
}

/// The names of the topic ids the proxy has seen in responses.
pub(crate) trait TopicNames {
    /// The name of topic id `id`, if seen.
    fn topic_name(&self, id: Uuid) -> Option<Arc<str>>;
}

impl TopicNames for crate::filter::TopicTable {
    fn topic_name(&self, id: Uuid) -> Option<Arc<str>> {
        self.name(id)
    }
}

/// What the local decision needs to know of the proxy.
pub(crate) trait Known: TopicNames {
    /// The proxy's state topic; `None` without mirror links (then nothing
    /// is read-only and a local write is not even walked).
    fn state_topic(&self) -> Option<&str>;

    /// Why a local write to `topic` at `version` is refused (a mirrored
    /// topic whose link is not `STOPPED`), if it is.
    fn read_only(&self, topic: &str, version: i16) -> Option<(Refusal, String)>;

    /// Count `partitions` local writes to `topic` refused as read-only.
    fn count_refused(&self, topic: &str, partitions: usize);
}

/// A topic name borrowed from the request or shared with the proxy's
/// table of topic ids: never copied per request.
pub(crate) enum TopicName<'t> {
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

/// A topic's name: the request's own before v13, else looked up by its id
/// (`None` while the proxy has not seen the id). The one lookup of a
/// Produce topic's name.
pub(crate) fn topic_name<'t>(
    names: &impl TopicNames,
    topic: TopicKey<'t>,
) -> Option<TopicName<'t>> {
    match topic {
        TopicKey::Name(name) => Some(TopicName::Request(name)),
        TopicKey::Id(id) => names.topic_name(id).map(TopicName::Known),
    }
}

/// The name of a planned topic: by its id where it has one, else the
/// request's name.
pub(crate) fn name_of<'t>(names: &impl TopicNames, topic: &'t TopicRef) -> Option<TopicName<'t>> {
    let key = match topic.topic_id.is_nil() {
        true => TopicKey::Name(topic.name.0.as_str()),
        false => TopicKey::Id(topic.topic_id),
    };
    topic_name(names, key)
}

/// The name of a topic for a message or a read of its log: looked up by
/// `id` (the partition's), else the name `topic` came with.
pub(crate) fn log_name(names: &impl TopicNames, id: Uuid, topic: &TopicRef) -> String {
    topic_name(names, TopicKey::Id(id)).map_or_else(|| topic.name.0.to_string(), |n| n.to_string())
}

/// Whether the request names a topic id the proxy has not seen.
pub(crate) fn names_unknown_id(frame: &[u8], index: &Index, names: &impl TopicNames) -> bool {
    produce::any_topic(frame, index, |t| topic_name(names, t).is_none())
}

/// What becomes of a local (not a link's) Produce. The rare outcomes are
/// boxed: every local write with links configured returns one of these,
/// and moves it, and almost all of them are forwarded.
pub(crate) enum LocalDecision {
    /// Forwarded as it came.
    Forward,
    /// It names topic ids the proxy has not seen, which may be read-only
    /// topics: learn every id from the broker, then decide again with the
    /// request's index.
    LearnIds(Box<Index>),
    /// Some partitions answered here (all of them when the plan forwards
    /// none), the rest forwarded.
    Refuse(Box<Refused>),
}

/// A local Produce some of whose partitions are answered here.
pub(crate) struct Refused {
    pub(crate) plan: ProducePlan,
    /// The request's index, for what is left to forward.
    pub(crate) index: Index,
}

/// A local Produce: the state topic and read-only mirrored topics refused
/// per partition, decided once per topic entry; everything else forwarded
/// as it came; without links (no state topic, nothing read-only) the
/// request is not even walked. A topic id the proxy has not seen may name
/// a read-only topic: the ids are learnt first; once `learnt` (the broker
/// was asked; the request's index from the first look), what stays
/// unknown is refused (retriable).
pub(crate) fn decide_local(
    head: &Head,
    frame: &Bytes,
    learnt: Option<Box<Index>>,
    known: &impl Known,
) -> Result<LocalDecision, FilterError> {
    let Some(state_topic) = known.state_topic() else {
        return Ok(LocalDecision::Forward);
    };
    let index = match learnt {
        Some(index) => *index,
        None => {
            let index = head.index(frame)?;
            if names_unknown_id(frame, &index, known) {
                return Ok(LocalDecision::LearnIds(Box::new(index)));
            }
            index
        }
    };
    // The last topic's refusal, reused while entries repeat it: a request
    // of many entries to one topic builds one message.
    let mut last: Option<(String, Refusal, Arc<str>)> = None;
    let plan = produce::refuse_where(frame, &index, |t, partitions| {
        let Some(name) = topic_name(known, t) else {
            return Some((
                Refusal::UnknownTopicId,
                "the topic id is not known to the proxy yet; refresh metadata and retry".into(),
            ));
        };
        let refusal = match &last {
            Some((n, refusal, message)) if **n == *name => (*refusal, message.clone()),
            _ if *name == *state_topic => (Refusal::StateTopic, state_topic_message(&name).into()),
            _ => {
                let (refusal, message) = known.read_only(&name, head.version)?;
                (refusal, message.into())
            }
        };
        last = Some((name.to_string(), refusal.0, refusal.1.clone()));
        if refusal.0 != Refusal::StateTopic {
            known.count_refused(&name, partitions);
        }
        Some(refusal)
    });
    Ok(match plan.local.is_empty() {
        true => LocalDecision::Forward,
        false => LocalDecision::Refuse(Box::new(Refused { plan, index })),
    })
}

/// Why a client may not write the state topic.
fn state_topic_message(topic: &str) -> String {
    format!("'{topic}' is the kafka-mirror-proxy state topic, which only the proxy writes")
}

/// Whether a link's Produce may be planned: refused whole when a client
/// claims `link`'s client id without its certificate (`spoofed`), or
/// while the state topic is not loaded (`state`: why not); else the
/// loaded state.
pub(crate) fn admit<S>(
    link: &Link,
    spoofed: bool,
    state: Result<S, String>,
) -> Result<S, (Refusal, String)> {
    if spoofed {
        return Err((
            Refusal::NotAuthorized,
            format!(
                "client id '{}' is reserved for mirror link '{}', which requires a TLS client certificate matching '{}'",
                link.client_id(),
                link.name(),
                link.tls_subject().unwrap_or_default()
            ),
        ));
    }
    state.map_err(|why| {
        (
            Refusal::StateNotLoaded,
            format!(
                "mirror link '{}': the proxy's producer id mapping state is not loaded yet ({why}); retry",
                link.name()
            ),
        )
    })
}

/// A link's Produce planned (`mirror::produce::plan_with`): its topics
/// named by `names` (ids) and `ids` (names), its producers' origins by
/// `origins`.
pub(crate) fn plan_link(
    frame: &Bytes,
    index: &Index,
    link: &Link,
    names: &impl TopicNames,
    ids: &dyn Fn(&str) -> Option<Uuid>,
    origins: &dyn OriginLookup,
) -> ProducePlan {
    produce::plan_with(frame, index, link, &|id| names.topic_name(id), ids, origins)
}

/// Whether a link's Produce that has waited may go on: `fenced` (the
/// link's fence message, if it was fenced meanwhile) and `lease` (the state
/// topic lease, if this instance has lost it) looked at after the last
/// wait.
pub(crate) enum Release {
    Go,
    /// Every partition refused with [`Refusal::LinkFenced`] and the
    /// connection closed.
    Fenced(String),
    /// Every partition refused, retriable: this instance may have missed a
    /// failover.
    LeaseLapsed(String),
}

/// See [`Release`].
pub(crate) fn release(
    link: &Link,
    fenced: Option<String>,
    lapsed_lease: Option<std::time::Duration>,
) -> Release {
    if let Some(message) = fenced {
        return Release::Fenced(message);
    }
    match lapsed_lease {
        None => Release::Go,
        Some(lease) => Release::LeaseLapsed(format!(
            "mirror link '{}': this proxy instance has not read the state topic within its lease ({} ms, half MIRROR_PROXY_INSTANCE_SESSION_TIMEOUT_MS), so it cannot know the link's state; retry",
            link.name(),
            lease.as_millis()
        )),
    }
}

#[cfg(test)]
pub(super) mod tests;
