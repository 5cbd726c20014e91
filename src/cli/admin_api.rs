//! The admin API's client: where the proxy's admin endpoint is
//! (`MIRROR_PROXY_ADMIN_URL`, `MIRROR_PROXY_ADMIN_TOKEN`), one plain
//! HTTP/1.1 exchange with it, and what can go wrong doing so ([`CliError`]).

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::control::api::ApiError;

use super::{EXIT_ERROR, EXIT_REFUSED};

/// Default admin URL: the default `MIRROR_PROXY_ADMIN_LISTEN`.
pub(crate) const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9190";

/// Largest admin API answer read.
const MAX_BODY: usize = 16 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong talking to the admin API. Each message quotes its
/// cause, which is also its `source()`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error("MIRROR_PROXY_ADMIN_URL {url:?}: not a URL: {source}")]
    NotAUrl {
        url: String,
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    /// A URL the CLI cannot use (the problem says why).
    #[error("MIRROR_PROXY_ADMIN_URL {url:?}: {problem}")]
    Url { url: String, problem: &'static str },
    #[error("connecting to the admin API at {addr}: {source}")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connecting to the admin API at {addr}: no connection within {} s", .within.as_secs())]
    ConnectTimeout { addr: String, within: Duration },
    #[error("admin API request {method} {path}: {source}")]
    Http {
        method: String,
        path: String,
        #[source]
        source: HttpError,
    },
    /// The API answered with an error status; `message` is its `error`.
    #[error("admin API answered {status}: {message}")]
    Status { status: u16, message: String },
    #[error("admin API answer to {path} is not the JSON expected: {source}")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("encoding the request to {path}: {source}")]
    Encode {
        path: String,
        #[source]
        source: serde_json::Error,
    },
}

/// What failed in one HTTP exchange with the admin API.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    #[error(transparent)]
    Hyper(#[from] hyper::Error),
    #[error(transparent)]
    Request(#[from] hyper::http::Error),
    #[error("reading the answer: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("no answer within {} s", .0.as_secs())]
    Timeout(Duration),
    /// The command's own runtime could not start.
    #[error("starting the runtime: {0}")]
    Runtime(#[source] std::io::Error),
}

impl CliError {
    /// The process exit code for this error.
    pub(crate) fn exit_code(&self) -> u8 {
        match self {
            CliError::Status {
                status: 404 | 409 | 412,
                ..
            } => EXIT_REFUSED,
            _ => EXIT_ERROR,
        }
    }
}

/// Where the admin API is and how to authenticate.
#[derive(Debug, Clone)]
pub(crate) struct AdminClient {
    /// host:port to connect to.
    addr: String,
    /// Path prefix (without trailing slash), e.g. "" or "/proxy-a".
    prefix: String,
    token: Option<String>,
}

/// An answer read as `T`, and the JSON it came as (for `--json`).
#[derive(Debug, Clone)]
pub(crate) struct Read<T> {
    pub(crate) typed: T,
    pub(crate) json: Value,
}

impl AdminClient {
    /// From `http://host:port[/prefix]` and an optional bearer token.
    pub(crate) fn new(url: &str, token: Option<String>) -> Result<AdminClient, CliError> {
        let bad = |problem: &'static str| CliError::Url {
            url: url.to_string(),
            problem,
        };
        let uri: Uri = url.parse().map_err(|source| CliError::NotAUrl {
            url: url.to_string(),
            source,
        })?;
        if uri.scheme_str() != Some("http") {
            return Err(bad(
                "only http:// is supported (the admin endpoint serves plain HTTP)",
            ));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let host = authority.host();
        let addr = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        Ok(AdminClient {
            addr,
            prefix: uri.path().trim_end_matches('/').to_string(),
            token: token.filter(|t| !t.is_empty()),
        })
    }

    /// From `MIRROR_PROXY_ADMIN_URL` and `MIRROR_PROXY_ADMIN_TOKEN`.
    pub(crate) fn from_env() -> Result<AdminClient, CliError> {
        let url = std::env::var("MIRROR_PROXY_ADMIN_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_ADMIN_URL.to_string());
        AdminClient::new(&url, std::env::var("MIRROR_PROXY_ADMIN_TOKEN").ok())
    }

    /// One request: the JSON body of a 2xx answer, as it came (error
    /// statuses become [`CliError::Status`]).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, CliError> {
        let full = format!("{}{path}", self.prefix);
        let http = |source: HttpError| CliError::Http {
            method: method.to_string(),
            path: full.clone(),
            source,
        };
        let stream =
            tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&self.addr))
                .await
                .map_err(|_| CliError::ConnectTimeout {
                    addr: self.addr.clone(),
                    within: CONNECT_TIMEOUT,
                })?
                .map_err(|source| CliError::Connect {
                    addr: self.addr.clone(),
                    source,
                })?;
        let exchange = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| http(e.into()))?;
            tokio::spawn(async move {
                let _ = conn.await;
            });
            let payload = match body {
                Some(v) => Bytes::from(v.to_string()),
                None => Bytes::new(),
            };
            let mut request = Request::builder()
                .method(method.clone())
                .uri(full.as_str())
                .header(HOST, self.addr.as_str());
            if body.is_some() {
                request = request.header(CONTENT_TYPE, "application/json");
            }
            if let Some(token) = &self.token {
                request = request.header(AUTHORIZATION, format!("Bearer {token}"));
            }
            let request = request
                .body(Full::new(payload))
                .map_err(|e| http(e.into()))?;
            let response = sender
                .send_request(request)
                .await
                .map_err(|e| http(e.into()))?;
            let status = response.status().as_u16();
            let bytes = Limited::new(response.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| http(HttpError::Body(e)))?
                .to_bytes();
            Ok::<_, CliError>((status, bytes))
        };
        let (status, bytes) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| http(HttpError::Timeout(timeout)))??;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ApiError>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).trim().to_string());
            return Err(CliError::Status { status, message });
        }
        let body = serde_json::from_slice(&bytes).map_err(|source| CliError::Json {
            path: full.clone(),
            source,
        })?;
        Ok(body)
    }

    /// One request whose answer is read as `T`.
    pub(crate) async fn read<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Read<T>, CliError> {
        let answer = self.call(method, path, body, REQUEST_TIMEOUT).await?;
        let typed = T::deserialize(&answer).map_err(|source| CliError::Json {
            path: format!("{}{path}", self.prefix),
            source,
        })?;
        Ok(Read {
            typed,
            json: answer,
        })
    }
}

/// Path segment encoding for a link name (names are [a-z0-9-], but the
/// argument comes from the command line).
pub(crate) fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

pub(crate) fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        let status = |status| CliError::Status {
            status,
            message: String::new(),
        };
        assert_eq!(status(404).exit_code(), EXIT_REFUSED);
        assert_eq!(status(409).exit_code(), EXIT_REFUSED);
        assert_eq!(status(412).exit_code(), EXIT_REFUSED);
        assert_eq!(status(401).exit_code(), EXIT_ERROR);
        let connect = CliError::Connect {
            addr: "x".into(),
            source: std::io::Error::from(std::io::ErrorKind::ConnectionRefused),
        };
        assert_eq!(connect.exit_code(), EXIT_ERROR);
    }

    /// The errors quote their cause, and keep it as their source.
    #[test]
    fn errors_carry_their_cause() {
        let e = CliError::Connect {
            addr: "127.0.0.1:1".into(),
            source: std::io::Error::other("refused here"),
        };
        assert_eq!(
            e.to_string(),
            "connecting to the admin API at 127.0.0.1:1: refused here"
        );
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "refused here");
        let e = AdminClient::new("http://exa mple", None).expect_err("not a URL");
        assert!(matches!(e, CliError::NotAUrl { .. }), "{e:?}");
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        let e = AdminClient::new("https://x:1", None).expect_err("https");
        assert_eq!(
            e.to_string(),
            "MIRROR_PROXY_ADMIN_URL \"https://x:1\": only http:// is supported (the admin endpoint serves plain HTTP)"
        );
        let e = CliError::Http {
            method: "GET".into(),
            path: "/links".into(),
            source: HttpError::Timeout(Duration::from_secs(30)),
        };
        assert_eq!(
            e.to_string(),
            "admin API request GET /links: no answer within 30 s"
        );
    }

    #[test]
    fn admin_urls() {
        let c = AdminClient::new("http://127.0.0.1:9190", Some("t".into())).expect("ok");
        assert_eq!((c.addr.as_str(), c.prefix.as_str()), ("127.0.0.1:9190", ""));
        let c = AdminClient::new("http://admin.example/p/", None).expect("ok");
        assert_eq!(
            (c.addr.as_str(), c.prefix.as_str()),
            ("admin.example:80", "/p")
        );
        let c = AdminClient::new("http://[::1]:9190", Some(String::new())).expect("ok");
        assert_eq!(c.addr, "[::1]:9190");
        assert!(c.token.is_none());
        assert!(AdminClient::new("https://x:1", None).is_err());
        assert!(AdminClient::new("not a url", None).is_err());
        assert_eq!(segment("east-1"), "east-1");
        assert_eq!(segment("a/b"), "a%2Fb");
    }
}
