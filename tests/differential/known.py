"""Known differences: classes of difference between Citrine and the
reference that are already tracked by an issue, reported apart from new
ones so that a run fails only on what nobody knows about yet.

Each entry names its issue item and matches a shrunk case (its steps, the
two answers of each, the signature of the difference). An entry must be
narrow (match the one behaviour it names, not a step kind wholesale) and
is deleted when the item is fixed: a run reports entries that matched
nothing, so a stale one is visible (and a fix that leaves a different
answer shows as a new difference, since entries match the old answer).

The entries under "Found by this tester" are differences no item of issue
46 names yet: each says what it saw, to be filed (or fixed) and deleted
here like the others. Nothing is added to make a run pass without naming
what it hides."""

from dataclasses import dataclass
from typing import Callable

from compare import first_difference, is_error
from steps import Call, Sym, truncates_own_set


@dataclass
class Case:
    """A difference: the seed, the shrunk steps and every step's answers
    (citrine, reference), the last pair being the first that differs."""

    seed: int
    steps: list
    answers: list
    signature: tuple
    original_length: int = 0

    @property
    def last(self):
        return self.steps[-1]

    @property
    def citrine(self):
        return self.answers[-1][0]

    @property
    def reference(self):
        return self.answers[-1][1]


@dataclass
class Known:
    """One known class: `match(case)` says whether a shrunk case is one of
    it; `avoid(step)` (optional) whether a step could show it, for
    exploring past it (`--avoid-known` drops such steps from sequences)."""

    id: str
    issue: str
    summary: str
    match: Callable[[Case], bool]
    avoid: Callable[[Call], bool] = None


def calls_in(node):
    """Every Call in a tree, depth first."""
    if isinstance(node, Call):
        yield node
        for arg in list(node.args) + list(node.kwargs.values()):
            yield from calls_in(arg)
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from calls_in(item)
    elif isinstance(node, dict):
        for key, item in node.items():
            yield from calls_in(key)
            yield from calls_in(item)


def syms_in(node):
    """Every Sym's source text in a tree."""
    if isinstance(node, Sym):
        yield node.name
    elif isinstance(node, Call):
        for arg in list(node.args) + list(node.kwargs.values()):
            yield from syms_in(arg)
    elif isinstance(node, (list, tuple)):
        for item in node:
            yield from syms_in(item)
    elif isinstance(node, dict):
        for item in node.values():
            yield from syms_in(item)


def uses(step, sym_name):
    return any(sym_name in text for text in syms_in(step))


def code(answer):
    """An answer's result code: its error code, or 0 for a success."""
    if is_error(answer):
        return answer[1] if answer[0] == "error" else "client"
    return 0


def lists_sorted(answer):
    """An answer with every list's items sorted (to compare ignoring order)."""
    if isinstance(answer, tuple) and answer and answer[0] == "list":
        return ("list",) + tuple(sorted((lists_sorted(x) for x in answer[1:]), key=repr))
    if isinstance(answer, tuple):
        return tuple(lists_sorted(x) for x in answer)
    return answer


KNOWN = [
    # Found by this tester, not (yet) items of issue 46: each names what it
    # saw, for the lead to file or fix.
]


def match(case):
    """The known entry a case belongs to, or None."""
    for entry in KNOWN:
        if entry.match(case):
            return entry
    return None
