#!/usr/bin/env bash
# Creates <repo>/.venv and installs the Python compatibility-suite requirements
# (official Aerospike Python client + pytest) from tests/compat/requirements.txt.
# Idempotent: re-running only installs what is missing or of another version.
set -euo pipefail

REPO="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$REPO/.venv"
REQ="$REPO/tests/compat/requirements.txt"
PY="${PYTHON:-python3}"

die() { echo "setup-python.sh: error: $*" >&2; exit 1; }

command -v "$PY" >/dev/null 2>&1 || die "$PY not found; install Python 3 (e.g. apt-get install -y python3)"
[ -f "$REQ" ] || die "missing $REQ"

venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -m pip --version >/dev/null 2>&1; }

if ! venv_ok; then
    rm -rf "$VENV"
    errf="$(mktemp)"
    trap 'rm -f "$errf"' EXIT
    if ! "$PY" -m venv "$VENV" >/dev/null 2>"$errf"; then
        rm -rf "$VENV"
        # Debian/Ubuntu ship venv/ensurepip separately.
        if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
            echo "setup-python.sh: python3 -m venv failed; installing python3-venv" >&2
            export DEBIAN_FRONTEND=noninteractive
            pyver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
            apt-get update -qq >/dev/null || die "apt-get update failed"
            apt-get install -y -qq python3-venv >/dev/null 2>&1 \
                || apt-get install -y -qq "python${pyver}-venv" >/dev/null 2>&1 \
                || die "apt-get install python3-venv failed"
            "$PY" -m venv "$VENV" || die "python3 -m venv $VENV failed even after installing python3-venv"
        else
            cat "$errf" >&2 || true
            die "python3 -m venv failed; install python3-venv (as root: apt-get install -y python3-venv)"
        fi
    fi
fi

# Fast path: everything already installed at the pinned versions.
if "$VENV/bin/python" - "$REQ" <<'PYEOF' 2>/dev/null
import sys
from importlib.metadata import version, PackageNotFoundError
ok = True
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line:
        continue
    name, _, want = line.partition("==")
    try:
        if want and version(name.strip()) != want.strip():
            ok = False
    except PackageNotFoundError:
        ok = False
sys.exit(0 if ok else 1)
PYEOF
then
    exit 0
fi

export PIP_DISABLE_PIP_VERSION_CHECK=1
"$VENV/bin/python" -m pip install -q --only-binary=aerospike -r "$REQ" \
    || die "pip install -r $REQ failed (the aerospike client must install as a prebuilt wheel for $("$VENV/bin/python" -V))"
"$VENV/bin/python" -c 'import aerospike, pytest' || die "installed packages do not import"
