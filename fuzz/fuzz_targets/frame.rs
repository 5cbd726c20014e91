//! Frame reading: any byte stream yields frames or an error, never a panic,
//! and never a frame over the maximum.
#![no_main]

use kafka_mirror_proxy::wire::frame::FrameReader;
use libfuzzer_sys::fuzz_target;

const MAX: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().build() else {
        return;
    };
    rt.block_on(async {
        let mut reader = FrameReader::new(data, MAX);
        let mut total = 0;
        while let Ok(Some(frame)) = reader.read_frame().await {
            assert!(frame.len() <= MAX);
            total += 4 + frame.len();
            assert!(total <= data.len());
        }
    });
});
