//! A TCP relay for tests that need a connection to break: it forwards bytes
//! both ways between its port and a target, and, while cutting is on, dooms
//! the connection of every `n`th chunk sent to the target (over all
//! connections): that chunk is delivered, and the connection is killed
//! (both sides) at the next chunk the target answers, which is not passed
//! on. Counting what is sent, not answered, cuts at most one answer in `n`
//! however large answers are.
//!
//! A fault a real broker cannot be made to show on demand: a connection lost
//! after the broker read (and acted on) a request but before its answer
//! arrived.
//!
//! Armed with [`Relay::trickle_next_answer`], it instead passes on the
//! start of the target's next answer and then the rest a byte at a time,
//! slowly: a broker that stalls or trickles in the middle of a response
//! (a GC pause, a sick disk, a congested path), which a real broker cannot
//! be made to do on demand either.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::Result;

/// How the next answer is trickled ([`Relay::trickle_next_answer`]).
#[derive(Clone, Copy)]
struct Trickle {
    /// Bytes passed on at once.
    first: usize,
    /// Then one byte per this long.
    interval: Duration,
}

#[derive(Default)]
struct Shared {
    target: Mutex<Option<SocketAddr>>,
    /// Doom the connection of every `cut_every`th chunk to the target; 0:
    /// never.
    cut_every: AtomicU64,
    chunks: AtomicU64,
    cuts: AtomicU64,
    /// Armed: the next answer, on whichever connection, is trickled.
    trickle: Mutex<Option<Trickle>>,
    /// When the connection trickling its answer could no longer write to
    /// the relay's client (it was closed).
    trickle_cut: Mutex<Option<Instant>>,
    stop: AtomicBool,
}

/// The relay; stops accepting when dropped (live connections end with
/// their peers).
pub struct Relay {
    port: u16,
    shared: Arc<Shared>,
}

impl Relay {
    /// Listens on a free local port; connections are closed until
    /// [`set_target`](Self::set_target).
    pub fn start() -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = conn else { continue };
                let s = Arc::clone(&s);
                thread::spawn(move || relay(client, &s));
            }
        });
        Ok(Relay { port, shared })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set_target(&self, target: SocketAddr) {
        if let Ok(mut t) = self.shared.target.lock() {
            *t = Some(target);
        }
    }

    /// Doom the connection of every `n`th chunk sent to the target (0:
    /// stop cutting).
    pub fn cut_every(&self, n: u64) {
        self.shared.cut_every.store(n, Ordering::SeqCst);
    }

    /// Connections cut so far.
    pub fn cuts(&self) -> u64 {
        self.shared.cuts.load(Ordering::SeqCst)
    }

    /// The target's next answer (its next chunk, on whichever connection)
    /// is passed on `first` bytes at once, then one byte per `interval`,
    /// until the relay's client closes the connection (or the relay is
    /// dropped).
    pub fn trickle_next_answer(&self, first: usize, interval: Duration) {
        if let Ok(mut t) = self.shared.trickle.lock() {
            *t = Some(Trickle { first, interval });
        }
    }

    /// When the connection trickling an answer found its client gone.
    pub fn trickle_cut(&self) -> Option<Instant> {
        self.shared.trickle_cut.lock().ok().and_then(|t| *t)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees `stop`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn relay(client: TcpStream, s: &Arc<Shared>) {
    let target = s.target.lock().ok().and_then(|t| *t);
    let Some(target) = target else { return };
    let Ok(server) = TcpStream::connect(target) else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (Ok(mut c_read), Ok(mut s_write)) = (client.try_clone(), server.try_clone()) else {
        return;
    };
    let doomed = Arc::new(AtomicBool::new(false));
    let doom = Arc::clone(&doomed);
    let s2 = Arc::clone(s);
    // Client to target, dooming.
    thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match c_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s_write.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    let every = s2.cut_every.load(Ordering::SeqCst);
                    let chunk = s2.chunks.fetch_add(1, Ordering::SeqCst) + 1;
                    if every > 0 && chunk.is_multiple_of(every) {
                        doom.store(true, Ordering::SeqCst);
                    }
                }
            }
        }
        let _ = s_write.shutdown(Shutdown::Both);
        let _ = c_read.shutdown(Shutdown::Both);
    });
    // Target to client: a doomed connection dies at its next answer.
    let (mut s_read, mut c_write) = (server, client);
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if doomed.load(Ordering::SeqCst) {
                    s.cuts.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                let trickle = s.trickle.lock().ok().and_then(|mut t| t.take());
                if let Some(t) = trickle {
                    trickle_answer(&mut s_read, &mut c_write, &buf[..n], t, s);
                    break;
                }
                if c_write.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = s_read.shutdown(Shutdown::Both);
    let _ = c_write.shutdown(Shutdown::Both);
}

/// Pass on `t.first` bytes of the answer that began with `chunk`, then the
/// rest a byte per `t.interval` (reading more of it from `from` as needed),
/// until `to` is closed or the relay stops.
fn trickle_answer(from: &mut TcpStream, to: &mut TcpStream, chunk: &[u8], t: Trickle, s: &Shared) {
    let mut pending = chunk.to_vec();
    let mut buf = vec![0u8; 64 * 1024];
    let mut passed = 0;
    loop {
        if s.stop.load(Ordering::SeqCst) {
            return;
        }
        if pending.is_empty() {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
        }
        let n = if passed < t.first {
            (t.first - passed).min(pending.len())
        } else {
            1
        };
        if to.write_all(&pending[..n]).is_err() {
            if let Ok(mut cut) = s.trickle_cut.lock() {
                cut.get_or_insert_with(Instant::now);
            }
            return;
        }
        pending.drain(..n);
        passed += n;
        if passed > t.first {
            thread::sleep(t.interval);
        }
    }
}
