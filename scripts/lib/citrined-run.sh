# Shared set-up of the scripts that run an external tool against a fresh
# citrined (go-benchmark.sh, go-client-suite.sh). Source it after setting
# SCRIPT_NAME and WORK_PREFIX; it defines die(), checks for go and python3,
# creates $WORK, installs a trap that stops $SERVER_PID and $NOOP_PID on
# exit, sets $CITRINED to a copy of the release binary (built unless
# NO_BUILD=1, or the caller's own CITRINED), and defines start_citrined
# and start_noop (below).

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

die() { echo "$SCRIPT_NAME: error: $*" >&2; exit 2; }
# shellcheck source=listen.sh
source "$(dirname "${BASH_SOURCE[0]}")/listen.sh"
command -v go >/dev/null 2>&1 || die "go not found in PATH"
command -v python3 >/dev/null 2>&1 || die "python3 not found in PATH"

WORK="${WORK:-$(mktemp -d "/tmp/$WORK_PREFIX.XXXXXX")}"
mkdir -p "$WORK"
echo "== work dir: $WORK"

SERVER_PID=""
NOOP_PID=""
cleanup() {
    local pid
    for pid in $SERVER_PID $NOOP_PID; do
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
        fi
    done
}
trap cleanup EXIT

if [ -z "${CITRINED:-}" ]; then
    if [ "${NO_BUILD:-0}" != "1" ]; then
        echo "== cargo build --release -p citrine-server"
        (cd "$REPO" && cargo build --release -p citrine-server) >"$WORK/cargo-build.log" 2>&1 \
            || { tail -20 "$WORK/cargo-build.log" >&2; die "cargo build failed"; }
    fi
    [ -x "$REPO/target/release/citrined" ] || die "no $REPO/target/release/citrined"
    cp "$REPO/target/release/citrined" "$WORK/citrined"
    CITRINED="$WORK/citrined"
fi
[ -x "$CITRINED" ] || die "CITRINED=$CITRINED is not executable"

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

# Starts $CITRINED on 127.0.0.1:$PORT (a free port in 3400-3449 unless
# $PORT is set; extra flags in $CITRINED_ARGS); sets $PORT and $SERVER_PID.
start_citrined() {
    if [ -z "${PORT:-}" ]; then
        PORT=$(free_node_port 3400 3449)
        [ -n "$PORT" ] || die "no free port in 3400-3449"
    fi
    port_free "$PORT" || die "port $PORT is in use"
    # shellcheck disable=SC2086
    launch citrined "$PORT" "$WORK/server.log" --data-dir "$WORK/data" ${CITRINED_ARGS:-}
    SERVER_PID=$LAUNCHED_PID
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
