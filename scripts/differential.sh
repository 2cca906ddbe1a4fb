#!/usr/bin/env bash
# Differential test: seeded random sequences of client calls sent through
# the official Python client to a fresh citrined and to the reference server
# (Aerospike CE, ../shared/reference/) side by side; every answer compared,
# each difference shrunk to the shortest sequence that shows it and printed
# as a runnable script (tests/differential/difftest.py says how).
#
# Usage: scripts/differential.sh [difftest.py options...]
#   SEEDS=0:500      seed range FIRST:END (END excluded), or one seed
#   STEPS=30         steps per sequence
#   CITRINED=path    the citrined to test (default: target/debug/citrined,
#                    built unless NO_BUILD=1)
#   REFERENCE=path   the reference's run.sh
#                    (default: <repo>/../shared/reference/aerospike-ce-8.1.2/run.sh)
#   PORT, REF_PORT   service ports (each server also takes the next two;
#                    default: the first free in 3500-3549 and 3550-3599)
#   SKIP_IF_NO_REFERENCE=1  if the reference is missing or cannot start, say
#                    "skipped: reference server not available (...)" and
#                    exit 0 instead of failing
# Exit status: 0 no difference outside tests/differential/known.py, 1 a new
# (or unreproducible) difference, 2 the run could not be made.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
SCRIPT_NAME=differential.sh
die() { echo "$SCRIPT_NAME: error: $*" >&2; exit 2; }
skip() {
    if [ "${SKIP_IF_NO_REFERENCE:-0}" = "1" ]; then
        echo "skipped: reference server not available ($*)"
        exit 0
    fi
    die "reference server not available ($*)"
}
# shellcheck source=lib/listen.sh
source "$REPO/scripts/lib/listen.sh"

REFERENCE="${REFERENCE:-$REPO/../shared/reference/aerospike-ce-8.1.2/run.sh}"
[ -f "$REFERENCE" ] || skip "no $REFERENCE"
ASD="$(dirname "$REFERENCE")/asd"
[ -x "$ASD" ] || skip "no executable $ASD"
missing_libs() { ldd "$ASD" 2>/dev/null | awk '/not found/ {print $1}' | tr '\n' ' '; }
if [ -n "$(missing_libs)" ]; then
    # The reference needs libcrypto.so.3 and libz (Debian: libssl3, zlib1g).
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "== the reference needs $(missing_libs): installing libssl3 and zlib1g"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null && apt-get install -y -qq libssl3 zlib1g >/dev/null \
            || true
    fi
    [ -z "$(missing_libs)" ] || skip "$ASD needs libraries not installed: $(missing_libs)"
fi

bash "$REPO/scripts/setup-python.sh"
PY="$REPO/.venv/bin/python"

if [ -z "${CITRINED:-}" ]; then
    if [ "${NO_BUILD:-0}" != "1" ]; then
        echo "== cargo build -p citrine-server (debug)"
        (cd "$REPO" && cargo build --quiet -p citrine-server --bin citrined) \
            || die "cargo build failed"
    fi
    CITRINED="$REPO/target/debug/citrined"
fi
[ -x "$CITRINED" ] || die "CITRINED=$CITRINED is not executable"

PORT="${PORT:-$(free_node_port 3500 3549)}"
REF_PORT="${REF_PORT:-$(free_node_port 3550 3599)}"
[ -n "$PORT" ] && [ -n "$REF_PORT" ] || die "no free ports in 3500-3599"
OWN_WORK=0
if [ -z "${WORK:-}" ]; then
    WORK="$(mktemp -d /tmp/citrine-differential.XXXXXX)"
    OWN_WORK=1
fi
echo "== citrined $CITRINED on $PORT, reference on $REF_PORT, work dir $WORK"

skip_flag=()
[ "${SKIP_IF_NO_REFERENCE:-0}" = "1" ] && skip_flag=(--skip-unavailable-reference)
status=0
"$PY" "$REPO/tests/differential/difftest.py" \
    --citrined "$CITRINED" --reference "$REFERENCE" \
    --port "$PORT" --ref-port "$REF_PORT" --workdir "$WORK" \
    --seeds "${SEEDS:-0:500}" --steps "${STEPS:-30}" "${skip_flag[@]}" "$@" || status=$?
# The servers' logs are kept when something was found.
if [ "$status" = 0 ] && [ "$OWN_WORK" = 1 ]; then rm -rf "$WORK"; fi
exit "$status"
