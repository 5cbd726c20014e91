//! SNI routing's names: which host name the proxy advertises for a broker
//! node (`MIRROR_PROXY_SNI_HOST_PATTERN` with `$(nodeId)` replaced) and
//! which node, or the bootstrap, a TLS ClientHello's server name asks for.
//!
//! Pure: no I/O. The mapping is one-to-one (node id in decimal, no sign,
//! no leading zero), so a name routes to a node only if it is exactly the
//! name advertised for that node; anything else routes nowhere and the
//! connection is refused (fail closed).

use rustls_pki_types::DnsName;

/// The placeholder the pattern holds once (Kroxylicious spells it the same).
pub(crate) const NODE_ID_PLACEHOLDER: &str = "$(nodeId)";

/// Where a ClientHello's server name routes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SniRoute {
    /// The bootstrap name: any configured bootstrap broker.
    Bootstrap,
    /// The name advertised for this broker node.
    Node(i32),
}

/// The host names of SNI routing (compared case-insensitively, as DNS does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniNames {
    /// The pattern before and after `$(nodeId)`, lower-cased.
    prefix: String,
    suffix: String,
    /// The bootstrap name, lower-cased.
    bootstrap: String,
}

/// What is wrong with the SNI names: each message says what the variable
/// should hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SniError {
    #[error("a host name holding {}", NODE_ID_PLACEHOLDER)]
    NoPlaceholder,
    #[error("a host name holding {} once", NODE_ID_PLACEHOLDER)]
    PlaceholderTwice,
    #[error(
        "a DNS host name (no port, no IP address) once {} is replaced by a node id",
        NODE_ID_PLACEHOLDER
    )]
    PatternNotDns,
    #[error("a DNS host name (no port, no IP address)")]
    BootstrapNotDns,
    #[error("a name the pattern does not also give a node ({bootstrap} is node {node})")]
    BootstrapIsNode { bootstrap: String, node: i32 },
}

impl SniError {
    /// Whether the bootstrap name is at fault (else the pattern).
    pub(crate) fn is_bootstrap(&self) -> bool {
        matches!(
            self,
            SniError::BootstrapNotDns | SniError::BootstrapIsNode { .. }
        )
    }
}

impl SniNames {
    /// From the pattern and the bootstrap name.
    pub(crate) fn new(pattern: &str, bootstrap: &str) -> Result<SniNames, SniError> {
        let Some((prefix, suffix)) = pattern.split_once(NODE_ID_PLACEHOLDER) else {
            return Err(SniError::NoPlaceholder);
        };
        if suffix.contains(NODE_ID_PLACEHOLDER) {
            return Err(SniError::PlaceholderTwice);
        }
        let names = SniNames {
            prefix: prefix.to_ascii_lowercase(),
            suffix: suffix.to_ascii_lowercase(),
            bootstrap: bootstrap.to_ascii_lowercase(),
        };
        // Every node's name is the one for node 0 with other digits where
        // the 0 is: valid for one, valid for all.
        if !valid_dns_name(&names.node_host(0)) {
            return Err(SniError::PatternNotDns);
        }
        if !valid_dns_name(&names.bootstrap) {
            return Err(SniError::BootstrapNotDns);
        }
        if let Some(node) = names.node_of(&names.bootstrap) {
            return Err(SniError::BootstrapIsNode {
                bootstrap: names.bootstrap,
                node,
            });
        }
        Ok(names)
    }

    /// The host name advertised for broker `node`.
    pub(crate) fn node_host(&self, node: i32) -> String {
        format!("{}{node}{}", self.prefix, self.suffix)
    }

    /// The bootstrap name.
    pub(crate) fn bootstrap_host(&self) -> &str {
        &self.bootstrap
    }

    /// Where a ClientHello's server name routes; `None`: nowhere.
    pub(crate) fn route(&self, name: &str) -> Option<SniRoute> {
        let name = name.to_ascii_lowercase();
        // A DNS name may end in the root's dot.
        let name = name.strip_suffix('.').unwrap_or(&name);
        if name == self.bootstrap {
            return Some(SniRoute::Bootstrap);
        }
        self.node_of(name).map(SniRoute::Node)
    }

    fn node_of(&self, name: &str) -> Option<i32> {
        let digits = name
            .strip_prefix(self.prefix.as_str())?
            .strip_suffix(self.suffix.as_str())?;
        // Exactly the advertised spelling: "07" or "+7" is no node's name.
        let canonical = digits.bytes().all(|b| b.is_ascii_digit())
            && !digits.is_empty()
            && (digits == "0" || !digits.starts_with('0'));
        canonical.then(|| digits.parse::<i32>().ok()).flatten()
    }
}

/// A DNS name a client can put in its ClientHello (not an IP address,
/// which clients send no SNI for).
fn valid_dns_name(name: &str) -> bool {
    !name.is_empty()
        && name.parse::<std::net::IpAddr>().is_err()
        && DnsName::try_from(name).is_ok()
        && name.chars().any(|c| c.is_ascii_alphabetic())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> SniNames {
        SniNames::new(
            "broker-$(nodeId).Kafka.Example.com",
            "bootstrap.kafka.example.com",
        )
        .expect("valid")
    }

    #[test]
    fn node_names_round_trip_for_any_node_id() {
        let n = names();
        for node in [0, 1, 7, 1000, 65536, i32::MAX] {
            let host = n.node_host(node);
            assert_eq!(n.route(&host), Some(SniRoute::Node(node)), "{host}");
        }
        assert_eq!(n.node_host(3), "broker-3.kafka.example.com");
        assert_eq!(
            n.route("BROKER-3.kafka.example.com."),
            Some(SniRoute::Node(3))
        );
        assert_eq!(
            n.route("bootstrap.kafka.example.com"),
            Some(SniRoute::Bootstrap)
        );
    }

    #[test]
    fn other_names_route_nowhere() {
        let n = names();
        for name in [
            "",
            "broker-.kafka.example.com",
            "broker-07.kafka.example.com",
            "broker-+7.kafka.example.com",
            "broker--7.kafka.example.com",
            "broker-2147483648.kafka.example.com",
            "broker-7.kafka.example.org",
            "xbroker-7.kafka.example.com",
            "broker-7x.kafka.example.com",
            "other.kafka.example.com",
        ] {
            assert_eq!(n.route(name), None, "{name}");
        }
    }

    #[test]
    fn bad_patterns_are_refused_with_a_reason() {
        // (pattern, bootstrap, the bootstrap at fault, words of the reason)
        let cases = [
            (
                "broker.example.com",
                "b.example.com",
                false,
                "holding $(nodeId)",
            ),
            ("b-$(nodeId)-$(nodeId).x.com", "b.x.com", false, "once"),
            ("b-$(nodeId).x.com:9092", "b.x.com", false, "no port"),
            ("b $(nodeId).x.com", "b.x.com", false, "DNS host name"),
            ("b-$(nodeId).x.com", "b.x.com:9092", true, "no port"),
            ("b-$(nodeId).x.com", "10.0.0.1", true, "no IP address"),
            ("$(nodeId).x.com", "1.x.com", true, "node 1"),
        ];
        for (pattern, bootstrap, at_bootstrap, expected) in cases {
            let e = SniNames::new(pattern, bootstrap).expect_err(pattern);
            assert_eq!(e.is_bootstrap(), at_bootstrap, "{pattern} {bootstrap}: {e}");
            assert!(
                e.to_string().contains(expected),
                "{pattern} {bootstrap}: {e}"
            );
        }
    }
}
