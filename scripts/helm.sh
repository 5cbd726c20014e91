#!/bin/sh
# Ensures Helm is installed (built with `go install` as a Go module, once,
# cached), prints its path on stdout with no arguments, and with arguments
# runs it: `scripts/helm.sh lint deploy/helm/kafka-mirror-proxy`. Logs go to
# stderr. CI runs on a clean clone, so the chart's lint and render steps and
# tests/helm_chart.rs get their Helm from here; only Go is required.
#
#   HELM_BIN_DIR  where the helm binary is installed
#                 (default: $HOME/.cache/kafka-mirror-proxy/helm-$HELM_VERSION)
#
# Idempotent and safe to run concurrently: the binary is built into a private
# temp folder and renamed into place only when complete.
set -eu

HELM_VERSION=v4.3.2
dir="${HELM_BIN_DIR:-${HOME:?HOME or HELM_BIN_DIR must be set}/.cache/kafka-mirror-proxy/helm-$HELM_VERSION}"
helm="$dir/helm"

if [ ! -x "$helm" ]; then
    command -v go >/dev/null 2>&1 || { echo "helm.sh: go is required to install Helm $HELM_VERSION" >&2; exit 1; }
    mkdir -p "$dir"
    work=$(mktemp -d "$dir/.install.XXXXXX")
    trap 'rm -rf "$work"' EXIT INT TERM
    echo "helm.sh: installing helm.sh/helm/v4/cmd/helm@$HELM_VERSION into $dir (one-off)" >&2
    # CGO off: a static binary, and no C toolchain needed.
    GOBIN="$work" CGO_ENABLED=0 go install "helm.sh/helm/v4/cmd/helm@$HELM_VERSION" >&2
    "$work/helm" version >/dev/null
    # mv -T fails (rather than nesting) when another caller won the race.
    mv -T "$work/helm" "$helm" 2>/dev/null || [ -x "$helm" ] || { echo "helm.sh: could not install $helm" >&2; exit 1; }
fi

if [ "$#" -eq 0 ]; then
    echo "$helm"
else
    # Keep Helm's own cache and config out of the operator's home.
    : "${HELM_CACHE_HOME:=$dir/cache}" "${HELM_CONFIG_HOME:=$dir/config}" "${HELM_DATA_HOME:=$dir/data}"
    export HELM_CACHE_HOME HELM_CONFIG_HOME HELM_DATA_HOME
    exec "$helm" "$@"
fi
