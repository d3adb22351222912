#!/usr/bin/env bash
# Throughput and latency of pingback callbacks through the plugin, against a
# bare reverse_proxy to the same app, in one Caddy process in the same run.
#
#   bash bench/run.sh                  # 5 alternating rounds of 10 s per path
#   ROUNDS=3 DURATION=5s bash bench/run.sh
#   PROFILE=1 bash bench/run.sh        # plus a CPU profile of one more plugin round
#   RATE=1000 bash bench/run.sh        # open loop at a fixed rate (bench/loadgen), not wrk
#   PIN=1 bash bench/run.sh            # Caddy on CPU 0, the load generator on CPU 1 (taskset)
#   GUARD=1 bash bench/run.sh          # strace counts Caddy's syncs during one more plugin round
#   MEM=1 bash bench/run.sh            # plus what Caddy's memory is made of (see below)
#
# What it does: builds ./cmd/caddy into a temp dir, starts it as a child
# process (admin localhost:2996, HTTP port 9096, app port 9097, clear of the
# tests' ports) with a Caddyfile that has
#   /bare -> reverse_proxy to the app
#   /cb   -> pingback { provider 2captcha } + reverse_proxy to the app
#   :9097 -> the app: `respond "ok" 200` (a site of the same Caddy)
# and loads both paths with wrk: CONNS connections, THREADS threads, every
# request a form POST with a NEW task id (bench/post.lua), so every plugin
# request is a durable insert (the journal synced) plus an outcome update. Rounds
# alternate bare/plugin (ABBA order) after a warm-up; it prints each round,
# the medians and the plugin/bare ratios. wrk shares the machine's cores
# with Caddy. The store lives in a temp dir under BENCH_DIR (default
# /var/tmp: local disk here, not tmpfs); the script prints its filesystem.
#
# With RATE, every round is bench/loadgen at RATE requests per second
# (open loop, latency from the intended send time, up to LG_CONNS in
# flight), and p99.9 is printed too. Each round also prints the load
# generator's CPU per request (user+system).
#
# Environment: ROUNDS (5), DURATION (10s), WARMUP (3s), CONNS (32),
# THREADS (2), BENCH_DIR (/var/tmp), PROFILE (empty: no profile),
# RATE (empty: wrk), LG_CONNS (64), PIN (empty: no pinning), GUARD (empty),
# STORAGE (a storage_dir to use instead of a fresh one, e.g. one filled by
# bench/fill), KEEP (1: keep the temp dir with the logs and profile),
# MEM (empty), TRACE (empty).
#
# With TRACE, one more plugin round runs under a Go execution trace (admin
# /debug/pprof/trace) and the script prints where goroutines waited to be
# scheduled (go tool trace -pprof=sched): which of Caddy's goroutines stood
# runnable without a P, and for how long in all.
#
# With MEM, Caddy's RSS is sampled every 200 ms from start-up on (the peak
# and when it happened are printed), and after the run: its mappings by kind
# (/proc/<pid>/smaps: anonymous, Badger's tables, memtable logs, journal,
# binary), the Go runtime's memory statistics (admin /debug/vars) and the
# top of a heap profile (in-use bytes, admin /debug/pprof/heap).
set -euo pipefail

ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-10s}
WARMUP=${WARMUP:-3s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
PROFILE=${PROFILE:-}
TRACE=${TRACE:-}
KEEP=${KEEP:-}
RATE=${RATE:-}
LG_CONNS=${LG_CONNS:-64}
PIN=${PIN:-}
GUARD=${GUARD:-}
STORAGE=${STORAGE:-}
MEM=${MEM:-}

ADMIN=localhost:2996
PORT=9096
APP_PORT=9097

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

if [ -z "$RATE" ]; then need_wrk; fi

tmp=$(mktemp -d "$BENCH_DIR/pingback-bench.XXXXXX")
caddy_pid=
cleanup() {
	stop_pids "$caddy_pid"
	keep_or_remove "$tmp"
}
trap cleanup EXIT

echo "== machine"
banner cores cpu
storage_line "$tmp/data" "$tmp" mount
banner go
if [ -z "$RATE" ]; then banner wrk; fi

echo "== building ./cmd/caddy and bench/loadgen"
build_binaries "$tmp" bench/loadgen
data=${STORAGE:-$tmp/data}
# PIN: Caddy on CPU 0, the load generator on CPU 1.
caddy_pin=()
gen_pin=()
if [ -n "$PIN" ]; then
	caddy_pin=(taskset -c 0)
	gen_pin=(taskset -c 1)
	echo "pinned:     Caddy on CPU 0, the load generator on CPU 1"
fi

caddyfile "$ADMIN" "$PORT" "$APP_PORT" https=9446 "pingback=storage_dir $data" bare app >"$tmp/Caddyfile"

launch_caddy "$tmp/caddy" "$tmp/Caddyfile" "$tmp/caddy.log" "$tmp" "${caddy_pin[@]}"
started=$(date +%s%N)
sampler_pid=
if [ -n "$MEM" ]; then
	# "ms_since_exec rss_kB anon_kB file_kB" every 200 ms, and a mark per round.
	(while kill -0 "$caddy_pid" 2>/dev/null; do
		awk -v t="$(( ($(date +%s%N) - started) / 1000000 ))" '/^VmRSS/ { r = $2 } /^RssAnon/ { a = $2 } /^RssFile/ { f = $2 }
			END { if (r) print t, r, a, f }' "/proc/$caddy_pid/status" 2>/dev/null
		sleep 0.2
	done) >"$tmp/rss.dat" &
	sampler_pid=$!
fi
# mark WHAT: notes in the RSS timeline where a phase starts.
mark() { [ -n "$MEM" ] && echo "$(( ($(date +%s%N) - started) / 1000000 )) $1" >>"$tmp/marks.dat"; return 0; }

if ! wait_until 100 0.1 "$caddy_pid" routes_answer "$PORT" 1; then
	echo "caddy did not come up; its log:" >&2
	cat "$tmp/caddy.log" >&2
	exit 1
fi
echo "start-up:   $(( ($(date +%s%N) - started) / 1000000 )) ms from exec to the first pingback accepted (store open included)"
echo "memory:     after start-up $(grep -E '^(VmHWM|VmRSS|RssAnon|RssFile)' "/proc/$caddy_pid/status" | tr -s ' \t' ' ' | paste -sd, -)"

# caddy_cpu: CPU time (user+system, clock ticks) Caddy has used so far.
caddy_cpu() { awk '{ print $14 + $15 }' "/proc/$caddy_pid/stat"; }
hz=$(getconf CLK_TCK)

# load PATH DURATION TAG: one wrk (or loadgen) run; prints
# "reqs_per_s p50_us p99_us caddy_cpu_us_per_request p999_us gen_cpu_us_per_request".
# Every run gets its own id prefix (the start time in ms, 13 digits) so no
# id repeats across runs.
load() {
	local path=$1 dur=$2 tag=$3 out cpu0 cpu1 gencpu
	out="$tmp/wrk-$tag.txt"
	cpu0=$(caddy_cpu)
	local TIMEFORMAT='%U %S'
	if [ -n "$RATE" ]; then
		{ time "${gen_pin[@]}" "$tmp/loadgen" -url "http://127.0.0.1:$PORT$path" -rate "$RATE" -duration "$dur" \
			-conns "$LG_CONNS" -prefix "$(date +%s%3N)" >"$out" 2>&1; } 2>"$out.time"
	else
		{ time BENCH_PREFIX="$(date +%s%3N)" \
			"${gen_pin[@]}" wrk -t "$THREADS" -c "$CONNS" -d "$dur" --latency -s bench/post.lua \
			"http://127.0.0.1:$PORT$path" >"$out" 2>&1; } 2>"$out.time"
	fi
	cpu1=$(caddy_cpu)
	gencpu=$(awk '{ print ($1 + $2) * 1e6 }' "$out.time")
	local line
	line=$(wrk_result "$out") || exit 1
	local errs
	errs=$(echo "$line" | awk '{for (i = 2; i <= NF; i++) { split($i, kv, "="); if (kv[1] != "requests" && kv[1] !~ /_us$/ && kv[1] != "late_ms" && kv[1] != "cpu_us_per_req") s += kv[2] } print s + 0}')
	if [ "$errs" != 0 ]; then
		echo "warning: $tag had errors: $line" >&2
	fi
	if [ -n "$RATE" ] && late=$(echo "$line" | sed -n 's/.*late_ms=\([0-9]*\).*/\1/p') && [ "${late:-0}" -gt 100 ]; then
		echo "warning: $tag: the generator fell ${late} ms behind schedule" >&2
	fi
	echo "$line" | awk -v cpu=$((cpu1 - cpu0)) -v hz="$hz" -v gen="$gencpu" '{
		for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		printf "%.0f %d %d %.0f %d %.1f\n", v["requests"] / (v["duration_us"] / 1e6), v["p50_us"], v["p99_us"],
			cpu * 1e6 / hz / v["requests"], v["p999_us"], gen / v["requests"]
	}'
}

echo "== warm-up ($WARMUP per path)"
load /bare "$WARMUP" warmup-bare >/dev/null
load /cb "$WARMUP" warmup-cb >/dev/null

if [ -n "$RATE" ]; then
	echo "== $ROUNDS rounds of $DURATION per path, open loop at $RATE requests/s, up to $LG_CONNS in flight"
else
	echo "== $ROUNDS rounds of $DURATION per path, $CONNS connections, $THREADS wrk threads"
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-6s %-7s %9s %8s %8s %9s %10s %10s\n' round path "req/s" "p50 ms" "p99 ms" "p99.9 ms" "CPU us/req" "gen us/req"
: >"$tmp/bare.dat"
: >"$tmp/cb.dat"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="bare cb"; else order="cb bare"; fi
	for p in $order; do
		mark "round$r-$p"
		res=$(load "/$p" "$DURATION" "round$r-$p")
		echo "$res" >>"$tmp/$p.dat"
		name=bare
		[ "$p" = cb ] && name=plugin
		echo "$res" | awk -v r="$r" -v n="$name" \
			'{ printf "%-6s %-7s %9d %8.2f %8.2f %9.2f %10d %10.1f\n", r, n, $1, $2 / 1000, $3 / 1000, $5 / 1000, $4, $6 }'
	done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
mark end

# The same round's plugin/bare ratios: throughput, p50, p99, CPU.
paste -d' ' "$tmp/cb.dat" "$tmp/bare.dat" |
	awk '{ printf "%.4f %.4f %.4f %.4f\n", $1 / $7, $2 / $8, $3 / $9, $4 / $10 }' >"$tmp/ratio.dat"

echo "== medians of $ROUNDS rounds"
printf '%-8s %9s %8s %8s %9s %10s %10s\n' path "req/s" "p50 ms" "p99 ms" "p99.9 ms" "CPU us/req" "gen us/req"
for p in bare cb; do
	name=bare
	[ "$p" = cb ] && name=plugin
	awk -v n="$name" -v a="$(median 1 "$tmp/$p.dat")" -v b="$(median 2 "$tmp/$p.dat")" \
		-v c="$(median 3 "$tmp/$p.dat")" -v d="$(median 4 "$tmp/$p.dat")" \
		-v e="$(median 5 "$tmp/$p.dat")" -v f="$(median 6 "$tmp/$p.dat")" \
		'BEGIN { printf "%-8s %9d %8.2f %8.2f %9.2f %10d %10.1f\n", n, a, b / 1000, c / 1000, e / 1000, d, f }'
done
awk -v b="$(median 4 "$tmp/bare.dat")" -v c="$(median 4 "$tmp/cb.dat")" -v b9="$(median 3 "$tmp/bare.dat")" -v c9="$(median 3 "$tmp/cb.dat")" \
	'BEGIN { printf "plugin - bare, medians: Caddy CPU %+d us per request, p99 %+.2f ms\n", c - b, (c9 - b9) / 1000 }'
awk -v br="$(median 1 "$tmp/bare.dat")" -v cr="$(median 1 "$tmp/cb.dat")" \
	-v b9="$(median 3 "$tmp/bare.dat")" -v c9="$(median 3 "$tmp/cb.dat")" \
	-v rt="$(median 1 "$tmp/ratio.dat")" -v r5="$(median 2 "$tmp/ratio.dat")" \
	-v r9="$(median 3 "$tmp/ratio.dat")" -v rc="$(median 4 "$tmp/ratio.dat")" 'BEGIN {
	t = cr / br; l = c9 / b9
	printf "plugin/bare, ratio of the medians:    throughput %.2fx (aim >= 0.70), p99 %.2fx (aim <= 2.00)\n", t, l
	printf "plugin/bare, median of round ratios:  throughput %.2fx, p50 %.2fx, p99 %.2fx, Caddy CPU per request %.2fx\n", rt, r5, r9, rc
	printf "aim: throughput %s, p99 %s\n", (t >= 0.7 ? "met" : "MISSED"), (l <= 2 ? "met" : "MISSED")
}'

# Every plugin request must have been a new id that was stored: no
# duplicates, no invalid ones, no store errors.
echo "caddy memory: $(grep -E '^(VmHWM|VmRSS|RssAnon|RssFile)' "/proc/$caddy_pid/status" | tr -s ' \t' ' ' | paste -sd, -)"

# Guard: every acknowledged (stored) pingback's insert was covered by a
# journal sync before its answer; the store counts its commits, the
# operations they carried and its syncs (an insert and an outcome update
# per pingback).
echo "== plugin counters (admin /metrics)"
curl -fsS "http://$ADMIN/metrics" >"$tmp/metrics.txt"
grep -E '^caddy_pingback_(callbacks|forwards|store_[a-z]+)_total' "$tmp/metrics.txt" || echo "(no pingback metrics)"
awk '/^caddy_pingback_store_commits_total/ { c = $2 } /^caddy_pingback_store_operations_total/ { o = $2 }
	/^caddy_pingback_store_syncs_total/ { s = $2 } /^caddy_pingback_callbacks_total\{/ && /result="stored"/ { p += $NF } END {
	if (c > 0) printf "group commit: %.1f operations per commit, %.1f per journal sync\n", o / c, (s > 0 ? o / s : 0)
	if (p > 0) printf "per stored pingback: %.2f operations, %.3f commits, %.3f journal syncs\n", o / p, c / p, s / p }' "$tmp/metrics.txt"
# The journal's write+fdatasync per group commit, from the histogram
# (bucket bounds, so "at most"): the sync tail against the disk's own.
awk -F'[ "]' '/^caddy_pingback_store_sync_seconds_bucket/ { le[n] = $2; c[n++] = $NF } /^caddy_pingback_store_sync_seconds_count/ { t = $NF }
	END { if (t == 0) exit; split("0.5 0.9 0.99 0.999", q, " ")
		printf "journal write+sync per commit (%d, bucket bounds):", t
		for (k = 1; k <= 4; k++) for (i = 0; i < n; i++) if (c[i] >= q[k] * t) { printf " p%s <= %s ms", q[k] * 100, (le[i] == "+Inf" ? "inf" : le[i] * 1000); break }
		print "" }' "$tmp/metrics.txt"

if [ -n "$MEM" ]; then
	echo "== memory: what Caddy's RSS is made of"
	kill "$sampler_pid" 2>/dev/null || true
	wait "$sampler_pid" 2>/dev/null || true
	awk 'NR == FNR { m[NR] = $1; w[NR] = $2; nm = NR; next }
		{ if ($2 > peak) { peak = $2; pa = $3; pf = $4; pt = $1 } last = $0 }
		END { ph = "start-up"; for (i = 1; i <= nm; i++) if (m[i] <= pt) ph = w[i]
			printf "RSS peak (200 ms samples): %d MiB (anon %d, file %d) at %.1f s, during %s\n", peak / 1024, pa / 1024, pf / 1024, pt / 1000, ph }' \
		"$tmp/marks.dat" "$tmp/rss.dat"
	awk 'NR == FNR { m[NR] = $1; w[NR] = $2; nm = NR; next }
		{ for (i = nm; i >= 1; i--) if ($1 >= m[i]) break; if (i < 1) i = 0; if ($2 > mx[i]) mx[i] = $2 }
		END { printf "RSS peak per phase (MiB):"; printf " start-up+warm-up %d", mx[0] / 1024
			for (i = 1; i < nm; i++) printf ", %s %d", w[i], mx[i] / 1024; print "" }' "$tmp/marks.dat" "$tmp/rss.dat"
	grep -E '^(VmHWM|VmRSS|RssAnon|RssFile|RssShmem)' "/proc/$caddy_pid/status" | tr -s ' \t' ' ' | paste -sd, -
	# Mappings by kind: Rss of each mapping, summed by what backs it.
	awk '/^[0-9a-f]+-[0-9a-f]+ / { name = (NF >= 6 ? $6 : "")
			if (name == "") kind = "anonymous (Go heap, stacks, mmap'"'"'d buffers)"
			else if (name ~ /\.sst$/) kind = "Badger tables (.sst, mmap)"
			else if (name ~ /\.mem$/) kind = "Badger memtable logs (.mem, mmap)"
			else if (name ~ /\.vlog$/) kind = "Badger value log (.vlog, mmap)"
			else if (name ~ /pingback-journal/) kind = "journal"
			else if (name ~ /DISCARD|KEYREGISTRY|MANIFEST/) kind = "Badger small files"
			else if (name ~ /caddy$/) kind = "caddy binary"
			else if (name ~ /^\[/) kind = "anonymous " name
			else kind = "other files"
			next }
		/^Rss:/ { rss[kind] += $2 } /^Size:/ { size[kind] += $2; n[kind]++ }
		END { for (k in rss) printf "  %-48s rss %7.1f MiB  mapped %8.1f MiB  (%d mappings)\n", k, rss[k] / 1024, size[k] / 1024, n[k] }' \
		"/proc/$caddy_pid/smaps" | sort -t'	' -k1,1
	curl -fsS "http://$ADMIN/debug/vars" >"$tmp/vars.json"
	python3 - "$tmp/vars.json" <<'PY' || echo "(no python3: see $tmp/vars.json)"
import json, sys
m = json.load(open(sys.argv[1]))["memstats"]
mib = lambda k: m[k] / 2**20
print("Go runtime (MiB): Sys %.1f, HeapSys %.1f, HeapInuse %.1f, HeapAlloc (live+unswept) %.1f, HeapIdle %.1f, HeapReleased %.1f, StackSys %.1f, NextGC %.1f, NumGC %d" % (
    mib("Sys"), mib("HeapSys"), mib("HeapInuse"), mib("HeapAlloc"), mib("HeapIdle"), mib("HeapReleased"), mib("StackSys"), mib("NextGC"), m["NumGC"]))
PY
	curl -fsS -o "$tmp/heap.pprof" "http://$ADMIN/debug/pprof/heap?gc=1"
	echo "heap profile, in-use bytes after a GC (top 25):"
	go tool pprof -top -sample_index=inuse_space -nodecount=25 "$tmp/caddy" "$tmp/heap.pprof" 2>/dev/null | sed -n '4,40p'
	echo "heap profile: $tmp/heap.pprof; RSS timeline: $tmp/rss.dat (ms rss anon file, kB), phases $tmp/marks.dat"
	KEEP=1
fi

if [ -n "$GUARD" ]; then
	echo "== guard: syscalls of Caddy during one more plugin round (strace -c; strace slows Caddy down)"
	stored0=$(stored "$ADMIN")
	strace -f -c -e trace=fdatasync,fsync,msync,pwrite64 -p "$caddy_pid" -o "$tmp/strace.txt" &
	strace_pid=$!
	sleep 1
	load /cb "$DURATION" guard-cb >/dev/null
	kill -INT "$strace_pid"
	wait "$strace_pid" 2>/dev/null || true
	stored1=$(stored "$ADMIN")
	cat "$tmp/strace.txt"
	echo "pingbacks stored (and answered 200) during the round: $((stored1 - stored0))"
fi

if [ -n "$TRACE" ]; then
	echo "== execution trace of one more plugin round (3s of it)"
	load /cb "$DURATION" trace-cb >"$tmp/trace-round.txt" &
	load_pid=$!
	sleep 1
	curl -fsS -o "$tmp/trace.out" "http://$ADMIN/debug/pprof/trace?seconds=3"
	wait "$load_pid"
	echo "round: $(cat "$tmp/trace-round.txt") (req/s p50_us p99_us CPU_us/req)"
	go tool trace -pprof=sched "$tmp/trace.out" >"$tmp/sched.pprof" 2>/dev/null
	go tool pprof -top -cum -nodecount=30 "$tmp/caddy" "$tmp/sched.pprof" 2>/dev/null | sed -n '4,40p'
	echo "trace: $tmp/trace.out (binary $tmp/caddy)"
	KEEP=1
fi

if [ -n "$PROFILE" ]; then
	secs=$((${DURATION%s} > 4 ? ${DURATION%s} - 2 : 2))
	echo "== CPU profile of one more plugin round (${secs}s of it)"
	load /cb "$DURATION" profile-cb >"$tmp/profile-round.txt" &
	load_pid=$!
	sleep 1
	curl -fsS -o "$tmp/allocs0.pprof" "http://$ADMIN/debug/pprof/allocs"
	curl -fsS -o "$tmp/cpu.pprof" "http://$ADMIN/debug/pprof/profile?seconds=$secs"
	curl -fsS -o "$tmp/allocs1.pprof" "http://$ADMIN/debug/pprof/allocs"
	wait "$load_pid"
	echo "round: $(cat "$tmp/profile-round.txt") (req/s p50_us p99_us CPU_us/req)"
	go tool pprof -top -cum -nodecount=40 "$tmp/caddy" "$tmp/cpu.pprof" 2>/dev/null | head -50
	echo "== allocations during the profile (bytes, -base of two /debug/pprof/allocs)"
	go tool pprof -top -sample_index=alloc_space -nodecount=25 -base "$tmp/allocs0.pprof" "$tmp/caddy" "$tmp/allocs1.pprof" 2>/dev/null | sed -n '5,35p'
	echo "profile: $tmp/cpu.pprof, allocations $tmp/allocs{0,1}.pprof (binary $tmp/caddy)"
	KEEP=1
fi
