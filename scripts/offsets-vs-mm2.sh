#!/usr/bin/env bash
# Consumer groups after a failover: MirrorMaker 2's checkpoints against this
# project's exact offset translation (issue 43), in one run on this machine.
# Not run by CI.
#
#   scripts/offsets-vs-mm2.sh
#   PARTITIONS=8 ROUNDS=40 scripts/offsets-vs-mm2.sh
#   COPIERS=first scripts/offsets-vs-mm2.sh        # both copiers already running when A is written
#   MM2_ISOLATION=read_uncommitted scripts/offsets-vs-mm2.sh   # MM2's source consumer at its default
#   KMP_KEEP=1 scripts/offsets-vs-mm2.sh          # keep every log and record file
#
# 1. Three single-node KRaft brokers: the source A, MM2's destination M, and
#    B with the proxy in front of it (link `a`, topic `orders`).
# 2. A's topic `orders` (PARTITIONS, 4) is written in ROUNDS (24) rounds:
#    in each, a run of an idempotent producer's records (1 to 260 per
#    partition), then one transaction per round over every partition (1 to
#    12 records each), every fourth aborted. The markers and the aborted
#    records make the destinations' offsets drift from A's.
# 3. Eight consumer groups (drill-*) consume A with Kafka's Java consumer
#    (read_committed), each partition up to a point of its own (an old
#    commit, after a transaction, deep in a long run, around aborted
#    transactions, inside a transaction, near the end, everything), and
#    commit. With COPIERS=first both copiers run from before A is written,
#    so MM2's checkpoints see each commit as it happens.
# 4. Both copiers start: MirrorMaker 2 (Kafka's connect-mirror 4.3.1,
#    dedicated mode: MirrorSourceConnector + MirrorCheckpointConnector,
#    sync.group.offsets.enabled=true, checkpoints and group syncs every
#    SYNC_S (1) second, IdentityReplicationPolicy, offset syncs at their
#    defaults, its source consumer read_committed like the replicator's:
#    MM2_ISOLATION) into M, and `kafka-mirror-proxy replicate` (GROUPS
#    drill-.*, group sync every SYNC_S) into B through the proxy. The
#    script waits until both hold every committed record of A, at least
#    MIN_SETTLE_S (70: past MM2's 60 s offset flush, which sends its last
#    offset syncs) have passed since, and neither destination's group
#    offsets changed for STABLE_S (30).
# 5. The failover: `kafka-mirror-proxy failover a` (the replicator is
#    fenced and exits 3), MM2 is stopped. Each group then consumes on each
#    destination (B through the proxy) from its committed offset there to
#    the end, with the same group id and auto.offset.reset=earliest: a
#    partition without a commit is read from its start, so a missing
#    checkpoint shows as records re-read.
# 6. The table: per group, A's commit per partition, and per destination
#    the records re-read (consumed on A before its commit and again on the
#    destination) and skipped (consumed by the group on neither side); then
#    per partition the committed offset on each destination and the first
#    record read there. The values name the records (p<partition>-r<round>-
#    <i|c|a><index>: idempotent, committed, aborted), so records are matched
#    across clusters by value, not by offset.
#
# The exact translation must show 0 / 0 everywhere; the script exits 1 if
# this project's side re-reads or skips anything (or reads an aborted or a
# doubled record). The Kafka client side is scripts/offsets-vs-mm2/Drill.java
# (compiled here with javac against the broker's jars). Each Kafka call is
# bounded; the whole run takes about 3 to 5 minutes. One broker-backed
# thing at a time on a shared machine: this starts three brokers, MM2's
# JVM, the proxy and the replicator, and stops all of them when it ends.
set -euo pipefail
# shellcheck source=scripts/lib/kafka.sh
. "$(dirname "$0")/lib/kafka.sh"

PARTITIONS=${PARTITIONS:-4}
ROUNDS=${ROUNDS:-24}
SYNC_S=${SYNC_S:-1}
STABLE_S=${STABLE_S:-30}
MIN_SETTLE_S=${MIN_SETTLE_S:-70}
SETTLE_TIMEOUT=${SETTLE_TIMEOUT:-900}
MM2_ISOLATION=${MM2_ISOLATION:-read_committed}
COPIERS=${COPIERS:-after}
TOPIC=orders

kmp_require_counts PARTITIONS ROUNDS SYNC_S STABLE_S MIN_SETTLE_S SETTLE_TIMEOUT
[ "$ROUNDS" -ge 8 ] || { echo "ROUNDS must be at least 8 (the groups need aborted rounds on both halves)" >&2; exit 2; }
case $MM2_ISOLATION in read_committed | read_uncommitted) ;; *) echo "MM2_ISOLATION: read_committed or read_uncommitted" >&2; exit 2 ;; esac
case $COPIERS in after | first) ;; *) echo "COPIERS: after (the groups' commits) or first" >&2; exit 2 ;; esac

(cd "$KMP_ROOT" && cargo build --release --quiet --bin kafka-mirror-proxy)
KMP=$KMP_RELEASE/kafka-mirror-proxy

kmp_init
started=$(date '+%Y-%m-%d %H:%M')
load_start=$(cut -d' ' -f1 /proc/loadavg)
MM2_LIBS=$("$KMP_ROOT/scripts/kafka-jars.sh" connect-mirror)
DRILL=$KMP_WORK/drill
mkdir -p "$DRILL/classes" "$DRILL/out"
javac -cp "$KMP_LIBS/*" -d "$DRILL/classes" "$KMP_ROOT/scripts/offsets-vs-mm2/Drill.java"

# drill SECONDS MODE ARGS...: Drill.java, bounded.
drill() {
    local secs=$1; shift
    timeout --kill-after=10 "$secs" java -Xmx512m -Dlog4j2.configurationFile="$KMP_WORK/log4j2.properties" \
        -cp "$DRILL/classes:$KMP_LIBS/*" Drill "$@"
}

# The proxy's link names A's cluster id.
A_ID=MkU3OEVBNTcwNTJENDM2Qk
kmp_start_broker A "$A_ID"
kmp_start_broker M Tm1NbU1tMk1tMk1tMk1tMg
kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA
SOURCE=127.0.0.1:$A_PORT
kmp_start_proxy P "$B_PORT" \
    MIRROR_PROXY_LINKS=a \
    MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID="$A_ID" \
    MIRROR_PROXY_LINK_A_TOPICS="$TOPIC"
MM2_DEST=127.0.0.1:$M_PORT
KMP_DEST=127.0.0.1:$P_PORT

start_copiers() {
    echo "starting both copiers..." >&2
    "$KMP" replicate --source-bootstrap-servers "$SOURCE" --destination-bootstrap-servers "$KMP_DEST" \
        --link a --topics "$TOPIC" --groups 'drill-.*' --group-sync-interval-ms $((SYNC_S * 1000)) \
        --membership false --commit-interval-ms 1000 --discovery-interval-ms 5000 \
        --replication-factor 1 --admin-listen "127.0.0.1:$(kmp_free_port)" > "$KMP_WORK/replicator.log" 2>&1 &
    REPLICATOR_PID=$!
    KMP_PIDS+=("$REPLICATOR_PID")

    cat > "$KMP_WORK/mm2.properties" <<PROPS
clusters = src, dst
src.bootstrap.servers = $SOURCE
dst.bootstrap.servers = $MM2_DEST
src->dst.enabled = true
dst->src.enabled = false
src->dst.topics = $TOPIC
src->dst.groups = drill-.*
replication.policy.class = org.apache.kafka.connect.mirror.IdentityReplicationPolicy
# The checkpoint connector: checkpoints and group offsets synced every
# SYNC_S; the offset syncs it translates with (offset.lag.max and the rest)
# at their defaults.
src->dst.emit.checkpoints.enabled = true
src->dst.emit.checkpoints.interval.seconds = $SYNC_S
src->dst.sync.group.offsets.enabled = true
src->dst.sync.group.offsets.interval.seconds = $SYNC_S
src->dst.refresh.groups.interval.seconds = 5
# MM2's source consumer reads read_uncommitted unless told: it would copy
# the aborted transactions' records as ordinary ones.
src.consumer.isolation.level = $MM2_ISOLATION
PROPS
    kmp_mm2_one_replica >> "$KMP_WORK/mm2.properties"
    kmp_start_mm2 "$KMP_WORK/mm2.properties" "$KMP_WORK/mm2.log" 1G
    MM2_PID=$!
    KMP_PIDS+=("$MM2_PID")
}

drill 120 create "$SOURCE" "$TOPIC" "$PARTITIONS"
if [ "$COPIERS" = first ]; then start_copiers; fi
echo "writing A's topic $TOPIC ($PARTITIONS partitions, $ROUNDS rounds)..." >&2
drill 300 write "$SOURCE" "$TOPIC" "$PARTITIONS" "$ROUNDS" >&2
drill 300 scan "$SOURCE" "$TOPIC" "$DRILL/truth"
echo "the consumer groups consume A and commit..." >&2
drill 600 groups "$SOURCE" "$TOPIC" "$DRILL/truth" "$ROUNDS" "$DRILL/out" | tee "$DRILL/source-commits" >&2
DRILL_GROUPS=$(cut -d' ' -f1 "$DRILL/source-commits" | paste -sd, -)

if [ "$COPIERS" = after ]; then start_copiers; fi

echo "waiting for both destinations to catch up and their group offsets to settle..." >&2
if ! drill $((SETTLE_TIMEOUT + 60)) settle "$TOPIC" "$DRILL/truth" "$DRILL_GROUPS" "$STABLE_S" "$MIN_SETTLE_S" "$SETTLE_TIMEOUT" \
    mm2="$MM2_DEST" kmp="$KMP_DEST" > "$DRILL/settled" 2> "$DRILL/settle.log"; then
    tail -5 "$DRILL/settle.log" >&2
    echo "the destinations did not settle; replicator and MM2 logs end:" >&2
    tail -20 "$KMP_WORK/replicator.log" >&2; tail -20 "$KMP_WORK/mm2.log" >&2
    exit 1
fi
tail -1 "$DRILL/settle.log" >&2
kmp_alive "$REPLICATOR_PID" || { echo "the replicator exited early:" >&2; tail -20 "$KMP_WORK/replicator.log" >&2; exit 1; }
kmp_alive "$MM2_PID" || { echo "MM2 exited early:" >&2; tail -20 "$KMP_WORK/mm2.log" >&2; exit 1; }
# MM2's own account of its replication consumer's isolation level (its
# connector logs every client's configuration).
mm2_isolation=$(awk '/ConsumerConfig values/ { mine = 0 }
    /\tclient.id = .*replication-consumer/ { mine = 1 }
    mine && /\tisolation.level = / { print $3; exit }' "$KMP_WORK/mm2.log")
[ "$mm2_isolation" = "$MM2_ISOLATION" ] \
    || echo "warning: MM2's replication consumer reads ${mm2_isolation:-(not found in its log)}, not $MM2_ISOLATION" >&2

# The failover: the link is fenced and its barriers placed. A replicator
# with nothing left to copy sends no Produce, so it does not meet the fence
# (exit 3) by itself: it is stopped (SIGTERM, exit 0), and so is MM2.
echo "failover: kafka-mirror-proxy failover a; the replicator and MM2 stopped..." >&2
MIRROR_PROXY_ADMIN_URL=http://127.0.0.1:$P_ADMIN "$KMP" failover a --wait 120 > "$KMP_WORK/failover.log" 2>&1 \
    || { cat "$KMP_WORK/failover.log" >&2; exit 1; }
kmp_stop "$REPLICATOR_PID"
case $KMP_STOPPED_RC in 0 | 3) ;; *) echo "warning: the replicator exited $KMP_STOPPED_RC" >&2 ;; esac
kmp_stop "$MM2_PID"
case $KMP_STOPPED_RC in 0 | 143) ;; *) echo "note: MM2 exited $KMP_STOPPED_RC when stopped" >&2 ;; esac

echo "each group consumes on each destination from its committed offset there..." >&2
drill 600 failover "$MM2_DEST" "$TOPIC" "$DRILL_GROUPS" "$DRILL/out" mm2
drill 600 failover "$KMP_DEST" "$TOPIC" "$DRILL_GROUPS" "$DRILL/out" kmp
drill 120 report "$DRILL/truth" "$DRILL_GROUPS" "$DRILL/out" mm2="MirrorMaker 2" kmp="this project" > "$DRILL/report"

# The source log in numbers, beside the table; the versions from the jars.
kafka_version=$(find "$KMP_LIBS" -name 'kafka_2.13-*.jar' -printf '%f\n' | sed 's/^kafka_2\.13-//; s/\.jar$//' | head -1)
mm2_version=$(find "$MM2_LIBS" -name 'connect-mirror-[0-9]*.jar' -printf '%f\n' | sed 's/^connect-mirror-//; s/\.jar$//' | head -1)
records=$(wc -l < "$DRILL/truth")
partitions=$(cut -d' ' -f1 "$DRILL/truth" | sort -u | wc -l)
echo
echo "Consumer groups after a failover, $started (took $((SECONDS / 60)) min $((SECONDS % 60)) s; load average $load_start at start, $(cut -d' ' -f1 /proc/loadavg) at end)."
echo "A: topic $TOPIC, $partitions partitions, $records committed records in $ROUNDS rounds of idempotent runs and transactions (every 4th aborted)."
echo "Brokers: Kafka $kafka_version. MirrorMaker 2 $mm2_version into M (source consumer $MM2_ISOLATION, checkpoints and group syncs every $SYNC_S s, offset syncs at their defaults);"
echo "this project: kafka-mirror-proxy replicate into B through the proxy (group sync every $SYNC_S s), then kafka-mirror-proxy failover a."
echo "Each group then consumed each destination from its committed offset there (auto.offset.reset=earliest: no commit = from the start)."
echo
cat "$DRILL/report"
if grep -q '^this project: .* did not resume' "$DRILL/report"; then
    echo "this project's translation re-read or skipped records: a bug (KMP_KEEP=1 keeps the record files)" >&2
    exit 1
fi
