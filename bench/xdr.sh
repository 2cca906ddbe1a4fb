#!/usr/bin/env bash
# XDR cost and rates between two single-node clusters A and B on loopback
# (examples/cluster.toml, memory): in one run,
#  1. source throughput without a DC: `citrine bench -w ru,0` (all
#     updates) on A for DURATION s over KEYS keys of one 100-byte string;
#  2. the same with A shipping namespace test to B (DC dcb, added with
#     rewind=all, so the KEYS records are shipped first), sampling `lag`
#     and `throughput` (records/s shipped) every second;
#  3. outage: B paused (SIGSTOP) for PAUSE s under the same load, then
#     resumed: the time until A's lag is back to 0 and nothing is queued,
#     and the records shipped meanwhile (recovery rate).
# Release build expected (cargo build --release). Ports BASE..BASE+12.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
KEYS=${KEYS:-100000}
DURATION=${DURATION:-20}
PAUSE=${PAUSE:-20}
BASE=${BASE:-4400}
DIR=$(mktemp -d)
pids=()
cleanup() { kill -CONT "${pids[@]}" 2>/dev/null || true; for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap cleanup EXIT
start() { # port node-id
  "$BIN/citrined" --config examples/cluster.toml --port "$1" --fabric-port $(($1 + 1)) \
    --heartbeat-port $(($1 + 2)) --node-id "$2" --data-dir "$DIR/$2" >"$DIR/$2.log" 2>&1 &
  pids+=($!)
}
A=127.0.0.1:$BASE
B=127.0.0.1:$((BASE + 10))
info() { "$BIN/citrine" info -h "$1" -v "$2"; }
stats() { info "$A" "get-stats:context=xdr;dc=dcb;namespace=test"; }
stat() { stats | tr ';' '\n' | sed -n "s/^$1=//p"; }
bench() { "$BIN/citrine" bench -h "$A" -k "$KEYS" -o S:100 -q "$@" | grep '^total:'; }
sample() { # seconds
  for _ in $(seq "$1"); do
    sleep 1
    echo "  $(date +%T) $(stats | tr ';' '\n' | grep -E '^(lag|in_queue|in_progress|success|throughput|latency_ms|recoveries_pending)=' | tr '\n' ' ')"
  done
}
start "$BASE" A1
start $((BASE + 10)) B1
sleep 2
until info "$A" status >/dev/null 2>&1 && info "$B" status >/dev/null 2>&1; do sleep 0.2; done
bench -w insert -c 16 >/dev/null
echo "1. no DC: $(bench -w ru,0 -c 32 -d "$DURATION")"

info "$A" "set-config:context=xdr;dc=dcb;action=create" >/dev/null
info "$A" "set-config:context=xdr;dc=dcb;node-address-port=$B;action=add" >/dev/null
t0=$(date +%s.%N)
info "$A" "set-config:context=xdr;dc=dcb;namespace=test;action=add;rewind=all" >/dev/null
until [ "$(stat success)" -ge "$KEYS" ]; do sleep 0.2; done
t1=$(date +%s.%N)
echo "   initial shipment (rewind=all) of $KEYS records: $(echo "$t1 - $t0" | bc) s"
echo "2. one DC:"
bench -w ru,0 -c 32 -d "$DURATION" > "$DIR/bench2.txt" &
sample "$DURATION"
wait $!
echo "   $(cat "$DIR/bench2.txt")"

echo "3. B paused ${PAUSE} s under load, then resumed:"
bench -w ru,0 -c 32 -d "$((PAUSE + 5))" > "$DIR/bench3.txt" &
kill -STOP "${pids[1]}"
sleep "$PAUSE"
before=$(stat success)
kill -CONT "${pids[1]}"
t0=$(date +%s.%N)
wait $!
echo "   $(cat "$DIR/bench3.txt") (load ends 5 s after the resumption)"
until [ "$(stat lag)" = 0 ] && [ "$(stat in_queue)" = 0 ] && [ "$(stat in_progress)" = 0 ] && [ "$(stat recoveries_pending)" = 0 ]; do sleep 0.2; done
t1=$(date +%s.%N)
after=$(stat success)
echo "   caught up $(echo "$t1 - $t0" | bc) s after the resumption; shipped $((after - before)) records meanwhile"
echo "   final: $(stats)"
