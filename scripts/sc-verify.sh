#!/usr/bin/env bash
# On demand (not in CI): issue 39's real-process fault run. NODES citrined
# nodes share a strong-consistency namespace `sc` (replication factor 2, a
# device file, commit-to-device; scripts/lib/sc-nodes.sh starts them);
# `citrine verify` runs each workload (linearizable reads) against them
# while a nemesis, every FAULT_EVERY seconds, does the next fault of FAULTS:
#   kill1      kill -9 one node and start it again from its work directory
#   kill2      kill -9 two nodes and start both again
#   killall    kill -9 every node at once and start them again
#   pause      SIGSTOP one node for PAUSE seconds, then SIGCONT
#   pauseN     the same for N seconds (pause30, pause60)
#   halves     (NETNS=1) split the nodes into two random halves for HOLD s
#   one        (NETNS=1) cut one random node from the others for HOLD s
#   ring       (NETNS=1) each node reaches only its two ring neighbours
#              (with 5 nodes: every node sees a majority, none the same)
#   clock+N    (FAKE_CLOCK=1) move one node's clock N s ahead for HOLD s,
#   clock-N    or back; then the offset returns to 0 (a second bump)
# Each fault ends before the next begins and before the verifier's final
# reads. Prints each workload's verdict and counts, the faults, and the
# share of operations that succeeded while faults lasted (from the
# verifier's progress lines, one a second); exits non-zero when a verdict
# is not valid or a node died unasked.
#
# Usage: scripts/sc-verify.sh           (NETNS and FAKE_CLOCK need root)
#   CITRINED=path CITRINE=path   binaries (default: the newer of target/release and target/debug)
#   NODES=3                      3 or 5
#   DURATION=60                  seconds each workload runs
#   WORKLOADS="register counter set"
#   FAULTS="kill1 pause kill2 killall"
#   FAULT_EVERY=8 PAUSE=5 HOLD=15  seconds
#   NETNS=1 NETNS_PREFIX=citrinesc SUBNET=10.200.0   nodes in network namespaces
#   FAKE_CLOCK=1                 nodes under libfaketime (installed from Debian when missing)
#   BASE_PORT                    first port (default random)
#   KEEP=1                       keep the work directory (node logs)
set -euo pipefail
cd "$(dirname "$0")/.."

# The newer build of the two profiles.
profile=debug
[[ target/release/citrined -nt target/debug/citrined && -x target/release/citrine ]] && profile=release
CITRINED=${CITRINED:-target/$profile/citrined}
CITRINE=${CITRINE:-target/$profile/citrine}
NODES=${NODES:-3}
DURATION=${DURATION:-60}
WORKLOADS=${WORKLOADS:-register counter set}
FAULTS=${FAULTS:-kill1 pause kill2 killall}
FAULT_EVERY=${FAULT_EVERY:-8}
PAUSE=${PAUSE:-5}
HOLD=${HOLD:-15}
for binary in "$CITRINED" "$CITRINE"; do
    [[ -x $binary ]] || { echo "missing $binary: cargo build -p citrine-server -p citrine-cli" >&2; exit 2; }
done
CITRINED=$(realpath "$CITRINED") CITRINE=$(realpath "$CITRINE")
for fault in $FAULTS; do
    case $fault in
        halves | one | ring) [[ -n ${NETNS:-} ]] || { echo "fault $fault needs NETNS=1" >&2; exit 2; } ;;
        clock*) [[ -n ${FAKE_CLOCK:-} ]] || { echo "fault $fault needs FAKE_CLOCK=1" >&2; exit 2; } ;;
        kill1 | kill2 | killall | pause | pause[0-9]*) ;;
        *) echo "unknown fault $fault" >&2; exit 2 ;;
    esac
done

# shellcheck source=lib/sc-nodes.sh
source scripts/lib/sc-nodes.sh
trap sc_cleanup EXIT
[[ -n ${FAKE_CLOCK:-} ]] && need_faketime
[[ -n ${NETNS:-} ]] && net_up
form_cluster

# A random order of the nodes.
shuffled() { all_nodes | shuf | tr '\n' ' '; }
names() { local node; for node in "$@"; do printf '%s ' "${ids[$node]}"; done; }

# How long a fault lasts, for the nemesis to start none it cannot finish.
fault_length() {
    case $1 in
        kill1 | kill2 | killall) echo 5 ;;
        pause) echo "$PAUSE" ;;
        pause*) echo "${1#pause}" ;;
        *) echo "$HOLD" ;;
    esac
}

# Runs one fault; prints "fault START END NAME description" once it is healed.
run_fault() {
    local fault=$1 order start node n
    read -ra order <<< "$(shuffled)"
    node=${order[0]}
    start=$(date +%s.%N)
    case $fault in
        kill1) desc="kill -9 ${ids[$node]}"; kill_nodes "$node"; sleep 2; start "$node" ;;
        kill2) desc="kill -9 ${ids[$node]} ${ids[${order[1]}]}"; kill_nodes "$node" "${order[1]}"
               sleep 3; start "$node"; start "${order[1]}" ;;
        killall) desc="kill -9 all"; kill_nodes $(all_nodes); sleep 2
                 for n in $(all_nodes); do start "$n"; done ;;
        pause | pause[0-9]*) local seconds
               seconds=$(fault_length "$fault"); desc="SIGSTOP ${ids[$node]} ${seconds}s"
               kill -STOP "$(pid_of "$node")"; sleep "$seconds"; kill -CONT "$(pid_of "$node")" ;;
        halves) local half=$((NODES / 2)) left right
                left=("${order[@]:0:half}") right=("${order[@]:half}")
                desc="partition $(names "${left[@]}")/ $(names "${right[@]}")"
                cut "${left[@]}" / "${right[@]}"; sleep "$HOLD"; heal ;;
        one) desc="partition ${ids[$node]} alone"; cut "$node" / "${order[@]:1}"; sleep "$HOLD"; heal ;;
        ring) desc="ring $(names "${order[@]}")"
              for ((n = 0; n < NODES; n++)); do
                  local far
                  for ((far = 2; far <= NODES - 2; far++)); do
                      cut "${order[n]}" / "${order[(n + far) % NODES]}"
                  done
              done
              sleep "$HOLD"; heal ;;
        clock*) desc="clock ${fault#clock} s on ${ids[$node]}"
                bump_clock "$node" "${fault#clock}"; sleep "$HOLD"; bump_clock "$node" "+0" ;;
    esac
    echo "fault $start $(date +%s.%N) $fault $desc"
}

# Faults until the workload's time is up (each one healed before the next,
# the last before the verifier's final reads).
nemesis() {
    local faults round=0 end=$(($(date +%s) + DURATION)) fault
    read -ra faults <<< "$FAULTS"
    while :; do
        sleep "$FAULT_EVERY"
        fault=${faults[round % ${#faults[@]}]}
        (($(date +%s) + $(fault_length "$fault") + 2 < end)) || break
        round=$((round + 1))
        check_alive
        run_fault "$fault"
    done
}

# The share of operations completed while faults lasted that succeeded
# (and, to compare, outside them):
# progress lines "[ 12.0s] N ops (r/s): A ok, F failed, D in doubt" give
# running totals; a fault's operations are the difference across it.
availability() { # verify output, nemesis output, the verifier's start (epoch)
    python3 - "$@" <<'PY'
import re, sys
progress, faults, start = open(sys.argv[1]).read(), open(sys.argv[2]).read(), float(sys.argv[3])
points = [(start + float(t), int(ok), int(fail), int(doubt)) for t, ok, fail, doubt in
          re.findall(r"^\[\s*([\d.]+)s\] \d+ ops \([^)]*\): (\d+) ok, (\d+) failed, (\d+) in doubt", progress, re.M)]
def at(t):
    last = (start, 0, 0, 0)
    for point in points:
        if point[0] > t:
            break
        last = point
    return last
sums = {}
for begin, end, kind, desc in re.findall(r"^fault (\S+) (\S+) (\S+) (.*)$", faults, re.M):
    a, b = at(float(begin)), at(float(end))
    ok, fail, doubt = b[1] - a[1], b[2] - a[2], b[3] - a[3]
    total = sums.setdefault(kind, [0, 0, 0, 0.0])
    total[0] += ok; total[1] += fail; total[2] += doubt; total[3] += float(end) - float(begin)
    print(f"  {desc}: {float(end) - float(begin):.0f}s, {ok} ok, {fail} failed, {doubt} in doubt")
for kind, (ok, fail, doubt, seconds) in sums.items():
    done = ok + fail + doubt
    share = f"{100 * ok / done:.0f}%" if done else "-"
    print(f"availability during {kind}: {share} of {done} operations ok ({seconds:.0f}s of faults, {ok / max(seconds, 1e-9):.0f} ok/s)")
if points:
    _, ok, fail, doubt = points[-1]
    print(f"whole run: {ok} ok, {fail} failed, {doubt} in doubt")
    rest = [ok - sum(t[0] for t in sums.values()), fail - sum(t[1] for t in sums.values()),
            doubt - sum(t[2] for t in sums.values())]
    print(f"outside faults: {100 * rest[0] / max(1, sum(rest)):.0f}% of {sum(rest)} operations ok"
          " (register counts compare-and-sets that lost the race as failed)")
PY
}

status=0
for workload in $WORKLOADS; do
    echo "== $workload, ${DURATION}s, $NODES nodes, faults: $FAULTS, one every ${FAULT_EVERY}s"
    nemesis > "$work/nemesis-$workload.txt" 2>&1 &
    nemesis_pid=$!
    verify_start=$(date +%s.%N)
    set +e
    "$CITRINE" verify -h "$(host_of 0):$(port 0 0)" -n sc --workload "$workload" --time "${DURATION}s" \
        --read-mode linearize > "$work/verify-$workload.txt" 2>&1
    code=$?
    set -e
    wait "$nemesis_pid" 2>/dev/null || true
    # Anything the nemesis left behind (it should leave nothing) is undone.
    for node in $(all_nodes); do
        kill -CONT "$(pid_of "$node")" 2>/dev/null || true
        kill -0 "$(pid_of "$node")" 2>/dev/null || start "$node"
        [[ -n ${FAKE_CLOCK:-} ]] && bump_clock "$node" "+0"
    done
    [[ -n ${NETNS:-} ]] && heal
    wait_for "$NODES nodes in one view" whole_cluster
    if ! wait_for "every sc partition available" all_available; then
        grep -v '^\[' "$work/verify-$workload.txt" | tail -6
        echo "UNAVAILABLE with every node back:"; partition_report
        exit 1
    fi
    grep -v '^progress\|^\[' "$work/verify-$workload.txt" | tail -15
    echo "faults: $(grep -c '^fault' "$work/nemesis-$workload.txt" || true)"
    availability "$work/verify-$workload.txt" "$work/nemesis-$workload.txt" "$verify_start"
    grep '^UNEXPECTED' "$work/nemesis-$workload.txt" && status=1
    echo "exit status $code"
    [[ $code == 0 ]] || status=1
done
exit "$status"
