//! A client's TCP socket, shared between the stream the session reads and
//! writes (plain, or under TLS) and a watch that tells when the client has
//! reset the connection.
//!
//! A session that waits on its broker (a request the broker holds, a write
//! the broker does not take) reads nothing from its client meanwhile, so it
//! would not see the client go. The watch waits for the socket's error
//! state (a reset, or a connection the kernel gave up on), which does not
//! consume or hold back anything the reader has yet to read; a clean close
//! (FIN) is no error: the client may still read what it is owed.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The client's socket as a stream; the same socket as its
/// [`ResetWatch`].
pub(crate) struct ClientSocket(Arc<TcpStream>);

/// Resolves [`reset`](ResetWatch::reset) when the client's socket is in
/// error.
#[derive(Clone)]
pub(crate) struct ResetWatch(Arc<TcpStream>);

impl ClientSocket {
    pub(crate) fn new(tcp: TcpStream) -> (ClientSocket, ResetWatch) {
        let tcp = Arc::new(tcp);
        (ClientSocket(Arc::clone(&tcp)), ResetWatch(tcp))
    }

    /// Writes with `write` once the socket is writable; a WouldBlock
    /// clears the readiness and the next poll waits.
    fn poll_write_with(
        &self,
        cx: &mut Context<'_>,
        mut write: impl FnMut(&TcpStream) -> io::Result<usize>,
    ) -> Poll<io::Result<usize>> {
        loop {
            ready!(self.0.poll_write_ready(cx))?;
            match write(&self.0) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                r => return Poll::Ready(r),
            }
        }
    }
}

impl ResetWatch {
    /// Resolves once the socket is in error (the client reset it).
    pub(crate) async fn reset(&self) {
        // Only the error state wakes this wait; an error getting it means
        // the socket is gone too.
        let _ = self.0.ready(Interest::ERROR).await;
    }
}

impl AsyncRead for ClientSocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            ready!(self.0.poll_read_ready(cx))?;
            // A WouldBlock clears the readiness: the next poll waits.
            match self.0.try_read_buf(buf) {
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for ClientSocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |tcp| tcp.try_write(buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_with(cx, |tcp| tcp.try_write_vectored(bufs))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Half-closes the socket: through a duplicate of its descriptor, since
    /// the socket itself is shared and tokio shuts down only an owned one.
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        use std::os::fd::AsFd;
        let dup = std::net::TcpStream::from(self.0.as_fd().try_clone_to_owned()?);
        Poll::Ready(dup.shutdown(std::net::Shutdown::Write))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn pair() -> (ClientSocket, ResetWatch, TcpStream) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let peer = TcpStream::connect(addr).await.expect("connect");
        let (tcp, _) = listener.accept().await.expect("accept");
        let (socket, watch) = ClientSocket::new(tcp);
        (socket, watch, peer)
    }

    #[tokio::test]
    async fn reads_and_writes_like_the_socket() {
        let (mut socket, _watch, mut peer) = pair().await;
        peer.write_all(b"ping").await.expect("write");
        let mut got = [0u8; 4];
        socket.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"ping");
        socket.write_all(b"pong").await.expect("write");
        socket.shutdown().await.expect("half-close");
        let mut back = Vec::new();
        peer.read_to_end(&mut back)
            .await
            .expect("read to the half-close");
        assert_eq!(back, b"pong");
    }

    #[tokio::test]
    async fn the_watch_sees_a_reset_but_not_a_clean_close_nor_unread_bytes() {
        let (_socket, watch, mut peer) = pair().await;
        peer.write_all(b"unread").await.expect("write");
        peer.shutdown().await.expect("FIN");
        assert!(
            tokio::time::timeout(Duration::from_millis(300), watch.reset())
                .await
                .is_err(),
            "unread bytes and a clean close are no reset"
        );
        peer.set_zero_linger().expect("SO_LINGER 0");
        drop(peer);
        tokio::time::timeout(Duration::from_secs(10), watch.reset())
            .await
            .expect("the reset is seen");
    }
}
