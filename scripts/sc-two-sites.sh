#!/usr/bin/env bash
# On demand (not in CI; needs root for `ip netns` and `tc`): issue 39's
# multi-site check. Two network namespaces are two sites joined through a
# third that delays every packet DELAY_MS/2 each way (a round trip between
# the sites costs DELAY_MS; `tc netem` where the kernel has it would do the
# same, this machine's has not). Each site runs two
# citrined nodes on its own rack (site 1: rack 1, site 2: rack 2); they
# share a strong-consistency namespace `sc` with two copies (one per rack)
# and `active-rack = ACTIVE_RACK`. The roster is set from the observed nodes
# (which carry the active rack), then the official Python client, running
# in site 1 with its rack set to 1 (preferred-rack reads), times writes,
# SESSION reads and LINEARIZE reads one at a time, and the script counts
# how many partitions each site masters.
#
# Expected with ACTIVE_RACK=1: site 1 masters all 4096 partitions; a write
# costs one inter-site round trip (the master in site 1 waits for the
# replica in site 2), a SESSION read none (the master is in the client's
# site), a LINEARIZE read one (the master confirms its regime with the
# replica). ACTIVE_RACK=0 shows the contrast: masters split between the
# sites, so half the SESSION reads cross.
#
# Usage: sudo scripts/sc-two-sites.sh (needs /dev/net/tun, bc)
#   CITRINED=path CITRINE=path  binaries (default: the newer of target/release and target/debug)
#   PYTHON=path                 a Python with the official client (default .venv/bin/python;
#                               scripts/setup-python.sh makes it)
#   DELAY_MS=20                 the inter-site round trip added by netem
#   ACTIVE_RACK=1               0: none
#   OPS=300                     operations timed per kind
#   PREFIX=csite                network namespace / link name prefix (at most 8 characters)
#   SUBNET=10.220               site 1 is SUBNET.1.0/24, site 2 SUBNET.2.0/24
#   BASE_PORT=13100             node i uses BASE_PORT + 10 i (+1 fabric, +2 heartbeat)
#   KEEP=1                      keep the work directory (node logs)
set -euo pipefail
cd "$(dirname "$0")/.."

profile=debug
[[ target/release/citrined -nt target/debug/citrined && -x target/release/citrine ]] && profile=release
CITRINED=$(realpath "${CITRINED:-target/$profile/citrined}")
CITRINE=$(realpath "${CITRINE:-target/$profile/citrine}")
PYTHON=${PYTHON:-.venv/bin/python}
DELAY_MS=${DELAY_MS:-20}
ACTIVE_RACK=${ACTIVE_RACK:-1}
OPS=${OPS:-300}
PREFIX=${PREFIX:-csite}
SUBNET=${SUBNET:-10.220}
BASE_PORT=${BASE_PORT:-13100}
for binary in "$CITRINED" "$CITRINE"; do
    [[ -x $binary ]] || { echo "missing $binary: cargo build -p citrine-server -p citrine-cli" >&2; exit 2; }
done
"$PYTHON" -c 'import aerospike' 2>/dev/null || { echo "no official Python client in $PYTHON: scripts/setup-python.sh" >&2; exit 2; }

work=$(mktemp -d /tmp/citrine-two-sites.XXXXXX)
sites=("$PREFIX-1" "$PREFIX-2")
links=("${PREFIX}v1" "${PREFIX}v2")
hosts=("$SUBNET.1.1" "$SUBNET.2.1")
ids=(A1 A2 B1 B2)         # A: site 1, rack 1; B: site 2, rack 2
pids=()
cleanup() {
    local pid
    for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    for site in "${sites[@]}" "$PREFIX-w"; do ip netns del "$site" 2>/dev/null || true; done
    if [[ -n ${KEEP:-} ]]; then echo "work directory kept: $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT

# The two sites, each linked to a third namespace (the WAN) that forwards
# between them through a TUN device where scripts/lib/delay-router.py holds
# every packet DELAY_MS/2 (this kernel has no `tc netem`).
wan="$PREFIX-w"
for site in "${sites[@]}" "$wan"; do ip netns add "$site"; ip -n "$site" link set lo up; done
ip netns exec "$wan" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
for side in 0 1; do
    subnet="$SUBNET.$((side + 1))"
    ip link add "${links[$side]}" type veth peer name "${links[$side]}w"
    ip link set "${links[$side]}" netns "${sites[$side]}"
    ip link set "${links[$side]}w" netns "$wan"
    ip -n "${sites[$side]}" addr add "${hosts[$side]}/24" dev "${links[$side]}"
    ip -n "$wan" addr add "$subnet.254/24" dev "${links[$side]}w"
    ip -n "${sites[$side]}" link set "${links[$side]}" up
    ip -n "$wan" link set "${links[$side]}w" up
    ip -n "${sites[$side]}" route add default via "$subnet.254"
    ip -n "$wan" rule add iif "${links[$side]}w" table 100
done
ip -n "$wan" tuntap add dev "${PREFIX}d" mode tun
ip -n "$wan" link set "${PREFIX}d" up
ip netns exec "$wan" sysctl -qw "net.ipv4.conf.${PREFIX}d.rp_filter=0"
ip -n "$wan" route add default dev "${PREFIX}d" table 100
ip netns exec "$wan" python3 scripts/lib/delay-router.py "${PREFIX}d" "$(echo "$DELAY_MS / 2" | bc -l)" > "$work/router.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 50); do grep -qs ready "$work/router.log" && break; sleep 0.1; done
echo "sites up (added round trip between them: ${DELAY_MS} ms)"

config="$work/sites.toml"
cat examples/cluster.toml - > "$config" <<EOF

[[namespace]]
name = "sc"
replication-factor = 2
strong-consistency = true
active-rack = $ACTIVE_RACK

[namespace.storage-engine]
type = "memory"
data-size = "256M"
EOF

port() { echo $((BASE_PORT + 10 * $1 + $2)); }   # node, 0 service / 1 fabric / 2 heartbeat
site_of() { echo $(($1 / 2)); }
info() { # node command
    local site; site=$(site_of "$1")
    ip netns exec "${sites[$site]}" "$CITRINE" info -h "${hosts[$site]}:$(port "$1" 0)" -v "$2" 2>/dev/null || true
}

seeds=()
for node in 0 2; do seeds+=(--seed "${hosts[$(site_of "$node")]}:$(port "$node" 2)"); done
for node in 0 1 2 3; do
    site=$(site_of "$node")
    mkdir -p "$work/${ids[$node]}"
    ip netns exec "${sites[$site]}" "$CITRINED" --config "$config" --address "${hosts[$site]}" \
        --port "$(port "$node" 0)" --fabric-port "$(port "$node" 1)" \
        --heartbeat-port "$(port "$node" 2)" --node-id "${ids[$node]}" --rack-id $((site + 1)) \
        --data-dir "$work/${ids[$node]}" "${seeds[@]}" >> "$work/${ids[$node]}.log" 2>&1 &
    pids+=($!)
done

wait_for() { # what, command...
    local what=$1; shift
    for _ in $(seq 1 600); do "$@" && return 0; sleep 0.1; done
    echo "timed out waiting for $what" >&2
    return 1
}
cluster_of_four() { [[ $(info 0 statistics | tr ';' '\n' | grep '^cluster_size=') == cluster_size=4 ]]; }
all_available() {
    local node
    for node in 0 1 2 3; do
        [[ $(info "$node" namespace/sc | tr ';' '\n' | grep '^unavailable_partitions=') == unavailable_partitions=0 ]] || return 1
    done
}
wait_for "four nodes in one view" cluster_of_four
observed=$(info 0 roster:namespace=sc | tr ':' '\n' | sed -n 's/^observed_nodes=//p')
[[ $(info 0 "roster-set:namespace=sc;nodes=$observed") == ok ]]
ip netns exec "${sites[0]}" "$CITRINE" roster -h "${hosts[0]}:$(port 0 0)" apply >/dev/null
# Settled: every partition available, and still so in the same view 3 s
# later (applying the roster may take a second view).
settled() {
    all_available || return 1
    local key; key=$(info 0 cluster-stable:)
    sleep 3
    all_available && [[ $(info 0 cluster-stable:) == "$key" ]]
}
wait_for "every sc partition available in a settled view" settled
echo "roster $observed (active rack $ACTIVE_RACK)"

# Partitions each site masters (bits of each node's `replicas-master`).
masters() {
    local node
    for node in 0 1 2 3; do
        echo "$(site_of "$node") $(info "$node" replicas-master | tr ';' '\n' | sed -n 's/^sc://p')"
    done | "$PYTHON" -c '
import base64, sys
count = [0, 0]
for line in sys.stdin:
    site, bitmap = line.split()
    count[int(site)] += sum(bin(b).count("1") for b in base64.b64decode(bitmap))
print(f"partitions mastered: site 1 {count[0]}, site 2 {count[1]}")'
}
masters

ip netns exec "${sites[0]}" "$PYTHON" - "${hosts[0]}" "$(port 0 0)" "$OPS" "${hosts[1]}" "$(port 2 0)" <<'EOF'
import socket, sys, time, statistics
import aerospike

host, port, ops = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
far = (sys.argv[4], int(sys.argv[5]))
connects = []
for _ in range(10):  # a TCP connect costs one round trip
    start = time.perf_counter()
    socket.create_connection(far).close()
    connects.append((time.perf_counter() - start) * 1000)
print(f"round trip to site 2 (TCP connect): median {statistics.median(connects):.2f} ms")
client = aerospike.client({
    "hosts": [(host, port)],
    "rack_aware": True,
    "rack_id": 1,
    "policies": {"read": {"replica": aerospike.POLICY_REPLICA_PREFER_RACK,
                          "total_timeout": 5000},
                 "write": {"total_timeout": 5000}},
}).connect()
session = {"read_mode_sc": aerospike.POLICY_READ_MODE_SC_SESSION,
           "replica": aerospike.POLICY_REPLICA_PREFER_RACK}
linearize = {"read_mode_sc": aerospike.POLICY_READ_MODE_SC_LINEARIZE,
             "replica": aerospike.POLICY_REPLICA_PREFER_RACK}
keys = [("sc", "demo", f"k{i}") for i in range(ops)]

def timed(label, operation):
    times = []
    for key in keys:
        start = time.perf_counter()
        operation(key)
        times.append((time.perf_counter() - start) * 1000)
    times.sort()
    p90 = times[int(len(times) * 0.9)]
    print(f"{label:16} n={len(times)} median {statistics.median(times):7.2f} ms"
          f"  p90 {p90:7.2f} ms  min {times[0]:7.2f} ms")

for key in keys[:20]:          # warm the connections to every node
    client.put(key, {"v": 0})
    client.get(key, policy=session)
timed("write", lambda key: client.put(key, {"v": 1}))
timed("SESSION read", lambda key: client.get(key, policy=session))
timed("LINEARIZE read", lambda key: client.get(key, policy=linearize))
client.close()
EOF
