//! One HTTP/1.1 request to an admin endpoint (the proxy's or the
//! replicator's), written by hand on a plain socket so that a test sees the
//! answer exactly as sent: the status line, the body, and the whole text.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

/// An answer as read until the server closed the connection.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The first line, e.g. `HTTP/1.1 200 OK`.
    pub status: String,
    /// What follows the head (empty when there is no blank line after it).
    pub body: String,
    /// Head and body as received, for messages and raw checks.
    pub text: String,
}

impl Answer {
    fn parse(text: String) -> Answer {
        // Lenient on purpose: a test that gets a headless answer should fail
        // on what it checks, with the text in its message.
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        Answer {
            status: head.lines().next().unwrap_or_default().to_string(),
            body: body.to_string(),
            text: text.clone(),
        }
    }

    /// The status code from the status line.
    pub fn code(&self) -> Result<u16> {
        self.status
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("status code: {}", self.text))
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_str(&self.body).with_context(|| format!("not JSON: {}", self.text))
    }
}

/// `method path` to `addr` with `Connection: close`, the extra `headers`
/// (each ending in `\r\n`) and `body`; reads the whole answer, each read
/// waiting at most `timeout`.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
    timeout: Duration,
) -> Result<Answer> {
    let mut s = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(timeout))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    Ok(Answer::parse(text))
}

/// `GET path` at `addr`, waiting at most 10 s a read (a page such as
/// `/metrics` or `/healthz`, answered at once).
pub fn get(addr: &str, path: &str) -> Result<Answer> {
    request(addr, "GET", path, "", "", Duration::from_secs(10))
}
