//! What one Produce costs the proxy's Produce path when its caches are
//! cold, phase by phase, as a link and as a local client.
//!
//! The end-to-end runs (`scripts/perf.sh`) put the link's excess over
//! passthrough at about 6 us a request, while criterion, which runs every
//! phase hot, puts the same work under 2 us. Between two requests the
//! broker and the producer run on the same two cores and evict the proxy's
//! data, so this runs each request after writing `SCRUB_MIB` of memory
//! (default 4 MiB: twice the cores' own caches; 96 MiB: past the shared
//! last-level cache and the TLBs' reach too), and once hot for comparison.
//!
//! Phases of a 16 KiB v13 request of one partition, one batch, a known
//! origin, as the Produce path runs them, with the allocations each makes:
//! - link: `plan` (request walk, topic and origin lookups, patch plan),
//!   `apply` (the 8-byte patch), `begin` (producer state), `answers` (the
//!   response walk with the answers visitor), `settle` (producer state);
//! - local: `any_topic` (the read-only check: index and ask), `response_walk` (the
//!   response walk alone).
//!
//! `cargo run --release --example cold_cost [ITERATIONS]`
//! `SCRUB_MIB=96 cargo run --release --example cold_cost`

use std::collections::{HashMap, HashSet};
use std::hint::black_box;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ApiKey, ProduceResponse};
use regex::Regex;
use uuid::Uuid;

use kafka_mirror_proxy::client::protocol::{self, PartitionRef};
use kafka_mirror_proxy::metrics::Metrics;
use kafka_mirror_proxy::mirror::dedupe::{Begin, Dedupe};
use kafka_mirror_proxy::mirror::link::{ControlBatchPolicy, Link};
use kafka_mirror_proxy::mirror::origins::{compose, OriginId, Origins, PartitionId};
use kafka_mirror_proxy::mirror::produce;
use kafka_mirror_proxy::mirror::produce_response::Answers;
use kafka_mirror_proxy::mirror::state_records::{OriginValue, StateRecord};
use kafka_mirror_proxy::wire::batch::{self, NewBatch, NewRecord};
use kafka_mirror_proxy::wire::header::RequestHeaderPeek;
use kafka_mirror_proxy::wire::produce_response_walk::Walked;

/// Counts allocations, to report how many each phase makes.
struct Counting;
static ALLOCATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
unsafe impl std::alloc::GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        unsafe { std::alloc::System.realloc(ptr, layout, size) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;
fn allocations() -> u64 {
    ALLOCATIONS.load(std::sync::atomic::Ordering::Relaxed)
}

const VERSION: i16 = 13;
/// Requests run before any is measured.
const WARM_UP: usize = 20;
const ORDERS_ID: Uuid = Uuid::from_u128(0x5eed_0001);
const PID: i64 = 5;
/// Offset of baseSequence in a v2 record batch.
const BASE_SEQUENCE: usize = 53;

/// One batch of `records` 1 KiB records from producer `PID` (the library's
/// batch builder; incompressible values).
fn batch(records: usize) -> Bytes {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let values: Vec<Vec<u8>> = (0..records)
        .map(|_| {
            (0..1024)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect()
        })
        .collect();
    let records: Vec<NewRecord<'_>> = values
        .iter()
        .map(|v| NewRecord {
            key: None,
            value: Some(v),
            headers: &[],
            timestamp: 1_700_000_000_000,
        })
        .collect();
    let producer = NewBatch {
        producer_id: PID,
        producer_epoch: 0,
        base_sequence: 0,
        transactional: false,
        control: false,
    };
    Bytes::from(batch::build(&producer, &records).expect("batch"))
}

/// A v13 Produce of `b` to partition 0 of `orders`, as the link sends it.
fn request(b: &Bytes) -> BytesMut {
    let to = PartitionRef {
        topic: "orders",
        topic_id: ORDERS_ID,
        partition: 0,
        leader_epoch: -1,
    };
    let body = protocol::produce_request(VERSION, &to, b.clone(), 30_000).expect("request");
    protocol::encode_request(&body, VERSION, 1, "mirror-east").expect("frame")
}

/// The broker's answer to [`request`]: appended at `base_offset`.
fn response(base_offset: i64) -> Bytes {
    let body = ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
        .with_topic_id(ORDERS_ID)
        .with_partition_responses(vec![PartitionProduceResponse::default()
            .with_index(0)
            .with_base_offset(base_offset)
            .with_log_append_time_ms(-1)])]);
    produce::encode_response(1, VERSION, &body)
        .expect("response")
        .freeze()
}

/// Write `buf`, evicting the proxy's data as the broker and the producer
/// do between two requests.
fn scrub(buf: &mut [u8], round: u8) {
    for chunk in buf.chunks_mut(64) {
        chunk[0] = chunk[0].wrapping_add(round);
    }
    black_box(&buf[..]);
}

const PHASES: [&str; 7] = [
    "plan",
    "apply",
    "begin",
    "answers",
    "settle",
    "any_topic",
    "response_walk",
];
/// The first `LINK` phases are the link's, the rest the local path's.
const LINK: usize = 5;

/// Times `f` and counts its allocations into `at` of `t` and `a`.
fn measure<R>(t: &mut [u64], a: &mut [u64], at: usize, f: impl FnOnce() -> R) -> R {
    let (start, allocated) = (Instant::now(), allocations());
    let r = f();
    t[at] = start.elapsed().as_nanos() as u64;
    a[at] = allocations() - allocated;
    r
}

fn main() {
    let iterations: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(400);
    let link = Link::new(
        "east".into(),
        "MkU3OEVBNTcwNTJENDM2Qk".parse().expect("cluster id"),
        "mirror-east".into(),
        vec![Regex::new("^(?:orders)$").expect("regex")],
        None,
        ControlBatchPolicy::Forward,
    );
    // As the session looks them up: the topic-id table behind a lock, the
    // state's origins view behind another.
    let names: RwLock<HashMap<Uuid, Arc<str>>> =
        RwLock::new(HashMap::from([(ORDERS_ID, Arc::from("orders"))]));
    let read_only: HashSet<String> = HashSet::from(["mirrored".to_string()]);
    let at = PartitionId {
        topic_id: ORDERS_ID,
        partition: 0,
    };
    let origin = OriginId {
        source: *link.source_cluster_id(),
        pid: PID,
    };
    let mut view = Origins::new([*link.source_cluster_id()]);
    view.apply(
        0,
        &StateRecord::Origin(
            origin.key(at),
            Some(OriginValue {
                mapped_pid: compose(link.region(), PID),
                salt: 0,
                claim_offset: -1,
                last_seen_ms: 0,
            }),
        ),
    );
    let view = RwLock::new(view);
    let dedupe = Dedupe::new(
        10_000,
        1 << 20,
        std::time::Duration::from_secs(10),
        Arc::new(Metrics::new(["east"])),
    );
    let writer = dedupe.writer();
    dedupe.assume_rebuilt(at, writer);

    let b = batch(15);
    let template = request(&b);
    let batch_at = template
        .windows(b.len())
        .position(|w| w == &b[..])
        .expect("batch in frame");
    let body_offset = RequestHeaderPeek::parse(&template)
        .expect("peek")
        .body_offset(&template, ApiKey::Produce.request_header_version(VERSION))
        .expect("offset");

    let scrub_mib: usize = std::env::var("SCRUB_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4);
    let mut scrub_buf = vec![0u8; scrub_mib << 20];
    let mut n = 0usize;
    for cold in [false, true] {
        let mut times: Vec<[u64; 7]> = Vec::with_capacity(iterations);
        let mut allocs = [0u64; 7];
        for i in 0..iterations + WARM_UP {
            // Every request carries new sequences and gets new offsets.
            n += 1;
            let seq = i32::try_from(n * 15).expect("sequence");
            let mut frame = template.clone();
            frame[batch_at + BASE_SEQUENCE..batch_at + BASE_SEQUENCE + 4]
                .copy_from_slice(&seq.to_be_bytes());
            let frame = frame.freeze();
            let resp = response(i64::from(seq));
            let now = 1_700_000_000_000 + n as i64;
            let (mut t, mut a) = ([0u64; 7], [0u64; 7]);
            if cold {
                scrub(&mut scrub_buf, n as u8);
            }

            let mut plan = measure(&mut t, &mut a, 0, || {
                let v = view.read().expect("view");
                let index = produce::index(&frame, body_offset, VERSION).expect("index");
                produce::plan_with(
                    &frame,
                    &index,
                    &link,
                    &|id| names.read().ok()?.get(&id).cloned(),
                    &|_| None,
                    &produce::AtTime(&v, now),
                )
            });
            let buf = measure(&mut t, &mut a, 1, || {
                let mut buf = frame.try_into_mut().expect("unique");
                plan.apply(&mut buf).expect("apply");
                buf
            });
            let tracked = measure(&mut t, &mut a, 2, || {
                match dedupe.begin(&mut plan, "east", false, writer) {
                    Begin::Begun(tracked) => tracked,
                    _ => panic!("not begun"),
                }
            });
            assert!(!tracked.is_empty(), "request {n}: nothing begun");
            let found = measure(&mut t, &mut a, 3, || {
                let mut answers = tracked.answers();
                let walked = answers.walk(&resp, VERSION).expect("walk");
                assert_eq!(walked, Walked::Whole);
                answers.into_found()
            });
            assert!(found[0].is_some());
            measure(&mut t, &mut a, 4, || tracked.settle(&found, now));

            if cold {
                scrub(&mut scrub_buf, n as u8);
            }
            let frame = buf.freeze();
            let hit = measure(&mut t, &mut a, 5, || {
                let index = produce::index(&frame, body_offset, VERSION).expect("index");
                produce::any_topic(&frame, &index, |t| match t {
                    produce::TopicKey::Id(id) => names
                        .read()
                        .ok()
                        .and_then(|n| n.get(&id).cloned())
                        .is_some_and(|n| read_only.contains(&*n)),
                    produce::TopicKey::Name(n) => read_only.contains(n),
                })
            });
            assert!(!hit);
            let walked = measure(&mut t, &mut a, 6, || {
                Answers::new(std::iter::empty())
                    .walk(&resp, VERSION)
                    .expect("walk")
            });
            assert_eq!(walked, Walked::Whole);

            if i >= WARM_UP {
                times.push(t);
                for (sum, one) in allocs.iter_mut().zip(a) {
                    *sum += one;
                }
            }
        }
        match cold {
            false => println!("hot, {iterations} requests: ns, median (mean); allocations"),
            true => println!(
                "after writing {scrub_mib} MiB, {iterations} requests: ns, median (mean); allocations"
            ),
        }
        let mut totals = [0u64; 2];
        for (k, name) in PHASES.iter().enumerate() {
            let mut v: Vec<u64> = times.iter().map(|s| s[k]).collect();
            v.sort_unstable();
            let mean = v.iter().sum::<u64>() / v.len() as u64;
            let per_request = allocs[k] as f64 / iterations as f64;
            println!(
                "  {name:<14} {:>7} ({mean:>6}) {per_request:.0}",
                v[v.len() / 2]
            );
            totals[usize::from(k >= LINK)] += mean;
        }
        println!("  link, summed means:  {:>6}", totals[0]);
        println!("  local, summed means: {:>6}", totals[1]);
    }
}
