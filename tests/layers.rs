//! The crate's layers, enforced: `src/lib.rs` declares the order of the
//! top-level modules on its `//! layers:` line, bottom first, and a module
//! may use only the modules before it. This test reads every file under
//! `src/` and fails on any `crate::` path (or `super::` path that leaves
//! its top-level module) that points up or sideways: in a `use` or
//! `pub use`, inside a grouped import (`use crate::{a::X, b::{Y, Z}}`, on
//! one line or several) and inline in code (`crate::proxy::X::new()`).
//!
//! Each file is split into tokens first, so comments, string and character
//! literals never count and line breaks never hide a path. What it cannot
//! see: a path through an alias of the crate root (`use crate as root;`
//! then `root::proxy`), which this crate does not write.

use std::path::{Path, PathBuf};

/// The declared order, from the crate doc's `//! layers: a > b > c` line.
fn declared_layers(lib_rs: &str) -> Vec<String> {
    let line = lib_rs
        .lines()
        .find_map(|l| l.trim().strip_prefix("//! layers:"))
        .expect("src/lib.rs declares its layers on a `//! layers:` line");
    line.split('>').map(|m| m.trim().to_string()).collect()
}

/// One import that breaks the order.
#[derive(Debug, PartialEq)]
struct Violation {
    file: String,
    line: usize,
    from: String,
    to: String,
}

/// The module path of a source file
/// (`src/mirror/dedupe/tests.rs` -> `["mirror", "dedupe", "tests"]`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" {
            parts.push(stem);
        }
    }
    parts
}

/// A token of Rust source, as far as paths need: comments, whitespace and
/// literals are dropped.
#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    /// `::`
    PathSep,
    /// Any other punctuation character, one at a time.
    Punct(char),
    /// A number, a character or string literal or a lifetime: nothing a
    /// path is made of.
    Literal,
}

/// The tokens of `source`, each with its 1-based line.
fn tokens(source: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = source.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let is_ident_start = |c: char| c.is_alphabetic() || c == '_';
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    // Skips a quoted literal whose opening quote is at `i`, honouring `\`
    // escapes; returns the index after its closing quote.
    let quoted = |mut i: usize, line: &mut usize| -> usize {
        let quote = chars[i];
        i += 1;
        while i < chars.len() && chars[i] != quote {
            if chars[i] == '\\' {
                i += 1;
            }
            if chars.get(i) == Some(&'\n') {
                *line += 1;
            }
            i += 1;
        }
        i + 1
    };
    // Skips a raw string `r#*"..."#*` whose `r` is at `i`.
    let raw = |mut i: usize, line: &mut usize| -> usize {
        i += 1;
        let mut hashes = 0;
        while chars.get(i) == Some(&'#') {
            hashes += 1;
            i += 1;
        }
        i += 1; // the opening quote
        while i < chars.len() {
            if chars[i] == '"' && (1..=hashes).all(|h| chars.get(i + h) == Some(&'#')) {
                return i + 1 + hashes;
            }
            if chars[i] == '\n' {
                *line += 1;
            }
            i += 1;
        }
        i
    };
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            // Block comments nest.
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            i = quoted(i, &mut line);
            out.push((Token::Literal, line));
        } else if c == '\'' {
            // A character literal ('a', '\n', '\u{1F600}') or a lifetime
            // or label ('a, 'static).
            if next == Some('\\') || chars.get(i + 2) == Some(&'\'') {
                i = quoted(i, &mut line);
            } else {
                i += 1;
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
            out.push((Token::Literal, line));
        } else if c.is_ascii_digit() {
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            out.push((Token::Literal, line));
        } else if is_ident_start(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let at = chars.get(i).copied();
            let after = chars.get(i + 1).copied();
            match (word.as_str(), at) {
                // Raw strings: r"..", r#".."#, br"..", cr#".."#.
                ("r" | "br" | "cr", Some('"')) => {
                    i = raw(i - 1, &mut line);
                    out.push((Token::Literal, line));
                }
                ("r" | "br" | "cr", Some('#')) if matches!(after, Some('"' | '#')) => {
                    i = raw(i - 1, &mut line);
                    out.push((Token::Literal, line));
                }
                // A raw identifier: r#type.
                ("r", Some('#')) if after.is_some_and(is_ident_start) => {
                    let start = i + 1;
                    i = start;
                    while i < chars.len() && is_ident(chars[i]) {
                        i += 1;
                    }
                    out.push((Token::Ident(chars[start..i].iter().collect()), line));
                }
                // Byte and C strings, byte characters: b"..", c"..", b'x'.
                ("b" | "c", Some('"')) | ("b", Some('\'')) => {
                    i = quoted(i, &mut line);
                    out.push((Token::Literal, line));
                }
                _ => out.push((Token::Ident(word), line)),
            }
        } else if c == ':' && next == Some(':') {
            out.push((Token::PathSep, line));
            i += 2;
        } else {
            out.push((Token::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// Where a path being followed stands: a module path from the crate root,
/// or outside the crate (more `super`s than there are modules).
type Position = Option<Vec<String>>;

/// Follows the rest of a path (a use tree) from `toks[j]`, the token after
/// a `::`, standing at `at`; records the top-level module of each branch
/// that steps down from the crate root. Returns the index after the tree.
fn follow(
    toks: &[(Token, usize)],
    mut j: usize,
    at: Position,
    found: &mut Vec<(String, usize)>,
) -> usize {
    match toks.get(j) {
        // A group: `{a::X, b::{Y, Z}, self}`, each branch from here.
        Some((Token::Punct('{'), _)) => {
            j += 1;
            while let Some((t, _)) = toks.get(j) {
                match t {
                    Token::Punct('}') => return j + 1,
                    Token::Punct(',') => j += 1,
                    _ => {
                        let after = follow(toks, j, at.clone(), found);
                        // Something no use tree holds: step over it.
                        j = if after == j { j + 1 } else { after };
                    }
                }
            }
            j
        }
        Some((Token::Ident(segment), line)) => {
            let at = step(at, segment, *line, found);
            match toks.get(j + 1) {
                Some((Token::PathSep, _)) => follow(toks, j + 2, at, found),
                // `X as Y`: the alias names nothing.
                Some((Token::Ident(k), _)) if k == "as" => j + 3,
                _ => j + 1,
            }
        }
        Some((Token::Punct('*'), _)) => j + 1,
        _ => j,
    }
}

/// One path segment taken from `at`; a name taken at the crate root is a
/// top-level module, recorded with its line.
fn step(at: Position, segment: &str, line: usize, found: &mut Vec<(String, usize)>) -> Position {
    let mut at = at?;
    match segment {
        "self" => {}
        "super" => {
            at.pop()?;
        }
        name => {
            if at.is_empty() {
                found.push((name.to_string(), line));
            }
            at.push(name.to_string());
        }
    }
    Some(at)
}

/// Every top-level module named by a path in `source`, the file whose
/// module path is `file`, with the line that names it: paths that start at
/// `crate` (or `$crate`), and `super::` / `self::` paths, followed from
/// the module they are written in (inline `mod x { .. }` blocks included)
/// and recorded when they climb to the crate root and step down again.
fn referenced_modules(source: &str, file: &[String]) -> Vec<(String, usize)> {
    let toks = tokens(source);
    let mut found = Vec::new();
    // The module the tokens are in: the file's, plus the inline modules
    // open around them, each with the brace depth its body opened at.
    let mut here: Vec<String> = file.to_vec();
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < toks.len() {
        let starts_path = i == 0 || toks[i - 1].0 != Token::PathSep;
        let then_sep = matches!(toks.get(i + 1), Some((Token::PathSep, _)));
        match &toks[i].0 {
            Token::Ident(k) if starts_path && then_sep && k == "crate" => {
                i = follow(&toks, i + 2, Some(Vec::new()), &mut found);
                continue;
            }
            Token::Ident(k) if starts_path && then_sep && (k == "super" || k == "self") => {
                let at = step(Some(here.clone()), k, toks[i].1, &mut found);
                i = follow(&toks, i + 2, at, &mut found);
                continue;
            }
            Token::Ident(k) if k == "mod" => {
                if let (Some((Token::Ident(name), _)), Some((Token::Punct('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    here.push(name.clone());
                    depth += 1;
                    inline.push(depth);
                    i += 3;
                    continue;
                }
            }
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                    here.pop();
                }
                depth = depth.saturating_sub(1);
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Every path of `source` (the file at `relative` under `src/`) that
/// points to a module at or above its own in `layers`.
fn check_file(layers: &[String], relative: &Path, source: &str) -> Vec<Violation> {
    let here = module_path(relative);
    let Some(top) = here.first() else {
        return Vec::new();
    };
    let Some(rank) = layers.iter().position(|m| m == top) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (to, line) in referenced_modules(source, &here) {
        if to == *top {
            continue;
        }
        let allowed = layers
            .iter()
            .position(|m| *m == to)
            .is_some_and(|r| r < rank);
        if !allowed {
            out.push(Violation {
                file: relative.display().to_string(),
                line,
                from: top.clone(),
                to,
            });
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_import_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("src/lib.rs");
    let layers = declared_layers(&lib);
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut violations = Vec::new();
    let mut undeclared = Vec::new();
    // Paths that reach a top-level module, allowed or not: a checker that
    // stopped seeing them would pass everything.
    let mut paths = 0;
    for path in &files {
        let relative = path.strip_prefix(&src).expect("under src/");
        let top = module_path(relative);
        let Some(top) = top.first() else { continue };
        if top == "lib" || top == "main" {
            continue;
        }
        if !layers.contains(top) {
            undeclared.push(top.clone());
        }
        let source = std::fs::read_to_string(path).expect("readable source");
        paths += referenced_modules(&source, &module_path(relative)).len();
        violations.extend(check_file(&layers, relative, &source));
    }
    undeclared.sort();
    undeclared.dedup();
    assert!(
        undeclared.is_empty(),
        "modules missing from the `//! layers:` line of src/lib.rs: {undeclared:?}"
    );
    let listed: Vec<String> = violations
        .iter()
        .map(|v| format!("{}:{}: {} uses {}", v.file, v.line, v.from, v.to))
        .collect();
    assert!(
        listed.is_empty(),
        "imports that point up or sideways (order: {}):\n{}",
        layers.join(" > "),
        listed.join("\n")
    );
    assert!(files.len() > 20, "read only {} files", files.len());
    assert!(paths > 200, "found only {paths} paths to top-level modules");
}

fn layers() -> Vec<String> {
    declared_layers("//! intro\n//! layers: wire > mirror > proxy\n")
}

#[test]
fn the_declared_order_is_read_from_the_crate_doc() {
    assert_eq!(layers(), ["wire", "mirror", "proxy"]);
}

#[test]
fn a_planted_upward_import_is_found() {
    let source = "use crate::wire::batch;\nuse crate::proxy::Shared; // the planted one\n";
    let v = check_file(&layers(), Path::new("mirror/produce.rs"), source);
    assert_eq!(
        v,
        [Violation {
            file: "mirror/produce.rs".into(),
            line: 2,
            from: "mirror".into(),
            to: "proxy".into(),
        }]
    );
}

#[test]
fn a_sideways_or_unknown_module_is_found() {
    let layers = declared_layers("//! layers: wire > admin > cli\n");
    let v = check_file(
        &layers,
        Path::new("cli.rs"),
        "fn f() { crate::admin::x(); }",
    );
    assert!(v.is_empty(), "{v:?}");
    let v = check_file(&layers, Path::new("admin.rs"), "use crate::cli::Args;");
    assert_eq!(v.len(), 1);
    let v = check_file(&layers, Path::new("admin.rs"), "use crate::elsewhere::X;");
    assert_eq!(v.len(), 1);
}

#[test]
fn super_paths_that_leave_the_module_are_followed() {
    // From src/mirror/dedupe.rs, `super::` is `mirror`; `super::super::` is
    // the crate root.
    let here = Path::new("mirror/dedupe.rs");
    assert!(check_file(&layers(), here, "use super::produce::Plan;").is_empty());
    let v = check_file(&layers(), here, "use super::super::proxy::Shared;");
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].to, "proxy");
}

#[test]
fn own_module_paths_and_comments_are_not_imports() {
    let here = Path::new("mirror/dedupe.rs");
    let source =
        "use crate::mirror::pid;\n// crate::proxy::Shared in a comment\n/// see crate::proxy\n";
    assert!(check_file(&layers(), here, source).is_empty());
    // `my_crate::proxy` is not `crate::proxy`.
    assert!(check_file(&layers(), here, "use my_crate::proxy;").is_empty());
}

/// (line, module) of each violation, in order.
fn found(relative: &str, source: &str) -> Vec<(usize, String)> {
    check_file(&layers(), Path::new(relative), source)
        .into_iter()
        .map(|v| {
            assert_eq!(v.from, "mirror", "{v:?}");
            (v.line, v.to)
        })
        .collect()
}

#[test]
fn every_way_of_writing_an_upward_path_is_found() {
    // From `mirror`, which may use `wire` only, one upward path written
    // each way a path can be written; each must be reported, on the line
    // that names `proxy`.
    let source = r##"use crate::proxy::Shared;
pub use crate::proxy::Listener;
pub(crate) use crate::proxy::Target as T;
use crate::{proxy::Session};
use crate::{wire::batch, proxy::session::Session};
use crate::{wire::{batch, crc32c}, mirror::{pid, proxy::Shared}, proxy::{queue::Queue, Shared}};
use crate::{
    wire::batch,
    proxy::{
        Target,
        Shared,
    },
};
use crate
    ::proxy
    ::Shared;
use super::super::{proxy::Shared};
use self::super::super::proxy::Shared;
fn inline() -> usize { crate::proxy::session::count() }
struct Field(crate::proxy::Shared);
fn typed<'a>(x: &'a crate::proxy::Shared) -> char { '"' }
macro_rules! m { () => { $crate::proxy::Shared::new() } }
fn after_literals() { let _ = (r#"x"#, b'{', "}\"", '\''); crate::proxy::x(); }
"##;
    let v = found("mirror/produce.rs", source);
    let expected: Vec<(usize, String)> = [1, 2, 3, 4, 5, 6, 9, 15, 17, 18, 19, 20, 21, 22, 23]
        .into_iter()
        .map(|line| (line, "proxy".to_string()))
        .collect();
    assert_eq!(v, expected);
    // Sideways and unknown modules inside a group too.
    let layers = declared_layers("//! layers: wire > admin > cli\n");
    let v = check_file(
        &layers,
        Path::new("admin.rs"),
        "use crate::{\n    wire::x,\n    cli::{Args},\n    elsewhere::Y,\n};\n",
    );
    let to: Vec<(usize, &str)> = v.iter().map(|v| (v.line, v.to.as_str())).collect();
    assert_eq!(to, [(3, "cli"), (4, "elsewhere")]);
}

#[test]
fn allowed_paths_written_every_way_pass() {
    // From `mirror`: its own module and `wire` below, written the same
    // ways, and `proxy` only where no path is (literals, comments).
    let source = r##"use crate::wire::batch;
pub use crate::{wire::{batch::View, crc32c}, mirror::pid};
use crate::{
    self as root,
    wire::Cursor as C,
    mirror::{
        self,
        link::*,
    },
};
use super::{pid::ClusterId, link};
fn inline() { crate::wire::batch::build(); let _ = crate::mirror::pid::map; }
pub(crate) fn a() {}
pub(super) fn b() {}
pub(in crate::mirror) fn c() {}
const S: &str = "use crate::proxy::Shared;";
const R: &str = r#"crate::{proxy::X}"#;
/* crate::proxy::Shared /* nested */ crate::proxy::Shared */
fn lifetimes<'a>(x: &'a str) -> &'a str { x }
mod tests {
    use super::*;
    use super::super::pid;
    mod deeper {
        use super::super::super::link::Link;
    }
}
"##;
    assert_eq!(found("mirror/produce.rs", source), []);
}

#[test]
fn inline_modules_move_super() {
    // `super::super` from an inline `mod tests` of src/mirror/produce.rs is
    // `mirror`; once the inline module is closed it is the crate root.
    let source = "mod tests {\n    use super::super::pid;\n}\nuse super::super::proxy::Shared;\n";
    assert_eq!(
        found("mirror/produce.rs", source),
        [(4, "proxy".to_string())]
    );
}
