//! Whether the proxy can reach the broker behind each of its listeners.
//!
//! A client must not be able to tell a dead broker behind the proxy from a
//! dead broker: Kafka clients forget a cached coordinator or controller only
//! on a failed dial, not on a connection that is accepted and then dropped.
//! So while the proxy cannot reach broker n, node n's port is closed (the
//! kernel refuses connections), and it opens again as soon as a probe
//! reaches the broker. The bootstrap port does the same when no bootstrap
//! broker answers.
//!
//! A target goes down when an upstream connect fails, or when a probe after
//! an upstream connection was lost fails; connects still waiting on it are
//! failed at once, so an unreachable host holds clients for at most one
//! connect timeout.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::backoff::Backoff;
use tokio::sync::watch;

/// First delay between probes of a down broker; doubled up to [`PROBE_MAX`]
/// (with jitter, see [`Backoff`]).
pub const PROBE_MIN: Duration = Duration::from_millis(200);
pub const PROBE_MAX: Duration = Duration::from_secs(5);
/// A probe is a TCP connect: a broker that does not accept within this long
/// (or the connect timeout, if shorter) counts as unreachable for now.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Reachability of one target (a broker node, or the bootstrap brokers).
#[derive(Debug)]
pub struct Health {
    up: watch::Sender<bool>,
    /// A probe task is running for this target.
    probing: AtomicBool,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health {
            up: watch::Sender::new(true),
            probing: AtomicBool::new(false),
        })
    }

    pub fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Resolves when the target is (or becomes) down.
    pub async fn down(&self) {
        self.wait_for(false).await
    }

    /// Resolves when the target is (or becomes) up.
    pub async fn up(&self) {
        self.wait_for(true).await
    }

    async fn wait_for(&self, state: bool) {
        let mut rx = self.up.subscribe();
        if rx.wait_for(|up| *up == state).await.is_err() {
            // The sender lives as long as `self`: not reached.
            std::future::pending::<()>().await;
        }
    }

    /// Marks the target down; true if it was up.
    pub fn mark_down(&self) -> bool {
        self.up.send_if_modified(|up| std::mem::replace(up, false))
    }

    /// Marks the target up; true if it was down.
    pub fn mark_up(&self) -> bool {
        self.up.send_if_modified(|up| !std::mem::replace(up, true))
    }

    /// Claims the right to run the one probe task of this target.
    pub fn start_probing(&self) -> bool {
        !self.probing.swap(true, Ordering::AcqRel)
    }

    pub fn stop_probing(&self) {
        self.probing.store(false, Ordering::Release);
    }
}

/// Can any of `addrs` be reached with a TCP connect? (Reachability only:
/// TLS and SASL are the sessions' business.)
pub async fn reachable(addrs: &[String], connect_timeout: Duration) -> bool {
    let timeout = connect_timeout.min(PROBE_TIMEOUT);
    for addr in addrs {
        if let Ok(Ok(_)) = tokio::time::timeout(timeout, TcpStream::connect(addr.as_str())).await {
            return true;
        }
    }
    false
}

/// The waits between probes of a down broker.
pub fn probe_backoff() -> Backoff {
    Backoff::new(PROBE_MIN, PROBE_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_report_changes_only() {
        let h = Health::new();
        assert!(h.is_up());
        assert!(!h.mark_up());
        assert!(h.mark_down());
        assert!(!h.mark_down());
        assert!(!h.is_up());
        assert!(h.mark_up());
        assert!(h.is_up());
    }

    #[test]
    fn one_prober_at_a_time() {
        let h = Health::new();
        assert!(h.start_probing());
        assert!(!h.start_probing());
        h.stop_probing();
        assert!(h.start_probing());
    }

    #[test]
    fn probes_back_off_from_200_ms_to_5_s() {
        let mut b = probe_backoff();
        assert_eq!(b.peek(), PROBE_MIN);
        b.next_delay();
        assert_eq!(b.peek(), Duration::from_millis(400));
        for _ in 0..8 {
            b.next_delay();
        }
        assert_eq!(b.peek(), PROBE_MAX);
    }

    #[tokio::test]
    async fn reachability_is_a_tcp_connect() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let open = listener.local_addr().expect("addr").to_string();
        drop(listener);
        assert!(!reachable(std::slice::from_ref(&open), Duration::from_secs(1)).await);
        let listener = tokio::net::TcpListener::bind(&open).await.expect("rebind");
        assert!(reachable(&["127.0.0.1:1".into(), open], Duration::from_secs(1)).await);
        drop(listener);
    }

    #[tokio::test]
    async fn waiters_wake_on_change() {
        let h = Health::new();
        let waiter = {
            let h = Arc::clone(&h);
            tokio::spawn(async move { h.down().await })
        };
        tokio::task::yield_now().await;
        h.mark_down();
        assert!(tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .is_ok());
        // Already down: resolves at once.
        h.down().await;
    }
}
