//! The example replicator (`examples/replicator.rs`) as a process, for the
//! tests that kill it: its binary, built on first use with the cargo that
//! builds the test (into the same target directory), or
//! `REPLICATOR_TEST_BIN`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{anyhow, Result};

/// The replicator binary (see the module doc).
pub fn replicator_bin() -> Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Ok(bin) = std::env::var("REPLICATOR_TEST_BIN") {
            return Ok(PathBuf::from(bin));
        }
        // <target dir>/debug/kafka-mirror-proxy: the example goes into
        // <target dir>/debug/examples.
        let profile_dir = Path::new(env!("CARGO_BIN_EXE_kafka-mirror-proxy"))
            .parent()
            .ok_or("no profile directory")?;
        let target_dir = profile_dir.parent().ok_or("no target directory")?;
        let status = Command::new(env!("CARGO"))
            .args(["build", "--example", "replicator", "--manifest-path"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target_dir)
            .status()
            .map_err(|e| format!("running cargo: {e}"))?;
        if !status.success() {
            return Err(format!("cargo build --example replicator: {status}"));
        }
        Ok(profile_dir.join("examples").join("replicator"))
    })
    .clone()
    .map_err(|e| anyhow!(e))
}
