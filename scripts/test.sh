#!/usr/bin/env bash
# Runs every test Citrine has, the way CI runs them:
#   formatting and lints, unit and integration tests (real citrined
#   processes), the official Python client compatibility suite, a short
#   fixed-seed differential run against the reference server (skipped, and
#   said so, when ../shared/reference/ is not there or cannot start), the
#   Java compatibility suite (the official Java client), and a short fuzz
#   run of each fuzz target.
# Usage: scripts/test.sh            (from anywhere; installs what it needs)
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's heading says when it starts (seconds since the start of the
# run) and how long the step before it took, so every CI log shows where
# the time goes.
ci_started=$SECONDS
step_name=""
step_started=$SECONDS
step() {
    local now=$SECONDS
    if [ -n "$step_name" ]; then
        printf '<== %s: %d s\n' "$step_name" $((now - step_started))
    fi
    step_name=$*
    step_started=$now
    printf '\n==> %s  [at %d s]\n' "$*" $((now - ci_started))
}

step "toolchain"
if ! command -v cargo >/dev/null 2>&1; then
    echo "cargo not found: install Rust with rustup (https://rustup.rs) and re-run" >&2
    exit 1
fi
cargo --version

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --quiet -- -D warnings

step "cargo build"
cargo build --workspace --all-targets --quiet

step "headless Chromium for the web console's test"
# crates/citrine-server/tests/console.rs loads the console in Debian's
# chromium; with CITRINE_REQUIRE_CHROMIUM=1 its browser checks must run.
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "chromium missing: installing Debian's chromium"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq chromium >/dev/null
fi
if command -v chromium >/dev/null 2>&1; then
    export CITRINE_REQUIRE_CHROMIUM=1
    chromium --version
else
    echo "no chromium (not root, or no apt-get): the console test skips its browser checks"
fi

step "slapd for the LDAP tests"
# crates/citrine-ldap/tests and crates/citrine-server/tests/ldap.rs start a
# throwaway slapd of their own; with CITRINE_REQUIRE_SLAPD=1 they must run.
if ! [ -x /usr/sbin/slapd ] && [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "slapd missing: installing Debian's slapd and ldap-utils"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    apt-get install -y -qq slapd ldap-utils >/dev/null
fi
if [ -x /usr/sbin/slapd ] && command -v ldapmodify >/dev/null 2>&1; then
    export CITRINE_REQUIRE_SLAPD=1
else
    echo "no slapd (not root, or no apt-get): the LDAP tests skip"
fi

step "cargo test (unit, integration, simulator)"
# Where the kernel allows io_uring, its tests must run (not skip) and the
# listener tests use it rather than "auto".
if [ "$(cat /proc/sys/kernel/io_uring_disabled 2>/dev/null || echo absent)" = "0" ]; then
    export CITRINE_REQUIRE_IO_URING=1
    echo "io_uring allowed by the kernel: its tests are required"
else
    echo "io_uring not allowed here: its tests skip, the listener tests use epoll via auto"
fi
# Cargo itself not quiet: its "Running <binary>" lines name what each
# "test result" line (libtest quiet: dots) is about.
cargo test --workspace -- --quiet 2>&1 | tee target/cargo-test.log
# Summarise for the reader (and for CI's log): totals, then the slowest
# test binaries (binaries run one after another; a binary's tests run in
# parallel).
awk '/^test result:/ { passed += $4; failed += $6 } END { printf "rust: %d passed, %d failed\n", passed, failed }' target/cargo-test.log
awk '/^ *Running / { name = $NF; gsub(/^\(target\/debug\/deps\/|-[0-9a-f]+\)$/, "", name)
                     if ($2 == "unittests") name = name " (" $3 ")" }
     /^ *Doc-tests / { name = "doc-tests " $2 }
     /^test result:/ { seconds = $NF; sub(/s$/, "", seconds); printf "%8.1f s  %s\n", seconds, name }' \
    target/cargo-test.log | sort -rn | awk 'NR == 1 { print "slowest test binaries:" } NR <= 15'

fuzz_build_pid=""
if [[ -x scripts/fuzz-ci.sh ]]; then
    step "fuzz targets: release build in the background while the client suites run"
    # Niced (the suites come first) and in its own process group, so that
    # a failing suite's exit takes the build with it.
    FUZZ_BUILD_ONLY=1 setsid nice -n 19 bash scripts/fuzz-ci.sh >target/fuzz-build.log 2>&1 &
    fuzz_build_pid=$!
    trap '[ -n "$fuzz_build_pid" ] && kill -- -"$fuzz_build_pid" 2>/dev/null; true' EXIT
    echo "log: target/fuzz-build.log"
fi

step "official Python client compatibility suite"
bash scripts/setup-python.sh
CITRINED_BIN="$PWD/target/debug/citrined" .venv/bin/python -m pytest -q tests/compat

step "differential test against the reference server (seeds 0-199)"
# The tester's own tests need no server; the run needs the reference
# (../shared/reference/) and says "skipped: ..." when it cannot have it.
.venv/bin/python -m pytest -q tests/differential
CITRINED="$PWD/target/debug/citrined" SKIP_IF_NO_REFERENCE=1 SEEDS=0:200 \
    bash scripts/differential.sh --quiet

step "Java compatibility suite (the official Java client)"
if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
        echo "java or mvn missing: installing Debian's default-jdk-headless and maven"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq >/dev/null
        apt-get install -y -qq default-jdk-headless maven >/dev/null
    else
        echo "java and mvn are needed (apt-get install -y default-jdk-headless maven)" >&2
        exit 1
    fi
fi
CITRINED="$PWD/target/debug/citrined" bash scripts/java-client-suite.sh
# Again against a cluster of three: replica reads and proxies, then one
# node killed while the client works, then brought back empty.
CITRINED="$PWD/target/debug/citrined" NODES=3 bash scripts/java-client-suite.sh

if [[ -x scripts/fuzz-ci.sh ]]; then
    step "short fuzz run of every fuzz target"
    fuzz_build_status=0
    wait "$fuzz_build_pid" || fuzz_build_status=$?
    fuzz_build_pid=""
    sed 's/^/background build: /' target/fuzz-build.log
    if [ "$fuzz_build_status" -ne 0 ]; then
        echo "the background build failed (status $fuzz_build_status): the run below builds again"
    fi
    bash scripts/fuzz-ci.sh
fi

step "all tests passed"
