"""The official Python client over TLS, logged in: a node started with
examples/secure.toml (access control on; certificates from `citrine
certs`, read from `tls/` under the data directory) on a free TLS port; the
client verifies the node's certificate against the development CA, logs in
as admin/admin, writes and reads records, and finds the TLS port through
`service-tls-std`. Issue 41's check, end to end."""

import os
import socket
import ssl
import subprocess
import time
from pathlib import Path

import pytest

import aerospike
import rawwire
from conftest import CLIENT_POLICIES, REPO, CitrinedProcess, _binary, _free_port

ADMIN = {"user": "admin", "password": "admin"}


def _citrine_cli():
    """The `citrine` CLI beside the citrined under test (or $CITRINE_BIN)."""
    binary = Path(os.environ.get("CITRINE_BIN", str(_binary().parent / "citrine")))
    if not binary.is_file():
        pytest.fail(f"citrine CLI not found at {binary}; build it or set CITRINE_BIN",
                    pytrace=False)
    return binary


@pytest.fixture(scope="module")
def tls_node(tmp_path_factory):
    data = tmp_path_factory.mktemp("citrined-tls")
    subprocess.run([str(_citrine_cli()), "certs", str(data / "tls")], check=True,
                   stdout=subprocess.DEVNULL)
    tls_port = _free_port()
    server = CitrinedProcess(_binary(), _free_port(), data / "citrined.stderr",
                             ["--config", str(REPO / "examples" / "secure.toml"),
                              "--data-dir", str(data), "--tls-port", str(tls_port)])
    _wait_refusing(server)
    yield server, tls_port, data / "tls" / "ca.pem"
    server.stop()


def _wait_refusing(server, timeout=20.0):
    """Ready once an unauthenticated info request is answered (ERROR:80)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline and server.alive():
        try:
            last = rawwire.info_raw(server.host, server.port, ["node"], timeout=1.0)
            assert last == b"ERROR:80:not authenticated\n", last
            return
        except OSError as error:
            last = repr(error)
        time.sleep(0.05)
    pytest.fail(f"secure citrined not ready: {last!r}\n{server.stderr_text()}", pytrace=False)


def _tls_client(server, tls_port, cafile):
    config = {
        "hosts": [(server.host, tls_port, "localhost")],
        "tls": {"enable": True, "cafile": str(cafile)},
        "policies": dict(CLIENT_POLICIES),
        **ADMIN,
    }
    return aerospike.client(config).connect()


def test_records_written_and_read_over_tls(tls_node):
    server, tls_port, cafile = tls_node
    client = _tls_client(server, tls_port, cafile)
    try:
        big = "x" * 200_000  # spans many TLS records each way
        for i in range(50):
            client.put(("test", "tls", i), {"i": i, "big": big if i % 10 == 0 else "s"})
        for i in range(50):
            _, meta, bins = client.get(("test", "tls", i))
            assert bins["i"] == i and meta["gen"] == 1
            assert bins["big"] == (big if i % 10 == 0 else "s")
        answers = client.info_all("service-tls-std")
        (_, value), = answers.values()
        assert value.strip() == f"127.0.0.1:{tls_port}"
    finally:
        client.close()
    # What went over TLS is there for plain clients too.
    plain = aerospike.client({"hosts": [(server.host, server.port)],
                              "policies": dict(CLIENT_POLICIES), **ADMIN}).connect()
    try:
        _, _, bins = plain.get(("test", "tls", 7))
        assert bins == {"i": 7, "big": "s"}
    finally:
        plain.close()


def test_a_client_trusting_another_ca_is_refused(tls_node, tmp_path):
    server, tls_port, _ = tls_node
    subprocess.run([str(_citrine_cli()), "certs", str(tmp_path)], check=True,
                   stdout=subprocess.DEVNULL)
    with pytest.raises(aerospike.exception.AerospikeError):
        _tls_client(server, tls_port, tmp_path / "ca.pem")
    assert server.alive()


def test_python_ssl_verifies_the_node_certificate_for_localhost(tls_node):
    """The certificate `citrine certs` makes is valid for the name and the IP."""
    server, tls_port, cafile = tls_node
    context = ssl.create_default_context(cafile=str(cafile))
    for name in ("localhost", "127.0.0.1"):
        with socket.create_connection((server.host, tls_port), timeout=5) as raw:
            with context.wrap_socket(raw, server_hostname=name) as tls:
                assert tls.version() in ("TLSv1.2", "TLSv1.3")
