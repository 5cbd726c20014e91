//! The process's background tasks, owned: the state topic's loader and
//! expiry, the link control's loops and failover runs, the broker probes,
//! the listeners and the admin endpoint are spawned through [`Tasks`], and
//! at shutdown they are stopped together and waited for (bounded), instead
//! of being dropped with the runtime wherever they stand.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

#[derive(Clone, Default)]
pub struct Tasks {
    tracker: TaskTracker,
    stop: CancellationToken,
}

impl Tasks {
    /// Run `task` until it ends or [`shutdown`](Self::shutdown) stops it
    /// (dropped at its next await point).
    pub(crate) fn spawn<F>(&self, task: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = self.stop.clone();
        self.tracker.spawn(async move {
            tokio::select! {
                () = task => {}
                () = stop.cancelled() => {}
            }
        });
    }

    /// Stop every task and wait at most `timeout` for them to end; how
    /// many were still running then.
    pub(crate) async fn shutdown(&self, timeout: Duration) -> usize {
        self.stop.cancel();
        self.tracker.close();
        match tokio::time::timeout(timeout, self.tracker.wait()).await {
            Ok(()) => 0,
            Err(_) => self.tracker.len(),
        }
    }

    /// Tasks running now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.tracker.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.tracker.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    #[tokio::test(start_paused = true)]
    async fn shutdown_stops_and_waits_for_every_task() {
        let tasks = Tasks::default();
        let dropped = Arc::new(AtomicBool::new(false));
        struct Flag(Arc<AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Flag(Arc::clone(&dropped));
        tasks.spawn(async move {
            let _flag = flag;
            std::future::pending::<()>().await;
        });
        tasks.spawn(async {});
        tokio::task::yield_now().await;
        assert_eq!(tasks.len(), 1, "the finished task is gone, the loop runs");
        assert_eq!(tasks.shutdown(Duration::from_secs(1)).await, 0);
        assert!(
            dropped.load(Ordering::SeqCst),
            "the loop's state was dropped"
        );
        assert!(tasks.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_ignores_the_stop_is_counted_at_the_timeout() {
        let tasks = Tasks::default();
        // Spawned on the tracker directly: nothing stops it.
        tasks.tracker.spawn(std::future::pending::<()>());
        assert_eq!(tasks.shutdown(Duration::from_secs(1)).await, 1);
    }
}
