//! What the Produce filter costs per request, against one full CRC-32C pass
//! over the same batch: the rewrite must not grow with batch size.
//!
//! Also: a local Produce response walked and passed, against the decode and
//! re-encode it used to get; and a link Produce response's answers read on
//! that walk, against the validation and decode they used to get.
//!
//! And the check of a local Produce for read-only mirrored topics.
//!
//! And the mirrored producer state's dedupe check of a batch from a known
//! producer (state lookup, then the appended batch recorded), among 10,000
//! producers in 100 partitions.
//!
//! And the same check of a batch from the next of N producers cycling
//! (N = 1,000 or 1,000,000) under the default bound of 100,000: past the
//! bound every batch is a new producer, which evicts the least recently
//! used one.
//!
//! `cargo bench --bench rewrite`

use bytes::BytesMut;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

use kafka_mirror_proxy::benching::{self, Per, Work};

/// Every case of `benching::cases`, each group in turn.
fn all(c: &mut Criterion) {
    let mut cases = benching::cases().into_iter().peekable();
    while let Some(first) = cases.peek() {
        let name = first.group;
        let mut group = c.benchmark_group(name);
        while let Some(case) = cases.next_if(|c| c.group == name) {
            match case.per {
                Some(Per::Bytes(n)) => {
                    group.throughput(Throughput::Bytes(n));
                }
                Some(Per::Element) => {
                    group.throughput(Throughput::Elements(1));
                }
                None => {}
            }
            match case.work {
                Work::Repeat(mut run) => group.bench_function(&case.id, |b| b.iter(&mut run)),
                Work::Fresh { input, mut run } => group.bench_function(&case.id, |b| {
                    b.iter_batched(
                        || BytesMut::from(&input[..]).freeze(),
                        &mut run,
                        BatchSize::LargeInput,
                    )
                }),
            };
            if let Some(report) = case.report {
                eprintln!("{}", report());
            }
        }
        group.finish();
    }
}

criterion_group!(benches, all);
criterion_main!(benches);
