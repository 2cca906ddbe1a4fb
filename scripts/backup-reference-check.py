#!/usr/bin/env python3
"""Backup files between Citrine and the reference server, both ways.

On demand (needs a running citrined, the reference server and a fresh
citrined; not in CI):

    python3 scripts/backup-reference-check.py CITRINE_A REFERENCE CITRINE_B

with each server as HOST:PORT. Through the official Python client it writes
records of every particle type (user keys, TTLs, a second generation), a
secondary index and a UDF module to CITRINE_A; `citrine backup` writes them
to a file and `citrine restore` puts the file into REFERENCE; the Python
client reads both back and compares every record. Then the other way:
`citrine backup` from REFERENCE (its scans, sindex-list and udf-list) into a
second file, restored into CITRINE_B and compared again. The `citrine`
binary is $CITRINE (default target/debug/citrine).
"""

import os
import shutil
import subprocess
import sys
import tempfile

import aerospike
from aerospike_helpers.operations import hll_operations

NS = "test"
SET = "bk"
MODULE = "bkcheck.lua"
SOURCE = b"function one(rec)\n  return 1\nend\n"


# The client copies a module it registers into its Lua user path (default:
# the current directory); keep that copy out of the repository.
LUA_PATH = tempfile.mkdtemp(prefix="backup-reference-check-")


def client(host):
    name, port = host.rsplit(":", 1)
    config = {"hosts": [(name, int(port))], "lua": {"user_path": LUA_PATH}}
    return aerospike.client(config).connect()


def populate(c):
    geo = aerospike.GeoJSON({"type": "Point", "coordinates": [-122.5, 37.7]})
    send = {"key": aerospike.POLICY_KEY_SEND}
    every = {
        "int": -7,
        "big": 2**62,
        "float": 0.1,
        "str": "héllo wörld\nline two",
        "blob": bytearray(b"\x00\x01 \n\xff"),
        "bool": True,
        "list": [1, "x", 2.5, [True, None]],
        "map": {"a": 1, "b": {"c": [1, 2]}},
        "geo": geo,
    }
    c.put((NS, SET, "every-type"), every, policy=send)
    c.operate((NS, SET, "every-type"), [hll_operations.hll_add("hll", ["a", "b", "c"], 8)], policy=send)
    c.put((NS, SET, 42), {"n": 42}, meta={"ttl": 86400}, policy=send)
    c.put((NS, SET, bytearray(b"\x01\x02")), {"n": 1}, policy=send)
    for n in range(100):
        c.put((NS, None, "plain-%d" % n), {"n": n, "s": "v" * (n % 7)})
    try:
        c.index_integer_create(NS, SET, "n", "bk_by_n")
    except aerospike.exception.IndexFoundError:
        pass
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, MODULE)
        with open(path, "wb") as f:
            f.write(SOURCE)
        c.udf_put(path)


def snapshot(c):
    out = {}

    def take(record):
        key, meta, bins = record
        geo = bins.get("geo")
        if geo is not None:
            bins["geo"] = geo.dumps()
        ttl = meta["ttl"]
        never = ttl in (0, 0xFFFFFFFF, -1)
        out[bytes(key[3])] = (key[2], bins, "never" if never else ttl // 10)

    c.scan(NS, None).foreach(take)
    return out


def compare(what, before, after):
    assert len(before) == len(after), "%s: %d records, then %d" % (what, len(before), len(after))
    for digest, (key, bins, ttl) in before.items():
        assert digest in after, "%s: record %r missing" % (what, key)
        key2, bins2, ttl2 = after[digest]
        assert key == key2, "%s: key %r became %r" % (what, key, key2)
        assert bins == bins2, "%s: %r: %r became %r" % (what, key, bins, bins2)
        assert ttl == ttl2 or "never" not in (ttl, ttl2), "%s: %r ttl %r vs %r" % (what, key, ttl, ttl2)
    print("%s: %d records identical (keys, bins, TTLs)" % (what, len(before)))


def has_index_and_module(what, c, host):
    listing = c.info_all("sindex-list:ns=%s" % NS)
    assert any("bk_by_n" in str(answer) for answer in listing.values()), (what, listing)
    assert any(m["name"] == MODULE for m in c.udf_list()), (what, c.udf_list())
    print("%s: index bk_by_n and module %s present" % (what, MODULE))


def citrine(*args):
    binary = os.environ.get("CITRINE", "target/debug/citrine")
    done = subprocess.run([binary, *args], capture_output=True, text=True)
    print("$ citrine " + " ".join(args) + "\n" + done.stdout + done.stderr, end="")
    assert done.returncode == 0, done.returncode


def main():
    a, ref, b = sys.argv[1:4]
    ca, cr, cb = client(a), client(ref), client(b)
    populate(ca)
    original = snapshot(ca)
    with tempfile.TemporaryDirectory() as d:
        first = os.path.join(d, "from-citrine.asb")
        citrine("backup", "-h", a, "-n", NS, "-o", first)
        with open(first, "rb") as f:
            assert f.read(12) == b"Version 3.1\n"
        citrine("restore", "-h", ref, "-i", first)
        compare("Citrine -> file -> reference", original, snapshot(cr))
        has_index_and_module("reference", cr, ref)
        second = os.path.join(d, "from-reference.asb")
        citrine("backup", "-h", ref, "-n", NS, "-o", second, "-z", "zstd")
        citrine("restore", "-h", b, "-i", second)
        compare("reference -> file -> Citrine", original, snapshot(cb))
        has_index_and_module("Citrine", cb, b)
    shutil.rmtree(LUA_PATH, ignore_errors=True)
    print("OK")


if __name__ == "__main__":
    main()
