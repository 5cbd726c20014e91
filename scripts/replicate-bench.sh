#!/usr/bin/env bash
# The replicator against MirrorMaker 2 (issue 42), every path in one run on
# this machine. A source broker S and a destination broker D; per path and
# round, a topic of its own (PARTITIONS partitions) is created on both, S is
# filled by Kafka's ProducerPerformance (RECORDS records of RECORD_SIZE
# bytes, acks=all, idempotent: the producer ids the proxy remaps), and the
# path copies it to D:
#   replicator        `kafka-mirror-proxy replicate` into the proxy (link
#                     `perf`) in front of D, all on this machine
#   replicator-relay  the same, reading S through examples/delay_relay.rs,
#                     which delays each direction by DELAY_MS (25): a 50 ms
#                     round trip to the source (S advertises the relay on a
#                     listener of its own, so clients stay on it)
#   mm2               MirrorMaker 2 (Kafka's connect-mirror 4.3.1, dedicated
#                     mode, defaults, IdentityReplicationPolicy so the topic
#                     keeps its name), straight into D
#   mm2-relay         the same, reading S through the relay
#   perf              no copy: ProducerPerformance writing the same records
#                     straight into D, the reference rate
# Paths run one after another, in PATHS order, ROUNDS times; the table gives
# the median of the rounds.
#
# The copy rate is the record bytes (RECORDS x RECORD_SIZE, MB = 10^6 bytes)
# over the time from the first record seen on D until D's end offsets reach
# S's, partition by partition (examples/copy_watch.rs, polling every 50 ms).
# Start-up before the first record (a JVM, MM2's internal topics and tasks)
# is not counted. CPU s/GB is the user + system time (/proc/PID/stat) the
# copying processes spent in that window over the bytes copied: the
# replicator and the proxy together; MM2's JVM. The relay is the network,
# not counted. The destination topic is created by this script, with the
# source's partition count, before every copy (the new replicator and MM2
# would create it themselves), so every path writes into the same kind of
# empty topic.
#
#   scripts/replicate-bench.sh                      # every path, 8 partitions, 200,000 x 1 KiB
#   PATHS="replicator mm2 perf" ROUNDS=3 scripts/replicate-bench.sh
#   PARTITIONS=1000 PATHS="replicator replicator-relay" scripts/replicate-bench.sh
#   BASE_REPLICATOR=/path/to/7939d1f/examples/replicator PATHS="replicator example mm2 perf" scripts/replicate-bench.sh
#
# PARTITIONS=1000 (or any count, or a list) also runs the same paths at 8
# partitions, the reference of the scale goal (1,000 partitions at least
# 0.8x the 8-partition rate in bytes). RECORDS counts the records of one
# copy at every partition count.
#
# The replicator runs `REPLICATOR_BIN replicate` (the release binary); the
# paths `example` and `example-relay` run the previous build's replicator,
# `BASE_REPLICATOR` (the example of 7939d1f: one partition at a time, one
# batch per request, --mode follow). Each runs until this script
# stops it with SIGTERM once D holds every record. MM2's jars are fetched
# once into their own cache folder (`scripts/kafka-jars.sh connect-mirror`).
# COPY_TIMEOUT (600 s) bounds each copy; KMP_KEEP=1 keeps the work folder
# (logs of every broker, copier and watcher).
#
# On a shared 2-core machine both brokers, the copier and the proxy compete
# for the cores: compare paths within one run, as ratios.
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

RECORDS=${RECORDS:-200000}
RECORD_SIZE=${RECORD_SIZE:-1024}
PARTITIONS=${PARTITIONS:-8}
ROUNDS=${ROUNDS:-1}
PATHS=${PATHS:-replicator replicator-relay mm2 mm2-relay perf}
DELAY_MS=${DELAY_MS:-25}
BASE_REPLICATOR=${BASE_REPLICATOR:-}
COPY_TIMEOUT=${COPY_TIMEOUT:-600}

kmp_require_counts RECORDS RECORD_SIZE ROUNDS DELAY_MS COPY_TIMEOUT
for p in $PARTITIONS; do
    [[ $p =~ ^[1-9][0-9]*$ ]] || { echo "PARTITIONS: not a partition count: $p" >&2; exit 2; }
done
# The 8-partition case is the reference of the scale goal: always measured.
case " $PARTITIONS " in *" 8 "*) ;; *) PARTITIONS="8 $PARTITIONS" ;; esac
for path in $PATHS; do
    case $path in
        replicator | replicator-relay | example | example-relay | mm2 | mm2-relay | perf) ;;
        *) echo "unknown path $path (replicator replicator-relay example example-relay mm2 mm2-relay perf)" >&2; exit 2 ;;
    esac
done
wants() { case " $PATHS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }
wants_any() { local p; for p in "$@"; do wants "$p" && return 0; done; return 1; }
if wants_any example example-relay && [ ! -x "$BASE_REPLICATOR" ]; then
    echo "the example paths need BASE_REPLICATOR: the previous build's examples/replicator" >&2
    exit 2
fi

examples=(--example delay_relay --example copy_watch)
(cd "$KMP_ROOT" && cargo build --release --quiet --bin kafka-mirror-proxy "${examples[@]}")
REPLICATOR_BIN=${REPLICATOR_BIN:-$KMP_RELEASE/kafka-mirror-proxy}

kmp_init
# Other work on the machine moves every figure: the load is printed with them.
load_start=$(cut -d' ' -f1 /proc/loadavg)
if wants_any mm2 mm2-relay; then
    MM2_LIBS=$("$KMP_ROOT/scripts/kafka-jars.sh" connect-mirror)
fi

# Every Kafka tool call is bounded: a tool that hangs (a broker gone
# wrong) ends the run instead of holding it forever.
export KMP_WORK KMP_LIBS
export -f kmp_java
bounded_java() { # SECONDS CLASS ARGS...
    local secs=$1; shift
    timeout --kill-after=10 "$secs" bash -c 'kmp_java "$@"' kmp_java "$@"
}

cpu_seconds() { # PID: utime + stime so far, in seconds
    sed 's/^.*) //' "/proc/$1/stat" | awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($12 + $13) / hz }'
}

# The proxy's link expects this source cluster id (kmp_start_perf_proxy).
S_ID=MkU3OEVBNTcwNTJENDM2Qk
D_ID=q1Zx7Kd8Tj2m4Wf0hYvRsA
RELAY_PORT=$(kmp_free_port)
KMP_RELAY_PORTS=$RELAY_PORT kmp_start_broker S "$S_ID"
kmp_start_broker D "$D_ID"
SOURCE=127.0.0.1:$S_PORT
DEST=127.0.0.1:$D_PORT
FAR_SOURCE=127.0.0.1:$RELAY_PORT

if wants_any replicator-relay example-relay mm2-relay; then
    "$KMP_RELEASE/examples/delay_relay" "$FAR_SOURCE" "127.0.0.1:$S_RELAY_TARGETS" "$DELAY_MS" 2>"$KMP_WORK/relay.log" &
    KMP_PIDS+=($!)
    for _ in $(seq 1 100); do grep -q "delay relay ready" "$KMP_WORK/relay.log" && break; sleep 0.1; done
    grep -q "delay relay ready" "$KMP_WORK/relay.log" || { cat "$KMP_WORK/relay.log" >&2; exit 1; }
fi
if wants_any replicator replicator-relay example example-relay; then
    # Link `perf` (client id mirror-perf) covers the replicator paths' topics.
    kmp_start_perf_proxy P "$D_PORT" 'rb-.*-(replicator|example).*'
fi

create_topic() { # BOOTSTRAP TOPIC PARTITIONS
    bounded_java 300 org.apache.kafka.tools.TopicCommand --bootstrap-server "$1" \
        --create --topic "$2" --partitions "$3" --replication-factor 1 >/dev/null
}
write_records() { # BOOTSTRAP TOPIC RECORDS: ProducerPerformance, acks=all, idempotent
    bounded_java "$COPY_TIMEOUT" org.apache.kafka.tools.ProducerPerformance --topic "$2" \
        --num-records "$3" --record-size "$RECORD_SIZE" --throughput -1 --bootstrap-server "$1" \
        --command-property acks=all enable.idempotence=true client.id=rb-writer \
        > "$KMP_WORK/$2.producer.log" 2>&1 \
        || { tail -20 "$KMP_WORK/$2.producer.log" >&2; return 1; }
}

# start_copier PATH TOPIC LOG: starts the path's copier in the background
# (its pid is $!: each is exec'd directly, so it is the copying process).
start_copier() {
    local path=$1 topic=$2 log=$3 from=$SOURCE
    case $path in *-relay) from=$FAR_SOURCE ;; esac
    case $path in
        replicator*)
            "$REPLICATOR_BIN" replicate --source-bootstrap-servers "$from" \
                --destination-bootstrap-servers "127.0.0.1:$P_PORT" --link perf \
                --topics "$topic" --admin-listen "127.0.0.1:$(kmp_free_port)" > "$log" 2>&1 &
            ;;
        example*)
            # The previous build: the example replicator of 7939d1f.
            "$BASE_REPLICATOR" --source "$from" --destination "127.0.0.1:$P_PORT" \
                --topics "$topic" --client-id mirror-perf --mode follow > "$log" 2>&1 &
            ;;
        mm2*)
            # A source alias per copy: MM2 names its internal topics (configs,
            # offsets, status, checkpoints) after it, so no copy resumes
            # another's connectors or offsets.
            local alias=src${topic//[^0-9a-z]/}
            cat > "$log.properties" <<PROPS
clusters = $alias, dst
$alias.bootstrap.servers = $from
dst.bootstrap.servers = $DEST
$alias->dst.enabled = true
$alias->dst.topics = $topic
dst->$alias.enabled = false
replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
PROPS
            kmp_mm2_one_replica >> "$log.properties"
            kmp_start_mm2 "$log.properties" "$log" 2G
            ;;
    esac
}

results=$KMP_WORK/results
: > "$results"
failed=0

# run_path ROUND PARTITIONS PATH: one copy (or, for perf, one direct write);
# appends "PARTITIONS PATH ROUND seconds cpu_seconds" to $results.
run_path() {
    local round=$1 parts=$2 path=$3 topic watch wpid cpid="" rc=0 line seconds cpu total="-" pids=()
    topic=rb-r$round-p$parts-$path
    watch=$KMP_WORK/$topic.watch
    # Called as `run_path ... || failed=...`, where errexit does not apply:
    # each step fails the path explicitly.
    create_topic "$DEST" "$topic" "$parts" || return 1
    if [ "$path" != perf ]; then
        create_topic "$SOURCE" "$topic" "$parts" || return 1
        echo "round $round, $parts partitions, $path: writing the source..." >&2
        write_records "$SOURCE" "$topic" "$RECORDS" || return 1
    fi
    # What the watcher counts: the copier (its pid written to the pid file
    # once started), and for the replicator the proxy too. The perf path is
    # timed only; its producer is not a copier.
    local target=(--source "$SOURCE" --pid-file "$watch.pid")
    case $path in
        replicator* | example*) pids=(--pids "$P_PID") ;;
        perf) target=(--records "$RECORDS") ;;
    esac
    "$KMP_RELEASE/examples/copy_watch" --destination "$DEST" --topic "$topic" "${target[@]}" \
        "${pids[@]}" --timeout-s "$COPY_TIMEOUT" > "$watch" 2> "$watch.log" &
    wpid=$!
    KMP_PIDS+=("$wpid")
    for _ in $(seq 1 600); do
        grep -q '^ready' "$watch.log" && break
        kmp_alive "$wpid" || break
        sleep 0.1
    done
    if ! grep -q '^ready' "$watch.log"; then
        echo "copy_watch did not get ready:" >&2; cat "$watch.log" >&2
        kmp_stop "$wpid"; return 1
    fi
    echo "round $round, $parts partitions, $path: copying..." >&2
    if [ "$path" = perf ]; then
        # The reference: the same records written straight into D; the
        # watcher times it the same way (first record to the last).
        write_records "$DEST" "$topic" "$RECORDS" || rc=$?
    else
        start_copier "$path" "$topic" "$KMP_WORK/$topic.copier.log"
        cpid=$!
        KMP_PIDS+=("$cpid")
        echo "$cpid" > "$watch.pid.tmp" && mv "$watch.pid.tmp" "$watch.pid"
        # The watcher ends by itself (done, or COPY_TIMEOUT); a copier that
        # dies meanwhile ends the wait at once.
        while kmp_alive "$wpid"; do
            if ! kmp_alive "$cpid"; then
                echo "the $path copier exited before the copy was done; its log:" >&2
                tail -30 "$KMP_WORK/$topic.copier.log" >&2
                rc=1
                break
            fi
            sleep 0.2
        done
    fi
    if [ "$rc" = 0 ]; then
        wait "$wpid" || rc=$?
        kmp_forget "$wpid"
    else
        kmp_stop "$wpid"
    fi
    if [ -n "$cpid" ]; then
        kmp_alive "$cpid" && total=$(cpu_seconds "$cpid")
        kmp_stop "$cpid"
    fi
    if [ "$rc" != 0 ]; then
        echo "round $round, $parts partitions, $path: FAILED" >&2; cat "$watch.log" >&2
        return 1
    fi
    line=$(cat "$watch")
    seconds=$(sed -n 's/.*seconds=\([0-9.]*\) cpu_seconds.*/\1/p' <<<"$line")
    cpu=$(sed -n 's/.*cpu_seconds=\([-0-9.]*\).*/\1/p' <<<"$line")
    [ "$path" = perf ] && cpu=-
    echo "$parts $path $round $seconds $cpu" >> "$results"
    awk -v r="$round" -v n="$parts" -v p="$path" -v s="$seconds" -v c="$cpu" -v t="$total" \
        -v bytes=$((RECORDS * RECORD_SIZE)) 'BEGIN {
        printf "round %s, %s partitions, %s: %.1f s, %.1f MB/s", r, n, p, s, bytes / 1e6 / s
        if (c != "-") printf ", CPU %.2f s (%.1f s/GB)", c, c / (bytes / 1e9)
        if (t != "-") printf "; the copier'"'"'s own CPU since its start %.1f s", t
        printf "\n"
    }' >&2
}

# Warm-up: both brokers' JVMs take their first writes here, not in the
# first path measured.
echo "warm-up..." >&2
for b in "$SOURCE" "$DEST"; do
    create_topic "$b" rb-warmup 8
    write_records "$b" rb-warmup 50000
done

for round in $(seq 1 "$ROUNDS"); do
    for parts in $PARTITIONS; do
        for path in $PATHS; do
            run_path "$round" "$parts" "$path" || failed=$((failed + 1))
        done
    done
done

replicator="$REPLICATOR_BIN replicate"
echo
echo "One topic copied from S to D: $RECORDS records of $RECORD_SIZE bytes ($(awk -v b=$((RECORDS * RECORD_SIZE)) 'BEGIN { printf "%.1f", b / 1e6 }') MB) written"
echo "by an idempotent producer; -relay: S across a $((2 * DELAY_MS)) ms round trip; median of $ROUNDS round(s)."
echo "replicator: $replicator, into the proxy; CPU: replicator + proxy. mm2: MirrorMaker 2 4.3.1; CPU: its JVM."
echo "MB/s from the first record on D until D holds every record; CPU s/GB over the same window."
echo "Load average (1 min) $load_start at start, $(cut -d' ' -f1 /proc/loadavg) at end; the run took $((SECONDS / 60)) min $((SECONDS % 60)) s."
awk -v bytes=$((RECORDS * RECORD_SIZE)) -v parts="$PARTITIONS" -v paths="$PATHS" '
    function median(list,   n, a, i, j, t) {
        n = split(list, a, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
        return (n % 2) ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { k = $1 " " $2; secs[k] = secs[k] " " $4; if ($5 != "-") cpu[k] = cpu[k] " " $5 }
    function rate(k) { return (k in secs) ? bytes / 1e6 / median(secs[k]) : 0 }
    function gb(k) { return (k in cpu) ? median(cpu[k]) / (bytes / 1e9) : -1 }
    function ratio(a, b) { return (a > 0 && b > 0) ? sprintf("%.2fx", a / b) : "-" }
    END {
        printf "%-10s %-17s %8s %9s %12s %11s %15s\n", "partitions", "path", "MB/s", "CPU s/GB", "rate vs MM2", "CPU vs MM2", "rate vs perf"
        np = split(parts, ps, " "); nq = split(paths, qs, " ")
        for (i = 1; i <= np; i++) for (j = 1; j <= nq; j++) {
            k = ps[i] " " qs[j]; m = ps[i] " " (qs[j] ~ /-relay$/ ? "mm2-relay" : "mm2")
            if (!(k in secs)) { printf "%-10s %-17s %8s\n", ps[i], qs[j], "failed"; continue }
            printf "%-10s %-17s %8.1f %9s %12s %11s %15s\n", ps[i], qs[j], rate(k),
                (gb(k) < 0 ? "-" : sprintf("%.1f", gb(k))),
                (qs[j] == "perf" ? "-" : ratio(rate(k), rate(m))),
                (qs[j] == "perf" ? "-" : ratio(gb(k), gb(m))),
                ratio(rate(k), rate(ps[i] " perf"))
        }
        # The goals beside the table: across the relay against the same
        # path on one machine, and each partition count against 8.
        for (i = 1; i <= np; i++) for (j = 1; j <= nq; j++) {
            k = ps[i] " " qs[j]; same = ps[i] " " substr(qs[j], 1, length(qs[j]) - 6)
            if (qs[j] ~ /-relay$/ && (k in secs) && (same in secs))
                printf "%s partitions, %s: across the relay / same machine %s\n", ps[i], substr(qs[j], 1, length(qs[j]) - 6), ratio(rate(k), rate(same))
        }
        for (i = 1; i <= np; i++) for (j = 1; j <= nq; j++) {
            k = ps[i] " " qs[j]
            if (ps[i] != 8 && (k in secs) && (("8 " qs[j]) in secs))
                printf "%s: %s partitions / 8 partitions, rate in bytes %s\n", qs[j], ps[i], ratio(rate(k), rate("8 " qs[j]))
        }
    }' "$results"
[ "$failed" = 0 ] || { echo "$failed copies failed (KMP_KEEP=1 keeps their logs)" >&2; exit 1; }
