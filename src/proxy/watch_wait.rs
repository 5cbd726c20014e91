//! A wait on a `watch` channel that is cheap to poll again and again.
//!
//! A connection's request loop polls its waits (for shutdown, for a change
//! of the link states) every time it waits for a frame. A `watch` wait that
//! is already registered takes a lock of its channel's waiter list on each
//! poll (tokio's `Notified` re-checks its waker under that lock), and every
//! connection waits on the same channels. Once registered, [`WatchWait`]
//! reads the channel's version instead (one atomic load) and polls the wait
//! it wraps only after a send on the channel or with a new waker.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::sync::watch;

/// `wait`, a wait on the channel of `probe`, polled only when the channel
/// may have changed since the last poll.
pub(crate) struct WatchWait<T, F> {
    probe: watch::Receiver<T>,
    wait: Pin<Box<F>>,
    /// The waker `wait` last returned `Pending` with; `None` before that
    /// and after it resolved.
    registered: Option<Waker>,
}

impl<T, F: Future> WatchWait<T, F> {
    /// `probe` must be subscribed to the channel `wait` waits on, before
    /// `wait` first looks at it (so that no send falls between the two).
    pub(crate) fn new(probe: watch::Receiver<T>, wait: F) -> Self {
        WatchWait {
            probe,
            wait: Box::pin(wait),
            registered: None,
        }
    }
}

impl<T, F: Future> Future for WatchWait<T, F> {
    type Output = F::Output;

    #[inline]
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        let same_waker = this
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        // A send bumps the version before it wakes the waiters, so a wait
        // that was woken finds the version moved. A closed channel (`Err`)
        // is left for `wait` to judge.
        if same_waker && matches!(this.probe.has_changed(), Ok(false)) {
            return Poll::Pending;
        }
        // Marked before `wait` looks: a send after this mark is seen by the
        // next poll, whether or not `wait` saw it now.
        this.probe.mark_unchanged();
        match this.wait.as_mut().poll(cx) {
            Poll::Pending => {
                if !same_waker {
                    this.registered = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            ready => {
                this.registered = None;
                ready
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::Wake;

    /// Counts its wakes.
    #[derive(Default)]
    struct Flag(AtomicUsize);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// A waker and how often it was woken.
    fn waker() -> (Waker, impl Fn() -> usize) {
        let flag = Arc::new(Flag::default());
        let waker = Waker::from(Arc::clone(&flag));
        (waker, move || flag.0.load(Ordering::SeqCst))
    }

    fn poll<F: Future>(wait: &mut WatchWait<bool, F>, waker: &Waker) -> Poll<F::Output> {
        Pin::new(wait).poll(&mut Context::from_waker(waker))
    }

    /// A wait on a fresh channel for `true`, and how often the wait it
    /// wraps was polled.
    fn setup() -> (
        watch::Sender<bool>,
        WatchWait<bool, impl Future<Output = bool>>,
        impl Fn() -> usize,
    ) {
        let (tx, mut rx) = watch::channel(false);
        let polls = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&polls);
        let mut inner = Box::pin(async move { rx.wait_for(|v| *v).await.is_ok() });
        let counted = std::future::poll_fn(move |cx| {
            counter.fetch_add(1, Ordering::SeqCst);
            inner.as_mut().poll(cx)
        });
        let wait = WatchWait::new(tx.subscribe(), counted);
        (tx, wait, move || polls.load(Ordering::SeqCst))
    }

    #[test]
    fn a_quiet_channel_is_not_polled_again() {
        let (_tx, mut wait, polls) = setup();
        let (w, woken) = waker();
        for _ in 0..100 {
            assert!(poll(&mut wait, &w).is_pending());
        }
        assert_eq!(polls(), 1);
        assert_eq!(woken(), 0);
    }

    #[test]
    fn a_send_wakes_and_is_seen() {
        let (tx, mut wait, polls) = setup();
        let (w, woken) = waker();
        assert!(poll(&mut wait, &w).is_pending());
        // A send the wait does not resolve on: polled once, then quiet.
        tx.send_replace(false);
        assert_eq!(woken(), 1);
        assert!(poll(&mut wait, &w).is_pending());
        assert!(poll(&mut wait, &w).is_pending());
        assert_eq!(polls(), 2);
        tx.send_replace(true);
        assert_eq!(woken(), 2);
        assert_eq!(poll(&mut wait, &w), Poll::Ready(true));
        assert_eq!(polls(), 3);
    }

    #[test]
    fn a_send_before_the_first_poll_is_seen() {
        let (tx, mut wait, _polls) = setup();
        tx.send_replace(true);
        assert_eq!(poll(&mut wait, &waker().0), Poll::Ready(true));
    }

    #[test]
    fn a_new_waker_is_registered() {
        let (tx, mut wait, polls) = setup();
        let ((first, first_woken), (second, second_woken)) = (waker(), waker());
        assert!(poll(&mut wait, &first).is_pending());
        assert!(poll(&mut wait, &second).is_pending());
        assert_eq!(polls(), 2);
        tx.send_replace(true);
        assert_eq!((first_woken(), second_woken()), (0, 1));
    }

    #[tokio::test]
    async fn resolves_in_a_task_after_many_quiet_polls() {
        let (tx, wait, _polls) = setup();
        let done = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let done = Arc::clone(&done);
            async move {
                let ok = wait.await;
                done.store(true, Ordering::SeqCst);
                ok
            }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!done.load(Ordering::SeqCst));
        tx.send_replace(true);
        assert!(matches!(task.await, Ok(true)));
    }
}
