//! The library's entry point, `kafka_mirror_proxy::server`, runs a proxy
//! inside a test's own process: it serves a real broker's clients, answers
//! its probes, and stops when asked, closing its listener, which is what
//! the binary does on SIGTERM.

mod support;

use std::collections::HashMap;
use std::net::TcpStream;

use anyhow::{ensure, Context, Result};

use kafka_mirror_proxy::Config;
use support::crate_client::create_topics;
use support::http;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::free_port_run;
use support::records::{producer, Topic};

const TOPIC: Topic = Topic {
    name: "embedded",
    partitions: 2,
};

#[test]
fn a_proxy_started_in_process_serves_and_stops_when_asked() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[(TOPIC.name, TOPIC.partitions)])?;
    let listen = free_port_run(2)?;
    let vars: HashMap<String, String> = [
        ("MIRROR_PROXY_BOOTSTRAP_SERVERS", broker.bootstrap()),
        ("MIRROR_PROXY_LISTEN", format!("127.0.0.1:{listen}")),
        ("MIRROR_PROXY_ADMIN_LISTEN", "127.0.0.1:0".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let config = Config::from_vars(&vars)?;

    let rt = tokio::runtime::Runtime::new()?;
    let running = rt.block_on(kafka_mirror_proxy::server::start(config))?;
    let bootstrap = running.bootstrap_addr().to_string();
    let admin = running.admin_addr();
    let (stop, stopped) = tokio::sync::mpsc::unbounded_channel::<()>();
    let stop_requests = futures_util::stream::unfold(stopped, |mut rx| async move {
        rx.recv().await.map(|()| ((), rx))
    });
    let served = rt.spawn(running.serve(stop_requests));

    let p = producer(&bootstrap, &[])?;
    TOPIC.send(&p, "embedded", 5)?;
    drop(p);
    let ends = TOPIC.ends(&rt, &broker.bootstrap())?;
    ensure!(
        ends == vec![5, 5],
        "the broker holds {ends:?}, not 5 a partition"
    );
    let log = TOPIC.read(&bootstrap, &ends)?;
    ensure!(
        log.values().map(Vec::len).sum::<usize>() == 10,
        "read back through the proxy: {log:?}"
    );
    let health = http::get(&admin.to_string(), "/healthz")?.text;
    ensure!(health.starts_with("HTTP/1.1 200"), "/healthz: {health}");

    stop.send(())
        .context("the proxy stopped listening for stop")?;
    rt.block_on(served)
        .context("the serving task panicked")?
        .context("the proxy stopped with an error")?;
    ensure!(
        TcpStream::connect(&bootstrap).is_err(),
        "{bootstrap} still accepts connections after the proxy stopped"
    );
    Ok(())
}
