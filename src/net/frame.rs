//! Length-prefixed Kafka frames: a big-endian int32 size, then that many
//! bytes.
//!
//! The reader checks the size against the configured maximum, then grows the
//! frame's buffer by at most doubling what has arrived, from a first chunk
//! (16 KiB, or the whole frame if it is under 24 KiB), so an announced size
//! alone allocates (and charges) no more than that first chunk. Every frame
//! gets its own allocation (so a Produce frame can be patched in place and
//! forwarded without a copy). The reader is
//! cancel-safe: all progress lives in the reader, so it can sit in a
//! `tokio::select!`.
//!
//! Between frames a reader holds no heap memory: the next size prefix is read
//! into a small array inside the reader, with whatever came with it (a small
//! frame, typically a response, arrives whole in that one read), and the
//! read-ahead buffer that lets pipelined small frames share one read is
//! freed as soon as it is empty. Idle connections are the common case, and
//! they cost only their sockets.
//!
//! Readers also draw on a `Budget` shared by every connection (one for
//! client requests, one for broker responses): a frame's memory is charged
//! before it is allocated, and when the budget is used up reading pauses
//! (backpressure) until forwarded frames give theirs back. That pause is
//! bounded: a frame that gets no memory within the budget's wait closes its
//! connection, so no request waits for memory forever.

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::sync::{Mutex, OwnedMutexGuard, Semaphore};
use tokio::time::Instant;

/// First allocation for a frame body; it at least doubles as bytes arrive,
/// so a frame of n bytes costs O(log n) allocations and never more than
/// twice the bytes received.
const FIRST_CHUNK: usize = 16 * 1024;
/// Read-ahead for frames smaller than this: pipelined small requests (and
/// the size prefix after them) come in with one read instead of two each.
/// Larger frames are read straight into their own buffer.
const READ_AHEAD: usize = 8 * 1024;
/// What one read between frames takes in, into the reader itself: the size
/// prefix and, with it, all of a small frame (a Produce response is about
/// 70 bytes), so that frame costs one read instead of two.
const INLINE: usize = 128;

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(
        "frame of {size} bytes exceeds the maximum of {max} bytes (MIRROR_PROXY_MAX_FRAME_BYTES)"
    )]
    TooLarge { size: usize, max: usize },
    #[error("frame of {size} bytes can never fit the buffer budget of {budget} bytes ({setting})")]
    OverBudget {
        size: usize,
        budget: usize,
        setting: &'static str,
    },
    #[error("no memory for a frame of {size} bytes within {ms} ms: the {budget} bytes of {setting} are held by other frames (MIRROR_PROXY_BUFFER_WAIT_TIMEOUT_MS)")]
    BudgetWait {
        size: usize,
        budget: usize,
        ms: u128,
        setting: &'static str,
    },
    #[error("frame size {0} is negative")]
    NegativeSize(i32),
    #[error("connection closed in the middle of a frame ({buffered} bytes read)")]
    Truncated { buffered: usize },
    #[error("frame not complete {ms} ms after its first byte ({buffered} bytes read; {setting})")]
    Timeout {
        ms: u128,
        buffered: usize,
        setting: &'static str,
    },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Memory for frames, in bytes, shared by every reader that holds it.
///
/// A reader charges a frame's buffer before allocating it and gives the
/// charge back once the frame has been handed on (`release`, or at the
/// reader's next `read_frame` call) or when the reader is dropped (the
/// connection closed). A reader
/// reads its next frame only after the caller has handed the last one on,
/// so one connection holds at most one frame of a budget at a time: the
/// per-connection share is one frame, never more than
/// `MIRROR_PROXY_MAX_FRAME_BYTES`.
///
/// A new frame waits while the budget is used up; it holds nothing yet, so
/// that wait is plain backpressure. A frame already partly read that needs
/// more than is left could wait forever if every holder were in the same
/// position, so one such frame at a time may finish on an overdraft:
/// memory stays below the budget plus one maximal frame. Either wait is
/// bounded by `wait`: a frame still without memory then fails with
/// [`FrameError::BudgetWait`] and its connection closes. What makes the
/// memory come back is that every holder is bounded in time too: reading a
/// frame by its read timeout (a request's or a response's), handing it on
/// by the write timeout.
pub(crate) struct Budget {
    total: usize,
    free: Semaphore,
    overdraft: Arc<Mutex<()>>,
    wait: Duration,
    /// The variable that sets `total`, for messages.
    setting: &'static str,
    /// Bytes charged now, for the metrics.
    held: Gauge,
}

impl Budget {
    /// `total` bytes, set by the variable `setting`; a frame waits at most
    /// `wait` for memory; `held` follows what is charged.
    pub(crate) fn new(
        total: usize,
        wait: Duration,
        setting: &'static str,
        held: Gauge,
    ) -> Arc<Budget> {
        let total = total.min(Semaphore::MAX_PERMITS);
        Arc::new(Budget {
            total,
            free: Semaphore::new(total),
            overdraft: Arc::new(Mutex::new(())),
            wait,
            setting,
            held,
        })
    }

    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Bytes charged now (frames on the overdraft not included).
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.total.saturating_sub(self.free.available_permits())
    }

    fn taken(&self, n: usize) {
        self.held.inc_by(i64::try_from(n).unwrap_or(i64::MAX));
    }

    fn give_back(&self, n: usize) {
        if n > 0 {
            self.free.add_permits(n);
            self.held.dec_by(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
}

/// Reads whole frames from one half of a connection.
pub(crate) struct FrameReader<R> {
    inner: R,
    max: usize,
    budget: Option<Arc<Budget>>,
    frame_timeout: Option<Duration>,
    /// The variable that sets `frame_timeout`, for messages.
    timeout_setting: &'static str,
    /// The size prefix of the next frame, as far as it has arrived.
    head: [u8; 4],
    head_len: usize,
    /// Bytes read past what has been taken (the next size prefix, the
    /// next frames).
    buffered: Buffered,
    /// The frame being read, once its size is known (`size` bytes). A
    /// `Vec` so that growing it can extend the allocation in place (large
    /// blocks are remapped, not copied); it becomes a `BytesMut` without a
    /// copy when complete.
    size: usize,
    body: Option<Vec<u8>>,
    /// When the frame being read must be complete.
    deadline: Option<Instant>,
    last_read: Instant,
    /// Budget charged for the frame being read.
    charged: usize,
    /// Since when the frame being read has waited for budget (kept across
    /// cancelled calls, so a `select!` that drops the wait does not restart
    /// its bound).
    waiting_since: Option<Instant>,
    overdraft: Option<OwnedMutexGuard<()>>,
    /// Since when the caller has held the next frame back ([`pause`]).
    ///
    /// [`pause`]: FrameReader::pause
    paused_since: Option<Instant>,
    /// Budget of the frame returned last, held until the caller asks for
    /// the next one (by then it has been forwarded).
    returned: usize,
    returned_overdraft: Option<OwnedMutexGuard<()>>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub(crate) fn new(inner: R, max: usize) -> Self {
        FrameReader {
            inner,
            max,
            budget: None,
            frame_timeout: None,
            timeout_setting: "",
            head: [0; 4],
            head_len: 0,
            buffered: Buffered::new(),
            size: 0,
            body: None,
            deadline: None,
            last_read: Instant::now(),
            charged: 0,
            waiting_since: None,
            overdraft: None,
            paused_since: None,
            returned: 0,
            returned_overdraft: None,
        }
    }

    /// Charge frame memory to `budget`.
    pub(crate) fn with_budget(mut self, budget: Arc<Budget>) -> Self {
        self.budget = Some(budget);
        self
    }

    /// Once a frame's first byte has arrived, the rest must arrive within
    /// `timeout`, set by the variable `setting` (time paused on the budget,
    /// or held back by the caller, does not count). Whole-frame, not
    /// progress: a peer that trickles a byte now and then would otherwise
    /// keep the frame's memory for as long as it liked.
    pub(crate) fn with_frame_timeout(mut self, timeout: Duration, setting: &'static str) -> Self {
        self.frame_timeout = Some(timeout);
        self.timeout_setting = setting;
        self
    }

    /// Whether part of a frame has arrived.
    pub(crate) fn mid_frame(&self) -> bool {
        self.head_len > 0 || self.body.is_some() || !self.buffered.is_empty()
    }

    /// When bytes last arrived (or the reader was made).
    pub(crate) fn last_read(&self) -> Instant {
        self.last_read
    }

    /// The caller holds the next frame back, waiting on something of its
    /// own: until [`resume`](Self::resume) that time does not count against
    /// the frame timeout. Repeated calls keep the first instant, so a wait
    /// cancelled and begun again counts whole.
    fn pause(&mut self) {
        self.paused_since.get_or_insert_with(Instant::now);
    }

    /// The hold of [`pause`](Self::pause) is over.
    fn resume(&mut self) {
        if let Some(since) = self.paused_since.take() {
            if let Some(deadline) = self.deadline.as_mut() {
                *deadline += since.elapsed();
            }
        }
    }

    /// The next frame without its size prefix, or `None` on a clean close
    /// between frames.
    pub(crate) fn read_frame(
        &mut self,
    ) -> impl std::future::Future<Output = Result<Option<BytesMut>, FrameError>> + '_ {
        self.read_frame_held(|_| None::<std::future::Pending<Result<(), FrameError>>>)
    }

    /// [`read_frame`](Self::read_frame), with a say for the caller once the
    /// frame's size is known: `hold(size)` may return a wait to finish
    /// before anything of the frame is charged to the budget or read past
    /// what came with its size prefix. The time held does not count against
    /// the frame timeout, and an error from the wait is the call's.
    /// `hold` is asked once a call, so a wait cancelled (the whole call
    /// dropped) is asked for again by the next call, and its time counts
    /// from the first start.
    ///
    /// One future from the size prefix to the frame's last byte: each poll
    /// goes through one state machine, not one for the size and another
    /// for the body.
    pub(crate) async fn read_frame_held<H, W>(
        &mut self,
        mut hold: H,
    ) -> Result<Option<BytesMut>, FrameError>
    where
        H: FnMut(usize) -> Option<W>,
        W: std::future::Future<Output = Result<(), FrameError>>,
    {
        self.release_returned();
        let mut asked = false;
        loop {
            if self.body.is_none() {
                if self.head_len < 4 {
                    // Inline rather than an async fn of its own: this is
                    // where a connection waits between frames, polled on
                    // every wake-up of its task, so it goes through no
                    // state machine but this one.
                    let start = self.head_len;
                    // When the bytes read now arrived, if they were read
                    // now: the frame's first byte, read from the stream,
                    // arrived then.
                    let mut read_at = None;
                    if self.buffered.is_empty() {
                        let n = if start == 0 {
                            // Idle between frames: no deadline, so the
                            // stream is polled straight.
                            let (buffered, inner) = (&mut self.buffered, &mut self.inner);
                            std::future::poll_fn(|cx| buffered.poll_read_inline(inner, cx))
                                .await
                                .map_err(ReadError::Io)
                        } else {
                            timed(self.deadline, self.buffered.read_inline(&mut self.inner)).await
                        };
                        match n {
                            Ok(0) if start == 0 => return Ok(None),
                            Ok(0) => return Err(FrameError::Truncated { buffered: start }),
                            Ok(_) => {
                                let now = Instant::now();
                                self.last_read = now;
                                read_at = Some(now);
                            }
                            Err(e) => return Err(self.read_error(e)),
                        }
                    }
                    let n = (4 - start).min(self.buffered.len());
                    self.head[start..start + n].copy_from_slice(&self.buffered.bytes()[..n]);
                    self.buffered.consume(n);
                    self.head_len += n;
                    if start == 0 {
                        // One clock read a frame, not two: the instant of
                        // the read above is this one (a frame taken from
                        // bytes read earlier starts now).
                        if let Some(t) = self.frame_timeout {
                            self.deadline = Some(read_at.unwrap_or_else(Instant::now) + t);
                        }
                    }
                    continue;
                }
                let size = i32::from_be_bytes(self.head);
                let size = usize::try_from(size).map_err(|_| FrameError::NegativeSize(size))?;
                if size > self.max {
                    return Err(FrameError::TooLarge {
                        size,
                        max: self.max,
                    });
                }
                if let Some(budget) = self.budget.as_ref().filter(|b| size > b.total) {
                    return Err(FrameError::OverBudget {
                        size,
                        budget: budget.total,
                        setting: budget.setting,
                    });
                }
                self.size = size;
                self.body = Some(Vec::new());
            }
            if !asked {
                asked = true;
                if let Some(wait) = hold(self.size) {
                    self.pause();
                    wait.await?;
                }
                self.resume();
            }
            let len = self.body.as_ref().map_or(0, Vec::len);
            let remaining = self.size - len;
            if remaining == 0 {
                return Ok(self.finish());
            }
            if !self.buffered.is_empty() {
                let n = remaining.min(self.buffered.len());
                self.reserve(n).await?;
                if let Some(body) = self.body.as_mut() {
                    body.extend_from_slice(&self.buffered.bytes()[..n]);
                }
                self.buffered.consume(n);
                continue;
            }
            // A large frame is read straight into its own buffer, which
            // grows (and draws on the budget) by at most doubling what has
            // arrived, starting from a first chunk; small frames and the
            // tail of a large one come through the read-ahead. The first
            // chunk is allocated before any read: reading through the
            // read-ahead first would copy those bytes into the frame again
            // (7% of a link's CPU in a profile).
            let room = self
                .body
                .as_ref()
                .map_or(0, |b| b.capacity() - b.len())
                .min(remaining);
            if remaining >= READ_AHEAD && room == 0 {
                self.reserve(1).await?;
                continue;
            }
            let n = if remaining >= READ_AHEAD {
                let deadline = self.deadline;
                let Some(body) = self.body.as_mut() else {
                    continue;
                };
                timed(deadline, self.inner.read_buf(&mut body.limit(room))).await
            } else {
                timed(
                    self.deadline,
                    self.inner.read_buf(self.buffered.read_ahead()),
                )
                .await
            };
            match n {
                Ok(0) => return Err(FrameError::Truncated { buffered: 4 + len }),
                Ok(_) => self.last_read = Instant::now(),
                Err(e) => return Err(self.read_error(e)),
            }
        }
    }

    fn read_error(&self, e: ReadError) -> FrameError {
        match e {
            ReadError::Io(e) => FrameError::Io(e),
            ReadError::Timeout => FrameError::Timeout {
                ms: self.frame_timeout.unwrap_or_default().as_millis(),
                buffered: self.head_len + self.body.as_ref().map_or(0, Vec::len),
                setting: self.timeout_setting,
            },
        }
    }

    /// The frame is complete: hand it out, keep its budget until the next call.
    fn finish(&mut self) -> Option<BytesMut> {
        self.head_len = 0;
        self.deadline = None;
        self.returned = std::mem::take(&mut self.charged);
        self.returned_overdraft = self.overdraft.take();
        // Vec -> Bytes -> BytesMut keeps the allocation (it is unique).
        self.body
            .take()
            .map(|body| BytesMut::from(bytes::Bytes::from(body)))
    }

    /// The caller is done with the frame returned last (it has been
    /// written on): give its budget back now rather than at the next
    /// `read_frame`, which may be a long way off (a full queue of
    /// responses owed, a broker sitting on a long poll).
    pub(crate) fn release(&mut self) {
        self.release_returned();
    }

    fn release_returned(&mut self) {
        let returned = std::mem::take(&mut self.returned);
        if let Some(budget) = &self.budget {
            budget.give_back(returned);
        }
        self.returned_overdraft = None;
    }

    /// Make room in the body for `n` more bytes, growing it geometrically
    /// up to the frame size and charging the growth to the budget first.
    async fn reserve(&mut self, n: usize) -> Result<(), FrameError> {
        let (len, cap) = match &self.body {
            Some(b) => (b.len(), b.capacity()),
            None => return Ok(()),
        };
        if cap - len >= n {
            return Ok(());
        }
        // len + n <= size, so this always makes enough room. A tail that
        // would come through the read-ahead is taken in now: growing for it
        // later could copy the whole frame.
        let mut want = (len + n).max(cap * 2).max(FIRST_CHUNK).min(self.size);
        if self.size - want < READ_AHEAD {
            want = self.size;
        }
        self.charge(want.saturating_sub(cap)).await?;
        if let Some(body) = self.body.as_mut() {
            body.reserve_exact(want - len);
        }
        Ok(())
    }

    async fn charge(&mut self, n: usize) -> Result<(), FrameError> {
        let Some(budget) = self.budget.clone() else {
            return Ok(());
        };
        if n == 0 || self.overdraft.is_some() {
            return Ok(());
        }
        let over = || FrameError::OverBudget {
            size: self.size,
            budget: budget.total,
            setting: budget.setting,
        };
        let permits = u32::try_from(n).map_err(|_| over())?;
        if let Ok(p) = budget.free.try_acquire_many(permits) {
            p.forget();
            budget.taken(n);
            self.charged += n;
            // A wait cancelled earlier is over.
            self.waiting_since = None;
            return Ok(());
        }
        let paused = Instant::now();
        let since = *self.waiting_since.get_or_insert(paused);
        let closed = |_| FrameError::Io(std::io::Error::other("frame budget closed"));
        let waited = tokio::time::timeout_at(since + budget.wait, async {
            if self.charged == 0 {
                // A new frame holds nothing: waiting is plain backpressure.
                budget
                    .free
                    .acquire_many(permits)
                    .await
                    .map_err(closed)?
                    .forget();
                budget.taken(n);
                self.charged += n;
            } else {
                tokio::select! {
                    biased;
                    p = budget.free.acquire_many(permits) => {
                        p.map_err(closed)?.forget();
                        budget.taken(n);
                        self.charged += n;
                    }
                    guard = Arc::clone(&budget.overdraft).lock_owned() => {
                        self.overdraft = Some(guard);
                    }
                }
            }
            Ok::<(), FrameError>(())
        })
        .await;
        match waited {
            Ok(r) => r?,
            Err(_) => {
                return Err(FrameError::BudgetWait {
                    size: self.size,
                    budget: budget.total,
                    ms: budget.wait.as_millis(),
                    setting: budget.setting,
                })
            }
        }
        self.waiting_since = None;
        // The pause is the proxy's doing, not the client's.
        if let Some(deadline) = self.deadline.as_mut() {
            *deadline += paused.elapsed();
        }
        Ok(())
    }
}

impl<R> Drop for FrameReader<R> {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget {
            budget.give_back(self.charged + self.returned);
        }
    }
}

/// Bytes read from the stream and not taken yet. They sit in one of two
/// places, never both: an array inside the reader, which the read between
/// frames fills (the size prefix and, with it, a small frame whole; no heap
/// memory while idle), or the read-ahead buffer, which a small frame's body
/// is read through so that pipelined frames after it share that read. The
/// read-ahead is freed as soon as it is empty.
struct Buffered {
    inline: [u8; INLINE],
    /// `inline[inline_at..inline_len]` is not taken yet.
    inline_at: usize,
    inline_len: usize,
    /// Empty means unallocated.
    ahead: BytesMut,
}

impl Buffered {
    fn new() -> Self {
        Buffered {
            inline: [0; INLINE],
            inline_at: 0,
            inline_len: 0,
            ahead: BytesMut::new(),
        }
    }

    fn bytes(&self) -> &[u8] {
        if self.inline_at < self.inline_len {
            &self.inline[self.inline_at..self.inline_len]
        } else {
            &self.ahead
        }
    }

    fn len(&self) -> usize {
        self.bytes().len()
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Take the first `n` bytes (`n <= len()`).
    fn consume(&mut self, n: usize) {
        if self.inline_at < self.inline_len {
            self.inline_at += n;
        } else {
            self.ahead.advance(n);
            if self.ahead.is_empty() {
                self.ahead = BytesMut::new();
            }
        }
    }

    /// One read into the inline array; only when nothing is buffered.
    async fn read_inline<R: AsyncRead + Unpin>(&mut self, r: &mut R) -> std::io::Result<usize> {
        std::future::poll_fn(|cx| self.poll_read_inline(r, cx)).await
    }

    /// [`read_inline`](Self::read_inline) as a poll, for a caller that
    /// waits on it without a future of its own.
    fn poll_read_inline<R: AsyncRead + Unpin>(
        &mut self,
        r: &mut R,
        cx: &mut Context<'_>,
    ) -> Poll<std::io::Result<usize>> {
        debug_assert!(self.is_empty());
        let mut buf = ReadBuf::new(&mut self.inline);
        ready!(Pin::new(r).poll_read(cx, &mut buf))?;
        let n = buf.filled().len();
        self.inline_at = 0;
        self.inline_len = n;
        Poll::Ready(Ok(n))
    }

    /// The read-ahead buffer to read into, allocated if it is not; only
    /// when nothing is buffered.
    fn read_ahead(&mut self) -> &mut BytesMut {
        debug_assert!(self.is_empty());
        if self.ahead.capacity() == 0 {
            self.ahead = BytesMut::with_capacity(READ_AHEAD);
        }
        &mut self.ahead
    }
}

enum ReadError {
    Io(std::io::Error),
    Timeout,
}

/// `read`, or [`ReadError::Timeout`] if it is still waiting at `deadline`.
/// The read is polled once before the timer is made: one that is ready at
/// once (a frame's body, usually: it came with its first bytes) then
/// makes no timer, which would look up the runtime's handle and clone
/// it. One that waits goes on under `timeout_at`, which polls it before
/// the deadline, so data that is there is taken even past the deadline,
/// as before.
async fn timed(
    deadline: Option<Instant>,
    read: impl std::future::Future<Output = std::io::Result<usize>>,
) -> Result<usize, ReadError> {
    let mut read = std::pin::pin!(read);
    let Some(at) = deadline else {
        return read.await.map_err(ReadError::Io);
    };
    if let Poll::Ready(r) = std::future::poll_fn(|cx| Poll::Ready(read.as_mut().poll(cx))).await {
        return r.map_err(ReadError::Io);
    }
    match tokio::time::timeout_at(at, read).await {
        Ok(r) => r.map_err(ReadError::Io),
        Err(_) => Err(ReadError::Timeout),
    }
}

/// Write one frame with its size prefix, in one vectored write where the
/// stream supports it (one syscall per frame instead of two).
pub(crate) async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    frame: &[u8],
) -> std::io::Result<()> {
    let size = i32::try_from(frame.len())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "frame over 2 GiB"))?;
    let prefix = size.to_be_bytes();
    let total = prefix.len() + frame.len();
    let mut written = 0;
    while written < total {
        let n = if written < prefix.len() {
            let bufs = [IoSlice::new(&prefix[written..]), IoSlice::new(frame)];
            w.write_vectored(&bufs).await?
        } else {
            w.write(&frame[written - prefix.len()..]).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        written += n;
    }
    // TLS streams buffer inside the session; a no-op for TCP.
    w.flush().await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A budget of `total` bytes with a wait longer than any test.
    fn budget_of(total: usize) -> Arc<Budget> {
        Budget::new(
            total,
            Duration::from_secs(600),
            "MIRROR_PROXY_MAX_BUFFERED_BYTES",
            Gauge::default(),
        )
    }

    async fn read_all(input: &[u8], max: usize) -> (Vec<Vec<u8>>, Option<FrameError>) {
        let mut r = FrameReader::new(input, max);
        let mut frames = Vec::new();
        loop {
            match r.read_frame().await {
                Ok(Some(f)) => frames.push(f.to_vec()),
                Ok(None) => return (frames, None),
                Err(e) => return (frames, Some(e)),
            }
        }
    }

    #[tokio::test]
    async fn buffered_bytes_sit_inline_or_in_a_read_ahead_freed_when_empty() {
        let mut p = Buffered::new();
        let mut stream: &[u8] = &[1, 2, 3, 4, 5, 6];
        assert_eq!(p.read_inline(&mut stream).await.unwrap(), 6);
        assert_eq!(p.bytes(), [1, 2, 3, 4, 5, 6]);
        p.consume(4);
        assert_eq!(p.bytes(), [5, 6]);
        p.consume(2);
        assert!(p.is_empty());
        assert_eq!(p.ahead.capacity(), 0, "the inline read allocates nothing");

        let mut stream: &[u8] = &[7, 8, 9];
        stream.read_buf(p.read_ahead()).await.unwrap();
        assert!(p.ahead.capacity() >= READ_AHEAD);
        assert_eq!(p.bytes(), [7, 8, 9]);
        p.consume(1);
        assert_eq!(p.bytes(), [8, 9]);
        p.consume(2);
        assert!(p.is_empty());
        assert_eq!(p.ahead.capacity(), 0, "an empty read-ahead is freed");
    }

    #[tokio::test]
    async fn reads_consecutive_frames() {
        let input = [0, 0, 0, 2, 0xAA, 0xBB, 0, 0, 0, 0, 0, 0, 0, 1, 0xCC];
        let (frames, err) = read_all(&input, 1024).await;
        assert!(err.is_none());
        assert_eq!(frames, vec![vec![0xAA, 0xBB], vec![], vec![0xCC]]);
    }

    #[tokio::test]
    async fn refuses_oversized_and_negative_sizes() {
        let (_, err) = read_all(&[0, 0, 4, 1, 0], 1024).await;
        assert!(matches!(
            err,
            Some(FrameError::TooLarge {
                size: 1025,
                max: 1024
            })
        ));
        let (_, err) = read_all(&[0xFF, 0xFF, 0xFF, 0xFB], 1024).await;
        assert!(matches!(err, Some(FrameError::NegativeSize(-5))));
    }

    #[tokio::test]
    async fn a_close_mid_frame_is_an_error() {
        let (frames, err) = read_all(&[0, 0, 0, 1, 7, 0, 0, 0, 9, 1, 2], 1024).await;
        assert_eq!(frames, vec![vec![7]]);
        assert!(matches!(err, Some(FrameError::Truncated { buffered: 6 })));
    }

    /// A writer that takes at most three bytes per call.
    struct Trickle(Vec<u8>);

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(3);
            self.0.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_timed_read_takes_what_is_there_even_past_its_deadline_and_times_out_waiting() {
        let past = Instant::now();
        tokio::time::advance(Duration::from_millis(10)).await;
        let mut ready: &[u8] = &[1, 2, 3];
        let mut buf = [0u8; 8];
        let n = timed(Some(past), ready.read(&mut buf)).await;
        assert!(matches!(n, Ok(3)), "the bytes there are taken");
        let (_tx, mut rx) = tokio::io::duplex(64);
        let waited = timed(
            Some(Instant::now() + Duration::from_millis(100)),
            rx.read(&mut buf),
        )
        .await;
        assert!(
            matches!(waited, Err(ReadError::Timeout)),
            "a read that waits times out"
        );
        let mut closed: &[u8] = &[];
        assert!(matches!(timed(None, closed.read(&mut buf)).await, Ok(0)));
    }

    #[tokio::test]
    async fn write_frame_survives_short_writes() {
        let mut out = Trickle(Vec::new());
        write_frame(&mut out, &[9, 8, 7, 6, 5])
            .await
            .expect("write");
        assert_eq!(out.0, vec![0, 0, 0, 5, 9, 8, 7, 6, 5]);
    }

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as u32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    /// Poll `read_frame` for a moment; `None` when it is still waiting
    /// (dropping the future there is what a `select!` does).
    async fn try_read<R: AsyncRead + Unpin>(
        r: &mut FrameReader<R>,
    ) -> Option<Result<Option<BytesMut>, FrameError>> {
        tokio::time::timeout(Duration::from_millis(100), r.read_frame())
            .await
            .ok()
    }

    #[tokio::test]
    async fn an_announced_size_allocates_at_most_a_first_chunk() {
        let budget = budget_of(1 << 30);
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 100 * 1024 * 1024).with_budget(Arc::clone(&budget));
        // 90 MB announced, nothing more.
        tx.write_all(&(90_000_000u32).to_be_bytes())
            .await
            .expect("write");
        assert!(try_read(&mut r).await.is_none(), "no frame yet");
        assert!(r.mid_frame());
        let cap = r.body.as_ref().map_or(0, Vec::capacity);
        assert_eq!(cap, FIRST_CHUNK, "the first chunk of a large frame");
        assert_eq!(budget.in_use(), cap, "charged before it was allocated");
        assert_eq!(
            r.buffered.ahead.capacity(),
            0,
            "read straight into the frame"
        );
        // 10 bytes arrive: nothing grows.
        tx.write_all(&[1; 10]).await.expect("write");
        assert!(try_read(&mut r).await.is_none(), "no frame yet");
        assert_eq!(r.body.as_ref().map_or(0, Vec::capacity), FIRST_CHUNK);
        assert_eq!(budget.in_use(), FIRST_CHUNK);
    }

    #[tokio::test]
    async fn a_frame_of_a_producer_batch_is_one_allocation_read_straight_in() {
        // A Produce of one 16 KiB batch is a little over 16 KiB: allocated
        // whole at once, never grown (a grow could copy it), and not copied
        // through the read-ahead.
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 1 << 20);
        let body: Vec<u8> = (0..FIRST_CHUNK as u32 + 300)
            .map(|i| (i % 7) as u8)
            .collect();
        let framed = frame(&body);
        tx.write_all(&framed[..4 + 1000]).await.expect("write");
        assert!(try_read(&mut r).await.is_none());
        let at = r.body.as_ref().map(|b| b.as_ptr());
        assert_eq!(r.body.as_ref().map(Vec::capacity), Some(body.len()));
        assert_eq!(r.body.as_ref().map(Vec::len), Some(1000));
        assert_eq!(
            r.buffered.ahead.capacity(),
            0,
            "read straight into the frame"
        );
        tx.write_all(&framed[4 + 1000..]).await.expect("write");
        let got = r.read_frame().await.expect("read").expect("frame");
        assert!(got[..] == body[..], "frame content differs");
        assert_eq!(Some(got.as_ptr()), at, "the frame was reallocated");
    }

    #[tokio::test]
    async fn a_large_frame_grows_with_what_arrived_and_comes_out_whole() {
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 10 << 20);
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        let framed = frame(&body);
        tx.write_all(&framed[..100_004]).await.expect("write");
        assert!(try_read(&mut r).await.is_none());
        let cap = r.body.as_ref().map_or(0, Vec::capacity);
        assert!(
            (100_000..=2 * 100_000).contains(&cap),
            "capacity {cap} for 100000 bytes received"
        );
        let writer = tokio::spawn(async move {
            tx.write_all(&framed[100_004..]).await.expect("write");
            tx
        });
        let got = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(got.len(), body.len());
        assert!(got[..] == body[..], "frame content differs");
        assert_eq!(got.capacity(), body.len(), "exact final allocation");
        drop(writer.await);
    }

    /// A reader that hands out at most `step` bytes per read and counts
    /// the reads that returned data.
    struct Chunked {
        data: Vec<u8>,
        at: usize,
        step: usize,
        reads: usize,
    }

    impl AsyncRead for Chunked {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            let n = self
                .step
                .min(buf.remaining())
                .min(self.data.len() - self.at);
            if n > 0 {
                let at = self.at;
                buf.put_slice(&self.data[at..at + n]);
                self.at += n;
                self.reads += 1;
            }
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_small_frame_arrives_whole_in_one_read() {
        let body = [5u8; 70];
        let mut r = FrameReader::new(
            Chunked {
                data: frame(&body),
                at: 0,
                step: usize::MAX,
                reads: 0,
            },
            1024,
        );
        let got = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(&got[..], &body[..]);
        assert_eq!(r.inner.reads, 1, "the size prefix and the body in one read");
        assert_eq!(r.buffered.ahead.capacity(), 0, "no read-ahead allocated");
        assert!(!r.mid_frame());
    }

    #[tokio::test]
    async fn frames_of_every_size_survive_reads_of_every_size() {
        let sizes = [0usize, 1, 70, 123, 124, 125, 200, 9_000, 20_000, 40_000, 3];
        let bodies: Vec<Vec<u8>> = sizes
            .iter()
            .map(|&n| (0..n).map(|i| (i * 31 + n) as u8).collect())
            .collect();
        let input: Vec<u8> = bodies.iter().flat_map(|b| frame(b)).collect();
        for step in [1, 3, 4, 5, 127, 128, 129, 4_099, 8_192, usize::MAX] {
            let mut r = FrameReader::new(
                Chunked {
                    data: input.clone(),
                    at: 0,
                    step,
                    reads: 0,
                },
                1 << 20,
            );
            for (i, b) in bodies.iter().enumerate() {
                let got = r.read_frame().await.expect("read").expect("frame");
                assert!(got[..] == b[..], "frame {i} differs with reads of {step}");
            }
            assert!(r.read_frame().await.expect("read").is_none(), "step {step}");
            assert!(!r.mid_frame());
        }
    }

    #[test]
    fn a_finished_frame_keeps_its_allocation() {
        let body = vec![7u8; 100_000];
        let at = body.as_ptr();
        let frame = BytesMut::from(bytes::Bytes::from(body));
        assert_eq!(frame.as_ptr(), at, "the frame was copied");
        assert_eq!(frame.capacity(), 100_000);
    }

    #[tokio::test]
    async fn an_idle_reader_holds_no_buffer_after_pipelined_frames() {
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(rx, 1024);
        let mut input = Vec::new();
        for i in 0..50u8 {
            input.extend(frame(&[i; 30]));
        }
        tx.write_all(&input).await.expect("write");
        for i in 0..50u8 {
            let f = r.read_frame().await.expect("read").expect("frame");
            assert_eq!(&f[..], &[i; 30][..]);
            // Each frame is its own allocation, so it can be patched and
            // frozen back into a unique buffer.
            assert!(f.freeze().try_into_mut().is_ok(), "frame {i} shares memory");
        }
        assert!(try_read(&mut r).await.is_none(), "nothing more to read");
        assert!(!r.mid_frame());
        assert_eq!(r.buffered.ahead.capacity(), 0, "read-ahead kept while idle");
        assert!(r.body.is_none());
    }

    #[tokio::test]
    async fn cancelling_mid_frame_loses_nothing() {
        let (mut tx, rx) = tokio::io::duplex(1 << 16);
        let mut r = FrameReader::new(rx, 1 << 20);
        let body: Vec<u8> = (0..40_000u32).map(|i| (i % 13) as u8).collect();
        let mut input = frame(&body);
        input.extend(frame(b"next"));
        for chunk in input.chunks(3_001) {
            tx.write_all(chunk).await.expect("write");
            // Each poll reads what is there and then is dropped while waiting.
            if let Some(done) = try_read(&mut r).await {
                let f = done.expect("read").expect("frame");
                assert_eq!(&f[..], &body[..]);
            }
        }
        let next = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(&next[..], b"next");
    }

    #[tokio::test]
    async fn a_stalled_frame_times_out_but_an_idle_reader_does_not() {
        let (mut tx, rx) = tokio::io::duplex(1024);
        let mut r = FrameReader::new(rx, 1024).with_frame_timeout(
            Duration::from_millis(200),
            "MIRROR_PROXY_REQUEST_READ_TIMEOUT_MS",
        );
        // Idle: waiting longer than the frame timeout is fine.
        assert!(
            tokio::time::timeout(Duration::from_millis(400), r.read_frame())
                .await
                .is_err(),
            "an idle reader must keep waiting"
        );
        tx.write_all(&[0, 0, 0, 10, 1, 2]).await.expect("write");
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(5), r.read_frame())
            .await
            .expect("the frame timeout fires first");
        assert!(
            matches!(
                err,
                Err(FrameError::Timeout {
                    ms: 200,
                    buffered: 6,
                    setting: "MIRROR_PROXY_REQUEST_READ_TIMEOUT_MS",
                })
            ),
            "{err:?}"
        );
        assert!(started.elapsed() >= Duration::from_millis(150));
    }

    /// The whole frame is timed, not progress: a peer (a broker sending a
    /// response) that trickles a byte now and then, each well within the
    /// timeout, still cannot keep a frame for longer than it.
    #[tokio::test(start_paused = true)]
    async fn a_trickled_frame_times_out_though_each_byte_comes_in_time() {
        let (mut tx, rx) = tokio::io::duplex(1024);
        let mut r = FrameReader::new(rx, 1024).with_frame_timeout(
            Duration::from_millis(1_000),
            "MIRROR_PROXY_RESPONSE_READ_TIMEOUT_MS",
        );
        let trickle = tokio::spawn(async move {
            tx.write_all(&[0, 0, 0, 100]).await.expect("write");
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if tx.write_all(&[7]).await.is_err() {
                    return;
                }
            }
        });
        let started = Instant::now();
        let err = r.read_frame().await;
        assert!(
            matches!(
                err,
                Err(FrameError::Timeout {
                    ms: 1_000,
                    setting: "MIRROR_PROXY_RESPONSE_READ_TIMEOUT_MS",
                    ..
                })
            ),
            "{err:?}"
        );
        assert!(started.elapsed() <= Duration::from_millis(1_100));
        drop(r);
        trickle.await.expect("trickler");
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_held_back_by_its_caller_charges_nothing_and_its_hold_is_not_timed() {
        let budget = budget_of(1 << 20);
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 1 << 20)
            .with_budget(Arc::clone(&budget))
            .with_frame_timeout(
                Duration::from_millis(200),
                "MIRROR_PROXY_REQUEST_READ_TIMEOUT_MS",
            );
        tx.write_all(&100_000u32.to_be_bytes())
            .await
            .expect("write");
        // The hold never ends; the call is dropped after 5 s, as a
        // `select!` would drop it.
        let mut asked = Vec::new();
        let held = tokio::time::timeout(
            Duration::from_secs(5),
            r.read_frame_held(|size| {
                asked.push(size);
                Some(std::future::pending())
            }),
        )
        .await;
        assert!(held.is_err(), "held until dropped");
        assert_eq!(asked, [100_000]);
        assert_eq!(budget.in_use(), 0, "only the size prefix was read");
        assert!(r.mid_frame());
        // The body comes 100 ms after the second hold: within the frame
        // timeout only if neither hold counted (a cancelled wait that
        // begins again keeps its first instant).
        let body = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(5_100)).await;
            tx.write_all(&[7; 100_000]).await.expect("write");
            tx
        });
        let got = r
            .read_frame_held(|size| {
                asked.push(size);
                Some(async {
                    tokio::time::sleep(Duration::from_secs(5)).await;
                    Ok(())
                })
            })
            .await
            .expect("not timed out")
            .expect("frame");
        assert_eq!(asked, [100_000, 100_000], "asked once a call");
        drop(body.await.expect("writer"));
        assert_eq!(got.len(), 100_000);
        assert_eq!(budget.in_use(), 100_000);
        r.release();
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn a_hold_is_asked_once_the_size_is_known_and_its_error_is_the_reads() {
        let budget = budget_of(1 << 20);
        let mut input = frame(&[1; 300]);
        input.extend(frame(&[2; 20_000]));
        input.extend(frame(&[3; 10]));
        let mut r = FrameReader::new(&input[..], 1 << 20).with_budget(Arc::clone(&budget));
        let mut asked = Vec::new();
        // Declined: the frame is read as by `read_frame`.
        let f = r
            .read_frame_held(|size| {
                asked.push(size);
                None::<std::future::Ready<Result<(), FrameError>>>
            })
            .await
            .expect("read")
            .expect("frame");
        assert_eq!(&f[..], &[1; 300][..]);
        // A wait that fails fails the read, before the frame is charged.
        let err = r
            .read_frame_held(|size| {
                asked.push(size);
                Some(std::future::ready(Err(FrameError::Io(
                    std::io::Error::other("reset"),
                ))))
            })
            .await;
        assert!(matches!(err, Err(FrameError::Io(_))), "{err:?}");
        assert_eq!(asked, [300, 20_000]);
        assert_eq!(
            budget.in_use(),
            0,
            "the first frame given back, the second not charged"
        );
        // The frame whose wait failed is still the next one.
        let f = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(&f[..], &[2; 20_000][..]);
        let f = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(&f[..], &[3; 10][..]);
        assert!(r.read_frame().await.expect("read").is_none());
    }

    #[tokio::test]
    async fn a_new_frame_waits_for_the_budget_and_goes_on_when_it_is_freed() {
        let budget = budget_of(32 * 1024);
        let (mut tx_a, rx_a) = tokio::io::duplex(1 << 16);
        let (mut tx_c, rx_c) = tokio::io::duplex(1 << 16);
        let mut a = FrameReader::new(rx_a, 1 << 20).with_budget(Arc::clone(&budget));
        let mut c = FrameReader::new(rx_c, 1 << 20).with_budget(Arc::clone(&budget));
        let big = frame(&[7; 32 * 1024]);
        tx_a.write_all(&big[..20_004]).await.expect("write");
        assert!(try_read(&mut a).await.is_none());
        assert_eq!(budget.in_use(), 32 * 1024, "A's growth is charged");
        tx_c.write_all(&frame(b"small")).await.expect("write");
        assert!(try_read(&mut c).await.is_none(), "C must wait for memory");
        tx_a.write_all(&big[20_004..]).await.expect("write");
        let f = a.read_frame().await.expect("read").expect("frame");
        assert_eq!(f.len(), 32 * 1024);
        // Still held: A's frame is being forwarded until A reads again.
        assert!(try_read(&mut c).await.is_none(), "C must still wait");
        drop(f);
        assert!(try_read(&mut a).await.is_none(), "A is idle");
        assert_eq!(budget.in_use(), 0);
        let small = c.read_frame().await.expect("read").expect("frame");
        assert_eq!(&small[..], b"small");
        drop((a, c));
        assert_eq!(budget.in_use(), 0, "everything given back");
    }

    #[tokio::test]
    async fn a_partly_read_frame_finishes_on_the_overdraft_one_at_a_time() {
        let budget = budget_of(64 * 1024);
        let reader = |rx| FrameReader::new(rx, 1 << 20).with_budget(Arc::clone(&budget));
        let (mut tx_a, rx_a) = tokio::io::duplex(1 << 16);
        let (mut tx_b, rx_b) = tokio::io::duplex(1 << 16);
        let (mut tx_d, rx_d) = tokio::io::duplex(1 << 16);
        let (mut a, mut b, mut d) = (reader(rx_a), reader(rx_b), reader(rx_d));
        // B and D each hold a first chunk of a 28 KiB frame; A holds the
        // rest of the budget with all but the last byte of a 32 KiB frame.
        let b_frame = frame(&[2; 28 * 1024]);
        let d_frame = frame(&[4; 28 * 1024]);
        let a_frame = frame(&[1; 32 * 1024]);
        tx_b.write_all(&b_frame[..10_004]).await.expect("write");
        assert!(try_read(&mut b).await.is_none());
        tx_d.write_all(&d_frame[..10_004]).await.expect("write");
        assert!(try_read(&mut d).await.is_none());
        tx_a.write_all(&a_frame[..a_frame.len() - 1])
            .await
            .expect("write");
        assert!(try_read(&mut a).await.is_none());
        assert_eq!(budget.in_use(), 64 * 1024);
        // B needs more than is left. If every partial frame waited for
        // memory, none would ever finish; B finishes on the overdraft.
        tx_b.write_all(&b_frame[10_004..]).await.expect("write");
        let fb = b.read_frame().await.expect("read").expect("B finishes");
        assert_eq!(fb.len(), 28 * 1024);
        // One overdraft at a time: D waits while B's frame is still held.
        tx_d.write_all(&d_frame[10_004..]).await.expect("write");
        assert!(try_read(&mut d).await.is_none(), "D must wait");
        drop(fb);
        assert!(try_read(&mut b).await.is_none(), "B is idle again");
        let fd = d.read_frame().await.expect("read").expect("D finishes");
        assert_eq!(fd.len(), 28 * 1024);
        tx_a.write_all(&a_frame[a_frame.len() - 1..])
            .await
            .expect("write");
        let fa = a.read_frame().await.expect("read").expect("A finishes");
        assert_eq!(fa.len(), 32 * 1024);
        drop((fa, fd, a, b, d));
        assert_eq!(budget.in_use(), 0, "everything given back");
    }

    #[tokio::test(start_paused = true)]
    async fn a_frame_without_memory_within_the_wait_closes_and_cancelling_does_not_restart_the_wait(
    ) {
        let budget = Budget::new(
            32 * 1024,
            Duration::from_secs(3),
            "MIRROR_PROXY_MAX_BUFFERED_RESPONSE_BYTES",
            Gauge::default(),
        );
        let (mut tx_a, rx_a) = tokio::io::duplex(1 << 16);
        let (mut tx_c, rx_c) = tokio::io::duplex(1 << 16);
        let mut a = FrameReader::new(rx_a, 1 << 20).with_budget(Arc::clone(&budget));
        let mut c = FrameReader::new(rx_c, 1 << 20).with_budget(Arc::clone(&budget));
        // A holds the whole budget with a frame it never hands on (a write
        // that does not progress).
        tx_a.write_all(&frame(&[7; 32 * 1024]))
            .await
            .expect("write");
        let held = a.read_frame().await.expect("read").expect("frame");
        tx_c.write_all(&frame(b"small")).await.expect("write");
        let started = Instant::now();
        // A select! that drops the wait now and then (every 100 ms) must not
        // restart its bound.
        let err = loop {
            if let Some(done) = try_read(&mut c).await {
                break done.expect_err("no memory: the frame must fail");
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "the wait was restarted by each cancellation"
            );
        };
        assert!(
            matches!(
                err,
                FrameError::BudgetWait {
                    size: 5,
                    budget: 32768,
                    ms: 3000,
                    ..
                }
            ),
            "{err:?}"
        );
        let waited = started.elapsed();
        assert!(
            (Duration::from_secs(3)..Duration::from_millis(3200)).contains(&waited),
            "waited {waited:?}"
        );
        assert!(
            err.to_string()
                .contains("MIRROR_PROXY_MAX_BUFFERED_RESPONSE_BYTES"),
            "{err}"
        );
        drop(held);
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_was_cancelled_and_then_served_does_not_count_against_the_next() {
        let budget = Budget::new(
            32 * 1024,
            Duration::from_secs(3),
            "MIRROR_PROXY_MAX_BUFFERED_BYTES",
            Gauge::default(),
        );
        let (mut tx_a, rx_a) = tokio::io::duplex(1 << 16);
        let (mut tx_c, rx_c) = tokio::io::duplex(1 << 16);
        let mut a = FrameReader::new(rx_a, 1 << 20).with_budget(Arc::clone(&budget));
        let mut c = FrameReader::new(rx_c, 1 << 20).with_budget(Arc::clone(&budget));
        tx_a.write_all(&frame(&[7; 32 * 1024]))
            .await
            .expect("write");
        let held = a.read_frame().await.expect("read").expect("frame");
        // C waits 2 s (cancelled every 100 ms), then memory comes back.
        tx_c.write_all(&frame(b"one")).await.expect("write");
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(2) {
            assert!(try_read(&mut c).await.is_none(), "C must wait");
        }
        drop(held);
        a.release();
        let one = c.read_frame().await.expect("read").expect("frame");
        assert_eq!(&one[..], b"one");
        drop(one);
        c.release();
        // A takes everything again; C's next wait has its own 3 s.
        tx_a.write_all(&frame(&[8; 32 * 1024]))
            .await
            .expect("write");
        let held = a.read_frame().await.expect("read").expect("frame");
        tx_c.write_all(&frame(b"two")).await.expect("write");
        let again = Instant::now();
        let err = c.read_frame().await.expect_err("no memory");
        assert!(matches!(err, FrameError::BudgetWait { .. }), "{err:?}");
        assert!(
            again.elapsed() >= Duration::from_secs(3),
            "the second wait was cut short: {:?}",
            again.elapsed()
        );
        drop(held);
    }

    #[tokio::test]
    async fn a_dropped_reader_gives_back_the_frame_it_handed_out_and_the_one_it_was_reading() {
        let held = Gauge::default();
        let budget = Budget::new(
            1 << 20,
            Duration::from_secs(60),
            "MIRROR_PROXY_MAX_BUFFERED_BYTES",
            Gauge::clone(&held),
        );
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 1 << 20).with_budget(Arc::clone(&budget));
        tx.write_all(&frame(&[1; 100_000])).await.expect("write");
        let f = r.read_frame().await.expect("read").expect("frame");
        // Half of the next frame: the first is released, the second charged.
        tx.write_all(&frame(&[2; 200_000])[..50_004])
            .await
            .expect("write");
        assert!(try_read(&mut r).await.is_none());
        assert!(budget.in_use() >= 50_000, "{}", budget.in_use());
        assert_eq!(held.get(), budget.in_use() as i64, "the gauge follows");
        // Another connection is reset while its frame is handed out (being
        // written), the first while its second frame is part-read.
        let (mut tx2, rx2) = tokio::io::duplex(1 << 20);
        let mut r2 = FrameReader::new(rx2, 1 << 20).with_budget(Arc::clone(&budget));
        tx2.write_all(&frame(&[3; 300_000])).await.expect("write");
        let f2 = r2.read_frame().await.expect("read").expect("frame");
        assert!(budget.in_use() >= 350_000, "{}", budget.in_use());
        drop((r2, tx2, r, tx));
        assert_eq!(
            budget.in_use(),
            0,
            "the handed-out frames are still alive, but their readers are gone"
        );
        drop((f, f2));
        assert_eq!(budget.in_use(), 0, "everything given back on close");
        assert_eq!(held.get(), 0, "the gauge back to 0");
    }

    #[tokio::test]
    async fn a_released_frame_gives_its_budget_back_before_the_next_read() {
        let budget = budget_of(1 << 20);
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 1 << 20).with_budget(Arc::clone(&budget));
        tx.write_all(&frame(&[1; 100_000])).await.expect("write");
        let f = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(budget.in_use(), 100_000);
        drop(f);
        r.release();
        assert_eq!(budget.in_use(), 0, "given back without another read");
        r.release();
        assert_eq!(budget.in_use(), 0, "and only once");
        tx.write_all(&frame(&[2; 10])).await.expect("write");
        let f = r.read_frame().await.expect("read").expect("frame");
        assert_eq!(&f[..], &[2; 10]);
        assert_eq!(budget.in_use(), 10);
        drop((f, r));
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn a_connection_holds_one_frame_of_the_budget_however_many_it_pipelines() {
        let budget = budget_of(1 << 20);
        let (mut tx, rx) = tokio::io::duplex(1 << 20);
        let mut r = FrameReader::new(rx, 1 << 20).with_budget(Arc::clone(&budget));
        let mut input = Vec::new();
        for i in 0..5u8 {
            input.extend(frame(&vec![i; 100_000]));
        }
        tx.write_all(&input).await.expect("write");
        for i in 0..5u8 {
            let f = r.read_frame().await.expect("read").expect("frame");
            assert_eq!(f[0], i);
            // The others wait in the socket, not in charged memory.
            assert_eq!(budget.in_use(), 100_000, "frame {i}");
        }
        assert!(try_read(&mut r).await.is_none());
        assert_eq!(budget.in_use(), 0);
    }

    #[tokio::test]
    async fn a_frame_larger_than_the_budget_is_refused() {
        let budget = budget_of(4096);
        let input = [0, 0, 0x10, 0x01];
        let mut r = FrameReader::new(&input[..], 1 << 20).with_budget(budget);
        let err = r.read_frame().await;
        assert!(
            matches!(
                err,
                Err(FrameError::OverBudget {
                    size: 4097,
                    budget: 4096,
                    ..
                })
            ),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn write_frame_prefixes_the_size() {
        let mut out = Vec::new();
        write_frame(&mut out, &[1, 2, 3]).await.expect("write");
        assert_eq!(out, vec![0, 0, 0, 3, 1, 2, 3]);
    }
}
