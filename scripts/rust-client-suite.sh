#!/usr/bin/env bash
# Runs the official Aerospike Rust client's own integration tests (the
# `tests/` of the `aerospike` crate on crates.io) against a fresh citrined
# and prints a summary: how many tests passed and failed, and each failure's
# first panic message.
#
#   scripts/rust-client-suite.sh
#
# Environment (all optional):
#   RUST_CLIENT_VERSION  crates.io version of `aerospike` (default 3.0.0)
#   CITRINED             server binary (default: a release build, as the Go
#                        scripts do; NO_BUILD=1 copies the existing one)
#   PORT                 service port (default: first free port in 3400-3449)
#   NODES                run against a cluster of this many nodes on loopback
#                        (default 1; see node-client-suite.sh)
#   TESTS                test name filter passed to the test binary (default:
#                        every test)
#   WORK                 work dir (default: a new mktemp -d; kept at the end)
#
# Needs cargo (the crate and its dependencies come from crates.io through
# cargo itself). Building the client's tests takes a few minutes on two
# cores; the suite runs one test at a time (about ten minutes), as its
# tests share sets and UDF modules.
#
# Output: the suite's log, the server log and summary.txt in $WORK, the
# summary also on stdout. Exit status: 0 when the suite ran (failing tests
# are reported, not fatal); 2 when it could not run.
set -euo pipefail

VER="${RUST_CLIENT_VERSION:-3.0.0}"

SCRIPT_NAME=rust-client-suite.sh
WORK_PREFIX=rust-client-suite
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
command -v cargo >/dev/null 2>&1 || die "cargo not found in PATH"

# ------------------------------------------------------------ client source
# Cargo fetches the crate (a throwaway package that depends on it exactly),
# then the crate's source is copied out of cargo's registry.
echo "== cargo fetch aerospike =$VER"
FETCH="$WORK/fetch"
mkdir -p "$FETCH/src"
cat >"$FETCH/Cargo.toml" <<EOF
[package]
name = "fetch-aerospike-client"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
aerospike = "=$VER"
EOF
echo "fn main() {}" >"$FETCH/src/main.rs"
(cd "$FETCH" && cargo fetch) >"$WORK/fetch.log" 2>&1 \
    || { tail -20 "$WORK/fetch.log" >&2; die "cargo fetch of aerospike $VER failed"; }
SOURCE=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/"aerospike-$VER" 2>/dev/null | head -1)
[ -n "$SOURCE" ] && [ -d "$SOURCE/tests" ] || die "no tests in the aerospike $VER crate (looked in ${CARGO_HOME:-$HOME/.cargo}/registry/src)"
CLIENT="$WORK/aerospike-$VER"
rm -rf "$CLIENT" && cp -r "$SOURCE" "$CLIENT"

echo "== cargo test --no-run (the client's integration tests; lua for client-side aggregation)"
# The crate's own lock file pins what its tests were written against.
(cd "$CLIENT" && CARGO_TARGET_DIR="$WORK/target" cargo test --no-run --features lua --test lib) \
    >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log" >&2; die "building the client's tests failed"; }
TEST_BIN=$(sed -n 's/.*Executable tests\/lib.rs (\(.*\))$/\1/p' "$WORK/build.log" | tail -1)
case "$TEST_BIN" in /*) ;; *) TEST_BIN="$CLIENT/$TEST_BIN" ;; esac
[ -x "$TEST_BIN" ] || die "no test binary found in $WORK/build.log"

# ------------------------------------------------------------------- server
if [ "${NODES:-1}" -gt 1 ]; then
    start_cluster "$NODES"
else
    start_citrined
fi

# --------------------------------------------------------------------- run
echo "== the client's tests against 127.0.0.1:$PORT (one at a time)"
# From the crate's directory: tests read their Lua sources relative to it.
# shellcheck disable=SC2086
(cd "$CLIENT" && AEROSPIKE_HOSTS="127.0.0.1:$PORT" timeout 2400 "$TEST_BIN" --test-threads=1 ${TESTS:-}) \
    >"$WORK/suite.log" 2>&1 || true
grep -q "^test result:" "$WORK/suite.log" || { tail -30 "$WORK/suite.log" >&2; die "the suite printed no tally"; }

# ----------------------------------------------------------------- summary
python3 - "$WORK/suite.log" "$WORK" "$VER" "$PORT" "${NODES:-1}" <<'PY'
import re, sys

log, work, version, port, nodes = sys.argv[1:6]
text = open(log, errors="replace").read()
tally = re.findall(r"^test result: \w+\. (\d+) passed; (\d+) failed; (\d+) ignored", text, re.M)
lines = [
    f"aerospike Rust client {version} suite against citrined on 127.0.0.1:{port}"
    + (f" (a cluster of {nodes})" if nodes != "1" else ""),
]
if tally:
    passed, failed, ignored = tally[-1]
    lines.append(f"passed {passed}  failed {failed}  ignored {ignored}")
failing = re.findall(r"^test (\S+) \.\.\. FAILED$", text, re.M)
if failing:
    lines.append("")
    lines.append("failing (first panic message):")
    for name in failing:
        block = re.search(r"^---- " + re.escape(name) + r" stdout ----\n(.*?)(?=^---- |^failures:$)",
                          text, re.M | re.S)
        detail = ""
        if block:
            body = [l for l in block.group(1).splitlines()
                    if l.strip() and not l.startswith("stack backtrace") and not re.match(r"\s+\d+: |\s+at ", l)]
            detail = " | ".join(body[:4])[:400]
        lines.append(f"- {name}: {detail}")
summary = "\n".join(lines)
print(summary)
open(f"{work}/summary.txt", "w").write(summary + "\n")
PY
