//! The state key (`MIRROR_PROXY_STATE_KEY`): every record an instance
//! writes to the state topic carries an HMAC-SHA256 in its `kmp-mac`
//! header, and an instance with the key applies only records whose MAC it
//! verifies. Without the key nothing is signed or checked.
//!
//! The MAC covers the state topic's name and the record's key (which
//! starts with the record type) and value, framed so that no two records
//! give the same input (`docs/state-topic.md` has the bytes): a record
//! cannot be moved to another key, turned into a tombstone, or copied from
//! another deployment's state topic that shares the key. It does not stop a
//! client with Write on the topic from appending an old record again (the
//! transition rules of `mirror::control_records` reject most of those
//! while instances follow the topic; the topic's ACLs are the rest).
//!
//! HMAC comes from `ring`, already the crate's TLS and random-number
//! provider; `StateAuth::verify` compares in constant time
//! (`ring::hmac::verify`).

use ring::hmac;

/// The record header carrying the MAC.
pub const MAC_HEADER: &str = "kmp-mac";
/// The MAC's length (HMAC-SHA256).
pub(crate) const MAC_LEN: usize = 32;
/// The first bytes of every MAC input: the scheme and its version.
const DOMAIN: &[u8] = b"kafka-mirror-proxy state record v1\0";

/// Why a record's MAC did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum MacError {
    #[error("no {MAC_HEADER} header, and MIRROR_PROXY_STATE_KEY is set")]
    Missing,
    #[error("its {MAC_HEADER} header does not verify with MIRROR_PROXY_STATE_KEY")]
    Wrong,
}

/// Signs and checks the records of one state topic.
pub struct StateAuth {
    key: hmac::Key,
    topic: String,
    /// Records below this offset are applied unchecked: written before
    /// every instance signed with this key
    /// (`MIRROR_PROXY_STATE_KEY_UNSIGNED_BEFORE`).
    unsigned_before: i64,
}

impl std::fmt::Debug for StateAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateAuth")
            .field("topic", &self.topic)
            .field("unsigned_before", &self.unsigned_before)
            .finish_non_exhaustive()
    }
}

impl StateAuth {
    pub fn new(secret: &[u8], topic: &str, unsigned_before: i64) -> StateAuth {
        StateAuth {
            key: hmac::Key::new(hmac::HMAC_SHA256, secret),
            topic: topic.to_string(),
            unsigned_before,
        }
    }

    fn input(&self, key: &[u8], value: Option<&[u8]>) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            DOMAIN.len() + 2 + self.topic.len() + 4 + key.len() + 5 + value.map_or(0, <[u8]>::len),
        );
        out.extend_from_slice(DOMAIN);
        // A topic name is at most 249 bytes; a record's key and value fit
        // a batch, below 2 GiB.
        out.extend_from_slice(&(self.topic.len() as u16).to_be_bytes());
        out.extend_from_slice(self.topic.as_bytes());
        out.extend_from_slice(&(key.len() as u32).to_be_bytes());
        out.extend_from_slice(key);
        match value {
            None => out.push(0xff),
            Some(v) => {
                out.push(0);
                out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                out.extend_from_slice(v);
            }
        }
        out
    }

    /// The MAC of a record (`None` value: a tombstone).
    pub fn sign(&self, key: &[u8], value: Option<&[u8]>) -> [u8; MAC_LEN] {
        let tag = hmac::sign(&self.key, &self.input(key, value));
        let mut out = [0u8; MAC_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Whether the record at `offset` may be applied: it lies below
    /// `unsigned_before` (written before the key was rolled out, unsigned
    /// or signed with a previous key), or its `kmp-mac` header (`mac`; the
    /// first one if several) verifies.
    pub(crate) fn verify(
        &self,
        offset: i64,
        key: &[u8],
        value: Option<&[u8]>,
        mac: Option<&[u8]>,
    ) -> Result<(), MacError> {
        match mac {
            _ if offset < self.unsigned_before => Ok(()),
            None => Err(MacError::Missing),
            Some(mac) => {
                hmac::verify(&self.key, &self.input(key, value), mac).map_err(|_| MacError::Wrong)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

    /// The MAC of the type-7 record of `docs/state-topic.md` (link `east`,
    /// instance `i-1`, failover 42), as any HMAC-SHA256 computes it: the
    /// input is the domain, the topic, then key and value each with their
    /// length (`openssl dgst -sha256 -mac HMAC` gives the same).
    #[test]
    fn mac_of_a_documented_record() {
        let auth = StateAuth::new(SECRET, "__mirror_state", 0);
        let key = hex("00070004656173740003692d31");
        let value = hex("0000000000000000002a0000018bcfe5680000");
        let input = auth.input(&key, Some(&value));
        let mut expected = b"kafka-mirror-proxy state record v1\0".to_vec();
        expected.extend_from_slice(&hex("000e"));
        expected.extend_from_slice(b"__mirror_state");
        expected.extend_from_slice(&hex("0000000d"));
        expected.extend_from_slice(&key);
        expected.extend_from_slice(&hex("0000000013"));
        expected.extend_from_slice(&value);
        assert_eq!(input, expected);
        assert_eq!(
            to_hex(&auth.sign(&key, Some(&value))),
            "31e7a217b09476b813b554542896d82274755f712ef3b12b6482a71276250004"
        );
    }

    #[test]
    fn only_the_record_signed_verifies() {
        let auth = StateAuth::new(SECRET, "__mirror_state", 0);
        let mac = auth.sign(b"\x00\x05key", Some(b"value"));
        assert_eq!(
            auth.verify(7, b"\x00\x05key", Some(b"value"), Some(&mac)),
            Ok(())
        );
        let wrong = Err(MacError::Wrong);
        assert_eq!(
            auth.verify(7, b"\x00\x05kez", Some(b"value"), Some(&mac)),
            wrong
        );
        assert_eq!(
            auth.verify(7, b"\x00\x05key", Some(b"valud"), Some(&mac)),
            wrong
        );
        assert_eq!(
            auth.verify(7, b"\x00\x05key", None, Some(&mac)),
            wrong,
            "a tombstone"
        );
        // Key and value bytes moved across their boundary.
        assert_eq!(
            auth.verify(7, b"\x00\x05keyv", Some(b"alue"), Some(&mac)),
            wrong
        );
        assert_eq!(
            auth.verify(7, b"\x00\x05key", Some(b"value"), Some(&mac[..31])),
            wrong
        );
        let other_topic = StateAuth::new(SECRET, "__mirror_state_2", 0);
        assert_eq!(
            other_topic.verify(7, b"\x00\x05key", Some(b"value"), Some(&mac)),
            wrong
        );
        let other_key = StateAuth::new(b"another secret of 32 bytes......", "__mirror_state", 0);
        assert_eq!(
            other_key.verify(7, b"\x00\x05key", Some(b"value"), Some(&mac)),
            wrong
        );
        assert_eq!(
            auth.verify(0, b"\x00\x05key", Some(b"value"), None),
            Err(MacError::Missing)
        );
        // Records written before the key was rolled out (unsigned, or
        // signed with the previous key) are applied; from the offset on,
        // none.
        let rollout = StateAuth::new(SECRET, "__mirror_state", 100);
        let old = other_key.sign(b"\x00\x05key", None);
        assert_eq!(rollout.verify(99, b"\x00\x05key", None, None), Ok(()));
        assert_eq!(rollout.verify(99, b"\x00\x05key", None, Some(&old)), Ok(()));
        assert_eq!(
            rollout.verify(100, b"\x00\x05key", None, None),
            Err(MacError::Missing)
        );
        assert_eq!(rollout.verify(100, b"\x00\x05key", None, Some(&old)), wrong);
        assert!(!format!("{rollout:?}").contains("0123"), "never printed");
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }
    fn to_hex(b: &[u8]) -> String {
        b.iter().map(|b| format!("{b:02x}")).collect()
    }
}
