#!/usr/bin/env bash
# Single-node throughput of citrined under the official Aerospike Go client's
# load generator (github.com/aerospike/aerospike-client-go/v8/tools/benchmark),
# plus the server's CPU cost per operation.
#
#   scripts/go-benchmark.sh
#
# What it does, in one go:
#   1. go install .../v8/tools/benchmark@$GO_CLIENT_VERSION into $WORK/bin
#   2. starts a fresh citrined (in-memory namespace `test`) on a free port,
#      and the same binary with --noop on another (NOOP=0: not)
#   3. loads KEYS records, one integer bin (benchmark -w I:100 -o I)
#   4. for each workload in WORKLOADS (default "RU,50 RU,95"): runs the tool
#      with CONCURRENCY goroutines against citrined and against a second
#      citrined started with --noop (the ceiling: the same binary's listener
#      and I/O answering every request with success, nothing stored), one
#      right after the other (the ceiling second for the first workload,
#      first for the second, and so on, the other way round in each next
#      round), and quotes citrined's throughput as a fraction of the
#      ceiling's. Each run skips the first per-second report (connection
#      warm-up), then measures a DURATION-second window:
#        throughput   = delta(cumulative op count) / delta(wall time)
#        server CPU   = delta(utime+stime of citrined, /proc/<pid>/stat fields
#                       14+15, in CLK_TCK ticks) / delta(ops)   -> us/op
#        client CPU   = same for the benchmark process (context: it shares the
#                       machine with the server)
#      and aggregates the tool's latency buckets (-L 5,1: <=1 ms, >1, >2, >4,
#      >8, >16 ms; the tool measures latency in whole milliseconds).
#   5. with ROUNDS > 1, does step 4 that many times and ends with, per
#      workload, the medians over the rounds and how many windows met the
#      targets (TARGET_OPS ops/s or more, TARGET_US us/op of server CPU or
#      less), for citrined and for the ceiling.
#
# Environment (optional): CITRINED (server binary; default: cargo build
# --release -p citrine-server and a copy of target/release/citrined),
# NO_BUILD=1, PORT, NOOP_PORT, NOOP (1; 0 skips the ceiling runs), KEYS
# (1000000), CONCURRENCY (32), DURATION (20), WORKLOADS ("RU,50 RU,95"),
# ROUNDS (1), TARGET_OPS (80000: 1.3 x the 61-64 K ops/s that issue 3
# measured for the reference server, rounded), TARGET_US (8.0),
# GO_CLIENT_VERSION (latest), WORK (mktemp -d).
set -euo pipefail

VER="${GO_CLIENT_VERSION:-latest}"
KEYS="${KEYS:-1000000}"
CONCURRENCY="${CONCURRENCY:-32}"
DURATION="${DURATION:-20}"
WORKLOADS="${WORKLOADS:-RU,50 RU,95}"
ROUNDS="${ROUNDS:-1}"
TARGET_OPS="${TARGET_OPS:-80000}"
TARGET_US="${TARGET_US:-8.0}"

SCRIPT_NAME=go-benchmark.sh
WORK_PREFIX=go-benchmark
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
case "$ROUNDS" in '' | *[!0-9]* | 0) die "ROUNDS must be a positive integer, not '$ROUNDS'" ;; esac
mkdir -p "$WORK/bin"

echo "== go install github.com/aerospike/aerospike-client-go/v8/tools/benchmark@$VER"
(cd "$WORK" && GOBIN="$WORK/bin" go install "github.com/aerospike/aerospike-client-go/v8/tools/benchmark@$VER") \
    >"$WORK/go-install.log" 2>&1 || { tail -20 "$WORK/go-install.log" >&2; die "go install failed"; }
BENCH="$WORK/bin/benchmark"

# ---------------------------------------------------------------- server
start_citrined
NOOP="${NOOP:-1}"
# Without the ceiling, the driver gets port and pid 0 (NOOP_PID itself stays
# empty: the exit trap would otherwise signal "process 0", this whole group).
if [ "$NOOP" = 1 ]; then start_noop; fi

echo "== machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

# ---------------------------------------------------------------- driver
PYTHONPATH="$(cd "$(dirname "$0")" && pwd)/lib" \
    python3 - "$BENCH" "$PORT" "$SERVER_PID" "${NOOP_PORT:-0}" "${NOOP_PID:-0}" "$KEYS" "$CONCURRENCY" "$DURATION" "$WORK" \
    "$ROUNDS" "$TARGET_OPS" "$TARGET_US" $WORKLOADS <<'PY'
import re, statistics, subprocess, sys, time
from gotool import TCK, TOTAL_RE as total_re, cpu_ticks, stop, tool_args

bench, port, spid, noop_port, noop_pid, keys, conc, duration, work = sys.argv[1:10]
rounds, target_ops, target_us = int(sys.argv[10]), float(sys.argv[11]), float(sys.argv[12])
workloads = sys.argv[13:]
spid, noop_pid, keys, conc, duration = int(spid), int(noop_pid), int(keys), int(conc), float(duration)
LAT = "5,1"

def cpu_totals():
    """(steal, total) ticks of the whole machine, from /proc/stat."""
    with open("/proc/stat") as fh:
        f = [int(x) for x in fh.readline().split()[1:]]
    return f[7], sum(f[:8])

def base_args(workload, to_port=port):
    return tool_args(bench, to_port, keys, conc, workload, ["-L", LAT])

ins_re = re.compile(r"write\(tps=(\d+) timeouts=(\d+) errors=(\d+) totalCount=(\d+)\)")
lat_re = re.compile(r"\t(READ|WRITE)\t(\d+)\t([\d.]+)\t(\d+)((?:\t\|\s*\d+/[\d.]+%)+)")

results = []

# ---- load phase
print(f"== loading {keys} keys (benchmark -w I:100 -c {conc} -o I)", flush=True)
log = open(f"{work}/load.log", "w")
s0, t0 = cpu_ticks(spid), time.monotonic()
p = subprocess.Popen(base_args("I:100"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
last = None
for line in p.stdout:
    log.write(line)
    m = ins_re.search(line)
    if m:
        last = m
rc = p.wait()
t1, s1 = time.monotonic(), cpu_ticks(spid)
if rc != 0 or last is None:
    sys.exit(f"load phase failed (exit {rc}); see {work}/load.log")
loaded, lerr, lto = int(last.group(4)), int(last.group(3)), int(last.group(2))
print(f"   inserted {loaded} records in {t1-t0:.1f} s ({loaded/(t1-t0):.0f} inserts/s incl. connect), "
      f"errors {lerr}, timeouts {lto}, server CPU {(s1-s0)/TCK/max(loaded,1)*1e6:.1f} us/insert", flush=True)

# ---- timed workloads
def measure(run, wl, target, to_port, pid):
    """Runs workload wl against the server at to_port (process pid); prints
    and returns (ops/s, server us/op, client us/op)."""
    print(f"== workload {wl} against {target}: {conc} concurrent, {keys} keys, {duration:.0f} s window", flush=True)
    log = open(f"{work}/{run:02d}-{wl.replace(',', '_')}-{target.replace(' ', '').replace('--', '-')}.log", "w")
    p = subprocess.Popen(base_args(wl, to_port), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    reports = 0
    start = None
    end = None
    lat = {"READ": None, "WRITE": None}
    lat_max = {"READ": 0, "WRITE": 0}
    per_sec = []
    for line in p.stdout:
        log.write(line)
        m = total_re.search(line)
        if m:
            reports += 1
            now = time.monotonic()
            sample = (now, int(m.group(4)), cpu_ticks(pid), cpu_ticks(p.pid),
                      int(m.group(2)), int(m.group(3)), cpu_totals())
            if reports == 2:          # first report covers the warm-up
                start = sample
            elif start is not None:
                per_sec.append(int(m.group(1)))
                if now - start[0] >= duration - 0.05:
                    end = sample
            continue
        m = lat_re.search(line)
        if m and reports >= 3:       # latency block of reports inside the window
            kind = m.group(1)
            buckets = [int(b.split("/")[0].strip(" |\t")) for b in m.group(5).split("|")[1:]]
            if lat[kind] is None:
                lat[kind] = [0] * len(buckets)
            lat[kind] = [a + b for a, b in zip(lat[kind], buckets)]
            lat_max[kind] = max(lat_max[kind], int(m.group(4)))
        if end is not None and m and m.group(1) == "WRITE":
            break
    stop(p)
    if start is None or end is None:
        sys.exit(f"workload {wl} against {target}: benchmark ended before the window completed; see {log.name}")
    dt = end[0] - start[0]
    ops = end[1] - start[1]
    tps = ops / dt
    s_us = (end[2] - start[2]) / TCK / ops * 1e6
    c_us = (end[3] - start[3]) / TCK / ops * 1e6
    to, er = end[4], end[5]
    print(f"   throughput {tps:,.0f} ops/s over {dt:.1f} s ({ops:,} ops; per-second min {min(per_sec):,} max {max(per_sec):,})")
    print(f"   server CPU {s_us:.1f} us/op ({(end[2]-start[2])/TCK/dt*100:.0f}% of one core); "
          f"benchmark client CPU {c_us:.1f} us/op")
    steal = (end[6][0] - start[6][0]) / max(end[6][1] - start[6][1], 1) * 100
    print(f"   timeouts {to}, errors {er} (last report); machine: {steal:.1f}% of CPU time stolen by the hypervisor, "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    hdr = ["<=1ms", ">1ms", ">2ms", ">4ms", ">8ms", ">16ms"]
    for kind in ("READ", "WRITE"):
        b = lat[kind]
        if not b:
            continue
        n = b[0] + b[1]  # every op is either <=1 ms or >1 ms
        pct = "  ".join(f"{h} {v/n*100:6.2f}%" for h, v in zip(hdr, b))
        print(f"   {kind:5s} latency (tool, whole ms): {pct}  max {lat_max[kind]} ms")
    return tps, s_us, c_us

for run, wl in enumerate(workloads * rounds, 1):
    # Alternate which goes first, so a drift of the machine within a pair
    # does not always favour the same side: by run, and again by round, so
    # that with an even number of workloads each one still alternates.
    round_index, workload_index = divmod(run - 1, len(workloads))
    ceiling_first = (round_index + workload_index) % 2 == 1
    ceiling = None
    if noop_pid and ceiling_first:
        ceiling = measure(run, wl, "citrined --noop", noop_port, noop_pid)
    citrine = measure(run, wl, "citrined", port, spid)
    if noop_pid and not ceiling_first:
        ceiling = measure(run, wl, "citrined --noop", noop_port, noop_pid)
    results.append((wl, citrine, ceiling))

print("\n== summary (ceiling: the same binary with --noop, measured right before or right after citrined, alternating)")
print(f"{'workload':10s} {'ops/s':>10s} {'server us/op':>13s} {'client us/op':>13s}"
      f" {'ceiling ops/s':>14s} {'ceiling us/op':>14s} {'of ceiling':>11s}")
for wl, (tps, s_us, c_us), ceiling in results:
    tail = f" {ceiling[0]:14,.0f} {ceiling[1]:14.1f} {tps / ceiling[0]:11.2f}" if ceiling else ""
    print(f"{wl:10s} {tps:10,.0f} {s_us:13.1f} {c_us:13.1f}{tail}")

if rounds > 1:
    print(f"\n== over {rounds} rounds: medians [ranges], and windows meeting the targets "
          f"(>= {target_ops:,.0f} ops/s; <= {target_us} us/op of server CPU; both)")
    def tally(name, rows):
        ops = [r[0] for r in rows]
        us = [r[1] for r in rows]
        fast = sum(o >= target_ops for o in ops)
        lean = sum(u <= target_us for u in us)
        both = sum(o >= target_ops and u <= target_us for o, u in zip(ops, us))
        print(f"   {name:26s} {statistics.median(ops):9,.0f} ops/s [{min(ops):,.0f}-{max(ops):,.0f}]"
              f"  {statistics.median(us):4.1f} us/op [{min(us):.1f}-{max(us):.1f}]"
              f"  ops {fast}/{len(rows)}, us {lean}/{len(rows)}, both {both}/{len(rows)}")
    for wl in workloads:
        tally(f"{wl} citrined", [c for w, c, _ in results if w == wl])
        ceilings = [n for w, _, n in results if w == wl and n]
        if ceilings:
            tally(f"{wl} ceiling (--noop)", ceilings)
PY
