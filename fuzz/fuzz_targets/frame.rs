//! Frame reading: any byte stream yields frames or an error, never a panic,
//! and never a frame over the maximum.
#![no_main]

use kafka_mirror_proxy::net::frame::FrameReader;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const MAX: usize = 64 * 1024;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a current-thread runtime")
    })
}

fuzz_target!(|data: &[u8]| {
    runtime().block_on(async {
        let mut reader = FrameReader::new(data, MAX);
        let mut total = 0;
        while let Ok(Some(frame)) = reader.read_frame().await {
            assert!(frame.len() <= MAX);
            total += 4 + frame.len();
            assert!(total <= data.len());
        }
    });
});
