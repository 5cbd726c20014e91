//! A fault-injecting TCP relay between the proxy and a broker that holds one
//! Produce request on the network: armed, it takes the next Produce frame
//! of a given client id off a proxy → broker connection, cuts the proxy's
//! side of that connection at once (the proxy sees its request sent and
//! its answer lost), and delivers the held frame to the broker on the
//! original broker-side connection only when released (or after a bound),
//! discarding the broker's answer.
//!
//! A fault a real broker cannot show on demand: a request that reached (or
//! was on its way to) the broker before its connection dropped, appended
//! only after the proxy had already read the partition's log tail.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::Result;

/// The largest frame the relay reads (test traffic is far smaller).
const MAX_FRAME: usize = 64 << 20;

#[derive(Default)]
struct Shared {
    target: Mutex<Option<SocketAddr>>,
    /// The client id whose next Produce is held; `None`: disarmed.
    armed: Mutex<Option<String>>,
    /// Set by [`HoldRelay::release`]; the condvar wakes the holder.
    released: Mutex<bool>,
    release: Condvar,
    /// Frames held, delivered, and broker answers to them read.
    held: AtomicU64,
    delivered: AtomicU64,
    answered: AtomicU64,
    stop: AtomicBool,
}

pub struct HoldRelay {
    port: u16,
    shared: Arc<Shared>,
}

impl HoldRelay {
    pub fn start() -> Result<HoldRelay> {
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
        Ok(HoldRelay { port, shared })
    }

    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn set_target(&self, target: SocketAddr) {
        if let Ok(mut t) = self.shared.target.lock() {
            *t = Some(target);
        }
    }

    /// Hold the next Produce request whose client id is `client_id`.
    pub fn hold_next_produce(&self, client_id: &str) {
        if let Ok(mut a) = self.shared.armed.lock() {
            *a = Some(client_id.to_string());
        }
    }

    /// Deliver the held request to the broker now.
    pub fn release(&self) {
        if let Ok(mut r) = self.shared.released.lock() {
            *r = true;
        }
        self.shared.release.notify_all();
    }

    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::SeqCst)
    }

    pub fn delivered(&self) -> u64 {
        self.shared.delivered.load(Ordering::SeqCst)
    }

    /// Answers the broker sent to delivered held requests.
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::SeqCst)
    }
}

impl Drop for HoldRelay {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.release();
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

/// Api key and client id of a request frame (header v1+).
fn produce_client_id(frame: &[u8]) -> Option<&str> {
    let api_key = i16::from_be_bytes(frame.get(0..2)?.try_into().ok()?);
    if api_key != 0 {
        return None;
    }
    let len = i16::from_be_bytes(frame.get(8..10)?.try_into().ok()?);
    let len = usize::try_from(len).ok()?;
    std::str::from_utf8(frame.get(10..10 + len)?).ok()
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
    let holding = Arc::new(AtomicBool::new(false));
    let hold = Arc::clone(&holding);
    let s2 = Arc::clone(s);
    // Proxy to broker, frame by frame.
    thread::spawn(move || {
        loop {
            let mut size = [0u8; 4];
            if c_read.read_exact(&mut size).is_err() {
                break;
            }
            let n = u32::from_be_bytes(size) as usize;
            if n > MAX_FRAME {
                break;
            }
            let mut body = vec![0u8; n];
            if c_read.read_exact(&mut body).is_err() {
                break;
            }
            let take = {
                let mut armed = match s2.armed.lock() {
                    Ok(a) => a,
                    Err(_) => break,
                };
                let hit = armed.is_some() && produce_client_id(&body) == armed.as_deref();
                if hit {
                    *armed = None;
                }
                hit
            };
            if !take {
                if s_write.write_all(&size).is_err() || s_write.write_all(&body).is_err() {
                    break;
                }
                continue;
            }
            // Hold it: the proxy's side is cut now, the broker's side stays.
            hold.store(true, Ordering::SeqCst);
            s2.held.fetch_add(1, Ordering::SeqCst);
            let _ = c_read.shutdown(Shutdown::Both);
            if let Ok(mut released) = s2.released.lock() {
                // Bounded: delivered after 60 s even if never released.
                let mut left = 600;
                while !*released && left > 0 {
                    match s2
                        .release
                        .wait_timeout(released, Duration::from_millis(100))
                    {
                        Ok((r, _)) => released = r,
                        Err(_) => return,
                    }
                    left -= 1;
                }
            }
            if s_write.write_all(&size).is_ok() && s_write.write_all(&body).is_ok() {
                s2.delivered.fetch_add(1, Ordering::SeqCst);
            }
            return;
        }
        let _ = s_write.shutdown(Shutdown::Both);
        let _ = c_read.shutdown(Shutdown::Both);
    });
    // Broker to proxy; once holding, the broker's bytes (the held request's
    // answer) are read and dropped.
    let (mut s_read, mut c_write) = (server, client);
    let _ = s_read.set_read_timeout(Some(Duration::from_secs(120)));
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match s_read.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if holding.load(Ordering::SeqCst) {
                    if s.delivered.load(Ordering::SeqCst) > s.answered.load(Ordering::SeqCst) {
                        s.answered.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    continue;
                }
                if c_write.write_all(&buf[..n]).is_err() {
                    if holding.load(Ordering::SeqCst) {
                        continue;
                    }
                    break;
                }
            }
        }
    }
    let _ = s_read.shutdown(Shutdown::Both);
    let _ = c_write.shutdown(Shutdown::Both);
}
