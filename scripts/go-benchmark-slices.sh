#!/usr/bin/env bash
# Paired A/B of two citrined variants under the official Go client's
# benchmark tool, in short interleaved slices, for differences smaller than
# this machine's drift.
#
#   A_BIN=/tmp/citrined-old B_BIN=target/release/citrined scripts/go-benchmark-slices.sh
#
# Why: on a shared 2-vCPU VM the whole machine speeds up and slows down by
# 10-30 % over minutes (client and server CPU per operation move together),
# so two variants run one after the other (scripts/go-benchmark-ab.sh) can
# differ by more than the change being measured. Here both servers run at
# once (each idle while the other is measured), both are loaded once, and
# then the workload runs in SLICE-second slices alternating A, B, B, A, A,
# B, ... so each A slice has a B slice next to it in time. The verdict is
# the median of the per-pair differences (B - A), beside each variant's
# median.
#
# Each slice: the tool starts, its first per-second report (connection
# warm-up) is skipped, then ops and the server's utime+stime
# (/proc/PID/stat) are taken between the 2nd report and the first report
# SLICE seconds later:  ops/s, server us/op, client us/op.
#
# MODE=together runs both at the same time instead: one tool per server,
# for SLICES windows of SLICE seconds, so both variants see the same
# moment of the machine's drift (and compete for the same CPUs, evenly on
# average; swap A and B for a second run to check that). Each window is
# taken between two of each tool's own per-second reports, with the
# server's CPU read as the report arrives. The servers are busier than
# with one tool (two tools' requests each wake-up), so the absolute us/op
# is lower than in MODE=slices; the difference is the point.
#
# Environment: A_BIN, B_BIN (server binaries; required), A_ARGS, B_ARGS
# (extra citrined flags), B_INFO (an info command sent to B after both
# are loaded, e.g. a `sindex-create:...` to measure writes that keep an
# index true: the tool's integer bin is `I`; a sindex-create waits for the
# index's load_pct=100), A_INFO (the same for A: with both, two builds
# compare at keeping the same index), MODE (slices | together), SLICES (8 pairs or
# windows), SLICE (6 s), WORKLOAD (RU,95), KEYS (1000000), CONCURRENCY (32;
# per tool in MODE=together), GO_CLIENT_VERSION (latest), WORK.
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "go-benchmark-slices.sh: error: $*" >&2; exit 2; }
command -v go >/dev/null 2>&1 || die "go not found in PATH"
command -v python3 >/dev/null 2>&1 || die "python3 not found in PATH"
[ -n "${A_BIN:-}" ] && [ -x "$A_BIN" ] || die "A_BIN must name an executable citrined"
[ -n "${B_BIN:-}" ] && [ -x "$B_BIN" ] || die "B_BIN must name an executable citrined"

VER="${GO_CLIENT_VERSION:-latest}"
WORK="${WORK:-$(mktemp -d /tmp/go-benchmark-slices.XXXXXX)}"
mkdir -p "$WORK/bin"
echo "== work dir: $WORK"

echo "== go install github.com/aerospike/aerospike-client-go/v8/tools/benchmark@$VER"
(cd "$WORK" && GOBIN="$WORK/bin" go install "github.com/aerospike/aerospike-client-go/v8/tools/benchmark@$VER") \
    >"$WORK/go-install.log" 2>&1 || { tail -20 "$WORK/go-install.log" >&2; die "go install failed"; }

# shellcheck source=lib/listen.sh
source scripts/lib/listen.sh
PIDS=()
cleanup() {
    for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
}
trap cleanup EXIT

# start VARIANT BIN ARGS: prints "PORT PID" once the server listens (it
# runs in a subshell, so the caller records the pid).
start() {
    local variant=$1 bin=$2 args=$3 port
    port=$(free_node_port 3400 3489)
    [ -n "$port" ] || die "no free port in 3400-3489"
    # shellcheck disable=SC2086
    "$bin" --port "$port" --address 127.0.0.1 --data-dir "$WORK/data-$variant" $args \
        >"$WORK/server-$variant.log" 2>&1 &
    local pid=$!
    wait_listening "$port" "$pid" "$WORK/server-$variant.log" "citrined ($variant)"
    echo "$port $pid"
}

read -r A_PORT A_PID < <(start A "$A_BIN" "${A_ARGS:-}") || die "citrined (A) did not start"
PIDS+=("$A_PID")
read -r B_PORT B_PID < <(start B "$B_BIN" "${B_ARGS:-}") || die "citrined (B) did not start"
PIDS+=("$B_PID")
echo "== A: $A_BIN ${A_ARGS:-} (port $A_PORT, pid $A_PID)"
echo "== B: $B_BIN ${B_ARGS:-} (port $B_PORT, pid $B_PID)"
echo "== machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"

case "${MODE:=slices}" in slices | together) ;; *) die "MODE is slices or together, not $MODE" ;; esac

PYTHONPATH=scripts/lib python3 - "$WORK/bin/benchmark" "$WORK" "$A_PORT" "$A_PID" "$B_PORT" "$B_PID" \
    "${KEYS:-1000000}" "${CONCURRENCY:-32}" "${SLICES:-8}" "${SLICE:-6}" "${WORKLOAD:-RU,95}" "$MODE" "${B_INFO:-}" "${A_INFO:-}" <<'PY'
import socket, statistics, subprocess, sys, threading, time
from gotool import TCK, TOTAL_RE as total_re, cpu_ticks, stop, tool_args

bench, work, a_port, a_pid, b_port, b_pid, keys, conc, slices, slice_s, workload, mode, b_info, a_info = sys.argv[1:15]

def info(port, command):
    """One info command over the Aerospike info protocol (proto type 1)."""
    body = (command + "\n").encode()
    header = (2 << 56 | 1 << 48 | len(body)).to_bytes(8, "big")
    with socket.create_connection(("127.0.0.1", int(port)), timeout=10) as conn:
        conn.sendall(header + body)
        reply = b""
        while len(reply) < 8:
            reply += conn.recv(8 - len(reply))
        size = int.from_bytes(reply[:8], "big") & ((1 << 48) - 1)
        data = b""
        while len(data) < size:
            data += conn.recv(size - len(data))
    return data.decode().rstrip("\n").split("\t", 1)[-1]
servers = {"A": (a_port, int(a_pid)), "B": (b_port, int(b_pid))}
slices, slice_s = int(slices), float(slice_s)
def args(port, wl):
    return tool_args(bench, port, keys, conc, wl)

for variant, (port, pid) in servers.items():
    print(f"== loading {keys} keys into {variant}", flush=True)
    with open(f"{work}/load-{variant}.log", "w") as log:
        if subprocess.run(args(port, "I:100"), stdout=log, stderr=subprocess.STDOUT).returncode != 0:
            sys.exit(f"load of {variant} failed; see {work}/load-{variant}.log")

for label, port, command in [("A", a_port, a_info), ("B", b_port, b_info)]:
    if not command:
        continue
    print(f"== {label}: {command} -> {info(port, command)}", flush=True)
    if command.startswith("sindex-create"):
        params = dict(pair.split("=", 1) for pair in command.split(":", 1)[1].split(";") if "=" in pair)
        ns = params.get("namespace") or params.get("ns")
        stat = f"sindex/{ns}/{params['indexname']}"
        while "load_pct=100;" not in (answer := info(port, stat)):
            time.sleep(0.2)
        print(f"== {label}: {stat} -> {answer}", flush=True)

def one_slice(variant, index):
    port, spid = servers[variant]
    p = subprocess.Popen(args(port, workload), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    start = end = None
    errors = 0
    with open(f"{work}/slice-{index:02d}-{variant}.log", "w") as log:
        for line in p.stdout:
            log.write(line)
            m = total_re.search(line)
            if not m:
                continue
            sample = (time.monotonic(), int(m.group(4)), cpu_ticks(spid), cpu_ticks(p.pid))
            errors = int(m.group(2)) + int(m.group(3))
            if start is None:
                start = "warm-up"
            elif start == "warm-up":
                start = sample
            elif sample[0] - start[0] >= slice_s - 0.05:
                end = sample
                break
    stop(p)
    if end is None:
        sys.exit(f"slice {index} of {variant} ended early; see {work}/slice-{index:02d}-{variant}.log")
    ops = end[1] - start[1]
    seconds = end[0] - start[0]
    return (ops / seconds, (end[2] - start[2]) / TCK / ops * 1e6,
            (end[3] - start[3]) / TCK / ops * 1e6, errors)

def together():
    """Both tools at once; SLICES windows of SLICE seconds."""
    samples = {"A": [], "B": []}
    procs = {}
    def reader(variant, p, spid):
        with open(f"{work}/together-{variant}.log", "w") as log:
            for line in p.stdout:
                log.write(line)
                m = total_re.search(line)
                if m:
                    samples[variant].append((time.monotonic(), int(m.group(4)), cpu_ticks(spid),
                                             cpu_ticks(p.pid), int(m.group(2)) + int(m.group(3))))
    threads = []
    for variant, (port, spid) in servers.items():
        p = subprocess.Popen(args(port, workload), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
        procs[variant] = p
        t = threading.Thread(target=reader, args=(variant, p, spid), daemon=True)
        t.start()
        threads.append(t)
    # Warm-up: two reports from each.
    deadline = time.monotonic() + 30
    while min(len(v) for v in samples.values()) < 2:
        if time.monotonic() > deadline:
            sys.exit(f"the tools did not report; see {work}/together-*.log")
        time.sleep(0.1)
    def at(variant, t):
        """The first report of `variant` at or after time t."""
        while True:
            for sample in samples[variant]:
                if sample[0] >= t:
                    return sample
            if procs[variant].poll() is not None:
                sys.exit(f"the tool for {variant} ended early; see {work}/together-{variant}.log")
            time.sleep(0.05)
    t0 = time.monotonic()
    for window in range(slices):
        t1 = t0 + slice_s
        time.sleep(max(0.0, t1 - time.monotonic()))
        for variant in "AB":
            start, end = at(variant, t0), at(variant, t1)
            ops = end[1] - start[1]
            if ops <= 0:
                sys.exit(f"no operations from {variant} in window {window}")
            row = (ops / (end[0] - start[0]), (end[2] - start[2]) / TCK / ops * 1e6,
                   (end[3] - start[3]) / TCK / ops * 1e6, end[4])
            rows[variant].append(row)
            load = open("/proc/loadavg").read().split()[0]
            print(f"{window:>4} {variant:>7} {row[0]:>9,.0f} {row[1]:>13.2f} {row[2]:>13.2f} {load:>6}"
                  + (f"  ({row[3]} errors/timeouts)" if row[3] else ""), flush=True)
        t0 = t1
    for p in procs.values():
        stop(p)

rows = {"A": [], "B": []}
if mode == "together":
    print(f"== {slices} windows of {slice_s:.0f} s, both at once, workload {workload}, {conc} concurrent each", flush=True)
    print(f"{'win':>4} {'variant':>7} {'ops/s':>9} {'server us/op':>13} {'client us/op':>13} {'load':>6}")
    together()
else:
    print(f"== {slices} pairs of {slice_s:.0f} s slices, workload {workload}, {conc} concurrent", flush=True)
    print(f"{'pair':>4} {'variant':>7} {'ops/s':>9} {'server us/op':>13} {'client us/op':>13} {'load':>6}")
    for pair in range(slices):
        order = "AB" if pair % 2 == 0 else "BA"
        for variant in order:
            row = one_slice(variant, pair)
            rows[variant].append(row)
            load = open("/proc/loadavg").read().split()[0]
            print(f"{pair:>4} {variant:>7} {row[0]:>9,.0f} {row[1]:>13.2f} {row[2]:>13.2f} {load:>6}"
                  + (f"  ({row[3]} errors/timeouts)" if row[3] else ""), flush=True)

def med(values):
    return statistics.median(values)

print("\n== medians (range)")
for variant in "AB":
    r = rows[variant]
    print(f"   {variant}: {med([x[0] for x in r]):,.0f} ops/s [{min(x[0] for x in r):,.0f}-{max(x[0] for x in r):,.0f}], "
          f"server {med([x[1] for x in r]):.2f} us/op [{min(x[1] for x in r):.2f}-{max(x[1] for x in r):.2f}], "
          f"client {med([x[2] for x in r]):.2f} us/op")
d_ops = [b[0] - a[0] for a, b in zip(rows["A"], rows["B"])]
d_cpu = [b[1] - a[1] for a, b in zip(rows["A"], rows["B"])]
better = sum(1 for d in d_cpu if d < 0)
print(f"== paired B - A ({'same windows' if mode == 'together' else 'adjacent slices'}): ops/s median {med(d_ops):+,.0f} [{min(d_ops):+,.0f} to {max(d_ops):+,.0f}]; "
      f"server us/op median {med(d_cpu):+.2f} [{min(d_cpu):+.2f} to {max(d_cpu):+.2f}]; "
      f"B cheaper in {better} of {len(d_cpu)} pairs")
PY
