//! The responses one connection owes, in request order: the request loop
//! pushes each request's pending response, the response loop pops them.
//! At most a fixed number wait (the request loop stops reading until there
//! is room: backpressure on a client that pipelines more than that).
//!
//! The queue also counts the requests that are at the broker and not yet
//! answered, so the request loop can wait until the broker has answered
//! them all: a broker reads nothing more from a connection while it holds
//! one of its requests (a Fetch long poll), so a large frame read meanwhile
//! would hold shared memory until the broker lets go.
//!
//! Unlike a tokio channel, which allocates a block of 32 slots when it is
//! created, the queue holds no memory while it has never been used, and
//! only what the connection's own pipelining needed after: an idle
//! connection's cost is its socket buffers and its task.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::{Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

/// One pusher (the request loop) and one popper (the response loop): each
/// side has at most one waiter, so a waiting side is a stored waker, not a
/// waiter list. Every push and pop is one uncontended lock.
pub(crate) struct Queue<T> {
    inner: Mutex<Inner<T>>,
    max: usize,
}

struct Inner<T> {
    items: VecDeque<T>,
    closed: bool,
    /// The popper, while it waits for an entry.
    popper: Option<Waker>,
    /// The pusher, while it waits for room.
    pusher: Option<Waker>,
    /// Requests written to the broker whose answer has not arrived.
    at_broker: usize,
    /// The request loop, while it waits for `at_broker` to be 0.
    quiet: Option<Waker>,
}

impl<T> Queue<T> {
    /// A queue of at most `max` entries.
    pub(crate) fn new(max: usize) -> Queue<T> {
        Queue {
            inner: Mutex::new(Inner {
                items: VecDeque::new(),
                closed: false,
                popper: None,
                pusher: None,
                at_broker: 0,
                quiet: None,
            }),
            max,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        crate::sync::lock(&self.inner)
    }

    /// Append `item` once there is room; `at_broker`: its request was
    /// written to the broker, which owes an answer (see
    /// [`broker_answered`](Self::broker_answered)).
    pub(crate) async fn push(&self, item: T, at_broker: bool) {
        let mut item = Some(item);
        poll_fn(|cx| {
            let mut q = self.lock();
            if q.items.len() >= self.max {
                wait_on(&mut q.pusher, cx);
                return Poll::Pending;
            }
            if let Some(item) = item.take() {
                self.append(q, item, at_broker);
            }
            Poll::Ready(())
        })
        .await
    }

    /// [`push`](Self::push) without waiting: `item` is appended if there is
    /// room, else given back. The request loop's usual case (a queue with
    /// room) then costs one lock, with no future and no wait set up.
    pub(crate) fn try_push(&self, item: T, at_broker: bool) -> Result<(), T> {
        let q = self.lock();
        if q.items.len() >= self.max {
            return Err(item);
        }
        self.append(q, item, at_broker);
        Ok(())
    }

    /// Append `item` under the lock `q`, then wake the popper.
    fn append(&self, mut q: MutexGuard<'_, Inner<T>>, item: T, at_broker: bool) {
        q.items.push_back(item);
        q.at_broker += usize::from(at_broker);
        let popper = q.popper.take();
        drop(q);
        if let Some(w) = popper {
            w.wake();
        }
    }

    /// The oldest entry; `None` once the queue is closed and empty.
    pub(crate) async fn pop(&self) -> Option<T> {
        poll_fn(|cx| {
            let mut q = self.lock();
            match q.items.pop_front() {
                Some(item) => {
                    let pusher = q.pusher.take();
                    drop(q);
                    if let Some(w) = pusher {
                        w.wake();
                    }
                    Poll::Ready(Some(item))
                }
                None if q.closed => Poll::Ready(None),
                None => {
                    wait_on(&mut q.popper, cx);
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// No more pushes: [`pop`](Self::pop) returns `None` once the queue is
    /// empty.
    pub(crate) fn close(&self) {
        let mut q = self.lock();
        q.closed = true;
        let popper = q.popper.take();
        drop(q);
        if let Some(w) = popper {
            w.wake();
        }
    }

    /// The broker answered the oldest request it held.
    pub(crate) fn broker_answered(&self) {
        let mut q = self.lock();
        q.at_broker = q.at_broker.saturating_sub(1);
        let quiet = if q.at_broker == 0 {
            q.quiet.take()
        } else {
            None
        };
        drop(q);
        if let Some(w) = quiet {
            w.wake();
        }
    }

    /// Requests at the broker, not answered yet.
    pub(crate) fn at_broker(&self) -> usize {
        self.lock().at_broker
    }

    /// Resolves once the broker has answered every request it was sent.
    pub(crate) async fn broker_quiet(&self) {
        poll_fn(|cx| {
            let mut q = self.lock();
            if q.at_broker == 0 {
                return Poll::Ready(());
            }
            wait_on(&mut q.quiet, cx);
            Poll::Pending
        })
        .await
    }

    /// Entries waiting.
    pub(crate) fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Store `cx`'s waker in `slot`, cloning it only if it is a new one.
fn wait_on(slot: &mut Option<Waker>, cx: &Context<'_>) {
    match slot {
        Some(w) if w.will_wake(cx.waker()) => {}
        _ => *slot = Some(cx.waker().clone()),
    }
}

/// Closes its queue when dropped: the request loop's end, however it ends.
pub(crate) struct CloseOnDrop<'a, T>(pub &'a Queue<T>);

impl<T> Drop for CloseOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn entries_come_out_in_order_then_none_after_close() {
        let q = Queue::new(4);
        q.push(1, false).await;
        q.push(2, false).await;
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop().await, Some(1));
        q.push(3, false).await;
        q.close();
        assert_eq!(q.pop().await, Some(2));
        assert_eq!(q.pop().await, Some(3));
        assert_eq!(q.pop().await, None);
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn the_broker_is_quiet_once_it_answered_every_request_it_was_sent() {
        let q = Arc::new(Queue::new(8));
        q.push(1, true).await;
        q.push(2, false).await;
        q.push(3, true).await;
        assert_eq!(q.at_broker(), 2);
        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.broker_quiet().await })
        };
        assert_eq!(q.pop().await, Some(1));
        q.broker_answered();
        assert_eq!(q.pop().await, Some(2));
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished(), "request 3 is still at the broker");
        assert_eq!(q.pop().await, Some(3));
        q.broker_answered();
        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken by the last answer")
            .expect("task");
        assert_eq!(q.at_broker(), 0);
    }

    #[tokio::test]
    async fn a_new_queue_holds_no_memory() {
        let q: Queue<[u8; 128]> = Queue::new(512);
        assert_eq!(q.lock().items.capacity(), 0);
    }

    #[tokio::test]
    async fn try_push_appends_while_there_is_room_and_gives_the_item_back_when_full() {
        let q = Queue::new(2);
        assert_eq!(q.try_push(1, true), Ok(()));
        assert_eq!(q.try_push(2, false), Ok(()));
        assert_eq!(q.try_push(3, true), Err(3), "full: the item comes back");
        assert_eq!(q.len(), 2);
        assert_eq!(q.at_broker(), 1, "only what was appended counts");
        assert_eq!(q.pop().await, Some(1));
        assert_eq!(q.try_push(3, true), Ok(()));
        assert_eq!(q.at_broker(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_makes_the_pusher_wait_for_room() {
        let q = Arc::new(Queue::new(2));
        q.push(1, false).await;
        q.push(2, false).await;
        let pusher = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.push(3, false).await })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!pusher.is_finished(), "no room: the third push waits");
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop().await, Some(1));
        tokio::time::timeout(Duration::from_secs(1), pusher)
            .await
            .expect("room made: the push completes")
            .expect("task");
        assert_eq!(q.pop().await, Some(2));
        assert_eq!(q.pop().await, Some(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_pop_given_up_while_waiting_takes_nothing() {
        // The response loop's `select!` drops a waiting pop when the broker
        // speaks out of turn: the entry pushed after must still be there.
        let q = Queue::new(2);
        let given_up = tokio::time::timeout(Duration::from_millis(10), q.pop()).await;
        assert!(given_up.is_err(), "nothing to pop yet");
        q.push(5, false).await;
        assert_eq!(q.len(), 1);
        assert_eq!(q.pop().await, Some(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_pop_wakes_on_push_and_on_close() {
        let q = Arc::new(Queue::new(8));
        let popper = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { (q.pop().await, q.pop().await) })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!popper.is_finished());
        q.push(7, false).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!popper.is_finished(), "the second pop waits");
        drop(CloseOnDrop(&*q));
        let got = tokio::time::timeout(Duration::from_secs(1), popper)
            .await
            .expect("woken by the close")
            .expect("task");
        assert_eq!(got, (Some(7), None));
    }
}
