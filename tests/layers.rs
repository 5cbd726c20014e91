//! The crate's layers, enforced: `src/lib.rs` declares the order of the
//! top-level modules on its `//! layers:` line, bottom first, and a module
//! may use only the modules before it. This test reads every file under
//! `src/` and fails on any `crate::` path (or `super::` path that leaves
//! its top-level module) that points up or sideways.

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

/// The top-level module a source file belongs to, and its module path
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

/// The code of a line, without its `//` comment (string literals holding
/// `//` are rare enough in this crate to ignore).
fn code_of(line: &str) -> &str {
    match line.find("//") {
        Some(i) => &line[..i],
        None => line,
    }
}

/// Every top-level module named by a path in `code` from a file whose
/// module path is `here`: `crate::m`, and `super::` chains that climb out
/// of the file's top-level module.
fn referenced_modules(code: &str, here: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let boundary = i == 0 || !is_ident(bytes[i - 1]);
        if boundary && rest.starts_with("crate::") {
            let name: String = rest["crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                found.push(name);
            }
            i += "crate::".len();
            continue;
        }
        if boundary && rest.starts_with("super::") {
            let mut depth = 0;
            let mut tail = rest;
            while let Some(t) = tail.strip_prefix("super::") {
                depth += 1;
                tail = t;
            }
            // From a file at `here`, `super` names its parent; climbing
            // `here.len() - 1` levels reaches the crate root.
            if depth >= here.len() {
                let name: String = tail
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    found.push(name);
                }
            }
            i += depth * "super::".len();
            continue;
        }
        i += rest.chars().next().map_or(1, char::len_utf8);
    }
    found
}

/// Every import of `source` (the file at `relative` under `src/`) that
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
    for (n, line) in source.lines().enumerate() {
        for to in referenced_modules(code_of(line), &here) {
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
                    line: n + 1,
                    from: top.clone(),
                    to,
                });
            }
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
