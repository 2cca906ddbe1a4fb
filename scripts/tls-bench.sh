#!/usr/bin/env bash
# Plain against TLS in one run: one citrined with a TLS service port
# (examples/secure.toml, development certificates from `citrine certs`),
# the official Go client's benchmark tool against its plain port and its TLS
# port alternately (plain, TLS, TLS, plain, ...), ROUNDS times; printed per
# variant: the median throughput, server CPU per operation and client CPU
# per operation, and their range.
#
#   scripts/tls-bench.sh
#   CITRINED=target/release/citrined CITRINE=target/release/citrine NO_BUILD=1 scripts/tls-bench.sh
#
# Environment: CITRINED (server binary; default: this tree's release
# build), CITRINE (the CLI, for `citrine certs`; default
# target/release/citrine, else target/debug/citrine), ROUNDS (3), DURATION
# (15 s per window), KEYS (100000), CONCURRENCY (32), WORKLOAD (RU,50),
# GO_CLIENT_VERSION (latest), CITRINED_ARGS (extra server flags).
set -euo pipefail

VER="${GO_CLIENT_VERSION:-latest}"
SCRIPT_NAME=tls-bench.sh
WORK_PREFIX=tls-bench
source "$(dirname "$0")/lib/citrined-run.sh"
mkdir -p "$WORK/bin" "$WORK/data"

CITRINE="${CITRINE:-}"
if [ -z "$CITRINE" ]; then
    for candidate in "$REPO/target/release/citrine" "$REPO/target/debug/citrine"; do
        if [ -x "$candidate" ]; then CITRINE="$candidate"; break; fi
    done
fi
[ -n "$CITRINE" ] && [ -x "$CITRINE" ] || die "no citrine CLI: build it (cargo build -p citrine-cli) or set CITRINE"
"$CITRINE" certs "$WORK/data/tls" >/dev/null

echo "== go install github.com/aerospike/aerospike-client-go/v8/tools/benchmark@$VER"
(cd "$WORK" && GOBIN="$WORK/bin" go install "github.com/aerospike/aerospike-client-go/v8/tools/benchmark@$VER") \
    >"$WORK/go-install.log" 2>&1 || { tail -20 "$WORK/go-install.log" >&2; die "go install failed"; }

TLS_PORT=$(free_node_port "$PORT_FIRST" "$PORT_LAST")
[ -n "$TLS_PORT" ] || die "no free port for TLS"
PORT=$(free_node_port $((TLS_PORT + 1)) "$PORT_LAST")
# start_citrined gives the server --data-dir $WORK/data, where tls/ is.
CITRINED_ARGS="--config $REPO/examples/secure.toml --tls-port $TLS_PORT ${CITRINED_ARGS:-}"
start_citrined

echo "== machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)/lib" python3 - "$WORK/bin/benchmark" "$PORT" "$TLS_PORT" \
    "$SERVER_PID" "$WORK" "$WORK/data/tls/ca.pem" "${ROUNDS:-3}" "${DURATION:-15}" "${KEYS:-100000}" \
    "${CONCURRENCY:-32}" "${WORKLOAD:-RU,50}" <<'PY'
import statistics, subprocess, sys, time
from gotool import TCK, TOTAL_RE, cpu_ticks, stop, tool_args

bench, port, tls_port, spid, work, ca, rounds, duration, keys, conc, workload = sys.argv[1:]
spid, rounds, duration = int(spid), int(rounds), float(duration)
tls_flags = ["-tlsName", "localhost", "-tlsCAFile", ca]

def run(name, to_port, extra, wl, window):
    """One run of the tool: (ops/s, server us/op, client us/op) over a
    window that starts at its second per-second report."""
    log = open(f"{work}/{name}.log", "w")
    p = subprocess.Popen(tool_args(bench, to_port, keys, conc, wl, extra),
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    start = end = None
    reports = 0
    for line in p.stdout:
        log.write(line)
        m = TOTAL_RE.search(line)
        if not m:
            continue
        reports += 1
        sample = (time.monotonic(), int(m.group(4)), cpu_ticks(spid), cpu_ticks(p.pid), int(m.group(3)))
        if reports == 2:
            start = sample
        elif start is not None and sample[0] - start[0] >= window - 0.05:
            end = sample
            break
    stop(p)
    if start is None or end is None:
        sys.exit(f"{name}: the tool ended before the window; see {log.name}")
    ops = end[1] - start[1]
    if end[4] > 0:
        sys.exit(f"{name}: {end[4]} errors; see {log.name}")
    return (ops / (end[0] - start[0]), (end[2] - start[2]) / TCK / ops * 1e6,
            (end[3] - start[3]) / TCK / ops * 1e6)

print(f"== loading {keys} keys over the plain port", flush=True)
with open(f"{work}/load.log", "w") as log:
    if subprocess.call(tool_args(bench, port, keys, conc, "I:100"), stdout=log, stderr=subprocess.STDOUT):
        sys.exit(f"load failed; see {work}/load.log")
results = {"plain": [], "tls": []}
for r in range(rounds):
    order = ["plain", "tls"] if r % 2 == 0 else ["tls", "plain"]
    for variant in order:
        to_port, extra = (port, []) if variant == "plain" else (tls_port, tls_flags)
        tps, s_us, c_us = run(f"{r}-{variant}", to_port, extra, workload, duration)
        results[variant].append((tps, s_us, c_us))
        print(f"   round {r + 1} {variant:5}: {tps:9,.0f} ops/s, server {s_us:5.1f} us/op, client {c_us:5.1f} us/op", flush=True)
print(f"== {workload}, {conc} concurrent, {keys} keys, {duration:.0f} s windows, {rounds} rounds: median (min-max)")
for variant, rows in results.items():
    cols = list(zip(*rows))
    fmt = lambda xs, f: f"{f(statistics.median(xs))} ({f(min(xs))}-{f(max(xs))})"
    print(f"   {variant:5}: {fmt(cols[0], lambda x: f'{x:,.0f}')} ops/s, "
          f"server {fmt(cols[1], lambda x: f'{x:.1f}')} us/op, client {fmt(cols[2], lambda x: f'{x:.1f}')} us/op")
PY
