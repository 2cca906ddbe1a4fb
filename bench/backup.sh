#!/usr/bin/env bash
# Backup and restore throughput of `citrine backup` / `citrine restore`, and
# how it scales with --parallel. RECORDS records (bins OBJECT, written by
# `citrine bench -w insert`) are backed up from, in turn:
#   - one citrined (default configuration: test and bar in memory),
#   - the reference server (../shared/reference, if present): the baseline,
#     the same tool against the same records,
#   - a two-node citrined cluster (examples/cluster.toml, rf 2): each node
#     streams the partitions it masters;
# at each --parallel of BACKUP_PARALLEL; then the file is restored into
# namespace bar of the single servers (truncated and empty before each run)
# at each --parallel of RESTORE_PARALLEL. Each line gives the tool's own
# summary (records/s, MB/s of file text), the server CPU time per record
# (/proc/PID/stat, every node of the cluster summed) and the tool's own CPU
# time per record (/usr/bin/time).
# Release build expected (cargo build --release -p citrine-server -p citrine-cli).
# Ports BASE .. BASE+62 (default 4210).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
RECORDS=${RECORDS:-300000}
OBJECT=${OBJECT:-I,S:100,B:200}
BACKUP_PARALLEL=${BACKUP_PARALLEL:-1 2 4 16}
RESTORE_PARALLEL=${RESTORE_PARALLEL:-4 32 128}
BASE=${BASE:-4210}
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
ticks() { # pid... -> utime+stime summed, clock ticks
    local sum=0
    for pid in "$@"; do
        sum=$((sum + $(awk '{print $14 + $15}' "/proc/$pid/stat")))
    done
    echo "$sum"
}
info() { "$BIN/citrine" info -h "127.0.0.1:$1" -v "$2" 2>/dev/null; }
stat_of() { info "$1" "$2" | tr ';:' '\n\n' | sed -n "s/^$3=//p" | head -1; }
wait_port() { until info "$1" build >/dev/null; do sleep 0.2; done; }
citrined() { # port extra-args...
    local port=$1
    shift
    "$BIN/citrined" --address 127.0.0.1 --port "$port" --fabric-port $((port + 1)) \
        --heartbeat-port $((port + 2)) --data-dir "$DIR/data-$port" "$@" >"$DIR/node-$port.log" 2>&1 &
    pids+=($!)
    wait_port "$port"
}
load() {
    "$BIN/citrine" bench -h "127.0.0.1:$1" -k "$RECORDS" -o "$OBJECT" -w insert -q | tail -1 |
        sed -n 's/.*"throughput_ops_s":\([0-9]*\).*/\1 records\/s/p'
}
backups() { # name port pid...
    local name=$1 port=$2
    shift 2
    for parallel in $BACKUP_PARALLEL; do
        local file="$DIR/$name.asb" before after line
        rm -f "$file"
        before=$(ticks "$@")
        line=$(timed backup -h "127.0.0.1:$port" -n test -o "$file" --parallel "$parallel" | head -1)
        after=$(ticks "$@")
        echo "backup  $name --parallel $parallel: ${line#*: }; server CPU $(cpu_per_record "$before" "$after"), tool CPU $(tool_cpu) µs/record"
    done
}
restores() { # name port file pid
    local name=$1 port=$2 file=$3 pid=$4
    for parallel in $RESTORE_PARALLEL; do
        info "$port" "truncate-namespace:namespace=bar" >/dev/null
        until [ "$(stat_of "$port" namespace/bar objects)" = 0 ]; do sleep 0.2; done
        local before after line
        before=$(ticks "$pid")
        line=$(timed restore -h "127.0.0.1:$port" -i "$file" -n test,bar -u -I --parallel "$parallel" | head -1)
        after=$(ticks "$pid")
        echo "restore $name --parallel $parallel: ${line#*: }; server CPU $(cpu_per_record "$before" "$after"), tool CPU $(tool_cpu) µs/record"
    done
}
timed() { /usr/bin/time -f "%U %S" -o "$DIR/tool-time" "$BIN/citrine" "$@"; }
tool_cpu() { awk -v n="$RECORDS" '{printf "%.2f", ($1 + $2) * 1e6 / n}' "$DIR/tool-time"; }
cpu_per_record() { echo "scale=2; ($2 - $1) * 1000000 / $(getconf CLK_TCK) / $RECORDS" | bc; }

echo "== $(date -u '+%F %H:%M') UTC, commit $(git rev-parse --short HEAD), $RECORDS records of $OBJECT, $(nproc) CPUs"
citrined "$BASE"
single=${pids[-1]}
echo "load citrined: $(load "$BASE")"
backups citrined "$BASE" "$single"
cp "$DIR/citrined.asb" "$DIR/restore.asb"
echo "file: $(stat -c %s "$DIR/restore.asb") bytes"
if [ -n "$REFERENCE" ]; then
    bash "$REFERENCE" $((BASE + 20)) "$DIR/reference" >/dev/null 2>&1 &
    pids+=($!)
    until grep -q '{bar} rebalanced' "$DIR/reference/asd.log" 2>/dev/null; do sleep 0.2; done
    reference=${pids[-1]}
    echo "load reference: $(load $((BASE + 20)))"
    backups reference $((BASE + 20)) "$reference"
else
    echo "no reference server here: its lines are left out"
fi
citrined $((BASE + 40)) --config examples/cluster.toml --node-id C1
first=${pids[-1]}
citrined $((BASE + 50)) --config examples/cluster.toml --node-id C2 --seed "127.0.0.1:$((BASE + 42))"
second=${pids[-1]}
until [ "$(info $((BASE + 40)) cluster-stable:size=2 | grep -v ERROR)" != "" ]; do sleep 0.2; done
echo "load 2-node cluster: $(load $((BASE + 40)))"
until [ "$(info $((BASE + 40)) cluster-stable:size=2 | grep -v ERROR)" != "" ]; do sleep 0.2; done
backups cluster2 $((BASE + 40)) "$first" "$second"
restores citrined "$BASE" "$DIR/restore.asb" "$single"
if [ -n "$REFERENCE" ]; then
    restores reference $((BASE + 20)) "$DIR/restore.asb" "$reference"
fi
