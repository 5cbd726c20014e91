//! Proxy instances find each other through a Kafka consumer group kept by
//! a real broker's group coordinator (`control::members`): two members in
//! one process see each other, one that leaves (or is dropped) is gone at
//! once (LeaveGroup, well before its session could expire); and two proxy
//! processes on one state topic are members that Kafka's own
//! `kafka-consumer-groups.sh --describe --members` lists, the one killed
//! with SIGKILL disappearing after its session timeout, the other leaving
//! on SIGTERM.

mod support;

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

use kafka_mirror_proxy::client::ClientError;
use kafka_mirror_proxy::control::members::{group_name, Members, MembersOptions};
use support::crate_client::{client, runtime};
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::ProxyProcess;
use support::tools;

/// Poll `check` every 250 ms until it holds; fail after `bound` (a bound on
/// waiting, not a timing assertion) with the last value seen.
async fn until<T: std::fmt::Debug>(
    what: &str,
    bound: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, ClientError>,
    check: impl Fn(&T) -> bool,
) -> Result<T> {
    let deadline = Instant::now() + bound;
    loop {
        let last = probe().await;
        match &last {
            Ok(v) if check(v) => return last.map_err(Into::into),
            _ if Instant::now() >= deadline => bail!("{what}: still {last:?} after {bound:?}"),
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Two members (two clients) list each other; the one that leaves is
/// listed no more, and the other one still is. Sessions of five minutes:
/// only a LeaveGroup removes a member within the test's bounds.
#[test]
fn members_see_each_other_and_a_leaver_is_gone() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    rt.block_on(async {
        let group = group_name("members-test");
        let options = || {
            let mut o = MembersOptions::new("members-test");
            o.session_timeout = Duration::from_secs(300);
            o
        };
        let bootstrap = broker.bootstrap();
        let a = Members::start_with(
            client(&bootstrap),
            group.clone(),
            "inst-a".into(),
            options(),
        );
        let b = Members::start_with(
            client(&bootstrap),
            group.clone(),
            "inst-b".into(),
            options(),
        );
        assert_eq!(a.instance_id(), "inst-a");
        let both = vec!["inst-a".to_string(), "inst-b".to_string()];
        for m in [&a, &b] {
            let seen = until(
                "both instances listed",
                Duration::from_secs(60),
                async || m.live_instances().await.map(sorted),
                |v| *v == both,
            )
            .await?;
            assert_eq!(seen, both);
        }

        // The coordinator's own view, through Kafka's admin tool: a
        // consumer group whose members carry the instance ids.
        let g = group.clone();
        let listed = tokio::task::spawn_blocking(move || {
            tools::consumer_group_member_client_ids(&bootstrap, &g, &[])
        })
        .await??;
        assert_eq!(
            sorted(listed),
            ["kafka-mirror-proxy/inst-a", "kafka-mirror-proxy/inst-b"]
        );

        // Dropping a Members leaves the group.
        drop(b);
        let left = until(
            "the dropped instance gone",
            Duration::from_secs(60),
            async || a.live_instances().await,
            |v| v.as_slice() == ["inst-a"],
        )
        .await?;
        assert_eq!(left, ["inst-a"]);
        // (A rebalance that was waiting for the leaver completes without it.)
        let member = until(
            "the remaining instance a member",
            Duration::from_secs(60),
            async || Ok::<_, ClientError>(a.is_member()),
            |m| *m,
        )
        .await?;
        assert!(member);

        // And so does leave(), which waits for the LeaveGroup.
        a.leave().await;
        assert!(!a.is_member());
        let none = a.live_instances().await?;
        assert!(none.is_empty(), "still listed: {none:?}");
        Ok(())
    })
}

/// Two proxy processes on one state topic are members of
/// `<state topic>.instances`; the one killed with SIGKILL (no LeaveGroup)
/// is dropped by the coordinator once its session times out.
#[test]
fn proxies_are_members_and_a_killed_one_disappears() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let rt = runtime()?;
    let state = "proxies.state";
    let group = group_name(state);
    let env = |id: &'static str| {
        vec![
            ("LINKS", "x"),
            ("LINK_X_SOURCE_CLUSTER_ID", "MkU3OEVBNTcwNTJENDM2Qg"),
            ("LINK_X_TOPICS", "mirrored"),
            ("STATE_TOPIC", state),
            ("INSTANCE_ID", id),
            ("INSTANCE_SESSION_TIMEOUT_MS", "6000"),
        ]
    };
    let one = ProxyProcess::start(&broker.bootstrap(), &env("proxy-one"))?;
    let mut two = ProxyProcess::start(&broker.bootstrap(), &env("proxy-two"))?;
    let c = client(&broker.bootstrap());
    let both = vec!["proxy-one".to_string(), "proxy-two".to_string()];
    let seen = rt.block_on(until(
        "both proxies in the group",
        Duration::from_secs(60),
        async || Ok(sorted(c.describe_group(&group).await?.instances())),
        |v| *v == both,
    ))?;
    assert_eq!(seen, both);
    let described = rt.block_on(c.describe_group(&group))?;
    assert_eq!(described.protocol_type, "consumer");

    let listed = tools::consumer_group_member_client_ids(&broker.bootstrap(), &group, &[])?;
    assert_eq!(
        sorted(listed),
        [
            "kafka-mirror-proxy/proxy-one",
            "kafka-mirror-proxy/proxy-two"
        ]
    );
    // Kafka's default `describe` (offsets) accepts the group as well.
    let out = tools::java(
        tools::CONSUMER_GROUP_COMMAND,
        &[
            "--bootstrap-server",
            &broker.bootstrap(),
            "--describe",
            "--group",
            &group,
        ],
    )?;
    ensure!(
        out.status.success(),
        "describe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let member_metric = "kafka_mirror_proxy_instance_group_member";
    let deadline = Instant::now() + Duration::from_secs(60);
    while one.metric(member_metric)? != 1 {
        ensure!(Instant::now() < deadline, "{member_metric} never became 1");
        std::thread::sleep(Duration::from_millis(250));
    }

    two.signal("KILL")?;
    two.wait_exit(Duration::from_secs(10))?
        .context("proxy-two did not exit after SIGKILL")?;
    let left = rt.block_on(until(
        "the killed proxy dropped by the coordinator",
        Duration::from_secs(90),
        async || c.describe_group(&group).await.map(|d| d.instances()),
        |v| v.as_slice() == ["proxy-one"],
    ))?;
    assert_eq!(left, ["proxy-one"]);
    let listed = tools::consumer_group_member_client_ids(&broker.bootstrap(), &group, &[])?;
    assert_eq!(listed, ["kafka-mirror-proxy/proxy-one"]);

    // A graceful shutdown leaves the group (LeaveGroup) before exiting.
    let mut one = one;
    one.signal("TERM")?;
    one.wait_exit(Duration::from_secs(30))?
        .context("proxy-one did not exit after SIGTERM")?;
    // The log reader thread may still be taking in the last lines.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !one.logs().contains("left the instance group") && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    ensure!(
        one.logs().contains("left the instance group"),
        "no LeaveGroup in the logs:\n{}",
        tools::tail_str(&one.logs(), 30)
    );
    let after = rt.block_on(c.describe_group(&group))?;
    assert!(after.instances().is_empty(), "{after:?}");
    Ok(())
}
