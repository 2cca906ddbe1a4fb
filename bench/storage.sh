#!/usr/bin/env bash
# Storage benchmark against the disk (issue 44 point 7): in one run, the disk's sequential write bandwidth (dd, before
# and after), the device engine's sustained write rate of DATA_MIB written and synced, and random reads that miss the
# page cache, through the page cache and with O_DIRECT, with the device reads counted per read
# (crates/citrine-storage/examples/disk_bench.rs says how the misses are made and what is counted).
#   DIR=/work/tmp/storage-bench DATA_MIB=2048 BODY=1500 READS=20000 bench/storage.sh
# Needs twice DATA_MIB free in DIR (dd's file is removed before the engine writes). SKIP_BUILD=1 reuses the binary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${DIR:-$root/target/storage-bench}
mib=${DATA_MIB:-2048}
body=${BODY:-1500}
reads=${READS:-20000}
mkdir -p "$dir"
if [ -z "${SKIP_BUILD:-}" ]; then
	(cd "$root" && cargo build --release -q -p citrine-storage --example disk_bench)
fi
source=$(df --output=source "$dir" | tail -1)
export BLOCK_DEV=$(basename "$(readlink -f "$source")")
echo "# $(date -u '+%F %H:%M UTC') $(git -C "$root" rev-parse --short HEAD) $(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB RAM, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# dir $dir on $source ($BLOCK_DEV), $(df -h --output=avail "$dir" | tail -1 | tr -d ' ') free; $mib MiB, $body-byte bodies, $reads reads"
sequential() {
	# Page cache then sync (as the engine writes), and O_DIRECT: MiB/s from dd's own summary.
	for flags in "conv=fdatasync" "oflag=direct"; do
		rate=$(dd if=/dev/zero of="$dir/dd.dat" bs=1M count="$mib" $flags 2>&1 | tail -1)
		echo "dd $1 ($flags, bs=1M, $mib MiB): $rate"
		rm -f "$dir/dd.dat"
	done
}
sequential before
"$root/target/release/examples/disk_bench" "$dir/engine" "$mib" "$body" "$reads"
sequential after
rm -rf "$dir"
