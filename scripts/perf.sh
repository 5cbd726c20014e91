#!/usr/bin/env bash
# End-to-end throughput, in one run against one broker: Kafka's
# ProducerPerformance (1 KiB records, acks=all, idempotent) writing
#   direct       straight to the broker,
#   local        through the proxy as an ordinary client,
#   link         through the proxy as a mirror link (client.id of the link, so
#                every batch is remapped and its CRC patched),
# ROUNDS times in turn after a warm-up, then the mean of each and its ratio
# to direct.
#
#   scripts/perf.sh                 # RECORDS=300000 SIZE=1024 ROUNDS=3
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

RECORDS=${RECORDS:-300000}
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-3}

(cd "$KMP_ROOT" && cargo build --release --quiet)
kmp_init
kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA
kmp_start_proxy P "$B_PORT" \
    MIRROR_PROXY_LINKS=perf \
    MIRROR_PROXY_LINK_PERF_SOURCE_CLUSTER_ID=MkU3OEVBNTcwNTJENDM2Qk \
    MIRROR_PROXY_LINK_PERF_TOPICS='perf-link'

for t in perf-direct perf-local perf-link; do
    kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$B_PORT" \
        --create --topic "$t" --partitions 1 --replication-factor 1 >/dev/null
done

# run LABEL BOOTSTRAP TOPIC CLIENT_ID RECORDS -> "records/s MB/s p99"
run() {
    local line
    line=$(kmp_java org.apache.kafka.tools.ProducerPerformance --topic "$3" \
        --num-records "$5" --record-size "$SIZE" --throughput -1 \
        --bootstrap-server "$2" \
        --command-property acks=all enable.idempotence=true client.id="$4" 2>/dev/null | tail -1)
    # "N records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency, ... P ms 99th, ..."
    awk -v l="$1" '{ gsub(/[(),]/, " "); for (i = 1; i <= NF; i++) { if ($(i+1) == "records/sec") r = $i; if ($(i+1) == "MB/sec") m = $i; if ($(i+2) == "99th") p = $i } printf "%s %s %s %s\n", l, r, m, p }' <<<"$line"
}

echo "warm-up..." >&2
run warmup "127.0.0.1:$B_PORT" perf-direct perf-client 50000 >/dev/null
run warmup "127.0.0.1:$P_PORT" perf-local perf-client 50000 >/dev/null

results=$(mktemp)
for round in $(seq 1 "$ROUNDS"); do
    echo "round $round of $ROUNDS..." >&2
    run direct "127.0.0.1:$B_PORT" perf-direct perf-client "$RECORDS" | tee -a "$results" >&2
    run local "127.0.0.1:$P_PORT" perf-local perf-client "$RECORDS" | tee -a "$results" >&2
    run link "127.0.0.1:$P_PORT" perf-link mirror-perf "$RECORDS" | tee -a "$results" >&2
done

remapped=$(curl -s "http://127.0.0.1:$P_ADMIN/metrics" 2>/dev/null | awk '/^kafka_mirror_proxy_mirror_batches_remapped_total\{link="perf"\}/ { print $2 }' || true)

echo
echo "ProducerPerformance, $RECORDS records of $SIZE bytes, acks=all, idempotent, mean of $ROUNDS rounds"
awk '
    { n[$1]++; r[$1] += $2; m[$1] += $3; p[$1] += $4 }
    END {
        printf "%-8s %12s %8s %10s %10s\n", "path", "records/s", "MB/s", "p99 ms", "vs direct"
        split("direct local link", order, " ")
        for (i = 1; i <= 3; i++) {
            k = order[i]
            printf "%-8s %12.0f %8.2f %10.0f %9.2fx\n", k, r[k]/n[k], m[k]/n[k], p[k]/n[k], (r[k]/n[k]) / (r["direct"]/n["direct"])
        }
    }' "$results"
echo "batches remapped by the proxy on link 'perf': ${remapped:-unknown}"
rm -f "$results"
