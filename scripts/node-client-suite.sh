#!/usr/bin/env bash
# Runs the official Aerospike Node.js client's own test suite (mocha specs
# shipped in the `aerospike` npm package; the client is the C client under
# a Node binding, so this exercises both) against a fresh citrined and
# prints a summary: passing, failing (with the first line of each error),
# pending.
#
#   scripts/node-client-suite.sh
#
# Environment (all optional):
#   NODE_CLIENT_VERSION  npm version of `aerospike` to test (default: latest)
#   CITRINED             server binary (default: a release build, as the Go
#                        scripts do; NO_BUILD=1 copies the existing one)
#   PORT                 service port (default: first free port in 3400-3449)
#   NODES                run against a cluster of this many nodes on
#                        loopback (default 1; with 2 or more, namespaces
#                        `test` and `bar` keep two copies of each record,
#                        and the client is given the first node)
#   GREP                 mocha --grep pattern (default: every spec)
#   FILES                spec files under test/, e.g. "get.js put.js"
#                        (default: all of test/*.js)
#   WORK                 work dir (default: a new mktemp -d; kept at the end)
#
# Needs node and npm, and the npm registry (the package, its dev
# dependencies: mocha, chai, typescript). The package ships prebuilt
# bindings; the script stops if none matches this node's ABI.
#
# Output: mocha's JSON report, the server log and summary.txt in $WORK,
# the summary also on stdout. Exit status: 0 when the suite ran (failing
# specs are reported, not fatal); 2 when it could not run.
set -euo pipefail

VER="${NODE_CLIENT_VERSION:-latest}"
GREP="${GREP:-}"

SCRIPT_NAME=node-client-suite.sh
WORK_PREFIX=node-client-suite
# shellcheck source=lib/citrined-run.sh
source "$(dirname "$0")/lib/citrined-run.sh"
command -v node >/dev/null 2>&1 || die "node not found in PATH"
command -v npm >/dev/null 2>&1 || die "npm not found in PATH"

# ------------------------------------------------------------ client package
echo "== npm pack aerospike@$VER"
rm -rf "$WORK/package" "$WORK"/aerospike-*.tgz
(cd "$WORK" && npm pack "aerospike@$VER" --silent) >"$WORK/npm-pack.log" 2>&1 \
    || { tail -20 "$WORK/npm-pack.log" >&2; die "npm pack failed"; }
tar xzf "$WORK"/aerospike-*.tgz -C "$WORK"
CLIENT="$WORK/package"
CLIENT_VERSION=$(node -p "require('$CLIENT/package.json').version")
ABI=$(node -p 'process.versions.modules')
BINDING="$CLIENT/lib/binding/node-v$ABI-linux-$(node -p 'process.arch')/aerospike.node"
[ -f "$BINDING" ] || die "aerospike@$CLIENT_VERSION has no prebuilt binding for node ABI $ABI ($BINDING)"
echo "   aerospike $CLIENT_VERSION, node $(node --version), binding node-v$ABI"

echo "== npm install (dev dependencies; no install scripts: the binding is prebuilt)"
(cd "$CLIENT" && npm install --ignore-scripts --no-audit --no-fund) >"$WORK/npm-install.log" 2>&1 \
    || { tail -20 "$WORK/npm-install.log" >&2; die "npm install failed"; }
echo "== tsc (the specs are TypeScript)"
(cd "$CLIENT/test" && npx tsc) >"$WORK/tsc.log" 2>&1 \
    || { tail -20 "$WORK/tsc.log" >&2; die "tsc failed"; }

# ------------------------------------------------------------------- server
if [ "${NODES:-1}" -gt 1 ]; then
    start_cluster "$NODES"
else
    start_citrined
fi

# --------------------------------------------------------------------- run
SPECS=()
if [ -n "${FILES:-}" ]; then
    for f in $FILES; do SPECS+=("test/$f"); done
else
    for f in "$CLIENT"/test/*.js; do SPECS+=("test/${f##*/}"); done
fi
MOCHA_ARGS=(--exit --timeout 20000 --reporter json --reporter-option "output=$WORK/report.json")
[ -n "$GREP" ] && MOCHA_ARGS+=(--grep "$GREP")
echo "== mocha (${#SPECS[@]} spec files) against 127.0.0.1:$PORT"
# The specs read their options from $OPTIONS; one of them exits early
# unless npm_package_version names the client (as `npm test` would set it).
(cd "$CLIENT" && OPTIONS="-h 127.0.0.1 -p $PORT" npm_package_version="$CLIENT_VERSION" \
    node_modules/.bin/mocha "${MOCHA_ARGS[@]}" "${SPECS[@]}") >"$WORK/mocha.log" 2>&1 || true
[ -s "$WORK/report.json" ] || { tail -30 "$WORK/mocha.log" >&2; die "mocha wrote no report"; }

# ----------------------------------------------------------------- summary
python3 - "$WORK/report.json" "$WORK" "$CLIENT_VERSION" "$PORT" "${NODES:-1}" <<'PY'
import json, sys

report, work, version, port, nodes = sys.argv[1:6]
data = json.load(open(report))
stats = data["stats"]
lines = [
    f"aerospike (Node.js) {version} against citrined on 127.0.0.1:{port}"
    + (f" (a cluster of {nodes})" if nodes != "1" else ""),
    f"passing {stats['passes']}  failing {stats['failures']}  pending {stats['pending']}  "
    f"({stats['duration'] / 1000:.0f} s)",
]
if data["failures"]:
    lines.append("")
    lines.append("failing:")
for failure in data["failures"]:
    message = (failure.get("err", {}).get("message") or "").strip().splitlines()
    lines.append(f"- {failure['fullTitle']}")
    lines.append(f"    {message[0] if message else '(no message)'}")
summary = "\n".join(lines)
print(summary)
open(f"{work}/summary.txt", "w").write(summary + "\n")
PY
