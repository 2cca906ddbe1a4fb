#!/usr/bin/env bash
# Restore throughput of `citrine restore` one record a write
# (--disable-batch-writes --parallel 32, the old path) against batch write
# commands (the default: --batch-size 128, --max-async-batches 32), same
# run, alternating, ROUNDS rounds. RECORDS records (bins OBJECT, written by
# `citrine bench -w insert`) are backed up once from a citrined, then the
# file is restored into namespace bar (truncated and empty before each run)
# of that citrined and of the reference server (../shared/reference, if
# present). Each line: the tool's summary (records/s, MB/s of file text),
# the server's CPU per record (/proc/PID/stat) and the tool's own
# (/usr/bin/time).
# Release build expected (cargo build --release -p citrine-server -p citrine-cli).
# Ports BASE .. BASE+22 (default 4630).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
RECORDS=${RECORDS:-300000}
OBJECT=${OBJECT:-I,S:100,B:200}
ROUNDS=${ROUNDS:-3}
BASE=${BASE:-4630}
DIR=$(mktemp -d)
REFERENCE=${REFERENCE:-}
if [ -z "$REFERENCE" ]; then
    for up in .. ../..; do
        candidate="$up/shared/reference/aerospike-ce-8.1.2/run.sh"
        [ -f "$candidate" ] && REFERENCE=$candidate && break
    done
fi
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
info() { "$BIN/citrine" info -h "127.0.0.1:$1" -v "$2" 2>/dev/null; }
stat_of() { info "$1" "$2" | tr ';:' '\n\n' | sed -n "s/^$3=//p" | head -1; }
timed() { /usr/bin/time -f "%U %S" -o "$DIR/tool-time" "$BIN/citrine" "$@"; }
tool_cpu() { awk -v n="$RECORDS" '{printf "%.2f", ($1 + $2) * 1e6 / n}' "$DIR/tool-time"; }
cpu_per_record() { echo "scale=2; ($2 - $1) * 1000000 / $(getconf CLK_TCK) / $RECORDS" | bc; }
restore() { # name port pid mode args...
    local name=$1 port=$2 pid=$3 mode=$4 before after line
    shift 4
    info "$port" "truncate-namespace:namespace=bar" >/dev/null
    until [ "$(stat_of "$port" namespace/bar objects)" = 0 ]; do sleep 0.2; done
    before=$(ticks "$pid")
    line=$(timed restore -h "127.0.0.1:$port" -i "$DIR/file.asb" -n test,bar -u -I "$@" | head -1)
    after=$(ticks "$pid")
    echo "restore $name $mode: ${line#*: }; server CPU $(cpu_per_record "$before" "$after"), tool CPU $(tool_cpu) µs/record"
}

echo "== $(date -u '+%F %H:%M') UTC, commit $(git rev-parse --short HEAD), $RECORDS records of $OBJECT, $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)"
"$BIN/citrined" --address 127.0.0.1 --port "$BASE" --fabric-port $((BASE + 1)) \
    --heartbeat-port $((BASE + 2)) --data-dir "$DIR/data" >"$DIR/node.log" 2>&1 &
pids+=($!)
single=$!
until info "$BASE" build >/dev/null; do sleep 0.2; done
"$BIN/citrine" bench -h "127.0.0.1:$BASE" -k "$RECORDS" -o "$OBJECT" -w insert -q >/dev/null
"$BIN/citrine" backup -h "127.0.0.1:$BASE" -n test -o "$DIR/file.asb" >/dev/null
echo "file: $(stat -c %s "$DIR/file.asb") bytes"
targets=("citrined $BASE $single")
if [ -n "$REFERENCE" ]; then
    bash "$REFERENCE" $((BASE + 20)) "$DIR/reference" >/dev/null 2>&1 &
    pids+=($!)
    until grep -q '{bar} rebalanced' "$DIR/reference/asd.log" 2>/dev/null; do sleep 0.2; done
    reference=$(pgrep -f "asd.*$DIR/reference" | head -1)
    targets+=("reference $((BASE + 20)) $reference")
fi
for round in $(seq "$ROUNDS"); do
    echo "-- round $round, load $(cut -d' ' -f1 /proc/loadavg)"
    for target in "${targets[@]}"; do
        read -r name port pid <<<"$target"
        restore "$name" "$port" "$pid" "single --parallel 32" --disable-batch-writes --parallel 32
        restore "$name" "$port" "$pid" "batch 128 x 32" --batch-size 128 --max-async-batches 32
    done
done
