#!/usr/bin/env bash
# What TLS on the fabric and heartbeat costs replicated writes (issue 41): two
# 2-node clusters on loopback, both replication factor 2 (memory), one with
# plain fabric and heartbeat, one with TLS on both (no plain port; `citrine
# certs` certificates, TLS 1.3 by default). In one run, ROUNDS alternated
# windows of `citrine bench -w ru,0` (all updates: each is a write on the
# master and a replica write over the fabric) of DURATION s against each
# cluster, over KEYS keys of one 100-byte string, 32 in flight; the idle
# cluster's nodes only heartbeat meanwhile. Per window: throughput, write
# latency (p50 / p99 ms) and both nodes' CPU per operation (/proc/PID/stat).
# Release build expected (cargo build --release). Ports BASE..BASE+40.
# PLAIN_B=DIR: the second cluster is plain too, run by DIR/citrined (the code
# before a change), so the run compares two builds of the plain fabric;
# `citrine` (bench) always comes from BIN.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release}
KEYS=${KEYS:-100000}
DURATION=${DURATION:-15}
ROUNDS=${ROUNDS:-3}
BASE=${BASE:-5000}
DIR=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$DIR"; }
trap cleanup EXIT
"$BIN/citrine" certs "$DIR/certs" >/dev/null
# The settings of examples/cluster.toml without its [service] and [heartbeat].
namespace=$(sed -n '/^\[\[namespace\]\]/,$p' examples/cluster.toml)
plain() { # port node-id seed [bin]
  "${4:-$BIN}/citrined" --config examples/cluster.toml --port "$1" --fabric-port $(($1 + 1)) \
    --heartbeat-port $(($1 + 2)) --node-id "$2" --seed "$3" >"$DIR/$2.log" 2>&1 &
  pids+=($!)
}
tls() { # port node-id seed
  cat >"$DIR/$2.toml" <<CONF
[service]
address = "127.0.0.1"
port = $1
cluster-name = "citrine-local"
[heartbeat]
tls-port = $(($1 + 2))
tls-name = "localhost"
tls-mesh-seed-address-port = ["$3"]
[fabric]
tls-port = $(($1 + 1))
tls-name = "localhost"
[[tls]]
name = "localhost"
cert-file = "$DIR/certs/node.pem"
key-file = "$DIR/certs/node.key"
ca-file = "$DIR/certs/ca.pem"
$namespace
CONF
  "$BIN/citrined" --config "$DIR/$2.toml" --node-id "$2" >"$DIR/$2.log" 2>&1 &
  pids+=($!)
}
plain "$BASE" A1 "127.0.0.1:$((BASE + 2))"
plain $((BASE + 10)) A2 "127.0.0.1:$((BASE + 2))"
if [ -n "${PLAIN_B:-}" ]; then
  plain $((BASE + 20)) B1 "127.0.0.1:$((BASE + 22))" "$PLAIN_B"
  plain $((BASE + 30)) B2 "127.0.0.1:$((BASE + 22))" "$PLAIN_B"
  B_LABEL="plain ($PLAIN_B)"
else
  tls $((BASE + 20)) B1 "127.0.0.1:$((BASE + 22))"
  tls $((BASE + 30)) B2 "127.0.0.1:$((BASE + 22))"
  B_LABEL="TLS"
fi
P=127.0.0.1:$BASE
T=127.0.0.1:$((BASE + 20))
info() { "$BIN/citrine" info -h "$1" -v "$2" 2>/dev/null || true; }
for host in "$P" "$T"; do
  until info "$host" "cluster-stable:size=2" | grep -qv ERROR; do sleep 0.5; done
done
echo "both clusters formed: plain $(info "$P" cluster-info), $B_LABEL $(info "$T" cluster-info)"
cpu() { # pids...: CPU ticks (utime + stime) of the processes
  local total=0
  for pid in "$@"; do total=$((total + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
  echo "$total"
}
window() { # label host pid pid
  local before after out ops
  before=$(cpu "$3" "$4")
  out=$("$BIN/citrine" bench -h "$2" -k "$KEYS" -o S:100 -w ru,0 -c 32 -d "$DURATION" -q)
  after=$(cpu "$3" "$4")
  ops=$(echo "$out" | sed -n 's/^total: \([0-9]*\) ops.*/\1/p')
  echo "$1 $(echo "$out" | grep '^total:') | write p50/p99 ms $(echo "$out" | awk '$1 == "write" {print $4 " / " $6}')" \
    "| both nodes $(echo "scale=1; ($after - $before) * 10000 / $ops" | bc) µs/op"
}
"$BIN/citrine" bench -h "$P" -k "$KEYS" -o S:100 -w insert -c 32 -q >/dev/null
"$BIN/citrine" bench -h "$T" -k "$KEYS" -o S:100 -w insert -c 32 -q >/dev/null
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq "$ROUNDS"); do
  window "round $round plain:" "$P" "${pids[0]}" "${pids[1]}"
  window "round $round $B_LABEL:" "$T" "${pids[2]}" "${pids[3]}"
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
