#!/usr/bin/env python3
"""Records what clients send a real citrined, as seeds for the
`service_requests` fuzz target.

It stands in for the citrined binary: given citrined's command line, it starts
the real server (CITRINED_REAL, default target/debug/citrined) on another
port and listens on the requested one, forwarding every connection both ways
and writing each whole client frame to RECORD_DIR in the target's input form:
kind (0 info, 1 message, 2 compressed, 3 admin), length (u16 little-endian),
body. Frames over 65 535 bytes are skipped. Duplicate frames are written once.

Use it to run the Python compatibility suite (single-node tests record; tests
that start clusters talk to the real ports and record nothing):

    RECORD_DIR=/tmp/frames CITRINED_BIN=$PWD/fuzz/record_frames.py \
        .venv/bin/python -m pytest -q tests/compat -k "not cluster"

or the Go client's suite (CITRINED_REAL then names a release build):

    RECORD_DIR=/tmp/frames CITRINED=$PWD/fuzz/record_frames.py \
        CITRINED_REAL=$PWD/target/release/citrined scripts/go-client-suite.sh

then keep the small frames and reduce them to the fewest that reach every
edge the others do (the committed seeds were made so, from both suites):

    mkdir /tmp/small /tmp/seeds
    find /tmp/frames -size -4k -exec cp -t /tmp/small {} +
    cd fuzz && cargo +nightly fuzz run -s none service_requests \
        /tmp/seeds seeds/service_requests /tmp/small -- -merge=1 -use_counters=0

and /tmp/seeds is the new seeds/service_requests.
"""

import hashlib
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

KINDS = {1: 0, 3: 1, 4: 2, 2: 3}  # proto type -> the target's kind byte


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def recv_exact(sock, count):
    data = bytearray()
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def shut_both(*socks):
    """Ends a forwarded connection both ways, whichever side finished."""
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def client_to_server(client, server, record_dir):
    try:
        while True:
            header = recv_exact(client, 8)
            if header is None:
                break
            (word,) = struct.unpack(">Q", header)
            size = word & ((1 << 48) - 1)
            body = recv_exact(client, size) if size else b""
            if body is None:
                break
            kind = KINDS.get(header[1])
            if kind is not None and size <= 0xFFFF:
                seed = bytes([kind]) + struct.pack("<H", size) + body
                name = hashlib.sha1(seed).hexdigest()
                (record_dir / name).write_bytes(seed)
            server.sendall(header + body)
    except OSError:
        pass
    finally:
        shut_both(client, server)


def server_to_client(server, client):
    try:
        while True:
            data = server.recv(65536)
            if not data:
                break
            client.sendall(data)
    except OSError:
        pass
    finally:
        shut_both(client, server)


def main():
    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    inner = free_port()
    argv[argv.index("--port") + 1] = str(inner)
    repo = Path(__file__).resolve().parents[1]
    real = os.environ.get("CITRINED_REAL", str(repo / "target" / "debug" / "citrined"))
    record_dir = Path(os.environ.get("RECORD_DIR", "/tmp/citrine-frames"))
    record_dir.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen([real] + argv)
    signal.signal(signal.SIGTERM, lambda *_: (server.terminate(), sys.exit(0)))
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    listener.settimeout(0.5)
    while server.poll() is None:
        try:
            client, _ = listener.accept()
        except socket.timeout:
            continue
        for _ in range(100):
            try:
                upstream = socket.create_connection(("127.0.0.1", inner))
                break
            except OSError:
                time.sleep(0.05)
        else:
            client.close()
            continue
        for sock in (client, upstream):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=client_to_server, args=(client, upstream, record_dir), daemon=True).start()
        threading.Thread(target=server_to_client, args=(upstream, client), daemon=True).start()
    sys.exit(server.returncode)


if __name__ == "__main__":
    main()
