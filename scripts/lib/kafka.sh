# Shell helpers for the demo and benchmark scripts: start single-node KRaft
# brokers from the cached jars (scripts/kafka-jars.sh) and stop them on exit.
# Source it; it defines functions only.

KMP_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
KMP_PIDS=()
# Where `cargo build --release`, run in $KMP_ROOT, puts the binaries
# (CARGO_TARGET_DIR, relative to $KMP_ROOT unless absolute, or target/).
KMP_RELEASE=${CARGO_TARGET_DIR:-target}
[[ $KMP_RELEASE = /* ]] || KMP_RELEASE=$KMP_ROOT/$KMP_RELEASE
KMP_RELEASE=$KMP_RELEASE/release

kmp_libs() {
    "$KMP_ROOT/scripts/kafka-jars.sh"
}

kmp_java() { # CLASS ARGS...: run a Kafka tool
    local class=$1; shift
    java -Xmx512m -Dlog4j2.configurationFile="$KMP_WORK/log4j2.properties" -cp "$KMP_LIBS/*" "$class" "$@"
}

kmp_free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

kmp_require_counts() { # VAR...: exit 2 unless each names a positive whole number
    local v
    for v in "$@"; do
        [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "$v must be a positive whole number, got '${!v}'" >&2; exit 2; }
    done
}

kmp_init() { # create the work dir and fetch jars
    KMP_WORK=$(mktemp -d "${TMPDIR:-/tmp}/kafka-mirror-proxy.XXXXXX")
    KMP_LIBS=$(kmp_libs)
    cat > "$KMP_WORK/log4j2.properties" <<'PROPS'
rootLogger.level = WARN
rootLogger.appenderRef.stderr.ref = STDERR
appender.stderr.type = Console
appender.stderr.name = STDERR
appender.stderr.target = SYSTEM_ERR
appender.stderr.layout.type = PatternLayout
appender.stderr.layout.pattern = [%d] %p %m (%c)%n
PROPS
    sed 's/rootLogger.level = WARN/rootLogger.level = INFO/' "$KMP_WORK/log4j2.properties" > "$KMP_WORK/broker-log4j2.properties"
    trap kmp_cleanup EXIT INT TERM
}

kmp_cleanup() {
    local pid
    for pid in "${KMP_PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    for pid in "${KMP_PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    if [ -n "${KMP_KEEP:-}" ]; then echo "work folder kept: $KMP_WORK" >&2; else rm -rf "$KMP_WORK"; fi
}

# kmp_alive PID: a process counts as alive until it exits; an exited child
# this shell has not waited for yet is a zombie, which `kill -0` would
# still find.
kmp_alive() {
    local state
    state=$(sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [ -n "$state" ] && [ "$state" != Z ]
}

# kmp_forget PID: drop a process that is gone from the clean-up list, so the
# exit trap never signals a pid since reused by another process.
kmp_forget() {
    local kept=() p
    for p in "${KMP_PIDS[@]}"; do [ "$p" = "$1" ] || kept+=("$p"); done
    KMP_PIDS=("${kept[@]}")
}

# kmp_stop PID: SIGTERM (a clean stop: the replicator commits, MM2 stops
# its tasks), SIGKILL after 60 s; its exit code in KMP_STOPPED_RC.
kmp_stop() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 600); do kmp_alive "$pid" || break; sleep 0.1; done
    if kmp_alive "$pid"; then
        echo "process $pid did not stop in 60 s after SIGTERM: killed" >&2
        kill -KILL "$pid" 2>/dev/null || true
    fi
    KMP_STOPPED_RC=0
    wait "$pid" 2>/dev/null || KMP_STOPPED_RC=$?
    kmp_forget "$pid"
}

# kmp_start_broker NAME CLUSTER_ID: starts a broker; sets NAME_PORT and
# NAME_DIR (e.g. kmp_start_broker A MkU3OEVBNTcwNTJENDM2Qk -> $A_PORT).
# With KMP_RELAY_PORTS set (space-separated ports), the broker also has a
# listener per port that advertises that port (for a relay in front of it),
# and NAME_RELAY_TARGETS lists those listeners' own ports, in the same order.
kmp_start_broker() {
    local name=$1 cluster_id=$2 port cport dir relay rport listeners advertised protocols i=0 targets=""
    port=$(kmp_free_port); cport=$(kmp_free_port)
    dir="$KMP_WORK/broker-$name"
    mkdir -p "$dir"
    listeners="PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport"
    advertised="PLAINTEXT://127.0.0.1:$port"
    protocols="CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT"
    for relay in ${KMP_RELAY_PORTS:-}; do
        i=$((i + 1)); rport=$(kmp_free_port)
        listeners="$listeners,RELAY$i://127.0.0.1:$rport"
        advertised="$advertised,RELAY$i://127.0.0.1:$relay"
        protocols="$protocols,RELAY$i:PLAINTEXT"
        targets="$targets${targets:+ }$rport"
    done
    printf -v "${name}_RELAY_TARGETS" '%s' "$targets"
    cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$dir/data
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
    kmp_java kafka.tools.StorageTool format --cluster-id="$cluster_id" -c "$dir/server.properties" > "$dir/format.log" 2>&1 \
        || { cat "$dir/format.log" >&2; return 1; }
    java -Xmx1g -XX:+UseSerialGC -Dlog4j2.configurationFile="$KMP_WORK/broker-log4j2.properties" \
        -cp "$KMP_LIBS/*" kafka.Kafka "$dir/server.properties" > "$dir/broker.log" 2>&1 &
    KMP_PIDS+=($!)
    local i
    for i in $(seq 1 120); do
        if grep -q "Kafka Server started" "$dir/broker.log" 2>/dev/null \
            && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            printf -v "${name}_PORT" '%s' "$port"
            printf -v "${name}_DIR" '%s' "$dir"
            echo "broker $name (cluster $cluster_id) ready on 127.0.0.1:$port" >&2
            return 0
        fi
        sleep 0.5
    done
    echo "broker $name did not start; last log lines:" >&2
    tail -40 "$dir/broker.log" >&2
    return 1
}

# kmp_start_proxy NAME BROKER_PORT [VAR=VALUE...]: runs the release binary
# (or KMP_PROXY_BIN);
# sets NAME_PORT (bootstrap), NAME_ADMIN and NAME_PID (the proxy process:
# `env` execs it, so $! is the proxy).
kmp_start_proxy() {
    local name=$1 broker_port=$2; shift 2
    local listen admin
    # Default port layout: node n is served at the bootstrap port + 1 + n.
    listen=$(kmp_free_port); admin=$(kmp_free_port)
    env MIRROR_PROXY_BOOTSTRAP_SERVERS="127.0.0.1:$broker_port" \
        MIRROR_PROXY_LISTEN="127.0.0.1:$listen" \
        MIRROR_PROXY_ADMIN_LISTEN="127.0.0.1:$admin" \
        "$@" "${KMP_PROXY_BIN:-$KMP_RELEASE/kafka-mirror-proxy}" run > "$KMP_WORK/proxy-$name.log" 2>&1 &
    KMP_PIDS+=($!)
    local pid=$! i
    for i in $(seq 1 100); do
        if grep -q "proxy ready" "$KMP_WORK/proxy-$name.log"; then
            printf -v "${name}_PID" '%s' "$pid"
            printf -v "${name}_PORT" '%s' "$listen"
            printf -v "${name}_ADMIN" '%s' "$admin"
            echo "proxy $name ready on 127.0.0.1:$listen (admin 127.0.0.1:$admin)" >&2
            return 0
        fi
        sleep 0.1
    done
    cat "$KMP_WORK/proxy-$name.log" >&2
    return 1
}

# kmp_start_perf_proxy NAME BROKER_PORT [TOPIC]: kmp_start_proxy with the
# link the benchmarks use: client id mirror-perf, topic TOPIC (perf-link).
# Two proxies compared side by side get a link topic each: a batch one
# appends is new to the other, whose next connection reads it back (the
# catch-up of a writer new to the partition), which is not the cost being
# measured.
kmp_start_perf_proxy() {
    kmp_start_proxy "$1" "$2" \
        MIRROR_PROXY_LINKS=perf \
        MIRROR_PROXY_LINK_PERF_SOURCE_CLUSTER_ID=MkU3OEVBNTcwNTJENDM2Qk \
        MIRROR_PROXY_LINK_PERF_TOPICS="${3:-perf-link}"
}

# kmp_mm2_one_replica: MirrorMaker 2 settings for clusters of one broker
# each, to append to its properties: every topic MM2 creates has one
# replica (its defaults ask for three).
kmp_mm2_one_replica() {
    cat <<'PROPS'
replication.factor = 1
offset-syncs.topic.replication.factor = 1
checkpoints.topic.replication.factor = 1
heartbeats.topic.replication.factor = 1
offset.storage.replication.factor = 1
status.storage.replication.factor = 1
config.storage.replication.factor = 1
PROPS
}

# kmp_start_mm2 PROPERTIES LOG HEAP: MirrorMaker 2 (jars in $MM2_LIBS) in
# the background, its output in LOG, at most HEAP of heap (e.g. 1G); $! is
# its pid. The JVM options of Kafka's connect-mirror-maker.sh and
# kafka-run-class.sh; MM2's log at INFO, as Kafka ships it.
kmp_start_mm2() {
    java -Xms256M -Xmx"$3" -server -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -Djava.awt.headless=true -Dlog4j2.configurationFile="$KMP_WORK/broker-log4j2.properties" \
        -cp "$MM2_LIBS/*" org.apache.kafka.connect.mirror.MirrorMaker "$1" > "$2" 2>&1 &
}
