#!/usr/bin/env bash
# Runs Citrine's Java compatibility suite (tests/java: JUnit tests written
# here, driving the official Aerospike Java client from Maven Central,
# unmodified) against a fresh citrined, and prints a summary.
#
#   scripts/java-client-suite.sh
#
# Environment (all optional):
#   JAVA_CLIENT_VERSION  com.aerospike:aerospike-client-jdk8 version
#                        (default: the one tests/java/pom.xml names; before
#                        9.1 the Since91* tests are left out)
#   CITRINED             server binary (default: a release build, as the
#                        other client scripts do; NO_BUILD=1 copies the
#                        existing target/release/citrined)
#   PORT                 service port (default: first free port in 3400-3449)
#   NODES                run against a cluster of this many nodes on
#                        loopback (default 1; with 2 or more, namespaces
#                        `test` and `bar` keep two copies of each record,
#                        and the client is given the first node; after
#                        the suite, NodeLossTest kills one peer while the
#                        client works, and NodeReturnTest has it come back
#                        empty while the client writes and reads)
#   TESTS                surefire -Dtest pattern, e.g. "KvTest" or
#                        "QueryTest#*paging*" (default: every test class)
#   WORK                 work dir (default: a new mktemp -d; kept at the end)
#
# Needs java (17 or newer) and mvn, and Maven Central (the client, JUnit
# and Maven's plugins; a second run is served from ~/.m2).
#
# Output: Maven's log, the surefire reports and the server log in $WORK,
# the summary also on stdout. Exit status: 0 when every test passed, 1 when
# a test failed, 2 when the suite could not run. Unlike the other client
# suites (the clients' own tests, whose failures are a recorded baseline),
# these tests are ours: each one is expected to pass.
set -euo pipefail

SCRIPT_NAME=java-client-suite.sh
WORK_PREFIX=java-client-suite
NEEDS_GO=0
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
command -v java >/dev/null 2>&1 || die "java not found in PATH"
command -v mvn >/dev/null 2>&1 || die "mvn not found in PATH"

# Maven builds in a copy, so the source tree gets no target/ directory.
rm -rf "$WORK/java"
cp -r "$REPO/tests/java" "$WORK/java"
MVN=(mvn -B -ntp -f "$WORK/java/pom.xml")
if [ -n "${JAVA_CLIENT_VERSION:-}" ]; then
    MVN+=("-Daerospike.client.version=$JAVA_CLIENT_VERSION")
    # A client before 9.1 has no expression indexes and no queries by
    # index name.
    case "$JAVA_CLIENT_VERSION" in
        [1-8].* | 9.0.*) MVN+=("-Dcompat.testExclude=**/Since91*.java") ;;
    esac
fi

echo "== mvn test-compile (downloads the client and JUnit on a first run)"
"${MVN[@]}" test-compile >"$WORK/mvn-compile.log" 2>&1 \
    || { tail -40 "$WORK/mvn-compile.log" >&2; die "mvn test-compile failed"; }

if [ "${NODES:-1}" -gt 1 ]; then
    start_cluster "$NODES"
else
    start_citrined
fi

echo "== mvn test against 127.0.0.1:$PORT"
TEST_ARGS=()
[ -n "${TESTS:-}" ] && TEST_ARGS+=("-Dtest=$TESTS" "-Dsurefire.failIfNoSpecifiedTests=false")
status=0
CITRINE_HOST=127.0.0.1 CITRINE_PORT=$PORT CITRINE_NODES=${NODES:-1} "${MVN[@]}" surefire:test "${TEST_ARGS[@]}" \
    >"$WORK/mvn-test.log" 2>&1 || status=$?
if [ "${NODES:-1}" -gt 1 ] && [ -z "${TESTS:-}" ] && [ "$status" -eq 0 ]; then
    # Last, as it leaves the cluster a node short: kill one peer while the
    # client works (the test skips itself without CITRINE_PEER_PIDS).
    echo "== NodeLossTest: one of the $NODES nodes is killed"
    CITRINE_HOST=127.0.0.1 CITRINE_PORT=$PORT CITRINE_NODES=$NODES CITRINE_PEER_PIDS="$PEER_PIDS" \
        "${MVN[@]}" surefire:test -Dtest=NodeLossTest >"$WORK/mvn-test-node-loss.log" 2>&1 || status=$?
fi
if [ "${NODES:-1}" -gt 1 ] && [ -z "${TESTS:-}" ] && [ "$status" -eq 0 ]; then
    # The killed node (node 2, the first peer) comes back empty while
    # NodeReturnTest writes and reads: started a few seconds into the test.
    echo "== NodeReturnTest: node 2 comes back while the client works"
    signal="$WORK/node-return-reading"
    rm -f "$signal"
    CITRINE_HOST=127.0.0.1 CITRINE_PORT=$PORT CITRINE_NODES=$NODES CITRINE_NODE_RETURNS="$signal" \
        "${MVN[@]}" surefire:test -Dtest=NodeReturnTest >"$WORK/mvn-test-node-return.log" 2>&1 &
    return_test=$!
    # The test creates the file once it is reading with the node away;
    # the node comes back a second later (or after 120 s regardless).
    for _ in $(seq 1 1200); do
        [ -e "$signal" ] && break
        kill -0 "$return_test" 2>/dev/null || break
        sleep 0.1
    done
    sleep 1
    relaunch_node 2
    wait "$return_test" || status=$?
fi
REPORTS="$WORK/java/target/surefire-reports"
compgen -G "$REPORTS/TEST-*.xml" >/dev/null \
    || { tail -40 "$WORK/mvn-test.log" >&2; die "surefire wrote no report"; }
if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    if [ "${NODES:-1}" -gt 1 ]; then tail -20 "$WORK/server-1.log" >&2; else tail -20 "$WORK/server.log" >&2; fi
    echo "$SCRIPT_NAME: citrined died during the suite" >&2
    exit 1
fi

# ----------------------------------------------------------------- summary
python3 - "$REPORTS" "$WORK" "$PORT" "${NODES:-1}" <<'PY'
import glob, sys
import xml.etree.ElementTree as ET

reports, work, port, nodes = sys.argv[1:5]
tests = failed = skipped = 0
seconds = 0.0
failures = []
version = "?"
for path in sorted(glob.glob(f"{reports}/TEST-*.xml")):
    suite = ET.parse(path).getroot()
    for prop in suite.iter("property"):
        if prop.get("name") == "aerospike.client.version":
            version = prop.get("value")
    for case in suite.iter("testcase"):
        tests += 1
        seconds += float(case.get("time") or 0)
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if case.find("skipped") is not None:
            skipped += 1
        elif problem is not None:
            failed += 1
            message = (problem.get("message") or problem.text or "").strip().splitlines()
            failures.append((f"{case.get('classname').rsplit('.', 1)[-1]}.{case.get('name')}",
                             message[0] if message else "(no message)"))
lines = [
    f"aerospike-client-jdk8 {version} against citrined on 127.0.0.1:{port}"
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
if [ "$status" -ne 0 ]; then
    [ "${NODES:-1}" -gt 1 ] && cluster_story
    echo "$SCRIPT_NAME: a test failed (Maven's log: $WORK/mvn-test.log)" >&2
    exit 1
fi
