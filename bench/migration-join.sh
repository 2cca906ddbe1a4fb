#!/usr/bin/env bash
# Migration throughput and client throughput during a node addition:
# 3 nodes (examples/cluster.toml, memory, rf 2), RECORDS records of one
# 100-byte string bin, then `citrine bench -w ru,50` runs while a 4th node
# joins. Prints the time from the 4th node's start to "every node has
# migrate_partitions_remaining=0 in a view of 4", the records migrated, and
# the bench's per-second lines. Release build expected (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release
RECORDS=${RECORDS:-200000}
DIR=$(mktemp -d)
BASE=${BASE:-4200}
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
start() { # index
  local i=$1
  "$BIN/citrined" --config examples/cluster.toml --port $((BASE + 10 * i)) \
    --fabric-port $((BASE + 10 * i + 1)) --heartbeat-port $((BASE + 10 * i + 2)) \
    --node-id "B$i" --seed "127.0.0.1:$((BASE + 2))" >"$DIR/node$i.log" 2>&1 &
  pids+=($!)
}
size() { "$BIN/citrine" info -h "127.0.0.1:$((BASE + 10 * $1))" -v cluster-info 2>/dev/null |
  tr ';' '\n' | sed -n 's/^cluster_size=//p'; }
stat() { "$BIN/citrine" info -h "127.0.0.1:$((BASE + 10 * $1))" -v statistics 2>/dev/null |
  tr ';' '\n' | sed -n "s/^$2=//p"; }
for i in 0 1 2; do start $i; done
until [ "$(size 0)" = 3 ] && [ "$(size 1)" = 3 ] && [ "$(size 2)" = 3 ]; do sleep 0.2; done
until [ "$(stat 0 migrate_partitions_remaining)" = 0 ]; do sleep 0.2; done
"$BIN/citrine" bench -h "127.0.0.1:$BASE" -k "$RECORDS" -o S:100 -w insert -q
"$BIN/citrine" bench -h "127.0.0.1:$BASE" -k "$RECORDS" -o S:100 -w ru,50 -c 16 -d 30 \
  --timeout 5000 --retries 5 >"$DIR/bench.txt" 2>&1 &
bench=$!
sleep 10
echo "4th node starts at $(date +%T.%N)"
t0=$(date +%s.%N)
start 3
until [ "$(size 3)" = 4 ]; do sleep 0.05; done
t1=$(date +%s.%N)
sleep 0.2
while :; do
  busy=0
  for i in 0 1 2 3; do
    r=$(stat $i migrate_partitions_remaining); [ "$r" = 0 ] || busy=1
  done
  [ $busy = 0 ] && break
  sleep 0.1
done
t2=$(date +%s.%N)
sent=0
for i in 0 1 2 3; do sent=$((sent + $(stat $i migrate_records_sent))); done
echo "view of 4 after $(echo "$t1 - $t0" | bc) s; migrations done $(echo "$t2 - $t1" | bc) s after the view change"
echo "records migrated: $sent ($(echo "$sent / ($t2 - $t1)" | bc) records/s)"
grep -h "migration plan done" "$DIR"/node*.log | sed 's/\x1b\[[0-9;]*m//g' || true
wait $bench
cat "$DIR/bench.txt"
