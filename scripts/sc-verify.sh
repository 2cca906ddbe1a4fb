#!/usr/bin/env bash
# On demand (not in CI): issue 39's real-process fault run. Three citrined
# nodes on loopback share a strong-consistency namespace `sc` (replication
# factor 2, a device file, commit-to-device); `citrine verify` runs each
# workload (linearizable reads) against them while a nemesis, every
# FAULT_EVERY seconds, does one of:
#   kill -9 one node and start it again from its work directory,
#   SIGSTOP one node for PAUSE seconds, then SIGCONT,
#   kill -9 two nodes (the survivor serves nothing) and start both again,
#   kill -9 all three at once and start them again.
# Prints each workload's verdict and counts and a summary of the faults;
# exits non-zero when a verdict is not valid.
#
# Usage: scripts/sc-verify.sh
#   CITRINED=path CITRINE=path   binaries (default: the newer of target/release and target/debug)
#   DURATION=60                  seconds each workload runs
#   WORKLOADS="register counter set"
#   FAULT_EVERY=8 PAUSE=5        seconds
#   KEEP=1                       keep the work directory (node logs)
set -euo pipefail
cd "$(dirname "$0")/.."

# The newer build of the two profiles.
profile=debug
[[ target/release/citrined -nt target/debug/citrined && -x target/release/citrine ]] && profile=release
CITRINED=${CITRINED:-target/$profile/citrined}
CITRINE=${CITRINE:-target/$profile/citrine}
DURATION=${DURATION:-60}
WORKLOADS=${WORKLOADS:-register counter set}
FAULT_EVERY=${FAULT_EVERY:-8}
PAUSE=${PAUSE:-5}
for binary in "$CITRINED" "$CITRINE"; do
    [[ -x $binary ]] || { echo "missing $binary: cargo build -p citrine-server -p citrine-cli" >&2; exit 2; }
done

work=$(mktemp -d /tmp/citrine-sc-verify.XXXXXX)
# Below the kernel's ephemeral ports (32768 on), which other processes' connections take.
base=$((20000 + RANDOM % 12000))
ids=(A1 A2 A3)
# Each node's pid is in its file: the nemesis restarts nodes in a subshell.
pid_of() { cat "$work/${ids[$1]}.pid"; }
cleanup() {
    for node in 0 1 2; do
        pid=$(pid_of "$node" 2>/dev/null) || continue
        kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
    done
    wait 2>/dev/null || true
    if [[ -n ${KEEP:-} ]]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

port() { echo $((base + 10 * $1 + $2)); }   # node, 0 service / 1 fabric / 2 heartbeat
info() { "$CITRINE" info -h "127.0.0.1:$(port "$1" 0)" -v "$2" 2>/dev/null || true; }

config="$work/cluster.toml"
cat examples/cluster.toml - > "$config" <<'EOF'

[[namespace]]
name = "sc"
replication-factor = 2
strong-consistency = true

[namespace.storage-engine]
type = "device"
file = "sc.dat"
filesize = "64M"
write-block-size = "128K"
commit-to-device = true
EOF

start() {
    local node=$1 seeds=() other
    for other in 0 1 2; do seeds+=(--seed "127.0.0.1:$(port "$other" 2)"); done
    mkdir -p "$work/${ids[$node]}"
    # (In a subshell: not a job of this shell, whose kills it would report;
    # it waits for the node and logs how it ended: 137 is SIGKILL.)
    local log="$work/${ids[$node]}.log"
    rm -f "$work/${ids[$node]}.pid"
    (
        "$CITRINED" --config "$config" --address 127.0.0.1 --port "$(port "$node" 0)" \
            --fabric-port "$(port "$node" 1)" --heartbeat-port "$(port "$node" 2)" \
            --node-id "${ids[$node]}" --data-dir "$work/${ids[$node]}" "${seeds[@]}" \
            >>"$log" 2>&1 &
        pid=$!
        echo "$pid" > "$work/${ids[$node]}.pid"
        wait "$pid"
        echo "sc-verify: citrined $pid exited with status $?" >> "$log"
    ) 2>/dev/null &
    while [[ ! -s $work/${ids[$node]}.pid ]]; do sleep 0.01; done
}

wait_for() { # what, command...
    local what=$1; shift
    for _ in $(seq 1 600); do "$@" && return 0; sleep 0.1; done
    echo "timed out waiting for $what" >&2
    return 1
}
cluster_of_three() { [[ $(info 0 statistics | tr ';' '\n' | grep '^cluster_size=') == cluster_size=3 ]]; }
all_available() {
    local node
    for node in 0 1 2; do
        [[ $(info "$node" namespace/sc | tr ';' '\n' | grep '^unavailable_partitions=') == unavailable_partitions=0 ]] || return 1
    done
}

for node in 0 1 2; do start "$node"; done
wait_for "three nodes in one view" cluster_of_three
observed=$(info 0 roster:namespace=sc | tr ':' '\n' | sed -n 's/^observed_nodes=//p')
[[ $(info 0 "roster-set:namespace=sc;nodes=$observed") == ok ]]
[[ $(info 0 recluster:) == ok ]]
wait_for "every sc partition available" all_available
echo "cluster up: roster $observed, work directory $work"

# A node that died without the nemesis killing it is a finding: said, and
# started again.
check_alive() {
    local node
    for node in 0 1 2; do
        if ! kill -0 "$(pid_of "$node")" 2>/dev/null; then
            echo "UNEXPECTED: ${ids[$node]} is not running (see ${ids[$node]}.log)"
            start "$node"
        fi
    done
}

# Kills nodes with SIGKILL and waits until they are gone.
kill_nodes() {
    local node pids=()
    for node in "$@"; do
        pids+=("$(pid_of "$node")")
        echo "sc-verify: the nemesis kills $(pid_of "$node")" >> "$work/${ids[$node]}.log"
    done
    kill -CONT "${pids[@]}" 2>/dev/null || true
    kill -9 "${pids[@]}" 2>/dev/null || true
    for pid in "${pids[@]}"; do
        while kill -0 "$pid" 2>/dev/null; do sleep 0.05; done
    done
}

# Faults until the workload's time is up (each one healed before the next,
# the last before the verifier's final reads).
nemesis() {
    local round=0 end=$(($(date +%s) + DURATION - FAULT_EVERY))
    while (($(date +%s) < end)); do
        sleep "$FAULT_EVERY"
        round=$((round + 1))
        local node other
        node=$((RANDOM % 3))
        other=$(((node + 1 + RANDOM % 2) % 3))
        check_alive
        case $((round % 4)) in
            1) echo "fault: kill -9 one (${ids[$node]})"; kill_nodes "$node"; sleep 2; start "$node" ;;
            2) echo "fault: SIGSTOP one for ${PAUSE}s (${ids[$node]})"; kill -STOP "$(pid_of "$node")"
               sleep "$PAUSE"; kill -CONT "$(pid_of "$node")" ;;
            3) echo "fault: kill -9 two (${ids[$node]} ${ids[$other]})"; kill_nodes "$node" "$other"
               sleep 3; start "$node"; start "$other" ;;
            0) echo "fault: kill -9 all three"; kill_nodes 0 1 2; sleep 2; for n in 0 1 2; do start "$n"; done ;;
        esac
    done
}

status=0
for workload in $WORKLOADS; do
    echo "== $workload, ${DURATION}s, a fault every ${FAULT_EVERY}s"
    nemesis > "$work/nemesis-$workload.txt" 2>&1 &
    nemesis_pid=$!
    set +e
    "$CITRINE" verify -h "127.0.0.1:$(port 0 0)" -n sc --workload "$workload" --time "${DURATION}s" \
        --read-mode linearize > "$work/verify-$workload.txt" 2>&1
    code=$?
    set -e
    kill "$nemesis_pid" 2>/dev/null || true
    wait "$nemesis_pid" 2>/dev/null || true
    # The nemesis may have left nodes down or paused: bring all back.
    for node in 0 1 2; do
        kill -CONT "$(pid_of "$node")" 2>/dev/null || true
        kill -0 "$(pid_of "$node")" 2>/dev/null || start "$node"
    done
    wait_for "three nodes in one view" cluster_of_three
    wait_for "every sc partition available" all_available
    grep -v '^progress\|^\[' "$work/verify-$workload.txt" | tail -15
    echo "faults: $(grep -c '^fault' "$work/nemesis-$workload.txt" || true) ($(grep '^fault' "$work/nemesis-$workload.txt" | sed 's/^fault: //; s/ (.*//' | sort | uniq -c | tr -s ' ' | paste -sd, -))"
    grep '^UNEXPECTED' "$work/nemesis-$workload.txt" && status=1
    echo "exit status $code"
    [[ $code == 0 ]] || status=1
done
exit "$status"
