//! `offsets`: source offsets translated to destination offsets, as the
//! replicator's offsets topic on the destination holds them; one offset,
//! or a source consumer group's committed offsets.

use crate::client::{Client, ClientConfig};
use crate::mirror::translation::Translation;
use crate::replicate::translation::{translate, translate_group, TranslationError};

use super::EXIT_FAILED;

/// What `offsets` reads, and where.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct OffsetsArgs {
    /// Destination brokers (or the proxy), host:port,...
    pub(crate) bootstrap_server: String,
    pub(crate) link: String,
    pub(crate) offsets_topic: String,
    /// The replicator's GROUP_ID: its progress says how far the copy went.
    pub(crate) progress_group: String,
    /// ((topic, partition), offset)
    pub(crate) one: Option<((String, i32), i64)>,
    /// (group, source bootstrap)
    pub(crate) group: Option<(String, String)>,
}

/// Why `offsets` failed. Each message quotes its cause, which is also its
/// `source()`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OffsetsError {
    #[error(
        "give either --topic, --partition and --offset, or --group and --source-bootstrap-server"
    )]
    Arguments,
    #[error("starting the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("reading {topic}: {source}")]
    Read {
        topic: String,
        /// Boxed: the client's errors are large.
        #[source]
        source: Box<TranslationError>,
    },
}

impl OffsetsError {
    /// The process exit code for this error.
    pub(crate) fn exit_code(&self) -> u8 {
        EXIT_FAILED
    }
}

/// `offsets`: one line per partition, `topic partition source-offset
/// destination-offset` (and why, when it is not exact).
pub(crate) fn offsets(args: &OffsetsArgs) -> Result<(), OffsetsError> {
    let destination = Client::new(ClientConfig::plain(&args.bootstrap_server));
    let runtime = super::runtime().map_err(OffsetsError::Runtime)?;
    let wanted: Vec<((String, i32), i64)> = match (&args.one, &args.group) {
        (Some(one), None) => vec![one.clone()],
        (None, Some(_)) => Vec::new(),
        _ => return Err(OffsetsError::Arguments),
    };
    let translated = runtime
        .block_on(async {
            match &args.group {
                Some((group, source)) => {
                    translate_group(
                        &destination,
                        &Client::new(ClientConfig::plain(source)),
                        &args.offsets_topic,
                        &args.link,
                        &args.progress_group,
                        group,
                    )
                    .await
                }
                None => {
                    translate(
                        &destination,
                        &args.offsets_topic,
                        &args.link,
                        &args.progress_group,
                        &wanted,
                    )
                    .await
                }
            }
        })
        .map_err(|source| OffsetsError::Read {
            topic: args.offsets_topic.clone(),
            source: Box::new(source),
        })?;
    for t in translated {
        let (offset, note) = match t.destination {
            Translation::Exact(o) => (o.to_string(), ""),
            Translation::Unknown => ("-".to_string(), " (older than the translation holds)"),
            Translation::NotYet => ("-".to_string(), " (not copied yet)"),
        };
        println!("{} {} {} {offset}{note}", t.topic, t.partition, t.source);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn args() -> OffsetsArgs {
        OffsetsArgs {
            bootstrap_server: "127.0.0.1:1".into(),
            link: "x".into(),
            offsets_topic: "__mirror_offsets".into(),
            progress_group: "replicator.mirror-x".into(),
            one: None,
            group: None,
        }
    }

    /// One offset or a group, not both and not neither: refused before
    /// anything is read.
    #[test]
    fn either_one_offset_or_a_group() {
        let e = offsets(&args()).expect_err("neither");
        assert!(matches!(e, OffsetsError::Arguments), "{e:?}");
        assert_eq!(
            e.to_string(),
            "give either --topic, --partition and --offset, or --group and --source-bootstrap-server"
        );
        assert!(e.source().is_none());
        assert_eq!(e.exit_code(), 2);
        let both = OffsetsArgs {
            one: Some((("t".into(), 0), 1)),
            group: Some(("g".into(), "127.0.0.1:1".into())),
            ..args()
        };
        assert!(matches!(offsets(&both), Err(OffsetsError::Arguments)));
    }

    #[test]
    fn a_read_error_names_the_topic_and_keeps_its_cause() {
        let e = OffsetsError::Read {
            topic: "__mirror_offsets".into(),
            source: Box::new(TranslationError::Build(
                crate::wire::batch::BuildError::Empty,
            )),
        };
        assert_eq!(
            e.to_string(),
            "reading __mirror_offsets: building a batch of the offsets topic"
        );
        let source = e.source().expect("a source");
        assert_eq!(source.to_string(), "building a batch of the offsets topic");
        // The whole chain, each cause once.
        assert_eq!(
            crate::sync::error_chain(&e),
            "reading __mirror_offsets: building a batch of the offsets topic: a record batch \
             needs at least one record"
        );
    }
}
