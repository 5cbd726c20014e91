//! The responses one connection owes, in request order: the request loop
//! pushes each request's pending response, the response loop pops them.
//! At most a fixed number wait (the request loop stops reading until there
//! is room: backpressure on a client that pipelines more than that).
//!
//! Unlike a tokio channel, which allocates a block of 32 slots when it is
//! created, the queue holds no memory while it has never been used, and
//! only what the connection's own pipelining needed after: an idle
//! connection's cost is its socket buffers and its task.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::{Notify, Semaphore};

pub struct Queue<T> {
    items: Mutex<VecDeque<T>>,
    room: Semaphore,
    ready: Notify,
    closed: AtomicBool,
}

impl<T> Queue<T> {
    /// A queue of at most `max` entries.
    pub fn new(max: usize) -> Queue<T> {
        Queue {
            items: Mutex::new(VecDeque::new()),
            room: Semaphore::new(max),
            ready: Notify::new(),
            closed: AtomicBool::new(false),
        }
    }

    fn items(&self) -> MutexGuard<'_, VecDeque<T>> {
        // Nothing panics while holding the lock: a poisoned queue is whole.
        self.items.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Append `item` once there is room.
    pub async fn push(&self, item: T) {
        // The semaphore is never closed, so acquiring fails only if it were.
        if let Ok(permit) = self.room.acquire().await {
            permit.forget();
        }
        self.items().push_back(item);
        // Stored as a permit if the response loop is not waiting yet.
        self.ready.notify_one();
    }

    /// The oldest entry; `None` once the queue is closed and empty.
    pub async fn pop(&self) -> Option<T> {
        loop {
            if let Some(item) = self.items().pop_front() {
                self.room.add_permits(1);
                return Some(item);
            }
            if self.closed.load(Ordering::Acquire) {
                // A push that raced the close is still delivered.
                let last = self.items().pop_front();
                if last.is_some() {
                    self.room.add_permits(1);
                }
                return last;
            }
            self.ready.notified().await;
        }
    }

    /// No more pushes: [`pop`](Self::pop) returns `None` once the queue is
    /// empty.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.ready.notify_one();
    }

    /// Entries waiting.
    pub fn len(&self) -> usize {
        self.items().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Closes its queue when dropped: the request loop's end, however it ends.
pub struct CloseOnDrop<'a, T>(pub &'a Queue<T>);

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
        q.push(1).await;
        q.push(2).await;
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop().await, Some(1));
        q.push(3).await;
        q.close();
        assert_eq!(q.pop().await, Some(2));
        assert_eq!(q.pop().await, Some(3));
        assert_eq!(q.pop().await, None);
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_new_queue_holds_no_memory() {
        let q: Queue<[u8; 128]> = Queue::new(512);
        assert_eq!(q.items().capacity(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_makes_the_pusher_wait_for_room() {
        let q = Arc::new(Queue::new(2));
        q.push(1).await;
        q.push(2).await;
        let pusher = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.push(3).await })
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
    async fn a_waiting_pop_wakes_on_push_and_on_close() {
        let q = Arc::new(Queue::new(8));
        let popper = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { (q.pop().await, q.pop().await) })
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!popper.is_finished());
        q.push(7).await;
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
