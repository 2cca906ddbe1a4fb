"""Tests of the differential tester itself (no server needed): the
normal form of answers, the shrinker, the generator and the known list.

Run: .venv/bin/python -m pytest -q tests/differential"""

import os
import sys

import pytest

import aerospike

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The generated steps use the client's deprecated-but-working spellings
# (meta={"ttl": ...}, value_byte_size), which warn on every use.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

from compare import Ttl, classify, norm, normalise_info, same  # noqa: E402
from gen import sequence  # noqa: E402
import known  # noqa: E402
from known import KNOWN, Case, Known, match  # noqa: E402
from pair import Outcome  # noqa: E402
from shrink import Shrinker  # noqa: E402
from steps import Call, Sym, environment, render, reproduction  # noqa: E402


def test_norm_keeps_types_apart():
    assert not same(norm(1), norm(1.0))
    assert not same(norm(1), norm(True))
    assert not same(norm(b"a"), norm("a"))
    assert not same(norm([1, 2]), norm([2, 1]))


def test_unordered_maps_compare_as_sets_ordered_ones_in_order():
    assert same(norm({"a": 1, "b": 2}), norm({"b": 2, "a": 1}))
    ordered = aerospike.KeyOrderedDict({"a": 1, "b": 2})
    assert not same(norm(ordered), norm({"a": 1, "b": 2}))


def test_ttl_within_tolerance_generation_exact():
    assert Ttl(1000) == Ttl(1002)
    assert Ttl(1000) != Ttl(1010)
    a = norm({"gen": 1, "ttl": 3000})
    assert same(a, norm({"gen": 1, "ttl": 2999}))
    assert classify(a, norm({"gen": 2, "ttl": 3000})) == "generation"


def test_classify_names_codes():
    err = ("error", 26, "OpNotApplicable")
    assert classify(err, norm(0)) == "26 vs ok"
    assert classify(norm(0), err) == "ok vs 26"


def test_sets_info_keeps_separators_drops_sizes():
    cit = normalise_info("info sets", ("str", "objects=1:data_used_bytes=19:truncate_lut=0:\n"))
    ref = normalise_info("info sets", ("str", "objects=1:data_used_bytes=48:truncate_lut=0;\n"))
    assert cit == ("sets", "objects=1:truncate_lut=0:\n")
    assert not same(cit, ref)


class FakePair:
    """Shows a difference at the first step after both "a" and "b" ran
    whose op list still holds an op named "x"."""

    def __init__(self):
        self.executions = 0

    def execute(self, steps, tag=None):
        self.executions += 1
        seen = set()
        outcome = Outcome(steps=list(steps))
        for index, step in enumerate(steps):
            seen.add(step.fn)
            has_x = any(isinstance(op, Call) and op.fn == "x" for op in step.args[0])
            answers = (norm(0), norm(0))
            if {"a", "b"} <= seen and has_x:
                answers = (norm(0), ("error", 4, "InvalidRequest"))
            outcome.answers.append(answers)
            if not same(*answers):
                outcome.diff_at = index
                outcome.steps = outcome.steps[:index + 1]
                break
        return outcome


def test_shrinker_finds_the_two_steps_and_the_one_op():
    noise = [Call("n%d" % i, []) for i in range(10)]
    steps = (noise[:3] + [Call("a", [])] + noise[3:7]
             + [Call("b", [Call("y"), Call("x"), Call("z")], policy={"k": 1})] + noise[7:])
    pair = FakePair()
    first = pair.execute(steps)
    shrunk = Shrinker(pair, first.signature, "t").shrink(first.steps)
    assert [s.fn for s in shrunk] == ["a", "b"]
    assert [op.fn for op in shrunk[1].args[0]] == ["x"]
    assert shrunk[1].kwargs == {}


def test_shrinker_stops_at_its_budget():
    steps = [Call("a", [])] + [Call("n", []) for _ in range(50)] + [Call("b", [Call("x")])]
    pair = FakePair()
    first = pair.execute(steps)
    Shrinker(pair, first.signature, "t", budget=5).shrink(first.steps)
    assert pair.executions <= 1 + 5


class FakeJob:
    def select(self, *bins):
        pass

    def results(self, policy=None):
        return []


class FakeClient:
    """Accepts every call (so generated steps are checked for arguments the
    helper functions refuse, before anything reaches a server)."""

    def __getattr__(self, name):
        if name in ("scan", "query"):
            return lambda *args, **kwargs: FakeJob()
        if name == "info_random_node":
            return lambda command, *args: command + "\tok\n"
        return lambda *args, **kwargs: None


def test_generator_is_deterministic():
    assert ([render(s) for s in sequence(7, 30)]
            == [render(s) for s in sequence(7, 30)])
    assert [render(s) for s in sequence(7, 30)] != [render(s) for s in sequence(8, 30)]


@pytest.mark.parametrize("first", [0, 100, 200])
def test_generated_steps_build_without_errors(first):
    env = environment(FakeClient(), "some-set")
    for seed in range(first, first + 100):
        for step in sequence(seed, 30):
            eval(compile(render(step), "<step>", "eval"), env)


def test_reproduction_is_python():
    steps = sequence(3, 10)
    compile(reproduction(steps, title="seed 3"), "<repro>", "exec")


def test_known_entries_are_named():
    ids = [entry.id for entry in KNOWN]
    assert len(ids) == len(set(ids))
    assert all(entry.issue.startswith("issue") and entry.summary for entry in KNOWN)


def test_a_case_matches_the_first_entry_that_claims_it(monkeypatch):
    select_all = Call("client.select", ("test", Sym("SET"), 1), [])
    select_one = Call("client.select", ("test", Sym("SET"), 1), ["a"])
    ok, err = norm((None, None, {})), ("error", 4, "InvalidRequest")
    entry = Known("select-no-bins", "issue 0 (test)", "select(key, []) answers ok",
                  lambda c: c.last.kind == "select" and c.last.args[1] == []
                  and c.signature[1] == "ok vs 4")
    monkeypatch.setattr(known, "KNOWN", [entry])
    assert match(Case(0, [select_all], [(ok, err)], ("select", "ok vs 4"))) is entry
    assert match(Case(0, [select_one], [(ok, err)], ("select", "ok vs 4"))) is None
    assert match(Case(0, [select_all], [(err, ok)], ("select", "4 vs ok"))) is None

