"""A cluster of three citrined processes, seen through the official client:
it discovers every node from one seed and routes to all of them."""
import time

import aerospike
import pytest

from conftest import LUA_USER_PATH, make_client, start_citrined


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
    client = make_client(seed)
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
    client = make_client(seed)
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


def _statistic(node, name):
    from rawwire import info
    value = info(node.host, node.port, ["statistics"])["statistics"]
    pairs = dict(pair.split("=", 1) for pair in value.strip().split(";") if "=" in pair)
    return int(pairs[name])


def _wait_stable(nodes, timeout=60.0):
    from rawwire import info
    deadline = time.monotonic() + timeout
    answers = None
    while time.monotonic() < deadline:
        answers = [info(n.host, n.port, ["cluster-stable"])["cluster-stable"] for n in nodes]
        if len(set(answers)) == 1 and not answers[0].startswith("ERROR"):
            return
        time.sleep(0.2)
    pytest.fail(f"cluster not stable in {timeout}s: {answers!r}")


def _wait_client_nodes(client, size, timeout=20.0):
    deadline = time.monotonic() + timeout
    while len(client.get_nodes()) < size and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(client.get_nodes()) == size


def _query_each_once(client, set_name, count):
    """The official client's partition-tracked query over the set, retried
    after a pause (a partition handed back to its master a moment ago is
    refused where the client's map still sends it): every value of
    0..count, each once."""
    patient = {"max_retries": 20, "sleep_between_retries": 250,
               "total_timeout": 30000, "socket_timeout": 10000}
    records = client.query("test", set_name).results(patient)
    digests = [bytes(record[0][3]) for record in records]
    assert len(digests) == count
    assert len(set(digests)) == count
    assert sorted(record[2]["v"] for record in records) == list(range(count))


COUNT_MODULE = """
local function plus(a, b) return a + b end
function count(stream)
  return stream : map(function(rec) return 1 end) : reduce(plus)
end
"""


def _aggregate_counts(client, set_name, attempts):
    """The official client's aggregation (sent to every node, no partition
    list) counting the set, `attempts` times: each answer's total, or the
    error code it failed with."""
    answers = []
    for _ in range(attempts):
        query = client.query("test", set_name)
        query.apply("citrine_count", "count", [])
        try:
            answers.append(sum(query.results()))
        except aerospike.exception.AerospikeError as error:
            answers.append(("error", error.code))
    return answers


def test_a_query_during_migrations_sees_every_record_once(tmp_path_factory):
    """A third node joins while migrations crawl (20 records a second from
    each source). Until it is filled, the nodes holding the only copies of
    the partitions it will master claim them (acting masters): the official
    client's partition-tracked query over the whole set and its batch read
    see every record, each once, and the acting masters serve reads. Its
    aggregations (sent to every node for all partitions) count every
    record, the joining node running the part of the partitions it fills on
    their acting masters, and running a part again where its partitions are
    served when a handover refused it. Never a count that misses the
    filling partitions; 11 only if a part stays refused (before the parts
    ran again: 6 of 10 counted all in each of two runs, the rest failed
    with 11; since: 10 of 10 in each of two runs)."""
    import rawwire as rw
    first = start_citrined(tmp_path_factory.mktemp("mig0"), ["--node-id", "B1"])
    nodes = [first]
    client = None
    try:
        seed = f"127.0.0.1:{_heartbeat_port(first)}"
        nodes.append(start_citrined(tmp_path_factory.mktemp("mig1"),
                                    ["--node-id", "B2", "--seed", seed]))
        client = make_client(first)
        _wait_cluster_size(client, 2)
        _wait_stable(nodes)
        module = LUA_USER_PATH / "citrine_count.lua"
        module.write_text(COUNT_MODULE)
        client.udf_put(str(module))
        keys = [("test", "mig", i) for i in range(2000)]
        for key in keys:
            client.put(key, {"v": key[2]})
        for node in nodes:
            answer = rw.info(node.host, node.port,
                             ["set-config:context=service;migrate-max-records-per-sec=20"])
            assert list(answer.values()) == ["ok"], answer
        nodes.append(start_citrined(tmp_path_factory.mktemp("mig2"),
                                    ["--node-id", "B3", "--seed", seed]))
        _wait_cluster_size(client, 3)
        _wait_client_nodes(client, 3)
        deadline = time.monotonic() + 10
        while "citrine_count.lua" not in rw.info(nodes[2].host, nodes[2].port,
                                                 ["udf-list"])["udf-list"]:
            assert time.monotonic() < deadline, "the joining node gets the module"
            time.sleep(0.1)
        counts = _aggregate_counts(client, "mig", 10)
        assert all(count in (2000, ("error", 11)) for count in counts), counts
        assert counts.count(2000) >= 9, counts
        _query_each_once(client, "mig", 2000)
        found = client.batch_read(keys, policy={"max_retries": 5, "sleep_between_retries": 100,
                                                "total_timeout": 10000})
        assert [record.result for record in found.batch_records] == [0] * 2000
        assert [record.record[2]["v"] for record in found.batch_records] == list(range(2000))
        assert _statistic(nodes[2], "migrate_rx_partitions_remaining") > 0, \
            "all of it ran while the joining node was still filling"
        assert sum(_statistic(node, "migrate_acting_reads") for node in nodes[:2]) > 0
    finally:
        if client is not None:
            client.close()
        for node in nodes:
            node.stop()


def _device_config(directory):
    """examples/cluster.toml with namespace `test` on a device file in the
    node's work directory."""
    from conftest import REPO
    text = (REPO / "examples" / "cluster.toml").read_text()
    head = text[:text.index("[namespace.storage-engine]")]
    path = directory / "cluster.toml"
    path.write_text(head + "[namespace.storage-engine]\ntype = \"device\"\n"
                    "file = \"test.dat\"\nfilesize = \"64M\"\n"
                    "write-block-size = \"128K\"\nflush-max-ms = 50\n")
    return path


def _start_device_pair(tmp_path_factory, name, letter, nodes):
    """Two nodes with namespace `test` on a device file in their work
    directories (ids LETTER1 and LETTER2), the second seeded by the first,
    appended to `nodes`; returns (dirs, args, seed, client) once the
    cluster is stable, so a node can be started again as it was."""
    dirs = [tmp_path_factory.mktemp(f"{name}{i}") for i in range(2)]
    args = [["--node-id", f"{letter}{i + 1}", "--config", str(_device_config(d)), "--data-dir", str(d)]
            for i, d in enumerate(dirs)]
    nodes.append(start_citrined(dirs[0], args[0]))
    seed = ["--seed", f"127.0.0.1:{_heartbeat_port(nodes[0])}"]
    nodes.append(start_citrined(dirs[1], args[1] + seed))
    client = make_client(nodes[0])
    _wait_cluster_size(client, 2)
    _wait_stable(nodes)
    return dirs, args, seed, client


def _kill_second(nodes, client):
    """SIGKILL for the second node once its device holds every write (past
    the flush window); returns when the client has dropped it."""
    time.sleep(0.3)
    nodes[1].proc.kill()
    nodes[1].proc.wait(timeout=5)
    nodes[1].stop()
    deadline = time.monotonic() + 20
    while len(client.get_nodes()) > 1:
        assert time.monotonic() < deadline, "the client drops the dead node"
        time.sleep(0.1)


def test_a_node_restarted_with_its_device_is_covered_while_it_fills(tmp_path_factory):
    """A node killed and started again with its device comes back with the
    regime of its last view: its copies are contained in the survivor's,
    which acts for the partitions the restarted node masters while it
    receives what it missed (20 records a second). The official client's
    query over the set sees every record once meanwhile, and the
    restarted node sends nothing."""
    import rawwire as rw
    nodes = []
    client = None
    try:
        dirs, args, seed, client = _start_device_pair(tmp_path_factory, "dev", "D", nodes)
        first = nodes[0]
        keys = [("test", "dev", i) for i in range(2200)]
        for key in keys[:2000]:
            client.put(key, {"v": key[2]})
        _wait_stable(nodes)
        _kill_second(nodes, client)
        deadline = time.monotonic() + 20
        while "cluster_size=1;" not in rw.info(first.host, first.port, ["cluster-info"])["cluster-info"]:
            assert time.monotonic() < deadline, "the survivor sees the node leave"
            time.sleep(0.1)
        _wait_stable(nodes[:1])
        for key in keys[2000:]:
            client.put(key, {"v": key[2]}, policy={"max_retries": 5, "sleep_between_retries": 100})
        answer = rw.info(first.host, first.port,
                         ["set-config:context=service;migrate-max-records-per-sec=20"])
        assert list(answer.values()) == ["ok"], answer
        nodes[1] = start_citrined(dirs[1], args[1] + seed)
        _wait_cluster_size(client, 2)
        _wait_client_nodes(client, 2)
        _query_each_once(client, "dev", 2200)
        assert _statistic(nodes[1], "migrate_rx_partitions_remaining") > 0, \
            "the query ran while the restarted node was still filling"
        rw.info(first.host, first.port,
                ["set-config:context=service;migrate-max-records-per-sec=0"])
        _wait_stable(nodes)
        assert _statistic(nodes[1], "migrate_partitions_sent") == 0
        assert _statistic(first, "migrate_records_sent") >= 200
    finally:
        if client is not None:
            client.close()
        for node in nodes:
            node.stop()


def _set_objects(node, set_name):
    """Records of `set_name` the node holds (its `sets/test/SET` answer)."""
    from rawwire import info
    command = f"sets/test/{set_name}"
    value = info(node.host, node.port, [command])[command]
    pairs = dict(pair.split("=", 1) for pair in value.strip().strip(";").split(":") if "=" in pair)
    return int(pairs.get("objects", 0))


def _wait_set_empty(nodes, set_name, timeout=15.0):
    deadline = time.monotonic() + timeout
    counts = None
    while time.monotonic() < deadline:
        counts = [_set_objects(node, set_name) for node in nodes]
        if not any(counts):
            return
        time.sleep(0.1)
    pytest.fail(f"set {set_name} still held after {timeout}s: {counts}")


def test_truncate_sent_to_one_node_empties_the_set_on_every_node(three_nodes):
    """The official client sends `truncate` to one node; every node's
    records of the set go, the other sets stay, and writes after it stay."""
    seed = three_nodes[0]
    client = make_client(seed)
    try:
        _wait_cluster_size(client, 3)
        _wait_client_nodes(client, 3)
        for i in range(300):
            client.put(("test", "trunc", i), {"v": i})
        for i in range(50):
            client.put(("test", "trunc_keep", i), {"v": i})
        assert all(_set_objects(node, "trunc") > 0 for node in three_nodes)
        time.sleep(0.01)  # the truncation's time is past every write's
        client.truncate("test", "trunc", 0)
        _wait_set_empty(three_nodes, "trunc")
        for i in range(300):
            _, meta = client.exists(("test", "trunc", i))
            assert meta is None, i
        assert client.query("test", "trunc").results() == []
        kept = client.query("test", "trunc_keep").results()
        assert sorted(record[2]["v"] for record in kept) == list(range(50))
        client.put(("test", "trunc", 1000), {"v": 1000})
        assert client.get(("test", "trunc", 1000))[2] == {"v": 1000}
        assert [r[2] for r in client.query("test", "trunc").results()] == [{"v": 1000}]
    finally:
        client.close()


def test_a_node_down_during_a_truncate_does_not_bring_the_records_back(tmp_path_factory):
    """Two device nodes; one is killed, the set is truncated through the
    survivor, and the killed node restarts with its device still holding
    the records. It learns the truncation from the survivor: once the
    cluster is stable neither node holds a record of the set, and none
    reads back."""
    nodes = []
    client = None
    try:
        dirs, args, seed, client = _start_device_pair(tmp_path_factory, "trunc", "E", nodes)
        first = nodes[0]
        keys = [("test", "gone", i) for i in range(500)]
        for key in keys:
            client.put(key, {"v": key[2]})
        _wait_stable(nodes)
        _kill_second(nodes, client)
        client.truncate("test", "gone", 0)
        assert _set_objects(first, "gone") == 0
        nodes[1] = start_citrined(dirs[1], args[1] + seed)
        _wait_cluster_size(client, 2)
        _wait_stable(nodes)
        _wait_set_empty(nodes, "gone")
        _wait_client_nodes(client, 2)
        for key in keys:
            _, meta = client.exists(key)
            assert meta is None, key
        assert client.query("test", "gone").results() == []
    finally:
        if client is not None:
            client.close()
        for node in nodes:
            node.stop()


def test_a_record_written_again_after_its_delete_is_on_every_replica(three_nodes):
    """Written twice, deleted, written again through the official client:
    the new copy starts the record's next life at generation 1 (as after
    the reference's non-durable deletes), which wins over the delete's
    tombstone and the old copies, so every replica stores it: each
    partition's two copies are identical."""
    seed = three_nodes[0]
    client = make_client(seed)
    try:
        _wait_cluster_size(client, 3)
        _wait_client_nodes(client, 3)
        keys = [("test", "again", i) for i in range(120)]
        for key in keys:
            client.put(key, {"v": 1})
            client.put(key, {"v": 2})
            client.remove(key)
            client.put(key, {"v": 3})
        holders = {}
        for node in three_nodes:
            for pid, value in _checksums(node).items():
                holders.setdefault(pid, []).append(value)
        differing = {pid: values for pid, values in holders.items()
                     if len(values) != 2 or values[0] != values[1]}
        assert not differing, differing
        for key in keys:
            _, meta, bins = client.get(key)
            assert bins == {"v": 3} and meta["gen"] == 1, (key, meta)
    finally:
        client.close()


def _reads(node):
    """Reads of namespace `test` that `node` served (found or not)."""
    from rawwire import info
    value = info(node.host, node.port, ["namespace/test"])["namespace/test"]
    pairs = dict(pair.split("=", 1) for pair in value.strip().split(";") if "=" in pair)
    return int(pairs["client_read_success"]) + int(pairs["client_read_not_found"])


def test_a_rack_aware_client_reads_from_its_rack(tmp_path_factory):
    """Two nodes on racks 1 and 2 (replication factor 2: each rack holds a
    copy of every partition). Each answers `rack-ids` with its rack, and
    the official client configured rack-aware on rack 2, reading with
    POLICY_REPLICA_PREFER_RACK, is served by the rack-2 node alone (when
    the nodes answered `rack-ids` with ERROR:25, as the reference's
    Community Edition does, the client learned no rack and the reads split
    109/91 between the nodes)."""
    import rawwire as rw
    first = start_citrined(tmp_path_factory.mktemp("rack1"),
                           ["--node-id", "C1", "--rack-id", "1"])
    nodes = [first]
    client = None
    try:
        seed = f"127.0.0.1:{_heartbeat_port(first)}"
        nodes.append(start_citrined(tmp_path_factory.mktemp("rack2"),
                                    ["--node-id", "C2", "--rack-id", "2", "--seed", seed]))
        client = make_client(first, rack_aware=True, rack_id=2)
        _wait_cluster_size(client, 2)
        _wait_client_nodes(client, 2)
        _wait_stable(nodes)
        assert [rw.info(n.host, n.port, ["rack-ids"])["rack-ids"].strip() for n in nodes] \
            == ["test:1;bar:1", "test:2;bar:2"]
        # `racks:` (what the operators' tools read): every node lists the
        # whole view by rack.
        view = "rack_1=C1:rack_2=C2"
        assert [rw.info(n.host, n.port, ["racks:"])["racks:"].strip() for n in nodes] \
            == [f"ns=test:{view};ns=bar:{view}"] * 2
        keys = [("test", "racks", i) for i in range(200)]
        for key in keys:
            client.put(key, {"v": key[2]})
        before = [_reads(node) for node in nodes]
        on_rack = {"replica": aerospike.POLICY_REPLICA_PREFER_RACK}
        deadline = time.monotonic() + 10
        while True:
            # The client learns the racks at its next tend.
            for key in keys:
                assert client.get(key, policy=on_rack)[2] == {"v": key[2]}
            after = [_reads(node) for node in nodes]
            served = [a - b for a, b in zip(after, before)]
            if served == [0, 200] or time.monotonic() > deadline:
                break
            before = after
            time.sleep(1.1)
        assert served == [0, 200], served
    finally:
        if client is not None:
            client.close()
        for node in nodes:
            node.stop()
