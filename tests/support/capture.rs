//! A recording relay between clients and a broker: every request frame and
//! the response frame with the same correlation id are kept, so tests can
//! check the proxy's walk against real traffic and fuzzing can start from it.
//!
//! Point a broker's `advertised.listeners` at the relay, so clients that
//! follow Metadata keep going through it.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread;

use anyhow::{Context, Result};

use super::kafka::{KafkaCluster, KafkaOptions};

/// One request and its response (none for `acks=0` Produce).
#[derive(Debug, Clone)]
pub struct Exchange {
    pub api_key: i16,
    pub api_version: i16,
    /// The request frame without its size prefix.
    pub request: Vec<u8>,
    pub response: Option<Vec<u8>>,
}

type Shared = Arc<Mutex<Vec<Exchange>>>;

/// The relay; lives as long as the test process.
pub struct CaptureRelay {
    pub port: u16,
    target: Arc<Mutex<Option<String>>>,
    exchanges: Shared,
}

impl CaptureRelay {
    /// Listen on a free loopback port; forward once [`Self::forward_to`] is set.
    pub fn start() -> Result<CaptureRelay> {
        let listener = TcpListener::bind("127.0.0.1:0").context("binding the capture relay")?;
        let port = listener.local_addr()?.port();
        let target: Arc<Mutex<Option<String>>> = Arc::default();
        let exchanges: Shared = Arc::default();
        let (t, x) = (Arc::clone(&target), Arc::clone(&exchanges));
        thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Some(addr) = t.lock().ok().and_then(|g| g.clone()) else {
                    continue; // not ready: the client sees a closed connection
                };
                let Ok(broker) = TcpStream::connect(&addr) else {
                    continue;
                };
                relay(client, broker, Arc::clone(&x));
            }
        });
        Ok(CaptureRelay {
            port,
            target,
            exchanges,
        })
    }

    /// A relay in front of a new single-node broker that advertises the
    /// relay's address, so clients that follow Metadata stay on the relay.
    /// Keep the broker alive as long as the relay is used.
    pub fn start_with_broker() -> Result<(CaptureRelay, KafkaCluster)> {
        let relay = CaptureRelay::start()?;
        let broker = KafkaCluster::start(KafkaOptions::default().property(
            "advertised.listeners",
            format!("PLAINTEXT://{}", relay.address()),
        ))?;
        relay.forward_to(&broker.bootstrap());
        Ok((relay, broker))
    }

    /// `127.0.0.1:port` of the relay.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub fn forward_to(&self, addr: &str) {
        if let Ok(mut t) = self.target.lock() {
            *t = Some(addr.to_string());
        }
    }

    pub fn exchanges(&self) -> Vec<Exchange> {
        self.exchanges.lock().map(|x| x.clone()).unwrap_or_default()
    }
}

fn read_frame(r: &mut impl Read) -> Option<Vec<u8>> {
    let mut size = [0u8; 4];
    r.read_exact(&mut size).ok()?;
    let size = usize::try_from(i32::from_be_bytes(size)).ok()?;
    let mut frame = vec![0; size];
    r.read_exact(&mut frame).ok()?;
    Some(frame)
}

fn write_frame(w: &mut impl Write, frame: &[u8]) -> Option<()> {
    w.write_all(&(frame.len() as u32).to_be_bytes()).ok()?;
    w.write_all(frame).ok()
}

fn relay(client: TcpStream, broker: TcpStream, exchanges: Shared) {
    // correlation id → index in `exchanges`
    let pending: Arc<Mutex<HashMap<i32, usize>>> = Arc::default();
    let (Ok(mut c_read), Ok(mut b_write)) = (client.try_clone(), broker.try_clone()) else {
        return;
    };
    let (p, x) = (Arc::clone(&pending), Arc::clone(&exchanges));
    thread::spawn(move || {
        while let Some(frame) = read_frame(&mut c_read) {
            if frame.len() >= 8 {
                let key = i16::from_be_bytes([frame[0], frame[1]]);
                let version = i16::from_be_bytes([frame[2], frame[3]]);
                let correlation = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
                if let (Ok(mut x), Ok(mut p)) = (x.lock(), p.lock()) {
                    p.insert(correlation, x.len());
                    x.push(Exchange {
                        api_key: key,
                        api_version: version,
                        request: frame.clone(),
                        response: None,
                    });
                }
            }
            if write_frame(&mut b_write, &frame).is_none() {
                break;
            }
        }
        let _ = b_write.shutdown(Shutdown::Write);
    });
    let (mut b_read, mut c_write) = (broker, client);
    thread::spawn(move || {
        while let Some(frame) = read_frame(&mut b_read) {
            if frame.len() >= 4 {
                let correlation = i32::from_be_bytes([frame[0], frame[1], frame[2], frame[3]]);
                let index = pending.lock().ok().and_then(|mut p| p.remove(&correlation));
                if let (Some(i), Ok(mut x)) = (index, exchanges.lock()) {
                    if let Some(e) = x.get_mut(i) {
                        e.response = Some(frame.clone());
                    }
                }
            }
            if write_frame(&mut c_write, &frame).is_none() {
                break;
            }
        }
        let _ = c_write.shutdown(Shutdown::Both);
    });
}
