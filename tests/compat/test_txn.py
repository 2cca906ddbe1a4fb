"""Multi-record transactions through the official client's Transaction API
on namespaces without strong consistency: every answer is the reference
CE 8.1.2's, measured with this same client (protocol notes 02 §2.4, §11).
The transaction path itself runs on strong-consistency namespaces only
(citrine_data::txn), which the server does not serve yet."""

import aerospike
import pytest
from aerospike import exception as ex


def test_commands_in_a_transaction_answer_25_and_change_nothing(client, make_key):
    keys = [make_key("t0"), make_key("t1")]
    for i, k in enumerate(keys):
        client.put(k, {"a": i})
    txn = aerospike.Transaction()
    policy = {"txn": txn}
    with pytest.raises(ex.AerospikeError) as put:
        client.put(keys[0], {"a": 10}, policy=policy)
    assert put.value.code == 25
    with pytest.raises(ex.AerospikeError) as get:
        client.get(keys[1], policy=policy)
    assert get.value.code == 25
    # No monitor deadline came back, so the commit has nothing to do.
    assert client.commit(txn) == aerospike.COMMIT_OK
    assert [client.get(k)[2] for k in keys] == [{"a": 0}, {"a": 1}]
