//! The binary's command line: `map` and `unmap` (what operators use to read
//! a log dump), `run`'s refusal of a broken environment, and `links`,
//! `failover` and `start` against a running proxy in front of a real broker.

mod support;

use std::process::{Command, Output};
use std::time::Duration;

use kafka_mirror_proxy::client::protocol::NewTopic;
use kafka_mirror_proxy::client::{Client, ClientConfig};
use kafka_mirror_proxy::net::upstream::Upstream;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;

const BIN: &str = env!("CARGO_BIN_EXE_kafka-mirror-proxy");
/// SPEC §4: this cluster id has hash 0x71720375 and maps PID 5 to this value.
const CLUSTER: &str = "MkU3OEVBNTcwNTJENDM2Qk";
const MAPPED_5: &str = "-5136071999516311547";

/// The binary with every inherited `MIRROR_PROXY_*` variable removed, so the
/// developer's environment cannot change the outcome.
fn bin(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(BIN);
    cmd.args(args);
    for (k, _) in std::env::vars_os() {
        if k.as_encoded_bytes().starts_with(b"MIRROR_PROXY_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("running {BIN} {args:?}: {e}"))
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn map_prints_the_mapped_pid() {
    let out = bin(&["map", "--source-cluster-id", CLUSTER, "--pid", "5"], &[]);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "map failed ({}): {stderr}",
        out.status
    );
    assert_eq!(
        stdout.trim(),
        MAPPED_5,
        "map of PID 5 from {CLUSTER}; stderr: {stderr}"
    );

    // Already mapped (negative) ids pass unchanged, as the proxy forwards them.
    let out = bin(
        &["map", "--source-cluster-id", CLUSTER, "--pid", MAPPED_5],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "map of a mapped pid failed: {stderr}");
    assert_eq!(stdout.trim(), MAPPED_5, "a mapped pid must not map twice");
}

#[test]
fn map_refuses_a_pid_that_does_not_fit() {
    let out = bin(
        &["map", "--source-cluster-id", CLUSTER, "--pid", "2147483648"],
        &[],
    );
    let (stdout, stderr) = text(&out);
    assert!(
        !out.status.success(),
        "map of PID 2^31 must fail; stdout: {stdout}"
    );
    assert!(
        stdout.trim().is_empty(),
        "no mapped value may be printed for PID 2^31: {stdout}"
    );
    assert!(
        stderr.contains("2147483648") && stderr.contains("2^31"),
        "the message must name the pid and the 2^31 limit: {stderr}"
    );
}

#[test]
fn unmap_splits_the_pid_and_names_the_link() {
    let env = [
        ("MIRROR_PROXY_LINKS", "east"),
        ("MIRROR_PROXY_LINK_EAST_SOURCE_CLUSTER_ID", CLUSTER),
        ("MIRROR_PROXY_LINK_EAST_TOPICS", "x"),
    ];
    let out = bin(&["unmap", "--pid", MAPPED_5], &env);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "unmap failed: {stderr}");
    let line = |label: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label:?} line in unmap output:\n{stdout}"))
            .to_string()
    };
    assert_eq!(
        line("region").split_whitespace().nth(1),
        Some("0x71720375"),
        "region of {MAPPED_5}:\n{stdout}"
    );
    assert_eq!(
        line("identity").split_whitespace().nth(1),
        Some("5"),
        "identity of {MAPPED_5}:\n{stdout}"
    );
    assert_eq!(
        line("link").split_whitespace().nth(1),
        Some("east"),
        "the link whose region it is:\n{stdout}"
    );
    // Its source cluster as configured, not the canonical `...Qg`.
    assert!(
        line("link").ends_with(&format!("(source cluster {CLUSTER})")),
        "{stdout}"
    );

    // Without links the numbers are the same, and no link is claimed.
    let out = bin(&["unmap", "--pid", MAPPED_5], &[]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "unmap without links failed: {stderr}");
    assert!(
        stdout.contains("0x71720375") && !stdout.contains("east"),
        "{stdout}"
    );
}

#[test]
fn run_reports_every_bad_variable_at_once() {
    let env = [
        ("MIRROR_PROXY_LOG_FORMAT", "xml"),
        ("MIRROR_PROXY_LINKS", "a"),
        // 21 characters.
        (
            "MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID",
            "MkU3OEVBNTcwNTJENDM2Q",
        ),
        ("MIRROR_PROXY_LINK_A_TOPICS", "t"),
    ];
    let out = bin(&["run"], &env);
    let (stdout, stderr) = text(&out);
    assert_eq!(
        out.status.code(),
        Some(2),
        "exit code of run with a broken environment; stdout: {stdout}\nstderr: {stderr}"
    );
    for variable in [
        "MIRROR_PROXY_BOOTSTRAP_SERVERS",
        "MIRROR_PROXY_LOG_FORMAT",
        "MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID",
    ] {
        assert!(
            stderr.contains(variable),
            "stderr must name {variable}:\n{stderr}"
        );
    }
    assert!(
        stderr.contains("xml") && stderr.contains("21 characters"),
        "stderr must say what was wrong with the values:\n{stderr}"
    );
    assert!(
        !stderr.contains("proxy ready"),
        "nothing may start:\n{stderr}"
    );
}

/// A variable whose value is not Unicode: one of the proxy's is refused by
/// name (exit 2, nothing starts); anyone else's is none of its business
/// (before, either made the proxy panic while reading its environment).
#[test]
fn run_refuses_its_own_variable_that_is_not_unicode_and_passes_over_others() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    let not_unicode = OsStr::from_bytes(b"127.0.0.1:\xff");
    // `run` with no bootstrap servers, someone else's variable not Unicode,
    // and MIRROR_PROXY_LISTEN not Unicode when `ours`: its stderr.
    let run = |ours: bool| {
        let mut cmd = Command::new(BIN);
        cmd.arg("run")
            .env_remove("MIRROR_PROXY_BOOTSTRAP_SERVERS")
            .env_remove("MIRROR_PROXY_LISTEN")
            .env("KMP_SOMEONE_ELSES", not_unicode);
        if ours {
            cmd.env("MIRROR_PROXY_LISTEN", not_unicode);
        }
        let out = cmd.output().expect("the binary runs");
        let (stdout, stderr) = text(&out);
        assert_eq!(
            out.status.code(),
            Some(2),
            "stdout: {stdout}\nstderr: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        stderr
    };
    let stderr = run(true);
    assert!(
        stderr.contains("MIRROR_PROXY_LISTEN") && stderr.contains("Unicode"),
        "stderr must name the variable and say why:\n{stderr}"
    );
    // Someone else's variable alone: the usual report of what is missing.
    let stderr = run(false);
    assert!(
        stderr.contains("MIRROR_PROXY_BOOTSTRAP_SERVERS") && !stderr.contains("Unicode"),
        "stderr must report the missing setting only:\n{stderr}"
    );
}

#[test]
fn links_failover_and_start_drive_a_running_proxy() -> anyhow::Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let client = Client::new(ClientConfig::new(
        vec![broker.bootstrap()],
        Upstream {
            tls: None,
            server_name: None,
            timeout: Duration::from_secs(10),
        },
    ));
    rt.block_on(client.create_topic(&NewTopic {
        name: "orders".into(),
        partitions: 2,
        replication_factor: 1,
        configs: Default::default(),
    }))?;
    let proxy = ProxyProcess::start(
        &broker.bootstrap(),
        &[
            ("LINKS", "east"),
            ("LINK_EAST_SOURCE_CLUSTER_ID", CLUSTER),
            ("LINK_EAST_TOPICS", "orders"),
        ],
    )?;
    let url = format!("http://{}", proxy.admin);
    let admin = [("MIRROR_PROXY_ADMIN_URL", url.as_str())];
    let json = |out: &Output| -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::from_slice(&out.stdout)?)
    };

    // A table by default, the API's JSON with --json.
    let out = bin(&["links"], &admin);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "links: {stdout} {stderr}");
    assert!(
        stdout.contains("east") && stdout.contains("MIRRORING"),
        "links table:\n{stdout}"
    );
    let out = bin(&["links", "--json"], &admin);
    assert_eq!(json(&out)?["links"][0]["state"], "MIRRORING");

    // A failover that completes in every partition: exit 0, each partition
    // refused by the stock broker (87) and recorded.
    let out = bin(&["failover", "east", "--json"], &admin);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(0), "failover: {stdout} {stderr}");
    let link = json(&out)?;
    assert_eq!(link["state"], "STOPPED", "{link}");
    let parts = link["failover"]["partitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(parts.len(), 2, "{link}");
    assert!(
        parts
            .iter()
            .all(|p| p["result"] == "refused" && p["error_code"] == 87),
        "{link}"
    );

    // A refused transition and an unknown link: exit 3 with the reason.
    let out = bin(&["failover", "east"], &admin);
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(3), "again: {stdout} {stderr}");
    assert!(!stderr.is_empty(), "a reason on stderr");
    let out = bin(&["failover", "nowhere"], &admin);
    assert_eq!(out.status.code(), Some(3), "{:?}", text(&out));

    // Start: mirroring again.
    let out = bin(&["start", "east"], &admin);
    assert_eq!(out.status.code(), Some(0), "start: {:?}", text(&out));
    let out = bin(&["links", "--json"], &admin);
    assert_eq!(json(&out)?["links"][0]["state"], "MIRRORING");

    // Nothing listening: exit 1.
    drop(proxy);
    let out = bin(&["links"], &admin);
    assert_eq!(out.status.code(), Some(1), "{:?}", text(&out));
    Ok(())
}
