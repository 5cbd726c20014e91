//! The deployment files against the real binary: the Helm chart
//! (`deploy/helm/kafka-mirror-proxy`, rendered by Helm from
//! `scripts/helm.sh`) sets every variable of `config::VARIABLES` in the
//! container, and its probes pass against a proxy started with the rendered
//! environment; every series the Grafana dashboard and the Prometheus rules
//! use exists in a running proxy's `/metrics`; `/readyz` answers 503 while
//! the process drains for shutdown.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use base64::Engine;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, BrokerId, FetchRequest, TopicName};
use kafka_protocol::protocol::StrBytes;
use serde_json::{json, Value};

use support::http;
use support::kafka::{KafkaCluster, KafkaOptions};
use support::proxy::{free_port, free_port_run, proxy_bin, ProxyProcess};
use support::tools;
use support::wire::{partition_result, record_batch_at, RawClient};

const PREFIX: &str = "MIRROR_PROXY_";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chart() -> PathBuf {
    repo().join("deploy/helm/kafka-mirror-proxy")
}

// ---------------------------------------------------------------------------
// A reader for the block YAML Helm renders and the rules file uses:
// mappings, sequences (also unindented under a key, as toYaml writes them),
// plain, quoted and block (`|`, `>`) scalars, flow collections in JSON
// syntax. Scalars stay strings. Enough for these files, not general YAML.

struct YamlLines {
    lines: Vec<(usize, String)>,
    pos: usize,
}

/// Parse the documents of a multi-document YAML text.
fn yaml_documents(text: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    let mut current = Vec::new();
    for line in text.lines().chain(std::iter::once("---")) {
        if line.trim_end() == "---" {
            if !current.is_empty() {
                let mut lines = YamlLines {
                    lines: std::mem::take(&mut current),
                    pos: 0,
                };
                let indent = lines.lines[0].0;
                let doc = yaml_block(&mut lines, indent)?;
                ensure!(
                    lines.pos == lines.lines.len(),
                    "YAML line not understood: {:?}",
                    lines.lines[lines.pos]
                );
                docs.push(doc);
            }
            continue;
        }
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        current.push((line.len() - trimmed.len(), trimmed.trim_end().to_string()));
    }
    Ok(docs)
}

fn yaml_block(l: &mut YamlLines, indent: usize) -> Result<Value> {
    let Some((ind, text)) = l.lines.get(l.pos).cloned() else {
        return Ok(Value::Null);
    };
    if ind < indent {
        return Ok(Value::Null);
    }
    if text == "-" || text.starts_with("- ") {
        return yaml_seq(l, ind);
    }
    if yaml_key(&text).is_some() {
        return yaml_map(l, ind);
    }
    l.pos += 1;
    yaml_scalar(&text)
}

fn yaml_seq(l: &mut YamlLines, ind: usize) -> Result<Value> {
    let mut items = Vec::new();
    while let Some((i, text)) = l.lines.get(l.pos).cloned() {
        if i != ind || !(text == "-" || text.starts_with("- ")) {
            break;
        }
        let rest = text[1..].trim_start();
        if rest.is_empty() {
            l.pos += 1;
            items.push(yaml_block(l, ind + 1)?);
        } else {
            // The item's content starts after "- ": read it as a block
            // indented to there.
            let at = ind + (text.len() - rest.len());
            l.lines[l.pos] = (at, rest.to_string());
            items.push(yaml_block(l, at)?);
        }
    }
    Ok(Value::Array(items))
}

/// `key: rest` (or `key:`): the key and what follows the colon.
fn yaml_key(text: &str) -> Option<(String, String)> {
    if text.starts_with('[') || text.starts_with('{') {
        return None;
    }
    let (key, rest) = if let Some(quote) = text.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let end = text[1..].find(quote)? + 1;
        let rest = text[end + 1..].strip_prefix(':')?;
        (text[1..end].to_string(), rest)
    } else if let Some(key) = text.strip_suffix(':') {
        (key.to_string(), "")
    } else {
        let at = text.find(": ")?;
        (text[..at].to_string(), &text[at + 1..])
    };
    if !rest.is_empty() && !rest.starts_with(' ') {
        return None;
    }
    Some((key, rest.trim().to_string()))
}

fn yaml_map(l: &mut YamlLines, ind: usize) -> Result<Value> {
    let mut map = serde_json::Map::new();
    while let Some((i, text)) = l.lines.get(l.pos).cloned() {
        if i != ind {
            ensure!(i < ind, "YAML line indented unexpectedly: {text:?}");
            break;
        }
        let Some((key, rest)) = yaml_key(&text) else {
            bail!("expected `key: value`, got {text:?}");
        };
        l.pos += 1;
        let value = if rest.is_empty() {
            match l.lines.get(l.pos) {
                Some((next, t)) if *next > ind || (*next == ind && t.starts_with('-')) => {
                    let next = *next;
                    yaml_block(l, next)?
                }
                _ => Value::Null,
            }
        } else if rest.starts_with('|') || rest.starts_with('>') {
            let mut body: Vec<(usize, String)> = Vec::new();
            while let Some((i, t)) = l.lines.get(l.pos) {
                if *i <= ind {
                    break;
                }
                body.push((*i, t.clone()));
                l.pos += 1;
            }
            let base = body.iter().map(|(i, _)| *i).min().unwrap_or(0);
            let joined: Vec<String> = body
                .into_iter()
                .map(|(i, t)| format!("{}{t}", " ".repeat(i - base)))
                .collect();
            Value::String(if rest.starts_with('>') {
                joined.join(" ")
            } else {
                joined.join("\n")
            })
        } else {
            yaml_scalar(&rest)?
        };
        map.insert(key, value);
    }
    Ok(Value::Object(map))
}

fn yaml_scalar(text: &str) -> Result<Value> {
    if text.starts_with('"') || text.starts_with('[') || text.starts_with('{') {
        return serde_json::from_str(text).with_context(|| format!("YAML flow value {text:?}"));
    }
    if let Some(inner) = text.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
        return Ok(Value::String(inner.replace("''", "'")));
    }
    let plain = match text.find(" #") {
        Some(at) => &text[..at],
        None => text,
    };
    Ok(match plain.trim() {
        "null" | "~" => Value::Null,
        s => Value::String(s.to_string()),
    })
}

/// A value as the string it renders to (YAML scalars are kept as strings).
fn text_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The `containerPort`s a container declares.
fn declared_ports(c: &Value) -> Result<BTreeSet<String>> {
    Ok(c["ports"]
        .as_array()
        .context("no container ports")?
        .iter()
        .map(|p| text_of(&p["containerPort"]))
        .collect())
}

#[test]
fn the_yaml_reader_reads_what_helm_writes() -> Result<()> {
    let docs = yaml_documents(
        "# comment\n---\na: 1\nb:\n- x\n- y: \"q\\\"\"\n  z: [\"p\", \"q\"]\nc:\n  d: >-\n    one\n    two\n  e: 'it''s'\n---\nf: g # trailing\n",
    )?;
    assert_eq!(
        docs,
        vec![
            json!({"a": "1", "b": ["x", {"y": "q\"", "z": ["p", "q"]}], "c": {"d": "one two", "e": "it's"}}),
            json!({"f": "g"}),
        ]
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Helm.

/// The helm binary, installed by `scripts/helm.sh` (once; cached). The
/// chart's tests fail, never pass unrun, where it cannot be installed.
fn helm() -> Result<PathBuf> {
    let out = Command::new(repo().join("scripts/helm.sh"))
        .stderr(Stdio::inherit())
        .output()
        .context("running scripts/helm.sh")?;
    if out.status.success() {
        return Ok(PathBuf::from(
            String::from_utf8(out.stdout)?.trim().to_string(),
        ));
    }
    bail!(
        "scripts/helm.sh could not install helm ({}): it needs Go on PATH and the Go module proxy",
        out.status
    )
}

/// `helm template` of the chart as release `kmp` in namespace `mirror`
/// with the values file `file`, Helm's own folders under `home`.
fn helm_template(helm: &Path, file: &Path, home: &Path) -> Result<std::process::Output> {
    Command::new(helm)
        .arg("template")
        .arg("kmp")
        .arg(chart())
        .arg("--namespace")
        .arg("mirror")
        .arg("-f")
        .arg(file)
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .context("running helm template")
}

/// `helm template` of the chart with `values` (written as JSON, which is
/// YAML): the rendered documents, or Helm's error text.
fn render(helm: &Path, values: &Value) -> Result<std::result::Result<Vec<Value>, String>> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, serde_json::to_string_pretty(values)?)?;
    let out = helm_template(helm, &file, dir.path())?;
    if !out.status.success() {
        return Ok(Err(String::from_utf8_lossy(&out.stderr).into_owned()));
    }
    Ok(Ok(yaml_documents(&String::from_utf8(out.stdout)?)?))
}

fn rendered(helm: &Path, values: &Value) -> Result<Vec<Value>> {
    match render(helm, values)? {
        Ok(docs) => Ok(docs),
        Err(e) => bail!("helm template failed:\n{e}"),
    }
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .with_context(|| format!("no {kind} {name} rendered"))
}

fn container(docs: &[Value]) -> Result<&Value> {
    let deployment = find(docs, "Deployment", "kmp-kafka-mirror-proxy")?;
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .context("no containers")?;
    ensure!(containers.len() == 1, "{containers:?}");
    Ok(&containers[0])
}

/// The container's MIRROR_PROXY_* variables: name -> `value` or `valueFrom`,
/// failing on a name set twice.
fn env_of(container: &Value) -> Result<BTreeMap<String, Value>> {
    let mut env = BTreeMap::new();
    for var in container["env"].as_array().context("no env")? {
        let name = text_of(&var["name"]);
        let value = if var["valueFrom"].is_null() {
            var["value"].clone()
        } else {
            json!({"valueFrom": var["valueFrom"]})
        };
        ensure!(
            env.insert(name.clone(), value).is_none(),
            "{name} set twice"
        );
    }
    Ok(env)
}

/// The variables the chart sets from structured values; every other one of
/// `config::VARIABLES` goes through `config`.
const CHART_MANAGED: &[&str] = &[
    "LISTEN",
    "BROKER_PORT_BASE",
    "SNI_HOST_PATTERN",
    "SNI_BOOTSTRAP_HOST",
    "SNI_ADVERTISED_PORT",
    "ADMIN_LISTEN",
    "ADMIN_TOKEN",
    "INSTANCE_ID",
    "TLS_CERT",
    "TLS_KEY",
    "TLS_CLIENT_CA",
    "UPSTREAM_TLS",
    "UPSTREAM_TLS_CA",
    "UPSTREAM_TLS_CERT",
    "UPSTREAM_TLS_KEY",
    "UPSTREAM_SASL_PASSWORD",
    "STATE_KEY",
    "LINKS",
];

fn camel(upper_snake: &str) -> String {
    let mut out = String::new();
    for (i, word) in upper_snake.split('_').enumerate() {
        let word = word.to_ascii_lowercase();
        if i == 0 {
            out.push_str(&word);
        } else {
            let mut chars = word.chars();
            if let Some(first) = chars.next() {
                out.push(first.to_ascii_uppercase());
                out.extend(chars);
            }
        }
    }
    out
}

/// Every variable the proxy reads reaches the container, from a values file
/// setting each one (taken from `config::VARIABLES`, so a variable added to
/// the proxy is covered here at once), with the value or Secret reference
/// given; settings the chart owns are refused in `config`.
#[test]
fn the_chart_sets_every_variable_in_the_container() -> Result<()> {
    let helm = helm()?;
    let mut config = serde_json::Map::new();
    let mut expected: BTreeMap<String, Value> = BTreeMap::new();
    let link_vars: Vec<&str> = kafka_mirror_proxy::config::VARIABLES
        .iter()
        .filter_map(|(name, _, _)| name.strip_prefix("LINK_<NAME>_"))
        .collect();
    ensure!(!link_vars.is_empty(), "no per-link variables found");
    for (i, (name, _, _)) in kafka_mirror_proxy::config::VARIABLES.iter().enumerate() {
        if name.starts_with("LINK_") || CHART_MANAGED.contains(name) {
            continue;
        }
        // Distinct values; numbers, since the chart computes the grace
        // period from SHUTDOWN_TIMEOUT_MS.
        let value = if *name == "SHUTDOWN_TIMEOUT_MS" {
            "45000".to_string()
        } else {
            format!("{}", 70_001 + i)
        };
        config.insert(name.to_string(), json!(value));
        expected.insert(format!("{PREFIX}{name}"), json!(value));
    }
    // Two links, one with a hyphen (LINK_WEST_2_*) and a topic list.
    let mut links = Vec::new();
    for link in ["east", "west-2"] {
        let env = link.to_ascii_uppercase().replace('-', "_");
        let mut entry = serde_json::Map::new();
        entry.insert("name".into(), json!(link));
        for var in &link_vars {
            let value = format!("{link}-{}", var.to_ascii_lowercase());
            if *var == "TOPICS" {
                entry.insert(camel(var), json!([format!("{value}-a"), "b.*"]));
                expected.insert(
                    format!("{PREFIX}LINK_{env}_{var}"),
                    json!(format!("{value}-a,b.*")),
                );
            } else {
                entry.insert(camel(var), json!(value));
                expected.insert(format!("{PREFIX}LINK_{env}_{var}"), json!(value));
            }
        }
        links.push(Value::Object(entry));
    }
    let secret =
        |name: &str, key: &str| json!({"valueFrom": {"secretKeyRef": {"name": name, "key": key}}});
    let managed = [
        ("LISTEN", json!("0.0.0.0:19092")),
        ("BROKER_PORT_BASE", json!("19100")),
        ("ADMIN_LISTEN", json!("0.0.0.0:19190")),
        ("ADMIN_TOKEN", secret("ops-admin", "bearer")),
        (
            "INSTANCE_ID",
            json!({"valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}),
        ),
        (
            "TLS_CERT",
            json!("/etc/kafka-mirror-proxy/tls/client/tls.crt"),
        ),
        (
            "TLS_KEY",
            json!("/etc/kafka-mirror-proxy/tls/client/tls.key"),
        ),
        (
            "TLS_CLIENT_CA",
            json!("/etc/kafka-mirror-proxy/tls/client/clients-ca.pem"),
        ),
        ("UPSTREAM_TLS", json!("true")),
        (
            "UPSTREAM_TLS_CA",
            json!("/etc/kafka-mirror-proxy/tls/upstream/broker-ca.pem"),
        ),
        (
            "UPSTREAM_TLS_CERT",
            json!("/etc/kafka-mirror-proxy/tls/upstream/proxy.crt"),
        ),
        (
            "UPSTREAM_TLS_KEY",
            json!("/etc/kafka-mirror-proxy/tls/upstream/proxy.key"),
        ),
        (
            "UPSTREAM_SASL_PASSWORD",
            secret("kafka-credentials", "password"),
        ),
        ("STATE_KEY", secret("mirror-state", "hmac-key")),
        ("LINKS", json!("east,west-2")),
    ];
    for (name, value) in managed {
        expected.insert(format!("{PREFIX}{name}"), value);
    }
    // Not the proxy's but its CLI's, for `kubectl exec ... -- kafka-mirror-proxy links`.
    expected.insert(
        format!("{PREFIX}ADMIN_URL"),
        json!("http://127.0.0.1:19190"),
    );
    let values = json!({
        "config": config,
        "links": links,
        "secretEnv": {
            "UPSTREAM_SASL_PASSWORD": {"name": "kafka-credentials", "key": "password"},
            "STATE_KEY": {"name": "mirror-state", "key": "hmac-key"},
        },
        "routing": {"bootstrapPort": 19092, "brokerPortBase": 19100, "nodeIds": [1, 2, 7]},
        "admin": {"port": 19190, "existingSecret": "ops-admin", "existingSecretKey": "bearer"},
        "tls": {
            "client": {"secretName": "client-tls", "clientCaKey": "clients-ca.pem"},
            "upstream": {"secretName": "broker-tls", "caKey": "broker-ca.pem", "certKey": "proxy.crt", "keyKey": "proxy.key"},
        },
        "serviceMonitor": {"enabled": true},
    });
    let docs = rendered(&helm, &values)?;
    let c = container(&docs)?;
    let env = env_of(c)?;

    // Every variable the proxy documents is set, as given, and nothing else.
    exactly(&env, &expected, "variables")?;
    println!(
        "{} variables rendered into the container ({} from config::VARIABLES with 2 links)",
        env.len(),
        kafka_mirror_proxy::config::VARIABLES.len()
    );

    // The TLS Secrets are mounted where the variables point.
    let deployment = find(&docs, "Deployment", "kmp-kafka-mirror-proxy")?;
    let pod = &deployment["spec"]["template"]["spec"];
    for (volume, secret, path) in [
        (
            "tls-client",
            "client-tls",
            "/etc/kafka-mirror-proxy/tls/client",
        ),
        (
            "tls-upstream",
            "broker-tls",
            "/etc/kafka-mirror-proxy/tls/upstream",
        ),
    ] {
        secret_mounted(pod, c, volume, secret, path, false)?;
    }
    // The grace period covers the drain: 45 s + 10 s cleanup + 15 s margin.
    ensure!(
        text_of(&pod["terminationGracePeriodSeconds"]) == "70",
        "terminationGracePeriodSeconds {}",
        pod["terminationGracePeriodSeconds"]
    );
    // One Service port per node id, each at the port base + id, and the
    // container listening there.
    let service = find(&docs, "Service", "kmp-kafka-mirror-proxy")?;
    let ports: BTreeMap<String, String> = service["spec"]["ports"]
        .as_array()
        .context("no ports")?
        .iter()
        .map(|p| (text_of(&p["name"]), text_of(&p["port"])))
        .collect();
    let want: BTreeMap<String, String> = [
        ("bootstrap", "19092"),
        ("node-1", "19101"),
        ("node-2", "19102"),
        ("node-7", "19107"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect();
    ensure!(ports == want, "Service ports {ports:?}");
    let container_ports = declared_ports(c)?;
    for port in want.values().chain(std::iter::once(&"19190".to_string())) {
        ensure!(
            container_ports.contains(port),
            "container port {port} missing"
        );
    }
    // The existing Secret is used (none created), also by the ServiceMonitor.
    ensure!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "a Secret was created although admin.existingSecret is set"
    );
    let monitor = find(&docs, "ServiceMonitor", "kmp-kafka-mirror-proxy")?;
    let auth = &monitor["spec"]["endpoints"][0]["authorization"]["credentials"];
    ensure!(
        auth["name"] == "ops-admin" && auth["key"] == "bearer",
        "ServiceMonitor credentials {auth}"
    );
    find(&docs, "PodDisruptionBudget", "kmp-kafka-mirror-proxy")?;

    // Settings the chart owns, or secrets, are refused in `config`.
    for (key, hint) in [
        ("LISTEN", "routing.bootstrapPort"),
        ("ADMIN_TOKEN", "admin.existingSecret"),
        ("STATE_KEY", "secretEnv"),
        ("LINK_EAST_TOPICS", "links"),
    ] {
        let mut bad = values.clone();
        bad["config"][key] = json!("x");
        match render(&helm, &bad)? {
            Ok(_) => bail!("config.{key} was accepted"),
            Err(e) => ensure!(
                e.contains(&format!("config.{key}")) && e.contains(hint),
                "config.{key} refused without naming {hint}: {e}"
            ),
        }
    }

    // SNI routing: one Service port, the SNI variables instead of the
    // port-per-node ones, every other variable as before.
    let mut sni = values.clone();
    sni["routing"]["mode"] = json!("sni");
    sni["routing"]["sni"] = json!({
        "hostPattern": "broker-$(nodeId).kafka.example.com",
        "bootstrapHost": "bootstrap.kafka.example.com",
        "advertisedPort": 443,
    });
    // Port-per-node only: refused beside SNI (by the proxy, and the chart).
    let with_host = sni.clone();
    if let Some(config) = sni["config"].as_object_mut() {
        config.remove("ADVERTISED_HOST");
    }
    let docs = rendered(&helm, &sni)?;
    let c = container(&docs)?;
    let env = env_of(c)?;
    let mut want_env = expected.clone();
    want_env.remove(&format!("{PREFIX}ADVERTISED_HOST"));
    want_env.remove(&format!("{PREFIX}BROKER_PORT_BASE"));
    for (name, value) in [
        // Kubernetes expands `$(NAME)` in env values from the container's
        // other variables; `$$(` is its escape for a literal `$(`.
        ("SNI_HOST_PATTERN", "broker-$$(nodeId).kafka.example.com"),
        ("SNI_BOOTSTRAP_HOST", "bootstrap.kafka.example.com"),
        ("SNI_ADVERTISED_PORT", "443"),
    ] {
        want_env.insert(format!("{PREFIX}{name}"), json!(value));
    }
    ensure!(
        env == want_env,
        "SNI mode environment: rendered {env:?}, expected {want_env:?}"
    );
    let service = find(&docs, "Service", "kmp-kafka-mirror-proxy")?;
    let ports: Vec<(String, String)> = service["spec"]["ports"]
        .as_array()
        .context("no ports")?
        .iter()
        .map(|p| (text_of(&p["name"]), text_of(&p["port"])))
        .collect();
    ensure!(
        ports == [("bootstrap".to_string(), "19092".to_string())],
        "SNI Service ports {ports:?}"
    );
    let container_ports = declared_ports(c)?;
    ensure!(
        container_ports == BTreeSet::from(["19092".to_string(), "19190".to_string()]),
        "SNI container ports {container_ports:?}"
    );
    // What SNI mode cannot run without, refused with the setting named.
    let mut no_tls = sni.clone();
    no_tls["tls"]["client"] = json!({});
    let mut no_pattern = sni.clone();
    no_pattern["routing"]["sni"]["hostPattern"] = json!("broker.kafka.example.com");
    let mut bad_mode = sni.clone();
    bad_mode["routing"]["mode"] = json!("ports");
    for (what, bad, needle) in [
        ("sni without TLS", no_tls, "tls.client.secretName"),
        ("a pattern without $(nodeId)", no_pattern, "$(nodeId)"),
        (
            "ADVERTISED_HOST with sni",
            with_host,
            "config.ADVERTISED_HOST",
        ),
        ("an unknown mode", bad_mode, "routing.mode"),
    ] {
        match render(&helm, &bad)? {
            Ok(_) => bail!("{what} was accepted"),
            Err(e) => ensure!(
                e.contains(needle),
                "{what}: refused without naming {needle}: {e}"
            ),
        }
    }
    Ok(())
}

/// The pod spec `pod` has a volume `volume` of the Secret `secret`, and
/// its container `c` mounts it at `path` (read-only, if `read_only`).
fn secret_mounted(
    pod: &Value,
    c: &Value,
    volume: &str,
    secret: &str,
    path: &str,
    read_only: bool,
) -> Result<()> {
    let volumes = pod["volumes"].as_array().context("no volumes")?;
    ensure!(
        volumes
            .iter()
            .any(|v| v["name"] == volume && v["secret"]["secretName"] == secret),
        "volume {volume} of Secret {secret} missing: {volumes:?}"
    );
    let mounts = c["volumeMounts"].as_array().context("no mounts")?;
    ensure!(
        mounts.iter().any(|m| m["name"] == volume
            && m["mountPath"] == path
            && (!read_only || m["readOnly"] == "true")),
        "{volume} not mounted{} at {path}: {mounts:?}",
        if read_only { " read-only" } else { "" }
    );
    Ok(())
}

/// `env` (a container's variables) holds exactly `expected`, each with the
/// value given; `what` names the expected entries (variables, flags).
fn exactly(
    env: &BTreeMap<String, Value>,
    expected: &BTreeMap<String, Value>,
    what: &str,
) -> Result<()> {
    let mut missing = Vec::new();
    for (name, value) in expected {
        match env.get(name) {
            None => missing.push(name.clone()),
            Some(got) => ensure!(got == value, "{name}: rendered {got}, expected {value}"),
        }
    }
    ensure!(
        missing.is_empty(),
        "{what} not in the container: {missing:?}"
    );
    let extra: Vec<_> = env.keys().filter(|k| !expected.contains_key(*k)).collect();
    ensure!(extra.is_empty(), "unexpected variables: {extra:?}");
    Ok(())
}

/// GET `path` on the admin endpoint at `addr` with `token`: (status line, body).
fn admin_get(addr: &str, path: &str, token: &str) -> Result<(String, String)> {
    let auth = format!("Authorization: Bearer {token}\r\n");
    let answer = http::request(addr, "GET", path, &auth, "", Duration::from_secs(30))?;
    Ok((answer.status, answer.body))
}

/// A proxy process started with exactly the given environment, its log
/// collected; killed on drop.
struct Proxy {
    child: Child,
    log: Arc<Mutex<String>>,
}

impl Proxy {
    fn start(env: &BTreeMap<String, String>) -> Result<Proxy> {
        let mut cmd = Command::new(proxy_bin());
        cmd.arg("run").stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, _) in std::env::vars() {
            if k.starts_with(PREFIX) {
                cmd.env_remove(k);
            }
        }
        cmd.envs(env);
        let mut child = cmd.spawn().context("starting the proxy")?;
        let log = Arc::new(Mutex::new(String::new()));
        let stderr = child.stderr.take().context("no stderr")?;
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                if let Ok(mut log) = sink.lock() {
                    log.push_str(&line);
                    log.push('\n');
                }
            }
        });
        let mut proxy = Proxy { child, log };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !proxy.log().contains("proxy ready") {
            if let Some(status) = proxy.child.try_wait()? {
                std::thread::sleep(Duration::from_millis(200));
                bail!("proxy exited ({status}):\n{}", proxy.log());
            }
            ensure!(
                Instant::now() < deadline,
                "proxy not ready within 60 s:\n{}",
                proxy.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(proxy)
    }

    fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The admin paths the server really routes (read from `src/admin.rs`).
fn admin_routes() -> Result<BTreeSet<String>> {
    let source = std::fs::read_to_string(repo().join("src/admin.rs"))?;
    let routes: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".route(\""))
        .filter_map(|l| l.split('"').next())
        .map(str::to_string)
        .collect();
    ensure!(
        routes.contains("/metrics"),
        "route table not found: {routes:?}"
    );
    Ok(routes)
}

/// The chart's probes, run as the kubelet would run them (the exec command,
/// with the container's rendered environment) against the proxy started
/// with that same environment and a real broker: each passes, each GETs a
/// path of the admin route table that answers 200, and a wrong token makes
/// them fail (so they do check the answer).
#[test]
fn the_chart_probes_pass_against_the_proxy_started_with_its_environment() -> Result<()> {
    let helm = helm()?;
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    // Node 1's port is bootstrap + 2: the port base is bootstrap + 1.
    let bootstrap_port = free_port_run(2)?;
    let admin_port = free_port()?;
    let token = "probe-token-0123456789";
    let values = json!({
        "config": {
            "BOOTSTRAP_SERVERS": broker.bootstrap(),
            "ADVERTISED_HOST": "127.0.0.1",
            "SHUTDOWN_TIMEOUT_MS": "5000",
        },
        "routing": {"bootstrapPort": bootstrap_port, "brokerPortBase": bootstrap_port + 1, "nodeIds": [1]},
        "admin": {"port": admin_port, "token": token},
    });
    let docs = rendered(&helm, &values)?;
    let c = container(&docs)?;
    // The environment as Kubernetes gives it: the chart's own Secret and
    // the pod name resolved.
    let secret = find(&docs, "Secret", "kmp-kafka-mirror-proxy-admin")?;
    let mut env = BTreeMap::new();
    for (name, value) in env_of(c)? {
        let resolved = if let Some(value) = value.as_str() {
            value.to_string()
        } else if let Some(r) = value["valueFrom"]["secretKeyRef"].as_object() {
            ensure!(
                r["name"] == "kmp-kafka-mirror-proxy-admin",
                "{name} from an unknown Secret {r:?}"
            );
            let data = text_of(&secret["data"][text_of(&r["key"])]);
            String::from_utf8(base64::engine::general_purpose::STANDARD.decode(data)?)?
        } else if value["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name" {
            "kmp-kafka-mirror-proxy-7d9f-abcde".to_string()
        } else {
            bail!("{name}: cannot resolve {value}");
        };
        env.insert(name, resolved);
    }
    ensure!(
        env["MIRROR_PROXY_ADMIN_TOKEN"] == token,
        "token {:?}",
        env["MIRROR_PROXY_ADMIN_TOKEN"]
    );
    let proxy = Proxy::start(&env)?;
    let admin = format!("127.0.0.1:{admin_port}");
    let routes = admin_routes()?;

    for (probe, path) in [
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ] {
        let command: Vec<String> = c[probe]["exec"]["command"]
            .as_array()
            .with_context(|| format!("{probe} is not an exec probe: {}", c[probe]))?
            .iter()
            .map(text_of)
            .collect();
        ensure!(
            command.len() == 6 && command[0] == "bash" && command[1] == "-c",
            "{probe}: {command:?}"
        );
        ensure!(
            command[4] == path,
            "{probe} checks {} instead of {path}",
            command[4]
        );
        ensure!(
            command[5] == admin_port.to_string(),
            "{probe} on port {}",
            command[5]
        );
        ensure!(
            routes.contains(path),
            "{path} is not an admin route: {routes:?}"
        );
        let (status, body) = admin_get(&admin, path, token)?;
        ensure!(status == "HTTP/1.1 200 OK", "GET {path}: {status} {body}");

        let run = |token: &str| -> Result<std::process::Output> {
            let mut probe_env = env.clone();
            probe_env.insert("MIRROR_PROXY_ADMIN_TOKEN".into(), token.into());
            Ok(Command::new(&command[0])
                .args(&command[1..])
                .env_clear()
                .envs(&probe_env)
                .output()?)
        };
        let out = run(token)?;
        ensure!(
            out.status.success(),
            "{probe} failed: {}\nproxy log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            proxy.log()
        );
        let out = run("wrong-token")?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        ensure!(
            !out.status.success() && stderr.contains("401"),
            "{probe} with a wrong token: {} {stderr}",
            out.status
        );
        println!(
            "{probe}: GET {path} passed; with a wrong token: {}",
            stderr.trim()
        );
    }
    // The CLI in the container reaches the admin API from the environment.
    let out = Command::new(proxy_bin())
        .args(["links", "--json"])
        .env_clear()
        .envs(&env)
        .output()?;
    ensure!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("\"links\""),
        "kafka-mirror-proxy links with the container's environment: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The replicator's Deployment (`replicator.enabled`).

/// The replicator's flags: its own table (`config::replicator::VARIABLES`),
/// each also `MIRROR_REPLICATOR_<FLAG>`.
fn replicator_flags() -> Vec<&'static str> {
    kafka_mirror_proxy::config::replicator::VARIABLES
        .iter()
        .map(|(name, _, _)| *name)
        .collect()
}

const REPLICATOR_PREFIX: &str = "MIRROR_REPLICATOR_";

/// The flags the chart derives from structured values (or refuses); every
/// other one goes through `replicator.config`.
const REPLICATOR_CHART_MANAGED: &[&str] = &[
    "SOURCE_BOOTSTRAP_SERVERS",
    "DESTINATION_BOOTSTRAP_SERVERS",
    "LINK",
    "CLIENT_ID",
    "TOPICS",
    "GROUP_ID",
    "ADMIN_LISTEN",
    "UNTIL_CAUGHT_UP",
    "SOURCE_TLS",
    "SOURCE_TLS_CA",
    "SOURCE_TLS_CERT",
    "SOURCE_TLS_KEY",
    "SOURCE_TLS_SERVER_NAME",
    "SOURCE_SASL_PASSWORD",
    "DESTINATION_TLS",
    "DESTINATION_TLS_CA",
    "DESTINATION_TLS_CERT",
    "DESTINATION_TLS_KEY",
    "DESTINATION_TLS_SERVER_NAME",
    "DESTINATION_SASL_PASSWORD",
];

const REPLICATOR: &str = "kmp-kafka-mirror-proxy-replicator";

fn replicator_deployment(docs: &[Value]) -> Result<&Value> {
    find(docs, "Deployment", REPLICATOR)
}

fn replicator_container(docs: &[Value]) -> Result<&Value> {
    let containers = replicator_deployment(docs)?["spec"]["template"]["spec"]["containers"]
        .as_array()
        .context("no containers")?;
    ensure!(containers.len() == 1, "{containers:?}");
    Ok(&containers[0])
}

/// Whether a `matchLabels` selector (or a Service's `selector`) selects
/// an object with `labels`.
fn selects(selector: &Value, labels: &Value) -> Result<bool> {
    let selector = selector.as_object().context("selector not a map")?;
    ensure!(!selector.is_empty(), "an empty selector selects everything");
    Ok(selector.iter().all(|(k, v)| labels[k] == *v))
}

/// A proxy in nodePorts mode with link `east` (topics, a client id of its
/// own) and, when `replicator` is given, the replicator with those values.
fn with_replicator(replicator: Value) -> Value {
    json!({
        "config": {
            "BOOTSTRAP_SERVERS": "kafka-0.kafka:9092",
            "ADVERTISED_HOST": "kafka-proxy.example.com",
        },
        "links": [{
            "name": "east",
            "sourceClusterId": "MkU3OEVBNTcwNTJENDM2Qk",
            "topics": ["orders", "payments-.*"],
            "clientId": "mirror-east-dc",
        }],
        "routing": {"bootstrapPort": 19092, "brokerPortBase": 19100, "nodeIds": [1]},
        "serviceMonitor": {"enabled": true},
        "replicator": replicator,
    })
}

/// `helm template` with a values file of the chart (`ci/...`).
fn rendered_with_file(helm: &Path, file: &Path) -> Result<Vec<Value>> {
    let dir = tempfile::tempdir()?;
    let out = helm_template(helm, file, dir.path())?;
    ensure!(
        out.status.success(),
        "helm template -f {}:\n{}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_documents(&String::from_utf8(out.stdout)?)
}

/// Off by default: nothing of the replicator renders without
/// `replicator.enabled` (nor with the SNI CI values, which leave it off);
/// the example CI values enable it, so CI lints and renders it.
#[test]
fn the_replicator_renders_only_when_enabled() -> Result<()> {
    let helm = helm()?;
    let is_replicator = |d: &Value| text_of(&d["metadata"]["name"]).contains("replicator");
    let mut off = with_replicator(json!({}));
    if let Some(values) = off.as_object_mut() {
        values.remove("replicator");
    }
    let docs = rendered(&helm, &off)?;
    ensure!(!docs.is_empty(), "nothing rendered");
    let stray: Vec<_> = docs.iter().filter(|d| is_replicator(d)).collect();
    ensure!(stray.is_empty(), "rendered while off: {stray:?}");
    // Even half-configured: off means not validated either.
    let docs = rendered(
        &helm,
        &with_replicator(json!({"enabled": false, "link": "nowhere"})),
    )?;
    ensure!(!docs.iter().any(is_replicator), "rendered while off");

    let sni = rendered_with_file(&helm, &chart().join("ci/sni-values.yaml"))?;
    ensure!(
        !sni.iter().any(is_replicator),
        "ci/sni-values.yaml renders it"
    );
    let example = rendered_with_file(&helm, &chart().join("ci/example-values.yaml"))?;
    let kinds: BTreeSet<String> = example
        .iter()
        .filter(|d| is_replicator(d))
        .map(|d| text_of(&d["kind"]))
        .collect();
    ensure!(
        kinds == BTreeSet::from(["Deployment", "Service", "ServiceMonitor"].map(String::from)),
        "ci/example-values.yaml renders of the replicator: {kinds:?}"
    );
    let env = env_of(replicator_container(&example)?)?;
    ensure!(
        env[&format!("{REPLICATOR_PREFIX}SOURCE_SASL_PASSWORD")]
            == json!({"valueFrom": {"secretKeyRef": {"name": "kafka-east-credentials", "key": "password"}}}),
        "ci/example-values.yaml: {env:?}"
    );
    Ok(())
}

/// Every flag of the contract reaches the replicator's container as
/// `MIRROR_REPLICATOR_<FLAG>`, with the value or Secret reference given,
/// and nothing else does; it runs `replicate` from the proxy's image with
/// probes on its admin port, the proxy's security settings, the TLS
/// Secrets mounted where the variables point; and its pods are not taken
/// for the proxy's (or the other way round) by any selector.
#[test]
fn the_chart_sets_every_replicator_flag_in_its_container() -> Result<()> {
    let helm = helm()?;
    let mut config = serde_json::Map::new();
    let mut expected: BTreeMap<String, Value> = BTreeMap::new();
    let flags = replicator_flags();
    for (i, flag) in flags.iter().enumerate() {
        if !REPLICATOR_CHART_MANAGED.contains(flag) {
            let value = format!("{}", 80_001 + i);
            config.insert(flag.to_string(), json!(value));
            expected.insert(format!("{REPLICATOR_PREFIX}{flag}"), json!(value));
        }
    }
    let secret =
        |name: &str, key: &str| json!({"valueFrom": {"secretKeyRef": {"name": name, "key": key}}});
    for (flag, value) in [
        ("SOURCE_BOOTSTRAP_SERVERS", json!("src-0:9092,src-1:9092")),
        ("DESTINATION_BOOTSTRAP_SERVERS", json!("proxy.other:9092")),
        ("LINK", json!("east")),
        ("CLIENT_ID", json!("mirror-east-dc")),
        ("TOPICS", json!("orders,payments-.*")),
        ("GROUP_ID", json!("replicator.east.v2")),
        ("ADMIN_LISTEN", json!("0.0.0.0:19191")),
        ("SOURCE_TLS", json!("true")),
        (
            "SOURCE_TLS_CA",
            json!("/etc/kafka-mirror-proxy/tls/source/src-ca.pem"),
        ),
        (
            "SOURCE_TLS_CERT",
            json!("/etc/kafka-mirror-proxy/tls/source/src.crt"),
        ),
        (
            "SOURCE_TLS_KEY",
            json!("/etc/kafka-mirror-proxy/tls/source/src.key"),
        ),
        ("SOURCE_TLS_SERVER_NAME", json!("kafka.source.example.com")),
        (
            "SOURCE_SASL_PASSWORD",
            secret("source-credentials", "password"),
        ),
        ("DESTINATION_TLS", json!("true")),
        (
            "DESTINATION_TLS_CA",
            json!("/etc/kafka-mirror-proxy/tls/destination/ca.crt"),
        ),
        (
            "DESTINATION_TLS_CERT",
            json!("/etc/kafka-mirror-proxy/tls/destination/tls.crt"),
        ),
        (
            "DESTINATION_TLS_KEY",
            json!("/etc/kafka-mirror-proxy/tls/destination/tls.key"),
        ),
        (
            "DESTINATION_TLS_SERVER_NAME",
            json!("proxy.other.example.com"),
        ),
        (
            "DESTINATION_SASL_PASSWORD",
            secret("dest-credentials", "secret"),
        ),
    ] {
        expected.insert(format!("{REPLICATOR_PREFIX}{flag}"), value);
    }
    let mut values = with_replicator(json!({
        "enabled": true,
        "replicaCount": 3,
        "link": "east",
        "sourceBootstrapServers": "src-0:9092,src-1:9092",
        "destinationBootstrapServers": "proxy.other:9092",
        "topics": ["orders", "payments-.*"],
        "clientId": "mirror-east-dc",
        "groupId": "replicator.east.v2",
        "config": config,
        "secretEnv": {
            "SOURCE_SASL_PASSWORD": {"name": "source-credentials", "key": "password"},
            "DESTINATION_SASL_PASSWORD": {"name": "dest-credentials", "key": "secret"},
        },
        "tls": {
            "source": {"secretName": "source-tls", "caKey": "src-ca.pem", "certKey": "src.crt", "keyKey": "src.key", "serverName": "kafka.source.example.com"},
            "destination": {"secretName": "replicator-tls", "certKey": "tls.crt", "keyKey": "tls.key", "serverName": "proxy.other.example.com"},
        },
        "admin": {"port": 19191},
        "terminationGracePeriodSeconds": 75,
    }));
    // The link's tlsSubject, which needs the client certificate given.
    values["links"][0]["tlsSubject"] = json!("CN=replicator");
    let docs = rendered(&helm, &values)?;
    let c = replicator_container(&docs)?;
    let env = env_of(c)?;

    // Every name is one of the contract's flags.
    let unknown: Vec<_> = env
        .keys()
        .filter(|k| {
            k.strip_prefix(REPLICATOR_PREFIX)
                .is_none_or(|flag| !replicator_flags().contains(&flag))
        })
        .collect();
    ensure!(unknown.is_empty(), "not flags of the contract: {unknown:?}");
    // Every flag is set as given, but --until-caught-up (a Deployment's
    // replicator runs until stopped).
    exactly(&env, &expected, "flags")?;
    ensure!(
        expected.len() == flags.len() - 1
            && !env.contains_key(&format!("{REPLICATOR_PREFIX}UNTIL_CAUGHT_UP")),
        "{} of {} flags expected",
        expected.len(),
        flags.len()
    );
    println!(
        "{} replicator variables rendered into its container",
        env.len()
    );

    // The subcommand of the proxy's image.
    let proxy = container(&docs)?;
    ensure!(c["args"] == json!(["replicate"]), "args {}", c["args"]);
    ensure!(
        c["image"] == proxy["image"] && c["imagePullPolicy"] == proxy["imagePullPolicy"],
        "image {} beside the proxy's {}",
        c["image"],
        proxy["image"]
    );
    // Probes on the admin port the replicator listens on (ADMIN_LISTEN).
    let ports = c["ports"].as_array().context("no ports")?;
    ensure!(
        ports.len() == 1
            && ports[0]["name"] == "admin"
            && text_of(&ports[0]["containerPort"]) == "19191",
        "ports {ports:?}"
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        ensure!(
            get["path"] == path && get["port"] == "admin",
            "{probe}: {}",
            c[probe]
        );
        ensure!(
            !c[probe]["periodSeconds"].is_null() && !c[probe]["failureThreshold"].is_null(),
            "{probe} without its settings: {}",
            c[probe]
        );
    }
    // The proxy's security settings, pod and container.
    let pod = &replicator_deployment(&docs)?["spec"]["template"]["spec"];
    let proxy_pod =
        &find(&docs, "Deployment", "kmp-kafka-mirror-proxy")?["spec"]["template"]["spec"];
    ensure!(
        c["securityContext"] == proxy["securityContext"]
            && c["securityContext"]["readOnlyRootFilesystem"] == "true",
        "container securityContext {}",
        c["securityContext"]
    );
    ensure!(
        pod["securityContext"] == proxy_pod["securityContext"]
            && pod["securityContext"]["runAsNonRoot"] == "true",
        "pod securityContext {}",
        pod["securityContext"]
    );
    ensure!(
        text_of(&pod["terminationGracePeriodSeconds"]) == "75",
        "terminationGracePeriodSeconds {}",
        pod["terminationGracePeriodSeconds"]
    );
    ensure!(
        text_of(&replicator_deployment(&docs)?["spec"]["replicas"]) == "3",
        "replicas"
    );
    // The TLS Secrets mounted where the variables point.
    for (volume, secret, path) in [
        (
            "tls-source",
            "source-tls",
            "/etc/kafka-mirror-proxy/tls/source",
        ),
        (
            "tls-destination",
            "replicator-tls",
            "/etc/kafka-mirror-proxy/tls/destination",
        ),
    ] {
        secret_mounted(pod, c, volume, secret, path, true)?;
    }

    // Selectors: the proxy's never take a replicator pod or its admin
    // Service, the replicator's take exactly its own.
    let replicator_pod = &replicator_deployment(&docs)?["spec"]["template"]["metadata"]["labels"];
    let proxy_pod_labels = &find(&docs, "Deployment", "kmp-kafka-mirror-proxy")?["spec"]
        ["template"]["metadata"]["labels"];
    let replicator_selector = &replicator_deployment(&docs)?["spec"]["selector"]["matchLabels"];
    ensure!(
        selects(replicator_selector, replicator_pod)?,
        "the replicator's Deployment does not select its pods"
    );
    ensure!(
        !selects(replicator_selector, proxy_pod_labels)?,
        "the replicator's Deployment selects the proxy's pods"
    );
    for (kind, name, path) in [
        (
            "Deployment",
            "kmp-kafka-mirror-proxy",
            "/spec/selector/matchLabels",
        ),
        ("Service", "kmp-kafka-mirror-proxy", "/spec/selector"),
        ("Service", "kmp-kafka-mirror-proxy-admin", "/spec/selector"),
        (
            "PodDisruptionBudget",
            "kmp-kafka-mirror-proxy",
            "/spec/selector/matchLabels",
        ),
    ] {
        let selector = find(&docs, kind, name)?
            .pointer(path)
            .context("no selector")?;
        ensure!(
            selects(selector, proxy_pod_labels)?,
            "{kind} {name} does not select the proxy's pods"
        );
        ensure!(
            !selects(selector, replicator_pod)?,
            "{kind} {name} selects the replicator's pods"
        );
    }
    let admin = find(&docs, "Service", &format!("{REPLICATOR}-admin"))?;
    ensure!(
        selects(&admin["spec"]["selector"], replicator_pod)?,
        "the replicator's admin Service misses its pods"
    );
    ensure!(
        admin["spec"]["ports"][0]["targetPort"] == "admin"
            && text_of(&admin["spec"]["ports"][0]["port"]) == "19191",
        "admin Service ports {}",
        admin["spec"]["ports"]
    );
    let proxy_admin =
        &find(&docs, "Service", "kmp-kafka-mirror-proxy-admin")?["metadata"]["labels"];
    let monitor = &find(&docs, "ServiceMonitor", REPLICATOR)?["spec"];
    ensure!(
        selects(
            &monitor["selector"]["matchLabels"],
            &admin["metadata"]["labels"]
        )?,
        "its ServiceMonitor misses its admin Service"
    );
    ensure!(
        !selects(&monitor["selector"]["matchLabels"], proxy_admin)?,
        "its ServiceMonitor scrapes the proxy"
    );
    ensure!(
        monitor["endpoints"][0]["port"] == "admin" && monitor["endpoints"][0]["path"] == "/metrics",
        "its ServiceMonitor endpoint {}",
        monitor["endpoints"]
    );
    let proxy_monitor = &find(&docs, "ServiceMonitor", "kmp-kafka-mirror-proxy")?["spec"]
        ["selector"]["matchLabels"];
    ensure!(
        !selects(proxy_monitor, &admin["metadata"]["labels"])?,
        "the proxy's ServiceMonitor scrapes the replicator with the proxy's token"
    );
    Ok(())
}

/// Left unset, the destination is this chart's proxy (its Service; the SNI
/// bootstrap name in sni mode), and the topics and client id are the
/// link's; what cannot work is refused with the value to set named.
#[test]
fn the_replicator_defaults_to_the_charts_proxy_and_link() -> Result<()> {
    let helm = helm()?;
    let var = |env: &BTreeMap<String, Value>, flag: &str| {
        env.get(&format!("{REPLICATOR_PREFIX}{flag}")).cloned()
    };
    let minimal = json!({"enabled": true, "link": "east", "sourceBootstrapServers": "src:9092"});

    let docs = rendered(&helm, &with_replicator(minimal.clone()))?;
    let env = env_of(replicator_container(&docs)?)?;
    for (flag, want) in [
        (
            "DESTINATION_BOOTSTRAP_SERVERS",
            Some(json!("kmp-kafka-mirror-proxy.mirror.svc:19092")),
        ),
        ("TOPICS", Some(json!("orders,payments-.*"))),
        ("CLIENT_ID", Some(json!("mirror-east-dc"))),
        ("ADMIN_LISTEN", Some(json!("0.0.0.0:9191"))),
        ("LOG_FORMAT", Some(json!("json"))),
        // The replicator's own defaults apply: replicator.<client id>.
        ("GROUP_ID", None),
        ("DESTINATION_TLS", None),
    ] {
        ensure!(
            var(&env, flag) == want,
            "{flag}: {:?}, expected {want:?}",
            var(&env, flag)
        );
    }
    // The proxy Service named is the one rendered, at its bootstrap port.
    let service = find(&docs, "Service", "kmp-kafka-mirror-proxy")?;
    ensure!(
        text_of(&service["spec"]["ports"][0]["port"]) == "19092",
        "{}",
        service["spec"]["ports"]
    );
    // A link without a client id: both sides keep their default, mirror-<link>.
    let mut plain = with_replicator(minimal.clone());
    if let Some(link) = plain["links"][0].as_object_mut() {
        link.remove("clientId");
    }
    let env = env_of(replicator_container(&rendered(&helm, &plain)?)?)?;
    ensure!(
        var(&env, "CLIENT_ID").is_none(),
        "CLIENT_ID {:?}",
        var(&env, "CLIENT_ID")
    );

    // The proxy serving TLS (nodePorts): every node is reached at
    // ADVERTISED_HOST, the name its certificate is checked against.
    let mut tls = with_replicator(minimal.clone());
    tls["tls"] = json!({"client": {"secretName": "proxy-tls"}});
    tls["replicator"]["tls"] = json!({"destination": {"secretName": "proxy-ca"}});
    let env = env_of(replicator_container(&rendered(&helm, &tls)?)?)?;
    ensure!(
        var(&env, "DESTINATION_TLS_SERVER_NAME") == Some(json!("kafka-proxy.example.com"))
            && var(&env, "DESTINATION_TLS_CA")
                == Some(json!("/etc/kafka-mirror-proxy/tls/destination/ca.crt")),
        "{env:?}"
    );
    // SNI routing: the bootstrap name, at the advertised port.
    let mut sni = tls.clone();
    sni["routing"] = json!({"mode": "sni", "bootstrapPort": 19092, "sni": {
        "hostPattern": "broker-$(nodeId).kafka.example.com",
        "bootstrapHost": "bootstrap.kafka.example.com",
        "advertisedPort": 443,
    }});
    if let Some(config) = sni["config"].as_object_mut() {
        config.remove("ADVERTISED_HOST");
    }
    let env = env_of(replicator_container(&rendered(&helm, &sni)?)?)?;
    ensure!(
        var(&env, "DESTINATION_BOOTSTRAP_SERVERS")
            == Some(json!("bootstrap.kafka.example.com:443"))
            && var(&env, "DESTINATION_TLS_SERVER_NAME").is_none(),
        "{env:?}"
    );

    // Refused, each naming what to set.
    let case = |f: &dyn Fn(&mut Value)| {
        let mut v = with_replicator(minimal.clone());
        f(&mut v);
        v
    };
    for (what, values, needle) in [
        (
            "no source",
            case(&|v| v["replicator"]["sourceBootstrapServers"] = json!("")),
            "replicator.sourceBootstrapServers",
        ),
        (
            "no link",
            case(&|v| v["replicator"]["link"] = json!("")),
            "replicator.link",
        ),
        (
            "a link the proxy lacks",
            case(&|v| v["replicator"]["link"] = json!("west")),
            "replicator.destinationBootstrapServers",
        ),
        (
            "another client id",
            case(&|v| v["replicator"]["clientId"] = json!("mirror-east")),
            "replicator.clientId",
        ),
        (
            "a TLS proxy without the CA",
            case(&|v| v["tls"] = json!({"client": {"secretName": "proxy-tls"}})),
            "replicator.tls.destination.secretName",
        ),
        (
            "a tlsSubject without a certificate",
            case(&|v| v["links"][0]["tlsSubject"] = json!("CN=replicator")),
            "certKey",
        ),
        (
            "TOPICS in config",
            case(&|v| v["replicator"]["config"] = json!({"TOPICS": "x"})),
            "replicator.topics",
        ),
        (
            "UNTIL_CAUGHT_UP in config",
            case(&|v| v["replicator"]["config"] = json!({"UNTIL_CAUGHT_UP": "true"})),
            "runs until stopped",
        ),
        (
            "a password in config",
            case(&|v| v["replicator"]["config"] = json!({"SOURCE_SASL_PASSWORD": "x"})),
            "replicator.secretEnv",
        ),
        (
            "a prefixed key",
            case(&|v| v["replicator"]["config"] = json!({"MIRROR_REPLICATOR_LINK": "x"})),
            "without the MIRROR_REPLICATOR_ prefix",
        ),
    ] {
        match render(&helm, &values)? {
            Ok(_) => bail!("{what} was accepted"),
            Err(e) => ensure!(
                e.contains(needle),
                "{what}: refused without naming {needle}: {e}"
            ),
        }
    }
    // A link of another proxy is fine with that proxy named.
    let mut other = with_replicator(minimal);
    other["replicator"]["link"] = json!("west");
    other["replicator"]["topics"] = json!(["t"]);
    other["replicator"]["destinationBootstrapServers"] = json!("other-proxy:9092");
    let env = env_of(replicator_container(&rendered(&helm, &other)?)?)?;
    ensure!(
        var(&env, "DESTINATION_BOOTSTRAP_SERVERS") == Some(json!("other-proxy:9092")),
        "{env:?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// Dashboard and alerts.

/// The series selectors in a PromQL expression: each `kafka_mirror_proxy_*`
/// and `kafka_mirror_replicator_*` name with its `label="value"` matchers
/// (other matchers, `=~` on dashboard variables, select nothing fixed).
fn selectors(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let name_re = regex::Regex::new(r"[a-zA-Z_:][a-zA-Z0-9_:]*").expect("regex");
    let eq_re = regex::Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"([^"]*)""#).expect("regex");
    let mut out = Vec::new();
    for m in name_re.find_iter(expr) {
        let name = m.as_str();
        // Inside a string (a legend or a label value) is not a name.
        let before = &expr[..m.start()];
        if before.matches('"').count() % 2 == 1
            || !(name.contains("mirror_proxy") || name.contains("mirror_replicator"))
        {
            continue;
        }
        let mut labels = Vec::new();
        if let Some(rest) = expr[m.end()..].strip_prefix('{') {
            let inner = rest.split('}').next().unwrap_or_default();
            for c in eq_re.captures_iter(inner) {
                // `=~` and `!=` are not equality matchers.
                let whole = c.get(0).map(|m| m.as_str()).unwrap_or_default();
                if whole.contains("=~") || inner[..c.get(0).map_or(0, |m| m.start())].ends_with('!')
                {
                    continue;
                }
                labels.push((c[1].to_string(), c[2].to_string()));
            }
        }
        out.push((name.to_string(), labels));
    }
    out
}

/// Every `expr`/`query` string of the dashboard, and the rules' `expr`s.
fn monitoring_expressions() -> Result<Vec<(String, String)>> {
    let mut exprs = Vec::new();
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(
        repo().join("deploy/grafana/kafka-mirror-proxy.json"),
    )?)?;
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let here = format!("{at}/{k}");
                    match (k.as_str(), v) {
                        ("expr" | "query" | "definition", Value::String(s)) => {
                            out.push((here, s.clone()))
                        }
                        _ => walk(v, &here, out),
                    }
                }
            }
            Value::Array(a) => {
                for (i, v) in a.iter().enumerate() {
                    walk(v, &format!("{at}/{i}"), out);
                }
            }
            _ => {}
        }
    }
    walk(&dashboard, "dashboard", &mut exprs);
    // The datasource variable's `query` is a plugin type, not PromQL.
    exprs.retain(|(_, e)| e != "prometheus");
    let proxy_rules = rule_expressions(PROXY_RULES)?;
    ensure!(
        proxy_rules.len() >= 5,
        "only {} alerting rules read",
        proxy_rules.len()
    );
    exprs.extend(proxy_rules);
    Ok(exprs)
}

/// The rule groups of the rules file: the proxy's, whose series a running
/// proxy serves, and the replicator's, whose series a running replicator
/// serves.
const PROXY_RULES: &str = "kafka-mirror-proxy";
const REPLICATOR_RULES: &str = "kafka-mirror-replicator";

/// The `expr` of every alerting rule of the rules file's group `group`
/// ("rule <alert>", expr); fails on a group of another name, so that no
/// rule escapes both checks.
fn rule_expressions(group_name: &str) -> Result<Vec<(String, String)>> {
    let rules_file = repo().join("deploy/prometheus/kafka-mirror-proxy-rules.yaml");
    let rules = yaml_documents(&std::fs::read_to_string(&rules_file)?)?;
    let mut exprs = Vec::new();
    for group in rules[0]["groups"].as_array().context("no rule groups")? {
        let name = text_of(&group["name"]);
        ensure!(
            name == PROXY_RULES || name == REPLICATOR_RULES,
            "rule group {name}: tests/deploy.rs checks only {PROXY_RULES} and {REPLICATOR_RULES}"
        );
        if name != group_name {
            continue;
        }
        for rule in group["rules"].as_array().context("no rules")? {
            let name = text_of(&rule["alert"]);
            let expr = rule["expr"].as_str().context("rule without expr")?;
            exprs.push((format!("rule {name}"), expr.to_string()));
        }
    }
    Ok(exprs)
}

/// Every series the dashboard and the alerting rules use exists in the
/// `/metrics` of a proxy with a link, after the events that create the
/// labelled ones (families without a sample are not rendered): a produce
/// and consume through it (local and as the link's replicator), a link
/// retry answered as a duplicate, a link batch to a topic the link does
/// not mirror, a local write to a mirrored topic, a connection over
/// `MAX_CONNECTIONS`, a failover with a link connection open, and the
/// broker stopped.
#[test]
fn every_series_the_dashboard_and_alerts_use_exists() -> Result<()> {
    let exprs = monitoring_expressions()?;
    let mut broker = KafkaCluster::start(KafkaOptions::default())?;
    let source: kafka_mirror_proxy::mirror::pid::ClusterId = "MkU3OEVBNTcwNTJENDM2Qk".parse()?;
    let proxy = ProxyProcess::with_link_x(
        &broker.bootstrap(),
        &source,
        "mirrored",
        &[("MAX_CONNECTIONS", "16")],
    )?;
    proxy_wait_ready(&proxy)?;
    tools::create_topic(&broker.bootstrap(), "mirrored", 1, &[], &[])?;
    tools::create_topic(&broker.bootstrap(), "local", 1, &[], &[])?;
    let lines: Vec<String> = (0..5).map(|i| format!("record {i}")).collect();
    tools::console_produce(&proxy.bootstrap, "local", &lines, &[])?;
    tools::console_produce(
        &proxy.bootstrap,
        "mirrored",
        &lines,
        &[
            ("client.id", "mirror-x"),
            ("enable.idempotence", "true"),
            ("acks", "all"),
        ],
    )?;
    let got = tools::console_consume(
        &proxy.bootstrap,
        "mirrored",
        5,
        &[],
        Duration::from_secs(60),
    )?;
    ensure!(got == lines, "consumed {got:?}");

    let mut link = RawClient::connect(&proxy.bootstrap)?;
    let batch = || record_batch_at(4711, 0, &["a", "b"]);
    for attempt in ["first", "retry"] {
        let (code, msg) = partition_result(&link.produce("mirror-x", "mirrored", 0, batch())?);
        ensure!(code == 0, "{attempt} link batch: {code} {msg:?}");
    }
    let (code, _) = partition_result(&link.produce("mirror-x", "local", 0, batch())?);
    ensure!(
        code != 0,
        "a link batch to a topic it does not mirror was accepted"
    );
    let mut app = RawClient::connect(&proxy.bootstrap)?;
    let (code, _) =
        partition_result(&app.produce("app", "mirrored", 0, record_batch_at(-1, 0, &["x"]))?);
    ensure!(code != 0, "a local write to a mirrored topic was accepted");
    drop(app);
    // Over MAX_CONNECTIONS (16, with the link connection open): the rest
    // are accepted and closed at once.
    let crowd: Vec<TcpStream> = (0..20)
        .filter_map(|_| TcpStream::connect(&proxy.bootstrap).ok())
        .collect();
    let refused = "kafka_mirror_proxy_connections_refused_total{listener=\"bootstrap\",reason=\"max_connections\"}";
    wait_for(&proxy, "a connection over MAX_CONNECTIONS refused", || {
        Ok(proxy.metric(refused)? > 0)
    })?;
    drop(crowd);
    // A failover while the link's connection is open.
    let (status, body) = proxy.admin_post("/links/x/failover?wait=60", "")?;
    ensure!(status.contains("200"), "failover: {status} {body}");
    let _ = link.produce("mirror-x", "mirrored", 0, record_batch_at(4711, 2, &["c"]));
    // The broker gone: the next client of its node port finds it
    // unreachable.
    broker.stop()?;
    let node = proxy.node_address(1);
    wait_for(&proxy, "the broker marked unreachable", || {
        if let Ok(mut c) = RawClient::connect(&node) {
            let _ = c.send(
                ApiKey::ApiVersions,
                0,
                "probe",
                &kafka_protocol::messages::ApiVersionsRequest::default(),
            );
            let _ = c.recv_frame();
        }
        Ok(proxy.metric("kafka_mirror_proxy_broker_unreachable{listener=\"node-1\"}")? == 1)
    })?;

    let (status, metrics) = proxy.admin_get("/metrics")?;
    ensure!(status.contains("200"), "{status}");
    let samples: Vec<(String, BTreeMap<String, String>)> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(parse_sample)
        .collect();

    let mut checked = BTreeSet::new();
    let mut missing = Vec::new();
    for (at, expr) in &exprs {
        let used = selectors(expr);
        ensure!(
            !used.is_empty(),
            "{at}: no kafka_mirror_proxy series in {expr:?}"
        );
        for (name, labels) in used {
            ensure!(
                name.starts_with("kafka_mirror_proxy_"),
                "{at}: {name} is not a kafka_mirror_proxy series"
            );
            let sampled = samples
                .iter()
                .any(|(n, l)| *n == name && labels.iter().all(|(k, v)| l.get(k) == Some(v)));
            if !sampled {
                missing.push(format!("{at}: {name}{labels:?}"));
            }
            checked.insert(name);
        }
    }
    ensure!(
        missing.is_empty(),
        "series used but not in /metrics:\n{}\n/metrics:\n{metrics}",
        missing.join("\n")
    );
    println!(
        "{} expressions, {} distinct series, all in /metrics",
        exprs.len(),
        checked.len()
    );
    Ok(())
}

/// Series that count events: absent until their first event, `rate()` and
/// `increase()` would never see that event, so each must be there at zero
/// from the start, for every link and listener its family is labelled by.
const EVENT_SERIES: [&str; 8] = [
    "kafka_mirror_proxy_broker_unreachable",
    "kafka_mirror_proxy_connections_refused_total",
    "kafka_mirror_proxy_failovers_completed_total",
    "kafka_mirror_proxy_failovers_total",
    "kafka_mirror_proxy_link_connections_fenced_total",
    "kafka_mirror_proxy_local_writes_refused_total",
    "kafka_mirror_proxy_mirror_duplicates_answered_total",
    "kafka_mirror_proxy_mirror_partitions_refused_total",
];

/// Before any event, with only a Metadata request through the proxy (so
/// it knows broker node 1): every series the dashboard and the alerting
/// rules use is in `/metrics`, and each event series is there at zero for
/// link `x` and for both listeners (bootstrap, node-1).
#[test]
fn every_series_the_dashboard_and_alerts_use_is_there_at_zero_from_the_start() -> Result<()> {
    let exprs = monitoring_expressions()?;
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let source: kafka_mirror_proxy::mirror::pid::ClusterId = "MkU3OEVBNTcwNTJENDM2Qk".parse()?;
    let proxy = ProxyProcess::with_link_x(&broker.bootstrap(), &source, "mirrored", &[])?;
    proxy_wait_ready(&proxy)?;
    // A link's state is shown once it is known: read from the state topic,
    // shortly after the proxy is ready.
    wait_for(&proxy, "the link's state shown", || {
        let (_, metrics) = proxy.admin_get("/metrics")?;
        Ok(metrics.contains("kafka_mirror_proxy_link_state{link=\"x\"} "))
    })?;
    let mut client = RawClient::connect(&proxy.bootstrap)?;
    client.send(
        ApiKey::Metadata,
        12,
        "probe",
        &kafka_protocol::messages::MetadataRequest::default(),
    )?;
    ensure!(client.recv_frame()?.is_some(), "no Metadata answer");
    drop(client);

    let (status, metrics) = proxy.admin_get("/metrics")?;
    ensure!(status.contains("200"), "{status}");
    let samples: Vec<(String, BTreeMap<String, String>, String)> = metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (name, labels) = parse_sample(l)?;
            let value = l.rsplit(' ').next()?.to_string();
            Some((name, labels, value))
        })
        .collect();
    let mut missing = Vec::new();
    for (at, expr) in &exprs {
        for (name, labels) in selectors(expr) {
            let sampled = samples
                .iter()
                .any(|(n, l, _)| *n == name && labels.iter().all(|(k, v)| l.get(k) == Some(v)));
            if !sampled {
                missing.push(format!("{at}: {name}{labels:?}"));
            }
        }
    }
    for name in EVENT_SERIES {
        let family: Vec<_> = samples.iter().filter(|(n, ..)| *n == name).collect();
        let label = family.iter().find_map(|(_, l, _)| {
            ["link", "listener"]
                .into_iter()
                .find(|k| l.contains_key(*k))
        });
        let wanted: &[&str] = match label {
            Some("link") => &["x"],
            Some(_) => &["bootstrap", "node-1"],
            None => &[],
        };
        if family.is_empty() {
            missing.push(format!("{name}: no sample at all"));
        }
        for want in wanted {
            let key = label.unwrap_or_default();
            if !family
                .iter()
                .any(|(_, l, v)| l.get(key).map(String::as_str) == Some(*want) && v == "0")
            {
                missing.push(format!("{name}{{{key}=\"{want}\"}} not at 0"));
            }
        }
        for (_, l, v) in &family {
            if v != "0" {
                missing.push(format!("{name}{l:?} is {v} before any event"));
            }
        }
    }
    ensure!(
        missing.is_empty(),
        "at start:\n{}\n/metrics:\n{metrics}",
        missing.join("\n")
    );
    Ok(())
}

/// `name{a="b",...} value` -> (name, labels).
fn parse_sample(line: &str) -> Option<(String, BTreeMap<String, String>)> {
    let end = line.find(['{', ' '])?;
    let name = line[..end].to_string();
    let mut labels = BTreeMap::new();
    if line[end..].starts_with('{') {
        let inner = &line[end + 1..line.rfind('}')?];
        let re = regex::Regex::new(r#"([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)""#).ok()?;
        for c in re.captures_iter(inner) {
            labels.insert(c[1].to_string(), c[2].to_string());
        }
    }
    Some((name, labels))
}

#[test]
fn selectors_are_read_from_promql() {
    assert_eq!(
        selectors(
            r#"sum by (result) (increase(kafka_mirror_proxy_failover_barriers_total{result="failed", job=~"$job"}[5m])) > 0 or kafka_mirror_proxy_link_state{link!="a"}"#
        ),
        vec![
            (
                "kafka_mirror_proxy_failover_barriers_total".to_string(),
                vec![("result".to_string(), "failed".to_string())]
            ),
            ("kafka_mirror_proxy_link_state".to_string(), vec![]),
        ]
    );
}

/// The replicator's metrics and their labels, from its contract (issue
/// 42): every one labelled `link`. Written out for the same reason as
/// `replicator_flags`; once the subcommand runs in these tests, check the
/// rules against its `/metrics` as the proxy's are.
const REPLICATOR_METRICS: &[(&str, &[&str])] = &[
    (
        "kafka_mirror_replicator_records_copied_total",
        &["link", "topic"],
    ),
    (
        "kafka_mirror_replicator_bytes_copied_total",
        &["link", "topic"],
    ),
    (
        "kafka_mirror_replicator_batches_copied_total",
        &["link", "topic"],
    ),
    (
        "kafka_mirror_replicator_duplicates_answered_total",
        &["link"],
    ),
    (
        "kafka_mirror_replicator_partition_lag_records",
        &["link", "topic", "partition"],
    ),
    (
        "kafka_mirror_replicator_partition_lag_seconds",
        &["link", "topic", "partition"],
    ),
    ("kafka_mirror_replicator_topics_created_total", &["link"]),
    ("kafka_mirror_replicator_errors_total", &["link", "kind"]),
    ("kafka_mirror_replicator_fenced", &["link"]),
];

/// The replicator's alerting rules use only its series, by the contract's
/// names, with matchers and `by (...)` groupings on labels those series
/// have (or the scrape's `job` and `instance`); the proxy's rules use none
/// of them (they are checked against a running proxy's `/metrics`).
#[test]
fn the_replicator_alerts_use_its_series() -> Result<()> {
    let rules = rule_expressions(REPLICATOR_RULES)?;
    let names: BTreeSet<&str> = rules.iter().map(|(at, _)| at.as_str()).collect();
    for alert in ["Fenced", "LagGrowing", "Errors"] {
        let at = format!("rule KafkaMirrorReplicator{alert}");
        ensure!(names.contains(at.as_str()), "{at} missing: {names:?}");
    }
    let by_re = regex::Regex::new(r"\bby\s*\(([^)]*)\)").expect("regex");
    for (at, expr) in &rules {
        let used = selectors(expr);
        ensure!(!used.is_empty(), "{at}: no replicator series in {expr:?}");
        let mut labels: BTreeSet<&str> = BTreeSet::from(["job", "instance"]);
        for (name, matchers) in &used {
            let known = REPLICATOR_METRICS
                .iter()
                .find(|(n, _)| n == name)
                .with_context(|| format!("{at}: {name} is not a replicator metric"))?;
            labels.extend(known.1.iter().copied());
            for (label, _) in matchers {
                ensure!(
                    known.1.contains(&label.as_str()),
                    "{at}: {name} has no label {label}"
                );
            }
        }
        for grouping in by_re.captures_iter(expr) {
            for label in grouping[1].split(',').map(str::trim) {
                ensure!(
                    labels.contains(label),
                    "{at}: by ({label}), which its series lack"
                );
            }
        }
    }
    for (at, expr) in rule_expressions(PROXY_RULES)? {
        ensure!(
            !expr.contains("kafka_mirror_replicator_"),
            "{at}: a replicator series in the proxy's rules"
        );
    }
    Ok(())
}

/// Wait up to 60 s for `what`.
fn wait_for(
    proxy: &ProxyProcess,
    what: &str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done()? {
        ensure!(
            Instant::now() < deadline,
            "not within 60 s: {what}\n{}",
            tools::tail_str(&proxy.logs(), 40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

/// Wait until `/readyz` answers 200 (the state topic loaded).
fn proxy_wait_ready(proxy: &ProxyProcess) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (status, body) = proxy.admin_get("/readyz")?;
        if status.contains("200") {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "not ready within 60 s: {status} {body}\n{}",
            proxy.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

// ---------------------------------------------------------------------------
// Readiness while draining.

/// A Fetch from the start of partition 0 that the broker holds for
/// `wait_ms` (it asks for more bytes than the partition has).
fn long_fetch(topic: &str, wait_ms: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(wait_ms)
        .with_min_bytes(50_000_000)
        .with_max_bytes(52_428_800)
        .with_session_epoch(-1)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_current_leader_epoch(-1)
                .with_log_start_offset(-1)
                .with_partition_max_bytes(1_048_576)])])
}

/// After SIGTERM, while a Fetch the broker holds keeps the drain going,
/// `/readyz` answers 503 (so a load balancer stops sending connections);
/// `/healthz` still answers 200 and the held Fetch is still answered.
#[test]
fn readyz_answers_503_while_the_proxy_drains() -> Result<()> {
    let broker = KafkaCluster::start(KafkaOptions::default())?;
    let mut proxy = ProxyProcess::start(&broker.bootstrap(), &[("SHUTDOWN_TIMEOUT_MS", "60000")])?;
    tools::create_topic(&broker.bootstrap(), "drain", 1, &[], &[])?;
    let (status, body) = proxy.admin_get("/readyz")?;
    ensure!(status.contains("200"), "before the signal: {status} {body}");

    let fetches = || proxy.metric("kafka_mirror_proxy_requests_total{api_key=\"1\"}");
    let before = fetches()?;
    let mut held = RawClient::connect(&proxy.bootstrap)?;
    held.send(
        ApiKey::Fetch,
        12,
        "drain-test",
        &long_fetch("drain", 15_000),
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fetches()? == before {
        ensure!(Instant::now() < deadline, "the proxy never read the Fetch");
        std::thread::sleep(Duration::from_millis(20));
    }

    proxy.signal("TERM")?;
    proxy.wait_for_log("shutting down", Duration::from_secs(10))?;
    // The log line comes just before the drain begins: ask until the
    // answer changes (the drain lasts until the Fetch is answered, 15 s).
    let deadline = Instant::now() + Duration::from_secs(10);
    let (status, body) = loop {
        let (status, body) = proxy.admin_get("/readyz")?;
        if !status.contains("200") || Instant::now() > deadline {
            break (status, body);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    ensure!(
        status.starts_with("HTTP/1.1 503"),
        "/readyz while draining: {status} {body}"
    );
    ensure!(body.contains("shutting down"), "{body}");
    // Still draining: the process runs and the Fetch is not answered yet.
    ensure!(
        proxy.wait_exit(Duration::ZERO)?.is_none(),
        "the proxy exited before the held Fetch was answered"
    );
    let (status, _) = proxy.admin_get("/healthz")?;
    ensure!(status.contains("200"), "/healthz while draining: {status}");
    println!(
        "while draining: /readyz {status_503}",
        status_503 = body.trim()
    );

    // The drain ends with the held Fetch answered, then the process exits 0.
    let answer = held.recv_frame()?;
    ensure!(answer.is_some(), "the held Fetch was not answered");
    let status = proxy
        .wait_exit(Duration::from_secs(30))?
        .context("the proxy did not exit after the drain")?;
    ensure!(status.success(), "exit status {status}:\n{}", proxy.logs());
    Ok(())
}
