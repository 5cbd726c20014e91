//! The copy floor of `scripts/perf.sh`: a TCP relay that does nothing but
//! copy bytes both ways (`tokio::io::copy_bidirectional`), on the same
//! runtime as the proxy. What it costs per GB is what any user-space proxy
//! built on tokio pays to move the bytes at all (two copies through user
//! space and the syscalls around them); the proxy's cost above it is its
//! own work.
//!
//!   cargo run --release --example tcp_relay -- LISTEN_ADDR TARGET_ADDR
//!
//! The broker must advertise LISTEN_ADDR (a listener of its own whose
//! advertised address is the relay), so clients stay on the relay. Like the
//! proxy it takes its worker threads from `MIRROR_PROXY_WORKER_THREADS`
//! (default: one per core).

use std::env;

use tokio::net::{TcpListener, TcpStream};

fn main() -> std::io::Result<()> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = env::var("MIRROR_PROXY_WORKER_THREADS")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .filter(|n| *n > 0)
    {
        runtime.worker_threads(n);
    }
    let runtime = runtime.enable_all().build()?;
    runtime.block_on(relay())
}

async fn relay() -> std::io::Result<()> {
    let mut args = env::args().skip(1);
    let (Some(listen), Some(target)) = (args.next(), args.next()) else {
        eprintln!("usage: tcp_relay LISTEN_ADDR TARGET_ADDR");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen).await?;
    eprintln!("relay ready: {listen} -> {target}");
    loop {
        let (mut client, _) = listener.accept().await?;
        let target = target.clone();
        tokio::spawn(async move {
            let Ok(mut upstream) = TcpStream::connect(&target).await else {
                return;
            };
            let _ = client.set_nodelay(true);
            let _ = upstream.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        });
    }
}
