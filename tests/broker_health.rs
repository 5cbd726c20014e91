//! A broker's death as the proxy sees it: from its own upstream
//! connections, not only from the next client's failed connect. A client
//! must find a dead broker's node port closed (connection refused, as the
//! broker's own port is) without a client first being accepted and dropped,
//! and the port must serve again once the broker is back.

mod support;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};

use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{partition_result, record_batch, RawClient};

/// What a client sees when it dials `addr` and asks for ApiVersions.
#[derive(Debug, PartialEq)]
enum Dial {
    Refused,
    /// Accepted, then closed without an answer.
    Dropped,
    Served,
}

fn dial(addr: &str) -> Dial {
    let mut client = match RawClient::connect(addr) {
        Ok(c) => c,
        Err(e) => {
            let refused = e
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused);
            return if refused {
                Dial::Refused
            } else {
                Dial::Dropped
            };
        }
    };
    let sent = client.send(
        ApiKey::ApiVersions,
        3,
        "dial",
        &ApiVersionsRequest::default(),
    );
    match (sent, client.recv_frame()) {
        (Ok(_), Ok(Some(_))) => Dial::Served,
        _ => Dial::Dropped,
    }
}

const UNREACHABLE: &str = "kafka_mirror_proxy_broker_unreachable{listener=\"node-1\"}";

#[test]
fn a_killed_brokers_node_port_is_refused_before_any_client_is_dropped() -> Result<()> {
    let mut broker = KafkaCluster::start(KafkaOptions::default())?;
    let proxy = ProxyProcess::start(&broker.bootstrap(), &[])?;
    // Opens node 1's listener.
    tools::create_topic(&proxy.bootstrap, "health", 1, &[], &[])?;
    let node = proxy.node_address(1);
    ensure!(
        dial(&node) == Dial::Served,
        "node port not serving at first"
    );

    // A client with a connection open through the node port.
    let mut kept = RawClient::connect(&node)?;
    kept.send(
        ApiKey::ApiVersions,
        3,
        "kept",
        &ApiVersionsRequest::default(),
    )?;
    ensure!(
        kept.recv_frame()?.is_some(),
        "no answer on the kept connection"
    );

    broker.node().kill();
    // The proxy sees its upstream connection end and closes the client's.
    ensure!(
        kept.closed_by_peer(),
        "the kept connection stayed open after its broker was killed"
    );

    // No client dials in the meantime: the proxy must find out by itself,
    // from the connection it lost. Bounded poll, not a timing assertion.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut down = proxy.metric(UNREACHABLE)? == 1;
    while !down && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        down = proxy.metric(UNREACHABLE)? == 1;
    }
    ensure!(
        down,
        "node 1 not marked unreachable within 10 s of losing its upstream connection\n{}",
        proxy.logs()
    );
    // The very first new client is refused by the kernel, not accepted and
    // dropped.
    let first = dial(&node);
    ensure!(
        first == Dial::Refused,
        "the first client after the broker's death was not refused: {first:?}"
    );

    broker.node().restart()?;
    // Probes back off to 5 s at most: the port serves again soon after.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = dial(&node);
    while last != Dial::Served && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        last = dial(&node);
    }
    ensure!(
        last == Dial::Served,
        "node port not served after the broker came back: {last:?}"
    );
    // A produce through the node port works (the partition's leadership may
    // take a moment to settle after the restart: retried, bounded).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut result = (-1, None);
    while Instant::now() < deadline {
        let mut c = RawClient::connect(&node)?;
        let r = c
            .produce("health", "health", 0, record_batch(-1, &["back"]))
            .context("produce after the restart")?;
        result = partition_result(&r);
        if result.0 == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    ensure!(
        result.0 == 0,
        "produce after the restart failed: {result:?}"
    );
    ensure!(
        proxy.metric(UNREACHABLE)? == 0,
        "metrics still show node 1 unreachable"
    );
    Ok(())
}
