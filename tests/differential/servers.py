"""The two servers a differential run compares: a fresh `citrined` and the
reference server (Aerospike CE, started through its `run.sh PORT WORKDIR`).

Owns their processes: each `start()` begins from an empty work directory (so
both servers start empty), `ready()` waits until a client can read through
it, `stop()` ends the process it started (and nothing else). A server is
restarted by the driver when the run has used as many set names as the
smaller of the two servers' set limits allows (sets are never freed)."""

import os
import shutil
import socket
import subprocess
import time

import aerospike

READY_TIMEOUT_S = 60.0
CLIENT_TIMEOUT_MS = 10000


def client_config(port):
    """The client configuration used against either server: generous
    timeouts (a 2-core machine runs both servers and the client) and no
    retries, so an answer is the server's first answer."""
    policy = {"total_timeout": CLIENT_TIMEOUT_MS, "socket_timeout": CLIENT_TIMEOUT_MS,
              "max_retries": 0}
    return {
        "hosts": [("127.0.0.1", port)],
        "policies": {name: dict(policy) for name in
                     ("read", "write", "operate", "remove", "apply", "batch",
                      "scan", "query")}
        | {"info": {"timeout": CLIENT_TIMEOUT_MS}},
    }


def port_open(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


class Server:
    """One server process on 127.0.0.1:port (fabric port+1, heartbeat
    port+2), logging to WORKDIR/stdout.log."""

    name = "server"

    def __init__(self, port, workdir):
        self.port = port
        self.workdir = workdir
        self.proc = None
        self.client = None

    def argv(self):
        raise NotImplementedError

    def start(self):
        shutil.rmtree(self.workdir, ignore_errors=True)
        os.makedirs(self.workdir)
        if port_open(self.port):
            raise RuntimeError(f"{self.name}: port {self.port} is already in use")
        log = open(os.path.join(self.workdir, "stdout.log"), "wb")
        self.proc = subprocess.Popen(self.argv(), stdin=subprocess.DEVNULL,
                                     stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.client = self._wait_ready()

    def _wait_ready(self):
        """Waits until a client connects and a read of an absent record
        answers (the reference accepts connections before its partitions
        are balanced); returns the connected client."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        last = "port not open"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with code {self.proc.returncode}: "
                                   f"{self.last_log_line()} (log: {self.workdir}/stdout.log)")
            if port_open(self.port):
                try:
                    client = aerospike.client(client_config(self.port)).connect()
                    client.exists(("test", "differential-probe", 0))
                    return client
                except aerospike.exception.AerospikeError as e:
                    last = f"{type(e).__name__}: {e}"
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"{self.name} not ready after {READY_TIMEOUT_S:.0f} s ({last})")

    def last_log_line(self):
        try:
            with open(os.path.join(self.workdir, "stdout.log"), errors="replace") as log:
                lines = [line.strip() for line in log if line.strip()]
        except OSError:
            return "no log"
        return lines[-1][-200:] if lines else "nothing logged"

    def stop(self):
        if self.client is not None:
            try:
                self.client.close()
            except aerospike.exception.AerospikeError:
                pass
            self.client = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


class Citrined(Server):
    name = "citrine"

    def __init__(self, binary, port, workdir):
        super().__init__(port, workdir)
        self.binary = binary

    def argv(self):
        return [self.binary, "--port", str(self.port), "--address", "127.0.0.1",
                "--fabric-port", str(self.port + 1), "--heartbeat-port", str(self.port + 2),
                "--data-dir", os.path.join(self.workdir, "data")]


class Reference(Server):
    name = "reference"

    def __init__(self, run_sh, port, workdir):
        super().__init__(port, workdir)
        self.run_sh = run_sh

    def argv(self):
        # run.sh execs asd in the foreground: the process we hold is asd.
        return ["bash", self.run_sh, str(self.port), os.path.join(self.workdir, "asd")]
