"""Expression evaluation through the official client (05-cdt-exp.md §4): the
values the reference server's rules give (integer overflow, division by zero,
bit scans, regex flags, three-valued logic), module calls (list, map, bit and
HLL ops inside expressions, reading and modifying), metadata, and the refusals
the server answers for expressions it will not build."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers import expressions as exp
from aerospike_helpers.operations import expression_operations as eo

pytestmark = [
    pytest.mark.exp,
    pytest.mark.filterwarnings("ignore:CmpRegex expression is deprecated:DeprecationWarning"),
]

I64_MIN = -(2 ** 63)
I64_MAX = 2 ** 63 - 1


def read_exp(client, key, expression, flags=aerospike.EXP_READ_DEFAULT):
    """The value of one expression read op against the record."""
    _, _, bins = client.operate(key, [eo.expression_read("r", expression.compile(), flags)])
    return bins["r"]


def read_error(client, key, expression):
    """The result code an expression read op fails with."""
    with pytest.raises(ex.AerospikeError) as error:
        read_exp(client, key, expression)
    return error.value.code


def passes(client, key, expression):
    """Whether a get with the filter passes (True) or is filtered out (False)."""
    try:
        client.get(key, policy={"expressions": expression.compile()})
        return True
    except ex.FilteredOut:
        return False


def test_integer_arithmetic_wraps_and_division_by_zero_is_unknown(client, key):
    client.put(key, {"max": I64_MAX, "min": I64_MIN, "a": 7})
    assert read_exp(client, key, exp.Add(exp.IntBin("max"), 1)) == I64_MIN
    assert read_exp(client, key, exp.Mul(exp.IntBin("max"), 2)) == -2
    assert read_exp(client, key, exp.Sub(exp.IntBin("min"))) == I64_MIN
    assert read_exp(client, key, exp.Abs(exp.IntBin("min"))) == I64_MIN
    # Integer division truncates toward zero; several divisors multiply.
    assert read_exp(client, key, exp.Div(-7, 2)) == -3
    assert read_exp(client, key, exp.Div(100, 5, 2)) == 10
    assert read_exp(client, key, exp.Mod(-7, 3)) == -1
    # By zero, and the one overflowing quotient, are unknown: the read op
    # fails with OP_NOT_APPLICABLE, a filter does not pass.
    assert read_error(client, key, exp.Div(exp.IntBin("a"), 0)) == 26
    assert read_error(client, key, exp.Div(exp.IntBin("min"), -1)) == 26
    assert read_error(client, key, exp.Mod(exp.IntBin("a"), 0)) == 26
    assert not passes(client, key, exp.Eq(exp.Div(exp.IntBin("a"), 0), 0))
    assert read_exp(client, key, exp.Div(exp.IntBin("a"), 0),
                    aerospike.EXP_READ_EVAL_NO_FAIL) is None


def test_float_arithmetic(client, key):
    client.put(key, {"f": 2.5})
    assert read_exp(client, key, exp.Add(exp.FloatBin("f"), 0.25)) == 2.75
    assert read_exp(client, key, exp.Div(1.0, 0.0)) == float("inf")
    assert read_exp(client, key, exp.Pow(2.0, 10.0)) == 1024.0
    assert read_exp(client, key, exp.Log(8.0, 2.0)) == 3.0
    assert read_exp(client, key, exp.Floor(-1.5)) == -2.0
    assert read_exp(client, key, exp.Ceil(1.2)) == 2.0
    assert read_exp(client, key, exp.ToInt(-2.9)) == -2
    assert read_exp(client, key, exp.ToFloat(3)) == 3.0
    assert read_exp(client, key, exp.Min(exp.FloatBin("f"), 1.0, 4.0)) == 1.0
    assert read_exp(client, key, exp.Max(3, 9, -1)) == 9


def test_mixed_number_types_are_refused(client, key):
    client.put(key, {"a": 1})
    # Integers and floats do not mix: the expression is refused at parse.
    with pytest.raises(ex.AerospikeError) as error:
        read_exp(client, key, exp.Add(exp.IntBin("a"), 1.5))
    assert error.value.code == 4
    with pytest.raises(ex.AerospikeError) as error:
        client.get(key, policy={"expressions": exp.Eq(exp.IntBin("a"), 1.0).compile()})
    assert error.value.code == 4


def test_integer_bit_operators(client, key):
    client.put(key, {"a": 0b1100})
    assert read_exp(client, key, exp.IntAnd(exp.IntBin("a"), 0b1010)) == 0b1000
    assert read_exp(client, key, exp.IntOr(exp.IntBin("a"), 0b1010)) == 0b1110
    assert read_exp(client, key, exp.IntXOr(exp.IntBin("a"), 0b1010, 1)) == 0b0111
    assert read_exp(client, key, exp.IntNot(0)) == -1
    assert read_exp(client, key, exp.IntLeftShift(1, 4)) == 16
    assert read_exp(client, key, exp.IntRightShift(-1, 60)) == 15
    assert read_exp(client, key, exp.IntArithmeticRightShift(-16, 2)) == -4
    assert read_exp(client, key, exp.IntCount(exp.IntBin("a"))) == 2
    # Scans count bit positions from the most significant bit.
    assert read_exp(client, key, exp.IntLeftScan(exp.IntBin("a"), True)) == 60
    assert read_exp(client, key, exp.IntRightScan(exp.IntBin("a"), True)) == 61
    assert read_exp(client, key, exp.IntLeftScan(0, True)) == -1


def test_three_valued_logic_in_filters(client, key):
    client.put(key, {"a": 1})
    known_true = exp.Eq(exp.IntBin("a"), 1)
    known_false = exp.Eq(exp.IntBin("a"), 2)
    unknown = exp.Eq(exp.IntBin("missing"), 1)
    assert not passes(client, key, exp.And(known_true, unknown))
    assert not passes(client, key, exp.Not(exp.And(known_true, unknown)))
    # False decides AND even next to an unknown; true decides OR.
    assert passes(client, key, exp.Not(exp.And(unknown, known_false)))
    assert passes(client, key, exp.Or(unknown, known_true))
    assert not passes(client, key, exp.Or(unknown, known_false))
    # Exclusive: exactly one true.
    assert passes(client, key, exp.Exclusive(known_true, known_false))
    assert not passes(client, key, exp.Exclusive(known_true, known_true))
    assert not passes(client, key, exp.Exclusive(known_false, known_false))
    assert not passes(client, key, exp.Exclusive(unknown, known_true))


def test_cond_let_and_scopes(client, key):
    client.put(key, {"a": 5})
    sign = exp.Cond(
        exp.LT(exp.IntBin("a"), 0), "negative",
        exp.Eq(exp.IntBin("a"), 0), "zero",
        "positive")
    assert read_exp(client, key, sign) == "positive"
    # let x = a + 1, y = x * 2 in y - x
    assert read_exp(client, key, exp.Let(
        exp.Def("x", exp.Add(exp.IntBin("a"), 1)),
        exp.Def("y", exp.Mul(exp.Var("x"), 2)),
        exp.Sub(exp.Var("y"), exp.Var("x")))) == 6
    # An undefined variable is refused at parse.
    with pytest.raises(ex.AerospikeError) as error:
        read_exp(client, key, exp.Let(exp.Def("x", 1), exp.Var("nope")))
    assert error.value.code == 4


def test_strings_blobs_and_regex(client, key):
    client.put(key, {"s": "Hello World", "b": bytearray(b"\x01\x02")})
    assert passes(client, key, exp.GT(exp.StrBin("s"), "Hello"))
    assert passes(client, key, exp.LT(exp.StrBin("s"), "Hello Xorld"))
    assert passes(client, key, exp.Eq(exp.BlobBin("b"), bytearray(b"\x01\x02")))
    extended = aerospike.REGEX_EXTENDED
    assert passes(client, key, exp.CmpRegex(extended, "^Hel+o", exp.StrBin("s")))
    assert not passes(client, key, exp.CmpRegex(extended, "^hello", exp.StrBin("s")))
    assert passes(client, key, exp.CmpRegex(extended | aerospike.REGEX_ICASE, "^hello",
                                            exp.StrBin("s")))
    # Without REGEX_EXTENDED the pattern is a POSIX basic one: `+` is literal.
    assert not passes(client, key, exp.CmpRegex(aerospike.REGEX_NONE, "Hel+o", exp.StrBin("s")))
    assert passes(client, key, exp.CmpRegex(aerospike.REGEX_NONE, "Hel*o", exp.StrBin("s")))


def test_metadata_values(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 1000})
    size = read_exp(client, key, exp.RecordSize())
    # In memory, the size the reference's flat records in 16-byte rblocks
    # would take: its 35-byte header, the void time, the set, the bins.
    assert size % 16 == 0 and size >= 48
    assert 990 <= read_exp(client, key, exp.TTL()) <= 1000
    assert read_exp(client, key, exp.SinceUpdateTime()) < 60_000
    void_ns = read_exp(client, key, exp.VoidTime())
    last_ns = read_exp(client, key, exp.LastUpdateTime())
    assert 990 * 10 ** 9 <= void_ns - last_ns <= 1001 * 10 ** 9
    digest = client.get(key)[0][3]
    low_word = int.from_bytes(digest[16:20], "little")
    assert read_exp(client, key, exp.DigestMod(7)) == low_word % 7
    assert read_exp(client, key, exp.IsTombstone()) is False
    assert read_exp(client, key, exp.BinType("a")) == aerospike.AS_BYTES_INTEGER
    assert read_exp(client, key, exp.BinType("none")) == 0


def test_list_calls_read_and_modify(client, key):
    client.put(key, {"l": [3, 1, 2], "i": 1})
    assert read_exp(client, key, exp.ListSize(None, "l")) == 3
    assert read_exp(client, key, exp.ListGetByIndex(
        None, aerospike.LIST_RETURN_VALUE, exp.ResultType.INTEGER, exp.IntBin("i"), "l")) == 1
    assert read_exp(client, key, exp.ListGetByValueRange(
        None, aerospike.LIST_RETURN_VALUE, 2, 10, "l")) == [3, 2]
    # A modifying call answers the new list; the bin itself is untouched.
    appended = exp.ListAppend(None, None, 9, "l")
    assert read_exp(client, key, appended) == [3, 1, 2, 9]
    assert read_exp(client, key, exp.ListSize(None, appended)) == 4
    assert client.get(key)[2]["l"] == [3, 1, 2]
    # An expression write stores the call's value.
    client.operate(key, [eo.expression_write("l2", exp.ListSort(None, aerospike.LIST_SORT_DEFAULT,
                                                                 "l").compile())])
    assert client.get(key)[2]["l2"] == [1, 2, 3]
    # As a filter.
    assert passes(client, key, exp.GT(exp.ListSize(None, "l"), 2))
    assert not passes(client, key, exp.GT(exp.ListSize(None, "missing"), 2))


def test_list_calls_with_context(client, key):
    from aerospike_helpers import cdt_ctx
    client.put(key, {"n": [[1, 2], [7, 8, 9]]})
    ctx = [cdt_ctx.cdt_ctx_list_index(1)]
    assert read_exp(client, key, exp.ListSize(ctx, "n")) == 3
    assert read_exp(client, key, exp.ListGetByIndex(
        ctx, aerospike.LIST_RETURN_VALUE, exp.ResultType.INTEGER, 0, "n")) == 7


def test_map_calls(client, key):
    client.put(key, {"m": {"a": 1, "b": 2, "c": 3}})
    assert read_exp(client, key, exp.MapSize(None, "m")) == 3
    assert read_exp(client, key, exp.MapGetByKey(
        None, aerospike.MAP_RETURN_VALUE, exp.ResultType.INTEGER, "b", "m")) == 2
    assert passes(client, key, exp.Eq(exp.MapGetByKey(
        None, aerospike.MAP_RETURN_VALUE, exp.ResultType.INTEGER, "c", "m"), 3))
    put = exp.MapPut(None, None, "d", 4, "m")
    assert read_exp(client, key, exp.MapSize(None, put)) == 4
    assert client.get(key)[2]["m"] == {"a": 1, "b": 2, "c": 3}


def test_in_list_and_map_keys_values(client, key):
    client.put(key, {"a": 2, "l": [1, 2, "x"], "m": {"k1": 1, "k2": 2}})
    assert passes(client, key, exp.InList(exp.IntBin("a"), "l"))
    assert not passes(client, key, exp.InList(5, "l"))
    assert passes(client, key, exp.InList("x", exp.ListBin("l")))
    assert sorted(read_exp(client, key, exp.MapGetKeys("m"))) == ["k1", "k2"]
    assert sorted(read_exp(client, key, exp.MapGetValues("m"))) == [1, 2]


def test_list_literals(client, key):
    client.put(key, {"l": [1, 2, 3]})
    assert passes(client, key, exp.Eq(exp.ListBin("l"), [1, 2, 3]))
    assert passes(client, key, exp.GT(exp.ListBin("l"), [1, 2]))
    assert passes(client, key, exp.LT(exp.ListBin("l"), [1, 3]))
    client.operate(key, [eo.expression_write("l2", exp.Val([4, "x"]).compile())])
    assert client.get(key)[2]["l2"] == [4, "x"]


def test_bool_results_store_as_booleans(client, key):
    client.put(key, {"a": 5})
    client.operate(key, [eo.expression_write("t", exp.GT(exp.IntBin("a"), 1).compile())])
    assert client.get(key)[2]["t"] is True


def test_geo_comparison_of_a_missing_bin_filters_out(client, key):
    """A geo comparison evaluates (see test_expressions.py for matches); on
    a record without the bin it is unknown, so the filter drops it."""
    client.put(key, {"a": 1})
    region = aerospike.GeoJSON({"type": "Polygon",
                                "coordinates": [[[0, 0], [0, 1], [1, 1], [1, 0], [0, 0]]]})
    with pytest.raises(ex.FilteredOut):
        client.get(key, policy={"expressions": exp.CmpGeo(exp.GeoBin("g"), region).compile()})
    client.put(key, {"g": aerospike.GeoJSON({"type": "Point", "coordinates": [0.5, 0.5]})})
    client.get(key, policy={"expressions": exp.CmpGeo(exp.GeoBin("g"), region).compile()})


def test_bit_calls(client, key):
    """Bit ops inside expressions run the citrine-cdt bits module."""
    client.put(key, {"b": bytearray(b"\x0f\xf0")})
    assert read_exp(client, key, exp.BitCount(0, 16, "b")) == 8
    assert read_exp(client, key, exp.BitGetInt(4, 8, False, "b")) == 0xff
    # A modifying call answers the new blob; the bin is untouched.
    policy = {"bit_write_flags": aerospike.BIT_WRITE_DEFAULT}
    assert read_exp(client, key, exp.BitNot(policy, 0, 16, "b")) == bytearray(b"\xf0\x0f")
    assert client.get(key)[2]["b"] == bytearray(b"\x0f\xf0")


def test_hll_calls(client, key):
    """HLL ops inside expressions run the citrine-cdt HLL module."""
    from aerospike_helpers.operations import hll_operations as ho
    client.operate(key, [ho.hll_add("h", ["a", "b", "c"], 8)])
    assert read_exp(client, key, exp.HLLGetCount("h")) == 3
    assert passes(client, key, exp.Eq(exp.HLLDescribe("h"), [8, 0]))
    assert read_exp(client, key, exp.HLLMayContain(["a"], "h")) == 1
