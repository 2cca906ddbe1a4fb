#!/usr/bin/env bash
# Runs the official Aerospike Java client's own test suite (the `test/`
# module of github.com/aerospike/aerospike-client-java, its SuiteAll: the
# synchronous and asynchronous tests) against a fresh citrined, or against
# the reference server, and prints a summary: counts, and each failed test
# with its first line of cause. Run on demand, not in CI; the results are
# recorded in bench/java-client-official-suite.md.
#
#   scripts/java-client-official-suite.sh
#   NODES=3 scripts/java-client-official-suite.sh      # a cluster of three
#   TARGET=reference scripts/java-client-official-suite.sh
#
# Environment (all optional):
#   JAVA_CLIENT_TAG  tag of the client repository (default 9.0.5-jdk8); its
#                    root pom.xml and test/ are taken, the client itself is
#                    com.aerospike:aerospike-client-jdk8 of the tag's
#                    version from Maven Central
#   JAVA_CLIENT_GIT  where the client repository comes from: a local git
#                    directory (bare or not) holding the tag, or a URL to
#                    clone it from (default: the public GitHub repository,
#                    cloned at the tag into $WORK)
#   TARGET           citrined (default) or reference: the reference server
#                    (Aerospike CE, one node) started by REFERENCE/run.sh
#   REFERENCE        the reference server's directory (default
#                    ../shared/reference/aerospike-ce-8.1.2 beside the
#                    repository, as /work/shared is to /work/main)
#   CITRINED         server binary (default: a release build, as the other
#                    client scripts do; NO_BUILD=1 copies the existing one)
#   PORT             service port (default: the first free one in
#                    PORT_FIRST-PORT_LAST, 3400-3449 unless set)
#   NODES            citrined only: a cluster of this many nodes on
#                    loopback (default 1; see lib/citrined-run.sh)
#   SC=1             citrined only: namespace `test` is strong-consistency
#                    (roster of the NODES nodes set and applied first), so
#                    the tests that skip on AP namespaces run
#   TESTS            surefire -Dtest pattern instead of SuiteAll, e.g.
#                    "TestQueryRPS" or "TestUDF#*" (default: SuiteAll)
#   WORK             work dir (default: a new mktemp -d; kept at the end)
#
# Needs git, java (8 or newer; tried with 17) and mvn, and Maven Central
# (the client, netty, JUnit and Maven's plugins; a second run is served
# from ~/.m2). Nothing of the client's repository is kept outside $WORK.
#
# Output: Maven's log, the surefire reports, the server log and
# summary.txt in $WORK, the summary also on stdout. Exit status: 0 when
# the suite ran (failing tests are reported, not fatal: the record in
# bench/ is the baseline); 2 when it could not run.
set -euo pipefail

TAG="${JAVA_CLIENT_TAG:-9.0.5-jdk8}"
SOURCE="${JAVA_CLIENT_GIT:-https://github.com/aerospike/aerospike-client-java.git}"
TARGET="${TARGET:-citrined}"

SCRIPT_NAME=java-client-official-suite.sh
WORK_PREFIX=java-client-official-suite
NEEDS_GO=0
case "$TARGET" in
    citrined) ;;
    reference) NEEDS_CITRINED=0 ;;
    *) echo "$SCRIPT_NAME: error: TARGET is citrined or reference, not $TARGET" >&2; exit 2 ;;
esac
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
command -v git >/dev/null 2>&1 || die "git not found in PATH"
command -v java >/dev/null 2>&1 || die "java not found in PATH"
command -v mvn >/dev/null 2>&1 || die "mvn not found in PATH"

# ------------------------------------------------------------ client tests
# take_tree: the tag's root pom.xml and test/ into $WORK/client.
take_tree() {
    local git_dir=$SOURCE
    if [ ! -d "$SOURCE" ]; then
        case "$SOURCE" in
            *://* | git@*) ;;
            *) die "JAVA_CLIENT_GIT=$SOURCE is neither a directory nor a URL" ;;
        esac
        echo "== git clone $SOURCE at $TAG"
        rm -rf "$WORK/client.git"
        git clone -q --bare --depth 1 --branch "$TAG" "$SOURCE" "$WORK/client.git" \
            >"$WORK/git-clone.log" 2>&1 \
            || { cat "$WORK/git-clone.log" >&2; die "cannot clone $SOURCE at $TAG (set JAVA_CLIENT_GIT to a local clone)"; }
        git_dir="$WORK/client.git"
    fi
    git --git-dir="$(git_dir_of "$git_dir")" rev-parse -q --verify "refs/tags/$TAG" >/dev/null \
        || die "no tag $TAG in $git_dir"
    echo "== git archive $TAG (pom.xml, test/) from $git_dir"
    rm -rf "$WORK/client" && mkdir -p "$WORK/client"
    git --git-dir="$(git_dir_of "$git_dir")" archive "$TAG" pom.xml test \
        | tar -x -C "$WORK/client" \
        || die "git archive of $TAG failed"
    [ -f "$WORK/client/test/pom.xml" ] || die "the tag $TAG has no test/pom.xml"
}

# git_dir_of DIR: DIR itself for a bare repository, DIR/.git otherwise.
git_dir_of() {
    if [ -d "$1/.git" ]; then echo "$1/.git"; else echo "$1"; fi
}

take_tree
# The test module's parent is the root pom, versioned ${revision}.
REVISION=$(sed -n 's:.*<revision>\(.*\)</revision>.*:\1:p' "$WORK/client/pom.xml" | head -1)
[ -n "$REVISION" ] || die "no <revision> in the tag's pom.xml"
echo "   client tests of $TAG (aerospike-client-jdk8 $REVISION from Maven Central)"
MVN=(mvn -B -ntp -f "$WORK/client/test/pom.xml" "-Drevision=$REVISION")

echo "== mvn test-compile (downloads the client, netty and JUnit on a first run)"
"${MVN[@]}" test-compile >"$WORK/mvn-compile.log" 2>&1 \
    || { tail -40 "$WORK/mvn-compile.log" >&2; die "mvn test-compile failed"; }

# ------------------------------------------------------------------- server
# start_reference: the reference server, one node, on $PORT; sets
# $SERVER_PID. Clients can connect once it logs its first rebalance.
start_reference() {
    local dir=${REFERENCE:-$REPO/../shared/reference/aerospike-ce-8.1.2}
    [ -x "$dir/run.sh" ] || die "no reference server at $dir (set REFERENCE)"
    [ "${NODES:-1}" = 1 ] || die "TARGET=reference runs one node only"
    if [ -z "${PORT:-}" ]; then
        PORT=$(free_node_port "$PORT_FIRST" "$PORT_LAST")
        [ -n "$PORT" ] || die "no free port in $PORT_FIRST-$PORT_LAST"
    fi
    port_free "$PORT" || die "port $PORT is in use"
    echo "== starting the reference server on 127.0.0.1:$PORT"
    "$dir/run.sh" "$PORT" "$WORK/reference" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 300); do
        grep -q "rebalanced" "$WORK/reference/asd.log" 2>/dev/null && { sleep 1; return 0; }
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; die "the reference server exited"; }
        sleep 0.1
    done
    die "the reference server did not rebalance within 30 s (see $WORK/reference/asd.log)"
}

if [ "$TARGET" = reference ]; then
    start_reference
elif [ -n "${SC:-}" ]; then
    start_sc_test "${NODES:-1}"
elif [ "${NODES:-1}" -gt 1 ]; then
    start_cluster "$NODES"
else
    start_citrined
fi

# --------------------------------------------------------------------- run
echo "== mvn test (${TESTS:-SuiteAll}) against $TARGET on 127.0.0.1:$PORT"
TEST_ARGS=(-DskipTests=false "-Dargs=-h 127.0.0.1 -p $PORT")
[ -n "${TESTS:-}" ] && TEST_ARGS+=("-Dtest=$TESTS" "-DfailIfNoTests=false")
timeout 3600 "${MVN[@]}" surefire:test "${TEST_ARGS[@]}" >"$WORK/mvn-test.log" 2>&1 || true
REPORTS="$WORK/client/test/target/surefire-reports"
compgen -G "$REPORTS/TEST-*.xml" >/dev/null \
    || { tail -40 "$WORK/mvn-test.log" >&2; die "surefire wrote no report"; }
kill -0 "$SERVER_PID" 2>/dev/null || echo "$SCRIPT_NAME: the server died during the suite" >&2

# ----------------------------------------------------------------- summary
python3 - "$REPORTS" "$WORK" "$PORT" "${NODES:-1}" "$TARGET" "$TAG" <<'PY'
import glob, sys
import xml.etree.ElementTree as ET

reports, work, port, nodes, target, tag = sys.argv[1:7]
tests = failed = skipped = 0
seconds = 0.0
failures = []
for path in sorted(glob.glob(f"{reports}/TEST-*.xml")):
    for case in ET.parse(path).getroot().iter("testcase"):
        tests += 1
        seconds += float(case.get("time") or 0)
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            skipped += 1
        elif problem is not None:
            failed += 1
            text = (problem.get("message") or problem.text or "").strip().splitlines()
            kind = (problem.get("type") or "").rsplit(".", 1)[-1]
            failures.append((f"{case.get('classname').rsplit('.', 1)[-1]}.{case.get('name')}",
                             f"{kind}: {text[0] if text else '(no message)'}"))
lines = [
    f"aerospike-client-java {tag} test/ against {target} on 127.0.0.1:{port}"
    + (f" (a cluster of {nodes})" if nodes != "1" else ""),
    f"tests {tests}  passed {tests - failed - skipped}  failed {failed}  skipped {skipped}  ({seconds:.0f} s)",
]
if failures:
    lines += ["", "failed:"]
    for name, message in failures:
        lines += [f"- {name}", f"    {message[:300]}"]
summary = "\n".join(lines)
print(summary)
open(f"{work}/summary.txt", "w").write(summary + "\n")
PY
