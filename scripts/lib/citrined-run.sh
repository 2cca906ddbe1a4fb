# Shared set-up of the scripts that run an external tool against a fresh
# citrined (go-benchmark.sh, go-client-suite.sh). Source it after setting
# SCRIPT_NAME and WORK_PREFIX (and NEEDS_GO=0 when the caller runs no Go
# tool); it defines die(), checks for go (unless NEEDS_GO=0) and python3,
# creates $WORK, installs a trap that stops $SERVER_PID and $NOOP_PID on
# exit, sets $CITRINED to a copy of the release binary (built unless
# NO_BUILD=1, or the caller's own CITRINED; neither with NEEDS_CITRINED=0,
# for a run against another server), and defines start_citrined,
# start_cluster and start_noop (below).

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

die() { echo "$SCRIPT_NAME: error: $*" >&2; exit 2; }
# shellcheck source=listen.sh
source "$(dirname "${BASH_SOURCE[0]}")/listen.sh"
if [ "${NEEDS_GO:-1}" != "0" ]; then
    command -v go >/dev/null 2>&1 || die "go not found in PATH"
fi
command -v python3 >/dev/null 2>&1 || die "python3 not found in PATH"

WORK="${WORK:-$(mktemp -d "/tmp/$WORK_PREFIX.XXXXXX")}"
mkdir -p "$WORK"
echo "== work dir: $WORK"

SERVER_PID=""
NOOP_PID=""
PEER_PIDS=""
cleanup() {
    local pid
    for pid in $SERVER_PID $NOOP_PID $PEER_PIDS; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
}
trap cleanup EXIT

if [ "${NEEDS_CITRINED:-1}" = "0" ]; then
    : # the caller runs no citrined (a run against another server)
elif [ -z "${CITRINED:-}" ]; then
    if [ "${NO_BUILD:-0}" != "1" ]; then
        echo "== cargo build --release -p citrine-server"
        (cd "$REPO" && cargo build --release -p citrine-server) >"$WORK/cargo-build.log" 2>&1 \
            || { tail -20 "$WORK/cargo-build.log" >&2; die "cargo build failed"; }
    fi
    [ -x "$REPO/target/release/citrined" ] || die "no $REPO/target/release/citrined"
    cp "$REPO/target/release/citrined" "$WORK/citrined"
    CITRINED="$WORK/citrined"
fi
if [ "${NEEDS_CITRINED:-1}" != "0" ]; then
    [ -x "$CITRINED" ] || die "CITRINED=$CITRINED is not executable"
fi

# launch WHAT PORT LOG ARGS...: starts $CITRINED on 127.0.0.1:PORT with
# ARGS, sets LAUNCHED_PID, and waits until it listens.
launch() {
    local what=$1 port=$2 log=$3
    shift 3
    echo "== starting $what on 127.0.0.1:$port"
    "$CITRINED" --port "$port" --address 127.0.0.1 "$@" >"$log" 2>&1 &
    LAUNCHED_PID=$!
    wait_listening "$port" "$LAUNCHED_PID" "$log" "$what"
}

# The ports start_citrined and start_cluster choose from when $PORT is
# unset (and start_cluster's other nodes in any case): 3400-3449 unless the
# caller sets PORT_FIRST and PORT_LAST.
PORT_FIRST=${PORT_FIRST:-3400}
PORT_LAST=${PORT_LAST:-3449}

# Starts $CITRINED on 127.0.0.1:$PORT (a free port in PORT_FIRST-PORT_LAST
# unless $PORT is set; extra flags in $CITRINED_ARGS); sets $PORT and
# $SERVER_PID.
start_citrined() {
    if [ -z "${PORT:-}" ]; then
        PORT=$(free_node_port "$PORT_FIRST" "$PORT_LAST")
        [ -n "$PORT" ] || die "no free port in $PORT_FIRST-$PORT_LAST"
    fi
    port_free "$PORT" || die "port $PORT is in use"
    # shellcheck disable=SC2086
    launch citrined "$PORT" "$WORK/server.log" --data-dir "$WORK/data" ${CITRINED_ARGS:-}
    SERVER_PID=$LAUNCHED_PID
}

# info_value PORT COMMAND: prints the answer of one info command of the
# node at 127.0.0.1:PORT (the Aerospike info protocol: an 8-byte header,
# version 2, type 1, 48-bit length, then the command), empty on failure.
info_value() {
    python3 - "$1" "$2" <<'PY' 2>/dev/null || true
import socket, struct, sys
port, command = int(sys.argv[1]), sys.argv[2].encode() + b"\n"
with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
    s.sendall(struct.pack(">Q", (2 << 56) | (1 << 48) | len(command)) + command)
    def take(n):
        data = b""
        while len(data) < n:
            chunk = s.recv(n - len(data))
            if not chunk:
                raise SystemExit(1)
            data += chunk
        return data
    size = struct.unpack(">Q", take(8))[0] & ((1 << 48) - 1)
    body = take(size)
line = body.decode().split("\n")[0]
print(line.split("\t", 1)[1] if "\t" in line else "")
PY
}

# start_cluster N: starts N nodes of $CITRINED as one cluster on loopback
# (namespaces `test` and `bar`, two copies of each record, in memory — or
# the namespace sections in $CLUSTER_NAMESPACES instead; heartbeats every
# 150 ms), each seeding from the first, and waits until every node sees a
# view of N with no migrations left. The first node is the one a client
# is pointed at: sets $PORT and $SERVER_PID to it (ports as
# start_citrined), $PEER_PIDS to the others.
start_cluster() {
    local nodes=$1 node port seed
    cat >"$WORK/cluster.toml" <<'TOML'
[service]
address = "127.0.0.1"
cluster-name = "citrine-scripts"

[heartbeat]
interval = 150
timeout = 10
TOML
    if [ -n "${CLUSTER_NAMESPACES:-}" ]; then
        printf '\n%s\n' "$CLUSTER_NAMESPACES" >>"$WORK/cluster.toml"
    else
        cat >>"$WORK/cluster.toml" <<'TOML'

[[namespace]]
name = "test"
replication-factor = 2
[namespace.storage-engine]
type = "memory"
data-size = "512M"

[[namespace]]
name = "bar"
replication-factor = 2
[namespace.storage-engine]
type = "memory"
data-size = "256M"
TOML
    fi
    local ports=() from=$PORT_FIRST
    for node in $(seq 1 "$nodes"); do
        if [ "$node" = 1 ] && [ -n "${PORT:-}" ]; then
            port=$PORT
        else
            port=$(free_node_port "$from" "$PORT_LAST")
        fi
        [ -n "$port" ] || die "no free ports for node $node in $PORT_FIRST-$PORT_LAST"
        port_free "$port" || die "port $port is in use"
        from=$((port + 3))
        [ "$node" = 1 ] && seed=$((port + 2))
        launch_node "citrined node $node of $nodes" "$node" "$port" "$seed" "$WORK/server-$node.log"
        if [ "$node" = 1 ]; then SERVER_PID=$LAUNCHED_PID; else PEER_PIDS="$PEER_PIDS $LAUNCHED_PID"; fi
        ports+=("$port")
    done
    PORT=${ports[0]}
    CLUSTER_PORTS=("${ports[@]}")
    echo "== waiting for a view of $nodes nodes with no migrations left"
    local ready
    for _ in $(seq 1 300); do
        ready=0
        for port in "${ports[@]}"; do
            [ "$(info_value "$port" cluster-size)" = "$nodes" ] || continue
            stats=$(info_value "$port" statistics)
            [[ ";$stats;" == *";migrate_partitions_remaining=0;"* ]] && ready=$((ready + 1))
        done
        [ "$ready" = "$nodes" ] && { echo "   cluster of $nodes formed (ports ${ports[*]})"; return 0; }
        sleep 0.1
    done
    die "no view of $nodes nodes with migrations done after 30 s (see $WORK/server-*.log)"
}

# start_sc_test N: N citrined nodes whose `test` is a strong-consistency
# namespace serving data (what the suite's transaction tests need), the
# roster set to the observed nodes, every partition available.
start_sc_test() {
    local nodes=$1 observed port
    CLUSTER_NAMESPACES='[[namespace]]
name = "test"
replication-factor = 2
strong-consistency = true
strong-consistency-serve-data = true
[namespace.storage-engine]
type = "memory"
data-size = "512M"' start_cluster "$nodes"
    observed=$(info_value "$PORT" "roster:namespace=test" | tr ':' '\n' \
        | sed -n 's/^observed_nodes=//p')
    [ -n "$observed" ] || die "no observed nodes in the roster answer"
    [ "$(info_value "$PORT" "roster-set:namespace=test;nodes=$observed")" = ok ] \
        || die "roster-set refused"
    # Only the view's principal reclusters; the others answer
    # ignored-by-non-principal.
    local reclustered=
    for port in "${CLUSTER_PORTS[@]}"; do
        [ "$(info_value "$port" "recluster:")" = ok ] && reclustered=1
    done
    [ -n "$reclustered" ] || die "recluster refused by every node"
    for _ in $(seq 1 200); do
        local ready=0
        for port in "${CLUSTER_PORTS[@]}"; do
            [[ ";$(info_value "$port" namespace/test);" == *";unavailable_partitions=0;"* ]] \
                && ready=$((ready + 1))
        done
        [ "$ready" = "$nodes" ] && { echo "   SC roster set: $observed"; return 0; }
        sleep 0.1
    done
    die "SC namespace test not available after 20 s"
}

# cluster_story: for a failed run against a cluster, what the nodes went
# through — every view change, exchange, migration plan and warning in
# the server logs (in time order), and each live node's counters of
# refused, expired and proxied requests and duplicate resolutions.
cluster_story() {
    echo "== the cluster's story (server logs: $WORK/server-*.log)"
    grep -hE "view changed|versions exchanged|plan done|left the cluster|WARN|ERROR" \
        "$WORK"/server-*.log 2>/dev/null | sort | tail -60 | cut -c1-220 || true
    local port stats
    for port in "${CLUSTER_PORTS[@]}"; do
        stats=$(info_value "$port" statistics)
        [ -n "$stats" ] || { echo "   node on $port: no answer"; continue; }
        echo "   node on $port: $(tr ';' '\n' <<<"$stats" \
            | grep -E "^(cluster_size|proxied_out|proxied_in|stall_refusals|expired_refusals|service_stalls|proxy_hops_exceeded|migrate_dupres_runs|migrate_dupres_failures|migrate_acting_reads)=" \
            | tr '\n' ' ')"
    done
}

# relaunch_node I: starts node I (1-based) of the cluster start_cluster
# made again, with the same ports, configuration and work directory (a
# memory namespace comes back empty), after it died or was killed; adds
# it to $PEER_PIDS (so it is stopped at exit) and sets $LAUNCHED_PID.
relaunch_node() {
    local node=$1
    launch_node "citrined node $node again" "$node" "${CLUSTER_PORTS[$((node - 1))]}" \
        $((CLUSTER_PORTS[0] + 2)) "$WORK/server-$node-again.log"
    PEER_PIDS="$PEER_PIDS $LAUNCHED_PID"
}

# launch_node WHAT NODE PORT SEED LOG: one cluster node (start_cluster's
# cluster.toml, fabric and heartbeat on the next two ports, seeding from
# heartbeat port SEED, work directory data-NODE).
launch_node() {
    local what=$1 node=$2 port=$3 seed=$4 log=$5
    # shellcheck disable=SC2086
    launch "$what" "$port" "$log" \
        --config "$WORK/cluster.toml" --fabric-port $((port + 1)) \
        --heartbeat-port $((port + 2)) --seed "127.0.0.1:$seed" \
        --data-dir "$WORK/data-$node" ${CITRINED_ARGS:-}
}

# Starts the same $CITRINED with --noop (the benchmark ceiling: every data
# request answered with success, nothing stored) on a free port in
# 3450-3499 unless $NOOP_PORT is set; sets $NOOP_PORT and $NOOP_PID.
start_noop() {
    if [ -z "${NOOP_PORT:-}" ]; then
        NOOP_PORT=$(free_node_port 3450 3499)
        [ -n "$NOOP_PORT" ] || die "no free port in 3450-3499"
    fi
    port_free "$NOOP_PORT" || die "port $NOOP_PORT is in use"
    # shellcheck disable=SC2086
    launch "citrined --noop" "$NOOP_PORT" "$WORK/noop.log" --data-dir "$WORK/noop-data" --noop ${CITRINED_ARGS:-}
    NOOP_PID=$LAUNCHED_PID
}
