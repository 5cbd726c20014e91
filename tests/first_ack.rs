//! The first batches of what is new to a link are answered correctly:
//! through the proxy binary against a real broker, over 20 partitions, the
//! first batch of a new partition and producer, that producer's next batch
//! and a new producer on the known partition are each acknowledged without
//! error at the offset the broker appended them at (0, 1, 2): none is taken
//! for a duplicate or answered from the wrong producer's state.
//!
//! How long those answers take, beside the same writes straight to the
//! broker, is a benchmark, not a test: `FANOUT_ARGS="--cases 1"
//! scripts/fanout.sh` (docs/benchmarks.md, first contact).

mod support;

use anyhow::{ensure, Result};

use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{record_batch_at, RawClient};

const PARTITIONS: i32 = 20;

#[test]
fn new_partitions_and_producers_are_acknowledged() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", PARTITIONS)])?;
    let source = ClusterId::from_bytes(*b"first-ack-source");
    let p = ProxyProcess::with_link_x(&broker.bootstrap(), &source, "m", &[])?;
    let mut link = RawClient::connect(&p.bootstrap)?;
    for partition in 0..PARTITIONS {
        // (what, source pid, sequence, the offset the broker gives it)
        for (what, pid, sequence, offset) in [
            ("new partition and producer", 10, 0, 0),
            ("the producer's next batch", 10, 1, 1),
            ("new producer, known partition", 11, 0, 2),
        ] {
            let batch = record_batch_at(pid, sequence, &["v"]);
            let response = link.produce("mirror-x", "m", partition, batch)?;
            let answer = &response.responses[0].partition_responses[0];
            let context = || {
                format!(
                    "m-{partition}, {what} (pid {pid}, sequence {sequence}): error {} ({:?}), \
                     offset {}; proxy log:\n{}",
                    answer.error_code,
                    answer.error_message,
                    answer.base_offset,
                    tools::tail_str(&p.logs(), 30)
                )
            };
            ensure!(answer.error_code == 0, "refused: {}", context());
            ensure!(
                answer.index == partition && answer.base_offset == offset,
                "expected offset {offset}: {}",
                context()
            );
        }
    }
    Ok(())
}
