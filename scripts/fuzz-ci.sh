#!/usr/bin/env bash
# Bounded fuzzing of the citrine-wire decoders, the CDT ops and expressions,
# the backup-file parser, the storage engine's decompression,
# suitable for CI.
#
# Runs every cargo-fuzz target in fuzz/ for FUZZ_SECONDS each (libFuzzer,
# release build with debug assertions and overflow checks on), starting from the
# committed seeds in fuzz/seeds/<target> plus whatever fuzz/corpus/<target>
# holds from earlier local runs (gitignored). Exits non-zero on any crash,
# hang or OOM and prints the crashing input's path and a reproduction command.
#
# Toolchain: nightly if rustup has one, else stable with RUSTC_BOOTSTRAP=1
# (cargo-fuzz needs -Z flags). cargo-fuzz is installed (pinned, --locked) when
# missing. If cargo-fuzz cannot be installed or cannot build the targets, the
# script falls back to the stable smoke fuzzer
# (crates/citrine-wire/tests/fuzz_smoke.rs) with a large iteration count, and
# says so loudly: a fallback run is NOT a libFuzzer run.
#
# Environment:
#   FUZZ_BUDGET_SECONDS     fuzzing time of the whole run (default 132, which
#                           keeps CI's time fixed as targets are added; it
#                           was 240 until CI's run time had to come down)
#   FUZZ_SECONDS            seconds per target (default: the budget shared
#                           equally by the targets, at least 10)
#   FUZZ_TARGETS            space-separated targets (default: wire_frame wire_message cdt_operate exp_parse_eval sindex_keys udf_values fabric_calls service_requests backup_file admin_parse storage_compression)
#   FUZZ_TIMEOUT            libFuzzer per-input timeout in seconds (default 10)
#   FUZZ_RSS_LIMIT_MB       libFuzzer memory limit (default 2048)
#   FUZZ_SANITIZER          cargo-fuzz --sanitizer (default none: citrine-wire is
#                           forbid(unsafe_code), so ASan finds little there and
#                           costs ~6x in executions; set `address` to use it)
#   FUZZ_TOOLCHAIN          force a rustup toolchain (e.g. nightly, stable)
#   FUZZ_BUILD_ONLY=1       build the targets and stop (scripts/test.sh builds
#                           them in the background, niced, while the client
#                           suites run; its later full run finds them built)
#   FUZZ_FORCE_SMOKE=1      skip cargo-fuzz, run the stable smoke fuzzer only
#   FUZZ_REQUIRE_LIBFUZZER=1  treat a fallback as a failure (exit 3)
#   FUZZ_SMOKE_ITERATIONS   smoke-fuzzer iterations in fallback
#                           (default 200 000 per second of FUZZ_SECONDS per target)
set -euo pipefail

CARGO_FUZZ_VERSION=0.13.1
FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-10}
FUZZ_RSS_LIMIT_MB=${FUZZ_RSS_LIMIT_MB:-2048}
FUZZ_SANITIZER=${FUZZ_SANITIZER:-none}
read -r -a TARGETS <<<"${FUZZ_TARGETS:-wire_frame wire_message cdt_operate exp_parse_eval sindex_keys udf_values fabric_calls service_requests backup_file admin_parse storage_compression}"
FUZZ_BUDGET_SECONDS=${FUZZ_BUDGET_SECONDS:-132}
default_seconds=$((FUZZ_BUDGET_SECONDS / ${#TARGETS[@]}))
FUZZ_SECONDS=${FUZZ_SECONDS:-$((default_seconds < 10 ? 10 : default_seconds))}

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUZZ_DIR="$ROOT/fuzz"
LOG_DIR="$FUZZ_DIR/target/fuzz-ci-logs"
case ":$PATH:" in *":${CARGO_HOME:-$HOME/.cargo}/bin:"*) ;; *) export PATH="${CARGO_HOME:-$HOME/.cargo}/bin:$PATH" ;; esac

say() { printf 'fuzz-ci: %s\n' "$*"; }
loud() {
    printf '\n%s\n' "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    printf '!!! fuzz-ci: %s\n' "$@"
    printf '%s\n\n' "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
}

# The stable, dependency-free smoke fuzzer: the fallback when libFuzzer can't run.
run_smoke_fallback() {
    local reason=$1
    if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
        say "FUZZ_BUILD_ONLY=1: not built ($reason); the full run decides"
        exit 1
    fi
    local iterations=${FUZZ_SMOKE_ITERATIONS:-$((FUZZ_SECONDS * ${#TARGETS[@]} * 200000))}
    loud "cargo-fuzz/libFuzzer is NOT running: $reason" \
        "Falling back to the stable smoke fuzzer (blind mutations, no coverage feedback," \
        "no sanitizer) with $iterations iterations. This is weaker than a libFuzzer run."
    local status=0
    (cd "$ROOT" && CITRINE_FUZZ_ITERATIONS=$iterations \
        cargo test --release -p citrine-wire --test fuzz_smoke -- --nocapture) || status=$?
    if [ "$status" -ne 0 ]; then
        say "FAILED: the smoke fuzzer found a panic (input and replay command printed above)"
        exit "$status"
    fi
    if [ "${FUZZ_REQUIRE_LIBFUZZER:-0}" = 1 ]; then
        loud "FUZZ_REQUIRE_LIBFUZZER=1 and libFuzzer did not run: failing."
        exit 3
    fi
    loud "Smoke fuzzer passed, but libFuzzer did NOT run ($reason)."
    exit 0
}

if [ "${FUZZ_FORCE_SMOKE:-0}" = 1 ]; then
    run_smoke_fallback "FUZZ_FORCE_SMOKE=1"
fi

# --- toolchain -------------------------------------------------------------
# The repository's rust-toolchain.toml pins stable, so nightly must be asked for
# explicitly with +nightly.
TOOLCHAIN_ARGS=()
if [ -n "${FUZZ_TOOLCHAIN:-}" ]; then
    TOOLCHAIN_ARGS=("+$FUZZ_TOOLCHAIN")
    [ "$FUZZ_TOOLCHAIN" = nightly ] || export RUSTC_BOOTSTRAP=1
    say "toolchain: $FUZZ_TOOLCHAIN (forced by FUZZ_TOOLCHAIN)"
elif command -v rustup >/dev/null 2>&1 && rustup toolchain list 2>/dev/null | grep -q '^nightly' \
    && cargo +nightly --version >/dev/null 2>&1; then
    TOOLCHAIN_ARGS=(+nightly)
    say "toolchain: $(rustc +nightly --version)"
else
    export RUSTC_BOOTSTRAP=1
    say "toolchain: no nightly; using $(cd "$FUZZ_DIR" && rustc --version) with RUSTC_BOOTSTRAP=1"
fi

# --- the targets compile ----------------------------------------------------
# A fuzz target that no longer compiles against the crates it drives is our
# bug, not a missing tool: it fails the run instead of falling back to the
# smoke fuzzer (which would hide it). Plain `cargo check` on the usual
# toolchain, no sanitizer. Asked only before a fallback: when `cargo fuzz
# build` succeeds the targets compile, and the check would cost CI ~40 s.
require_targets_compile() {
    [ "${FUZZ_BUILD_ONLY:-0}" = 1 ] && return 0
    if ! (cd "$FUZZ_DIR" && cargo check --bins --quiet); then
        loud "the fuzz targets do not compile (errors above): fix them"
        exit 1
    fi
}

# --- cargo-fuzz ------------------------------------------------------------
if ! cargo fuzz --version >/dev/null 2>&1; then
    say "cargo-fuzz missing: installing cargo-fuzz $CARGO_FUZZ_VERSION (--locked)"
    if ! (cd / && cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"); then
        require_targets_compile
        run_smoke_fallback "cargo install cargo-fuzz $CARGO_FUZZ_VERSION failed"
    fi
fi
say "$(cargo fuzz --version)"

# --- build -----------------------------------------------------------------
mkdir -p "$LOG_DIR"
cd "$FUZZ_DIR"
build_log="$LOG_DIR/build.log"
say "building fuzz targets (release, debug assertions, sanitizer $FUZZ_SANITIZER); log: $build_log"
build_started=$SECONDS
if ! cargo "${TOOLCHAIN_ARGS[@]}" fuzz build -a -s "$FUZZ_SANITIZER" >"$build_log" 2>&1; then
    tail -n 40 "$build_log"
    require_targets_compile
    run_smoke_fallback "cargo fuzz build failed (last lines above, full log in $build_log)"
fi
say "built in $((SECONDS - build_started)) s"
if [ "${FUZZ_BUILD_ONLY:-0}" = 1 ]; then
    say "FUZZ_BUILD_ONLY=1: built, not run"
    exit 0
fi

# --- run -------------------------------------------------------------------
failures=0
for target in "${TARGETS[@]}"; do
    corpus="$FUZZ_DIR/corpus/$target"
    seeds="$FUZZ_DIR/seeds/$target"
    artifacts="$FUZZ_DIR/artifacts/$target"
    log="$LOG_DIR/$target.log"
    mkdir -p "$corpus" "$seeds" "$artifacts"
    marker=$(mktemp)
    say "fuzzing $target for ${FUZZ_SECONDS}s (corpus $corpus, seeds $seeds; log $log)"
    status=0
    # libFuzzer stops itself after -max_total_time; the outer timeout only
    # guards against the harness itself wedging.
    timeout --kill-after=30 $((FUZZ_SECONDS + FUZZ_TIMEOUT + 120)) \
        cargo "${TOOLCHAIN_ARGS[@]}" fuzz run -a -s "$FUZZ_SANITIZER" "$target" "$corpus" "$seeds" -- \
        -max_total_time="$FUZZ_SECONDS" -timeout="$FUZZ_TIMEOUT" -rss_limit_mb="$FUZZ_RSS_LIMIT_MB" \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^#[0-9]+[[:space:]]+DONE|^Done [0-9]+ runs' "$log" | sed "s/^/fuzz-ci: $target: /" || true
    if [ "$status" -ne 0 ]; then
        failures=$((failures + 1))
        loud "$target FAILED (exit status $status)"
        # The interesting part of libFuzzer's report: from the first error line on.
        first=$(grep -n -m1 -E "panicked at|==[0-9]+==|ERROR: libFuzzer|deadly signal|timeout after" "$log" | cut -d: -f1 || true)
        if [ -n "$first" ]; then sed -n "${first},$((first + 40))p" "$log"; else tail -n 40 "$log"; fi
        mapfile -t found < <(find "$artifacts" -type f -newer "$marker" | sort)
        if [ "${#found[@]}" -eq 0 ]; then
            say "$target: no new artifact written (see $log)"
        fi
        for input in "${found[@]}"; do
            say "$target: CRASHING INPUT: $input ($(wc -c <"$input") bytes)"
            od -A x -t x1z -v "$input" | head -n 32
            say "reproduce: (cd fuzz && ${RUSTC_BOOTSTRAP:+RUSTC_BOOTSTRAP=1 }cargo ${TOOLCHAIN_ARGS[*]} fuzz run -a -s $FUZZ_SANITIZER $target $input)"
            say "       or: CITRINE_FUZZ_REPLAY=$input cargo test -p citrine-wire --test fuzz_smoke"
        done
    fi
    rm -f "$marker"
done

if [ "$failures" -ne 0 ]; then
    say "FAILED: $failures of ${#TARGETS[@]} targets found a crash, hang or OOM"
    exit 1
fi
say "OK: ${#TARGETS[@]} targets x ${FUZZ_SECONDS}s of libFuzzer, no crash"
