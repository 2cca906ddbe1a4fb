#!/usr/bin/env bash
# Restart of a device namespace after kill -9: the checkpoint restart (index
# checkpoint + the write blocks written after it) against the cold scan, on
# the same files, alternated. On demand, not CI.
#
#   bench/restart.sh                      # 1 M records of 10*S:10
#   KEYS=2000000 ROUNDS=3 bench/restart.sh
#
# Steps: a fresh release citrined (index-checkpoint-period = PERIOD) is loaded
# with KEYS records by `citrine bench -w insert`, waits WAIT seconds, and is
# killed with -9. The checkpoint it left is kept aside. Then ROUNDS times:
# start with that checkpoint restored (checkpoint restart) and with none
# (cold scan), each time with checkpoints off so nothing changes between
# rounds; the time is from the process's spawn until its client port
# accepts (the index is rebuilt before it listens), with the CPU seconds the
# process used until then (user + system, /proc/PID/stat: robust against
# the niced process waiting for a loaded machine's CPUs); then `objects`
# is read and must equal KEYS (WAIT covers the flush window), and the node
# is killed with -9 again.
set -euo pipefail
cd "$(dirname "$0")/.."

KEYS=${KEYS:-1000000}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-4610}
OBJECT=${OBJECT:-10*S:10}
PERIOD=${PERIOD:-60}
WAIT=${WAIT:-3}
FILESIZE=${FILESIZE:-4G}
DIR=${DIR:-$(mktemp -d /tmp/citrine-restart.XXXXXX)}
BIN=target/release

if [ -z "${SKIP_BUILD:-}" ]; then
    nice cargo build --release -p citrine-server -p citrine-cli >&2
fi

config() {
    cat > "$DIR/citrine.toml" <<EOF
[service]
port = $PORT
[logging]
level = "info"
[[namespace]]
name = "test"
replication-factor = 1
[namespace.storage-engine]
type = "device"
file = "test.dat"
filesize = "$FILESIZE"
write-block-size = "1M"
# The files are sized to the data: the default stop-writes-used-pct (70) would stop the load.
stop-writes-used-pct = 0
fast-restart = true
index-checkpoint-period = $1
EOF
}

PID=
start() { # $1: run name; leaves "wall-seconds cpu-seconds" until the port accepts in $DIR/seconds
    local began now ticks
    began=$(date +%s.%N)
    nice "$BIN/citrined" --config "$DIR/citrine.toml" --data-dir "$DIR" \
        --fabric-port $((PORT + 1)) --heartbeat-port $((PORT + 2)) 2> "$DIR/$1.log" &
    PID=$!
    until (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; do
        kill -0 "$PID" 2>/dev/null || { echo "citrined exited: $(tail -5 "$DIR/$1.log")" >&2; exit 1; }
        sleep 0.005
    done
    now=$(date +%s.%N)
    ticks=$(awk '{print $14 + $15}' "/proc/$PID/stat")
    echo "$(echo "$now - $began" | bc) $(echo "scale=2; $ticks / $(getconf CLK_TCK)" | bc)" > "$DIR/seconds"
}

objects() {
    "$BIN/citrine" info -h "127.0.0.1:$PORT" -r -v "namespace/test" | tr ';' '\n' | sed -n 's/^objects=//p'
}

kill9() {
    kill -9 "$PID"
    wait "$PID" 2>/dev/null || true
}

# SKIP_LOAD=1 with DIR of an earlier KEEP=1 run: the same files again.
if [ -z "${SKIP_LOAD:-}" ]; then
    config "$PERIOD"
    start load
    "$BIN/citrine" bench -h "127.0.0.1:$PORT" -n test -k "$KEYS" -o "$OBJECT" -w insert > "$DIR/load.txt"
    sleep "$WAIT"
    kill9
    grep "index checkpoint written" "$DIR/load.log" | tail -1 | sed 's/.*INFO //' >&2
    cp "$DIR/test.checkpoint" "$DIR/saved.checkpoint"
fi

config 0
echo "round,restart,seconds_to_listen,cpu_seconds,log_seconds,objects,blocks_replayed,records_replayed,checkpoint_entries"
for round in $(seq 1 "$ROUNDS"); do
    for how in checkpoint cold; do
        rm -f "$DIR/test.checkpoint" "$DIR/test.checkpoint-tmp"
        [ "$how" = checkpoint ] && cp "$DIR/saved.checkpoint" "$DIR/test.checkpoint"
        start "$how-$round"
        read -r seconds cpu < "$DIR/seconds"
        count=$(objects)
        kill9
        line=$(grep -E "checkpoint restart complete|cold start complete" "$DIR/$how-$round.log" | tail -1)
        field() { echo "$line" | grep -o "$1=[^ ]*" | head -1 | cut -d= -f2 | tr -d '"'; }
        echo "$round,$how,$seconds,$cpu,$(field seconds),$count,$(field blocks_replayed),$(field records_replayed),$(field checkpoint_entries)"
        [ "$count" = "$KEYS" ] || { echo "objects $count, expected $KEYS" >&2; exit 1; }
    done
done
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
if [ -z "${KEEP:-}" ]; then rm -rf "$DIR"; fi
