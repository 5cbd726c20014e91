//! The records section of a compressed record batch, decompressed with a
//! bound. The proxy writes its state batches uncompressed, but a broker
//! recompresses them when the topic's (or the broker's) `compression.type`
//! says so, and an operator may set that after the topic was created: the
//! state reader must read every codec Kafka writes (attributes bits 0-2:
//! 1 gzip, 2 snappy, 3 lz4, 4 zstd).
//!
//! What comes out is bounded by the caller's limit, whatever the bytes
//! announce: output grows only as it is produced, and a batch that would
//! exceed the limit is an error, not an allocation.

use std::io::Read;
use std::sync::Arc;

/// Why a records section could not be decompressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecompressError {
    #[error("unknown compression codec {0}")]
    UnknownCodec(u8),
    #[error("{codec} records decompress to more than {limit} bytes")]
    TooLarge { codec: &'static str, limit: usize },
    #[error("corrupt {codec} records")]
    Corrupt {
        codec: &'static str,
        #[source]
        cause: Corruption,
    },
}

/// What was wrong with a corrupt records section: the codec's own error,
/// or snappy-java's framing cut short.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Corruption {
    /// Shared, so that the error stays `Clone` as the state reader's skip
    /// reasons are.
    #[error(transparent)]
    Io(Arc<std::io::Error>),
    #[error(transparent)]
    Snappy(#[from] snap::Error),
    #[error("stream header cut short")]
    HeaderCutShort,
    #[error("block length cut short")]
    LengthCutShort,
    #[error("block of {0} bytes cut short")]
    BlockCutShort(usize),
}

impl From<std::io::Error> for Corruption {
    fn from(e: std::io::Error) -> Self {
        Corruption::Io(Arc::new(e))
    }
}

/// Equal when they say the same: an I/O error has no equality of its own,
/// and a test compares what a reader saw with what it expects.
impl PartialEq for Corruption {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Corruption::Io(a), Corruption::Io(b)) => {
                a.kind() == b.kind() && a.to_string() == b.to_string()
            }
            (Corruption::Snappy(a), Corruption::Snappy(b)) => a == b,
            (Corruption::HeaderCutShort, Corruption::HeaderCutShort)
            | (Corruption::LengthCutShort, Corruption::LengthCutShort) => true,
            (Corruption::BlockCutShort(a), Corruption::BlockCutShort(b)) => a == b,
            _ => false,
        }
    }
}

impl Eq for Corruption {}

/// The codec's name for batch attribute bits `codec` (0-7).
pub(crate) fn codec_name(codec: u8) -> &'static str {
    match codec {
        0 => "none",
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "unknown",
    }
}

/// Decompress `input`, a batch's records section compressed with `codec`
/// (the batch attributes' low three bits, not 0), into at most `limit`
/// bytes.
pub(crate) fn decompress(
    codec: u8,
    input: &[u8],
    limit: usize,
) -> Result<Vec<u8>, DecompressError> {
    let name = codec_name(codec);
    let corrupt = |e: std::io::Error| DecompressError::Corrupt {
        codec: name,
        cause: e.into(),
    };
    match codec {
        1 => read_bounded(flate2::read::GzDecoder::new(input), name, limit),
        2 => snappy(input, limit),
        // Kafka's lz4 is the LZ4 frame format (KafkaLZ4BlockOutputStream).
        3 => read_bounded(lz4::Decoder::new(input).map_err(corrupt)?, name, limit),
        4 => read_bounded(
            zstd::stream::read::Decoder::with_buffer(input).map_err(corrupt)?,
            name,
            limit,
        ),
        other => Err(DecompressError::UnknownCodec(other)),
    }
}

/// Everything `reader` gives, refused past `limit` bytes.
fn read_bounded(
    reader: impl Read,
    codec: &'static str,
    limit: usize,
) -> Result<Vec<u8>, DecompressError> {
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| DecompressError::Corrupt {
            codec,
            cause: e.into(),
        })?;
    match out.len() > limit {
        true => Err(DecompressError::TooLarge { codec, limit }),
        false => Ok(out),
    }
}

/// snappy-java's stream header (`SnappyOutputStream`, which Kafka's
/// producer uses): magic, then a version and a compatible version.
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_LEN: usize = 16;

/// Kafka's snappy: snappy-java's framing (a header, then blocks each
/// preceded by its compressed length), or one raw snappy block without
/// the header, which snappy-java also reads.
fn snappy(input: &[u8], limit: usize) -> Result<Vec<u8>, DecompressError> {
    let corrupt = |cause: Corruption| DecompressError::Corrupt {
        codec: "snappy",
        cause,
    };
    let mut out = Vec::new();
    let block = |compressed: &[u8], out: &mut Vec<u8>| {
        let len = snap::raw::decompress_len(compressed).map_err(|e| corrupt(e.into()))?;
        if len > limit - out.len() {
            return Err(DecompressError::TooLarge {
                codec: "snappy",
                limit,
            });
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(compressed, &mut out[start..])
            .map_err(|e| corrupt(e.into()))?;
        Ok(())
    };
    if !input.starts_with(XERIAL_MAGIC) {
        block(input, &mut out)?;
        return Ok(out);
    }
    let mut rest = input
        .get(XERIAL_HEADER_LEN..)
        .ok_or_else(|| corrupt(Corruption::HeaderCutShort))?;
    while !rest.is_empty() {
        let (len, after) = rest
            .split_first_chunk::<4>()
            .ok_or_else(|| corrupt(Corruption::LengthCutShort))?;
        let len = u32::from_be_bytes(*len) as usize;
        let compressed = after
            .get(..len)
            .ok_or_else(|| corrupt(Corruption::BlockCutShort(len)))?;
        block(compressed, &mut out)?;
        rest = &after[len..];
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::compression::{Compressor, Gzip, Lz4, Snappy, Zstd};

    /// Compressed as Kafka's own codecs write it (kafka-protocol's
    /// compressors follow the Java client's framing).
    fn compressed(codec: u8, plain: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        let put = |b: &mut BytesMut| {
            b.extend_from_slice(plain);
            Ok(())
        };
        match codec {
            1 => Gzip::compress(&mut out, put),
            2 => Snappy::compress(&mut out, put),
            3 => Lz4::compress(&mut out, put),
            4 => Zstd::compress(&mut out, put),
            _ => unreachable!(),
        }
        .expect("compress");
        out.to_vec()
    }

    fn plain() -> Vec<u8> {
        // More than one snappy-java block (32 KiB), and compressible.
        (0..100_000u32)
            .flat_map(|i| (i % 251).to_be_bytes())
            .collect()
    }

    #[test]
    fn every_codec_round_trips() {
        let plain = plain();
        for codec in 1..=4 {
            let c = compressed(codec, &plain);
            assert!(c.len() < plain.len(), "{}", codec_name(codec));
            assert_eq!(decompress(codec, &c, plain.len()), Ok(plain.clone()));
        }
    }

    #[test]
    fn raw_snappy_without_the_stream_header_is_read() {
        let plain = plain();
        let raw = snap::raw::Encoder::new().compress_vec(&plain).unwrap();
        assert_eq!(decompress(2, &raw, plain.len()), Ok(plain));
    }

    #[test]
    fn output_past_the_limit_is_refused() {
        let plain = plain();
        for codec in 1..=4 {
            let c = compressed(codec, &plain);
            assert_eq!(
                decompress(codec, &c, plain.len() - 1),
                Err(DecompressError::TooLarge {
                    codec: codec_name(codec),
                    limit: plain.len() - 1
                }),
                "{}",
                codec_name(codec)
            );
        }
    }

    #[test]
    fn a_corrupt_section_carries_the_codec_error_as_its_source() {
        use std::error::Error as _;
        let e = decompress(2, b"\xff\xff\xff\xff\xff", 100).expect_err("not snappy");
        assert!(
            matches!(
                &e,
                DecompressError::Corrupt {
                    codec: "snappy",
                    cause: Corruption::Snappy(_)
                }
            ),
            "{e:?}"
        );
        assert_eq!(e.to_string(), "corrupt snappy records");
        let cause = e.source().expect("the snappy error");
        assert!(!cause.to_string().is_empty());
        let cut = decompress(2, &XERIAL_MAGIC[..], 100).expect_err("no header");
        assert_eq!(
            crate::sync::error_chain(&cut),
            "corrupt snappy records: stream header cut short"
        );
        let gz = decompress(1, b"not gzip", 100).expect_err("not gzip");
        let io = gz.source().and_then(|c| c.downcast_ref::<Corruption>());
        assert!(matches!(io, Some(Corruption::Io(_))), "{gz:?}");
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        assert_eq!(
            decompress(5, b"x", 10),
            Err(DecompressError::UnknownCodec(5))
        );
        let plain = plain();
        for codec in 1..=4 {
            let c = compressed(codec, &plain);
            for cut in [0, 1, 7, 16, 21, c.len() / 2] {
                // An error, or (snappy-java's framing cut between blocks)
                // fewer bytes, which the batch's record count then catches.
                let r = decompress(codec, &c[..cut], plain.len());
                assert!(
                    r.as_ref().map_or(true, |out| out.len() < plain.len()),
                    "{} cut at {cut}",
                    codec_name(codec)
                );
            }
            let mut flipped = c.clone();
            for i in (0..flipped.len()).step_by(97) {
                flipped[i] ^= 0x5a;
                let _ = decompress(codec, &flipped, plain.len());
            }
        }
    }
}
