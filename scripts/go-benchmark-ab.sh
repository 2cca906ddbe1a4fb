#!/usr/bin/env bash
# A/B comparison of two citrined variants under the official Go client's
# benchmark tool, in one run: scripts/go-benchmark.sh for variant A, then
# for B, ROUNDS times, alternating (so drift on a shared machine hits both),
# then the median and the range of each figure per variant and workload.
#
#   A_ARGS="--service-io io_uring" B_ARGS="--service-io epoll" scripts/go-benchmark-ab.sh
#   B_BIN=/tmp/citrined-old scripts/go-benchmark-ab.sh
#
# Environment: A_BIN, B_BIN (server binaries; default: a copy of this
# tree's release build, built once), A_ARGS, B_ARGS (extra citrined
# flags), ROUNDS (3); DURATION, KEYS, WORKLOADS, CONCURRENCY and
# GO_CLIENT_VERSION pass through to go-benchmark.sh.
# A run-to-run spread of 10-15 % is common on a 2-vCPU VM (bench/RESULTS.md):
# compare medians over several rounds, not single runs.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS="${ROUNDS:-3}"
WORK="$(mktemp -d /tmp/go-benchmark-ab.XXXXXX)"
echo "== work dir: $WORK"

if [ -z "${A_BIN:-}" ] || [ -z "${B_BIN:-}" ]; then
    echo "== cargo build --release -p citrine-server"
    cargo build --release -p citrine-server >"$WORK/cargo-build.log" 2>&1 \
        || { tail -20 "$WORK/cargo-build.log" >&2; exit 2; }
    cp target/release/citrined "$WORK/citrined"
fi
A_BIN="${A_BIN:-$WORK/citrined}"
B_BIN="${B_BIN:-$WORK/citrined}"

for round in $(seq 1 "$ROUNDS"); do
    for variant in A B; do
        if [ "$variant" = A ]; then bin="$A_BIN"; args="${A_ARGS:-}"; else bin="$B_BIN"; args="${B_ARGS:-}"; fi
        echo "== round $round, variant $variant: $bin $args ($(date -u +%H:%M:%S) UTC)"
        # One round of go-benchmark.sh per A/B round (ROUNDS is this
        # script's; go-benchmark.sh would read it too).
        ROUNDS=1 CITRINED="$bin" CITRINED_ARGS="$args" WORK="$WORK/run-$round-$variant" \
            scripts/go-benchmark.sh >"$WORK/run-$round-$variant.log" 2>&1 \
            || { tail -20 "$WORK/run-$round-$variant.log" >&2; exit 2; }
        # The summary rows: workload, ops/s, server us/op, client us/op,
        # and with the ceiling (NOOP=1, the default) its ops/s, its server
        # us/op and citrined's share of it.
        sed -n '/^== summary/,$p' "$WORK/run-$round-$variant.log" | tail -n +3 \
            | sed "s/^/$variant /" | tee -a "$WORK/rows.txt"
    done
done

python3 - "$WORK/rows.txt" "${A_BIN} ${A_ARGS:-}" "${B_BIN} ${B_ARGS:-}" <<'PY'
import statistics, sys
rows, names = sys.argv[1], {"A": sys.argv[2], "B": sys.argv[3]}
data = {}
for line in open(rows):
    fields = line.split()
    if len(fields) not in (5, 8):
        continue  # a blank or heading line of the run's summary
    variant, workload, ops, server, client = fields[:5]
    share = float(fields[7]) if len(fields) == 8 else float("nan")
    data.setdefault((workload, variant), []).append(
        (float(ops.replace(",", "")), float(server), float(client), share))
print("\n== medians over rounds (range in brackets)")
for variant in "AB":
    print(f"   {variant}: {names[variant]}")
print(f"{'workload':10s} {'':2s} {'ops/s':>22s} {'server us/op':>18s} {'client us/op':>18s} {'of ceiling':>18s}")
for (workload, variant) in sorted(data):
    runs = data[(workload, variant)]
    cols = []
    for index, fmt in ((0, "{:,.0f}"), (1, "{:.1f}"), (2, "{:.1f}"), (3, "{:.2f}")):
        values = [run[index] for run in runs]
        cols.append(f"{fmt.format(statistics.median(values))} [{fmt.format(min(values))}-{fmt.format(max(values))}]")
    print(f"{workload:10s} {variant:2s} {cols[0]:>22s} {cols[1]:>18s} {cols[2]:>18s} {cols[3]:>18s}")
PY
