//! Frame reading: any byte stream yields frames or an error, never a panic,
//! and never a frame over the maximum.

use crate::net::frame::FrameReader;
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

/// One input of the `frame` fuzz target.
pub fn frame(data: &[u8]) {
    runtime().block_on(async {
        let mut reader = FrameReader::new(data, MAX);
        let mut total = 0;
        while let Ok(Some(frame)) = reader.read_frame().await {
            assert!(frame.len() <= MAX);
            total += 4 + frame.len();
            assert!(total <= data.len());
        }
    });
}
