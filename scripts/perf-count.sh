#!/usr/bin/env bash
# The proxy's own work per Produce request, counted in instructions by
# callgrind: repeatable where CPU seconds on a shared machine are not (the
# broker and the producer run on the same cores). One broker; this build
# and, with BASELINE_BIN, an older one, each under `valgrind --tool=callgrind`,
# and the bare relay (examples/tcp_relay.rs) likewise; examples/fixed_load.rs
# sends the same REQUESTS Produce requests (one 16 KiB batch each, one at a
# time) through each, as a link (every batch remapped) and as a plain
# client (passthrough). Counters are zeroed before and dumped after each
# run, so start-up is not counted. Prints instructions per request and the
# ratio of each build to the baseline.
#
# Counts leave out the kernel (TCP copies, epoll): what the proxy's own code
# costs. The kernel's share is in scripts/perf.sh's CPU split.
#
#   scripts/perf-count.sh                       # REQUESTS=1000
#   BASELINE_BIN=/path/to/older/kafka-mirror-proxy ROUNDS=2 scripts/perf-count.sh
#   IN_FLIGHT=5 scripts/perf-count.sh           # pipelined, as a producer's max.in.flight
#   CACHE_SIM=1 scripts/perf-count.sh           # also L1 instruction-cache misses
#
# CACHE_SIM=1 has callgrind simulate a 32 KiB, 8-way L1 instruction cache
# (and a 48 KiB L1d, a 2 MiB LL) and adds each run's L1i misses a request:
# how much code a request runs from, which instruction counts do not show
# (fewer instructions spread over more cache lines can cost more). About
# twice as slow.
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

REQUESTS=${REQUESTS:-1000}
# Requests sent before the oldest one's response is read (1: one at a time).
IN_FLIGHT=${IN_FLIGHT:-1}
ROUNDS=${ROUNDS:-1}
CACHE_SIM=${CACHE_SIM:-0}
SIM=()
[ "$CACHE_SIM" = 1 ] && SIM=(--cache-sim=yes --I1=32768,8,64 --D1=49152,12,64 --LL=2097152,16,64)
command -v valgrind >/dev/null || { echo "valgrind is not installed" >&2; exit 1; }

(cd "$KMP_ROOT" && cargo build --release --quiet && cargo build --release --quiet --example tcp_relay --example fixed_load)
kmp_init
R_PORT=$(kmp_free_port)
KMP_RELAY_PORTS="$R_PORT" kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA
R_TARGET=$B_RELAY_TARGETS
for t in perf-link perf-link-base perf-local; do
    kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$B_PORT" \
        --create --topic "$t" --partitions 1 --replication-factor 1 >/dev/null
done

# grind NAME COMMAND...: run COMMAND under callgrind in the background.
grind() {
    local name=$1; shift
    valgrind --tool=callgrind ${SIM[@]+"${SIM[@]}"} --callgrind-out-file="$KMP_WORK/$name.out" "$@" 2>"$KMP_WORK/$name.log" &
    KMP_PIDS+=($!)
    eval "${name}_PID=$!"
}
# proxy NAME BIN TOPIC: a proxy under callgrind with link `perf` over TOPIC
# (one each: a batch one proxy appends would be new to the other, whose
# next connection reads it back, a cost that is not the one measured).
proxy() {
    local port admin
    port=$(kmp_free_port); admin=$(kmp_free_port)
    MIRROR_PROXY_BOOTSTRAP_SERVERS=127.0.0.1:$B_PORT MIRROR_PROXY_LISTEN=127.0.0.1:$port \
        MIRROR_PROXY_ADMIN_LISTEN=127.0.0.1:$admin MIRROR_PROXY_LINKS=perf \
        MIRROR_PROXY_LINK_PERF_SOURCE_CLUSTER_ID=MkU3OEVBNTcwNTJENDM2Qk \
        MIRROR_PROXY_LINK_PERF_TOPICS="$3" RUST_LOG=warn \
        grind "$1" "$2" run
    eval "${1}_PORT=$port ${1}_TOPIC=$3"
    for _ in $(seq 300); do
        curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null && return 0
        sleep 1
    done
    echo "proxy $1 never became ready" >&2; cat "$KMP_WORK/$1.log" >&2; exit 1
}

proxy new "$KMP_RELEASE/kafka-mirror-proxy" perf-link
PATHS="new"
if [ -n "${BASELINE_BIN:-}" ]; then
    proxy base "$BASELINE_BIN" perf-link-base
    PATHS="new base"
fi
grind relay "$KMP_RELEASE/examples/tcp_relay" "127.0.0.1:$R_PORT" "127.0.0.1:$R_TARGET"
relay_PORT=$R_PORT
sleep 5

# count NAME CLIENT_ID TOPIC PID LABEL -> instructions for REQUESTS requests
# and, with CACHE_SIM=1, their L1i misses (the fourth event counted)
# (the profile is kept as $KMP_WORK/LABEL.callgrind; KMP_KEEP=1 keeps the
# folder, for callgrind_annotate).
count() {
    local pid port out
    pid=$(eval echo "\$${1}_PID"); port=$(eval echo "\$${1}_PORT")
    callgrind_control -z "$pid" >/dev/null 2>&1
    if ! "$KMP_RELEASE/examples/fixed_load" "127.0.0.1:$port" "$3" "$2" "$REQUESTS" --pid "$4" --in-flight "$IN_FLIGHT"; then
        echo "the load through $1 failed" >&2
        return 1
    fi
    callgrind_control -d "$pid" >/dev/null 2>&1
    out=$(ls -t "$KMP_WORK/$1.out"* | head -1)
    awk '/^(summary|totals):/ { print $2, ($5 == "" ? 0 : $5); exit }' "$out"
    mv "$out" "$KMP_WORK/$5.callgrind"
}

# Warm-up: connections, metadata, the link's first origin resolved. Every
# link run is a new producer id (a replicator's retry of old sequences
# would be refused as out of order).
pid=1000
for p in $PATHS; do
    count "$p" mirror-perf "$(eval echo "\$${p}_TOPIC")" $((pid += 1)) "warm-$p-link" >/dev/null
    count "$p" perf-client perf-local -1 "warm-$p-local" >/dev/null
done
count relay perf-client perf-local -1 warm-relay >/dev/null

printf '%-6s %-6s %5s %16s %14s %14s\n' path kind round instructions per_request l1i_miss_req
results=()
for r in $(seq "$ROUNDS"); do
    for p in $PATHS relay; do
        for kind in link local; do
            [ "$p" = relay ] && [ "$kind" = link ] && continue
            case $kind in
                link) pid=$((pid + 1)); n=$(count "$p" mirror-perf "$(eval echo "\$${p}_TOPIC")" "$pid" "$p-$kind-$r") ;;
                local) n=$(count "$p" perf-client perf-local -1 "$p-$kind-$r") ;;
            esac
            read -r n miss <<<"$n"
            printf '%-6s %-6s %5s %16s %14s %14s\n' "$p" "$kind" "$r" "$n" $((n / REQUESTS)) $((miss / REQUESTS))
            results+=("$p $kind $n $miss")
        done
    done
done
if [ -n "${BASELINE_BIN:-}" ]; then
    printf '%s\n' "${results[@]}" | awk -v r="$REQUESTS" -v sim="$CACHE_SIM" '
        { sum[$1 " " $2] += $3; miss[$1 " " $2] += $4; n[$1 " " $2]++ }
        END {
            for (k in sum) { avg[k] = sum[k] / n[k]; mavg[k] = miss[k] / n[k] }
            split("link local", kinds, " ")
            for (i = 1; i <= 2; i++) {
                k = kinds[i]
                printf "%s: this build %.0f instructions a request, baseline %.0f: %+.1f%%\n",
                    k, avg["new " k] / r, avg["base " k] / r, (avg["new " k] / avg["base " k] - 1) * 100
                if (sim == 1)
                    printf "%s: this build %.0f L1i misses a request, baseline %.0f: %+.1f%%\n",
                        k, mavg["new " k] / r, mavg["base " k] / r, (mavg["new " k] / mavg["base " k] - 1) * 100
            }
            printf "bare relay: %.0f instructions a request\n", avg["relay local"] / r
            if (sim == 1) printf "bare relay: %.0f L1i misses a request\n", mavg["relay local"] / r
        }'
fi
