#!/usr/bin/env bash
# A busy day on one node: Caddy with the plugin on a Badger store that
# holds a day of results (N, 20 million by default), measured as a user
# meets it: fill, disk, start-up (also inside a memory cgroup), memory, the
# live path at a steady rate against the bare reverse_proxy, the admin
# answers an operator waits for, open files, and CPU while idle. Run as
# root (it drops the page cache and makes memory cgroups).
#
#   bash bench/day.sh                                  # 20,000,000 results, 3 rounds of each
#   N=1000000 bash bench/day.sh                        # a million
#   N=20000 ROUNDS=1 DURATION=10s IDLE_WAIT=10s IDLE_FOR=5s bash bench/day.sh   # a smoke run
#
# What it does:
#   1. builds ./cmd/caddy, bench/fill and bench/loadgen into a temp dir under
#      BENCH_DIR;
#   2. fills a store with N delivered results (plus 100 parked and 100
#      failed) through the store's own insert path (bench/fill: Insert, then
#      the outcome update; receipt times spread over the day before the fill,
#      each expiring 25 h after its receipt (a day and bench/fill's margin
#      of an hour, so that none expires while the fill runs), and a day of
#      history minutes),
#      into STORE_CACHE (default BENCH_DIR/pingback-day-N), which is kept
#      between runs (its marker STORE_CACHE.fill-N and the fill's output
#      STORE_CACHE.fill.log beside it): a later run with the same N uses it
#      as it is, and says
#      how old it is (its oldest results expire as the day goes on: a store
#      filled h hours ago has lost about h/24 of them);
#   3. the store's size on disk, in all, by kind (.sst tables, .vlog value
#      log, .mem memtable logs, the journal, the rest) and per million
#      results;
#   4. copies the store into the temp dir (the runs below add results to the
#      copy, never to STORE_CACHE);
#   5. ROUNDS pairs of start-ups, inside a memory cgroup of LIMIT MiB and
#      without one, in ABBA order: page cache dropped, then the time from
#      exec to the first pingback answered 200 (a POST every 10 ms), the
#      store's open alone (the "open" of Caddy's "pingback store ready" log
#      line), RssAnon and RssFile and the open files at that moment;
#   6. one more start-up without a cgroup, which the rest uses: IDLE_FOR of
#      Caddy's CPU while idle, IDLE_WAIT after its start (no traffic);
#      the admin answers (each asked 6 times: the first, cold, and the
#      median of the other 5): /pingback/status, a page of 100 delivered
#      results (/pingback/records?state=delivered), its next page, a page
#      of the parked ones, one result by its task id
#      (/pingback/records/2captcha/<id>);
#   7. ROUNDS pairs of WARMUP + DURATION of bench/loadgen at RATE on the
#      pingback route and on /bare (the same app behind a bare
#      reverse_proxy), alternating ABBA: p50, p99, p99.9 and Caddy's CPU per
#      request; RssAnon and RssFile sampled every second (peak during load);
#   8. Caddy's open files after the load against its limits
#      (/proc/<pid>/limits), and the aims of the issue "A busy day on one
#      node" met or missed.
#
# Environment: N (20000000), ROUNDS (3), RATE (200), DURATION (2m), WARMUP
# (10s), LIMIT (256, MiB), IDLE_WAIT (5m), IDLE_FOR (60s), WORKERS (64,
# bench/fill's), BENCH_DIR (/var/tmp), STORE_CACHE (BENCH_DIR/pingback-day-N),
# CGROUP_PARENT (where the cgroups are made), KEEP (1: keep the temp dir
# with logs and samples), NO_DROP (1: do not drop the page cache; only for
# a smoke run on a machine someone else is measuring on), FILL_ONLY (1: fill
# STORE_CACHE if needed, then stop).
set -euo pipefail

N=${N:-20000000}
ROUNDS=${ROUNDS:-3}
RATE=${RATE:-200}
DURATION=${DURATION:-2m}
WARMUP=${WARMUP:-10s}
LIMIT=${LIMIT:-256}
IDLE_WAIT=${IDLE_WAIT:-5m}
IDLE_FOR=${IDLE_FOR:-60s}
WORKERS=${WORKERS:-64}
BENCH_DIR=${BENCH_DIR:-/var/tmp}
STORE_CACHE=${STORE_CACHE:-$BENCH_DIR/pingback-day-$N}
KEEP=${KEEP:-}
NO_DROP=${NO_DROP:-}

ADMIN=localhost:2946
PORT=9046
APP_PORT=9047
PREFIX=7 # bench/fill's task ids: 7<counter>

cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
. bench/lib.sh

if [ "$(id -u)" != 0 ]; then
	echo "bench/day.sh drops the page cache and makes memory cgroups: run it as root" >&2
	exit 1
fi
cgroup_setup

# seconds DURATION: a duration of the form 90s, 2m or 1h in seconds.
seconds() {
	case $1 in
	*h) echo $((${1%h} * 3600)) ;;
	*m) echo $((${1%m} * 60)) ;;
	*s) echo "${1%s}" ;;
	*) echo "$1" ;;
	esac
}

tmp=$(mktemp -d "$BENCH_DIR/pingback-day.XXXXXX")
caddy_pid=
sampler_pid=
cg=
stop_caddy() {
	stop_pids "$caddy_pid" "$sampler_pid"
	caddy_pid=
	sampler_pid=
	cgroup_remove "$cg"
	cg=
}
cleanup() {
	stop_caddy
	keep_or_remove "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

echo "== machine"
banner cores cpu memory kernel
storage_line "$STORE_CACHE" "$BENCH_DIR" mount
echo "cgroups:    v$cgv, under $cgroup_parent"
banner go commit
echo "shell's open-files limit: soft $(ulimit -Sn), hard $(ulimit -Hn)"

echo "== building ./cmd/caddy, bench/fill and bench/loadgen"
build_binaries "$tmp" bench/fill bench/loadgen

# The fill's marker and log lie beside the store (the store refuses files
# that are not its own).
marker=$STORE_CACHE.fill-$N
fill_log=$STORE_CACHE.fill.log
if [ -f "$marker" ]; then
	echo "== using the store filled with $N results in $STORE_CACHE"
	reused=1
else
	if [ -d "$STORE_CACHE" ] && [ -n "$(ls -A "$STORE_CACHE")" ]; then
		echo "$STORE_CACHE is not empty and not a store this script filled with $N results (no $marker)" >&2
		exit 1
	fi
	echo "== filling $STORE_CACHE with $N delivered results through the store's insert path (bench/fill, $WORKERS workers)"
	mkdir -p "$STORE_CACHE"
	t0=$(date +%s)
	"$tmp/fill" -dir "$STORE_CACHE" -n "$N" -workers "$WORKERS" -prefix "$PREFIX" | tee "$fill_log" | sed 's/^/fill: /'
	echo "filled_at=$t0 seconds=$(($(date +%s) - t0)) n=$N workers=$WORKERS commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" >"$marker"
fi
# shellcheck disable=SC1090
. <(tr ' ' '\n' <"$marker" | sed 's/^/fill_/')
if [ -n "${reused:-}" ]; then
	{ grep -E '^(stored|open:)' "$fill_log"; grep -E '^(list parked|paged scan)' "$fill_log" | tail -2; } | sed 's/^/fill: /' || true
fi
echo "fill: $N results, the whole fill (opens and scans included) ${fill_seconds} s ($(awk -v n="$N" -v s="$fill_seconds" 'BEGIN { printf "%.0f/s", n / (s > 0 ? s : 1) }')), at commit ${fill_commit}, $(awk -v a="$fill_filled_at" -v b="$(date +%s)" 'BEGIN { printf "%.1f h ago (about %.1f%% of its results expired since)", (b - a) / 3600, ((b - a) > 3600 ? ((b - a) - 3600) / 864 : 0) }')"

if [ -n "${FILL_ONLY:-}" ]; then
	echo "store: $(du -sh "$STORE_CACHE" | cut -f1) (FILL_ONLY set: nothing else measured)"
	exit 0
fi

# disk_line DIR: the store's size on disk in MiB, in all and by kind.
disk_line() {
	find "$1" -type f -printf '%b %f\n' | awk -v n="$N" '
		{ kb = $1 / 2; all += kb
		  if ($2 ~ /\.sst$/) sst += kb; else if ($2 ~ /\.vlog$/) vlog += kb; else if ($2 ~ /\.mem$/) mem += kb
		  else if ($2 ~ /journal/) jn += kb; else rest += kb; if ($2 ~ /\.sst$/) tables++ }
		END { printf "%.0f MiB (%.2f GiB): tables %.0f MiB in %d files, value log %.0f, memtables %.0f, journal %.0f, rest %.0f; %.0f MiB per million results; %.0f bytes a result\n",
			all / 1024, all / 1048576, sst / 1024, tables, vlog / 1024, mem / 1024, jn / 1024, rest / 1024, all / 1024 / (n / 1e6), all * 1024 / n }'
}
echo "== disk"
echo "store: $(disk_line "$STORE_CACHE")"
# The journal's files and the memtable logs keep their size whatever the
# store holds; the rest grows with the results.
read -r disk_kb fixed_kb <<<"$(find "$STORE_CACHE" -type f -printf '%b %f\n' |
	awk '{ all += $1 / 2; if ($2 ~ /\.mem$/ || $2 ~ /journal/) fixed += $1 / 2 } END { printf "%d %d", all, fixed }')"

echo "== copying the store (the runs add results to the copy only)"
t0=$(date +%s%N)
cp -a "$STORE_CACHE" "$tmp/store"
echo "copied in $((($(date +%s%N) - t0) / 1000000)) ms"

caddyfile "$ADMIN" "$PORT" "$APP_PORT" https=9449 log=INFO "pingback=storage_dir $tmp/store" bare app >"$tmp/Caddyfile"

hz=$(getconf CLK_TCK)
caddy_cpu() { awk '{ print $14 + $15 }' "/proc/$caddy_pid/stat"; }
open_files() { find "/proc/$caddy_pid/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l; }
rss() { awk '/^RssAnon/ { a = $2 } /^RssFile/ { f = $2 } END { printf "%d %d", a / 1024, f / 1024 }' "/proc/$caddy_pid/status"; }
drop_caches() {
	sync
	if [ -z "$NO_DROP" ]; then
		echo 3 >/proc/sys/vm/drop_caches
	fi
}
seq_id=0
# first_200 TAG: POSTs a pingback of a new id every 10 ms until one is
# answered 200 (at most 120 s); status 1 if none was, or Caddy is gone.
first_200() {
	local i
	for i in $(seq 12000); do
		seq_id=$((seq_id + 1))
		if curl -fsS -o /dev/null --max-time 5 -d "id=9$(date +%s)$seq_id&code=up" "http://127.0.0.1:$PORT/cb" 2>/dev/null; then
			return 0
		fi
		alive "$caddy_pid" || return 1
		sleep 0.01
	done
	return 1
}
# start KIND LOG: Caddy started (KIND limited: inside a new cgroup of LIMIT
# MiB; unlimited: in a cgroup without a limit) after the page cache was
# dropped; sets started_line to "startup_ms open_ms anon_mib file_mib fds"
# once its first pingback was answered 200. (Not for a command
# substitution: it sets caddy_pid and cg for stop_caddy.)
start() {
	local kind=$1 log=$2 t0 up open
	drop_caches
	cg=$cgroup_parent/pingback-day-$$-$seq_id-$kind
	if [ "$kind" = limited ]; then cgroup_make "$cg" "$LIMIT"; else cgroup_make "$cg"; fi
	t0=$(date +%s%N)
	launch_caddy "$tmp/caddy" "$tmp/Caddyfile" "$log" "$tmp" bash -c 'echo $$ >"$0/cgroup.procs" && exec "$@"' "$cg"
	if ! first_200; then
		echo "Caddy answered no pingback 200 within 120 s ($kind); its log:" >&2
		tail -30 "$log" >&2
		exit 1
	fi
	up=$((($(date +%s%N) - t0) / 1000000))
	open=$(sed -n 's/.*"msg":"pingback store ready".*"open":\([0-9.e+-]*\).*/\1/p' "$log" | tail -1)
	started_line="$up $(awk -v o="${open:-0}" 'BEGIN { printf "%.0f", o * 1000 }') $(rss) $(open_files)"
}

echo "== $ROUNDS pairs of start-ups (limited to $LIMIT MiB / unlimited, ABBA), page cache dropped$([ -n "$NO_DROP" ] && echo ' (NO: NO_DROP set)'); the time from exec to the first pingback answered 200"
printf '%-3s %-9s %8s %8s %8s %8s %6s\n' r kind "up ms" "open ms" "anon MiB" "file MiB" fds
: >"$tmp/startups.dat"
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="limited unlimited"; else order="unlimited limited"; fi
	for kind in $order; do
		start "$kind" "$tmp/caddy-startup-$r-$kind.log"
		echo "$r $kind $started_line" >>"$tmp/startups.dat"
		echo "$r $kind $started_line" | awk '{ printf "%-3d %-9s %8d %8d %8d %8d %6d\n", $1, $2, $3, $4, $5, $6, $7 }'
		stop_caddy
	done
done

echo "== one more start-up (unlimited), for the rest"
start unlimited "$tmp/caddy.log"
read -r up_ms open_ms anon_mib file_mib fds0 <<<"$started_line"
started=$(date +%s)
echo "first pingback answered 200 after $up_ms ms (store open $open_ms ms); RssAnon $anon_mib MiB, RssFile $file_mib MiB; $fds0 open files"
(while alive "$caddy_pid"; do
	echo "$(date +%s) $(rss)"
	sleep 1
done) >"$tmp/rss.dat" 2>/dev/null &
sampler_pid=$!

wait_s=$(($(seconds "$IDLE_WAIT") - ($(date +%s) - started)))
idle_s=$(seconds "$IDLE_FOR")
echo "== CPU while idle: $IDLE_FOR of no traffic, from $IDLE_WAIT after the start"
if [ "$wait_s" -gt 0 ]; then sleep "$wait_s"; fi
c0=$(caddy_cpu)
t0=$(date +%s%N)
sleep "$idle_s"
idle_pct=$(awk -v c="$(($(caddy_cpu) - c0))" -v hz="$hz" -v ns="$(($(date +%s%N) - t0))" 'BEGIN { printf "%.2f", 100 * c / hz / (ns / 1e9) }')
echo "idle CPU: $idle_pct% of a core"

echo "== admin answers (the first, cold, then the median of 5 more)"
# timed PATH: "first_ms median_ms" of GET PATH on the admin endpoint; the
# last answer's body in $tmp/answer.json.
timed() {
	local i t first=
	: >"$tmp/times.dat"
	for i in 1 2 3 4 5 6; do
		t=$(curl -fsS -o "$tmp/answer.json" -w '%{time_total}' "http://$ADMIN$1")
		if [ -z "$first" ]; then first=$t; else echo "$t" >>"$tmp/times.dat"; fi
	done
	echo "$(awk -v t="$first" 'BEGIN { printf "%.1f", t * 1000 }') $(median 1 "$tmp/times.dat" | awk '{ printf "%.1f", $1 * 1000 }')"
}
: >"$tmp/admin.dat"
admin() {
	local name=$1 path=$2 t
	t=$(timed "$path")
	echo "${name// /_} $t" >>"$tmp/admin.dat"
	printf '%-32s first %8s ms, then median %8s ms  (%s)\n' "$name" ${t% *} ${t#* } "$path"
}
admin status /pingback/status
admin "page of delivered" "/pingback/records?state=delivered&limit=100"
cursor=$(jq -r '.next_cursor // empty' "$tmp/answer.json")
if [ -n "$cursor" ]; then
	admin "its next page" "/pingback/records?state=delivered&limit=100&cursor=$(jq -rn --arg c "$cursor" '$c|@uri')"
else
	echo "no next page of delivered results (fewer than 100?)" >&2
fi
admin "page of parked" "/pingback/records?state=parked&limit=100"
admin "result by task id" "/pingback/records/2captcha/$PREFIX$((N / 2))"

echo "== $ROUNDS pairs of $WARMUP + $DURATION of bench/loadgen at $RATE/s, pingback route (/cb) and bare reverse_proxy (/bare), ABBA"
printf '%-3s %-8s %8s %8s %8s %8s %10s %7s\n' r route requests "p50 ms" "p99 ms" "p99.9 ms" "cpu us/req" non2xx
: >"$tmp/load.dat"
load_started=$(date +%s)
for r in $(seq "$ROUNDS"); do
	if [ $((r % 2)) = 1 ]; then order="cb bare"; else order="bare cb"; fi
	for route in $order; do
		"$tmp/loadgen" -url "http://127.0.0.1:$PORT/$route" -rate "$RATE" -duration "$WARMUP" -prefix "8$r$(date +%s)" >/dev/null
		c0=$(caddy_cpu)
		"$tmp/loadgen" -url "http://127.0.0.1:$PORT/$route" -rate "$RATE" -duration "$DURATION" -prefix "6$r$(date +%s)" >"$tmp/load-$r-$route.txt"
		c1=$(caddy_cpu)
		res=$(wrk_result "$tmp/load-$r-$route.txt")
		echo "$res" | awk -v r="$r" -v route="$route" -v c="$((c1 - c0))" -v hz="$hz" '
			{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
			  printf "%d %s %d %.3f %.3f %.3f %.1f %d\n", r, route, v["requests"], v["p50_us"] / 1000, v["p99_us"] / 1000, v["p999_us"] / 1000,
				c / hz * 1e6 / (v["requests"] ? v["requests"] : 1), v["non2xx"] + v["errors"] }' >>"$tmp/load.dat"
		tail -1 "$tmp/load.dat" | awk '{ printf "%-3d %-8s %8d %8.2f %8.2f %8.2f %10.1f %7d\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
	done
done
fds1=$(open_files)
soft=$(awk '/^Max open files/ { print $4 }' "/proc/$caddy_pid/limits")
hard=$(awk '/^Max open files/ { print $5 }' "/proc/$caddy_pid/limits")
tables=$(find "$tmp/store" -name '*.sst' | wc -l)
peak=$(awk -v s="$load_started" '$1 >= s { if ($2 > a) a = $2; if ($3 > f) f = $3 } END { printf "%d %d", a, f }' "$tmp/rss.dat")
stored_now=$(stored "$ADMIN")
stop_caddy

echo "== summary (N=$N; medians)"
km() { awk -v k="$2" -v c="$1" '$2 == k { print $c }' "$tmp/startups.dat" | median 1; }
echo "start-up to the first pingback answered 200: unlimited $(km 3 unlimited) ms (open $(km 4 unlimited) ms), inside $LIMIT MiB $(km 3 limited) ms (open $(km 4 limited) ms)"
echo "memory after start-up: RssAnon $(km 5 unlimited) MiB, RssFile $(km 6 unlimited) MiB (inside $LIMIT MiB: $(km 5 limited), $(km 6 limited)); during load, peak RssAnon ${peak% *} MiB, RssFile ${peak#* } MiB"
lm() { awk -v k="$2" -v c="$1" '$2 == k { print $c }' "$tmp/load.dat" | median 1; }
for route in cb bare; do
	echo "load $route: p50 $(lm 4 "$route") ms, p99 $(lm 5 "$route") ms, p99.9 $(lm 6 "$route") ms, Caddy CPU $(lm 7 "$route") us a request"
done
echo "open files: $fds0 after start-up, $fds1 after the load ($tables tables in the store); Caddy's limit: soft $soft, hard $hard"
echo "pingbacks this run stored: $stored_now (since the last start-up)"
echo "== aims"
awk -v a="$(km 3 unlimited)" -v b="$(km 3 limited)" 'BEGIN { printf "start-up <= 2000 ms, unlimited and inside the cgroup: %s (%d, %d ms)\n", (a <= 2000 && b <= 2000 ? "met" : "MISSED"), a, b }'
awk -v p="$(lm 5 cb)" -v q="$(lm 5 bare)" 'BEGIN { printf "p99 at the rate within 2 ms of the bare path: %s (%.2f against %.2f ms: +%.2f ms)\n", (p - q <= 2 ? "met" : "MISSED"), p, q, p - q }'
awk '{ if ($3 > 200) bad = bad " " $1 } { m = ($3 > m ? $3 : m) } END { printf "each admin answer in 200 ms or less (median of 5 after the first): %s (slowest %.1f ms)%s\n", (bad ? "MISSED" : "met"), m, (bad ? ":" bad : "") }' "$tmp/admin.dat"
awk -v c="$idle_pct" 'BEGIN { printf "idle CPU at most 5%% of a core: %s (%.2f%%)\n", (c <= 5 ? "met" : "MISSED"), c }'
awk -v kb="$disk_kb" -v fixed="$fixed_kb" -v n="$N" 'BEGIN { gib = kb / 1048576; at20 = (fixed + (kb - fixed) * 2e7 / n) / 1048576
	printf "disk within 5 GiB at 20M: %s (%.2f GiB at %d results%s)\n", (at20 <= 5 ? "met" : "MISSED"), gib, n,
		(n == 2e7 ? "" : sprintf("; %.2f GiB at 20M at this size a result, the journal and memtable logs counted once", at20)) }'
awk -v f="$fds1" -v t="$tables" 'BEGIN { printf "open files: %d, against a shell soft limit of 1024 (%s) and the systemd unit'"'"'s 1048576 (%s)\n", f, (f < 1024 ? "under" : "OVER"), (f < 1048576 ? "under" : "OVER") }'
