//! Free loopback ports for brokers and proxies started by the tests.
//!
//! A port the kernel hands out for `bind(…:0)` lies in its ephemeral range,
//! the same range every outgoing connection takes its local port from. A
//! port picked there and bound seconds later (a JVM starting, a proxy that
//! opens a node's listener only once a Metadata response names the node)
//! can meanwhile be the local end of some broker's or proxy's connection.
//! Ports are therefore picked below that range, at random, and checked by
//! binding them.

use std::net::{Ipv4Addr, TcpListener};

use anyhow::{Context, Result};

/// Lowest port handed out here: clear of the well-known and most
/// registered service ports.
const LOW: u16 = 12_000;

/// The first port of the kernel's ephemeral range (Linux), if it leaves
/// room below it.
fn ephemeral_low() -> Option<u16> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let low: u16 = range.split_whitespace().next()?.parse().ok()?;
    (low > LOW + 1_000).then_some(low)
}

/// A listener on a free loopback port outside the ephemeral range where
/// the kernel says where that is, else on one the kernel picks.
fn bind_free() -> Result<TcpListener> {
    if let Some(high) = ephemeral_low() {
        for _ in 0..1_000 {
            if let Ok(l) = TcpListener::bind((Ipv4Addr::LOCALHOST, fastrand::u16(LOW..high))) {
                return Ok(l);
            }
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("binding 127.0.0.1:0")
}

/// A free loopback port (racy by nature: it is released before the caller
/// binds it).
pub fn free_port() -> Result<u16> {
    Ok(bind_free()?.local_addr()?.port())
}

/// `n` distinct free loopback ports (each held until all are chosen, so
/// they differ).
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let held = (0..n).map(|_| bind_free()).collect::<Result<Vec<_>>>()?;
    held.iter().map(|l| Ok(l.local_addr()?.port())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() -> Result<()> {
        let ports = free_ports(20)?;
        let mut sorted = ports.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 20, "{ports:?}");
        // Whether they are still free is not asked: tests running beside
        // this one in the same binary take ports from the same range.
        if let Some(high) = ephemeral_low() {
            assert!(ports.iter().all(|p| (LOW..high).contains(p)), "{ports:?}");
        }
        Ok(())
    }
}
