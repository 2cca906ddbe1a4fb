"""Access control with the official Python client against a citrined started
with a `[security]` section (issue 41): no credentials are refused (80), the
default admin/admin logs in and administers users, and a user with role
`read` reads but is refused a write with 81 (ROLE_VIOLATION)."""

import time

import pytest

import aerospike
from aerospike import exception as ex

import rawwire
from conftest import CitrinedProcess, _binary, _free_port, make_client

SECURE_TOML = """
[security]

[[namespace]]
name = "test"
"""


def _wait_refusing(server, timeout=20.0):
    """Ready once an unauthenticated info request is answered ERROR:80."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        if not server.alive():
            break
        try:
            last = rawwire.info_raw(server.host, server.port, ["node"], timeout=1.0)
            return last
        except OSError as error:
            last = repr(error)
        time.sleep(0.05)
    pytest.fail(f"secure citrined not ready: {last!r}\n{server.stderr_text()}", pytrace=False)


@pytest.fixture(scope="module")
def secure(tmp_path_factory):
    logdir = tmp_path_factory.mktemp("citrined-secure")
    config = logdir / "secure.toml"
    config.write_text(SECURE_TOML)
    server = CitrinedProcess(_binary(), _free_port(), logdir / "citrined.stderr",
                             ["--config", str(config)])
    server.first_info = _wait_refusing(server)
    yield server
    server.stop()


def test_unauthenticated_requests_are_refused(secure):
    assert secure.first_info == b"ERROR:80:not authenticated\n"
    with pytest.raises(ex.AerospikeError) as refused:
        make_client(secure)
    assert refused.value.code == 80
    with pytest.raises(ex.AerospikeError) as wrong:
        make_client(secure, user="admin", password="not-admin")
    assert wrong.value.code in (60, 65)


def test_admin_creates_a_reader_who_is_refused_writes(secure):
    admin = make_client(secure, user="admin", password="admin")
    try:
        # The default admin administers users and reads and writes data
        # (roles user-admin and read-write: issue 41's check), but it may not
        # change the node's configuration (sys-admin).
        admin.put(("test", "acl", "k"), {"a": 1})
        assert admin.get(("test", "acl", "k"))[2] == {"a": 1}
        with pytest.raises(ex.AerospikeError) as violation:
            admin.info_all("set-config:context=service;migrate-sleep=1")
        assert violation.value.code == 81
        admin.admin_create_user("reader", "pw-reader", ["read"])
        admin.admin_create_user("writer", "pw-writer", ["read-write"])
        assert admin.admin_query_user_info("reader")["roles"] == ["read"]
        users = admin.admin_query_users_info()
        assert {"admin", "reader", "writer"} <= set(users)
        writer = make_client(secure, user="writer", password="pw-writer")
        writer.put(("test", "acl", "k"), {"a": 1})
        writer.close()
        reader = make_client(secure, user="reader", password="pw-reader")
        try:
            assert reader.get(("test", "acl", "k"))[2] == {"a": 1}
            with pytest.raises(ex.AerospikeError) as refused:
                reader.put(("test", "acl", "k"), {"a": 2})
            assert refused.value.code == 81
            # Nor may it administer users.
            with pytest.raises(ex.AerospikeError) as denied:
                reader.admin_create_user("eve", "pw", ["read-write"])
            assert denied.value.code == 81
        finally:
            reader.close()
        admin.admin_drop_user("writer")
        with pytest.raises(ex.AerospikeError) as gone:
            make_client(secure, user="writer", password="pw-writer")
        assert gone.value.code == 60
    finally:
        admin.close()


def test_roles_scoped_to_a_set(secure):
    admin = make_client(secure, user="admin", password="admin")
    try:
        admin.admin_create_role("acl-set-writer", [
            {"code": aerospike.PRIV_READ_WRITE, "ns": "test", "set": "mine"},
        ])
        role = admin.admin_query_role("acl-set-writer")
        assert role == [{"code": aerospike.PRIV_READ_WRITE, "ns": "test", "set": "mine"}]
        admin.admin_create_user("scoped", "pw-scoped", ["acl-set-writer"])
        scoped = make_client(secure, user="scoped", password="pw-scoped")
        try:
            scoped.put(("test", "mine", "k"), {"b": 1})
            with pytest.raises(ex.AerospikeError) as refused:
                scoped.put(("test", "other", "k"), {"b": 1})
            assert refused.value.code == 81
        finally:
            scoped.close()
    finally:
        admin.close()


def test_admin_changes_its_password(secure):
    admin = make_client(secure, user="admin", password="admin")
    admin.admin_change_password("admin", "admin2")
    admin.close()
    with pytest.raises(ex.AerospikeError):
        make_client(secure, user="admin", password="admin")
    again = make_client(secure, user="admin", password="admin2")
    again.admin_change_password("admin", "admin")
    again.close()


def _start_secure(logdir, name, extra=()):
    config = logdir / "secure.toml"
    config.write_text(SECURE_TOML)
    server = CitrinedProcess(_binary(), _free_port(), logdir / f"{name}.stderr",
                             ["--config", str(config)] + list(extra))
    server.first_info = _wait_refusing(server)
    return server


def test_users_are_kept_across_a_restart(tmp_path):
    work = tmp_path / "work"
    first = _start_secure(tmp_path, "first", ["--data-dir", str(work)])
    try:
        admin = make_client(first, user="admin", password="admin")
        admin.admin_create_user("kept", "pw-kept", ["read"])
        admin.close()
    finally:
        first.stop()
    assert (work / "security.smd").is_file()
    second = _start_secure(tmp_path, "second", ["--data-dir", str(work)])
    try:
        kept = make_client(second, user="kept", password="pw-kept")
        kept.close()
    finally:
        second.stop()


def test_batch_rows_are_checked_one_by_one(secure):
    from aerospike_helpers.batch import records as br
    from aerospike_helpers.operations import operations as op
    admin = make_client(secure, user="admin", password="admin")
    admin.admin_create_user("batch-w", "pw", ["read-write"])
    admin.admin_create_user("batch-r", "pw", ["read"])
    admin.close()
    writer = make_client(secure, user="batch-w", password="pw")
    writer.put(("test", "batch", "a"), {"x": 1})
    writer.close()
    reader = make_client(secure, user="batch-r", password="pw")
    try:
        answer = reader.batch_write(br.BatchRecords([
            br.Read(("test", "batch", "a"), [op.read("x")]),
            br.Write(("test", "batch", "b"), [op.write("x", 2)]),
        ]))
        rows = [(row.result, row.record[2] if row.record else None)
                for row in answer.batch_records]
        assert rows == [(0, {"x": 1}), (81, None)]
    finally:
        reader.close()
