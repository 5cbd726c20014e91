//! The failover barrier's bytes, read by Kafka's own tools: a segment file
//! holding only the barrier batch, dumped with `DumpLogSegments`, shows a
//! valid control batch with the fields SPEC §7 prescribes.

mod support;

use anyhow::{ensure, Context, Result};
use kafka_mirror_proxy::mirror::barrier::{barrier_batch, parse_barrier};
use kafka_mirror_proxy::mirror::pid::ClusterId;
use support::tools;

#[test]
fn kafkas_dump_tool_reads_the_barrier_as_a_valid_control_batch() -> Result<()> {
    let source = ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qg")?;
    let batch = barrier_batch(&source, 1_700_000_000_000)?;
    ensure!(parse_barrier(&batch)? == source, "round trip");
    // A log segment is batches back to back; this one holds the barrier at
    // offset 0, as a broker would have stamped it.
    let dir = tempfile::tempdir()?;
    let segment = dir.path().join("00000000000000000000.log");
    std::fs::write(&segment, &batch).context("writing the segment")?;
    let batches = tools::dump_log_segments(&segment, true)?;
    ensure!(batches.len() == 1, "batches: {batches:?}");
    let b = &batches[0];
    ensure!(b.is_valid, "Kafka finds the CRC invalid: {b:?}");
    ensure!(b.is_control && !b.is_transactional, "attributes: {b:?}");
    ensure!(
        b.producer_id == -1 && b.producer_epoch == -1 && b.base_sequence == -1,
        "producer fields: {b:?}"
    );
    ensure!(b.magic == 2 && b.count == 1, "magic and count: {b:?}");
    ensure!(b.compresscodec == "none", "codec: {b:?}");
    ensure!(
        b.timestamp_type == "CreateTime" && b.timestamp == 1_700_000_000_000,
        "time: {b:?}"
    );
    ensure!(
        b.size as usize == batch.len(),
        "size {} vs {}",
        b.size,
        batch.len()
    );
    ensure!(b.records.len() == 1, "records: {:?}", b.records);
    let r = &b.records[0];
    // Kafka 4.4 knows control types 0-6; ours is the seventh.
    ensure!(
        r.key_size == 4
            && r.value_size == 26
            && r.control.as_deref() == Some("controlType: UNKNOWN(7)"),
        "record: {r:?}"
    );
    Ok(())
}
