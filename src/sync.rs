//! One policy for a poisoned lock: recover it and go on.
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
}
