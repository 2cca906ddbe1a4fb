"""Lua UDFs through the official client: registering modules, record UDFs
(apply), batch UDFs, background UDF jobs and aggregations."""

import hashlib
import time

import pytest

import aerospike
from aerospike import exception as ex
from aerospike_helpers.batch import records as br
from conftest import LUA_USER_PATH

NS = "test"

RECORD_MODULE = """
function test_func(rec, div)
   local ret = map()
   local x = rec['bin1']
   rec['bin2'] = math.floor(x / div)
   aerospike:update(rec)
   ret['status'] = 'OK'
   return ret
end

function echo(rec, param) return param end

function create(rec, bins)
   for b, v in map.pairs(bins) do rec[b] = v end
   return aerospike:create(rec)
end

function remove(rec) aerospike:remove(rec) end

function meta(rec)
   return list{record.gen(rec), aerospike:exists(rec), record.setname(rec)}
end

function no_update(rec) rec['bin1'] = 999; return 1 end

function with_ttl(rec, ttl) rec['t'] = 1; record.set_ttl(rec, ttl); aerospike:update(rec) end

function fail(rec) error("1000:Invalid value") end

function forever(rec) while true do end end
"""

STREAM_MODULE = """
local function add(a, b) return a + b end

function sum(stream, name)
  local function value(rec) return rec[name] end
  return stream : map(value) : reduce(add)
end

function odd(stream, name)
  local function is_odd(rec) return rec[name] % 2 == 1 end
  local function value(rec) return rec[name] end
  return stream : filter(is_odd) : map(value)
end
"""


def _register(client, tmp_path, name, source):
    path = tmp_path / name
    path.write_text(source)
    client.udf_put(str(path))
    deadline = time.time() + 10
    while time.time() < deadline:
        if any(entry["name"] == name for entry in client.udf_list()):
            return path
        time.sleep(0.05)
    pytest.fail(f"{name} never listed")


@pytest.fixture
def record_module(client, tmp_path):
    _register(client, tmp_path, "citrine_rec.lua", RECORD_MODULE)
    yield "citrine_rec"
    client.udf_remove("citrine_rec.lua")


def test_modules_register_list_and_remove(client, tmp_path):
    _register(client, tmp_path, "citrine_list.lua", "function f(rec) return 1 end")
    listed = {entry["name"]: entry for entry in client.udf_list()}
    assert client.udf_get("citrine_list.lua") == "function f(rec) return 1 end"
    assert "citrine_list.lua" in listed
    # The hash is the source's SHA-1.
    source = b"function f(rec) return 1 end"
    assert bytes(listed["citrine_list.lua"]["hash"]).decode() == hashlib.sha1(source).hexdigest()
    client.udf_remove("citrine_list.lua")
    assert "citrine_list.lua" not in {entry["name"] for entry in client.udf_list()}
    # Removing a module that is not there is not an error.
    client.udf_remove("citrine_list.lua")


def test_a_module_that_does_not_compile_is_refused(client, tmp_path):
    path = tmp_path / "citrine_bad.lua"
    path.write_text("function f(rec)\n  asdf\n  returned ret\nend\n")
    with pytest.raises(ex.AerospikeError):
        client.udf_put(str(path))
    assert "citrine_bad.lua" not in {entry["name"] for entry in client.udf_list()}


def test_a_record_udf_updates_its_record(client, record_module, key):
    client.put(key, {"bin1": 21})
    assert client.apply(key, record_module, "test_func", [2]) == {"status": "OK"}
    _, meta, bins = client.get(key)
    assert bins == {"bin1": 21, "bin2": 10}
    assert meta["gen"] == 2


def test_values_round_trip(client, record_module, key):
    for value in [0, -1, 2**63 - 1, -(2**63), 1.5, "", "Hello, 世界", "s" * 100000,
                  [1, "two", 3.5, [4]], {"a": 1, "b": [1, 2]}, bytearray(b"\x00\x01\xff")]:
        assert client.apply(key, record_module, "echo", [value]) == value
    assert client.apply(key, record_module, "echo", []) is None
    # Nothing was written.
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


def test_changes_need_create_update_or_remove(client, record_module, key):
    assert client.apply(key, record_module, "create", [{"x": 5}]) == 0
    assert client.get(key)[2] == {"x": 5}
    # create on a record that exists returns 1 and changes nothing.
    assert client.apply(key, record_module, "create", [{"x": 6}]) == 1
    assert client.apply(key, record_module, "no_update", []) == 1
    assert client.get(key)[2] == {"x": 5}
    assert client.apply(key, record_module, "meta", [])[:2] == [1, True]
    client.apply(key, record_module, "remove", [])
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


def test_record_ttl_set_by_the_udf(client, record_module, key):
    client.apply(key, record_module, "with_ttl", [1000])
    _, meta, _ = client.get(key)
    assert 900 <= meta["ttl"] <= 1000


def test_udf_errors_answer_100_and_the_node_keeps_serving(client, record_module, key):
    client.put(key, {"bin1": 1})
    with pytest.raises(ex.UDFError) as error:
        client.apply(key, record_module, "fail", [])
    assert error.value.code == 100
    assert "1000:Invalid value" in str(error.value.msg)
    with pytest.raises(ex.UDFError):
        client.apply(key, record_module, "no_such_function", [])
    with pytest.raises(ex.UDFError):
        client.apply(key, "no_such_module", "f", [])
    # A loop without end is stopped at its time limit.
    started = time.time()
    with pytest.raises(ex.UDFError):
        client.apply(key, record_module, "forever", [], policy={"total_timeout": 5000})
    assert time.time() - started < 5
    assert client.get(key)[2] == {"bin1": 1}


def test_batch_apply(client, record_module, make_key):
    keys = [make_key(i) for i in range(20)]
    for i, key in enumerate(keys):
        client.put(key, {"bin1": i * 10})
    result = client.batch_apply(keys, record_module, "test_func", [10])
    assert len(result.batch_records) == 20
    for record in result.batch_records:
        assert record.result == 0
        assert record.record[2] == {"SUCCESS": {"status": "OK"}}
    for i, key in enumerate(keys):
        assert client.get(key)[2]["bin2"] == i
    # A row whose UDF fails answers 100 without failing the others.
    rows = br.BatchRecords([
        br.Apply(keys[0], record_module, "fail", []),
        br.Apply(keys[1], record_module, "echo", [7]),
    ])
    client.batch_write(rows)
    assert rows.batch_records[0].result == 100
    assert rows.batch_records[1].result == 0
    assert rows.batch_records[1].record[2] == {"SUCCESS": 7}


def test_background_udf_job(client, record_module, set_name, make_key):
    for i in range(50):
        client.put(make_key(i), {"bin1": i * 2})
    query = client.query(NS, set_name)
    query.apply(record_module, "test_func", [2])
    job = query.execute_background()
    deadline = time.time() + 30
    while client.job_info(job, aerospike.JOB_QUERY)["status"] != aerospike.JOB_STATUS_COMPLETED:
        assert time.time() < deadline, "job never finished"
        time.sleep(0.1)
    for i in range(50):
        assert client.get(make_key(i))[2]["bin2"] == i


def test_aggregations(client, set_name, make_key):
    # The client runs the stream's last step itself, from its Lua path.
    aggregating = client
    _register(aggregating, LUA_USER_PATH, "citrine_streams.lua", STREAM_MODULE)
    try:
        for i in range(1, 101):
            aggregating.put(make_key(i), {"n": i})
        query = aggregating.query(NS, set_name)
        query.apply("citrine_streams", "sum", ["n"])
        assert query.results() == [5050]
        query = aggregating.query(NS, set_name)
        query.apply("citrine_streams", "odd", ["n"])
        assert sorted(query.results()) == list(range(1, 101, 2))
    finally:
        aggregating.udf_remove("citrine_streams.lua")


def test_an_aggregation_selecting_bins_sees_whole_records(client, set_name, make_key):
    """Bins selected beside a stream UDF do not refuse the query (the reference
    runs it) and do not narrow what the stream sees."""
    _register(client, LUA_USER_PATH, "citrine_streams.lua", STREAM_MODULE)
    try:
        for i in range(1, 11):
            client.put(make_key(i), {"n": i, "m": 10 * i})
        query = client.query(NS, set_name)
        query.select("n")
        query.apply("citrine_streams", "sum", ["m"])
        assert query.results() == [550]
    finally:
        client.udf_remove("citrine_streams.lua")


def test_an_aggregation_over_a_set_never_written_returns_nothing(client, set_name):
    """On a set that was never written, an aggregation with a filter answers
    success with no result, whether or not the filter's bin has an index (the
    reference's answer); a plain query with that filter answers 201."""
    from aerospike import predicates

    _register(client, LUA_USER_PATH, "citrine_streams.lua", STREAM_MODULE)
    try:
        query = client.query(NS, set_name)
        query.where(predicates.between("n", 1, 5))
        query.apply("citrine_streams", "sum", ["n"])
        assert query.results() == []
        plain = client.query(NS, set_name)
        plain.where(predicates.between("n", 1, 5))
        with pytest.raises(ex.IndexNotFound):
            plain.results()
    finally:
        client.udf_remove("citrine_streams.lua")


def test_empty_module_and_function_names_are_a_udf_error(client, key):
    """apply(key, "", "") fails when it runs (100), as the reference answers,
    not as a malformed request (4)."""
    client.put(key, {"bin1": 1})
    for module, function in [("", ""), ("", "f")]:
        with pytest.raises(ex.UDFError) as error:
            client.apply(key, module, function, [])
        assert error.value.code == 100
    assert client.get(key)[2] == {"bin1": 1}


def test_a_background_job_naming_a_missing_module_is_accepted(client, set_name, make_key):
    """A background UDF job whose module does not exist is accepted (the
    reference accepts it); it then fails on each record, writing nothing."""
    for i in range(5):
        client.put(make_key(i), {"bin1": i})
    query = client.query(NS, set_name)
    query.apply("citrine_no_such_module", "test_func", [2])
    job = query.execute_background()
    deadline = time.time() + 30
    while client.job_info(job, aerospike.JOB_QUERY)["status"] != aerospike.JOB_STATUS_COMPLETED:
        assert time.time() < deadline, "job never finished"
        time.sleep(0.1)
    for i in range(5):
        assert client.get(make_key(i))[2] == {"bin1": i}

