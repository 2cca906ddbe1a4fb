"""TTL / expiration semantics (02 §2.5).

The default namespace `test` has default-ttl 0 (never expire). A never-expiring record
comes back with void time 0 on the wire, which the Python client reports as
NEVER (the constant below)."""

import time

import aerospike
import pytest
from aerospike import exception as ex

# What the Python client reports in meta["ttl"] for a record whose void time is 0.
NEVER = aerospike.TTL_NEVER_EXPIRE  # 0xFFFFFFFF


def _ttl(client, key):
    _, meta = client.exists(key)
    assert meta is not None, "record unexpectedly missing"
    return meta["ttl"]


def test_ttl_zero_uses_namespace_default_never_expire(client, key):
    client.put(key, {"a": 1}, meta={"ttl": aerospike.TTL_NAMESPACE_DEFAULT})
    assert _ttl(client, key) == NEVER


def test_no_ttl_given_uses_namespace_default(client, key):
    client.put(key, {"a": 1})
    assert _ttl(client, key) == NEVER


@pytest.mark.parametrize("never", [aerospike.TTL_NEVER_EXPIRE, -1])
def test_ttl_never_expire(client, key, never):
    client.put(key, {"a": 1}, meta={"ttl": never})
    assert _ttl(client, key) == NEVER


def test_explicit_ttl_is_reported(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 3600})
    assert 3590 <= _ttl(client, key) <= 3600


def test_ttl_dont_update_keeps_current_ttl(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 3600})
    client.put(key, {"a": 2}, meta={"ttl": aerospike.TTL_DONT_UPDATE})
    assert 3590 <= _ttl(client, key) <= 3600
    _, meta, bins = client.get(key)
    assert bins == {"a": 2} and meta["gen"] == 2


def test_ttl_minus_two_literal_keeps_current_ttl(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 7200})
    client.put(key, {"a": 2}, meta={"ttl": -2})
    assert 7190 <= _ttl(client, key) <= 7200


def test_ttl_dont_update_on_never_expiring_record(client, key):
    client.put(key, {"a": 1}, meta={"ttl": aerospike.TTL_NEVER_EXPIRE})
    client.put(key, {"a": 2}, meta={"ttl": aerospike.TTL_DONT_UPDATE})
    assert _ttl(client, key) == NEVER


def test_ttl_dont_update_on_new_record_gets_default(client, key):
    client.put(key, {"a": 1}, meta={"ttl": aerospike.TTL_DONT_UPDATE})
    assert _ttl(client, key) == NEVER


def test_update_without_ttl_resets_to_default(client, key):
    """A plain write (ttl 0 = namespace default) replaces a finite TTL with the default."""
    client.put(key, {"a": 1}, meta={"ttl": 3600})
    client.put(key, {"a": 2}, meta={"ttl": aerospike.TTL_NAMESPACE_DEFAULT})
    assert _ttl(client, key) == NEVER


def test_ttl_above_ten_years_is_rejected_with_parameter_error(client, key):
    with pytest.raises(ex.AerospikeError) as ei:
        client.put(key, {"a": 1}, meta={"ttl": 315360001})
    assert ei.value.code == 4, repr(ei.value)
    _, meta = client.exists(key)
    assert meta is None


def test_record_with_ttl_1_expires(client, make_key):
    """TTL 1 s: gone after ~2.5 s for every kind of access, even with no background pass."""
    k_get, k_exists, k_update, k_put, k_touch, k_keep = (make_key(n) for n in
                                                         ("g", "e", "u", "p", "t", "keep"))
    for k in (k_get, k_exists, k_update, k_put, k_touch):
        client.put(k, {"a": 1, "old": "x"}, meta={"ttl": 1})
    client.put(k_keep, {"a": 1}, meta={"ttl": 60})
    assert client.get(k_get)[2] == {"a": 1, "old": "x"}
    time.sleep(2.5)

    with pytest.raises(ex.RecordNotFound):
        client.get(k_get)
    _, meta = client.exists(k_exists)
    assert meta is None
    with pytest.raises(ex.RecordNotFound):
        client.put(k_update, {"a": 2}, policy={"exists": aerospike.POLICY_EXISTS_UPDATE})
    with pytest.raises(ex.RecordNotFound):
        client.touch(k_touch, 100)
    # a write on an expired record creates a fresh record: old bins gone, generation 1
    client.put(k_put, {"new": 1})
    _, meta, bins = client.get(k_put)
    assert bins == {"new": 1}
    assert meta["gen"] == 1
    # a record with a longer TTL is still there
    assert client.get(k_keep)[2] == {"a": 1}


def test_touch_extends_ttl_so_record_survives(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 1})
    client.touch(key, 60)
    time.sleep(1.5)
    _, meta, bins = client.get(key)
    assert bins == {"a": 1}
    # the reported TTL counts down (void time is absolute, 02 §2.5)
    assert 56 <= meta["ttl"] <= 59, meta


def test_touch_with_never_expire(client, key):
    client.put(key, {"a": 1}, meta={"ttl": 100})
    client.touch(key, aerospike.TTL_NEVER_EXPIRE)
    assert _ttl(client, key) == NEVER


def test_increment_sets_ttl_from_meta(client, key):
    client.put(key, {"n": 1})
    client.increment(key, "n", 1, meta={"ttl": 3600})
    assert 3590 <= _ttl(client, key) <= 3600


def test_operate_with_ttl_dont_update_keeps_ttl(client, key):
    from aerospike_helpers.operations import operations as op

    client.put(key, {"a": 1}, meta={"ttl": 3600})
    client.operate(key, [op.write("b", 2)], meta={"ttl": aerospike.TTL_DONT_UPDATE})
    assert 3590 <= _ttl(client, key) <= 3600
    assert client.get(key)[2] == {"a": 1, "b": 2}
