#!/usr/bin/env bash
# What strong consistency costs (issue 39, point 10), in one run on one
# cluster: three citrined nodes on loopback with namespace `test` (AP, as
# examples/cluster.toml has it: memory, replication factor 2) and `sc`
# (strong consistency, memory, replication factor 2, roster of the three).
# KEYS records (bins OBJECT) are inserted into each; then ROUNDS rounds, each
# running in turn for DURATION seconds at CONCURRENCY (`citrine bench`):
#   AP reads, SC SESSION reads, SC LINEARIZE reads, AP updates, SC updates.
# One line per run (ops/s, mean and p99 latency in ms); then, per round, the
# ratios to the AP run of the same round. Each line of a round is measured
# within a minute of the others: compare ratios, not absolute figures.
# Release build expected (cargo build --release -p citrine-server -p citrine-cli).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
KEYS=${KEYS:-100000}
OBJECT=${OBJECT:-I,S:100}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
CONCURRENCY=${CONCURRENCY:-32}
BASE=${BASE:-4310}
DIR=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT

info() { "$BIN/citrine" info -h "127.0.0.1:$1" -v "$2" 2>/dev/null || true; }
stat_of() { info "$1" "$2" | tr ';:' '\n\n' | sed -n "s/^$3=//p" | head -1; }
wait_until() { # what, command...
    local what=$1
    shift
    for _ in $(seq 1 600); do "$@" && return 0; sleep 0.1; done
    echo "timed out waiting for $what" >&2
    exit 1
}

config="$DIR/cluster.toml"
cat examples/cluster.toml - >"$config" <<'EOF'

[[namespace]]
name = "sc"
replication-factor = 2
strong-consistency = true

[namespace.storage-engine]
type = "memory"
data-size = "512M"
EOF
seeds=()
for node in 0 1 2; do seeds+=(--seed "127.0.0.1:$((BASE + 10 * node + 2))"); done
for node in 0 1 2; do
    port=$((BASE + 10 * node))
    "$BIN/citrined" --config "$config" --address 127.0.0.1 --port "$port" \
        --fabric-port $((port + 1)) --heartbeat-port $((port + 2)) --node-id "C$node" \
        --data-dir "$DIR/C$node" "${seeds[@]}" >"$DIR/C$node.log" 2>&1 &
    pids+=($!)
done
three() { [ "$(stat_of "$BASE" statistics cluster_size)" = 3 ]; }
wait_until "a cluster of three" three
observed=$(info "$BASE" roster:namespace=sc | tr ':' '\n' | sed -n 's/^observed_nodes=//p')
[ "$(info "$BASE" "roster-set:namespace=sc;nodes=$observed")" = ok ]
[ "$(info "$BASE" recluster:)" = ok ]
available() {
    for node in 0 1 2; do
        [ "$(stat_of $((BASE + 10 * node)) namespace/sc unavailable_partitions)" = 0 ] || return 1
    done
}
wait_until "every sc partition available" available

bench() { # label, then citrine bench arguments; prints "ops/s mean p99" of its main operation
    local label=$1
    shift
    "$BIN/citrine" bench -h "127.0.0.1:$BASE" -k "$KEYS" -o "$OBJECT" -q --json "$DIR/$label.json" "$@" >/dev/null
    python3 - "$DIR/$label.json" <<'PY'
import json, sys
summary = json.load(open(sys.argv[1]))
ops = summary["ops"]
main = ops.get("read") if summary["workload"].endswith(",100") else ops.get("update") or ops.get("write")
main = main or next(iter(ops.values()))
print(f'{summary["throughput_ops_s"]:.0f} {main["mean_ms"]:.3f} {main["p99_ms"]:.3f} {summary["errors"]}')
PY
}
for namespace in test sc; do
    bench "insert-$namespace" -n "$namespace" -w insert -c "$CONCURRENCY" >/dev/null
done
echo "cluster of three, $KEYS keys, object $OBJECT, $DURATION s a run, concurrency $CONCURRENCY"
printf '%-6s %-16s %10s %9s %9s %7s %9s\n' round run ops/s mean_ms p99_ms errors vs_AP
for round in $(seq 1 "$ROUNDS"); do
    declare -A result=()
    for run in "ap-read:-n test -w ru,100" "sc-read-session:-n sc -w ru,100 --read-mode session" \
        "sc-read-linearize:-n sc -w ru,100 --read-mode linearize" "ap-update:-n test -w ru,0" \
        "sc-update:-n sc -w ru,0"; do
        label=${run%%:*}
        # shellcheck disable=SC2086
        result[$label]=$(bench "$label-$round" ${run#*:} -c "$CONCURRENCY" -d "$DURATION")
    done
    for label in ap-read sc-read-session sc-read-linearize ap-update sc-update; do
        read -r ops mean p99 errors <<<"${result[$label]}"
        case $label in
            *read*) base=${result[ap-read]%% *} ;;
            *) base=${result[ap-update]%% *} ;;
        esac
        printf '%-6s %-16s %10s %9s %9s %7s %9.3f\n' "$round" "$label" "$ops" "$mean" "$p99" "$errors" \
            "$(python3 -c "print($ops / max($base, 1))")"
    done
done
