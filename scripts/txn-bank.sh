#!/usr/bin/env bash
# The bank workload of issue 40 (point 4) against real processes under
# faults: a three-node strong-consistency cluster (`test`, two copies, the
# roster set, in memory), the official Python client's Transaction API.
# WRITERS threads move random amounts between ACCOUNTS accounts, each
# transfer one transaction (read both, write both, commit); READERS
# threads read every account in one transaction and commit it (the
# commit verifies every read). Meanwhile a nemesis, every NEMESIS_EVERY
# seconds, alternately kill -9s a node (relaunched empty 3 s later) or
# SIGSTOPs one for 3 s, never node 1 (the client's seed); the next fault
# waits until the cluster is whole again.
#
# Checked: every read transaction that committed saw the total and no
# negative balance (a serializable snapshot); after the faults stop and
# every deadline passed, a plain read of every account keeps the total
# with no negative balance, and no node holds a provisional version or an
# open monitor (mrt_provisionals, mrt_monitors_active: every abandoned
# transaction was rolled by the cluster). Exit 1 on a violation. On
# demand, not CI (it runs SECONDS_TOTAL plus ~20 s).
#
#   scripts/txn-bank.sh
#
# Environment (all optional): SECONDS_TOTAL (default 60), ACCOUNTS (10),
# WRITERS (4), READERS (3; a read of every account is refused while any
# is locked, so more writers leave fewer snapshots), NEMESIS_EVERY (8; 0: no faults),
# STABLE_FOR (6: seconds the whole cluster must stay stable after a fault), VENV (a venv
# with the `aerospike` package; default: the repository's .venv, made by
# scripts/setup-python.sh), PORT_FIRST / PORT_LAST (default 3400-3449),
# CITRINED, NO_BUILD, WORK as in scripts/lib/citrined-run.sh.
set -euo pipefail

SCRIPT_NAME=txn-bank.sh
WORK_PREFIX=txn-bank
NEEDS_GO=0
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"

VENV="${VENV:-$REPO/.venv}"
[ -x "$VENV/bin/python" ] || "$REPO/scripts/setup-python.sh" >/dev/null
"$VENV/bin/python" -c "import aerospike" 2>/dev/null || die "no aerospike package in $VENV"

SECONDS_TOTAL=${SECONDS_TOTAL:-60}
NEMESIS_EVERY=${NEMESIS_EVERY:-8}
start_sc_test 3
echo "== commit $(git -C "$REPO" rev-parse --short HEAD), $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"

"$VENV/bin/python" - "$PORT" "$SECONDS_TOTAL" "${ACCOUNTS:-10}" "${WRITERS:-4}" \
    "${READERS:-3}" "$WORK/ready" >"$WORK/bank.out" 2>&1 <<'PY' &
import random, sys, threading, time
import aerospike
from aerospike import exception as ex

port, seconds, accounts, writers, readers = (int(v) for v in sys.argv[1:6])
ready = sys.argv[6]
INITIAL = 100
TOTAL = INITIAL * accounts
timeouts = {"total_timeout": 3_000, "max_retries": 2}
policies = {n: dict(timeouts) for n in ("read", "write", "txn_verify", "txn_roll")}
client = aerospike.client({"hosts": [("127.0.0.1", port)], "policies": policies}).connect()
keys = [("test", "bank", f"account-{i}") for i in range(accounts)]
for key in keys:
    client.put(key, {"bal": INITIAL})
open(ready, "w").close()
tally = {"committed": 0, "refused": 0, "in_doubt": 0, "reads_ok": 0, "reads_refused": 0}
violations = []
lock = threading.Lock()
stop = time.time() + seconds  # from the accounts' creation on


def count(what):
    with lock:
        tally[what] += 1


def abort(txn):
    try:
        client.abort(txn)
    except ex.AerospikeError:
        pass


def transfer(rng):
    a, b = rng.sample(range(accounts), 2)
    amount = rng.randint(1, 30)
    txn = aerospike.Transaction()
    policy = {"txn": txn}
    try:
        bal_a = client.get(keys[a], policy=policy)[2]["bal"]
        bal_b = client.get(keys[b], policy=policy)[2]["bal"]
        if bal_a < amount:
            abort(txn)
            return
        client.put(keys[a], {"bal": bal_a - amount}, policy=policy)
        client.put(keys[b], {"bal": bal_b + amount}, policy=policy)
    except ex.AerospikeError:
        abort(txn)
        count("refused")
        return
    try:
        client.commit(txn)
        count("committed")
    except ex.AerospikeError as error:
        # The commit's outcome may be unknown; the total holds either way.
        count("in_doubt" if getattr(error, "in_doubt", True) else "refused")


def read_all():
    txn = aerospike.Transaction()
    policy = {"txn": txn}
    try:
        balances = [client.get(key, policy=policy)[2]["bal"] for key in keys]
        client.commit(txn)
    except ex.AerospikeError:
        abort(txn)
        count("reads_refused")
        return
    count("reads_ok")
    if sum(balances) != TOTAL or min(balances) < 0:
        with lock:
            violations.append(("snapshot", time.time(), balances))


def run(work, seed):
    rng = random.Random(seed)
    while time.time() < stop:
        work(rng) if work is transfer else work()


threads = [threading.Thread(target=run, args=(transfer, i)) for i in range(writers)]
threads += [threading.Thread(target=run, args=(read_all, 100 + i)) for i in range(readers)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print("workload", tally, flush=True)
# Every deadline passes (mrt-duration 10 s) and the recovery rolls.
time.sleep(15)
for attempt in range(60):
    try:
        final = [client.get(key)[2]["bal"] for key in keys]
        break
    except ex.AerospikeError:
        time.sleep(1)
else:
    final = None
print("final", final, "sum", final and sum(final), flush=True)
if final is None or sum(final) != TOTAL or min(final) < 0:
    violations.append(("final", time.time(), final))
for violation in violations[:20]:
    print("VIOLATION", violation, flush=True)
print("violations", len(violations), flush=True)
sys.exit(1 if violations else 0)
PY
BANK=$!

# wait_whole: until every node answers cluster-stable for three nodes
# (the relaunched, empty node filled again) with one cluster key, and
# keeps answering it for STABLE_FOR seconds. A memory namespace loses a
# killed node's copies: killing the other replica before then loses the
# only copy, and the strong-consistency partition is dead, as it should be.
# (Stable once is not enough: right after a SIGSTOP ends, the others have
# not yet dropped the paused node from the view — a heartbeat timeout, 1.5
# s, then the principal's next view — so every node still answers the old
# view as stable; the view without it and the one that takes it back, with
# its fill, come after. Seen: "whole again" 0.6 s before that eviction,
# node 3 killed 3 s into node 2's fill, 128 partitions unavailable, then
# dead.)
STABLE_FOR=${STABLE_FOR:-6}
wait_whole() {
    local port answer key since=0 stable_key="" deadline=$((SECONDS + 60))
    while [ "$SECONDS" -lt "$deadline" ]; do
        kill -0 "$BANK" 2>/dev/null || return 0
        key=""
        for port in "${CLUSTER_PORTS[@]}"; do
            answer=$(info_value "$port" "cluster-stable:size=3;namespace=test")
            if [[ ! "$answer" =~ ^[0-9A-Fa-f]+$ ]] || { [ -n "$key" ] && [ "$answer" != "$key" ]; }; then
                key=""
                break
            fi
            key=$answer
        done
        if [ -z "$key" ]; then
            stable_key=""
        elif [ "$key" != "$stable_key" ]; then
            stable_key=$key
            since=$SECONDS
        elif [ $((SECONDS - since)) -ge "$STABLE_FOR" ]; then
            echo "   $(date -u +%T) whole again"
            return 0
        fi
        sleep 0.2
    done
    echo "   $(date -u +%T) not whole after 60 s"
}

faults=0
# The faults start once the accounts exist.
while [ ! -e "$WORK/ready" ] && kill -0 "$BANK" 2>/dev/null; do sleep 0.2; done
if [ "$NEMESIS_EVERY" -gt 0 ]; then
    end=$((SECONDS + SECONDS_TOTAL - NEMESIS_EVERY))
    while [ "$SECONDS" -lt "$end" ] && kill -0 "$BANK" 2>/dev/null; do
        sleep "$NEMESIS_EVERY"
        node=$((2 + faults / 2 % 2))
        pid=$(read -ra peers <<<"$PEER_PIDS"; echo "${peers[$((node - 2))]}")
        if [ $((faults % 2)) = 0 ]; then
            echo "   $(date -u +%T) kill -9 node $node (pid $pid)"
            kill -9 "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            sleep 3
            relaunch_node "$node"
            PEER_PIDS=$(sed "s/\b$pid\b/$LAUNCHED_PID/; s/ $LAUNCHED_PID\$//" <<<"$PEER_PIDS")
            wait_whole
        else
            echo "   $(date -u +%T) SIGSTOP node $node (pid $pid) for 3 s"
            kill -STOP "$pid"
            sleep 3
            kill -CONT "$pid"
            wait_whole
        fi
        faults=$((faults + 1))
    done
fi
status=0
wait "$BANK" || status=$?
cat "$WORK/bank.out"
# Every abandoned transaction rolled by the cluster: nothing held.
for _ in $(seq 1 30); do
    left=""
    for port in "${CLUSTER_PORTS[@]}"; do
        stats=";$(info_value "$port" namespace/test);"
        held=$(grep -oE ";mrt_(provisionals|monitors_active)=[0-9]+" <<<"$stats" | tr -d ';' | tr '\n' ' ')
        [[ "$held" == "mrt_provisionals=0 mrt_monitors_active=0 " ]] || left="$left $port: $held;"
    done
    [ -z "$left" ] && break
    sleep 1
done
if [ -n "$left" ]; then
    echo "VIOLATION: transaction state left after every deadline:$left"
    status=1
else
    echo "   no provisional version or monitor left on any node"
fi
echo "== $faults faults; exit $status"
[ "$status" = 0 ] || cluster_story
exit "$status"
