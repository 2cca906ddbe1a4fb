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


def lut_epoch_only(case):
    """The two `sets/` answers differ in truncate_lut's epoch (and perhaps
    the last separator) only."""
    cit, ref = case.citrine, case.reference
    if not (cit[0] == ref[0] == "sets" and "truncate_lut=other" in cit[1]
            and "truncate_lut=recent" in ref[1]):
        return False
    fixed = cit[1].replace("truncate_lut=other", "truncate_lut=recent")
    return fixed.rstrip("\n:;") == ref[1].rstrip("\n:;")


def sets_separator_only(case):
    """The two `sets/` answers differ only in the last field's separator."""
    cit, ref = case.citrine, case.reference
    return (cit[0] == ref[0] == "sets" and cit[1] != ref[1]
            and cit[1].rstrip("\n:;") == ref[1].rstrip("\n:;"))


KNOWN = [
    # Found by this tester, not (yet) items of issue 46: each names what it
    # saw, for the lead to file or fix.
    Known("truncate-lut-epoch", "issue 46, new (differential tester)",
          "sets/NS/SET reports truncate_lut in milliseconds since 1970 (1795949682995), the "
          "reference in milliseconds since 2010-01-01 (533645682996)",
          lambda c: c.last.kind == "info sets" and lut_epoch_only(c),
          lambda s: s.kind == "info sets"),
    Known("sets-info-last-separator", "issue 46, new (differential tester)",
          "sets/NS/SET ends its last field with ':' where the reference ends it with ';'",
          lambda c: c.last.kind == "info sets" and sets_separator_only(c),
          lambda s: s.kind == "info sets"),
    Known("sets-info-set-existence", "issue 46, new (differential tester)",
          "which sets sets/NS/SET knows differs: Citrine answers statistics (objects=0) for a "
          "set only touched by a refused request (a touch of a missing record), the reference "
          "an empty answer; the reference knows a set whose only write was refused (160, "
          "invalid GeoJSON), Citrine answers empty",
          lambda c: c.last.kind == "info sets" and ("sets", "\n") in (c.citrine, c.reference)
          and c.citrine != c.reference),
    Known("truncate-undo", "issue 46, new (differential tester)",
          "truncate-undo is refused with 4 ('not supported') and truncate-namespace-undo is "
          "unrecognized (4); the reference answers ok (20 for an empty namespace)",
          lambda c: c.last.kind in ("info truncate-undo", "info truncate-namespace-undo")
          and c.signature[1] in ("4 vs ok", "4 vs 20"),
          lambda s: s.kind in ("info truncate-undo", "info truncate-namespace-undo")),
    Known("udf-remove-empty-filename", "issue 46, new (differential tester)",
          "udf-remove:filename= (empty) answers 100 (error=invalid_filename), the reference ok",
          lambda c: c.last.kind == "info udf-remove" and c.signature[1] == "100 vs ok",
          lambda s: s.kind == "info udf-remove"),
]


def match(case):
    """The known entry a case belongs to, or None."""
    for entry in KNOWN:
        if entry.match(case):
            return entry
    return None
