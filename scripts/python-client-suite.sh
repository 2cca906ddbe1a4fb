#!/usr/bin/env bash
# Runs the official Aerospike Python client's own test suite (the pytest
# tests in test/new_tests of aerospike-client-python, taken at the git tag
# of the client version it installs) against a fresh citrined, against the
# reference server, or against both in one run, and prints a categorized
# summary: counts per target, each failure grouped by test file and cause,
# and, when the reference ran too, which failures are Citrine's (pass on
# the reference) and which are not (fail there as well).
#
#   scripts/python-client-suite.sh                   # citrined (release build)
#   TARGET=both scripts/python-client-suite.sh       # reference, then citrined
#   NODES=3 scripts/python-client-suite.sh           # a cluster of three
#
# Environment (all optional):
#   PY_CLIENT_VERSION  PyPI version of `aerospike` to install, as a prebuilt
#                      wheel, and git tag of the suite (default 19.0.0)
#   PY_CLIENT_REPO     a git directory (bare or not) of aerospike-client-python
#                      holding that tag, e.g. a local clone (default: the tag
#                      is cloned from github.com/aerospike/aerospike-client-
#                      python, which needs the network). The PyPI sdist
#                      carries no tests, hence the git source.
#   TARGET             citrined (default), reference, or both (the reference
#                      first, then citrined, then the comparison)
#   REFERENCE          the reference server's run.sh (default:
#                      ../shared/reference/aerospike-ce-8.1.2/run.sh beside
#                      the repository); one node, namespaces test and bar
#   REF_PORT           its service port (default: first free in 3450-3499)
#   REF_REPORT         a report.xml of an earlier reference run to compare
#                      citrined's failures with, instead of running it again
#   CITRINED, NO_BUILD, PORT, PORT_LAST, NODES, CITRINED_ARGS
#                      as in the other client suites (lib/citrined-run.sh):
#                      a release build unless CITRINED is given; NODES=3 runs
#                      citrined as a cluster of three (the reference stays one
#                      node); PORT_LAST bounds the nodes' ports (default 3449)
#   FILES              test files under new_tests/, e.g. "test_kv.py test_touch.py"
#                      (default: the whole directory)
#   PYTEST_ARGS        more pytest arguments, e.g. "-k nested"
#   SUITE_TIMEOUT      seconds one target's run may take (default 3600)
#   MRT                1 (default): after citrined's run, a second citrined run
#                      of the transaction tests (test_mrt_api.py,
#                      test_mrt_functionality.py) on nodes whose `test` is a
#                      strong-consistency namespace (serve-data on, the
#                      roster set), the suite told it runs against an
#                      enterprise server (what those tests need to run
#                      instead of skipping); 0 skips that run. Not run
#                      when FILES names no test_mrt file.
#   PYTHON             interpreter for the suite's venv (default python3)
#   VENV               venv to use or create (default $WORK/venv; never the
#                      project's .venv): aerospike and pytest (the suite's
#                      requirements.txt pin) are installed into it
#   WORK               work dir (default: a new mktemp -d; kept at the end)
#
# Enterprise-only tests (security, XDR, transactions, compression, ...) are
# skipped on both servers by the suite's own markers: config.conf names the
# server under [community-edition] only — except in the MRT run (above),
# which names it under [enterprise-edition].
#
# Output in $WORK: per target a directory (runs/reference, runs/citrined
# or runs/citrined-N) with pytest's log, its JUnit report (report.xml) and the
# server logs; summary.txt and failures.txt (every failure with its
# message) at the top; the summary also on stdout.
# Exit status: 0 when the suite ran (failing tests are the baseline, not
# fatal); 2 when it could not run.
set -euo pipefail

VER="${PY_CLIENT_VERSION:-19.0.0}"
TARGET="${TARGET:-citrined}"
SUITE_TIMEOUT="${SUITE_TIMEOUT:-3600}"
UPSTREAM=https://github.com/aerospike/aerospike-client-python

SCRIPT_NAME=python-client-suite.sh
WORK_PREFIX=python-client-suite
NEEDS_GO=0
case "$TARGET" in
    citrined | both) ;;
    reference) NEEDS_CITRINED=0 ;;
    *) echo "$SCRIPT_NAME: error: TARGET must be citrined, reference or both" >&2; exit 2 ;;
esac
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
REFERENCE="${REFERENCE:-$REPO/../shared/reference/aerospike-ce-8.1.2/run.sh}"
command -v git >/dev/null 2>&1 || die "git not found in PATH"

REF_PID=""
stop_reference() {
    if [ -n "$REF_PID" ] && kill -0 "$REF_PID" 2>/dev/null; then
        kill "$REF_PID" 2>/dev/null || true
        wait "$REF_PID" 2>/dev/null || true
    fi
    REF_PID=""
}
trap 'cleanup; stop_reference' EXIT

# --------------------------------------------------------- the suite's source
# suite_git_dir: prints a git directory holding tag $VER (dies, from the
# command substitution, when there is none).
suite_git_dir() {
    local dir="${PY_CLIENT_REPO:-}"
    if [ -n "$dir" ]; then
        git -C "$dir" rev-parse --git-dir >/dev/null 2>&1 \
            || die "PY_CLIENT_REPO=$dir is not a git directory"
        git -C "$dir" rev-parse -q --verify "refs/tags/$VER^{commit}" >/dev/null \
            || die "$dir has no tag $VER (set PY_CLIENT_REPO to a git directory of aerospike-client-python that has it)"
        echo "$dir"
        return
    fi
    echo "== git clone --bare --depth 1 --branch $VER $UPSTREAM" >&2
    rm -rf "$WORK/client-src.git"
    timeout 600 git clone -q --bare --depth 1 --branch "$VER" "$UPSTREAM" "$WORK/client-src.git" \
        >"$WORK/git-clone.log" 2>&1 \
        || die "no source of the suite: cloning tag $VER of $UPSTREAM failed (see $WORK/git-clone.log), and there is no local copy (set PY_CLIENT_REPO to a git directory of aerospike-client-python holding tag $VER)"
    echo "$WORK/client-src.git"
}

GIT_DIR_SRC=$(suite_git_dir)
SUITE_COMMIT=$(git -C "$GIT_DIR_SRC" rev-parse "refs/tags/$VER^{commit}")
echo "== suite: test/ of aerospike-client-python $VER (commit ${SUITE_COMMIT:0:12}, from $GIT_DIR_SRC)"
rm -rf "$WORK/suite" && mkdir -p "$WORK/suite"
git -C "$GIT_DIR_SRC" archive "$SUITE_COMMIT" test | tar x -C "$WORK/suite" \
    || die "git archive of test/ at $VER failed"
TESTDIR="$WORK/suite/test"
[ -d "$TESTDIR/new_tests" ] || die "tag $VER has no test/new_tests"

# ------------------------------------------------------------- client + venv
PYTHON="${PYTHON:-python3}"
VENV="${VENV:-$WORK/venv}"
if [ ! -x "$VENV/bin/python" ]; then
    echo "== $PYTHON -m venv $VENV"
    "$PYTHON" -m venv "$VENV" >"$WORK/venv.log" 2>&1 \
        || { cat "$WORK/venv.log" >&2; die "cannot create a venv with $PYTHON"; }
fi
PYTEST_PIN=$(grep -E '^pytest==' "$TESTDIR/requirements.txt" 2>/dev/null || echo pytest)
echo "== pip install aerospike==$VER (prebuilt wheel only) $PYTEST_PIN"
"$VENV/bin/python" -m pip install --disable-pip-version-check -q --only-binary aerospike \
    "aerospike==$VER" "$PYTEST_PIN" >"$WORK/pip-install.log" 2>&1 \
    || { tail -20 "$WORK/pip-install.log" >&2; die "pip install failed (no wheel of aerospike $VER for $("$VENV/bin/python" --version)?)"; }
CLIENT_VERSION=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("aerospike"))')
[ "$CLIENT_VERSION" = "$VER" ] || die "the venv holds aerospike $CLIENT_VERSION, not $VER"
echo "   aerospike $CLIENT_VERSION, $("$VENV/bin/python" --version)"

# ------------------------------------------------------------------- servers
# start_reference DIR: the reference server on 127.0.0.1:$REF_PORT, its
# work directory in DIR; waits until both namespaces are rebalanced.
start_reference() {
    local dir=$1
    [ -x "$REFERENCE" ] || die "no reference server at $REFERENCE (set REFERENCE to its run.sh)"
    if [ -z "${REF_PORT:-}" ]; then
        REF_PORT=$(free_node_port 3450 3499)
        [ -n "$REF_PORT" ] || die "no free port in 3450-3499 for the reference server"
    fi
    port_free "$REF_PORT" || die "port $REF_PORT is in use"
    echo "== starting the reference server ($REFERENCE) on 127.0.0.1:$REF_PORT"
    "$REFERENCE" "$REF_PORT" "$dir/asd" >"$dir/server.log" 2>&1 &
    REF_PID=$!
    wait_listening "$REF_PORT" "$REF_PID" "$dir/server.log" "the reference server"
    for _ in $(seq 1 300); do
        [ "$(grep -c '} rebalanced' "$dir/asd/asd.log" 2>/dev/null)" -ge 2 ] && return 0
        kill -0 "$REF_PID" 2>/dev/null || die "the reference server exited (see $dir/asd/asd.log)"
        sleep 0.1
    done
    die "the reference server did not rebalance its namespaces in 30 s (see $dir/asd/asd.log)"
}

stop_citrined() {
    local pid
    for pid in $SERVER_PID $PEER_PIDS; do
        kill -0 "$pid" 2>/dev/null || echo "!! citrined (pid $pid) is no longer running after the suite"
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    SERVER_PID=""
    PEER_PIDS=""
}

# ---------------------------------------------------------------------- runs
# run_suite NAME PORT: writes config.conf for 127.0.0.1:PORT and runs
# pytest over the suite from test/ (the suite reads ./config.conf and its
# Lua files from there); log and report.xml in $WORK/NAME.
run_suite() {
    local name=$1 port=$2 start end rc
    local out="$WORK/runs/$name"
    cat >"$TESTDIR/config.conf" <<CONF
[input-validation]
validate_keys: true

[${EDITION:-community}-edition]
hosts: 127.0.0.1:$port
CONF
    local files=(new_tests/)
    if [ -n "${RUN_FILES:-}" ]; then
        files=()
        for f in $RUN_FILES; do files+=("new_tests/$f"); done
    elif [ -n "${FILES:-}" ]; then
        files=()
        for f in $FILES; do files+=("new_tests/$f"); done
    fi
    # shellcheck disable=SC2206
    local args=(-p no:cacheprovider -rfEs --junitxml="$out/report.xml" ${PYTEST_ARGS:-})
    echo "== pytest ${files[*]} against $name on 127.0.0.1:$port"
    start=$(date +%s)
    set +e
    (cd "$TESTDIR" && nice timeout "$SUITE_TIMEOUT" "$VENV/bin/python" -m pytest "${args[@]}" "${files[@]}") \
        >"$out/pytest.log" 2>&1
    rc=$?
    set -e
    end=$(date +%s)
    echo "$((end - start))" >"$out/seconds"
    echo "   exit $rc after $((end - start)) s: $(tail -1 "$out/pytest.log")"
    [ "$rc" = 124 ] && echo "!! the run hit SUITE_TIMEOUT=$SUITE_TIMEOUT s"
    [ -s "$out/report.xml" ] || { tail -30 "$out/pytest.log" >&2; die "pytest wrote no report for $name"; }
}

REPORTS=()
if [ "$TARGET" != "citrined" ]; then
    mkdir -p "$WORK/runs/reference"
    start_reference "$WORK/runs/reference"
    run_suite reference "$REF_PORT"
    kill -0 "$REF_PID" 2>/dev/null || echo "!! the reference server is no longer running after the suite"
    stop_reference
    REPORTS+=("reference=$WORK/runs/reference/report.xml")
elif [ -n "${REF_REPORT:-}" ]; then
    [ -s "$REF_REPORT" ] || die "REF_REPORT=$REF_REPORT is not a report"
    REPORTS+=("reference=$REF_REPORT")
fi
if [ "$TARGET" != "reference" ]; then
    NAME=citrined
    [ "${NODES:-1}" -gt 1 ] && NAME="citrined-$NODES"
    WORK_SERVER="$WORK/runs/$NAME"
    mkdir -p "$WORK_SERVER"
    if [ "${NODES:-1}" -gt 1 ]; then
        WORK="$WORK_SERVER" start_cluster "$NODES"
    else
        WORK="$WORK_SERVER" start_citrined
    fi
    run_suite "$NAME" "$PORT"
    stop_citrined
    REPORTS+=("$NAME=$WORK_SERVER/report.xml")
fi
MRT_FILES="test_mrt_api.py test_mrt_functionality.py"
if [ "$TARGET" != "reference" ] && [ "${MRT:-1}" = "1" ] \
    && { [ -z "${FILES:-}" ] || [[ " $FILES " == *" test_mrt"* ]]; }; then
    NAME="citrined-mrt"
    [ "${NODES:-1}" -gt 1 ] && NAME="citrined-$NODES-mrt"
    WORK_SERVER="$WORK/runs/$NAME"
    mkdir -p "$WORK_SERVER"
    WORK="$WORK_SERVER" start_sc_test "${NODES:-1}"
    EDITION=enterprise RUN_FILES="$MRT_FILES" run_suite "$NAME" "$PORT"
    stop_citrined
    REPORTS+=("$NAME=$WORK_SERVER/report.xml")
fi

# ------------------------------------------------------------------- summary
"$VENV/bin/python" - "$WORK" "$CLIENT_VERSION" "${REPORTS[@]}" <<'PY'
import collections, os, re, sys
import xml.etree.ElementTree as ET

work, version, *specs = sys.argv[1:]


def load(path):
    """test id -> (outcome, message, detail) from a pytest JUnit report."""
    tests = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        cls = case.get("classname", "")
        parts = cls.split(".")
        mod = next((p for p in parts if p.startswith("test_")), parts[-1])
        rest = parts[parts.index(mod) + 1:] if mod in parts else []
        tid = "::".join([mod + ".py"] + rest + [case.get("name", "")])
        outcome, message, detail = "passed", "", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed" if child.tag == "failure" else "error"
                message, detail = child.get("message", ""), child.text or ""
                break
            if child.tag == "skipped":
                xfail = child.get("type") == "pytest.xfail"
                outcome = "xfailed" if xfail else "skipped"
                message = child.get("message", "")
        tests[tid] = (outcome, message, detail)
    return tests


def cause(message, detail):
    """A short cause: the Aerospike exception and result code raised, a
    missing expected exception, or the assertion's first line."""
    text = message + "\n" + detail
    m = re.search(r"aerospike\.exception\.(\w+): \((-?\d+)", text) or \
        re.search(r"exception\.(\w+): \((-?\d+)", text)
    if m and "DID NOT RAISE" not in message:
        return f"raised {m.group(1)} ({m.group(2)})"
    m = re.search(r"DID NOT RAISE <class '([\w.]+)'>", text)
    if m:
        return f"did not raise {m.group(1).rsplit('.', 1)[-1]}"
    first = (message.splitlines() or [""])[0]
    first = re.sub(r"\s+", " ", first)
    return first[:110] or "(no message)"


def tally(path, tests):
    """pytest's own closing counts (they tell xpassed from passed, which
    the JUnit report does not), from the log beside the report; the
    report's counts when there is no log."""
    log = os.path.join(os.path.dirname(path), "pytest.log")
    keys = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
    if os.path.exists(log):
        lines = [l for l in open(log, errors="replace").read().splitlines() if l.startswith("=")]
        found = dict((k.rstrip("s") if k == "errors" else k, int(n))
                     for n, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)",
                                            lines[-1] if lines else ""))
        if found:
            return {k: found.get(k, 0) for k in keys}
    c = collections.Counter(o for o, _, _ in tests.values())
    return {k: c[k] for k in keys}


runs = []
out = [f"aerospike-client-python {version} test suite (test/new_tests)", ""]
out.append(f"{'target':<12} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8} "
           f"{'xfailed':>8} {'xpassed':>8} {'seconds':>8}")
for spec in specs:
    name, path = spec.split("=", 1)
    tests = load(path)
    runs.append((name, tests))
    t = tally(path, tests)
    secs_path = os.path.join(os.path.dirname(path), "seconds")
    secs = open(secs_path).read().strip() if os.path.exists(secs_path) else "-"
    out.append(f"{name:<12} {t['passed']:>7} {t['failed']:>7} {t['error']:>7} {t['skipped']:>8} "
               f"{t['xfailed']:>8} {t['xpassed']:>8} {secs:>8}")
out.append("(xpassed: marked xfail by the suite, passed anyway)")

ref = dict(runs).get("reference")
bad = ("failed", "error")
details = []
for name, tests in runs:
    failing = {t: v for t, v in tests.items() if v[0] in bad}
    if not failing:
        continue
    groups = collections.defaultdict(list)
    for tid, (o, msg, det) in failing.items():
        if name != "reference" and ref is not None:
            r = ref.get(tid, ("absent",))[0]
            side = "fails on the reference too" if r in bad else (
                "passes on the reference" if r == "passed" else f"{r} on the reference")
        else:
            side = ""
        groups[(side, tid.split("::")[0], cause(msg, det))].append(tid)
    compared = ref is not None and name != "reference"
    out += ["", f"{name}: {len(failing)} failing, by file and cause"
            + (" (compared with the reference)" if compared else "") + ":"]
    for (side, f, c), tids in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
        out.append(f"  {len(tids):4d}  {side + ': ' if side else ''}{f}: {c}")
    details.append(f"## {name}: {len(failing)} failing")
    for tid in sorted(failing):
        o, msg, det = failing[tid]
        extra = f"  [reference: {ref.get(tid, ('absent',))[0]}]" if ref is not None and name != "reference" else ""
        details.append(f"- [{o}] {tid}{extra}\n    {cause(msg, det)}\n    {msg[:400]!r}")
    details.append("")
    if ref is not None and name != "reference":
        gained = sorted(t for t, v in tests.items() if v[0] == "passed" and ref.get(t, ("",))[0] in bad)
        ran_differently = sorted(t for t, v in tests.items()
                                 if (v[0] in ("skipped", "xfailed")) != (ref.get(t, (v[0],))[0] in ("skipped", "xfailed")))
        if gained:
            out += ["", f"{name}: {len(gained)} pass here and fail on the reference:"] + [f"  {t}" for t in gained]
        if ran_differently:
            out += ["", f"{name}: {len(ran_differently)} skipped or xfailed on one server and not on the other:"] + \
                   [f"  {t}: {v[0]} here, {ref.get(t, ('absent',))[0]} on the reference"
                    for t in ran_differently for v in [tests[t]]]

skips = collections.Counter()
for name, tests in runs[:1]:
    for o, msg, _ in tests.values():
        if o in ("skipped", "xfailed"):
            reason = re.sub(r"^.*?:\d+: ", "", msg)[:100]
            skips[f"{o}: {reason}"] += 1
out += ["", f"skipped / xfailed on {runs[0][0]}, by reason:"] + [f"  {n:4d}  {k}" for k, n in skips.most_common()]
summary = "\n".join(out)
print(summary)
open(os.path.join(work, "summary.txt"), "w").write(summary + "\n")
open(os.path.join(work, "failures.txt"), "w").write("\n".join(details) + "\n")
print(f"\nevery failure with its message: {work}/failures.txt")
PY
exit 0
