#!/bin/sh
# Ensures the Apache Kafka jars named by scripts/kafka/pom.xml (a KRaft broker,
# Kafka's command-line tools and a log4j2 binding) sit in one classpath folder,
# and prints that folder's path on stdout. Logs go to stderr.
#
#   scripts/kafka-jars.sh                  the broker and tools (4.4.0)
#   scripts/kafka-jars.sh connect-mirror   MirrorMaker 2 (connect-mirror 4.3.1,
#                                          scripts/kafka/connect-mirror/pom.xml),
#                                          in a folder of its own so its older
#                                          jars never mix with the broker's
#
#   KAFKA_JARS_DIR  parent of the libs folder
#                   (default: $HOME/.cache/kafka-mirror-proxy/kafka-4.4.0,
#                   or .../connect-mirror-4.3.1)
#
# Idempotent and safe to run concurrently: jars are fetched into a private temp
# folder that is renamed into place only when complete, so a caller never sees
# a half-filled libs folder.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
case "${1:-kafka}" in
    kafka)
        pom="$here/kafka/pom.xml"; default=kafka-4.4.0
        expect="kafka_2.13-*.jar kafka-tools-*.jar" ;;
    connect-mirror)
        pom="$here/kafka/connect-mirror/pom.xml"; default=connect-mirror-4.3.1
        expect="connect-mirror-4.3.1.jar" ;;
    *) echo "kafka-jars.sh: unknown set $1 (kafka, connect-mirror)" >&2; exit 2 ;;
esac
dir="${KAFKA_JARS_DIR:-${HOME:?HOME or KAFKA_JARS_DIR must be set}/.cache/kafka-mirror-proxy/$default}"
libs="$dir/libs"

# The marker is written last, before the rename, so its presence means complete.
if [ -f "$libs/.complete" ]; then
    echo "$libs"
    exit 0
fi

command -v mvn >/dev/null 2>&1 || { echo "kafka-jars.sh: mvn (Maven) is required to fetch the Kafka jars" >&2; exit 1; }
mkdir -p "$dir"
work=$(mktemp -d "$dir/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

echo "kafka-jars.sh: fetching Kafka jars into $libs (one-off)" >&2
# Run Maven on a copy of the pom so nothing (target/) is written into the repo.
cp "$pom" "$work/pom.xml"
mvn -q -B -Dstyle.color=never -f "$work/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$work/libs" >&2
# $expect holds glob patterns: unquoted on purpose, so they expand.
# shellcheck disable=SC2086
for jar in $expect; do ls "$work/libs"/$jar >/dev/null; done
touch "$work/libs/.complete"

# A libs folder without the marker is debris from an interrupted older layout.
if [ -d "$libs" ] && [ ! -f "$libs/.complete" ]; then
    rm -rf "$libs"
fi
# mv -T renames onto the exact path, failing (rather than nesting) if another
# caller won the race; then its complete copy is used and ours is discarded.
if ! mv -T "$work/libs" "$libs" 2>/dev/null; then
    [ -f "$libs/.complete" ] || { echo "kafka-jars.sh: could not install $libs" >&2; exit 1; }
fi
echo "kafka-jars.sh: $(ls "$libs" | wc -l | tr -d ' ') jars in $libs" >&2
echo "$libs"
