//! A TCP relay that adds a fixed delay to each direction: the "far away"
//! source of `scripts/replicate-bench.sh` (issue 42), where no kernel delay
//! (netem) is available. With 25 ms each way, a client behind it sees a
//! 50 ms round trip to the broker in front of which it stands.
//!
//!   cargo run --release --example delay_relay -- LISTEN_ADDR TARGET_ADDR DELAY_MS
//!
//! Each direction of a connection is a reader and a writer joined by a
//! queue: the reader stamps every chunk it reads with the time it was read
//! plus the delay, and the writer sends each chunk, in order, once its time
//! has come. Reading never waits for writing, so many chunks are on the way
//! at once, as bytes are on a long link: the delay is added to every byte,
//! not paid once per chunk, and throughput is not limited (up to
//! `MAX_CHUNKS_IN_FLIGHT` chunks of up to `CHUNK` bytes each way; past that
//! the reader waits, and TCP flow control pushes back on the sender).
//!
//! Unlike a real long link, the relay's own sockets are local, so the TCP
//! windows of the two ends do not bound the bytes in flight: a client with
//! a small receive buffer is not held back here as it would be across a
//! real 50 ms path. The relay models latency, not a window-limited path.
//!
//! The broker must advertise LISTEN_ADDR (a listener of its own whose
//! advertised address is the relay), so clients stay on the relay.

use std::env;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{sleep_until, Instant};

/// Bytes asked for by one read.
const CHUNK: usize = 64 * 1024;
/// Chunks read and not yet written, per direction of a connection: enough
/// for 4096 reads in one delay (with 25 ms, 160,000 reads/s or 10 GB/s of
/// full chunks), so the queue never sets the pace; at most 256 MiB.
const MAX_CHUNKS_IN_FLIGHT: usize = 4096;

fn main() -> std::io::Result<()> {
    let mut args = env::args().skip(1);
    let (Some(listen), Some(target), Some(delay)) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: delay_relay LISTEN_ADDR TARGET_ADDR DELAY_MS");
        std::process::exit(2);
    };
    let Ok(delay_ms) = delay.parse::<u64>() else {
        eprintln!("delay_relay: DELAY_MS must be a whole number of milliseconds, got {delay}");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(relay(listen, target, Duration::from_millis(delay_ms)))
}

async fn relay(listen: String, target: String, delay: Duration) -> std::io::Result<()> {
    let listener = TcpListener::bind(&listen).await?;
    eprintln!("delay relay ready: {listen} -> {target}, {delay:?} each way");
    loop {
        let (client, _) = listener.accept().await?;
        let target = target.clone();
        tokio::spawn(async move {
            let Ok(upstream) = TcpStream::connect(&target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let (client_read, client_write) = client.into_split();
            let (upstream_read, upstream_write) = upstream.into_split();
            tokio::join!(
                direction(client_read, upstream_write, delay),
                direction(upstream_read, client_write, delay),
            );
        });
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read.
/// Ends when `from` ends (then `to` is shut down for writing, after the
/// last chunk, so a half-close travels with the same delay) or when `to`
/// fails (then the reader stops at its next chunk and drops `from`).
async fn direction(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, delay: Duration) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Bytes)>(MAX_CHUNKS_IN_FLIGHT);
    let reader = async move {
        let mut buf = BytesMut::new();
        loop {
            buf.reserve(CHUNK);
            match from.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let due = Instant::now() + delay;
                    if tx.send((due, buf.split().freeze())).await.is_err() {
                        break;
                    }
                }
            }
        }
        // Dropping `tx` lets the writer drain what is queued, then stop.
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(reader, writer);
}
