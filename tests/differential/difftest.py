"""Differential tester: Citrine against the reference server, through the
official Python client.

What it does
------------
For each seed it generates a sequence of steps (`gen.py`: single-record
commands with random policies, operate with basic, list, map, bit, HLL and
expression ops, batch reads, writes, operates and removes, scans selecting
bins, info commands including truncation) over three records of a set of
its own, and runs it side by side: every step first on a fresh `citrined`,
then on the reference server (Aerospike CE, `../shared/reference/`), both
started empty by this tool. Every answer is compared: the result code, and
the value with its types, record generations, TTLs (within a few seconds)
and unordered maps compared as sets (`compare.py`). The first difference
ends the sequence; it is run again (a difference that does not come back is
reported as unreproducible: a bug of the tester or a race), then shrunk
(`shrink.py`) to the shortest sequence that shows the same difference, and
printed as a runnable Python script with both servers' answers.

Differences that an issue already tracks are listed in `known.py` (each
naming its issue item) and reported apart; the exit status is 1 when a
difference not in that list (or an unreproducible one, or a crash of
citrined) was found, 0 when every difference was known, 2 when the tool
could not run. A server that dies is reported with the steps that led
there and both are restarted (the reference crashes on a few inputs of its
own; the generator steers clear of the one it met, see `gen.Ops.map_op`).

Because a sequence ends at its first difference, a frequent known
difference hides what would come after it. `--avoid-known` drops from each
sequence the steps that could show a known difference (each entry's
`avoid`), to look further; CI runs without it.

How to run it
-------------
    scripts/differential.sh                  # seeds 0-499, builds citrined (debug)
    SEEDS=0:1000 scripts/differential.sh     # more seeds
    CITRINED=path/to/citrined scripts/differential.sh
    .venv/bin/python tests/differential/difftest.py --help

`--show SEED` prints a seed's steps as a script without running anything.
The sequence of a seed is the same on every machine (`gen.sequence`), so a
seed number is a complete bug report.

Determinism: nothing it compares depends on timing (no TTL short enough to
expire, no read-touch that could trigger, no clock or size in expressions,
timestamps in info answers normalised, truncations fenced: see `pair.py`),
so a seed's result depends only on the two servers' behaviour.

Not generated: durable deletes (the reference is Community Edition, which
refuses them with 25; Citrine has them), read-touch percentages that could
trigger (timing), UDF modules, secondary indexes, string operations (8.1.2
answers 4 to all)."""

import argparse
import os
import sys
import time
import warnings
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from compare import describe  # noqa: E402
from gen import sequence  # noqa: E402
from known import KNOWN, Case, match  # noqa: E402
from pair import Pair  # noqa: E402
from servers import Citrined, Reference  # noqa: E402
from shrink import Shrinker  # noqa: E402
from steps import CLIENT, HEADER, render, reproduction  # noqa: E402

# meta={"ttl": ...} still works in client 19 and says so on every use.
warnings.filterwarnings("ignore", category=DeprecationWarning)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--citrined", help="citrined binary")
    p.add_argument("--reference", help="the reference's run.sh")
    p.add_argument("--port", type=int, default=3500, help="citrined's port (uses 3 from here)")
    p.add_argument("--ref-port", type=int, default=3550, help="reference's port (uses 3)")
    p.add_argument("--workdir", default="/tmp/citrine-differential")
    p.add_argument("--seeds", default="0:500", help="FIRST:END (END excluded) or one seed")
    p.add_argument("--steps", type=int, default=30, help="steps per sequence")
    p.add_argument("--shrink-budget", type=int, default=400,
                   help="executions a shrink may use")
    p.add_argument("--skip-unavailable-reference", action="store_true",
                   help="exit 0 saying 'skipped' when the reference cannot start")
    p.add_argument("--avoid-known", action="store_true",
                   help="drop from each sequence the steps that could show a known "
                        "difference (to explore past them; not for CI)")
    p.add_argument("--show-known", action="store_true",
                   help="print the reproduction of known differences too")
    p.add_argument("--quiet", action="store_true",
                   help="log only new, unreproducible and crashing seeds as they come")
    p.add_argument("--report", help="also write the findings to this file")
    p.add_argument("--show", type=int, metavar="SEED",
                   help="print SEED's steps as a script and exit")
    return p.parse_args(argv)


def seed_range(text):
    if ":" in text:
        first, end = text.split(":")
        return range(int(first), int(end))
    return range(int(text), int(text) + 1)


def start_pair(args):
    """Both servers started; None (after saying why) if the reference cannot."""
    workdir = os.path.abspath(args.workdir)
    reference = Reference(args.reference, args.ref_port, os.path.join(workdir, "reference"))
    citrine = Citrined(args.citrined, args.port, os.path.join(workdir, "citrine"))
    try:
        reference.start()
    except (RuntimeError, OSError) as e:
        reference.stop()
        return None, str(e)
    try:
        citrine.start()
    except (RuntimeError, OSError):
        reference.stop()
        citrine.stop()
        raise
    return Pair(citrine, reference), None


def investigate(pair, seed, outcome, budget):
    """Confirms a difference, shrinks it: a Case, or the second run's
    Outcome if that did not show the same difference."""
    again = pair.execute(outcome.steps, seed)
    if again.signature != outcome.signature:
        return again
    shrunk = Shrinker(pair, outcome.signature, seed, budget).shrink(outcome.steps)
    final = pair.execute(shrunk, seed)
    if final.signature != outcome.signature:  # the shrink's last try is the reference
        final = again
    return Case(seed, final.steps, final.answers, final.signature, len(outcome.steps))


def case_text(case, entry):
    kind, how = case.signature
    head = [f"seed {case.seed}: {kind}: {how} "
            f"(step {len(case.steps)} of {len(case.steps)}, shrunk from {case.original_length})"]
    if entry:
        head.append(f"known: {entry.id} ({entry.issue})")
    head.append(f"citrine:   {describe(case.citrine)}")
    head.append(f"reference: {describe(case.reference)}")
    answers = [(describe(c, 300), describe(r, 300)) for c, r in case.answers]
    return reproduction(case.steps, answers, "\n".join(head), header=False)


class Findings:
    def __init__(self):
        self.new = defaultdict(list)      # signature -> cases
        self.known = defaultdict(list)    # entry id -> cases
        self.unreproducible = []          # (seed, signature)
        self.crashes = []                 # (seed, server, steps)
        self.clean = 0

    def add(self, case):
        entry = match(case)
        if entry:
            self.known[entry.id].append(case)
        else:
            self.new[case.signature].append(case)
        return entry

    @staticmethod
    def shortest(cases):
        return min(cases, key=lambda c: (len(c.steps), len(render(c.last))))


def steps_of(seed, args):
    steps = sequence(seed, args.steps)
    if args.avoid_known:
        steps = [s for s in steps if not any(k.avoid and k.avoid(s) for k in KNOWN)]
    return steps


def run(args, pair, log):
    findings = Findings()
    for seed in seed_range(args.seeds):
        outcome = pair.execute(steps_of(seed, args), seed)
        if outcome.diff_at is None:
            findings.clean += 1
            continue
        if outcome.crashed:
            findings.crashes.append((seed, outcome.crashed, outcome.steps))
            log(f"seed {seed}: {outcome.crashed.upper()} CRASHED at step {len(outcome.steps)}")
            continue
        case = investigate(pair, seed, outcome, args.shrink_budget)
        if not isinstance(case, Case):
            findings.unreproducible.append((seed, outcome.signature))
            log(f"seed {seed}: UNREPRODUCIBLE: {outcome.signature} at step "
                f"{outcome.diff_at + 1}, then {case.signature} at step "
                f"{None if case.diff_at is None else case.diff_at + 1}")
            continue
        entry = findings.add(case)
        if entry and args.quiet:
            continue
        label = f"known {entry.id}" if entry else "NEW"
        log(f"seed {seed}: {label}: {case.signature[0]}: {case.signature[1]} "
            f"({len(case.steps)} steps)")
    return findings


def summary(args, findings, elapsed, executions):
    seeds = len(seed_range(args.seeds))
    out = [f"\n== {seeds} seeds x {args.steps} steps in {elapsed:.1f} s "
           f"({executions} executions): {findings.clean} without a difference, "
           f"{sum(map(len, findings.known.values()))} known, "
           f"{sum(map(len, findings.new.values()))} new, "
           f"{len(findings.unreproducible)} unreproducible"]
    for entry in KNOWN:
        cases = findings.known.get(entry.id, [])
        if cases:
            out.append(f"   known {entry.id} ({entry.issue}): {len(cases)} seeds")
    unmatched = [entry.id for entry in KNOWN if entry.id not in findings.known]
    if unmatched:
        out.append(f"   known entries that matched nothing this run: {', '.join(unmatched)}")
    for signature, cases in sorted(findings.new.items(), key=lambda kv: -len(kv[1])):
        out.append(f"   NEW {signature[0]}: {signature[1]}: {len(cases)} seeds "
                   f"({', '.join(str(c.seed) for c in cases[:10])})")
    for seed, signature in findings.unreproducible:
        out.append(f"   UNREPRODUCIBLE seed {seed}: {signature}")
    for seed, server, steps in findings.crashes:
        out.append(f"   CRASH of {server}: seed {seed}, step {len(steps)}")
    return "\n".join(out)


def details(args, findings):
    shown_known = args.show_known and findings.known
    if not (findings.new or findings.crashes or shown_known):
        return ""
    out = ["\n== Each reproduction below is Python that runs after this preamble:\n",
           HEADER + CLIENT]
    for signature, cases in sorted(findings.new.items(), key=lambda kv: -len(kv[1])):
        out.append(f"\n== NEW difference: {signature[0]}: {signature[1]} "
                   f"({len(cases)} seeds); the shortest:\n")
        out.append(case_text(Findings.shortest(cases), None))
    for seed, server, steps in findings.crashes:
        out.append(f"\n== {server} crashed (seed {seed}); the steps up to the crash:\n")
        out.append(reproduction(steps, title=f"seed {seed}: {server} crashed at the last step",
                                header=False))
    if args.show_known:
        for entry in KNOWN:
            cases = findings.known.get(entry.id)
            if cases:
                out.append(f"\n== known {entry.id} ({entry.issue}): {entry.summary}; "
                           f"the shortest of {len(cases)}:\n")
                out.append(case_text(Findings.shortest(cases), entry))
    return "\n".join(out)


def main(argv=None):
    args = parse_args(argv)
    if args.show is not None:
        print(reproduction(steps_of(args.show, args), title=f"seed {args.show}"))
        return 0
    if not args.citrined or not args.reference:
        print("difftest: --citrined and --reference are required", file=sys.stderr)
        return 2
    pair, why = start_pair(args)
    if pair is None:
        if args.skip_unavailable_reference:
            print(f"skipped: reference server not available ({why})")
            return 0
        print(f"difftest: the reference server did not start: {why}", file=sys.stderr)
        return 2
    started = time.monotonic()
    try:
        findings = run(args, pair, lambda line: print(line, flush=True))
    finally:
        pair.stop()
    text = summary(args, findings, time.monotonic() - started, pair.executions)
    text += "\n" + details(args, findings)
    print(text)
    if args.report:
        with open(args.report, "w") as f:
            f.write(text + "\n")
    citrine_crashed = any(server == "citrine" for _, server, _ in findings.crashes)
    return 1 if findings.new or findings.unreproducible or citrine_crashed else 0


if __name__ == "__main__":
    sys.exit(main())
