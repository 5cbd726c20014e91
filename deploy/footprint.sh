#!/usr/bin/env bash
# The proxy's memory and CPU footprint under a produce/consume load, the
# figures the Helm chart's resource requests are sized from: one broker,
# the release build with a mirror link and the chart's default frame
# budgets (128 MiB each), and through it at once
#   - ProducerPerformance writing RECORDS 1 KiB records as a local client,
#   - ProducerPerformance writing RECORDS 1 KiB records as the link's
#     replicator (client.id mirror-perf, idempotent: remapped, state topic),
#   - ConsumerPerformance reading the local records back.
# Prints the proxy's peak RSS (VmHWM), its RSS after the load, its CPU
# seconds and the CPU per GB moved.
#
#   deploy/footprint.sh              # RECORDS=300000
#   RECORDS=1000000 deploy/footprint.sh
set -euo pipefail
. "$(dirname "$0")/../scripts/lib/kafka.sh"

RECORDS=${RECORDS:-300000}

(cd "$KMP_ROOT" && cargo build --release --quiet --bin kafka-mirror-proxy)
kmp_init
kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA
kmp_start_proxy P "$B_PORT" \
    MIRROR_PROXY_LINKS=perf \
    MIRROR_PROXY_LINK_PERF_SOURCE_CLUSTER_ID=MkU3OEVBNTcwNTJENDM2Qk \
    MIRROR_PROXY_LINK_PERF_TOPICS=perf-link \
    MIRROR_PROXY_MAX_BUFFERED_BYTES=134217728 \
    MIRROR_PROXY_MAX_BUFFERED_RESPONSE_BYTES=134217728
for t in perf-local perf-link; do
    kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$B_PORT" \
        --create --topic "$t" --partitions 3 --replication-factor 1 >/dev/null
done

status_kib() { awk -v f="$2:" '$1 == f { print $2 }' "/proc/$1/status"; }
cpu_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'; }
ticks=$(getconf CLK_TCK)
idle_rss=$(status_kib "$P_PID" VmRSS)
before=$(cpu_ticks "$P_PID")
started=$(date +%s.%N)

produce() { # TOPIC CLIENT_ID
    kmp_java org.apache.kafka.tools.ProducerPerformance --topic "$1" \
        --num-records "$RECORDS" --record-size 1024 --throughput -1 \
        --bootstrap-server "127.0.0.1:$P_PORT" \
        --command-property acks=all enable.idempotence=true client.id="$2" 2>/dev/null | tail -1
}
produce perf-local perf-client > "$KMP_WORK/local.out" &
local_pid=$!
produce perf-link mirror-perf > "$KMP_WORK/link.out" &
link_pid=$!
# The consumer reads what the local producer writes, as it is written.
kmp_java org.apache.kafka.tools.ConsumerPerformance --topic perf-local \
    --num-records "$RECORDS" --bootstrap-server "127.0.0.1:$P_PORT" \
    --timeout 120000 --hide-header 2>/dev/null > "$KMP_WORK/consume.out" &
consume_pid=$!
peak_sampled=0
while kill -0 "$local_pid" 2>/dev/null || kill -0 "$link_pid" 2>/dev/null || kill -0 "$consume_pid" 2>/dev/null; do
    rss=$(status_kib "$P_PID" VmRSS)
    [ "$rss" -gt "$peak_sampled" ] && peak_sampled=$rss
    sleep 0.2
done
wait "$local_pid" "$link_pid" "$consume_pid"
elapsed=$(awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
after=$(cpu_ticks "$P_PID")
hwm=$(status_kib "$P_PID" VmHWM)
rss=$(status_kib "$P_PID" VmRSS)
remapped=$(exec 3<>"/dev/tcp/127.0.0.1/$P_ADMIN"; printf 'GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3; awk '/^kafka_mirror_proxy_mirror_batches_remapped_total\{link="perf"\}/ { print $2 }' <&3)

echo "local producer: $(cat "$KMP_WORK/local.out")"
echo "link producer:  $(cat "$KMP_WORK/link.out")"
echo "consumer:       $(cat "$KMP_WORK/consume.out")"
echo "link batches remapped: ${remapped:-?}"
awk -v records="$RECORDS" -v idle="$idle_rss" -v hwm="$hwm" -v sampled="$peak_sampled" -v rss="$rss" \
    -v cpu=$((after - before)) -v hz="$ticks" -v wall="$elapsed" 'BEGIN {
    gb = 3 * records * 1024 / 1e9
    printf "proxy RSS idle %d KiB; peak (VmHWM) %d KiB (%.1f MiB; sampled every 0.2 s: %d KiB); after the load %d KiB\n", idle, hwm, hwm / 1024, sampled, rss
    printf "proxy CPU %.2f s over %.1f s wall (%.2f cores on average), %.2f s per GB moved (%.2f GB: 2 x produced + consumed)\n", cpu / hz, wall, cpu / hz / wall, cpu / hz / gb, gb
}'
