"""Helpers shared by the scripts that drive the official Go client's
benchmark tool (go-benchmark.sh, go-benchmark-slices.sh): its command
line, the pattern of its per-second totals, a process's CPU ticks, and how
to stop a run (the tool's `-d` is not a duration: it runs until stopped).
"""
import os
import re
import signal
import subprocess

# Clock ticks per second of /proc/PID/stat's utime and stime.
TCK = os.sysconf("SC_CLK_TCK")

# The tool's per-second line: totals since it started.
TOTAL_RE = re.compile(r"total\(tps=(\d+) timeouts=(\d+) errors=(\d+), count=(\d+)\)")


def cpu_ticks(pid):
    """utime + stime of a process (fields 14 and 15 of /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return int(f[11]) + int(f[12])


def tool_args(bench, port, keys, conc, workload, extra=()):
    """The tool's command line against 127.0.0.1:PORT, namespace test,
    one integer bin."""
    return [bench, "-h", "127.0.0.1", "-p", str(port), "-n", "test", "-s", "testset",
            "-k", str(keys), "-c", str(conc), "-o", "I", "-w", workload, *extra]


def stop(p):
    """Stops a run of the tool: SIGINT, then SIGKILL after 10 s."""
    p.send_signal(signal.SIGINT)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
