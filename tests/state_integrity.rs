//! What the proxy applies from its state topic, against a real broker,
//! through the proxy binary. A client with Write on the topic can append
//! records around the proxy (straight to the broker); without the state key
//! the proxy skips those that cannot follow the link's history, with the
//! key every record it did not sign. Instances that share the key mirror
//! and fail over together as without it.

mod support;

use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use bytes::Bytes;
use serde_json::Value;

use kafka_mirror_proxy::client::protocol::OffsetSpec;
use kafka_mirror_proxy::client::Client;
use kafka_mirror_proxy::mirror::link_state::{LinkState, LinkStatus};
use kafka_mirror_proxy::mirror::pid::ClusterId;
use kafka_mirror_proxy::mirror::state_records::{
    BarrierKey, BarrierValue, DrainedKey, DrainedValue, StateRecord,
};
use kafka_mirror_proxy::state::mac::{StateAuth, MAC_HEADER};
use kafka_mirror_proxy::state::topic::{read_batches, SkipReason};
use kafka_mirror_proxy::wire::batch::{build, NewBatch, NewRecord};
use support::crate_client::create_topics;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;
use support::wire::{partition_result, record_batch, RawClient};

const STATE: &str = "__mirror_state";
const KEY: &str = "state-integrity-test-key-of-32-bytes-or-more";
const LINK_CLIENT: &str = "mirror-x";
const LOCAL_CLIENT: &str = "local-app";
const SKIPPED: &str = "kafka_mirror_proxy_state_records_skipped_total";
const NONE: i16 = 0;
const POLICY_VIOLATION: i16 = 44;
/// A failover id nobody started (a time in 2023, as the proxy's ids are).
const FORGED_FAILOVER: i64 = 1_700_000_000_000;

fn source() -> ClusterId {
    ClusterId::from_bytes(*b"integrity-source")
}

/// A proxy whose link `x` mirrors topic `m`, with `extra` settings.
fn proxy(broker: &KafkaCluster, extra: &[(&str, &str)]) -> Result<ProxyProcess> {
    ProxyProcess::with_link_x(&broker.bootstrap(), &source(), "m", extra)
}

/// Link `x` as a failover writes it: `state` under failover `id`.
fn status(state: LinkState, id: i64) -> LinkStatus {
    LinkStatus {
        state,
        since_ms: id,
        source: source(),
        failover_id: id,
        failover_started_ms: id,
        failover_finished_ms: if state == LinkState::Stopping {
            -1
        } else {
            id + 1
        },
    }
}

/// Append `records` to the state topic straight to the broker, as a client
/// with Write on it could, each with the `kmp-mac` header `mac` if given.
fn forge(broker: &KafkaCluster, records: &[StateRecord], mac: Option<&[u8]>) -> Result<()> {
    let encoded: Vec<(Vec<u8>, Option<Vec<u8>>)> = records
        .iter()
        .map(|r| (r.encode_key(), r.encode_value()))
        .collect();
    let headers = [(MAC_HEADER, mac)];
    let new: Vec<NewRecord<'_>> = encoded
        .iter()
        .map(|(k, v)| NewRecord {
            key: Some(k),
            value: v.as_deref(),
            headers: if mac.is_some() { &headers } else { &[] },
            timestamp: FORGED_FAILOVER,
        })
        .collect();
    let batch = build(&NewBatch::NO_PRODUCER, &new)?;
    let rt = support::crate_client::runtime()?;
    let client = support::crate_client::client(&broker.bootstrap());
    rt.block_on(client.produce(STATE, 0, Bytes::from(batch)))?;
    Ok(())
}

/// Link `x` as `GET /links/x` reports it.
fn link(p: &ProxyProcess) -> Result<Value> {
    let (status, body) = p.admin_get("/links/x")?;
    ensure!(status.contains("200"), "{status}: {body}");
    Ok(serde_json::from_str(&body)?)
}

/// Wait (bounded: 30 s) until `p` has skipped `n` state records, or its
/// link `x` left MIRRORING (a forged record applied); returns the link.
fn wait_skipped_or_applied(p: &ProxyProcess, n: i64) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let x = link(p)?;
        if p.metric(SKIPPED)? >= n || x["state"] != "MIRRORING" {
            return Ok(x);
        }
        ensure!(
            Instant::now() < deadline,
            "{n} record(s) not skipped within 30 s ({} so far), link {x}:\n{}",
            p.metric(SKIPPED)?,
            tools::tail_str(&p.logs(), 30)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The (error code, message) of a local Produce to partition 0 of `topic`.
fn local_produce(p: &ProxyProcess, topic: &str) -> Result<(i16, Option<String>)> {
    let mut c = RawClient::connect(&p.bootstrap)?;
    Ok(partition_result(&c.produce(
        LOCAL_CLIENT,
        topic,
        0,
        record_batch(-1, &["local"]),
    )?))
}

/// The forgery (the link STOPPING, then STOPPED, under a new
/// failover id: a history the state machine allows), written around the
/// proxy, once without a MAC and once with a MAC of another key: with the
/// state key set, none of it applies.
#[test]
fn with_the_key_a_link_state_written_around_the_proxy_is_ignored() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let p = proxy(&broker, &[("STATE_KEY", KEY)])?;
    let forged = [
        StateRecord::LinkState(
            "x".into(),
            Some(status(LinkState::Stopping, FORGED_FAILOVER)),
        ),
        StateRecord::LinkState(
            "x".into(),
            Some(status(LinkState::Stopped, FORGED_FAILOVER)),
        ),
    ];
    forge(&broker, &forged, None)?;
    let other = StateAuth::new(b"not the key, but 32 bytes long!!", STATE, 0);
    let mac = other.sign(&forged[1].encode_key(), forged[1].encode_value().as_deref());
    forge(&broker, &forged[1..], Some(&mac))?;

    let x = wait_skipped_or_applied(&p, 3)?;
    let logs = tools::tail_str(&p.logs(), 30);
    ensure!(
        x["state"] == "MIRRORING",
        "the forged records applied: {x}\n{logs}"
    );
    ensure!(
        p.metric(SKIPPED)? == 3,
        "skipped: {}\n{logs}",
        p.metric(SKIPPED)?
    );
    let (code, message) = local_produce(&p, "m")?;
    ensure!(
        code == POLICY_VIOLATION,
        "a local write to the mirrored topic: {code} {message:?}"
    );
    let lines = p.logs();
    let missing = lines
        .lines()
        .filter(|l| l.contains("no kmp-mac header"))
        .count();
    let wrong = lines
        .lines()
        .filter(|l| l.contains("does not verify with MIRROR_PROXY_STATE_KEY"))
        .count();
    ensure!(
        (missing, wrong) == (2, 1),
        "one line per record skipped: {missing} missing, {wrong} wrong:\n{logs}"
    );
    ensure!(!lines.contains(KEY), "the key was logged");
    Ok(())
}

/// Without the key, what cannot follow the link's history is skipped:
/// the link MIRRORING straight to STOPPED under a failover nobody started,
/// a barrier and a drained record of that failover (the drained one under
/// a link name with a newline, which is logged escaped). One line and one
/// count each.
#[test]
fn without_the_key_records_that_do_not_follow_the_history_are_skipped() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let p = proxy(&broker, &[])?;
    let forged = [
        StateRecord::LinkState(
            "x".into(),
            Some(status(LinkState::Stopped, FORGED_FAILOVER)),
        ),
        StateRecord::Barrier(
            BarrierKey {
                link: "x".into(),
                topic_id: uuid::Uuid::from_u128(1),
                partition: 0,
            },
            Some(BarrierValue {
                failover_id: FORGED_FAILOVER,
                source: source(),
                log_end_offset: 1 << 40,
                timestamp_ms: FORGED_FAILOVER,
                accepted: true,
                error_code: 0,
                batch: vec![0xde, 0xad],
            }),
        ),
        StateRecord::Drained(
            DrainedKey {
                link: "x\nFORGED log line".into(),
                instance: "i-1".into(),
            },
            Some(DrainedValue {
                failover_id: FORGED_FAILOVER,
                timestamp_ms: FORGED_FAILOVER,
            }),
        ),
    ];
    forge(&broker, &forged, None)?;

    let x = wait_skipped_or_applied(&p, 3)?;
    let logs = tools::tail_str(&p.logs(), 30);
    ensure!(
        x["state"] == "MIRRORING",
        "the forged STOPPED applied: {x}\n{logs}"
    );
    ensure!(x["failover"] == Value::Null, "{x}");
    ensure!(
        p.metric(SKIPPED)? == 3,
        "skipped: {}\n{logs}",
        p.metric(SKIPPED)?
    );
    let (code, message) = local_produce(&p, "m")?;
    ensure!(
        code == POLICY_VIOLATION,
        "a local write to the mirrored topic: {code} {message:?}"
    );
    let lines = p.logs();
    let skipped: Vec<&str> = lines
        .lines()
        .filter(|l| l.contains("skipped a state record the proxy could not have written there"))
        .collect();
    ensure!(skipped.len() == 3, "one line per record:\n{logs}");
    ensure!(
        skipped[0].contains("does not follow") && skipped[1].contains("not STOPPING under"),
        "{skipped:#?}"
    );
    ensure!(
        !lines.lines().any(|l| l.starts_with("FORGED")),
        "a forged link name started a log line:\n{logs}"
    );
    Ok(())
}

/// Every record of the state topic up to its end, read with `auth`.
fn state_records(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    auth: &StateAuth,
) -> Result<Vec<Result<StateRecord, SkipReason>>> {
    rt.block_on(async {
        let end = client
            .list_offset(STATE, 0, OffsetSpec::Latest)
            .await?
            .offset;
        let mut out = Vec::new();
        let mut next = 0;
        while next < end {
            let f = client
                .fetch(STATE, 0, next, 1 << 20, Duration::from_millis(100))
                .await?;
            let after = read_batches(&f.records, next, Some(auth), |_, r| out.push(r));
            ensure!(
                after > next,
                "no progress reading the state topic at {next}"
            );
            next = after;
        }
        Ok(out)
    })
}

/// `GET /links/x` on `p` until its state is `state` (bounded: 30 s).
fn wait_state(p: &ProxyProcess, state: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let x = link(p)?;
        if x["state"] == state {
            return Ok(x);
        }
        ensure!(
            Instant::now() < deadline,
            "link never became {state}: {x:#}\n{}",
            tools::tail_str(&p.logs(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Two instances sharing the key: the link's batches go through one (its
/// origin claimed in signed records), a failover started on the other
/// reaches both, and an instance started later loads the signed history;
/// nothing is skipped. An instance with another key applies none of it.
#[test]
fn instances_sharing_the_key_mirror_and_fail_over_together() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 2)])?;
    let a = proxy(&broker, &[("STATE_KEY", KEY)])?;
    let b = proxy(&broker, &[("STATE_KEY", KEY)])?;
    let mut link_conn = RawClient::connect(&b.bootstrap)?;
    let r = partition_result(&link_conn.produce(LINK_CLIENT, "m", 0, record_batch(7, &["a"]))?);
    ensure!(
        r.0 == NONE,
        "link produce on B: {r:?}\n{}",
        tools::tail_str(&b.logs(), 30)
    );
    ensure!(local_produce(&a, "m")?.0 == POLICY_VIOLATION, "A: local");
    ensure!(local_produce(&b, "m")?.0 == POLICY_VIOLATION, "B: local");

    let (status, body) = a.admin_post("/links/x/failover?wait=90", "")?;
    ensure!(
        status.contains("200"),
        "failover on A: {status} {body}\n{}",
        tools::tail_str(&a.logs(), 30)
    );
    let f: Value = serde_json::from_str(&body)?;
    ensure!(f["state"] == "STOPPED", "{f:#}");
    let x = wait_state(&b, "STOPPED")?;
    ensure!(x["failover"]["id"] == f["failover"]["id"], "{x:#}");
    ensure!(
        x["failover"]["partitions"].as_array().map(Vec::len) == Some(2),
        "B applied both barriers: {x:#}"
    );
    ensure!(local_produce(&b, "m")?.0 == NONE, "B: local after failover");

    let c = proxy(&broker, &[("STATE_KEY", KEY)])?;
    let x = wait_state(&c, "STOPPED")?;
    ensure!(x["failover"]["id"] == f["failover"]["id"], "{x:#}");
    for (name, p) in [("A", &a), ("B", &b), ("C", &c)] {
        ensure!(
            p.metric(SKIPPED)? == 0,
            "{name} skipped records:\n{}",
            tools::tail_str(&p.logs(), 30)
        );
    }

    // Every record the instances wrote carries a MAC of the key.
    let rt = support::crate_client::runtime()?;
    let client = support::crate_client::client(&broker.bootstrap());
    let records = state_records(&rt, &client, &StateAuth::new(KEY.as_bytes(), STATE, 0))?;
    let kinds = |kind: fn(&StateRecord) -> bool| {
        records
            .iter()
            .filter(|r| r.as_ref().is_ok_and(kind))
            .count()
    };
    ensure!(
        records.iter().all(Result::is_ok)
            && kinds(|r| matches!(r, StateRecord::Origin(..))) >= 1
            // STOPPING once; STOPPED at least once (an instance that
            // resumes the same failover may write it again, same id).
            && kinds(|r| matches!(r, StateRecord::LinkState(_, Some(s)) if s.state == LinkState::Stopping)) == 1
            && kinds(|r| matches!(r, StateRecord::LinkState(_, Some(s)) if s.state == LinkState::Stopped)) >= 1
            && records
                .iter()
                .flatten()
                .filter_map(|r| match r {
                    StateRecord::LinkState(_, Some(s)) => Some(s.failover_id),
                    _ => None,
                })
                .collect::<std::collections::HashSet<_>>()
                .len()
                == 1
            && kinds(|r| matches!(r, StateRecord::Barrier(..))) == 2
            && kinds(|r| matches!(r, StateRecord::Drained(..))) >= 1,
        "{records:#?}"
    );

    // Another key: nothing verifies, the link keeps its initial state.
    let d = proxy(
        &broker,
        &[("STATE_KEY", "another-key-of-at-least-32-bytes!!")],
    )?;
    let x = link(&d)?;
    ensure!(x["state"] == "MIRRORING", "{x:#}");
    ensure!(
        d.metric(SKIPPED)? == records.len() as i64,
        "D skipped {} of {} records",
        d.metric(SKIPPED)?,
        records.len()
    );
    Ok(())
}

/// A key enabled on a topic written without one: with
/// `STATE_KEY_UNSIGNED_BEFORE` at the topic's end offset, the records
/// written before (a failover's) still apply; without it every one of them
/// is skipped and the link falls back to its initial state, which is why
/// the rollout needs the offset.
#[test]
fn enabling_the_key_keeps_the_records_before_the_offset() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    create_topics(&broker.bootstrap(), &[("m", 1)])?;
    let a = proxy(&broker, &[])?;
    let (status, body) = a.admin_post("/links/x/failover?wait=90", "")?;
    ensure!(
        status.contains("200") && body.contains("\"STOPPED\""),
        "failover on A: {status} {body}"
    );
    let rt = support::crate_client::runtime()?;
    let client = support::crate_client::client(&broker.bootstrap());
    let end = rt
        .block_on(client.list_offset(STATE, 0, OffsetSpec::Latest))?
        .offset;
    ensure!(end >= 3, "the failover wrote {end} records");

    let end_setting = end.to_string();
    let b = proxy(
        &broker,
        &[
            ("STATE_KEY", KEY),
            ("STATE_KEY_UNSIGNED_BEFORE", end_setting.as_str()),
        ],
    )?;
    wait_state(&b, "STOPPED")?;
    ensure!(b.metric(SKIPPED)? == 0, "B skipped {}", b.metric(SKIPPED)?);
    ensure!(local_produce(&b, "m")?.0 == NONE, "B: local after failover");

    let c = proxy(&broker, &[("STATE_KEY", KEY)])?;
    let x = link(&c)?;
    ensure!(x["state"] == "MIRRORING", "{x:#}");
    ensure!(
        c.metric(SKIPPED)? == end,
        "C skipped {} of {end}",
        c.metric(SKIPPED)?
    );
    Ok(())
}
