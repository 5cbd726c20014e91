//! The Produce request's walk, written out by hand for the one message every
//! produced byte passes through.
//!
//! `wire::walk` walks any message from its schema: on every value it looks
//! the field up in the schema tree and hands the visitor the field, whose
//! path (a heap string) the visitor compares to know what it got. For the
//! Produce request, on every request, those lookups and compares touch more
//! memory than the request itself between two requests whose caches the
//! broker has had. This walk makes the same checks in the same order with
//! the Produce request's layout (v3 to v13) spelled out, and reports only
//! what the proxy reads: each topic, and each partition's index and records.
//!
//! It is held to the schema walk, not trusted beside it: a property test
//! and the `produce_plan` fuzz target check that both report the same
//! topics, partitions and errors, byte for byte, on every version the
//! compiled-in schema knows; a test fails if that range changes.
//!
//! Like `wire::walk` it reserves nothing from the wire: every count and
//! length is checked against the bytes that remain before it is used.
//!
//! Pure: bytes in, events out.

use std::ops::Range;

use smallvec::SmallVec;

use super::cursor::Cursor;
use super::walk::{read_error, WalkError};
use super::write::put_count;

/// The Produce versions this walk knows: those of the compiled-in schema.
pub(crate) const VERSIONS: (i16, i16) = (3, 13);
/// Compact strings, arrays and tagged fields from here on.
const FIRST_FLEXIBLE: i16 = 9;
/// Topics named by id instead of by name from here on.
const FIRST_BY_ID: i16 = 13;

// The schema's field paths, which the errors name as `wire::walk` does.
const TRANSACTIONAL_ID: &str = "TransactionalId";
const ACKS: &str = "Acks";
const TIMEOUT_MS: &str = "TimeoutMs";
const TOPIC_DATA: &str = "TopicData";
const NAME: &str = "TopicData.Name";
const TOPIC_ID: &str = "TopicData.TopicId";
const PARTITION_DATA: &str = "TopicData.PartitionData";
const INDEX: &str = "TopicData.PartitionData.Index";
const RECORDS: &str = "TopicData.PartitionData.Records";
pub(super) const TAGGED: &str = "(tagged fields)";

/// A topic as the request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Topic<'a> {
    /// Before v13: the name's bytes (UTF-8 is the visitor's to check).
    Name(&'a [u8]),
    /// From v13.
    Id([u8; 16]),
}

/// Receives what the walk reads, in request order, with where it lies in
/// the input (for a visitor that re-emits the request in part).
pub(crate) trait Visitor<'a> {
    /// The topic array's count is `count`; the topics follow.
    fn topics(&mut self, _count: Range<usize>) {}
    /// A topic entry starts; `key` is where its name (with its length) or
    /// id is. Its partitions follow.
    fn topic(&mut self, topic: Topic<'a>, key: Range<usize>);
    /// A partition entry of the last topic, once all of it (`entry`) has
    /// been read. `records` is where its records are (`None`: null).
    fn partition(&mut self, index: i32, records: Option<Range<usize>>, entry: Range<usize>);
    /// The last topic's entry ends with its tagged fields, `tagged`.
    fn topic_end(&mut self, _tagged: Range<usize>) {}
}

/// Walk `input[start..]`, which must be exactly one Produce request body at
/// `version`. Spans are offsets into `input`. Fails as `wire::walk::walk`
/// fails on the same bytes, with the same error.
pub(crate) fn walk<'a, V: Visitor<'a>>(
    version: i16,
    input: &'a [u8],
    start: usize,
    visitor: &mut V,
) -> Result<(), WalkError> {
    check_version("ProduceRequest", version, VERSIONS)?;
    let mut r = Reader::new(input, start, version >= FIRST_FLEXIBLE);
    r.string(TRANSACTIONAL_ID, true)?;
    r.fixed::<2>(ACKS)?;
    r.fixed::<4>(TIMEOUT_MS)?;
    let at = r.pos();
    let topics = r.count(TOPIC_DATA)?;
    visitor.topics(at..r.pos());
    for _ in 0..topics {
        let at = r.pos();
        let topic = if version >= FIRST_BY_ID {
            Topic::Id(r.fixed(TOPIC_ID)?)
        } else {
            Topic::Name(r.string(NAME, false)?.unwrap_or_default())
        };
        visitor.topic(topic, at..r.pos());
        for _ in 0..r.count(PARTITION_DATA)? {
            let at = r.pos();
            let index = i32::from_be_bytes(r.fixed(INDEX)?);
            let records = r.records(RECORDS)?;
            r.tagged()?;
            visitor.partition(index, records, at..r.pos());
        }
        let at = r.pos();
        r.tagged()?;
        visitor.topic_end(at..r.pos());
    }
    r.tagged()?;
    r.finish("ProduceRequest")
}

/// A Produce request indexed by one walk: its topic entries and partition
/// entries, in request order, and where each lies in the frame. Every
/// decision the proxy makes about a Produce request reads this, and a
/// request re-emitted without some partitions is copied from its spans, so
/// a request is walked once however many decisions it meets.
///
/// Its size follows the entries the walk found, each of which took bytes
/// of the frame (a partition entry at least six): nothing is reserved from
/// a count on the wire. Spans are `u32`: a frame's size is an `i32`.
#[derive(Debug, Clone, Default)]
pub struct Index {
    version: i16,
    /// Where the topic array's count is.
    topics_at: u32,
    /// Where what follows the topic array (the body's tagged fields) starts.
    tail_at: u32,
    topics: SmallVec<[IndexedTopic; 2]>,
    partitions: SmallVec<[IndexedPartition; 4]>,
}

/// A span of the frame.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    fn new(r: Range<usize>) -> Span {
        // Spans are taken only from a frame checked to fit in u32.
        Span {
            start: r.start as u32,
            end: r.end as u32,
        }
    }

    fn range(self) -> Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// A topic entry of an indexed request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IndexedTopic {
    /// The name with its length before v13, the id from v13.
    key: Span,
    /// Its tagged fields (empty before v9).
    tagged: Span,
    /// Its partition entries' places in [`Index::partitions`].
    first: u32,
    count: u32,
}

impl IndexedTopic {
    /// Its partition entries' places in [`Index::partitions`].
    pub(crate) fn partitions(&self) -> Range<usize> {
        self.first as usize..(self.first + self.count) as usize
    }
}

/// A partition entry of an indexed request.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IndexedPartition {
    /// Its topic entry's place in `Index::topics`.
    pub topic: u32,
    pub index: i32,
    records: Span,
    null: bool,
    /// The whole entry.
    entry: Span,
}

impl IndexedPartition {
    /// Where its records are in the frame (`None`: null).
    pub(crate) fn records(&self) -> Option<Range<usize>> {
        (!self.null).then(|| self.records.range())
    }
}

impl Index {
    /// Index `input[start..]`, which must be exactly one Produce request
    /// body at `version`; fails as [`walk`] fails.
    pub(crate) fn new(version: i16, input: &[u8], start: usize) -> Result<Index, WalkError> {
        if u32::try_from(input.len()).is_err() {
            return Err(WalkError::Length {
                path: "ProduceRequest".into(),
                at: 0,
                len: input.len() as i64,
            });
        }
        let mut index = Index {
            version,
            ..Index::default()
        };
        walk(version, input, start, &mut index)?;
        Ok(index)
    }

    pub(crate) fn version(&self) -> i16 {
        self.version
    }

    pub(crate) fn topics(&self) -> &[IndexedTopic] {
        &self.topics
    }

    pub(crate) fn partitions(&self) -> &[IndexedPartition] {
        &self.partitions
    }

    /// The topic entry `topic` as the request names it.
    pub(crate) fn topic<'a>(&self, input: &'a [u8], topic: &IndexedTopic) -> Topic<'a> {
        let key = input.get(topic.key.range()).unwrap_or_default();
        match <[u8; 16]>::try_from(key) {
            Ok(id) if self.version >= FIRST_BY_ID => Topic::Id(id),
            // A name's span starts with its length: 2 bytes, or a varint.
            _ => Topic::Name(name_bytes(key, self.version >= FIRST_FLEXIBLE)),
        }
    }

    /// The key bytes of `topic` (the name, or the id), for comparing topic
    /// entries: two entries name the same topic when these are equal.
    pub(crate) fn key<'a>(&self, input: &'a [u8], topic: &IndexedTopic) -> &'a [u8] {
        match self.topic(input, topic) {
            Topic::Name(name) => name,
            Topic::Id(_) => input.get(topic.key.range()).unwrap_or_default(),
        }
    }

    /// `input` (the frame this index was made from, perhaps patched in
    /// place since) re-emitted with only the partition entries `keep`
    /// holds for, and without the topics left empty: the header, the kept
    /// entries and every tagged field are copied as they are; only the
    /// array counts are written anew. `keep` is asked once per entry, in
    /// order.
    pub(crate) fn without(&self, input: &[u8], mut keep: impl FnMut(usize) -> bool) -> Vec<u8> {
        let flexible = self.version >= FIRST_FLEXIBLE;
        let part = |span: Span| input.get(span.range()).unwrap_or_default();
        let kept: Vec<bool> = (0..self.partitions.len()).map(&mut keep).collect();
        let kept_in = |t: &IndexedTopic| kept[t.partitions()].iter().filter(|k| **k).count();
        let mut out = Vec::with_capacity(input.len());
        out.extend_from_slice(input.get(..self.topics_at as usize).unwrap_or_default());
        let topics = self.topics.iter().filter(|t| kept_in(t) > 0).count();
        put_count(&mut out, topics, flexible);
        for topic in self.topics.iter() {
            let n = kept_in(topic);
            if n == 0 {
                continue;
            }
            out.extend_from_slice(part(topic.key));
            put_count(&mut out, n, flexible);
            for i in topic.partitions().filter(|i| kept[*i]) {
                out.extend_from_slice(part(self.partitions[i].entry));
            }
            out.extend_from_slice(part(topic.tagged));
        }
        out.extend_from_slice(input.get(self.tail_at as usize..).unwrap_or_default());
        out
    }
}

impl<'a> Visitor<'a> for Index {
    fn topics(&mut self, count: Range<usize>) {
        let count = Span::new(count);
        self.topics_at = count.start;
        // Until a topic ends: the body's tagged fields follow the count.
        self.tail_at = count.end;
    }

    fn topic(&mut self, _: Topic<'a>, key: Range<usize>) {
        self.topics.push(IndexedTopic {
            key: Span::new(key),
            first: self.partitions.len() as u32,
            ..IndexedTopic::default()
        });
    }

    fn partition(&mut self, index: i32, records: Option<Range<usize>>, entry: Range<usize>) {
        let topic = self.topics.len().saturating_sub(1);
        if let Some(t) = self.topics.last_mut() {
            t.count += 1;
        }
        self.partitions.push(IndexedPartition {
            topic: topic as u32,
            index,
            null: records.is_none(),
            records: records.map(Span::new).unwrap_or_default(),
            entry: Span::new(entry),
        });
    }

    fn topic_end(&mut self, tagged: Range<usize>) {
        let tagged = Span::new(tagged);
        if let Some(t) = self.topics.last_mut() {
            t.tagged = tagged;
        }
        self.tail_at = tagged.end;
    }
}

/// A name's bytes, from its span with its length in front (a varint when
/// flexible, two bytes before).
fn name_bytes(key: &[u8], flexible: bool) -> &[u8] {
    let skip = match flexible {
        true => {
            let mut c = Cursor::at(key, 0);
            c.uvarint().map_or(key.len(), |_| c.position())
        }
        false => 2,
    };
    key.get(skip..).unwrap_or_default()
}

/// The walk's reads, each naming its field in the error; the reading
/// itself is `wire::cursor`'s. Shared with the Produce response's walk
/// (`wire::produce_response_walk`).
pub(super) struct Reader<'a> {
    input: &'a [u8],
    /// Over `input`, or over the prefix of it that ends with the tagged
    /// field being read; positions are offsets into `input` either way.
    cur: Cursor<'a>,
    flexible: bool,
}

impl<'a> Reader<'a> {
    pub(super) fn new(input: &'a [u8], start: usize, flexible: bool) -> Reader<'a> {
        Reader {
            input,
            cur: Cursor::at(input, start),
            flexible,
        }
    }

    #[inline]
    fn pos(&self) -> usize {
        self.cur.position()
    }

    /// The next `n` bytes.
    #[inline]
    fn slice(&mut self, path: &str, n: u64) -> Result<&'a [u8], WalkError> {
        let at = self.pos();
        match usize::try_from(n).map(|len| self.cur.bytes(len)) {
            Ok(Ok(bytes)) => Ok(bytes),
            _ => Err(short(path, at, n, self.cur.remaining())),
        }
    }

    /// The next `n` bytes, as where they are in the input.
    #[inline]
    pub(super) fn take(&mut self, path: &str, n: u64) -> Result<Range<usize>, WalkError> {
        let at = self.pos();
        self.slice(path, n).map(|s| at..at + s.len())
    }

    #[inline]
    pub(super) fn fixed<const N: usize>(&mut self, path: &str) -> Result<[u8; N], WalkError> {
        let at = self.pos();
        self.cur.array().map_err(|e| read_error(path, at, e))
    }

    #[inline]
    pub(super) fn uvarint(&mut self, path: &str) -> Result<u32, WalkError> {
        let at = self.pos();
        self.cur.uvarint().map_err(|e| read_error(path, at, e))
    }

    /// Runs `read` over `span` of the input alone (a tagged field's value,
    /// which must not read past its declared size), then goes on where it
    /// was. Returns what `read` returned and how many bytes it read.
    pub(super) fn inside<T>(
        &mut self,
        span: Range<usize>,
        read: impl FnOnce(&mut Self) -> T,
    ) -> (T, usize) {
        let saved = self.cur;
        let field = self.input.get(..span.end).unwrap_or_default();
        self.cur = Cursor::at(field, span.start);
        let out = read(self);
        let used = self.pos() - span.start;
        self.cur = saved;
        (out, used)
    }

    /// A length or count: `None` for null (-1).
    fn length(&mut self, path: &str, wide: bool) -> Result<Option<u64>, WalkError> {
        let at = self.pos();
        let len = if self.flexible {
            i64::from(self.uvarint(path)?) - 1
        } else if wide {
            i64::from(i32::from_be_bytes(self.fixed(path)?))
        } else {
            i64::from(i16::from_be_bytes(self.fixed(path)?))
        };
        match len {
            -1 => Ok(None),
            n if n >= 0 => Ok(Some(n as u64)),
            n => Err(WalkError::Length {
                path: path.into(),
                at,
                len: n,
            }),
        }
    }

    pub(super) fn string(
        &mut self,
        path: &str,
        nullable: bool,
    ) -> Result<Option<&'a [u8]>, WalkError> {
        let start = self.pos();
        match self.length(path, false)? {
            None if nullable => Ok(None),
            None => Err(WalkError::Null {
                path: path.into(),
                at: self.pos(),
            }),
            Some(n) if n > i16::MAX as u64 => Err(WalkError::Length {
                path: path.into(),
                at: start,
                len: n as i64,
            }),
            Some(n) => self.slice(path, n).map(Some),
        }
    }

    /// Nullable records: a span of the input.
    fn records(&mut self, path: &str) -> Result<Option<Range<usize>>, WalkError> {
        match self.length(path, true)? {
            None => Ok(None),
            Some(n) => self.take(path, n).map(Some),
        }
    }

    /// The element count of a non-nullable array, checked against the
    /// bytes left (every element takes at least one).
    pub(super) fn count(&mut self, path: &str) -> Result<u64, WalkError> {
        let start = self.pos();
        match self.length(path, true)? {
            None => Err(WalkError::Null {
                path: path.into(),
                at: start,
            }),
            Some(n) => self.check_count(path, start, n).map(|()| n),
        }
    }

    fn check_count(&self, path: &str, at: usize, count: u64) -> Result<(), WalkError> {
        let left = self.cur.remaining();
        if count > left as u64 {
            return Err(WalkError::Count {
                path: path.into(),
                at,
                count,
                left,
            });
        }
        Ok(())
    }

    /// The head of a tagged-field section: how many fields follow
    /// (flexible versions only; 0 otherwise).
    pub(super) fn tagged_count(&mut self) -> Result<u64, WalkError> {
        if !self.flexible {
            return Ok(0);
        }
        let start = self.pos();
        let count = u64::from(self.uvarint(TAGGED)?);
        self.check_count(TAGGED, start, count)?;
        Ok(count)
    }

    /// A tagged field's head: its tag and size.
    pub(super) fn tag(&mut self) -> Result<(u32, u32), WalkError> {
        Ok((self.uvarint(TAGGED)?, self.uvarint(TAGGED)?))
    }

    /// A tagged-field section none of whose fields this walk reads: each
    /// is skipped by its size.
    pub(super) fn tagged(&mut self) -> Result<(), WalkError> {
        for _ in 0..self.tagged_count()? {
            let (_, size) = self.tag()?;
            self.take(TAGGED, u64::from(size))?;
        }
        Ok(())
    }

    /// Fail unless the whole input was read.
    pub(super) fn finish(&self, message: &str) -> Result<(), WalkError> {
        match self.pos() == self.input.len() {
            true => Ok(()),
            false => Err(WalkError::Trailing {
                message: message.into(),
                count: self.input.len() - self.pos(),
            }),
        }
    }
}

/// The error for a version outside `(min, max)`, if `version` is.
pub(super) fn check_version(
    message: &str,
    version: i16,
    (min, max): (i16, i16),
) -> Result<(), WalkError> {
    match (min..=max).contains(&version) {
        true => Ok(()),
        false => Err(version_error(message, version, (min, max))),
    }
}

/// What a walk reported, recorded: to hold a hand walk to the schema walk
/// in tests and in the `produce_plan` and `responses` fuzz targets. `P` is
/// what a partition carries: its index and records in a request
/// (`RequestPartition`), its answer in a response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event<P> {
    Name(Vec<u8>),
    Id([u8; 16]),
    Partition(P),
}

impl<P> From<Topic<'_>> for Event<P> {
    fn from(topic: Topic<'_>) -> Event<P> {
        match topic {
            Topic::Name(n) => Event::Name(n.to_vec()),
            Topic::Id(id) => Event::Id(id),
        }
    }
}

/// A request's partition entry as recorded: its index, and where its
/// records are (`None`: null).
pub(crate) type RequestPartition = (i32, Option<Range<usize>>);

/// `version` of `message` cannot be walked; `versions` can. Also what a
/// recorder reports when the compiled-in schema cannot be had, naming the
/// versions the hand walk covers.
pub(super) fn version_error(message: &str, version: i16, versions: (i16, i16)) -> WalkError {
    let (min, max) = versions;
    WalkError::Version {
        message: message.into(),
        version,
        min,
        max,
    }
}

/// This walk's events and result.
pub(crate) fn events(
    version: i16,
    input: &[u8],
    start: usize,
) -> (Vec<Event<RequestPartition>>, Result<(), WalkError>) {
    struct Record(Vec<Event<RequestPartition>>);
    impl Visitor<'_> for Record {
        fn topic(&mut self, topic: Topic<'_>, _: Range<usize>) {
            self.0.push(topic.into());
        }
        fn partition(&mut self, index: i32, records: Option<Range<usize>>, _: Range<usize>) {
            self.0.push(Event::Partition((index, records)));
        }
    }
    let mut r = Record(Vec::new());
    let result = walk(version, input, start, &mut r);
    (r.0, result)
}

/// The schema walk's events and result on the same input.
pub(crate) fn schema_events(
    version: i16,
    input: &[u8],
    start: usize,
) -> (Vec<Event<RequestPartition>>, Result<(), WalkError>) {
    use super::schema::{self, Field};
    use super::walk::{self, Edit, Value};
    #[derive(Default)]
    struct Record {
        events: Vec<Event<RequestPartition>>,
        index: i32,
        records: Option<Range<usize>>,
    }
    impl walk::Visitor for Record {
        fn value(&mut self, field: &Field, value: Value<'_>) -> Edit {
            match (field.path.as_str(), value) {
                (NAME, Value::Str(Some(n))) => self.events.push(Event::Name(n.to_vec())),
                (TOPIC_ID, Value::Uuid(id)) => self.events.push(Event::Id(id)),
                (INDEX, Value::Int(i)) => self.index = i as i32,
                (RECORDS, Value::Bytes(span)) => self.records = span,
                _ => {}
            }
            Edit::Keep
        }
        fn leave(&mut self, field: &Field) -> bool {
            if field.path == PARTITION_DATA {
                let records = self.records.take();
                self.events.push(Event::Partition((self.index, records)));
            }
            true
        }
    }
    let Ok(msg) = schema::message("ProduceRequest") else {
        let e = version_error("ProduceRequest", version, VERSIONS);
        return (Vec::new(), Err(e));
    };
    let mut r = Record::default();
    let result = walk::walk(msg, version, input, start, &mut r);
    (r.events, result)
}

#[cold]
pub(super) fn short(path: &str, at: usize, need: u64, left: usize) -> WalkError {
    WalkError::Short {
        path: path.into(),
        at,
        need,
        left,
    }
}

#[cfg(test)]
mod tests;
