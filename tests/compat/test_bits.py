"""Bitwise operations on blob bins through the official client (05-cdt-exp.md §3):
the bytes stored afterwards, the values reads answer, and the result codes of
refused operations. Expected values follow the reference server (several are the
official Java client's TestOperateBit vectors)."""

import aerospike
import pytest
from aerospike import exception as ex
from aerospike_helpers.operations import bitwise_operations as bo

pytestmark = pytest.mark.filterwarnings("ignore:value_byte_size is deprecated:DeprecationWarning")

BIN = "b"
NO_FAIL = {"bit_write_flags": aerospike.BIT_WRITE_NO_FAIL}
PARTIAL = {"bit_write_flags": aerospike.BIT_WRITE_PARTIAL}
CREATE_ONLY = {"bit_write_flags": aerospike.BIT_WRITE_CREATE_ONLY}
UPDATE_ONLY = {"bit_write_flags": aerospike.BIT_WRITE_UPDATE_ONLY}


def results(client, key, ops):
    """Runs ops in order; returns each op's result."""
    _, _, out = client.operate_ordered(key, ops)
    return [value for _, value in out]


def stored(client, key, name=BIN):
    return bytes(client.get(key)[2][name])


def put(client, key, data):
    client.put(key, {BIN: bytearray(data)})


def error_code(client, key, ops):
    with pytest.raises(ex.AerospikeError) as error:
        client.operate(key, ops)
    return error.value.code


def test_set_across_byte_boundaries(client, key):
    put(client, key, [0x01, 0x12, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A,
                      0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x41])
    bit0 = bytearray([0x80])
    bits1 = bytearray([0x11, 0x22, 0x33])
    client.operate(key, [
        bo.bit_set(BIN, 1, 1, 1, bit0),
        bo.bit_set(BIN, 15, 1, 1, bit0),
        bo.bit_set(BIN, 16, 24, 3, bits1),
        bo.bit_set(BIN, 40, 22, 3, bits1),
        bo.bit_set(BIN, 73, 21, 3, bits1),
        bo.bit_set(BIN, 100, 20, 3, bits1),
        bo.bit_set(BIN, 120, 17, 3, bits1),
        bo.bit_set(BIN, 144, 1, 1, bit0),
    ])
    assert stored(client, key) == bytes([0x41, 0x13, 0x11, 0x22, 0x33, 0x11, 0x22, 0x33, 0x08,
                                         0x08, 0x91, 0x1B, 0x01, 0x12, 0x23, 0x11, 0x22, 0x11,
                                         0xC1])


@pytest.mark.parametrize("make, expected", [
    (bo.bit_or, [0x90, 0x48, 0x01, 0x20, 0x11, 0x11, 0x22, 0x33]),
    (bo.bit_xor, [0x90, 0x48, 0x01, 0x20, 0x11, 0x10, 0x20, 0x30]),
    (bo.bit_and, [0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03]),
])
def test_or_xor_and(client, key, make, expected):
    put(client, key, [0x80, 0x40, 0x01, 0x00, 0x00, 0x01, 0x02, 0x03])
    bits1 = bytearray([0x11, 0x22, 0x33])
    client.operate(key, [make(BIN, o, s, 3, bits1)
                         for o, s in [(0, 5), (9, 7), (23, 6), (32, 8), (40, 24)]])
    assert stored(client, key) == bytes(expected)


def test_not(client, key):
    put(client, key, [0x80, 0x40, 0x01, 0x00, 0x00, 0x01, 0x02, 0x03])
    client.operate(key, [bo.bit_not(BIN, o, s)
                         for o, s in [(0, 5), (9, 7), (23, 6), (32, 8), (40, 24)]])
    assert stored(client, key) == bytes([0x78, 0x3F, 0x00, 0xF8, 0xFF, 0xFE, 0xFD, 0xFC])


def test_lshift_and_rshift(client, key):
    put(client, key, [0x01, 0x01, 0x00, 0x80, 0xFF, 0x01, 0x01, 0x18, 0x01])
    client.operate(key, [bo.bit_lshift(BIN, o, s, n) for o, s, n in
                         [(0, 8, 1), (9, 7, 6), (23, 2, 1), (37, 18, 3), (58, 2, 1), (64, 4, 7)]])
    assert stored(client, key) == bytes([0x02, 0x40, 0x01, 0x00, 0xF8, 0x08, 0x01, 0x28, 0x01])

    put(client, key, [0x80, 0x40, 0x01, 0x00, 0xFF, 0x01, 0x01, 0x18, 0x80])
    client.operate(key, [bo.bit_rshift(BIN, o, s, n) for o, s, n in
                         [(0, 8, 1), (9, 7, 6), (23, 2, 1), (37, 18, 3), (60, 2, 1), (68, 4, 7)]])
    assert stored(client, key) == bytes([0x40, 0x01, 0x00, 0x80, 0xF8, 0xE0, 0x21, 0x14, 0x80])


def test_add_and_subtract_wrap_and_saturate(client, key):
    wrap, sat = aerospike.BIT_OVERFLOW_WRAP, aerospike.BIT_OVERFLOW_SATURATE
    put(client, key, [0] * 6)
    client.operate(key, [
        bo.bit_add(BIN, 0, 8, 0xFF, False, wrap),
        bo.bit_add(BIN, 0, 8, 0xFF, False, wrap),
        bo.bit_add(BIN, 8, 8, 0x7F, True, wrap),
        bo.bit_add(BIN, 8, 8, 0x7F, True, wrap),
        bo.bit_add(BIN, 16, 8, 0x80, True, wrap),
        bo.bit_add(BIN, 16, 8, 0xFF, True, wrap),
        bo.bit_add(BIN, 24, 8, 0x80, False, sat),
        bo.bit_add(BIN, 24, 8, 0x80, False, sat),
        bo.bit_add(BIN, 32, 8, 0x77, True, sat),
        bo.bit_add(BIN, 32, 8, 0x77, True, sat),
        bo.bit_add(BIN, 40, 8, 0x8F, True, sat),
        bo.bit_add(BIN, 40, 8, 0x8F, True, sat),
    ])
    assert stored(client, key) == bytes([0xFE, 0xFE, 0x7F, 0xFF, 0x7F, 0x80])

    put(client, key, [0] * 6)
    client.operate(key, [
        bo.bit_subtract(BIN, 0, 8, 0x01, False, wrap),
        bo.bit_subtract(BIN, 8, 8, 0x80, True, wrap),
        bo.bit_subtract(BIN, 8, 8, 0x8A, True, wrap),
        bo.bit_subtract(BIN, 16, 8, 0x7F, True, wrap),
        bo.bit_subtract(BIN, 16, 8, 0x02, True, wrap),
        bo.bit_subtract(BIN, 24, 8, 0xAA, False, sat),
        bo.bit_subtract(BIN, 32, 8, 0x77, True, sat),
        bo.bit_subtract(BIN, 32, 8, 0x77, True, sat),
        bo.bit_subtract(BIN, 40, 8, 0x81, True, sat),
        bo.bit_subtract(BIN, 40, 8, 0x8F, True, sat),
    ])
    assert stored(client, key) == bytes([0xFF, 0xF6, 0x7F, 0x00, 0x80, 0x7F])


def test_unaligned_add_subtract_and_set_int(client, key):
    fail = aerospike.BIT_OVERFLOW_FAIL
    put(client, key, [0x38, 0x1F, 0x00, 0xE8, 0x7F])
    client.operate(key, [
        bo.bit_add(BIN, 0, 5, 1, False, fail),
        bo.bit_add(BIN, 9, 7, 1, False, fail),
        bo.bit_add(BIN, 23, 6, 0x21, False, fail),
        bo.bit_add(BIN, 32, 8, 1, False, fail),
    ])
    assert stored(client, key) == bytes([0x40, 0x20, 0x01, 0xF0, 0x80])
    client.operate(key, [
        bo.bit_subtract(BIN, 0, 5, 1, False, fail),
        bo.bit_set_int(BIN, 9, 7, 1),
        bo.bit_set_int(BIN, 36, 4, -1),
    ])
    assert stored(client, key) == bytes([0x38, 0x01, 0x01, 0xF0, 0x8F])


def test_overflow_fails_whole_operate_or_is_skipped(client, key):
    fail = aerospike.BIT_OVERFLOW_FAIL
    put(client, key, [0] * 2)
    assert error_code(client, key, [
        bo.bit_add(BIN, 0, 8, 0xFF, False, fail),
        bo.bit_add(BIN, 0, 8, 0xFF, False, fail),
    ]) == 26  # OP_NOT_APPLICABLE
    assert error_code(client, key, [bo.bit_subtract(BIN, 8, 8, 1, False, fail)]) == 26
    assert error_code(client, key, [
        bo.bit_add(BIN, 0, 8, 0x7F, True, fail),
        bo.bit_add(BIN, 0, 8, 0x02, True, fail),
    ]) == 26
    assert stored(client, key) == bytes([0, 0])  # nothing applied
    client.operate(key, [
        bo.bit_add(BIN, 0, 8, 0xFF, False, fail),
        bo.bit_add(BIN, 0, 8, 0xFF, False, fail, NO_FAIL),
        bo.bit_add(BIN, 8, 8, 1, False, fail),
    ])
    assert stored(client, key) == bytes([0xFF, 0x01])


def test_get_count_and_get_int(client, key):
    put(client, key, [0xC1, 0xAA, 0xAA])
    assert results(client, key, [
        bo.bit_get(BIN, 0, 1),
        bo.bit_get(BIN, 7, 1),
        bo.bit_get(BIN, 0, 8),
        bo.bit_get(BIN, 8, 16),
        bo.bit_get(BIN, 9, 15),
        bo.bit_get(BIN, 9, 14),
        bo.bit_get(BIN, -4, 4),
        bo.bit_count(BIN, 0, 8),
        bo.bit_count(BIN, 9, 15),
        bo.bit_count(BIN, 9, 14),
    ]) == [b"\x80", b"\x80", b"\xC1", b"\xAA\xAA", b"\x55\x54", b"\x55\x54", b"\xA0", 3, 7, 7]

    put(client, key, [0x0F, 0x0F, 0x00])
    assert results(client, key, [
        bo.bit_get_int(BIN, 4, 4, False),
        bo.bit_get_int(BIN, 4, 4, True),
        bo.bit_get_int(BIN, 7, 4, True),
        bo.bit_get_int(BIN, 8, 16, False),
        bo.bit_get_int(BIN, 5, 17, False),
        bo.bit_get_int(BIN, 5, 17, True),
        bo.bit_get_int(BIN, -12, 4, True),
    ]) == [15, -1, -8, 3840, 115648, -15424, -1]


def test_lscan_and_rscan(client, key):
    put(client, key, [0xFF, 0xFF, 0xFF, 0xFF, 0x00, 0x00, 0x00, 0x00, 0x01])
    spans = [(0, 9, True), (0, 32, False), (32, 40, True), (33, 38, True),
             (32, 40, False), (0, 72, False), (-1, 1, True), (-1, 1, False)]
    assert results(client, key, [bo.bit_lscan(BIN, o, s, v) for o, s, v in spans]) == \
        [0, -1, 39, -1, 0, 32, 0, -1]
    assert results(client, key, [bo.bit_rscan(BIN, o, s, v) for o, s, v in spans]) == \
        [8, -1, 39, -1, 38, 70, 0, -1]


def test_resize_creates_grows_and_shrinks(client, key):
    client.put(key, {"other": 1})
    assert results(client, key, [
        bo.bit_resize(BIN, 20),
        bo.bit_get(BIN, 19 * 8, 8),
        bo.bit_resize(BIN, 10, NO_FAIL, aerospike.BIT_RESIZE_GROW_ONLY),
        bo.bit_resize(BIN, 10, None, aerospike.BIT_RESIZE_SHRINK_ONLY),
        bo.bit_get(BIN, 9 * 8, 8),
        bo.bit_resize(BIN, 30, NO_FAIL, aerospike.BIT_RESIZE_SHRINK_ONLY),
    ]) == [None, b"\x00", None, None, b"\x00", None]
    assert stored(client, key) == bytes(10)
    put(client, key, [1, 2, 3])
    client.operate(key, [bo.bit_resize(BIN, 5, None, aerospike.BIT_RESIZE_FROM_FRONT)])
    assert stored(client, key) == bytes([0, 0, 1, 2, 3])
    client.operate(key, [bo.bit_resize(BIN, 2, None, aerospike.BIT_RESIZE_FROM_FRONT)])
    assert stored(client, key) == bytes([2, 3])
    client.operate(key, [bo.bit_resize(BIN, 1)])
    assert stored(client, key) == bytes([2])
    assert error_code(client, key, [
        bo.bit_resize(BIN, 0, None, aerospike.BIT_RESIZE_GROW_ONLY)]) == 4  # PARAMETER


def test_insert_and_remove(client, key):
    client.put(key, {"other": 1})
    client.operate(key, [bo.bit_insert(BIN, 1, 1, bytearray([0x0A]), CREATE_ONLY)])
    assert stored(client, key) == bytes([0x00, 0x0A])
    client.operate(key, [
        bo.bit_insert(BIN, 1, 2, bytearray([7, 8])),
        bo.bit_insert(BIN, -1, 1, bytearray([9])),
    ])
    assert stored(client, key) == bytes([0x00, 7, 8, 9, 0x0A])
    client.operate(key, [bo.bit_remove(BIN, 1, 2)])
    assert stored(client, key) == bytes([0x00, 9, 0x0A])
    assert error_code(client, key, [bo.bit_remove(BIN, 2, 5)]) == 4
    client.operate(key, [bo.bit_remove(BIN, 2, 5, NO_FAIL)])
    assert stored(client, key) == bytes([0x00, 9, 0x0A])
    client.operate(key, [bo.bit_remove(BIN, 1, 5, PARTIAL)])
    assert stored(client, key) == bytes([0x00])


def test_bin_existence_policies(client, key):
    client.put(key, {"other": 1})
    bit0 = bytearray([0x80])
    # Only resize and insert create a bin.
    assert error_code(client, key, [bo.bit_set(BIN, 0, 1, 1, bit0)]) == 17  # BIN_NOT_FOUND
    assert error_code(client, key, [bo.bit_resize(BIN, 4, UPDATE_ONLY)]) == 17
    client.operate(key, [bo.bit_set(BIN, 0, 1, 1, bit0, NO_FAIL)])
    assert BIN not in client.get(key)[2]
    put(client, key, [0])
    assert error_code(client, key, [bo.bit_insert(BIN, 0, 1, bit0, CREATE_ONLY)]) == 6  # BIN_EXISTS
    client.operate(key, [bo.bit_insert(BIN, 0, 1, bit0,
                                       {"bit_write_flags": aerospike.BIT_WRITE_CREATE_ONLY
                                        | aerospike.BIT_WRITE_NO_FAIL})])
    assert stored(client, key) == bytes([0])
    client.operate(key, [bo.bit_set(BIN, 0, 1, 1, bit0, UPDATE_ONLY)])
    assert stored(client, key) == bytes([0x80])
    # CREATE_ONLY is not a flag of set.
    assert error_code(client, key, [bo.bit_set(BIN, 0, 1, 1, bit0, CREATE_ONLY)]) == 4


def test_bounds_partial_and_no_fail(client, key):
    put(client, key, [0xFF, 0xFF])
    assert error_code(client, key, [bo.bit_not(BIN, 12, 8)]) == 26
    assert error_code(client, key, [bo.bit_get(BIN, 9, 8)]) == 26
    assert error_code(client, key, [bo.bit_get_int(BIN, 12, 8, False)]) == 26
    assert error_code(client, key, [bo.bit_count(BIN, -17, 1)]) == 4
    client.operate(key, [bo.bit_not(BIN, 12, 8, NO_FAIL)])
    assert stored(client, key) == bytes([0xFF, 0xFF])
    client.operate(key, [bo.bit_not(BIN, 12, 8, PARTIAL)])
    assert stored(client, key) == bytes([0xFF, 0xF0])
    client.operate(key, [bo.bit_set(BIN, 5, 16, 2, bytearray([0, 0]), PARTIAL)])
    assert stored(client, key) == bytes([0xF8, 0x00])


def test_empty_blob_and_wrong_types(client, key):
    put(client, key, [])
    assert error_code(client, key, [bo.bit_set(BIN, 0, 1, 1, bytearray([0x80]))]) == 26
    assert error_code(client, key, [bo.bit_count(BIN, 0, 1)]) == 26
    assert error_code(client, key, [bo.bit_remove(BIN, 0, 1)]) == 4
    client.operate(key, [bo.bit_insert(BIN, 0, 1, bytearray([5]))])
    assert stored(client, key) == bytes([5])

    client.put(key, {"s": "text", "i": 7})
    assert error_code(client, key, [bo.bit_get("s", 0, 8)]) == 12  # INCOMPATIBLE_TYPE
    assert error_code(client, key, [bo.bit_not("i", 0, 8)]) == 12
    assert error_code(client, key, [bo.bit_resize("s", 8)]) == 12
    # A read of a missing bin answers nothing (a null entry, as the client
    # asks for every op's answer).
    _, _, bins = client.operate(key, [bo.bit_get("missing", 0, 8)])
    assert bins.get("missing") is None


def test_parameter_errors(client, key):
    put(client, key, [0xFF] * 16)
    assert error_code(client, key, [bo.bit_get(BIN, 0, 0)]) == 4
    assert error_code(client, key, [bo.bit_get_int(BIN, 0, 65, False)]) == 4
    assert error_code(client, key, [bo.bit_add(BIN, 0, 65, 1, False,
                                               aerospike.BIT_OVERFLOW_FAIL)]) == 4
    assert error_code(client, key, [bo.bit_set(BIN, 0, 17, 2, bytearray([1, 2]))]) == 4
    assert error_code(client, key, [bo.bit_add(BIN, 0, 8, 1, False,
                                               aerospike.BIT_OVERFLOW_FAIL, PARTIAL)]) == 4
    assert stored(client, key) == bytes([0xFF] * 16)
