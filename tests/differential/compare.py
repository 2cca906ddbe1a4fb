"""Answers and their comparison.

`run_step` evaluates a step's source against one server and returns its
answer in a normal form: an error is `("error", code, exception class)`;
a value is a tree of `(tag, ...)` tuples in which every Python value keeps
its type (1, 1.0 and True differ), a key-ordered map keeps its order, an
unordered map does not (its entries are sorted), and record metadata is
`("meta", generation, Ttl)` where `Ttl` compares equal within
`TTL_TOLERANCE_S` (the two servers answer a few milliseconds apart, across a
second boundary at worst). Info answers are normalised per command
(`normalise_info`): what must differ between two servers' implementations
(storage sizes, timestamps) is reduced to what the client may rely on.

`classify` names a difference coarsely ("26 vs ok", "generation", "map
keys", "record 4 vs 17" for a batch record's code): the signature a shrink
must keep and the unit the report groups by."""

import re
import time

import aerospike
from aerospike_helpers import HyperLogLog
from aerospike_helpers.batch import records as br

TTL_TOLERANCE_S = 3
# The reference's truncate_lut and last-update times count milliseconds
# from 2010-01-01 (the "citrusleaf epoch").
CITRUSLEAF_EPOCH_MS = 1262304000000


class Ttl:
    """A remaining TTL in seconds, equal to another within the tolerance."""

    __slots__ = ("seconds",)
    __hash__ = None

    def __init__(self, seconds):
        self.seconds = seconds

    def __eq__(self, other):
        return isinstance(other, Ttl) and abs(self.seconds - other.seconds) <= TTL_TOLERANCE_S

    def __repr__(self):
        return f"ttl={self.seconds}"


def run_step(env, code):
    """The normalised answer of one evaluation of `code` in `env`."""
    try:
        value = eval(code, env)
    except aerospike.exception.AerospikeError as e:
        return ("error", e.code, type(e).__name__)
    except Exception as e:  # the client refused the call before sending it
        return ("client-exception", type(e).__name__, str(e)[:200])
    return norm(value)


def norm(v):
    """A comparable form of a client answer (see the module doc)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return ("bool", v)
    if isinstance(v, int):
        return ("int", v)
    if isinstance(v, float):
        return ("float", repr(v))
    if isinstance(v, str):
        return ("str", v)
    if isinstance(v, HyperLogLog):
        return ("hll", bytes(v))
    if isinstance(v, (bytes, bytearray)):
        return (type(v).__name__, bytes(v))
    if isinstance(v, aerospike.GeoJSON):
        return ("geo", v.dumps())
    if isinstance(v, aerospike.KeyOrderedDict):
        return ("ordered-map",) + tuple((norm(k), norm(x)) for k, x in v.items())
    if isinstance(v, dict):
        return _norm_dict(v)
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(norm(x) for x in v)
    if isinstance(v, br.BatchRecords):
        return ("batch", v.result) + tuple(
            ("record", r.result, norm(r.key), norm(r.record), r.in_doubt)
            for r in v.batch_records)
    return ("other", type(v).__name__, repr(v))


def _norm_dict(v):
    if set(v) == {"gen", "ttl"}:  # record metadata
        return ("meta", v["gen"], Ttl(v["ttl"]))
    items = [(norm(k), norm(x)) for k, x in v.items()]
    return ("map",) + tuple(sorted(items, key=repr))


def normalise_info(label, answer):
    """What of an info answer two servers must agree on: for `sets/NS/SET`
    the statistics without the storage size (an implementation's own) and
    with truncate_lut as "0", "recent" (within 10 minutes, counted in
    milliseconds from 2010 as the reference counts it) or "other"; the
    separators are kept as answered."""
    if label != "info sets" or answer is None or answer[0] != "str":
        return answer
    now_ms = time.time() * 1000 - CITRUSLEAF_EPOCH_MS

    def lut(match):
        value = int(match.group(1))
        kind = "0" if value == 0 else ("recent" if abs(now_ms - value) < 600000 else "other")
        return "truncate_lut=" + kind

    text = re.sub(r"data_used_bytes=\d+[:;]?", "", answer[1])
    return ("sets", re.sub(r"truncate_lut=(\d+)", lut, text))


def is_error(answer):
    return isinstance(answer, tuple) and answer and answer[0] in ("error", "client-exception")


def outcome_name(answer):
    if is_error(answer):
        return str(answer[1]) if answer[0] == "error" else "client exception"
    return "ok"


def first_difference(a, b):
    """The first place two normalised answers differ: (a_part, b_part, kind)."""
    if type(a) is not type(b):
        return a, b, "type"
    if isinstance(a, Ttl):
        return (a, b, "ttl") if a != b else None
    if not isinstance(a, tuple):
        return (a, b, "value") if a != b else None
    if not a or not b or a[0] != b[0]:
        return (a, b, "type") if a != b else None
    tag = a[0]
    if tag == "meta":
        if a[1] != b[1]:
            return a, b, "generation"
        return (a, b, "ttl") if a[2] != b[2] else None
    if tag == "map" and [k for k, _ in a[1:]] != [k for k, _ in b[1:]]:
        return a, b, "map keys"
    if len(a) != len(b):
        return a, b, "length"
    for x, y in zip(a[1:], b[1:]):
        found = first_difference(x, y)
        if found:
            return found
    return None


def same(a, b):
    return first_difference(a, b) is None


def classify(a, b):
    """A coarse name of how answer a (Citrine) differs from b (reference)."""
    if is_error(a) or is_error(b):
        return f"{outcome_name(a)} vs {outcome_name(b)}"
    record_codes = _batch_record_codes(a, b)
    if record_codes:
        return record_codes
    found = first_difference(a, b)
    return found[2] if found else "same"


def _batch_record_codes(a, b):
    """For two batch answers whose records' result codes differ, the first
    such pair ("record 4 vs 17"), else None."""
    if not (a and b and a[0] == "batch" == b[0] and len(a) == len(b)):
        return None
    for x, y in zip(a[2:], b[2:]):
        if x[1] != y[1]:
            return f"record {x[1]} vs {y[1]}"
    return None


def describe(answer, limit=600):
    """A readable one-line form of a normalised answer."""
    if is_error(answer):
        if answer[0] == "error":
            return f"error {answer[1]} ({answer[2]})"
        return f"client exception {answer[1]}: {answer[2]}"
    text = "ok " + _plain(answer)
    return text if len(text) <= limit else text[:limit] + " ..."


def _plain(v):
    if not isinstance(v, tuple):
        return repr(v)
    tag, rest = v[0], v[1:]
    if tag in ("int", "float"):
        return str(rest[0])
    if tag in ("str", "bool", "bytes", "sets"):
        return repr(rest[0])
    if tag == "bytearray":
        return "<digest>" if len(rest[0]) == 20 else f"bytearray({rest[0]!r})"
    if tag in ("hll", "geo"):
        return f"{tag}({rest[0]!r})"
    if tag == "meta":
        return f"{{gen={rest[0]}, {rest[1]!r}}}"
    if tag in ("map", "ordered-map"):
        body = ", ".join(f"{_plain(k)}: {_plain(x)}" for k, x in rest)
        return ("ordered" if tag == "ordered-map" else "") + "{" + body + "}"
    if tag == "list":
        return "[" + ", ".join(_plain(x) for x in rest) + "]"
    if tag == "tuple":
        return "(" + ", ".join(_plain(x) for x in rest) + ")"
    return tag + "(" + ", ".join(_plain(x) for x in rest) + ")"
