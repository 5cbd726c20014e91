//! The operator's commands against a running proxy's admin API: `links`, `failover NAME`, `start NAME`. Talks plain HTTP/1.1
//! to `MIRROR_PROXY_ADMIN_URL` with the bearer token
//! `MIRROR_PROXY_ADMIN_TOKEN`; prints tables, or the API's JSON with
//! `--json`.
//!
//! The answers are read into the API's own types (`control::api`, the
//! ones the proxy writes them from); rendering and exit codes are pure
//! functions of them (unit tested with fixed documents); `AdminClient` does
//! the I/O. `--json` prints the answer as it came.
//!
//! Exit codes: 0 every partition of the failover completed (accepted, or
//! refused and recorded), or a `--dry-run` found nothing holding the
//! failover back; 2 a partition failed, an instance did not confirm, or
//! the failover had not finished when `--wait` ran out; 3 the API answered
//! 404, 409 or 412 (`--max-delay` exceeded), or a `--dry-run` found the
//! failover would be refused or held back; 1 any other error (connection,
//! auth).

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request, Uri};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::control::api::{
    ApiError, BarrierRow, FailbackPartition, FailbackReport, FailoverAction, FailoverDryRun,
    LinkList, LinkReport, LiveInstances, PartitionRow, PastDivergence, ResolvedPartition,
    StartRequest, UnresolvedPartition,
};

/// Default admin URL: the default `MIRROR_PROXY_ADMIN_LISTEN`.
pub(crate) const DEFAULT_ADMIN_URL: &str = "http://127.0.0.1:9190";

/// Largest admin API answer read.
const MAX_BODY: usize = 16 * 1024 * 1024;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

pub const EXIT_OK: u8 = 0;
pub const EXIT_ERROR: u8 = 1;
pub(crate) const EXIT_INCOMPLETE: u8 = 2;
pub const EXIT_REFUSED: u8 = 3;

/// What went wrong talking to the admin API. Each message quotes its
/// cause, which is also its `source()`.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
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
pub enum HttpError {
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
    pub fn exit_code(&self) -> u8 {
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
pub struct AdminClient {
    /// host:port to connect to.
    addr: String,
    /// Path prefix (without trailing slash), e.g. "" or "/proxy-a".
    prefix: String,
    token: Option<String>,
}

/// An answer: status and JSON body, as it came.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
}

/// An answer read as `T`, and the JSON it came as (for `--json`).
#[derive(Debug, Clone)]
struct Read<T> {
    typed: T,
    json: Value,
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
    pub fn from_env() -> Result<AdminClient, CliError> {
        let url = std::env::var("MIRROR_PROXY_ADMIN_URL")
            .ok()
            .filter(|u| !u.is_empty())
            .unwrap_or_else(|| DEFAULT_ADMIN_URL.to_string());
        AdminClient::new(&url, std::env::var("MIRROR_PROXY_ADMIN_TOKEN").ok())
    }

    /// One request; any status with a JSON body is an [`Answer`] (error
    /// statuses become [`CliError::Status`]).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Answer, CliError> {
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
        Ok(Answer { status, body })
    }

    /// One request whose answer is read as `T`.
    async fn read<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Read<T>, CliError> {
        let answer = self.call(method, path, body, REQUEST_TIMEOUT).await?;
        let typed = T::deserialize(&answer.body).map_err(|source| CliError::Json {
            path: format!("{}{path}", self.prefix),
            source,
        })?;
        Ok(Read {
            typed,
            json: answer.body,
        })
    }
}

/// Path segment encoding for a link name (names are [a-z0-9-], but the
/// argument comes from the command line).
fn segment(name: &str) -> String {
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

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}

/// `links`: every link's state.
pub async fn links(client: &AdminClient, json: bool) -> Result<u8, CliError> {
    let answer = client.read::<LinkList>(Method::GET, "/links", None).await?;
    if json {
        print_json(&answer.json);
    } else {
        print!("{}", render_links(&answer.typed));
    }
    Ok(EXIT_OK)
}

/// `start NAME`: mirroring again, optionally from a new source cluster.
/// A link's state as the admin API names it (`MIRRORING`, ...).
pub async fn link_state(client: &AdminClient, name: &str) -> Result<String, CliError> {
    let answer = client
        .read::<LinkReport>(Method::GET, &format!("/links/{}", segment(name)), None)
        .await?;
    Ok(answer.typed.state.as_str().to_string())
}

pub async fn start(
    client: &AdminClient,
    name: &str,
    source_cluster_id: Option<&str>,
    json: bool,
) -> Result<u8, CliError> {
    let path = format!("/links/{}/start", segment(name));
    let body = source_cluster_id
        .map(|id| {
            serde_json::to_value(StartRequest {
                source_cluster_id: Some(id.to_string()),
            })
        })
        .transpose()
        .map_err(|source| CliError::Encode {
            path: path.clone(),
            source,
        })?;
    let answer = client
        .read::<LinkReport>(Method::POST, &path, body.as_ref())
        .await?;
    if json {
        print_json(&answer.json);
    } else {
        print!("{}", render_link(&answer.typed));
    }
    Ok(EXIT_OK)
}

/// The pre-check options of `failover NAME`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FailoverChecks {
    /// Report what would happen; change nothing.
    pub dry_run: bool,
    /// Refuse to start while a partition's replication delay is above
    /// this many seconds.
    pub max_delay: Option<f64>,
    /// Start even so.
    pub force: bool,
}

impl FailoverChecks {
    /// The query parameters of these checks (`&`-prefixed each).
    pub(crate) fn query(&self) -> String {
        let mut q = String::new();
        if let Some(max) = self.max_delay {
            let _ = write!(q, "&max_delay={max}");
        }
        if self.force {
            q.push_str("&force=true");
        }
        q
    }
}

/// The dry run's path (a GET: a proxy without pre-checks answers 405).
fn dry_run_path(name: &str, checks: FailoverChecks) -> String {
    let query = checks.query();
    match query.strip_prefix('&') {
        Some(q) => format!("/links/{}/failover?{q}", segment(name)),
        None => format!("/links/{}/failover", segment(name)),
    }
}

/// `failover NAME --dry-run`: what a failover would do; exit 0 when it
/// would proceed, 3 when it would be refused or held back by `--max-delay`.
async fn failover_dry_run(
    client: &AdminClient,
    name: &str,
    checks: FailoverChecks,
    json: bool,
) -> Result<u8, CliError> {
    let answer = dry_run(client, name, checks).await?;
    if json {
        print_json(&answer.json);
    } else {
        print!("{}", render_dry_run(&answer.typed));
    }
    Ok(if answer.typed.would_proceed {
        EXIT_OK
    } else {
        EXIT_REFUSED
    })
}

/// The dry run's GET.
async fn dry_run(
    client: &AdminClient,
    name: &str,
    checks: FailoverChecks,
) -> Result<Read<FailoverDryRun>, CliError> {
    client
        .read(Method::GET, &dry_run_path(name, checks), None)
        .await
}

/// A dry run's report as text.
pub(crate) fn render_dry_run(r: &FailoverDryRun) -> String {
    let mut out = String::new();
    let action = match r.action {
        FailoverAction::Start => "start a new failover",
        FailoverAction::Resume => "resume the failover in progress",
        FailoverAction::Refuse => "be refused",
    };
    let _ = writeln!(
        out,
        "link            {} ({})",
        text(&r.link),
        r.state.as_str()
    );
    let _ = writeln!(out, "dry run         a failover would {action}");
    if let Some(why) = &r.refused {
        let _ = writeln!(out, "refused         {why}");
    }
    if let Some(max) = r.max_delay_seconds {
        let verdict = match (r.over_max_delay.len(), r.force) {
            (0, _) => "no partition above it".to_string(),
            (n, true) => format!("{n} partition(s) above it; forced"),
            (n, false) => format!("{n} partition(s) above it: held back (--force to proceed)"),
        };
        let _ = writeln!(out, "max delay       {max} s: {verdict}");
    }
    let live = match &r.live_instances {
        LiveInstances::Listed(names) => {
            names.iter().map(|n| text(n)).collect::<Vec<_>>().join(", ")
        }
        LiveInstances::Unknown { error } => text(error),
    };
    let _ = writeln!(out, "live instances  {live}");
    let _ = writeln!(
        out,
        "partitions      {} ({} without a delay measured on this instance)",
        r.partitions_total, r.partitions_without_delay
    );
    if let Some(e) = &r.partitions_error {
        let _ = writeln!(out, "partitions error {e}");
    }
    let rows: Vec<Vec<String>> = r.partitions.iter().map(delay_cells).collect();
    if !rows.is_empty() {
        out.push_str(&table(
            &[
                "TOPIC",
                "PARTITION",
                "DELAY(S)",
                "LAST OFFSET",
                "LAST MIRRORED",
            ],
            &rows,
        ));
    }
    out
}

/// `failover NAME`: start it (POST with wait=0), then follow it with GET
/// until it completes or `wait` runs out; a progress bar on a terminal.
/// With `checks.dry_run`, only report what it would do.
pub async fn failover(
    client: &AdminClient,
    name: &str,
    wait: Duration,
    checks: FailoverChecks,
    json: bool,
) -> Result<u8, CliError> {
    if checks.dry_run {
        return failover_dry_run(client, name, checks, json).await;
    }
    if checks.max_delay.is_some() {
        // The proxy checks `max_delay` itself when asked to fail over; one
        // that does not know it would ignore it, so the dry run (a GET such
        // a proxy refuses) is asked first, and any error stops here.
        dry_run(client, name, checks).await?;
    }
    let path = format!("/links/{}", segment(name));
    let mut link = client
        .read::<LinkReport>(
            Method::POST,
            &format!("{path}/failover?wait=0{}", checks.query()),
            None,
        )
        .await?;
    let id = link.typed.failover.as_ref().map(|f| f.id);
    let bar = (!json && std::io::IsTerminal::is_terminal(&std::io::stdout())).then(|| {
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} failover of {prefix} [{bar:40}] {pos}/{len} partitions {elapsed}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_prefix(name.to_string());
        bar
    });
    let deadline = Instant::now() + wait;
    loop {
        let progress = failover_progress(&link.typed);
        if let (Some(bar), Some(p)) = (&bar, &progress) {
            bar.set_length(p.total);
            bar.set_position(p.done);
        }
        let same = id.is_none() || link.typed.failover.as_ref().map(|f| f.id) == id;
        if progress.is_some_and(|p| p.complete && same) || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        link = client.read(Method::GET, &path, None).await?;
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    let (json_doc, link) = (link.json, link.typed);
    if json {
        print_json(&json_doc);
    } else {
        print!("{}", render_link(&link));
    }
    if failover_progress(&link).is_none_or(|p| !p.complete) {
        eprintln!(
            "kafka-mirror-proxy: the failover of {name} had not finished after {} s; it goes on in the proxy (follow it with `kafka-mirror-proxy links`)",
            wait.as_secs()
        );
    }
    Ok(failover_exit_code(&link))
}

/// How far a link's failover is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Progress {
    pub done: u64,
    pub total: u64,
    pub complete: bool,
}

/// The failover progress of a link; `None` without a failover.
pub(crate) fn failover_progress(link: &LinkReport) -> Option<Progress> {
    let f = link.failover.as_ref()?;
    Some(Progress {
        done: f.partitions_done,
        total: f.partitions_total,
        complete: f.complete,
    })
}

/// 0 when the failover completed with every partition accepted or refused
/// (and recorded) and every instance confirmed; 2 otherwise.
pub(crate) fn failover_exit_code(link: &LinkReport) -> u8 {
    let Some(f) = &link.failover else {
        return EXIT_INCOMPLETE;
    };
    let all_done = f.partitions.iter().all(|p| p.result.recorded());
    if f.complete && all_done && f.unconfirmed_instances.is_empty() {
        EXIT_OK
    } else {
        EXIT_INCOMPLETE
    }
}

/// A name or message as a cell: `-` when empty.
fn text(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

/// A number or `-` for none.
fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A UTC time from milliseconds since the epoch, `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn utc(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// A time in ms, or `-` for none: absent, or negative (a link's `since_ms`
/// is -1 while the state topic holds no record of it).
fn time(ms: impl Into<Option<i64>>) -> String {
    ms.into()
        .filter(|ms| *ms >= 0)
        .map(utc)
        .unwrap_or_else(|| "-".into())
}

/// Left-aligned columns, two spaces apart.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(cell);
            } else {
                let _ = write!(l, "{cell:<w$}  ");
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

fn failover_summary(link: &LinkReport) -> String {
    match failover_progress(link) {
        None => "-".into(),
        Some(p) => format!(
            "{} {}/{}",
            if p.complete { "complete" } else { "running" },
            p.done,
            p.total
        ),
    }
}

/// A dry run's partition as a row: topic, partition, delay, last offset,
/// last mirrored.
fn delay_cells(p: &PartitionRow) -> Vec<String> {
    vec![
        text(&p.topic),
        p.partition.to_string(),
        p.delay_seconds
            .map_or_else(|| "-".to_string(), |d| format!("{d:.3}")),
        or_dash(p.last_offset),
        time(p.last_mirrored_ms),
    ]
}

/// A failover's partition as a row: topic, partition, result, error code,
/// log end, expired producers, message.
fn barrier_cells(p: &BarrierRow) -> Vec<String> {
    vec![
        text(&p.topic),
        p.partition.to_string(),
        p.result.as_str().to_string(),
        p.error_code.to_string(),
        p.log_end_offset.to_string(),
        p.expired_producers.to_string(),
        text(p.message.as_deref().unwrap_or_default()),
    ]
}

/// `GET /links` as a table.
pub(crate) fn render_links(doc: &LinkList) -> String {
    if doc.links.is_empty() {
        return "no links configured\n".into();
    }
    let rows: Vec<Vec<String>> = doc
        .links
        .iter()
        .map(|l| {
            vec![
                text(&l.name),
                l.state.as_str().to_string(),
                time(l.since_ms),
                text(&l.source_cluster_id),
                failover_summary(l),
            ]
        })
        .collect();
    table(
        &["NAME", "STATE", "SINCE", "SOURCE CLUSTER", "FAILOVER"],
        &rows,
    )
}

/// One link (`GET /links/{name}`), with its failover's partitions.
pub(crate) fn render_link(link: &LinkReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "link            {}", text(&link.name));
    let state = link.state.as_str();
    let _ = match time(link.since_ms).as_str() {
        "-" => writeln!(out, "state           {state}"),
        since => writeln!(out, "state           {state} since {since}"),
    };
    let _ = writeln!(out, "source cluster  {}", text(&link.source_cluster_id));
    for (k, v) in link.counters.named() {
        let _ = writeln!(out, "{k:<15} {v}");
    }
    let Some(f) = &link.failover else {
        return out;
    };
    let _ = writeln!(
        out,
        "failover        {} ({}), started {}, finished {}",
        f.id,
        failover_summary(link),
        time(f.started_ms),
        time(f.finished_ms)
    );
    if !f.unconfirmed_instances.is_empty() {
        let names: Vec<String> = f.unconfirmed_instances.iter().map(|i| text(i)).collect();
        let _ = writeln!(out, "unconfirmed     {}", names.join(", "));
    }
    let rows: Vec<Vec<String>> = f.partitions.iter().map(barrier_cells).collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&table(
            &[
                "TOPIC",
                "PARTITION",
                "RESULT",
                "ERROR",
                "LOG END",
                "EXPIRED",
                "MESSAGE",
            ],
            &rows,
        ));
    }
    out
}

/// `failback --dry-run`'s report: per partition, where A and B diverge,
/// A's records past that point (A's records B never got) and B's own
/// records the failback link will copy.
pub fn render_failback(plan: &crate::replicate::failback::Plan) -> String {
    let opt = |v: Option<i64>| v.map_or("-".to_string(), |v| v.to_string());
    let rows: Vec<Vec<String>> = plan
        .partitions
        .iter()
        .map(|p| match &p.point {
            Ok(point) => {
                let t = &p.tail;
                vec![
                    p.topic.clone(),
                    p.partition.to_string(),
                    point.a_next.to_string(),
                    format!(
                        "{}{}",
                        t.records,
                        if t.open_transaction {
                            " (+open txn)"
                        } else {
                            ""
                        }
                    ),
                    format!("{}..{}", opt(t.first_offset), opt(t.last_offset)),
                    match (t.first_time_ms, t.last_time_ms) {
                        (Some(a), Some(b)) => format!("{} .. {}", utc(a), utc(b)),
                        _ => "-".to_string(),
                    },
                    format!("{}..{}", point.b_start, p.b_end),
                ]
            }
            Err(e) => vec![
                p.topic.clone(),
                p.partition.to_string(),
                "UNRESOLVED".to_string(),
                e.to_string(),
                String::new(),
                String::new(),
                String::new(),
            ],
        })
        .collect();
    let records: u64 = plan.partitions.iter().map(|p| p.tail.records).sum();
    format!(
        "failover {}: {} partition(s), {} record(s) of A past the divergence point, {} unresolved\n{}",
        plan.failover_id,
        plan.partitions.len(),
        records,
        plan.unresolved(),
        table(
            &[
                "TOPIC",
                "PARTITION",
                "A DIVERGES AT",
                "A RECORDS B NEVER GOT",
                "THEIR OFFSETS",
                "THEIR TIMES (UTC)",
                "B OFFSETS TO COPY",
            ],
            &rows,
        )
    )
}

/// The failback report, as the API and `failback --json` give it.
pub fn failback_json(plan: &crate::replicate::failback::Plan) -> FailbackReport {
    let partitions = plan
        .partitions
        .iter()
        .map(|p| {
            let t = &p.tail;
            match &p.point {
                Ok(point) => FailbackPartition::Resolved(ResolvedPartition {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    diverges_at: point.a_next,
                    a_log_end: p.a_end,
                    copy_from: point.b_start,
                    b_log_end: p.b_end,
                    past_divergence: PastDivergence {
                        records: t.records,
                        batches: t.batches,
                        first_offset: t.first_offset,
                        last_offset: t.last_offset,
                        first_time_ms: t.first_time_ms,
                        last_time_ms: t.last_time_ms,
                        aborted_batches: t.aborted_batches,
                        open_transaction: t.open_transaction,
                    },
                }),
                Err(e) => FailbackPartition::Unresolved(UnresolvedPartition {
                    topic: p.topic.clone(),
                    partition: p.partition,
                    // Shown to the operator: why the partition is unresolved.
                    unresolved: e.to_string(),
                }),
            }
        })
        .collect();
    FailbackReport {
        failover_id: plan.failover_id,
        unresolved: plan.unresolved() as u64,
        partitions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A link as the proxy answers it, finished.
    fn done_link_json() -> Value {
        json!({
            "name": "east", "state": "STOPPED", "since_ms": 1_700_000_000_000i64,
            "source_cluster_id": "MkU3OEVBNTcwNTJENDM2Qg",
            "failover": {
                "id": 1_700_000_000_000i64, "started_ms": 1_700_000_000_000i64,
                "finished_ms": 1_700_000_001_000i64,
                "complete": true, "partitions_total": 2, "partitions_done": 2,
                "partitions": [
                    {"topic": "orders", "partition": 0, "result": "refused", "error_code": 87,
                     "message": "INVALID_RECORD", "log_end_offset": 42, "expired_producers": 3},
                    {"topic": "orders", "partition": 1, "result": "accepted", "error_code": 0,
                     "message": null, "log_end_offset": 7, "expired_producers": 0}
                ],
                "unconfirmed_instances": [], "error": null
            },
            "counters": {"local_writes_refused": 5, "link_requests_refused": 0,
                "connections_fenced": 1, "open_link_connections": 0}
        })
    }

    /// `doc` read as the CLI reads an answer.
    fn read<T: DeserializeOwned>(doc: Value) -> T {
        T::deserialize(&doc).expect("the document reads as the API's type")
    }

    fn done_link() -> LinkReport {
        read(done_link_json())
    }

    #[test]
    fn exit_codes() {
        assert_eq!(failover_exit_code(&done_link()), EXIT_OK);
        let mut failed = done_link_json();
        failed["failover"]["partitions"][1]["result"] = json!("failed");
        assert_eq!(failover_exit_code(&read(failed)), EXIT_INCOMPLETE);
        let mut pending = done_link_json();
        pending["failover"]["partitions"][1]["result"] = json!("pending");
        assert_eq!(failover_exit_code(&read(pending)), EXIT_INCOMPLETE);
        let mut unconfirmed = done_link_json();
        unconfirmed["failover"]["unconfirmed_instances"] = json!(["b"]);
        assert_eq!(failover_exit_code(&read(unconfirmed)), EXIT_INCOMPLETE);
        let mut running = done_link_json();
        running["failover"]["complete"] = json!(false);
        assert_eq!(failover_exit_code(&read(running)), EXIT_INCOMPLETE);
        let mut never = done_link_json();
        never["failover"] = Value::Null;
        assert_eq!(failover_exit_code(&read(never)), EXIT_INCOMPLETE);
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
    fn links_table() {
        let doc = json!({"links": [
            done_link_json(),
            {"name": "west", "state": "MIRRORING", "since_ms": 0,
             "source_cluster_id": "AAAAAAAAAAAAAAAAAAAAAA", "failover": null,
             "counters": done_link_json()["counters"]},
            {"name": "new", "state": "MIRRORING", "since_ms": -1,
             "source_cluster_id": "AAAAAAAAAAAAAAAAAAAAAA", "failover": null,
             "counters": done_link_json()["counters"]}
        ]});
        assert_eq!(
            render_links(&read(doc)),
            "NAME  STATE      SINCE                    SOURCE CLUSTER          FAILOVER\n\
             east  STOPPED    2023-11-14 22:13:20 UTC  MkU3OEVBNTcwNTJENDM2Qg  complete 2/2\n\
             west  MIRRORING  1970-01-01 00:00:00 UTC  AAAAAAAAAAAAAAAAAAAAAA  -\n\
             new   MIRRORING  -                        AAAAAAAAAAAAAAAAAAAAAA  -\n"
        );
        // No record of the link yet (since_ms -1): no time of 1969.
        let mut new = done_link_json();
        new["since_ms"] = json!(-1);
        new["failover"] = Value::Null;
        let new = render_link(&read(new));
        assert!(
            new.starts_with("link            east\nstate           STOPPED\nsource cluster"),
            "{new}"
        );
        assert_eq!(
            render_links(&read(json!({"links": []}))),
            "no links configured\n"
        );
    }

    #[test]
    fn link_with_partitions() {
        let out = render_link(&done_link());
        assert_eq!(
            out,
            "link            east\n\
             state           STOPPED since 2023-11-14 22:13:20 UTC\n\
             source cluster  MkU3OEVBNTcwNTJENDM2Qg\n\
             connections_fenced 1\n\
             link_requests_refused 0\n\
             local_writes_refused 5\n\
             open_link_connections 0\n\
             failover        1700000000000 (complete 2/2), started 2023-11-14 22:13:20 UTC, finished 2023-11-14 22:13:21 UTC\n\
             \n\
             TOPIC   PARTITION  RESULT    ERROR  LOG END  EXPIRED  MESSAGE\n\
             orders  0          refused   87     42       3        INVALID_RECORD\n\
             orders  1          accepted  0      7        0        -\n"
        );
        let mut waiting = done_link_json();
        waiting["failover"]["unconfirmed_instances"] = json!(["b", "c"]);
        let out = render_link(&read(waiting));
        assert!(out.contains("\nunconfirmed     b, c\n"), "{out}");
    }

    #[test]
    fn progress_and_time() {
        let mut l = done_link_json();
        l["failover"]["partitions_done"] = json!(1);
        l["failover"]["complete"] = json!(false);
        assert_eq!(
            failover_progress(&read(l)),
            Some(Progress {
                done: 1,
                total: 2,
                complete: false
            })
        );
        let mut never = done_link_json();
        never["failover"] = Value::Null;
        assert_eq!(failover_progress(&read(never)), None);
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(-1000), "1969-12-31 23:59:59 UTC");
    }

    #[test]
    fn dry_run_report_and_path() {
        let checks = FailoverChecks {
            dry_run: true,
            max_delay: Some(60.0),
            force: false,
        };
        assert_eq!(dry_run_path("x", checks), "/links/x/failover?max_delay=60");
        assert_eq!(
            dry_run_path("x", FailoverChecks::default()),
            "/links/x/failover"
        );
        let report = json!({
            "link": "x", "dry_run": true, "state": "MIRRORING", "action": "start",
            "refused": null, "would_proceed": false, "max_delay_seconds": 60.0, "force": false,
            "over_max_delay": [{"topic": "m", "partition": 0, "delay_seconds": 90.5}],
            "live_instances": ["a", "b"], "partitions_total": 2,
            "partitions_without_delay": 1, "partitions_error": null,
            "partitions": [
                {"topic": "m", "partition": 0, "delay_seconds": 90.5, "last_offset": 4,
                 "last_timestamp_ms": 1_700_000_000_000_i64,
                 "last_mirrored_ms": 1_700_000_000_000_i64, "records": 5, "batches": 1,
                 "bytes": 100, "duplicates_answered": 0},
                {"topic": "m", "partition": 1, "delay_seconds": null, "last_offset": null,
                 "last_timestamp_ms": null, "last_mirrored_ms": null}
            ]
        });
        assert_eq!(
            render_dry_run(&read(report.clone())),
            "link            x (MIRRORING)\n\
             dry run         a failover would start a new failover\n\
             max delay       60 s: 1 partition(s) above it: held back (--force to proceed)\n\
             live instances  a, b\n\
             partitions      2 (1 without a delay measured on this instance)\n\
             TOPIC  PARTITION  DELAY(S)  LAST OFFSET  LAST MIRRORED\n\
             m      0          90.500    4            2023-11-14 22:13:20 UTC\n\
             m      1          -         -            -\n"
        );
        // Refused, and the instances unknown.
        let mut refused = report;
        refused["action"] = json!("refuse");
        refused["refused"] = json!("link 'x' is STOPPED");
        refused["live_instances"] = json!({"error": "group unreadable"});
        refused["partitions_error"] = json!("listing the link's topics: gone");
        let text = render_dry_run(&read(refused));
        assert!(text.contains("a failover would be refused\n"), "{text}");
        assert!(
            text.contains("refused         link 'x' is STOPPED\n"),
            "{text}"
        );
        assert!(
            text.contains("live instances  group unreadable\n"),
            "{text}"
        );
        assert!(
            text.contains("partitions error listing the link's topics: gone\n"),
            "{text}"
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
