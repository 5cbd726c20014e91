//! The kernel floor of `scripts/perf.sh`: a TCP relay that moves bytes
//! with `splice(2)` (socket to pipe to socket), so they never enter user
//! space. A thread per direction blocks in `splice`; there is no runtime,
//! no buffer and no copy of ours. What it costs per GB is what the kernel
//! charges a relaying process for the TCP work on both sockets, the part
//! no proxy can remove by doing less of its own work. Linux only.
//!
//!   cargo run --release --example splice_relay -- LISTEN_ADDR TARGET_ADDR
//!
//! As for `tcp_relay`, the broker must advertise LISTEN_ADDR.

use std::env;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::thread;

/// The most one `splice` call moves; the pipe holds 64 KiB by default.
const CHUNK: usize = 1 << 16;

fn main() -> io::Result<()> {
    let mut args = env::args().skip(1);
    let (Some(listen), Some(target)) = (args.next(), args.next()) else {
        eprintln!("usage: splice_relay LISTEN_ADDR TARGET_ADDR");
        std::process::exit(2);
    };
    let listener = TcpListener::bind(&listen)?;
    eprintln!("relay ready: {listen} -> {target}");
    for client in listener.incoming() {
        let Ok(client) = client else { continue };
        let Ok(upstream) = TcpStream::connect(&target) else {
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = upstream.set_nodelay(true);
        let (Ok(client2), Ok(upstream2)) = (client.try_clone(), upstream.try_clone()) else {
            continue;
        };
        thread::spawn(move || pump(&client, &upstream));
        thread::spawn(move || pump(&upstream2, &client2));
    }
    Ok(())
}

/// Moves bytes from `from` to `to` until `from` ends or either fails, then
/// passes the end on.
fn pump(from: &TcpStream, to: &TcpStream) -> io::Result<()> {
    let (pipe_out, pipe_in) = pipe()?;
    let result = (|| loop {
        let n = splice(from.as_raw_fd(), pipe_in.as_raw_fd(), CHUNK)?;
        if n == 0 {
            return Ok(());
        }
        let mut left = n;
        while left > 0 {
            left -= splice(pipe_out.as_raw_fd(), to.as_raw_fd(), left)?;
        }
    })();
    let _ = to.shutdown(Shutdown::Write);
    result
}

/// A pipe: (read end, write end).
fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: `fds` is a valid array of two descriptors for pipe2 to fill.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and ours alone.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// One blocking `splice` of up to `len` bytes; 0 at the end of `from`.
fn splice(from: RawFd, to: RawFd, len: usize) -> io::Result<usize> {
    loop {
        // SAFETY: both descriptors are open for the call; null offsets mean
        // "the file's own position", as sockets and pipes require.
        let n = unsafe {
            libc::splice(
                from,
                std::ptr::null_mut(),
                to,
                std::ptr::null_mut(),
                len,
                libc::SPLICE_F_MOVE,
            )
        };
        if n >= 0 {
            return Ok(n as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}
