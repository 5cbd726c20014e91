//! A fixed Produce load, the same bytes every run: `REQUESTS` Produce v9
//! requests (acks=all), each one batch of 16 records of 1 KiB to partition 0
//! of `TOPIC`, sent one at a time (each response read before the next
//! request). A producer id and sequences as a replicator sends them
//! (`--pid N`), or none (`--pid -1`, a plain producer).
//!
//! It drives `scripts/perf-count.sh`, which counts the instructions the
//! proxy spends on it under callgrind: unlike a real producer, whose
//! batching follows timing, this load is the same for every build, so two
//! counts compare the builds and nothing else.
//!
//! With `--in-flight N`, up to N requests are sent before the oldest
//! one's response is read (a pipelining producer); one at a time without.
//!
//! `cargo run --release --example fixed_load -- ADDRESS TOPIC CLIENT_ID REQUESTS [--pid N] [--in-flight N]`

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ProduceRequest, ProduceResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};

const VERSION: i16 = 9;
const RECORDS_PER_BATCH: i32 = 16;
/// A Produce response to one partition is a few dozen bytes.
const MAX_RESPONSE: usize = 1 << 20;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fixed_load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: fixed_load ADDRESS TOPIC CLIENT_ID REQUESTS [--pid N] [--in-flight N]";
    let [address, topic, client_id, requests, rest @ ..] = args.as_slice() else {
        return Err(usage.into());
    };
    let requests: i32 = requests.parse().map_err(|e| format!("REQUESTS: {e}"))?;
    let mut pid: i64 = -1;
    let mut in_flight: i32 = 1;
    let mut rest: &[String] = rest;
    while let [flag, n, more @ ..] = rest {
        match flag.as_str() {
            "--pid" => pid = n.parse().map_err(|e| format!("--pid: {e}"))?,
            "--in-flight" => in_flight = n.parse().map_err(|e| format!("--in-flight: {e}"))?,
            _ => return Err(usage.into()),
        }
        rest = more;
    }
    if !rest.is_empty() || in_flight < 1 {
        return Err(usage.into());
    }
    let mut s = TcpStream::connect(address).map_err(|e| format!("connecting to {address}: {e}"))?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    let value = vec![b'v'; 1024];
    // Up to `in_flight` requests are sent before the oldest one's response
    // is read, as a producer pipelines them (`max.in.flight`).
    let (mut sent, mut answered) = (0, 0);
    while answered < requests {
        while sent < requests && sent - answered < in_flight {
            let batch = batch(pid, sent * RECORDS_PER_BATCH, &value)?;
            let request = ProduceRequest::default()
                .with_acks(-1)
                .with_timeout_ms(30_000)
                .with_topic_data(vec![TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.clone())))
                    .with_partition_data(vec![PartitionProduceData::default()
                        .with_index(0)
                        .with_records(Some(batch))])]);
            send(&mut s, client_id, sent, &request)?;
            sent += 1;
        }
        let response = receive(&mut s, answered)?;
        let code = response
            .responses
            .first()
            .and_then(|t| t.partition_responses.first())
            .map(|p| p.error_code);
        if code != Some(0) {
            return Err(format!("request {answered} answered {code:?}"));
        }
        answered += 1;
    }
    Ok(())
}

fn batch(pid: i64, sequence: i32, value: &[u8]) -> Result<Bytes, String> {
    let records: Vec<NewRecord<'_>> = (0..RECORDS_PER_BATCH)
        .map(|i| NewRecord {
            key: None,
            value: Some(value),
            headers: &[],
            timestamp: 1_700_000_000_000 + i64::from(i),
        })
        .collect();
    let header = match pid {
        -1 => NewBatch::NO_PRODUCER,
        _ => NewBatch {
            producer_id: pid,
            producer_epoch: 0,
            base_sequence: sequence,
            transactional: false,
            control: false,
        },
    };
    build(&header, &records)
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

fn send(
    s: &mut TcpStream,
    client_id: &str,
    correlation: i32,
    body: &ProduceRequest,
) -> Result<(), String> {
    let header = RequestHeader::default()
        .with_request_api_key(ApiKey::Produce as i16)
        .with_request_api_version(VERSION)
        .with_correlation_id(correlation)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut buf = BytesMut::new();
    header
        .encode(&mut buf, ApiKey::Produce.request_header_version(VERSION))
        .map_err(|e| e.to_string())?;
    body.encode(&mut buf, VERSION).map_err(|e| e.to_string())?;
    let mut framed = (buf.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(&buf);
    s.write_all(&framed).map_err(|e| format!("writing: {e}"))
}

fn receive(s: &mut TcpStream, correlation: i32) -> Result<ProduceResponse, String> {
    let mut size = [0u8; 4];
    s.read_exact(&mut size)
        .map_err(|e| format!("reading: {e}"))?;
    let size = u32::from_be_bytes(size) as usize;
    if size > MAX_RESPONSE {
        return Err(format!("a response of {size} bytes announced"));
    }
    let mut frame = vec![0u8; size];
    s.read_exact(&mut frame)
        .map_err(|e| format!("reading: {e}"))?;
    let mut frame = Bytes::from(frame);
    let header =
        ResponseHeader::decode(&mut frame, ApiKey::Produce.response_header_version(VERSION))
            .map_err(|e| e.to_string())?;
    if header.correlation_id != correlation {
        return Err(format!(
            "correlation {} != {correlation}",
            header.correlation_id
        ));
    }
    ProduceResponse::decode(&mut frame, VERSION).map_err(|e| e.to_string())
}
