# Shared by scripts/sc-verify.sh: start, kill, pause, partition and
# clock-bump real citrined nodes of a strong-consistency namespace `sc`
# (rf 2, a device file, commit-to-device). Source it after setting
#   CITRINED, CITRINE   binaries
#   NODES               how many nodes (3 or 5)
#   NETNS=1             each node in its own network namespace (root): the
#                       nodes on a bridge, so the nemesis can cut links
#   NETNS_PREFIX        names of the namespaces, veths and bridge (default
#                       citrinesc; at most 7 characters)
#   SUBNET              the nodes' /24 without its last octet (default 10.200.0)
#   FAKE_CLOCK=1          each node runs under libfaketime with a clock file
#                       the nemesis rewrites (an offset such as +60 or -60)
#   FAKE_MONOTONIC=0      the offset moves CLOCK_REALTIME only (as an NTP step
#                       or `date -s` does), not CLOCK_MONOTONIC
#   BASE_PORT           first port (default: random, below the ephemeral range)
# It defines start, kill_nodes, pause/resume, cut/heal, bump_clock,
# form_cluster, check_alive and sc_cleanup, and creates $work.
#
# Invariants: each node's pid is in $work/<id>.pid (the nemesis runs in a
# subshell and restarts nodes there); in NETNS mode node i listens on
# $SUBNET.(i+1), every link between two nodes can be cut by a blackhole
# route in each one's namespace, and the host (where the verifier runs)
# reaches every node at all times over the bridge ($SUBNET.254).

NETNS_PREFIX=${NETNS_PREFIX:-citrinesc}
SUBNET=${SUBNET:-10.200.0}
work=$(mktemp -d /tmp/citrine-sc-verify.XXXXXX)
# Below the kernel's ephemeral ports (32768 on), which other processes' connections take.
base=${BASE_PORT:-$((20000 + RANDOM % 12000))}
ids=()
for ((node = 0; node < NODES; node++)); do ids+=("A$((node + 1))"); done
all_nodes() { seq 0 $((NODES - 1)); }

pid_of() { cat "$work/${ids[$1]}.pid"; }
port() { echo $((base + 10 * $1 + $2)); }   # node, 0 service / 1 fabric / 2 heartbeat
host_of() { if [[ -n ${NETNS:-} ]]; then echo "$SUBNET.$(($1 + 1))"; else echo 127.0.0.1; fi; }
netns_of() { echo "${NETNS_PREFIX}-n$1"; }
info() { "$CITRINE" info -h "$(host_of "$1"):$(port "$1" 0)" -v "$2" 2>/dev/null || true; }

# The network: a bridge on the host, one namespace per node joined to it by
# a veth pair. Names are removed first in case a killed run left them.
net_down() {
    local node
    for node in $(all_nodes); do ip netns del "$(netns_of "$node")" 2>/dev/null || true; done
    ip link del "${NETNS_PREFIX}br" 2>/dev/null || true
}
net_up() {
    local node bridge=${NETNS_PREFIX}br ns outer inner
    net_down
    ip link add "$bridge" type bridge
    ip addr add "$SUBNET.254/24" dev "$bridge"
    ip link set "$bridge" up
    for node in $(all_nodes); do
        ns=$(netns_of "$node") outer=${NETNS_PREFIX}${node}h inner=${NETNS_PREFIX}${node}n
        ip netns add "$ns"
        ip link add "$outer" type veth peer name "$inner"
        ip link set "$inner" netns "$ns"
        ip link set "$outer" master "$bridge"
        ip link set "$outer" up
        ip -n "$ns" addr add "$(host_of "$node")/24" dev "$inner"
        ip -n "$ns" link set lo up
        ip -n "$ns" link set "$inner" up
    done
}

config="$work/cluster.toml"
cat "$(dirname "${BASH_SOURCE[0]}")/../../examples/cluster.toml" - > "$config" <<'EOF'

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

# libfaketime from Debian's package, installed here when missing (root).
FAKETIME_LIB=/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1
need_faketime() {
    [[ -f $FAKETIME_LIB ]] && return 0
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
        echo "libfaketime missing: installing Debian's libfaketime"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfaketime >/dev/null
    fi
    [[ -f $FAKETIME_LIB ]] || { echo "no $FAKETIME_LIB (apt-get install libfaketime)" >&2; exit 2; }
}

# The command line of a node: in its namespace, under libfaketime. The
# clock file holds the node's offset; libfaketime reads it again at most
# a second after it changed (FAKETIME_CACHE_DURATION), and applies it to
# CLOCK_REALTIME and, unless FAKE_MONOTONIC=0, to CLOCK_MONOTONIC too
# (Rust's Instant, so the node's timers jump with its wall clock: 60 s
# back stalls them for 60 s).
node_command() {
    local node=$1 seeds=() other
    for other in $(all_nodes); do seeds+=(--seed "$(host_of "$other"):$(port "$other" 2)"); done
    if [[ -n ${NETNS:-} ]]; then printf '%s\0' ip netns exec "$(netns_of "$node")"; fi
    if [[ -n ${FAKE_CLOCK:-} ]]; then
        [[ -f $work/${ids[$node]}.faketime ]] || echo "+0" > "$work/${ids[$node]}.faketime"
        printf '%s\0' env "LD_PRELOAD=$FAKETIME_LIB" "FAKETIME_TIMESTAMP_FILE=$work/${ids[$node]}.faketime" \
            FAKETIME_CACHE_DURATION=1
        if [[ ${FAKE_MONOTONIC:-1} == 0 ]]; then printf '%s\0' FAKETIME_DONT_FAKE_MONOTONIC=1; fi
    fi
    printf '%s\0' "$CITRINED" --config "$config" --address "$(host_of "$node")" --port "$(port "$node" 0)" \
        --fabric-port "$(port "$node" 1)" --heartbeat-port "$(port "$node" 2)" \
        --node-id "${ids[$node]}" --data-dir "$work/${ids[$node]}" "${seeds[@]}"
}

start() {
    local node=$1 command=()
    mkdir -p "$work/${ids[$node]}"
    mapfile -d '' command < <(node_command "$node")
    # (In a subshell: not a job of this shell, whose kills it would report;
    # it waits for the node and logs how it ended: 137 is SIGKILL. `ip
    # netns exec` and `env` exec the server, so the pid is the server's.)
    local log="$work/${ids[$node]}.log"
    rm -f "$work/${ids[$node]}.pid"
    (
        "${command[@]}" >>"$log" 2>&1 &
        pid=$!
        echo "$pid" > "$work/${ids[$node]}.pid"
        wait "$pid"
        echo "sc-verify: citrined $pid exited with status $?" >> "$log"
    ) 2>/dev/null &
    while [[ ! -s $work/${ids[$node]}.pid ]]; do sleep 0.01; done
}

wait_for() { # what, command...
    local what=$1; shift
    for _ in $(seq 1 900); do "$@" && return 0; sleep 0.1; done
    echo "timed out waiting for $what" >&2
    return 1
}
whole_cluster() {
    local node
    for node in $(all_nodes); do
        [[ $(info "$node" statistics | tr ';' '\n' | grep '^cluster_size=') == "cluster_size=$NODES" ]] || return 1
    done
}
all_available() {
    local node
    for node in $(all_nodes); do
        [[ $(info "$node" namespace/sc | tr ';' '\n' | grep '^unavailable_partitions=') == unavailable_partitions=0 ]] || return 1
    done
}

# Each node's unavailable and dead partitions of `sc` (said when a run
# ends with partitions the whole cluster cannot serve).
partition_report() {
    local node
    for node in $(all_nodes); do
        echo "${ids[$node]}: $(info "$node" namespace/sc | tr ';' '\n' | grep -E '^(unavailable|dead)_partitions=' | paste -sd' ' -)"
    done
}

# Starts every node, sets the roster to the observed nodes and waits until
# every partition is available.
form_cluster() {
    local node observed
    for node in $(all_nodes); do start "$node"; done
    wait_for "$NODES nodes in one view" whole_cluster
    observed=$(info 0 roster:namespace=sc | tr ':' '\n' | sed -n 's/^observed_nodes=//p')
    [[ $(info 0 "roster-set:namespace=sc;nodes=$observed") == ok ]]
    # recluster: is the principal's: the others answer ignored-by-non-principal.
    for node in $(all_nodes); do info "$node" recluster:; done | grep -qx ok
    wait_for "every sc partition available" all_available
    echo "cluster up: $NODES nodes, roster $observed, work directory $work"
}

# A node that died without the nemesis killing it is a finding: said, and
# started again.
check_alive() {
    local node
    for node in $(all_nodes); do
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

# Cuts (or heals) the links between every node of the first group and
# every node of the second ("a b c / d e"): blackhole routes both ways.
cut() {
    local side=left a b
    local left=() right=()
    for a in "$@"; do
        if [[ $a == / ]]; then side=right; continue; fi
        if [[ $side == left ]]; then left+=("$a"); else right+=("$a"); fi
    done
    for a in "${left[@]}"; do
        for b in "${right[@]}"; do
            ip -n "$(netns_of "$a")" route replace blackhole "$(host_of "$b")/32"
            ip -n "$(netns_of "$b")" route replace blackhole "$(host_of "$a")/32"
        done
    done
}
heal() {
    local a b
    for a in $(all_nodes); do
        for b in $(all_nodes); do
            [[ $a == "$b" ]] || ip -n "$(netns_of "$a")" route del blackhole "$(host_of "$b")/32" 2>/dev/null || true
        done
    done
}

# Sets a node's clock offset (libfaketime's syntax: +60, -60, +0).
bump_clock() {
    echo "$2" > "$work/${ids[$1]}.faketime"
    echo "sc-verify: the nemesis sets the clock offset to $2" >> "$work/${ids[$1]}.log"
}

sc_cleanup() {
    local node pid
    set +e
    for node in $(all_nodes); do
        pid=$(pid_of "$node" 2>/dev/null) || continue
        kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
    done
    wait 2>/dev/null
    [[ -n ${NETNS:-} ]] && net_down
    if [[ -n ${KEEP:-} ]]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
