//! Codecs of the `__mirror_state` records (`docs/state-topic.md` has the
//! bytes of each). Pure: bytes in, typed records out, and back.
//!
//! Framing follows Kafka's coordinator records (SPEC §5): the key is an
//! int16 record type followed by the key struct at version 0; the value is
//! an int16 version (0) followed by the value struct; a null value is a
//! tombstone.
//!
//! | type | key | value |
//! |---|---|---|
//! | 3 | `MirrorPidCollisionKey` | `MirrorPidCollisionValue` (flexible) |
//! | 4 | `MirrorPidOriginKey` | `MirrorPidOriginValue` (flexible) |
//! | 5 | `MirrorLinkStateKey` | `MirrorLinkStateValue` (flexible) |
//! | 6 | `MirrorBarrierKey` | `MirrorBarrierValue` (flexible) |
//! | 7 | `MirrorLinkDrainedKey` | `MirrorLinkDrainedValue` (flexible) |
//!
//! The keys of types 3 and 4 have the same layout (not flexible): TopicId
//! uuid, Partition int32, SourceClusterId string (int16 length),
//! OriginalPid int64. Type 6: LinkName string (int16 length), TopicId uuid,
//! Partition int32.
//! Decoding never panics and never sizes an allocation from the input: a
//! string is at most the 22 characters of a cluster id.

use thiserror::Error;
use uuid::Uuid;

use crate::mirror::link_state::{LinkState, LinkStatus};
use crate::mirror::pid::ClusterId;
use crate::wire::cursor::Cursor;
use crate::wire::write;

/// Record type of `MirrorPidCollisionKey`.
pub(crate) const COLLISION_TYPE: i16 = 3;
/// Record type of `MirrorPidOriginKey`.
pub(crate) const ORIGIN_TYPE: i16 = 4;
/// Record type of `MirrorLinkStateKey`: a link's state.
pub(crate) const LINK_STATE_TYPE: i16 = 5;
/// Record type of `MirrorBarrierKey`: a failover's barrier in one partition.
pub(crate) const BARRIER_TYPE: i16 = 6;
/// Record type of `MirrorLinkDrainedKey`: an instance drained a link's
/// connections for a failover.
pub(crate) const DRAINED_TYPE: i16 = 7;
/// Longest instance id a drained key may carry.
pub(crate) const MAX_INSTANCE_ID: usize = 249;
/// Longest link name a barrier key may carry (names come from the
/// configuration, which allows far less).
pub(crate) const MAX_LINK_NAME: usize = 249;

/// The key of both record types: one origin in one destination partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OriginKey {
    pub topic_id: Uuid,
    pub partition: i32,
    /// The source cluster (for a chain: the link's source cluster).
    pub source: ClusterId,
    /// The PID as the source wrote it (negative for a chain).
    pub original_pid: i64,
}

/// `MirrorPidCollisionValue` v0: a salt chosen to resolve a collision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollisionValue {
    pub salt: i64,
    /// The cluster that already held the slot (the source itself for an
    /// oversized PID or a mapping to -1).
    pub colliding: ClusterId,
    pub timestamp_ms: i64,
}

/// `MirrorPidOriginValue` v0: an origin's claim on a mapped PID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OriginValue {
    pub mapped_pid: i64,
    /// 0: the natural region (no salt).
    pub salt: i64,
    /// -1: the offset of this record itself (a new claim); otherwise the
    /// offset of the original claim (a refresh).
    pub claim_offset: i64,
    pub last_seen_ms: i64,
}

/// `MirrorBarrierKey` v0: one link's barrier in one destination partition.
/// Compaction keeps the latest failover's barrier per partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BarrierKey {
    pub link: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

/// `MirrorBarrierValue` v0: what a failover's barrier did in its partition
/// (SPEC §7: partition, destination log end offset, source cluster, time,
/// whether the log accepted it, and the batch as sent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BarrierValue {
    /// Which failover of the link this barrier belongs to.
    pub failover_id: i64,
    pub source: ClusterId,
    /// The partition's log end offset after the barrier was answered: no
    /// mirrored batch of this failover's link lies at or past it.
    pub log_end_offset: i64,
    pub timestamp_ms: i64,
    /// Whether the log appended the barrier (a stock broker refuses it).
    pub accepted: bool,
    /// The broker's answer (0 when appended).
    pub error_code: i16,
    /// The barrier batch byte for byte as sent.
    pub batch: Vec<u8>,
}

/// One record of the state topic; `None` values are tombstones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateRecord {
    Collision(OriginKey, Option<CollisionValue>),
    Origin(OriginKey, Option<OriginValue>),
    Barrier(BarrierKey, Option<BarrierValue>),
    /// Key: the link name.
    LinkState(String, Option<LinkStatus>),
    Drained(DrainedKey, Option<DrainedValue>),
}

/// `MirrorLinkDrainedKey` v0: one instance's drain of one link.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DrainedKey {
    pub link: String,
    pub instance: String,
}

/// `MirrorLinkDrainedValue` v0: the instance closed every connection of the
/// link (their requests answered) for failover `failover_id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DrainedValue {
    pub failover_id: i64,
    pub timestamp_ms: i64,
}

/// Why a record could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RecordError {
    #[error("record has no key")]
    NoKey,
    #[error("unknown record type {0}")]
    UnknownType(i16),
    #[error("unknown value version {version} for record type {record_type}")]
    UnknownVersion { record_type: i16, version: i16 },
    #[error("{what} is truncated")]
    Truncated { what: &'static str },
    #[error("{what} has {extra} trailing byte(s)")]
    Trailing { what: &'static str, extra: usize },
    #[error("{what}: invalid cluster id")]
    ClusterId { what: &'static str },
    #[error("{what}: invalid string")]
    String { what: &'static str },
    #[error("link state record: unknown state code")]
    LinkState,
}

impl StateRecord {
    /// Key bytes.
    pub fn encode_key(&self) -> Vec<u8> {
        match self {
            StateRecord::Collision(k, _) => encode_key(COLLISION_TYPE, k),
            StateRecord::Origin(k, _) => encode_key(ORIGIN_TYPE, k),
            StateRecord::Barrier(k, _) => encode_barrier_key(k),
            StateRecord::LinkState(link, _) => {
                let mut out = Vec::with_capacity(2 + 2 + link.len());
                out.extend_from_slice(&LINK_STATE_TYPE.to_be_bytes());
                write::put_string(&mut out, Some(link), false);
                out
            }
            StateRecord::Drained(k, _) => {
                let mut out = Vec::with_capacity(2 + 2 + k.link.len() + 2 + k.instance.len());
                out.extend_from_slice(&DRAINED_TYPE.to_be_bytes());
                write::put_string(&mut out, Some(&k.link), false);
                write::put_string(&mut out, Some(&k.instance), false);
                out
            }
        }
    }

    /// Value bytes; `None` for a tombstone.
    pub fn encode_value(&self) -> Option<Vec<u8>> {
        match self {
            StateRecord::Collision(_, v) => v.as_ref().map(encode_collision_value),
            StateRecord::Origin(_, v) => v.as_ref().map(encode_origin_value),
            StateRecord::Barrier(_, v) => v.as_ref().map(encode_barrier_value),
            StateRecord::LinkState(_, v) => v.as_ref().map(encode_link_state_value),
            StateRecord::Drained(_, v) => v.as_ref().map(|v| {
                let mut out = Vec::with_capacity(2 + 16 + 1);
                out.extend_from_slice(&0i16.to_be_bytes());
                out.extend_from_slice(&v.failover_id.to_be_bytes());
                out.extend_from_slice(&v.timestamp_ms.to_be_bytes());
                out.push(0); // no tagged fields
                out
            }),
        }
    }

    /// Decode one record from its key and value.
    pub(crate) fn decode(
        key: Option<&[u8]>,
        value: Option<&[u8]>,
    ) -> Result<StateRecord, RecordError> {
        let key = key.ok_or(RecordError::NoKey)?;
        let mut r = Reader::new(key, "key");
        let record_type = r.i16()?;
        match record_type {
            COLLISION_TYPE | ORIGIN_TYPE => {}
            BARRIER_TYPE => return decode_barrier(r, value),
            LINK_STATE_TYPE => return decode_link_state(r, value),
            DRAINED_TYPE => return decode_drained(r, value),
            t => return Err(RecordError::UnknownType(t)),
        }
        let k = OriginKey {
            topic_id: Uuid::from_bytes(r.array()?),
            partition: r.i32()?,
            source: r.cluster_id_string()?,
            original_pid: r.i64()?,
        };
        r.finish()?;
        let Some(value) = value else {
            return Ok(match record_type {
                COLLISION_TYPE => StateRecord::Collision(k, None),
                _ => StateRecord::Origin(k, None),
            });
        };
        let mut r = Reader::new(value, "value");
        let version = r.i16()?;
        if version != 0 {
            return Err(RecordError::UnknownVersion {
                record_type,
                version,
            });
        }
        let record = if record_type == COLLISION_TYPE {
            let v = CollisionValue {
                salt: r.i64()?,
                colliding: r.cluster_id_compact()?,
                timestamp_ms: r.i64()?,
            };
            StateRecord::Collision(k, Some(v))
        } else {
            let v = OriginValue {
                mapped_pid: r.i64()?,
                salt: r.i64()?,
                claim_offset: r.i64()?,
                last_seen_ms: r.i64()?,
            };
            StateRecord::Origin(k, Some(v))
        };
        r.tagged_fields()?;
        r.finish()?;
        Ok(record)
    }
}

fn decode_barrier(mut r: Reader<'_>, value: Option<&[u8]>) -> Result<StateRecord, RecordError> {
    let k = BarrierKey {
        link: r.string(MAX_LINK_NAME)?,
        topic_id: Uuid::from_bytes(r.array()?),
        partition: r.i32()?,
    };
    r.finish()?;
    let Some(value) = value else {
        return Ok(StateRecord::Barrier(k, None));
    };
    let mut r = Reader::new(value, "value");
    let version = r.i16()?;
    if version != 0 {
        return Err(RecordError::UnknownVersion {
            record_type: BARRIER_TYPE,
            version,
        });
    }
    let v = BarrierValue {
        failover_id: r.i64()?,
        source: r.cluster_id_compact()?,
        log_end_offset: r.i64()?,
        timestamp_ms: r.i64()?,
        accepted: r.i8()? != 0,
        error_code: r.i16()?,
        batch: r.compact_bytes()?.to_vec(),
    };
    r.tagged_fields()?;
    r.finish()?;
    Ok(StateRecord::Barrier(k, Some(v)))
}

/// The value reader after its version, which must be 0.
fn value_v0(value: &[u8], record_type: i16) -> Result<Reader<'_>, RecordError> {
    let mut r = Reader::new(value, "value");
    let version = r.i16()?;
    if version != 0 {
        return Err(RecordError::UnknownVersion {
            record_type,
            version,
        });
    }
    Ok(r)
}

fn decode_link_state(mut r: Reader<'_>, value: Option<&[u8]>) -> Result<StateRecord, RecordError> {
    let link = r.string(MAX_LINK_NAME)?;
    r.finish()?;
    let Some(value) = value else {
        return Ok(StateRecord::LinkState(link, None));
    };
    let mut r = value_v0(value, LINK_STATE_TYPE)?;
    let state = LinkState::from_code(r.i8()?).ok_or(RecordError::LinkState)?;
    let v = LinkStatus {
        state,
        since_ms: r.i64()?,
        source: r.cluster_id_compact()?,
        failover_id: r.i64()?,
        failover_started_ms: r.i64()?,
        failover_finished_ms: r.i64()?,
    };
    r.tagged_fields()?;
    r.finish()?;
    Ok(StateRecord::LinkState(link, Some(v)))
}

fn encode_link_state_value(v: &LinkStatus) -> Vec<u8> {
    let source = v.source.to_string();
    let mut out = Vec::with_capacity(2 + 1 + 8 + 1 + source.len() + 24 + 1);
    out.extend_from_slice(&0i16.to_be_bytes());
    out.push(v.state.code() as u8);
    out.extend_from_slice(&v.since_ms.to_be_bytes());
    out.push(source.len() as u8 + 1);
    out.extend_from_slice(source.as_bytes());
    out.extend_from_slice(&v.failover_id.to_be_bytes());
    out.extend_from_slice(&v.failover_started_ms.to_be_bytes());
    out.extend_from_slice(&v.failover_finished_ms.to_be_bytes());
    out.push(0); // no tagged fields
    out
}

fn decode_drained(mut r: Reader<'_>, value: Option<&[u8]>) -> Result<StateRecord, RecordError> {
    let k = DrainedKey {
        link: r.string(MAX_LINK_NAME)?,
        instance: r.string(MAX_INSTANCE_ID)?,
    };
    r.finish()?;
    let Some(value) = value else {
        return Ok(StateRecord::Drained(k, None));
    };
    let mut r = value_v0(value, DRAINED_TYPE)?;
    let v = DrainedValue {
        failover_id: r.i64()?,
        timestamp_ms: r.i64()?,
    };
    r.tagged_fields()?;
    r.finish()?;
    Ok(StateRecord::Drained(k, Some(v)))
}

fn encode_barrier_key(k: &BarrierKey) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + 2 + k.link.len() + 16 + 4);
    out.extend_from_slice(&BARRIER_TYPE.to_be_bytes());
    out.extend_from_slice(&(k.link.len() as i16).to_be_bytes());
    out.extend_from_slice(k.link.as_bytes());
    out.extend_from_slice(k.topic_id.as_bytes());
    out.extend_from_slice(&k.partition.to_be_bytes());
    out
}

fn encode_barrier_value(v: &BarrierValue) -> Vec<u8> {
    let source = v.source.to_string();
    let mut out =
        Vec::with_capacity(2 + 8 + 1 + source.len() + 8 + 8 + 1 + 2 + 5 + v.batch.len() + 1);
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&v.failover_id.to_be_bytes());
    out.push(source.len() as u8 + 1);
    out.extend_from_slice(source.as_bytes());
    out.extend_from_slice(&v.log_end_offset.to_be_bytes());
    out.extend_from_slice(&v.timestamp_ms.to_be_bytes());
    out.push(u8::from(v.accepted));
    out.extend_from_slice(&v.error_code.to_be_bytes());
    // Compact bytes: length + 1 as an unsigned varint.
    write::put_uvarint(&mut out, v.batch.len() as u64 + 1);
    out.extend_from_slice(&v.batch);
    out.push(0); // no tagged fields
    out
}

fn encode_key(record_type: i16, k: &OriginKey) -> Vec<u8> {
    let source = k.source.to_string();
    let mut out = Vec::with_capacity(2 + 16 + 4 + 2 + source.len() + 8);
    out.extend_from_slice(&record_type.to_be_bytes());
    out.extend_from_slice(k.topic_id.as_bytes());
    out.extend_from_slice(&k.partition.to_be_bytes());
    out.extend_from_slice(&(source.len() as i16).to_be_bytes());
    out.extend_from_slice(source.as_bytes());
    out.extend_from_slice(&k.original_pid.to_be_bytes());
    out
}

fn encode_collision_value(v: &CollisionValue) -> Vec<u8> {
    let colliding = v.colliding.to_string();
    let mut out = Vec::with_capacity(2 + 8 + 1 + colliding.len() + 8 + 1);
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&v.salt.to_be_bytes());
    // Compact string: length + 1 as an unsigned varint (22 + 1 fits one byte).
    out.push(colliding.len() as u8 + 1);
    out.extend_from_slice(colliding.as_bytes());
    out.extend_from_slice(&v.timestamp_ms.to_be_bytes());
    out.push(0); // no tagged fields
    out
}

fn encode_origin_value(v: &OriginValue) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + 32 + 1);
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&v.mapped_pid.to_be_bytes());
    out.extend_from_slice(&v.salt.to_be_bytes());
    out.extend_from_slice(&v.claim_offset.to_be_bytes());
    out.extend_from_slice(&v.last_seen_ms.to_be_bytes());
    out.push(0);
    out
}

/// The codecs' reads over a key or a value (`what`), every failure to read
/// a [`RecordError::Truncated`] naming it.
struct Reader<'a> {
    cur: Cursor<'a>,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader {
            cur: Cursor::new(buf),
            what,
        }
    }

    fn truncated(&self) -> RecordError {
        RecordError::Truncated { what: self.what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], RecordError> {
        self.cur.bytes(n).map_err(|_| self.truncated())
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        self.cur.array().map_err(|_| self.truncated())
    }

    fn i8(&mut self) -> Result<i8, RecordError> {
        Ok(i8::from_be_bytes(self.array()?))
    }
    fn i16(&mut self) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn uvarint(&mut self) -> Result<u32, RecordError> {
        self.cur.uvarint().map_err(|_| self.truncated())
    }

    fn cluster_id(&self, bytes: &[u8]) -> Result<ClusterId, RecordError> {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|s| ClusterId::parse_canonical(s).ok())
            .ok_or(RecordError::ClusterId { what: self.what })
    }

    /// int16 length, then the bytes (a null string is refused).
    fn cluster_id_string(&mut self) -> Result<ClusterId, RecordError> {
        let len = self.i16()?;
        let len = usize::try_from(len).map_err(|_| RecordError::ClusterId { what: self.what })?;
        let bytes = self.take(len)?;
        self.cluster_id(bytes)
    }

    /// int16 length, then at most `max` bytes of UTF-8 (null refused).
    fn string(&mut self, max: usize) -> Result<String, RecordError> {
        let bad = RecordError::String { what: self.what };
        let len = usize::try_from(self.i16()?).map_err(|_| bad.clone())?;
        if len > max {
            return Err(bad);
        }
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| bad)
    }

    /// Compact bytes: unsigned varint length + 1, then the bytes (null
    /// refused). The length is checked against what remains by `take`.
    fn compact_bytes(&mut self) -> Result<&'a [u8], RecordError> {
        let len_plus_one = self.uvarint()?;
        let len = len_plus_one.checked_sub(1).ok_or(self.truncated())?;
        self.take(len as usize)
    }

    /// Compact string: unsigned varint length + 1, then the bytes.
    fn cluster_id_compact(&mut self) -> Result<ClusterId, RecordError> {
        let len = self
            .uvarint()?
            .checked_sub(1)
            .ok_or(RecordError::ClusterId { what: self.what })?;
        let bytes = self.take(len as usize)?;
        self.cluster_id(bytes)
    }

    /// Skips tagged fields (none are defined at version 0).
    fn tagged_fields(&mut self) -> Result<(), RecordError> {
        for _ in 0..self.uvarint()? {
            let _tag = self.uvarint()?;
            let size = self.uvarint()?;
            self.take(size as usize)?;
        }
        Ok(())
    }

    fn finish(&self) -> Result<(), RecordError> {
        match self.cur.remaining() {
            0 => Ok(()),
            extra => Err(RecordError::Trailing {
                what: self.what,
                extra,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn key() -> OriginKey {
        OriginKey {
            topic_id: Uuid::from_u128(0x0011_2233_4455_6677_8899_aabb_ccdd_eeff),
            partition: 3,
            source: ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qg").unwrap(),
            original_pid: 5,
        }
    }

    // "MkU3OEVBNTcwNTJENDM2Qg" in ASCII.
    const CLUSTER_HEX: &str = "4d6b55334f4556424e5463774e544a454e44 4d325167";

    /// The vectors of docs/state-topic.md.
    fn collision_key_hex() -> String {
        format!(
            "0003 00112233445566778899aabbccddeeff 00000003 0016 {CLUSTER_HEX} 0000000000000005"
        )
    }

    #[test]
    fn collision_record_bytes() {
        let value = CollisionValue {
            salt: 0x0123_4567_89ab_cdef,
            colliding: ClusterId::parse("AAAAAAAAAAAAAAAAAAAAAQ").unwrap(),
            timestamp_ms: 1_700_000_000_000,
        };
        let r = StateRecord::Collision(key(), Some(value));
        assert_eq!(r.encode_key(), hex(&collision_key_hex()));
        let value_hex = "0000 0123456789abcdef 17 41414141414141414141414141414141414141414151 0000018bcfe56800 00";
        assert_eq!(r.encode_value().unwrap(), hex(value_hex));
        assert_eq!(r.encode_key().len(), 54);
        assert_eq!(r.encode_value().unwrap().len(), 42);
        let back = StateRecord::decode(Some(&hex(&collision_key_hex())), Some(&hex(value_hex)));
        assert_eq!(back, Ok(r));
        // Tombstone.
        let t = StateRecord::decode(Some(&hex(&collision_key_hex())), None);
        assert_eq!(t, Ok(StateRecord::Collision(key(), None)));
    }

    #[test]
    fn origin_record_bytes() {
        let k = OriginKey {
            original_pid: -5_136_071_999_516_311_547,
            ..key()
        };
        let value = OriginValue {
            mapped_pid: -5_136_071_999_516_311_547,
            salt: 0,
            claim_offset: -1,
            last_seen_ms: 1_700_000_000_000,
        };
        let r = StateRecord::Origin(k, Some(value));
        // -5136071999516311547 = 0xb8b901ba80000005
        let key_hex = format!(
            "0004 00112233445566778899aabbccddeeff 00000003 0016 {CLUSTER_HEX} b8b901ba80000005"
        );
        assert_eq!(r.encode_key(), hex(&key_hex));
        let value_hex =
            "0000 b8b901ba80000005 0000000000000000 ffffffffffffffff 0000018bcfe56800 00";
        assert_eq!(r.encode_value().unwrap(), hex(value_hex));
        assert_eq!(r.encode_value().unwrap().len(), 35);
        assert_eq!(
            StateRecord::decode(Some(&hex(&key_hex)), Some(&hex(value_hex))),
            Ok(r)
        );
    }

    #[test]
    fn link_state_record_bytes() {
        let v = LinkStatus {
            state: LinkState::Stopping,
            since_ms: 1_700_000_000_000,
            source: key().source,
            failover_id: 1_700_000_000_000,
            failover_started_ms: 1_700_000_000_000,
            failover_finished_ms: -1,
        };
        let r = StateRecord::LinkState("east".into(), Some(v));
        let key_hex = "0005 0004 65617374";
        assert_eq!(r.encode_key(), hex(key_hex));
        let value_hex = format!(
            "0000 01 0000018bcfe56800 17 {CLUSTER_HEX} 0000018bcfe56800 0000018bcfe56800 ffffffffffffffff 00"
        );
        assert_eq!(r.encode_value().unwrap(), hex(&value_hex));
        assert_eq!(r.encode_value().unwrap().len(), 59);
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), Some(&hex(&value_hex))),
            Ok(r)
        );
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), None),
            Ok(StateRecord::LinkState("east".into(), None))
        );
        let (kb, vb) = (hex(key_hex), hex(&value_hex));
        for n in 0..vb.len() {
            assert!(
                StateRecord::decode(Some(&kb), Some(&vb[..n])).is_err(),
                "{n}"
            );
        }
        for n in 0..kb.len() {
            assert!(StateRecord::decode(Some(&kb[..n]), None).is_err(), "{n}");
        }
        let mut bad = vb.clone();
        bad[2] = 4;
        assert_eq!(
            StateRecord::decode(Some(&kb), Some(&bad)),
            Err(RecordError::LinkState)
        );
        // A link name longer than any allowed is refused before it is read.
        let long = hex("0005 7fff");
        assert_eq!(
            StateRecord::decode(Some(&long), None),
            Err(RecordError::String { what: "key" })
        );
    }

    #[test]
    fn drained_record_bytes() {
        let k = DrainedKey {
            link: "east".into(),
            instance: "i-1".into(),
        };
        let v = DrainedValue {
            failover_id: 42,
            timestamp_ms: 1_700_000_000_000,
        };
        let r = StateRecord::Drained(k.clone(), Some(v));
        let key_hex = "0007 0004 65617374 0003 692d31";
        assert_eq!(r.encode_key(), hex(key_hex));
        let value_hex = "0000 000000000000002a 0000018bcfe56800 00";
        assert_eq!(r.encode_value().unwrap(), hex(value_hex));
        assert_eq!(r.encode_value().unwrap().len(), 19);
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), Some(&hex(value_hex))),
            Ok(r)
        );
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), None),
            Ok(StateRecord::Drained(k, None))
        );
        let mut v1 = hex(value_hex);
        v1[1] = 1;
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), Some(&v1)),
            Err(RecordError::UnknownVersion {
                record_type: 7,
                version: 1
            })
        );
    }

    #[test]
    fn barrier_record_bytes() {
        let k = BarrierKey {
            link: "east".into(),
            topic_id: key().topic_id,
            partition: 3,
        };
        let v = BarrierValue {
            failover_id: 42,
            source: key().source,
            log_end_offset: 100,
            timestamp_ms: 1_700_000_000_000,
            accepted: false,
            error_code: 87,
            batch: vec![0xde, 0xad, 0xbe, 0xef],
        };
        let r = StateRecord::Barrier(k.clone(), Some(v));
        let key_hex = "0006 0004 65617374 00112233445566778899aabbccddeeff 00000003";
        assert_eq!(r.encode_key(), hex(key_hex));
        let value_hex = format!(
            "0000 000000000000002a 17 {CLUSTER_HEX} 0000000000000064 0000018bcfe56800 00 0057 05 deadbeef 00"
        );
        assert_eq!(r.encode_value().unwrap(), hex(&value_hex));
        assert_eq!(r.encode_value().unwrap().len(), 58);
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), Some(&hex(&value_hex))),
            Ok(r)
        );
        assert_eq!(
            StateRecord::decode(Some(&hex(key_hex)), None),
            Ok(StateRecord::Barrier(k, None))
        );
        // Every truncation is an error, never a panic; a batch length past
        // the end is truncation, not an allocation.
        let (kb, vb) = (hex(key_hex), hex(&value_hex));
        for n in 0..kb.len() {
            assert!(
                StateRecord::decode(Some(&kb[..n]), Some(&vb)).is_err(),
                "{n}"
            );
        }
        for n in 0..vb.len() {
            assert!(
                StateRecord::decode(Some(&kb), Some(&vb[..n])).is_err(),
                "{n}"
            );
        }
        let mut huge = vb[..51].to_vec();
        huge.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f, 0xde]);
        assert_eq!(
            StateRecord::decode(Some(&kb), Some(&huge)),
            Err(RecordError::Truncated { what: "value" })
        );
        // A link name longer than any configured one.
        let mut long = kb.clone();
        long[2..4].copy_from_slice(&300i16.to_be_bytes());
        assert_eq!(
            StateRecord::decode(Some(&long), None),
            Err(RecordError::String { what: "key" })
        );
    }

    #[test]
    fn unknown_tagged_fields_are_skipped() {
        let value = hex("0000 b8b901ba80000005 0000000000000000 0000000000000007 0000000000000001 01 05 02 abcd");
        let r = StateRecord::decode(
            Some(&hex(&collision_key_hex()).replace_type(4)),
            Some(&value),
        );
        assert_eq!(
            r,
            Ok(StateRecord::Origin(
                key(),
                Some(OriginValue {
                    mapped_pid: -5_136_071_999_516_311_547,
                    salt: 0,
                    claim_offset: 7,
                    last_seen_ms: 1,
                })
            ))
        );
    }

    trait ReplaceType {
        fn replace_type(self, t: i16) -> Vec<u8>;
    }
    impl ReplaceType for Vec<u8> {
        fn replace_type(mut self, t: i16) -> Vec<u8> {
            self[..2].copy_from_slice(&t.to_be_bytes());
            self
        }
    }

    #[test]
    fn bad_records_are_typed_errors() {
        let k = hex(&collision_key_hex());
        let v = StateRecord::Collision(
            key(),
            Some(CollisionValue {
                salt: 1,
                colliding: key().source,
                timestamp_ms: 0,
            }),
        )
        .encode_value()
        .unwrap();
        assert_eq!(StateRecord::decode(None, Some(&v)), Err(RecordError::NoKey));
        assert_eq!(
            StateRecord::decode(Some(&k.clone().replace_type(9)), Some(&v)),
            Err(RecordError::UnknownType(9))
        );
        // An origin key read as a link state key: not a valid link name.
        assert!(StateRecord::decode(Some(&k.clone().replace_type(5)), None).is_err());
        let mut v1 = v.clone();
        v1[1] = 1;
        assert_eq!(
            StateRecord::decode(Some(&k), Some(&v1)),
            Err(RecordError::UnknownVersion {
                record_type: 3,
                version: 1
            })
        );
        let mut long = k.clone();
        long.push(0);
        assert_eq!(
            StateRecord::decode(Some(&long), None),
            Err(RecordError::Trailing {
                what: "key",
                extra: 1
            })
        );
        let mut long = v.clone();
        long.push(0);
        assert_eq!(
            StateRecord::decode(Some(&k), Some(&long)),
            Err(RecordError::Trailing {
                what: "value",
                extra: 1
            })
        );
        // A cluster id that is not one.
        let mut bad = k.clone();
        bad[24] = b'!';
        assert_eq!(
            StateRecord::decode(Some(&bad), None),
            Err(RecordError::ClusterId { what: "key" })
        );
        // A string length past the end, a negative one.
        let mut bad = k.clone();
        bad[22..24].copy_from_slice(&0x7fffi16.to_be_bytes());
        assert_eq!(
            StateRecord::decode(Some(&bad), None),
            Err(RecordError::Truncated { what: "key" })
        );
        bad[22..24].copy_from_slice(&(-1i16).to_be_bytes());
        assert!(StateRecord::decode(Some(&bad), None).is_err());
        // Every truncation of key and value is an error, never a panic.
        for n in 0..k.len() {
            assert!(StateRecord::decode(Some(&k[..n]), None).is_err(), "{n}");
        }
        for n in 0..v.len() {
            assert!(StateRecord::decode(Some(&k), Some(&v[..n])).is_err(), "{n}");
        }
        // A huge tagged field size is truncation, not an allocation.
        let mut huge = v[..v.len() - 1].to_vec();
        huge.extend_from_slice(&[1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f]);
        assert_eq!(
            StateRecord::decode(Some(&k), Some(&huge)),
            Err(RecordError::Truncated { what: "value" })
        );
    }
}
