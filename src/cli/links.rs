//! `links` and `start NAME`: a running proxy's links, as tables, and a
//! stopped link started again.

use std::fmt::Write as _;

use hyper::Method;

use crate::control::api::{BarrierRow, LinkList, LinkReport, StartRequest};

use super::admin_api::{print_json, segment, AdminClient, CliError};
use super::failover::failover_progress;
use super::render::{table, text, time};
use super::EXIT_OK;

/// `links`: every link's state.
pub(crate) async fn links(client: &AdminClient, json: bool) -> Result<u8, CliError> {
    let answer = client.read::<LinkList>(Method::GET, "/links", None).await?;
    if json {
        print_json(&answer.json);
    } else {
        print!("{}", render_links(&answer.typed));
    }
    Ok(EXIT_OK)
}

/// A link's state as the admin API names it (`MIRRORING`, ...).
pub(crate) async fn link_state(client: &AdminClient, name: &str) -> Result<String, CliError> {
    let answer = client
        .read::<LinkReport>(Method::GET, &format!("/links/{}", segment(name)), None)
        .await?;
    Ok(answer.typed.state.as_str().to_string())
}

/// `start NAME`: mirroring again, optionally from a new source cluster.
pub(crate) async fn start(
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

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::cli::fixtures::{done_link, done_link_json, read};

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
}
