//! SASL for the proxy's own broker connections: PLAIN (RFC 4616) and SCRAM
//! (RFC 5802, with SHA-256 and SHA-512 as RFC 7677 and Kafka's KIP-84 use
//! them), computed from messages in and messages out.
//!
//! Pure: no I/O. `client::conn` carries these messages in SaslAuthenticate
//! requests after a SaslHandshake has chosen the mechanism. The only outside
//! input besides the messages is the client nonce, which the caller draws
//! from a secure random source (see `random_nonce`) and tests fix.
//!
//! User connections are not touched by any of this: their SaslHandshake and
//! SaslAuthenticate requests pass through the proxy to the broker.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use ring::{digest, hmac, pbkdf2};

/// The mechanisms the proxy's own client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Plain,
    ScramSha256,
    ScramSha512,
}

impl Mechanism {
    /// The name Kafka uses in SaslHandshake and `sasl.enabled.mechanisms`.
    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Plain => "PLAIN",
            Mechanism::ScramSha256 => "SCRAM-SHA-256",
            Mechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl fmt::Display for Mechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Mechanism {
    type Err = ();

    /// Kafka's names, case-insensitively.
    fn from_str(s: &str) -> Result<Self, ()> {
        match s.to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(Mechanism::Plain),
            "SCRAM-SHA-256" => Ok(Mechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(Mechanism::ScramSha512),
            _ => Err(()),
        }
    }
}

/// A mechanism with the credentials to use with it.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub mechanism: Mechanism,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for Credentials {
    // The password stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Why an exchange failed on the client side (the broker's own refusals
/// arrive as SaslAuthenticate error codes, see `client::conn`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SaslError {
    #[error("malformed SCRAM server-first message: {0}")]
    ServerFirst(String),
    #[error("malformed SCRAM server-first message: salt")]
    Salt(#[source] base64::DecodeError),
    #[error("SCRAM server nonce does not extend the client nonce")]
    Nonce,
    #[error(
        "SCRAM iteration count {0} is outside {MIN_ITERATIONS}..={MAX_ITERATIONS} (Kafka's range)"
    )]
    Iterations(u32),
    #[error("SCRAM server reported an error: {0}")]
    Server(String),
    #[error("malformed SCRAM server-final message: {0}")]
    ServerFinal(String),
    #[error("malformed SCRAM server-final message: signature")]
    Signature(#[source] base64::DecodeError),
    #[error("SCRAM server signature does not verify: the broker does not know this password")]
    ServerSignature,
    #[error("no secure random numbers for the nonce")]
    NoRandom,
    #[error("not a SCRAM mechanism")]
    NotScram,
}

/// Kafka's bounds on SCRAM iterations (`ScramMechanism`): fewer is refused by
/// its own client; more cannot be configured, and a bound keeps a hostile
/// broker from making the proxy spin.
pub(crate) const MIN_ITERATIONS: u32 = 4096;
pub(crate) const MAX_ITERATIONS: u32 = 16384;

/// The one PLAIN message: empty authorization id, user name, password.
pub(crate) fn plain_message(username: &str, password: &str) -> Vec<u8> {
    let mut m = Vec::with_capacity(2 + username.len() + password.len());
    m.push(0);
    m.extend_from_slice(username.as_bytes());
    m.push(0);
    m.extend_from_slice(password.as_bytes());
    m
}

/// A client nonce: 24 random bytes, base64 (no `,`, printable).
pub(crate) fn random_nonce() -> Result<String, ring::error::Unspecified> {
    use ring::rand::SecureRandom as _;
    let mut bytes = [0u8; 24];
    ring::rand::SystemRandom::new().fill(&mut bytes)?;
    Ok(BASE64.encode(bytes))
}

/// The hash functions of one SCRAM variant.
#[derive(Clone, Copy)]
struct Hashes {
    digest: &'static digest::Algorithm,
    hmac: hmac::Algorithm,
    pbkdf2: pbkdf2::Algorithm,
}

const SHA256: Hashes = Hashes {
    digest: &digest::SHA256,
    hmac: hmac::HMAC_SHA256,
    pbkdf2: pbkdf2::PBKDF2_HMAC_SHA256,
};
const SHA512: Hashes = Hashes {
    digest: &digest::SHA512,
    hmac: hmac::HMAC_SHA512,
    pbkdf2: pbkdf2::PBKDF2_HMAC_SHA512,
};

/// The client side of one SCRAM exchange:
/// [`Scram::client_first`] → server-first → [`Scram::client_final`] →
/// server-final → [`Scram::verify_server_final`].
pub(crate) struct Scram {
    hashes: Hashes,
    password: String,
    client_first_bare: String,
    client_nonce: String,
    /// Set by `client_final`: the signature the server must send back.
    expected_server_signature: Option<Vec<u8>>,
}

impl Scram {
    /// `mechanism` must be a SCRAM one; PLAIN yields `None`.
    pub(crate) fn new(
        mechanism: Mechanism,
        username: &str,
        password: &str,
        nonce: &str,
    ) -> Option<Scram> {
        let hashes = match mechanism {
            Mechanism::Plain => return None,
            Mechanism::ScramSha256 => SHA256,
            Mechanism::ScramSha512 => SHA512,
        };
        Some(Scram::with_hashes(hashes, username, password, nonce))
    }

    fn with_hashes(hashes: Hashes, username: &str, password: &str, nonce: &str) -> Scram {
        Scram {
            hashes,
            password: password.to_string(),
            client_first_bare: format!("n={},r={nonce}", escape_username(username)),
            client_nonce: nonce.to_string(),
            expected_server_signature: None,
        }
    }

    /// `n,,n=<user>,r=<nonce>`: no channel binding, no authorization id.
    pub(crate) fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare)
    }

    /// Answer the server-first message with the client proof.
    pub(crate) fn client_final(&mut self, server_first: &[u8]) -> Result<String, SaslError> {
        let server_first = std::str::from_utf8(server_first)
            .map_err(|_| SaslError::ServerFirst("not UTF-8".into()))?;
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                Some(("m", _)) => {
                    return Err(SaslError::ServerFirst(
                        "mandatory extension not supported".into(),
                    ))
                }
                // Extensions (Kafka's `tokenauth`) are optional to understand.
                Some((k, _)) if k.len() == 1 => {}
                _ => return Err(SaslError::ServerFirst(format!("attribute {attr:?}"))),
            }
        }
        let missing = |what: &str| SaslError::ServerFirst(format!("no {what}"));
        let nonce = nonce.ok_or_else(|| missing("nonce (r=)"))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(SaslError::Nonce);
        }
        let salt = BASE64
            .decode(salt.ok_or_else(|| missing("salt (s=)"))?)
            .map_err(SaslError::Salt)?;
        let iterations: u32 = iterations
            .ok_or_else(|| missing("iteration count (i=)"))?
            .parse()
            .map_err(|_| SaslError::ServerFirst("iteration count is not a number".into()))?;
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(SaslError::Iterations(iterations));
        }
        let len = self.hashes.digest.output_len();
        let mut salted = vec![0u8; len];
        let rounds = std::num::NonZeroU32::new(iterations).ok_or(SaslError::Iterations(0))?;
        pbkdf2::derive(
            self.hashes.pbkdf2,
            rounds,
            &salt,
            self.password.as_bytes(),
            &mut salted,
        );
        let salted = hmac::Key::new(self.hashes.hmac, &salted);
        let client_key = hmac::sign(&salted, b"Client Key");
        let stored_key = digest::digest(self.hashes.digest, client_key.as_ref());
        // c=biws is base64("n,,"), the GS2 header of client_first.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac::sign(
            &hmac::Key::new(self.hashes.hmac, stored_key.as_ref()),
            auth_message.as_bytes(),
        );
        let proof: Vec<u8> = client_key
            .as_ref()
            .iter()
            .zip(signature.as_ref())
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = hmac::sign(&salted, b"Server Key");
        let server_signature = hmac::sign(
            &hmac::Key::new(self.hashes.hmac, server_key.as_ref()),
            auth_message.as_bytes(),
        );
        self.expected_server_signature = Some(server_signature.as_ref().to_vec());
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)))
    }

    /// Check that the server knows the password too (mutual authentication).
    pub(crate) fn verify_server_final(&self, server_final: &[u8]) -> Result<(), SaslError> {
        let text = std::str::from_utf8(server_final)
            .map_err(|_| SaslError::ServerFinal("not UTF-8".into()))?;
        let first = text.split(',').next().unwrap_or_default();
        if let Some(e) = first.strip_prefix("e=") {
            return Err(SaslError::Server(e.to_string()));
        }
        let v = first
            .strip_prefix("v=")
            .ok_or_else(|| SaslError::ServerFinal(format!("{text:?} has no v=")))?;
        let got = BASE64.decode(v).map_err(SaslError::Signature)?;
        let expected = self
            .expected_server_signature
            .as_deref()
            .ok_or_else(|| SaslError::ServerFinal("arrived before client-final".into()))?;
        use subtle::ConstantTimeEq as _;
        if bool::from(got.as_slice().ct_eq(expected)) {
            Ok(())
        } else {
            Err(SaslError::ServerSignature)
        }
    }
}

/// RFC 5802 `saslname`: `=` and `,` escaped.
fn escape_username(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3, SCRAM-SHA-256.
    #[test]
    fn rfc7677_sha256_vector() {
        let mut s = Scram::new(
            Mechanism::ScramSha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        )
        .expect("scram");
        assert_eq!(s.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let final_ = s
            .client_final(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            )
            .expect("client final");
        assert_eq!(
            final_,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        s.verify_server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .expect("server signature");
        assert_eq!(
            s.verify_server_final(b"v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(SaslError::ServerSignature)
        );
    }

    /// RFC 5802 §5 (SCRAM-SHA-1): the same message format with another
    /// hash; Kafka does not offer SHA-1, so only the test reaches it.
    #[test]
    fn rfc5802_sha1_vector() {
        let sha1 = Hashes {
            digest: &digest::SHA1_FOR_LEGACY_USE_ONLY,
            hmac: hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY,
            pbkdf2: pbkdf2::PBKDF2_HMAC_SHA1,
        };
        let mut s = Scram::with_hashes(sha1, "user", "pencil", "fyko+d2lbbFgONRv9qkxdawL");
        assert_eq!(s.client_first(), "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL");
        let final_ = s
            .client_final(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096")
            .expect("client final");
        assert_eq!(
            final_,
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
        );
        s.verify_server_final(b"v=rmF9pqV8S7suAoZWja4dJRkFsKQ=")
            .expect("server signature");
    }

    /// SCRAM-SHA-512 with RFC 7677's inputs; expected values computed with
    /// Python's hashlib/hmac (which reproduce both RFC vectors above).
    #[test]
    fn sha512_vector() {
        let mut s = Scram::new(
            Mechanism::ScramSha512,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO",
        )
        .expect("scram");
        let final_ = s
            .client_final(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            )
            .expect("client final");
        assert_eq!(
            final_,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=gMGXRcevScNtxZ6/8lQYpGtnsNAc3mGcmNomv+xnoOMw+3R2xNJdMNnzMlTN8PPC6wdp6dybEmDYXYTxwnYPJQ=="
        );
        s.verify_server_final(
            b"v=ZQnYEgWQMFmmsM8aQMF0nDDCy/AgCzkwk8CmMZYcMg0vSVlKDanekLtifDSeVGT4+5ZxXnJq199RVG2rR7N7Zw==",
        )
        .expect("server signature");
    }

    #[test]
    fn plain_message_layout() {
        assert_eq!(
            plain_message("alice", "s3cr=t"),
            b"\0alice\0s3cr=t".to_vec()
        );
    }

    #[test]
    fn usernames_are_escaped() {
        let s = Scram::new(Mechanism::ScramSha256, "a=b,c", "p", "N").expect("scram");
        assert_eq!(s.client_first(), "n,,n=a=3Db=2Cc,r=N");
    }

    #[test]
    fn hostile_or_broken_server_messages_are_refused() {
        let mut s = Scram::new(Mechanism::ScramSha256, "u", "p", "abc").expect("scram");
        let cases: [(&[u8], SaslError); 6] = [
            (b"r=xyz123,s=AAAA,i=4096", SaslError::Nonce),
            (b"r=abc,s=AAAA,i=4096", SaslError::Nonce),
            (
                b"r=abcdef,s=AAAA,i=1000000000",
                SaslError::Iterations(1_000_000_000),
            ),
            (b"r=abcdef,s=AAAA,i=1", SaslError::Iterations(1)),
            (
                b"r=abcdef,s=AAAA",
                SaslError::ServerFirst("no iteration count (i=)".into()),
            ),
            (
                b"m=x,r=abcdef,s=AAAA,i=4096",
                SaslError::ServerFirst("mandatory extension not supported".into()),
            ),
        ];
        for (input, expected) in cases {
            assert_eq!(
                s.client_final(input),
                Err(expected),
                "{}",
                String::from_utf8_lossy(input)
            );
        }
        assert_eq!(
            s.verify_server_final(b"e=invalid-proof"),
            Err(SaslError::Server("invalid-proof".into()))
        );
    }

    #[test]
    fn a_salt_that_is_not_base64_carries_the_decoding_error() {
        use std::error::Error as _;
        let mut s = Scram::new(Mechanism::ScramSha256, "u", "p", "abc").expect("scram");
        let e = s
            .client_final(b"r=abcdef,s=!!!!,i=4096")
            .expect_err("bad salt");
        assert!(matches!(e, SaslError::Salt(_)), "{e:?}");
        assert_eq!(e.to_string(), "malformed SCRAM server-first message: salt");
        let cause = e.source().expect("the base64 error");
        assert!(cause.downcast_ref::<base64::DecodeError>().is_some());
        assert_eq!(
            crate::sync::error_chain(&e),
            format!("malformed SCRAM server-first message: salt: {cause}")
        );
    }

    #[test]
    fn mechanism_names() {
        for m in [
            Mechanism::Plain,
            Mechanism::ScramSha256,
            Mechanism::ScramSha512,
        ] {
            assert_eq!(m.name().parse::<Mechanism>(), Ok(m));
        }
        assert_eq!(
            "scram-sha-512".parse::<Mechanism>(),
            Ok(Mechanism::ScramSha512)
        );
        assert!("GSSAPI".parse::<Mechanism>().is_err());
        assert!(Scram::new(Mechanism::Plain, "u", "p", "n").is_none());
        let nonce = random_nonce().expect("random");
        assert_eq!(nonce.len(), 32);
        assert!(!nonce.contains(','));
    }

    #[test]
    fn debug_hides_the_password() {
        let c = Credentials {
            mechanism: Mechanism::Plain,
            username: "alice".into(),
            password: "hunter2".into(),
        };
        let text = format!("{c:?}");
        assert!(
            text.contains("alice") && !text.contains("hunter2"),
            "{text}"
        );
    }
}
