//! Real clients talking to a real broker through a recording relay: every
//! request and response the proxy interprets must walk with Kafka's schemas,
//! re-emit cleanly with proxy addresses, and (for Produce on a link) plan a
//! remap of every batch. The responses the proxy's own client also reads
//! must decode as it decodes them. The same traffic seeds the fuzz corpora: set
//! `FUZZ_SEEDS_DIR=fuzz/seeds` to write them (`scripts/fuzz.sh --seeds`).

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use bytes::Bytes;
use kafka_mirror_proxy::client::protocol::{self as client, Rpc};
use kafka_mirror_proxy::filter::addresses::{self, Advertised};
use kafka_mirror_proxy::mirror::link::{ControlBatchPolicy, Link};
use kafka_mirror_proxy::mirror::produce;
use kafka_mirror_proxy::wire::header::{response_body_offset, RequestHeaderPeek};
use kafka_mirror_proxy::wire::schema;
use kafka_mirror_proxy::wire::walk;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreateTopicsRequest, DescribeConfigsRequest, FetchRequest,
    ListOffsetsRequest, MetadataRequest, ProduceRequest,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::DefaultProducerContext;
use rdkafka::producer::{BaseRecord, Producer, ThreadedProducer};

use support::capture::{CaptureRelay, Exchange};
use support::tools;

use kafka_mirror_proxy::filter::addresses::{response_schema, WALKED_RESPONSES as RESPONSE_APIS};

/// The APIs whose responses the proxy's own client reads, in the order the
/// `client_responses` fuzz target numbers them (the same as `RESPONSE_APIS`
/// for the four both read; SaslHandshake and SaslAuthenticate follow, not
/// seen here).
const CLIENT_APIS: [ApiKey; 7] = [
    ApiKey::Metadata,
    ApiKey::CreateTopics,
    ApiKey::DescribeConfigs,
    ApiKey::ApiVersions,
    ApiKey::Produce,
    ApiKey::Fetch,
    ApiKey::ListOffsets,
];

/// Decode a captured response as the client does, if the client would
/// ever ask for that version (`None` otherwise).
fn client_decodes<R: Rpc>(frame: &[u8], version: i16) -> Option<Result<()>> {
    let (min, max) = client::our_versions::<R>().ok()?;
    if !(min..=max).contains(&version) {
        return None;
    }
    let correlation_id = i32::from_be_bytes(*frame.first_chunk::<4>()?);
    let frame = Bytes::copy_from_slice(frame);
    Some(
        client::decode_response::<R>(&frame, version, correlation_id, "capture")
            .map(drop)
            .map_err(Into::into),
    )
}

/// The client's view of one exchange; returns its fuzz seed.
fn check_client(e: &Exchange, api: ApiKey, seeds: &mut Vec<(&'static str, Vec<u8>)>) -> Result<()> {
    let (Some(pick), Some(response)) = (CLIENT_APIS.iter().position(|a| *a == api), &e.response)
    else {
        return Ok(());
    };
    let version = e.api_version;
    let decoded = match api {
        ApiKey::ApiVersions => client_decodes::<ApiVersionsRequest>(response, version),
        ApiKey::Metadata => client_decodes::<MetadataRequest>(response, version),
        ApiKey::CreateTopics => client_decodes::<CreateTopicsRequest>(response, version),
        ApiKey::DescribeConfigs => client_decodes::<DescribeConfigsRequest>(response, version),
        ApiKey::Produce => client_decodes::<ProduceRequest>(response, version),
        ApiKey::Fetch => client_decodes::<FetchRequest>(response, version),
        ApiKey::ListOffsets => client_decodes::<ListOffsetsRequest>(response, version),
        _ => None,
    };
    if let Some(decoded) = decoded {
        decoded
            .with_context(|| format!("{api:?} v{version} response, read by the proxy's client"))?;
    }
    seeds.push((
        "client_responses",
        [&[pick as u8, version as u8][..], response].concat(),
    ));
    Ok(())
}

fn link() -> Result<Link> {
    Ok(Link::new(
        "east".into(),
        "MkU3OEVBNTcwNTJENDM2Qk".parse()?,
        "mirror-east".into(),
        vec![regex::Regex::new("^(?:orders)$")?],
        None,
        ControlBatchPolicy::Drop,
    ))
}

fn run_clients(bootstrap: &str) -> Result<()> {
    tools::create_topic(bootstrap, "orders", 3, &[], &[])?;
    let lines: Vec<String> = (0..300).map(|i| format!("k{i}\tvalue {i}")).collect();
    // Kafka's own producer: Produce v13 (topic ids), idempotent, lz4.
    tools::console_produce(
        bootstrap,
        "orders",
        &lines,
        &[("parse.key", "true"), ("compression.type", "lz4")],
    )?;
    // librdkafka: its own Produce version, gzip, the link's client id.
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("client.id", "mirror-east")
        .set("enable.idempotence", "true")
        .set("compression.type", "gzip")
        .set("linger.ms", "5")
        .create()?;
    for i in 0..300 {
        let key = format!("r{i}");
        producer
            .send(BaseRecord::to("orders").key(&key).payload("librdkafka"))
            .map_err(|(e, _)| e)?;
    }
    producer.flush(Duration::from_secs(30))?;
    // Both consumers: Fetch, FindCoordinator, group and offset APIs.
    let got = tools::console_consume(bootstrap, "orders", 600, &[], Duration::from_secs(20))?;
    ensure!(got.len() == 600, "console consumer read {}", got.len());
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "real-traffic")
        .set("auto.offset.reset", "earliest")
        .create()?;
    consumer.subscribe(&["orders"])?;
    let mut n = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while n < 600 && std::time::Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            m?;
            n += 1;
        }
    }
    ensure!(n == 600, "librdkafka consumer read {n}");
    tools::broker_api_versions(bootstrap)?;
    tools::cluster_id(bootstrap, &[])?;
    Ok(())
}

/// FNV-1a, to name seed files by content.
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn write_seed(dir: &Path, target: &str, bytes: &[u8]) -> Result<()> {
    let dir = dir.join(target);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{:016x}", fnv(bytes))), bytes)?;
    Ok(())
}

/// Check one exchange; returns the seeds it gives, by fuzz target.
fn check(e: &Exchange, link: &Link, seeds: &mut Vec<(&'static str, Vec<u8>)>) -> Result<()> {
    let Ok(api) = ApiKey::try_from(e.api_key) else {
        return Ok(());
    };
    let version = e.api_version;
    let what = format!("{api:?} v{version}");
    seeds.push(("request_header", e.request.clone()));
    check_client(e, api, seeds)?;
    if api == ApiKey::Produce {
        let frame = Bytes::from(e.request.clone());
        let h = RequestHeaderPeek::parse(&frame)?;
        let offset = h.body_offset(&frame, api.request_header_version(version))?;
        let index =
            produce::index(&frame, offset, version).with_context(|| format!("{what} request"))?;
        let plan = produce::plan(&frame, &index, link, &|_| Some("orders".into()));
        ensure!(
            plan.local.is_empty() && plan.patches() > 0,
            "{what}: every batch of a link Produce is remapped: {plan:?}"
        );
        for r in plan.patched_batches() {
            seeds.push(("record_batches", frame[r].to_vec()));
        }
        let body = &frame[offset..];
        let index = schema::source_files()
            .position(|(f, _)| f == "ProduceRequest.json")
            .context("ProduceRequest schema")?;
        seeds.push((
            "schema_walk",
            [&[index as u8, version as u8][..], body].concat(),
        ));
        seeds.push(("produce_plan", e.request.clone()));
    }
    let (Some(name), Some(response)) = (response_schema(api), &e.response) else {
        return Ok(());
    };
    let msg = schema::message(name)?;
    let start = response_body_offset(response, api.response_header_version(version))
        .context("response header")?;
    walk::validate(msg, version, response, start).with_context(|| format!("{what} response"))?;
    let adv = Advertised {
        host: "proxy.example".into(),
        port_base: 30000,
        sni: None,
    };
    if api == ApiKey::ApiVersions {
        addresses::clamp_api_versions(version, response)?;
    } else {
        let (out, _) = addresses::rewrite(api, version, response, &adv)?;
        if let Some(out) = out {
            let (again, _) = addresses::rewrite(api, version, &out, &adv)?;
            ensure!(again.is_none(), "{what}: rewriting twice changes more");
        }
    }
    let pick = RESPONSE_APIS.iter().position(|a| *a == api).unwrap_or(0) as u8;
    seeds.push(("responses", [&[pick, version as u8][..], response].concat()));
    let index = schema::source_files()
        .position(|(f, _)| f == format!("{name}.json"))
        .context("schema index")?;
    seeds.push((
        "schema_walk",
        [&[index as u8, version as u8][..], &response[start..]].concat(),
    ));
    Ok(())
}

#[test]
fn every_message_real_clients_exchange_walks_and_rewrites() -> Result<()> {
    let (relay, _broker) = CaptureRelay::start_with_broker()?;
    let bootstrap = relay.address();
    run_clients(&bootstrap)?;

    let link = link()?;
    let mut seeds = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let exchanges = relay.exchanges();
    for e in &exchanges {
        check(e, &link, &mut seeds)?;
        let name = ApiKey::try_from(e.api_key)
            .map_or_else(|_| e.api_key.to_string(), |a| format!("{a:?}"));
        *seen
            .entry(format!("{name} v{}", e.api_version))
            .or_default() += 1;
    }
    eprintln!("captured: {seen:?}");
    for needed in [
        "Produce v13",
        "Metadata",
        "FindCoordinator",
        "ApiVersions",
        "Fetch",
        "DescribeCluster",
    ] {
        ensure!(
            seen.keys().any(|k| k.starts_with(needed)),
            "no {needed} exchange captured: {seen:?}"
        );
    }
    // A stream of real request frames for the frame reader.
    let stream: Vec<u8> = exchanges
        .iter()
        .take(40)
        .flat_map(|e| [&(e.request.len() as u32).to_be_bytes()[..], &e.request].concat())
        .collect();
    seeds.push(("frame", stream));
    if let Some(dir) = std::env::var_os("FUZZ_SEEDS_DIR") {
        let dir = Path::new(&dir);
        for (target, bytes) in &seeds {
            write_seed(dir, target, bytes)?;
        }
        eprintln!("wrote {} seeds under {}", seeds.len(), dir.display());
    }
    Ok(())
}
