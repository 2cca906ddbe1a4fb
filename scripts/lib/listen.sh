# Port helpers shared by the scripts that start citrined themselves
# (lib/citrined-run.sh, go-benchmark-slices.sh). The caller defines die().

# Whether nothing accepts connections on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_node_port FIRST LAST: prints the first port in FIRST..LAST at which
# a citrined can start: it also takes PORT+1 and PORT+2 (fabric,
# heartbeat), so all three must be free. Prints nothing if none is.
free_node_port() {
    local p
    for p in $(seq "$1" "$2"); do
        if port_free "$p" && port_free $((p + 1)) && port_free $((p + 2)); then
            echo "$p"
            return 0
        fi
    done
}

# wait_listening PORT PID LOG WHAT: waits up to 10 s for process PID to
# accept on PORT; dies (printing LOG) if it exits first or never does.
wait_listening() {
    local port=$1 pid=$2 log=$3 what=$4
    for _ in $(seq 1 100); do
        if ! port_free "$port"; then return 0; fi
        kill -0 "$pid" 2>/dev/null || { cat "$log" >&2; die "$what exited"; }
        sleep 0.1
    done
    port_free "$port" && die "$what did not open port $port"
    return 0
}
