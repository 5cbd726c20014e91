//! The failover barrier's bytes, read by Kafka's own tools: a segment file
//! holding only the barrier batch, dumped with `DumpLogSegments`, shows a
//! valid control batch with the fields SPEC §7 prescribes. And the barrier
//! placed in every partition of a real broker's topic: refused by the stock
//! broker (INVALID_RECORD), recorded in the state topic with the bytes that
//! went over the wire, placed once per failover.

mod support;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use kafka_mirror_proxy::client::protocol::OffsetSpec;
use kafka_mirror_proxy::control::barriers::{place, BarrierResult};
use kafka_mirror_proxy::metrics::Metrics;
use kafka_mirror_proxy::mirror::barrier::{barrier_batch, parse_barrier};
use kafka_mirror_proxy::mirror::link_state::{LinkState, LinkStatus};
use kafka_mirror_proxy::mirror::pid::ClusterId;
use kafka_mirror_proxy::mirror::state_records::StateRecord;
use kafka_mirror_proxy::state::StateStore;
use support::capture::CaptureRelay;
use support::crate_client::{client, new_topic, runtime, state_records};
use support::tools;
use support::wire::record_batch;

const STATE: &str = "__mirror_state";
const INVALID_RECORD: i16 = 87;

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

/// The SPEC §7 layout, field by field, of a barrier as recorded.
fn check_layout(batch: &[u8], source: &ClusterId, timestamp_ms: i64) -> Result<()> {
    ensure!(batch.len() == 98, "barrier size {}", batch.len());
    let i16_at = |o: usize| i16::from_be_bytes([batch[o], batch[o + 1]]);
    let i32_at = |o: usize| i32::from_be_bytes(batch[o..o + 4].try_into().unwrap_or_default());
    let i64_at = |o: usize| i64::from_be_bytes(batch[o..o + 8].try_into().unwrap_or_default());
    ensure!(
        i64_at(0) == 0 && i32_at(12) == 0,
        "base offset, leader epoch"
    );
    ensure!(batch[16] == 2, "magic {}", batch[16]);
    ensure!(i16_at(21) == 0x0020, "attributes {:#06x}", i16_at(21));
    ensure!(i32_at(23) == 0, "last offset delta");
    ensure!(
        i64_at(27) == timestamp_ms && i64_at(35) == timestamp_ms,
        "timestamps"
    );
    ensure!(
        i64_at(43) == -1 && i16_at(51) == -1 && i32_at(53) == -1,
        "producer id, epoch, base sequence"
    );
    ensure!(i32_at(57) == 1, "record count {}", i32_at(57));
    // The record: control key {0, 7}, then the 26-byte MirrorPidResetRecord.
    let key = [0u8, 0, 0, 7];
    let pos = batch
        .windows(4)
        .position(|w| w == key)
        .context("control key {0, 7}")?;
    let value = &batch[pos + 5..pos + 5 + 26];
    ensure!(
        value[..3] == [0, 0, 23],
        "value version and length: {value:?}"
    );
    ensure!(&value[3..25] == source.to_string().as_bytes(), "source id");
    ensure!(value[25] == 0, "tagged fields");
    ensure!(parse_barrier(batch)? == *source, "parse_barrier");
    ensure!(
        batch == barrier_batch(source, timestamp_ms)?.as_slice(),
        "the recorded barrier is the pure codec's"
    );
    Ok(())
}

#[test]
fn every_partition_gets_its_barrier_refused_by_a_stock_broker_and_recorded_once() -> Result<()> {
    // The proxy's client reaches the broker through a recording relay, so
    // the bytes on the wire can be compared with the recorded ones.
    let (relay, _broker) = CaptureRelay::start_with_broker()?;
    let rt = runtime()?;
    let source = ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qg")?;
    let client = client(&relay.address());
    rt.block_on(async {
        client.create_topic(&new_topic("orders", 3, &[])).await?;
        // Partition p holds p + 1 records before the failover.
        for p in 0..3 {
            let values: Vec<String> = (0..=p).map(|i| format!("v{i}")).collect();
            let values: Vec<&str> = values.iter().map(String::as_str).collect();
            client
                .produce("orders", p, record_batch(-1, &values))
                .await?;
        }
        let store = StateStore::with_client(
            client.clone(),
            STATE.into(),
            vec![source],
            Arc::new(Metrics::default()),
            i64::MAX,
        );
        store.start(&Default::default());
        for _ in 0..300 {
            if store.is_loaded() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(
            store.is_loaded(),
            "state topic not loaded: {:?}",
            store.not_ready_reason()
        );

        // A barrier record applies only while its link is STOPPING under
        // its failover, as when the proxy runs one.
        link_state(&store, &source, LinkState::Stopping, 7).await?;
        let mut outcomes = Vec::new();
        for p in 0..3 {
            outcomes.push(place(&store, "east", &source, 7, "orders", p).await);
        }
        for (p, o) in outcomes.iter().enumerate() {
            ensure!(
                o.result == BarrierResult::Refused && o.error_code == INVALID_RECORD,
                "partition {p}: {o:?}"
            );
            ensure!(o.log_end_offset == p as i64 + 1, "partition {p}: {o:?}");
            ensure!(o.recorded_at_ms > 0, "partition {p}: {o:?}");
        }

        // Recorded: one barrier record per partition, the SPEC layout, the
        // bytes the broker was sent.
        let records = state_records(&client, STATE).await?;
        let barriers: Vec<_> = records
            .iter()
            .filter_map(|(_, r)| match r {
                StateRecord::Barrier(k, Some(v)) => Some((k.clone(), v.clone())),
                _ => None,
            })
            .collect();
        ensure!(barriers.len() == 3, "barrier records: {barriers:?}");
        let sent: Vec<Vec<u8>> = relay
            .exchanges()
            .into_iter()
            .filter(|e| e.api_key == 0)
            .map(|e| e.request)
            .collect();
        for (k, v) in &barriers {
            ensure!(k.link == "east" && v.failover_id == 7, "{k:?} {v:?}");
            ensure!(!v.accepted && v.error_code == INVALID_RECORD, "{v:?}");
            ensure!(v.source == source, "{v:?}");
            ensure!(
                v.log_end_offset == i64::from(k.partition) + 1,
                "{k:?} {v:?}"
            );
            check_layout(&v.batch, &source, v.timestamp_ms)?;
            ensure!(
                sent.iter().any(|frame| frame
                    .windows(v.batch.len())
                    .any(|w| w == v.batch.as_slice())),
                "partition {}: the recorded barrier is not among the Produce requests sent",
                k.partition
            );
        }

        // Placed once per failover: again for failover 7 sends and records
        // nothing; failover 8 places a new one.
        link_state(&store, &source, LinkState::Stopped, 7).await?;
        link_state(&store, &source, LinkState::Mirroring, 7).await?;
        link_state(&store, &source, LinkState::Stopping, 8).await?;
        let end = client
            .list_offset(STATE, 0, OffsetSpec::Latest)
            .await?
            .offset;
        let again = place(&store, "east", &source, 7, "orders", 0).await;
        ensure!(again.result == BarrierResult::Refused, "{again:?}");
        ensure!(
            again.recorded_at_ms == outcomes[0].recorded_at_ms,
            "{again:?}"
        );
        let after = client
            .list_offset(STATE, 0, OffsetSpec::Latest)
            .await?
            .offset;
        ensure!(
            after == end,
            "a second place of the same failover wrote to the state topic"
        );
        let next = place(&store, "east", &source, 8, "orders", 0).await;
        ensure!(next.result == BarrierResult::Refused, "{next:?}");
        let after = client
            .list_offset(STATE, 0, OffsetSpec::Latest)
            .await?
            .offset;
        ensure!(
            after == end + 1,
            "failover 8 recorded {} records",
            after - end
        );
        Ok(())
    })
}

/// Persist link `east` in `state` under failover `id`, as the failover and
/// `start` write it.
async fn link_state(
    store: &StateStore,
    source: &ClusterId,
    state: LinkState,
    id: i64,
) -> Result<()> {
    let status = LinkStatus {
        state,
        since_ms: id,
        source: *source,
        failover_id: id,
        failover_started_ms: id,
        failover_finished_ms: if state == LinkState::Stopping { -1 } else { id },
    };
    ensure!(
        store.write_link_state("east", status).await?,
        "{status:?} not applied over {:?}",
        store.link_status("east")
    );
    Ok(())
}
