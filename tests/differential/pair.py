"""Running one sequence against both servers, side by side.

`Pair.execute(steps)` runs the steps in order, each one first on Citrine,
then on the reference, in a set of its own that neither server has seen
(so every execution, including each attempt of a shrink, starts from no
records), and stops at the first step whose answers differ. Set names are
never freed by either server, so the pair restarts both (empty again)
before the smaller of their set limits is reached.

A truncation of the sequence's set is fenced on both sides, because the
reference does not apply it at once: a record last updated in the same
millisecond as the truncation survives it, and the truncation takes effect
some milliseconds after the command's "ok" (its metadata goes through the
system metadata thread), and until its background pass has gone through
the set a delete still finds a truncated record. So the pair waits
`TRUNCATE_GAP_S` before one, and after it until the set's truncate_lut has
changed and `truncating` is false on each server that answered ok (at most
`TRUNCATE_WAIT_S`), then `TRUNCATE_GAP_S` again."""

import re
import time
from dataclasses import dataclass, field

from compare import classify, normalise_info, run_step, same
from steps import environment, render, truncates_own_set

# Citrine allows 1023 sets per namespace, the reference 4095: restart both
# servers before a run has used this many set names.
SETS_PER_START = 1000
TRUNCATE_GAP_S = 0.005
TRUNCATE_WAIT_S = 2.0


@dataclass
class Outcome:
    """The answers of an execution: one (citrine, reference) pair per step
    run, up to and including the first that differs (`diff_at`, or None)."""

    steps: list
    answers: list = field(default_factory=list)
    diff_at: int = None
    crashed: str = None  # the server that died at step diff_at, if one did

    @property
    def signature(self):
        """What the first difference is: the step's kind and how it differs."""
        if self.diff_at is None:
            return None
        if self.crashed:
            return (self.steps[self.diff_at].kind, f"{self.crashed} crashed")
        cit, ref = self.answers[self.diff_at]
        return (self.steps[self.diff_at].kind, classify(cit, ref))


class Pair:
    def __init__(self, citrine, reference, log=print):
        self.servers = (citrine, reference)
        self.log = log
        self.sets_used = 0
        self.executions = 0
        self.restarts = 0

    def start(self):
        for server in self.servers:
            server.start()
        self.sets_used = 0

    def stop(self):
        for server in self.servers:
            server.stop()

    def restart(self):
        self.stop()
        self.start()
        self.restarts += 1

    def fresh_set(self, tag):
        if self.sets_used >= SETS_PER_START:
            self.log(f"  (restarting both servers: {self.sets_used} set names used)")
            self.restart()
        self.sets_used += 1
        self.executions += 1
        return f"d{tag}-{self.executions}"

    def execute(self, steps, tag="x"):
        set_name = self.fresh_set(tag)
        envs = [environment(server.client, set_name) for server in self.servers]
        outcome = Outcome(steps=list(steps))
        for index, step in enumerate(steps):
            code = compile(render(step), f"<step {index + 1}>", "eval")
            if truncates_own_set(step):
                answers = self.fenced_truncate(envs, code, set_name)
            else:
                answers = tuple(run_step(env, code) for env in envs)
            answers = tuple(normalise_info(step.kind, a) for a in answers)
            outcome.answers.append(answers)
            outcome.crashed = self.dead_server(answers)
            if outcome.crashed:
                self.log(f"  ({outcome.crashed} died at step {index + 1}: restarting both)")
                self.restart()
            if outcome.crashed or not same(*answers):
                outcome.diff_at = index
                outcome.steps = outcome.steps[:index + 1]
                break
        return outcome

    def dead_server(self, answers):
        """The name of a server that has exited (after an answer that lost
        its connection, waiting a moment for the process to go), or None."""
        lost = any(a and a[0] == "error" and a[1] in (-10, -11) for a in answers)
        deadline = time.monotonic() + (2.0 if lost else 0.0)
        while True:
            for server in self.servers:
                if server.proc is None or server.proc.poll() is not None:
                    return server.name
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def fenced_truncate(self, envs, code, set_name):
        """Runs a truncation of the set so that every later step sees it
        applied and no earlier write shares its millisecond (module doc)."""
        before = [self.truncate_state(server, set_name)[0] for server in self.servers]
        time.sleep(TRUNCATE_GAP_S)
        answers = tuple(run_step(env, code) for env in envs)
        deadline = time.monotonic() + TRUNCATE_WAIT_S
        for server, lut, answer in zip(self.servers, before, answers):
            if lut is None or (answer and answer[0] in ("error", "client-exception")):
                continue  # no set yet (so no record to truncate), or refused
            while time.monotonic() < deadline:
                now_lut, truncating = self.truncate_state(server, set_name)
                if now_lut != lut and truncating == "false":
                    break
                time.sleep(0.001)
        time.sleep(TRUNCATE_GAP_S)
        return answers

    @staticmethod
    def truncate_state(server, set_name):
        """A set's (truncate_lut, truncating) as its server reports them."""
        answer = server.client.info_random_node(f"sets/test/{set_name}")
        lut = re.search(r"truncate_lut=(\d+)", answer)
        truncating = re.search(r"truncating=(\w+)", answer)
        return (lut.group(1) if lut else None, truncating.group(1) if truncating else None)
