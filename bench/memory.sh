#!/usr/bin/env bash
# Memory as a container sees it: Caddy with a store of a million results,
# started inside a memory cgroup limited to LIMIT MiB, under saturated load
# on the pingback route, against the same run without the limit. Run as
# root (it makes cgroups and drops the page cache).
#
#   bash bench/memory.sh                                  # 1,000,000 results, 256 MiB, 3+3 rounds of 60 s
#   STORE_CACHE=/var/tmp/pb-mem-1m bash bench/memory.sh   # keep the filled store there; the next run skips the fill
#   N=20000 DURATION=10s WARMUP=2s bash bench/memory.sh   # a smoke run
#
# What it does: builds ./cmd/caddy and bench/fill into a temp dir under
# BENCH_DIR and fills a store with N delivered results through the store's
# own insert path (bench/fill: Store.Insert, then the outcome update), in
# STORE_CACHE if set (a directory it marks .pingback-fill-N; a later run
# with the same N uses it as it is). Then ROUNDS pairs of rounds, limited
# and unlimited alternating in ABBA order (limited first in odd pairs).
# Each round:
#   - copies the filled store afresh (every round starts from the same one),
#     syncs and drops the page cache (echo 3 > /proc/sys/vm/drop_caches);
#   - makes a new memory cgroup (v1: memory.limit_in_bytes LIMIT MiB, or
#     unlimited, under the script's own memory cgroup; v2, when
#     /sys/fs/cgroup/cgroup.controllers exists: memory.max, under the root),
#     and starts Caddy INSIDE it (a shell writes its PID to cgroup.procs and
#     execs Caddy, so Caddy's own memory-limit detection sees the limit).
#     Only Caddy is in it: the app is a site of the same Caddy
#     (`respond "ok" 200` on APP_PORT, what the pingback route forwards to);
#     wrk runs outside. Caddy logs at INFO, so its start-up line "GOMEMLIMIT
#     is updated" shows the Go memory limit it derived (from the cgroup's
#     limit, or the machine's memory when there is none);
#   - samples Caddy's RssAnon and RssFile (/proc/<pid>/status) every 200 ms
#     from its start to its stop;
#   - WARMUP, then DURATION of wrk on the pingback route (CONNS connections,
#     THREADS threads, bench/post.lua: a new task id each request);
#   - reads Caddy's /metrics, the cgroup's memory.max_usage_in_bytes (v2:
#     memory.peak) and memory.stat (rss, cache, mapped_file; v2: anon, file,
#     file_mapped), its OOM kills (v1 memory.oom_control oom_kill, v2
#     memory.events oom_kill) and whether Caddy is still the process it
#     started, and Caddy's major page faults (/proc/<pid>/stat: file pages
#     read back after the kernel reclaimed them); then stops Caddy and
#     removes the cgroup.
# It prints each round, the medians per kind, the limited/unlimited ratio of
# each pair and whether the aims hold: no OOM kill and the same PID, every
# 200 durable (the 200s wrk counted, warm-up and ready probe included, at
# most caddy_pingback_callbacks_total{result="stored"}), the limited
# throughput at least 0.9x the unlimited in every pair.
#
# Environment: N (1000000), LIMIT (256, MiB), ROUNDS (3 pairs), DURATION
# (60s), WARMUP (5s), CONNS (32), THREADS (2), BENCH_DIR (/var/tmp),
# STORE_CACHE (empty: fill into the temp dir), CGROUP_PARENT (where the
# cgroups are made), KEEP (1: keep the temp dir with logs and samples),
# NO_DROP (1: do not drop the page cache; only for a smoke run on a machine
# someone else is measuring on).
set -euo pipefail

N=${N:-1000000}
LIMIT=${LIMIT:-256}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-60s}
WARMUP=${WARMUP:-5s}
CONNS=${CONNS:-32}
THREADS=${THREADS:-2}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
STORE_CACHE=${STORE_CACHE:-}
CGROUP_PARENT=${CGROUP_PARENT:-}
KEEP=${KEEP:-}
NO_DROP=${NO_DROP:-}

ADMIN=localhost:2986
PORT=9086
APP_PORT=9087

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

if [ "$(id -u)" != 0 ]; then
	echo "bench/memory.sh makes memory cgroups and drops the page cache: run it as root" >&2
	exit 1
fi
need_wrk

# The cgroup version (cgv) and where the round's cgroups go (parent).
cgroup_setup
parent=$cgroup_parent

tmp=$(mktemp -d "$BENCH_DIR/pingback-memory.XXXXXX")
caddy_pid=
sampler_pid=
cg=
# stop_round: Caddy and the sampler stopped, the round's cgroup removed.
stop_round() {
	stop_pids "$caddy_pid" "$sampler_pid"
	caddy_pid=
	sampler_pid=
	cgroup_remove "$cg"
	cg=
}
cleanup() {
	stop_round
	keep_or_remove "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine"
banner cores cpu memory kernel
storage_line "$tmp" "$tmp" mount
echo "cgroups:    v$cgv, the rounds' cgroups under $parent"
banner go wrk commit
echo "GOMEMLIMIT: ${GOMEMLIMIT:-(not set in the environment)}"

echo "== building ./cmd/caddy and bench/fill"
build_binaries "$tmp" bench/fill

filled=${STORE_CACHE:-$tmp/filled}
if [ -f "$filled/.pingback-fill-$N" ]; then
	echo "== using the store filled with $N results in $filled ($(du -sh "$filled" | cut -f1))"
else
	if [ -d "$filled" ] && [ -n "$(ls -A "$filled")" ]; then
		echo "$filled is not empty and not a store this script filled with $N results (.pingback-fill-$N)" >&2
		exit 1
	fi
	echo "== filling $filled with $N delivered results through the store's insert path (bench/fill)"
	mkdir -p "$filled"
	"$tmp/fill" -dir "$filled" -n "$N" | grep -v ' stored (' | sed 's/^/fill: /'
	date -u +%FT%TZ >"$filled/.pingback-fill-$N"
	echo "store size: $(du -sh "$filled" | cut -f1)"
fi

caddyfile "$ADMIN" "$PORT" "$APP_PORT" https=9447 log=INFO "pingback=storage_dir $tmp/store" app >"$tmp/Caddyfile"

# caddy_alive: Caddy's process is running (not gone, not a zombie waiting
# for the script to reap it).
caddy_alive() { alive "$caddy_pid"; }
# cgfile NAME: a file of the round's cgroup.
cgfile() { echo "$cg/$1"; }
# oom_kills: the round's cgroup's OOM kill count.
oom_kills() {
	if [ "$cgv" = 1 ]; then
		awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) print 0 }' "$(cgfile memory.oom_control)"
	else
		awk '$1 == "oom_kill" { print $2; f = 1 } END { if (!f) print 0 }' "$(cgfile memory.events)"
	fi
}
# cg_stats: "max_usage_bytes rss cache mapped_file" of the round's cgroup
# (v2: memory.peak, anon, file, file_mapped; max_usage 0 if the kernel has
# no memory.peak).
cg_stats() {
	if [ "$cgv" = 1 ]; then
		awk -v mu="$(cat "$(cgfile memory.max_usage_in_bytes)")" '$1 == "rss" { r = $2 } $1 == "cache" { c = $2 } $1 == "mapped_file" { m = $2 }
			END { print mu, r + 0, c + 0, m + 0 }' "$(cgfile memory.stat)"
	else
		local peak=0
		if [ -f "$(cgfile memory.peak)" ]; then
			peak=$(cat "$(cgfile memory.peak)")
		fi
		awk -v mu="$peak" '$1 == "anon" { r = $2 } $1 == "file" { c = $2 } $1 == "file_mapped" { m = $2 }
			END { print mu, r + 0, c + 0, m + 0 }' "$(cgfile memory.stat)"
	fi
}

# wrk_run DURATION TAG: wrk on the pingback route; prints "requests
# duration_us non2xx errors" (errors: connect, read, write, timeout);
# "0 1 0 1" when Caddy is gone and wrk could not connect.
wrk_run() {
	local out="$tmp/wrk-$2.txt" line
	BENCH_PREFIX="$(date +%s%3N)" wrk -t "$THREADS" -c "$CONNS" -d "$1" --latency -s bench/post.lua \
		"http://127.0.0.1:$PORT/cb" >"$out" 2>&1 || true
	line=$(grep '^RESULT ' "$out") || {
		# No connection at all: Caddy is gone (an OOM kill), which the
		# round reports; anything else is the script's failure.
		if ! caddy_alive; then
			echo "wrk ($2): $(head -1 "$out")" >&2
			echo "0 1 0 1"
			return 0
		fi
		echo "wrk gave no result:" >&2
		cat "$out" >&2
		exit 1
	}
	echo "$line" | awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
		print v["requests"], v["duration_us"], v["non2xx"], v["connect"] + v["read"] + v["write"] + v["timeout"] }'
}

# round R KIND: one round; appends a line to $tmp/rounds.dat:
# R kind req_s ok200 stored oom pid_same startup_ms peak_anon mean_anon
# peak_file mean_file max_usage rss cache mapped_file errors majflt (memory
# in kB, cgroup figures in bytes; stored and majflt -1 when Caddy was not
# there to ask; errors: wrk's non-2xx answers, timeouts and socket errors).
round() {
	local r=$1 kind=$2
	rm -rf "$tmp/store"
	cp -a "$filled" "$tmp/store"
	rm -f "$tmp/store/.pingback-fill-$N"
	sync
	if [ -z "$NO_DROP" ]; then
		echo 3 >/proc/sys/vm/drop_caches
	fi

	cg=$parent/pingback-memory-$$-$r-$kind
	if [ "$kind" = limited ]; then
		cgroup_make "$cg" "$LIMIT"
	else
		cgroup_make "$cg"
	fi

	local t0 ready=
	t0=$(date +%s%N)
	# The shell joins the cgroup, then execs Caddy: Caddy starts inside it.
	launch_caddy "$tmp/caddy" "$tmp/Caddyfile" "$tmp/caddy-$r-$kind.log" "$tmp" \
		bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg"
	(while kill -0 "$caddy_pid" 2>/dev/null; do
		awk '/^RssAnon/ { a = $2 } /^RssFile/ { f = $2 } END { if (a != "") print a, f }' "/proc/$caddy_pid/status" 2>/dev/null
		sleep 0.2
	done) >"$tmp/rss-$r-$kind.dat" &
	sampler_pid=$!
	if wait_until 600 0.05 "$caddy_pid" admin_answers "$ADMIN"; then
		ready=1
	fi
	local startup=$((($(date +%s%N) - t0) / 1000000)) pid0=$caddy_pid ok=0 w
	local reqs=0 dur=1 non2xx=0 errs=0
	if [ -n "$ready" ]; then
		# One pingback to see the route answer (a new id).
		if curl -fsS -o /dev/null -d "id=$(date +%s%3N)$r&code=ready" "http://127.0.0.1:$PORT/cb"; then
			ok=1
		fi
		w=$(wrk_run "$WARMUP" "$r-$kind-warmup")
		ok=$((ok + $(echo "$w" | awk '{ print $1 - $3 }')))
		w=$(wrk_run "$DURATION" "$r-$kind")
		read -r reqs dur non2xx errs <<<"$w"
		ok=$((ok + reqs - non2xx))
	elif caddy_alive; then
		echo "caddy did not come up in round $r ($kind) within 30 s; its log:" >&2
		tail -50 "$tmp/caddy-$r-$kind.log" >&2
		exit 1
	else
		# Gone before it was ready (an OOM kill at start-up): the round
		# is reported with no load.
		echo "round $r ($kind): Caddy exited before it was ready" >&2
		startup=-1
	fi

	local stored=-1 alive=0 oom stats majflt=-1
	if caddy_alive && grep -qx "$pid0" "$(cgfile cgroup.procs)"; then
		alive=1
		# Major page faults since its start: file pages read back from disk
		# (the binary's text, the tables) after the kernel reclaimed them.
		majflt=$(awk '{ print $12 }' "/proc/$caddy_pid/stat")
		stored=$(stored "$ADMIN") || stored=-1
	fi
	oom=$(oom_kills)
	stats=$(cg_stats)
	# What Caddy set from the cgroup (or the machine) at its start.
	sed -n 's/.*"msg":"GOMEMLIMIT is updated","GOMEMLIMIT":\([0-9]*\).*/\1/p' "$tmp/caddy-$r-$kind.log" | head -1 >"$tmp/gomemlimit-$r-$kind.txt"
	stop_round

	awk -v r="$r" -v k="$kind" -v reqs="$reqs" -v dur="$dur" -v ok="$ok" -v st="$stored" -v oom="$oom" \
		-v alive="$alive" -v su="$startup" -v stats="$stats" -v errs="$((non2xx + errs))" -v mf="$majflt" '
		{ if ($1 > pa) pa = $1; if ($2 > pf) pf = $2; sa += $1; sf += $2; n++ }
		END { split(stats, s, " ")
			printf "%d %s %.0f %d %d %d %d %d %d %.0f %d %.0f %d %d %d %d %d %d\n", r, k, reqs / (dur / 1e6), ok, st, oom, alive, su,
				pa, (n ? sa / n : 0), pf, (n ? sf / n : 0), s[1], s[2], s[3], s[4], errs, mf }' \
		"$tmp/rss-$r-$kind.dat" >>"$tmp/rounds.dat"
	tail -1 "$tmp/rounds.dat" | awk '{
		printf "%-3d %-9s %7d %8d %8s %4s %4s %6d %7.0f %7.0f %7.0f %7.0f %7.0f %7.0f %7.0f %7.0f %5d %8s\n",
			$1, $2, $3, $4, ($5 < 0 ? "?" : $5), $6, ($7 ? "yes" : "NO"), $8, $9 / 1024, $10 / 1024, $11 / 1024, $12 / 1024,
			$13 / 1048576, $14 / 1048576, $15 / 1048576, $16 / 1048576, $17, ($18 < 0 ? "?" : $18) }'
}

echo "== $ROUNDS pairs of rounds (limited to $LIMIT MiB / unlimited, ABBA), each: fresh store copy, page cache dropped$([ -n "$NO_DROP" ] && echo ' (NO: NO_DROP set)'), Caddy started in a new cgroup, $WARMUP warm-up, $DURATION of wrk ($CONNS connections, $THREADS threads) on the pingback route"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "memory in MiB; anon/file: Caddy's RssAnon/RssFile sampled every 200 ms (peak, mean); cgroup: max usage and memory.stat at the end (rss, cache, mapped_file); errs: wrk's non-2xx, timeouts and socket errors; majflt: Caddy's major page faults"
printf '%-3s %-9s %7s %8s %8s %4s %4s %6s %7s %7s %7s %7s %7s %7s %7s %7s %5s %8s\n' \
	r kind "req/s" "200s" stored oom pid "up ms" "anon^" "anon~" "file^" "file~" "cg max" "cg rss" "cache" mapped errs majflt
: >"$tmp/rounds.dat"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="limited unlimited"; else order="unlimited limited"; fi
	for kind in $order; do
		round "$r" "$kind"
	done
done
echo "load average after:  $(cut -d' ' -f1-3 /proc/loadavg)"
for kind in limited unlimited; do
	echo "GOMEMLIMIT Caddy set at its start ($kind): $(cat "$tmp"/gomemlimit-*-"$kind".txt | awk '{ printf "%s%.1f MiB", (NR > 1 ? ", " : ""), $1 / 1048576 } END { if (!NR) printf "not logged" }')"
done

# kind_median COLUMN KIND: the median of a column over the rounds of KIND.
kind_median() { awk -v k="$2" -v c="$1" '$2 == k { print $c }' "$tmp/rounds.dat" | median 1; }
echo "== medians of $ROUNDS rounds each"
printf '%-9s %7s %7s %7s %7s %7s %7s %7s %7s %7s %6s %8s\n' kind "req/s" "anon^" "anon~" "file^" "file~" "cg max" "cg rss" "cache" mapped "up ms" majflt
for kind in limited unlimited; do
	awk -v k="$kind" -v a="$(kind_median 3 "$kind")" -v b="$(kind_median 9 "$kind")" -v c="$(kind_median 10 "$kind")" -v d="$(kind_median 11 "$kind")" \
		-v e="$(kind_median 12 "$kind")" -v f="$(kind_median 13 "$kind")" -v g="$(kind_median 14 "$kind")" -v h="$(kind_median 15 "$kind")" \
		-v i="$(kind_median 16 "$kind")" -v j="$(kind_median 8 "$kind")" -v m="$(kind_median 18 "$kind")" 'BEGIN {
		printf "%-9s %7d %7.0f %7.0f %7.0f %7.0f %7.0f %7.0f %7.0f %7.0f %6d %8d\n", k, a, b / 1024, c / 1024, d / 1024, e / 1024,
			f / 1048576, g / 1048576, h / 1048576, i / 1048576, j, m }'
done
echo "limited/unlimited throughput, per pair: $(awk '$2 == "limited" { l[$1] = $3 } $2 == "unlimited" { u[$1] = $3 }
	END { for (r = 1; r in l; r++) printf "%s%.2fx", (r > 1 ? ", " : ""), (u[r] ? l[r] / u[r] : 0) }' "$tmp/rounds.dat")"
awk -v ml="$(kind_median 3 limited)" -v mu="$(kind_median 3 unlimited)" '
	$2 == "limited" { l[$1] = $3 } $2 == "unlimited" { u[$1] = $3 }
	{ oom += $6; if (!$7) died++; if ($5 < 0) unknown++; else if ($4 > $5) lost++ }
	END { worst = 1e9; for (r in l) if (u[r] && l[r] / u[r] < worst) worst = l[r] / u[r]
		printf "ratio of the medians: %.2fx; worst pair %.2fx (aim: >= 0.90 in every pair: %s)\n", (mu ? ml / mu : 0), worst, (worst >= 0.9 ? "met" : "MISSED")
		printf "OOM kills: %d, Caddy gone: %d round(s) (aim: none: %s)\n", oom, died + 0, (oom + died == 0 ? "met" : "MISSED")
		printf "durable: %s (the 200s of a round at most its stored count)%s\n", (lost ? "NO in " lost " round(s)" : (unknown ? "yes in the rounds Caddy lived through" : "yes, every round")),
			(unknown ? "; " unknown " round(s) unknown: Caddy was gone before /metrics could be read" : "") }' "$tmp/rounds.dat"
