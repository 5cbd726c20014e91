//! The message schemas compiled into the proxy are Kafka's own: each one
//! equals the file of the same name inside the `kafka-clients` jar of the
//! Kafka release the tests run against.

mod support;

use std::process::Command;

use anyhow::{ensure, Context, Result};
use kafka_mirror_proxy::wire::schema;

#[test]
fn compiled_in_schemas_equal_the_kafka_clients_jar() -> Result<()> {
    let jar = support::kafka::jars_dir()?.join("kafka-clients-4.4.0.jar");
    let mut compared = 0;
    for (file, text) in schema::source_files() {
        // python3 is a stated requirement of the test command; its zipfile
        // module reads the jar without another tool.
        let out = Command::new("python3")
            .args([
                "-c",
                "import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))",
            ])
            .arg(&jar)
            .arg(format!("common/message/{file}"))
            .output()
            .context("running python3 to read the jar")?;
        ensure!(
            out.status.success(),
            "{file} not in {}: {}",
            jar.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        ensure!(
            out.stdout == text.as_bytes(),
            "{file} differs from the copy in {}",
            jar.display()
        );
        compared += 1;
    }
    ensure!(compared >= 10, "only {compared} schemas compared");
    Ok(())
}
