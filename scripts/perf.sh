#!/usr/bin/env bash
# End-to-end cost and throughput, in one run against one broker: Kafka's
# ProducerPerformance (acks=all, idempotent) writing
#   direct       straight to the broker,
#   local        through the proxy as an ordinary client (passthrough),
#   link         through the proxy as a mirror link (client.id of the link, so
#                every batch is remapped and its CRC patched),
#   floor        through examples/tcp_relay.rs, which only copies bytes (the
#                cost any tokio proxy pays to move them; its CPU s/GB is
#                the relay's),
#   splice       through examples/splice_relay.rs, which moves bytes with
#                splice(2) and never copies them into user space (what the
#                kernel alone charges a relay for the TCP work),
# in rotation, ROUNDS times after a warm-up; each figure is the median of
# the rounds. Per path and case: records/s, MB/s, p50 and p99 latency, the
# ratio to direct, and the proxy's own CPU time per GB moved (utime + stime
# from /proc/PID/stat across the run, divided by the bytes written) and its
# peak RSS (VmHWM). The CPU figure is also split: the kernel's part
# (stime, spent in the proxy's syscalls: TCP, epoll, wake-ups) is shown
# beside the total.
#
# Cases (CASES, space-separated):
#   1k      1 KiB records, as fast as possible (the producer's defaults)
#   small   100-byte records, linger.ms=0 (many small batches), 10 x RECORDS
#   fixed   1 KiB records at a fixed 5,000 records/s (cost when not saturated)
#
#   scripts/perf.sh                          # CASES=1k RECORDS=300000 ROUNDS=3
#   CASES="1k small fixed" ROUNDS=5 scripts/perf.sh
#   BASELINE_BIN=/path/to/older/kafka-mirror-proxy scripts/perf.sh
#   BASELINE_BIN=... PATHS="direct link link@base" ROUNDS=15 scripts/perf.sh
#
# With BASELINE_BIN, a second proxy runs that binary beside this build and
# its paths (local@base, link@base) join the rotation, so a change is
# compared with the code before it under the same load. The summary pairs
# rounds: per case, each path's CPU s/GB against its baseline's in the same
# round, and the link path's against passthrough's (the median and range
# of those ratios, and the ratio of the sums). PATHS picks the paths
# (direct is always run: it is the reference for the other paths'
# throughput).
#
# On a noisy machine (broker, producer and proxy share the cores), trust
# CPU s/GB and RSS first: they measure the proxy alone. Throughput and
# latency move with everything else running; compare them only within one
# run, as ratios.
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

RECORDS=${RECORDS:-300000}
ROUNDS=${ROUNDS:-3}
CASES=${CASES:-1k}
FIXED_RATE=${FIXED_RATE:-5000}

(cd "$KMP_ROOT" && cargo build --release --quiet && cargo build --release --quiet --example tcp_relay --example splice_relay)
kmp_init
R_PORT=$(kmp_free_port); S_PORT=$(kmp_free_port)
KMP_RELAY_PORTS="$R_PORT $S_PORT" kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA
read -r R_TARGET S_TARGET <<<"$B_RELAY_TARGETS"
kmp_start_perf_proxy P "$B_PORT"
"$KMP_RELEASE/examples/tcp_relay" "127.0.0.1:$R_PORT" "127.0.0.1:$R_TARGET" 2>"$KMP_WORK/relay.log" &
KMP_PIDS+=($!)
R_PID=$!
"$KMP_RELEASE/examples/splice_relay" "127.0.0.1:$S_PORT" "127.0.0.1:$S_TARGET" 2>"$KMP_WORK/splice.log" &
KMP_PIDS+=($!)
S_PID=$!

DEFAULT_PATHS="direct floor splice local link"
if [ -n "${BASELINE_BIN:-}" ]; then
    KMP_PROXY_BIN=$BASELINE_BIN kmp_start_perf_proxy Q "$B_PORT" perf-link-base
    DEFAULT_PATHS="direct floor splice local local@base link link@base"
fi
PATHS=${PATHS:-$DEFAULT_PATHS}
case " $PATHS " in *" direct "*) ;; *) PATHS="direct $PATHS" ;; esac
for path in $PATHS; do
    case $path in
        direct | floor | splice | local | link) ;;
        local@base | link@base) [ -n "${BASELINE_BIN:-}" ] || { echo "path $path needs BASELINE_BIN" >&2; exit 2; } ;;
        *) echo "unknown path $path (direct floor splice local link local@base link@base)" >&2; exit 2 ;;
    esac
done

for t in perf-direct perf-floor perf-splice perf-local perf-link perf-link-base; do
    kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$B_PORT" \
        --create --topic "$t" --partitions 1 --replication-factor 1 >/dev/null
done

ticks=$(getconf CLK_TCK)
# The proxy's CPU time so far, in clock ticks: "utime+stime stime" (the
# fields after the parenthesised command name, which may hold spaces).
proxy_ticks() { sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13, $13 }'; }
proxy_hwm_kib() { awk '/^VmHWM:/ { print $2 }' "/proc/$1/status"; }

# case_args CASE -> "SIZE THROUGHPUT EXTRA_PROPERTIES..."
case_args() {
    case $1 in
        1k) echo "1024 -1" ;;
        small) echo "100 -1 linger.ms=0" ;;
        fixed) echo "1024 $FIXED_RATE" ;;
        *) echo "unknown case $1 (1k, small, fixed)" >&2; return 1 ;;
    esac
}

# run CASE LABEL BOOTSTRAP TOPIC CLIENT_ID RECORDS [PROXY_PID]
#   -> "CASE LABEL records/s MB/s p50 p99 cpu_s_per_gb kernel_s_per_gb"
run() {
    local args size rate extra line before after sys_before sys_after records=$6 pid=${7:-$P_PID}
    args=$(case_args "$1"); read -r size rate extra <<<"$args"
    # 100-byte records: ten times as many, so a run moves about as many bytes
    # as the 1 KiB case and the CPU figure (in 10 ms clock ticks) is not
    # dominated by one tick's rounding.
    [ "$size" -lt 1024 ] && records=$((records * 10))
    if [ "$rate" != -1 ] && [ "$records" -gt $((rate * 30)) ]; then
        records=$((rate * 30)) # at most 30 s per fixed-rate run
    fi
    read -r before sys_before <<<"$(proxy_ticks "$pid")"
    # shellcheck disable=SC2086
    line=$(kmp_java org.apache.kafka.tools.ProducerPerformance --topic "$4" \
        --num-records "$records" --record-size "$size" --throughput "$rate" \
        --bootstrap-server "$3" \
        --command-property acks=all enable.idempotence=true client.id="$5" $extra 2>/dev/null | tail -1)
    read -r after sys_after <<<"$(proxy_ticks "$pid")"
    # "N records sent, R records/sec (M MB/sec), A ms avg latency, X ms max latency, P ms 50th, Q ms 95th, S ms 99th, ..."
    awk -v c="$1" -v l="$2" -v cpu=$((after - before)) -v sys=$((sys_after - sys_before)) -v hz="$ticks" -v bytes=$((records * size)) '{
        gsub(/[(),]/, " ")
        for (i = 1; i <= NF; i++) {
            if ($(i+1) == "records/sec") r = $i; if ($(i+1) == "MB/sec") m = $i
            if ($(i+2) == "50th") p50 = $i; if ($(i+2) == "99th") p99 = $i
        }
        gb = cpu / hz / (bytes / 1e9); kgb = sys / hz / (bytes / 1e9)
        if (l == "direct") { gb = -1; kgb = -1 }
        printf "%s %s %s %s %s %s %.3f %.3f\n", c, l, r, m, p50, p99, gb, kgb
    }' <<<"$line"
}

echo "warm-up..." >&2
run 1k warmup "127.0.0.1:$B_PORT" perf-direct perf-client 50000 >/dev/null
run 1k warmup "127.0.0.1:$R_PORT" perf-floor perf-client 50000 "$R_PID" >/dev/null
run 1k warmup "127.0.0.1:$S_PORT" perf-splice perf-client 50000 "$S_PID" >/dev/null
run 1k warmup "127.0.0.1:$P_PORT" perf-local perf-client 50000 >/dev/null
run 1k warmup "127.0.0.1:$P_PORT" perf-link mirror-perf 50000 >/dev/null
if [ -n "${BASELINE_BIN:-}" ]; then
    run 1k warmup "127.0.0.1:$Q_PORT" perf-link-base mirror-perf 50000 "$Q_PID" >/dev/null
fi

results=$(mktemp)
for round in $(seq 1 "$ROUNDS"); do
    for c in $CASES; do
        echo "round $round of $ROUNDS, case $c..." >&2
        for path in $PATHS; do
            case $path in
                direct) run "$c" direct "127.0.0.1:$B_PORT" perf-direct perf-client "$RECORDS" ;;
                floor) run "$c" floor "127.0.0.1:$R_PORT" perf-floor perf-client "$RECORDS" "$R_PID" ;;
                splice) run "$c" splice "127.0.0.1:$S_PORT" perf-splice perf-client "$RECORDS" "$S_PID" ;;
                local) run "$c" local "127.0.0.1:$P_PORT" perf-local perf-client "$RECORDS" ;;
                link) run "$c" link "127.0.0.1:$P_PORT" perf-link mirror-perf "$RECORDS" ;;
                local@base) run "$c" local@base "127.0.0.1:$Q_PORT" perf-local perf-client "$RECORDS" "$Q_PID" ;;
                link@base) run "$c" link@base "127.0.0.1:$Q_PORT" perf-link-base mirror-perf "$RECORDS" "$Q_PID" ;;
            esac | sed "s/\$/ $round/" | tee -a "$results" >&2
        done
    done
done

remapped=$(curl -s "http://127.0.0.1:$P_ADMIN/metrics" 2>/dev/null | awk '/^kafka_mirror_proxy_mirror_batches_remapped_total\{link="perf"\}/ { print $2 }' || true)
rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$P_PID/status")

echo
echo "ProducerPerformance, acks=all, idempotent, $RECORDS records per run (small: 10 x; fixed: at most 30 s), median of $ROUNDS rounds"
sort -k1,1 -k2,2 "$results" | awk -v cases="$CASES" -v paths="$PATHS" '
    function median(list,   n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { k = $1 " " $2; r[k] = r[k] " " $3; m[k] = m[k] " " $4; p50[k] = p50[k] " " $5; p99[k] = p99[k] " " $6; cpu[k] = cpu[k] " " $7; sys[k] = sys[k] " " $8 }
    END {
        printf "%-6s %-10s %10s %8s %8s %8s %10s %15s %12s\n", "case", "path", "records/s", "MB/s", "p50 ms", "p99 ms", "vs direct", "proxy CPU s/GB", "kernel s/GB"
        nc = split(cases, cs, " ")
        np = split(paths, order, " ")
        for (c = 1; c <= nc; c++) for (i = 1; i <= np; i++) {
            k = cs[c] " " order[i]; d = cs[c] " direct"
            g = median(cpu[k]); kg = median(sys[k])
            printf "%-6s %-10s %10.0f %8.2f %8.0f %8.0f %9.3fx %15s %12s\n", cs[c], order[i], median(r[k]), median(m[k]), median(p50[k]), median(p99[k]), median(r[k]) / median(r[d]), (g < 0 ? "-" : sprintf("%.2f", g)), (kg < 0 ? "-" : sprintf("%.2f", kg))
        }
    }'
# Per case and round, a path's CPU s/GB over another's in the same
# round: this build's over the baseline's, and the link path's over
# passthrough.
awk -v cases="$CASES" -v paths="$PATHS" '
    { cpu[$1 " " $2 " " $9] = $7; rounds[$9] = 1 }
    function pair(c, p, b,   n, sa, sb, r, x, v, a, d, t, med) {
        n = 0; sa = 0; sb = 0
        for (r in rounds) if ((c " " p " " r) in cpu && (c " " b " " r) in cpu && cpu[c " " b " " r] > 0) {
            x = cpu[c " " p " " r] / cpu[c " " b " " r] - 1; v[++n] = x
            sa += cpu[c " " p " " r]; sb += cpu[c " " b " " r]
        }
        if (n == 0 || sb == 0) return
        for (a = 1; a <= n; a++) for (d = a + 1; d <= n; d++) if (v[d] < v[a]) { t = v[a]; v[a] = v[d]; v[d] = t }
        med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        printf "%-6s %s against %s, CPU s/GB per round: median %+.1f%% (%+.1f%% to %+.1f%%, %d rounds); summed %+.1f%%\n", c, p, b, 100 * med, 100 * v[1], 100 * v[n], n, 100 * (sa / sb - 1)
    }
    END {
        nc = split(cases, cs, " "); np = split(paths, ps, " ")
        for (i = 1; i <= np; i++) have[ps[i]] = 1
        for (k = 1; k <= nc; k++) {
            for (i = 1; i <= np; i++) if (ps[i] !~ /@base$/ && (ps[i] "@base") in have) pair(cs[k], ps[i], ps[i] "@base")
            if (("link" in have) && ("local" in have)) pair(cs[k], "link", "local")
        }
    }' "$results"
echo "proxy peak RSS (VmHWM): $(proxy_hwm_kib "$P_PID") KiB; RSS now: ${rss} KiB"
if [ -n "${BASELINE_BIN:-}" ]; then
    echo "baseline proxy peak RSS (VmHWM): $(proxy_hwm_kib "$Q_PID") KiB"
fi
echo "batches remapped by the proxy on link 'perf': ${remapped:-unknown}"
rm -f "$results"
