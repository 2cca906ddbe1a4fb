"""Write policies: generation (EQ / GT), record-exists actions, durable delete."""

import aerospike
import pytest
from aerospike import exception as ex

import rawwire

GEN_EQ = {"gen": aerospike.POLICY_GEN_EQ}
GEN_GT = {"gen": aerospike.POLICY_GEN_GT}


def _state(client, key):
    _, meta, bins = client.get(key)
    return meta["gen"], bins


# --- generation -------------------------------------------------------------------

def test_gen_eq_matching_generation_succeeds(client, key):
    client.put(key, {"a": 1})
    client.put(key, {"a": 2})  # gen 2
    client.put(key, {"a": 3}, meta={"gen": 2}, policy=GEN_EQ)
    assert _state(client, key) == (3, {"a": 3})


def test_gen_eq_wrong_generation_fails_and_leaves_record(client, key):
    client.put(key, {"a": 1})
    for wrong in (0, 2, 99):
        with pytest.raises(ex.RecordGenerationError) as ei:
            client.put(key, {"a": 2}, meta={"gen": wrong}, policy=GEN_EQ)
        assert ei.value.code == 3
    assert _state(client, key) == (1, {"a": 1})


def test_gen_gt_greater_generation_succeeds(client, key):
    client.put(key, {"a": 1})  # gen 1
    client.put(key, {"a": 2}, meta={"gen": 5}, policy=GEN_GT)
    gen, bins = _state(client, key)
    assert bins == {"a": 2}
    assert gen == 2  # the record's generation is still bumped by one


def test_gen_gt_equal_or_lower_generation_fails(client, key):
    client.put(key, {"a": 1})
    client.put(key, {"a": 2})  # gen 2
    for not_greater in (2, 1, 0):
        with pytest.raises(ex.RecordGenerationError):
            client.put(key, {"a": 9}, meta={"gen": not_greater}, policy=GEN_GT)
    assert _state(client, key) == (2, {"a": 2})


def test_gen_gt_on_missing_record_fails_before_any_op(client, key):
    """A missing record has generation 0, not less than 0: 3 before the
    ops (the reference's answer), whether they would create the record,
    remove a bin or fail on their own."""
    from aerospike_helpers.operations import operations as op

    calls = (lambda: client.put(key, {"s": ""}, policy=GEN_GT),
             lambda: client.remove_bin(key, ["s"], policy=GEN_GT),
             lambda: client.increment(key, "n", 1, policy=GEN_GT),
             lambda: client.operate(key, [op.write("a", 1), op.read("a")], policy=GEN_GT))
    for call in calls:
        with pytest.raises(ex.RecordGenerationError):
            call()
    assert client.exists(key)[1] is None
    client.put(key, {"s": ""}, meta={"gen": 1}, policy=GEN_GT)
    assert _state(client, key) == (1, {"s": ""})


def test_gen_eq_on_remove(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.RecordGenerationError):
        client.remove(key, meta={"gen": 4}, policy=GEN_EQ)
    assert _state(client, key) == (1, {"a": 1})
    client.remove(key, meta={"gen": 1}, policy=GEN_EQ)
    _, meta = client.exists(key)
    assert meta is None


def test_gen_eq_on_increment_and_touch(client, key):
    client.put(key, {"n": 1})
    with pytest.raises(ex.RecordGenerationError):
        client.increment(key, "n", 1, meta={"gen": 3}, policy=GEN_EQ)
    client.increment(key, "n", 1, meta={"gen": 1}, policy=GEN_EQ)
    with pytest.raises(ex.RecordGenerationError):
        client.touch(key, 100, meta={"gen": 1}, policy=GEN_EQ)
    client.touch(key, 100, meta={"gen": 2}, policy=GEN_EQ)
    assert _state(client, key) == (3, {"n": 2})


def test_gen_ignore_is_default(client, key):
    client.put(key, {"a": 1})
    client.put(key, {"a": 2}, meta={"gen": 42})  # no gen policy: gen in meta ignored
    assert _state(client, key) == (2, {"a": 2})


# --- record-exists actions --------------------------------------------------------

def test_create_only_on_missing_record_succeeds(client, key):
    client.put(key, {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert _state(client, key) == (1, {"a": 1})


def test_create_only_on_existing_record_raises_exists(client, key):
    client.put(key, {"a": 1})
    with pytest.raises(ex.RecordExistsError) as ei:
        client.put(key, {"a": 2}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert ei.value.code == 5
    assert _state(client, key) == (1, {"a": 1})


def test_create_only_after_delete_succeeds(client, key):
    """Create-only succeeds over a delete. Every delete leaves a tombstone;
    the new record starts the next life at generation 1 (as after the
    reference's non-durable deletes), which a replica still holding the
    tombstone takes over it; after a durable delete it continues past the
    tombstone's generation (2 here) to 3."""
    client.put(key, {"a": 1})
    client.remove(key)
    client.put(key, {"b": 2}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert _state(client, key) == (1, {"b": 2})
    client.remove(key, policy={"durable_delete": True})
    client.put(key, {"c": 3}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert _state(client, key) == (3, {"c": 3})


def test_update_only_on_missing_record_raises_not_found(client, key):
    with pytest.raises(ex.RecordNotFound) as ei:
        client.put(key, {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_UPDATE})
    assert ei.value.code == 2
    _, meta = client.exists(key)
    assert meta is None


def test_update_only_on_existing_record_merges(client, key):
    client.put(key, {"a": 1, "b": 2})
    client.put(key, {"b": 3}, policy={"exists": aerospike.POLICY_EXISTS_UPDATE})
    assert _state(client, key) == (2, {"a": 1, "b": 3})


def test_replace_only_on_missing_record_raises_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.put(key, {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_REPLACE})
    _, meta = client.exists(key)
    assert meta is None


def test_replace_only_removes_bins_not_written(client, key):
    client.put(key, {"a": 1, "b": 2, "c": 3})
    client.put(key, {"b": 20}, policy={"exists": aerospike.POLICY_EXISTS_REPLACE})
    assert _state(client, key) == (2, {"b": 20})


def test_create_or_replace_on_missing_record_creates(client, key):
    client.put(key, {"a": 1}, policy={"exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE})
    assert _state(client, key) == (1, {"a": 1})


def test_create_or_replace_on_existing_record_replaces(client, key):
    client.put(key, {"a": 1, "b": 2})
    client.put(key, {"c": 3}, policy={"exists": aerospike.POLICY_EXISTS_CREATE_OR_REPLACE})
    assert _state(client, key) == (2, {"c": 3})


def test_exists_ignore_upserts(client, key):
    pol = {"exists": aerospike.POLICY_EXISTS_IGNORE}
    client.put(key, {"a": 1}, policy=pol)
    client.put(key, {"b": 2}, policy=pol)
    assert _state(client, key) == (2, {"a": 1, "b": 2})


# --- durable delete ---------------------------------------------------------------

def test_durable_delete_is_accepted(client, key):
    client.put(key, {"a": 1})
    client.remove(key, policy={"durable_delete": True})
    with pytest.raises(ex.RecordNotFound):
        client.get(key)


def test_durable_delete_of_missing_record_is_not_found(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.remove(key, policy={"durable_delete": True})


# --- commit level (header bit only; must be accepted) -----------------------------

def test_commit_level_master_accepted(client, key):
    client.put(key, {"a": 1}, policy={"commit_level": aerospike.POLICY_COMMIT_LEVEL_MASTER})
    assert _state(client, key) == (1, {"a": 1})


def test_create_only_after_durable_delete_succeeds(client, key):
    client.put(key, {"a": 1})
    client.remove(key, policy={"durable_delete": True})
    client.put(key, {"b": 2}, policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert _state(client, key) == (3, {"b": 2})


def test_generation_wraps_to_1_after_65535(citrined, client, set_name):
    """The record generation is a 16-bit counter that skips 0 (02 §2.7)."""
    key = ("test", set_name, "wrap")
    client.put(key, {"n": 0})  # gen 1
    body = rawwire.request_body("test", set_name, "wrap", 0, rawwire.INFO2_WRITE, ops=[
        rawwire.op(5, rawwire.PT_INTEGER, "n", rawwire.int_value(1))])
    conn = rawwire.Connection(citrined.host, citrined.port)
    try:
        gens = []
        remaining = 65535
        while remaining:
            batch = min(1000, remaining)
            for r in conn.pipeline([body] * batch):
                assert r["result_code"] == 0, r
                gens.append(r["generation"])
            remaining -= batch
    finally:
        conn.close()
    assert gens[0] == 2 and gens[65533] == 65535, (gens[:3], gens[65530:])
    assert gens[65534] == 1  # 65535 -> 1, never 0
    _, meta, bins = client.get(key)
    assert bins == {"n": 65535}
    assert meta["gen"] == 1
    client.put(key, {"n": 0}, meta={"gen": 1}, policy=GEN_EQ)
    assert _state(client, key) == (2, {"n": 0})


def test_replace_with_bin_delete_is_parameter_error(client, key):
    """A bin delete (WRITE of NULL) together with REPLACE_ONLY is rejected (02 §8)."""
    client.put(key, {"a": 1, "b": 2})
    with pytest.raises(ex.InvalidRequest):
        client.put(key, {"a": aerospike.null(), "c": 3},
                   policy={"exists": aerospike.POLICY_EXISTS_REPLACE})
    assert _state(client, key) == (1, {"a": 1, "b": 2})


@pytest.mark.parametrize("exists", [aerospike.POLICY_EXISTS_REPLACE,
                                    aerospike.POLICY_EXISTS_CREATE_OR_REPLACE])
def test_replace_with_modify_op_is_parameter_error(client, key, exists):
    from aerospike_helpers.operations import operations as op

    client.put(key, {"a": 1, "b": 2})
    for ops in ([op.increment("a", 1)], [op.touch()], [op.append("s", "x")]):
        with pytest.raises(ex.InvalidRequest):
            client.operate(key, ops, policy={"exists": exists})
    assert _state(client, key) == (1, {"a": 1, "b": 2})
    # a plain write op with REPLACE is fine and replaces the record's bins
    client.operate(key, [op.write("z", 1)], policy={"exists": exists})
    assert _state(client, key) == (2, {"z": 1})


@pytest.mark.parametrize("exists", [aerospike.POLICY_EXISTS_REPLACE,
                                    aerospike.POLICY_EXISTS_CREATE_OR_REPLACE])
def test_replace_runs_reads_and_expression_writes(client, key, exists):
    """Only ops that need the old record are refused in a replace: CDT
    reads and expression writes run on the replaced (empty) record."""
    from aerospike_helpers import expressions as exp
    from aerospike_helpers.operations import expression_operations as eo
    from aerospike_helpers.operations import list_operations as lo
    from aerospike_helpers.operations import operations as op

    client.put(key, {"l": [1, 2], "a": 1})
    client.operate(key, [op.write("b", 1), lo.list_size("l")], policy={"exists": exists})
    assert _state(client, key) == (2, {"b": 1})
    client.operate(key, [eo.expression_write("w", exp.Add(1, 2).compile())],
                   policy={"exists": exists})
    assert _state(client, key) == (3, {"w": 3})
    with pytest.raises(ex.InvalidRequest):
        client.operate(key, [lo.list_append("l", 1)], policy={"exists": exists})
    # A replace that writes no bin: 2, and the record stays.
    nothing = eo.expression_write("x", exp.Unknown().compile(), aerospike.EXP_WRITE_EVAL_NO_FAIL)
    with pytest.raises(ex.RecordNotFound):
        client.operate(key, [nothing], policy={"exists": exists})
    assert _state(client, key) == (3, {"w": 3})


def test_operate_create_only_on_existing_record(client, key):
    from aerospike_helpers.operations import operations as op

    client.put(key, {"a": 1})
    with pytest.raises(ex.RecordExistsError):
        client.operate(key, [op.write("q", 1)],
                       policy={"exists": aerospike.POLICY_EXISTS_CREATE})
    assert _state(client, key) == (1, {"a": 1})


def test_increment_update_only_on_missing_record(client, key):
    with pytest.raises(ex.RecordNotFound):
        client.increment(key, "n", 1, policy={"exists": aerospike.POLICY_EXISTS_UPDATE})
    _, meta = client.exists(key)
    assert meta is None
