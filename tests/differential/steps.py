"""Steps: one client call each, held as a small tree that renders to Python
source.

A step is a `Call` tree (`client.operate(...)`, `scan(client, ...)`); the
tester runs exactly the source it renders (compiled once, evaluated against
each server's client), so a printed reproduction is the code that ran, not a
description of it. Leaves are Python literals (int, float, str, bytes,
bool, None, lists, dicts, tuples) and `Sym` names of the execution
environment (`aerospike.POLICY_EXISTS_CREATE`, `SET`). Positional arguments
of a `Call` are required; keyword arguments are optional (the shrinker may
drop them). Lists and dicts are literals the shrinker may thin out; tuples
(keys) are kept whole.

`HEADER` is the preamble of every reproduction and of the tester's own
environment: the imports, two HLL values and three helpers (`scan`, `info`,
`show`)."""

# Two HLL values (4 index bits; 6 index bits with 4 minhash bits), as the
# reference answers them after hll_add of ["a","b","c"] and ["c","d","e","f"].
HLL_4 = b"\x00\x04\x00" + bytes(12) + b"@\x80\x000" + bytes(4)
HLL_6_4 = (b"\x00\x06\x04" + bytes(39) + b"\x03\xd0" + bytes(10) + b"\xa4" + bytes(30)
           + b"&\x00\x00\x01,\x00")

HEADER = '''\
import time

import aerospike
from aerospike_helpers import HyperLogLog, cdt_ctx
from aerospike_helpers import expressions as exp
from aerospike_helpers.batch import records as br
from aerospike_helpers.operations import (bitwise_operations, expression_operations,
                                          hll_operations, list_operations, map_operations,
                                          operations)

NS = "test"
HLL_4 = HyperLogLog(%r)
HLL_6_4 = HyperLogLog(%r)


def scan(client, set_name, bins=None, policy=None):
    """A scan of namespace test, set set_name (selecting bins), records
    sorted by digest (the order of a scan's records is not compared)."""
    job = client.scan(NS, set_name)
    if bins is not None:
        job.select(*bins)
    return sorted(job.results(policy), key=lambda record: bytes(record[0][3]))


def info(client, command):
    """The value of one info command's answer (without the command echo)."""
    answer = client.info_random_node(command)
    return answer.partition("\\t")[2] if "\\t" in answer else answer


def show(number, call):
    """Runs one step and prints its answer (a batch as its records)."""
    try:
        result = call()
    except aerospike.exception.AerospikeError as e:
        print(number, "error", e.code, type(e).__name__, e.msg)
        return
    if isinstance(result, br.BatchRecords):
        result = (result.result,
                  [(r.result, r.key, r.record) for r in result.batch_records])
    print(number, "ok", result)
''' % (HLL_4, HLL_6_4)


class Sym:
    """Source text rendered as itself: a name of the execution environment
    (`aerospike.POLICY_GEN_EQ`, `SET`) or a small expression of them
    (`"sets/test/" + SET`)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __eq__(self, other):
        return isinstance(other, Sym) and other.name == self.name

    def __hash__(self):
        return hash(self.name)


class Call:
    """fn(*args, **kwargs); fn ".compile" renders as a method call on args[0]."""

    __slots__ = ("fn", "args", "kwargs", "label")

    def __init__(self, fn, *args, label=None, **kwargs):
        self.fn = fn
        self.args = list(args)
        self.kwargs = {k: v for k, v in kwargs.items() if v is not None}
        self.label = label

    def replace(self, args=None, kwargs=None):
        new = Call(self.fn, label=self.label)
        new.args = list(self.args if args is None else args)
        new.kwargs = dict(self.kwargs if kwargs is None else kwargs)
        return new

    @property
    def kind(self):
        """The step's kind: its label, else the client method or helper it
        calls (`put`, `operate`, `scan`)."""
        return self.label or self.fn.rsplit(".", 1)[-1]


def compiled(expr):
    """expr.compile() (a bare literal wrapped in exp.Val first)"""
    if not isinstance(expr, Call):
        expr = Call("exp.Val", expr)
    return Call(".compile", expr)


def render(node, indent=0):
    """Python source for a tree (lists of calls one per line when long)."""
    if isinstance(node, Sym):
        return node.name
    if isinstance(node, Call):
        return _render_call(node, indent)
    if isinstance(node, list):
        return _render_seq(node, "[", "]", indent)
    if isinstance(node, tuple):
        inner = ", ".join(render(x, indent) for x in node)
        return "(" + inner + ("," if len(node) == 1 else "") + ")"
    if isinstance(node, dict):
        items = [f"{render(k, indent)}: {render(v, indent)}" for k, v in node.items()]
        return "{" + ", ".join(items) + "}"
    if isinstance(node, bytearray):
        return f"bytearray({bytes(node)!r})"
    if isinstance(node, float):
        return repr(node)
    if node is None or isinstance(node, (bool, int, str, bytes)):
        return repr(node)
    raise TypeError(f"cannot render {type(node).__name__}")


def _render_call(call, indent):
    if call.fn == ".compile":
        return render(call.args[0], indent) + ".compile()"
    parts = [render(a, indent) for a in call.args]
    parts += [f"{k}={render(v, indent)}" for k, v in call.kwargs.items()]
    return f"{call.fn}({', '.join(parts)})"


def _render_seq(items, open_, close, indent):
    flat = open_ + ", ".join(render(x, indent) for x in items) + close
    if len(flat) <= 80 or not any(isinstance(x, Call) for x in items):
        return flat
    pad = " " * (indent + 4)
    lines = [pad + render(x, indent + 4) + "," for x in items]
    return open_ + "\n" + "\n".join(lines) + "\n" + " " * indent + close


def environment(client, set_name):
    """The names a step's source may use, bound to one server's client."""
    env = {}
    exec(HEADER, env)  # the same helpers a reproduction defines
    env.update(client=client, SET=set_name)
    return env


CLIENT = 'client = aerospike.client({"hosts": [("127.0.0.1", 3000)]}).connect()'


def reproduction(steps, answers=None, title="", header=True):
    """A runnable script: HEADER and a client (unless header is False),
    then show(n, lambda: step) per step, each preceded by the two servers'
    answers when known."""
    out = []
    if title:
        out += [f"# {line}" for line in title.splitlines()]
    if header:
        out += [HEADER, CLIENT]
    out.append('SET = "repro%d" % __import__("time").time_ns()  # a set not seen before')
    for n, step in enumerate(steps, 1):
        if answers is not None and n - 1 < len(answers):
            cit, ref = answers[n - 1]
            out.append(f"# citrine:   {cit}")
            out.append(f"# reference: {ref}")
        if truncates_own_set(step):
            out.append("time.sleep(0.005)  # no write shares the truncation's millisecond")
        out.append(f"show({n}, lambda: {render(step)})")
        if truncates_own_set(step):
            out.append("time.sleep(0.1)  # the reference applies a truncation a little later")
    return "\n".join(out) + "\n"


def truncates_own_set(step):
    """Whether a step truncates the sequence's own set (client.truncate or
    the info command), which the pair fences (pair.py)."""
    source = render(step)
    return source in ("client.truncate('test', SET, 0)",
                      'info(client, "truncate:namespace=test;set=" + SET)')
