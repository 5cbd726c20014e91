//! The record batch walker and the producer id patch. Input: a records
//! slice. Invariants: no panic; batches tile the slice; patching changes at
//! most 12 bytes and never changes whether the CRC holds.

use crate::wire::batch::{crc_is_valid, plan_producer_id_patch, BatchHeader, Batches};

/// One input of the `record_batches` fuzz target.
pub fn record_batches(data: &[u8]) {
    let mut end = 0;
    for batch in Batches::new(data) {
        let Ok(batch) = batch else { break };
        assert_eq!(batch.offset, end, "batches tile the slice");
        end = batch.offset + batch.len;
        assert!(end <= data.len());
        let bytes = &data[batch.range()];
        let Ok(header) = BatchHeader::parse(bytes) else {
            continue;
        };
        let new_pid = -(header.producer_id().wrapping_abs() | 1) - 1;
        let Ok(patch) = plan_producer_id_patch(bytes, new_pid) else {
            continue;
        };
        let mut patched = bytes.to_vec();
        patch.apply(&mut patched).expect("a fresh patch applies");
        let changed = bytes.iter().zip(&patched).filter(|(a, b)| a != b).count();
        assert!(changed <= 12);
        assert_eq!(crc_is_valid(bytes), crc_is_valid(&patched));
    }
}
