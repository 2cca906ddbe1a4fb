"""Single-record basics: put / get / select / exists / remove / touch / increment /
append / prepend / remove_bin, through the official Python client."""

import aerospike
import pytest
from aerospike import exception as ex


def test_put_then_get_all_bins(client, key):
    bins = {"i": 42, "s": "hello", "f": 1.5}
    client.put(key, bins)
    k, meta, got = client.get(key)
    assert got == bins
    assert meta["gen"] == 1
    assert k[0] == key[0] and k[1] == key[1]
    assert bytes(k[3]) == bytes(aerospike.calc_digest(*key))


def test_put_merges_bins_and_bumps_generation(client, key):
    client.put(key, {"a": 1, "b": 2})
    client.put(key, {"b": 20, "c": 30})
    _, meta, got = client.get(key)
    assert got == {"a": 1, "b": 20, "c": 30}
    assert meta["gen"] == 2
    client.put(key, {"a": 100})
    _, meta, _ = client.get(key)
    assert meta["gen"] == 3


def test_select_named_bins(client, key):
    client.put(key, {"a": 1, "b": "two", "c": 3.0, "d": [4]})
    _, meta, got = client.select(key, ["a", "c"])
    assert got == {"a": 1, "c": 3.0}
    assert meta["gen"] == 1


def test_select_absent_bin_is_not_returned(client, key):
    client.put(key, {"a": 1})
    _, _, got = client.select(key, ["a", "nope"])
    assert got.get("a") == 1
    assert got.get("nope") is None


def test_get_missing_record_raises_record_not_found(client, key):
    with pytest.raises(ex.RecordNotFound) as ei:
        client.get(key)
    assert ei.value.code == 2


def test_select_missing_record_raises_record_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.select(key, ["a"])


def test_exists_returns_metadata_only(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 1000})
    k, meta = client.exists(key)
    assert meta is not None
    assert meta["gen"] == 1
    assert 990 <= meta["ttl"] <= 1000
    assert k[1] == key[1]


def test_exists_missing_record_returns_none_meta(client, key):
    _, meta = client.exists(key)
    assert meta is None


def test_get_metadata_matches_exists(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 5000})
    client.put(key, {"a": 2})
    _, gmeta, _ = client.get(key)
    _, emeta = client.exists(key)
    assert gmeta["gen"] == emeta["gen"] == 2
    assert abs(gmeta["ttl"] - emeta["ttl"]) <= 1


def test_remove_deletes_record(client, key):
    client.put(key, {"a": 1})
    client.remove(key)
    with pytest.raises(ex.RecordNotFound):
        client.get(key)
    _, meta = client.exists(key)
    assert meta is None


def test_remove_missing_record_raises_record_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.remove(key)


def test_put_after_remove_starts_new_record(client, key):
    """A new record with none of the old bins, at generation 1 as after
    the reference's (non-durable) deletes: it starts the record's next life,
    which wins over the tombstone and every older copy wherever they meet."""
    client.put(key, {"a": 1, "b": 2})
    client.put(key, {"a": 2})
    client.remove(key)
    client.put(key, {"c": 3})
    _, meta, got = client.get(key)
    assert got == {"c": 3}  # old bins must not resurrect
    assert meta["gen"] == 1


def test_touch_bumps_generation_and_resets_ttl(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 100})
    client.touch(key, 5000)
    _, meta, got = client.get(key)
    assert got == {"a": 1}
    assert meta["gen"] == 2
    assert 4990 <= meta["ttl"] <= 5000


def test_touch_missing_record_raises_record_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.touch(key, 100)


def test_increment_creates_and_adds(client, key):
    client.increment(key, "n", 5)
    client.increment(key, "n", -2)
    _, meta, got = client.get(key)
    assert got == {"n": 3}
    assert meta["gen"] == 2


def test_increment_float(client, key):
    client.put(key, {"f": 1.25})
    client.increment(key, "f", 2.5)
    _, _, got = client.get(key)
    assert got["f"] == pytest.approx(3.75)
    assert isinstance(got["f"], float)


def test_append_and_prepend_string(client, key):
    client.put(key, {"s": "mid"})
    client.append(key, "s", "-end")
    client.prepend(key, "s", "start-")
    _, meta, got = client.get(key)
    assert got == {"s": "start-mid-end"}
    assert meta["gen"] == 3


def test_append_creates_missing_bin(client, key):
    client.append(key, "s", "abc")
    _, _, got = client.get(key)
    assert got == {"s": "abc"}


def test_append_and_prepend_blob(client, key):
    client.put(key, {"b": bytearray(b"\x01\x02")})
    client.append(key, "b", bytearray(b"\x03"))
    client.prepend(key, "b", bytearray(b"\x00"))
    _, _, got = client.get(key)
    assert bytes(got["b"]) == b"\x00\x01\x02\x03"


def test_remove_bin(client, key):
    client.put(key, {"a": 1, "b": 2, "c": 3})
    client.remove_bin(key, ["b"])
    _, meta, got = client.get(key)
    assert got == {"a": 1, "c": 3}
    assert meta["gen"] == 2


def test_removing_last_bin_deletes_record(client, key):
    client.put(key, {"a": 1})
    client.remove_bin(key, ["a"])
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


def test_integer_user_key_and_bytes_user_key(client, make_key):
    kint = make_key(12345)
    kbytes = make_key(bytearray(b"\x00\xffkey"))
    client.put(kint, {"v": "int"})
    client.put(kbytes, {"v": "bytes"})
    assert client.get(kint)[2] == {"v": "int"}
    assert client.get(kbytes)[2] == {"v": "bytes"}


def test_records_in_different_sets_are_distinct(client, set_name):
    k1 = ("test", set_name, "same")
    k2 = ("test", set_name + "x", "same")
    client.put(k1, {"v": 1})
    client.put(k2, {"v": 2})
    assert client.get(k1)[2] == {"v": 1}
    assert client.get(k2)[2] == {"v": 2}


def test_records_in_different_namespaces_are_distinct(client, set_name):
    k1 = ("test", set_name, "same")
    k2 = ("bar", set_name, "same")
    client.put(k1, {"v": 1})
    client.put(k2, {"v": 2})
    assert client.get(k1)[2] == {"v": 1}
    assert client.get(k2)[2] == {"v": 2}
    client.remove(k2)
    assert client.get(k1)[2] == {"v": 1}


def test_put_null_value_deletes_bin(client, key):
    client.put(key, {"a": 1, "b": 2})
    client.put(key, {"b": aerospike.null()})
    _, meta, got = client.get(key)
    assert got == {"a": 1}
    assert meta["gen"] == 2


def test_select_only_absent_bins_on_existing_record(client, key):
    client.put(key, {"a": 1})
    _, meta, got = client.select(key, ["nope"])
    assert meta["gen"] == 1
    assert got.get("nope") is None
    assert "a" not in got


def test_record_without_set(client):
    import uuid

    k = ("test", None, "noset-" + uuid.uuid4().hex[:8])
    client.put(k, {"a": 1})
    kk, meta, got = client.get(k)
    assert got == {"a": 1}
    assert kk[1] is None
    client.remove(k)
    assert client.exists(k)[1] is None


def test_empty_string_user_key(client, set_name):
    k = ("test", set_name, "")
    client.put(k, {"a": 1})
    assert client.get(k)[2] == {"a": 1}


def test_many_bins(client, key):
    bins = {f"b{i}": i for i in range(1000)}
    client.put(key, bins)
    assert client.get(key)[2] == bins
    _, _, sel = client.select(key, ["b0", "b999"])
    assert sel == {"b0": 0, "b999": 999}


def test_select_of_no_bins_is_refused(client, key):
    """`select(key, [])` names no bin: the reference answers 4 once the
    record is found (2 when it is not); issue 46, item 9."""
    with pytest.raises(ex.RecordNotFound):
        client.select(key, [])
    client.put(key, {"a": 1})
    with pytest.raises(ex.InvalidRequest):
        client.select(key, [])
    assert client.select(key, ["a"])[2] == {"a": 1}
    # A filter that fails answers 27 before the refusal, as the reference.
    from aerospike_helpers import expressions as exp
    with pytest.raises(ex.FilteredOut):
        client.select(key, [], policy={"expressions": exp.Val(False).compile()})


def test_generation_after_a_delete_starts_again_and_after_a_durable_one_continues(client, key):
    """put, put, delete, put gives generation 1, as the reference's
    non-durable delete; a durable delete (Enterprise-only in the reference)
    keeps the generation going (issue 46, item 10)."""
    client.put(key, {"a": 1})
    client.put(key, {"a": 2})
    client.remove(key)
    client.put(key, {"a": 3})
    assert client.get(key)[1]["gen"] == 1
    client.put(key, {"a": 4})
    client.remove(key, policy={"durable_delete": True})
    client.put(key, {"a": 5})
    assert client.get(key)[1]["gen"] == 4
