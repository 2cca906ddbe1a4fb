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


def fns(step):
    return [call.fn for call in calls_in(step)]


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


def has_ctx(step):
    return any(fn.startswith("cdt_ctx.") for fn in fns(step))


def uses(step, sym_name):
    return any(sym_name in text for text in syms_in(step))


def code(answer):
    """An answer's result code: its error code, or 0 for a success."""
    if is_error(answer):
        return answer[1] if answer[0] == "error" else "client"
    return 0


def codes(answer):
    """Every result code in an answer: a batch's records' codes as well."""
    found = {code(answer)}
    if isinstance(answer, tuple) and answer and answer[0] == "batch":
        found.add(answer[1])
        found.update(record[1] for record in answer[2:])
    return found


def is_delete(step):
    """A step that may delete a record (non-durably: no step asks for a
    durable delete): remove, batch remove, a delete op, or removing bins
    (a record whose last bin goes is deleted: remove_bin, a put or write
    of None)."""
    if step.fn in ("client.remove", "client.batch_remove", "client.remove_bin"):
        return True
    if step.fn == "client.put" and isinstance(step.args[1], dict):
        if any(value is None for value in step.args[1].values()):
            return True
    return any(call.fn in ("operations.delete", "br.Remove")
               or (call.fn == "operations.write" and call.args[1] is None)
               for call in calls_in(step))


def deleted_before(case):
    """Whether a record may have been deleted before the last step wrote it:
    a delete in an earlier step, or a batch removing a record and then
    writing it."""
    if any(is_delete(s) for s in case.steps[:-1]):
        return True
    records = [call.fn for call in calls_in(case.last) if call.fn in ("br.Remove", "br.Write")]
    return "br.Remove" in records and "br.Write" in records[records.index("br.Remove"):]


def inverted(step):
    return any(call.kwargs.get("inverted") is True for call in calls_in(step))


def returns_rank(step, kinds=("RANK", "REVERSE_RANK")):
    return any(uses(step, f"{cdt}_RETURN_{kind}") for cdt in ("LIST", "MAP") for kind in kinds)


def by_rank(step):
    """Whether a step's ops return ranks or select by rank."""
    return returns_rank(step) or any("_rank" in fn for fn in fns(step))


def returns_position(step):
    """Whether a step's ops return ranks or indexes."""
    return returns_rank(step, ("RANK", "REVERSE_RANK", "INDEX", "REVERSE_INDEX"))


def lists_sorted(answer):
    """An answer with every list's items sorted (to compare ignoring order)."""
    if isinstance(answer, tuple) and answer and answer[0] == "list":
        return ("list",) + tuple(sorted((lists_sorted(x) for x in answer[1:]), key=repr))
    if isinstance(answer, tuple):
        return tuple(lists_sorted(x) for x in answer)
    return answer


def deletes_then_touches(step):
    """An operate whose ops hold a delete followed (later) by a touch."""
    names = fns(step)
    deletes = [i for i, n in enumerate(names) if n == "operations.delete"]
    touches = [i for i, n in enumerate(names) if n == "operations.touch"]
    return bool(deletes and touches and deletes[0] < touches[-1])


def without_nil_bins(answer):
    """An answer without the bins whose value is nil: operate's {bin: None}
    entries and operate_ordered's (bin, None) pairs."""
    if not isinstance(answer, tuple):
        return answer
    if answer and answer[0] == "map":
        return ("map",) + tuple((k, without_nil_bins(v)) for k, v in answer[1:]
                                if not (k and k[0] == "str" and v is None))
    if answer and answer[0] == "list":
        return ("list",) + tuple(without_nil_bins(x) for x in answer[1:]
                                 if not (isinstance(x, tuple) and len(x) == 3
                                         and x[0] == "tuple" and x[2] is None))
    return tuple(without_nil_bins(x) for x in answer)


def nil_result_only(case):
    """The answers differ only in an op's nil result: an entry one has and
    the other not, or nil on one side where the other has a value (in
    operate's dict form a later op's result replaces an earlier one's)."""
    if case.signature[1] in ("length", "map keys"):
        return without_nil_bins(case.citrine) == without_nil_bins(case.reference)
    found = first_difference(case.citrine, case.reference)
    return bool(found) and found[2] == "type" and None in found[:2]


KNOWN = [
    Known("truncate-info", "issue 46 item 1",
          "truncate and truncate-namespace info commands: an empty or missing set name "
          "accepted (and the namespace truncated), an unknown namespace refused (the reference: "
          "ok), an empty or missing namespace answered 4 (the reference: 20), lut=2147483649 "
          "accepted",
          lambda c: c.last.kind in ("info truncate", "info truncate-namespace")
          and c.signature[1] in ("ok vs 4", "4 vs ok", "4 vs 20"),
          lambda s: s.kind in ("info truncate", "info truncate-namespace")
          and not truncates_own_set(s)),
    Known("cdt-context-errors", "issue 46 item 2",
          "a CDT op whose context path cannot be followed: the reference answers 26 "
          "(4 when the bin itself holds a scalar), Citrine 23, 12, 4 or a result",
          lambda c: has_ctx(c.last)
          and (26 in codes(c.reference) - codes(c.citrine)
               or (12 in codes(c.citrine) - codes(c.reference)
                   and 4 in codes(c.reference) - codes(c.citrine))),
          has_ctx),
    Known("result-order", "issue 46 item 2",
          "the order of a selection's results: ranks or indexes come in selection order (the "
          "reference sorts them), the values of an inverted rank range in rank order (the "
          "reference: index order); item 2 names list_remove_by_rank_range(..., inverted, "
          "RETURN_RANK), the same shows for RANK, REVERSE_RANK, REVERSE_INDEX and VALUE of "
          "lists and maps by index, rank or value",
          lambda c: (returns_position(c.last) or inverted(c.last))
          and c.signature[1] == "value" and lists_sorted(c.citrine) == lists_sorted(c.reference),
          lambda s: returns_position(s) or inverted(s)),
    Known("sindex-delete-unknown-namespace", "issue 46 item 4",
          "sindex-delete on a namespace that does not exist: the reference answers ok, Citrine "
          "4 (item 4 names sindex-create; its sibling answers the same way)",
          lambda c: c.last.kind == "info sindex-delete" and c.signature[1] == "4 vs ok",
          lambda s: s.kind == "info sindex-delete"),
    Known("scan-selected-bins", "issue 46 item 7",
          "a scan selecting bins returns records holding none of them",
          lambda c: c.last.kind == "scan" and isinstance(c.last.args[2], list)
          and c.signature[1] == "length" and len(c.citrine) > len(c.reference),
          lambda s: s.kind == "scan" and isinstance(s.args[2], list)),
    Known("udf-apply-empty-module", "issue 46 item 8",
          "apply(key, '', '') answers 4, the reference 100",
          lambda c: c.last.kind == "apply" and c.last.args[1] == ""
          and c.signature[1] == "4 vs 100",
          lambda s: s.kind == "apply" and s.args[1] == ""),
    Known("select-no-bins", "issue 46 item 9",
          "select(key, []) answers the record, the reference 4",
          lambda c: c.last.kind == "select" and c.last.args[1] == []
          and c.signature[1] == "ok vs 4",
          lambda s: s.kind == "select" and s.args[1] == []),
    Known("generation-after-delete", "issue 46 item 10",
          "a record written again after a non-durable delete (or after its last bin was "
          "removed) continues its old generation (the reference starts again at 1); also a "
          "generation check failing (3) or passing because of it",
          lambda c: deleted_before(c)
          and (c.signature[1] == "generation" or 3 in codes(c.citrine) ^ codes(c.reference)),
          is_delete),
    Known("touch-on-missing-record", "issue 46 item 11",
          "an operate holding a touch on a record that does not exist: the reference answers 2 "
          "before any other error (of an op, or of a generation check)",
          lambda c: ("operations.touch" in fns(c.last) or c.last.kind == "touch")
          and 2 in codes(c.reference) - codes(c.citrine) and codes(c.citrine) != {0},
          lambda s: "operations.touch" in fns(s) or s.kind == "touch"),
    Known("missing-bin-op-results", "issue 46 item 11",
          "which results an operate returns for ops on a bin that does not exist: one server "
          "answers a nil entry for the bin where the other answers none",
          lambda c: c.last.kind in ("operate", "operate_ordered", "batch_operate", "batch_write")
          and nil_result_only(c)),
    # Found by this tester, not (yet) items of issue 46: each names what it
    # saw, for the lead to file or fix.
    Known("generation-gt-on-missing-record", "issue 46, new (differential tester)",
          "a write with POLICY_GEN_GT on a record that does not exist: the reference answers 3 "
          "(generation 0 is not greater than 0), Citrine creates the record (or answers "
          "another error of the request)",
          lambda c: uses(c.last, "POLICY_GEN_GT") and 3 in codes(c.reference) - codes(c.citrine),
          lambda s: uses(s, "POLICY_GEN_GT")),
    Known("replace-with-cdt-read", "issue 46, new (differential tester)",
          "operate with POLICY_EXISTS_REPLACE or CREATE_OR_REPLACE holding a CDT read op or an "
          "expression write: Citrine refuses it with 4, the reference runs it (it refuses only "
          "modify ops that read the old record: CDT modify, increment)",
          lambda c: (uses(c.last, "POLICY_EXISTS_REPLACE")
                     or uses(c.last, "POLICY_EXISTS_CREATE_OR_REPLACE"))
          and 4 in codes(c.citrine) - codes(c.reference),
          lambda s: uses(s, "POLICY_EXISTS_REPLACE") or uses(s, "POLICY_EXISTS_CREATE_OR_REPLACE")),
    Known("key-exists-on-create", "issue 46, new (differential tester)",
          "exp.KeyExists() in an expression of a write creating a record with POLICY_KEY_SEND: "
          "Citrine evaluates true, the reference false (the key is not stored yet), which "
          "shows in the value written or in whether a later unknown (a missing bin) fails it",
          lambda c: "exp.KeyExists" in fns(c.last) and uses(c.last, "POLICY_KEY_SEND"),
          lambda s: "exp.KeyExists" in fns(s)),
    Known("rank-of-equal-values", "issue 46, new (differential tester)",
          "ranks among equal values: the rank of an element whose value occurs more than once "
          "(the reference counts the elements less than it: [1, 1, 2] index 1 has rank 0, "
          "reverse rank 2; Citrine breaks ties by position: 1 and 1), and which of equal "
          "elements a rank selects",
          lambda c: by_rank(c.last) and c.signature[1] == "value"
          and lists_sorted(c.citrine) != lists_sorted(c.reference),
          by_rank),
    Known("return-exists-inverted", "issue 46, new (differential tester)",
          "RETURN_EXISTS with inverted=True: the reference answers the negation of the "
          "non-inverted selection's existence ([1, 1, 2] by value 1: False; [] by value 1: "
          "True), Citrine whether the inverted selection is non-empty",
          lambda c: inverted(c.last) and (uses(c.last, "LIST_RETURN_EXISTS")
                                          or uses(c.last, "MAP_RETURN_EXISTS"))
          and c.signature[1] == "value",
          lambda s: inverted(s) and (uses(s, "LIST_RETURN_EXISTS")
                                     or uses(s, "MAP_RETURN_EXISTS"))),
    Known("geojson-literal-in-expression", "issue 46, new (differential tester)",
          "an expression holding a malformed GeoJSON literal (a Polygon with no coordinates): "
          "Citrine refuses the request with 4, the reference evaluates it (26, or 17 in a "
          "batch, when the compared bin is missing)",
          lambda c: "exp.CmpGeo" in fns(c.last)
          and 4 in codes(c.citrine) - codes(c.reference)),
    Known("bit-signed-overflow", "issue 46, new (differential tester)",
          "signed bit_add/bit_subtract with BIT_OVERFLOW_FAIL at the edge of the signed range: "
          "1 bit 0 - 1 = -1 and -1 + 1 = 0, 2 bits 0 - 2 = -2 are refused with 26 (the "
          "reference writes them); 2 bits -1 - 2 = -3 is written (the reference: 26)",
          lambda c: any(fn in ("bitwise_operations.bit_add", "bitwise_operations.bit_subtract")
                        for fn in fns(c.last))
          and 26 in codes(c.citrine) ^ codes(c.reference),
          lambda s: any(fn in ("bitwise_operations.bit_add", "bitwise_operations.bit_subtract")
                        for fn in fns(s))),
    Known("modify-geojson-bin", "issue 46, new (differential tester)",
          "increment, append or prepend on a bin holding GeoJSON: the reference answers 1, "
          "Citrine 12",
          lambda c: 12 in codes(c.citrine) - codes(c.reference)
          and 1 in codes(c.reference) - codes(c.citrine)),
    Known("delete-then-touch", "issue 46, new (differential tester)",
          "operate [delete, touch, ...] on a record that exists: the reference deletes it and "
          "goes on (ok, or the next op's error), Citrine answers 2 and leaves the record as it "
          "was",
          lambda c: deletes_then_touches(c.last) and code(c.citrine) == 2
          and code(c.reference) != 2,
          deletes_then_touches),
]


def match(case):
    """The known entry a case belongs to, or None."""
    for entry in KNOWN:
        if entry.match(case):
            return entry
    return None
