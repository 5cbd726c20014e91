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
//!
//! A killed broker's connections can end a moment before its listening
//! socket does (the kernel closes a dead process's sockets one by one), so
//! one probe right after a lost connection may still be accepted. After a
//! loss the broker therefore counts as reachable only if a few probes spread
//! over [`LOSS_PROBES`] (1.5 s) all connect, and a probe's connection must also stay
//! open for [`PROBE_HOLD`] (a listener closing with it in its backlog resets
//! it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpStream;

use super::backoff::Backoff;
use tokio::sync::watch;

/// First delay between probes of a down broker; doubled up to [`PROBE_MAX`]
/// (with jitter, see [`Backoff`]).
pub(crate) const PROBE_MIN: Duration = Duration::from_millis(200);
pub(crate) const PROBE_MAX: Duration = Duration::from_secs(5);
/// A probe is a TCP connect: a broker that does not accept within this long
/// (or the connect timeout, if shorter) counts as unreachable for now.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// A probe's connection must not be closed by the broker within this long.
/// Brokers never close a fresh connection on their own, so a close this
/// soon means the listener went away with the connection in its backlog.
pub(crate) const PROBE_HOLD: Duration = Duration::from_millis(100);
/// After an upstream connection was lost: the waits before each probe that
/// must all succeed for the broker to count as still there (about 1.5 s in
/// all, so a dying broker is caught while it tears down).
const LOSS_PROBES: [Duration; 5] = [
    Duration::ZERO,
    Duration::from_millis(100),
    Duration::from_millis(200),
    Duration::from_millis(400),
    Duration::from_millis(800),
];

/// Reachability of one target (a broker node, or the bootstrap brokers).
#[derive(Debug)]
pub(crate) struct Health {
    up: watch::Sender<bool>,
    /// A probe task is running for this target.
    probing: AtomicBool,
}

impl Health {
    pub(crate) fn new() -> Arc<Health> {
        Arc::new(Health {
            up: watch::Sender::new(true),
            probing: AtomicBool::new(false),
        })
    }

    pub(crate) fn is_up(&self) -> bool {
        *self.up.borrow()
    }

    /// Resolves when the target is (or becomes) down.
    pub(crate) async fn down(&self) {
        self.wait_for(false).await
    }

    /// Resolves when the target is (or becomes) up.
    pub(crate) async fn up(&self) {
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
    pub(crate) fn mark_down(&self) -> bool {
        self.up.send_if_modified(|up| std::mem::replace(up, false))
    }

    /// Marks the target up; true if it was down.
    pub(crate) fn mark_up(&self) -> bool {
        self.up.send_if_modified(|up| !std::mem::replace(up, true))
    }

    /// Claims the right to run the one probe task of this target.
    pub(crate) fn start_probing(&self) -> bool {
        !self.probing.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn stop_probing(&self) {
        self.probing.store(false, Ordering::Release);
    }
}

/// Can any of `addrs` be reached with a TCP connect? (Reachability only:
/// TLS and SASL are the sessions' business.)
pub(crate) async fn reachable(addrs: &[String], connect_timeout: Duration) -> bool {
    let timeout = connect_timeout.min(PROBE_TIMEOUT);
    for addr in addrs {
        if let Ok(Ok(tcp)) = tokio::time::timeout(timeout, TcpStream::connect(addr.as_str())).await
        {
            if stays_open(&tcp).await {
                return true;
            }
        }
    }
    false
}

/// [`reachable`], checked by every probe of [`LOSS_PROBES`]: false as soon
/// as one fails. For a target whose upstream connection just ended.
pub(crate) async fn confirmed_reachable(addrs: &[String], connect_timeout: Duration) -> bool {
    for wait in LOSS_PROBES {
        tokio::time::sleep(wait).await;
        if !reachable(addrs, connect_timeout).await {
            return false;
        }
    }
    true
}

/// Whether the peer leaves a fresh connection open for [`PROBE_HOLD`]: an
/// end of stream or a reset in that time means nobody is serving it.
async fn stays_open(tcp: &TcpStream) -> bool {
    let mut buf = [0u8; 1];
    match tokio::time::timeout(PROBE_HOLD, tcp.peek(&mut buf)).await {
        Err(_) => true,
        Ok(Ok(n)) => n > 0,
        Ok(Err(_)) => false,
    }
}

/// The waits between probes of a down broker.
pub(crate) fn probe_backoff() -> Backoff {
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
    async fn a_connection_closed_at_once_is_unreachable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        // Accepts and closes every connection, as a dying listener does to
        // the ones in its backlog.
        let closer = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                drop(tcp);
            }
        });
        assert!(!reachable(std::slice::from_ref(&addr), Duration::from_secs(1)).await);
        closer.abort();
        // A listener that keeps its connections open is reachable, also
        // after a loss (every confirming probe succeeds).
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
        let keeper = tokio::spawn(async move {
            let mut kept = Vec::new();
            while let Ok((tcp, _)) = listener.accept().await {
                kept.push(tcp);
            }
        });
        assert!(confirmed_reachable(std::slice::from_ref(&addr), Duration::from_secs(1)).await);
        keeper.abort();
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
