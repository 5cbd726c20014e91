//! What every layer shares: one policy for a poisoned lock (recover it
//! and go on), and one way to print an error with its causes.
//!
//! A lock is poisoned when a thread panicked while holding it. Every lock
//! of this crate guards a table or a counter that each critical section
//! leaves whole (an insert, a remove, a replacement), so what the panicking
//! thread left is still a valid state; refusing it instead would turn one
//! panic into an outage of every later request (or, read as "absent", into
//! wrong answers). Every `Mutex` and `RwLock` is taken through these.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// `m.lock()`, recovering a poisoned lock.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `l.read()`, recovering a poisoned lock.
pub(crate) fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(PoisonError::into_inner)
}

/// `l.write()`, recovering a poisoned lock.
pub(crate) fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(PoisonError::into_inner)
}

/// An error and its causes, `: `-separated, for a log line, a report or a
/// client's error message. Errors keep their cause as a `source()` and
/// leave it out of their own `Display`, so printing one with `{}` alone
/// would drop the cause.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut message = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let next = c.to_string();
        // A message that already quotes its cause is not repeated.
        if !message.ends_with(&next) {
            message.push_str(": ");
            message.push_str(&next);
        }
        cause = c.source();
    }
    message
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, RwLock};

    use super::*;

    #[test]
    fn a_poisoned_lock_is_recovered_with_what_it_held() {
        let m = Arc::new(Mutex::new(1));
        let l = Arc::new(RwLock::new(vec![1]));
        let (m2, l2) = (Arc::clone(&m), Arc::clone(&l));
        let _ = std::thread::spawn(move || {
            let _m = m2.lock();
            let _l = l2.write();
            panic!("poison both");
        })
        .join();
        assert!(m.is_poisoned() && l.is_poisoned());
        *lock(&m) += 1;
        assert_eq!(*lock(&m), 2);
        write(&l).push(2);
        assert_eq!(*read(&l), [1, 2]);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle: {0}")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn an_error_chain_names_every_cause_once() {
        let e = Outer(Middle(std::io::Error::other("disk gone")));
        // The middle error quotes its cause already: it is not repeated.
        assert_eq!(error_chain(&e), "outer: middle: disk gone");
        assert_eq!(error_chain(&std::io::Error::other("alone")), "alone");
    }
}
