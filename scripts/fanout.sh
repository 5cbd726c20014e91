#!/usr/bin/env bash
# What everything new costs the link (issue 27), beside direct writes in the
# same run: starts one broker and the release proxy with a link `fan`
# (client id mirror-fan, topics fan-.*), and runs examples/fanout.rs
# against both (first contact, fan-out in modes A and B, many producers;
# see that file). With BASELINE_BIN, a second proxy runs that binary on its
# own state topic, and the example runs again against it, on the same
# broker, right after.
#
#   scripts/fanout.sh                                  # every case, default sizes
#   FANOUT_ARGS="--sizes 1x1,50x10 --cases 2" scripts/fanout.sh
#   BASELINE_BIN=/path/to/older/kafka-mirror-proxy scripts/fanout.sh
#   SKIP_BUILD=1 scripts/fanout.sh                     # use the release build as it is
set -euo pipefail
. "$(dirname "$0")/lib/kafka.sh"

if [ -z "${SKIP_BUILD:-}" ]; then
    (cd "$KMP_ROOT" && cargo build --release --quiet --bin kafka-mirror-proxy --example fanout)
fi
kmp_init
kmp_start_broker B q1Zx7Kd8Tj2m4Wf0hYvRsA

start() { # NAME STATE_TOPIC
    kmp_start_proxy "$1" "$B_PORT" \
        MIRROR_PROXY_LINKS=fan \
        MIRROR_PROXY_LINK_FAN_SOURCE_CLUSTER_ID=MkU3OEVBNTcwNTJENDM2Qk \
        MIRROR_PROXY_LINK_FAN_TOPICS='fan-.*' \
        MIRROR_PROXY_STATE_TOPIC="$2"
}

# shellcheck disable=SC2086
fanout() { # LABEL PROXY_PORT ADMIN PID
    local i
    # Measure from a loaded state topic (until then every link batch is
    # refused, retriable).
    for i in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$3/readyz" >/dev/null && break
        sleep 0.1
    done
    echo
    echo "== $1 (load: $(cut -d' ' -f1-3 /proc/loadavg))"
    "$KMP_RELEASE/examples/fanout" --broker "127.0.0.1:$B_PORT" --link "127.0.0.1:$2" \
        --client-id mirror-fan --admin "127.0.0.1:$3" --proxy-pid "$4" ${FANOUT_ARGS:-}
    echo "proxy peak RSS: $(awk '/^VmHWM:/ { print $2, $3 }' "/proc/$4/status")"
}

start P __mirror_state
fanout "this build" "$P_PORT" "$P_ADMIN" "$P_PID"
if [ -n "${BASELINE_BIN:-}" ]; then
    # A fresh broker: one holding both runs' topics runs out of file
    # handles (about 6,000 partitions a run).
    kill "$P_PID" "${KMP_PIDS[0]}"
    kmp_start_broker C q1Zx7Kd8Tj2m4Wf0hYvRsA
    B_PORT=$C_PORT
    KMP_PROXY_BIN=$BASELINE_BIN start Q __mirror_state_base
    fanout "baseline $BASELINE_BIN" "$Q_PORT" "$Q_ADMIN" "$Q_PID"
fi
