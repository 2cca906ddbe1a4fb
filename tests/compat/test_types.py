"""Particle types are stored intact and read back equal (02 §4.3)."""

import json

import aerospike
import pytest
from aerospike_helpers import HyperLogLog


@pytest.mark.parametrize(
    "value",
    [
        0, 1, -1, 2**63 - 1, -(2**63), 255, 65536,
        0.0, -0.0, 3.141592653589793, -1e300, float("inf"),
        "", "ascii", "héllo wörld ✓ 日本語", "x" * 1000,
        bytearray(b""), bytearray(b"\x00\x01\xff"), bytearray(range(256)),
        [], [1, "a", 2.5, [1, [2, [3]]], {"k": "v"}, None, bytearray(b"\x00")],
        {}, {"a": 1, 2: "b", "nested": {"x": [1, 2, {"y": None}]}, "f": 1.5},
    ],
    ids=lambda v: type(v).__name__ + ":" + repr(v)[:24],
)
def test_value_round_trip(client, key, value):
    client.put(key, {"v": value})
    _, _, bins = client.get(key)
    got = bins["v"]
    assert got == value
    if isinstance(value, (bytes, bytearray)):
        # blobs come back as `bytes` from this client version whatever was sent
        assert isinstance(got, (bytes, bytearray))
    else:
        assert type(got) is type(value)


def test_nan_round_trip(client, key):
    client.put(key, {"v": float("nan")})
    got = client.get(key)[2]["v"]
    assert isinstance(got, float) and got != got


def test_python_bytes_round_trip_as_blob(client, key):
    client.put(key, {"v": b"raw\x00bytes"})
    got = client.get(key)[2]["v"]
    assert bytes(got) == b"raw\x00bytes"


def test_many_bins_of_mixed_types_in_one_record(client, key):
    bins = {
        "int": 7, "float": 2.5, "str": "s", "blob": bytearray(b"\x01"),
        "list": [1, 2, 3], "map": {"a": [1]},
    }
    client.put(key, bins)
    assert client.get(key)[2] == bins


def test_geojson_round_trip(client, key):
    point = {"type": "Point", "coordinates": [-122.0, 37.5]}
    poly = {"type": "Polygon",
            "coordinates": [[[-122.5, 37.0], [-121.0, 37.0], [-121.0, 38.08],
                             [-122.5, 38.08], [-122.5, 37.0]]]}
    client.put(key, {"pt": aerospike.GeoJSON(point), "poly": aerospike.GeoJSON(poly)})
    _, _, bins = client.get(key)
    assert isinstance(bins["pt"], aerospike.GeoJSON)
    assert isinstance(bins["poly"], aerospike.GeoJSON)
    assert json.loads(bins["pt"].dumps()) == point
    assert json.loads(bins["poly"].dumps()) == poly


def test_modifying_a_geojson_bin_is_a_server_error(client, key):
    """Increment, append or prepend of a GeoJSON bin: 1, as the reference
    (other mismatched types are 12)."""
    from aerospike import exception as ex

    point = {"type": "Point", "coordinates": [1.0, 2.0]}
    client.put(key, {"g": aerospike.GeoJSON(point)})
    for call in (lambda: client.increment(key, "g", 1),
                 lambda: client.append(key, "g", "x"),
                 lambda: client.prepend(key, "g", "x")):
        with pytest.raises(ex.ServerError) as caught:
            call()
        assert caught.value.code == 1
    assert client.get(key)[1]["gen"] == 1


def test_bool_with_send_bool_as_as_bool_round_trips(client_factory, key):
    c = client_factory(send_bool_as=aerospike.AS_BOOL)
    c.put(key, {"t": True, "f": False, "l": [True, False]})
    _, _, bins = c.get(key)
    assert bins["t"] is True
    assert bins["f"] is False
    assert bins["l"] == [True, False]


def test_bool_with_send_bool_as_integer_reads_back_int(client_factory, key):
    c = client_factory(send_bool_as=aerospike.INTEGER)
    c.put(key, {"t": True, "f": False})
    _, _, bins = c.get(key)
    assert bins == {"t": 1, "f": 0}
    assert type(bins["t"]) is int


def test_bool_with_default_client_config(client, key):
    """Default config: booleans are sent as the BOOL particle (17) and read back as bool."""
    client.put(key, {"t": True, "f": False})
    _, _, bins = client.get(key)
    assert bins["t"] is True
    assert bins["f"] is False


def _valid_hll(index_bits=8, minhash_bits=0, fill=0):
    # server layout: flags(1)=0, n_index_bits(1), n_minhash_bits(1), cache(8), registers
    n_reg_bytes = ((1 << index_bits) * (6 + minhash_bits) + 7) // 8
    regs = bytes((i * 37 + fill) & 0xFF for i in range(n_reg_bytes))
    return bytes([0, index_bits, minhash_bits]) + b"\x00" * 8 + regs


def test_hll_value_round_trip(client, key):
    raw = _valid_hll()
    client.put(key, {"h": HyperLogLog(raw)})
    _, _, bins = client.get(key)
    got = bins["h"]
    assert isinstance(got, HyperLogLog), type(got)
    assert bytes(got) == raw


def test_blob_vs_string_types_are_distinct(client, key):
    client.put(key, {"s": "abc", "b": bytearray(b"abc")})
    _, _, bins = client.get(key)
    assert type(bins["s"]) is str
    assert isinstance(bins["b"], (bytes, bytearray)) and bytes(bins["b"]) == b"abc"


MSGPACK_INT_BOUNDARIES = [
    0, 1, -1, -32, -33, 127, 128, 255, 256, -128, -129, 32767, 32768, 65535, 65536,
    -32768, -32769, 2**31 - 1, 2**31, 2**32 - 1, 2**32, -(2**31), -(2**31) - 1,
    2**63 - 1, -(2**63),
]


def test_list_of_msgpack_integer_boundaries(client, key):
    client.put(key, {"l": MSGPACK_INT_BOUNDARIES})
    assert client.get(key)[2]["l"] == MSGPACK_INT_BOUNDARIES


def test_list_of_float_edge_values(client, key):
    vals = [0.5, 1.0e-310, 3.4028234663852886e38, 1e39, -0.0, float("inf"), float("-inf")]
    client.put(key, {"l": vals})
    got = client.get(key)[2]["l"]
    assert got == vals
    assert all(type(g) is float for g in got)


def test_key_ordered_map_keeps_its_type(client, key):
    kom = aerospike.KeyOrderedDict({"b": 1, "a": 2, "c": {"z": 1, "y": 2}})
    client.put(key, {"m": kom, "l": [aerospike.KeyOrderedDict({"y": 1, "x": 2})]})
    _, _, bins = client.get(key)
    assert bins["m"] == kom
    assert isinstance(bins["m"], aerospike.KeyOrderedDict)
    assert isinstance(bins["l"][0], aerospike.KeyOrderedDict)


def test_map_with_blob_keys_and_deep_nesting(client, key):
    value = {b"bk": 1, 1: {2: {3: [4, {5: [6, [7, [8]]]}]}}, "s" * 40: "v" * 300}
    client.put(key, {"m": value})
    assert client.get(key)[2]["m"] == value


def test_string_with_nul_bytes_raw(citrined, set_name):
    """The Python client truncates str at NUL, so check byte-exact strings raw."""
    import rawwire

    s = b"a\x00b\xc3\xa9\x00"
    put = rawwire.command(citrined.host, citrined.port, "test", set_name, "nul", 0,
                          rawwire.INFO2_WRITE,
                          ops=[rawwire.op(rawwire.OP_WRITE, rawwire.PT_STRING, "s", s)])
    assert put["result_code"] == 0, put
    got = rawwire.command(citrined.host, citrined.port, "test", set_name, "nul",
                          rawwire.INFO1_READ | rawwire.INFO1_GET_ALL, 0)
    assert got["ops"] == [(rawwire.OP_READ, rawwire.PT_STRING, "s", s)], got
