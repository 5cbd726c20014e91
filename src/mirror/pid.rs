//! Mapping of mirrored producer ids into the negative half of `i64`, so they
//! can never collide with ids the target cluster allocates (always >= 0):
//!
//! ```text
//! bit 63      : 1 (sign)
//! bits 62..31 : region   = cluster_hash(source cluster id)
//! bits 30..0  : identity = source pid (must be < 2^31)
//! ```

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::{GeneralPurpose, NO_PAD};
use base64::{alphabet, Engine};
use thiserror::Error;

/// Kafka's "no producer" id.
pub(crate) const NO_PRODUCER_ID: i64 = -1;
const IDENTITY_MASK: i64 = 0x7FFF_FFFF;
const SIGN: u64 = 1 << 63;
const ENCODED_LEN: usize = 22;
/// URL-safe, unpadded, and as lenient as Java's decoder about trailing bits.
const KAFKA_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::URL_SAFE,
    NO_PAD.with_decode_allow_trailing_bits(true),
);

/// A Kafka cluster id: 16 bytes, written as 22 characters of URL-safe base64.
/// `Display` prints the canonical spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ClusterId([u8; 16]);

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ClusterIdError {
    #[error(
        "invalid cluster id: expected 22 characters of URL-safe base64 encoding 16 bytes, \
         found {found} characters"
    )]
    Length { found: usize },
    #[error(
        "invalid cluster id: expected 22 characters of URL-safe base64 encoding 16 bytes, \
         found {character:?} at position {position}"
    )]
    InvalidCharacter { position: usize, character: char },
    #[error(
        "invalid cluster id: expected 22 characters of URL-safe base64 encoding 16 bytes, \
         last character {character:?} has non-zero trailing bits"
    )]
    TrailingBits { character: char },
}

impl ClusterId {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }

    #[cfg(test)]
    pub(crate) const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// Parses a cluster id the way Kafka's `Uuid.fromString` does: the
    /// unused low 4 bits of the last character are ignored, because brokers
    /// accept such ids (e.g. the ubiquitous demo id `MkU3OEVBNTcwNTJENDM2Qk`,
    /// canonically `...Qg`). Use `ClusterId::parse_canonical` to reject them.
    pub fn parse(s: &str) -> Result<Self, ClusterIdError> {
        let found = s.chars().count();
        if found != ENCODED_LEN {
            return Err(ClusterIdError::Length { found });
        }
        // Checked here rather than via the decoder so errors name a character,
        // not a byte offset into possibly multi-byte UTF-8.
        if let Some((position, character)) = s
            .chars()
            .enumerate()
            .find(|&(_, c)| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(ClusterIdError::InvalidCharacter {
                position,
                character,
            });
        }
        // 22 alphabet characters always decode to exactly 16 bytes.
        let mut buf = [0; 18]; // the decoder insists on room for 3 bytes per 4 characters
        match KAFKA_BASE64.decode_slice(s, &mut buf) {
            Ok(16) => {
                let [bytes @ .., _, _] = buf;
                Ok(Self(bytes))
            }
            _ => Err(ClusterIdError::Length { found }),
        }
    }

    /// Like [`ClusterId::parse`], but also rejects non-zero trailing bits, so
    /// every id has exactly one spelling.
    pub(crate) fn parse_canonical(s: &str) -> Result<Self, ClusterIdError> {
        let id = Self::parse(s)?;
        if id.to_string() != s {
            let character = s.chars().last().unwrap_or_default();
            return Err(ClusterIdError::TrailingBits { character });
        }
        Ok(id)
    }
}

impl FromStr for ClusterId {
    type Err = ClusterIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&KAFKA_BASE64.encode(self.0))
    }
}

/// The region of a cluster: XOR of the big-endian 64-bit halves, low 32 bits.
pub fn cluster_hash(id: &ClusterId) -> u32 {
    let (msb, lsb) = id.0.split_at(8);
    let half = |b: &[u8]| b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x));
    (half(msb) ^ half(lsb)) as u32
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mapping {
    /// `-1`, or already mapped (negative): forward as is, so chained mirrors
    /// and replays are safe.
    Unchanged,
    Mapped(i64),
    Unplaceable(Unplaceable),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub(crate) enum Unplaceable {
    #[error(
        "producer id {pid} is 2^31 or larger and does not fit the 31-bit identity field of a \
         mirrored producer id; it would share a slot with producer id {}",
        pid & IDENTITY_MASK
    )]
    PidTooLarge { pid: i64 },
    #[error(
        "mirrored producer id would be -1, which Kafka reserves for \"no producer\" \
         (region 0xffffffff with producer id 2147483647)"
    )]
    WouldBeNoProducer,
}

/// Maps a source-cluster pid into `region`'s slice of the negative space.
pub(crate) fn map_pid(region: u32, pid: i64) -> Mapping {
    if pid < 0 {
        return Mapping::Unchanged;
    }
    if pid > IDENTITY_MASK {
        return Mapping::Unplaceable(Unplaceable::PidTooLarge { pid });
    }
    let mapped = (SIGN | u64::from(region) << 31 | pid as u64) as i64;
    if mapped == NO_PRODUCER_ID {
        Mapping::Unplaceable(Unplaceable::WouldBeNoProducer)
    } else {
        Mapping::Mapped(mapped)
    }
}

/// Splits a mapped pid into `(region, identity)`; `None` if it is not one.
pub fn unmap_pid(pid: i64) -> Option<(u32, u32)> {
    if pid >= 0 || pid == NO_PRODUCER_ID {
        return None;
    }
    // Truncation drops the sign bit, leaving bits 62..31.
    Some(((pid as u64 >> 31) as u32, (pid & IDENTITY_MASK) as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ID: &str = "MkU3OEVBNTcwNTJENDM2Qk";

    #[test]
    fn exact_values() {
        assert_eq!(map_pid(42, 5), Mapping::Mapped(-9_223_371_946_660_462_587));
        assert_eq!(map_pid(99, 5), Mapping::Mapped(-9_223_371_824_253_894_651));
        let id: ClusterId = ID.parse().unwrap();
        assert_eq!(
            id.as_bytes(),
            &[
                0x32, 0x45, 0x37, 0x38, 0x45, 0x41, 0x35, 0x37, 0x30, 0x35, 0x32, 0x44, 0x34, 0x33,
                0x36, 0x42
            ]
        );
        assert_eq!(cluster_hash(&id), 0x7172_0375);
        assert_eq!(
            map_pid(cluster_hash(&id), 5),
            Mapping::Mapped(-5_136_071_999_516_311_547)
        );
        // The demo id has non-zero trailing bits; Kafka accepts it, and so do we.
        assert_eq!(id.to_string(), "MkU3OEVBNTcwNTJENDM2Qg");
        assert_eq!(ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qg"), Ok(id));
    }

    #[test]
    fn unchanged_and_idempotent() {
        assert_eq!(map_pid(42, -1), Mapping::Unchanged);
        assert_eq!(map_pid(42, i64::MIN), Mapping::Unchanged);
        let Mapping::Mapped(m) = map_pid(42, 5) else {
            panic!()
        };
        assert_eq!(map_pid(99, m), Mapping::Unchanged);
        assert_eq!(map_pid(0, 0), Mapping::Mapped(i64::MIN));
    }

    #[test]
    fn unplaceable() {
        for pid in [1i64 << 31, i64::MAX] {
            assert_eq!(
                map_pid(42, pid),
                Mapping::Unplaceable(Unplaceable::PidTooLarge { pid })
            );
        }
        assert_eq!(
            map_pid(0xFFFF_FFFF, 0x7FFF_FFFF),
            Mapping::Unplaceable(Unplaceable::WouldBeNoProducer)
        );
        assert_eq!(map_pid(0xFFFF_FFFF, 0x7FFF_FFFE), Mapping::Mapped(-2));
        assert_eq!(
            map_pid(0xFFFF_FFFF, (1 << 31) - 1 + 1),
            Mapping::Unplaceable(Unplaceable::PidTooLarge { pid: 1 << 31 })
        );
        assert_eq!(
            Unplaceable::PidTooLarge { pid: (1 << 31) + 5 }.to_string(),
            "producer id 2147483653 is 2^31 or larger and does not fit the 31-bit identity field of a \
             mirrored producer id; it would share a slot with producer id 5"
        );
    }

    #[test]
    fn unmap() {
        assert_eq!(unmap_pid(-9_223_371_946_660_462_587), Some((42, 5)));
        assert_eq!(unmap_pid(-2), Some((0xFFFF_FFFF, 0x7FFF_FFFE)));
        assert_eq!(unmap_pid(i64::MIN), Some((0, 0)));
        assert_eq!(unmap_pid(-1), None);
        assert_eq!(unmap_pid(0), None);
        assert_eq!(unmap_pid(5), None);
    }

    #[test]
    fn invalid_cluster_ids() {
        use ClusterIdError::*;
        let cases: [(&str, ClusterIdError); 5] = [
            ("MkU3OEVBNTcwNTJENDM2Q", Length { found: 21 }),
            ("MkU3OEVBNTcwNTJENDM2QkA", Length { found: 23 }),
            (
                "MkU3OEVBNTcwNTJENDM2+k",
                InvalidCharacter {
                    position: 20,
                    character: '+',
                },
            ),
            (
                "/kU3OEVBNTcwNTJENDM2Qk",
                InvalidCharacter {
                    position: 0,
                    character: '/',
                },
            ),
            (
                "MkU3OEVBNTcwNTJENDM2Qé",
                InvalidCharacter {
                    position: 21,
                    character: 'é',
                },
            ),
        ];
        for (s, err) in cases {
            assert_eq!(s.parse::<ClusterId>(), Err(err), "{s}");
        }
        assert_eq!(
            ClusterId::parse("abc").unwrap_err().to_string(),
            "invalid cluster id: expected 22 characters of URL-safe base64 encoding 16 bytes, found 3 characters"
        );
        assert!(ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qk==").is_err());

        // Trailing bits: ignored like Kafka does, or rejected on request.
        assert_eq!(
            ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qr"),
            ClusterId::parse(ID)
        );
        for s in [ID, "MkU3OEVBNTcwNTJENDM2Qr"] {
            let c = s.chars().last().unwrap();
            assert_eq!(
                ClusterId::parse_canonical(s),
                Err(TrailingBits { character: c })
            );
        }
        assert!(ClusterId::parse_canonical("MkU3OEVBNTcwNTJENDM2Qg").is_ok());
        assert_eq!(
            TrailingBits { character: 'r' }.to_string(),
            "invalid cluster id: expected 22 characters of URL-safe base64 encoding 16 bytes, \
             last character 'r' has non-zero trailing bits"
        );
    }

    proptest! {
        #[test]
        fn round_trip(region in any::<u32>(), pid in 0i64..=IDENTITY_MASK) {
            match map_pid(region, pid) {
                Mapping::Mapped(m) => {
                    prop_assert!(m < -1);
                    prop_assert_eq!(unmap_pid(m), Some((region, pid as u32)));
                    prop_assert_eq!(map_pid(region, m), Mapping::Unchanged);
                }
                other => prop_assert_eq!(
                    (region, pid, other),
                    (u32::MAX, IDENTITY_MASK, Mapping::Unplaceable(Unplaceable::WouldBeNoProducer))
                ),
            }
        }

        #[test]
        fn cluster_id_display_round_trip(bytes in any::<[u8; 16]>()) {
            let id = ClusterId::from_bytes(bytes);
            prop_assert_eq!(id.to_string().parse::<ClusterId>(), Ok(id));
            prop_assert_eq!(ClusterId::parse_canonical(&id.to_string()), Ok(id));
        }
    }
}
