#!/usr/bin/env bash
# Layouts of the Badger store's tables measured against its own: what a
# day's store would cost in files, disk, open time and memory with larger
# tables or compressed ones (the levers of the missed start-up and disk
# aims of docs/benchmarks-day.md). Measurement only: the plugin always
# opens the store's own layout (1 MiB tables at every level, uncompressed,
# no block cache); the others are badgerstore.TableOptions, which only
# bench/fill sets. Run as root (it drops the page cache and makes memory
# cgroups).
#
#   bash bench/tables.sh                                   # 2,000,000 results, every layout
#   N=500000 LAYOUTS="own zstd" ROUNDS=1 bash bench/tables.sh   # a smoke run
#
# For each layout of LAYOUTS, on a fresh directory under a temp dir:
#   1. bench/fill stores N delivered results with the layout (the insert
#      path and receipt times of bench/day.sh's fill, no paged scan): the
#      fill's time and rate, and its peak anonymous memory (RssAnon sampled
#      every 100 ms: the fill's callers plus the store's memtables and
#      compactions' table builders; a comparison between layouts, not a
#      figure of Caddy's);
#   2. the store's size on disk, in all and by kind, and its tables;
#   3. ROUNDS pairs of opens with the page cache dropped, inside a memory
#      cgroup of LIMIT MiB and without one (bench/fill -n 0: the store's
#      Open alone, as Caddy's start-up spends most of its time in it), and
#      the peak anonymous memory of each;
#   4. the directory is removed (KEEP=1 keeps the temp dir).
# It ends with a table of the medians.
#
# Layouts: own (the store's), mult2 (1 MiB at the base level, doubling per
# level below it: Badger's own multiplier), 4mib and 8mib (tables of 4 or 8
# MiB at every level), snappy and zstd (1 MiB tables compressed, with the
# block cache of 16 MiB that Badger requires with compression), zstd-8mib
# (zstd with 8 MiB tables).
#
# Environment: N (2000000), LAYOUTS (own mult2 8mib snappy zstd), ROUNDS
# (3), LIMIT (256, MiB), WORKERS (64), BENCH_DIR (/var/tmp), CGROUP_PARENT,
# KEEP.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

N=${N:-2000000}
LAYOUTS=${LAYOUTS:-own mult2 8mib snappy zstd}
ROUNDS=${ROUNDS:-3}
LIMIT=${LIMIT:-256}
WORKERS=${WORKERS:-64}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
KEEP=${KEEP:-}

if [ "$(id -u)" != 0 ]; then
	echo "bench/tables.sh drops the page cache and makes memory cgroups: run it as root" >&2
	exit 1
fi

# flags LAYOUT: bench/fill's flags of the layout.
flags() {
	case $1 in
	own) echo "" ;;
	mult2) echo "-table-multiplier 2" ;;
	4mib) echo "-table-size 4194304" ;;
	8mib) echo "-table-size 8388608" ;;
	snappy) echo "-compression snappy -block-cache 16777216" ;;
	zstd) echo "-compression zstd -block-cache 16777216" ;;
	zstd-8mib) echo "-compression zstd -block-cache 16777216 -table-size 8388608" ;;
	*) return 1 ;;
	esac
}
for layout in $LAYOUTS; do
	if ! flags "$layout" >/dev/null; then
		echo "LAYOUTS: no layout $layout (own, mult2, 4mib, 8mib, snappy, zstd, zstd-8mib)" >&2
		exit 2
	fi
done

cgroup_setup
tmp=$(mktemp -d "$BENCH_DIR/pingback-tables.XXXXXX")
cg=
cleanup() {
	cgroup_remove "$cg"
	keep_or_remove "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine"
banner cores cpu memory kernel
storage_line "$tmp" "$BENCH_DIR" mount
echo "cgroups:    v$cgv, under $cgroup_parent"
banner go commit
echo "N=$N LAYOUTS=\"$LAYOUTS\" ROUNDS=$ROUNDS LIMIT=$LIMIT WORKERS=$WORKERS"

echo "== building bench/fill"
go build -o "$tmp/fill" ./bench/fill

# open_once KIND DIR FLAGS: one open of DIR after the page cache is
# dropped, inside a cgroup of LIMIT MiB when KIND is limited; prints
# "<seconds> <peak MiB>".
open_once() {
	local kind=$1 dir=$2 fl=$3
	sync
	echo 3 >/proc/sys/vm/drop_caches
	cg=$cgroup_parent/pingback-tables-$$
	if [ "$kind" = limited ]; then cgroup_make "$cg" "$LIMIT"; else cgroup_make "$cg"; fi
	# shellcheck disable=SC2086
	bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg" \
		"$tmp/fill" -dir "$dir" -n 0 -parked 0 -failed 0 -history=false -scan=false $fl >"$tmp/open.out" 2>&1
	cgroup_remove "$cg"
	cg=
	awk '/^first open:/ { d = $3 } /^peak anonymous memory/ { m = $(NF - 1) }
		END {
			# Go durations: 2.2s, 850.1ms, 900µs
			if (d ~ /ms$/) s = substr(d, 1, length(d) - 2) / 1000
			else if (d ~ /µs$/) s = substr(d, 1, length(d) - 3) / 1e6
			else if (d ~ /m[0-9.]+s$/) { split(d, p, "m"); s = p[1] * 60 + substr(p[2], 1, length(p[2]) - 1) }
			else s = substr(d, 1, length(d) - 1)
			printf "%.3f %.0f", s, m / 1024 }' "$tmp/open.out"
}

summary=()
for layout in $LAYOUTS; do
	fl=$(flags "$layout")
	dir=$tmp/store-$layout
	mkdir "$dir"
	echo "== $layout (${fl:-the default layout}): filling $N results"
	# shellcheck disable=SC2086
	"$tmp/fill" -dir "$dir" -n "$N" -workers "$WORKERS" -scan=false $fl >"$tmp/fill.out"
	sed 's/^/fill: /' "$tmp/fill.out"
	rate=$(sed -n 's|^stored .*(\([0-9]*\)/s)$|\1|p' "$tmp/fill.out")
	hwm=$(awk '/^peak anonymous memory/ { printf "%.0f", $(NF - 1) / 1024 }' "$tmp/fill.out")
	find "$dir" -type f -printf '%b %f\n' >"$tmp/files"
	all_mib=$(awk '{ all += $1 / 2 } END { printf "%.0f", all / 1024 }' "$tmp/files")
	sst_mib=$(awk '$2 ~ /\.sst$/ { sst += $1 / 2 } END { printf "%.0f", sst / 1024 }' "$tmp/files")
	tables=$(grep -c '\.sst$' "$tmp/files" || true)
	per=$(awk -v a="$all_mib" -v n="$N" 'BEGIN { printf "%.0f", a * 1048576 / n }')
	echo "disk: $all_mib MiB in all ($per bytes a result), tables $sst_mib MiB in $tables files"
	opens_u=() opens_l=() peaks_u=() peaks_l=()
	for r in $(seq "$ROUNDS"); do
		# ABBA: the odd rounds start unlimited, the even ones limited.
		if [ $((r % 2)) = 1 ]; then order="unlimited limited"; else order="limited unlimited"; fi
		for kind in $order; do
			read -r secs peak <<<"$(open_once "$kind" "$dir" "$fl")"
			echo "open $r, $kind: ${secs} s, peak RssAnon $peak MiB"
			if [ "$kind" = limited ]; then opens_l+=("$secs") peaks_l+=("$peak"); else opens_u+=("$secs") peaks_u+=("$peak"); fi
		done
	done
	summary+=("$(printf '| %s | %s | %s | %s | %s | %s | %s | %s | %s |' "$layout" "$rate" "$hwm" "$all_mib" "$tables" \
		"$(printf '%s\n' "${opens_u[@]}" | median 1)" "$(printf '%s\n' "${opens_l[@]}" | median 1)" \
		"$(printf '%s\n' "${peaks_u[@]}" | median 1)" "$(printf '%s\n' "${peaks_l[@]}" | median 1)")")
	if [ -z "$KEEP" ]; then
		rm -rf "$dir"
	fi
done

echo "== medians ($N results; opens with the page cache dropped, $ROUNDS of each)"
echo "| layout | fill /s | fill peak RssAnon MiB | disk MiB | tables | open s | open s in $LIMIT MiB | open peak RssAnon MiB | the same in $LIMIT MiB |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
printf '%s\n' "${summary[@]}"
