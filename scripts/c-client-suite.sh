#!/usr/bin/env bash
# Runs the official Aerospike C client's own test suite (src/test of the C
# client, which the `aerospike` Python package's source distribution
# carries) against a fresh citrined and prints a summary: how many tests
# passed and failed, and the failed tests with their first assertion.
#
#   scripts/c-client-suite.sh
#
# Environment (all optional):
#   PYTHON_CLIENT_VERSION  PyPI version of `aerospike` whose sdist holds the
#                          C client (default 19.3.0, which carries C client
#                          7.x with its tests)
#   CITRINED               server binary (default: a release build, as the Go
#                          scripts do; NO_BUILD=1 copies the existing one)
#   PORT                   service port (default: first free port in 3400-3449)
#   NODES                  run against a cluster of this many nodes on
#                          loopback (default 1; see node-client-suite.sh)
#   WORK                   work dir (default: a new mktemp -d; kept at the end)
#
# Needs python3 with pip (to download the sdist from PyPI), make, a C
# compiler, and the headers of OpenSSL, libyaml and zlib (libssl-dev,
# libyaml-dev, zlib1g-dev). The C client is built synchronously (no event
# library), so its async tests report themselves skipped.
#
# Output: the suite's log, the server log and summary.txt in $WORK, the
# summary also on stdout. Exit status: 0 when the suite ran (failing tests
# are reported, not fatal); 2 when it could not run.
set -euo pipefail

VER="${PYTHON_CLIENT_VERSION:-19.3.0}"

SCRIPT_NAME=c-client-suite.sh
WORK_PREFIX=c-client-suite
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
command -v make >/dev/null 2>&1 || die "make not found in PATH"
command -v cc >/dev/null 2>&1 || die "no C compiler (cc) in PATH"
for header in openssl/ssl.h yaml.h zlib.h; do
    [ -f "/usr/include/$header" ] || die "/usr/include/$header missing (apt-get install libssl-dev libyaml-dev zlib1g-dev)"
done

# ------------------------------------------------------------ client source
echo "== pip download aerospike==$VER (source distribution)"
rm -rf "$WORK/sdist" && mkdir -p "$WORK/sdist"
python3 -m pip download "aerospike==$VER" --no-binary :all: --no-deps \
    -d "$WORK/sdist" >"$WORK/pip-download.log" 2>&1 \
    || { tail -20 "$WORK/pip-download.log" >&2; die "pip download failed"; }
tar xzf "$WORK"/sdist/aerospike-*.tar.gz -C "$WORK/sdist"
CLIENT=$(echo "$WORK"/sdist/aerospike-*/aerospike-client-c)
[ -d "$CLIENT/src/test" ] || die "the sdist carries no C client tests ($CLIENT/src/test)"
C_VERSION=$(sed -n 's/^.*char\* aerospike_client_version = "\(.*\)";/\1/p' "$CLIENT/src/main/aerospike/version.c" 2>/dev/null || true)
echo "   C client ${C_VERSION:-(version unknown)} from aerospike $VER"

echo "== make (C client and its test binary)"
(cd "$CLIENT" && make -j2 O=1 && make -j2 O=1 test-build) >"$WORK/make.log" 2>&1 \
    || { tail -20 "$WORK/make.log" >&2; die "building the C client failed"; }
TEST_BIN="$CLIENT/target/$(uname -s)-$(uname -m)/test/aerospike_test"
[ -x "$TEST_BIN" ] || die "no test binary at $TEST_BIN"

# ------------------------------------------------------------------- server
if [ "${NODES:-1}" -gt 1 ]; then
    start_cluster "$NODES"
else
    start_citrined
fi

# --------------------------------------------------------------------- run
echo "== aerospike_test against 127.0.0.1:$PORT"
# Run from the client's directory: the tests load their Lua modules from
# src/test/lua.
(cd "$CLIENT" && timeout 1200 "$TEST_BIN" -h 127.0.0.1 -p "$PORT") >"$WORK/suite.log" 2>&1 || true
grep -q "tests: " "$WORK/suite.log" || { tail -30 "$WORK/suite.log" >&2; die "the suite printed no tally"; }

# ----------------------------------------------------------------- summary
python3 - "$WORK/suite.log" "$WORK" "$C_VERSION" "$PORT" "${NODES:-1}" <<'PY'
import re, sys

log, work, version, port, nodes = sys.argv[1:6]
text = open(log, errors="replace").read()
tally = re.findall(r"^(\d+) tests: (\d+) passed, (\d+) failed", text, re.M)
lines = [
    f"aerospike C client {version or '?'} suite against citrined on 127.0.0.1:{port}"
    + (f" (a cluster of {nodes})" if nodes != "1" else ""),
]
if tally:
    total, passed, failed = tally[-1]
    lines.append(f"tests {total}  passed {passed}  failed {failed}")
# The closing report: "[✘] suite: n/m tests passed." then "    [✘] test name".
failing = re.findall(r"^    \[✘\] (.+)$", text, re.M)
# The first assertion of each failure, in the order the suite ran.
assertions = re.findall(r"^\s+\[✘\] (assertion failed: .+)$", text, re.M)
if failing:
    lines.append("")
    lines.append("failing:")
    for name in failing:
        lines.append(f"- {name}")
if assertions:
    lines.append("")
    lines.append("assertions that failed:")
    for assertion in assertions:
        lines.append(f"- {assertion}")
summary = "\n".join(lines)
print(summary)
open(f"{work}/summary.txt", "w").write(summary + "\n")
PY
