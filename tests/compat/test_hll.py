"""HyperLogLog operations through the official client (05-cdt-exp.md §3): the
counts, unions, intersections and similarities the reference server answers
(several exact values below are the ones the Python client's own test suite
expects from it), the write flags and the result codes of refused ops."""

import math

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers import HyperLogLog
from aerospike_helpers.operations import hll_operations as hll

pytestmark = pytest.mark.cdt


def keys(start, stop):
    return ["key%d" % i for i in range(start, stop)]


def results(client, key, ops):
    """Runs ops in order; returns each op's result."""
    _, _, out = client.operate_ordered(key, ops)
    return [value for _, value in out]


def one(client, key, op):
    return results(client, key, [op])[0]


def flags(value):
    return {"flags": value}


@pytest.fixture
def hkey(client, key):
    """A record with the bins the reference client's HLL tests build for
    their record 4: hll_bin = key0..key4 (8 index bits), mh_bin the same with
    12 minhash bits (6 index bits), hll_binl = 100 keys, hll_binu =
    key6..key10 (10 bits), hll_bine empty (10 bits)."""
    client.put(key, {"label": 4})
    client.operate(key, [
        hll.hll_init("hll_bine", 10),
        hll.hll_add("hll_bin", keys(0, 5), 8),
        hll.hll_add("mh_bin", keys(0, 5), 6, 12),
        hll.hll_add("hll_binl", keys(0, 100), 8),
        hll.hll_add("hll_binu", keys(6, 11), 10),
    ])
    return key


def test_add_returns_changed_registers_and_count_estimates(client, key):
    client.put(key, {"a": 1})
    assert one(client, key, hll.hll_add("h", ["a", "b", "c"], 8)) == 3
    # Adding the same values again changes no register.
    assert one(client, key, hll.hll_add("h", ["a", "b", "c"])) == 0
    assert one(client, key, hll.hll_get_count("h")) == 3
    record = client.get(key)[2]
    assert isinstance(record["h"], HyperLogLog)
    # 11 header bytes and 256 registers of 6 bits.
    assert len(record["h"]) == 11 + 256 * 6 // 8


def test_count_of_ten_thousand_values(client, key):
    client.put(key, {"a": 1})
    values = ["value-%d" % i for i in range(10000)]
    for start in range(0, 10000, 2000):
        client.operate(key, [hll.hll_add("h", values[start:start + 2000], 14)])
    count = one(client, key, hll.hll_get_count("h"))
    assert abs(count - 10000) <= 200, count
    assert one(client, key, hll.hll_describe("h")) == [14, 0]


def test_refresh_count_matches_the_reference(client, hkey):
    # The reference answers exactly 97 for these 100 keys at 8 bits.
    assert one(client, hkey, hll.hll_refresh_count("hll_binl")) == 97
    assert one(client, hkey, hll.hll_get_count("hll_binl")) == 97
    with pytest.raises(ex.BinNotFound):
        client.operate(hkey, [hll.hll_refresh_count("no_such_bin")])


def test_describe_and_reads_of_missing_bins(client, hkey):
    assert one(client, hkey, hll.hll_describe("mh_bin")) == [6, 12]
    assert one(client, hkey, hll.hll_describe("hll_bine")) == [10, 0]
    assert one(client, hkey, hll.hll_describe("nope")) is None
    assert one(client, hkey, hll.hll_get_count("nope")) is None


def test_union_count_and_get_union(client, hkey):
    binu = client.get(hkey)[2]["hll_binu"]
    assert one(client, hkey, hll.hll_get_union_count("hll_bin", [binu])) == 10
    union = one(client, hkey, hll.hll_get_union("hll_bin", [binu]))
    assert isinstance(union, HyperLogLog)
    # The union takes the fewer index bits.
    assert union[1] == 8 and union[2] == 0
    assert results(client, hkey, [
        hll.hll_get_intersect_count("hll_bin", [union]),
        hll.hll_get_intersect_count("hll_binu", [union]),
    ]) == [5, 5]
    with pytest.raises(ex.InvalidRequest):
        client.operate(hkey, [hll.hll_get_union("hll_bin", [])])


def test_set_union_and_allow_fold(client, hkey):
    record = client.get(hkey)[2]
    binu, binl = record["hll_binu"], record["hll_binl"]
    client.operate(hkey, [hll.hll_set_union("hll_bin", [binu])])
    assert results(client, hkey, [
        hll.hll_get_intersect_count("hll_bin", [client.get(hkey)[2]["hll_bin"]]),
        hll.hll_get_intersect_count("hll_binu", [client.get(hkey)[2]["hll_bin"]]),
    ]) == [10, 5]
    # A 10-bit bin with 8-bit sketches: refused unless folding is allowed.
    with pytest.raises(ex.OpNotApplicable):
        client.operate(hkey, [hll.hll_set_union("hll_bine", [binl])])
    client.operate(hkey, [hll.hll_set_union("hll_bine", [binu],
                                            flags(aerospike.HLL_WRITE_ALLOW_FOLD))])
    assert one(client, hkey, hll.hll_get_intersect_count("hll_bine", [binl])) == 5
    client.operate(hkey, [hll.hll_set_union("hll_bine", [binl],
                                            flags(aerospike.HLL_WRITE_ALLOW_FOLD))])
    assert one(client, hkey, hll.hll_describe("hll_bine")) == [8, 0]
    # Creating a bin from sketches, and the create/update flags.
    client.operate(hkey, [hll.hll_set_union("fresh", [binu, binl])])
    assert one(client, hkey, hll.hll_describe("fresh")) == [8, 0]
    with pytest.raises(ex.BinExistsError):
        client.operate(hkey, [hll.hll_set_union(
            "hll_binl", [binl], flags(aerospike.HLL_WRITE_CREATE_ONLY))])
    with pytest.raises(ex.BinNotFound):
        client.operate(hkey, [hll.hll_set_union(
            "nope", [binl], flags(aerospike.HLL_WRITE_UPDATE_ONLY))])


def test_intersect_count_and_similarity_with_minhash(client, make_key):
    # Five records whose mh_bin holds key0..key{x}: the reference answers 1
    # for the intersection of the last with the first four.
    made = []
    for x in range(5):
        k = make_key("mh-%d" % x)
        client.put(k, {"label": x})
        client.operate(k, [hll.hll_add("mh_bin", keys(0, x + 1), 6, 12)])
        made.append(k)
    firsts = [client.get(k)[2]["mh_bin"] for k in made[:4]]
    assert one(client, made[4], hll.hll_get_intersect_count("mh_bin", firsts)) == 1
    # Four plain sketches in all: refused (minhash bits needed).
    plain = make_key("plain")
    client.put(plain, {"a": 1})
    client.operate(plain, [hll.hll_add("h", keys(0, 10), 8)])
    sketch = client.get(plain)[2]["h"]
    with pytest.raises(ex.InvalidRequest):
        client.operate(plain, [hll.hll_get_intersect_count("h", [sketch] * 3)])
    with pytest.raises(ex.InvalidRequest):
        client.operate(plain, [hll.hll_get_similarity("h", [sketch] * 3)])
    # Three minhash sketches against a plain bin: not applicable.
    with pytest.raises(ex.OpNotApplicable):
        client.operate(plain, [hll.hll_get_intersect_count("h", firsts[:3])])


def test_similarity_of_overlapping_sets(client, key):
    client.put(key, {"x": 1})
    client.operate(key, [
        hll.hll_add("a", list(range(0, 6000)), 12, 16),
        hll.hll_add("b", list(range(4000, 10000)), 12, 16),
    ])
    b = client.get(key)[2]["b"]
    similarity, intersect, union = results(client, key, [
        hll.hll_get_similarity("a", [b]),
        hll.hll_get_intersect_count("a", [b]),
        hll.hll_get_union_count("a", [b]),
    ])
    assert isinstance(similarity, float)
    assert abs(similarity - 0.2) < 0.04, similarity
    assert abs(intersect - 2000) < 400, intersect
    assert abs(union - 10000) < 300, union
    assert one(client, key, hll.hll_get_similarity("b", [b])) == pytest.approx(1.0, abs=0.01)


def test_fold(client, hkey):
    assert results(client, hkey, [hll.hll_fold("hll_binl", 6),
                                  hll.hll_describe("hll_binl")]) == [None, [6, 0]]
    assert one(client, hkey, hll.hll_get_count("hll_binl")) > 50
    with pytest.raises(ex.InvalidRequest):
        client.operate(hkey, [hll.hll_fold("hll_bin", 2)])
    with pytest.raises(ex.OpNotApplicable):
        client.operate(hkey, [hll.hll_fold("mh_bin", 4)])
    with pytest.raises(ex.OpNotApplicable):
        client.operate(hkey, [hll.hll_fold("hll_bin", 12)])


@pytest.mark.parametrize("index_bits, mh_bits", [(4, 4), (4, 51), (9, 51), (16, 48), (6, 8)])
def test_init_valid_bit_counts(client, key, index_bits, mh_bits):
    client.put(key, {"a": 1})
    client.operate(key, [hll.hll_init("h", index_bits, mh_bits)])
    assert one(client, key, hll.hll_describe("h")) == [index_bits, mh_bits]
    size = 11 + math.ceil((6 + mh_bits) * 2 ** index_bits / 8)
    assert len(client.get(key)[2]["h"]) == size


@pytest.mark.parametrize("index_bits, mh_bits",
                         [(0, 0), (3, 0), (17, 0), (20, 8), (4, 52), (4, 59), (17, 48), (14, 51)])
def test_init_invalid_bit_counts(client, key, index_bits, mh_bits):
    client.put(key, {"a": 1})
    with pytest.raises(ex.InvalidRequest):
        client.operate(key, [hll.hll_init("h", index_bits, mh_bits)])


def test_write_flags(client, hkey):
    with pytest.raises(ex.BinExistsError):
        client.operate(hkey, [hll.hll_init("hll_bin", 6, policy=flags(aerospike.HLL_WRITE_CREATE_ONLY))])
    with pytest.raises(ex.BinNotFound):
        client.operate(hkey, [hll.hll_init("nope", 6, policy=flags(aerospike.HLL_WRITE_UPDATE_ONLY))])
    # NO_FAIL: the refused write is skipped, the others apply.
    client.operate(hkey, [
        hll.hll_init("hll_bin", 6, policy=flags(aerospike.HLL_WRITE_CREATE_ONLY | aerospike.HLL_WRITE_NO_FAIL)),
        hll.hll_init("nope", 6, policy=flags(aerospike.HLL_WRITE_UPDATE_ONLY | aerospike.HLL_WRITE_NO_FAIL)),
    ])
    record = client.get(hkey)[2]
    assert "nope" not in record
    assert one(client, hkey, hll.hll_describe("hll_bin")) == [8, 0]
    # ADD takes no UPDATE_ONLY; creating needs the index bits.
    with pytest.raises(ex.InvalidRequest):
        client.operate(hkey, [hll.hll_add("new", ["x"], 8, policy=flags(aerospike.HLL_WRITE_UPDATE_ONLY))])
    with pytest.raises(ex.OpNotApplicable):
        client.operate(hkey, [hll.hll_add("new", ["x"], policy=flags(aerospike.HLL_WRITE_CREATE_ONLY))])
    assert one(client, hkey, hll.hll_add("new", ["x", "y"], 8,
                                         policy=flags(aerospike.HLL_WRITE_CREATE_ONLY))) == 2
    with pytest.raises(ex.BinExistsError):
        client.operate(hkey, [hll.hll_add("new", ["z"], 8, policy=flags(aerospike.HLL_WRITE_CREATE_ONLY))])


def test_wrong_bin_type(client, key):
    client.put(key, {"s": "text", "i": 5})
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [hll.hll_add("s", ["x"], 8)])
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [hll.hll_get_count("i")])


def test_a_written_back_sketch_still_works(client, hkey):
    record = client.get(hkey)[2]
    assert isinstance(record["mh_bin"], HyperLogLog)
    client.put(hkey, {"copy": record["mh_bin"]})
    assert one(client, hkey, hll.hll_describe("copy")) == [6, 12]
    assert one(client, hkey, hll.hll_get_count("copy")) == one(client, hkey, hll.hll_get_count("mh_bin"))
    assert one(client, hkey, hll.hll_add("copy", keys(0, 5))) == 0
