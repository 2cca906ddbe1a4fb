"""Namespace configuration seen through the client: a second server started with
--config (conftest.CONFIGURED_TOML) whose namespace `ttl1h` has default-ttl 1 h and
max-record-size 128 KiB. Shows that TTL 0 means "namespace default", not "never"."""

import uuid

import aerospike
import pytest
from aerospike import exception as ex

import conftest

NEVER = aerospike.TTL_NEVER_EXPIRE


@pytest.fixture(scope="module")
def cclient(citrined_configured):
    c = conftest.make_client(citrined_configured)
    yield c
    c.close()


@pytest.fixture
def tkey():
    return ("ttl1h", "s" + uuid.uuid4().hex[:12], "k")


def _ttl(c, key):
    _, meta = c.exists(key)
    assert meta is not None
    return meta["ttl"]


def test_configured_namespaces(cclient):
    answers = cclient.info_all("namespaces")
    ((err, value),) = answers.values()
    assert err is None
    assert sorted(value.strip().split(";")) == ["test", "ttl1h"]


def test_configured_namespace_config(cclient):
    ((_, value),) = cclient.info_all("get-config:context=namespace;namespace=ttl1h").values()
    cfg = dict(item.split("=", 1) for item in value.strip().split(";") if item)
    assert cfg["default-ttl"] == "3600"
    assert cfg["max-record-size"] == "131072"


def test_ttl_zero_uses_configured_default(cclient, tkey):
    cclient.put(tkey, {"a": 1}, meta={"ttl": aerospike.TTL_NAMESPACE_DEFAULT})
    assert 3590 <= _ttl(cclient, tkey) <= 3600


def test_no_ttl_uses_configured_default(cclient, tkey):
    cclient.put(tkey, {"a": 1})
    assert 3590 <= _ttl(cclient, tkey) <= 3600


def test_explicit_ttl_overrides_default_then_ttl_zero_restores_it(cclient, tkey):
    cclient.put(tkey, {"a": 1}, meta={"ttl": 100})
    assert 95 <= _ttl(cclient, tkey) <= 100
    cclient.put(tkey, {"a": 2}, meta={"ttl": aerospike.TTL_NAMESPACE_DEFAULT})
    assert 3590 <= _ttl(cclient, tkey) <= 3600


def test_never_expire_in_namespace_with_default_ttl(cclient, tkey):
    cclient.put(tkey, {"a": 1}, meta={"ttl": aerospike.TTL_NEVER_EXPIRE})
    assert _ttl(cclient, tkey) == NEVER


def test_dont_update_on_new_record_gets_configured_default(cclient, tkey):
    cclient.put(tkey, {"a": 1}, meta={"ttl": aerospike.TTL_DONT_UPDATE})
    assert 3590 <= _ttl(cclient, tkey) <= 3600


def test_dont_update_keeps_explicit_ttl(cclient, tkey):
    cclient.put(tkey, {"a": 1}, meta={"ttl": 100})
    cclient.put(tkey, {"a": 2}, meta={"ttl": aerospike.TTL_DONT_UPDATE})
    assert 95 <= _ttl(cclient, tkey) <= 100


def test_touch_without_ttl_uses_configured_default(cclient, tkey):
    cclient.put(tkey, {"a": 1}, meta={"ttl": 100})
    cclient.touch(tkey, 0)
    assert 3590 <= _ttl(cclient, tkey) <= 3600


def test_configured_max_record_size(cclient, tkey):
    cclient.put(tkey, {"b": bytearray(100 * 1024)})
    with pytest.raises(ex.RecordTooBig):
        cclient.put(tkey, {"b": bytearray(200 * 1024)})
    assert len(cclient.get(tkey)[2]["b"]) == 100 * 1024


def test_unconfigured_namespace_is_unknown(cclient):
    with pytest.raises(ex.NamespaceNotFound):
        cclient.put(("bar", "s", "k"), {"a": 1})
