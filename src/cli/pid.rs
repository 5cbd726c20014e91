//! `map` and `unmap`: producer ids read the way the proxy writes them, for
//! an operator reading a log dump; `unmap --bootstrap-server` also names
//! the origins the state topic records for a salted id.

use std::collections::HashMap;
use std::time::Duration;

use crate::client::{Client, ClientConfig, ClientError};
use crate::config::{process_vars, Config, ConfigError, PREFIX};
use crate::mirror::pid::{
    cluster_hash, map_pid, unmap_pid, ClusterId, ClusterIdError, Mapping, Unplaceable,
};
use crate::net::tls::TlsSetupError;
use crate::net::upstream::Upstream;
use crate::state::mac::StateAuth;

use super::EXIT_FAILED;

/// Why `map` or `unmap` failed. Each message quotes its cause, which is
/// also its `source()`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PidError {
    #[error("--source-cluster-id {id:?}: {source}")]
    ClusterId {
        id: String,
        #[source]
        source: ClusterIdError,
    },
    #[error("producer id {pid} cannot be mapped: {source}")]
    Unplaceable {
        pid: i64,
        #[source]
        source: Unplaceable,
    },
    #[error("reading the link configuration: {0}")]
    Links(#[source] ConfigError),
    #[error("upstream TLS settings: {0}")]
    Tls(#[source] TlsSetupError),
    #[error("starting the tokio runtime: {0}")]
    Runtime(#[source] std::io::Error),
    #[error("reading the state topic {topic}: {source}")]
    State {
        topic: String,
        #[source]
        source: ClientError,
    },
}

impl PidError {
    /// The process exit code for this error.
    pub(crate) fn exit_code(&self) -> u8 {
        EXIT_FAILED
    }
}

/// `map`: the producer id the proxy writes for `pid` of the source
/// cluster `source_cluster_id`.
pub(crate) fn map(source_cluster_id: &str, pid: i64) -> Result<(), PidError> {
    let id: ClusterId = source_cluster_id
        .parse()
        .map_err(|source| PidError::ClusterId {
            id: source_cluster_id.to_string(),
            source,
        })?;
    let region = cluster_hash(&id);
    match map_pid(region, pid) {
        Mapping::Mapped(mapped) => println!("{mapped}"),
        Mapping::Unchanged => println!("{pid}"),
        Mapping::Unplaceable(source) => return Err(PidError::Unplaceable { pid, source }),
    }
    Ok(())
}

/// `unmap`: a mapped producer id's region and identity, and the
/// configured link (`MIRROR_PROXY_LINKS`...) whose region it is.
pub(crate) fn unmap(pid: i64) -> Result<(), PidError> {
    let Some((region, identity)) = unmap_pid(pid) else {
        println!("producer id {pid} is not a mapped id (mapped ids are negative and not -1)");
        return Ok(());
    };
    println!("region   0x{region:08x}");
    println!("identity {identity}");
    let links = Config::links_from_env().map_err(PidError::Links)?;
    match links.by_region(region) {
        Some(link) => println!(
            "link     {} (source cluster {})",
            link.name(),
            link.configured_source_cluster_id()
        ),
        None if links.is_empty() => {
            println!("link     (no links configured in MIRROR_PROXY_LINKS)")
        }
        None => println!(
            "link     none of the configured links ({})",
            links.names().join(", ")
        ),
    }
    Ok(())
}

/// `unmap --bootstrap-server`: the origins of `pid` recorded in the state
/// topic `topic`.
pub(crate) fn unmap_from_state(pid: i64, bootstrap: &str, topic: &str) -> Result<(), PidError> {
    let bootstrap: Vec<String> = bootstrap.split(',').map(|s| s.trim().to_string()).collect();
    // The upstream settings when the MIRROR_PROXY_* variables describe them.
    let config = process_vars(PREFIX).ok().and_then(|mut vars| {
        vars.insert("MIRROR_PROXY_BOOTSTRAP_SERVERS".into(), bootstrap.join(","));
        Config::from_vars(&vars).ok()
    });
    // With the state key, only records signed with it are read, as the
    // proxy reads them.
    let auth = config.as_ref().and_then(|c| {
        c.state_key
            .as_ref()
            .map(|k| StateAuth::new(k.expose(), topic, c.state_key_unsigned_before))
    });
    let client_config = match config {
        Some(c) => ClientConfig::from_config(&c).map_err(PidError::Tls)?,
        None => ClientConfig::new(
            bootstrap,
            Upstream {
                tls: None,
                server_name: None,
                timeout: Duration::from_secs(10),
            },
        ),
    };
    let client = Client::new(client_config);
    let runtime = super::runtime().map_err(PidError::Runtime)?;
    let (view, names) = runtime
        .block_on(async {
            let view = crate::state::read_view(&client, topic, auth.as_ref()).await?;
            let names: HashMap<_, _> = client
                .metadata(None)
                .await
                .map(|m| m.topics.into_iter().map(|t| (t.topic_id, t.name)).collect())
                .unwrap_or_default();
            Ok((view, names))
        })
        .map_err(|source| PidError::State {
            topic: topic.to_string(),
            source,
        })?;
    let origins = view.origins_of(pid);
    if origins.is_empty() {
        println!("origin   none recorded in {topic}");
    }
    for (p, o, salt) in origins {
        let topic_name = names
            .get(&p.topic_id)
            .cloned()
            .unwrap_or_else(|| p.topic_id.to_string());
        let salt = match salt {
            0 => "natural region".to_string(),
            s => format!("salt {s}"),
        };
        println!(
            "origin   {topic_name}-{}: source cluster {} producer id {} ({salt})",
            p.partition, o.source, o.pid
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;
    use crate::sync::error_chain;

    #[test]
    fn errors_quote_their_cause() {
        let e = map("xx", 5).expect_err("not a cluster id");
        assert_eq!(
            e.to_string(),
            "--source-cluster-id \"xx\": invalid cluster id: expected 22 characters of URL-safe \
             base64 encoding 16 bytes, found 2 characters"
        );
        assert!(matches!(e, PidError::ClusterId { .. }), "{e:?}");
        assert!(e
            .source()
            .is_some_and(|s| e.to_string().ends_with(&s.to_string())));
        assert_eq!(error_chain(&e), e.to_string());
        assert_eq!(e.exit_code(), 2);

        let e = map("MkU3OEVBNTcwNTJENDM2Qg", 1 << 31).expect_err("2^31");
        assert!(
            e.to_string().starts_with(
                "producer id 2147483648 cannot be mapped: producer id 2147483648 is 2^31 or larger"
            ),
            "{e}"
        );
        let source = e.source().expect("a source");
        assert!(source.is::<Unplaceable>(), "{source:?}");
        assert_eq!(error_chain(&e), e.to_string());

        let e = PidError::Runtime(std::io::Error::other("no threads"));
        assert_eq!(e.to_string(), "starting the tokio runtime: no threads");
        assert_eq!(e.source().map(|s| s.to_string()), Some("no threads".into()));
    }
}
