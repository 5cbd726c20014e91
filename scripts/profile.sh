#!/usr/bin/env bash
# Where the proxy's CPU goes: one broker, the release proxy, and Kafka's
# ProducerPerformance (1 KiB records, acks=all, idempotent) through it on
# PATH_KIND (local: passthrough; link: a mirror link, every batch remapped)
# while `perf record` samples the proxy with call graphs. Prints the top of
# `perf report` (self time, then with children) and copies perf.data to
# PERF_DATA (default target/perf-PATH_KIND.data) for a flame graph
# (`perf script -i FILE | stackcollapse-perf.pl | flamegraph.pl`).
#
#   scripts/profile.sh               # PATH_KIND=link RECORDS=300000
#   PATH_KIND=local scripts/profile.sh
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

PATH_KIND=${PATH_KIND:-link}
RECORDS=${RECORDS:-300000}
command -v perf >/dev/null || { echo "perf is not installed (Debian: linux-perf)" >&2; exit 1; }

(cd "$KMP_ROOT" && cargo build --release --quiet)
kmp_init
kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA
kmp_start_perf_proxy P "$B_PORT"
topic=perf-$PATH_KIND
client=perf-client
[ "$PATH_KIND" = link ] && client=mirror-perf
kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$B_PORT" \
    --create --topic "$topic" --partitions 1 --replication-factor 1 >/dev/null

produce() {
    kmp_java org.apache.kafka.tools.ProducerPerformance --topic "$topic" \
        --num-records "$1" --record-size 1024 --throughput -1 \
        --bootstrap-server "127.0.0.1:$P_PORT" \
        --command-property acks=all enable.idempotence=true client.id="$client" 2>/dev/null | tail -1
}
echo "warm-up..." >&2
produce 50000 >/dev/null
data="$KMP_WORK/perf.data"
perf record -F 999 -g --call-graph dwarf,16384 -p "$P_PID" -o "$data" >/dev/null 2>&1 &
recorder=$!
sleep 1
produce "$RECORDS" >&2
kill -INT "$recorder"
wait "$recorder" || true
echo "== $PATH_KIND: self time by symbol =="
perf report -i "$data" --no-children --sort symbol -g none --percent-limit 0.7 --stdio 2>/dev/null | grep -E '^ +[0-9]' | sed -n 1,40p
echo "== $PATH_KIND: with children, by symbol =="
perf report -i "$data" --children --sort symbol -g none --percent-limit 3 --stdio 2>/dev/null | grep -E '^ +[0-9]' | sed -n 1,40p
out=${PERF_DATA:-$KMP_ROOT/target/perf-$PATH_KIND.data}
cp "$data" "$out"
echo "perf.data: $out"
