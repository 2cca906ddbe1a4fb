"""Failures answer with Aerospike's own result codes, surfacing as the client's
exception classes (06-result-codes.md).

Some checks are made twice: once through the official client, and once with a
hand-built request (rawwire) where the client validates locally and would never
send the request (unknown namespace, over-long bin name)."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers.operations import operations as op

import rawwire


def test_not_found_is_code_2(client, key):
    with pytest.raises(ex.RecordNotFound) as ei:
        client.get(key)
    assert ei.value.code == 2


def test_generation_error_is_code_3(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.RecordGenerationError) as ei:
        client.put(key, {"a": 1}, meta={"gen": 9}, policy={"gen": aerospike.POLICY_GEN_EQ})
    assert ei.value.code == 3


def test_record_exists_is_code_5(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.RecordExistsError) as ei:
        client.put(key, {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert ei.value.code == 5


def test_parameter_error_is_code_4(client, key):
    # TTL beyond 10 years is a server-side parameter error (02 §2.5)
    with pytest.raises(ex.InvalidRequest) as ei:
        client.put(key, {"a": 1}, meta={"ttl": 315360001})
    assert ei.value.code == 4


def test_increment_string_bin_is_incompatible_type_12(client, key):
    client.put(key, {"s": "text"})
    with pytest.raises(ex.BinIncompatibleType) as ei:
        client.increment(key, "s", 1)
    assert ei.value.code == 12
    assert client.get(key)[2] == {"s": "text"}


def test_append_to_integer_bin_is_incompatible_type(client, key):
    client.put(key, {"n": 1})
    with pytest.raises(ex.BinIncompatibleType):
        client.append(key, "n", "x")
    with pytest.raises(ex.BinIncompatibleType):
        client.prepend(key, "n", "x")
    assert client.get(key)[2] == {"n": 1}


def test_append_string_to_blob_bin_is_incompatible_type(client, key):
    client.put(key, {"b": bytearray(b"\x01")})
    with pytest.raises(ex.BinIncompatibleType):
        client.append(key, "b", "text")


def test_increment_integer_bin_with_float_is_incompatible_type(client, key):
    client.put(key, {"n": 1})
    with pytest.raises(ex.BinIncompatibleType):
        client.increment(key, "n", 1.5)
    assert client.get(key)[2] == {"n": 1}


def test_increment_float_bin_with_integer_is_incompatible_type(client, key):
    client.put(key, {"f": 1.5})
    with pytest.raises(ex.BinIncompatibleType):
        client.increment(key, "f", 1)
    assert client.get(key)[2] == {"f": 1.5}


def test_increment_list_bin_is_incompatible_type(client, key):
    client.put(key, {"l": [1]})
    with pytest.raises(ex.BinIncompatibleType):
        client.operate(key, [op.increment("l", 1)])


def test_record_too_big_is_code_13(client, key):
    with pytest.raises(ex.RecordTooBig) as ei:
        client.put(key, {"big": bytearray(2 * 1024 * 1024)})
    assert ei.value.code == 13
    _, meta = client.exists(key)
    assert meta is None


def test_record_just_under_one_mib_is_accepted(client, key):
    blob = bytearray(1_000_000)
    client.put(key, {"big": blob})
    assert len(client.get(key)[2]["big"]) == 1_000_000


def test_record_just_over_one_mib_is_too_big(client, key):
    with pytest.raises(ex.RecordTooBig):
        client.put(key, {"big": bytearray(1024 * 1024 + 1)})


def test_record_too_big_on_update_leaves_old_record(client, key):
    client.put(key, {"small": 1})
    with pytest.raises(ex.RecordTooBig):
        client.put(key, {"big": bytearray(2 * 1024 * 1024)})
    _, meta, bins = client.get(key)
    assert bins == {"small": 1} and meta["gen"] == 1


def test_record_too_big_via_append_growth(client, key):
    client.put(key, {"s": "x" * (700 * 1024)})
    with pytest.raises(ex.RecordTooBig):
        client.append(key, "s", "y" * (700 * 1024))
    assert len(client.get(key)[2]["s"]) == 700 * 1024


def test_bin_name_too_long_client_side(client, key):
    # The C client refuses bin names > 15 chars locally, with code 21 (BinNameError).
    with pytest.raises(ex.BinNameError) as ei:
        client.put(key, {"b" * 16: 1})
    assert ei.value.code == 21


def test_bin_name_15_chars_is_fine(client, key):
    client.put(key, {"b" * 15: 1})
    assert client.get(key)[2] == {"b" * 15: 1}


def test_bin_name_too_long_server_side_raw(citrined, set_name):
    # The same request sent raw (the client would not send it): server must answer 21.
    resp = rawwire.command(
        citrined.host, citrined.port, "test", set_name, "k", 0, rawwire.INFO2_WRITE,
        ops=[rawwire.op(rawwire.OP_WRITE, rawwire.PT_INTEGER, "b" * 16, rawwire.int_value(1))])
    assert resp["result_code"] == 21, resp


def test_unknown_namespace_client(client, set_name):
    # The C client knows the namespaces from `replicas` and fails locally with 20.
    with pytest.raises(ex.NamespaceNotFound) as ei:
        client.get(("nosuchns", set_name, "k"))
    assert ei.value.code == 20
    with pytest.raises(ex.NamespaceNotFound):
        client.put(("nosuchns", set_name, "k"), {"a": 1})


def test_unknown_namespace_server_side_raw(citrined, set_name):
    get = rawwire.command(citrined.host, citrined.port, "nosuchns", set_name, "k",
                          rawwire.INFO1_READ | rawwire.INFO1_GET_ALL, 0)
    assert get["result_code"] == 20, get
    put = rawwire.command(
        citrined.host, citrined.port, "nosuchns", set_name, "k", 0, rawwire.INFO2_WRITE,
        ops=[rawwire.op(rawwire.OP_WRITE, rawwire.PT_INTEGER, "a", rawwire.int_value(1))])
    assert put["result_code"] == 20, put


def test_raw_put_get_matches_client_view(citrined, client, set_name):
    """A raw put (02 §6.1 layout) is visible to the official client and vice versa."""
    put = rawwire.command(
        citrined.host, citrined.port, "test", set_name, "rawkey", 0, rawwire.INFO2_WRITE,
        ops=[rawwire.op(rawwire.OP_WRITE, rawwire.PT_INTEGER, "a", rawwire.int_value(1))])
    assert put["result_code"] == 0, put
    assert put["generation"] == 1
    assert client.get(("test", set_name, "rawkey"))[2] == {"a": 1}
    got = rawwire.command(citrined.host, citrined.port, "test", set_name, "rawkey",
                          rawwire.INFO1_READ | rawwire.INFO1_GET_ALL, 0)
    assert got["result_code"] == 0
    assert got["void_time"] == 0  # never expires (default-ttl 0)
    assert got["ops"] == [(rawwire.OP_READ, rawwire.PT_INTEGER, "a", rawwire.int_value(1))]


def test_errors_do_not_break_the_connection(client, key):
    """After a run of server errors the same client keeps working."""
    for _ in range(20):
        with pytest.raises(ex.RecordNotFound):
            client.get(key)
        with pytest.raises(ex.RecordTooBig):
            client.put(key, {"big": bytearray(1100 * 1024)})
    client.put(key, {"ok": 1})
    assert client.get(key)[2] == {"ok": 1}


# --- robustness: bad peers must not hurt the server --------------------------------

def _drain(sock):
    try:
        sock.settimeout(2.0)
        while sock.recv(65536):
            pass
    except OSError:
        pass


def test_truncated_frame_then_disconnect(citrined, client, key):
    import socket
    import struct

    with socket.create_connection((citrined.host, citrined.port), timeout=3) as s:
        s.sendall(struct.pack(">Q", (2 << 56) | (3 << 48) | 100) + b"\x16" * 10)
    client.put(key, {"a": 1})
    assert client.get(key)[2] == {"a": 1}


def test_unknown_message_type_does_not_kill_server(citrined, client, key):
    import socket
    import struct

    with socket.create_connection((citrined.host, citrined.port), timeout=3) as s:
        s.sendall(struct.pack(">Q", (2 << 56) | (99 << 48) | 4) + b"abcd")
        _drain(s)
    client.put(key, {"a": 1})
    assert client.get(key)[2] == {"a": 1}


def test_malformed_as_msg_answers_parameter_error_or_closes(citrined, client, key):
    import socket
    import struct

    # header says 3 fields and 5 ops, but the body ends after the header
    body = rawwire.as_msg(rawwire.INFO1_READ | rawwire.INFO1_GET_ALL, 0, 0, [], [])
    body = body[:18] + struct.pack(">HH", 3, 5)
    with socket.create_connection((citrined.host, citrined.port), timeout=3) as s:
        s.sendall(struct.pack(">Q", (2 << 56) | (3 << 48) | len(body)) + body)
        s.settimeout(3)
        try:
            hdr = s.recv(8)
        except OSError:
            hdr = b""
        if len(hdr) == 8:
            (h,) = struct.unpack(">Q", hdr)
            resp = rawwire._recv_exact(s, h & 0xFFFFFFFFFFFF)
            assert resp[5] == 4, resp[:22]  # PARAMETER
    client.put(key, {"a": 1})
    assert client.get(key)[2] == {"a": 1}


def test_huge_declared_frame_is_refused(citrined, client, key):
    """A frame header announcing a 1 TiB body must not make the server allocate it."""
    import socket
    import struct

    with socket.create_connection((citrined.host, citrined.port), timeout=3) as s:
        s.sendall(struct.pack(">Q", (2 << 56) | (3 << 48) | (1 << 40)) + b"\x16" * 64)
        _drain(s)
    assert citrined.alive()
    client.put(key, {"a": 1})
    assert client.get(key)[2] == {"a": 1}


def test_an_empty_bin_name_is_a_bin(client, key):
    # The reference stores a bin named "" (the official C client's suite
    # writes and reads one); only names over 15 bytes are refused.
    client.put(key, {"": 19, "a": 1})
    assert client.get(key)[2] == {"": 19, "a": 1}


def test_geojson_that_is_no_supported_shape_is_code_160(client, key):
    # Shapes the server indexes and queries are taken (a Feature is its
    # geometry); anything else answers 160, as the reference.
    for good in ({"type": "Point", "coordinates": [0.0, 0.0]},
                 {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1.0, 2.0]}}):
        client.put(key, {"g": aerospike.GeoJSON(good)})
    for bad in ({"type": "point", "coordinates": [0.0, 0.0]},
                {"type": "LineString", "coordinates": [[100.0, 0.0], [101.0, 1.0]]},
                {"type": "MultiPoint", "coordinates": [[0.0, 0.0], [0.0, 0.0]]}):
        with pytest.raises(ex.AerospikeError) as ei:
            client.put(key, {"g": aerospike.GeoJSON(bad)})
        assert ei.value.code == 160, bad
    assert client.get(key)[2]["g"].dumps() == aerospike.GeoJSON(
        {"type": "Feature", "geometry": {"type": "Point", "coordinates": [1.0, 2.0]}}).dumps()


def test_a_key_ordered_map_bin_out_of_order_is_code_4(citrined, client, set_name):
    # Raw msgpack: map of 3, the key-ordered ext header, then keys 3, 2
    # (out of order): refused, as the reference refuses it. In order, it
    # is stored (and read back as a map).
    PT_MAP = 19
    def raw_map(keys):
        body = bytes([0x83, 0xc7, 0x00, 0x01, 0xc0])
        for k in keys:
            body += bytes([k, k])
        return body
    put = lambda keys: rawwire.command(
        citrined.host, citrined.port, "test", set_name, "om", 0, rawwire.INFO2_WRITE,
        ops=[rawwire.op(rawwire.OP_WRITE, PT_MAP, "m", raw_map(keys))])
    assert put([3, 2])["result_code"] == 4
    assert put([2, 3])["result_code"] == 0
    assert client.get(("test", set_name, "om"))[2] == {"m": {2: 2, 3: 3}}
