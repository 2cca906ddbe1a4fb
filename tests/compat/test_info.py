"""Info commands through the official client (and a couple raw), formats per 03-info.md."""

import base64
import re

import pytest

import rawwire


def _value(command, raw):
    """info_random_node / info_single_node return the server's line `<command>\\t<value>\\n`;
    info_all returns `<value>\\n` (the client strips the echo). The exact echo is checked
    separately with a raw request."""
    assert isinstance(raw, str), raw
    assert raw.endswith("\n"), f"answer not newline-terminated: {raw!r}"
    prefix = command + "\t"
    if raw.startswith(prefix):
        raw = raw[len(prefix):]
    return raw[:-1]


def _kv(value, sep=";"):
    out = {}
    for item in value.split(sep):
        if not item:
            continue
        assert "=" in item, f"item without '=': {item!r} in {value!r}"
        k, _, v = item.partition("=")
        out[k] = v
    return out


def _one_node(client, command):
    answers = client.info_all(command)
    assert len(answers) == 1, answers
    (node, (err, raw)), = answers.items()
    assert err is None, (node, err)
    return node, _value(command, raw)


def test_info_all_namespaces(client):
    _, value = _one_node(client, "namespaces")
    assert sorted(value.split(";")) == ["bar", "test"]


def test_info_random_node_build(client):
    value = _value("build", client.info_random_node("build"))
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", value), value
    assert tuple(int(p) for p in value.split(".")) >= (4, 9, 0, 3)


def test_node_names_and_node_command(client):
    nodes = client.get_node_names()
    assert len(nodes) == 1, nodes
    name = nodes[0]["node_name"]
    assert re.fullmatch(r"[0-9A-F]+", name) and not name.startswith("0"), name
    _, value = _one_node(client, "node")
    assert value == name


def test_info_single_node_statistics(client):
    name = client.get_node_names()[0]["node_name"]
    value = _value("statistics", client.info_single_node("statistics", name))
    stats = _kv(value)
    assert stats, value


def test_info_namespace_test(client, key):
    client.put(key, {"a": 1})
    _, value = _one_node(client, "namespace/test")
    stats = _kv(value)
    assert "objects" in stats, sorted(stats)
    assert int(stats["objects"]) >= 1
    assert "replication-factor" in stats, sorted(stats)


def test_info_namespace_unknown(client):
    _, value = _one_node(client, "namespace/nosuchns")
    assert value == "type=unknown"


def test_info_sets_counts_objects(client, make_key, set_name):
    for i in range(3):
        client.put(make_key(i), {"a": i})
    _, value = _one_node(client, "sets")
    entries = [e for e in value.split(";") if e]
    mine = [e for e in entries if f":set={set_name}:" in e]
    assert len(mine) == 1, value[:2000]
    props = _kv(mine[0], ":")
    assert props["ns"] == "test"
    assert int(props["objects"]) == 3
    # sets/<ns>/<set>: only this set's properties
    _, value2 = _one_node(client, f"sets/test/{set_name}")
    props2 = _kv(value2.rstrip(";"), ":")
    assert int(props2["objects"]) == 3
    client.remove(make_key(0))
    _, value3 = _one_node(client, f"sets/test/{set_name}")
    assert int(_kv(value3.rstrip(";"), ":")["objects"]) == 2


def test_info_get_config_namespace(client):
    _, value = _one_node(client, "get-config:context=namespace;namespace=test")
    cfg = _kv(value)
    assert cfg.get("default-ttl") == "0", value


def test_info_cluster_stable(client):
    _, value = _one_node(client, "cluster-stable:")
    assert re.fullmatch(r"[0-9A-Fa-f]+", value), value
    stats = _kv(_one_node(client, "statistics")[1])
    if "cluster_key" in stats:
        assert stats["cluster_key"] == value


def test_info_features_contains_pscans(client):
    _, value = _one_node(client, "features")
    feats = value.split(";")
    for f in ("pscans", "pquery", "float", "geo"):
        assert f in feats, value


def test_info_replicas_format(client):
    _, value = _one_node(client, "replicas")
    per_ns = dict(item.split(":", 1) for item in value.split(";"))
    assert set(per_ns) == {"test", "bar"}, value[:200]
    for ns, spec in per_ns.items():
        regime, n_repl, *cols = spec.split(",")
        assert regime == "0" and int(n_repl) >= 1 and len(cols) == int(n_repl), spec[:50]
        assert len(cols[0]) == 684
        assert base64.b64decode(cols[0]) == b"\xff" * 512


def test_info_peers_and_generations(client):
    _, peers = _one_node(client, "peers-clear-std")
    gen, port, rest = peers.split(",", 2)
    assert int(gen) >= 0 and port == "3000" and rest == "[]", peers
    _, pgen = _one_node(client, "partition-generation")
    assert int(pgen) >= 0


def test_info_raw_echo_and_multiple_commands(citrined):
    body = rawwire.info_raw(citrined.host, citrined.port, ["node", "build", "namespaces"])
    lines = body.decode().split("\n")
    assert lines[-1] == ""  # newline-terminated
    assert [line.split("\t", 1)[0] for line in lines[:-1]] == ["node", "build", "namespaces"]


def test_info_unknown_command(citrined):
    answer = rawwire.info(citrined.host, citrined.port, ["no-such-command-xyz"])
    assert "no-such-command-xyz" in answer
    value = answer["no-such-command-xyz"]
    assert value == "" or value.startswith("ERROR:"), value


def test_truncate_with_an_empty_set_name_removes_nothing(citrined, client, set_name):
    """`truncate:namespace=NS;set=` once answered ok and emptied the whole
    namespace; the reference refuses it (4), and an empty value is never
    taken as "everything" (issue 46, item 1)."""
    keys = [("test", set_name, i) for i in range(5)]
    for k in keys:
        client.put(k, {"v": 1})
    for command, expected in [
        ("truncate:namespace=test;set=", "ERROR:4:missing 'set' value"),
        ("truncate:namespace=test", "ERROR:4:missing 'set'"),
        ("truncate:namespace=;set=" + set_name, "ERROR:20:missing 'namespace' value"),
        ("truncate-namespace:namespace=", "ERROR:20:missing 'namespace' value"),
        ("truncate:namespace=test;set=%s;lut=2147483649" % set_name,
         "ERROR:4:would truncate to 0"),
        # A namespace the node does not have: ok, nothing happens.
        ("truncate:namespace=nope;set=" + set_name, "ok"),
    ]:
        answer = rawwire.info(citrined.host, citrined.port, [command])
        assert answer == {command: expected}, command
    for k in keys:
        _, meta, bins = client.get(k)
        assert bins == {"v": 1}, k
