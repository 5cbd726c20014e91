#!/usr/bin/env bash
# Fuzz every parser that reads bytes from clients or brokers (cargo-fuzz,
# nightly toolchain). Each target starts from the seeds in fuzz/seeds/<target>
# (captured from real clients and a real broker, see tests/real_traffic.rs)
# and fuzz/seeds-manual/<target> (written by hand) and keeps what it finds in fuzz/corpus/<target> (not committed).
#
#   scripts/fuzz.sh [SECONDS]            every target for SECONDS each (default 30)
#   scripts/fuzz.sh --target NAME [SEC]  one target
#   scripts/fuzz.sh --seeds              recapture fuzz/seeds from real traffic
#
# A crash stops the run with a non-zero status; libFuzzer prints the input's
# path under fuzz/artifacts/<target>/. Turn it into a unit test beside the
# parser it broke, then fix the parser.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--seeds" ]; then
    rm -rf fuzz/seeds
    FUZZ_SEEDS_DIR="$PWD/fuzz/seeds" cargo test --test real_traffic -- --nocapture
    exit 0
fi

targets="frame request_header produce_plan responses record_batches schema_walk client_responses state_batches"
if [ "${1:-}" = "--target" ]; then
    targets=$2
    shift 2
fi
seconds=${1:-30}

if ! rustup toolchain list | grep -q '^nightly'; then
    rustup toolchain install nightly --profile minimal
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked
fi

cargo +nightly fuzz build -O
for t in $targets; do
    mkdir -p "fuzz/corpus/$t"
    echo "fuzz: $t for ${seconds}s"
    # -rss_limit_mb: the proxy must never need much memory for one input;
    # -max_len: room for real Produce requests from the seeds.
    # fuzz/seeds-manual/<target>: hand-written seeds for what the capture
    # cannot see (kept apart, since --seeds rewrites fuzz/seeds).
    seeds=""
    for d in "fuzz/seeds/$t" "fuzz/seeds-manual/$t"; do
        if [ -d "$d" ]; then seeds="$seeds $d"; fi
    done
    # shellcheck disable=SC2086
    cargo +nightly fuzz run -O "$t" "fuzz/corpus/$t" $seeds -- \
        -max_total_time="$seconds" -rss_limit_mb=512 -max_len=65536 \
        -print_final_stats=1 2>&1 | grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|==|SUMMARY|artifact_prefix|Test unit written)|panicked|ERROR' || true
    # (Not `ls a* b* c*`: that fails unless every kind is present, which
    # let a crash pass unnoticed.)
    found=$(find "fuzz/artifacts/$t" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'oom-*' -o -name 'leak-*' -o -name 'timeout-*' \) 2>/dev/null || true)
    if [ -n "$found" ]; then
        echo "fuzz: $t found a failing input:" >&2
        ls "fuzz/artifacts/$t" >&2
        exit 1
    fi
done
