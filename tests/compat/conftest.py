"""Fixtures for the Python compatibility suite.

A real `citrined` process is started once per test session on a free loopback
port; the official Aerospike Python client (C client underneath) connects to it.

Environment:
  CITRINED_BIN   path of the server binary (default <repo>/target/release/citrined)
  CITRINED_ARGS  extra command-line arguments for the server (split on spaces)
"""

import atexit
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

import aerospike

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rawwire  # noqa: E402  (helper module next to this file)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_BIN = REPO / "target" / "release" / "citrined"
STARTUP_TIMEOUT_S = 20.0
NS = "test"

# Generous per-command timeouts: the suite runs on small (2-core) machines.
CLIENT_POLICIES = {
    "read": {"total_timeout": 5000, "socket_timeout": 5000},
    "write": {"total_timeout": 5000, "socket_timeout": 5000},
    "operate": {"total_timeout": 5000, "socket_timeout": 5000},
    "remove": {"total_timeout": 5000, "socket_timeout": 5000},
    "info": {"timeout": 5000},
}


_handed_out = set()


def _free_port():
    """A free port below the kernel's ephemeral range (32768-60999), as the
    Rust tests choose them (crates/citrine-testsupport): a port from the
    ephemeral range can be taken by any outgoing connection, even by the
    readiness probe connecting to itself, before citrined binds it."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(1000):
        port = rng.randrange(20000, 32000)
        if port in _handed_out:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
                tcp.bind(("127.0.0.1", port))
                udp.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port in 20000-32000")


class CitrinedProcess:
    def __init__(self, binary, port, stderr_path, extra_args=()):
        self.binary = binary
        self.host = "127.0.0.1"
        self.port = port
        self.stderr_path = stderr_path
        extra = os.environ.get("CITRINED_ARGS", "").split()
        self.argv = ([str(binary), "--port", str(port), "--address", self.host,
                      "--fabric-port", str(_free_port()),
                      "--heartbeat-port", str(_free_port())]
                     + list(extra_args) + extra)
        self._stderr = open(stderr_path, "wb")
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._stderr,
            stderr=self._stderr,
        )

    def stderr_text(self, limit=8000):
        try:
            data = Path(self.stderr_path).read_bytes()
        except OSError:
            return "<no stderr captured>"
        text = data.decode("utf-8", "replace")
        if len(text) > limit:
            text = "...\n" + text[-limit:]
        return text

    def alive(self):
        return self.proc.poll() is None

    def wait_ready(self, timeout):
        """Wait until the port accepts TCP and answers an info `node` request."""
        deadline = time.monotonic() + timeout
        last_err = None
        while time.monotonic() < deadline:
            if not self.alive():
                return False, f"citrined exited with code {self.proc.returncode}"
            try:
                answer = rawwire.info(self.host, self.port, ["node"], timeout=1.0)
                if answer.get("node"):
                    return True, None
                last_err = f"empty 'node' info answer: {answer!r}"
            except OSError as e:
                last_err = repr(e)
            except Exception as e:  # malformed answer: keep waiting, report it
                last_err = repr(e)
            time.sleep(0.05)
        return False, f"not ready after {timeout:.0f}s (last error: {last_err})"

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self._stderr.close()


def _binary():
    binary = Path(os.environ.get("CITRINED_BIN", str(DEFAULT_BIN)))
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.fail(
            f"citrined binary not found/executable at {binary}; "
            "build it with `cargo build --release -p citrine-server` or set CITRINED_BIN",
            pytrace=False,
        )
    return binary


def start_citrined(logdir, extra_args=()):
    """Start citrined on a free loopback port; return a ready CitrinedProcess or fail."""
    binary = _binary()
    errors = []
    for attempt in range(3):  # a free port can be taken between probe and bind
        port = _free_port()
        server = CitrinedProcess(binary, port, logdir / f"citrined-{attempt}.stderr",
                                 extra_args)
        ok, err = server.wait_ready(STARTUP_TIMEOUT_S)
        if ok:
            return server
        errors.append(f"attempt {attempt + 1} ({' '.join(server.argv)}): {err}\n"
                      f"--- citrined stderr ---\n{server.stderr_text()}")
        server.stop()
        if "not ready after" in err:
            break  # a hang will not be cured by another port
    pytest.fail("citrined did not start:\n" + "\n".join(errors), pytrace=False)


@pytest.fixture(scope="session")
def citrined(tmp_path_factory):
    """The default server: no config file, namespaces `test` and `bar` in memory."""
    server = start_citrined(tmp_path_factory.mktemp("citrined"))
    yield server
    server.stop()


# Namespaces of the configured server (see `citrined_configured`).
CONFIGURED_TOML = """
[[namespace]]
name = "test"

[[namespace]]
name = "ttl1h"
default-ttl = "1h"
nsup-period = "10s"
max-record-size = "128K"
"""


@pytest.fixture(scope="session")
def citrined_configured(tmp_path_factory):
    """A second server started with --config: namespace `ttl1h` has default-ttl 1 h and
    max-record-size 128 KiB."""
    logdir = tmp_path_factory.mktemp("citrined-configured")
    cfg = logdir / "citrine.toml"
    cfg.write_text(CONFIGURED_TOML)
    server = start_citrined(logdir, ["--config", str(cfg)])
    yield server
    server.stop()


# Where the clients look for Lua modules to run the last step of an
# aggregation locally. The C client under the Python one reads this setting
# once per process, from the first client made, so every client gets it.
LUA_USER_PATH = Path(tempfile.mkdtemp(prefix="citrine-compat-lua-"))
atexit.register(shutil.rmtree, LUA_USER_PATH, True)


def make_client(server, **extra):
    config = {
        "hosts": [(server.host, server.port)],
        "policies": dict(CLIENT_POLICIES),
        "lua": {"user_path": str(LUA_USER_PATH)},
    }
    config.update(extra)
    return aerospike.client(config).connect()


@pytest.fixture(scope="session")
def client(citrined):
    try:
        c = make_client(citrined)
    except Exception as e:
        pytest.fail(
            f"official client could not connect to citrined on port {citrined.port}: {e!r}\n"
            f"--- citrined stderr ---\n{citrined.stderr_text()}",
            pytrace=False,
        )
    yield c
    try:
        c.close()
    except Exception:
        pass


@pytest.fixture
def client_factory(citrined):
    """Build extra clients with a custom config; closed at test end."""
    made = []

    def factory(**extra):
        c = make_client(citrined, **extra)
        made.append(c)
        return c

    yield factory
    for c in made:
        try:
            c.close()
        except Exception:
            pass


@pytest.fixture(autouse=True)
def _server_still_alive(request):
    """Fail loudly (with the server's stderr) if citrined died during a test."""
    yield
    for name in ("citrined", "citrined_configured"):
        if name not in request.fixturenames:
            continue
        server = request.getfixturevalue(name)
        if not server.alive():
            pytest.fail(
                f"citrined died (exit code {server.proc.returncode}) during this test\n"
                f"--- citrined stderr ---\n{server.stderr_text()}",
                pytrace=False,
            )


@pytest.fixture
def set_name():
    """A set name unique to this test, so tests never see each other's records."""
    return "s" + uuid.uuid4().hex[:16]


@pytest.fixture
def key(set_name):
    return (NS, set_name, "k-" + uuid.uuid4().hex[:8])


@pytest.fixture
def make_key(set_name):
    def mk(user_key, ns=NS):
        return (ns, set_name, user_key)

    return mk
