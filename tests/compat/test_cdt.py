"""List and map (CDT) operations through the official client (05-cdt-exp.md §2):
results as the client returns them, the bins as stored afterwards, contexts into
nested collections, and the result codes of refused operations."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers import cdt_ctx
from aerospike_helpers.operations import list_operations as lo
from aerospike_helpers.operations import map_operations as mo
from aerospike_helpers.operations import operations as op

pytestmark = pytest.mark.cdt


def results(client, key, ops):
    """Runs ops in order; returns each op's (bin, result) pair."""
    _, _, out = client.operate_ordered(key, ops)
    return [value for _, value in out]


def test_list_append_insert_and_reads(client, key):
    client.put(key, {"l": [1, 2, 3]})
    assert results(client, key, [
        lo.list_append("l", 4),
        lo.list_append_items("l", [5, 6]),
        lo.list_insert("l", 0, 0),
        lo.list_size("l"),
        lo.list_get("l", -1),
        lo.list_get_range("l", 1, 3),
    ]) == [4, 6, 7, 7, 6, [1, 2, 3]]
    assert client.get(key)[2]["l"] == [0, 1, 2, 3, 4, 5, 6]


def test_list_append_creates_the_bin(client, key):
    client.put(key, {"a": 1})
    assert results(client, key, [lo.list_append("l", "x")]) == [1]
    assert client.get(key)[2] == {"a": 1, "l": ["x"]}


def test_list_pop_remove_trim_clear(client, key):
    client.put(key, {"l": [10, 20, 30, 40, 50, 60]})
    assert results(client, key, [
        lo.list_pop("l", 0),
        lo.list_pop_range("l", -2, 2),
        lo.list_remove("l", 0),
        lo.list_size("l"),
    ]) == [10, [50, 60], 1, 2]
    assert client.get(key)[2]["l"] == [30, 40]
    results(client, key, [lo.list_clear("l")])
    assert client.get(key)[2]["l"] == []


def test_list_increment_and_set(client, key):
    client.put(key, {"l": [1, 2.5, "s"]})
    assert results(client, key, [lo.list_increment("l", 0, 41)]) == [42]
    client.operate(key, [lo.list_set("l", 2, "t")])
    assert client.get(key)[2]["l"] == [42, 2.5, "t"]
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [lo.list_increment("l", 2, 1)])
    assert error.value.code in (4, 12, 26)
    assert client.get(key)[2]["l"] == [42, 2.5, "t"]  # unchanged


def test_list_by_value_rank_and_index_selectors(client, key):
    client.put(key, {"l": [7, 3, 9, 3, 1]})
    assert results(client, key, [
        lo.list_get_by_rank("l", 0, aerospike.LIST_RETURN_VALUE),
        lo.list_get_by_rank("l", -1, aerospike.LIST_RETURN_INDEX),
        lo.list_get_by_value("l", 3, aerospike.LIST_RETURN_INDEX),
        lo.list_get_by_value("l", 3, aerospike.LIST_RETURN_COUNT),
        lo.list_get_by_value_range("l", aerospike.LIST_RETURN_VALUE, 3, 8),
        lo.list_get_by_index_range("l", 1, aerospike.LIST_RETURN_VALUE, 2),
        lo.list_get_by_index_range("l", 1, aerospike.LIST_RETURN_VALUE, 2, inverted=True),
        lo.list_get_by_rank_range("l", 0, aerospike.LIST_RETURN_VALUE, 3),
        lo.list_get_by_rank_range("l", 3, aerospike.LIST_RETURN_VALUE, 2),
    ]) == [1, 2, [1, 3], 2, [7, 3, 3], [3, 9], [7, 3, 1],
           # An unordered list's rank range comes back in the reference's
           # heap order: descending from the low end, ascending from the
           # high end (the official Node client's tests expect both).
           [3, 3, 1], [7, 9]]


def test_list_remove_by_value(client, key):
    client.put(key, {"l": [1, 2, 1, 3, 1]})
    assert results(client, key, [
        lo.list_remove_by_value("l", 1, aerospike.LIST_RETURN_COUNT),
    ]) == [3]
    assert client.get(key)[2]["l"] == [2, 3]


def test_ordered_list_stays_sorted(client, key):
    policy = {"list_order": aerospike.LIST_ORDERED}
    results(client, key, [lo.list_append_items("l", [5, 1, 4], policy)])
    results(client, key, [lo.list_append("l", 3, policy)])
    assert client.get(key)[2]["l"] == [1, 3, 4, 5]


def test_list_add_unique_refuses_a_duplicate(client, key):
    client.put(key, {"l": [1, 2]})
    policy = {"write_flags": aerospike.LIST_WRITE_ADD_UNIQUE}
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [lo.list_append("l", 2, policy)])
    assert error.value.code == 24  # ELEMENT_EXISTS
    no_fail = {"write_flags": aerospike.LIST_WRITE_ADD_UNIQUE | aerospike.LIST_WRITE_NO_FAIL}
    client.operate(key, [lo.list_append("l", 2, no_fail)])
    assert client.get(key)[2]["l"] == [1, 2]


def test_map_put_get_increment_remove(client, key):
    assert results(client, key, [
        mo.map_put("m", "b", 2),
        mo.map_put_items("m", {"a": 1, "c": 3}),
        mo.map_increment("m", "a", 10),
        mo.map_get_by_key("m", "c", aerospike.MAP_RETURN_VALUE),
        mo.map_get_by_key("m", "zz", aerospike.MAP_RETURN_VALUE),
        mo.map_size("m"),
    ]) == [1, 3, 11, 3, None, 3]
    assert results(client, key, [
        mo.map_remove_by_key("m", "b", aerospike.MAP_RETURN_VALUE),
    ]) == [2]
    assert client.get(key)[2]["m"] == {"a": 11, "c": 3}


def test_map_index_uses_key_order_and_rank_uses_value_order(client, key):
    client.put(key, {"m": {"b": 30, "c": 10, "a": 20}})
    assert results(client, key, [
        mo.map_get_by_index("m", 0, aerospike.MAP_RETURN_KEY),
        mo.map_get_by_index("m", -1, aerospike.MAP_RETURN_VALUE),
        mo.map_get_by_rank("m", 0, aerospike.MAP_RETURN_KEY),
        mo.map_get_by_rank("m", -1, aerospike.MAP_RETURN_KEY),
        mo.map_get_by_key_range("m", "a", "c", aerospike.MAP_RETURN_KEY),
        mo.map_get_by_value_range("m", 15, 35, aerospike.MAP_RETURN_COUNT),
        mo.map_get_by_key("m", "a", aerospike.MAP_RETURN_KEY_VALUE),
    ]) == ["a", 10, "c", "b", ["a", "b"], 2, ["a", 20]]
    # (KEY_VALUE results come as an order-preserving map, which the client
    # flattens into [key, value, ...].)


def test_map_write_flags(client, key):
    client.put(key, {"m": {"a": 1}})
    create_only = {"map_write_flags": aerospike.MAP_WRITE_FLAGS_CREATE_ONLY}
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [mo.map_put("m", "a", 2, create_only)])
    assert error.value.code == 24  # ELEMENT_EXISTS
    update_only = {"map_write_flags": aerospike.MAP_WRITE_FLAGS_UPDATE_ONLY}
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [mo.map_put("m", "b", 2, update_only)])
    assert error.value.code == 23  # ELEMENT_NOT_FOUND
    no_fail = {"map_write_flags": aerospike.MAP_WRITE_FLAGS_CREATE_ONLY
               | aerospike.MAP_WRITE_FLAGS_NO_FAIL}
    client.operate(key, [mo.map_put("m", "a", 3, no_fail)])
    assert client.get(key)[2]["m"] == {"a": 1}


def test_key_ordered_map_via_policy(client, key):
    policy = {"map_order": aerospike.MAP_KEY_ORDERED}
    results(client, key, [mo.map_put_items("m", {"z": 1, "x": 2, "y": 3}, policy)])
    assert results(client, key, [
        mo.map_get_by_index_range("m", 0, 3, aerospike.MAP_RETURN_KEY),
    ]) == [["x", "y", "z"]]


def test_context_reaches_nested_collections(client, key):
    client.put(key, {"m": {"inner": {"x": 1}, "list": [[1, 2], [3]]}})
    assert results(client, key, [
        mo.map_put("m", "y", 2, ctx=[cdt_ctx.cdt_ctx_map_key("inner")]),
        lo.list_append("m", 4, ctx=[cdt_ctx.cdt_ctx_map_key("list"),
                                    cdt_ctx.cdt_ctx_list_index(-1)]),
        mo.map_get_by_key("m", "x", aerospike.MAP_RETURN_VALUE,
                          ctx=[cdt_ctx.cdt_ctx_map_key("inner")]),
    ]) == [2, 2, 1]
    assert client.get(key)[2]["m"] == {"inner": {"x": 1, "y": 2}, "list": [[1, 2], [3, 4]]}


def test_context_creates_a_missing_map(client, key):
    client.put(key, {"m": {}})
    ctx = [cdt_ctx.cdt_ctx_map_key_create("new", aerospike.MAP_KEY_ORDERED)]
    assert results(client, key, [mo.map_put("m", "k", "v", ctx=ctx)]) == [1]
    assert client.get(key)[2]["m"] == {"new": {"k": "v"}}
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [mo.map_put("m", "k", "v", ctx=[cdt_ctx.cdt_ctx_map_key("nope")])])
    assert error.value.code == 26  # OP_NOT_APPLICABLE: a context without create cannot follow


def test_cdt_op_on_the_wrong_type_is_refused(client, key):
    client.put(key, {"s": "text", "m": {"a": 1}})
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [lo.list_append("s", 1)])
    assert error.value.code == 12  # INCOMPATIBLE_TYPE
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [lo.list_append("m", 1)])
    assert error.value.code == 12
    assert client.get(key)[2] == {"s": "text", "m": {"a": 1}}


def test_cdt_read_of_a_missing_bin_answers_nothing(client, key):
    client.put(key, {"a": 1})
    _, _, bins = client.operate(key, [lo.list_size("nope"), op.read("a")])
    assert bins.get("nope") is None
    assert bins["a"] == 1


def test_cdt_write_bumps_the_generation_once(client, key):
    client.put(key, {"l": [1]})
    _, meta, _ = client.operate(key, [lo.list_append("l", 2), lo.list_append("l", 3),
                                      op.read("l")])
    assert meta["gen"] == 2
    assert client.get(key)[2]["l"] == [1, 2, 3]


def test_a_key_ordered_map_written_whole_is_stored_in_key_order(client, key):
    client.put(key, {"m": aerospike.KeyOrderedDict({"b": 2, "c": 3, "a": 1})})
    stored = client.get(key)[2]["m"]
    assert list(stored.keys()) == ["a", "b", "c"]
    # Map ops by index see the same order.
    assert results(client, key, [mo.map_get_by_index("m", 0, aerospike.MAP_RETURN_KEY)]) == ["a"]


# Contexts that cannot be followed, as the reference server (8.1.2) answers
# them: 26 (OP_NOT_APPLICABLE) for reads and writes alike.

NESTED = [["hi", "friend", ["how", "are", ["you"]]], ["hey", ["numbers", [1, 2, 3]], "home boy"], 7]
NESTED_MAP = {"first": {"greet": "hi", "numbers": [3, 1, 2]}, "second": {"nested": {"a": 4}}, "s": 5}


def code_of(client, key, ops):
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, ops)
    return error.value.code


def test_a_context_index_or_key_that_is_not_there_answers_26(client, key):
    client.put(key, {"l": NESTED, "m": NESTED_MAP})
    paths = [
        ("l", [cdt_ctx.cdt_ctx_list_index(3)]),
        ("l", [cdt_ctx.cdt_ctx_list_index(-10)]),
        ("l", [cdt_ctx.cdt_ctx_list_rank(10)]),
        ("l", [cdt_ctx.cdt_ctx_list_value(99)]),
        ("l", [cdt_ctx.cdt_ctx_list_index(0), cdt_ctx.cdt_ctx_list_index(2),
               cdt_ctx.cdt_ctx_list_index(9)]),
        ("m", [cdt_ctx.cdt_ctx_map_key("zz")]),
        ("m", [cdt_ctx.cdt_ctx_map_index(10)]),
        ("m", [cdt_ctx.cdt_ctx_map_rank(-10)]),
        ("m", [cdt_ctx.cdt_ctx_map_value(99)]),
        ("m", [cdt_ctx.cdt_ctx_map_key("second"), cdt_ctx.cdt_ctx_map_key("nested"),
               cdt_ctx.cdt_ctx_map_key("zz")]),
        ("m", [cdt_ctx.cdt_ctx_map_key("first"), cdt_ctx.cdt_ctx_map_key("numbers"),
               cdt_ctx.cdt_ctx_list_index(7)]),
    ]
    for bin_name, ctx in paths:
        for ops in ([lo.list_size(bin_name, ctx=ctx)],
                    [mo.map_size(bin_name, ctx=ctx)],
                    [lo.list_append(bin_name, 9, ctx=ctx)],
                    [mo.map_put(bin_name, "k", 9, ctx=ctx)]):
            assert code_of(client, key, ops) == 26, (bin_name, ctx, ops)
    assert client.get(key)[2] == {"l": NESTED, "m": NESTED_MAP}


def test_a_context_step_inside_a_scalar_answers_26_the_op_on_one_12(client, key):
    client.put(key, {"l": NESTED, "m": NESTED_MAP})
    # l[2] is 7: a step inside it cannot be followed; an op on it is refused.
    inside = [cdt_ctx.cdt_ctx_list_index(2), cdt_ctx.cdt_ctx_list_index(0)]
    assert code_of(client, key, [lo.list_size("l", ctx=inside)]) == 26
    assert code_of(client, key, [lo.list_append("l", 1, ctx=inside)]) == 26
    at = [cdt_ctx.cdt_ctx_list_index(2)]
    assert code_of(client, key, [lo.list_size("l", ctx=at)]) == 12
    # A map step in a list, a list step in a map.
    assert code_of(client, key, [lo.list_size("l", ctx=[cdt_ctx.cdt_ctx_map_key("a")])]) == 26
    assert code_of(client, key, [mo.map_size("m", ctx=[cdt_ctx.cdt_ctx_list_index(0)])]) == 26
    deep = [cdt_ctx.cdt_ctx_map_key("second"), cdt_ctx.cdt_ctx_map_key("nested"),
            cdt_ctx.cdt_ctx_map_key("a"), cdt_ctx.cdt_ctx_map_key("x")]
    assert code_of(client, key, [mo.map_put("m", "k", 1, ctx=deep)]) == 26


def test_a_context_on_a_bin_that_is_no_collection_answers_4(client, key):
    client.put(key, {"i": 5, "s": "text"})
    for bin_name in ("i", "s"):
        ctx = [cdt_ctx.cdt_ctx_list_index(0)]
        assert code_of(client, key, [lo.list_size(bin_name, ctx=ctx)]) == 4
        assert code_of(client, key, [lo.list_append(bin_name, 1, ctx=ctx)]) == 4
        # Without a context the op meets the bin: 12.
        assert code_of(client, key, [lo.list_size(bin_name)]) == 12


def test_a_context_on_a_missing_bin(client, key):
    client.put(key, {"a": 1})
    ctx = [cdt_ctx.cdt_ctx_list_index(0)]
    # A read answers nothing; a write without create flags cannot follow.
    _, _, out = client.operate_ordered(key, [lo.list_size("x", ctx=ctx), op.read("a")])
    assert out == [("a", 1)]
    assert code_of(client, key, [lo.list_append("x", 1, ctx=ctx)]) == 26
    create = [cdt_ctx.cdt_ctx_map_key_create("k", aerospike.MAP_UNORDERED)]
    assert results(client, key, [lo.list_append("x", 9, ctx=create)]) == [1]
    assert client.get(key)[2] == {"a": 1, "x": {"k": [9]}}


def test_create_flags_do_not_make_a_read_follow_a_missing_path(client, key):
    client.put(key, {"m": {"a": {}}})
    create = [cdt_ctx.cdt_ctx_map_key_create("zz", aerospike.MAP_UNORDERED)]
    assert code_of(client, key, [mo.map_size("m", ctx=create)]) == 26
    assert results(client, key, [mo.map_put("m", "k", 1, ctx=create)]) == [1]


def test_an_unknown_return_type_answers_26(client, key):
    # The official Python client's test_nested_cdt_ctx.py sends 42.
    client.put(key, {"l": NESTED, "m": {"a": 1}})
    ctx = [cdt_ctx.cdt_ctx_list_index(1)]
    for ops in ([lo.list_get_by_index_range("l", 1, 42, 1, ctx=ctx)],
                [lo.list_remove_by_rank_range("l", 1, 42, 1, ctx=ctx)],
                [mo.map_get_by_key("m", "a", 42)]):
        assert code_of(client, key, ops) == 26


def test_inverted_and_reverse_numbers_come_as_stretches(client, key):
    # The official Python client's test_ctx_list_remove_by_rank_range:
    # ranks of what an inverted rank range leaves, ascending.
    client.put(key, {"l": NESTED, "f": [3, 1, 2, 5, 4],
                     "m": {"a": 1, "b": 3, "c": 5, "d": 2, "e": 2}})
    ctx = [cdt_ctx.cdt_ctx_list_index(0), cdt_ctx.cdt_ctx_list_index(2)]
    assert results(client, key, [
        lo.list_remove_by_rank_range("l", 2, aerospike.LIST_RETURN_RANK, 2, True, ctx=ctx),
        lo.list_get_by_rank_range("f", 2, aerospike.LIST_RETURN_REVERSE_RANK, 2, True),
        lo.list_get_by_index_range("f", 1, aerospike.LIST_RETURN_REVERSE_INDEX, 2, True),
        mo.map_get_by_index_range("m", 1, 2, aerospike.MAP_RETURN_REVERSE_INDEX),
        mo.map_get_by_rank_range("m", 1, 3, aerospike.MAP_RETURN_REVERSE_RANK),
    ]) == [[0, 1], [3, 4, 0], [4, 0, 1], [2, 3], [1, 2, 3]]
    assert client.get(key)[2]["l"][0] == ["hi", "friend", [["you"]]]


def test_ops_on_a_missing_bin_answer_as_the_reference(client, key):
    # Audit of issue 46 item 11 (no difference found): a list or map op on
    # a missing bin answers no bin, or a nil one when the operate asks for
    # every op's answer (a map op makes the client ask).
    client.put(key, {"a": 1})
    _, _, out = client.operate_ordered(key, [
        lo.list_pop("x", 0),
        lo.list_get_by_rank_range("x", 0, aerospike.LIST_RETURN_VALUE, 2),
        op.read("a"),
    ])
    assert out == [("a", 1)]
    _, _, out = client.operate_ordered(key, [
        lo.list_pop("x", 0),
        lo.list_get_by_rank_range("x", 0, aerospike.LIST_RETURN_VALUE, 2),
        mo.map_size("y"),
    ])
    assert out == [("x", None), ("x", None), ("y", None)]
    assert client.get(key)[2] == {"a": 1}
