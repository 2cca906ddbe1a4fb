#!/usr/bin/env bash
# Citrine standard benchmark: builds release binaries, starts a fresh
# citrined and, as the ceiling, a second citrined with --noop (the same
# listener and I/O, every data request answered with success, nothing
# stored) on loopback, runs each standard workload against both, one right
# after the other, and appends a dated section to bench/RESULTS.md.
#
# Workloads (2016 VLDB paper style): 1 M keys, 32 concurrent commands,
#   - load: insert every key (10 bins x 10-byte strings, and 1 KiB blobs)
#   - ru,95 and ru,50 (read/update) on 10 x 10-byte string bins
#   - ru,95 on one 1 KiB blob bin
#   - batch reads of BATCH keys each (ru,100 --batch-size BATCH) on the
#     10 x 10-byte string bins: one request per node, rows answered in a
#     stream (the ceiling answers each row with a header-only success)
#   - secondary-index queries (-w query): 1 M keys with a group bin
#     (key index modulo QUERY_GROUPS, 10 000: 100 records a group) and the
#     10 string bins, each query every record of one random group; its
#     baseline, right after it, is batch reads of as many keys (100) a
#     batch on the same records (no-op rows would be empty streams)
#   - ru,95 on 10 x 10-byte string bins with ONE command in flight (-c 1):
#     latency without queueing, beside the machine's loopback floor (two
#     processes passing request- and reply-sized messages over plain
#     blocking sockets, bench/loopback-pingpong.c; skipped without gcc)
#   - record UDFs (UDF=1): UDF_KEYS keys with one integer bin (-o I), then
#     -w udf (the bench's Lua module citrine_bench.lua, function incr: read
#     the bin, add 1, aerospike:update, return it: a read-modify-write on
#     the server) and -w udf-read (function get: return the bin), each
#     followed by its plain baseline on the same keys: ru,0 (a put of the
#     bin) and ru,100 (a read). No ceiling rows: citrined --noop runs no Lua.
#
# Environment (all optional):
#   DURATION=20      seconds per read/update workload
#   KEYS=1000000     key count
#   CONCURRENCY=32   commands in flight
#   LOAD=1           insert the keys first (0 = skip; reads then miss)
#   BATCH=10         keys per batch read of the batch workload (0 = skip it)
#   QUERY_GROUPS=10000  groups of the query workload (0 = skip it)
#   UDF=1            run the record-UDF workloads (0 = skip them)
#   UDF_KEYS=100000  keys of the record-UDF workloads
#   PORT=3300        citrined port;  NOOP_PORT=3399 the --noop citrined's port
#   SKIP_BUILD=0     1 = use existing target/release binaries
#   CITRINED_BIN     server binary (default target/release/citrined)
#   DATA_SIZE=6G     memory budget of the benchmark namespace `test`
#   RESULTS          output file (default bench/RESULTS.md)
#   NOTE             free text added to the section (e.g. what changed)
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
DURATION="${DURATION:-20}"
KEYS="${KEYS:-1000000}"
CONCURRENCY="${CONCURRENCY:-32}"
LOAD="${LOAD:-1}"
BATCH="${BATCH:-10}"
QUERY_GROUPS="${QUERY_GROUPS:-10000}"
UDF="${UDF:-1}"
UDF_KEYS="${UDF_KEYS:-100000}"
PORT="${PORT:-3300}"
NOOP_PORT="${NOOP_PORT:-3399}"
DATA_SIZE="${DATA_SIZE:-6G}"
RESULTS="${RESULTS:-$ROOT/bench/RESULTS.md}"
CITRINE="$ROOT/target/release/citrine"
CITRINED="${CITRINED_BIN:-$ROOT/target/release/citrined}"

if [ "${SKIP_BUILD:-0}" != "1" ]; then
    echo "== building release binaries"
    cargo build --release -p citrine-server -p citrine-cli
fi
for binary in "$CITRINE" "$CITRINED"; do
    if [ ! -x "$binary" ]; then
        echo "error: $binary is missing; run without SKIP_BUILD=1 or set CITRINED_BIN" >&2
        exit 1
    fi
done

WORK="$(mktemp -d)"
SERVER_PID=""
NOOP_PID=""
cleanup() {
    [ -n "$SERVER_PID" ] && kill "$SERVER_PID" 2>/dev/null || true
    [ -n "$NOOP_PID" ] && kill "$NOOP_PID" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT

wait_for() { # host:port
    for _ in $(seq 1 150); do
        if "$CITRINE" info -h "$1" --timeout 200 -v build >/dev/null 2>&1; then return 0; fi
        sleep 0.1
    done
    echo "error: nothing answers on $1" >&2
    exit 1
}

echo "== starting citrined on 127.0.0.1:$PORT and citrined --noop on 127.0.0.1:$NOOP_PORT"
# In-memory namespace `test` large enough for both data sets (1 M x 100 B and
# 1 M x 1 KiB with index): the built-in default (1 GiB, stop-writes at 90 %)
# would refuse part of the 1 KiB load with OUT_OF_SPACE (8).
cat >"$WORK/bench.toml" <<EOF
[service]
address = "127.0.0.1"
port = $PORT
cluster-name = "citrine"

[logging]
level = "warn"

[[namespace]]
name = "test"
replication-factor = 1
default-ttl = 0

[namespace.storage-engine]
type = "memory"
data-size = "$DATA_SIZE"
evict-used-pct = 0
stop-writes-used-pct = 95
EOF
"$CITRINED" --config "$WORK/bench.toml" --port "$PORT" --address 127.0.0.1 >"$WORK/citrined.log" 2>&1 &
SERVER_PID=$!
"$CITRINED" --config "$WORK/bench.toml" --port "$NOOP_PORT" --address 127.0.0.1 --noop >"$WORK/noop.log" 2>&1 &
NOOP_PID=$!
wait_for "127.0.0.1:$PORT"
wait_for "127.0.0.1:$NOOP_PORT"

COMMANDS_FILE="$WORK/commands.txt"
: >"$COMMANDS_FILE"
run_bench() { # name target-port pid-or-empty extra-args... (C=N: N in flight, not CONCURRENCY; K=N: N keys, not KEYS)
    local name="$1" port="$2" pid="$3"
    shift 3
    local args=(bench -h "127.0.0.1:$port" -n test -k "${K:-$KEYS}" -c "${C:-$CONCURRENCY}" -q --label "$name" --json "$WORK/$name.json" "$@")
    if [ -n "$pid" ]; then args+=(--server-pid "$pid"); fi
    echo "== $name"
    echo "citrine ${args[*]}" | sed "s#$WORK/##" >>"$COMMANDS_FILE"
    # The exit status is taken before any pipe (after `a | b || true`,
    # PIPESTATUS would be `true`'s).
    local status=0
    "$CITRINE" "${args[@]}" >"$WORK/$name.out" 2>&1 || status=$?
    grep -v '^JSON ' "$WORK/$name.out" || true
    if [ "$status" != 0 ]; then
        echo "error: $name failed with status $status (its row will be missing)" >&2
        FAILED="$FAILED $name"
    fi
}
FAILED=""

SPEC_SMALL="10*S:10"
SPEC_1K="B:1024"
if [ "$LOAD" = "1" ]; then
    run_bench load-10x10 "$PORT" "$SERVER_PID" -s p10x10 -o "$SPEC_SMALL" -w insert
    run_bench load-1k "$PORT" "$SERVER_PID" -s p1k -o "$SPEC_1K" -w insert
fi
# Each workload against citrined, then at once against the ceiling, so both
# see nearly the same moment of the machine.
for workload in "ru95-10x10 p10x10 $SPEC_SMALL ru,95" "ru50-10x10 p10x10 $SPEC_SMALL ru,50" "ru95-1k p1k $SPEC_1K ru,95"; do
    read -r name set spec mix <<<"$workload"
    run_bench "citrined-$name" "$PORT" "$SERVER_PID" -s "$set" -o "$spec" -w "$mix" -d "$DURATION"
    run_bench "noop-$name" "$NOOP_PORT" "$NOOP_PID" -s "$set" -o "$spec" -w "$mix" -d "$DURATION"
done
if [ "$BATCH" != "0" ]; then
    run_bench "citrined-batch-10x10" "$PORT" "$SERVER_PID" -s p10x10 -o "$SPEC_SMALL" -w ru,100 --batch-size "$BATCH" -d "$DURATION"
    run_bench "noop-batch-10x10" "$NOOP_PORT" "$NOOP_PID" -s p10x10 -o "$SPEC_SMALL" -w ru,100 --batch-size "$BATCH" -d "$DURATION"
fi
if [ "$QUERY_GROUPS" != "0" ]; then
    SPEC_GROUP="G:$QUERY_GROUPS,10*S:10"
    PER_GROUP=$((KEYS / QUERY_GROUPS))
    [ "$PER_GROUP" -ge 1 ] || PER_GROUP=1
    run_bench load-group "$PORT" "$SERVER_PID" -s pgroup -o "$SPEC_GROUP" -w insert
    run_bench citrined-query "$PORT" "$SERVER_PID" -s pgroup -o "$SPEC_GROUP" -w query -d "$DURATION"
    run_bench citrined-query-batch "$PORT" "$SERVER_PID" -s pgroup -o "$SPEC_GROUP" -w ru,100 --batch-size "$PER_GROUP" -d "$DURATION"
fi
# One command at a time: the round trip itself, against the ceiling and
# against the machine's floor for any server (plain sockets, no protocol).
C=1 run_bench citrined-ru95-10x10-c1 "$PORT" "$SERVER_PID" -s p10x10 -o "$SPEC_SMALL" -w ru,95 -d "$DURATION"
C=1 run_bench noop-ru95-10x10-c1 "$NOOP_PORT" "$NOOP_PID" -s p10x10 -o "$SPEC_SMALL" -w ru,95 -d "$DURATION"
if command -v gcc >/dev/null 2>&1; then
    echo "== loopback floor (bench/loopback-pingpong.c)"
    gcc -O2 -o "$WORK/loopback-pingpong" "$ROOT/bench/loopback-pingpong.c"
    # About DURATION seconds at this machine's ~65 us a round trip.
    ROUND_TRIPS=$(python3 -c "print(max(1000, int(float('$DURATION') * 15000)))")
    "$WORK/loopback-pingpong" "$ROUND_TRIPS" --json "$WORK/floor.json"
    echo "gcc -O2 -o loopback-pingpong bench/loopback-pingpong.c && ./loopback-pingpong $ROUND_TRIPS" >>"$COMMANDS_FILE"
else
    echo "== loopback floor skipped: no gcc"
fi
# Record UDFs, each right before its plain baseline on the same keys. No
# ceiling: citrined --noop runs no Lua.
if [ "$UDF" = "1" ]; then
    K="$UDF_KEYS" run_bench load-udf "$PORT" "$SERVER_PID" -s pudf -o I -w insert
    K="$UDF_KEYS" run_bench citrined-udf "$PORT" "$SERVER_PID" -s pudf -o I -w udf -d "$DURATION"
    K="$UDF_KEYS" run_bench citrined-udf-baseline "$PORT" "$SERVER_PID" -s pudf -o I -w ru,0 -d "$DURATION"
    K="$UDF_KEYS" run_bench citrined-udf-read "$PORT" "$SERVER_PID" -s pudf -o I -w udf-read -d "$DURATION"
    K="$UDF_KEYS" run_bench citrined-udf-read-baseline "$PORT" "$SERVER_PID" -s pudf -o I -w ru,100 -d "$DURATION"
fi

echo "== writing $RESULTS"
CPU_MODEL="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || echo unknown)"
export WORK RESULTS DATA_SIZE DURATION KEYS CONCURRENCY LOAD BATCH QUERY_GROUPS UDF_KEYS CPU_MODEL NOTE="${NOTE:-}" FAILED
export NPROC="$(nproc)" KERNEL="$(uname -sr)" LOADAVG="$(cut -d' ' -f1-3 /proc/loadavg)"
export GIT_REV="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo none)"
python3 - <<'PY'
import json, os, datetime
work = os.environ["WORK"]
def load(name):
    try:
        with open(os.path.join(work, name + ".json")) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
def lat(run, op):
    o = (run or {}).get("ops", {}).get(op)
    if not o:
        return "-"
    return f'{o["p50_ms"]:.3f} / {o["p99_ms"]:.3f} / {o["p99_9_ms"]:.3f}'
def cpu(run, which="server"):
    v = (run or {}).get(which + "_cpu_us_per_op")
    return "-" if v is None else f"{v:.1f}"
lines = []
now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
lines.append(f"## {now} — commit {os.environ['GIT_REV']}, {os.environ['DURATION']} s per workload")
lines.append("")
lines.append(f"Machine: {os.environ['NPROC']} CPUs ({os.environ['CPU_MODEL']}), {os.environ['KERNEL']}; "
             f"load average at the end {os.environ['LOADAVG']}. Client, citrined and citrined --noop share these CPUs over loopback.")
lines.append(f"Keys {os.environ['KEYS']}, concurrency {os.environ['CONCURRENCY']}, uniform key choice, total timeout 1 s, 2 retries.")
if os.environ.get("NOTE"):
    lines.append("")
    lines.append("Note: " + os.environ["NOTE"])
lines.append("")
if os.environ.get("FAILED", "").strip():
    lines.append("Runs that failed (no row): " + ", ".join(os.environ["FAILED"].split()) + ".")
    lines.append("")
lines.append("| workload | target | ops/s | read p50 / p99 / p99.9 ms | write p50 / p99 / p99.9 ms | server CPU µs/op | client CPU µs/op | errors | vs no-op |")
lines.append("|---|---|---:|---|---|---:|---:|---:|---:|")
for name in ["load-10x10", "load-1k", "load-group", "load-udf"]:
    run = load(name)
    if run:
        lines.append(f"| {run['workload']} {run['object_spec']} | citrined | {run['throughput_ops_s']:.0f} | - | {lat(run, 'write')} | {cpu(run)} | {cpu(run, 'client')} | {run['errors']} | - |")
def pairs(name):
    """(target, run, fraction of the ceiling) for citrined's and the no-op's runs of `name`."""
    c, n = load("citrined-" + name), load("noop-" + name)
    for target, run in [("citrined", c), ("no-op", n)]:
        if not run:
            continue
        frac = "-"
        if target == "citrined" and n and n["throughput_ops_s"] > 0:
            frac = f"{run['throughput_ops_s'] / n['throughput_ops_s']:.2f}"
        yield target, run, frac
for wl, label in [("ru95-10x10", "ru,95 10*S:10"), ("ru50-10x10", "ru,50 10*S:10"), ("ru95-1k", "ru,95 B:1024"),
                  ("ru95-10x10-c1", "ru,95 10*S:10, -c 1")]:
    for target, run, frac in pairs(wl):
        lines.append(f"| {label} | {target} | {run['throughput_ops_s']:.0f} | {lat(run, 'read')} | {lat(run, 'write')} | {cpu(run)} | {cpu(run, 'client')} | {run['errors']} | {frac} |")
for target, run, frac in pairs("batch-10x10"):
    keys = run.get("batch_keys_per_sec") or 0
    lines.append(f"| batch reads of {run.get('batch_size')} keys 10*S:10 ({keys:.0f} keys/s) | {target} | {run['throughput_ops_s']:.0f} batches/s | {lat(run, 'batch')} | - | {cpu(run)} per batch | {cpu(run, 'client')} per batch | {run['errors']} | {frac} |")
q, qb = load("citrined-query"), load("citrined-query-batch")
if q:
    per = (q.get("query_records_per_sec") or 0) / q["throughput_ops_s"] if q["throughput_ops_s"] else 0
    frac = "-"
    if qb and qb.get("batch_keys_per_sec"):
        frac = f"{(q.get('query_records_per_sec') or 0) / qb['batch_keys_per_sec']:.2f} of batch"
    lines.append(f"| query: one group of {per:.0f} records, G:{os.environ['QUERY_GROUPS']},10*S:10 ({q.get('query_records_per_sec') or 0:.0f} records/s) | citrined | {q['throughput_ops_s']:.0f} queries/s | {lat(q, 'query')} | - | {cpu(q)} per query | {cpu(q, 'client')} per query | {q['errors']} | {frac} |")
if qb:
    lines.append(f"| baseline: batch reads of {qb.get('batch_size')} keys, same records ({qb.get('batch_keys_per_sec') or 0:.0f} keys/s) | citrined | {qb['throughput_ops_s']:.0f} batches/s | {lat(qb, 'batch')} | - | {cpu(qb)} per batch | {cpu(qb, 'client')} per batch | {qb['errors']} | - |")
udf_runs = [("citrined-udf", "citrined-udf-baseline", "udf", "write",
             "record UDF citrine_bench.incr (read b0, add 1, update)", "ru,0 (a put of b0)"),
            ("citrined-udf-read", "citrined-udf-read-baseline", "udf-read", "read",
             "record UDF citrine_bench.get (return b0, read-only)", "ru,100 (a read)")]
for name, base_name, op, base_op, label, base_label in udf_runs:
    u, b = load(name), load(base_name)
    # The UDF's latency in the column of the plain op it stands for.
    cols = lambda run, o: f"{lat(run, o)} | -" if base_op == "read" else f"- | {lat(run, o)}"
    if u:
        frac = "-"
        if b and b["throughput_ops_s"] > 0:
            frac = f"{u['throughput_ops_s'] / b['throughput_ops_s']:.2f} of {b['workload']}"
            if u.get("server_cpu_us_per_op") is not None and b.get("server_cpu_us_per_op") is not None:
                frac += f", {u['server_cpu_us_per_op'] - b['server_cpu_us_per_op']:+.1f} µs server CPU"
        lines.append(f"| {label} I, {os.environ['UDF_KEYS']} keys | citrined | {u['throughput_ops_s']:.0f} | {cols(u, op)} | {cpu(u)} | {cpu(u, 'client')} | {u['errors']} | {frac} |")
    if b:
        lines.append(f"| baseline: {base_label} I, same keys | citrined | {b['throughput_ops_s']:.0f} | {cols(b, base_op)} | {cpu(b)} | {cpu(b, 'client')} | {b['errors']} | - |")
floor = load("floor")
if floor:
    ms = f'{floor["p50_ms"]:.3f} / {floor["p99_ms"]:.3f} / {floor["p99_9_ms"]:.3f}'
    lines.append(f"| ping-pong 80 B / 48 B, one at a time | loopback floor | {floor['throughput_ops_s']:.0f} | {ms} | - | "
                 f"{floor['server_cpu_us_per_op']:.1f} | {floor['client_cpu_us_per_op']:.1f} | 0 | - |")
lines.append("")
lines.append("The no-op rows are the same citrined binary started with `--noop`: its listener and I/O answer every command with a header-only success (no bins back) and store nothing, "
             "so they are the ceiling of the client, the loopback path, this server's I/O and the shared CPUs, measured right after each citrined row. "
             "Reads against it return no data; reads of citrined return the full record.")
if load("citrined-udf") or load("citrined-udf-read"):
    lines.append("")
    lines.append("The record-UDF rows call the bench's own Lua module (citrine_bench.lua, registered by `citrine bench -w udf`) on "
                 f"{os.environ['UDF_KEYS']} keys holding one integer bin (load-udf): `incr` reads b0, adds 1, writes it back with "
                 "`aerospike:update` and returns it, one round trip; `get` only returns b0. Each is followed by its plain baseline "
                 "on the same keys (a put of the bin, `ru,0`, for incr; a read, `ru,100`, for get), and its last column is the "
                 "UDF's throughput as a fraction of the baseline's and the server CPU it adds per operation: what calling Lua costs. "
                 "They have no no-op ceiling row: `citrined --noop` runs no Lua (it would answer each call with a header-only success).")
if floor:
    lines.append("")
    lines.append("The loopback floor row is bench/loopback-pingpong.c: two processes passing an 80-byte request and a 48-byte reply "
                 "over plain blocking loopback sockets, one at a time, with no protocol at all (its server CPU column is the responder's). "
                 "The -c 1 rows are read against it: no server answers one request at a time faster on this machine.")
lines.append("")
lines.append("citrined ran with `--config bench.toml` (written by run.sh): one in-memory namespace `test`, "
             f"data-size {os.environ['DATA_SIZE']}, replication factor 1, no eviction.")
lines.append("")
lines.append("Commands (bench/run.sh):")
lines.append("")
lines.append("```")
with open(os.path.join(work, "commands.txt")) as f:
    lines.extend(l.rstrip("\n") for l in f)
lines.append("```")
lines.append("")
path = os.environ["RESULTS"]
exists = os.path.exists(path)
# A section starts after a blank line, whatever the file ended with.
separator = ""
if exists:
    with open(path, "rb") as f:
        f.seek(max(os.path.getsize(path) - 2, 0))
        tail = f.read()
    separator = "" if tail.endswith(b"\n\n") or not tail else ("\n" if tail.endswith(b"\n") else "\n\n")
with open(path, "a") as f:
    if not exists:
        f.write("# Citrine benchmark results\n\nAppended by `bench/run.sh` (see bench/README.md). Newest last.\n\n")
    f.write(separator + "\n".join(lines) + "\n")
print("\n".join(lines))
PY
if [ -n "${FAILED// /}" ]; then
    echo "error: these runs failed:$FAILED" >&2
    exit 1
fi
