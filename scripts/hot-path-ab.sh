#!/usr/bin/env bash
# Paired A/B of two builds of the hot-path microbenchmark
# (crates/citrine-service/examples/hot_path.rs): requests through
# Service::handle without sockets, by one thread and by two at once.
#
#   A_BIN=/tmp/hot_path-old B_BIN=target/release/examples/hot_path scripts/hot-path-ab.sh
#
# Build each side with `cargo build --release -p citrine-service --example
# hot_path` (for an older revision, in a `git worktree` of it) and copy the
# binary out of target/release/examples/. The two run alternately (A B, then
# B A, ...), ROUNDS times, each a 1-thread and a 2-thread phase of SECS
# seconds; printed: per variant and thread count, the median nanoseconds per
# request per thread and their range. What the 2-thread figure adds to the
# 1-thread one is what the threads pay for sharing cache lines and locks.
#
# Environment: A_BIN, B_BIN (required), ROUNDS (8), SECS (2), KEYS (20000:
# small enough to stay in cache, so sharing is not hidden behind DRAM
# misses; 1000000 for the memory-bound case), WORKLOAD (update | read |
# ru50; default update).
set -euo pipefail
die() { echo "hot-path-ab.sh: error: $*" >&2; exit 2; }
[ -n "${A_BIN:-}" ] && [ -x "$A_BIN" ] || die "A_BIN must name an executable hot_path build"
[ -n "${B_BIN:-}" ] && [ -x "$B_BIN" ] || die "B_BIN must name an executable hot_path build"
command -v python3 >/dev/null 2>&1 || die "python3 not found in PATH"
echo "== machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "== A: $A_BIN"
echo "== B: $B_BIN"
python3 - "$A_BIN" "$B_BIN" "${ROUNDS:-8}" "${SECS:-2}" "${KEYS:-20000}" "${WORKLOAD:-update}" <<'PY'
import re, statistics, subprocess, sys
a, b, rounds, secs, keys, workload = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
results = {v: {1: [], 2: []} for v in "AB"}
for r in range(rounds):
    for v in ("AB" if r % 2 == 0 else "BA"):
        out = subprocess.run(
            [a if v == "A" else b, "--keys", keys, "--threads", "1,2", "--secs", secs,
             "--rounds", "1", "--workload", workload],
            capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.match(r"round \d+ threads (\d+): +\d+ requests/s, +([\d.]+) ns", line)
            if m:
                results[v][int(m.group(1))].append(float(m.group(2)))
print(f"== {workload}, {keys} keys, {rounds} rounds of {secs} s per phase: ns per request per thread")
for v in "AB":
    one, two = results[v][1], results[v][2]
    m1, m2 = statistics.median(one), statistics.median(two)
    print(f"   {v}  1 thread {m1:7.1f} [{min(one):.1f}-{max(one):.1f}]   "
          f"2 threads {m2:7.1f} [{min(two):.1f}-{max(two):.1f}]   2 vs 1: {(m2 / m1 - 1) * 100:+.0f} %")
PY
