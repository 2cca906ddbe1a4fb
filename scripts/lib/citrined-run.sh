# Shared set-up of the scripts that run an external tool against a fresh
# citrined (go-benchmark.sh, go-client-suite.sh). Source it after setting
# SCRIPT_NAME and WORK_PREFIX; it defines die(), checks for go and python3,
# creates $WORK, installs a trap that stops $SERVER_PID on exit, sets
# $CITRINED to a copy of the release binary (built unless NO_BUILD=1, or
# the caller's own CITRINED), and defines start_citrined (a free port in
# 3400-3499 unless $PORT is set; sets $PORT and $SERVER_PID; extra flags in
# $CITRINED_ARGS).

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
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null || true
        wait "$SERVER_PID" 2>/dev/null || true
    fi
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

# Starts $CITRINED on 127.0.0.1:$PORT and waits until it listens.
start_citrined() {
    if [ -z "${PORT:-}" ]; then
        for p in $(seq 3400 3499); do
            if port_free "$p"; then PORT="$p"; break; fi
        done
    fi
    [ -n "${PORT:-}" ] || die "no free port in 3400-3499"
    port_free "$PORT" || die "port $PORT is in use"

    echo "== starting citrined on 127.0.0.1:$PORT"
    "$CITRINED" --port "$PORT" --address 127.0.0.1 --data-dir "$WORK/data" ${CITRINED_ARGS:-} >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    wait_listening "$PORT" "$SERVER_PID" "$WORK/server.log" citrined
}
