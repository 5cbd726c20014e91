#!/usr/bin/env bash
# The test command: every unit test, and every integration test against real
# Kafka brokers started from the Kafka 4.4.0 jars (fetched once with Maven
# into ~/.cache/kafka-mirror-proxy, or KAFKA_JARS_DIR). Extra arguments go to
# `cargo test` (e.g. `scripts/test.sh --test mirror`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/kafka-jars.sh >/dev/null
cargo test "$@"
