"""A cluster of three citrined processes, seen through the official client:
it discovers every node from one seed and routes to all of them."""
import time

import aerospike
import pytest

from conftest import CLIENT_POLICIES, start_citrined


def _heartbeat_port(server):
    argv = server.argv
    return int(argv[argv.index("--heartbeat-port") + 1])


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory):
    first = start_citrined(tmp_path_factory.mktemp("node0"), ["--node-id", "A1"])
    seed = f"127.0.0.1:{_heartbeat_port(first)}"
    others = [
        start_citrined(tmp_path_factory.mktemp(f"node{i}"), ["--node-id", f"A{i + 1}", "--seed", seed])
        for i in (1, 2)
    ]
    nodes = [first] + others
    yield nodes
    for node in nodes:
        node.stop()


def _wait_cluster_size(client, size, timeout=30.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = client.info_all("cluster-info")
        sizes = {value.strip() for _, (_, value) in last.items()}
        if len(last) == size and all(f"cluster_size={size};" in value for value in sizes) \
                and len({v.split(";")[0] for v in sizes}) == 1:
            return
        time.sleep(0.2)
    pytest.fail(f"cluster of {size} not formed in {timeout}s: {last!r}")


def test_client_discovers_every_node_from_one_seed(three_nodes):
    seed = three_nodes[0]
    client = aerospike.client({"hosts": [(seed.host, seed.port)], "policies": CLIENT_POLICIES}).connect()
    try:
        deadline = time.monotonic() + 30
        while len(client.get_nodes()) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)
        found = sorted(port for _, port in client.get_nodes())
        assert found == sorted(node.port for node in three_nodes)
        _wait_cluster_size(client, 3)
        # Every node masters a share of the partitions of `test`.
        replicas = client.info_all("replicas")
        assert len(replicas) == 3
        for _, (_, value) in replicas.items():
            ns = next(part for part in value.strip().split(";") if part.startswith("test:"))
            regime, columns = ns[len("test:"):].split(",")[:2]
            assert (regime, columns) == ("0", "2")
        # Records written through the cluster-aware client read back.
        for i in range(200):
            client.put(("test", "cluster", i), {"v": i})
        for i in range(200):
            _, _, bins = client.get(("test", "cluster", i))
            assert bins == {"v": i}
    finally:
        client.close()


def _checksums(node):
    from rawwire import info
    text = info(node.host, node.port, ["partition-checksums:namespace=test"])
    value = text["partition-checksums:namespace=test"] if isinstance(text, dict) else text
    out = {}
    for entry in filter(None, value.strip().split(";")):
        pid, rest = entry.split(":", 1)
        out[int(pid)] = rest
    return out


def test_writes_to_any_node_are_proxied_and_replicated(three_nodes):
    """Raw single-record writes sent to whichever node (mostly not the
    master) succeed, read back through the smart client and from every node,
    and every partition ends up on exactly two nodes with identical copies."""
    import rawwire as rw
    seed = three_nodes[0]
    client = aerospike.client({"hosts": [(seed.host, seed.port)], "policies": CLIENT_POLICIES}).connect()
    try:
        _wait_cluster_size(client, 3)
        for i in range(150):
            node = three_nodes[i % 3]
            reply = rw.command(node.host, node.port, "test", "anynode", f"k{i}", 0, rw.INFO2_WRITE,
                               ops=[rw.op(rw.OP_WRITE, rw.PT_STRING, "v", f"value-{i}".encode())])
            assert reply["result_code"] == 0, (i, reply)
        for i in range(150):
            _, _, bins = client.get(("test", "anynode", f"k{i}"))
            assert bins == {"v": f"value-{i}"}
            for node in three_nodes:
                reply = rw.command(node.host, node.port, "test", "anynode", f"k{i}",
                                   rw.INFO1_READ | rw.INFO1_GET_ALL, 0)
                assert reply["result_code"] == 0
                assert reply["ops"][0][3] == f"value-{i}".encode()
        sums = [_checksums(node) for node in three_nodes]
        holders = {}
        for node_sums in sums:
            for pid, value in node_sums.items():
                holders.setdefault(pid, []).append(value)
        assert holders
        for pid, values in holders.items():
            assert len(values) == 2 and values[0] == values[1], (pid, values)
    finally:
        client.close()
