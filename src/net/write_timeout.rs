//! A bound on writes that make no progress: a writer wrapped in
//! [`WriteTimeout`] fails with [`std::io::ErrorKind::TimedOut`] once a write
//! (or flush) has been pending, without a byte taken, for its timeout.
//!
//! A frame waiting to be written holds its memory under the shared frame
//! budget. A broker reads nothing more from a connection while it holds a
//! request there (a Fetch long poll, a Produce waiting for acks), and a
//! client may simply stop reading, so without this bound one such
//! connection could keep memory that every other connection needs.
//! Progress, not the whole frame, is timed: a large response to a slow but
//! reading client is fine.
//!
//! The timer is allocated on a connection's first stalled write and reused
//! after: a connection whose writes never wait costs nothing more.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::time::{Instant, Sleep};

/// Why a write failed with `TimedOut`; the source of that error.
#[derive(Debug, thiserror::Error)]
#[error("no progress writing to the {peer} for {ms} ms ({setting})")]
pub(crate) struct WriteStalled {
    pub peer: &'static str,
    pub ms: u128,
    pub setting: &'static str,
}

/// Whether `e` is a [`WriteStalled`] from a [`WriteTimeout`].
pub(crate) fn is_stalled(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::TimedOut
        && e.get_ref()
            .is_some_and(|inner| inner.downcast_ref::<WriteStalled>().is_some())
}

pub(crate) struct WriteTimeout<W> {
    inner: W,
    timeout: Duration,
    peer: &'static str,
    setting: &'static str,
    /// Armed while a write is stalled; kept (disarmed) after.
    timer: Option<Pin<Box<Sleep>>>,
    armed: bool,
}

impl<W> WriteTimeout<W> {
    /// `peer` ("broker", "client") and `setting` name the bound in errors.
    pub(crate) fn new(
        inner: W,
        timeout: Duration,
        peer: &'static str,
        setting: &'static str,
    ) -> WriteTimeout<W> {
        WriteTimeout {
            inner,
            timeout,
            peer,
            setting,
            timer: None,
            armed: false,
        }
    }

    /// After a poll of the inner writer: progress disarms the timer, a
    /// pending write arms it (once) and fails when it fires.
    fn check<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.armed = false;
            return polled;
        }
        let deadline = Instant::now() + self.timeout;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
        if !self.armed {
            timer.as_mut().reset(deadline);
            self.armed = true;
        }
        match timer.as_mut().poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(()) => {
                self.armed = false;
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    WriteStalled {
                        peer: self.peer,
                        ms: self.timeout.as_millis(),
                        setting: self.setting,
                    },
                )))
            }
        }
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for WriteTimeout<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write(cx, buf);
        this.check(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        this.check(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_flush(cx);
        this.check(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_shutdown(cx);
        this.check(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_write_without_progress_fails_after_the_timeout() {
        // A pipe of 16 bytes nobody reads.
        let (tx, _rx) = tokio::io::duplex(16);
        let mut w = WriteTimeout::new(
            tx,
            Duration::from_secs(5),
            "client",
            "MIRROR_PROXY_WRITE_TIMEOUT_MS",
        );
        let started = Instant::now();
        let err = w
            .write_all(&[1; 64])
            .await
            .expect_err("nobody reads: the write must fail");
        assert!(is_stalled(&err), "{err:?}");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(
            err.to_string()
                .contains("no progress writing to the client for 5000 ms"),
            "{err}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_reader_that_keeps_reading_is_not_timed_out() {
        let (tx, mut rx) = tokio::io::duplex(16);
        let mut w = WriteTimeout::new(tx, Duration::from_secs(5), "client", "X");
        let reader = tokio::spawn(async move {
            let mut got = 0;
            let mut buf = [0u8; 16];
            // 16 bytes every 4 s: the whole write takes 28 s, longer than
            // the timeout, but no pause is as long as it.
            while got < 128 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                got += rx.read(&mut buf).await.expect("read");
            }
            got
        });
        w.write_all(&[1; 128]).await.expect("progress every 4 s");
        assert_eq!(reader.await.expect("task"), 128);
    }

    #[test]
    fn other_errors_are_not_stalls() {
        let e = io::Error::new(io::ErrorKind::TimedOut, "elsewhere");
        assert!(!is_stalled(&e));
        assert!(!is_stalled(&io::ErrorKind::BrokenPipe.into()));
    }
}
