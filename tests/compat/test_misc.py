"""Login against a server without security, send-key, digest keys, large values,
concurrency."""

import threading
import time

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers.operations import operations as op

import conftest
import rawwire


# --- security not enabled: a client with credentials still works -------------------

def test_client_with_user_and_password_connects(citrined, key):
    c = conftest.make_client(citrined, user="u", password="p")
    try:
        c.put(key, {"a": 1})
        assert c.get(key)[2] == {"a": 1}
        name = c.get_node_names()[0]["node_name"]
        assert c.info_single_node("node", name).startswith("node\t")
    finally:
        c.close()


# --- digest / partition --------------------------------------------------------------

DIGEST_VECTORS = [  # 02 §5, set "set"
    (0, "93d943aae37b017ad7e011b0c1d2e2143c2fb37d"),
    (-1, "22116d253745e29fc63fdf760b6e26f7e197e01d"),
    ("", "2819b1ff6e346a43b4f5f6b77a88bc3eaac22a83"),
    ("s", "607cddba7cd111745ef0a3d783d57f0e83c8f311"),
]


@pytest.mark.parametrize("user_key,hexdigest", DIGEST_VECTORS)
def test_client_digest_matches_protocol_vectors(user_key, hexdigest):
    assert bytes(aerospike.calc_digest("test", "set", user_key)).hex() == hexdigest


def test_record_found_by_digest_key(client, key):
    client.put(key, {"a": 1})
    digest = aerospike.calc_digest(*key)
    dkey = (key[0], key[1], None, digest)
    k, meta, bins = client.get(dkey)
    assert bins == {"a": 1}
    assert bytes(k[3]) == bytes(digest)
    # and the reverse: written by digest, read by user key
    client.put(dkey, {"b": 2})
    assert client.get(key)[2] == {"a": 1, "b": 2}


def test_partition_id_matches_digest(client, key):
    d = bytes(aerospike.calc_digest(*key))
    assert client.get_key_partition_id(*key) == (d[0] | (d[1] << 8)) & 0x0FFF
    assert client.get_key_partition_id("test", "demo", "key1") == 492


# --- send key --------------------------------------------------------------------------

def _scan(client, set_name):
    q = client.query("test", set_name)
    return {bytes(r[0][3]): r for r in q.results()}


@pytest.mark.scan
def test_query_records_per_second_paces_the_stream(client, set_name):
    """Query.records_per_second (the RECS_PER_SEC field): 40 records at 20 a second
    arrive over two seconds (the 39th and 40th are due 1.9 s after the first), all
    of them, each once."""
    for i in range(40):
        client.put(("test", set_name, i), {"a": i})
    q = client.query("test", set_name)
    q.records_per_second = 20
    started = time.monotonic()
    recs = q.results()
    took = time.monotonic() - started
    assert sorted(r[2]["a"] for r in recs) == list(range(40))
    assert took >= 1.8, f"the paced query took {took:.2f} s"


@pytest.mark.scan
def test_send_key_stores_user_key(client, set_name):
    """With POLICY_KEY_SEND the server stores the user key and returns it in records
    streamed back by a scan/query; without it the key slot is None. (A single-record
    get() always echoes the caller's own key tuple, so a scan is used.)"""
    k_sent = ("test", set_name, "sent-key")
    k_int = ("test", set_name, 777)
    k_not = ("test", set_name, "digest-only")
    client.put(k_sent, {"a": 1}, policy={"key": aerospike.POLICY_KEY_SEND})
    client.put(k_int, {"a": 2}, policy={"key": aerospike.POLICY_KEY_SEND})
    client.put(k_not, {"a": 3})
    recs = _scan(client, set_name)
    assert len(recs) == 3
    by = {bytes(aerospike.calc_digest(*k)): k for k in (k_sent, k_int, k_not)}
    for digest, rec in recs.items():
        assert digest in by
    assert recs[bytes(aerospike.calc_digest(*k_sent))][0][2] == "sent-key"
    assert recs[bytes(aerospike.calc_digest(*k_int))][0][2] == 777
    assert recs[bytes(aerospike.calc_digest(*k_not))][0][2] is None
    # the streamed records carry their bins and metadata too
    assert recs[bytes(aerospike.calc_digest(*k_sent))][2] == {"a": 1}
    assert recs[bytes(aerospike.calc_digest(*k_int))][2] == {"a": 2}
    assert recs[bytes(aerospike.calc_digest(*k_not))][1]["gen"] == 1


def _raw_put(citrined, set_name, digest_key, send_key):
    return rawwire.command(
        citrined.host, citrined.port, "test", set_name, digest_key, 0, rawwire.INFO2_WRITE,
        ops=[rawwire.op(rawwire.OP_WRITE, rawwire.PT_INTEGER, "z", rawwire.int_value(1))],
        send_key=send_key)


def test_send_key_is_stored_key_mismatch_19(citrined, client, set_name):
    """Without a scan: a stored key is compared with the KEY field of later commands
    (02 §5); a different key under the same digest answers 19 (KEY_MISMATCH)."""
    client.put(("test", set_name, "sent-key"), {"a": 1},
               policy={"key": aerospike.POLICY_KEY_SEND})
    same = _raw_put(citrined, set_name, "sent-key", "sent-key")
    assert same["result_code"] == 0, same
    other = _raw_put(citrined, set_name, "sent-key", "other-key")
    assert other["result_code"] == 19, other
    # the failed write changed nothing
    _, meta, bins = client.get(("test", set_name, "sent-key"))
    assert bins == {"a": 1, "z": 1} and meta["gen"] == 2


def test_no_send_key_means_no_stored_key(citrined, client, set_name):
    client.put(("test", set_name, "digest-only"), {"a": 1})
    # nothing stored to compare with: a KEY field that does not match the digest's
    # user key is not a mismatch
    resp = _raw_put(citrined, set_name, "digest-only", "whatever")
    assert resp["result_code"] == 0, resp


def test_send_key_on_reads_and_writes_accepted(client, key):
    pol = {"key": aerospike.POLICY_KEY_SEND}
    client.put(key, {"a": 1}, policy=pol)
    k, _, bins = client.get(key, policy=pol)
    assert bins == {"a": 1}
    assert k[2] == key[2]
    client.operate(key, [op.increment("a", 1)], policy=pol)
    client.remove(key, policy=pol)
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


# --- large values ------------------------------------------------------------------------

def test_large_string_round_trip(client, key):
    big = "".join(chr(ord("a") + i % 26) for i in range(500 * 1024))
    client.put(key, {"big": big})
    assert client.get(key)[2]["big"] == big


def test_large_blob_round_trip(client, key):
    big = bytearray((i * 7) & 0xFF for i in range(900 * 1024))
    client.put(key, {"big": big, "small": 1})
    _, _, bins = client.get(key)
    assert bytes(bins["big"]) == bytes(big)
    assert bins["small"] == 1


def test_large_list_round_trip(client, key):
    lst = list(range(20000)) + ["s" * 100] * 100
    client.put(key, {"l": lst})
    assert client.get(key)[2]["l"] == lst


# --- concurrency -------------------------------------------------------------------------

N_THREADS = 16
M_INCR = 200


def _run_threads(target, n):
    errors = []

    def wrap(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "threads hung"
    assert not errors, errors[:5]


def test_concurrent_increments_are_exact(client, key):
    client.put(key, {"n": 0})

    def work(_):
        for _ in range(M_INCR):
            client.increment(key, "n", 1)

    _run_threads(work, N_THREADS)
    _, meta, bins = client.get(key)
    assert bins["n"] == N_THREADS * M_INCR
    assert meta["gen"] == 1 + N_THREADS * M_INCR


def test_concurrent_operate_increments_with_reads(client, key):
    """Each operate returns the post-increment value; all returned values are distinct."""
    seen = []
    lock = threading.Lock()

    def work(_):
        mine = []
        for _ in range(100):
            _, _, bins = client.operate(key, [op.increment("n", 1), op.read("n")])
            mine.append(bins["n"])
        with lock:
            seen.extend(mine)

    _run_threads(work, 8)
    assert sorted(seen) == list(range(1, 801))


def test_concurrent_optimistic_cas_with_generation(client, key):
    """Read-modify-write guarded by POLICY_GEN_EQ: no lost updates."""
    client.put(key, {"n": 0})
    per_thread = 25

    def work(_):
        done = 0
        attempts = 0
        while done < per_thread:
            attempts += 1
            assert attempts < 5000, "too many generation conflicts"
            _, meta, bins = client.get(key)
            try:
                client.put(key, {"n": bins["n"] + 1}, meta={"gen": meta["gen"]},
                           policy={"gen": aerospike.POLICY_GEN_EQ})
                done += 1
            except ex.RecordGenerationError:
                pass

    _run_threads(work, 8)
    assert client.get(key)[2]["n"] == 8 * per_thread


def _proc_increment(port, key, n, out):
    import aerospike as _as

    c = _as.client({"hosts": [("127.0.0.1", port)]}).connect()
    try:
        for _ in range(n):
            c.increment(tuple(key), "n", 1)
        out.put("ok")
    except Exception as e:  # noqa: BLE001
        out.put(repr(e))
    finally:
        c.close()


def test_concurrent_increments_from_several_processes(citrined, client, key):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    n_procs, per_proc = 4, 250
    client.put(key, {"n": 0})
    procs = [ctx.Process(target=_proc_increment, args=(citrined.port, list(key), per_proc, out))
             for _ in range(n_procs)]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert results == ["ok"] * n_procs, results
    assert client.get(key)[2]["n"] == n_procs * per_proc


# --- operation projection in queries (servers 8.1.2+) ---------------------------------

@pytest.mark.scan
def test_query_projects_read_operations(client, set_name):
    """A foreground query's ops: plain bin reads and, since 8.1.2, read operations
    evaluated on each record (here a map read by key and an expression), answered
    in order as an operate's. A record an op fails on (a bin of another type) is
    left out, as the reference leaves it out; an op whose bin is missing answers
    a nil (the client asks for every op's answer)."""
    from aerospike_helpers import expressions as exp
    from aerospike_helpers.operations import expression_operations as eo
    from aerospike_helpers.operations import map_operations as mo

    for i in range(3):
        client.put(("test", set_name, i), {"a": i, "nested": {"value": 10 + i}})
    client.put(("test", set_name, "odd"), {"a": 9, "nested": 5})
    client.put(("test", set_name, "flat"), {"a": 7})
    q = client.query("test", set_name)
    q.add_ops([
        op.read("a"),
        mo.map_get_by_key("nested", "value", aerospike.MAP_RETURN_VALUE),
        eo.expression_read("twice", exp.Mul(exp.IntBin("a"), 2).compile()),
    ])
    rows = sorted((r[2] for r in q.results()), key=lambda bins: bins["a"])
    assert rows == [
        {"a": 0, "nested": 10, "twice": 0},
        {"a": 1, "nested": 11, "twice": 2},
        {"a": 2, "nested": 12, "twice": 4},
        {"a": 7, "nested": None, "twice": 14},
    ]


@pytest.mark.scan
def test_a_scan_selecting_bins_leaves_out_the_records_holding_none_of_them(client, set_name):
    """A scan that selects bins returns only the records that hold one of them,
    as the reference does: a record holding none of the bins is left out, not
    returned with no bins. Read ops ask for every op's answer: a record without
    the bin comes back with a nil."""
    for i in range(6):
        client.put(("test", set_name, i), {"a": i} if i % 2 == 0 else {"b": i})

    def scan(select=(), ops=()):
        q = client.query("test", set_name)
        if select:
            q.select(*select)
        if ops:
            q.add_ops(list(ops))
        return sorted((r[2] for r in q.results()), key=lambda bins: repr(sorted(bins.items())))

    assert scan(select=["a"]) == [{"a": 0}, {"a": 2}, {"a": 4}]
    assert len(scan(select=["a", "b"])) == 6
    assert scan(select=["nosuchbin"]) == []
    assert sorted(r["b"] or 0 for r in scan(ops=[op.read("b")])) == [0, 0, 0, 1, 3, 5]
    assert len(scan()) == 6

