#!/usr/bin/env bash
# The proxy's main job in front of a real local Kafka, start to finish:
#   1. a destination broker B with the proxy in front of it; Kafka's console
#      producer and consumer go through the proxy, which is all they ever see;
#   2. a source broker A whose idempotent producer writes a few records;
#      `kafka-mirror-proxy replicate` copies A's batches byte for byte
#      through the proxy as mirror link "a"; DumpLogSegments shows the
#      producer id on A and the remapped one on B, and `kafka-mirror-proxy
#      unmap` reads it back;
#   3. while link a is MIRRORING, its topic is read-only for everyone else:
#      the console producer's write to `orders` is refused;
#   4. `kafka-mirror-proxy failover a`: the link goes MIRRORING -> STOPPING
#      -> STOPPED, with a barrier per partition;
#   5. the same write is now accepted and read back, and the link's
#      replicator is fenced (it stops at once with exit code 3).
# Brokers come from the cached Kafka jars (scripts/kafka-jars.sh); all
# processes stop when the script ends (KMP_KEEP=1 keeps the work folder).
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

A_ID=MkU3OEVBNTcwNTJENDM2Qk
B_ID=q1Zx7Kd8Tj2m4Wf0hYvRsA

(cd "$KMP_ROOT" && cargo build --release --quiet --bin kafka-mirror-proxy)
kmp_init
kmp_start_broker A "$A_ID"
kmp_start_broker B "$B_ID"
kmp_start_proxy P "$B_PORT" \
    MIRROR_PROXY_LINKS=a \
    MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID="$A_ID" \
    MIRROR_PROXY_LINK_A_TOPICS=orders
PROXY="127.0.0.1:$P_PORT"

echo; echo "== 1. clients through the proxy ($PROXY) =="
kmp_java org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server "$PROXY" | grep "(id:"
kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "$PROXY" --create --topic greetings --partitions 1 --replication-factor 1
printf 'hello\nfrom\nthe\nproxy\n' | kmp_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$PROXY" --topic greetings
kmp_java org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$PROXY" --topic greetings \
    --from-beginning --max-messages 4 --timeout-ms 20000

echo; echo "== 2. mirroring A -> proxy -> B =="
for port in "$A_PORT" "$B_PORT"; do
    kmp_java org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$port" --create --topic orders --partitions 1 --replication-factor 1
done
seq 1 10 | sed 's/^/order-/' | kmp_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "127.0.0.1:$A_PORT" \
    --topic orders --command-property enable.idempotence=true
# The replicator of link a (client id mirror-a, both sides' default);
# --until-caught-up returns once it copied what A held when it started. Its
# admin endpoint on a free port: the default 9191 may be taken here.
replicate=("$KMP_RELEASE/kafka-mirror-proxy" replicate --source-bootstrap-servers "127.0.0.1:$A_PORT"
    --destination-bootstrap-servers "$PROXY" --link a --topics orders --until-caught-up)
"${replicate[@]}" --admin-listen "127.0.0.1:$(kmp_free_port)"

pid_of() { kmp_java org.apache.kafka.tools.DumpLogSegments --files "$1"/data/orders-0/00000000000000000000.log \
    | grep -o 'producerId: [-0-9]*' | head -1 | awk '{print $2}'; }
A_PID=$(pid_of "$A_DIR"); B_PID=$(pid_of "$B_DIR")
echo "producer id on A: $A_PID"
echo "producer id on B: $B_PID"
echo "expected:         $("$KMP_RELEASE/kafka-mirror-proxy" map --source-cluster-id "$A_ID" --pid "$A_PID")"
MIRROR_PROXY_LINKS=a MIRROR_PROXY_LINK_A_SOURCE_CLUSTER_ID="$A_ID" MIRROR_PROXY_LINK_A_TOPICS=orders \
    "$KMP_RELEASE/kafka-mirror-proxy" unmap --pid "$B_PID"
echo; echo "records on B, read through the proxy:"
kmp_java org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$PROXY" --topic orders \
    --from-beginning --max-messages 10 --timeout-ms 20000 | tr '\n' ' '; echo

kmp() { MIRROR_PROXY_ADMIN_URL="http://127.0.0.1:$P_ADMIN" "$KMP_RELEASE/kafka-mirror-proxy" "$@"; }
local_write() { # a write to `orders` through the proxy by an ordinary client: what the tool prints
    echo "$1" | kmp_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "$PROXY" --topic orders 2>&1 || true
}

echo; echo "== 3. while link a is MIRRORING, orders is read-only for other clients =="
kmp links
out=$(local_write order-local); echo "$out"
grep -q PolicyViolationException <<<"$out" || { echo "expected the write to be refused" >&2; exit 1; }

echo; echo "== 4. failover: kafka-mirror-proxy failover a =="
kmp failover a --wait 120
echo; echo "the transition, from the proxy's log:"
grep -E "failover started|link drained|barrier placed|failover complete" "$KMP_WORK/proxy-P.log" \
    | sed -E 's/^[^ ]+ +//; s/\x1b\[[0-9;]*m//g'
kmp links

echo; echo "== 5. after failover: local writes accepted, the link's replicator fenced =="
out=$(local_write order-local); echo "${out:-console producer: order-local written, no error}"
if grep -q Exception <<<"$out"; then exit 1; fi
out=$(kmp_java org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "$PROXY" --topic orders \
    --from-beginning --max-messages 11 --timeout-ms 20000 | tr '\n' ' '); echo "$out"
grep -q order-local <<<"$out" || { echo "order-local was not read back" >&2; exit 1; }
echo order-11 | kmp_java org.apache.kafka.tools.ConsoleProducer --bootstrap-server "127.0.0.1:$A_PORT" --topic orders
echo "the link's replicator, with order-11 to copy, is fenced and stops at once with exit code 3:"
# --until-caught-up: a replicator that is not fenced copies order-11 and
# exits 0, which fails the demo rather than hanging it (so does the timeout).
rc=0
timeout 60 "${replicate[@]}" --admin-listen "127.0.0.1:$(kmp_free_port)" > "$KMP_WORK/replicator-fenced.log" 2>&1 || rc=$?
tail -3 "$KMP_WORK/replicator-fenced.log"
[ "$rc" -eq 3 ] || { cat "$KMP_WORK/replicator-fenced.log"; echo "expected exit code 3 (fenced), got $rc" >&2; exit 1; }
grep -m1 "fenced link" "$KMP_WORK/proxy-P.log" | sed -E 's/\x1b\[[0-9;]*m//g; s/^[^ ]+ +//'
