#!/usr/bin/env bash
# What a record written inside a transaction costs against the same write
# outside one (issue 40, point 5), with the official Python client on a
# three-node strong-consistency cluster (`test`, two copies, serve-data on,
# the roster set), in one run: rounds alternate plain writes (one `put` a
# record), transactions of 2 records and of 10 (`Transaction`, a `put` of
# each record inside it, `commit`). Per mode: records/s, transactions/s
# and the three servers' CPU per record (utime + stime from /proc, all
# nodes), each round's figures and the median per mode; one client thread,
# so records/s is the request round trips' pace. A put or transaction that
# fails (a timeout on a loaded machine) is not counted (the transaction is
# aborted), and the failures are reported.
#
#   bench/txn-cost.sh
#
# Environment (all optional): ROUNDS (default 3), SECONDS_PER (seconds of
# each mode in each round, default 8), KEYS (distinct keys, default 10000),
# VENV (a venv with the `aerospike` package, default: made in $WORK and
# installed with pip), PY_CLIENT_VERSION (default 19.0.0), PORT_FIRST /
# PORT_LAST (the nodes' ports, default 3400-3449), CITRINED, NO_BUILD,
# WORK as in scripts/lib/citrined-run.sh.
set -euo pipefail

SCRIPT_NAME=txn-cost.sh
WORK_PREFIX=txn-cost
NEEDS_GO=0
# shellcheck source=../scripts/lib/citrined-run.sh
source "$(dirname "$0")/../scripts/lib/citrined-run.sh"

VENV="${VENV:-$WORK/venv}"
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c "import aerospike" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "aerospike==${PY_CLIENT_VERSION:-19.0.0}" >"$WORK/pip.log" 2>&1 \
        || die "pip install aerospike failed (see $WORK/pip.log)"
fi

start_sc_test 3
echo "== commit $(git -C "$REPO" rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
# shellcheck disable=SC2086
"$VENV/bin/python" - "$PORT" "${ROUNDS:-3}" "${SECONDS_PER:-8}" "${KEYS:-10000}" \
    $SERVER_PID $PEER_PIDS <<'PY'
import os, statistics, sys, time
import aerospike

port, rounds, seconds, keys = (int(v) for v in sys.argv[1:5])
pids = [int(p) for p in sys.argv[5:]]
tick = os.sysconf("SC_CLK_TCK")
timeouts = {"total_timeout": 10_000}
policies = {name: dict(timeouts) for name in ("read", "write", "txn_verify", "txn_roll")}
client = aerospike.client({"hosts": [("127.0.0.1", port)], "policies": policies}).connect()
failed = 0


def cpu_seconds():
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / tick


def run(size, until, start_key):
    """Writes until `until`: one record a put (size 0) or transactions of
    `size` records; returns (records, transactions)."""
    global failed
    records = txns = 0
    key = start_key
    while time.monotonic() < until:
        if size == 0:
            try:
                client.put(("test", "demo", key % keys), {"v": key})
                records += 1
            except aerospike.exception.AerospikeError:
                failed += 1
            key += 1
            continue
        txn = aerospike.Transaction()
        policy = {"txn": txn}
        try:
            for _ in range(size):
                client.put(("test", "demo", key % keys), {"v": key}, policy=policy)
                key += 1
            if client.commit(transaction=txn) != aerospike.COMMIT_OK:
                raise SystemExit("a commit did not answer COMMIT_OK")
            records += size
            txns += 1
        except aerospike.exception.AerospikeError:
            failed += 1
            try:
                client.abort(transaction=txn)
            except aerospike.exception.AerospikeError:
                pass
    return records, txns


modes = [("plain", 0), ("txn-2", 2), ("txn-10", 10)]
results = {name: [] for name, _ in modes}
run(0, time.monotonic() + 1, 0)  # warm-up
for r in range(rounds):
    order = modes if r % 2 == 0 else modes[::-1]
    for name, size in order:
        cpu0, t0 = cpu_seconds(), time.monotonic()
        records, txns = run(size, t0 + seconds, r * 1_000_000)
        cpu1, t1 = cpu_seconds(), time.monotonic()
        rate = records / (t1 - t0)
        cpu_us = (cpu1 - cpu0) * 1e6 / records
        results[name].append((rate, txns / (t1 - t0), cpu_us))
        print(f"round {r + 1} {name:7s} {rate:8.0f} records/s {txns / (t1 - t0):7.0f} txns/s "
              f"servers {cpu_us:6.1f} us CPU/record", flush=True)
base = statistics.median(x[0] for x in results["plain"])
base_cpu = statistics.median(x[2] for x in results["plain"])
for name, _ in modes:
    rate = statistics.median(x[0] for x in results[name])
    cpu = statistics.median(x[2] for x in results[name])
    print(f"median {name:7s} {rate:8.0f} records/s ({rate / base:.2f} of plain), "
          f"{cpu:6.1f} us server CPU/record ({cpu / base_cpu:.2f}x plain)")
print(f"failed puts or transactions (not counted, transactions aborted): {failed}")
PY
