//! The one backoff of every retry loop: exponential, capped, with jitter,
//! as Kafka's own clients wait (`org.apache.kafka.common.utils.
//! ExponentialBackoff`: the delay doubles from `min` up to `max`, and each
//! wait is that delay times a random factor in 0.8..1.2). The jitter keeps
//! proxy instances that failed together from retrying in step.

use std::time::Duration;

/// How far a wait may stray from the nominal delay, either way.
const JITTER: f64 = 0.2;

#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    /// The nominal delay of the next wait.
    next: Duration,
}

impl Backoff {
    /// Waits doubling from `min` to at most `max` (a `max` below `min` is
    /// taken as `min`).
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            next: min,
        }
    }

    /// The next wait, and the one after it doubled.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let nominal = self.next;
        self.next = nominal.saturating_mul(2).min(self.max);
        let factor = 1.0 - JITTER + 2.0 * JITTER * fastrand::f64();
        nominal.mul_f64(factor)
    }

    /// The nominal delay of the next wait (without jitter), for log lines.
    #[cfg(test)]
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// Start again from `min` (after a success).
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(d: Duration, nominal_ms: u64) -> bool {
        let ms = d.as_secs_f64() * 1000.0;
        let n = nominal_ms as f64;
        ms >= n * (1.0 - JITTER) && ms <= n * (1.0 + JITTER)
    }

    #[test]
    fn doubles_to_the_cap_with_jitter_around_each_step() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(1000));
        for nominal in [100, 200, 400, 800, 1000, 1000] {
            assert_eq!(b.peek(), Duration::from_millis(nominal));
            let d = b.next_delay();
            assert!(within(d, nominal), "{d:?} around {nominal} ms");
        }
    }

    #[test]
    fn reset_starts_again_from_the_minimum() {
        let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
        b.next_delay();
        b.next_delay();
        assert_eq!(b.peek(), Duration::from_millis(800));
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(200));
    }

    #[test]
    fn waits_are_not_all_the_same() {
        let waits: Vec<Duration> = (0..20)
            .map(|_| Backoff::new(Duration::from_secs(1), Duration::from_secs(1)).next_delay())
            .collect();
        assert!(waits.iter().any(|w| *w != waits[0]), "{waits:?}");
    }

    #[test]
    fn a_cap_below_the_minimum_is_the_minimum() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        b.next_delay();
        assert_eq!(b.peek(), Duration::from_secs(2));
    }
}
