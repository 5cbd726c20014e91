//! CRC-32C (Castagnoli), as used by Kafka record batches, plus an O(log n)
//! update of an existing CRC after a few bytes of the message were rewritten.
//!
//! CRC-32C is linear over GF(2): for equal-length messages,
//! `crc(M ^ D) = crc(M) ^ L(D)`, where `L` is the CRC with zero initial
//! register and no final xor. When `D` is zero except for a short patch,
//! leading zeros leave a zero register untouched, so `L(D)` is the raw CRC of
//! the xored bytes multiplied by `x^(8 * bytes_after) mod P`. The
//! multiplication follows zlib's `crc32_combine` (1.2.12+) in the reflected
//! domain, where bit 31 holds the coefficient of `x^0`.

/// Reflected CRC-32C polynomial.
const POLY: u32 = 0x82F6_3B78;

/// `x^0` in the reflected representation.
const ONE: u32 = 1 << 31;

/// CRC-32C of `data` (initial register `!0`, final xor `!0`).
pub fn checksum(data: &[u8]) -> u32 {
    ::crc32c::crc32c(data)
}

/// Updates `old_crc` for a message in which the `N` bytes `old` were
/// replaced by `new`, followed by `bytes_after` unchanged bytes.
///
/// Taking two `[u8; N]` makes unequal lengths unrepresentable. Only the
/// difference is added: the function never recomputes from the message, so a
/// CRC that was wrong before stays wrong by exactly the same amount.
/// Cost is O(N) plus one multiplication per non-zero hex digit of
/// `bytes_after` (four for a 16 KiB batch); the message itself is never
/// read.
pub(crate) fn patch<const N: usize>(
    old_crc: u32,
    old: [u8; N],
    new: [u8; N],
    bytes_after: u64,
) -> u32 {
    let mut reg = 0u32;
    for (o, n) in old.iter().zip(new.iter()) {
        reg = (reg >> 8) ^ BYTE_TABLE[((reg ^ u32::from(o ^ n)) & 0xFF) as usize];
    }
    old_crc ^ append_zeros(reg, bytes_after)
}

/// Byte-at-a-time table of the raw (zero-init, no final xor) CRC register.
const BYTE_TABLE: [u32; 256] = {
    let mut table = [0; 256];
    let mut i = 0;
    while i < 256 {
        let mut reg = i as u32;
        let mut bit = 0;
        while bit < 8 {
            reg = (reg >> 1) ^ (POLY & 0u32.wrapping_sub(reg & 1));
            bit += 1;
        }
        table[i] = reg;
        i += 1;
    }
    table
};

/// `a * b mod P` in the reflected domain. Branch-free: 32 shift-and-xor
/// steps whatever the operands.
const fn multmodp(a: u32, mut b: u32) -> u32 {
    let mut p = 0;
    let mut i = 0;
    while i < 32 {
        p ^= b & 0u32.wrapping_sub((a >> (31 - i)) & 1);
        b = (b >> 1) ^ (POLY & 0u32.wrapping_sub(b & 1));
        i += 1;
    }
    p
}

/// `a * b mod P`, as [`multmodp`] but four bits of `a` at a time: `b`
/// times each of the 16 polynomials of degree < 4, then Horner's rule over
/// `a`'s nibbles, highest powers first. Eight dependent steps instead of
/// 32: about half the time of a CRC patch.
fn mul(a: u32, b: u32) -> u32 {
    // Bit 3 of a nibble index is its x^0 (the reflected order): index 8 is
    // `b`, 4 is `b * x`, 2 is `b * x^2`, 1 is `b * x^3`.
    let mut by_bit = [0u32; 4];
    let mut v = b;
    for slot in by_bit.iter_mut().rev() {
        *slot = v;
        v = times_x(v);
    }
    let mut table = [0u32; 16];
    for i in 1..16 {
        table[i] = table[i & (i - 1)] ^ by_bit[i.trailing_zeros() as usize];
    }
    let mut p = 0;
    for shift in (0..32).step_by(4) {
        p = (p >> 4) ^ TIMES_X4[(p & 0xF) as usize] ^ table[((a >> shift) & 0xF) as usize];
    }
    p
}

/// `v * x mod P`.
const fn times_x(v: u32) -> u32 {
    (v >> 1) ^ (POLY & 0u32.wrapping_sub(v & 1))
}

/// `TIMES_X4[v]`: the reduction of `v * x^4` for the four bits `v` that
/// the shift moves past `x^31`.
const TIMES_X4: [u32; 16] = {
    let mut table = [0; 16];
    let mut i = 0;
    while i < 16 {
        table[i] = times_x(times_x(times_x(times_x(i as u32))));
        i += 1;
    }
    table
};

/// `X8N[g][v] = x^(8 * v * 16^g) mod P`: one multiplication per non-zero
/// hex digit of the byte count (at most 8 for a batch under 2 GiB), so the
/// cost barely moves between a 1 KiB and a 1 MiB batch.
const X8N: [[u32; 16]; 16] = {
    let mut table = [[0; 16]; 16];
    // x^8, then squared four times per digit position.
    let mut base = ONE >> 8;
    let mut g = 0;
    while g < 16 {
        table[g][0] = ONE;
        let mut v = 1;
        while v < 16 {
            table[g][v] = multmodp(table[g][v - 1], base);
            v += 1;
        }
        let mut k = 0;
        while k < 4 {
            base = multmodp(base, base);
            k += 1;
        }
        g += 1;
    }
    table
};

/// `reg * x^(8n) mod P`: the raw register `reg` after `n` zero bytes.
/// Multiplies by each digit's operator in turn rather than building
/// `x^(8n)` first: one multiplication fewer.
fn append_zeros(mut reg: u32, mut n: u64) -> u32 {
    let mut g = 0;
    while n != 0 {
        let digit = (n & 0xF) as usize;
        if digit != 0 {
            reg = mul(X8N[g][digit], reg);
        }
        n >>= 4;
        g += 1;
    }
    reg
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Reference: feed zero bytes one at a time into a raw register.
    fn append_zeros_slow(mut reg: u32, n: usize) -> u32 {
        for _ in 0..n * 8 {
            reg = if reg & 1 != 0 {
                (reg >> 1) ^ POLY
            } else {
                reg >> 1
            };
        }
        reg
    }

    fn patched(data: &[u8], pos: usize, new: [u8; 8]) -> (u32, [u8; 8], Vec<u8>) {
        let mut old = [0; 8];
        old.copy_from_slice(&data[pos..pos + 8]);
        let mut out = data.to_vec();
        out[pos..pos + 8].copy_from_slice(&new);
        let after = (data.len() - pos - 8) as u64;
        (patch(checksum(data), old, new, after), old, out)
    }

    #[test]
    fn check_value() {
        assert_eq!(checksum(b"123456789"), 0xE306_9283);
        assert_eq!(checksum(b""), 0);
    }

    #[test]
    fn zero_byte_operator_matches_bitwise() {
        for n in [0usize, 1, 2, 3, 7, 8, 61, 255, 1000, 4097, 15_309, 65_536] {
            assert_eq!(
                append_zeros(0xDEAD_BEEF, n as u64),
                append_zeros_slow(0xDEAD_BEEF, n)
            );
        }
    }

    #[test]
    fn one_is_the_identity_of_both_multiplications() {
        for v in [0, 1, ONE, 0xDEAD_BEEF, u32::MAX] {
            assert_eq!(mul(ONE, v), v);
            assert_eq!(mul(v, ONE), v);
            assert_eq!(multmodp(ONE, v), v);
        }
        // x^31 * x = x^32 = P's low terms: the reflected polynomial itself.
        assert_eq!(mul(1, ONE >> 1), POLY);
    }

    #[test]
    fn patch_exact_vector() {
        // "123456789" with "2345" -> "abcd": crc("1abcd6789") = 0xE0F8F5D1.
        let crc = patch(0xE306_9283, *b"2345", *b"abcd", 4);
        assert_eq!(crc, checksum(b"1abcd6789"));
        assert_eq!(crc, 0xE0F8_F5D1);
    }

    #[test]
    fn identical_bytes_are_a_no_op() {
        assert_eq!(patch(0x1234_5678, [7; 8], [7; 8], u64::MAX), 0x1234_5678);
    }

    #[test]
    fn corruption_is_preserved_not_laundered() {
        let data: Vec<u8> = (0..200u8).collect();
        let new = *b"\xff\xfe\xfd\xfc\xfb\xfa\xf9\xf8";
        let mut old = [0; 8];
        old.copy_from_slice(&data[43..51]);
        let good = checksum(&data);
        let bad = good ^ 0x0000_0100;
        let mut out = data.clone();
        out[43..51].copy_from_slice(&new);
        let fixed = patch(good, old, new, 200 - 51);
        assert_eq!(fixed, checksum(&out));
        assert_eq!(patch(bad, old, new, 200 - 51), fixed ^ 0x0000_0100);
    }

    #[test]
    fn large_message() {
        let mut data = vec![0u8; 3 << 20];
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8;
        }
        for pos in [0, 1, 4096, (3 << 20) - 8] {
            let (crc, _, out) = patched(&data, pos, *b"mirrored");
            assert_eq!(crc, checksum(&out), "pos {pos}");
        }
    }

    #[test]
    fn huge_bytes_after_is_fast_and_consistent() {
        // Appending 2^k zero bytes twice equals appending 2^(k+1) once.
        let reg = 0xDEAD_BEEF;
        for k in [20u32, 40, 62] {
            let n = 1u64 << k;
            assert_eq!(
                append_zeros(append_zeros(reg, n), n),
                append_zeros(reg, 2 * n)
            );
        }
        assert_eq!(
            append_zeros(append_zeros(reg, u64::MAX), 1),
            append_zeros(append_zeros(reg, 1 << 63), 1 << 63)
        );
    }

    fn data_and_pos() -> impl Strategy<Value = (Vec<u8>, usize)> {
        prop_oneof![
            8 => proptest::collection::vec(any::<u8>(), 8..4096),
            1 => proptest::collection::vec(any::<u8>(), 100_000..300_000),
        ]
        .prop_flat_map(|d| {
            let max = d.len() - 8;
            (Just(d), 0..=max)
        })
    }

    proptest! {
        #[test]
        fn nibble_multiplication_matches_bitwise(a in any::<u32>(), b in any::<u32>()) {
            prop_assert_eq!(mul(a, b), multmodp(a, b));
        }

        #[test]
        fn patch_matches_recompute(
            (data, pos) in data_and_pos(),
            new in any::<[u8; 8]>(),
            err in any::<u32>(),
        ) {
            let (crc, old, out) = patched(&data, pos, new);
            prop_assert_eq!(crc, checksum(&out));
            let after = (data.len() - pos - 8) as u64;
            prop_assert_eq!(patch(checksum(&data) ^ err, old, new, after), checksum(&out) ^ err);
        }
    }
}
