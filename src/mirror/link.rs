//! Mirror links: which Produce requests belong to which source cluster.
//!
//! A request belongs to a link when its header carries the link's client id
//! and, if the link is bound to a TLS subject, the connection presented a
//! matching client certificate. Everything else is local traffic whose
//! producer IDs are never touched.

// foldhash: the client id and topic lookups run for every request.
use foldhash::{HashMap, HashSet};
use std::sync::{Arc, RwLock};

use regex::Regex;

use crate::mirror::link_state::LinkState;
use crate::mirror::pid::{cluster_hash, ClusterId};

/// The `<NAME>` part of a link's `MIRROR_PROXY_LINK_<NAME>_*` variables.
pub(crate) fn link_env_name(link: &str) -> String {
    link.to_ascii_uppercase().replace('-', "_")
}

/// What a link does with control batches (transaction markers copied from
/// the source log). A stock broker refuses client-written control batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlBatchPolicy {
    /// Acknowledge without writing, and count them.
    Drop,
    /// Send them on (remapped) and let the broker decide.
    Forward,
}

/// One mirror link: one flow of mirrored traffic from one source cluster.
#[derive(Debug)]
pub struct Link {
    name: String,
    source_cluster_id: ClusterId,
    /// `source_cluster_id` as the operator wrote it (see
    /// [`Link::with_source_cluster_spelling`]).
    source_cluster_spelling: String,
    region: u32,
    /// The source cluster whose producers the link maps now: the configured
    /// one until a link state record (`start` with another id) says
    /// otherwise; set by the state store as it applies those records, so
    /// every instance maps with the same id.
    current_source: RwLock<ClusterId>,
    client_id: String,
    /// Patterns that are plain names, looked up without running a regex
    /// (every partition of every Produce asks).
    literal_topics: HashSet<String>,
    /// The other patterns, anchored at both ends.
    topic_patterns: Vec<Regex>,
    tls_subject: Option<String>,
    control_batches: ControlBatchPolicy,
    initial_state: LinkState,
    failback: Option<Failback>,
}

/// Where a failback link finds the cluster it mirrors from and the link
/// there that it fails back (`GET`/`POST /links/<name>/failback`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failback {
    /// The link of the source cluster's proxy that mirrored into this
    /// proxy's cluster and failed over.
    pub reverse_of: String,
    /// The source cluster's brokers.
    pub source_bootstrap_servers: Vec<String>,
}

/// The name a pattern `^(?:name)$` matches when `name` is made only of
/// characters without regex meaning (letters, digits, `_`, `-`; a `.` is
/// a wildcard and keeps its pattern a regex).
fn literal(re: &Regex) -> Option<&str> {
    let inner = re.as_str().strip_prefix("^(?:")?.strip_suffix(")$")?;
    let plain = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    (!inner.is_empty() && inner.chars().all(plain)).then_some(inner)
}

impl Link {
    pub fn new(
        name: String,
        source_cluster_id: ClusterId,
        client_id: String,
        topics: Vec<Regex>,
        tls_subject: Option<String>,
        control_batches: ControlBatchPolicy,
    ) -> Link {
        let (literals, patterns): (Vec<Regex>, Vec<Regex>) =
            topics.into_iter().partition(|re| literal(re).is_some());
        Link {
            name,
            region: cluster_hash(&source_cluster_id),
            source_cluster_spelling: source_cluster_id.to_string(),
            current_source: RwLock::new(source_cluster_id),
            source_cluster_id,
            client_id,
            literal_topics: literals
                .iter()
                .filter_map(|re| literal(re).map(str::to_string))
                .collect(),
            topic_patterns: patterns,
            tls_subject,
            control_batches,
            initial_state: LinkState::Mirroring,
            failback: None,
        }
    }

    /// A failback link's settings (`LINK_<NAME>_REVERSE_OF`,
    /// `LINK_<NAME>_SOURCE_BOOTSTRAP_SERVERS`).
    pub(crate) fn with_failback(mut self, failback: Option<Failback>) -> Link {
        self.failback = failback;
        self
    }

    pub(crate) fn failback(&self) -> Option<&Failback> {
        self.failback.as_ref()
    }

    /// The state the link has while the state topic has no record of it
    /// (`MIRROR_PROXY_LINK_<NAME>_INITIAL_STATE`).
    pub(crate) fn with_initial_state(mut self, state: LinkState) -> Link {
        self.initial_state = state;
        self
    }

    pub(crate) fn initial_state(&self) -> LinkState {
        self.initial_state
    }

    /// Shows the source cluster id as `spelling`, the operator's, when it
    /// spells that id (else it is ignored). Kafka accepts two spellings of
    /// an id whose last base64 character carries unused bits (the demo id
    /// `...Qk`, canonically `...Qg`) and a broker reports the one it was
    /// formatted with, while [`ClusterId`] keeps only the 16 bytes.
    pub(crate) fn with_source_cluster_spelling(mut self, spelling: &str) -> Link {
        if ClusterId::parse(spelling).is_ok_and(|id| id == self.source_cluster_id) {
            self.source_cluster_spelling = spelling.to_string();
        }
        self
    }

    /// The source cluster id as configured
    /// (`MIRROR_PROXY_LINK_<NAME>_SOURCE_CLUSTER_ID`).
    pub(crate) fn configured_source_cluster_id(&self) -> &str {
        &self.source_cluster_spelling
    }

    /// How to show `id`, a source cluster of this link, to an operator: as
    /// configured when it is the configured cluster, else canonically (an
    /// id given to `start` reaches the state topic as 16 bytes only).
    pub(crate) fn show_source_cluster(&self, id: &ClusterId) -> String {
        if *id == self.source_cluster_id {
            self.source_cluster_spelling.clone()
        } else {
            id.to_string()
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }
    /// The configured source cluster (`MIRROR_PROXY_LINK_<NAME>_SOURCE_CLUSTER_ID`).
    pub(crate) fn source_cluster_id(&self) -> &ClusterId {
        &self.source_cluster_id
    }
    /// The source cluster whose producers the link maps now: origins are
    /// keyed by it, so the producers of a new source never share a mapped
    /// PID with the old source's.
    pub(crate) fn current_source(&self) -> ClusterId {
        *crate::sync::read(&self.current_source)
    }
    /// The source cluster of the link's latest applied state record.
    pub(crate) fn set_current_source(&self, source: ClusterId) {
        *crate::sync::write(&self.current_source) = source;
    }
    /// The 32-bit region of the bit-field mapping (the source cluster hash).
    pub(crate) fn region(&self) -> u32 {
        self.region
    }
    pub(crate) fn client_id(&self) -> &str {
        &self.client_id
    }
    pub(crate) fn control_batches(&self) -> ControlBatchPolicy {
        self.control_batches
    }
    pub(crate) fn tls_subject(&self) -> Option<&str> {
        self.tls_subject.as_deref()
    }

    /// Whether `topic` is one of the link's mirrored topics (each pattern is
    /// anchored at both ends).
    pub(crate) fn mirrors_topic(&self, topic: &str) -> bool {
        self.literal_topics.contains(topic)
            || self.topic_patterns.iter().any(|re| re.is_match(topic))
    }

    /// Whether a connection whose client certificate has `subject` may act
    /// as this link.
    pub(crate) fn admits(&self, subject: Option<&CertSubject>) -> bool {
        match (&self.tls_subject, subject) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(want), Some(have)) => have.matches(want),
        }
    }
}

/// The subject of a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertSubject {
    /// RFC 4514-style, attributes in certificate order, e.g. `CN=r,O=acme`
    /// (for logs: values are not escaped there).
    pub full: String,
    pub common_name: Option<String>,
    /// Every attribute in certificate order as (type, value): `CN`, `O`,
    /// … (a type without a short name as its dotted OID).
    pub attributes: Vec<(String, String)>,
}

impl CertSubject {
    /// `CN=name` alone matches the common name alone. Anything else must
    /// name the subject's attributes in order, each type (without regard to
    /// case) and value equal. Both sides are compared parsed, never as
    /// text: a common name `replicator, O=acme` is one value, and never
    /// equals the two attributes `CN=replicator,O=acme`.
    pub(crate) fn matches(&self, configured: &str) -> bool {
        let Some(want) = parse_dn(configured) else {
            return false;
        };
        if let [(ty, value)] = want.as_slice() {
            if ty.eq_ignore_ascii_case("CN") {
                return self.common_name.as_deref() == Some(value.as_str());
            }
        }
        want.len() == self.attributes.len()
            && want
                .iter()
                .zip(&self.attributes)
                .all(|((t1, v1), (t2, v2))| t1.eq_ignore_ascii_case(t2) && v1 == v2)
    }
}

/// A distinguished name as RFC 4514 writes it (`CN=r\, x,O=acme`): its
/// attributes as (type, value), in order; `None` when malformed. `,` and
/// `+` separate attributes; a character after `\` (or two hex digits, one
/// byte) is part of the value; spaces around types and values are not.
pub(crate) fn parse_dn(s: &str) -> Option<Vec<(String, String)>> {
    let mut attributes = Vec::new();
    for part in split_unescaped(s)? {
        let (ty, value) = part.split_once('=')?;
        let ty = ty.trim();
        if ty.is_empty() {
            return None;
        }
        attributes.push((ty.to_string(), unescape(trim_unescaped(value))?));
    }
    Some(attributes)
}

/// `s` split at every `,` or `+` not escaped by `\`.
fn split_unescaped(s: &str) -> Option<Vec<&str>> {
    let (mut parts, mut start, mut escaped) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            ',' | '+' => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if escaped {
        return None;
    }
    parts.push(&s[start..]);
    Some(parts)
}

/// `v` without the spaces around it, except an escaped last one.
fn trim_unescaped(v: &str) -> &str {
    let mut v = v.trim_start();
    while v.ends_with(' ') && !v[..v.len() - 1].ends_with('\\') {
        v = &v[..v.len() - 1];
    }
    v
}

/// A value with its escapes resolved: `\X` is `X`, `\HH` the byte `HH`.
fn unescape(v: &str) -> Option<String> {
    let (mut out, mut bytes) = (Vec::with_capacity(v.len()), v.bytes());
    while let Some(b) = bytes.next() {
        if b != b'\\' {
            out.push(b);
            continue;
        }
        let next = bytes.next()?;
        let hex = |b: u8| (b as char).to_digit(16);
        match hex(next) {
            Some(hi) => {
                let lo = bytes.next().and_then(hex)?;
                out.push((hi * 16 + lo) as u8);
            }
            None => out.push(next),
        }
    }
    String::from_utf8(out).ok()
}

/// Whom a request speaks for.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// Not mirrored traffic.
    Local,
    /// The named link's replicator.
    Link(Arc<Link>),
    /// A connection that uses a link's client id without the certificate the
    /// link requires.
    Spoofed(Arc<Link>),
}

/// All configured links, looked up by client id.
#[derive(Clone, Default)]
pub struct Links {
    by_client_id: HashMap<String, Arc<Link>>,
    ordered: Vec<Arc<Link>>,
}

// Their names: the startup line stays one short line per setting.
impl std::fmt::Debug for Links {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.ordered.iter().map(|l| l.name()))
            .finish()
    }
}

impl Links {
    pub(crate) fn new(links: Vec<Link>) -> Links {
        let ordered: Vec<Arc<Link>> = links.into_iter().map(Arc::new).collect();
        let by_client_id = ordered
            .iter()
            .map(|l| (l.client_id.clone(), Arc::clone(l)))
            .collect();
        Links {
            by_client_id,
            ordered,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }

    pub(crate) fn names(&self) -> Vec<&str> {
        self.ordered.iter().map(|l| l.name()).collect()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<Link>> {
        self.ordered.iter()
    }

    #[cfg(test)]
    pub(crate) fn by_client_id(&self, client_id: &str) -> Option<&Arc<Link>> {
        self.by_client_id.get(client_id)
    }

    /// The link whose region `region` is, if any (for `unmap`).
    pub(crate) fn by_region(&self, region: u32) -> Option<&Arc<Link>> {
        self.ordered.iter().find(|l| l.region == region)
    }

    /// Classify a request by its client id and the connection's certificate.
    pub(crate) fn classify(
        &self,
        client_id: Option<&str>,
        subject: Option<&CertSubject>,
    ) -> Origin {
        match client_id.and_then(|id| self.by_client_id.get(id)) {
            None => Origin::Local,
            Some(link) if link.admits(subject) => Origin::Link(Arc::clone(link)),
            Some(link) => Origin::Spoofed(Arc::clone(link)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(tls_subject: Option<&str>) -> Link {
        Link::new(
            "east".into(),
            "MkU3OEVBNTcwNTJENDM2Qk".parse().expect("cluster id"),
            "mirror-east".into(),
            vec![Regex::new("^(?:orders)$").expect("regex")],
            tls_subject.map(str::to_string),
            ControlBatchPolicy::Drop,
        )
    }

    fn subject(full: &str, cn: &str) -> CertSubject {
        CertSubject {
            full: full.into(),
            common_name: Some(cn.into()),
            attributes: parse_dn(full).expect("a subject"),
        }
    }

    #[test]
    fn source_cluster_is_shown_as_configured() {
        const QG: &str = "MkU3OEVBNTcwNTJENDM2Qg";
        let l = link(None);
        let id = *l.source_cluster_id();
        let other = ClusterId::from_bytes([7; 16]);
        // Without a spelling: the canonical one.
        assert_eq!(l.configured_source_cluster_id(), QG);
        let l = l.with_source_cluster_spelling("MkU3OEVBNTcwNTJENDM2Qk");
        assert_eq!(l.configured_source_cluster_id(), "MkU3OEVBNTcwNTJENDM2Qk");
        assert_eq!(l.show_source_cluster(&id), "MkU3OEVBNTcwNTJENDM2Qk");
        assert_eq!(l.show_source_cluster(&other), other.to_string());
        // A spelling of another id (or none at all) is not taken.
        for wrong in ["AAAAAAAAAAAAAAAAAAAAAA", "short"] {
            let l = link(None).with_source_cluster_spelling(wrong);
            assert_eq!(l.show_source_cluster(&id), QG, "{wrong}");
        }
    }

    #[test]
    fn client_id_selects_the_link() {
        let links = Links::new(vec![link(None)]);
        assert!(
            matches!(links.classify(Some("mirror-east"), None), Origin::Link(l) if l.name() == "east")
        );
        assert!(matches!(links.classify(Some("app"), None), Origin::Local));
        assert!(matches!(links.classify(None, None), Origin::Local));
    }

    #[test]
    fn tls_subject_guards_the_client_id() {
        let links = Links::new(vec![link(Some("CN=replicator"))]);
        let good = subject("CN=replicator, O=acme", "replicator");
        let bad = subject("CN=intruder", "intruder");
        assert!(matches!(
            links.classify(Some("mirror-east"), Some(&good)),
            Origin::Link(_)
        ));
        assert!(matches!(
            links.classify(Some("mirror-east"), Some(&bad)),
            Origin::Spoofed(_)
        ));
        assert!(matches!(
            links.classify(Some("mirror-east"), None),
            Origin::Spoofed(_)
        ));
    }

    #[test]
    fn plain_names_are_looked_up_and_patterns_matched() {
        let re = |p: &str| Regex::new(&format!("^(?:{p})$")).expect("regex");
        let l = Link::new(
            "east".into(),
            "MkU3OEVBNTcwNTJENDM2Qk".parse().expect("cluster id"),
            "mirror-east".into(),
            vec![re("orders"), re("audit\\..*"), re("a.b"), re("x-1_y")],
            None,
            ControlBatchPolicy::Drop,
        );
        assert_eq!(l.literal_topics.len(), 2, "{:?}", l.literal_topics);
        assert_eq!(l.topic_patterns.len(), 2);
        for yes in ["orders", "audit.2024", "a.b", "aXb", "x-1_y"] {
            assert!(l.mirrors_topic(yes), "{yes}");
        }
        for no in ["orders2", "xorders", "audit", "a.bc", "x-1_y "] {
            assert!(!l.mirrors_topic(no), "{no}");
        }
    }

    #[test]
    fn full_subjects_compare_without_spaces() {
        let s = subject("CN=replicator, O=acme", "replicator");
        assert!(s.matches("CN=replicator,O=acme"));
        assert!(!s.matches("CN=replicator,O=other"));
        assert!(!s.matches("CN=other"));
        assert!(
            s.matches("cn = replicator ,  o=acme"),
            "types without case, spaces around"
        );
    }

    /// A common name holding `, O=acme` is one attribute: it must not pass
    /// for the configured two (compared as text, both read
    /// `CN=replicator,O=acme`).
    #[test]
    fn a_comma_inside_a_value_is_not_a_second_attribute() {
        let forged = CertSubject {
            full: "CN=replicator, O=acme".into(),
            common_name: Some("replicator, O=acme".into()),
            attributes: vec![("CN".into(), "replicator, O=acme".into())],
        };
        assert!(!forged.matches("CN=replicator,O=acme"));
        assert!(!forged.matches("CN=replicator"));
        // Written escaped, the one attribute is what the operator meant.
        assert!(forged.matches("CN=replicator\\, O=acme"));
        assert!(forged.matches("CN=replicator\\2C O=acme"));
    }

    #[test]
    fn distinguished_names_parse_as_rfc_4514_writes_them() {
        let pairs = |v: &[(&str, &str)]| {
            v.iter()
                .map(|(t, v)| (t.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            parse_dn("CN=a\\,b, O=x+OU=y"),
            Some(pairs(&[("CN", "a,b"), ("O", "x"), ("OU", "y")]))
        );
        assert_eq!(parse_dn("CN=\\ a\\ "), Some(pairs(&[("CN", " a ")])));
        assert_eq!(parse_dn("CN=\\41"), Some(pairs(&[("CN", "A")])));
        for bad in ["CN", "=x", "CN=a\\", "CN=\\4", "CN=\\FF"] {
            assert_eq!(parse_dn(bad), None, "{bad}");
        }
    }
}
