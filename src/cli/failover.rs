//! `failover NAME`: start a link's failover and follow it until it
//! completes, or (`--dry-run`) only report what it would do.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use hyper::Method;

use crate::control::api::{
    FailoverAction, FailoverDryRun, LinkReport, LiveInstances, PartitionRow,
};

use super::admin_api::{print_json, segment, AdminClient, CliError, Read};
use super::links::render_link;
use super::render::{or_dash, table, text, time};
use super::{EXIT_INCOMPLETE, EXIT_OK, EXIT_REFUSED};

/// The pre-check options of `failover NAME`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct FailoverChecks {
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
pub(crate) async fn failover(
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::cli::fixtures::{done_link, done_link_json, read};

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
    }

    #[test]
    fn progress() {
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
}
