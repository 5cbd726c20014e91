//! The machinery behind the configuration tables: one entry per variable
//! (name, default, parser, meaning) written once, the environment entries
//! are read from, and the parsers the proxy's and the replicator's tables
//! share. Parsing, the documented tables and the defaults in code all come
//! from the entries, so none of them can drift from another.

use std::borrow::Cow;
use std::collections::HashMap;
use std::error::Error;
use std::net::SocketAddr;
use std::num::ParseIntError;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use regex::Regex;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{ConfigError, ConfigProblem, LogFormat, UpstreamTls};
use crate::wire::sasl::{Credentials, Mechanism};

/// What a variable is when it is not set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unset {
    /// This value, read by the variable's own parser (documented in
    /// backticks, as a value one could write).
    Value(&'static str),
    /// No value, or one worked out from other settings; said in words.
    Described(&'static str),
    /// A value made from other settings by replacing each `<placeholder>`
    /// (documented in backticks, as the value's shape).
    Template(&'static str),
}

impl Unset {
    /// As the documented table shows it, without the backticks.
    pub(crate) const fn text(&self) -> &'static str {
        match self {
            Unset::Value(text) | Unset::Described(text) | Unset::Template(text) => text,
        }
    }

    /// The text with each (placeholder, value) of `fill` replaced.
    pub(crate) fn fill(&self, fill: &[(&str, &str)]) -> String {
        fill.iter()
            .fold(self.text().to_string(), |text, (placeholder, value)| {
                text.replace(placeholder, value)
            })
    }
}

/// One variable of a table.
pub(crate) struct Var<T> {
    /// Without the program's prefix; a per-link variable holds `<NAME>`.
    pub name: &'static str,
    pub default: Unset,
    /// The value from its text (trimmed, not empty).
    pub parse: fn(&str) -> Result<T, Invalid>,
    /// One line for the README's short table (empty: no short table).
    // Read by the README check only.
    #[cfg_attr(not(test), allow(dead_code))]
    pub summary: &'static str,
    pub meaning: &'static str,
}

/// A table entry as documented: the typed parser left out.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Row {
    pub name: &'static str,
    pub default: Unset,
    pub summary: &'static str,
    pub meaning: &'static str,
    /// Whether the default parses with the variable's parser (for a
    /// [`Unset::Value`]; a described default has nothing to parse).
    pub default_parses: bool,
}

impl<T> Var<T> {
    #[cfg(test)]
    pub(crate) fn row(&self) -> Row {
        Row {
            name: self.name,
            default: self.default,
            summary: self.summary,
            meaning: self.meaning,
            default_parses: match self.default {
                Unset::Value(text) => (self.parse)(text).is_ok(),
                Unset::Described(_) | Unset::Template(_) => true,
            },
        }
    }
}

/// Declares a program's table: each entry becomes a typed constant
/// ([`Var`]) named after its variable, and `$table` lists every entry as
/// (name, default, meaning) in order (the flags and the deployment tests
/// read that list). Under `cfg(test)`, `$rows` lists them as [`Row`]s for
/// the documentation checks.
///
/// An entry whose name is no identifier (`LINK_<NAME>_TOPICS`) gives it
/// after `=`.
macro_rules! variables {
    (
        $(#[$table_doc:meta])*
        pub const $table:ident;
        rows: $rows:ident;
        $(
            $(#[$doc:meta])*
            $var:ident $(= $name:literal)? : $ty:ty {
                default: $default:expr,
                parse: $parse:expr,
                $(summary: $summary:literal,)?
                meaning: $meaning:expr $(,)?
            }
        )*
    ) => {
        $(
            $(#[$doc])*
            pub(crate) const $var: $crate::config::table::Var<$ty> = $crate::config::table::Var {
                name: $crate::config::table::variables!(@name $var $($name)?),
                default: $default,
                parse: $parse,
                summary: $crate::config::table::variables!(@summary $($summary)?),
                meaning: $meaning,
            };
        )*
        $(#[$table_doc])*
        pub const $table: &[(&str, &str, &str)] = &[
            $(($var.name, $var.default.text(), $var.meaning),)*
        ];
        #[cfg(test)]
        pub(crate) fn $rows() -> Vec<$crate::config::table::Row> {
            vec![$($var.row(),)*]
        }
    };
    (@name $var:ident) => { stringify!($var) };
    (@name $var:ident $name:literal) => { $name };
    (@summary) => { "" };
    (@summary $summary:literal) => { $summary };
}
pub(crate) use variables;

/// Why a variable's text was refused: what it should hold, and the error
/// that refused it when there was one.
#[derive(Debug, Clone)]
pub(crate) struct Invalid {
    expected: Cow<'static, str>,
    source: Option<Arc<dyn Error + Send + Sync>>,
    /// The value is a secret: the problem does not echo it.
    secret: bool,
}

impl Invalid {
    pub(crate) fn expected(expected: impl Into<Cow<'static, str>>) -> Invalid {
        Invalid {
            expected: expected.into(),
            source: None,
            secret: false,
        }
    }

    pub(crate) fn because(mut self, source: impl Error + Send + Sync + 'static) -> Invalid {
        self.source = Some(Arc::new(source));
        self
    }

    pub(crate) fn secret(mut self) -> Invalid {
        self.secret = true;
        self
    }
}

/// The variables of one program (the proxy's `MIRROR_PROXY_*`, the
/// replicator's `MIRROR_REPLICATOR_*`) and the problems found in them.
pub(crate) struct Env<'a> {
    pub(crate) prefix: &'static str,
    vars: &'a HashMap<String, String>,
    pub(crate) problems: Vec<ConfigProblem>,
    /// Every name looked up, so a test can hold the table to what is read.
    #[cfg(test)]
    pub(crate) read: std::cell::RefCell<std::collections::BTreeSet<String>>,
}

impl<'a> Env<'a> {
    pub(crate) fn new(prefix: &'static str, vars: &'a HashMap<String, String>) -> Env<'a> {
        Env {
            prefix,
            vars,
            problems: Vec::new(),
            #[cfg(test)]
            read: Default::default(),
        }
    }

    /// The variable's text as given: not trimmed (a password's spaces are
    /// its own), `None` when unset or empty.
    pub(crate) fn untrimmed(&self, name: &str) -> Option<&'a String> {
        #[cfg(test)]
        self.read.borrow_mut().insert(name.to_string());
        self.vars
            .get(&format!("{}{name}", self.prefix))
            .filter(|v| !v.is_empty())
    }

    /// The variable's text, trimmed; `None` when unset or blank.
    pub(crate) fn raw(&self, name: &str) -> Option<String> {
        self.untrimmed(name)
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    pub(crate) fn problem(
        &mut self,
        name: &str,
        value: Option<String>,
        expected: impl Into<String>,
    ) {
        self.problems.push(ConfigProblem {
            variable: format!("{}{name}", self.prefix),
            value,
            expected: expected.into(),
            source: None,
        });
    }

    fn invalid(&mut self, name: &str, value: String, invalid: Invalid) {
        self.problems.push(ConfigProblem {
            variable: format!("{}{name}", self.prefix),
            value: (!invalid.secret).then_some(value),
            expected: invalid.expected.into_owned(),
            source: invalid.source,
        });
    }

    /// The variable's value: parsed when set, else its default's (`None`
    /// for a described default). A bad value is a problem and yields the
    /// default, so the checks across variables still have one to go on.
    pub(crate) fn get<T>(&mut self, var: &Var<T>) -> Option<T> {
        self.get_named(var.name, var)
    }

    /// [`Env::get`] under another name: a per-link variable's, with the
    /// link's name in place of `<NAME>`.
    pub(crate) fn get_named<T>(&mut self, name: &str, var: &Var<T>) -> Option<T> {
        if let Some(value) = self.set(name, var) {
            return Some(value);
        }
        match var.default {
            Unset::Value(text) => match (var.parse)(text) {
                Ok(value) => Some(value),
                // A table entry whose default its parser refuses (a unit
                // test holds every entry to it) stops the program here
                // rather than running on a value nobody wrote.
                Err(invalid) => {
                    self.invalid(name, text.to_string(), invalid);
                    None
                }
            },
            Unset::Described(_) | Unset::Template(_) => None,
        }
    }

    /// A text variable whose default is a [`Unset::Template`]: its value,
    /// else the template filled in.
    pub(crate) fn get_filled(
        &mut self,
        name: &str,
        var: &Var<String>,
        fill: &[(&str, &str)],
    ) -> String {
        self.set(name, var)
            .unwrap_or_else(|| var.default.fill(fill))
    }

    /// Only a value that is set and parses.
    pub(crate) fn set<T>(&mut self, name: &str, var: &Var<T>) -> Option<T> {
        let raw = self.raw(name)?;
        match (var.parse)(&raw) {
            Ok(value) => Some(value),
            Err(invalid) => {
                self.invalid(name, raw, invalid);
                None
            }
        }
    }

    /// A variable that must be set: unset is a problem saying what it
    /// should hold.
    pub(crate) fn required<T>(&mut self, name: &str, var: &Var<T>, missing: &str) -> Option<T> {
        if self.raw(name).is_none() {
            self.problem(name, None, missing);
            return None;
        }
        self.set(name, var)
    }
}

/// What `read` makes of `vars`, or every problem it found there: a value
/// only when there is no problem at all.
pub(crate) fn read_all<T>(
    prefix: &'static str,
    vars: &HashMap<String, String>,
    read: fn(&mut Env<'_>) -> Option<T>,
) -> Result<T, ConfigError> {
    let mut env = Env::new(prefix, vars);
    match read(&mut env) {
        Some(value) if env.problems.is_empty() => Ok(value),
        _ => Err(ConfigError(env.problems)),
    }
}

/// A program's two entry points, `from_env` and `from_vars`, inside its
/// settings' `impl`: both read `$prefix`'s variables with the type's
/// `fn read(&mut Env<'_>) -> Option<Self>` through [`read_all`].
macro_rules! from_env_and_vars {
    ($prefix:expr) => {
        /// Read the process environment.
        pub fn from_env() -> Result<Self, $crate::config::ConfigError> {
            Self::from_vars(&$crate::config::table::process_vars($prefix)?)
        }

        /// Validate a map of variables (full names, with the prefix): each
        /// variable of [`VARIABLES`] read by its entry, then the checks across
        /// variables.
        pub fn from_vars(
            vars: &std::collections::HashMap<String, String>,
        ) -> Result<Self, $crate::config::ConfigError> {
            $crate::config::table::read_all($prefix, vars, Self::read)
        }
    };
}
pub(crate) use from_env_and_vars;

/// A per-link variable's name for one link: `<NAME>` is the link's name,
/// upper-cased, with `-` as `_`.
pub(crate) fn link_var(var_name: &str, link: &str) -> String {
    var_name.replace("<NAME>", &crate::mirror::link::link_env_name(link))
}

/// `pairs` as variables: each short name with `prefix` before it.
pub(crate) fn prefixed(prefix: &str, pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v.to_string()))
        .collect()
}

/// The process environment's variables named with `prefix`. Any other
/// variable is left alone, whatever its bytes (`std::env::vars` would
/// panic on one that is not Unicode); one of ours that is not Unicode is a
/// problem to report, not a setting to drop silently.
pub(crate) fn process_vars(prefix: &str) -> Result<HashMap<String, String>, ConfigError> {
    let mut vars = HashMap::new();
    let mut problems = Vec::new();
    for (name, value) in std::env::vars_os() {
        if !name.as_encoded_bytes().starts_with(prefix.as_bytes()) {
            continue;
        }
        match (name.into_string(), value.into_string()) {
            (Ok(name), Ok(value)) => {
                vars.insert(name, value);
            }
            (name, _) => problems.push(ConfigProblem {
                variable: name.unwrap_or_else(|n| n.to_string_lossy().into_owned()),
                value: None,
                expected: "a name and value in Unicode (UTF-8)".to_string(),
                source: None,
            }),
        }
    }
    match problems.is_empty() {
        true => Ok(vars),
        false => Err(ConfigError(problems)),
    }
}

/// A whole number `ok` accepts.
pub(crate) fn whole<T>(
    s: &str,
    ok: impl Fn(&T) -> bool,
    expected: &'static str,
) -> Result<T, Invalid>
where
    T: FromStr<Err = ParseIntError>,
{
    match s.parse::<T>() {
        Ok(n) if ok(&n) => Ok(n),
        Ok(_) => Err(Invalid::expected(expected)),
        Err(e) => Err(Invalid::expected(expected).because(e)),
    }
}

/// Milliseconds, more than none.
pub(crate) fn millis(s: &str) -> Result<u64, Invalid> {
    whole(
        s,
        |n: &u64| *n > 0,
        "a whole number of milliseconds greater than 0",
    )
}

pub(crate) fn port(s: &str) -> Result<u16, Invalid> {
    whole(s, |p: &u16| *p > 0, "a port number (1-65535)")
}

pub(crate) fn boolean(s: &str) -> Result<bool, Invalid> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(Invalid::expected("`true` or `false`")),
    }
}

pub(crate) fn socket_addr(s: &str, expected: &'static str) -> Result<SocketAddr, Invalid> {
    s.parse()
        .map_err(|e| Invalid::expected(expected).because(e))
}

/// One of a few words.
pub(crate) fn one_of<T: Copy>(
    s: &str,
    words: &[(&str, T)],
    expected: &'static str,
) -> Result<T, Invalid> {
    words
        .iter()
        .find(|(word, _)| *word == s)
        .map(|(_, value)| *value)
        .ok_or_else(|| Invalid::expected(expected))
}

pub(crate) fn text(s: &str) -> Result<String, Invalid> {
    Ok(s.to_string())
}

/// A comma-separated `host:port` list.
pub(crate) fn host_ports(s: &str) -> Result<Vec<String>, Invalid> {
    let list: Vec<String> = s
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    if list.is_empty() || !list.iter().all(|s| valid_host_port(s)) {
        return Err(Invalid::expected(
            "comma-separated host:port list, e.g. broker1:9092,broker2:9092",
        ));
    }
    Ok(list)
}

fn valid_host_port(s: &str) -> bool {
    match s.rsplit_once(':') {
        Some((host, port)) => !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0),
        None => false,
    }
}

/// Comma-separated topic (or group) names or regular expressions, each
/// anchored at both ends (a link's topics, in the proxy and the replicator
/// alike).
pub(crate) fn patterns(s: &str) -> Result<Vec<Regex>, Invalid> {
    let mut patterns = Vec::new();
    // Every bad pattern is named; the first one's error is the cause.
    let mut bad: Vec<String> = Vec::new();
    let mut cause = None;
    for p in s.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        match Regex::new(&format!("^(?:{p})$")) {
            Ok(re) => patterns.push(re),
            Err(e) => {
                bad.push(format!("{p:?}"));
                cause.get_or_insert(e);
            }
        }
    }
    if let Some(cause) = cause {
        let expected = format!("valid regular expressions ({})", bad.join(", "));
        return Err(Invalid::expected(expected).because(cause));
    }
    if patterns.is_empty() {
        return Err(Invalid::expected(
            "at least one topic name or regular expression",
        ));
    }
    Ok(patterns)
}

/// The certificates of a PEM file (at least one).
pub(crate) fn pem_certs(path: &str) -> Result<Vec<CertificateDer<'static>>, Invalid> {
    let unreadable = |e| Invalid::expected("a readable PEM certificate file").because(e);
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(unreadable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)?;
    if certs.is_empty() {
        return Err(Invalid::expected(
            "a PEM file holding at least one CERTIFICATE",
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file.
pub(crate) fn pem_key(path: &str) -> Result<PrivateKeyDer<'static>, Invalid> {
    PrivateKeyDer::from_pem_file(PathBuf::from(path))
        .map_err(|e| Invalid::expected("a readable PEM private key file").because(e))
}

pub(crate) fn log_format(s: &str) -> Result<LogFormat, Invalid> {
    one_of(
        s,
        &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        "`text` or `json`",
    )
}

pub(crate) fn sasl_mechanism(s: &str) -> Result<Mechanism, Invalid> {
    s.parse::<Mechanism>()
        .map_err(|()| Invalid::expected("`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`"))
}

/// The variables of TLS to brokers (the proxy's `UPSTREAM_TLS*`, the
/// replicator's `SOURCE_TLS*` and `DESTINATION_TLS*`).
pub(crate) struct TlsVars {
    pub tls: &'static Var<bool>,
    pub ca: &'static Var<Vec<CertificateDer<'static>>>,
    pub cert: &'static Var<Vec<CertificateDer<'static>>>,
    pub key: &'static Var<PrivateKeyDer<'static>>,
    pub server_name: &'static Var<String>,
}

/// The variables of SASL to brokers.
pub(crate) struct SaslVars {
    pub mechanism: &'static Var<Mechanism>,
    pub username: &'static Var<String>,
    pub password: &'static Var<String>,
}

/// TLS to brokers, when its switch is on. The files are read whether or
/// not it is, so that a bad one is reported either way.
pub(crate) fn upstream_tls(env: &mut Env<'_>, vars: &TlsVars) -> Option<UpstreamTls> {
    let enabled = env.get(vars.tls).unwrap_or(false);
    let ca = env.get(vars.ca);
    let cert = env.get(vars.cert);
    let key = env.get(vars.key);
    let server_name = env.get(vars.server_name);
    if !enabled {
        return None;
    }
    if env.raw(vars.ca.name).is_none() {
        env.problem(
            vars.ca.name,
            None,
            format!(
                "a PEM CA bundle, because {}{} is true",
                env.prefix, vars.tls.name
            ),
        );
    }
    let cert_set = env.raw(vars.cert.name).is_some();
    if cert_set != env.raw(vars.key.name).is_some() {
        let missing = if cert_set {
            vars.key.name
        } else {
            vars.cert.name
        };
        env.problem(
            missing,
            None,
            "set together with its partner (client certificate and key)",
        );
    }
    let client_cert = match (cert, key) {
        (Some(c), Some(k)) => Some((c, Arc::new(k))),
        _ => None,
    };
    let files = [vars.ca.name, vars.cert.name, vars.key.name]
        .iter()
        .filter_map(|name| env.raw(name).map(PathBuf::from))
        .collect();
    Some(UpstreamTls {
        ca: ca?,
        client_cert,
        server_name,
        files,
    })
}

/// SASL credentials to brokers, when a mechanism is set.
pub(crate) fn upstream_sasl(env: &mut Env<'_>, vars: &SaslVars) -> Option<Credentials> {
    let mechanism = env.get(vars.mechanism);
    let mechanism_set = env.raw(vars.mechanism.name).is_some();
    let username = env.get(vars.username);
    // Untrimmed: spaces may belong to a password. Its value never goes
    // into a problem report.
    let password = env.untrimmed(vars.password.name).cloned();
    if !mechanism_set {
        if username.is_some() || password.is_some() {
            env.problem(
                vars.mechanism.name,
                None,
                format!(
                    "a SASL mechanism (`PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`), because {}{} or _PASSWORD is set",
                    env.prefix, vars.username.name
                ),
            );
        }
        return None;
    }
    if username.is_none() {
        env.problem(
            vars.username.name,
            None,
            format!(
                "the SASL user name, because {}{} is set",
                env.prefix, vars.mechanism.name
            ),
        );
    }
    if password.is_none() {
        env.problem(
            vars.password.name,
            None,
            format!(
                "the SASL password, because {}{} is set",
                env.prefix, vars.mechanism.name
            ),
        );
    }
    Some(Credentials {
        mechanism: mechanism?,
        username: username?,
        password: password?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_anchored_and_every_bad_one_is_named() {
        let topics = patterns("orders, audit\\..*").expect("valid");
        assert!(topics.iter().any(|re| re.is_match("audit.x")));
        assert!(!topics.iter().any(|re| re.is_match("xorders")));
        let bad = patterns("ok,(,[").expect_err("refused");
        assert_eq!(bad.expected, r#"valid regular expressions ("(", "[")"#);
        assert!(bad.source.is_some());
        assert_eq!(
            patterns(" , ").expect_err("refused").expected,
            "at least one topic name or regular expression"
        );
    }

    #[test]
    fn a_template_is_filled_and_a_value_is_its_own_text() {
        assert_eq!(
            Unset::Template("replicator.<client id>").fill(&[("<client id>", "mirror-east")]),
            "replicator.mirror-east"
        );
        assert_eq!(Unset::Value("drop").fill(&[("<name>", "x")]), "drop");
        assert_eq!(Unset::Described("(none)").text(), "(none)");
    }

    #[test]
    fn a_secret_is_never_echoed() {
        const KEY: Var<String> = Var {
            name: "KEY",
            default: Unset::Described("(none)"),
            parse: |_| Err(Invalid::expected("a longer key").secret()),
            summary: "",
            meaning: "",
        };
        let vars = HashMap::from([("P_KEY".to_string(), "hunter2".to_string())]);
        let mut env = Env::new("P_", &vars);
        assert!(env.get(&KEY).is_none());
        assert_eq!(env.problems.len(), 1);
        assert_eq!(env.problems[0].value, None);
        assert!(!env.problems[0].to_string().contains("hunter2"));
    }

    /// A variable that is not Unicode: outside the prefix it is passed
    /// over (`std::env::vars` would panic on it); inside, it is a problem
    /// that names the variable.
    #[test]
    fn process_vars_passes_over_what_is_not_ours_and_reports_what_is() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;

        let prefix = "KMP_TABLE_TEST_UNICODE_";
        std::env::set_var(format!("{prefix}GOOD"), "yes");
        std::env::set_var("KMP_TABLE_TEST_OTHER", OsStr::from_bytes(b"\xff"));
        let clean = process_vars(prefix);
        std::env::set_var(format!("{prefix}BAD"), OsStr::from_bytes(b"\xff"));
        let bad = process_vars(prefix);
        std::env::remove_var(format!("{prefix}GOOD"));
        std::env::remove_var(format!("{prefix}BAD"));
        std::env::remove_var("KMP_TABLE_TEST_OTHER");
        assert_eq!(
            clean.expect("only ours are read"),
            HashMap::from([(format!("{prefix}GOOD"), "yes".to_string())])
        );
        let problems = bad.expect_err("ours is not Unicode").0;
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].variable, format!("{prefix}BAD"));
        assert!(problems[0].to_string().contains("Unicode"));
    }
}

/// The documented tables, checked against a program's table row by row.
#[cfg(test)]
pub(crate) mod docs {
    use super::{Row, Unset};

    /// Which text of an entry a documented table shows.
    #[derive(Clone, Copy)]
    pub(crate) enum Column {
        /// The full meaning (docs/configuration.md, docs/replicator.md).
        Meaning,
        /// The one-line summary (the README).
        Summary,
    }

    /// The rows of the table under `| variable | default | meaning |` in
    /// `doc`, as written.
    pub(crate) fn documented(doc: &str) -> Vec<String> {
        doc.lines()
            .skip_while(|l| l.trim() != "| variable | default | meaning |")
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(str::to_string)
            .collect()
    }

    /// The rows as the table renders them: a value (or a value's shape) in
    /// backticks, a default said in words as it is.
    pub(crate) fn render(prefix: &str, rows: &[Row], column: Column) -> Vec<String> {
        rows.iter()
            .map(|row| {
                let default = match row.default {
                    Unset::Value(v) | Unset::Template(v) => format!("`{v}`"),
                    Unset::Described(d) => d.to_string(),
                };
                let text = match column {
                    Column::Meaning => row.meaning,
                    Column::Summary => row.summary,
                };
                format!("| `{prefix}{}` | {default} | {text} |", row.name)
            })
            .collect()
    }

    /// Every row of `documented` that is not exactly the table's row in
    /// the same place, and every row of the table the document lacks.
    pub(crate) fn drift(documented: &[String], rendered: &[String]) -> Vec<String> {
        let name = |row: &str| row.split('`').nth(1).unwrap_or("").to_string();
        let mut drift = Vec::new();
        for (i, want) in rendered.iter().enumerate() {
            match documented.get(i) {
                Some(row) if row == want => {}
                Some(row) => drift.push(format!(
                    "row {} ({}): the document has\n  {row}\nthe table gives\n  {want}",
                    i + 1,
                    name(want)
                )),
                None => drift.push(format!("no row for {}", name(want))),
            }
        }
        for row in documented.iter().skip(rendered.len()) {
            drift.push(format!("a row the table lacks: {row}"));
        }
        drift
    }

    /// The fields of `pub struct {name}` as `source` declares them (its
    /// `pub` lines), so a test can hold a `Debug` to every one of them.
    pub(crate) fn declared_fields<'a>(source: &'a str, name: &str) -> Vec<&'a str> {
        source
            .split(&format!("pub struct {name} {{"))
            .nth(1)
            .and_then(|rest| rest.split("\n}").next())
            .unwrap_or("")
            .lines()
            .filter_map(|l| l.trim().strip_prefix("pub "))
            .filter_map(|l| l.split(':').next())
            .collect()
    }

    /// `shown` (a settings' `Debug`) names every field `pub struct {name}`
    /// declares in `source`, and there are more than 30 of them.
    pub(crate) fn assert_shows_every_field(shown: &str, source: &str, name: &str) {
        let fields = declared_fields(source, name);
        assert!(fields.len() > 30, "{fields:?}");
        for field in fields {
            assert!(
                shown.contains(&format!(" {field}: ")),
                "{field} missing: {shown}"
            );
        }
    }
}
