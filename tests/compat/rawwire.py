"""Minimal raw Aerospike wire helpers (no official client involved).

Used for two things the official client cannot show:
  * the server's readiness probe (info `node`) in conftest, and
  * requests that the official client refuses to send because it validates them
    locally (unknown namespace, over-long bin name), so the server's own result code
    can be checked. Layouts follow shared/protocol 01/02/03.
"""

import socket
import struct

PROTO_VERSION = 2
TYPE_INFO = 1
TYPE_MSG = 3

INFO1_READ = 0x01
INFO1_GET_ALL = 0x02
INFO2_WRITE = 0x01

OP_READ = 1
OP_WRITE = 2

PT_INTEGER = 1
PT_STRING = 3


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(buf)} of {n} bytes")
        buf += chunk
    return bytes(buf)


def _frame(msg_type, body):
    return struct.pack(">Q", (PROTO_VERSION << 56) | (msg_type << 48) | len(body)) + body


def roundtrip(host, port, msg_type, body, timeout=3.0):
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(_frame(msg_type, body))
        (hdr,) = struct.unpack(">Q", _recv_exact(s, 8))
        rtype = (hdr >> 48) & 0xFF
        size = hdr & 0xFFFFFFFFFFFF
        return rtype, _recv_exact(s, size)


def info_raw(host, port, commands, timeout=3.0):
    """Send info commands; return the raw response body (bytes)."""
    body = "".join(c + "\n" for c in commands).encode()
    rtype, resp = roundtrip(host, port, TYPE_INFO, body, timeout)
    if rtype != TYPE_INFO:
        raise ValueError(f"info answered with proto type {rtype}")
    return resp


def info(host, port, commands, timeout=3.0):
    """Send info commands; return {echoed command: value}."""
    text = info_raw(host, port, commands, timeout).decode("utf-8", "replace")
    out = {}
    for line in text.split("\n"):
        if not line:
            continue
        name, sep, value = line.partition("\t")
        out[name] = value if sep else None
    return out


def digest_for(set_name, user_key):
    """Digest per 02 §5, computed with the official client (authoritative)."""
    import aerospike

    return bytes(aerospike.calc_digest("ignored", set_name, user_key))


def field(ftype, data):
    return struct.pack(">IB", len(data) + 1, ftype) + data


def op(op_type, particle, name, value=b""):
    name_b = name.encode()
    return struct.pack(">IBBBB", 4 + len(name_b) + len(value), op_type, particle, 0,
                       len(name_b)) + name_b + value


def as_msg(info1, info2, info3, fields, ops, generation=0, ttl=0, txn_ttl=1000):
    hdr = struct.pack(">BBBBBBIIIHH", 22, info1, info2, info3, 0, 0, generation, ttl,
                      txn_ttl, len(fields), len(ops))
    return hdr + b"".join(fields) + b"".join(ops)


def parse_as_msg(body):
    """Return dict(result_code, generation, void_time, n_fields, n_ops, ops=[(type, particle, name, value)])."""
    (hsz, info1, info2, info3, info4, rc, gen, void_time, _txn, n_fields,
     n_ops) = struct.unpack(">BBBBBBIIIHH", body[:22])
    off = 22
    for _ in range(n_fields):
        (sz,) = struct.unpack(">I", body[off:off + 4])
        off += 4 + sz
    ops = []
    for _ in range(n_ops):
        (sz, otype, particle, _flags, nlen) = struct.unpack(">IBBBB", body[off:off + 8])
        name = body[off + 8:off + 8 + nlen].decode("utf-8", "replace")
        value = body[off + 8 + nlen:off + 4 + sz]
        ops.append((otype, particle, name, value))
        off += 4 + sz
    return {"result_code": rc, "generation": gen, "void_time": void_time,
            "n_fields": n_fields, "n_ops": n_ops, "ops": ops, "info3": info3}


def key_field_value(user_key):
    """KEY field payload (02 §3.2): particle type byte + value."""
    if isinstance(user_key, int):
        return bytes([PT_INTEGER]) + int_value(user_key)
    if isinstance(user_key, str):
        return bytes([PT_STRING]) + user_key.encode()
    return bytes([4]) + bytes(user_key)


def command(host, port, ns, set_name, user_key, info1, info2, info3=0, ops=(),
            generation=0, ttl=0, send_key=None):
    """One single-record command. The digest is always that of `user_key`; `send_key`,
    if given, is sent in a KEY field (it may deliberately differ from `user_key`)."""
    fields = [field(0, ns.encode()), field(1, set_name.encode()),
              field(4, digest_for(set_name, user_key))]
    if send_key is not None:
        fields.append(field(2, key_field_value(send_key)))
    body = as_msg(info1, info2, info3, fields, list(ops), generation=generation, ttl=ttl)
    rtype, resp = roundtrip(host, port, TYPE_MSG, body)
    if rtype != TYPE_MSG:
        raise ValueError(f"AS_MSG answered with proto type {rtype}")
    return parse_as_msg(resp)


def int_value(v):
    return struct.pack(">q", v)


class Connection:
    """A persistent connection for pipelined AS_MSG requests (01: in-order per socket)."""

    def __init__(self, host, port, timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)

    def close(self):
        self.sock.close()

    def pipeline(self, bodies):
        self.sock.sendall(b"".join(_frame(TYPE_MSG, b) for b in bodies))
        out = []
        for _ in bodies:
            (hdr,) = struct.unpack(">Q", _recv_exact(self.sock, 8))
            out.append(parse_as_msg(_recv_exact(self.sock, hdr & 0xFFFFFFFFFFFF)))
        return out


def request_body(ns, set_name, user_key, info1, info2, info3=0, ops=(), generation=0, ttl=0):
    fields = [field(0, ns.encode()), field(1, set_name.encode()),
              field(4, digest_for(set_name, user_key))]
    return as_msg(info1, info2, info3, fields, list(ops), generation=generation, ttl=ttl)
