//! Kafka's own message schemas, as the proxy walks them.
//!
//! Apache Kafka generates every message class from JSON definitions that ship
//! in `kafka-clients` (`common/message/*.json`). The few messages the proxy
//! reads or rewrites are copied, unchanged, from `kafka-clients-4.4.0.jar`
//! into `src/wire/schemas/` and compiled into the binary; a test compares
//! them with the jar. Interpreting the definitions (instead of hand-written
//! or generated structs) means every version the broker speaks is walked the
//! same way, the newest included, and nothing in the proxy allocates from a
//! count read off the wire (see `wire::walk`).
//!
//! Pure: parsing happens once, on first use, from strings inside the binary.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use serde_json::Value as Json;

/// An inclusive version range; `min > max` means "no version".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Versions {
    pub min: i16,
    pub max: i16,
}

impl Versions {
    pub(crate) const NONE: Versions = Versions { min: 1, max: 0 };

    pub(crate) fn contains(self, v: i16) -> bool {
        self.min <= v && v <= self.max
    }

    /// Kafka's notation: `none`, `3`, `3+`, `3-13`.
    fn parse(s: &str) -> Result<Versions, SchemaProblem> {
        let s = s.trim();
        let num = |t: &str| {
            t.trim()
                .parse::<i16>()
                .map_err(|_| SchemaProblem::Versions(s.to_string()))
        };
        if s == "none" {
            Ok(Versions::NONE)
        } else if let Some(min) = s.strip_suffix('+') {
            Ok(Versions {
                min: num(min)?,
                max: i16::MAX,
            })
        } else if let Some((a, b)) = s.split_once('-') {
            Ok(Versions {
                min: num(a)?,
                max: num(b)?,
            })
        } else {
            let v = num(s)?;
            Ok(Versions { min: v, max: v })
        }
    }
}

/// A field's type.
#[derive(Debug, Clone, PartialEq)]
pub enum Type {
    Bool,
    Int8,
    Int16,
    Uint16,
    Int32,
    Uint32,
    Int64,
    Float64,
    Uuid,
    String,
    Bytes,
    /// A record batch set: bytes on the wire, never decoded by the walker.
    Records,
    Array(Box<Type>),
    Struct(Vec<Field>),
}

/// One field of a message or struct.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Field names from the message root, joined with `.`, e.g.
    /// `TopicData.PartitionData.Records`.
    pub path: String,
    /// Where the last path component starts in `path`.
    name_at: usize,
    pub ty: Type,
    pub versions: Versions,
    pub nullable: Versions,
    /// `(tag, versions in which the field is tagged)`.
    pub tag: Option<(u32, Versions)>,
}

impl Field {
    /// A field with no definition behind it (for errors in framing that
    /// belongs to no field, e.g. a tagged-field header).
    pub(crate) fn synthetic(path: &str) -> Field {
        Field {
            path: path.to_string(),
            name_at: 0,
            ty: Type::Bool,
            versions: Versions::NONE,
            nullable: Versions::NONE,
            tag: None,
        }
    }

    /// The last path component.
    pub(crate) fn name(&self) -> &str {
        &self.path[self.name_at..]
    }

    /// The path of the struct holding the field (`""` at the top level).
    pub(crate) fn parent(&self) -> &str {
        &self.path[..self.name_at.saturating_sub(1)]
    }

    /// Present in the regular (untagged) sequence at `version`.
    pub(crate) fn regular_at(&self, version: i16) -> bool {
        self.versions.contains(version) && !self.tagged_at(version)
    }

    pub(crate) fn tagged_at(&self, version: i16) -> bool {
        matches!(self.tag, Some((_, tv)) if tv.contains(version))
    }
}

/// A request or response message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub name: String,
    pub api_key: i16,
    pub valid: Versions,
    pub flexible: Versions,
    pub fields: Vec<Field>,
}

/// Why a schema did not load. Only a broken build can cause one: the
/// definitions are compiled in, and a test loads all of them.
#[derive(Debug, Clone, thiserror::Error)]
#[error("message schema {file}")]
pub struct SchemaError {
    pub file: String,
    #[source]
    pub problem: SchemaProblem,
}

/// What is wrong with a schema file. Field problems name the field's path
/// (`topics.partitions.index`).
#[derive(Debug, Clone, thiserror::Error)]
pub enum SchemaProblem {
    #[error("not compiled into the proxy")]
    NotCompiledIn,
    /// Shared, so that the error stays `Clone`: the loaded schemas (or
    /// why they did not load) are kept once for every caller.
    #[error(transparent)]
    Json(Arc<serde_json::Error>),
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("common struct without a name")]
    UnnamedStruct,
    #[error("field without a name")]
    UnnamedField,
    #[error("bad version range {0:?}")]
    Versions(String),
    #[error("{0}: no type")]
    NoType(String),
    #[error("{0}: no versions")]
    NoVersions(String),
    #[error("{0}: tag without taggedVersions")]
    TagWithoutVersions(String),
    #[error("{0}: tag too large")]
    TagTooLarge(String),
    #[error("{path}: unknown struct type {name}")]
    UnknownStruct { path: String, name: String },
    #[error("{path}: unknown type {name}")]
    UnknownType { path: String, name: String },
}

/// The definitions compiled into the binary: (file name, text).
const SOURCES: &[(&str, &str)] = &[
    (
        "ProduceRequest.json",
        include_str!("schemas/ProduceRequest.json"),
    ),
    (
        "ProduceResponse.json",
        include_str!("schemas/ProduceResponse.json"),
    ),
    (
        "FetchResponse.json",
        include_str!("schemas/FetchResponse.json"),
    ),
    (
        "MetadataResponse.json",
        include_str!("schemas/MetadataResponse.json"),
    ),
    (
        "FindCoordinatorResponse.json",
        include_str!("schemas/FindCoordinatorResponse.json"),
    ),
    (
        "DescribeClusterResponse.json",
        include_str!("schemas/DescribeClusterResponse.json"),
    ),
    (
        "ApiVersionsResponse.json",
        include_str!("schemas/ApiVersionsResponse.json"),
    ),
    (
        "ShareFetchResponse.json",
        include_str!("schemas/ShareFetchResponse.json"),
    ),
    (
        "ShareAcknowledgeResponse.json",
        include_str!("schemas/ShareAcknowledgeResponse.json"),
    ),
    (
        "DescribeQuorumResponse.json",
        include_str!("schemas/DescribeQuorumResponse.json"),
    ),
    // Read by the proxy's own client (`client`), besides ApiVersions,
    // Metadata, Produce and Fetch above.
    (
        "CreateTopicsResponse.json",
        include_str!("schemas/CreateTopicsResponse.json"),
    ),
    (
        "DescribeConfigsResponse.json",
        include_str!("schemas/DescribeConfigsResponse.json"),
    ),
    (
        "ListOffsetsResponse.json",
        include_str!("schemas/ListOffsetsResponse.json"),
    ),
    (
        "SaslHandshakeResponse.json",
        include_str!("schemas/SaslHandshakeResponse.json"),
    ),
    (
        "SaslAuthenticateResponse.json",
        include_str!("schemas/SaslAuthenticateResponse.json"),
    ),
    // The instances' group membership (`control::members`), besides
    // FindCoordinator above.
    (
        "JoinGroupResponse.json",
        include_str!("schemas/JoinGroupResponse.json"),
    ),
    (
        "SyncGroupResponse.json",
        include_str!("schemas/SyncGroupResponse.json"),
    ),
    (
        "HeartbeatResponse.json",
        include_str!("schemas/HeartbeatResponse.json"),
    ),
    (
        "LeaveGroupResponse.json",
        include_str!("schemas/LeaveGroupResponse.json"),
    ),
    (
        "DescribeGroupsResponse.json",
        include_str!("schemas/DescribeGroupsResponse.json"),
    ),
    // The source's consumer groups whose offsets follow onto the
    // destination (`replicate::groups`).
    (
        "ListGroupsResponse.json",
        include_str!("schemas/ListGroupsResponse.json"),
    ),
    // Committed offsets of a consumer group (`client::offsets`: the
    // replicator keeps its progress in the destination cluster).
    (
        "OffsetCommitResponse.json",
        include_str!("schemas/OffsetCommitResponse.json"),
    ),
    (
        "OffsetFetchResponse.json",
        include_str!("schemas/OffsetFetchResponse.json"),
    ),
    // The replicator's destination topics follow the source's
    // (`replicate::topics`): partitions added, configs changed.
    (
        "CreatePartitionsResponse.json",
        include_str!("schemas/CreatePartitionsResponse.json"),
    ),
    (
        "IncrementalAlterConfigsResponse.json",
        include_str!("schemas/IncrementalAlterConfigsResponse.json"),
    ),
    // Client requests that can delete, grow or reconfigure the state topic
    // (`filter::guard`), read only to see whether they name it.
    (
        "DeleteRecordsRequest.json",
        include_str!("schemas/DeleteRecordsRequest.json"),
    ),
    (
        "DeleteTopicsRequest.json",
        include_str!("schemas/DeleteTopicsRequest.json"),
    ),
    (
        "CreatePartitionsRequest.json",
        include_str!("schemas/CreatePartitionsRequest.json"),
    ),
    (
        "AlterConfigsRequest.json",
        include_str!("schemas/AlterConfigsRequest.json"),
    ),
    (
        "IncrementalAlterConfigsRequest.json",
        include_str!("schemas/IncrementalAlterConfigsRequest.json"),
    ),
];

/// The file names compiled in (for the test that compares them with the jar).
pub fn source_files() -> impl Iterator<Item = (&'static str, &'static str)> {
    SOURCES.iter().copied()
}

/// Every compiled-in message, by name (e.g. `MetadataResponse`).
pub fn message(name: &str) -> Result<&'static Message, SchemaError> {
    static ALL: OnceLock<Result<foldhash::HashMap<String, Message>, SchemaError>> = OnceLock::new();
    let all = ALL
        .get_or_init(|| {
            SOURCES
                .iter()
                .map(|(file, text)| parse_message(file, text).map(|m| (m.name.clone(), m)))
                .collect()
        })
        .as_ref()
        .map_err(Clone::clone)?;
    all.get(name).ok_or_else(|| SchemaError {
        file: format!("{name}.json"),
        problem: SchemaProblem::NotCompiledIn,
    })
}

/// Remove `//` comments (Kafka's definitions are JSON with line comments).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let mut in_string = false;
        let mut escaped = false;
        let mut cut = line.len();
        let bytes = line.as_bytes();
        for (i, &b) in bytes.iter().enumerate() {
            match b {
                _ if escaped => escaped = false,
                b'\\' if in_string => escaped = true,
                b'"' => in_string = !in_string,
                b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => {
                    cut = i;
                    break;
                }
                _ => {}
            }
        }
        out.push_str(&line[..cut]);
        out.push('\n');
    }
    out
}

fn parse_message(file: &str, text: &str) -> Result<Message, SchemaError> {
    let err = |problem: SchemaProblem| SchemaError {
        file: file.to_string(),
        problem,
    };
    let json: Json = serde_json::from_str(&strip_comments(text))
        .map_err(|e| err(SchemaProblem::Json(Arc::new(e))))?;
    let str_of = |key: &'static str| {
        json.get(key)
            .and_then(Json::as_str)
            .ok_or_else(|| err(SchemaProblem::Missing(key)))
    };
    let name = str_of("name")?.to_string();
    let api_key = json
        .get("apiKey")
        .and_then(Json::as_i64)
        .and_then(|k| i16::try_from(k).ok())
        .ok_or_else(|| err(SchemaProblem::Missing("apiKey")))?;
    let valid = Versions::parse(str_of("validVersions")?).map_err(err)?;
    let flexible = Versions::parse(str_of("flexibleVersions")?).map_err(err)?;
    let mut common = HashMap::new();
    if let Some(structs) = json.get("commonStructs").and_then(Json::as_array) {
        for s in structs {
            let sname = s
                .get("name")
                .and_then(Json::as_str)
                .ok_or_else(|| err(SchemaProblem::UnnamedStruct))?;
            common.insert(sname.to_string(), s.clone());
        }
    }
    let fields = parse_fields(&json, "", &common).map_err(err)?;
    Ok(Message {
        name,
        api_key,
        valid,
        flexible,
        fields,
    })
}

fn parse_fields(
    parent: &Json,
    prefix: &str,
    common: &HashMap<String, Json>,
) -> Result<Vec<Field>, SchemaProblem> {
    let Some(list) = parent.get("fields").and_then(Json::as_array) else {
        return Ok(Vec::new());
    };
    list.iter()
        .map(|f| parse_field(f, prefix, common))
        .collect()
}

fn parse_field(
    f: &Json,
    prefix: &str,
    common: &HashMap<String, Json>,
) -> Result<Field, SchemaProblem> {
    let get = |k: &str| f.get(k).and_then(Json::as_str);
    let name = get("name").ok_or(SchemaProblem::UnnamedField)?;
    let (path, name_at) = if prefix.is_empty() {
        (name.to_string(), 0)
    } else {
        (format!("{prefix}.{name}"), prefix.len() + 1)
    };
    let type_name = get("type").ok_or_else(|| SchemaProblem::NoType(path.clone()))?;
    let versions =
        Versions::parse(get("versions").ok_or_else(|| SchemaProblem::NoVersions(path.clone()))?)?;
    let nullable = get("nullableVersions")
        .map(Versions::parse)
        .transpose()?
        .unwrap_or(Versions::NONE);
    let tag = match f.get("tag").and_then(Json::as_u64) {
        Some(tag) => {
            let tagged = get("taggedVersions")
                .map(Versions::parse)
                .transpose()?
                .ok_or_else(|| SchemaProblem::TagWithoutVersions(path.clone()))?;
            Some((
                u32::try_from(tag).map_err(|_| SchemaProblem::TagTooLarge(path.clone()))?,
                tagged,
            ))
        }
        None => None,
    };
    let ty = parse_type(type_name, f, &path, common)?;
    Ok(Field {
        path,
        name_at,
        ty,
        versions,
        nullable,
        tag,
    })
}

fn parse_type(
    name: &str,
    f: &Json,
    path: &str,
    common: &HashMap<String, Json>,
) -> Result<Type, SchemaProblem> {
    if let Some(inner) = name.strip_prefix("[]") {
        return Ok(Type::Array(Box::new(parse_type(inner, f, path, common)?)));
    }
    Ok(match name {
        "bool" => Type::Bool,
        "int8" => Type::Int8,
        "int16" => Type::Int16,
        "uint16" => Type::Uint16,
        "int32" => Type::Int32,
        "uint32" => Type::Uint32,
        "int64" => Type::Int64,
        "float64" => Type::Float64,
        "uuid" => Type::Uuid,
        "string" => Type::String,
        "bytes" => Type::Bytes,
        "records" => Type::Records,
        s if s.starts_with(|c: char| c.is_ascii_uppercase()) => {
            // A struct: fields inline, or a common struct by name.
            let def = if f.get("fields").is_some() {
                f
            } else {
                common.get(s).ok_or_else(|| SchemaProblem::UnknownStruct {
                    path: path.to_string(),
                    name: s.to_string(),
                })?
            };
            Type::Struct(parse_fields(def, path, common)?)
        }
        other => {
            return Err(SchemaProblem::UnknownType {
                path: path.to_string(),
                name: other.to_string(),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_compiled_in_schema_loads() {
        for (file, _) in source_files() {
            let name = file.trim_end_matches(".json");
            let m = message(name).expect("loads");
            assert_eq!(m.name, name);
            assert!(!m.fields.is_empty(), "{name}");
        }
    }

    #[test]
    fn version_ranges() {
        assert_eq!(
            Versions::parse("3-13").ok(),
            Some(Versions { min: 3, max: 13 })
        );
        assert_eq!(
            Versions::parse("9+").ok(),
            Some(Versions {
                min: 9,
                max: i16::MAX
            })
        );
        assert!(!Versions::parse("none").expect("none").contains(0));
        assert!(Versions::parse("7").expect("single").contains(7));
        assert!(Versions::parse("x").is_err());
    }

    #[test]
    fn a_broken_schema_names_its_file_and_carries_the_problem() {
        use std::error::Error as _;
        let e = parse_message("Broken.json", "{ not json").expect_err("not JSON");
        assert_eq!(e.to_string(), "message schema Broken.json");
        let cause = e.source().expect("the JSON error");
        assert!(matches!(
            cause.downcast_ref::<SchemaProblem>(),
            Some(SchemaProblem::Json(_))
        ));
        let text = r#"{"name": "X", "apiKey": 1, "validVersions": "0",
            "flexibleVersions": "none", "fields": [{"name": "A", "type": "int32"}]}"#;
        let e = parse_message("X.json", text).expect_err("no versions");
        assert_eq!(
            crate::sync::error_chain(&e),
            "message schema X.json: A: no versions"
        );
        let e = message("NoSuchMessage").expect_err("unknown");
        assert_eq!(
            crate::sync::error_chain(&e),
            "message schema NoSuchMessage.json: not compiled into the proxy"
        );
    }

    #[test]
    fn comments_are_stripped_outside_strings_only() {
        let text = "// header\n{ \"a\": \"http://x\" } // trailing\n";
        let json: Json = serde_json::from_str(&strip_comments(text)).expect("json");
        assert_eq!(json["a"], "http://x");
    }

    #[test]
    fn produce_request_shape() {
        let m = message("ProduceRequest").expect("schema");
        assert_eq!((m.api_key, m.valid.min, m.valid.max), (0, 3, 13));
        assert_eq!(m.flexible.min, 9);
        let topics = m
            .fields
            .iter()
            .find(|f| f.path == "TopicData")
            .expect("TopicData");
        let Type::Array(inner) = &topics.ty else {
            panic!("TopicData is an array")
        };
        let Type::Struct(fields) = inner.as_ref() else {
            panic!("of structs")
        };
        let paths: Vec<&str> = fields.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "TopicData.Name",
                "TopicData.TopicId",
                "TopicData.PartitionData"
            ]
        );
    }

    #[test]
    fn names_and_parents() {
        let m = message("MetadataResponse").expect("schema");
        let brokers = m
            .fields
            .iter()
            .find(|f| f.path == "Brokers")
            .expect("Brokers");
        assert_eq!((brokers.name(), brokers.parent()), ("Brokers", ""));
        let Type::Array(inner) = &brokers.ty else {
            panic!("array")
        };
        let Type::Struct(fields) = inner.as_ref() else {
            panic!("of structs")
        };
        assert_eq!((fields[1].name(), fields[1].parent()), ("Host", "Brokers"));
    }

    #[test]
    fn tagged_fields_are_known() {
        let m = message("ProduceResponse").expect("schema");
        let endpoints = m
            .fields
            .iter()
            .find(|f| f.path == "NodeEndpoints")
            .expect("NodeEndpoints");
        assert!(endpoints.tagged_at(10) && !endpoints.tagged_at(9));
        assert!(!endpoints.regular_at(10));
        assert_eq!(endpoints.tag.map(|t| t.0), Some(0));
    }
}
