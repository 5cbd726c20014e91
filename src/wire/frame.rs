//! Length-prefixed Kafka frames: a big-endian int32 size, then that many
//! bytes.
//!
//! The reader checks the size against the configured maximum before
//! allocating, gives every frame its own allocation (so a Produce frame can
//! be patched in place and forwarded without a copy), and is cancel-safe: all
//! progress lives in the reader, so it can sit in a `tokio::select!`.

use std::io::IoSlice;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error(
        "frame of {size} bytes exceeds the maximum of {max} bytes (MIRROR_PROXY_MAX_FRAME_BYTES)"
    )]
    TooLarge { size: usize, max: usize },
    #[error("frame size {0} is negative")]
    NegativeSize(i32),
    #[error("connection closed in the middle of a frame ({buffered} bytes read)")]
    Truncated { buffered: usize },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads whole frames from one half of a connection.
pub struct FrameReader<R> {
    // Small frames come out of this buffer without a syscall each.
    inner: BufReader<R>,
    max: usize,
    size: [u8; 4],
    size_read: usize,
    body: Option<BytesMut>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    pub fn new(inner: R, max: usize) -> Self {
        FrameReader {
            inner: BufReader::with_capacity(64 * 1024, inner),
            max,
            size: [0; 4],
            size_read: 0,
            body: None,
        }
    }

    /// The next frame without its size prefix, or `None` on a clean close
    /// between frames.
    pub async fn read_frame(&mut self) -> Result<Option<BytesMut>, FrameError> {
        while self.body.is_none() {
            let n = self.inner.read(&mut self.size[self.size_read..]).await?;
            if n == 0 {
                return match self.size_read {
                    0 => Ok(None),
                    buffered => Err(FrameError::Truncated { buffered }),
                };
            }
            self.size_read += n;
            if self.size_read == 4 {
                let size = i32::from_be_bytes(self.size);
                self.size_read = 0;
                let size = usize::try_from(size).map_err(|_| FrameError::NegativeSize(size))?;
                if size > self.max {
                    return Err(FrameError::TooLarge {
                        size,
                        max: self.max,
                    });
                }
                self.body = Some(BytesMut::with_capacity(size));
                self.size = (size as u32).to_be_bytes();
            }
        }
        let size = u32::from_be_bytes(self.size) as usize;
        loop {
            let body = self
                .body
                .as_mut()
                .ok_or(FrameError::Truncated { buffered: 0 })?;
            let remaining = size - body.len();
            if remaining == 0 {
                self.size = [0; 4];
                return Ok(self.body.take());
            }
            let n = self.inner.read_buf(&mut body.limit(remaining)).await?;
            if n == 0 {
                return Err(FrameError::Truncated {
                    buffered: 4 + body.len(),
                });
            }
        }
    }
}

/// Write one frame with its size prefix, in one vectored write where the
/// stream supports it (one syscall per frame instead of two).
pub async fn write_frame<W: AsyncWrite + Unpin>(w: &mut W, frame: &[u8]) -> std::io::Result<()> {
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

    #[tokio::test]
    async fn write_frame_survives_short_writes() {
        let mut out = Trickle(Vec::new());
        write_frame(&mut out, &[9, 8, 7, 6, 5])
            .await
            .expect("write");
        assert_eq!(out.0, vec![0, 0, 0, 5, 9, 8, 7, 6, 5]);
    }

    #[tokio::test]
    async fn write_frame_prefixes_the_size() {
        let mut out = Vec::new();
        write_frame(&mut out, &[1, 2, 3]).await.expect("write");
        assert_eq!(out, vec![0, 0, 0, 3, 1, 2, 3]);
    }
}
