//! Mirror links: which Produce requests belong to which source cluster.
//!
//! A request belongs to a link when its header carries the link's client id
//! and, if the link is bound to a TLS subject, the connection presented a
//! matching client certificate. Everything else is local traffic whose
//! producer IDs are never touched.

// foldhash: the client id and topic lookups run for every request.
use foldhash::{HashMap, HashSet};
use std::sync::Arc;

use regex::Regex;

use crate::mirror::link_state::LinkState;
use crate::mirror::pid::{cluster_hash, ClusterId};

/// The `<NAME>` part of a link's `MIRROR_PROXY_LINK_<NAME>_*` variables.
pub fn link_env_name(link: &str) -> String {
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
    client_id: String,
    /// Patterns that are plain names, looked up without running a regex
    /// (every partition of every Produce asks).
    literal_topics: HashSet<String>,
    /// The other patterns, anchored at both ends.
    topic_patterns: Vec<Regex>,
    tls_subject: Option<String>,
    control_batches: ControlBatchPolicy,
    initial_state: LinkState,
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
        }
    }

    /// The state the link has while the state topic has no record of it
    /// (`MIRROR_PROXY_LINK_<NAME>_INITIAL_STATE`).
    pub fn with_initial_state(mut self, state: LinkState) -> Link {
        self.initial_state = state;
        self
    }

    pub fn initial_state(&self) -> LinkState {
        self.initial_state
    }

    /// Shows the source cluster id as `spelling`, the operator's, when it
    /// spells that id (else it is ignored). Kafka accepts two spellings of
    /// an id whose last base64 character carries unused bits (the demo id
    /// `...Qk`, canonically `...Qg`) and a broker reports the one it was
    /// formatted with, while [`ClusterId`] keeps only the 16 bytes.
    pub fn with_source_cluster_spelling(mut self, spelling: &str) -> Link {
        if ClusterId::parse(spelling).is_ok_and(|id| id == self.source_cluster_id) {
            self.source_cluster_spelling = spelling.to_string();
        }
        self
    }

    /// The source cluster id as configured
    /// (`MIRROR_PROXY_LINK_<NAME>_SOURCE_CLUSTER_ID`).
    pub fn configured_source_cluster_id(&self) -> &str {
        &self.source_cluster_spelling
    }

    /// How to show `id`, a source cluster of this link, to an operator: as
    /// configured when it is the configured cluster, else canonically (an
    /// id given to `start` reaches the state topic as 16 bytes only).
    pub fn show_source_cluster(&self, id: &ClusterId) -> String {
        if *id == self.source_cluster_id {
            self.source_cluster_spelling.clone()
        } else {
            id.to_string()
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn source_cluster_id(&self) -> &ClusterId {
        &self.source_cluster_id
    }
    /// The 32-bit region of the bit-field mapping (the source cluster hash).
    pub fn region(&self) -> u32 {
        self.region
    }
    pub fn client_id(&self) -> &str {
        &self.client_id
    }
    pub fn control_batches(&self) -> ControlBatchPolicy {
        self.control_batches
    }
    pub fn tls_subject(&self) -> Option<&str> {
        self.tls_subject.as_deref()
    }

    /// Whether `topic` is one of the link's mirrored topics (each pattern is
    /// anchored at both ends).
    pub fn mirrors_topic(&self, topic: &str) -> bool {
        self.literal_topics.contains(topic)
            || self.topic_patterns.iter().any(|re| re.is_match(topic))
    }

    /// Whether a connection whose client certificate has `subject` may act
    /// as this link.
    pub fn admits(&self, subject: Option<&CertSubject>) -> bool {
        match (&self.tls_subject, subject) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(want), Some(have)) => have.matches(want),
        }
    }
}

/// The subject of a verified client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertSubject {
    /// RFC 4514-style, attributes in certificate order, e.g. `CN=r,O=acme`.
    pub full: String,
    pub common_name: Option<String>,
}

impl CertSubject {
    /// `CN=name` matches the common name alone; anything else must equal the
    /// full subject (spaces after commas ignored).
    pub fn matches(&self, configured: &str) -> bool {
        let normalize = |s: &str| s.split(',').map(str::trim).collect::<Vec<_>>().join(",");
        let configured = normalize(configured);
        if let Some(cn) = configured.strip_prefix("CN=") {
            if !cn.contains(',') {
                return self.common_name.as_deref() == Some(cn);
            }
        }
        normalize(&self.full) == configured
    }
}

/// Whom a request speaks for.
#[derive(Debug, Clone)]
pub enum Origin {
    /// Not mirrored traffic.
    Local,
    /// The named link's replicator.
    Link(Arc<Link>),
    /// A connection that uses a link's client id without the certificate the
    /// link requires.
    Spoofed(Arc<Link>),
}

/// All configured links, looked up by client id.
#[derive(Debug, Clone, Default)]
pub struct Links {
    by_client_id: HashMap<String, Arc<Link>>,
    ordered: Vec<Arc<Link>>,
}

impl Links {
    pub fn new(links: Vec<Link>) -> Links {
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

    pub fn is_empty(&self) -> bool {
        self.ordered.is_empty()
    }

    pub fn names(&self) -> Vec<&str> {
        self.ordered.iter().map(|l| l.name()).collect()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Link>> {
        self.ordered.iter()
    }

    pub fn by_client_id(&self, client_id: &str) -> Option<&Arc<Link>> {
        self.by_client_id.get(client_id)
    }

    /// The link whose region `region` is, if any (for `unmap`).
    pub fn by_region(&self, region: u32) -> Option<&Arc<Link>> {
        self.ordered.iter().find(|l| l.region == region)
    }

    /// Classify a request by its client id and the connection's certificate.
    pub fn classify(&self, client_id: Option<&str>, subject: Option<&CertSubject>) -> Origin {
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
    }
}
