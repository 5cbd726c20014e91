//! The `kafka-mirror-proxy` binary: `run` (the default) starts the proxy from
//! `MIRROR_PROXY_*` variables and, on SIGTERM or SIGINT, drains it (no new
//! connections or requests, responses in flight delivered, bounded by
//! `SHUTDOWN_TIMEOUT_MS`) and exits 0; `replicate` runs the replicator the
//! same way; the operator's commands (`map`, `unmap`, `links`, `failover`,
//! `offsets`, `failback`, `start`) are the library's `cli::Command`.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use kafka_mirror_proxy::cli;
use kafka_mirror_proxy::config::{Config, LogFormat};

#[derive(Parser)]
#[command(
    name = "kafka-mirror-proxy",
    version,
    about = "Kafka proxy that remaps mirrored producer ids"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy (configured from MIRROR_PROXY_* variables; see README).
    Run,
    // The operator's commands (`map`, `unmap`, `links`, `failover`,
    // `offsets`, `failback`, `start`).
    #[command(flatten)]
    Operator(cli::Command),
    /// Copy a source cluster's topics through the proxy (configured from
    /// MIRROR_REPLICATOR_* variables or flags: `replicate --help`). Exit
    /// code 0 when stopped or caught up, 1 on an error, 2 for the
    /// configuration, 3 when the proxy fenced the link.
    // Help lists it where it always was, right after `failover`: the
    // flattened commands take orders 1 to 7 (`failover` 4), and a tie
    // sorts by name.
    #[command(disable_help_flag = true, display_order = 4)]
    Replicate {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run) {
        Command::Operator(command) => ExitCode::from(command.run()),
        Command::Replicate { args } => replicate(args),
        Command::Run => match run() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("kafka-mirror-proxy: {e:#}");
                ExitCode::from(2)
            }
        },
    }
}

fn run() -> anyhow::Result<()> {
    let config = Config::from_env()?;
    init_logging(config.log_format);
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = config.worker_threads {
        runtime.worker_threads(n);
    }
    let runtime = runtime
        .thread_name("kmp-worker")
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = runtime.block_on(kafka_mirror_proxy::run(config, signals()));
    // Do not wait for a blocking task (a DNS lookup) past the drain.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(result?)
}

/// `replicate`: the replicator, from its flags and variables, until it
/// stops (SIGTERM or SIGINT: what is in flight is answered, then the
/// progress committed).
fn replicate(args: Vec<String>) -> ExitCode {
    let config = match cli::replicator_config(args) {
        Ok(c) => c,
        Err(code) => return ExitCode::from(code),
    };
    init_logging(config.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .thread_name("kmp-replicate")
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kafka-mirror-proxy replicate: starting the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("stopping: what is in flight is answered, then the progress committed");
            let _ = stop_tx.send(true);
        });
        cli::replicate(config, stop_rx).await
    });
    runtime.shutdown_timeout(Duration::from_secs(1));
    ExitCode::from(code)
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| OneLine(std::io::stderr()))
        .with_ansi(false);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// A text log event is one line: a newline or other control character in
/// a field (a topic name or client id a client chose, an error quoting one)
/// is escaped, so that no client can forge a log line. The fmt layer writes
/// each event whole, with one `write_all`, ending in its own newline.
struct OneLine<W>(W);

impl<W: std::io::Write> std::io::Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.write_all(buf)?;
        Ok(buf.len())
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        let control = |b: &u8| b.is_ascii_control() && *b != b'\t';
        if !body.iter().any(control) {
            return self.0.write_all(buf);
        }
        let mut out = Vec::with_capacity(buf.len() + 16);
        for &b in body {
            match b {
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b if control(&b) => out.extend_from_slice(format!("\\x{b:02x}").as_bytes()),
                b => out.push(b),
            }
        }
        out.extend_from_slice(end);
        self.0.write_all(&out)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.flush()
    }
}

/// Each SIGTERM or SIGINT, as a stream: the first drains the proxy, a
/// second closes every connection at once.
fn signals() -> impl futures_util::Stream<Item = ()> {
    futures_util::stream::unfold((), |()| async {
        shutdown_signal().await;
        Some(((), ()))
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::OneLine;
    use std::io::Write;

    fn written(event: &[u8]) -> Vec<u8> {
        let mut out = OneLine(Vec::new());
        out.write_all(event).expect("write to a Vec");
        out.0
    }

    #[test]
    fn an_event_stays_one_line() {
        assert_eq!(written(b"plain line\tok\n"), b"plain line\tok\n");
        assert_eq!(
            written(b"topic 'a\nFORGED\r\n\x1b[31m'\n"),
            b"topic 'a\\nFORGED\\r\\n\\x1b[31m'\n"
        );
        assert_eq!(written(b"no newline at the end"), b"no newline at the end");
    }
}
