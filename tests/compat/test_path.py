"""Path expressions (servers 8.1.1 and later: CDT select and modify by path,
the "all children" contexts and the loop variables) through the official
client: the select_by_path / modify_by_path operations and the SelectByPath /
ModifyByPath expressions, with the data and answers of the client's own
examples, and the result codes of refused paths."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers import cdt_ctx
from aerospike_helpers import expressions as exp
from aerospike_helpers.expressions.resources import ResultType
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import operations as op

pytestmark = pytest.mark.cdt

DAYS = {
    "Day1": {"book": 14.99, "ferry": 5.0},
    "Day2": {"food": 34.0, "game": 12.99},
    "Day3": {"plants": 19.99, "stickers": 2.0},
}

ALL = cdt_ctx.cdt_ctx_all_children()
VALUE = aerospike.EXP_PATH_SELECT_VALUE
TREE = aerospike.EXP_PATH_SELECT_MATCHING_TREE
NO_FAIL = aerospike.EXP_PATH_SELECT_NO_FAIL


def where(expression):
    return cdt_ctx.cdt_ctx_all_children_with_filter(expression.compile())


def select(client, key, bin_name, ctx, flags):
    _, _, bins = client.operate(key, [op.select_by_path(bin_name, ctx, flags)])
    return bins[bin_name]


def test_a_filtered_level_selects_values_and_the_matching_tree(client, key):
    client.put(key, {"m": DAYS})
    pricey = [ALL, where(exp.GE(exp.LoopVarFloat(aerospike.EXP_LOOPVAR_VALUE), 20.0))]
    assert select(client, key, "m", pricey, VALUE) == [34.0]
    assert select(client, key, "m", pricey, TREE) == {
        "Day1": {}, "Day2": {"food": 34.0}, "Day3": {}}
    books = [ALL, where(exp.Eq(exp.LoopVarStr(aerospike.EXP_LOOPVAR_KEY), "book"))]
    assert select(client, key, "m", books, TREE) == {
        "Day1": {"book": 14.99}, "Day2": {}, "Day3": {}}


def test_keys_and_key_value_pairs(client, key):
    client.put(key, {"m": DAYS})
    both = [ALL, ALL]
    assert select(client, key, "m", both, aerospike.EXP_PATH_SELECT_MAP_KEY) == [
        "book", "ferry", "food", "game", "plants", "stickers"]
    assert select(client, key, "m", both, aerospike.EXP_PATH_SELECT_MAP_KEY_VALUE) == [
        "book", 14.99, "ferry", 5.0, "food", 34.0, "game", 12.99,
        "plants", 19.99, "stickers", 2.0]


def test_modify_rewrites_every_leaf_then_a_select_reads_them(client, key):
    client.put(key, {"m": DAYS})
    both = [ALL, ALL]
    minus_five = exp.Sub(exp.LoopVarFloat(aerospike.EXP_LOOPVAR_VALUE), 5.0)
    _, _, bins = client.operate(key, [
        op.modify_by_path("m", both, minus_five.compile(), aerospike.EXP_PATH_MODIFY_DEFAULT),
        op.select_by_path("m", both, VALUE),
    ])
    assert bins["m"] == pytest.approx([9.99, 0.0, 29.0, 7.99, 14.99, -3.0])
    stored = client.get(key)[2]["m"]
    assert stored["Day2"] == {"food": 29.0, "game": pytest.approx(7.99)}


def test_modify_removes_leaves_with_remove_result(client, key):
    client.put(key, {"m": DAYS})
    client.operate(key, [op.modify_by_path(
        "m", [ALL, ALL], exp.RemoveResult().compile(), aerospike.EXP_PATH_MODIFY_DEFAULT)])
    assert client.get(key)[2]["m"] == {"Day1": {}, "Day2": {}, "Day3": {}}


def test_list_levels_bind_the_index(client, key):
    rows = [list(range(10, 20)) for _ in range(20)]
    client.put(key, {"l": rows, "n": [10, 20, 30, 40, 50]})
    middle = exp.And(
        exp.GE(exp.LoopVarInt(aerospike.EXP_LOOPVAR_VALUE), 14),
        exp.LT(exp.LoopVarInt(aerospike.EXP_LOOPVAR_VALUE), 16))
    assert select(client, key, "l", [ALL, where(middle)], TREE) == [[14, 15]] * 20
    first_three = where(exp.LT(exp.LoopVarInt(aerospike.EXP_LOOPVAR_INDEX), 3))
    assert select(client, key, "n", [first_three], VALUE) == [10, 20, 30]


def test_plain_contexts_mix_with_all_children(client, key):
    books = [
        {"title": "Sayings of the Century", "price": 8.95},
        {"title": "Sword of Honour", "price": 12.99},
        {"title": "Moby Dick", "price": 8.99},
        {"title": "The Lord of the Rings", "price": 22.99},
    ]
    client.put(key, {"store": {"book": books}})
    cheap = where(exp.LE(
        exp.MapGetByKey(None, aerospike.MAP_RETURN_VALUE, ResultType.FLOAT, "price",
                        exp.LoopVarMap(aerospike.EXP_LOOPVAR_VALUE)),
        10.0))
    title = where(exp.Eq(exp.LoopVarStr(aerospike.EXP_LOOPVAR_KEY), "title"))
    ctx = [cdt_ctx.cdt_ctx_map_key("book"), cheap, title]
    assert select(client, key, "store", ctx, VALUE) == [
        "Sayings of the Century", "Moby Dick"]
    # Prices times 1.1, titles untouched.
    client.operate(key, [op.modify_by_path(
        "store",
        [cdt_ctx.cdt_ctx_map_key("book"), ALL, cdt_ctx.cdt_ctx_map_key("price")],
        exp.Mul(exp.LoopVarFloat(aerospike.EXP_LOOPVAR_VALUE), 1.1).compile(),
        aerospike.EXP_PATH_MODIFY_DEFAULT)])
    stored = client.get(key)[2]["store"]["book"]
    assert [b["title"] for b in stored] == [b["title"] for b in books]
    assert [b["price"] for b in stored] == pytest.approx([b["price"] * 1.1 for b in books])


def test_no_fail_turns_unknown_filters_into_false(client, key):
    client.put(key, {"m": {"a": 1, "ab": {"bb": 12}, "b": 2, "c": True,
                           "e": None, "f": 3, "g": 4}})
    at_least_two = [where(exp.GE(exp.LoopVarInt(aerospike.EXP_LOOPVAR_VALUE), 2))]
    assert sorted(select(client, key, "m", at_least_two, VALUE | NO_FAIL)) == [2, 3, 4]
    with pytest.raises(ex.InvalidRequest):
        select(client, key, "m", at_least_two, VALUE)
    nested = [where(exp.GE(
        exp.MapGetByKey(None, aerospike.MAP_RETURN_VALUE, ResultType.INTEGER, "bb",
                        exp.LoopVarMap(aerospike.EXP_LOOPVAR_VALUE)),
        10))]
    assert select(client, key, "m", nested, VALUE | NO_FAIL) == [{"bb": 12}]


def test_the_expression_forms_read_and_write(client, key):
    client.put(key, {"m": DAYS})
    both = [ALL, ALL]
    minus_five = exp.Sub(exp.LoopVarFloat(aerospike.EXP_LOOPVAR_VALUE), 5.0).compile()
    _, _, bins = client.operate(key, [
        eo.expression_write("m", exp.ModifyByPath(
            both, ResultType.MAP, minus_five, aerospike.EXP_PATH_MODIFY_DEFAULT,
            exp.MapBin("m")).compile()),
        eo.expression_read("r", exp.SelectByPath(
            both, ResultType.LIST, VALUE, exp.MapBin("m")).compile()),
    ])
    assert bins["r"] == pytest.approx([9.99, 0.0, 29.0, 7.99, 14.99, -3.0])
    # As a filter: the record passes when some day's leaf is over 25.
    over = exp.GT(exp.ListSize(None, exp.SelectByPath(
        [ALL, where(exp.GT(exp.LoopVarFloat(aerospike.EXP_LOOPVAR_VALUE), 25.0))],
        ResultType.LIST, VALUE, exp.MapBin("m"))), 0).compile()
    assert client.get(key, policy={"expressions": over})[2]["m"]["Day2"]["food"] == 29.0
    under = exp.GT(exp.ListSize(None, exp.SelectByPath(
        [ALL, where(exp.GT(exp.LoopVarFloat(aerospike.EXP_LOOPVAR_VALUE), 99.0))],
        ResultType.LIST, VALUE, exp.MapBin("m"))), 0).compile()
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy={"expressions": under})


def test_refused_paths(client, key):
    client.put(key, {"m": DAYS, "i": 7})
    # A path on a bin that is no collection.
    with pytest.raises(ex.BinIncompatibleType):
        select(client, key, "i", [ALL], VALUE)
    # Map keys of list elements, unless NO_FAIL.
    client.put(key, {"l": [[1], [2]]})
    with pytest.raises(ex.BinIncompatibleType):
        select(client, key, "l", [ALL, ALL], aerospike.EXP_PATH_SELECT_MAP_KEY)
    assert select(client, key, "l", [ALL, ALL],
                  aerospike.EXP_PATH_SELECT_MAP_KEY | NO_FAIL) == []
    # A modify expression that is unknown for a leaf fails the whole op and
    # writes nothing, unless NO_FAIL.
    halve = exp.Div(exp.LoopVarInt(aerospike.EXP_LOOPVAR_VALUE), 2).compile()
    client.put(key, {"mixed": [8, "x", 4]})
    with pytest.raises(ex.AerospikeError) as refused:
        client.operate(key, [op.modify_by_path(
            "mixed", [ALL], halve, aerospike.EXP_PATH_MODIFY_DEFAULT)])
    assert refused.value.code == 1
    assert client.get(key)[2]["mixed"] == [8, "x", 4]
    client.operate(key, [op.modify_by_path(
        "mixed", [ALL], halve, aerospike.EXP_PATH_MODIFY_NO_FAIL)])
    assert client.get(key)[2]["mixed"] == [4, "x", 2]


def test_keys_in_and_an_and_filter(client, key):
    client.put(key, {"m": {"a": 1, "ab": {"bb": 12}, "b": 2, "f": 3, "g": 4}})
    values = aerospike.EXP_PATH_SELECT_MAP_VALUE
    assert select(client, key, "m", [cdt_ctx.cdt_ctx_map_keys_in(["a", "z"])], values) == [1]
    assert select(client, key, "m", [cdt_ctx.cdt_ctx_map_keys_in(["z"])], values) == []
    at_least_two = cdt_ctx.cdt_ctx_and_filter(
        exp.GE(exp.LoopVarInt(aerospike.EXP_LOOPVAR_VALUE), 2).compile())
    assert select(client, key, "m", [cdt_ctx.cdt_ctx_map_keys_in(["a", "b"]), at_least_two],
                  values) == [2]
    # An and-filter must follow another step.
    with pytest.raises(ex.InvalidRequest):
        select(client, key, "m", [at_least_two], values)
    with pytest.raises(ex.InvalidRequest):
        select(client, key, "m", [ALL, at_least_two], values)
