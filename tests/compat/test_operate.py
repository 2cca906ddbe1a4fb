"""operate / operate_ordered with the basic op types (read, write, increment,
append, prepend, touch, delete), applied atomically to one record."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers.operations import map_operations
from aerospike_helpers.operations import operations as op

import rawwire
from conftest import make_client


def test_operate_all_basic_op_types(client, key):
    client.put(key, {"i": 10, "f": 1.25, "s": "mid", "b": bytearray(b"\x01\x02"),
                     "keep": "x"})
    ops = [
        op.increment("i", 5),
        op.increment("f", 0.5),
        op.append("s", ">"),
        op.prepend("s", "<"),
        op.write("w", "new"),
        op.append("b", bytearray(b"\x03")),
        op.read("i"),
        op.read("f"),
        op.read("s"),
        op.read("w"),
        op.read("b"),
    ]
    _, meta, bins = client.operate(key, ops)
    assert bins["i"] == 15
    assert bins["f"] == pytest.approx(1.75)
    assert bins["s"] == "<mid>"
    assert bins["w"] == "new"
    assert bytes(bins["b"]) == b"\x01\x02\x03"
    assert set(bins) == {"i", "f", "s", "w", "b"}  # only what was read
    assert meta["gen"] == 2  # one operate = one generation bump
    _, meta2, full = client.get(key)
    assert meta2["gen"] == 2
    assert full == {"i": 15, "f": pytest.approx(1.75), "s": "<mid>", "w": "new",
                    "b": bytearray(b"\x01\x02\x03"), "keep": "x"}


def test_operate_creates_missing_record(client, key):
    _, meta, bins = client.operate(key, [op.write("a", 1), op.increment("n", 7),
                                         op.read("a"), op.read("n")])
    assert bins == {"a": 1, "n": 7}
    assert meta["gen"] == 1


def test_operate_read_only_missing_record_raises_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.operate(key, [op.read("a")])


def test_operate_ordered_reads_see_earlier_writes(client, key):
    ops = [
        op.write("a", 1),
        op.read("a"),
        op.increment("a", 2),
        op.read("a"),
        op.append("s", "x"),
        op.read("s"),
        op.append("s", "y"),
        op.read("s"),
    ]
    _, meta, results = client.operate_ordered(key, ops)
    assert results == [("a", 1), ("a", 3), ("s", "x"), ("s", "xy")]
    assert meta["gen"] == 1


@pytest.mark.cdt
def test_operate_ordered_respond_all_ops_with_map_op(client, key):
    """The client sets RESPOND_ALL_OPS (info2 0x80) when a map op is present (the
    `respond_all_ops` policy key is ignored by the Python client): then every op yields
    an entry in request order, (name, None) for writes and absent bins."""
    client.put(key, {"a": 1, "m": {"x": 1, "y": 2}})
    ops = [
        op.write("b", 2),
        op.read("a"),
        op.read("missing"),
        op.increment("a", 10),
        op.read("a"),
        map_operations.map_size("m"),
    ]
    _, meta, results = client.operate_ordered(key, ops)
    assert results == [("b", None), ("a", 1), ("missing", None), ("a", None), ("a", 11),
                       ("m", 2)]
    assert meta["gen"] == 2


def test_respond_all_ops_raw(citrined, client, set_name):
    """Same without a CDT op: a hand-built operate with info2 WRITE|RESPOND_ALL_OPS."""
    client.put(("test", set_name, "rk"), {"a": 1})
    R, W, INCR = rawwire.OP_READ, rawwire.OP_WRITE, 5
    ops = [
        rawwire.op(W, rawwire.PT_INTEGER, "b", rawwire.int_value(2)),
        rawwire.op(R, 0, "a"),
        rawwire.op(R, 0, "missing"),
        rawwire.op(INCR, rawwire.PT_INTEGER, "a", rawwire.int_value(10)),
        rawwire.op(R, 0, "a"),
    ]
    resp = rawwire.command(citrined.host, citrined.port, "test", set_name, "rk",
                           rawwire.INFO1_READ, rawwire.INFO2_WRITE | 0x80, ops=ops)
    assert resp["result_code"] == 0, resp
    got = [(name, particle, value) for (_t, particle, name, value) in resp["ops"]]
    assert got == [
        ("b", 0, b""),
        ("a", rawwire.PT_INTEGER, rawwire.int_value(1)),
        ("missing", 0, b""),
        ("a", 0, b""),
        ("a", rawwire.PT_INTEGER, rawwire.int_value(11)),
    ], resp


def test_operate_without_respond_all_ops_omits_write_entries_raw(citrined, client, set_name):
    client.put(("test", set_name, "rk"), {"a": 1})
    ops = [
        rawwire.op(rawwire.OP_WRITE, rawwire.PT_INTEGER, "b", rawwire.int_value(2)),
        rawwire.op(rawwire.OP_READ, 0, "missing"),
        rawwire.op(rawwire.OP_READ, 0, "a"),
    ]
    resp = rawwire.command(citrined.host, citrined.port, "test", set_name, "rk",
                           rawwire.INFO1_READ, rawwire.INFO2_WRITE, ops=ops)
    assert resp["result_code"] == 0, resp
    assert [(n, v) for (_t, _p, n, v) in resp["ops"]] == [("a", rawwire.int_value(1))]


def test_operate_returns_only_read_bins(client, key):
    client.put(key, {"a": 1, "b": "two"})
    _, meta, bins = client.operate(key, [op.increment("a", 1), op.read("b")])
    assert bins == {"b": "two"}
    _, _, full = client.get(key)
    assert full == {"a": 2, "b": "two"}
    assert meta["gen"] == 2


def test_operate_touch(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 100})
    _, meta, _ = client.operate(key, [op.touch(), op.read("a")], meta={"ttl": 5000})
    assert meta["gen"] == 2
    _, meta2, got = client.get(key)
    assert got == {"a": 1}
    assert 4990 <= meta2["ttl"] <= 5000


def test_operate_touch_missing_record_raises_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.operate(key, [op.touch()])


def test_operate_delete_then_write_in_one_command(client, key):
    client.put(key, {"old": 1, "other": 2})
    _, _, bins = client.operate(key, [op.delete(), op.write("new", 3), op.read("new")])
    assert bins == {"new": 3}
    _, meta, got = client.get(key)
    assert got == {"new": 3}  # bins from before the delete are gone


def test_operate_delete_on_a_missing_record_lets_later_ops_create_it(client, key):
    client.operate(key, [op.delete(), op.write("a", 1)])
    assert client.get(key)[2] == {"a": 1}


def test_operate_delete_alone_on_a_missing_record_is_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.operate(key, [op.delete()])


def test_operate_delete_then_touch_deletes_the_record(client, key):
    """After a delete op a touch touches nothing: the record is deleted, or
    rewritten by the ops after it (the reference's answers)."""
    client.put(key, {"a": 1})
    _, meta, _ = client.operate(key, [op.delete(), op.touch()])
    assert meta["gen"] == 0
    assert client.exists(key)[1] is None
    client.put(key, {"a": 1})
    client.operate(key, [op.delete(), op.touch(), op.write("b", 2)])
    assert client.get(key)[2] == {"b": 2}


def test_operate_delete_removes_record(client, key):
    client.put(key, {"a": 1})
    client.operate(key, [op.delete()])
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


def test_operate_read_then_delete_returns_old_value(client, key):
    client.put(key, {"a": "before"})
    _, _, bins = client.operate(key, [op.read("a"), op.delete()])
    assert bins == {"a": "before"}
    _, meta = client.exists(key)
    assert meta is None


def test_operate_failure_is_atomic(client, key):
    """A failing op (increment of a string bin) must leave the record untouched."""
    client.put(key, {"s": "text", "n": 1})
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [op.write("x", 1), op.increment("n", 1),
                             op.increment("s", 1)])
    _, meta, got = client.get(key)
    assert got == {"s": "text", "n": 1}
    assert meta["gen"] == 1


def test_operate_with_generation_policy(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.RecordGenerationError):
        client.operate(key, [op.increment("a", 1)], meta={"gen": 7},
                       policy={"gen": aerospike.POLICY_GEN_EQ})
    _, meta, bins = client.operate(key, [op.increment("a", 1), op.read("a")],
                                   meta={"gen": 1}, policy={"gen": aerospike.POLICY_GEN_EQ})
    assert bins == {"a": 2}
    assert meta["gen"] == 2


def test_operate_write_bool_list_map_values(client, key):
    _, _, bins = client.operate_ordered(
        key, [op.write("l", [1, "x"]), op.write("m", {"k": 1}), op.read("l"), op.read("m")])
    assert bins == [("l", [1, "x"]), ("m", {"k": 1})]


def test_write_plus_read_all_raw(citrined, client, set_name):
    """operate with a write op and a read-all op (empty name, info1 GET_ALL) returns
    every bin after the write (02 §8)."""
    client.put(("test", set_name, "rk"), {"a": 1, "s": "x"})
    ops = [rawwire.op(5, rawwire.PT_INTEGER, "a", rawwire.int_value(1)),
           rawwire.op(rawwire.OP_READ, 0, "")]
    resp = rawwire.command(citrined.host, citrined.port, "test", set_name, "rk",
                           rawwire.INFO1_READ | rawwire.INFO1_GET_ALL, rawwire.INFO2_WRITE,
                           ops=ops)
    assert resp["result_code"] == 0, resp
    got = sorted((n, p, v) for (_t, p, n, v) in resp["ops"])
    assert got == [("a", rawwire.PT_INTEGER, rawwire.int_value(2)),
                   ("s", rawwire.PT_STRING, b"x")], resp


def test_read_all_with_respond_all_ops_is_parameter_error_raw(citrined, client, set_name):
    client.put(("test", set_name, "rk"), {"a": 1})
    ops = [rawwire.op(5, rawwire.PT_INTEGER, "a", rawwire.int_value(1)),
           rawwire.op(rawwire.OP_READ, 0, "")]
    resp = rawwire.command(citrined.host, citrined.port, "test", set_name, "rk",
                           rawwire.INFO1_READ | rawwire.INFO1_GET_ALL,
                           rawwire.INFO2_WRITE | 0x80, ops=ops)
    assert resp["result_code"] == 4, resp
    assert client.get(("test", set_name, "rk"))[2] == {"a": 1}



def test_append_or_prepend_of_a_non_string_makes_a_missing_bin(citrined, key):
    """As the reference: an append or prepend of an integer, float, list or
    map to a missing bin (or record) creates the bin from the value; to an
    existing bin of that type it is 12 (issue 46, item 5)."""
    loose = make_client(citrined, strict_types=False)
    try:
        ops = [{"op": aerospike.OPERATOR_PREPEND, "bin": "age", "val": 4},
               {"op": aerospike.OPERATOR_READ, "bin": "age"}]
        _, _, bins = loose.operate(key, ops)
        assert bins == {"age": 4}
        ops = [{"op": aerospike.OPERATOR_APPEND, "bin": "m", "val": {"a": 1}},
               {"op": aerospike.OPERATOR_READ, "bin": "m"}]
        _, _, bins = loose.operate(key, ops)
        assert bins == {"m": {"a": 1}}
        with pytest.raises(ex.BinIncompatibleType):
            loose.operate(key, [{"op": aerospike.OPERATOR_APPEND, "bin": "age", "val": 5}])
        assert loose.get(key)[2] == {"age": 4, "m": {"a": 1}}
    finally:
        loose.close()


def test_a_touch_on_a_missing_record_answers_not_found_before_other_errors(client, key):
    """On a record that does not exist, an operate holding a touch answers 2
    before any other op's error (issue 46, item 11)."""
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [op.append("a", "x"), op.increment("a", 1)])
    with pytest.raises(ex.RecordNotFound):
        client.operate(key, [op.append("a", "x"), op.increment("a", 1), op.touch(10)])
