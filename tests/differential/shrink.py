"""Shrinking a sequence that shows a difference to the shortest one that
still shows it.

A candidate "still shows it" when its execution's first difference has the
same signature (step kind and kind of difference, `Outcome.signature`) as
the original's; the steps after that difference are cut. First whole steps
are removed (delta debugging on the complement: chunks of halving size),
then each remaining step is simplified: optional keyword arguments dropped,
elements of its literal lists (the ops of an operate, the keys of a batch,
the items of a value) and entries of its literal dicts (bins, policies)
removed one at a time, recursively, keeping every change that still shows
the difference. The number of executions is bounded (`budget`), so a shrink
always ends; what it reached by then is the answer."""

from steps import Call


class Shrinker:
    def __init__(self, pair, signature, tag, budget=400):
        self.pair = pair
        self.signature = signature
        self.tag = tag
        self.budget = budget
        self.tries = 0

    def test(self, steps):
        """The steps up to the difference if they show the same one, else None."""
        if self.tries >= self.budget or not steps:
            return None
        self.tries += 1
        outcome = self.pair.execute(steps, self.tag)
        return outcome.steps if outcome.signature == self.signature else None

    def shrink(self, steps):
        steps = self.drop_steps(steps)
        return self.simplify_steps(steps)

    def drop_steps(self, steps):
        parts = 2
        while len(steps) >= 2:
            size = -(-len(steps) // parts)
            for start in range(0, len(steps), size):
                found = self.test(steps[:start] + steps[start + size:])
                if found is not None:
                    steps, parts = found, max(parts - 1, 2)
                    break
            else:
                if parts >= len(steps) or self.tries >= self.budget:
                    return steps
                parts = min(len(steps), parts * 2)
        return steps

    def simplify_steps(self, steps):
        progress = True
        while progress and self.tries < self.budget:
            progress = False
            for index, step in enumerate(steps):
                for variant in variants(step):
                    found = self.test(steps[:index] + [variant] + steps[index + 1:])
                    if found is not None:
                        steps, progress = found, True
                        break
                    if self.tries >= self.budget:
                        return steps
                if progress:
                    break
        return steps


def variants(node):
    """Simpler versions of a tree, the biggest cuts first."""
    if isinstance(node, Call):
        yield from _call_variants(node)
    elif isinstance(node, list):
        for i in range(len(node)):
            yield node[:i] + node[i + 1:]
        for i, item in enumerate(node):
            for v in variants(item):
                yield node[:i] + [v] + node[i + 1:]
    elif isinstance(node, dict):
        for key in node:
            yield {k: x for k, x in node.items() if k != key}
        for key, item in node.items():
            for v in variants(item):
                yield {**node, key: v}


def _call_variants(call):
    for key in call.kwargs:
        yield call.replace(kwargs={k: x for k, x in call.kwargs.items() if k != key})
    for i, arg in enumerate(call.args):
        for v in variants(arg):
            yield call.replace(args=call.args[:i] + [v] + call.args[i + 1:])
    for key, arg in call.kwargs.items():
        for v in variants(arg):
            yield call.replace(kwargs={**call.kwargs, key: v})
