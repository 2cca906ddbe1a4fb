"""Expressions through the official client (05-cdt-exp.md §4): filter
expressions on single-record reads, writes, deletes and operates, on batches and
on scans/queries, and the expression read/write operations. A record that does
not pass its filter answers FILTERED_OUT (27) and is left as it was."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as eo
from aerospike_helpers.operations import operations as op

pytestmark = pytest.mark.exp


def filtered(expression):
    return {"expressions": expression.compile()}


def read_exp(client, key, expression, flags=aerospike.EXP_READ_DEFAULT):
    """The value of one expression read op against the record."""
    _, _, bins = client.operate(key, [eo.expression_read("r", expression.compile(), flags)])
    return bins["r"]


def test_filter_on_get_passes_or_filters_out(client, key):
    client.put(key, {"a": 5, "s": "abc"})
    _, _, bins = client.get(key, policy=filtered(exp.Eq(exp.IntBin("a"), 5)))
    assert bins == {"a": 5, "s": "abc"}
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.GT(exp.IntBin("a"), 5)))
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.Eq(exp.StrBin("s"), "abd")))


def test_filter_on_a_missing_bin_or_a_bin_of_another_type_filters_out(client, key):
    client.put(key, {"a": 5})
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.Eq(exp.IntBin("missing"), 5)))
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.Eq(exp.StrBin("a"), "5")))
    # "Unknown" stays unknown under NOT.
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.Not(exp.Eq(exp.IntBin("missing"), 5))))
    # ...but OR with a true branch decides.
    client.get(key, policy=filtered(exp.Or(exp.Eq(exp.IntBin("missing"), 5), exp.Eq(exp.IntBin("a"), 5))))


def test_filter_on_put_leaves_a_filtered_record_alone(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.FilteredOut):
        client.put(key, {"a": 2}, policy=filtered(exp.Eq(exp.IntBin("a"), 0)))
    _, meta, bins = client.get(key)
    assert bins == {"a": 1} and meta["gen"] == 1
    client.put(key, {"a": 3}, policy=filtered(exp.Eq(exp.IntBin("a"), 1)))
    _, meta, bins = client.get(key)
    assert bins == {"a": 3} and meta["gen"] == 2


def test_filter_does_not_stop_a_put_that_creates_the_record(client, key):
    client.put(key, {"a": 7}, policy=filtered(exp.Eq(exp.IntBin("a"), 0)))
    assert client.get(key)[2] == {"a": 7}


def test_filter_on_remove_and_operate(client, key):
    client.put(key, {"n": 10})
    with pytest.raises(ex.FilteredOut):
        client.remove(key, policy=filtered(exp.LT(exp.IntBin("n"), 10)))
    with pytest.raises(ex.FilteredOut):
        client.operate(key, [op.increment("n", 1)], policy=filtered(exp.LT(exp.IntBin("n"), 10)))
    assert client.get(key)[2] == {"n": 10}
    client.operate(key, [op.increment("n", 1)], policy=filtered(exp.GE(exp.IntBin("n"), 10)))
    assert client.get(key)[2] == {"n": 11}
    client.remove(key, policy=filtered(exp.Eq(exp.IntBin("n"), 11)))
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


def test_logic_and_comparisons(client, key):
    client.put(key, {"i": 10, "f": 2.5, "s": "hello", "b": True})
    passes = [
        exp.And(exp.GT(exp.IntBin("i"), 9), exp.LE(exp.FloatBin("f"), 2.5)),
        exp.Or(exp.Eq(exp.IntBin("i"), 0), exp.NE(exp.StrBin("s"), "x")),
        exp.Not(exp.LT(exp.IntBin("i"), 10)),
        exp.Exclusive(exp.Eq(exp.IntBin("i"), 10), exp.Eq(exp.IntBin("i"), 11)),
        exp.Eq(exp.BoolBin("b"), True),
        exp.GT(exp.StrBin("s"), "hell"),
    ]
    for expression in passes:
        client.get(key, policy=filtered(expression))
    fails = [
        exp.And(exp.GT(exp.IntBin("i"), 9), exp.GT(exp.FloatBin("f"), 2.5)),
        exp.Exclusive(exp.Eq(exp.IntBin("i"), 10), exp.GT(exp.IntBin("i"), 5)),
        exp.LT(exp.StrBin("s"), "hello"),
    ]
    for expression in fails:
        with pytest.raises(ex.FilteredOut):
            client.get(key, policy=filtered(expression))


def test_arithmetic_through_expression_reads(client, key):
    client.put(key, {"a": 7, "b": 2, "f": 1.5})
    assert read_exp(client, key, exp.Add(exp.IntBin("a"), exp.IntBin("b"), 1)) == 10
    assert read_exp(client, key, exp.Sub(exp.IntBin("a"), exp.IntBin("b"))) == 5
    assert read_exp(client, key, exp.Mul(exp.IntBin("a"), exp.IntBin("b"))) == 14
    assert read_exp(client, key, exp.Div(exp.IntBin("a"), exp.IntBin("b"))) == 3
    assert read_exp(client, key, exp.Mod(exp.IntBin("a"), exp.IntBin("b"))) == 1
    assert read_exp(client, key, exp.Abs(exp.Sub(exp.IntBin("b"), exp.IntBin("a")))) == 5
    assert read_exp(client, key, exp.Max(exp.IntBin("a"), exp.IntBin("b"), 4)) == 7
    assert read_exp(client, key, exp.Min(exp.IntBin("a"), exp.IntBin("b"), 4)) == 2
    assert read_exp(client, key, exp.Mul(exp.FloatBin("f"), 2.0)) == 3.0
    assert read_exp(client, key, exp.ToInt(exp.FloatBin("f"))) == 1
    assert read_exp(client, key, exp.ToFloat(exp.IntBin("a"))) == 7.0
    assert read_exp(client, key, exp.Floor(exp.FloatBin("f"))) == 1.0
    assert read_exp(client, key, exp.Ceil(exp.FloatBin("f"))) == 2.0
    assert read_exp(client, key, exp.Pow(exp.FloatBin("f"), 2.0)) == 2.25
    assert read_exp(client, key, exp.IntAnd(exp.IntBin("a"), 3)) == 3
    assert read_exp(client, key, exp.IntLeftShift(exp.IntBin("a"), 2)) == 28
    assert read_exp(client, key, exp.IntCount(exp.IntBin("a"))) == 3


def test_expression_read_of_a_missing_bin_fails_unless_eval_no_fail(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.AerospikeError) as error:
        read_exp(client, key, exp.Add(exp.IntBin("missing"), 1))
    assert error.value.code in (4, 26)
    assert read_exp(client, key, exp.Add(exp.IntBin("missing"), 1), aerospike.EXP_READ_EVAL_NO_FAIL) is None


def test_cond_let_and_var(client, key):
    client.put(key, {"a": 15})
    grade = exp.Cond(
        exp.LT(exp.IntBin("a"), 10), "low",
        exp.LT(exp.IntBin("a"), 20), "mid",
        "high",
    )
    assert read_exp(client, key, grade) == "mid"
    doubled = exp.Let(exp.Def("x", exp.IntBin("a")), exp.Add(exp.Var("x"), exp.Var("x")))
    assert read_exp(client, key, doubled) == 30


def test_expression_write_stores_and_deletes(client, key):
    client.put(key, {"a": 4, "b": 5})
    client.operate(key, [eo.expression_write("sum", exp.Add(exp.IntBin("a"), exp.IntBin("b")).compile())])
    assert client.get(key)[2] == {"a": 4, "b": 5, "sum": 9}
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [eo.expression_write(
            "sum", exp.IntBin("a").compile(), aerospike.EXP_WRITE_CREATE_ONLY)])
    assert error.value.code == 6
    client.operate(key, [eo.expression_write(
        "sum", exp.IntBin("a").compile(), aerospike.EXP_WRITE_CREATE_ONLY | aerospike.EXP_WRITE_POLICY_NO_FAIL)])
    assert client.get(key)[2]["sum"] == 9
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [eo.expression_write(
            "new", exp.IntBin("a").compile(), aerospike.EXP_WRITE_UPDATE_ONLY)])
    assert error.value.code == 17
    # An "unknown" result with EVAL_NO_FAIL leaves the bin alone...
    client.operate(key, [eo.expression_write(
        "sum", exp.Unknown().compile(), aerospike.EXP_WRITE_ALLOW_DELETE | aerospike.EXP_WRITE_EVAL_NO_FAIL)])
    assert client.get(key)[2]["sum"] == 9
    # ...and fails the operate without it.
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, [eo.expression_write("sum", exp.Unknown().compile())])
    assert error.value.code == 26
    # A nil result deletes the bin with ALLOW_DELETE only.
    with pytest.raises(ex.AerospikeError):
        client.operate(key, [eo.expression_write("sum", exp.Val(None).compile())])
    client.operate(key, [eo.expression_write(
        "sum", exp.Val(None).compile(), aerospike.EXP_WRITE_ALLOW_DELETE)])
    assert "sum" not in client.get(key)[2]


def test_expression_ops_see_earlier_ops_of_the_same_operate(client, key):
    client.put(key, {"a": 1})
    _, _, bins = client.operate(key, [
        op.write("a", 41),
        eo.expression_read("r", exp.Add(exp.IntBin("a"), 1).compile()),
    ])
    assert bins["r"] == 42


def test_metadata(client, key, set_name):
    client.put(key, {"a": 1}, policy={"key": aerospike.POLICY_KEY_SEND})
    client.get(key, policy=filtered(exp.Eq(exp.SetName(), set_name)))
    client.get(key, policy=filtered(exp.KeyExists()))
    client.get(key, policy=filtered(exp.Eq(exp.KeyStr(), key[2])))
    client.get(key, policy=filtered(exp.GT(exp.LastUpdateTime(), 0)))
    client.get(key, policy=filtered(exp.GE(exp.SinceUpdateTime(), 0)))
    client.get(key, policy=filtered(exp.GT(exp.RecordSize(), 0)))
    client.get(key, policy=filtered(exp.Not(exp.IsTombstone())))
    # No expiry: TTL and void time read -1.
    assert read_exp(client, key, exp.TTL()) == -1
    assert read_exp(client, key, exp.VoidTime()) == -1
    modulo = read_exp(client, key, exp.DigestMod(3))
    assert modulo in (0, 1, 2)
    client.get(key, policy=filtered(exp.Eq(exp.DigestMod(3), modulo)))
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.Eq(exp.SetName(), set_name + "x")))


def test_set_name_and_key_exists_in_a_write_creating_the_record(client, key, set_name):
    """In a write the set is known while the record is created, and the key
    sent with it is not stored yet (the reference's answers)."""
    _, _, bins = client.operate(key, [
        op.write("a", 1),
        eo.expression_read("n", exp.SetName().compile()),
        eo.expression_read("k", exp.KeyExists().compile()),
    ], policy={"key": aerospike.POLICY_KEY_SEND})
    assert bins["n"] == set_name
    assert bins["k"] is False
    assert read_exp(client, key, exp.KeyExists()) is True


def test_key_exists_is_false_without_a_stored_key(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.KeyExists()))


def test_bin_type_and_regex(client, key):
    client.put(key, {"s": "Hello World", "i": 1})
    assert read_exp(client, key, exp.BinType("s")) == aerospike.AS_BYTES_STRING
    assert read_exp(client, key, exp.BinType("i")) == aerospike.AS_BYTES_INTEGER
    client.get(key, policy=filtered(exp.CmpRegex(aerospike.REGEX_ICASE, "^hello", exp.StrBin("s"))))
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.CmpRegex(aerospike.REGEX_NONE, "^hello", exp.StrBin("s"))))


def test_geo_compare_filters_points_and_regions(client, key):
    """`CmpGeo`: a point bin inside a region, a region bin holding a point,
    as the reference matches GeoJSON in expressions."""
    bay = {"type": "Polygon",
           "coordinates": [[[-122.5, 37.0], [-121.0, 37.0], [-121.0, 38.08],
                            [-122.5, 38.08], [-122.5, 37.0]]]}
    inside = aerospike.GeoJSON({"type": "Point", "coordinates": [-122.0, 37.5]})
    outside = aerospike.GeoJSON({"type": "Point", "coordinates": [-120.0, 37.5]})
    client.put(key, {"loc": inside, "area": aerospike.GeoJSON(bay)})
    client.get(key, policy=filtered(exp.CmpGeo(exp.GeoBin("loc"), aerospike.GeoJSON(bay))))
    client.get(key, policy=filtered(exp.CmpGeo(exp.GeoBin("area"), inside)))
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.CmpGeo(exp.GeoBin("area"), outside)))
    client.put(key, {"loc": outside})
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.CmpGeo(exp.GeoBin("loc"), aerospike.GeoJSON(bay))))


def test_list_and_map_reads_inside_expressions(client, key):
    client.put(key, {"l": [3, 1, 2], "m": {"x": 10, "y": 20}})
    client.get(key, policy=filtered(exp.Eq(exp.ListSize(None, exp.ListBin("l")), 3)))
    assert read_exp(client, key, exp.ListGetByIndex(
        None, aerospike.LIST_RETURN_VALUE, exp.ResultType.INTEGER, 0, exp.ListBin("l"))) == 3
    assert read_exp(client, key, exp.MapGetByKey(
        None, aerospike.MAP_RETURN_VALUE, exp.ResultType.INTEGER, "y", exp.MapBin("m"))) == 20
    client.get(key, policy=filtered(exp.GT(exp.MapSize(None, exp.MapBin("m")), 1)))
    # A modifying call changes the value the expression sees, not the bin.
    appended = exp.ListAppend(None, None, 9, exp.ListBin("l"))
    assert read_exp(client, key, appended) == [3, 1, 2, 9]
    assert client.get(key)[2]["l"] == [3, 1, 2]


def test_list_literal_comparison(client, key):
    client.put(key, {"l": [1, 2, 3]})
    client.get(key, policy=filtered(exp.Eq(exp.ListBin("l"), [1, 2, 3])))
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy=filtered(exp.Eq(exp.ListBin("l"), [1, 2])))


@pytest.mark.scan
def test_query_with_a_filter_returns_only_matching_records(client, make_key, set_name):
    for i in range(20):
        client.put(make_key(f"q{i}"), {"i": i})
    query = client.query("test", set_name)
    seen = []
    query.foreach(lambda record: seen.append(record[2]["i"]),
                  policy=filtered(exp.Eq(exp.Mod(exp.IntBin("i"), 3), 0)))
    assert sorted(seen) == [0, 3, 6, 9, 12, 15, 18]


def test_batch_with_a_filter_answers_filtered_out_per_row(client, make_key):
    keys = [make_key(f"b{i}") for i in range(6)]
    for i, k in enumerate(keys):
        client.put(k, {"i": i})
    records = client.batch_read(keys, policy=filtered(exp.GE(exp.IntBin("i"), 3)))
    codes = [record.result for record in records.batch_records]
    assert codes == [27, 27, 27, 0, 0, 0]
    assert [record.record[2]["i"] for record in records.batch_records[3:]] == [3, 4, 5]
