#!/usr/bin/env bash
# The test command: every unit test, and every integration test against real
# Kafka brokers started from the Kafka 4.4.0 jars (fetched once with Maven
# into ~/.cache/kafka-mirror-proxy, or KAFKA_JARS_DIR). Extra arguments go to
# `cargo test` (e.g. `scripts/test.sh --test mirror`). Ends with one summary
# line over every test binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/kafka-jars.sh >/dev/null
log=$(mktemp)
trap 'rm -f "$log"' EXIT
set +e
cargo test --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
awk '/^test result:/ {
        for (i = 2; i <= NF; i++) {
            if ($i == "passed;") p += $(i - 1)
            if ($i == "failed;") f += $(i - 1)
            if ($i == "ignored;") s += $(i - 1)
        }
    }
    END { printf "summary: %d passed, %d failed, %d skipped\n", p, f, s }' "$log"
exit "$status"
